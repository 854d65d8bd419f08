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

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "gpu_core/device.cuh"
#include "gpu_core/handoff.cuh"
#include "gpu_core/int4_layout.h"
#include "gpu_core/int4_tiles.cuh"
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

// Page-locked host memory as the hybrid host's experts have it: 2 MiB aligned, huge pages advised,
// touched, then registered with CUDA (device-accessible through UVA).
struct PinnedHost {
  void* p = nullptr;
  size_t bytes = 0;
  explicit PinnedHost(size_t n) : bytes(n) {
    p = std::aligned_alloc(size_t{2} << 20, n);
    if (!p) return;
    madvise(p, n, MADV_HUGEPAGE);
    std::memset(p, 0x5a, n);
    if (cudaHostRegister(p, n, cudaHostRegisterDefault) != cudaSuccess) {
      cudaGetLastError();
      std::free(p);
      p = nullptr;
    }
  }
  ~PinnedHost() {
    if (p) cudaHostUnregister(p), std::free(p);
  }
};

// CPU threads streaming through their own buffer (plain loads) until told to stop, counting bytes:
// the host experts' reads, to see whether the link's reads and the cores' reads share one limit.
struct CpuReaders {
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bytes{0};
  std::vector<uint64_t> buf;
  explicit CpuReaders(int n, size_t total = size_t{2} << 30) : buf(total / 8, 1) {
    const size_t per = buf.size() / std::max(n, 1);
    for (int t = 0; t < n; ++t)
      threads.emplace_back([this, t, per] {
        const uint64_t* b = buf.data() + t * per;
        uint64_t sink = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          for (size_t off = 0; off < per; off += size_t{1} << 17) {  // 1 MiB pieces
            const size_t end = std::min(per, off + (size_t{1} << 17));
            uint64_t a = 0;
            for (size_t i = off; i < end; ++i) a += b[i];
            sink += a;
            bytes.fetch_add((end - off) * 8, std::memory_order_relaxed);
            if (stop.load(std::memory_order_relaxed)) break;
          }
        }
        if (sink == 42) std::abort();  // keeps the sums
      });
  }
  ~CpuReaders() {
    stop = true;
    for (auto& t : threads) t.join();
  }
};

// The link's read rate from host memory: mode 0 a kernel reading the page-locked buffer in place
// (zero copy, `blocks` blocks), mode 1 cudaMemcpyAsync of it to device memory, mode 2 nothing on the
// GPU (a 5 ms sleep: the CPU readers' rate alone). With cpu_threads > 0 that many threads stream
// through their own 2 GiB meanwhile, and cpu_GB/s is their rate over the timed iterations.
void BM_pcie_read(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  const int mode = static_cast<int>(state.range(1)), cpu_threads = static_cast<int>(state.range(2)), blocks = static_cast<int>(state.range(3));
  PinnedHost host(bytes);
  if (!host.p) return state.SkipWithError("could not page-lock the host buffer");
  void* dev = nullptr;
  unsigned* sink = nullptr;
  cudaMalloc(&sink, 4);
  if (mode == 1) cudaMalloc(&dev, bytes);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  CpuReaders readers(cpu_threads);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  double gpu_s = 0.0, wall_s = 0.0;
  uint64_t cpu_bytes = 0;
  for (auto _ : state) {
    const uint64_t b0 = readers.bytes.load();
    const auto t0 = std::chrono::steady_clock::now();
    cudaEventRecord(e0, s);
    if (mode == 0) tandem::gpu::read_host_probe(host.p, static_cast<int64_t>(bytes), sink, blocks, s);
    if (mode == 1) cudaMemcpyAsync(dev, host.p, bytes, cudaMemcpyHostToDevice, s);
    cudaEventRecord(e1, s);
    if (mode == 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    cudaEventSynchronize(e1);
    const double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    const double secs = mode == 2 ? w : ms * 1e-3;
    state.SetIterationTime(secs);
    gpu_s += secs, wall_s += w, cpu_bytes += readers.bytes.load() - b0;
  }
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("a CUDA call failed");
  if (mode != 2 && gpu_s > 0) state.counters["link_GB/s"] = static_cast<double>(bytes) * state.iterations() / gpu_s * 1e-9;
  if (cpu_threads && wall_s > 0) state.counters["cpu_GB/s"] = static_cast<double>(cpu_bytes) / wall_s * 1e-9;
  state.SetLabel(mode == 0 ? "kernel reads page-locked host memory" : mode == 1 ? "cudaMemcpyAsync host to device" : "GPU idle");
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(sink);
  if (dev) cudaFree(dev);
}

// The link experts' kernel (gpu::moe_int4_tiles_decode) at the 35B shape (hidden 2048, intermediate
// 512, groups of 128, top-8): m of a token's experts read in place from page-locked host memory (16
// experts of random codes and scales there), per call, with cpu_threads streaming their own memory
// meanwhile (as the host's experts do). link_GB/s: the experts' bytes over the call's time.
void BM_link_experts(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int m = static_cast<int>(state.range(0)), cpu_threads = static_cast<int>(state.range(1));
  constexpr int64_t H = 2048, I = 512, gs = 128, E = 16;
  constexpr int k = 8;
  const tandem::gpu::Int4TilePieces gp = tandem::gpu::int4_tile_pieces(I, H, gs), dp = tandem::gpu::int4_tile_pieces(H, I, gs);
  const size_t gate_w = gp.w, gate_s = gp.scales, down_w = dp.w, down_s = dp.scales;  // symmetric, no input order
  const size_t per_expert = 2 * (gate_w + gate_s) + down_w + down_s;
  PinnedHost host(per_expert * E);
  if (!host.p) return state.SkipWithError("could not page-lock the host buffer");
  auto* base = static_cast<uint8_t*>(host.p);
  for (size_t i = 0; i < per_expert * E; i += 2) {  // fp16 scales need finite values: 0x2000-ish everywhere
    base[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
    base[i + 1] = 0x20;
  }
  const void* dbase = tandem::gpu::host_device_pointer(host.p);
  std::vector<tandem::gpu::Int4TilesExpert> table(E);
  for (int e = 0; e < E; ++e) {
    auto* p = static_cast<const uint8_t*>(dbase) + e * per_expert;
    auto view = [&](size_t w, size_t sc) {
      tandem::gpu::Int4TilesView v;
      v.w = p, v.scales = reinterpret_cast<const uint16_t*>(p + w);
      p += w + sc;
      return v;
    };
    table[e].gate = view(gate_w, gate_s);
    table[e].up = view(gate_w, gate_s);
    table[e].down = view(down_w, down_s);
  }
  tandem::gpu::Int4TilesExpert* dtable = nullptr;
  int32_t* ids = nullptr;
  float *w = nullptr, *x = nullptr, *out = nullptr;
  void* scratch = nullptr;
  cudaMalloc(&dtable, E * sizeof(table[0]));
  cudaMemcpy(dtable, table.data(), E * sizeof(table[0]), cudaMemcpyHostToDevice);
  const std::vector<int32_t> hids = {3, 11, 5, 14, 0, 9, 7, 12};
  cudaMalloc(&ids, k * 4), cudaMalloc(&w, k * 4), cudaMalloc(&x, H * 4), cudaMalloc(&out, H * 4);
  cudaMemcpy(ids, hids.data(), k * 4, cudaMemcpyHostToDevice);
  cudaMemset(w, 0, k * 4), cudaMemset(x, 0, H * 4), cudaMemset(out, 0, H * 4);
  cudaMalloc(&scratch, tandem::gpu::moe_int4_tiles_scratch_bytes(H, I, m));
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  CpuReaders readers(cpu_threads);
  double secs = 0;
  for (auto _ : state) {
    cudaEventRecord(e0, s);
    tandem::gpu::moe_int4_tiles_decode(dtable, E, H, I, gs, ids, w, k, m, false, x, scratch, out, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    state.SetIterationTime(ms * 1e-3);
    secs += ms * 1e-3;
  }
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("a CUDA call failed");
  // bytes over the link: the m experts read in place
  if (secs > 0) state.counters["link_GB/s"] = static_cast<double>(per_expert) * m * state.iterations() / secs * 1e-9;
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  for (void* p : {(void*)dtable, (void*)ids, (void*)w, (void*)x, (void*)out, scratch}) cudaFree(p);
}

}  // namespace

BENCHMARK(BM_pcie_read)
    ->ArgNames({"MiB", "mode", "cpu_threads", "blocks"})
    ->Args({256, 0, 0, 264})
    ->Args({256, 0, 0, 528})
    ->Args({256, 0, 0, 1056})
    ->Args({16, 0, 0, 528})
    ->Args({4, 0, 0, 264})
    ->Args({256, 1, 0, 0})
    ->Args({256, 2, 15, 0})
    ->Args({256, 0, 15, 528})
    ->Args({256, 1, 15, 0})
    ->Args({256, 2, 15, 0})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_link_experts)
    ->ArgNames({"m", "cpu_threads"})
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({3, 0})
    ->Args({4, 0})
    ->Args({8, 0})
    ->Args({3, 15})
    ->Args({4, 15})
    ->UseManualTime()
    ->MinTime(0.2)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_handoff_round_trip)->Arg(0)->Arg(1)->UseManualTime()->MinTime(0.5)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
