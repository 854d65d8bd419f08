#include "runtime/engine/runner.h"

#include <algorithm>
#include <cstddef>
#include <optional>

#include "cpu_experts/cpu_moe.h"

#include "runtime/models/qwen3_5_moe/cpu_backend.h"
#include "core/error.h"
#include "core/nearest.h"
#include "core/membw.h"
#include "core/trace.h"
#ifdef TANDEM_HAVE_CUDA
#include "gpu_core/device.cuh"
#include "runtime/models/qwen3_5_moe/gpu.h"
#endif

namespace tandem {

void Runner::draft(int slot, int32_t next, std::span<int32_t> drafts, const DraftPick& pick) {
  (void)slot, (void)next, (void)drafts, (void)pick;
  fail("this runner (", describe(), ") does not draft (RunnerOptions::draft / --draft is 0)");
}

void Runner::restore(int slot, const SequenceSnapshot& s) {
  (void)slot, (void)s;
  fail("this runner (", describe(), ") cannot restore a saved sequence");
}

namespace {

// What every runner checks before a step runs anything: slots in range and distinct, tokens to feed,
// ids in the vocabulary, the context not exceeded.
void check_feeds(std::span<const Runner::Feed> feeds, const Runner& r, int64_t vocab) {
  for (size_t i = 0; i < feeds.size(); ++i) {
    const Runner::Feed& f = feeds[i];
    if (f.slot < 0 || f.slot >= r.slots()) fail("slot ", f.slot, " is outside 0..", r.slots() - 1, " (the runner holds ", r.slots(), " sequences: batch)");
    for (size_t j = 0; j < i; ++j)
      if (feeds[j].slot == f.slot) fail("slot ", f.slot, " is fed twice in one step");
    if (f.ids.empty()) fail("slot ", f.slot, ": a step feeds at least one token");
    for (size_t t = 0; t < f.ids.size(); ++t)
      if (f.ids[t] < 0 || f.ids[t] >= vocab) fail("token id ", f.ids[t], " at position ", t, " is outside the vocabulary (0..", vocab - 1, ")");
    if (r.position(f.slot) + static_cast<int64_t>(f.ids.size()) > r.max_context())
      fail("the sequence in slot ", f.slot, " reached the context limit of ", r.max_context(), " tokens (--context)");
  }
  if (!r.keeps_several() && std::count_if(feeds.begin(), feeds.end(), [](const Runner::Feed& f) { return f.keep_states; }) > 1)
    fail("a step of this runner keeps the states of one sequence (Runner::keeps_several): verify each in a step of its own");
}

// Runner::draft for a runner with an MtpSequence per slot that drafts up to `most`.
void draft_checked(std::vector<MtpSequence>& mtp, int slot, int most, int32_t next, std::span<int32_t> drafts, const DraftPick& pick) {
  if (slot < 0 || slot >= static_cast<int>(mtp.size())) fail("slot ", slot, " is outside 0..", mtp.size() - 1);
  if (drafts.empty() || static_cast<int>(drafts.size()) > most)
    fail("draft: ", drafts.size(), " tokens asked for; this runner drafts 1..", most, " (--draft)");
  TraceSpan span("MTP head (draft)", "host");
  mtp[slot].draft(next, drafts, pick);
}

// A host sequence's copy: the state's vectors as they are (KV rows up to its position).
struct HostSnapshot final : SequenceSnapshot {
  std::vector<KvRows> k_cache, v_cache;
  std::vector<std::vector<float>> conv_window, recurrent;
  std::optional<MtpSequence> mtp;  // the head's side, when the runner drafts
};

class HostRunner final : public Runner {
 public:
  HostRunner(const Qwen35Moe& m, std::unique_ptr<CpuBackend> backend, int defer, int batch, int draft, RowFormat kv)
      : model_(m), backend_(std::move(backend)), defer_(defer), draft_(draft), kv_(kv), states_(static_cast<size_t>(std::max(batch, 1))) {
    if (draft_ > 0)
      for (int s = 0; s < slots(); ++s) mtp_.emplace_back(m, backend_.get(), kv_);
    for (int s = 0; s < slots(); ++s) reset_slot(s);
  }
  int slots() const override { return static_cast<int>(states_.size()); }
  void reset_slot(int slot) override {
    if (slot < 0 || slot >= slots()) fail("slot ", slot, " is outside 0..", slots() - 1);
    Qwen35State& st = states_[slot];
    st = model_.new_state();
    st.backend = backend_.get();
    st.defer_experts = defer_;
    st.kv_format = kv_;
    if (draft_ > 0) mtp_[slot].reset();
  }
  int64_t position(int slot) const override { return states_.at(slot).pos; }
  void step(std::span<const Feed> feeds) override {
    check_feeds(feeds, *this, model_.config().vocab_size);
    int64_t tokens = 0;
    std::vector<Qwen35Moe::SeqTokens> seqs;
    std::vector<std::vector<float>> hidden(draft_ > 0 ? feeds.size() : 0);  // the MTP head's inputs
    for (size_t i = 0; i < feeds.size(); ++i) {
      const Feed& f = feeds[i];
      seqs.push_back({&states_[f.slot], f.ids, f.logits, f.rows, f.keep_states});
      if (draft_ > 0) {
        hidden[i].resize(f.ids.size() * static_cast<size_t>(model_.config().hidden_size));
        seqs.back().hidden = hidden[i].data();
      }
      tokens += static_cast<int64_t>(f.ids.size());
    }
    {
      TraceSpan span(tokens > static_cast<int64_t>(feeds.size()) ? "forward (prefill)" : "forward (decode)", "host");
      model_.forward_batch(seqs);
    }
    if (draft_ > 0) {
      TraceSpan span("MTP head (catch-up)", "host");
      for (size_t i = 0; i < feeds.size(); ++i) mtp_[feeds[i].slot].fed(feeds[i].ids, hidden[i].data(), feeds[i].keep_states);
    }
  }
  void rollback(int slot, int64_t keep) override {
    if (slot < 0 || slot >= slots()) fail("slot ", slot, " is outside 0..", slots() - 1);
    states_[slot].rollback(keep);
    if (draft_ > 0) mtp_[slot].rolled_back(keep);
  }
  int max_draft() const override { return draft_; }
  void draft(int slot, int32_t next, std::span<int32_t> drafts, const DraftPick& pick) override {
    if (draft_ == 0) return Runner::draft(slot, next, drafts, pick);
    draft_checked(mtp_, slot, draft_, next, drafts, pick);
  }
  bool saves_sequences() const override { return true; }
  std::shared_ptr<const SequenceSnapshot> save(int slot) const override {
    if (slot < 0 || slot >= slots()) fail("slot ", slot, " is outside 0..", slots() - 1);
    const Qwen35State& st = states_[slot];
    auto s = std::make_shared<HostSnapshot>();
    s->owner = this;
    s->position = st.pos;
    s->k_cache = st.k_cache, s->v_cache = st.v_cache, s->conv_window = st.conv_window, s->recurrent = st.recurrent;
    for (const auto* part : {&s->k_cache, &s->v_cache})
      for (const KvRows& r : *part) s->bytes += r.bytes();
    for (const auto* part : {&s->conv_window, &s->recurrent})
      for (const auto& v : *part) s->bytes += v.size() * sizeof(float);
    if (draft_ > 0) {
      s->mtp = mtp_[slot];
      s->bytes += s->mtp->bytes();
    }
    return s;
  }
  void restore(int slot, const SequenceSnapshot& saved) override {
    if (saved.owner != this) fail("restore: the snapshot was made by another runner");
    const auto* s = static_cast<const HostSnapshot*>(&saved);
    reset_slot(slot);
    Qwen35State& st = states_[slot];
    st.pos = s->position;
    st.k_cache = s->k_cache, st.v_cache = s->v_cache, st.conv_window = s->conv_window, st.recurrent = s->recurrent;
    if (draft_ > 0) mtp_[slot] = *s->mtp;
  }
  std::string describe() const override {
    const std::string kv = kv_ == RowFormat::Bf16 ? "" : str_cat(", KV cache ", row_format_name(kv_), " (codes and a scale per position and KV head, as the GPU's)");
    return (backend_ ? "cpu: " + backend_->describe() : "ref: exact fp32 reference") + kv;
  }
  int64_t max_context() const override { return model_.config().max_position_embeddings; }
  double weight_bandwidth(std::string* what) override {
    if (what) *what = "CPU read bandwidth";
    return measure_read_bandwidth().bytes_per_s;
  }

 private:
  const Qwen35Moe& model_;
  std::unique_ptr<CpuBackend> backend_;
  int defer_ = 0;
  int draft_ = 0;
  RowFormat kv_ = RowFormat::Bf16;
  std::vector<Qwen35State> states_;
  std::vector<MtpSequence> mtp_;  // per slot, when drafting
};

#ifdef TANDEM_HAVE_CUDA
// A GPU slot's sequence in host memory (Qwen35MoeGpu::save_slot).
struct GpuSnapshot final : SequenceSnapshot {
  Qwen35MoeGpu::SlotCopy copy;     // the MTP head's cache included, when the runner drafts
  std::optional<MtpSequence> mtp;  // the head's host side (pending hidden rows), when the runner drafts
};

// --device gpu (everything on the GPU) and --device hybrid (o.hybrid: some routed experts on the CPU
// side) are the same GPU model with and without host experts.
//
// Drafting (RunnerOptions::draft): the MTP head runs on the GPU model (GpuOptions::mtp), its cache in
// each slot; every step hands back the fed rows' hidden states (a lone token from the decode graph, a
// lone prompt from its chunks, the rest from step_rows), and each slot's MtpSequence keeps the rows the
// head has not consumed.
class GpuRunner final : public Runner, private MtpDevice {
 public:
  GpuRunner(const Qwen35Moe& model, const RunnerOptions& o)
      : placement_(o.plan), context_(o.context), vocab_(model.config().vocab_size), hidden_size_(model.config().hidden_size), draft_(o.draft) {
    GpuOptions g;
    g.budget_bytes = o.gpu_mem;
    g.max_context = o.context;
    g.progress = stderr;
    g.eager = o.eager;
    g.batch = std::max(o.batch, 1);
    g.verify_tokens = o.verify_tokens;
    g.dense = parse_row_format(o.dense_format, "--dense-format");
    g.lm_head = parse_row_format(o.lm_head_format, "--lm-head-format");
    g.mtp_lm_head = parse_row_format(o.draft_lm_head_format, "--draft-lm-head");  // a copy only where it differs from lm_head's
    g.kv_format = parse_row_format(o.kv_format, "--kv-format");
    if (draft_ > 0) {
      if (draft_ + 1 > gpu::kMaxGemvTokens)
        fail("--draft ", draft_, ": the GPU verifies at most ", gpu::kMaxGemvTokens - 1, " drafts a step (", gpu::kMaxGemvTokens, " tokens)");
      g.mtp = true;
      g.verify_tokens = std::max<int64_t>(g.verify_tokens, draft_ + 1);
    }
    g.snapshot_vram = o.cache_vram;
    g.snapshot_host = o.cache_host;
    if (placement_) {  // the plan's projections unit by unit (dense.format, dense.lm_head and the rules' formats)
      const ModelConfig& c = model.config();
      g.mixer.resize(static_cast<size_t>(c.num_layers));
      g.shared.resize(static_cast<size_t>(c.num_layers));
      for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = str_cat("layers.", l, ".");
        g.mixer[l] = placement_->dense_format_of(p + (c.layer_types[l] == LayerKind::FullAttention ? "self_attn" : "linear_attn"));
        g.shared[l] = placement_->dense_format_of(p + "mlp.shared_expert");
      }
      g.lm_head = placement_->dense_format_of("lm_head");
      g.mtp_lm_head = placement_->draft_lm_head;  // speculative.lm_head
      const bool head_on_host = draft_ > 0 && placement_->head_experts_cpu;  // speculative.head_experts: cpu
      cpu_ = make_cpu_experts(model, placement_->expert_on_gpu, placement_->cpu_expert_format, o.threads, head_on_host);
      g.mtp_host_experts = head_on_host;
      g.budget_bytes = placement_->budget_bytes - placement_->vram.reserve + o.cache_vram;  // the reserve holds the cache's VRAM tier
      g.budget_name = "gpu.memory / --gpu-mem, minus gpu.reserve";
      g.expert_on_gpu = &placement_->expert_on_gpu;
      g.host_experts = cpu_.get();
      g.embed_on_gpu = placement_->embed_on_gpu;
      g.prefill_chunk = placement_->prefill_chunk;
      g.prefill_chunk_max = 0;  // the planner counted this chunk's workspace
      g.defer_experts = placement_->deferral;
      g.link_experts = placement_->link_in_place;
      g.stream_prefill_min_tokens = placement_->stream_experts ? placement_->predicted.prefill_gpu_min_tokens : 0;
      g.stream_pass_tokens = placement_->stream_pass;
    }
    gpu_ = Qwen35MoeGpu::create(model, g);
    if (draft_ > 0)
      for (int s = 0; s < gpu_->slots(); ++s) mtp_.emplace_back(model, static_cast<MtpDevice*>(this), s);
  }
  int slots() const override { return gpu_->slots(); }
  void reset_slot(int slot) override {
    gpu_->reset_slot(slot);
    if (draft_ > 0) mtp_[slot].reset();
  }
  int64_t position(int slot) const override { return gpu_->position(slot); }
  void rollback(int slot, int64_t keep) override {
    gpu_->rollback(slot, keep);
    if (draft_ > 0) mtp_[slot].rolled_back(keep);
  }
  bool keeps_several() const override { return false; }  // Qwen35MoeGpu::rollback: the last kept step only
  int max_draft() const override { return draft_; }
  void draft(int slot, int32_t next, std::span<int32_t> drafts, const DraftPick& pick) override {
    if (draft_ == 0) return Runner::draft(slot, next, drafts, pick);
    draft_checked(mtp_, slot, draft_, next, drafts, pick);
  }
  bool saves_sequences() const override { return true; }
  std::shared_ptr<const SequenceSnapshot> save(int slot) const override {
    auto s = std::make_shared<GpuSnapshot>();
    s->owner = this;
    s->copy = gpu_->save_slot(slot);
    s->position = s->copy.position;
    s->bytes = s->copy.memory->bytes();
    s->where = s->copy.memory->where();
    if (draft_ > 0) {
      s->mtp = mtp_[slot];
      s->bytes += s->mtp->bytes();
    }
    return s;
  }
  void restore(int slot, const SequenceSnapshot& saved) override {
    if (saved.owner != this) fail("restore: the snapshot was made by another runner");
    const auto& g = static_cast<const GpuSnapshot&>(saved);
    gpu_->load_slot(slot, g.copy);
    if (draft_ > 0) {
      mtp_[slot] = *g.mtp;
      mtp_[slot].move_to(slot);
    }
  }
  // Whether a feed of a step of `feeds` goes through step_rows (several feeds, or a drafting prompt
  // that fits one step: its rows' hidden states for the head) rather than the one-sequence paths.
  // step() and step_top() route alike, so a step's numbers do not depend on where its candidates are
  // picked.
  static bool on_rows(const Feed& f, size_t feeds, bool drafting, int64_t R) {
    const int64_t n = static_cast<int64_t>(f.ids.size());
    return (feeds > 1 || (drafting && n > 1)) && R > 1 && n <= R;
  }
  // A feed of one sequence runs on the GPU model's one-sequence paths (the decode step's graph, the
  // prompt in chunks), unless it keeps its states; the others go together through step_rows as long as
  // their tokens fit a step (longer ones alone, in turn).
  void step(std::span<const Feed> feeds) override {
    check_feeds(feeds, *this, vocab_);
    const int64_t R = gpu_->step_rows_max();
    const bool drafting = draft_ > 0;
    std::vector<Qwen35MoeGpu::RowFeed> group;
    std::vector<const Feed*> members;
    int64_t tokens = 0;
    auto flush = [&] {
      if (group.empty()) return;
      TraceSpan span("forward (batch)", "host");
      if (drafting) hidden_.resize(static_cast<size_t>(tokens * hidden_size_));
      // one feed that wants every row (a verification): its rows straight to its logits
      const bool direct = members.size() == 1 && members[0]->logits && members[0]->rows == Qwen35Moe::LogitRows::All;
      if (!direct) rows_.resize(static_cast<size_t>(tokens * vocab_));
      gpu_->step_rows(group, direct ? members[0]->logits : rows_.data(), drafting ? hidden_.data() : nullptr);
      int64_t r = 0;
      for (const Feed* f : members) {
        const int64_t n = static_cast<int64_t>(f->ids.size());
        if (f->logits && !direct) {
          const bool all = f->rows == Qwen35Moe::LogitRows::All;
          std::copy_n(rows_.data() + (r + (all ? 0 : n - 1)) * vocab_, (all ? n : 1) * vocab_, f->logits);
        }
        r += n;
      }
      if (drafting) hand_hidden(members);
      group.clear(), members.clear(), tokens = 0;
    };
    // Drafting, a feed on the one-sequence paths (one token: the decode graph; a prompt: its chunks)
    // with every row's hidden state copied out.
    auto alone_with_hidden = [&](const Feed& f) {
      const int64_t n = static_cast<int64_t>(f.ids.size());
      TraceSpan span(n > 1 ? "forward (prefill)" : "forward (decode)", "host");
      hidden_.resize(static_cast<size_t>(n * hidden_size_));
      gpu_->select(f.slot);
      gpu_->forward(f.ids, f.logits, f.rows, hidden_.data());
      mtp_[f.slot].fed(f.ids, hidden_.data(), false);
    };
    for (const Feed& f : feeds) {
      const int64_t n = static_cast<int64_t>(f.ids.size());
      if (f.keep_states) {
        if (R < 2 || n > R) fail("slot ", f.slot, ": keeping the state after each of ", n, " tokens needs the GPU model's verification buffers (",
                                 "RunnerOptions::verify_tokens >= ", n, ")");
        flush();
        group.push_back({f.slot, f.ids, true});
        members.push_back(&f);
        tokens = n;
        flush();
      } else if (on_rows(f, feeds.size(), drafting, R)) {
        if (tokens + n > R) flush();
        group.push_back({f.slot, f.ids, false});
        members.push_back(&f);
        tokens += n;
      } else if (drafting) {
        flush();
        alone_with_hidden(f);
      } else {
        TraceSpan span(n > 1 ? "forward (prefill)" : "forward (decode)", "host");
        gpu_->select(f.slot);
        gpu_->forward(f.ids, f.logits, f.rows);
      }
    }
    flush();
  }
  // Sampling on the GPU: the samplers' candidates are picked on the device, so a step copies k pairs
  // per wanted row back instead of the logits rows (a verification: every row's). The feeds take the
  // paths step() gives them (on_rows): one feed the one-sequence path; several, one that keeps its
  // states or a drafting prompt that fits a step: step_rows steps of as many as fit (false,
  // nothing run, when a feed is too long for one: a prompt among others; the caller then samples from
  // the rows). Drafting: every row's hidden state goes to the head's side, as in step().
  bool step_top(std::span<const Feed> feeds, std::span<const TopWant> want) override {
    static_assert(sizeof(LogitPenalty) == sizeof(gpu::Penalty) && offsetof(LogitPenalty, rep) == offsetof(gpu::Penalty, rep) &&
                  offsetof(LogitPenalty, sub) == offsetof(gpu::Penalty, sub));
    auto pen = [](std::span<const LogitPenalty> p) { return std::span<const gpu::Penalty>(reinterpret_cast<const gpu::Penalty*>(p.data()), p.size()); };
    check_feeds(feeds, *this, vocab_);
    size_t wanted = 0;
    for (const Feed& f : feeds) wanted += f.rows == Qwen35Moe::LogitRows::All ? f.ids.size() : 1;
    if (want.size() != wanted) fail("internal: step_top takes one want per wanted row (", wanted, "), got ", want.size());
    for (const TopWant& w : want)
      if (w.k < 1 || w.k > gpu::kMaxTopK || static_cast<int64_t>(w.penalties.size()) > context_) return false;
    const bool drafting = draft_ > 0;
    if (feeds.size() == 1 && !feeds[0].keep_states && feeds[0].rows == Qwen35Moe::LogitRows::Last &&
        !on_rows(feeds[0], 1, drafting, gpu_->step_rows_max())) {
      const Feed& f = feeds[0];
      TraceSpan span(f.ids.size() > 1 ? "forward (prefill)" : "forward (decode)", "host");
      if (drafting) hidden_.resize(f.ids.size() * static_cast<size_t>(hidden_size_));
      gpu_->select(f.slot);
      if (!gpu_->forward_top(f.ids, pen(want[0].penalties), want[0].k, *want[0].top, drafting ? hidden_.data() : nullptr)) return false;
      if (drafting) mtp_[f.slot].fed(f.ids, hidden_.data(), false);
      return true;
    }
    const int64_t R = gpu_->step_rows_max();
    for (const Feed& f : feeds)
      if (R < 2 || static_cast<int64_t>(f.ids.size()) > R) return false;
    std::vector<Qwen35MoeGpu::RowFeed> group;
    std::vector<const Feed*> members;
    std::vector<std::span<const gpu::Penalty>> pens;
    std::vector<int> ks;
    std::vector<std::vector<std::pair<int32_t, float>>*> tops;
    bool ran = false;
    auto flush = [&] {
      if (group.empty()) return true;
      TraceSpan span("forward (batch)", "host");
      if (drafting) hidden_.resize(ks.size() * static_cast<size_t>(hidden_size_));
      if (!gpu_->step_rows_top(group, pens, ks, tops, drafting ? hidden_.data() : nullptr)) {
        if (ran) fail("internal: step_rows_top declined a step after running the ones before it");
        return false;  // only the first can decline (the logits' size), before anything ran
      }
      ran = true;
      if (drafting) hand_hidden(members);
      group.clear(), members.clear(), pens.clear(), ks.clear(), tops.clear();
      return true;
    };
    size_t w = 0;
    for (const Feed& f : feeds) {
      const int64_t n = static_cast<int64_t>(f.ids.size());
      if ((f.keep_states || static_cast<int64_t>(ks.size()) + n > R) && !flush()) return false;  // a step that keeps its states: alone
      group.push_back({f.slot, f.ids, f.keep_states});
      members.push_back(&f);
      const bool all = f.rows == Qwen35Moe::LogitRows::All;
      for (int64_t t = 0; t < n; ++t) {
        if (all || t == n - 1) {
          pens.push_back(pen(want[w].penalties)), ks.push_back(want[w].k), tops.push_back(want[w].top);
          ++w;
        } else {
          pens.emplace_back(), ks.push_back(0), tops.push_back(nullptr);  // rows before a Last feed's last
        }
      }
      if (f.keep_states && !flush()) return false;
    }
    return flush();
  }
  std::string describe() const override {
    std::string paths = gpu_->batched_prefill_active() ? str_cat("prefill in chunks of ", gpu_->prefill_chunk(), " tokens") : "prefill token by token";
    if (const int64_t s = gpu_->stream_prefill_min_tokens()) paths += str_cat(" (from ", s, " prompt tokens with the CPU experts streamed to the GPU)");
    else if (!gpu_->stream_prefill_note().empty()) paths += str_cat(" (no streamed prefill: ", gpu_->stream_prefill_note(), ")");
    paths += gpu_->graph_one_step()      ? ", decode steps as one CUDA graph each with the host handoffs inside (mapped-memory flags, "
                                           "folded into the router's and the next norm's launches)"
             : gpu_->cuda_graph_active() ? ", decode steps as CUDA graphs"
                                         : ", decode steps launched eagerly";
    if (gpu_->programmatic_launch_active()) paths += " with programmatic dependent launch";
    if (const int64_t b = gpu_->l2_prefetch_active())
      paths += str_cat(", the next layer's input projection (up to ", b >> 20, " MiB) fetched into L2 during each host layer");
    if (const int n = gpu_->link_experts_active()) paths += str_cat(", the GPU computing ", n, " of each token's host experts from host memory over PCIe");
    else if (!gpu_->link_note().empty()) paths += str_cat(" (no link experts: ", gpu_->link_note(), ")");
    if (!placement_) return "gpu: " + gpu_->memory().describe() + "; " + paths;
    return "hybrid: " + placement::plan_summary(*placement_) + "; GPU " + gpu_->memory().describe() + "; CPU " + cpu_->describe() + "; " + paths;
  }
  int64_t max_context() const override { return context_; }
  uint64_t peak_device_bytes() const override { return gpu_->memory().total(); }
  uint64_t dense_bytes_per_token() const override { return gpu_->dense_bytes_per_token(); }
  double gpu_expert_share() const override {
    const ExpertCounts& c = gpu_->expert_counts();
    const uint64_t all = c.gpu + c.cpu + c.link;  // link experts: computed on the GPU, resident on the host
    return all ? static_cast<double>(c.gpu) / static_cast<double>(all) : gpu_expert_share_planned();
  }
  double gpu_expert_share_planned() const override { return placement_ ? placement_->expected_gpu_expert_fraction : 1.0; }
  uint64_t streamed_layers() const override { return gpu_->expert_counts().streamed_layers; }
  HostSplit host_split() const override {
    const ExpertCounts& c = gpu_->expert_counts();
    return {c.host_wait_ns * 1e-9, c.host_run_ns * 1e-9, c.host_layers, c.cpu};
  }
  double pcie_bandwidth() override { return gpu_->pcie_bandwidth(); }
  double weight_bandwidth(std::string* what) override {
    if (what) *what = "GPU copy bandwidth";
    return gpu_->copy_bandwidth();
  }

 private:
  // Drafting: a step's hidden rows (hidden_, in member order) to each member's head.
  void hand_hidden(std::span<const Feed* const> members) {
    int64_t r = 0;
    for (const Feed* f : members) {
      mtp_[f->slot].fed(f->ids, hidden_.data() + r * hidden_size_, f->keep_states);
      r += static_cast<int64_t>(f->ids.size());
    }
  }
  std::shared_ptr<const placement::Plan> placement_;  // null: everything on the GPU
  void mtp_rows(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, float* logits, int32_t* argmax,
                float* hidden_out) override {
    gpu_->mtp_rows(slot, at, ids, hidden, logits, argmax, hidden_out);
  }
  bool mtp_chain(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, std::span<int32_t> drafts) override {
    return gpu_->mtp_chain(slot, at, ids, hidden, drafts);
  }

  int64_t context_ = 0;                               // the KV cache's length
  int64_t vocab_ = 0, hidden_size_ = 0;
  int draft_ = 0;
  std::vector<float> rows_, hidden_;                  // a batched step's logits rows and hidden rows (drafting)
  std::unique_ptr<HostExperts> cpu_;                // declared before gpu_: the GPU model calls into it
  std::unique_ptr<Qwen35MoeGpu> gpu_;
  std::vector<MtpSequence> mtp_;                      // per slot, when drafting
};
#endif

}  // namespace

const char* device_name(Device d) {
  switch (d) {
    case Device::Auto: return "auto";
    case Device::Ref: return "ref";
    case Device::Cpu: return "cpu";
    case Device::Gpu: return "gpu";
    case Device::Hybrid: return "hybrid";
  }
  return "?";
}

Device parse_device(const std::string& name, const char* what) {
  static const std::vector<std::string> names = {"auto", "ref", "cpu", "gpu", "hybrid"};
  for (size_t i = 0; i < names.size(); ++i)
    if (name == names[i]) return static_cast<Device>(i);
  const std::string near = nearest(name, names);
  fail(what, " must be one of auto, ref, cpu, gpu, hybrid (got '", name, "')", near.empty() ? std::string() : str_cat("; did you mean '", near, "'?"));
}

void check_experts_format(const std::string& value, const char* what) {
  if (!value.empty() && value != "auto" && value != "int4") fail(what, " must be auto or int4 (got '", value, "')");
}

void check_token_ids(std::span<const int32_t> ids, int64_t vocab_size, const std::string& model_dir, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      fail(what, ": token id ", ids[i], " at position ", i, " is outside the vocabulary of ", model_dir, " (vocab_size ", vocab_size, ")");
}

void check_context(const Runner& runner, int64_t prompt_tokens, int64_t new_tokens, const char* new_tokens_name) {
  const int64_t limit = runner.max_context();
  if (prompt_tokens <= limit && new_tokens <= limit - prompt_tokens) return;
  const char* planned = runner.peak_device_bytes() ? " the KV cache was planned for (--context / context: sets it)" : "";
  if (!new_tokens_name) fail(prompt_tokens, " ids exceed the context of ", limit, " tokens", planned);
  fail("the prompt (", prompt_tokens, " tokens) plus ", new_tokens_name, " ", new_tokens, " exceeds the context of ", limit, " tokens", planned);
}

namespace {

std::unique_ptr<Runner> make_placement_runner(const Qwen35Moe& model, const RunnerOptions& o) {
  if (o.batch < 0 || o.batch > kMaxBatch) fail("batch ", o.batch, " must be between 1 and ", kMaxBatch, " sequences");
  const int batch = std::max(o.batch, 1);
  if (o.defer_experts < 0 || o.defer_experts > model.config().num_experts_per_tok)
    fail("--defer-experts ", o.defer_experts, " must be between 0 and the model's ", model.config().num_experts_per_tok, " experts per token");
  if (o.defer_experts > 0 && o.device != Device::Ref && o.device != Device::Cpu)
    fail("--defer-experts is for --device ref or cpu; a hybrid run defers through experts.deferral in its placement YAML");
  if (o.draft < 0 || o.draft > kMaxDraft) fail("--draft ", o.draft, " must be auto or between 0 (off) and ", kMaxDraft, " tokens");
  if (o.draft > 0 && !model.mtp())
    fail("--draft ", o.draft, ": ", model.checkpoint().dir(), " has no MTP head (mtp.* tensors), which speculative decoding drafts with");
  if (o.draft > 0 && o.device == Device::Hybrid && o.plan && o.plan->deferral > 0)
    fail("--draft: the verification step keeps exact states; a placement with experts.deferral defers some experts a layer (set it to 0)");
  const RowFormat kv = parse_row_format(o.kv_format, "--kv-format");
  if (o.device == Device::Ref || o.device == Device::Cpu)  // the host placements run the projections as stored
    for (const auto& [value, flag] : {std::pair{o.dense_format, "--dense-format"}, std::pair{o.lm_head_format, "--lm-head-format"},
                                      std::pair{o.draft_lm_head_format, "--draft-lm-head"}})
      if (!value.empty() && value != "bf16")
        fail(flag, " ", value, " quantizes projections for the GPU (--device gpu or hybrid); --device ", device_name(o.device),
             " runs them as stored");
  if (o.device == Device::Ref) return std::make_unique<HostRunner>(model, nullptr, o.defer_experts, batch, o.draft, kv);
  if (o.device == Device::Cpu) {
    CpuBackendOptions co;
    co.threads = o.threads;
    if (o.cpu_expert_format == "int8") co.dense_expert_format = cpu::WeightFormat::Int8;
    else if (o.cpu_expert_format == "bf16") co.dense_expert_format = cpu::WeightFormat::BF16;
    else fail("--cpu-expert-format must be int8 or bf16 (got '", o.cpu_expert_format, "')");
    co.mtp = o.draft > 0;
    return std::make_unique<HostRunner>(model, std::make_unique<CpuBackend>(model, co), o.defer_experts, batch, o.draft, kv);
  }
  if (o.device == Device::Gpu) {
#ifdef TANDEM_HAVE_CUDA
    RunnerOptions all_gpu = o;
    all_gpu.plan.reset();
    return std::make_unique<GpuRunner>(model, all_gpu);
#else
    fail("--device gpu: no CUDA device (this build has no CUDA support)");
#endif
  }
  if (o.device == Device::Hybrid) {
#ifdef TANDEM_HAVE_CUDA
    if (!o.plan) fail("--device hybrid needs a placement plan (prepare_device)");
    return std::make_unique<GpuRunner>(model, o);
#else
    fail("--device hybrid: no CUDA device (this build has no CUDA support)");
#endif
  }
  fail("--device auto is resolved by prepare_device before a runner is made");
}

}  // namespace

std::unique_ptr<Runner> make_runner(const Qwen35Moe& model, const RunnerOptions& o) {
  if (o.draft != kDraftAuto) return make_placement_runner(model, o);
  RunnerOptions held = o;  // --draft auto: room for kAutoDraftMax, the tuner picks each step's
  held.draft = kAutoDraftMax;
  std::unique_ptr<Runner> r = make_placement_runner(model, held);
  r->tune_drafts();
  return r;
}

}  // namespace tandem
