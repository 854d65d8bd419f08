#include "runtime/engine/reply_parser.h"

#include <algorithm>
#include <charconv>

namespace tandem {

namespace {

using json = nlohmann::json;

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>", kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr std::string_view kFunction = "<function=", kFunctionClose = "</function>", kParam = "<parameter=", kParamClose = "</parameter>";
constexpr size_t kMaxName = 256;  // a longer function or parameter name is not one

std::string dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

// The longest suffix of `s` that is a proper prefix of `tag` (text that may be the start of it).
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

void trim_front(std::string& s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  s.erase(0, i);
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// `s` (non-empty) is the start of one of `tags` but not yet all of it.
bool may_become(std::string_view s, std::initializer_list<std::string_view> tags) {
  for (std::string_view t : tags)
    if (s.size() < t.size() && t.substr(0, s.size()) == s) return true;
  return false;
}

// A value's text as the JSON the schema's type asks for, or nothing when it does not parse as it.
bool as_type(const std::string& type, std::string_view raw, json& out) {
  const std::string_view t = trimmed(raw);
  if (type == "null") {
    if (t == "null" || t == "None") return out = nullptr, true;
  } else if (type == "boolean") {
    if (t == "true" || t == "True") return out = true, true;
    if (t == "false" || t == "False") return out = false, true;
  } else if (type == "integer") {
    int64_t v = 0;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (!t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size()) return out = v, true;
  } else if (type == "number" || type == "object" || type == "array") {
    json v = json::parse(t, nullptr, false);
    if (v.is_discarded()) return false;
    if ((type == "number" && v.is_number()) || (type == "object" && v.is_object()) || (type == "array" && v.is_array())) return out = v, true;
  }
  return false;
}

}  // namespace

ReplyParser::ReplyParser(bool thinking, const json& tools) : mode_(thinking ? Mode::Reasoning : Mode::Content) {
  if (!tools.is_array()) return;
  for (const json& t : tools) {
    const json& f = t.is_object() && t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    const json* props = nullptr;
    if (f.contains("parameters") && f["parameters"].is_object() && f["parameters"].contains("properties") &&
        f["parameters"]["properties"].is_object())
      props = &f["parameters"]["properties"];
    schemas_[f["name"].get<std::string>()] = props ? *props : json::object();
  }
}

std::string ReplyParser::typed(const std::string& fn, const std::string& arg, const std::string& raw) const {
  const auto f = schemas_.find(fn);
  if (f == schemas_.end() || !f->contains(arg) || !(*f)[arg].is_object() || !(*f)[arg].contains("type")) return dump(raw);
  const json& type = (*f)[arg]["type"];
  std::vector<std::string> types;
  if (type.is_string()) types.push_back(type.get<std::string>());
  else if (type.is_array())
    for (const json& x : type)
      if (x.is_string()) types.push_back(x.get<std::string>());
  json v;
  for (const char* want : {"null", "boolean", "integer", "number", "object", "array"})  // strings last: they take anything
    if (std::find(types.begin(), types.end(), want) != types.end() && as_type(want, raw, v)) return dump(v);
  return dump(raw);
}

void ReplyParser::emit_reasoning(ReplyDelta& d, std::string_view s) {
  d.reasoning += s;
  reply_.reasoning += s;
}

void ReplyParser::emit_content(ReplyDelta& d, std::string_view s) {
  d.content += s;
  reply_.content += s;
}

void ReplyParser::emit_args(ReplyDelta& d, const std::string& s) {
  const int index = static_cast<int>(reply_.tool_calls.size()) - 1;
  reply_.tool_calls.back().arguments += s;
  if (d.tool_calls.empty() || d.tool_calls.back().index != index) d.tool_calls.push_back({index, "", "", ""});
  d.tool_calls.back().arguments += s;
}

void ReplyParser::close_call(ReplyDelta& d) {
  emit_args(d, params_ ? "}" : "{}");
  params_ = 0;
  after_call_ = true;
}

void ReplyParser::step(ReplyDelta& d, bool at_end) {
  for (;;) {
    switch (mode_) {
      case Mode::Reasoning: {
        if (!reasoning_started_ && !buf_.empty()) {  // a model that writes its own opening tag
          if (buf_.rfind(kThinkOpen, 0) == 0) {
            buf_.erase(0, kThinkOpen.size());
            think_tag_ = true;
          } else if (!at_end && may_become(buf_, {kThinkOpen})) {
            return;
          }
          reasoning_started_ = true;
        }
        if (think_tag_ && !buf_.empty()) {
          if (buf_[0] == '\n') buf_.erase(0, 1);
          think_tag_ = false;
        }
        const size_t at = buf_.find(kThinkClose);
        if (at != std::string::npos) {
          std::string_view r(buf_.data(), at);
          if (!r.empty() && r.back() == '\n') r.remove_suffix(1);
          emit_reasoning(d, r);
          buf_.erase(0, at + kThinkClose.size());
          mode_ = Mode::AfterThink;
          continue;
        }
        const size_t hold = at_end ? 0 : std::max(partial_tag(buf_, "\n</think>"), partial_tag(buf_, kThinkClose));
        emit_reasoning(d, std::string_view(buf_).substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case Mode::AfterThink: {
        size_t i = 0;
        while (i < buf_.size() && buf_[i] == '\n') ++i;
        buf_.erase(0, i);
        if (buf_.empty()) return;
        mode_ = Mode::Content;
        continue;
      }
      case Mode::Content: {
        if (after_call_) {  // whitespace between calls (and after the last) is not content
          size_t i = 0;
          while (i < buf_.size() && is_space(buf_[i])) ++i;
          if (i == buf_.size()) {
            if (at_end) buf_.clear();
            return;
          }
          const std::string_view after = std::string_view(buf_).substr(i);
          if (after.rfind(kCallOpen, 0) == 0) buf_.erase(0, i);  // the next call: the whitespace was between calls
          else if (!at_end && may_become(after, {kCallOpen})) return;  // not known yet: hold it all
          else after_call_ = false;                                    // text after a call, its whitespace with it
        }
        const size_t at = buf_.find(kCallOpen);
        if (at != std::string::npos) {
          emit_content(d, std::string_view(buf_).substr(0, at));
          buf_.erase(0, at + kCallOpen.size());
          mode_ = Mode::CallHead;
          continue;
        }
        const size_t hold = at_end ? 0 : partial_tag(buf_, kCallOpen);
        emit_content(d, std::string_view(buf_).substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case Mode::CallHead: {
        trim_front(buf_);
        const std::string_view rest = buf_;
        const size_t gt = rest.rfind(kFunction, 0) == 0 ? rest.find('>', kFunction.size()) : std::string::npos;
        if (gt != std::string::npos && gt > kFunction.size() && gt - kFunction.size() <= kMaxName &&
            rest.substr(kFunction.size(), gt - kFunction.size()).find_first_of("<\n") == std::string_view::npos) {
          const std::string name(rest.substr(kFunction.size(), gt - kFunction.size()));
          const int index = static_cast<int>(reply_.tool_calls.size());
          const std::string id = "call_" + std::to_string(index);
          reply_.tool_calls.push_back({id, name, ""});
          d.tool_calls.push_back({index, id, name, ""});
          buf_.erase(0, gt + 1);
          params_ = 0;
          after_call_ = false;
          mode_ = Mode::Params;
          continue;
        }
        const bool waiting = rest.empty() || may_become(rest, {kFunction}) ||
                             (rest.rfind(kFunction, 0) == 0 && gt == std::string::npos && rest.size() <= kFunction.size() + kMaxName &&
                              rest.find_first_of("<\n", kFunction.size()) == std::string_view::npos);
        if (!at_end && waiting) return;
        emit_content(d, kCallOpen);  // not a call: the tag and what follows are text
        mode_ = Mode::Content;
        continue;
      }
      case Mode::Params: {
        trim_front(buf_);
        const std::string_view rest = buf_;
        if (rest.rfind(kParam, 0) == 0) {
          const size_t gt = rest.find('>', kParam.size());
          const size_t end = gt == std::string::npos ? std::string::npos : rest.find(kParamClose, gt + 1);
          const bool name_ok = gt != std::string::npos && gt > kParam.size() && gt - kParam.size() <= kMaxName &&
                               rest.substr(kParam.size(), gt - kParam.size()).find_first_of("<\n") == std::string_view::npos;
          if (name_ok && end != std::string::npos) {
            const std::string arg(rest.substr(kParam.size(), gt - kParam.size()));
            std::string raw(rest.substr(gt + 1, end - gt - 1));
            if (!raw.empty() && raw.front() == '\n') raw.erase(0, 1);
            if (!raw.empty() && raw.back() == '\n') raw.pop_back();
            emit_args(d, std::string(params_ ? ", " : "{") + dump(arg) + ": " + typed(reply_.tool_calls.back().name, arg, raw));
            ++params_;
            buf_.erase(0, end + kParamClose.size());
            continue;
          }
          const bool name_pending = gt == std::string::npos && rest.size() <= kParam.size() + kMaxName &&
                                    rest.find_first_of("<\n", kParam.size()) == std::string_view::npos;
          if (!at_end && (name_pending || name_ok)) return;  // the value is still coming
        } else if (rest.rfind(kFunctionClose, 0) == 0) {
          buf_.erase(0, kFunctionClose.size());
          mode_ = Mode::CallTail;
          continue;
        } else if (rest.rfind(kCallClose, 0) == 0) {  // no </function>: taken as closed
          buf_.erase(0, kCallClose.size());
          close_call(d);
          mode_ = Mode::Content;
          continue;
        } else if (!at_end && (rest.empty() || may_become(rest, {kParam, kFunctionClose, kCallClose}))) {
          return;
        }
        close_call(d);  // broken here: the call keeps what it has, the rest is text
        after_call_ = false;
        mode_ = Mode::Content;
        continue;
      }
      case Mode::CallTail: {
        trim_front(buf_);
        if (std::string_view(buf_).rfind(kCallClose, 0) == 0) {
          buf_.erase(0, kCallClose.size());
        } else if (!at_end && (buf_.empty() || may_become(buf_, {kCallClose}))) {
          return;
        }
        close_call(d);
        mode_ = Mode::Content;
        continue;
      }
    }
  }
}

ReplyDelta ReplyParser::push(std::string_view text) {
  ReplyDelta d;
  buf_.append(text);
  step(d, false);
  return d;
}

ReplyDelta ReplyParser::finish() {
  ReplyDelta d;
  step(d, true);
  return d;
}

ParsedReply parse_reply(std::string_view text, bool thinking, const nlohmann::json& tools) {
  ReplyParser p(thinking, tools);
  p.push(text);
  p.finish();
  return p.reply();
}

}  // namespace tandem
