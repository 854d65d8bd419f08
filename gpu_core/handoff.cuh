// gpu_core/handoff.cuh: a device <-> host handoff through page-locked, mapped host memory, for steps
// captured whole in one CUDA graph with host work in the middle (no cut, no relaunch, no copy nodes).
//
//   host_post:     copies x [nx] fp32, ids [nk] int32 and w [nk] fp32 into mapped host buffers, makes the
//                  writes visible system-wide, then sets *flag = value (the host spins on it).
//   host_wait_add: waits until *flag >= value (the host sets it once its result is in src), then
//                  dst[i] += src[i] for i < n, reading src from host memory. The same fp32 add as a copy
//                  of src followed by add_inplace. If the wait exceeds timeout_ns it gives up: *error is
//                  set to value and the add goes ahead (the caller reports the step as failed; a stuck
//                  host never hangs the GPU).
// All host pointers must be device-accessible (cudaHostAllocMapped; with UVA the host address). One
// block each; launches that share flags must be stream-ordered.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::gpu {

cudaError_t host_post(const float* x, int64_t nx, const int32_t* ids, const float* w, int64_t nk, float* hx, int32_t* hids, float* hw,
                      unsigned* flag, unsigned value, cudaStream_t stream);
cudaError_t host_wait_add(const unsigned* flag, unsigned value, const float* src, float* dst, int64_t n, unsigned* error,
                          int64_t timeout_ns, cudaStream_t stream);

// Reads `bytes` (a multiple of 16) at src, device-accessible host memory, in 16-byte loads from
// `blocks` blocks of 256 threads, 8 loads in flight per thread, and xors the words into *sink: the
// rate at which kernels can read host memory over the link (bench_handoff's pcie rows), nothing more.
cudaError_t read_host_probe(const void* src, int64_t bytes, unsigned* sink, int blocks, cudaStream_t stream);

}  // namespace tandem::gpu
