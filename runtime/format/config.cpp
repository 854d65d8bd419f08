#include "runtime/format/config.h"

#include <cctype>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"

namespace tandem {

using json = nlohmann::json;

namespace {

// Whether a GPTQ `dynamic` pattern repeats a repeat, and where. Python's re (GPTQModel's) refuses a
// quantifier on a quantifier ('.?*', 'a**': "multiple repeat"); std::regex takes some of them and then
// backtracks without bound, as it does on a repeated group that itself repeats ('(a*)*', '(.+)+'):
// such a config.json would hang the load on the first module name it is tried on. Module-name patterns
// need neither, so both are refused. Returns "" or what is wrong; other syntax is left to std::regex.
std::string repeated_repeat(const std::string& p) {
  std::vector<bool> repeats(1);  // per open group (the pattern's outermost first): its body has a quantifier
  enum class Prev { None, Atom, Quant, LazyQuant, Group } prev = Prev::None;
  bool closed_repeats = false;  // with prev == Group: the group just closed had a quantifier inside
  auto quantifier_len = [&](size_t i) -> size_t {  // 0: no quantifier at i
    const char c = p[i];
    if (c == '*' || c == '+' || c == '?') return 1;
    if (c != '{') return 0;
    size_t j = i + 1, digits = 0;
    while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j]))) ++j, ++digits;
    if (!digits) return 0;
    if (j < p.size() && p[j] == ',') {
      ++j;
      while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j]))) ++j;
    }
    return j < p.size() && p[j] == '}' ? j + 1 - i : 0;
  };
  for (size_t i = 0; i < p.size();) {
    if (const size_t q = quantifier_len(i)) {
      if (p[i] == '?' && prev == Prev::Quant) {  // lazy: '*?', '+?', '??', '{m,n}?'
        prev = Prev::LazyQuant;
        ++i;
        continue;
      }
      if (prev == Prev::Quant || prev == Prev::LazyQuant)
        return str_cat("'", p.substr(i, q), "' at offset ", i, " of '", p, "' repeats a repeat (Python's re refuses it: multiple repeat)");
      if (prev == Prev::Group && closed_repeats && p[i] != '?')  // '(a+)?' runs the group at most once
        return str_cat("'", p.substr(i, q), "' at offset ", i, " of '", p, "' repeats a group that repeats inside (a nested repeat, which backtracks without bound)");
      repeats.back() = true;
      prev = Prev::Quant;
      i += q;
      continue;
    }
    const char c = p[i];
    if (c == '\\') {
      prev = Prev::Atom;
      i += 2;
    } else if (c == '[') {  // a class: up to its closing ']' (a ']' first in it, or escaped, is a member)
      size_t j = i + 1;
      if (j < p.size() && p[j] == '^') ++j;
      if (j < p.size() && p[j] == ']') ++j;
      while (j < p.size() && p[j] != ']') j += p[j] == '\\' ? 2 : 1;
      prev = Prev::Atom;
      i = j + 1;
    } else if (c == '(') {
      repeats.push_back(false);
      prev = Prev::None;
      i += i + 1 < p.size() && p[i + 1] == '?' ? 3 : 1;  // (?: (?= (?!: the '?' is no quantifier
    } else if (c == ')') {
      if (repeats.size() > 1) {
        closed_repeats = repeats.back();
        repeats.pop_back();
        repeats.back() = repeats.back() || closed_repeats;
      }
      prev = Prev::Group;
      ++i;
    } else {
      prev = c == '|' || c == '^' ? Prev::None : Prev::Atom;
      ++i;
    }
  }
  return "";
}

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr uint64_t kMaxConfigBytes = 16 << 20;  // real config.json files are a few KB

// Typed access to config.json values; every message names the file and the dotted key path.
class Reader {
 public:
  Reader(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  std::string path(const char* key) const { return prefix_ + key; }

  [[noreturn]] void bad(const char* key, const std::string& what) const {
    fail(source_, ": ", path(key), ": ", what, " (found ", has(key) ? printable(obj_[key].dump(), 80) : "nothing", ")");
  }

  int64_t integer(const char* key) const {
    if (!has(key)) fail(source_, ": missing required key '", path(key), "'");
    if (!obj_[key].is_number_integer()) bad(key, "expected an integer");
    if (obj_[key].is_number_unsigned() && obj_[key].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(key, "the integer is out of range");
    return obj_[key].get<int64_t>();
  }
  int64_t integer(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  int64_t positive(const char* key) const {
    const int64_t v = integer(key);
    if (v <= 0) bad(key, "expected a positive integer");
    return v;
  }
  int64_t positive(const char* key, int64_t dflt) const { return has(key) ? positive(key) : dflt; }
  // Range-checked before narrowing: a value above 2^32 is an error naming the key, never its low bits.
  template <typename T>
  T integer_in(const char* key, T lo, T hi) const {
    return narrow<T>(integer(key), str_cat(source_, ": ", path(key)), lo, hi);
  }
  template <typename T>
  T integer_in(const char* key, T dflt, T lo, T hi) const {
    return has(key) ? integer_in<T>(key, lo, hi) : dflt;
  }
  template <typename T>
  T positive_in(const char* key, T hi) const {
    return narrow<T>(positive(key), str_cat(source_, ": ", path(key)), 1, hi);
  }
  template <typename T>
  T positive_in(const char* key, T dflt, T hi) const {
    return has(key) ? positive_in<T>(key, hi) : dflt;
  }
  int positive_int(const char* key) const { return positive_in<int>(key, INT_MAX); }
  int positive_int(const char* key, int dflt) const { return positive_in<int>(key, dflt, INT_MAX); }
  double number(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    if (!obj_[key].is_number()) bad(key, "expected a number");
    return obj_[key].get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!obj_[key].is_boolean()) bad(key, "expected true or false");
    return obj_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!obj_[key].is_string()) bad(key, "expected a string");
    return obj_[key].get<std::string>();
  }
  const json& at(const char* key) const { return obj_[key]; }
  Reader child(const char* key) const {
    if (!obj_[key].is_object()) bad(key, "expected a JSON object");
    return Reader(obj_[key], source_, path(key) + ".");
  }
  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

std::vector<int64_t> token_ids(const Reader& r, const char* key) {
  std::vector<int64_t> out;
  if (!r.has(key)) return out;
  const json& v = r.at(key);
  if (v.is_number_integer()) {
    out.push_back(v.get<int64_t>());
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_number_integer()) r.bad(key, "expected an integer or a list of integers");
      out.push_back(e.get<int64_t>());
    }
  } else {
    r.bad(key, "expected an integer or a list of integers");
  }
  return out;
}

void parse_rope(const Reader& t, ModelConfig& c) {
  // Current HF configs nest RoPE settings in rope_parameters; older ones keep them at top level.
  c.rope_theta = t.number("rope_theta", c.rope_theta);
  c.partial_rotary_factor = t.number("partial_rotary_factor", c.partial_rotary_factor);
  if (t.has("rope_scaling")) t.bad("rope_scaling", "RoPE scaling is not supported; use rope_parameters with rope_type 'default'");
  if (t.has("rope_parameters")) {
    const Reader rp = t.child("rope_parameters");
    const std::string type = rp.string("rope_type", "default");
    if (type != "default") rp.bad("rope_type", "only rope_type 'default' is supported");
    c.rope_theta = rp.number("rope_theta", c.rope_theta);
    c.partial_rotary_factor = rp.number("partial_rotary_factor", c.partial_rotary_factor);
    if (!(c.rope_theta > 0)) rp.bad("rope_theta", "expected a positive number");
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
      rp.bad("partial_rotary_factor", "expected a number in (0, 1]");
  }
  if (!(c.rope_theta > 0)) t.bad("rope_theta", "expected a positive number");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    t.bad("partial_rotary_factor", "expected a number in (0, 1]");
}

void parse_quant(const Reader& q, QuantConfig& out) {
  const std::string method = q.string("quant_method", "");
  if (method != "gptq") q.bad("quant_method", "only 'gptq' quantization is supported");
  out.gptq = true;
  out.bits = q.integer_in<int>("bits", 4, INT_MIN, INT_MAX);
  if (out.bits != 4) q.bad("bits", "unsupported bits: Tandem reads 4-bit GPTQ checkpoints");
  out.group_size = q.integer_in<int>("group_size", 128, INT_MIN, INT_MAX);
  if (out.group_size != -1 && out.group_size <= 0) q.bad("group_size", "expected -1 or a positive integer");
  out.sym = q.boolean("sym", true);
  out.desc_act = q.boolean("desc_act", false);
  if (q.boolean("lm_head", false)) q.bad("lm_head", "a quantized lm_head is not supported");
  const std::string fmt = q.string("checkpoint_format", "");
  if (fmt == "gptq") out.zero_format = GptqZeroFormat::V1;
  else if (fmt == "gptq_v2") out.zero_format = GptqZeroFormat::V2;
  else if (fmt.empty()) out.zero_format = GptqZeroFormat::Unknown;
  else q.bad("checkpoint_format", "expected 'gptq' or 'gptq_v2'");

  if (q.has("dynamic")) {
    const Reader d = q.child("dynamic");
    for (auto& [key, val] : q.at("dynamic").items()) {
      GptqDynamicRule rule;
      std::string pat = key;
      if (pat.rfind("-:", 0) == 0) {
        rule.exclude = true;
        pat = pat.substr(2);
      } else if (pat.rfind("+:", 0) == 0) {
        pat = pat.substr(2);
      }
      rule.pattern = pat;
      if (const std::string why = repeated_repeat(pat); !why.empty()) d.bad(key.c_str(), str_cat("refused regular expression: ", why));
      try {
        rule.regex = std::make_shared<const std::regex>(pat, std::regex::ECMAScript | std::regex::optimize);
      } catch (const std::regex_error& e) {
        d.bad(key.c_str(), str_cat("invalid regular expression (", e.what(), ")"));
      }
      if (!val.is_object()) d.bad(key.c_str(), "expected an object of overrides");
      const Reader o = d.child(key.c_str());
      rule.bits = o.integer_in<int>("bits", 0, INT_MIN, INT_MAX);
      if (rule.bits != 0 && rule.bits != 4) o.bad("bits", "unsupported bits: Tandem reads 4-bit GPTQ checkpoints");
      rule.group_size = o.integer_in<int>("group_size", 0, INT_MIN, INT_MAX);
      if (o.has("sym")) rule.sym = o.boolean("sym", true) ? 1 : 0;
      if (o.has("desc_act")) rule.desc_act = o.boolean("desc_act", false) ? 1 : 0;
      out.dynamic.push_back(std::move(rule));
    }
  }
}

}  // namespace

QuantConfig::ModuleQuant QuantConfig::for_module(const std::string& module_name) const {
  ModuleQuant m;
  m.quantized = gptq;
  m.bits = bits;
  m.group_size = group_size;
  m.sym = sym;
  m.desc_act = desc_act;
  if (!gptq) return m;
  // GPTQModel semantics: rules are tried in order, matched from the start of the name; first match wins.
  for (const auto& r : dynamic) {
    if (!std::regex_search(module_name, *r.regex, std::regex_constants::match_continuous)) continue;
    if (r.exclude) {
      m.quantized = false;
      return m;
    }
    if (r.bits) m.bits = r.bits;
    if (r.group_size) m.group_size = r.group_size;
    if (r.sym >= 0) m.sym = r.sym;
    if (r.desc_act >= 0) m.desc_act = r.desc_act;
    return m;
  }
  return m;
}

int ModelConfig::num_full_attention_layers() const {
  int n = 0;
  for (LayerKind k : layer_types) n += k == LayerKind::FullAttention;
  return n;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(source, ": not valid JSON (", e.what(), ")");
  }
  if (!root.is_object()) fail(source, ": expected a JSON object");
  const Reader top(root, source, "");

  ModelConfig c;
  c.source = source;
  const std::string model_type = top.string("model_type", "");
  if (model_type == "qwen3_5_moe") {
    c.composite = true;
    if (!top.has("text_config")) fail(source, ": model_type 'qwen3_5_moe' needs a 'text_config' object");
  } else if (model_type != "qwen3_5_moe_text") {
    top.bad("model_type", "expected 'qwen3_5_moe' or 'qwen3_5_moe_text'");
  }
  const Reader t = c.composite ? top.child("text_config") : top;
  c.model_type = t.string("model_type", "qwen3_5_moe_text");
  if (c.model_type != "qwen3_5_moe_text") t.bad("model_type", "expected 'qwen3_5_moe_text'");

  // Token ids are int32; matrix sizes up to 2^24 keep every product of two of them in int64.
  c.vocab_size = t.positive_in<int64_t>("vocab_size", INT32_MAX);
  c.hidden_size = t.positive_in<int64_t>("hidden_size", kMaxDim);
  c.num_layers = t.positive_int("num_hidden_layers");
  c.num_heads = t.positive_int("num_attention_heads");
  c.num_kv_heads = t.positive_int("num_key_value_heads", c.num_heads);
  c.head_dim = t.has("head_dim") ? t.positive_int("head_dim") : narrow<int>(c.hidden_size / c.num_heads, "head_dim");
  c.linear_num_key_heads = t.positive_int("linear_num_key_heads");
  c.linear_num_value_heads = t.positive_int("linear_num_value_heads");
  c.linear_key_head_dim = t.positive_int("linear_key_head_dim");
  c.linear_value_head_dim = t.positive_int("linear_value_head_dim");
  c.linear_conv_kernel = t.positive_int("linear_conv_kernel_dim", 4);
  c.num_experts = t.positive_int("num_experts");
  c.num_experts_per_tok = t.positive_int("num_experts_per_tok");
  c.moe_intermediate_size = t.positive_in<int64_t>("moe_intermediate_size", kMaxDim);
  c.shared_expert_intermediate_size = t.positive_in<int64_t>("shared_expert_intermediate_size", kMaxDim);
  c.mtp_layers = narrow<int>(t.integer("mtp_num_hidden_layers", 0), "mtp_num_hidden_layers", 0, 16);
  c.rms_norm_eps = t.number("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) t.bad("rms_norm_eps", "expected a positive number");
  c.max_position_embeddings = t.positive_in<int64_t>("max_position_embeddings", 262144, INT32_MAX);
  c.tie_word_embeddings = t.boolean("tie_word_embeddings", top.boolean("tie_word_embeddings", false));
  c.eos_token_ids = token_ids(t, "eos_token_id");
  if (c.eos_token_ids.empty()) c.eos_token_ids = token_ids(top, "eos_token_id");
  c.bos_token_id = t.integer("bos_token_id", -1);

  const std::string act = t.string("hidden_act", "silu");
  if (act != "silu") t.bad("hidden_act", "only 'silu' is supported");
  if (t.boolean("attention_bias", false)) t.bad("attention_bias", "biases in attention are not supported (Qwen3.5 has none)");
  if (!t.boolean("attn_output_gate", true)) t.bad("attn_output_gate", "Qwen3.5 attention is always gated; false is not supported");
  if (t.has("mlp_only_layers") && !(t.at("mlp_only_layers").is_array() && t.at("mlp_only_layers").empty()))
    t.bad("mlp_only_layers", "dense MLP layers are not supported (every Qwen3.5-MoE layer is MoE)");

  if (t.has("layer_types")) {
    const json& lt = t.at("layer_types");
    if (!lt.is_array()) t.bad("layer_types", "expected a list");
    if (static_cast<int64_t>(lt.size()) != c.num_layers)
      fail(source, ": ", t.path("layer_types"), " has ", lt.size(), " entries but num_hidden_layers is ", c.num_layers);
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string k = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (k == "linear_attention") c.layer_types.push_back(LayerKind::LinearAttention);
      else if (k == "full_attention") c.layer_types.push_back(LayerKind::FullAttention);
      else fail(source, ": ", t.path("layer_types"), "[", i, "] = ", lt[i].dump(),
                ": expected \"linear_attention\" or \"full_attention\"");
    }
  } else {
    const int64_t interval = t.positive("full_attention_interval", 4);
    for (int i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerKind::FullAttention : LayerKind::LinearAttention);
  }

  parse_rope(t, c);
  c.rotary_dim = static_cast<int>(c.head_dim * c.partial_rotary_factor);
  c.rotary_dim -= c.rotary_dim % 2;

  if (top.has("quantization_config")) parse_quant(top.child("quantization_config"), c.quant);
  else if (t.has("quantization_config")) parse_quant(t.child("quantization_config"), c.quant);

  c.validate();
  return c;
}

void ModelConfig::validate() const {
  auto bad = [&](const char* key, const auto&... why) { fail(source, ": ", composite ? "text_config." : "", key, ": ", why...); };
  if (num_kv_heads > num_heads || num_heads % num_kv_heads != 0)
    bad("num_key_value_heads", num_kv_heads, " does not divide num_attention_heads ", num_heads);
  if (linear_num_value_heads % linear_num_key_heads != 0)
    bad("linear_num_value_heads", linear_num_value_heads, " is not a multiple of linear_num_key_heads ",
        linear_num_key_heads);
  if (num_experts_per_tok > num_experts)
    bad("num_experts_per_tok", num_experts_per_tok, " is more than num_experts ", num_experts);
  if (rotary_dim < 2) bad("partial_rotary_factor", partial_rotary_factor, " x head_dim ", head_dim, " leaves no rotary dims");
  if (linear_conv_kernel < 1 || linear_conv_kernel > 16) bad("linear_conv_kernel_dim", linear_conv_kernel, " is out of range 1..16");
  if (static_cast<int>(layer_types.size()) != num_layers) bad("layer_types", "size differs from num_hidden_layers");
  for (int64_t id : eos_token_ids)
    if (id < 0 || id >= vocab_size) bad("eos_token_id", id, " is outside the vocabulary of ", vocab_size);
  if (quant.gptq && quant.group_size > 0) {
    // Every quantized matrix's input dimension must be a multiple of the group size.
    for (int64_t in : {hidden_size, moe_intermediate_size})
      if (in % quant.group_size != 0)
        fail(source, ": quantization_config.group_size ", quant.group_size, " does not divide the input size ", in);
  }
}

ModelConfig load_model_config(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  fs::path p(dir_or_file);
  std::error_code ec;
  if (fs::is_directory(p, ec)) p /= "config.json";
  if (!fs::exists(fs::symlink_status(p, ec))) fail(p.string(), ": cannot open (no such file; is this a model folder?)");
  return parse_model_config(read_text_file(p.string(), kMaxConfigBytes, "the model config"), p.string());
}

}  // namespace tandem
