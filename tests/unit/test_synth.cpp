// `tandem synth`: the folders it writes load and run, are byte-identical for any thread count, match
// the spec's config.json key by key, and route with the intended popularity skew. Plus the pieces:
// the streaming safetensors writer, the value generators, f32 -> f16.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/dtype.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/runner.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/format/safetensors.h"
#include "runtime/format/safetensors_stream.h"
#include "runtime/format/config.h"
#include "tools/synth/synth.h"
#include "tests/unit/candidate_runner.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

synth::Options options(const std::string& dir, int threads = 2) {
  synth::Options o;
  o.out_dir = dir;
  o.threads = threads;
  o.seed = 7;
  o.report_samples = 1024;
  return o;
}

// Recursive key-by-key comparison; every difference is reported with its JSON path.
void expect_json_equal(const json& got, const json& want, const std::string& path = "") {
  if (want.is_object() && got.is_object()) {
    for (auto it = want.begin(); it != want.end(); ++it) {
      if (!got.contains(it.key())) ADD_FAILURE() << path << "/" << it.key() << ": missing";
      else expect_json_equal(got[it.key()], it.value(), path + "/" + it.key());
    }
    for (auto it = got.begin(); it != got.end(); ++it)
      if (!want.contains(it.key())) ADD_FAILURE() << path << "/" << it.key() << ": not in the spec (" << it.value() << ")";
    return;
  }
  EXPECT_EQ(got, want) << path;
}

struct RunStats {
  std::vector<float> logits;  // [T, V]
  std::vector<double> layer_rms;
  std::vector<int32_t> greedy;
};

RunStats run_model(const std::string& dir, int greedy_steps) {
  auto m = Qwen35Moe::load(dir);
  const int64_t V = m->config().vocab_size;
  const std::vector<int32_t> ids = {11, 250, 1000, 7, 42, 1500, 3, 99};
  RunStats r;
  r.logits.resize(ids.size() * V);
  auto st = m->new_state();
  m->forward(st, ids, r.logits.data(), [&](const char* name, int, const float* d, int64_t rows, int64_t cols) {
    if (std::string(name) != "layer_out") return;
    double s = 0;
    for (int64_t i = 0; i < rows * cols; ++i) s += double(d[i]) * d[i];
    r.layer_rms.push_back(std::sqrt(s / double(rows * cols)));
  });
  std::vector<float> l(r.logits.end() - V, r.logits.end());
  for (int t = 0; t < greedy_steps; ++t) {
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    r.greedy.push_back(next);
    m->forward(st, std::span<const int32_t>(&next, 1), l.data());
  }
  return r;
}

double row_std(const float* x, int64_t n) {
  double mu = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) mu += x[i];
  mu /= n;
  for (int64_t i = 0; i < n; ++i) s += (x[i] - mu) * (x[i] - mu);
  return std::sqrt(s / n);
}

TEST(SynthFill, F32ToF16RoundsToNearestEven) {
  // Every finite half is exact; midpoints go to the even neighbour, anything off the midpoint to the
  // nearer one (including across the subnormal/normal boundary and into infinity).
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float a = f16_to_f32(static_cast<uint16_t>(h));
    const float b = h == 0x7bff ? 65536.0f : f16_to_f32(static_cast<uint16_t>(h + 1));  // past the max: inf
    ASSERT_EQ(f32_to_f16(a), h);
    ASSERT_EQ(f32_to_f16(-a), h | 0x8000u);
    const float mid = 0.5f * (a + b);  // exact: halves have 11-bit significands
    ASSERT_EQ(f32_to_f16(mid), (h & 1) ? h + 1 : h) << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 1e9f)), h + 1) << h;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
}

TEST(SynthFill, ValuesAreAPureFunctionOfSeedNameAndIndex) {
  synth::PlannedTensor t{{"w", DType::BF16, {3, 500000}}, {}};  // 3 MB: several chunks
  t.fill.b = 0.5f;
  const std::vector<float> all = synth::generate_as_f32(t, 1);
  double mu = 0, sq = 0;
  for (float v : all) {
    mu += v;
    sq += double(v) * v;
  }
  mu /= all.size();
  EXPECT_NEAR(mu, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / all.size()), 0.5, 0.005);
  for (uint64_t first : {0ull, 1ull, 777777ull}) {  // any range alone equals the same range of the whole
    for (uint64_t count : {1ull, 2ull, 1001ull}) {
      std::vector<std::byte> part(count * 2);
      synth::fill_range(t, 1, first * 2, (first + count) * 2, part.data());
      const auto* bf = reinterpret_cast<const uint16_t*>(part.data());
      for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(bf16_to_f32(bf[i]), all[first + i]) << first << "+" << i;
    }
  }
  EXPECT_NE(synth::generate_as_f32(t, 2), all);
  t.spec.name = "v";
  EXPECT_NE(synth::generate_as_f32(t, 1), all);

  synth::PlannedTensor q{{"q", DType::I32, {64, 512}}, {}};
  q.fill.kind = synth::Fill::Int4Codes;
  std::vector<std::byte> raw(q.spec.nbytes());
  synth::fill_range(q, 1, 0, raw.size(), raw.data());
  double cm = 0, cs = 0;
  int lo = 16, hi = -1;
  const auto* w = reinterpret_cast<const uint32_t*>(raw.data());
  for (int64_t i = 0; i < 64 * 512; ++i)
    for (int j = 0; j < 8; ++j) {
      const int c = static_cast<int>((w[i] >> (4 * j)) & 15);
      cm += c - 8;
      cs += (c - 8) * (c - 8);
      lo = std::min(lo, c);
      hi = std::max(hi, c);
    }
  const double n = 64.0 * 512 * 8;
  EXPECT_NEAR(cm / n, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(cs / n), std::sqrt(10.5), 0.02);
  EXPECT_EQ(lo, 1);
  EXPECT_EQ(hi, 15);
}

TEST(SynthStreamWriter, ShardsIndexAndAlignment) {
  test::TempDir dir;
  std::vector<TensorSpec> specs = {{"a", DType::BF16, {3, 5}}, {"b", DType::F32, {7}}, {"c", DType::I32, {100}},
                                   {"d", DType::BF16, {1}},    {"e", DType::F16, {300}}, {"f", DType::BF16, {10}}};
  // 30 + 28 + 400 + 2 bytes fit in 500; e (600) is larger than the limit and gets a shard of its own.
  SafetensorsStreamWriter w(dir.str(), specs, 500);
  ASSERT_EQ(w.shards().size(), 3u);
  EXPECT_EQ(w.shards()[0].tensors, (std::vector<size_t>{1, 2, 0, 3}));  // 4-byte types first, then by name
  w.open();
  std::mt19937 rng(1);
  std::vector<std::string> data;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string bytes(specs[i].nbytes(), '\0');
    for (char& ch : bytes) ch = static_cast<char>(rng());
    w.write(w.location(i).shard, w.location(i).file_offset, bytes.data(), bytes.size());
    data.push_back(bytes);
  }
  w.finish();
  EXPECT_TRUE(fs::exists(dir.file("model.safetensors.index.json")));
  EXPECT_TRUE(fs::exists(dir.file("model-00001-of-00003.safetensors")));
  const Checkpoint ck = Checkpoint::open(dir.str());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorRef& t = ck.get(specs[i].name, specs[i].shape, {specs[i].dtype});
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data), t.info->nbytes), data[i]) << specs[i].name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(specs[i].dtype), 0u) << specs[i].name;
  }
  const json idx = json::parse(read_bytes(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(idx["metadata"]["total_size"], w.tensor_bytes());
}

TEST(SynthStreamWriter, UnfinishedWriterLeavesNoModel) {
  test::TempDir dir;
  {
    SafetensorsStreamWriter w(dir.str(), {{"a", DType::BF16, {4}}}, 1 << 20);
    w.open();
    EXPECT_TRUE(fs::exists(dir.file("model.safetensors.partial")));
  }
  EXPECT_TRUE(fs::is_empty(dir.str()));
}

TEST(Synth, TinyLoadsRunsAndGeneratesVariedTokens) {
  test::TempDir dir;
  const synth::Result r = synth::synthesize(synth::find_preset("tiny"), options(dir.str()));
  EXPECT_TRUE(r.weights_written);
  EXPECT_EQ(r.config.vocab_size, static_cast<int64_t>(r.bpe_tokens) + 26);
  EXPECT_LT(r.tensor_bytes, 20'000'000u);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "model.safetensors", "synth_report.json"})
    EXPECT_TRUE(fs::exists(dir.file(f))) << f;

  const RunStats s = run_model(dir.str(), 32);
  const int64_t V = r.config.vocab_size;
  for (float v : s.logits) ASSERT_TRUE(std::isfinite(v));
  for (int64_t t = 0; t < 8; ++t) {
    const double sd = row_std(s.logits.data() + t * V, V);
    EXPECT_GT(sd, 1.5) << "position " << t;
    EXPECT_LT(sd, 6.0) << "position " << t;
  }
  for (double rms : s.layer_rms) {
    EXPECT_GT(rms, 0.5);
    EXPECT_LT(rms, 4.0);
  }
  const std::set<int32_t> distinct(s.greedy.begin(), s.greedy.end());
  EXPECT_GE(distinct.size(), 12u) << "greedy decoding is stuck on a few tokens";
  for (int32_t id : s.greedy) EXPECT_LT(id, V);
}

// generate() with a runner that hands back only the sampler's k best penalised logits (as the GPU
// runner does; simulated here on the host with the plain definition) draws exactly the tokens it
// draws from whole rows.
TEST(Synth, GenerateDrawsTheSameFromCandidatesAsFromTheRow) {
  test::TempDir dir;
  synth::synthesize(synth::find_preset("tiny"), options(dir.str()));
  auto model = Qwen35Moe::load(dir.str());
  const Tokenizer tok = Tokenizer::from_model_dir(dir.str());
  const int64_t V = model->config().vocab_size;
  RunnerOptions ro;
  ro.device = Device::Ref;
  for (const char* preset : {"instruct", "thinking"}) {
    GenerateRequest req;
    req.prompt = tok.encode("the model routes every token");
    req.max_new_tokens = 24;
    req.sampling = sampling_preset(preset);
    req.sampling.seeded = true;
    req.sampling.seed = 5;
    auto plain = make_runner(*model, ro);
    test::CandidateRunner top(make_runner(*model, ro), V);
    const GenerateResult a = generate(*plain, V, tok, req), b = generate(top, V, tok, req);
    EXPECT_EQ(a.tokens, b.tokens) << preset;
    EXPECT_EQ(top.calls, static_cast<int>(b.tokens.size())) << preset;  // the prompt + every step but the last
    EXPECT_GE(a.tokens.size(), 2u);
  }
}

TEST(Synth, SameBytesForAnyThreadCount) {
  test::TempDir one, two;
  synth::Options a = options(one.str(), 1), b = options(two.str(), 2);
  a.work_unit_bytes = (1 << 20) + 4096;  // unit edges fall at different places inside tensors
  b.work_unit_bytes = 12 * 4096;
  a.report_samples = b.report_samples = 0;
  synth::synthesize(synth::find_preset("tiny"), a);
  synth::synthesize(synth::find_preset("tiny"), b);
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(read_bytes(one.file(f)) == read_bytes(two.file(f))) << f << " differs between 1 and 2 threads";

  test::TempDir other;
  synth::Options c = options(other.str());
  c.seed = 8;
  c.report_samples = 0;
  synth::synthesize(synth::find_preset("tiny"), c);
  EXPECT_FALSE(read_bytes(one.file("model.safetensors")) == read_bytes(other.file("model.safetensors")));
}

TEST(Synth, GptqTinyLoadsWithOfficialPacking) {
  test::TempDir dir;
  synth::Options o = options(dir.str());
  o.quant = synth::Quant::GptqInt4;
  synth::synthesize(synth::find_preset("tiny"), o);
  auto m = Qwen35Moe::load(dir.str());
  EXPECT_NE(m->layout_description().find("GPTQ-Int4 (v1 zeros, sym, group 128)"), std::string::npos) << m->layout_description();
  const Checkpoint& ck = m->checkpoint();
  const std::string e = "model.language_model.layers.2.mlp.experts.5.";
  EXPECT_EQ(static_cast<uint32_t>(ck.get(e + "gate_proj.qzeros", {1, 16}, {DType::I32}).as<int32_t>()[0]), 0x77777777u);
  ck.get(e + "down_proj.qweight", {16, 128}, {DType::I32});
  ck.get(e + "down_proj.scales", {1, 128}, {DType::F16});
  const int32_t* g = ck.get(e + "up_proj.g_idx", {128}, {DType::I32}).as<int32_t>();
  EXPECT_EQ(g[127], 0);
  // Dequantised (spec §4, v1: zero = stored 7 + 1) the weights have the BF16 layout's std, 1/sqrt(in).
  const int32_t* qw = ck.get(e + "gate_proj.qweight", {16, 128}, {DType::I32}).as<int32_t>();
  const auto* sc = ck.get(e + "gate_proj.scales", {1, 128}, {DType::F16}).as<uint16_t>();
  double sq = 0;
  for (int k = 0; k < 128; ++k)
    for (int n = 0; n < 128; ++n) {
      const int q = static_cast<int>((static_cast<uint32_t>(qw[(k / 8) * 128 + n]) >> (4 * (k % 8))) & 15);
      const double w = f16_to_f32(sc[n]) * (q - 8);
      sq += w * w;
    }
  EXPECT_NEAR(std::sqrt(sq / (128 * 128)), 1 / std::sqrt(128.0), 0.1 / std::sqrt(128.0));
  EXPECT_FALSE(ck.contains("model.language_model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(ck.get("model.language_model.layers.0.linear_attn.A_log").dtype(), DType::F32);
  EXPECT_EQ(ck.get("model.language_model.layers.0.mlp.shared_expert.up_proj.weight").dtype(), DType::BF16);

  const RunStats s = run_model(dir.str(), 0);
  const int64_t V = m->config().vocab_size;
  for (int64_t t = 0; t < 8; ++t) {
    const double sd = row_std(s.logits.data() + t * V, V);
    EXPECT_GT(sd, 1.5);
    EXPECT_LT(sd, 6.0);
  }
}

TEST(Synth, ShardedFolderMatchesSingleFile) {
  test::TempDir single, sharded;
  synth::Options a = options(single.str()), b = options(sharded.str());
  a.report_samples = b.report_samples = 0;
  b.max_shard_bytes = 2'000'000;
  synth::synthesize(synth::find_preset("tiny"), a);
  const synth::Result r = synth::synthesize(synth::find_preset("tiny"), b);
  EXPECT_GE(r.shards.size(), 4u);
  EXPECT_TRUE(fs::exists(sharded.file("model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(sharded.file("model.safetensors")));
  const Checkpoint x = Checkpoint::open(single.str()), y = Checkpoint::open(sharded.str());
  ASSERT_EQ(x.names(), y.names());
  for (const auto& n : x.names()) {
    const TensorRef &p = x.get(n), &q = y.get(n);
    ASSERT_EQ(p.info->nbytes, q.info->nbytes);
    EXPECT_EQ(std::memcmp(p.data, q.data, p.info->nbytes), 0) << n;
  }
  EXPECT_EQ(run_model(single.str(), 0).logits, run_model(sharded.str(), 0).logits);
}

TEST(Synth, ConfigOnly35BEqualsTheSpec) {
  const json spec = json::parse(read_bytes(std::string(TANDEM_TEST_DATA) + "/spec_config_qwen3.5-35b-a3b.json"));
  for (synth::Quant q : {synth::Quant::BF16, synth::Quant::GptqInt4}) {
    test::TempDir dir;
    synth::Options o = options(dir.str());
    o.config_only = true;
    o.quant = q;
    const synth::Result r = synth::synthesize(synth::find_preset("qwen3.5-35b-a3b"), o);
    EXPECT_FALSE(r.weights_written);
    EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
    json want = spec;
    if (q == synth::Quant::GptqInt4)  // spec §4
      want["quantization_config"] = json::parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true,
          "desc_act": false, "checkpoint_format": "gptq", "dynamic": {"lm_head": {}, "model.language_model.embed_tokens": {},
          "-:.*attn.*": {}, "-:.*shared_expert.*": {}, "-:.*mtp.*": {}, "-:.*visual.*": {}}})");
    const std::string text = read_bytes(dir.file("config.json"));
    SCOPED_TRACE(std::string(synth::quant_name(q)));
    expect_json_equal(json::parse(text), want);
    // ... and the loader accepts the folder's config.
    const ModelConfig cfg = load_model_config(dir.str());
    EXPECT_EQ(cfg.num_layers, 40);
    EXPECT_EQ(cfg.num_full_attention_layers(), 10);
    EXPECT_EQ(cfg.vocab_size, 248320);
    EXPECT_EQ(cfg.quant.gptq, q == synth::Quant::GptqInt4);
    // The official `dynamic` order matters (first match wins): keep it as written.
    if (q == synth::Quant::GptqInt4) {
      EXPECT_LT(text.find("\"lm_head\""), text.find("\"-:.*visual.*\""));
    }

    const json gen = json::parse(read_bytes(dir.file("generation_config.json")));
    expect_json_equal(gen, json::parse(R"({"bos_token_id": 248044, "pad_token_id": 248044, "eos_token_id": [248046, 248044],
        "do_sample": true, "top_k": 20, "top_p": 0.95, "temperature": 1.0})"));
    const json tc = json::parse(read_bytes(dir.file("tokenizer_config.json")));
    EXPECT_EQ(tc["eos_token"], "<|im_end|>");
    EXPECT_EQ(tc["added_tokens_decoder"]["248068"]["content"], "<think>");
    const json tok = json::parse(read_bytes(dir.file("tokenizer.json")));
    EXPECT_EQ(tok["model"]["vocab"].size(), 248044u);
    EXPECT_EQ(tok["added_tokens"][2]["content"], "<|im_end|>");
    EXPECT_EQ(tok["added_tokens"][2]["id"], 248046);
  }
}

TEST(Synth, DryRunPlans35BWithoutWriting) {
  test::TempDir dir;
  synth::Options o = options(dir.str() + "/never");
  o.dry_run = true;
  o.quant = synth::Quant::GptqInt4;
  o.routing_skew = 0;  // no calibration needed for a plan
  const synth::Result r = synth::synthesize(synth::find_preset("qwen3.5-35b-a3b"), o);
  EXPECT_FALSE(fs::exists(dir.str() + "/never"));
  // Spec §6: 16.92 GB of int4 experts + 4.90 GB of BF16 (text decoder, no vision), plus the MTP head in
  // BF16 as both releases keep it: 0.845 B parameters, 1.69 GB (fc, 3 norms, one attention layer of 8
  // tensors and its fused MoE of 7).
  EXPECT_NEAR(r.tensor_bytes / 1e9, 21.82 + 1.69, 0.02);
  EXPECT_EQ(r.num_tensors, 40u * 256 * 3 * 4 + 40 * 7 + 30 * 9 + 10 * 6 + 3 + 19);
  EXPECT_EQ(r.shards.size(), 6u);
  for (const auto& s : r.shards) EXPECT_LE(s.bytes, 4'000'000'000u + (1u << 24));
  o.quant = synth::Quant::BF16;
  EXPECT_NEAR(synth::synthesize(synth::find_preset("qwen3.5-35b-a3b"), o).tensor_bytes / 1e9, 69.32 + 1.69, 0.02);
}

TEST(Synth, RefusesToOverwriteAModel) {
  test::TempDir dir;
  synth::Options o = options(dir.str());
  o.config_only = true;
  synth::synthesize(synth::find_preset("tiny"), o);
  test::expect_error([&] { synth::synthesize(synth::find_preset("tiny"), o); }, {dir.str(), "--force"});
  test::write_text(dir.file("model-00009-of-00009.safetensors"), "stale");
  o.force = true;
  synth::synthesize(synth::find_preset("tiny"), o);
  EXPECT_FALSE(fs::exists(dir.file("model-00009-of-00009.safetensors")));
}

TEST(Synth, RoutingSkewInTheTargetBand) {
  // Tiny: measured from the written file; it equals the in-memory measurement of the same routers.
  test::TempDir dir;
  const synth::Options o = options(dir.str());
  const synth::Result r = synth::synthesize(synth::find_preset("tiny"), o);
  EXPECT_GE(r.routing.mean.top20, 0.25);
  EXPECT_LE(r.routing.mean.top20, 0.30);
  EXPECT_GT(r.routing.mean.top10, 0.11);
  EXPECT_GT(r.routing.mean.top50, 0.55);
  const synth::RoutingReport mem = synth::routing_report_in_memory(synth::find_preset("tiny"), o);
  EXPECT_EQ(mem.mean.top20, r.routing.mean.top20);
  const json rep = json::parse(read_bytes(dir.file("synth_report.json")));
  EXPECT_DOUBLE_EQ(rep["routing"]["mean"]["top20"].get<double>(), r.routing.mean.top20);
  EXPECT_EQ(rep["routing"]["layers"].size(), 4u);

  // Small's shapes (64 experts, top-8), routers generated in memory.
  synth::Options s = options("");
  const synth::RoutingReport skewed = synth::routing_report_in_memory(synth::find_preset("small"), s);
  EXPECT_GE(skewed.mean.top20, 0.25);
  EXPECT_LE(skewed.mean.top20, 0.30);
  s.routing_skew = 0;
  const synth::RoutingReport uniform = synth::routing_report_in_memory(synth::find_preset("small"), s);
  EXPECT_GE(uniform.mean.top20, 0.195);
  EXPECT_LE(uniform.mean.top20, 0.235);
  s.routing_skew = 2;
  s.report_samples = 256;
  EXPECT_GT(synth::routing_report_in_memory(synth::find_preset("small"), s).mean.top20, 0.33);
}

TEST(Synth, SkewCalibrationHitsTheTarget) {
  for (auto [E, k] : {std::pair{16, 4}, std::pair{64, 8}, std::pair{256, 8}}) {
    const double c = synth::skew_log_spread(E, k);
    EXPECT_GT(c, 0.05) << E;
    EXPECT_LT(c, 2.0) << E;
    const std::vector<float> s = synth::router_row_scales(E, c, 3, 0);
    double sq = 0;
    for (float v : s) sq += double(v) * v;
    EXPECT_NEAR(sq / E, 1.0, 1e-5);
    EXPECT_NE(s, synth::router_row_scales(E, c, 3, 1));  // each layer has its own popular experts
  }
  EXPECT_EQ(synth::router_row_scales(8, 0.0, 3, 0), std::vector<float>(8, 1.0f));
  const synth::RoutingShares u = synth::shares_from_counts(std::vector<double>(10, 5.0));
  EXPECT_DOUBLE_EQ(u.top20, 0.2);
  const synth::RoutingShares h = synth::shares_from_counts({10, 0, 0, 0, 0});  // top 10% = half an expert
  EXPECT_DOUBLE_EQ(h.top10, 0.5);
}

}  // namespace
}  // namespace tandem
