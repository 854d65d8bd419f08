// Tokenizer against HF `tokenizers`: ids for every corpus snippet and every test tokenizer, decodes,
// streaming decode, special tokens, Unicode classes, and errors for malformed tokenizer.json.
// Fixtures: tools/make_tokenizer_fixtures.py (tests/data/tokenizers/).
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/unicode.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using nlohmann::json;

const std::string kDir = std::string(TANDEM_TEST_DATA) + "/tokenizers/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> corpus_snippets() {
  const std::string text = read_file(kDir + "corpus.txt");
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t pos; (pos = text.find('\x1e', start)) != std::string::npos; start = pos + 1) {
    out.push_back(text.substr(start, pos - start));
  }
  out.push_back(text.substr(start));
  return out;
}

std::string show(const std::vector<int32_t>& ids, size_t around, size_t n = 6) {
  std::string s;
  const size_t lo = around > n ? around - n : 0;
  for (size_t i = lo; i < std::min(ids.size(), around + n); ++i) s += (i == around ? "*" : "") + std::to_string(ids[i]) + " ";
  return s;
}

size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

bool valid_utf8(const std::string& s) { return tok::is_valid_utf8(s); }

const std::vector<std::string> kTokenizers = {"qwen35_v1000_lowspecial", "qwen35_v5000_highspecial",
                                              "qwen2_v2000_ignoremerges", "gpt2_v3000_prefixspace"};

class HfFixture : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { snippets_ = new std::vector<std::string>(corpus_snippets()); }
  static void TearDownTestSuite() {
    delete snippets_;
    snippets_ = nullptr;
  }
  void SetUp() override {
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_file(kDir + GetParam() + ".json"));
    expected_ = json::parse(read_file(kDir + GetParam() + ".expected.json"));
  }
  std::string expected_decode(size_t k, bool skip_special) const {
    const json& d = expected_[skip_special ? "decode_skip_special" : "decode"];
    const auto it = d.find(std::to_string(k));
    return it != d.end() ? it->get<std::string>() : expected_["decode_prefix"].get<std::string>() + (*snippets_)[k];
  }

  static std::vector<std::string>* snippets_;
  std::unique_ptr<Tokenizer> tok_;
  json expected_;
};
std::vector<std::string>* HfFixture::snippets_ = nullptr;

TEST_P(HfFixture, EverySnippetEncodesToHfIds) {
  const auto& want_all = expected_["snippets"];
  ASSERT_EQ(want_all.size(), snippets_->size()) << "corpus.txt and the expected ids disagree: rerun the fixture tool";
  size_t wrong = 0;
  for (size_t k = 0; k < snippets_->size(); ++k) {
    const auto want = want_all[k].get<std::vector<int32_t>>();
    const auto got = tok_->encode((*snippets_)[k]);
    if (got != want && ++wrong <= 5) {
      const size_t i = first_difference(got, want);
      ADD_FAILURE() << GetParam() << " snippet " << k << " differs at id " << i << "\n  ours: " << show(got, i)
                    << "\n  HF:   " << show(want, i) << "\n  text: " << (*snippets_)[k].substr(0, 200);
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << snippets_->size() << " snippets";
}

TEST_P(HfFixture, WholeCorpusEncodesToHfIds) {
  const auto want = expected_["whole"].get<std::vector<int32_t>>();
  const auto got = tok_->encode(read_file(kDir + "corpus.txt"));
  const size_t i = first_difference(got, want);
  EXPECT_EQ(got, want) << "first difference at " << i << "\n  ours: " << show(got, i) << "\n  HF:   " << show(want, i);
}

TEST_P(HfFixture, DecodeMatchesHf) {
  const auto& ids = expected_["snippets"];
  for (size_t k = 0; k < snippets_->size(); ++k) {
    const auto v = ids[k].get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->decode(v), expected_decode(k, false)) << "snippet " << k;
    EXPECT_EQ(tok_->decode(v, true), expected_decode(k, true)) << "snippet " << k << " (skip special)";
  }
}

TEST_P(HfFixture, RandomIdsDecodeLikeHf) {
  // Random ids split characters between tokens and include unknown ids: HF's lossy UTF-8 rules.
  const auto& seqs = expected_["random_ids"];
  for (size_t k = 0; k < seqs.size(); ++k) {
    const auto v = seqs[k].get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->decode(v), expected_["random_decode"][k].get<std::string>()) << "sequence " << k;
    EXPECT_EQ(tok_->decode(v, true), expected_["random_decode_skip_special"][k].get<std::string>()) << "sequence " << k;
  }
}

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special, const std::string& what) {
  StreamDecoder dec(tok, skip_special);
  std::string all;
  for (const int32_t id : ids) {
    const std::string piece = dec.push(id);
    ASSERT_TRUE(valid_utf8(piece)) << what;
    all += piece;
  }
  const std::string tail = dec.flush();
  ASSERT_TRUE(valid_utf8(tail)) << what;
  all += tail;
  EXPECT_EQ(all, tok.decode(ids, skip_special)) << what;
}

TEST_P(HfFixture, StreamDecoderEmitsValidUtf8AndConcatenatesToDecode) {
  const auto& ids = expected_["snippets"];
  for (size_t k = 0; k < snippets_->size(); ++k) {
    const auto v = ids[k].get<std::vector<int32_t>>();
    check_stream(*tok_, v, false, "snippet " + std::to_string(k));
    check_stream(*tok_, v, true, "snippet " + std::to_string(k) + " skip");
  }
  for (const auto& seq : expected_["random_ids"]) check_stream(*tok_, seq.get<std::vector<int32_t>>(), false, "random");
}

TEST_P(HfFixture, EncodeIsStableUnderRepetition) {
  // The word cache must not change results: encode twice, and interleave with other text.
  const auto& want = expected_["snippets"];
  for (int round = 0; round < 2; ++round) {
    for (size_t k = 0; k < snippets_->size(); k += 7) {
      EXPECT_EQ(tok_->encode((*snippets_)[k]), want[k].get<std::vector<int32_t>>()) << "snippet " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfFixture, ::testing::ValuesIn(kTokenizers),
                         [](const auto& info) { return info.param; });

// ---- special tokens and the API ----

TEST(Tokenizer, SpecialTokensInlineBecomeTheirIds) {
  const auto tok = Tokenizer::from_file(kDir + "qwen35_v5000_highspecial.json");
  const int32_t im_start = tok.token_to_id("<|im_start|>"), im_end = tok.token_to_id("<|im_end|>");
  const int32_t think = tok.token_to_id("<think>");
  ASSERT_GE(im_start, 5000);
  ASSERT_GE(think, 5000);
  EXPECT_TRUE(tok.is_special(im_start));
  EXPECT_TRUE(tok.is_special(im_end));
  EXPECT_FALSE(tok.is_special(think));  // as Qwen ships it
  EXPECT_FALSE(tok.is_special(tok.token_to_id("a")));
  EXPECT_FALSE(tok.is_special(-1));
  EXPECT_FALSE(tok.is_special(1 << 30));

  const auto ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<think>\n");
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_NE(std::find(ids.begin(), ids.end(), im_end), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), think), ids.end());
  EXPECT_EQ(tok.decode(ids), "<|im_start|>user\nhi<|im_end|>\n<think>\n");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "user\nhi\n<think>\n");

  // A broken special token is ordinary text.
  const auto broken = tok.encode("<|im_end|");
  EXPECT_EQ(std::find(broken.begin(), broken.end(), im_end), broken.end());
}

TEST(Tokenizer, LookupsAndSizes) {
  const auto tok = Tokenizer::from_file(kDir + "qwen35_v1000_lowspecial.json");
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 0);  // trained in at the lowest ids
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_EQ(tok.id_to_token(0), "<|endoftext|>");
  EXPECT_EQ(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.token_to_id("no such token"), -1);
  EXPECT_EQ(tok.id_to_token(-5), "");
  EXPECT_EQ(tok.id_to_token(100000), "");
  const int32_t space = tok.token_to_id("\xC4\xA0");  // "Ġ" is the byte ' '
  ASSERT_GE(space, 0);
  EXPECT_EQ(tok.token_bytes(space), " ");
  EXPECT_EQ(tok.id_to_token(space), "\xC4\xA0");
  EXPECT_GT(tok.num_merges(), 0u);
  EXPECT_EQ(tok.num_added_tokens(), 3u);
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.decode(std::vector<int32_t>{}), "");
}

TEST(Tokenizer, InvalidUtf8IsRepairedLikeFromUtf8Lossy) {
  const auto tok = Tokenizer::from_file(kDir + "qwen35_v5000_highspecial.json");
  const std::string bad = "ab\xC3(\xE2\x82 x\xF0\x9F\x98 \xFF\xFE end\xED\xA0\x80 \xC0\xAF";
  std::string repaired;
  tok::append_utf8_lossy(bad, repaired);
  EXPECT_TRUE(tok::is_valid_utf8(repaired));
  EXPECT_EQ(tok.encode(bad), tok.encode(repaired));
  EXPECT_EQ(tok.decode(tok.encode(bad)), repaired);
  // One U+FFFD per maximal subpart: C3, E2 82, F0 9F 98, FF, FE, ED, A0, 80, C0, AF.
  size_t n = 0;
  for (size_t p = 0; (p = repaired.find("\xEF\xBF\xBD", p)) != std::string::npos; p += 3) ++n;
  EXPECT_EQ(n, 10u);
}

TEST(Tokenizer, StreamDecoderHoldsBackSplitCharacters) {
  const auto tok = Tokenizer::from_file(kDir + "qwen35_v1000_lowspecial.json");
  // "😀" is F0 9F 98 80: feed it as four single-byte tokens.
  const auto& bl = tok::ByteLevelMap::get();
  std::vector<int32_t> ids;
  for (const unsigned char b : std::string("\xF0\x9F\x98\x80!")) ids.push_back(tok.token_to_id(bl.byte_to_utf8[b]));
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.push(ids[2]), "");
  EXPECT_EQ(dec.push(ids[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(dec.push(ids[4]), "!");
  EXPECT_EQ(dec.flush(), "");
  // An incomplete character at the end becomes U+FFFD on flush, as in decode().
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
  // A character that can no longer complete is replaced at once.
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[4]), "\xEF\xBF\xBD!");
}

TEST(Tokenizer, UnicodeClassesMatchHfRegexEngine) {
  const json j = json::parse(read_file(kDir + "hf_unicode.json"));
  const std::pair<const char*, uint8_t> classes[] = {
      {"L", tok::kLetter}, {"M", tok::kMark}, {"N", tok::kNumber}, {"S", tok::kSpace}};
  for (const auto& [name, bit] : classes) {
    std::vector<uint8_t> hf(0x110000, 0);
    for (const auto& r : j[name]) {
      for (uint32_t c = r[0].get<uint32_t>(); c <= r[1].get<uint32_t>(); ++c) hf[c] = 1;
    }
    size_t wrong = 0;
    for (char32_t c = 0; c < 0x110000; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      const bool ours = tok::char_flags(c) & bit;
      if (ours != bool(hf[c]) && ++wrong <= 5) ADD_FAILURE() << name << ": U+" << std::hex << uint32_t(c) << " ours " << ours;
    }
    EXPECT_EQ(wrong, 0u) << name;
  }
}

TEST(Tokenizer, NfcFollowsHfForMarksItsDataLacks) {
  // U+0898 (Arabic, Unicode 14, class 230) is unknown to HF's NFC data: HF keeps "a U+0898 U+0316" as
  // is, ICU alone would move U+0316 (class 220) before it. Known marks are still reordered.
  std::string buf;
  EXPECT_EQ(tok::nfc("a\xE0\xA2\x98\xCC\x96", buf), "a\xE0\xA2\x98\xCC\x96");
  EXPECT_EQ(tok::nfc("a\xCC\x81\xCC\xA3", buf), "\xE1\xBA\xA1\xCC\x81");  // a U+0301 U+0323 -> ạ U+0301
  EXPECT_EQ(tok::nfc("e\xCC\x81\xEF\xBF\xBF\xCC\x81", buf), "\xC3\xA9\xEF\xBF\xBF\xCC\x81");  // a real U+FFFF stays
  EXPECT_EQ(tok::nfc("plain ascii", buf), "plain ascii");
}

// ---- malformed tokenizer.json ----

json minimal_tokenizer() {
  json vocab = json::object();
  const auto& bl = tok::ByteLevelMap::get();
  for (int b = 0; b < 256; ++b) vocab[bl.byte_to_utf8[b]] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({json{{"id", 258}, {"content", "<|im_end|>"}, {"special", true},
                                         {"normalized", false}, {"single_word", false}, {"lstrip", false},
                                         {"rstrip", false}}})},
      {"normalizer", json{{"type", "NFC"}}},
      {"pre_tokenizer", json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", json{{"type", "ByteLevel"}}},
      {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", json::array({"ab", "c"})})}}},
  };
}

void expect_load_error(const json& j, std::initializer_list<std::string> parts) {
  test::expect_error([&] { Tokenizer::from_json(j.dump(), "bad/tokenizer.json"); }, parts);
}

TEST(TokenizerErrors, MinimalTokenizerLoadsAndMergesBothForms) {
  const auto tok = Tokenizer::from_json(minimal_tokenizer().dump(), "mini.json");
  // Byte b has id b here: "abc" merges twice (a b, then ab c), " abd" once.
  EXPECT_EQ(tok.encode("abc abd<|im_end|>"), (std::vector<int32_t>{257, ' ', 256, 'd', 258}));
}

TEST(TokenizerErrors, NamesFileAndKey) {
  test::expect_error([] { Tokenizer::from_json("{not json", "bad/tokenizer.json"); }, {"bad/tokenizer.json", "JSON"});
  test::expect_error([] { Tokenizer::from_json("[1, 2]", "bad/tokenizer.json"); }, {"bad/tokenizer.json", "object"});
  test::expect_error([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json"});
  test::expect_error([] { Tokenizer::from_model_dir("/nonexistent-dir"); }, {"/nonexistent-dir", "tokenizer.json"});

  json j = minimal_tokenizer();
  j.erase("model");
  expect_load_error(j, {"bad/tokenizer.json", "model", "missing"});

  j = minimal_tokenizer();
  j["model"]["type"] = "Unigram";
  expect_load_error(j, {"model.type", "Unigram"});

  j = minimal_tokenizer();
  j["model"]["merges"][0] = "ab";
  expect_load_error(j, {"model.merges[0]", "\"ab\""});

  j = minimal_tokenizer();
  j["model"]["merges"][1] = json::array({"ab", "c", "d"});
  expect_load_error(j, {"model.merges[1]"});

  j = minimal_tokenizer();
  j["model"]["merges"][0] = "a zz";
  expect_load_error(j, {"model.merges[0]", "'zz' is not in model.vocab"});

  j = minimal_tokenizer();
  j["model"]["merges"].push_back("b c");
  expect_load_error(j, {"model.merges[2]", "merged token 'bc'"});

  j = minimal_tokenizer();
  j["model"]["vocab"]["abc"] = 256;
  expect_load_error(j, {"model.vocab", "share id 256"});

  j = minimal_tokenizer();
  j["model"]["vocab"]["x"] = -3;
  expect_load_error(j, {"model.vocab[\"x\"]"});

  j = minimal_tokenizer();
  j["added_tokens"][0]["id"] = 300;
  expect_load_error(j, {"added_tokens[0].id", "300", "258"});

  j = minimal_tokenizer();
  j["added_tokens"].push_back(j["added_tokens"][0]);
  j["added_tokens"][1]["id"] = 259;
  expect_load_error(j, {"added_tokens[1].content", "twice"});

  j = minimal_tokenizer();
  j["normalizer"] = json{{"type", "NFKC"}};
  expect_load_error(j, {"normalizer.type", "NFKC"});

  j = minimal_tokenizer();
  j["normalizer"] = json{{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFC"}}, json{{"type", "Lowercase"}}})}};
  expect_load_error(j, {"normalizer.normalizers[1].type", "Lowercase"});

  j = minimal_tokenizer();
  j["pre_tokenizer"] = json{{"type", "Sequence"},
                            {"pretokenizers", json::array({json{{"type", "Split"},
                                                                {"pattern", json{{"Regex", "\\w+|[^\\w\\s]+"}}},
                                                                {"behavior", "Isolated"},
                                                                {"invert", false}},
                                                           json{{"type", "ByteLevel"}, {"use_regex", false}}})}};
  expect_load_error(j, {"pre_tokenizer.pretokenizers[0].pattern.Regex", "\\w+|[^\\w\\s]+"});

  j = minimal_tokenizer();
  j["pre_tokenizer"] = json{{"type", "Whitespace"}};
  expect_load_error(j, {"pre_tokenizer.type", "Whitespace"});

  j = minimal_tokenizer();
  j["decoder"] = json{{"type", "WordPiece"}};
  expect_load_error(j, {"decoder.type", "WordPiece"});

  j = minimal_tokenizer();
  j["model"]["dropout"] = 0.1;
  expect_load_error(j, {"model.dropout"});

  j = minimal_tokenizer();
  j["model"]["merges"] = "a b";
  expect_load_error(j, {"model.merges", "not an array"});
}

TEST(TokenizerErrors, QwenRegexIsAccepted) {
  json j = minimal_tokenizer();
  const std::string qwen35 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  j["pre_tokenizer"] = json{{"type", "Sequence"},
                            {"pretokenizers", json::array({json{{"type", "Split"},
                                                                {"pattern", json{{"Regex", qwen35}}},
                                                                {"behavior", "Isolated"},
                                                                {"invert", false}},
                                                           json{{"type", "ByteLevel"}, {"add_prefix_space", false},
                                                                {"use_regex", false}}})}};
  EXPECT_NO_THROW(Tokenizer::from_json(j.dump(), "qwen.json"));
}

}  // namespace
}  // namespace tandem
