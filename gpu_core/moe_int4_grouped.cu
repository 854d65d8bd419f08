// gpu_core/moe_int4_grouped.cu: routed experts of a prefill chunk, grouped by expert (see moe.cuh).
#include <mma.h>

#include <algorithm>

#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/smem.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;
// The workspace, carved as grouped_moe_layout (workspace_sizes.h) says: the planner counts the same
// bytes. Its work items are counted for items of kGroupedItem = 8 pairs; the tensor-core kernels'
// items hold kTcM = 32, so they use fewer of them.
struct Carve {
  int32_t *order, *pos_of, *counts;  // counts: [0] work items, [1] valid pairs
  int4* items;                        // (expert, first sorted pair, pairs, 0)
  __half *xg, *xu, *h;
  float* y;
  Carve(void* base, int64_t P, int64_t H, int64_t I, int E) {
    char* p = static_cast<char*>(base);
    const GroupedMoeLayout g = grouped_moe_layout(P, H, I, E);
    order = reinterpret_cast<int32_t*>(p + g.order);
    pos_of = reinterpret_cast<int32_t*>(p + g.pos_of);
    counts = reinterpret_cast<int32_t*>(p + g.counts);
    items = reinterpret_cast<int4*>(p + g.items);
    xg = reinterpret_cast<__half*>(p + g.xg);
    xu = reinterpret_cast<__half*>(p + g.xu);
    h = reinterpret_cast<__half*>(p + g.h);
    y = reinterpret_cast<float*>(p + g.y);
  }
  // sum of ceil(c_e / item) over experts
  static int64_t max_items(int64_t P, int E, int item) { return (P + item - 1) / item + E; }
};

// Warps of group_pairs_kernel for E experts: each keeps its own count of every expert in shared memory.
constexpr int kGroupSmemInts = 10 * 1024;
int group_pairs_warps(int E) { return std::max(1, std::min(32, kGroupSmemInts / E - 1)); }

// One block of W warps, warp w owning the pairs [w * seg, (w + 1) * seg): each warp counts its
// pairs per expert; warp 0 lays out the work items; each expert's start is split among the warps
// in warp order (cursor[w][e]); then every warp scatters its own pairs, 32 a step in pair order --
// lanes with the same expert find each other (match_any) and take consecutive places after their
// warp's cursor. The order within an expert is pair order, as one warp walking all pairs would give.
__global__ void group_pairs_kernel(const int32_t* __restrict__ ids, int P, int E, int item, int32_t* order, int32_t* pos_of,
                                   int32_t* counts, int4* items) {
  extern __shared__ int32_t sm[];  // counts, then cursors [W][E]; start [E]
  const int W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const unsigned below = (1u << lane) - 1u;
  const int seg = (P + W - 1) / W, p0 = min(P, warp * seg), p1 = min(P, p0 + seg);
  int32_t *mine = sm + warp * E, *start = sm + W * E;
  for (int i = threadIdx.x; i < W * E; i += blockDim.x) sm[i] = 0;
  for (int p = threadIdx.x; p < P; p += blockDim.x) pos_of[p] = -1;
  __syncthreads();
  // Each lane's expert for step `base` of this warp's segment (-1: past it, or an id out of range).
  auto expert_at = [&](int base) {
    const int p = base + lane;
    const int e = p < p1 ? ids[p] : -1;
    return e >= 0 && e < E ? e : -1;
  };
  for (int base = p0; base < p1; base += 32) {
    const int e = expert_at(base);
    const unsigned same = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (same & below) == 0) mine[e] += __popc(same);  // one lane an expert: no races
  }
  __syncthreads();
  // Each expert's count, then its first place (start) and the work items, by warp 0: lane l takes the
  // experts [l * per, (l + 1) * per), their totals scanned across the lanes.
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int w = 0; w < W; ++w) c += sm[w * E + e];
    start[e] = c;
  }
  __syncthreads();
  if (warp == 0) {
    const int per = (E + 31) / 32, e0 = min(E, lane * per), e1 = min(E, e0 + per);
    int c = 0, n = 0;
    for (int e = e0; e < e1; ++e) c += start[e], n += (start[e] + item - 1) / item;
    int cs = c, ns = n;  // inclusive scans across the lanes
    for (int o = 1; o < 32; o <<= 1) {
      const int co = __shfl_up_sync(0xffffffffu, cs, o), no = __shfl_up_sync(0xffffffffu, ns, o);
      if (lane >= o) cs += co, ns += no;
    }
    int s = cs - c, it = ns - n;
    for (int e = e0; e < e1; ++e) {
      const int ce = start[e];
      start[e] = s;
      for (int c0 = 0; c0 < ce; c0 += item) items[it++] = make_int4(e, s + c0, min(item, ce - c0), 0);
      s += ce;
    }
    if (lane == 31) counts[0] = it, counts[1] = s;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {  // warp w's first place for expert e
    int s = start[e];
    for (int w = 0; w < W; ++w) {
      const int n = sm[w * E + e];
      sm[w * E + e] = s;
      s += n;
    }
  }
  __syncthreads();
  for (int base = p0; base < p1; base += 32) {
    const int e = expert_at(base);
    const unsigned same = __match_any_sync(0xffffffffu, e);
    if (e >= 0) {
      const int s = mine[e] + __popc(same & below);
      order[s] = base + lane;
      pos_of[base + lane] = s;
    }
    __syncwarp();
    if (e >= 0 && (same & below) == 0) mine[e] += __popc(same);
    __syncwarp();
  }
}

// Sorted pair s: its token's row in fp16, in the expert's gate and up input orders.
__global__ void gather_pairs_kernel(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, int k, int64_t H,
                                    const float* __restrict__ x, const int32_t* __restrict__ order, const int32_t* __restrict__ counts,
                                    __half* xg, __half* xu) {
  const int s = blockIdx.x;
  if (s >= counts[1]) return;
  const int p = order[s];
  const Int4Expert& ex = experts[ids[p]];
  if (!ex.gate.qweight) return;  // not resident: never read
  const float* xt = x + static_cast<int64_t>(p / k) * H;
  const int32_t *pg = ex.gate.perm, *pu = ex.up.perm;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    xg[s * H + i] = __float2half_rn(xt[pg ? pg[i] : i]);
    xu[s * H + i] = __float2half_rn(xt[pu ? pu[i] : i]);
  }
}

// out[t, :] = sum over j of y[pos_of[t*k + j], :] for the pairs a resident expert served.
__global__ void combine_kernel(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, int k, int64_t H,
                               const int32_t* __restrict__ pos_of, const float* __restrict__ y, float* __restrict__ out) {
  extern __shared__ int32_t pos[];  // [k]: sorted position, or -1 when the pair contributes nothing
  const int t = blockIdx.x;
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const int p = t * k + j, s = pos_of[p];
    pos[j] = s >= 0 && experts[ids[p]].down.qweight ? s : -1;
  }
  __syncthreads();
  for (int64_t n = threadIdx.x; n < H; n += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
      if (pos[j] >= 0) acc += y[pos[j] * H + n];
    out[t * H + n] = acc;
  }
}

// ---- Tensor-core path (moe_int4_grouped_tc) -----------------------------------------------------
// A block computes a tile of kTcM sorted pairs (one expert's) x kTcN output rows with WMMA
// (m16n16k16, fp16 in, fp32 accumulate), kTcK inputs a stage: the pairs' fp16 rows and the expert's
// rows dequantised to fp16 ((q - z) * s) are staged in shared memory; 4 warps own 16 rows each.
constexpr int kTcM = 32, kTcN = 64, kTcK = 64, kTcThreads = 128;
constexpr int kLdA = kTcK + 8, kLdB = kTcK + 8, kLdC = kTcN + 4;  // padded rows (bank spread; multiples of 8 halves / 4 floats)

constexpr int kAPer = kTcM * (kTcK / 8) / kTcThreads;  // 16-byte activation pieces a thread stages
constexpr int kWPer = kTcN * (kTcK / 8) / kTcThreads;  // weight words a thread stages
static_assert(kAPer * kTcThreads == kTcM * (kTcK / 8) && kWPer * kTcThreads == kTcN * (kTcK / 8), "whole tiles per pass");

// Piece i of the activation tile at k0 (row m = i / (kTcK / 8) of the tile, inputs c8 * 8 .. + 7 with
// c8 = i % (kTcK / 8)): X[s0 + m, k0 + c8 * 8 ..] (X fp16 [pairs][K]; through perm when given); zeros
// past count / K. a_put stores it at As[m][c8 * 8].
__device__ __forceinline__ uint4 a_piece(const __half* X, int64_t K, int s0, int count, int64_t k0, const int32_t* perm, int i) {
  const int m = i / (kTcK / 8), c8 = i % (kTcK / 8);
  const int64_t k = k0 + c8 * 8;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (m < count && k < K) {
    const __half* row = X + static_cast<int64_t>(s0 + m) * K;
    if (!perm) {
      v = *reinterpret_cast<const uint4*>(row + k);
    } else {
      __half e[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) e[j] = row[perm[k + j]];
      memcpy(&v, e, 16);
    }
  }
  return v;
}
__device__ __forceinline__ void a_put(const uint4& v, int i, __half* As) {
  *reinterpret_cast<uint4*>(As + (i / (kTcK / 8)) * kLdA + (i % (kTcK / 8)) * 8) = v;
}

// Word i of the weight tile: W's row n0 + i / (kTcK / 8), word k0 / 8 + i % (kTcK / 8), with its scale and
// zero point (ok false past the matrix); w_put writes its 8 inputs to Bs as fp16((q - z) * s), zeros
// when !ok.
struct WWord {
  uint32_t q;
  uint16_t s;
  uint8_t z;
  bool ok;
};
__device__ __forceinline__ WWord w_word(const Int4View& W, int64_t n0, int64_t k0, int i) {
  const int64_t words = W.K / 8, G = W.K / W.group_size;
  const int64_t row = n0 + i / (kTcK / 8), w = k0 / 8 + i % (kTcK / 8);
  WWord r{0u, 0, 0, row < W.N && w < words};
  if (r.ok) {
    const int64_t g = (w * 8) / W.group_size;
    r.q = load_stream(W.qweight + row * words + w);
    r.s = W.scales[row * G + g];
    r.z = W.zeros[row * G + g];
  }
  return r;
}
__device__ __forceinline__ void w_put(const WWord& r, int i, __half* Bs) {
  __half2* dst = reinterpret_cast<__half2*>(Bs + (i / (kTcK / 8)) * kLdB + (i % (kTcK / 8)) * 8);
  if (r.ok) {
    const __half2 z = zero_1024(r.z);
    const __half2 sc = __half2half2(__ushort_as_half(r.s));
#pragma unroll
    for (int p = 0; p < 4; ++p) dst[p] = __hmul2(dequant_pair(r.q, p, z), sc);  // inputs 2p, 2p + 1 of the word
  } else {
#pragma unroll
    for (int p = 0; p < 4; ++p) dst[p] = __float2half2_rn(0.0f);
  }
}

// A stage's pieces of this thread all loaded into registers first (fetch_*), stored later (store_*), so
// the loads are in flight during the previous stage's products.
struct ARegs {
  uint4 v[kAPer];
};
struct WRegs {
  WWord w[kWPer];
};
__device__ __forceinline__ void fetch_a(const __half* X, int64_t K, int s0, int count, int64_t k0, const int32_t* perm, ARegs& r) {
#pragma unroll
  for (int u = 0; u < kAPer; ++u) r.v[u] = a_piece(X, K, s0, count, k0, perm, threadIdx.x + u * kTcThreads);
}
__device__ __forceinline__ void store_a(const ARegs& r, __half* As) {
#pragma unroll
  for (int u = 0; u < kAPer; ++u) a_put(r.v[u], threadIdx.x + u * kTcThreads, As);
}
__device__ __forceinline__ void fetch_w(const Int4View& W, int64_t n0, int64_t k0, WRegs& r) {
#pragma unroll
  for (int u = 0; u < kWPer; ++u) r.w[u] = w_word(W, n0, k0, threadIdx.x + u * kTcThreads);
}
__device__ __forceinline__ void store_w(const WRegs& r, __half* Bs) {
#pragma unroll
  for (int u = 0; u < kWPer; ++u) w_put(r.w[u], threadIdx.x + u * kTcThreads, Bs);
}

using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major>;
using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::col_major>;
using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// Warp `warp`'s 16 rows x 32 pairs of the staged tiles: c[mi] += As[16 mi..][kTcK] x Bs[16 warp..][kTcK]^T.
__device__ __forceinline__ void tc_mma(const __half* As, const __half* Bs, int warp, FragC (&c)[2]) {
#pragma unroll
  for (int kk = 0; kk < kTcK; kk += 16) {
    FragB b;
    nvcuda::wmma::load_matrix_sync(b, Bs + warp * 16 * kLdB + kk, kLdB);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      FragA a;
      nvcuda::wmma::load_matrix_sync(a, As + mi * 16 * kLdA + kk, kLdA);
      nvcuda::wmma::mma_sync(c[mi], a, b, c[mi]);
    }
  }
}

// The accumulators into C [kTcM][kLdC] (pair, row of the tile).
__device__ __forceinline__ void tc_store(const FragC (&c)[2], float* C, int warp) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) nvcuda::wmma::store_matrix_sync(C + mi * 16 * kLdC + warp * 16, c[mi], kLdC, nvcuda::wmma::mem_row_major);
}

// A gate/up tile's end: the accumulators through shared memory (Cg, Cu), h = silu(g) * u in fp16.
__device__ __forceinline__ void gate_up_epilogue(const FragC (&cg)[2], const FragC (&cu)[2], float* Cg, float* Cu, int warp, int cnt, int s0,
                                                 int64_t n0, int64_t I, __half* __restrict__ h) {
  tc_store(cg, Cg, warp);
  tc_store(cu, Cu, warp);
  __syncthreads();
  for (int i = threadIdx.x; i < kTcM * kTcN; i += kTcThreads) {
    const int m = i / kTcN, n = i % kTcN;
    if (m >= cnt || n0 + n >= I) continue;
    const float g = Cg[m * kLdC + n], u = Cu[m * kLdC + n];
    h[static_cast<int64_t>(s0 + m) * I + n0 + n] = __float2half_rn(g / (1.0f + __expf(-g)) * u);
  }
}

// A down tile's end: the accumulators through shared memory (C), y = routing weight * product.
__device__ __forceinline__ void down_epilogue(const FragC (&c)[2], float* C, int warp, int cnt, int s0, int64_t n0, int64_t H,
                                              const int32_t* __restrict__ order, const float* __restrict__ weights, float* __restrict__ y) {
  tc_store(c, C, warp);
  __syncthreads();
  for (int i = threadIdx.x; i < kTcM * kTcN; i += kTcThreads) {
    const int m = i / kTcN, n = i % kTcN;
    if (m >= cnt || n0 + n >= H) continue;
    y[static_cast<int64_t>(s0 + m) * H + n0 + n] = weights[order[s0 + m]] * C[m * kLdC + n];
  }
}

// The K loop of a tile over two shared buffers: mma(b) multiplies buffer b; fetch(k0) loads a stage's
// pieces into registers, store(b) puts them into buffer b (weights dequantised), the next stage's loads
// in flight during this stage's MMAs (one barrier a stage). (A one-buffer form, load then multiply with
// two barriers a stage, measured 154 vs 116 ms a 2048-token layer on the H200: removed in session 9.)
template <typename Fetch, typename Store, typename Mma>
__device__ __forceinline__ void tc_k_loop(int64_t K, Fetch&& fetch, Store&& store, Mma&& mma) {
  fetch(0);
  store(0);
  __syncthreads();
  int cur = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kTcK, cur ^= 1) {
    const bool more = k0 + kTcK < K;
    if (more) fetch(k0 + kTcK);  // in flight during this stage's MMAs
    mma(cur);
    if (more) store(cur ^ 1);  // that buffer's last readers passed the previous barrier
    __syncthreads();
  }
}

// Shared memory of one stage buffer: gate/up Ag, Au [kTcM][kLdA], Bg, Bu [kTcN][kLdB]; down As, Bs.
constexpr int kGateUpBufHalves = 2 * kTcM * kLdA + 2 * kTcN * kLdB, kDownBufHalves = kTcM * kLdA + kTcN * kLdB;
constexpr size_t tc_smem_bytes(int buf_halves) { return 2 * buf_halves * sizeof(__half); }

__global__ void __launch_bounds__(kTcThreads)
    tc_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int4* __restrict__ items,
                      const int32_t* __restrict__ counts, const __half* __restrict__ xg, const __half* __restrict__ xu,
                      __half* __restrict__ h) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __half* const base = reinterpret_cast<__half*>(smem_raw);
  auto Ag = [&](int b) { return base + b * kGateUpBufHalves; };
  auto Au = [&](int b) { return Ag(b) + kTcM * kLdA; };
  auto Bg = [&](int b) { return Au(b) + kTcM * kLdA; };
  auto Bu = [&](int b) { return Bg(b) + kTcN * kLdB; };
  if (static_cast<int>(blockIdx.y) >= counts[0]) return;
  const int4 it = items[blockIdx.y];
  const Int4Expert& ex = experts[it.x];
  if (!ex.gate.qweight) return;  // not resident (hybrid); uniform per block
  const int s0 = it.y, cnt = it.z, warp = threadIdx.x / 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTcN;
  FragC cg[2], cu[2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) wmma::fill_fragment(cg[mi], 0.0f), wmma::fill_fragment(cu[mi], 0.0f);
  ARegs ag, au;
  WRegs wg, wu;
  tc_k_loop(
      H,
      [&](int64_t k0) {
        fetch_a(xg, H, s0, cnt, k0, nullptr, ag);  // already in each matrix's input order (gather)
        fetch_a(xu, H, s0, cnt, k0, nullptr, au);
        fetch_w(ex.gate, n0, k0, wg);
        fetch_w(ex.up, n0, k0, wu);
      },
      [&](int b) {
        store_a(ag, Ag(b));
        store_a(au, Au(b));
        store_w(wg, Bg(b));
        store_w(wu, Bu(b));
      },
      [&](int b) {
        tc_mma(Ag(b), Bg(b), warp, cg);
        tc_mma(Au(b), Bu(b), warp, cu);
      });
  float* Cg = reinterpret_cast<float*>(Bg(0));  // kTcM x kLdC floats fit in a B tile
  float* Cu = reinterpret_cast<float*>(Bu(0));
  gate_up_epilogue(cg, cu, Cg, Cu, warp, cnt, s0, n0, I, h);
}

__global__ void __launch_bounds__(kTcThreads)
    tc_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int4* __restrict__ items,
                   const int32_t* __restrict__ counts, const int32_t* __restrict__ order, const float* __restrict__ weights,
                   const __half* __restrict__ h, float* __restrict__ y) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __half* const base = reinterpret_cast<__half*>(smem_raw);
  auto As = [&](int b) { return base + b * kDownBufHalves; };
  auto Bs = [&](int b) { return As(b) + kTcM * kLdA; };
  if (static_cast<int>(blockIdx.y) >= counts[0]) return;
  const int4 it = items[blockIdx.y];
  const Int4View& down = experts[it.x].down;
  if (!down.qweight) return;  // uniform per block
  const int s0 = it.y, cnt = it.z, warp = threadIdx.x / 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTcN;
  FragC c[2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) wmma::fill_fragment(c[mi], 0.0f);
  ARegs a;
  WRegs w;
  tc_k_loop(
      I,
      [&](int64_t k0) {
        fetch_a(h, I, s0, cnt, k0, down.perm, a);
        fetch_w(down, n0, k0, w);
      },
      [&](int b) {
        store_a(a, As(b));
        store_w(w, Bs(b));
      },
      [&](int b) { tc_mma(As(b), Bs(b), warp, c); });
  float* C = reinterpret_cast<float*>(Bs(0));
  down_epilogue(c, C, warp, cnt, s0, n0, H, order, weights, y);
}

static_assert(kTcM * kLdC * sizeof(float) <= kTcN * kLdB * sizeof(__half), "the C tile reuses a B tile's shared memory");
static_assert(kTcThreads == 32 * (kTcN / 16) && kTcM == 32, "4 warps of 16 rows, 2 fragments of 16 pairs each");

bool grouped_shape_ok(int n, int k, int E, int64_t H, int64_t I, int64_t group_size) {
  return n >= 1 && k >= 1 && E >= 1 && E <= 4096 && H % 8 == 0 && I % 8 == 0 && group_size % 8 == 0 && H % group_size == 0 &&
         I % group_size == 0;
}

// Steps 1-2: pairs sorted by expert into items of `item`, rows gathered to fp16.
void group_and_gather(const Int4Expert* experts, int E, int64_t H, const int32_t* ids, int64_t P, int k, int item, const float* x,
                      const Carve& w, cudaStream_t stream) {
  const int warps = group_pairs_warps(E);
  group_pairs_kernel<<<1, 32 * warps, (warps + 1) * E * sizeof(int32_t), stream>>>(ids, static_cast<int>(P), E, item, w.order, w.pos_of, w.counts,
                                                                             w.items);
  gather_pairs_kernel<<<static_cast<unsigned>(P), 256, 0, stream>>>(experts, ids, k, H, x, w.order, w.counts, w.xg, w.xu);
}

}  // namespace

// Group, gather, the two tensor-core kernels, combine.
cudaError_t moe_int4_grouped_tc(const Int4Expert* experts, int E, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                const float* weights, int n, int k, const float* x, void* workspace, float* out, cudaStream_t stream) {
  if (!grouped_shape_ok(n, k, E, H, I, group_size)) return cudaErrorInvalidValue;
  constexpr size_t up_smem = tc_smem_bytes(kGateUpBufHalves), down_smem = tc_smem_bytes(kDownBufHalves);
  // Past the default 48 KB: opted in once per process (a host call, not on every chunk of every layer).
  static const cudaError_t opt_in = opt_in_smem(tc_gate_up_kernel, up_smem);
  if (opt_in != cudaSuccess) return opt_in;
  static_assert(down_smem <= 48 * 1024, "the down kernel's buffers fit the default shared memory");
  const int64_t P = static_cast<int64_t>(n) * k, items = Carve::max_items(P, E, kTcM);
  const Carve w(workspace, P, H, I, E);
  group_and_gather(experts, E, H, ids, P, k, kTcM, x, w, stream);
  tc_gate_up_kernel<<<dim3(static_cast<unsigned>((I + kTcN - 1) / kTcN), static_cast<unsigned>(items)), kTcThreads, up_smem, stream>>>(
      experts, H, I, w.items, w.counts, w.xg, w.xu, w.h);
  tc_down_kernel<<<dim3(static_cast<unsigned>((H + kTcN - 1) / kTcN), static_cast<unsigned>(items)), kTcThreads, down_smem, stream>>>(
      experts, H, I, w.items, w.counts, w.order, weights, w.h, w.y);
  combine_kernel<<<static_cast<unsigned>(n), 256, k * sizeof(int32_t), stream>>>(experts, ids, k, H, w.pos_of, w.y, out);
  return cudaGetLastError();
}


}  // namespace tandem::gpu
