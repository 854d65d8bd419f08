#include "runtime/models/qwen3_5_moe/mtp.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

int32_t argmax_lowest(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());  // the first of equal maxima
}

MtpSequence::MtpSequence(const Qwen35Moe& model, MatmulBackend* backend) : model_(&model) {
  if (!model.mtp()) fail(model.checkpoint().dir(), ": the checkpoint has no MTP head (mtp.* tensors); drafting needs one");
  st_ = model.new_mtp_state();
  st_.backend = backend;
}

void MtpSequence::reset() {
  MatmulBackend* b = st_.backend;
  st_ = model_->new_mtp_state();
  st_.backend = b;
  committed_ = 0;
  hidden_.clear();
  ids_.clear();
  kept_rows_ = 0;
}

void MtpSequence::drop_provisional() {
  const int L = model_->config().num_layers;
  const size_t row = static_cast<size_t>(model_->config().num_kv_heads) * model_->config().head_dim;
  st_.k_cache[L].resize(static_cast<size_t>(committed_) * row);
  st_.v_cache[L].resize(static_cast<size_t>(committed_) * row);
  st_.pos = committed_;
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
  const int64_t ready = static_cast<int64_t>(ids_.size()) - 1;  // every row but the last has its following token
  if (ready <= 0) return;
  model_->mtp_forward(st_, std::span(ids_).subspan(1, static_cast<size_t>(ready)), hidden_.data(), nullptr,
                      Qwen35Moe::LogitRows::Last);
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
  std::vector<float> logits(static_cast<size_t>(V)), h(static_cast<size_t>(H)), h_next(static_cast<size_t>(H));
  model_->mtp_forward(st_, following, hidden_.data(), logits.data(), Qwen35Moe::LogitRows::Last, h.data());
  committed_ += rows;  // every pending row now has its token: built from the main model's states
  hidden_.clear();
  ids_.clear();
  kept_rows_ = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = pick ? pick(static_cast<int>(i), logits) : argmax_lowest(logits);
    if (out[i] < 0 || out[i] >= V) fail("MTP head: draft ", i, " picked id ", out[i], " outside the vocabulary");
    if (i + 1 == out.size()) break;
    const int32_t id = out[i];  // the chain: the head's own output state with its draft
    model_->mtp_forward(st_, std::span(&id, 1), h.data(), logits.data(), Qwen35Moe::LogitRows::Last, h_next.data());
    h.swap(h_next);
  }
}

uint64_t MtpSequence::bytes() const {
  const int L = model_->config().num_layers;
  return (st_.k_cache[L].size() + st_.v_cache[L].size() + hidden_.size()) * sizeof(float) + ids_.size() * sizeof(int32_t);
}

}  // namespace tandem
