// cpu_experts/cpu_moe.h: routed experts of Qwen3.5-MoE layers in host memory, and the MoE forward
// over them (§3.5 of the spec: out += sum_k w_k * down_e(silu(gate_e(x)) * up_e(x))).
//
// CpuExpertStore holds repacked copies (packed_weight.h) of any set of (layer, expert): the runtime
// picks which experts live on the CPU. Formats: int4 from GPTQ (lossless), int8 (per-group symmetric,
// from BF16 or GPTQ), bf16. Expert id == num routed experts (moe.gate.size()) is the shared expert,
// so a caller can run it here too by passing that id with weight sigmoid(shared_expert_gate(x)).
// Memory: one huge-page chunk per layer; mappings() lists them (the hybrid page-locks them for DMA).
//
// cpu_moe_forward(x [T, H] fp32, ids/weights [T, k]) ACCUMULATES into out [T, H] fp32 (the caller
// zeroes it, or adds GPU-side experts / the shared expert into the same buffer). ids < 0 are skipped
// (experts the GPU handles). Activations of int formats are quantized per group in the store's
// precision (options().act: 16-bit by default, 8-bit on request; act_ops.h), for decode and prefill
// alike. Per call: x is quantized once per group size (int formats); then
//   phase 1: tasks (expert, block of 64 intermediate rows): gate and up over the block with the
//            activations hot in L1, SwiGLU; the task that writes the last rows of a down-input group
//            re-quantizes that group (atomic countdown per group);
//   phase 2: tasks (block of 32 output rows): every selected expert's down rows for that block
//            (the next expert's block prefetched meanwhile), scaled by the routing weight, added to
//            out in ascending expert order.
// Decode with 8 experts gives 64 + 64 equal tasks, enough to keep 16 cores streaming.
// Each selected expert's weights are streamed exactly once; results do not depend on the number of
// threads. One call at a time per workspace and pool.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "cpu_experts/isa.h"
#include "cpu_experts/packed_weight.h"
#include "cpu_experts/thread_pool.h"
#include "core/weights.h"

namespace tandem::cpu {

struct ExpertWeights {
  PackedMatrix gate, up, down;  // gate/up rows in down's input order (act-order folded in)
  int64_t hidden = 0, inter = 0;
  uint64_t stream_bytes() const { return gate.stream_bytes() + up.stream_bytes() + down.stream_bytes(); }
};

struct CpuExpertStoreOptions {
  WeightFormat format = WeightFormat::Int4;        // target format
  WeightFormat dense_format = WeightFormat::Int8;  // used for dense sources when format is Int4
  int64_t int8_group_size = 128;                   // 32, 64 or 128
  // Activation quantization for int4/int8 experts (x and the re-quantized h): 16-bit (default; two
  // int8 halves, act_ops.h) or 8-bit (half the integer work, ~256x the rounding error). Matrices whose
  // group size exceeds qmatmul.h's 16-bit limit use 8-bit.
  ActPrecision act = ActPrecision::Int16;
  // Intermediate rows of gate and up per phase-1 task of cpu_moe_forward (a multiple of 16; also the
  // unit of the NUMA split). 32: a decode layer of 3, 5 or 8 experts at the 35B shape (512 rows each)
  // gives 48, 80 or 128 tasks, whole rounds for 16 threads (64 left 8 of 16 threads idle for the
  // last task of 3 or 5 experts, as expert deferral splits a layer).
  int64_t up_block_rows = 32;
};

class CpuExpertStore {
 public:
  explicit CpuExpertStore(CpuExpertStoreOptions opt = {});
  ~CpuExpertStore();

  // Repacks `experts` of `layer` (every routed expert when empty; id moe.gate.size() = shared
  // expert). With a pool, experts are repacked in parallel, and on a multi-node machine each node's
  // share of every matrix's row blocks (the blocks cpu_moe_forward hands that node's workers) is
  // bound to that node's memory. Throws tandem::Error on bad shapes/ids.
  void add_layer(int layer, const MoeWeights& moe, std::span<const int> experts = {}, ThreadPool* pool = nullptr);
  // One expert from its three matrices (custom loaders, tests, benchmarks).
  void add_expert(int layer, int expert, const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down);

  const ExpertWeights* find(int layer, int expert) const;
  size_t size() const { return entries_.size(); }
  uint64_t stream_bytes() const;
  std::string description() const;  // formats, expert count, bytes, huge-page share
  const CpuExpertStoreOptions& options() const { return opt_; }
  std::vector<std::pair<void*, size_t>> mappings() const { return arena_->mappings(); }

 private:
  WeightFormat format_for(const LinearWeight& w) const;
  ExpertWeights pack_expert(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down);
  size_t expert_bytes(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down) const;
  void insert(int layer, int expert, ExpertWeights w);
  void bind_by_node(const ExpertWeights& e, const ThreadPool& pool);

  CpuExpertStoreOptions opt_;
  std::unique_ptr<HostArena> arena_;
  std::deque<ExpertWeights> entries_;
  std::unordered_map<int64_t, size_t> index_;
  uint64_t node_bound_bytes_ = 0;  // weight bytes bound to their NUMA node
};

// Scratch reused across calls (grows to the largest call; no allocation in steady state).
class CpuMoeWorkspace {
 public:
  CpuMoeWorkspace();
  ~CpuMoeWorkspace();
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// Activations in the store's precision (options().act).
void cpu_moe_forward(const CpuExpertStore& store, int layer, const float* x, int64_t T, const int32_t* ids,
                     const float* weights, int k, float* out, ThreadPool& pool, CpuMoeWorkspace& ws,
                     const CpuKernels& kernels = default_cpu_kernels());
// The same with the activation precision chosen per call (benchmarks, comparisons).
void cpu_moe_forward(const CpuExpertStore& store, int layer, const float* x, int64_t T, const int32_t* ids,
                     const float* weights, int k, float* out, ThreadPool& pool, CpuMoeWorkspace& ws,
                     const CpuKernels& kernels, ActPrecision act);

}  // namespace tandem::cpu
