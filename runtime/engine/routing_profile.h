// runtime/engine/routing_profile.h: which routed experts real text activates, per layer (the input of the
// planner's heat maps: `tandem profile`, tandem.profile()).
//
// Each prompt is prefilled on a host placement (backend nullptr: the exact reference; else e.g.
// CpuBackend) and, with gen > 0, that many greedy tokens are decoded after it; every token's top-k
// choice in every layer is counted (from the model's "moe_topk_ids" tap).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/tokenizer/tokenizer.h"
#include "placement/heat.h"

namespace tandem {

using placement::RoutingCounts;

RoutingCounts profile_routing(const Qwen35Moe& model, MatmulBackend* backend, const std::vector<std::vector<int32_t>>& prompts,
                              int64_t gen, const std::function<void(size_t prompts_done, int64_t tokens)>& progress = {});

struct ProfileOptions {
  std::string device = "cpu";  // cpu (fast kernels) | ref (the exact reference)
  int threads = 0;             // cpu: worker threads (0: physical cores)
  int64_t gen = 0;             // greedy tokens decoded after each prompt
  int64_t max_tokens = 2048;   // each prompt truncated to this many tokens
  bool chat = false;           // wrap each prompt in the chat template as a user message
};

// Text prompts -> counts: tokenizes (chat template when asked), truncates, and runs them on the chosen
// host placement. Throws tandem::Error on bad options or no prompts. (`tandem profile`, tandem.profile())
RoutingCounts profile_prompts(const Qwen35Moe& model, const Tokenizer& tokenizer, const std::vector<std::string>& prompts,
                              const ProfileOptions& options,
                              const std::function<void(size_t prompts_done, int64_t tokens)>& progress = {});

// Mean over layers of the share of activations the hottest 20% of experts take (uniform routing: 0.2).
double top20_share(const RoutingCounts& c);
// Share of all layers' activations an early guess caught: RoutingCounts::early_hits, early_hits_2k
// or early_hits_host; 0 without tokens. early_hit_shares: the same per layer.
double early_hit_share(const RoutingCounts& c, const std::vector<uint64_t> RoutingCounts::*which);
std::vector<double> early_hit_shares(const RoutingCounts& c, const std::vector<uint64_t> RoutingCounts::*which);

}  // namespace tandem
