// gpu_core/launch_scope.cpp: the per-thread launch flag of device.cuh (plain C++: every build has it).
#include "gpu_core/device.cuh"

namespace tandem::gpu {

namespace {
thread_local bool programmatic = false;
}  // namespace

bool programmatic_launch() { return programmatic; }
ProgrammaticLaunchScope::ProgrammaticLaunchScope(bool on) : previous_(programmatic) { programmatic = on; }
ProgrammaticLaunchScope::~ProgrammaticLaunchScope() { programmatic = previous_; }

}  // namespace tandem::gpu
