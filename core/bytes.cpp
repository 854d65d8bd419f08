#include "core/bytes.h"

#include <cctype>
#include <cstdio>

#include "core/error.h"

namespace tandem {

uint64_t parse_bytes_or_zero(const std::string& text, const std::string& what) { return text == "0" ? 0 : parse_bytes(text, what); }

uint64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail(what, ": ", quote(text), " is not a size (examples: 24GiB, 512MiB, 16GB)");
  }
  std::string unit = text.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::tolower(c));
  double mul = 1;
  if (unit == "" || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib") mul = 1024.0;
  else if (unit == "m" || unit == "mib") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mul = 1e3;
  else if (unit == "mb") mul = 1e6;
  else if (unit == "gb") mul = 1e9;
  else if (unit == "tb") mul = 1e12;
  else fail(what, ": unknown unit ", quote(text.substr(used)), " in ", quote(text), " (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  if (!(v > 0)) fail(what, ": ", quote(text), " must be positive");
  constexpr double kMax = 1152921504606846976.0;  // 1 EiB: far beyond any machine, and exact in uint64
  if (!(v * mul <= kMax)) fail(what, ": ", quote(text), " is too large (at most 1 EiB)");
  return static_cast<uint64_t>(v * mul);
}

std::string format_gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  return buf;
}

}  // namespace tandem
