// runtime/engine/expert_swap.h: online re-placement as the runtime sees it (hybrid decode). The runtime counts
// each layer's routed activations as the host side sees them and, every `every` decode tokens, asks
// `policy` (placement::plan_swaps, from the placement YAML's experts.replace) which experts to swap
// between the GPU and the host; it moves the weights without stalling decode (the outgoing expert is
// served by the host from the next step on, the incoming one is repacked on a worker thread and copied
// into the freed GPU slot on a copy stream, and served by the GPU once it has arrived).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace tandem {

struct ExpertSwap {
  int layer = 0;
  int to_gpu = 0;  // host expert moving to the GPU
  int to_cpu = 0;  // GPU expert whose slot it takes (served by the host from then on)
};

struct ReplaceSetup {
  int64_t every = 0;    // decode tokens between checks; 0: the placement stays as planned
  double decay = 0.5;   // the counts are multiplied by this after each check (a sliding window)
  int max_moving = 16;  // experts in flight at once (pinned staging for as many)
  std::function<std::vector<ExpertSwap>(const std::vector<std::vector<uint8_t>>& on_gpu,
                                        const std::vector<std::vector<uint64_t>>& counts)>
      policy;
  bool on() const { return every > 0 && policy != nullptr; }
};

}  // namespace tandem
