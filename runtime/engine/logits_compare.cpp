#include "runtime/engine/logits_compare.h"

#include <algorithm>
#include <cmath>

namespace tandem {

double LogitsComparison::worst() const { return rel_l2.empty() ? 0.0 : *std::max_element(rel_l2.begin(), rel_l2.end()); }

int64_t LogitsComparison::worst_row() const {
  return rel_l2.empty() ? -1 : std::max_element(rel_l2.begin(), rel_l2.end()) - rel_l2.begin();
}

LogitsComparison compare_logits(const float* got, const float* want, int64_t rows, int64_t cols, float margin) {
  LogitsComparison c;
  c.rel_l2.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = got + r * cols;
    const float* b = want + r * cols;
    double num = 0, den = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const double d = double(a[i]) - b[i];
      num += d * d;
      den += double(b[i]) * b[i];
    }
    c.rel_l2[r] = std::sqrt(num / std::max(den, 1e-30));
    const int64_t ib = std::max_element(b, b + cols) - b;
    float second = -INFINITY;
    for (int64_t i = 0; i < cols; ++i)
      if (i != ib) second = std::max(second, b[i]);
    if (b[ib] - second <= margin) continue;
    ++c.decisive;
    if (std::max_element(a, a + cols) - a != ib) c.argmax_misses.push_back(r);
  }
  return c;
}

}  // namespace tandem
