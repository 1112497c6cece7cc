// The whole forward on the GPU: every golden fixture (tests/data/golden, transformers' own float32 logits) run on the
// CUDA backend as one call, as prefill plus one-token decode steps, in uneven chunks, and as three sequences batched
// in each pass, within a per-fixture
// tolerance; and a sequence resumed from another's cached blocks and KDA snapshot (prefix caching) continues with the
// same logits. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "../model/golden_fixture.h"
#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/npy.h"
#include "cuda_test_util.h"
#include "model/glm5_next.h"

namespace kestrel::cuda {
namespace {

using kestrel::testing::GoldenFixture;
using kestrel::testing::golden_fixture_names;
using kestrel::testing::max_abs_difference;
using kestrel::testing::read_golden_fixture;

// Max |GPU - transformers| over all logits. The float formats run float32 throughout as the CPU does, in other
// reduction orders and with the KDA recurrence for the chunked form: the CPU's bound holds (H200: at most 5.4e-5).
// EXL3 experts take fp16 inputs on the tensor cores (the exllamav3 kernels' precision): 0.0152 on the H200.
double tolerance(const std::string& fixture) { return fixture.rfind("exl3", 0) == 0 ? 2e-2 : 1e-3; }

class GoldenCudaTest : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    if (!testing::have_gpu()) GTEST_SKIP() << "no CUDA device";
    fixture_ = read_golden_fixture(GetParam());
    backend_ = std::make_unique<CudaBackend>(0);
    model_ = Glm5NextModel::load(fixture_.dir, *backend_);
  }

  void expect_close(const std::vector<float>& logits, const std::string& reference_file) {
    const NpyArray reference = read_npy(fixture_.dir + "/" + reference_file);
    ASSERT_EQ(logits.size(), reference.data.size());
    const double worst = max_abs_difference(logits, reference.data);
    RecordProperty("max_abs_difference", std::to_string(worst));
    std::printf("%s %s: max |gpu - transformers| = %.3g\n", GetParam().c_str(), reference_file.c_str(), worst);
    EXPECT_LE(worst, tolerance(GetParam()));
  }

  GoldenFixture fixture_;
  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<Glm5NextModel> model_;
};

TEST_P(GoldenCudaTest, WholeSequenceForwardMatchesTransformers) {
  const auto sequence = model_->new_sequence();
  expect_close(model_->forward(*sequence, fixture_.tokens), "ref_full.npy");
}

TEST_P(GoldenCudaTest, PrefillThenDecodeMatchesTransformers) {
  const auto sequence = model_->new_sequence();
  const std::span<const int32_t> tokens(fixture_.tokens);
  std::vector<float> logits = model_->forward(*sequence, tokens.first(static_cast<size_t>(fixture_.prefill)));
  for (size_t t = static_cast<size_t>(fixture_.prefill); t < tokens.size(); ++t) {
    const std::vector<float> step = model_->forward(*sequence, tokens.subspan(t, 1));
    logits.insert(logits.end(), step.begin(), step.end());
  }
  expect_close(logits, "ref_incremental.npy");
}

TEST_P(GoldenCudaTest, UnevenChunkedPrefillMatchesTransformers) {
  const auto sequence = model_->new_sequence();
  const std::span<const int32_t> tokens(fixture_.tokens);
  std::vector<float> logits;
  for (size_t begin = 0, step = 37; begin < tokens.size(); begin += step, step = step == 37 ? 70 : 37) {
    const std::vector<float> part = model_->forward(*sequence, tokens.subspan(begin, std::min(step, tokens.size() - begin)));
    logits.insert(logits.end(), part.begin(), part.end());
  }
  expect_close(logits, "ref_full.npy");
}

// Three sequences batched in one pass each step (run_batched_sequences), as the engine runs a GPU.
TEST_P(GoldenCudaTest, BatchedSequencesMatchTransformers) {
  const kestrel::testing::BatchedLogits logits = kestrel::testing::run_batched_sequences(*model_, fixture_);
  expect_close(logits.chunked, "ref_full.npy");
  expect_close(logits.decoded, "ref_incremental.npy");
  expect_close(logits.whole, "ref_full.npy");
}

// Sequences decoding in lockstep: the batched decode-step kernels (one launch for every sequence's KDA step).
TEST_P(GoldenCudaTest, LockstepDecodingMatchesTransformers) {
  for (const std::vector<float>& logits : kestrel::testing::run_lockstep_decoding(*model_, fixture_)) {
    expect_close(logits, "ref_incremental.npy");
  }
}

// Tokens drawn on the GPU (CudaBackend::draw_tokens in the forward) are the host's draws from the logits of twin
// sequences in the same passes, and drawn calls copy back no logits.
TEST_P(GoldenCudaTest, TokensDrawnOnTheGpuAreTheHostsDraws) {
  const kestrel::testing::DrawnTokens drawn = kestrel::testing::run_drawn_decoding(*model_, fixture_);
  EXPECT_EQ(drawn.returned_logits, 0);
  for (const auto& [token, expected] : drawn.pairs) EXPECT_EQ(token, expected);
}

// What the engine's prefix cache does: a second sequence shares the first one's full blocks, loads the KDA state
// saved at that boundary (a round trip through host memory) and computes only the rest.
TEST_P(GoldenCudaTest, ASequenceResumedOnCachedBlocksContinuesWithTheSameLogits) {
  const std::span<const int32_t> tokens(fixture_.tokens);
  const auto whole = model_->new_sequence();
  const std::vector<float> expected = model_->forward(*whole, tokens);

  const auto owner = model_->new_sequence();
  const int64_t block_tokens = owner->block_tokens();
  const int64_t prefix = static_cast<int64_t>(tokens.size()) / 2 / block_tokens * block_tokens;
  ASSERT_GT(prefix, 0);
  (void)model_->forward(*owner, tokens.first(static_cast<size_t>(prefix)));
  std::vector<float> state(static_cast<size_t>(SequenceState::kda_state_size(model_->config())));
  owner->save_kda_state(state);

  const auto resumed = model_->new_sequence();
  resumed->resume_on(std::span(owner->blocks().ids()).first(static_cast<size_t>(prefix / block_tokens)));
  resumed->load_kda_state(state);
  const std::vector<float> rest = model_->forward(*resumed, tokens.subspan(static_cast<size_t>(prefix)));
  const int64_t vocab = model_->config().vocab_size;
  EXPECT_LE(max_abs_difference(rest, std::vector<float>(expected.begin() + prefix * vocab, expected.end())),
            tolerance(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenCudaTest, ::testing::ValuesIn(golden_fixture_names()),
                         [](const auto& param_info) { return param_info.param; });

TEST(CudaBackend, WithoutAGpuConstructionFailsWithAClearError) {
  if (testing::have_gpu()) GTEST_SKIP() << "a CUDA device is present";
  try {
    CudaBackend backend(0);
    FAIL() << "constructed a CUDA backend without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel::cuda
