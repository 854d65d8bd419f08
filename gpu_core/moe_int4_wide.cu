// gpu_core/moe_int4_wide.cu: decode MoE with 16-byte weight loads (moe_int4_decode_wide, see moe.cuh).
//
// Why this form: moe_int4_decode gives each lane one 4-byte code word at a time and re-reads the
// activations for every row, so a layer's ~13 MB of expert weights took
// 11 + 15 us on the H200 (~13% of bandwidth, latency- and issue-bound). Here each lane loads whole
// 16-byte vectors (4 words, 32 inputs, one quantisation group), every weight load of a thread is
// issued before any is used, and the fp32 input row is read directly (no separate fp16 gather launch).
#include <type_traits>

#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/pdl.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;

// The H200 profile (ncu) put both kernels at ~14 cycles between a warp's instructions with 4-16 warps
// an SM: issue-bound on the dequantising arithmetic, not on bytes. So the work is spread thin: a
// gate/up warp takes one row pair (4096 warps at the 35B shape), and a down half-warp one row for two
// of the token's experts (the row's k experts over 4 half-warps of the block, summed in shared memory).
constexpr int kWarps = 8;       // gate/up: warps per block
constexpr int kRowsUp = 1;      // gate/up output rows per warp (each: one gate row and one up row)
constexpr int kDownLanes = 16;  // lanes per down row
constexpr int kDownRows = 4;    // down rows per block
constexpr int kDownGroups = 4;  // half-warps per down row: group g takes the experts g, g + 4, ...
constexpr int kDownThreads = kDownRows * kDownGroups * kDownLanes;
constexpr int kMaxK = 8;        // experts per token
constexpr int kDownPer = kMaxK / kDownGroups;  // experts per half-warp

__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// Activations (x in shared memory, h in global memory) are kept chunk-major: the 8-input chunk c of
// vector v (inputs 32 v + 8 c ... + 7) at chunk c * nvec + v. A lane takes whole vectors and the
// lanes of a warp consecutive ones, so each of its four 16-byte chunk loads is contiguous across
// the lanes (row-major, lanes 64 B apart: four times the shared-memory wavefronts and L1 sectors).
__device__ __forceinline__ int64_t chunk_pos(int64_t e, int64_t nvec) { return (((e & 31) >> 3) * nvec + (e >> 5)) * 8 + (e & 7); }

// sum over the vector's 32 inputs of (q - z) * x: word_dot per 8-input word, the words' sums added in
// fp32 (the caller scales by the group's scale).
__device__ __forceinline__ float vec_dot(const uint4& w, const __half2 (&xv)[16], __half2 z) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < 4; ++m) acc += word_dot_h2(words[m], xv + 4 * m, z);
  return acc;
}

// Both kernels issue their weight loads (codes, scales, zero points) in one phase after the one
// dependent read of the expert table, then read the activations (gate/up: staged by the block; down:
// h in place, L1-cached) and compute: a chain of load -> use -> load phases, each a full memory
// latency, bounded an earlier form. Act-order experts gather x / h in their input order.

// gate/up: block (row block, pair p); warp w computes row r0 of gate and of up for pair p. Lane l
// takes vectors l + 32 i (i < NV) of each row: 16 B a lane, 512 B a warp per load. The block converts
// the token's x to fp16 once, into shared memory in gate's input order (and up's, with act order),
// while its weight loads are in flight: a warp each converting the whole row was most of the
// kernel's L1 traffic and instructions.
template <int NV>
__global__ void __launch_bounds__(kWarps * 32)
    wide_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                        const float* __restrict__ x, __half* __restrict__ h, int gshift) {
  extern __shared__ __align__(16) __half2 xs2[];  // [H / 2] in gate's input order, then [H / 2] in up's (act order)
  const int G = static_cast<int>(H >> 5) >> gshift;
  const int bx = blockIdx.x, p = blockIdx.y, t = p / k, lane = threadIdx.x & 31;
  pdl_wait();  // every weight address depends on the router's ids
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  if (!gate.qweight) return;  // not resident on the GPU (hybrid); uniform per block
  const int64_t r0 = (static_cast<int64_t>(bx) * kWarps + (threadIdx.x >> 5)) * kRowsUp, nvec = H / 32;
  const uint4* qg = reinterpret_cast<const uint4*>(gate.qweight);
  const uint4* qu = reinterpret_cast<const uint4*>(up.qweight);
  uint4 wg[kRowsUp][NV], wu[kRowsUp][NV];
  uint16_t sg[kRowsUp][NV], su[kRowsUp][NV];
  uint8_t zg[kRowsUp][NV], zu[kRowsUp][NV];
#pragma unroll
  for (int r = 0; r < kRowsUp; ++r)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = lane + 32 * i;
      const bool ok = r0 + r < I && v < nvec;
      const int64_t gi = (r0 + r) * G + (static_cast<int>(v) >> gshift);
      wg[r][i] = ok ? load_stream(qg + (r0 + r) * nvec + v) : zero4();
      wu[r][i] = ok ? load_stream(qu + (r0 + r) * nvec + v) : zero4();
      sg[r][i] = ok ? __ldg(gate.scales + gi) : uint16_t{0};
      su[r][i] = ok ? __ldg(up.scales + gi) : uint16_t{0};
      zg[r][i] = ok ? __ldg(gate.zeros + gi) : uint8_t{0};
      zu[r][i] = ok ? __ldg(up.zeros + gi) : uint8_t{0};
    }
  // x as fp16 pairs in each matrix's input order (rounded as pairs, __floats2half2_rn), while the weights load
  const float* xt = x + t * H;
  const bool own_up = up.perm != gate.perm;
  auto pair = [&](const int32_t* perm, int64_t i) {  // inputs 2i, 2i + 1 of a matrix's input order
    const int64_t a = perm ? perm[2 * i] : 2 * i, b = perm ? perm[2 * i + 1] : 2 * i + 1;
    return __floats2half2_rn(__ldg(xt + a), __ldg(xt + b));
  };
  for (int64_t i = threadIdx.x; i < H / 2; i += blockDim.x) {
    const int64_t at = chunk_pos(2 * i, nvec) / 2;
    xs2[at] = pair(gate.perm, i);
    if (own_up) xs2[H / 2 + at] = pair(up.perm, i);
  }
  __syncthreads();
  auto x32 = [&](int64_t base, int64_t v, __half2(&xv)[16]) {  // the 32 inputs of vector v from shared memory
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4 qq = *reinterpret_cast<const uint4*>(xs2 + base + 4 * (c * nvec + v));
      memcpy(&xv[4 * c], &qq, 16);
    }
  };
  float g[kRowsUp] = {}, u[kRowsUp] = {};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int64_t v = lane + 32 * i;
    if (v >= nvec) break;
    __half2 xv[16];
    x32(0, v, xv);
#pragma unroll
    for (int r = 0; r < kRowsUp; ++r)
      if (r0 + r < I) g[r] += __half2float(__ushort_as_half(sg[r][i])) * vec_dot(wg[r][i], xv, zero_1024(zg[r][i]));
    if (own_up) x32(H / 2, v, xv);  // act order: up's own input order
#pragma unroll
    for (int r = 0; r < kRowsUp; ++r)
      if (r0 + r < I) u[r] += __half2float(__ushort_as_half(su[r][i])) * vec_dot(wu[r][i], xv, zero_1024(zu[r][i]));
  }
  pdl_launch_next();  // past its loads (pdl.cuh; see gemv_bf16.cu's row_dot)
#pragma unroll
  for (int r = 0; r < kRowsUp; ++r) {
    const float gs = group_sum<32>(g[r]), us = group_sum<32>(u[r]);
    if (lane == r && r0 + r < I) h[p * I + chunk_pos(r0 + r, I / 32)] = __float2half_rn(gs / (1.0f + __expf(-gs)) * us);
  }
}

// The 32 h values [32 v, 32 v + 32) of row hr (fp16, chunk-major, nvec vectors) in the input order of its
// expert (perm: act order).
__device__ __forceinline__ void load_h32(const __half* __restrict__ hr, const int32_t* __restrict__ perm, int64_t v, int64_t nvec,
                                         __half2 (&hv)[16]) {
  if (!perm) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4 qq = __ldg(reinterpret_cast<const uint4*>(hr + 8 * (c * nvec + v)));
      memcpy(&hv[4 * c], &qq, 16);
    }
  } else {
    const int32_t* q = perm + 32 * v;
#pragma unroll
    for (int i = 0; i < 16; ++i) hv[i] = __halves2half2(hr[chunk_pos(__ldg(q + 2 * i), nvec)], hr[chunk_pos(__ldg(q + 2 * i + 1), nvec)]);
  }
}

// down: block (row block, token t) of kDownRows rows; half-warp (r, g) computes row r's share of the
// experts j = g + kDownGroups m (m < kDownPer, j < k), weighted, summed over its lanes; the block adds
// the kDownGroups shares of each row in group order. The weight loads go out before h is read.
template <int NV>
__global__ void __launch_bounds__(kDownThreads)
    wide_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids,
                     const float* __restrict__ weights, int k, const __half* __restrict__ h, float* __restrict__ out, int gshift) {
  __shared__ float share[kDownGroups][kDownRows];
  const int G = static_cast<int>(I >> 5) >> gshift;
  const int t = blockIdx.y, hw = threadIdx.x / kDownLanes, l = threadIdx.x % kDownLanes;
  const int r = hw % kDownRows, g = hw / kDownRows;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kDownRows + r, nvec = I / 32;
  const bool valid = row < H;
  pdl_wait();
  const Int4View* d[kDownPer];
  const uint32_t* q[kDownPer];  // null: no such expert, or not resident (hybrid)
  uint4 wd[kDownPer][NV];
  uint16_t sd[kDownPer][NV];
  uint8_t zd[kDownPer][NV];
  float rw[kDownPer];
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    const int j = g + kDownGroups * m;
    d[m] = j < k ? &experts[ids[t * k + j]].down : nullptr;
    q[m] = d[m] ? d[m]->qweight : nullptr;
    rw[m] = j < k ? __ldg(weights + t * k + j) : 0.0f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = l + kDownLanes * i;
      const bool ok = q[m] && valid && v < nvec;
      const int64_t gi = row * G + (static_cast<int>(v) >> gshift);
      wd[m][i] = ok ? load_stream(reinterpret_cast<const uint4*>(q[m]) + row * nvec + v) : zero4();
      sd[m][i] = ok ? __ldg(d[m]->scales + gi) : uint16_t{0};
      zd[m][i] = ok ? __ldg(d[m]->zeros + gi) : uint8_t{0};
    }
  }
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    if (!q[m] || !valid) continue;
    const __half* hr = h + (static_cast<int64_t>(t) * k + g + kDownGroups * m) * I;
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = l + kDownLanes * i;
      if (v >= nvec) break;
      __half2 hv[16];
      load_h32(hr, d[m]->perm, v, nvec, hv);
      a += __half2float(__ushort_as_half(sd[m][i])) * vec_dot(wd[m][i], hv, zero_1024(zd[m][i]));
    }
    acc += rw[m] * a;
  }
  pdl_launch_next();  // past its loads (pdl.cuh)
  acc = group_sum<kDownLanes>(acc);
  if (l == 0) share[g][r] = acc;
  __syncthreads();
  if (threadIdx.x < kDownRows) {
    const int64_t orow = static_cast<int64_t>(blockIdx.x) * kDownRows + threadIdx.x;
    float sum = share[0][threadIdx.x];
#pragma unroll
    for (int q = 1; q < kDownGroups; ++q) sum += share[q][threadIdx.x];
    if (orow < H) out[t * H + orow] = sum;
  }
}

// Row blocks of one pair's gate/up rows, and of one token's down rows.
int gate_up_blocks(int64_t I) { return static_cast<int>((I + kWarps * kRowsUp - 1) / (kWarps * kRowsUp)); }
int down_blocks(int64_t H) { return static_cast<int>((H + kDownRows - 1) / kDownRows); }

int vectors_per_lane(int64_t K, int lanes) { return static_cast<int>((K / 32 + lanes - 1) / lanes); }

// Returns launch(std::integral_constant<int, NV>) with the 16-byte vectors a lane holds (1, 2 or 4;
// the shapes moe_int4_decode_wide_fits takes need no more).
template <typename Launch>
cudaError_t with_vectors(int nv, Launch&& launch) {
  if (nv <= 1) return launch(std::integral_constant<int, 1>{});
  if (nv <= 2) return launch(std::integral_constant<int, 2>{});
  return launch(std::integral_constant<int, 4>{});
}

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
         vectors_per_lane(I, kDownLanes) <= 4;
}

cudaError_t moe_int4_decode_wide(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                 const float* weights, int T, int k, const float* x, uint16_t* h_scratch, float* out,
                                 cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || !moe_int4_decode_wide_fits(H, I, group_size, k)) return cudaErrorInvalidValue;
  auto* h = reinterpret_cast<__half*>(h_scratch);
  const int gs = group_shift(group_size);
  const dim3 up_grid(static_cast<unsigned>(gate_up_blocks(I)), static_cast<unsigned>(T * k));
  const cudaError_t err = with_vectors(vectors_per_lane(H, 32), [&](auto nv) {
    return launch(wide_gate_up_kernel<nv.value>, up_grid, dim3(kWarps * 32), 2 * H * sizeof(__half), stream, experts, H, I, ids, k, x, h, gs);
  });
  if (err != cudaSuccess) return err;
  const dim3 down_grid(static_cast<unsigned>(down_blocks(H)), static_cast<unsigned>(T));
  return with_vectors(vectors_per_lane(I, kDownLanes), [&](auto nv) {
    return launch(wide_down_kernel<nv.value>, down_grid, dim3(kDownThreads), 0, stream, experts, H, I, ids, weights, k, h, out, gs);
  });
}

}  // namespace tandem::gpu
