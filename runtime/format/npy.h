// runtime/format/npy.h: NumPy .npy files (format 1.0, little-endian float32, C order): logits out, references in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Reads a '<f4' C-order array; throws tandem::Error naming the file on anything else.
NpyArray read_npy_f32(const std::string& path);

}  // namespace tandem
