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

#include "runtime/routing_profile.h"

namespace tandem::placement {

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

// The heat map of profiled counts (runtime/routing_profile.h) for the model at model_dir.
HeatMap heat_from_counts(const RoutingCounts& counts, const ModelConfig& config, const std::string& model_dir);

HeatMap load_heat_map(const std::string& path);
HeatMap parse_heat_map(const std::string& yaml_text, const std::string& source);
void save_heat_map(const HeatMap& heat, const std::string& path);

}  // namespace tandem::placement
