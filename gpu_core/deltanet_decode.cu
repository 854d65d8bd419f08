// gpu_core/deltanet_decode.cu: fused Gated DeltaNet decode step (see deltanet.cuh).
#include <cuda_runtime.h>

#include "gpu_core/deltanet.cuh"

namespace tandem::gpu {

namespace {

constexpr int kRowGroups = 4;     // threads per state column; each owns dk / kRowGroups rows
constexpr int kMaxRowsPerThread = 32;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void conv_step_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ window,
                                 float* __restrict__ y, int channels, int kernel) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= channels) return;
  const int hist = kernel - 1;
  const float xc = x[ch];
  float acc = w[ch * kernel + hist] * xc;
  for (int j = 0; j < hist; ++j) acc += w[ch * kernel + j] * window[j * channels + ch];
  y[ch] = silu(acc);
  for (int j = 0; j + 1 < hist; ++j) window[j * channels + ch] = window[(j + 1) * channels + ch];
  if (hist > 0) window[(hist - 1) * channels + ch] = xc;
}

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

// Thread (r, j): column j of the value dimension, rows r, r + R, r + 2R, ... of the key dimension.
__global__ void delta_head_kernel(DeltaNetDecodeArgs p) {
  extern __shared__ float smem[];
  const int dk = p.dk, dv = p.dv, h = blockIdx.x, kh = h / (p.Hv / p.Hk);
  float* q = smem;                 // [dk]
  float* k = q + dk;               // [dk]
  float* part = k + dk;            // [kRowGroups][dv] partial sums
  float* red = part + kRowGroups * dv;  // [blockDim/32]
  const int tid = threadIdx.x, j = tid % dv, r = tid / dv;
  const int64_t key_dim = static_cast<int64_t>(p.Hk) * dk;
  const float* c = p.conv_out;

  // q and k of this head, L2-normalised (q also scaled by dk^-0.5), as runtime/ops_ref does.
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
  const float a = p.a[h] + p.dt_bias[h];
  const float g = -expf(p.A_log[h]) * (a > 20.0f ? a : log1pf(expf(a)));
  const float decay = expf(g), beta = 1.0f / (1.0f + expf(-p.b[h]));
  __syncthreads();

  float* S = p.state + static_cast<int64_t>(h) * dk * dv;
  float s[kMaxRowsPerThread];
  float u = 0.0f;
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) {
      s[n] = S[i * dv + j] * decay;
      u += s[n] * k[i];
    }
  }
  part[r * dv + j] = u;
  __syncthreads();
  float uj = 0.0f;
  for (int rr = 0; rr < kRowGroups; ++rr) uj += part[rr * dv + j];
  const float v = c[2 * key_dim + static_cast<int64_t>(h) * dv + j];
  const float delta = beta * (v - uj);
  float o = 0.0f;
#pragma unroll
  for (int n = 0; n < kMaxRowsPerThread; ++n) {
    const int i = r + n * kRowGroups;
    if (i < dk) {
      s[n] += k[i] * delta;
      S[i * dv + j] = s[n];
      o += s[n] * q[i];
    }
  }
  __syncthreads();  // everyone has read part[] for u
  part[r * dv + j] = o;
  __syncthreads();
  float oj = 0.0f;
  for (int rr = 0; rr < kRowGroups; ++rr) oj += part[rr * dv + j];
  // Gated RMSNorm over the head's dv outputs (threads with r == 0 hold one each).
  const float sq = block_sum(r == 0 ? oj * oj : 0.0f, red);
  if (r == 0) {
    const float zj = p.z[static_cast<int64_t>(h) * dv + j];
    p.out[static_cast<int64_t>(h) * dv + j] = p.norm_w[j] * (oj * rsqrtf(sq / dv + p.eps)) * silu(zj);
  }
}

}  // namespace

cudaError_t deltanet_decode(const DeltaNetDecodeArgs& p, cudaStream_t stream) {
  if (p.Hk < 1 || p.Hv % p.Hk || p.dk < 1 || p.dk > kRowGroups * kMaxRowsPerThread || p.dv < 1 ||
      p.dv * kRowGroups > 1024 || (p.dv * kRowGroups) % 32 || p.kernel < 1 || p.kernel > 8)
    return cudaErrorInvalidValue;
  const int conv_dim = 2 * p.Hk * p.dk + p.Hv * p.dv;
  conv_step_kernel<<<(conv_dim + 255) / 256, 256, 0, stream>>>(p.qkv, p.conv_w, p.conv_state, p.conv_out, conv_dim,
                                                               p.kernel);
  const int threads = p.dv * kRowGroups;
  const size_t smem = (2 * p.dk + kRowGroups * p.dv + threads / 32) * sizeof(float);
  delta_head_kernel<<<p.Hv, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
