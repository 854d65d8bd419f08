// libFuzzer target: config.json parsing accepts or rejects with tandem::Error, never crashes.
#include <cstdint>
#include <string>

#include "runtime/config.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto c = tandem::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    (void)c.quant.for_module("model.layers.0.mlp.experts.0.gate_proj");
  } catch (const tandem::Error&) {
  }
  return 0;
}
