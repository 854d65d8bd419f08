// runtime/server/api.h: the OpenAI (chat completions, completions) and Anthropic (messages) request and
// reply shapes, apart from HTTP: a request body becomes a Job (the prompt text, its limits and
// sampling), and a Reply turns the engine's text pieces and result into the API's JSON, whole or as
// server-sent events. Pure functions of their inputs, so the unit tests drive them on fixed texts.
//
// Validation: every field the server reads is checked for its type and range, and a bad one is an
// ApiError (HTTP 400) naming it ("temperature must be a number in [0, 2], got \"hot\""); fields this
// server does not read are ignored, as the OpenAI API ignores what it does not know (clients send
// `user`, `metadata`, ...); features it does not have (n > 1, logprobs, JSON response formats) are a
// 400 that says so rather than a silently different answer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/generate.h"
#include "runtime/engine/reply_parser.h"
#include "runtime/engine/sampling.h"

namespace tandem::server {

using Json = nlohmann::ordered_json;

enum class Api { chat, completion, messages };

// A request the client got wrong: the HTTP status, the parameter it names ("" when none), the message.
struct ApiError : std::runtime_error {
  int status;
  std::string param;
  ApiError(int status_, std::string param_, const std::string& message) : std::runtime_error(message), status(status_), param(std::move(param_)) {}
};

// The error body each API uses: OpenAI {"error": {message, type, param, code}}, Anthropic
// {"type": "error", "error": {type, message}}.
Json error_body(Api api, int status, const std::string& message, const std::string& param);

// What the server fills in where a request is silent.
struct Defaults {
  std::string model;                // the id /v1/models lists
  SamplingParams sampling;          // generation_config.json's
  std::vector<int32_t> eos;         // ids that end a reply
};

// A request as the engine runs it.
struct Job {
  Api api = Api::chat;
  std::string model;
  std::string prompt;              // the text to tokenize (chat: the rendered template, special tokens as text)
  int64_t max_tokens = -1;         // -1: up to the context
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  bool thinking = false;           // the prompt opens a think block: the reply starts with reasoning
  bool ignore_eos = false;         // ignore_eos (vLLM's and llama-server's extension): run to max_tokens or a stop string
  nlohmann::json tools;            // OpenAI-shaped tool list for the parser (null: none)
  // tool_choice "required" / a named function (Anthropic: "any" / "tool"): the reply is made to open a
  // call (GenerateRequest::force_after / force_ids): force_text, right after force_after ("</think>"
  // when the reply reasons first; empty: from its first token).
  std::string force_after, force_text;
};

Job parse_chat(const Json& body, const Defaults& d);        // POST /v1/chat/completions
Job parse_completion(const Json& body, const Defaults& d);  // POST /v1/completions
Job parse_messages(const Json& body, const Defaults& d);    // POST /v1/messages

// The reply to one job, as its engine output arrives. Streaming: piece() and end() return the SSE
// frames to send ("data: {...}\n\n", Anthropic's "event: ...\ndata: ...\n\n"); whole() the body of a
// non-streaming reply. `id` is the reply's id (chatcmpl-N, cmpl-N, msg_N); tool calls get ids made from
// it. cached: prompt tokens the prefix cache served.
class Reply {
 public:
  Reply(const Job& job, std::string id, int64_t created);
  // The first frames (chat: the role; messages: message_start with the prompt's token counts); ""
  // for completions.
  std::string start(int64_t prompt_tokens, int64_t cached);
  std::string piece(std::string_view text);
  std::string end(const GenerateResult& r, int64_t cached);
  Json whole(const GenerateResult& r, int64_t cached);

  // The reply's finish reason in the API's words (OpenAI stop | length | tool_calls; Anthropic end_turn
  // | max_tokens | stop_sequence | tool_use).
  std::string finish_reason(const GenerateResult& r) const;

 private:
  std::string chat_frame(const Json& delta, const Json& finish) const;
  Json openai_delta(const ReplyDelta& d) const;
  std::string anthropic_delta(const ReplyDelta& d);
  std::string anthropic_open(const std::string& type, const Json& block);
  std::string anthropic_close();
  std::string call_id(int index) const;
  Json usage(const GenerateResult& r, int64_t cached) const;

  const Job& job_;
  std::string id_;
  int64_t created_;
  ReplyParser parser_;
  bool any_call_ = false;
  // Anthropic streaming: the open content block (-1: none) and its type
  int block_ = -1;
  std::string block_type_;
  int call_block_ = -1;  // the parser's call index the open tool_use block holds
};

// JSON text for the wire. A byte that is not UTF-8 becomes U+FFFD instead of an exception in the middle
// of a reply (the detokenizer already emits only whole, valid characters; this is the last guard).
std::string wire(const Json& j);
// SSE framing: "data: <json>\n\n"; Anthropic's named events "event: <name>\ndata: <json>\n\n".
std::string sse(const Json& data);
std::string sse_event(const std::string& name, const Json& data);

}  // namespace tandem::server
