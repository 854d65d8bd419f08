// tandem: command-line entry point. Errors at boundaries become one line on stderr and exit code
// 1 (bad input data: files, checkpoints, configs; a failed write to stdout) or 2 (bad usage: flags,
// values); a closed stdout pipe ends quietly with 141 (runtime/cli/output.h).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>

#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/output.h"
#include "core/error.h"
#include "core/trace.h"

namespace {

constexpr const char* kUsage =
    "usage: tandem <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate    text in, streamed text out (--chat for the chat template)\n"
    "  chat        interactive multi-turn conversation\n"
    "  tokenize    text to token ids; detokenize: ids to text\n"
    "  logits      run ids through the model and write float32 logits as .npy (regression checks)\n"
    "  info        describe a model folder: config, layout, tensor bytes, CUDA devices\n"
    "  bench       end-to-end speed: prefill, decode, latency, against the bandwidth bound\n"
    "  synth       write a model folder with random weights in the real format (tiny .. 35B-A3B)\n"
    "  plan        where weights and experts go for a GPU budget (placement YAML), and predicted speed\n"
    "  profile     count routed-expert activations over prompts -> heat.yaml for the planner\n"
    "  serve       OpenAI- and Anthropic-compatible HTTP server (continuous batching over the slots)\n"
    "\n"
    "Run 'tandem <command> --help' for the options of a command.\n";

struct Command {
  const char* name;
  int (*run)(int, char**);
};
constexpr Command kCommands[] = {
    {"generate", tandem::cli::cmd_generate}, {"chat", tandem::cli::cmd_chat},
    {"tokenize", tandem::cli::cmd_tokenize}, {"detokenize", tandem::cli::cmd_detokenize},
    {"logits", tandem::cli::cmd_logits},     {"bench", tandem::cli::cmd_bench},
    {"synth", tandem::cli::cmd_synth},       {"info", tandem::cli::cmd_info},
    {"plan", tandem::cli::cmd_plan},         {"profile", tandem::cli::cmd_profile},
    {"serve", tandem::cli::cmd_serve},
};

int run(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::puts("tandem 0.1.0");
    return 0;
  }
  for (const auto& c : kCommands)
    if (!std::strcmp(argv[1], c.name)) {
      const int rc = c.run(argc, argv);
      tandem::Trace::finish();  // --trace: the timeline of the whole command
      return rc;
    }
  std::vector<std::string> names;
  for (const auto& c : kCommands) names.push_back(c.name);
  const std::string near = tandem::cli::nearest(argv[1], names);
  std::fprintf(stderr, "tandem: unknown command %s%s%s%s; 'tandem --help' lists them\n", tandem::quote(argv[1]).c_str(),
               near.empty() ? "" : " (did you mean '", near.c_str(), near.empty() ? "" : "'?)");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a closed stdout is an EPIPE that finish_stdout() ends quietly (output.h)
  try {
    const int rc = run(argc, argv);
    tandem::cli::finish_stdout();
    return rc;
  } catch (const tandem::cli::OutputClosed&) {
    return tandem::cli::kExitOutputClosed;
  } catch (const tandem::cli::UsageError& e) {
    std::fprintf(stderr, "%s\n", tandem::printable(e.what()).c_str());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // e.g. a symlink loop met by a std::filesystem query
    std::fprintf(stderr, "tandem: error: %s: %s\n", tandem::printable(e.path1().string()).c_str(), e.code().message().c_str());
    return 1;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tandem: error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: internal error: %s\n", tandem::printable(e.what()).c_str());
    return 1;
  }
}
