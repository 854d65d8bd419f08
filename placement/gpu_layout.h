// placement/gpu_layout.h: the GPU model's device memory, piece by piece, from the config alone: the one
// definition Qwen35MoeGpu allocates from (runtime/models/qwen3_5_moe/gpu_load.cpp) and the planner counts
// (planner.cpp), so that the plan equals the allocation by construction. CUDA-free.
//
// Every piece is rounded up to 256 bytes on its own (the loader hands them out one after another from
// one device allocation), so a total does not depend on the order.
#pragma once

#include <array>
#include <cstdint>

#include "core/row_format.h"
#include "runtime/format/config.h"

namespace tandem::placement {

inline uint64_t align256(uint64_t b) { return (b + 255) / 256 * 256; }

// One nn.Linear as the GPU holds it: bf16 [out, in], or GPTQ int4 repacked (gpu_core/int4_layout.h):
// codes [out][in/8] u32, scales [out][groups] fp16, zeros [out][groups] u8, with act order the input
// order [in] int32.
struct LinearPieces {
  uint64_t w = 0, scales = 0, zeros = 0, perm = 0;
  uint64_t total() const { return w + scales + zeros + perm; }
};
// groups: scale groups along the input (int4; GPTQ stores in / group_size of them).
LinearPieces gpu_linear_pieces(int64_t out, int64_t in, bool int4, int64_t groups, bool act_order);

// Per layer: an attention layer's K and V caches (`context` rows of gpu::kv_row_bytes each: bf16 [kv
// heads, head dim], or int8 / fp8 codes and a scale per KV head), a DeltaNet layer's convolution and
// recurrent state (fp32).
uint64_t kv_cache_bytes(const ModelConfig& c, int64_t context, RowFormat kv);  // K and V of one attention layer
uint64_t conv_state_bytes(const ModelConfig& c);
uint64_t ssm_state_bytes(const ModelConfig& c);

// The workspace: activations of a decode step, the GPU sampler's buffers and, with batched prefill,
// the chunk's activations and the kernels' scratch. Stacked projections write one buffer each group
// (qkv = qkv|z|b|a, qg = q|k|v, router = router|shared gate|shared up|shared expert gate), each part
// starting at a multiple of 4 floats (slice4).
enum class Work : int {
  h, x, o, qkv, core, conv_out, qg, q_rot, attn_part, attn_out, router, moe_out, hscratch, sd, logits,  // fp32 decode activations
  xh, ids, topk_ids, topk_w, route_ticket, pos, cpu_out, deferred, penalties, topk_ws, top_ids, top_vals,
  p_h, p_x, p_o, p_qkv, p_z, p_b, p_a, p_core, p_conv, p_qg, p_k, p_v, p_attn, p_router, p_moe, p_sg, p_su, p_sd, p_sgate,
  p_topk_w, p_cpu, p_hs, p_split, p_xh, p_ids, p_pos, p_topk_ids, p_blas, p_terms, p_grouped, p_rows8,  // batched prefill
  b_part, b_logits, b_groups, b_top, kept,  // steps of several tokens of several sequences (decode_rows > 1)
  count
};
struct WorkShape {
  int64_t context = 0;
  int64_t prefill_chunk = 0;  // batched prefill's chunk (0: prompts token by token)
  bool int4_experts = false;  // GPTQ routed experts (the grouped kernel's scratch)
  bool deferral = false;      // experts.deferral: the deferred sum
  // Some decoder projection is 8-bit rows (dense.format, rules): a prompt chunk's GEMM reads its codes
  // as bf16 from scratch the size of the largest projection (gpu::gemm_rows8).
  bool rows8_prefill = false;
  // Tokens a batched decode / verification step takes at once (min(batch, gpu::kMaxGemvTokens) or the
  // verification length); above 1 it runs on the batched prefill's buffers (prefill_chunk > 0) plus
  // the attention splits, logits rows and group tables of that many tokens.
  int64_t decode_rows = 1;
  // Positions whose DeltaNet state a verification step keeps (Runner::Feed::keep_states): that many
  // + 1 copies of every DeltaNet layer's conv and recurrent state. 0: none.
  int64_t kept_positions = 0;
};
struct GpuWorkspace {
  std::array<uint64_t, static_cast<int>(Work::count)> bytes{};  // 0: not allocated
  uint64_t operator[](Work w) const { return bytes[static_cast<int>(w)]; }
  uint64_t total() const;
};
inline int64_t slice4(int64_t floats) { return (floats + 3) / 4 * 4; }
// The chunk batched prefill runs with: the asked one where the attention prefill kernel takes the
// head size, else 0 (prompts token by token).
int64_t batched_chunk(const ModelConfig& c, int64_t prefill_chunk);
GpuWorkspace gpu_workspace(const ModelConfig& c, const WorkShape& s);
// Tokens a batched step takes at once for `batch` sequences (1 without batched prefill: the steps then
// run one sequence at a time).
int64_t decode_rows_for(const ModelConfig& c, int64_t prefill_chunk, int batch, int64_t kept_positions);

}  // namespace tandem::placement
