// bench/bench_cpu_experts.cpp: one MoE layer of the 35B shape (256 experts, 2048 x 512 SwiGLU, top-8)
// on the CPU, per weight format and ISA level:
//  - decode (1 and 4 tokens): weight bytes streamed per second, against this machine's read bandwidth
//    measured first in this binary (streaming AVX-512 loads, all pool threads, 4 GiB, median pass,
//    with and without software prefetch; the larger is the denominator);
//  - prefill (512 and 4096 tokens over 256 experts): TOPS (2 ops per multiply-add) and tokens/s;
//  - int4 / int8 with 16-bit activations (".a16", the default: two int8 halves, twice the integer
//    work) and 8-bit (".a8");
//  - oneDNN u8s8 matmul at expert shapes as a library baseline (when built with oneDNN).
// Decode walks several layers (>= 2.5 GiB of experts) with 64 fresh routings, so weights come from
// DRAM as in the 40-layer model, not from a large L3.
// usage: bench_cpu_experts [--threads=N] [google benchmark flags]; TANDEM_MAX_ISA caps the levels run.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu_experts/cpu_moe.h"
#include "cpu_experts/target.h"
#include "tests/unit/cpu_experts_cases.h"

#ifdef TANDEM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace tandem::cpu {
namespace {

constexpr int64_t kHidden = 2048, kInter = 512;
constexpr int kExperts = 256, kTopK = 8, kLayers = 40, kRoutes = 64;

struct Env {
  std::unique_ptr<ThreadPool> pool;
  double read_bw = 0;  // bytes/s
};
Env& env() {
  static Env e;
  return e;
}

uint64_t xorshift(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// ---- read bandwidth: each worker streams its slice of one buffer with 512-bit (or 256-bit) loads

// With `prefetch`, software prefetches run 2 KiB ahead (as the kernels do); on some machines the
// hardware prefetchers alone leave bandwidth unused. The larger of the two is the denominator.
TANDEM_TARGET_AVX512 uint64_t read_avx512(const uint8_t* p, size_t n, bool prefetch) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    if (prefetch)
      for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(p + i + 2048 + 64 * j), _MM_HINT_T0);
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  alignas(64) uint64_t v[8];
  _mm512_store_si512(v, x);
  return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
}

TANDEM_TARGET_AVX2 uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)));
  return v[0] ^ v[1] ^ v[2] ^ v[3];
}

struct ReadBuffer {
  uint8_t* p = nullptr;
  size_t n = size_t(4) << 30;  // 4 GiB: far beyond any L3 (300 MB on the GPU machine)
  ReadBuffer() {
    p = static_cast<uint8_t*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    madvise(p, n, MADV_HUGEPAGE);
    ThreadPool& pool = *env().pool;
    const size_t slice = n / static_cast<size_t>(pool.threads());
    pool.run(pool.threads(), [&](int64_t t, int) { std::memset(p + t * slice, 1 + static_cast<int>(t), slice); });
  }
  ~ReadBuffer() { munmap(p, n); }
  // One pass, all workers, each over its own slice; returns the bytes read.
  double read_all(bool prefetch = false) {
    ThreadPool& pool = *env().pool;
    const bool wide = cpu_features().has[static_cast<int>(Isa::Avx512)];
    const size_t slice = n / static_cast<size_t>(pool.threads()) / 256 * 256;
    uint64_t sink[1024] = {};
    pool.run(pool.threads(), [&](int64_t t, int) {
      sink[t % 1024] ^= wide ? read_avx512(p + t * slice, slice, prefetch) : read_avx2(p + t * slice, slice);
    });
    benchmark::DoNotOptimize(sink);
    return static_cast<double>(slice * static_cast<size_t>(pool.threads()));
  }
  double pass(bool prefetch) {  // bytes/s
    const auto t0 = std::chrono::steady_clock::now();
    const double bytes = read_all(prefetch);
    return bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

double measure_read_bandwidth(bool prefetch) {
  ReadBuffer buf;
  std::vector<double> v;
  for (int i = 0; i < 9; ++i) v.push_back(buf.pass(prefetch));
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_read_bandwidth(benchmark::State& st, bool prefetch) {
  ReadBuffer buf;
  double bytes = 0;
  for (auto _ : st) bytes += buf.read_all(prefetch);
  st.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

// ---- synthetic 35B layer: GPTQ int4 g128 sym (the official checkpoint's format) or BF16 sources

struct LayerSource {
  std::vector<std::unique_ptr<test::SynthMatrix>> mats;
  MoeWeights moe;
};

std::unique_ptr<test::SynthMatrix> fast_matrix(bool gptq, int64_t out, int64_t in, uint64_t seed) {
  auto m = std::make_unique<test::SynthMatrix>();
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  LinearWeight& w = m->w;
  w.out = out;
  w.in = in;
  if (gptq) {
    const int64_t gs = 128, groups = in / gs;
    m->qweight.resize(static_cast<size_t>(in / 8 * out));
    for (auto& q : m->qweight) q = static_cast<int32_t>(xorshift(s));
    m->qzeros.assign(static_cast<size_t>(groups * out / 8), 0x77777777);  // v1 symmetric: zero 8
    m->scales.resize(static_cast<size_t>(groups * out));
    for (auto& v : m->scales) v = static_cast<uint16_t>(0x1400 | (xorshift(s) & 0x7ff));  // ~1e-3 .. 4e-3
    w.kind = LinearWeight::Kind::Gptq;
    w.name = "bench.gptq";
    w.gptq = {m->qweight.data(), m->qzeros.data(), m->scales.data(), DType::F16, nullptr, gs, groups, 1};
  } else {
    m->dense.resize(static_cast<size_t>(out * in));
    for (auto& v : m->dense) {
      const float f = (static_cast<float>(xorshift(s) & 0xffff) / 65536.0f - 0.5f) * 0.06f;
      v = f32_to_bf16(f);
    }
    w.kind = LinearWeight::Kind::Dense;
    w.name = "bench.bf16";
    w.dense = m->dense.data();
    w.dense_dtype = DType::BF16;
  }
  return m;
}

// Enough layers that a decode step's experts come from DRAM, as in the real 40-layer model: one
// layer's int4 experts (~400 MB) would otherwise sit largely in a big L3 (300 MB on the GPU machine).
constexpr double kStoreBytes = 2.5 * (1ull << 30);

struct Store {
  std::unique_ptr<CpuExpertStore> store;
  int layers = 0;
};

const Store& store_for(WeightFormat fmt) {
  Env& e = env();
  static std::map<WeightFormat, Store> stores;
  if (auto it = stores.find(fmt); it != stores.end()) return it->second;
  stores.clear();  // free the previous format's weights first
  Store st;
  CpuExpertStoreOptions opt;
  opt.format = fmt;
  opt.int8_group_size = 128;
  st.store = std::make_unique<CpuExpertStore>(opt);
  const bool gptq = fmt == WeightFormat::Int4;
  const double layer_bytes = 3.0 * kExperts * kHidden * kInter * (fmt == WeightFormat::Int4 ? 0.53 : fmt == WeightFormat::Int8 ? 1.03 : 2.0);
  st.layers = std::max(1, static_cast<int>(std::ceil(kStoreBytes / layer_bytes)));
  for (int layer = 0; layer < st.layers; ++layer) {
    LayerSource src;
    src.mats.resize(3 * kExperts);
    e.pool->run(3 * kExperts, [&](int64_t i, int) {
      const bool down = i % 3 == 2;
      src.mats[i] = fast_matrix(gptq, down ? kHidden : kInter, down ? kInter : kHidden,
                                static_cast<uint64_t>(i + 3 * kExperts * layer) + 17);
    });
    for (int x = 0; x < kExperts; ++x) {
      src.moe.gate.push_back(src.mats[3 * x]->w);
      src.moe.up.push_back(src.mats[3 * x + 1]->w);
      src.moe.down.push_back(src.mats[3 * x + 2]->w);
    }
    st.store->add_layer(layer, src.moe, {}, e.pool.get());
  }
  std::fprintf(stderr, "%s (%d layers)\n", st.store->description().c_str(), st.layers);
  return stores[fmt] = std::move(st);
}

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> w;
  uint64_t bytes = 0;  // weight bytes of the distinct experts
};

std::vector<Routing> make_routes(const CpuExpertStore& store, int64_t T, uint32_t seed) {  // layer 0's sizes
  std::mt19937 rng(seed);
  std::vector<Routing> r(kRoutes);
  for (Routing& x : r) {
    test::synth_routing(rng, T, kTopK, kExperts, x.ids, x.w);
    std::vector<int32_t> u = x.ids;
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    for (int32_t e : u) x.bytes += store.find(0, e)->stream_bytes();
  }
  return r;
}

// Iteration i's layer and routing: layer after layer (as a decode step walks the model), a fresh
// routing each time round.
std::pair<int, const Routing*> walk(size_t i, const Store& s, const std::vector<Routing>& routes) {
  const size_t layers = static_cast<size_t>(s.layers);
  return {static_cast<int>(i % layers), &routes[(i / layers) % routes.size()]};
}

// The bandwidth counters of `bytes` of expert weights read over the run.
void bandwidth_counters(benchmark::State& st, double bytes) {
  using C = benchmark::Counter;
  st.counters["GB/s"] = C(bytes / 1e9, C::kIsRate);
  st.counters["of_read_bw"] = C(bytes / env().read_bw, C::kIsRate);
}

void BM_moe(benchmark::State& st, WeightFormat fmt, Isa isa, int64_t T, ActPrecision act) {
  const Store& st_ = store_for(fmt);
  const CpuExpertStore& store = *st_.store;
  const CpuKernels& kern = cpu_kernels(isa);
  ThreadPool& pool = *env().pool;
  const std::vector<Routing> routes = make_routes(store, T, static_cast<uint32_t>(T));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * kHidden));
  for (float& v : x) v = nd(rng);
  std::vector<float> out(static_cast<size_t>(T * kHidden));
  CpuMoeWorkspace ws;
  double bytes = 0;
  size_t i = 0;
  for (auto _ : st) {
    const auto [layer, r] = walk(i++, st_, routes);
    std::fill(out.begin(), out.end(), 0.0f);
    cpu_moe_forward(store, layer, x.data(), T, r->ids.data(), r->w.data(), kTopK, out.data(), pool, ws, kern, act);
    bytes += static_cast<double>(r->bytes);
  }
  benchmark::DoNotOptimize(out.data());
  using C = benchmark::Counter;
  const double iters = static_cast<double>(st.iterations());
  bandwidth_counters(st, bytes);
  st.counters["TOPS"] = C(iters * static_cast<double>(T) * kTopK * 3 * 2 * kHidden * kInter / 1e12, C::kIsRate);
  st.counters["tok/s_40layers"] = C(iters * static_cast<double>(T) / kLayers, C::kIsRate);
}

#ifdef TANDEM_HAVE_DNNL
// oneDNN u8 x s8 -> s32 matmul [M, K] x [K, N] (oneDNN picks the weight layout; reordered once).
void BM_onednn_u8s8(benchmark::State& st, int64_t M, int64_t K, int64_t N) {
  using namespace dnnl;
  omp_set_num_threads(env().pool->threads());
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  memory::desc a_md({M, K}, memory::data_type::u8, memory::format_tag::ab);
  memory::desc b_any({K, N}, memory::data_type::s8, memory::format_tag::any);
  memory::desc c_md({M, N}, memory::data_type::s32, memory::format_tag::ab);
  matmul::primitive_desc pd(matmul::desc(a_md, b_any, c_md), eng);
  matmul mm(pd);
  // Enough distinct weight copies to exceed the caches when M is small (as decode streams experts).
  const int copies = M <= 16 ? 128 : 4;
  std::vector<memory> w;
  memory::desc b_plain({K, N}, memory::data_type::s8, memory::format_tag::ab);
  memory plain(b_plain, eng);
  std::memset(plain.get_data_handle(), 3, static_cast<size_t>(K * N));
  for (int i = 0; i < copies; ++i) {
    w.emplace_back(pd.weights_desc(), eng);
    reorder(plain, w.back()).execute(s, plain, w.back());
  }
  memory a(a_md, eng), c(c_md, eng);
  std::memset(a.get_data_handle(), 1, static_cast<size_t>(M * K));
  s.wait();
  size_t i = 0;
  for (auto _ : st) {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w[i++ % w.size()]}, {DNNL_ARG_DST, c}});
    s.wait();
  }
  using C = benchmark::Counter;
  const double iters = static_cast<double>(st.iterations());
  st.counters["GB/s"] = C(iters * static_cast<double>(K * N) / 1e9, C::kIsRate);
  st.counters["of_read_bw"] = C(iters * static_cast<double>(K * N) / env().read_bw, C::kIsRate);
  st.counters["TOPS"] = C(iters * 2.0 * static_cast<double>(M * K * N) / 1e12, C::kIsRate);
}
#endif

}  // namespace
}  // namespace tandem::cpu

int main(int argc, char** argv) {
  using namespace tandem::cpu;
  int threads = 0;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = std::atoi(argv[i] + 10);
    else args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  Env& e = env();
  // The caller stays unpinned: OpenMP threads (oneDNN) inherit its affinity.
  e.pool = std::make_unique<ThreadPool>(ThreadPool::Options{.threads = threads, .pin = true, .pin_caller = false});
  // The denominator: the better of the plain streaming loop and the one with software prefetch.
  const double plain = measure_read_bandwidth(false), pf = measure_read_bandwidth(true);
  e.read_bw = std::max(plain, pf);
  std::fprintf(stderr,
               "%s\n%s | %s\nread bandwidth (median of 9 passes over 4 GiB, %d threads): %.1f GB/s plain loads, "
               "%.1f GB/s with software prefetch\n",
               cpu_features().brand.c_str(), default_isa().description.c_str(), e.pool->description().c_str(),
               e.pool->threads(), plain / 1e9, pf / 1e9);
  benchmark::AddCustomContext("read_bw_GBps", std::to_string(e.read_bw / 1e9));
  benchmark::AddCustomContext("pool", e.pool->description());
  benchmark::AddCustomContext("isa", default_isa().description);

  benchmark::RegisterBenchmark("read_bandwidth/plain", BM_read_bandwidth, false)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("read_bandwidth/prefetch", BM_read_bandwidth, true)->UseRealTime()->Unit(benchmark::kMillisecond);
  const int top = static_cast<int>(default_isa().isa);
  // Int formats run with both activation precisions (16-bit is the runtime's default): names
  // decode/int4.a16/..., decode/int4.a8/...; bf16 has fp32 activations.
  for (WeightFormat fmt : {WeightFormat::Int4, WeightFormat::Int8, WeightFormat::BF16}) {
    for (ActPrecision act : {ActPrecision::Int16, ActPrecision::Int8}) {
      if (fmt == WeightFormat::BF16 && act == ActPrecision::Int8) continue;
      const std::string f = std::string(format_name(fmt)) +
                            (fmt == WeightFormat::BF16 ? "" : act == ActPrecision::Int16 ? ".a16" : ".a8");
      for (int lvl = top; lvl >= 0; --lvl) {
        const Isa isa = static_cast<Isa>(lvl);
        for (int64_t T : {1, 4}) {
          if (isa == Isa::Scalar && T > 1) continue;
          const std::string name = "decode/" + f + "/" + isa_name(isa) + "/T:" + std::to_string(T);
          benchmark::RegisterBenchmark(name.c_str(), BM_moe, fmt, isa, T, act)->UseRealTime()->Unit(benchmark::kMicrosecond);
        }
      }
      for (int lvl = top; lvl >= 1; --lvl) {
        const Isa isa = static_cast<Isa>(lvl);
        for (int64_t T : {512, 4096}) {
          const std::string name = "prefill/" + f + "/" + isa_name(isa) + "/T:" + std::to_string(T);
          benchmark::RegisterBenchmark(name.c_str(), BM_moe, fmt, isa, T, act)->UseRealTime()->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
#ifdef TANDEM_HAVE_DNNL
  for (int64_t M : {1, 4, 128, 512}) {
    const std::string name = "onednn_u8s8/M:" + std::to_string(M) + "/K:2048/N:1024";
    benchmark::RegisterBenchmark(name.c_str(), BM_onednn_u8s8, M, 2048, 1024)->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
#endif
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
