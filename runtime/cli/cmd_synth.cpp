// tandem synth: write a complete model folder with random weights in the real on-disk format.
#include <cstdio>
#include <string>
#include <thread>

#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "core/error.h"
#include "tools/synth/synth.h"

namespace tandem::cli {

namespace {

std::string bytes_text(uint64_t b) {
  char buf[32];
  if (b >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1000000ull) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f KB", b / 1e3);
  return buf;
}

void print_routing(const synth::Result& r, double skew) {
  const auto& rep = r.routing;
  std::printf("routing  skew %.2f (log-std of router row scales %.3f); %d random post-norm hidden states per layer,\n"
              "         softmax top-%d of %d experts; share of activations taken by the most popular experts:\n",
              skew, r.skew_log_spread, rep.samples, r.config.num_experts_per_tok, r.config.num_experts);
  std::printf("                       top 10%%   top 20%%   top 50%%\n");
  auto row = [](const char* name, const synth::RoutingShares& s) {
    std::printf("         %-12s %8.1f%% %8.1f%% %8.1f%%\n", name, 100 * s.top10, 100 * s.top20, 100 * s.top50);
  };
  row("mean", rep.mean);
  row("min layer", rep.min);
  row("max layer", rep.max);
  row("uniform", {0.1, 0.2, 0.5});
}

}  // namespace

int cmd_synth(int argc, char** argv) {
  std::string preset_names;
  for (const auto& p : synth::presets()) preset_names += (preset_names.empty() ? "" : " | ") + p.name;
  Args args("synth", {
                         {"preset", true, preset_names},
                         {"out", true, "output folder (created if missing)"},
                         {"quant", true, "bf16 | gptq-int4 (default: the preset's: tiny bf16, others gptq-int4)"},
                         {"seed", true, "random seed (default 0); same seed, same bytes, any thread count"},
                         {"routing-skew", true, "router popularity skew A >= 0 (0 uniform; default 1: top 20% of experts ~27.5%)"},
                         {"threads", true, "writer threads (default: all cores)"},
                         {"config-only", false, "write only config.json, tokenizer and generation_config"},
                         {"dry-run", false, "print the tensor count and bytes per shard; write nothing"},
                         {"max-shard-gb", true, "shard size limit in GB (default 4); one model.safetensors below it"},
                         {"report-samples", true, "random hidden states per layer for the routing report (default 2048, 0: none)"},
                         {"force", false, "overwrite a folder that already holds a model"},
                         {"help", false, "show this help"},
                     });
  args.parse(argc, argv, 2);
  if (args.has("help")) {
    std::fputs(args.usage().c_str(), stdout);
    std::puts("\npresets:");
    for (const auto& p : synth::presets()) std::printf("  %-16s %s\n", p.name.c_str(), p.description.c_str());
    return 0;
  }
  const synth::Preset& preset = [&]() -> const synth::Preset& {
    try {
      return synth::find_preset(args.get("preset"));
    } catch (const Error& e) {
      throw UsageError(str_cat("tandem synth: ", e.what()));
    }
  }();
  synth::Options o;
  o.dry_run = args.has("dry-run");
  o.out_dir = o.dry_run ? args.get("out", "") : args.get("out");
  try {
    o.quant = args.has("quant") ? synth::parse_quant(args.get("quant")) : preset.default_quant;
  } catch (const Error& e) {
    throw UsageError(str_cat("tandem synth: --quant: ", e.what()));
  }
  const int64_t seed = args.get_int("seed", 0);
  if (seed < 0) throw UsageError("tandem synth: --seed must be a non-negative integer");
  o.seed = static_cast<uint64_t>(seed);
  o.routing_skew = args.get_double("routing-skew", synth::kDefaultRoutingSkew);
  if (!(o.routing_skew >= 0 && o.routing_skew <= 10)) throw UsageError("tandem synth: --routing-skew must be between 0 and 10");
  const int64_t threads = args.get_int("threads", 0);
  if (threads < 0 || threads > 1024) throw UsageError("tandem synth: --threads must be between 1 and 1024");
  o.threads = threads > 0 ? static_cast<int>(threads) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  o.config_only = args.has("config-only");
  const double shard_gb = args.get_double("max-shard-gb", 4.0);
  if (!(shard_gb > 0)) throw UsageError("tandem synth: --max-shard-gb must be positive");
  o.max_shard_bytes = static_cast<uint64_t>(shard_gb * 1e9);
  const int64_t samples = args.get_int("report-samples", 2048);
  if (samples < 0 || samples > 1000000) throw UsageError("tandem synth: --report-samples must be between 0 and 1000000");
  o.report_samples = static_cast<int>(samples);
  o.force = args.has("force");
  o.log = stderr;

  std::printf("synth    preset %s, %s, seed %llu, routing skew %.2f, %d threads%s\n", preset.name.c_str(),
              std::string(synth::quant_name(o.quant)).c_str(), static_cast<unsigned long long>(o.seed), o.routing_skew,
              o.threads, o.dry_run ? " (dry run)" : o.config_only ? " (config only)" : "");
  std::fflush(stdout);
  const synth::Result r = synth::synthesize(preset, o);
  const ModelConfig& c = r.config;
  std::printf("model    hidden %lld, %d layers (%d attention), %d experts top-%d x %lld, vocab %lld "
              "(%zu BPE tokens, specials from %lld)\n",
              (long long)c.hidden_size, c.num_layers, c.num_full_attention_layers(), c.num_experts, c.num_experts_per_tok,
              (long long)c.moe_intermediate_size, (long long)c.vocab_size, r.bpe_tokens, (long long)r.special_base);
  if (!r.shards.empty()) {
    uint64_t file_bytes = 0;
    for (const auto& s : r.shards) file_bytes += s.bytes;
    std::printf("tensors  %zu, %s of data in %zu file(s), %s on disk\n", r.num_tensors, bytes_text(r.tensor_bytes).c_str(),
                r.shards.size(), bytes_text(file_bytes).c_str());
    for (const auto& s : r.shards)
      std::printf("           %-36s %7zu tensors  %s\n", s.file.c_str(), s.tensors, bytes_text(s.bytes).c_str());
  }
  if (o.dry_run) {
    std::puts("dry run  nothing written");
    return 0;
  }
  std::printf("wrote    %s: config.json, generation_config.json, tokenizer.json, tokenizer_config.json%s\n",
              o.out_dir.c_str(), r.weights_written ? ", safetensors, synth_report.json" : "");
  if (r.weights_written) {
    uint64_t file_bytes = 0;
    for (const auto& s : r.shards) file_bytes += s.bytes;
    std::printf("weights  %s in %.2f s: %.2f GB/s\n", bytes_text(file_bytes).c_str(), r.write_seconds, r.gb_per_s);
    if (!r.routing.layers.empty()) print_routing(r, o.routing_skew);
  }
  return 0;
}

}  // namespace tandem::cli
