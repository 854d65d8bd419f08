// gpu_core/cp_async.cuh: asynchronous copies global -> shared memory (cp.async, sm_80+; device code,
// include from .cu only): a thread's copies go out in groups (copy_async_commit) and it waits for all but
// the most recent ones (copy_async_wait). Before sm_80 each copy is a plain load and store.
#pragma once

#include <cuda_runtime.h>

namespace tandem::gpu::detail {

// One 4-byte copy, zeros when !ok (nothing is read).
__device__ __forceinline__ void copy_async4(float* dst, const float* src, bool ok = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(ok ? 4 : 0) : "memory");
#else
  *dst = ok ? *src : 0.0f;
#endif
}

__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits for this thread's copies but the PENDING most recent groups.
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
#endif
}

}  // namespace tandem::gpu::detail
