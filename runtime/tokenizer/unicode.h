// runtime/tokenizer/unicode.h: the Unicode pieces the tokenizer needs: UTF-8 decoding and repair,
// character classes for the pre-tokenizer regexes, NFC, and the GPT-2 byte <-> unicode map.
//
// Character classes follow the regex engine HF `tokenizers` uses (Oniguruma through the `onig` crate):
// \p{L}, \p{M}, \p{N} are the Unicode general categories (L* = Lu Ll Lt Lm Lo, M* = Mn Mc Me,
// N* = Nd Nl No) and \s is the White_Space property (25 code points: \t \n \v \f \r, space, U+0085,
// U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). Data comes from ICU, so
// characters assigned in a newer Unicode version than ICU's are "other" here.
//
// Invalid UTF-8 is repaired the way Rust's String::from_utf8_lossy does it (each maximal invalid
// subpart becomes one U+FFFD), so the decoder and the input repair agree with HF byte for byte.
//
// Thread-safe: the class table is built once, on first use, and is read-only afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tok {

// Bit flags of one code point. \r and \n carry both kSpace and kNewline.
enum CharFlags : uint8_t {
  kLetter = 1,   // \p{L}
  kMark = 2,     // \p{M}
  kNumber = 4,   // \p{N}
  kSpace = 8,    // \s (White_Space)
  kNewline = 16, // [\r\n]
  kWord = 32,    // Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control (for single_word added tokens)
};

uint8_t char_flags_slow(char32_t cp);  // ICU lookup; code points >= 0x10000
const uint8_t* bmp_char_flags();       // table of 65536 entries

inline uint8_t char_flags(char32_t cp) {
  static const uint8_t* const table = bmp_char_flags();
  return cp < 0x10000 ? table[cp] : char_flags_slow(cp);
}

// Decodes the code point at s[i] of *valid* UTF-8; sets `len` to its byte length.
inline char32_t decode_utf8(const unsigned char* s, size_t& len) {
  const unsigned char b = s[0];
  if (b < 0x80) { len = 1; return b; }
  if (b < 0xE0) { len = 2; return (char32_t(b & 0x1F) << 6) | (s[1] & 0x3F); }
  if (b < 0xF0) { len = 3; return (char32_t(b & 0x0F) << 12) | (char32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F); }
  len = 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(s[1] & 0x3F) << 12) | (char32_t(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

void append_utf8(char32_t cp, std::string& out);

bool is_valid_utf8(std::string_view s);
// Appends `s` with every maximal invalid subpart replaced by U+FFFD (String::from_utf8_lossy).
void append_utf8_lossy(std::string_view s, std::string& out);
// Length of a trailing sequence that is an incomplete but so far valid UTF-8 character (0..3): the
// bytes a streaming decoder must hold back because the next token may complete them.
size_t incomplete_utf8_tail(std::string_view s);

// NFC of valid UTF-8 `in`, written to `out` (replaced). Returns `in` itself when it is already NFC
// (the common case, found by a quick check), else a view of `out`.
std::string_view nfc(std::string_view in, std::string& out);

// GPT-2's reversible byte <-> printable code point map used by ByteLevel.
struct ByteLevelMap {
  char32_t byte_to_cp[256];
  int16_t cp_to_byte[324];  // -1 where a code point is no byte's image; every image is < 324
  std::string byte_to_utf8[256];

  static const ByteLevelMap& get();
};

}  // namespace tandem::tok
