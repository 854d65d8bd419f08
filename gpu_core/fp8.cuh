// gpu_core/fp8.cuh: FP8 E4M3 codes (core/row_format.h) to float on the device, one and two at a time
// (cuda_fp8.h's conversions: one instruction on sm_89 and later, which have FP8; emulated before).
// Exact for every finite code. Device code, include from .cu only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace tandem::gpu::detail {

__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two_codes) {  // the low 16 bits: codes (lo, hi)
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float fp8_to_float(uint32_t code) {  // the low 8 bits
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code & 0xffu), __NV_E4M3);
  return __half2float(*reinterpret_cast<const __half*>(&h));
}

}  // namespace tandem::gpu::detail
