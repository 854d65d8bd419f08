// The Qwen3.5-MoE GPU model's load (see gpu.h): the weights planned by kind, then
// uploaded into one device allocation (int4 experts repacked on all host threads), the workspace, and
// Qwen35MoeGpu::create. The decode step: gpu.cpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>

#include "gpu_core/device.cuh"
#include "gpu_core/int4_layout.h"
#include "gpu_core/rows8_layout.h"
#include "core/bytes.h"
#include "core/dtype.h"
#include "placement/gpu_layout.h"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"
#include "core/progress.h"

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
  void* zeroed(uint64_t bytes, Kind kind) {
    void* d = alloc(bytes, kind);
    if (d) CK(cudaMemset(d, 0, bytes));
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
  const placement::LinearPieces p = placement::gpu_linear_pieces(L.out, L.in, true, L.gptq.num_groups, L.gptq.g_idx != nullptr);
  d.q.qweight = static_cast<uint32_t*>(up.alloc(p.w, kind));
  d.q.scales = static_cast<uint16_t*>(up.alloc(p.scales, kind));
  d.q.zeros = static_cast<uint8_t*>(up.alloc(p.zeros, kind));
  d.q.perm = p.perm ? static_cast<int32_t*>(up.alloc(p.perm, kind)) : nullptr;
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

// A dense L's weights as bf16: in place when stored so, else converted into `store` (F16 / F32
// checkpoint tensors are kept as bf16 on the GPU).
const uint16_t* dense_bf16(const LinearWeight& L, std::vector<uint16_t>& store) {
  if (L.dense_dtype == DType::BF16) return static_cast<const uint16_t*>(L.dense);
  store.resize(static_cast<size_t>(L.out * L.in));
  for (size_t i = 0; i < store.size(); ++i) store[i] = f32_to_bf16(load_as_f32(L.dense, L.dense_dtype, static_cast<int64_t>(i)));
  return store.data();
}

// Dense linears that read the same input quantized on load to 8-bit rows of `f` (int8 or fp8) as one
// matrix of their rows stacked: every member's codes, then every member's scales (rows8_layout.h; a
// row's scale is its own, so the stack quantizes to the members' codes). One GEMV for the stack in
// decode, each member a view of its rows for the prompt's GEMMs. The block takes what the members'
// matrices would take apart (rows8_matrix_bytes each: the plan's figure), the rest left as padding.
// Returns the stack (out 0 for one member); fills `views`.
DevLinear upload_rows8(Uploader& up, std::initializer_list<const LinearWeight*> parts, Kind kind, RowFormat f,
                       std::initializer_list<DevLinear*> views) {
  const int64_t K = (*parts.begin())->in;
  int64_t N = 0;
  uint64_t bytes = 0;
  for (const LinearWeight* L : parts) N += L->out, bytes += gpu::rows8_matrix_bytes(L->out, L->in);
  auto* q = static_cast<uint8_t*>(up.alloc(bytes, kind));
  float* s = reinterpret_cast<float*>(q + (N * K + 255) / 256 * 256);  // within `bytes`: see above
  DevLinear stack;
  stack.out = parts.size() > 1 ? N : 0, stack.in = K, stack.rows8 = true, stack.q8 = {q, s, N, K, f};
  int64_t row = 0;
  auto view = views.begin();
  for (const LinearWeight* L : parts) {
    DevLinear& d = **view++;
    d = DevLinear{};
    d.out = L->out, d.in = K, d.rows8 = true, d.q8 = {q + row * K, s + row, L->out, K, f};
    if (up.committing()) {
      std::vector<uint16_t> bf;
      const gpu::Rows8Host h = gpu::quantize_rows8(dense_bf16(*L, bf), L->out, K, f);
      CK(cudaMemcpy(q + row * K, h.codes.data(), h.codes.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(s + row, h.scales.data(), h.scales.size() * 4, cudaMemcpyHostToDevice));
    }
    row += L->out;
  }
  return stack;
}
DevLinear upload_rows8(Uploader& up, const LinearWeight& L, Kind kind, RowFormat f) {
  DevLinear d;
  upload_rows8(up, {&L}, kind, f, {&d});
  return d;
}

// Whether upload_linear quantizes L to 8-bit rows of f.
bool as_rows8(const LinearWeight& L, RowFormat f) { return f != RowFormat::Bf16 && L.kind == LinearWeight::Kind::Dense && L.in % 16 == 0; }

// Whether `parts` go up as one stack of 8-bit rows: each is quantized, they read one input, and every
// member but the last has a multiple of 4 rows (the workspace carves the stack's output at multiples
// of 4 floats, as stack_rows wants of bf16 stacks).
bool stacks_rows8(std::initializer_list<const LinearWeight*> parts, RowFormat f) {
  const LinearWeight* first = *parts.begin();
  size_t i = 0;
  for (const LinearWeight* L : parts) {
    if (!as_rows8(*L, f) || L->in != first->in || (++i < parts.size() && L->out % 4)) return false;
  }
  return true;
}

// f int8 / fp8: a dense projection quantized on load (GpuOptions::dense / mixer / shared / lm_head;
// inputs a multiple of 16).
DevLinear upload_linear(Uploader& up, const LinearWeight& L, Kind kind, RowFormat f = RowFormat::Bf16) {
  if (as_rows8(L, f)) return upload_rows8(up, L, kind, f);
  DevLinear d;
  d.out = L.out;
  d.in = L.in;
  if (L.kind == LinearWeight::Kind::Gptq) {
    d = alloc_int4(up, L, kind);
    if (up.committing()) fill_int4(L, d);  // sizes only otherwise: repacking is the expensive part
    return d;
  }
  if (!up.committing()) {
    up.alloc(placement::gpu_linear_pieces(L.out, L.in, false, 0, false).w, kind);
    return d;
  }
  std::vector<uint16_t> bf;
  d.w = up.upload(dense_bf16(L, bf), static_cast<size_t>(L.out * L.in), kind);
  return d;
}

// Projections that read one input (`parts`, each into its view): as one stack of 8-bit rows when they
// are quantized to f and can be stacked (stacks_rows8), else each on its own, stacked as bf16 rows where
// the arena lets them (stack_rows). Returns the stack (out 0: none).
DevLinear upload_stacked(Uploader& up, std::initializer_list<const LinearWeight*> parts, RowFormat f, std::initializer_list<DevLinear*> views) {
  if (stacks_rows8(parts, f)) return upload_rows8(up, parts, Kind::Dense, f, views);
  std::vector<const DevLinear*> members;
  auto view = views.begin();
  for (const LinearWeight* L : parts) {
    **view = upload_linear(up, *L, Kind::Dense, f);
    members.push_back(*view++);
  }
  return stack_rows(members);
}

// Columns col0 .. col0 + n of a dense L as a matrix of its own [out, n] (the MTP head's fc halves).
DevLinear upload_columns(Uploader& up, const LinearWeight& L, int64_t col0, int64_t n, Kind kind) {
  if (L.kind != LinearWeight::Kind::Dense) fail(L.name, ": the GPU MTP head needs this tensor dense (BF16, F16 or F32), not GPTQ");
  DevLinear d;
  d.out = L.out;
  d.in = n;
  if (!up.committing()) {
    up.alloc(placement::gpu_linear_pieces(L.out, n, false, 0, false).w, kind);
    return d;
  }
  std::vector<uint16_t> bf(static_cast<size_t>(L.out * n));
  for (int64_t r = 0; r < L.out; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = r * L.in + col0 + i;
      bf[r * n + i] = L.dense_dtype == DType::BF16 ? static_cast<const uint16_t*>(L.dense)[at] : f32_to_bf16(load_as_f32(L.dense, L.dense_dtype, at));
    }
  d.w = up.upload(bf.data(), bf.size(), kind);
  return d;
}

}  // namespace

DevLinear stack_rows(std::span<const DevLinear* const> parts) {
  const DevLinear* first = parts.front();
  DevLinear s = DevLinear::bf16_rows(first->w, 0, first->in);
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

// One decoder layer's weights and state (the model's layer li, or the MTP head's at li = num_layers:
// every expert on the GPU, never streamed).
DevLayer Qwen35MoeGpu::Impl::upload_layer(Uploader& up, const LayerWeights& L, int li) {
  const ModelConfig& c = model.config();
  const int64_t E = c.num_experts;
  auto vec = [&](const std::vector<float>& v, Kind kind) { return up.upload(v.data(), v.size(), kind); };
  auto format_in = [&](const std::vector<RowFormat>& per_layer) {  // the MTP head (li = num_layers) stays as stored
    if (li >= c.num_layers) return RowFormat::Bf16;
    return per_layer.empty() ? opts.dense : per_layer[static_cast<size_t>(li)];
  };
  const RowFormat q8 = format_in(opts.mixer), q8_shared = format_in(opts.shared);
  DevLayer d{};
  d.kind = L.kind;
  d.in_norm = vec(L.input_norm, Kind::Dense);
  d.post_norm = vec(L.post_attention_norm, Kind::Dense);
  if (L.kind == LayerKind::LinearAttention) {
    const DeltaNetWeights& w = L.deltanet;
    d.in_proj = upload_stacked(up, {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a}, q8, {&d.qkv, &d.z, &d.b, &d.a});
    d.out_proj = upload_linear(up, w.out_proj, Kind::Dense, q8);
    d.conv_w = vec(w.conv, Kind::Dense);
    d.A_log = vec(w.A_log, Kind::Dense);
    d.dt_bias = vec(w.dt_bias, Kind::Dense);
    d.dn_norm = vec(w.norm, Kind::Dense);
    d.conv_state = static_cast<float*>(up.zeroed(placement::conv_state_bytes(c) * slots, Kind::State));  // slot after slot
    d.ssm_state = static_cast<float*>(up.zeroed(placement::ssm_state_bytes(c) * slots, Kind::State));
  } else {
    const AttentionWeights& w = L.attn;
    d.in_proj = upload_stacked(up, {&w.q_proj, &w.k_proj, &w.v_proj}, q8, {&d.q, &d.k, &d.v});
    d.o = upload_linear(up, w.o_proj, Kind::Dense, q8);
    d.q_norm = vec(w.q_norm, Kind::Dense);
    d.k_norm = vec(w.k_norm, Kind::Dense);
    const uint64_t kv = placement::kv_cache_bytes(c, opts.max_context, opts.kv_format) / 2 * slots;  // K, then V
    d.k_cache = static_cast<uint8_t*>(up.zeroed(kv, Kind::Kv));
    d.v_cache = static_cast<uint8_t*>(up.zeroed(kv, Kind::Kv));
  }
  const MoeWeights& m = L.moe;
  // The router's rows, then the shared expert's gate and up (one GEMV into sg|su), then its gate logit's
  // row: the four stacked (x_proj). With 8-bit gate and up the logit's row follows the router's instead,
  // the two stacked (router_gate).
  d.router = upload_linear(up, m.router, Kind::Dense);
  const bool shared8 = as_rows8(m.shared_gate, q8_shared);
  if (shared8) d.sh_expert_gate = upload_linear(up, m.shared_expert_gate, Kind::Dense);
  d.sh_gate_up = upload_stacked(up, {&m.shared_gate, &m.shared_up}, q8_shared, {&d.sh_gate, &d.sh_up});
  if (!shared8) d.sh_expert_gate = upload_linear(up, m.shared_expert_gate, Kind::Dense);
  d.sh_down = upload_linear(up, m.shared_down, Kind::Dense, q8_shared);
  const DevLinear* x_parts[] = {&d.router, &d.sh_gate, &d.sh_up, &d.sh_expert_gate};
  d.x_proj = stack_rows(x_parts);
  const DevLinear* gate_parts[] = {&d.router, &d.sh_expert_gate};
  if (!d.x_proj.out) d.router_gate = stack_rows(gate_parts);
  d.int4_experts = m.gate[0].kind == LinearWeight::Kind::Gptq;
  d.expert_group = d.int4_experts ? m.gate[0].gptq.group_size : 0;
  std::vector<gpu::Int4Expert> i4(E);
  std::vector<gpu::Bf16Expert> b16(E);
  std::vector<std::pair<const LinearWeight*, DevLinear>> repack;  // int4 experts: filled in parallel below
  for (int64_t e = 0; e < E; ++e) {
    // Host experts count too: a streamed prefill runs them on the GPU (gpu_experts with its table).
    for (const LinearWeight* w : {&m.gate[e], &m.up[e], &m.down[e]})
      if (d.int4_experts && w->gptq.g_idx) d.expert_act_order = true;
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
  if (streams(li) && up.committing()) stream_table(li, i4);
  return d;
}

void Qwen35MoeGpu::Impl::build(Uploader& up, const std::function<void(uint64_t)>& uploaded) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, conv_dim = c.linear_conv_dim(), Vd = c.linear_value_dim();
  const int64_t I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size, E = c.num_experts;
  const int nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;

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
  lm_head = model.lm_head().dense == model.embed().dense && opts.embed_on_gpu ? DevLinear::bf16_rows(embed, V, H)
                                                                            : upload_linear(up, model.lm_head(), Kind::Dense, opts.lm_head);
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
  if (link.on) link.mem = up.alloc(link_buffers().total(), Kind::Work);  // link experts' tables and scratch (link_setup decided)
  layers.clear();
  if (opts.expert_on_gpu && !opts.expert_on_gpu->empty()) {
    if (static_cast<int64_t>(opts.expert_on_gpu->size()) != c.num_layers) fail("hybrid placement: expert map has ", opts.expert_on_gpu->size(), " layers, the model ", c.num_layers);
    for (const auto& row : *opts.expert_on_gpu)
      if (static_cast<int64_t>(row.size()) != E) fail("hybrid placement: expert map has ", row.size(), " experts per layer, the model ", E);
  }
  for (const LayerWeights& L : model.layers()) {
    const int li = static_cast<int>(layers.size());
    layers.push_back(upload_layer(up, L, li));
    if (uploaded && up.committing()) uploaded(up.placed());
  }
  if (mtp.on) {  // the head: fc as its two halves, the norms, its layer (an attention layer)
    const MtpWeights& w = *model.mtp();
    mtp.fc_e = upload_columns(up, w.fc, 0, H, Kind::Dense);
    mtp.fc_h = upload_columns(up, w.fc, H, H, Kind::Dense);
    mtp.norm_e = vec(w.pre_fc_norm_embedding, Kind::Dense);
    mtp.norm_h = vec(w.pre_fc_norm_hidden, Kind::Dense);
    mtp.norm = vec(w.norm, Kind::Dense);
    mtp.layer = upload_layer(up, w.layer, static_cast<int>(c.num_layers));
    // speculative.lm_head: the drafts' own 8-bit copy, unless lm_head is in that format already (they read it)
    const RowFormat lm_format = lm_head.rows8 ? lm_head.q8.format : RowFormat::Bf16;
    mtp.lm_head = opts.mtp_lm_head != lm_format && as_rows8(model.lm_head(), opts.mtp_lm_head)
                      ? upload_linear(up, model.lm_head(), Kind::Dense, opts.mtp_lm_head)
                      : DevLinear{};
  }

  // The workspace as placement::gpu_workspace lays it out (the planner counts the same pieces). The
  // outputs of each stacked projection group (stack_rows) share one buffer, sliced at multiples of 4 floats.
  placement::WorkShape shape;
  shape.context = opts.max_context;
  shape.prefill_chunk = wants_batched() ? opts.prefill_chunk : 0;
  shape.int4_experts = model.gptq_experts();
  shape.deferral = deferring();
  auto any_rows8 = [&](const std::vector<RowFormat>& per_layer) {  // as upload_layer's format_in reads them
    return per_layer.empty() ? opts.dense != RowFormat::Bf16
                             : std::any_of(per_layer.begin(), per_layer.end(), [](RowFormat f) { return f != RowFormat::Bf16; });
  };
  shape.rows8_prefill = any_rows8(opts.mixer) || any_rows8(opts.shared);
  shape.decode_rows = placement::decode_rows_for(c, shape.prefill_chunk, slots, opts.verify_tokens);
  shape.kept_positions = shape.decode_rows > 1 ? opts.verify_tokens : 0;
  const placement::GpuWorkspace work = placement::gpu_workspace(c, shape);
  auto ws = [&](placement::Work w) { return work[w] ? static_cast<float*>(up.zeroed(work[w], Kind::Work)) : nullptr; };
  auto ws16 = [&](placement::Work w) { return reinterpret_cast<uint16_t*>(ws(w)); };
  auto ws32 = [&](placement::Work w) { return reinterpret_cast<int32_t*>(ws(w)); };
  using placement::slice4;
  using W = placement::Work;
  const int64_t Hv = c.linear_num_value_heads, nh2 = int64_t(nh) * 2 * hd, kvd = int64_t(nkv) * hd;
  h = ws(W::h), x = ws(W::x), o = ws(W::o);
  qkv = ws(W::qkv);
  z = qkv ? qkv + slice4(conv_dim) : nullptr, b = z ? z + slice4(Vd) : nullptr, a = b ? b + slice4(Hv) : nullptr;
  core = ws(W::core), conv_out = ws(W::conv_out);
  qg = ws(W::qg);
  kk = qg ? qg + slice4(nh2) : nullptr, vv = kk ? kk + slice4(kvd) : nullptr;
  q_rot = ws(W::q_rot), attn_part = ws(W::attn_part), attn_out = ws(W::attn_out);
  router = ws(W::router);
  sg = router ? router + slice4(E) : nullptr, su = sg ? sg + slice4(Is) : nullptr, sgate = su ? su + slice4(Is) : nullptr;
  moe_out = ws(W::moe_out), hscratch = ws(W::hscratch), sd = ws(W::sd), logits = ws(W::logits);
  xh = ws16(W::xh);
  ids = ws32(W::ids);
  topk_ids = ws32(W::topk_ids);
  topk_w = ws(W::topk_w);
  route_ticket = reinterpret_cast<unsigned*>(ws(W::route_ticket));
  pos_dev = ws32(W::pos);
  cpu_out = ws(W::cpu_out);
  def_dev = ws(W::deferred);  // the deferred experts' sum (hybrid with deferral)
  pen_dev = reinterpret_cast<gpu::Penalty*>(ws(W::penalties));  // forward_top
  topk_ws = ws(W::topk_ws);
  top_ids = ws32(W::top_ids);
  top_vals = ws(W::top_vals);
  if (shape.prefill_chunk > 0) {
    ph = ws(W::p_h), px = ws(W::p_x), po = ws(W::p_o), pqkv = ws(W::p_qkv), pz = ws(W::p_z), pb = ws(W::p_b), pa = ws(W::p_a);
    pcore = ws(W::p_core), pconv = ws(W::p_conv), pqg = ws(W::p_qg), pk = ws(W::p_k), pv = ws(W::p_v), pattn = ws(W::p_attn);
    prouter = ws(W::p_router), pmoe = ws(W::p_moe), psg = ws(W::p_sg), psu = ws(W::p_su), psd = ws(W::p_sd), psgate = ws(W::p_sgate);
    ptopk_w = ws(W::p_topk_w), pcpu = ws(W::p_cpu);
    phs = ws16(W::p_hs), psplit = ws16(W::p_split), pxh = ws16(W::p_xh);
    pids = ws32(W::p_ids), ppos = ws32(W::p_pos), ptopk_ids = ws32(W::p_topk_ids);
    blas_ws = ws(W::p_blas);
    pterms = ws(W::p_terms);
    pgroup = ws(W::p_grouped);
    prows8 = ws16(W::p_rows8);
  }
  rows = work[W::b_logits] ? shape.decode_rows : 1;  // step_rows' tokens (1: none)
  bpart = ws(W::b_part), blogits = ws(W::b_logits), bio = ws32(W::b_groups);
  if (int32_t* top = ws32(W::b_top)) btop_ids = top, btop_vals = reinterpret_cast<float*>(top + rows * gpu::kMaxTopK);
  if (float* kept_all = ws(W::kept)) {  // per DeltaNet layer: verify_tokens + 1 conv windows, then as many states
    const int64_t copies = shape.kept_positions + 1;
    for (DevLayer& d : layers) {
      if (d.kind != LayerKind::LinearAttention) continue;
      d.kept_conv = kept_all, kept_all += copies * conv_stride;
      d.kept_state = kept_all, kept_all += copies * ssm_stride;
    }
  }
}


std::unique_ptr<Qwen35MoeGpu> Qwen35MoeGpu::create(const Qwen35Moe& model, const GpuOptions& opts) {
  // The one start-up check: a device, this build's kernels for it, a valid TANDEM_MAX_SM.
  const gpu::DeviceCaps& caps = gpu::gpu_device_caps();
  if (!caps.usable) fail(caps.error);
  if (opts.max_context < 1 || opts.max_context > model.config().max_position_embeddings)
    fail("--context ", opts.max_context, " must be between 1 and the model's ", model.config().max_position_embeddings);
  if (opts.batch < 1) fail("batch ", opts.batch, " must be at least 1");
  if (opts.batch > 1 && opts.defer_experts > 0)
    fail("experts.deferral holds one sequence's deferred experts between layers: it needs batch 1 (got batch ", opts.batch, ")");
  if (opts.verify_tokens < 0 || opts.verify_tokens > gpu::kMaxGemvTokens)
    fail("verify_tokens ", opts.verify_tokens, " must be between 0 and ", gpu::kMaxGemvTokens);
  if (opts.mtp && !model.mtp()) fail(model.checkpoint().dir(), ": the checkpoint has no MTP head (mtp.* tensors), which drafting needs");
  if (opts.mtp_host_experts && (!opts.mtp || !opts.host_experts))
    fail("the MTP head's experts in host memory need the head (GpuOptions::mtp) and a host side (a hybrid placement)");
  if (opts.mtp && opts.verify_tokens < 2) fail("the GPU MTP head needs verification buffers (verify_tokens >= 2; got ", opts.verify_tokens, ")");
  auto impl = std::make_unique<Impl>(model, opts);
  impl->mtp.on = opts.mtp;
  impl->slots = opts.batch;
  impl->slot_pos.assign(opts.batch, 0);
  impl->conv_stride = static_cast<int64_t>(placement::conv_state_bytes(model.config()) / 4);
  impl->ssm_stride = static_cast<int64_t>(placement::ssm_state_bytes(model.config()) / 4);
  impl->cache_stride = static_cast<int64_t>(placement::kv_cache_bytes(model.config(), opts.max_context, opts.kv_format) / 2);  // bytes of a slot's K (or V)
  impl->stream_setup();
  impl->link_setup();
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
  const bool batchable = impl->wants_batched();
  for (int64_t c = opts.prefill_chunk_max; batchable && c > opts.prefill_chunk; c /= 2) {
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
  if (opts.snapshot_vram > 0 && impl->plan.total() + opts.snapshot_vram > std::min<uint64_t>(budget, free_b))
    fail("the prefix cache's VRAM tier (", format_gib(opts.snapshot_vram), ") does not fit beside the model (",
         format_gib(impl->plan.total()), ") in ", format_gib(std::min<uint64_t>(budget, free_b)),
         opts.budget_bytes ? " (" + opts.budget_name + ")" : std::string(" (free device memory)"), "; lower --cache-vram / server.cache_vram");
  CK(cudaMalloc(&impl->arena, impl->plan.total()));
  if (opts.snapshot_vram > 0) impl->snapshot_pools.push_back(std::make_shared<SnapshotPool>(true, opts.snapshot_vram));
  if (opts.snapshot_host > 0) impl->snapshot_pools.push_back(std::make_shared<SnapshotPool>(false, opts.snapshot_host));
  CK(cudaStreamCreate(&impl->stream));
  CK(cudaStreamCreateWithFlags(&impl->side, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&impl->fork_ev, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&impl->join_ev, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&impl->pf_fork_ev, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&impl->pf_join_ev, cudaEventDisableTiming));
  if (impl->st.on) {
    CK(cudaStreamCreateWithFlags(&impl->st.copy, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&impl->st.ready, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&impl->st.free, cudaEventDisableTiming));
  }
  const int64_t H = model.config().hidden_size;
  if (!opts.embed_on_gpu && impl->wants_batched())  // prompt rows are gathered on the host
    impl->hembed_rows = std::max(impl->opts.prefill_chunk, impl->st.pass);  // st.pass: set by the last plan pass
  CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hembed), impl->hembed_rows * H * sizeof(float), cudaHostAllocDefault));
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
  impl->link_upload();
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
  // Decode steps as one CUDA graph each unless eager (GpuOptions::eager). The graph needs the embedding
  // table on the GPU (a host-side row lookup is no graph node); with host experts, unified addressing
  // (kernels read and write the handoff buffers in place: with UVA the host pointers are the
  // device's too). Steps outside these run eagerly. Deferral runs inside the graph too (the deferred sum
  // joins a layer late: one more wait, on hflags[3]).
  impl->pdl = caps.cc_major >= 9;
  impl->graph_ok = !opts.eager && impl->embed && (!host_layers || device_attribute(cudaDevAttrUnifiedAddressing));
  impl->one_graph = impl->graph_ok && host_layers;
  // The L2 prefetch, only in the one-graph step: 70% of this device's L2 cache
  if (impl->one_graph) impl->l2_prefetch = static_cast<int64_t>(device_attribute(cudaDevAttrL2CacheSize)) * 7 / 10;
  if (opts.host_experts) {  // the host's part of each step (hybrid_dispatch.h)
    HybridDispatch::Setup s;
    s.hidden = H;
    s.layers = model.config().num_layers;
    s.k = model.config().num_experts_per_tok;
    s.rows = impl->host_rows();  // tokens handed to the host at once
    s.defer = opts.defer_experts;
    s.host = opts.host_experts;
    s.expert_on_gpu = opts.expert_on_gpu;
    s.counts = &impl->counts;
    impl->hy.init(s, impl->one_graph);
    if (impl->link.on) {
      std::vector<uint8_t> linked(impl->link.tables.size());
      for (size_t l = 0; l < linked.size(); ++l) linked[l] = impl->link.tables[l] != nullptr;
      impl->hy.set_link(std::move(linked), impl->link.m);
    }
  }
  if (impl->graph_ok) {
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hidpos), 3 * sizeof(int32_t), cudaHostAllocDefault));
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hlogits), model.config().vocab_size * sizeof(float), cudaHostAllocDefault));
  }
  const int32_t first[2] = {0, 1};  // a one-token step's group table (enqueue: pos_dev[2..3])
  CK(cudaMemcpy(impl->pos_dev + 2, first, sizeof(first), cudaMemcpyHostToDevice));
  if (impl->rows > 1) {  // step_rows' table and logits rows, pinned
    // + the MTP head's argmax (mtp_rows) and its chain's table (Impl::chain_io)
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hio), (5 * impl->rows + 2 + Impl::kChainIo) * sizeof(int32_t), cudaHostAllocDefault));
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->hrows), impl->rows * model.config().vocab_size * sizeof(float), cudaHostAllocDefault));
  }
  if (impl->mtp.on) {
    if (impl->rows < 2 || !impl->batched)
      fail("the GPU MTP head runs on the batched buffers, which this model shape or prefill chunk does not have (prefill chunk ",
           impl->opts.prefill_chunk, ", head size ", model.config().head_dim, ")");
    CK(cudaHostAlloc(reinterpret_cast<void**>(&impl->mtp.hhid), (impl->rows + 1) * H * sizeof(float), cudaHostAllocDefault));
  }
  return std::unique_ptr<Qwen35MoeGpu>(new Qwen35MoeGpu(std::move(impl)));
}

}  // namespace tandem
