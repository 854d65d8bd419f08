// tests/unit/candidate_runner.h: a runner that picks the samplers' candidates itself (Runner::step_top)
// from the rows of the runner it wraps, on the host with the plain definition (penalties applied, the k
// best, ties to the lower id): what the GPU runner does on the device, so that the engine's candidate
// paths (a draw from candidates, a verification from every row's candidates) run on any placement.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "runtime/engine/runner.h"

namespace tandem::test {

// Everything passed through to the runner it wraps (the wrappers below change one thing each).
class ForwardingRunner : public Runner {
 public:
  explicit ForwardingRunner(std::unique_ptr<Runner> inner) : in_(std::move(inner)) {}
  int slots() const override { return in_->slots(); }
  void reset_slot(int slot) override { in_->reset_slot(slot); }
  int64_t position(int slot) const override { return in_->position(slot); }
  void step(std::span<const Feed> feeds) override { in_->step(feeds); }
  void rollback(int slot, int64_t keep) override { in_->rollback(slot, keep); }
  bool keeps_several() const override { return in_->keeps_several(); }
  int max_draft() const override { return in_->max_draft(); }
  void draft(int slot, int32_t next, std::span<int32_t> drafts, const DraftPick& pick) override { in_->draft(slot, next, drafts, pick); }
  std::string describe() const override { return in_->describe(); }
  int64_t max_context() const override { return in_->max_context(); }
  double weight_bandwidth(std::string* what) override { return in_->weight_bandwidth(what); }

 protected:
  std::unique_ptr<Runner> in_;
};

// The candidates picked on the host from the wrapped runner's rows (see the top of the file).
class CandidateRunner final : public ForwardingRunner {
 public:
  CandidateRunner(std::unique_ptr<Runner> inner, int64_t vocab) : ForwardingRunner(std::move(inner)), vocab_(vocab) {}
  void step(std::span<const Feed> feeds) override {
    in_->step(feeds);
    ++row_steps;
  }
  std::string describe() const override { return "candidates on the host over " + in_->describe(); }

  bool step_top(std::span<const Feed> feeds, std::span<const TopWant> want) override {
    std::vector<std::vector<float>> rows(feeds.size());
    std::vector<Feed> with_rows(feeds.begin(), feeds.end());
    for (size_t i = 0; i < feeds.size(); ++i) {
      const bool all = feeds[i].rows == Qwen35Moe::LogitRows::All;
      rows[i].resize((all ? feeds[i].ids.size() : 1) * static_cast<size_t>(vocab_));
      with_rows[i].logits = rows[i].data();
    }
    in_->step(with_rows);
    size_t w = 0;
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t at = 0, t = 0; at < rows[i].size(); at += static_cast<size_t>(vocab_), ++w, ++t) {
        pick(std::span(rows[i]).subspan(at, static_cast<size_t>(vocab_)), want[w]);
        if (feeds[i].rows == Qwen35Moe::LogitRows::All) check_context(feeds[i].ids, t, want[w].penalties);
      }
    if (w != want.size()) ADD_FAILURE() << "step_top: " << want.size() << " wants for " << w << " wanted rows";
    ++calls;
    return true;
  }
  // Rows of a verification (an All feed) whose penalties miss a token fed before theirs in the same
  // step (row t sees ids 1..t: the drafts before it), counted where the penalties name any id at all.
  int rows_missing_context = 0;
  int calls = 0;      // step_top steps run
  int row_steps = 0;  // step() calls: steps that wanted the logits rows instead

 private:
  void pick(std::span<const float> logits, const TopWant& w) const {
    std::vector<float> row(logits.begin(), logits.end());
    for (const LogitPenalty& p : w.penalties) row[p.id] = p.apply(row[p.id]);
    std::vector<int32_t> order(row.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + w.k, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
    w.top->clear();
    for (int i = 0; i < w.k; ++i) w.top->push_back({order[i], row[order[i]]});
  }
  void check_context(std::span<const int32_t> ids, size_t t, std::span<const LogitPenalty> pen) {
    if (pen.empty()) return;
    for (size_t j = 1; j <= t; ++j)
      if (std::none_of(pen.begin(), pen.end(), [&](const LogitPenalty& p) { return p.id == ids[j]; })) {
        ++rows_missing_context;
        return;
      }
  }
  int64_t vocab_;
};

// The other way round: a runner that declines step_top (its caller samples from the logits rows on the
// host), over a runner that would pick candidates itself; drafting passes through.
class RowsOnlyRunner final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  std::string describe() const override { return "logits rows to the host from " + in_->describe(); }
};

// A runner that keeps one sequence's states a step, as the GPU model does (keeps_several() false): a
// failure for a step that keeps states beside another feed (the Batcher drafts only for a sequence
// alone there), or a rollback of any but the last step.
class OneKeptStepRunner final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  bool keeps_several() const override { return false; }
  void step(std::span<const Feed> feeds) override {
    kept_ = -1;
    for (const Feed& f : feeds)
      if (f.keep_states) {
        if (feeds.size() > 1) ADD_FAILURE() << "slot " << f.slot << " keeps its states beside " << feeds.size() - 1 << " other feeds";
        kept_ = f.slot;
        ++kept_steps;
      }
    in_->step(feeds);
  }
  void rollback(int slot, int64_t keep) override {
    if (slot != kept_) ADD_FAILURE() << "rollback of slot " << slot << " after a step that kept " << (kept_ < 0 ? "nothing" : "another slot's states");
    kept_ = -1;
    in_->rollback(slot, keep);
  }
  int kept_steps = 0;

 private:
  int kept_ = -1;  // the slot the last step kept, -1: none
};

}  // namespace tandem::test
