// runtime/tokenizer/chat_template.h: the Qwen3.5 chat template, rendered natively (no template engine).
//
// render_chat is byte-identical to ../shared/qwen35/chat_template.jinja as HF transformers renders it
// (Jinja2, trim_blocks + lstrip_blocks, tojson = json.dumps(ensure_ascii=False)); tests/data/chat holds
// conversations rendered by jinja2 (tools/make_chat_fixtures.py) that the unit tests compare byte for byte.
// What the template does, in the order it does it:
//   - tools (when given): one system turn with "# Tools", each tool as json.dumps text in <tools>, the
//     calling instructions, then the system message's trimmed content after "\n\n" when non-empty;
//     without tools a first system message is its own turn (even when its trimmed content is empty);
//   - every content is rendered (text, or a list of text / image / video parts) and then trimmed the way
//     Python's str.strip() does (Unicode whitespace);
//   - the last *real* user query (a user message not wrapped whole in <tool_response>...</tool_response>)
//     splits history: assistant turns after it keep their reasoning in <think>\n...\n</think>\n\n, turns
//     before it keep only their answer. Reasoning is reasoning_content when given (even ""), else the
//     <think> block split out of the content;
//   - tool calls are <tool_call>\n<function=NAME>\n<parameter=K>\nVALUE\n</parameter>\n...; a value that
//     is an object or list is json.dumps text, anything else Python's str() (raw strings, 3.14, True, None);
//   - tool results are user turns of <tool_response> blocks, consecutive results sharing one turn;
//   - the generation prompt is "<|im_start|>assistant\n<think>\n" (thinking) or with an empty think block.
// The output is text containing special-token strings; the tokenizer maps them to their ids.
// The template's own errors (no messages, no user query, a misplaced system message, images in the system
// message, an unknown role, an unexpected content item) are tandem::Error carrying the template's text.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

struct ContentPart {
  enum class Kind { text, image, video };
  Kind kind = Kind::text;
  std::string text = {};  // Kind::text only
};

struct ToolCall {
  std::string name;
  // parameter -> value as JSON text ("\"Paris\"", "3", "true", "null", "{\"a\": [1]}"), in the caller's order.
  std::vector<std::pair<std::string, std::string>> arguments = {};
};

// Default member initializers so that {"user", "hi"} is a whole message (no missing-initializer warnings).
struct ChatMessage {
  std::string role;                           // system | user | assistant | tool
  std::string content = {};                   // the content when it is text
  std::optional<std::string> reasoning = {};  // assistant: reasoning_content; unset = split <think> out of content
  std::vector<ToolCall> tool_calls = {};      // assistant only
  std::vector<ContentPart> parts = {};        // the content when it is a list (then `content` must be empty)
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  // Not the template's: assistant turns before the last user query keep their (non-empty) reasoning too
  // (chat_template_kwargs.preserve_thinking, which agents send so that a resent history renders as it
  // was generated).
  bool preserve_thinking = false;
  bool add_vision_id = false;      // "Picture N: " / "Video N: " before each image / video
  std::vector<std::string> tools;  // one JSON object per tool ({"type":"function","function":{...}}), any spacing
};

// Throws tandem::Error for the template's errors and for malformed tool / argument JSON.
std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& opts);

// OpenAI-shaped JSON to the structs above (for servers and bindings): a message {role, content: string |
// null | [{type: text, text} | {type: image | image_url | video, ...}], reasoning_content, tool_calls:
// [{function: {name, arguments: object | JSON string}}] (or without the function wrapper)}; `index` names the
// message in errors ("messages[3].tool_calls[0].function.arguments: ...").
ChatMessage chat_message_from_json(const nlohmann::ordered_json& message, size_t index = 0);
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::ordered_json& messages);
// A tools list: objects, or strings holding one JSON object each; null is no tools.
std::vector<std::string> chat_tools_from_json(const nlohmann::ordered_json& tools);

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in order, float repr.
std::string json_dumps_python(const nlohmann::ordered_json& value);

// Splits assistant output "...reasoning...</think>\n\nanswer" into (reasoning, answer) as the template
// does: reasoning between the last <think> and the first </think>, trimmed; the answer after the last
// </think> without leading newlines. Text without </think> is all answer.
std::pair<std::string, std::string> split_reasoning(const std::string& text);

// Python's str.strip(): Unicode whitespace (ASCII \t\n\v\f\r, \x1c-\x1f, space, and U+0085, U+00A0, U+1680,
// U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) off both ends of UTF-8 text.
std::string python_strip(std::string_view s);

// FNV-1a 64 of a template's text with CRLF read as LF and one trailing newline dropped (Jinja renders
// those the same); kQwen35ChatTemplateFingerprint is the one of ../shared/qwen35/chat_template.jinja
// (tests/data/chat/template_fingerprint.json, written by tools/make_chat_fixtures.py).
uint64_t chat_template_fingerprint(std::string_view text);
inline constexpr uint64_t kQwen35ChatTemplateFingerprint = 0xf07c510f47fbaca0ull;

// The chat template a model folder carries (chat_template.jinja, else tokenizer_config.json's
// "chat_template"), checked against the one render_chat implements: a one-line note when it differs,
// else "". Reads regular files only, a bounded size.
std::string chat_template_note(const std::string& model_dir);

}  // namespace tandem
