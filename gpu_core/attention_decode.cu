// gpu_core/attention_decode.cu: gated attention decode (see attention.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "gpu_core/attention.cuh"
#include "gpu_core/block_reduce.cuh"
#include "gpu_core/fp8.cuh"
#include "gpu_core/mma.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/smem.cuh"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = kAttnDecodeSplitRows;  // context rows per split

using detail::block_max;
using detail::block_sum;

// Cache rows (attention.cuh): value i of a KV head's part of a row, before the row's scale, and the
// scale.
template <RowFormat F>
__device__ __forceinline__ float code_value(uint32_t c) {
  if constexpr (F == RowFormat::Int8) return static_cast<float>(static_cast<int8_t>(c));
  else return detail::fp8_to_float(c);
}
__device__ __forceinline__ float cache_value(const uint8_t* head, int i, RowFormat f) {
  if (f == RowFormat::Bf16) return __bfloat162float(__ushort_as_bfloat16(reinterpret_cast<const uint16_t*>(head)[i]));
  return f == RowFormat::Int8 ? code_value<RowFormat::Int8>(head[i]) : code_value<RowFormat::Fp8>(head[i]);
}
// Where KV head kvh's values start in the row at `row`, and where a coded row's scales start.
template <typename Byte>
__device__ __forceinline__ Byte* cache_head(Byte* row, int kvh, int hd, RowFormat f) {
  return row + static_cast<int64_t>(kvh) * hd * row_value_bytes(f);
}
template <typename Byte>
__device__ __forceinline__ auto cache_scales(Byte* row, int nkv, int hd) {
  using Float = std::conditional_t<std::is_const_v<Byte>, const float, float>;
  return reinterpret_cast<Float*>(row + kv_codes_bytes(nkv, hd));
}
// KV head kvh's scale in the row at `row` (1 for bf16).
__device__ __forceinline__ float cache_scale(const uint8_t* row, int kvh, int nkv, int hd, RowFormat f) {
  return f == RowFormat::Bf16 ? 1.0f : cache_scales(row, nkv, hd)[kvh];
}

// Stores a KV head's values x[0..hd) (shared memory) into its part of a cache row: bf16, or the codes
// and the scale of the head's largest magnitude (the block reduces it through `red`).
__device__ void store_cache_head(const float* x, uint8_t* row, int kvh, int nkv, int hd, RowFormat f, float* red) {
  uint8_t* head = cache_head(row, kvh, hd, f);
  if (f == RowFormat::Bf16) {
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
      reinterpret_cast<uint16_t*>(head)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
    return;
  }
  float amax = 0.0f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) amax = fmaxf(amax, fabsf(x[i]));
  amax = block_max(amax, red);
  float scale, inv;
  row_scale(amax, f, &scale, &inv);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) head[i] = row_encode(x[i], inv, f);
  if (threadIdx.x == 0) cache_scales(row, nkv, hd)[kvh] = scale;
}

// Blocks x = 0..nh-1 prepare query heads, nh..nh+nkv-1 key heads (and store v), of token y (decode:
// the one token; prefill: token y of the chunk, at position pos[y]).
__global__ void prepare_kernel(AttentionDecodeArgs p) {
  __shared__ float red[kThreads / 32];
  __shared__ float buf[256], key[256];
  const int b = blockIdx.x, t = blockIdx.y, hd = p.hd, half = p.rotary_dim / 2;
  detail::pdl_enter();
  const bool is_q = b < p.nh;
  const int head = is_q ? b : b - p.nh;
  const float* src = is_q ? p.qg + (static_cast<int64_t>(t) * p.nh + head) * 2 * hd : p.k + (static_cast<int64_t>(t) * p.nkv + head) * hd;
  const float* w = is_q ? p.q_norm : p.k_norm;
  const int pos = p.pos[t];
  const int64_t cache0 = p.slot ? static_cast<int64_t>(p.slot[t]) * p.cache_stride : 0;
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
    if (is_q) p.q_rot[(static_cast<int64_t>(t) * p.nh + head) * hd + i] = y;
    else key[i] = y;
  }
  if (is_q) return;  // the same for the whole block
  const int64_t row = cache0 + static_cast<int64_t>(pos) * kv_row_bytes(p.kv, p.nkv, hd);
  __syncthreads();  // key[] is written
  store_cache_head(key, p.k_cache + row, head, p.nkv, hd, p.kv, red);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = p.v[(static_cast<int64_t>(t) * p.nkv + head) * hd + i];
  __syncthreads();  // buf[] is rewritten (its last readers were before key[]'s barrier)
  store_cache_head(buf, p.v_cache + row, head, p.nkv, hd, p.kv, red);
}

// grid (nh, splits): scores for one chunk of context, its max and sum, and the unnormalised output.
// Warp w takes rows begin + w, begin + w + 8, ...: it scores them (lanes split the head dimension),
// then, once the block knows the chunk's max, adds their weighted values into its own partial output
// (lane holds dims lane + 32 d), so each warp walks only its 8 rows with the loads of a row in flight
// together; the 8 partial outputs are summed through shared memory.
__global__ void __launch_bounds__(kThreads) attend_kernel(AttentionDecodeArgs p) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float red[kWarps];
  __shared__ float q[256];
  __shared__ float score[kChunk];
  __shared__ float po[kWarps][256];
  const int h = blockIdx.x, split = blockIdx.y, t = blockIdx.z, hd = p.hd, kvh = h / (p.nh / p.nkv);
  const int n_ctx = p.pos[t] + 1, begin = split * kChunk, end = min(n_ctx, begin + kChunk);
  if (begin >= n_ctx) return;  // past the context: before the wait (see attention_decode)
  detail::pdl_wait();
  const int64_t th = static_cast<int64_t>(t) * p.nh + h;  // the token's query head
  const int64_t cache0 = p.slot ? static_cast<int64_t>(p.slot[t]) * p.cache_stride : 0;
  const int64_t rb = kv_row_bytes(p.kv, p.nkv, hd);
  float* part = p.partial + (th * p.max_splits + split) * (hd + 2);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) q[i] = p.q_rot[th * hd + i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int s = begin + warp; s < end; s += kWarps) {
    const uint8_t* row = p.k_cache + cache0 + s * rb;
    const uint8_t* kr = cache_head(row, kvh, hd, p.kv);
    float d = 0.0f;
    for (int i = lane; i < hd; i += 32) d += q[i] * cache_value(kr, i, p.kv);
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) score[s - begin] = d * cache_scale(row, kvh, p.nkv, hd, p.kv) * p.scale;
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
  float o[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = begin + warp; s < end; s += kWarps) {
    const uint8_t* row = p.v_cache + cache0 + s * rb;
    const float w = score[s - begin] * cache_scale(row, kvh, p.nkv, hd, p.kv);
    const uint8_t* vr = cache_head(row, kvh, hd, p.kv);
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      const int i = lane + 32 * d;
      if (i < hd) o[d] += w * cache_value(vr, i, p.kv);
    }
  }
  detail::pdl_launch_next();  // past its loads (a grid of many blocks: pdl.cuh)
#pragma unroll
  for (int d = 0; d < 8; ++d)
    if (lane + 32 * d < hd) po[warp][lane + 32 * d] = o[d];
  __syncthreads();
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += po[w][i];
    part[i] = acc;
  }
  if (threadIdx.x == 0) part[hd] = m, part[hd + 1] = l;
}

// The same partial outputs with one block per (KV head, split) for the G query heads of the group
// (grid (nkv, splits), 8 warps): each K / V row crosses from L2 once a block instead of once a query
// head, with 16-byte loads (a lane holds dims lane * E .. lane * E + E - 1, E = HD / 32). Warp w takes
// the chunk's rows w * 8 .. w * 8 + 7 with all their loads in flight at once. Scores: the lane's E-dim
// products for the G heads, summed over the warp by a transposing reduction (the G sums cross the
// warp together: 9 shuffles for G = 8 instead of 40), into shared memory. Softmax: warp g for head g.
// Output: each warp weighs its 8 V rows for all G heads in registers, and the 8 warps' sums meet in
// shared memory, G / 2 heads at a time.
constexpr int kGroupWarps = 8, kGroupRows = kChunk / kGroupWarps;

// The E values of a KV head's row a lane holds (bf16s or codes, before the row's scale), as words.
template <int E, RowFormat F>
struct RowBits {
  static_assert(E == 4 || E == 8, "hd 128 or 256");
  static constexpr int kWords = F == RowFormat::Bf16 ? E / 2 : E / 4;
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const uint8_t* head, int lane) {
    if constexpr (kWords == 4) {
      const uint4 u = reinterpret_cast<const uint4*>(head)[lane];
      w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if constexpr (kWords == 2) {
      const uint2 u = reinterpret_cast<const uint2*>(head)[lane];
      w[0] = u.x, w[1] = u.y;
    } else {
      w[0] = reinterpret_cast<const uint32_t*>(head)[lane];
    }
  }
  __device__ __forceinline__ float at(int e) const {
    if constexpr (F == RowFormat::Bf16) return __uint_as_float(e % 2 ? w[e / 2] & 0xffff0000u : w[e / 2] << 16);
    else return code_value<F>((w[e / 4] >> (8 * (e % 4))) & 0xffu);
  }
};

// v[0..G) summed over the warp; lane ends with the sum of head ((lane >> 4) & 1) * G / 2 + ((lane >> 3) & 1)
// * G / 4 + ... in v[0] (returned), its head in *head.
template <int G>
__device__ __forceinline__ float transpose_sum(float (&v)[G], int lane, int* head) {
  int h = 0;
#pragma unroll
  for (int c = G / 2, o = 16; c >= 1; c /= 2, o /= 2) {
    const bool upper = lane & o;
#pragma unroll
    for (int i = 0; i < c; ++i) {
      const float send = upper ? v[i] : v[i + c], keep = upper ? v[i + c] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
    if (upper) h += c;
  }
  float r = v[0];
#pragma unroll
  for (int o = 32 / G / 2; o > 0; o /= 2) r += __shfl_xor_sync(0xffffffffu, r, o);
  *head = h;
  return r;
}

// What a scoring block of attend_group_kernel needs for one split of its token's cache.
struct GroupSplit {
  const float* q_rot;    // the token's first query head of the group
  float* partial;        // the same head's partial outputs (split 0)
  const uint8_t *kc, *vc;
  int64_t head_stride;   // floats between the query heads' partials
  int kvh, nkv, n_ctx;
  float scale;
};

// One split of the cache for the G query heads of a KV head (see attend_group_kernel). First: the
// block's first split, which lets the next kernel launch once its loads are issued.
template <int HD, int G, RowFormat F, bool First>
__device__ __forceinline__ void attend_group_split(const GroupSplit& a, float (&sc)[G][kChunk], float (&red)[kGroupWarps][G / 2][HD],
                                                   int split) {
  constexpr int E = HD / 32, GH = G / 2;  // dims a lane holds; heads a round of the output sum
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, begin = split * kChunk, end = min(a.n_ctx, begin + kChunk);
  float* part0 = a.partial + static_cast<int64_t>(split) * (HD + 2);
  const int64_t stride = kv_row_bytes(F, a.nkv, HD);  // bytes between cache rows
  const int r0 = begin + warp * kGroupRows;
  RowBits<E, F> k[kGroupRows];
  float ks[kGroupRows], vs[kGroupRows];  // the rows' scales (coded formats)
#pragma unroll
  for (int j = 0; j < kGroupRows; ++j)
    if (r0 + j < end) {
      k[j].load(cache_head(a.kc + (r0 + j) * stride, a.kvh, HD, F), lane);
      ks[j] = cache_scale(a.kc + (r0 + j) * stride, a.kvh, a.nkv, HD, F);
    }
  float q[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < E; ++e) q[g][e] = a.q_rot[g * HD + lane * E + e];
#pragma unroll
  for (int j = 0; j < kGroupRows; ++j) {
    const int row = warp * kGroupRows + j;
    if (r0 + j >= end) {  // the same for every lane
      if (lane < G) sc[lane][row] = -INFINITY;
      continue;
    }
    float d[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      d[g] = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) d[g] += q[g][e] * k[j].at(e);
    }
    int head;
    const float s = transpose_sum<G>(d, lane, &head);
    if ((lane & (32 / G - 1)) == 0) sc[head][row] = s * ks[j] * a.scale;
  }
  RowBits<E, F> v[kGroupRows];  // in flight during the softmax
#pragma unroll
  for (int j = 0; j < kGroupRows; ++j)
    if (r0 + j < end) {
      v[j].load(cache_head(a.vc + (r0 + j) * stride, a.kvh, HD, F), lane);
      vs[j] = cache_scale(a.vc + (r0 + j) * stride, a.kvh, a.nkv, HD, F);
    }
  __syncthreads();
  if (warp < G) {
    const float x = sc[warp][lane], y = sc[warp][lane + 32];  // -inf past the context
    float m = fmaxf(x, y);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float ex = expf(x - m), ey = expf(y - m);  // m is finite: the chunk has a row
    float l = ex + ey;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    sc[warp][lane] = ex, sc[warp][lane + 32] = ey;
    if (lane == 0) part0[warp * a.head_stride + HD] = m, part0[warp * a.head_stride + HD + 1] = l;
  }
  __syncthreads();
  float acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
#pragma unroll
  for (int j = 0; j < kGroupRows; ++j) {
    if (r0 + j >= end) break;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float w = sc[g][warp * kGroupRows + j] * vs[j];
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] += w * v[j].at(e);
    }
  }
  if constexpr (First) detail::pdl_launch_next();  // past its loads (a grid of many blocks: pdl.cuh)
#pragma unroll
  for (int h0 = 0; h0 < G; h0 += GH) {
#pragma unroll
    for (int g = 0; g < GH; ++g)
#pragma unroll
      for (int e = 0; e < E; ++e) red[warp][g][lane * E + e] = acc[h0 + g][e];
    __syncthreads();
    for (int i = threadIdx.x; i < GH * HD; i += blockDim.x) {
      const int g = i / HD, dim = i % HD;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kGroupWarps; ++w) sum += red[w][g][dim];
      part0[(h0 + g) * a.head_stride + dim] = sum;
    }
    __syncthreads();  // red (and sc) are rewritten by the next round or split
  }
}

// A block's later splits, through a call: inlined in the kernel's loop, the split's body took 60
// more registers (186-190 against 126 at HD 256, G 8), halving the blocks an SM for every launch.
template <int HD, int G, RowFormat F>
__device__ __noinline__ void attend_group_later_split(const GroupSplit& a, float (&sc)[G][kChunk], float (&red)[kGroupWarps][G / 2][HD],
                                                      int split) {
  attend_group_split<HD, G, F, false>(a, sc, red, split);
}

// The block's first split inline, its later ones (attention_decode_split_blocks: a cache far longer
// than the grid) through attend_group_later_split; two blocks an SM (128 registers: the call's saved
// registers would otherwise take it past them).
template <int HD, int G, RowFormat F>
__global__ void __launch_bounds__(kGroupWarps * 32, 2) attend_group_kernel(AttentionDecodeArgs p) {
  __shared__ float sc[G][kChunk];
  __shared__ float red[kGroupWarps][G / 2][HD];
  const int kvh = blockIdx.x, split = blockIdx.y, t = blockIdx.z;
  const int n_ctx = p.pos[t] + 1;
  if (split * kChunk >= n_ctx) return;  // past the context: before the wait (see attention_decode)
  detail::pdl_wait();
  const int64_t th0 = static_cast<int64_t>(t) * p.nh + kvh * G;  // the token's first query head of the group
  const int64_t cache0 = p.slot ? static_cast<int64_t>(p.slot[t]) * p.cache_stride : 0;
  const GroupSplit a{p.q_rot + th0 * HD, p.partial + th0 * p.max_splits * (HD + 2), p.k_cache + cache0, p.v_cache + cache0,
                     static_cast<int64_t>(p.max_splits) * (HD + 2), kvh, p.nkv, n_ctx, p.scale};
  attend_group_split<HD, G, F, true>(a, sc, red, split);
  for (int s = split + static_cast<int>(gridDim.y); s * kChunk < n_ctx; s += gridDim.y) attend_group_later_split<HD, G, F>(a, sc, red, s);
}

// One block per head: merge the splits (log-sum-exp) and apply the output gate. Thread (c, i) sums
// output dimension i over the splits c, c + kCombineParts, ... (a quarter of the serial loads each),
// and the parts meet in shared memory in order.
constexpr int kCombineParts = 4;

__global__ void __launch_bounds__(kCombineParts * 256) combine_kernel(AttentionDecodeArgs p, int splits) {
  constexpr int kScaleChunk = 1024;  // splits whose scales are in shared memory at a time
  __shared__ float red[kCombineParts * 256 / 32];
  __shared__ float scale[kScaleChunk];
  __shared__ float sums[kCombineParts][256];
  __shared__ float l_all;
  const int h = blockIdx.x, t = blockIdx.y, hd = p.hd, i = threadIdx.x % 256, c = threadIdx.x / 256;  // hd <= 256
  detail::pdl_enter();
  const int64_t th = static_cast<int64_t>(t) * p.nh + h;
  const float* part = p.partial + th * p.max_splits * (hd + 2);
  // The splits that hold context rows (the scoring blocks of the others left without writing).
  const int used = min(splits, (p.pos[t] + kChunk) / kChunk);
  // The splits' scales e^{m_s - m} are formed once by the block (a thread a split) instead of by every
  // thread for every dimension.
  float m = -INFINITY;
  for (int s = threadIdx.x; s < used; s += blockDim.x) m = fmaxf(m, part[s * (hd + 2) + hd]);
  m = block_max(m, red);
  float l = 0.0f, acc = 0.0f;
  for (int s0 = 0; s0 < used; s0 += kScaleChunk) {
    const int n = min(kScaleChunk, used - s0);
    __syncthreads();  // the previous chunk's scales are read
    for (int s = threadIdx.x; s < n; s += blockDim.x) scale[s] = expf(part[(s0 + s) * (hd + 2) + hd] - m);
    __syncthreads();
    if (threadIdx.x == 0)
      for (int s = 0; s < n; ++s) l += part[(s0 + s) * (hd + 2) + hd + 1] * scale[s];
    if (i < hd) {
#pragma unroll 8
      for (int s = c; s < n; s += kCombineParts) acc += part[(s0 + s) * (hd + 2) + i] * scale[s];
    }
  }
  sums[c][i] = acc;
  if (threadIdx.x == 0) l_all = l;
  __syncthreads();
  if (c == 0 && i < hd) {
    float o = sums[0][i];
#pragma unroll
    for (int j = 1; j < kCombineParts; ++j) o += sums[j][i];
    const float gate = p.qg[th * 2 * hd + hd + i];
    p.out[th * hd + i] = o / l_all / (1.0f + expf(-gate));
  }
}

// Prefill on tensor cores (mma.sync m16n8k16, bf16 inputs, fp32 accumulation), flash-attention-2 form:
// block (head, group of kTcQ = 64 query tokens), 4 warps of 16 queries each. The queries are rounded to
// bf16 into shared memory once; key tiles of kTcKV rows go through shared memory (K row-major, V
// transposed so both products read their B fragments as 32-bit words, rows padded by 8 halves so the
// 32 lanes of a fragment load hit 32 banks). Per tile a warp forms S = Q K^T (16 x kTcKV, fp32), masks
// it causally, keeps each row's running max in the quad that holds it, and adds P V with P rounded to
// bf16. Fragment layouts are PTX's for m16n8k16: lane = 4 g + t holds rows g and g + 8.
constexpr int kTcQ = 64, kTcKV = 32, kTcWarps = 4;
using detail::mma_bf16;
using detail::pack_bf16;

// Values c..c+7 of KV head kvh in the cache row at `row` as 8 bf16s (a coded row's values times its
// scale, rounded to bf16).
__device__ __forceinline__ uint4 bf16_piece(const uint8_t* row, int kvh, int c, const AttentionDecodeArgs& p) {
  const uint8_t* head = cache_head(row, kvh, p.hd, p.kv);
  if (p.kv == RowFormat::Bf16) return *reinterpret_cast<const uint4*>(head + 2 * c);
  const uint2 codes = *reinterpret_cast<const uint2*>(head + c);
  const float sc = cache_scale(row, kvh, p.nkv, p.hd, p.kv);
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t pair = (e < 2 ? codes.x : codes.y) >> (16 * (e % 2));  // codes 2e, 2e + 1 in the low 16 bits
    const float2 v = p.kv == RowFormat::Int8 ? make_float2(code_value<RowFormat::Int8>(pair & 0xffu), code_value<RowFormat::Int8>((pair >> 8) & 0xffu))
                                            : detail::fp8x2_to_float2(pair);
    w[e] = pack_bf16(v.x * sc, v.y * sc);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int HD>
constexpr size_t tc_prefill_smem() {
  return (static_cast<size_t>(kTcQ) * (HD + 8) + static_cast<size_t>(kTcKV) * (HD + 8) + static_cast<size_t>(HD) * (kTcKV + 8)) * 2;
}

template <int HD>
__global__ void __launch_bounds__(kTcWarps * 32) flash_prefill_tc_kernel(AttentionDecodeArgs p, int n, float scale_log2) {
  constexpr int QW = (HD + 8) / 2, VW = (kTcKV + 8) / 2;  // row strides in 32-bit words
  constexpr int NS = kTcKV / 8, KS = HD / 16, NO = HD / 8;
  extern __shared__ __align__(16) uint32_t tsm[];
  uint32_t* qs = tsm;                  // [kTcQ][QW]
  uint32_t* ks = qs + kTcQ * QW;       // [kTcKV][QW]
  uint32_t* vt = ks + kTcKV * QW;      // [HD][VW] (V transposed)
  auto* vt16 = reinterpret_cast<uint16_t*>(vt);
  const int h = blockIdx.x, q0 = blockIdx.y * kTcQ, kvh = h / (p.nh / p.nkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t row_bytes = kv_row_bytes(p.kv, p.nkv, HD);
  for (int i = threadIdx.x; i < kTcQ * HD / 2; i += blockDim.x) {
    const int r = i / (HD / 2), c = i % (HD / 2), t = q0 + r;
    float2 v = make_float2(0.0f, 0.0f);
    if (t < n) v = *reinterpret_cast<const float2*>(p.q_rot + (static_cast<int64_t>(t) * p.nh + h) * HD + 2 * c);
    qs[r * QW + c] = pack_bf16(v.x, v.y);
  }
  // Rows past the chunk take the last token's position (finite softmax, never written).
  const int ta = min(q0 + warp * 16 + g, n - 1), tb = min(q0 + warp * 16 + g + 8, n - 1);
  const int pos_a = p.pos[ta], pos_b = p.pos[tb];
  const int warp_max = p.pos[min(q0 + warp * 16 + 15, n - 1)], max_pos = p.pos[min(n, q0 + kTcQ) - 1];
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  for (int r0 = 0; r0 <= max_pos; r0 += kTcKV) {
    __syncthreads();  // the previous tile is consumed (and, the first time, qs is written)
    // 16-byte pieces: a warp takes 16 rows x 2 adjacent pieces (whole 32-byte sectors of the cache),
    // so its transposed V stores meet at most 2 to a bank.
    for (int i = threadIdx.x; i < kTcKV * HD / 8; i += blockDim.x) {
      const int rest = i / 32, rr = (rest / (HD / 16)) * 16 + i % 16, c = ((rest % (HD / 16)) * 2 + (i / 16) % 2) * 8, r = r0 + rr;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (r <= max_pos) {
        kv = bf16_piece(p.k_cache + r * row_bytes, kvh, c, p);
        vv = bf16_piece(p.v_cache + r * row_bytes, kvh, c, p);
      }
      *reinterpret_cast<uint4*>(ks + rr * QW + c / 2) = kv;
      const uint16_t* v16 = reinterpret_cast<const uint16_t*>(&vv);
#pragma unroll
      for (int e = 0; e < 8; ++e) vt16[(c + e) * 2 * VW + rr] = v16[e];
    }
    __syncthreads();
    if (r0 > warp_max) continue;  // uniform per warp: every row of the warp is before this tile
    float s[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const uint32_t* qa = qs + (warp * 16 + g) * QW + tq;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      const uint32_t a0 = qa[kk * 8], a1 = qa[8 * QW + kk * 8], a2 = qa[kk * 8 + 4], a3 = qa[8 * QW + kk * 8 + 4];
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        const uint32_t* kb = ks + (8 * j + g) * QW + kk * 8 + tq;
        mma_bf16(s[j], a0, a1, a2, a3, kb[0], kb[4]);
      }
    }
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const int k0 = r0 + 8 * j + 2 * tq;
      s[j][0] = k0 <= pos_a ? s[j][0] * scale_log2 : -INFINITY;
      s[j][1] = k0 + 1 <= pos_a ? s[j][1] * scale_log2 : -INFINITY;
      s[j][2] = k0 <= pos_b ? s[j][2] * scale_log2 : -INFINITY;
      s[j][3] = k0 + 1 <= pos_b ? s[j][3] * scale_log2 : -INFINITY;
      mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
    }
    for (int off = 1; off < 4; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    // Tile 0 holds key 0, which every row sees: after it each row's max is finite.
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float corr_a = exp2f(m_a - mn_a), corr_b = exp2f(m_b - mn_b);
    m_a = mn_a, m_b = mn_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      s[j][0] = exp2f(s[j][0] - mn_a), s[j][1] = exp2f(s[j][1] - mn_a);
      s[j][2] = exp2f(s[j][2] - mn_b), s[j][3] = exp2f(s[j][3] - mn_b);
      sum_a += s[j][0] + s[j][1], sum_b += s[j][2] + s[j][3];
    }
    l_a = l_a * corr_a + sum_a, l_b = l_b * corr_b + sum_b;  // this lane's columns; the quad sums at the end
#pragma unroll
    for (int j = 0; j < NO; ++j) o[j][0] *= corr_a, o[j][1] *= corr_a, o[j][2] *= corr_b, o[j][3] *= corr_b;
#pragma unroll
    for (int kk = 0; kk < kTcKV / 16; ++kk) {
      const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]), a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < NO; ++j) {
        const uint32_t* vb = vt + (8 * j + g) * VW + kk * 8 + tq;
        mma_bf16(o[j], a0, a1, a2, a3, vb[0], vb[4]);
      }
    }
  }
  for (int off = 1; off < 4; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = q0 + warp * 16 + g + 8 * half;
    if (t >= n) continue;
    const float inv_l = 1.0f / (half ? l_b : l_a);
    const float* gate = p.qg + (static_cast<int64_t>(t) * p.nh + h) * 2 * HD + HD;
    float* out = p.out + (static_cast<int64_t>(t) * p.nh + h) * HD;
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      const int c = 8 * j + 2 * tq;
      const float2 gt = *reinterpret_cast<const float2*>(gate + c);
      float2 y;
      y.x = o[j][2 * half] * inv_l / (1.0f + expf(-gt.x));
      y.y = o[j][2 * half + 1] * inv_l / (1.0f + expf(-gt.y));
      *reinterpret_cast<float2*>(out + c) = y;
    }
  }
}

template <int HD>
cudaError_t launch_prefill_tc(const AttentionDecodeArgs& p, int n, cudaStream_t stream) {
  constexpr size_t smem = tc_prefill_smem<HD>();
  static const cudaError_t opt_in = opt_in_smem(flash_prefill_tc_kernel<HD>, smem);
  if (opt_in != cudaSuccess) return opt_in;
  const float scale_log2 = p.scale * 1.4426950408889634f;
  flash_prefill_tc_kernel<HD><<<dim3(p.nh, (n + kTcQ - 1) / kTcQ), kTcWarps * 32, smem, stream>>>(p, n, scale_log2);
  return cudaGetLastError();
}

// The scoring blocks for cache format F: grouped for Qwen3.5's shapes (attention_decode_split_blocks
// a KV head and token), one per query head and split otherwise.
template <RowFormat F>
cudaError_t launch_attend(const AttentionDecodeArgs& p, int splits, cudaStream_t stream) {
  const int group = p.nh / p.nkv;
  const auto blocks = static_cast<unsigned>(attention_decode_split_blocks(splits, p.nkv, p.tokens, gpu_device_caps().multiprocessors));
  auto grouped = [&](auto kernel) { return detail::launch(kernel, dim3(p.nkv, blocks, p.tokens), dim3(kGroupWarps * 32), 0, stream, p); };
  if (p.hd == 256 && group == 8) return grouped(attend_group_kernel<256, 8, F>);
  if (p.hd == 256 && group == 4) return grouped(attend_group_kernel<256, 4, F>);
  if (p.hd == 128 && group == 8) return grouped(attend_group_kernel<128, 8, F>);
  if (p.hd == 128 && group == 4) return grouped(attend_group_kernel<128, 4, F>);
  return detail::launch(attend_kernel, dim3(p.nh, splits, p.tokens), dim3(kThreads), 0, stream, p);
}

}  // namespace

cudaError_t attention_prefill(const AttentionDecodeArgs& p, int n, cudaStream_t stream) {
  if (n < 1 || p.nh < 1 || p.nkv < 1 || p.nh % p.nkv || !attention_prefill_fits(p.hd) || p.rotary_dim % 2 || p.rotary_dim > p.hd ||
      p.max_ctx < 1)
    return cudaErrorInvalidValue;
  prepare_kernel<<<dim3(p.nh + p.nkv, n), kThreads, 0, stream>>>(p);
  switch (p.hd) {
    case 16: return launch_prefill_tc<16>(p, n, stream);
    case 32: return launch_prefill_tc<32>(p, n, stream);
    case 64: return launch_prefill_tc<64>(p, n, stream);
    case 128: return launch_prefill_tc<128>(p, n, stream);
    default: return launch_prefill_tc<256>(p, n, stream);
  }
}

cudaError_t attention_decode(const AttentionDecodeArgs& p, cudaStream_t stream) {
  if (p.nh < 1 || p.nkv < 1 || p.nh % p.nkv || p.hd < 2 || p.hd > 256 || p.rotary_dim % 2 || p.rotary_dim > p.hd ||
      p.max_ctx < 1 || p.max_splits < 1 || p.tokens < 1)
    return cudaErrorInvalidValue;
  // The grid covers the whole cache, so the launch shape does not depend on the positions (a captured
  // step replays at any); the grouped kernels' blocks take several splits where the cache is far longer
  // than the grid (attention_decode_split_blocks). A scoring block past its token's position returns
  // at once, before its wait for the prepare kernel: the positions were copied in before the step's
  // first kernel (pdl.cuh: written two or more kernels back), so those blocks leave while the kernels
  // before still run instead of each waiting for them.
  const int splits = static_cast<int>(attention_decode_splits(p.max_ctx));
  if (splits > p.max_splits) return cudaErrorInvalidValue;
  cudaError_t err = detail::launch(prepare_kernel, dim3(p.nh + p.nkv, p.tokens), dim3(kThreads), 0, stream, p);
  if (err == cudaSuccess) {
    switch (p.kv) {
      case RowFormat::Bf16: err = launch_attend<RowFormat::Bf16>(p, splits, stream); break;
      case RowFormat::Int8: err = launch_attend<RowFormat::Int8>(p, splits, stream); break;
      case RowFormat::Fp8: err = launch_attend<RowFormat::Fp8>(p, splits, stream); break;
    }
  }
  if (err == cudaSuccess) err = detail::launch(combine_kernel, dim3(p.nh, p.tokens), dim3(kCombineParts * 256), 0, stream, p, splits);
  return err;
}

}  // namespace tandem::gpu
