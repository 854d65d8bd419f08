#include "placement/replace.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace tandem::placement {

std::vector<Swap> plan_swaps(const std::vector<std::vector<uint8_t>>& on_gpu, const std::vector<std::vector<uint64_t>>& counts,
                             const ReplaceOptions& o) {
  if (on_gpu.size() != counts.size()) fail("re-placement: ", on_gpu.size(), " layers placed but ", counts.size(), " counted");
  std::vector<Swap> out;
  uint64_t tokens_k = 0;  // activations per layer in the window (= tokens x top-k), for the gain's unit
  for (const auto& row : counts) tokens_k = std::max(tokens_k, std::accumulate(row.begin(), row.end(), uint64_t(0)));
  for (size_t l = 0; l < on_gpu.size(); ++l) {
    if (on_gpu[l].size() != counts[l].size()) fail("re-placement: layer ", l, " has ", on_gpu[l].size(), " experts placed but ", counts[l].size(), " counted");
    std::vector<int> cpu, gpu;
    for (size_t e = 0; e < on_gpu[l].size(); ++e) (on_gpu[l][e] ? gpu : cpu).push_back(static_cast<int>(e));
    // Hottest CPU experts against the coldest GPU experts, pairwise, while the pair still pays.
    std::stable_sort(cpu.begin(), cpu.end(), [&](int a, int b) { return counts[l][a] > counts[l][b]; });
    std::stable_sort(gpu.begin(), gpu.end(), [&](int a, int b) { return counts[l][a] < counts[l][b]; });
    for (size_t i = 0; i < std::min(cpu.size(), gpu.size()); ++i) {
      const uint64_t hot = counts[l][cpu[i]], cold = counts[l][gpu[i]];
      if (hot < o.min_count || static_cast<double>(hot) < o.hysteresis * static_cast<double>(cold)) break;
      out.push_back({static_cast<int>(l), cpu[i], gpu[i], tokens_k ? static_cast<double>(hot - cold) / static_cast<double>(tokens_k) : 0.0});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Swap& a, const Swap& b) { return a.gain > b.gain; });
  if (static_cast<int>(out.size()) > o.max_swaps) out.resize(std::max(0, o.max_swaps));
  return out;
}

void apply_swaps(std::vector<std::vector<uint8_t>>& on_gpu, const std::vector<Swap>& swaps) {
  for (const Swap& s : swaps) {
    auto& row = on_gpu.at(static_cast<size_t>(s.layer));
    if (row.at(static_cast<size_t>(s.to_gpu)) || !row.at(static_cast<size_t>(s.to_cpu)))
      fail("re-placement: swap in layer ", s.layer, " moves expert ", s.to_gpu, " in and ", s.to_cpu, " out, but they are not on those sides");
    row[s.to_gpu] = 1;
    row[s.to_cpu] = 0;
  }
}

}  // namespace tandem::placement
