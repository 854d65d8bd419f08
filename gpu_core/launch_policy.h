// gpu_core/launch_policy.h: how the calling thread's kernel launches are issued (plain C++ header).
//
// Programmatic dependent launch (sm_90+): a kernel launched under it may start while the kernel before
// it in the stream is still finishing, and waits in-kernel (griddepcontrol.wait) before it reads what
// that kernel wrote; its launch latency and its independent loads (weights) overlap the predecessor's
// tail. Kernels of gpu_core's decode ops honour it; the rest launch as usual. Off unless switched on.
#pragma once

namespace tandem::gpu {

void set_programmatic_launch(bool on);  // for the calling thread's launches
bool programmatic_launch();

// Switches it on (when `on`) for a scope, restoring the previous setting after.
class ProgrammaticLaunchScope {
 public:
  explicit ProgrammaticLaunchScope(bool on) : prev_(programmatic_launch()) { set_programmatic_launch(on || prev_); }
  ~ProgrammaticLaunchScope() { set_programmatic_launch(prev_); }
  ProgrammaticLaunchScope(const ProgrammaticLaunchScope&) = delete;
  ProgrammaticLaunchScope& operator=(const ProgrammaticLaunchScope&) = delete;

 private:
  bool prev_;
};

}  // namespace tandem::gpu
