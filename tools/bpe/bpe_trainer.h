// tools/bpe/bpe_trainer.h: a byte-level BPE trainer (GPT-2 byte map) and the HF tokenizer.json it writes,
// used by `tandem synth` to give synthetic models a real, loadable tokenizer.
//
// Training: text -> pre-tokens (an approximation of the Qwen3.5 split regex, see
// pretokenize_qwen35_approx) -> UTF-8 bytes -> greedy pair merges, most frequent pair first, ties
// broken by the smaller (left id, right id); stops at `vocab_size` tokens or when no pair occurs
// `min_frequency` times. Ids 0..255 are the 256 byte tokens in GPT-2's order (so "\n" is 198 and
// "Ġ" (space) 220, as in Qwen), merge i creates id 256+i unless its string already exists.
// Deterministic: same text and options, same model, on every platform.
//
// The written tokenizer.json declares the exact official Qwen3.5 pipeline (NFC normalizer, the spec §5
// split regex + ByteLevel pre-tokenizer, ByteLevel decoder, BPE without byte_fallback), so encoders
// that follow it (HF tokenizers, runtime/tokenizer) split with the real regex; the simplified training
// splitter only decides which merges exist. Every byte has a token, so every string is encodable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

// The Qwen3.5 pre-tokenizer regex (spec §5), exactly as tokenizer.json must declare it.
extern const char* const kQwen35SplitRegex;

// GPT-2's reversible byte -> printable code point map ('\n' -> U+010A "Ċ", ' ' -> U+0120 "Ġ").
char32_t byte_to_unicode(uint8_t b);
// The id of byte b's token among the first 256 (GPT-2 order: printable bytes first).
int byte_token_id(uint8_t b);
// Raw bytes -> their byte-level (mapped, UTF-8 encoded) token string, e.g. " the" -> "Ġthe".
std::string bytes_to_byte_level(std::string_view bytes);

// Splits UTF-8 text like the Qwen3.5 regex, with a simplified Unicode classification (exact for ASCII;
// non-ASCII code points are letters unless listed as spaces, digits or punctuation/symbols, marks count
// as letters). Good enough to decide merges; encoders must use the real regex.
std::vector<std::string> pretokenize_qwen35_approx(std::string_view text);

struct BpeTrainerOptions {
  size_t vocab_size = 3000;  // regular tokens, including the 256 byte tokens
  int64_t min_frequency = 2;
};

struct BpeModel {
  std::vector<std::string> tokens;  // id -> raw bytes of the token
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order: (left id, right id)
};

BpeModel train_bpe(std::string_view text, const BpeTrainerOptions& opts);

// The training text built into Tandem (a few tens of KB: English prose, dialogue, code, numbers,
// and other scripts), so synthetic tokenizers need no download.
std::string_view builtin_bpe_corpus();

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = true;
};

// HF tokenizers' tokenizer.json for `model` plus `added` tokens. Merges are written as [left, right]
// pairs (the tokenizers >= 0.20 form). HF assigns added-token ids sequentially after the regular
// vocabulary, so when the added tokens must start at a later id (Qwen's 248044 with a small trained
// vocabulary), ids model.tokens.size()..regular_size-1 are filled with placeholder tokens
// "<|synth_unused_ID|>": no merge produces them, so encoding never does (ASCII only, so byte-level
// decoding of them is well defined).
std::string hf_tokenizer_json(const BpeModel& model, const std::vector<AddedToken>& added, int64_t regular_size = 0);

}  // namespace tandem
