#include "runtime/models/qwen3_5_moe/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/trace.h"

namespace tandem {

namespace {

const void* key_of(const LinearWeight& w) {
  return w.kind == LinearWeight::Kind::Gptq ? static_cast<const void*>(w.gptq.qweight) : w.dense;
}

cpu::CpuExpertStoreOptions store_options(const Qwen35Moe& m, const CpuBackendOptions& o) {
  cpu::CpuExpertStoreOptions s;
  s.format = m.gptq_experts() ? cpu::WeightFormat::Int4 : o.dense_expert_format;
  s.dense_format = o.dense_expert_format;
  s.act = o.expert_act;
  return s;
}

// The dense projections (attention, DeltaNet, router, shared expert, lm_head) keep fp32 activations:
// AMX-BF16 rounds them to bf16, and through the router's top-k that moved the HF fixtures' logits by up
// to 3.5e-2 (1.4e-4 with the AVX-512 kernel, which every AMX machine has). The routed experts keep the
// chosen level's kernels (int formats: the same bits at every level).
cpu::MatmulFn dense_matmul_for(const cpu::CpuKernels& k) {
  const cpu::Isa isa = k.isa == cpu::Isa::Amx ? cpu::Isa::Avx512 : k.isa;
  return cpu::cpu_kernels(isa).matmul[static_cast<int>(cpu::WeightFormat::BF16)];
}

}  // namespace

CpuBackend::CpuBackend(const Qwen35Moe& model, const CpuBackendOptions& opts)
    : pool_(cpu::ThreadPool::Options{opts.threads, true, false, 300}),
      kernels_(cpu::default_cpu_kernels()),
      dense_matmul_(dense_matmul_for(kernels_)),
      experts_(store_options(model, opts)),
      hidden_(model.config().hidden_size) {
  auto pack_dense = [&](const LinearWeight& w) {
    if (w.empty() || dense_.count(key_of(w))) return;
    cpu::PackOptions po;
    po.format = cpu::WeightFormat::BF16;
    dense_.emplace(key_of(w), cpu::pack_weight(w, po, arena_));
  };
  auto add_layer = [&](int l, const LayerWeights& L) {
    for (const LinearWeight* w : {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.deltanet.in_proj_qkv,
                                  &L.deltanet.in_proj_z, &L.deltanet.in_proj_a, &L.deltanet.in_proj_b, &L.deltanet.out_proj,
                                  &L.moe.router, &L.moe.shared_gate, &L.moe.shared_up, &L.moe.shared_down,
                                  &L.moe.shared_expert_gate})
      pack_dense(*w);
    experts_.add_layer(l, L.moe, {}, &pool_);
  };
  for (size_t l = 0; l < model.layers().size(); ++l) add_layer(static_cast<int>(l), model.layers()[l]);
  if (opts.mtp && model.mtp()) {  // the MTP head's layer at index num_layers, as the model's walk numbers it
    add_layer(model.config().num_layers, model.mtp()->layer);
    pack_dense(model.mtp()->fc);
  }
  pack_dense(model.lm_head());
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::linear(const LinearWeight& w, const float* x, int64_t T, float* y) {
  const auto it = dense_.find(key_of(w));
  if (it == dense_.end()) {  // not a weight of the model this backend was built for
    linear_ref(w, x, T, y);
    return;
  }
  const cpu::PackedMatrix& m = it->second;
  const float* act = x;
  int64_t stride = w.in;
  if (m.cols_padded != w.in) {  // the bf16 layout pads the input dimension with zero weights
    padded_.assign(static_cast<size_t>(T * m.cols_padded), 0.0f);
    for (int64_t t = 0; t < T; ++t) std::memcpy(padded_.data() + t * m.cols_padded, x + t * w.in, w.in * sizeof(float));
    act = padded_.data();
    stride = m.cols_padded;
  }
  rows_.resize(T);
  for (int64_t t = 0; t < T; ++t) rows_[t] = static_cast<int32_t>(t);
  // Tasks of whole 16-row tiles, a few per worker; each writes its own column slice of out_tiles_.
  const int64_t tiles = m.tiles, per = std::max<int64_t>(1, tiles / (pool_.threads() * 4)), tasks = (tiles + per - 1) / per;
  const int64_t ld = tiles * cpu::kTileRows;
  out_tiles_.resize(static_cast<size_t>(T * ld));
  cpu::ActRows a;
  a.f = act;
  a.f_stride = stride;
  a.rows = rows_.data();
  a.nrows = T;
  pool_.run(tasks, [&](int64_t task, int) {
    const int64_t t0 = task * per, t1 = std::min(tiles, t0 + per);
    dense_matmul_(m, t0, t1, a, out_tiles_.data() + t0 * cpu::kTileRows, ld);
  });
  for (int64_t t = 0; t < T; ++t) std::memcpy(y + t * w.out, out_tiles_.data() + t * ld, w.out * sizeof(float));
}

void CpuBackend::routed_experts(int layer, const float* x, int64_t T, const int32_t* ids, const float* weights, int k,
                                float* out) {
  TraceSpan span("cpu experts, layer", "cpu", layer);
  std::fill_n(out, T * hidden_, 0.0f);
  cpu::cpu_moe_forward(experts_, layer, x, T, ids, weights, k, out, pool_, moe_ws_, kernels_);
}

std::string CpuBackend::describe() const {
  return str_cat(cpu::default_isa().description, "; ", pool_.description(), "; experts ", experts_.description());
}

}  // namespace tandem
