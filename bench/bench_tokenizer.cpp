// Tokenizer throughput on tests/data/tokenizers/corpus.txt (79 KB, multilingual, code, edge cases).
//
//   Encode/<tokenizer>/whole:     the corpus as one string (the word cache warms up within the call)
//   Encode/<tokenizer>/snippets:  snippet by snippet (938 calls), like tools/bench_hf_tokenizer.py
//   EncodeCold/<tokenizer>:       whole corpus with a fresh tokenizer per iteration: no warm cache
//   Decode/<tokenizer>:           all ids of the corpus back to text
// Bytes/s is input bytes (encode) or output bytes (decode). Single-threaded. Compare with HF tokenizers
// single-threaded: RAYON_NUM_THREADS=1 python3 tools/bench_hf_tokenizer.py.
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"

namespace {

const std::string kDir = std::string(TANDEM_TEST_DATA) + "/tokenizers/";

const std::string& corpus() {
  static const std::string text = [] {
    std::ifstream f(kDir + "corpus.txt", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  return text;
}

std::vector<std::string> snippets() {
  std::vector<std::string> out;
  const std::string& text = corpus();
  size_t start = 0;
  for (size_t pos; (pos = text.find('\x1e', start)) != std::string::npos; start = pos + 1) {
    out.push_back(text.substr(start, pos - start));
  }
  out.push_back(text.substr(start));
  return out;
}

void encode_whole(benchmark::State& state, const std::string& name) {
  const auto tok = tandem::Tokenizer::from_file(kDir + name + ".json");
  size_t n = 0;
  for (auto _ : state) {
    const auto ids = tok.encode(corpus());
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus().size()));
  state.counters["tokens"] = double(n);
}

void encode_snippets(benchmark::State& state, const std::string& name) {
  const auto tok = tandem::Tokenizer::from_file(kDir + name + ".json");
  const auto parts = snippets();
  for (auto _ : state) {
    for (const auto& s : parts) {
      const auto ids = tok.encode(s);
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus().size() - (parts.size() - 1)));
}

void encode_cold(benchmark::State& state, const std::string& name) {
  const std::string json = [&] {
    std::ifstream f(kDir + name + ".json", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  for (auto _ : state) {
    state.PauseTiming();
    const auto tok = tandem::Tokenizer::from_json(json, name);
    state.ResumeTiming();
    const auto ids = tok.encode(corpus());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(corpus().size()));
}

void decode_all(benchmark::State& state, const std::string& name) {
  const auto tok = tandem::Tokenizer::from_file(kDir + name + ".json");
  const auto ids = tok.encode(corpus());
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string text = tok.decode(ids);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
}

void load(benchmark::State& state, const std::string& name) {
  for (auto _ : state) benchmark::DoNotOptimize(tandem::Tokenizer::from_file(kDir + name + ".json").vocab_size());
}

const char* const kTokenizers[] = {"qwen35_v1000_lowspecial", "qwen35_v5000_highspecial", "qwen2_v2000_ignoremerges",
                                   "gpt2_v3000_prefixspace"};

const int kRegistered = [] {
  for (const char* t : kTokenizers) {
    const std::string name = t;
    benchmark::RegisterBenchmark(("Encode/" + name + "/whole").c_str(), encode_whole, name);
    benchmark::RegisterBenchmark(("Encode/" + name + "/snippets").c_str(), encode_snippets, name);
    benchmark::RegisterBenchmark(("EncodeCold/" + name).c_str(), encode_cold, name);
    benchmark::RegisterBenchmark(("Decode/" + name).c_str(), decode_all, name);
    benchmark::RegisterBenchmark(("Load/" + name).c_str(), load, name)->Unit(benchmark::kMillisecond);
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
