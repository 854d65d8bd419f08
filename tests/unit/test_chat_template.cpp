// The Qwen3.5 chat format, checked against sequences written out from the spec (§5).
#include "runtime/chat_template.h"
#include "runtime/synth.h"
#include "runtime/tokenizer.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

TEST(ChatTemplate, UserTurnWithThinkingOn) {
  const std::vector<ChatMessage> m = {{"user", "hi", {}, {}}};
  EXPECT_EQ(render_chat(m, {}), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, ThinkingOff) {
  const std::vector<ChatMessage> m = {{"user", "hi", {}, {}}};
  ChatOptions o;
  o.enable_thinking = false;
  EXPECT_EQ(render_chat(m, o), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, SystemFirstAndEarlierThinkBlocksStripped) {
  const std::vector<ChatMessage> m = {
      {"system", "Be brief.", {}, {}},
      {"user", "2+2?", {}, {}},
      {"assistant", "<think>\nadd them\n</think>\n\n4", {}, {}},
      {"user", "and 3+3?", {}, {}},
  };
  EXPECT_EQ(render_chat(m, {}),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nand 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, ToolLoopKeepsCurrentReasoningAndGroupsResults) {
  ToolCall call{"get_weather", {{"city", "Paris"}}};
  const std::vector<ChatMessage> m = {
      {"user", "Weather in Paris and Rome?", {}, {}},
      {"assistant", "", "need two lookups", {call, ToolCall{"get_weather", {{"city", "Rome"}}}}},
      {"tool", "sunny", {}, {}},
      {"tool", "rainy", {}, {}},
  };
  ChatOptions o;
  o.tools = {R"({"type": "function", "function": {"name": "get_weather"}})"};
  const std::string s = render_chat(m, o);
  EXPECT_EQ(s.rfind("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{\"type\"", 0), 0u);
  const std::string tail =
      "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nneed two lookups\n</think>\n\n"
      "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
      "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\n";
  ASSERT_GE(s.size(), tail.size());
  EXPECT_EQ(s.substr(s.size() - tail.size()), tail);
}

TEST(ChatTemplate, Errors) {
  const std::vector<ChatMessage> late = {{"user", "a", {}, {}}, {"system", "b", {}, {}}};
  test::expect_error([&] { render_chat(late, {}); }, {"system message must be the first"});
  const std::vector<ChatMessage> bad = {{"robot", "a", {}, {}}};
  test::expect_error([&] { render_chat(bad, {}); }, {"unknown role 'robot'"});
}

TEST(ChatTemplate, SplitReasoning) {
  EXPECT_EQ(split_reasoning("<think>\nplan\n</think>\n\nanswer"), std::make_pair(std::string("plan"), std::string("answer")));
  EXPECT_EQ(split_reasoning("plan</think>answer"), std::make_pair(std::string("plan"), std::string("answer")));
  EXPECT_EQ(split_reasoning("just text"), std::make_pair(std::string(), std::string("just text")));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Token level, with the synthesized Qwen3.5-35B-A3B tokenizer: the special tokens sit at the real
// Qwen ids (spec §5), so the chat scaffolding must come out as exactly those ids around the text.
TEST(ChatTemplate, TokenIdsMatchTheSpecWithQwenSpecials) {
  test::TempDir dir;
  synth::Options o;
  o.out_dir = dir.str() + "/m";
  o.config_only = true;
  o.report_samples = 0;
  synth::synthesize(synth::find_preset("qwen3.5-35b-a3b"), o);
  const Tokenizer tok = Tokenizer::from_model_dir(o.out_dir);
  ASSERT_EQ(tok.token_to_id("<|im_start|>"), 248045);
  ASSERT_EQ(tok.token_to_id("<|im_end|>"), 248046);
  ASSERT_EQ(tok.token_to_id("<think>"), 248068);
  ASSERT_EQ(tok.token_to_id("</think>"), 248069);
  const auto enc = [&](const std::string& s) { return tok.encode(s); };
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  const std::vector<int32_t> nl = enc("\n");
  ASSERT_EQ(nl, std::vector<int32_t>{198});  // GPT-2 byte order: "\n" is byte token 198, as in Qwen
  const std::vector<ChatMessage> m = {{"user", "hi", {}, {}}};
  // [248045, user, 198, hi, 248046, 198, 248045, assistant, 198, 248068, 198]
  EXPECT_EQ(enc(render_chat(m, {})), cat({{248045}, enc("user"), nl, enc("hi"), {248046}, nl, {248045}, enc("assistant"), nl,
                                          {248068}, nl}));
  ChatOptions off;
  off.enable_thinking = false;
  // ... assistant \n <think> \n\n </think> \n\n
  EXPECT_EQ(enc(render_chat(m, off)), cat({{248045}, enc("user"), nl, enc("hi"), {248046}, nl, {248045}, enc("assistant"), nl,
                                           {248068}, enc("\n\n"), {248069}, enc("\n\n")}));
}

}  // namespace
}  // namespace tandem
