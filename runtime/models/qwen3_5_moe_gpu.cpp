// The Qwen3.5-MoE forward on one GPU (see qwen3_5_moe_gpu.h): weights are planned, then uploaded
// into one device allocation; the decode step (eager or as a CUDA graph) and the public API. The layer
// walk mirrors Qwen35Moe::forward step by step. Batched prefill: qwen3_5_moe_gpu_prefill.cpp; the
// hybrid handoff: qwen3_5_moe_gpu_hybrid.cpp; streamed prefill: qwen3_5_moe_gpu_stream.cpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>

#include "gpu_core/handoff.cuh"
#include "gpu_core/int4_layout.h"
#include "gpu_core/ops.cuh"
#include "runtime/bytes.h"
#include "runtime/models/qwen3_5_moe_gpu_impl.h"
#include "runtime/progress.h"

namespace tandem {

namespace {

enum class Kind { Dense, Experts, Kv, State, Work };

}  // namespace

// Two passes over the same upload code: first it only counts bytes per kind (plan), then it
// allocates from one device block and copies (commit).
class Uploader {
 public:
  bool committing() const { return base_ != nullptr; }
  uint64_t placed() const { return offset_; }  // committing: bytes handed out so far
  void begin_commit(char* base) { base_ = base, offset_ = 0; }
  GpuMemoryPlan& plan() { return plan_; }

  void* alloc(uint64_t bytes, Kind kind) {
    bytes = (bytes + 255) / 256 * 256;
    if (!committing()) {
      (kind == Kind::Dense ? plan_.dense_weights : kind == Kind::Experts ? plan_.expert_weights
       : kind == Kind::Kv ? plan_.kv_cache : kind == Kind::State ? plan_.deltanet_state : plan_.workspace) += bytes;
      return nullptr;
    }
    void* p = base_ + offset_;
    offset_ += bytes;
    return p;
  }
  template <typename T>
  T* upload(const T* host, size_t count, Kind kind) {
    auto* d = static_cast<T*>(alloc(count * sizeof(T), kind));
    if (d) CK(cudaMemcpy(d, host, count * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  template <typename T>
  T* zeros(size_t count, Kind kind) {
    auto* d = static_cast<T*>(alloc(count * sizeof(T), kind));
    if (d) CK(cudaMemset(d, 0, count * sizeof(T)));
    return d;
  }

 private:
  char* base_ = nullptr;
  uint64_t offset_ = 0;
  GpuMemoryPlan plan_;
};

namespace {

// An int4 (GPTQ) linear's device pieces in the GPU layout (qweight, scales, zeros, perm with act
// order), allocated in that order; null pointers while the uploader only sizes.
DevLinear alloc_int4(Uploader& up, const LinearWeight& L, Kind kind) {
  DevLinear d;
  d.out = L.out;
  d.in = L.in;
  d.int4 = true;
  const int64_t G = L.gptq.num_groups;
  d.q.qweight = static_cast<uint32_t*>(up.alloc(L.out * L.in / 2, kind));
  d.q.scales = static_cast<uint16_t*>(up.alloc(L.out * G * 2, kind));
  d.q.zeros = static_cast<uint8_t*>(up.alloc(L.out * G, kind));
  d.q.perm = L.gptq.g_idx ? static_cast<int32_t*>(up.alloc(L.in * 4, kind)) : nullptr;
  d.q.N = L.out, d.q.K = L.in, d.q.group_size = L.gptq.group_size;
  return d;
}

// L repacked into the GPU layout (gpu::repack_gptq_int4, the expensive part) and copied into d's pieces.
void fill_int4(const LinearWeight& L, const DevLinear& d) {
  if (L.gptq.scales_dtype != DType::F16) fail(L.name, ": the GPU path needs F16 GPTQ scales (found ", dtype_name(L.gptq.scales_dtype), ")");
  const gpu::Int4Host h = gpu::repack_gptq_int4({L.gptq.qweight, L.gptq.qzeros, static_cast<const uint16_t*>(L.gptq.scales),
                                                 L.gptq.g_idx, L.out, L.in, L.gptq.group_size, L.gptq.zero_offset});
  auto copy = [&](const void* dst, const auto& v, uint64_t bytes) {  // the views hold the pieces as const (kernels read them)
    if (v.size() * sizeof(v[0]) != bytes) fail(L.name, ": repacked to ", v.size() * sizeof(v[0]), " bytes, ", bytes, " planned");
    CK(cudaMemcpy(const_cast<void*>(dst), v.data(), bytes, cudaMemcpyHostToDevice));
  };
  const uint64_t G = static_cast<uint64_t>(L.gptq.num_groups), N = static_cast<uint64_t>(L.out);
  copy(d.q.qweight, h.qweight, N * static_cast<uint64_t>(L.in) / 2);
  copy(d.q.scales, h.scales, N * G * 2);
  copy(d.q.zeros, h.zeros, N * G);
  if (d.q.perm) copy(d.q.perm, h.perm, static_cast<uint64_t>(L.in) * 4);
}

// Int4 linears repacked and copied on all host threads (each a ~ms of CPU work; a 35B model has 30,720
// expert matrices). The first failure is rethrown here once every thread has stopped.
void fill_int4_parallel(const std::vector<std::pair<const LinearWeight*, DevLinear>>& jobs) {
  int dev = 0;
  CK(cudaGetDevice(&dev));
  std::exception_ptr first;
  std::atomic<bool> failed{false};
#pragma omp parallel
  {
    if (cudaSetDevice(dev) != cudaSuccess) failed = true;  // the model's device on every worker thread
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (failed.load(std::memory_order_relaxed)) continue;
      try {
        fill_int4(*jobs[i].first, jobs[i].second);
      } catch (...) {
#pragma omp critical(tandem_fill_int4)
        if (!first) first = std::current_exception();
        failed = true;
      }
    }
  }
  if (first) std::rethrow_exception(first);
  if (failed) fail("uploading int4 experts: could not select CUDA device ", dev, " on a loader thread");
}

DevLinear upload_linear(Uploader& up, const LinearWeight& L, Kind kind) {
  DevLinear d;
  d.out = L.out;
  d.in = L.in;
  if (L.kind == LinearWeight::Kind::Gptq) {
    d = alloc_int4(up, L, kind);
    if (up.committing()) fill_int4(L, d);  // sizes only otherwise: repacking is the expensive part
    return d;
  }
  const size_t n = static_cast<size_t>(L.out * L.in);
  if (!up.committing()) {
    up.alloc(n * 2, kind);
    return d;
  }
  if (L.dense_dtype == DType::BF16) {
    d.w = up.upload(static_cast<const uint16_t*>(L.dense), n, kind);
    return d;
  }
  std::vector<uint16_t> bf(n);  // F16 / F32 checkpoint tensors are kept as bf16 on the GPU
  for (size_t i = 0; i < n; ++i) bf[i] = f32_to_bf16(load_as_f32(L.dense, L.dense_dtype, static_cast<int64_t>(i)));
  d.w = up.upload(bf.data(), n, kind);
  return d;
}

}  // namespace

DevLinear stack_rows(std::initializer_list<const DevLinear*> parts) {
  const DevLinear* first = *parts.begin();
  DevLinear s{false, first->w, {}, 0, first->in};
  const DevLinear* prev = nullptr;
  for (const DevLinear* p : parts) {
    if (p->int4 || p->in != first->in || !p->w) return {};
    // the output slices are carved at multiples of 4 floats (aligned for vector loads); the rows
    // of one allocation follow the previous one's only when its bytes need no 256-byte padding
    if (prev && (prev->out % 4 || (prev->out * prev->in * 2) % 256 || p->w != prev->w + prev->out * prev->in)) return {};
    s.out += p->out;
    prev = p;
  }
  return s;
}

std::string GpuMemoryPlan::describe() const {
  return str_cat("dense weights ", format_gib(dense_weights), ", routed experts ", format_gib(expert_weights), ", KV cache ", format_gib(kv_cache),
                 ", DeltaNet state ", format_gib(deltanet_state), ", workspace ", format_gib(workspace), "; total ", format_gib(total()));
}

void Qwen35MoeGpu::Impl::build(Uploader& up, const std::function<void(uint64_t)>& uploaded) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, conv_dim = c.linear_conv_dim(), Vd = c.linear_value_dim();
  const int64_t I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size, E = c.num_experts;
  const int k = c.num_experts_per_tok, nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  const int max_splits = static_cast<int>((opts.max_context + 255) / 256);

  auto vec = [&](const std::vector<float>& v, Kind kind) { return up.upload(v.data(), v.size(), kind); };
  if (!opts.embed_on_gpu) {
    embed = nullptr;  // rows are looked up on the host
  } else if (model.embed().dense_dtype != DType::BF16) {
    DevLinear e = upload_linear(up, model.embed(), Kind::Dense);
    embed = e.w;
  } else {
    embed = up.upload(static_cast<const uint16_t*>(model.embed().dense), static_cast<size_t>(V * H), Kind::Dense);
  }
  // A tied lm_head reads the embedding table when that is on the GPU (stored as bf16 either way).
  lm_head = model.lm_head().dense == model.embed().dense && opts.embed_on_gpu ? DevLinear{false, embed, {}, V, H}
                                                                            : upload_linear(up, model.lm_head(), Kind::Dense);
  final_norm = vec(model.final_norm(), Kind::Dense);
  inv_freq = vec(model.rope_inv_freq(), Kind::Dense);

  // Streamed prefill's buffers (stream_setup decided; gpu::stream_buffer_bytes counts the same).
  if (st.on) {
    st.pass = gpu::stream_pass_tokens(opts.prefill_chunk, opts.stream_pass_tokens);
    const gpu::StreamBuffers b =
        gpu::stream_buffer_bytes(H, I, st.group_size, static_cast<int>(E), static_cast<int>(c.num_layers), st.max_experts, st.pass);
    st.raw = static_cast<char*>(up.alloc(b.raw, Kind::Work));
    st.rows = static_cast<char*>(up.alloc(b.rows, Kind::Work));
    st.tables = static_cast<gpu::Int4Expert*>(up.alloc(b.tables, Kind::Work));
    st.jobs = static_cast<gpu::Int4TilesToRows*>(up.alloc(b.jobs, Kind::Work));
    st.h = static_cast<float*>(up.alloc(st.pass * H * 4, Kind::Work));
    st.pos = static_cast<int32_t*>(up.alloc(st.pass * 4, Kind::Work));
    st.ids = static_cast<int32_t*>(up.alloc(st.pass * 4, Kind::Work));
  }
  layers.clear();
  if (opts.expert_on_gpu && !opts.expert_on_gpu->empty()) {
    if (static_cast<int64_t>(opts.expert_on_gpu->size()) != c.num_layers) fail("hybrid placement: expert map has ", opts.expert_on_gpu->size(), " layers, the model ", c.num_layers);
    for (const auto& row : *opts.expert_on_gpu)
      if (static_cast<int64_t>(row.size()) != E) fail("hybrid placement: expert map has ", row.size(), " experts per layer, the model ", E);
  }
  for (const LayerWeights& L : model.layers()) {
    const int li = static_cast<int>(layers.size());
    DevLayer d{};
    d.kind = L.kind;
    d.in_norm = vec(L.input_norm, Kind::Dense);
    d.post_norm = vec(L.post_attention_norm, Kind::Dense);
    if (L.kind == LayerKind::LinearAttention) {
      const DeltaNetWeights& w = L.deltanet;
      d.qkv = upload_linear(up, w.in_proj_qkv, Kind::Dense);
      d.z = upload_linear(up, w.in_proj_z, Kind::Dense);
      d.b = upload_linear(up, w.in_proj_b, Kind::Dense);
      d.a = upload_linear(up, w.in_proj_a, Kind::Dense);
      d.out_proj = upload_linear(up, w.out_proj, Kind::Dense);
      d.in_proj = stack_rows({&d.qkv, &d.z, &d.b, &d.a});
      d.conv_w = vec(w.conv, Kind::Dense);
      d.A_log = vec(w.A_log, Kind::Dense);
      d.dt_bias = vec(w.dt_bias, Kind::Dense);
      d.dn_norm = vec(w.norm, Kind::Dense);
      d.conv_state = up.zeros<float>((c.linear_conv_kernel - 1) * conv_dim, Kind::State);
      d.ssm_state = up.zeros<float>(int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim, Kind::State);
    } else {
      const AttentionWeights& w = L.attn;
      d.q = upload_linear(up, w.q_proj, Kind::Dense);
      d.k = upload_linear(up, w.k_proj, Kind::Dense);
      d.v = upload_linear(up, w.v_proj, Kind::Dense);
      d.o = upload_linear(up, w.o_proj, Kind::Dense);
      d.in_proj = stack_rows({&d.q, &d.k, &d.v});
      d.q_norm = vec(w.q_norm, Kind::Dense);
      d.k_norm = vec(w.k_norm, Kind::Dense);
      d.k_cache = up.zeros<uint16_t>(opts.max_context * nkv * hd, Kind::Kv);
      d.v_cache = up.zeros<uint16_t>(opts.max_context * nkv * hd, Kind::Kv);
    }
    const MoeWeights& m = L.moe;
    d.router = upload_linear(up, m.router, Kind::Dense);
    d.sh_gate = upload_linear(up, m.shared_gate, Kind::Dense);
    d.sh_up = upload_linear(up, m.shared_up, Kind::Dense);
    d.sh_expert_gate = upload_linear(up, m.shared_expert_gate, Kind::Dense);  // before sh_down: stacked with the three above
    d.sh_down = upload_linear(up, m.shared_down, Kind::Dense);
    d.x_proj = stack_rows({&d.router, &d.sh_gate, &d.sh_up, &d.sh_expert_gate});
    d.int4_experts = m.gate[0].kind == LinearWeight::Kind::Gptq;
    d.expert_group = d.int4_experts ? m.gate[0].gptq.group_size : 0;
    std::vector<gpu::Int4Expert> i4(E);
    std::vector<gpu::Bf16Expert> b16(E);
    std::vector<std::pair<const LinearWeight*, DevLinear>> repack;  // int4 experts: filled in parallel below
    for (int64_t e = 0; e < E; ++e) {
      if (!on_gpu(li, e)) {  // null pointers: the kernels skip it, the host computes it
        d.cpu_experts = true;
        continue;
      }
      for (const LinearWeight* w : {&m.gate[e], &m.up[e], &m.down[e]})
        if ((w->kind == LinearWeight::Kind::Gptq) != d.int4_experts || (d.int4_experts && w->gptq.group_size != d.expert_group))
          fail(w->name, ": the GPU MoE kernels need every expert of a layer in one format and group size");
      if (d.int4_experts) {  // the same pieces in the same order as upload_linear, the repacking deferred
        const DevLinear g = alloc_int4(up, m.gate[e], Kind::Experts), u = alloc_int4(up, m.up[e], Kind::Experts),
                        dn = alloc_int4(up, m.down[e], Kind::Experts);
        if (up.committing()) repack.insert(repack.end(), {{&m.gate[e], g}, {&m.up[e], u}, {&m.down[e], dn}});
        i4[e] = {g.q, u.q, dn.q};
        continue;
      }
      const DevLinear g = upload_linear(up, m.gate[e], Kind::Experts), u = upload_linear(up, m.up[e], Kind::Experts),
                      dn = upload_linear(up, m.down[e], Kind::Experts);
      b16[e] = {g.w, u.w, dn.w};
    }
    fill_int4_parallel(repack);
    if (d.int4_experts) d.experts_i4 = up.upload(i4.data(), i4.size(), Kind::Experts);
    else d.experts_bf16 = up.upload(b16.data(), b16.size(), Kind::Experts);
    if (opts.replace.on() && up.committing()) {  // online re-placement edits the tables from host copies
      rp.i4.resize(li + 1), rp.b16.resize(li + 1), rp.stream_i4.resize(li + 1);
      rp.i4[li] = i4, rp.b16[li] = b16, rp.stream_i4[li] = i4;
    }
    if (streams(li) && up.committing()) stream_table(li, i4);
    layers.push_back(d);
    if (uploaded && up.committing()) uploaded(up.placed());
  }

  const int64_t wide = std::max({H, conv_dim, Vd, int64_t(nh) * 2 * hd, I * k, Is});
  auto ws = [&](int64_t n) { return up.zeros<float>(n, Kind::Work); };
  // The outputs of each stacked projection group (stack_rows) share one buffer, sliced at multiples
  // of 4 floats (placement/planner.cpp counts the same sizes).
  auto r4 = [](int64_t n) { return (n + 3) / 4 * 4; };
  const int64_t Hv = c.linear_num_value_heads, nh2 = int64_t(nh) * 2 * hd, kvd = int64_t(nkv) * hd;
  h = ws(H), x = ws(H), o = ws(H);
  qkv = ws(r4(conv_dim) + r4(Vd) + 2 * r4(Hv));
  z = qkv ? qkv + r4(conv_dim) : nullptr, b = z ? z + r4(Vd) : nullptr, a = b ? b + r4(Hv) : nullptr;
  core = ws(Vd), conv_out = ws(conv_dim);
  qg = ws(r4(nh2) + 2 * r4(kvd));
  kk = qg ? qg + r4(nh2) : nullptr, vv = kk ? kk + r4(kvd) : nullptr;
  q_rot = ws(int64_t(nh) * hd), attn_part = ws(int64_t(nh) * max_splits * (hd + 2)), attn_out = ws(int64_t(nh) * hd);
  router = ws(r4(E) + 2 * r4(Is) + r4(1));
  sg = router ? router + r4(E) : nullptr, su = sg ? sg + r4(Is) : nullptr, sgate = su ? su + r4(Is) : nullptr;
  moe_out = ws(H), hscratch = ws(I * k), sd = ws(H), logits = ws(V);
  xh = up.zeros<uint16_t>(wide, Kind::Work);
  ids = up.zeros<int32_t>(1, Kind::Work);
  topk_ids = up.zeros<int32_t>(k, Kind::Work);
  topk_w = ws(k);
  route_ticket = up.zeros<unsigned>(1, Kind::Work);
  dn_tickets = up.zeros<unsigned>(std::max<int64_t>(c.linear_num_value_heads, 1), Kind::Work);
  pos_dev = up.zeros<int32_t>(1, Kind::Work);
  cpu_out = ws(H);
  if (deferring()) def_dev = ws(host_rows() * H);  // the deferred experts' sum (hybrid)
  pen_dev = static_cast<gpu::Penalty*>(up.alloc(opts.max_context * sizeof(gpu::Penalty), Kind::Work));  // forward_top
  topk_ws = up.alloc(gpu::kTopKWorkspaceBytes, Kind::Work);
  top_ids = up.zeros<int32_t>(gpu::kMaxTopK, Kind::Work);
  top_vals = ws(gpu::kMaxTopK);
  if (wants_batched()) {
    const int64_t n = opts.prefill_chunk;
    const int64_t widest_k = std::max({H, Vd, int64_t(nh) * hd, Is, I});
    ph = ws(n * H), px = ws(n * H), po = ws(n * H), pqkv = ws(n * conv_dim), pz = ws(n * Vd), pb = ws(n * c.linear_num_value_heads),
    pa = ws(n * c.linear_num_value_heads), pcore = ws(n * Vd), pconv = ws(n * conv_dim), pqg = ws(n * nh2), pk = ws(n * kvd),
    pv = ws(n * kvd), pattn = ws(n * int64_t(nh) * hd), prouter = ws(n * E), pmoe = ws(n * H), psg = ws(n * Is), psu = ws(n * Is),
    psd = ws(n * H), psgate = ws(n), ptopk_w = ws(n * k), pcpu = ws(n * H);
    phs = up.zeros<uint16_t>(n * k * I * 2, Kind::Work);  // fp16 (int4 experts) or fp32 (bf16 experts) h
    psplit = up.zeros<uint16_t>(2 * n * widest_k, Kind::Work);
    pxh = up.zeros<uint16_t>(n * wide, Kind::Work);
    pids = up.zeros<int32_t>(n, Kind::Work);
    ppos = up.zeros<int32_t>(n, Kind::Work);
    ptopk_ids = up.zeros<int32_t>(n * k, Kind::Work);
    blas_ws = up.alloc(gpu::kBlasWorkspaceBytes, Kind::Work);
    if (c.linear_num_value_heads > 0) pterms = ws(gpu::deltanet_chunk_terms_floats(n, c.linear_num_value_heads));
    if (!model.layers().empty() && !model.layers()[0].moe.gate.empty() &&
        model.layers()[0].moe.gate[0].kind == LinearWeight::Kind::Gptq)  // grouped int4 experts
      pgroup = up.alloc(gpu::moe_int4_grouped_workspace(n, k, H, I, static_cast<int>(E)), Kind::Work);
  }
}

// The layer's weights and state in the kernels' argument blocks; callers add the activations.
gpu::DeltaNetDecodeArgs Qwen35MoeGpu::Impl::deltanet_args(const DevLayer& L) const {
  const ModelConfig& c = model.config();
  gpu::DeltaNetDecodeArgs p;
  p.conv_w = L.conv_w, p.conv_state = L.conv_state, p.A_log = L.A_log, p.dt_bias = L.dt_bias, p.norm_w = L.dn_norm;
  p.state = L.ssm_state;
  p.Hk = c.linear_num_key_heads, p.Hv = c.linear_num_value_heads, p.dk = c.linear_key_head_dim, p.dv = c.linear_value_head_dim;
  p.kernel = c.linear_conv_kernel, p.eps = static_cast<float>(c.rms_norm_eps);
  return p;
}

gpu::AttentionDecodeArgs Qwen35MoeGpu::Impl::attention_args(const DevLayer& L) const {
  const ModelConfig& c = model.config();
  gpu::AttentionDecodeArgs p;
  p.q_norm = L.q_norm, p.k_norm = L.k_norm, p.inv_freq = inv_freq, p.k_cache = L.k_cache, p.v_cache = L.v_cache;
  p.nh = c.num_heads, p.nkv = c.num_kv_heads, p.hd = c.head_dim, p.rotary_dim = c.rotary_dim;
  p.max_ctx = static_cast<int>(opts.max_context), p.max_splits = static_cast<int>((opts.max_context + 255) / 256);
  p.eps = static_cast<float>(c.rms_norm_eps), p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return p;
}

void Qwen35MoeGpu::Impl::linear(const DevLinear& L, const float* in, float* out) {
  if (L.int4) {
    CK(gpu::gather_x_half(in, L.q.perm, L.in, 1, xh, stream));
    CK(gpu::gemv_int4(L.q, xh, 1, out, stream));
  } else {
    CK(gpu::gemv_bf16(L.w, L.out, L.in, in, 1, out, stream));
  }
}

void Qwen35MoeGpu::Impl::trace_begin(Trace* tr) {
  if (!tr || !tev.empty()) return;
  tev.resize(layers.size() * kMarks);
  for (cudaEvent_t& e : tev) CK(cudaEventCreate(&e));
  CK(cudaEventCreate(&tbase));
  CK(cudaStreamSynchronize(stream));
  CK(cudaEventRecord(tbase, stream));
  CK(cudaEventSynchronize(tbase));
  tbase_us = tr->now_us();  // the base event completed just now (an idle stream: within a few µs)
}

void Qwen35MoeGpu::Impl::trace_end(Trace* tr) {
  if (!tr) return;
  CK(cudaStreamSynchronize(stream));
  auto at = [&](size_t i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, tbase, tev[i]));
    return tbase_us + ms * 1e3;
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    const size_t b = l * kMarks;
    tr->gpu_span(str_cat(layers[l].kind == LayerKind::FullAttention ? "attention " : "deltanet ", l), "gpu", at(b), at(b + 1));
    tr->gpu_span(str_cat("router + handoff ", l), "gpu", at(b + 1), at(b + 2));
    tr->gpu_span(str_cat("gpu experts + shared ", l), "gpu", at(b + 2), at(b + 3));
    if (layers[l].cpu_experts) tr->gpu_span(str_cat("cpu result in ", l), "copy", at(b + 3), at(b + 4));
  }
}

// One decode step: eagerly (trace, hybrid handoffs, host embedding) or as a captured CUDA graph
// (GpuOptions::cuda_graph, everything on the GPU): the same enqueue() either way.
void Qwen35MoeGpu::Impl::step(int32_t id, float* logits_host) {
  replace_tick();
  Trace* tr = Trace::active();
  const ModelConfig& c = model.config();
  if (graph_ok && !tr) {
    hidpos[0] = id, hidpos[1] = static_cast<int32_t>(pos);  // the previous launch has finished (synchronized)
    const int w = !logits_host ? 0 : logits_host == &logits_sink ? 2 : 1;
    if (segs[w].empty()) capture(w);
    if (one_graph) {
      run_one_graph(w);
    } else {
      for (size_t i = 0; i < segs[w].size(); ++i) {
        CK(cudaGraphLaunch(segs[w][i], stream));
        if (i < seg_layers.size()) host_part(static_cast<size_t>(seg_layers[i]), 1, true);
      }
      CK(cudaStreamSynchronize(stream));
    }
    if (w == 1) std::memcpy(logits_host, hlogits, c.vocab_size * sizeof(float));
    counts.gpu += static_cast<uint64_t>(c.num_experts_per_tok) * gpu_only_layers;
    ++pos;
    return;
  }
  trace_begin(tr);
  const int32_t p32 = static_cast<int32_t>(pos);
  enqueue(id, &id, &p32, logits_host, tr);
  ++pos;
  trace_end(tr);
  if (logits_host) CK(cudaStreamSynchronize(stream));
}

// Captures segs[w] (0 without logits, 1 with logits copied to hlogits, 2 with logits left on the
// device): the step as CUDA graphs, cut at every host handoff (one graph when there is none).
void Qwen35MoeGpu::Impl::capture(int w) {
  const ExpertCounts saved = counts;  // enqueue() counts on the host; replays count in step()
  seg_layers.clear();
  (one_graph ? posting : segmenting) = true;
  seg_out = &segs[w];
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue(0, hidpos, hidpos + 1, w == 0 ? nullptr : w == 1 ? hlogits : &logits_sink, nullptr);
    cut_segment(false);
  } catch (...) {  // leave the stream usable: end the capture, drop the partial segments
    abandon_capture();
    for (cudaGraphExec_t e : segs[w]) cudaGraphExecDestroy(e);
    segs[w].clear();
    segmenting = posting = false;
    throw;
  }
  segmenting = posting = false;
  seg_out = nullptr;
  counts = saved;
}

// After a failure under capture: end it (the partial graph is dropped) and clear the error.
void Qwen35MoeGpu::Impl::abandon_capture() {
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();
}

// Ends the capture in progress as the next segment; `more`: start capturing the one after it.
void Qwen35MoeGpu::Impl::cut_segment(bool more) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  CK(cudaStreamEndCapture(stream, &g));
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphDestroy(g));
  seg_out->push_back(e);
  if (more) CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

// Queues one token's work on the stream: id / position copied from id_src / pos_src (host memory),
// logits (when logits_dst) copied to logits_dst. Host-side waits only for hybrid handoffs and the
// host embedding (neither is captured in a graph).
void Qwen35MoeGpu::Impl::enqueue(int32_t id, const int32_t* id_src, const int32_t* pos_src, float* logits_dst, Trace* tr) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size;
  const int k = c.num_experts_per_tok;
  const float eps = static_cast<float>(c.rms_norm_eps);
  CK(cudaMemcpyAsync(ids, id_src, 4, cudaMemcpyHostToDevice, stream));
  CK(cudaMemcpyAsync(pos_dev, pos_src, 4, cudaMemcpyHostToDevice, stream));
  if (embed) {
    CK(gpu::embed_bf16(embed, H, ids, 1, h, stream));
  } else {
    host_embedding_rows(&id, 1, h);
  }
  // The residual update that ends each block (h += attention/DeltaNet output; h += MoE output +
  // the gated shared expert) runs fused with the norm that follows it (add_rmsnorm_zc).
  struct Residual {
    const float *a = nullptr, *shared = nullptr, *gate = nullptr;
  } pending;
  int deferred_from = -1;  // one graph with deferral: the layer whose deferred host sum joins at the end of this one
  auto norm_x = [&](const float* w) {
    if (pending.a) CK(gpu::add_rmsnorm_zc(h, pending.a, pending.shared, pending.gate, w, H, 1, eps, x, stream));
    else CK(gpu::rmsnorm_zc(h, w, H, 1, eps, x, stream));
    pending = {};
  };
  // The input norm and the stacked bf16 input projection in one launch (GpuOptions::in_norm_gemv).
  auto norm_in_proj = [&](const DevLayer& L, float* y) {
    CK(gpu::gemv_bf16_norm(L.in_proj.w, L.in_proj.out, L.in_proj.in, h, pending.a, pending.shared, pending.gate, L.in_norm, eps, x, y,
                           route_ticket, stream));
    pending = {};
  };
  for (size_t li = 0; li < layers.size(); ++li) {
    const DevLayer& L = layers[li];
    mark(tr, li, 0);
    const bool conv_in_gemv = L.kind == LayerKind::LinearAttention && opts.deltanet_conv_in_gemv && L.in_proj.out && !L.in_proj.int4;
    const bool in_norm_gemv = opts.in_norm_gemv && !conv_in_gemv && L.in_proj.out && !L.in_proj.int4;
    if (!in_norm_gemv) norm_x(L.in_norm);
    if (L.kind == LayerKind::LinearAttention) {
      if (in_norm_gemv) {
        norm_in_proj(L, qkv);  // qkv|z|b|a, as laid out in the workspace
      } else if (conv_in_gemv) {  // qkv|z|b|a; the conv of the qkv rows applied as they are written
        CK(gpu::gemv_bf16_conv(L.in_proj.w, L.in_proj.out, L.in_proj.in, x, qkv, static_cast<int>(c.linear_conv_dim()),
                               c.linear_conv_kernel, L.conv_w, L.conv_state, conv_out, stream));
      } else if (L.in_proj.out) {
        linear(L.in_proj, x, qkv);  // qkv|z|b|a, as laid out in the workspace
      } else {
        linear(L.qkv, x, qkv);
        linear(L.z, x, z);
        linear(L.b, x, b);
        linear(L.a, x, a);
      }
      gpu::DeltaNetDecodeArgs p = deltanet_args(L);
      p.qkv = qkv, p.z = z, p.b = b, p.a = a, p.conv_out = conv_out, p.out = core;
      if (opts.deltanet_split) p.tickets = dn_tickets;
      p.conv_done = conv_in_gemv;
      CK(gpu::deltanet_decode(p, stream));
      linear(L.out_proj, core, o);
    } else {
      if (in_norm_gemv) {
        norm_in_proj(L, qg);  // q|k|v
      } else if (L.in_proj.out) {
        linear(L.in_proj, x, qg);  // q|k|v
      } else {
        linear(L.q, x, qg);
        linear(L.k, x, kk);
        linear(L.v, x, vv);
      }
      gpu::AttentionDecodeArgs p = attention_args(L);
      p.qg = qg, p.k = kk, p.v = vv, p.pos = pos_dev, p.q_rot = q_rot, p.partial = attn_part, p.out = attn_out;
      CK(gpu::attention_decode(p, stream));
      linear(L.o, attn_out, o);
    }
    pending.a = o;
    mark(tr, li, 1);
    // router|shared gate|shared up|shared expert gate stacked, or the router alone; bf16: top-k in the
    // GEMV's last block (and with GpuOptions::router_norm the norm before it in the same launch)
    const DevLinear& R = L.x_proj.out ? L.x_proj : L.router;
    if (!R.int4 && opts.router_norm) {
      CK(gpu::gemv_bf16_router_topk_norm(R.w, R.out, R.in, h, pending.a, pending.shared, pending.gate, L.post_norm, eps, x, router,
                                         static_cast<int>(c.num_experts), k, route_ticket, topk_ids, topk_w, stream));
      pending = {};
    } else if (!R.int4) {
      norm_x(L.post_norm);
      CK(gpu::gemv_bf16_router_topk(R.w, R.out, R.in, x, router, static_cast<int>(c.num_experts), k, route_ticket, topk_ids, topk_w,
                                    stream));
    } else {
      norm_x(L.post_norm);
      linear(R, x, router);
      CK(gpu::router_topk(router, c.num_experts, k, 1, topk_ids, topk_w, stream));
    }
    const bool split = L.cpu_experts && opts.host_experts;
    if (split && posting) {  // the host starts while the GPU goes on: posted in mapped memory, no copy nodes
      CK(gpu::host_post(x, H, topk_ids, topk_w, k, hx, hids, hw, hflags, static_cast<unsigned>(li) + 1, stream));
    } else if (split) {
      handoff_out(x, topk_ids, topk_w, 1);
    }
    mark(tr, li, 2);
    // GpuOptions::parallel_shared: the shared expert's down GEMV (its gate / up came with the router)
    // beside the routed experts, on the side stream; both only read x, sg, su and write their own rows.
    const bool beside = side && L.x_proj.out && !L.sh_down.int4 && !split && !deferring();
    if (beside) {
      CK(cudaEventRecord(fork_ev, stream));
      CK(cudaStreamWaitEvent(side, fork_ev, 0));
      CK(gpu::gemv_bf16_swiglu(L.sh_down.w, L.sh_down.out, L.sh_down.in, sg, su, 1, sd, side));
      CK(cudaEventRecord(join_ev, side));
    }
    gpu_experts(L, x, topk_ids, topk_w, 1, xh, hscratch, moe_out);
    if (!L.x_proj.out) {
      linear(L.sh_gate, x, sg);
      linear(L.sh_up, x, su);
      linear(L.sh_expert_gate, x, sgate);
    }
    if (beside) {
      CK(cudaStreamWaitEvent(stream, join_ev, 0));
    } else if (L.sh_down.int4) {
      CK(gpu::silu_mul(sg, su, c.shared_expert_intermediate_size, stream));
      linear(L.sh_down, sg, sd);
    } else {  // silu(gate) * up formed as sh_down reads it: one launch fewer
      CK(gpu::gemv_bf16_swiglu(L.sh_down.w, L.sh_down.out, L.sh_down.in, sg, su, 1, sd, stream));
    }
    if (split || deferring()) CK(gpu::gated_add(moe_out, sd, sgate, H, 1, stream));
    mark(tr, li, 3);
    if (!posting) run_deferred();  // the previous layer's, while the GPU works on this one (one graph: the host loop runs it)
    if (split && segmenting) {  // the host's part runs between this segment and the next (step())
      seg_layers.push_back(static_cast<int>(li));
      cut_segment(true);
      join_host(1, cpu_out, moe_out);
    } else if (split && posting) {  // wait inside the graph for the host's sum, added from host memory
      seg_layers.push_back(static_cast<int>(li));
      CK(gpu::host_wait_add(hflags + 1, static_cast<unsigned>(li) + 1, hout, moe_out, H, hflags + 2, kHandoffTimeoutNs, stream));
    } else if (split) {
      handoff_back(li, 1, cpu_out, moe_out);
    } else {
      counts.gpu += k;
    }
    if (deferring()) {  // the deferred sum joins after the MoE output, as the model definition adds them
      CK(gpu::add_inplace(h, moe_out, H, stream));
      if (posting) join_posted_deferred(deferred_from);
      else add_deferred(h);
      deferred_from = split && posting ? static_cast<int>(li) : -1;
    } else {
      pending = {moe_out, split ? nullptr : sd, split ? nullptr : sgate};
    }
    mark(tr, li, 4);
  }
  if (posting) {  // the last layer's join before the final norm
    join_posted_deferred(deferred_from);
  } else {
    run_deferred();
    add_deferred(h);
  }
  if (!logits_dst) {  // no norm follows: the last residual on its own
    if (pending.shared) CK(gpu::gated_add(moe_out, pending.shared, pending.gate, H, 1, stream));
    if (pending.a) CK(gpu::add_inplace(h, pending.a, H, stream));
    return;
  }
  norm_x(final_norm);
  linear(lm_head, x, logits);
  if (logits_dst != &logits_sink)
    CK(cudaMemcpyAsync(logits_dst, logits, c.vocab_size * sizeof(float), cudaMemcpyDeviceToHost, stream));
}


Qwen35MoeGpu::Qwen35MoeGpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Qwen35MoeGpu::~Qwen35MoeGpu() = default;
const GpuMemoryPlan& Qwen35MoeGpu::memory() const { return impl_->plan; }
const ExpertCounts& Qwen35MoeGpu::expert_counts() const { return impl_->counts; }
bool Qwen35MoeGpu::batched_prefill_active() const { return impl_->batched; }
int64_t Qwen35MoeGpu::prefill_chunk() const { return impl_->chunk; }

bool Qwen35MoeGpu::forward_top(std::span<const int32_t> ids, std::span<const gpu::Penalty> penalties, int k,
                               std::vector<std::pair<int32_t, float>>& top) {
  Impl& m = *impl_;
  const int64_t V = m.model.config().vocab_size;
  if (k < 1 || k > gpu::kMaxTopK || static_cast<int64_t>(penalties.size()) > m.opts.max_context ||
      (V + gpu::kTopKBlocks - 1) / gpu::kTopKBlocks * 8 > 48 * 1024)
    return false;
  forward(ids, &m.logits_sink, Qwen35Moe::LogitRows::Last);
  if (!penalties.empty())
    CK(cudaMemcpyAsync(m.pen_dev, penalties.data(), penalties.size() * sizeof(gpu::Penalty), cudaMemcpyHostToDevice, m.stream));
  CK(gpu::penalise(m.logits, V, m.pen_dev, static_cast<int>(penalties.size()), m.stream));
  CK(gpu::top_k_row(m.logits, V, k, m.topk_ws, m.top_ids, m.top_vals, m.stream));
  std::vector<int32_t> hi(k);
  std::vector<float> hv(k);
  CK(cudaMemcpyAsync(hi.data(), m.top_ids, k * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
  CK(cudaMemcpyAsync(hv.data(), m.top_vals, k * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
  CK(cudaStreamSynchronize(m.stream));
  top.resize(k);
  for (int i = 0; i < k; ++i) top[i] = {hi[i], hv[i]};
  return true;
}
bool Qwen35MoeGpu::cuda_graph_active() const { return impl_->graph_ok; }
int64_t Qwen35MoeGpu::stream_prefill_min_tokens() const { return impl_->st.on && impl_->batched ? impl_->opts.stream_prefill_min_tokens : 0; }
const std::string& Qwen35MoeGpu::stream_prefill_note() const { return impl_->st.note; }
bool Qwen35MoeGpu::graph_cut_at_handoffs() const {
  return impl_->graph_ok && !impl_->one_graph && impl_->gpu_only_layers < impl_->layers.size();
}
bool Qwen35MoeGpu::graph_one_step() const { return impl_->one_graph; }

std::unique_ptr<Qwen35MoeGpu> Qwen35MoeGpu::create(const Qwen35Moe& model, const GpuOptions& opts) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    fail("--device gpu: no CUDA device");
  }
  if (opts.max_context < 1 || opts.max_context > model.config().max_position_embeddings)
    fail("--context ", opts.max_context, " must be between 1 and the model's ", model.config().max_position_embeddings);
  auto impl = std::make_unique<Impl>(model, opts);
  impl->stream_setup();
  auto plan_with_chunk = [&](int64_t chunk) {
    impl->opts.prefill_chunk = chunk;
    Uploader up;
    impl->build(up);  // plan
    return up.plan();
  };
  impl->plan = plan_with_chunk(opts.prefill_chunk);
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t budget = opts.budget_bytes ? opts.budget_bytes : free_b;
  // prefill_chunk_max: the largest power-of-two multiple of prefill_chunk up to it whose workspace
  // still fits (no bigger than the context needs).
  for (int64_t c = opts.prefill_chunk_max; opts.batched_prefill && opts.prefill_chunk > 0 && c > opts.prefill_chunk; c /= 2) {
    if (c / 2 >= opts.max_context) continue;
    const GpuMemoryPlan p = plan_with_chunk(c);
    if (p.total() <= std::min<uint64_t>(budget, free_b)) {
      impl->plan = p;
      break;
    }
    impl->opts.prefill_chunk = opts.prefill_chunk;
  }
  if (impl->opts.prefill_chunk == opts.prefill_chunk) impl->plan = plan_with_chunk(opts.prefill_chunk);
  if (impl->plan.total() > budget)
    fail("the model needs ", format_gib(impl->plan.total()), " of GPU memory at context ", opts.max_context, " (",
         impl->plan.describe(), ") but the budget is ", format_gib(budget),
         opts.budget_bytes ? " (" + opts.budget_name + ")" : std::string(" (free device memory)"), "; raise ",
         opts.budget_bytes ? opts.budget_name : std::string("--gpu-mem"), ", lower --context",
         opts.host_experts ? "" : ", or use --device hybrid");
  if (impl->plan.total() > free_b) fail("the model needs ", format_gib(impl->plan.total()), " of GPU memory but only ", format_gib(free_b), " is free");
  CK(cudaMalloc(&impl->arena, impl->plan.total()));
  CK(cudaStreamCreate(&impl->stream));
  if (opts.parallel_shared) {
    CK(cudaStreamCreateWithFlags(&impl->side, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&impl->fork_ev, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&impl->join_ev, cudaEventDisableTiming));
  }
  if (impl->st.on) {
    CK(cudaStreamCreateWithFlags(&impl->st.copy, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&impl->st.ready, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&impl->st.free, cudaEventDisableTiming));
  }
  const int64_t H = model.config().hidden_size, k = model.config().num_experts_per_tok;
  CK(cudaEventCreateWithFlags(&impl->routed, cudaEventDisableTiming));
  // Pointers into the arena exist only after the commit pass below; until then decide from the options.
  const int64_t rows = impl->host_rows();  // tokens handed to the host at once
  // Mapped when a step's handoffs may run inside its graph (kernels read and write them in place).
  const unsigned handoff_flags = opts.hybrid_one_graph ? cudaHostAllocMapped : cudaHostAllocDefault;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hx), rows * H * sizeof(float), handoff_flags));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hout), rows * H * sizeof(float), handoff_flags));
  if (!opts.embed_on_gpu && impl->wants_batched())  // prompt rows are gathered on the host
    impl->hembed_rows = std::max(impl->opts.prefill_chunk, impl->st.pass);  // st.pass: set by the last plan pass
  CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hembed), impl->hembed_rows * H * sizeof(float), cudaHostAllocDefault));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hw), rows * k * sizeof(float), handoff_flags));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hids), rows * k * sizeof(int32_t), handoff_flags));
  impl->masked.assign(rows * k, -1);
  if (impl->deferring()) {
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hdef), rows * H * sizeof(float), cudaHostAllocDefault));
    CK(cudaEventCreateWithFlags(&impl->def_copied, cudaEventDisableTiming));
  }
  Uploader commit;
  commit.begin_commit(impl->arena);
  {  // a progress line when the upload is large (the 35B model: ~20 GB)
    Progress progress(opts.progress && impl->plan.total() >= (uint64_t(1) << 30) ? opts.progress : nullptr, impl->plan.total(), "to GPU");
    const auto t0 = std::chrono::steady_clock::now();
    auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    impl->build(commit, [&](uint64_t placed) { progress.show(placed, secs(), false); });
    CK(cudaDeviceSynchronize());
    progress.show(impl->plan.total(), secs(), true);
  }
  impl->replace_setup();
  impl->batched = impl->wants_batched() && impl->ph;
  impl->chunk = impl->opts.prefill_chunk;
  if (impl->batched) {
    CK(gpu::blas_create(&impl->blas));
    CK(gpu::blas_set_workspace(impl->blas, impl->blas_ws, gpu::kBlasWorkspaceBytes));
  }
  for (const DevLayer& L : impl->layers) impl->gpu_only_layers += !(L.cpu_experts && opts.host_experts);
  const bool host_layers = impl->gpu_only_layers < impl->layers.size();
  auto device_attribute = [](cudaDeviceAttr what) {
    int dev = 0, v = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&v, what, dev));
    return v;
  };
  // One graph a step with the handoffs inside: kernels read and write hx / hids / hw / hout / hflags in
  // place (mapped; with unified addressing the host pointers are the device's too; without it, the cut
  // graphs). Deferred host work joins a layer late: inside one graph it is one more wait (on hflags[3]),
  // across cut graphs it cannot be, so those steps stay eager.
  const bool one_graph = opts.cuda_graph && impl->embed && opts.hybrid_one_graph && host_layers &&
                         device_attribute(cudaDevAttrUnifiedAddressing);
  impl->graph_ok = opts.cuda_graph && impl->embed && !(impl->deferring() && host_layers && !one_graph);
  impl->one_graph = impl->graph_ok && one_graph;
  if (impl->one_graph) {
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hflags), 4 * sizeof(unsigned), cudaHostAllocMapped));
    std::memset(impl->hflags, 0, 4 * sizeof(unsigned));
    if (impl->deferring()) {  // two rows, by layer parity: the host fills layer L + 1's while the GPU may still read layer L's
      CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hdef_posted), 2 * H * sizeof(float), cudaHostAllocMapped));
      std::memset(impl->hdef_posted, 0, 2 * H * sizeof(float));
    }
  }
  if (impl->graph_ok) {
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hidpos), 2 * sizeof(int32_t), cudaHostAllocDefault));
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hlogits), model.config().vocab_size * sizeof(float), cudaHostAllocDefault));
  }
  return std::unique_ptr<Qwen35MoeGpu>(new Qwen35MoeGpu(std::move(impl)));
}

namespace {

// Fastest of `reps` (after one warm-up) timed copies of `bytes` on `stream`, in seconds.
double best_copy_seconds(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, int reps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int i = 0; i <= reps; ++i) {
    CK(cudaEventRecord(e0, stream));
    CK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best * 1e-3;
}

}  // namespace

double Qwen35MoeGpu::copy_bandwidth() const {
  const size_t bytes = size_t(256) << 20;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  const double s = best_copy_seconds(b, a, bytes, cudaMemcpyDeviceToDevice, impl_->stream, 5);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / s;  // read + write
}

double Qwen35MoeGpu::pcie_bandwidth() const {
  const size_t bytes = size_t(256) << 20;
  void *host = nullptr, *dev = nullptr;
  CK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, bytes));
  std::memset(host, 1, bytes);
  const double s = best_copy_seconds(dev, host, bytes, cudaMemcpyHostToDevice, impl_->stream, 3);
  cudaFree(dev);
  cudaFreeHost(host);
  return bytes / s;
}

void Qwen35MoeGpu::reset() {
  Impl& m = *impl_;
  m.pos = 0;
  m.counts = {};
  m.def.pending = m.def.ready = false;
  for (DevLayer& L : m.layers) {
    const ModelConfig& c = m.model.config();
    if (L.kind == LayerKind::LinearAttention) {
      CK(cudaMemsetAsync(L.conv_state, 0, (c.linear_conv_kernel - 1) * c.linear_conv_dim() * sizeof(float), m.stream));
      CK(cudaMemsetAsync(L.ssm_state, 0,
                         int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * sizeof(float), m.stream));
    }
  }
  CK(cudaStreamSynchronize(m.stream));
}

void Qwen35MoeGpu::forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows) {
  Impl& m = *impl_;
  const int64_t V = m.model.config().vocab_size, T = static_cast<int64_t>(ids.size());
  for (int64_t t = 0; t < T; ++t)  // checked before any work, so a bad call leaves the sequence as it was
    if (ids[t] < 0 || ids[t] >= V) fail("token id ", ids[t], " at position ", t, " is outside the vocabulary (0..", V - 1, ")");
  if (m.pos + T > m.opts.max_context) fail("the sequence reached the context limit of ", m.opts.max_context, " tokens (--context)");
  if (m.batched && T > 1 && rows == Qwen35Moe::LogitRows::Last && !Trace::active()) {
    for (int64_t t = 0, n = 0; t < T; t += n) {
      const bool streamed = m.st.on && T - t >= m.opts.stream_prefill_min_tokens;
      n = std::min(streamed ? m.st.pass : m.chunk, T - t);
      if (streamed) m.prefill_streamed(ids.data() + t, n, t + n == T ? logits : nullptr);
      else m.prefill_chunk(ids.data() + t, n, t + n == T ? logits : nullptr);
    }
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    const bool want = rows == Qwen35Moe::LogitRows::All || t == T - 1;
    m.step(ids[t], want ? logits + (rows == Qwen35Moe::LogitRows::All ? t * V : 0) : nullptr);
  }
}

}  // namespace tandem
