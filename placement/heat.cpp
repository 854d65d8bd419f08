#include "placement/heat.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace tandem::placement {

double HeatMap::share(int layer, int expert) const {
  const auto& c = counts[static_cast<size_t>(layer)];
  const uint64_t total = std::accumulate(c.begin(), c.end(), uint64_t(0));
  if (total == 0) return 1.0 / static_cast<double>(c.size());
  return static_cast<double>(c[static_cast<size_t>(expert)]) / static_cast<double>(total);
}

void HeatMap::check_shape(int layers, int experts) const {
  if (static_cast<int>(counts.size()) != layers || num_experts != experts)
    fail(source, ": the heat map has ", counts.size(), " layers x ", num_experts, " experts but the model has ", layers,
         " x ", experts, " (profile this model again with tandem profile)");
}

HeatMap parse_heat_map(const std::string& text, const std::string& source) {
  HeatMap h;
  h.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(source, ":", e.mark.line + 1, ": not valid YAML: ", e.msg);
  }
  auto at = [&](const YAML::Node& n) { return str_cat(source, ":", n.Mark().line + 1); };
  if (!root.IsMap() || !root["layers"] || !root["num_experts"])
    fail(source, ": not a heat map (needs 'num_experts' and 'layers'; write one with tandem profile)");
  try {
    h.model = root["model"] ? root["model"].as<std::string>() : "";
    h.tokens = root["tokens"] ? root["tokens"].as<int64_t>() : 0;
    h.top_k = root["top_k"] ? root["top_k"].as<int>() : 0;
    h.num_experts = root["num_experts"].as<int>();
    if (h.num_experts < 1) fail(at(root["num_experts"]), ": key 'num_experts' must be positive");
    const YAML::Node layers = root["layers"];
    if (!layers.IsSequence()) fail(at(layers), ": key 'layers' must be a list with one list of counts per layer");
    for (size_t l = 0; l < layers.size(); ++l) {
      const YAML::Node row = layers[l];
      if (!row.IsSequence() || static_cast<int>(row.size()) != h.num_experts)
        fail(at(row), ": key 'layers[", l, "]' must list ", h.num_experts, " counts (found ", row.IsSequence() ? row.size() : 0, ")");
      std::vector<uint64_t> c(row.size());
      for (size_t e = 0; e < row.size(); ++e) {
        const int64_t v = row[e].as<int64_t>();
        if (v < 0) fail(at(row[e]), ": key 'layers[", l, "][", e, "]' is negative");
        c[e] = static_cast<uint64_t>(v);
      }
      h.counts.push_back(std::move(c));
    }
  } catch (const YAML::Exception& e) {
    fail(source, ":", e.mark.line + 1, ": ", e.msg, " (expected integers)");
  }
  return h;
}

RoutingShares shares_from_counts(std::vector<double> counts) {
  std::sort(counts.begin(), counts.end(), std::greater<>());
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  const double E = static_cast<double>(counts.size());
  auto share = [&](double q) {
    const double n = q * E;  // fractional number of experts
    double s = 0;
    size_t i = 0;
    for (; i + 1 <= n; ++i) s += counts[i];
    if (i < counts.size()) s += (n - static_cast<double>(i)) * counts[i];
    return total > 0 ? s / total : 0.0;
  };
  return {share(0.1), share(0.2), share(0.5)};
}

HeatMap heat_from_counts(const RoutingCounts& counts, const ModelConfig& config, const std::string& model_dir) {
  HeatMap h;
  h.model = model_dir;
  h.tokens = counts.tokens;
  h.top_k = config.num_experts_per_tok;
  h.num_experts = config.num_experts;
  h.counts = counts.counts;
  return h;
}

HeatMap load_heat_map(const std::string& path) {
  // A 512-expert, 60-layer map is well under 1 MB.
  return parse_heat_map(read_text_file(path, 64 << 20, "the heat map (experts.heat; write one with tandem profile)"), path);
}

void save_heat_map(const HeatMap& h, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot write the heat map");
  f << "# tandem profile: routed-expert activation counts per layer (the planner's experts.heat)\n";
  f << "model: \"" << h.model << "\"\ntokens: " << h.tokens << "\ntop_k: " << h.top_k << "\nnum_experts: " << h.num_experts
    << "\nlayers:\n";
  for (const auto& row : h.counts) {
    f << "  - [";
    for (size_t e = 0; e < row.size(); ++e) f << (e ? ", " : "") << row[e];
    f << "]\n";
  }
  if (!f) fail(path, ": write failed");
}

}  // namespace tandem::placement
