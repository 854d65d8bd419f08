// cpu_experts/qmatmul.h: y = W · a for a PackedMatrix W and a few activation rows, one implementation
// per ISA (scalar ref, AVX2, AVX-512 VNNI, AMX). Decode (1-8 rows) streams W once; more rows reuse each
// weight tile from L1/L2 (AMX tiles for 16+ rows).
//
// Contract: for i < a.nrows and output rows n = 16*t0 + j, j < 16*(t1 - t0):
//   y[i * ldy + j] = sum_k W[n, k] * a_i[k],  a_i = activation row a.rows[i].
// Whole tiles are written (padded rows give 0); ldy >= 16 * (t1 - t0).
//
// Arithmetic (the ref defines it; every ISA reproduces it bit for bit, AMX-BF16 excepted):
//  - int4 / int8: a_i is quantized per group by quantize_rows (act_ops.h) with W's group size, padded
//    columns and col_perm, in 8-bit (q) or 16-bit (q = lo, q_hi = hi: v = 255 hi + lo) precision.
//    Per row n and group g (zero = 8 for symmetric int4, zero[g,n] for asymmetric, 128 for int8):
//      8-bit:  c = sum_k code[n,k] * q_i[k] - zero * sum_i[g]
//      16-bit: c = 255 * (sum_k code[n,k] * hi_i[k] - zero * sum_hi_i[g])
//                    + (sum_k code[n,k] * lo_i[k] - zero * sum_i[g])
//    (each half one u8 x s8 VNNI / AMX product; c is exact, in int32), then
//    s = f32(scale_f16[g,n]) * scale_i[g] (fp32), acc = fma(float(c), s, acc) over g = 0, 1, ...
//    from acc = 0. float(c) rounds to nearest even when |c| >= 2^24 (16-bit mode only).
//  - bf16: a_i is fp32 (cols_padded long, zero padded); acc = fma(W[n,k], a_i[k], acc) for
//    k = 0, 1, ... from acc = 0 (sequential: each SIMD lane is one output row).
//  - AMX-BF16 rounds activations to bf16 and sums pairs inside the tile unit: relative error
//    ~2^-9 per product; tests hold it to a derived bound instead of bit equality.
//
// Threading: none inside; callers split tile ranges across threads. Limits: group sizes are
// multiples of 8 (int4) / 4 (int8); group sums stay within int32 (cols_padded < 2^16). 16-bit mode:
// |c| <= group_size * max|code - zero| * 32512 < 2^31 needs group_size <= 4096 (int4, |code - zero|
// <= 15) or 512 (int8, <= 127); act16_group_ok() says whether a matrix qualifies (the MoE forward
// falls back to 8-bit for one that does not).
#pragma once

#include <cstdint>

#include "cpu_experts/act_ops.h"
#include "cpu_experts/packed_weight.h"

namespace tandem::cpu {

struct ActRows {
  QuantActs q;               // int formats
  const float* f = nullptr;  // bf16 format: fp32 rows
  int64_t f_stride = 0;
  const int32_t* rows = nullptr;  // indices of the rows to use
  int64_t nrows = 0;
};

constexpr int64_t kMaxAct16GroupInt4 = 4096, kMaxAct16GroupInt8 = 512;
inline bool act16_group_ok(const PackedMatrix& w) {
  return w.group_size <= (w.format == WeightFormat::Int4 ? kMaxAct16GroupInt4 : kMaxAct16GroupInt8);
}

using MatmulFn = void (*)(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy);

#define TANDEM_DECLARE_MATMULS(ns)                                                                        \
  namespace ns {                                                                                          \
  void matmul_int4(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy); \
  void matmul_int8(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy); \
  void matmul_bf16(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy); \
  }
TANDEM_DECLARE_MATMULS(ref)
TANDEM_DECLARE_MATMULS(avx2)
TANDEM_DECLARE_MATMULS(avx512)
TANDEM_DECLARE_MATMULS(amx)
TANDEM_DECLARE_MATMULS(amx_emu)  // the AMX kernels on a scalar tile emulator (tests only)
#undef TANDEM_DECLARE_MATMULS

}  // namespace tandem::cpu
