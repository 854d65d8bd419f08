// The Qwen3.5-MoE decoder: tensor table + reference forward. See model.h and spec §2-§4.
#include "runtime/models/qwen3_5_moe/model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bytes.h"
#include "core/error.h"
#include "core/quantize_int4.h"
#include "runtime/models/qwen3_5_moe/ops_ref.h"

namespace tandem {

namespace {

constexpr std::initializer_list<DType> kFloatTypes = {DType::BF16, DType::F16, DType::F32};

std::vector<float> load_vector(const Checkpoint& c, const std::string& name, std::vector<int64_t> shape) {
  const TensorRef& t = c.get(name, shape, kFloatTypes);
  std::vector<float> v(static_cast<size_t>(t.info->numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.data, t.dtype(), static_cast<int64_t>(i));
  return v;
}

LinearWeight dense_view(const TensorRef& t, const std::string& module, int64_t out, int64_t in, int64_t row0 = 0) {
  LinearWeight w;
  w.kind = LinearWeight::Kind::Dense;
  w.name = module;
  w.out = out;
  w.in = in;
  w.dense_dtype = t.dtype();
  w.dense = t.data + row0 * in * dtype_size(t.dtype());
  return w;
}

void set_gptq_zero_offset(LinearWeight& w, GptqZeroFormat f) { w.gptq.zero_offset = f == GptqZeroFormat::V2 ? 0 : 1; }

// Loads one nn.Linear module: GPTQ tensors when quantization_config says the module is quantized,
// `<module>.weight` otherwise. `quantizable` is false for modules GPTQ never touches (router, gates).
LinearWeight load_linear(const Checkpoint& c, const ModelConfig& cfg, const std::string& module, int64_t out,
                         int64_t in, bool quantizable = true) {
  const auto q = quantizable ? cfg.quant.for_module(module) : QuantConfig::ModuleQuant{};
  if (!q.quantized) {
    if (!c.contains(module + ".weight") && c.contains(module + ".qweight"))
      fail(c.dir(), ": module '", module, "' is GPTQ-quantized in the checkpoint, but quantization_config",
           cfg.quant.gptq ? " (its dynamic rules) excludes it" : " is absent");
    return dense_view(c.get(module + ".weight", {out, in}, kFloatTypes), module, out, in);
  }
  if (!c.contains(module + ".qweight") && c.contains(module + ".weight"))
    fail(c.dir(), ": module '", module, "' has '", module, ".weight' but quantization_config says it is GPTQ-quantized",
         " (expected ", module, ".qweight; add a \"-:\" dynamic rule to exclude it)");
  if (in % 8 != 0 || out % 8 != 0)
    fail(c.dir(), ": module '", module, "' is ", out, "x", in, "; 4-bit GPTQ needs both sizes to be multiples of 8");
  const int64_t gs = q.group_size > 0 ? q.group_size : in;
  if (in % gs != 0) fail(c.dir(), ": module '", module, "': group_size ", gs, " does not divide in_features ", in);
  const int64_t groups = in / gs;

  LinearWeight w;
  w.kind = LinearWeight::Kind::Gptq;
  w.name = module;
  w.out = out;
  w.in = in;
  w.gptq.qweight = c.get(module + ".qweight", {in / 8, out}, {DType::I32}).as<int32_t>();
  w.gptq.qzeros = c.get(module + ".qzeros", {groups, out / 8}, {DType::I32}).as<int32_t>();
  const TensorRef& scales = c.get(module + ".scales", {groups, out}, kFloatTypes);
  w.gptq.scales = scales.data;
  w.gptq.scales_dtype = scales.dtype();
  w.gptq.group_size = gs;
  w.gptq.num_groups = groups;
  if (const TensorRef* gi = c.find(module + ".g_idx")) {
    const TensorRef& g = c.get(module + ".g_idx", {in}, {DType::I32});
    const int32_t* idx = g.as<int32_t>();
    bool trivial = true;
    for (int64_t k = 0; k < in; ++k) {
      if (idx[k] < 0 || idx[k] >= groups)
        fail(*gi->file, ": tensor '", module, ".g_idx'[", k, "] = ", idx[k], " is outside 0..", groups - 1);
      trivial = trivial && idx[k] == k / gs;
    }
    // A trivial g_idx (no act-order) is dropped so that kernels can use k / group_size.
    if (!trivial) w.gptq.g_idx = idx;
  } else if (q.desc_act) {
    fail(c.dir(), ": module '", module, "' uses act-order (desc_act) but '", module, ".g_idx' is missing");
  }
  return w;
}

// The reference routed experts: grouped by expert so that each weight row is rebuilt once per call.
void routed_experts_ref(const MoeWeights& w, const float* x, int64_t T, const int32_t* ids, const float* weights, int K,
                        float* out) {
  const int64_t H = w.down.empty() ? 0 : w.down[0].out, I = w.gate.empty() ? 0 : w.gate[0].out;
  const int E = static_cast<int>(w.gate.size());
  std::fill_n(out, T * H, 0.0f);
  std::vector<std::vector<std::pair<int64_t, float>>> users(E);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j)
      if (ids[t * K + j] >= 0) users[ids[t * K + j]].push_back({t, weights[t * K + j]});
  std::vector<float> xe, g, u, d;
  for (int e = 0; e < E; ++e) {
    const auto& us = users[e];
    if (us.empty()) continue;
    const int64_t n = static_cast<int64_t>(us.size());
    xe.resize(n * H);
    g.resize(n * I);
    u.resize(n * I);
    d.resize(n * H);
    for (int64_t i = 0; i < n; ++i) std::copy_n(x + us[i].first * H, H, xe.data() + i * H);
    linear_ref(w.gate[e], xe.data(), n, g.data());
    linear_ref(w.up[e], xe.data(), n, u.data());
    for (int64_t i = 0; i < n * I; ++i) g[i] = ref::silu(g[i]) * u[i];
    linear_ref(w.down[e], g.data(), n, d.data());
    for (int64_t i = 0; i < n; ++i) {
      float* o = out + us[i].first * H;
      const float s = us[i].second;
      for (int64_t k = 0; k < H; ++k) o[k] += s * d[i * H + k];
    }
  }
}

}  // namespace

std::unique_ptr<Qwen35Moe> Qwen35Moe::load(const std::string& dir) {
  auto m = std::unique_ptr<Qwen35Moe>(new Qwen35Moe());
  m->cfg_ = load_model_config(dir);
  m->ckpt_ = Checkpoint::open(dir);
  m->load_weights();
  return m;
}

LayerWeights Qwen35Moe::load_layer(const std::string& p, LayerKind kind, bool fused) const {
  const ModelConfig& c = cfg_;
  const Checkpoint& ck = ckpt_;
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  LayerWeights L;
  L.kind = kind;
  L.input_norm = load_vector(ck, p + "input_layernorm.weight", {H});
  L.post_attention_norm = load_vector(ck, p + "post_attention_layernorm.weight", {H});
  if (L.kind == LayerKind::LinearAttention) {
    const std::string a = p + "linear_attn.";
    const int64_t conv_dim = c.linear_conv_dim(), Vd = c.linear_value_dim(), Hv = c.linear_num_value_heads;
    DeltaNetWeights& d = L.deltanet;
    d.in_proj_qkv = load_linear(ck, c, a + "in_proj_qkv", conv_dim, H);
    d.in_proj_z = load_linear(ck, c, a + "in_proj_z", Vd, H);
    d.in_proj_b = load_linear(ck, c, a + "in_proj_b", Hv, H);
    d.in_proj_a = load_linear(ck, c, a + "in_proj_a", Hv, H);
    d.out_proj = load_linear(ck, c, a + "out_proj", H, Vd);
    d.conv = load_vector(ck, a + "conv1d.weight", {conv_dim, 1, c.linear_conv_kernel});
    d.A_log = load_vector(ck, a + "A_log", {Hv});
    d.dt_bias = load_vector(ck, a + "dt_bias", {Hv});
    d.norm = load_vector(ck, a + "norm.weight", {c.linear_value_head_dim});
  } else {
    const std::string a = p + "self_attn.";
    const int64_t hd = c.head_dim;
    AttentionWeights& w = L.attn;
    w.q_proj = load_linear(ck, c, a + "q_proj", c.num_heads * hd * 2, H);
    w.k_proj = load_linear(ck, c, a + "k_proj", c.num_kv_heads * hd, H);
    w.v_proj = load_linear(ck, c, a + "v_proj", c.num_kv_heads * hd, H);
    w.o_proj = load_linear(ck, c, a + "o_proj", H, c.num_heads * hd);
    w.q_norm = load_vector(ck, a + "q_norm.weight", {hd});
    w.k_norm = load_vector(ck, a + "k_norm.weight", {hd});
  }
  const std::string m = p + "mlp.";
  MoeWeights& moe = L.moe;
  moe.router = load_linear(ck, c, m + "gate", E, H, false);
  moe.shared_gate = load_linear(ck, c, m + "shared_expert.gate_proj", Is, H);
  moe.shared_up = load_linear(ck, c, m + "shared_expert.up_proj", Is, H);
  moe.shared_down = load_linear(ck, c, m + "shared_expert.down_proj", H, Is);
  moe.shared_expert_gate = load_linear(ck, c, m + "shared_expert_gate", 1, H, false);
  moe.gate.resize(E);
  moe.up.resize(E);
  moe.down.resize(E);
  if (fused) {
    // Official layout: gate_up_proj [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up), down_proj [E, H, I].
    const TensorRef& gu = ck.get(m + "experts.gate_up_proj", {E, 2 * I, H}, kFloatTypes);
    const TensorRef& dn = ck.get(m + "experts.down_proj", {E, H, I}, kFloatTypes);
    for (int64_t e = 0; e < E; ++e) {
      const std::string ex = m + "experts." + std::to_string(e) + ".";
      moe.gate[e] = dense_view(gu, ex + "gate_proj", I, H, e * 2 * I);
      moe.up[e] = dense_view(gu, ex + "up_proj", I, H, e * 2 * I + I);
      moe.down[e] = dense_view(dn, ex + "down_proj", H, I, e * H);
    }
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const std::string ex = m + "experts." + std::to_string(e) + ".";
      moe.gate[e] = load_linear(ck, c, ex + "gate_proj", I, H);
      moe.up[e] = load_linear(ck, c, ex + "up_proj", I, H);
      moe.down[e] = load_linear(ck, c, ex + "down_proj", H, I);
    }
  }
  return L;
}

void Qwen35Moe::load_weights() {
  const ModelConfig& c = cfg_;
  const Checkpoint& ck = ckpt_;
  if (ck.contains("model.language_model.embed_tokens.weight")) prefix_ = "model.language_model.";
  else if (ck.contains("model.embed_tokens.weight")) prefix_ = "model.";
  else fail(ck.dir(), ": no embedding tensor (expected 'model.language_model.embed_tokens.weight' or 'model.embed_tokens.weight')");

  const int64_t H = c.hidden_size, V = c.vocab_size;
  embed_ = dense_view(ck.get(prefix_ + "embed_tokens.weight", {V, H}, kFloatTypes), prefix_ + "embed_tokens", V, H);
  if (ck.contains("lm_head.weight")) lm_head_ = load_linear(ck, c, "lm_head", V, H, false);
  else if (c.tie_word_embeddings) lm_head_ = embed_;
  else fail(ck.dir(), ": tensor 'lm_head.weight' is missing (and tie_word_embeddings is false)");
  final_norm_ = load_vector(ck, prefix_ + "norm.weight", {H});

  const bool fused = ck.contains(prefix_ + "layers.0.mlp.experts.gate_up_proj");
  expert_layout_ = fused ? "fused" : "per-expert";

  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) layers_[l] = load_layer(prefix_ + "layers." + std::to_string(l) + ".", c.layer_types[l], fused);
  // The MTP head when the checkpoint carries it whole (community quants may leave it out, and a test
  // fixture carries a few of its tensors only: both load without it).
  if (c.mtp_layers > 0 && ck.contains("mtp.fc.weight") && ck.contains("mtp.layers.0.mlp.gate.weight")) {
    if (c.mtp_layers != 1) fail(ck.dir(), ": mtp_num_hidden_layers ", c.mtp_layers, " (the MTP head has one decoder layer in Qwen3.5)");
    MtpWeights m;
    m.fc = load_linear(ck, c, "mtp.fc", H, 2 * H, false);
    m.pre_fc_norm_embedding = load_vector(ck, "mtp.pre_fc_norm_embedding.weight", {H});
    m.pre_fc_norm_hidden = load_vector(ck, "mtp.pre_fc_norm_hidden.weight", {H});
    m.norm = load_vector(ck, "mtp.norm.weight", {H});
    m.layer = load_layer("mtp.layers.0.", LayerKind::FullAttention, ck.contains("mtp.layers.0.mlp.experts.gate_up_proj"));
    mtp_ = std::move(m);
  }

  if (c.quant.gptq) {
    // v1 ("gptq") stores zero-1, v2 stores zero. Without checkpoint_format, a symmetric checkpoint
    // tells by its data: every stored zero is 7 (v1) or 8 (v2).
    GptqZeroFormat fmt = c.quant.zero_format;
    auto first_quantized = [&]() -> const LinearWeight* {
      for (const auto& L : layers_)
        for (const auto& w : L.moe.gate)
          if (w.kind == LinearWeight::Kind::Gptq) return &w;
      return nullptr;
    };
    if (fmt == GptqZeroFormat::Unknown) {
      const LinearWeight* w = first_quantized();
      fmt = w && static_cast<uint32_t>(w->gptq.qzeros[0]) == 0x88888888u ? GptqZeroFormat::V2 : GptqZeroFormat::V1;
    }
    auto fix = [&](LinearWeight& w) {
      if (w.kind == LinearWeight::Kind::Gptq) set_gptq_zero_offset(w, fmt);
    };
    std::vector<LayerWeights*> all;
    for (auto& L : layers_) all.push_back(&L);
    if (mtp_) all.push_back(&mtp_->layer);
    for (LayerWeights* Lp : all) {
      LayerWeights& L = *Lp;
      for (auto* w : {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.deltanet.in_proj_qkv,
                      &L.deltanet.in_proj_z, &L.deltanet.in_proj_a, &L.deltanet.in_proj_b, &L.deltanet.out_proj,
                      &L.moe.shared_gate, &L.moe.shared_up, &L.moe.shared_down})
        fix(*w);
      for (auto* v : {&L.moe.gate, &L.moe.up, &L.moe.down})
        for (auto& w : *v) fix(w);
    }
    expert_layout_ = str_cat("GPTQ-Int4 (", fmt == GptqZeroFormat::V2 ? "v2" : "v1", " zeros, ",
                             c.quant.sym ? "sym" : "asym", c.quant.desc_act ? ", act-order" : "", ", group ",
                             c.quant.group_size, ")");
  }

  inv_freq_.resize(c.rotary_dim / 2);
  ref::rope_inv_freq(c.rope_theta, c.rotary_dim, inv_freq_.data());
}

std::string Qwen35Moe::layout_description() const {
  return str_cat(prefix_ == "model." ? "text-only names" : "composite names", ", experts ", expert_layout_);
}

namespace {

// The routed experts of `layers` and of the head's layer (when there is one) stored in a floating-point
// format: pointers to const for a const model, to change for one being quantized.
template <typename Layers, typename Head>
auto float_experts_of(Layers& layers, Head* head) {
  std::vector<decltype(&layers[0].moe.gate[0])> out;
  auto add = [&](auto& L) {
    for (auto* v : {&L.moe.gate, &L.moe.up, &L.moe.down})
      for (auto& w : *v)
        if (w.kind == LinearWeight::Kind::Dense) out.push_back(&w);
  };
  for (auto& L : layers) add(L);
  if (head) add(*head);
  return out;
}

}  // namespace

std::vector<const LinearWeight*> Qwen35Moe::float_experts() const { return float_experts_of(layers_, mtp_ ? &mtp_->layer : nullptr); }

int64_t Qwen35Moe::int4_expert_group_size() const { return int4_expert_group(cfg_.hidden_size, cfg_.moe_intermediate_size); }

std::string Qwen35Moe::quantize_experts_int4(const std::string& cache_root, std::FILE* log) {
  if (expert_cache_) return {};
  const std::vector<LinearWeight*> todo = float_experts_of(layers_, mtp_ ? &mtp_->layer : nullptr);
  if (todo.empty()) return {};
  const std::vector<const LinearWeight*> src(todo.begin(), todo.end());
  const int64_t group = int4_expert_group_size();
  if (group == 0)
    fail(ckpt_.dir(), ": --experts-format int4: this model's experts (hidden ", cfg_.hidden_size, ", intermediate ", cfg_.moe_intermediate_size,
         ") have no int4 group (both sizes must be multiples of 32); run them as stored");
  const bool model_experts = !gptq_experts(), head_experts = mtp_ && mtp_->layer.moe.gate[0].kind == LinearWeight::Kind::Dense;
  auto cache = std::make_unique<Int4Cache>(open_int4_cache(ckpt_.dir(), cache_root, src, group, log));
  for (LinearWeight* w : todo) *w = cache->view(w->name, w->out, w->in);
  expert_cache_ = std::move(cache);
  const std::string what = model_experts && head_experts ? "routed experts and the MTP head's" : model_experts ? "routed experts" : "MTP head's experts";
  const std::string from = expert_layout_;
  expert_layout_ = str_cat(from, ", ", what, " quantized on load to int4 (asym, group ", group, ")");
  const double mib = static_cast<double>(expert_cache_->bytes) / (1 << 20);
  char size[32];
  std::snprintf(size, sizeof size, mib >= 1024 ? "%.2f GiB" : "%.1f MiB", mib >= 1024 ? mib / 1024 : mib);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", expert_cache_->seconds);
  return str_cat(what, " as int4: ", src.size(), " matrices, ", size, expert_cache_->built ? ", quantized in " : ", from the cache in ", secs,
                 " (", expert_cache_->dir, ")");
}

bool Qwen35Moe::gptq_experts() const {
  for (const LayerWeights& L : layers_)
    if (!L.moe.gate.empty()) return L.moe.gate[0].kind == LinearWeight::Kind::Gptq;
  return false;
}

WeightBytes Qwen35Moe::weight_bytes() const {
  WeightBytes b;
  auto vec = [](const std::vector<float>& v, uint64_t elem) { return v.size() * elem; };
  uint64_t dense = lm_head_.stored_bytes() + vec(final_norm_, 2);
  const uint64_t embed_row = static_cast<uint64_t>(embed_.in) * dtype_size(embed_.dense_dtype);
  for (const LayerWeights& L : layers_) {
    dense += vec(L.input_norm, 2) + vec(L.post_attention_norm, 2);
    for (const LinearWeight* w : {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.deltanet.in_proj_qkv,
                                  &L.deltanet.in_proj_z, &L.deltanet.in_proj_a, &L.deltanet.in_proj_b,
                                  &L.deltanet.out_proj, &L.moe.router, &L.moe.shared_gate, &L.moe.shared_up,
                                  &L.moe.shared_down, &L.moe.shared_expert_gate})
      dense += w->stored_bytes();
    dense += vec(L.deltanet.conv, 2) + vec(L.attn.q_norm, 2) + vec(L.attn.k_norm, 2);
    uint64_t experts = 0;
    for (int64_t e = 0; e < static_cast<int64_t>(L.moe.gate.size()); ++e)
      experts += L.moe.gate[e].stored_bytes() + L.moe.up[e].stored_bytes() + L.moe.down[e].stored_bytes();
    b.routed_experts += experts;
    if (!L.moe.gate.empty()) b.routed_active += experts / L.moe.gate.size() * cfg_.num_experts_per_tok;
  }
  b.non_expert = dense + embed_.stored_bytes() * (lm_head_.dense == embed_.dense ? 0 : 1);
  b.per_token_active = b.routed_active + dense + embed_row;
  return b;
}

void KvRows::append(const float* rows, int64_t n, int w, int h, RowFormat f) {
  if (width == 0) width = w, heads = h;
  if (w != width || h != heads) fail("KvRows::append: rows of ", w, " values in ", h, " heads after ", width, " in ", heads);
  if (f == RowFormat::Bf16) {
    values.insert(values.end(), rows, rows + n * w);
    return;
  }
  const int64_t hd = w / h, at = static_cast<int64_t>(codes.size());
  codes.resize(static_cast<size_t>(at + n * w));
  for (int64_t t = 0; t < n; ++t)
    for (int j = 0; j < h; ++j) scales.push_back(quantize_row(rows + t * w + j * hd, hd, f, codes.data() + at + t * w + j * hd));
}

void KvRows::truncate(int64_t p) {
  if (p >= positions()) return;
  if (!values.empty()) {
    values.resize(static_cast<size_t>(p * width));
  } else {
    codes.resize(static_cast<size_t>(p * width));
    scales.resize(static_cast<size_t>(p * heads));
  }
}

Qwen35State Qwen35Moe::new_state() const {
  Qwen35State s;
  const int n = cfg_.num_layers;
  s.k_cache.resize(n);
  s.v_cache.resize(n);
  s.conv_window.resize(n);
  s.recurrent.resize(n);
  for (int l = 0; l < n; ++l) {
    if (cfg_.layer_types[l] != LayerKind::LinearAttention) continue;
    s.conv_window[l].assign(static_cast<size_t>((cfg_.linear_conv_kernel - 1) * cfg_.linear_conv_dim()), 0.0f);
    s.recurrent[l].assign(static_cast<size_t>(cfg_.linear_num_value_heads) * cfg_.linear_key_head_dim *
                              cfg_.linear_value_head_dim, 0.0f);
  }
  return s;
}

// A forward_batch call: its sequences, where each one's rows start in the step ([seqs + 1]), and the
// states' backend.
struct Qwen35Moe::Step {
  std::span<const SeqTokens> seqs;
  std::vector<int64_t> first;  // rows of sequence i: first[i] .. first[i + 1]
  MatmulBackend* backend = nullptr;
  const Qwen35State* lead = nullptr;  // the deferral setting (every state's is the same)
  int64_t rows() const { return first.back(); }
  void linear(const LinearWeight& w, const float* x, int64_t T, float* y) const {
    if (backend) backend->linear(w, x, T, y);
    else linear_ref(w, x, T, y);
  }
};

void Qwen35State::rollback(int64_t keep) {
  if (kept.empty()) fail("rollback: the last step of this sequence kept no states (feed it with keep_states)");
  const int64_t n = static_cast<int64_t>(kept.size()) - 1;
  if (keep < 0 || keep > n) fail("rollback: keep ", keep, " is outside 0..", n, " (the tokens of the last kept step)");
  Kept& k = kept[keep];
  for (size_t l = 0; l < recurrent.size(); ++l) {
    if (!k.recurrent[l].empty()) recurrent[l].swap(k.recurrent[l]);
    if (!k.conv_window[l].empty()) conv_window[l].swap(k.conv_window[l]);
  }
  pos = kept_from + keep;
  for (size_t l = 0; l < k_cache.size(); ++l) {
    k_cache[l].truncate(pos);
    v_cache[l].truncate(pos);
  }
  kept.clear();
  kept_from = -1;
}

void Qwen35Moe::forward(Qwen35State& st, std::span<const int32_t> ids, float* logits, const TensorTap& tap,
                        LogitRows rows) const {
  const SeqTokens one{&st, ids, logits, rows, false};
  forward_batch(std::span(&one, 1), tap);
}

void Qwen35Moe::forward_batch(std::span<const SeqTokens> seqs, const TensorTap& tap) const {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  Step step;
  step.seqs = seqs;
  step.first.assign(1, 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqTokens& s = seqs[i];
    if (!s.state) fail("forward_batch: sequence ", i, " has no state");
    if (s.ids.empty()) fail("forward_batch: sequence ", i, " feeds no tokens");
    for (size_t t = 0; t < s.ids.size(); ++t)
      if (s.ids[t] < 0 || s.ids[t] >= V) fail("token id ", s.ids[t], " at position ", t, " is outside the vocabulary (0..", V - 1, ")");
    for (size_t j = 0; j < i; ++j)
      if (seqs[j].state == s.state) fail("forward_batch: sequences ", j, " and ", i, " share one state");
    if (s.state->backend != seqs[0].state->backend || s.state->defer_experts != seqs[0].state->defer_experts ||
        s.state->deferrable != seqs[0].state->deferrable)
      fail("forward_batch: sequence ", i, " has another backend or deferral setting than sequence 0");
    step.first.push_back(step.first.back() + static_cast<int64_t>(s.ids.size()));
  }
  if (seqs.empty()) return;
  step.backend = seqs[0].state->backend;
  step.lead = seqs[0].state;
  const int64_t T = step.rows();
  auto emit = [&](const char* name, int layer, const float* d, int64_t rows, int64_t cols) {
    if (tap) tap(name, layer, d, rows, cols);
  };
  const float eps = static_cast<float>(c.rms_norm_eps);

  for (const SeqTokens& s : seqs) {  // the states to keep start with the state before the step
    Qwen35State& st = *s.state;
    st.kept.clear();
    st.kept_from = -1;
    if (!s.keep_states) continue;
    st.kept.resize(s.ids.size() + 1);
    for (Qwen35State::Kept& k : st.kept) {
      k.conv_window.resize(st.conv_window.size());
      k.recurrent.resize(st.recurrent.size());
    }
    st.kept[0].conv_window = st.conv_window;
    st.kept[0].recurrent = st.recurrent;
    st.kept_from = st.pos;
  }

  std::vector<float> h(T * H), x(T * H), out(T * H), pending, deferred;
  int64_t t = 0;
  for (const SeqTokens& s : seqs)
    for (const int32_t id : s.ids) embed_.dequant_row(id, h.data() + t++ * H);
  emit("embed", -1, h.data(), T, H);

  for (int l = 0; l < c.num_layers; ++l) decoder_layer(layers_[l], l, step, h, x, out, pending, deferred, tap);
  for (size_t i = 0; i < pending.size(); ++i) h[i] += pending[i];  // the last layer's deferred experts

  // The final norm and lm_head over the rows asked for only, in step order; every row of a sequence
  // that wants its hidden states.
  std::vector<int64_t> wanted;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].hidden) {
      for (int64_t r = step.first[i]; r < step.first[i + 1]; ++r) {
        float* dst = seqs[i].hidden + (r - step.first[i]) * H;
        ref::rmsnorm_zc(h.data() + r * H, final_norm_.data(), H, eps, dst);
      }
    }
    if (!seqs[i].logits) continue;
    const int64_t from = seqs[i].rows == LogitRows::Last ? step.first[i + 1] - 1 : step.first[i];
    for (int64_t r = from; r < step.first[i + 1]; ++r) wanted.push_back(r);
  }
  const int64_t n_out = static_cast<int64_t>(wanted.size());
  for (int64_t j = 0; j < n_out; ++j) ref::rmsnorm_zc(h.data() + wanted[j] * H, final_norm_.data(), H, eps, x.data() + j * H);
  emit("final_norm", -1, x.data(), n_out, H);
  if (n_out > 0) {
    const bool direct = seqs.size() == 1;  // one sequence: its rows are the buffer's
    std::vector<float> all(direct ? 0 : static_cast<size_t>(n_out * V));
    float* dst = direct ? seqs[0].logits : all.data();
    step.linear(lm_head_, x.data(), n_out, dst);
    emit("logits", -1, dst, n_out, V);
    for (size_t i = 0, j = 0; !direct && i < seqs.size(); ++i) {
      if (!seqs[i].logits) continue;
      const int64_t n = seqs[i].rows == LogitRows::Last ? 1 : step.first[i + 1] - step.first[i];
      std::copy_n(all.data() + j * V, n * V, seqs[i].logits);
      j += static_cast<size_t>(n);
    }
  }
  for (const SeqTokens& s : seqs) s.state->pos += static_cast<int64_t>(s.ids.size());
}

void Qwen35Moe::decoder_layer(const LayerWeights& L, int l, const Step& step, std::vector<float>& h, std::vector<float>& x,
                              std::vector<float>& out, std::vector<float>& pending, std::vector<float>& deferred,
                              const TensorTap& tap) const {
  const int64_t H = cfg_.hidden_size, T = step.rows();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  auto emit = [&](const char* name, const float* d) {
    if (tap) tap(name, l, d, T, H);
  };
  for (int64_t r = 0; r < T; ++r) ref::rmsnorm_zc(h.data() + r * H, L.input_norm.data(), H, eps, x.data() + r * H);
  emit("attn_norm", x.data());
  if (L.kind == LayerKind::LinearAttention) deltanet_forward(L, l, step, x.data(), out.data(), tap);
  else attention_forward(L, l, step, x.data(), out.data(), tap);
  for (int64_t i = 0; i < T * H; ++i) h[i] += out[i];
  for (int64_t r = 0; r < T; ++r) ref::rmsnorm_zc(h.data() + r * H, L.post_attention_norm.data(), H, eps, x.data() + r * H);
  emit("ffn_norm", x.data());
  moe_forward(L, l, step, x.data(), out.data(), deferred, tap);
  for (int64_t i = 0; i < T * H; ++i) h[i] += out[i];
  if (step.lead->defer_experts > 0) {  // the previous layer's deferred experts arrive with this layer's MoE output
    for (size_t i = 0; i < pending.size(); ++i) h[i] += pending[i];
    pending.swap(deferred);
  }
  emit("layer_out", h.data());
}

Qwen35State Qwen35Moe::new_mtp_state() const {
  Qwen35State s;
  const size_t n = static_cast<size_t>(cfg_.num_layers) + 1;  // the head's layer sits at index num_layers
  s.k_cache.resize(n);
  s.v_cache.resize(n);
  s.conv_window.resize(n);
  s.recurrent.resize(n);
  return s;
}

void Qwen35Moe::mtp_forward(Qwen35State& st, std::span<const int32_t> ids, const float* hidden, float* logits, LogitRows rows,
                            float* hidden_out, const TensorTap& tap) const {
  if (!mtp_) fail(ckpt_.dir(), ": the checkpoint has no MTP head (mtp.* tensors), which drafting needs");
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, V = c.vocab_size, T = static_cast<int64_t>(ids.size());
  if (T == 0) fail("mtp_forward: no rows");
  if (st.k_cache.size() != static_cast<size_t>(c.num_layers) + 1) fail("mtp_forward: the state is not an MTP head state (new_mtp_state)");
  if (st.defer_experts != 0) fail("mtp_forward: the head defers no experts");
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V) fail("token id ", ids[t], " at position ", t, " is outside the vocabulary (0..", V - 1, ")");
  const SeqTokens one{&st, ids, logits, rows, false};
  Step step;
  step.seqs = std::span(&one, 1);
  step.first = {0, T};
  step.backend = st.backend;
  step.lead = &st;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int layer = c.num_layers;

  // x = fc([RMSNorm_e(embed(id)) ; RMSNorm_h(h)]), the embedding half first
  std::vector<float> cat(T * 2 * H), e(H), h(T * H), x(T * H), out(T * H), pending, deferred;
  for (int64_t t = 0; t < T; ++t) {
    embed_.dequant_row(ids[t], e.data());
    ref::rmsnorm_zc(e.data(), mtp_->pre_fc_norm_embedding.data(), H, eps, cat.data() + t * 2 * H);
    ref::rmsnorm_zc(hidden + t * H, mtp_->pre_fc_norm_hidden.data(), H, eps, cat.data() + t * 2 * H + H);
  }
  step.linear(mtp_->fc, cat.data(), T, h.data());
  if (tap) tap("mtp_fc", layer, h.data(), T, H);
  decoder_layer(mtp_->layer, layer, step, h, x, out, pending, deferred, tap);

  const int64_t from = rows == LogitRows::Last ? T - 1 : 0, n = T - from;
  for (int64_t r = 0; r < n; ++r) ref::rmsnorm_zc(h.data() + (from + r) * H, mtp_->norm.data(), H, eps, x.data() + r * H);
  if (tap) tap("mtp_norm", layer, x.data(), n, H);
  if (hidden_out) std::copy_n(x.data(), n * H, hidden_out);
  if (logits) {
    step.linear(lm_head_, x.data(), n, logits);
    if (tap) tap("mtp_logits", layer, logits, n, V);
  }
  st.pos += T;
}

void Qwen35Moe::deltanet_forward(const LayerWeights& L, int layer, const Step& step, const float* x, float* out,
                                 const TensorTap& tap) const {
  const ModelConfig& c = cfg_;
  const DeltaNetWeights& w = L.deltanet;
  const int64_t conv_dim = c.linear_conv_dim(), Kd = c.linear_key_dim(), Vd = c.linear_value_dim(), T = step.rows();
  const int Hv = c.linear_num_value_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int group = Hv / c.linear_num_key_heads;  // v head h reads q/k head h / group
  const float eps = static_cast<float>(c.rms_norm_eps);

  std::vector<float> qkv(T * conv_dim), conv(T * conv_dim), z(T * Vd), b(T * Hv), a(T * Hv), core(T * Vd);
  step.linear(w.in_proj_qkv, x, T, qkv.data());
  step.linear(w.in_proj_z, x, T, z.data());
  step.linear(w.in_proj_b, x, T, b.data());
  step.linear(w.in_proj_a, x, T, a.data());
  for (size_t i = 0; i < step.seqs.size(); ++i) {
    Qwen35State& st = *step.seqs[i].state;
    const bool keep = step.seqs[i].keep_states;
    float* window = st.conv_window[layer].data();
    for (int64_t t = step.first[i]; t < step.first[i + 1]; ++t) {
      ref::causal_conv_step(qkv.data() + t * conv_dim, window, w.conv.data(), conv_dim, c.linear_conv_kernel,
                            conv.data() + t * conv_dim);
      if (keep) st.kept[t - step.first[i] + 1].conv_window[layer] = st.conv_window[layer];
    }
    if (keep)
      for (size_t k = 1; k < st.kept.size(); ++k) st.kept[k].recurrent[layer].resize(st.recurrent[layer].size());
  }
  if (tap) tap("linear_attn_conv", layer, conv.data(), T, conv_dim);

  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const int64_t n_seqs = static_cast<int64_t>(step.seqs.size());
  // (sequence, head) pairs are independent: each owns its [dk][dv] state; a sequence's tokens go in order.
#pragma omp parallel for collapse(2) schedule(static) if (int64_t(Hv) * dk * dv * T >= (int64_t(1) << 16))
  for (int64_t i = 0; i < n_seqs; ++i)
    for (int h = 0; h < Hv; ++h) {
      Qwen35State& st = *step.seqs[i].state;
      const bool keep = step.seqs[i].keep_states;
      float* S = st.recurrent[layer].data() + int64_t(h) * dk * dv;
      std::vector<float> q(dk), k(dk), o(dv);
      const int kh = h / group;
      for (int64_t t = step.first[i]; t < step.first[i + 1]; ++t) {
        const float* ct = conv.data() + t * conv_dim;
        std::copy_n(ct + kh * dk, dk, q.data());
        std::copy_n(ct + Kd + kh * dk, dk, k.data());
        ref::l2norm(q.data(), dk, 1e-6f);
        ref::l2norm(k.data(), dk, 1e-6f);
        for (float& v : q) v *= q_scale;
        const float* v = ct + 2 * Kd + int64_t(h) * dv;
        const float beta = ref::sigmoid(b[t * Hv + h]);
        const float g = -std::exp(w.A_log[h]) * ref::softplus(a[t * Hv + h] + w.dt_bias[h]);
        ref::delta_rule_step(S, q.data(), k.data(), v, g, beta, dk, dv, o.data());
        ref::rmsnorm_gated(o.data(), z.data() + t * Vd + int64_t(h) * dv, w.norm.data(), dv, eps,
                           core.data() + t * Vd + int64_t(h) * dv);
        if (keep) std::copy_n(S, int64_t(dk) * dv, st.kept[t - step.first[i] + 1].recurrent[layer].data() + int64_t(h) * dk * dv);
      }
    }
  if (tap) tap("linear_attn_core", layer, core.data(), T, Vd);
  step.linear(w.out_proj, core.data(), T, out);
  if (tap) tap("linear_attn_out", layer, out, T, c.hidden_size);
}

void Qwen35Moe::attention_forward(const LayerWeights& L, int layer, const Step& step, const float* x, float* out,
                                  const TensorTap& tap) const {
  const ModelConfig& c = cfg_;
  const AttentionWeights& w = L.attn;
  const int nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim, group = nh / nkv;
  const int64_t kv_row = int64_t(nkv) * hd, T = step.rows();
  const float eps = static_cast<float>(c.rms_norm_eps);

  std::vector<float> qg(T * nh * 2 * hd), k(T * kv_row), v(T * kv_row), o(T * nh * hd);
  step.linear(w.q_proj, x, T, qg.data());
  step.linear(w.k_proj, x, T, k.data());
  step.linear(w.v_proj, x, T, v.data());

  // Each row's position; its keys and values join its sequence's cache first.
  std::vector<int64_t> pos(T), seq_of(T);
  for (size_t i = 0; i < step.seqs.size(); ++i) {
    Qwen35State& st = *step.seqs[i].state;
    for (int64_t t = step.first[i]; t < step.first[i + 1]; ++t) {
      pos[t] = st.pos + (t - step.first[i]);
      seq_of[t] = static_cast<int64_t>(i);
      for (int j = 0; j < nkv; ++j) {
        float* kh = k.data() + t * kv_row + j * hd;
        ref::rmsnorm_zc(kh, w.k_norm.data(), hd, eps, kh);
        ref::rope_neox(kh, c.rotary_dim, inv_freq_.data(), pos[t]);
      }
    }
    const int64_t rows = step.first[i + 1] - step.first[i];
    st.k_cache[layer].append(k.data() + step.first[i] * kv_row, rows, static_cast<int>(kv_row), nkv, st.kv_format);
    st.v_cache[layer].append(v.data() + step.first[i] * kv_row, rows, static_cast<int>(kv_row), nkv, st.kv_format);
  }
  int64_t longest = 0;
  for (int64_t t = 0; t < T; ++t) longest = std::max(longest, pos[t] + 1);

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel if (T * nh * longest * hd >= (int64_t(1) << 16))
  {
    std::vector<float> q(hd), scores(longest);
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < nh; ++h) {
        const Qwen35State& st = *step.seqs[seq_of[t]].state;
        const float* qh = qg.data() + (t * nh + h) * 2 * hd;
        const float* gate = qh + hd;
        ref::rmsnorm_zc(qh, w.q_norm.data(), hd, eps, q.data());
        ref::rope_neox(q.data(), c.rotary_dim, inv_freq_.data(), pos[t]);
        float* oh = o.data() + (t * nh + h) * hd;
        const int64_t kvh = h / group;
        const KvRows &kc = st.k_cache[layer], &vc = st.v_cache[layer];
        if (st.kv_format == RowFormat::Bf16)
          ref::attend(q.data(), kc.values.data() + kvh * hd, vc.values.data() + kvh * hd, pos[t] + 1, kv_row, hd, scale, scores.data(), oh);
        else
          ref::attend_coded(q.data(), {kc.codes.data() + kvh * hd, kc.scales.data() + kvh}, {vc.codes.data() + kvh * hd, vc.scales.data() + kvh},
                            pos[t] + 1, kv_row, nkv, hd, st.kv_format, scale, scores.data(), oh);
        for (int i = 0; i < hd; ++i) oh[i] *= ref::sigmoid(gate[i]);
      }
  }
  if (tap) tap("attn_gated", layer, o.data(), T, int64_t(nh) * hd);
  step.linear(w.o_proj, o.data(), T, out);
  if (tap) tap("attn_out", layer, out, T, c.hidden_size);
}

void Qwen35Moe::moe_forward(const LayerWeights& L, int layer, const Step& step, const float* x, float* out,
                            std::vector<float>& deferred, const TensorTap& tap) const {
  const ModelConfig& c = cfg_;
  const MoeWeights& w = L.moe;
  const int64_t H = c.hidden_size, Is = c.shared_expert_intermediate_size, T = step.rows();
  const int E = c.num_experts, K = c.num_experts_per_tok;
  const Qwen35State& st = *step.lead;

  std::vector<float> router(T * E);
  step.linear(w.router, x, T, router.data());
  std::vector<int32_t> idx(T * K);
  std::vector<float> wt(T * K);
  for (int64_t t = 0; t < T; ++t) ref::route_topk(router.data() + t * E, E, K, idx.data() + t * K, wt.data() + t * K);
  if (tap) {  // the routing decision, for heat maps (ids are exact in fp32)
    std::vector<float> ids_f(idx.begin(), idx.end());
    tap("moe_topk_ids", layer, ids_f.data(), T, K);
  }

  // All the step's tokens at once: grouped by expert, each expert's weights read once for its tokens.
  auto routed = [&](const int32_t* ids, float* dst) {
    if (step.backend) step.backend->routed_experts(layer, x, T, ids, wt.data(), K, dst);
    else routed_experts_ref(L.moe, x, T, ids, wt.data(), K, dst);
  };
  if (st.defer_experts > 0) {  // the lowest-weight choices of each token join the residual one layer later
    std::vector<int32_t> now = idx, later(idx.size(), -1);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int> order(K);
      for (int j = 0; j < K; ++j) order[j] = j;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return wt[t * K + a] < wt[t * K + b]; });
      for (int d = 0; d < std::min(st.defer_experts, K); ++d) {
        const int j = order[d];
        if (!st.deferrable || (*st.deferrable)[layer][idx[t * K + j]]) std::swap(now[t * K + j], later[t * K + j]);
      }
    }
    deferred.assign(T * H, 0.0f);
    routed(later.data(), deferred.data());
    routed(now.data(), out);
  } else {
    routed(idx.data(), out);
  }
  if (tap) tap("moe_routed", layer, out, T, H);

  std::vector<float> sg(T * Is), su(T * Is), sd(T * H), sgate(T);
  step.linear(w.shared_gate, x, T, sg.data());
  step.linear(w.shared_up, x, T, su.data());
  for (int64_t i = 0; i < T * Is; ++i) sg[i] = ref::silu(sg[i]) * su[i];
  step.linear(w.shared_down, sg.data(), T, sd.data());
  step.linear(w.shared_expert_gate, x, T, sgate.data());
  for (int64_t t = 0; t < T; ++t) {
    const float s = ref::sigmoid(sgate[t]);
    for (int64_t k = 0; k < H; ++k) out[t * H + k] += s * sd[t * H + k];
  }
  if (tap) tap("moe_out", layer, out, T, H);
}

}  // namespace tandem
