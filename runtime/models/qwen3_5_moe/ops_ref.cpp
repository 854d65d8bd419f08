#include "runtime/models/qwen3_5_moe/ops_ref.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

namespace tandem::ref {

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

namespace {
float mean_square(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(s / static_cast<double>(n));
}
}  // namespace

void rmsnorm_zc(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float r = 1.0f / std::sqrt(mean_square(x, n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * (1.0f + w[i]);
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, float eps, float* y) {
  const float r = 1.0f / std::sqrt(mean_square(x, n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r) * silu(z[i]);
}

void l2norm(float* x, int64_t n, float eps) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(s) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

void rope_inv_freq(double theta, int rotary_dim, float* inv_freq) {
  for (int i = 0; i < rotary_dim / 2; ++i)
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
}

void rope_neox(float* head, int rotary_dim, const float* inv_freq, int64_t pos) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = head[i], b = head[i + half];
    head[i] = a * c - b * s;
    head[i + half] = b * c + a * s;
  }
}

void causal_conv_step(const float* x, float* window, const float* w, int64_t channels, int kernel, float* y) {
  const int hist = kernel - 1;
  for (int64_t ch = 0; ch < channels; ++ch) {
    float acc = w[ch * kernel + hist] * x[ch];
    for (int j = 0; j < hist; ++j) acc += w[ch * kernel + j] * window[j * channels + ch];
    y[ch] = silu(acc);
  }
  // Shift the history by one token: drop the oldest, append x.
  for (int j = 0; j + 1 < hist; ++j) std::copy_n(window + (j + 1) * channels, channels, window + j * channels);
  if (hist > 0) std::copy_n(x, channels, window + (hist - 1) * channels);
}

void delta_rule_step(float* S, const float* q, const float* k, const float* v, float g, float beta,
                     int dk, int dv, float* o) {
  const float decay = std::exp(g);
  for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] *= decay;
  std::vector<float> delta(dv, 0.0f);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) delta[j] += S[i * dv + j] * k[i];
  for (int j = 0; j < dv; ++j) delta[j] = beta * (v[j] - delta[j]);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) S[i * dv + j] += k[i] * delta[j];
  std::fill_n(o, dv, 0.0f);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) o[j] += S[i * dv + j] * q[i];
}

void delta_rule_chunk(float* S, const float* q, const float* k, const float* v, const float* g, const float* beta, int C,
                      int dk, int dv, float* o) {
  std::vector<double> G(C);
  double acc = 0;
  for (int t = 0; t < C; ++t) G[t] = acc += g[t];
  auto dot = [&](const float* a, const float* b) {
    double d = 0;
    for (int i = 0; i < dk; ++i) d += double(a[i]) * b[i];
    return d;
  };
  std::vector<double> delta(int64_t(C) * dv), s0x(dv);
  auto s0_t = [&](const float* x) {  // S0^T x
    std::fill(s0x.begin(), s0x.end(), 0.0);
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dv; ++j) s0x[j] += double(S[i * dv + j]) * x[i];
  };
  for (int t = 0; t < C; ++t) {
    const float* kt = k + int64_t(t) * dk;
    s0_t(kt);
    for (int j = 0; j < dv; ++j) delta[int64_t(t) * dv + j] = beta[t] * (v[int64_t(t) * dv + j] - std::exp(G[t]) * s0x[j]);
    for (int s = 0; s < t; ++s) {
      const double a = beta[t] * std::exp(G[t] - G[s]) * dot(kt, k + int64_t(s) * dk);
      for (int j = 0; j < dv; ++j) delta[int64_t(t) * dv + j] -= a * delta[int64_t(s) * dv + j];
    }
  }
  for (int t = 0; t < C; ++t) {
    const float* qt = q + int64_t(t) * dk;
    s0_t(qt);
    for (int j = 0; j < dv; ++j) {
      double ot = std::exp(G[t]) * s0x[j];
      for (int s = 0; s <= t; ++s) ot += std::exp(G[t] - G[s]) * dot(qt, k + int64_t(s) * dk) * delta[int64_t(s) * dv + j];
      o[int64_t(t) * dv + j] = static_cast<float>(ot);
    }
  }
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) {
      double sij = std::exp(G[C - 1]) * S[i * dv + j];
      for (int s = 0; s < C; ++s) sij += std::exp(G[C - 1] - G[s]) * k[int64_t(s) * dk + i] * delta[int64_t(s) * dv + j];
      S[i * dv + j] = static_cast<float>(sij);
    }
}

namespace {

// Causal attention of one query head over rows read through `Rows`: row(s) its values (or codes),
// value(x) a value before the row's scale, scale(s) the row's scale (1 for fp32 rows, a no-op).
template <typename Rows>
void attend_rows(const float* q, const Rows& k, const Rows& v, int64_t n_ctx, int head_dim, float scale, float* scores, float* out) {
  float mx = -INFINITY;
  for (int64_t s = 0; s < n_ctx; ++s) {
    float d = 0.0f;
    const auto* kr = k.row(s);
    for (int i = 0; i < head_dim; ++i) d += q[i] * k.value(kr[i]);
    scores[s] = d * k.scale(s) * scale;
    mx = std::max(mx, scores[s]);
  }
  double denom = 0.0;
  for (int64_t s = 0; s < n_ctx; ++s) {
    scores[s] = std::exp(scores[s] - mx);
    denom += scores[s];
  }
  std::fill_n(out, head_dim, 0.0f);
  for (int64_t s = 0; s < n_ctx; ++s) {
    const float p = static_cast<float>(scores[s] / denom) * v.scale(s);
    const auto* vr = v.row(s);
    for (int i = 0; i < head_dim; ++i) out[i] += p * v.value(vr[i]);
  }
}

struct FloatRows {
  const float* base;
  int64_t stride;
  const float* row(int64_t s) const { return base + s * stride; }
  static float value(float x) { return x; }
  static float scale(int64_t) { return 1.0f; }
};

// Every E4M3 code's value, made once.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = row_decode(static_cast<uint8_t>(c), RowFormat::Fp8);
    return t;
  }();
  return table;
}

// Int8 codes convert to their values directly (the loops vectorise); E4M3 codes through the table.
template <RowFormat F>
struct CodeRows {
  CodedRows r;
  int64_t stride, scale_stride;
  const float* lut = e4m3_values().data();
  const uint8_t* row(int64_t s) const { return r.codes + s * stride; }
  float value(uint8_t c) const { return F == RowFormat::Int8 ? static_cast<float>(static_cast<int8_t>(c)) : lut[c]; }
  float scale(int64_t s) const { return r.scales[s * scale_stride]; }
};

template <RowFormat F>
void attend_codes(const float* q, CodedRows k, CodedRows v, int64_t n_ctx, int64_t row_stride, int64_t scale_stride, int head_dim,
                  float scale, float* scores, float* out) {
  attend_rows(q, CodeRows<F>{k, row_stride, scale_stride}, CodeRows<F>{v, row_stride, scale_stride}, n_ctx, head_dim, scale, scores, out);
}

}  // namespace

void attend(const float* q, const float* k_cache, const float* v_cache, int64_t n_ctx, int64_t row_stride,
            int head_dim, float scale, float* scores, float* out) {
  attend_rows(q, FloatRows{k_cache, row_stride}, FloatRows{v_cache, row_stride}, n_ctx, head_dim, scale, scores, out);
}

void attend_coded(const float* q, CodedRows k, CodedRows v, int64_t n_ctx, int64_t row_stride, int64_t scale_stride, int head_dim,
                  RowFormat f, float scale, float* scores, float* out) {
  if (f == RowFormat::Int8) attend_codes<RowFormat::Int8>(q, k, v, n_ctx, row_stride, scale_stride, head_dim, scale, scores, out);
  else attend_codes<RowFormat::Fp8>(q, k, v, n_ctx, row_stride, scale_stride, head_dim, scale, scores, out);
}

void route_topk(const float* logits, int num_experts, int k, int* idx, float* weight) {
  float mx = -INFINITY;
  for (int e = 0; e < num_experts; ++e) mx = std::max(mx, logits[e]);
  std::vector<float> p(num_experts);
  double denom = 0.0;
  for (int e = 0; e < num_experts; ++e) {
    p[e] = std::exp(logits[e] - mx);
    denom += p[e];
  }
  for (int e = 0; e < num_experts; ++e) p[e] = static_cast<float>(p[e] / denom);
  std::vector<int> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += p[order[j]];
  for (int j = 0; j < k; ++j) {
    idx[j] = order[j];
    weight[j] = p[order[j]] / sum;
  }
}

}  // namespace tandem::ref
