// Golden tests: every fixture under tests/data/golden (tiny random glm5_next checkpoints written by transformers'
// save_pretrained, with transformers' own float32 logits; see tools/make_golden.py) must be reproduced by the CPU
// forward, both as one forward over the whole sequence and as a prefill followed by one-token decode steps, alone and
// batched with other sequences in one pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

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
using testing::has_bf16_matrices;
using testing::max_abs_difference;
using testing::mean_abs_difference;
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

// Sequences decoding in lockstep (every call one token: the batched decode-step ops) each get the logits of one
// sequence decoded alone.
TEST_P(GoldenTest, LockstepDecodingMatchesTransformers) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const NpyArray incremental = read_npy(fixture.dir + "/ref_incremental.npy");
  for (const std::vector<float>& logits : testing::run_lockstep_decoding(*model, fixture)) {
    ASSERT_EQ(logits.size(), incremental.data.size());
    EXPECT_LE(max_abs_difference(logits, incremental.data), kTolerance);
  }
}

// --kv-cache-dtype bfloat16 and fp8: each latent row is rounded once, when written, so every way of running the
// sequence (one forward, prefill then decode steps, batched and lockstep passes) gives the same logits within
// kSplitTolerance: a latent that another split computes a float rounding apart can land across an fp8 rounding
// midpoint (measured worst 0.0062, uneven chunks of f32_kp1_mtp). The rounding itself moves the logits from
// transformers' float32 ones by a mean of at most kMeanShift (measured per fixture in docs/VALIDATION.md: these tiny
// random models magnify any rounding of their latents).
TEST_P(GoldenTest, RoundedLatentCachesGiveTheSameLogitsEveryWay) {
  constexpr double kSplitTolerance = 0.02;
  const GoldenFixture fixture = read_golden_fixture(GetParam());
  const NpyArray reference = read_npy(fixture.dir + "/ref_full.npy");
  for (const auto& [dtype, kMeanShift] : {std::pair{CacheDtype::bf16, 0.05}, std::pair{CacheDtype::fp8_e4m3, 0.25}}) {
    SCOPED_TRACE(std::string(cache_dtype_name(dtype)));
    CpuBackend backend;
    const auto model = Glm5NextModel::load(fixture.dir, backend, dtype);
    const auto sequence = model->new_sequence();
    const std::vector<float> whole = model->forward(*sequence, fixture.tokens);
    ASSERT_EQ(whole.size(), reference.data.size());
    EXPECT_LE(mean_abs_difference(whole, reference.data), kMeanShift);
    const testing::BatchedLogits batched = testing::run_batched_sequences(*model, fixture);
    EXPECT_LE(max_abs_difference(batched.chunked, whole), kSplitTolerance);
    EXPECT_LE(max_abs_difference(batched.decoded, whole), kSplitTolerance);
    EXPECT_LE(max_abs_difference(batched.whole, whole), kSplitTolerance);
    for (const std::vector<float>& logits : testing::run_lockstep_decoding(*model, fixture)) {
      EXPECT_LE(max_abs_difference(logits, whole), kSplitTolerance);
    }
  }
}

// --dtype bfloat16: the products with bf16 matrices take their inputs rounded to bf16. A fixture without such
// matrices (f32, exl3: their other matrices are float32) gives float32's logits bit for bit; one with them (bf16, fp8:
// the rest bf16) moves from transformers' float32 logits by a mean of at most 0.2 (measured 0.087 and 0.060, max
// 4.3 and 6.4: these tiny random models turn a rounding into another top-k choice now and then). Every way of running
// the sequence agrees: decode steps, batched and lockstep passes exactly, uneven chunks within a mean of 0.01 and
// a max of 0.25 (an input that a chunk computes a float rounding apart can land across a bf16 rounding midpoint:
// measured 0.0051 and 0.155 on bf16_hc4_kp4).
TEST_P(GoldenTest, Bf16ProductInputsGiveTheSameLogitsEveryWay) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
  const bool bf16_matrices = has_bf16_matrices(GetParam());
  const NpyArray reference = read_npy(fixture.dir + "/ref_full.npy");
  CpuBackend exact;
  const auto exact_model = Glm5NextModel::load(fixture.dir, exact);
  const auto exact_sequence = exact_model->new_sequence();
  const std::vector<float> float32 = exact_model->forward(*exact_sequence, fixture.tokens);
  CpuBackend backend;
  backend.set_product_input(ProductInput::bf16);
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const auto sequence = model->new_sequence();
  const std::vector<float> whole = model->forward(*sequence, fixture.tokens);
  ASSERT_EQ(whole.size(), reference.data.size());
  if (bf16_matrices) {
    EXPECT_NE(whole, float32);
    EXPECT_LE(mean_abs_difference(whole, reference.data), 0.2);
  } else {
    EXPECT_EQ(whole, float32);
  }
  const testing::BatchedLogits batched = testing::run_batched_sequences(*model, fixture);
  EXPECT_LE(mean_abs_difference(batched.chunked, whole), 0.01);
  EXPECT_LE(max_abs_difference(batched.chunked, whole), 0.25);
  const double exact_bound = bf16_matrices ? 0.0 : kTolerance;  // the float32 fixtures' splits differ as ever
  EXPECT_LE(max_abs_difference(batched.decoded, whole), exact_bound);
  EXPECT_LE(max_abs_difference(batched.whole, whole), exact_bound);
  for (const std::vector<float>& logits : testing::run_lockstep_decoding(*model, fixture)) {
    EXPECT_LE(max_abs_difference(logits, whole), exact_bound);
  }
}

// Tokens drawn by the backend (the engine's path for requests that need nothing but logits) are the host's draws
// from the same logits, and drawn calls hand back no logits.
TEST_P(GoldenTest, TokensDrawnOnTheBackendAreTheHostsDraws) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const testing::DrawnTokens drawn = testing::run_drawn_decoding(*model, fixture);
  EXPECT_EQ(drawn.returned_logits, 0);
  for (const auto& [token, expected] : drawn.pairs) EXPECT_EQ(token, expected);
}

// Profiling a pass (ForwardOptions::profile, `kestrel bench --profile`) times every part of the model the
// fixture has, within the pass's own time, without changing what the pass computes.
TEST_P(GoldenTest, ProfiledForwardTimesEachPartAndGivesTheSameLogits) {
  const GoldenFixture fixture = read_golden_fixture(GetParam());
  CpuBackend backend;
  const auto model = Glm5NextModel::load(fixture.dir, backend);
  const Glm5NextConfig& c = model->config();
  const auto plain = model->new_sequence(), profiled = model->new_sequence();
  const std::vector<float> expected = model->forward(*plain, fixture.tokens);
  ForwardProfile profile;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> logits = model->forward(*profiled, fixture.tokens, {.all_logits = true, .profile = &profile});
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(logits, expected);

  std::vector<std::string> wanted = {"embedding", "mhc and norms", "head", "logits to host"};
  const auto has = [&](auto list, auto value) { return std::find(list.begin(), list.end(), value) != list.end(); };
  if (has(c.layer_types, LayerType::linear_attention)) {
    wanted.insert(wanted.end(), {"kda projections", "kda convolution", "kda recurrence"});
  }
  if (has(c.layer_types, LayerType::sparse_attention)) {
    wanted.insert(wanted.end(), {"mla projections", "mla cache appends", "dsa indexer select", "mla attention"});
  }
  if (has(c.mlp_layer_types, MlpType::dense)) wanted.emplace_back("dense mlp");
  if (has(c.mlp_layer_types, MlpType::sparse)) {
    wanted.insert(wanted.end(), {"moe router and shared gate, up", "moe routed experts", "moe shared expert"});
  }
  std::vector<std::string> timed;
  for (const ForwardProfile::Part& part : profile.parts) {
    timed.push_back(part.name);
    EXPECT_GE(part.seconds, 0.0) << part.name;
    EXPECT_GE(part.count, 1) << part.name;
    if (part.name == "mhc and norms") {
      // Two sites per layer (each applies the post-mix of the sub-block before it), then the last post-mix.
      EXPECT_EQ(part.count, 2 * c.num_hidden_layers + 1);
    }
  }
  std::sort(wanted.begin(), wanted.end());
  std::sort(timed.begin(), timed.end());
  EXPECT_EQ(timed, wanted);
  EXPECT_LE(profile.total_seconds(), wall);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(golden_fixture_names()),
                         [](const auto& param_info) { return param_info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

TEST(GoldenFixtures, ArePresent) { EXPECT_GE(golden_fixture_names().size(), 5u) << "tests/data/golden is missing fixtures"; }

}  // namespace
}  // namespace kestrel
