#include "runtime/models/qwen3_5_moe/mtp.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

int32_t argmax_lowest(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());  // the first of equal maxima
}

MtpSequence::MtpSequence(const Qwen35Moe& model, MatmulBackend* backend, RowFormat kv) : model_(&model) {
  if (!model.mtp()) fail(model.checkpoint().dir(), ": the checkpoint has no MTP head (mtp.* tensors); drafting needs one");
  st_ = model.new_mtp_state();
  st_.backend = backend;
  st_.kv_format = kv;
}

MtpSequence::MtpSequence(const Qwen35Moe& model, MtpDevice* device, int slot) : model_(&model), device_(device), slot_(slot) {
  if (!model.mtp()) fail(model.checkpoint().dir(), ": the checkpoint has no MTP head (mtp.* tensors); drafting needs one");
}

void MtpSequence::move_to(int slot) { slot_ = slot; }

void MtpSequence::reset() {
  if (!device_) {
    MatmulBackend* b = st_.backend;
    const RowFormat kv = st_.kv_format;
    st_ = model_->new_mtp_state();
    st_.backend = b, st_.kv_format = kv;
  }
  rows_ = 0;
  committed_ = 0;
  hidden_.clear();
  ids_.clear();
  kept_rows_ = 0;
}

void MtpSequence::drop_provisional() {
  rows_ = committed_;
  if (device_) return;  // the device's later rows are overwritten as the cache grows again
  const int L = model_->config().num_layers;
  st_.k_cache[L].truncate(committed_);
  st_.v_cache[L].truncate(committed_);
  st_.pos = committed_;
}

void MtpSequence::consumed(int64_t rows) {
  committed_ += rows;  // every pending row now has its token: built from the main model's states
  hidden_.clear();
  ids_.clear();
  kept_rows_ = 0;
}

void MtpSequence::head(std::span<const int32_t> ids, const float* hidden, float* logits, int32_t* argmax, float* hidden_out) {
  if (device_) {
    device_->mtp_rows(slot_, rows_, ids, hidden, logits, argmax, hidden_out);
  } else {
    model_->mtp_forward(st_, ids, hidden, logits, Qwen35Moe::LogitRows::Last, hidden_out);
    if (argmax) *argmax = argmax_lowest(std::span<const float>(logits, static_cast<size_t>(model_->config().vocab_size)));
  }
  rows_ += static_cast<int64_t>(ids.size());
}

void MtpSequence::fed(std::span<const int32_t> ids, const float* hidden, bool kept) {
  const int64_t H = model_->config().hidden_size, n = static_cast<int64_t>(ids.size());
  drop_provisional();
  hidden_.insert(hidden_.end(), hidden, hidden + n * H);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  if (kept) {
    kept_rows_ = n;
    return;
  }
  kept_rows_ = 0;
  // Every row but the last has its following token. They wait for the next draft (one head call for
  // them all, nothing spent on steps that do not draft) unless kCatchUp or more have gathered.
  const int64_t ready = static_cast<int64_t>(ids_.size()) - 1;
  if (ready < kCatchUp) return;
  head(std::span(ids_).subspan(1, static_cast<size_t>(ready)), hidden_.data(), nullptr, nullptr, nullptr);
  committed_ += ready;
  hidden_.erase(hidden_.begin(), hidden_.begin() + ready * H);
  ids_.erase(ids_.begin(), ids_.begin() + ready);
}

void MtpSequence::rolled_back(int64_t keep) {
  if (keep < 0 || keep > kept_rows_) fail("MTP head: rollback to ", keep, " of the last kept step's ", kept_rows_, " tokens");
  const int64_t H = model_->config().hidden_size, drop = kept_rows_ - keep;
  hidden_.resize(hidden_.size() - static_cast<size_t>(drop * H));
  ids_.resize(ids_.size() - static_cast<size_t>(drop));
  kept_rows_ = 0;
}

void MtpSequence::draft(int32_t next, std::span<int32_t> out, const DraftPick& pick) {
  const int64_t H = model_->config().hidden_size, V = model_->config().vocab_size;
  const int64_t rows = static_cast<int64_t>(ids_.size());
  if (rows == 0) fail("MTP head: nothing to draft from (the main model has not been fed since the last draft)");
  if (out.empty()) fail("MTP head: no draft asked for");
  drop_provisional();
  std::vector<int32_t> following(ids_.begin() + 1, ids_.end());
  following.push_back(next);
  if (device_ && !pick && device_->mtp_chain(slot_, rows_, following, hidden_.data(), out)) {  // greedy: the whole chain there
    rows_ += rows + static_cast<int64_t>(out.size()) - 1;
    consumed(rows);
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i] < 0 || out[i] >= V) fail("MTP head: draft ", i, " picked id ", out[i], " outside the vocabulary");
    return;
  }
  // Greedy drafts on a device: only the argmax comes back (the host's head computes the logits anyway).
  const bool logits_wanted = pick || !device_;
  std::vector<float> logits(logits_wanted ? static_cast<size_t>(V) : 0), h(static_cast<size_t>(H)), h_next(static_cast<size_t>(H));
  int32_t best = 0;
  const bool more = out.size() > 1;  // the chain needs the head's output state
  head(following, hidden_.data(), logits_wanted ? logits.data() : nullptr, pick ? nullptr : &best, more ? h.data() : nullptr);
  consumed(rows);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = pick ? pick(static_cast<int>(i), logits) : best;
    if (out[i] < 0 || out[i] >= V) fail("MTP head: draft ", i, " picked id ", out[i], " outside the vocabulary");
    if (i + 1 == out.size()) break;
    const int32_t id = out[i];  // the chain: the head's own output state with its draft
    const bool again = i + 2 < out.size();
    head(std::span(&id, 1), h.data(), logits_wanted ? logits.data() : nullptr, pick ? nullptr : &best, again ? h_next.data() : nullptr);
    h.swap(h_next);
  }
}

uint64_t MtpSequence::bytes() const {  // a device's cache is counted in its slot's saved sequence
  const int L = model_->config().num_layers;
  const uint64_t cache = device_ ? 0 : st_.k_cache[L].bytes() + st_.v_cache[L].bytes();
  return cache + hidden_.size() * sizeof(float) + ids_.size() * sizeof(int32_t);
}

}  // namespace tandem
