// tests/unit/fixture_util.h: the HF reference fixtures under tests/data (see tests/data/README.md).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

}  // namespace tandem::test
