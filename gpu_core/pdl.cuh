// gpu_core/pdl.cuh: programmatic dependent launch (sm_90+), for the decode step's chains of small kernels.
//
// A kernel launched through detail::launch while gpu::programmatic_launch() is on (device.cuh) may be
// scheduled as soon as every block of the kernel before it in the stream has passed pdl_launch_next(),
// instead of after that kernel has finished: its launch and whatever it does before pdl_wait() (loading
// weights, which no kernel writes) overlap its predecessor's work.
//
// The contract every kernel launched this way keeps:
//   - pdl_wait() before its first read of anything an earlier kernel of the stream writes, and before
//     its first write (pdl_wait returns once the predecessor has completed and its writes are visible);
//   - pdl_launch_next() only after its own pdl_wait(), so that when a kernel starts, everything before
//     its predecessor has completed: a read before pdl_wait() of data written two or more kernels back
//     (the DeltaNet state of the previous step) is safe. The one exception: pdl_enter_next_first below,
//     for the few kernels (norm, DeltaNet conv, gated norm, attention combine) whose successors read
//     nothing before their wait that was written less than three kernels back.
// Where a kernel triggers: grids of a few blocks right after their wait (pdl_enter: the next kernel's
// launch and weight loads overlap all of their latency-bound work); grids of many blocks once each block
// is past its loads (earlier, the next kernel's waiting blocks would hold SM slots and bandwidth while
// this one still streams its weights).
// Without the launch attribute (other GPUs, the option off, kernels launched with <<<>>>) both calls
// return at once and the kernel runs as before.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "gpu_core/device.cuh"

namespace tandem::gpu::detail {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, in the order the contract asks: the kernels with nothing to load before their inputs.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_next();
}

// Both, the trigger first: the one exception to the contract's second rule, for a kernel of a few
// blocks whose successor reads before its wait only what was written three or more kernels back
// (weights; a state the successor itself wrote a step before). The successor then launches and loads
// while this kernel still waits for its predecessor, which may still run: so nothing that predecessor
// or this kernel writes may be read before the successor's wait. The rule's guarantee holds again one
// kernel on: the successor triggers only after its own wait.
__device__ __forceinline__ void pdl_enter_next_first() {
  pdl_launch_next();
  pdl_wait();
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute while
// gpu::programmatic_launch() is on. Only for kernels that keep the contract above.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (programmatic_launch()) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace tandem::gpu::detail
