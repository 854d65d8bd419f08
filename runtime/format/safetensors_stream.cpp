#include "runtime/format/safetensors_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"

namespace tandem {

namespace fs = std::filesystem;

uint64_t TensorSpec::nbytes() const {
  uint64_t n = static_cast<uint64_t>(dtype_size(dtype));
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string dir, std::vector<TensorSpec> tensors,
                                                 uint64_t max_shard_bytes)
    : dir_(std::move(dir)), tensors_(std::move(tensors)) {
  if (tensors_.empty()) fail(dir_, ": no tensors to write");
  // Shard assignment in list order (HF's greedy split).
  std::vector<std::vector<size_t>> groups(1);
  uint64_t acc = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const uint64_t b = tensors_[i].nbytes();
    if (!groups.back().empty() && acc + b > max_shard_bytes) {
      groups.emplace_back();
      acc = 0;
    }
    groups.back().push_back(i);
    acc += b;
    tensor_bytes_ += b;
  }

  where_.resize(tensors_.size());
  const size_t k = groups.size();
  for (size_t s = 0; s < k; ++s) {
    Shard sh;
    char name[64];
    if (k == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, k);
    sh.file = name;
    sh.tensors = std::move(groups[s]);
    std::stable_sort(sh.tensors.begin(), sh.tensors.end(), [&](size_t a, size_t b) {
      const int sa = dtype_size(tensors_[a].dtype), sb = dtype_size(tensors_[b].dtype);
      return sa != sb ? sa > sb : tensors_[a].name < tensors_[b].name;
    });
    // Written by hand: a 25k-entry header through ordered_json (linear key lookups) takes seconds.
    std::string& h = sh.header;
    h = R"({"__metadata__":{"format":"pt"})";
    uint64_t off = 0;
    for (size_t t : sh.tensors) {
      const TensorSpec& ts = tensors_[t];
      h += "," + nlohmann::json(ts.name).dump() + R"(:{"dtype":")" + std::string(dtype_name(ts.dtype)) + R"(","shape":[)";
      for (size_t d = 0; d < ts.shape.size(); ++d) {
        if (d) h += ',';
        h += std::to_string(ts.shape[d]);
      }
      h += R"(],"data_offsets":[)" + std::to_string(off) + "," + std::to_string(off + ts.nbytes()) + "]}";
      where_[t] = {s, off};  // relative for now
      off += ts.nbytes();
    }
    h += "}";
    sh.header.append((8 - sh.header.size() % 8) % 8, ' ');
    sh.data_start = 8 + sh.header.size();
    sh.data_bytes = off;
    for (size_t t : sh.tensors) where_[t].file_offset += sh.data_start;
    shards_.push_back(std::move(sh));
  }
  fds_.assign(shards_.size(), -1);
  tail_fds_.assign(shards_.size(), -1);
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (finished_) return;
  close_all();
  std::error_code ec;
  for (size_t s = 0; s < shards_.size(); ++s) fs::remove(path_of(s, true), ec);
}

uint64_t SafetensorsStreamWriter::file_bytes() const {
  uint64_t n = 0;
  for (const Shard& s : shards_) n += s.data_start + s.data_bytes;
  return n;
}

std::string SafetensorsStreamWriter::path_of(size_t shard, bool partial) const {
  return (fs::path(dir_) / (shards_[shard].file + (partial ? ".partial" : ""))).string();
}

std::string SafetensorsStreamWriter::header_bytes(size_t shard) const {
  const uint64_t len = shards_[shard].header.size();
  std::string head(reinterpret_cast<const char*>(&len), 8);  // little-endian on every supported platform
  return head + shards_[shard].header;
}

void SafetensorsStreamWriter::open(Io io) {
  direct_ = io == Io::Direct;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const std::string p = path_of(s, true);
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(p, ": cannot create (", std::strerror(errno), ")");
    fds_[s] = fd;
    if (direct_) {
      const int dfd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
      if (dfd < 0 && errno != EINVAL) fail(p, ": cannot open for direct I/O (", std::strerror(errno), ")");
      if (dfd >= 0) {
        tail_fds_[s] = fds_[s];
        fds_[s] = dfd;
      }
    }
    const Shard& sh = shards_[s];
    const off_t size = static_cast<off_t>(sh.data_start + sh.data_bytes);
    // Reserve the blocks up front: a full disk fails here, at once, not minutes into the run (and
    // writes into reserved extents skip block allocation). Filesystems without fallocate get a
    // sparse file instead.
    if (::fallocate(fd, 0, 0, size) != 0) {
      if (errno == ENOSPC)
        fail(p, ": not enough disk space for ", sh.data_start + sh.data_bytes, " bytes (", file_bytes(),
             " bytes in all shards)");
      if (::ftruncate(fd, size) != 0)
        fail(p, ": cannot size the file to ", sh.data_start + sh.data_bytes, " bytes (", std::strerror(errno), ")");
    }
    if (!direct_) {
      const std::string head = header_bytes(s);
      write(s, 0, head.data(), head.size());
    }
  }
}

void SafetensorsStreamWriter::write(size_t shard, uint64_t offset, const void* data, size_t n) const {
  const auto* p = static_cast<const char*>(data);
  if (tail_fds_[shard] >= 0 && n % kDirectAlign != 0) {
    // Direct I/O moves whole blocks: the aligned body goes direct, the file's last bytes buffered.
    const size_t body = n - n % kDirectAlign;
    pwrite_all(fds_[shard], shard, offset, p, body);
    pwrite_all(tail_fds_[shard], shard, offset + body, p + body, n - body);
    return;
  }
  pwrite_all(fds_[shard], shard, offset, p, n);
}

void SafetensorsStreamWriter::pwrite_all(int fd, size_t shard, uint64_t offset, const char* p, size_t n) const {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(path_of(shard, true), ": write failed at offset ", offset, " (", w < 0 ? std::strerror(errno) : "no progress",
                     "; disk full?)");
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

void SafetensorsStreamWriter::close_all() noexcept {
  for (auto* v : {&fds_, &tail_fds_})
    for (int& fd : *v)
      if (fd >= 0) {
        ::close(fd);
        fd = -1;
      }
}

void SafetensorsStreamWriter::finish() {
  for (size_t s = 0; s < shards_.size(); ++s)
    for (int* fd : {&fds_[s], &tail_fds_[s]}) {
      const int f = std::exchange(*fd, -1);
      if (f >= 0 && ::close(f) != 0) fail(path_of(s, true), ": close failed (", std::strerror(errno), ")");
    }
  // Shards get their final names, then the index (written atomically); a failure removes the shards
  // already renamed (the destructor removes the rest), so no folder ever has shards without an index.
  size_t renamed = 0;
  auto unrename = [&] {
    std::error_code ec;
    for (size_t s = 0; s < renamed; ++s) fs::remove(path_of(s, false), ec);
  };
  for (size_t s = 0; s < shards_.size(); ++s, ++renamed) {
    std::error_code ec;
    fs::rename(path_of(s, true), path_of(s, false), ec);
    if (ec) {
      unrename();
      fail(path_of(s, false), ": cannot rename from its .partial file (", ec.message(), ")");
    }
  }
  if (shards_.size() > 1) {
    nlohmann::json idx;  // sorted keys, as HF writes it
    idx["metadata"] = {{"total_size", tensor_bytes_}};
    idx["weight_map"] = nlohmann::json::object();
    for (size_t s = 0; s < shards_.size(); ++s)
      for (size_t t : shards_[s].tensors) idx["weight_map"][tensors_[t].name] = shards_[s].file;
    try {
      write_file_atomic((fs::path(dir_) / kIndexFile).string(), idx.dump(2) + "\n");
    } catch (...) {
      unrename();
      throw;
    }
  }
  finished_ = true;
}

std::vector<std::string> SafetensorsStreamWriter::written_files() const {
  std::vector<std::string> out;
  if (!finished_) return out;
  for (size_t s = 0; s < shards_.size(); ++s) out.push_back(path_of(s, false));
  if (shards_.size() > 1) out.push_back((fs::path(dir_) / kIndexFile).string());
  return out;
}

}  // namespace tandem
