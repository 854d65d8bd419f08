// gpu_core/deltanet.cuh: Gated DeltaNet decode step (one token) on the GPU, fp32 state.
//
// Inputs are this token's projections (fp32): qkv [conv_dim = 2*Hk*dk + Hv*dv] (q | k | v, plain
// contiguous heads), z [Hv*dv], b [Hv], a [Hv]. Three launches:
//  1. causal depthwise conv + SiLU over all conv_dim channels, shifting conv_state
//     ([kernel-1][conv_dim], oldest first) and writing conv_out [conv_dim];
//  2. one block per (value head h, slice of its state columns: 4 slices where dv allows) (q/k head
//     h / (Hv/Hk)): L2-normalise q (and scale by dk^-0.5) and k, beta = sigmoid(b),
//     g = -exp(A_log) * softplus(a + dt_bias);
//     S <- e^g S; delta = beta (v - S^T k); S += k delta^T; o = S^T q (read after the write);
//  3. out = gated RMSNorm(o, z) with norm_w, a block per (token, value head).
// The state S [Hv][dk][dv] is read and written once per step, each thread keeping its slice in
// registers. Limits: dk <= 128, dv <= 128, kernel <= 8. Same arithmetic as runtime/ops_ref (fp32).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_core/deltanet_sizes.h"

namespace tandem::gpu {

struct DeltaNetDecodeArgs {
  const float* qkv = nullptr;
  const float* z = nullptr;
  const float* b = nullptr;
  const float* a = nullptr;
  const float* conv_w = nullptr;  // [conv_dim][kernel]
  float* conv_state = nullptr;    // [kernel-1][conv_dim]
  float* conv_out = nullptr;      // scratch [conv_dim]
  const float* A_log = nullptr;   // [Hv]
  const float* dt_bias = nullptr; // [Hv]
  const float* norm_w = nullptr;  // [dv]
  float* state = nullptr;         // [Hv][dk][dv]
  float* out = nullptr;           // [Hv*dv]
  int Hk = 0, Hv = 0, dk = 0, dv = 0, kernel = 4;
  float eps = 1e-6f;
  // Prefill only (required there): deltanet_chunk_terms_floats(T, Hv) floats of
  // scratch for the terms of every chunk that do not depend on the state (cumulative decays, the WY
  // inverse (I + A)^-1 of the chunk's forward substitution, the q.k products), computed for all
  // chunks in parallel first; the sequential step is then three small matrix products on the state.
  float* chunk_terms = nullptr;
  // Chunked prefill's sequential step: chunk buffers in shared memory. 2: the next chunk's inputs are
  // copied while this one computes (110 KB a block at dk 128: sm_80 / sm_90); 1: copied between
  // chunks (67 KB: what an RTX 3090 / 4090 allows, 99 KB); 0: 2 where the device allows it, else 1.
  int wy_buffers = 0;
  // Decode of several sequences at once (deltanet_decode): `tokens` token rows of the activations in
  // `groups`, group g the tokens first[g] .. first[g + 1] - 1 (in order) of the sequence whose conv
  // window and state start slot[g] * conv_stride / state_stride floats after conv_state / state
  // (device arrays, so a captured step takes new slots each replay). slot nullptr: one group of all
  // the tokens at conv_state / state.
  int tokens = 1, groups = 1;
  const int32_t* slot = nullptr;   // [groups]
  const int32_t* first = nullptr;  // [groups + 1]
  int64_t conv_stride = 0, state_stride = 0;
  // With one group: the conv window and state before the step (copy 0) and after each token t (copy
  // t + 1), conv_stride / state_stride floats apart, for a verification step to roll back to. nullptr: none.
  float* kept_conv = nullptr;
  float* kept_state = nullptr;
};

// args.tokens tokens in args.groups sequences (above): each group's tokens in order on its own state,
// the groups in parallel; the same arithmetic per token as one token at a time.
cudaError_t deltanet_decode(const DeltaNetDecodeArgs& args, cudaStream_t stream);

// The same over T consecutive tokens (prefill): qkv [T][conv_dim], z [T][Hv*dv], b and a [T][Hv],
// conv_out scratch [T][conv_dim], out [T][Hv*dv]; the states advance by T tokens. The conv, the q/k
// norms and the gated output norm run over all tokens in parallel; the recurrence in its chunked form
// (ref::delta_rule_chunk): the state-free terms of all chunks of 32 tokens first, in parallel
// (args.chunk_terms, required), then the sequential step, one block per (value head, 32 state
// columns), as register-tiled products (D = T' (V - e^G K S0)): T / 32 sequential steps instead of T.
// Equal to T decode steps up to fp32 rounding. dk <= 128; opts in to more than 48 KB of shared memory
// a block (sm_80+; args.wy_buffers). At the 35B shape on the H200: 2.05 ms for 4096 tokens a layer.
cudaError_t deltanet_prefill_chunked(const DeltaNetDecodeArgs& args, int T, cudaStream_t stream);

}  // namespace tandem::gpu
