// Sampling filters proven on known distributions: exact checks of the filtered distribution, then
// chi-square goodness of fit of 200k draws against it (significance 1e-6: a correct sampler fails
// about once in a million runs; a wrong filter fails every time).
#include <cmath>
#include <map>
#include <random>

#include "core/error.h"
#include "runtime/engine/sampling.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

// Chi-square critical values at significance 1e-6 for df = 1..8.
double chi2_critical(int df) {
  static const double v[] = {0, 23.93, 27.63, 30.66, 33.38, 35.89, 38.26, 40.52, 42.70};
  return v[df];
}

// Draws n samples and checks them against `want` (id -> probability; ids not listed must never appear).
void expect_samples_follow(const SamplingParams& p, const std::vector<float>& logits, const std::map<int, double>& want,
                           std::span<const int32_t> ctx = {}, std::span<const int32_t> gen = {}) {
  SamplingParams q = p;
  q.seeded = true;
  q.seed = test::test_seed();
  Sampler s(q);
  const int n = 200000;
  std::map<int, int> count;
  for (int i = 0; i < n; ++i) ++count[s.sample(logits, ctx, gen)];
  double chi2 = 0;
  for (const auto& [id, c] : count) ASSERT_TRUE(want.count(id)) << "sampled filtered-out id " << id;
  for (const auto& [id, prob] : want) {
    const double e = prob * n, o = count.count(id) ? count[id] : 0;
    chi2 += (o - e) * (o - e) / e;
  }
  const int df = static_cast<int>(want.size()) - 1;
  if (df > 0) EXPECT_LT(chi2, chi2_critical(df)) << "seed " << q.seed;
}

std::map<int, double> normalised(std::map<int, double> m) {
  double s = 0;
  for (auto& [k, v] : m) s += v;
  for (auto& [k, v] : m) v /= s;
  return m;
}

const std::vector<double> kP = {0.05, 0.4, 0.1, 0.25, 0.15, 0.05};

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(logits_of(kP), {}, {}), 1);
  std::vector<float> tie = {0.1f, 2.0f, 2.0f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(tie, {}, {}), 1);
}

TEST(Sampling, PlainSamplingFollowsSoftmax) {
  std::map<int, double> want;
  for (int i = 0; i < 6; ++i) want[i] = kP[i];
  expect_samples_follow(SamplingParams{}, logits_of(kP), want);
}

TEST(Sampling, TemperatureSharpens) {
  SamplingParams p;
  p.temperature = 0.5f;  // p^(1/T) = p^2, renormalised
  std::map<int, double> want;
  for (int i = 0; i < 6; ++i) want[i] = kP[i] * kP[i];
  expect_samples_follow(p, logits_of(kP), normalised(want));
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  SamplingParams p;
  p.top_k = 3;
  expect_samples_follow(p, logits_of(kP), normalised({{1, 0.4}, {3, 0.25}, {4, 0.15}}));
}

TEST(Sampling, TopPKeepsTheSmallestPrefixReachingP) {
  SamplingParams p;
  p.top_p = 0.75f;  // 0.4 + 0.25 = 0.65 < 0.75; + 0.15 = 0.8 reaches it
  expect_samples_follow(p, logits_of(kP), normalised({{1, 0.4}, {3, 0.25}, {4, 0.15}}));
  p.top_p = 0.3f;  // the first token alone
  SamplingParams q = p;
  Sampler s(q);
  EXPECT_EQ(s.distribution(logits_of(kP), {}, {}).size(), 1u);
}

TEST(Sampling, MinPDropsTokensBelowAFractionOfTheBest) {
  SamplingParams p;
  p.min_p = 0.4f;  // floor 0.16: keeps 0.4 and 0.25
  expect_samples_follow(p, logits_of(kP), normalised({{1, 0.4}, {3, 0.25}}));
}

TEST(Sampling, FiltersCompose) {
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 4;     // ids 1, 3, 4, 2 with p^2 weights .16 .0625 .0225 .01 -> normalised .627 .245 .088 .039
  p.top_p = 0.9f;  // cumulative .627 .873 .961: keeps ids 1, 3, 4
  p.min_p = 0.2f;  // floor 0.2 x .627 = .125: drops id 4
  const auto want = normalised({{1, 0.16}, {3, 0.0625}});
  Sampler s(p);
  const auto dist = s.distribution(logits_of(kP), {}, {});
  ASSERT_EQ(dist.size(), 2u);
  for (const auto& [id, prob] : dist) EXPECT_NEAR(prob, want.at(id), 1e-6);
  expect_samples_follow(p, logits_of(kP), want);
}

TEST(Sampling, PenaltiesFollowTheirDefinitions) {
  const std::vector<float> l = {2.0f, -1.0f, 0.5f, 1.0f};
  const std::vector<int32_t> prompt = {0, 1}, gen = {2, 2, 3};
  std::vector<int32_t> ctx = prompt;
  ctx.insert(ctx.end(), gen.begin(), gen.end());
  SamplingParams p;
  p.repetition_penalty = 2.0f;  // positive logits divided, negative multiplied, each seen id once
  p.presence_penalty = 0.5f;    // minus 0.5 for every id generated at least once
  p.frequency_penalty = 0.25f;  // minus 0.25 per occurrence in the output
  const std::vector<double> adj = {2.0 / 2, -1.0 * 2, 0.5 / 2 - 0.5 - 0.5, 1.0 / 2 - 0.5 - 0.25};
  double z = 0;
  for (double a : adj) z += std::exp(a);
  Sampler s(p);
  for (const auto& [id, prob] : s.distribution(l, ctx, gen)) EXPECT_NEAR(prob, std::exp(adj[id]) / z, 1e-6) << id;
  std::map<int, double> want;
  for (int i = 0; i < 4; ++i) want[i] = std::exp(adj[i]) / z;
  expect_samples_follow(p, l, want, ctx, gen);
}

// The one-pass selection against the plain definition (penalise a copy of the whole row, sort it by
// logit then id, cut to top-k): the same candidates in the same order, hence the same distribution, on
// random rows with ties and penalties; and sample_top() on the best candidates_needed() penalised
// logits draws exactly what sample() draws from the whole row (what a device-side top-k relies on).
TEST(Sampling, OnePassSelectionEqualsTheDefinition) {
  std::mt19937 rng(test::test_seed());
  const int V = 3001;
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> l(V);
    for (auto& x : l) x = static_cast<float>(static_cast<int>(std::normal_distribution<float>(0, 3)(rng) * 4)) / 4;  // many ties
    std::vector<int32_t> ctx(50), gen(20);
    for (auto& x : ctx) x = static_cast<int32_t>(rng() % V);
    for (auto& x : gen) x = static_cast<int32_t>(rng() % V);
    ctx.insert(ctx.end(), gen.begin(), gen.end());
    SamplingParams p;
    p.temperature = trial % 5 == 0 ? 0.0f : 0.7f;
    p.top_k = trial % 3 == 0 ? 0 : 1 + static_cast<int>(rng() % 60);
    p.top_p = trial % 2 ? 0.9f : 1.0f;
    p.min_p = trial % 4 == 1 ? 0.05f : 0.0f;
    p.repetition_penalty = trial % 3 == 1 ? 1.3f : 1.0f;
    p.presence_penalty = trial % 2 ? 1.5f : 0.0f;
    p.frequency_penalty = trial % 5 == 2 ? 0.25f : 0.0f;
    p.seeded = true;
    p.seed = 77 + trial;
    // The definition, spelled out.
    std::vector<float> pen = l;
    std::vector<int32_t> seen(ctx);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    if (p.repetition_penalty != 1.0f)
      for (int32_t id : seen) pen[id] = pen[id] > 0 ? pen[id] / p.repetition_penalty : pen[id] * p.repetition_penalty;
    std::map<int32_t, int> count;
    for (int32_t id : gen) ++count[id];
    for (const auto& [id, n] : count) pen[id] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(n);
    std::vector<int32_t> order(V);
    for (int i = 0; i < V; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pen[a] != pen[b] ? pen[a] > pen[b] : a < b; });
    Sampler s(p);
    const auto dist = s.distribution(l, ctx, gen);
    if (p.temperature == 0.0f) {
      ASSERT_EQ(dist.size(), 1u);
      EXPECT_EQ(dist[0].first, order[0]) << "trial " << trial;
    } else {
      const size_t k = p.top_k > 0 ? static_cast<size_t>(p.top_k) : static_cast<size_t>(V);
      for (size_t i = 0; i < dist.size(); ++i) ASSERT_EQ(dist[i].first, order[i]) << "trial " << trial << " rank " << i;
      EXPECT_LE(dist.size(), k);
    }
    const int need = s.candidates_needed();
    if (need == 0) continue;  // the whole row is needed: no device-side cut
    std::vector<std::pair<int32_t, float>> top;
    for (int i = 0; i < need; ++i) top.push_back({order[i], pen[order[i]]});
    Sampler whole(p), cut(p);
    for (int draw = 0; draw < 30; ++draw) ASSERT_EQ(whole.sample(l, ctx, gen), cut.sample_top(top)) << "trial " << trial << " draw " << draw;
  }
  SamplingParams p;
  p.top_k = 5;
  Sampler s(p);
  test::expect_error([&] { s.sample_top(std::vector<std::pair<int32_t, float>>(3)); }, {"3 candidates", "needs the best 5"});
}

TEST(Sampling, SeedReproduces) {
  SamplingParams p;
  p.seeded = true;
  p.seed = 1234;
  Sampler a(p), b(p);
  p.seed = 4321;
  Sampler c(p);
  const auto l = logits_of(kP);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(a.sample(l, {}, {}));
    sb.push_back(b.sample(l, {}, {}));
    sc.push_back(c.sample(l, {}, {}));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampling, PresetsAndValidation) {
  const auto t = sampling_preset("thinking");
  EXPECT_EQ(t.temperature, 1.0f);
  EXPECT_EQ(t.top_p, 0.95f);
  EXPECT_EQ(t.top_k, 20);
  EXPECT_EQ(t.presence_penalty, 1.5f);
  EXPECT_EQ(sampling_preset("thinking-coding").temperature, 0.6f);
  EXPECT_EQ(sampling_preset("instruct").top_p, 0.8f);
  EXPECT_EQ(sampling_preset("instruct-reasoning").top_k, 40);
  test::expect_error([] { sampling_preset("creative"); }, {"unknown sampling preset 'creative'"});
  SamplingParams bad;
  bad.top_p = 0;
  test::expect_error([&] { Sampler s(bad); }, {"top-p"});
}

TEST(Sampling, GenerationConfigDefaults) {
  test::TempDir dir;
  test::write_text(dir.file("generation_config.json"),
                   R"({"bos_token_id": 7, "eos_token_id": [5, 6], "do_sample": true, "top_k": 20, "top_p": 0.95, "temperature": 0.6})");
  const auto d = load_generation_config(dir.str());
  EXPECT_TRUE(d.found);
  EXPECT_EQ(d.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_EQ(d.eos_token_ids, (std::vector<int64_t>{5, 6}));
  test::write_text(dir.file("generation_config.json"), R"({"do_sample": false, "temperature": 0.7})");
  EXPECT_EQ(load_generation_config(dir.str()).sampling.temperature, 0.0f);
  test::write_text(dir.file("generation_config.json"), R"({"top_p": "high"})");
  test::expect_error([&] { load_generation_config(dir.str()); }, {"generation_config.json", "top_p"});
  EXPECT_FALSE(load_generation_config(dir.file("nowhere")).found);
}

// Speculative sampling: a draft drawn from q and put through verify_draft against p yields tokens
// distributed as p, whatever q is (overlapping, missing some of p's ids, or holding ids p lacks);
// and when p and q agree every draft is accepted.
TEST(Sampling, VerifiedDraftsFollowTheTargetDistribution) {
  const Sampler::Dist p = {{1, 0.4}, {3, 0.25}, {4, 0.15}, {2, 0.1}, {0, 0.05}, {5, 0.05}};
  const std::vector<Sampler::Dist> qs = {
      {{3, 0.5}, {1, 0.2}, {0, 0.2}, {5, 0.1}},           // overlaps, misses 2 and 4
      {{7, 0.6}, {1, 0.3}, {4, 0.1}},                     // holds an id p does not
      {{5, 0.9}, {2, 0.1}},                               // far from p
  };
  for (size_t c = 0; c < qs.size(); ++c) {
    SamplingParams sp;
    sp.seeded = true;
    sp.seed = test::test_seed() + c;
    Sampler s(sp);
    const int n = 200000;
    std::map<int, int> count;
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t d = s.draw_from(qs[c]);
      const auto [ok, id] = s.verify_draft(p, qs[c], d);
      accepted += ok;
      EXPECT_TRUE(!ok || id == d);
      ++count[id];
    }
    double chi2 = 0;
    for (const auto& [id, prob] : p) {
      const double e = prob * n, o = count[id];
      chi2 += (o - e) * (o - e) / e;
    }
    EXPECT_EQ(count.size(), p.size()) << "q " << c << ": a token outside p's support";
    EXPECT_LT(chi2, chi2_critical(5)) << "q " << c << ", seed " << sp.seed;
    double overlap = 0;  // the acceptance rate is sum min(p, q)
    for (const auto& [id, pv] : p)
      for (const auto& [jd, qv] : qs[c])
        if (id == jd) overlap += std::min(pv, qv);
    EXPECT_NEAR(static_cast<double>(accepted) / n, overlap, 0.01) << "q " << c;
  }
  Sampler s(SamplingParams{});
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(s.verify_draft(p, p, s.draw_from(p)).first);
  test::expect_error([&] { s.verify_draft(p, qs[2], 1); }, {"draft token 1", "no probability"});
}

}  // namespace
}  // namespace tandem
