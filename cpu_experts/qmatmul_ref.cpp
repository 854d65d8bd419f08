// Scalar reference for cpu_experts/qmatmul.h: the arithmetic every fast kernel reproduces.
#include <cassert>
#include <cmath>

#include "cpu_experts/qmatmul.h"
#include "core/dtype.h"

namespace tandem::cpu::ref {

namespace {

// code[n, k] and zero[g, n] as the packed layouts store them (see packed_weight.h).
int code_at(const PackedMatrix& w, const uint8_t* tile, int r, int64_t k) {
  if (w.format == WeightFormat::Int4) {
    const uint8_t byte = tile[(k / 8) * 64 + r * 4 + (k % 4)];
    return (k % 8) < 4 ? (byte & 0xf) : (byte >> 4);
  }
  return tile[(k / 4) * 64 + r * 4 + (k % 4)];
}

void matmul_int(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w.w + t * w.tile_bytes;
    for (int r = 0; r < kTileRows; ++r) {
      for (int64_t i = 0; i < a.nrows; ++i) {
        const int64_t row = a.rows[i];
        const int8_t* xq = a.q.q + row * a.q.q_stride;
        const int8_t* xh = a.q.wide() ? a.q.q_hi + row * a.q.q_stride : nullptr;
        const float* xs = a.q.scale + row * a.q.g_stride;
        const int32_t* xsum = a.q.sum + row * a.q.g_stride;
        const int32_t* xsum_hi = a.q.wide() ? a.q.sum_hi + row * a.q.g_stride : nullptr;
        float acc = 0.0f;
        for (int64_t g = 0; g < w.groups; ++g) {
          int64_t dot = 0, dot_hi = 0;
          for (int64_t k = g * w.group_size; k < (g + 1) * w.group_size; ++k) {
            dot += code_at(w, tile, r, k) * xq[k];
            if (xh) dot_hi += code_at(w, tile, r, k) * xh[k];
          }
          const int64_t at = (t * w.groups + g) * kTileRows + r;
          const int32_t zero = w.format == WeightFormat::Int8 ? 128 : (w.zeros ? w.zeros[at] : 8);
          int64_t c = dot - int64_t{zero} * xsum[g];
          if (xh) c += kAct16Base * (dot_hi - int64_t{zero} * xsum_hi[g]);
          assert(c == static_cast<int32_t>(c));  // qmatmul.h's group-size limit keeps c in int32
          const float s = f16_to_f32(w.scales[at]) * xs[g];
          acc = std::fma(static_cast<float>(c), s, acc);
        }
        y[i * ldy + (t - t0) * kTileRows + r] = acc;
      }
    }
  }
}

}  // namespace

void matmul_int4(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  matmul_int(w, t0, t1, a, y, ldy);
}

void matmul_int8(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  matmul_int(w, t0, t1, a, y, ldy);
}

void matmul_bf16(const PackedMatrix& w, int64_t t0, int64_t t1, const ActRows& a, float* y, int64_t ldy) {
  for (int64_t t = t0; t < t1; ++t) {
    const auto* tile = reinterpret_cast<const uint16_t*>(w.w + t * w.tile_bytes);
    for (int r = 0; r < kTileRows; ++r)
      for (int64_t i = 0; i < a.nrows; ++i) {
        const float* x = a.f + a.rows[i] * a.f_stride;
        float acc = 0.0f;
        for (int64_t k = 0; k < w.cols_padded; ++k)
          acc = std::fma(bf16_to_f32(tile[(k / 2) * 32 + r * 2 + k % 2]), x[k], acc);
        y[i * ldy + (t - t0) * kTileRows + r] = acc;
      }
  }
}

}  // namespace tandem::cpu::ref
