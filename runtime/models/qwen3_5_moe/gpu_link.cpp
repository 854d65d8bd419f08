// runtime/models/qwen3_5_moe/gpu_link.cpp: the link experts (experts.link): host-resident experts the GPU
// computes itself, reading their weights in place over PCIe (see gpu_impl.h; the host's side of a hybrid
// step is hybrid_dispatch.cpp).
#include <algorithm>

#include "gpu_core/device.cuh"
#include "gpu_core/int4_layout.h"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {

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

}  // namespace tandem
