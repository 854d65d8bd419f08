#include "runtime/engine/draft_tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace tandem {

DraftTuner::DraftTuner(int max_draft)
    : max_(max_draft), time_(static_cast<size_t>(max_draft) + 1, 0), recent_(time_.size()), samples_(time_.size(), 0), drafted_(static_cast<size_t>(max_draft), 0),
      accepted_(drafted_.size(), 0) {
  if (max_draft < 1) fail("--draft auto: the runner drafts no tokens");
}

double DraftTuner::acceptance(int j) const {
  return (static_cast<double>(accepted_[j]) + kPrior * kPriorWeight) / (static_cast<double>(drafted_[j]) + kPriorWeight);
}

double DraftTuner::expected_tokens(int k) const {
  double e = 1, p = 1;
  for (int j = 0; j < k; ++j) e += (p *= acceptance(j));
  return e;
}

double DraftTuner::step_seconds(int k) const { return samples_[k] > 1 ? time_[k] : 0; }

int DraftTuner::best() const {
  int b = 0;
  double rate = 0;
  for (int k = 0; k <= max_; ++k)
    if (const double t = step_seconds(k); t > 0 && expected_tokens(k) / t > rate) rate = expected_tokens(k) / t, b = k;
  return b;
}

bool DraftTuner::hopeless() const {
  // Even with every later position accepting as often as the first, no count beats plain steps: the
  // most tokens any k could bring, (1 - a^(K+1)) / (1 - a), over the cheapest verifying step timed.
  if (drafted_[0] < kHopelessDrafts || step_seconds(0) <= 0) return false;
  double cheapest = 0;
  for (int k = 1; k <= max_; ++k)
    if (const double t = step_seconds(k); t > 0 && (cheapest == 0 || t < cheapest)) cheapest = t;
  if (cheapest == 0) return false;
  const double a = acceptance(0), most = a >= 1 ? max_ + 1.0 : (1 - std::pow(a, max_ + 1)) / (1 - a);
  return most / cheapest < 1 / step_seconds(0);
}

int DraftTuner::choose() {
  ++steps_;
  const bool no_hope = hopeless();
  int least = 0;  // warm-up: the k timed the fewest times (k = 0 and 1 first: they may settle it)
  for (int k = 1; k <= max_; ++k)
    if (samples_[k] < samples_[least]) least = k;
  if (samples_[least] < kWarm + 1 && !no_hope) return least;
  const int b = best();
  const int64_t every = no_hope ? kExplore * 8 : kExplore;  // drafting does not pay: re-timed rarely
  if (steps_ % every == 0) return b == max_ ? b - 1 : b == 0 ? 1 : (steps_ / kExplore) % 2 ? b + 1 : b - 1;
  return no_hope ? 0 : b;
}

void DraftTuner::record(int k, int accepted, double seconds) {
  if (k < 0 || k > max_ || accepted < 0 || accepted > k) fail("internal: draft tuner record(", k, ", ", accepted, ")");
  for (int j = 0; j < k && j <= accepted; ++j) ++drafted_[j], accepted_[j] += j < accepted;  // position j reached when all before it were accepted
  if (samples_[k]++ == 0) return;  // the first: graph captures and warm caches
  std::vector<double>& w = recent_[k];  // the last kWindow times; their median (steps share a machine: outliers)
  if (static_cast<int>(w.size()) == kWindow) w.erase(w.begin());
  w.push_back(seconds);
  std::vector<double> sorted = w;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  time_[k] = sorted[sorted.size() / 2];
}

std::string DraftTuner::summary() const {
  const int b = best();
  if (step_seconds(0) <= 0 || step_seconds(b) <= 0) return "auto: still timing";
  std::string s = "auto: step ms by drafts";
  char buf[64];
  for (int k = 0; k <= max_; ++k) {
    std::snprintf(buf, sizeof buf, "%s %.3f", k ? " /" : "", step_seconds(k) * 1e3);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "; %d drafts (%.2f tokens a step, %.2fx plain)", b, expected_tokens(b), expected_tokens(b) / step_seconds(b) * step_seconds(0));
  return s + buf;
}

}  // namespace tandem
