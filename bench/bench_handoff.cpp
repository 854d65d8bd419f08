// The hybrid decode step's GPU -> host -> GPU handoff, one MoE layer's worth (x: 2048 floats, top-8),
// timed per round trip with nothing computed on the host in between (the handoff's own cost):
//  variant 0, one graph (the default hybrid step, gpu_core/handoff.cuh): a captured graph of 40 round
//    trips, each a post kernel (x, ids, weights into mapped host memory, then a flag) and a kernel that
//    waits for the host's flag and adds the host's row from host memory; the host spins on the GPU's
//    flag and sets its own.
//  variant 1, event + copies (the eager hybrid step's shape): a kernel, the three device-to-host copies,
//    an event the host spins on, then a host-to-device copy and an add kernel.
// The yardsticks on this machine: ~9 µs kernel + stream sync, ~20 µs spin-flag round trip, ~31
// µs host-function chain.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "gpu_core/handoff.cuh"
#include "gpu_core/ops.cuh"

namespace {

constexpr int kH = 2048, kK = 8, kRounds = 40;

bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Buffers {
  float *x = nullptr, *w = nullptr, *dst = nullptr, *cpu_dev = nullptr;  // device
  int32_t* ids = nullptr;
  float *hx = nullptr, *hw = nullptr, *hout = nullptr;  // mapped host
  int32_t* hids = nullptr;
  unsigned* flags = nullptr;  // [0] GPU -> host, [1] host -> GPU, [2] error
  cudaStream_t s = nullptr;
  Buffers() {
    cudaMalloc(&x, kH * 4), cudaMalloc(&w, kK * 4), cudaMalloc(&dst, kH * 4), cudaMalloc(&cpu_dev, kH * 4), cudaMalloc(&ids, kK * 4);
    cudaMemset(x, 0, kH * 4), cudaMemset(w, 0, kK * 4), cudaMemset(dst, 0, kH * 4), cudaMemset(ids, 0, kK * 4);
    cudaHostAlloc(reinterpret_cast<void**>(&hx), kH * 4, cudaHostAllocMapped);
    cudaHostAlloc(reinterpret_cast<void**>(&hw), kK * 4, cudaHostAllocMapped);
    cudaHostAlloc(reinterpret_cast<void**>(&hout), kH * 4, cudaHostAllocMapped);
    cudaHostAlloc(reinterpret_cast<void**>(&hids), kK * 4, cudaHostAllocMapped);
    cudaHostAlloc(reinterpret_cast<void**>(&flags), 4 * 4, cudaHostAllocMapped);
    for (int i = 0; i < kH; ++i) hout[i] = 0.0f;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~Buffers() {
    cudaStreamDestroy(s);
    for (void* p : {(void*)x, (void*)w, (void*)dst, (void*)cpu_dev, (void*)ids}) cudaFree(p);
    for (void* p : {(void*)hx, (void*)hw, (void*)hout, (void*)hids, (void*)flags}) cudaFreeHost(p);
  }
};

void BM_handoff_round_trip(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int variant = static_cast<int>(state.range(0));
  Buffers b;
  volatile unsigned* f = b.flags;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t routed = nullptr;
  if (variant == 0) {
    cudaGraph_t g = nullptr;
    cudaStreamBeginCapture(b.s, cudaStreamCaptureModeThreadLocal);
    for (unsigned r = 1; r <= kRounds; ++r) {
      tandem::gpu::host_post(b.x, kH, b.ids, b.w, kK, b.hx, b.hids, b.hw, b.flags + 0, r, b.s);
      tandem::gpu::host_wait_add(b.flags + 1, r, b.hout, b.dst, kH, b.flags + 2, 10'000'000'000, b.s);
    }
    cudaStreamEndCapture(b.s, &g);
    cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
  } else {
    cudaEventCreateWithFlags(&routed, cudaEventDisableTiming);
  }
  bool stuck = false;
  double total_s = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    if (variant == 0) {
      for (int i = 0; i < 3; ++i) f[i] = 0u;
      cudaGraphLaunch(exec, b.s);
      for (unsigned r = 1; r <= kRounds && !stuck; ++r) {
        const auto w0 = std::chrono::steady_clock::now();
        while (f[0] < r)
          if (std::chrono::steady_clock::now() - w0 > std::chrono::seconds(5)) {
            stuck = true;
            break;
          }
        std::atomic_thread_fence(std::memory_order_acq_rel);
        f[1] = r;
      }
      if (stuck) f[1] = ~0u;
    } else {
      for (int r = 0; r < kRounds; ++r) {
        tandem::gpu::add_inplace(b.x, b.dst, kH, b.s);  // the router's kernel
        cudaMemcpyAsync(b.hx, b.x, kH * 4, cudaMemcpyDeviceToHost, b.s);
        cudaMemcpyAsync(b.hids, b.ids, kK * 4, cudaMemcpyDeviceToHost, b.s);
        cudaMemcpyAsync(b.hw, b.w, kK * 4, cudaMemcpyDeviceToHost, b.s);
        cudaEventRecord(routed, b.s);
        while (cudaEventQuery(routed) == cudaErrorNotReady) {
        }
        cudaMemcpyAsync(b.cpu_dev, b.hout, kH * 4, cudaMemcpyHostToDevice, b.s);
        tandem::gpu::add_inplace(b.dst, b.cpu_dev, kH, b.s);
      }
    }
    cudaStreamSynchronize(b.s);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(secs);  // one iteration is kRounds round trips; the counter divides
    total_s += secs;
    if (stuck) {
      state.SkipWithError("the GPU never posted: the handoff kernels did not run");
      break;
    }
  }
  if (!stuck && b.flags[2]) state.SkipWithError("a wait kernel gave up");
  // Per round trip: the manual time over the round trips run (an iteration holds kRounds of them).
  if (state.iterations() > 0)
    state.counters["us_per_round_trip"] = total_s * 1e6 / (static_cast<double>(state.iterations()) * kRounds);
  state.SetLabel(variant == 0 ? "one graph: post kernel, host flag spin, wait+add kernel" : "kernel, 3 D2H copies, event spin, H2D copy, add");
  if (exec) cudaGraphExecDestroy(exec);
  if (routed) cudaEventDestroy(routed);
}

}  // namespace

BENCHMARK(BM_handoff_round_trip)->Arg(0)->Arg(1)->UseManualTime()->MinTime(0.5)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
