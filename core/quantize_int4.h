// core/quantize_int4.h: a dense matrix quantized to 4 bits when a model is loaded (round to nearest,
// no calibration data), written in the GPTQ tensors' own layout so that every int4 path (the
// reference, the CPU packer, the GPU repack) reads it exactly as it reads a GPTQ checkpoint.
//
// Per output row n and group g of `group` consecutive inputs: asymmetric, as GPTQ's asymmetric mode,
// with the range clipped where that lowers the error. For each shrink r in 1, 0.975, ..., 0.8:
//   lo = min(0, r min w), hi = max(0, r max w), s = f16(( hi - lo) / 15), z = clamp(round(-lo / s), 0, 15),
//   q(k) = clamp(round(w(k) / s) + z, 0, 15), err = sum (w(k) - s (q(k) - z))^2 (fp32 sums)
// and the r with the least err is kept (the first on ties, so r = 1 unless clipping helps). The error
// is measured with the scale as stored (f16). A group of zeros gets s = 0, z = 8.
// W[n, k] = s(g, n) * (q(k, n) - z(g, n)): GPTQ "v2" zeros (stored as they are, zero_offset 0), no
// act-order (g = k / group).
#pragma once

#include <cstdint>
#include <numeric>

#include "core/weights.h"

namespace tandem {

// Bumped whenever the arithmetic above changes: caches made by another version are rebuilt.
inline constexpr int kInt4QuantizerVersion = 2;

// The group for `in` inputs: 128 where it divides, else 64 or 32; 0 when none does (not quantizable).
inline int64_t int4_group_for(int64_t in) {
  return in % 128 == 0 ? 128 : in % 64 == 0 ? 64 : in % 32 == 0 ? 32 : 0;
}
// An MoE's experts take one group (the GPU kernels need gate, up and down alike): the largest that
// divides both the hidden size and the experts' intermediate size.
inline int64_t int4_expert_group(int64_t hidden, int64_t intermediate) {
  return int4_group_for(std::gcd(hidden, intermediate));
}

// Quantizes `src` (Dense, any float dtype; out a multiple of 8, in of `group`, group of 8) into
// GPTQ tensors: qweight int32 [in / 8, out], qzeros int32 [in / group, out / 8], scales f16
// [in / group, out]. Rows run in parallel (OpenMP). tandem::Error naming the module otherwise, and
// naming the row and input of a weight no int4 code can mean (NaN, inf, |w| beyond 15 f16 scales).
void quantize_int4_gptq(const LinearWeight& src, int64_t group, int32_t* qweight, int32_t* qzeros, uint16_t* scales);

// The same matrix's view over those tensors (what the loader makes of a GPTQ checkpoint's).
LinearWeight int4_gptq_view(const std::string& name, int64_t out, int64_t in, int64_t group, const int32_t* qweight,
                            const int32_t* qzeros, const uint16_t* scales);

}  // namespace tandem
