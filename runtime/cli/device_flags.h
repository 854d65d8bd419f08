// runtime/cli/device_flags.h: the placement flags every model-running command shares.
#pragma once

#include <memory>
#include <vector>

#include "runtime/cli/args.h"
#include "runtime/runner.h"

namespace tandem::cli {

// --device, --config, --threads, --cpu-expert-format, --gpu-mem, --context, --defer-experts, --trace, --eager
std::vector<Flag> device_flags();
// Reads them (and sets the OpenMP thread count for the shared host ops); UsageError on bad values.
RunnerOptions runner_options(const Args& a, int64_t min_context = 0);
// make_runner, after planning the placement when the device is hybrid (prints the plan's summary).
std::unique_ptr<Runner> open_runner(const Qwen35Moe& model, RunnerOptions& opts);

}  // namespace tandem::cli
