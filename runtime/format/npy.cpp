#include "runtime/format/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace tandem {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ", ";
    n *= d;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header + '\n' is padded to a multiple of 64 bytes.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, ": cannot open for writing");
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(magic, 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  if (!out) fail(path, ": write failed");
}

NpyArray read_npy_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, ": not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t l16 = 0;
    in.read(reinterpret_cast<char*>(&l16), 2);
    hlen = l16;
  } else {
    in.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  in.read(header.data(), hlen);
  if (!in) fail(path, ": truncated .npy header");
  if (header.find("'descr': '<f4'") == std::string::npos) fail(path, ": expected float32 ('<f4') data");
  if (header.find("'fortran_order': False") == std::string::npos) fail(path, ": expected C-order data");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('shape':\s*\(([^)]*)\))"))) fail(path, ": no shape in .npy header");
  NpyArray a;
  const std::string dims = m[1];
  const std::regex num(R"(\d+)");
  int64_t n = 1;
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    a.shape.push_back(std::stoll(it->str()));
    n *= a.shape.back();
  }
  a.data.resize(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(n * sizeof(float)));
  if (!in) fail(path, ": truncated .npy data (expected ", n, " float32 values)");
  return a;
}

}  // namespace tandem
