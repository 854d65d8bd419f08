// gpu_core/moe_int4.cu: fused routed-expert SwiGLU for decode, the form for the shapes and act-order
// experts moe_int4_decode_wide does not take (see moe.cuh).
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;
constexpr int kWarpsPerBlock = 8;


// The token's input row in gate's and up's input orders: x itself, or (act-order) permuted copies
// staged in xs [2][H]. Uniform per block (one expert per block); every thread must call it.
__device__ __forceinline__ void stage_inputs(const Int4Expert& ex, const __half* x, int64_t H, __half* xs, const __half*& xg,
                                             const __half*& xu) {
  xg = xu = x;
  if (!ex.gate.perm && !ex.up.perm) return;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    xs[i] = x[ex.gate.perm ? ex.gate.perm[i] : i];
    xs[H + i] = x[ex.up.perm ? ex.up.perm[i] : i];
  }
  __syncthreads();
  xg = xs;
  xu = xs + H;
}

template <int LANES>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    moe_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                       const __half* __restrict__ x, __half* __restrict__ h) {
  extern __shared__ __align__(16) __half xs[];  // act-order only: [2][H] permuted copies for gate, up
  const int p = blockIdx.y, t = p / k, l = (threadIdx.x & 31) % LANES;
  const Int4Expert& ex = experts[ids[p]];
  if (!ex.gate.qweight) return;  // not resident on the GPU (hybrid): the CPU computes it; uniform per block
  const int64_t row = row_of_thread<LANES, kWarpsPerBlock>();
  const bool valid = row < I;
  const __half *xg, *xu;
  stage_inputs(ex, x + t * H, H, xs, xg, xu);
  float g[1] = {0.0f}, u[1] = {0.0f};
  if (valid) {
    int4_row_dot<1, LANES>(ex.gate, row, l, xg, H, 1, g);
    int4_row_dot<1, LANES>(ex.up, row, l, xu, H, 1, u);
  }
  const float gs = group_sum<LANES>(g[0]), us = group_sum<LANES>(u[0]);
  if (valid && l == 0) h[p * I + row] = __float2half_rn(gs / (1.0f + __expf(-gs)) * us);
}

template <int LANES>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    moe_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids,
                    const float* __restrict__ weights, int k, const __half* __restrict__ h, float* __restrict__ out) {
  extern __shared__ __align__(16) __half hs[];  // act-order only: [I] permuted copy of h
  const int t = blockIdx.y, l = (threadIdx.x & 31) % LANES;
  const int64_t row = row_of_thread<LANES, kWarpsPerBlock>();
  const bool valid = row < H;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int p = t * k + j;
    const Int4View& down = experts[ids[p]].down;
    if (!down.qweight) continue;  // not resident (hybrid); uniform per block
    const __half* hp = h + p * I;
    if (down.perm) {  // uniform per block
      __syncthreads();  // the previous expert's copy is no longer read
      for (int64_t i = threadIdx.x; i < I; i += blockDim.x) hs[i] = hp[down.perm[i]];
      __syncthreads();
      hp = hs;
    }
    float a[1] = {0.0f};
    if (valid) int4_row_dot<1, LANES>(down, row, l, hp, I, 1, a);
    acc += weights[p] * a[0];  // weighting each lane's share is the same as weighting the sum
  }
  acc = group_sum<LANES>(acc);
  if (valid && l == 0) out[t * H + row] = acc;
}

template <int LANES>
void launch_gate_up(const Int4Expert* e, int64_t H, int64_t I, const int32_t* ids, int T, int k, const __half* x, __half* h, cudaStream_t s) {
  const int64_t rows = kWarpsPerBlock * (32 / LANES);
  const dim3 grid(static_cast<unsigned>((I + rows - 1) / rows), static_cast<unsigned>(T * k));
  moe_gate_up_kernel<LANES><<<grid, kWarpsPerBlock * 32, 2 * H * sizeof(__half), s>>>(e, H, I, ids, k, x, h);
}

template <int LANES>
void launch_down(const Int4Expert* e, int64_t H, int64_t I, const int32_t* ids, const float* w, int T,
                 int k, const __half* h, float* out, cudaStream_t s) {
  const int64_t rows = kWarpsPerBlock * (32 / LANES);
  const dim3 grid(static_cast<unsigned>((H + rows - 1) / rows), static_cast<unsigned>(T));
  moe_down_kernel<LANES><<<grid, kWarpsPerBlock * 32, I * sizeof(__half), s>>>(e, H, I, ids, w, k, h, out);
}

}  // namespace

cudaError_t moe_int4_decode(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                            const float* weights, int T, int k, const uint16_t* x_half, uint16_t* h_scratch, float* out,
                            cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || k < 1 || H % 8 || I % 8 || group_size % 8 || H % group_size || I % group_size ||
      2 * H * 2 > 48 * 1024)
    return cudaErrorInvalidValue;
  const auto* x = reinterpret_cast<const __half*>(x_half);
  auto* h = reinterpret_cast<__half*>(h_scratch);
  switch (lanes_for(H)) {
    case 32: launch_gate_up<32>(experts, H, I, ids, T, k, x, h, stream); break;
    case 16: launch_gate_up<16>(experts, H, I, ids, T, k, x, h, stream); break;
    default: launch_gate_up<8>(experts, H, I, ids, T, k, x, h, stream);
  }
  switch (lanes_for(I)) {
    case 32: launch_down<32>(experts, H, I, ids, weights, T, k, h, out, stream); break;
    case 16: launch_down<16>(experts, H, I, ids, weights, T, k, h, out, stream); break;
    default: launch_down<8>(experts, H, I, ids, weights, T, k, h, out, stream);
  }
  return cudaGetLastError();
}

}  // namespace tandem::gpu
