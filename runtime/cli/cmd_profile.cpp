// tandem profile: routed-expert activation counts over real prompts -> heat.yaml (experts.heat).
//
// Each line of --prompts is one prompt (blank lines skipped; --chat wraps it in the chat template).
// The prompt is prefilled on a host placement (cpu by default, ref for the exact reference) and,
// with --gen N, N greedy tokens are decoded after it; every token's top-k choice in every layer counts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "placement/heat.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "core/error.h"
#include "core/file_io.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/engine/routing_profile.h"
#include "runtime/engine/runner.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::cli {

int cmd_profile(int argc, char** argv) {
  Args a("profile", {
                        {"model", true, "model folder"},
                        {"prompts", true, "text file, one prompt per line"},
                        {"out", true, "heat map to write (YAML), e.g. heat.yaml"},
                        {"device", true, "cpu (fast kernels, default) or ref (exact reference)"},
                        {"threads", true, "CPU threads (default: all physical cores)"},
                        {"gen", true, "greedy tokens decoded after each prompt (default 0)"},
                        {"max-tokens", true, "truncate each prompt to this many tokens (default 2048)"},
                        {"chat", false, "wrap each prompt in the chat template as a user message"},
                        {"help", false, "show this help"},
                    });
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  const std::string dir = a.get("model"), out = a.get("out"), device = a.get("device", "cpu");
  if (device != "cpu" && device != "ref") throw UsageError("tandem profile: --device must be cpu or ref (got '" + device + "')");
  const int64_t gen = a.get_int("gen", 0), max_tokens = a.get_int("max-tokens", 2048);
  if (gen < 0 || max_tokens < 1) throw UsageError("tandem profile: --gen must be >= 0 and --max-tokens >= 1");
  std::vector<std::string> prompts;
  {
    std::istringstream f(read_text_file(a.get("prompts"), kMaxPromptFileBytes, "the prompts file"));
    for (std::string line; std::getline(f, line);)
      if (line.find_first_not_of(" \t\r") != std::string::npos) prompts.push_back(line);
    if (prompts.empty()) fail(a.get("prompts"), ": no prompts (one per line)");
  }
  auto model = Qwen35Moe::load(dir);
  const Tokenizer tok = Tokenizer::from_model_dir(dir);
  ProfileOptions po;
  po.device = device, po.threads = a.get_int<int>("threads", 0, 0, kMaxThreads), po.gen = gen, po.max_tokens = max_tokens;
  po.chat = a.has("chat");
  const auto t0 = std::chrono::steady_clock::now();
  const RoutingCounts counts = profile_prompts(*model, tok, prompts, po, [&](size_t done, int64_t tokens) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\rprofile: %zu/%zu prompts, %lld tokens, %.1f tok/s   ", done, prompts.size(), static_cast<long long>(tokens),
                 tokens / std::max(s, 1e-9));
  });
  std::fprintf(stderr, "\n");
  placement::save_heat_map(placement::heat_from_counts(counts, model->config(), dir), out);
  std::printf("wrote %s: %lld tokens x %d layers; hottest 20%% of experts take %.1f%% of activations (uniform: 20%%)\n", out.c_str(),
              static_cast<long long>(counts.tokens), model->config().num_layers, 100 * top20_share(counts));
  // The early guess (RoutingCounts::early_hits): over all layers, and its range by layer.
  const int k = static_cast<int>(model->config().num_experts_per_tok);
  const std::vector<double> by_layer = early_hit_shares(counts, &RoutingCounts::early_hits);
  const auto [lo, hi] = by_layer.empty() ? std::pair(0.0, 0.0) : std::pair(*std::min_element(by_layer.begin(), by_layer.end()),
                                                                          *std::max_element(by_layer.begin(), by_layer.end()));
  if (counts.tokens > 0)
    std::printf("a layer's router applied to its input (before the mixer) foresees %.1f%% of its top-%d (%.1f-%.1f%% by layer; "
                "%.1f%% within its top-%d; %.1f%% from the input less the shared expert's output)\n",
                100 * early_hit_share(counts, &RoutingCounts::early_hits), k, 100 * lo, 100 * hi,
                100 * early_hit_share(counts, &RoutingCounts::early_hits_2k), 2 * k, 100 * early_hit_share(counts, &RoutingCounts::early_hits_host));
  return 0;
}

}  // namespace tandem::cli
