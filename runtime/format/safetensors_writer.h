// runtime/format/safetensors_writer.h: writes safetensors files (used by tests and by tools that make models).
//
// Tensors are added with their raw little-endian bytes; write() lays out the header (8-byte aligned,
// space padded as the reference implementation does) and the data in insertion order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tandem {

class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  void add_metadata(const std::string& key, const std::string& value);
  // Writes the file; throws tandem::Error on I/O failure.
  void write(const std::string& path) const;
  // The file as bytes (header + data), for tests that corrupt it.
  std::string serialize() const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

}  // namespace tandem
