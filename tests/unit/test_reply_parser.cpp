// The reply parser (runtime/engine/reply_parser.h) on fixed texts: reasoning splits, tool calls (one,
// several, typed by the schema, interleaved with text), malformed calls degrading to content, and
// streaming: every split of every text (at each byte, and in pieces of 2..7) gives deltas that
// concatenate to the one-shot parse.
#include <gtest/gtest.h>

#include "runtime/engine/reply_parser.h"

namespace tandem {
namespace {

using json = nlohmann::json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}, "ratio": {"type": "number"},
    "opts": {"type": "object"}, "tags": {"type": "array"}, "note": {"type": ["integer", "null"]}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"properties": {"q": {"type": "string"}}}}}
])");

// The deltas of `text` pushed in pieces of `n` bytes, merged.
ParsedReply streamed(std::string_view text, bool thinking, size_t n) {
  ReplyParser p(thinking, kTools);
  ParsedReply out;
  auto take = [&](const ReplyDelta& d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (const ToolCallDelta& c : d.tool_calls) {
      if (!c.name.empty()) {
        EXPECT_EQ(c.index, static_cast<int>(out.tool_calls.size()));
        out.tool_calls.push_back({c.id, c.name, ""});
      }
      EXPECT_LT(c.index, static_cast<int>(out.tool_calls.size()));
      out.tool_calls[c.index].arguments += c.arguments;
    }
  };
  for (size_t i = 0; i < text.size(); i += n) take(p.push(text.substr(i, n)));
  take(p.finish());
  return out;
}

void expect_same(const ParsedReply& a, const ParsedReply& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << what;
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

// parse_reply of `text`, checked against every streamed split.
ParsedReply parse(std::string_view text, bool thinking) {
  const ParsedReply whole = parse_reply(text, thinking, kTools);
  for (size_t n = 1; n <= 7; ++n) expect_same(streamed(text, thinking, n), whole, "pieces of " + std::to_string(n));
  return whole;
}

TEST(ReplyParser, ReasoningThenContent) {
  const ParsedReply r = parse("Let me think.\nStill thinking.\n</think>\n\nThe answer is 4.", true);
  EXPECT_EQ(r.reasoning, "Let me think.\nStill thinking.");
  EXPECT_EQ(r.content, "The answer is 4.");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ReplyParser, ThinkingOffIsAllContentAndACutReasoningIsAllReasoning) {
  EXPECT_EQ(parse("no tags </think> here", false).content, "no tags </think> here");
  const ParsedReply cut = parse("half a thought, then max_tokens", true);
  EXPECT_EQ(cut.reasoning, "half a thought, then max_tokens");
  EXPECT_EQ(cut.content, "");
  EXPECT_EQ(parse("<think>\nits own tag\n</think>\n\nok", true).reasoning, "its own tag");
  EXPECT_EQ(parse("\n\xff\xff\xff\xff</think>\n\nhi", true).reasoning, "\n\xff\xff\xff\xff");  // found by fuzz_reply
}

TEST(ReplyParser, OneToolCallWithTypedArguments) {
  const ParsedReply r = parse(
      "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, CA\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n"
      "</parameter>\n<parameter=tags>\n[\"x\", 2]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>",
      false);
  EXPECT_EQ(r.content, "Checking.\n\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].id, "call_0");
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments),
            json::parse(R"({"city": "San Francisco, CA", "days": 3, "metric": true, "ratio": 0.5, "opts": {"a": [1, 2]}, "tags": ["x", 2], "note": null})"));
}

TEST(ReplyParser, ValuesThatDoNotParseStayStringsAndStringsStayVerbatim) {
  const ParsedReply r = parse(
      "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=city>\n42\n</parameter>\n"
      "<parameter=unknown>\n{\"not\": \"parsed\"}\n</parameter>\n<parameter=metric>\nyes\n</parameter>\n</function>\n</tool_call>",
      false);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments),
            json::parse(R"({"days": "three", "city": "42", "unknown": "{\"not\": \"parsed\"}", "metric": "yes"})"));
  const ParsedReply multi = parse("<tool_call>\n<function=search>\n<parameter=q>\nline one\n\nline <b>two</b>\n</parameter>\n</function>\n</tool_call>", false);
  EXPECT_EQ(json::parse(multi.tool_calls.at(0).arguments)["q"], "line one\n\nline <b>two</b>");
}

TEST(ReplyParser, SeveralCallsAfterReasoning) {
  const ParsedReply r = parse(
      "I need both.\n</think>\n\nOn it.\n\n<tool_call>\n<function=search>\n<parameter=q>\ntandem\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>\n",
      true);
  EXPECT_EQ(r.reasoning, "I need both.");
  EXPECT_EQ(r.content, "On it.\n\n");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"q": "tandem"})");
  EXPECT_EQ(r.tool_calls[1].id, "call_1");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
}

TEST(ReplyParser, MalformedCallsDegradeToContent) {
  const ParsedReply a = parse("text <tool_call> not a call at all", false);
  EXPECT_EQ(a.content, "text <tool_call>not a call at all");  // the whitespace after the tag is the call's
  EXPECT_TRUE(a.tool_calls.empty());
  const ParsedReply b = parse("<tool_call>\n<function=search>\n<parameter=q>\nok\n</parameter>\nthen prose instead", false);
  ASSERT_EQ(b.tool_calls.size(), 1u);
  EXPECT_EQ(b.tool_calls[0].arguments, R"({"q": "ok"})");
  EXPECT_EQ(b.content, "then prose instead");
  const ParsedReply c = parse("<tool_call>\n<function=search>\n<parameter=q>\ncut by max_tok", false);
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.tool_calls[0].arguments, "{}");
  EXPECT_EQ(c.content, "<parameter=q>\ncut by max_tok");
  const ParsedReply d = parse("<tool_call>\n<function=a\nb>", false);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, "<tool_call><function=a\nb>");
  EXPECT_EQ(parse("a < b and <tool", false).content, "a < b and <tool");  // a tag that never comes is text
  EXPECT_EQ(parse("<tool_call>\n<function=f></tool_call>\n<//x", false).content, "\n<//x");  // found by fuzz_reply
}

TEST(ReplyParser, StreamingHoldsAPartialTagBack) {
  ReplyParser p(false, kTools);
  EXPECT_EQ(p.push("Hello <tool").content, "Hello ");
  const ReplyDelta d = p.push("_call>\n<function=search>");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "search");  // the name goes out before any argument
  EXPECT_EQ(p.push("\n<parameter=q>\nabc\n</param").tool_calls.size(), 0u);
  const ReplyDelta e = p.push("eter>\n");
  ASSERT_EQ(e.tool_calls.size(), 1u);
  EXPECT_EQ(e.tool_calls[0].arguments, R"({"q": "abc")");  // the argument as soon as it completes
  EXPECT_EQ(p.push("</function>\n</tool_call>").tool_calls.at(0).arguments, "}");
  EXPECT_TRUE(p.finish().empty());
}

}  // namespace
}  // namespace tandem
