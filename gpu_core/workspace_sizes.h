// gpu_core/workspace_sizes.h: the scratch the kernels need from their callers, in plain C++ (no CUDA
// headers), so that the planner counts exactly what the GPU model allocates (placement/gpu_layout.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::gpu {

// Tokens one decode-kernel launch takes (the GEMVs and the decode MoE kernels: gemv.cuh, moe.cuh).
inline constexpr int kMaxGemvTokens = 8;

// cuBLAS's workspace, given to the handle so its memory is inside the caller's budget (gemm.cuh).
inline constexpr size_t kBlasWorkspaceBytes = size_t(4) << 20;

// Sampling on the device (sampling.cuh): top_k_rows for any k <= kMaxTopK, in kTopKBlocks slices, up to
// kMaxTopKRows rows a launch (its workspace: kTopKWorkspaceBytes a row), and the penalty list's entries
// (id int32, repetition and subtractive float: tandem::LogitPenalty).
inline constexpr int kMaxTopK = 64;
inline constexpr int kTopKBlocks = 64;
inline constexpr int kMaxTopKRows = 65535;  // a grid's second dimension
inline constexpr size_t kTopKWorkspaceBytes = size_t(kTopKBlocks) * kMaxTopK * 8;
inline constexpr size_t kPenaltyBytes = 12;

// A workspace's pieces one after another, each 256-byte aligned.
struct Carver {
  uint64_t off = 0;
  uint64_t take(uint64_t bytes) {
    const uint64_t at = off;
    off += (bytes + 255) / 256 * 256;
    return at;
  }
};

// moe_int4_grouped_tc's workspace for P = n * k (token, expert) pairs, its pieces 256-byte aligned in
// this order: the pairs' order and positions, two counts, the work items (expert, first pair, pairs;
// at most ceil(P / kGroupedItem) + E of them, 16 bytes each), the gathered inputs for gate and up
// (fp16 [P, H] each), h (fp16 [P, I]) and the pairs' outputs (fp32 [P, H]).
inline constexpr int kGroupedItem = 8;
struct GroupedMoeLayout {
  uint64_t order = 0, pos_of = 0, counts = 0, items = 0, xg = 0, xu = 0, h = 0, y = 0;  // byte offsets
  uint64_t bytes = 0;
};
inline int64_t grouped_moe_max_items(int64_t P, int E) { return (P + kGroupedItem - 1) / kGroupedItem + E; }
inline GroupedMoeLayout grouped_moe_layout(int64_t P, int64_t H, int64_t I, int E) {
  GroupedMoeLayout g;
  Carver c;
  const uint64_t p = static_cast<uint64_t>(P);
  g.order = c.take(p * 4);
  g.pos_of = c.take(p * 4);
  g.counts = c.take(2 * 4);
  g.items = c.take(static_cast<uint64_t>(grouped_moe_max_items(P, E)) * 16);
  g.xg = c.take(p * static_cast<uint64_t>(H) * 2);
  g.xu = c.take(p * static_cast<uint64_t>(H) * 2);
  g.h = c.take(p * static_cast<uint64_t>(I) * 2);
  g.y = c.take(p * static_cast<uint64_t>(H) * 4);
  g.bytes = c.off;
  return g;
}
inline size_t moe_int4_grouped_workspace(int64_t n, int k, int64_t H, int64_t I, int E) {
  return grouped_moe_layout(n * k, H, I, E).bytes;
}

// moe_int4_decode_wide's workspace for T tokens of k experts each: the tokens' x and the (token, expert)
// pairs' h quantised (moe_int4_wide.cu: two int8 parts an input, chunk-major, and 8 bytes of scale and
// sum a 32-input vector), and the pairs' down weights, its pieces 256-byte aligned in this order: x's
// parts [T, 2H], x's vectors [T, H / 32], h's parts [T k, 2I], h's vectors [T k, I / 32], the pairs'
// DownRefs [T k].
inline constexpr uint64_t kWideVectorBytes = 8;
// A (token, expert) pair's down weights as the gate/up launch hands them to the down launch
// (moe_int4_wide.cuh's DownRef: three pointers).
inline constexpr uint64_t kWideDownRefBytes = 24;
struct WideMoeLayout {
  uint64_t xq = 0, xs = 0, hq = 0, hs = 0, down = 0;  // byte offsets
  uint64_t bytes = 0;
};
inline WideMoeLayout wide_moe_layout(int64_t T, int k, int64_t H, int64_t I) {
  WideMoeLayout w;
  Carver c;
  const uint64_t t = static_cast<uint64_t>(T), p = t * static_cast<uint64_t>(k);
  w.xq = c.take(t * static_cast<uint64_t>(H) * 2);
  w.xs = c.take(t * static_cast<uint64_t>(H / 32) * kWideVectorBytes);
  w.hq = c.take(p * static_cast<uint64_t>(I) * 2);
  w.hs = c.take(p * static_cast<uint64_t>(I / 32) * kWideVectorBytes);
  w.down = c.take(p * kWideDownRefBytes);
  w.bytes = c.off;
  return w;
}
inline size_t moe_int4_wide_workspace(int64_t T, int k, int64_t H, int64_t I) { return wide_moe_layout(T, k, H, I).bytes; }

// Where the kernel that writes x (the router GEMV with its norm, the norm kernel: gemv.cuh, ops.cuh)
// puts it quantised for moe_int4_decode_wide (act_quant.cuh): rows of 2H bytes and of H / 32 vectors.
// parts == nullptr: not wanted.
struct QuantX {
  uint8_t* parts = nullptr;
  void* vectors = nullptr;
};
inline QuantX wide_moe_x(void* workspace, int64_t T, int k, int64_t H, int64_t I) {
  const WideMoeLayout w = wide_moe_layout(T, k, H, I);
  return {static_cast<uint8_t*>(workspace) + w.xq, static_cast<uint8_t*>(workspace) + w.xs};
}

}  // namespace tandem::gpu
