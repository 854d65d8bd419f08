// runtime/models/qwen3_5_moe/gpu_batch.cpp: steps over several sequences' tokens at once (step_rows,
// see gpu.h): the step's table, its walk (prefill_layer over the rows with the decode kernels on each
// token's slot), a CUDA graph per step shape, the logits rows and their top-k, and rollback.
#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "gpu_core/device.cuh"
#include "gpu_core/ops.cuh"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {

namespace {

// One graph per (tokens, sequences, keep, logits destination): the kernels' grids depend on them,
// everything else (ids, positions, slots) is read from the table on the device.
int row_graph_key(int64_t n, int groups, bool keep, int w, bool hidden) {
  return (((static_cast<int>(n) * 64 + groups) * 2 + keep) * 3 + w) * 2 + hidden;
}

}  // namespace

void Qwen35MoeGpu::Impl::enqueue_rows(int64_t n, const Batch& b, float* logits_dst, float* hidden_dst) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, R = rows;
  const gpu::ProgrammaticLaunchScope programmatic(pdl);  // as the decode step's kernels (pdl.cuh)
  CK(cudaMemcpyAsync(bio, hio, (5 * R + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  if (embed) CK(gpu::embed_bf16(embed, H, bio, static_cast<int>(n), ph, stream));
  else host_embedding_rows(hio, n, ph);
  bool normed = false;
  for (size_t li = 0; li < layers.size(); ++li) normed = prefill_layer(li, ph, n, bio + R, nullptr, &b, normed);
  if (!logits_dst && !hidden_dst) return;
  CK(gpu::rmsnorm_zc(ph, final_norm, H, static_cast<int>(n), static_cast<float>(c.rms_norm_eps), px, stream));
  if (hidden_dst) CK(cudaMemcpyAsync(hidden_dst, px, n * H * sizeof(float), cudaMemcpyDeviceToHost, stream));
  if (!logits_dst) return;
  linear_rows(lm_head, px, n, blogits, true);
  if (logits_dst != &logits_sink) CK(cudaMemcpyAsync(logits_dst, blogits, n * V * sizeof(float), cudaMemcpyDeviceToHost, stream));
}

cudaGraphExec_t Qwen35MoeGpu::Impl::cached_graph(int key, const std::function<void()>& enqueue) {
  for (const auto& g : row_graphs)
    if (g.first == key) return g.second;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t g = nullptr;
  try {
    enqueue();
    CK(cudaStreamEndCapture(stream, &g));
  } catch (...) {
    abandon_capture();
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  CK(made);
  row_graphs.emplace_back(key, exec);
  return exec;
}

void Qwen35MoeGpu::Impl::run_rows(int64_t n, const Batch& b, float* logits_dst, float* hidden) {
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab_size;
  if (hidden && !mtp.hhid) fail("internal: hidden rows asked for without the MTP head's staging (GpuOptions::mtp)");
  float* hid = hidden ? mtp.hhid : nullptr;
  const int w = !logits_dst ? 0 : logits_dst == &logits_sink ? 2 : 1;
  float* dst = w == 0 ? nullptr : w == 2 ? &logits_sink : hrows;
  // All on the GPU: the step as a graph. With host experts the layers hand over eagerly (post_copy /
  // serve_copy wait on the host).
  if (graph_ok && gpu_only_layers == layers.size() && !Trace::active()) {
    CK(cudaGraphLaunch(cached_graph(row_graph_key(n, b.groups, b.keep, w, hid != nullptr), [&] {
                         const ExpertCounts saved = counts;  // the capture counts nothing: replays count below
                         enqueue_rows(n, b, dst, hid);
                         counts = saved;
                       }),
                       stream));
    counts.gpu += static_cast<uint64_t>(n) * c.num_experts_per_tok * gpu_only_layers;
  } else {  // eagerly; with --trace, each layer's segments as GPU spans (prefill_layer's marks)
    Trace* tr = Trace::active();
    trace_begin(tr);
    enqueue_rows(n, b, dst, hid);
    trace_end(tr);
  }
  CK(cudaStreamSynchronize(stream));
  if (w == 1) std::memcpy(logits_dst, hrows, n * V * sizeof(float));
  if (hid) std::memcpy(hidden, hid, n * c.hidden_size * sizeof(float));
}

// Checks the feeds and fills the step's table (hio); returns its tokens and groups.
static int64_t fill_rows(Qwen35MoeGpu::Impl& m, std::span<const Qwen35MoeGpu::RowFeed> feeds, Qwen35MoeGpu::Impl::Batch& b) {
  const int64_t R = m.rows, V = m.model.config().vocab_size;
  if (R < 2) fail("internal: step_rows without batched buffers (step_rows_max() is 1)");
  if (feeds.empty()) fail("step_rows: no sequences to feed");
  int64_t n = 0;
  b = {};
  for (size_t g = 0; g < feeds.size(); ++g) {
    const Qwen35MoeGpu::RowFeed& f = feeds[g];
    if (f.slot < 0 || f.slot >= m.slots) fail("slot ", f.slot, " is outside 0..", m.slots - 1);
    for (size_t j = 0; j < g; ++j)
      if (feeds[j].slot == f.slot) fail("slot ", f.slot, " is fed twice in one step");
    if (f.ids.empty()) fail("slot ", f.slot, ": a step feeds at least one token");
    const int64_t at = f.slot == m.cur ? m.pos : m.slot_pos[f.slot];
    if (at + static_cast<int64_t>(f.ids.size()) > m.opts.max_context)
      fail("the sequence in slot ", f.slot, " reached the context limit of ", m.opts.max_context, " tokens (--context)");
    if (f.keep) {
      if (feeds.size() != 1) fail("a step that keeps its states feeds one sequence (slot ", f.slot, " had company)");
      if (static_cast<int64_t>(f.ids.size()) > m.opts.verify_tokens)
        fail("a step that keeps its states takes at most ", m.opts.verify_tokens, " tokens here (got ", f.ids.size(), ")");
      b.keep = true;
    }
    m.hio[3 * R + g] = f.slot;
    m.hio[4 * R + g] = static_cast<int32_t>(n);
    for (size_t t = 0; t < f.ids.size(); ++t, ++n) {
      if (n >= R) fail("step_rows: more than ", R, " tokens in one step");
      if (f.ids[t] < 0 || f.ids[t] >= V) fail("token id ", f.ids[t], " at position ", t, " is outside the vocabulary (0..", V - 1, ")");
      m.hio[n] = f.ids[t];
      m.hio[R + n] = static_cast<int32_t>(at + static_cast<int64_t>(t));
      m.hio[2 * R + n] = f.slot;
    }
  }
  b.groups = static_cast<int>(feeds.size());
  m.hio[4 * R + b.groups] = static_cast<int32_t>(n);
  return n;
}

// The positions move on; a keep step is remembered for rollback.
static void advance(Qwen35MoeGpu::Impl& m, std::span<const Qwen35MoeGpu::RowFeed> feeds, bool keep) {
  m.kept = {};
  for (const Qwen35MoeGpu::RowFeed& f : feeds) {
    int64_t& at = f.slot == m.cur ? m.pos : m.slot_pos[f.slot];
    if (keep) m.kept = {f.slot, at, static_cast<int64_t>(f.ids.size())};
    at += static_cast<int64_t>(f.ids.size());
  }
}

void Qwen35MoeGpu::step_rows(std::span<const RowFeed> feeds, float* logits, float* hidden) {
  Impl& m = *impl_;
  Impl::Batch b;
  const int64_t n = fill_rows(m, feeds, b);
  m.run_rows(n, b, logits, hidden);
  advance(m, feeds, b.keep);
}

bool Qwen35MoeGpu::Impl::device_tops_fit(std::span<const std::span<const gpu::Penalty>> penalties, std::span<const int> k) const {
  const int64_t V = model.config().vocab_size, rows = static_cast<int64_t>(k.size());
  if ((V + gpu::kTopKBlocks - 1) / gpu::kTopKBlocks * 8 > 48 * 1024) return false;  // top_k_rows's slice of a row
  if (rows * V > INT32_MAX) return false;  // the rows' penalties are one list of int32 ids over rows x V logits
  for (int64_t r = 0; r < rows; ++r)
    if (k[r] < 0 || k[r] > gpu::kMaxTopK || static_cast<int64_t>(penalties[r].size()) > opts.max_context) return false;
  return true;
}

// Every row's penalties in one list over the rows as one row of rows x V logits (ids moved by r V;
// those outside 0..V-1 dropped, as penalise drops them), uploaded and applied in pieces of the penalty
// buffer's max_context entries; then every row's top kmax in one top_k_rows: the first k[r] are row r's.
void Qwen35MoeGpu::Impl::device_tops(float* logits_dev, std::span<const std::span<const gpu::Penalty>> penalties, std::span<const int> k,
                                     int32_t* ids_dev, float* vals_dev, std::span<std::vector<std::pair<int32_t, float>>* const> tops) {
  const int64_t V = model.config().vocab_size, rows = static_cast<int64_t>(k.size());
  std::vector<gpu::Penalty> pen;
  int kmax = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (k[r] == 0) continue;
    kmax = std::max(kmax, k[r]);
    for (const gpu::Penalty& p : penalties[r])
      if (p.id >= 0 && p.id < V) pen.push_back({static_cast<int32_t>(p.id + r * V), p.rep, p.sub});
  }
  if (kmax == 0) return;
  for (size_t at = 0; at < pen.size(); at += static_cast<size_t>(opts.max_context)) {
    const size_t piece = std::min(pen.size() - at, static_cast<size_t>(opts.max_context));
    CK(cudaMemcpyAsync(pen_dev, pen.data() + at, piece * sizeof(gpu::Penalty), cudaMemcpyHostToDevice, stream));
    CK(gpu::penalise(logits_dev, rows * V, pen_dev, static_cast<int>(piece), stream));
  }
  CK(gpu::top_k_rows(logits_dev, V, static_cast<int>(rows), kmax, topk_ws, ids_dev, vals_dev, stream));
  std::vector<int32_t> hi(rows * kmax);
  std::vector<float> hv(rows * kmax);
  CK(cudaMemcpyAsync(hi.data(), ids_dev, hi.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CK(cudaMemcpyAsync(hv.data(), vals_dev, hv.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));  // also the end of the penalty pieces' reads of `pen`
  for (int64_t r = 0; r < rows; ++r) {
    if (k[r] == 0) continue;
    tops[r]->resize(k[r]);
    for (int i = 0; i < k[r]; ++i) (*tops[r])[i] = {hi[r * kmax + i], hv[r * kmax + i]};
  }
}

bool Qwen35MoeGpu::step_rows_top(std::span<const RowFeed> feeds, std::span<const std::span<const gpu::Penalty>> penalties, std::span<const int> k,
                                 std::span<std::vector<std::pair<int32_t, float>>* const> tops, float* hidden) {
  Impl& m = *impl_;
  int64_t rows = 0;
  for (const RowFeed& f : feeds) rows += static_cast<int64_t>(f.ids.size());
  if (static_cast<int64_t>(penalties.size()) != rows || static_cast<int64_t>(k.size()) != rows || static_cast<int64_t>(tops.size()) != rows)
    fail("internal: step_rows_top wants one penalty list, k and result per row");
  if (!m.device_tops_fit(penalties, k)) return false;
  Impl::Batch b;
  const int64_t n = fill_rows(m, feeds, b);
  m.run_rows(n, b, &m.logits_sink, hidden);
  m.device_tops(m.blogits, penalties, k, m.btop_ids, m.btop_vals, tops);
  advance(m, feeds, b.keep);
  return true;
}

void Qwen35MoeGpu::rollback(int slot, int64_t keep) {
  Impl& m = *impl_;
  if (slot < 0 || slot >= m.slots) fail("slot ", slot, " is outside 0..", m.slots - 1);
  if (m.kept.slot != slot) fail("rollback: the last step of slot ", slot, " kept no states (feed it with keep_states)");
  if (keep < 0 || keep > m.kept.n) fail("rollback: keep ", keep, " is outside 0..", m.kept.n, " (the tokens of the last kept step)");
  const ModelConfig& c = m.model.config();
  const size_t conv = (c.linear_conv_kernel - 1) * c.linear_conv_dim() * sizeof(float);
  const size_t state = int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * sizeof(float);
  if (keep < m.kept.n) {  // every token kept: the live state is already the last one's
    std::vector<gpu::CopyRegion> copies;  // one launch, not two copies a DeltaNet layer
    for (DevLayer& L : m.layers) {
      if (L.kind != LayerKind::LinearAttention) continue;
      copies.push_back({L.conv_state + slot * m.conv_stride, L.kept_conv + keep * m.conv_stride, static_cast<int64_t>(conv)});
      copies.push_back({L.ssm_state + slot * m.ssm_stride, L.kept_state + keep * m.ssm_stride, static_cast<int64_t>(state)});
    }
    CK(gpu::copy_regions(copies.data(), static_cast<int>(copies.size()), m.stream));
    CK(cudaStreamSynchronize(m.stream));
  }
  (slot == m.cur ? m.pos : m.slot_pos[slot]) = m.kept.from + keep;  // later keys and values are overwritten as it goes on
  m.kept = {};
}

}  // namespace tandem
