// The server's API shapes (runtime/server/api.h) on fixed texts: requests to jobs (validation naming
// the field; the Anthropic and OpenAI forms of one conversation render the same prompt), and replies
// with reasoning and tool calls, whole and streamed at every split of the text (the streamed pieces
// add up to the whole reply).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/server/api.h"

namespace tandem::server {
namespace {

Defaults defaults() {
  Defaults d;
  d.model = "m";
  return d;
}

const char* kTools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}}}}])";

const std::string kCallText =
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "<parameter=opts>\n{\"units\": \"metric\"}\n</parameter>\n</function>\n</tool_call>";

GenerateResult result(const std::string& text, StopReason stop = StopReason::Eos) {
  GenerateResult r;
  r.text = text;
  r.tokens = {1, 2, 3, 4};
  r.prompt_tokens = 10;
  r.stop = stop;
  return r;
}

Job chat_job(bool thinking, bool tools) {
  Json body = {{"messages", Json::array({{{"role", "user"}, {"content", "Weather?"}}})}, {"chat_template_kwargs", {{"enable_thinking", thinking}}}};
  if (tools) body["tools"] = Json::parse(kTools);
  return parse_chat(body, defaults());
}

// The JSON payloads of a run of SSE frames (the [DONE] line left out).
std::vector<Json> frames(const std::string& sse_text) {
  std::vector<Json> out;
  size_t at = 0;
  while (true) {
    const size_t end = sse_text.find("\n\n", at);
    if (end == std::string::npos) break;
    const std::string frame = sse_text.substr(at, end - at);
    at = end + 2;
    const size_t data = frame.find("data: ");
    EXPECT_NE(data, std::string::npos) << frame;
    if (data == std::string::npos) continue;
    const std::string payload = frame.substr(data + 6);
    if (payload != "[DONE]") out.push_back(Json::parse(payload));
  }
  EXPECT_EQ(at, sse_text.size()) << "a frame without its blank line";
  return out;
}

TEST(ServerApi, ChatReplyWithToolCallsIsTypedByTheSchema) {
  const Job job = chat_job(false, true);
  Reply reply(job, "chatcmpl-ab1", 100);
  const Json whole = reply.whole(result(kCallText), 0);
  const Json& msg = whole["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Let me check.\n\n");  // the parser keeps the text before a call as it is
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_ab1_0");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"city": "Paris", "days": 3, "opts": {"units": "metric"}})"));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(whole["usage"]["total_tokens"], 14);
}

TEST(ServerApi, ChatStreamAtEverySplitAddsUpToTheWholeReply) {
  const Job job = chat_job(true, true);
  const std::string text = "Weighing it.\n</think>\n\n" + kCallText;
  Reply whole_reply(job, "chatcmpl-x7", 1);
  const Json whole = whole_reply.whole(result(text), 0)["choices"][0];
  for (size_t k = 0; k <= text.size(); ++k) {
    Reply reply(job, "chatcmpl-x7", 1);
    std::string sse_text = reply.start(10, 0);  // one call a statement: the order matters
    sse_text += reply.piece(text.substr(0, k));
    sse_text += reply.piece(text.substr(k));
    sse_text += reply.end(result(text), 0);
    std::string reasoning, content, args, name, id;
    Json finish;
    for (const Json& f : frames(sse_text)) {
      const Json& c = f["choices"][0];
      const Json& d = c["delta"];
      reasoning += d.value("reasoning_content", "");
      if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const Json& call : d["tool_calls"]) {
          EXPECT_EQ(call["index"], 0);
          if (call.contains("id")) id = call["id"], name = call["function"]["name"];
          args += call["function"]["arguments"].get<std::string>();
        }
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    SCOPED_TRACE("split at " + std::to_string(k));
    EXPECT_EQ(reasoning, whole["message"]["reasoning_content"].get<std::string>());
    EXPECT_EQ(content, whole["message"]["content"].get<std::string>());
    EXPECT_EQ(id, whole["message"]["tool_calls"][0]["id"].get<std::string>());
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(Json::parse(args), Json::parse(whole["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()));
    EXPECT_EQ(finish, Json("tool_calls"));
  }
}

TEST(ServerApi, AnthropicReplyBlocksWholeAndStreamed) {
  Json body = {{"max_tokens", 50}, {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
               {"messages", Json::array({{{"role", "user"}, {"content", "Weather?"}}})}, {"tools", Json::array()}};
  for (const Json& t : Json::parse(kTools)) body["tools"].push_back({{"name", t["function"]["name"]}, {"input_schema", t["function"]["parameters"]}});
  const Job job = parse_messages(body, defaults());
  ASSERT_TRUE(job.thinking);
  const std::string text = "Weighing it.\n</think>\n\n" + kCallText;
  Reply whole_reply(job, "msg_q5", 1);
  const Json whole = whole_reply.whole(result(text), 0);
  ASSERT_EQ(whole["content"].size(), 3u);
  EXPECT_EQ(whole["content"][0]["type"], "thinking");
  EXPECT_EQ(whole["content"][0]["thinking"], "Weighing it.");
  EXPECT_EQ(whole["content"][1]["text"], "Let me check.\n\n");
  EXPECT_EQ(whole["content"][2]["type"], "tool_use");
  EXPECT_EQ(whole["content"][2]["id"], "toolu_q5_0");
  EXPECT_EQ(whole["content"][2]["input"], Json::parse(R"({"city": "Paris", "days": 3, "opts": {"units": "metric"}})"));
  EXPECT_EQ(whole["stop_reason"], "tool_use");
  EXPECT_EQ(whole["usage"]["input_tokens"], 10);
  for (size_t k = 0; k <= text.size(); k += 3) {
    Reply reply(job, "msg_q5", 1);
    std::string sse_text = reply.start(10, 0);  // one call a statement: the order matters
    sse_text += reply.piece(text.substr(0, k));
    sse_text += reply.piece(text.substr(k));
    sse_text += reply.end(result(text), 0);
    Json blocks = Json::array();
    std::vector<std::string> partial;
    std::string stop;
    for (const Json& f : frames(sse_text)) {
      if (f["type"] == "content_block_start") {
        EXPECT_EQ(f["index"], blocks.size());
        blocks.push_back(f["content_block"]);
        partial.emplace_back();
      } else if (f["type"] == "content_block_delta") {
        Json& b = blocks[f["index"].get<size_t>()];
        const Json& d = f["delta"];
        if (d["type"] == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
        if (d["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
        if (d["type"] == "input_json_delta") partial[f["index"].get<size_t>()] += d["partial_json"].get<std::string>();
      } else if (f["type"] == "message_delta") {
        stop = f["delta"]["stop_reason"];
      }
    }
    SCOPED_TRACE("split at " + std::to_string(k));
    ASSERT_EQ(blocks.size(), 3u);
    EXPECT_EQ(blocks[0]["thinking"], "Weighing it.");
    EXPECT_EQ(blocks[1]["text"], "Let me check.\n\n");
    EXPECT_EQ(blocks[2]["id"], "toolu_q5_0");
    EXPECT_EQ(Json::parse(partial[2]), whole["content"][2]["input"]);
    EXPECT_EQ(stop, "tool_use");
  }
}

TEST(ServerApi, AnthropicAndOpenAiFormsOfOneConversationRenderTheSamePrompt) {
  const Json anthropic_body = Json::parse(R"({"max_tokens": 10, "system": [{"type": "text", "text": "Be brief."}], "messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                 {"type": "text", "text": "Thanks, and tomorrow?"}]}]})");
  const Json openai_body = Json::parse(R"({"chat_template_kwargs": {"enable_thinking": false}, "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks, and tomorrow?"}]}]})");
  const Job a = parse_messages(anthropic_body, defaults()), o = parse_chat(openai_body, defaults());
  EXPECT_EQ(a.prompt, o.prompt);
  EXPECT_NE(a.prompt.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << a.prompt;
  EXPECT_FALSE(a.thinking);
}

// tool_choice "required" / a named function (Anthropic: "any" / "tool"): the reply is made to open a
// call, after its reasoning when it reasons first; "auto" and "none" force nothing.
TEST(ServerApi, ToolChoiceForcesACall) {
  const Json msgs = Json::array({{{"role", "user"}, {"content", "weather?"}}});
  const Json tools = Json::parse(kTools);
  const Json off = {{"enable_thinking", false}};
  Job j = parse_chat({{"messages", msgs}, {"tools", tools}, {"tool_choice", "required"}, {"chat_template_kwargs", off}}, defaults());
  EXPECT_EQ(j.force_after, "");
  EXPECT_EQ(j.force_text, "<tool_call>\n");
  j = parse_chat({{"messages", msgs}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}, defaults());
  EXPECT_EQ(j.force_after, "</think>");  // thinking on (the default): after the reasoning
  EXPECT_EQ(j.force_text, "\n\n<tool_call>\n<function=get_weather>\n");
  for (const char* c : {"auto", "none"}) EXPECT_EQ(parse_chat({{"messages", msgs}, {"tools", tools}, {"tool_choice", c}}, defaults()).force_text, "");
  const Json atools = Json::array({{{"name", "get_weather"}, {"input_schema", {{"type", "object"}}}}});
  Job a = parse_messages({{"messages", msgs}, {"max_tokens", 8}, {"tools", atools}, {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}}}, defaults());
  EXPECT_EQ(a.force_text, "<tool_call>\n<function=get_weather>\n");  // Anthropic: thinking off unless asked
  a = parse_messages({{"messages", msgs}, {"max_tokens", 8}, {"tools", atools}, {"tool_choice", {{"type", "any"}}}}, defaults());
  EXPECT_EQ(a.force_text, "<tool_call>\n");
  try {
    parse_messages({{"messages", msgs}, {"max_tokens", 8}, {"tools", atools}, {"tool_choice", {{"type", "tool"}, {"name", "other"}}}}, defaults());
    ADD_FAILURE() << "a tool that is not there was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tool_choice");
  }
}

TEST(ServerApi, BadFieldsAreNamed) {
  const Json msgs = Json::array({{{"role", "user"}, {"content", "x"}}});
  struct Case {
    Json body;
    std::string param;
  };
  const std::vector<Case> chat_cases = {
      {{{"messages", msgs}, {"temperature", "hot"}}, "temperature"},
      {{{"messages", msgs}, {"temperature", 2.5}}, "temperature"},
      {{{"messages", msgs}, {"top_p", 0}}, "top_p"},
      {{{"messages", msgs}, {"top_k", 1.5}}, "top_k"},
      {{{"messages", msgs}, {"max_tokens", 0}}, "max_tokens"},
      {{{"messages", msgs}, {"max_completion_tokens", "10"}}, "max_completion_tokens"},
      {{{"messages", msgs}, {"stop", Json::array({"a", 3})}}, "stop[1]"},
      {{{"messages", msgs}, {"stream", "yes"}}, "stream"},
      {{{"messages", msgs}, {"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"messages", msgs}, {"n", 3}}, "n"},
      {{{"messages", msgs}, {"logprobs", true}}, "logprobs"},
      {{{"messages", msgs}, {"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"messages", msgs}, {"tools", "all"}}, "tools"},
      {{{"messages", msgs}, {"tools", Json::array({{{"type", "function"}}})}}, "tools[0]"},
      {{{"messages", msgs}, {"tool_choice", "sometimes"}}, "tool_choice"},
      {{{"messages", msgs}, {"tool_choice", "required"}}, "tool_choice"},  // no tools to call
      {{{"messages", msgs}, {"tools", Json::parse(kTools)}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, "tool_choice"},
      {{{"messages", msgs}, {"tools", Json::parse(kTools)}, {"tool_choice", {{"type", "function"}}}}, "tool_choice.function.name"},
      {{{"messages", msgs}, {"seed", "x"}}, "seed"},
      {{{"messages", Json::array()}}, "messages"},
      {{{"messages", Json::array({{{"role", "user"}, {"content", 5}}})}}, "messages"},
      {{{"model", "m"}}, "messages"},
  };
  for (const Case& c : chat_cases) {
    try {
      parse_chat(c.body, defaults());
      ADD_FAILURE() << "accepted " << c.body.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, c.param) << c.body.dump() << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.param.substr(0, c.param.find('['))), std::string::npos) << e.what();
    }
  }
  const std::vector<Case> anthropic_cases = {
      {{{"messages", msgs}}, "max_tokens"},
      {{{"max_tokens", 5}, {"messages", Json::array({{{"role", "system"}, {"content", "x"}}})}}, "messages[0].role"},
      {{{"max_tokens", 5}, {"messages", Json::array({{{"role", "user"}, {"content", Json::array({{{"type", "video"}}})}}})}}, "messages[0].content[0].type"},
      {{{"max_tokens", 5}, {"messages", msgs}, {"thinking", {{"type", "maybe"}}}}, "thinking.type"},
      {{{"max_tokens", 5}, {"messages", msgs}, {"temperature", 1.5}}, "temperature"},
      {{{"max_tokens", 5}, {"messages", msgs}, {"tools", Json::array({{{"type", "web_search_20250305"}, {"name", "s"}}})}}, "tools[0].type"},
  };
  for (const Case& c : anthropic_cases) {
    try {
      parse_messages(c.body, defaults());
      ADD_FAILURE() << "accepted " << c.body.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, c.param) << c.body.dump() << ": " << e.what();
    }
  }
  EXPECT_EQ(error_body(Api::messages, 400, "bad", "x")["error"]["type"], "invalid_request_error");
  EXPECT_EQ(error_body(Api::chat, 503, "busy", "")["error"]["param"], nullptr);
}

// A piece that is not valid UTF-8 (cut inside a character, or a stray byte) goes out as U+FFFD in a
// well-formed frame, streamed and whole, on each API, instead of an exception in the middle of a reply
// (found by fuzz_server_api; the detokenizer itself emits only whole characters).
TEST(ServerApi, TextThatIsNotUtf8GoesOutAsReplacementCharacters) {
  const std::string cut = std::string("caf\xc3", 4), stray = "a\xff" "b";
  for (const Api api : {Api::chat, Api::completion, Api::messages}) {
    Json body = api == Api::completion ? Json{{"prompt", "hi"}} : Json{{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}};
    if (api == Api::messages) body["max_tokens"] = 16;
    const Job job = api == Api::chat ? parse_chat(body, defaults()) : api == Api::completion ? parse_completion(body, defaults()) : parse_messages(body, defaults());
    Reply streamed(job, "id-1", 0), whole(job, "id-1", 0);
    std::string sse = streamed.start(5, 0);
    sse += streamed.piece(cut);
    sse += streamed.piece(stray);
    sse += streamed.end(result(cut + stray), 0);
    const std::string replacement = "\xef\xbf\xbd";  // U+FFFD
    std::string text;
    for (const Json& f : frames(sse)) text += wire(f);  // every frame parses back
    EXPECT_NE(text.find(replacement), std::string::npos) << "api " << static_cast<int>(api) << ": " << sse;
    EXPECT_NE(wire(whole.whole(result(cut + stray), 0)).find(replacement), std::string::npos) << "api " << static_cast<int>(api);
  }
}

TEST(ServerApi, FinishReasonsInEachApisWords) {
  const Job chat = chat_job(false, false);
  const Job completion = parse_completion({{"prompt", "Once"}}, defaults());
  const Job messages = parse_messages({{"max_tokens", 5}, {"messages", Json::array({{{"role", "user"}, {"content", "x"}}})}}, defaults());
  EXPECT_EQ(completion.max_tokens, 16);  // OpenAI's default for completions
  GenerateResult stopped = result("abc", StopReason::StopString);
  stopped.stop_string = "END";
  for (const auto& [job, eos, length, stop] : {std::tuple{&chat, "stop", "length", "stop"}, std::tuple{&completion, "stop", "length", "stop"},
                                               std::tuple{&messages, "end_turn", "max_tokens", "stop_sequence"}}) {
    EXPECT_EQ(Reply(*job, "x-1", 0).finish_reason(result("abc")), eos);
    EXPECT_EQ(Reply(*job, "x-1", 0).finish_reason(result("abc", StopReason::MaxTokens)), length);
    EXPECT_EQ(Reply(*job, "x-1", 0).finish_reason(stopped), stop);
  }
  EXPECT_EQ(Reply(messages, "msg_1", 0).whole(stopped, 0)["stop_sequence"], "END");
}

}  // namespace
}  // namespace tandem::server
