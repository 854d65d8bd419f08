// AVX-512 versions of cpu_experts/act_ops.h, bit-identical to the scalar reference: the same fp32
// products, round-half-even conversions and fma steps, 16 lanes at a time (masked tails, gathers
// for act-order permutations).
#include <immintrin.h>

#include "cpu_experts/act_ops.h"
#include "cpu_experts/target.h"

namespace tandem::cpu::avx512 {

namespace {

// Columns k .. k+15 of a row (gathered through perm; zero at and beyond `cols` and `end`).
TANDEM_TARGET_AVX512 inline __m512 load_cols(const float* xr, const int32_t* perm, int64_t k, int64_t cols,
                                             int64_t end) {
  const int64_t lim = cols < end ? cols : end;
  const int64_t n = lim - k;
  const __mmask16 m = n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
  if (perm) {
    const __m512i idx = _mm512_maskz_loadu_epi32(m, perm + k);
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, xr, 4);
  }
  return _mm512_maskz_loadu_ps(m, xr + k);
}

TANDEM_TARGET_AVX512 inline __m512 exp_poly16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(expc::kLo)), _mm512_set1_ps(expc::kHi));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(expc::kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-expc::kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-expc::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(expc::kC[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(expc::kC[i]));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// Horizontal max / sum by in-register shuffles (GCC 12's _mm512_reduce_* trip -Wmaybe-uninitialized).
TANDEM_TARGET_AVX512 inline float hmax(__m512 m) {
  m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0x4e));
  m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0xb1));
  m = _mm512_max_ps(m, _mm512_permute_ps(m, 0x4e));
  m = _mm512_max_ps(m, _mm512_permute_ps(m, 0xb1));
  return _mm512_cvtss_f32(m);
}

TANDEM_TARGET_AVX512 inline int32_t hsum(__m512i v) {
  v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, 0x4e));
  v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, 0xb1));
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
  return _mm512_cvtsi512_si32(v);
}

TANDEM_TARGET_AVX512 void quantize_rows_impl(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows,
                                             const int32_t* perm, int64_t cols, int64_t cols_padded, int64_t gs,
                                             const QuantActs& out) {
  const int64_t groups = cols_padded / gs;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + (src_rows ? src_rows[r] : r) * ldx;
    int8_t* q = out.q + r * out.q_stride;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * gs, k1 = k0 + gs;
      __m512 mx = _mm512_setzero_ps();
      for (int64_t k = k0; k < k1; k += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(load_cols(xr, perm, k, cols, k1), abs_mask));
      const float amax = hmax(mx);
      const int32_t qmax = out.wide() ? kAct16Max : kAct8Max;
      const float fmax = static_cast<float>(qmax);
      const float inv = amax > 0.0f ? fmax / amax : 0.0f;
      const __m512 vinv = _mm512_set1_ps(inv);
      __m512i sum = _mm512_setzero_si512(), sum_hi = _mm512_setzero_si512();
      for (int64_t k = k0; k < k1; k += 16) {
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(load_cols(xr, perm, k, cols, k1), vinv));
        v = _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(-qmax)), _mm512_set1_epi32(qmax));
        const int64_t n = k1 - k;
        const __mmask16 m = n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
        v = _mm512_maskz_mov_epi32(m, v);
        if (out.wide()) {
          // hi = nearest integer to v / 255: |v| <= 32512, so v * fl(1/255) is within 2e-5 of v / 255,
          // which is at least 1/510 away from a half-integer: the fp32 rounding gives act16_hi(v).
          const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(1.0f / kAct16Base)));
          v = _mm512_sub_epi32(v, _mm512_mullo_epi32(hi, _mm512_set1_epi32(kAct16Base)));
          _mm512_mask_cvtepi32_storeu_epi8(out.q_hi + r * out.q_stride + k, m, hi);
          sum_hi = _mm512_add_epi32(sum_hi, hi);
        }
        _mm512_mask_cvtepi32_storeu_epi8(q + k, m, v);
        sum = _mm512_add_epi32(sum, v);
      }
      out.scale[r * out.g_stride + g] = amax / fmax;
      if (out.wide()) out.sum_hi[r * out.g_stride + g] = hsum(sum_hi);
      out.sum[r * out.g_stride + g] = hsum(sum);
    }
  }
}

TANDEM_TARGET_AVX512 void swiglu_impl(const float* g, const float* u, float* h, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
    const __m512 e = exp_poly16(_mm512_xor_ps(gv, _mm512_set1_ps(-0.0f)));
    const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(silu, uv));
  }
}

}  // namespace

void quantize_rows(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows, const int32_t* perm,
                   int64_t cols, int64_t cols_padded, int64_t group_size, const QuantActs& out) {
  quantize_rows_impl(x, ldx, src_rows, rows, perm, cols, cols_padded, group_size, out);
}

void swiglu(const float* g, const float* u, float* h, int64_t n) { swiglu_impl(g, u, h, n); }

}  // namespace tandem::cpu::avx512
