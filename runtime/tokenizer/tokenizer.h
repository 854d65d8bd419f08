// runtime/tokenizer/tokenizer.h: byte-level BPE tokenizer read from a HF `tokenizer.json`, id-for-id identical
// to HF `tokenizers` (checked on a multilingual corpus by tests/unit/test_tokenizer.cpp).
//
// Pipeline of encode(), as HF runs it with add_special_tokens=False:
//   1. added tokens with normalized=false (all special tokens of Qwen) are cut out of the raw text
//      (leftmost-longest; single_word / lstrip / rstrip honoured), each becomes its id;
//   2. the pieces between them are normalised (NFC, or nothing), then added tokens with
//      normalized=true are cut out of the normalised pieces the same way;
//   3. the rest is pre-tokenized (Split with the Qwen3.5 / Qwen2 / GPT-2 regex, then ByteLevel);
//   4. every word goes through BPE (merges by rank; `ignore_merges` honoured; a bounded word cache).
// No BOS/EOS is added and `post_processor` is ignored (Qwen adds nothing); truncation and padding
// settings in the file are ignored too.
//
// Supported tokenizer.json: model BPE (merges as "a b" strings or ["a","b"] pairs; no dropout, no
// byte_fallback, no subword prefix/suffix); normalizer null, NFC, or a Sequence of NFC; pre_tokenizer
// Sequence[Split(Regex, Isolated, invert=false), ByteLevel(use_regex=false)] with one of the regexes of
// tokenizer_pretok.h, or ByteLevel(use_regex=true) (GPT-2); decoder ByteLevel. Anything else, and any
// malformed or inconsistent entry (unknown merge tokens, two tokens sharing an id, an added-token id
// that HF would assign differently), is a tandem::Error naming the file and the key.
//
// Invalid UTF-8 input (HF cannot even receive it: Python str / Rust String are always valid) is
// repaired first: each maximal invalid subpart becomes U+FFFD, as String::from_utf8_lossy does.
//
// decode() maps ids back to bytes through the ByteLevel table (a token whose characters are not all
// in the table contributes its raw text, as HF does), skips unknown ids, and repairs the resulting
// bytes to valid UTF-8 the same lossy way. StreamDecoder does this incrementally.
//
// Threading: a Tokenizer is immutable after loading; encode/decode may run concurrently. The word
// cache serves one encode call at a time (taken with try_lock; a concurrent call just runs uncached).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path);
  // `dir`/tokenizer.json
  static Tokenizer from_model_dir(const std::string& dir);
  // Parses tokenizer.json text; `source` names it in error messages.
  static Tokenizer from_json(std::string_view json, const std::string& source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if absent; added tokens first, as HF
  std::string id_to_token(int32_t id) const;          // the vocab string ("Ġthe"); "" if absent
  // Bytes the id decodes to (ByteLevel undone); empty for an unknown id. Not necessarily UTF-8.
  std::string_view token_bytes(int32_t id) const;
  // Size of the id space: 1 + the largest id of the vocab or of an added token.
  int64_t vocab_size() const;
  bool is_special(int32_t id) const;
  // Number of merges and of added tokens, for `tandem info`-style summaries.
  size_t num_merges() const;
  size_t num_added_tokens() const;

  struct Impl;  // opaque (runtime/tokenizer/impl.h)

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns ids produced one at a time into text, emitting only complete UTF-8: bytes of a character split
// across tokens are held back until it is complete. The concatenation of every push() and the final
// flush() equals Tokenizer::decode of all the ids. Holds a reference to the tokenizer.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(int32_t id);
  // Emits what is held back (an incomplete character becomes U+FFFD) and resets.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // an incomplete UTF-8 character, at most 3 bytes
};

}  // namespace tandem
