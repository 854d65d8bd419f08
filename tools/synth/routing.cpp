// Router popularity skew: calibration, per-layer multipliers, and the measured report. See synth.h.
//
// Why multipliers work: for a fixed input x, the logits of random router rows are independent
// Gaussians with std ∝ |w_e|·|x|; top-k picks the largest, so experts with wider logit
// distributions win more often, and the popularity curve depends only on (s_e, E, k), not on the
// overall logit scale. That makes a Monte-Carlo calibration on plain N(0, 1) draws exact up to
// sampling noise, and the measured report (real bf16 rows, anisotropic post-norm inputs) agrees.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>

#include "core/error.h"
#include "core/weights.h"
#include "tools/synth/synth.h"

namespace tandem::synth {

namespace {

// Standard normal draws from a counter-based stream (Box–Muller; exact enough for measurements).
class NormalStream {
 public:
  explicit NormalStream(uint64_t key) : ctr_(key) {}
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(mix64(ctr_ += kGolden) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const double u2 = static_cast<double>(mix64(ctr_ += kGolden) >> 11) * (1.0 / 9007199254740992.0);
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
    spare_ = static_cast<float>(r * std::sin(th));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(th));
  }

 private:
  uint64_t ctr_;
  float spare_ = 0;
  bool has_spare_ = false;
};

double normal_quantile(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 80; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Counts how often each expert is among the k largest of `logits` rows [tokens][E].
void count_topk(const float* logits, int64_t tokens, int E, int k, std::vector<int>& order, std::vector<double>& counts) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(),
                     [&](int a, int b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
    for (int j = 0; j < k; ++j) counts[order[j]] += 1;
  }
}

}  // namespace


double skew_log_spread(int E, int k) {
  if (E < 2 || k < 1 || k >= E) return 0.0;
  // A pure function of (E, k), remembered: every synth run and test of the same shape needs it.
  static std::mutex mu;
  static std::map<std::pair<int, int>, double> memo;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo.find({E, k}); it != memo.end()) return it->second;
  }
  // Enough draws that the top-20% estimate's noise (and its upward sorting bias) stays below ~0.5%.
  const int64_t tokens = std::max<int64_t>(4096, (int64_t(1) << 19) / E);
  std::vector<float> g(static_cast<size_t>(tokens * E));
  NormalStream ns(0x5ca1ab1e0000ull + static_cast<uint64_t>(E) * 1000 + static_cast<uint64_t>(k));
  for (float& v : g) v = ns.next();
  std::vector<double> z(E);
  for (int r = 0; r < E; ++r) z[r] = normal_quantile((r + 0.5) / E);

  std::vector<float> logits(g.size());
  std::vector<int> order(E);
  auto top20 = [&](double c) {
    std::vector<float> s(E);
    for (int e = 0; e < E; ++e) s[e] = static_cast<float>(std::exp(c * z[e]));
    for (int64_t t = 0; t < tokens; ++t)
      for (int e = 0; e < E; ++e) logits[t * E + e] = s[e] * g[t * E + e];
    std::vector<double> counts(E, 0.0);
    count_topk(logits.data(), tokens, E, k, order, counts);
    return shares_from_counts(std::move(counts)).top20;
  };
  double lo = 0.0, hi = 3.0;
  for (int i = 0; i < 14; ++i) {  // bracket width 3 / 2^14: far below the sampling noise
    const double mid = 0.5 * (lo + hi);
    (top20(mid) < kTargetTop20Share ? lo : hi) = mid;
  }
  std::lock_guard<std::mutex> lock(mu);
  return memo[{E, k}] = 0.5 * (lo + hi);
}

std::vector<float> router_row_scales(int E, double log_spread, uint64_t seed, int layer) {
  std::vector<float> s(E, 1.0f);
  if (log_spread <= 0) return s;
  // Popularity order of this layer: Fisher–Yates on a stream keyed by (seed, layer).
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  const uint64_t key = mix64(mix64(seed) ^ mix64(0x726f757465720000ull + static_cast<uint64_t>(layer)));
  for (int i = E - 1; i > 0; --i) {
    const uint64_t r = mix64(key + static_cast<uint64_t>(i) * kGolden);
    std::swap(perm[i], perm[static_cast<int>(r % static_cast<uint64_t>(i + 1))]);
  }
  double sq = 0;
  for (int r = 0; r < E; ++r) {
    const double v = std::exp(log_spread * normal_quantile((r + 0.5) / E));
    s[perm[r]] = static_cast<float>(v);
    sq += v * v;
  }
  const float norm = static_cast<float>(1.0 / std::sqrt(sq / E));
  for (float& v : s) v *= norm;
  return s;
}

RoutingReport measure_routing(const ModelConfig& cfg,
                              const std::function<void(int, std::vector<float>&, std::vector<float>&)>& layer_weights,
                              int samples, uint64_t seed, int threads) {
  const int L = cfg.num_layers, E = cfg.num_experts, k = cfg.num_experts_per_tok;
  const int64_t H = cfg.hidden_size;
  RoutingReport rep;
  rep.samples = samples;
  rep.layers.resize(L);
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::max(1, threads))
  for (int l = 0; l < L; ++l) {
    try {
      std::vector<float> router, norm;
      layer_weights(l, router, norm);
      if (static_cast<int64_t>(router.size()) != E * H || static_cast<int64_t>(norm.size()) != H)
        fail("internal: router weights of layer ", l, " have the wrong size");
      NormalStream ns(mix64(mix64(seed) ^ mix64(0x68696464656e0000ull + static_cast<uint64_t>(l))));
      std::vector<float> x(H), logits(E);
      std::vector<double> counts(E, 0.0);
      std::vector<int> order(E);
      for (int s = 0; s < samples; ++s) {
        double ss = 0;
        for (int64_t i = 0; i < H; ++i) {
          x[i] = ns.next();
          ss += double(x[i]) * x[i];
        }
        const float inv_rms = static_cast<float>(1.0 / std::sqrt(ss / H + 1e-6));
        for (int64_t i = 0; i < H; ++i) x[i] = x[i] * inv_rms * (1.0f + norm[i]);
        for (int e = 0; e < E; ++e) logits[e] = dot_f32(router.data() + e * H, x.data(), H);
        count_topk(logits.data(), 1, E, k, order, counts);
      }
      rep.layers[l] = shares_from_counts(std::move(counts));
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  rep.min = rep.max = rep.layers.empty() ? RoutingShares{} : rep.layers[0];
  for (const auto& r : rep.layers) {
    rep.mean.top10 += r.top10 / L;
    rep.mean.top20 += r.top20 / L;
    rep.mean.top50 += r.top50 / L;
    rep.min = {std::min(rep.min.top10, r.top10), std::min(rep.min.top20, r.top20), std::min(rep.min.top50, r.top50)};
    rep.max = {std::max(rep.max.top10, r.top10), std::max(rep.max.top20, r.top20), std::max(rep.max.top50, r.top50)};
  }
  return rep;
}

}  // namespace tandem::synth
