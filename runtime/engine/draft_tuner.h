// runtime/engine/draft_tuner.h: --draft auto, how many drafts each step verifies.
//
// A step with k drafts commits E(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j tokens on average, a_j the
// acceptance at draft position j measured so far (with a prior of 0.6 worth 8 drafts until measured),
// and takes t(k), the measured time of a step of one sequence with k drafts (the drafts, the
// verification, the rollback: the median of the last kWindow such steps, the first step of each k
// left out as it captures graphs). The tuner picks the k with the most tokens per second E(k) / t(k): every k from 0
// (plain decode) to the runner's maximum is timed kWarm times first; afterwards the best, with a
// neighbour re-timed every kExplore steps so that the choice follows the text. Once the first draft's
// acceptance (kHopelessDrafts of them) says no count can beat plain steps even if every later draft
// were accepted as often (random weights, or a verification too costly for the text), the warm-up
// stops and drafts are re-tried only every 8 kExplore steps. Steps of several sequences are not timed
// (their time is shared); they take the current choice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

class DraftTuner {
 public:
  static constexpr int kWarm = 3, kExplore = 32, kHopelessDrafts = 8;
  static constexpr int kWindow = 9;
  static constexpr double kPrior = 0.6, kPriorWeight = 8;

  explicit DraftTuner(int max_draft);
  int max_draft() const { return max_; }
  // Drafts for the next step (0: a plain step).
  int choose();
  // A step of one sequence with k drafts (0: plain) of which `accepted` were kept, taking `seconds`.
  void record(int k, int accepted, double seconds);
  double acceptance(int position) const;  // a_j (0-based position), prior included
  double expected_tokens(int k) const;    // E(k)
  double step_seconds(int k) const;       // t(k); 0 while not timed
  int best() const;                       // argmax E(k) / t(k) over the timed k (0 when none is)
  bool hopeless() const;                  // no k can beat plain steps (see the header comment)
  // "auto: step ms by drafts 2.80 / 3.10 / 3.30 / 3.60 / 3.90; 3 drafts (2.41 tokens a step, 1.83x plain)"
  std::string summary() const;

 private:
  int max_;
  std::vector<double> time_;                 // the median of recent_
  std::vector<std::vector<double>> recent_;  // per k: the last kWindow step times
  std::vector<int> samples_;  // steps recorded per k (the first not averaged)
  std::vector<int64_t> drafted_, accepted_;
  int64_t steps_ = 0;
};

}  // namespace tandem
