// runtime/cli/device_flags.h: the placement flags every model-running command shares.
#pragma once

#include <memory>
#include <vector>

#include "runtime/cli/args.h"
#include "runtime/engine/session.h"

namespace tandem::cli {

// --device, --config, --threads, --cpu-expert-format, --gpu-mem, --context, --defer-experts, --trace, --eager
std::vector<Flag> device_flags();
// Reads them (and sets the OpenMP thread count for the shared host ops); UsageError on bad values.
RunnerOptions runner_options(const Args& a, int64_t min_context = 0);
// Session::start, printing its device line (what --device auto chose, the hybrid plan) to stderr.
void start_session(Session& s, const RunnerOptions& opts);

}  // namespace tandem::cli
