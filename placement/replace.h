// placement/replace.h: online re-placement — which routed experts to swap between the GPU and the CPU
// when the observed heat drifts from what the plan assumed (a long chat that changes topic, a code
// session after prose). Pure policy: the runtime counts activations, asks this, and moves the weights.
//
// Swaps keep the budget: all routed experts of a model have the same size on the GPU, so one expert
// moves in for every one that moves out, within a layer (layer-local swaps keep per-layer kernels and
// tables simple). A swap is proposed only when the CPU expert is hotter than the GPU expert by the
// hysteresis factor and by a minimum count, so noise does not make experts ping-pong; at most
// `max_swaps` per call (each swap costs one expert's PCIe copy: ~1.6 MB int4 at 25 GB/s = 66 µs).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::placement {

struct Swap {
  int layer = 0;
  int to_gpu = 0;  // expert moving in
  int to_cpu = 0;  // expert moving out
  double gain = 0; // expected activations per token moved from the CPU to the GPU
};

struct ReplaceOptions {
  double hysteresis = 1.5;   // the CPU expert must be this many times hotter than the GPU one
  uint64_t min_count = 8;    // and observed at least this often in the window
  int max_swaps = 16;        // per call
};

// on_gpu [layer][expert]: the current placement; counts [layer][expert]: activations observed in the
// window (e.g. the last few thousand tokens). Returns the swaps, largest gain first.
std::vector<Swap> plan_swaps(const std::vector<std::vector<uint8_t>>& on_gpu, const std::vector<std::vector<uint64_t>>& counts,
                             const ReplaceOptions& options = {});

// Applies swaps to a placement (the runtime does this once the weights have moved).
void apply_swaps(std::vector<std::vector<uint8_t>>& on_gpu, const std::vector<Swap>& swaps);

}  // namespace tandem::placement
