// Speculative decoding with the model's MTP head on the host placements (ref, cpu): the head against
// its float reference (HF's own decoder layer under the head's formula, tools/make_reference.py) on
// the fixtures that carry a head; the head's cache (rows at once = rows one by one); and the decoding
// contract on the tiny synthetic model: greedy tokens with drafts are the tokens without them,
// whatever the acceptance (random heads accept almost nothing, so an oracle drafter that knows the
// answer checks the accepting side), in batches too; sampled tokens keep the target's distribution.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "runtime/engine/generate.h"
#include "runtime/engine/logits_compare.h"
#include "runtime/format/npy.h"
#include "runtime/models/qwen3_5_moe/cpu_backend.h"
#include "runtime/tokenizer/chat_template.h"
#include "tests/unit/batch_cases.h"
#include "tests/unit/candidate_runner.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

std::unique_ptr<Runner> host_runner(const Qwen35Moe& m, Device d, int draft, int batch = 1) {
  RunnerOptions o;
  o.device = d;
  o.threads = 2;
  o.batch = batch;
  o.draft = draft;
  return make_runner(m, o);
}

// ---------------------------------------------------------------- the head against its reference

struct HeadCase {
  std::string fixture;
  Device device;
};

std::vector<HeadCase> head_cases() {
  std::vector<HeadCase> out;
  for (const std::string& f : test::fixture_names())
    if (std::filesystem::exists(std::string(TANDEM_TEST_DATA) + "/" + f + "/mtp_logits.npy"))
      for (Device d : {Device::Ref, Device::Cpu}) out.push_back({f, d});
  return out;
}

class MtpHead : public ::testing::TestWithParam<HeadCase> {};

// The main model's final hidden states against HF's (the head's input), then the head's logits from
// HF's hidden states against HF's decoder layer, per position; within the device's tolerance against
// HF (1e-4 for the exact reference, 3e-2 for the CPU kernels, as the main model's logits).
TEST_P(MtpHead, MatchesTheFloatReference) {
  const test::Fixture fx = test::load_fixture(GetParam().fixture);
  auto model = Qwen35Moe::load(fx.dir);
  ASSERT_NE(model->mtp(), nullptr) << fx.dir << " has mtp_logits.npy but no whole head";
  const int64_t H = model->config().hidden_size, V = fx.vocab, n = static_cast<int64_t>(fx.ids.size());
  const double tol = GetParam().device == Device::Ref ? 1e-4 : 3e-2;
  std::unique_ptr<CpuBackend> cpu;
  if (GetParam().device == Device::Cpu) {
    CpuBackendOptions co;
    co.threads = 2;
    co.mtp = true;
    cpu = std::make_unique<CpuBackend>(*model, co);
  }
  const NpyArray want_h = read_npy_f32(fx.dir + "/mtp_hidden.npy"), want = read_npy_f32(fx.dir + "/mtp_logits.npy");
  ASSERT_EQ(want_h.shape, (std::vector<int64_t>{n, H}));
  ASSERT_EQ(want.shape, (std::vector<int64_t>{n - 1, V}));

  Qwen35State st = model->new_state();
  st.backend = cpu.get();
  std::vector<float> h(static_cast<size_t>(n * H));
  const Qwen35Moe::SeqTokens one{&st, fx.ids, nullptr, Qwen35Moe::LogitRows::Last, false, h.data()};
  model->forward_batch(std::span(&one, 1));
  for (int64_t t = 0; t < n; ++t)
    EXPECT_LT(test::row_rel_l2(h.data() + t * H, want_h.data.data() + t * H, H), tol) << "main hidden state, position " << t;

  Qwen35State head = model->new_mtp_state();
  head.backend = cpu.get();
  std::vector<float> logits(static_cast<size_t>((n - 1) * V));
  model->mtp_forward(head, std::span(fx.ids).subspan(1), want_h.data.data(), logits.data(), Qwen35Moe::LogitRows::All);
  EXPECT_EQ(head.pos, n - 1);
  for (int64_t t = 0; t + 1 < n; ++t)
    EXPECT_LT(test::row_rel_l2(logits.data() + t * V, want.data.data() + t * V, V), tol) << "MTP logits, position " << t;

  // The head's cache: the same rows one at a time (bit for bit on the reference).
  Qwen35State step = model->new_mtp_state();
  step.backend = cpu.get();
  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t t = 0; t + 1 < n; ++t) {
    model->mtp_forward(step, std::span(fx.ids).subspan(static_cast<size_t>(t) + 1, 1), want_h.data.data() + t * H, row.data(),
                       Qwen35Moe::LogitRows::Last);
    if (GetParam().device == Device::Ref)
      EXPECT_TRUE(std::equal(row.begin(), row.end(), logits.begin() + t * V)) << "position " << t << " fed alone";
    else  // the CPU kernels take one row and several by different paths (AMX tiles for several where the CPU has them)
      EXPECT_LT(test::row_rel_l2(row.data(), logits.data() + t * V, V), 1e-2) << "position " << t << " fed alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpHead, ::testing::ValuesIn(head_cases()),
                         [](const auto& info) { return info.param.fixture + "_" + device_name(info.param.device); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MtpHead);

TEST(MtpHead, FixturesCarryOne) { EXPECT_GE(head_cases().size(), 6u) << "gptq_sym_v1 and bf16_text_only (tools/make_reference.py) and the demo model (tools/train_demo.py) carry a head"; }

// ---------------------------------------------------------------- decoding with drafts

const test::TinyModel& tiny() {
  static const test::TinyModel m;
  return m;
}

GenerateRequest greedy_request(const std::string& prompt, int64_t n, int draft) {
  GenerateRequest q;
  q.prompt = tiny().tok.encode(prompt);
  q.max_new_tokens = n;
  q.sampling.temperature = 0;
  q.draft = draft;
  return q;
}

class Speculative : public ::testing::TestWithParam<Device> {};

TEST_P(Speculative, GreedyTokensAreTheTokensWithoutDrafts) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, GetParam(), 0);
  for (int k : {1, 2, 4}) {
    auto spec = host_runner(*m.model, GetParam(), k);
    EXPECT_EQ(spec->max_draft(), k);
    for (const char* p : {"the model routes every token", "x y z"}) {
      const GenerateResult want = generate(*plain, m.vocab, m.tok, greedy_request(p, 24, 0));
      const GenerateResult got = generate(*spec, m.vocab, m.tok, greedy_request(p, 24, k));
      EXPECT_EQ(got.tokens, want.tokens) << "draft " << k << ", prompt '" << p << "'";
      EXPECT_EQ(got.text, want.text);
      EXPECT_GT(got.drafts.verify_steps, 0);
      ASSERT_EQ(got.drafts.drafted.size(), static_cast<size_t>(k));
      EXPECT_GT(got.drafts.drafted[0], 0);
    }
  }
}

// Greedy requests with different drafts in one batch: each gets its tokens alone without drafts, on a
// runner that verifies several sequences in one step (each drafts beside the others) and on one that
// keeps one sequence's states a step (the GPU's way: only a sequence alone in flight drafts; here the
// longest request, once the others are done).
TEST_P(Speculative, BatchedRequestsWithDraftsGetTheirTokensAlone) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, GetParam(), 0);
  const char* prompts[] = {"experts", "a longer prompt than the others, with commas", "five", "x y z"};
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy_request(prompts[i], 9 + 3 * i, i % 4));  // drafts 0, 1, 2, 3
  for (bool one_kept : {false, true}) {
    auto spec = host_runner(*m.model, GetParam(), 3, 4);
    test::OneKeptStepRunner one(host_runner(*m.model, GetParam(), 3, 4));
    Runner& r = one_kept ? one : *spec;
    const std::vector<GenerateResult> got = generate_batch(r, m.vocab, m.tok, reqs);
    int64_t verifications = 0;
    for (int i = 0; i < 4; ++i) {
      GenerateRequest alone = reqs[i];
      alone.draft = 0;
      EXPECT_EQ(got[i].tokens, generate(*plain, m.vocab, m.tok, alone).tokens) << "request " << i << (one_kept ? ", one kept step at a time" : "");
      EXPECT_EQ(got[i].drafts.verify_steps > 0, one_kept ? i == 3 : i > 0) << "request " << i << (one_kept ? ", one kept step at a time" : "");
      verifications += got[i].drafts.verify_steps;
    }
    if (one_kept) EXPECT_EQ(one.kept_steps, verifications);
  }
}

// A drafter that knows the greedy answer (`truth`: prompt and reply) and spoils the draft at
// position `wrong` of every other call: the accepting side of verification and rollback.
class OracleRunner final : public test::ForwardingRunner {
 public:
  OracleRunner(std::unique_ptr<Runner> inner, std::vector<int32_t> truth, int draft, int wrong, int64_t vocab)
      : ForwardingRunner(std::move(inner)), truth_(std::move(truth)), draft_(draft), wrong_(wrong), vocab_(vocab) {}
  int max_draft() const override { return draft_; }
  void draft(int slot, int32_t next, std::span<int32_t> drafts, const DraftPick&) override {
    const int64_t at = in_->position(slot);  // next sits at truth_[at]
    EXPECT_EQ(next, truth_.at(static_cast<size_t>(at)));
    for (size_t i = 0; i < drafts.size(); ++i) {
      const size_t j = static_cast<size_t>(at) + 1 + i;
      drafts[i] = j < truth_.size() ? truth_[j] : 0;
      if (calls_ % 2 == 1 && static_cast<int>(i) == wrong_) drafts[i] = static_cast<int32_t>((drafts[i] + 1) % vocab_);
    }
    ++calls_;
  }
  std::string describe() const override { return "oracle drafts over " + in_->describe(); }
  int calls_ = 0;

 private:
  std::vector<int32_t> truth_;
  int draft_, wrong_;
  int64_t vocab_;
};

TEST_P(Speculative, AcceptedDraftsAreKeptAndTheRestRolledBack) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, GetParam(), 0);
  const GenerateRequest base = greedy_request("the model routes every token", 30, 0);
  const GenerateResult want = generate(*plain, m.vocab, m.tok, base);
  std::vector<int32_t> truth = base.prompt;
  truth.insert(truth.end(), want.tokens.begin(), want.tokens.end());
  for (int wrong : {0, 2}) {
    OracleRunner oracle(host_runner(*m.model, GetParam(), 0), truth, 3, wrong, m.vocab);
    GenerateRequest q = base;
    q.draft = 3;
    const GenerateResult got = generate(oracle, m.vocab, m.tok, q);
    EXPECT_EQ(got.tokens, want.tokens) << "spoiled position " << wrong;
    ASSERT_EQ(got.drafts.drafted.size(), 3u);
    // Calls alternate all right / spoiled at `wrong`: position 0 is accepted in every good call.
    EXPECT_GE(got.drafts.accepted[0], got.drafts.drafted[0] / 2 - 1);
    if (wrong == 0) {
      EXPECT_LE(got.drafts.accepted[0], (got.drafts.drafted[0] + 1) / 2);
    }
    if (wrong == 2) {
      EXPECT_EQ(got.drafts.accepted[1], got.drafts.drafted[1]);
    }
    EXPECT_LT(got.drafts.verify_steps, static_cast<int64_t>(want.tokens.size()) - 1) << "accepted drafts save steps";
  }
}

// Verification from each row's candidates (Runner::step_top: the GPU runner's path, here the host's
// CandidateRunner): greedy tokens with drafts, with repetition and presence penalties that differ row by
// row (row i sees drafts 0..i-1 in its context), are the tokens without drafts, on the oracle's drafts
// (the accepting side) and on the head's in a batch; every step goes through the candidates.
TEST_P(Speculative, VerificationFromCandidatesKeepsTheTokens) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, GetParam(), 0);
  GenerateRequest base = greedy_request("the model routes every token", 30, 0);
  base.sampling.repetition_penalty = 1.5f;
  base.sampling.presence_penalty = 4.0f;
  const GenerateResult want = generate(*plain, m.vocab, m.tok, base);
  std::vector<int32_t> truth = base.prompt;
  truth.insert(truth.end(), want.tokens.begin(), want.tokens.end());
  for (int wrong : {0, 2}) {
    test::CandidateRunner cand(std::make_unique<OracleRunner>(host_runner(*m.model, GetParam(), 0), truth, 3, wrong, m.vocab), m.vocab);
    GenerateRequest q = base;
    q.draft = 3;
    const GenerateResult got = generate(cand, m.vocab, m.tok, q);
    EXPECT_EQ(got.tokens, want.tokens) << "spoiled position " << wrong;
    EXPECT_GT(got.drafts.accepted[0], 0) << "spoiled position " << wrong;
    EXPECT_LT(got.drafts.verify_steps, static_cast<int64_t>(want.tokens.size()) - 1) << "accepted drafts save steps";
    EXPECT_GT(cand.calls, got.drafts.verify_steps);
    EXPECT_EQ(cand.row_steps, 0) << "every step through the candidates";
    EXPECT_EQ(cand.rows_missing_context, 0) << "a verification row's penalties count the drafts before it";
  }
  test::CandidateRunner cand(host_runner(*m.model, GetParam(), 3, 4), m.vocab);
  const char* prompts[] = {"experts", "a longer prompt than the others, with commas", "five", "x y z"};
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(greedy_request(prompts[i], 9 + 3 * i, i % 4));  // drafts 0, 1, 2, 3
    reqs.back().sampling.presence_penalty = 4.0f;
  }
  const std::vector<GenerateResult> got = generate_batch(cand, m.vocab, m.tok, reqs);
  for (int i = 0; i < 4; ++i) {
    GenerateRequest alone = reqs[i];
    alone.draft = 0;
    EXPECT_EQ(got[i].tokens, generate(*plain, m.vocab, m.tok, alone).tokens) << "request " << i;
    EXPECT_EQ(got[i].drafts.verify_steps > 0, i > 0) << "request " << i;
  }
  EXPECT_GT(cand.calls, 0);
  EXPECT_EQ(cand.row_steps, 0) << "every step through the candidates";
  EXPECT_EQ(cand.rows_missing_context, 0) << "a verification row's penalties count the drafts before it";
}

// Seeded sampling with drafts draws from the target distribution: the joint distribution of the
// first two sampled tokens (top-3 sampling: 9 outcomes; the second goes through a verification with
// the head's draft) against the sampler without drafts, by a two-sample chi-square test.
// The first two sampled tokens (top-3 at temperature 1.5, the second through a verification of the
// head's draft) from `spec` against `plain` without drafts: a two-sample chi-square test.
void expect_target_distribution(Runner& plain, Runner& spec) {
  const test::TinyModel& m = tiny();
  const int n = 1500;
  std::map<std::pair<int32_t, int32_t>, int> a, b;
  int64_t verified = 0;
  for (int i = 0; i < n; ++i) {
    GenerateRequest q = greedy_request("experts", 3, 0);
    q.sampling.temperature = 1.5f;
    q.sampling.top_k = 3;
    q.sampling.seeded = true;
    q.sampling.seed = test::test_seed() + static_cast<uint64_t>(i);
    const GenerateResult x = generate(plain, m.vocab, m.tok, q);
    q.draft = 1;
    q.sampling.seed += 1000003;  // independent of the first run
    const GenerateResult y = generate(spec, m.vocab, m.tok, q);
    ASSERT_GE(x.tokens.size(), 2u);
    ASSERT_GE(y.tokens.size(), 2u);
    ++a[{x.tokens[0], x.tokens[1]}];
    ++b[{y.tokens[0], y.tokens[1]}];
    verified += y.drafts.verify_steps;
  }
  EXPECT_GE(verified, n);
  std::map<std::pair<int32_t, int32_t>, int> all = a;
  for (const auto& [k, v] : b) all[k] += 0;
  double chi2 = 0;
  for (const auto& [k, v] : all) {
    const double x = a.count(k) ? a[k] : 0, y = b.count(k) ? b[k] : 0;
    chi2 += (x - y) * (x - y) / (x + y);
  }
  const int df = static_cast<int>(all.size()) - 1;
  ASSERT_LE(df, 8) << "top-3 sampling: at most 9 outcomes";
  // chi-square critical values at significance 1e-6, df 1..8
  static const double crit[] = {0, 23.93, 27.63, 30.66, 33.38, 35.89, 38.26, 40.52, 42.70};
  EXPECT_LT(chi2, crit[std::max(df, 1)]) << "seed " << test::test_seed();
}

TEST_P(Speculative, SampledTokensKeepTheTargetDistribution) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, GetParam(), 0);
  auto spec = host_runner(*m.model, GetParam(), 1);
  expect_target_distribution(*plain, *spec);
}

// The same with the acceptance rule applied to each row's candidates (the GPU runner's path, Runner::step_top).
TEST(SpeculativeCandidates, SampledTokensKeepTheTargetDistribution) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, Device::Cpu, 0);
  test::CandidateRunner spec(host_runner(*m.model, Device::Cpu, 1), m.vocab);
  expect_target_distribution(*plain, spec);
  EXPECT_EQ(spec.row_steps, 0) << "every step through the candidates";
}

// A saved sequence takes its head's side along: the restored slot drafts what the saved one did.
TEST_P(Speculative, ASavedSequenceDraftsAsItsOriginal) {
  const test::TinyModel& m = tiny();
  auto r = host_runner(*m.model, GetParam(), 3, 2);
  test::saved_sequence_drafts_alike(*r, m.tok.encode("the model routes every token"), m.vocab);
}

INSTANTIATE_TEST_SUITE_P(Host, Speculative, ::testing::Values(Device::Ref, Device::Cpu), [](const auto& info) { return std::string(device_name(info.param)); });

// The demo model (models/demo, tools/train_demo.py: a small model trained with its head on Python
// sources): a chat turn asking for Python, greedy, with 2 drafts a step. The head was trained, so its
// drafts are accepted often (held-out agreement 61.5% at training time; 0.71 / 0.50 by position on
// this prompt when it was committed), the reply is the reply without drafts, and it reads as Python.
TEST(DemoModel, DraftsOfItsTrainedHeadAreAccepted) {
  const std::string dir = std::string(TANDEM_TEST_DATA) + "/demo";
  auto model = Qwen35Moe::load(dir);
  const Tokenizer tok = Tokenizer::from_model_dir(dir);
  ChatOptions co;
  co.enable_thinking = false;
  const std::vector<ChatMessage> chat = {{"user", "Write some Python."}};
  GenerateRequest q;
  q.prompt = tok.encode(render_chat(chat, co));
  q.max_new_tokens = 96;
  q.sampling.temperature = 0;
  for (Device d : {Device::Ref, Device::Cpu}) {
    auto plain = host_runner(*model, d, 0);
    auto spec = host_runner(*model, d, 2);
    const GenerateResult want = generate(*plain, model->config().vocab_size, tok, q);
    GenerateRequest qd = q;
    qd.draft = 2;
    const GenerateResult got = generate(*spec, model->config().vocab_size, tok, qd);
    EXPECT_EQ(got.tokens, want.tokens) << device_name(d);
    const std::vector<double> acc = got.drafts.acceptance();
    ASSERT_EQ(acc.size(), 2u);
    EXPECT_GT(acc[0], 0.5) << device_name(d) << ": " << got.drafts.summary();
    EXPECT_GT(acc[1], 0.3) << device_name(d) << ": " << got.drafts.summary();
    EXPECT_GT(got.drafts.tokens_per_step(), 1.6) << device_name(d) << ": " << got.drafts.summary();
    bool python = false;  // it writes the standard library's kind of text: code, docstrings, comments
    for (const char* mark : {"def ", "import ", "class ", "self.", "\"\"\"", "__all__"}) python = python || got.text.find(mark) != std::string::npos;
    EXPECT_TRUE(python) << "the reply does not read as Python:\n" << got.text;
  }
}

// --draft auto: the tuner times every k first, then takes the k with the most tokens per second from
// the acceptance and the step times it measured; a cheap verification with accepted drafts draws it
// to the maximum, an expensive one to plain steps; steps that accept nothing draw it down.
TEST(DraftTuner, PicksTheFastestDraftCount) {
  auto run = [](double per_draft_s, double accept, int steps) {
    DraftTuner t(4);
    std::mt19937_64 rng(1);
    std::bernoulli_distribution ok(accept);
    std::vector<int> seen(5, 0);
    for (int i = 0; i < steps; ++i) {
      const int k = t.choose();
      ++seen[k];
      int a = 0;
      while (a < k && ok(rng)) ++a;
      t.record(k, a, 1e-3 * (1 + per_draft_s * k));
    }
    for (int k = 0; k <= 4; ++k) EXPECT_GE(seen[k], DraftTuner::kWarm + 1) << "k " << k << " timed in the warm-up";
    return t;
  };
  const DraftTuner cheap = run(0.1, 0.9, 200);
  EXPECT_EQ(cheap.best(), 4);
  EXPECT_NEAR(cheap.acceptance(0), 0.9, 0.08);
  EXPECT_NEAR(cheap.step_seconds(2), 1.2e-3, 1e-9);
  EXPECT_EQ(run(2.0, 0.9, 200).best(), 0);   // verification costs more than the drafts bring
  EXPECT_EQ(run(0.1, 0.0, 200).best(), 0);   // nothing accepted
  EXPECT_NE(cheap.summary().find("4 drafts"), std::string::npos) << cheap.summary();
  // Drafts that are never accepted with a verification that costs twice a plain step: the warm-up
  // stops once the first position's acceptance says so, and drafts are re-tried only rarely.
  {
    DraftTuner t(4);
    int drafted_steps = 0;
    for (int i = 0; i < 400; ++i) {
      const int k = t.choose();
      drafted_steps += k > 0;
      t.record(k, 0, 1e-3 * (k ? 2.0 + 0.1 * k : 1.0));
    }
    EXPECT_TRUE(t.hopeless());
    EXPECT_EQ(t.best(), 0);
    EXPECT_LT(drafted_steps, 24) << "drafting steps spent finding out";
  }
  // E(k) from the acceptance by position: 1 + a1 + a1 a2 + ...
  DraftTuner t(2);
  EXPECT_NEAR(t.expected_tokens(2), 1 + 0.6 + 0.36, 1e-12);  // the prior alone
}

// Greedy tokens with --draft auto are the tokens without drafts, and the runner keeps its tuner.
TEST(DraftTuner, AutoDraftsKeepTheGreedyTokens) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, Device::Cpu, 0);
  auto aut = host_runner(*m.model, Device::Cpu, kDraftAuto);
  ASSERT_NE(aut->draft_tuner(), nullptr);
  EXPECT_EQ(aut->max_draft(), kAutoDraftMax);
  EXPECT_EQ(aut->request_draft(), kDraftAuto);
  EXPECT_EQ(plain->draft_tuner(), nullptr);
  EXPECT_EQ(plain->request_draft(), 0);
  const GenerateResult want = generate(*plain, m.vocab, m.tok, greedy_request("the model routes every token", 60, 0));
  const GenerateResult got = generate(*aut, m.vocab, m.tok, greedy_request("the model routes every token", 60, kDraftAuto));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.drafts.verify_steps, 0);  // the warm-up verifies drafts whatever it then picks
}

// --draft auto drafts for a sequence alone only: two requests in flight together (the same prompt and
// length: they end together) decode plain, with the tokens of each alone.
TEST(DraftTuner, AutoDraftsOnlyForASequenceAlone) {
  const test::TinyModel& m = tiny();
  auto plain = host_runner(*m.model, Device::Cpu, 0);
  auto aut = host_runner(*m.model, Device::Cpu, kDraftAuto, 2);
  const GenerateRequest q = greedy_request("the model routes every token", 30, kDraftAuto);
  const std::vector<GenerateRequest> reqs{q, q};
  const std::vector<GenerateResult> got = generate_batch(*aut, m.vocab, m.tok, reqs);
  const GenerateResult want = generate(*plain, m.vocab, m.tok, q);
  for (const GenerateResult& g : got) {
    EXPECT_EQ(g.tokens, want.tokens);
    EXPECT_EQ(g.drafts.verify_steps, 0);
  }
  EXPECT_GT(generate(*aut, m.vocab, m.tok, q).drafts.verify_steps, 0);
}

// Forced text (GenerateRequest::force_after / force_ids, the server's tool_choice): from the first
// token, or right after a trigger in the reply's text, the reply's next tokens are the forced ones;
// the rest is the model's own continuation, with drafts the same as without.
TEST(ForcedText, ComesFirstOrRightAfterItsTrigger) {
  const test::TinyModel& m = tiny();
  auto r = host_runner(*m.model, Device::Cpu, 0);
  auto spec = host_runner(*m.model, Device::Cpu, 3);
  const GenerateResult plain = generate(*r, m.vocab, m.tok, greedy_request("the model routes every token", 24, 0));
  const std::vector<int32_t> forced = m.tok.encode(" forced words");
  ASSERT_FALSE(forced.empty());
  GenerateRequest first = greedy_request("the model routes every token", 24, 0);
  first.force_ids = forced;
  const GenerateResult a = generate(*r, m.vocab, m.tok, first);
  ASSERT_GE(a.tokens.size(), forced.size());
  EXPECT_TRUE(std::equal(forced.begin(), forced.end(), a.tokens.begin()));
  EXPECT_EQ(a.text.rfind(m.tok.decode(forced), 0), 0u) << a.text;
  // after a trigger: the plain reply's text up to its 6th token
  const std::string trigger = m.tok.decode(std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + 6));
  ASSERT_FALSE(trigger.empty());
  for (auto* runner : {r.get(), spec.get()}) {
    GenerateRequest after = greedy_request("the model routes every token", 24, runner == spec.get() ? 3 : 0);
    after.force_after = trigger;
    after.force_ids = forced;
    const GenerateResult b = generate(*runner, m.vocab, m.tok, after);
    ASSERT_GE(b.tokens.size(), 6 + forced.size());
    EXPECT_TRUE(std::equal(plain.tokens.begin(), plain.tokens.begin() + 6, b.tokens.begin())) << "the model's own tokens up to the trigger";
    EXPECT_TRUE(std::equal(forced.begin(), forced.end(), b.tokens.begin() + 6)) << "then the forced ones";
    if (runner == spec.get()) {
      after.draft = 0;
      EXPECT_EQ(b.tokens, generate(*r, m.vocab, m.tok, after).tokens) << "drafts change nothing";
    }
  }
}

TEST(Speculative, RefusesWhatItCannotDo) {
  auto no_head = Qwen35Moe::load(std::string(TANDEM_TEST_DATA) + "/bf16_fused");  // a few mtp.* tensors, no whole head
  ASSERT_EQ(no_head->mtp(), nullptr);
  test::expect_error([&] { host_runner(*no_head, Device::Ref, 2); }, {"--draft 2", "bf16_fused", "no MTP head"});
  test::expect_error([&] { host_runner(*tiny().model, Device::Ref, kMaxDraft + 1); }, {"--draft", "between 0 (off) and"});
  auto r = host_runner(*tiny().model, Device::Ref, 2);
  std::vector<int32_t> three(3);
  test::expect_error([&] { r->draft(0, 1, three, nullptr); }, {"3 tokens asked for", "1..2"});
  std::vector<int32_t> one(1);
  test::expect_error([&] { r->draft(0, 1, one, nullptr); }, {"nothing to draft from"});
  auto plain = host_runner(*tiny().model, Device::Ref, 0);
  test::expect_error([&] { plain->draft(0, 1, one, nullptr); }, {"does not draft"});
}

}  // namespace
}  // namespace tandem
