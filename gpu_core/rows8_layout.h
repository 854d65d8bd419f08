// gpu_core/rows8_layout.h: dense weights quantized to 8-bit rows when loaded (W8A16): one fp32 scale
// per output row and a code per weight, int8 or FP8 E4M3 (core/row_format.h: the row's largest |w|
// maps to the largest code, 127 or 448), a row's codes after the row before it ([N][K]) in the GEMV's
// order (rows8_position). CUDA-free: the loader, the planner and the tests use it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/row_format.h"

namespace tandem::gpu {

// The order of a row's codes: in each whole block of 512 inputs, lane l of the GEMV's warp reads the 16
// codes at 16 l, and they are the inputs 4 l + 128 m + e (m, e < 4), so each of the lane's 16-byte
// activation loads is contiguous across the warp (in input order a lane's 64 bytes of x sit 64 bytes
// from its neighbour's: 4x the cache lines a load; 1.6x at one token and 3x at four on the H100,
// bench/results/2026-12-05-stop45-h100-rows8-tc-moe.md). The inputs past the last whole block stay in
// order. Four consecutive inputs stay together: an aligned 32-bit word holds inputs k .. k + 3 for k a
// multiple of 4.
// Where input k of a K-input row is stored:
TANDEM_HD int64_t rows8_position(int64_t K, int64_t k) {
  if (k >= K / 512 * 512) return k;
  const int64_t r = k % 512;
  return k - r + 16 * ((r % 128) / 4) + 4 * (r / 128) + r % 4;
}
// Which input the code stored at position p of a K-input row is (the inverse):
TANDEM_HD int64_t rows8_input(int64_t K, int64_t p) {
  if (p >= K / 512 * 512) return p;
  const int64_t r = p % 512;
  return p - r + 4 * (r / 16) + 128 * ((r % 16) / 4) + r % 4;
}

struct Rows8Host {
  RowFormat format = RowFormat::Int8;
  std::vector<uint8_t> codes;  // [N][K], each row in rows8_position's order
  std::vector<float> scales;   // [N]
};

// bf16 [N, K] (nn.Linear layout) to 8-bit rows of `f` (Int8 or Fp8) and their scales (quantize_row per
// row), each row's codes in rows8_position's order. int8: |w - code * s| <= s / 2 for every weight;
// fp8: within half a mantissa step (1/16 of |w|, or s * 2^-10 near zero).
Rows8Host quantize_rows8(const uint16_t* w_bf16, int64_t N, int64_t K, RowFormat f);

// Bytes of an 8-bit matrix on the GPU (codes, then scales, each 256-byte aligned).
uint64_t rows8_matrix_bytes(int64_t N, int64_t K);

}  // namespace tandem::gpu
