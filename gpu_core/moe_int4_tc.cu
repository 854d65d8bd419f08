// gpu_core/moe_int4_tc.cu: decode MoE for 2..8 tokens on tensor cores (moe_int4_decode_tc, see moe.cuh).
//
// Why this form: moe_int4_decode_wide dequantises and multiplies every (token, expert) pair's weights
// on its own, so its time grows with the pairs (the H200: 14.7 us a layer at one token, 76.8 at 8,
// issue-bound). Here each resident expert's rows are dequantised once for all the step's tokens routed
// to it and multiplied on tensor cores (fp16 mma, fp32 accumulation): the time follows the union of
// experts, i.e. the bytes.
//
// Fragments (mma.cuh's m16n8k16): the A tile is 16 weight rows x 16 inputs, B 16 inputs x 8 columns
// (the expert's tokens), C 16 rows x 8 columns. A 128-input chunk of a row pair (g, g + 8) is read by
// lane 4 g + q as one 16-byte vector per row: the four code words of inputs [32 q, 32 q + 32). Its 16
// (q - z) pairs (int4_row.cuh's dequant_pair, exact in fp16) are the lane's A registers of the chunk's
// 8 mma steps: step s takes pairs 2 s (k-slots 2q, 2q + 1) and 2 s + 1 (2q + 8, 2q + 9). B is laid out
// the same way (lane 4 g + q holds column g's inputs [32 q, 32 q + 32)), so A's and B's k-slots name
// the same inputs. A chunk lies in one quantisation group (group_size a multiple of 128): its partial
// product is scaled by each row's scale once and added to the fp32 accumulators.
#include "gpu_core/int4_row.cuh"
#include "gpu_core/mma.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/pdl.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;

constexpr int kWarps = 8;             // warps a block (both kernels)
constexpr int kChunk = 128;           // inputs a warp's mma chunk covers
constexpr int kCols = 8;              // tokens an expert's tile takes (the mma's n)
constexpr int kMaxPairs = kMaxGemvTokens * 8;  // T * k pairs a launch takes (k <= 8)

// The pairs this block serves, in smem: the block of pair p serves expert e = ids[p] when p is the
// first, ninth, ... pair routed to e (so every pair has one server whatever the routing), for up to
// kCols of e's pairs from p on; none when it is not such a pair or e is not resident (null qweight).
// Called by warp 0; the block syncs before reading.
__device__ __forceinline__ void expert_columns(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, int P, int p,
                                               int* cols, int* n_cols) {
  const int lane = threadIdx.x & 31, e = ids[p];
  const bool m0 = lane < P && ids[lane] == e, m1 = lane + 32 < P && ids[lane + 32] == e;
  const uint64_t M = uint64_t{__ballot_sync(0xffffffffu, m0)} | uint64_t{__ballot_sync(0xffffffffu, m1)} << 32;
  if (lane != 0) return;
  const int before = __popcll(M & ((uint64_t{1} << p) - 1));
  int n = 0;
  if (before % kCols == 0 && experts[e].gate.qweight)
    for (uint64_t r = M >> p << p; r && n < kCols; r &= r - 1) cols[n++] = __ffsll(static_cast<long long>(r)) - 1;
  *n_cols = n;
}

// One chunk of a row pair (g, g + 8): the lane's code vectors, scales and zero points.
struct RowsChunk {
  uint4 w[2];
  uint16_t s[2];
  uint8_t z[2];
};

__device__ __forceinline__ RowsChunk load_chunk(const Int4View& W, int64_t row, int64_t c, int q, int group_chunks) {
  const int64_t vecs = W.K / 32, G = W.K / W.group_size, grp = c / group_chunks;
  RowsChunk r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = row + 8 * h;
    r.w[h] = load_stream(reinterpret_cast<const uint4*>(W.qweight) + n * vecs + c * 4 + q);
    r.s[h] = __ldg(W.scales + n * G + grp);
    r.z[h] = __ldg(W.zeros + n * G + grp);
  }
  return r;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int m) { return m == 0 ? v.x : m == 1 ? v.y : m == 2 ? v.z : v.w; }

// acc (C fragment: rows g, g + 8 at columns 2q, 2q + 1) += scale * (the chunk's A) B.
__device__ __forceinline__ void chunk_mma(float (&acc)[4], const RowsChunk& a, const uint32_t (&b)[16]) {
  const __half2 z0 = zero_1024(a.z[0]), z1 = zero_1024(a.z[1]);
  float c[4] = {};
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int j0 = 2 * s, j1 = 2 * s + 1;  // pair j: word j / 4, pair j % 4 of the word
    const __half2 a0 = dequant_pair(word_of(a.w[0], j0 >> 2), j0 & 3, z0), a2 = dequant_pair(word_of(a.w[0], j1 >> 2), j1 & 3, z0);
    const __half2 a1 = dequant_pair(word_of(a.w[1], j0 >> 2), j0 & 3, z1), a3 = dequant_pair(word_of(a.w[1], j1 >> 2), j1 & 3, z1);
    uint32_t r[4];
    memcpy(&r[0], &a0, 4), memcpy(&r[1], &a1, 4), memcpy(&r[2], &a2, 4), memcpy(&r[3], &a3, 4);
    mma_f16(c, r[0], r[1], r[2], r[3], b[j0], b[j1]);
  }
  const float s0 = __half2float(__ushort_as_half(a.s[0])), s1 = __half2float(__ushort_as_half(a.s[1]));
  acc[0] += s0 * c[0], acc[1] += s0 * c[1], acc[2] += s1 * c[2], acc[3] += s1 * c[3];
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// The block's columns staged in shared memory as fp16 rows of K inputs (+ kPad: rows start in
// different banks), in natural input order; act-order matrices gather through perm when reading.
constexpr int kPad = 8;
__host__ __device__ constexpr int64_t staged_stride(int64_t K) { return K + kPad; }

// Column g's B fragment of chunk c (the matrix's inputs [c 128 + 32 q, + 32), through perm with act
// order) from its staged row.
__device__ __forceinline__ void b_fragment(const __half* __restrict__ row, const int32_t* __restrict__ perm, int64_t c, int q,
                                           uint32_t (&b)[16]) {
  const int64_t k0 = c * kChunk + 32 * q;
  if (!perm) {
    const uint4* p = reinterpret_cast<const uint4*>(row + k0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = p[i];
      b[4 * i] = v.x, b[4 * i + 1] = v.y, b[4 * i + 2] = v.z, b[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) b[j] = half2_bits(__halves2half2(row[__ldg(perm + k0 + 2 * j)], row[__ldg(perm + k0 + 2 * j + 1)]));
  }
}

// A warp's work is a run of steps, step s = chunk s % cpt of its 16-row tile s / cpt (cpt: chunks a
// row), streamed with the next kAhead steps' weights in flight while a step multiplies: the loads of
// one warp overlap its own arithmetic, not only other warps'. stage() (all threads of the block, then a
// sync) runs once the first steps' loads are out; done(tile, acc) takes a finished tile's C fragment.
constexpr int kAhead = 2;
template <typename Stage, typename Done>
__device__ __forceinline__ void stream_tiles(const Int4View& W, int64_t row, int tiles, int q, int group_chunks, const __half* staged,
                                             Stage&& stage, Done&& done) {
  const int64_t cpt = W.K / kChunk, steps = tiles * cpt;
  auto load = [&](int64_t st, RowsChunk (&a)[kAhead]) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i)
      if (st + i < steps) a[i] = load_chunk(W, row + 16 * ((st + i) / cpt), (st + i) % cpt, q, group_chunks);
  };
  RowsChunk cur[kAhead], nxt[kAhead];
  load(0, cur);
  stage();
  float acc[4] = {};
  for (int64_t st = 0; st < steps; st += kAhead) {
    if (st + kAhead < steps) load(st + kAhead, nxt);
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      const int64_t si = st + i;
      if (si >= steps) break;
      uint32_t b[16];
      if (staged) b_fragment(staged, W.perm, si % cpt, q, b);
      else
#pragma unroll
        for (int j = 0; j < 16; ++j) b[j] = 0u;
      chunk_mma(acc, cur[i], b);
      if ((si + 1) % cpt == 0) {
        done(static_cast<int>(si / cpt), acc);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kAhead; ++i) cur[i] = nxt[i];
  }
}

// gate/up: block (kUpRows-row block, pair p) computes, for the pairs expert_columns gives it, h[pair,
// row] = fp16(silu(gate . x) * (up . x)). The columns' x rows are staged as fp16 (rounded as pairs)
// once for the block. Warp w streams matrix w % 2 (gate, up) over all of H for tile w / 2; the gate
// and up tiles of the same rows meet in shared memory.
constexpr int kUpRows = 16 * kWarps / 2;
__global__ void __launch_bounds__(kWarps * 32)
    tc_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, int group_chunks, const int32_t* __restrict__ ids,
                      int P, int k, const float* __restrict__ x, __half* __restrict__ h) {
  extern __shared__ __align__(16) __half xs[];  // [kCols][staged_stride(H)]
  __shared__ int cols[kCols], n_cols;
  __shared__ float part[kWarps][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, p = blockIdx.y;
  pdl_wait();  // ids come from the router
  if (warp == 0) expert_columns(experts, ids, P, p, cols, &n_cols);
  __syncthreads();
  const int n = n_cols;
  if (n == 0) return;
  const Int4View W = warp % 2 == 0 ? experts[ids[p]].gate : experts[ids[p]].up;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kUpRows + 16 * (warp / 2) + g, st = staged_stride(H);
  stream_tiles(
      W, row, 1, q, group_chunks, g < n ? xs + g * st : nullptr,
      [&] {
        for (int64_t i = threadIdx.x; i < n * (H / 4); i += blockDim.x) {
          const int64_t col = i / (H / 4), k4 = i % (H / 4);
          const float4 v = __ldg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(cols[col] / k) * H) + k4);
          __half2* dst = reinterpret_cast<__half2*>(xs + col * st + 4 * k4);
          dst[0] = __floats2half2_rn(v.x, v.y), dst[1] = __floats2half2_rn(v.z, v.w);
        }
        __syncthreads();
      },
      [&](int, const float(&acc)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) part[warp][i][lane] = acc[i];
      });
  pdl_launch_next();
  __syncthreads();
  if (warp % 2 != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // c0, c1: row g, columns 2q, 2q + 1; c2, c3: row g + 8
    const float gs = part[warp][i][lane], us = part[warp + 1][i][lane];
    const int col = 2 * q + (i & 1);
    if (col < n) h[static_cast<int64_t>(cols[col]) * I + row + (i >= 2 ? 8 : 0)] = __float2half_rn(gs / (1.0f + __expf(-gs)) * us);
  }
}

// down: block (kWarps * 16 * tpw rows, pair p): warp w streams the tiles w tpw .. (w + 1) tpw - 1 over
// all of I for the pairs expert_columns gives it, y[pair, row] = down . h[pair] (unweighted, fp32); the
// columns' h rows are staged once for the block.
__global__ void __launch_bounds__(kWarps * 32)
    tc_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, int group_chunks, const int32_t* __restrict__ ids, int P,
                   int tpw, const __half* __restrict__ h, float* __restrict__ y) {
  extern __shared__ __align__(16) __half hs[];  // [kCols][staged_stride(I)]
  __shared__ int cols[kCols], n_cols;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, p = blockIdx.y;
  // ids were written two kernels back (the router): safe to read before the wait (pdl.cuh), so the
  // weight loads overlap the gate/up kernel's tail
  if (warp == 0) expert_columns(experts, ids, P, p, cols, &n_cols);
  __syncthreads();
  const int n = n_cols;
  if (n == 0) return;  // reads and writes nothing of the earlier kernels'
  const Int4View W = experts[ids[p]].down;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 16 * tpw + g, st = staged_stride(I);
  stream_tiles(
      W, row, tpw, q, group_chunks, g < n ? hs + g * st : nullptr,
      [&] {
        pdl_wait();  // h is the gate/up kernel's
        for (int64_t i = threadIdx.x; i < n * (I / 8); i += blockDim.x) {
          const int64_t col = i / (I / 8), k8 = i % (I / 8);
          reinterpret_cast<uint4*>(hs + col * st)[k8] = reinterpret_cast<const uint4*>(h + static_cast<int64_t>(cols[col]) * I)[k8];
        }
        __syncthreads();
      },
      [&](int tile, const float(&acc)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = 2 * q + (i & 1);
          if (col < n) y[static_cast<int64_t>(cols[col]) * H + row + 16 * tile + (i >= 2 ? 8 : 0)] = acc[i];
        }
      });
  pdl_launch_next();
}

// out[t, r] = sum over j (in order) of weights[t k + j] * y[t k + j, r], resident experts only.
__global__ void tc_sum_kernel(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                              int k, int64_t H, const float* __restrict__ y, float* __restrict__ out) {
  const int t = blockIdx.y;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  pdl_enter();
  if (r >= H) return;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int p = t * k + j;
    if (experts[ids[p]].down.qweight) sum += weights[p] * y[static_cast<int64_t>(p) * H + r];
  }
  out[t * H + r] = sum;
}

// Down tiles a warp streams: as many as H allows up to 4 (fewer, larger blocks keep every block
// resident at once).
int down_tiles_per_warp(int64_t H) {
  for (int t : {4, 2}) if (H % (16 * kWarps * t) == 0) return t;
  return 1;
}

}  // namespace

bool moe_int4_decode_tc_fits(int64_t H, int64_t I, int64_t group_size, int k) {
  return k >= 1 && k <= 8 && H > 0 && I > 0 && H % (16 * kWarps) == 0 && H % kChunk == 0 && I % kChunk == 0 && I % kUpRows == 0 &&
         group_size > 0 && group_size % kChunk == 0 && H % group_size == 0 && I % group_size == 0;
}

cudaError_t moe_int4_decode_tc(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids, const float* weights,
                               int T, int k, const float* x, uint16_t* h_scratch, float* y_scratch, float* out, cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || !moe_int4_decode_tc_fits(H, I, group_size, k)) return cudaErrorInvalidValue;
  const int P = T * k, gc = static_cast<int>(group_size / kChunk), tpw = down_tiles_per_warp(H);
  static_assert(kMaxPairs <= 64, "expert_columns takes the pairs in two ballots");
  auto* h = reinterpret_cast<__half*>(h_scratch);
  const dim3 block(kWarps * 32);
  const size_t up_smem = kCols * staged_stride(H) * sizeof(__half), down_smem = kCols * staged_stride(I) * sizeof(__half);
  // above 48 KiB a kernel's dynamic shared memory needs the opt-in (H or I above ~3000)
  if (up_smem > 48 * 1024)
    if (const cudaError_t e = cudaFuncSetAttribute(tc_gate_up_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(up_smem)); e != cudaSuccess) return e;
  if (down_smem > 48 * 1024)
    if (const cudaError_t e = cudaFuncSetAttribute(tc_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(down_smem)); e != cudaSuccess) return e;
  cudaError_t err = launch(tc_gate_up_kernel, dim3(static_cast<unsigned>(I / kUpRows), static_cast<unsigned>(P)), block, up_smem, stream, experts, H,
                           I, gc, ids, P, k, x, h);
  if (err != cudaSuccess) return err;
  err = launch(tc_down_kernel, dim3(static_cast<unsigned>(H / (16 * kWarps * tpw)), static_cast<unsigned>(P)), block, down_smem, stream, experts, H, I,
               gc, ids, P, tpw, static_cast<const __half*>(h), y_scratch);
  if (err != cudaSuccess) return err;
  constexpr int kSumThreads = 256;
  return launch(tc_sum_kernel, dim3(static_cast<unsigned>((H + kSumThreads - 1) / kSumThreads), static_cast<unsigned>(T)), dim3(kSumThreads), 0,
                stream, experts, ids, weights, k, H, static_cast<const float*>(y_scratch), out);
}

}  // namespace tandem::gpu
