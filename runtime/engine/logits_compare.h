// runtime/engine/logits_compare.h: the one definition of "these logits match the reference", used by
// `tandem logits --compare` and by the fixture tests: relative L2 error per position, and argmax
// agreement at every decisive position (where the reference's top-2 margin exceeds `margin`).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

struct LogitsComparison {
  std::vector<double> rel_l2;          // per row
  std::vector<int64_t> argmax_misses;  // decisive rows whose argmax differs
  int64_t decisive = 0;                // rows whose reference top-2 margin exceeds the margin

  double worst() const;
  int64_t worst_row() const;
};

// got, want: [rows, cols] float32.
LogitsComparison compare_logits(const float* got, const float* want, int64_t rows, int64_t cols, float margin = 0.1f);

}  // namespace tandem
