// runtime/models/qwen3_5_moe/hybrid_dispatch.h: the hybrid dispatcher, the one unit that splits a step
// between the GPU and the routed experts in host memory, and the contract between the two sides.
//
// Who computes what, per MoE layer: the GPU computes the router and its top-k, the experts it holds,
// the shared expert and (experts.link) the first `link` of each token's host experts, reading their
// weights in place over PCIe; the host computes the other host experts (HostExperts::run: the
// cpu_experts kernels on the pinned worker pool), except that with deferral (experts.deferral N)
// each token's N lowest-weight host experts are run while the GPU computes the next layer and join
// the residual there. The GPU model's enqueue (gpu.cpp) launches the GPU's part; this class is the
// host's part and owns everything the two sides share.
//
// The handoff protocol (decode, a whole step captured as one CUDA graph; gpu_core/handoff.cuh):
//   Shared memory: page-locked host memory mapped into the device (cudaHostAllocMapped; with unified
//   addressing the host pointer is the device's): x [H] fp32, ids [k] int32, w [k] fp32 (GPU -> host),
//   sum [H] fp32 (host -> GPU), deferred [2][H] fp32 (host -> GPU, layer L in row L % 2), and flags:
//     flags[kPosted]   = L + 1  GPU: layer L's x, ids and w are in place (written by the router GEMV's
//                               last block, or host_post after an int4 router, behind a
//                               __threadfence_system() that orders the data before the flag);
//     flags[kReleased] = L + 1  host: layer L's sum is in place (a release fence orders it before the
//                               flag); the GPU's wait (host_wait_add, or the next norm's launch,
//                               host_wait_add_rmsnorm_zc) spins on it and reads sum in place;
//     flags[kGaveUp]   = L + 1  GPU: a wait for layer L passed kHandoffTimeoutNs (60 s): the step fails;
//     flags[kDeferred] = L + 1  host, with deferral: layer L's deferred sum is in its row.
//   The host zeroes the flags before each launch (the previous step has synchronized) and reads what a
//   flag guards after an acquire fence. One x / ids / w / sum serves every layer: the GPU posts layer
//   L + 1 only after its wait for layer L's sum returned, and the host writes layer L's sum only after
//   it read layer L's x. The deferred rows alternate because the GPU may still read row L % 2 while the
//   host fills layer L + 1's.
//   Failure: when the host side throws, it sets kReleased and kDeferred to ~0 (every wait in the graph
//   passes), drains the stream and rethrows; a GPU that never posts fails the step after 60 s.
// Eager steps (--eager, --trace, the embedding table in host memory) and prefill chunks use the same
// buffers through copies and an event: post_copy() queues x / ids / w to the host and records the
// event, serve() waits for it and runs the host's part, join_copy() queues the sum back and adds it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_core/handoff.cuh"
#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem {

// Routed experts that live in host memory (hybrid placement): the dispatcher hands each MoE layer's
// normalised hidden state and its top-k choice to this object and adds what it returns.
class HostExperts {
 public:
  virtual ~HostExperts() = default;
  // out [T, H] = per token t, sum over j with ids[t*k + j] >= 0 of weights[t*k + j] * expert(x_t); ids of
  // GPU experts are -1. T is 1 in decode, up to the prefill chunk in batched prefill.
  virtual void run(int layer, const float* x, int64_t T, const int32_t* ids, const float* weights, int k, float* out) = 0;

  // For streamed prefill and the link: where a layer's host-resident int4 experts lie, as one byte
  // range (page-locked for DMA where the host could lock it) and each expert's matrices in the tile
  // layout (gpu_core/int4_layout.h) as offsets into it. Gate and up rows come in down's input order
  // (act order folded in), so down's inputs need no permutation and only gate / up carry one. false
  // (with `why`) when the layer cannot be streamed (another format, padded shapes).
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
  virtual std::string describe() const { return {}; }
};

// The host experts of a plan on the cpu_experts kernels: every routed expert expert_on_gpu leaves off
// the GPU, repacked into `format` (int4 | int8 | bf16; floating-point weights asked as int4 become
// int8), placed on its NUMA node, page-locked for DMA (hybrid_cpu.cpp). mtp_head: the MTP head's
// experts too, all of them, as layer num_layers (GpuOptions::mtp_host_experts).
std::unique_ptr<HostExperts> make_cpu_experts(const Qwen35Moe& model, const std::vector<std::vector<uint8_t>>& expert_on_gpu,
                                              const std::string& format, int threads, bool mtp_head = false);

// Since the last reset(): decode's routed-expert activations served by each side (prompts are not
// counted: gpu / cpu say where the placement serves decode); streamed_layers / streamed_bytes count
// streamed prefill's copies of host experts to the GPU.
struct ExpertCounts {
  uint64_t gpu = 0, cpu = 0;
  uint64_t streamed_layers = 0, streamed_bytes = 0;
  // Decode's host side, layer by layer: time the host waited for the GPU's router result (the GPU's
  // part of the layer plus the handoff's latency), time it ran its experts (deferred ones included), and
  // how many layer handoffs.
  uint64_t host_wait_ns = 0, host_run_ns = 0, host_layers = 0;
  // experts.link: host-resident experts the GPU computed, reading them over PCIe (not in cpu).
  uint64_t link = 0;
};

// How long a kernel waiting inside a hybrid step's graph waits for the host before giving up.
constexpr int64_t kHandoffTimeoutNs = 60'000'000'000;

class HybridDispatch {
 public:
  enum Flag : int { kPosted = 0, kReleased = 1, kGaveUp = 2, kDeferred = 3, kFlags = 4 };
  // Which pass hands tokens over: decode steps are counted (ExpertCounts), prompt chunks not; a batched
  // step (several sequences' tokens) is counted, and the GPU takes no link experts in it.
  enum class Pass { decode, prefill, batch };
  struct Setup {
    int64_t hidden = 0;
    int layers = 0;             // the model's (layer `layers`: the MTP head's, its experts all on the host when it hands over)
    int k = 0;                  // experts per token
    int64_t rows = 1;           // tokens handed over at once (a prefill chunk, else 1)
    int defer = 0;              // experts.deferral: each token's N lowest-weight host experts a layer late
    HostExperts* host = nullptr;
    const std::vector<std::vector<uint8_t>>* expert_on_gpu = nullptr;  // [layer][expert]
    ExpertCounts* counts = nullptr;
  };
  HybridDispatch() = default;
  ~HybridDispatch();
  HybridDispatch(const HybridDispatch&) = delete;
  HybridDispatch& operator=(const HybridDispatch&) = delete;

  // The host buffers (mapped); `graph`: the decode step is one graph, so the flags (and with deferral
  // the deferred rows) too.
  void init(const Setup& s, bool graph);
  // experts.link: of each token's host experts in the layers marked, the first m are the GPU's.
  void set_link(std::vector<uint8_t> layers, int m);
  bool deferring() const { return s_.defer > 0 && s_.host; }
  void reset();  // a new sequence: nothing deferred

  // ---- the graph step ----
  // Where layer L's router result goes, and the sum the GPU waits for (its flags).
  gpu::HostPost post(int layer) const;
  gpu::HostSum sum(int layer) const;
  // The deferred sum of layer `from` added to h once the host has posted it (enqueued in the graph).
  void join_deferred_posted(int from, float* h, cudaStream_t stream) const;
  const float* x() const { return hx_; }
  // Launches the step's graph and serves each layer in `layers` (those with host experts, in order)
  // as the protocol above says; returns once the stream has drained.
  void serve_graph(cudaGraphExec_t graph, cudaStream_t stream, const std::vector<int>& layers);

  // ---- eager steps and prefill chunks ----
  // x [n, H], ids / w [n, k] to the host buffers, then the event.
  void post_copy(const float* x_dev, const int32_t* ids_dev, const float* w_dev, int64_t n, cudaStream_t stream);
  // Waits for the event, runs the host's part of layer li and queues its sum into moe_dev (through
  // cpu_dev); nothing is queued when no host expert was picked.
  void serve_copy(size_t li, int64_t n, float* cpu_dev, float* moe_dev, cudaStream_t stream, Pass pass);
  // Deferral outside the graph: the previous layer's deferred experts run now (their sum queued into
  // def_dev), and added to h_dev with this layer's MoE output.
  void run_deferred(float* def_dev, cudaStream_t stream);
  void add_deferred(float* h_dev, const float* def_dev, cudaStream_t stream);

 private:
  // The host's part of layer li for n tokens once its inputs are in hx_ / hids_ / hw_: who serves which
  // expert, the deferred ones set aside, the rest run into hout_. Returns whether any ran (hout_ left
  // alone when none did, unless `always`: then zeros, as the graph adds it either way).
  bool host_part(size_t li, int64_t n, bool always, Pass pass);
  void deferred_sum(float* out, int64_t rows);  // the pending deferred experts' sum (zeros when none)
  // past the model's layers: the MTP head's, which hands over only when its experts are all on the host
  bool on_gpu(size_t layer, int64_t e) const {
    if (layer >= static_cast<size_t>(s_.layers)) return false;
    return !s_.expert_on_gpu || s_.expert_on_gpu->empty() || (*s_.expert_on_gpu)[layer][e];
  }

  Setup s_;
  float *hx_ = nullptr, *hw_ = nullptr, *hout_ = nullptr;
  int32_t* hids_ = nullptr;
  unsigned* flags_ = nullptr;      // mapped, kFlags (graph steps)
  float* deferred_rows_ = nullptr;  // mapped, [2][H] (graph steps with deferral)
  std::vector<int32_t> masked_;    // the host's experts of the tokens handed over, -1 elsewhere
  cudaEvent_t routed_ = nullptr;   // post_copy's
  std::vector<uint8_t> link_layers_;
  int link_m_ = 0;
  struct Deferred {
    bool pending = false;  // host work of `layer` not run yet
    bool ready = false;    // its sum is queued into def_dev: add it with this layer's MoE output
    int layer = -1;
    int64_t n = 0;
    bool decode = false;   // set aside by a decode step (its run counts in ExpertCounts::host_run_ns)
    std::vector<float> x, w;
    std::vector<int32_t> ids;  // the deferred (token, slot) pairs' experts, -1 elsewhere
  } def_;
  std::vector<int> order_;  // scratch: a token's slots by ascending weight
  float* hdef_ = nullptr;   // pinned: a deferred sum on its way to def_dev (eager / prefill)
  cudaEvent_t def_copied_ = nullptr;
};

}  // namespace tandem
