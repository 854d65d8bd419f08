// runtime/models/qwen3_5_moe/model.h: the Qwen3.5-MoE text decoder (hybrid Gated DeltaNet + gated attention,
// sparse MoE with a shared expert): hyper-parameters, the tensor table, and the forward pass.
//
// Loading resolves every tensor the forward needs from a memory-mapped Checkpoint, in any of the
// on-disk layouts (official fused BF16, per-expert BF16, GPTQ-Int4 per expert), checking names,
// shapes and dtypes once so the forward never meets a surprise. Weights stay in the mapping.
//
// forward_batch() is one layer walk over the tokens of several sequences at once: each sequence's
// tokens at its state's position (one token: a decode step; several: a prompt chunk, or the K
// positions a speculative step verifies). Norms, projections and the MoE run over all the step's
// tokens together (the routed experts grouped by expert, so each expert's weights are read once for
// all its tokens); the conv, the DeltaNet recurrence and attention run per sequence on its own state.
// Every row's arithmetic is the row's alone, so a sequence gets the same numbers in any batch.
// forward() is the one-sequence case. State (KV cache, conv windows, DeltaNet matrices) lives in
// Qwen35State, one per sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/format/config.h"
#include "core/row_format.h"
#include "core/weights.h"
#include "runtime/format/int4_cache.h"
#include "runtime/format/safetensors.h"

namespace tandem {

struct AttentionWeights {
  LinearWeight q_proj, k_proj, v_proj, o_proj;  // q_proj rows: per head [query | gate]
  std::vector<float> q_norm, k_norm;            // [head_dim], zero-centred
};

struct DeltaNetWeights {
  LinearWeight in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  std::vector<float> conv;     // [conv_dim][kernel]
  std::vector<float> A_log;    // [Hv]
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> norm;     // [dv], used as is (not zero-centred)
};

struct LayerWeights {
  LayerKind kind = LayerKind::LinearAttention;
  std::vector<float> input_norm, post_attention_norm;
  AttentionWeights attn;
  DeltaNetWeights deltanet;
  MoeWeights moe;
};

// The multi-token-prediction head (`mtp.*`, spec section 3.6): x = fc([RMSNorm_e(embed(next)) ;
// RMSNorm_h(h)]), then `layer` (full attention with its own MoE), `norm`, the shared lm_head. Loaded
// when the checkpoint has it (both official releases keep it in BF16); Qwen35Moe::mtp_forward runs it.
struct MtpWeights {
  LinearWeight fc;  // [H, 2H]: embedding half first
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerWeights layer;
};

// The matrix products of a forward pass. Without one the forward uses the exact reference
// (linear_ref, experts grouped by id); a placement such as the fast CPU path supplies its own, and
// everything else in the layer walk stays shared.
class MatmulBackend {
 public:
  virtual ~MatmulBackend() = default;
  // y [T, w.out] = x [T, w.in] W^T
  virtual void linear(const LinearWeight& w, const float* x, int64_t T, float* y) = 0;
  // out [T, H] = sum_j weights[t*k + j] * expert_{ids[t*k + j]}(x_t): the routed experts of `layer`
  // (ids < 0 are skipped).
  virtual void routed_experts(int layer, const float* x, int64_t T, const int32_t* ids, const float* weights, int k,
                              float* out) = 0;
};

// One attention layer's cached keys (or values) of a sequence, `width` (kv_heads * head_dim) values a
// position, each KV head's `head_dim` of them a row (core/row_format.h): fp32 values [pos][width] in
// format Bf16 (the reference keeps them exact), else codes [pos][width] and a scale per position and
// KV head [pos][kv_heads] -- what a coded GPU cache holds, a quarter of the fp32 bytes.
struct KvRows {
  int width = 0, heads = 0;  // set by the first append
  std::vector<float> values;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  int64_t positions() const { return width ? static_cast<int64_t>((values.size() + codes.size()) / static_cast<size_t>(width)) : 0; }
  // Appends n positions of rows [n][width] (coded formats: each head's row quantized).
  void append(const float* rows, int64_t n, int width, int heads, RowFormat f);
  void truncate(int64_t positions);  // the first `positions` kept
  uint64_t bytes() const { return values.size() * sizeof(float) + codes.size() + scales.size() * sizeof(float); }
  // What one position takes in format f: fp32 values, or codes and a scale a head.
  static uint64_t position_bytes(int width, int heads, RowFormat f) {
    return f == RowFormat::Bf16 ? uint64_t(width) * sizeof(float) : uint64_t(width) + uint64_t(heads) * sizeof(float);
  }
};

// Per-sequence state. KV rows are post-norm, post-RoPE keys and raw values.
struct Qwen35State {
  int64_t pos = 0;
  MatmulBackend* backend = nullptr;  // not owned; nullptr: the reference
  std::vector<KvRows> k_cache, v_cache;  // per layer
  // The KV cache's format (core/row_format.h): Int8 / Fp8 rows are cached as codes with a scale per
  // KV head, as a coded GPU cache holds them (and read as such); Bf16 rows stay fp32 here.
  RowFormat kv_format = RowFormat::Bf16;
  std::vector<std::vector<float>> conv_window;       // per layer: [kernel-1][conv_dim]
  std::vector<std::vector<float>> recurrent;         // per layer: [Hv][dk][dv]
  // Expert deferral (what a pipelined hybrid gains by letting the CPU finish an expert while the GPU
  // runs the next layer): of each token's `defer_experts` lowest-weight routed experts of layer L,
  // those `deferrable` allows ([layer][expert]; nullptr: all) are added to the residual at layer L+1
  // (with its MoE output; after the last layer before the final norm). The hybrid defers only
  // host-resident experts: deferrable = its CPU side. 0 = the exact model. `deferred` is scratch.
  int defer_experts = 0;
  const std::vector<std::vector<uint8_t>>* deferrable = nullptr;
  // After a step that kept its states (SeqTokens::keep_states): the conv windows and DeltaNet matrices
  // before it (kept[0]) and after each of its n tokens (kept[t], [layer] inside), from position
  // kept_from; rollback(keep) returns to the state after `keep` of them. Cleared by the next step.
  struct Kept {
    std::vector<std::vector<float>> conv_window, recurrent;
  };
  std::vector<Kept> kept;
  int64_t kept_from = -1;
  // Back to the state after the first `keep` tokens of the last kept step (0: before it), as if the
  // later ones had never been fed: the recurrent state from its copy, the KV rows cut. tandem::Error
  // when the last step kept nothing or keep is outside 0..n.
  void rollback(int64_t keep);
};

// Called with every named intermediate when set (llama.cpp-style "cb"), for layer-by-layer
// comparison with HF; `layer` is -1 outside the layer stack. Data is [rows, cols] fp32.
using TensorTap = std::function<void(const char* name, int layer, const float* data, int64_t rows, int64_t cols)>;

// Bytes of weights as stored, for bandwidth bounds: what one decode token must read at batch 1
// (every non-expert weight, the embedding row, lm_head, and top-k routed experts per layer).
struct WeightBytes {
  uint64_t non_expert = 0;        // everything but routed experts
  uint64_t routed_experts = 0;    // all routed experts of all layers
  uint64_t per_token_active = 0;  // read by one decode step at batch 1
  uint64_t routed_active = 0;     // of which routed experts (top-k per layer)
};

class Qwen35Moe {
 public:
  // Opens `dir` (config.json + safetensors). Throws tandem::Error naming the file/tensor on problems.
  static std::unique_ptr<Qwen35Moe> load(const std::string& dir);

  const ModelConfig& config() const { return cfg_; }
  const Checkpoint& checkpoint() const { return ckpt_; }
  std::string layout_description() const;  // e.g. "BF16, fused experts" / "GPTQ-Int4 g128 sym (v1 zeros)"

  Qwen35State new_state() const;
  WeightBytes weight_bytes() const;

  // The resolved tensor table, for the other placements (GPU upload, CPU expert repack).
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // Whether the routed experts are GPTQ int4, judged by the first MoE layer's first expert (a
  // checkpoint's experts share one format; the GPU upload rejects a layer that mixes them).
  bool gptq_experts() const;
  const LinearWeight& embed() const { return embed_; }
  const LinearWeight& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<float>& rope_inv_freq() const { return inv_freq_; }
  // The MTP head, nullptr when the checkpoint has none (or the config says mtp_num_hidden_layers 0).
  const MtpWeights* mtp() const { return mtp_ ? &*mtp_ : nullptr; }

  // Every routed expert the checkpoint stores in a floating-point format (a BF16 checkpoint's, and
  // the MTP head's in both official releases) quantized to int4 (core/quantize_int4.h) and run from
  // then on as a GPTQ checkpoint's experts are, on every placement. The quantized tensors come from
  // the disk cache under `cache_root` ("": default_int4_cache_root), built on the first load
  // (progress on `log`). Returns the line a person reads (what, how long, where); empty when there was
  // nothing to quantize. Call before making a runner.
  std::string quantize_experts_int4(const std::string& cache_root, std::FILE* log);
  // Whether the routed experts were quantized on load (quantize_experts_int4).
  bool experts_quantized_on_load() const { return expert_cache_ != nullptr; }
  // What quantize_experts_int4 would quantize (the routed experts stored in a floating-point format,
  // the MTP head's included) and in groups of how many inputs (0: this model's sizes have none).
  std::vector<const LinearWeight*> float_experts() const;
  int64_t int4_expert_group_size() const;
  // Feeds ids (each < vocab) at state.pos. With LogitRows::All writes logits [ids.size(), vocab];
  // with LogitRows::Last only the last position's [vocab] (what generation needs: a 4096-token
  // prompt would otherwise need 4 GB of logits).
  enum class LogitRows { All, Last };
  void forward(Qwen35State& state, std::span<const int32_t> ids, float* logits, const TensorTap& tap = {},
               LogitRows rows = LogitRows::All) const;

  // One sequence's part of a batched step.
  struct SeqTokens {
    Qwen35State* state = nullptr;
    std::span<const int32_t> ids;     // fed at state->pos (at least one)
    float* logits = nullptr;          // [ids, vocab] (All) or [vocab] (Last); nullptr: none
    LogitRows rows = LogitRows::Last;
    bool keep_states = false;         // keep the state after every position (Qwen35State::rollback)
    float* hidden = nullptr;          // [ids, H]: every fed token's final hidden state (after the final norm; the MTP head's h)
  };
  // One layer walk over every sequence's tokens (see above). The states share one backend and one
  // deferral setting; a state appears once. Taps see the step's rows [sum of ids, cols] in order.
  void forward_batch(std::span<const SeqTokens> seqs, const TensorTap& tap = {}) const;

  // The MTP head (spec section 3.6) over n rows of one sequence's head state (new_mtp_state) at its
  // position p: row i pairs the main model's final hidden state at position p + i (`hidden` [n, H],
  // SeqTokens::hidden) with the token that followed it (ids[i]), and its KV row joins the head's cache
  // at position p + i (the main model's RoPE position of that hidden state). h is the state after the
  // final norm: vLLM and SGLang, whose MTP serving of Qwen3-Next / Qwen3.5 reports acceptance rates a
  // mismatched input could not reach, hand the head the target model's normed output (its forward's
  // return value), and the head norms it once more (pre_fc_norm_hidden), as Megatron-style MTP training
  // does. Chained drafts feed the head its own output after mtp.norm (`hidden_out`), as they do.
  // Writes logits [n, vocab] (All) or [vocab] (Last) and, when set, hidden_out [n or 1, H] for the same
  // rows. tandem::Error when the checkpoint has no head.
  void mtp_forward(Qwen35State& state, std::span<const int32_t> ids, const float* hidden, float* logits, LogitRows rows,
                   float* hidden_out = nullptr, const TensorTap& tap = {}) const;
  // A state for the MTP head: one attention layer's cache, at index config().num_layers of the walk
  // (the index its routed experts and taps use too).
  Qwen35State new_mtp_state() const;

 private:
  void load_weights();
  // One decoder layer's tensors under `p` ("model.language_model.layers.3.", "mtp.layers.0.").
  LayerWeights load_layer(const std::string& p, LayerKind kind, bool fused) const;
  struct Step;  // a forward_batch call's sequences, their rows and the backend
  // One decoder layer over the step's rows: h += mixer(norm(h)); h += moe(norm(h)) (x, out: scratch).
  void decoder_layer(const LayerWeights& L, int layer, const Step& step, std::vector<float>& h, std::vector<float>& x,
                     std::vector<float>& out, std::vector<float>& pending, std::vector<float>& deferred, const TensorTap& tap) const;
  void deltanet_forward(const LayerWeights& L, int layer, const Step& step, const float* x, float* out, const TensorTap& tap) const;
  void attention_forward(const LayerWeights& L, int layer, const Step& step, const float* x, float* out, const TensorTap& tap) const;
  void moe_forward(const LayerWeights& L, int layer, const Step& step, const float* x, float* out, std::vector<float>& deferred,
                   const TensorTap& tap) const;

  ModelConfig cfg_;
  Checkpoint ckpt_;
  std::string prefix_;  // "model.language_model." or "model."
  std::string expert_layout_;
  LinearWeight embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  std::optional<MtpWeights> mtp_;
  std::unique_ptr<Int4Cache> expert_cache_;  // quantize_experts_int4's tensors (the views point into it)
  std::vector<float> inv_freq_;
};

}  // namespace tandem
