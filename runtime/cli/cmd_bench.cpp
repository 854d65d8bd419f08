// tandem bench: end-to-end speed with warm-up, repeats, medians and spread, and the bandwidth bound.
//
// Per prompt length: a random prompt (seeded; or, with --prompts FILE, a window of that text's tokens)
// is prefilled in one call, then --gen tokens are decoded greedily one at a time (the next token picked
// as generate() picks it: on the device when the runner can, else by the host sampler). Random token ids
// route more evenly than text, so a placement made from a heat map shows its effect with --prompts. Reported: prefill tok/s, time to first token, decode tok/s, inter-token
// latency p50/p99, peak host memory; the bound is the active weight bytes per decode token over the
// read bandwidth measured here (CPU DRAM for the CPU paths).
//
// --batch 1,2,4,8: batched decode instead. For each batch size B, B sequences (random prompts of the
// first --prompt-len, each prefilled into its own slot) decode --gen tokens together, one step feeding
// every sequence its next token. Reported: aggregate tok/s, per-sequence inter-token latency p50 / p99,
// the ratio to B = 1, and the bound at that B: the dense weights once, the expected union of the
// routed experts B tokens pick (uniform routing: E (1 - (1 - k/E)^B) a layer), and each sequence's
// DeltaNet state (read and written) and KV rows, over the measured bandwidths (hybrid: the GPU's and
// the host's parts overlapped perfectly, the host's share of the experts as measured).
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "core/membw.h"
#include "gpu_core/attention_sizes.h"
#include "placement/gpu_layout.h"
#include "runtime/cli/device_flags.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/engine/runner.h"
#include "runtime/engine/sampling.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::cli {

namespace {

struct Stat {
  double median = 0, min = 0, max = 0;
};

Stat stat_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double pos = p * (v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  return i + 1 < v.size() ? v[i] + (pos - i) * (v[i + 1] - v[i]) : v.back();
}

std::vector<int64_t> parse_lengths(const std::string& s, const char* flag = "--prompt-len") {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw UsageError(str_cat("tandem bench: ", flag, ": '", item, "' is not a positive number"));
    }
  }
  if (out.empty()) throw UsageError("tandem bench: --prompt-len needs at least one length");
  return out;
}

// VmHWM: peak resident set since start or since the last clear_refs reset.
uint64_t peak_rss_bytes() {
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (!std::strncmp(line, "VmHWM:", 6)) {
        std::fclose(f);
        return std::strtoull(line + 6, nullptr, 10) * 1024;
      }
    std::fclose(f);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// Greedy next tokens as generate() picks them: the runner picks them where the logits are when it
// can (one id crosses a sequence), else the rows come back and the host sampler's one-pass argmax
// runs. A runner that declines once is not asked again.
class Greedy {
 public:
  using Seq = std::pair<int, std::span<const int32_t>>;  // a slot and the ids it is fed
  Greedy(Runner& runner, int64_t vocab) : runner_(runner), vocab_(vocab), sampler_(greedy_params()) {}
  // One step feeding every (slot, ids); next[slot] becomes that sequence's greedy next token.
  void step(std::span<const Seq> seqs, std::vector<int32_t>& next) {
    const size_t n = seqs.size();
    rows_.resize(n * static_cast<size_t>(vocab_));
    std::vector<Runner::Feed> feeds;
    for (size_t i = 0; i < n; ++i) feeds.push_back({seqs[i].first, seqs[i].second, rows_.data() + i * vocab_, Qwen35Moe::LogitRows::Last, false});
    run(feeds);
    for (size_t i = 0; i < n; ++i)
      next[seqs[i].first] = on_device_ ? tops_[i][0].first : sampler_.sample(std::span(rows_.data() + i * vocab_, vocab_), {}, {});
  }
  // Any feeds (a verification's All rows too), as the Batcher runs a greedy request's: every wanted
  // row's best id picked where the logits are, else the rows to the feeds' logits.
  void run(std::span<const Runner::Feed> feeds) {
    size_t wanted = 0;
    for (const Runner::Feed& f : feeds) wanted += f.rows == Qwen35Moe::LogitRows::All ? f.ids.size() : 1;
    tops_.resize(wanted);
    std::vector<Runner::TopWant> want;
    for (size_t i = 0; i < wanted; ++i) want.push_back({{}, 1, &tops_[i]});
    on_device_ = try_top_ && runner_.step_top(feeds, want);
    if (!on_device_) {
      try_top_ = false;
      runner_.step(feeds);
    }
  }
  bool on_device() const { return on_device_; }

 private:
  static SamplingParams greedy_params() {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
  }
  Runner& runner_;
  int64_t vocab_;
  Sampler sampler_;
  std::vector<float> rows_;
  std::vector<std::vector<std::pair<int32_t, float>>> tops_;
  bool try_top_ = true, on_device_ = false;
};

struct Run {
  double prefill_tok_s, ttft_ms, decode_tok_s;
  std::vector<double> itl_ms;
  bool on_device = false;  // the runner picked the next token where the logits are (forward_top)
  uint64_t streamed_layers = 0;  // hybrid: layers of CPU experts the prompt streamed to the GPU
  Runner::HostSplit split;       // hybrid: the host's side of the decode steps
  double decode_s = 0;
};

// `text`: the --prompts file's tokens (empty: random ids); run `seed` takes the window starting at
// seed * prompt_len, wrapping around. `follow`: each decode step is fed the text's next token instead
// of the one just picked (the same work; the routing follows the text, as a placement learnt online
// would see it in a long conversation).
Run run_once(Runner& runner, int64_t V, int64_t prompt_len, int64_t gen, uint64_t seed, const std::vector<int32_t>& text,
             bool follow = false) {
  using clock = std::chrono::steady_clock;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> prompt(prompt_len);
  size_t start = 0;
  if (text.empty()) {
    for (auto& t : prompt) t = id(rng);
  } else {
    start = static_cast<size_t>(seed * static_cast<uint64_t>(prompt_len) % text.size());
    for (int64_t i = 0; i < prompt_len; ++i) prompt[i] = text[(start + static_cast<size_t>(i)) % text.size()];
  }
  runner.reset();
  Greedy greedy(runner, V);
  std::vector<int32_t> picked(1);
  auto next_of = [&](std::span<const int32_t> ids) {
    const Greedy::Seq seq{0, ids};
    greedy.step(std::span(&seq, 1), picked);
    return picked[0];
  };
  const auto t0 = clock::now();
  int32_t next = next_of(prompt);
  const double ttft = std::chrono::duration<double>(clock::now() - t0).count();
  Run r{};
  r.prefill_tok_s = prompt_len / ttft;
  r.ttft_ms = ttft * 1e3;
  r.streamed_layers = runner.streamed_layers();
  const auto d0 = clock::now();
  for (int64_t i = 1; i < gen; ++i) {
    const auto s0 = clock::now();
    if (follow && !text.empty()) next = text[(start + static_cast<size_t>(prompt_len + i - 1)) % text.size()];
    next = next_of(std::span(&next, 1));
    r.itl_ms.push_back(std::chrono::duration<double>(clock::now() - s0).count() * 1e3);
  }
  const double dt = std::chrono::duration<double>(clock::now() - d0).count();
  r.decode_tok_s = gen > 1 ? (gen - 1) / dt : 0;
  r.decode_s = dt;
  r.split = runner.host_split();
  r.on_device = greedy.on_device();
  return r;
}

// With --draft: the same run through generate() (greedy, no eos), whose Batcher drafts with the MTP
// head and verifies; the inter-token latency is a verification step's time over the tokens it gave.
// The prompt as run_once takes it (random ids, or a window of the --prompts text).
Run run_drafted(Runner& runner, int64_t V, const Tokenizer& tok, int64_t prompt_len, int64_t gen, uint64_t seed, int draft,
                const std::vector<int32_t>& text, GenerateResult* out) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(V - 1));
  GenerateRequest q;
  q.prompt.resize(static_cast<size_t>(prompt_len));
  if (text.empty()) {
    for (auto& t : q.prompt) t = id(rng);
  } else {
    const size_t start = static_cast<size_t>(seed * static_cast<uint64_t>(prompt_len) % text.size());
    for (int64_t i = 0; i < prompt_len; ++i) q.prompt[i] = text[(start + static_cast<size_t>(i)) % text.size()];
  }
  q.max_new_tokens = gen;
  q.sampling.temperature = 0;
  q.draft = draft;
  *out = generate(runner, V, tok, q);
  Run r{};
  r.prefill_tok_s = out->prefill_tok_s();
  r.ttft_ms = out->prefill_s * 1e3;
  r.decode_tok_s = out->decode_tok_s();
  r.decode_s = out->decode_s;
  const size_t n = out->tokens.size() > 1 ? out->tokens.size() - 1 : 0;  // tokens come a step at a time: the mean gap
  r.itl_ms.assign(n, n ? out->decode_s / static_cast<double>(n) * 1e3 : 0);
  return r;
}

// --verify-cost: what speculative decoding pays. After a random prompt, each repeat times one decode
// step (one token) and, for each k, the runner's k drafts (where it drafts) and the step that verifies
// them (k + 1 tokens that keep their states), and the rollback to one token (what a step pays after a
// rejection); each step as the Batcher runs a greedy request's: every wanted row's best id picked where
// the logits are when the runner can (step_top), else the logits rows to the host. Medians in ms.
struct VerifyCost {
  double decode_ms = 0;
  std::vector<double> verify_ms, draft_ms, rollback_ms;  // per k; draft_ms -1 where the runner does not draft
  bool on_device = false;                                // the steps' ids picked on the runner's side
};

VerifyCost measure_verify(Runner& r, int64_t V, int64_t prompt_len, const std::vector<int>& ks, int64_t repeat, uint64_t seed) {
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count() * 1e3; };
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (auto& t : prompt) t = id(rng);
  const int kmax = *std::max_element(ks.begin(), ks.end());
  std::vector<float> rows(static_cast<size_t>(kmax + 1) * V);
  Greedy greedy(r, V);
  auto run = [&](const Runner::Feed& f) { greedy.run(std::span(&f, 1)); };
  r.reset();
  run({0, prompt, rows.data(), Qwen35Moe::LogitRows::Last, false});
  std::vector<double> dec;
  std::vector<std::vector<double>> ver(ks.size()), dra(ks.size()), rol(ks.size());
  for (int64_t rep = -1; rep < repeat; ++rep) {  // rep -1: warm-up (graphs, caches)
    int32_t tok = id(rng);
    auto t0 = clock::now();
    run({0, std::span(&tok, 1), rows.data(), Qwen35Moe::LogitRows::Last, false});
    if (rep >= 0) dec.push_back(ms_since(t0));
    for (size_t i = 0; i < ks.size(); ++i) {
      std::vector<int32_t> feed(static_cast<size_t>(ks[i]) + 1);
      for (auto& t : feed) t = id(rng);
      if (r.max_draft() >= ks[i]) {
        t0 = clock::now();
        r.draft(0, feed[0], std::span(feed).subspan(1), nullptr);
        if (rep >= 0) dra[i].push_back(ms_since(t0));
      }
      t0 = clock::now();
      run({0, feed, rows.data(), Qwen35Moe::LogitRows::All, true});
      if (rep >= 0) ver[i].push_back(ms_since(t0));
      t0 = clock::now();
      r.rollback(0, 1);
      if (rep >= 0) rol[i].push_back(ms_since(t0));
    }
  }
  VerifyCost c;
  c.on_device = greedy.on_device();
  c.decode_ms = percentile(dec, 0.5);
  for (size_t i = 0; i < ks.size(); ++i) {
    c.verify_ms.push_back(percentile(ver[i], 0.5));
    c.draft_ms.push_back(dra[i].empty() ? -1 : percentile(dra[i], 0.5));
    c.rollback_ms.push_back(percentile(rol[i], 0.5));
  }
  return c;
}

// Tokens a verification of k drafts gives when each draft is accepted with probability a given the
// earlier ones: 1 + a + ... + a^k.
double tokens_per_step(double a, int k) { return (1 - std::pow(a, k + 1)) / (1 - a); }

std::vector<int> parse_counts(const std::string& s, const char* flag, int64_t max, const char* what) {
  std::vector<int> out;
  for (int64_t b : parse_lengths(s, flag)) {
    if (b > max) throw UsageError(str_cat("tandem bench: ", flag, " ", b, " exceeds ", max, " ", what));
    out.push_back(static_cast<int>(b));
  }
  return out;
}

struct BatchRun {
  double tok_s = 0;             // all sequences' decode tokens over the decode time
  std::vector<double> step_ms;  // every step's time: each sequence's inter-token latency
};

// B sequences: random prompts of prompt_len (seeded per sequence), each prefilled into its slot; then
// gen - 1 steps that feed every sequence its greedy next token together.
BatchRun run_batch(Runner& runner, int64_t V, int B, int64_t prompt_len, int64_t gen, uint64_t seed) {
  using clock = std::chrono::steady_clock;
  std::vector<int32_t> next(B);
  Greedy greedy(runner, V);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> prompt(prompt_len);
  for (int b = 0; b < B; ++b) {
    runner.reset_slot(b);
    for (auto& t : prompt) t = id(rng);
    const Greedy::Seq seq{b, prompt};
    greedy.step(std::span(&seq, 1), next);
  }
  BatchRun r;
  std::vector<Greedy::Seq> seqs(B);
  const auto d0 = clock::now();
  for (int64_t i = 1; i < gen; ++i) {
    for (int b = 0; b < B; ++b) seqs[b] = {b, std::span(&next[b], 1)};
    const auto s0 = clock::now();
    greedy.step(seqs, next);
    r.step_ms.push_back(std::chrono::duration<double>(clock::now() - s0).count() * 1e3);
  }
  const double dt = std::chrono::duration<double>(clock::now() - d0).count();
  r.tok_s = gen > 1 ? B * (gen - 1) / dt : 0;
  return r;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::vector<Flag> flags = {{"model", true, "model folder"},
                             {"prompt-len", true, "comma-separated prompt lengths (default 512)"},
                             {"gen", true, "generated tokens per run (default 128)"},
                             {"repeat", true, "measured runs per prompt length after one warm-up (default 5)"},
                             {"seed", true, "seed of the random prompts (default 0)"},
                             {"prompts", true, "text file whose tokens make the prompts (windows of it, cycled) instead of random ids"},
                             {"follow-text", false, "with --prompts: feed each decode step the text's next token instead of the one picked"},
                             {"warmup", true, "prompt tokens of the warm-up run (default: each measured length)"},
                             {"batch", true, "comma-separated batch sizes: batched decode of that many sequences at once (the first --prompt-len each)"},
                             {"verify-cost", true, "comma-separated draft counts k: the cost of verifying k drafts (a step of k + 1 tokens) against a decode step, and the speed-up it implies"},
                             {"json", false, "print one JSON object instead of the table"}};
  for (auto& f : device_flags()) flags.push_back(f);
  flags.push_back({"help", false, "show this help"});
  Args a("bench", flags);
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  const auto lengths = parse_lengths(a.get("prompt-len", "512"));
  const int64_t gen = a.get_int("gen", 128), repeat = a.get_int("repeat", 5);
  if (gen < 1 || repeat < 1) throw UsageError("tandem bench: --gen and --repeat must be at least 1");
  const uint64_t seed = static_cast<uint64_t>(a.get_int("seed", 0));
  const int64_t warmup = a.get_int("warmup", 0);
  if (a.has("warmup") && warmup < 1) throw UsageError("tandem bench: --warmup must be at least 1 token");
  const bool json_out = a.has("json");

  int64_t longest = 0;
  for (int64_t L : lengths) longest = std::max(longest, L);
  const std::vector<int> batches = a.has("batch") ? parse_counts(a.get("batch"), "--batch", kMaxBatch, "sequences") : std::vector<int>{};
  const std::vector<int> verify_ks = a.has("verify-cost") ? parse_counts(a.get("verify-cost"), "--verify-cost", kMaxDraft, "drafts") : std::vector<int>{};
  const int verify_max = verify_ks.empty() ? 0 : *std::max_element(verify_ks.begin(), verify_ks.end());
  if (!verify_ks.empty() && !batches.empty()) throw UsageError("tandem bench: --verify-cost and --batch are separate runs");
  RunnerOptions ro = runner_options(a, longest + std::max<int64_t>(gen, (repeat + 1) * (1 + static_cast<int64_t>(verify_ks.size()))));
  if (verify_max > 0) ro.verify_tokens = verify_max + 1;
  for (int b : batches) ro.batch = std::max(ro.batch, b);  // the runner holds the largest batch's sequences
  Session session = Session::open(a.get("model"), false);
  const ModelConfig& cfg = session.model->config();
  std::vector<int32_t> text;
  const bool follow = a.has("follow-text");
  if (follow && !a.has("prompts")) throw UsageError("tandem bench: --follow-text needs --prompts FILE");
  if (a.has("prompts")) {
    const std::string path = a.get("prompts");
    const std::string body = read_text_file(path, kMaxPromptFileBytes, "the prompts file");
    text = Tokenizer::from_model_dir(a.get("model")).encode(body);
    if (text.empty()) fail("tandem bench: ", path, " has no text to make prompts from");
    check_token_ids(text, cfg.vocab_size, a.get("model"), "tandem bench --prompts");
  }
  const int draft = ro.draft;
  if (draft && !batches.empty()) throw UsageError("tandem bench: --draft measures one sequence; leave out --batch");
  if (draft && follow) throw UsageError("tandem bench: --draft decodes the tokens it picks; leave out --follow-text");
  if (draft && !session.tokenizer) fail("tandem bench --draft: ", a.get("model"), " has no tokenizer.json (the generation loop decodes text)");
  start_session(session, ro);
  Runner* runner = session.runner.get();
  const std::string device = device_name(session.options.device);  // as chosen (--device auto)
  for (int64_t L : lengths)
    if (L + gen > cfg.max_position_embeddings)
      fail("--prompt-len ", L, " + --gen ", gen, " exceeds the model's context of ", cfg.max_position_embeddings);
  WeightBytes wb = session.model->weight_bytes();
  if (const uint64_t dense = runner->dense_bytes_per_token())  // as the runner stores them (8-bit rows: fewer)
    wb.per_token_active = wb.routed_active + dense;
  if (!json_out) std::fprintf(stderr, "measuring memory bandwidth...\n");
  std::string bw_what;
  const double bw_bytes = runner->weight_bandwidth(&bw_what);
  // Hybrid: GPU bytes over GPU bandwidth and CPU expert bytes over CPU read bandwidth, overlapped
  // perfectly (the larger of the two); the CPU share is what the runs actually served there, so the
  // bound is final after the runs. Host and GPU paths: all bytes over the one bandwidth.
  const bool hybrid = device == "hybrid";
  const double cpu_bw = hybrid ? measure_read_bandwidth().bytes_per_s : 0;
  const double pcie_bw = runner->pcie_bandwidth();
  auto bound_for = [&](double gpu_share) {
    if (!hybrid) return bw_bytes / static_cast<double>(wb.per_token_active);
    const double cpu_bytes = (1 - gpu_share) * static_cast<double>(wb.routed_active);
    const double gpu_bytes = static_cast<double>(wb.per_token_active) - cpu_bytes;
    return 1.0 / std::max(gpu_bytes / bw_bytes, cpu_bytes / cpu_bw);
  };
  double bound = bound_for(runner->gpu_expert_share_planned());
  // The probe's buffer is freed; restart the peak-RSS mark so it reports the model runs alone.
  if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) std::fputs("5", f), std::fclose(f);

  if (!verify_ks.empty()) {
    const int64_t L = lengths[0];
    if (!json_out) std::fprintf(stderr, "verification steps: warm-up + %lld runs...\r", (long long)repeat);
    const VerifyCost c = measure_verify(*runner, cfg.vocab_size, L, verify_ks, repeat, seed);
    const double acc[] = {0.6, 0.8, 0.9};
    nlohmann::json rows = nlohmann::json::array();
    if (!json_out) {
      std::printf("tandem bench: %s\n%s\n", a.get("model").c_str(), runner->describe().c_str());
      std::printf("verification cost after a %lld-token prompt (medians of %lld; greedy ids picked %s): decode step %.3f ms (%.1f tok/s)\n",
                  (long long)L, (long long)repeat, c.on_device ? "on the device" : "from logits rows on the host", c.decode_ms, 1e3 / c.decode_ms);
      std::printf("%6s  %16s  %12s  %10s  %12s  %34s\n", "drafts", "verify step ms", "/decode", "draft ms", "rollback ms", "speed-up at acceptance 0.6 / 0.8 / 0.9");
    }
    for (size_t i = 0; i < verify_ks.size(); ++i) {
      const int k = verify_ks[i];
      const double step = c.verify_ms[i] + std::max(c.draft_ms[i], 0.0);
      nlohmann::json sp = nlohmann::json::object();
      double up[3];
      for (int j = 0; j < 3; ++j) {  // a rollback after every step that rejects a draft: 1 - a^k of them
        up[j] = tokens_per_step(acc[j], k) * c.decode_ms / (step + (1 - std::pow(acc[j], k)) * c.rollback_ms[i]);
        sp[str_cat(acc[j])] = up[j];
      }
      rows.push_back({{"drafts", k}, {"verify_ms", c.verify_ms[i]}, {"decode_ms", c.decode_ms}, {"verify_over_decode", c.verify_ms[i] / c.decode_ms},
                      {"draft_ms", c.draft_ms[i] < 0 ? nlohmann::json(nullptr) : nlohmann::json(c.draft_ms[i])}, {"rollback_ms", c.rollback_ms[i]},
                      {"speedup_at_acceptance", sp}});
      if (!json_out)
        std::printf("%6d  %16.3f  %11.2fx  %10s  %12.3f  %14.2fx / %5.2fx / %5.2fx\n", k, c.verify_ms[i], c.verify_ms[i] / c.decode_ms,
                    c.draft_ms[i] < 0 ? "n/a" : str_cat(static_cast<int>(c.draft_ms[i] * 1000 + 0.5) / 1000.0).c_str(), c.rollback_ms[i], up[0],
                    up[1], up[2]);
    }
    if (!json_out && std::any_of(c.draft_ms.begin(), c.draft_ms.end(), [](double d) { return d < 0; }))
      std::printf("(n/a: this runner does not draft (--draft); its speed-ups count the verification step alone)\n");
    if (json_out) {
      const nlohmann::json j = {{"model", a.get("model")}, {"device", device}, {"prompt_len", L}, {"repeat", repeat},
                                {"description", runner->describe()}, {"decode_ms", c.decode_ms}, {"ids_on_device", c.on_device}, {"verify", rows}};
      std::printf("%s\n", j.dump(2).c_str());
    }
    return 0;
  }

  if (!batches.empty()) {
    // Batched decode: the bound's bytes per step at batch B (see the file comment).
    const int64_t L = lengths[0], E = cfg.num_experts, k = cfg.num_experts_per_tok;
    int64_t moe_layers = 0, dn_layers = 0, attn_layers = 0;
    for (const auto& layer : session.model->layers()) {
      moe_layers += layer.moe.gate.empty() ? 0 : 1;
      (layer.kind == LayerKind::LinearAttention ? dn_layers : attn_layers) += 1;
    }
    const double act_bytes = moe_layers ? static_cast<double>(wb.routed_active) / static_cast<double>(k * moe_layers) : 0;
    const double dense = static_cast<double>(wb.per_token_active - wb.routed_active);
    // A cached position's K (or V) row of one layer, as the GPU's cache or the host's KvRows holds it.
    const RowFormat kv = parse_row_format(session.options.kv_format, "--kv-format");
    const double kv_row = static_cast<double>(hybrid || device == "gpu" ? gpu::kv_row_bytes(kv, cfg.num_kv_heads, cfg.head_dim)
                                                                       : KvRows::position_bytes(cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads, kv));
    const double per_seq = dn_layers * 2.0 * static_cast<double>(placement::ssm_state_bytes(cfg) + placement::conv_state_bytes(cfg)) +
                           attn_layers * (L + gen / 2.0) * 2.0 * kv_row;
    auto union_of = [&](int B) { return static_cast<double>(E) * (1.0 - std::pow(1.0 - static_cast<double>(k) / E, B)); };
    auto batch_bound = [&](int B) {
      const double experts = union_of(B) * moe_layers * act_bytes;
      if (!hybrid) return B / ((dense + experts + B * per_seq) / bw_bytes);
      const double cpu_bytes = (1 - runner->gpu_expert_share()) * experts;
      return B / std::max((dense + experts - cpu_bytes + B * per_seq) / bw_bytes, cpu_bytes / cpu_bw);
    };
    if (!json_out) {
      std::printf("tandem bench: %s\n%s\n", a.get("model").c_str(), runner->describe().c_str());
      std::printf("batched decode: prompts of %lld tokens, %lld tokens each; per step %.3f GB dense + %.1f MB per routed expert picked "
                  "(uniform routing) + %.1f MB state and KV per sequence; %s %.1f GB/s%s\n\n",
                  (long long)L, (long long)gen, dense / 1e9, act_bytes * moe_layers / 1e6, per_seq / 1e6, bw_what.c_str(), bw_bytes / 1e9,
                  hybrid ? str_cat(", CPU read ", static_cast<int>(cpu_bw / 1e9 + 0.5), " GB/s").c_str() : "");
      std::printf("%6s  %26s  %14s  %16s  %7s  %12s  %7s\n", "batch", "aggregate tok/s [min-max]", "per sequence", "ITL p50/p99 ms", "vs B=1",
                  "bound tok/s", "/bound");
    }
    nlohmann::json rows = nlohmann::json::array();
    double base = 0;
    for (int B : batches) {
      if (!json_out) std::fprintf(stderr, "batch %d: warm-up + %lld runs...\r", B, (long long)repeat);
      run_batch(*runner, cfg.vocab_size, B, std::min<int64_t>(L, warmup ? warmup : L), std::min<int64_t>(gen, 4), seed);
      std::vector<double> tok, itl;
      for (int64_t r = 0; r < repeat; ++r) {
        const BatchRun x = run_batch(*runner, cfg.vocab_size, B, L, gen, seed + 1 + r);
        tok.push_back(x.tok_s);
        itl.insert(itl.end(), x.step_ms.begin(), x.step_ms.end());
      }
      const Stat t = stat_of(tok);
      if (base == 0) base = B == 1 ? t.median : 0;
      const double p50 = itl.empty() ? 0 : percentile(itl, 0.5), p99 = itl.empty() ? 0 : percentile(itl, 0.99), bnd = batch_bound(B);
      rows.push_back({{"batch", B}, {"decode_tok_s", t.median}, {"decode_tok_s_min", t.min}, {"decode_tok_s_max", t.max},
                      {"per_sequence_tok_s", t.median / B}, {"itl_p50_ms", p50}, {"itl_p99_ms", p99}, {"vs_batch_1", base > 0 ? t.median / base : 0},
                      {"expected_union_experts_per_layer", union_of(B)}, {"bound_decode_tok_s", bnd}, {"decode_ratio_to_bound", t.median / bnd},
                      {"gpu_expert_fraction", runner->gpu_expert_share()}});
      char ratio[16] = "-";
      if (base > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", t.median / base);
      if (!json_out)
        std::printf("%6d  %10.1f [%6.1f-%6.1f]  %14.1f  %7.2f / %6.2f  %7s  %12.1f  %6.1f%%\n", B, t.median, t.min, t.max, t.median / B, p50, p99,
                    ratio, bnd, 100 * t.median / bnd);
    }
    if (json_out) {
      const nlohmann::json j = {{"model", a.get("model")}, {"device", device}, {"prompt_len", L}, {"gen", gen}, {"repeat", repeat},
                                {"description", runner->describe()}, {"bandwidth_bytes_per_s", bw_bytes}, {"bandwidth_kind", bw_what},
                                {"cpu_read_bytes_per_s", cpu_bw}, {"dense_bytes_per_step", dense}, {"expert_bytes_per_activation", act_bytes},
                                {"state_and_kv_bytes_per_sequence", per_seq}, {"peak_vram_bytes", runner->peak_device_bytes()},
                                {"batches", rows}};
      std::printf("%s\n", j.dump(2).c_str());
    }
    return 0;
  }

  nlohmann::json results = nlohmann::json::array();
  std::string split_lines;  // hybrid: the host side of decode, one line per prompt length
  int64_t moe_layers = 0;
  for (const auto& layer : session.model->layers()) moe_layers += layer.moe.gate.empty() ? 0 : 1;
  bool token_on_device = false;
  if (!json_out) {
    std::printf("tandem bench: %s\n%s\n", a.get("model").c_str(), runner->describe().c_str());
    std::printf("weights: %.2f GB non-expert + %.2f GB routed experts; %.3f GB read per decode token\n",
                wb.non_expert / 1e9, wb.routed_experts / 1e9, wb.per_token_active / 1e9);
    std::printf("%s: %.1f GB/s -> decode bound %.2f tok/s\n\n", bw_what.c_str(), bw_bytes / 1e9, bound);
    std::printf("%8s  %22s  %18s  %22s  %18s  %8s\n", "prompt", "prefill tok/s [min-max]", "TTFT ms", "decode tok/s [min-max]",
                "ITL p50/p99 ms", "/bound");
  }
  for (int64_t L : lengths) {
    if (!json_out) std::fprintf(stderr, "prompt %lld: warm-up + %lld runs...\r", (long long)L, (long long)repeat);
    run_once(*runner, cfg.vocab_size, warmup ? std::min(warmup, L) : L, std::min<int64_t>(gen, 4), seed, text);  // warm-up: page in weights
    std::vector<double> pf, ttft, dec, itl;
    uint64_t streamed = 0;
    Run last{};
    DraftStats drafts;  // --draft: the verification statistics over the runs
    for (int64_t r = 0; r < repeat; ++r) {
      GenerateResult g;
      Run x = draft ? run_drafted(*runner, cfg.vocab_size, *session.tokenizer, L, gen, seed + 1 + r, draft, text, &g)
                    : run_once(*runner, cfg.vocab_size, L, gen, seed + 1 + r, text, follow);
      drafts.add(g.drafts);
      last = x;
      token_on_device = x.on_device;
      streamed = x.streamed_layers;
      pf.push_back(x.prefill_tok_s);
      ttft.push_back(x.ttft_ms);
      dec.push_back(x.decode_tok_s);
      itl.insert(itl.end(), x.itl_ms.begin(), x.itl_ms.end());
    }
    const Stat p = stat_of(pf), t = stat_of(ttft), d = gen > 1 ? stat_of(dec) : Stat{};
    bound = bound_for(runner->gpu_expert_share());
    const double p50 = itl.empty() ? 0 : percentile(itl, 0.5), p99 = itl.empty() ? 0 : percentile(itl, 0.99);
    results.push_back({{"prompt_len", L},
                       {"prefill_tok_s", p.median},
                       {"prefill_tok_s_min", p.min},
                       {"prefill_tok_s_max", p.max},
                       {"ttft_ms", t.median},
                       {"ttft_ms_min", t.min},
                       {"ttft_ms_max", t.max},
                       {"decode_tok_s", d.median},
                       {"decode_tok_s_min", d.min},
                       {"decode_tok_s_max", d.max},
                       {"prefill_streamed_layers", streamed},
                       {"itl_p50_ms", p50},
                       {"itl_p99_ms", p99},
                       {"gpu_expert_fraction", runner->gpu_expert_share()},
                       {"bound_decode_tok_s", bound},
                       {"decode_ratio_to_bound", d.median / bound}});
    if (draft) {
      results.back()["speculative"] = {{"draft", draft}, {"verify_steps", drafts.verify_steps}, {"tokens_per_step", drafts.tokens_per_step()},
                                       {"drafted", drafts.drafted}, {"accepted", drafts.accepted}, {"acceptance_by_position", drafts.acceptance()}};
      if (!json_out) split_lines += str_cat("\n  prompt ", L, ": ", drafts.summary());
    }
    // Hybrid: where the last run's decode steps went on the host's side, a token's worth.
    const Runner::HostSplit& hs = last.split;
    const double steps = static_cast<double>(std::max<int64_t>(gen - 1, 1));
    const double act_bytes = moe_layers ? static_cast<double>(wb.routed_active) / (cfg.num_experts_per_tok * moe_layers) : 0;
    if (hs.layers) {
      const double host_gbs = hs.run_s > 0 ? hs.host_activations * act_bytes / hs.run_s / 1e9 : 0;
      const double wait_ms = hs.wait_s / steps * 1e3, run_ms = hs.run_s / steps * 1e3,
                   other_ms = (last.decode_s - hs.wait_s - hs.run_s) / steps * 1e3;
      results.back()["host_split"] = {{"wait_for_gpu_ms_per_token", wait_ms},
                                      {"host_experts_ms_per_token", run_ms},
                                      {"other_ms_per_token", other_ms},
                                      {"host_layers_per_token", hs.layers / steps},
                                      {"host_expert_read_bytes_per_s", host_gbs * 1e9}};
      if (!json_out) {
        char line[320];
        std::snprintf(line, sizeof line,
                      "\n  prompt %lld: %.2f ms waiting for the GPU's router results (%.1f µs a layer), %.2f ms running host experts "
                      "(%.1f µs a layer, %.1f GB/s of expert weights), %.2f ms other",
                      (long long)L, wait_ms, hs.wait_s / hs.layers * 1e6, run_ms, hs.run_s / hs.layers * 1e6, host_gbs, other_ms);
        split_lines += line;
      }
    }
    if (!json_out)
      std::printf("%8lld  %9.1f [%5.1f-%5.1f]  %18.1f  %9.2f [%5.2f-%5.2f]  %8.2f / %7.2f  %7.1f%%%s\n", (long long)L, p.median,
                  p.min, p.max, t.median, d.median, d.min, d.max, p50, p99, 100 * d.median / bound,
                  streamed ? str_cat("  (prefill streamed ", streamed, " layers of CPU experts)").c_str() : "");
  }
  const uint64_t peak_host = peak_rss_bytes();
  if (json_out) {
    const auto& first = results[0];
    nlohmann::json j = {{"model", a.get("model")},
                        {"device", device},
                        {"threads", omp_get_max_threads()},
                        {"gen", gen},
                        {"repeat", repeat},
                        {"warmup_tokens", warmup},
                        {"prompts", a.has("prompts") ? a.get("prompts") : std::string("random token ids")},
                        {"decode_tokens", follow ? "the text's next tokens (--follow-text)" : "the tokens picked (greedy)"},
                        {"next_token", token_on_device ? "argmax on the device (one id crosses)" : "argmax on the host (the logits row crosses)"},
                        {"draft", draft == kDraftAuto ? nlohmann::json("auto") : nlohmann::json(draft)},
                        {"draft_auto", runner->draft_tuner() ? nlohmann::json(runner->draft_tuner()->summary()) : nlohmann::json(nullptr)},
                        {"prefill_tok_s", first["prefill_tok_s"]},
                        {"decode_tok_s", first["decode_tok_s"]},
                        {"ttft_ms", first["ttft_ms"]},
                        {"peak_vram_bytes", runner->peak_device_bytes()},
                        {"peak_host_bytes", peak_host},
                        {"gpu_expert_fraction", first["gpu_expert_fraction"]},
                        {"bandwidth_bytes_per_s", bw_bytes},
                        {"bandwidth_kind", bw_what},
                        {"cpu_read_bytes_per_s", cpu_bw},
                        {"pcie_h2d_bytes_per_s", pcie_bw},
                        {"description", runner->describe()},
                        {"eager", ro.eager},
                        {"active_bytes_per_token", wb.per_token_active},
                        {"routed_active_bytes_per_token", wb.routed_active},
                        {"bound_decode_tok_s", first["bound_decode_tok_s"]},
                        {"results", results}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("\npeak host memory %.2f GB (mapped weights count when touched); GPU memory %.2f GB; routed activations served on the GPU: %.1f%%\n",
                peak_host / 1e9, runner->peak_device_bytes() / 1e9, 100 * runner->gpu_expert_share());
    if (hybrid) std::printf("CPU read bandwidth %.1f GB/s; PCIe host-to-device %.1f GB/s\n", cpu_bw / 1e9, pcie_bw / 1e9);
    if (!split_lines.empty())
      std::printf("%s:%s\n", draft ? "speculative decoding (all runs)" : "a decode token on the host's side (last run)", split_lines.c_str());
    if (const DraftTuner* t = runner->draft_tuner()) std::printf("drafts %s\n", t->summary().c_str());
  }
  return 0;
}

}  // namespace tandem::cli
