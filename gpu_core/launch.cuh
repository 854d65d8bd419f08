// gpu_core/launch.cuh: kernel launches that honour gpu_core/launch_policy.h (include from .cu only).
//
// Device side, for kernels launched with detail::launch: pdl_begin() first (before any early return:
// every such kernel must wait, or a successor's wait would not cover the kernels before it), or
// pdl_allow() first and pdl_wait() after loads that do not depend on earlier kernels (weights).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "gpu_core/launch_policy.h"

namespace tandem::gpu::detail {

// Lets the next kernel in the stream launch once every block of this one has started (or exited).
__device__ __forceinline__ void pdl_allow() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Waits until the kernels this one depends on have finished and their writes are visible (no-op when
// it was launched without programmatic dependence).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_allow();
  pdl_wait();
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when the
// calling thread's policy asks for it. Every argument is passed (no kernel default arguments).
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  if (!programmatic_launch()) {  // the plain launch, exactly as before the policy existed
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return cudaPeekAtLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace tandem::gpu::detail
