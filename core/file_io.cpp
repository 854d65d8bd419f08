#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace tandem {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

std::string reason(int err) {
  if (err == ELOOP) return "too many levels of symbolic links (a symlink loop?)";
  return std::strerror(err);
}

}  // namespace

std::string read_text_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    fail(path, ": cannot open ", what, " (", reason(err), ")");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, ": cannot read ", what, " (", reason(errno), ")");
  if (!S_ISREG(st.st_mode)) fail(path, ": cannot read ", what, ": it is ", kind_of(st.st_mode), ", not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    fail(path, ": ", what, " is ", size, " bytes, more than the ", max_bytes, "-byte limit for it");
  std::string text;
  text.resize(static_cast<size_t>(size));
  size_t got = 0;
  for (;;) {  // a file that grows while it is read stops at the limit too
    if (got == text.size()) {
      if (text.size() > max_bytes) break;
      text.resize(std::min<uint64_t>(max_bytes + 1, std::max<uint64_t>(text.size() * 2, 4096)));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, ": cannot read ", what, " (", reason(errno), ")");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) fail(path, ": ", what, " grew past the ", max_bytes, "-byte limit for it while being read");
  text.resize(got);
  return text;
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  // The rename would replace whatever is there: refuse anything but a plain file (a device, a folder).
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(path, ": exists and is ", S_ISLNK(st.st_mode) ? "a symbolic link" : kind_of(st.st_mode), ", not a regular file; not replacing it");
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, ": cannot create ", tmp, " (", std::strerror(errno), ")");
  auto fail_removing = [&](const char* step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    fail(path, ": ", step, " failed (", std::strerror(err), err == ENOSPC || err == EFBIG || err == EDQUOT ? "; disk full?" : "",
         "); nothing was written under this name");
  };
  for (size_t done = 0; done < contents.size();) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_removing("write", n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) fail_removing("fsync", errno);
  const int closed = ::close(fd);
  const int close_err = errno;
  if (closed != 0) {
    ::unlink(tmp.c_str());
    fail(path, ": close failed (", std::strerror(close_err), "); nothing was written under this name");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path, ": cannot rename ", tmp, " to it (", std::strerror(err), ")");
  }
}

}  // namespace tandem
