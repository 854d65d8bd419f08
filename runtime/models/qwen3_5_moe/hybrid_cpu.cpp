// runtime/models/qwen3_5_moe/hybrid_cpu.cpp: the host side's experts of a hybrid run (make_cpu_experts,
// hybrid_dispatch.h) on the cpu_experts kernels.
#include <string>
#include <vector>

#include "core/error.h"
#include "core/trace.h"
#include "cpu_experts/cpu_moe.h"
#include "gpu_core/device.cuh"
#include "gpu_core/int4_layout.h"
#include "runtime/models/qwen3_5_moe/hybrid_dispatch.h"

namespace tandem {

namespace {

// The CPU side of a hybrid run: the routed experts the plan leaves in host memory, repacked once into
// the cpu_experts layout (and placed on their NUMA nodes), then page-locked with CUDA so they can
// move by DMA, and run on the pinned worker pool when the GPU hands a layer over.
class CpuExperts final : public HostExperts {
  // How long idle workers spin before they sleep: past a decode token's gap between its last host layer
  // and the next token's first (lm_head, sampling, the next launch, the first mixer: ~0.5 ms on the
  // H200 machine), so that a token's first host layer does not wait for sleeping workers to wake.
  static constexpr int kPoolSpinUs = 2000;

 public:
  CpuExperts(const Qwen35Moe& model, const std::vector<std::vector<uint8_t>>& expert_on_gpu, const std::string& format, int threads, bool mtp_head)
      : pool_(cpu::ThreadPool::Options{threads, true, false, kPoolSpinUs}), store_(store_options(format)) {
    const auto& layers = model.layers();
    for (size_t l = 0; l < layers.size(); ++l) {
      std::vector<int> ids;
      for (size_t e = 0; e < expert_on_gpu[l].size(); ++e)
        if (!expert_on_gpu[l][e]) ids.push_back(static_cast<int>(e));
      if (!ids.empty()) store_.add_layer(static_cast<int>(l), layers[l].moe, ids, &pool_);
      host_ids_.push_back(std::move(ids));
    }
    if (mtp_head) {  // every expert of the head, as the layer after the model's
      if (!model.mtp()) fail("the MTP head's experts in host memory: ", model.checkpoint().dir(), " has no MTP head");
      const MoeWeights& head = model.mtp()->layer.moe;
      std::vector<int> ids(head.gate.size());
      for (size_t e = 0; e < ids.size(); ++e) ids[e] = static_cast<int>(e);
      store_.add_layer(static_cast<int>(layers.size()), head, ids, &pool_);
      host_ids_.push_back(std::move(ids));
    }
    // After packing and NUMA binding: locked pages cannot migrate.
    char reason[256] = {0};
    for (const auto& [p, bytes] : store_.mappings()) {
      if (gpu::host_register(p, bytes, reason, sizeof reason)) {
        registered_.push_back(p);
        registered_bytes_ += bytes;
      } else {
        unregistered_bytes_ += bytes;
        register_error_ = reason;
      }
    }
  }
  ~CpuExperts() override {
    for (void* p : registered_) gpu::host_unregister(p);
  }
  CpuExperts(const CpuExperts&) = delete;
  CpuExperts& operator=(const CpuExperts&) = delete;
  void run(int layer, const float* x, int64_t T, const int32_t* ids, const float* weights, int k, float* out) override {
    TraceSpan span("cpu experts, layer", "cpu", layer);
    cpu::cpu_moe_forward(store_, layer, x, T, ids, weights, k, out, pool_, ws_);
  }
  // Each layer's experts were packed into one huge-page chunk (CpuExpertStore::add_layer): their
  // byte range is what crosses PCIe. Down's act order is folded into gate / up rows, so it has none.
  bool stream_layout(int layer, StreamLayer& out, std::string& why) const override {
    out = StreamLayer{};
    const uint8_t *lo = nullptr, *hi = nullptr;
    auto extend = [&](const void* p, uint64_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      if (!lo || b < lo) lo = b;
      if (!hi || b + n > hi) hi = b + n;
    };
    std::vector<std::pair<int, const cpu::ExpertWeights*>> found;
    if (layer >= 0 && layer < static_cast<int>(host_ids_.size()))
      for (int e : host_ids_[layer])
        if (const cpu::ExpertWeights* w = store_.find(layer, e)) found.push_back({e, w});
    for (const auto& [e, w] : found)
      for (const cpu::PackedMatrix* m : {&w->gate, &w->up, &w->down}) {
        if (m->format != cpu::WeightFormat::Int4 || m->cols_padded != m->cols) {
          why = str_cat("its CPU experts are ", cpu::format_name(m->format), m->cols_padded != m->cols ? " with padded columns" : "",
                        "; streaming over PCIe takes int4 experts (experts.cpu_format: int4)");
          return false;
        }
        const gpu::Int4TilePieces t = gpu::int4_tile_pieces(m->rows, m->cols, m->group_size);
        extend(m->w, t.w);
        extend(m->scales, t.scales);
        if (m->zeros) extend(m->zeros, t.zeros);
        if (m->col_perm) extend(m->col_perm, t.perm);
      }
    if (found.empty()) {
      why = "no host experts there";
      return false;
    }
    out.base = lo;
    out.bytes = static_cast<uint64_t>(hi - lo);
    auto view = [&](const cpu::PackedMatrix& m, bool perm) {
      StreamMatrix s;
      s.w = static_cast<uint64_t>(m.w - lo);
      s.scales = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(m.scales) - lo);
      if (m.zeros) s.zeros = static_cast<uint64_t>(m.zeros - lo);
      if (perm && m.col_perm) s.perm = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(m.col_perm) - lo);
      s.rows = m.rows, s.cols = m.cols, s.group_size = m.group_size;
      return s;
    };
    for (const auto& [e, w] : found) out.experts.push_back({e, view(w->gate, true), view(w->up, true), view(w->down, false)});
    return true;
  }
  std::string describe() const override {
    if (!store_.size()) return "no CPU experts";
    std::string s = store_.description() + str_cat(", ", registered_bytes_ >> 20, " MiB page-locked for DMA");
    if (unregistered_bytes_) s += str_cat(", ", unregistered_bytes_ >> 20, " MiB not (", register_error_, ")");
    return s;
  }

 private:
  static cpu::CpuExpertStoreOptions store_options(const std::string& fmt) {
    cpu::CpuExpertStoreOptions o;
    if (fmt == "int4") o.format = cpu::WeightFormat::Int4;
    else if (fmt == "int8") o.format = cpu::WeightFormat::Int8;
    else if (fmt == "bf16") o.format = cpu::WeightFormat::BF16;
    else fail("hybrid: CPU expert format must be int4, int8 or bf16 (got '", fmt, "')");
    o.dense_format = o.format == cpu::WeightFormat::Int4 ? cpu::WeightFormat::Int8 : o.format;
    return o;
  }
  cpu::ThreadPool pool_;
  cpu::CpuExpertStore store_;
  cpu::CpuMoeWorkspace ws_;
  std::vector<std::vector<int>> host_ids_;  // [layer]: the experts this side holds
  std::vector<void*> registered_;
  uint64_t registered_bytes_ = 0, unregistered_bytes_ = 0;
  std::string register_error_;
};


}  // namespace

std::unique_ptr<HostExperts> make_cpu_experts(const Qwen35Moe& model, const std::vector<std::vector<uint8_t>>& expert_on_gpu,
                                              const std::string& format, int threads, bool mtp_head) {
  return std::make_unique<CpuExperts>(model, expert_on_gpu, format, threads, mtp_head);
}

}  // namespace tandem
