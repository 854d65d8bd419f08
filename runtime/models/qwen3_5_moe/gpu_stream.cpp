// runtime/models/qwen3_5_moe/gpu_stream.cpp: the GPU model's streamed prefill (GpuOptions::
// stream_prefill_min_tokens): what the host experts offer to stream, each layer's expert table and
// conversion jobs, and the layer-by-layer pass that copies a layer's host experts while the GPU
// computes the one before (see gpu_impl.h).
#include <algorithm>

#include "gpu_core/int4_layout.h"
#include "gpu_core/ops.cuh"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {

static_assert(sizeof(gpu::Int4Expert) == gpu::kInt4ExpertBytes, "gpu::stream_buffer_bytes counts expert tables with this size");

// Layer l's host experts as HostExperts::stream_layout offers them (into sl), checked against the
// placement (as many, each a host expert there) and the model (every matrix's shape and groups, its
// pieces inside the byte range at `align`-byte offsets). false with `note` saying why otherwise.
bool Qwen35MoeGpu::Impl::host_layout(int l, int64_t gs, uint64_t align, HostExperts::StreamLayer& sl, std::string& note) const {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  const auto& on = (*opts.expert_on_gpu)[l];
  const int64_t host = std::count(on.begin(), on.end(), 0);
  std::string why;
  if (!opts.host_experts->stream_layout(l, sl, why)) {
    note = str_cat("layer ", l, ": ", why);
    return false;
  }
  if (static_cast<int64_t>(sl.experts.size()) != host) {
    note = str_cat("layer ", l, ": the host offers ", sl.experts.size(), " experts, the placement has ", host, " there");
    return false;
  }
  using SM = HostExperts::StreamMatrix;
  for (const HostExperts::StreamExpert& x : sl.experts) {
    if (x.expert < 0 || x.expert >= E || on[x.expert]) {
      note = str_cat("layer ", l, ": expert ", x.expert, " offered by the host is not a host expert");
      return false;
    }
    for (const SM* m : {&x.gate, &x.up, &x.down}) {
      const bool is_down = m == &x.down;
      const int64_t R = is_down ? H : I, C = is_down ? I : H;
      const gpu::Int4TilePieces t = gpu::int4_tile_pieces(R, C, gs);
      auto inside = [&](uint64_t off, uint64_t n) { return off != SM::kNone && off % align == 0 && off <= sl.bytes && n <= sl.bytes - off; };
      if (m->rows != R || m->cols != C || m->group_size != gs || !inside(m->w, t.w) || !inside(m->scales, t.scales) ||
          (m->zeros != SM::kNone && !inside(m->zeros, t.zeros)) || (m->perm != SM::kNone && !inside(m->perm, t.perm))) {
        note = str_cat("layer ", l, " expert ", x.expert, ": its host layout (", m->rows, " x ", m->cols, ", group ", m->group_size,
                       ") does not match the model's [", R, ", ", C, "] in groups of ", gs, " or lies outside its ", sl.bytes,
                       " bytes at ", align, "-byte offsets");
        return false;
      }
    }
  }
  return true;
}

// Streamed prefill: ask the host experts where each layer's lie and check every matrix against the
// model's shapes and the buffers' bounds; on any refusal streaming stays off and st.note says why.
void Qwen35MoeGpu::Impl::stream_setup() {
  st = Stream{};
  if (opts.stream_prefill_min_tokens <= 0 || !opts.host_experts || !wants_batched() || !opts.expert_on_gpu || opts.expert_on_gpu->empty())
    return;
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const int L = static_cast<int>(c.num_layers), E = static_cast<int>(c.num_experts);
  const auto& first = model.layers()[0].moe.gate[0];
  if (first.kind != LinearWeight::Kind::Gptq) {
    st.note = "streamed prefill needs GPTQ int4 experts (this checkpoint's are dense)";
    return;
  }
  const int64_t gs = st.group_size = first.gptq.group_size;
  st.layout.assign(L, {});
  for (int l = 0; l < L; ++l) {
    const auto& on = (*opts.expert_on_gpu)[l];
    const int host = static_cast<int>(std::count(on.begin(), on.end(), 0));
    if (!host) continue;
    if (!host_layout(l, gs, 4, st.layout[l], st.note)) return;
    st.max_experts = std::max(st.max_experts, host);
  }
  if (!st.max_experts) return;
  const uint64_t raw = gpu::stream_buffer_bytes(H, I, gs, E, L, st.max_experts, 1).raw;
  for (int l = 0; l < L; ++l)
    if (st.layout[l].bytes > raw) {
      st.note = str_cat("layer ", l, ": its host experts take ", st.layout[l].bytes, " bytes, more than the ", raw, " planned for them");
      return;
    }
  st.on = true;
}

// Layer li's expert table for streamed prefill: its GPU-resident experts as uploaded (i4), each host
// expert in a slot of st.rows (filled by that layer's conversion jobs, which read st.raw).
void Qwen35MoeGpu::Impl::stream_table(int li, const std::vector<gpu::Int4Expert>& i4) {
  const ModelConfig& c = model.config();
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size, gs = st.group_size;
  const uint64_t per_expert = 2 * gpu::int4_rows_bytes(I, H, gs) + gpu::int4_rows_bytes(H, I, gs);
  using SM = HostExperts::StreamMatrix;
  std::vector<gpu::Int4Expert> table = i4;
  std::vector<gpu::Int4TilesToRows> jobs;
  const auto& sl = st.layout[li];
  for (size_t i = 0; i < sl.experts.size(); ++i) {
    const HostExperts::StreamExpert& x = sl.experts[i];
    char* slot = st.rows + i * per_expert;
    auto take = [&](uint64_t b) {
      char* p = slot;
      slot += (b + 255) / 256 * 256;
      return p;
    };
    auto convert = [&](const SM& m, gpu::Int4View& v) {
      const int64_t G = m.cols / m.group_size;
      gpu::Int4TilesToRows j;
      j.w = reinterpret_cast<const uint8_t*>(st.raw + m.w);
      j.tile_scales = reinterpret_cast<const uint16_t*>(st.raw + m.scales);
      j.tile_zeros = m.zeros != SM::kNone ? reinterpret_cast<const uint8_t*>(st.raw + m.zeros) : nullptr;
      j.qweight = reinterpret_cast<uint32_t*>(take(uint64_t(m.rows) * m.cols / 2));
      j.scales = reinterpret_cast<uint16_t*>(take(uint64_t(m.rows) * G * 2));
      j.zeros = reinterpret_cast<uint8_t*>(take(uint64_t(m.rows) * G));
      j.perm = reinterpret_cast<int32_t*>(take(uint64_t(m.cols) * 4));
      j.tile_perm = m.perm != SM::kNone ? reinterpret_cast<const int32_t*>(st.raw + m.perm) : nullptr;
      j.rows = m.rows, j.cols = m.cols, j.group_size = m.group_size;
      v = {j.qweight, j.scales, j.zeros, m.rows, m.cols, m.group_size, j.tile_perm ? j.perm : nullptr};
      jobs.push_back(j);
    };
    gpu::Int4Expert& e = table[x.expert];
    convert(x.gate, e.gate);
    convert(x.up, e.up);
    convert(x.down, e.down);
  }
  CK(cudaMemcpy(st.tables + li * E, table.data(), table.size() * sizeof(gpu::Int4Expert), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(st.jobs + li * 3 * int64_t(st.max_experts), jobs.data(), jobs.size() * sizeof(gpu::Int4TilesToRows), cudaMemcpyHostToDevice));
}

// Streamed prefill (GpuOptions::stream_prefill_min_tokens): n <= st.pass tokens through the model
// layer by layer, every chunk of them through layer l before layer l + 1, so that each layer's host
// experts cross PCIe once per pass: the copy stream brings layer l's into st.raw while the GPU
// computes the layer before; the GPU turns them into the row layout (st.rows) and runs the layer's
// experts from st.tables[l] (its own and the streamed ones). One raw and one converted buffer: the
// copy of the next streamed layer waits for this layer's conversion (st.free), the conversion for
// its copy (st.ready); stream order keeps the converted rows until the layer's last chunk is done.
void Qwen35MoeGpu::Impl::prefill_streamed(const int32_t* ids_host, int64_t n, float* logits_last, float* hidden) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, E = c.num_experts;
  prefill_inputs(ids_host, n, st.ids, st.pos, st.h);
  auto next_streamed = [&](size_t from) {
    while (from < layers.size() && !streams(from)) ++from;
    return from;
  };
  auto copy_layer = [&](size_t l) {
    TraceSpan span("stream experts to the GPU, layer", "copy", static_cast<int>(l));
    CK(cudaStreamWaitEvent(st.copy, st.free, 0));
    CK(cudaMemcpyAsync(st.raw, st.layout[l].base, st.layout[l].bytes, cudaMemcpyHostToDevice, st.copy));
    CK(cudaEventRecord(st.ready, st.copy));
  };
  if (size_t first = next_streamed(0); first < layers.size()) copy_layer(first);
  const int64_t mj = 3 * int64_t(st.max_experts), wide = std::max<int64_t>(H, c.moe_intermediate_size);
  for (size_t li = 0; li < layers.size(); ++li) {
    const gpu::Int4Expert* table = nullptr;
    if (streams(li)) {
      CK(cudaStreamWaitEvent(stream, st.ready, 0));
      CK(gpu::int4_tiles_to_rows(st.jobs + li * mj, 3 * static_cast<int>(st.layout[li].experts.size()), wide, stream));
      CK(cudaEventRecord(st.free, stream));
      if (size_t nx = next_streamed(li + 1); nx < layers.size()) copy_layer(nx);
      table = st.tables + li * E;
      ++counts.streamed_layers;
      counts.streamed_bytes += st.layout[li].bytes;
    }
    for (int64_t t = 0; t < n; t += chunk) prefill_layer(li, st.h + t * H, std::min(chunk, n - t), st.pos + t, table);
  }
  pos += n;
  prefill_logits(st.h + (n - 1) * H, logits_last);
  for (int64_t t = 0; hidden && t < n; t += chunk) {  // every row after the final norm (the MTP head's input), a chunk at a time
    const int64_t m = std::min(chunk, n - t);
    CK(gpu::rmsnorm_zc(st.h + t * H, final_norm, H, static_cast<int>(m), static_cast<float>(c.rms_norm_eps), px, stream));
    CK(cudaMemcpyAsync(hidden + t * H, px, m * H * sizeof(float), cudaMemcpyDeviceToHost, stream));
  }
  CK(cudaStreamSynchronize(stream));
}

}  // namespace tandem
