// gpu_core/deltanet.cu: Gated DeltaNet (see deltanet.cuh). Decode (one token) in two launches, the
// recurrence in one block per value head with its state slice in registers; prompt chunks in the
// chunked form, everything but the sequential step over chunks parallel over tokens.
#include <cuda_runtime.h>

#include <algorithm>

#include "gpu_core/block_reduce.cuh"
#include "gpu_core/conv_step.cuh"
#include "gpu_core/cp_async.cuh"
#include "gpu_core/deltanet.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/smem.cuh"

namespace tandem::gpu {

namespace {

constexpr int kRowGroups = 4;  // threads per state column; each owns dk / kRowGroups rows
constexpr int kMaxRowsPerThread = 32;
constexpr int kMaxHeadThreads = 512;  // delta_head_kernel's block: dv * kRowGroups (dv <= 128)
constexpr int kMaxHist = detail::kConvMaxHist;  // kernel <= 8
constexpr int kStageTokens = 8;  // delta_head_kernel: tokens whose inputs are staged at once

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

using detail::block_sum;
using detail::copy_async4;
using detail::copy_async_commit;
using detail::copy_async_wait;

// Causal conv + SiLU of channel ch over tokens [t0, t1), the window (the hist inputs before t0,
// oldest first) in registers and moved along.
__device__ __forceinline__ void conv_tokens(const float* __restrict__ x, const float* __restrict__ w, float (&win)[kMaxHist],
                                            float* __restrict__ y, int ch, int channels, int kernel, int t0, int t1) {
  for (int t = t0; t < t1; ++t) {
    y[int64_t(t) * channels + ch] = detail::conv_step(w + ch * kernel, kernel, win, x[int64_t(t) * channels + ch]);
  }
}

// One thread per (channel, group): the group's conv window lives in registers across its tokens
// (decode: DeltaNetDecodeArgs' groups), copied to kept_conv before and after each token when asked.
// The window (written by this kernel alone) is read before the wait for the previous kernel (pdl.cuh),
// and up to kStageTokens tokens' inputs are loaded before any is used.
__global__ void conv_kernel(DeltaNetDecodeArgs p, int channels) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
  const bool on = ch < channels;
  const int t0 = p.slot ? p.first[g] : 0, t1 = p.slot ? p.first[g + 1] : p.tokens;
  float* window = p.conv_state + (p.slot ? static_cast<int64_t>(p.slot[g]) * p.conv_stride : 0);
  const int hist = p.kernel - 1;
  float win[kMaxHist];
#pragma unroll
  for (int j = 0; j < kMaxHist; ++j)
    if (on && j < hist) win[j] = window[j * channels + ch];
  // The recurrence after it reads its state (its own, from the step before) before its wait: it may
  // launch and load while the input projection before this kernel still streams.
  detail::pdl_enter_next_first();
  if (!on) return;
  auto keep = [&](int copy) {
    if (p.kept_conv)
#pragma unroll
      for (int j = 0; j < kMaxHist; ++j)
        if (j < hist) p.kept_conv[copy * p.conv_stride + j * channels + ch] = win[j];
  };
  keep(0);
  for (int tb = t0; tb < t1; tb += kStageTokens) {
    const int n = min(kStageTokens, t1 - tb);
    float x[kStageTokens];
#pragma unroll
    for (int u = 0; u < kStageTokens; ++u) x[u] = u < n ? p.qkv[int64_t(tb + u) * channels + ch] : 0.0f;
#pragma unroll
    for (int u = 0; u < kStageTokens; ++u) {
      if (u >= n) break;
      p.conv_out[int64_t(tb + u) * channels + ch] = detail::conv_step(p.conv_w + ch * p.kernel, p.kernel, win, x[u]);
      keep(tb + u - t0 + 1);
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxHist; ++j)
    if (j < hist) window[j * channels + ch] = win[j];
}

// ---- the recurrence's per-thread pieces, shared by the decode and prefill kernels ----
// A thread owns rows r, r + kRowGroups, ... (< dk) of state column j, in registers.
__device__ __forceinline__ void slice_load(float (&s)[kMaxRowsPerThread], const float* S, int r, int j, int dk, int dv) {
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) s[n] = S[i * dv + j];
  }
}
__device__ __forceinline__ void slice_store(const float (&s)[kMaxRowsPerThread], float* S, int r, int j, int dk, int dv) {
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) S[i * dv + j] = s[n];
  }
}
// S <- e^g S; returns this thread's share of (S^T k)_j.
__device__ __forceinline__ float slice_decay_dot(float (&s)[kMaxRowsPerThread], const float* k, float decay, int r, int dk) {
  float u = 0.0f;
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) {
      s[n] *= decay;
      u += s[n] * k[i];
    }
  }
  return u;
}
// S += k delta_j; returns this thread's share of (S^T q)_j, read after the write.
__device__ __forceinline__ float slice_update_dot(float (&s)[kMaxRowsPerThread], const float* k, const float* q, float delta, int r,
                                                  int dk) {
  float o = 0.0f;
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) {
      s[n] += k[i] * delta;
      o += s[n] * q[i];
    }
  }
  return o;
}
// Column j's total over the row groups' shares in part [kRowGroups][dv].
__device__ __forceinline__ float column_sum(const float* part, int j, int dv) {
  float v = 0.0f;
  for (int rr = 0; rr < kRowGroups; ++rr) v += part[rr * dv + j];
  return v;
}
// The L2-norm scales of q (also scaled by dk^-0.5) and k from their sums of squares.
__device__ __forceinline__ float q_scale(float qq, int dk) { return rsqrtf(qq + 1e-6f) * rsqrtf(static_cast<float>(dk)); }
__device__ __forceinline__ float k_scale(float kk) { return rsqrtf(kk + 1e-6f); }
// The gated RMSNorm of output column j: norm_w_j (o_j / rms(o)) silu(z_j), sq = sum of o^2 over dv.
__device__ __forceinline__ float gated_rms(float o, float sq, int dv, float eps, float norm_w, float z) {
  return norm_w * (o * rsqrtf(sq / dv + eps)) * silu(z);
}
// g = -A softplus(a + dt_bias) (A = e^A_log): the log of the step's decay.
__device__ __forceinline__ float log_decay(float a, float dt_bias, float A) {
  const float aa = a + dt_bias;
  return -A * (aa > 20.0f ? aa : log1pf(expf(aa)));
}
// decay = e^g, beta = sigmoid(b).
__device__ __forceinline__ void gates(float a, float dt_bias, float A, float b, float& decay, float& beta) {
  decay = expf(log_decay(a, dt_bias, A));
  beta = 1.0f / (1.0f + expf(-b));
}

// q and k (dk each, from qsrc / ksrc) into shared q[dk], k[dk], L2-normalised (q also scaled by
// dk^-0.5); red: blockDim.x / 32 floats. Every thread of the block calls it.
__device__ __forceinline__ void load_qk_normed(const float* qsrc, const float* ksrc, int dk, float* q, float* k, float* red) {
  float qq = 0.0f, kk = 0.0f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    q[i] = qsrc[i];
    k[i] = ksrc[i];
    qq += q[i] * q[i];
    kk += k[i] * k[i];
  }
  qq = block_sum(qq, red);
  kk = block_sum(kk, red);
  const float qs = q_scale(qq, dk), ks = k_scale(kk);
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    q[i] *= qs;
    k[i] *= ks;
  }
}

// Prefill (T > 1): the conv over tokens in parallel, kConvTokens a thread, each thread rebuilding its
// window from the inputs before its first token (or the carried state); the same operations per
// output as conv_kernel. The carried window moves on in conv_window_kernel, after every read of it.
constexpr int kConvTokens = 16;
__global__ void conv_tokens_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ window,
                                   float* __restrict__ y, int channels, int kernel, int T) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * kConvTokens;
  if (ch >= channels) return;
  const int hist = kernel - 1;
  float win[kMaxHist];
#pragma unroll
  for (int j = 0; j < kMaxHist; ++j) {
    const int tt = t0 - hist + j;
    if (j < hist) win[j] = tt >= 0 ? x[int64_t(tt) * channels + ch] : window[(hist + tt) * channels + ch];
  }
  conv_tokens(x, w, win, y, ch, channels, kernel, t0, min(T, t0 + kConvTokens));
}

__global__ void conv_window_kernel(const float* __restrict__ x, float* __restrict__ window, int channels, int kernel, int T) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= channels) return;
  const int hist = kernel - 1;
  for (int j = 0; j < hist; ++j) {  // ascending: window[j + T] (j + T > j) is read before it is overwritten
    const int tt = T - hist + j;
    window[j * channels + ch] = tt >= 0 ? x[int64_t(tt) * channels + ch] : window[(j + T) * channels + ch];
  }
}

// Prefill step 2: q and k of every (token, key head) L2-normalised in place in conv_out (q also
// scaled by dk^-0.5), all tokens in parallel; one block of round-up-32(dk) threads per (token, head).
__global__ void qk_norm_kernel(float* conv_out, int Hk, int dk, int64_t conv_dim) {
  __shared__ float red[32];
  const int t = blockIdx.x / Hk, kh = blockIdx.x % Hk, i = threadIdx.x;
  const int64_t key_dim = int64_t(Hk) * dk;
  float* q = conv_out + t * conv_dim + kh * dk;
  float* k = q + key_dim;
  const float qi = i < dk ? q[i] : 0.0f, ki = i < dk ? k[i] : 0.0f;
  const float qq = block_sum(qi * qi, red), kk = block_sum(ki * ki, red);
  if (i < dk) {
    q[i] = qi * q_scale(qq, dk);
    k[i] = ki * k_scale(kk);
  }
}

// Prefill step 3, chunked form (deltanet_prefill_chunked): the recurrence of ref::delta_rule_chunk,
// kChunk tokens at a time, as small matrix products in shared memory. A block owns value head h and
// kSlice of its state columns (the columns are independent given the keys); per chunk:
//   A[t][s] = beta_t e^{G_t - G_s} k_t.k_s (s < t), M[t][s] = e^{G_t - G_s} q_t.k_s (s <= t),
//   D = beta (V - e^G K S0), then D[t] -= sum_{s<t} A[t][s] D[s] (forward substitution per column),
//   O = e^G Q S0 + M D (raw o, normalised by gated_norm_kernel), S0 <- e^{G_last} S0 + sum_s e^{G_last - G_s} k_s D[s].
constexpr int kChunk = 32, kSlice = 32;

// Rows t0 .. t0 + cc of the chunk's normalised q and k (key head kh) into Qs / Ks [kChunk][ldk],
// zeros past cc.
__device__ __forceinline__ void load_chunk_qk(const DeltaNetDecodeArgs& p, int t0, int cc, int kh, int ldk, float* Qs, float* Ks) {
  const int dk = p.dk;
  const int64_t key_dim = static_cast<int64_t>(p.Hk) * dk, conv_dim = 2 * key_dim + static_cast<int64_t>(p.Hv) * p.dv;
  for (int idx = threadIdx.x; idx < kChunk * dk; idx += blockDim.x) {
    const int t = idx / dk, i = idx % dk;
    const float* c = p.conv_out + static_cast<int64_t>(t0 + t) * conv_dim;
    Qs[t * ldk + i] = t < cc ? c[kh * dk + i] : 0.0f;
    Ks[t * ldk + i] = t < cc ? c[key_dim + kh * dk + i] : 0.0f;
  }
}

// The block's state columns col0 .. col0 + width of value head h's state S [dk][dv] into S0 [dk][kSlice]
// (zeros past width), and back.
__device__ __forceinline__ void load_state_slice(const float* S, int dk, int dv, int col0, int width, float* S0) {
  for (int idx = threadIdx.x; idx < dk * kSlice; idx += blockDim.x) {
    const int i = idx / kSlice, j = idx % kSlice;
    S0[idx] = j < width ? S[i * dv + col0 + j] : 0.0f;
  }
}
__device__ __forceinline__ void store_state_slice(const float* S0, int dk, int dv, int col0, int width, float* S) {
  for (int idx = threadIdx.x; idx < dk * kSlice; idx += blockDim.x) {
    const int i = idx / kSlice, j = idx % kSlice;
    if (j < width) S[i * dv + col0 + j] = S0[idx];
  }
}

// The chunk's cumulative log decays G and betas Bt of value head h (no decay and beta 0 past cc), with
// the barriers around the prefix sum: every thread of the block calls it.
__device__ __forceinline__ void chunk_gates(const DeltaNetDecodeArgs& p, int t0, int cc, int h, float dt, float A, float* G, float* Bt) {
  const int tid = threadIdx.x;
  if (tid < kChunk) {  // past the chunk's end: no decay, no write
    G[tid] = tid < cc ? log_decay(p.a[int64_t(t0 + tid) * p.Hv + h], dt, A) : 0.0f;
    Bt[tid] = tid < cc ? 1.0f / (1.0f + expf(-p.b[int64_t(t0 + tid) * p.Hv + h])) : 0.0f;
  }
  __syncthreads();
  if (tid == 0)
    for (int t = 1; t < kChunk; ++t) G[t] += G[t - 1];
  __syncthreads();
}

// k_t . k_s and q_t . k_s of the staged chunk rows.
__device__ __forceinline__ void chunk_dots(const float* Qs, const float* Ks, int ldk, int dk, int t, int s, float& kk, float& qk) {
  kk = 0.0f, qk = 0.0f;
  for (int i = 0; i < dk; ++i) {
    kk += Ks[t * ldk + i] * Ks[s * ldk + i];
    qk += Qs[t * ldk + i] * Ks[s * ldk + i];
  }
}

// Prefill step 3, chunked form (ref::delta_rule_chunk) with the chunk terms first
// (DeltaNetDecodeArgs::chunk_terms). Per chunk of 32 tokens with cumulative log decays G and betas,
// A[t][s] = beta_t e^{G_t - G_s} k_t.k_s (s < t) is the chunk's forward substitution; what does not
// depend on the state is computed for every chunk at once (delta_terms_kernel, one block per (chunk,
// value head)):
//   T' = (I + A)^-1 diag(beta),
//   M[t][s] = e^{G_t - G_s} q_t.k_s (s <= t), e^{G_t}, Wl_s = e^{G_last - G_s}, e^{G_last};
// then the sequential step (delta_wy_kernel, one block per (value head, 32 state columns)) is
//   KS = K S0, QS = Q S0;  D = T' (V - e^G KS);  O = e^G QS + M D;  S0 <- e^{G_last} S0 + (Wl K)^T D,
// each product register-tiled (a thread holds 2 x 4 outputs of the 32 x 32 ones, 8 x 4 of the state).
static_assert(kChunk == kDeltaChunkTokens, "the chunk terms are laid out for kDeltaChunkTokens");
constexpr int kTermT = 0, kTermM = kChunk * kChunk, kTermEG = 2 * kChunk * kChunk, kTermWl = kTermEG + kChunk, kTermEGl = kTermWl + kChunk;
static_assert(kTermEGl < kDeltaChunkTermFloats, "chunk terms overflow their slot");
constexpr int kTermsThreads = 128, kWyThreads = 128, kLdc = kChunk + 1;  // +1: a column's rows on different banks
size_t terms_smem_floats(int dk) { return 2 * kChunk * (dk + 1) + 2 * kChunk * kLdc + 2 * kChunk; }
// delta_wy_kernel's shared memory: S0 [dk][kSlice], D [kChunk][kSlice], then two chunk buffers.
constexpr int wy_buffer_floats(int dk) { return kChunk * kSlice + 2 * kChunk * kLdc + 2 * kChunk * (dk + 1) + 2 * kChunk + 4; }
size_t wy_smem_floats(int dk, int buffers) { return static_cast<size_t>(dk) * kSlice + kChunk * kSlice + buffers * wy_buffer_floats(dk); }

__global__ void __launch_bounds__(kTermsThreads) delta_terms_kernel(DeltaNetDecodeArgs p, int T) {
  extern __shared__ float sm[];
  const int dk = p.dk, c = blockIdx.x, h = blockIdx.y, kh = h / (p.Hv / p.Hk), tid = threadIdx.x;
  const int t0 = c * kChunk, cc = min(kChunk, T - t0), ldk = dk + 1;
  float* Ks = sm;                   // [kChunk][ldk]
  float* Qs = Ks + kChunk * ldk;    // [kChunk][ldk]
  float* Am = Qs + kChunk * ldk;    // [kChunk][kLdc]
  float* Tm = Am + kChunk * kLdc;   // [kChunk][kLdc]: (I + A)^-1
  float* G = Tm + kChunk * kLdc;    // [kChunk] cumulative log decay
  float* Bt = G + kChunk;           // [kChunk] beta
  load_chunk_qk(p, t0, cc, kh, ldk, Qs, Ks);
  chunk_gates(p, t0, cc, h, p.dt_bias[h], expf(p.A_log[h]), G, Bt);
  float* out = p.chunk_terms + (static_cast<int64_t>(c) * p.Hv + h) * kDeltaChunkTermFloats;
  for (int idx = tid; idx < kChunk * kChunk; idx += kTermsThreads) {
    const int t = idx / kChunk, s = idx % kChunk;
    float kk, qk;
    chunk_dots(Qs, Ks, ldk, dk, t, s, kk, qk);
    const bool in = t < cc && s < cc;
    Am[t * kLdc + s] = in && s < t ? Bt[t] * expf(G[t] - G[s]) * kk : 0.0f;
    out[kTermM + idx] = in && s <= t ? expf(G[t] - G[s]) * qk : 0.0f;
  }
  if (tid < kChunk) {
    out[kTermEG + tid] = expf(G[tid]);
    out[kTermWl + tid] = tid < cc ? expf(G[cc - 1] - G[tid]) : 0.0f;
  }
  if (tid == 0) out[kTermEGl] = expf(G[cc - 1]);
  __syncthreads();
  if (tid < kChunk) {  // (I + A)^-1, unit lower triangular: column j by thread j, row after row
    const int j = tid;
    for (int t = 0; t < kChunk; ++t) {
      float v = t == j ? 1.0f : 0.0f;
      for (int s = j; s < t; ++s) v -= Am[t * kLdc + s] * Tm[s * kLdc + j];
      Tm[t * kLdc + j] = v;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kChunk * kChunk; idx += kTermsThreads) {
    const int t = idx / kChunk, s = idx % kChunk;
    out[kTermT + idx] = Tm[t * kLdc + s] * Bt[s];
  }
}

// acc[r][j] += sum_s A[r0 + r][s] * B[s][c0 + j] (A [kChunk][kLdc], B [kChunk][kSlice], s ascending).
__device__ __forceinline__ void tile_product(const float* A, const float* B, int r0, int c0, float (&acc)[2][4]) {
  for (int s = 0; s < kChunk; ++s) {
    const float4 b4 = *reinterpret_cast<const float4*>(B + s * kSlice + c0);
    const float bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float a = A[(r0 + r) * kLdc + s];
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[r][j] += a * bv[j];
    }
  }
}

// One chunk's inputs in delta_wy_kernel's shared memory (a buffer of wy_buffer_floats).
struct WyChunk {
  float *Rs, *Tm, *Mm, *Ks, *Qs, *EG, *Wl, *EGl;
  __device__ WyChunk(float* b, int ldk)
      : Rs(b), Tm(Rs + kChunk * kSlice), Mm(Tm + kChunk * kLdc), Ks(Mm + kChunk * kLdc), Qs(Ks + kChunk * ldk), EG(Qs + kChunk * ldk),
        Wl(EG + kChunk), EGl(Wl + kChunk) {}
};

// Starts the copies of chunk c's q, k (rows past its end: zeros), terms and value slice into B, and
// commits them as one group: they land while the block works on the chunk before.
__device__ __forceinline__ void stage_wy_chunk(const DeltaNetDecodeArgs& p, int T, int c, int h, int kh, int col0, int width, int ldk,
                                               const WyChunk& B) {
  const int dk = p.dk, tid = threadIdx.x, t0 = c * kChunk, cc = min(kChunk, T - t0);
  const int64_t key_dim = static_cast<int64_t>(p.Hk) * dk, conv_dim = 2 * key_dim + static_cast<int64_t>(p.Hv) * p.dv;
  for (int idx = tid; idx < kChunk * dk; idx += kWyThreads) {
    const int t = idx / dk, i = idx % dk;
    const float* row = p.conv_out + static_cast<int64_t>(t0 + min(t, cc - 1)) * conv_dim;
    copy_async4(B.Qs + t * ldk + i, row + kh * dk + i, t < cc);
    copy_async4(B.Ks + t * ldk + i, row + key_dim + kh * dk + i, t < cc);
  }
  const float* terms = p.chunk_terms + (static_cast<int64_t>(c) * p.Hv + h) * kDeltaChunkTermFloats;
  for (int idx = tid; idx < kChunk * kChunk; idx += kWyThreads) {
    const int t = idx / kChunk, s = idx % kChunk;
    copy_async4(B.Tm + t * kLdc + s, terms + kTermT + idx, true);
    copy_async4(B.Mm + t * kLdc + s, terms + kTermM + idx, true);
  }
  for (int idx = tid; idx < kChunk * kSlice; idx += kWyThreads) {
    const int t = idx / kSlice, j = idx % kSlice;
    const bool ok = t < cc && j < width;
    copy_async4(B.Rs + idx, p.conv_out + (ok ? static_cast<int64_t>(t0 + t) * conv_dim + 2 * key_dim + static_cast<int64_t>(h) * p.dv + col0 + j : 0),
                ok);
  }
  if (tid < kChunk) copy_async4(B.EG + tid, terms + kTermEG + tid, true), copy_async4(B.Wl + tid, terms + kTermWl + tid, true);
  if (tid == 0) copy_async4(B.EGl, terms + kTermEGl, true);
  copy_async_commit();
}

// NBUF 2: chunk c in buffer c % 2, the next chunk's copies in flight while this one computes; NBUF 1:
// one buffer, each chunk copied after the previous one is done (devices with less shared memory).
template <int NBUF>
__global__ void __launch_bounds__(kWyThreads) delta_wy_kernel(DeltaNetDecodeArgs p, int T) {
  extern __shared__ __align__(16) float sm[];
  const int dk = p.dk, dv = p.dv, h = blockIdx.x, kh = h / (p.Hv / p.Hk), col0 = blockIdx.y * kSlice, tid = threadIdx.x;
  const int width = min(kSlice, dv - col0), ldk = dk + 1;
  float* S0 = sm;                          // [dk][kSlice]: this block's state columns
  float* Ds = S0 + dk * kSlice;            // [kChunk][kSlice]: D
  float* bufs = Ds + kChunk * kSlice;      // NBUF WyChunk buffers
  const int64_t Vd = static_cast<int64_t>(p.Hv) * dv;
  float* S = p.state + static_cast<int64_t>(h) * dk * dv;
  const int nch = (T + kChunk - 1) / kChunk;
  stage_wy_chunk(p, T, 0, h, kh, col0, width, ldk, WyChunk(bufs, ldk));
  load_state_slice(S, dk, dv, col0, width, S0);
  // This thread's tiles: rows r0, r0 + 1 x columns c0 .. c0 + 3 of the 32 x 32 products, and state
  // rows ig + 16 m (m < 8) x the same columns.
  const int r0 = 2 * (tid / 8), c0 = 4 * (tid % 8), ig = tid / 8;
  for (int c = 0; c < nch; ++c) {
    const int t0 = c * kChunk, cc = min(kChunk, T - t0);
    const WyChunk B(bufs + (c % NBUF) * wy_buffer_floats(dk), ldk);
    __syncthreads();  // the previous chunk is done with every buffer, the next one's included
    if constexpr (NBUF == 2) {
      if (c + 1 < nch) stage_wy_chunk(p, T, c + 1, h, kh, col0, width, ldk, WyChunk(bufs + ((c + 1) % 2) * wy_buffer_floats(dk), ldk));
      else copy_async_commit();  // an empty group: the wait below always leaves exactly the newest
      copy_async_wait<1>();
    } else {
      if (c > 0) stage_wy_chunk(p, T, c, h, kh, col0, width, ldk, B);  // chunk 0 was staged before the loop
      copy_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of chunk c have landed
    float *Ks = B.Ks, *Qs = B.Qs, *Rs = B.Rs, *Tm = B.Tm, *Mm = B.Mm, *EG = B.EG, *Wl = B.Wl;
    const float egl = *B.EGl;
    // KS and QS; R = V - e^G KS into Rs (each thread its own entries), e^G QS kept for O.
    float ks[2][4] = {}, qs[2][4] = {};
    for (int i = 0; i < dk; ++i) {
      const float4 s4 = *reinterpret_cast<const float4*>(S0 + i * kSlice + c0);
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float kv = Ks[(r0 + r) * ldk + i], qv = Qs[(r0 + r) * ldk + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) ks[r][j] += kv * sv[j], qs[r][j] += qv * sv[j];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float eg = EG[r0 + r];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        Rs[(r0 + r) * kSlice + c0 + j] -= eg * ks[r][j];
        qs[r][j] *= eg;
      }
    }
    __syncthreads();
    // D = T' R (T' is lower triangular: its zeros above the diagonal are stored).
    float d[2][4] = {};
    tile_product(Tm, Rs, r0, c0, d);
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float4*>(Ds + (r0 + r) * kSlice + c0) = make_float4(d[r][0], d[r][1], d[r][2], d[r][3]);
    __syncthreads();
    // O = e^G QS + M D (raw o, normalised by gated_norm_kernel).
    tile_product(Mm, Ds, r0, c0, qs);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (r0 + r < cc && c0 + j < width) p.out[static_cast<int64_t>(t0 + r0 + r) * Vd + static_cast<int64_t>(h) * dv + col0 + c0 + j] = qs[r][j];
    // S0 <- e^{G_last} S0 + sum_s Wl_s k_s D[s] (S0's readers are past the barrier before D).
    float sn[8][4];
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int i = ig + 16 * m;
#pragma unroll
      for (int j = 0; j < 4; ++j) sn[m][j] = i < dk ? egl * S0[i * kSlice + c0 + j] : 0.0f;
    }
    for (int s = 0; s < kChunk; ++s) {
      const float4 d4 = *reinterpret_cast<const float4*>(Ds + s * kSlice + c0);
      const float dvv[4] = {d4.x, d4.y, d4.z, d4.w};
      const float wl = Wl[s];
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        const int i = ig + 16 * m;
        const float kw = i < dk ? wl * Ks[s * ldk + i] : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) sn[m][j] += kw * dvv[j];
      }
    }
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int i = ig + 16 * m;
      if (i < dk) *reinterpret_cast<float4*>(S0 + i * kSlice + c0) = make_float4(sn[m][0], sn[m][1], sn[m][2], sn[m][3]);
    }
  }
  __syncthreads();
  store_state_slice(S0, dk, dv, col0, width, S);
}

// Prefill step 4: out = gated RMSNorm(o, z) per (token, value head), in place.
// The norm weight and z are read before the wait in the source (z is the input projection's, written
// three kernels back: pdl.cuh), so that they go out with out's load: read after the block's sum, as
// before, they were a second round trip to memory. (ptxas places these .nc loads just after the wait,
// beside out's: sass.sh.)
__global__ void gated_norm_kernel(float* out, const float* __restrict__ z, const float* __restrict__ norm_w, int dv, float eps) {
  __shared__ float red[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dv;
  const int j = threadIdx.x;
  const float w = j < dv ? norm_w[j] : 0.0f, zj = j < dv ? z[base + j] : 0.0f;
  detail::pdl_enter_next_first();  // the output projection after it reads weights alone before its wait
  const float o = j < dv ? out[base + j] : 0.0f;
  const float sq = block_sum(o * o, red);
  if (j < dv) out[base + j] = gated_rms(o, sq, dv, eps, w, zj);
}

// gated_norm_kernel over T tokens' raw outputs (decode after delta_head_kernel, prefill after the recurrence).
void launch_gated_norm(const DeltaNetDecodeArgs& p, int T, cudaStream_t stream) {
  detail::launch(gated_norm_kernel, dim3(T * p.Hv), dim3((p.dv + 31) / 32 * 32), 0, stream, p.out, static_cast<const float*>(p.z), p.norm_w,
                 p.dv, p.eps);
}

// One block per (value head, column slice, group): the group's tokens in order on its sequence's
// state, columns [col0, col0 + cw) of the head's. The columns' recurrences are independent (each reads
// the head's q and k, its own v), so a head is split over head_slices(dv) blocks: four times the
// SMs at work on one sequence's step (a head a block kept 32 of them busy). Each block writes its
// columns' raw outputs; gated_norm_kernel normalises each (token, head) row after it.
// Keep: the state also copied out before and after each token (a separate instance: the copies'
// registers would push the plain step past 128 a thread).
// The inputs of up to kStageTokens tokens (raw q and k, the slice's v, a, b) are staged in shared
// memory by one round of loads before their recurrence steps: each token's step then waits on no
// global load (read token by token, its dependent loads were most of a verification step's time).
template <bool Keep>
__global__ void __launch_bounds__(kMaxHeadThreads) delta_head_kernel(DeltaNetDecodeArgs p, int cw) {
  extern __shared__ float smem[];
  const int dk = p.dk, dv = p.dv, h = blockIdx.x, g = blockIdx.z, kh = h / (p.Hv / p.Hk), col0 = blockIdx.y * cw;
  float* q = smem;
  float* k = q + dk;
  float* part = k + dk;
  float* red = part + kRowGroups * cw;
  float* stage = red + blockDim.x / 32;  // [kStageTokens] of raw q [dk], raw k [dk], v [cw], a, b
  const int per = 2 * dk + cw + 2;
  const int tid = threadIdx.x, jl = tid % cw, j = col0 + jl, r = tid / cw;
  const int64_t key_dim = static_cast<int64_t>(p.Hk) * dk, conv_dim = 2 * key_dim + static_cast<int64_t>(p.Hv) * dv;
  const int64_t Vd = static_cast<int64_t>(p.Hv) * dv;
  // slot and first were copied in before the step's first kernel: complete before this one starts
  const int t0 = p.slot ? __ldg(p.first + g) : 0, t1 = p.slot ? __ldg(p.first + g + 1) : p.tokens;
  // formed again where it is stored (a reload, not two registers held across the loop)
  auto state_of = [&] { return p.state + (p.slot ? static_cast<int64_t>(__ldg(p.slot + g)) * p.state_stride : 0) + static_cast<int64_t>(h) * dk * dv; };
  float s[kMaxRowsPerThread];
  slice_load(s, state_of(), r, j, dk, dv);  // the state is written by this kernel alone (pdl.cuh: read before the wait)
  detail::pdl_enter();
  if constexpr (Keep) slice_store(s, p.kept_state + static_cast<int64_t>(h) * dk * dv, r, j, dk, dv);
  const float A = expf(p.A_log[h]);
  for (int tb = t0; tb < t1; tb += kStageTokens) {
    const int n = min(kStageTokens, t1 - tb);
    __syncthreads();  // the previous round is done with the stage
    for (int e = tid; e < n * per; e += blockDim.x) {
      const int u = e / per, i = e % per;
      const int64_t t = tb + u;
      const float* c = p.conv_out + t * conv_dim;
      float v;
      if (i < dk) v = c[kh * dk + i];
      else if (i < 2 * dk) v = c[key_dim + kh * dk + (i - dk)];
      else if (i < 2 * dk + cw) v = c[2 * key_dim + static_cast<int64_t>(h) * dv + col0 + (i - 2 * dk)];
      else v = i == per - 2 ? p.a[t * p.Hv + h] : p.b[t * p.Hv + h];
      stage[e] = v;
    }
    for (int u = 0; u < n; ++u) {
      const float* in = stage + u * per;
      const int t = tb + u;
      __syncthreads();  // the stage is in; the previous token is done with q, k and part
      load_qk_normed(in, in + dk, dk, q, k, red);
      float decay, beta;
      gates(in[per - 2], p.dt_bias[h], A, in[per - 1], decay, beta);
      __syncthreads();
      part[r * cw + jl] = slice_decay_dot(s, k, decay, r, dk);
      __syncthreads();
      const float delta = beta * (in[2 * dk + jl] - column_sum(part, jl, cw));
      const float o = slice_update_dot(s, k, q, delta, r, dk);
      __syncthreads();
      part[r * cw + jl] = o;
      __syncthreads();
      if (r == 0) p.out[t * Vd + static_cast<int64_t>(h) * dv + j] = column_sum(part, jl, cw);
      if constexpr (Keep) slice_store(s, p.kept_state + (t - t0 + 1) * p.state_stride + static_cast<int64_t>(h) * dk * dv, r, j, dk, dv);
    }
  }
  slice_store(s, state_of(), r, j, dk, dv);
}

// Prompt chunks (T > 1): the token-parallel parts around a recurrence launched by `recurrence`
// (it reads q / k normalised in conv_out and writes the raw o): conv, window, q/k norms, ..., gated norm.
template <typename Recurrence>
cudaError_t launch_token_parallel(const DeltaNetDecodeArgs& p, int T, cudaStream_t stream, Recurrence&& recurrence) {
  const int conv_dim = 2 * p.Hk * p.dk + p.Hv * p.dv;
  conv_tokens_kernel<<<dim3((conv_dim + 255) / 256, (T + kConvTokens - 1) / kConvTokens), 256, 0, stream>>>(
      p.qkv, p.conv_w, p.conv_state, p.conv_out, conv_dim, p.kernel, T);
  conv_window_kernel<<<(conv_dim + 255) / 256, 256, 0, stream>>>(p.qkv, p.conv_state, conv_dim, p.kernel, T);
  qk_norm_kernel<<<T * p.Hk, (p.dk + 31) / 32 * 32, 0, stream>>>(p.conv_out, p.Hk, p.dk, conv_dim);
  recurrence();
  launch_gated_norm(p, T, stream);
  return cudaGetLastError();
}

// Shapes delta_head_kernel (and the conv kernels) take.
bool head_kernel_fits(const DeltaNetDecodeArgs& p) {
  return p.Hk >= 1 && p.Hv % p.Hk == 0 && p.dk >= 1 && p.dk <= kRowGroups * kMaxRowsPerThread && p.dv >= 1 &&
         p.dv * kRowGroups <= kMaxHeadThreads && (p.dv * kRowGroups) % 32 == 0 && p.kernel >= 1 && p.kernel <= kMaxHist + 1;
}

// The conv of the step's tokens, one thread per (channel, group) (conv_kernel).
void launch_conv(const DeltaNetDecodeArgs& p, cudaStream_t stream) {
  const int conv_dim = 2 * p.Hk * p.dk + p.Hv * p.dv;
  detail::launch(conv_kernel, dim3((conv_dim + 255) / 256, p.groups), dim3(256), 0, stream, p, conv_dim);
}

// Column slices a head's recurrence is split into (delta_head_kernel): 4 where the slices keep whole
// warps (head_kernel_fits: dv a multiple of 8).
int head_slices(int dv) { return dv % 32 == 0 ? 4 : dv % 16 == 0 ? 2 : 1; }

// The recurrence of the step's tokens, one block per (value head, column slice, group)
// (delta_head_kernel), then each (token, head) row's gated RMSNorm (gated_norm_kernel).
void launch_head(const DeltaNetDecodeArgs& p, cudaStream_t stream) {
  const int slices = head_slices(p.dv), cw = p.dv / slices, threads = cw * kRowGroups;
  const size_t smem = (2 * p.dk + kRowGroups * cw + threads / 32 + kStageTokens * (2 * p.dk + cw + 2)) * sizeof(float);
  const dim3 grid(p.Hv, slices, p.groups);
  if (p.kept_state) detail::launch(delta_head_kernel<true>, grid, dim3(threads), smem, stream, p, cw);
  else detail::launch(delta_head_kernel<false>, grid, dim3(threads), smem, stream, p, cw);
  launch_gated_norm(p, p.tokens, stream);
}

}  // namespace

cudaError_t deltanet_prefill_chunked(const DeltaNetDecodeArgs& p, int T, cudaStream_t stream) {
  if (T < 1 || p.Hk < 1 || p.Hv % p.Hk || p.dk < 1 || p.dk > 128 || p.dv < 1 || p.kernel < 1 || p.kernel > kMaxHist + 1 || !p.chunk_terms)
    return cudaErrorInvalidValue;
  // Once per process, for the largest dk allowed (a host call: not on every chunk of every layer).
  static const cudaError_t opt_in_terms = opt_in_smem(delta_terms_kernel, terms_smem_floats(128) * sizeof(float));
  static const cudaError_t opt_in_wy1 = opt_in_smem(delta_wy_kernel<1>, wy_smem_floats(128, 1) * sizeof(float));
  // Two chunk buffers where the device allows a block their shared memory (sm_80 / sm_90), else one.
  static const int fit_buffers = opt_in_smem(delta_wy_kernel<2>, wy_smem_floats(128, 2) * sizeof(float)) == cudaSuccess ? 2 : 1;
  const int buffers = p.wy_buffers == 1 || p.wy_buffers == 2 ? std::min(p.wy_buffers, fit_buffers) : fit_buffers;
  if (opt_in_terms != cudaSuccess) return opt_in_terms;
  if (opt_in_wy1 != cudaSuccess) return opt_in_wy1;
  const unsigned chunks = static_cast<unsigned>((T + kChunk - 1) / kChunk);
  return launch_token_parallel(p, T, stream, [&] {
    delta_terms_kernel<<<dim3(chunks, p.Hv), kTermsThreads, terms_smem_floats(p.dk) * sizeof(float), stream>>>(p, T);
    const dim3 grid(p.Hv, (p.dv + kSlice - 1) / kSlice);
    const size_t smem = wy_smem_floats(p.dk, buffers) * sizeof(float);
    if (buffers == 2) delta_wy_kernel<2><<<grid, kWyThreads, smem, stream>>>(p, T);
    else delta_wy_kernel<1><<<grid, kWyThreads, smem, stream>>>(p, T);
  });
}

cudaError_t deltanet_decode(const DeltaNetDecodeArgs& p, cudaStream_t stream) {
  if (!head_kernel_fits(p) || p.tokens < 1 || p.groups < 1 || (p.groups > 1 && !p.slot) || (p.slot && !p.first) ||
      ((p.kept_state || p.kept_conv) && (p.groups != 1 || p.conv_stride < 1 || p.state_stride < 1)))
    return cudaErrorInvalidValue;
  launch_conv(p, stream);
  launch_head(p, stream);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
