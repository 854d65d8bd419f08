#include "tools/synth/fill.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem::synth {

namespace {

// Irwin–Hall(4) of the four bytes of the 32-bit half `h` of a draw, scaled to unit variance:
// 1021 levels 0.0068 apart, finer than bf16 resolves beyond ±0.9. Two normals per 64-bit draw.
inline uint32_t byte_sum(uint32_t h) {
  const uint32_t pairs = (h & 0x00ff00ffu) + ((h >> 8) & 0x00ff00ffu);
  return (pairs & 0xffffu) + (pairs >> 16);  // 0..1020
}
inline float normal_level(uint32_t s) {
  constexpr float kScale = 0.0067658f;  // 1 / sqrt(4 (256^2 - 1) / 12)
  return static_cast<float>(static_cast<int>(s) - 510) * kScale;
}
inline float approx_normal(uint32_t h) { return normal_level(byte_sum(h)); }

// Element i of a Normal tensor: half i % 2 of draw i / 2.
inline float approx_normal_at(uint64_t key, uint64_t i) {
  const uint64_t r = mix64(key + (i / 2 + 1) * kGolden);
  return approx_normal(static_cast<uint32_t>(i & 1 ? r >> 32 : r));
}

inline double uniform01(uint64_t r) { return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0); }

// Eight nibbles 8 + u - v at once: per nibble 8 + u is 8..15 and v 0..7, so no borrow crosses nibbles.
inline uint32_t int4_word(uint64_t r) {
  const uint32_t u = static_cast<uint32_t>(r) & 0x77777777u, v = static_cast<uint32_t>(r >> 32) & 0x77777777u;
  return (0x88888888u + u) - v;
}

int64_t row_length(const TensorSpec& s) {
  int64_t n = 1;
  for (size_t d = 1; d < s.shape.size(); ++d) n *= s.shape[d];
  return n;
}

// Normal without row scales: the 1021 possible stored values come from a table.
template <typename T, typename Convert>
void fill_normal_table(const FillRecipe& f, uint64_t key, uint64_t first, uint64_t count, T* out, Convert convert) {
  T table[1021];
  for (uint32_t s = 0; s < 1021; ++s) table[s] = convert(f.a + f.b * normal_level(s));
  uint64_t i = 0;
  if ((first & 1) && count > 0) {
    const uint64_t r = mix64(key + (first / 2 + 1) * kGolden);
    out[0] = table[byte_sum(static_cast<uint32_t>(r >> 32))];
    i = 1;
  }
  for (uint64_t pair = (first + i) / 2 + 1; i + 1 < count; i += 2, ++pair) {
    const uint64_t r = mix64(key + pair * kGolden);
    // Both halves' byte sums at once: 16-bit lanes of byte pairs, then lane pairs.
    const uint64_t p = (r & 0x00ff00ff00ff00ffull) + ((r >> 8) & 0x00ff00ff00ff00ffull);
    const uint64_t q = p + (p >> 16);
    out[i] = table[q & 0xffff];
    out[i + 1] = table[(q >> 32) & 0xffff];
  }
  if (i < count) {
    const uint64_t r = mix64(key + ((first + i) / 2 + 1) * kGolden);
    out[i] = table[byte_sum(static_cast<uint32_t>((first + i) & 1 ? r >> 32 : r))];
  }
}

template <typename Store>
void fill_elements(const PlannedTensor& t, uint64_t key, uint64_t first, uint64_t count, Store store) {
  const FillRecipe& f = t.fill;
  switch (f.kind) {
    case Fill::Normal: {
      const std::vector<float>* rs = f.row_scale.get();
      const uint64_t row_len = static_cast<uint64_t>(row_length(t.spec));
      auto scale = [&](uint64_t e) { return rs ? f.b * (*rs)[static_cast<size_t>(e / row_len)] : f.b; };
      // Whole pairs share a draw; an odd first or last element takes its half alone.
      uint64_t i = 0;
      if ((first & 1) && count > 0) {
        store(0, f.a + scale(first) * approx_normal_at(key, first));
        i = 1;
      }
      for (uint64_t pair = (first + i) / 2 + 1; i + 1 < count; i += 2, ++pair) {
        const uint64_t r = mix64(key + pair * kGolden);
        store(i, f.a + scale(first + i) * approx_normal(static_cast<uint32_t>(r)));
        store(i + 1, f.a + scale(first + i + 1) * approx_normal(static_cast<uint32_t>(r >> 32)));
      }
      if (i < count) store(i, f.a + scale(first + i) * approx_normal_at(key, first + i));
      return;
    }
    case Fill::LogUniform: {
      uint64_t ctr = key + (first + 1) * kGolden;
      for (uint64_t i = 0; i < count; ++i, ctr += kGolden)
        store(i, static_cast<float>(std::log(f.a + (f.b - f.a) * uniform01(mix64(ctr)))));
      return;
    }
    case Fill::Scales: {
      uint64_t ctr = key + (first + 1) * kGolden;
      for (uint64_t i = 0; i < count; ++i, ctr += kGolden)
        store(i, static_cast<float>(f.b * (1.0 + f.a * (2.0 * uniform01(mix64(ctr)) - 1.0))));
      return;
    }
    default:
      fail("internal: fill kind ", static_cast<int>(f.kind), " has no float values (", t.spec.name, ")");
  }
}

}  // namespace

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(mix64(seed) ^ mix64(h));
}

void fill_range(const PlannedTensor& t, uint64_t seed, uint64_t begin, uint64_t end, std::byte* out) {
  const uint64_t esize = static_cast<uint64_t>(dtype_size(t.spec.dtype));
  if (begin > end || end > t.spec.nbytes() || begin % esize || end % esize)
    fail("internal: byte range [", begin, ", ", end, ") of ", t.spec.name, " is outside it or splits an element");
  const uint64_t first = begin / esize, count = (end - begin) / esize;
  const uint64_t key = tensor_key(seed, t.spec.name);
  const FillRecipe& f = t.fill;

  switch (f.kind) {
    case Fill::Int4Codes: {
      auto* w = reinterpret_cast<uint32_t*>(out);
      uint64_t ctr = key + (first + 1) * kGolden;
      for (uint64_t i = 0; i < count; ++i, ctr += kGolden) w[i] = int4_word(mix64(ctr));
      return;
    }
    case Fill::Constant32: {
      auto* w = reinterpret_cast<uint32_t*>(out);
      for (uint64_t i = 0; i < count; ++i) w[i] = f.constant;
      return;
    }
    case Fill::GroupIndex: {
      auto* w = reinterpret_cast<int32_t*>(out);
      for (uint64_t i = 0; i < count; ++i) w[i] = static_cast<int32_t>((first + i) / static_cast<uint64_t>(f.group_size));
      return;
    }
    default:
      break;
  }
  if (f.kind == Fill::Normal && !f.row_scale) {
    switch (t.spec.dtype) {
      case DType::BF16:
        return fill_normal_table(f, key, first, count, reinterpret_cast<uint16_t*>(out), f32_to_bf16);
      case DType::F16:
        return fill_normal_table(f, key, first, count, reinterpret_cast<uint16_t*>(out), f32_to_f16);
      case DType::F32:
        return fill_normal_table(f, key, first, count, reinterpret_cast<float*>(out), [](float v) { return v; });
      default:
        break;
    }
  }
  switch (t.spec.dtype) {
    case DType::BF16: {
      auto* p = reinterpret_cast<uint16_t*>(out);
      fill_elements(t, key, first, count, [p](uint64_t i, float v) { p[i] = f32_to_bf16(v); });
      return;
    }
    case DType::F16: {
      auto* p = reinterpret_cast<uint16_t*>(out);
      fill_elements(t, key, first, count, [p](uint64_t i, float v) { p[i] = f32_to_f16(v); });
      return;
    }
    case DType::F32: {
      auto* p = reinterpret_cast<float*>(out);
      fill_elements(t, key, first, count, [p](uint64_t i, float v) { p[i] = v; });
      return;
    }
    default:
      fail("internal: cannot fill ", t.spec.name, " of dtype ", dtype_name(t.spec.dtype), " with floats");
  }
}

std::vector<float> generate_as_f32(const PlannedTensor& t, uint64_t seed) {
  const uint64_t n = t.spec.nbytes() / static_cast<uint64_t>(dtype_size(t.spec.dtype));
  std::vector<std::byte> raw(t.spec.nbytes());
  fill_range(t, seed, 0, raw.size(), raw.data());
  std::vector<float> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = load_as_f32(raw.data(), t.spec.dtype, static_cast<int64_t>(i));
  return out;
}

}  // namespace tandem::synth
