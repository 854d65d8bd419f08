// runtime/models/qwen3_5_moe_gpu.h: the Qwen3.5-MoE forward with every tensor on one GPU.
//
// Same layer walk as Qwen35Moe::forward (the definition), with the gpu_core kernels: bf16 GEMV for
// dense projections (F16/F32 checkpoint tensors are stored as bf16), int4 GEMV / fused MoE for GPTQ
// experts (repacked once at upload), bf16 fused MoE for BF16 experts, the fused DeltaNet and gated
// attention decode kernels, bf16 KV cache. Tokens go through one at a time (a prompt is a sequence
// of decode steps: exact, not yet fast; the chunked prefill kernels come next).
//
// Memory: everything is planned first and taken from one device allocation; when the plan exceeds
// the budget (--gpu-mem, default the free device memory) the error lists what needs how much.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/models/qwen3_5_moe.h"

namespace tandem {

struct GpuMemoryPlan {
  uint64_t dense_weights = 0, expert_weights = 0, kv_cache = 0, deltanet_state = 0, workspace = 0;
  uint64_t total() const { return dense_weights + expert_weights + kv_cache + deltanet_state + workspace; }
  std::string describe() const;  // "dense weights 1.2 GiB, experts ..., KV cache ..., ..."
};

struct GpuOptions {
  uint64_t budget_bytes = 0;  // 0: what the device has free
  int64_t max_context = 4096;
};

class Qwen35MoeGpu {
 public:
  // Uploads `model` (which must outlive this object). Throws tandem::Error: no CUDA device, budget too small.
  static std::unique_ptr<Qwen35MoeGpu> create(const Qwen35Moe& model, const GpuOptions& opts);
  ~Qwen35MoeGpu();

  const GpuMemoryPlan& memory() const;
  // Device copy bandwidth (read + write bytes of a 256 MiB device-to-device copy), measured now.
  double copy_bandwidth() const;
  void reset();  // start a new sequence
  // Like Qwen35Moe::forward: ids at the current position; logits to host memory, all rows or the last.
  void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows = Qwen35Moe::LogitRows::All);

  struct Impl;

 private:
  explicit Qwen35MoeGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
