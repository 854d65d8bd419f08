#include "runtime/cli/output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "core/error.h"

namespace tandem::cli {

namespace {

// A pipe whose reading end is closed polls as an error: how an EPIPE is recognised when its errno was
// overwritten since (the failed write was an implicit flush long before).
bool reader_gone() {
  pollfd p{STDOUT_FILENO, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
}

[[noreturn]] void output_failed(int err) {
  if (err == EPIPE || reader_gone()) throw OutputClosed();
  throw OutputError(str_cat("writing to standard output: ", err ? std::strerror(err) : "a write failed (disk full or I/O error?)"));
}

}  // namespace

void write_stdout(std::string_view text) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) output_failed(errno);
}

void finish_stdout() {
  errno = 0;
  std::cout.flush();
  // ferror also catches a failure of an earlier, implicit flush whose errno is long gone: flushing
  // again reports the same condition (ENOSPC, EPIPE) for what is still buffered.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || std::cout.fail()) output_failed(errno);
}

}  // namespace tandem::cli
