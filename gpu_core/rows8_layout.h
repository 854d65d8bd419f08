// gpu_core/rows8_layout.h: dense weights quantized to 8-bit rows when loaded (W8A16): one fp32 scale
// per output row and a code per weight, int8 or FP8 E4M3 (core/row_format.h: the row's largest |w|
// maps to the largest code, 127 or 448), codes row-major [N][K]. CUDA-free: the loader, the planner and
// the tests use it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/row_format.h"

namespace tandem::gpu {

struct Rows8Host {
  RowFormat format = RowFormat::Int8;
  std::vector<uint8_t> codes;  // [N][K]
  std::vector<float> scales;   // [N]
};

// bf16 [N, K] (nn.Linear layout) to 8-bit rows of `f` (Int8 or Fp8) and their scales (quantize_row per
// row). int8: |w - code * s| <= s / 2 for every weight; fp8: within half a mantissa step (1/16 of |w|,
// or s * 2^-10 near zero).
Rows8Host quantize_rows8(const uint16_t* w_bf16, int64_t N, int64_t K, RowFormat f);

// Bytes of an 8-bit matrix on the GPU (codes, then scales, each 256-byte aligned).
uint64_t rows8_matrix_bytes(int64_t N, int64_t K);

}  // namespace tandem::gpu
