#include <cstring>

#include "core/error.h"
#include "runtime/format/safetensors.h"
#include "runtime/format/safetensors_writer.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using test::expect_error;
using test::TempDir;

SafetensorsWriter small_writer() {
  SafetensorsWriter w;
  std::vector<uint16_t> a(6);
  for (int i = 0; i < 6; ++i) a[i] = f32_to_bf16(float(i) - 2.5f);
  std::vector<int32_t> b = {1, -2, 3};
  w.add("a.weight", DType::BF16, {2, 3}, a.data(), a.size() * 2);
  w.add("b", DType::I32, {3}, b.data(), b.size() * 4);
  w.add_metadata("format", "pt");
  return w;
}

// A file with a hand-written header: 8-byte length, JSON, then `data` bytes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  const uint64_t len = header.size();
  std::string s(reinterpret_cast<const char*>(&len), 8);
  return s + header + std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripIsZeroCopyAndExact) {
  TempDir dir;
  small_writer().write(dir.file("model.safetensors"));
  Checkpoint c = Checkpoint::open(dir.str());
  EXPECT_EQ(c.names().size(), 2u);  // __metadata__ is not a tensor
  const TensorRef& a = c.get("a.weight", {2, 3}, {DType::BF16});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(load_as_f32(a.data, a.dtype(), i), float(i) - 2.5f);
  const TensorRef& b = c.get("b");
  EXPECT_EQ(b.as<int32_t>()[1], -2);
  EXPECT_EQ(c.total_bytes(), 12u + 12u);
}

TEST(Safetensors, TruncatedFileNamesTheFileAndTensor) {
  TempDir dir;
  std::string bytes = small_writer().serialize();
  bytes.resize(bytes.size() - 5);
  test::write_text(dir.file("model.safetensors"), bytes);
  expect_error([&] { Checkpoint::open(dir.str()); }, {"model.safetensors", "'b'", "truncated"});
}

TEST(Safetensors, HeaderLengthPastEndOfFile) {
  TempDir dir;
  std::string bytes = small_writer().serialize();
  bytes.resize(40);
  test::write_text(dir.file("model.safetensors"), bytes);
  expect_error([&] { Checkpoint::open(dir.str()); }, {"model.safetensors", "header length", "past the end"});
}

TEST(Safetensors, TinyFile) {
  TempDir dir;
  test::write_text(dir.file("model.safetensors"), "abc");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"model.safetensors", "too short"});
}

TEST(Safetensors, MalformedHeaders) {
  const std::string f = "x.safetensors";
  expect_error([&] { parse_safetensors_header("{not json", 0, f); }, {f, "not valid JSON"});
  expect_error([&] { parse_safetensors_header("[1,2]", 0, f); }, {f, "not a JSON object"});
  expect_error([&] { parse_safetensors_header(R"({"t":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1, f); },
               {"'t'", "unknown dtype 'Q4'"});
  expect_error([&] { parse_safetensors_header(R"({"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24, f); },
               {"'t'", "[2, 3]", "needs 24 bytes", "span 20"});
  expect_error([&] { parse_safetensors_header(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, f); },
               {"'t'", "non-negative"});
  expect_error([&] { parse_safetensors_header(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8, f); },
               {"'t'", "begin 8 > end 4"});
  expect_error([&] { parse_safetensors_header(R"({"t":{"dtype":"F32","shape":[1]}})", 8, f); }, {"'t'", "data_offsets"});
  expect_error([&] { parse_safetensors_header(R"({"t":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}})", 4, f); },
               {"'t'", "too large"});
  expect_error(
      [&] {
        parse_safetensors_header(
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12, f);
      },
      {"'a'", "'b'", "overlap"});
  expect_error([&] { parse_safetensors_header(std::string(100, '[') + std::string(100, ']'), 0, f); }, {"deeper"});
}

TEST(Safetensors, ZeroSizedTensorsAreFine) {
  auto t = parse_safetensors_header(R"({"e":{"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]}})", 0, "f");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].numel(), 0);
}

TEST(Safetensors, MissingTensorAndWrongShapeOrDtype) {
  TempDir dir;
  small_writer().write(dir.file("model.safetensors"));
  Checkpoint c = Checkpoint::open(dir.str());
  expect_error([&] { c.get("nope.weight"); }, {"'nope.weight'", "missing", dir.str()});
  expect_error([&] { c.get("a.weight", {3, 2}, {DType::BF16}); }, {"'a.weight'", "[2, 3]", "expected [3, 2]"});
  expect_error([&] { c.get("a.weight", {2, 3}, {DType::F32, DType::F16}); }, {"'a.weight'", "BF16", "F32 or F16"});
}

TEST(Safetensors, ShardedIndex) {
  TempDir dir;
  SafetensorsWriter w1, w2;
  float x[2] = {1, 2}, y[3] = {3, 4, 5};
  w1.add("x", DType::F32, {2}, x, 8);
  w2.add("y", DType::F32, {3}, y, 12);
  w1.write(dir.file("model-00001-of-00002.safetensors"));
  w2.write(dir.file("model-00002-of-00002.safetensors"));
  test::write_text(dir.file("model.safetensors.index.json"),
                   R"({"metadata":{"total_size":20},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
  Checkpoint c = Checkpoint::open(dir.str());
  EXPECT_EQ(c.num_files(), 2u);
  EXPECT_EQ(c.get("y").as<float>()[2], 5.0f);

  test::write_text(dir.file("model.safetensors.index.json"),
                   R"({"weight_map":{"x":"model-00001-of-00002.safetensors","z":"model-00003-of-00003.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"index.json", "model-00003-of-00003.safetensors", "does not exist"});

  test::write_text(dir.file("model.safetensors.index.json"),
                   R"({"weight_map":{"x":"model-00001-of-00002.safetensors","q":"model-00002-of-00002.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"'q'", "not present"});

  test::write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": 5})");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"index.json", "weight_map"});

  w2.write(dir.file("model-00001-of-00002.safetensors"));  // now both shards hold 'y'
  test::write_text(dir.file("model.safetensors.index.json"),
                   R"({"weight_map":{"y":"model-00002-of-00002.safetensors"}})");
  // Only the listed shard is opened, so this one is fine...
  EXPECT_NO_THROW(Checkpoint::open(dir.str()));
  test::write_text(dir.file("model.safetensors.index.json"),
                   R"({"weight_map":{"y":"model-00002-of-00002.safetensors","x":"model-00001-of-00002.safetensors"}})");
  // ...but two listed shards with the same tensor are an error.
  expect_error([&] { Checkpoint::open(dir.str()); }, {"'y'", "appears in both"});
}

TEST(Safetensors, FolderProblems) {
  TempDir dir;
  expect_error([&] { Checkpoint::open(dir.file("missing")); }, {"missing", "not a directory"});
  expect_error([&] { Checkpoint::open(dir.str()); }, {"no model.safetensors"});
  test::write_text(dir.file("model.safetensors"), raw_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  EXPECT_NO_THROW(Checkpoint::open(dir.str()));
}

}  // namespace
}  // namespace tandem
