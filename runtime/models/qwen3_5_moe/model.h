// runtime/models/qwen3_5_moe/model.h: the Qwen3.5-MoE text decoder (hybrid Gated DeltaNet + gated attention,
// sparse MoE with a shared expert): hyper-parameters, the tensor table, and the forward pass.
//
// Loading resolves every tensor the forward needs from a memory-mapped Checkpoint, in any of the
// on-disk layouts (official fused BF16, per-expert BF16, GPTQ-Int4 per expert), checking names,
// shapes and dtypes once so the forward never meets a surprise. Weights stay in the mapping.
//
// forward() feeds T tokens at the state's current position (T > 1 is a prefill, T == 1 a decode
// step) and returns float32 logits [T, vocab]. State (KV cache, conv windows, DeltaNet matrices)
// lives in Qwen35State, one per sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/format/config.h"
#include "core/weights.h"
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

// Per-sequence state. KV rows are post-norm, post-RoPE keys and raw values, fp32 in the reference.
struct Qwen35State {
  int64_t pos = 0;
  MatmulBackend* backend = nullptr;  // not owned; nullptr: the reference
  std::vector<std::vector<float>> k_cache, v_cache;  // per layer: [pos][kv_heads * head_dim]
  std::vector<std::vector<float>> conv_window;       // per layer: [kernel-1][conv_dim]
  std::vector<std::vector<float>> recurrent;         // per layer: [Hv][dk][dv]
  // Expert deferral (what a pipelined hybrid gains by letting the CPU finish an expert while the GPU
  // runs the next layer): of each token's `defer_experts` lowest-weight routed experts of layer L,
  // those `deferrable` allows ([layer][expert]; nullptr: all) are added to the residual at layer L+1
  // (with its MoE output; after the last layer before the final norm). The hybrid defers only
  // host-resident experts: deferrable = its CPU side. 0 = the exact model. `deferred` is scratch.
  int defer_experts = 0;
  const std::vector<std::vector<uint8_t>>* deferrable = nullptr;
  std::vector<float> deferred;
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
  // Feeds ids (each < vocab) at state.pos. With LogitRows::All writes logits [ids.size(), vocab];
  // with LogitRows::Last only the last position's [vocab] (what generation needs: a 4096-token
  // prompt would otherwise need 4 GB of logits).
  enum class LogitRows { All, Last };
  void forward(Qwen35State& state, std::span<const int32_t> ids, float* logits, const TensorTap& tap = {},
               LogitRows rows = LogitRows::All) const;

 private:
  void load_weights();
  void deltanet_forward(const LayerWeights& L, int layer, Qwen35State& st, const float* x, int64_t T, float* out,
                        const TensorTap& tap) const;
  void attention_forward(const LayerWeights& L, int layer, Qwen35State& st, const float* x, int64_t T, float* out,
                         const TensorTap& tap) const;
  void moe_forward(const LayerWeights& L, int layer, Qwen35State& st, const float* x, int64_t T, float* out,
                   const TensorTap& tap) const;

  ModelConfig cfg_;
  Checkpoint ckpt_;
  std::string prefix_;  // "model.language_model." or "model."
  std::string expert_layout_;
  LinearWeight embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;
};

}  // namespace tandem
