#include "runtime/engine/routing_profile.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <string_view>

#include "runtime/tokenizer/chat_template.h"
#include "runtime/models/qwen3_5_moe/cpu_backend.h"
#include "core/error.h"
#include "runtime/models/qwen3_5_moe/ops_ref.h"

namespace tandem {

RoutingCounts profile_routing(const Qwen35Moe& model, MatmulBackend* backend, const std::vector<std::vector<int32_t>>& prompts,
                              int64_t gen, const std::function<void(size_t, int64_t)>& progress) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size;
  const int E = static_cast<int>(c.num_experts), K = static_cast<int>(c.num_experts_per_tok);
  RoutingCounts out;
  out.counts.assign(c.num_layers, std::vector<uint64_t>(c.num_experts, 0));
  out.early_hits.assign(c.num_layers, 0);
  out.early_hits_2k.assign(c.num_layers, 0);
  out.early_hits_host.assign(c.num_layers, 0);
  // The early guess: each layer's router rows in fp32 (dequantized once, when the layer first routes),
  // applied to the layer's input (the "embed" / previous "layer_out" tap) after its post-attention norm.
  std::vector<std::vector<float>> router(c.num_layers);
  std::vector<float> input, routed, shared, host_input, normed(H), guess_logits(E), weights(2 * K);
  std::vector<int> guess(2 * K);
  // The top-2k guess of `layer` from rows x H residuals `in` (the post-attention norm, the router).
  auto guess_from = [&](int layer, const float* in) {
    const LayerWeights& L = model.layers()[layer];
    std::vector<float>& R = router[layer];
    if (R.empty()) {
      R.resize(static_cast<size_t>(E * H));
      for (int e = 0; e < E; ++e) L.moe.router.dequant_row(e, R.data() + e * H);
    }
    ref::rmsnorm_zc(in, L.post_attention_norm.data(), H, static_cast<float>(c.rms_norm_eps), normed.data());
    for (int e = 0; e < E; ++e) {
      const float* w = R.data() + e * H;
      double acc = 0;
      for (int64_t i = 0; i < H; ++i) acc += static_cast<double>(w[i]) * normed[i];
      guess_logits[e] = static_cast<float>(acc);
    }
    ref::route_topk(guess_logits.data(), E, std::min(2 * K, E), guess.data(), weights.data());  // descending
  };
  // Counts the guess's catches of layer's chosen experts `want` [K]: in its top-k (into `top_k`) and in
  // its top-2k (into `top_2k`, when given).
  auto score = [&](const float* want, int layer, std::vector<uint64_t>& top_k, std::vector<uint64_t>* top_2k) {
    const int wide = std::min(2 * K, E);
    for (int j = 0; j < K; ++j) {
      const int g = static_cast<int>(std::find(guess.begin(), guess.begin() + wide, static_cast<int>(want[j])) - guess.begin());
      if (g < K) ++top_k[layer];
      if (top_2k && g < wide) ++(*top_2k)[layer];
    }
  };
  const TensorTap tap = [&](const char* name, int layer, const float* d, int64_t rows, int64_t cols) {
    const std::string_view n(name);
    if (n == "embed" || n == "layer_out") {  // the next layer's input, and what a hybrid host knows of it
      input.assign(d, d + rows * cols);
      host_input = input;
      if (n == "layer_out" && shared.size() == host_input.size())
        for (size_t i = 0; i < host_input.size(); ++i) host_input[i] -= shared[i];
      return;
    }
    if (n == "moe_routed") {
      routed.assign(d, d + rows * cols);
      return;
    }
    if (n == "moe_out") {  // the shared expert's part: the MoE output less the routed sum
      shared.clear();
      if (static_cast<int64_t>(routed.size()) == rows * cols)
        for (size_t i = 0; i < routed.size(); ++i) shared.push_back(d[i] - routed[i]);
      return;
    }
    if (n != "moe_topk_ids") return;
    for (int64_t i = 0; i < rows * cols; ++i) ++out.counts[layer][static_cast<size_t>(d[i])];
    if (layer == 0) out.tokens += rows;
    if (model.layers()[layer].moe.router.out != E || static_cast<int64_t>(input.size()) != rows * H || cols != K) return;
    for (int64_t t = 0; t < rows; ++t) {
      guess_from(layer, input.data() + t * H);
      score(d + t * K, layer, out.early_hits, &out.early_hits_2k);
      guess_from(layer, host_input.data() + t * H);
      score(d + t * K, layer, out.early_hits_host, nullptr);
    }
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
    const ChatMessage msg{"user", p};
    std::vector<int32_t> t = tokenizer.encode(o.chat ? render_chat(std::span<const ChatMessage>(&msg, 1), ChatOptions{}) : p);
    if (static_cast<int64_t>(t.size()) > o.max_tokens) t.resize(o.max_tokens);
    ids.push_back(std::move(t));
  }
  return profile_routing(model, backend.get(), ids, o.gen, progress);
}

std::vector<double> early_hit_shares(const RoutingCounts& c, const std::vector<uint64_t> RoutingCounts::*which) {
  const std::vector<uint64_t>& h = c.*which;
  std::vector<double> r(h.size(), 0.0);
  for (size_t l = 0; l < h.size(); ++l) {
    const uint64_t all = std::accumulate(c.counts[l].begin(), c.counts[l].end(), uint64_t(0));
    if (all) r[l] = static_cast<double>(h[l]) / static_cast<double>(all);
  }
  return r;
}

double early_hit_share(const RoutingCounts& c, const std::vector<uint64_t> RoutingCounts::*which) {
  const std::vector<uint64_t>& h = c.*which;
  uint64_t all = 0;
  for (const auto& row : c.counts) all = std::accumulate(row.begin(), row.end(), all);
  return all ? static_cast<double>(std::accumulate(h.begin(), h.end(), uint64_t(0))) / static_cast<double>(all) : 0.0;
}

double top20_share(const RoutingCounts& c) {
  if (c.counts.empty()) return 0;
  double sum = 0;
  for (const auto& row : c.counts) sum += placement::shares_from_counts(std::vector<double>(row.begin(), row.end())).top20;
  return sum / static_cast<double>(c.counts.size());
}

}  // namespace tandem
