// The tensor table of a synthetic checkpoint and how each tensor is initialised. See synth.h.
//
// Scales (x = a post-norm input with rms ≈ 1, fan_in = the matrix's input size):
//  - input projections (q/k/v, in_proj_*, expert and shared gate/up): std 1/√fan_in, outputs rms ≈ 1;
//  - output projections (o_proj, out_proj, expert and shared down): std kOutGain/√fan_in, so each
//    sub-layer adds ≈ 0.2–0.4 rms to the residual stream and 80 sub-layers stay O(1) next to the
//    unit-std embeddings;
//  - router: kRouterGain/√H (logits std ≈ 2: peaked but not one-hot top-k weights) × skew multipliers;
//  - lm_head: kLmHeadGain/√H (logits std ≈ 3 after the final norm); ids without a token: zero rows;
//  - zero-centred norm weights N(0, 0.1); gated DeltaNet norm 1 + N(0, 0.1); conv1d N(0, 0.5);
//    A_log = log U(1, 16) (F32); dt_bias N(0, 1).
// GPTQ experts realise the same std: codes with std √10.5 around the zero 8, scales = std/√10.5 × U(0.8, 1.2).
#include <cmath>

#include "core/error.h"
#include "tools/synth/synth.h"

namespace tandem::synth {

namespace {

constexpr float kOutGain = 0.35f;
constexpr float kRouterGain = 2.0f;
constexpr float kLmHeadGain = 3.0f;
constexpr float kNormStd = 0.1f;
constexpr float kConvStd = 0.5f;
constexpr int kGroupSize = 128;
constexpr double kCodeStd = 3.2403703492039302;  // sqrt(10.5): std of 8 + u - v, u, v ~ U{0..7}

FillRecipe recipe(Fill kind, float a = 0.0f, float b = 1.0f) {
  FillRecipe f;
  f.kind = kind;
  f.a = a;
  f.b = b;
  return f;
}

struct Table {
  std::vector<PlannedTensor> out;

  void add(const std::string& name, DType dt, std::vector<int64_t> shape, FillRecipe f) {
    out.push_back({{name, dt, std::move(shape)}, std::move(f)});
  }
  void normal(const std::string& name, std::vector<int64_t> shape, float std, float mean = 0.0f,
              std::shared_ptr<const std::vector<float>> rows = nullptr) {
    FillRecipe f = recipe(Fill::Normal, mean, std);
    f.row_scale = std::move(rows);
    add(name, DType::BF16, std::move(shape), std::move(f));
  }
  void linear(const std::string& module, int64_t out_f, int64_t in_f, float gain = 1.0f) {
    normal(module + ".weight", {out_f, in_f}, gain / std::sqrt(static_cast<float>(in_f)));
  }
  // One GPTQ module (spec §4): qweight [in/8, out], qzeros [groups, out/8], scales [groups, out], g_idx [in].
  void gptq(const std::string& module, int64_t out_f, int64_t in_f, float target_std) {
    const int64_t groups = in_f / kGroupSize;
    add(module + ".qweight", DType::I32, {in_f / 8, out_f}, recipe(Fill::Int4Codes));
    FillRecipe zeros = recipe(Fill::Constant32);
    zeros.constant = 0x77777777u;  // v1 ("gptq") sym: stored zero 7, i.e. 8 - 1
    add(module + ".qzeros", DType::I32, {groups, out_f / 8}, zeros);
    add(module + ".scales", DType::F16, {groups, out_f},
        recipe(Fill::Scales, 0.2f, static_cast<float>(target_std / kCodeStd)));
    FillRecipe gi = recipe(Fill::GroupIndex);
    gi.group_size = kGroupSize;
    add(module + ".g_idx", DType::I32, {in_f}, gi);
  }
};

}  // namespace

std::vector<PlannedTensor> plan_tensors(const ModelConfig& c, Quant quant, const Vocab& vocab, double spread,
                                        uint64_t seed) {
  const int64_t H = c.hidden_size, V = c.vocab_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
  if (quant == Quant::GptqInt4 && (H % kGroupSize != 0 || I % kGroupSize != 0))
    fail("gptq-int4 needs hidden_size (", H, ") and moe_intermediate_size (", I, ") to be multiples of the group size ",
         kGroupSize);
  const std::string p = "model.language_model.";
  Table t;
  t.normal(p + "embed_tokens.weight", {V, H}, 1.0f);

  // One decoder layer under L (routing skew seeded by l); bf16_experts: fused BF16 experts whatever quant.
  auto layer = [&](const std::string& L, LayerKind kind, int l, bool bf16_experts) {
    t.normal(L + "input_layernorm.weight", {H}, kNormStd);
    if (kind == LayerKind::LinearAttention) {
      const std::string a = L + "linear_attn.";
      const int64_t conv = c.linear_conv_dim(), Vd = c.linear_value_dim(), Hv = c.linear_num_value_heads;
      t.linear(a + "in_proj_qkv", conv, H);
      t.linear(a + "in_proj_z", Vd, H);
      t.linear(a + "in_proj_b", Hv, H);
      t.linear(a + "in_proj_a", Hv, H);
      t.normal(a + "conv1d.weight", {conv, 1, c.linear_conv_kernel}, kConvStd);
      t.add(a + "A_log", DType::F32, {Hv}, recipe(Fill::LogUniform, 1.0f, 16.0f));
      t.normal(a + "dt_bias", {Hv}, 1.0f);
      t.normal(a + "norm.weight", {c.linear_value_head_dim}, kNormStd, 1.0f);
      t.linear(a + "out_proj", H, Vd, kOutGain);
    } else {
      const std::string a = L + "self_attn.";
      const int64_t hd = c.head_dim;
      t.linear(a + "q_proj", int64_t(c.num_heads) * hd * 2, H);
      t.linear(a + "k_proj", int64_t(c.num_kv_heads) * hd, H);
      t.linear(a + "v_proj", int64_t(c.num_kv_heads) * hd, H);
      t.linear(a + "o_proj", H, int64_t(c.num_heads) * hd, kOutGain);
      t.normal(a + "q_norm.weight", {hd}, kNormStd);
      t.normal(a + "k_norm.weight", {hd}, kNormStd);
    }
    t.normal(L + "post_attention_layernorm.weight", {H}, kNormStd);

    const std::string m = L + "mlp.";
    auto rows = std::make_shared<const std::vector<float>>(router_row_scales(c.num_experts, spread, seed, l));
    t.normal(m + "gate.weight", {E, H}, kRouterGain * inv_sqrt_h, 0.0f, rows);
    const float down_std = kOutGain / std::sqrt(static_cast<float>(I));
    if (quant == Quant::BF16 || bf16_experts) {
      t.normal(m + "experts.gate_up_proj", {E, 2 * I, H}, inv_sqrt_h);
      t.normal(m + "experts.down_proj", {E, H, I}, down_std);
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        t.gptq(x + "gate_proj", I, H, inv_sqrt_h);
        t.gptq(x + "up_proj", I, H, inv_sqrt_h);
        t.gptq(x + "down_proj", H, I, down_std);
      }
    }
    t.linear(m + "shared_expert.gate_proj", Is, H);
    t.linear(m + "shared_expert.up_proj", Is, H);
    t.linear(m + "shared_expert.down_proj", H, Is, kOutGain);
    t.linear(m + "shared_expert_gate", 1, H);
  };
  for (int l = 0; l < c.num_layers; ++l) layer(p + "layers." + std::to_string(l) + ".", c.layer_types[l], l, false);
  if (c.mtp_layers > 0) {  // the MTP head (spec section 3.6), BF16 in both official releases
    t.linear("mtp.fc", H, 2 * H);
    t.normal("mtp.pre_fc_norm_embedding.weight", {H}, kNormStd);
    t.normal("mtp.pre_fc_norm_hidden.weight", {H}, kNormStd);
    for (int l = 0; l < c.mtp_layers; ++l) layer("mtp.layers." + std::to_string(l) + ".", LayerKind::FullAttention, c.num_layers + l, true);
    t.normal("mtp.norm.weight", {H}, kNormStd);
  }
  t.normal(p + "norm.weight", {H}, kNormStd);

  // Ids that no token maps to (padding, and the gap before the special tokens) get zero rows.
  auto lm_rows = std::make_shared<std::vector<float>>(static_cast<size_t>(V), 0.0f);
  for (size_t i = 0; i < vocab.bpe_tokens && i < static_cast<size_t>(V); ++i) (*lm_rows)[i] = 1.0f;
  for (size_t i = 0; i < qwen_special_tokens().size(); ++i)
    if (vocab.special_base + static_cast<int64_t>(i) < V) (*lm_rows)[vocab.special_base + i] = 1.0f;
  t.normal("lm_head.weight", {V, H}, kLmHeadGain * inv_sqrt_h, 0.0f, std::move(lm_rows));
  return std::move(t.out);
}

}  // namespace tandem::synth
