// runtime/models/qwen3_5_moe/gpu_prefill.cpp: the GPU model's batched prefill (a chunk of prompt tokens
// layer by layer) and the routed experts of n tokens, shared with decode (see gpu_impl.h).
#include <algorithm>
#include <cmath>

#include "gpu_core/ops.cuh"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {

namespace {

// f(t, T) for the tokens t .. t + T - 1 of n, T at most what one decode-kernel launch takes.
template <typename F>
void each_launch(int64_t n, F&& f) {
  for (int64_t t = 0; t < n; t += gpu::kMaxGemvTokens) f(t, static_cast<int>(std::min<int64_t>(gpu::kMaxGemvTokens, n - t)));
}

}  // namespace

bool Qwen35MoeGpu::Impl::wide_experts(const DevLayer& L) const {
  const ModelConfig& c = model.config();
  return L.int4_experts &&
         gpu::moe_int4_decode_wide_fits(c.hidden_size, c.moe_intermediate_size, L.expert_group, c.num_experts_per_tok, L.expert_act_order);
}

gpu::QuantX Qwen35MoeGpu::Impl::moe_x(const DevLayer& L, int64_t n, void* hs) const {
  const ModelConfig& c = model.config();
  if (n > gpu::kMaxGemvTokens || !wide_experts(L)) return {};
  return gpu::wide_moe_x(hs, n, c.num_experts_per_tok, c.hidden_size, c.moe_intermediate_size);
}

// GPU-resident experts into `out` (the kernels skip the host-resident ones); xh / hs are scratch.
void Qwen35MoeGpu::Impl::gpu_experts(const DevLayer& L, const float* x_dev, const int32_t* ids_dev, const float* w_dev, int64_t n, uint16_t* xh_buf, void* hs, float* out,
                                     const gpu::Int4Expert* table, bool x_quantised, const gpu::SharedDown& shared) {
  const ModelConfig& c = model.config();
  const gpu::Int4Expert* experts = table ? table : L.experts_i4;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const int k = c.num_experts_per_tok;
  if (shared.w && (n != 1 || !shared_in_down(L))) fail("internal: the shared expert's down in a launch that does not take it");
  if (L.int4_experts && n > gpu::kMaxGemvTokens) {  // a prompt chunk: each expert's tokens together (workspace: pgroup)
    if (!pgroup) fail("internal: ", n, " tokens of int4 experts without the grouped workspace");
    CK(gpu::moe_int4_grouped_tc(experts, static_cast<int>(c.num_experts), H, I, L.expert_group, ids_dev, w_dev, static_cast<int>(n), k,
                                x_dev, pgroup, out, stream));
    return;
  }
  // The decode kernels take up to kMaxGemvTokens tokens per launch (bf16 experts of a prompt chunk go in blocks).
  each_launch(n, [&](int64_t t, int T) {
    const float* x = x_dev + t * H;
    const int32_t* ids = ids_dev + t * k;
    const float* w = w_dev + t * k;
    if (wide_experts(L)) {
      CK(gpu::moe_int4_decode_wide(experts, H, I, L.expert_group, ids, w, T, k, x, x_quantised, hs, out + t * H, stream, shared));
    } else if (L.int4_experts) {  // shapes and act order the wide kernel does not take
      CK(gpu::gather_x_half(x, nullptr, H, T, xh_buf, stream));
      auto* h16 = static_cast<uint16_t*>(hs);
      CK(gpu::moe_int4_decode(experts, H, I, L.expert_group, ids, w, T, k, xh_buf, h16, out + t * H, stream));
    } else {
      CK(gpu::moe_bf16_decode(L.experts_bf16, H, I, ids, w, T, k, x, static_cast<float*>(hs), out + t * H, stream));
    }
  });
}

// y [n, out] = x [n, in] W^T for a chunk of tokens: cuBLAS for bf16 and 8-bit rows, the int4 GEMV 8
// tokens at a time; with `gemv` (a batched step's few rows) the GEMVs for bf16 and 8-bit rows too.
void Qwen35MoeGpu::Impl::linear_rows(const DevLinear& L, const float* in, int64_t n, float* out, bool gemv) {
  if (!L.int4 && gemv) {
    gemv_rows(L, in, n, gpu::RowsOut::one(out, L.out));
    return;
  }
  if (L.rows8) {  // a prompt chunk: the codes as bf16 on cuBLAS, each output scaled by its row's
    if (!prows8) fail("internal: an 8-bit projection in a prompt chunk without the codes' scratch (WorkShape::rows8_prefill)");
    CK(gpu::gemm_rows8(blas, L.q8, in, n, psplit, prows8, out, stream));
    return;
  }
  if (!L.int4) {
    CK(gpu::gemm_bf16(blas, L.w, L.out, L.in, in, n, psplit, out, stream));
    return;
  }
  each_launch(n, [&](int64_t t, int T) {
    CK(gpu::gather_x_half(in + t * L.in, L.q.perm, L.in, T, pxh, stream));
    CK(gpu::gemv_int4(L.q, pxh, T, out + t * L.out, stream));
  });
}

// A bf16 or 8-bit matrix's GEMV over n tokens, 8 a launch, into `out` (its parts' rows [n, part rows]).
void Qwen35MoeGpu::Impl::gemv_rows(const DevLinear& L, const float* in, int64_t n, const gpu::RowsOut& out, cudaStream_t on) {
  each_launch(n, [&](int64_t t, int T) {
    gpu::RowsOut o = out;  // each part's rows from token t
    for (int s = 0; s < o.parts; ++s) o.dst[s] += t * (out.end[s] - (s ? out.end[s - 1] : 0));
    if (L.rows8) CK(gpu::gemv_rows8(L.q8, in + t * L.in, T, o, on));
    else CK(gpu::gemv_bf16(L.w, L.out, L.in, in + t * L.in, T, o, on));
  });
}

void Qwen35MoeGpu::Impl::shared_inputs(const DevLayer& L, const float* x, int64_t n, float* sg, float* su, float* sgate, cudaStream_t on) {
  gemv_stack(L.sh_gate_up, {{&L.sh_gate, sg}, {&L.sh_up, su}}, x, n, on);
  if (!L.router_gate.out) gemv_rows(L.sh_expert_gate, x, n, gpu::RowsOut::one(sgate, L.sh_expert_gate.out), on);
}

// The members of a stacked projection (DevLayer::in_proj, x_proj, sh_gate_up) for n tokens, each into
// its own rows [n, member.out]: with `gemv` (a step's few rows) one launch of the stack for every 8
// tokens, its outputs split by member (gpu::RowsOut); else, or with no stack, member by member.
void Qwen35MoeGpu::Impl::linear_stack(const DevLinear& stack, std::initializer_list<StackMember> members, const float* in, int64_t n,
                                      bool gemv) {
  if (!gemv || !stack.out) {
    for (const StackMember& m : members) linear_rows(*m.part, in, n, m.out, gemv);
    return;
  }
  gemv_stack(stack, members, in, n, stream);
}

gpu::RowsOut Qwen35MoeGpu::Impl::stack_out(const DevLinear& stack, std::initializer_list<StackMember> members) {
  if (members.size() > static_cast<size_t>(gpu::RowsOut::kMaxParts)) fail("internal: a stack of ", members.size(), " members");
  gpu::RowsOut o;
  for (const StackMember& m : members) {
    o.dst[o.parts] = m.out;
    o.end[o.parts] = (o.parts ? o.end[o.parts - 1] : 0) + m.part->out;
    ++o.parts;
  }
  if (o.end[o.parts - 1] != stack.out) fail("internal: a stack of ", stack.out, " rows read as members of ", o.end[o.parts - 1]);
  return o;
}

void Qwen35MoeGpu::Impl::gemv_stack(const DevLinear& stack, std::initializer_list<StackMember> members, const float* in, int64_t n, cudaStream_t on) {
  if (!stack.out) {
    for (const StackMember& m : members) gemv_rows(*m.part, in, n, gpu::RowsOut::one(m.out, m.part->out), on);
    return;
  }
  gemv_rows(stack, in, n, stack_out(stack, members), on);
}

// One layer of batched prefill for n tokens whose hidden states are h [n, H] (updated in place) at
// positions pos_dev; `streamed`: the layer's expert table with its host experts streamed to the GPU
// (prefill_streamed), nullptr: host experts on the host. With `batch` the n tokens are a step_rows
// step's (several sequences, each token on its own slot): the GEMVs and the decode kernels instead
// of cuBLAS and the prompt kernels, stacked projections in one launch, the same walk otherwise.
// `normed`: px already holds this layer's input norm of h (the layer before returned true). Returns
// whether px holds the next layer's: the layer's last residual add and that norm in one launch, where a
// next layer follows and no deferred host sum joins after the add (h is then updated all the same).
bool Qwen35MoeGpu::Impl::prefill_layer(size_t li, float* hbuf, int64_t n, const int32_t* pos_dev, const gpu::Int4Expert* streamed,
                                       const Batch* batch, bool normed) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, Is = c.shared_expert_intermediate_size;
  const int k = c.num_experts_per_tok, rows_n = static_cast<int>(n);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const DevLayer& L = layer_at(li);  // li = num_layers: the MTP head's layer
  const bool gemv = batch != nullptr;
  const int64_t R = rows;
  // --trace: a step's layers (not prompt chunks, not the head's layer) marked as decode's are (trace_end)
  Trace* tr = batch && li < layers.size() ? Trace::active() : nullptr;
  mark(tr, li, 0);
  if (!normed) CK(gpu::rmsnorm_zc(hbuf, L.in_norm, H, rows_n, eps, px, stream));
  if (L.kind == LayerKind::LinearAttention) {
    linear_stack(L.in_proj, {{&L.qkv, pqkv}, {&L.z, pz}, {&L.b, pb}, {&L.a, pa}}, px, n, gemv);
    gpu::DeltaNetDecodeArgs p = deltanet_args(L, batch ? -1 : cur);
    p.qkv = pqkv, p.z = pz, p.b = pb, p.a = pa, p.conv_out = pconv, p.out = pcore;
    if (batch) {  // each sequence's tokens in order on its own state (bio: each group's slot and first token)
      p.tokens = rows_n, p.groups = batch->groups, p.slot = bio + 3 * R, p.first = bio + 4 * R;
      if (batch->keep) p.kept_conv = L.kept_conv, p.kept_state = L.kept_state;
      CK(gpu::deltanet_decode(p, stream));
    } else {
      p.chunk_terms = pterms;
      CK(gpu::deltanet_prefill_chunked(p, rows_n, stream));
    }
    linear_rows(L.out_proj, pcore, n, po, gemv);
  } else {
    linear_stack(L.in_proj, {{&L.q, pqg}, {&L.k, pk}, {&L.v, pv}}, px, n, gemv);
    gpu::AttentionDecodeArgs p = attention_args(L, batch ? -1 : cur);
    p.qg = pqg, p.k = pk, p.v = pv, p.pos = pos_dev, p.q_rot = pattn, p.out = pattn;  // q_rot may alias out
    if (batch) {  // each token on its own sequence's cache (bio: its slot), all keys in before any attends
      p.tokens = rows_n, p.slot = bio + 2 * R, p.partial = bpart;
      CK(gpu::attention_decode(p, stream));
    } else {  // the whole chunk at once, causal inside it
      CK(gpu::attention_prefill(p, rows_n, stream));
    }
    linear_rows(L.o, pattn, n, po, gemv);
  }
  mark(tr, li, 1);
  const gpu::QuantX qx = moe_x(L, n, phs);  // x quantised for the decode MoE by its norm
  CK(gpu::add_rmsnorm_zc(hbuf, po, nullptr, nullptr, L.post_norm, H, rows_n, eps, px, stream, qx));  // h += o, then the norm
  // A step's rows: the router with the shared expert's gate, up and gate logit in one launch (x_proj),
  // or with its gate logit (router_gate)
  const bool x_stacked = gemv && L.x_proj.out;
  if (x_stacked) linear_stack(L.x_proj, {{&L.router, prouter}, {&L.sh_gate, psg}, {&L.sh_up, psu}, {&L.sh_expert_gate, psgate}}, px, n, gemv);
  else if (L.router_gate.out) linear_stack(L.router_gate, {{&L.router, prouter}, {&L.sh_expert_gate, psgate}}, px, n, gemv);
  else linear_rows(L.router, px, n, prouter, gemv);
  CK(gpu::router_topk(prouter, c.num_experts, k, rows_n, ptopk_ids, ptopk_w, stream));
  // Streamed: the layer's host experts run on the GPU from `streamed`, the host computes none.
  const bool split = L.cpu_experts && opts.host_experts && !streamed;
  if (split) hy.post_copy(px, ptopk_ids, ptopk_w, n, stream);
  mark(tr, li, 2);
  auto shared_down = [&](cudaStream_t on) {  // silu(gate) * up formed as the down GEMV reads it
    each_launch(n, [&](int64_t t, int T) {
      swiglu_down(L.sh_down, psg + t * Is, psu + t * Is, T, psd + t * H, on);
    });
  };
  // As in decode: the shared expert's down GEMV on the side stream, beside the routed experts (with its
  // gate, up and gate logit too where no x_proj stack computed them)
  const bool beside = gemv && shared_beside_ok(L) && L.sh_down.swiglu_fused() && !split && !deferring();
  if (beside) {
    CK(cudaEventRecord(fork_ev, stream));
    CK(cudaStreamWaitEvent(side, fork_ev, 0));
    if (!x_stacked) shared_inputs(L, px, n, psg, psu, psgate, side);
    shared_down(side);
    CK(cudaEventRecord(join_ev, side));
  }
  gpu_experts(L, px, ptopk_ids, ptopk_w, n, pxh, phs, pmoe, streamed, qx.parts != nullptr);
  if (!x_stacked && !beside) {
    linear_stack(L.sh_gate_up, {{&L.sh_gate, psg}, {&L.sh_up, psu}}, px, n, gemv);
    if (!L.router_gate.out) linear_rows(L.sh_expert_gate, px, n, psgate, gemv);
  }
  if (beside) {
    CK(cudaStreamWaitEvent(stream, join_ev, 0));
  } else if (gemv && L.sh_down.swiglu_fused()) {
    shared_down(stream);
  } else {
    CK(gpu::silu_mul(psg, psu, n * Is, stream));
    linear_rows(L.sh_down, psg, n, psd, gemv);
  }
  if (split) CK(gpu::gated_add(pmoe, psd, psgate, H, rows_n, stream));  // before the host's sum joins
  mark(tr, li, 3);
  hy.run_deferred(def_dev, stream);
  if (split)
    hy.serve_copy(li, n, pcpu, pmoe, stream,
                  batch && li < layers.size() ? HybridDispatch::Pass::batch : HybridDispatch::Pass::prefill);  // the head's drafts: not decode's counts
  else if (batch && li < layers.size()) counts.gpu += static_cast<uint64_t>(n) * k;
  // h += the routed experts' sum + the gated shared expert (unless added above)
  const float* shared = split ? nullptr : psd;
  const float* gate = split ? nullptr : psgate;
  if (li + 1 < layers.size() && !deferring()) {
    CK(gpu::add_rmsnorm_zc(hbuf, pmoe, shared, gate, layers[li + 1].in_norm, H, rows_n, eps, px, stream));
    mark(tr, li, 4);
    return true;
  }
  if (shared) CK(gpu::gated_add(pmoe, shared, gate, H, rows_n, stream));
  CK(gpu::add_inplace(hbuf, pmoe, n * H, stream));
  hy.add_deferred(hbuf, def_dev, stream);
  mark(tr, li, 4);
  return false;
}

// The last token's logits after a prefill (h_last: its hidden state) to logits_last, when given.
void Qwen35MoeGpu::Impl::prefill_logits(const float* h_last, float* logits_last) {
  const ModelConfig& c = model.config();
  if (!logits_last) return;
  CK(gpu::rmsnorm_zc(h_last, final_norm, c.hidden_size, 1, static_cast<float>(c.rms_norm_eps), x, stream));
  linear(lm_head, x, logits);
  if (logits_last != &logits_sink)
    CK(cudaMemcpyAsync(logits_last, logits, c.vocab_size * sizeof(float), cudaMemcpyDeviceToHost, stream));
}

// A prompt piece's inputs: positions pos.. into pos_dev, the embedding rows of its n tokens into
// h_dev [n, H]: looked up on the GPU (ids through ids_dev), or, with the table in host memory,
// gathered there into the pinned staging rows and copied over.
void Qwen35MoeGpu::Impl::prefill_inputs(const int32_t* ids_host, int64_t n, int32_t* ids_dev, int32_t* pos_dev, float* h_dev) {
  const int64_t H = model.config().hidden_size;
  host_pos.resize(n);
  for (int64_t t = 0; t < n; ++t) host_pos[t] = static_cast<int32_t>(pos + t);
  CK(cudaMemcpyAsync(pos_dev, host_pos.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  if (embed) {
    CK(cudaMemcpyAsync(ids_dev, ids_host, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    CK(gpu::embed_bf16(embed, H, ids_dev, static_cast<int>(n), h_dev, stream));
    return;
  }
  host_embedding_rows(ids_host, n, h_dev);
}

// The embedding rows of n tokens from the table in host memory: gathered into the pinned staging rows
// (hembed), then copied to h_dev [n, H] on the stream.
void Qwen35MoeGpu::Impl::host_embedding_rows(const int32_t* ids_host, int64_t n, float* h_dev) {
  const int64_t H = model.config().hidden_size;
  if (n > hembed_rows) fail("internal: ", n, " embedding rows for a staging buffer of ", hembed_rows);
  CK(cudaStreamSynchronize(stream));  // the previous rows have left the staging buffer
  const LinearWeight& E = model.embed();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < H; ++i) hembed[t * H + i] = load_as_f32(E.dense, E.dense_dtype, int64_t(ids_host[t]) * H + i);
  CK(cudaMemcpyAsync(h_dev, hembed, n * H * sizeof(float), cudaMemcpyHostToDevice, stream));
}

// n prompt tokens at positions pos.. through every layer at once (GpuOptions::prefill_chunk);
// logits of the last token to logits_last when given. Same math as n decode steps, except that
// bf16 projections run on cuBLAS with split-bf16 activations (~1e-5) instead of the GEMV.
void Qwen35MoeGpu::Impl::prefill_chunk(const int32_t* ids_host, int64_t n, float* logits_last, float* hidden) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size;
  prefill_inputs(ids_host, n, pids, ppos, ph);
  bool normed = false;
  for (size_t li = 0; li < layers.size(); ++li) normed = prefill_layer(li, ph, n, ppos, nullptr, nullptr, normed);
  hy.run_deferred(def_dev, stream);
  hy.add_deferred(ph, def_dev, stream);
  pos += n;
  if (hidden) {  // every row after the final norm (the MTP head's input), copied out
    CK(gpu::rmsnorm_zc(ph, final_norm, H, static_cast<int>(n), static_cast<float>(c.rms_norm_eps), px, stream));
    CK(cudaMemcpyAsync(hidden, px, n * H * sizeof(float), cudaMemcpyDeviceToHost, stream));
  }
  prefill_logits(ph + (n - 1) * H, logits_last);
  CK(cudaStreamSynchronize(stream));  // the host buffers (ids, positions) are free again
}

}  // namespace tandem
