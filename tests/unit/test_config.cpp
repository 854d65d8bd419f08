#include <nlohmann/json.hpp>

#include "runtime/format/config.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using test::expect_error;

json text_config() {
  return json{{"model_type", "qwen3_5_moe_text"},
              {"vocab_size", 1000},
              {"hidden_size", 64},
              {"num_hidden_layers", 8},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 32},
              {"linear_num_key_heads", 2},
              {"linear_num_value_heads", 4},
              {"linear_key_head_dim", 16},
              {"linear_value_head_dim", 8},
              {"linear_conv_kernel_dim", 4},
              {"num_experts", 8},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 32},
              {"shared_expert_intermediate_size", 32},
              {"rms_norm_eps", 1e-6},
              {"eos_token_id", 999},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000}, {"partial_rotary_factor", 0.25},
                                   {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}}};
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "config.json"); }

TEST(Config, TextOnlyDefaultsToEveryFourthLayerFull) {
  const ModelConfig c = parse(text_config());
  EXPECT_FALSE(c.composite);
  ASSERT_EQ(c.layer_types.size(), 8u);
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(c.layer_types[i] == LayerKind::FullAttention, (i + 1) % 4 == 0) << i;
  EXPECT_EQ(c.rotary_dim, 8);  // 32 * 0.25
  EXPECT_EQ(c.linear_conv_dim(), 2 * 2 * 16 + 4 * 8);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{999});
  EXPECT_FALSE(c.quant.gptq);
}

TEST(Config, CompositeWithLayerTypesAndInterval) {
  json t = text_config();
  t["layer_types"] = json::array();
  for (int i = 0; i < 8; ++i) t["layer_types"].push_back(i == 1 ? "full_attention" : "linear_attention");
  json comp{{"model_type", "qwen3_5_moe"}, {"text_config", t}, {"vision_config", {{"depth", 2}}}, {"tie_word_embeddings", false}};
  const ModelConfig c = parse(comp);
  EXPECT_TRUE(c.composite);
  EXPECT_EQ(c.num_full_attention_layers(), 1);
  EXPECT_EQ(c.layer_types[1], LayerKind::FullAttention);

  json t2 = text_config();
  t2["full_attention_interval"] = 3;
  const ModelConfig c2 = parse(t2);
  EXPECT_EQ(c2.layer_types[2], LayerKind::FullAttention);
  EXPECT_EQ(c2.layer_types[5], LayerKind::FullAttention);
  EXPECT_EQ(c2.num_full_attention_layers(), 2);
}

TEST(Config, LegacyTopLevelRope) {
  json t = text_config();
  t.erase("rope_parameters");
  t["rope_theta"] = 5000.0;
  t["partial_rotary_factor"] = 0.5;
  const ModelConfig c = parse(t);
  EXPECT_EQ(c.rope_theta, 5000.0);
  EXPECT_EQ(c.rotary_dim, 16);
}

TEST(Config, ErrorsNameTheKey) {
  auto with = [](const char* key, json v) {
    json t = text_config();
    t[key] = v;
    return t;
  };
  expect_error([&] { parse(with("model_type", "llama")); }, {"config.json", "model_type", "qwen3_5_moe"});
  expect_error([&] { parse(with("hidden_size", "big")); }, {"hidden_size", "integer", "\"big\""});
  expect_error([&] { parse(with("hidden_size", -4)); }, {"hidden_size", "positive"});
  expect_error([&] { parse(with("num_key_value_heads", 3)); }, {"num_key_value_heads", "does not divide"});
  expect_error([&] { parse(with("linear_num_value_heads", 3)); }, {"linear_num_value_heads", "multiple"});
  expect_error([&] { parse(with("num_experts_per_tok", 9)); }, {"num_experts_per_tok", "more than num_experts"});
  expect_error([&] { parse(with("hidden_act", "gelu")); }, {"hidden_act", "silu"});
  expect_error([&] { parse(with("layer_types", json::array({"linear_attention"}))); }, {"layer_types", "1 entries", "8"});
  expect_error([&] { parse(with("eos_token_id", 5000)); }, {"eos_token_id", "outside"});
  json lt = json::array();
  for (int i = 0; i < 8; ++i) lt.push_back(i == 3 ? "sliding_attention" : "linear_attention");
  expect_error([&] { parse(with("layer_types", lt)); }, {"layer_types[3]", "sliding_attention"});
  expect_error([&] { parse(with("rope_parameters", {{"rope_type", "yarn"}})); }, {"rope_parameters.rope_type", "yarn"});
  json missing = text_config();
  missing.erase("num_experts");
  expect_error([&] { parse(missing); }, {"missing required key 'num_experts'"});
  json comp{{"model_type", "qwen3_5_moe"}, {"text_config", with("vocab_size", 0)}};
  expect_error([&] { parse(comp); }, {"text_config.vocab_size", "positive"});
  expect_error([&] { parse_model_config("{oops", "cfg.json"); }, {"cfg.json", "not valid JSON"});
}

json gptq_config() {
  json t = text_config();
  t["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}, {"sym", true},
                              {"desc_act", false},
                              {"dynamic", {{"lm_head", json::object()},
                                           {"-:.*attn.*", json::object()},
                                           {"-:.*shared_expert.*", json::object()},
                                           {"+:.*layers\\.1\\..*", {{"group_size", 16}}}}}};
  return t;
}

TEST(Config, GptqSettingsAndDynamicRules) {
  const ModelConfig c = parse(gptq_config());
  ASSERT_TRUE(c.quant.gptq);
  EXPECT_EQ(c.quant.zero_format, GptqZeroFormat::Unknown);
  EXPECT_FALSE(c.quant.for_module("model.layers.0.linear_attn.in_proj_qkv").quantized);
  EXPECT_FALSE(c.quant.for_module("model.layers.3.self_attn.q_proj").quantized);
  EXPECT_FALSE(c.quant.for_module("model.layers.0.mlp.shared_expert.up_proj").quantized);
  const auto e0 = c.quant.for_module("model.layers.0.mlp.experts.5.down_proj");
  EXPECT_TRUE(e0.quantized);
  EXPECT_EQ(e0.group_size, 32);
  EXPECT_EQ(c.quant.for_module("model.layers.1.mlp.experts.5.down_proj").group_size, 16);
  // Rules match from the start of the name: "lm_head" does not match "model.lm_head_x".
  EXPECT_TRUE(c.quant.for_module("model.lm_head_x").quantized);
}

TEST(Config, GptqErrors) {
  auto with = [](const char* key, json v) {
    json t = gptq_config();
    t["quantization_config"][key] = v;
    return t;
  };
  expect_error([&] { parse(with("bits", 8)); }, {"quantization_config.bits", "unsupported bits"});
  expect_error([&] { parse(with("quant_method", "awq")); }, {"quant_method", "gptq"});
  expect_error([&] { parse(with("group_size", 24)); }, {"group_size 24", "does not divide"});
  expect_error([&] { parse(with("checkpoint_format", "marlin")); }, {"checkpoint_format", "gptq_v2"});
  expect_error([&] { parse(with("dynamic", {{"-:(unclosed", json::object()}})); }, {"dynamic", "regular expression"});
  // Patterns std::regex would backtrack on without bound (a fuzzer's '.?*' hung the load) are refused by
  // name; their neighbours that are fine still load and match as before.
  expect_error([&] { parse(with("dynamic", {{"-:.?*shared_expert.*", json::object()}})); }, {"dynamic", "'*' at offset 2 of '.?*shared_expert.*'", "multiple repeat"});
  expect_error([&] { parse(with("dynamic", {{"a{2}*", json::object()}})); }, {"multiple repeat"});
  expect_error([&] { parse(with("dynamic", {{"-:(.*)+x", json::object()}})); }, {"'+' at offset 4 of '(.*)+x'", "nested repeat"});
  expect_error([&] { parse(with("dynamic", {{"((a|b*)c)*", json::object()}})); }, {"nested repeat"});
  const ModelConfig ok = parse(with("dynamic", {{"-:.*?attn[*+?]*.*", json::object()}, {"-:(x+)?model\\.lm_(head){1,2}", json::object()}}));
  EXPECT_FALSE(ok.quant.for_module("model.layers.3.self_attn.q_proj").quantized);
  EXPECT_FALSE(ok.quant.for_module("model.lm_head").quantized);
  EXPECT_TRUE(ok.quant.for_module("model.layers.0.mlp.experts.1.up_proj").quantized);
  EXPECT_EQ(parse(with("checkpoint_format", "gptq_v2")).quant.zero_format, GptqZeroFormat::V2);
  EXPECT_EQ(parse(with("checkpoint_format", "gptq")).quant.zero_format, GptqZeroFormat::V1);
}

}  // namespace
}  // namespace tandem
