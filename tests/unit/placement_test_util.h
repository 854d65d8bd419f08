// tests/unit/placement_test_util.h: what the planner's test files share: the 35B configs (BF16 and the
// GPTQ-Int4 release), a placement YAML from text, and fixed bandwidths for deterministic predictions.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "placement/placement_config.h"
#include "runtime/format/config.h"

namespace tandem::placement::test_plans {

inline const std::string kData = TANDEM_TEST_DATA;

inline ModelConfig model35_bf16() { return load_model_config(kData + "/spec_config_qwen3.5-35b-a3b.json"); }

// The GPTQ-Int4 release: the same config plus its quantization_config (spec §4).
inline ModelConfig model35() {
  std::ifstream f(kData + "/spec_config_qwen3.5-35b-a3b.json");
  nlohmann::json j = nlohmann::json::parse(f);
  j["quantization_config"] = nlohmann::json::parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true,
      "desc_act": false, "dynamic": {"lm_head": {}, "model.language_model.embed_tokens": {}, "-:.*attn.*": {},
      "-:.*shared_expert.*": {}, "-:.*mtp.*": {}, "-:.*visual.*": {}}})");
  return parse_model_config(j.dump(), "spec config + GPTQ quantization_config");
}

inline PlacementConfig yaml(const std::string& text) { return parse_placement_config(text, "test.yaml"); }

inline PlacementConfig fixed_bw(PlacementConfig c) {  // deterministic predictions
  c.bw_gpu = 1000e9, c.bw_pcie = 25e9, c.bw_cpu = 80e9;
  return c;
}

}  // namespace tandem::placement::test_plans
