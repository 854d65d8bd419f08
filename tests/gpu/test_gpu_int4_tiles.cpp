// gpu::int4_tiles_to_rows (experts streamed over PCIe arrive in the host experts' tile layout) against
// its host reference, bit for bit, on matrices from the real packer: several shapes at once in one
// launch (the 35B expert shapes, odd row counts with a partial last tile, act order, asymmetric zeros).
// gpu::moe_int4_tiles_decode (link experts: host experts computed by the GPU reading them in place over
// PCIe) against an fp64 SwiGLU over the GPTQ source, with the experts packed as the host store packs
// them into page-locked host memory.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "cpu_experts/packed_weight.h"
#include "gpu_core/device.cuh"
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

struct LinkCase {
  int64_t H, I, gs;
  bool sym, act_order;
  int E, k, m;
  std::vector<int> resident;  // experts the host holds (the rest: no tile weights, skipped)
  std::vector<int32_t> ids;   // the token's top-k
  bool overwrite = false;     // out = the sum (a layer with no GPU experts), not out += it
};

TEST(GpuInt4Tiles, LinkExpertsMatchTheReference) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed());
  const LinkCase cases[] = {
      // the 35B expert shape, 3 of the 8 slots (slots 0 and 2 not resident: the first 3 resident ones are slots 1, 3, 4)
      {2048, 512, 128, true, false, 8, 8, 3, {1, 2, 3, 4, 5, 6, 7}, {0, 7, 0, 5, 2, 3, 6, 1}},
      // act order (gate / up rows in down's input order), asymmetric zeros, groups of 64
      {256, 128, 64, false, true, 6, 4, 2, {0, 2, 3, 4, 5}, {4, 1, 2, 0}},
      // fewer resident experts among the top-k than m: the empty slots add nothing
      {512, 256, 128, false, false, 5, 4, 4, {1, 3}, {3, 0, 1, 4}},
      // the same, overwriting out
      {512, 256, 128, false, false, 5, 4, 4, {1, 3}, {3, 0, 1, 4}, true},
      // the HF fixtures' shapes: rows of 48 inputs (a tile row's last 64-input piece partly past the end)
      // in groups of 16 with act order; 64 in groups of 32
      {48, 48, 16, false, true, 10, 3, 2, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {9, 4, 6}},
      {64, 64, 32, true, false, 8, 4, 3, {0, 2, 4, 6}, {6, 1, 0, 2}},
  };
  for (const LinkCase& lc : cases) {
    SCOPED_TRACE(::testing::Message() << "H " << lc.H << " I " << lc.I << " group " << lc.gs << " m " << lc.m
                                      << (lc.overwrite ? " overwriting" : ""));
    ASSERT_TRUE(gpu::moe_int4_tiles_fits(lc.H, lc.I, lc.gs, lc.k, lc.m));
    cpu::HostArena arena(size_t(32) << 20);
    struct Src {
      std::unique_ptr<test::RandomGptq> gate, up, down;
    };
    std::vector<Src> src(lc.E);
    std::vector<gpu::Int4TilesExpert> table(lc.E);
    std::vector<std::array<cpu::PackedMatrix, 3>> packed(lc.E);
    for (int e : lc.resident) {
      // down first; gate / up rows in its input order, as CpuExpertStore::pack_expert
      src[e].down = std::make_unique<test::RandomGptq>(rng, lc.H, lc.I, lc.gs, lc.sym, lc.act_order, false);
      src[e].gate = std::make_unique<test::RandomGptq>(rng, lc.I, lc.H, lc.gs, lc.sym, lc.act_order, false);
      src[e].up = std::make_unique<test::RandomGptq>(rng, lc.I, lc.H, lc.gs, lc.sym, lc.act_order, false);
      packed[e][2] = cpu::pack_weight(src[e].down->view(), {cpu::WeightFormat::Int4, 128, nullptr}, arena);
      packed[e][0] = cpu::pack_weight(src[e].gate->view(), {cpu::WeightFormat::Int4, 128, packed[e][2].col_perm}, arena);
      packed[e][1] = cpu::pack_weight(src[e].up->view(), {cpu::WeightFormat::Int4, 128, packed[e][2].col_perm}, arena);
    }
    std::vector<void*> locked;
    for (const auto& [p, n] : arena.mappings()) {
      CUDA_OK(cudaHostRegister(p, n, cudaHostRegisterDefault));
      locked.push_back(p);
    }
    auto dev = [](const void* p) { return gpu::host_device_pointer(p); };
    for (int e : lc.resident) {
      gpu::Int4TilesView* v[3] = {&table[e].gate, &table[e].up, &table[e].down};
      for (int i = 0; i < 3; ++i) {
        const cpu::PackedMatrix& m = packed[e][i];
        ASSERT_EQ(m.symmetric, lc.sym);
        v[i]->w = static_cast<const uint8_t*>(dev(m.w));
        v[i]->scales = static_cast<const uint16_t*>(dev(m.scales));
        v[i]->zeros = static_cast<const uint8_t*>(dev(m.zeros));
        v[i]->perm = i < 2 ? static_cast<const int32_t*>(dev(m.col_perm)) : nullptr;
        ASSERT_TRUE(v[i]->w && v[i]->scales);
      }
    }
    std::uniform_real_distribution<float> ux(-1.0f, 1.0f), uw(0.05f, 0.5f);
    std::vector<float> x(lc.H), w(lc.k), out0(lc.H);
    for (auto& v : x) v = ux(rng);
    for (auto& v : w) v = uw(rng);
    for (auto& v : out0) v = ux(rng);
    test::DeviceBuffer<gpu::Int4TilesExpert> dtable(table);
    test::DeviceBuffer<int32_t> dids(lc.ids);
    test::DeviceBuffer<float> dw(w), dx(x), dout(out0);
    test::DeviceBuffer<uint8_t> scratch(gpu::moe_int4_tiles_scratch_bytes(lc.H, lc.I, lc.m));
    CUDA_OK(gpu::moe_int4_tiles_decode(dtable.ptr, lc.E, lc.H, lc.I, lc.gs, dids.ptr, dw.ptr, lc.k, lc.m, lc.act_order, dx.ptr,
                                       scratch.ptr, dout.ptr, nullptr, !lc.overwrite));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = dout.to_host();
    for (void* p : locked) cudaHostUnregister(p);

    // fp64 over the source matrices: out = out0 + sum over the link slots of w * down(silu(gate x) * up x);
    // the link slots: the first m whose expert the host holds
    std::vector<double> ref(lc.H, 0.0), bound(lc.H, 0.0);
    if (!lc.overwrite) ref.assign(out0.begin(), out0.end());
    std::vector<float> row(std::max(lc.H, lc.I));
    std::vector<int> link;
    for (int j = 0; j < lc.k && static_cast<int>(link.size()) < lc.m; ++j)
      if (src[lc.ids[j]].gate) link.push_back(j);
    int taken = 0;
    for (const int j : link) {
      const int e = lc.ids[j];
      ++taken;
      std::vector<double> h(lc.I);
      for (int64_t i = 0; i < lc.I; ++i) {
        double g = 0, u = 0;
        src[e].gate->view().dequant_row(i, row.data());
        for (int64_t c = 0; c < lc.H; ++c) g += double(row[c]) * x[c];
        src[e].up->view().dequant_row(i, row.data());
        for (int64_t c = 0; c < lc.H; ++c) u += double(row[c]) * x[c];
        h[i] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t n = 0; n < lc.H; ++n) {
        src[e].down->view().dequant_row(n, row.data());
        double d = 0, a = 0;
        for (int64_t i = 0; i < lc.I; ++i) d += double(row[i]) * h[i], a += std::fabs(double(row[i]) * h[i]);
        ref[n] += w[j] * d;
        bound[n] += w[j] * a;
      }
    }
    ASSERT_GT(taken, 0);
    int bad = 0;
    double worst = 0;
    for (int64_t n = 0; n < lc.H; ++n) {
      // fp32 sums of fp32 products over H then I inputs: ~1e-6 of the magnitudes summed; a layout
      // mistake (a wrong row, group, nibble or input) is off by the size of the terms themselves.
      const double err = std::fabs(got[n] - ref[n]), tol = 2e-5 * bound[n] + 1e-6 * std::fabs(out0[n]) + 1e-6;
      worst = std::max(worst, err / tol);
      if (err > tol && ++bad <= 5) ADD_FAILURE() << "row " << n << ": got " << got[n] << ", want " << ref[n] << " (tolerance " << tol << ")";
    }
    EXPECT_EQ(bad, 0) << "worst error / tolerance " << worst;
  }
}

}  // namespace
}  // namespace tandem
