#include "gpu_core/int4_layout.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace tandem::gpu {

namespace {
float half_to_float(uint16_t h) {
  const uint32_t sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  float v = exp == 0 ? std::ldexp(float(mant), -24) : std::ldexp(float(mant | 1024), int(exp) - 25);
  return sign ? -v : v;
}
int nibble_shift(int64_t j) { return static_cast<int>(4 * (j / 2) + 16 * (j % 2)); }
}  // namespace

Int4Host repack_gptq_int4(const GptqSource& s) {
  if (s.K % 8 || s.N % 8 || s.group_size <= 0 || s.K % s.group_size)
    throw std::invalid_argument("repack_gptq_int4: K and N must be multiples of 8 and group_size must divide K");
  Int4Host w;
  w.N = s.N;
  w.K = s.K;
  w.group_size = s.group_size;
  const int64_t G = s.K / s.group_size;
  auto group_of = [&](int64_t k) { return s.g_idx ? static_cast<int64_t>(s.g_idx[k]) : k / s.group_size; };
  w.perm.resize(s.K);
  std::iota(w.perm.begin(), w.perm.end(), 0);
  std::stable_sort(w.perm.begin(), w.perm.end(), [&](int32_t a, int32_t b) { return group_of(a) < group_of(b); });
  for (int64_t k = 0; k < s.K; ++k) {
    if (group_of(w.perm[k]) != k / s.group_size)
      throw std::invalid_argument("repack_gptq_int4: g_idx does not assign exactly group_size inputs to each group");
    w.permuted = w.permuted || w.perm[k] != k;
  }
  w.qweight.assign(s.N * (s.K / 8), 0);
  for (int64_t kp = 0; kp < s.K; ++kp) {
    const int64_t k = w.perm[kp];
    const int64_t src_row = (k / 8) * s.N, src_shift = (k % 8) * 4;
    for (int64_t n = 0; n < s.N; ++n) {
      const uint32_t q = (static_cast<uint32_t>(s.qweight[src_row + n]) >> src_shift) & 0xfu;
      w.qweight[n * (s.K / 8) + kp / 8] |= q << nibble_shift(kp % 8);
    }
  }
  w.scales.resize(s.N * G);
  w.zeros.resize(s.N * G);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < s.N; ++n) {
      const uint32_t zw = static_cast<uint32_t>(s.qzeros[g * (s.N / 8) + n / 8]);
      w.zeros[n * G + g] = static_cast<uint8_t>(gptq_zero_point(zw, n, s.zero_offset));
      w.scales[n * G + g] = s.scales_f16[g * s.N + n];
    }
  return w;
}

float int4_host_weight(const Int4Host& w, int64_t n, int64_t k_original) {
  const int64_t kp = std::find(w.perm.begin(), w.perm.end(), k_original) - w.perm.begin();
  const int64_t G = w.K / w.group_size, g = kp / w.group_size;
  const uint32_t q = (w.qweight[n * (w.K / 8) + kp / 8] >> nibble_shift(kp % 8)) & 0xfu;
  return half_to_float(w.scales[n * G + g]) * static_cast<float>(static_cast<int>(q) - w.zeros[n * G + g]);
}

Int4Host int4_rows_from_tiles(const Int4TilesHost& t) {
  if (t.cols % 8 || t.rows % 8 || t.group_size <= 0 || t.cols % t.group_size)
    throw std::invalid_argument("int4_rows_from_tiles: cols must be a multiple of 8 and of group_size, rows of 8");
  Int4Host h;
  h.N = t.rows, h.K = t.cols, h.group_size = t.group_size;
  const int64_t words = t.cols / 8, G = t.cols / t.group_size;
  h.qweight.assign(t.rows * words, 0);
  h.scales.resize(t.rows * G);
  h.zeros.resize(t.rows * G);
  for (int64_t n = 0; n < t.rows; ++n) {
    const uint8_t* tile = t.w + (n / 16) * t.tile_bytes() + (n % 16) * 4;
    for (int64_t o = 0; o < words; ++o)
      for (int j = 0; j < 4; ++j) {
        const uint32_t b = tile[o * 64 + j];
        h.qweight[n * words + o] |= (b & 0xfu) << nibble_shift(j) | (b >> 4) << nibble_shift(4 + j);
      }
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = ((n / 16) * G + g) * 16 + n % 16;
      h.scales[n * G + g] = t.scales[at];
      h.zeros[n * G + g] = t.zeros ? t.zeros[at] : 8;
    }
  }
  return h;
}

namespace {
uint64_t round_to(uint64_t b, uint64_t a) { return (b + a - 1) / a * a; }
}  // namespace

Int4TilePieces int4_tile_pieces(int64_t rows, int64_t cols, int64_t group_size) {
  const uint64_t tiles = static_cast<uint64_t>((rows + 15) / 16), G = static_cast<uint64_t>(cols / group_size);
  return {tiles * cols * 8, tiles * G * 16 * 2, tiles * G * 16, static_cast<uint64_t>(cols) * 4};
}

uint64_t int4_tiles_bytes_bound(int64_t rows, int64_t cols, int64_t group_size) {
  const Int4TilePieces t = int4_tile_pieces(rows, cols, group_size);
  return round_to(t.w, 64) + round_to(t.scales, 64) + round_to(t.zeros, 64) + round_to(t.perm, 64);
}

uint64_t int4_rows_bytes(int64_t rows, int64_t cols, int64_t group_size) {
  const uint64_t n = static_cast<uint64_t>(rows), G = static_cast<uint64_t>(cols / group_size);
  return round_to(n * cols / 2, 256) + round_to(n * G * 2, 256) + round_to(n * G, 256) + round_to(static_cast<uint64_t>(cols) * 4, 256);
}

bool moe_int4_tiles_fits(int64_t H, int64_t I, int64_t group_size, int k, int m) {
  return H > 0 && I > 0 && H % 16 == 0 && I % 16 == 0 && group_size > 0 && group_size % 8 == 0 && H % group_size == 0 &&
         I % group_size == 0 && H / group_size <= 32 && I / group_size <= 32 && k >= 1 && k <= 8 && m >= 1 && m <= k;
}

size_t moe_int4_tiles_scratch_bytes(int64_t H, int64_t I, int slots) {
  return static_cast<size_t>(slots) * static_cast<size_t>(I + 2 * H) * sizeof(float);
}

LinkBuffers link_buffer_bytes(int64_t H, int64_t I, int E, int host_layers, int m) {
  LinkBuffers b;
  if (host_layers <= 0 || m <= 0) return b;
  b.tables = round_to(static_cast<uint64_t>(host_layers) * E * kInt4TilesExpertBytes, 256);
  b.scratch = round_to(moe_int4_tiles_scratch_bytes(H, I, m), 256);
  return b;
}

StreamBuffers stream_buffer_bytes(int64_t H, int64_t I, int64_t group_size, int E, int L, int m, int64_t pass) {
  StreamBuffers b;
  if (m <= 0) return b;
  const uint64_t M = static_cast<uint64_t>(m);
  b.raw = round_to(M * (2 * int4_tiles_bytes_bound(I, H, group_size) + int4_tiles_bytes_bound(H, I, group_size)), 256);
  b.rows = M * (2 * int4_rows_bytes(I, H, group_size) + int4_rows_bytes(H, I, group_size));
  b.tables = round_to(static_cast<uint64_t>(L) * E * kInt4ExpertBytes, 256);
  b.jobs = round_to(static_cast<uint64_t>(L) * 3 * M * kTilesJobBytes, 256);
  b.pass = round_to(static_cast<uint64_t>(pass) * H * 4, 256) + 2 * round_to(static_cast<uint64_t>(pass) * 4, 256);
  return b;
}

}  // namespace tandem::gpu
