// libFuzzer target: the reply parser takes any text without crashing; pushed in pieces (split where
// the input's first bytes say) its deltas concatenate to the one-shot parse, and every call's
// arguments are one JSON object.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/engine/reply_parser.h"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_reply: %s\n", what);
  std::abort();
}

const nlohmann::json& tools() {
  static const nlohmann::json t = nlohmann::json::parse(
      R"([{"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer"},
          "b": {"type": ["number", "null"]}, "o": {"type": "object"}, "l": {"type": "array"}, "f": {"type": "boolean"}}}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool thinking = data[0] & 1;
  const size_t piece = 1 + data[1] % 16;
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  const tandem::ParsedReply whole = tandem::parse_reply(text, thinking, tools());
  tandem::ReplyParser p(thinking, tools());
  std::string reasoning, content;
  std::vector<std::string> args;
  auto take = [&](const tandem::ReplyDelta& d) {
    reasoning += d.reasoning, content += d.content;
    for (const auto& c : d.tool_calls) {
      if (!c.name.empty()) args.emplace_back();
      if (c.index < 0 || c.index >= static_cast<int>(args.size())) broken("a delta for a call that never started");
      args[c.index] += c.arguments;
    }
  };
  for (size_t i = 0; i < text.size(); i += piece) take(p.push(std::string_view(text).substr(i, piece)));
  take(p.finish());
  if (reasoning != whole.reasoning || content != whole.content) broken("streamed text differs from the one-shot parse");
  if (args.size() != whole.tool_calls.size()) broken("streamed calls differ from the one-shot parse");
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != whole.tool_calls[i].arguments) broken("streamed arguments differ");
    const nlohmann::json a = nlohmann::json::parse(args[i], nullptr, false);
    if (a.is_discarded() || !a.is_object()) broken("arguments are not one JSON object");
  }
  return 0;
}
