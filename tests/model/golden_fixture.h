// The golden fixtures under tests/data/golden (written by tools/make_golden.py): where they are, the token sequence
// and prefill each was run with, and the comparison the tests apply to logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kestrel::testing {

struct GoldenFixture {
  std::string dir;
  std::vector<int32_t> tokens;
  int64_t prefill = 0;  // tokens of the reference's cached prefill, the rest decoded one at a time
};

// tests/data as configured at build time, or $KESTREL_TEST_DATA (a test binary carried to another machine).
inline std::filesystem::path test_data_root() {
  const char* moved = std::getenv("KESTREL_TEST_DATA");
  return std::filesystem::path(moved != nullptr && *moved != 0 ? moved : KESTREL_TEST_DATA);
}

inline std::string golden_dir(const std::string& name) { return (test_data_root() / "golden" / name).string(); }

inline std::vector<std::string> golden_fixture_names() {
  std::vector<std::string> names;
  const std::filesystem::path root = test_data_root() / "golden";
  if (std::filesystem::exists(root)) {
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      if (std::filesystem::exists(entry.path() / "meta.json")) names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline GoldenFixture read_golden_fixture(const std::string& name) {
  GoldenFixture fixture{.dir = golden_dir(name), .tokens = {}, .prefill = 0};
  std::ifstream in(fixture.dir + "/meta.json");
  const auto meta = nlohmann::json::parse(in);
  fixture.tokens = meta.at("tokens").get<std::vector<int32_t>>();
  fixture.prefill = meta.at("prefill").get<int64_t>();
  return fixture;
}

// Largest |a - b|; NaN anywhere counts as infinitely far.
inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

}  // namespace kestrel::testing
