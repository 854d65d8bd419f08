// runtime/tokenizer/unicode.cpp: see tokenizer_unicode.h.
#include "runtime/tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace tandem::tok {

namespace {

struct CodeRange {
  char32_t first, last;
};

#include "runtime/tokenizer/unicode_hf.inc"

template <size_t N>
bool in_ranges(const CodeRange (&ranges)[N], char32_t cp) {
  const auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                                   [](char32_t c, const CodeRange& r) { return c < r.first; });
  return it != std::begin(ranges) && cp <= std::prev(it)->last;
}

}  // namespace

uint8_t char_flags_slow(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  uint8_t f = 0;
  const uint32_t mask = U_GET_GC_MASK(c);
  // ICU's categories, plus the characters HF's regex engine knows from a newer Unicode than ICU's.
  if ((mask & U_GC_L_MASK) || in_ranges(kHfExtraL, cp)) f |= kLetter | kWord;
  if ((mask & U_GC_M_MASK) || in_ranges(kHfExtraM, cp)) f |= kMark | kWord;
  if ((mask & U_GC_N_MASK) || in_ranges(kHfExtraN, cp)) f |= kNumber;
  if (u_isUWhiteSpace(c)) f |= kSpace;
  if (cp == '\r' || cp == '\n') f |= kNewline;
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) ||
      u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    f |= kWord;
  }
  return f;
}

const uint8_t* bmp_char_flags() {
  // Built once (C++ guarantees thread-safe initialisation of function statics); a table lookup is
  // several times cheaper than the ICU calls and the pre-tokenizer classifies every character.
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x10000);
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = (c >= 0xD800 && c <= 0xDFFF) ? 0 : char_flags_slow(c);
    return t;
  }();
  return table.data();
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Byte length of a well-formed sequence starting at s[i], or 0 with `bad` = the length of the maximal
// invalid subpart (at least 1) as defined by Unicode §3.9 "U+FFFD substitution of maximal subparts".
// `truncated` reports a subpart cut short only by the end of the input.
size_t utf8_step(const unsigned char* s, size_t n, size_t& bad, bool& truncated) {
  truncated = false;
  const unsigned char b = s[0];
  if (b < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    bad = 1;
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) {
      bad = k;
      truncated = true;
      return 0;
    }
    const unsigned char c = s[k];
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) {
      bad = k;
      return 0;
    }
  }
  return need;
}

}  // namespace

bool is_valid_utf8(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs dominate; skip them eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad;
    bool truncated;
    const size_t len = utf8_step(s + i, n - i, bad, truncated);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void append_utf8_lossy(std::string_view sv, std::string& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < n) {
    size_t bad;
    bool truncated;
    const size_t len = utf8_step(s + i, n - i, bad, truncated);
    if (len) {
      i += len;
      continue;
    }
    out.append(sv.data() + run, i - run);
    out.append("\xEF\xBF\xBD");
    i += bad;
    run = i;
  }
  out.append(sv.data() + run, n - run);
}

size_t incomplete_utf8_tail(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const size_t n = sv.size();
  // A lead byte within the last three bytes whose sequence runs past the end, and is valid so far.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char b = s[n - back];
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking for the lead
    size_t bad;
    bool truncated;
    const size_t len = utf8_step(s + n - back, back, bad, truncated);
    return (len == 0 && truncated) ? back : 0;
  }
  return 0;
}

namespace {

// Marks ICU reorders in NFC (combining class > 0) but HF's older normalisation data does not know:
// to HF they are starters that compose with nothing.
const std::vector<char32_t>& marks_unknown_to_hf() {
  static const std::vector<char32_t> marks = [] {
    std::vector<char32_t> v;
    for (char32_t c = 0x300; c < 0x110000; ++c) {
      if (u_getCombiningClass(static_cast<UChar32>(c)) > 0 && !in_ranges(kHfNfcReordered, c)) v.push_back(c);
    }
    return v;
  }();
  return marks;
}

constexpr char32_t kPlaceholder = 0xFFFF;  // a noncharacter: combining class 0, composes with nothing

}  // namespace

std::string_view nfc(std::string_view in, std::string& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  size_t i = 0;
  // ASCII text is always NFC, and it is most text: skip ICU for it.
  while (i < in.size() && s[i] < 0x80) ++i;
  if (i == in.size()) return in;

  static const icu::Normalizer2* const norm = [] {
    UErrorCode st = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(st);
    if (U_FAILURE(st)) fail("ICU: cannot load the NFC normalizer: ", u_errorName(st));
    return n;
  }();
  UErrorCode st = U_ZERO_ERROR;
  const icu::StringPiece sp(in.data(), static_cast<int32_t>(in.size()));
  if (norm->isNormalizedUTF8(sp, st) && U_SUCCESS(st)) return in;

  // Hide the marks HF would not reorder behind a placeholder starter, normalise, then put them back:
  // starters keep their order in NFC, so the k-th placeholder out is the k-th in.
  const auto& unknown = marks_unknown_to_hf();
  std::string hidden;
  std::vector<char32_t> hidden_cps;  // what each placeholder stands for (a real U+FFFF stands for itself)
  for (size_t j = i; j < in.size();) {
    size_t len;
    const char32_t cp = decode_utf8(s + j, len);
    if (cp == kPlaceholder || (cp >= 0x300 && std::binary_search(unknown.begin(), unknown.end(), cp))) {
      if (hidden_cps.empty()) hidden.assign(in.substr(0, j));
      hidden_cps.push_back(cp);
      append_utf8(kPlaceholder, hidden);
    } else if (!hidden_cps.empty()) {
      hidden.append(in.substr(j, len));
    }
    j += len;
  }
  bool any_hidden = false;
  for (const char32_t cp : hidden_cps) any_hidden |= cp != kPlaceholder;
  const icu::StringPiece src = any_hidden ? icu::StringPiece(hidden.data(), static_cast<int32_t>(hidden.size())) : sp;

  std::string normalized;
  std::string& dst = any_hidden ? normalized : out;
  dst.clear();
  st = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(&dst, static_cast<int32_t>(in.size()));
  norm->normalizeUTF8(0, src, sink, nullptr, st);
  if (U_FAILURE(st)) fail("ICU: NFC normalisation failed: ", u_errorName(st));
  if (!any_hidden) return out;

  out.clear();
  size_t k = 0;
  const auto* d = reinterpret_cast<const unsigned char*>(normalized.data());
  for (size_t j = 0; j < normalized.size();) {
    size_t len;
    const char32_t cp = decode_utf8(d + j, len);
    if (cp == kPlaceholder && k < hidden_cps.size()) {
      append_utf8(hidden_cps[k++], out);
    } else {
      out.append(normalized, j, len);
    }
    j += len;
  }
  return out;
}

const ByteLevelMap& ByteLevelMap::get() {
  static const ByteLevelMap map = [] {
    ByteLevelMap m{};
    // Printable Latin-1 bytes map to themselves; the others (controls, space, 0x7F..0xA0, 0xAD) are
    // shifted to U+0100 and up in byte order, so every token is printable text.
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    int next = 0;
    for (int b = 0; b < 256; ++b) m.byte_to_cp[b] = printable(b) ? char32_t(b) : char32_t(256 + next++);
    for (auto& v : m.cp_to_byte) v = -1;
    for (int b = 0; b < 256; ++b) {
      m.cp_to_byte[m.byte_to_cp[b]] = static_cast<int16_t>(b);
      append_utf8(m.byte_to_cp[b], m.byte_to_utf8[b]);
    }
    return m;
  }();
  return map;
}

}  // namespace tandem::tok
