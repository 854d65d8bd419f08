// tandem plan: the placement plan for a model folder, a placement YAML and a budget, as a table or
// one JSON object. Reads config.json only: no weights, no GPU needed.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "runtime/engine/session.h"
#include "placement/planner.h"
#include "core/bytes.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/output.h"
#include "runtime/format/config.h"
#include "core/error.h"

namespace tandem::cli {

int cmd_plan(int argc, char** argv) {
  Args a("plan", {
                     {"model", true, "model folder (only its config.json is read)"},
                     {"config", true, "placement YAML (configs/*.yaml; default: frequency placement)"},
                     {"gpu-mem", true, "GPU memory budget, e.g. 24GiB (overrides gpu.memory)"},
                     {"context", true, "KV cache length (overrides context)"},
                     {"json", false, "print one JSON object instead of the table"},
                     {"no-measure", false, "do not measure the CPU read bandwidth (use the config's or the default)"},
                     {"help", false, "show this help"},
                 });
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  const ModelConfig model = load_model_config(a.get("model"));
  const placement::PlacementConfig cfg =
      a.has("config") ? placement::load_placement_config(a.get("config")) : placement::default_placement_config();
  uint64_t gpu_mem = 0;
  if (a.has("gpu-mem")) {
    try {
      gpu_mem = parse_bytes(a.get("gpu-mem"), "--gpu-mem");
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
  const int64_t context = a.get_int("context", 0);
  if (a.has("context") && context < 1) throw UsageError("--context must be at least 1");
  const placement::PlanRequest req = plan_request(cfg, gpu_mem, context, !a.has("no-measure"));
  const placement::Plan plan = placement::make_plan(model, cfg, req);
  const std::vector<placement::FormatRow> formats = placement::plan_formats(model, cfg, req);  // the same budget per dense format
  if (a.has("json")) {
    nlohmann::json j = placement::plan_to_json(plan);
    j["formats"] = placement::formats_to_json(formats);
    write_stdout(j.dump() + "\n");  // a failed write says why (errno), as printf's later flush cannot
  } else {
    write_stdout(placement::plan_table(plan) +
                 "\nthe same budget by format (dense.format; experts.gpu_format: int4 quantizes floating-point experts on load; kv_cache.format):\n" +
                 placement::formats_table(formats));
  }
  return 0;
}

}  // namespace tandem::cli
