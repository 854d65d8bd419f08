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
//   host_wait_add_rmsnorm_zc: host_wait_add's wait and add fused with the add_rmsnorm_zc after it:
//                  h += a + src, y = rmsnorm_zc(h), one row, the same bits as host_wait_add(.., src, a, ..)
//                  then add_rmsnorm_zc(h, a, nullptr, nullptr, w, n, 1, eps, y), in one launch for rows up
//                  to 4096 (a left as it was), else as those two (a += src). With programmatic launch the
//                  kernel after it may start (and load its weights) while this one waits for the host.
//   HostPost:      where a kernel that ends with a router result posts it the way host_post does (x, ids,
//                  weights, then the flag): gemv_bf16_router_topk_norm's last block (gemv.cuh), so the
//                  host is told without a launch after the router's.
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

// The host's sum a kernel waits for: src [n] is valid once *flag >= value; past timeout_ns the kernel
// sets *error = value and goes ahead with src as it is.
struct HostSum {
  const unsigned* flag = nullptr;
  unsigned value = 0;
  const float* src = nullptr;
  unsigned* error = nullptr;
  int64_t timeout_ns = 0;
};
cudaError_t host_wait_add_rmsnorm_zc(const HostSum& host, float* h, float* a, const float* w, int64_t n, float eps, float* y,
                                     cudaStream_t stream);

struct HostPost {
  float* x = nullptr;        // [the row's length]
  int32_t* ids = nullptr;    // [k]
  float* weights = nullptr;  // [k]
  unsigned* flag = nullptr;  // set to value once the three are visible to the host
  unsigned value = 0;
};

// Reads `bytes` (a multiple of 16) at src, device-accessible host memory, in 16-byte loads from
// `blocks` blocks of 256 threads, 8 loads in flight per thread, and xors the words into *sink: the
// rate at which kernels can read host memory over the link (bench_handoff's pcie rows), nothing more.
cudaError_t read_host_probe(const void* src, int64_t bytes, unsigned* sink, int blocks, cudaStream_t stream);

}  // namespace tandem::gpu
