// gpu_core/load_stream.cuh: the 16-byte weight load the GEMV and MoE kernels stream their weights with
// (device code; include from .cu only).
#pragma once

#include <cuda_runtime.h>

namespace tandem::gpu::detail {

// Weights are read once: keep them out of L1 so the activations stay there.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The same load for a kernel's first weight vectors, issued before its pdl_wait() (pdl.cuh) so that
// they stream while the kernel before it finishes. A plain (coherent) load, not .nc: ptxas moves .nc
// loads past griddepcontrol.wait (legal, the weights are read-only, but then they start only once the
// wait is over: every one-token GEMV's SASS had its wait first), and keeps plain ones before it.
// scripts/sass.sh prints, per kernel, how many 16-byte loads come before its wait.
__device__ __forceinline__ uint4 load_early(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace tandem::gpu::detail
