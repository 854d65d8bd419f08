// gpu_core/sampling.cuh: what a sampler needs from a logits row on the device, so that only k
// (id, logit) pairs cross to the host instead of the whole row.
//
// penalise:  logits[id] = (rep == 1 ? l : l > 0 ? l / rep : l * rep) - sub for every listed penalty,
//            each operation rounded on its own (LogitPenalty::apply's bits)
//            (ids distinct, as the host sampler's penalty list; ids outside 0..V-1 are ignored).
// top_k_rows: the k largest logits of each of `rows` rows (V apart) as (id, value) in decreasing order,
//            ties to the lower id (the host sampler's order), ids / vals [rows][k], 1 <= k <= kMaxTopK,
//            rows <= kMaxTopKRows: a top-k per slice of each row in kTopKBlocks blocks, then one block a
//            row over its candidates, two launches for all the rows. Exact (no rounding): a row's first
//            j < k results are its top j, whatever k and the other rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu_core/workspace_sizes.h"

namespace tandem::gpu {

struct Penalty {  // the layout of tandem::LogitPenalty
  int32_t id;
  float rep, sub;
};

static_assert(sizeof(Penalty) == kPenaltyBytes);
// kMaxTopK, kTopKBlocks, kMaxTopKRows and top_k_rows's workspace per row kTopKWorkspaceBytes: workspace_sizes.h.

cudaError_t penalise(float* logits, int64_t V, const Penalty* pen, int n, cudaStream_t stream);
cudaError_t top_k_rows(const float* logits, int64_t V, int rows, int k, void* workspace, int32_t* ids, float* vals, cudaStream_t stream);

}  // namespace tandem::gpu
