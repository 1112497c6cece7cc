// Golden tests: every fixture under tests/data/golden (tiny random glm5_next checkpoints written by transformers'
// save_pretrained, with transformers' own float32 logits; see tools/make_golden.py) must be reproduced by the CPU
// forward, both as one forward over the whole sequence and as a prefill followed by one-token decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "base/npy.h"
#include "model/glm5_next.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

// Every fixture's reference is transformers' float32 forward on the weights exactly as stored (bf16 upcast, fp8
// dequantised), so one bound serves all weight formats. Measured worst case: see docs/VALIDATION.md.
constexpr double kTolerance = 1e-3;

std::vector<std::string> golden_fixtures() {
  std::vector<std::string> names;
  const fs::path root = fs::path(KESTREL_TEST_DATA) / "golden";
  if (fs::exists(root)) {
    for (const auto& entry : fs::directory_iterator(root)) {
      if (fs::exists(entry.path() / "meta.json")) names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct Fixture {
  std::string dir;
  std::vector<int32_t> tokens;
  int64_t prefill;
  double tolerance;
};

Fixture read_fixture(const std::string& name) {
  Fixture fixture;
  fixture.dir = (fs::path(KESTREL_TEST_DATA) / "golden" / name).string();
  std::ifstream in(fixture.dir + "/meta.json");
  const auto meta = nlohmann::json::parse(in);
  fixture.tokens = meta.at("tokens").get<std::vector<int32_t>>();
  fixture.prefill = meta.at("prefill").get<int64_t>();
  fixture.tolerance = kTolerance;
  return fixture;
}

// Largest |a - b| over the whole array; NaN anywhere counts as infinitely far.
double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, WholeSequenceForwardMatchesTransformers) {
  const Fixture fixture = read_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const NpyArray reference = read_npy(fixture.dir + "/ref_full.npy");
  const auto T = static_cast<int64_t>(fixture.tokens.size());
  ASSERT_EQ(reference.shape, (std::vector<int64_t>{T, model->config().vocab_size}));

  const auto sequence = model->new_sequence();
  const std::vector<float> logits = model->forward(*sequence, fixture.tokens);
  EXPECT_LE(max_abs_difference(logits, reference.data), fixture.tolerance);
}

TEST_P(GoldenTest, PrefillThenDecodeMatchesTransformers) {
  const Fixture fixture = read_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const NpyArray reference = read_npy(fixture.dir + "/ref_incremental.npy");
  const auto T = static_cast<int64_t>(fixture.tokens.size());
  ASSERT_EQ(reference.shape, (std::vector<int64_t>{T, model->config().vocab_size}));
  ASSERT_GT(fixture.prefill, 0);
  ASSERT_LT(fixture.prefill, T);

  const auto sequence = model->new_sequence();
  const std::span<const int32_t> tokens(fixture.tokens);
  std::vector<float> logits = model->forward(*sequence, tokens.first(static_cast<size_t>(fixture.prefill)));
  for (int64_t t = fixture.prefill; t < T; ++t) {
    const std::vector<float> step = model->forward(*sequence, tokens.subspan(static_cast<size_t>(t), 1));
    logits.insert(logits.end(), step.begin(), step.end());
  }
  EXPECT_LE(max_abs_difference(logits, reference.data), fixture.tolerance);
}

// Splitting the sequence into uneven multi-token calls (chunked KDA with carried state, indexer pools completed
// across calls) gives the same logits as one call.
TEST_P(GoldenTest, UnevenChunkedPrefillMatchesTransformers) {
  const Fixture fixture = read_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const NpyArray reference = read_npy(fixture.dir + "/ref_full.npy");
  const auto sequence = model->new_sequence();
  const std::span<const int32_t> tokens(fixture.tokens);
  std::vector<float> logits;
  for (size_t begin = 0, step = 37; begin < tokens.size(); begin += step, step = step == 37 ? 70 : 37) {
    const std::vector<float> part = model->forward(*sequence, tokens.subspan(begin, std::min(step, tokens.size() - begin)));
    logits.insert(logits.end(), part.begin(), part.end());
  }
  EXPECT_LE(max_abs_difference(logits, reference.data), fixture.tolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(golden_fixtures()),
                         [](const auto& param_info) { return param_info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

TEST(GoldenFixtures, ArePresent) { EXPECT_GE(golden_fixtures().size(), 5u) << "tests/data/golden is missing fixtures"; }

}  // namespace
}  // namespace kestrel
