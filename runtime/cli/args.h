// runtime/cli/args.h: a small, strict command-line parser shared by the tandem subcommands.
//
// Each subcommand declares its flags (name, whether it takes a value, help); parse() rejects unknown
// flags naming the nearest valid one, and missing values. Errors throw UsageError (exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/nearest.h"

namespace tandem::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Flag {
  std::string name;  // without the leading "--"
  bool takes_value = true;
  std::string help;
};

class Args {
 public:
  Args(std::string command, std::vector<Flag> flags) : command_(std::move(command)), flags_(std::move(flags)) {}
  void parse(int argc, char** argv, int first);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name) const;  // required: throws UsageError if absent
  std::string get(const std::string& name, const std::string& dflt) const;
  std::vector<std::string> get_all(const std::string& name) const;  // a flag given several times
  int64_t get_int(const std::string& name, int64_t dflt) const;
  // An integer flag in lo..hi as a T: range-checked before narrowing (tandem::narrow), so 2^32 + 16 is a
  // UsageError naming the flag, never 16.
  template <typename T>
  T get_int(const std::string& name, T dflt, T lo, T hi) const {
    const int64_t v = get_int(name, dflt);
    try {
      return narrow<T>(v, "--" + name, lo, hi);
    } catch (const Error& e) {
      throw UsageError(str_cat("tandem ", command_, ": ", e.what()));
    }
  }
  double get_double(const std::string& name, double dflt) const;
  std::string usage() const;

 private:
  std::string command_;
  std::vector<Flag> flags_;
  std::map<std::string, std::vector<std::string>> values_;
};

// Token ids from "5,17 3" or "@FILE" (comma or whitespace separated); UsageError names the bad entry.
std::vector<int32_t> parse_id_list(const std::string& spec, const std::string& command);

using tandem::nearest;  // core/nearest.h

}  // namespace tandem::cli
