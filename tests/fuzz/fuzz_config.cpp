// libFuzzer target: config.json parsing accepts or rejects with tandem::Error, never crashes; what it
// accepts holds exactly the integers the file holds (no value cut to its low bits) and is consistent;
// what it rejects is one printable line of bounded length.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/format/config.h"
#include "core/error.h"

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_config: %s %s\n", what, detail.c_str());
  std::abort();
}

// The JSON integer under `key` equals `loaded` (when the key is there and not null).
void same(const nlohmann::json& obj, const char* key, int64_t loaded) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return;
  const nlohmann::json& v = obj[key];
  if (!v.is_number_integer()) broken("accepted a non-integer", key);
  const bool equal = v.is_number_unsigned() ? v.get<uint64_t>() == static_cast<uint64_t>(loaded) && loaded >= 0
                                            : v.get<int64_t>() == loaded;
  if (!equal) broken("loaded a different value for", std::string(key) + ": " + v.dump() + " vs " + std::to_string(loaded));
}

void check_accepted(const tandem::ModelConfig& c, const std::string& text) {
  const nlohmann::json root = nlohmann::json::parse(text);
  const nlohmann::json& t = c.composite ? root["text_config"] : root;
  same(t, "vocab_size", c.vocab_size);
  same(t, "hidden_size", c.hidden_size);
  same(t, "num_hidden_layers", c.num_layers);
  same(t, "num_attention_heads", c.num_heads);
  same(t, "num_key_value_heads", c.num_kv_heads);
  same(t, "head_dim", c.head_dim);
  same(t, "linear_num_key_heads", c.linear_num_key_heads);
  same(t, "linear_num_value_heads", c.linear_num_value_heads);
  same(t, "linear_key_head_dim", c.linear_key_head_dim);
  same(t, "linear_value_head_dim", c.linear_value_head_dim);
  same(t, "linear_conv_kernel_dim", c.linear_conv_kernel);
  same(t, "num_experts", c.num_experts);
  same(t, "num_experts_per_tok", c.num_experts_per_tok);
  same(t, "moe_intermediate_size", c.moe_intermediate_size);
  same(t, "shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  same(t, "max_position_embeddings", c.max_position_embeddings);
  same(t, "bos_token_id", c.bos_token_id);
  for (const char* q : {"quantization_config"})
    for (const nlohmann::json* o : {&root, &t})
      if (o->is_object() && o->contains(q) && (*o)[q].is_object() && c.quant.gptq) {
        same((*o)[q], "bits", c.quant.bits);
        same((*o)[q], "group_size", c.quant.group_size);
      }
  if (c.vocab_size < 1 || c.vocab_size > INT32_MAX || c.hidden_size < 1 || c.num_layers < 1 || c.num_heads < 1 ||
      c.num_kv_heads < 1 || c.head_dim < 1 || c.num_experts < 1 || c.num_experts_per_tok < 1 ||
      c.num_experts_per_tok > c.num_experts || c.moe_intermediate_size < 1 || c.max_position_embeddings < 1 ||
      static_cast<int64_t>(c.layer_types.size()) != c.num_layers)
    broken("accepted an inconsistent config");
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size) broken("accepted an eos id outside the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto c = tandem::parse_model_config(text, "fuzz.json");
    (void)c.quant.for_module("model.layers.0.mlp.experts.0.gate_proj");
    check_accepted(c, text);
  } catch (const tandem::Error& e) {
    const std::string m = e.what();
    if (m.find('\n') != std::string::npos || m.size() > 8192) broken("error message is not one bounded line", m.substr(0, 200));
  }
  return 0;
}
