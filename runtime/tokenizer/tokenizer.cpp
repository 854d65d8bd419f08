// runtime/tokenizer/tokenizer.cpp: encode / decode / streaming decode; loading lives in tokenizer_load.cpp.
#include "runtime/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "runtime/tokenizer/impl.h"
#include "runtime/tokenizer/unicode.h"

namespace tandem {

// ---- AddedTokenMatcher ----

void AddedTokenMatcher::add(std::string pattern, int32_t token) {
  if (!pattern.empty()) patterns_.push_back({std::move(pattern), token});
}

void AddedTokenMatcher::finish() {
  std::stable_sort(patterns_.begin(), patterns_.end(), [](const Pattern& a, const Pattern& b) {
    const auto fa = static_cast<unsigned char>(a.text[0]), fb = static_cast<unsigned char>(b.text[0]);
    return fa != fb ? fa < fb : a.text.size() > b.text.size();
  });
  if (patterns_.size() >= UINT16_MAX) fail("too many added tokens (", patterns_.size(), ")");
  size_t k = 0;
  for (int b = 0; b <= 256; ++b) {
    while (k < patterns_.size() && static_cast<unsigned char>(patterns_[k].text[0]) < b) ++k;
    first_[b] = static_cast<uint16_t>(k);
  }
  single_first_byte_ = -1;
  if (!patterns_.empty() && patterns_.front().text[0] == patterns_.back().text[0]) {
    single_first_byte_ = static_cast<unsigned char>(patterns_.front().text[0]);
  }
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::find(std::string_view text, size_t from) const {
  if (patterns_.empty()) return std::nullopt;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (single_first_byte_ >= 0) {
      const void* hit = std::memchr(s + pos, single_first_byte_, text.size() - pos);
      if (!hit) return std::nullopt;
      pos = static_cast<const unsigned char*>(hit) - s;
    }
    const unsigned char b = s[pos];
    for (size_t k = first_[b]; k < first_[b + 1]; ++k) {  // longest first
      const std::string& p = patterns_[k].text;
      if (p.size() <= text.size() - pos && std::memcmp(s + pos, p.data(), p.size()) == 0) {
        return Match{pos, p.size(), patterns_[k].token};
      }
    }
  }
  return std::nullopt;
}

namespace {

// The character before byte `pos` of valid UTF-8 `text` (pos > 0).
char32_t char_before(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t len;
  return tok::decode_utf8(reinterpret_cast<const unsigned char*>(text.data()) + start, len);
}

char32_t char_at(std::string_view text, size_t pos) {
  size_t len;
  return tok::decode_utf8(reinterpret_cast<const unsigned char*>(text.data()) + pos, len);
}

// Start of the White_Space run that ends `text` at `end` (Rust regex `\s*$`).
size_t trailing_space_start(std::string_view text, size_t end) {
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    if (!(tok::char_flags(char_at(text, start)) & tok::kSpace)) break;
    end = start;
  }
  return end;
}

// End of the White_Space run that starts `text` at `pos` (Rust regex `^\s*`).
size_t leading_space_end(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  while (pos < text.size()) {
    size_t len;
    if (!(tok::char_flags(tok::decode_utf8(s + pos, len)) & tok::kSpace)) break;
    pos += len;
  }
  return pos;
}

// HF AddedVocabulary::find_matches: splits `text` into gaps and added tokens. A match rejected by
// single_word is skipped without rescanning its span, as HF's non-overlapping iterator does.
template <typename OnGap, typename OnToken>
void split_on_added(std::string_view text, const AddedTokenMatcher& matcher, const std::vector<tok::AddedToken>& added,
                    OnGap&& on_gap, OnToken&& on_token) {
  size_t done = 0, search = 0;
  while (auto m = matcher.find(text, search)) {
    search = m->pos + m->length;
    const tok::AddedToken& t = added[m->token];
    size_t start = m->pos, stop = m->pos + m->length;
    if (t.single_word) {
      const bool space_before = start == 0 || !(tok::char_flags(char_before(text, start)) & tok::kWord);
      const bool space_after = stop == text.size() || !(tok::char_flags(char_at(text, stop)) & tok::kWord);
      if (!space_before || !space_after) continue;
    }
    if (t.lstrip) start = std::max(trailing_space_start(text, start), done);
    if (t.rstrip) stop = leading_space_end(text, stop);
    // HF lets a token that starts inside the previous token's rstrip overlap it; only the ids matter,
    // and clamping keeps them identical.
    start = std::max(start, done);
    if (done < start) on_gap(text.substr(done, start - done));
    on_token(t.id);
    done = std::max(done, stop);
  }
  if (done < text.size()) on_gap(text.substr(done));
}

struct EncodeContext {
  const Tokenizer::Impl& impl;
  std::vector<int32_t>& out;
  tok::WordCache* cache;
  tok::BpeScratch scratch;
  std::string nfc_buffer;
  std::string prefixed;  // a piece with the ByteLevel prefix space

  void bpe(std::string_view word) { impl.bpe.encode_word(word, out, scratch, cache); }

  // ByteLevel pre-tokenizer on one piece: optional prefix space, optional GPT-2 split.
  void byte_level(std::string_view piece) {
    if (impl.pre.add_prefix_space && piece.front() != ' ') {
      prefixed.assign(1, ' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (impl.pre.byte_level_regex) {
      tok::for_each_word(tok::SplitRegex::kGpt2, piece, [&](std::string_view w) { bpe(w); });
    } else {
      bpe(piece);
    }
  }

  void pre_tokenize(std::string_view piece) {
    if (piece.empty()) return;
    if (impl.pre.split) {
      tok::for_each_word(*impl.pre.split, piece, [&](std::string_view w) { byte_level(w); });
    } else {
      byte_level(piece);
    }
  }

  void raw_gap(std::string_view gap) {
    const std::string_view norm = impl.nfc ? tok::nfc(gap, nfc_buffer) : gap;
    if (impl.normalized_matcher.empty()) {
      pre_tokenize(norm);
      return;
    }
    // `norm` may live in nfc_buffer, which nothing below reuses.
    split_on_added(
        norm, impl.normalized_matcher, impl.added, [&](std::string_view piece) { pre_tokenize(piece); },
        [&](int32_t id) { out.push_back(id); });
  }
};

}  // namespace

// ---- Tokenizer ----

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& source) {
  return Tokenizer(load_tokenizer_json(json, source));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  // Real tokenizer.json files are a few MB to tens of MB (a 250k vocabulary with its merges).
  return from_json(read_text_file(path, uint64_t{512} << 20, "the tokenizer file"), path);
}

Tokenizer Tokenizer::from_model_dir(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) fail(dir, ": no tokenizer.json in the model folder");
  return from_file(path.string());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  if (text.empty()) return out;
  std::string repaired;
  if (!tok::is_valid_utf8(text)) {
    tok::append_utf8_lossy(text, repaired);
    text = repaired;
  }
  out.reserve(text.size() / 3 + 4);
  std::unique_lock lock(impl_->cache_mutex, std::try_to_lock);
  EncodeContext ctx{*impl_, out, lock.owns_lock() ? &impl_->cache : nullptr, {}, {}, {}};
  split_on_added(
      text, impl_->raw_matcher, impl_->added, [&](std::string_view gap) { ctx.raw_gap(gap); },
      [&](int32_t id) { out.push_back(id); });
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (!impl_->valid(id)) return {};
  return std::string_view(impl_->bytes_arena).substr(impl_->bytes_offset[id],
                                                      impl_->bytes_offset[id + 1] - impl_->bytes_offset[id]);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes.append(token_bytes(id));
  }
  if (tok::is_valid_utf8(bytes)) return bytes;
  std::string text;
  tok::append_utf8_lossy(bytes, text);
  return text;
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->token_ids.find(token); }

std::string Tokenizer::id_to_token(int32_t id) const {
  if (!impl_->valid(id)) return {};
  return impl_->token_arena.substr(impl_->token_offset[id], impl_->token_offset[id + 1] - impl_->token_offset[id]);
}

int64_t Tokenizer::vocab_size() const { return impl_->id_space(); }

bool Tokenizer::is_special(int32_t id) const {
  return impl_->valid(id) && (impl_->id_flags[id] & Impl::kIdSpecial);
}

size_t Tokenizer::num_merges() const { return impl_->num_merges; }
size_t Tokenizer::num_added_tokens() const { return impl_->added.size(); }

// ---- StreamDecoder ----

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_.append(tokenizer_.token_bytes(id));
  // Lossy decoding runs left to right, so cutting before an incomplete (but so far valid) final
  // character and decoding the rest later gives the same text as decoding everything at once.
  const size_t keep = tok::incomplete_utf8_tail(pending_);
  const std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - keep);
  std::string text;
  if (tok::is_valid_utf8(ready)) {
    text.assign(ready);
  } else {
    tok::append_utf8_lossy(ready, text);
  }
  pending_.erase(0, pending_.size() - keep);
  return text;
}

std::string StreamDecoder::flush() {
  std::string text;
  tok::append_utf8_lossy(pending_, text);
  pending_.clear();
  return text;
}

}  // namespace tandem
