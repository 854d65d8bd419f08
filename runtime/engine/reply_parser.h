// runtime/engine/reply_parser.h: a Qwen3.5 reply split into reasoning, content and tool calls, as an
// OpenAI- or Anthropic-compatible server returns them (issue 26's parser; reachable from Python as
// tandem.parse_reply).
//
//  - Reasoning: with thinking on the prompt ends in "<think>\n", so the reply starts with the reasoning;
//    everything up to "</think>" is reasoning (one newline before the tag and the newlines after it
//    dropped), the rest content. A reply that ends before "</think>" is all reasoning. Thinking off:
//    all content.
//  - Tool calls, as the chat template asks for them:
//      <tool_call>\n<function=NAME>\n<parameter=ARG>\nvalue\n</parameter>\n...</function>\n</tool_call>
//    several per reply, text before them is content. Each becomes {id, name, arguments}: arguments a
//    JSON object whose values are typed by the tool's JSON schema (integer, number, boolean, null,
//    object and array values parsed from the text when they parse as that type; strings, parameters the
//    schema does not know and values that do not parse kept verbatim as strings).
//  - Streaming: push() returns what became final with each piece; a partial tag is held back until it
//    resolves, a call's name goes out as soon as its <function=...> is complete and its arguments as
//    each parameter completes (JSON fragments that concatenate to the arguments object). The deltas
//    of any split of a text concatenate to parse_reply() of the whole.
//  - Malformed calls degrade to content, never to an error: a <tool_call> not followed by <function=
//    is content from the tag on; a call broken after its name keeps the parameters completed so far,
//    and the text from the break on is content.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct ParsedToolCall {
  std::string id;         // "call_<n>" (n: the call's index in the reply)
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedReply {
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
};

// A streamed piece: text appended to the reasoning and the content, and for tool calls their starts
// (id and name set) and argument fragments, by call index.
struct ToolCallDelta {
  int index = 0;
  std::string id, name;  // set on the call's first delta
  std::string arguments;  // a fragment of the arguments' JSON text
};
struct ReplyDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ReplyParser {
 public:
  // tools: OpenAI tool definitions ([{"type": "function", "function": {"name", "parameters"}}], or the
  // function objects themselves); null or [] when none.
  ReplyParser(bool thinking, const nlohmann::json& tools);
  ReplyDelta push(std::string_view text);
  ReplyDelta finish();  // the reply ended: what was held back
  const ParsedReply& reply() const { return reply_; }

 private:
  enum class Mode { Reasoning, AfterThink, Content, CallHead, Params, CallTail };
  void step(ReplyDelta& d, bool at_end);
  void emit_reasoning(ReplyDelta& d, std::string_view s);
  void emit_content(ReplyDelta& d, std::string_view s);
  void emit_args(ReplyDelta& d, const std::string& s);
  void close_call(ReplyDelta& d);
  std::string typed(const std::string& fn, const std::string& arg, const std::string& raw) const;

  Mode mode_;
  std::string buf_;  // text not yet resolved
  nlohmann::json schemas_ = nlohmann::json::object();  // tool name -> its parameters' properties
  ParsedReply reply_;
  int params_ = 0;  // parameters of the open call so far
  bool after_call_ = false;
  bool think_tag_ = false;   // dropped the reply's own <think>: a newline right after it goes too
  bool reasoning_started_ = false;  // a call just closed: whitespace before the next is not content
};

ParsedReply parse_reply(std::string_view text, bool thinking, const nlohmann::json& tools);

}  // namespace tandem
