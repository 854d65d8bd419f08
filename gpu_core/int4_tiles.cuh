// gpu_core/int4_tiles.cuh: int4 matrices that arrive in the tile layout (int4_layout.h: the host
// experts' form, streamed over PCIe) turned into the row layout every GPU int4 kernel reads, on the
// device. Bit for bit int4_rows_from_tiles (the host reference): the same codes, scales and zero
// points; inputs stay in the tiles' packed order (the caller sets Int4View::perm).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::gpu {

struct Int4TilesToRows {
  const uint8_t* w = nullptr;       // tiles [rows/16 rounded up][cols * 8 bytes]
  const uint16_t* tile_scales = nullptr;  // fp16 [tile][group][16]
  const uint8_t* tile_zeros = nullptr;    // u8 [tile][group][16], nullptr: zero point 8
  const int32_t* tile_perm = nullptr;     // the input order [cols], copied to perm when both are set
  uint32_t* qweight = nullptr;      // out [rows][cols / 8]
  uint16_t* scales = nullptr;       // out fp16 [rows][groups]
  uint8_t* zeros = nullptr;         // out [rows][groups]
  int32_t* perm = nullptr;          // out [cols] (so the result outlives the tiles)
  int64_t rows = 0, cols = 0, group_size = 0;
};

// Converts `count` matrices (jobs: device array); max_rows bounds every job's rows (it sizes the grid).
// cols a multiple of 8 and of group_size.
cudaError_t int4_tiles_to_rows(const Int4TilesToRows* jobs, int count, int64_t max_rows, cudaStream_t stream);

}  // namespace tandem::gpu
