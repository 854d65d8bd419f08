// gpu_core/int4_tiles.cu: the tile layout to the row layout (see int4_tiles.cuh).
#include "gpu_core/int4_tiles.cuh"

#include "gpu_core/int4_layout.h"

namespace tandem::gpu {

static_assert(sizeof(Int4TilesToRows) == kTilesJobBytes, "int4_layout.h counts the jobs with this size");

namespace {

constexpr int kRowsPerBlock = 16;  // one tile: its rows' 4-byte pieces of an octet are adjacent

__device__ __forceinline__ uint32_t row_word(uint32_t u) {
  // u: byte j = q(j) | q(4 + j) << 4 (inputs of one octet); row form: input i at bit 4 * (i / 2) + 16 * (i % 2)
  uint32_t r = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = (u >> (8 * j)) & 0xfu, hi = (u >> (8 * j + 4)) & 0xfu;
    r |= lo << (4 * (j / 2) + 16 * (j % 2)) | hi << (4 * ((4 + j) / 2) + 16 * (j % 2));
  }
  return r;
}

// grid (tiles of the tallest job, jobs); a block converts one tile: 16 rows x all octets, then the
// tile's scales and zeros. Threads walk (octet, row) with the row fastest: reads are 64-byte runs.
__global__ void tiles_to_rows_kernel(const Int4TilesToRows* __restrict__ jobs) {
  const Int4TilesToRows j = jobs[blockIdx.y];
  const int64_t tile = blockIdx.x, n0 = tile * kRowsPerBlock;
  if (n0 >= j.rows) return;
  const int64_t words = j.cols / 8, G = j.cols / j.group_size;
  const int rows = j.rows - n0 < kRowsPerBlock ? static_cast<int>(j.rows - n0) : kRowsPerBlock;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(j.w + tile * j.cols * 8);
  for (int64_t i = threadIdx.x; i < words * kRowsPerBlock; i += blockDim.x) {
    const int r = static_cast<int>(i % kRowsPerBlock);
    const int64_t o = i / kRowsPerBlock;
    if (r < rows) j.qweight[(n0 + r) * words + o] = row_word(src[o * 16 + r]);
  }
  if (tile == 0 && j.tile_perm && j.perm)
    for (int64_t i = threadIdx.x; i < j.cols; i += blockDim.x) j.perm[i] = j.tile_perm[i];
  for (int64_t i = threadIdx.x; i < G * kRowsPerBlock; i += blockDim.x) {
    const int r = static_cast<int>(i % kRowsPerBlock);
    const int64_t g = i / kRowsPerBlock, at = (tile * G + g) * 16 + r;
    if (r >= rows) continue;
    j.scales[(n0 + r) * G + g] = j.tile_scales[at];
    j.zeros[(n0 + r) * G + g] = j.tile_zeros ? j.tile_zeros[at] : 8;
  }
}

}  // namespace

cudaError_t int4_tiles_to_rows(const Int4TilesToRows* jobs, int count, int64_t max_rows, cudaStream_t stream) {
  if (count <= 0 || max_rows <= 0) return count == 0 ? cudaSuccess : cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((max_rows + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(count));
  tiles_to_rows_kernel<<<grid, 256, 0, stream>>>(jobs);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
