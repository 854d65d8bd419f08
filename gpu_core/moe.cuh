// gpu_core/moe.cuh: the routed experts of one MoE layer for decode (1..8 tokens), int4 GPTQ experts.
//
// Two launches, both reading expert ids and routing weights from device memory (so the step can be
// captured in a CUDA graph after the router kernel):
//   gate/up: h[p, i] = fp16( silu(gate_e[i] . x_t) * (up_e[i] . x_t) )   p = t*k + j, e = ids[p]
//   down:    out[t, n] = sum_j weight[p] * (down_e[n] . h[p])              (overwrites out)
// Each selected expert's weights are streamed exactly once per token. Experts are Int4Views in the
// int4_layout.h form; act-order experts (perm set) have their input gathered into shared memory in
// the permuted order first. Arithmetic as gemv_int4, plus the fp16 rounding of h: ~2e-3 relative.
// An expert whose pointers are null is not resident on the GPU (hybrid placement): it contributes
// nothing here, and the host adds its share.
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

// The same for bf16 experts (the official BF16 checkpoint's fused layout gives per-expert row
// pointers): fp32 activations, exact products, fp32 sums; h kept in fp32. x fp32 [T, H],
// h_scratch fp32 [T*k, I].
struct Bf16Expert {
  const uint16_t* gate = nullptr;  // [I, H]
  const uint16_t* up = nullptr;    // [I, H]
  const uint16_t* down = nullptr;  // [H, I]
};

cudaError_t moe_bf16_decode(const Bf16Expert* experts, int64_t H, int64_t I, const int32_t* ids, const float* weights,
                            int T, int k, const float* x, float* h_scratch, float* out, cudaStream_t stream);

}  // namespace tandem::gpu
