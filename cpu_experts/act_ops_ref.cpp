// Scalar reference for cpu_experts/act_ops.h: defines the arithmetic the vector versions reproduce.
#include <algorithm>
#include <cmath>

#include "cpu_experts/act_ops.h"

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
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const int v = static_cast<int>(std::nearbyint(at(k) * inv));
        q[k] = static_cast<int8_t>(std::clamp(v, -127, 127));
        sum += q[k];
      }
      out.scale[r * out.g_stride + g] = amax / 127.0f;
      out.sum[r * out.g_stride + g] = sum;
    }
  }
}

void swiglu(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] / (1.0f + exp_poly(-g[i])) * u[i];
}

}  // namespace tandem::cpu::ref
