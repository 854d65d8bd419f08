// tandem info: what a model folder holds (config, layout, bytes) and which CUDA devices are usable.
#include <cstdio>

#include "gpu_core/device.cuh"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem::cli {

int cmd_info(int argc, char** argv) {
  Args args("info", {{"model", true, "model folder (optional)"},
                     {"quant-cache", true, "where --experts-format int4's cache is looked for (default: MODEL/.tandem-cache when writable, else ~/.cache/tandem)"},
                     {"help", false, "show this help"}});
  args.parse(argc, argv, 2);
  if (args.has("help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  gpu::DeviceProbe probe;
  gpu::gpu_device_probe(&probe);
  if (probe.device_count > 0)
    std::printf("cuda     %d device(s); 0: %s, sm_%d%d, %.1f GiB\n", probe.device_count, probe.name, probe.cc_major,
                probe.cc_minor, probe.total_bytes / double(1ull << 30));
  else
    std::printf("cuda     %s\n", probe.reason);
  if (!args.has("model")) return 0;

  auto model = Qwen35Moe::load(args.get("model"));
  const ModelConfig& c = model->config();
  std::printf("model    %s (%s config)\n", args.get("model").c_str(), c.composite ? "composite qwen3_5_moe" : "text-only");
  std::printf("layers   %d: %d Gated DeltaNet + %d gated attention\n", c.num_layers,
              c.num_layers - c.num_full_attention_layers(), c.num_full_attention_layers());
  std::printf("hidden   %lld, vocab %lld, attention %d/%d heads x %d (rotary %d), DeltaNet %d/%d heads x %d/%d\n",
              (long long)c.hidden_size, (long long)c.vocab_size, c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim,
              c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim);
  std::printf("experts  %d routed (top-%d, %lld wide) + 1 shared (%lld wide)\n", c.num_experts, c.num_experts_per_tok,
              (long long)c.moe_intermediate_size, (long long)c.shared_expert_intermediate_size);
  std::printf("layout   %s\n", model->layout_description().c_str());
  std::printf("mtp      %s\n", model->mtp() ? "the multi-token-prediction head (1 attention layer with its MoE): speculative decoding with --draft N"
                                            : "none");
  const auto& ck = model->checkpoint();
  std::printf("tensors  %zu in %zu file(s), %.3f GiB\n", ck.names().size(), ck.num_files(),
              ck.total_bytes() / double(1ull << 30));
  // --experts-format int4: what it would quantize, and whether a start would find it cached
  const std::vector<const LinearWeight*> fl = model->float_experts();
  const int64_t group = model->int4_expert_group_size();
  if (fl.empty()) {
    std::printf("int4     the routed experts are int4 as stored\n");
  } else if (group == 0) {
    std::printf("int4     --experts-format int4 does not apply: hidden and intermediate sizes have no common group of 32 or more\n");
  } else {
    const Int4CacheStatus st = int4_cache_status(ck.dir(), args.get("quant-cache", ""), fl, group);
    std::printf("int4     --experts-format int4: %s%zu expert matrices in groups of %lld, %s in %s\n", model->gptq_experts() ? "the MTP head's " : "",
                fl.size(), static_cast<long long>(group), st.finished ? "cached" : "not cached yet (the first start quantizes them)", st.dir.c_str());
  }
  return 0;
}

}  // namespace tandem::cli
