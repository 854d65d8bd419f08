// gpu_core/smem.cuh: dynamic shared memory past the default 48 KB, checked against the device.
//
// Contract: opt_in_smem(kernel, bytes) lets `kernel` launch with `bytes` of dynamic shared memory
// (cudaFuncSetAttribute past 48 KB) if its static shared memory plus `bytes` fits what one block may
// use on this device as gpu_device_caps() reports it, TANDEM_MAX_SM's cap included (99 KB a block on
// sm_86 / sm_89, 227 KB on sm_90). Returns cudaErrorInvalidValue, without touching the kernel, when it
// does not fit: launchers then pick a smaller variant or report it. A host call: do it once per
// process per kernel, not per launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace tandem::gpu {

cudaError_t opt_in_smem_raw(const void* kernel, size_t dynamic_bytes);

template <typename... Params>
cudaError_t opt_in_smem(void (*kernel)(Params...), size_t dynamic_bytes) {
  return opt_in_smem_raw(reinterpret_cast<const void*>(kernel), dynamic_bytes);
}

}  // namespace tandem::gpu
