// gpu_core/gemv.cuh: batch-1..8 matrix-vector products for decode, the memory-bound heart of it.
//
// Contract (both kernels): y[t * N + n] = sum_k W[n, k] * x[t, k] for t < T, fp32 output, fp32
// accumulation; device pointers; launched on `stream`; return the launch status (never synchronize).
//
// gemv_bf16: W bf16 row-major [N, K] (nn.Linear layout, as in the checkpoint), K % 8 == 0, rows
//   16-byte aligned; x fp32 [T, K]. One token: exact fp32 products, fp32 sums; 2..8 tokens: tensor
//   cores on x split in two bf16 parts (as gemm_bf16), the weights read once for all of them, each
//   token's outputs independent of the other tokens. Both ~1e-6 relative to the fp32 reference.
//
// gemv_int4: W in the Int4Layout of gpu_core/int4_layout.h (GPTQ repacked once at load: rows
//   contiguous, act-order permutation folded into the input order, nibbles ordered for half2
//   unpacking); x is fp16 [T, K] already in that permuted order (gather_x_half prepares it).
//   K % 8 == 0, group_size % 8 == 0.
//   (q - z) is formed exactly in fp16, multiplied by fp16 x and summed in fp16 over 8 inputs, then
//   scaled and accumulated in fp32: relative error ~1e-3 against the dequantize-then-fp32 reference
//   (the fp16 rounding of x dominates).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/row_format.h"
#include "gpu_core/workspace_sizes.h"

namespace tandem::gpu {

struct HostPost;  // handoff.cuh

// Where a GEMV's T x N outputs go. One part: y [T, N]. A stacked matrix (the rows of several
// projections that read one input, back to back) has up to kMaxParts: rows [end[s - 1], end[s]) (end[-1]
// = 0) go to dst[s] as [T, end[s] - end[s - 1]], so one launch over T tokens writes what a launch per
// member would. The last part's end is N.
struct RowsOut {
  static constexpr int kMaxParts = 4;
  float* dst[kMaxParts] = {};
  int64_t end[kMaxParts] = {};
  int parts = 0;
  static RowsOut one(float* y, int64_t N) {
    RowsOut o;
    o.dst[0] = y, o.end[0] = N, o.parts = 1;
    return o;
  }
#if defined(__CUDACC__)
  // Constant indices only (the loop unrolled): an index into the parameter's arrays that the compiler
  // can't resolve copies the struct to a stack frame in every thread (5% of a decode step on the H100).
  __device__ __forceinline__ float* at(int t, int64_t row) const {
    float* d = dst[0];
    int64_t begin = 0, stop = end[0];
#pragma unroll
    for (int s = 1; s < kMaxParts; ++s)
      if (s < parts && row >= end[s - 1]) d = dst[s], begin = end[s - 1], stop = end[s];
    return d + t * (stop - begin) + (row - begin);
  }
#endif
};
// Whether out is a valid layout of N rows (1..kMaxParts parts, increasing ends, the last N, no null dst).
bool rows_out_fits(const RowsOut& out, int64_t N);

// early_next (one token): the kernel after this one is a grid of a few small blocks, so each block lets it
// launch as soon as it is past its wait (pdl.cuh) rather than past its loads; with several waves of
// blocks the last wave's start then launches it, and it waits resident (its own loads done) for this
// one to end. Without it a many-block kernel lets the next launch only once every block is past its
// loads, so that big successors do not take SM slots from later waves.
cudaError_t gemv_bf16(const uint16_t* W, int64_t N, int64_t K, const float* x, int T, float* y, cudaStream_t stream, bool early_next = false);
cudaError_t gemv_bf16(const uint16_t* W, int64_t N, int64_t K, const float* x, int T, const RowsOut& y, cudaStream_t stream,
                      bool early_next = false);

// gemv_rows8 (W8A16, rows8_layout.h): y [T, N] = x [T, K] W^T for W 8-bit codes [N, K] (int8 or FP8
// E4M3) with a scale per row, T <= kMaxGemvTokens, K % 16 == 0, rows 16-byte aligned, the weights read
// once for all T tokens: one token, one warp a row, each code converted exactly to fp32, products and sums
// in fp32; several (T = 2..8), on tensor cores with the codes exactly as bf16 and split-bf16 activations
// (gemv_bf16's several-token form): exact products, fp32 sums. The row's scale is applied once to each
// sum: ~1e-6 relative to the dequantized weights' fp64 product either way, and a token's outputs do not
// depend on the launch's other tokens.
struct Rows8View {
  const uint8_t* codes = nullptr;  // [N][K], each row in rows8_layout.h's order (rows8_position)
  const float* scales = nullptr;   // [N]
  int64_t N = 0, K = 0;
  RowFormat format = RowFormat::Int8;  // Int8 or Fp8
};
// early_next: as gemv_bf16's (one token).
cudaError_t gemv_rows8(const Rows8View& W, const float* x, int T, float* y, cudaStream_t stream, bool early_next = false);
cudaError_t gemv_rows8(const Rows8View& W, const float* x, int T, const RowsOut& y, cudaStream_t stream, bool early_next = false);
// gemv_rows8 of silu(g) * u (g, u fp32 [T, K]), formed as the input is read: silu_mul(g, u) then
// gemv_rows8(g), bit for bit, in one launch and without writing g (the shared expert's down projection).
cudaError_t gemv_rows8_swiglu(const Rows8View& W, const float* g, const float* u, int T, float* y, cudaStream_t stream);
// The decode router of one token in one launch: the norm before it, h += a (+ sigmoid(gate[0]) *
// shared) when a is given, as add_rmsnorm_zc (else h is only read, as rmsnorm_zc), x = the normalised
// row (norm_w, eps), written for the kernels after it; y = W x as gemv_bf16 computes it into y's parts
// (RowsOut), whose first E outputs, in the first part, are router logits, and router_topk (ops.cuh) of
// them done by the launch's last block. Every output bit for bit as the norm launch + gemv_bf16 +
// router_topk: each block normalises the row itself, with the norm kernel's arithmetic, while its first
// weights load. One token; K <= 4096.
// counter: a device word, zero before the first launch and left zero after each (launches sharing one
// must be stream-ordered). With post (handoff.cuh) the last block also posts x, ids and weights to the
// host as host_post would after the launch. With qx.parts (K a multiple of 32) the blocks also write x
// quantised for moe_int4_decode_wide between them (workspace_sizes.h's QuantX). With w8 (K inputs too)
// the launch also computes w8's 8-bit rows from the same x, as gemv_rows8 computes them, into y's rows N
// .. N + w8->N (the 8-bit shared expert's gate and up, so that they need no launch of their own).
cudaError_t gemv_bf16_router_topk_norm(const uint16_t* W, int64_t N, int64_t K, float* h, const float* a, const float* shared,
                                       const float* gate, const float* norm_w, float eps, float* x, const RowsOut& y, int E, int k,
                                       unsigned* counter, int32_t* ids, float* weights, cudaStream_t stream,
                                       const HostPost* post = nullptr, QuantX qx = {}, const Rows8View* w8 = nullptr);
// gemv_bf16 of silu(g) * u (g, u fp32 [T, K]), the SwiGLU product formed as the input is read: the
// same numbers as silu_mul(g, u) then gemv_bf16(g), bit for bit, in one launch and without writing g.
cudaError_t gemv_bf16_swiglu(const uint16_t* W, int64_t N, int64_t K, const float* g, const float* u, int T, float* y,
                             cudaStream_t stream);

struct Int4View {
  const uint32_t* qweight = nullptr;  // [N][K/8]
  const uint16_t* scales = nullptr;   // fp16 [N][G]
  const uint8_t* zeros = nullptr;     // [N][G], the actual zero point (0..16)
  int64_t N = 0, K = 0, group_size = 0;
  const int32_t* perm = nullptr;      // act-order input order [K] (int4_layout.h), nullptr: identity
};

cudaError_t gemv_int4(const Int4View& W, const uint16_t* x_half, int T, float* y, cudaStream_t stream);

// x_half[t, k'] = fp16(x[t, perm[k']]) (perm == nullptr: identity).
cudaError_t gather_x_half(const float* x, const int32_t* perm, int64_t K, int T, uint16_t* x_half, cudaStream_t stream);

}  // namespace tandem::gpu
