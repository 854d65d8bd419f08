// gpu_core/moe_int4_tiles.cu: routed experts for decode straight from the int4 tile layout (the host
// experts' form), for weights read in place over PCIe (see int4_tiles.cuh).
//
// The link is slow to answer (~1-2 µs a read) and fast once busy (~50 GB/s on the H200 machine), so
// every warp keeps 8 reads of 16 bytes a lane in flight: a warp takes a 16-row tile and walks its
// inputs 64 at a time (512 contiguous bytes: 8 octets x 16 rows x 4 bytes), lane l reading octet l/4
// for rows 4(l%4)..4(l%4)+3. An octet lies in one quantisation group (group_size % 8 == 0), so a lane
// sums q * x over its 8 inputs per row and applies scale * (that - zero * sum x) once per octet.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu_core/int4_tiles.cuh"

#include "gpu_core/int4_layout.h"

namespace tandem::gpu {

namespace {

constexpr int kBatch = 8;  // 512-byte pieces a warp has in flight
constexpr int kMaxLinkSlots = 16;
static_assert(sizeof(Int4TilesExpert) == kInt4TilesExpertBytes, "int4_layout.h counts the link's tables with this size");

struct Pick {
  int j = -1;                           // the top-k slot, -1: no s-th link expert
  const Int4TilesExpert* ex = nullptr;  // its weights, where they lie
};

// The token's s-th link expert: the s-th of the first m host experts of its top-k (slot order).
__device__ __forceinline__ Pick link_pick(const Int4TilesExpert* experts, int E, const int32_t* ids, int k, int m, int s) {
  for (int j = 0, found = 0; j < k && found < m; ++j) {
    const int e = ids[j];
    if (e < 0 || e >= E || !experts[e].gate.w) continue;
    if (found++ == s) return {j, experts + e};
  }
  return {};
}

// One warp: tile t of M [.., cols] dotted with xin [cols] (fp32, 16-byte aligned). On return lanes
// 0..3 hold rows 16t + 4 lane + q in acc[q]. sc / zp: this warp's shared room for the tile's scales
// (groups * 16 fp16) and zero points (groups * 16 bytes).
__device__ __forceinline__ void tile_dot(const Int4TilesView& M, int64_t t, int64_t cols, int64_t group_size, const float* __restrict__ xin,
                                         float acc[4], uint16_t* sc, uint8_t* zp) {
  const int lane = threadIdx.x & 31;
  const int64_t G = cols / group_size, pieces = (cols + 63) / 64;
  const int gs = static_cast<int>(group_size);
  const uint4* wt = reinterpret_cast<const uint4*>(M.w + t * cols * 8) + lane;
  // The tile's scales (and zero points): read first, parked in shared memory once the first weight
  // reads are on their way (one wait for the link instead of two). G <= 32 (moe_int4_tiles_fits).
  uint4 sreg[2] = {}, zreg = {};
  {
    const uint4* s = reinterpret_cast<const uint4*>(M.scales + t * G * 16);
    for (int u = 0; u < 2; ++u)
      if (lane + 32 * u < 2 * G) sreg[u] = __ldcs(s + lane + 32 * u);
    if (M.zeros && lane < G) zreg = __ldcs(reinterpret_cast<const uint4*>(M.zeros + t * G * 16) + lane);
  }
  acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
  const int r0 = 4 * (lane & 3);
  for (int64_t c0 = 0; c0 < pieces; c0 += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (c0 + b < pieces && 64 * (c0 + b) + 8 * (lane >> 2) < cols) v[b] = __ldcs(wt + (c0 + b) * 32);
    if (c0 == 0) {
      for (int u = 0; u < 2; ++u)
        if (lane + 32 * u < 2 * G) reinterpret_cast<uint4*>(sc)[lane + 32 * u] = sreg[u];
      if (M.zeros && lane < G) reinterpret_cast<uint4*>(zp)[lane] = zreg;
      __syncwarp();
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t c = c0 + b;
      const int64_t i0 = 64 * c + 8 * (lane >> 2);
      if (c >= pieces || i0 >= cols) break;  // the last piece of a matrix narrower than 64 inputs a tile row
      const int g = static_cast<int>(i0) / gs;
      const float4 xa = *reinterpret_cast<const float4*>(xin + i0), xb = *reinterpret_cast<const float4*>(xin + i0 + 4);
      const float x8[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
      const float xsum = ((x8[0] + x8[1]) + (x8[2] + x8[3])) + ((x8[4] + x8[5]) + (x8[6] + x8[7]));
      const uint32_t words[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t w = words[q];
        float qx = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          qx = fmaf(static_cast<float>((w >> (8 * j)) & 0xfu), x8[j], qx);
          qx = fmaf(static_cast<float>((w >> (8 * j + 4)) & 0xfu), x8[4 + j], qx);
        }
        const int r = r0 + q;
        const float z = M.zeros ? static_cast<float>(zp[g * 16 + r]) : 8.0f;
        const float s = __half2float(__ushort_as_half(sc[g * 16 + r]));
        acc[q] = fmaf(s, fmaf(-z, xsum, qx), acc[q]);
      }
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
    for (int d = 4; d < 32; d *= 2) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], d);
  __syncwarp();  // sc / zp may be reused by the caller
}

// Act order: x gathered by each link expert's gate and up perms once, into xs [m][2][H].
__global__ void __launch_bounds__(256) gather_kernel(const Int4TilesExpert* __restrict__ experts, int E, const int32_t* __restrict__ ids,
                                                     int k, int m, int64_t H, const float* __restrict__ x, float* __restrict__ xs) {
  const int s = blockIdx.x;
  const Pick p = link_pick(experts, E, ids, k, m, s);
  if (p.j < 0) return;
  const Int4TilesExpert& ex = *p.ex;
  float* dst = xs + static_cast<int64_t>(s) * 2 * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    dst[i] = x[ex.gate.perm ? ex.gate.perm[i] : i];
    dst[H + i] = x[ex.up.perm ? ex.up.perm[i] : i];
  }
}

// grid (I / 16, link slots), 2 warps: gate's tile and up's tile of link slot s; h [slots][I] = silu(g) * u.
__global__ void __launch_bounds__(64) gate_up_kernel(const Int4TilesExpert* __restrict__ experts, int E, const int32_t* __restrict__ ids,
                                                     int k, int m, int64_t H, int64_t I, int64_t group_size,
                                                     const float* __restrict__ x, const float* __restrict__ xs, float* __restrict__ h) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float gu[2][16];
  const int s = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const Pick p = link_pick(experts, E, ids, k, m, s);
  if (p.j < 0) return;  // uniform per block
  const Int4TilesExpert& ex = *p.ex;
  const int64_t G = H / group_size, t = blockIdx.x;
  uint16_t* sc = reinterpret_cast<uint16_t*>(smem + warp * G * 48);
  uint8_t* zp = smem + warp * G * 48 + G * 32;
  const float* xin = xs ? xs + (static_cast<int64_t>(s) * 2 + warp) * H : x;
  float acc[4];
  tile_dot(warp ? ex.up : ex.gate, t, H, group_size, xin, acc, sc, zp);
  if (lane < 4)
    for (int q = 0; q < 4; ++q) gu[warp][4 * lane + q] = acc[q];
  __syncthreads();
  if (threadIdx.x < 16) {
    const float g = gu[0][threadIdx.x], u = gu[1][threadIdx.x];
    h[static_cast<int64_t>(s) * I + 16 * t + threadIdx.x] = g / (1.0f + expf(-g)) * u;
  }
}

// grid (H / 16), a warp per link slot: warp s takes slot s's down tile; out[16t + r] += sum over s
// (in order) of weight * row.
__global__ void __launch_bounds__(32 * kMaxLinkSlots) down_kernel(const Int4TilesExpert* __restrict__ experts, int E,
                                                                  const int32_t* __restrict__ ids, const float* __restrict__ weights, int k,
                                                                  int m, int64_t I, int64_t group_size,
                                                                  const float* __restrict__ h, float* __restrict__ out, bool accumulate) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float part[kMaxLinkSlots][16];
  __shared__ float wslot[kMaxLinkSlots];
  const int s = threadIdx.x >> 5, lane = threadIdx.x & 31, slots = blockDim.x >> 5;
  const int64_t G = I / group_size, t = blockIdx.x;
  const Pick p = link_pick(experts, E, ids, k, m, s);
  const int j = p.j;
  if (j >= 0) {
    float acc[4];
    tile_dot(p.ex->down, t, I, group_size, h + static_cast<int64_t>(s) * I, acc,
             reinterpret_cast<uint16_t*>(smem + s * G * 48), smem + s * G * 48 + G * 32);
    if (lane < 4)
      for (int q = 0; q < 4; ++q) part[s][4 * lane + q] = acc[q];
  }
  if (lane == 0) wslot[s] = j >= 0 ? weights[j] : 0.0f;
  if (j < 0 && lane < 16) part[s][lane] = 0.0f;
  __syncthreads();
  if (threadIdx.x < 16) {
    float v = 0.0f;
    for (int i = 0; i < slots; ++i) v = fmaf(wslot[i], part[i][threadIdx.x], v);
    out[16 * t + threadIdx.x] = accumulate ? out[16 * t + threadIdx.x] + v : v;
  }
}

}  // namespace

cudaError_t moe_int4_tiles_decode(const Int4TilesExpert* experts, int E, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                  const float* weights, int k, int m, bool act_order, const float* x, void* scratch, float* out,
                                  cudaStream_t stream, bool accumulate) {
  if (!experts || E <= 0 || !ids || !weights || !x || !scratch || !out || !moe_int4_tiles_fits(H, I, group_size, k, m))
    return cudaErrorInvalidValue;
  const int slots = m;
  float* h = static_cast<float*>(scratch);
  float* xs = act_order ? h + static_cast<int64_t>(slots) * I : nullptr;
  if (act_order) gather_kernel<<<slots, 256, 0, stream>>>(experts, E, ids, k, m, H, x, xs);
  gate_up_kernel<<<dim3(static_cast<unsigned>(I / 16), static_cast<unsigned>(slots)), 64, 2 * (H / group_size) * 48, stream>>>(
      experts, E, ids, k, m, H, I, group_size, x, xs, h);
  down_kernel<<<static_cast<unsigned>(H / 16), 32 * slots, slots * (I / group_size) * 48, stream>>>(experts, E, ids, weights, k, m, I,
                                                                                                   group_size, h, out, accumulate);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
