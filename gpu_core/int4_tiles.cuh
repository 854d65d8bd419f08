// gpu_core/int4_tiles.cuh: int4 matrices that arrive in the tile layout (int4_layout.h: the host
// experts' form, streamed over PCIe) turned into the row layout every GPU int4 kernel reads, on the
// device. Bit for bit int4_rows_from_tiles (the host reference): the same codes, scales and zero
// points; inputs stay in the tiles' packed order (the caller sets Int4View::perm).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_core/int4_layout.h"

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

// ---- Routed experts computed straight from the tile layout, wherever it lies ----
// The hybrid decode step's link experts (GpuOptions::link_experts): some of a token's host-resident
// experts computed by the GPU reading their weights in place from page-locked host memory over PCIe
// (zero copy), while the host computes the others from the same memory. Pointers are device-usable
// (cudaHostGetDevicePointer for host memory; device memory works the same).
struct Int4TilesView {
  const uint8_t* w = nullptr;          // [tiles][cols * 8]
  const uint16_t* scales = nullptr;    // fp16 [tiles][groups][16]
  const uint8_t* zeros = nullptr;      // u8 [tiles][groups][16]; nullptr: zero point 8
  const int32_t* perm = nullptr;       // input order [cols] (act order), nullptr: identity
};
struct Int4TilesExpert {
  Int4TilesView gate, up;  // [I, H], rows in down's input order
  Int4TilesView down;      // [H, I], no perm (down's act order is folded into gate / up rows)
};

// For one token (decode), its link experts: the first m slots j (in slot order) whose expert
// experts[ids[j]] has weights (gate.w set); fewer when fewer of its top-k have. For those, in that order,
//   out[n] += sum of weights[j] * (down_e[n] . (silu(gate_e . xg) * (up_e . xu)))
// with xg / xu = x gathered by gate's / up's perm. fp32 throughout (dequantised weight scale * (q - z)
// times fp32 inputs; an 8-input octet's products summed before scaling): ~1e-6 relative to fp64.
// experts: device array [E] (pointers 16-byte aligned); ids, weights [k]; x fp32 [H]; scratch:
// moe_int4_tiles_scratch_bytes(H, I, m); out fp32 [H], added to (accumulate) or overwritten (the sum
// alone: no GPU experts wrote it first). Needs H, I multiples of 16, group_size a multiple of 8
// dividing H and I in at most 32 groups, k <= 8, 1 <= m <= k; cudaErrorInvalidValue otherwise. Two
// launches (three with act_order: x gathered once per expert first, so perms cross PCIe once); no
// host synchronisation. (moe_int4_tiles_fits, moe_int4_tiles_scratch_bytes: gpu_core/int4_layout.h)
cudaError_t moe_int4_tiles_decode(const Int4TilesExpert* experts, int E, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                  const float* weights, int k, int m, bool act_order, const float* x, void* scratch, float* out,
                                  cudaStream_t stream, bool accumulate = true);

}  // namespace tandem::gpu
