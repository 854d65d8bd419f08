// gpu_core/int4_layout.h: GPTQ int4 weights repacked (on the host, once at load) for gemv_int4.
//
// Input: the checkpoint's GPTQ tensors (spec §4): qweight int32 [K/8, N] packed along K, qzeros
// int32 [G, N/8] packed along N, fp16 scales [G, N], optional g_idx [K], zero offset 1 (v1) or 0 (v2):
// see gptq_zero_point for how v1 is read.
// Output layout (all row-major by output n, so a warp streams one row contiguously):
//  - perm [K]: input order; groups become contiguous (stable sort of k by g_idx). Identity when
//    g_idx is trivial, and then `permuted` is false.
//  - qweight [N][K/8] uint32: word w holds permuted inputs 8w..8w+7; nibble for input 8w+j sits at
//    bit 4*(j/2) + 16*(j%2), so (word >> 4i) & 0x000F000F yields the pair (2i, 2i+1) as two fp16
//    lanes with the 0x6400 magic.
//  - zeros [N][G] uint8: actual zero point (stored + offset), scales [N][G] fp16 bits.
// Plain C++ (no CUDA), so it is tested on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/gptq.h"  // gptq_zero_point

namespace tandem::gpu {

struct GptqSource {
  const int32_t* qweight = nullptr;
  const int32_t* qzeros = nullptr;
  const uint16_t* scales_f16 = nullptr;
  const int32_t* g_idx = nullptr;  // nullptr: k / group_size
  int64_t N = 0, K = 0, group_size = 0;
  int zero_offset = 1;  // 1: v1 ("gptq"), 0: v2 ("gptq_v2"); see gptq_zero_point
};

struct Int4Host {
  std::vector<uint32_t> qweight;
  std::vector<uint16_t> scales;
  std::vector<uint8_t> zeros;
  std::vector<int32_t> perm;
  bool permuted = false;
  int64_t N = 0, K = 0, group_size = 0;
};

Int4Host repack_gptq_int4(const GptqSource& src);

// W[n, k] of the original (unpermuted) matrix from the repacked form, for tests.
float int4_host_weight(const Int4Host& w, int64_t n, int64_t k_original);

// ---- The tile layout (the host experts' int4 form, cpu_experts/packed_weight.h, restated here: ----
// gpu_core knows layouts, not modules). Experts streamed over PCIe arrive in it, and the device turns
// them into the row form above (int4_tiles_to_rows in int4_tiles.cuh):
//  - rows in tiles of 16; tile t holds tile_bytes = cols * 8 bytes: per k-octet o = 0 .. cols/8 - 1
//    (the groups in order), 64 bytes = [16 rows][4 bytes], byte j of row r = q(8o+j) | q(8o+4+j) << 4;
//  - scales fp16 [tile][group][16]; zeros u8 [tile][group][16], the actual zero point, or none (8);
//  - inputs in packed order (act-order permutation applied; the caller keeps its perm).
// cols must be a multiple of group_size and 8 (no padded columns), rows a multiple of 8.
struct Int4TilesHost {
  const uint8_t* w = nullptr;
  const uint16_t* scales = nullptr;
  const uint8_t* zeros = nullptr;  // nullptr: symmetric, zero point 8
  int64_t rows = 0, cols = 0, group_size = 0;
  int64_t tile_bytes() const { return cols * 8; }
};

// The row form of the same weights (perm left empty: inputs stay in packed order), the reference for
// the device conversion.
Int4Host int4_rows_from_tiles(const Int4TilesHost& t);

// ---- Streamed prefill's device buffers (Qwen35MoeGpu allocates exactly these, the planner counts them) ----
constexpr uint64_t kInt4ExpertBytes = 3 * (4 * 8 + 3 * 8);  // sizeof(gpu::Int4Expert): three Int4Views
constexpr uint64_t kTilesJobBytes = 8 * 8 + 3 * 8;          // sizeof(gpu::Int4TilesToRows)
// The pieces of a [rows, cols] int4 matrix in the tile layout, in bytes (zeros and perm when present).
struct Int4TilePieces {
  uint64_t w = 0, scales = 0, zeros = 0, perm = 0;
};
Int4TilePieces int4_tile_pieces(int64_t rows, int64_t cols, int64_t group_size);
// Tile-layout bytes with every piece present (zeros, act-order perm), each rounded to 64 as the host
// packer allocates them: an upper bound on what it takes.
uint64_t int4_tiles_bytes_bound(int64_t rows, int64_t cols, int64_t group_size);
// Row-layout bytes of the same matrix, one 256-byte aligned piece each: codes, scales, zeros, input order.
uint64_t int4_rows_bytes(int64_t rows, int64_t cols, int64_t group_size);
// For m host experts a layer (gate / up [I, H], down [H, I]) of a model with L layers of E experts:
// the raw copy of a layer (tile layout), its converted form, each layer's expert table and its
// conversion jobs, and a pass of `pass` tokens (hidden state fp32, position and id int32).
struct StreamBuffers {
  uint64_t raw = 0, rows = 0, tables = 0, jobs = 0, pass = 0;
  uint64_t total() const { return raw + rows + tables + jobs + pass; }
};
StreamBuffers stream_buffer_bytes(int64_t H, int64_t I, int64_t group_size, int E, int L, int m, int64_t pass);
// Whether gpu::moe_int4_tiles_decode takes these shapes (int4_tiles.cuh): H, I multiples of 16, groups
// a multiple of 8 dividing H and I in at most 32 a row, k <= 8, 1 <= m <= k.
bool moe_int4_tiles_fits(int64_t H, int64_t I, int64_t group_size, int k, int m);
// Its scratch for `slots` link experts: each one's h [I] and, with act order, its gathered inputs [2][H].
size_t moe_int4_tiles_scratch_bytes(int64_t H, int64_t I, int slots);
// ---- The link experts' device buffers (GpuOptions::link_experts; Qwen35MoeGpu allocates exactly these) ----
constexpr uint64_t kInt4TilesExpertBytes = 3 * 4 * 8;  // sizeof(gpu::Int4TilesExpert): three Int4TilesViews
// In this order: an expert table of E entries for each of host_layers layers, then the kernel's scratch
// for m link slots; each piece a multiple of 256 bytes.
struct LinkBuffers {
  uint64_t tables = 0, scratch = 0;
  uint64_t total() const { return tables + scratch; }
};
LinkBuffers link_buffer_bytes(int64_t H, int64_t I, int E, int host_layers, int m);
// Tokens per streamed pass: `want` (default kStreamPassTokens) rounded up to whole prefill chunks.
constexpr int64_t kStreamPassTokens = 4096;
inline int64_t stream_pass_tokens(int64_t chunk, int64_t want = kStreamPassTokens) {
  return chunk <= 0 ? 0 : ((want > chunk ? want : chunk) + chunk - 1) / chunk * chunk;
}

}  // namespace tandem::gpu
