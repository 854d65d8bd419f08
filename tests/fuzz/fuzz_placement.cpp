// libFuzzer target: placement YAML (and heat maps, and the planner on what parses) accept or reject
// with tandem::Error, never crash, hang or exhaust memory.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "placement/heat.h"
#include "placement/placement_config.h"
#include "placement/planner.h"
#include "runtime/format/config.h"
#include "core/error.h"

namespace {

const tandem::ModelConfig& model() {
  static const tandem::ModelConfig m = [] {
    std::ifstream f(TANDEM_FUZZ_MODEL_CONFIG);
    std::stringstream ss;
    ss << f.rdbuf();
    return tandem::parse_model_config(ss.str(), TANDEM_FUZZ_MODEL_CONFIG);
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    tandem::placement::PlacementConfig c = tandem::placement::parse_placement_config(text, "fuzz.yaml");
    c.heat.clear();  // never read files the input names
    tandem::placement::PlanRequest r;
    r.gpu_mem = 1ull << 30;
    (void)tandem::placement::make_plan(model(), c, r);
  } catch (const tandem::Error&) {
  }
  try {
    (void)tandem::placement::parse_heat_map(text, "fuzz_heat.yaml");
  } catch (const tandem::Error&) {
  }
  return 0;
}
