// gpu_core/mma.cuh: the tensor-core instruction the kernels share (mma.sync m16n8k16, bf16 inputs,
// fp32 accumulation) and the bf16 pair packing its fragments use. Fragment layouts are PTX's: lane
// 4 g + q holds A rows g and g + 8 at columns 2q, 2q + 1 (a0, a1) and 2q + 8, 2q + 9 (a2, a3), B column g
// at rows 2q, 2q + 1 (b0) and 2q + 8, 2q + 9 (b1), and C rows g, g + 8 at columns 2q, 2q + 1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::gpu::detail {

// c += A B for one 16 x 8 tile over 16 inputs; a0..a3: A's registers (rows g / g + 8 at columns 2q.. /
// 2q + 8..: a0 = row g cols 2q.., a1 = row g + 8 cols 2q.., a2 = row g cols 2q + 8.., a3 = row g + 8
// cols 2q + 8..), b0, b1: B's.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two bf16 (round to nearest) in one word, `lo` in the low half (the lower column / row of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace tandem::gpu::detail
