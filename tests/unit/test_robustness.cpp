// Hostile input (issue 29): integers past 32 bits, files that are not files, writes that fail half
// way, and error messages that must stay one printable line whatever the input held.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>

#include "runtime/format/config.h"
#include "core/error.h"
#include "core/file_io.h"
#include "runtime/format/safetensors_stream.h"
#include "runtime/engine/sampling.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_error;

json config_json() {
  return json::parse(R"({"model_type": "qwen3_5_moe_text", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "eos_token_id": 999})");
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "config.json"); }

// Writes past `bytes` fail with EFBIG (SIGXFSZ ignored) while this object lives: a full disk in a test.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit r = saved_;
    r.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_;
};

// ---- point 3: range checks before narrowing

TEST(Robustness, ConfigIntegersPast32BitsAreErrorsNotTheirLowBits) {
  for (const char* key : {"num_experts", "num_hidden_layers", "num_attention_heads", "head_dim", "linear_key_head_dim"}) {
    json j = config_json();
    j[key] = (int64_t{1} << 32) + 8;  // the low 32 bits are 8, a valid value
    expect_error([&] { parse(j); }, {"config.json", key, "4294967304 is out of range"});
  }
  json j = config_json();
  j["hidden_size"] = int64_t{1000000000000};
  expect_error([&] { parse(j); }, {"hidden_size", "1000000000000 is out of range"});
  j = config_json();
  j["vocab_size"] = int64_t{1} << 40;  // token ids are int32
  expect_error([&] { parse(j); }, {"vocab_size", "out of range"});
  j = config_json();
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", (int64_t{1} << 32) + 4}};
  expect_error([&] { parse(j); }, {"quantization_config.bits", "out of range"});
  j = config_json();
  j["bos_token_id"] = UINT64_MAX;  // would read as -1
  expect_error([&] { parse(j); }, {"bos_token_id", "out of range"});
}

TEST(Robustness, GenerationConfigIntegersAreRangeChecked) {
  test::TempDir d;
  test::write_text(d.file("generation_config.json"), R"({"top_k": 4294967316})");
  expect_error([&] { load_generation_config(d.str()); }, {"generation_config.json", "top_k", "4294967316 is out of range"});
  test::write_text(d.file("generation_config.json"), R"({"eos_token_id": [4294967301]})");
  expect_error([&] { load_generation_config(d.str()); }, {"eos_token_id", "4294967301 is out of range"});
  test::write_text(d.file("generation_config.json"), R"({"top_k": 20, "eos_token_id": [7, 8]})");
  const GenerationDefaults g = load_generation_config(d.str());
  EXPECT_EQ(g.sampling.top_k, 20);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{7, 8}));
}

TEST(Robustness, NarrowNamesTheValueAndTheRange) {
  EXPECT_EQ(narrow<int>(int64_t{7}, "x"), 7);
  expect_error([] { narrow<int>(int64_t{1} << 32, "--top-k"); }, {"--top-k: 4294967296 is out of range (-2147483648..2147483647)"});
  expect_error([] { narrow<int>(int64_t{5000}, "--threads", 1, 4096); }, {"--threads: 5000 is out of range (1..4096)"});
  expect_error([] { narrow<int32_t>(UINT64_MAX, "id", 0); }, {"18446744073709551615 is out of range"});
}

// ---- point 6: bounded reads of regular files only

TEST(Robustness, ReadTextFileRefusesWhatIsNotARegularFile) {
  test::TempDir d;
  test::write_text(d.file("ok.json"), "{}");
  EXPECT_EQ(read_text_file(d.file("ok.json"), 10, "the config"), "{}");
  expect_error([&] { read_text_file(d.file("ok.json"), 1, "the config"); }, {"ok.json", "the config is 2 bytes, more than the 1-byte limit"});
  expect_error([&] { read_text_file(d.str(), 100, "the config"); }, {"cannot read the config", "a directory"});
  expect_error([&] { read_text_file("/dev/zero", 100, "the config"); }, {"/dev/zero", "a character device"});
  expect_error([&] { read_text_file(d.file("none"), 100, "the config"); }, {"none", "cannot open the config", "No such file"});
  fs::create_symlink("loop2", d.file("loop1"));
  fs::create_symlink("loop1", d.file("loop2"));
  expect_error([&] { read_text_file(d.file("loop1"), 100, "the config"); }, {"loop1", "symlink loop"});
  // A FIFO with no writer must be refused at once, not block the open.
  ASSERT_EQ(mkfifo(d.file("fifo").c_str(), 0600), 0);
  auto done = std::async(std::launch::async, [&] {
    expect_error([&] { read_text_file(d.file("fifo"), 100, "the tokenizer file"); }, {"fifo", "a FIFO"});
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "reading a FIFO hangs";
}

TEST(Robustness, LoadersUseTheBoundedReader) {
  test::TempDir d;
  fs::create_symlink("/dev/zero", d.file("config.json"));
  expect_error([&] { load_model_config(d.str()); }, {"config.json", "a character device"});
  fs::create_symlink("/dev/zero", d.file("tokenizer.json"));
  expect_error([&] { Tokenizer::from_model_dir(d.str()); }, {"tokenizer.json", "a character device"});
  fs::create_directory(d.file("generation_config.json"));  // an unreadable one is not "invalid JSON"
  expect_error([&] { load_generation_config(d.str()); }, {"generation_config.json", "a directory"});
}

// ---- point 7: nothing half-written under a final name

TEST(Robustness, AtomicWriteLeavesNothingWhenTheDiskIsFull) {
  test::TempDir d;
  write_file_atomic(d.file("a.json"), "{\"x\": 1}\n");
  EXPECT_EQ(read_text_file(d.file("a.json"), 100, "a"), "{\"x\": 1}\n");
  {
    const FileSizeLimit limit(1000);
    expect_error([&] { write_file_atomic(d.file("big.json"), std::string(5000, 'x')); }, {"big.json", "write failed"});
    expect_error([&] { write_file_atomic(d.file("a.json"), std::string(5000, 'y')); }, {"a.json", "write failed"});
  }
  EXPECT_FALSE(fs::exists(d.file("big.json")));
  EXPECT_EQ(read_text_file(d.file("a.json"), 100, "a"), "{\"x\": 1}\n");  // the old contents survive
  for (const auto& e : fs::directory_iterator(d.str())) EXPECT_EQ(e.path().filename(), "a.json") << "left behind";
  expect_error([] { write_file_atomic("/dev/null", "x"); }, {"/dev/null", "not a regular file"});
}

TEST(Robustness, StreamWriterLeavesNoShardsWithoutTheirIndex) {
  test::TempDir d;
  std::vector<TensorSpec> specs;  // many small shards whose index is larger than any of them
  for (int i = 0; i < 60; ++i) specs.push_back({"model.language_model.layers." + std::to_string(i) + ".a_rather_long_tensor_name.weight", DType::BF16, {4}});
  {
    SafetensorsStreamWriter w(d.str(), specs, 1);
    ASSERT_EQ(w.shards().size(), 60u);
    w.open();
    const FileSizeLimit limit(2048);
    expect_error([&] { w.finish(); }, {"model.safetensors.index.json", "write failed"});
  }
  for (const auto& e : fs::directory_iterator(d.str())) ADD_FAILURE() << "left behind: " << e.path().filename();
}

// ---- point 8: messages stay one printable line

TEST(Robustness, ErrorMessagesAreEscapedAndCut) {
  EXPECT_EQ(printable("a\nb\x01\xff\xc3"), "a\\nb\\x01\\xff\\xc3");
  EXPECT_EQ(printable("Grüße 你好 🙂"), "Grüße 你好 🙂");  // valid UTF-8 stays
  EXPECT_EQ(printable("\xc2\x85"), "\\xc2\\x85");         // a C1 control (NEL) does not
  EXPECT_EQ(quote("abc"), "'abc'");
  const std::string huge(10 << 20, 'v');
  const std::string q = quote(huge);
  EXPECT_LT(q.size(), 200u);
  EXPECT_NE(q.find("bytes cut"), std::string::npos);
  try {
    fail("file.yaml:3: key 'gpu.memory': ", huge, " is not a size\n");
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_LT(m.size(), 2000u);
    EXPECT_EQ(m.rfind("file.yaml:3: key 'gpu.memory': ", 0), 0u) << m;
    EXPECT_NE(m.find(" is not a size\\n"), std::string::npos) << m;  // the end survives the cut
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  json j = config_json();
  j["model_type"] = std::string(100000, 'q');
  try {
    parse(j);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();
  }
}

}  // namespace
}  // namespace tandem
