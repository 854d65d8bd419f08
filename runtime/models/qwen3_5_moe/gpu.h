// runtime/models/qwen3_5_moe/gpu.h: the Qwen3.5-MoE forward with every tensor on one GPU.
//
// Same layer walk as Qwen35Moe::forward (the definition), with the gpu_core kernels: bf16 GEMV for
// dense projections (F16/F32 checkpoint tensors are stored as bf16), int4 / bf16 fused MoE for the
// routed experts (GPTQ repacked once at upload), the fused DeltaNet and gated attention decode
// kernels, bf16 KV cache. A decode step runs as one captured CUDA graph (GpuOptions::eager: kernel by
// kernel); a prompt goes through in chunks of GpuOptions::prefill_chunk tokens (cuBLAS projections,
// the chunked DeltaNet, flash attention on tensor cores, the routed experts grouped by expert).
//
// Hybrid (GpuOptions::expert_on_gpu + host_experts): per MoE layer the GPU computes the router and
// top-k and hands x, ids and weights to the host; it goes on with its own experts and the shared
// expert while the host runs the CPU experts, then adds their sum. Who computes what and the handoff
// protocol: hybrid_dispatch.h.
//
// Memory: everything is planned first and taken from one device allocation; when the plan exceeds
// the budget (--gpu-mem, default the free device memory) the error lists what needs how much.
#pragma once

#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu_core/sampling.cuh"
#include "runtime/models/qwen3_5_moe/gpu_snapshot.h"
#include "runtime/models/qwen3_5_moe/hybrid_dispatch.h"
#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem {

struct GpuMemoryPlan {
  uint64_t dense_weights = 0, expert_weights = 0, kv_cache = 0, deltanet_state = 0, workspace = 0;
  uint64_t total() const { return dense_weights + expert_weights + kv_cache + deltanet_state + workspace; }
  std::string describe() const;  // "dense weights 1.2 GiB, experts ..., KV cache ..., ..."
};

// The defaults are what --device gpu runs; the runner fills in a hybrid placement's fields.
struct GpuOptions {
  uint64_t budget_bytes = 0;  // what Tandem may allocate; 0: what the device has free
  int64_t max_context = 4096;
  // Hybrid placement (placement/planner.h decides): routed experts not marked here stay in host
  // memory and run through `host_experts`; nullptr / empty: every expert on the GPU.
  const std::vector<std::vector<uint8_t>>* expert_on_gpu = nullptr;  // [layer][expert]
  HostExperts* host_experts = nullptr;
  bool embed_on_gpu = true;  // false: the embedding table stays in host memory (one row per token crosses)
  std::string budget_name = "--gpu-mem";  // for messages: where the budget came from
  std::FILE* progress = nullptr;  // the upload's progress line (uploads of 1 GiB and more); nullptr: silent
  // Every decode step launched kernel by kernel instead of as a captured CUDA graph (debugging; --trace
  // steps are always eager). A graph step replays exactly the eager step's kernels: the same bits.
  bool eager = false;
  // Prompts whose last logits row is asked for go through layer by layer in chunks of prefill_chunk
  // tokens (cuBLAS projections, the chunked DeltaNet, flash attention and the grouped experts of the
  // whole chunk at once, on the GPU and on the host); with the embedding table in host memory the
  // chunk's rows are gathered there and copied over. The workspace grows by ~0.4 MB per chunk token at
  // the 35B shape plus gpu::kBlasWorkspaceBytes (the planner counts both). 0: token by token.
  int64_t prefill_chunk = 256;
  // When above prefill_chunk: take the largest chunk prefill_chunk * 2^i <= prefill_chunk_max whose
  // workspace fits the budget (longer chunks stream each expert fewer times; hybrid keeps the
  // planner's prefill.chunk with 0).
  int64_t prefill_chunk_max = 2048;
  // Hybrid decode: of each token's host-resident routed experts, the first link_experts (in top-k slot
  // order) are computed by the GPU, reading their weights in place from the host's page-locked memory
  // over PCIe (gpu::moe_int4_tiles_decode, zero copy), while the host computes the rest from the same
  // memory: the cores' reads and the link's add up. Nothing moves; arithmetic differs from the host's
  // only in rounding. Needs int4 host experts in the tile layout, page-locked; link_note() says why it
  // is off otherwise. 0: off (placement `experts.link`).
  int link_experts = 0;
  // Memory reserved at start for saved sequences (save_slot: the server's prefix cache): device memory
  // (its VRAM tier; counted against the budget) and page-locked host memory. 0: none (saves then take
  // plain host memory).
  uint64_t snapshot_vram = 0, snapshot_host = 0;
  // Hybrid expert deferral (placement `experts.deferral`): of each token's N lowest-weight routed
  // experts, the host-resident ones join the residual one layer later, so the host runs them while the
  // GPU computes the next layer (Qwen35State::defer_experts with deferrable = the CPU side; changes the
  // model's output slightly: bench/results/2026-11-30-expert-deferral-devbox.md). Adds host_rows x
  // hidden floats of workspace (the planner counts it). 0: the exact model.
  int defer_experts = 0;
  // Hybrid prefill over PCIe: a prompt (what remains of it) of at least stream_prefill_min_tokens goes
  // through layer by layer, stream_pass_tokens at a time (rounded up to whole chunks), and each layer's
  // host-resident experts are copied to the GPU (HostExperts::stream_layout) while the previous layer
  // computes, converted to the row layout and run there with the GPU's own experts; the host computes
  // none. One layer's copy and its converted form live on the device (gpu::stream_buffer_bytes, for
  // the largest number of host experts in a layer; the planner counts them). 0: never (the cost
  // model picks the switch point: Prediction::prefill_gpu_min_tokens).
  int64_t stream_prefill_min_tokens = 0;
  int64_t stream_pass_tokens = 4096;
  // Sequences held at once (slots): each its own KV cache and DeltaNet state. Steps of several
  // sequences' tokens (step_rows) take up to min(batch, gpu::kMaxGemvTokens) tokens at once.
  int batch = 1;
  // Positions a verification step keeps the DeltaNet state of (step_rows with keep; rollback): that
  // many + 1 copies of every DeltaNet layer's state in the workspace. 0: none.
  int64_t verify_tokens = 0;
  // The MTP head on the GPU (speculative decoding; the checkpoint must have one): its fc, norms and
  // decoder layer uploaded whole (its routed experts on the GPU in the checkpoint's format), a KV cache
  // per slot beside the model's (part of a slot's saved sequence), and the forwards' `hidden` rows. The
  // workspace needs step_rows' buffers: verify_tokens >= 2.
  bool mtp = false;
  // ... with its routed experts in host memory instead: host_experts holds them as layer num_layers
  // (make_cpu_experts with the head), and the head's layer hands its tokens over as a hybrid layer does
  // (placement `speculative.head_experts: cpu`). Its steps then run eagerly, not as CUDA graphs.
  bool mtp_host_experts = false;
  // Dense projections (attention, DeltaNet, shared expert; not the router, embedding, lm_head or MTP
  // head) as stored (Bf16) or quantized on load to 8-bit rows with a scale each, int8 or FP8 E4M3
  // (W8A16: gemv_rows8): half their bytes. Accuracy: bench/results/2026-12-03-dense-quant-accuracy-devbox.md.
  RowFormat dense = RowFormat::Bf16;
  // Per layer, overriding `dense` where set (a placement's rules, Plan::dense_units): the format of the
  // layer's mixer (attention or DeltaNet) / its shared expert.
  std::vector<RowFormat> mixer, shared;
  // The lm_head as 8-bit rows too (not a tied one: that is the embedding table). Accuracy: the same file.
  RowFormat lm_head = RowFormat::Bf16;
  // With mtp: the drafts read their own copy of the lm_head as these 8-bit rows, quantized on load
  // (placement `speculative.lm_head`), while the model's logits keep `lm_head`'s; Bf16, or lm_head's own
  // format: no copy, they read the model's. Half the bytes of a draft's largest read.
  RowFormat mtp_lm_head = RowFormat::Bf16;
  // The KV cache's format (core/row_format.h): bf16, or int8 / fp8 codes with an fp32 scale per token
  // and KV head (gpu_core/attention.cuh), about half the bytes: twice the context in the same memory.
  // The host placements store the same codes (Qwen35State::kv_format, KvRows).
  RowFormat kv_format = RowFormat::Bf16;
};

class Qwen35MoeGpu {
 public:
  // Uploads `model` (which must outlive this object). Throws tandem::Error: no CUDA device, budget too small.
  static std::unique_ptr<Qwen35MoeGpu> create(const Qwen35Moe& model, const GpuOptions& opts);
  ~Qwen35MoeGpu();

  const GpuMemoryPlan& memory() const;
  // Bytes of dense weights a decode token reads here, as stored on the device (8-bit rows, bf16, int4):
  // every layer's projections and norms, the final norm, the lm_head and one embedding row; not the
  // routed experts, the KV cache or the MTP head.
  uint64_t dense_bytes_per_token() const;
  // Device copy bandwidth (read + write bytes of a 256 MiB device-to-device copy), measured now.
  double copy_bandwidth() const;
  // Pinned host-to-device bandwidth (a 256 MiB copy), measured now.
  double pcie_bandwidth() const;
  void reset();  // start a new sequence
  const ExpertCounts& expert_counts() const;
  // Whether the options' fast paths are in use (each needs the embedding table on the GPU; the graph
  // also needs every expert on the GPU).
  bool batched_prefill_active() const;
  int64_t prefill_chunk() const;  // tokens per batched-prefill chunk (GpuOptions::prefill_chunk_max may raise it)
  // Like forward(ids, ..., Last), but the logits row stays on the device: `penalties` are applied
  // there and only the k best (id, penalised logit) pairs come back, best first (ties: lower id), as
  // Sampler::sample_top() takes them. false (nothing run) when k > gpu::kMaxTopK or the list is
  // longer than the context. hidden: as forward()'s.
  bool forward_top(std::span<const int32_t> ids, std::span<const gpu::Penalty> penalties, int k,
                   std::vector<std::pair<int32_t, float>>& top, float* hidden = nullptr);
  bool cuda_graph_active() const;  // decode steps run as captured CUDA graphs (not eager, not --trace)
  // Decode kernels launched with programmatic dependent launch (gpu_core/pdl.cuh: each may start while
  // the one before it finishes; the same kernels and bits): where the device takes it (cc >= 9.0).
  bool programmatic_launch_active() const;
  int link_experts_active() const;       // GpuOptions::link_experts in effect (0: off)
  const std::string& link_note() const;  // why link_experts is off when it was asked for
  // Hybrid: one graph a step with the host handoffs inside it (mapped-memory flags; the router's
  // launch posts its result, the next norm's launch waits for the host's sum: gpu_core/handoff.cuh).
  bool graph_one_step() const;
  // ... and while the host computes a layer's experts, this many bytes of the next layer's input
  // projection fetched into L2 on the side stream (70% of the device's L2; 0: not in this step form).
  int64_t l2_prefetch_active() const;
  // Streamed prefill (GpuOptions::stream_prefill_min_tokens): from how many prompt tokens it is used
  // (0: off), and why it is off when it was asked for and cannot be.
  int64_t stream_prefill_min_tokens() const;
  const std::string& stream_prefill_note() const;
  // Like Qwen35Moe::forward: ids at the current position; logits to host memory, all rows or the last.
  // hidden (the MTP head's input; GpuOptions::mtp): every fed row's final hidden state after the final
  // norm [n, H], in host memory (the decode graph and the prompt chunks copy it out too).
  void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows = Qwen35Moe::LogitRows::All, float* hidden = nullptr);

  // ---- several sequences (GpuOptions::batch slots) ----
  // forward(), forward_top() and reset() work on the selected slot (0 at first).
  int slots() const;
  void select(int slot);
  int64_t position(int slot) const;
  void reset_slot(int slot);
  // A slot's sequence saved and restored (the server's prefix cache): the KV rows of its position and
  // every DeltaNet layer's conv and recurrent state, in layer order, as one byte stream in the snapshot
  // pools' memory (GpuOptions::snapshot_vram, snapshot_host; gpu_snapshot.h). load_slot makes the slot
  // that sequence (position included).
  struct SlotCopy {
    int64_t position = 0;
    std::shared_ptr<const SnapshotMemory> memory;
  };
  SlotCopy save_slot(int slot) const;
  void load_slot(int slot, const SlotCopy& copy);
  // Tokens one step_rows call takes at most (1: no batched steps here; sequences go one at a time).
  int64_t step_rows_max() const;
  struct RowFeed {
    int slot = 0;
    std::span<const int32_t> ids;  // consecutive positions of the slot's sequence
    bool keep = false;             // keep its DeltaNet state after every position (alone in its step; GpuOptions::verify_tokens)
  };
  // One layer walk over every feed's tokens at once (at most step_rows_max() in all, distinct slots):
  // the projections and the experts over all rows (each expert's weights read once per step for all
  // its tokens on the host side), the conv, recurrence and attention on each sequence's own state. The
  // logits of every fed row, in feed order, to `logits` [rows, vocab] (nullptr: none). All on the GPU:
  // one CUDA graph per step shape (tokens, sequences).
  // hidden: every fed row's final hidden state after the final norm [rows, H] (nullptr: none).
  void step_rows(std::span<const RowFeed> feeds, float* logits, float* hidden = nullptr);
  // The same with each row's logits left on the device: penalties[r] applied to row r there and the
  // k[r] best (id, penalised logit) pairs of it to tops[r] (best first). false (nothing run) when a k
  // is outside 1..gpu::kMaxTopK, a list is longer than the context or rows x vocab exceeds int32 ids.
  // k[r] 0: no candidates for row r. hidden: as step_rows'.
  bool step_rows_top(std::span<const RowFeed> feeds, std::span<const std::span<const gpu::Penalty>> penalties, std::span<const int> k,
                     std::span<std::vector<std::pair<int32_t, float>>* const> tops, float* hidden = nullptr);
  // After a keep step that fed n tokens to `slot`: its state after the first `keep` (0..n) of them.
  void rollback(int slot, int64_t keep);

  // ---- the MTP head (GpuOptions::mtp) ----
  bool mtp_active() const;
  // Head rows at positions at.. of `slot`'s head cache: row t from hidden [n, H] (the main model's
  // final hidden states, host memory) and ids[t] (the token that followed), as Qwen35Moe::mtp_forward.
  // The last row's outputs: logits [vocab] to host memory (nullptr: none), its argmax (lowest id on
  // ties) to *argmax (nullptr: none), its state after mtp.norm [H] (the chain's next hidden) to
  // hidden_out (nullptr: none). Rows beyond at + n in the cache are left as they are (overwritten later).
  void mtp_rows(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, float* logits, int32_t* argmax, float* hidden_out);
  // Greedy drafts in one go: mtp_rows over (ids, hidden) at `at`, its argmax drafts[0], then the head
  // chained on its own output state and draft for drafts[1..] (cache rows at + n ..), as one CUDA graph
  // per (rows, drafts). false (nothing run) where it cannot be one graph (the embedding table in host
  // memory, eager steps, more rows than a step, more than 8 drafts): the caller chains mtp_rows.
  bool mtp_chain(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, std::span<int32_t> drafts);

  struct Impl;

 private:
  template <typename F>
  void for_slot_pieces(int slot, int64_t position, F&& f) const;  // save_slot / load_slot's walk (gpu.cpp)
  explicit Qwen35MoeGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
