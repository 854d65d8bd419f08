// GPU GEMV at the 35B model's real shapes: achieved bandwidth (weight bytes / kernel time) against the
// device copy bandwidth measured in this binary (cudaMemcpy device-to-device: read + write bytes).
// Kernel times from CUDA events over 50 back-to-back launches per iteration (launch overhead amortised; decode
// runs as a CUDA graph).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "gpu_core/attention.cuh"
#include "gpu_core/device.cuh"
#include "gpu_core/gemm.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/int4_layout.h"
#include "gpu_core/moe.cuh"
#include "gpu_core/ops.cuh"
#include "gpu_core/deltanet.cuh"

namespace {

bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

double copy_bandwidth() {
  static double bw = [] {
    const size_t bytes = 1ull << 30;
    void *a = nullptr, *b = nullptr;
    cudaMalloc(&a, bytes);
    cudaMalloc(&b, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    float best = 1e30f;
    for (int i = 0; i < 10; ++i) {
      cudaEventRecord(e0);
      cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      best = std::min(best, ms);
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes / (best * 1e-3);
  }();
  return bw;
}

template <typename Launch>
void time_kernel(benchmark::State& state, double bytes, Launch&& launch) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  constexpr int kInner = 50;
  for (int i = 0; i < 5; ++i) launch();
  // A launch that failed (bad arguments, too many resources) must not be timed as a fast kernel.
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return state.SkipWithError(cudaGetErrorString(err));
  }
  for (auto _ : state) {
    cudaEventRecord(e0);
    for (int i = 0; i < kInner; ++i) launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    // One iteration = kInner launches, so Google Benchmark's time budget is real time, not 1/kInner of it.
    state.SetIterationTime(ms * 1e-3);
  }
  const double bw = copy_bandwidth();
  state.counters["GB/s"] =
      benchmark::Counter(bytes * kInner * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["us_per_call"] =
      benchmark::Counter(state.iterations() * kInner / 1e6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["copy_GB/s"] = bw / 1e9;
  state.counters["bytes"] = bytes;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// Args: N, K, tokens, copies of the matrix cycled launch by launch (1: the same one, which a 50 MB L2
// partly holds for the model's projections; 8: each launch reads its matrix from HBM, as in the model).
void BM_gemv_bf16(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int64_t N = state.range(0), K = state.range(1), copies = state.range(3);
  const int T = static_cast<int>(state.range(2));
  uint16_t* W;
  float *x, *y;
  cudaMalloc(&W, copies * N * K * 2);
  cudaMalloc(&x, T * K * 4);
  cudaMalloc(&y, T * N * 4);
  cudaMemset(W, 0x3c, copies * N * K * 2);
  cudaMemset(x, 0, T * K * 4);
  int64_t launch = 0;
  time_kernel(state, double(N * K * 2), [&] { tandem::gpu::gemv_bf16(W + (launch++ % copies) * N * K, N, K, x, T, y, nullptr); });
  state.SetLabel(copies > 1 ? "from HBM" : "same matrix");
  cudaFree(W);
  cudaFree(x);
  cudaFree(y);
}

// The same with 8-bit weights and a scale per row (W8A16, gemv_rows8), int8 (range(4) 1) or fp8 (2):
// half gemv_bf16's bytes.
void BM_gemv_rows8(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int64_t N = state.range(0), K = state.range(1), copies = state.range(3);
  const int T = static_cast<int>(state.range(2));
  const auto f = static_cast<tandem::RowFormat>(state.range(4));
  uint8_t* W;
  float *s, *x, *y;
  cudaMalloc(&W, copies * N * K);
  cudaMalloc(&s, copies * N * 4);
  cudaMalloc(&x, T * K * 4);
  cudaMalloc(&y, T * N * 4);
  cudaMemset(W, 0x11, copies * N * K);
  cudaMemset(s, 0, copies * N * 4);
  cudaMemset(x, 0, T * K * 4);
  int64_t launch = 0;
  time_kernel(state, double(N * K + N * 4), [&] {
    const int64_t c = launch++ % copies;
    tandem::gpu::gemv_rows8({W + c * N * K, s + c * N, N, K, f}, x, T, y, nullptr);
  });
  state.SetLabel(std::string(tandem::row_format_name(f)) + (copies > 1 ? ", from HBM" : ", same matrix"));
  cudaFree(W);
  cudaFree(s);
  cudaFree(x);
  cudaFree(y);
}

// The one-token router stack (gemv_bf16_router_topk_norm: the residual add and norm, the router's GEMV
// and the top-k in its last block, one launch) at the 35B's shapes. Form 0: bf16 dense, the router's 256
// rows, the shared expert's gate and up (512 + 512) and its gate logit's row stacked (x_proj, 5.2 MB).
// Form 1: int8 dense, the router and the gate logit's row in bf16 (router_gate, 1.1 MB) with the shared
// gate and up as 8-bit rows in the same launch (w8, 2.1 MB). Form 2: form 1 without the 8-bit rows.
// Bytes: the weights'. copies: weight sets in rotation (32: each launch reads its weights from HBM).
// pdl 1: launched as the decode graph launches it (programmatic dependent launch, sm_90 and later):
// each launch may start, and load its weights, while the one before it finishes.
void BM_router_stack(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  namespace g = tandem::gpu;
  if (state.range(2) && g::gpu_device_caps().cc_major < 9) return state.SkipWithError("programmatic dependent launch needs sm_90");
  const g::ProgrammaticLaunchScope programmatic(state.range(2) != 0);
  const int form = static_cast<int>(state.range(0));
  const int64_t copies = state.range(1), H = 2048, E = 256, S = 1024, I = 512;
  const int k = 8;
  const int64_t nb = form == 0 ? E + 1 + S : E + 1, n8 = form == 1 ? S : 0;  // bf16 rows, 8-bit rows
  uint16_t* W;
  uint8_t *W8, *ws;
  float *s8, *v, *y, *wts;
  int32_t* ids;
  unsigned* counter;
  cudaMalloc(&W, copies * nb * H * 2);
  cudaMalloc(&W8, std::max<int64_t>(1, copies * n8 * H));
  cudaMalloc(&s8, std::max<int64_t>(1, copies * n8) * 4);
  cudaMalloc(&v, (5 * H + 1) * 4);  // h, a, shared, norm weights, x, gate
  cudaMalloc(&y, (nb + n8) * 4);
  cudaMalloc(&wts, k * 4);
  cudaMalloc(&ids, k * 4);
  cudaMalloc(&counter, 4);
  const size_t ws_bytes = g::moe_int4_wide_workspace(1, k, H, I);
  cudaMalloc(&ws, ws_bytes);
  cudaMemset(W, 0x11, copies * nb * H * 2);
  cudaMemset(W8, 0x11, std::max<int64_t>(1, copies * n8 * H));
  cudaMemset(s8, 0, std::max<int64_t>(1, copies * n8) * 4);
  cudaMemset(v, 0, (5 * H + 1) * 4);
  cudaMemset(counter, 0, 4);
  float *h = v, *a = v + H, *sh = v + 2 * H, *nw = v + 3 * H, *x = v + 4 * H, *gate = v + 5 * H;
  const g::QuantX qx = g::wide_moe_x(ws, 1, k, H, I);
  g::RowsOut out = g::RowsOut::one(y, nb);
  if (form != 0) {
    out.dst[1] = y + E, out.end[0] = E, out.end[1] = E + 1, out.parts = 2;
    if (n8) out.dst[2] = y + E + 1, out.end[2] = E + 1 + n8, out.parts = 3;
  }
  int64_t launch = 0;
  const auto run = [&] {
    const int64_t c = launch++ % copies;
    const g::Rows8View w8{W8 + c * n8 * H, s8 + c * n8, n8, H, tandem::RowFormat::Int8};
    return g::gemv_bf16_router_topk_norm(W + c * nb * H, nb, H, h, a, sh, gate, nw, 1e-6f, x, out, static_cast<int>(E), k, counter, ids,
                                         wts, nullptr, nullptr, qx, n8 ? &w8 : nullptr);
  };
  if (const cudaError_t err = run(); err != cudaSuccess) {
    state.SkipWithError(cudaGetErrorString(err));
  } else {
    time_kernel(state, double(nb * H * 2 + n8 * (H + 4)), [&] { run(); });
    state.SetLabel(std::string(form == 0 ? "bf16 stack" : form == 1 ? "bf16 router + int8 shared rows" : "bf16 router alone") +
                   (copies > 1 ? ", from HBM" : ", same matrix") + (state.range(2) ? ", PDL" : ""));
  }
  for (void* p : {static_cast<void*>(W), static_cast<void*>(W8), static_cast<void*>(s8), static_cast<void*>(v), static_cast<void*>(y),
                  static_cast<void*>(wts), static_cast<void*>(ids), static_cast<void*>(counter), static_cast<void*>(ws)})
    cudaFree(p);
}

// A prompt chunk's 8-bit projection (gemm_rows8: codes to bf16, the split-bf16 cuBLAS GEMM, the row
// scales), against BM_gemm_bf16 at the same N, K, T: what reading codes instead of bf16 costs in prefill.
void BM_gemm_rows8(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int64_t N = state.range(0), K = state.range(1), T = state.range(2);
  const auto f = static_cast<tandem::RowFormat>(state.range(3));
  uint8_t* W;
  uint16_t *split, *codes;
  float *s, *x, *y;
  cudaMalloc(&W, N * K);
  cudaMalloc(&s, N * 4);
  cudaMalloc(&codes, N * K * 2);
  cudaMalloc(&split, 2 * T * K * 2);
  cudaMalloc(&x, T * K * 4);
  cudaMalloc(&y, T * N * 4);
  cudaMemset(W, 0x11, N * K);
  cudaMemset(s, 0, N * 4);
  cudaMemset(x, 0, T * K * 4);
  tandem::gpu::BlasHandle h = nullptr;
  tandem::gpu::blas_create(&h);
  time_kernel(state, double(N * K + N * 4), [&] { tandem::gpu::gemm_rows8(h, {W, s, N, K, f}, x, T, split, codes, y, nullptr); });
  state.counters["TFLOPS"] = benchmark::Counter(2.0 * N * K * T * 50 * state.iterations() / 1e12, benchmark::Counter::kIsRate);
  state.counters["tokens/s_this_matrix"] = benchmark::Counter(double(T) * 50 * state.iterations(), benchmark::Counter::kIsRate);
  state.SetLabel(tandem::row_format_name(f));
  tandem::gpu::blas_destroy(h);
  for (void* p : {static_cast<void*>(W), static_cast<void*>(s), static_cast<void*>(codes), static_cast<void*>(split), static_cast<void*>(x),
                  static_cast<void*>(y)})
    cudaFree(p);
}

// Sequence slots for launches of B sequences whose state is cycled over `copies` sets: ids 0 ..
// copies * B - 1 on the device; each launch takes the next set's B, so successive launches read other
// sequences' state from HBM, as successive layers of a model step do.
struct CycledSlots {
  int B, copies, launch = 0;
  int32_t* ids = nullptr;
  CycledSlots(int B_, int copies_) : B(B_), copies(copies_) {
    std::vector<int32_t> h(static_cast<size_t>(B) * copies);
    std::iota(h.begin(), h.end(), 0);
    cudaMalloc(&ids, h.size() * 4);
    cudaMemcpy(ids, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  }
  ~CycledSlots() { cudaFree(ids); }
  CycledSlots(const CycledSlots&) = delete;
  CycledSlots& operator=(const CycledSlots&) = delete;
  const int32_t* next() { return ids + (launch++ % copies) * B; }
};

// Attention decode at the 35B shape (16 query / 2 KV heads x 256, rotary 64) for B sequences, one token
// each, every one after `ctx` cached rows (args: ctx, KV format 0 bf16 / 1 int8 / 2 fp8, B, cache rows),
// the grid sized for caches of ctx + 144 rows (the e2e runs' 4096 + 144) or of the rows given (a
// configured context longer than the conversation): prepare + attend + combine (a scoring
// block per KV head takes its group's 8 query heads); bytes = the K and V rows read (gpu::kv_row_bytes
// each, once). The caches of 16 / B steps are cycled (16 sequences' worth), so that each launch reads
// them from HBM as a model step does.
void BM_attention_decode(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int ctx = static_cast<int>(state.range(0)), nh = 16, nkv = 2, hd = 256, rot = 64;
  const int max_ctx = state.range(3) > 0 ? static_cast<int>(state.range(3)) : ctx + 144;
  const auto f = static_cast<tandem::RowFormat>(state.range(1));
  const int B = static_cast<int>(state.range(2)), copies = std::max(1, 16 / B), slots = copies * B;
  const int64_t rb = tandem::gpu::kv_row_bytes(f, nkv, hd), stride = int64_t{max_ctx} * rb;
  const int splits = static_cast<int>(tandem::gpu::attention_decode_splits(max_ctx));
  tandem::gpu::AttentionDecodeArgs p;
  p.nh = nh, p.nkv = nkv, p.hd = hd, p.rotary_dim = rot, p.max_ctx = max_ctx, p.max_splits = splits, p.scale = 1.0f / 16.0f;
  float *buf, *part;
  uint8_t *kc, *vc;
  int32_t* pos;
  const int64_t floats = B * (int64_t(nh) * 2 * hd + 2 * nkv * hd + 2 * nh * hd) + 2 * hd + rot / 2;
  cudaMalloc(&buf, floats * 4);
  cudaMalloc(&part, int64_t(B) * nh * splits * (hd + 2) * 4);
  cudaMalloc(&kc, slots * stride);
  cudaMalloc(&vc, slots * stride);
  cudaMalloc(&pos, B * 4);
  cudaMemset(buf, 0, floats * 4);
  cudaMemset(kc, 0, slots * stride);
  cudaMemset(vc, 0, slots * stride);
  const std::vector<int32_t> at(B, ctx);
  cudaMemcpy(pos, at.data(), B * 4, cudaMemcpyHostToDevice);
  CycledSlots slot(B, copies);
  float* q = buf;
  auto take = [&](int64_t count) { float* r = q; q += count; return r; };
  p.qg = take(B * int64_t(nh) * 2 * hd), p.k = take(B * nkv * hd), p.v = take(B * nkv * hd), p.q_norm = take(hd), p.k_norm = take(hd);
  p.inv_freq = take(rot / 2), p.q_rot = take(B * nh * hd), p.out = take(B * nh * hd);
  p.k_cache = kc, p.v_cache = vc, p.kv = f, p.partial = part, p.pos = pos;
  p.tokens = B, p.cache_stride = stride;
  time_kernel(state, double(B) * (ctx + 1) * rb * 2, [&] {
    p.slot = slot.next();
    tandem::gpu::attention_decode(p, nullptr);
  });
  state.SetLabel(std::string(tandem::row_format_name(f)) + ", " + std::to_string(splits) + " splits of " +
                 std::to_string(tandem::gpu::kAttnDecodeSplitRows) + " rows");
  for (void* ptr : {static_cast<void*>(buf), static_cast<void*>(part), static_cast<void*>(kc), static_cast<void*>(vc), static_cast<void*>(pos)})
    cudaFree(ptr);
}

// Attention prefill of one chunk at the 35B shape (16 query / 2 KV heads x 256, rotary 64): T tokens at
// positions start..start+T-1 (causal over the cache rows before them and the chunk), the prepare
// kernel (norms, RoPE, cache append) included; the products on tensor cores. TFLOPS counts the two
// products' multiply-adds over the causal rows.
void BM_attention_prefill(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int T = static_cast<int>(state.range(0)), start = static_cast<int>(state.range(1));
  const int nh = 16, nkv = 2, hd = 256, rot = 64, ctx = start + T;
  tandem::gpu::AttentionDecodeArgs p;
  p.nh = nh, p.nkv = nkv, p.hd = hd, p.rotary_dim = rot, p.max_ctx = ctx, p.scale = 1.0f / 16.0f;
  float *qg, *k, *v, *norms, *out;
  uint8_t *kc, *vc;
  int32_t* pos;
  cudaMalloc(&qg, int64_t(T) * nh * 2 * hd * 4);
  cudaMalloc(&k, int64_t(T) * nkv * hd * 4);
  cudaMalloc(&v, int64_t(T) * nkv * hd * 4);
  cudaMalloc(&norms, (2 * hd + rot / 2) * 4);
  cudaMalloc(&out, int64_t(T) * nh * hd * 4);
  cudaMalloc(&kc, int64_t(ctx) * nkv * hd * 2);
  cudaMalloc(&vc, int64_t(ctx) * nkv * hd * 2);
  cudaMalloc(&pos, T * 4);
  for (auto [ptr, bytes] : {std::pair<void*, int64_t>{qg, int64_t(T) * nh * 2 * hd * 4}, {k, int64_t(T) * nkv * hd * 4},
                            {v, int64_t(T) * nkv * hd * 4}, {norms, (2 * hd + rot / 2) * 4}, {kc, int64_t(ctx) * nkv * hd * 2},
                            {vc, int64_t(ctx) * nkv * hd * 2}})
    cudaMemset(ptr, 0, bytes);
  std::vector<int32_t> hpos(T);
  std::iota(hpos.begin(), hpos.end(), start);
  cudaMemcpy(pos, hpos.data(), T * 4, cudaMemcpyHostToDevice);
  p.qg = qg, p.k = k, p.v = v, p.q_norm = norms, p.k_norm = norms + hd, p.inv_freq = norms + 2 * hd, p.pos = pos;
  p.k_cache = kc, p.v_cache = vc, p.q_rot = out, p.out = out;
  const double rows = double(T) * start + double(T) * (T + 1) / 2;  // (query, key) pairs
  const double bytes = double(ctx) * nkv * hd * 2 * 2 + double(T) * nh * (2 * hd + hd) * 4;
  time_kernel(state, bytes, [&] { tandem::gpu::attention_prefill(p, T, nullptr); });
  state.counters["TFLOPS"] = benchmark::Counter(4.0 * nh * hd * rows * 50 * state.iterations() / 1e12, benchmark::Counter::kIsRate);
  for (void* ptr : {static_cast<void*>(qg), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(norms),
                    static_cast<void*>(out), static_cast<void*>(kc), static_cast<void*>(vc), static_cast<void*>(pos)})
    cudaFree(ptr);
}

// Prefill projections (cuBLAS, split-bf16 activations): TFLOPS over T tokens (2 GEMMs count once: the
// useful work is 2*N*K*T flops).
void BM_gemm_bf16(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int64_t N = state.range(0), K = state.range(1), T = state.range(2);
  uint16_t *W, *split;
  float *x, *y;
  cudaMalloc(&W, N * K * 2);
  cudaMalloc(&split, 2 * T * K * 2);
  cudaMalloc(&x, T * K * 4);
  cudaMalloc(&y, T * N * 4);
  cudaMemset(W, 0x3c, N * K * 2);
  cudaMemset(x, 0, T * K * 4);
  tandem::gpu::BlasHandle h = nullptr;
  tandem::gpu::blas_create(&h);
  time_kernel(state, double(N * K * 2), [&] { tandem::gpu::gemm_bf16(h, W, N, K, x, T, split, y, nullptr); });
  state.counters["TFLOPS"] = benchmark::Counter(2.0 * N * K * T * 50 * state.iterations() / 1e12, benchmark::Counter::kIsRate);
  state.counters["tokens/s_this_matrix"] = benchmark::Counter(double(T) * 50 * state.iterations(), benchmark::Counter::kIsRate);
  tandem::gpu::blas_destroy(h);
  cudaFree(W);
  cudaFree(split);
  cudaFree(x);
  cudaFree(y);
}

void BM_gemv_int4(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int64_t N = state.range(0), K = state.range(1), gs = 128;
  const int T = static_cast<int>(state.range(2));
  const int64_t G = K / gs;
  std::mt19937 rng(1);
  std::vector<uint32_t> q(N * K / 8);
  for (auto& v : q) v = static_cast<uint32_t>(rng());
  std::vector<uint16_t> s(N * G, 0x2000);
  std::vector<uint8_t> z(N * G, 8);
  uint32_t* dq;
  uint16_t *ds, *xh;
  uint8_t* dz;
  float* y;
  cudaMalloc(&dq, q.size() * 4);
  cudaMalloc(&ds, s.size() * 2);
  cudaMalloc(&dz, z.size());
  cudaMalloc(&xh, T * K * 2);
  cudaMalloc(&y, T * N * 4);
  cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(ds, s.data(), s.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dz, z.data(), z.size(), cudaMemcpyHostToDevice);
  cudaMemset(xh, 0, T * K * 2);
  const tandem::gpu::Int4View v{dq, ds, dz, N, K, gs, nullptr};
  const double bytes = double(N * K / 2 + N * G * 3);  // codes + fp16 scales + u8 zeros
  time_kernel(state, bytes, [&] { tandem::gpu::gemv_int4(v, xh, T, y, nullptr); });
  cudaFree(dq);
  cudaFree(ds);
  cudaFree(dz);
  cudaFree(xh);
  cudaFree(y);
}

// One MoE layer of the 35B model at decode: 256 int4 experts (2048 x 512, group 128) resident, k of
// them selected per token at random; bytes = the selected experts' codes, scales and zeros.
// Random routing over all 256 experts of one 35B MoE layer (2048 x 512, int4 g128): device tables,
// ids, weights and activations for T tokens. Bytes for the bound: every distinct expert read once.
struct MoeLayerBench {
  static constexpr int64_t H = 2048, I = 512, gs = 128, E = 256;
  int T, k, sets;
  double bytes = 0;
  char* pool = nullptr;
  tandem::gpu::Int4Expert* dexp = nullptr;
  int32_t* dids = nullptr;
  float *dw = nullptr, *out = nullptr, *x = nullptr;
  uint16_t *xh = nullptr, *h = nullptr;

  // sets > 1: that many independent routings (ids + s * T * k), cycled through launch by launch so that
  // the experts come from HBM as in the model (one layer's 8 experts, ~13 MB, would otherwise stay in L2).
  MoeLayerBench(int tokens, int topk, int routing_sets = 1) : T(tokens), k(topk), sets(routing_sets) {
    auto bytes_of = [&](int64_t N, int64_t K) { return N * K / 2 + N * (K / gs) * 3; };
    const int64_t per_expert = 2 * bytes_of(I, H) + bytes_of(H, I);
    cudaMalloc(&pool, E * per_expert + 4096);
    cudaMemset(pool, 0x11, E * per_expert);
    std::vector<tandem::gpu::Int4Expert> experts(E);
    char* p = pool;
    auto carve = [&](int64_t N, int64_t K) {
      tandem::gpu::Int4View v{reinterpret_cast<uint32_t*>(p), nullptr, nullptr, N, K, gs, nullptr};
      p += N * K / 2;
      v.scales = reinterpret_cast<uint16_t*>(p);
      p += N * (K / gs) * 2;
      v.zeros = reinterpret_cast<uint8_t*>(p);
      p += (N * (K / gs) + 15) / 16 * 16;
      return v;
    };
    for (auto& e : experts) e = {carve(I, H), carve(I, H), carve(H, I)};
    std::mt19937 rng(7);
    std::vector<int32_t> ids(sets * T * k);
    for (int t = 0; t < sets * T; ++t) {  // k distinct experts per token
      std::vector<int32_t> all(E);
      std::iota(all.begin(), all.end(), 0);
      for (int j = 0; j < k; ++j) {
        std::swap(all[j], all[j + rng() % (E - j)]);
        ids[t * k + j] = all[j];
      }
    }
    std::vector<float> w(sets * T * k, 0.125f);
    cudaMalloc(&dexp, E * sizeof(tandem::gpu::Int4Expert));
    cudaMalloc(&dids, ids.size() * 4);
    cudaMalloc(&dw, w.size() * 4);
    cudaMalloc(&out, T * H * 4);
    cudaMalloc(&x, T * H * 4);
    cudaMalloc(&xh, T * H * 2);
    cudaMalloc(&h, std::max<size_t>(T * k * I * 2, tandem::gpu::moe_int4_wide_workspace(T, k, H, I)));  // plain's h or wide's workspace
    cudaMemcpy(dexp, experts.data(), E * sizeof(tandem::gpu::Int4Expert), cudaMemcpyHostToDevice);
    cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(xh, 0, T * H * 2);
    cudaMemset(x, 0, T * H * 4);
    ids.resize(T * k);  // the bound: one launch's distinct experts (the first set; the others alike)
    std::sort(ids.begin(), ids.end());
    bytes = double(std::unique(ids.begin(), ids.end()) - ids.begin()) * per_expert;
  }
  ~MoeLayerBench() {
    for (void* q : {(void*)pool, (void*)dexp, (void*)dids, (void*)dw, (void*)out, (void*)x, (void*)xh, (void*)h}) cudaFree(q);
  }
};

// Args: k, tokens, kernel (0 = moe_int4_decode, the form for other shapes; 1 = moe_int4_decode_wide, the
// one Qwen3.5 runs), routing sets cycled (1: the same experts every launch, L2-warm; 32: each launch
// other experts, from HBM).
void BM_moe_int4_decode(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int sets = static_cast<int>(state.range(3));
  MoeLayerBench b(static_cast<int>(state.range(1)), static_cast<int>(state.range(0)), sets);
  const bool wide = state.range(2) != 0;
  int launch = 0;
  time_kernel(state, b.bytes, [&] {
    const int off = (launch++ % sets) * b.T * b.k;
    if (wide)
      tandem::gpu::moe_int4_decode_wide(b.dexp, b.H, b.I, b.gs, b.dids + off, b.dw + off, b.T, b.k, b.x, false, b.h, b.out, nullptr);
    else
      tandem::gpu::moe_int4_decode(b.dexp, b.H, b.I, b.gs, b.dids + off, b.dw + off, b.T, b.k, b.xh, b.h, b.out, nullptr);
  });
  state.SetLabel(std::string(wide ? "wide" : "plain") + (sets > 1 ? ", experts from HBM" : ", L2-warm"));
}

// One MoE layer of a prefill chunk (T tokens, top-8 of 256): moe_int4_grouped_tc (each expert once per
// 32 of its tokens, tensor cores). Bound: every distinct expert read once.
void BM_moe_int4_prefill(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  MoeLayerBench b(static_cast<int>(state.range(0)), 8);
  void* ws = nullptr;
  cudaMalloc(&ws, tandem::gpu::moe_int4_grouped_workspace(b.T, b.k, b.H, b.I, b.E));
  time_kernel(state, b.bytes, [&] {
    tandem::gpu::moe_int4_grouped_tc(b.dexp, b.E, b.H, b.I, b.gs, b.dids, b.dw, b.T, b.k, b.x, ws, b.out, nullptr);
  });
  // useful work: 2 flops per multiply-add of the T*k (token, expert) pairs through gate, up and down
  const double flops = 2.0 * b.T * b.k * 3.0 * b.H * b.I;
  state.counters["TFLOPS"] = benchmark::Counter(flops * 50 * state.iterations() / 1e12, benchmark::Counter::kIsRate);
  state.counters["tok_per_s_layer"] = benchmark::Counter(double(b.T) * 50 * state.iterations(), benchmark::Counter::kIsRate);
  cudaFree(ws);
}

// One DeltaNet layer's decode step at the 35B shape (16/32 heads x 128) for B sequences, one token each
// (arg): bytes = each sequence's fp32 state read and written (2 x 2 MiB) + its conv window read and
// written + the conv weights once + the tokens' inputs. The states of 64 / B steps are cycled (128 MiB),
// so each launch reads them from HBM as a step of the model does.
void BM_deltanet_decode(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int B = static_cast<int>(state.range(0)), copies = std::max(1, 64 / B);
  tandem::gpu::DeltaNetDecodeArgs p;
  p.Hk = 16, p.Hv = 32, p.dk = 128, p.dv = 128, p.kernel = 4;
  const int64_t conv_dim = 2 * 16 * 128 + 32 * 128, Vd = 32 * 128, S = int64_t(32) * 128 * 128, W = conv_dim * 3;
  const int64_t slots = int64_t{copies} * B;
  float* buf;
  const int64_t n = B * (conv_dim * 2 + Vd * 2 + 32 * 2) + 32 * 2 + 128 + conv_dim * 4 + slots * (W + S);
  cudaMalloc(&buf, n * 4);
  cudaMemset(buf, 0, n * 4);
  float* q = buf;
  auto take = [&](int64_t count) { float* r = q; q += count; return r; };
  p.qkv = take(B * conv_dim), p.conv_out = take(B * conv_dim), p.z = take(B * Vd), p.out = take(B * Vd), p.b = take(B * 32),
  p.a = take(B * 32);
  p.A_log = take(32), p.dt_bias = take(32), p.norm_w = take(128), p.conv_w = take(conv_dim * 4);
  p.conv_state = take(slots * W), p.state = take(slots * S);
  p.tokens = B, p.groups = B, p.conv_stride = W, p.state_stride = S;
  std::vector<int32_t> first(B + 1);  // group g: token g
  std::iota(first.begin(), first.end(), 0);
  int32_t* dfirst;
  cudaMalloc(&dfirst, (B + 1) * 4);
  cudaMemcpy(dfirst, first.data(), (B + 1) * 4, cudaMemcpyHostToDevice);
  p.first = dfirst;
  CycledSlots slot(B, copies);
  const double bytes = B * (2.0 * S * 4 + 2.0 * W * 4 + (conv_dim + 2 * Vd) * 4) + conv_dim * 4 * 4;
  time_kernel(state, bytes, [&] {
    p.slot = slot.next();
    tandem::gpu::deltanet_decode(p, nullptr);
  });
  cudaFree(dfirst);
  cudaFree(buf);
}

// DeltaNet over a whole prompt of T tokens in one call (35B layer shape): tokens per second of one layer.
void BM_deltanet_prefill(benchmark::State& state) {
  if (!gpu_present()) return state.SkipWithError("no CUDA device");
  const int T = static_cast<int>(state.range(0));
  tandem::gpu::DeltaNetDecodeArgs p;
  p.Hk = 16, p.Hv = 32, p.dk = 128, p.dv = 128, p.kernel = 4;
  const int64_t conv_dim = 2 * 16 * 128 + 32 * 128, Vd = 32 * 128, S = int64_t(32) * 128 * 128;
  const int64_t n = T * (2 * conv_dim + 2 * Vd + 2 * 32) + 2 * 32 + 128 + conv_dim * 4 + conv_dim * 3 + S;
  float* buf;
  cudaMalloc(&buf, n * 4);
  cudaMemset(buf, 0, n * 4);
  float* q = buf;
  auto take = [&](int64_t count) { float* r = q; q += count; return r; };
  p.qkv = take(T * conv_dim), p.conv_out = take(T * conv_dim), p.z = take(T * Vd), p.out = take(T * Vd), p.b = take(T * 32);
  p.a = take(T * 32), p.A_log = take(32), p.dt_bias = take(32), p.norm_w = take(128), p.conv_w = take(conv_dim * 4);
  p.conv_state = take(conv_dim * 3), p.state = take(S);
  const double bytes = double(T) * (2 * conv_dim + 2 * Vd + 64) * 4 + 2.0 * S * 4;
  // Arg 1: 0 = the device's chunk buffers (two on the H200), 1 = one chunk buffer (a 99 KB-a-block card's form)
  const bool one_buffer = state.range(1) != 0;
  float* terms = nullptr;
  cudaMalloc(&terms, tandem::gpu::deltanet_chunk_terms_floats(T, p.Hv) * 4);
  p.chunk_terms = terms;
  if (one_buffer) p.wy_buffers = 1;
  time_kernel(state, bytes, [&] { tandem::gpu::deltanet_prefill_chunked(p, T, nullptr); });
  state.SetLabel(one_buffer ? "one chunk buffer" : "the device's chunk buffers");
  state.counters["tokens/s_one_layer"] = benchmark::Counter(double(T) * 50 * state.iterations(), benchmark::Counter::kIsRate);
  cudaFree(buf);
  cudaFree(terms);
}

// 35B shapes: DeltaNet in_proj_qkv 8192x2048, in_proj_z 4096x2048, out_proj 2048x4096, attention
// q_proj 8192x2048, lm_head 248320x2048; int4: the 8 selected experts' gate+up rows stacked
// (8 x 1024 = 8192 x 2048) and their down projections (8 x 2048 = 16384 x 512).
BENCHMARK(BM_gemv_bf16)
    ->Args({8192, 2048, 1, 1})->Args({8192, 2048, 1, 8})->Args({8192, 2048, 2, 8})->Args({8192, 2048, 4, 8})->Args({8192, 2048, 8, 8})->Args({12352, 2048, 1, 8})->Args({12352, 2048, 8, 8})->Args({9216, 2048, 4, 8})->Args({9216, 2048, 8, 8})->Args({4096, 2048, 1, 1})
    ->Args({2048, 4096, 1, 1})->Args({2048, 4096, 1, 8})->Args({2048, 4096, 8, 8})->Args({248320, 2048, 1, 1})->Args({248320, 2048, 4, 1})->Args({248320, 2048, 8, 1})
    ->Args({8192, 2048, 4, 1})
    ->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gemv_rows8)
    ->Args({8192, 2048, 1, 8, 1})->Args({8192, 2048, 2, 8, 1})->Args({8192, 2048, 8, 8, 1})->Args({12352, 2048, 8, 8, 1})->Args({2048, 4096, 1, 8, 1})->Args({248320, 2048, 1, 1, 1})
    ->Args({8192, 2048, 1, 8, 2})->Args({8192, 2048, 8, 8, 2})->Args({2048, 4096, 1, 8, 2})
    ->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_router_stack)->ArgsProduct({{0, 1, 2}, {1, 32}, {0, 1}})->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);  // form, copies, pdl
BENCHMARK(BM_attention_decode)  // ctx, format, B, cache rows (0: ctx + 144)
    ->ArgsProduct({{512, 4096, 32768}, {0, 1, 2}, {1}, {0}})
    ->Args({131072, 0, 1, 0})
    ->ArgsProduct({{4096}, {0}, {2, 4, 8}, {0}})
    ->ArgsProduct({{4096}, {0}, {1, 8}, {131072}})->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
// A 4096-token prompt's two chunks of 2048 (the second attends to the first's 2048 cache rows too).
BENCHMARK(BM_attention_prefill)->Args({2048, 0})->Args({2048, 2048})->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gemm_bf16)  // N, K, T
    ->Args({8192, 2048, 512})->Args({8192, 2048, 4096})->Args({2048, 4096, 4096})
    ->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gemm_rows8)  // N, K, T, format (1 int8, 2 fp8)
    ->Args({8192, 2048, 512, 1})->Args({8192, 2048, 4096, 1})->Args({2048, 4096, 4096, 1})->Args({8192, 2048, 4096, 2})
    ->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gemv_int4)
    ->Args({8192, 2048, 1})->Args({16384, 512, 1})->Args({512, 2048, 1})->Args({8192, 2048, 4})
    ->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_deltanet_prefill)->Args({512, 0})->Args({4096, 0})->Args({4096, 1})->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_deltanet_decode)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_moe_int4_decode)->Args({8, 1, 0, 1})->Args({8, 1, 1, 1})->Args({8, 1, 1, 32})->Args({8, 4, 0, 1})->Args({8, 4, 1, 1})
    ->Args({8, 4, 1, 32})->Args({8, 2, 1, 32})->Args({8, 8, 1, 32})->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_moe_int4_prefill)->Arg(256)->Arg(2048)->Arg(4096)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
