#include "runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace tandem {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) fail("temperature must be >= 0 (got ", temperature, ")");
  if (top_k < 0) fail("top-k must be >= 0 (got ", top_k, "; 0 turns it off)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("top-p must be in (0, 1] (got ", top_p, ")");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("min-p must be in [0, 1] (got ", min_p, ")");
  if (!(repetition_penalty > 0.0f)) fail("repetition penalty must be > 0 (got ", repetition_penalty, ")");
  if (!std::isfinite(presence_penalty) || !std::isfinite(frequency_penalty)) fail("penalties must be finite numbers");
}

SamplingParams sampling_preset(const std::string& name) {
  SamplingParams p;
  p.top_k = 20;
  if (name == "thinking") {
    p.temperature = 1.0f, p.top_p = 0.95f, p.presence_penalty = 1.5f;
  } else if (name == "thinking-coding") {
    p.temperature = 0.6f, p.top_p = 0.95f;
  } else if (name == "instruct") {
    p.temperature = 0.7f, p.top_p = 0.8f, p.presence_penalty = 1.5f;
  } else if (name == "instruct-reasoning") {
    p.temperature = 1.0f, p.top_p = 1.0f, p.top_k = 40, p.presence_penalty = 2.0f;
  } else {
    fail("unknown sampling preset '", name, "' (expected thinking, thinking-coding, instruct or instruct-reasoning)");
  }
  return p;
}

std::vector<std::string> sampling_preset_names() { return {"thinking", "thinking-coding", "instruct", "instruct-reasoning"}; }

GenerationDefaults load_generation_config(const std::string& model_dir) {
  GenerationDefaults d;
  const auto path = std::filesystem::path(model_dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  nlohmann::json j;
  try {
    std::ifstream in(path);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(path.string(), ": expected a JSON object");
  d.found = true;
  auto num = [&](const char* key, auto& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) fail(path.string(), ": '", key, "' must be a number (found ", j[key].dump(), ")");
    field = j[key].get<std::remove_reference_t<decltype(field)>>();
  };
  num("temperature", d.sampling.temperature);
  num("top_k", d.sampling.top_k);
  num("top_p", d.sampling.top_p);
  num("min_p", d.sampling.min_p);
  num("repetition_penalty", d.sampling.repetition_penalty);
  if (j.contains("do_sample") && j["do_sample"].is_boolean() && !j["do_sample"].get<bool>()) d.sampling.temperature = 0.0f;
  if (j.contains("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) d.eos_token_ids.push_back(e.get<int64_t>());
    else if (e.is_array())
      for (const auto& v : e)
        if (v.is_number_integer()) d.eos_token_ids.push_back(v.get<int64_t>());
  }
  try {
    d.sampling.validate();
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
  return d;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seeded ? p.seed : std::random_device{}()) { p_.validate(); }

std::vector<float> Sampler::penalised(std::span<const float> logits, std::span<const int32_t> context,
                                      std::span<const int32_t> generated) const {
  std::vector<float> l(logits.begin(), logits.end());
  const int64_t V = static_cast<int64_t>(l.size());
  if (p_.repetition_penalty != 1.0f) {
    // HF semantics: every distinct id seen in prompt or output, once.
    std::vector<int32_t> seen(context.begin(), context.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen)
      if (id >= 0 && id < V) l[id] = l[id] > 0 ? l[id] / p_.repetition_penalty : l[id] * p_.repetition_penalty;
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> count;
    for (int32_t id : generated) ++count[id];
    for (const auto& [id, n] : count)
      if (id >= 0 && id < V) l[id] -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(n);
  }
  return l;
}

std::vector<std::pair<int32_t, double>> Sampler::distribution(std::span<const float> logits,
                                                               std::span<const int32_t> context,
                                                               std::span<const int32_t> generated) const {
  const std::vector<float> l = penalised(logits, context, generated);
  const int32_t V = static_cast<int32_t>(l.size());
  std::vector<std::pair<int32_t, double>> cand;
  if (p_.temperature == 0.0f) {
    const int32_t best = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    return {{best, 1.0}};
  }
  // Candidates in decreasing logit order (ties: lower id first). Top-k bounds the sort when set.
  std::vector<int32_t> order(V);
  for (int32_t i = 0; i < V; ++i) order[i] = i;
  auto by_logit = [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; };
  const int32_t k = p_.top_k > 0 ? std::min(p_.top_k, V) : V;
  if (k < V) {
    std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
    order.resize(k);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  // Softmax at temperature T over the top-k survivors, in double.
  const double inv_t = 1.0 / p_.temperature, mx = l[order[0]];
  cand.reserve(order.size());
  double total = 0.0;
  for (int32_t id : order) {
    const double w = std::exp((l[id] - mx) * inv_t);
    cand.push_back({id, w});
    total += w;
  }
  for (auto& c : cand) c.second /= total;
  if (p_.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (at least one token).
    double cum = 0.0;
    size_t keep = 0;
    while (keep < cand.size()) {
      cum += cand[keep++].second;
      if (cum >= p_.top_p) break;
    }
    cand.resize(keep);
  }
  if (p_.min_p > 0.0f) {
    const double floor = p_.min_p * cand[0].second;
    cand.erase(std::remove_if(cand.begin() + 1, cand.end(), [&](const auto& c) { return c.second < floor; }), cand.end());
  }
  double kept = 0.0;
  for (const auto& c : cand) kept += c.second;
  for (auto& c : cand) c.second /= kept;
  return cand;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> context,
                        std::span<const int32_t> generated) {
  const auto dist = distribution(logits, context, generated);
  if (dist.size() == 1) return dist[0].first;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0.0;
  for (const auto& [id, p] : dist) {
    cum += p;
    if (u < cum) return id;
  }
  return dist.back().first;
}

}  // namespace tandem
