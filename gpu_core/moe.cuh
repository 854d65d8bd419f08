// gpu_core/moe.cuh: the routed experts of one MoE layer, int4 GPTQ experts for decode (1..8 tokens) and
// prefill (a chunk, grouped by expert), bf16 experts for 1..8 tokens.
//
// Decode: two launches, both reading expert ids and routing weights from device memory (so the step
// can be captured in a CUDA graph after the router kernel):
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

#include "gpu_core/workspace_sizes.h"

#include "gpu_core/gemv.cuh"

namespace tandem::gpu {

struct Int4Expert {
  Int4View gate, up;  // [I, H]
  Int4View down;      // [H, I]
};

// Two kernels compute it. moe_int4_decode_wide (gpu_core/moe_int4_wide.cu) where the shapes fit it
// (Qwen3.5's do); moe_int4_decode (gpu_core/moe_int4.cu) for every other shape (the small test
// fixtures': H 48, groups of 16) and for act-order experts.
//
// moe_int4_decode: one 4-byte code word a lane at a time. experts: device array [num_experts]; ids
// int32 [T*k]; weights fp32 [T*k]; x_half fp16 [T, H] (gather_x_half); h_scratch fp16 [T*k, I]; out
// fp32 [T, H]. All experts share H, I and group_size.
cudaError_t moe_int4_decode(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                            const float* weights, int T, int k, const uint16_t* x_half, uint16_t* h_scratch, float* out,
                            cudaStream_t stream);

// moe_int4_decode_wide: the same sums from integer dot products, 16-byte weight loads. x fp32 [T, H]
// and each (token, expert) pair's h are quantised per 32-input vector to two int8 parts (about 1.5e-5
// of the vector's largest value; moe_int4_wide.cu), the codes' products with them summed exactly in
// int32 (dp4a), scaled in fp32: within ~5e-5 of the exact layer (moe_int4_decode's fp16 activations:
// ~7e-4). A token's arithmetic does not depend on T or on the other tokens. Three launches (x
// quantised; gate/up with h quantised; down); x_quantised: the kernel that wrote x also wrote it
// quantised into the workspace (wide_moe_x), and the first launch is left out. workspace:
// moe_int4_wide_workspace(T, k, H, I) bytes (workspace_sizes.h). Needs moe_int4_decode_wide_fits (no act order; H and I multiples of 32,
// group_size 32 times a power of two, H <= 4096, I <= 2048, k <= 8); returns cudaErrorInvalidValue
// otherwise. sm_80+ (warp reductions).
//
// shared (w or w8.codes set; one token): the launch of down also computes the shared expert's down
// projection, out [H] = (silu(g) * u) [in] W^T for W bf16 [H, in] (in % 8 == 0, in <= 1024) or int8
// rows w8 [H, in] (in % 16 == 0), in blocks scheduled before the routed ones, each row as
// gemv_bf16_swiglu / gemv_rows8_swiglu computes it (the same bits), so that the shared expert needs no
// launch or stream of its own. g and u must be written before this call (they are read
// before down's wait for gate/up: pdl.cuh). One token only: at 8, rows computed token after token
// in this form made the step 2-3% slower than the tensor-core GEMV beside the experts
// (bench/results/2026-12-07-stop58-h100.md).
struct SharedDown {
  const uint16_t* w = nullptr;
  Rows8View w8;  // instead of w: int8 rows (codes set)
  int64_t in = 0;
  const float* g = nullptr;
  const float* u = nullptr;
  float* out = nullptr;
};
bool moe_int4_decode_wide_fits(int64_t H, int64_t I, int64_t group_size, int k, bool act_order);
// Whether the down launch takes a shared expert's down of `in` inputs (SharedDown::in).
bool shared_down_fits(int64_t in);
cudaError_t moe_int4_decode_wide(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                 const float* weights, int T, int k, const float* x, bool x_quantised, void* workspace, float* out,
                                 cudaStream_t stream, const SharedDown& shared = {});

// Prefill: the routed experts of n tokens grouped by expert, so each resident expert's weights are
// streamed once per 32 of its tokens instead of once per token (a 256-token chunk at top-8 of 256 reads
// every expert about once instead of ~8 times). All on the device, no host synchronisation:
//   1. the n*k (token, slot) pairs are sorted by expert (stable) into work items of up to 32 pairs;
//   2. each pair's token row is gathered to fp16 in its expert's gate / up input order;
//   3. gate/up per (item, row block) -> h [pair, I] fp16; 4. down per (item, row block) -> weight * y [pair, H];
//   5. out[t] = sum over j of its pairs' y (j = 0..k-1, the decode order).
// The products on tensor cores: per expert, tiles of 32 pairs x 64 output rows as fp16 matrix
// products with fp32 accumulation, the weights dequantised to fp16 ((q - z) * s, one rounding) on the
// way into shared memory, each stage's loads in flight during the previous stage's products (two
// shared buffers). Not the per-pair arithmetic of the decode kernels: within ~1e-3 of them, 5e-3 of
// the exact reference. Non-resident experts (null pointers) contribute nothing, as in decode. x fp32
// [n, H]; ids int32 [n*k] (ids outside 0..E-1 are skipped); out fp32 [n, H] (overwritten). sm_70+.
// Its workspace: moe_int4_grouped_workspace (workspace_sizes.h).
cudaError_t moe_int4_grouped_tc(const Int4Expert* experts, int E, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                const float* weights, int n, int k, const float* x, void* workspace, float* out, cudaStream_t stream);

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
