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

// Plans `config` against `model` and fills opts.hybrid (tandem::Error without a CUDA device),
// opts.context (the config's unless --context was given; the planner's for context: auto) and
// opts.threads (the config's unless --threads was).
Plan prepare_hybrid(RunnerOptions& opts, const ModelConfig& model, const PlacementConfig& config);

// What every model-running entry point does before make_runner, CLI and Python alike. --device auto
// (the default) becomes hybrid where this build can run kernels on a CUDA device (planned for its
// free memory unless a budget is given), else cpu; a device this build has no kernels for stops here
// with gpu::gpu_device_caps()'s one line (which architectures were built, how to rebuild), rather than
// falling back in silence. A config (placement YAML) implies hybrid. Hybrid is then planned
// (prepare_hybrid). Returns the one line a person reads about the choice: the device, the GPU budget,
// routed experts on the GPU, the context and the predicted decode rate; empty for ref / cpu / gpu
// asked for by name.
std::string prepare_device(RunnerOptions& opts, const ModelConfig& model, const PlacementConfig& config);
// The same with opts.config loaded (a YAML path), or default_placement_config() without one (the CLI).
std::string prepare_device(RunnerOptions& opts, const ModelConfig& model);

}  // namespace tandem::placement
