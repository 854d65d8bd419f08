// Scalar reference for cpu_experts/act_ops.h: defines the arithmetic the vector versions reproduce.
#include <algorithm>
#include <cmath>

#include "cpu_experts/act_ops.h"

namespace tandem::cpu {
const char* act_precision_name(ActPrecision p) { return p == ActPrecision::Int16 ? "int16" : "int8"; }
}  // namespace tandem::cpu

namespace tandem::cpu::ref {

void quantize_rows(const float* x, int64_t ldx, const int32_t* src_rows, int64_t rows, const int32_t* perm,
                   int64_t cols, int64_t cols_padded, int64_t group_size, const QuantActs& out) {
  const int64_t groups = cols_padded / group_size;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + (src_rows ? src_rows[r] : r) * ldx;
    auto at = [&](int64_t k) { return k < cols ? xr[perm ? perm[k] : k] : 0.0f; };
    int8_t* q = out.q + r * out.q_stride;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * group_size, k1 = k0 + group_size;
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(at(k)));
      const int32_t qmax = out.wide() ? kAct16Max : kAct8Max;
      const float fmax = static_cast<float>(qmax);
      const float inv = amax > 0.0f ? fmax / amax : 0.0f;
      int32_t sum = 0, sum_hi = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const int v = std::clamp(static_cast<int>(std::nearbyint(at(k) * inv)), -qmax, qmax);
        if (out.wide()) {
          const int32_t hi = act16_hi(v);
          out.q_hi[r * out.q_stride + k] = static_cast<int8_t>(hi);
          sum_hi += hi;
          q[k] = static_cast<int8_t>(v - kAct16Base * hi);
        } else {
          q[k] = static_cast<int8_t>(v);
        }
        sum += q[k];
      }
      out.scale[r * out.g_stride + g] = amax / fmax;
      if (out.wide()) out.sum_hi[r * out.g_stride + g] = sum_hi;
      out.sum[r * out.g_stride + g] = sum;
    }
  }
}

void swiglu(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] / (1.0f + exp_poly(-g[i])) * u[i];
}

}  // namespace tandem::cpu::ref
