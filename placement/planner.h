// placement/planner.h: decides where every tensor and routed expert lives, from config.json (with its
// quantization config), a PlacementConfig and optionally a heat map. It loads no weights and runs
// nothing. The GPU memory it counts comes from placement/gpu_layout.h, the layout the GPU model allocates
// from, so the plan is the allocation by construction (the GPU tests compare the two byte for byte too).
//
// Order of decisions:
//   1. Always on the GPU: attention, DeltaNet, routers, shared experts, norms, lm_head (rules may move
//      embed_tokens to the CPU: the lookup is one row per token). Plus the KV cache at the configured
//      context and batch, DeltaNet state, workspaces, and gpu.reserve for the CUDA context.
//      Below that minimum the plan is an error stating the minimum budget.
//   2. Rules pin routed experts to a side (first match wins; presets are rules too).
//   3. The rest of the budget is filled with routed experts in one fixed order per selection policy
//      (frequency: by expected activations, hottest first; uniform: round robin over layers, hottest
//      first within a layer; layers a-b: only those layers; all / none). Because the order does not
//      depend on the budget, more budget never means fewer GPU experts.
//   4. A cost model from bandwidths (GPU memory, PCIe, CPU DRAM) and per-launch / per-handoff latency
//      predicts decode tok/s and the prompt length above which prefill streams CPU experts to the GPU.
// Byte counts: placement/gpu_layout.h (256-byte aligned pieces; dense tensors in bf16; GPTQ int4
// repacked: nibbles + fp16 scales + uint8 zeros (+ int32 permutation for act-order)).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/row_format.h"

#include <nlohmann/json_fwd.hpp>

#include "placement/heat.h"
#include "placement/placement_config.h"
#include "runtime/format/config.h"

namespace tandem::placement {

struct VramBytes {
  uint64_t dense_weights = 0;   // attention, DeltaNet, routers, shared experts, norms, lm_head (+ embed on GPU)
  uint64_t expert_weights = 0;  // routed experts resident on the GPU (+ their pointer tables)
  uint64_t kv_cache = 0;
  uint64_t deltanet_state = 0;
  uint64_t workspace = 0;
  uint64_t reserve = 0;         // CUDA context / driver (not allocated by Tandem, counted in the budget)
  uint64_t allocated() const { return dense_weights + expert_weights + kv_cache + deltanet_state + workspace; }
  uint64_t total() const { return allocated() + reserve; }
};

// The cache position the decode prediction reads the KV cache at (or the context, if shorter).
constexpr int64_t kTypicalCachePosition = 1024;

struct Prediction {
  double gpu_bw = 0, pcie_bw = 0, cpu_bw = 0;  // bytes/s used
  std::string gpu_bw_from, pcie_bw_from, cpu_bw_from;  // "config", "measured", "default"
  double gpu_bytes_per_token = 0;   // decode, batch 1: weights + state + KV at kTypicalCachePosition
  double cpu_bytes_per_token = 0;   // routed experts read from host RAM per token
  double decode_ms = 0;             // predicted time per token
  double decode_tok_s = 0;
  double bound_tok_s = 0;           // bandwidth only (no latency terms)
  // The same decode with the KV cache full (a token at position `context` reads every cached row):
  // where a long context costs speed, and what a coded cache (kv_cache.format) wins back.
  double gpu_bytes_full_context = 0;
  double decode_tok_s_full_context = 0;
  int64_t prefill_gpu_min_tokens = 0;  // prompts at least this long stream CPU experts to the GPU
  // Speculative decoding (speculative.draft, the MTP head on the GPU): the verification step of k + 1
  // tokens for k = 1 .. the drafts held (verify_ms[k - 1]), one draft's time, and the speed-up over
  // plain decode at acceptance a (the same at every position): (1 - a^(k+1)) / (1 - a) tokens a step
  // over verify_ms + k draft_ms. Empty without drafts. The verification by its bytes plus a per-layer
  // cost of the batched step and of each token beyond the first, fitted to the H100 (planner.cpp:
  // kVerifyStepUs, kVerifyTokenUs).
  std::vector<double> verify_ms;
  double draft_ms = 0;
  double speedup(int k, double acceptance) const;
};

struct Plan {
  std::string model;              // config.json path
  uint64_t budget_bytes = 0;      // gpu.memory (or --gpu-mem)
  int64_t context = 0;
  std::string context_note;       // context: auto: how it was chosen and what it costs in GPU experts
  int batch = 1;
  VramBytes vram;
  uint64_t min_budget_bytes = 0;  // everything but routed experts
  bool embed_on_gpu = true;
  std::string expert_checkpoint_format;  // int4 (GPTQ, or quantized on load) or bf16
  bool experts_int4_on_load = false;     // floating-point experts quantized on load (experts.gpu_format: int4, ...)
  std::string on_load_note;              // what that quantizes, for the table ("quantized on load", "the MTP head's ...")
  std::string dense_format = "bf16";     // dense.format: the projections as stored (bf16) or 8-bit rows (int8, fp8)
  std::string lm_head_format = "bf16";   // dense.lm_head
  RowFormat kv_format = RowFormat::Bf16;   // kv_cache.format
  // The projection units held as 8-bit rows, int8 or fp8 (dense.format / dense.lm_head, and rules'
  // format: int8 | fp8 over "layers.L.self_attn", "layers.L.linear_attn", "layers.L.mlp.shared_expert",
  // "lm_head"), sorted by unit.
  std::vector<std::pair<std::string, RowFormat>> dense_units;
  RowFormat dense_format_of(const std::string& unit) const {  // Bf16 (as stored) when not listed
    const auto it = std::lower_bound(dense_units.begin(), dense_units.end(), unit, [](const auto& e, const std::string& u) { return e.first < u; });
    return it != dense_units.end() && it->first == unit ? it->second : RowFormat::Bf16;
  }
  std::string cpu_expert_format;         // int4 | int8 | bf16
  uint64_t gpu_expert_bytes = 0;         // one routed expert on the GPU
  uint64_t cpu_expert_bytes = 0;         // one routed expert in host RAM (streamed per activation)
  uint64_t host_expert_bytes = 0;        // all CPU-resident experts
  uint64_t host_available_bytes = 0;     // what the machine had free when planned (0: unknown)
  bool host_fits() const { return !host_available_bytes || host_expert_bytes <= host_available_bytes; }
  std::vector<std::vector<uint8_t>> expert_on_gpu;  // [layer][expert]
  std::vector<int> experts_on_gpu;                  // count per layer
  std::vector<double> layer_gpu_fraction;           // expected share of the layer's activations on the GPU
  double expected_gpu_expert_fraction = 0;          // over all layers
  bool heat_used = false;
  std::string selection;                            // the policy, as the config named it
  int deferral = 0;
  // speculative.head_experts: cpu (with drafts): the MTP head's routed experts in host memory, these
  // bytes of them (in host_expert_bytes too), none in VRAM.
  bool head_experts_cpu = false;
  uint64_t head_host_expert_bytes = 0;
  // speculative.lm_head (with drafts): the drafts' own copy of the lm_head as these 8-bit rows (in
  // vram.dense_weights); Bf16: none, they read the model's (also when it is already in this format).
  RowFormat draft_lm_head = RowFormat::Bf16;
  uint64_t draft_lm_head_bytes = 0;
  // experts.link (GpuOptions::link_experts): its device buffers are in vram.workspace, counted for
  // every layer (gpu::link_buffer_bytes with all layers holding CPU experts).
  int link_in_place = 0;
  PrefillStrategy prefill = PrefillStrategy::Auto;
  int64_t prefill_chunk = 0;  // batched GPU prefill chunk (its workspace is in vram.workspace); 0: token by token
  bool prefill_chunk_auto = false;  // chosen by the planner (prefill.chunk: auto)
  // Streamed prefill: host experts of the layer with the most (its buffers are in vram.workspace); 0:
  // none budgeted (stream_note says why when prefill.strategy allowed it).
  int stream_experts = 0;
  int64_t stream_pass = 0;  // tokens per streamed pass (prefill.stream_pass in whole chunks)
  std::string stream_note;
  Prediction predicted;

  int total_gpu_experts() const;
  bool any_cpu_experts() const;
};

struct PlanRequest {
  uint64_t gpu_mem = 0;   // overrides the config's gpu.memory when set
  int64_t context = 0;    // overrides the config's context when set (0: the config's; auto when it has none)
  uint64_t device_free_bytes = 0;  // what the GPU has free (0: no GPU known); the budget when none is set
  double measured_gpu_bw = 0;      // bytes/s, when known
  double measured_cpu_bw = 0;
  uint64_t host_available_bytes = 0;  // host RAM free for the CPU experts (0: unknown)
  // Tokens a step that keeps its states may feed (RunnerOptions::verify_tokens: tandem bench
  // --verify-cost), counted in the workspace beside speculative.draft's; 0: what the drafts need.
  int64_t verify_tokens = 0;
};

// Throws tandem::Error: budget below the minimum (with the minimum), rules that cannot be honoured
// (with the rule's line), heat map shape mismatch.
Plan make_plan(const ModelConfig& model, const PlacementConfig& config, const PlanRequest& request = {});

// The machine-readable form (`tandem plan --json`, Engine.plan()).
nlohmann::json plan_to_json(const Plan& plan);
// One line: "N of M routed experts on the GPU (selection), budget X GiB, expected GPU share P%".
std::string plan_summary(const Plan& plan);
// The readable form: components, experts per layer, prediction.
std::string plan_table(const Plan& plan);

// The same budget planned with each dense format (bf16; int8 projections; int8 projections and
// lm_head: dense.format, dense.lm_head), side by side: dense
// bytes, context, routed experts on the GPU, bytes a token reads, predicted decode (tandem plan).
// tandem plan's side-by-side table: the same budget per dense format and per expert format ("as
// stored", or "int4" where floating-point experts would be quantized on load).
struct FormatRow {
  std::string format;   // dense: bf16 | int8 | int8 + lm_head | fp8 (and the config's own)
  std::string experts;  // as stored | int4
  std::string kv;       // the KV cache: bf16 | int8 | fp8
  Plan plan;
};
std::vector<FormatRow> plan_formats(const ModelConfig& model, const PlacementConfig& config, const PlanRequest& request);
std::string formats_table(const std::vector<FormatRow>& rows);
nlohmann::json formats_to_json(const std::vector<FormatRow>& rows);

// Whether the checkpoint's routed experts are GPTQ int4 (its quantization_config), as the planner reads it.
bool checkpoint_int4_experts(const ModelConfig& c);

// Canonical names of the units the planner places (for rules): "layers.3.mlp.experts.17", "embed_tokens", ...
std::string expert_name(int layer, int expert);

}  // namespace tandem::placement
