// gpu_core/attention_sizes.h: the attention decode's split of the context and the head sizes of the
// prefill kernel (attention.cuh), in plain C++ so that host code uses them without the CUDA headers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/row_format.h"

namespace tandem::gpu {

// Context rows per split of attention_decode: one block per (query head, split) scores them and
// keeps its partial output, and combine merges the splits. 64 (was 256 until session 9: at a 4096-
// token context each block's sequential pass over 256 rows took ~96 us a layer on the H200).
constexpr int kAttnDecodeSplitRows = 64;

// AttentionDecodeArgs::max_splits for a cache of max_ctx rows (the partial scratch holds nh x this x
// (hd + 2) floats).
inline int64_t attention_decode_splits(int64_t max_ctx) { return (max_ctx + kAttnDecodeSplitRows - 1) / kAttnDecodeSplitRows; }

// Scoring blocks a (token, KV head) of attention_decode's grid, for a cache of `splits` splits on a
// device of `sms` SMs: one a split, but at most about kAttnDecodeBlocksPerSm an SM over the grid; each
// block then takes splits y, y + blocks, ... below its token's position. The grid covers the whole
// cache (its shape may not depend on the positions: captured steps replay at any), so without the cap
// a configured context far longer than the conversation (128k rows: 2,049 splits, 32,784 blocks at 8
// tokens) launched waves of blocks with nothing to do.
constexpr int64_t kAttnDecodeBlocksPerSm = 64;
inline int64_t attention_decode_split_blocks(int64_t splits, int64_t heads, int64_t tokens, int64_t sms) {
  return std::max<int64_t>(1, std::min<int64_t>(splits, kAttnDecodeBlocksPerSm * sms / (heads * tokens)));
}

// The head sizes attention_prefill's tensor-core kernel is built for.
inline bool attention_prefill_fits(int64_t hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256; }

// One position's row of a layer's K (or V) cache, nkv heads of hd values: bf16 [nkv][hd]; int8 / fp8
// codes [nkv][hd] then fp32 scales [nkv] (core/row_format.h), each part padded to 16 bytes so that rows
// stay aligned for 16-byte loads.
TANDEM_HD int64_t kv_codes_bytes(int64_t nkv, int64_t hd) { return (nkv * hd + 15) / 16 * 16; }
TANDEM_HD int64_t kv_row_bytes(RowFormat f, int64_t nkv, int64_t hd) {
  return f == RowFormat::Bf16 ? nkv * hd * 2 : kv_codes_bytes(nkv, hd) + (nkv * 4 + 15) / 16 * 16;
}

}  // namespace tandem::gpu
