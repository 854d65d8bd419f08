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
using detail::mma_bf16;
using detail::pack_bf16;
using detail::split3_bf16;
using detail::split_bf16;

// Cache rows (attention.cuh): value i of a KV head's part of a row, before the row's scale, and the
// scale.
template <RowFormat F>
__device__ __forceinline__ float code_value(uint32_t c) {
  if constexpr (F == RowFormat::Int8) return static_cast<float>(static_cast<int8_t>(c));
  else return detail::fp8_to_float(c);
}
// Two codes (the low 16 bits: values 2e, 2e + 1) before their row's scale.
__device__ __forceinline__ float2 code_values(uint32_t two, RowFormat f) {
  if (f == RowFormat::Int8) return make_float2(code_value<RowFormat::Int8>(two & 0xffu), code_value<RowFormat::Int8>((two >> 8) & 0xffu));
  return detail::fp8x2_to_float2(two);
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
// the one token; prefill: token y of the chunk, at position pos[y]). hd <= kThreads
// (attention_prefill_fits): thread i holds element i. Every load goes out before the block's first
// use of one: the norm weight, the rotation's frequency and the position before the wait (weights are
// never written; the positions were copied in before the step's first kernel: pdl.cuh), the head's
// row and v together after it. (In loops of their own, as before, they were four round trips.)
__global__ void prepare_kernel(AttentionDecodeArgs p) {
  static_assert(kThreads >= 256, "a thread an element of every head attention_prefill_fits takes (256 at most)");
  __shared__ float red[kThreads / 32];
  __shared__ float buf[kThreads], key[kThreads];
  const int b = blockIdx.x, t = blockIdx.y, hd = p.hd, half = p.rotary_dim / 2, i = threadIdx.x;
  const bool is_q = b < p.nh, in = i < hd, rotated = in && i < p.rotary_dim;
  const int head = is_q ? b : b - p.nh;
  const float w = in ? (is_q ? p.q_norm : p.k_norm)[i] : 0.0f;
  const float freq = rotated ? p.inv_freq[i < half ? i : i - half] : 0.0f;
  const int pos = p.pos[t];
  detail::pdl_enter();
  const float* src = is_q ? p.qg + (static_cast<int64_t>(t) * p.nh + head) * 2 * hd : p.k + (static_cast<int64_t>(t) * p.nkv + head) * hd;
  const float x = in ? src[i] : 0.0f;
  const float v = in && !is_q ? p.v[(static_cast<int64_t>(t) * p.nkv + head) * hd + i] : 0.0f;
  const int64_t cache0 = p.slot ? static_cast<int64_t>(p.slot[t]) * p.cache_stride : 0;
  const float r = rsqrtf(block_sum(in ? x * x : 0.0f, red) / hd + p.eps);
  if (in) buf[i] = x * r * (1.0f + w);
  __syncthreads();
  if (in) {
    float y = buf[i];
    if (rotated) {
      float sn, cs;
      sincosf(static_cast<float>(pos) * freq, &sn, &cs);
      y = i < half ? buf[i] * cs - buf[i + half] * sn : buf[i] * cs + buf[i - half] * sn;
    }
    if (is_q) p.q_rot[(static_cast<int64_t>(t) * p.nh + head) * hd + i] = y;
    else key[i] = y;
  }
  if (is_q) return;  // the same for the whole block
  const int64_t row = cache0 + static_cast<int64_t>(pos) * kv_row_bytes(p.kv, p.nkv, hd);
  __syncthreads();  // key[] is written
  store_cache_head(key, p.k_cache + row, head, p.nkv, hd, p.kv, red);
  if (in) buf[i] = v;
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
// (grid (nkv, blocks, tokens), 8 warps), on tensor cores (mma.cuh: m16n8k16, bf16 inputs, fp32 sums).
// Each K / V row crosses from L2 once a block instead of once a query head, and a split's loads (K, V,
// the coded formats' scales) are all issued before its arithmetic.
//  - Scores: warp w takes the split's rows 8 w .. 8 w + 7 as S = Q K^T, a 16 x 8 tile a 16 dims (A: the
//    G query heads, padded to 16; B: the rows). Lane 4 g + q holds row g's dims 8 q + 32 c .. + 7 (one
//    16-byte load a chunk c), which fixes the order of the dims in Q's fragments too. Q goes in as three
//    bf16 parts (split3_bf16) and the cache's values are exact in bf16, so the scores carry fp32's
//    rounding, not bf16's.
//  - Softmax: warp h for head h over the split's 64 scores (shared memory); the probabilities times
//    the V rows' scales go back to shared memory as the output's B fragments, again in two bf16 parts.
//  - Output: warp w takes dims w HD / 8 .. (w + 1) HD / 8 - 1 of every row, O^T = V^T P^T with the
//    dims as M and 16 rows a step as K: lane 4 g + q loads rows 2 q, 2 q + 1, 2 q + 8, 2 q + 9 of each
//    step at its dims and pairs them into A fragments by byte permutes. Each warp ends with whole dims
//    of all G heads and stores them from registers: no sum across warps.
constexpr int kGroupWarps = 8, kGroupRows = kChunk / kGroupWarps;
constexpr int kScoreStride = kChunk + 8;  // floats a head's scores (a half-warp's float2 stores meet distinct banks)
static_assert(kChunk == 64, "the softmax takes two rows a lane");

// N consecutive values of a cache row (N = 8: a lane's K piece; N = 2 MT: its V piece) as they load,
// and as bf16 pairs: pair(e) holds values 2 e, 2 e + 1.
template <int N, RowFormat F>
struct CachePiece {
  static constexpr int kBytes = F == RowFormat::Bf16 ? 2 * N : N;
  static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "one load");
  static constexpr int kWords = kBytes < 4 ? 1 : kBytes / 4;
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const uint8_t* at) {
    if constexpr (kBytes == 16) {
      const uint4 u = *reinterpret_cast<const uint4*>(at);
      w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if constexpr (kBytes == 8) {
      const uint2 u = *reinterpret_cast<const uint2*>(at);
      w[0] = u.x, w[1] = u.y;
    } else if constexpr (kBytes == 4) {
      w[0] = *reinterpret_cast<const uint32_t*>(at);
    } else {
      w[0] = *reinterpret_cast<const uint16_t*>(at);
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0u;
  }
  __device__ __forceinline__ uint32_t pair(int e) const {
    if constexpr (F == RowFormat::Bf16) return w[e];
    else {  // both formats' codes are exact in bf16
      const float2 v = code_values(w[e / 2] >> (16 * (e % 2)), F);
      return pack_bf16(v.x, v.y);
    }
  }
};

// The block's splits y, y + gridDim.y, ... below its token's position (attention_decode_split_blocks).
// Three blocks an SM (at most 80 registers: bf16 rows at hd 256 spill 8 bytes): on the H100, 8 sequences
// of 4,096 rows 49.2 us against 51.1 at two blocks an SM (108 registers), 51.5 against 56.6 in a cache of
// 131,072 rows, one sequence the same (bench/results/2026-12-07-stop54-h100.md).
template <int HD, int G, RowFormat F>
__global__ void __launch_bounds__(kGroupWarps * 32, 3) attend_group_kernel(AttentionDecodeArgs p) {
  constexpr int KC = HD / 32;      // a lane's K pieces (32-dim chunks of a row)
  constexpr int KS = HD / 16;      // the scores' steps
  constexpr int MT = HD / 128;     // the output's 16-dim tiles a warp
  constexpr int VS = kChunk / 16;  // the output's steps (16 rows each)
  static_assert(G <= 8 && (HD == 128 || HD == 256), "a group of at most 8 heads; hd 128 or 256");
  __shared__ uint4 qf[KS][32];  // Q's A fragments: a0, a2 of the high part, a0, a2 of the middle one
  __shared__ uint2 ql[KS][32];  // and a0, a2 of the low one
  __shared__ float sc[G][kScoreStride];
  __shared__ uint4 pf[VS][32];  // P's B fragments: b0, b1 of the high part, b0, b1 of the low
  const int kvh = blockIdx.x, t = blockIdx.z, n_ctx = p.pos[t] + 1;
  if (static_cast<int>(blockIdx.y) * kChunk >= n_ctx) return;  // past the context: before the wait (see attention_decode)
  detail::pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int64_t th0 = static_cast<int64_t>(t) * p.nh + kvh * G;  // the token's first query head of the group
  const int64_t cache0 = p.slot ? static_cast<int64_t>(p.slot[t]) * p.cache_stride : 0;
  const uint8_t* kc = cache_head(p.k_cache + cache0, kvh, HD, F);  // the head's values in row 0
  const uint8_t* vc = cache_head(p.v_cache + cache0, kvh, HD, F);
  const int vb = row_value_bytes(F);
  const int64_t stride = kv_row_bytes(F, p.nkv, HD), head_stride = static_cast<int64_t>(p.max_splits) * (HD + 2);
  const int vdim = warp * 16 * MT + 2 * MT * g;  // the lane's output dims: vdim .. vdim + 2 MT - 1
  for (int split = blockIdx.y; split * kChunk < n_ctx; split += gridDim.y) {
    const int begin = split * kChunk, end = min(n_ctx, begin + kChunk);
    CachePiece<8, F> k[KC];
    const int krow = begin + warp * kGroupRows + g;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      if (krow < end) k[c].load(kc + krow * stride + (8 * q + 32 * c) * vb);
      else k[c].zero();
    }
    CachePiece<2 * MT, F> v[VS][4];  // rows 16 s + 2 q, + 1, + 8, + 9
#pragma unroll
    for (int s = 0; s < VS; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = begin + 16 * s + 2 * q + (i & 1) + 8 * (i >> 1);
        if (row < end) v[s][i].load(vc + row * stride + vdim * vb);
        else v[s][i].zero();
      }
    float ks[2] = {1.0f, 1.0f}, vs[2] = {1.0f, 1.0f};  // the scales of the rows this lane softmaxes
    if (F != RowFormat::Bf16 && warp < G) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = begin + 2 * lane + i;
        if (row < end) ks[i] = cache_scale(p.k_cache + cache0 + row * stride, kvh, p.nkv, HD, F),
                       vs[i] = cache_scale(p.v_cache + cache0 + row * stride, kvh, p.nkv, HD, F);
      }
    }
    if (split == static_cast<int>(blockIdx.y)) {  // the block's first split: Q's fragments, once
      detail::pdl_launch_next();                  // past its loads (a grid of many blocks: pdl.cuh)
      for (int i = threadIdx.x; i < KS * 32; i += blockDim.x) {
        const int step = i / 32, hg = (i % 32) >> 2, hq = i & 3;
        uint4 f = make_uint4(0u, 0u, 0u, 0u);
        uint2 fl = make_uint2(0u, 0u);
        if (hg < G) {
          const float4 x = *reinterpret_cast<const float4*>(p.q_rot + (th0 + hg) * HD + 8 * hq + 32 * (step / 2) + 4 * (step % 2));
          split3_bf16(x.x, x.y, f.x, f.z, fl.x);
          split3_bf16(x.z, x.w, f.y, f.w, fl.y);
        }
        qf[step][i % 32] = f;
        ql[step][i % 32] = fl;
      }
      __syncthreads();
    }
    float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // heads g, g + 8 (padding) at rows 2 q, 2 q + 1 of the warp's 8
#pragma unroll
    for (int c = 0; c < KC; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 a = qf[2 * c + h][lane];
        const uint2 al = ql[2 * c + h][lane];
        const uint32_t b0 = k[c].pair(2 * h), b1 = k[c].pair(2 * h + 1);
        mma_bf16(s4, a.x, 0u, a.y, 0u, b0, b1);
        mma_bf16(s4, a.z, 0u, a.w, 0u, b0, b1);
        mma_bf16(s4, al.x, 0u, al.y, 0u, b0, b1);
      }
    if (g < G) *reinterpret_cast<float2*>(&sc[g][warp * kGroupRows + 2 * q]) = make_float2(s4[0], s4[1]);
    __syncthreads();
    float* part = p.partial + th0 * head_stride + static_cast<int64_t>(split) * (HD + 2);
    {
      // Lane l's rows 2 l, 2 l + 1 are step l / 8's rows 2 (l % 8), + 1: b0 of lane 4 h + l % 8 for l % 8
      // < 4, else b1 of lane 4 h + l % 8 - 4.
      uint32_t hi = 0u, lo = 0u;
      if (warp < G) {
        const float2 raw = *reinterpret_cast<const float2*>(&sc[warp][2 * lane]);
        const int r = begin + 2 * lane;
        const float x = r < end ? raw.x * ks[0] * p.scale : -INFINITY, y = r + 1 < end ? raw.y * ks[1] * p.scale : -INFINITY;
        float m = fmaxf(x, y);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float ex = expf(x - m), ey = expf(y - m);  // m is finite: the split has a row
        float l = ex + ey;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) part[warp * head_stride + HD] = m, part[warp * head_stride + HD + 1] = l;
        split_bf16(ex * vs[0], ey * vs[1], hi, lo);
      }
      auto* f = reinterpret_cast<uint32_t*>(&pf[lane / 8][4 * warp + lane % 4]);  // zeros for the padding heads
      const int b = (lane % 8) / 4;
      f[b] = hi, f[2 + b] = lo;
    }
    __syncthreads();
    float acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < VS; ++s) {
      const uint4 b = pf[s][lane];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint32_t r0 = v[s][0].pair(mt), r1 = v[s][1].pair(mt), r8 = v[s][2].pair(mt), r9 = v[s][3].pair(mt);
        const uint32_t a0 = __byte_perm(r0, r1, 0x5410), a1 = __byte_perm(r0, r1, 0x7632);  // dims vdim + 2 mt, + 1
        const uint32_t a2 = __byte_perm(r8, r9, 0x5410), a3 = __byte_perm(r8, r9, 0x7632);
        mma_bf16(acc[mt], a0, a1, a2, a3, b.x, b.y);
        mma_bf16(acc[mt], a0, a1, a2, a3, b.z, b.w);
      }
    }
    // acc[mt]: dims vdim + 2 mt (0, 1) and vdim + 2 mt + 1 (2, 3) of heads 2 q (0, 2) and 2 q + 1 (1, 3).
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (2 * q + j >= G) continue;
      float* out = part + (2 * q + j) * head_stride + vdim;
      if constexpr (MT == 2) *reinterpret_cast<float4*>(out) = make_float4(acc[0][j], acc[0][2 + j], acc[1][j], acc[1][2 + j]);
      else *reinterpret_cast<float2*>(out) = make_float2(acc[0][j], acc[0][2 + j]);
    }
  }
}
// One block per (head, token, slice of kCombineDims output dims): merge the splits (log-sum-exp) and
// apply the output gate. Every block forms the splits' scales e^{m_s - m} and the sum l itself (a
// thread a split, beside the scale); thread (c, i) sums dimension z kCombineDims + i over the
// splits c, c + kCombineParts, ..., and the parts meet in shared memory in order. The slices put
// hd / kCombineDims blocks on a head, so a long cache's partials (2 MB a head at 131,072 rows) cross
// from L2 into as many SMs.
constexpr int kCombineDims = 64, kCombineParts = 4;

__global__ void __launch_bounds__(kCombineDims * kCombineParts) combine_kernel(AttentionDecodeArgs p, int splits) {
  constexpr int kScaleChunk = 1024;  // splits whose scales are in shared memory at a time
  __shared__ float red[kCombineDims * kCombineParts / 32];
  __shared__ float scale[kScaleChunk];
  __shared__ float sums[kCombineParts][kCombineDims];
  const int h = blockIdx.x, t = blockIdx.y, hd = p.hd, i = threadIdx.x % kCombineDims, c = threadIdx.x / kCombineDims;
  const int dim = static_cast<int>(blockIdx.z) * kCombineDims + i;
  const int64_t th = static_cast<int64_t>(t) * p.nh + h;
  // Read before the wait (pdl.cuh: written two or more kernels back), so that they are not round trips
  // of their own in the chain after it: the position (copied in before the step's first kernel) and
  // the output gate (the q projection's, three kernels back).
  const int pos = p.pos[t];
  const float gate = c == 0 && dim < hd ? p.qg[th * 2 * hd + hd + dim] : 0.0f;
  detail::pdl_enter_next_first();  // the output projection after it reads weights alone before its wait
  const float* part = p.partial + th * p.max_splits * (hd + 2);
  // The splits that hold context rows (the scoring blocks of the others left without writing).
  const int used = min(splits, (pos + kChunk) / kChunk);
  float m = -INFINITY;
  for (int s = threadIdx.x; s < used; s += blockDim.x) m = fmaxf(m, part[s * (hd + 2) + hd]);
  m = block_max(m, red);
  float l = 0.0f, acc = 0.0f;
  for (int s0 = 0; s0 < used; s0 += kScaleChunk) {
    const int n = min(kScaleChunk, used - s0);
    __syncthreads();  // the previous chunk's scales are read
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
      const float* ml = part + (s0 + s) * (hd + 2) + hd;  // m_s, l_s
      const float e = expf(ml[0] - m);
      scale[s] = e;
      l += ml[1] * e;
    }
    __syncthreads();
    if (dim < hd) {
#pragma unroll 8
      for (int s = c; s < n; s += kCombineParts) acc += part[(s0 + s) * (hd + 2) + dim] * scale[s];
    }
  }
  l = block_sum(l, red);
  sums[c][i] = acc;
  __syncthreads();
  if (c == 0 && dim < hd) {
    float o = sums[0][i];
#pragma unroll
    for (int j = 1; j < kCombineParts; ++j) o += sums[j][i];
    p.out[th * hd + dim] = o / l / (1.0f + expf(-gate));
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
    const float2 v = code_values(pair, p.kv);
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
  if (p.nh < 1 || p.nkv < 1 || p.nh % p.nkv || p.hd < 2 || p.hd > kThreads || p.rotary_dim % 2 || p.rotary_dim > p.hd ||
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
  if (err == cudaSuccess) err = detail::launch(combine_kernel, dim3(p.nh, p.tokens, (p.hd + kCombineDims - 1) / kCombineDims),
                                                   dim3(kCombineDims * kCombineParts), 0, stream, p, splits);
  return err;
}

}  // namespace tandem::gpu
