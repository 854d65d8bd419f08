#include "placement/placement_config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <filesystem>
#include <sstream>

#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/nearest.h"
#include "core/limits.h"

namespace tandem::placement {

const char* side_name(Side s) { return s == Side::Gpu ? "gpu" : "cpu"; }
const char* selection_name(ExpertSelection s) {
  switch (s) {
    case ExpertSelection::Frequency: return "frequency";
    case ExpertSelection::Uniform: return "uniform";
    case ExpertSelection::Layers: return "layers";
    case ExpertSelection::None: return "none";
    case ExpertSelection::All: return "all";
  }
  return "?";
}
const char* prefill_name(PrefillStrategy s) {
  return s == PrefillStrategy::Auto ? "auto" : s == PrefillStrategy::Cpu ? "cpu" : "gpu_stream";
}

bool PlacementConfig::experts_int4_on_load(bool checkpoint_int4) const {
  if (gpu_format == "int4") return true;
  if (checkpoint_int4) return false;
  if (cpu_format == "int4") return true;
  for (const PlacementRule& r : rules)
    if (r.format == "int4") return true;  // formats in rules are the experts' (the planner refuses them elsewhere)
  return false;
}

bool glob_match(const std::string& p, const std::string& s) {
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  while (j < s.size()) {
    if (i < p.size() && (p[i] == '?' || p[i] == s[j])) {
      ++i, ++j;
    } else if (i < p.size() && p[i] == '*') {
      star = i++, mark = j;
    } else if (star != std::string::npos) {
      i = star + 1, j = ++mark;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

namespace {

// Where a node came from, for messages: "configs/rtx4090.yaml:12: key 'gpu.memory': ..."
class Reader {
 public:
  Reader(std::string source, std::string base_dir) : source_(std::move(source)), base_(std::move(base_dir)) {}

  template <typename... A>
  [[noreturn]] void fail_at(const YAML::Node& n, const std::string& key, const A&... a) const {
    const int line = n.Mark().is_null() ? 0 : n.Mark().line + 1;
    fail(source_, line ? str_cat(":", line) : "", ": key '", key, "': ", a...);
  }

  // Every key of `map` must be one of `known`, and appear once (YAML readers keep one of two same keys
  // and drop the other without a word: an override appended to a config would do nothing); returns
  // nothing, throws with the nearest valid key or both lines of a repeated one.
  void check_keys(const YAML::Node& map, const std::string& where, const std::vector<std::string>& known) const {
    if (!map.IsMap()) fail_at(map, where, "expected a mapping of keys (", join(known), ")");
    std::vector<std::pair<std::string, int>> seen;  // key, line
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string k = it->first.as<std::string>();
      const int at = it->first.Mark().line + 1;
      for (const auto& [key, line] : seen)
        if (key == k)
          fail(source_, ":", at, ": key ", quote(path(where, k)), " appears twice (first at line ", line,
               "): give it once, with the value you mean");
      seen.emplace_back(k, at);
      if (std::find(known.begin(), known.end(), k) != known.end()) continue;
      const std::string near = nearest(k, known);
      fail(source_, ":", at, ": unknown key ", quote(path(where, k)),
           near.empty() ? str_cat(" (valid keys: ", join(known), ")") : str_cat(" (did you mean '", near, "'?)"));
    }
  }

  std::string scalar(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) fail_at(n, key, "expected a single value");
    return n.as<std::string>();
  }
  int64_t integer(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi) const {
    return numeric<int64_t>(n, key, lo, hi, "an integer");
  }
  double number(const YAML::Node& n, const std::string& key, double lo, double hi) const {
    return numeric<double>(n, key, lo, hi, "a number");
  }
  uint64_t bytes(const YAML::Node& n, const std::string& key, bool zero_is_off = false) const {
    const std::string s = scalar(n, key);
    try {
      return zero_is_off ? parse_bytes_or_zero(s, "size") : parse_bytes(s, "size");
    } catch (const Error& e) {
      fail_at(n, key, e.what());
    }
  }
  // "25GB/s" / "1.0TB/s" / "measure" -> bytes per second (0 = measure)
  double bandwidth(const YAML::Node& n, const std::string& key) const {
    std::string s = scalar(n, key);
    if (s == "measure" || s == "auto") return 0;
    if (s.size() < 3 || s.substr(s.size() - 2) != "/s")
      fail_at(n, key, quote(s), " is not a bandwidth (examples: 1008GB/s, 25GB/s, 90.5GB/s, measure)");
    s.resize(s.size() - 2);
    try {
      return static_cast<double>(parse_bytes(s, "bandwidth"));
    } catch (const Error& e) {
      fail_at(n, key, e.what());
    }
  }
  template <typename E>
  E choice(const YAML::Node& n, const std::string& key, const std::vector<std::pair<std::string, E>>& options) const {
    const std::string s = scalar(n, key);
    std::vector<std::string> names;
    for (const auto& [name, v] : options) {
      if (name == s) return v;
      names.push_back(name);
    }
    const std::string near = nearest(s, names);
    fail_at(n, key, quote(s), " is not one of ", join(names), near.empty() ? "" : str_cat(" (did you mean '", near, "'?)"));
  }
  std::string resolve(const std::string& file) const {
    if (file.empty() || base_.empty() || std::filesystem::path(file).is_absolute()) return file;
    return (std::filesystem::path(base_) / file).string();
  }
  static std::string path(const std::string& where, const std::string& key) { return where.empty() ? key : where + "." + key; }
  static std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
  }

 private:
  template <typename T>
  T numeric(const YAML::Node& n, const std::string& key, T lo, T hi, const char* what) const {
    const std::string s = scalar(n, key);
    T v{};
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) fail_at(n, key, quote(s), " is not ", what);
    if (!(v >= lo && v <= hi)) fail_at(n, key, v, " is outside ", lo, "..", hi);
    return v;
  }
  std::string source_, base_;
};

const std::vector<std::pair<std::string, ExpertSelection>> kSelections = {
    {"frequency", ExpertSelection::Frequency}, {"uniform", ExpertSelection::Uniform},
    {"none", ExpertSelection::None},           {"all", ExpertSelection::All}};

void read_select(const Reader& r, const YAML::Node& n, PlacementConfig& c) {
  const std::string key = "experts.select";
  std::string range;
  if (n.IsMap()) {
    r.check_keys(n, key, {"layers"});
    range = r.scalar(n["layers"], key + ".layers");
  } else {
    const std::string s = r.scalar(n, key);
    if (s.rfind("layers", 0) != 0) {
      c.select = r.choice(n, key, kSelections);
      return;
    }
    range = s.substr(6);
    while (!range.empty() && (range[0] == ' ' || range[0] == ':')) range.erase(0, 1);
  }
  int a = -1, b = -1;
  char dash = 0, extra = 0;
  std::istringstream is(range);
  if (!(is >> a) || a < 0) r.fail_at(n, key, quote("layers " + range), " needs a layer range like 'layers 0-19'");
  if (is >> dash) {
    if (dash != '-' || !(is >> b) || (is >> extra)) r.fail_at(n, key, quote("layers " + range), " needs a layer range like 'layers 0-19'");
  } else {
    b = a;
  }
  if (b < a) r.fail_at(n, key, "layer range ", a, "-", b, " is empty");
  c.select = ExpertSelection::Layers;
  c.layer_first = a, c.layer_last = b;
}

// An experts format (allow_auto: also 'auto'), or a rule's (allow_fp8: also 'fp8', for dense units).
std::string format_value(const Reader& r, const YAML::Node& n, const std::string& key, bool allow_auto, bool allow_fp8 = false) {
  std::vector<std::pair<std::string, int>> opts = {{"int4", 0}, {"int8", 1}, {"bf16", 2}};
  if (allow_auto) opts.insert(opts.begin(), {"auto", 3});
  if (allow_fp8) opts.push_back({"fp8", 4});
  const int v = r.choice(n, key, opts);
  return v == 4 ? "fp8" : v == 3 ? "auto" : v == 0 ? "int4" : v == 1 ? "int8" : "bf16";
}

// A row format (core/row_format.h) key: kv_cache.format, dense.format, dense.lm_head, speculative.lm_head.
std::string row_format_value(const Reader& r, const YAML::Node& n, const std::string& key) {
  const std::string v = r.scalar(n, key);
  if (v != "bf16" && v != "int8" && v != "fp8") r.fail_at(n, key, "'", v, "' must be 'bf16', 'int8' or 'fp8'");
  return v;
}

}  // namespace

PlacementConfig parse_placement_config(const std::string& text, const std::string& source, const std::string& base_dir) {
  PlacementConfig c;
  c.source = source;
  Reader r(source, base_dir);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": not valid YAML: ", e.msg);
  }
  if (!root || root.IsNull()) return c;  // an empty file: every default
  try {
    r.check_keys(root, "", {"gpu", "context", "batch", "cpu", "experts", "cpu_experts", "gpu_experts_per_layer", "prefill",
                            "bandwidth", "cost", "rules", "server", "speculative", "dense", "kv_cache"});
    if (const YAML::Node kv = root["kv_cache"]) {
      r.check_keys(kv, "kv_cache", {"format"});
      if (const YAML::Node f = kv["format"]) c.kv_format = row_format_value(r, f, "kv_cache.format");
    }
    if (const YAML::Node dn = root["dense"]) {
      r.check_keys(dn, "dense", {"format", "lm_head"});
      if (const YAML::Node f = dn["format"]) c.dense_format = row_format_value(r, f, "dense.format");
      if (const YAML::Node f = dn["lm_head"]) c.lm_head_format = row_format_value(r, f, "dense.lm_head");
    }
    if (const YAML::Node sp = root["speculative"]) {
      r.check_keys(sp, "speculative", {"draft", "head_experts", "lm_head"});
      if (const YAML::Node f = sp["lm_head"]) c.draft_lm_head_format = row_format_value(r, f, "speculative.lm_head");
      if (sp["head_experts"]) c.head_experts_cpu = r.choice<bool>(sp["head_experts"], "speculative.head_experts", {{"gpu", false}, {"cpu", true}});
      if (const YAML::Node d = sp["draft"]; d && d.IsScalar() && d.Scalar() == "auto") c.draft = kDraftAuto;  // the tuner picks
      else if (d) c.draft = static_cast<int>(r.integer(d, "speculative.draft", 0, kMaxDraft));
    }
    if (const YAML::Node sv = root["server"]) {
      r.check_keys(sv, "server", {"host", "port", "max_queue", "prefill_chunk", "timeout", "max_body", "cache", "cache_vram"});
      if (sv["cache"]) c.server.cache_bytes = r.bytes(sv["cache"], "server.cache", true);
      if (sv["cache_vram"]) c.server.cache_vram = r.bytes(sv["cache_vram"], "server.cache_vram", true);
      if (sv["host"]) c.server.host = r.scalar(sv["host"], "server.host");
      if (sv["port"]) c.server.port = static_cast<int>(r.integer(sv["port"], "server.port", 0, 65535));
      if (sv["max_queue"]) c.server.max_queue = r.integer(sv["max_queue"], "server.max_queue", 0, 1 << 16);
      if (sv["prefill_chunk"]) c.server.prefill_chunk = r.integer(sv["prefill_chunk"], "server.prefill_chunk", 0, int64_t(1) << 20);
      if (sv["timeout"]) c.server.timeout_s = r.number(sv["timeout"], "server.timeout", 0, 1e9);
      if (sv["max_body"]) c.server.max_body = r.bytes(sv["max_body"], "server.max_body");
    }
    if (const YAML::Node g = root["gpu"]) {
      r.check_keys(g, "gpu", {"memory", "reserve"});
      if (g["memory"]) c.gpu_memory = r.bytes(g["memory"], "gpu.memory");
      if (g["reserve"]) c.gpu_reserve = r.bytes(g["reserve"], "gpu.reserve");
    }
    if (const YAML::Node ctx = root["context"])
      c.context = ctx.IsScalar() && ctx.Scalar() == "auto" ? 0 : r.integer(ctx, "context", 1, int64_t(1) << 24);
    if (root["batch"]) c.batch = static_cast<int>(r.integer(root["batch"], "batch", 1, kMaxBatch));
    if (const YAML::Node cpu = root["cpu"]) {
      r.check_keys(cpu, "cpu", {"threads", "numa"});
      if (cpu["threads"]) c.cpu_threads = static_cast<int>(r.integer(cpu["threads"], "cpu.threads", 0, kMaxThreads));
      if (cpu["numa"]) c.numa = r.choice<std::string>(cpu["numa"], "cpu.numa", {{"auto", "auto"}, {"off", "off"}});
    }
    if (const YAML::Node e = root["experts"]) {
      if (e.IsMap() && e["replace"]) r.fail_at(e["replace"], "experts.replace", "online re-placement was removed (it never paid); delete the key");
      r.check_keys(e, "experts", {"select", "heat", "cpu_format", "gpu_format", "deferral", "link"});
      if (e["select"]) read_select(r, e["select"], c);
      if (e["heat"]) c.heat = r.resolve(r.scalar(e["heat"], "experts.heat"));
      if (e["cpu_format"]) c.cpu_format = format_value(r, e["cpu_format"], "experts.cpu_format", true);
      if (e["gpu_format"]) {
        c.gpu_format = format_value(r, e["gpu_format"], "experts.gpu_format", true);
        if (c.gpu_format != "auto" && c.gpu_format != "int4")
          r.fail_at(e["gpu_format"], "experts.gpu_format",
                    "GPU experts run as stored ('auto') or as int4 ('int4': floating-point experts quantized on load); not " + c.gpu_format);
      }
      if (e["deferral"]) c.deferral = static_cast<int>(r.integer(e["deferral"], "experts.deferral", 0, 64));
      if (const YAML::Node lk = e["link"]) {
        if (lk.IsScalar() && r.scalar(lk, "experts.link") == "off") {  // `link: off`
          c.link_in_place = 0;
        } else if (lk.IsScalar() && r.scalar(lk, "experts.link") == "auto") {
          c.link_auto = true;
        } else if (lk.IsScalar()) {  // `link: N`
          c.link_in_place = static_cast<int>(r.integer(lk, "experts.link", 0, 64));
        } else {
          r.check_keys(lk, "experts.link", {"in_place"});
          if (lk["in_place"]) c.link_in_place = static_cast<int>(r.integer(lk["in_place"], "experts.link.in_place", 0, 64));
        }
      }
    }
    if (const YAML::Node n = root["cpu_experts"]) {
      const std::string v = r.scalar(n, "cpu_experts");
      if (v != "all" && v != "none") r.fail_at(n, "cpu_experts", "'", v, "' must be 'all' or 'none'");
      c.cpu_experts_all = v == "all";
    }
    if (root["gpu_experts_per_layer"])
      c.gpu_experts_per_layer = static_cast<int>(r.integer(root["gpu_experts_per_layer"], "gpu_experts_per_layer", 0, 1 << 16));
    if (c.cpu_experts_all && c.gpu_experts_per_layer > 0)
      r.fail_at(root["gpu_experts_per_layer"], "gpu_experts_per_layer", "contradicts 'cpu_experts: all' (keep one of the two)");
    if (const YAML::Node p = root["prefill"]) {
      r.check_keys(p, "prefill", {"strategy", "gpu_min_tokens", "chunk", "stream_pass"});
      if (p["strategy"])
        c.prefill = r.choice<PrefillStrategy>(p["strategy"], "prefill.strategy",
                                              {{"auto", PrefillStrategy::Auto}, {"cpu", PrefillStrategy::Cpu}, {"gpu_stream", PrefillStrategy::GpuStream}});
      if (p["gpu_min_tokens"]) {
        const YAML::Node m = p["gpu_min_tokens"];
        c.prefill_gpu_min_tokens = m.IsScalar() && m.as<std::string>() == "auto" ? 0 : r.integer(m, "prefill.gpu_min_tokens", 1, int64_t(1) << 24);
      }
      if (const YAML::Node ch = p["chunk"])
        c.prefill_chunk = ch.IsScalar() && ch.as<std::string>() == "auto" ? -1 : r.integer(ch, "prefill.chunk", 0, 4096);
      if (p["stream_pass"]) c.prefill_stream_pass = r.integer(p["stream_pass"], "prefill.stream_pass", 1, 65536);
    }
    if (const YAML::Node b = root["bandwidth"]) {
      r.check_keys(b, "bandwidth", {"gpu", "pcie", "cpu", "host_memory"});
      if (b["gpu"]) c.bw_gpu = r.bandwidth(b["gpu"], "bandwidth.gpu");
      if (b["pcie"]) c.bw_pcie = r.bandwidth(b["pcie"], "bandwidth.pcie");
      if (b["cpu"]) c.bw_cpu = r.bandwidth(b["cpu"], "bandwidth.cpu");
      if (b["host_memory"]) c.bw_host_memory = r.bandwidth(b["host_memory"], "bandwidth.host_memory");
    }
    if (const YAML::Node k = root["cost"]) {
      r.check_keys(k, "cost", {"launch_us", "handoff_us"});
      if (k["launch_us"]) c.launch_us = r.number(k["launch_us"], "cost.launch_us", 0, 1000);
      if (k["handoff_us"]) c.handoff_us = r.number(k["handoff_us"], "cost.handoff_us", 0, 100000);
    }
    if (const YAML::Node rules = root["rules"]) {
      if (!rules.IsSequence()) r.fail_at(rules, "rules", "expected a list of rules (- match: PATTERN, place: gpu|cpu, format: ...)");
      for (size_t i = 0; i < rules.size(); ++i) {
        const YAML::Node n = rules[i];
        const std::string key = str_cat("rules[", i, "]");
        r.check_keys(n, key, {"match", "place", "format"});
        if (!n["match"]) r.fail_at(n, key, "every rule needs 'match: PATTERN'");
        PlacementRule rule;
        rule.line = n.Mark().line + 1;
        rule.match = r.scalar(n["match"], key + ".match");
        if (rule.match.empty()) r.fail_at(n["match"], key + ".match", "the pattern is empty");
        if (n["place"]) rule.place = r.choice<Side>(n["place"], key + ".place", {{"gpu", Side::Gpu}, {"cpu", Side::Cpu}});
        if (n["format"]) rule.format = format_value(r, n["format"], key + ".format", false, true);
        if (!rule.place && rule.format.empty()) r.fail_at(n, key, "a rule needs 'place' or 'format' (or both)");
        c.rules.push_back(rule);
      }
    }
  } catch (const YAML::Exception& e) {
    fail(source, ":", e.mark.line + 1, ": ", e.msg);
  }
  // Presets expand into rules after the user's own (first match wins, so user rules refine presets).
  if (c.cpu_experts_all) c.rules.push_back({"layers.*.mlp.experts.*", Side::Cpu, "", 0});
  if (c.gpu_experts_per_layer >= 0) c.select = ExpertSelection::Uniform;
  c.validate();
  return c;
}

PlacementConfig default_placement_config() {
  PlacementConfig c;
  c.context = 0;
  return c;
}

PlacementConfig load_placement_config(const std::string& path) {
  return parse_placement_config(read_text_file(path, 16 << 20, "the placement config"), path,
                                std::filesystem::path(path).parent_path().string());
}

void PlacementConfig::validate() const {
  if (context < 0) fail(source, ": context must be at least 1, or auto (got ", context, ")");
  if (batch < 1) fail(source, ": batch must be at least 1 (got ", batch, ")");
  if (gpu_memory && gpu_reserve >= gpu_memory)
    fail(source, ": gpu.reserve (", format_gib(gpu_reserve), ") must be below gpu.memory (", format_gib(gpu_memory), ")");
  if (select == ExpertSelection::Layers && (layer_first < 0 || layer_last < layer_first))
    fail(source, ": experts.select layers needs a range like 'layers 0-19'");
}

}  // namespace tandem::placement
