// runtime/engine/sampling.h: turning a row of logits into the next token id.
//
// Pipeline, in the order HF transformers applies its processors: repetition penalty (prompt + output
// tokens), presence / frequency penalties (output tokens, OpenAI semantics), temperature, top-k, top-p,
// min-p, then a draw from the renormalised distribution with a seeded RNG. temperature == 0 is greedy
// (argmax, lowest id on ties) and ignores the filters. Presets are the model card's (spec §5);
// generation_config.json supplies defaults. Single-threaded; one Sampler per sequence.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // 1: off
  uint64_t seed = 0;
  bool seeded = false;  // false: seed from std::random_device

  void validate() const;  // throws tandem::Error naming the parameter
};

// The model card's presets: "thinking", "thinking-coding", "instruct", "instruct-reasoning".
SamplingParams sampling_preset(const std::string& name);
std::vector<std::string> sampling_preset_names();

// Defaults from a model folder's generation_config.json (temperature, top_k, top_p, min_p,
// repetition_penalty; do_sample=false means greedy). Missing file: the built-in defaults.
struct GenerationDefaults {
  SamplingParams sampling;
  std::vector<int64_t> eos_token_ids;
  bool found = false;
};
GenerationDefaults load_generation_config(const std::string& model_dir);

// One token's penalty: its logit l becomes (rep == 1 ? l : l > 0 ? l / rep : l * rep) - sub.
struct LogitPenalty {
  int32_t id = 0;
  float rep = 1.0f;  // repetition penalty (the id is in the context)
  float sub = 0.0f;  // presence + frequency * count (the id was generated)
  float apply(float l) const { return (rep == 1.0f ? l : l > 0 ? l / rep : l * rep) - sub; }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);

  // Picks the next id from logits[vocab]. `context` is the prompt + generated ids (repetition
  // penalty); `generated` only the generated ones (presence / frequency penalties).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> context, std::span<const int32_t> generated);

  // The filtered, renormalised distribution sample() draws from, as (id, probability) pairs in
  // decreasing probability order: exposed for tests.
  std::vector<std::pair<int32_t, double>> distribution(std::span<const float> logits, std::span<const int32_t> context,
                                                       std::span<const int32_t> generated) const;

  // For samplers that select on another device: the penalties as a list sorted by id (every distinct
  // id of the context and the generated ids), and how many of the best penalised logits the draw needs
  // (1 when greedy, top_k when set; 0: the whole row).
  std::vector<LogitPenalty> penalties(std::span<const int32_t> context, std::span<const int32_t> generated) const;
  int candidates_needed() const;
  // Whether penalties() can name any id (a repetition, presence or frequency penalty is set).
  bool penalised() const { return p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f; }
  // sample() from the best candidates_needed() penalised logits, given as (id, logit) in decreasing
  // logit order (ties: lower id first): the same draw as sample() on the whole row.
  int32_t sample_top(std::span<const std::pair<int32_t, float>> top);
  // distribution() from the same candidates (sampling only: greedy needs no distribution).
  std::vector<std::pair<int32_t, double>> distribution_top(std::span<const std::pair<int32_t, float>> top) const;

  // Speculative decoding. A distribution as distribution() gives it: (id, probability), decreasing.
  using Dist = std::vector<std::pair<int32_t, double>>;
  bool greedy() const { return p_.temperature == 0.0f; }
  // A draw from `dist` with this sampler's generator (a draft token from the draft model's q).
  int32_t draw_from(const Dist& dist) { return draw(dist); }
  // The speculative-sampling rule (Leviathan et al. 2023, Chen et al. 2023): a draft `d` drawn from q
  // is accepted with probability min(1, p(d) / q(d)); otherwise the token is drawn from
  // max(0, p - q) renormalised (from p when that is empty). Either way the token's distribution is
  // exactly p. Returns (accepted, token).
  std::pair<bool, int32_t> verify_draft(const Dist& p, const Dist& q, int32_t d);

 private:
  // The k best (id, penalised logit) pairs of a whole row, decreasing (ties: lower id first); one pass.
  static std::vector<std::pair<int32_t, float>> best(std::span<const float> logits, const std::vector<LogitPenalty>& pen, int64_t k);
  // The first candidates_needed() of `top` (tandem::Error when it has fewer).
  std::span<const std::pair<int32_t, float>> needed(std::span<const std::pair<int32_t, float>> top) const;
  // Temperature softmax over sorted candidates (already cut to top-k), then top-p and min-p.
  std::vector<std::pair<int32_t, double>> filtered(std::span<const std::pair<int32_t, float>> top) const;
  int32_t draw(const std::vector<std::pair<int32_t, double>>& dist);
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace tandem
