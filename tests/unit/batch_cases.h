// tests/unit/batch_cases.h: the batched engine's contract (Runner::step over several slots), checked on
// any runner: every sequence of a batch gets the logits it gets alone, with prompts of different
// lengths and a sequence replaced between steps; a K-token step that keeps its states equals K single
// steps, and a rollback to any of the K states goes on as if the later tokens had never been fed.
// `tol`: the largest relative L2 distance allowed per row (0: bit for bit). Used by test_batch.cpp
// (ref, cpu) and tests/gpu/test_gpu_batch.cpp (gpu, hybrid).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/runner.h"
#include "runtime/tokenizer/chat_template.h"
#include "tests/unit/test_util.h"
#include "tools/synth/synth.h"

namespace tandem::test {

// The tiny synthetic model with its tokenizer, written to a temporary folder and loaded.
struct TinyModel {
  TempDir dir;
  std::unique_ptr<Qwen35Moe> model;
  Tokenizer tok;
  int64_t vocab;
  TinyModel() : model(write_and_load(dir.str())), tok(Tokenizer::from_model_dir(dir.str())), vocab(model->config().vocab_size) {}

 private:
  static std::unique_ptr<Qwen35Moe> write_and_load(const std::string& dir) {
    synth::Options so;
    so.out_dir = dir;
    so.threads = 2;
    so.seed = 7;
    synth::synthesize(synth::find_preset("tiny"), so);
    return Qwen35Moe::load(dir);
  }
};

// n requests with prompts and lengths of their own, sampled by alternating presets with seeds seed0 + i,
// request 3 greedy among them.
inline std::vector<GenerateRequest> mixed_requests(const Tokenizer& tok, int n, uint64_t seed0) {
  const char* prompts[] = {"the model routes every token", "experts", "a longer prompt than the others, with commas", "x y z", "five"};
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerateRequest q;
    q.prompt = tok.encode(prompts[i % 5]);
    q.max_new_tokens = 5 + 2 * i;
    q.sampling = sampling_preset(i % 2 ? "thinking" : "instruct");
    q.sampling.seeded = true;
    q.sampling.seed = seed0 + static_cast<uint64_t>(i);
    if (i == 3) q.sampling.temperature = 0;
    reqs.push_back(q);
  }
  return reqs;
}

// A runner holding `batch` sequences whose steps may keep states for up to `verify` tokens.
using RunnerFactory = std::function<std::unique_ptr<Runner>(int batch, int64_t verify)>;

inline double row_rel_l2(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
  return std::sqrt(d / std::max(r, 1e-30));
}

// got and want [rows][V]: each row equal (tol 0) or within tol.
inline void expect_rows(const std::vector<float>& got, const std::vector<float>& want, int64_t V, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r * V < got.size(); ++r) {
    if (tol == 0) {
      const bool same = std::equal(got.begin() + r * V, got.begin() + (r + 1) * V, want.begin() + r * V);
      EXPECT_TRUE(same) << what << ", row " << r << ": not bit for bit (rel L2 " << row_rel_l2(&got[r * V], &want[r * V], V) << ")";
    } else {
      EXPECT_LE(row_rel_l2(&got[r * V], &want[r * V], V), tol) << what << ", row " << r;
    }
  }
}

// The logits of `ids` fed as a prompt (all rows), then of each of `then` fed one at a time, alone in
// slot 0 of a fresh sequence.
inline std::vector<float> alone(Runner& r, int64_t V, const std::vector<int32_t>& ids, const std::vector<int32_t>& then) {
  r.reset();
  std::vector<float> out(ids.size() * V);
  r.forward(ids, out.data(), Qwen35Moe::LogitRows::All);
  std::vector<float> row(V);
  for (int32_t t : then) {
    r.forward(std::span(&t, 1), row.data(), Qwen35Moe::LogitRows::Last);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// Three sequences with prompts of 5, 3 and 1 tokens decode 4 tokens together; before the third step
// slot 1's sequence is replaced by a new one (its 2-token prompt fed in the same step as the others'
// decode tokens).
inline void batch_equals_alone(const RunnerFactory& make, const std::vector<int32_t>& pool, int64_t V, double tol) {
  ASSERT_GE(pool.size(), 8u);
  auto take = [&](size_t from, size_t n) {
    std::vector<int32_t> v;
    for (size_t i = 0; i < n; ++i) v.push_back(pool[(from + i) % pool.size()]);
    return v;
  };
  const std::vector<std::vector<int32_t>> prompt = {take(0, 5), take(3, 3), take(7, 1)};
  const std::vector<std::vector<int32_t>> steps = {take(5, 4), take(1, 4), take(9, 4)};  // teacher-forced decode tokens
  const std::vector<int32_t> late = take(2, 2), late_steps = take(6, 2);                 // slot 1's second sequence

  auto one = make(1, 0);
  std::vector<std::vector<float>> want;
  for (int s = 0; s < 3; ++s) want.push_back(alone(*one, V, prompt[s], s == 1 ? take(1, 2) : steps[s]));
  const std::vector<float> want_late = alone(*one, V, late, late_steps);

  auto many = make(3, 0);
  ASSERT_GE(many->slots(), 3);
  std::vector<std::vector<float>> got(3), got_late;
  got_late.resize(1);
  {  // the three prompts in one step
    std::vector<std::vector<float>> buf(3);
    std::vector<Runner::Feed> feeds;
    for (int s = 0; s < 3; ++s) {
      buf[s].resize(prompt[s].size() * V);
      feeds.push_back({s, prompt[s], buf[s].data(), Qwen35Moe::LogitRows::All, false});
    }
    many->step(feeds);
    for (int s = 0; s < 3; ++s) got[s] = buf[s];
  }
  for (int j = 0; j < 4; ++j) {
    if (j == 2) many->reset_slot(1);  // slot 1's sequence leaves; a new one comes in with its prompt
    std::vector<std::vector<float>> buf(3);
    std::vector<Runner::Feed> feeds;
    for (int s = 0; s < 3; ++s) {
      std::span<const int32_t> ids = s != 1 || j < 2 ? std::span<const int32_t>(&steps[s][j], 1)
                                     : j == 2        ? std::span<const int32_t>(late)
                                                     : std::span<const int32_t>(&late_steps[0], 1);
      buf[s].resize(ids.size() * V);
      feeds.push_back({s, ids, buf[s].data(), Qwen35Moe::LogitRows::All, false});
    }
    many->step(feeds);
    for (int s = 0; s < 3; ++s) {
      auto& dst = s == 1 && j >= 2 ? got_late[0] : got[s];
      dst.insert(dst.end(), buf[s].begin(), buf[s].end());
    }
  }
  EXPECT_EQ(many->position(0), 9);
  EXPECT_EQ(many->position(1), 3);
  EXPECT_EQ(many->position(2), 5);
  // slot 1's first sequence decoded 2 tokens before it left; its second one a prompt of 2 and 1 token
  std::vector<float> want_late_fed(want_late.begin(), want_late.begin() + 3 * V);
  for (int s = 0; s < 3; ++s) expect_rows(got[s], want[s], V, tol, "sequence " + std::to_string(s));
  expect_rows(got_late[0], want_late_fed, V, tol, "the sequence that joined slot 1");
}

// K = 4 tokens after a 3-token prompt in one step that keeps its states, against 4 single steps; then,
// for every j in 0..4, a rollback to j followed by one more token, against a sequence fed only the
// first j of them and then that token.
inline void keep_states_and_rollback(const RunnerFactory& make, const std::vector<int32_t>& pool, int64_t V, double tol) {
  ASSERT_GE(pool.size(), 8u);
  const std::vector<int32_t> prompt(pool.begin(), pool.begin() + 3), draft(pool.begin() + 3, pool.begin() + 7);
  const int32_t next = pool[7];
  auto plain = make(1, 0);
  const std::vector<float> want = alone(*plain, V, prompt, draft);
  auto r = make(1, static_cast<int64_t>(draft.size()));
  std::vector<float> got(prompt.size() * V), rows(draft.size() * V), row(V);
  for (int64_t keep = 0; keep <= static_cast<int64_t>(draft.size()); ++keep) {
    r->reset();
    r->forward(prompt, got.data(), Qwen35Moe::LogitRows::All);
    const Runner::Feed f{0, draft, rows.data(), Qwen35Moe::LogitRows::All, true};
    r->step(std::span(&f, 1));
    if (keep == 0) {
      std::vector<float> all = got;
      all.insert(all.end(), rows.begin(), rows.end());
      expect_rows(all, want, V, tol, "a 4-token step that keeps its states against 4 single steps");
    }
    r->rollback(0, keep);
    EXPECT_EQ(r->position(0), static_cast<int64_t>(prompt.size()) + keep);
    r->forward(std::span(&next, 1), row.data(), Qwen35Moe::LogitRows::Last);
    const std::vector<int32_t> fed(draft.begin(), draft.begin() + keep);
    std::vector<int32_t> then = fed;
    then.push_back(next);
    const std::vector<float> ref = alone(*plain, V, prompt, then);
    const std::vector<float> ref_row(ref.end() - V, ref.end());
    expect_rows(row, ref_row, V, tol, "after a rollback to " + std::to_string(keep) + " of 4");
  }
  EXPECT_THROW(r->rollback(0, 1), Error);  // the last step kept nothing
}

// A sequence saved after its prompt (Runner::save) and restored into another slot, and into its own
// after that slot moved on, continues bit for bit as the sequence that was never saved: the same
// state, the same kernels on the rows that follow.
inline void saved_sequence_restores(const RunnerFactory& make, const std::vector<int32_t>& pool, int64_t V) {
  ASSERT_GE(pool.size(), 8u);
  const std::vector<int32_t> prompt(pool.begin(), pool.begin() + 5), then(pool.begin() + 5, pool.begin() + 8);
  auto r = make(2, 0);
  ASSERT_TRUE(r->saves_sequences());
  std::vector<float> scratch(prompt.size() * V), want(then.size() * V), got(then.size() * V);
  const Runner::Feed p{0, prompt, scratch.data(), Qwen35Moe::LogitRows::All, false};
  r->step(std::span(&p, 1));
  const std::shared_ptr<const SequenceSnapshot> saved = r->save(0);
  ASSERT_TRUE(saved);
  EXPECT_EQ(saved->position, static_cast<int64_t>(prompt.size()));
  EXPECT_GT(saved->bytes, 0u);
  const Runner::Feed a{0, then, want.data(), Qwen35Moe::LogitRows::All, false};
  r->step(std::span(&a, 1));
  for (int slot : {1, 0}) {
    r->restore(slot, *saved);
    EXPECT_EQ(r->position(slot), static_cast<int64_t>(prompt.size()));
    const Runner::Feed b{slot, then, got.data(), Qwen35Moe::LogitRows::All, false};
    r->step(std::span(&b, 1));
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0) << "restored into slot " << slot << ": " << differ << " of " << got.size() << " logits differ";
  }
}

// A saved sequence takes its MTP head's side along (Runner::save / restore with drafts): `r` holds two
// slots and drafts 3; slot 0 is fed `prompt`, saved, restored into slot 1, and both draft alike, give
// the same rows for a verification step rolled back to one token, and draft alike after it.
inline void saved_sequence_drafts_alike(Runner& r, std::span<const int32_t> prompt, int64_t V) {
  std::vector<float> logits(static_cast<size_t>(V));
  r.step(std::vector<Runner::Feed>{{0, prompt, logits.data(), Qwen35Moe::LogitRows::Last, false}});
  const int32_t next = argmax_lowest(logits);
  const auto saved = r.save(0);
  std::vector<int32_t> a(3), b(3);
  r.draft(0, next, a, nullptr);
  r.restore(1, *saved);
  r.draft(1, next, b, nullptr);
  EXPECT_EQ(a, b);
  std::vector<std::vector<float>> rows(2);
  for (int s : {0, 1}) {
    std::vector<int32_t> feed = {next};
    feed.insert(feed.end(), a.begin(), a.end());
    rows[s].resize(feed.size() * static_cast<size_t>(V));
    r.step(std::vector<Runner::Feed>{{s, feed, rows[s].data(), Qwen35Moe::LogitRows::All, true}});
    r.rollback(s, 1);
  }
  EXPECT_EQ(rows[0], rows[1]);
  std::vector<int32_t> a2(2), b2(2);
  r.draft(0, 5, a2, nullptr);
  r.draft(1, 5, b2, nullptr);
  EXPECT_EQ(a2, b2);
}

// The demo model (models/demo) asked to write Python, greedy, 96 tokens: the plain runner's reply and
// the drafting one's (draft 2), from runners `make(draft)` makes. The GPU suites check that the tokens
// agree and that the trained head's drafts are accepted.
struct DemoDrafting {
  GenerateResult plain, drafted;
};
inline DemoDrafting demo_drafting(const Qwen35Moe& model, const std::string& dir, const std::function<RunnerOptions(int draft)>& make) {
  const Tokenizer tok = Tokenizer::from_model_dir(dir);
  ChatOptions co;
  co.enable_thinking = false;
  GenerateRequest q;
  q.prompt = tok.encode(render_chat(std::vector<ChatMessage>{{"user", "Write some Python."}}, co));
  q.max_new_tokens = 96;
  q.sampling.temperature = 0;
  const int64_t V = model.config().vocab_size;
  DemoDrafting d;
  d.plain = generate(*make_runner(model, make(0)), V, tok, q);
  q.draft = 2;
  d.drafted = generate(*make_runner(model, make(2)), V, tok, q);
  return d;
}

}  // namespace tandem::test
