// cpu_experts: one differential harness. Every case runs through every ISA level this CPU has and is
// compared with the scalar reference on fresh seeded inputs (TANDEM_TEST_SEED reproduces a run).
//
// Tolerances, from the arithmetic:
//  - ISA vs scalar reference: 0. Integer dot products are exact, and every implementation performs
//    the same IEEE fp32 operations in the same order (qmatmul.h, act_ops.h), so outputs must be
//    bit-identical. Exception: AMX-BF16 rounds activations to bf16 inside the tile unit; it is held
//    to the bound below with a relative activation error of 2^-8 (bf16 rounding is 2^-9).
//  - Scalar reference vs the exact definition (core/weights.h dequantize-then-matmul, in double):
//    a per-element bound propagated through the expert. Activation quantization moves each input by
//    at most half a step (plus the fp32 rounding of x * inv, qmax 2^-21 steps): amax(group) / 254
//    (8-bit) or amax(group) / 65024 (16-bit, step amax / 32512; float(c) then rounds once more per
//    group, counted as one more fp32 term); weight quantization (int8 from bf16) adds
//    sum |Wq - W| |a|; silu is 1.1-Lipschitz, so h = silu(g) u moves by 1.1 e_g (|u| + e_u) +
//    |silu(g)| e_u; fp32 accumulation adds (terms + 4) 2^-24 sum |W a|.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "cpu_experts/cpu_moe.h"
#include "core/error.h"
#include "tests/unit/cpu_experts_cases.h"
#include "tests/unit/test_util.h"

namespace tandem::cpu {
namespace {

// The emulated AMX kernels still use AVX-512 (incl. BF16) for their epilogues and conversions.
bool amx_emulation_runs() { return default_isa().isa >= Isa::Avx512 && cpu_features().avx512_bf16; }

// Levels above scalar up to the chosen one (TANDEM_MAX_ISA caps it, so each level can be run alone).
std::vector<Isa> fast_isas() {
  std::vector<Isa> v;
  for (int i = 1; i <= static_cast<int>(default_isa().isa); ++i) v.push_back(static_cast<Isa>(i));
  static bool said = false;
  if (!cpu_features().has[static_cast<int>(Isa::Amx)] && !std::exchange(said, true))
    std::printf("[ cpu_experts ] AMX not tested here: %s\n", cpu_features().missing[3].c_str());
  return v;
}

// ---------------------------------------------------------------- ISA selection

TEST(CpuIsa, ChoosePolicy) {
  CpuFeatures f;
  f.has[1] = f.has[2] = true;
  f.missing[3] = "AMX-TILE";
  const IsaChoice best = choose_isa(f, nullptr);
  EXPECT_EQ(best.isa, Isa::Avx512);
  EXPECT_NE(best.description.find("no amx: AMX-TILE"), std::string::npos) << best.description;
  const IsaChoice capped = choose_isa(f, "avx2");
  EXPECT_EQ(capped.isa, Isa::Avx2);
  EXPECT_NE(capped.description.find("capped by TANDEM_MAX_ISA=avx2"), std::string::npos) << capped.description;
  const IsaChoice over = choose_isa(f, "AMX");
  EXPECT_EQ(over.isa, Isa::Avx512);
  EXPECT_NE(over.description.find("cannot run amx: AMX-TILE"), std::string::npos) << over.description;
  EXPECT_EQ(choose_isa(f, "scalar").isa, Isa::Scalar);
  test::expect_error([&] { choose_isa(f, "sse9"); }, {"TANDEM_MAX_ISA='sse9'", "scalar, avx2, avx512, amx"});
  f.has[1] = false;  // levels are cumulative: a gap stops the climb
  EXPECT_EQ(choose_isa(f, nullptr).isa, Isa::Scalar);
}

TEST(CpuIsa, ThisMachine) {
  const CpuFeatures& f = cpu_features();
  std::printf("[ cpu_experts ] %s | %s\n", f.brand.c_str(), default_isa().description.c_str());
  for (int i = 0; i < kIsaLevels; ++i) {
    const Isa isa = static_cast<Isa>(i);
    bool ok = true;
    for (int j = 1; j <= i; ++j) ok = ok && f.has[j];
    if (ok) {
      const CpuKernels& k = cpu_kernels(isa);
      EXPECT_EQ(k.isa, isa);
      for (auto* fn : k.matmul) EXPECT_NE(fn, nullptr);
      EXPECT_NE(k.quantize_rows, nullptr);
      EXPECT_NE(k.swiglu, nullptr);
    } else {
      test::expect_error([&] { cpu_kernels(isa); }, {isa_name(isa), "lacks"});
    }
  }
}

// ---------------------------------------------------------------- thread pool

TEST(CpuThreadPool, EveryTaskOnceAndErrors) {
  ThreadPool pool(ThreadPool::Options{.threads = 4, .pin = false, .pin_caller = false, .spin_us = 20});
  EXPECT_EQ(pool.threads(), 4);
  for (int64_t n : {0, 1, 3, 4, 17, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> bad_worker{0};
    pool.run(n, [&](int64_t t, int w) {
      hits[static_cast<size_t>(t)]++;
      if (w < 0 || w >= 4) bad_worker++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    EXPECT_EQ(bad_worker.load(), 0);
  }
  // Many short runs back to back, then one after the helpers went to sleep.
  std::atomic<int64_t> sum{0};
  for (int r = 0; r < 2000; ++r) pool.run(8, [&](int64_t t, int) { sum += t; });
  EXPECT_EQ(sum.load(), 2000 * 28);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  pool.run(8, [&](int64_t t, int) { sum += t; });
  EXPECT_EQ(sum.load(), 2001 * 28);
  EXPECT_THROW(pool.run(10, [&](int64_t t, int) {
    if (t == 7) fail("task 7 failed");
  }),
               Error);
  pool.run(2, [&](int64_t, int) {});  // usable after an error
  EXPECT_GE(ThreadPool::physical_cores(), 1);
}

// Far more threads than cores: helpers are descheduled mid-run and wake for runs that are already
// over; every run must still see each task exactly once and all of their writes.
TEST(CpuThreadPool, OversubscribedRunsStayExact) {
  ThreadPool pool(ThreadPool::Options{.threads = 12, .pin = false, .pin_caller = false, .spin_us = 5});
  std::vector<int> hits(64);
  for (int r = 0; r < 3000; ++r) {
    const int64_t n = 1 + r % 64;
    std::fill(hits.begin(), hits.end(), 0);
    pool.run(n, [&](int64_t t, int) { hits[static_cast<size_t>(t)] += 1; });  // plain writes: visibility check
    for (int64_t t = 0; t < 64; ++t) ASSERT_EQ(hits[static_cast<size_t>(t)], t < n ? 1 : 0) << "run " << r;
  }
}

// NUMA split (pretend nodes on this one-node machine): node_range partitions [0, n) in proportion to
// each node's workers; run() and run_split() use it / the caller's slices and still run every task
// exactly once; pretend nodes never bind memory.
TEST(CpuThreadPool, PerNodeSlices) {
  ThreadPool pool(ThreadPool::Options{.threads = 5, .pin = false, .pin_caller = false, .spin_us = 20, .pretend_nodes = 2});
  ASSERT_EQ(pool.numa_nodes(), 2);
  EXPECT_NE(pool.description().find("2 NUMA nodes (pretend)"), std::string::npos) << pool.description();
  int on_node0 = 0;
  for (int w = 0; w < 5; ++w) {
    EXPECT_GE(pool.node_of(w), w > 0 ? pool.node_of(w - 1) : 0);  // numbered node by node
    on_node0 += pool.node_of(w) == 0;
  }
  for (int64_t n : {0, 1, 7, 100}) {
    const auto [a0, a1] = pool.node_range(0, n);
    const auto [b0, b1] = pool.node_range(1, n);
    EXPECT_EQ(a0, 0);
    EXPECT_EQ(a1, b0);
    EXPECT_EQ(b1, n);
    EXPECT_EQ(a1, n * on_node0 / 5);
  }
  std::vector<int> buf(64);
  EXPECT_FALSE(pool.bind_to_node(buf.data(), buf.size() * sizeof(int), 1));
  const int64_t ends[2] = {3, 40};
  for (int r = 0; r < 200; ++r) {
    std::vector<std::atomic<int>> hits(40);
    pool.run_split(40, ends, [&](int64_t t, int) { hits[static_cast<size_t>(t)]++; });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "run " << r;
  }
  const int64_t uneven[2] = {40, 40};  // everything in node 0's slice: node 1's workers steal
  std::atomic<int> done{0};
  pool.run_split(40, uneven, [&](int64_t, int) { done++; });
  EXPECT_EQ(done.load(), 40);
}

// ---------------------------------------------------------------- packing

// The arena lists its mappings (what the hybrid page-locks): every allocation lies inside one of them.
TEST(CpuPack, ArenaListsItsMappings) {
  HostArena arena(1 << 20);
  std::vector<std::pair<uint8_t*, size_t>> blocks;
  for (size_t bytes : {size_t(1000), size_t(3) << 20, size_t(64), size_t(1) << 20})
    blocks.push_back({static_cast<uint8_t*>(arena.allocate(bytes)), bytes});
  const auto maps = arena.mappings();
  ASSERT_GE(maps.size(), 2u);
  size_t total = 0;
  for (const auto& [p, n] : maps) total += n;
  EXPECT_EQ(total, arena.mapped_bytes());
  for (const auto& [b, n] : blocks) {
    bool inside = false;
    for (const auto& [p, m] : maps) inside |= b >= static_cast<uint8_t*>(p) && b + n <= static_cast<uint8_t*>(p) + m;
    EXPECT_TRUE(inside) << n << " bytes";
  }
}

TEST(CpuPack, F16Conversion) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / nan
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(f32_to_f16(70000.0f), 0x7c00);
}

TEST(CpuPack, Int4RepackIsLossless) {
  std::mt19937 rng(test::test_seed());
  const test::GptqSpec specs[] = {{128, true, false, true}, {32, false, false, false}, {64, false, true, true},
                                  {16, true, true, false}};
  for (const auto& spec : specs) {
    auto m = test::synth_gptq(rng, 72, 256, spec);
    std::vector<int32_t> row_perm(72);
    std::iota(row_perm.begin(), row_perm.end(), 0);
    std::shuffle(row_perm.begin(), row_perm.end(), rng);
    HostArena arena(1 << 20);
    const PackedMatrix p = pack_weight(m->w, {WeightFormat::Int4, 128, row_perm.data()}, arena);
    EXPECT_EQ(p.symmetric, spec.sym);
    EXPECT_EQ(p.col_perm != nullptr, spec.act_order);
    EXPECT_TRUE(p.exact);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.w) % 64, 0u);
    std::vector<float> got(256), want(256);
    for (int64_t n = 0; n < 72; ++n) {
      p.dequant_row(n, got.data());
      m->w.dequant_row(row_perm[n], want.data());
      ASSERT_EQ(got, want) << "row " << n << " gs " << spec.group_size;
    }
  }
}

TEST(CpuPack, Int8AndBf16) {
  std::mt19937 rng(test::test_seed());
  auto m = test::synth_bf16(rng, 40, 100);
  HostArena arena(1 << 20);
  for (int64_t gs : {32, 128}) {
    const PackedMatrix p = pack_weight(m->w, {WeightFormat::Int8, gs, nullptr}, arena);
    EXPECT_EQ(p.cols_padded % gs, 0);
    std::vector<float> got(100), want(100);
    for (int64_t n = 0; n < 40; ++n) {
      p.dequant_row(n, got.data());
      m->w.dequant_row(n, want.data());
      for (int64_t k = 0; k < 100; ++k) {
        const float s = f16_to_f32(p.scales[((n / 16) * p.groups + k / gs) * 16 + n % 16]);
        ASSERT_LE(std::fabs(got[k] - want[k]), 0.5f * s * (1 + 1e-6f)) << n << "," << k;
      }
    }
  }
  const PackedMatrix b = pack_weight(m->w, {WeightFormat::BF16, 128, nullptr}, arena);
  EXPECT_TRUE(b.exact);
  std::vector<float> got(100), want(100);
  for (int64_t n = 0; n < 40; ++n) {
    b.dequant_row(n, got.data());
    m->w.dequant_row(n, want.data());
    ASSERT_EQ(got, want);
  }
  test::expect_error([&] { pack_weight(m->w, {WeightFormat::Int4, 128, nullptr}, arena); },
                     {"synthetic.bf16", "int4 needs a GPTQ source"});
  test::expect_error([&] { pack_weight(m->w, {WeightFormat::Int8, 48, nullptr}, arena); }, {"group size 48"});
}

// ---------------------------------------------------------------- ops, ISA vs reference (bitwise)

TEST(CpuOps, QuantizeRowsAndSwigluBitwise) {
  std::mt19937 rng(test::test_seed());
  const int64_t cols = 200, rows = 5;
  std::vector<float> x = test::random_floats(rng, rows * cols, 1.5f);
  std::fill(x.begin() + cols, x.begin() + 2 * cols, 0.0f);  // an all-zero row
  x[7] = 1e-30f;
  std::vector<int32_t> perm(cols), src_rows = {4, 0, 1, 3, 2};
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t gs : {8, 16, 40, 64, 128}) {
    for (bool use_perm : {false, true}) {
      for (bool wide : {false, true}) {
        const int64_t cp = (cols + gs - 1) / gs * gs, groups = cp / gs;
        struct Out {
          std::vector<int8_t> q, q_hi;
          std::vector<float> s;
          std::vector<int32_t> sum, sum_hi;
        };
        auto run = [&](QuantizeRowsFn fn, Out& o) {
          o.q.assign(rows * cp, 99);
          o.q_hi.assign(wide ? rows * cp : 0, 99);
          o.s.assign(rows * groups, -1);
          o.sum.assign(rows * groups, -1);
          o.sum_hi.assign(wide ? rows * groups : 0, -1);
          QuantActs qa{o.q.data(), o.s.data(), o.sum.data(), cp, groups};
          if (wide) {
            qa.q_hi = o.q_hi.data();
            qa.sum_hi = o.sum_hi.data();
          }
          fn(x.data(), cols, src_rows.data(), rows, use_perm ? perm.data() : nullptr, cols, cp, gs, qa);
        };
        Out o0, o1;
        run(ref::quantize_rows, o0);
        if (wide) {  // the split: halves in -127..127, 255 hi + lo within half a step of x / scale
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cp; ++k) {
              const int8_t lo = o0.q[r * cp + k], hi = o0.q_hi[r * cp + k];
              ASSERT_TRUE(lo >= -127 && hi >= -127) << r << "," << k;
              // Columns past `cols` are padding (zero): perm has only `cols` entries.
              const double xv = k < cols ? x[src_rows[r] * cols + (use_perm ? perm[k] : k)] : 0.0, sc = o0.s[r * groups + k / gs];
              const double want = sc > 0 ? xv / sc : 0.0;
              // x * inv (fp32, inv rounded) vs x / scale: a few ulps of 32512 apart.
              ASSERT_LE(std::fabs(kAct16Base * hi + lo - want), 0.5 + kAct16Max * std::ldexp(1.0, -21)) << r << "," << k;
            }
        }
        for (Isa isa : fast_isas()) {
          run(cpu_kernels(isa).quantize_rows, o1);
          EXPECT_EQ(o0.q, o1.q) << isa_name(isa) << " gs " << gs << " wide " << wide;
          EXPECT_EQ(o0.q_hi, o1.q_hi) << isa_name(isa) << " gs " << gs;
          EXPECT_EQ(0, std::memcmp(o0.s.data(), o1.s.data(), o0.s.size() * 4)) << isa_name(isa);
          EXPECT_EQ(o0.sum, o1.sum) << isa_name(isa);
          EXPECT_EQ(o0.sum_hi, o1.sum_hi) << isa_name(isa);
        }
      }
    }
  }
  std::vector<float> g = test::random_floats(rng, 301, 4.0f), u = test::random_floats(rng, 301, 1.0f);
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.5f, -87.5f, 100.0f, -100.0f, 1e30f, -1e30f, 20.0f, -20.0f};
  std::copy(std::begin(special), std::end(special), g.begin());
  std::vector<float> h0(301), h1(301);
  ref::swiglu(g.data(), u.data(), h0.data(), 301);
  for (int i = 0; i < 301; ++i) {
    const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(h0[i], want, 1e-6 * std::fabs(want) + 1e-37) << g[i];
  }
  for (Isa isa : fast_isas()) {
    cpu_kernels(isa).swiglu(g.data(), u.data(), h1.data(), 301);
    EXPECT_EQ(0, std::memcmp(h0.data(), h1.data(), h0.size() * 4)) << isa_name(isa);
  }
}

struct MatCase {
  const char* name;
  bool gptq;
  WeightFormat fmt;
  test::GptqSpec spec;
};

TEST(CpuOps, MatmulBitwiseAcrossIsas) {
  std::mt19937 rng(test::test_seed());
  const MatCase cases[] = {{"int4_sym", true, WeightFormat::Int4, {64, true, false, true}},
                           {"int4_asym_act", true, WeightFormat::Int4, {32, false, true, false}},
                           {"int8_g32", false, WeightFormat::Int8, {}},
                           {"int8_g128", false, WeightFormat::Int8, {128}},
                           {"bf16", false, WeightFormat::BF16, {}}};
  const int64_t N = 88, K = 256;
  for (const MatCase& c : cases) {
    auto m = c.gptq ? test::synth_gptq(rng, N, K, c.spec) : test::synth_bf16(rng, N, K);
    HostArena arena(1 << 20);
    const int64_t gs8 = c.fmt == WeightFormat::Int8 ? (c.spec.group_size == 128 ? 128 : 32) : 128;
    const PackedMatrix p = pack_weight(m->w, {c.fmt, gs8, nullptr}, arena);
    const int64_t R = 21;
    std::vector<float> x = test::random_floats(rng, R * K);
    std::vector<int8_t> q(R * 256), q_hi(R * 256);
    std::vector<float> s(R * 64), xf(R * p.cols_padded, 0.0f);
    std::vector<int32_t> sum(R * 64), sum_hi(R * 64);
    QuantActs qa{q.data(), s.data(), sum.data(), 256, 64};
    QuantActs qw = qa;  // 16-bit activations: own scales / sums
    std::vector<float> s16(R * 64);
    std::vector<int32_t> sum16(R * 64);
    std::vector<int8_t> q16(R * 256);
    qw.q = q16.data();
    qw.scale = s16.data();
    qw.sum = sum16.data();
    qw.q_hi = q_hi.data();
    qw.sum_hi = sum_hi.data();
    if (p.is_int()) {
      ref::quantize_rows(x.data(), K, nullptr, R, p.col_perm, K, p.cols_padded, p.group_size, qa);
      ref::quantize_rows(x.data(), K, nullptr, R, p.col_perm, K, p.cols_padded, p.group_size, qw);
    }
    for (int64_t r = 0; r < R; ++r) std::copy_n(x.data() + r * K, K, xf.data() + r * p.cols_padded);
    std::vector<int32_t> rows(R);
    for (int64_t r = 0; r < R; ++r) rows[r] = static_cast<int32_t>((r * 5) % R);
    // Kernel sets to compare: every ISA level here, plus the AMX kernels on the tile emulator.
    std::vector<std::pair<std::string, MatmulFn>> impls;
    for (Isa isa : fast_isas()) impls.push_back({isa_name(isa), cpu_kernels(isa).matmul[static_cast<int>(c.fmt)]});
    if (amx_emulation_runs()) {
      const MatmulFn emu[3] = {amx_emu::matmul_int4, amx_emu::matmul_int8, amx_emu::matmul_bf16};
      impls.push_back({"amx-emulated", emu[static_cast<int>(c.fmt)]});
    }
    for (int64_t nrows : {1, 2, 3, 5, 8, 9, 13, 21}) {
      for (bool wide : {false, true}) {
        if (wide && !p.is_int()) continue;
        ActRows a;
        a.q = wide ? qw : qa;
        if (!p.is_int()) {
          a.f = xf.data();
          a.f_stride = p.cols_padded;
        }
        a.rows = rows.data();
        a.nrows = nrows;
        const int64_t t0 = 1, t1 = p.tiles, ldy = (t1 - t0) * 16 + 3;
        std::vector<float> y0(nrows * ldy, 7.0f), y1;
        cpu_kernels(Isa::Scalar).matmul[static_cast<int>(c.fmt)](p, t0, t1, a, y0.data(), ldy);
        for (const auto& [name, fn] : impls) {
          y1.assign(nrows * ldy, 7.0f);
          fn(p, t0, t1, a, y1.data(), ldy);
          if (c.fmt == WeightFormat::BF16 && name.rfind("amx", 0) == 0 && nrows >= 8) {
            // AMX-BF16 rounds activations to bf16: |dy| <= sum |w x| (2^-8 + K 2^-24).
            std::vector<float> wrow(K);
            for (int64_t i = 0; i < nrows; ++i)
              for (int64_t j = 0; j < (t1 - t0) * 16; ++j) {
                const int64_t n = t0 * 16 + j;
                double mag = 0;
                if (n < N) {
                  p.dequant_row(n, wrow.data());
                  for (int64_t k = 0; k < K; ++k) mag += std::fabs(wrow[k] * x[rows[i] * K + k]);
                }
                const double lim = mag * (std::ldexp(1.0, -8) + K * std::ldexp(1.0, -24)) + 1e-30;
                ASSERT_LE(std::fabs(y1[i * ldy + j] - y0[i * ldy + j]), lim) << name << " row " << i << " col " << j;
              }
            continue;
          }
          EXPECT_EQ(0, std::memcmp(y0.data(), y1.data(), y0.size() * 4))
              << c.name << " " << name << " rows " << nrows << (wide ? " 16-bit" : " 8-bit");
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu
