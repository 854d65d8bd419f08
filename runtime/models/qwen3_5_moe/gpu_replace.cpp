// runtime/models/qwen3_5_moe/gpu_replace.cpp: online re-placement of routed experts during hybrid
// decode (GpuOptions::replace, runtime/engine/expert_swap.h; the state is Impl::rp, described there).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "gpu_core/int4_layout.h"
#include "core/dtype.h"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {

namespace {

struct Piece {
  void* dst;
  uint64_t bytes;
};

// A GPU expert slot's device allocations in the order pack_expert fills its staging buffer.
std::vector<Piece> slot_pieces(const gpu::Int4Expert& e) {
  std::vector<Piece> out;
  for (const gpu::Int4View* v : {&e.gate, &e.up, &e.down}) {
    const uint64_t G = static_cast<uint64_t>(v->K / v->group_size), N = static_cast<uint64_t>(v->N);
    out.push_back({const_cast<uint32_t*>(v->qweight), N * static_cast<uint64_t>(v->K) / 2});
    out.push_back({const_cast<uint16_t*>(v->scales), N * G * 2});
    out.push_back({const_cast<uint8_t*>(v->zeros), N * G});
    if (v->perm) out.push_back({const_cast<int32_t*>(v->perm), static_cast<uint64_t>(v->K) * 4});
  }
  return out;
}

std::vector<Piece> slot_pieces(const gpu::Bf16Expert& e, int64_t H, int64_t I) {
  const uint64_t n = static_cast<uint64_t>(H * I) * 2;
  return {{const_cast<uint16_t*>(e.gate), n}, {const_cast<uint16_t*>(e.up), n}, {const_cast<uint16_t*>(e.down), n}};
}

}  // namespace

// The slot's pieces as pack_expert lays them out in staging: each at a 256-byte boundary, as the
// arena allocated them one after another (Uploader::alloc); `contiguous` when the slot's pieces do lie
// so on the device, and one copy of `span` bytes moves the expert.
Qwen35MoeGpu::Impl::SlotImage Qwen35MoeGpu::Impl::slot_image(const Move& m) const {
  const ModelConfig& c = model.config();
  SlotImage s;
  const std::vector<Piece> pieces =
      layers[m.layer].int4_experts ? slot_pieces(m.i4) : slot_pieces(m.b16, c.hidden_size, c.moe_intermediate_size);
  const char* base = static_cast<const char*>(pieces.front().dst);
  uint64_t off = 0;
  for (const Piece& p : pieces) {
    off = (off + 255) / 256 * 256;
    s.contiguous = s.contiguous && static_cast<const char*>(p.dst) == base + off;
    s.pieces.push_back({p.dst, off, p.bytes});
    off += p.bytes;
  }
  s.span = off;
  return s;
}

void Qwen35MoeGpu::Impl::replace_setup() {
  const ModelConfig& c = model.config();
  const int64_t E = c.num_experts;
  if (!opts.replace.on() || !opts.host_experts || resident.empty()) return;
  rp.on = true;
  rp.heat.assign(layers.size(), std::vector<uint64_t>(E, 0));
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].cpu_experts) continue;
    for (int64_t e = 0; e < E; ++e) {
      if (!opts.host_experts->holds(static_cast<int>(l), static_cast<int>(e)))
        fail("online re-placement (experts.replace): the host side does not hold expert ", e, " of layer ", l,
             "; it must hold every expert of the layers that have host experts");
    }
  }
  // Staging for the largest slot image of any GPU-resident expert (every slot of a model has the same shape).
  for (size_t l = 0; l < layers.size(); ++l)
    for (int64_t e = 0; e < E; ++e) {
      if (!resident[l][e]) continue;
      Move m;
      m.layer = static_cast<int>(l), m.i4 = rp.i4[l][e], m.b16 = rp.b16[l][e];
      rp.slot_bytes = std::max(rp.slot_bytes, slot_image(m).span);
    }
  CK(cudaStreamCreateWithFlags(&rp.copy, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&rp.freed, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&rp.written, cudaEventDisableTiming));
  CK(cudaEventRecord(rp.written, stream));
  rp.touched.assign(layers.size(), 0);
  const size_t row = static_cast<size_t>(E) * std::max(sizeof(gpu::Int4Expert), sizeof(gpu::Bf16Expert));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&rp.rows), 2 * layers.size() * row, cudaHostAllocDefault));
  const int n = std::max(1, opts.replace.max_moving);
  for (int i = 0; i < n && rp.slot_bytes; ++i) {
    char* p = nullptr;
    CK(cudaHostAlloc(reinterpret_cast<void**>(&p), rp.slot_bytes, cudaHostAllocDefault));
    rp.staging.push_back(p);
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    rp.copied.push_back(ev);
    rp.free.push_back(i);
  }
}

void Qwen35MoeGpu::Impl::place(int l, int e, bool gpu, const gpu::Int4Expert& i4, const gpu::Bf16Expert& b16) {
  resident[l][e] = gpu;
  rp.i4[l][e] = i4;
  rp.b16[l][e] = b16;
  // Streamed prefill streams the plan's host experts whatever happens to them; a plan's GPU expert runs
  // there from its slot, or (displaced) on the host.
  if (!plan_host(l, e)) rp.stream_i4[l][e] = i4;
  rp.touched[l] = 1;
}

bool Qwen35MoeGpu::Impl::displaced(int l) const {
  for (size_t e = 0; e < resident[l].size(); ++e)
    if (!resident[l][e] && !plan_host(l, static_cast<int64_t>(e))) return true;
  return false;
}

void Qwen35MoeGpu::Impl::flush_tables() {
  const int64_t E = model.config().num_experts;
  const size_t row = static_cast<size_t>(E) * std::max(sizeof(gpu::Int4Expert), sizeof(gpu::Bf16Expert));
  const size_t L = layers.size();
  bool any = false;
  for (size_t l = 0; l < L; ++l) {
    if (!rp.touched[l]) continue;
    if (!any) CK(cudaEventSynchronize(rp.written));  // the previous copies have read their rows
    any = true;
    rp.touched[l] = 0;
    char* mine = rp.rows + l * row;
    const DevLayer& D = layers[l];
    if (D.experts_i4) {
      std::memcpy(mine, rp.i4[l].data(), E * sizeof(gpu::Int4Expert));
      CK(cudaMemcpyAsync(D.experts_i4, mine, E * sizeof(gpu::Int4Expert), cudaMemcpyHostToDevice, stream));
    } else {
      std::memcpy(mine, rp.b16[l].data(), E * sizeof(gpu::Bf16Expert));
      CK(cudaMemcpyAsync(D.experts_bf16, mine, E * sizeof(gpu::Bf16Expert), cudaMemcpyHostToDevice, stream));
    }
    if (streams(l)) {
      char* streamed = rp.rows + (L + l) * row;
      std::memcpy(streamed, rp.stream_i4[l].data(), E * sizeof(gpu::Int4Expert));
      CK(cudaMemcpyAsync(st.tables + l * E, streamed, E * sizeof(gpu::Int4Expert), cudaMemcpyHostToDevice, stream));
    }
  }
  if (any) CK(cudaEventRecord(rp.written, stream));
}

// Expert e of layer li in the GPU layout, each piece at its offset of the slot image (runs on a worker
// thread: reads the model's weights and writes dst only).
void Qwen35MoeGpu::Impl::pack_expert(int li, int e, const gpu::Int4Expert& slot, const SlotImage& image, char* dst) const {
  const MoeWeights& w = model.layers()[li].moe;
  const LinearWeight* mats[3] = {&w.gate[e], &w.up[e], &w.down[e]};
  if (layers[li].int4_experts) {
    const gpu::Int4View* views[3] = {&slot.gate, &slot.up, &slot.down};
    size_t piece = 0;
    for (int j = 0; j < 3; ++j) {
      const LinearWeight& L = *mats[j];
      const gpu::Int4View& v = *views[j];
      const gpu::Int4Host h = gpu::repack_gptq_int4({L.gptq.qweight, L.gptq.qzeros, static_cast<const uint16_t*>(L.gptq.scales),
                                                     L.gptq.g_idx, L.out, L.in, L.gptq.group_size, L.gptq.zero_offset});
      const uint64_t G = static_cast<uint64_t>(v.K / v.group_size), N = static_cast<uint64_t>(v.N);
      if (h.N != v.N || h.K != v.K || h.group_size != v.group_size || (L.gptq.g_idx != nullptr) != (v.perm != nullptr))
        fail(L.name, ": re-placement needs it in the shape and format of the slot it takes");
      auto put = [&](const void* src, uint64_t bytes) {
        const SlotImage::Piece& at = image.pieces.at(piece++);
        if (at.bytes != bytes) fail(L.name, ": re-placement packs ", bytes, " bytes into a ", at.bytes, "-byte piece");
        std::memcpy(dst + at.offset, src, bytes);
      };
      put(h.qweight.data(), N * static_cast<uint64_t>(v.K) / 2);
      put(h.scales.data(), N * G * 2);
      put(h.zeros.data(), N * G);
      if (v.perm) put(h.perm.data(), static_cast<uint64_t>(v.K) * 4);
    }
    return;
  }
  for (int j = 0; j < 3; ++j) {
    const LinearWeight* L = mats[j];
    const size_t n = static_cast<size_t>(L->out * L->in);
    auto* out = reinterpret_cast<uint16_t*>(dst + image.pieces.at(j).offset);
    if (L->dense_dtype == DType::BF16) std::memcpy(out, L->dense, n * 2);
    else
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(load_as_f32(L->dense, L->dense_dtype, static_cast<int64_t>(i)));
  }
}

// Runs on the decode thread between steps, so it stays cheap: moves are packed, copied and arrive in
// batch order (one worker, one copy stream), so the first move not yet packed / arrived ends each scan.
void Qwen35MoeGpu::Impl::finish_moves(bool wait) {
  if (rp.packer.valid() && (wait || rp.packer.wait_for(std::chrono::seconds(0)) == std::future_status::ready))
    rp.packer.get();  // the batch is packed; a failed pack throws here
  const int packed = rp.packed.load(std::memory_order_acquire);
  for (Move& m : rp.moving) {
    if (m.copying) continue;
    if (m.order >= packed) break;
    if (m.order == 0) CK(cudaStreamWaitEvent(rp.copy, rp.freed, 0));  // no step reads the batch's slots any more
    const SlotImage image = slot_image(m);
    const char* src = rp.staging[m.staging];
    if (image.contiguous) {
      CK(cudaMemcpyAsync(image.pieces.front().dst, src, image.span, cudaMemcpyHostToDevice, rp.copy));
    } else {
      for (const SlotImage::Piece& p : image.pieces) CK(cudaMemcpyAsync(p.dst, src + p.offset, p.bytes, cudaMemcpyHostToDevice, rp.copy));
    }
    CK(cudaEventRecord(rp.copied[m.staging], rp.copy));
    m.copying = true;
  }
  for (Move& m : rp.moving) {
    if (!m.copying) break;
    if (wait) {
      CK(cudaEventSynchronize(rp.copied[m.staging]));
    } else {
      const cudaError_t q = cudaEventQuery(rp.copied[m.staging]);
      if (q == cudaErrorNotReady) break;
      CK(q);
    }
    place(m.layer, m.expert, true, m.i4, m.b16);  // arrived: the GPU serves it from the next step on
    ++counts.swaps;
    rp.free.push_back(m.staging);
    m.staging = -1;
  }
  std::erase_if(rp.moving, [](const Move& m) { return m.staging < 0; });
  flush_tables();
}

void Qwen35MoeGpu::Impl::replace_tick() {
  if (!rp.on) return;
  if (!rp.moving.empty()) finish_moves(false);
  if (rp.paused || ++rp.since < opts.replace.every || !rp.moving.empty()) return;
  rp.since = 0;
  const std::vector<ExpertSwap> swaps = opts.replace.policy(resident, rp.heat);
  const int64_t E = model.config().num_experts;
  struct Job {
    int layer, expert;
    gpu::Int4Expert slot;
    SlotImage image;
    char* dst;
  };
  std::vector<Job> jobs;
  for (const ExpertSwap& s : swaps) {
    if (rp.free.empty()) break;
    const int l = s.layer;
    if (l < 0 || l >= static_cast<int>(layers.size()) || s.to_gpu < 0 || s.to_gpu >= E || s.to_cpu < 0 || s.to_cpu >= E ||
        resident[l][s.to_gpu] || !resident[l][s.to_cpu] || !layers[l].cpu_experts)
      fail("online re-placement: the policy asked to swap expert ", s.to_gpu, " in and ", s.to_cpu, " out in layer ", l,
           ", which the placement does not allow");
    Move m;
    m.layer = l, m.expert = s.to_gpu;
    m.i4 = rp.i4[l][s.to_cpu];
    m.b16 = rp.b16[l][s.to_cpu];
    if (layers[l].int4_experts && (model.layers()[l].moe.gate[s.to_gpu].gptq.g_idx != nullptr) != (m.i4.gate.perm != nullptr))
      continue;  // act order in one and not the other: the slot does not fit it
    place(l, s.to_cpu, false, {}, {});  // the outgoing expert is the host's from the next step on
    m.staging = rp.free.back();
    rp.free.pop_back();
    m.order = static_cast<int>(jobs.size());
    jobs.push_back({l, s.to_gpu, m.i4, slot_image(m), rp.staging[m.staging]});
    rp.moving.push_back(m);
  }
  if (!jobs.empty()) {
    flush_tables();
    CK(cudaEventRecord(rp.freed, stream));  // after the table writes: later steps skip the slots
    // One worker thread, one expert after another, at idle priority: the host's expert workers (one
    // per core, spinning while a layer runs) keep their cores; it packs while they sleep.
    rp.packed.store(0, std::memory_order_relaxed);
    rp.packer = std::async(std::launch::async, [this, jobs = std::move(jobs)] {
      sched_param idle{};
      pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);  // best effort: a refusal leaves it as it was
      for (size_t i = 0; i < jobs.size(); ++i) {
        pack_expert(jobs[i].layer, jobs[i].expert, jobs[i].slot, jobs[i].image, jobs[i].dst);
        rp.packed.store(static_cast<int>(i) + 1, std::memory_order_release);
      }
    });
  }
  for (auto& row : rp.heat)  // a sliding window: older activations count less
    for (uint64_t& h : row) h = static_cast<uint64_t>(static_cast<double>(h) * opts.replace.decay);
}

const std::vector<std::vector<uint8_t>>& Qwen35MoeGpu::expert_placement() const { return impl_->resident; }

void Qwen35MoeGpu::settle_replacement() {
  if (impl_->rp.on) impl_->finish_moves(true);
}

void Qwen35MoeGpu::pause_replacement(bool paused) { impl_->rp.paused = paused; }

}  // namespace tandem
