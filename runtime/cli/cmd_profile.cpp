// tandem profile: routed-expert activation counts over real prompts -> heat.yaml (experts.heat).
//
// Each line of --prompts is one prompt (blank lines skipped; --chat wraps it in the chat template).
// The prompt is prefilled on a host placement (cpu by default, ref for the exact reference) and,
// with --gen N, N greedy tokens are decoded after it; every token's top-k choice in every layer counts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "placement/heat.h"
#include "runtime/chat_template.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/device_flags.h"
#include "runtime/cpu_backend.h"
#include "runtime/error.h"
#include "runtime/models/qwen3_5_moe.h"
#include "runtime/routing_profile.h"
#include "runtime/tokenizer.h"

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
    std::ifstream f(a.get("prompts"));
    if (!f) fail(a.get("prompts"), ": cannot open the prompts file");
    for (std::string line; std::getline(f, line);)
      if (line.find_first_not_of(" \t\r") != std::string::npos) prompts.push_back(line);
    if (prompts.empty()) fail(a.get("prompts"), ": no prompts (one per line)");
  }
  auto model = Qwen35Moe::load(dir);
  const Tokenizer tok = Tokenizer::from_model_dir(dir);
  const ModelConfig& c = model->config();
  std::unique_ptr<CpuBackend> backend;
  if (device == "cpu") {
    CpuBackendOptions o;
    o.threads = static_cast<int>(a.get_int("threads", 0));
    backend = std::make_unique<CpuBackend>(*model, o);
  }
  std::vector<std::vector<int32_t>> tokenized;
  for (const std::string& p : prompts) {
    const ChatMessage msg{"user", p, "", {}};
    std::vector<int32_t> ids = tok.encode(a.has("chat") ? render_chat(std::span<const ChatMessage>(&msg, 1), ChatOptions{}) : p);
    if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(max_tokens);
    tokenized.push_back(std::move(ids));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const RoutingCounts counts = profile_routing(*model, backend.get(), tokenized, gen, [&](size_t done, int64_t tokens) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\rprofile: %zu/%zu prompts, %lld tokens, %.1f tok/s   ", done, tokenized.size(), static_cast<long long>(tokens),
                 tokens / std::max(s, 1e-9));
  });
  std::fprintf(stderr, "\n");
  placement::HeatMap heat;
  heat.model = dir;
  heat.top_k = c.num_experts_per_tok;
  heat.num_experts = c.num_experts;
  heat.tokens = counts.tokens;
  heat.counts = counts.counts;
  placement::save_heat_map(heat, out);
  std::printf("wrote %s: %lld tokens x %d layers; hottest 20%% of experts take %.1f%% of activations (uniform: 20%%)\n", out.c_str(),
              static_cast<long long>(heat.tokens), c.num_layers, 100 * top20_share(counts));
  return 0;
}

}  // namespace tandem::cli
