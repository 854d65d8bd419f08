// tests/unit/test_util.h: shared helpers for the unit tests (temporary folders, random data).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/row_format.h"

namespace tandem::test {

// A fresh folder under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("tandem-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A seed from the environment (TANDEM_TEST_SEED) or fresh per run, printed so failures reproduce.
inline uint32_t test_seed() {
  static const uint32_t seed = [] {
    if (const char* s = std::getenv("TANDEM_TEST_SEED")) return static_cast<uint32_t>(std::stoul(s));
    return static_cast<uint32_t>(std::random_device{}());
  }();
  return seed;
}

inline double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// x[0..n) replaced by what a row format stores of it (core/row_format.h; bf16: rounded to bf16; int8 /
// fp8: the codes times the row's scale), for expected values.
inline void round_row(float* x, int64_t n, RowFormat f) {
  if (f == RowFormat::Bf16) {
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return;
  }
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  const float scale = quantize_row(x, n, f, codes.data());
  for (int64_t i = 0; i < n; ++i) x[i] = row_decode(codes[i], f) * scale;
}

// KL(softmax(want) || softmax(got)) of two logits rows [V], nats.
inline double kl_nats(const float* want, const float* got, int64_t V) {
  double mw = want[0], mg = got[0];
  for (int64_t i = 1; i < V; ++i) mw = std::max<double>(mw, want[i]), mg = std::max<double>(mg, got[i]);
  double zw = 0, zg = 0;
  for (int64_t i = 0; i < V; ++i) zw += std::exp(want[i] - mw), zg += std::exp(got[i] - mg);
  double k = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double lp = want[i] - mw - std::log(zw), lq = got[i] - mg - std::log(zg);
    k += std::exp(lp) * (lp - lq);
  }
  return k;
}

// Expects `fn` to throw tandem::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a tandem::Error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
  }
}

}  // namespace tandem::test
