#include "runtime/chat_template.h"

#include "runtime/error.h"

namespace tandem {

namespace {

std::string strip_newlines(std::string s) {
  const size_t a = s.find_first_not_of('\n');
  if (a == std::string::npos) return {};
  const size_t b = s.find_last_not_of('\n');
  return s.substr(a, b - a + 1);
}

std::string lstrip_newlines(const std::string& s) {
  const size_t a = s.find_first_not_of('\n');
  return a == std::string::npos ? std::string() : s.substr(a);
}

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  std::string out;
  for (const auto& c : calls) {
    out += "\n<tool_call>\n<function=" + c.name + ">\n";
    for (const auto& [k, v] : c.arguments) out += "<parameter=" + k + ">\n" + v + "\n</parameter>\n";
    out += "</function>\n</tool_call>";
  }
  return out;
}

std::string tools_block(const std::vector<std::string>& tools) {
  std::string out =
      "# Tools\n\nYou have access to the following functions:\n\n<tools>";
  for (const auto& t : tools) out += "\n" + t;
  out +=
      "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
      "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
      "</function>\n</tool_call>";
  return out;
}

}  // namespace

std::pair<std::string, std::string> split_reasoning(const std::string& text) {
  const size_t end = text.find("</think>");
  if (end == std::string::npos) return {{}, text};
  std::string reasoning = text.substr(0, end);
  if (const size_t open = reasoning.find("<think>"); open != std::string::npos) reasoning = reasoning.substr(open + 7);
  return {strip_newlines(reasoning), lstrip_newlines(text.substr(end + 8))};
}

std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& opts) {
  std::string out;
  size_t first = 0;
  const bool has_system = !messages.empty() && messages[0].role == "system";
  if (!opts.tools.empty() || has_system) {
    out += "<|im_start|>system\n";
    if (has_system) out += messages[0].content;
    if (!opts.tools.empty()) out += (has_system ? "\n\n" : "") + tools_block(opts.tools);
    out += "<|im_end|>\n";
    first = has_system ? 1 : 0;
  }
  // The last user turn that is a real query (not tool output) decides which reasoning survives.
  size_t last_query = 0;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") last_query = i;

  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") fail("chat: the system message must be the first message (found one at position ", i, ")");
    if (m.role == "user") {
      out += "<|im_start|>user\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      auto [reasoning, answer] = split_reasoning(m.content);
      if (!m.reasoning.empty()) reasoning = strip_newlines(m.reasoning);
      out += "<|im_start|>assistant\n";
      const bool keep_reasoning = i > last_query && (i + 1 == messages.size() || !reasoning.empty());
      if (keep_reasoning) out += "<think>\n" + reasoning + "\n</think>\n\n" + answer;
      else out += answer;
      out += render_tool_calls(m.tool_calls);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      const bool opens = i == first || messages[i - 1].role != "tool";
      const bool closes = i + 1 == messages.size() || messages[i + 1].role != "tool";
      if (opens) out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (closes) out += "<|im_end|>\n";
    } else {
      fail("chat: unknown role '", m.role, "' at position ", i, " (expected system, user, assistant or tool)");
    }
  }
  if (opts.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += opts.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace tandem
