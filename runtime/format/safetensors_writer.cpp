#include "runtime/format/safetensors_writer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem {

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                            size_t nbytes) {
  entries_.push_back({name, dtype, std::move(shape), std::string(static_cast<const char*>(data), nbytes)});
}

void SafetensorsWriter::add_metadata(const std::string& key, const std::string& value) {
  metadata_.emplace_back(key, value);
}

std::string SafetensorsWriter::serialize() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    auto& m = header["__metadata__"];
    for (const auto& [k, v] : metadata_) m[k] = v;
  }
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t len = h.size();
  std::string out(reinterpret_cast<const char*>(&len), 8);
  out += h;
  for (const Entry& e : entries_) out += e.bytes;
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(path, ": cannot open for writing");
  const std::string bytes = serialize();
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) fail(path, ": write failed (disk full?)");
}

}  // namespace tandem
