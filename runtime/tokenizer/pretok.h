// runtime/tokenizer/pretok.h: hand-written matchers for the pre-tokenizer regexes of byte-level BPE
// tokenizers, exact replacements for running them through HF's regex engine (Oniguruma).
//
// A generic regex engine spends most of the encode time here; these matchers classify each character
// once (ASCII by table, the rest through the table of tokenizer_unicode.h) and follow the regex's
// ordered alternatives and backtracking by hand. Supported patterns (the exact strings, see .cpp):
//   kQwen35: Qwen3.5  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|
//                     ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  Qwen2/3, the same without \p{M}
//   kGpt2:   GPT-2 / ByteLevel(use_regex=true)  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//                     ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Case-insensitive (?i:...) follows Unicode simple case folding as Oniguruma does: 's also matches
// 'S and 'ſ (U+017F, LATIN SMALL LETTER LONG S).
//
// Input must be valid UTF-8. Every character is covered by some alternative of these patterns, so
// the words tile the input exactly. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace tandem::tok {

enum class SplitRegex { kQwen35, kQwen2, kGpt2 };

// The matcher for a regex string from tokenizer.json, or nullopt when it is not one we implement.
std::optional<SplitRegex> split_regex_from_pattern(std::string_view pattern);

// End (byte offset) of the regex match that starts at `pos` < text.size().
size_t next_word_end(SplitRegex re, std::string_view text, size_t pos);

template <typename F>
void for_each_word(SplitRegex re, std::string_view text, F&& on_word) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = next_word_end(re, text, pos);
    on_word(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace tandem::tok
