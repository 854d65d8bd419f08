// gpu_core/deltanet.cu: Gated DeltaNet over T tokens in two launches (see deltanet.cuh); decode is
// T = 1. The recurrence runs token after token inside one block per value head with the state slice
// held in registers for the whole call (read and written once, not once per token).
#include <cuda_runtime.h>

#include "gpu_core/deltanet.cuh"

namespace tandem::gpu {

namespace {

constexpr int kRowGroups = 4;  // threads per state column; each owns dk / kRowGroups rows
constexpr int kMaxRowsPerThread = 32;
constexpr int kMaxHist = 7;    // kernel <= 8

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// Block-wide sum over blockDim.x threads through shared memory `red` (blockDim.x / 32 floats).
__device__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int i = 0; i < nwarps; ++i) s += red[i];
  return s;
}

// One thread per channel: the conv window lives in registers across the T tokens.
__global__ void conv_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ window,
                                    float* __restrict__ y, int channels, int kernel, int T) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= channels) return;
  const int hist = kernel - 1;
  float win[kMaxHist];
  for (int j = 0; j < hist; ++j) win[j] = window[j * channels + ch];
  for (int t = 0; t < T; ++t) {
    const float xc = x[int64_t(t) * channels + ch];
    float acc = w[ch * kernel + hist] * xc;
    for (int j = 0; j < hist; ++j) acc += w[ch * kernel + j] * win[j];
    y[int64_t(t) * channels + ch] = silu(acc);
    for (int j = 0; j + 1 < hist; ++j) win[j] = win[j + 1];
    if (hist > 0) win[hist - 1] = xc;
  }
  for (int j = 0; j < hist; ++j) window[j * channels + ch] = win[j];
}

__global__ void delta_head_kernel(DeltaNetDecodeArgs p, int T) {
  extern __shared__ float smem[];
  const int dk = p.dk, dv = p.dv, h = blockIdx.x, kh = h / (p.Hv / p.Hk);
  float* q = smem;
  float* k = q + dk;
  float* part = k + dk;
  float* red = part + kRowGroups * dv;
  const int tid = threadIdx.x, j = tid % dv, r = tid / dv;
  const int64_t key_dim = static_cast<int64_t>(p.Hk) * dk, conv_dim = 2 * key_dim + static_cast<int64_t>(p.Hv) * dv;
  const int64_t Vd = static_cast<int64_t>(p.Hv) * dv;

  float* S = p.state + static_cast<int64_t>(h) * dk * dv;
  float s[kMaxRowsPerThread];
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) s[n] = S[i * dv + j];
  }
  for (int t = 0; t < T; ++t) {
    const float* c = p.conv_out + t * conv_dim;
    __syncthreads();  // the previous token is done with q, k and part
    float qq = 0.0f, kk = 0.0f;
    for (int i = tid; i < dk; i += blockDim.x) {
      q[i] = c[kh * dk + i];
      k[i] = c[key_dim + kh * dk + i];
      qq += q[i] * q[i];
      kk += k[i] * k[i];
    }
    qq = block_sum(qq, red);
    kk = block_sum(kk, red);
    const float qs = rsqrtf(qq + 1e-6f) * rsqrtf(static_cast<float>(dk)), ks = rsqrtf(kk + 1e-6f);
    for (int i = tid; i < dk; i += blockDim.x) {
      q[i] *= qs;
      k[i] *= ks;
    }
    const float a = p.a[int64_t(t) * p.Hv + h] + p.dt_bias[h];
    const float g = -expf(p.A_log[h]) * (a > 20.0f ? a : log1pf(expf(a)));
    const float decay = expf(g), beta = 1.0f / (1.0f + expf(-p.b[int64_t(t) * p.Hv + h]));
    __syncthreads();
    float u = 0.0f;
#pragma unroll
    for (int n = 0; n < kMaxRowsPerThread; ++n) {
      const int i = r + n * kRowGroups;
      if (i < dk) {
        s[n] *= decay;
        u += s[n] * k[i];
      }
    }
    part[r * dv + j] = u;
    __syncthreads();
    float uj = 0.0f;
    for (int rr = 0; rr < kRowGroups; ++rr) uj += part[rr * dv + j];
    const float delta = beta * (c[2 * key_dim + static_cast<int64_t>(h) * dv + j] - uj);
    float o = 0.0f;
#pragma unroll
    for (int n = 0; n < kMaxRowsPerThread; ++n) {
      const int i = r + n * kRowGroups;
      if (i < dk) {
        s[n] += k[i] * delta;
        o += s[n] * q[i];
      }
    }
    __syncthreads();
    part[r * dv + j] = o;
    __syncthreads();
    float oj = 0.0f;
    for (int rr = 0; rr < kRowGroups; ++rr) oj += part[rr * dv + j];
    const float sq = block_sum(r == 0 ? oj * oj : 0.0f, red);
    if (r == 0) {
      const float zj = p.z[t * Vd + static_cast<int64_t>(h) * dv + j];
      p.out[t * Vd + static_cast<int64_t>(h) * dv + j] = p.norm_w[j] * (oj * rsqrtf(sq / dv + p.eps)) * silu(zj);
    }
  }
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) S[i * dv + j] = s[n];
  }
}

}  // namespace

cudaError_t deltanet_prefill(const DeltaNetDecodeArgs& p, int T, cudaStream_t stream) {
  if (T < 1 || p.Hk < 1 || p.Hv % p.Hk || p.dk < 1 || p.dk > kRowGroups * kMaxRowsPerThread || p.dv < 1 ||
      p.dv * kRowGroups > 1024 || (p.dv * kRowGroups) % 32 || p.kernel < 1 || p.kernel > kMaxHist + 1)
    return cudaErrorInvalidValue;
  const int conv_dim = 2 * p.Hk * p.dk + p.Hv * p.dv;
  conv_kernel<<<(conv_dim + 255) / 256, 256, 0, stream>>>(p.qkv, p.conv_w, p.conv_state, p.conv_out, conv_dim, p.kernel, T);
  const int threads = p.dv * kRowGroups;
  const size_t smem = (2 * p.dk + kRowGroups * p.dv + threads / 32) * sizeof(float);
  delta_head_kernel<<<p.Hv, threads, smem, stream>>>(p, T);
  return cudaGetLastError();
}

cudaError_t deltanet_decode(const DeltaNetDecodeArgs& p, cudaStream_t stream) { return deltanet_prefill(p, 1, stream); }

}  // namespace tandem::gpu
