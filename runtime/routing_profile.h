// runtime/routing_profile.h: which routed experts real text activates, per layer (the input of the
// planner's heat maps: `tandem profile`, tandem.profile()).
//
// Each prompt is prefilled on a host placement (backend nullptr: the exact reference; else e.g.
// CpuBackend) and, with gen > 0, that many greedy tokens are decoded after it; every token's top-k
// choice in every layer is counted (from the model's "moe_topk_ids" tap).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/models/qwen3_5_moe.h"

namespace tandem {

struct RoutingCounts {
  int64_t tokens = 0;                          // tokens routed (each picks top-k experts per layer)
  std::vector<std::vector<uint64_t>> counts;   // [layer][expert]
};

RoutingCounts profile_routing(const Qwen35Moe& model, MatmulBackend* backend, const std::vector<std::vector<int32_t>>& prompts,
                              int64_t gen, const std::function<void(size_t prompts_done, int64_t tokens)>& progress = {});

// Mean over layers of the share of activations the hottest 20% of experts take (uniform routing: 0.2).
double top20_share(const RoutingCounts& c);

}  // namespace tandem
