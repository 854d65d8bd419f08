// gpu_core/deltanet_sizes.h: the chunked DeltaNet prefill's scratch size (deltanet.cuh), in plain C++
// so that the planner counts it without the CUDA headers.
#pragma once

#include <cstdint>

namespace tandem::gpu {

// The chunked prefill's chunk length, and the floats of its chunk terms (DeltaNetDecodeArgs::
// chunk_terms) per (chunk, value head): two 32 x 32 matrices and three vectors, padded to 64.
constexpr int kDeltaChunkTokens = 32;
constexpr int64_t kDeltaChunkTermFloats = 2176;

// Scratch floats for the chunk terms of T tokens over Hv value heads.
inline int64_t deltanet_chunk_terms_floats(int64_t T, int Hv) {
  return (T + kDeltaChunkTokens - 1) / kDeltaChunkTokens * Hv * kDeltaChunkTermFloats;
}

}  // namespace tandem::gpu
