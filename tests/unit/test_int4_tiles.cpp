// Experts streamed to the GPU arrive in the host experts' tile layout (cpu_experts/packed_weight.h)
// and are turned into the GPU row layout (gpu_core/int4_layout.h). The host reference of that
// conversion, fed by the real packer, must give exactly what the GPU repack of the same GPTQ source
// gives (runs without a GPU; the device kernel is held to this reference in tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "cpu_experts/packed_weight.h"
#include "gpu_core/int4_layout.h"
#include "tests/gpu/gptq_random.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

gpu::Int4TilesHost tiles_of(const cpu::PackedMatrix& m) {
  EXPECT_EQ(m.format, cpu::WeightFormat::Int4);
  EXPECT_EQ(m.cols_padded, m.cols);
  EXPECT_EQ(m.tile_bytes, m.cols * 8);
  return {m.w, m.scales, m.zeros, m.rows, m.cols, m.group_size};
}

struct Case {
  int64_t N, K, gs;
  bool sym, act_order, v1, row_perm;
};

class Int4Tiles : public ::testing::TestWithParam<Case> {};

TEST_P(Int4Tiles, RowsFromPackedTilesEqualTheGpuRepack) {
  const Case c = GetParam();
  std::mt19937 rng(test::test_seed());
  const test::RandomGptq g(rng, c.N, c.K, c.gs, c.sym, c.act_order, c.v1);
  std::vector<int32_t> rperm(c.N);
  std::iota(rperm.begin(), rperm.end(), 0);
  if (c.row_perm) std::shuffle(rperm.begin(), rperm.end(), rng);
  cpu::HostArena arena(size_t(8) << 20);
  const LinearWeight src = g.view();
  const cpu::PackedMatrix m = cpu::pack_weight(src, {cpu::WeightFormat::Int4, 128, c.row_perm ? rperm.data() : nullptr}, arena);
  EXPECT_EQ(m.symmetric, c.sym);
  const gpu::Int4Host rows = gpu::int4_rows_from_tiles(tiles_of(m));
  const gpu::Int4Host ref = gpu::repack_gptq_int4(g.source());
  // Inputs: the packer's order is the GPU repack's (a stable sort by group) when act-order.
  ASSERT_EQ(m.col_perm != nullptr, ref.permuted);
  if (m.col_perm) {
    for (int64_t k = 0; k < c.K; ++k) ASSERT_EQ(m.col_perm[k], ref.perm[k]) << "k=" << k;
  }
  const int64_t words = c.K / 8, G = c.K / c.gs;
  for (int64_t n = 0; n < c.N; ++n) {
    const int64_t s = rperm[n];  // packed row n holds source row rperm[n]
    for (int64_t w = 0; w < words; ++w) ASSERT_EQ(rows.qweight[n * words + w], ref.qweight[s * words + w]) << "n=" << n << " word " << w;
    for (int64_t gi = 0; gi < G; ++gi) {
      ASSERT_EQ(rows.scales[n * G + gi], ref.scales[s * G + gi]) << "n=" << n << " group " << gi;
      ASSERT_EQ(rows.zeros[n * G + gi], ref.zeros[s * G + gi]) << "n=" << n << " group " << gi;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Int4Tiles,
                         ::testing::Values(Case{32, 256, 128, true, false, false, false}, Case{48, 256, 64, false, true, false, true},
                                           Case{24, 128, 32, false, false, true, true}, Case{40, 384, 128, true, true, true, false}));

TEST(Int4Tiles, RejectsPaddedColumns) {
  std::vector<uint8_t> w(16 * 8 * 8);
  std::vector<uint16_t> s(16);
  EXPECT_THROW(gpu::int4_rows_from_tiles({w.data(), s.data(), nullptr, 16, 12, 4}), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
