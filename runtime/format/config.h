// runtime/format/config.h: the model's hyper-parameters, read once from a HF config.json and validated.
//
// Accepts both forms the Qwen3.5-MoE checkpoints use: the composite config (`model_type: qwen3_5_moe`,
// decoder fields under `text_config`) and the text-only one (`model_type: qwen3_5_moe_text`, fields at
// top level). Layer kinds come from `layer_types` or `full_attention_interval`; RoPE from
// `rope_parameters` (or legacy top-level `rope_theta` / `partial_rotary_factor`); GPTQ settings from
// `quantization_config`. Any unknown or inconsistent value is a tandem::Error naming the key.
#pragma once

#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <vector>

namespace tandem {

enum class LayerKind : uint8_t { LinearAttention, FullAttention };

// One `dynamic` rule of a GPTQModel quantization_config: a regex matched from the start of a module
// name; `exclude` rules ("-:" prefix) keep a module unquantized, the others override settings.
struct GptqDynamicRule {
  std::string pattern;
  std::shared_ptr<const std::regex> regex;  // compiled once at parse time
  bool exclude = false;
  int bits = 0;         // 0: inherit
  int group_size = 0;   // 0: inherit
  int sym = -1;         // -1: inherit
  int desc_act = -1;    // -1: inherit
};

enum class GptqZeroFormat : uint8_t { Unknown, V1, V2 };  // v1 stores zero-1, v2 stores zero

struct QuantConfig {
  bool gptq = false;
  int bits = 4;
  int group_size = 128;  // -1 in config.json means one group over the whole input dimension
  bool sym = true;
  bool desc_act = false;
  GptqZeroFormat zero_format = GptqZeroFormat::Unknown;  // Unknown: decided from the data at load
  std::vector<GptqDynamicRule> dynamic;

  // Settings that apply to one module (e.g. "model.language_model.layers.0.mlp.experts.3.gate_proj"),
  // or nullopt-equivalent `quantized == false` when a dynamic rule excludes it.
  struct ModuleQuant {
    bool quantized = false;
    int bits = 4, group_size = 128;
    bool sym = true, desc_act = false;
  };
  ModuleQuant for_module(const std::string& module_name) const;
};

struct ModelConfig {
  std::string source;  // path of the config.json, for messages
  std::string model_type;  // of the text decoder: qwen3_5_moe_text
  bool composite = false;  // true when read from a qwen3_5_moe (text_config) file

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_layers = 0;
  std::vector<LayerKind> layer_types;

  // gated full attention
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor, rounded down to even
  double rope_theta = 10000000.0;
  double partial_rotary_factor = 0.25;

  // Gated DeltaNet
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel = 4;

  // MoE
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  int mtp_layers = 0;  // mtp_num_hidden_layers: the multi-token-prediction head's decoder layers (0: none)

  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;

  QuantConfig quant;

  int64_t linear_key_dim() const { return int64_t(linear_num_key_heads) * linear_key_head_dim; }
  int64_t linear_value_dim() const { return int64_t(linear_num_value_heads) * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int num_full_attention_layers() const;

  // Checks ranges and consistency; called by the loaders, throws tandem::Error naming the key.
  void validate() const;
};

// Reads `<dir>/config.json` (or a path to a .json file).
ModelConfig load_model_config(const std::string& dir_or_file);
// Parses config.json text; `source` names it in messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

}  // namespace tandem
