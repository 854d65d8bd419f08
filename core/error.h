// core/error.h: the one exception type Tandem throws at its boundaries (files, configs, user input).
//
// Messages are meant for a person: say which file / tensor / key, what was expected and what was found.
// Build them with tandem::fail(...) which concatenates its arguments with operator<<. Values taken from
// the input go through quote() (escaped, cut); the Error constructor makes every message one printable
// line of bounded length whatever went into it (printable()), so a binary file or a 10 MB value cannot
// flood a terminal or break the one-line error contract.
#pragma once

#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace tandem {

// `text` as one printable line: control characters and bytes that are not valid UTF-8 become \xNN
// (\n, \t as themselves escaped); longer than max_bytes, the middle is cut and says how much.
std::string printable(std::string_view text, size_t max_bytes = 1024);
// An input value for a message: 'text', escaped and cut as printable() does at max_bytes.
std::string quote(std::string_view text, size_t max_bytes = 80);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(printable(what)) {}
};

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

// Range check before narrowing: `v` as a To when lo <= v <= hi, else tandem::Error
// "<what>: <v> is out of range (lo..hi)". The one helper config parsing and flag parsing use, so a
// value above 2^32 is an error, never its low bits.
template <typename To, typename From>
To narrow(From v, std::string_view what, To lo = std::numeric_limits<To>::lowest(), To hi = std::numeric_limits<To>::max()) {
  static_assert(std::is_integral_v<To> && std::is_integral_v<From>);
  if (!std::in_range<To>(v) || static_cast<To>(v) < lo || static_cast<To>(v) > hi)
    fail(what, ": ", v, " is out of range (", +lo, "..", +hi, ")");
  return static_cast<To>(v);
}

}  // namespace tandem
