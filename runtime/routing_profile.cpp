#include "runtime/routing_profile.h"

#include <algorithm>
#include <memory>
#include <string_view>

#include "runtime/chat_template.h"
#include "runtime/cpu_backend.h"
#include "runtime/error.h"
#include "runtime/synth.h"

namespace tandem {

RoutingCounts profile_routing(const Qwen35Moe& model, MatmulBackend* backend, const std::vector<std::vector<int32_t>>& prompts,
                              int64_t gen, const std::function<void(size_t, int64_t)>& progress) {
  const ModelConfig& c = model.config();
  RoutingCounts out;
  out.counts.assign(c.num_layers, std::vector<uint64_t>(c.num_experts, 0));
  const TensorTap tap = [&](const char* name, int layer, const float* d, int64_t rows, int64_t cols) {
    if (std::string_view(name) != "moe_topk_ids") return;
    for (int64_t i = 0; i < rows * cols; ++i) ++out.counts[layer][static_cast<size_t>(d[i])];
    if (layer == 0) out.tokens += rows;
  };
  std::vector<float> logits(c.vocab_size);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) continue;
    Qwen35State st = model.new_state();
    st.backend = backend;
    model.forward(st, prompts[i], logits.data(), tap, Qwen35Moe::LogitRows::Last);
    for (int64_t g = 0; g < gen; ++g) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      model.forward(st, std::span<const int32_t>(&next, 1), logits.data(), tap, Qwen35Moe::LogitRows::Last);
    }
    if (progress) progress(i + 1, out.tokens);
  }
  return out;
}

RoutingCounts profile_prompts(const Qwen35Moe& model, const Tokenizer& tokenizer, const std::vector<std::string>& prompts,
                              const ProfileOptions& o, const std::function<void(size_t, int64_t)>& progress) {
  if (o.device != "cpu" && o.device != "ref") fail("profile: device must be cpu or ref (got '", o.device, "')");
  if (o.gen < 0 || o.max_tokens < 1) fail("profile: gen must be >= 0 and max_tokens >= 1");
  if (prompts.empty()) fail("profile: give at least one prompt");
  std::unique_ptr<CpuBackend> backend;
  if (o.device == "cpu") {
    CpuBackendOptions bo;
    bo.threads = o.threads;
    backend = std::make_unique<CpuBackend>(model, bo);
  }
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& p : prompts) {
    const ChatMessage msg{"user", p, "", {}};
    std::vector<int32_t> t = tokenizer.encode(o.chat ? render_chat(std::span<const ChatMessage>(&msg, 1), ChatOptions{}) : p);
    if (static_cast<int64_t>(t.size()) > o.max_tokens) t.resize(o.max_tokens);
    ids.push_back(std::move(t));
  }
  return profile_routing(model, backend.get(), ids, o.gen, progress);
}

double top20_share(const RoutingCounts& c) {
  if (c.counts.empty()) return 0;
  double sum = 0;
  for (const auto& row : c.counts) sum += synth::shares_from_counts(std::vector<double>(row.begin(), row.end())).top20;
  return sum / static_cast<double>(c.counts.size());
}

}  // namespace tandem
