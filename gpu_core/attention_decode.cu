// gpu_core/attention_decode.cu: gated attention decode (see attention.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gpu_core/attention.cuh"
#include "gpu_core/block_reduce.cuh"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 256;  // context rows per split

using detail::block_max;
using detail::block_sum;

// Blocks x = 0..nh-1 prepare query heads, nh..nh+nkv-1 key heads (and copy v), of token y (decode:
// the one token; prefill: token y of the chunk, at position pos[y]).
__global__ void prepare_kernel(AttentionDecodeArgs p) {
  __shared__ float red[kThreads / 32];
  __shared__ float buf[256];
  const int b = blockIdx.x, t = blockIdx.y, hd = p.hd, half = p.rotary_dim / 2;
  const bool is_q = b < p.nh;
  const int head = is_q ? b : b - p.nh;
  const float* src = is_q ? p.qg + (static_cast<int64_t>(t) * p.nh + head) * 2 * hd : p.k + (static_cast<int64_t>(t) * p.nkv + head) * hd;
  const float* w = is_q ? p.q_norm : p.k_norm;
  const int pos = p.pos[t];
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += src[i] * src[i];
  const float r = rsqrtf(block_sum(ss, red) / hd + p.eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = src[i] * r * (1.0f + w[i]);
  __syncthreads();
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float y = buf[i];
    if (i < p.rotary_dim) {
      const int f = i < half ? i : i - half;
      float sn, cs;
      sincosf(static_cast<float>(pos) * p.inv_freq[f], &sn, &cs);
      y = i < half ? buf[i] * cs - buf[i + half] * sn : buf[i] * cs + buf[i - half] * sn;
    }
    if (is_q) {
      p.q_rot[(static_cast<int64_t>(t) * p.nh + head) * hd + i] = y;
    } else {
      const int64_t row = (static_cast<int64_t>(pos) * p.nkv + head) * hd + i;
      p.k_cache[row] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
      p.v_cache[row] = __bfloat16_as_ushort(__float2bfloat16_rn(p.v[(static_cast<int64_t>(t) * p.nkv + head) * hd + i]));
    }
  }
}

// grid (nh, splits): scores for one chunk of context, its max and sum, and the unnormalised output.
__global__ void attend_kernel(AttentionDecodeArgs p) {
  __shared__ float red[kThreads / 32];
  __shared__ float q[256];
  __shared__ float score[kChunk];
  const int h = blockIdx.x, split = blockIdx.y, hd = p.hd, kvh = h / (p.nh / p.nkv);
  const int n_ctx = *p.pos + 1, begin = split * kChunk, end = min(n_ctx, begin + kChunk);
  float* part = p.partial + (static_cast<int64_t>(h) * p.max_splits + split) * (hd + 2);
  if (begin >= n_ctx) {
    if (threadIdx.x == 0) part[hd] = -INFINITY, part[hd + 1] = 0.0f;
    return;
  }
  for (int i = threadIdx.x; i < hd; i += blockDim.x) q[i] = p.q_rot[static_cast<int64_t>(h) * hd + i];
  __syncthreads();
  // One warp per context row: lanes split the head dimension.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int s = begin + warp; s < end; s += nwarps) {
    const uint16_t* kr = p.k_cache + (static_cast<int64_t>(s) * p.nkv + kvh) * hd;
    float d = 0.0f;
    for (int i = lane; i < hd; i += 32) d += q[i] * __bfloat162float(__ushort_as_bfloat16(kr[i]));
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) score[s - begin] = d * p.scale;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int s = threadIdx.x; s < end - begin; s += blockDim.x) m = fmaxf(m, score[s]);
  m = block_max(m, red);
  float l = 0.0f;
  for (int s = threadIdx.x; s < end - begin; s += blockDim.x) {
    score[s] = expf(score[s] - m);
    l += score[s];
  }
  l = block_sum(l, red);  // its leading barrier also publishes score[]
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0.0f;
    for (int s = begin; s < end; ++s)
      acc += score[s - begin] * __bfloat162float(__ushort_as_bfloat16(p.v_cache[(static_cast<int64_t>(s) * p.nkv + kvh) * hd + i]));
    part[i] = acc;
  }
  if (threadIdx.x == 0) part[hd] = m, part[hd + 1] = l;
}

// One block per head: merge the splits (log-sum-exp) and apply the output gate.
__global__ void combine_kernel(AttentionDecodeArgs p, int splits) {
  const int h = blockIdx.x, hd = p.hd;
  const float* part = p.partial + static_cast<int64_t>(h) * p.max_splits * (hd + 2);
  // Splits past the context wrote only m = -inf (their outputs are stale): skip them.
  const int used = min(splits, (*p.pos + kChunk) / kChunk);
  float m = -INFINITY;
  for (int s = 0; s < used; ++s) m = fmaxf(m, part[s * (hd + 2) + hd]);
  float l = 0.0f;
  for (int s = 0; s < used; ++s) l += part[s * (hd + 2) + hd + 1] * expf(part[s * (hd + 2) + hd] - m);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < used; ++s) acc += part[s * (hd + 2) + i] * expf(part[s * (hd + 2) + hd] - m);
    const float gate = p.qg[static_cast<int64_t>(h) * 2 * hd + hd + i];
    p.out[static_cast<int64_t>(h) * hd + i] = acc / l / (1.0f + expf(-gate));
  }
}

// Prefill, flash-attention form: block (head, group of kQ query tokens), one warp per query. Key/value
// rows go through shared memory in tiles of kKV; lane j scores row j of the tile; each warp keeps a
// running max m, sum l and output o (lane holds dims lane + 32 d), rescaled when the max grows.
constexpr int kQ = 8, kKV = 32;

__global__ void __launch_bounds__(kQ * 32) flash_prefill_kernel(AttentionDecodeArgs p, int n) {
  extern __shared__ __align__(16) float sm[];
  const int h = blockIdx.x, q0 = blockIdx.y * kQ, hd = p.hd, kvh = h / (p.nh / p.nkv), ks_stride = hd + 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = q0 + warp;
  float* qs = sm;                                           // [kQ][hd]
  auto* ks = reinterpret_cast<uint16_t*>(sm + kQ * hd);     // [kKV][hd + 2]: padded, lanes read rows
  uint16_t* vs = ks + kKV * ks_stride;                      // [kKV][hd]
  const bool active = t < n;
  const int my_pos = active ? p.pos[t] : -1;
  const int max_pos = p.pos[min(n, q0 + kQ) - 1];          // positions increase along the chunk
  for (int i = threadIdx.x; i < kQ * hd; i += blockDim.x) {
    const int tt = q0 + i / hd;
    qs[i] = tt < n ? p.q_rot[(static_cast<int64_t>(tt) * p.nh + h) * hd + i % hd] : 0.0f;
  }
  float o[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  float m = -INFINITY, l = 0.0f;
  for (int r0 = 0; r0 <= max_pos; r0 += kKV) {
    __syncthreads();  // the previous tile is consumed (and, the first time, qs is written)
    for (int i = threadIdx.x; i < kKV * hd; i += blockDim.x) {
      const int r = r0 + i / hd, c = i % hd;
      const int64_t at = (static_cast<int64_t>(r) * p.nkv + kvh) * hd + c;
      ks[(i / hd) * ks_stride + c] = r <= max_pos ? p.k_cache[at] : 0;
      vs[i] = r <= max_pos ? p.v_cache[at] : 0;
    }
    __syncthreads();
    if (!active || r0 > my_pos) continue;  // uniform per warp
    const int r = r0 + lane;
    float s = -INFINITY;
    if (r <= my_pos) {
      const float* q = qs + warp * hd;
      const uint16_t* kr = ks + lane * ks_stride;
      float d = 0.0f;
      for (int i = 0; i < hd; ++i) d += q[i] * __bfloat162float(__ushort_as_bfloat16(kr[i]));
      s = d * p.scale;
    }
    float tile_max = s;
    for (int off = 16; off > 0; off >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    const float m_new = fmaxf(m, tile_max), corr = expf(m - m_new);
    const float e = r <= my_pos ? expf(s - m_new) : 0.0f;
    float esum = e;
    for (int off = 16; off > 0; off >>= 1) esum += __shfl_xor_sync(0xffffffffu, esum, off);
    l = l * corr + esum;
#pragma unroll
    for (int d = 0; d < 8; ++d) o[d] *= corr;
    const int rows = min(kKV, my_pos - r0 + 1);
    for (int j = 0; j < rows; ++j) {
      const float pj = __shfl_sync(0xffffffffu, e, j);
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        const int i = lane + 32 * d;
        if (i < hd) o[d] += pj * __bfloat162float(__ushort_as_bfloat16(vs[j * hd + i]));
      }
    }
    m = m_new;
  }
  if (!active) return;
#pragma unroll
  for (int d = 0; d < 8; ++d) {
    const int i = lane + 32 * d;
    if (i >= hd) break;
    const float gate = p.qg[(static_cast<int64_t>(t) * p.nh + h) * 2 * hd + hd + i];
    p.out[(static_cast<int64_t>(t) * p.nh + h) * hd + i] = o[d] / l / (1.0f + expf(-gate));
  }
}

}  // namespace

cudaError_t attention_prefill(const AttentionDecodeArgs& p, int n, cudaStream_t stream) {
  if (n < 1 || p.nh < 1 || p.nkv < 1 || p.nh % p.nkv || p.hd < 2 || p.hd > 256 || p.rotary_dim % 2 || p.rotary_dim > p.hd ||
      p.max_ctx < 1)
    return cudaErrorInvalidValue;
  const size_t smem = kQ * p.hd * sizeof(float) + kKV * (p.hd + 2) * sizeof(uint16_t) + kKV * p.hd * sizeof(uint16_t);
  prepare_kernel<<<dim3(p.nh + p.nkv, n), kThreads, 0, stream>>>(p);
  flash_prefill_kernel<<<dim3(p.nh, (n + kQ - 1) / kQ), kQ * 32, smem, stream>>>(p, n);
  return cudaGetLastError();
}

cudaError_t attention_decode(const AttentionDecodeArgs& p, cudaStream_t stream) {
  if (p.nh < 1 || p.nkv < 1 || p.nh % p.nkv || p.hd < 2 || p.hd > 256 || p.rotary_dim % 2 || p.rotary_dim > p.hd ||
      p.max_ctx < 1 || p.max_splits < 1)
    return cudaErrorInvalidValue;
  // The grid covers the whole cache; splits past the current position return at once, so the
  // launch shape does not depend on *pos (graph-capturable).
  const int splits = (p.max_ctx + kChunk - 1) / kChunk;
  if (splits > p.max_splits) return cudaErrorInvalidValue;
  prepare_kernel<<<p.nh + p.nkv, kThreads, 0, stream>>>(p);
  attend_kernel<<<dim3(p.nh, splits), kThreads, 0, stream>>>(p);
  combine_kernel<<<p.nh, kThreads, 0, stream>>>(p, splits);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
