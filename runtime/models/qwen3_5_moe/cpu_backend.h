// runtime/models/qwen3_5_moe/cpu_backend.h: the fast CPU placement (--device cpu): the model's matrix products on the
// cpu_experts kernels at the ISA chosen in cpu_experts/isa.h.
//
// At construction every dense projection is repacked once into the kernels' bf16 layout (exact
// products with fp32 activations) and every routed expert into a CpuExpertStore: GPTQ experts as
// int4 (lossless), BF16/F16 experts as bf16 (exact) or, on request, int8 per group (half the bytes;
// the official BF16 checkpoint can run with int8 CPU experts); int experts see 16-bit activations
// (cpu_moe.h) unless 8-bit is asked for. linear() splits a matrix's 16-row tiles over the worker pool; routed_experts() is
// cpu_moe_forward. The rest of the layer walk stays the model's own.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_experts/cpu_moe.h"
#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem {

struct CpuBackendOptions {
  int threads = 0;                                   // 0: physical cores
  cpu::WeightFormat dense_expert_format = cpu::WeightFormat::BF16;  // for BF16/F16 experts (int8 on request)
  cpu::ActPrecision expert_act = cpu::ActPrecision::Int16;           // int expert activations
  bool mtp = false;                                  // pack the MTP head too (speculative decoding)
};

class CpuBackend final : public MatmulBackend {
 public:
  CpuBackend(const Qwen35Moe& model, const CpuBackendOptions& opts);
  ~CpuBackend() override;

  void linear(const LinearWeight& w, const float* x, int64_t T, float* y) override;
  void routed_experts(int layer, const float* x, int64_t T, const int32_t* ids, const float* weights, int k,
                      float* out) override;
  std::string describe() const;  // ISA, threads, expert formats and bytes

 private:
  cpu::ThreadPool pool_;
  cpu::HostArena arena_;
  const cpu::CpuKernels& kernels_;
  cpu::MatmulFn dense_matmul_ = nullptr;  // bf16 kernel for the dense projections (dense_matmul_for)
  std::unordered_map<const void*, cpu::PackedMatrix> dense_;  // keyed by the LinearWeight's data
  cpu::CpuExpertStore experts_;
  cpu::CpuMoeWorkspace moe_ws_;
  int64_t hidden_ = 0;
  std::vector<float> padded_, out_tiles_;
  std::vector<int32_t> rows_;
};

}  // namespace tandem
