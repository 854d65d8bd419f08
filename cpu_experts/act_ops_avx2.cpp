// AVX2 + FMA versions of cpu_experts/act_ops.h, bit-identical to the scalar reference (8 lanes,
// masked tails through a zero-padded bounce, gathers for act-order permutations).
#include <immintrin.h>

#include "cpu_experts/act_ops.h"
#include "cpu_experts/target.h"

namespace tandem::cpu::avx2 {

namespace {

TANDEM_TARGET_AVX2 inline __m256i lane_mask(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int v = n >= 8 ? 8 : n < 0 ? 0 : static_cast<int>(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), idx);
}

// Columns k .. k+7 of a row (gathered through perm; zero at and beyond `cols` and `end`).
TANDEM_TARGET_AVX2 inline __m256 load_cols(const float* xr, const int32_t* perm, int64_t k, int64_t cols,
                                           int64_t end) {
  const int64_t lim = cols < end ? cols : end;
  const __m256i m = lane_mask(lim - k);
  if (lim - k <= 0) return _mm256_setzero_ps();
  if (perm) {
    const __m256i idx = _mm256_maskload_epi32(perm + k, m);
    return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), xr, idx, _mm256_castsi256_ps(m), 4);
  }
  return _mm256_maskload_ps(xr + k, m);
}

TANDEM_TARGET_AVX2 inline __m256 exp_poly8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(expc::kLo)), _mm256_set1_ps(expc::kHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(expc::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-expc::kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-expc::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(expc::kC[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(expc::kC[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

TANDEM_TARGET_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

TANDEM_TARGET_AVX2 inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The first n of 8 int32 lanes (already in int8 range) as int8: pack to 16 then 8 bits, fix the order.
TANDEM_TARGET_AVX2 inline void store_i8(__m256i v, int8_t* dst, int64_t n) {
  const __m256i w16 = _mm256_packs_epi32(v, v);
  const __m256i w8 = _mm256_packs_epi16(w16, w16);
  const __m128i bytes = _mm_unpacklo_epi32(_mm256_castsi256_si128(w8), _mm256_extracti128_si256(w8, 1));
  alignas(16) int8_t tmp[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp), bytes);
  for (int64_t j = 0; j < n; ++j) dst[j] = tmp[j];
}

TANDEM_TARGET_AVX2 void quantize_rows_impl(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows,
                                           const int32_t* perm, int64_t cols, int64_t cols_padded, int64_t gs,
                                           const QuantActs& out) {
  const int64_t groups = cols_padded / gs;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + (src_rows ? src_rows[r] : r) * ldx;
    int8_t* q = out.q + r * out.q_stride;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * gs, k1 = k0 + gs;
      __m256 mx = _mm256_setzero_ps();
      for (int64_t k = k0; k < k1; k += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(load_cols(xr, perm, k, cols, k1), abs_mask));
      const float amax = hmax(mx);
      const int32_t qmax = out.wide() ? kAct16Max : kAct8Max;
      const float fmax = static_cast<float>(qmax);
      const float inv = amax > 0.0f ? fmax / amax : 0.0f;
      const __m256 vinv = _mm256_set1_ps(inv);
      __m256i sum = _mm256_setzero_si256(), sum_hi = _mm256_setzero_si256();
      for (int64_t k = k0; k < k1; k += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(load_cols(xr, perm, k, cols, k1), vinv));
        v = _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(-qmax)), _mm256_set1_epi32(qmax));
        v = _mm256_and_si256(v, lane_mask(k1 - k));
        const int64_t n = k1 - k < 8 ? k1 - k : 8;
        if (out.wide()) {
          // Nearest integer to v / 255 through fp32 (exact here; see act_ops_avx512.cpp).
          const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(1.0f / kAct16Base)));
          v = _mm256_sub_epi32(v, _mm256_mullo_epi32(hi, _mm256_set1_epi32(kAct16Base)));
          store_i8(hi, out.q_hi + r * out.q_stride + k, n);
          sum_hi = _mm256_add_epi32(sum_hi, hi);
        }
        sum = _mm256_add_epi32(sum, v);
        store_i8(v, q + k, n);
      }
      out.scale[r * out.g_stride + g] = amax / fmax;
      if (out.wide()) out.sum_hi[r * out.g_stride + g] = hsum(sum_hi);
      out.sum[r * out.g_stride + g] = hsum(sum);
    }
  }
}

TANDEM_TARGET_AVX2 void swiglu_impl(const float* g, const float* u, float* h, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = lane_mask(n - i);
    const __m256 gv = _mm256_maskload_ps(g + i, m), uv = _mm256_maskload_ps(u + i, m);
    const __m256 e = exp_poly8(_mm256_xor_ps(gv, sign));
    const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_maskstore_ps(h + i, m, _mm256_mul_ps(silu, uv));
  }
}

}  // namespace

void quantize_rows(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows, const int32_t* perm,
                   int64_t cols, int64_t cols_padded, int64_t group_size, const QuantActs& out) {
  quantize_rows_impl(x, ldx, src_rows, rows, perm, cols, cols_padded, group_size, out);
}

void swiglu(const float* g, const float* u, float* h, int64_t n) { swiglu_impl(g, u, h, n); }

}  // namespace tandem::cpu::avx2
