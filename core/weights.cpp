#include "core/weights.h"

#include <omp.h>

#include <vector>

#include "core/gptq.h"

namespace tandem {

void LinearWeight::dequant_row(int64_t n, float* row) const {
  if (kind == Kind::Dense) {
    const int64_t base = n * in;
    switch (dense_dtype) {
      case DType::BF16: {
        const auto* p = static_cast<const uint16_t*>(dense) + base;
        for (int64_t k = 0; k < in; ++k) row[k] = bf16_to_f32(p[k]);
        break;
      }
      case DType::F32: {
        const auto* p = static_cast<const float*>(dense) + base;
        for (int64_t k = 0; k < in; ++k) row[k] = p[k];
        break;
      }
      default:
        for (int64_t k = 0; k < in; ++k) row[k] = load_as_f32(dense, dense_dtype, base + k);
    }
    return;
  }
  const GptqView& g = gptq;
  for (int64_t k = 0; k < in; ++k) {
    const int64_t grp = g.g_idx ? g.g_idx[k] : k / g.group_size;
    const uint32_t qword = static_cast<uint32_t>(g.qweight[(k / 8) * out + n]);
    const int q = static_cast<int>((qword >> ((k % 8) * 4)) & 0xfu);
    const uint32_t zword = static_cast<uint32_t>(g.qzeros[grp * (out / 8) + n / 8]);
    const int z = gptq_zero_point(zword, n, g.zero_offset);
    const float s = load_as_f32(g.scales, g.scales_dtype, grp * out + n);
    row[k] = s * static_cast<float>(q - z);
  }
}

uint64_t LinearWeight::stored_bytes() const {
  if (kind == Kind::Dense) return static_cast<uint64_t>(out * in) * dtype_size(dense_dtype);
  if (kind == Kind::Gptq)
    return static_cast<uint64_t>(in / 8 * out * 4 + gptq.num_groups * (out / 8) * 4 +
                                 gptq.num_groups * out * dtype_size(gptq.scales_dtype) + (gptq.g_idx ? in * 4 : 0));
  return 0;
}

// Eight independent partial sums: vectorizes without -ffast-math and stays deterministic.
float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  float tail = 0.0f;
  for (; k < n; ++k) tail += a[k] * b[k];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

void linear_ref(const LinearWeight& w, const float* x, int64_t tokens, float* y) {
  // Threads only pay off on real sizes; tiny test models would spend their time in the runtime.
  const bool parallel = w.out * w.in * tokens >= (int64_t(1) << 18);
#pragma omp parallel if (parallel)
  {
    std::vector<float> row(static_cast<size_t>(w.in));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < w.out; ++n) {
      w.dequant_row(n, row.data());
      for (int64_t t = 0; t < tokens; ++t) {
        y[t * w.out + n] = dot_f32(row.data(), x + t * w.in, w.in);
      }
    }
  }
}

}  // namespace tandem
