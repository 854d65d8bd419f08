// runtime/models/qwen3_5_moe/hybrid_dispatch.cpp: the host's part of a hybrid step (see hybrid_dispatch.h
// for who computes what and the handoff protocol).
#include "runtime/models/qwen3_5_moe/hybrid_dispatch.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/trace.h"
#include "gpu_core/ops.cuh"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"  // cuda_check / CK

namespace tandem {

namespace {

uint64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

template <typename T>
T* host_alloc(size_t count, unsigned flags) {
  void* p = nullptr;
  CK(cudaHostAlloc(&p, count * sizeof(T), flags));
  return static_cast<T*>(p);
}

}  // namespace

HybridDispatch::~HybridDispatch() {
  if (routed_) cudaEventDestroy(routed_);
  if (def_copied_) cudaEventDestroy(def_copied_);
  for (void* p : {static_cast<void*>(hx_), static_cast<void*>(hw_), static_cast<void*>(hout_), static_cast<void*>(hids_),
                  static_cast<void*>(flags_), static_cast<void*>(deferred_rows_), static_cast<void*>(hdef_)})
    if (p) cudaFreeHost(p);
}

void HybridDispatch::init(const Setup& s, bool graph) {
  s_ = s;
  const int64_t H = s.hidden, rows = s.rows, k = s.k;
  // Mapped: a graph step's kernels read and write them in place.
  hx_ = host_alloc<float>(rows * H, cudaHostAllocMapped);
  hout_ = host_alloc<float>(rows * H, cudaHostAllocMapped);
  hw_ = host_alloc<float>(rows * k, cudaHostAllocMapped);
  hids_ = host_alloc<int32_t>(rows * k, cudaHostAllocMapped);
  masked_.assign(rows * k, -1);
  CK(cudaEventCreateWithFlags(&routed_, cudaEventDisableTiming));
  if (deferring()) {
    hdef_ = host_alloc<float>(rows * H, cudaHostAllocDefault);
    CK(cudaEventCreateWithFlags(&def_copied_, cudaEventDisableTiming));
  }
  if (graph) {
    flags_ = host_alloc<unsigned>(kFlags, cudaHostAllocMapped);
    std::memset(flags_, 0, kFlags * sizeof(unsigned));
    if (deferring()) {  // two rows, by layer parity: the host fills layer L + 1's while the GPU may still read layer L's
      deferred_rows_ = host_alloc<float>(2 * H, cudaHostAllocMapped);
      std::memset(deferred_rows_, 0, 2 * H * sizeof(float));
    }
  }
}

void HybridDispatch::set_link(std::vector<uint8_t> layers, int m) {
  link_layers_ = std::move(layers);
  link_m_ = m;
}

void HybridDispatch::reset() { def_.pending = def_.ready = false; }

gpu::HostPost HybridDispatch::post(int layer) const { return {hx_, hids_, hw_, flags_ + kPosted, static_cast<unsigned>(layer) + 1}; }

gpu::HostSum HybridDispatch::sum(int layer) const {
  return {flags_ + kReleased, static_cast<unsigned>(layer) + 1, hout_, flags_ + kGaveUp, kHandoffTimeoutNs};
}

void HybridDispatch::join_deferred_posted(int from, float* h, cudaStream_t stream) const {
  if (from < 0) return;
  CK(gpu::host_wait_add(flags_ + kDeferred, static_cast<unsigned>(from) + 1, deferred_rows_ + (from % 2) * s_.hidden, h, s_.hidden,
                        flags_ + kGaveUp, kHandoffTimeoutNs, stream));
}

void HybridDispatch::serve_graph(cudaGraphExec_t graph, cudaStream_t stream, const std::vector<int>& layers) {
  volatile unsigned* f = flags_;
  for (int i = 0; i < kFlags; ++i) f[i] = 0u;  // the previous step has finished (synchronized)
  CK(cudaGraphLaunch(graph, stream));
  // Spins until ready() (a flag the GPU posts), then reads what it guards; a GPU that never posts fails
  // the step after 60 s with what it did not do.
  auto wait_for = [](auto ready, std::chrono::steady_clock::time_point t0, const auto&... what) {
    for (uint64_t spins = 1; !ready(); ++spins)
      if (spins % 4096 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
        fail("hybrid decode step: the GPU did not ", what..., " within 60 s");
    std::atomic_thread_fence(std::memory_order_acquire);
  };
  try {
    for (const int li : layers) {
      const unsigned v = static_cast<unsigned>(li) + 1;
      const auto t0 = std::chrono::steady_clock::now();
      {
        TraceSpan wait("wait for router, layer", "handoff", li);
        wait_for([&] { return f[kPosted] >= v; }, t0, "hand over layer ", li, "'s router result");  // then hx / hids / hw
        s_.counts->host_wait_ns += ns_since(t0);
      }
      host_part(static_cast<size_t>(li), 1, true, Pass::decode);
      std::atomic_thread_fence(std::memory_order_release);  // hout before the flag
      f[kReleased] = v;
      if (deferring()) {  // this layer's deferred experts while the GPU goes on to the next layer
        deferred_sum(deferred_rows_ + (li % 2) * s_.hidden, 1);
        std::atomic_thread_fence(std::memory_order_release);  // the row before the flag
        f[kDeferred] = v;
      }
    }
  } catch (...) {
    f[kReleased] = ~0u;  // let every wait in the graph through
    f[kDeferred] = ~0u;
    cudaStreamSynchronize(stream);
    throw;
  }
  CK(cudaStreamSynchronize(stream));
  if (const unsigned bad = f[kGaveUp]) fail("hybrid decode step: the GPU gave up waiting for layer ", bad - 1, "'s host experts");
}

void HybridDispatch::post_copy(const float* x_dev, const int32_t* ids_dev, const float* w_dev, int64_t n, cudaStream_t stream) {
  const int64_t k = s_.k;
  CK(cudaMemcpyAsync(hx_, x_dev, n * s_.hidden * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CK(cudaMemcpyAsync(hids_, ids_dev, n * k * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CK(cudaMemcpyAsync(hw_, w_dev, n * k * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CK(cudaEventRecord(routed_, stream));
}

void HybridDispatch::serve_copy(size_t li, int64_t n, float* cpu_dev, float* moe_dev, cudaStream_t stream, Pass pass) {
  {  // spinning: a blocking sync adds a wake-up
    TraceSpan wait("wait for router, layer", "handoff", static_cast<int>(li));
    const auto t0 = std::chrono::steady_clock::now();
    cudaError_t q;
    while ((q = cudaEventQuery(routed_)) == cudaErrorNotReady) {
    }
    CK(q);
    if (pass != Pass::prefill) s_.counts->host_wait_ns += ns_since(t0);
  }
  if (!host_part(li, n, false, pass)) return;
  const int64_t H = s_.hidden;
  CK(cudaMemcpyAsync(cpu_dev, hout_, n * H * sizeof(float), cudaMemcpyHostToDevice, stream));
  CK(gpu::add_inplace(moe_dev, cpu_dev, n * H, stream));
}

bool HybridDispatch::host_part(size_t li, int64_t n, bool always, Pass pass) {
  const int64_t H = s_.hidden;
  const int k = s_.k;
  ExpertCounts& counts = *s_.counts;
  bool any = false, any_deferred = false;
  for (int64_t j = 0; j < n * k; ++j) {
    const bool gpu_side = on_gpu(li, hids_[j]);
    masked_[j] = gpu_side ? -1 : hids_[j];
    if (pass != Pass::prefill) ++(gpu_side ? counts.gpu : counts.cpu);
  }
  if (pass == Pass::decode && li < link_layers_.size() && link_layers_[li]) {  // the GPU's share (its kernel picks the same slots)
    for (int64_t t = 0; t < n; ++t)
      for (int j = 0, taken = 0; j < k && taken < link_m_; ++j)
        if (masked_[t * k + j] >= 0) {
          masked_[t * k + j] = -1;
          --counts.cpu, ++counts.link, ++taken;
        }
  }
  if (deferring()) {
    def_.ids.assign(static_cast<size_t>(n * k), -1);
    order_.resize(static_cast<size_t>(k));
    for (int64_t t = 0; t < n; ++t) {  // as Qwen35Moe::moe_forward: stable, ascending weight
      for (int j = 0; j < k; ++j) order_[j] = j;
      std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) { return hw_[t * k + a] < hw_[t * k + b]; });
      for (int d = 0; d < std::min(s_.defer, k); ++d) {
        const int64_t j = t * k + order_[d];
        if (masked_[j] < 0) continue;  // GPU-resident: never deferred
        def_.ids[j] = masked_[j];
        masked_[j] = -1;
        any_deferred = true;
      }
    }
    if (any_deferred) {
      def_.x.assign(hx_, hx_ + n * H);  // hx and hw are overwritten by the next layer's handoff
      def_.w.assign(hw_, hw_ + n * k);
      def_.layer = static_cast<int>(li);
      def_.n = n;
      def_.decode = pass != Pass::prefill;
      def_.pending = true;
    }
  }
  for (int64_t j = 0; j < n * k; ++j) any |= masked_[j] >= 0;
  if (!any && !always) return false;
  std::fill(hout_, hout_ + n * H, 0.0f);
  if (any) {
    const auto t0 = std::chrono::steady_clock::now();
    s_.host->run(static_cast<int>(li), hx_, n, masked_.data(), hw_, k, hout_);
    if (pass != Pass::prefill) counts.host_run_ns += ns_since(t0), ++counts.host_layers;
  }
  return true;
}

void HybridDispatch::deferred_sum(float* out, int64_t rows) {
  std::fill(out, out + rows * s_.hidden, 0.0f);
  if (!def_.pending) return;
  TraceSpan span("cpu experts (deferred), layer", "cpu", def_.layer);
  const auto t0 = std::chrono::steady_clock::now();
  s_.host->run(def_.layer, def_.x.data(), def_.n, def_.ids.data(), def_.w.data(), s_.k, out);
  if (def_.decode) s_.counts->host_run_ns += ns_since(t0);
  def_.pending = false;
}

void HybridDispatch::run_deferred(float* def_dev, cudaStream_t stream) {
  if (!def_.pending) return;
  const int64_t n = def_.n;
  CK(cudaEventSynchronize(def_copied_));  // the previous deferred sum has left hdef
  deferred_sum(hdef_, n);
  CK(cudaMemcpyAsync(def_dev, hdef_, n * s_.hidden * sizeof(float), cudaMemcpyHostToDevice, stream));
  CK(cudaEventRecord(def_copied_, stream));
  def_.ready = true;
}

void HybridDispatch::add_deferred(float* h_dev, const float* def_dev, cudaStream_t stream) {
  if (!def_.ready) return;
  CK(gpu::add_inplace(h_dev, def_dev, def_.n * s_.hidden, stream));
  def_.ready = false;
}

}  // namespace tandem
