// runtime/models/qwen3_5_moe/gpu_hybrid.cpp: the GPU model's hybrid handoff (x and the top-k to the host
// experts, their sum back), expert deferral and the link experts (see gpu_impl.h).
#include <algorithm>
#include <atomic>
#include <chrono>

#include "gpu_core/device.cuh"
#include "gpu_core/handoff.cuh"
#include "gpu_core/int4_layout.h"
#include "gpu_core/ops.cuh"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {
namespace {
uint64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}
}  // namespace

// Hybrid handoff, part 1: x and the top-k of n tokens to pinned host memory, then an event.
void Qwen35MoeGpu::Impl::handoff_out(const float* x_dev, const int32_t* ids_dev, const float* w_dev, int64_t n) {
  const ModelConfig& c = model.config();
  const int64_t k = c.num_experts_per_tok;
  CK(cudaMemcpyAsync(hx, x_dev, n * c.hidden_size * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CK(cudaMemcpyAsync(hids, ids_dev, n * k * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CK(cudaMemcpyAsync(hw, w_dev, n * k * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CK(cudaEventRecord(routed, stream));
}

// Part 2: wait for the event (spinning: a blocking sync adds a wake-up), run the host-resident
// experts of the n tokens, and queue their sum into moe_dev (through cpu_dev). Counts who served what.
// With deferral, the host-resident ones among each token's N lowest-weight experts are set aside
// for run_deferred() (next layer) instead.
void Qwen35MoeGpu::Impl::handoff_back(size_t li, int64_t n, float* cpu_dev, float* moe_dev, Pass pass) {
  if (host_part(li, n, false, true, pass)) join_host(n, cpu_dev, moe_dev);
}

// The queued half of handoff_back: the host's sum (hout) into cpu_dev, added to moe_dev.
void Qwen35MoeGpu::Impl::join_host(int64_t n, float* cpu_dev, float* moe_dev) {
  const int64_t H = model.config().hidden_size;
  CK(cudaMemcpyAsync(cpu_dev, hout, n * H * sizeof(float), cudaMemcpyHostToDevice, stream));
  CK(gpu::add_inplace(moe_dev, cpu_dev, n * H, stream));
}

// The host half: wait for the router, run the host-resident experts into hout. Returns whether any
// ran (hout is left alone when none did, unless `always` asks for zeros then: the one graph adds it
// either way).
bool Qwen35MoeGpu::Impl::host_part(size_t li, int64_t n, bool always, bool wait_routed, Pass pass) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size;
  const int k = c.num_experts_per_tok;
  using Clock = std::chrono::steady_clock;
  if (wait_routed) {
    TraceSpan wait("wait for router, layer", "handoff", static_cast<int>(li));
    const auto t0 = Clock::now();
    cudaError_t q;
    while ((q = cudaEventQuery(routed)) == cudaErrorNotReady) {
    }
    CK(q);
    if (pass == Pass::decode) counts.host_wait_ns += ns_since(t0);
  }
  bool any = false, any_deferred = false;
  for (int64_t j = 0; j < n * k; ++j) {
    const bool gpu_side = on_gpu(static_cast<int>(li), hids[j]);
    masked[j] = gpu_side ? -1 : hids[j];
    if (pass == Pass::decode) ++(gpu_side ? counts.gpu : counts.cpu);
  }
  if (pass == Pass::decode && link.on && link.tables[li]) {  // the GPU's share (its kernel picks the same slots)
    for (int64_t t = 0; t < n; ++t)
      for (int j = 0, taken = 0; j < k && taken < link.m; ++j)
        if (masked[t * k + j] >= 0) {
          masked[t * k + j] = -1;
          --counts.cpu, ++counts.link, ++taken;
        }
  }
  if (deferring()) {
    def.ids.assign(static_cast<size_t>(n * k), -1);
    order.resize(static_cast<size_t>(k));
    for (int64_t t = 0; t < n; ++t) {  // as Qwen35Moe::moe_forward: stable, ascending weight
      for (int j = 0; j < k; ++j) order[j] = j;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return hw[t * k + a] < hw[t * k + b]; });
      for (int d = 0; d < std::min(opts.defer_experts, k); ++d) {
        const int64_t j = t * k + order[d];
        if (masked[j] < 0) continue;  // GPU-resident: never deferred
        def.ids[j] = masked[j];
        masked[j] = -1;
        any_deferred = true;
      }
    }
    if (any_deferred) {
      def.x.assign(hx, hx + n * H);  // hx and hw are overwritten by the next layer's handoff
      def.w.assign(hw, hw + n * k);
      def.layer = static_cast<int>(li);
      def.n = n;
      def.decode = pass == Pass::decode;
      def.pending = true;
    }
  }
  for (int64_t j = 0; j < n * k; ++j) any |= masked[j] >= 0;
  if (!any && !always) return false;
  std::fill(hout, hout + n * H, 0.0f);
  if (any) {
    const auto t0 = Clock::now();
    opts.host_experts->run(static_cast<int>(li), hx, n, masked.data(), hw, k, hout);
    if (pass == Pass::decode) counts.host_run_ns += ns_since(t0), ++counts.host_layers;
  }
  return true;
}

// GpuOptions::link_experts, before the plan: every layer's host experts as offsets into page-locked
// host memory (HostExperts::stream_layout), turned into device addresses; any refusal leaves it off
// with link.note.
void Qwen35MoeGpu::Impl::link_setup() {
  link = Link{};
  if (opts.link_experts <= 0 || !opts.host_experts || !opts.expert_on_gpu || opts.expert_on_gpu->empty()) return;
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const int L = static_cast<int>(c.num_layers), E = static_cast<int>(c.num_experts), k = c.num_experts_per_tok;
  if (!model.gptq_experts()) {
    link.note = "the link takes GPTQ int4 experts (this checkpoint's are dense)";
    return;
  }
  const int64_t gs = model.layers()[0].moe.gate[0].gptq.group_size;
  const int m = std::min(opts.link_experts, k);
  if (!gpu::moe_int4_tiles_fits(H, I, gs, k, m)) {
    link.note = str_cat("the link kernel does not take hidden ", H, ", intermediate ", I, " in groups of ", gs, " (multiples of 16 in groups of a multiple of 8, at most 32 groups a row)");
    return;
  }
  using SM = HostExperts::StreamMatrix;
  std::vector<gpu::Int4TilesExpert> tables;
  std::vector<int> table_of(L, -1);
  std::vector<uint8_t> host_only(L, 0);
  for (int l = 0; l < L; ++l) {
    const auto& on = (*opts.expert_on_gpu)[l];
    const auto host = std::count(on.begin(), on.end(), 0);
    if (host == 0) continue;
    host_only[l] = host == static_cast<std::ptrdiff_t>(on.size());
    HostExperts::StreamLayer sl;
    if (!host_layout(l, gs, 16, sl, link.note)) return;
    const auto* base = static_cast<const uint8_t*>(gpu::host_device_pointer(sl.base));
    if (!base) {
      link.note = str_cat("layer ", l, "'s host experts are not page-locked (the GPU cannot read them in place)");
      return;
    }
    table_of[l] = static_cast<int>(tables.size() / E);
    tables.resize(tables.size() + E);
    gpu::Int4TilesExpert* t = tables.data() + tables.size() - E;
    for (const HostExperts::StreamExpert& x : sl.experts) {
      if (x.down.perm != SM::kNone) {  // the kernel reads h in down's packed order
        link.note = str_cat("layer ", l, " expert ", x.expert, ": its down projection has an input order (the host folds it into gate / up)");
        return;
      }
      gpu::Int4TilesView* v[3] = {&t[x.expert].gate, &t[x.expert].up, &t[x.expert].down};
      const SM* s[3] = {&x.gate, &x.up, &x.down};
      for (int i = 0; i < 3; ++i) {
        v[i]->w = base + s[i]->w;
        v[i]->scales = reinterpret_cast<const uint16_t*>(base + s[i]->scales);
        v[i]->zeros = s[i]->zeros == SM::kNone ? nullptr : base + s[i]->zeros;
        v[i]->perm = s[i]->perm == SM::kNone ? nullptr : reinterpret_cast<const int32_t*>(base + s[i]->perm);
        link.act_order |= v[i]->perm != nullptr;
      }
    }
  }
  if (tables.empty()) return;
  link.host_tables = std::move(tables);
  link.table_of = std::move(table_of);
  link.host_only = std::move(host_only);
  link.m = m;
  link.group_size = gs;
  link.on = true;
}

gpu::LinkBuffers Qwen35MoeGpu::Impl::link_buffers() const {
  if (!link.on) return {};
  const ModelConfig& c = model.config();
  return gpu::link_buffer_bytes(c.hidden_size, c.moe_intermediate_size, static_cast<int>(c.num_experts),
                                static_cast<int>(link.host_tables.size() / c.num_experts), link.m);
}

// After the commit: the tables into link.mem (allocated by build()), then the scratch (gpu::LinkBuffers'
// order), each layer's table.
void Qwen35MoeGpu::Impl::link_upload() {
  if (!link.on) return;
  const ModelConfig& c = model.config();
  const int L = static_cast<int>(c.num_layers), E = static_cast<int>(c.num_experts);
  const gpu::LinkBuffers b = link_buffers();
  CK(cudaMemcpy(link.mem, link.host_tables.data(), link.host_tables.size() * sizeof(gpu::Int4TilesExpert), cudaMemcpyHostToDevice));
  link.scratch = static_cast<char*>(link.mem) + b.tables;
  link.tables.assign(L, nullptr);
  for (int l = 0; l < L; ++l)
    if (link.table_of[l] >= 0) link.tables[l] = static_cast<const gpu::Int4TilesExpert*>(link.mem) + static_cast<size_t>(link.table_of[l]) * E;
}

// The one-graph hybrid step: launches the graph, then for each layer with host experts
// waits (spinning) for the GPU to post its router result, runs them, and releases the GPU's wait. On any
// failure every wait in the graph is released before the error leaves, so the stream always drains.
void Qwen35MoeGpu::Impl::run_one_graph(int w) {
  volatile unsigned* f = hflags;
  for (int i = 0; i < 4; ++i) f[i] = 0u;  // the previous step has finished (synchronized)
  CK(cudaGraphLaunch(graphs[w], stream));
  // Spins until ready() (a flag the GPU posts), then reads what it guards; a GPU that never posts fails
  // the step after 60 s with what it did not do.
  auto wait_for = [](auto ready, std::chrono::steady_clock::time_point t0, const auto&... what) {
    for (uint64_t spins = 1; !ready(); ++spins)
      if (spins % 4096 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
        fail("hybrid decode step: the GPU did not ", what..., " within 60 s");
    std::atomic_thread_fence(std::memory_order_acquire);
  };
  try {
    for (const int li : handoff_layers) {
      const unsigned v = static_cast<unsigned>(li) + 1;
      const auto t0 = std::chrono::steady_clock::now();
      {
        TraceSpan wait("wait for router, layer", "handoff", li);
        wait_for([&] { return f[0] >= v; }, t0, "hand over layer ", li, "'s router result");  // then hx / hids / hw
        counts.host_wait_ns += ns_since(t0);
      }
      host_part(static_cast<size_t>(li), 1, true, false);
      std::atomic_thread_fence(std::memory_order_release);  // hout before the flag
      f[1] = v;
      if (deferring()) {  // this layer's deferred experts while the GPU goes on to the next layer
        deferred_sum(hdef_posted + (li % 2) * model.config().hidden_size, 1);
        std::atomic_thread_fence(std::memory_order_release);  // the row before the flag
        f[3] = v;
      }
    }
  } catch (...) {
    f[1] = ~0u;  // let every wait in the graph through
    f[3] = ~0u;
    cudaStreamSynchronize(stream);
    throw;
  }
  CK(cudaStreamSynchronize(stream));
  if (const unsigned bad = f[2]) fail("hybrid decode step: the GPU gave up waiting for layer ", bad - 1, "'s host experts");
}

// The previous layer's deferred host experts, run while the GPU works on this layer; their sum is
// queued into def_dev, and add_deferred() adds it with this layer's MoE output.
// The pending deferred experts' sum into out [rows, H] (zeros where none are pending).
void Qwen35MoeGpu::Impl::deferred_sum(float* out, int64_t rows) {
  std::fill(out, out + rows * model.config().hidden_size, 0.0f);
  if (!def.pending) return;
  TraceSpan span("cpu experts (deferred), layer", "cpu", def.layer);
  const auto t0 = std::chrono::steady_clock::now();
  opts.host_experts->run(def.layer, def.x.data(), def.n, def.ids.data(), def.w.data(), model.config().num_experts_per_tok, out);
  if (def.decode) counts.host_run_ns += ns_since(t0);
  def.pending = false;
}

void Qwen35MoeGpu::Impl::run_deferred() {
  if (!def.pending) return;
  const int64_t H = model.config().hidden_size, n = def.n;
  CK(cudaEventSynchronize(def_copied));  // the previous deferred sum has left hdef
  deferred_sum(hdef, n);
  CK(cudaMemcpyAsync(def_dev, hdef, n * H * sizeof(float), cudaMemcpyHostToDevice, stream));
  CK(cudaEventRecord(def_copied, stream));
  def.ready = true;
}

void Qwen35MoeGpu::Impl::join_posted_deferred(int from) {
  if (from < 0) return;
  const int64_t H = model.config().hidden_size;
  CK(gpu::host_wait_add(hflags + 3, static_cast<unsigned>(from) + 1, hdef_posted + (from % 2) * H, h, H, hflags + 2,
                        kHandoffTimeoutNs, stream));
}

void Qwen35MoeGpu::Impl::add_deferred(float* h_dev) {
  if (!def.ready) return;
  CK(gpu::add_inplace(h_dev, def_dev, def.n * model.config().hidden_size, stream));
  def.ready = false;
}

}  // namespace tandem
