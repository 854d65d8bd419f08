#include "core/quantize_int4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace tandem {

namespace {

constexpr int kShrinkSteps = 9;  // r = 1, 0.975, ..., 0.8
// The largest |w| a group can hold: 15 steps of f16's largest scale, at the smallest shrink.
constexpr float kMaxWeight = 65504.0f * 15.0f * 0.8f;

// Round to nearest, ties to even, for |x| < 2^22: adding and taking away 1.5 * 2^23 leaves no
// fraction bits (the default rounding mode's rule). nearbyint without SSE4.1 is a library call.
inline float round_even(float x) {
  constexpr float kMagic = 12582912.0f;  // (x + C) - C is not x in IEEE arithmetic: compilers keep both
  return (x + kMagic) - kMagic;
}

struct GroupCode {
  uint16_t scale = 0;  // f16
  int zero = 8;
};

// One group's scale and zero (header comment); its codes into `q` (`cand`, `sq`: scratch of n).
GroupCode quantize_group(const float* __restrict w, int64_t n, uint8_t* q, uint8_t* __restrict cand, float* __restrict sq) {
  float mn = 0, mx = 0;
  for (int64_t k = 0; k < n; ++k) mn = std::min(mn, w[k]), mx = std::max(mx, w[k]);
  GroupCode best;
  if (mn == 0 && mx == 0) {
    std::fill_n(q, n, uint8_t{8});
    return best;
  }
  float best_err = INFINITY;
  for (int i = 0; i < kShrinkSteps; ++i) {
    const float r = 1.0f - 0.025f * static_cast<float>(i);
    const float lo = std::min(0.0f, r * mn), hi = std::max(0.0f, r * mx);
    uint16_t s16 = f32_to_f16((hi - lo) / 15.0f);
    float s = f16_to_f32(s16);
    if (!(s > 0) || !std::isfinite(s)) {  // below f16's smallest step (or above its largest): the nearest usable one
      s16 = s > 0 ? uint16_t{0x7bff} : uint16_t{0x0001};
      s = f16_to_f32(s16);
    }
    const int zi = static_cast<int>(std::clamp(std::nearbyint(-lo / s), 0.0f, 15.0f));
    // Two plain loops (the codes and squared errors, then eight partial sums: n is a multiple of 8)
    // vectorize at the baseline ISA, and the sum is the same on every machine.
    for (int64_t k = 0; k < n; ++k) {
      // |w / s| <= 15 / 0.8 (s spans at least r of every weight), well inside round_even's range
      const int c = std::min(std::max(static_cast<int>(round_even(w[k] / s)) + zi, 0), 15);
      cand[k] = static_cast<uint8_t>(c);
      const float d = w[k] - s * static_cast<float>(c - zi);
      sq[k] = d * d;
    }
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t k = 0; k < n; k += 8)
      for (int j = 0; j < 8; ++j) acc[j] += sq[k + j];
    const float err = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    if (err < best_err) {
      best_err = err;
      best = {s16, zi};
      std::copy_n(cand, n, q);
    }
  }
  return best;
}

}  // namespace

void quantize_int4_gptq(const LinearWeight& src, int64_t group, int32_t* qweight, int32_t* qzeros, uint16_t* scales) {
  const int64_t N = src.out, K = src.in;
  if (src.kind != LinearWeight::Kind::Dense) fail("quantize to int4: '", src.name, "' is not a dense (floating-point) matrix");
  if (group <= 0 || group % 8 != 0 || K % group != 0 || N % 8 != 0)
    fail("quantize to int4: '", src.name, "' is ", N, "x", K, "; it needs rows in multiples of 8 and inputs in groups of ", group,
         " (a multiple of 8)");
  const int64_t G = K / group;
  // A weight no code can mean: found inside the parallel loop (no exception may leave it), reported after.
  int64_t bad_row = -1, bad_input = -1;
  float bad_value = 0;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
    std::vector<uint8_t> q(static_cast<size_t>(K)), cand(static_cast<size_t>(K));
    std::vector<float> sq(static_cast<size_t>(K));
    std::vector<uint32_t> zwords(static_cast<size_t>(G));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < N / 8; ++b) {  // 8 rows: their zero points share one qzeros word per group
      std::fill(zwords.begin(), zwords.end(), 0u);
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t n = 8 * b + j;
        src.dequant_row(n, row.data());
        const auto bad = std::find_if(row.begin(), row.end(), [](float v) { return !(std::fabs(v) < kMaxWeight); });
        if (bad != row.end()) {  // NaN, inf or beyond any f16 scale: no code means it; the row is left unquantized
#pragma omp critical(tandem_quantize_int4_bad)
          if (bad_row < 0 || n < bad_row) bad_row = n, bad_input = bad - row.begin(), bad_value = *bad;
          continue;
        }
        for (int64_t g = 0; g < G; ++g) {
          const GroupCode c = quantize_group(row.data() + g * group, group, q.data() + g * group, cand.data(), sq.data());
          scales[g * N + n] = c.scale;
          zwords[g] |= static_cast<uint32_t>(c.zero) << (4 * j);
        }
        for (int64_t w = 0; w < K / 8; ++w) {
          uint32_t word = 0;
          for (int i = 0; i < 8; ++i) word |= static_cast<uint32_t>(q[8 * w + i]) << (4 * i);
          qweight[w * N + n] = static_cast<int32_t>(word);
        }
      }
      for (int64_t g = 0; g < G; ++g) qzeros[g * (N / 8) + b] = static_cast<int32_t>(zwords[g]);
    }
  }
  if (bad_row >= 0)
    fail("quantize to int4: '", src.name, "' row ", bad_row, " input ", bad_input, " holds ", bad_value,
         ", which int4 with an f16 scale cannot represent");
}

LinearWeight int4_gptq_view(const std::string& name, int64_t out, int64_t in, int64_t group, const int32_t* qweight,
                            const int32_t* qzeros, const uint16_t* scales) {
  LinearWeight w;
  w.kind = LinearWeight::Kind::Gptq;
  w.name = name;
  w.out = out;
  w.in = in;
  w.gptq.qweight = qweight;
  w.gptq.qzeros = qzeros;
  w.gptq.scales = scales;
  w.gptq.scales_dtype = DType::F16;
  w.gptq.group_size = group;
  w.gptq.num_groups = in / group;
  w.gptq.zero_offset = 0;
  return w;
}

}  // namespace tandem
