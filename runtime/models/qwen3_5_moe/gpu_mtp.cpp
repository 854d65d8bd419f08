// runtime/models/qwen3_5_moe/gpu_mtp.cpp: the MTP head on the GPU (GpuOptions::mtp, see gpu.h):
// x = fc_e(RMSNorm_e(embed(id))) + fc_h(RMSNorm_h(h)) (fc split into its halves at upload), the head's
// decoder layer through the model's own layer walk (prefill_layer at li = num_layers, its KV cache per
// slot), mtp.norm and the shared lm_head (or the drafts' 8-bit copy of it) on the last row. Rows that fit step_rows' buffers run the
// batch kernels as one CUDA graph per row count and output (eagerly when the head's experts are in host
// memory, GpuOptions::mtp_host_experts: the layer hands over to the host as a hybrid layer does); longer
// catch-ups (a prompt's rows) run the prompt-chunk kernels on the slot.
#include <algorithm>

#include "gpu_core/device.cuh"
#include "gpu_core/ops.cuh"
#include "runtime/models/qwen3_5_moe/gpu_impl.h"

namespace tandem {

namespace {

enum Want : int { kLogits = 1, kArgmax = 2, kHidden = 4 };

// One graph per (rows, outputs): the kernels' grids depend on the rows, the copies on the outputs.
int mtp_graph_key(int64_t n, int want) { return -1 - (static_cast<int>(n) * 8 + want); }  // negative: beside row_graphs' keys

// What mtp_rows and mtp_chain check before any work: the slot, rows to run, the ids, room in the
// head's cache for `rows` rows from `at`.
void check_head_rows(const Qwen35MoeGpu::Impl& m, int slot, int64_t at, std::span<const int32_t> ids, int64_t rows) {
  const int64_t V = m.model.config().vocab_size;
  if (!m.mtp.on) fail("internal: the MTP head's rows without the head on the GPU (GpuOptions::mtp)");
  if (slot < 0 || slot >= m.slots) fail("slot ", slot, " is outside 0..", m.slots - 1);
  if (ids.empty()) fail("the MTP head: no rows");
  if (at < 0 || at + rows > m.opts.max_context)
    fail("the MTP head's cache of slot ", slot, " reached the context limit of ", m.opts.max_context, " tokens (--context)");
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] < 0 || ids[t] >= V) fail("token id ", ids[t], " at position ", t, " is outside the vocabulary (0..", V - 1, ")");
}

// step_rows' table (hio) for one group: ids at positions at.. of `slot`.
void one_group_table(Qwen35MoeGpu::Impl& m, int slot, int64_t at, std::span<const int32_t> ids) {
  const int64_t R = m.rows, n = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    m.hio[i] = ids[i];
    m.hio[R + i] = static_cast<int32_t>(at + i);
    m.hio[2 * R + i] = slot;
  }
  m.hio[3 * R] = slot, m.hio[4 * R] = 0, m.hio[4 * R + 1] = static_cast<int32_t>(n);
}

}  // namespace

void Qwen35MoeGpu::Impl::enqueue_mtp(int64_t n, bool chunk, const int32_t* ids_host) {
  const ModelConfig& c = model.config();
  const int64_t H = c.hidden_size, R = rows;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int N = static_cast<int>(n);
  const int32_t* ids_dev = chunk ? pids : bio;
  const gpu::ProgrammaticLaunchScope programmatic(pdl);  // as the decode step's kernels (pdl.cuh)
  if (embed) CK(gpu::embed_bf16(embed, H, ids_dev, N, ph, stream));
  else host_embedding_rows(ids_host, n, ph);
  CK(gpu::rmsnorm_zc(ph, mtp.norm_e, H, N, eps, px, stream));
  linear_rows(mtp.fc_e, px, n, ph, !chunk);
  CK(gpu::rmsnorm_zc(po, mtp.norm_h, H, N, eps, px, stream));
  linear_rows(mtp.fc_h, px, n, po, !chunk);
  CK(gpu::add_inplace(ph, po, n * H, stream));
  const Batch one{1, false};
  prefill_layer(layers.size(), ph, n, chunk ? ppos : bio + R, nullptr, chunk ? nullptr : &one);
  CK(gpu::rmsnorm_zc(ph + (n - 1) * H, mtp.norm, H, 1, eps, x, stream));
}

bool Qwen35MoeGpu::mtp_active() const { return impl_->mtp.on; }

void Qwen35MoeGpu::mtp_rows(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, float* logits_out, int32_t* argmax,
                            float* hidden_out) {
  Impl& m = *impl_;
  const ModelConfig& c = m.model.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, R = m.rows, n = static_cast<int64_t>(ids.size());
  check_head_rows(m, slot, at, ids, n);
  const int want = (logits_out ? kLogits : 0) | (argmax ? kArgmax : 0) | (hidden_out ? kHidden : 0);
  // The last piece's outputs on the stream: the logits row (to hrows), its argmax (top_ids), the state.
  auto outputs = [&](bool last) {
    if (!last) return;
    if (want & kHidden) CK(cudaMemcpyAsync(m.mtp.hhid + R * H, m.x, H * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    if (!(want & (kLogits | kArgmax))) return;
    m.linear(m.draft_lm_head(), m.x, m.logits);
    if (want & kLogits) CK(cudaMemcpyAsync(m.hrows, m.logits, V * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    if (want & kArgmax) {
      CK(gpu::top_k_rows(m.logits, V, 1, 1, m.topk_ws, m.top_ids, m.top_vals, m.stream));
      CK(cudaMemcpyAsync(m.hio + 5 * R, m.top_ids, sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
    }
  };
  for (int64_t t = 0, len = 0; t < n; t += len) {
    const bool chunk = n - t > R;
    len = std::min(chunk ? m.chunk : R, n - t);
    const bool last = t + len == n;
    if (chunk) {  // a catch-up longer than a step: the prompt kernels on the slot's cache
      const int prev = m.cur;
      select(slot);
      m.host_pos.resize(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) m.host_pos[i] = static_cast<int32_t>(at + t + i);
      CK(cudaMemcpyAsync(m.ppos, m.host_pos.data(), len * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
      CK(cudaMemcpyAsync(m.pids, ids.data() + t, len * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
      CK(cudaMemcpyAsync(m.po, hidden + t * H, len * H * sizeof(float), cudaMemcpyHostToDevice, m.stream));
      m.enqueue_mtp(len, true, ids.data() + t);
      outputs(last);
      CK(cudaStreamSynchronize(m.stream));
      select(prev);
      continue;
    }
    // The step's table as step_rows fills it (one group), the hidden rows in pinned staging.
    one_group_table(m, slot, at + t, ids.subspan(static_cast<size_t>(t), static_cast<size_t>(len)));
    std::copy_n(hidden + t * H, len * H, m.mtp.hhid);
    auto enqueue = [&] {
      CK(cudaMemcpyAsync(m.bio, m.hio, (5 * R + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
      CK(cudaMemcpyAsync(m.po, m.mtp.hhid, len * H * sizeof(float), cudaMemcpyHostToDevice, m.stream));
      m.enqueue_mtp(len, false, m.hio);
      outputs(last);
    };
    if (m.graph_ok && !Trace::active() && !m.mtp.layer.cpu_experts) {  // host experts: their handoff waits on the host
      CK(cudaGraphLaunch(m.cached_graph(mtp_graph_key(len, last ? want : 0), enqueue), m.stream));
    } else {
      enqueue();
    }
    CK(cudaStreamSynchronize(m.stream));
  }
  if (want & kHidden) std::copy_n(m.mtp.hhid + R * H, H, hidden_out);
  if (want & kLogits) std::copy_n(m.hrows, V, logits_out);
  if (want & kArgmax) *argmax = m.hio[5 * R];
}

bool Qwen35MoeGpu::mtp_chain(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, std::span<int32_t> drafts) {
  Impl& m = *impl_;
  const ModelConfig& c = m.model.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, R = m.rows, n = static_cast<int64_t>(ids.size()), k = static_cast<int64_t>(drafts.size());
  if (k == 0) fail("mtp_chain: no drafts asked for");
  if (!m.embed || !m.graph_ok || Trace::active() || m.mtp.layer.cpu_experts || n > R || k > gpu::kMaxGemvTokens)
    return false;  // the caller goes call by call
  check_head_rows(m, slot, at, ids, n + k - 1);
  one_group_table(m, slot, at, ids);  // the first call's, as mtp_rows fills it
  int32_t* io = m.chain_io();  // [drafts][positions][1]
  for (int64_t i = 1; i < k; ++i) io[gpu::kMaxGemvTokens + i] = static_cast<int32_t>(at + n + i - 1);
  io[2 * gpu::kMaxGemvTokens] = 1;
  std::copy_n(hidden, n * H, m.mtp.hhid);
  auto enqueue = [&] {
    CK(cudaMemcpyAsync(m.bio, m.hio, (5 * R + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
    CK(cudaMemcpyAsync(m.po, m.mtp.hhid, n * H * sizeof(float), cudaMemcpyHostToDevice, m.stream));
    for (int64_t i = 0; i < k; ++i) {
      if (i > 0) {  // the chain: the last draft (on the device) at the next position, the head's output state as its hidden row
        CK(cudaMemcpyAsync(m.bio, m.top_ids, sizeof(int32_t), cudaMemcpyDeviceToDevice, m.stream));
        CK(cudaMemcpyAsync(m.bio + R, io + gpu::kMaxGemvTokens + i, sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
        CK(cudaMemcpyAsync(m.bio + 4 * R + 1, io + 2 * gpu::kMaxGemvTokens, sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
        CK(cudaMemcpyAsync(m.po, m.x, H * sizeof(float), cudaMemcpyDeviceToDevice, m.stream));
      }
      m.enqueue_mtp(i == 0 ? n : 1, false, nullptr);
      m.linear(m.draft_lm_head(), m.x, m.logits);
      CK(gpu::top_k_rows(m.logits, V, 1, 1, m.topk_ws, m.top_ids, m.top_vals, m.stream));
      CK(cudaMemcpyAsync(io + i, m.top_ids, sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
    }
  };
  CK(cudaGraphLaunch(m.cached_graph(-100000 - static_cast<int>(n * 16 + k), enqueue), m.stream));  // keys beside mtp_rows'
  CK(cudaStreamSynchronize(m.stream));
  std::copy_n(io, k, drafts.data());
  return true;
}

}  // namespace tandem
