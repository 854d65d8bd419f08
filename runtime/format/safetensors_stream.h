// runtime/format/safetensors_stream.h: writes checkpoints too large to hold in memory (tens of GB), in the
// layout HF's save_pretrained produces, with the data filled in later, in any order, from any thread.
//
// The layout is fixed up front from the tensor list alone: tensors go to shards in list order, a new
// shard starting when the next tensor would push the current one past `max_shard_bytes` (a tensor
// larger than that gets a shard of its own). Inside a shard, tensors are ordered by element size
// (largest first), then by name, as the safetensors reference writer does, so every tensor is
// aligned to its element size. One shard is `model.safetensors`; several are
// `model-0000i-of-0000K.safetensors` plus `model.safetensors.index.json`
// ({"metadata": {"total_size"}, "weight_map"}).
//
// Lifecycle: plan (constructor) -> open() creates every file at full size (blocks reserved with
// fallocate where the filesystem can) under a `.partial` name -> write() from any number of threads
// (pwrite, no shared state) -> finish() closes, renames the files to their final names and writes the
// index (atomically: a temporary name, then a rename). A writer destroyed before finish() removes its
// partial files, and a failing finish() the shards it renamed, so a failed run never leaves a loadable
// but incomplete model.
//
// Two I/O modes. Buffered: open() writes the headers, write() takes any range. Direct (O_DIRECT, for
// tens of GB: no page-cache copy, no writeback stalls; ~2 GB/s where buffered writes managed 0.3 on
// the same VM): the caller writes whole files including the header bytes (header_bytes()), from
// kDirectAlign-aligned buffers at kDirectAlign-aligned offsets, in multiples of kDirectAlign except for
// the range that ends a file. Filesystems that refuse O_DIRECT (tmpfs) silently get buffered I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tandem {

struct TensorSpec {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

class SafetensorsStreamWriter {
 public:
  struct Shard {
    std::string file;       // final file name inside the folder
    std::string header;     // JSON header, space-padded to a multiple of 8 bytes
    uint64_t data_start = 0;  // 8 + header size
    uint64_t data_bytes = 0;
    std::vector<size_t> tensors;  // indices into tensors(), in file order
  };
  struct Location {
    size_t shard = 0;
    uint64_t file_offset = 0;  // absolute offset of the tensor's first byte in its file
  };

  SafetensorsStreamWriter(std::string dir, std::vector<TensorSpec> tensors, uint64_t max_shard_bytes);
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<Shard>& shards() const { return shards_; }
  const Location& location(size_t tensor) const { return where_[tensor]; }
  uint64_t tensor_bytes() const { return tensor_bytes_; }  // sum over tensors (the index's total_size)
  uint64_t file_bytes() const;                              // sum over shard files, headers included

  static constexpr uint64_t kDirectAlign = 4096;
  enum class Io : uint8_t { Buffered, Direct };

  void open(Io io = Io::Buffered);
  // The first data_start bytes of shard `shard`'s file: 8-byte little-endian length + JSON header.
  std::string header_bytes(size_t shard) const;
  // Thread-safe: `n` bytes into shard `shard` at absolute file offset `offset`. Throws on I/O errors.
  void write(size_t shard, uint64_t offset, const void* data, size_t n) const;
  void finish();
  // After finish(): the files it left (shards, index), so a caller that fails later can remove them.
  std::vector<std::string> written_files() const;

  static constexpr const char* kIndexFile = "model.safetensors.index.json";

 private:
  std::string path_of(size_t shard, bool partial) const;
  void pwrite_all(int fd, size_t shard, uint64_t offset, const char* p, size_t n) const;
  void close_all() noexcept;

  std::string dir_;
  std::vector<TensorSpec> tensors_;
  std::vector<Shard> shards_;
  std::vector<Location> where_;
  std::vector<int> fds_;         // O_DIRECT where granted, else buffered
  std::vector<int> tail_fds_;    // buffered, for the unaligned end of a file in direct mode
  bool direct_ = false;
  uint64_t tensor_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace tandem
