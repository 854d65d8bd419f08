// runtime/tokenizer/impl.h: internals of tandem::Tokenizer shared by its loader (tokenizer_load.cpp) and
// its encode/decode paths (tokenizer.cpp). Not part of the public API.
//
// Ids index flat tables: `token_offset` / `bytes_offset` point into arenas of the vocab strings and of
// their decoded bytes, so a 250k vocabulary costs a few MB and no per-token allocation.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/bpe.h"
#include "runtime/tokenizer/pretok.h"

namespace tandem {

// tok::, like tok::BpeModel: the trainer's tandem::AddedToken (bpe_trainer.h) is a different type, and two
// definitions of one name in one library are an ODR violation (Debug builds crashed in ~AddedToken).
namespace tok {
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};
}  // namespace tok

// Leftmost-longest search for a set of added tokens (HF: Aho-Corasick, MatchKind::LeftmostLongest).
// Added tokens are few (tens), so candidates are filtered by first byte and compared directly.
class AddedTokenMatcher {
 public:
  // `pattern` is the text to find (the content, or its normalised form); `token` indexes the added tokens.
  void add(std::string pattern, int32_t token);
  void finish();  // sorts candidates; call once after the last add()
  bool empty() const { return patterns_.empty(); }

  struct Match {
    size_t pos, length;
    int32_t token;
  };
  // The leftmost match at or after `from`, longest among those at that position.
  std::optional<Match> find(std::string_view text, size_t from) const;

 private:
  struct Pattern {
    std::string text;
    int32_t token;
  };
  std::vector<Pattern> patterns_;   // sorted by first byte, then longest first
  uint16_t first_[257] = {};        // patterns_ of first byte b: [first_[b], first_[b + 1])
  int single_first_byte_ = -1;      // when all patterns share a first byte, memchr finds candidates
};

struct PreTokenizerSpec {
  std::optional<tok::SplitRegex> split;  // Split(Regex, Isolated) before ByteLevel
  bool byte_level_regex = false;          // ByteLevel(use_regex=true): GPT-2 regex inside ByteLevel
  bool add_prefix_space = false;          // ByteLevel(add_prefix_space=true)
};

struct Tokenizer::Impl {
  std::string source;  // file name for messages

  bool nfc = false;
  PreTokenizerSpec pre;
  tok::BpeModel bpe;

  std::vector<tok::AddedToken> added;
  AddedTokenMatcher raw_matcher;         // normalized=false: matched in the raw text
  AddedTokenMatcher normalized_matcher;  // normalized=true: matched in the normalised pieces

  tok::StringIdMap token_ids;          // vocab string -> id; added tokens override the model vocab
  std::vector<uint32_t> token_offset;  // id -> [token_offset[id], token_offset[id + 1]) in token_arena
  std::string token_arena;
  std::vector<uint32_t> bytes_offset;  // id -> decoded bytes in bytes_arena
  std::string bytes_arena;
  std::vector<uint8_t> id_flags;       // kIdExists | kIdSpecial
  size_t num_merges = 0;

  static constexpr uint8_t kIdExists = 1;
  static constexpr uint8_t kIdSpecial = 2;

  mutable std::mutex cache_mutex;
  mutable tok::WordCache cache;

  int64_t id_space() const { return static_cast<int64_t>(id_flags.size()); }
  bool valid(int32_t id) const { return id >= 0 && id < id_space() && (id_flags[id] & kIdExists); }
};

// Parses tokenizer.json text into a ready Impl (tokenizer_load.cpp).
std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(std::string_view json, const std::string& source);

}  // namespace tandem
