// gpu_core/gemv_bf16.cu: bf16 weights x fp32 activations, one warp per output row (see gemv.cuh).
#include <cuda_runtime.h>

#include <type_traits>

#include "gpu_core/act_quant.cuh"
#include "gpu_core/block_reduce.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/gemv_bf16_mma.cuh"
#include "gpu_core/gemv_row.cuh"
#include "gpu_core/handoff.cuh"
#include "gpu_core/load_stream.cuh"
#include "gpu_core/mma.cuh"
#include "gpu_core/norm_row.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/rows8_row.cuh"
#include "gpu_core/topk_warp.cuh"

namespace tandem::gpu {

namespace {

constexpr int kWarpsPerBlock = 8;
static_assert(kWarpsPerBlock >= 2, "route_tail: warp 0 ranks the experts while the others write");

using detail::load_stream;
using detail::row_finish;
using detail::row_prefetch;

// The row's first weight vectors, loaded before the kernel waits for the one before it (pdl.cuh:
// weights are never written), then the rest of the dot product; the next kernel may launch once every
// block is past its loads (earlier, its blocks would take SM slots from this grid's later waves).
// early_next: the next kernel may launch once the block is past its wait (gemv_bf16's early_next).
template <int TMAX, bool SWIGLU, int PRE>
__device__ __forceinline__ void row_dot(const uint16_t* __restrict__ W, int64_t N, int64_t K, const float* __restrict__ x,
                                        const float* __restrict__ u, int T, int64_t row, int lane, float (&acc)[TMAX],
                                        bool early_next) {
  uint4 pre[PRE];
  row_prefetch(W, N, K, row, lane, pre);
  detail::pdl_wait();
  if (early_next) detail::pdl_launch_next();
  row_finish<TMAX, SWIGLU, false, PRE>(W, N, K, x, u, T, row, lane, pre, acc);
  if (!early_next) detail::pdl_launch_next();
}

template <int TMAX, bool SWIGLU = false, int PRE = 4>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_bf16_kernel(const uint16_t* __restrict__ W, int64_t N, int64_t K, const float* __restrict__ x, int T, RowsOut y,
                     const float* __restrict__ u, bool early_next) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  float acc[TMAX];
  row_dot<TMAX, SWIGLU, PRE>(W, N, K, x, u, T, row, lane, acc, early_next);
  if (row >= N) return;  // whole warps exit together: shuffles below stay full-warp
  detail::warp_store_row<TMAX>(acc, T, 1.0f, lane, [&](int t) { return y.at(t, row); });
}

// gemv_bf16_mma_kernel's launch, in mma.cuh's with_mma_shape.
template <bool SWIGLU>
cudaError_t launch_mma(const uint16_t* W, int64_t N, int64_t K, const float* x, const float* u, int T, const RowsOut& y, cudaStream_t stream) {
  return detail::with_mma_shape(N, [&](auto mt, auto warps) {
    const dim3 grid(static_cast<unsigned>((N + 16 * mt() - 1) / (16 * mt()))), block(warps() * 32);
    return detail::launch(detail::gemv_bf16_mma_kernel<mt(), SWIGLU, warps()>, grid, block, 0, stream, W, N, K, x, u, T, y);
  });
}

// The router GEMV's end (T = 1): every block stores its rows (into y's parts) and fences, takes a
// ticket; in the block holding the last ticket, warp 0 reads logits[0..E) (y's first part) back from L2
// and runs the warp top-k there while the other warps run on_last(first, stride) (their thread
// threadIdx.x - 32 of blockDim.x - 32: the writes the kernels after it read), then warp 0 re-arms the
// counter for the next launch. A row's sum is stored times `scale` (1 for bf16 rows; an 8-bit row's
// scale, as warp_store_row applies it). Returns whether this block was the last.
template <typename OnLast>
__device__ __forceinline__ bool route_tail(float acc, float scale, int64_t row, int lane, int64_t N, const RowsOut& y, int E, int k,
                                           unsigned* counter, int32_t* ids, float* weights, OnLast&& on_last) {
  if (row < N) {  // no early return: the block meets at the barrier below
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      *y.at(0, row) = acc * scale;
      __threadfence();  // visible device-wide before this block's ticket
    }
  }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();
  if (threadIdx.x < 32) {
    detail::warp_router_topk(y.dst[0], E, k, ids, weights);  // the logits: y's first part
    if (threadIdx.x == 0) *counter = 0u;
  } else {
    on_last(static_cast<int>(threadIdx.x) - 32, static_cast<int>(blockDim.x) - 32);
  }
  return true;
}

// The last block's post of its router result to the host (handoff.cuh's HostPost, as host_post does it:
// the row, ids and weights, made visible system-wide, then the flag).
__device__ __forceinline__ void post_route(const HostPost& post, const float* xs, int64_t K, const int32_t* ids, const float* weights, int k) {
  __syncthreads();  // warp 0's ids and weights are written
  for (int64_t i = threadIdx.x; i < K; i += blockDim.x) post.x[i] = xs[i];
  if (threadIdx.x < k) {
    post.ids[threadIdx.x] = ids[threadIdx.x];
    post.weights[threadIdx.x] = weights[threadIdx.x];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned*>(post.flag) = post.value;
}

// The router GEMV with the norm before it in the launch: each block normalises the row into shared memory
// (norm_row, the norm kernel's arithmetic) while its first weight vectors load, then computes its
// rows from there; the last block writes h' and x for the kernels after it (every block has read h
// by then: its ticket follows its reads), and with post.flag posts x, ids and weights to the host.
// With qx.parts the blocks quantise x's vectors between them (off the last block's path). Rows N ..
// N + w8.N (ROWS8; else none, w8 unused) are w8's 8-bit rows, each as gemv_rows8's one-token kernel
// computes it (rows8_row.cuh), from the same x. ROWS8 is a template argument so that the bf16-only
// launches keep the code they had without it (as a runtime branch it cost them 1.1% on the H100).
template <int PER, int PRE, bool ROWS8>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_bf16_norm_topk_kernel(const uint16_t* __restrict__ W, int64_t N, Rows8View w8, int64_t K, float* h, const float* a, const float* s,
                               const float* gate, const float* norm_w, float eps, float* x, RowsOut y, int E, int k, unsigned* counter,
                               int32_t* ids, float* weights, HostPost post, QuantX qx) {
  extern __shared__ __align__(16) float sm[];  // x [K], then h' [K]
  float* xs = sm;
  float* hs = sm + K;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5), row8 = row - N;
  const bool is8 = ROWS8 && row8 >= 0 && row8 < w8.N;  // whole warps
  uint4 pre[PRE];
  if (is8) detail::rows8_prefetch(w8.codes, K, row8, lane, pre);
  else row_prefetch(W, N, K, row, lane, pre);
  detail::pdl_wait();
  detail::norm_row<PER>(
      h, a, s, gate, norm_w, K, eps, [&](int64_t i, float v) { hs[i] = v; }, [&](int64_t i, float v) { xs[i] = v; });
  __syncthreads();
  float dot[1];
  float scale = 1.0f;
  if (is8) {  // a constant false in the bf16-only instances
    dot[0] = w8.format == RowFormat::Int8 ? detail::rows8_finish<RowFormat::Int8, PRE, false, true>(w8.codes, K, xs, nullptr, row8, lane, pre)
                                          : detail::rows8_finish<RowFormat::Fp8, PRE, false, true>(w8.codes, K, xs, nullptr, row8, lane, pre);
    scale = w8.scales[row8];
  } else {
    row_finish<1, false, true, PRE>(W, N, K, xs, nullptr, 1, row, lane, pre, dot);
  }
  detail::pdl_launch_next();
  if (qx.parts) {  // x quantised for the decode MoE: every block holds the same x, each quantises its share
    const int warps = static_cast<int>(blockDim.x >> 5);
    detail::quantise_vectors(xs, K, qx, 0, static_cast<int>(blockIdx.x) * warps + (threadIdx.x >> 5), static_cast<int>(gridDim.x) * warps);
  }
  const int64_t rows = ROWS8 ? N + w8.N : N;
  const bool last = route_tail(dot[0], scale, row, lane, rows, y, E, k, counter, ids, weights, [&](int first, int stride) {
    for (int64_t i = first; i < K; i += stride) {
      if (a) h[i] = hs[i];
      x[i] = xs[i];
    }
  });
  if (last && post.flag) post_route(post, xs, K, ids, weights, k);
}

// Returns launch(std::integral_constant<int, PRE>) with the weight vectors a lane prefetches for rows of
// K inputs at one token: all of them up to 4096 inputs (16 vectors, 64 registers), else 4 and a loop.
template <typename Launch>
cudaError_t with_pre(int64_t K, Launch&& launch) {
  const int64_t per_lane = (K / 8 + 31) / 32;
  if (per_lane <= 4 || per_lane > 16) return launch(std::integral_constant<int, 4>{});
  if (per_lane <= 8) return launch(std::integral_constant<int, 8>{});
  return launch(std::integral_constant<int, 16>{});
}

// gemv_bf16_norm_topk_kernel's launch.
cudaError_t launch_norm_gemv(const uint16_t* W, int64_t N, const Rows8View& w8, int64_t K, float* h, const float* a, const float* shared, const float* gate,
                             const float* norm_w, float eps, float* x, const RowsOut& y, int E, int k, unsigned* counter, int32_t* ids,
                             float* weights, const HostPost& post, const QuantX& qx, cudaStream_t stream) {
  if (K % 8 != 0 || K > 16 * kWarpsPerBlock * 32 || N < 1 || !counter || (shared && (!a || !gate))) return cudaErrorInvalidValue;
  if (w8.N && (w8.K != K || !w8.codes || !w8.scales || w8.format == RowFormat::Bf16 || K % 16 != 0)) return cudaErrorInvalidValue;
  if (!rows_out_fits(y, N + w8.N) || y.end[0] < E) return cudaErrorInvalidValue;  // the logits in the first part
  if (qx.parts && (K % 32 != 0 || !qx.vectors)) return cudaErrorInvalidValue;
  if (post.flag && (!post.x || !post.ids || !post.weights)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((N + w8.N + kWarpsPerBlock - 1) / kWarpsPerBlock)), block(kWarpsPerBlock * 32);
  const size_t smem = 2 * static_cast<size_t>(K) * sizeof(float);
  return detail::with_norm_per_thread(K, kWarpsPerBlock * 32, [&](auto per) {
    if constexpr (per.value > 0) {  // K <= 16 x threads (checked above): never the loop form
      return with_pre(K, [&](auto pre) {
        auto go = [&](auto kernel) {
          return detail::launch(kernel, grid, block, smem, stream, W, N, w8, K, h, a, shared, gate, norm_w, eps, x, y, E, k, counter, ids,
                                weights, post, qx);
        };
        if (w8.N) return go(gemv_bf16_norm_topk_kernel<per.value, pre.value, true>);
        return go(gemv_bf16_norm_topk_kernel<per.value, pre.value, false>);
      });
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace

cudaError_t gemv_bf16_router_topk_norm(const uint16_t* W, int64_t N, int64_t K, float* h, const float* a, const float* shared,
                                       const float* gate, const float* norm_w, float eps, float* x, const RowsOut& y, int E, int k,
                                       unsigned* counter, int32_t* ids, float* weights, cudaStream_t stream, const HostPost* post,
                                       QuantX qx, const Rows8View* w8) {
  if (E < 1 || E > N || E > detail::kRouterMaxExperts || k < 1 || k > E || k > detail::kRouterMaxTopK) return cudaErrorInvalidValue;
  return launch_norm_gemv(W, N, w8 ? *w8 : Rows8View{}, K, h, a, shared, gate, norm_w, eps, x, y, E, k, counter, ids, weights, post ? *post : HostPost{}, qx,
                          stream);
}

bool rows_out_fits(const RowsOut& out, int64_t N) {
  if (out.parts < 1 || out.parts > RowsOut::kMaxParts || out.end[out.parts - 1] != N) return false;
  for (int s = 0; s < out.parts; ++s)
    if (!out.dst[s] || out.end[s] <= (s ? out.end[s - 1] : 0)) return false;
  return true;
}

cudaError_t gemv_bf16(const uint16_t* W, int64_t N, int64_t K, const float* x, int T, float* y, cudaStream_t stream, bool early_next) {
  return gemv_bf16(W, N, K, x, T, RowsOut::one(y, N), stream, early_next);
}

cudaError_t gemv_bf16(const uint16_t* W, int64_t N, int64_t K, const float* x, int T, const RowsOut& y, cudaStream_t stream,
                      bool early_next) {
  if (T < 1 || T > kMaxGemvTokens || K % 8 != 0 || N < 1 || !rows_out_fits(y, N)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock)), block(kWarpsPerBlock * 32);
  const float* none = nullptr;
  if (T > 1) return launch_mma<false>(W, N, K, x, nullptr, T, y, stream);
  return with_pre(K, [&](auto pre) {
    return detail::launch(gemv_bf16_kernel<1, false, pre.value>, grid, block, 0, stream, W, N, K, x, T, y, none, early_next);
  });
}

cudaError_t gemv_bf16_swiglu(const uint16_t* W, int64_t N, int64_t K, const float* g, const float* u, int T, float* y,
                             cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || K % 8 != 0 || N < 1) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock)), block(kWarpsPerBlock * 32);
  const RowsOut out = RowsOut::one(y, N);
  if (T > 1) return launch_mma<true>(W, N, K, g, u, T, out, stream);
  return with_pre(K, [&](auto pre) {
    return detail::launch(gemv_bf16_kernel<1, true, pre.value>, grid, block, 0, stream, W, N, K, g, T, out, u, false);
  });
}

}  // namespace tandem::gpu
