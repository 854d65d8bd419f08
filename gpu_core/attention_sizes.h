// gpu_core/attention_sizes.h: the attention decode's split of the context and the head sizes of the
// prefill kernel (attention.cuh), in plain C++ so that host code uses them without the CUDA headers.
#pragma once

#include <cstdint>

namespace tandem::gpu {

// Context rows per split of attention_decode: one block per (query head, split) scores them and
// keeps its partial output, and combine merges the splits. 64 (was 256 until session 9: at a 4096-
// token context each block's sequential pass over 256 rows took ~96 us a layer on the H200).
constexpr int kAttnDecodeSplitRows = 64;

// AttentionDecodeArgs::max_splits for a cache of max_ctx rows (the partial scratch holds nh x this x
// (hd + 2) floats).
inline int64_t attention_decode_splits(int64_t max_ctx) { return (max_ctx + kAttnDecodeSplitRows - 1) / kAttnDecodeSplitRows; }

// The head sizes attention_prefill's tensor-core kernel is built for.
inline bool attention_prefill_fits(int64_t hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256; }

}  // namespace tandem::gpu
