// Host sampling of one token from a 35B-sized logits row (vocab 248320): the presets of the model card
// and greedy, with a 600-token context and 100 generated tokens for the penalties. Bound: one read of
// the row (1 MB) at the read bandwidth measured by the same loop shape (a threshold scan).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "runtime/engine/sampling.h"

namespace {

struct Row {
  std::vector<float> logits;
  std::vector<int32_t> context, generated;
  Row() {
    const int V = 248320;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0, 3);
    logits.resize(V);
    for (auto& x : logits) x = nd(rng);
    context.resize(600);
    generated.resize(100);
    for (auto& x : context) x = static_cast<int32_t>(rng() % V);
    for (auto& x : generated) x = static_cast<int32_t>(rng() % V);
    context.insert(context.end(), generated.begin(), generated.end());
  }
};

const Row& row() {
  static const Row r;
  return r;
}

void BM_sample(benchmark::State& state, const char* preset) {
  tandem::SamplingParams p;
  if (preset) p = tandem::sampling_preset(preset);
  else p.temperature = 0.0f;
  p.seeded = true;
  p.seed = 3;
  tandem::Sampler s(p);
  const Row& r = row();
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(r.logits, r.context, r.generated));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(r.logits.size() * sizeof(float)));
}

// The floor: one pass over the row comparing against a threshold nothing beats.
void BM_row_scan(benchmark::State& state) {
  const Row& r = row();
  for (auto _ : state) {
    int n = 0;
    for (float x : r.logits) n += x > 1e9f;
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(r.logits.size() * sizeof(float)));
}

}  // namespace

BENCHMARK_CAPTURE(BM_sample, greedy, nullptr)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_sample, thinking, "thinking")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_sample, instruct, "instruct")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_sample, instruct_reasoning, "instruct-reasoning")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_row_scan)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
