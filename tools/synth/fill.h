// tools/synth/fill.h: the random contents of synthetic checkpoints, generated in parallel and
// reproducibly.
//
// Every element is a pure function of (seed, tensor name, element index): a counter-based SplitMix64
// stream keyed by the tensor (draw j = mix64(key + (j+1)·γ)), so any element range of any tensor can
// be produced by any thread, in any order, with identical results: how the writer cuts the work and
// how many threads run never change the output.
//
// Kinds (all little-endian):
//  - Normal:     a + b·s_row·n, n ≈ N(0,1) (Irwin–Hall of four 8-bit uniforms: mean 0, variance 1,
//                bounded at ±3.45; element i uses half i%2 of draw i/2), s_row from row_scale (per
//                index of the first dimension) or 1. Stored as BF16 / F16 / F32, rounded to nearest even.
//  - LogUniform: log(U(a, b)) (A_log = log A with A ~ U(1, 16)).
//  - Int4Codes:  GPTQ qweight words: 8 nibbles, each 8 + (u − v) with u, v uniform in 0..7 (bits of
//                the low / high half of one draw) — a triangular code distribution on 1..15, mean 8,
//                std √10.5 ≈ 3.24 around the sym zero.
//  - Constant32: every 32-bit word = `constant` (qzeros 0x77777777: v1 sym, stored zero 7).
//  - GroupIndex: int32 g_idx[k] = k / group_size.
//  - Scales:     b·(1 + a·(2u − 1)), u ~ U(0, 1), stored as F16 (GPTQ scales).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/format/safetensors_stream.h"

namespace tandem::synth {

enum class Fill : uint8_t { Normal, LogUniform, Int4Codes, Constant32, GroupIndex, Scales };

struct FillRecipe {
  Fill kind = Fill::Normal;
  float a = 0.0f, b = 1.0f;  // meaning per kind, see above
  std::shared_ptr<const std::vector<float>> row_scale;  // Normal: per-row std multiplier (optional)
  uint32_t constant = 0;
  int64_t group_size = 0;
};

struct PlannedTensor {
  TensorSpec spec;
  FillRecipe fill;
};

// Writes bytes [begin, end) of tensor t to `out`; both must be multiples of the element size.
void fill_range(const PlannedTensor& t, uint64_t seed, uint64_t begin, uint64_t end, std::byte* out);

// The whole tensor decoded to float32 (Normal/LogUniform/Scales kinds), exactly as it is stored:
// for measurements on tensors that are never written (e.g. --config-only reports, tests).
std::vector<float> generate_as_f32(const PlannedTensor& t, uint64_t seed);

// SplitMix64's output function; exposed for the other seeded draws of `tandem synth`.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The stream key of a tensor: depends on the seed and the name only.
uint64_t tensor_key(uint64_t seed, const std::string& name);

}  // namespace tandem::synth
