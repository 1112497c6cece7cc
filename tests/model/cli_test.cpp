// The `kestrel` binary end to end: `kestrel logits` reproduces a golden fixture's reference logits (one forward, and
// prefill + decode), `kestrel run` continues a prompt greedily and deterministically, and bad input exits with status
// 1 and one "error: ..." line on stderr naming the problem (or, for command-line syntax, CLI11's usage error).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../formats/safetensors_builder.h"
#include "golden_fixture.h"
#include "kestrel_process.h"
#include "base/npy.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using testing::lines_of;
using testing::Outcome;
using testing::quote;
using testing::run_kestrel;
using testing::ScratchDir;

constexpr const char* kFixture = "bf16_hc4_kp4";
constexpr int64_t kVocab = 256;

std::string fixture_dir() { return testing::golden_dir(kFixture); }

std::string join(const std::vector<int32_t>& tokens) {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(tokens[i]);
  }
  return text;
}

// Asserts the CLI's error convention: status 1 and exactly one non-log stderr line, "error: ..." with `fragment`.
void expect_cli_error(const Outcome& outcome, const std::string& fragment) {
  EXPECT_EQ(outcome.status, 1) << outcome.err;
  const std::vector<std::string> lines = outcome.error_lines();
  ASSERT_EQ(lines.size(), 1u) << outcome.err;
  EXPECT_TRUE(lines[0].starts_with("error: ")) << lines[0];
  EXPECT_NE(lines[0].find(fragment), std::string::npos) << "missing \"" << fragment << "\" in: " << lines[0];
}

// `kestrel logits` with the fixture's model; `extra` holds further (quoted) arguments.
Outcome logits(const std::string& tokens, const std::string& out, const std::string& extra = "") {
  return run_kestrel("logits --model " + quote(fixture_dir()) + " --tokens " + quote(tokens) + " --out " + quote(out) +
                     (extra.empty() ? "" : " " + extra));
}

// --- kestrel logits ---

TEST(CliLogitsTest, WholeSequenceMatchesReference) {
  const testing::GoldenFixture meta = testing::read_golden_fixture(kFixture);
  const ScratchDir scratch;
  const std::string out = scratch.file("logits.npy");
  const Outcome outcome = logits(join(meta.tokens), out);
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const NpyArray actual = read_npy(out);
  const NpyArray reference = read_npy(fixture_dir() + "/ref_full.npy");
  const auto T = static_cast<int64_t>(meta.tokens.size());
  ASSERT_EQ(actual.shape, (std::vector<int64_t>{T, kVocab}));
  ASSERT_EQ(reference.shape, actual.shape);
  EXPECT_LE(testing::max_abs_difference(actual.data, reference.data), 1e-3);
}

TEST(CliLogitsTest, PrefillThenDecodeMatchesReference) {
  const testing::GoldenFixture meta = testing::read_golden_fixture(kFixture);
  const ScratchDir scratch;
  const std::string out = scratch.file("logits.npy");
  const Outcome outcome = logits(join(meta.tokens), out, "--prefill " + std::to_string(meta.prefill));
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const NpyArray actual = read_npy(out);
  const NpyArray reference = read_npy(fixture_dir() + "/ref_incremental.npy");
  const auto T = static_cast<int64_t>(meta.tokens.size());
  ASSERT_EQ(actual.shape, (std::vector<int64_t>{T, kVocab}));
  ASSERT_EQ(reference.shape, actual.shape);
  EXPECT_LE(testing::max_abs_difference(actual.data, reference.data), 1e-3);
}

TEST(CliLogitsTest, PrefillOfOneDecodesEveryOtherToken) {
  const testing::GoldenFixture meta = testing::read_golden_fixture(kFixture);
  const std::vector<int32_t> tokens(meta.tokens.begin(), meta.tokens.begin() + 12);
  const ScratchDir scratch;
  const std::string out = scratch.file("logits.npy");
  const Outcome outcome = logits(join(tokens), out, "--prefill 1");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const NpyArray actual = read_npy(out);
  ASSERT_EQ(actual.shape, (std::vector<int64_t>{12, kVocab}));
  // Causal: the first 12 rows of the full-sequence reference are the logits of this prefix.
  const NpyArray reference = read_npy(fixture_dir() + "/ref_full.npy");
  const std::vector<float> prefix(reference.data.begin(), reference.data.begin() + 12 * kVocab);
  EXPECT_LE(testing::max_abs_difference(actual.data, prefix), 1e-3);
}

TEST(CliLogitsTest, AnUnknownDeviceIsAUsageError) {
  const ScratchDir scratch;
  const Outcome outcome = logits("1,2,3", scratch.file("logits.npy"), "--device tpu");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.err.find("--device"), std::string::npos) << outcome.err;
}

// On a machine without an NVIDIA driver (CI), asking for the GPU is an error naming the flag, whether or not the
// binary has the CUDA backend; `auto` runs on the CPU (the tests above).
TEST(CliLogitsTest, DeviceCudaWithoutAGpuIsAnError) {
  if (fs::exists("/dev/nvidiactl")) GTEST_SKIP() << "this machine has an NVIDIA driver";
  const ScratchDir scratch;
  expect_cli_error(logits("1,2,3", scratch.file("logits.npy"), "--device cuda"), "--device cuda");
}

TEST(CliLogitsTest, PrefillZeroIsAnError) {
  const ScratchDir scratch;
  const std::string out = scratch.file("logits.npy");
  expect_cli_error(logits("1,2,3", out, "--prefill 0"), "--prefill 0");
  EXPECT_FALSE(fs::exists(out));
}

TEST(CliLogitsTest, NegativePrefillIsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("1,2,3", scratch.file("logits.npy"), "--prefill -2"), "--prefill -2");
}

TEST(CliLogitsTest, PrefillBeyondTokenCountIsAnError) {
  const ScratchDir scratch;
  const std::string out = scratch.file("logits.npy");
  expect_cli_error(logits("1,2,3", out, "--prefill 4"), "--prefill 4 must be between 1 and the number of tokens (3)");
  EXPECT_FALSE(fs::exists(out));
}

TEST(CliLogitsTest, EmptyTokenItemIsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("1,,2", scratch.file("logits.npy")), "--tokens: '' is not an integer token id");
}

TEST(CliLogitsTest, NonNumericTokenIsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("abc", scratch.file("logits.npy")), "--tokens: 'abc' is not an integer token id");
}

TEST(CliLogitsTest, TrailingGarbageInTokenIsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("1,2x,3", scratch.file("logits.npy")), "'2x'");
}

TEST(CliLogitsTest, EmptyTokenListIsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("", scratch.file("logits.npy")), "--tokens");
}

TEST(CliLogitsTest, NegativeTokenIsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("1,-3", scratch.file("logits.npy")), "--tokens: -3 is out of range");
}

TEST(CliLogitsTest, TokenBeyondInt32IsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("1,4294967296", scratch.file("logits.npy")), "--tokens: 4294967296 is out of range");
}

TEST(CliLogitsTest, TokenOutsideVocabularyIsAnError) {
  const ScratchDir scratch;
  const std::string out = scratch.file("logits.npy");
  expect_cli_error(logits("1,256,2", out), "token id 256 is outside the vocabulary [0, 256)");
  EXPECT_FALSE(fs::exists(out));
}

TEST(CliLogitsTest, MissingModelDirectoryIsAnError) {
  const ScratchDir scratch;
  const std::string model = scratch.file("no_such_model");
  const Outcome outcome = run_kestrel("logits --model " + quote(model) + " --tokens 1,2 --out " +
                                      quote(scratch.file("logits.npy")));
  expect_cli_error(outcome, model + ": not a directory");
}

TEST(CliLogitsTest, UnwritableOutputIsAnError) {
  // A missing parent directory is unwritable even for root.
  const ScratchDir scratch;
  const std::string out = scratch.file("no/such/dir/logits.npy");
  expect_cli_error(logits("1,2,3", out), out + ": cannot open for writing");
}

TEST(CliLogitsTest, OutputThatIsADirectoryIsAnError) {
  const ScratchDir scratch;
  expect_cli_error(logits("1,2,3", scratch.path()), scratch.path() + ": cannot open for writing");
}

TEST(CliLogitsTest, UnknownFlagIsAUsageError) {
  const ScratchDir scratch;
  const Outcome outcome = logits("1,2", scratch.file("logits.npy"), "--bogus-flag 3");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.status, -1) << "killed by a signal";
  EXPECT_NE((outcome.out + outcome.err).find("--bogus-flag"), std::string::npos) << outcome.out << outcome.err;
}

TEST(CliLogitsTest, MissingRequiredFlagIsAUsageError) {
  const Outcome outcome = run_kestrel("logits --model " + quote(fixture_dir()) + " --tokens 1,2");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.status, -1) << "killed by a signal";
  EXPECT_NE((outcome.out + outcome.err).find("--out"), std::string::npos) << outcome.out << outcome.err;
}

TEST(CliTest, MissingSubcommandIsAUsageError) {
  const Outcome outcome = run_kestrel("");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.status, -1) << "killed by a signal";
}

TEST(CliTest, UnknownSubcommandIsAUsageError) {
  const Outcome outcome = run_kestrel("serve --model x");
  EXPECT_NE(outcome.status, 0);
  EXPECT_NE(outcome.status, -1) << "killed by a signal";
}

// --- kestrel run ---

// The ids on the "continuation:" line of `kestrel run`'s stdout.
std::vector<int32_t> continuation_of(const std::string& out) {
  for (const std::string& line : lines_of(out)) {
    if (!line.starts_with("continuation:")) continue;
    std::istringstream ids(line.substr(std::string("continuation:").size()));
    std::vector<int32_t> result;
    for (int32_t id; ids >> id;) result.push_back(id);
    EXPECT_TRUE(ids.eof()) << "unparsable continuation line: " << line;
    return result;
  }
  ADD_FAILURE() << "no line starting with 'continuation:' in: " << out;
  return {};
}

Outcome run_command(const std::string& tokens, const std::string& extra) {
  return run_kestrel("run --model " + quote(fixture_dir()) + " --tokens " + quote(tokens) + " " + extra);
}

TEST(CliRunTest, GreedyContinuationIsDeterministicAndFollowsReference) {
  const std::vector<int32_t> all = testing::read_golden_fixture(kFixture).tokens;
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 20);
  const Outcome first = run_command(join(prompt), "--max-tokens 6");
  ASSERT_EQ(first.status, 0) << first.err;
  const std::vector<int32_t> ids = continuation_of(first.out);
  ASSERT_EQ(ids.size(), 6u) << first.out;
  for (const int32_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, kVocab);
  }
  EXPECT_NE(first.out.find("prompt: " + std::to_string(prompt[0]) + " " + std::to_string(prompt[1])),
            std::string::npos)
      << first.out;

  // The first generated id is the argmax of the reference logits at the prompt's last position, when that argmax is
  // clear of the runner-up.
  const NpyArray reference = read_npy(fixture_dir() + "/ref_full.npy");
  const auto row = reference.data.begin() + (static_cast<int64_t>(prompt.size()) - 1) * kVocab;
  std::vector<float> last(row, row + kVocab);
  const auto best = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
  std::vector<float> sorted = last;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  if (sorted[0] - sorted[1] > 1e-2f) {
    EXPECT_EQ(ids[0], best);
  }

  const Outcome second = run_command(join(prompt), "--max-tokens 6");
  ASSERT_EQ(second.status, 0) << second.err;
  // Compared as ids, not whole stdout, so that timing output cannot make identical runs differ.
  EXPECT_EQ(continuation_of(second.out), ids);
}

TEST(CliRunTest, ShortFlagAndZeroTokens) {
  const Outcome outcome = run_command("5,6,7", "-n 0");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_TRUE(continuation_of(outcome.out).empty()) << outcome.out;
}

TEST(CliRunTest, NegativeMaxTokensIsAnError) {
  expect_cli_error(run_command("5,6,7", "--max-tokens -1"), "--max-tokens must not be negative");
}

TEST(CliRunTest, TokenOutsideVocabularyIsAnError) {
  expect_cli_error(run_command("5,999", "--max-tokens 2"), "token id 999 is outside the vocabulary");
}

TEST(CliRunTest, BadTokenListIsAnError) {
  expect_cli_error(run_command("5,,6", "--max-tokens 2"), "--tokens: '' is not an integer token id");
}

}  // namespace
}  // namespace kestrel
