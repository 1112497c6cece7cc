// Golden tests: every fixture under tests/data/golden (tiny random glm5_next checkpoints written by transformers'
// save_pretrained, with transformers' own float32 logits; see tools/make_golden.py) must be reproduced by the CPU
// forward, both as one forward over the whole sequence and as a prefill followed by one-token decode steps, alone and
// batched with other sequences in one pass.
#include <gtest/gtest.h>


#include "backend/cpu/cpu_backend.h"
#include "base/npy.h"
#include "model/glm5_next.h"
#include "golden_fixture.h"

namespace kestrel {
namespace {

// Every fixture's reference is transformers' float32 forward on the weights exactly as stored (bf16 upcast, fp8
// dequantised), so one bound serves all weight formats. Measured worst case: see docs/VALIDATION.md.
constexpr double kTolerance = 1e-3;

using testing::GoldenFixture;
using testing::golden_fixture_names;
using testing::max_abs_difference;
using testing::read_golden_fixture;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, WholeSequenceForwardMatchesTransformers) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const NpyArray reference = read_npy(fixture.dir + "/ref_full.npy");
  const auto T = static_cast<int64_t>(fixture.tokens.size());
  ASSERT_EQ(reference.shape, (std::vector<int64_t>{T, model->config().vocab_size}));

  const auto sequence = model->new_sequence();
  const std::vector<float> logits = model->forward(*sequence, fixture.tokens);
  EXPECT_LE(max_abs_difference(logits, reference.data), kTolerance);
}

TEST_P(GoldenTest, PrefillThenDecodeMatchesTransformers) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
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
  EXPECT_LE(max_abs_difference(logits, reference.data), kTolerance);
}

// Splitting the sequence into uneven multi-token calls (chunked KDA with carried state, indexer pools completed
// across calls) gives the same logits as one call.
TEST_P(GoldenTest, UnevenChunkedPrefillMatchesTransformers) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
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
  EXPECT_LE(max_abs_difference(logits, reference.data), kTolerance);
}

// Three sequences batched in one pass each step, each kind of call mixed with the others (run_batched_sequences):
// each gets the logits it gets alone.
TEST_P(GoldenTest, BatchedSequencesMatchTransformers) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const NpyArray full = read_npy(fixture.dir + "/ref_full.npy");
  const NpyArray incremental = read_npy(fixture.dir + "/ref_incremental.npy");
  const testing::BatchedLogits logits = testing::run_batched_sequences(*model, fixture);
  ASSERT_EQ(logits.chunked.size(), full.data.size());
  ASSERT_EQ(logits.decoded.size(), incremental.data.size());
  ASSERT_EQ(logits.whole.size(), full.data.size());
  EXPECT_LE(max_abs_difference(logits.chunked, full.data), kTolerance);
  EXPECT_LE(max_abs_difference(logits.decoded, incremental.data), kTolerance);
  EXPECT_LE(max_abs_difference(logits.whole, full.data), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(golden_fixture_names()),
                         [](const auto& param_info) { return param_info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

TEST(GoldenFixtures, ArePresent) { EXPECT_GE(golden_fixture_names().size(), 5u) << "tests/data/golden is missing fixtures"; }

}  // namespace
}  // namespace kestrel
