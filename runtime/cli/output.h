// runtime/cli/output.h: standard output that cannot fail silently.
//
// main() ignores SIGPIPE and calls finish_stdout() after every command: a write error (a full disk,
// /dev/full, an I/O error) is "tandem: error: writing to standard output: <reason>" and exit 1, so a
// script never takes an empty file for a result; a reader that went away (`| head`) ends the command
// quietly with exit code 141 (128 + SIGPIPE, what the shell reports for a process the signal ended).
// Streaming output (generate, chat) goes through write_stdout(), which checks every piece, so a
// failed write stops the generation at once instead of after max-new-tokens.
#pragma once

#include <stdexcept>
#include <string_view>

#include "core/error.h"

namespace tandem::cli {

// Thrown when the reader of standard output is gone (EPIPE): main() exits 141 without a message.
struct OutputClosed : std::runtime_error {
  OutputClosed() : std::runtime_error("standard output closed") {}
};

constexpr int kExitOutputClosed = 141;

// A failed write to stdout (the message says why); a tandem::Error, so main() reports it as one.
struct OutputError : Error {
  using Error::Error;
};

// fwrite + fflush of `text` to stdout; OutputError or OutputClosed on failure.
void write_stdout(std::string_view text);
// Flushes stdout and std::cout and checks that nothing written to them failed; throws like write_stdout.
void finish_stdout();

}  // namespace tandem::cli
