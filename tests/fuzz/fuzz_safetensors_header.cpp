// libFuzzer target: the safetensors header parser must turn any input into either a tensor list or
// a tandem::Error, never a crash, hang or sanitizer report. Input: 8 bytes of data-section size,
// then the header text.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/error.h"
#include "runtime/format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_size = 0;
  std::memcpy(&data_size, data, 8);
  data_size %= (1ull << 32);
  const std::string_view header(reinterpret_cast<const char*>(data + 8), size - 8);
  try {
    const auto tensors = tandem::parse_safetensors_header(header, data_size, "fuzz.safetensors");
    for (const auto& t : tensors)
      if (t.offset + t.nbytes > data_size) __builtin_trap();  // a validated entry must lie inside the data
  } catch (const tandem::Error&) {
  }
  return 0;
}
