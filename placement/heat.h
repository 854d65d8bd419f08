// placement/heat.h: per-layer, per-expert activation counts (`tandem profile`), the planner's input
// for "which routed experts are hot".
//
// File format (YAML, written by tandem profile):
//   # tandem profile: routed-expert activations
//   model: /path/to/model
//   tokens: 12345          # tokens routed (each picks top_k experts per layer)
//   top_k: 8
//   num_experts: 256
//   layers:                # one list of num_experts counts per layer, layer 0 first
//     - [12, 0, 7, ...]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/format/config.h"

namespace tandem::placement {

// Which routed experts real text activates, per layer: what `tandem profile` counts
// (runtime/engine/routing_profile.h) and a heat map stores.
struct RoutingCounts {
  int64_t tokens = 0;                          // tokens routed (each picks top-k experts per layer)
  std::vector<std::vector<uint64_t>> counts;   // [layer][expert]
  // How well a layer's router applied to the layer's *input* (the residual before its mixer, with the
  // post-attention norm) foresees the experts it picks after the mixer: of the tokens x top-k
  // activations of layer l, early_hits[l] were among that early guess's top-k and early_hits_2k[l]
  // among its top-2k. What reading predicted experts' weights while the mixer runs would catch.
  std::vector<uint64_t> early_hits, early_hits_2k;
  // The same guess from what the host of a hybrid step knows after layer l-1 (the residual before that
  // layer's MoE plus its routed experts' sum, without the shared expert's output).
  std::vector<uint64_t> early_hits_host;
};

// Share of a layer's activations its hottest 10%, 20% and 50% of experts take (a fractional expert
// counted in part): how skewed its routing is (uniform: 0.1, 0.2, 0.5).
struct RoutingShares {
  double top10 = 0, top20 = 0, top50 = 0;
};
RoutingShares shares_from_counts(std::vector<double> counts);

struct HeatMap {
  std::string source;
  std::string model;
  int64_t tokens = 0;
  int top_k = 0;
  int num_experts = 0;
  std::vector<std::vector<uint64_t>> counts;  // [layer][expert]

  // Share of the layer's activations that expert e takes (counts / sum); uniform for a layer without counts.
  double share(int layer, int expert) const;
  // Throws tandem::Error unless the map has `layers` layers of `experts` experts.
  void check_shape(int layers, int experts) const;
};

// The heat map of profiled counts for the model at model_dir.
HeatMap heat_from_counts(const RoutingCounts& counts, const ModelConfig& config, const std::string& model_dir);

HeatMap load_heat_map(const std::string& path);
HeatMap parse_heat_map(const std::string& yaml_text, const std::string& source);
void save_heat_map(const HeatMap& heat, const std::string& path);

}  // namespace tandem::placement
