// gpu::int4_tiles_to_rows (experts streamed over PCIe arrive in the host experts' tile layout) against
// its host reference, bit for bit, on matrices from the real packer: several shapes at once in one
// launch (the 35B expert shapes, odd row counts with a partial last tile, act order, asymmetric zeros).
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "cpu_experts/packed_weight.h"
#include "gpu_core/int4_layout.h"
#include "gpu_core/int4_tiles.cuh"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/gptq_random.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct Shape {
  int64_t N, K, gs;
  bool sym, act_order;
};

TEST(GpuInt4Tiles, ConversionMatchesTheHostReference) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed());
  const Shape shapes[] = {{512, 2048, 128, true, false}, {2048, 512, 128, false, true}, {40, 256, 64, false, false}, {24, 384, 128, true, true}};
  cpu::HostArena arena(size_t(64) << 20);
  std::vector<std::unique_ptr<test::RandomGptq>> src;
  std::vector<cpu::PackedMatrix> packed;
  std::vector<std::unique_ptr<test::DeviceBuffer<uint8_t>>> bufs;
  std::vector<std::unique_ptr<test::DeviceBuffer<int32_t>>> perms;
  std::vector<gpu::Int4TilesToRows> jobs;
  int64_t max_rows = 0;
  auto dev_bytes = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bufs.push_back(std::make_unique<test::DeviceBuffer<uint8_t>>(std::vector<uint8_t>(b, b + n)));
    return bufs.back()->ptr;
  };
  for (const Shape& s : shapes) {
    src.push_back(std::make_unique<test::RandomGptq>(rng, s.N, s.K, s.gs, s.sym, s.act_order, false));
    packed.push_back(cpu::pack_weight(src.back()->view(), {cpu::WeightFormat::Int4, 128, nullptr}, arena));
    const cpu::PackedMatrix& m = packed.back();
    ASSERT_EQ(m.symmetric, s.sym);
    const int64_t G = m.groups;
    gpu::Int4TilesToRows j;
    j.w = dev_bytes(m.w, m.tiles * m.tile_bytes);
    j.tile_scales = reinterpret_cast<const uint16_t*>(dev_bytes(m.scales, m.tiles * G * 32));
    j.tile_zeros = m.zeros ? dev_bytes(m.zeros, m.tiles * G * 16) : nullptr;
    j.tile_perm = m.col_perm ? reinterpret_cast<const int32_t*>(dev_bytes(m.col_perm, m.cols * 4)) : nullptr;
    j.qweight = reinterpret_cast<uint32_t*>(dev_bytes(std::vector<uint8_t>(s.N * s.K / 2, 0xAB).data(), s.N * s.K / 2));
    j.scales = reinterpret_cast<uint16_t*>(dev_bytes(std::vector<uint8_t>(s.N * G * 2, 0xAB).data(), s.N * G * 2));
    j.zeros = dev_bytes(std::vector<uint8_t>(s.N * G, 0xAB).data(), s.N * G);
    perms.push_back(std::make_unique<test::DeviceBuffer<int32_t>>(s.K));
    j.perm = perms.back()->ptr;
    j.rows = s.N, j.cols = s.K, j.group_size = s.gs;
    jobs.push_back(j);
    max_rows = std::max(max_rows, s.N);
  }
  test::DeviceBuffer<gpu::Int4TilesToRows> djobs(jobs);
  ASSERT_EQ(gpu::int4_tiles_to_rows(djobs.ptr, static_cast<int>(jobs.size()), max_rows, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const cpu::PackedMatrix& m = packed[i];
    const gpu::Int4Host ref = gpu::int4_rows_from_tiles({m.w, m.scales, m.zeros, m.rows, m.cols, m.group_size});
    auto back = [&](const void* d, size_t n) {
      std::vector<uint8_t> h(n);
      cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost);
      return h;
    };
    const auto q = back(jobs[i].qweight, ref.qweight.size() * 4), sc = back(jobs[i].scales, ref.scales.size() * 2),
               z = back(jobs[i].zeros, ref.zeros.size());
    EXPECT_EQ(0, std::memcmp(q.data(), ref.qweight.data(), q.size())) << "shape " << i << " codes";
    EXPECT_EQ(0, std::memcmp(sc.data(), ref.scales.data(), sc.size())) << "shape " << i << " scales";
    EXPECT_EQ(0, std::memcmp(z.data(), ref.zeros.data(), z.size())) << "shape " << i << " zeros";
    if (m.col_perm) {
      const std::vector<int32_t> p = perms[i]->to_host();
      EXPECT_TRUE(std::equal(p.begin(), p.end(), m.col_perm)) << "shape " << i << " input order";
    }
  }
}

}  // namespace
}  // namespace tandem
