#include "runtime/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"

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
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return d;  // optional; a broken link is reported
  const std::string text = read_text_file(path.string(), 1 << 20, "the generation config");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(path.string(), ": expected a JSON object");
  d.found = true;
  auto num = [&](const char* key, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) fail(path.string(), ": '", key, "' must be a number (found ", printable(j[key].dump(), 80), ")");
    if constexpr (std::is_integral_v<T>) {
      if (!j[key].is_number_integer()) fail(path.string(), ": '", key, "' must be an integer (found ", j[key].dump(), ")");
      if (j[key].is_number_unsigned()) field = narrow<T>(j[key].get<uint64_t>(), str_cat(path.string(), ": ", key));
      else field = narrow<T>(j[key].get<int64_t>(), str_cat(path.string(), ": ", key));
    } else {
      field = j[key].get<T>();
    }
  };
  num("temperature", d.sampling.temperature);
  num("top_k", d.sampling.top_k);
  num("top_p", d.sampling.top_p);
  num("min_p", d.sampling.min_p);
  num("repetition_penalty", d.sampling.repetition_penalty);
  if (j.contains("do_sample") && j["do_sample"].is_boolean() && !j["do_sample"].get<bool>()) d.sampling.temperature = 0.0f;
  if (j.contains("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    auto id = [&](const nlohmann::json& v) -> int64_t {  // token ids are int32
      const std::string what = str_cat(path.string(), ": eos_token_id");
      return v.is_number_unsigned() ? narrow<int32_t>(v.get<uint64_t>(), what, 0) : narrow<int32_t>(v.get<int64_t>(), what, 0);
    };
    if (e.is_number_integer()) d.eos_token_ids.push_back(id(e));
    else if (e.is_array())
      for (const auto& v : e)
        if (v.is_number_integer()) d.eos_token_ids.push_back(id(v));
  }
  try {
    d.sampling.validate();
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
  return d;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seeded ? p.seed : std::random_device{}()) { p_.validate(); }

std::vector<LogitPenalty> Sampler::penalties(std::span<const int32_t> context, std::span<const int32_t> generated) const {
  // HF semantics: repetition once per distinct id seen in prompt or output; presence / frequency per
  // generated id with its count.
  std::vector<LogitPenalty> pen;
  if (p_.repetition_penalty != 1.0f)
    for (int32_t id : context) pen.push_back({id, p_.repetition_penalty, 0.0f});
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f)
    for (int32_t id : generated) pen.push_back({id, 1.0f, 0.0f});
  std::sort(pen.begin(), pen.end(), [](const LogitPenalty& a, const LogitPenalty& b) { return a.id < b.id; });
  std::vector<LogitPenalty> out;
  for (size_t i = 0; i < pen.size();) {
    LogitPenalty q{pen[i].id, 1.0f, 0.0f};
    int n_generated = 0;
    size_t j = i;
    for (; j < pen.size() && pen[j].id == q.id; ++j) {
      if (pen[j].rep != 1.0f) q.rep = pen[j].rep;
      else ++n_generated;
    }
    if (n_generated > 0) q.sub = p_.presence_penalty + p_.frequency_penalty * static_cast<float>(n_generated);
    out.push_back(q);
    i = j;
  }
  return out;
}

int Sampler::candidates_needed() const { return p_.temperature == 0.0f ? 1 : p_.top_k; }

std::vector<std::pair<int32_t, float>> Sampler::best(std::span<const float> logits, const std::vector<LogitPenalty>& pen, int64_t k) {
  const int64_t V = static_cast<int64_t>(logits.size());
  k = std::min(k, V);
  // Worse-first heap of the k best so far: (id, value); lower value worse, equal value: higher id worse.
  auto worse = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  };
  std::vector<std::pair<int32_t, float>> heap;
  heap.reserve(static_cast<size_t>(k));
  float thr = -std::numeric_limits<float>::infinity();  // the worst kept value once the heap is full
  auto offer = [&](int64_t i, float v) {
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back({static_cast<int32_t>(i), v});
      std::push_heap(heap.begin(), heap.end(), worse);
    } else if (v > thr) {  // ids arrive in increasing order: an equal value loses to the kept lower id
      std::pop_heap(heap.begin(), heap.end(), worse);
      heap.back() = {static_cast<int32_t>(i), v};
      std::push_heap(heap.begin(), heap.end(), worse);
    } else {
      return;
    }
    if (static_cast<int64_t>(heap.size()) == k) thr = heap.front().second;
  };
  // Runs of unpenalised ids in a tight threshold loop, each penalised id with its adjusted value.
  const float* l = logits.data();
  int64_t i = 0;
  for (size_t next = 0; next <= pen.size(); ++next) {
    const int64_t stop = next < pen.size() ? std::clamp<int64_t>(pen[next].id, i, V) : V;
    while (i < stop) {
      if (static_cast<int64_t>(heap.size()) < k) {
        offer(i, l[i]);
        ++i;
        continue;
      }
      const float t = thr;
      while (i < stop && !(l[i] > t)) ++i;  // the common case: nothing here beats the k-th best
      if (i < stop) {
        offer(i, l[i]);
        ++i;
      }
    }
    if (next < pen.size() && pen[next].id == i && i < V) {
      offer(i, pen[next].apply(l[i]));
      ++i;
    }
  }
  std::sort(heap.begin(), heap.end(), worse);
  return heap;
}

std::vector<std::pair<int32_t, double>> Sampler::filtered(std::span<const std::pair<int32_t, float>> top) const {
  // Softmax at temperature T over the top-k survivors, in double.
  std::vector<std::pair<int32_t, double>> cand;
  const double inv_t = 1.0 / p_.temperature, mx = top[0].second;
  cand.reserve(top.size());
  double total = 0.0;
  for (const auto& [id, l] : top) {
    const double w = std::exp((l - mx) * inv_t);
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

std::vector<std::pair<int32_t, double>> Sampler::distribution(std::span<const float> logits,
                                                               std::span<const int32_t> context,
                                                               std::span<const int32_t> generated) const {
  const std::vector<LogitPenalty> pen = penalties(context, generated);
  const int64_t V = static_cast<int64_t>(logits.size());
  if (p_.temperature == 0.0f) return {{best(logits, pen, 1)[0].first, 1.0}};
  // Candidates in decreasing logit order (ties: lower id first): the top-k in one pass when set.
  return filtered(best(logits, pen, p_.top_k > 0 ? p_.top_k : V));
}

int32_t Sampler::draw(const std::vector<std::pair<int32_t, double>>& dist) {
  if (dist.size() == 1) return dist[0].first;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0.0;
  for (const auto& [id, p] : dist) {
    cum += p;
    if (u < cum) return id;
  }
  return dist.back().first;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> context,
                        std::span<const int32_t> generated) {
  return draw(distribution(logits, context, generated));
}

std::span<const std::pair<int32_t, float>> Sampler::needed(std::span<const std::pair<int32_t, float>> top) const {
  const int need = candidates_needed();
  if (need < 1 || static_cast<int>(top.size()) < need)
    fail("sampling: ", top.size(), " candidates given, the draw needs the best ", need);
  return top.first(static_cast<size_t>(need));
}

int32_t Sampler::sample_top(std::span<const std::pair<int32_t, float>> top) {
  const auto best = needed(top);
  return p_.temperature == 0.0f ? best[0].first : draw(filtered(best));
}

std::vector<std::pair<int32_t, double>> Sampler::distribution_top(std::span<const std::pair<int32_t, float>> top) const { return filtered(needed(top)); }

std::pair<bool, int32_t> Sampler::verify_draft(const Dist& p, const Dist& q, int32_t d) {
  auto prob = [](const Dist& dist, int32_t id) {
    for (const auto& [i, v] : dist)
      if (i == id) return v;
    return 0.0;
  };
  const double pd = prob(p, d), qd = prob(q, d);
  if (qd <= 0) fail("verify_draft: the draft token ", d, " has no probability under the draft distribution");
  if (pd >= qd || std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < pd / qd) return {true, d};
  std::unordered_map<int32_t, double> qm(q.begin(), q.end());
  Dist residual;
  double total = 0;
  for (const auto& [id, v] : p) {
    const auto it = qm.find(id);
    if (const double r = v - (it == qm.end() ? 0.0 : it->second); r > 0) residual.push_back({id, r}), total += r;
  }
  if (total <= 0) return {false, draw(p)};
  for (auto& r : residual) r.second /= total;
  return {false, draw(residual)};
}

}  // namespace tandem
