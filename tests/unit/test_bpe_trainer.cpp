// The byte-level BPE trainer: GPT-2 byte map, the approximate Qwen3.5 splitter (cases worked out by
// hand from the spec §5 regex), training invariants, and the tokenizer.json it writes.
#include <nlohmann/json.hpp>
#include <set>

#include "tools/bpe/bpe_trainer.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using Pieces = std::vector<std::string>;

TEST(BpeTrainer, ByteMapIsGpt2) {
  std::set<char32_t> seen;
  std::set<int> ids;
  for (int b = 0; b < 256; ++b) {
    seen.insert(byte_to_unicode(static_cast<uint8_t>(b)));
    ids.insert(byte_token_id(static_cast<uint8_t>(b)));
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(ids.size(), 256u);
  EXPECT_EQ(*ids.rbegin(), 255);
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_token_id('!'), 0);
  EXPECT_EQ(byte_token_id('\n'), 198);  // as in Qwen's vocabulary (spec §5)
  EXPECT_EQ(byte_token_id(' '), 220);
  EXPECT_EQ(bytes_to_byte_level(" the\n"), "\xC4\xA0the\xC4\x8A");  // "Ġthe" + "Ċ"
}

TEST(BpeTrainer, SplitterFollowsTheQwen35Regex) {
  EXPECT_EQ(pretokenize_qwen35_approx("Hello world's 123"), (Pieces{"Hello", " world", "'s", " ", "1", "2", "3"}));
  EXPECT_EQ(pretokenize_qwen35_approx("a  b"), (Pieces{"a", " ", " b"}));  // \s+(?!\S) leaves one space
  EXPECT_EQ(pretokenize_qwen35_approx("x\n\ny"), (Pieces{"x", "\n\n", "y"}));
  EXPECT_EQ(pretokenize_qwen35_approx("foo!!\n bar"), (Pieces{"foo", "!!\n", " bar"}));
  EXPECT_EQ(pretokenize_qwen35_approx("x  \n  y"), (Pieces{"x", "  \n", " ", " y"}));
  EXPECT_EQ(pretokenize_qwen35_approx("I'M ok"), (Pieces{"I", "'M", " ok"}));  // case-insensitive contractions
  EXPECT_EQ(pretokenize_qwen35_approx("(x)=[1]"), (Pieces{"(x", ")=[", "1", "]"}));
  EXPECT_EQ(pretokenize_qwen35_approx("Привет, мир"), (Pieces{"Привет", ",", " мир"}));
  EXPECT_EQ(pretokenize_qwen35_approx("end   "), (Pieces{"end", "   "}));
}

TEST(BpeTrainer, SplitterCoversEveryByte) {
  std::mt19937 rng(test::test_seed());
  std::string text(builtin_bpe_corpus().substr(0, 4000));
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 500; ++i) text += static_cast<char>(byte(rng));  // invalid UTF-8 too
  std::string joined;
  for (const auto& p : pretokenize_qwen35_approx(text)) {
    EXPECT_FALSE(p.empty());
    joined += p;
  }
  EXPECT_EQ(joined, text);
}

TEST(BpeTrainer, MergesMostFrequentPairFirst) {
  BpeTrainerOptions o;
  o.vocab_size = 259;
  const BpeModel m = train_bpe("abab abab abab cd cd", o);
  ASSERT_EQ(m.tokens.size(), 259u);
  ASSERT_EQ(m.merges.size(), 3u);
  // Pre-tokens: "abab" x1, " abab" x2, " cd" x2. Pair counts: (a,b) 6, (b,a) 3, (Ġ,a) 2, (Ġ,c) 2, (c,d) 2.
  EXPECT_EQ(m.tokens[256], "ab");
  EXPECT_EQ(m.tokens[257], "abab");
  // Then a tie at count 2 between (Ġ,ab), (Ġ,c) and (c,d): the smallest ids win, i.e. (c, d) ('c' = 66).
  EXPECT_EQ(m.tokens[258], "cd");
}

TEST(BpeTrainer, BuiltinCorpusModel) {
  BpeTrainerOptions o;
  o.vocab_size = 4070;
  const BpeModel m = train_bpe(builtin_bpe_corpus(), o);
  EXPECT_GT(builtin_bpe_corpus().size(), 30000u);
  EXPECT_GE(m.tokens.size(), 2000u);
  EXPECT_LE(m.tokens.size(), 4070u);
  std::set<std::string> unique(m.tokens.begin(), m.tokens.end());
  EXPECT_EQ(unique.size(), m.tokens.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(m.tokens[byte_token_id(static_cast<uint8_t>(b))], std::string(1, char(b)));
  for (size_t i = 0; i < m.merges.size(); ++i) {
    const auto [a, b] = m.merges[i];
    ASSERT_LT(a, static_cast<int32_t>(256 + i));  // parts exist before the merge that uses them
    ASSERT_LT(b, static_cast<int32_t>(256 + i));
    EXPECT_TRUE(unique.count(m.tokens[a] + m.tokens[b]));
  }
  EXPECT_TRUE(unique.count(" the"));
  const BpeModel again = train_bpe(builtin_bpe_corpus(), o);
  EXPECT_EQ(again.tokens, m.tokens);
  EXPECT_EQ(again.merges, m.merges);
}

TEST(BpeTrainer, TokenizerJson) {
  BpeTrainerOptions o;
  o.vocab_size = 300;
  const BpeModel m = train_bpe(builtin_bpe_corpus().substr(0, 5000), o);
  const std::vector<AddedToken> added = {{310, "<|endoftext|>", true}, {311, "<think>", false}};
  const json j = json::parse(hf_tokenizer_json(m, added, 310));
  EXPECT_EQ(j["normalizer"], json({{"type", "NFC"}}));
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], kQwen35SplitRegex);
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][1]["use_regex"], false);
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(j["model"]["byte_fallback"], false);
  EXPECT_EQ(j["model"]["vocab"].size(), 310u);  // 300 trained + 10 placeholders
  EXPECT_EQ(j["model"]["vocab"]["<|synth_unused_305|>"], 305);
  EXPECT_EQ(j["model"]["vocab"]["\xC4\x8A"], 198);
  EXPECT_EQ(j["model"]["merges"].size(), m.merges.size());
  EXPECT_EQ(j["model"]["merges"][0].size(), 2u);
  EXPECT_EQ(j["added_tokens"][1]["id"], 311);
  EXPECT_EQ(j["added_tokens"][1]["special"], false);
  // HF numbers added tokens consecutively after the vocabulary: any other id would be silently changed.
  test::expect_error([&] { hf_tokenizer_json(m, {{305, "<x>", true}}, 310); }, {"<x>", "305", "310"});
}

}  // namespace
}  // namespace tandem
