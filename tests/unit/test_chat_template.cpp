// The Qwen3.5 chat format, checked against sequences written out from the spec (§5).
#include "runtime/chat_template.h"
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
