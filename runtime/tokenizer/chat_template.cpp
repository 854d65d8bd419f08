#include "runtime/tokenizer/chat_template.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem {

using ojson = nlohmann::ordered_json;

namespace {

// --- Python's text and JSON semantics -------------------------------------------------------------------

bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point of the UTF-8 sequence at s[i..], its length in `len`; 0 with len 0 when malformed.
uint32_t utf8_at(std::string_view s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) return len = 0, 0;
  if (len == 1) return c;
  uint32_t cp = c & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return len = 0, 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  return cp;
}

std::string_view rstrip_char(std::string_view s, char c) {
  while (!s.empty() && s.back() == c) s.remove_suffix(1);
  return s;
}

std::string_view lstrip_char(std::string_view s, char c) {
  while (!s.empty() && s.front() == c) s.remove_prefix(1);
  return s;
}

// repr(float): the shortest digits that round-trip, positional for exponents -4..15, else d.ddde+XX.
std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  std::string sign;
  if (s[0] == '-') sign = "-", s.erase(0, 1);
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // "d.ddd" -> "dddd"
  const int decpt = std::stoi(s.substr(e + 1)) + 1;
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (decpt <= -4 || decpt > 16) {
    out = digits.substr(0, 1) + (n > 1 ? "." + digits.substr(1) : "");
    const int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    out += (std::abs(x) < 10 ? "0" : "") + std::to_string(std::abs(x));
  } else if (decpt <= 0) {
    out = "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= n) {
    out = digits + std::string(decpt - n, '0') + ".0";
  } else {
    out = digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return sign + out;
}

void dump_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char u[8];
          std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(ch));
          out += u;
        } else {
          out += ch;  // ensure_ascii=False: UTF-8 passes through
        }
    }
  }
  out += '"';
}

void dump(std::string& out, const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: {
      const double d = v.get<double>();  // json.dumps spells the non-finite ones NaN / Infinity
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float_repr(d);
      break;
    }
    case ojson::value_t::string: dump_string(out, v.get_ref<const std::string&>()); break;
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& x : v) {
        if (!first) out += ", ";
        first = false;
        dump(out, x);
      }
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(out, k);
        out += ": ";
        dump(out, x);
      }
      out += '}';
      break;
    }
    default: fail("json: binary values have no JSON text");
  }
}

// Jinja's `string` filter on a JSON scalar: Python's str().
std::string python_str(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "None";
    case ojson::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case ojson::value_t::number_float: return python_float_repr(v.get<double>());
    case ojson::value_t::string: return v.get<std::string>();
    default: return json_dumps_python(v);  // integers (same text); objects and lists never come here
  }
}

ojson parse_json(const std::string& text, const std::string& what) {
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("chat: ", what, " is not valid JSON (", e.what(), ")");
  }
}

// --- the template ---------------------------------------------------------------------------------------

const char* const kToolsHeader = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
const char* const kToolsFooter =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, but "
    "NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

// The template's image / video counters (namespaces that live across the whole rendering).
struct VisionCount {
  int images = 0, videos = 0;
};

// The template's render_content macro: text as is, parts in order, vision placeholders counted when
// `count` (the main pass) and numbered with add_vision_id.
std::string render_content(const ChatMessage& m, size_t index, bool count, bool is_system, VisionCount& vc,
                           bool add_vision_id) {
  if (m.parts.empty()) return m.content;
  if (!m.content.empty()) fail("chat: messages[", index, "] has both content text and content parts; give one");
  std::string out;
  for (size_t j = 0; j < m.parts.size(); ++j) {
    const ContentPart& p = m.parts[j];
    if (p.kind == ContentPart::Kind::text) {
      out += p.text;
      continue;
    }
    const bool image = p.kind == ContentPart::Kind::image;
    if (is_system)
      fail("chat: ", image ? "System message cannot contain images." : "System message cannot contain videos.",
           " (messages[", index, "].content[", j, "])");
    int& n = image ? vc.images : vc.videos;
    if (count) ++n;
    if (add_vision_id) out += (image ? "Picture " : "Video ") + std::to_string(n) + ": ";
    out += image ? "<|vision_start|><|image_pad|><|vision_end|>" : "<|vision_start|><|video_pad|><|vision_end|>";
  }
  return out;
}

std::string render_argument(const std::string& json_text, const ToolCall& c, const std::string& param) {
  const ojson v = parse_json(json_text, "the value of parameter '" + param + "' of tool call '" + c.name + "'");
  return v.is_object() || v.is_array() ? json_dumps_python(v) : python_str(v);
}

}  // namespace

std::string json_dumps_python(const ojson& value) {
  std::string out;
  dump(out, value);
  return out;
}

std::string python_strip(std::string_view s) {
  size_t a = 0, b = s.size(), len = 0;
  while (a < b) {
    const uint32_t cp = utf8_at(s, a, len);
    if (len == 0 || !is_python_space(cp)) break;
    a += len;
  }
  while (b > a) {
    size_t start = b - 1;  // back to the lead byte of the last sequence
    while (start > a && b - start < 4 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    const uint32_t cp = utf8_at(s, start, len);
    if (len == 0 || start + len != b || !is_python_space(cp)) break;
    b = start;
  }
  return std::string(s.substr(a, b - a));
}

std::pair<std::string, std::string> split_reasoning(const std::string& text) {
  const size_t end = text.find("</think>");
  if (end == std::string::npos) return {{}, text};
  std::string_view before = rstrip_char(std::string_view(text).substr(0, end), '\n');
  if (const size_t open = before.rfind("<think>"); open != std::string_view::npos) before.remove_prefix(open + 7);
  const std::string_view after = lstrip_char(std::string_view(text).substr(text.rfind("</think>") + 8), '\n');
  return {python_strip(lstrip_char(before, '\n')), std::string(after)};
}

std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& opts) {
  if (messages.empty()) fail("chat: No messages provided. (give at least one user message)");
  VisionCount vc;
  std::string out;
  const bool system_first = messages[0].role == "system";
  if (!opts.tools.empty()) {
    out += "<|im_start|>system\n";
    out += kToolsHeader;
    for (size_t i = 0; i < opts.tools.size(); ++i)
      out += "\n" + json_dumps_python(parse_json(opts.tools[i], "tools[" + std::to_string(i) + "]"));
    out += kToolsFooter;
    if (system_first) {
      const std::string content = python_strip(render_content(messages[0], 0, false, true, vc, opts.add_vision_id));
      if (!content.empty()) out += "\n\n" + content;
    }
    out += "<|im_end|>\n";
  } else if (system_first) {
    out += "<|im_start|>system\n" + python_strip(render_content(messages[0], 0, false, true, vc, opts.add_vision_id)) +
           "<|im_end|>\n";
  }

  // The last real user query: a user turn that is not tool output pasted whole in <tool_response> tags.
  std::optional<size_t> last_query;
  for (size_t i = messages.size(); i-- > 0 && !last_query;) {
    if (messages[i].role != "user") continue;
    const std::string c = python_strip(render_content(messages[i], i, false, false, vc, opts.add_vision_id));
    if (!(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) last_query = i;
  }
  if (!last_query) fail("chat: No user query found in messages. (the conversation needs a user message)");

  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string content = python_strip(render_content(m, i, true, false, vc, opts.add_vision_id));
    if (m.role == "system") {
      if (i != 0) fail("chat: System message must be at the beginning. (found one at messages[", i, "])");
    } else if (m.role == "user") {
      out += "<|im_start|>user\n" + content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string reasoning;
      if (m.reasoning) {
        reasoning = python_strip(*m.reasoning);
      } else if (content.find("</think>") != std::string::npos) {
        std::tie(reasoning, content) = split_reasoning(content);
      }
      out += "<|im_start|>assistant\n";
      if (i > *last_query || (opts.preserve_thinking && !reasoning.empty())) out += "<think>\n" + reasoning + "\n</think>\n\n";
      out += content;
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        const ToolCall& c = m.tool_calls[j];
        out += j > 0 ? "\n<tool_call>\n<function=" : python_strip(content).empty() ? "<tool_call>\n<function="
                                                                                   : "\n\n<tool_call>\n<function=";
        out += c.name + ">\n";
        for (const auto& [k, v] : c.arguments) out += "<parameter=" + k + ">\n" + render_argument(v, c, k) + "\n</parameter>\n";
        out += "</function>\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i > 0 && messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      fail("chat: Unexpected message role. (messages[", i, "] has role '", m.role,
           "'; expected system, user, assistant or tool)");
    }
  }
  if (opts.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += opts.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out;
}

// --- OpenAI-shaped JSON ---------------------------------------------------------------------------------

namespace {

const char* json_type_name(const ojson& v) { return v.type_name(); }

ContentPart content_part_from_json(const ojson& item, const std::string& where) {
  // The template's order: image keys first, then video, then text.
  const auto type_is = [&](const char* t) { return item.contains("type") && item["type"] == t; };
  if (!item.is_object())
    fail("chat: Unexpected item type in content. (", where, " is a ", json_type_name(item), "; expected an object)");
  if (item.contains("image") || item.contains("image_url") || type_is("image")) return {ContentPart::Kind::image, {}};
  if (item.contains("video") || type_is("video")) return {ContentPart::Kind::video, {}};
  if (item.contains("text")) {
    const ojson& t = item["text"];
    if (t.is_object() || t.is_array()) fail("chat: ", where, ".text must be text (got ", json_type_name(t), ")");
    return {ContentPart::Kind::text, python_str(t)};
  }
  fail("chat: Unexpected item type in content. (", where, " has no text, image, image_url or video)");
}

ToolCall tool_call_from_json(const ojson& call, const std::string& where) {
  if (!call.is_object()) fail("chat: ", where, " must be an object (got ", json_type_name(call), ")");
  const bool wrapped = call.contains("function");
  const ojson& f = wrapped ? call["function"] : call;
  const std::string fw = wrapped ? where + ".function" : where;
  if (!f.is_object()) fail("chat: ", fw, " must be an object (got ", json_type_name(f), ")");
  if (!f.contains("name") || !f["name"].is_string()) fail("chat: ", fw, ".name must be a string");
  ToolCall c;
  c.name = f["name"].get<std::string>();
  if (!f.contains("arguments")) return c;
  const ojson& a = f["arguments"];
  ojson args;
  if (a.is_string()) {  // OpenAI sends the arguments as JSON text
    const std::string& text = a.get_ref<const std::string&>();
    args = python_strip(text).empty() ? ojson::object() : parse_json(text, fw + ".arguments");
  } else {
    args = a;
  }
  if (!args.is_object())
    fail("chat: ", fw, ".arguments must be an object or a JSON string of one (got ", json_type_name(args), ")");
  for (const auto& [k, v] : args.items()) c.arguments.emplace_back(k, v.dump());
  return c;
}

}  // namespace

ChatMessage chat_message_from_json(const ojson& m, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "]";
  if (!m.is_object()) fail("chat: ", where, " must be an object like {\"role\": \"user\", \"content\": \"...\"}");
  if (!m.contains("role") || !m["role"].is_string()) fail("chat: ", where, ".role must be a string");
  ChatMessage out;
  out.role = m["role"].get<std::string>();
  if (m.contains("content")) {
    const ojson& c = m["content"];
    if (c.is_string()) {
      out.content = c.get<std::string>();
    } else if (c.is_array()) {
      for (size_t j = 0; j < c.size(); ++j)
        out.parts.push_back(content_part_from_json(c[j], where + ".content[" + std::to_string(j) + "]"));
    } else if (!c.is_null()) {
      fail("chat: Unexpected content type. (", where, ".content is a ", json_type_name(c),
           "; expected text, a list of parts or null)");
    }
  }
  if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
    if (!m["reasoning_content"].is_string()) fail("chat: ", where, ".reasoning_content must be a string");
    out.reasoning = m["reasoning_content"].get<std::string>();
  }
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    const ojson& calls = m["tool_calls"];
    if (!calls.is_array()) fail("chat: ", where, ".tool_calls must be a list (got ", json_type_name(calls), ")");
    for (size_t j = 0; j < calls.size(); ++j)
      out.tool_calls.push_back(tool_call_from_json(calls[j], where + ".tool_calls[" + std::to_string(j) + "]"));
  }
  return out;
}

std::vector<ChatMessage> chat_messages_from_json(const ojson& messages) {
  if (!messages.is_array()) fail("chat: messages must be a list (got ", json_type_name(messages), ")");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) out.push_back(chat_message_from_json(messages[i], i));
  return out;
}

std::vector<std::string> chat_tools_from_json(const ojson& tools) {
  if (tools.is_null()) return {};
  if (!tools.is_array()) fail("chat: tools must be a list (got ", json_type_name(tools), ")");
  std::vector<std::string> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    const ojson v = t.is_string() ? parse_json(t.get<std::string>(), where) : t;
    if (!v.is_object()) fail("chat: ", where, " must be an object (got ", json_type_name(v), ")");
    out.push_back(v.dump());
  }
  return out;
}

// --- the model folder's own template --------------------------------------------------------------------

uint64_t chat_template_fingerprint(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto add = [&](unsigned char c) { h = (h ^ c) * 0x100000001b3ull; };
  if (text.ends_with("\r\n")) text.remove_suffix(2);
  else if (text.ends_with("\n")) text.remove_suffix(1);
  for (size_t i = 0; i < text.size(); ++i)
    if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) add(static_cast<unsigned char>(text[i]));
  return h;
}

namespace {

// A regular file's text, or nothing when it is absent, not a regular file, larger than `limit` or unreadable.
std::optional<std::string> read_bounded(const std::filesystem::path& p, uintmax_t limit) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;  // follows links (HF cache folders)
  const uintmax_t size = std::filesystem::file_size(p, ec);
  if (ec || size > limit) return std::nullopt;
  std::ifstream f(p, std::ios::binary);
  std::string text(size, '\0');
  if (!f.read(text.data(), static_cast<std::streamsize>(size))) return std::nullopt;
  return text;
}

}  // namespace

std::string chat_template_note(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const char* const tail = " differs from the Qwen3.5 template Tandem renders natively; chats use Tandem's rendering";
  const std::filesystem::path jinja = dir / "chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::exists(jinja, ec)) {  // HF reads this file before tokenizer_config.json
    const std::optional<std::string> text = read_bounded(jinja, 1u << 20);
    if (!text) return "note: " + jinja.string() + " could not be read as a template (not a regular file, or over 1 MiB); chats use Tandem's rendering";
    return chat_template_fingerprint(*text) == kQwen35ChatTemplateFingerprint ? "" : "note: " + jinja.string() + tail;
  }
  const std::filesystem::path cfg = dir / "tokenizer_config.json";
  const std::optional<std::string> text = read_bounded(cfg, 64u << 20);
  if (!text) return "";
  const ojson j = ojson::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("chat_template")) return "";
  const ojson& t = j["chat_template"];
  std::string tmpl;
  if (t.is_string()) {
    tmpl = t.get<std::string>();
  } else if (t.is_array()) {  // named templates: HF uses the one named "default"
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        tmpl = e["template"].get<std::string>();
  }
  if (!tmpl.empty() && chat_template_fingerprint(tmpl) == kQwen35ChatTemplateFingerprint) return "";
  return "note: " + cfg.string() + "'s chat_template" + tail;
}

}  // namespace tandem
