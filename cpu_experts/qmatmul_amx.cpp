// AMX kernels for cpu_experts/qmatmul.h (prefill: 8+ activation rows; fewer rows go to AVX-512).
//
// The packed layouts are already AMX B tiles: int8 [k/4][16 rows][4] (1 KiB per 64 k), bf16
// [k/2][16][2]; int4 octets are split into low / high nibble rows (B rows 2o and 2o+1) in a small
// buffer. Activation rows are gathered into A tiles (16 rows x 64 bytes; zero rows pad to 16).
// Blocking: 2 A tiles x 2 B tiles -> 4 int32 / fp32 C tiles (32 activation rows x 32 output rows).
//  - int4 / int8: tdpbsud (s8 activations x u8 codes) over one quantization group (K chunks of 64,
//    or 32 for group size 32), C stored, then the reference epilogue per group:
//    acc = fma(float(dot - zero * sum), f32(scale) * act_scale, acc): bit-identical to the reference.
//    16-bit activations: the low and high halves of 16 rows take the two A tiles (C = lo and hi
//    products of 16 rows x 32 outputs), joined per group as 255 (hi - zero sum_hi) + (lo - zero sum).
//    Groups that are not a multiple of 32 go to the AVX-512 kernel.
//  - bf16: activations rounded to bf16 (RNE), tdpbf16ps over all of K (fp32 accumulation inside the
//    tile unit): not bit-identical, see qmatmul.h.
// Built twice: with TANDEM_AMX_EMULATE the tile instructions are replaced by a scalar emulator (namespace
// amx_emu), so this file's blocking and layouts are tested on machines without AMX.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "cpu_experts/qmatmul.h"
#include "cpu_experts/target.h"

#ifdef TANDEM_AMX_EMULATE
#define AMX_NS amx_emu
#define AMX_TARGET TANDEM_TARGET_AVX512_BF16
#else
#define AMX_NS amx
#define AMX_TARGET TANDEM_TARGET_AMX
#endif

namespace tandem::cpu::AMX_NS {

namespace {

constexpr int64_t kMinRows = 8;  // below this, AVX-512 (decode streams W once either way)

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: C[i][j] = 2i + j (activation block i, weight tile j), A[i] = 4 + i, B[j] = 6 + j.
TileConfig make_config(int a_colsb, int b_rows) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = static_cast<uint16_t>(a_colsb);
  }
  for (int t = 6; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(b_rows);
    c.colsb[t] = 64;
  }
  return c;
}

#ifdef TANDEM_AMX_EMULATE
struct EmuTiles {
  alignas(64) uint8_t t[8][1024];
  int rows[8], colsb[8];
};
thread_local EmuTiles emu;
void emu_config(const TileConfig& c) {
  for (int t = 0; t < 8; ++t) {
    emu.rows[t] = c.rows[t];
    emu.colsb[t] = c.colsb[t];
  }
}
void emu_load(int t, const void* base, int64_t stride) {
  std::memset(emu.t[t], 0, 1024);
  for (int r = 0; r < emu.rows[t]; ++r)
    std::memcpy(emu.t[t] + 64 * r, static_cast<const uint8_t*>(base) + r * stride, static_cast<size_t>(emu.colsb[t]));
}
void emu_store(int t, void* base, int64_t stride) {
  for (int r = 0; r < emu.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, emu.t[t] + 64 * r, static_cast<size_t>(emu.colsb[t]));
}
void emu_zero(int t) { std::memset(emu.t[t], 0, 1024); }
void emu_dpbsud(int c, int a, int b) {
  for (int m = 0; m < emu.rows[a]; ++m)
    for (int n = 0; n < emu.colsb[b] / 4; ++n) {
      int32_t acc;
      std::memcpy(&acc, emu.t[c] + 64 * m + 4 * n, 4);
      for (int k = 0; k < emu.colsb[a]; ++k)
        acc += static_cast<int8_t>(emu.t[a][64 * m + k]) * emu.t[b][64 * (k / 4) + 4 * n + k % 4];
      std::memcpy(emu.t[c] + 64 * m + 4 * n, &acc, 4);
    }
}
float emu_bf16(const uint8_t* p) {
  uint32_t bits = static_cast<uint32_t>(p[0] | (p[1] << 8)) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
void emu_dpbf16ps(int c, int a, int b) {
  for (int m = 0; m < emu.rows[a]; ++m)
    for (int n = 0; n < emu.colsb[b] / 4; ++n) {
      float acc;
      std::memcpy(&acc, emu.t[c] + 64 * m + 4 * n, 4);
      for (int k = 0; k < emu.colsb[a] / 2; k += 2)
        acc += emu_bf16(emu.t[a] + 64 * m + 2 * k) * emu_bf16(emu.t[b] + 64 * (k / 2) + 4 * n) +
               emu_bf16(emu.t[a] + 64 * m + 2 * k + 2) * emu_bf16(emu.t[b] + 64 * (k / 2) + 4 * n + 2);
      std::memcpy(emu.t[c] + 64 * m + 4 * n, &acc, 4);
    }
}
#define TILE_CONFIG(cfg) emu_config(cfg)
#define TILE_RELEASE() ((void)0)
#define TILE_LOAD(t, base, stride) emu_load(t, base, stride)
#define TILE_STORE(t, base, stride) emu_store(t, base, stride)
#define TILE_ZERO(t) emu_zero(t)
#define TILE_DPBSUD(c, a, b) emu_dpbsud(c, a, b)
#define TILE_DPBF16PS(c, a, b) emu_dpbf16ps(c, a, b)
#else
#define TILE_CONFIG(cfg) _tile_loadconfig(&(cfg))
#define TILE_RELEASE() _tile_release()
#define TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#endif

// Everything a tile kernel needs, prepared (gathered, padded) by the plain wrappers below.
struct Job {
  const PackedMatrix* w;
  int64_t t0, t1;
  int kind;  // 0 int4 symmetric, 1 int4 with zeros, 2 int8, 3 bf16
  const uint8_t* A;  // [mpad][a_stride] bytes: int8 codes, or bf16 pairs
  int64_t a_stride, m, mpad;
  const float* sa;  // [m][groups] activation scales (int)
  const int32_t* sum;
  const uint8_t* A_hi;  // 16-bit activations: high halves, same layout as A (null: 8-bit)
  const int32_t* sum_hi;
  uint8_t* bbuf;    // int4: unpacked B rows of one group, 2 tiles
  int32_t* cbuf;    // 4 C tiles
  float* acc;       // [m][32]
  float* y;
  int64_t ldy;
};

AMX_TARGET void int_kernel(const Job& j) {
  const PackedMatrix& w = *j.w;
  const int64_t gs = w.group_size, G = w.groups, kc = gs % 64 == 0 ? 64 : 32, chunks = gs / kc;
  const TileConfig cfg = make_config(static_cast<int>(kc), static_cast<int>(kc / 4));
  TILE_CONFIG(cfg);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t t = j.t0; t < j.t1; t += 2) {
    const int nt = t + 1 < j.t1 ? 2 : 1;
    std::memset(j.acc, 0, static_cast<size_t>(j.m * 32 * 4));
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* b[2];
      for (int jj = 0; jj < nt; ++jj) {
        const uint8_t* tile = w.w + (t + jj) * w.tile_bytes;
        if (j.kind == 2) {
          b[jj] = tile + g * gs * 16;
        } else {  // octet o -> B rows 2o (k = 8o..8o+3) and 2o+1 (k = 8o+4..8o+7)
          const uint8_t* src = tile + g * gs * 8;
          uint8_t* dst = j.bbuf + jj * gs * 16;
          for (int64_t o = 0; o < gs / 8; ++o) {
            const __m512i v = _mm512_loadu_si512(src + 64 * o);
            _mm512_storeu_si512(dst + 128 * o, _mm512_and_si512(v, low4));
            _mm512_storeu_si512(dst + 128 * o + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
          }
          b[jj] = dst;
        }
      }
      // 8-bit: A tiles 4, 5 = activation rows mb .. mb+31, C[i][jj] = A[i] B[jj].
      // 16-bit: A4 = low halves, A5 = high halves of rows mb .. mb+15; C[0][jj] lo, C[1][jj] hi.
      const bool wide = j.A_hi != nullptr;
      for (int64_t mb = 0; mb < j.mpad; mb += wide ? 16 : 32) {
        const int na = wide ? 2 : mb + 16 < j.mpad ? 2 : 1;
        const uint8_t* a5 = wide ? j.A_hi + mb * j.a_stride : j.A + (mb + 16) * j.a_stride;
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t k = g * gs + c * kc;
          TILE_LOAD(4, j.A + mb * j.a_stride + k, j.a_stride);
          if (na == 2) TILE_LOAD(5, a5 + k, j.a_stride);
          TILE_LOAD(6, b[0] + c * kc * 16, 64);
          if (nt == 2) TILE_LOAD(7, b[1] + c * kc * 16, 64);
          TILE_DPBSUD(0, 4, 6);
          if (nt == 2) TILE_DPBSUD(1, 4, 7);
          if (na == 2) {
            TILE_DPBSUD(2, 5, 6);
            if (nt == 2) TILE_DPBSUD(3, 5, 7);
          }
        }
        TILE_STORE(0, j.cbuf, 64);
        TILE_STORE(1, j.cbuf + 256, 64);
        TILE_STORE(2, j.cbuf + 512, 64);
        TILE_STORE(3, j.cbuf + 768, 64);
        for (int jj = 0; jj < nt; ++jj) {
          const int64_t at = ((t + jj) * G + g) * kTileRows;
          const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales + at)));
          const __m512i zero = j.kind == 1 ? _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + at)))
                                           : _mm512_set1_epi32(j.kind == 0 ? 8 : 128);
          for (int i = 0; i < (wide ? 1 : na); ++i)
            for (int r = 0; r < 16; ++r) {
              const int64_t m = mb + 16 * i + r;
              if (m >= j.m) break;
              const __m512i d = _mm512_loadu_si512(j.cbuf + (2 * i + jj) * 256 + 16 * r);
              __m512i cv = _mm512_sub_epi32(d, _mm512_mullo_epi32(zero, _mm512_set1_epi32(j.sum[m * G + g])));
              if (wide) {
                __m512i dh = _mm512_loadu_si512(j.cbuf + (2 + jj) * 256 + 16 * r);
                dh = _mm512_sub_epi32(dh, _mm512_mullo_epi32(zero, _mm512_set1_epi32(j.sum_hi[m * G + g])));
                cv = _mm512_add_epi32(cv, _mm512_mullo_epi32(dh, _mm512_set1_epi32(kAct16Base)));
              }
              const __m512 s = _mm512_mul_ps(ws, _mm512_set1_ps(j.sa[m * G + g]));
              float* a = j.acc + m * 32 + 16 * jj;
              _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(cv), s, _mm512_loadu_ps(a)));
            }
        }
      }
    }
    for (int64_t m = 0; m < j.m; ++m)
      for (int jj = 0; jj < nt; ++jj)
        _mm512_storeu_ps(j.y + m * j.ldy + (t - j.t0 + jj) * kTileRows, _mm512_loadu_ps(j.acc + m * 32 + 16 * jj));
  }
  TILE_RELEASE();
}

AMX_TARGET void bf16_kernel(const Job& j) {
  const PackedMatrix& w = *j.w;
  const TileConfig cfg = make_config(64, 16);
  TILE_CONFIG(cfg);
  auto* cf = reinterpret_cast<float*>(j.cbuf);
  for (int64_t t = j.t0; t < j.t1; t += 2) {
    const int nt = t + 1 < j.t1 ? 2 : 1;
    const uint8_t* b0 = w.w + t * w.tile_bytes;
    const uint8_t* b1 = b0 + w.tile_bytes;
    for (int64_t mb = 0; mb < j.mpad; mb += 32) {
      const int na = mb + 16 < j.mpad ? 2 : 1;
      TILE_ZERO(0);
      TILE_ZERO(1);
      TILE_ZERO(2);
      TILE_ZERO(3);
      for (int64_t k = 0; k < w.cols_padded; k += 32) {
        TILE_LOAD(4, j.A + mb * j.a_stride + 2 * k, j.a_stride);
        if (na == 2) TILE_LOAD(5, j.A + (mb + 16) * j.a_stride + 2 * k, j.a_stride);
        TILE_LOAD(6, b0 + k * 32, 64);
        if (nt == 2) TILE_LOAD(7, b1 + k * 32, 64);
        TILE_DPBF16PS(0, 4, 6);
        if (nt == 2) TILE_DPBF16PS(1, 4, 7);
        if (na == 2) {
          TILE_DPBF16PS(2, 5, 6);
          if (nt == 2) TILE_DPBF16PS(3, 5, 7);
        }
      }
      TILE_STORE(0, cf, 64);
      TILE_STORE(1, cf + 256, 64);
      TILE_STORE(2, cf + 512, 64);
      TILE_STORE(3, cf + 768, 64);
      for (int i = 0; i < na; ++i)
        for (int r = 0; r < 16; ++r) {
          const int64_t m = mb + 16 * i + r;
          if (m >= j.m) break;
          for (int jj = 0; jj < nt; ++jj)
            _mm512_storeu_ps(j.y + m * j.ldy + (t - j.t0 + jj) * kTileRows, _mm512_loadu_ps(cf + (2 * i + jj) * 256 + 16 * r));
        }
    }
  }
  TILE_RELEASE();
}

// fp32 rows -> bf16 rows (round to nearest even), zero padded to cols.
AMX_TARGET void to_bf16_rows(const ActRows& a, int64_t cols, uint16_t* dst, int64_t stride) {
  for (int64_t i = 0; i < a.nrows; ++i) {
    const float* x = a.f + a.rows[i] * a.f_stride;
    for (int64_t k = 0; k < cols; k += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * stride + k),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + k)));
  }
}

struct Scratch {
  std::vector<uint8_t> a, a_hi, b;
  std::vector<float> sa, acc;
  std::vector<int32_t> sum, sum_hi, c;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void matmul_int(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy, int kind) {
  Scratch& s = scratch();
  const int64_t G = w.groups, mpad = (a.nrows + 15) / 16 * 16, stride = (w.cols_padded + 63) / 64 * 64;
  const bool wide = a.q.wide();
  s.a.resize(static_cast<size_t>(mpad * stride));
  std::memset(s.a.data() + a.nrows * stride, 0, static_cast<size_t>((mpad - a.nrows) * stride));  // pad rows
  s.sa.resize(static_cast<size_t>(a.nrows * G));
  s.sum.resize(static_cast<size_t>(a.nrows * G));
  if (wide) {
    s.a_hi.resize(static_cast<size_t>(mpad * stride));
    std::memset(s.a_hi.data() + a.nrows * stride, 0, static_cast<size_t>((mpad - a.nrows) * stride));
    s.sum_hi.resize(static_cast<size_t>(a.nrows * G));
  }
  for (int64_t i = 0; i < a.nrows; ++i) {
    const int64_t r = a.rows[i];
    std::memcpy(s.a.data() + i * stride, a.q.q + r * a.q.q_stride, static_cast<size_t>(w.cols_padded));
    std::memcpy(s.sa.data() + i * G, a.q.scale + r * a.q.g_stride, static_cast<size_t>(G) * 4);
    std::memcpy(s.sum.data() + i * G, a.q.sum + r * a.q.g_stride, static_cast<size_t>(G) * 4);
    if (wide) {
      std::memcpy(s.a_hi.data() + i * stride, a.q.q_hi + r * a.q.q_stride, static_cast<size_t>(w.cols_padded));
      std::memcpy(s.sum_hi.data() + i * G, a.q.sum_hi + r * a.q.g_stride, static_cast<size_t>(G) * 4);
    }
  }
  s.b.resize(static_cast<size_t>(2 * w.group_size * 16));
  s.c.resize(1024);
  s.acc.resize(static_cast<size_t>(a.nrows * 32));
  const Job j{&w, t0, t1, kind, s.a.data(), stride, a.nrows, mpad, s.sa.data(), s.sum.data(),
              wide ? s.a_hi.data() : nullptr, wide ? s.sum_hi.data() : nullptr,
              s.b.data(), s.c.data(), s.acc.data(), y, ldy};
  int_kernel(j);
}

}  // namespace

void matmul_int4(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  if (a.nrows < kMinRows || w.group_size % 32 != 0) return avx512::matmul_int4(w, t0, t1, a, y, ldy);
  matmul_int(w, t0, t1, a, y, ldy, w.zeros ? 1 : 0);
}

void matmul_int8(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  if (a.nrows < kMinRows || w.group_size % 32 != 0) return avx512::matmul_int8(w, t0, t1, a, y, ldy);
  matmul_int(w, t0, t1, a, y, ldy, 2);
}

void matmul_bf16(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  if (a.nrows < kMinRows) return avx512::matmul_bf16(w, t0, t1, a, y, ldy);
  Scratch& s = scratch();
  const int64_t mpad = (a.nrows + 15) / 16 * 16, stride = w.cols_padded;  // in bf16 elements
  s.a.resize(static_cast<size_t>(mpad * stride * 2));
  std::memset(s.a.data() + a.nrows * stride * 2, 0, static_cast<size_t>((mpad - a.nrows) * stride * 2));
  to_bf16_rows(a, w.cols_padded, reinterpret_cast<uint16_t*>(s.a.data()), stride);
  s.c.resize(1024);
  const Job j{&w, t0, t1, 3, s.a.data(), stride * 2, a.nrows, mpad, nullptr, nullptr, nullptr, nullptr, nullptr,
              s.c.data(), nullptr, y, ldy};
  bf16_kernel(j);
}

}  // namespace tandem::cpu::AMX_NS
