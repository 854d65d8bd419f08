// cpu_experts/act_ops.h: activation-side ops of the expert path (quantize rows to int8, SwiGLU), one
// implementation per ISA. The scalar `ref` versions define the arithmetic; the others must produce
// bit-identical results (same IEEE operations in the same order), which the tests check.
//
// quantize_rows (for int4/int8 weights): row r of the output reads x + src_row(r) * ldx, gathers
// column k' from perm[k'] (identity when perm is null) for k' < cols and uses 0 for
// cols <= k' < cols_padded. Two precisions, chosen by the output (out.q_hi null or not):
//  - 8-bit: per group of `group_size` columns: amax = max |x|, scale = amax / 127, inv = 127 / amax
//    (0 when amax == 0), q = clamp(nearbyint(x * inv), -127, 127) (round half to even, fp32 product),
//    sum = sum of q (int32, used to compensate weight zero points).
//  - 16-bit (out.q_hi set): the same with kAct16Max = 32512 in place of 127: scale = amax / 32512,
//    inv = 32512 / amax, v = clamp(nearbyint(x * inv), -32512, 32512); then v = 255 * hi + lo with
//    hi = the integer nearest v / 255 (never a tie: 255 is odd) and lo = v - 255 * hi, so hi and lo
//    both lie in -127..127 (32512 = 127 * 255 + 127). q holds lo, q_hi holds hi, sum = sum of lo,
//    sum_hi = sum of hi. Each half is a valid s8 VNNI / AMX operand, and -128 never occurs, so the
//    AVX2 sign trick (qmatmul_avx2.cpp) stays exact. Base 255 rather than 256 for that reason: with
//    base 256 the low half must take all 256 residues, -128 included. Rounding step amax / 32512
//    (2^8 = 256x finer than 8-bit).
// Output row r: q[r * q_stride + k] (and q_hi[...]), scale[r * g_stride + g], sum[...] (sum_hi[...]).
//
// swiglu: h[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp_poly(-v)), exp_poly defined below
// (Cody-Waite reduction + degree-7 Taylor polynomial evaluated with fma; ~2 ulp over the clamped range).
//
// Threading: plain functions, no state; callers split rows across threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tandem::cpu {

constexpr int32_t kAct8Max = 127;
constexpr int32_t kAct16Max = 32512;  // 127 * 255 + 127: largest |v| whose halves fit in -127..127
constexpr int32_t kAct16Base = 255;

enum class ActPrecision : uint8_t { Int8, Int16 };  // activation quantization of the int formats
const char* act_precision_name(ActPrecision p);     // "int8", "int16"

struct QuantActs {
  int8_t* q = nullptr;  // 8-bit: the codes; 16-bit: the low halves
  float* scale = nullptr;
  int32_t* sum = nullptr;
  int64_t q_stride = 0, g_stride = 0;
  int8_t* q_hi = nullptr;  // 16-bit only (same strides as q / sum); null selects 8-bit
  int32_t* sum_hi = nullptr;
  bool wide() const { return q_hi != nullptr; }
};

// The 16-bit split of act_ops.h's contract (integer form; every ISA computes the same values).
inline int32_t act16_hi(int32_t v) { return (v + (v >= 0 ? 127 : -127)) / kAct16Base; }

using QuantizeRowsFn = void (*)(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows,
                                const int32_t* perm, int64_t cols, int64_t cols_padded, int64_t group_size,
                                const QuantActs& out);
using SwigluFn = void (*)(const float* g, const float* u, float* h, int64_t n);

// exp_poly: the exponential every SwiGLU implementation uses (vector versions repeat these steps).
namespace expc {
// Above ~88.4 the result overflows to +inf on purpose (2^128), so silu(v) -> -0 for very negative v.
constexpr float kLo = -87.0f, kHi = 89.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 split so that n * kLn2Hi is exact
constexpr float kLn2Lo = 1.42860682030941723212e-6f;
constexpr float kC[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};
}  // namespace expc

inline float exp_poly(float x) {
  x = std::fmin(std::fmax(x, expc::kLo), expc::kHi);
  const float n = std::nearbyint(x * expc::kLog2e);
  float r = std::fma(n, -expc::kLn2Hi, x);
  r = std::fma(n, -expc::kLn2Lo, r);
  float p = expc::kC[7];
  for (int i = 6; i >= 0; --i) p = std::fma(p, r, expc::kC[i]);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return p * two_n;
}

namespace ref {
void quantize_rows(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows, const int32_t* perm,
                   int64_t cols, int64_t cols_padded, int64_t group_size, const QuantActs& out);
void swiglu(const float* g, const float* u, float* h, int64_t n);
}  // namespace ref
namespace avx2 {
void quantize_rows(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows, const int32_t* perm,
                   int64_t cols, int64_t cols_padded, int64_t group_size, const QuantActs& out);
void swiglu(const float* g, const float* u, float* h, int64_t n);
}  // namespace avx2
namespace avx512 {
void quantize_rows(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows, const int32_t* perm,
                   int64_t cols, int64_t cols_padded, int64_t group_size, const QuantActs& out);
void swiglu(const float* g, const float* u, float* h, int64_t n);
}  // namespace avx512

}  // namespace tandem::cpu
