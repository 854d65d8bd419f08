#include "gpu_core/int8_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem::gpu {

namespace {

float bf16_to_f32(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint64_t align256(uint64_t b) { return (b + 255) / 256 * 256; }

}  // namespace

Int8Host quantize_int8_rows(const uint16_t* w, int64_t N, int64_t K) {
  Int8Host h;
  h.q.resize(static_cast<size_t>(N * K));
  h.scales.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    float m = 0;
    for (int64_t k = 0; k < K; ++k) m = std::max(m, std::fabs(bf16_to_f32(w[n * K + k])));
    const float s = m > 0 ? m / 127.0f : 1.0f;
    h.scales[n] = s;
    for (int64_t k = 0; k < K; ++k)
      h.q[n * K + k] = static_cast<int8_t>(std::clamp(std::nearbyint(bf16_to_f32(w[n * K + k]) / s), -127.0f, 127.0f));
  }
  return h;
}

uint64_t int8_matrix_bytes(int64_t N, int64_t K) { return align256(static_cast<uint64_t>(N * K)) + align256(static_cast<uint64_t>(N) * 4); }

}  // namespace tandem::gpu
