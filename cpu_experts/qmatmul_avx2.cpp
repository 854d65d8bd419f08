// AVX2 + FMA kernels for cpu_experts/qmatmul.h (any x86-64 since Haswell). A 16-row tile is two ymm
// halves of 8 rows. No VNNI here: u8 x s8 products go through vpmaddubsw + vpmaddwd. For int4 the
// pair sums stay far below int16 saturation (2 * 15 * 127); int8 codes are turned back into signed
// weights (code ^ 0x80) and multiplied with the sign trick (|w| * sign(x, w), at most 2 * 127 * 127),
// which yields sum (code - 128) * q exactly: the same integer the reference forms (activations never
// hold -128, whose sign flip would wrap: 8-bit codes and both 16-bit halves lie in -127..127).
// 16-bit activations run each weight vector against both halves (up to 2 rows per pass).
#include <immintrin.h>

#include "cpu_experts/qmatmul.h"
#include "cpu_experts/target.h"

namespace tandem::cpu::avx2 {

namespace {

constexpr int kMaxRows = 4;

struct RowPtrs {
  const int8_t* q[kMaxRows];
  const float* s[kMaxRows];
  const int32_t* sum[kMaxRows];
  const float* f[kMaxRows];
};

TANDEM_TARGET_AVX2 inline __m256i bcast_i32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

TANDEM_TARGET_AVX2 inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// KIND 0: int4 symmetric, 1: int4 with zeros, 2: int8. WIDE (16-bit activations): NQ = 2 NR int8
// streams, p.q[i] the low and p.q[NR + i] the high halves of row i, joined as 255 hi + lo per group.
template <int NR, int KIND, bool WIDE>
TANDEM_TARGET_AVX2 void int_tile(const uint8_t* w, const uint16_t* sc, const uint8_t* zp, int64_t groups, int64_t gs,
                                 const RowPtrs& p, float* y, int64_t ldy) {
  constexpr int NQ = WIDE ? 2 * NR : NR;
  __m256 acc[NR][2];
  for (int i = 0; i < NR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < groups; ++g) {
    __m256i dot[NQ][2];
    for (int i = 0; i < NQ; ++i) dot[i][0] = dot[i][1] = _mm256_setzero_si256();
    const int64_t k0 = g * gs;
    if constexpr (KIND != 2) {
      for (int64_t k = k0; k < k0 + gs; k += 8, w += 64) {
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
        const __m256i lo0 = _mm256_and_si256(v0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low4);
        const __m256i lo1 = _mm256_and_si256(v1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low4);
        for (int i = 0; i < NQ; ++i) {
          const __m256i xl = bcast_i32(p.q[i] + k), xh = bcast_i32(p.q[i] + k + 4);
          dot[i][0] = _mm256_add_epi32(dot[i][0], _mm256_add_epi32(dot_u8s8(lo0, xl), dot_u8s8(hi0, xh)));
          dot[i][1] = _mm256_add_epi32(dot[i][1], _mm256_add_epi32(dot_u8s8(lo1, xl), dot_u8s8(hi1, xh)));
        }
      }
    } else {
      for (int64_t k = k0; k < k0 + gs; k += 4, w += 64) {
        const __m256i s0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), flip);
        const __m256i s1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32)), flip);
        const __m256i a0 = _mm256_abs_epi8(s0), a1 = _mm256_abs_epi8(s1);
        for (int i = 0; i < NQ; ++i) {
          const __m256i x = bcast_i32(p.q[i] + k);
          dot[i][0] = _mm256_add_epi32(dot[i][0], dot_u8s8(a0, _mm256_sign_epi8(x, s0)));
          dot[i][1] = _mm256_add_epi32(dot[i][1], dot_u8s8(a1, _mm256_sign_epi8(x, s1)));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 ws =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + g * kTileRows + 8 * h)));
      __m256i zero = _mm256_set1_epi32(8);
      if constexpr (KIND == 1)
        zero = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zp + g * kTileRows + 8 * h)));
      for (int i = 0; i < NR; ++i) {
        __m256i c = dot[i][h];
        if constexpr (KIND != 2) c = _mm256_sub_epi32(c, _mm256_mullo_epi32(zero, _mm256_set1_epi32(p.sum[i][g])));
        if constexpr (WIDE) {
          __m256i ch = dot[NR + i][h];
          if constexpr (KIND != 2) ch = _mm256_sub_epi32(ch, _mm256_mullo_epi32(zero, _mm256_set1_epi32(p.sum[NR + i][g])));
          c = _mm256_add_epi32(c, _mm256_mullo_epi32(ch, _mm256_set1_epi32(kAct16Base)));
        }
        const __m256 s = _mm256_mul_ps(ws, _mm256_set1_ps(p.s[i][g]));
        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), s, acc[i][h]);
      }
    }
  }
  for (int i = 0; i < NR; ++i) {
    _mm256_storeu_ps(y + i * ldy, acc[i][0]);
    _mm256_storeu_ps(y + i * ldy + 8, acc[i][1]);
  }
}

template <int NR>
TANDEM_TARGET_AVX2 void bf16_tile(const uint8_t* w, int64_t pairs, const RowPtrs& p, float* y, int64_t ldy) {
  __m256 acc[NR][2];
  for (int i = 0; i < NR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t q = 0; q < pairs; ++q, w += 64) {
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * h));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
      for (int i = 0; i < NR; ++i) {
        acc[i][h] = _mm256_fmadd_ps(even, _mm256_set1_ps(p.f[i][2 * q]), acc[i][h]);
        acc[i][h] = _mm256_fmadd_ps(odd, _mm256_set1_ps(p.f[i][2 * q + 1]), acc[i][h]);
      }
    }
  }
  for (int i = 0; i < NR; ++i) {
    _mm256_storeu_ps(y + i * ldy, acc[i][0]);
    _mm256_storeu_ps(y + i * ldy + 8, acc[i][1]);
  }
}

void fill_rows(const ActRows& a, int64_t i0, int nr, RowPtrs& p) {
  for (int i = 0; i < nr; ++i) {
    const int64_t row = a.rows[i0 + i];
    if (a.f) {
      p.f[i] = a.f + row * a.f_stride;
    } else {
      p.q[i] = a.q.q + row * a.q.q_stride;
      p.s[i] = a.q.scale + row * a.q.g_stride;
      p.sum[i] = a.q.sum + row * a.q.g_stride;
      if (a.q.wide()) {  // high halves as streams nr .. 2nr-1
        p.q[nr + i] = a.q.q_hi + row * a.q.q_stride;
        p.sum[nr + i] = a.q.sum_hi + row * a.q.g_stride;
      }
    }
  }
}

template <int KIND>
void matmul_int(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, const uint16_t*, const uint8_t*, int64_t, int64_t, const RowPtrs&, float*,
                      int64_t);
  static constexpr Fn kFns[kMaxRows] = {int_tile<1, KIND, false>, int_tile<2, KIND, false>, int_tile<3, KIND, false>,
                                        int_tile<4, KIND, false>};
  static constexpr Fn kWide[kMaxRows / 2] = {int_tile<1, KIND, true>, int_tile<2, KIND, true>};
  const bool wide = a.q.wide();
  const int64_t max_rows = wide ? kMaxRows / 2 : kMaxRows;
  const int64_t tile_scales = w.groups * kTileRows;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t i0 = 0; i0 < a.nrows; i0 += max_rows) {
      const int nr = static_cast<int>(a.nrows - i0 < max_rows ? a.nrows - i0 : max_rows);
      RowPtrs p;
      fill_rows(a, i0, nr, p);
      (wide ? kWide : kFns)[nr - 1](w.w + t * w.tile_bytes, w.scales + t * tile_scales,
                                    w.zeros ? w.zeros + t * tile_scales : nullptr, w.groups, w.group_size, p,
                                    y + i0 * ldy + (t - t0) * kTileRows, ldy);
    }
}

}  // namespace

void matmul_int4(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  if (w.zeros) matmul_int<1>(w, t0, t1, a, y, ldy);
  else matmul_int<0>(w, t0, t1, a, y, ldy);
}

void matmul_int8(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  matmul_int<2>(w, t0, t1, a, y, ldy);
}

void matmul_bf16(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, int64_t, const RowPtrs&, float*, int64_t);
  static constexpr Fn kFns[kMaxRows] = {bf16_tile<1>, bf16_tile<2>, bf16_tile<3>, bf16_tile<4>};
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t i0 = 0; i0 < a.nrows; i0 += kMaxRows) {
      const int nr = static_cast<int>(a.nrows - i0 < kMaxRows ? a.nrows - i0 : kMaxRows);
      RowPtrs p;
      fill_rows(a, i0, nr, p);
      kFns[nr - 1](w.w + t * w.tile_bytes, w.cols_padded / 2, p, y + i0 * ldy + (t - t0) * kTileRows, ldy);
    }
}

}  // namespace tandem::cpu::avx2
