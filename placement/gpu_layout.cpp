#include "placement/gpu_layout.h"

#include <algorithm>

#include "gpu_core/attention_sizes.h"
#include "gpu_core/deltanet_sizes.h"
#include "gpu_core/workspace_sizes.h"

namespace tandem::placement {

LinearPieces gpu_linear_pieces(int64_t out, int64_t in, bool int4, int64_t groups, bool act_order) {
  LinearPieces p;
  if (!int4) {
    p.w = align256(static_cast<uint64_t>(out * in) * 2);
    return p;
  }
  const int64_t G = groups;
  p.w = align256(static_cast<uint64_t>(out * in / 2));
  p.scales = align256(static_cast<uint64_t>(out * G) * 2);
  p.zeros = align256(static_cast<uint64_t>(out * G));
  if (act_order) p.perm = align256(static_cast<uint64_t>(in) * 4);
  return p;
}

uint64_t kv_cache_bytes(const ModelConfig& c, int64_t context, RowFormat kv) {
  return 2 * align256(static_cast<uint64_t>(context * gpu::kv_row_bytes(kv, c.num_kv_heads, c.head_dim)));
}
uint64_t conv_state_bytes(const ModelConfig& c) { return align256(static_cast<uint64_t>((c.linear_conv_kernel - 1) * c.linear_conv_dim()) * 4); }
uint64_t ssm_state_bytes(const ModelConfig& c) {
  return align256(static_cast<uint64_t>(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4);
}

uint64_t GpuWorkspace::total() const {
  uint64_t t = 0;
  for (uint64_t b : bytes) t += b;
  return t;
}

int64_t batched_chunk(const ModelConfig& c, int64_t prefill_chunk) {
  return prefill_chunk > 0 && gpu::attention_prefill_fits(c.head_dim) ? prefill_chunk : 0;
}

GpuWorkspace gpu_workspace(const ModelConfig& c, const WorkShape& s) {
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const int64_t conv = c.linear_conv_dim(), Vd = c.linear_value_dim(), Hv = c.linear_num_value_heads;
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  const int64_t nh2 = nh * 2 * hd, kvd = nkv * hd;
  const int64_t wide = std::max({H, conv, Vd, nh2, I * k, Is});
  GpuWorkspace w;
  auto set = [&](Work at, uint64_t bytes) { w.bytes[static_cast<int>(at)] = align256(bytes); };
  auto f32 = [&](Work at, int64_t n) { set(at, static_cast<uint64_t>(n) * 4); };
  f32(Work::h, H), f32(Work::x, H), f32(Work::o, H);
  f32(Work::qkv, slice4(conv) + slice4(Vd) + 2 * slice4(Hv));
  f32(Work::core, Vd), f32(Work::conv_out, conv);
  f32(Work::qg, slice4(nh2) + 2 * slice4(kvd));
  f32(Work::q_rot, nh * hd), f32(Work::attn_part, nh * gpu::attention_decode_splits(s.context) * (hd + 2)), f32(Work::attn_out, nh * hd);
  f32(Work::router, slice4(E) + 2 * slice4(Is) + slice4(1));
  f32(Work::moe_out, H), f32(Work::sd, H), f32(Work::logits, V);
  // the decode MoE's scratch: fp16 or fp32 h (moe_int4_decode, moe_bf16_decode), moe_int4_decode_wide's workspace
  auto moe_scratch = [&](int64_t n) {
    return std::max<uint64_t>(static_cast<uint64_t>(n * k * I) * 4, gpu::moe_int4_wide_workspace(std::min<int64_t>(n, gpu::kMaxGemvTokens), static_cast<int>(k), H, I));
  };
  set(Work::hscratch, moe_scratch(1));
  set(Work::xh, static_cast<uint64_t>(wide) * 2);
  set(Work::ids, 4), set(Work::topk_ids, static_cast<uint64_t>(k) * 4), f32(Work::topk_w, k), set(Work::route_ticket, 4), set(Work::pos, 16);  // pos: position, slot, the group table {0, 1}
  f32(Work::cpu_out, H);  // the host experts' sum (hybrid)
  const int64_t chunk = batched_chunk(c, s.prefill_chunk);
  if (s.deferral) f32(Work::deferred, (chunk > 0 ? chunk : 1) * H);
  // sampling on the GPU: the penalty list, top_k_rows's workspace (a row, or every row of a step), the k best ids and values
  set(Work::penalties, static_cast<uint64_t>(s.context) * gpu::kPenaltyBytes);
  const int64_t top_rows = s.decode_rows > 1 && chunk >= s.decode_rows ? s.decode_rows : 1;  // step_rows_top: every row in one launch
  set(Work::topk_ws, gpu::kTopKWorkspaceBytes * top_rows);
  set(Work::top_ids, gpu::kMaxTopK * 4), f32(Work::top_vals, gpu::kMaxTopK);
  if (chunk > 0) {
    const int64_t n = chunk, widest_k = std::max({H, Vd, nh * hd, Is, I});
    f32(Work::p_h, n * H), f32(Work::p_x, n * H), f32(Work::p_o, n * H), f32(Work::p_qkv, n * conv), f32(Work::p_z, n * Vd);
    f32(Work::p_b, n * Hv), f32(Work::p_a, n * Hv), f32(Work::p_core, n * Vd), f32(Work::p_conv, n * conv), f32(Work::p_qg, n * nh2);
    f32(Work::p_k, n * kvd), f32(Work::p_v, n * kvd), f32(Work::p_attn, n * nh * hd), f32(Work::p_router, n * E), f32(Work::p_moe, n * H);
    f32(Work::p_sg, n * Is), f32(Work::p_su, n * Is), f32(Work::p_sd, n * H), f32(Work::p_sgate, n), f32(Work::p_topk_w, n * k);
    f32(Work::p_cpu, n * H);
    set(Work::p_hs, moe_scratch(n));
    set(Work::p_split, static_cast<uint64_t>(2 * n * widest_k) * 2);
    set(Work::p_xh, static_cast<uint64_t>(n * wide) * 2);
    set(Work::p_ids, static_cast<uint64_t>(n) * 4), set(Work::p_pos, static_cast<uint64_t>(n) * 4);
    set(Work::p_topk_ids, static_cast<uint64_t>(n * k) * 4);
    set(Work::p_blas, gpu::kBlasWorkspaceBytes);
    if (Hv > 0) f32(Work::p_terms, gpu::deltanet_chunk_terms_floats(n, static_cast<int>(Hv)));
    if (s.int4_experts) set(Work::p_grouped, gpu::moe_int4_grouped_workspace(n, static_cast<int>(k), H, I, static_cast<int>(E)));
    // the largest decoder projection's codes as bf16: DeltaNet qkv / z / out, attention q / k / v / o, shared expert
    if (s.rows8_prefill) set(Work::p_rows8, static_cast<uint64_t>(H * std::max({conv, Vd, nh2, kvd, nh * hd, Is})) * 2);
  }
  if (s.decode_rows > 1 && chunk >= s.decode_rows) {
    const int64_t n = s.decode_rows;
    f32(Work::b_part, n * nh * gpu::attention_decode_splits(s.context) * (hd + 2));
    f32(Work::b_logits, n * V);
    set(Work::b_groups, static_cast<uint64_t>(5 * n + 1) * 4);  // ids, positions, each token's slot, each group's slot and first token
    set(Work::b_top, static_cast<uint64_t>(n * gpu::kMaxTopK) * 8);  // the k best ids and values of each row
  }
  if (s.kept_positions > 0 && chunk >= s.kept_positions) {
    int64_t layers = 0;
    for (LayerKind kind : c.layer_types) layers += kind == LayerKind::LinearAttention;
    set(Work::kept, static_cast<uint64_t>(layers * (s.kept_positions + 1)) * (conv_state_bytes(c) + ssm_state_bytes(c)));
  }
  return w;
}

int64_t decode_rows_for(const ModelConfig& c, int64_t prefill_chunk, int batch, int64_t kept_positions) {
  const int64_t chunk = batched_chunk(c, prefill_chunk);
  const int64_t rows = std::max<int64_t>(std::min<int64_t>(batch, gpu::kMaxGemvTokens), kept_positions);
  return chunk >= rows ? rows : 1;
}

}  // namespace tandem::placement
