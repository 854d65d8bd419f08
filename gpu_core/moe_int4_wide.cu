// gpu_core/moe_int4_wide.cu: decode MoE with 16-byte weight loads (moe_int4_decode_wide, see moe.cuh).
//
// Why another decode kernel: moe_int4_decode(_prefetch) gives each lane one 4-byte code word at a
// time and re-reads the activations for every row, so a layer's ~13 MB of expert weights took
// 11 + 15 us on the H200 (~13% of bandwidth, latency- and issue-bound). Here each lane loads whole
// 16-byte vectors (4 words, 32 inputs, one quantisation group), every load of a block is issued
// before any is used, the activations are converted to fp16 once per warp and reused for the rows
// the warp computes, and the fp32 input row is read directly (no separate fp16 gather launch).
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;

constexpr int kWarps = 4;       // per block
constexpr int kRowsUp = 1;      // gate/up output rows per warp (each: one gate row and one up row); more
                                // rows a warp meant fewer warps for the same loads: latency-bound (ncu)
constexpr int kDownLanes = 16;  // lanes per down row and expert: a half-warp
constexpr int kMaxK = 8;        // experts per token held in registers by the down kernel (even)

__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// The 32 inputs [32 v, 32 v + 32) of x (fp32, in the matrix's input order: x[perm[i]] with act
// order) as 16 fp16 pairs.
__device__ __forceinline__ void load_x32(const float* __restrict__ x, const int32_t* __restrict__ perm, int64_t v, bool valid,
                                         __half2 (&xv)[16]) {
  if (!valid) {
#pragma unroll
    for (int i = 0; i < 16; ++i) xv[i] = __float2half2_rn(0.0f);
    return;
  }
  if (!perm) {
    const float4* p = reinterpret_cast<const float4*>(x + 32 * v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 f = __ldg(p + i);
      xv[2 * i] = __floats2half2_rn(f.x, f.y);
      xv[2 * i + 1] = __floats2half2_rn(f.z, f.w);
    }
  } else {
    const int32_t* q = perm + 32 * v;
#pragma unroll
    for (int i = 0; i < 16; ++i) xv[i] = __floats2half2_rn(__ldg(x + __ldg(q + 2 * i)), __ldg(x + __ldg(q + 2 * i + 1)));
  }
}

// sum over the vector's 32 inputs of (q - z) * x, fp16 products summed per 8-input word as
// word_dot does, the words' sums added in fp32 (the caller scales by the group's scale).
__device__ __forceinline__ float vec_dot(const uint4& w, const __half2 (&xv)[16], __half2 z) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    __half2 part = __hmul2(dequant_pair(words[m], 0, z), xv[4 * m]);
#pragma unroll
    for (int i = 1; i < 4; ++i) part = __hfma2(dequant_pair(words[m], i, z), xv[4 * m + i], part);
    const float2 f = __half22float2(part);
    acc += f.x + f.y;
  }
  return acc;
}

// Scale and zero point of the group holding vector v of row `row`: groups of 32 << gshift inputs, G
// of them a row (integer shifts: a 64-bit division per lookup cost more than the loads it serves).
struct GroupParams {
  float s;
  __half2 z;
};
__device__ __forceinline__ GroupParams group_of(const Int4View& W, int64_t row, int v, int G, int gshift) {
  const int64_t i = row * G + (v >> gshift);
  return {__half2float(__ushort_as_half(W.scales[i])), zero_1024(W.zeros[i])};
}

// gate/up: block (row block, pair p); warp w computes kRowsUp rows from r0 of gate and of up for pair p.
// Lane l takes vectors l + 32 i (i < NV) of each row: 16 B a lane, 512 B a warp per load.
template <int NV>
__global__ void __launch_bounds__(kWarps * 32)
    wide_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                        const float* __restrict__ x, __half* __restrict__ h, int gshift) {
  const int G = static_cast<int>(H >> 5) >> gshift;
  const int p = blockIdx.y, t = p / k, lane = threadIdx.x & 31;
  const Int4Expert& ex = experts[ids[p]];
  if (!ex.gate.qweight) return;  // not resident on the GPU (hybrid); uniform per block
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kRowsUp, nvec = H / 32;
  const uint4* qg = reinterpret_cast<const uint4*>(ex.gate.qweight);
  const uint4* qu = reinterpret_cast<const uint4*>(ex.up.qweight);
  uint4 wg[kRowsUp][NV], wu[kRowsUp][NV];
#pragma unroll
  for (int r = 0; r < kRowsUp; ++r)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = lane + 32 * i;
      const bool ok = r0 + r < I && v < nvec;
      wg[r][i] = ok ? load_stream(qg + (r0 + r) * nvec + v) : zero4();
      wu[r][i] = ok ? load_stream(qu + (r0 + r) * nvec + v) : zero4();
    }
  const float* xt = x + t * H;
  float g[kRowsUp] = {}, u[kRowsUp] = {};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int64_t v = lane + 32 * i;
    __half2 xv[16];
    load_x32(xt, ex.gate.perm, v, v < nvec, xv);
#pragma unroll
    for (int r = 0; r < kRowsUp; ++r)
      if (r0 + r < I && v < nvec) {
        const GroupParams q = group_of(ex.gate, r0 + r, static_cast<int>(v), G, gshift);
        g[r] += q.s * vec_dot(wg[r][i], xv, q.z);
      }
    if (ex.up.perm != ex.gate.perm) load_x32(xt, ex.up.perm, v, v < nvec, xv);  // act order: up's own input order
#pragma unroll
    for (int r = 0; r < kRowsUp; ++r)
      if (r0 + r < I && v < nvec) {
        const GroupParams q = group_of(ex.up, r0 + r, static_cast<int>(v), G, gshift);
        u[r] += q.s * vec_dot(wu[r][i], xv, q.z);
      }
  }
#pragma unroll
  for (int r = 0; r < kRowsUp; ++r) {
    const float gs = group_sum<32>(g[r]), us = group_sum<32>(u[r]);
    if (lane == r && r0 + r < I) h[p * I + r0 + r] = __float2half_rn(gs / (1.0f + __expf(-gs)) * us);
  }
}

// down: block (row block, token t); each warp computes one output row over the token's k experts,
// its two half-warps taking alternate experts (so twice the warps of a half-warp per row, each with
// half the serial work: the kernel is latency-bound). The k h rows are staged in shared memory (fp16,
// each in its expert's input order) while the weight loads of all k experts are in flight.
template <int NV>
__global__ void __launch_bounds__(kWarps * 32)
    wide_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids,
                     const float* __restrict__ weights, int k, const __half* __restrict__ h, float* __restrict__ out, int gshift) {
  extern __shared__ __align__(16) __half hs[];  // [k][I]
  constexpr int kPerHalf = kMaxK / 2;
  const int G = static_cast<int>(I >> 5) >> gshift;
  const int t = blockIdx.y, lane = threadIdx.x & 31, l = lane % kDownLanes, half = lane / kDownLanes;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t nvec = I / 32;
  const bool valid = row < H;
  uint4 wd[kPerHalf][NV];  // experts j = half + 2 m
#pragma unroll
  for (int m = 0; m < kPerHalf; ++m) {
    const int j = half + 2 * m;
    const uint32_t* q = j < k ? experts[ids[t * k + j]].down.qweight : nullptr;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = l + kDownLanes * i;
      wd[m][i] = q && valid && v < nvec ? load_stream(reinterpret_cast<const uint4*>(q) + row * nvec + v) : zero4();
    }
  }
  for (int j = 0; j < k; ++j) {  // stage h (k * I fp16): 16 B a thread per step, or a gather with act order
    const Int4View& down = experts[ids[t * k + j]].down;
    if (!down.qweight) continue;  // uniform per block
    const __half* hp = h + static_cast<int64_t>(t * k + j) * I;
    __half* dst = hs + j * I;
    if (!down.perm) {
      for (int64_t c = threadIdx.x; c < I / 8; c += blockDim.x)
        reinterpret_cast<uint4*>(dst)[c] = __ldg(reinterpret_cast<const uint4*>(hp) + c);
    } else {
      for (int64_t c = threadIdx.x; c < I; c += blockDim.x) dst[c] = hp[down.perm[c]];
    }
  }
  __syncthreads();
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < kPerHalf; ++m) {
    const int j = half + 2 * m;
    if (j >= k) break;
    const int p = t * k + j;
    const Int4View& down = experts[ids[p]].down;
    if (!down.qweight || !valid) continue;
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = l + kDownLanes * i;
      if (v >= nvec) break;
      __half2 hv[16];
      const uint4* src = reinterpret_cast<const uint4*>(hs + j * I + 32 * v);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint4 q = src[c];
        memcpy(&hv[4 * c], &q, 16);
      }
      const GroupParams gp = group_of(down, row, static_cast<int>(v), G, gshift);
      a += gp.s * vec_dot(wd[m][i], hv, gp.z);
    }
    acc += weights[p] * a;
  }
  acc = group_sum<32>(acc);
  if (valid && lane == 0) out[t * H + row] = acc;
}

template <int NV>
void launch_gate_up(const Int4Expert* e, int64_t H, int64_t I, const int32_t* ids, int T, int k, const float* x, __half* h,
                    int gshift, cudaStream_t s) {
  const int64_t rows = kWarps * kRowsUp;
  const dim3 grid(static_cast<unsigned>((I + rows - 1) / rows), static_cast<unsigned>(T * k));
  wide_gate_up_kernel<NV><<<grid, kWarps * 32, 0, s>>>(e, H, I, ids, k, x, h, gshift);
}

template <int NV>
void launch_down(const Int4Expert* e, int64_t H, int64_t I, const int32_t* ids, const float* w, int T, int k, const __half* h,
                 float* out, int gshift, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((H + kWarps - 1) / kWarps), static_cast<unsigned>(T));
  wide_down_kernel<NV><<<grid, kWarps * 32, k * I * sizeof(__half), s>>>(e, H, I, ids, w, k, h, out, gshift);
}

int vectors_per_lane(int64_t K, int lanes) { return static_cast<int>((K / 32 + lanes - 1) / lanes); }

// log2(group_size / 32), or -1 when group_size is not 32 times a power of two.
int group_shift(int64_t group_size) {
  for (int s = 0; s < 8; ++s)
    if (group_size == (int64_t{32} << s)) return s;
  return -1;
}

}  // namespace

bool moe_int4_decode_wide_fits(int64_t H, int64_t I, int64_t group_size, int k) {
  return k >= 1 && k <= kMaxK && H >= 32 && I >= 32 && H % 32 == 0 && I % 32 == 0 && group_shift(group_size) >= 0 &&
         H % group_size == 0 && I % group_size == 0 && vectors_per_lane(H, 32) <= 4 &&
         vectors_per_lane(I, kDownLanes) <= 4 && k * I * 2 <= 48 * 1024;
}

cudaError_t moe_int4_decode_wide(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                 const float* weights, int T, int k, const float* x, uint16_t* h_scratch, float* out,
                                 cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || !moe_int4_decode_wide_fits(H, I, group_size, k)) return cudaErrorInvalidValue;
  auto* h = reinterpret_cast<__half*>(h_scratch);
  const int gs = group_shift(group_size);
  switch (vectors_per_lane(H, 32)) {
    case 1: launch_gate_up<1>(experts, H, I, ids, T, k, x, h, gs, stream); break;
    case 2: launch_gate_up<2>(experts, H, I, ids, T, k, x, h, gs, stream); break;
    default: launch_gate_up<4>(experts, H, I, ids, T, k, x, h, gs, stream);
  }
  switch (vectors_per_lane(I, kDownLanes)) {
    case 1: launch_down<1>(experts, H, I, ids, weights, T, k, h, out, gs, stream); break;
    case 2: launch_down<2>(experts, H, I, ids, weights, T, k, h, out, gs, stream); break;
    default: launch_down<4>(experts, H, I, ids, weights, T, k, h, out, gs, stream);
  }
  return cudaGetLastError();
}

}  // namespace tandem::gpu
