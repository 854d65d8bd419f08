// tandem tokenize / detokenize: the tokenizer on its own, for checks and scripts.
#include <cstdio>

#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "core/error.h"
#include "core/file_io.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::cli {

namespace {
Tokenizer open_tokenizer(const Args& a, const char* command) {
  if (a.has("model") == a.has("tokenizer"))
    throw UsageError(str_cat("tandem ", command, ": give exactly one of --model DIR or --tokenizer FILE"));
  return a.has("model") ? Tokenizer::from_model_dir(a.get("model")) : Tokenizer::from_file(a.get("tokenizer"));
}
}  // namespace

int cmd_tokenize(int argc, char** argv) {
  Args a("tokenize", {{"model", true, "model folder with tokenizer.json"},
                      {"tokenizer", true, "a tokenizer.json file"},
                      {"text", true, "text to encode"},
                      {"file", true, "file whose contents to encode"},
                      {"help", false, "show this help"}});
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  if (a.has("text") == a.has("file")) throw UsageError("tandem tokenize: give exactly one of --text or --file");
  std::string text;
  if (a.has("text")) {
    text = a.get("text");
  } else {
    text = read_text_file(a.get("file"), kMaxPromptFileBytes, "the --file text");
  }
  const Tokenizer tok = open_tokenizer(a, "tokenize");
  const auto ids = tok.encode(text);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  std::puts(out.c_str());
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  Args a("detokenize", {{"model", true, "model folder with tokenizer.json"},
                        {"tokenizer", true, "a tokenizer.json file"},
                        {"ids", true, "ids, comma/space separated, or @FILE"},
                        {"skip-special", false, "leave special tokens out"},
                        {"help", false, "show this help"}});
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  const auto ids = parse_id_list(a.get("ids"), "detokenize");
  const Tokenizer tok = open_tokenizer(a, "detokenize");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= tok.vocab_size())
      fail("--ids: token id ", ids[i], " at position ", i, " is outside the vocabulary (", tok.vocab_size(), " ids)");
  const std::string text = tok.decode(ids, a.has("skip-special"));
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace tandem::cli
