// bench/dev/moe_pipe_dev.cu: an experiment, not on the engine's path (bench_dev_moe_pipe).
//
// Question (issue 25): at 4 and 8 tokens the decode MoE's gate/up (moe_int4_wide.cu) runs several waves
// of blocks that each load their weights, compute, and leave; with two blocks an SM, memory idles while
// both compute (29 us at 8 tokens for 68 MB: 2.3 TB/s of the H100's ~3.0). Asking L2 for the next wave's
// weights made it slower (stop 50, call 3). Here a block per SM stays resident and walks its work items
// (a pair's 32 rows of gate and up, as the engine's blocks) through S stages of shared memory filled by
// cp.async (no registers held): item j + S - 1's weights, scales, zero points and x stream in while item j
// computes.
//   engine: a copy of the engine's wide_gate_up_kernel<2, 8> (checked like the others, so its time is the
//           engine's);
//   pipe S x W: S stages, W warps of 32 / W rows each; one block an SM (S >= 2 stages of 71.5 KB).
// Each row's arithmetic is the engine's (the same lane's vectors in the same order, the same reduction),
// so every variant's h is checked bit for bit against the engine's whole call. Times each alone at 1 / 2 /
// 4 / 8 tokens, experts from HBM (32 routings cycled). The 35B's shape only (H 2048, I 512, group 128).
// Usage: bench_dev_moe_pipe (a CUDA device, sm_80+; the 3-stage forms need 215 KB of shared memory a
// block, sm_90: they are skipped where the device has less).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/dev/dev_util.cuh"
#include "gpu_core/act_quant.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/workspace_sizes.h"

namespace {

using namespace tandem::gpu;
using namespace tandem::gpu::detail;
using namespace tandem::dev;

constexpr int64_t H = 2048, I = 512, kGroup = 128;
constexpr int E = 256, K = 8, kSets = 32;
constexpr int kGshift = 2;  // group 128 = 32 << 2
constexpr int kBlockRows = 32;
constexpr int kNvec = H / 32, kG = H / kGroup, kNV = kNvec / 32;  // 64 vectors a row, 16 groups, 2 vectors a lane

// ---- the engine's kernel, copied (wide_gate_up_kernel<2, 8>) ----

__global__ void __launch_bounds__(256, 2)
    engine_gate_up(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, int k, const uint8_t* __restrict__ xq,
                   const VecScale* __restrict__ xs, uint8_t* __restrict__ hq, VecScale* __restrict__ hs) {
  constexpr int RU = 4, NV = kNV;
  __shared__ float hb[kBlockRows];
  const int p = blockIdx.y, t = p / k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_wait();
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  if (!gate.qweight) return;
  const int r0 = static_cast<int>(blockIdx.x) * kBlockRows + warp * RU, nvec = kNvec;
  const uint4* qg = reinterpret_cast<const uint4*>(gate.qweight);
  const uint4* qu = reinterpret_cast<const uint4*>(up.qweight);
  uint4 wg[RU][NV], wu[RU][NV];
  uint16_t sg[RU][NV], su[RU][NV];
  uint8_t zg[RU][NV], zu[RU][NV];
#pragma unroll
  for (int r = 0; r < RU; ++r)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = lane + 32 * i, row = r0 + r, gi = row * kG + (v >> kGshift);
      wg[r][i] = load_stream(qg + row * nvec + v);
      wu[r][i] = load_stream(qu + row * nvec + v);
      sg[r][i] = __ldg(gate.scales + gi);
      su[r][i] = __ldg(up.scales + gi);
      zg[r][i] = __ldg(gate.zeros + gi);
      zu[r][i] = __ldg(up.zeros + gi);
    }
  const uint8_t* xt = xq + static_cast<int64_t>(t) * H * 2;
  float g[RU] = {}, u[RU] = {};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = lane + 32 * i;
    uint4 xv[4];
    load_vector(xt, v, nvec, xv);
    const VecScale s = xs[t * nvec + v];
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      g[r] += __half2float(__ushort_as_half(sg[r][i])) * vec_dot(wg[r][i], xv, 16 * zg[r][i], s);
      u[r] += __half2float(__ushort_as_half(su[r][i])) * vec_dot(wu[r][i], xv, 16 * zu[r][i], s);
    }
  }
  pdl_launch_next();
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    const float gs = group_sum<32>(g[r]), us = group_sum<32>(u[r]);
    if (lane == 0) hb[warp * RU + r] = gs / (1.0f + __expf(-gs)) * us;
  }
  __syncthreads();
  const int nh = static_cast<int>(I / 32);
  if (warp == 0) quantise_vector(hb[lane], blockIdx.x, nh, hq + static_cast<int64_t>(p) * I * 2, hs + static_cast<int64_t>(p) * nh);
}

// ---- the pipelined form ----

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// One stage: an item's 32 rows of gate and up (codes, fp16 scales, zero points) and its token's x.
struct Stage {
  uint4 gate[kBlockRows * kNvec], up[kBlockRows * kNvec];  // row r's vector v at r * kNvec + v
  uint16_t gs[kBlockRows * kG], us[kBlockRows * kG];        // row r's group at r * kG + group
  uint8_t gz[kBlockRows * kG], uz[kBlockRows * kG];
  uint4 x[4 * kNvec];                                       // token's quantised x, chunk-major as in global memory
  VecScale xs[kNvec];
  int valid;                                                // the pair's expert is resident
};
static_assert(sizeof(uint16_t) * kBlockRows * kG % 16 == 0 && kBlockRows * kG % 16 == 0, "scales and zeros in 16-byte copies");

// Item w: pair w / (I / 32), row block w % (I / 32), as the engine's grid is laid out.
template <int THREADS>
__device__ __forceinline__ void fill(Stage& st, int w, int items, const Int4Expert* __restrict__ experts,
                                     const int32_t* __restrict__ ids, int k, const uint8_t* __restrict__ xq,
                                     const VecScale* __restrict__ xs) {
  if (w >= items) return;
  constexpr int nb = static_cast<int>(I / kBlockRows);
  const int p = w / nb, rb = w % nb, t = p / k, tid = threadIdx.x;
  const Int4Expert* ex = experts + ids[p];
  const uint4* qg = reinterpret_cast<const uint4*>(ex->gate.qweight);
  if (tid == 0) st.valid = qg != nullptr;
  if (!qg) return;
  const uint4* qu = reinterpret_cast<const uint4*>(ex->up.qweight);
  const int64_t r0 = int64_t{rb} * kBlockRows;
  for (int i = tid; i < kBlockRows * kNvec; i += THREADS) {
    cp16(&st.gate[i], qg + r0 * kNvec + i);
    cp16(&st.up[i], qu + r0 * kNvec + i);
  }
  constexpr int sc = kBlockRows * kG * 2 / 16, zc = kBlockRows * kG / 16;  // 16-byte pieces
  const char* gsrc = reinterpret_cast<const char*>(ex->gate.scales + r0 * kG);
  const char* usrc = reinterpret_cast<const char*>(ex->up.scales + r0 * kG);
  const char* gzs = reinterpret_cast<const char*>(ex->gate.zeros + r0 * kG);
  const char* uzs = reinterpret_cast<const char*>(ex->up.zeros + r0 * kG);
  const uint8_t* xt = xq + int64_t{t} * H * 2;
  const char* xst = reinterpret_cast<const char*>(xs + int64_t{t} * kNvec);
  for (int i = tid; i < 2 * sc + 2 * zc + 4 * kNvec + kNvec * 8 / 16; i += THREADS) {
    int j = i;
    if (j < sc) { cp16(reinterpret_cast<char*>(st.gs) + 16 * j, gsrc + 16 * j); continue; }
    j -= sc;
    if (j < sc) { cp16(reinterpret_cast<char*>(st.us) + 16 * j, usrc + 16 * j); continue; }
    j -= sc;
    if (j < zc) { cp16(reinterpret_cast<char*>(st.gz) + 16 * j, gzs + 16 * j); continue; }
    j -= zc;
    if (j < zc) { cp16(reinterpret_cast<char*>(st.uz) + 16 * j, uzs + 16 * j); continue; }
    j -= zc;
    if (j < 4 * kNvec) { cp16(&st.x[j], xt + 16 * j); continue; }
    j -= 4 * kNvec;
    cp16(reinterpret_cast<char*>(st.xs) + 16 * j, xst + 16 * j);
  }
}

template <int S, int W>
__global__ void __launch_bounds__(W * 32, 1)
    pipe_gate_up(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, int k, int pairs,
                 const uint8_t* __restrict__ xq, const VecScale* __restrict__ xs, uint8_t* __restrict__ hq, VecScale* __restrict__ hs) {
  constexpr int RU = kBlockRows / W, THREADS = W * 32, nb = static_cast<int>(I / kBlockRows);
  extern __shared__ __align__(16) unsigned char smem[];
  Stage* st = reinterpret_cast<Stage*>(smem);
  __shared__ float hb[kBlockRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, items = pairs * nb;
  pdl_wait();  // ids and x are the kernels before's
#pragma unroll
  for (int j = 0; j < S - 1; ++j) {
    fill<THREADS>(st[j], blockIdx.x + j * gridDim.x, items, experts, ids, k, xq, xs);
    cp_commit();
  }
  int slot = 0;
  for (int w = blockIdx.x; w < items; w += gridDim.x) {
    fill<THREADS>(st[(slot + S - 1) % S], w + (S - 1) * gridDim.x, items, experts, ids, k, xq, xs);
    cp_commit();
    cp_wait<S - 1>();  // this thread's copies of item w are in
    __syncthreads();   // and everyone's
    const Stage& s = st[slot];
    const bool valid = s.valid;  // read before the barrier below: thread 0 refills the stage after it
    if (valid) {
      float g[RU] = {}, u[RU] = {};
#pragma unroll
      for (int i = 0; i < kNV; ++i) {
        const int v = lane + 32 * i;
        uint4 xv[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) xv[c] = s.x[c * kNvec + v];
        const VecScale vs = s.xs[v];
#pragma unroll
        for (int r = 0; r < RU; ++r) {
          const int row = warp * RU + r, gi = row * kG + (v >> kGshift);
          g[r] += __half2float(__ushort_as_half(s.gs[gi])) * vec_dot(s.gate[row * kNvec + v], xv, 16 * s.gz[gi], vs);
          u[r] += __half2float(__ushort_as_half(s.us[gi])) * vec_dot(s.up[row * kNvec + v], xv, 16 * s.uz[gi], vs);
        }
      }
#pragma unroll
      for (int r = 0; r < RU; ++r) {
        const float gs = group_sum<32>(g[r]), us = group_sum<32>(u[r]);
        if (lane == 0) hb[warp * RU + r] = gs / (1.0f + __expf(-gs)) * us;
      }
    }
    __syncthreads();  // the stage is read (it is refilled next round) and hb is written
    if (valid && warp == 0) {
      const int p = w / nb, rb = w % nb, nh = static_cast<int>(I / 32);
      quantise_vector(hb[lane], rb, nh, hq + static_cast<int64_t>(p) * I * 2, hs + static_cast<int64_t>(p) * nh);
    }
    slot = (slot + 1) % S;
    // hb is next written after the next round's barrier, which warp 0 reaches after quantising
  }
  cp_wait<0>();  // no copy outlives the block
  pdl_launch_next();
}

// ---- host side ----

uint16_t half_bits(float f) {  // positive normal values only
  const __half h = __float2half_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// Random experts in the engine's row layout (codes, fp16 scales, zero points 0..15), one pool.
struct Experts {
  std::vector<Int4Expert> table;
  char* pool = nullptr;
  explicit Experts(std::mt19937& rng) {
    auto bytes_of = [](int64_t N, int64_t Kin) { return N * Kin / 2 + N * (Kin / kGroup) * 3 + 256; };
    const int64_t per = (2 * bytes_of(I, H) + bytes_of(H, I) + 255) / 256 * 256;
    DEV_CK(cudaMalloc(&pool, E * per));
    std::vector<char> host(static_cast<size_t>(per));
    char* dev = pool;
    table.resize(E);
    for (int e = 0; e < E; ++e) {
      char* h = host.data();
      int64_t off = 0;
      auto carve = [&](int64_t N, int64_t Kin) {
        Int4View v{};
        v.N = N, v.K = Kin, v.group_size = kGroup;
        auto* q = reinterpret_cast<uint32_t*>(h + off);
        for (int64_t i = 0; i < N * Kin / 8; ++i) q[i] = static_cast<uint32_t>(rng());
        v.qweight = reinterpret_cast<const uint32_t*>(dev + off);
        off += N * Kin / 2;
        auto* s = reinterpret_cast<uint16_t*>(h + off);
        for (int64_t i = 0; i < N * (Kin / kGroup); ++i) s[i] = half_bits(std::uniform_real_distribution<float>(0.002f, 0.02f)(rng));
        v.scales = reinterpret_cast<const uint16_t*>(dev + off);
        off += N * (Kin / kGroup) * 2;
        auto* z = reinterpret_cast<uint8_t*>(h + off);
        for (int64_t i = 0; i < N * (Kin / kGroup); ++i) z[i] = static_cast<uint8_t>(rng() % 16);
        v.zeros = reinterpret_cast<const uint8_t*>(dev + off);
        off = (off + N * (Kin / kGroup) + 255) / 256 * 256;
        return v;
      };
      table[e] = {carve(I, H), carve(I, H), carve(H, I)};
      DEV_CK(cudaMemcpy(dev, host.data(), static_cast<size_t>(off), cudaMemcpyHostToDevice));
      dev += per;
    }
  }
  ~Experts() { cudaFree(pool); }
};

}  // namespace

int main() {
  std::mt19937 rng(50);
  const Experts ex(rng);
  Int4Expert* dexp = dev_copy(ex.table);
  int dev = 0, sms = 0, optin = 0;
  DEV_CK(cudaGetDevice(&dev));
  DEV_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  DEV_CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  struct Pipe {
    const char* name;
    void (*kernel)(const Int4Expert*, const int32_t*, int, int, const uint8_t*, const VecScale*, uint8_t*, VecScale*);
    int stages, threads;
  };
  const Pipe pipes[] = {{"pipe 2x16", pipe_gate_up<2, 16>, 2, 512}, {"pipe 3x16", pipe_gate_up<3, 16>, 3, 512}, {"pipe 3x8", pipe_gate_up<3, 8>, 3, 256}};
  std::printf("the decode MoE's gate/up alone (%lld x %lld, group %lld, top-%d of %d), us a call (TB/s of the pairs' bytes), experts from HBM "
              "(%d routings cycled); stage %zu bytes, %d SMs\n",
              static_cast<long long>(H), static_cast<long long>(I), static_cast<long long>(kGroup), K, E, kSets, sizeof(Stage), sms);
  std::printf("%6s %8s | %14s", "tokens", "layer", "engine");
  for (const Pipe& pp : pipes) std::printf(" %14s", pp.name);
  std::printf(" | checks (h bit for bit against the engine's)\n");
  for (int T : {1, 2, 4, 8}) {
    std::vector<int32_t> ids(static_cast<size_t>(kSets) * T * K);
    for (int s = 0; s < kSets * T; ++s) {  // k distinct experts a token
      std::vector<int32_t> all(E);
      for (int e = 0; e < E; ++e) all[e] = e;
      for (int j = 0; j < K; ++j) {
        std::swap(all[j], all[j + rng() % (E - j)]);
        ids[static_cast<size_t>(s) * K + j] = all[j];
      }
    }
    std::vector<float> w(ids.size()), x(static_cast<size_t>(T) * H);
    for (auto& v : w) v = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
    for (auto& v : x) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    int32_t* dids = dev_copy(ids);
    float *dw = dev_copy(w), *dx = dev_copy(x), *out = nullptr;
    const WideMoeLayout lay = wide_moe_layout(T, K, H, I);
    uint8_t *ws = nullptr, *hq2 = nullptr;
    DEV_CK(cudaMalloc(&ws, lay.bytes));
    DEV_CK(cudaMalloc(&hq2, lay.bytes));  // the variants' own h (same layout)
    DEV_CK(cudaMalloc(&out, T * H * 4));
    const auto* xq = ws + lay.xq;
    const auto* xs = reinterpret_cast<const VecScale*>(ws + lay.xs);
    auto* vq = hq2 + lay.hq;
    auto* vs = reinterpret_cast<VecScale*>(hq2 + lay.hs);
    auto off = [&](int i) { return static_cast<int64_t>(i % kSets) * T * K; };
    auto layer = [&](int i) {  // the engine's whole call (x quantised, gate/up, down)
      DEV_CK(moe_int4_decode_wide(dexp, H, I, kGroup, dids + off(i), dw + off(i), T, K, dx, false, ws, out, nullptr));
    };
    layer(0);  // routing set 0: the engine's h, and x quantised for the variants
    DEV_CK(cudaDeviceSynchronize());
    const size_t hbytes = lay.hs - lay.hq + static_cast<size_t>(T) * K * (I / 32) * sizeof(VecScale);
    const auto want_h = host_copy(ws + lay.hq, hbytes);
    std::string checks;
    auto check_h = [&](const char* name) {
      DEV_CK(cudaDeviceSynchronize());
      const auto got = host_copy(hq2 + lay.hq, want_h.size());
      checks += std::string(name) + (got == want_h ? " ok, " : " DIFFERS, ");
      DEV_CK(cudaMemset(hq2, 0xff, lay.bytes));  // the next variant writes its own
    };
    auto engine = [&](int i) { engine_gate_up<<<dim3(I / kBlockRows, T * K), 256>>>(dexp, dids + off(i), K, xq, xs, vq, vs); };
    auto pipe = [&](const Pipe& pp, int i) {
      const size_t smem = pp.stages * sizeof(Stage);
      pp.kernel<<<sms, pp.threads, smem>>>(dexp, dids + off(i), K, T * K, xq, xs, vq, vs);
    };
    engine(0), check_h("engine");
    std::vector<bool> runs;
    for (const Pipe& pp : pipes) {
      const size_t smem = pp.stages * sizeof(Stage);
      const bool fits = smem <= static_cast<size_t>(optin) &&
                        cudaFuncSetAttribute(pp.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) == cudaSuccess;
      runs.push_back(fits);
      if (!fits) continue;
      pipe(pp, 0);
      DEV_CK(cudaGetLastError());
      check_h(pp.name);
    }
    const int reps = 400;
    const double bytes = double(T) * K * 2 * I * (H / 2 + kG * 3);  // the pairs' codes, scales and zero points
    auto cell = [&](float us) { std::printf(" %7.1f (%4.2f)", us, bytes / (us * 1e-6) / 1e12); };
    std::printf("%6d %8.1f |", T, time_us(layer, reps));
    cell(time_us(engine, reps));
    for (size_t v = 0; v < std::size(pipes); ++v) {
      if (runs[v]) cell(time_us([&](int i) { pipe(pipes[v], i); }, reps));
      else std::printf(" %14s", "(no room)");
    }
    DEV_CK(cudaGetLastError());
    std::printf(" | %s\n", checks.c_str());
    for (void* p : {(void*)dids, (void*)dw, (void*)dx, (void*)out, (void*)ws, (void*)hq2}) cudaFree(p);
  }
  cudaFree(dexp);
  return 0;
}
