// gpu_core/moe.cuh: the routed experts of one MoE layer for decode (1..8 tokens), int4 GPTQ experts.
//
// Two launches, both reading expert ids and routing weights from device memory (so the step can be
// captured in a CUDA graph after the router kernel):
//   gate/up: h[p, i] = fp16( silu(gate_e[i] . x_t) * (up_e[i] . x_t) )   p = t*k + j, e = ids[p]
//   down:    out[t, n] = sum_j weight[p] * (down_e[n] . h[p])              (overwrites out)
// Each selected expert's weights are streamed exactly once per token. Experts are Int4Views in the
// int4_layout.h form without an act-order permutation (act-order experts go through gemv_int4 one
// matrix at a time). Arithmetic as gemv_int4, plus the fp16 rounding of h: ~2e-3 relative.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_core/gemv.cuh"

namespace tandem::gpu {

struct Int4Expert {
  Int4View gate, up;  // [I, H]
  Int4View down;      // [H, I]
};

// experts: device array [num_experts]; ids int32 [T*k]; weights fp32 [T*k]; x_half fp16 [T, H];
// h_scratch fp16 [T*k, I]; out fp32 [T, H]. All experts share H, I and group_size.
cudaError_t moe_int4_decode(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                            const float* weights, int T, int k, const uint16_t* x_half, uint16_t* h_scratch, float* out,
                            cudaStream_t stream);

}  // namespace tandem::gpu
