// bench/dev/rows_gemv_shapes_dev.cu: an experiment, not on the engine's path (bench_dev_rows_gemv_shapes).
//
// Question (issue 25): the rows GEMV on tensor cores (gemv_bf16.cu's gemv_bf16_mma_kernel: MT 16-row
// tiles a block, WARPS warps over interleaved 64-input chunks) reads the dense weights of every batched,
// verification and drafting step. Stop 49 gave the matrices under 8192 rows 16 warps a block (8 kept the
// 2048-row output projections at 30% of the H100's DRAM: 13.9 -> 11.3 us at 8 tokens, B = 8 +4.9%). The
// tall ones (DeltaNet's in_proj 12352 rows, attention's q / k / v 9216, the lm_head 248320) keep two
// tiles a block of 8 warps at 120 registers, two blocks an SM: 55% of DRAM at 8 tokens (ncu). Would one
// tile a block with 16 or 32 warps (64 registers: 32 or 64 warps an SM) do better there, and 32 warps on
// the short ones? Each variant is the engine's kernel (gemv_bf16_mma.cuh) with other MT and WARPS, every
// row's arithmetic the same but for the order in which the warps' partial sums add up, so each is checked
// against the engine's launch (gpu::gemv_bf16) within 1e-6 relative L2, and bit for bit where its shape
// is the engine's. Times with CUDA events, the matrix cycled through copies that exceed the L2 (from
// HBM), at 2 / 4 / 8 tokens, beside the engine's call.
// Usage: bench_dev_rows_gemv_shapes (a CUDA device, sm_80+).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/dev/dev_util.cuh"
#include "core/dtype.h"
#include "gpu_core/gemv.cuh"
#include "gpu_core/gemv_bf16_mma.cuh"

namespace {

using namespace tandem::gpu;
using namespace tandem::gpu::detail;
using namespace tandem::dev;

template <int MT, int WARPS>
void run(const uint16_t* W, int64_t N, int64_t K, const float* x, int T, float* y) {
  gemv_bf16_mma_kernel<MT, false, WARPS><<<static_cast<unsigned>((N + 16 * MT - 1) / (16 * MT)), WARPS * 32>>>(W, N, K, x, nullptr, T,
                                                                                                       RowsOut::one(y, N));
}

struct Variant {
  const char* name;
  int mt, warps;
  void (*fn)(const uint16_t*, int64_t, int64_t, const float*, int, float*);
};

}  // namespace

int main() {
  std::mt19937 rng(49);
  const Variant variants[] = {{"2x8", 2, 8, run<2, 8>},    {"1x8", 1, 8, run<1, 8>},   {"1x16", 1, 16, run<1, 16>},
                              {"2x16", 2, 16, run<2, 16>}, {"1x32", 1, 32, run<1, 32>}};
  struct Shape {
    const char* what;
    int64_t N, K;
  };
  const Shape shapes[] = {{"DeltaNet in_proj", 12352, 2048}, {"attention q/k/v", 9216, 2048}, {"8192 rows", 8192, 2048},
                          {"output projections", 2048, 4096}, {"router + shared x_proj", 1281, 2048}, {"lm_head", 248320, 2048}};
  std::printf("rows GEMV on tensor cores, us a call (TB/s), weights from HBM; variants MT x WARPS; checks against the engine's launch\n");
  std::printf("%-24s %3s %14s", "matrix", "T", "engine");
  for (const Variant& v : variants) std::printf(" %14s", v.name);
  std::printf(" | checks\n");
  for (const Shape& s : shapes) {
    const int64_t bytes = s.N * s.K * 2;
    const int copies = static_cast<int>(std::max<int64_t>(1, (256ll << 20) / bytes + 1));  // more than the L2
    uint16_t* W = nullptr;
    DEV_CK(cudaMalloc(&W, bytes * copies));
    {
      std::vector<uint16_t> host(static_cast<size_t>(s.N * s.K));
      std::normal_distribution<float> nd(0.0f, 0.05f);
      for (auto& v : host) v = tandem::f32_to_bf16(nd(rng));
      for (int c = 0; c < copies; ++c) DEV_CK(cudaMemcpy(W + c * s.N * s.K, host.data(), bytes, cudaMemcpyHostToDevice));
    }
    for (int T : {2, 4, 8}) {
      std::vector<float> hx(static_cast<size_t>(T * s.K));
      std::normal_distribution<float> nx(0.0f, 1.0f);
      for (auto& v : hx) v = nx(rng);
      float *x = nullptr, *y = nullptr, *y2 = nullptr;
      DEV_CK(cudaMalloc(&x, hx.size() * 4));
      DEV_CK(cudaMalloc(&y, T * s.N * 4));
      DEV_CK(cudaMalloc(&y2, T * s.N * 4));
      DEV_CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
      DEV_CK(gemv_bf16(W, s.N, s.K, x, T, y, nullptr));
      DEV_CK(cudaDeviceSynchronize());
      std::vector<float> want(static_cast<size_t>(T * s.N)), got(want.size());
      DEV_CK(cudaMemcpy(want.data(), y, want.size() * 4, cudaMemcpyDeviceToHost));
      const int engine_mt = s.N >= 8192 ? 2 : 1, engine_warps = s.N >= 8192 ? 8 : 16;  // launch_mma's choice
      std::string checks;
      for (const Variant& v : variants) {
        v.fn(W, s.N, s.K, x, T, y2);
        DEV_CK(cudaDeviceSynchronize());
        DEV_CK(cudaMemcpy(got.data(), y2, got.size() * 4, cudaMemcpyDeviceToHost));
        double d = 0, n = 0;
        for (size_t i = 0; i < got.size(); ++i) d += (got[i] - want[i]) * double(got[i] - want[i]), n += want[i] * double(want[i]);
        const double rel = std::sqrt(d / n);
        const bool same = std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
        const bool engine_shape = v.mt == engine_mt && v.warps == engine_warps;
        const bool ok = engine_shape ? same : rel <= 1e-6;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s %s%s ", v.name, ok ? "ok" : "DIFFERS", same ? "" : (rel > 0 ? "~" : ""));
        checks += buf;
      }
      const int reps = std::max(20, static_cast<int>(400ll * 8192 * 2048 / (s.N * s.K)));
      auto w_at = [&](int i) { return W + static_cast<int64_t>(i % copies) * s.N * s.K; };
      const float te = time_us([&](int i) { DEV_CK(gemv_bf16(w_at(i), s.N, s.K, x, T, y, nullptr)); }, reps);
      std::printf("%-24s %3d %7.1f (%4.2f)", s.what, T, te, bytes / te * 1e-6);
      for (const Variant& v : variants) {
        const float t = time_us([&](int i) { v.fn(w_at(i), s.N, s.K, x, T, y2); }, reps);
        std::printf(" %7.1f (%4.2f)", t, bytes / t * 1e-6);
      }
      DEV_CK(cudaGetLastError());
      std::printf(" | %s\n", checks.c_str());
      cudaFree(x), cudaFree(y), cudaFree(y2);
    }
    cudaFree(W);
  }
  return 0;
}
