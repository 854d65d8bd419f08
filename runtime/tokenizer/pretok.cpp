// runtime/tokenizer/pretok.cpp: see tokenizer_pretok.h. Each branch below names the regex
// alternative it implements; alternatives are tried in pattern order, as a backtracking engine does.
#include "runtime/tokenizer/pretok.h"

#include "runtime/tokenizer/unicode.h"

namespace tandem::tok {

namespace {

constexpr std::string_view kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr uint8_t kAll = 0xFF;
constexpr uint8_t kNone = 0;

struct Text {
  const unsigned char* s;
  size_t n;

  uint8_t flags(size_t pos, size_t& len) const {
    if (s[pos] < 0x80) {
      len = 1;
      return char_flags(s[pos]);
    }
    return char_flags(decode_utf8(s + pos, len));
  }
  // End of the run of characters from `pos` whose flags intersect `any` (kAll: any character at all,
  // even one with no flags) and avoid `none`.
  size_t run_end(size_t pos, uint8_t any, uint8_t none) const {
    while (pos < n) {
      size_t len;
      const uint8_t f = flags(pos, len);
      if ((any != kAll && !(f & any)) || (f & none)) break;
      pos += len;
    }
    return pos;
  }
  size_t newline_run_end(size_t pos) const {
    while (pos < n && (s[pos] == '\r' || s[pos] == '\n')) ++pos;
    return pos;
  }
};

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at `pos` (which holds '\''): the match length, or 0.
size_t contraction(const Text& t, size_t pos, bool fold_case) {
  auto lower = [&](size_t p) -> int {
    if (p >= t.n) return -1;
    const int c = t.s[p];
    if (!fold_case) return c;
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  };
  const int c1 = lower(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (fold_case && pos + 2 < t.n && t.s[pos + 1] == 0xC5 && t.s[pos + 2] == 0xBF) return 3;  // 'ſ
  const int c2 = lower(pos + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// [\s*[\r\n]+ |] \s+(?!\S) | \s+ at `pos`, which holds a White_Space character; the first
// alternative only in the Qwen patterns.
size_t whitespace_match(const Text& t, size_t pos, bool newline_alternative) {
  size_t end = pos, last_start = pos, after_newline = 0, count = 0;
  while (end < t.n) {
    size_t len;
    const uint8_t f = t.flags(end, len);
    if (!(f & kSpace)) break;
    if (f & kNewline) after_newline = end + len;
    last_start = end;
    end += len;
    ++count;
  }
  // \s*[\r\n]+: \s* backtracks to the last newline of the run, [\r\n]+ takes it.
  if (newline_alternative && after_newline) return after_newline;
  // \s+(?!\S): the whole run at the end of the text, else all but its last character.
  if (end == t.n) return end;
  if (count >= 2) return last_start;
  return end;  // \s+
}

size_t qwen_word_end(const Text& t, size_t pos, bool marks_are_letters) {
  const uint8_t letter = marks_are_letters ? (kLetter | kMark) : kLetter;
  const uint8_t not_other = kSpace | kLetter | kNumber | (marks_are_letters ? kMark : 0);

  if (t.s[pos] == '\'') {
    if (const size_t len = contraction(t, pos, /*fold_case=*/true)) return pos + len;
  }
  size_t len0;
  const uint8_t f0 = t.flags(pos, len0);
  // [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+  (greedy optional prefix first, then without it)
  if (!(f0 & (kNewline | kLetter | kNumber)) && pos + len0 < t.n) {
    size_t len1;
    if (t.flags(pos + len0, len1) & letter) return t.run_end(pos + len0 + len1, letter, kNone);
  }
  if (f0 & letter) return t.run_end(pos + len0, letter, kNone);
  // \p{N}
  if (f0 & kNumber) return pos + len0;
  // ' ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*'
  if (t.s[pos] == ' ' && pos + 1 < t.n) {
    size_t len1;
    if (!(t.flags(pos + 1, len1) & not_other)) return t.newline_run_end(t.run_end(pos + 1, kAll, not_other));
  }
  if (!(f0 & not_other)) return t.newline_run_end(t.run_end(pos, kAll, not_other));
  // f0 is White_Space here: every other class was taken above.
  return whitespace_match(t, pos, true);
}

size_t gpt2_word_end(const Text& t, size_t pos) {
  if (t.s[pos] == '\'') {
    if (const size_t len = contraction(t, pos, /*fold_case=*/false)) return pos + len;
  }
  const size_t start = (t.s[pos] == ' ' && pos + 1 < t.n) ? pos + 1 : pos;  // the optional ' ?'
  size_t len;
  const uint8_t f = t.flags(start, len);
  // ' ?\p{L}+' | ' ?\p{N}+' | ' ?[^\s\p{L}\p{N}]+': with the space if the next character fits.
  if (f & kLetter) return t.run_end(start + len, kLetter, kNone);
  if (f & kNumber) return t.run_end(start + len, kNumber, kNone);
  if (!(f & kSpace)) return t.run_end(start + len, kAll, kSpace | kLetter | kNumber);
  // Here the character after the optional space is White_Space (or there was no space and this one
  // is); without the space the three alternatives above fail on ' ' too, so \s+ rules.
  return whitespace_match(t, pos, false);
}

}  // namespace

std::optional<SplitRegex> split_regex_from_pattern(std::string_view pattern) {
  if (pattern == kQwen35Pattern) return SplitRegex::kQwen35;
  if (pattern == kQwen2Pattern) return SplitRegex::kQwen2;
  if (pattern == kGpt2Pattern) return SplitRegex::kGpt2;
  return std::nullopt;
}

size_t next_word_end(SplitRegex re, std::string_view text, size_t pos) {
  const Text t{reinterpret_cast<const unsigned char*>(text.data()), text.size()};
  switch (re) {
    case SplitRegex::kQwen35:
      return qwen_word_end(t, pos, true);
    case SplitRegex::kQwen2:
      return qwen_word_end(t, pos, false);
    case SplitRegex::kGpt2:
      return gpt2_word_end(t, pos);
  }
  return text.size();
}

}  // namespace tandem::tok
