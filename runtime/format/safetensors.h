// runtime/format/safetensors.h: memory-mapped, zero-copy access to safetensors checkpoints.
//
// Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data section; offsets are relative to the data section. Files are mapped read-only and
// tensors are handed out as pointers into the mapping (no copies). A Checkpoint is one file
// (`model.safetensors`) or several shards listed by `model.safetensors.index.json`.
//
// Every header is validated once, at open: well-formed JSON, known dtypes, offsets inside the file,
// shape x dtype size == byte length, no two tensors overlapping. Errors name the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace tandem {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;  // "[256, 1024, 2048]"
};

// Parses and validates a header (the JSON text only) against a data section of `data_size` bytes.
// Pure function (no I/O) so that it can be fuzzed. `file` only appears in error messages.
// Entries are returned in file order (sorted by offset); `__metadata__` is skipped.
std::vector<TensorInfo> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 const std::string& file);

class MappedFile {
 public:
  static MappedFile open_readonly(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// A tensor of an open checkpoint: its header entry and where its bytes are mapped.
struct TensorRef {
  const TensorInfo* info = nullptr;
  const std::byte* data = nullptr;
  const std::string* file = nullptr;

  const std::string& name() const { return info->name; }
  DType dtype() const { return info->dtype; }
  const std::vector<int64_t>& shape() const { return info->shape; }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return map_.path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::byte* data_of(const TensorInfo& t) const { return map_.data() + data_start_ + t.offset; }

 private:
  MappedFile map_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
};

class Checkpoint {
 public:
  // `dir` holds model.safetensors.index.json (sharded), or model.safetensors, or *.safetensors files.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const TensorRef* find(std::string_view name) const;
  // Throws a tandem::Error naming the tensor and the checkpoint folder when it is absent.
  const TensorRef& get(std::string_view name) const;
  // Throws unless the tensor exists with exactly this shape; `dtypes` lists the accepted ones.
  const TensorRef& get(std::string_view name, const std::vector<int64_t>& shape,
                       std::initializer_list<DType> dtypes) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;
  uint64_t total_bytes() const;
  size_t num_files() const { return files_.size(); }

 private:
  void add_file(std::unique_ptr<SafetensorsFile> f);

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef, std::less<>> tensors_;
};

}  // namespace tandem
