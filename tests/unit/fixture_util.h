// tests/unit/fixture_util.h: the HF reference fixtures under tests/data (see tests/data/README.md).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem::test {

struct Fixture {
  std::string name, dir;
  std::vector<int32_t> ids;
  int64_t prefill = 0, vocab = 0;
};

inline std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(TANDEM_TEST_DATA))
    if (std::filesystem::exists(e.path() / "reference.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.name = name;
  f.dir = std::string(TANDEM_TEST_DATA) + "/" + name;
  std::ifstream in(f.dir + "/reference.json");
  const auto j = nlohmann::json::parse(in);
  f.ids = j.at("ids").get<std::vector<int32_t>>();
  f.prefill = j.at("prefill").get<int64_t>();
  f.vocab = j.at("vocab_size").get<int64_t>();
  return f;
}

// The reference forward's logits [ids, vocab] of `ids`: the first `prefill` in one call, then one token a
// call through the cache, in KV cache format `kv`.
inline std::vector<float> reference_logits(const Qwen35Moe& m, const std::vector<int32_t>& ids, int64_t prefill, RowFormat kv = RowFormat::Bf16) {
  const int64_t n = static_cast<int64_t>(ids.size()), V = m.config().vocab_size;
  std::vector<float> out(n * V);
  Qwen35State st = m.new_state();
  st.kv_format = kv;
  if (prefill > 0) m.forward(st, std::span(ids.data(), prefill), out.data());
  for (int64_t i = prefill; i < n; ++i) m.forward(st, std::span(ids.data() + i, 1), out.data() + i * V);
  return out;
}

}  // namespace tandem::test
