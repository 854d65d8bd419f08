#include "gpu_core/rows8_layout.h"

#include "core/dtype.h"
#include "core/error.h"

namespace tandem::gpu {

Rows8Host quantize_rows8(const uint16_t* w, int64_t N, int64_t K, RowFormat f) {
  if (f == RowFormat::Bf16) fail("quantize_rows8: bf16 is not an 8-bit format");
  Rows8Host h;
  h.format = f;
  h.codes.resize(static_cast<size_t>(N * K));
  h.scales.resize(static_cast<size_t>(N));
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<uint8_t> codes(static_cast<size_t>(K));
#pragma omp parallel for schedule(static) firstprivate(row, codes) if (N * K >= (int64_t(1) << 20))
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) row[k] = bf16_to_f32(w[n * K + k]);
    h.scales[n] = quantize_row(row.data(), K, f, codes.data());
    for (int64_t k = 0; k < K; ++k) h.codes[n * K + rows8_position(K, k)] = codes[k];
  }
  return h;
}

uint64_t rows8_matrix_bytes(int64_t N, int64_t K) {
  auto align256 = [](uint64_t b) { return (b + 255) / 256 * 256; };
  return align256(static_cast<uint64_t>(N * K)) + align256(static_cast<uint64_t>(N) * 4);
}

}  // namespace tandem::gpu
