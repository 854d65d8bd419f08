// bench/dev/gemv_rows8_dev.cu: an experiment, not on the engine's path (bench_dev_gemv_rows8).
//
// Question: what holds the int8 decode GEMV (gpu::gemv_rows8) below the bf16 one (issue 28: int8 dense
// decode 0.83x bf16 on the H200; an int8 lm_head no faster than the bf16 one)? Two suspects, from the
// decode MoE kernel's profile (bench/results/2026-12-05-stop44-h100-moe-layout-rollback.md):
//   - the conversion: a code becomes a float by I2F, a quarter-rate pipe on sm_90 (16 a clock an SM):
//     ~3.7 T codes/s on an H100, about its copy bandwidth. The magic-number form (the byte, its sign
//     bit flipped, under the exponent of 2^23 by one PRMT, then 2^23 + 128 subtracted: exact) uses
//     full-rate pipes;
//   - the activations: a lane takes 16 consecutive codes, so its 64 bytes of fp32 x are 64 B from its
//     neighbour's: each 16-byte load spans 16 cache lines instead of 4. With the codes of each 512-input
//     block permuted on load (lane l's 16 codes are the inputs 4 l + 128 m + e, m, e < 4) each load is
//     contiguous across the lanes.
// Variants: 0 = gpu::gemv_rows8 as on main; 1 = magic conversion; 2 = permuted codes; 3 = both.
// Checks: variant 1 equals variant 0 bit for bit (same products, same order); variants 2 and 3 (another
// summation order) against a double reference, relative L2 below 1e-5. Prints µs a call and GB/s per
// shape and token count, the weights read from HBM (copies cycled past the L2).
// Usage: bench_dev_gemv_rows8 (a CUDA device); when one variant wins, it replaces gemv_rows8's path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/dev/dev_util.cuh"
#include "gpu_core/block_reduce.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/int4_row.cuh"

namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kMaxT = 8;



template <bool kMagic>
__device__ __forceinline__ void codes4(int w, float* f) {
  if constexpr (kMagic) {
    const unsigned u = static_cast<unsigned>(w) ^ 0x80808080u;  // b + 128, unsigned
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7540u + i)) - 8388736.0f;  // 2^23 + 128
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = static_cast<float>(static_cast<int8_t>((w >> (8 * i)) & 0xff));
  }
}

template <bool kMagic, bool kPermuted, int TMAX>
__global__ void rows8_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales, int64_t N, int64_t K,
                             const float* __restrict__ x, int T, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  float acc[TMAX];
#pragma unroll
  for (int t = 0; t < TMAX; ++t) acc[t] = 0.0f;
  const uint4* w = reinterpret_cast<const uint4*>(q + row * K);
  for (int64_t c = lane; c < K / 16; c += 32) {
    const uint4 v = tandem::gpu::detail::load_stream(w + c);  // weights are read once: not into L1
    float wf[16];
    codes4<kMagic>(static_cast<int>(v.x), wf), codes4<kMagic>(static_cast<int>(v.y), wf + 4);
    codes4<kMagic>(static_cast<int>(v.z), wf + 8), codes4<kMagic>(static_cast<int>(v.w), wf + 12);
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      if (t >= T) break;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // natural: inputs 16 c + 4 i ..; permuted: block c / 32, inputs 4 (c % 32) + 128 i ..
        const float* xp = kPermuted ? x + t * K + (c / 32) * 512 + 128 * i + 4 * (c % 32) : x + t * K + c * 16 + 4 * i;
        const float4 a = __ldg(reinterpret_cast<const float4*>(xp));
        acc[t] += wf[4 * i] * a.x + wf[4 * i + 1] * a.y + wf[4 * i + 2] * a.z + wf[4 * i + 3] * a.w;
      }
    }
  }
  tandem::gpu::detail::warp_store_row<TMAX>(acc, T, scales[row], lane, [&](int t) { return y + t * N + row; });
}

template <bool kMagic, bool kPermuted>
void launch(const uint8_t* q, const float* s, int64_t N, int64_t K, const float* x, int T, float* y) {
  const dim3 grid(static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock)), block(32 * kRowsPerBlock);
  if (T == 1) rows8_kernel<kMagic, kPermuted, 1><<<grid, block>>>(q, s, N, K, x, T, y);
  else rows8_kernel<kMagic, kPermuted, kMaxT><<<grid, block>>>(q, s, N, K, x, T, y);
}

void run_variant(int v, const uint8_t* q, const uint8_t* qp, const float* s, int64_t N, int64_t K, const float* x, int T, float* y) {
  switch (v) {
    case 0: DEV_CK(tandem::gpu::gemv_rows8({q, s, N, K, tandem::RowFormat::Int8}, x, T, y, nullptr)); break;
    case 1: launch<true, false>(q, s, N, K, x, T, y); break;
    case 2: launch<false, true>(qp, s, N, K, x, T, y); break;
    default: launch<true, true>(qp, s, N, K, x, T, y);
  }
}

// Row-major codes [N, K] -> the permuted layout (K a multiple of 512).
std::vector<uint8_t> permute(const std::vector<uint8_t>& q, int64_t N, int64_t K) {
  std::vector<uint8_t> p(q.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K; b += 512)
      for (int l = 0; l < 32; ++l)
        for (int m = 0; m < 4; ++m)
          for (int e = 0; e < 4; ++e) p[n * K + b + 16 * l + 4 * m + e] = q[n * K + b + 4 * l + 128 * m + e];
  return p;
}

struct Shape {
  const char* name;
  int64_t N, K;
};

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (!tandem::dev::find_device("bench_dev_gemv_rows8", &prop)) return 0;
  std::printf("%s; int8 rows x fp32 activations, weights from HBM; us a call (GB/s of codes and scales)\n", prop.name);
  std::printf("%-30s %2s  %18s %18s %18s %18s   checks\n", "shape", "T", "0 main", "1 magic", "2 permuted", "3 both");
  const Shape shapes[] = {{"lm_head 248320 x 2048", 248320, 2048}, {"stacked input 12352 x 2048", 12352, 2048},
                          {"out_proj 2048 x 4096", 2048, 4096}, {"shared down 2048 x 512", 2048, 512}};
  std::mt19937 rng(5);
  for (const Shape& sh : shapes) {
    const int64_t N = sh.N, K = sh.K, bytes = N * K + N * 4;
    const int copies = static_cast<int>(std::max<int64_t>(1, (256ll << 20) / bytes + 1));  // past the L2
    std::vector<uint8_t> q(N * K);
    for (auto& b : q) b = static_cast<uint8_t>(rng());
    const std::vector<uint8_t> qp = permute(q, N, K);
    std::vector<float> s(N), x(kMaxT * K);
    for (auto& v : s) v = std::uniform_real_distribution<float>(0.001f, 0.01f)(rng);
    for (auto& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    uint8_t *dq, *dqp;
    float *ds, *dx, *dy;
    DEV_CK(cudaMalloc(&dq, copies * N * K));
    DEV_CK(cudaMalloc(&dqp, copies * N * K));
    DEV_CK(cudaMalloc(&ds, N * 4));
    DEV_CK(cudaMalloc(&dx, kMaxT * K * 4));
    DEV_CK(cudaMalloc(&dy, kMaxT * N * 4));
    for (int c = 0; c < copies; ++c) {
      DEV_CK(cudaMemcpy(dq + c * N * K, q.data(), N * K, cudaMemcpyHostToDevice));
      DEV_CK(cudaMemcpy(dqp + c * N * K, qp.data(), N * K, cudaMemcpyHostToDevice));
    }
    DEV_CK(cudaMemcpy(ds, s.data(), N * 4, cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(dx, x.data(), kMaxT * K * 4, cudaMemcpyHostToDevice));
    for (int T : {1, 4}) {
      // the double reference (rows sampled for the largest shape) and variant 0's output
      std::vector<float> y0(T * N), yv(T * N);
      run_variant(0, dq, dqp, ds, N, K, dx, T, dy);
      DEV_CK(cudaMemcpy(y0.data(), dy, T * N * 4, cudaMemcpyDeviceToHost));
      char checks[256] = "";
      double us[4];
      for (int v = 0; v < 4; ++v) {
        run_variant(v, dq, dqp, ds, N, K, dx, T, dy);
        DEV_CK(cudaDeviceSynchronize());
        DEV_CK(cudaMemcpy(yv.data(), dy, T * N * 4, cudaMemcpyDeviceToHost));
        if (v == 1) {
          std::strcat(checks, std::memcmp(yv.data(), y0.data(), T * N * 4) == 0 ? "1=0 bitwise " : "1!=0 DIFFER ");
        } else if (v >= 2) {
          double num = 0, den = 0;
          for (int t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; n += (N > 100000 ? 97 : 1)) {
              double ref = 0;
              for (int64_t k = 0; k < K; ++k) ref += double(static_cast<int8_t>(q[n * K + k])) * x[t * K + k];
              ref *= s[n];
              num += (yv[t * N + n] - ref) * (yv[t * N + n] - ref), den += ref * ref;
            }
          const double rel = std::sqrt(num / den);
          char buf[64];
          std::snprintf(buf, sizeof buf, "%d:%.1e%s ", v, rel, rel < 1e-5 ? "" : " FAIL");
          std::strcat(checks, buf);
        }
        // time: 20 warm-up calls, then 200 cycling over the copies
        us[v] = tandem::dev::time_us(
            [&](int i) { run_variant(v, dq + (i % copies) * N * K, dqp + (i % copies) * N * K, ds, N, K, dx, T, dy); }, 20, 200);
      }
      std::printf("%-30s %2d ", sh.name, T);
      for (double u : us) std::printf(" %8.1f (%6.0f)", u, bytes / u / 1e3);
      std::printf("   %s\n", checks);
    }
    cudaFree(dq), cudaFree(dqp), cudaFree(ds), cudaFree(dx), cudaFree(dy);
  }
  return 0;
}
