#include "runtime/server/api.h"

#include <cmath>
#include <limits>
#include <optional>

#include "core/error.h"
#include "runtime/tokenizer/chat_template.h"

namespace tandem::server {

namespace {

// A value as the client wrote it, cut short for a message.
std::string shown(const Json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

[[noreturn]] void bad(const std::string& param, const std::string& what) { throw ApiError(400, param, param + " " + what); }

// The field, or nullptr when it is absent or null (null means "not given" throughout these APIs).
const Json* field(const Json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const Json& b, const char* name, double lo, double hi) {
  const Json* v = field(b, name);
  if (!v) return std::nullopt;
  const std::string range = str_cat("must be a number in [", lo, ", ", hi, "], got ");
  if (!v->is_number()) bad(name, range + shown(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(name, range + shown(*v));
  return x;
}

std::optional<int64_t> integer(const Json& b, const char* name, int64_t lo, int64_t hi) {
  const Json* v = field(b, name);
  if (!v) return std::nullopt;
  const std::string range = str_cat("must be an integer in [", lo, ", ", hi, "], got ");
  if (!v->is_number()) bad(name, range + shown(*v));
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d) || !(d >= double(lo) && d <= double(hi))) bad(name, range + shown(*v));
    return static_cast<int64_t>(d);
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) bad(name, range + shown(*v));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad(name, range + shown(*v));
  return x;
}

std::optional<bool> boolean(const Json& b, const char* name) {
  const Json* v = field(b, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(name, "must be true or false, got " + shown(*v));
  return v->get<bool>();
}

std::optional<std::string> string(const Json& b, const char* name) {
  const Json* v = field(b, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(name, "must be a string, got " + shown(*v));
  return v->get<std::string>();
}

const Json* object(const Json& b, const char* name) {
  const Json* v = field(b, name);
  if (v && !v->is_object()) bad(name, "must be an object, got " + shown(*v));
  return v;
}

// Stop strings: one string or a list of them (at most kMaxStops, none empty).
constexpr size_t kMaxStops = 16;
std::vector<std::string> stops(const Json& b, const char* name) {
  const Json* v = field(b, name);
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) bad(str_cat(name, "[", i, "]"), "must be a string, got " + shown((*v)[i]));
      out.push_back((*v)[i].get<std::string>());
    }
  } else {
    bad(name, "must be a string or a list of strings, got " + shown(*v));
  }
  if (out.size() > kMaxStops) bad(name, str_cat("takes at most ", kMaxStops, " strings, got ", out.size()));
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].empty()) bad(v->is_array() ? str_cat(name, "[", i, "]") : std::string(name), "must not be empty");
  return out;
}

// The sampling fields every API shares, over the model's defaults; SamplingParams::validate names the
// parameter in its message.
SamplingParams sampling(const Json& b, const Defaults& d, double max_temperature) {
  SamplingParams p = d.sampling;
  if (auto v = number(b, "temperature", 0, max_temperature)) p.temperature = static_cast<float>(*v);
  if (auto v = number(b, "top_p", 0, 1)) {
    if (*v <= 0) bad("top_p", "must be above 0 (1 is off), got " + shown(b["top_p"]));
    p.top_p = static_cast<float>(*v);
  }
  if (auto v = integer(b, "top_k", -1, std::numeric_limits<int>::max())) p.top_k = *v < 0 ? 0 : static_cast<int>(*v);  // -1: off
  if (auto v = number(b, "min_p", 0, 1)) p.min_p = static_cast<float>(*v);
  if (auto v = number(b, "presence_penalty", -2, 2)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = number(b, "frequency_penalty", -2, 2)) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = number(b, "repetition_penalty", 0, 10)) {
    if (*v <= 0) bad("repetition_penalty", "must be above 0 (1 is off), got " + shown(b["repetition_penalty"]));
    p.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = integer(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    p.seed = static_cast<uint64_t>(*v);
    p.seeded = true;
  }
  try {
    p.validate();
  } catch (const Error& e) {
    throw ApiError(400, "", e.what());
  }
  return p;
}

void common(Job& j, const Json& body, const Defaults& d) {
  if (!body.is_object()) throw ApiError(400, "", "the request body must be a JSON object, got " + shown(body));
  j.model = string(body, "model").value_or(d.model);
  j.stream = boolean(body, "stream").value_or(false);
  j.ignore_eos = boolean(body, "ignore_eos").value_or(false);
}

// The body's "messages": required, a non-empty list.
const Json* message_list(const Json& body) {
  const Json* messages = field(body, "messages");
  if (!messages) bad("messages", "is required");
  if (!messages->is_array() || messages->empty()) bad("messages", "must be a non-empty list of messages");
  return messages;
}

int64_t max_tokens(const Json& body) {
  constexpr int64_t kMax = int64_t{1} << 40;
  if (auto v = integer(body, "max_completion_tokens", 1, kMax)) return *v;
  if (auto v = integer(body, "max_tokens", 1, kMax)) return *v;
  return -1;
}

// OpenAI's stream_options, the features this server does not have, the limits and the sampling.
void openai_common(Job& j, const Json& body, const Defaults& d) {
  if (const Json* so = object(body, "stream_options")) {
    if (!j.stream) bad("stream_options", "is only allowed with stream: true");
    j.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  if (auto n = integer(body, "n", 1, 128); n && *n != 1) bad("n", str_cat("must be 1 (this server returns one choice), got ", *n));
  if (boolean(body, "logprobs").value_or(false)) bad("logprobs", "is not supported by this server");
  if (const Json* v = field(body, "logprobs"); v && v->is_number()) bad("logprobs", "is not supported by this server");
  if (field(body, "top_logprobs")) bad("top_logprobs", "is not supported by this server");
  j.max_tokens = max_tokens(body);
  j.stop = stops(body, "stop");
  j.sampling = sampling(body, d, 2);
}

// A job of one of the OpenAI endpoints with the fields they share read.
Job openai_job(Api api, const Json& body, const Defaults& d) {
  Job j;
  j.api = api;
  common(j, body, d);
  openai_common(j, body, d);
  return j;
}

// Anthropic content blocks of one message to OpenAI-shaped messages (chat_messages_from_json's input):
// a user turn's tool_result blocks become tool messages, an assistant's tool_use blocks its tool_calls
// and its thinking blocks its reasoning.
void anthropic_message(const Json& m, size_t i, Json& out) {
  const std::string where = str_cat("messages[", i, "]");
  if (!m.is_object()) bad(where, "must be an object, got " + shown(m));
  const auto role = string(m, "role");
  if (!role || (*role != "user" && *role != "assistant")) bad(where + ".role", "must be \"user\" or \"assistant\"");
  const Json* content = field(m, "content");
  if (!content) bad(where + ".content", "is required");
  if (content->is_string()) {
    out.push_back({{"role", *role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) bad(where + ".content", "must be a string or a list of content blocks, got " + shown(*content));
  Json parts = Json::array(), calls = Json::array();
  std::string reasoning;
  bool has_reasoning = false;
  auto flush_user = [&] {
    if (!parts.empty()) out.push_back({{"role", "user"}, {"content", parts}});
    parts = Json::array();
  };
  for (size_t b = 0; b < content->size(); ++b) {
    const Json& blk = (*content)[b];
    const std::string bw = str_cat(where, ".content[", b, "]");
    if (!blk.is_object()) bad(bw, "must be an object, got " + shown(blk));
    const auto type = string(blk, "type");
    if (!type) bad(bw + ".type", "is required");
    if (*type == "text") {
      const auto text = string(blk, "text");
      if (!text) bad(bw + ".text", "is required");
      parts.push_back({{"type", "text"}, {"text", *text}});
    } else if (*type == "image") {
      parts.push_back({{"type", "image"}});
    } else if (*type == "thinking" && *role == "assistant") {
      reasoning += string(blk, "thinking").value_or("");
      has_reasoning = true;
    } else if (*type == "redacted_thinking" && *role == "assistant") {
    } else if (*type == "tool_use" && *role == "assistant") {
      const auto name = string(blk, "name");
      if (!name) bad(bw + ".name", "is required");
      const Json* input = field(blk, "input");
      if (input && !input->is_object()) bad(bw + ".input", "must be an object, got " + shown(*input));
      calls.push_back({{"type", "function"}, {"function", {{"name", *name}, {"arguments", input ? *input : Json::object()}}}});
    } else if (*type == "tool_result" && *role == "user") {
      flush_user();
      const Json* c = field(blk, "content");
      std::string text;
      if (c && c->is_string()) {
        text = c->get<std::string>();
      } else if (c && c->is_array()) {
        for (size_t k = 0; k < c->size(); ++k) {
          const Json& part = (*c)[k];
          if (!part.is_object() || string(part, "type").value_or("") != "text") continue;  // images in results: not rendered
          if (!text.empty()) text += "\n";
          text += string(part, "text").value_or("");
        }
      } else if (c) {
        bad(bw + ".content", "must be a string or a list of blocks, got " + shown(*c));
      }
      out.push_back({{"role", "tool"}, {"content", text}});
    } else {
      bad(bw + ".type", str_cat("\"", *type, "\" is not a block this server takes in a ", *role, " message"));
    }
  }
  if (*role == "user") {
    flush_user();
    return;
  }
  std::string text;
  for (const Json& p : parts) text += p["text"].get<std::string>();
  Json msg = {{"role", "assistant"}, {"content", text}};
  if (has_reasoning) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = calls;
  out.push_back(msg);
}

std::string render(const Json& messages, const std::vector<std::string>& tools, const ChatOptions& base) {
  ChatOptions o = base;
  o.tools = tools;
  try {
    return render_chat(chat_messages_from_json(messages), o);
  } catch (const Error& e) {
    throw ApiError(400, "messages", e.what());
  }
}

// tool_choice that makes the reply call a tool (name "": any of them): the reply opens with Qwen3.5's
// call syntax, after its reasoning when it reasons first (the template's prompt then ends in <think>).
void force_call(Job& j, const std::string& name, const char* field_name) {
  if (j.tools.is_null() || j.tools.empty()) bad(field_name, "asks for a tool call but the request has no tools");
  if (!name.empty()) {
    bool known = false;
    for (const auto& t : j.tools) known = known || (t.contains("function") && t["function"].value("name", "") == name);
    if (!known) bad(field_name, "names the function \"" + name + "\", which is not among the request's tools");
  }
  const std::string call = "<tool_call>\n" + (name.empty() ? std::string() : "<function=" + name + ">\n");
  j.force_after = j.thinking ? "</think>" : "";
  j.force_text = j.thinking ? "\n\n" + call : call;
}

}  // namespace

Json error_body(Api api, int status, const std::string& message, const std::string& param) {
  const char* type = status == 401 ? "authentication_error" : status == 404 ? "not_found_error" : status == 429 ? "rate_limit_error"
                     : status == 503 ? "overloaded_error" : status >= 500 ? "api_error" : "invalid_request_error";
  if (api == Api::messages) return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? Json(nullptr) : Json(param)}, {"code", nullptr}}}};
}

Job parse_chat(const Json& body, const Defaults& d) {
  Job j = openai_job(Api::chat, body, d);
  const Json* messages = message_list(body);
  if (const Json* rf = object(body, "response_format"); rf && string(*rf, "type").value_or("text") != "text")
    bad("response_format", "only {\"type\": \"text\"} is supported by this server");
  ChatOptions o;
  if (const Json* kw = object(body, "chat_template_kwargs")) {
    o.enable_thinking = boolean(*kw, "enable_thinking").value_or(true);
    o.preserve_thinking = boolean(*kw, "preserve_thinking").value_or(false);
  }
  std::vector<std::string> tools;
  bool use_tools = true;
  std::optional<std::string> forced;  // tool_choice that makes the reply call: "" (any tool) or the function's name
  if (const Json* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      const std::string c = tc->get<std::string>();
      if (c != "none" && c != "auto" && c != "required") bad("tool_choice", "must be \"none\", \"auto\", \"required\" or a function, got " + shown(*tc));
      use_tools = c != "none";
      if (c == "required") forced = "";
    } else if (tc->is_object()) {
      const Json* fn = field(*tc, "function");
      const auto name = fn && fn->is_object() ? string(*fn, "name") : std::nullopt;
      if (!name || name->empty()) bad("tool_choice.function.name", "is required (tool_choice {\"type\": \"function\", \"function\": {\"name\": ...}})");
      forced = *name;
    } else {
      bad("tool_choice", "must be a string or an object, got " + shown(*tc));
    }
  }
  if (const Json* t = field(body, "tools"); t && use_tools) {
    if (!t->is_array()) bad("tools", "must be a list of tools, got " + shown(*t));
    for (size_t i = 0; i < t->size(); ++i) {
      const Json& tool = (*t)[i];
      const Json* fn = tool.is_object() ? field(tool, "function") : nullptr;
      if (!fn || !fn->is_object() || !string(*fn, "name")) bad(str_cat("tools[", i, "]"), "must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
    }
    try {
      tools = chat_tools_from_json(*t);
    } catch (const Error& e) {
      throw ApiError(400, "tools", e.what());
    }
    if (!t->empty()) j.tools = nlohmann::json::parse(t->dump());
  }
  j.thinking = o.enable_thinking;
  j.prompt = render(*messages, tools, o);
  if (forced) force_call(j, *forced, "tool_choice");
  return j;
}

Job parse_completion(const Json& body, const Defaults& d) {
  Job j = openai_job(Api::completion, body, d);
  const Json* p = field(body, "prompt");
  if (!p) bad("prompt", "is required");
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (!p->is_string()) bad("prompt", "must be a string (one prompt a request), got " + shown(*p));
  if (p->get<std::string>().empty()) bad("prompt", "must not be empty");
  if (boolean(body, "echo").value_or(false)) bad("echo", "is not supported by this server");
  if (field(body, "suffix")) bad("suffix", "is not supported by this server");
  if (auto b = integer(body, "best_of", 1, 128); b && *b != 1) bad("best_of", "must be 1");
  j.prompt = p->get<std::string>();
  if (j.max_tokens < 0) j.max_tokens = 16;  // OpenAI's default for completions
  return j;
}

Job parse_messages(const Json& body, const Defaults& d) {
  Job j;
  j.api = Api::messages;
  common(j, body, d);
  const auto mt = integer(body, "max_tokens", 1, int64_t{1} << 40);
  if (!mt) bad("max_tokens", "is required");
  j.max_tokens = *mt;
  const Json* messages = message_list(body);
  Json msgs = Json::array();
  if (const Json* sys = field(body, "system")) {
    std::string text;
    if (sys->is_string()) {
      text = sys->get<std::string>();
    } else if (sys->is_array()) {
      for (size_t i = 0; i < sys->size(); ++i) {
        const Json& blk = (*sys)[i];
        if (!blk.is_object() || string(blk, "type").value_or("") != "text") bad(str_cat("system[", i, "]"), "must be a text block");
        if (!text.empty()) text += "\n";
        text += string(blk, "text").value_or("");
      }
    } else {
      bad("system", "must be a string or a list of text blocks, got " + shown(*sys));
    }
    msgs.push_back({{"role", "system"}, {"content", text}});
  }
  for (size_t i = 0; i < messages->size(); ++i) anthropic_message((*messages)[i], i, msgs);
  ChatOptions o;
  o.enable_thinking = false;  // Anthropic's default: thinking only when asked for
  if (const Json* th = object(body, "thinking")) {
    const auto type = string(*th, "type");
    if (!type || (*type != "enabled" && *type != "disabled")) bad("thinking.type", "must be \"enabled\" or \"disabled\"");
    o.enable_thinking = *type == "enabled";
  }
  std::vector<std::string> tools;
  bool use_tools = true;
  std::optional<std::string> forced;
  if (const Json* tc = object(body, "tool_choice")) {
    const std::string type = string(*tc, "type").value_or("auto");
    if (type != "auto" && type != "none" && type != "any" && type != "tool")
      bad("tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\", got \"" + type + "\"");
    use_tools = type != "none";
    if (type == "any") forced = "";
    if (type == "tool") {
      const auto name = string(*tc, "name");
      if (!name || name->empty()) bad("tool_choice.name", "is required with {\"type\": \"tool\"}");
      forced = *name;
    }
  }
  if (const Json* t = field(body, "tools"); t && use_tools) {
    if (!t->is_array()) bad("tools", "must be a list of tools, got " + shown(*t));
    Json openai = Json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const Json& tool = (*t)[i];
      const std::string tw = str_cat("tools[", i, "]");
      if (!tool.is_object()) bad(tw, "must be an object, got " + shown(tool));
      if (const auto type = string(tool, "type"); type && *type != "custom") bad(tw + ".type", "\"" + *type + "\": server tools are not supported");
      const auto name = string(tool, "name");
      if (!name) bad(tw + ".name", "is required");
      Json fn = {{"name", *name}};
      if (const auto desc = string(tool, "description")) fn["description"] = *desc;
      fn["parameters"] = field(tool, "input_schema") ? tool["input_schema"] : Json{{"type", "object"}};
      openai.push_back({{"type", "function"}, {"function", fn}});
    }
    tools = chat_tools_from_json(openai);
    if (!openai.empty()) j.tools = nlohmann::json::parse(openai.dump());
  }
  j.thinking = o.enable_thinking;
  j.prompt = render(msgs, tools, o);
  if (forced) force_call(j, *forced, "tool_choice");
  j.stop = stops(body, "stop_sequences");
  j.sampling = sampling(body, d, 1);
  return j;
}

// ---- replies ----

std::string wire(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }
std::string sse(const Json& data) { return "data: " + wire(data) + "\n\n"; }
std::string sse_event(const std::string& name, const Json& data) { return "event: " + name + "\ndata: " + wire(data) + "\n\n"; }

Reply::Reply(const Job& job, std::string id, int64_t created)
    : job_(job), id_(std::move(id)), created_(created), parser_(job.thinking, job.tools) {}

std::string Reply::call_id(int index) const {
  const size_t cut = id_.find_first_of("-_");
  return (job_.api == Api::messages ? "toolu_" : "call_") + id_.substr(cut == std::string::npos ? 0 : cut + 1) + "_" + std::to_string(index);
}

std::string Reply::finish_reason(const GenerateResult& r) const {
  const bool calls = any_call_ || !parser_.reply().tool_calls.empty();
  if (job_.api == Api::messages) {
    if (calls) return "tool_use";
    return r.stop == StopReason::Eos ? "end_turn" : r.stop == StopReason::StopString ? "stop_sequence" : "max_tokens";
  }
  if (calls && job_.api == Api::chat) return "tool_calls";
  return r.stop == StopReason::Eos || r.stop == StopReason::StopString ? "stop" : "length";
}

namespace {

// Anthropic's usage object: input_tokens excludes what the cache served.
Json anthropic_usage(int64_t prompt, int64_t cached, int64_t output) {
  return {{"input_tokens", prompt - cached}, {"output_tokens", output}, {"cache_read_input_tokens", cached}, {"cache_creation_input_tokens", 0}};
}

}  // namespace

Json Reply::usage(const GenerateResult& r, int64_t cached) const {
  const auto gen = static_cast<int64_t>(r.tokens.size());
  if (job_.api == Api::messages)
    return anthropic_usage(r.prompt_tokens, cached, gen);
  return {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", gen}, {"total_tokens", r.prompt_tokens + gen},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string Reply::chat_frame(const Json& delta, const Json& finish) const {
  if (job_.api == Api::completion)
    return sse({{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", job_.model},
                {"choices", Json::array({{{"text", delta.value("content", "")}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}}})}});
  return sse({{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", job_.model},
              {"choices", Json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}})}});
}

std::string Reply::start(int64_t prompt_tokens, int64_t cached) {
  if (job_.api == Api::chat) return chat_frame({{"role", "assistant"}, {"content", ""}}, nullptr);
  if (job_.api == Api::completion) return "";
  return sse_event("message_start", {{"type", "message_start"},
                                     {"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", job_.model}, {"content", Json::array()},
                                                  {"stop_reason", nullptr}, {"stop_sequence", nullptr}, {"usage", anthropic_usage(prompt_tokens, cached, 0)}}}});
}

std::string Reply::anthropic_open(const std::string& type, const Json& block) {
  std::string out = anthropic_close();
  ++block_;
  block_type_ = type;
  out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", block_}, {"content_block", block}});
  return out;
}

std::string Reply::anthropic_close() {
  if (block_type_.empty()) return "";
  block_type_.clear();
  return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_}});
}

std::string Reply::anthropic_delta(const ReplyDelta& d) {
  std::string out;
  auto delta = [&](const Json& body) { out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_}, {"delta", body}}); };
  if (!d.reasoning.empty()) {
    if (block_type_ != "thinking") out += anthropic_open("thinking", {{"type", "thinking"}, {"thinking", ""}});
    delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (block_type_ != "text") out += anthropic_open("text", {{"type", "text"}, {"text", ""}});
    delta({{"type", "text_delta"}, {"text", d.content}});
  }
  for (const ToolCallDelta& c : d.tool_calls) {
    if (!c.name.empty() || block_type_ != "tool_use" || call_block_ != c.index) {
      out += anthropic_open("tool_use", {{"type", "tool_use"}, {"id", call_id(c.index)}, {"name", c.name}, {"input", Json::object()}});
      call_block_ = c.index;
    }
    if (!c.arguments.empty()) delta({{"type", "input_json_delta"}, {"partial_json", c.arguments}});
  }
  return out;
}

Json Reply::openai_delta(const ReplyDelta& d) const {
  Json delta = Json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCallDelta& c : d.tool_calls) {
      Json call = {{"index", c.index}, {"function", {{"arguments", c.arguments}}}};
      if (!c.name.empty())  // the call's first delta: its id and name
        call = {{"index", c.index}, {"id", call_id(c.index)}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
      calls.push_back(call);
    }
    delta["tool_calls"] = calls;
  }
  return delta;
}

std::string Reply::piece(std::string_view text) {
  if (job_.api == Api::completion) return text.empty() ? "" : chat_frame({{"content", std::string(text)}}, nullptr);
  const ReplyDelta d = parser_.push(text);
  if (d.empty()) return "";
  if (!d.tool_calls.empty()) any_call_ = true;
  if (job_.api == Api::messages) return anthropic_delta(d);
  return chat_frame(openai_delta(d), nullptr);
}

std::string Reply::end(const GenerateResult& r, int64_t cached) {
  std::string out;
  if (job_.api == Api::completion) {
    out += chat_frame({{"content", ""}}, finish_reason(r));
  } else {
    const ReplyDelta d = parser_.finish();  // what the parser held back
    if (!d.tool_calls.empty()) any_call_ = true;
    if (job_.api == Api::messages) {
      out += anthropic_delta(d);
      out += anthropic_close();
      const std::string why = finish_reason(r);
      out += sse_event("message_delta", {{"type", "message_delta"},
                                         {"delta", {{"stop_reason", why}, {"stop_sequence", why == "stop_sequence" ? Json(r.stop_string) : Json(nullptr)}}},
                                         {"usage", usage(r, cached)}});
      out += sse_event("message_stop", {{"type", "message_stop"}});
      return out;
    }
    if (!d.empty()) out += chat_frame(openai_delta(d), nullptr);
    out += chat_frame(Json::object(), finish_reason(r));
  }
  if (job_.include_usage)
    out += sse({{"id", id_}, {"object", job_.api == Api::chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
                {"model", job_.model}, {"choices", Json::array()}, {"usage", usage(r, cached)}});
  out += "data: [DONE]\n\n";
  return out;
}

Json Reply::whole(const GenerateResult& r, int64_t cached) {
  if (job_.api == Api::completion)
    return {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", job_.model},
            {"choices", Json::array({{{"text", r.text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(r)}}})},
            {"usage", usage(r, cached)}};
  parser_.push(r.text);
  parser_.finish();
  const ParsedReply& p = parser_.reply();
  if (job_.api == Api::messages) {
    Json content = Json::array();
    if (job_.thinking && !p.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", p.reasoning}, {"signature", ""}});
    if (!p.content.empty() || (p.tool_calls.empty() && content.empty())) content.push_back({{"type", "text"}, {"text", p.content}});
    for (size_t i = 0; i < p.tool_calls.size(); ++i)
      content.push_back({{"type", "tool_use"}, {"id", call_id(static_cast<int>(i))}, {"name", p.tool_calls[i].name},
                         {"input", Json::parse(p.tool_calls[i].arguments)}});
    const std::string why = finish_reason(r);
    return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", job_.model}, {"content", content}, {"stop_reason", why},
            {"stop_sequence", why == "stop_sequence" ? Json(r.stop_string) : Json(nullptr)}, {"usage", usage(r, cached)}};
  }
  Json msg = {{"role", "assistant"}, {"content", p.content.empty() && !p.tool_calls.empty() ? Json(nullptr) : Json(p.content)}};
  if (job_.thinking && !p.reasoning.empty()) msg["reasoning_content"] = p.reasoning;
  if (!p.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t i = 0; i < p.tool_calls.size(); ++i)
      calls.push_back({{"id", call_id(static_cast<int>(i))}, {"type", "function"},
                       {"function", {{"name", p.tool_calls[i].name}, {"arguments", p.tool_calls[i].arguments}}}});
    msg["tool_calls"] = calls;
  }
  return {{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", job_.model},
          {"choices", Json::array({{{"index", 0}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish_reason(r)}}})},
          {"usage", usage(r, cached)}};
}

}  // namespace tandem::server
