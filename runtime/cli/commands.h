// runtime/cli/commands.h: the tandem subcommands. Each returns the process exit code.
#pragma once

namespace tandem::cli {

int cmd_logits(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_detokenize(int argc, char** argv);
int cmd_synth(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_profile(int argc, char** argv);
int cmd_serve(int argc, char** argv);

}  // namespace tandem::cli
