// runtime/runner.h: one sequence of a model on a placement (--device ref | cpu | gpu), behind one
// interface so that logits, generate, chat and bench share the device handling.
//
//  ref: Qwen35Moe::forward with the exact reference matmuls.
//  cpu: the same forward with CpuBackend (cpu_experts kernels at the runtime-chosen ISA).
//  gpu: Qwen35MoeGpu (everything on one GPU; only where the build has CUDA and a device exists).
// Errors (unknown device, no GPU, budget too small) are tandem::Error with the reason.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "runtime/models/qwen3_5_moe.h"

namespace tandem {

struct RunnerOptions {
  std::string device = "ref";
  int threads = 0;                       // cpu: worker threads (0: physical cores)
  std::string cpu_expert_format = "bf16";  // cpu: bf16 | int8 for BF16 checkpoints' experts
  uint64_t gpu_mem = 0;                  // gpu: budget in bytes (0: free device memory)
  int64_t context = 4096;                // gpu: KV cache length
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual void reset() = 0;  // a new, empty sequence
  // Feeds ids at the current position; logits [ids, vocab] (All) or [vocab] (Last) to host memory.
  virtual void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows) = 0;
  virtual std::string describe() const = 0;  // one line: placement, ISA / GPU memory
  virtual uint64_t peak_device_bytes() const { return 0; }
  // Measured bandwidth of the memory the weights stream from (host DRAM read, or GPU copy), and
  // what it is called: the denominator of the decode bound.
  virtual double weight_bandwidth(std::string* what) = 0;
};

std::unique_ptr<Runner> make_runner(const Qwen35Moe& model, const RunnerOptions& opts);

}  // namespace tandem
