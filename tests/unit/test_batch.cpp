// The batched engine on the host placements (ref, cpu) and every HF fixture: batch_cases.h's contract
// bit for bit (a sequence's rows are computed with the same arithmetic in any batch; AMX: see below), the batched
// rows against HF's logits, and generate_batch's results equal to each request run alone.
#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "cpu_experts/isa.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/logits_compare.h"
#include "runtime/format/npy.h"
#include "tests/unit/batch_cases.h"
#include "tests/unit/candidate_runner.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct Case {
  std::string fixture;
  Device device;
  RowFormat kv = RowFormat::Bf16;  // the KV cache's format (RunnerOptions::kv_format)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const std::string kv = info.param.kv == RowFormat::Bf16 ? "" : std::string("_") + row_format_name(info.param.kv);
  return info.param.fixture + "_" + device_name(info.param.device) + kv;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string& f : test::fixture_names())
    for (Device d : {Device::Ref, Device::Cpu}) out.push_back({f, d});
  return out;
}

class Batch : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    fixture_ = test::load_fixture(GetParam().fixture);
    model_ = Qwen35Moe::load(fixture_.dir);
  }
  test::RunnerFactory factory() const {
    return [this](int batch, int64_t verify) {
      RunnerOptions o;
      o.device = GetParam().device;
      o.threads = 2;
      o.batch = batch;
      o.verify_tokens = verify;
      o.kv_format = row_format_name(GetParam().kv);
      return make_runner(*model_, o);
    };
  }
  test::Fixture fixture_;
  std::unique_ptr<Qwen35Moe> model_;
};

// Bit for bit, except on the CPU kernels at the AMX level: there a step of several rows goes through
// the tiles (bf16 activations) where one row does not (rows differ by up to ~5e-3: bf16 rounding of
// the activations through the layers).
TEST_P(Batch, EverySequenceGetsItsLogitsAlone) {
  const bool amx = GetParam().device == Device::Cpu && cpu::default_isa().isa == cpu::Isa::Amx;
  test::batch_equals_alone(factory(), fixture_.ids, fixture_.vocab, amx ? 1e-2 : 0);
}

TEST_P(Batch, KeptStatesRollBackExactly) { test::keep_states_and_rollback(factory(), fixture_.ids, fixture_.vocab, 0); }

TEST_P(Batch, ASavedSequenceRestoresExactly) { test::saved_sequence_restores(factory(), fixture_.ids, fixture_.vocab); }

// The fixture's ids as three sequences of different lengths in one prompt step: each one's rows
// against HF's logits of the same positions (the fixture's prompt is one sequence, so each of ours
// is a prefix of it). Within each device's tolerance against HF: 1e-4 for the exact reference, 3e-2 for
// cpu (its int4 experts see 16-bit activations; tests/cli/test_cpu_device.sh).
TEST_P(Batch, BatchedPrefixesMatchTransformers) {
  const double tol = GetParam().device == Device::Ref ? 1e-4 : 3e-2;
  const NpyArray ref = read_npy_f32(fixture_.dir + "/logits.npy");
  const int64_t V = fixture_.vocab, n = static_cast<int64_t>(fixture_.ids.size());
  auto r = factory()(3, 0);
  const std::vector<int64_t> lengths = {n, std::max<int64_t>(1, n / 2), 1};
  std::vector<std::vector<float>> out(3);
  std::vector<Runner::Feed> feeds;
  for (int s = 0; s < 3; ++s) {
    out[s].resize(lengths[s] * V);
    feeds.push_back({s, std::span(fixture_.ids.data(), lengths[s]), out[s].data(), Qwen35Moe::LogitRows::All, false});
  }
  r->step(feeds);
  for (int s = 0; s < 3; ++s) {
    const LogitsComparison cmp = compare_logits(out[s].data(), ref.data.data(), lengths[s], V);
    for (int64_t t = 0; t < lengths[s]; ++t) EXPECT_LT(cmp.rel_l2[t], tol) << "sequence " << s << " position " << t;
  }
}

TEST_P(Batch, BadStepsAreRefusedBeforeAnythingRuns) {
  auto r = factory()(2, 0);
  const int32_t id = fixture_.ids[0];
  const Runner::Feed twice[2] = {{0, std::span(&id, 1)}, {0, std::span(&id, 1)}};
  EXPECT_THROW(r->step(twice), Error);
  const Runner::Feed outside{2, std::span(&id, 1)};
  EXPECT_THROW(r->step(std::span(&outside, 1)), Error);
  const int32_t bad = static_cast<int32_t>(fixture_.vocab);
  const Runner::Feed vocab[2] = {{0, std::span(&id, 1)}, {1, std::span(&bad, 1)}};
  EXPECT_THROW(r->step(vocab), Error);
  EXPECT_EQ(r->position(0), 0);  // nothing ran
  EXPECT_THROW(r->rollback(0, 0), Error);  // nothing was kept
}

// A coded KV cache (RunnerOptions::kv_format int8 / fp8: codes and a scale per position and KV head,
// KvRows) keeps the same guarantees: every sequence of a batch bit for bit as alone, a kept step rolled
// back exactly (the codes cut at the position), a saved sequence restored exactly.
class BatchCodedKv : public Batch {};

TEST_P(BatchCodedKv, EverySequenceGetsItsLogitsAlone) {
  const bool amx = GetParam().device == Device::Cpu && cpu::default_isa().isa == cpu::Isa::Amx;
  test::batch_equals_alone(factory(), fixture_.ids, fixture_.vocab, amx ? 1e-2 : 0);
}
TEST_P(BatchCodedKv, KeptStatesRollBackExactly) { test::keep_states_and_rollback(factory(), fixture_.ids, fixture_.vocab, 0); }
TEST_P(BatchCodedKv, ASavedSequenceRestoresExactly) { test::saved_sequence_restores(factory(), fixture_.ids, fixture_.vocab); }

// The coded cache's bytes: a quarter of the fp32 rows (plus a scale a row), in what a saved sequence takes.
TEST(CodedKvBytes, SavedSequencesTakeAQuarterOfTheKvBytes) {
  const test::Fixture f = test::load_fixture("demo");
  auto model = Qwen35Moe::load(f.dir);
  uint64_t saved[2] = {};
  for (const RowFormat kv : {RowFormat::Bf16, RowFormat::Int8}) {
    RunnerOptions o;
    o.device = Device::Ref;
    o.kv_format = row_format_name(kv);
    auto r = make_runner(*model, o);
    std::vector<float> logits(static_cast<size_t>(f.vocab));
    const Runner::Feed feed{0, f.ids, logits.data(), Qwen35Moe::LogitRows::Last, false};
    r->step(std::span(&feed, 1));
    saved[kv == RowFormat::Int8] = r->save(0)->bytes;
  }
  const ModelConfig& c = model->config();
  const uint64_t n = f.ids.size(), layers = static_cast<uint64_t>(c.num_full_attention_layers()), row = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  EXPECT_EQ(saved[0] - saved[1], layers * 2 * n * (row * 4 - row - static_cast<uint64_t>(c.num_kv_heads) * 4));
}

INSTANTIATE_TEST_SUITE_P(Tandem, BatchCodedKv,
                         ::testing::Values(Case{"demo", Device::Ref, RowFormat::Int8}, Case{"demo", Device::Cpu, RowFormat::Fp8},
                                           Case{"bf16_fused", Device::Cpu, RowFormat::Int8}, Case{"gptq_sym_v1", Device::Ref, RowFormat::Fp8}),
                         case_name);

INSTANTIATE_TEST_SUITE_P(Tandem, Batch, ::testing::ValuesIn(cases()), case_name);

// cpu runner options of the generation tests (batch 1: each request alone).
RunnerOptions cpu_options() {
  RunnerOptions o;
  o.device = Device::Cpu;
  o.threads = 2;
  return o;
}

// Each request generated alone on a one-sequence cpu runner.
std::vector<GenerateResult> each_alone(const test::TinyModel& tiny, const std::vector<GenerateRequest>& reqs) {
  auto one = make_runner(*tiny.model, cpu_options());
  std::vector<GenerateResult> alone;
  for (const GenerateRequest& q : reqs) alone.push_back(generate(*one, tiny.vocab, tiny.tok, q));
  return alone;
}

// got[i] has the tokens, text and stop reason of alone[i], for i < n.
void expect_same_results(const std::vector<GenerateResult>& got, const std::vector<GenerateResult>& alone, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].tokens, alone[i].tokens) << "request " << i << ", " << what;
    EXPECT_EQ(got[i].text, alone[i].text) << "request " << i << ", " << what;
    EXPECT_EQ(got[i].stop, alone[i].stop) << "request " << i << ", " << what;
  }
}

// Seeded sampling per sequence: each request of a batch draws what it draws alone, whatever else runs
// beside it and whichever slot it gets (more requests than slots: later ones wait for a free slot).
TEST(GenerateBatch, EachRequestGetsWhatItGetsAlone) {
  const test::TinyModel tiny;
  const std::vector<GenerateRequest> reqs = test::mixed_requests(tiny.tok, 4, 11);
  const std::vector<GenerateResult> alone = each_alone(tiny, reqs);
  for (int batch : {2, 4}) {
    RunnerOptions o = cpu_options();
    o.batch = batch;
    auto many = make_runner(*tiny.model, o);
    const std::vector<GenerateResult> got = generate_batch(*many, tiny.vocab, tiny.tok, reqs);
    ASSERT_EQ(got.size(), reqs.size());
    expect_same_results(got, alone, reqs.size(), "batch " + std::to_string(batch));
  }
}

// Continuous batching: prompts fed 3 tokens a step beside the others' decoding, requests added while
// others run and waiting for a slot, a request cancelled mid-way freeing its slot for the next one;
// every finished request has exactly what it gets alone.
TEST(Batcher, RequestsJoinAndLeaveBetweenSteps) {
  const test::TinyModel tiny;
  std::vector<GenerateRequest> reqs = test::mixed_requests(tiny.tok, 5, 21);
  const std::vector<GenerateResult> alone = each_alone(tiny, reqs);
  RunnerOptions o = cpu_options();
  o.batch = 2;
  auto two = make_runner(*tiny.model, o);
  std::atomic<bool> cancel{false};
  GenerateRequest doomed = reqs[4];
  doomed.max_new_tokens = 50;
  doomed.cancel = &cancel;
  std::vector<GenerateResult> got(reqs.size()), cancelled(1);
  Batcher b(*two, tiny.vocab, tiny.tok, 3);
  b.add(doomed, &cancelled[0]);
  b.add(reqs[0], &got[0]);
  for (int i = 0; i < 3; ++i) b.step();
  EXPECT_EQ(b.running(), 2u);
  for (size_t i = 1; i < 4; ++i) b.add(reqs[i], &got[i]);
  EXPECT_EQ(b.waiting(), 3u);
  b.step();
  cancel = true;  // the doomed request leaves at the next step; a waiting one takes its slot the step after
  b.step();
  EXPECT_EQ(cancelled[0].stop, StopReason::Cancelled);
  EXPECT_LT(cancelled[0].tokens.size(), 50u);
  b.step();
  EXPECT_LE(b.waiting(), 2u);
  while (!b.idle()) b.step();
  expect_same_results(got, alone, 4, "joined between steps");
  EXPECT_THROW(b.add(GenerateRequest{}, &got[0]), Error);  // an empty prompt
}

// The tokens of every feed of every step, by slot (a slot's list starts afresh when it is reset).
class FeedLog final : public test::ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  void step(std::span<const Feed> feeds) override {
    for (const Feed& f : feeds) sizes[f.slot].push_back(static_cast<int64_t>(f.ids.size()));
    in_->step(feeds);
  }
  void reset_slot(int slot) override {
    sizes[slot].clear();
    in_->reset_slot(slot);
  }
  std::map<int, std::vector<int64_t>> sizes;
};

// A prompt goes in pieces of kAloneChunks prefill chunks while no other sequence decodes, in
// prefill_chunk pieces while one does; either way each request gets what it gets alone.
TEST(Batcher, PromptsGoInChunksOnlyBesideDecoding) {
  const test::TinyModel tiny;
  GenerateRequest first = test::mixed_requests(tiny.tok, 1, 5)[0], second = first;
  first.prompt = tiny.tok.encode("the model routes every token, then every token routes the model; once more: the model routes every token");
  first.max_new_tokens = 30;
  second.prompt = tiny.tok.encode("a longer prompt than the others, with commas");
  second.max_new_tokens = 4;
  const int64_t alone = 2 * Batcher::kAloneChunks, n1 = static_cast<int64_t>(first.prompt.size());
  ASSERT_GT(n1, alone);
  ASSERT_LE(n1, 2 * alone);
  ASSERT_GT(second.prompt.size(), 4u);
  RunnerOptions o = cpu_options();
  o.batch = 2;
  FeedLog log(make_runner(*tiny.model, o));
  std::vector<GenerateResult> got(2);
  Batcher b(log, tiny.vocab, tiny.tok, 2);
  b.add(first, &got[0]);
  b.step();  // alone: pieces of kAloneChunks chunks at most, one a step
  b.step();
  ASSERT_EQ(log.sizes[0].size(), 2u);
  EXPECT_EQ(log.sizes[0][0], alone);
  EXPECT_EQ(log.sizes[0][1], n1 - alone);
  b.add(second, &got[1]);
  while (!b.idle()) b.step();
  const std::vector<int64_t>& pieces = log.sizes[1];  // beside the first's decoding: 2 tokens a step, then tokens
  const int64_t n = static_cast<int64_t>(second.prompt.size());
  ASSERT_GE(pieces.size(), static_cast<size_t>((n + 1) / 2));
  for (int64_t i = 0; i < (n + 1) / 2; ++i) EXPECT_EQ(pieces[i], std::min<int64_t>(2, n - 2 * i)) << "piece " << i;
  EXPECT_EQ(got[0].tokens, generate(*make_runner(*tiny.model, cpu_options()), tiny.vocab, tiny.tok, first).tokens);
  EXPECT_EQ(got[1].tokens, generate(*make_runner(*tiny.model, cpu_options()), tiny.vocab, tiny.tok, second).tokens);
}

}  // namespace
}  // namespace tandem
