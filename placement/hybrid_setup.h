// placement/hybrid_setup.h: turns `--device hybrid [--config FILE]` into a plan and the runner's
// placement (RunnerOptions::hybrid). Shared by the CLI commands and the Python bindings.
#pragma once

#include "placement/planner.h"
#include "runtime/runner.h"

namespace tandem::placement {

// What the machine offers the planner: free GPU memory (0 without a device) and, unless the config
// sets them, the measured CPU read bandwidth. `measure_cpu` false skips the ~1 s measurement.
PlanRequest plan_request(const PlacementConfig& config, uint64_t gpu_mem, int64_t context, bool measure_cpu);

// The runner's view of a plan (what lives where, the allocation limit, a one-line summary).
std::shared_ptr<HybridPlacement> hybrid_placement(const Plan& plan, int64_t total_experts);

// Online re-placement as the config asks for it (experts.replace): placement::plan_swaps with its
// options as the policy; off (every = 0) unless the config sets it.
ReplaceSetup replace_setup(const PlacementConfig& config);

// Loads opts.config (or the defaults), plans against `model` and fills opts.hybrid (tandem::Error
// without a CUDA device), opts.context
// (the config's unless --context was given) and opts.threads (the config's unless --threads was).
Plan prepare_hybrid(RunnerOptions& opts, const ModelConfig& model);
// The same with the config already parsed (the Python bindings accept dicts).
Plan prepare_hybrid(RunnerOptions& opts, const ModelConfig& model, const PlacementConfig& config);

}  // namespace tandem::placement
