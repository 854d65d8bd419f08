// gpu_core/int8_layout.h: dense weights quantized to int8 when loaded (W8A16): one fp32 scale per
// output row (symmetric, max |w| / 127, so every row uses the whole range), weights row-major
// [N][K] int8. CUDA-free: the loader, the planner and the tests use it.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::gpu {

struct Int8Host {
  std::vector<int8_t> q;      // [N][K]
  std::vector<float> scales;  // [N]
};

// bf16 [N, K] (nn.Linear layout) to int8 rows and their scales: q = round(w / s), s = max |w| / 127
// (1 for an all-zero row). |w - q s| <= s / 2 for every weight.
Int8Host quantize_int8_rows(const uint16_t* w_bf16, int64_t N, int64_t K);

// Bytes of an int8 matrix on the GPU (weights, then scales, each 256-byte aligned).
uint64_t int8_matrix_bytes(int64_t N, int64_t K);

}  // namespace tandem::gpu
