#include "core/error.h"

namespace tandem {

namespace {

// Length of the valid UTF-8 sequence at s[i] (1-4), or 0 when the bytes there are not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) { return b(k) >= lo && b(k) <= hi; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;  // no overlongs, no surrogates
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

void escape_into(std::string_view s, std::string& out) {
  static const char* kHex = "0123456789abcdef";
  auto hex = [&](unsigned char c) { out += "\\x", out += kHex[c >> 4], out += kHex[c & 15]; };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_length(s, i);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f || n == 0) hex(c);
    else if (n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) hex(c), hex(static_cast<unsigned char>(s[i + 1]));  // C1 controls
    else out.append(s.substr(i, n));
    i += n ? n : 1;
  }
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  if (text.size() <= max_bytes) {
    escape_into(text, out);
    return out;
  }
  // Keep the start (file, key) and the end (what was expected); cut at character boundaries.
  size_t head = max_bytes * 2 / 3, tail = text.size() - (max_bytes - head);
  auto continuation = [&](size_t i) { return i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  for (int k = 0; k < 3 && head > 0 && continuation(head); ++k) --head;
  for (int k = 0; k < 3 && continuation(tail); ++k) ++tail;
  escape_into(text.substr(0, head), out);
  out += str_cat("...[", tail - head, " bytes cut]...");
  escape_into(text.substr(tail), out);
  return out;
}

std::string quote(std::string_view text, size_t max_bytes) {
  std::string out(1, '\'');
  out += printable(text, max_bytes);
  out += '\'';
  return out;
}

}  // namespace tandem
