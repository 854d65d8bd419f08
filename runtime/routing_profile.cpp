#include "runtime/routing_profile.h"

#include <algorithm>
#include <string_view>

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

double top20_share(const RoutingCounts& c) {
  if (c.counts.empty()) return 0;
  double sum = 0;
  for (const auto& row : c.counts) {
    std::vector<uint64_t> v = row;
    std::sort(v.rbegin(), v.rend());
    uint64_t all = 0, top = 0;
    for (size_t e = 0; e < v.size(); ++e) (e < v.size() / 5 ? top : all) += v[e];
    all += top;
    sum += all ? static_cast<double>(top) / static_cast<double>(all) : 0;
  }
  return sum / static_cast<double>(c.counts.size());
}

}  // namespace tandem
