// runtime/chat_template.h: the Qwen3.5 ChatML conversation format, rendered natively (no template engine).
//
//   <|im_start|>{role}\n{content}<|im_end|>\n            per message
//   <|im_start|>assistant\n<think>\n                      generation prompt, thinking on (default)
//   <|im_start|>assistant\n<think>\n\n</think>\n\n        generation prompt, thinking off
// Assistant turns before the last user turn keep only their final answer (think blocks stripped);
// turns after it (a tool-calling loop in progress) keep their reasoning in <think> tags. Tools are
// declared as <tools> JSON in the system turn, calls rendered XML-style in <tool_call>, and tool
// results sent as user turns wrapped in <tool_response> (consecutive results share one turn).
// The output is text containing special-token strings; the tokenizer maps them to their ids.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct ToolCall {
  std::string name;
  std::vector<std::pair<std::string, std::string>> arguments;  // parameter -> value text
};

struct ChatMessage {
  std::string role;       // system | user | assistant | tool
  std::string content;
  std::string reasoning;  // assistant only: thinking text (or given inline as <think>...</think> in content)
  std::vector<ToolCall> tool_calls;  // assistant only
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  std::vector<std::string> tools;  // one JSON object per tool ({"type":"function","function":{...}})
};

// Throws tandem::Error for an unknown role or a system message that is not first.
std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& opts);

// Splits assistant output "...reasoning...</think>\n\nanswer" into (reasoning, answer); text without
// </think> is all answer. Leading "<think>" and surrounding newlines are trimmed.
std::pair<std::string, std::string> split_reasoning(const std::string& text);

}  // namespace tandem
