// core/weights.h: a weight matrix as the checkpoint stores it, and the exact reference matmul.
//
// A LinearWeight is a view (no copy) into a memory-mapped checkpoint, [out, in] in nn.Linear terms:
//  - Dense: row-major [out, in] in BF16, F16 or F32 (possibly a slice of a fused 3-D expert tensor);
//  - Gptq: 4-bit GPTQ as stored by AutoGPTQ/GPTQModel: qweight int32 [in/8, out] (nibble j of word r
//    is input row 8r+j, j=0 least significant), qzeros int32 [groups, out/8] (nibble j of word c is
//    column 8c+j), scales [groups, out] (F16/BF16/F32), g_idx int32 [in] (group of each input row,
//    any permutation under act-order; absent means k / group_size).
//    W[n, k] = scale[g, n] * (q(k, n) - Z(g, n)), g = g_idx[k]; Z = stored (v2), or for v1 the nibble
//    of (word + 0x11111111) mod 2^32 as GPTQModel reads it (gptq_zero_point).
// dequant_row() rebuilds one output row in float32 exactly; linear_ref() is the reference matmul built
// on it (fp32 accumulation, OpenMP over output rows). Hot paths in cpu_experts/ and gpu_core/ use
// repacked copies instead; this is the definition they are compared against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tandem {

struct GptqView {
  const int32_t* qweight = nullptr;
  const int32_t* qzeros = nullptr;
  const void* scales = nullptr;
  DType scales_dtype = DType::F16;
  const int32_t* g_idx = nullptr;  // nullptr: g = k / group_size
  int64_t group_size = 0;
  int64_t num_groups = 0;
  int zero_offset = 1;  // 1: v1 ("gptq"), 0: v2 ("gptq_v2"); read by gptq_zero_point
};

struct LinearWeight {
  enum class Kind : uint8_t { None, Dense, Gptq };
  Kind kind = Kind::None;
  std::string name;  // module name, for messages
  int64_t out = 0, in = 0;
  const void* dense = nullptr;  // Dense: element [n, k] at n * in + k
  DType dense_dtype = DType::BF16;
  GptqView gptq;

  bool empty() const { return kind == Kind::None; }
  // Row n of W (length `in`), exactly, as float32.
  void dequant_row(int64_t n, float* row) const;
  // Bytes the weight occupies in the checkpoint (for size reports).
  uint64_t stored_bytes() const;
};

// One MoE layer's matrices as the checkpoint stores them (views, like LinearWeight): what the expert
// kernels (cpu_experts/) repack and the models walk.
struct MoeWeights {
  LinearWeight router;                       // [E, H]
  std::vector<LinearWeight> gate, up, down;  // per routed expert
  LinearWeight shared_gate, shared_up, shared_down;
  LinearWeight shared_expert_gate;           // [1, H]
};

float dot_f32(const float* a, const float* b, int64_t n);

// y[t, n] = sum_k W[n, k] * x[t, k] for t < tokens; x is [tokens, in], y is [tokens, out], fp32.
void linear_ref(const LinearWeight& w, const float* x, int64_t tokens, float* y);

}  // namespace tandem
