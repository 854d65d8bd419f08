// bench/dev/moe_pipe_dev.cu: an experiment, not on the engine's path (bench_dev_moe_pipe).
//
// Question (issue 25): at 4 and 8 tokens the decode MoE's gate/up (moe_int4_wide.cu) runs several waves
// of blocks that each load their weights, compute, and leave; with two blocks an SM, memory idles while
// both compute (29 us at 8 tokens for 68 MB: 2.3 TB/s of the H100's ~3.0). Asking L2 for the next wave's
// weights made it slower (stop 50, call 3). Here a block per SM stays resident and walks its work items
// (a pair's 32 rows of gate and up, as the engine's blocks) through S stages of shared memory filled by
// cp.async (no registers held): item j + S - 1's weights, scales, zero points and x stream in while item j
// computes.
//   engine: the engine's wide_gate_up_kernel<2, 8> (gpu_core/moe_int4_wide.cuh), its launch from 2 tokens;
//   pipe S x W: S stages, W warps of 32 / W rows each; one block an SM (S >= 2 stages of 71.5 KB).
// The same for down (the second table): the engine's wide_down_kernel<1>, and its items (a token's
// 8 rows of each of its k experts, as the engine's blocks) through S stages of 26 KB, the token's h staged
// with them; each variant's output checked bit for bit against the engine's call.
// Each row's arithmetic is the engine's (the same lane's vectors in the same order, the same reduction),
// so every variant's h is checked bit for bit against the engine's whole call. Times each alone at 1 / 2 /
// 4 / 8 tokens, experts from HBM (32 routings cycled). The 35B's shape only (H 2048, I 512, group 128).
// Usage: bench_dev_moe_pipe (a CUDA device, sm_80+; the 3-stage forms need 215 KB of shared memory a
// block, sm_90: they are skipped where the device has less).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/dev/dev_util.cuh"
#include "core/dtype.h"
#include "gpu_core/cp_async.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/moe_int4_wide.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/workspace_sizes.h"

namespace {

using namespace tandem::gpu;
using namespace tandem::gpu::detail;
using namespace tandem::dev;

constexpr int64_t H = 2048, I = 512, kGroup = 128;
constexpr int E = 256, K = 8, kSets = 32;
constexpr int kGshift = 2;  // group 128 = 32 << 2
constexpr int kNvec = H / 32, kG = H / kGroup, kNV = kNvec / 32;  // 64 vectors a row, 16 groups, 2 vectors a lane

// ---- the pipelined form ----

// A block's items j < mine through S shared-memory stages: fill(slot, j) issues item j's copies into
// stage slot; use(slot, j) runs once every thread's copies of item j are in, and must end with the
// block's barrier behind its last read of the stage (the stage is refilled in the next round).
template <int S, typename Fill, typename Use>
__device__ __forceinline__ void pipeline(int mine, Fill&& fill, Use&& use) {
#pragma unroll
  for (int j = 0; j < S - 1; ++j) {
    if (j < mine) fill(j, j);
    copy_async_commit();
  }
  int slot = 0;
  for (int j = 0; j < mine; ++j) {
    if (j + S - 1 < mine) fill((slot + S - 1) % S, j + S - 1);
    copy_async_commit();
    copy_async_wait<S - 1>();  // this thread's copies of item j are in
    __syncthreads();   // and everyone's
    use(slot, j);
    slot = (slot + 1) % S;
  }
  copy_async_wait<0>();  // no copy outlives the block
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

// A block's items (at most kMaxItems: the launch has at least items / kMaxItems blocks) with their
// experts' addresses, resolved once after the wait (ids -> expert -> views: two dependent loads) so that
// a stage's fill issues its copies at once.
constexpr int kMaxItems = 32;

// This block's items of `items` (items blockIdx.x, + gridDim.x, ...); traps past kMaxItems (a grid too
// small: pipe_grid sizes it).
__device__ __forceinline__ int block_items(int items) {
  const int b = static_cast<int>(blockIdx.x), mine = b < items ? (items - b + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x) : 0;
  if (mine > kMaxItems) __trap();
  return mine;
}
struct GateUpItem {
  const uint4 *qg, *qu;  // null: not resident
  const uint16_t *gs, *us;
  const uint8_t *gz, *uz;
};

// Item w: pair w / (I / 32), row block w % (I / 32), as the engine's grid is laid out.
template <int THREADS>
__device__ __forceinline__ void fill(Stage& st, int w, const GateUpItem& it, const uint8_t* __restrict__ xq,
                                     const VecScale* __restrict__ xs, int k) {
  constexpr int nb = static_cast<int>(I / kBlockRows);
  const int p = w / nb, rb = w % nb, t = p / k, tid = threadIdx.x;
  const uint4* qg = it.qg;
  if (tid == 0) st.valid = qg != nullptr;
  if (!qg) return;
  const uint4* qu = it.qu;
  const int64_t r0 = int64_t{rb} * kBlockRows;
  for (int i = tid; i < kBlockRows * kNvec; i += THREADS) {
    copy_async16(&st.gate[i], qg + r0 * kNvec + i);
    copy_async16(&st.up[i], qu + r0 * kNvec + i);
  }
  constexpr int sc = kBlockRows * kG * 2 / 16, zc = kBlockRows * kG / 16;  // 16-byte pieces
  const char* gsrc = reinterpret_cast<const char*>(it.gs + r0 * kG);
  const char* usrc = reinterpret_cast<const char*>(it.us + r0 * kG);
  const char* gzs = reinterpret_cast<const char*>(it.gz + r0 * kG);
  const char* uzs = reinterpret_cast<const char*>(it.uz + r0 * kG);
  const uint8_t* xt = xq + int64_t{t} * H * 2;
  const char* xst = reinterpret_cast<const char*>(xs + int64_t{t} * kNvec);
  for (int i = tid; i < 2 * sc + 2 * zc + 4 * kNvec + kNvec * 8 / 16; i += THREADS) {
    int j = i;
    if (j < sc) { copy_async16(reinterpret_cast<char*>(st.gs) + 16 * j, gsrc + 16 * j); continue; }
    j -= sc;
    if (j < sc) { copy_async16(reinterpret_cast<char*>(st.us) + 16 * j, usrc + 16 * j); continue; }
    j -= sc;
    if (j < zc) { copy_async16(reinterpret_cast<char*>(st.gz) + 16 * j, gzs + 16 * j); continue; }
    j -= zc;
    if (j < zc) { copy_async16(reinterpret_cast<char*>(st.uz) + 16 * j, uzs + 16 * j); continue; }
    j -= zc;
    if (j < 4 * kNvec) { copy_async16(&st.x[j], xt + 16 * j); continue; }
    j -= 4 * kNvec;
    copy_async16(reinterpret_cast<char*>(st.xs) + 16 * j, xst + 16 * j);
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
  __shared__ GateUpItem tab[kMaxItems];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, items = pairs * nb;
  const int mine = block_items(items);
  pdl_wait();  // ids and x are the kernels before's
  for (int j = threadIdx.x; j < mine; j += THREADS) {
    const Int4Expert* ex = experts + ids[(blockIdx.x + j * gridDim.x) / nb];
    tab[j] = {reinterpret_cast<const uint4*>(ex->gate.qweight), reinterpret_cast<const uint4*>(ex->up.qweight), ex->gate.scales, ex->up.scales,
              ex->gate.zeros, ex->up.zeros};
  }
  __syncthreads();
  const auto fill_item = [&](int slot, int j) { fill<THREADS>(st[slot], blockIdx.x + j * gridDim.x, tab[j], xq, xs, k); };
  pipeline<S>(mine, fill_item, [&](int slot, int j) {
    const int w = blockIdx.x + j * gridDim.x;
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
    // hb is next written after the next round's barrier, which warp 0 reaches after quantising
  });
  pdl_launch_next();
}

// ---- down: the pipelined form ----

constexpr int kRowsD = kDownRows * kDownRowsPer;                 // 8 rows an item
constexpr int kNvecD = I / 32, kGD = I / kGroup;                 // 16 vectors of h a pair, 4 groups a down row
static_assert(kNvecD == kDownLanes && K == kMaxK, "the 35B's shape: one vector a lane (NV 1), k = 8");

// One down stage: a token's 8 rows of each of its k experts (codes, scales, zero points), the k pairs' h
// and the token's expert weights.
struct DownStage {
  uint4 w[K][kRowsD * kNvecD];   // expert slot j, row r's vector v at r * kNvecD + v
  uint16_t sc[K][kRowsD * kGD];  // row r's group at r * kGD + group
  uint8_t z[K][kRowsD * kGD];
  uint4 h[K][4 * kNvecD];        // pair t k + j's quantised h, chunk-major
  VecScale hs[K][kNvecD];
  float rw[K];
  int valid[K];                  // slot j's expert is resident (and j < k)
};
static_assert(kRowsD * kGD * 2 % 16 == 0 && kRowsD * kGD % 16 == 0, "scales and zeros in 16-byte copies");

// A down item's experts (slot j < K; q null: none, or not resident), resolved once as gate/up's.
struct DownItem {
  const uint4* q[K];
  const uint16_t* sc[K];
  const uint8_t* z[K];
};

// Item w: token w / (H / 8), row group w % (H / 8), as the engine's grid is laid out.
__device__ __forceinline__ void fill_down(DownStage& st, int w, const DownItem& it, const float* __restrict__ weights, int k,
                                          const uint8_t* __restrict__ hq, const VecScale* __restrict__ hs) {
  constexpr int nb = static_cast<int>(H / kRowsD);
  const int t = w / nb, rg = w % nb, tid = threadIdx.x;
  const int j = tid / 32, lane = tid % 32;  // a warp a slot (K warps)
  if (j >= K) return;
  const uint4* q = it.q[j];
  if (lane == 0) st.valid[j] = q != nullptr;
  if (!q) return;
  const int64_t r0 = int64_t{rg} * kRowsD, p = int64_t{t} * k + j;
  const uint4* src = q + r0 * kNvecD;
  for (int i = lane; i < kRowsD * kNvecD; i += 32) copy_async16(&st.w[j][i], src + i);  // 128 pieces
  const uint4* hsrc = reinterpret_cast<const uint4*>(hq + p * I * 2);
  for (int i = lane; i < 4 * kNvecD; i += 32) copy_async16(&st.h[j][i], hsrc + i);       // 64 pieces
  if (lane < 4) copy_async16(reinterpret_cast<char*>(st.sc[j]) + 16 * lane, reinterpret_cast<const char*>(it.sc[j] + r0 * kGD) + 16 * lane);
  else if (lane < 6) copy_async16(reinterpret_cast<char*>(st.z[j]) + 16 * (lane - 4), reinterpret_cast<const char*>(it.z[j] + r0 * kGD) + 16 * (lane - 4));
  else if (lane < 14) copy_async16(reinterpret_cast<char*>(st.hs[j]) + 16 * (lane - 6), reinterpret_cast<const char*>(hs + p * kNvecD) + 16 * (lane - 6));
  else if (lane == 14) copy_async4(&st.rw[j], weights + p);
}

template <int S>
__global__ void __launch_bounds__(kDownThreads, 1)
    pipe_down(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, const float* __restrict__ weights, int k, int T,
              const uint8_t* __restrict__ hq, const VecScale* __restrict__ hs, float* __restrict__ out) {
  constexpr int RPH = kDownRowsPer, nb = static_cast<int>(H / kRowsD);
  extern __shared__ __align__(16) unsigned char smem[];
  DownStage* st = reinterpret_cast<DownStage*>(smem);
  __shared__ float share[kDownGroups][kRowsD];
  const int hw = threadIdx.x / kDownLanes, l = threadIdx.x % kDownLanes, r = hw % kDownRows, g = hw / kDownRows;
  __shared__ DownItem tab[kMaxItems];
  const int items = T * nb;
  const int mine = block_items(items);
  pdl_wait();
  for (int e = threadIdx.x; e < mine * K; e += kDownThreads) {
    const int j = e / K, slot_j = e % K, t = (blockIdx.x + j * gridDim.x) / nb;
    const Int4View* d = slot_j < k ? &experts[ids[t * k + slot_j]].down : nullptr;
    tab[j].q[slot_j] = d ? reinterpret_cast<const uint4*>(d->qweight) : nullptr;
    tab[j].sc[slot_j] = d ? d->scales : nullptr;
    tab[j].z[slot_j] = d ? d->zeros : nullptr;
  }
  __syncthreads();
  const auto fill_item = [&](int slot, int j) { fill_down(st[slot], blockIdx.x + j * gridDim.x, tab[j], weights, k, hq, hs); };
  pipeline<S>(mine, fill_item, [&](int slot, int j) {
    const int w = blockIdx.x + j * gridDim.x;
    const DownStage& s = st[slot];
    float acc[RPH] = {};
#pragma unroll
    for (int m = 0; m < kDownPer; ++m) {
      const int e = g + kDownGroups * m;  // the expert slot
      if (e >= k || !s.valid[e]) continue;
      float a[RPH] = {};
      uint4 hv[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) hv[c] = s.h[e][c * kNvecD + l];
      const VecScale vs = s.hs[e][l];
#pragma unroll
      for (int o = 0; o < RPH; ++o) {
        const int row = r * RPH + o, gi = row * kGD + (l >> kGshift);
        a[o] += __half2float(__ushort_as_half(s.sc[e][gi])) * vec_dot(s.w[e][row * kNvecD + l], hv, 16 * s.z[e][gi], vs);
      }
#pragma unroll
      for (int o = 0; o < RPH; ++o) acc[o] += s.rw[e] * a[o];
    }
#pragma unroll
    for (int o = 0; o < RPH; ++o) {
      const float a = group_sum<kDownLanes>(acc[o]);
      if (l == 0) share[g][r * RPH + o] = a;
    }
    __syncthreads();  // the stage is read (it is refilled next round) and share is written
    if (threadIdx.x < kRowsD) {
      float sum = share[0][threadIdx.x];
#pragma unroll
      for (int q2 = 1; q2 < kDownGroups; ++q2) sum += share[q2][threadIdx.x];
      out[static_cast<int64_t>(w / nb) * H + static_cast<int64_t>(w % nb) * kRowsD + threadIdx.x] = sum;
    }
    // share is next written after the next round's barrier, which these threads reach after reading it
  });
  pdl_launch_next();
}

// ---- host side ----

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
        for (int64_t i = 0; i < N * (Kin / kGroup); ++i) s[i] = tandem::f32_to_f16(std::uniform_real_distribution<float>(0.002f, 0.02f)(rng));
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

// One block an SM, or enough that none has more than kMaxItems items.
int pipe_grid(int items, int sms) { return std::max(sms, (items + kMaxItems - 1) / kMaxItems); }

// Runs once (routing set 0) and checks each variant whose stages fit the device's shared memory; returns
// which fit.
template <typename V, size_t N, typename Launch, typename Check>
std::vector<bool> try_variants(const V (&variants)[N], size_t stage_bytes, int optin, Launch&& launch, Check&& check) {
  std::vector<bool> fit;
  for (const V& v : variants) {
    const size_t smem = v.stages * stage_bytes;
    const bool ok = smem <= static_cast<size_t>(optin) &&
                    cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) == cudaSuccess;
    fit.push_back(ok);
    if (!ok) continue;
    launch(v, 0);
    DEV_CK(cudaGetLastError());
    check(v.name);
  }
  return fit;
}

// " us (TB/s)" of a call that reads `bytes`.
std::string cell(float us, double bytes) {
  char c[32];
  std::snprintf(c, sizeof(c), " %7.1f (%4.2f)", us, bytes / (us * 1e-6) / 1e12);
  return c;
}

// Each variant's time (or that it did not fit), as cells.
template <typename V, size_t N, typename Time>
std::string variant_cells(const V (&variants)[N], const std::vector<bool>& fit, double bytes, Time&& time) {
  std::string line;
  for (size_t v = 0; v < N; ++v) {
    char c[32];
    std::snprintf(c, sizeof(c), " %14s", "(no room)");
    line += fit[v] ? cell(time(variants[v]), bytes) : std::string(c);
  }
  return line;
}

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
  std::vector<std::string> down_lines;
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
    auto engine = [&](int i) {
      wide_gate_up_kernel<kNV, 8><<<dim3(I / kBlockRows, T * K), 256>>>(dexp, H, I, dids + off(i), K, xq, xs, vq, vs, kGshift);
    };
    auto pipe = [&](const Pipe& pp, int i) {
      const size_t smem = pp.stages * sizeof(Stage);
      pp.kernel<<<pipe_grid(T * K * static_cast<int>(I / kBlockRows), sms), pp.threads, smem>>>(dexp, dids + off(i), K, T * K, xq, xs, vq, vs);
    };
    engine(0), check_h("engine");
    const auto runs = try_variants(pipes, sizeof(Stage), optin, pipe, check_h);
    const int reps = 400;
    const double bytes = double(T) * K * 2 * I * (H / 2 + kG * 3);  // the pairs' codes, scales and zero points
    const std::string up_cells = variant_cells(pipes, runs, bytes, [&](const Pipe& pp) { return time_us([&](int i) { pipe(pp, i); }, reps); });
    std::printf("%6d %8.1f |%s%s", T, time_us(layer, reps), cell(time_us(engine, reps), bytes).c_str(), up_cells.c_str());
    DEV_CK(cudaGetLastError());
    std::printf(" | %s\n", checks.c_str());
    {  // down, from the engine's h of routing set 0, against the engine's output
      layer(0);
      DEV_CK(cudaDeviceSynchronize());
      const auto want_out = host_copy(out, static_cast<size_t>(T) * H);
      float* out2 = nullptr;
      DEV_CK(cudaMalloc(&out2, T * H * 4));
      const auto* hq = ws + lay.hq;
      const auto* hsv = reinterpret_cast<const VecScale*>(ws + lay.hs);
      std::string dchecks;
      auto check_out = [&](const char* name) {
        DEV_CK(cudaDeviceSynchronize());
        dchecks += std::string(name) + (host_copy(out2, want_out.size()) == want_out ? " ok, " : " DIFFERS, ");
        DEV_CK(cudaMemset(out2, 0xff, T * H * 4));
      };
      auto edown = [&](int i) {
        wide_down_kernel<1><<<dim3(H / kRowsD, T), kDownThreads>>>(dexp, H, I, dids + off(i), dw + off(i), K, hq, hsv, out2, kGshift);
      };
      struct PipeD {
        const char* name;
        void (*kernel)(const Int4Expert*, const int32_t*, const float*, int, int, const uint8_t*, const VecScale*, float*);
        int stages;
      };
      const PipeD dpipes[] = {{"pipe 4", pipe_down<4>, 4}, {"pipe 8", pipe_down<8>, 8}};
      auto pdown = [&](const PipeD& pp, int i) {
        pp.kernel<<<pipe_grid(T * static_cast<int>(H / kRowsD), sms), kDownThreads, pp.stages * sizeof(DownStage)>>>(dexp, dids + off(i), dw + off(i), K, T, hq, hsv, out2);
      };
      edown(0), check_out("engine");
      const auto druns = try_variants(dpipes, sizeof(DownStage), optin, pdown, check_out);
      const double dbytes = double(T) * K * H * (I / 2 + kGD * 3);
      const std::string cells = variant_cells(dpipes, druns, dbytes, [&](const PipeD& pp) { return time_us([&](int i) { pdown(pp, i); }, reps); });
      char head[32];
      std::snprintf(head, sizeof(head), "%6d down |", T);
      const std::string line = head + cell(time_us(edown, reps), dbytes) + cells;
      DEV_CK(cudaGetLastError());
      down_lines.push_back(line + " | " + dchecks);
      cudaFree(out2);
    }
    for (void* p : {(void*)dids, (void*)dw, (void*)dx, (void*)out, (void*)ws, (void*)hq2}) cudaFree(p);
  }
  std::printf("\nthe decode MoE's down alone (%lld x %lld), us a call (TB/s of the pairs' bytes), from the engine's h\n%6s %4s | %14s %14s %14s | checks "
              "(output bit for bit against the engine's); stage %zu bytes\n",
              static_cast<long long>(H), static_cast<long long>(I), "tokens", "", "engine", "pipe 4", "pipe 8", sizeof(DownStage));
  for (const std::string& l : down_lines) std::printf("%s\n", l.c_str());
  cudaFree(dexp);
  return 0;
}
