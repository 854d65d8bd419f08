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

// Sampling on the device (sampling.cuh): top_k_row for any k <= kMaxTopK, in kTopKBlocks slices, and
// the penalty list's entries (id int32, repetition and subtractive float: tandem::LogitPenalty).
inline constexpr int kMaxTopK = 64;
inline constexpr int kTopKBlocks = 64;
inline constexpr size_t kTopKWorkspaceBytes = size_t(kTopKBlocks) * kMaxTopK * 8;
inline constexpr size_t kPenaltyBytes = 12;

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
  uint64_t off = 0;
  auto take = [&](uint64_t& at, uint64_t b) {
    at = off;
    off += (b + 255) / 256 * 256;
  };
  const uint64_t p = static_cast<uint64_t>(P);
  take(g.order, p * 4);
  take(g.pos_of, p * 4);
  take(g.counts, 2 * 4);
  take(g.items, static_cast<uint64_t>(grouped_moe_max_items(P, E)) * 16);
  take(g.xg, p * static_cast<uint64_t>(H) * 2);
  take(g.xu, p * static_cast<uint64_t>(H) * 2);
  take(g.h, p * static_cast<uint64_t>(I) * 2);
  take(g.y, p * static_cast<uint64_t>(H) * 4);
  g.bytes = off;
  return g;
}
inline size_t moe_int4_grouped_workspace(int64_t n, int k, int64_t H, int64_t I, int E) {
  return grouped_moe_layout(n * k, H, I, E).bytes;
}

}  // namespace tandem::gpu
