// tools/synth/synth.h: `tandem synth` — complete Qwen3.5-MoE model folders with random weights, in the
// real on-disk format, for tests, demos and measurements at any size up to the real 35B-A3B.
//
// A folder holds: config.json (official composite form: text_config with every spec §1 field, a
// vision_config, and for GPTQ the official quantization_config), tokenizer.json (byte-level BPE
// trained on the built-in text, Qwen special tokens), tokenizer_config.json, generation_config.json,
// the safetensors (official names; BF16 fused experts or GPTQ-Int4 per-expert qweight/qzeros/scales/
// g_idx with everything else BF16 and A_log F32; one `model.safetensors` up to max_shard_bytes,
// HF-style shards + index above), and synth_report.json (sizes, throughput, routing popularity).
//
// Values: a pure function of (seed, tensor name, element index) (see synth_fill.h), so the output is
// byte-identical for any thread count. Scales keep the reference forward sane through 40 layers:
// O(1) hidden states, logits with a std of a few units (spec §3 norms are zero-centred, so their
// stored weights are small; the gated DeltaNet norm is ≈ 1).
//
// Vocabulary: ids 0..n-1 are the trained BPE tokens; the 26 known Qwen special tokens follow in
// Qwen's order from `special_base` (<|endoftext|>, <|im_start|>, <|im_end|>, ..., <think>, </think>).
// `tiny` has no padding (special_base = n, vocab = n + 26). Padded presets put the specials where
// Qwen does (vocab_size - 276; the 35B: 248044, so every special id equals the real model's), fill
// n..special_base-1 with unreachable placeholder tokens (see hf_tokenizer_json) and leave the ids
// after the specials without a token, like Qwen's padding. Ids without a real token get all-zero
// lm_head rows: logit exactly 0, far below the top-k of the real tokens (std ≈ 3), so greedy and
// top-k sampling never pick them (unrestricted sampling over a padded vocabulary can).
//
// Routing skew: each layer's router rows get std multipliers s_e = exp(c·A·z_e) (z: normal
// quantiles of a per-layer random popularity order, normalised to mean s² = 1). Wider logits win
// the top-k more often, so popularity follows s_e for any isotropic input. c is calibrated per
// (experts, top-k) so that A = 1 gives the top 20% of experts ≈ 27.5% of activations (real Qwen3.5
// routing: 25–30%); A = 0 is uniform.
//
// Writing: opts.threads workers generate 4 KiB-aligned file ranges and write them with O_DIRECT into
// preallocated files (synth_write.h, safetensors_stream.h): ~1.1–1.5 GB/s on a busy 2-core VM, where
// generation alone runs at ~2 GB/s per thread. The routing report reads the routers back from the
// written files. The skew calibration is memoised per (experts, top_k) (a pure function).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "placement/heat.h"
#include "runtime/format/config.h"
#include "tools/synth/fill.h"

namespace tandem::synth {

enum class Quant : uint8_t { BF16, GptqInt4 };
std::string_view quant_name(Quant q);  // "bf16" | "gptq-int4"
Quant parse_quant(const std::string& s);  // throws tandem::Error listing the choices

// The text_config hyper-parameters a preset chooses; the rest are fixed at the spec §1 values.
struct Shape {
  int64_t hidden_size = 0;
  int num_layers = 0;
  int full_attention_interval = 4;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int linear_num_key_heads = 0, linear_num_value_heads = 0, linear_key_head_dim = 0, linear_value_head_dim = 0;
  int num_experts = 0, num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0, shared_expert_intermediate_size = 0;
  int64_t vocab_size = 0;    // 0: exactly the trained tokens + the special tokens
  int64_t special_base = 0;  // with vocab_size: the id of <|endoftext|>
  int64_t max_position_embeddings = 262144;
};

struct Preset {
  std::string name, description;
  Shape shape;
  Quant default_quant = Quant::BF16;
};

const std::vector<Preset>& presets();  // tiny, small, qwen3.5-35b-a3b
const Preset& find_preset(const std::string& name);  // throws tandem::Error listing the names

inline constexpr double kDefaultRoutingSkew = 1.0;
inline constexpr double kTargetTop20Share = 0.275;  // at skew 1: the middle of real Qwen's 25–30%
// Cap on trained tokens; the built-in text runs out of pairs seen twice first (~2560 tokens).
inline constexpr size_t kBpeVocabTarget = 4070;

struct Options {
  std::string out_dir;
  Quant quant = Quant::BF16;
  uint64_t seed = 0;
  double routing_skew = kDefaultRoutingSkew;
  int threads = 0;             // 0: all hardware threads
  bool config_only = false;    // config + tokenizer + generation_config only
  bool dry_run = false;        // plan and report sizes; write nothing
  bool force = false;          // overwrite a folder that already holds a model
  uint64_t max_shard_bytes = 4'000'000'000;
  uint64_t work_unit_bytes = 8u << 20;  // bytes per write (multiple of 4 KiB); no effect on the output
  int report_samples = 2048;   // random hidden states per layer for the routing report (0: no report)
  std::FILE* log = nullptr;    // progress bar and notes (a TTY gets a \r-updated line); nullptr: quiet
};

// Share of activations (token-expert selections) taken by the most popular q of the experts.
using placement::RoutingShares;
using placement::shares_from_counts;
struct RoutingReport {
  std::vector<RoutingShares> layers;
  RoutingShares mean, min, max;
  int samples = 0;
};

struct ShardPlan {
  std::string file;
  size_t tensors = 0;
  uint64_t bytes = 0;  // file size, header included
};

struct Result {
  ModelConfig config;
  size_t bpe_tokens = 0;      // regular tokenizer tokens (ids 0..bpe_tokens-1)
  int64_t special_base = 0;   // id of <|endoftext|>
  size_t num_tensors = 0;
  uint64_t tensor_bytes = 0;  // sum of tensor data
  std::vector<ShardPlan> shards;
  double skew_log_spread = 0;  // c·A, the std of log s_e
  double write_seconds = 0, gb_per_s = 0;
  bool weights_written = false;
  RoutingReport routing;       // filled when weights were written and report_samples > 0
};

Result synthesize(const Preset& preset, const Options& opts);

// ---- pieces, exposed for tests and for measurements without writing weights
struct Vocab {
  size_t bpe_tokens = 0;
  int64_t special_base = 0, vocab_size = 0;
};
// The 26 Qwen special tokens in id order from special_base: (content, special flag).
const std::vector<std::pair<std::string, bool>>& qwen_special_tokens();
// config.json as text, for a preset shape with its vocabulary resolved.
std::string config_json(const Shape& shape, const Vocab& vocab, Quant quant);

// Every tensor of the checkpoint with its recipe, in checkpoint order. `log_spread`: routing skew
// × skew_log_spread(experts, top_k).
std::vector<PlannedTensor> plan_tensors(const ModelConfig& cfg, Quant quant, const Vocab& vocab, double log_spread,
                                        uint64_t seed);

// c such that skew A = 1 gives kTargetTop20Share for `experts` / `top_k` (Monte-Carlo calibrated,
// deterministic).
double skew_log_spread(int experts, int top_k);
// Per-expert router row multipliers of one layer: exp(log_spread · z) over a seeded random popularity
// order, normalised to mean square 1. log_spread 0 gives all ones.
std::vector<float> router_row_scales(int experts, double log_spread, uint64_t seed, int layer);

// Routes `samples` random post-norm hidden states (x = (1 + w_norm) ⊙ g / rms(g), g ~ N(0, I))
// through each layer's router, softmax top-k; `layer_weights(l, router [E*H], norm [H])` supplies
// the float weights. Deterministic in `seed`; layers run in parallel.
RoutingReport measure_routing(const ModelConfig& cfg,
                              const std::function<void(int, std::vector<float>&, std::vector<float>&)>& layer_weights,
                              int samples, uint64_t seed, int threads);
// The routing report of a preset's routers, generated in memory (no files): for --config-only and tests.
RoutingReport routing_report_in_memory(const Preset& preset, const Options& opts);

}  // namespace tandem::synth
