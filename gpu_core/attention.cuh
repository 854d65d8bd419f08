// gpu_core/attention.cuh: gated full attention for decode (one new token), bf16 KV cache.
//
// attention_decode_prepare: for the token at position *pos (device int, so the step can live in a
//   CUDA graph): q heads = zero-centred RMSNorm(q, q_norm) then partial NeoX RoPE (first rotary_dim
//   dims, pairs (i, i + rotary_dim/2), angle pos * inv_freq[i]); k likewise with k_norm; k and raw v
//   are appended to the caches at row *pos. qg is q_proj's output [nh][2][hd] (query | gate per head).
// attention_decode: softmax(q . K^T * scale) V over rows 0..pos[t] for every query head (GQA: head h
//   reads kv head h / (nh / nkv)), split over the context in chunks combined with the log-sum-exp
//   rule, then multiplied by sigmoid(gate): out [nh * hd] fp32. The scoring blocks: one per (KV head,
//   split) for the group's query heads together, each K / V row read once a block, for hd 128 / 256
//   in groups of 4 / 8 (Qwen3.5's shapes); one per (query head, split) for every other shape.
// Caches: rows of kv_row_bytes(kv, nkv, hd) bytes a position (attention_sizes.h): bf16 [nkv][hd], or
// int8 / fp8 codes [nkv][hd] and an fp32 scale per KV head (core/row_format.h: each appended row is
// rounded per head, its largest magnitude the format's largest code; scores and values take the
// scale once a row). Limits: hd <= 256 and even rotary_dim <= hd.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_core/attention_sizes.h"

namespace tandem::gpu {

struct AttentionDecodeArgs {
  const float* qg = nullptr;       // [nh][2*hd]
  const float* k = nullptr;        // [nkv][hd]
  const float* v = nullptr;        // [nkv][hd]
  const float* q_norm = nullptr;   // [hd] (zero-centred weights)
  const float* k_norm = nullptr;   // [hd]
  const float* inv_freq = nullptr; // [rotary_dim/2]
  const int32_t* pos = nullptr;    // device scalar: position of this token
  uint8_t* k_cache = nullptr;      // [max_ctx] rows of kv_row_bytes(kv, nkv, hd) bytes
  uint8_t* v_cache = nullptr;
  RowFormat kv = RowFormat::Bf16;
  float* q_rot = nullptr;          // scratch [nh][hd]
  float* partial = nullptr;        // scratch [nh][max_splits][hd + 2]
  float* out = nullptr;            // [nh][hd]
  int nh = 0, nkv = 0, hd = 0, rotary_dim = 0, max_ctx = 0, max_splits = 32;
  float eps = 1e-6f, scale = 0.0f;
  // Decode of several tokens at once (attention_decode): token t (qg, k, v, q_rot, out rows t; partial
  // [tokens][nh][max_splits][hd + 2]) at position pos[t] of the sequence whose caches start slot[t] *
  // cache_stride bytes after k_cache / v_cache (slot nullptr: every token in that one cache). All
  // the tokens' keys and values are appended before any attends, so consecutive positions of one
  // sequence attend causally (a verification step).
  int tokens = 1;
  const int32_t* slot = nullptr;  // device [tokens]
  int64_t cache_stride = 0;
};

cudaError_t attention_decode(const AttentionDecodeArgs& args, cudaStream_t stream);

// attention_prefill: n consecutive tokens at once (a prefill chunk). qg [n][nh][2*hd], k / v
// [n][nkv][hd], pos[0..n) their positions (device array, increasing); q_rot scratch [n][nh][hd] (may
// be `out`: each block reads its queries before writing their outputs); out [n][nh*hd]; partial and
// max_splits unused. Keys and values of all n tokens are appended first, then token t attends to cache
// rows 0..pos[t] (causal, the chunk's earlier tokens included) in flash-attention form: key tiles in
// shared memory, a running max / sum per query.
// The products on tensor cores with the queries and the softmax weights rounded to bf16 (a bf16 cache
// as it is; an int8 / fp8 one's values times their scale, rounded to bf16 as a tile is loaded), fp32
// accumulation: equal to n attention_decode calls to ~3e-3 relative L2. Needs
// attention_prefill_fits(hd) (attention_sizes.h: hd 16, 32, 64, 128 or 256); cudaErrorInvalidValue
// otherwise.
cudaError_t attention_prefill(const AttentionDecodeArgs& args, int n, cudaStream_t stream);

}  // namespace tandem::gpu
