// gpu_core/moe_int4_grouped.cu: routed experts of a prefill chunk, grouped by expert (see moe.cuh).
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;
constexpr int kWarpsPerBlock = 8;
constexpr int kItem = kMaxGemvTokens;  // pairs per work item

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// The workspace, carved in this order (each piece 256-byte aligned).
struct Carve {
  int32_t *order, *pos_of, *counts;  // counts: [0] work items, [1] valid pairs
  int4* items;                        // (expert, first sorted pair, pairs, 0)
  __half *xg, *xu, *h;
  float* y;
  size_t bytes;
  Carve(void* base, int64_t P, int64_t H, int64_t I, int E) {
    char* p = static_cast<char*>(base);
    size_t off = 0;
    auto take = [&](size_t b) {
      char* r = p ? p + off : nullptr;
      off += align256(b);
      return r;
    };
    order = reinterpret_cast<int32_t*>(take(P * 4));
    pos_of = reinterpret_cast<int32_t*>(take(P * 4));
    counts = reinterpret_cast<int32_t*>(take(2 * 4));
    items = reinterpret_cast<int4*>(take(max_items(P, E) * sizeof(int4)));
    xg = reinterpret_cast<__half*>(take(P * H * 2));
    xu = reinterpret_cast<__half*>(take(P * H * 2));
    h = reinterpret_cast<__half*>(take(P * I * 2));
    y = reinterpret_cast<float*>(take(P * H * 4));
    bytes = off;
  }
  static int64_t max_items(int64_t P, int E) { return (P + kItem - 1) / kItem + E; }  // sum of ceil(c_e / 8)
};

// One block: count pairs per expert, lay out the work items, then a stable scatter (a thread per expert).
__global__ void group_pairs_kernel(const int32_t* __restrict__ ids, int P, int E, int32_t* order, int32_t* pos_of,
                                   int32_t* counts, int4* items) {
  extern __shared__ int32_t sm[];  // cnt[E], start[E]
  int32_t *cnt = sm, *start = sm + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  for (int p = threadIdx.x; p < P; p += blockDim.x) pos_of[p] = -1;
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0, it = 0;
    for (int e = 0; e < E; ++e) {
      start[e] = s;
      for (int c0 = 0; c0 < cnt[e]; c0 += kItem) items[it++] = make_int4(e, s + c0, min(kItem, cnt[e] - c0), 0);
      s += cnt[e];
    }
    counts[0] = it;
    counts[1] = s;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int s = start[e];
    if (cnt[e] == 0) continue;
    for (int p = 0; p < P; ++p)
      if (ids[p] == e) {
        order[s] = p;
        pos_of[p] = s++;
      }
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


template <int LANES>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    grouped_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int4* __restrict__ items,
                           const int32_t* __restrict__ counts, const __half* __restrict__ xg, const __half* __restrict__ xu,
                           __half* __restrict__ h) {
  if (static_cast<int>(blockIdx.y) >= counts[0]) return;
  const int4 it = items[blockIdx.y];
  const Int4Expert& ex = experts[it.x];
  if (!ex.gate.qweight) return;  // uniform per block
  const int l = (threadIdx.x & 31) % LANES, s0 = it.y, c = it.z;
  const int64_t row = row_of_thread<LANES, kWarpsPerBlock>();
  const bool valid = row < I;
  float g[kItem] = {}, u[kItem] = {};
  if (valid) {
    int4_row_dot<kItem, LANES>(ex.gate, row, l, xg + s0 * H, H, c, g);
    int4_row_dot<kItem, LANES>(ex.up, row, l, xu + s0 * H, H, c, u);
  }
#pragma unroll
  for (int t = 0; t < kItem; ++t) {
    const float gs = group_sum<LANES>(g[t]), us = group_sum<LANES>(u[t]);
    if (valid && l == 0 && t < c) h[(s0 + t) * I + row] = __float2half_rn(gs / (1.0f + __expf(-gs)) * us);
  }
}

template <int LANES>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    grouped_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int4* __restrict__ items,
                        const int32_t* __restrict__ counts, const int32_t* __restrict__ order, const float* __restrict__ weights,
                        const __half* __restrict__ h, float* __restrict__ y) {
  extern __shared__ __align__(16) __half hs[];  // act-order only: [kItem][I] permuted copies of h
  if (static_cast<int>(blockIdx.y) >= counts[0]) return;
  const int4 it = items[blockIdx.y];
  const Int4View& down = experts[it.x].down;
  if (!down.qweight) return;  // uniform per block
  const int l = (threadIdx.x & 31) % LANES, s0 = it.y, c = it.z;
  const __half* hp = h + s0 * I;
  if (down.perm) {
    for (int64_t i = threadIdx.x; i < c * I; i += blockDim.x) hs[i] = hp[(i / I) * I + down.perm[i % I]];
    __syncthreads();
    hp = hs;
  }
  const int64_t row = row_of_thread<LANES, kWarpsPerBlock>();
  const bool valid = row < H;
  float a[kItem] = {};
  if (valid) int4_row_dot<kItem, LANES>(down, row, l, hp, I, c, a);
#pragma unroll
  for (int t = 0; t < kItem; ++t) {
    const float v = group_sum<LANES>(a[t]);
    if (valid && l == 0 && t < c) y[(s0 + t) * H + row] = weights[order[s0 + t]] * v;
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

template <int LANES>
void launch_gate_up(const Int4Expert* e, int64_t H, int64_t I, const Carve& w, int64_t items, cudaStream_t s) {
  const int64_t rows = kWarpsPerBlock * (32 / LANES);
  const dim3 grid(static_cast<unsigned>((I + rows - 1) / rows), static_cast<unsigned>(items));
  grouped_gate_up_kernel<LANES><<<grid, kWarpsPerBlock * 32, 0, s>>>(e, H, I, w.items, w.counts, w.xg, w.xu, w.h);
}

template <int LANES>
void launch_down(const Int4Expert* e, int64_t H, int64_t I, const Carve& w, int64_t items, const float* weights, cudaStream_t s) {
  const int64_t rows = kWarpsPerBlock * (32 / LANES);
  const dim3 grid(static_cast<unsigned>((H + rows - 1) / rows), static_cast<unsigned>(items));
  grouped_down_kernel<LANES><<<grid, kWarpsPerBlock * 32, kItem * I * sizeof(__half), s>>>(e, H, I, w.items, w.counts, w.order,
                                                                                            weights, w.h, w.y);
}

}  // namespace

size_t moe_int4_grouped_workspace(int64_t n, int k, int64_t H, int64_t I, int E) { return Carve(nullptr, n * k, H, I, E).bytes; }

cudaError_t moe_int4_grouped(const Int4Expert* experts, int E, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                             const float* weights, int n, int k, const float* x, void* workspace, float* out, cudaStream_t stream) {
  if (n < 1 || k < 1 || E < 1 || E > 4096 || H % 8 || I % 8 || group_size % 8 || H % group_size || I % group_size ||
      kItem * I * 2 > 48 * 1024)
    return cudaErrorInvalidValue;
  const int64_t P = static_cast<int64_t>(n) * k, items = Carve::max_items(P, E);
  const Carve w(workspace, P, H, I, E);
  group_pairs_kernel<<<1, 1024, 2 * E * sizeof(int32_t), stream>>>(ids, static_cast<int>(P), E, w.order, w.pos_of, w.counts, w.items);
  gather_pairs_kernel<<<static_cast<unsigned>(P), 256, 0, stream>>>(experts, ids, k, H, x, w.order, w.counts, w.xg, w.xu);
  switch (lanes_for(H)) {
    case 32: launch_gate_up<32>(experts, H, I, w, items, stream); break;
    case 16: launch_gate_up<16>(experts, H, I, w, items, stream); break;
    default: launch_gate_up<8>(experts, H, I, w, items, stream);
  }
  switch (lanes_for(I)) {
    case 32: launch_down<32>(experts, H, I, w, items, weights, stream); break;
    case 16: launch_down<16>(experts, H, I, w, items, weights, stream); break;
    default: launch_down<8>(experts, H, I, w, items, weights, stream);
  }
  combine_kernel<<<static_cast<unsigned>(n), 256, k * sizeof(int32_t), stream>>>(experts, ids, k, H, w.pos_of, w.y, out);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
