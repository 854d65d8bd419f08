// AVX-512 VNNI kernels for cpu_experts/qmatmul.h. One zmm lane = one output row of a 16-row tile, so
// no horizontal sums: int4/int8 codes go through vpdpbusd against broadcast int8 activation quads,
// bf16 pairs are widened to fp32 and accumulated with one sequential fma chain per lane (bit-identical
// to the scalar reference). Up to 8 activation rows (4 with 16-bit activations: each is two int8
// streams, lo and hi) share one pass over a tile (decode streams W once).
#include <immintrin.h>

#include "cpu_experts/qmatmul.h"
#include "cpu_experts/target.h"

namespace tandem::cpu::avx512 {

namespace {

constexpr int kMaxRows = 8;

// Software prefetch distance: single streams reach ~1.5x the bandwidth with it on Zen 4 (the
// hardware prefetchers alone keep too few lines in flight). Never past the end of the call's tiles.
#ifndef TANDEM_PREFETCH_BYTES
#define TANDEM_PREFETCH_BYTES 2048
#endif
constexpr int64_t kPrefetch = TANDEM_PREFETCH_BYTES;

TANDEM_TARGET_AVX512 inline void prefetch(const uint8_t* p, const uint8_t* lim) {
  if (p + kPrefetch < lim) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
}

struct RowPtrs {
  const int8_t* q[kMaxRows];
  const float* s[kMaxRows];
  const int32_t* sum[kMaxRows];
  const float* f[kMaxRows];
};

TANDEM_TARGET_AVX512 inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// KIND 0: int4 symmetric, 1: int4 with zeros, 2: int8 (zero 128). vpdpbusd has a 4-5 cycle latency,
// so with few rows each row's group sum is split over several accumulators (CH chains; integer adds,
// so the split changes nothing in the result) to keep the loads flowing.
// WIDE (16-bit activations): NQ = 2 NR int8 streams, p.q[i] the low halves and p.q[NR + i] the high
// halves of row i; each weight vector meets both, and the epilogue joins them as 255 hi + lo.
template <int NR, int KIND, bool WIDE>
TANDEM_TARGET_AVX512 void int_tile(const uint8_t* w, const uint16_t* sc, const uint8_t* zp, int64_t groups,
                                   int64_t gs, const RowPtrs& p, float* y, int64_t ldy, const uint8_t* lim) {
  constexpr int NQ = WIDE ? 2 * NR : NR;
  constexpr int CH = NQ <= 4 ? 4 : 2;
  __m512 acc[NR];
  for (int i = 0; i < NR; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dot[CH][NQ];
    for (int c = 0; c < CH; ++c)
      for (int i = 0; i < NQ; ++i) dot[c][i] = _mm512_setzero_si512();
    const int64_t k0 = g * gs, k1 = k0 + gs;
    int64_t k = k0;
    if constexpr (KIND != 2) {
      // CH/2 octets per step: chain 2j takes octet j's low nibbles, chain 2j+1 its high nibbles.
      constexpr int step = 8 * (CH / 2);
      for (; k + step <= k1; k += step, w += 64 * (CH / 2)) {
        for (int j = 0; j < CH / 2; ++j) prefetch(w + 64 * j, lim);
        for (int j = 0; j < CH / 2; ++j) {
          const __m512i v = _mm512_loadu_si512(w + 64 * j);
          const __m512i lo = _mm512_and_si512(v, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
          for (int i = 0; i < NQ; ++i) {
            dot[2 * j][i] = _mm512_dpbusd_epi32(dot[2 * j][i], lo, _mm512_set1_epi32(load_i32(p.q[i] + k + 8 * j)));
            dot[2 * j + 1][i] =
                _mm512_dpbusd_epi32(dot[2 * j + 1][i], hi, _mm512_set1_epi32(load_i32(p.q[i] + k + 8 * j + 4)));
          }
        }
      }
      for (; k < k1; k += 8, w += 64) {
        const __m512i v = _mm512_loadu_si512(w);
        const __m512i lo = _mm512_and_si512(v, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int i = 0; i < NQ; ++i) {
          dot[0][i] = _mm512_dpbusd_epi32(dot[0][i], lo, _mm512_set1_epi32(load_i32(p.q[i] + k)));
          dot[1][i] = _mm512_dpbusd_epi32(dot[1][i], hi, _mm512_set1_epi32(load_i32(p.q[i] + k + 4)));
        }
      }
    } else {
      for (; k + 4 * CH <= k1; k += 4 * CH, w += 64 * CH)
        for (int j = 0; j < CH; ++j) {
          prefetch(w + 64 * j, lim);
          const __m512i v = _mm512_loadu_si512(w + 64 * j);
          for (int i = 0; i < NQ; ++i)
            dot[j][i] = _mm512_dpbusd_epi32(dot[j][i], v, _mm512_set1_epi32(load_i32(p.q[i] + k + 4 * j)));
        }
      for (; k < k1; k += 4, w += 64) {
        const __m512i v = _mm512_loadu_si512(w);
        for (int i = 0; i < NQ; ++i) dot[0][i] = _mm512_dpbusd_epi32(dot[0][i], v, _mm512_set1_epi32(load_i32(p.q[i] + k)));
      }
    }
    const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + g * kTileRows)));
    __m512i zero;
    if constexpr (KIND == 1)
      zero = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zp + g * kTileRows)));
    else
      zero = _mm512_set1_epi32(KIND == 0 ? 8 : 128);
    for (int i = 0; i < NR; ++i) {
      __m512i d = dot[0][i];
      for (int c = 1; c < CH; ++c) d = _mm512_add_epi32(d, dot[c][i]);
      __m512i c = _mm512_sub_epi32(d, _mm512_mullo_epi32(zero, _mm512_set1_epi32(p.sum[i][g])));
      if constexpr (WIDE) {
        __m512i dh = dot[0][NR + i];
        for (int ch = 1; ch < CH; ++ch) dh = _mm512_add_epi32(dh, dot[ch][NR + i]);
        dh = _mm512_sub_epi32(dh, _mm512_mullo_epi32(zero, _mm512_set1_epi32(p.sum[NR + i][g])));
        c = _mm512_add_epi32(c, _mm512_mullo_epi32(dh, _mm512_set1_epi32(kAct16Base)));
      }
      const __m512 s = _mm512_mul_ps(ws, _mm512_set1_ps(p.s[i][g]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), s, acc[i]);
    }
  }
  for (int i = 0; i < NR; ++i) _mm512_storeu_ps(y + i * ldy, acc[i]);
}

// NT tiles side by side (independent fma chains when few rows), NR activation rows.
template <int NR, int NT>
TANDEM_TARGET_AVX512 void bf16_tiles(const uint8_t* w, int64_t tile_bytes, int64_t pairs, const RowPtrs& p, float* y,
                                     int64_t ldy, const uint8_t* lim) {
  __m512 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < NR; ++i) acc[t][i] = _mm512_setzero_ps();
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t q = 0; q < pairs; ++q) {
    for (int t = 0; t < NT; ++t) {
      prefetch(w + t * tile_bytes + q * 64, lim);
      const __m512i v = _mm512_loadu_si512(w + t * tile_bytes + q * 64);
      const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
      for (int i = 0; i < NR; ++i) {
        acc[t][i] = _mm512_fmadd_ps(even, _mm512_set1_ps(p.f[i][2 * q]), acc[t][i]);
        acc[t][i] = _mm512_fmadd_ps(odd, _mm512_set1_ps(p.f[i][2 * q + 1]), acc[t][i]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < NR; ++i) _mm512_storeu_ps(y + i * ldy + t * kTileRows, acc[t][i]);
}

// Rows i0 .. i0+nr-1; 16-bit activations add their high halves as streams nr .. 2nr-1.
void fill_rows(const ActRows& a, int64_t i0, int nr, RowPtrs& p) {
  for (int i = 0; i < nr; ++i) {
    const int64_t row = a.rows[i0 + i];
    if (a.f) {
      p.f[i] = a.f + row * a.f_stride;
    } else {
      p.q[i] = a.q.q + row * a.q.q_stride;
      p.s[i] = a.q.scale + row * a.q.g_stride;
      p.sum[i] = a.q.sum + row * a.q.g_stride;
      if (a.q.wide()) {
        p.q[nr + i] = a.q.q_hi + row * a.q.q_stride;
        p.sum[nr + i] = a.q.sum_hi + row * a.q.g_stride;
      }
    }
  }
}

template <int KIND>
void matmul_int(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, const uint16_t*, const uint8_t*, int64_t, int64_t, const RowPtrs&, float*,
                      int64_t, const uint8_t*);
  static constexpr Fn kFns[kMaxRows] = {int_tile<1, KIND, false>, int_tile<2, KIND, false>, int_tile<3, KIND, false>,
                                        int_tile<4, KIND, false>, int_tile<5, KIND, false>, int_tile<6, KIND, false>,
                                        int_tile<7, KIND, false>, int_tile<8, KIND, false>};
  static constexpr Fn kWide[kMaxRows / 2] = {int_tile<1, KIND, true>, int_tile<2, KIND, true>, int_tile<3, KIND, true>,
                                             int_tile<4, KIND, true>};
  const bool wide = a.q.wide();
  const int64_t max_rows = wide ? kMaxRows / 2 : kMaxRows;  // two streams per row when wide
  const int64_t tile_scales = w.groups * kTileRows;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t i0 = 0; i0 < a.nrows; i0 += max_rows) {
      const int nr = static_cast<int>(a.nrows - i0 < max_rows ? a.nrows - i0 : max_rows);
      RowPtrs p;
      fill_rows(a, i0, nr, p);
      (wide ? kWide : kFns)[nr - 1](w.w + t * w.tile_bytes, w.scales + t * tile_scales,
                                    w.zeros ? w.zeros + t * tile_scales : nullptr, w.groups, w.group_size, p,
                                    y + i0 * ldy + (t - t0) * kTileRows, ldy, w.w + t1 * w.tile_bytes);
    }
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
  using Fn = void (*)(const uint8_t*, int64_t, int64_t, const RowPtrs&, float*, int64_t, const uint8_t*);
  // Few rows: 4 tiles at once so the fma chains overlap; more rows already give independent chains.
  static constexpr Fn kQuad[4] = {bf16_tiles<1, 4>, bf16_tiles<2, 4>, bf16_tiles<3, 2>, bf16_tiles<4, 2>};
  static constexpr Fn kOne[kMaxRows] = {bf16_tiles<1, 1>, bf16_tiles<2, 1>, bf16_tiles<3, 1>, bf16_tiles<4, 1>,
                                        bf16_tiles<5, 1>, bf16_tiles<6, 1>, bf16_tiles<7, 1>, bf16_tiles<8, 1>};
  const int64_t pairs = w.cols_padded / 2;
  const uint8_t* lim = w.w + t1 * w.tile_bytes;
  for (int64_t i0 = 0; i0 < a.nrows; i0 += kMaxRows) {
    const int nr = static_cast<int>(a.nrows - i0 < kMaxRows ? a.nrows - i0 : kMaxRows);
    RowPtrs p;
    fill_rows(a, i0, nr, p);
    int64_t t = t0;
    if (nr <= 4) {
      const int step = nr <= 2 ? 4 : 2;
      for (; t + step <= t1; t += step)
        kQuad[nr - 1](w.w + t * w.tile_bytes, w.tile_bytes, pairs, p, y + i0 * ldy + (t - t0) * kTileRows, ldy, lim);
    }
    for (; t < t1; ++t)
      kOne[nr - 1](w.w + t * w.tile_bytes, w.tile_bytes, pairs, p, y + i0 * ldy + (t - t0) * kTileRows, ldy, lim);
  }
}

}  // namespace tandem::cpu::avx512
