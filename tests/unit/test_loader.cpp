// Loader checks on damaged copies of the fixtures: each problem gives one clear error naming the
// tensor (and file), never a crash; and format detection that must not change the numbers.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/format/npy.h"
#include "runtime/format/safetensors_writer.h"
#include "tests/unit/batch_cases.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using test::expect_error;

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

struct ModelCopy {
  json config;
  std::vector<Tensor> tensors;

  Tensor& at(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("test bug: no tensor " + name);
  }
  void drop(const std::string& name) {
    std::erase_if(tensors, [&](const Tensor& t) { return t.name == name; });
  }
  void write(const std::string& dir) const {
    std::ofstream(dir + "/config.json") << config.dump(2);
    SafetensorsWriter w;
    for (const auto& t : tensors) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    w.write(dir + "/model.safetensors");
  }
};

ModelCopy copy_fixture(const std::string& name) {
  const std::string dir = std::string(TANDEM_TEST_DATA) + "/" + name;
  ModelCopy m;
  std::ifstream in(dir + "/config.json");
  m.config = json::parse(in);
  const Checkpoint c = Checkpoint::open(dir);
  for (const auto& n : c.names()) {
    const TensorRef& t = c.get(n);
    m.tensors.push_back({n, t.dtype(), t.shape(), std::string(reinterpret_cast<const char*>(t.data), t.info->nbytes)});
  }
  return m;
}

constexpr const char* kL0 = "model.language_model.layers.0.";

TEST(Loader, MissingTensor) {
  test::TempDir dir;
  auto m = copy_fixture("bf16_fused");
  m.drop(std::string(kL0) + "linear_attn.A_log");
  m.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {"linear_attn.A_log'", "missing", dir.str()});
}

TEST(Loader, WrongShapeAndDtype) {
  test::TempDir dir;
  auto m = copy_fixture("bf16_fused");
  Tensor& z = m.at(std::string(kL0) + "linear_attn.in_proj_z.weight");
  std::swap(z.shape[0], z.shape[1]);
  m.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {"model.safetensors", "in_proj_z.weight'", "expected ["});

  auto m2 = copy_fixture("bf16_fused");
  m2.at(std::string(kL0) + "linear_attn.in_proj_z.weight").dtype = DType::I16;
  m2.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {"in_proj_z.weight'", "dtype I16", "BF16 or F16 or F32"});
}

TEST(Loader, GptqPackedForOtherBits) {
  test::TempDir dir;
  auto m = copy_fixture("gptq_sym_v1");
  Tensor& q = m.at(std::string(kL0) + "mlp.experts.0.gate_proj.qweight");
  q.shape[0] *= 2;  // 8-bit packing holds 4 values per int32
  q.bytes += q.bytes;
  m.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {"experts.0.gate_proj.qweight'", "has shape", "expected"});
}

TEST(Loader, GptqGroupIndexOutOfRange) {
  test::TempDir dir;
  auto m = copy_fixture("gptq_asym_actorder");
  Tensor& g = m.at(std::string(kL0) + "mlp.experts.1.down_proj.g_idx");
  reinterpret_cast<int32_t*>(g.bytes.data())[5] = 999;
  m.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {"experts.1.down_proj.g_idx'[5] = 999", "outside"});
}

TEST(Loader, DynamicRulesMustAgreeWithTheTensors) {
  test::TempDir dir;
  auto m = copy_fixture("gptq_sym_v1");
  m.config["quantization_config"]["dynamic"]["-:.*experts.*"] = json::object();
  m.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {"GPTQ-quantized in the checkpoint", "dynamic rules", "excludes"});

  auto m2 = copy_fixture("gptq_sym_v1");
  m2.config["quantization_config"]["dynamic"] = json::object();  // now attention would be quantized too
  m2.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {".weight'", "quantization_config says it is GPTQ-quantized"});
}

TEST(Loader, UnsupportedBits) {
  test::TempDir dir;
  auto m = copy_fixture("gptq_sym_v1");
  m.config["quantization_config"]["bits"] = 3;
  m.write(dir.str());
  expect_error([&] { Qwen35Moe::load(dir.str()); }, {"config.json", "quantization_config.bits", "unsupported bits"});
}

// A symmetric checkpoint without checkpoint_format tells v1 from v2 by its stored zeros: re-store every
// zero as 8 (v2) and the logits must not change.
TEST(Loader, ZeroFormatDetectedFromData) {
  test::TempDir dir;
  auto m = copy_fixture("gptq_sym_v1");
  int rewritten = 0;
  for (auto& t : m.tensors)
    if (t.name.ends_with(".qzeros")) {
      for (size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
        ASSERT_EQ(*reinterpret_cast<uint32_t*>(t.bytes.data() + i), 0x77777777u);
        *reinterpret_cast<uint32_t*>(t.bytes.data() + i) = 0x88888888u;
      }
      ++rewritten;
    }
  ASSERT_GT(rewritten, 0);
  m.write(dir.str());
  const auto f = test::load_fixture("gptq_sym_v1");
  auto a = Qwen35Moe::load(f.dir), b = Qwen35Moe::load(dir.str());
  EXPECT_NE(b->layout_description().find("v2 zeros"), std::string::npos) << b->layout_description();
  const int64_t V = f.vocab, n = 6;
  std::vector<float> la(n * V), lb(n * V);
  auto sa = a->new_state(), sb = b->new_state();
  a->forward(sa, std::span(f.ids.data(), n), la.data());
  b->forward(sb, std::span(f.ids.data(), n), lb.data());
  EXPECT_EQ(la, lb);
}

TEST(Loader, IgnoresVisionAndMtpTensors) {
  const Checkpoint c = Checkpoint::open(std::string(TANDEM_TEST_DATA) + "/bf16_fused");
  bool visual = false, mtp = false;
  for (const auto& n : c.names()) {
    visual = visual || n.starts_with("model.visual.");
    mtp = mtp || n.starts_with("mtp.");
  }
  EXPECT_TRUE(visual && mtp) << "the fixture should carry tensors the loader must skip";
  std::unique_ptr<Qwen35Moe> m;
  EXPECT_NO_THROW(m = Qwen35Moe::load(c.dir()));
  EXPECT_EQ(m->mtp(), nullptr) << "a few of the head's tensors are not a head";
}

// The MTP head as `tandem synth` writes it (the releases' layout: mtp.fc, its norms and one attention
// layer with fused BF16 experts) loads whole, with the shapes the spec gives; a config without
// mtp_num_hidden_layers loads none.
TEST(Loader, LoadsTheMtpHead) {
  const test::TinyModel tiny;
  const std::unique_ptr<Qwen35Moe>& m = tiny.model;
  const MtpWeights* h = m->mtp();
  ASSERT_NE(h, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(h->fc.out, c.hidden_size);
  EXPECT_EQ(h->fc.in, 2 * c.hidden_size);
  EXPECT_EQ(h->norm.size(), static_cast<size_t>(c.hidden_size));
  EXPECT_EQ(h->layer.kind, LayerKind::FullAttention);
  EXPECT_EQ(h->layer.moe.gate.size(), static_cast<size_t>(c.num_experts));
  EXPECT_EQ(h->layer.attn.q_proj.out, int64_t(c.num_heads) * c.head_dim * 2);
  EXPECT_EQ(Qwen35Moe::load(std::string(TANDEM_TEST_DATA) + "/bf16_fused")->mtp(), nullptr);  // a few mtp.* tensors only
  EXPECT_NE(Qwen35Moe::load(std::string(TANDEM_TEST_DATA) + "/gptq_sym_v1")->mtp(), nullptr);
}

TEST(Loader, TokenIdOutsideVocabulary) {
  auto m = Qwen35Moe::load(std::string(TANDEM_TEST_DATA) + "/bf16_text_only");
  auto st = m->new_state();
  std::vector<int32_t> ids = {1, static_cast<int32_t>(m->config().vocab_size)};
  std::vector<float> out(2 * m->config().vocab_size);
  expect_error([&] { m->forward(st, ids, out.data()); }, {"token id", "outside the vocabulary"});
}

}  // namespace
}  // namespace tandem
