// runtime/models/qwen3_5_moe/gpu_hybrid.cpp: the GPU model's hybrid handoff (x and the top-k to the host
// experts, their sum back) and expert deferral (see qwen3_5_moe_gpu_impl.h).
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
  if (segmenting) CK(cudaEventRecordWithFlags(routed, stream, cudaEventRecordExternal));  // an event node in the segment's graph
  else CK(cudaEventRecord(routed, stream));
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
// ran (hout is left alone when none did, unless `always` asks for zeros then: a captured join_host
// adds it either way).
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
    const bool gpu_side = !host_serves(static_cast<int>(li), hids[j], pass == Pass::streamed);
    masked[j] = gpu_side ? -1 : hids[j];
    if (pass == Pass::decode) ++(gpu_side ? counts.gpu : counts.cpu);
    if (pass != Pass::streamed && rp.on) ++rp.heat[li][hids[j]];
  }
  if (pass == Pass::decode && link.on && link.tables[li]) {  // the GPU's share (its kernel picks the same slots)
    int32_t staged[8];
    int S = 0;
    if (link.stage && link.replaying && link.staged_at[li])  // the layer's guess, staged where the host holds it
      for (int q = 0; q < link.stage; ++q) staged[S++] = hgids[q] >= 0 && hgids[q] < c.num_experts && host_serves(static_cast<int>(li), hgids[q], false) ? hgids[q] : -1;
    auto take = [&](int64_t at) {
      masked[at] = -1;
      --counts.cpu, ++counts.link;
    };
    for (int64_t t = 0; t < n; ++t) {
      for (int j = 0; j < k && S; ++j)
        if (masked[t * k + j] >= 0 && std::find(staged, staged + S, masked[t * k + j]) != staged + S) take(t * k + j);
      for (int j = 0, extra = 0; j < k && extra < link.m; ++j)
        if (masked[t * k + j] >= 0) take(t * k + j), ++extra;
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
  if (opts.replace.on()) {
    link.note = "not with online re-placement (the host's set of experts changes)";
    return;
  }
  const int64_t gs = model.layers()[0].moe.gate[0].gptq.group_size;
  const int m = std::min(opts.link_experts, k), stage = std::clamp(opts.link_stage, 0, k);
  if (!gpu::moe_int4_tiles_fits(H, I, gs, k, m, stage)) {
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
  link.stage_slots = stage;
  link.group_size = gs;
  link.on = true;
}

gpu::LinkBuffers Qwen35MoeGpu::Impl::link_buffers() const {
  if (!link.on) return {};
  const ModelConfig& c = model.config();
  return gpu::link_buffer_bytes(c.hidden_size, c.moe_intermediate_size, link.group_size, static_cast<int>(c.num_experts),
                                static_cast<int>(link.host_tables.size() / c.num_experts), c.num_experts_per_tok, link.m, link.stage_slots);
}

// After the commit: the tables into link.mem (allocated by build()), the other pieces' addresses in
// gpu::LinkBuffers' order, each layer's table.
void Qwen35MoeGpu::Impl::link_upload() {
  if (!link.on) return;
  const ModelConfig& c = model.config();
  const int L = static_cast<int>(c.num_layers), E = static_cast<int>(c.num_experts);
  const gpu::LinkBuffers b = link_buffers();
  CK(cudaMemcpy(link.mem, link.host_tables.data(), link.host_tables.size() * sizeof(gpu::Int4TilesExpert), cudaMemcpyHostToDevice));
  char* at = static_cast<char*>(link.mem) + b.tables;
  link.scratch = at;
  at += b.scratch;
  if (link.stage_slots) {  // link.stage stays 0 until the one-graph step is known to guess (create())
    link.slot_bytes = b.slot;
    link.slots = at;
    at += b.slots;
    link.staged_ids = reinterpret_cast<int32_t*>(at);
    at += b.ids;
    link.staged_table = reinterpret_cast<gpu::Int4TilesExpert*>(at);
    at += b.views;
    link.guess_dev = reinterpret_cast<int32_t*>(at);
    CK(cudaEventCreateWithFlags(&link.staged_ev, cudaEventDisableTiming));
    link.staged_at.assign(L, 0);
  }
  link.tables.assign(L, nullptr);
  for (int l = 0; l < L; ++l)
    if (link.table_of[l] >= 0) link.tables[l] = static_cast<const gpu::Int4TilesExpert*>(link.mem) + static_cast<size_t>(link.table_of[l]) * E;
}

// GpuOptions::host_prefetch, inside the step's graph: forks the side stream after the layer's input
// norm (h is the layer's input), and there the router's rows (the first E of the stacked projection)
// over h with the post-attention norm, top-k in the GEMV's last block, then the ids posted to hgids
// with hflags[4] = li + 1. Its scratch (cpu_out, router, topk_ids / topk_w, route_ticket) is the real
// router's, unused by the mixer; the caller joins the side stream back before the real router.
bool Qwen35MoeGpu::Impl::post_guess(const DevLayer& L, size_t li) {
  const ModelConfig& c = model.config();
  const DevLinear& R = L.x_proj.out ? L.x_proj : L.router;
  if (R.int4 || !R.w) return false;
  const int E = static_cast<int>(c.num_experts), k = c.num_experts_per_tok;
  CK(cudaEventRecord(fork_ev, stream));
  CK(cudaStreamWaitEvent(side, fork_ev, 0));
  CK(gpu::gemv_bf16_router_topk_norm(R.w, E, R.in, h, nullptr, nullptr, nullptr, L.post_norm, static_cast<float>(c.rms_norm_eps),
                                     cpu_out, router, E, k, route_ticket, topk_ids, topk_w, side));
  CK(gpu::host_post(nullptr, 0, topk_ids, topk_w, k, nullptr, hgids, hgw, hflags + 4, static_cast<unsigned>(li) + 1, side));
  // GpuOptions::link_stage: the guess kept on the device for the staging kernel (the first e2e runs had
  // every block of it read hgids, the same words of host memory: 0.4-0.8 ms a layer on the H200)
  if (link.guess_dev) CK(cudaMemcpyAsync(link.guess_dev, topk_ids, k * sizeof(int32_t), cudaMemcpyDeviceToDevice, side));
  CK(cudaEventRecord(join_ev, side));
  return true;
}

// GpuOptions::hybrid_one_graph: launches the step's one graph, then for each layer with host experts
// waits (spinning) for the GPU to post its router result, runs them, and releases the GPU's wait. On any
// failure every wait in the graph is released before the error leaves, so the stream always drains.
void Qwen35MoeGpu::Impl::run_one_graph(int w) {
  volatile unsigned* f = hflags;
  for (int i = 0; i < 8; ++i) f[i] = 0u;  // the previous step has finished (synchronized)
  CK(cudaGraphLaunch(segs[w][0], stream));
  // Spins until ready() (a flag the GPU posts), then reads what it guards; a GPU that never posts fails
  // the step after 60 s with what it did not do.
  auto wait_for = [](auto ready, std::chrono::steady_clock::time_point t0, const auto&... what) {
    for (uint64_t spins = 1; !ready(); ++spins)
      if (spins % 4096 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
        fail("hybrid decode step: the GPU did not ", what..., " within 60 s");
    std::atomic_thread_fence(std::memory_order_acquire);
  };
  struct Replaying {  // host_part stages as the graph does while this loop runs
    bool& on;
    explicit Replaying(bool& b) : on(b) { on = true; }
    ~Replaying() { on = false; }
  } replaying(link.replaying);
  try {
    for (size_t si = 0; si < seg_layers.size(); ++si) {
      const int li = seg_layers[si];
      const unsigned v = static_cast<unsigned>(li) + 1;
      const auto t0 = std::chrono::steady_clock::now();
      {
        TraceSpan wait("wait for router, layer", "handoff", li);
        wait_for([&] { return f[0] >= v; }, t0, "hand over layer ", li, "'s router result");  // then hx / hids / hw
        counts.host_wait_ns += ns_since(t0);
      }
      if (link.stage && link.staged_at[li])  // the layer's guess for staging (posted before its router: there already)
        wait_for([&] { return f[4] >= v; }, t0, "post layer ", li, "'s expert guess");
      host_part(static_cast<size_t>(li), 1, true, false);
      std::atomic_thread_fence(std::memory_order_release);  // hout before the flag
      f[1] = v;
      if (deferring()) {  // this layer's deferred experts while the GPU goes on to the next layer
        deferred_sum(hdef_posted + (li % 2) * model.config().hidden_size, 1);
        std::atomic_thread_fence(std::memory_order_release);  // the row before the flag
        f[3] = v;
      }
      if (guessing && opts.host_prefetch > 0 && si + 1 < seg_layers.size()) {  // the next host layer's guess, while the GPU runs its mixer
        const unsigned nv = static_cast<unsigned>(seg_layers[si + 1]) + 1;
        wait_for([&] { return f[4] >= nv || f[0] >= nv; }, std::chrono::steady_clock::now(), "post layer ", nv - 1, "'s expert guess");
        if (f[0] < nv) {  // the real choice has not come yet: worth reading ahead
          TraceSpan span("prefetch guessed experts, layer", "cpu", static_cast<int>(nv - 1));
          opts.host_experts->prefetch(static_cast<int>(nv - 1), hgids, std::min(opts.host_prefetch, model.config().num_experts_per_tok),
                                      [f, nv] { return f[0] >= nv; });  // until the router's result is in
        }
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
