// The Qwen3.5 chat template: render_chat against jinja2 renderings of the model's own template
// (tests/data/chat/conversations.json, from tools/make_chat_fixtures.py), byte for byte and as token ids,
// plus the JSON converters, Python's json.dumps / str.strip semantics and the model-folder template note.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/tokenizer/chat_template.h"
#include "core/error.h"
#include "tools/synth/synth.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string kChatData = std::string(TANDEM_TEST_DATA) + "/chat";

const ojson& fixtures() {
  static const ojson j = ojson::parse(read_all(kChatData + "/conversations.json"));
  return j;
}

struct Rendered {
  std::string text, error;
};

// A fixture conversation through the runtime's own converters, as a server would run it.
Rendered render_fixture(const ojson& c) {
  try {
    ChatOptions o;
    o.add_generation_prompt = c["options"]["add_generation_prompt"].get<bool>();
    o.enable_thinking = c["options"]["enable_thinking"].get<bool>();
    o.add_vision_id = c["options"]["add_vision_id"].get<bool>();
    o.tools = chat_tools_from_json(c["tools"]);
    return {render_chat(chat_messages_from_json(c["messages"]), o), {}};
  } catch (const Error& e) {
    return {{}, e.what()};
  }
}

// "" when equal, else where they part, with some text either side.
std::string first_difference(const std::string& got, const std::string& want) {
  if (got == want) return {};
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i < 40 ? 0 : i - 40;
  const auto around = [&](const std::string& s) { return nlohmann::json(s.substr(std::min(from, s.size()), 80)).dump(); };
  return "first difference at byte " + std::to_string(i) + " (got " + std::to_string(got.size()) + " bytes, want " +
         std::to_string(want.size()) + ")\n  got:  " + around(got) + "\n  want: " + around(want);
}

TEST(ChatTemplate, FixturesCoverEnough) {
  const ojson& f = fixtures();
  ASSERT_TRUE(f.is_array());
  EXPECT_GE(f.size(), 30u);
  size_t errors = 0;
  for (const auto& c : f) errors += c.contains("error");
  EXPECT_GE(errors, 6u);
}

TEST(ChatTemplate, MatchesTheModelTemplateByteForByte) {
  size_t matched = 0;
  for (const auto& c : fixtures()) {
    const std::string name = c["name"].get<std::string>();
    const Rendered r = render_fixture(c);
    if (c.contains("error")) {
      const std::string want = c["error"].get<std::string>();
      const bool same = r.error.find(want) != std::string::npos;
      EXPECT_TRUE(same) << name << ": expected the template's error '" << want << "', got "
                        << (r.error.empty() ? "a rendering" : "'" + r.error + "'");
      matched += same;
      continue;
    }
    EXPECT_TRUE(r.error.empty()) << name << ": " << r.error;
    const std::string diff = first_difference(r.text, c["expected"].get<std::string>());
    EXPECT_TRUE(diff.empty()) << name << ": " << diff;
    matched += diff.empty() && r.error.empty();
  }
  EXPECT_EQ(matched, fixtures().size()) << "conversations that match the template (renderings and errors)";
}

// The synthesized Qwen3.5-35B-A3B tokenizer: the special tokens sit at the real Qwen ids (spec §5).
const Tokenizer& qwen_tokenizer() {
  static const Tokenizer tok = [] {
    test::TempDir dir;
    synth::Options o;
    o.out_dir = dir.str() + "/m";
    o.config_only = true;
    o.report_samples = 0;
    synth::synthesize(synth::find_preset("qwen3.5-35b-a3b"), o);
    return Tokenizer::from_model_dir(o.out_dir);
  }();
  return tok;
}

size_t count_of(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size())) ++n;
  return n;
}

TEST(ChatTemplate, FixtureTokenIdsMatchAndCarryTheSpecialTokens) {
  const Tokenizer& tok = qwen_tokenizer();
  const std::vector<std::pair<std::string, int32_t>> specials = {
      {"<|im_start|>", 248045},     {"<|im_end|>", 248046},    {"<|vision_start|>", 248053},
      {"<|vision_end|>", 248054},   {"<|image_pad|>", 248056}, {"<|video_pad|>", 248057},
      {"<tool_call>", 248058},      {"</tool_call>", 248059},  {"<tool_response>", 248066},
      {"</tool_response>", 248067}, {"<think>", 248068},       {"</think>", 248069}};
  for (const auto& [s, id] : specials) ASSERT_EQ(tok.token_to_id(s), id) << s;
  size_t special_seen = 0;
  for (const auto& c : fixtures()) {
    if (!c.contains("expected")) continue;
    const std::string name = c["name"].get<std::string>();
    const std::string want = c["expected"].get<std::string>();
    const std::vector<int32_t> want_ids = tok.encode(want);
    EXPECT_EQ(tok.encode(render_fixture(c).text), want_ids) << name;
    for (const auto& [s, id] : specials) {
      const size_t n = count_of(want, s);
      EXPECT_EQ(static_cast<size_t>(std::count(want_ids.begin(), want_ids.end(), id)), n) << name << ": " << s;
      special_seen += n;
    }
  }
  EXPECT_GT(special_seen, 200u);
}

// --- hand-written cases (readable examples of the format) -----------------------------------------------

TEST(ChatTemplate, UserTurnWithThinkingOnAndOff) {
  const std::vector<ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(render_chat(m, {}), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  ChatOptions o;
  o.enable_thinking = false;
  EXPECT_EQ(render_chat(m, o), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, SystemFirstAndEarlierThinkBlocksStripped) {
  const std::vector<ChatMessage> m = {
      {"system", " Be brief.\n"},
      {"user", "2+2?"},
      {"assistant", "<think>\nadd them\n</think>\n\n4"},
      {"user", "and 3+3?"},
  };
  EXPECT_EQ(render_chat(m, {}),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nand 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
}

// preserve_thinking (chat_template_kwargs, not the template's own): earlier turns keep their reasoning,
// so a resent history renders as it was generated; turns without reasoning are unchanged.
TEST(ChatTemplate, PreserveThinkingKeepsEarlierReasoning) {
  const std::vector<ChatMessage> m = {
      {"user", "2+2?"},
      {"assistant", "<think>\nadd them\n</think>\n\n4"},
      {"user", "3+3?"},
      {"assistant", "6"},
      {"user", "and 4+4?"},
  };
  ChatOptions keep;
  keep.preserve_thinking = true;
  EXPECT_EQ(render_chat(m, keep),
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n"
            "<|im_start|>user\n3+3?<|im_end|>\n"
            "<|im_start|>assistant\n6<|im_end|>\n"
            "<|im_start|>user\nand 4+4?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, ToolLoopKeepsCurrentReasoningAndGroupsResults) {
  const std::vector<ChatMessage> m = {
      {"user", "Weather in Paris and Rome?"},
      {"assistant", "", "need two lookups",
       {ToolCall{"get_weather", {{"city", "\"Paris\""}}}, ToolCall{"get_weather", {{"city", "\"Rome\""}, {"days", "2"}}}}},
      {"tool", "sunny"},
      {"tool", "rainy"},
  };
  ChatOptions o;
  o.tools = {R"({"type":"function","function":{"name":"get_weather"}})"};
  const std::string s = render_chat(m, o);
  EXPECT_EQ(s.rfind("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
                    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}\n</tools>",
                    0),
            0u);
  const std::string tail =
      "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nneed two lookups\n</think>\n\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
      "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
      "</function>\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\n";
  ASSERT_GE(s.size(), tail.size());
  EXPECT_EQ(s.substr(s.size() - tail.size()), tail);
}

TEST(ChatTemplate, Errors) {
  test::expect_error([] { render_chat({}, {}); }, {"No messages provided."});
  const std::vector<ChatMessage> late = {{"user", "a"}, {"system", "b"}};
  test::expect_error([&] { render_chat(late, {}); }, {"System message must be at the beginning.", "messages[1]"});
  const std::vector<ChatMessage> bad = {{"user", "a"}, {"robot", "a"}};
  test::expect_error([&] { render_chat(bad, {}); }, {"Unexpected message role.", "'robot'", "messages[1]"});
  const std::vector<ChatMessage> none = {{"assistant", "a"}, {"user", "<tool_response>x</tool_response>"}};
  test::expect_error([&] { render_chat(none, {}); }, {"No user query found in messages."});
  const std::vector<ChatMessage> sys_img = {{"system", "", {}, {}, {{ContentPart::Kind::image}}}, {"user", "a"}};
  test::expect_error([&] { render_chat(sys_img, {}); }, {"System message cannot contain images.", "messages[0].content[0]"});
  const std::vector<ChatMessage> both = {{"user", "a", {}, {}, {{ContentPart::Kind::text, "b"}}}};
  test::expect_error([&] { render_chat(both, {}); }, {"messages[0] has both content text and content parts"});
  ChatOptions o;
  o.tools = {"{not json"};
  test::expect_error([&] { render_chat(std::vector<ChatMessage>{{"user", "a"}}, o); }, {"tools[0] is not valid JSON"});
  const std::vector<ChatMessage> arg = {{"user", "a"}, {"assistant", "", {}, {ToolCall{"f", {{"x", "Paris"}}}}}};
  test::expect_error([&] { render_chat(arg, {}); }, {"parameter 'x' of tool call 'f' is not valid JSON"});
}

TEST(ChatTemplate, SplitReasoning) {
  EXPECT_EQ(split_reasoning("<think>\nplan\n</think>\n\nanswer"), std::make_pair(std::string("plan"), std::string("answer")));
  EXPECT_EQ(split_reasoning("plan</think>answer"), std::make_pair(std::string("plan"), std::string("answer")));
  EXPECT_EQ(split_reasoning("just text"), std::make_pair(std::string(), std::string("just text")));
  EXPECT_EQ(split_reasoning("<think>a<think>\n b \n</think>x</think>\n\ny"), std::make_pair(std::string("b"), std::string("y")));
}

TEST(ChatTemplate, PythonStripIsUnicodeWhitespace) {
  EXPECT_EQ(python_strip(" \t\n\v\f\r\x1c\x1d\x1e\x1f x \x1f"), "x");
  EXPECT_EQ(python_strip("\u3000\u00a0\u0085\u1680\u2000\u200a\u2028\u2029\u202f\u205fx\u3000"), "x");
  EXPECT_EQ(python_strip("\u200bx\ufeff"), "\u200bx\ufeff");  // zero-width space and BOM are not whitespace
  EXPECT_EQ(python_strip("\x80 x \xe3\x80"), "\x80 x \xe3\x80");  // malformed UTF-8 is kept as is
  EXPECT_EQ(python_strip(" \xc3\xa9 "), "\xc3\xa9");
  EXPECT_EQ(python_strip("   "), "");
}

TEST(ChatTemplate, JsonDumpsLikePython) {
  const auto d = [](const char* text) { return json_dumps_python(ojson::parse(text)); };
  EXPECT_EQ(d(R"({"b": 1, "a": [1, 2.0, -0.0, 1e16, 1e15, 0.0001, 1e-5, 0.1, 1.5e300, 123456789012345678.0]})"),
            R"({"b": 1, "a": [1, 2.0, -0.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, 0.1, 1.5e+300, 1.2345678901234568e+17]})");
  EXPECT_EQ(d(R"(["\"\\\/\b\f\n\r\t\u0001\u001f\u007f", "ü中😀", {}, [], null, true, false, 18446744073709551615, -9223372036854775808])"),
            "[\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\", \"ü中😀\", {}, [], null, true, false, 18446744073709551615, "
            "-9223372036854775808]");
}

// --- OpenAI-shaped JSON in -------------------------------------------------------------------------------

TEST(ChatTemplate, MessageFromJson) {
  const ChatMessage m = chat_message_from_json(ojson::parse(R"({"role": "assistant", "content": null,
      "reasoning_content": "r", "tool_calls": [{"type": "function", "function": {"name": "f",
      "arguments": "{\"z\": 1, \"a\": {\"k\": [true]}, \"s\": \"x\"}"}}, {"name": "g", "arguments": {"b": null}}]})"));
  EXPECT_EQ(m.role, "assistant");
  EXPECT_EQ(m.content, "");
  EXPECT_EQ(m.reasoning, std::optional<std::string>("r"));
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  const std::vector<std::pair<std::string, std::string>> args = {{"z", "1"}, {"a", R"({"k":[true]})"}, {"s", "\"x\""}};
  EXPECT_EQ(m.tool_calls[0].arguments, args);
  EXPECT_EQ(m.tool_calls[1].arguments, (std::vector<std::pair<std::string, std::string>>{{"b", "null"}}));
  const ChatMessage p = chat_message_from_json(ojson::parse(
      R"({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}, {"video": "v"}]})"));
  ASSERT_EQ(p.parts.size(), 3u);
  EXPECT_EQ(p.parts[0].kind, ContentPart::Kind::text);
  EXPECT_EQ(p.parts[0].text, "a");
  EXPECT_EQ(p.parts[1].kind, ContentPart::Kind::image);
  EXPECT_EQ(p.parts[2].kind, ContentPart::Kind::video);
}

TEST(ChatTemplate, MalformedJsonNamesTheFieldAndMessage) {
  const auto msgs = [](const char* text) { return chat_messages_from_json(ojson::parse(text)); };
  test::expect_error([&] { msgs(R"({"role": "user"})"); }, {"messages must be a list"});
  test::expect_error([&] { msgs(R"([{"role": "user", "content": "a"}, "hi"])"); }, {"messages[1] must be an object"});
  test::expect_error([&] { msgs(R"([{"content": "a"}])"); }, {"messages[0].role must be a string"});
  test::expect_error([&] { msgs(R"([{"role": "user", "content": 5}])"); },
                     {"Unexpected content type.", "messages[0].content is a number"});
  test::expect_error([&] { msgs(R"([{"role": "user", "content": ["a"]}])"); },
                     {"Unexpected item type in content.", "messages[0].content[0] is a string"});
  test::expect_error([&] { msgs(R"([{"role": "user", "content": [{"type": "audio"}]}])"); },
                     {"Unexpected item type in content.", "messages[0].content[0]"});
  test::expect_error([&] { msgs(R"([{"role": "user", "content": [{"text": {"a": 1}}]}])"); },
                     {"messages[0].content[0].text must be text"});
  test::expect_error([&] { msgs(R"([{"role": "assistant", "reasoning_content": 1}])"); },
                     {"messages[0].reasoning_content must be a string"});
  test::expect_error([&] { msgs(R"([{"role": "user"}, {"role": "assistant", "tool_calls": {"name": "f"}}])"); },
                     {"messages[1].tool_calls must be a list"});
  test::expect_error([&] { msgs(R"([{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}])"); },
                     {"messages[0].tool_calls[0].function.name must be a string"});
  test::expect_error([&] { msgs(R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])"); },
                     {"messages[0].tool_calls[0].function.arguments is not valid JSON"});
  test::expect_error([&] { msgs(R"([{"role": "assistant", "tool_calls": [{"name": "f", "arguments": "[1]"}]}])"); },
                     {"messages[0].tool_calls[0].arguments must be an object or a JSON string of one (got array)"});
  test::expect_error([&] { chat_tools_from_json(ojson::parse(R"([{"type": "function"}, 3])")); }, {"tools[1] must be an object"});
  test::expect_error([&] { chat_tools_from_json(ojson::parse(R"(["{bad"])")); }, {"tools[0] is not valid JSON"});
  test::expect_error([&] { chat_tools_from_json(ojson::parse(R"({"type": "function"})")); }, {"tools must be a list"});
  EXPECT_EQ(chat_tools_from_json(ojson::parse(R"([" {\"a\": 1} ", {"b": 2}])")),
            (std::vector<std::string>{R"({"a":1})", R"({"b":2})"}));
  EXPECT_TRUE(chat_tools_from_json(ojson()).empty());
}

// --- the model folder's own template ---------------------------------------------------------------------

TEST(ChatTemplate, FingerprintIsTheGeneratorsAndNormalisesLineEnds) {
  const ojson fp = ojson::parse(read_all(kChatData + "/template_fingerprint.json"));
  EXPECT_EQ(fp["fnv1a64"].get<std::string>(), [] {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(kQwen35ChatTemplateFingerprint));
    return std::string(b);
  }()) << "regenerate the fixtures and update kQwen35ChatTemplateFingerprint together";
  EXPECT_EQ(chat_template_fingerprint(""), 0xcbf29ce484222325ull);  // FNV-1a 64 test vectors
  EXPECT_EQ(chat_template_fingerprint("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(chat_template_fingerprint("a\n"), chat_template_fingerprint("a"));
  EXPECT_EQ(chat_template_fingerprint("x\r\ny\r\n"), chat_template_fingerprint("x\ny"));
  EXPECT_NE(chat_template_fingerprint("a\n\n"), chat_template_fingerprint("a"));
}

TEST(ChatTemplate, NoteWhenTheModelFolderTemplateDiffers) {
  test::TempDir dir;
  EXPECT_EQ(chat_template_note(dir.str()), "");  // no template at all
  test::write_text(dir.file("tokenizer_config.json"), R"({"chat_template": "{{ messages }}"})");
  EXPECT_EQ(chat_template_note(dir.str()), "note: " + dir.file("tokenizer_config.json") +
                                               "'s chat_template differs from the Qwen3.5 template Tandem renders "
                                               "natively; chats use Tandem's rendering");
  test::write_text(dir.file("chat_template.jinja"), "{{ messages }}\n");
  EXPECT_EQ(chat_template_note(dir.str()), "note: " + dir.file("chat_template.jinja") +
                                               " differs from the Qwen3.5 template Tandem renders natively; chats use "
                                               "Tandem's rendering");
  test::TempDir sub;
  std::filesystem::create_directory(sub.file("chat_template.jinja"));  // not a regular file: never read
  EXPECT_NE(chat_template_note(sub.str()).find("could not be read"), std::string::npos);
  test::TempDir plain;
  test::write_text(plain.file("tokenizer_config.json"), R"({"eos_token": "<|im_end|>"})");
  EXPECT_EQ(chat_template_note(plain.str()), "");
}

// The real template, where ../shared is beside the checkout: the same text gives no note (as the .jinja
// file and as tokenizer_config.json's string without the trailing newline); a one-byte change gives one.
TEST(ChatTemplate, NoNoteForTheModelsOwnTemplate) {
  const std::string shared = std::string(TANDEM_TEST_DATA) + "/../../../shared/qwen35/chat_template.jinja";
  if (!std::filesystem::is_regular_file(shared)) GTEST_SKIP() << "no " << shared;
  const std::string text = read_all(shared);
  EXPECT_EQ(chat_template_fingerprint(text), kQwen35ChatTemplateFingerprint);
  test::TempDir same, cfg, changed;
  test::write_text(same.file("chat_template.jinja"), text);
  EXPECT_EQ(chat_template_note(same.str()), "");
  std::string no_newline = text;
  if (!no_newline.empty() && no_newline.back() == '\n') no_newline.pop_back();
  test::write_text(cfg.file("tokenizer_config.json"), ojson{{"chat_template", no_newline}}.dump());
  EXPECT_EQ(chat_template_note(cfg.str()), "");
  std::string edited = text;
  edited[edited.find("<tools>")] = '[';
  test::write_text(changed.file("chat_template.jinja"), edited);
  EXPECT_NE(chat_template_note(changed.str()).find("differs from the Qwen3.5 template"), std::string::npos);
}

// Token level, spelled out for one turn: [248045, user, 198, hi, 248046, 198, 248045, assistant, 198, 248068, 198].
TEST(ChatTemplate, TokenIdsMatchTheSpecWithQwenSpecials) {
  const Tokenizer& tok = qwen_tokenizer();
  const auto enc = [&](const std::string& s) { return tok.encode(s); };
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  const std::vector<int32_t> nl = enc("\n");
  ASSERT_EQ(nl, std::vector<int32_t>{198});  // GPT-2 byte order: "\n" is byte token 198, as in Qwen
  const std::vector<ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(enc(render_chat(m, {})), cat({{248045}, enc("user"), nl, enc("hi"), {248046}, nl, {248045}, enc("assistant"), nl,
                                          {248068}, nl}));
  ChatOptions off;
  off.enable_thinking = false;
  EXPECT_EQ(enc(render_chat(m, off)), cat({{248045}, enc("user"), nl, enc("hi"), {248046}, nl, {248045}, enc("assistant"), nl,
                                           {248068}, enc("\n\n"), {248069}, enc("\n\n")}));
}

}  // namespace
}  // namespace tandem
