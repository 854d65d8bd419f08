// runtime/error.h: the one exception type Tandem throws at its boundaries (files, configs, user input).
//
// Messages are meant for a person: say which file / tensor / key, what was expected and what was found.
// Build them with tandem::fail(...) which concatenates its arguments with operator<<.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
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

}  // namespace tandem
