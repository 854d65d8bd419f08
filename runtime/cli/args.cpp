#include "runtime/cli/args.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace tandem::cli {

void Args::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) throw UsageError(str_cat("tandem ", command_, ": unexpected argument '", a, "'"));
    a = a.substr(2);
    std::string value;
    bool has_value = false;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    auto it = std::find_if(flags_.begin(), flags_.end(), [&](const Flag& f) { return f.name == a; });
    if (it == flags_.end()) {
      std::vector<std::string> names;
      for (const auto& f : flags_) names.push_back(f.name);
      const std::string near = nearest(a, names);
      throw UsageError(str_cat("tandem ", command_, ": unknown option '--", a, "'",
                               near.empty() ? std::string() : str_cat(" (did you mean '--", near, "'?)")));
    }
    if (it->takes_value && !has_value) {
      if (i + 1 >= argc) throw UsageError(str_cat("tandem ", command_, ": option '--", a, "' needs a value"));
      value = argv[++i];
    }
    values_[a].push_back(it->takes_value ? value : "1");
  }
}

std::string Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw UsageError(str_cat("tandem ", command_, ": missing required option '--", name, "'"));
  return it->second.back();
}

std::string Args::get(const std::string& name, const std::string& dflt) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : it->second.back();
}

std::vector<std::string> Args::get_all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::get_int(const std::string& name, int64_t dflt) const {
  if (!has(name)) return dflt;
  const std::string v = get(name);
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec == std::errc::result_out_of_range && p == v.data() + v.size())
    throw UsageError(str_cat("tandem ", command_, ": option '--", name, "': ", quote(v), " is out of range"));
  if (ec != std::errc() || p != v.data() + v.size())
    throw UsageError(str_cat("tandem ", command_, ": option '--", name, "' expects an integer, got '", v, "'"));
  return out;
}

double Args::get_double(const std::string& name, double dflt) const {
  if (!has(name)) return dflt;
  const std::string v = get(name);
  try {
    size_t used = 0;
    const double d = std::stod(v, &used);
    if (used == v.size()) return d;
  } catch (const std::exception&) {
  }
  throw UsageError(str_cat("tandem ", command_, ": option '--", name, "' expects a number, got '", v, "'"));
}

std::string Args::usage() const {
  std::string s = "usage: tandem " + command_ + " [options]\n";
  for (const auto& f : flags_) {
    std::string left = "  --" + f.name + (f.takes_value ? " VALUE" : "");
    left.resize(std::max<size_t>(left.size() + 2, 26), ' ');
    s += left + f.help + "\n";
  }
  return s;
}

std::vector<int32_t> parse_id_list(const std::string& spec, const std::string& command) {
  std::string text = spec;
  std::string origin = "--ids";
  if (!spec.empty() && spec[0] == '@') {
    origin = spec.substr(1);
    text = read_text_file(origin, 256 << 20, "the ids file");
  }
  for (char& ch : text)
    if (ch == ',' || ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
  std::vector<int32_t> ids;
  std::istringstream is(text);
  std::string tok;
  while (is >> tok) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size() || v < 0 || v > INT32_MAX)
      throw UsageError(str_cat("tandem ", command, ": ", origin, ": '", tok, "' is not a token id"));
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw UsageError(str_cat("tandem ", command, ": ", origin, ": no token ids given"));
  return ids;
}

}  // namespace tandem::cli
