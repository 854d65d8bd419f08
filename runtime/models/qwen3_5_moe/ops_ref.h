// runtime/models/qwen3_5_moe/ops_ref.h: the reference operators of the Qwen3.5-MoE forward, float32, written for clarity.
//
// These define the arithmetic every fast path (cpu_experts/, gpu_core/) is compared against, and
// follow HF transformers' Qwen3_5Moe modules (spec/qwen35-moe.md section 3). All buffers are
// contiguous float32; sizes are explicit; nothing here allocates per call except where noted.
#pragma once

#include <cstdint>

#include "core/row_format.h"

namespace tandem::ref {

float silu(float x);
float sigmoid(float x);
float softplus(float x);  // torch's: identity above 20

// Zero-centred RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w). In-place allowed (y == x).
void rmsnorm_zc(const float* x, const float* w, int64_t n, float eps, float* y);
// Gated RMSNorm of DeltaNet heads: y = (w * x * rsqrt(mean(x^2) + eps)) * silu(z).
void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, float eps, float* y);
// x *= rsqrt(sum(x^2) + eps)
void l2norm(float* x, int64_t n, float eps);

// NeoX-style rotation of the first `rotary_dim` dims of a head (pairs i, i + rotary_dim/2);
// inv_freq has rotary_dim/2 entries.
void rope_neox(float* head, int rotary_dim, const float* inv_freq, int64_t pos);
// inv_freq[i] = theta^(-2i / rotary_dim), computed as torch does (fp32).
void rope_inv_freq(double theta, int rotary_dim, float* inv_freq);

// One step of the causal depthwise conv + SiLU over `channels`. `window` holds the previous K-1
// inputs, oldest first, [K-1][channels]; it is shifted to include x. w is [channels][K] (w[.., K-1]
// multiplies the current input).
void causal_conv_step(const float* x, float* window, const float* w, int64_t channels, int kernel, float* y);

// One token of the gated delta rule for one value head. S is [dk][dv], k and q already
// L2-normalised (q also scaled by dk^-0.5). Decays, writes (delta rule), then reads: o = S^T q.
void delta_rule_step(float* S, const float* q, const float* k, const float* v, float g, float beta,
                     int dk, int dv, float* o);

// The same recurrence over C consecutive tokens at once, in the chunked form (what a GPU prefill
// kernel computes with matrix products): with G_t = g_1 + ... + g_t (within the chunk) and S0 the
// state before it,
//   delta_t = beta_t (v_t - e^{G_t} S0^T k_t) - sum_{s<t} beta_t e^{G_t - G_s} (k_t . k_s) delta_s   (forward substitution)
//   o_t     = e^{G_t} S0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) delta_s
//   S_C     = e^{G_C} S0 + sum_s e^{G_C - G_s} k_s delta_s^T
// (delta_t is the step's beta (v - S'^T k) of delta_rule_step). Rows: q, k [C][dk], v, o [C][dv];
// g, beta [C]. Equal to C delta_rule_step calls up to fp32 rounding.
void delta_rule_chunk(float* S, const float* q, const float* k, const float* v, const float* g, const float* beta, int C,
                      int dk, int dv, float* o);

// Causal attention of one query head over `n_ctx` cached positions (K/V rows of `head_dim`,
// `row_stride` floats apart); softmax in fp32 with scale.
void attend(const float* q, const float* k_cache, const float* v_cache, int64_t n_ctx, int64_t row_stride,
            int head_dim, float scale, float* scores_scratch, float* out);
// The same over a coded cache (core/row_format.h): a KV head's codes `row_stride` bytes apart and its
// scales `scale_stride` floats apart; each row's scale taken once, on the score and on the value weight.
struct CodedRows {
  const uint8_t* codes;
  const float* scales;
};
void attend_coded(const float* q, CodedRows k, CodedRows v, int64_t n_ctx, int64_t row_stride, int64_t scale_stride, int head_dim,
                  RowFormat f, float scale, float* scores_scratch, float* out);

// MoE routing: softmax over all experts, top-k (ties to the lower index, as torch.topk on CPU),
// weights renormalised to sum to 1.
void route_topk(const float* router_logits, int num_experts, int k, int* idx, float* weight);

}  // namespace tandem::ref
