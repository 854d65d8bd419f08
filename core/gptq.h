// core/gptq.h: how a GPTQ checkpoint's packed zero points are read (spec §4), the one definition the
// reference, the CPU packer and the GPU repack share.
#pragma once

#include <cstdint>

namespace tandem {

// The zero point of column n in its packed qzeros word. v2 stores the zero points as they are. v1 is
// what GPTQModel (HF transformers' GPTQ backend) writes from them: each packed word minus 0x11111111,
// so a zero point of 0 borrows from the next nibble up. GPTQModel reads v1 back by adding 0x11111111
// to the whole word (mod 2^32), and so do we; adding 1 to each nibble alone differs wherever a zero
// point is 0. zero_offset: 1 for v1 ("gptq"), 0 for v2 ("gptq_v2").
inline int gptq_zero_point(uint32_t word, int64_t n, int zero_offset) {
  const uint32_t v2_word = word + 0x11111111u * static_cast<uint32_t>(zero_offset);
  return static_cast<int>((v2_word >> ((n % 8) * 4)) & 0xfu);
}

}  // namespace tandem
