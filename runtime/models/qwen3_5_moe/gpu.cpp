// The Qwen3.5-MoE forward on one GPU (see gpu.h): the decode step (eager or as a CUDA
// graph) and the public API. The layer walk mirrors Qwen35Moe::forward step by step. Loading (the
// weights planned and uploaded into one device allocation, create()): gpu_load.cpp; batched
// prefill: gpu_prefill.cpp; the host's part of a hybrid step: hybrid_dispatch.cpp; the link: gpu_link.cpp; streamed
// prefill: gpu_stream.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "gpu_core/device.cuh"
#include "gpu_core/handoff.cuh"
#include "gpu_core/ops.cuh"
#include "gpu_core/rows8_layout.h"
#include "placement/gpu_layout.h"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {

// The layer's weights and state in the kernels' argument blocks; callers add the activations.
gpu::DeltaNetDecodeArgs Qwen35MoeGpu::Impl::deltanet_args(const DevLayer& L, int slot) const {
  const ModelConfig& c = model.config();
  gpu::DeltaNetDecodeArgs p;
  const int64_t s = std::max(slot, 0);
  p.conv_w = L.conv_w, p.conv_state = L.conv_state + s * conv_stride, p.A_log = L.A_log, p.dt_bias = L.dt_bias, p.norm_w = L.dn_norm;
  p.state = L.ssm_state + s * ssm_stride;
  p.conv_stride = conv_stride, p.state_stride = ssm_stride;
  p.Hk = c.linear_num_key_heads, p.Hv = c.linear_num_value_heads, p.dk = c.linear_key_head_dim, p.dv = c.linear_value_head_dim;
  p.kernel = c.linear_conv_kernel, p.eps = static_cast<float>(c.rms_norm_eps);
  return p;
}

gpu::AttentionDecodeArgs Qwen35MoeGpu::Impl::attention_args(const DevLayer& L, int slot) const {
  const ModelConfig& c = model.config();
  gpu::AttentionDecodeArgs p;
  const int64_t s = std::max(slot, 0);
  p.q_norm = L.q_norm, p.k_norm = L.k_norm, p.inv_freq = inv_freq, p.k_cache = L.k_cache + s * cache_stride, p.v_cache = L.v_cache + s * cache_stride;
  p.cache_stride = cache_stride;
  p.kv = opts.kv_format;
  p.nh = c.num_heads, p.nkv = c.num_kv_heads, p.hd = c.head_dim, p.rotary_dim = c.rotary_dim;
  p.max_ctx = static_cast<int>(opts.max_context), p.max_splits = static_cast<int>(gpu::attention_decode_splits(opts.max_context));
  p.eps = static_cast<float>(c.rms_norm_eps), p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return p;
}

void Qwen35MoeGpu::Impl::linear(const DevLinear& L, const float* in, float* out, bool early_next) {
  if (L.int4) {
    CK(gpu::gather_x_half(in, L.q.perm, L.in, 1, xh, stream));
    CK(gpu::gemv_int4(L.q, xh, 1, out, stream));
  } else if (L.rows8) {
    CK(gpu::gemv_rows8(L.q8, in, 1, out, stream, early_next));
  } else {
    CK(gpu::gemv_bf16(L.w, L.out, L.in, in, 1, out, stream, early_next));
  }
}

void Qwen35MoeGpu::Impl::swiglu_down(const DevLinear& L, const float* g, const float* u, int T, float* out, cudaStream_t on) {
  if (L.rows8) CK(gpu::gemv_rows8_swiglu(L.q8, g, u, T, out, on));
  else CK(gpu::gemv_bf16_swiglu(L.w, L.out, L.in, g, u, T, out, on));
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

// One decode step: eagerly (GpuOptions::eager, --trace, and the cases create() leaves graph_ok off
// for) or as the captured CUDA graph: the same enqueue() either way.
void Qwen35MoeGpu::Impl::step(int32_t id, float* logits_host, float* hidden_host) {
  Trace* tr = Trace::active();
  const ModelConfig& c = model.config();
  if (hidden_host && !mtp.hhid) fail("internal: a hidden state asked for without the MTP head's staging (GpuOptions::mtp)");
  if (graph_ok && !tr) {
    hidpos[0] = id, hidpos[1] = static_cast<int32_t>(pos), hidpos[2] = cur;  // the previous launch has finished (synchronized)
    const int w = (!logits_host ? 0 : logits_host == &logits_sink ? 2 : 1) + (hidden_host ? 3 : 0);
    if (!graphs[w]) capture(w);
    if (one_graph) {
      hy.serve_graph(graphs[w], stream, handoff_layers);
    } else {
      CK(cudaGraphLaunch(graphs[w], stream));
      CK(cudaStreamSynchronize(stream));
    }
    if (w % 3 == 1) std::memcpy(logits_host, hlogits, c.vocab_size * sizeof(float));
    if (hidden_host) std::memcpy(hidden_host, mtp.hhid, c.hidden_size * sizeof(float));
    counts.gpu += static_cast<uint64_t>(c.num_experts_per_tok) * gpu_only_layers;
    ++pos;
    return;
  }
  trace_begin(tr);
  const int32_t p32[2] = {static_cast<int32_t>(pos), cur};
  enqueue(id, &id, p32, logits_host, tr, hidden_host);
  ++pos;
  trace_end(tr);
  if (logits_host || hidden_host) CK(cudaStreamSynchronize(stream));
}

// Captures graphs[w] (0 without logits, 1 with logits copied to hlogits, 2 with logits left on the
// device; + 3: the hidden state copied to mtp.hhid as well): the step as one CUDA graph, with the host
// handoffs inside it when there are host experts.
void Qwen35MoeGpu::Impl::capture(int w) {
  const ExpertCounts saved = counts;  // enqueue() counts on the host; replays count in step()
  handoff_layers.clear();
  posting = one_graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t g = nullptr;
  try {
    const int l = w % 3;
    enqueue(0, hidpos, hidpos + 1, l == 0 ? nullptr : l == 1 ? hlogits : &logits_sink, nullptr, w >= 3 ? mtp.hhid : nullptr);
    CK(cudaStreamEndCapture(stream, &g));
  } catch (...) {  // leave the stream usable: end the capture, drop the partial graph
    abandon_capture();
    posting = false;
    throw;
  }
  posting = false;
  const cudaError_t made = cudaGraphInstantiate(&graphs[w], g, 0);
  cudaGraphDestroy(g);
  if (made != cudaSuccess) graphs[w] = nullptr;
  CK(made);
  counts = saved;
}

// After a failure under capture: end it (the partial graph is dropped) and clear the error.
void Qwen35MoeGpu::Impl::abandon_capture() {
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();
}

// Queues one token's work on the stream: id / position and slot copied from id_src / pos_src[0..1] (host memory),
// logits (when logits_dst) copied to logits_dst. Host-side waits only for eager hybrid handoffs and
// the host embedding (a graph step has neither: its handoffs run inside the graph).
void Qwen35MoeGpu::Impl::enqueue(int32_t id, const int32_t* id_src, const int32_t* pos_src, float* logits_dst, Trace* tr, float* hidden_dst) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size;
  const int k = c.num_experts_per_tok;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const gpu::ProgrammaticLaunchScope programmatic(pdl);
  CK(cudaMemcpyAsync(ids, id_src, 4, cudaMemcpyHostToDevice, stream));
  CK(cudaMemcpyAsync(pos_dev, pos_src, 8, cudaMemcpyHostToDevice, stream));  // position, slot (pos_dev[2..3]: first tokens 0, 1)
  if (embed) {
    CK(gpu::embed_bf16(embed, H, ids, 1, h, stream));
  } else {
    host_embedding_rows(&id, 1, h);
  }
  // The residual update that ends each block (h += attention/DeltaNet output; h += MoE output +
  // the gated shared expert) runs fused with the norm that follows it (add_rmsnorm_zc).
  // host (one graph): the host's sum still to be waited for and added to a first.
  struct Residual {
    const float *a = nullptr, *shared = nullptr, *gate = nullptr;
    gpu::HostSum host;
  } pending;
  int deferred_from = -1;  // one graph with deferral: the layer whose deferred host sum joins at the end of this one
  auto settle_host = [&] {  // the host's sum waited for and added on its own (it goes to moe_out: pending.a)
    const gpu::HostSum& w = pending.host;
    if (w.flag) CK(gpu::host_wait_add(w.flag, w.value, w.src, moe_out, H, w.error, w.timeout_ns, stream));
    pending.host = {};
  };
  // x = the norm w of h (after the pending add); with qx.parts also x quantised for the decode MoE,
  // returning whether it was (the host-waiting form does not).
  auto norm_x = [&](const float* w, gpu::QuantX qx = {}) {
    bool quantised = false;
    if (pending.host.flag && !pending.shared) {
      CK(gpu::host_wait_add_rmsnorm_zc(pending.host, h, moe_out, w, H, eps, x, stream));  // pending.a is moe_out
    } else {
      settle_host();
      if (pending.a) CK(gpu::add_rmsnorm_zc(h, pending.a, pending.shared, pending.gate, w, H, 1, eps, x, stream, qx));
      else CK(gpu::rmsnorm_zc(h, w, H, 1, eps, x, stream, qx));
      quantised = qx.parts != nullptr;
    }
    pending = {};
    return quantised;
  };
  for (size_t li = 0; li < layers.size(); ++li) {
    const DevLayer& L = layers[li];
    mark(tr, li, 0);
    norm_x(L.in_norm);
    if (L.kind == LayerKind::LinearAttention) {
      if (L.in_proj.out) {
        linear(L.in_proj, x, qkv, true);  // qkv|z|b|a, as laid out in the workspace; the conv after it: 32 small blocks
      } else {
        linear(L.qkv, x, qkv);
        linear(L.z, x, z);
        linear(L.b, x, b);
        linear(L.a, x, a);
      }
      gpu::DeltaNetDecodeArgs p = deltanet_args(L, -1);
      p.qkv = qkv, p.z = z, p.b = b, p.a = a, p.conv_out = conv_out, p.out = core;
      p.slot = pos_dev + 1, p.first = pos_dev + 2;
      CK(gpu::deltanet_decode(p, stream));
      linear(L.out_proj, core, o, true);  // the router's launch after it: a block per 8 rows, one wave
    } else {
      if (L.in_proj.out) {
        linear(L.in_proj, x, qg, true);  // q|k|v; the q/k norm and rope after it: a block a head
      } else {
        linear(L.q, x, qg);
        linear(L.k, x, kk);
        linear(L.v, x, vv);
      }
      gpu::AttentionDecodeArgs p = attention_args(L, -1);
      p.qg = qg, p.k = kk, p.v = vv, p.pos = pos_dev, p.q_rot = q_rot, p.partial = attn_part, p.out = attn_out;
      p.slot = pos_dev + 1;
      CK(gpu::attention_decode(p, stream));
      linear(L.o, attn_out, o, true);  // as out_proj
    }
    pending.a = o;
    mark(tr, li, 1);
    // router|shared gate|shared up|shared expert gate stacked, router|shared expert gate, or the router
    // alone; bf16: the norm before it and the top-k in the GEMV's launch
    const DevLinear& R = L.x_proj.out ? L.x_proj : L.router_gate.out ? L.router_gate : L.router;
    const bool sh8 = shared8_in_router(L);  // and the 8-bit shared gate / up in the same launch
    const bool split = L.cpu_experts && opts.host_experts;
    // one graph: the router's last block posts its result to the host (an int4 router: host_post below)
    const bool post_in_router = split && posting && R.bf16();
    const gpu::QuantX qx = moe_x(L, 1, hscratch);  // x quantised for the decode MoE where x is written
    bool x_quantised = false;
    if (R.bf16()) {
      const gpu::HostPost post = hy.post(static_cast<int>(li));
      // x_proj's rows as laid out in the workspace; router_gate's gate logit into sgate
      gpu::RowsOut y =
          &R == &L.router_gate ? stack_out(R, {{&L.router, router}, {&L.sh_expert_gate, sgate}}) : gpu::RowsOut::one(router, R.out);
      if (sh8) y.dst[2] = sg, y.end[2] = R.out + L.sh_gate_up.out, y.parts = 3;  // sg|su, as laid out in the workspace
      CK(gpu::gemv_bf16_router_topk_norm(R.w, R.out, R.in, h, pending.a, pending.shared, pending.gate, L.post_norm, eps, x, y,
                                         static_cast<int>(c.num_experts), k, route_ticket, topk_ids, topk_w, stream,
                                         post_in_router ? &post : nullptr, qx, sh8 ? &L.sh_gate_up.q8 : nullptr));
      x_quantised = qx.parts != nullptr;
      pending = {};
    } else {
      x_quantised = norm_x(L.post_norm, qx);
      linear(R, x, router);  // the router alone (the stacks are bf16)
      CK(gpu::router_topk(router, c.num_experts, k, 1, topk_ids, topk_w, stream));
    }
    // GpuOptions::link_experts: some host experts computed here from host memory; in a layer with no
    // GPU-resident experts their sum is the GPU's whole routed part (no gpu_experts launch before it)
    const bool linked = split && link.on && link.tables[li], link_only = linked && link.host_only[li];
    if (split && posting) {  // the host starts while the GPU goes on: posted in mapped memory, no copy nodes
      if (!post_in_router) {
        const gpu::HostPost p = hy.post(static_cast<int>(li));
        CK(gpu::host_post(x, H, topk_ids, topk_w, k, p.x, p.ids, p.weights, p.flag, p.value, stream));
      }
    } else if (split) {
      hy.post_copy(x, topk_ids, topk_w, 1, stream);
    }
    mark(tr, li, 2);
    // The shared expert's down (its gate / up came with the router) in the routed experts' down launch
    // (shared_in_down), else its GEMV beside the routed experts, on the side stream; both only read x, sg,
    // su and write their own rows. Without an x_proj stack (8-bit shared projections beside a bf16
    // router) its gate, up and gate logit go there too. With the link the shared expert goes beside it
    // (the link's kernels leave most SMs idle).
    const bool in_down = !linked && shared_in_down(L);
    const bool beside = !in_down && shared_beside_ok(L) && L.sh_down.swiglu_fused() && (!split || linked) && !deferring();
    if (beside) {
      CK(cudaEventRecord(fork_ev, stream));
      CK(cudaStreamWaitEvent(side, fork_ev, 0));
      if (!L.x_proj.out && !sh8) shared_inputs(L, x, 1, sg, su, sgate, side);
      swiglu_down(L.sh_down, sg, su, 1, sd, side);
      CK(cudaEventRecord(join_ev, side));
    }
    // One graph: the next layer's input projection (its tail) into L2 beside the experts
    const DevLinear* next_in = li + 1 < layers.size() ? &layers[li + 1].in_proj : nullptr;
    const bool prefetching = split && posting && l2_prefetch > 0 && next_in && next_in->out && next_in->bf16();
    if (prefetching) {
      const int64_t bytes = next_in->out * next_in->in * 2, take = std::min(bytes, l2_prefetch);
      CK(cudaEventRecord(pf_fork_ev, stream));
      CK(cudaStreamWaitEvent(side, pf_fork_ev, 0));
      CK(gpu::l2_prefetch(reinterpret_cast<const char*>(next_in->w) + (bytes - take), take, side));
      CK(cudaEventRecord(pf_join_ev, side));
    }
    if (!link_only)
      gpu_experts(L, x, topk_ids, topk_w, 1, xh, hscratch, moe_out, nullptr, x_quantised, in_down ? shared_down_of(L, sg, su, sd) : gpu::SharedDown{});
    if (linked)  // read in place over PCIe, added to the GPU experts' sum
      CK(gpu::moe_int4_tiles_decode(link.tables[li], static_cast<int>(c.num_experts), H, c.moe_intermediate_size, link.group_size,
                                    topk_ids, topk_w, k, link.m, link.act_order, x, link.scratch, moe_out, stream, !link_only));
    if (!L.x_proj.out && !beside && !sh8) {
      if (L.sh_gate_up.out) {
        linear(L.sh_gate_up, x, sg);  // sg|su, as laid out in the workspace
      } else {
        linear(L.sh_gate, x, sg);
        linear(L.sh_up, x, su);
      }
      if (!L.router_gate.out) linear(L.sh_expert_gate, x, sgate);
    }
    if (beside) {
      CK(cudaStreamWaitEvent(stream, join_ev, 0));
    } else if (in_down) {  // sd came with the routed experts
    } else if (!L.sh_down.swiglu_fused()) {
      CK(gpu::silu_mul(sg, su, c.shared_expert_intermediate_size, stream));
      linear(L.sh_down, sg, sd);
    } else {  // silu(gate) * up formed as sh_down reads it: one launch fewer
      swiglu_down(L.sh_down, sg, su, 1, sd, stream);
    }
    if (split || deferring()) CK(gpu::gated_add(moe_out, sd, sgate, H, 1, stream));
    if (prefetching) CK(cudaStreamWaitEvent(stream, pf_join_ev, 0));
    mark(tr, li, 3);
    if (!posting) hy.run_deferred(def_dev, stream);  // the previous layer's, while the GPU works on this one (one graph: the host loop runs it)
    gpu::HostSum host_sum;  // this layer's, when its wait is left to the next norm's launch
    if (split && posting) {  // wait inside the graph for the host's sum, added from host memory
      handoff_layers.push_back(static_cast<int>(li));
      const gpu::HostSum sum = hy.sum(static_cast<int>(li));
      if (!deferring()) host_sum = sum;  // waited for by the next norm's launch (norm_x)
      else CK(gpu::host_wait_add(sum.flag, sum.value, sum.src, moe_out, H, sum.error, sum.timeout_ns, stream));
    } else if (split) {
      hy.serve_copy(li, 1, cpu_out, moe_out, stream, HybridDispatch::Pass::decode);
    } else {
      counts.gpu += k;
    }
    if (deferring()) {  // the deferred sum joins after the MoE output, as the model definition adds them
      CK(gpu::add_inplace(h, moe_out, H, stream));
      if (posting) hy.join_deferred_posted(deferred_from, h, stream);
      else hy.add_deferred(h, def_dev, stream);
      deferred_from = split && posting ? static_cast<int>(li) : -1;
    } else {
      pending = {moe_out, split ? nullptr : sd, split ? nullptr : sgate, host_sum};
    }
    mark(tr, li, 4);
  }
  if (posting) {  // the last layer's join before the final norm
    hy.join_deferred_posted(deferred_from, h, stream);
  } else {
    hy.run_deferred(def_dev, stream);
    hy.add_deferred(h, def_dev, stream);
  }
  if (!logits_dst && !hidden_dst) {  // no norm follows: the last residual on its own
    settle_host();
    if (pending.shared) CK(gpu::gated_add(moe_out, pending.shared, pending.gate, H, 1, stream));
    if (pending.a) CK(gpu::add_inplace(h, pending.a, H, stream));
    return;
  }
  norm_x(final_norm);
  if (hidden_dst) CK(cudaMemcpyAsync(hidden_dst, x, H * sizeof(float), cudaMemcpyDeviceToHost, stream));
  if (!logits_dst) return;
  linear(lm_head, x, logits);
  if (logits_dst != &logits_sink)
    CK(cudaMemcpyAsync(logits_dst, logits, c.vocab_size * sizeof(float), cudaMemcpyDeviceToHost, stream));
}


Qwen35MoeGpu::Qwen35MoeGpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Qwen35MoeGpu::~Qwen35MoeGpu() = default;
const GpuMemoryPlan& Qwen35MoeGpu::memory() const { return impl_->plan; }

uint64_t Qwen35MoeGpu::dense_bytes_per_token() const {
  const Impl& m = *impl_;
  const ModelConfig& c = m.model.config();
  auto bytes = [](const DevLinear& L) -> uint64_t {  // as the loader allocated it (the plan's figures)
    if (L.rows8) return gpu::rows8_matrix_bytes(L.out, L.in);
    return placement::gpu_linear_pieces(L.out, L.in, L.int4, L.int4 ? L.in / L.q.group_size : 1, L.q.perm != nullptr).total();
  };
  const uint64_t H = static_cast<uint64_t>(c.hidden_size);
  uint64_t b = bytes(m.lm_head) + 4 * H + 2 * H;  // the lm_head, the final norm, an embedding row
  for (const DevLayer& L : m.layers) {  // the members, not the stacks (views of the same bytes)
    b += 8 * H;  // input and post-attention norms (fp32)
    if (L.kind == LayerKind::LinearAttention) b += bytes(L.qkv) + bytes(L.z) + bytes(L.b) + bytes(L.a) + bytes(L.out_proj);
    else b += bytes(L.q) + bytes(L.k) + bytes(L.v) + bytes(L.o);
    b += bytes(L.router) + bytes(L.sh_gate) + bytes(L.sh_up) + bytes(L.sh_expert_gate) + bytes(L.sh_down);
  }
  return b;
}
const ExpertCounts& Qwen35MoeGpu::expert_counts() const { return impl_->counts; }
bool Qwen35MoeGpu::batched_prefill_active() const { return impl_->batched; }
int64_t Qwen35MoeGpu::prefill_chunk() const { return impl_->chunk; }

bool Qwen35MoeGpu::forward_top(std::span<const int32_t> ids, std::span<const gpu::Penalty> penalties, int k,
                               std::vector<std::pair<int32_t, float>>& top, float* hidden) {
  Impl& m = *impl_;
  const std::span<const gpu::Penalty> pens[1] = {penalties};
  const int ks[1] = {k};
  std::vector<std::pair<int32_t, float>>* const tops[1] = {&top};
  if (k < 1 || !m.device_tops_fit(pens, ks)) return false;
  forward(ids, &m.logits_sink, Qwen35Moe::LogitRows::Last, hidden);
  m.device_tops(m.logits, pens, ks, m.top_ids, m.top_vals, tops);
  return true;
}
bool Qwen35MoeGpu::cuda_graph_active() const { return impl_->graph_ok; }
bool Qwen35MoeGpu::programmatic_launch_active() const { return impl_->pdl; }
int Qwen35MoeGpu::link_experts_active() const { return impl_->link.on ? impl_->link.m : 0; }
const std::string& Qwen35MoeGpu::link_note() const { return impl_->link.note; }
int64_t Qwen35MoeGpu::stream_prefill_min_tokens() const { return impl_->st.on && impl_->batched ? impl_->opts.stream_prefill_min_tokens : 0; }
const std::string& Qwen35MoeGpu::stream_prefill_note() const { return impl_->st.note; }
bool Qwen35MoeGpu::graph_one_step() const { return impl_->one_graph; }
int64_t Qwen35MoeGpu::l2_prefetch_active() const { return impl_->l2_prefetch; }


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

void Qwen35MoeGpu::reset() { reset_slot(impl_->cur); }

int Qwen35MoeGpu::slots() const { return impl_->slots; }
int64_t Qwen35MoeGpu::step_rows_max() const { return impl_->rows; }

int64_t Qwen35MoeGpu::position(int slot) const {
  const Impl& m = *impl_;
  if (slot < 0 || slot >= m.slots) fail("slot ", slot, " is outside 0..", m.slots - 1);
  return slot == m.cur ? m.pos : m.slot_pos[slot];
}

void Qwen35MoeGpu::select(int slot) {
  Impl& m = *impl_;
  if (slot < 0 || slot >= m.slots) fail("slot ", slot, " is outside 0..", m.slots - 1);
  m.slot_pos[m.cur] = m.pos;
  m.cur = slot;
  m.pos = m.slot_pos[slot];
}

void Qwen35MoeGpu::reset_slot(int slot) {
  Impl& m = *impl_;
  if (slot < 0 || slot >= m.slots) fail("slot ", slot, " is outside 0..", m.slots - 1);
  (slot == m.cur ? m.pos : m.slot_pos[slot]) = 0;
  if (m.kept.slot == slot) m.kept = {};
  if (slot == m.cur || m.slots == 1) {  // the expert counts and the host's deferral follow the selected sequence
    m.counts = {};
    m.hy.reset();
  }
  const ModelConfig& c = m.model.config();
  for (DevLayer& L : m.layers) {
    if (L.kind != LayerKind::LinearAttention) continue;
    CK(cudaMemsetAsync(L.conv_state + slot * m.conv_stride, 0, (c.linear_conv_kernel - 1) * c.linear_conv_dim() * sizeof(float), m.stream));
    CK(cudaMemsetAsync(L.ssm_state + slot * m.ssm_stride, 0,
                       int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * sizeof(float), m.stream));
  }
  CK(cudaStreamSynchronize(m.stream));
}

namespace {

// One slot's sequence of `position` tokens in bytes: a KV cache row (gpu::kv_row_bytes), a DeltaNet
// layer's conv window and recurrent state (fp32), and the total over the layers.
struct SlotShape {
  int64_t row = 0, conv = 0, state = 0, total = 0;
  SlotShape(const ModelConfig& c, RowFormat kv, int64_t position, bool mtp) {
    row = gpu::kv_row_bytes(kv, c.num_kv_heads, c.head_dim), conv = (c.linear_conv_kernel - 1) * c.linear_conv_dim() * 4;
    state = int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
    for (LayerKind k : c.layer_types) total += k == LayerKind::LinearAttention ? conv + state : 2 * position * row;
    if (mtp) total += 2 * position * row;  // the MTP head's cache (rows past the head's own count are overwritten later)
  }
};

}  // namespace

// The device pieces of a slot's sequence of `position` tokens in SlotCopy's order: f(device pointer,
// bytes) for each attention layer's K and V rows and each DeltaNet layer's conv window and recurrent
// state.
template <typename F>
void Qwen35MoeGpu::for_slot_pieces(int slot, int64_t position, F&& f) const {
  const Impl& m = *impl_;
  const SlotShape sh(m.model.config(), m.opts.kv_format, position, m.mtp.on);
  for (size_t li = 0; li < m.layers.size() + m.mtp.on; ++li) {
    const DevLayer& L = m.layer_at(li);
    if (L.kind == LayerKind::LinearAttention) {
      f(static_cast<void*>(L.conv_state + slot * m.conv_stride), sh.conv);
      f(static_cast<void*>(L.ssm_state + slot * m.ssm_stride), sh.state);
    } else if (position > 0) {
      f(static_cast<void*>(L.k_cache + slot * m.cache_stride), position * sh.row);
      f(static_cast<void*>(L.v_cache + slot * m.cache_stride), position * sh.row);
    }
  }
  CK(cudaStreamSynchronize(m.stream));
}

namespace {

// Copies a slot piece (`bytes` at `dev`) to or from the snapshot's stream at *offset, page by page.
void copy_piece(const SnapshotMemory& mem, uint64_t* offset, void* dev, int64_t bytes, bool save, cudaStream_t stream) {
  uint64_t left = static_cast<uint64_t>(bytes);
  auto* d = static_cast<uint8_t*>(dev);
  while (left > 0) {
    uint64_t room = 0;
    uint8_t* at = mem.at(*offset, &room);
    const uint64_t len = std::min(room, left);
    CK(cudaMemcpyAsync(save ? at : d, save ? d : at, len, cudaMemcpyDefault, stream));
    d += len, *offset += len, left -= len;
  }
}

}  // namespace

Qwen35MoeGpu::SlotCopy Qwen35MoeGpu::save_slot(int slot) const {
  const Impl& m = *impl_;
  SlotCopy out;
  out.position = position(slot);
  auto mem = std::make_shared<SnapshotMemory>(SlotShape(m.model.config(), m.opts.kv_format, out.position, m.mtp.on).total, m.snapshot_pools);
  uint64_t offset = 0;
  for_slot_pieces(slot, out.position, [&](void* dev, int64_t bytes) { copy_piece(*mem, &offset, dev, bytes, true, m.stream); });
  out.memory = std::move(mem);
  return out;
}

void Qwen35MoeGpu::load_slot(int slot, const SlotCopy& copy) {
  Impl& m = *impl_;
  if (copy.position > m.opts.max_context) fail("load_slot: a sequence of ", copy.position, " tokens for a context of ", m.opts.max_context);
  const uint64_t want = SlotShape(m.model.config(), m.opts.kv_format, copy.position, m.mtp.on).total;
  if (!copy.memory || copy.memory->bytes() != want)
    fail("load_slot: the copy does not have this model's shapes (", copy.memory ? copy.memory->bytes() : 0, " bytes for ", want, ")");
  reset_slot(slot);  // the expert counts, the kept states and the host's deferral start afresh
  uint64_t offset = 0;
  for_slot_pieces(slot, copy.position, [&](void* dev, int64_t bytes) { copy_piece(*copy.memory, &offset, dev, bytes, false, m.stream); });
  (slot == m.cur ? m.pos : m.slot_pos[slot]) = copy.position;
}

void Qwen35MoeGpu::forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows, float* hidden) {
  Impl& m = *impl_;
  const int64_t V = m.model.config().vocab_size, T = static_cast<int64_t>(ids.size()), H = m.model.config().hidden_size;
  for (int64_t t = 0; t < T; ++t)  // checked before any work, so a bad call leaves the sequence as it was
    if (ids[t] < 0 || ids[t] >= V) fail("token id ", ids[t], " at position ", t, " is outside the vocabulary (0..", V - 1, ")");
  if (m.pos + T > m.opts.max_context) fail("the sequence reached the context limit of ", m.opts.max_context, " tokens (--context)");
  const bool chunks = m.batched && T > 1 && rows == Qwen35Moe::LogitRows::Last && !Trace::active();
  if (chunks) {
    for (int64_t t = 0, n = 0; t < T; t += n) {
      const bool streamed = m.st.on && T - t >= m.opts.stream_prefill_min_tokens;
      n = std::min(streamed ? m.st.pass : m.chunk, T - t);
      if (streamed) m.prefill_streamed(ids.data() + t, n, t + n == T ? logits : nullptr, hidden ? hidden + t * H : nullptr);
      else m.prefill_chunk(ids.data() + t, n, t + n == T ? logits : nullptr, hidden ? hidden + t * H : nullptr);
    }
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    const bool want = rows == Qwen35Moe::LogitRows::All || t == T - 1;
    m.step(ids[t], want ? logits + (rows == Qwen35Moe::LogitRows::All ? t * V : 0) : nullptr, hidden ? hidden + t * H : nullptr);
  }
}

}  // namespace tandem
