// gpu_core/int4_layout.h: GPTQ int4 weights repacked (on the host, once at load) for gemv_int4.
//
// Input: the checkpoint's GPTQ tensors (spec §4): qweight int32 [K/8, N] packed along K, qzeros
// int32 [G, N/8] packed along N, fp16 scales [G, N], optional g_idx [K], zero offset 1 (v1) or 0 (v2).
// Output layout (all row-major by output n, so a warp streams one row contiguously):
//  - perm [K]: input order; groups become contiguous (stable sort of k by g_idx). Identity when
//    g_idx is trivial, and then `permuted` is false.
//  - qweight [N][K/8] uint32: word w holds permuted inputs 8w..8w+7; nibble for input 8w+j sits at
//    bit 4*(j/2) + 16*(j%2), so (word >> 4i) & 0x000F000F yields the pair (2i, 2i+1) as two fp16
//    lanes with the 0x6400 magic.
//  - zeros [N][G] uint8: actual zero point (stored + offset), scales [N][G] fp16 bits.
// Plain C++ (no CUDA), so it is tested on any machine.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::gpu {

struct GptqSource {
  const int32_t* qweight = nullptr;
  const int32_t* qzeros = nullptr;
  const uint16_t* scales_f16 = nullptr;
  const int32_t* g_idx = nullptr;  // nullptr: k / group_size
  int64_t N = 0, K = 0, group_size = 0;
  int zero_offset = 1;
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

}  // namespace tandem::gpu
