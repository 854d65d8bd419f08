// cpu_experts: the MoE forward, one list of cases through every ISA level (bit-identical to the scalar
// reference; AMX-BF16 within a derived bound) and the scalar reference against the exact fp
// definition (core/weights.h dequantize-then-matmul, in double) within a per-element bound derived
// from the arithmetic. The bounds are explained at the top of test_cpu_experts.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "cpu_experts/cpu_moe.h"
#include "core/error.h"
#include "tests/unit/cpu_experts_cases.h"
#include "tests/unit/test_util.h"

namespace tandem::cpu {

void PrintTo(ActPrecision a, std::ostream* os) { *os << act_precision_name(a); }  // gtest parameter names

namespace {

enum class Src { Gptq, Dense };

struct MoeCase {
  const char* name;
  int64_t H, I;
  int E, k;
  int64_t T;
  Src src;
  WeightFormat fmt;
  test::GptqSpec spec;  // group_size doubles as the int8 group size
  bool shared = false;  // add the shared expert (dense bf16) as id E with its own weight
};

const MoeCase kCases[] = {
    // The real 35B expert (2048 x 512), decode.
    {"real_int4_sym_g128_v1_T1_k8", 2048, 512, 16, 8, 1, Src::Gptq, WeightFormat::Int4, {128, true, false, true}},
    {"real_int4_sym_g128_T3_k4", 2048, 512, 16, 4, 3, Src::Gptq, WeightFormat::Int4, {128, true, false, true}},
    {"real_int4_asym_v2_g64_T8_k8", 2048, 512, 16, 8, 8, Src::Gptq, WeightFormat::Int4, {64, false, false, false}},
    {"real_int4_asym_actorder_own_up_g128_T3_k6", 2048, 512, 16, 6, 3, Src::Gptq, WeightFormat::Int4, {128, false, true, true, true}},
    {"real_int4_sym_actorder_g32_T1_k8", 2048, 512, 16, 8, 1, Src::Gptq, WeightFormat::Int4, {32, true, true, false}},
    {"real_int8_g128_T1_k8", 2048, 512, 16, 8, 1, Src::Dense, WeightFormat::Int8, {128}},
    {"real_int8_g32_T8_k8", 2048, 512, 16, 8, 8, Src::Dense, WeightFormat::Int8, {32}},
    {"real_bf16_T1_k8", 2048, 512, 16, 8, 1, Src::Dense, WeightFormat::BF16, {}},
    {"real_bf16_T3_k2", 2048, 512, 16, 2, 3, Src::Dense, WeightFormat::BF16, {}},
    {"real_int4_g128_T3_k8_shared_bf16", 2048, 512, 16, 8, 3, Src::Gptq, WeightFormat::Int4, {128, true, false, true}, true},
    {"real_gptq_to_int8_g128_T3_k3", 2048, 512, 16, 3, 3, Src::Gptq, WeightFormat::Int8, {128, false, true, true}},
    // Odd shapes: padded rows (40 -> 48), groups that do not divide (GPTQ whole-row groups, int8 padding).
    {"odd_int4_sym_g32_T3_k2", 96, 40, 16, 2, 3, Src::Gptq, WeightFormat::Int4, {32, true, false, true}},
    {"odd_int4_asym_actorder_g32_T8_k5", 96, 40, 16, 5, 8, Src::Gptq, WeightFormat::Int4, {32, false, true, false}},
    {"odd_int8_g32_T1_k1", 96, 40, 16, 1, 1, Src::Dense, WeightFormat::Int8, {32}},
    {"odd_int8_g64_T3_k7", 96, 40, 16, 7, 3, Src::Dense, WeightFormat::Int8, {64}},
    {"odd_bf16_T8_k3", 96, 40, 16, 3, 8, Src::Dense, WeightFormat::BF16, {}},
    {"small_int4_asym_actorder_g16_T8_k3", 64, 48, 10, 3, 8, Src::Gptq, WeightFormat::Int4, {16, false, true, false}},
    // Prefill-sized batches on a small expert (exercise AMX tiles and the multi-chunk paths).
    {"prefill_int4_sym_g32_T48_k4", 256, 128, 8, 4, 48, Src::Gptq, WeightFormat::Int4, {32, true, false, true}},
    {"prefill_int4_asym_actorder_g64_T40_k3", 256, 128, 8, 3, 40, Src::Gptq, WeightFormat::Int4, {64, false, true, false}},
    {"prefill_int8_g128_T64_k4", 256, 128, 8, 4, 64, Src::Dense, WeightFormat::Int8, {128}},
    {"prefill_int8_g32_T33_k2", 256, 128, 8, 2, 33, Src::Dense, WeightFormat::Int8, {32}},
    {"prefill_bf16_T64_k4", 256, 128, 8, 4, 64, Src::Dense, WeightFormat::BF16, {}},
};

void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

struct Built {
  std::vector<test::SynthExpert> experts;
  std::unique_ptr<CpuExpertStore> store;
  std::vector<float> x, wts;
  std::vector<int32_t> ids;
  int k = 0;
};

Built build(const MoeCase& c, uint32_t seed, ActPrecision act = ActPrecision::Int16, int64_t up_block_rows = 32) {
  std::mt19937 rng(seed);
  Built b;
  CpuExpertStoreOptions opt;
  opt.act = act;
  opt.up_block_rows = up_block_rows;
  opt.format = c.fmt;
  opt.dense_format = WeightFormat::BF16;
  opt.int8_group_size = c.spec.group_size;
  b.store = std::make_unique<CpuExpertStore>(opt);
  for (int e = 0; e <= c.E; ++e) {
    if (e == c.E && !c.shared) break;
    const bool gptq = e < c.E && c.src == Src::Gptq;
    b.experts.push_back(test::synth_expert(rng, c.H, c.I, gptq, c.spec));
    const auto& x = b.experts.back();
    b.store->add_expert(0, e, x.gate->w, x.up->w, x.down->w);
  }
  b.x = test::random_floats(rng, static_cast<size_t>(c.T * c.H));
  std::vector<int32_t> ids;
  std::vector<float> w;
  test::synth_routing(rng, c.T, c.k, c.E, ids, w);
  b.k = c.k + (c.shared ? 1 : 0);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int j = 0; j < c.k; ++j) {
      b.ids.push_back(ids[t * c.k + j]);
      b.wts.push_back(w[t * c.k + j]);
    }
    if (c.shared) {
      b.ids.push_back(c.E);
      b.wts.push_back(0.25f + 0.5f * static_cast<float>(t % 3) / 3);  // stands in for sigmoid(gate)
    }
  }
  return b;
}

std::vector<float> run(const Built& b, const MoeCase& c, const CpuKernels& kern, ThreadPool* on = nullptr) {
  static ThreadPool three(ThreadPool::Options{.threads = 3, .pin = false, .pin_caller = false, .spin_us = 50});
  ThreadPool& pool = on ? *on : three;
  CpuMoeWorkspace ws;
  std::vector<float> out(static_cast<size_t>(c.T * c.H), 0.0f);
  cpu_moe_forward(*b.store, 0, b.x.data(), c.T, b.ids.data(), b.wts.data(), b.k, out.data(), pool, ws, kern);
  return out;
}
std::vector<float> run(const Built& b, const MoeCase& c, Isa isa) { return run(b, c, cpu_kernels(isa)); }

// The AVX-512 table with the AMX matmuls running on the tile emulator (checks the AMX blocking here).
const CpuKernels* amx_emulated_kernels() {
  if (default_isa().isa < Isa::Avx512 || !cpu_features().avx512_bf16) return nullptr;
  static CpuKernels k = [] {
    CpuKernels t = cpu_kernels(Isa::Avx512);
    t.name = "amx-emulated";
    t.matmul[0] = amx_emu::matmul_int4;
    t.matmul[1] = amx_emu::matmul_int8;
    t.matmul[2] = amx_emu::matmul_bf16;
    return t;
  }();
  return &k;
}

// ---- the exact definition and its error bound

enum class ActModel { Int8Group, Int16Group, Bf16, None };

struct Mat {
  int64_t out = 0, in = 0, groups = 1;
  std::vector<float> W, Wq;  // exact source weights, and what the kernel multiplies (source order)
  std::vector<int> group;    // quantization group of each source column
  bool is_int = false;
};

Mat mat_of(const LinearWeight& src, const PackedMatrix& p, const int32_t* row_perm) {
  Mat m;
  m.out = src.out;
  m.in = src.in;
  m.is_int = p.is_int();
  m.W.resize(static_cast<size_t>(m.out * m.in));
  m.Wq.resize(m.W.size());
  for (int64_t n = 0; n < m.out; ++n) src.dequant_row(n, m.W.data() + n * m.in);
  for (int64_t n = 0; n < m.out; ++n) p.dequant_row(n, m.Wq.data() + (row_perm ? row_perm[n] : n) * m.in);
  m.group.resize(static_cast<size_t>(m.in));
  m.groups = p.is_int() ? p.groups : 1;
  for (int64_t k = 0; k < m.in; ++k)
    m.group[p.col_perm ? p.col_perm[k] : k] = p.is_int() ? static_cast<int>(k / p.group_size) : 0;
  return m;
}

// y = W a (exact, double); e >= |computed - y| (worst case) given |a_used - a| <= ea before this
// matrix's own activation rounding (model), with fp32 accumulation over `terms` steps; v = expected
// squared error if every rounding were independent and uniform (variance va upstream): a uniform
// rounding to step s has variance s^2 / 12, and int8 weight errors count as (dW a)^2.
struct LinOut {
  std::vector<double> y, e, v;
};

LinOut lin(const Mat& m, const std::vector<double>& a, const std::vector<double>& ea, const std::vector<double>& va,
           ActModel model, int64_t terms) {
  std::vector<double> d(ea), q2(a.size(), 0.0), amax(static_cast<size_t>(m.groups), 0.0);
  if (model == ActModel::Int8Group || model == ActModel::Int16Group) {
    const double qmax = model == ActModel::Int8Group ? kAct8Max : kAct16Max;
    for (int64_t k = 0; k < m.in; ++k) amax[m.group[k]] = std::max(amax[m.group[k]], std::fabs(a[k]) + ea[k]);
    for (int64_t k = 0; k < m.in; ++k) {
      d[k] += amax[m.group[k]] / qmax * (0.5 + qmax * std::ldexp(1.0, -21));  // + fp32 rounding of x * inv
      q2[k] = std::pow(amax[m.group[k]] / qmax, 2) / 12.0;
    }
  } else if (model == ActModel::Bf16) {
    for (int64_t k = 0; k < m.in; ++k) {
      d[k] += (std::fabs(a[k]) + ea[k]) * std::ldexp(1.0, -8);
      q2[k] = std::pow(std::fabs(a[k]) * std::ldexp(1.0, -8), 2) / 12.0;
    }
  }
  LinOut o;
  o.y.assign(static_cast<size_t>(m.out), 0.0);
  o.e.assign(o.y.size(), 0.0);
  o.v.assign(o.y.size(), 0.0);
  const double u = std::ldexp(1.0, -24);
  for (int64_t n = 0; n < m.out; ++n) {
    const float* W = m.W.data() + n * m.in;
    const float* Wq = m.Wq.data() + n * m.in;
    double acc = 0, err = 0, mag = 0, var = 0;
    for (int64_t k = 0; k < m.in; ++k) {
      const double w = W[k], dw = static_cast<double>(Wq[k]) - w, used = std::fabs(a[k]) + d[k];
      acc += w * a[k];
      err += std::fabs(w) * d[k] + std::fabs(dw) * used;
      mag += std::fabs(static_cast<double>(Wq[k])) * used;
      var += w * w * (va[k] + q2[k]) + dw * dw * (a[k] * a[k] + va[k]);
    }
    o.y[n] = acc;
    o.e[n] = err + static_cast<double>(terms + 4) * u * mag;
    o.v[n] = var;
  }
  return o;
}

struct ExpertMats {
  Mat gate, up, down;
};

struct ExactCheck {
  double worst = 0;          // max |err| / worst-case bound (must be <= 1)
  double rms_err = 0, rms_pred = 0;  // measured and predicted (independent roundings) RMS error
};

// Checks `got` against the exact MoE output with the propagated worst-case bound.
ExactCheck check_against_exact(const Built& b, const MoeCase& c, const std::vector<float>& got, bool amx_bf16) {
  const bool wide = b.store->options().act == ActPrecision::Int16;
  std::vector<ExpertMats> mats;
  for (size_t e = 0; e < b.experts.size(); ++e) {
    const ExpertWeights& pw = *b.store->find(0, static_cast<int>(e));
    const auto& src = b.experts[e];
    mats.push_back({mat_of(src.gate->w, pw.gate, pw.down.col_perm), mat_of(src.up->w, pw.up, pw.down.col_perm),
                    mat_of(src.down->w, pw.down, nullptr)});
  }
  auto model_of = [&](const Mat& m) {
    return m.is_int ? (wide ? ActModel::Int16Group : ActModel::Int8Group) : amx_bf16 ? ActModel::Bf16 : ActModel::None;
  };
  // 16-bit: float(c) may round too (|c| up to ~2^29), one more fp32 rounding per group.
  auto terms_of = [&](const Mat& m) { return m.is_int ? (wide ? 2 : 1) * m.groups : m.in + 32; };
  ExactCheck r;
  double se = 0, sv = 0;
  const double u = std::ldexp(1.0, -24);
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<double> x(b.x.begin() + t * c.H, b.x.begin() + (t + 1) * c.H), zero(static_cast<size_t>(c.H), 0.0);
    std::vector<double> out(static_cast<size_t>(c.H), 0.0), bound(out), mag(out), var(out);
    for (int j = 0; j < b.k; ++j) {
      const ExpertMats& m = mats[static_cast<size_t>(b.ids[t * b.k + j])];
      const double w = b.wts[t * b.k + j];
      const LinOut g = lin(m.gate, x, zero, zero, model_of(m.gate), terms_of(m.gate));
      const LinOut up = lin(m.up, x, zero, zero, model_of(m.up), terms_of(m.up));
      std::vector<double> h(static_cast<size_t>(c.I)), eh(h.size()), vh(h.size());
      for (int64_t i = 0; i < c.I; ++i) {
        const double sig = 1.0 / (1.0 + std::exp(-g.y[i])), silu = g.y[i] * sig;
        const double dsilu = sig * (1.0 + g.y[i] * (1.0 - sig));
        h[i] = silu * up.y[i];
        eh[i] = 1.1 * g.e[i] * (std::fabs(up.y[i]) + up.e[i]) + std::fabs(silu) * up.e[i] +
                1e-6 * (std::fabs(silu) + 1.1 * g.e[i]) * (std::fabs(up.y[i]) + up.e[i]);
        vh[i] = dsilu * dsilu * up.y[i] * up.y[i] * g.v[i] + silu * silu * up.v[i];
      }
      const LinOut y = lin(m.down, h, eh, vh, model_of(m.down), terms_of(m.down));
      for (int64_t n = 0; n < c.H; ++n) {
        out[n] += w * y.y[n];
        bound[n] += std::fabs(w) * y.e[n];
        mag[n] += std::fabs(w) * (std::fabs(y.y[n]) + y.e[n]);
        var[n] += w * w * y.v[n];
      }
    }
    for (int64_t n = 0; n < c.H; ++n) {
      const double lim = bound[n] + (b.k + 2) * u * mag[n];
      const double err = std::fabs(got[t * c.H + n] - out[n]);
      r.worst = std::max(r.worst, err / lim);
      se += err * err;
      sv += var[n];
      if (err > lim) {
        ADD_FAILURE() << c.name << ": out[" << t << "," << n << "] = " << got[t * c.H + n] << ", exact " << out[n]
                      << ", |err| " << err << " > bound " << lim;
        return r;
      }
    }
  }
  r.rms_err = std::sqrt(se / static_cast<double>(c.T * c.H));
  r.rms_pred = std::sqrt(sv / static_cast<double>(c.T * c.H));
  return r;
}

class CpuMoe : public ::testing::TestWithParam<std::tuple<MoeCase, ActPrecision>> {};

TEST_P(CpuMoe, IsasMatchReferenceBitwise) {
  const MoeCase& c = std::get<0>(GetParam());
  const Built b = build(c, test::test_seed(), std::get<1>(GetParam()));
  const std::vector<float> want = run(b, c, Isa::Scalar);
  std::vector<const CpuKernels*> impls;
  // Levels up to the chosen one (TANDEM_MAX_ISA caps it), plus the AMX kernels on the tile emulator.
  for (int i = 1; i <= static_cast<int>(default_isa().isa); ++i) impls.push_back(&cpu_kernels(static_cast<Isa>(i)));
  if (const CpuKernels* emu = amx_emulated_kernels()) impls.push_back(emu);
  for (const CpuKernels* kern : impls) {
    const std::vector<float> got = run(b, c, *kern);
    const bool amx = kern->isa == Isa::Amx || std::string(kern->name) == "amx-emulated";
    if (amx && (c.fmt == WeightFormat::BF16 || c.shared)) {
      const ExactCheck r = check_against_exact(b, c, got, true);
      std::printf("[ cpu_experts ] %s %s: max |err| / bound = %.3g\n", c.name, kern->name, r.worst);
      continue;
    }
    size_t bad = 0, first = 0;
    double maxdiff = 0;
    for (size_t n = 0; n < want.size(); ++n)
      if (std::memcmp(&want[n], &got[n], 4) != 0) {
        if (bad++ == 0) first = n;
        maxdiff = std::max(maxdiff, std::fabs(static_cast<double>(want[n]) - got[n]));
      }
    EXPECT_EQ(bad, 0u) << c.name << " " << kern->name << ": " << bad << " of " << want.size()
                       << " outputs differ from the reference; first at " << first << " (" << got[first] << " vs "
                       << want[first] << "), max |diff| " << maxdiff;
  }
}

// Split across (pretend) NUMA nodes the tasks go to other workers in another order; every output is
// still written by the same arithmetic in the same order: bit-identical.
TEST_P(CpuMoe, NumaSplitIsBitIdentical) {
  const MoeCase& c = std::get<0>(GetParam());
  const Built b = build(c, test::test_seed() + 2, std::get<1>(GetParam()));
  const CpuKernels& kern = cpu_kernels(default_isa().isa);
  const std::vector<float> want = run(b, c, kern);
  // Three workers on two nodes: an uneven split (2 + 1 workers), so the slices differ in size.
  ThreadPool pool(ThreadPool::Options{.threads = 3, .pin = false, .pin_caller = false, .spin_us = 50, .pretend_nodes = 2});
  const std::vector<float> got = run(b, c, kern, &pool);
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << c.name << " on 2 nodes";
}

// Phase-1 task size (CpuExpertStoreOptions::up_block_rows): each intermediate row, each re-quantized
// group and each output row come from the same arithmetic whichever task holds them: bit-identical.
TEST_P(CpuMoe, TaskSizeIsBitIdentical) {
  const MoeCase& c = std::get<0>(GetParam());
  const CpuKernels& kern = cpu_kernels(default_isa().isa);
  const Built base = build(c, test::test_seed() + 3, std::get<1>(GetParam()));
  const std::vector<float> want = run(base, c, kern);
  for (const int64_t rows : {16, 48, 64, 128}) {
    const Built b = build(c, test::test_seed() + 3, std::get<1>(GetParam()), rows);
    const std::vector<float> got = run(b, c, kern);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << c.name << ": " << rows << " rows a task";
  }
}

TEST(CpuMoe, RejectsATaskSizeOffTheTileRows) {
  CpuExpertStoreOptions opt;
  opt.up_block_rows = 24;
  EXPECT_THROW(CpuExpertStore{opt}, tandem::Error);
}

TEST_P(CpuMoe, ReferenceWithinDerivedBoundOfExactDefinition) {
  const MoeCase& c = std::get<0>(GetParam());
  const Built b = build(c, test::test_seed() + 1, std::get<1>(GetParam()));
  const std::vector<float> got = run(b, c, Isa::Scalar);
  const ExactCheck r = check_against_exact(b, c, got, false);
  std::printf("[ cpu_experts ] %s %s scalar: max |err| / worst-case bound = %.3g; RMS err %.3g, predicted %.3g\n",
              c.name, act_precision_name(std::get<1>(GetParam())), r.worst, r.rms_err, r.rms_pred);
  // The worst-case bound is loose by ~sqrt(terms); the RMS prediction (independent roundings) is not,
  // so it catches systematic errors far below the bound and shows the quantization model is right.
  if (c.fmt != WeightFormat::BF16) {
    EXPECT_LT(r.rms_err, 2.0 * r.rms_pred) << "more error than independent roundings explain";
    EXPECT_GT(r.rms_err, 0.5 * r.rms_pred) << "less error than the quantization model predicts";
  }
}

TEST(CpuMoe, SkipsNegativeIdsAndRejectsMissingExperts) {
  const MoeCase c = {"neg", 96, 40, 4, 2, 2, Src::Dense, WeightFormat::Int8, {32}};
  Built b = build(c, test::test_seed());
  const std::vector<float> full = run(b, c, Isa::Scalar);
  b.ids[1] = -1;  // token 0's second expert runs elsewhere (GPU)
  const std::vector<float> part = run(b, c, Isa::Scalar);
  EXPECT_NE(full, part);
  b.ids[0] = -1;
  const std::vector<float> none = run(b, c, Isa::Scalar);
  for (int64_t n = 0; n < c.H; ++n) {
    EXPECT_EQ(none[n], 0.0f);
  }
  b.ids[2] = 9;
  test::expect_error([&] { run(b, c, Isa::Scalar); }, {"expert 9 of layer 0 is not in the CPU expert store"});
}

TEST(CpuMoe, ActOrderSharedByGateAndUpIsGatheredOnce) {
  std::mt19937 rng(test::test_seed());
  CpuExpertStore store;
  auto shared = test::synth_expert(rng, 128, 64, true, {32, false, true, true});
  auto own = test::synth_expert(rng, 128, 64, true, {32, false, true, true, true});
  store.add_expert(0, 0, shared.gate->w, shared.up->w, shared.down->w);
  store.add_expert(0, 1, own.gate->w, own.up->w, own.down->w);
  EXPECT_NE(store.find(0, 0)->gate.col_perm, nullptr);
  EXPECT_EQ(store.find(0, 0)->up.col_perm, store.find(0, 0)->gate.col_perm);
  EXPECT_NE(store.find(0, 1)->up.col_perm, store.find(0, 1)->gate.col_perm);
  EXPECT_NE(store.description().find("act-order"), std::string::npos) << store.description();
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<MoeCase, ActPrecision>>& info) {
  return std::string(std::get<0>(info.param).name) + "_act" + act_precision_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuMoe,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(ActPrecision::Int16, ActPrecision::Int8)),
                         case_name);

}  // namespace
}  // namespace tandem::cpu
