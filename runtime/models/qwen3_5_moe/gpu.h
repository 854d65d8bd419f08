// runtime/models/qwen3_5_moe/gpu.h: the Qwen3.5-MoE forward with every tensor on one GPU.
//
// Same layer walk as Qwen35Moe::forward (the definition), with the gpu_core kernels: bf16 GEMV for
// dense projections (F16/F32 checkpoint tensors are stored as bf16), int4 GEMV / fused MoE for GPTQ
// experts (repacked once at upload), bf16 fused MoE for BF16 experts, the fused DeltaNet and gated
// attention decode kernels, bf16 KV cache. Tokens go through one at a time (a prompt is a sequence
// of decode steps: exact, not yet fast; the chunked prefill kernels come next).
//
// Hybrid (GpuOptions::expert_on_gpu + host_experts): per MoE layer the GPU computes the router and
// top-k, copies x, ids and weights to pinned host memory and records an event; it goes on with its
// own experts and the shared expert while the host waits for the event, runs the CPU experts and
// queues their sum back (H2D copy + add on the same stream). Stream order makes the buffer reuse
// safe: a layer's host buffers are rewritten only after the next layer's event, which follows the
// previous H2D copy on the stream.
//
// Memory: everything is planned first and taken from one device allocation; when the plan exceeds
// the budget (--gpu-mem, default the free device memory) the error lists what needs how much.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu_core/sampling.cuh"
#include "runtime/engine/expert_swap.h"
#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem {

struct GpuMemoryPlan {
  uint64_t dense_weights = 0, expert_weights = 0, kv_cache = 0, deltanet_state = 0, workspace = 0;
  uint64_t total() const { return dense_weights + expert_weights + kv_cache + deltanet_state + workspace; }
  std::string describe() const;  // "dense weights 1.2 GiB, experts ..., KV cache ..., ..."
};

// Routed experts that live in host memory (hybrid placement): the GPU model hands each MoE layer's
// normalised hidden state and its top-k choice to this object and adds what it returns.
class HostExperts {
 public:
  virtual ~HostExperts() = default;
  // out [T, H] = per token t, sum over j with ids[t*k + j] >= 0 of weights[t*k + j] * expert(x_t); ids of
  // GPU experts are -1. T is 1 in decode, up to the prefill chunk in batched prefill.
  virtual void run(int layer, const float* x, int64_t T, const int32_t* ids, const float* weights, int k, float* out) = 0;

  // For streamed prefill (GpuOptions::stream_prefill_min_tokens): where a layer's host-resident int4
  // experts lie, as one byte range (page-locked for DMA where the host could lock it) and each
  // expert's matrices in the tile layout (gpu_core/int4_layout.h) as offsets into it. Gate and up rows come in down's
  // input order (act order folded in), so down's inputs need no permutation and only gate / up carry
  // one. false (with `why`) when the layer cannot be streamed (another format, padded shapes).
  struct StreamMatrix {
    static constexpr uint64_t kNone = ~uint64_t(0);
    uint64_t w = 0, scales = 0, zeros = kNone, perm = kNone;  // byte offsets from base
    int64_t rows = 0, cols = 0, group_size = 0;
  };
  struct StreamExpert {
    int expert = 0;
    StreamMatrix gate, up, down;
  };
  struct StreamLayer {
    const void* base = nullptr;
    uint64_t bytes = 0;
    std::vector<StreamExpert> experts;
  };
  virtual bool stream_layout(int /*layer*/, StreamLayer& /*out*/, std::string& why) const {
    why = "these host experts cannot be streamed";
    return false;
  }
  // Whether run() can compute this expert (online re-placement hands the host GPU experts too).
  virtual bool holds(int /*layer*/, int /*expert*/) const { return false; }
  // Reads the weights of `layer`'s experts ids[0..n) (a guess, best first; ones this side does not
  // hold are skipped) into the caches, ahead of a run() expected to need them; stops early once stop()
  // holds (the run's inputs have arrived). run() gives the same result either way
  // (GpuOptions::host_prefetch).
  virtual void prefetch(int /*layer*/, const int32_t* /*ids*/, int /*n*/, const std::function<bool()>& /*stop*/) {}
};

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
  // Run each decode step as one captured CUDA graph when everything is on the GPU (no host experts,
  // embedding on the GPU, no --trace). The runners turn it on unless TANDEM_CUDA_GRAPH=0.
  bool cuda_graph = false;
  // Hybrid decode with cuda_graph: the whole step as one graph, each host handoff inside it (the
  // router's result posted to mapped host memory with a flag the host spins on; a kernel waiting on a
  // flag the host sets, adding the host's sum straight from host memory) instead of graphs cut at the
  // handoffs and relaunched after each (gpu_core/handoff.cuh). Same numbers as the eager step (tested on
  // the H200). The runners turn it on unless TANDEM_HYBRID_ONE_GRAPH=0.
  bool hybrid_one_graph = false;
  // With hybrid_one_graph: the handoff kernels folded into their neighbours (gpu_core/handoff.cuh): the
  // router GEMV's last block posts the router result to the host itself (router_norm layers), and the
  // wait for the host's sum is the next norm's own launch (gpu::host_wait_add_rmsnorm_zc), which lets
  // the kernel after it load its weights while the host works. Two launches fewer on each layer's
  // path from the host's sum to the next router result; the same bits (tested on the H200). With the L2
  // prefetch below, the GPU part a host layer waits for fell 2.46-2.51 -> 2.08-2.31 ms a token there
  // (8 GiB, every expert on the CPU, link 3). The runners turn it on unless TANDEM_FUSED_HANDOFF=0.
  bool fused_handoff = false;
  // With hybrid_one_graph and parallel_shared: while the host computes a layer's experts, the last
  // l2_prefetch_bytes of the next layer's input projection (bf16) are fetched into the L2 cache on the
  // side stream (gpu::l2_prefetch), so that the projection, the first kernel after the host's sum,
  // streams them from there (its first blocks' rows come early with programmatic launch and
  // fused_handoff). Changes nothing computed. 0: off; -1: 70% of the device's L2 (35 MB on the H200,
  // the best of 24 / 36 MB measured there: 8 GiB all-CPU 134.5 -> 137.5 tok/s). The runners ask for
  // -1 unless TANDEM_L2_PREFETCH_MB=N.
  int64_t l2_prefetch_bytes = 0;
  // Prompts whose last logits row is asked for go through layer by layer in chunks of prefill_chunk
  // tokens (cuBLAS projections, DeltaNet prefill, the experts of the whole chunk at once, on the GPU
  // and on the host); with the embedding table in host memory the chunk's rows are gathered there
  // and copied over (pinned staging of a chunk, or of a streamed pass). The workspace grows by ~0.4 MB per chunk token
  // at the 35B shape plus gpu::kBlasWorkspaceBytes (the planner counts both). The runners turn it on
  // unless TANDEM_BATCHED_PREFILL=0.
  bool batched_prefill = false;
  int64_t prefill_chunk = 256;
  // When above prefill_chunk: take the largest chunk prefill_chunk * 2^i <= prefill_chunk_max whose
  // workspace fits the budget (longer chunks stream each expert fewer times; --device gpu asks for
  // 2048; hybrid keeps the planner's prefill.chunk).
  int64_t prefill_chunk_max = 0;
  // In batched prefill, int4 routed experts go through gpu::moe_int4_grouped (each expert's tokens
  // together) instead of the decode kernel on blocks of 8 tokens; with grouped_moe_tc through its
  // tensor-core form gpu::moe_int4_grouped_tc. The workspace is allocated (and planned) with batched
  // prefill either way, so these change no byte count. Validated on the H200; the runners turn them on
  // unless TANDEM_GROUPED_MOE=0 / TANDEM_GROUPED_MOE_TC=0.
  bool grouped_moe = false;
  bool grouped_moe_tc = false;
  // Decode int4 experts through gpu::moe_int4_decode_prefetch (the same result, every weight word of a
  // row loaded up front). Validated; the runners turn it on unless TANDEM_MOE_PREFETCH=0.
  bool moe_prefetch = false;
  // Decode int4 experts through gpu::moe_int4_decode_wide (16-byte weight loads, fp32 input read
  // directly: no fp16 gather launch) where the shapes fit it; moe_prefetch / the plain kernel elsewhere.
  // The runners turn it on unless TANDEM_MOE_WIDE=0.
  bool moe_wide = false;
  // The post-attention norm done by the router GEMV's blocks themselves (gpu::gemv_bf16_router_topk_norm,
  // the same bits): one launch fewer a layer. Validated on the H200 (12 GiB hybrid on text: 151 -> 159
  // tok/s); the runners turn it on unless TANDEM_ROUTER_NORM=0.
  bool router_norm = false;
  // Decode: the shared expert's down GEMV on a second stream beside the routed experts (forked and
  // joined inside the step's graph; layers whose experts are all on the GPU, stacked bf16 shared
  // projections). The same kernels, so the same bits. Validated on the H200 (all-GPU decode 230.0 ->
  // 237.3 tok/s); the runners turn it on unless TANDEM_PARALLEL_SHARED=0.
  bool parallel_shared = false;
  // Hybrid decode in one graph a step (hybrid_one_graph, parallel_shared): at the start of each layer
  // with host experts the GPU guesses its experts (the layer's router applied to the layer's input
  // with the post-attention norm, on the side stream beside the mixer) and posts the guess; the host,
  // idle until the router's real choice arrives, reads the weights of the first host_prefetch guessed
  // experts into its caches (HostExperts::prefetch). The guess changes nothing computed. A layer's
  // input foresees ~86-89% of its top-8 on the synthetic 35B (`tandem profile`). 0: off. Run on the H200
  // in session 12: correct, no gain (a forward after such reads is slower there, 141-180 µs against
  // 138; decode 102-105 against 98-105), so off (TANDEM_HOST_PREFETCH=N).
  int host_prefetch = 0;
  // Hybrid decode: of each token's host-resident routed experts, the first link_experts (in top-k slot
  // order) are computed by the GPU, reading their weights in place from the host's page-locked memory
  // over PCIe (gpu::moe_int4_tiles_decode, zero copy), while the host computes the rest from the same
  // memory: the cores' reads and the link's add up (on the H200 machine ~72 + ~50 GB/s together
  // against ~91 for the cores alone: bench_handoff's pcie rows). Nothing moves; arithmetic differs from
  // the host's only in rounding. Needs int4 host experts in the tile layout, page-locked, and no online
  // re-placement; link_note() says why it is off otherwise. 0: off (placement `experts.link`;
  // TANDEM_LINK_EXPERTS=N overrides). Validated on the H200 (session 12): 8 GiB with every expert on the
  // CPU 105.8-110.0 -> 127.9-130.6 tok/s with 3.
  int link_experts = 0;
  // With link_experts, in the one-graph step: each layer's first link_stage guessed experts (the guess
  // of host_prefetch: the router over the layer's input, ~86-89% of the top-8 on the synthetic 35B)
  // are copied whole to device memory over PCIe while the GPU computes the mixer (the link is idle
  // then: gpu::int4_tiles_stage), and the GPU computes those of them the router then picks from there,
  // besides link_experts more read in place; the host computes the rest. (`experts.link.staged`;
  // TANDEM_LINK_STAGE=S.) 0: off. Validated on the H200 (session 12), no faster than link_experts alone.
  int link_stage = 0;
  // Decode DeltaNet with the recurrence split over 32-column slices of each head's state
  // (gpu::DeltaNetDecodeArgs::tickets). Validated on the H200, no faster there: off unless
  // TANDEM_DELTANET_SPLIT=1.
  bool deltanet_split = false;
  // Decode DeltaNet's causal conv applied by the input projection's GEMV as it writes its outputs
  // (gpu::gemv_bf16_conv; the same bits, one launch fewer a layer). Written after the session's last
  // device run: not yet run on a GPU, so off unless TANDEM_DELTANET_CONV_GEMV=1.
  bool deltanet_conv_in_gemv = false;
  // Decode kernels launched with programmatic dependent launch (gpu_core/pdl.cuh; compute capability
  // 9.0 and later, ignored below): each may start while the one before it finishes, the GEMVs loading
  // their first weights and the DeltaNet recurrence its state before they wait. The same kernels and
  // arithmetic, so the same bits (tested on the H200; all-GPU decode at a 4096 context 293.1 -> 312.4
  // tok/s, medians of 3). The runners turn it on unless TANDEM_PDL=0.
  bool programmatic_launch = false;
  // In batched prefill, attention for the whole chunk in one gpu::attention_prefill call (flash-
  // attention form) instead of one decode call per token. Validated; the runners turn it on unless
  // TANDEM_ATTN_PREFILL=0.
  bool attention_prefill = false;
  // With attention_prefill: its products on tensor cores (queries and softmax weights in bf16, fp32
  // sums; gpu::attention_prefill's tensor_cores). The runners turn it on unless TANDEM_ATTN_TC=0.
  bool attention_prefill_tc = false;
  // Attention decode scores a chunk of context with one block per KV head for its group's query heads
  // (each K / V row read once: AttentionDecodeArgs::gqa_blocks) instead of one per query head. The runners turn it on unless TANDEM_ATTN_GQA=0.
  bool attention_gqa = false;
  // In batched prefill, DeltaNet through gpu::deltanet_prefill_chunked (the chunked form: every
  // chunk's state-free terms first, in parallel, then 32 tokens a sequential step; its scratch is
  // allocated and planned with batched prefill either way) instead of the token-by-token scan.
  // Validated on the H200 (prefill 4096: 5,858 vs 4,996 tok/s); the runners turn it on unless
  // TANDEM_DELTANET_CHUNKED=0.
  bool deltanet_chunked = false;
  // Batched prefill's bf16 projections (cuBLAS) with the activations split into two bf16 terms (two
  // GEMMs, ~1e-5 from fp32) or, false, rounded to bf16 (one GEMM: half the tensor-core work, ~2e-3 at a
  // projection; gpu::gemm_bf16). The runners keep the split unless TANDEM_GEMM_SINGLE=1.
  bool prefill_gemm_split = true;
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
  // Online re-placement of routed experts during decode (runtime/engine/expert_swap.h; hybrid only): needs
  // host_experts to hold every expert of the layers that have host experts (HostExperts::holds).
  ReplaceSetup replace;
};

// Since the last reset(): decode's routed-expert activations served by each side (prompts are not
// counted: gpu / cpu say where the placement serves decode); streamed_layers / streamed_bytes count
// streamed prefill's copies of host experts to the GPU.
struct ExpertCounts {
  uint64_t gpu = 0, cpu = 0;
  uint64_t streamed_layers = 0, streamed_bytes = 0;
  uint64_t swaps = 0;  // online re-placement: experts moved to the GPU (each displacing one)
  // Decode's host side, layer by layer: time the host waited for the GPU's router result (the GPU's
  // part of the layer plus the handoff's latency), time it ran its experts (deferred ones included), and
  // how many layer handoffs.
  uint64_t host_wait_ns = 0, host_run_ns = 0, host_layers = 0;
  // GpuOptions::link_experts: host-resident experts the GPU computed, reading them over PCIe (not in cpu).
  uint64_t link = 0;
};

class Qwen35MoeGpu {
 public:
  // Uploads `model` (which must outlive this object). Throws tandem::Error: no CUDA device, budget too small.
  static std::unique_ptr<Qwen35MoeGpu> create(const Qwen35Moe& model, const GpuOptions& opts);
  ~Qwen35MoeGpu();

  const GpuMemoryPlan& memory() const;
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
  // longer than the context.
  bool forward_top(std::span<const int32_t> ids, std::span<const gpu::Penalty> penalties, int k,
                   std::vector<std::pair<int32_t, float>>& top);
  bool cuda_graph_active() const;
  // GpuOptions::programmatic_launch asked for and the device takes it (compute capability >= 9.0).
  bool programmatic_launch_active() const;
  int host_prefetch_active() const;      // GpuOptions::host_prefetch in effect (0: off)
  int link_experts_active() const;       // GpuOptions::link_experts in effect (0: off)
  int link_stage_active() const;         // GpuOptions::link_stage in effect (0: off)
  const std::string& link_note() const;  // why link_experts is off when it was asked for
  bool graph_cut_at_handoffs() const;  // hybrid: the step's graphs are cut where the host takes over
  bool graph_one_step() const;         // hybrid: one graph a step, the host handoffs inside it
  bool handoff_fused() const;          // ... and folded into the router's and the next norm's launches
  int64_t l2_prefetch_active() const;  // ... and GpuOptions::l2_prefetch_bytes as resolved (0: off)
  // Online re-placement (GpuOptions::replace): where the routed experts are now ([layer][expert], 1 =
  // served by the GPU; empty without host experts); settle_replacement() waits for the moves in
  // flight and completes them (tests, and before reading the placement); pause_replacement stops or
  // resumes new checks.
  const std::vector<std::vector<uint8_t>>& expert_placement() const;
  void settle_replacement();
  void pause_replacement(bool paused);
  // Streamed prefill (GpuOptions::stream_prefill_min_tokens): from how many prompt tokens it is used
  // (0: off), and why it is off when it was asked for and cannot be.
  int64_t stream_prefill_min_tokens() const;
  const std::string& stream_prefill_note() const;
  // Like Qwen35Moe::forward: ids at the current position; logits to host memory, all rows or the last.
  void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows = Qwen35Moe::LogitRows::All);

  struct Impl;

 private:
  explicit Qwen35MoeGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
