// tandem logits: the stable regression interface. The first --prefill ids go in one forward call,
// the rest one at a time through the cache (the decode path); logits [ids, vocab] float32 -> .npy.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/device_flags.h"
#include "core/error.h"
#include "runtime/engine/logits_compare.h"
#include "runtime/format/npy.h"
#include "runtime/engine/runner.h"

namespace tandem::cli {


int cmd_logits(int argc, char** argv) {
  std::vector<Flag> flags = {
      {"model", true, "model folder (config.json + safetensors)"},
      {"ids", true, "token ids, comma/space separated, or @FILE"},
      {"prefill", true, "how many leading ids go in one prefill call (default: all)"},
      {"out", true, "output .npy file, float32 [ids, vocab]"},
      {"compare", true, "reference .npy: relative L2 error per position and argmax at decisive positions"},
      {"tol", true, "with --compare: fail (exit 1) above this relative L2 error (default 1e-4)"},
  };
  for (auto& f : device_flags()) flags.push_back(f);
  flags.push_back({"help", false, "show this help"});
  Args args("logits", flags);
  args.parse(argc, argv, 2);
  if (args.has("help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  const std::string model_dir = args.get("model");
  const std::vector<int32_t> ids = parse_id_list(args.get("ids"), "logits");
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t prefill = args.get_int("prefill", n);
  if (prefill < 0 || prefill > n)
    throw UsageError(str_cat("tandem logits: --prefill ", prefill, " must be between 0 and the number of ids (", n, ")"));
  if (!args.has("out") && !args.has("compare"))
    throw UsageError("tandem logits: give --out FILE.npy (and/or --compare REF.npy)");
  RunnerOptions ro = runner_options(args, n);

  using clock = std::chrono::steady_clock;
  const auto t_load = clock::now();
  Session s = Session::open(model_dir, false);
  const ModelConfig& cfg = s.model->config();
  check_token_ids(ids, cfg.vocab_size, model_dir, "--ids");
  start_session(s, ro);
  Runner* runner = s.runner.get();
  check_context(*runner, n);
  const double load_s = std::chrono::duration<double>(clock::now() - t_load).count();

  const int64_t V = cfg.vocab_size;
  std::vector<float> logits(static_cast<size_t>(n * V));
  const auto t0 = clock::now();
  if (prefill > 0) runner->forward(std::span(ids.data(), prefill), logits.data(), Qwen35Moe::LogitRows::All);
  const auto t1 = clock::now();
  for (int64_t i = prefill; i < n; ++i)
    runner->forward(std::span(ids.data() + i, 1), logits.data() + i * V, Qwen35Moe::LogitRows::All);
  const auto t2 = clock::now();

  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "model   %s: %d layers (%d attention), %d experts top-%d, hidden %lld, vocab %lld; %s\n",
               model_dir.c_str(), cfg.num_layers, cfg.num_full_attention_layers(), cfg.num_experts,
               cfg.num_experts_per_tok, (long long)cfg.hidden_size, (long long)V, s.model->layout_description().c_str());
  std::fprintf(stderr, "run     %s; load %.2f s\n", runner->describe().c_str(), load_s);
  if (prefill > 0)
    std::fprintf(stderr, "prefill %lld tokens in %.1f ms (%.1f tok/s)\n", (long long)prefill, prefill_s * 1e3,
                 prefill / std::max(prefill_s, 1e-9));
  if (n > prefill)
    std::fprintf(stderr, "decode  %lld tokens, %.2f ms/token (%.1f tok/s)\n", (long long)(n - prefill),
                 decode_s * 1e3 / (n - prefill), (n - prefill) / std::max(decode_s, 1e-9));

  if (args.has("out")) {
    write_npy_f32(args.get("out"), logits.data(), {n, V});
    std::fprintf(stderr, "wrote   %s [%lld x %lld] float32\n", args.get("out").c_str(), (long long)n, (long long)V);
  }
  if (args.has("compare")) {
    const std::string ref_path = args.get("compare");
    const NpyArray ref = read_npy_f32(ref_path);
    if (ref.shape != std::vector<int64_t>{n, V}) fail(ref_path, ": shape differs from the logits [", n, ", ", V, "]");
    const double tol = args.get_double("tol", 1e-4);
    const LogitsComparison c = compare_logits(logits.data(), ref.data.data(), n, V);
    const int64_t misses = static_cast<int64_t>(c.argmax_misses.size());
    const bool ok = c.worst() <= tol && misses == 0;
    std::fprintf(stderr,
                 "compare %s: max relative L2 %.2e at position %lld (tolerance %.0e); argmax agrees at %lld/%lld "
                 "decisive positions: %s\n",
                 ref_path.c_str(), c.worst(), (long long)c.worst_row(), tol, (long long)(c.decisive - misses),
                 (long long)c.decisive, ok ? "OK" : "MISMATCH");
    if (!ok) return 1;
  }
  return 0;
}

}  // namespace tandem::cli
