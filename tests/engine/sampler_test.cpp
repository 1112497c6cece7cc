// The sampler on hand-made logits: each parameter changes the choice it should and nothing else, seeded draws repeat
// exactly, the draw follows the kept distribution, and logprobs are those of the raw logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/sampler.h"

namespace kestrel {
namespace {

constexpr int32_t kEos = 7;

struct Case {
  std::vector<float> logits{};
  SamplingParams params{};
  std::vector<int32_t> prompt{};
  std::vector<int32_t> output{};
  std::vector<int32_t> eos = {kEos};
};

SampledToken sample(Case c, std::mt19937_64& rng) {
  return sample_token(c.logits, SamplingInput{.params = c.params,
                                              .prompt = c.prompt,
                                              .output = c.output,
                                              .eos_token_ids = c.eos,
                                              .rng = rng});
}

int32_t greedy(Case c) {
  c.params.temperature = 0.0f;
  std::mt19937_64 rng(0);
  return sample(std::move(c), rng).token_id;
}

// How often each token is drawn in `draws` samples with a generator seeded `seed`.
std::map<int32_t, int> histogram(const Case& c, int draws, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[sample(c, rng).token_id];
  return counts;
}

// Logits of a distribution with the given probabilities (the rest of an 8-token vocabulary at -inf).
std::vector<float> from_probabilities(std::vector<double> probabilities) {
  std::vector<float> logits(8, -INFINITY);
  for (size_t i = 0; i < probabilities.size(); ++i) logits[i] = static_cast<float>(std::log(probabilities[i]));
  return logits;
}

TEST(Sampler, GreedyTakesTheLargestLogitAndTiesGoToTheLowerId) {
  EXPECT_EQ(greedy({.logits = {0.1f, 0.5f, 0.2f, 0.5f, 0, 0, 0, 0}}), 1);
  EXPECT_EQ(greedy({.logits = {0, 0, 0, 0, 0, 0, 0, 3.0f}}), 7);
}

TEST(Sampler, GreedyDrawsNothingFromTheGenerator) {
  std::mt19937_64 rng(5), untouched(5);
  sample({.logits = {1, 2, 3, 0, 0, 0, 0, 0}, .params = {.temperature = 0.0f}}, rng);
  EXPECT_EQ(rng(), untouched());
}

TEST(Sampler, LogitBiasMovesTheChoice) {
  Case c{.logits = {1.0f, 2.0f, 0, 0, 0, 0, 0, 0}};
  EXPECT_EQ(greedy(c), 1);
  c.params.logit_bias = {{0, 1.5f}};
  EXPECT_EQ(greedy(c), 0);
  c.params.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(greedy(c), 3);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenTokens) {
  // Token 1 (in the prompt) 2.0 -> 2.0 / 2 = 1.0 < token 0's 1.5.
  Case c{.logits = {1.5f, 2.0f, 0, 0, 0, 0, 0, 0}, .prompt = {1}};
  EXPECT_EQ(greedy(c), 1);
  c.params.repetition_penalty = 2.0f;
  EXPECT_EQ(greedy(c), 0);
  // A negative logit of a seen token gets more negative: -0.5 * 2 = -1 < token 2's -0.8 among otherwise -inf.
  Case negative{.logits = {-0.5f, -INFINITY, -0.8f, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
                .output = {0}};
  EXPECT_EQ(greedy(negative), 0);
  negative.params.repetition_penalty = 2.0f;
  EXPECT_EQ(greedy(negative), 2);
}

TEST(Sampler, PenaltiesApplyOncePerTokenAndLeaveTheNextDrawUntouched) {
  // Token 1 three times in the prompt and twice in the output: divided by 2 once (2.0 -> 1.0 < 1.5), not to 0.25.
  Case c{.logits = {1.5f, 2.0f, 0.9f, 0, 0, 0, 0, 0}, .prompt = {1, 1, 1}, .output = {1, 1}};
  c.params.repetition_penalty = 2.0f;
  EXPECT_EQ(greedy(c), 0);
  c.logits[0] = 0.95f;
  EXPECT_EQ(greedy(c), 1);  // 1.0 > 0.95: the penalty was applied once
  // A draw after a penalised one on the same thread: token 1 is not in its prompt, so it keeps its logit.
  Case next{.logits = {1.5f, 2.0f, 0, 0, 0, 0, 0, 0}, .prompt = {2}};
  next.params.repetition_penalty = 2.0f;
  EXPECT_EQ(greedy(next), 1);
  // Frequency counts each occurrence once: 1.4 - 2 * 0.3 = 0.8 < 1.0, then the next draw has no output.
  Case f{.logits = {1.0f, 1.4f, 0, 0, 0, 0, 0, 0}, .output = {1, 3, 1}};
  f.params.frequency_penalty = 0.3f;
  EXPECT_EQ(greedy(f), 0);
  f.output = {};
  EXPECT_EQ(greedy(f), 1);
  // An id outside the vocabulary is refused, and leaves nothing marked for the next draw.
  Case bad{.logits = {1.5f, 2.0f, 0, 0, 0, 0, 0, 0}, .prompt = {1, 8}};
  bad.params.repetition_penalty = 2.0f;
  EXPECT_THROW(greedy(bad), Error);
  EXPECT_EQ(greedy(next), 1);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesApplyToGeneratedTokensOnly) {
  Case c{.logits = {1.0f, 1.4f, 0, 0, 0, 0, 0, 0}, .prompt = {0}, .output = {1}};
  c.params.presence_penalty = 0.5f;
  EXPECT_EQ(greedy(c), 0);  // 1.4 - 0.5 < 1.0; the prompt's token 0 is untouched
  c.output = {};
  EXPECT_EQ(greedy(c), 1);
  // Frequency scales with the count: one occurrence costs 0.3, two cost 0.6.
  Case f{.logits = {1.0f, 1.4f, 0, 0, 0, 0, 0, 0}, .output = {1}};
  f.params.frequency_penalty = 0.3f;
  EXPECT_EQ(greedy(f), 1);
  f.output = {1, 1};
  EXPECT_EQ(greedy(f), 0);
}

TEST(Sampler, MinTokensSuppressesEosAndStopIdsUntilReached) {
  Case c{.logits = {0, 0, 0, 0, 5.0f, 0, 0, 9.0f}, .output = {3}};
  c.params.min_tokens = 2;
  c.params.stop_token_ids = {4};
  EXPECT_EQ(greedy(c), 0);  // EOS 7 and stop id 4 masked with one token generated
  c.output = {3, 3};
  EXPECT_EQ(greedy(c), 7);
  c.output = {3};
  c.params.ignore_eos = true;  // EOS does not end the request, so it is not masked; the stop id still is
  EXPECT_EQ(greedy(c), 7);
}

TEST(Sampler, TopKKeepsOnlyTheKMostLikely) {
  Case c{.logits = from_probabilities({0.4, 0.3, 0.2, 0.1}), .params = {.temperature = 1.0f, .top_k = 2}};
  const auto counts = histogram(c, 2000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts.at(0), counts.at(1));
  c.params.top_k = 1;
  EXPECT_EQ(histogram(c, 200), (std::map<int32_t, int>{{0, 200}}));
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  Case c{.logits = from_probabilities({0.5, 0.3, 0.2}), .params = {.temperature = 1.0f, .top_p = 0.45f}};
  EXPECT_EQ(histogram(c, 300).size(), 1u);
  c.params.top_p = 0.6f;
  const auto two = histogram(c, 2000);
  EXPECT_EQ(two.size(), 2u);
  EXPECT_NEAR(two.at(0) / 2000.0, 0.5 / 0.8, 0.04);  // renormalised over the kept tokens
  c.params.top_p = 1.0f;
  EXPECT_EQ(histogram(c, 2000).size(), 3u);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheMostLikely) {
  Case c{.logits = from_probabilities({0.5, 0.3, 0.2}), .params = {.temperature = 1.0f, .min_p = 0.5f}};
  const auto counts = histogram(c, 2000);
  EXPECT_EQ(counts.size(), 2u);  // 0.2 < 0.5 * 0.5
  EXPECT_EQ(counts.count(2), 0u);
  c.params.min_p = 0.3f;
  EXPECT_EQ(histogram(c, 2000).size(), 3u);
}

TEST(Sampler, DrawsFollowTheDistributionAndTemperatureSharpensIt) {
  Case c{.logits = from_probabilities({0.6, 0.3, 0.1}), .params = {.temperature = 1.0f}};
  const int draws = 20000;
  const auto counts = histogram(c, draws);
  EXPECT_NEAR(counts.at(0) / double(draws), 0.6, 0.015);
  EXPECT_NEAR(counts.at(1) / double(draws), 0.3, 0.015);
  EXPECT_NEAR(counts.at(2) / double(draws), 0.1, 0.015);
  // At T = 0.5 the probabilities go as p^2: 0.36 / 0.46 for token 0.
  c.params.temperature = 0.5f;
  EXPECT_NEAR(histogram(c, draws).at(0) / double(draws), 0.36 / 0.46, 0.015);
  c.params.temperature = 2.0f;
  const double flat = std::sqrt(0.6) / (std::sqrt(0.6) + std::sqrt(0.3) + std::sqrt(0.1));
  EXPECT_NEAR(histogram(c, draws).at(0) / double(draws), flat, 0.015);
}

TEST(Sampler, TheSameSeedRepeatsTheDrawsAndAnotherSeedDoesNot) {
  Case c{.logits = from_probabilities({0.2, 0.2, 0.2, 0.2, 0.2}), .params = {.temperature = 1.0f}};
  const auto run = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 64; ++i) tokens.push_back(sample(c, rng).token_id);
    return tokens;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, LogprobsAreThoseOfTheRawLogits) {
  Case c{.logits = {2.0f, 1.0f, 1.0f, 0.0f, -1.0f, -2.0f, -3.0f, -4.0f}};
  c.params.temperature = 0.0f;
  c.params.logprobs = 3;
  c.params.logit_bias = {{3, 10.0f}};  // chosen, but the logprobs ignore the bias
  std::mt19937_64 rng(0);
  const SampledToken token = sample(c, rng);
  ASSERT_EQ(token.token_id, 3);
  ASSERT_TRUE(token.logprobs.has_value());
  double total = 0.0;
  for (const float l : c.logits) total += std::exp(static_cast<double>(l));
  const auto expected = [&](int id) { return c.logits[static_cast<size_t>(id)] - std::log(total); };
  EXPECT_NEAR(token.logprobs->logprob, expected(3), 1e-6);
  EXPECT_EQ(token.logprobs->rank, 4);
  ASSERT_EQ(token.logprobs->top.size(), 3u);
  EXPECT_EQ(token.logprobs->top[0].token_id, 0);
  EXPECT_EQ(token.logprobs->top[1].token_id, 1);  // tied with 2: the lower id first
  EXPECT_EQ(token.logprobs->top[2].token_id, 2);
  EXPECT_NEAR(token.logprobs->top[0].logprob, expected(0), 1e-6);

  c.params.logprobs = 0;
  std::mt19937_64 rng2(0);
  EXPECT_TRUE(sample(c, rng2).logprobs->top.empty());
  c.params.logprobs.reset();
  std::mt19937_64 rng3(0);
  EXPECT_FALSE(sample(c, rng3).logprobs.has_value());
}

// The draw as a full sort defines it: the kept tokens (min_p, then top_k with its ties) ranked by logit and then id,
// weights sampling_weight(l - l_max) and their total kept_weight_total, the shortest ranked prefix reaching top_p of
// that, and the first ranked token whose running weight passes u (past the end, the last that weighs anything).
int32_t sorted_walk(std::vector<float> logits, const SamplingParams& p, std::mt19937_64& rng) {
  for (float& l : logits) l /= p.temperature;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  const auto ranks_before = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  float threshold = p.min_p > 0.0f ? max_logit + std::log(p.min_p) : -INFINITY;
  std::vector<int32_t> kept;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] >= threshold) kept.push_back(i);
  }
  std::sort(kept.begin(), kept.end(), ranks_before);
  if (p.top_k > 0 && p.top_k < static_cast<int64_t>(kept.size())) threshold = logits[kept[p.top_k - 1]];
  std::erase_if(kept, [&](int32_t id) { return logits[id] < threshold; });
  std::vector<float> weights(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) weights[i] = sampling_weight(logits[i] - max_logit);
  const auto weight = [&](int32_t id) { return static_cast<double>(weights[id]); };
  double total = kept_weight_total(logits, weights, threshold);
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    size_t keep = 0;
    while (keep < kept.size() && mass < p.top_p * total) mass += weight(kept[keep++]);
    kept.resize(keep);
    total = mass;
  }
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0.0;
  int32_t last_weighed = kept.front();
  for (const int32_t id : kept) {
    cumulative += weight(id);
    if (u < cumulative) return id;
    if (weight(id) > 0.0) last_weighed = id;
  }
  return last_weighed;
}

TEST(Sampler, LargeVocabularyDrawsAreTheFullSortsForEveryShapeOfDistribution) {
  // The sampler ranks only the head of the distribution that a draw reaches; every draw must still be the one a full
  // sort gives: peaked and flat logits, ties, -inf entries, with and without top_k, top_p and min_p.
  constexpr int kVocab = 30000;
  std::mt19937 make(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const float spread : {0.5f, 3.0f, 12.0f}) {
    std::vector<float> logits(kVocab);
    for (float& l : logits) l = std::round(spread * normal(make) * 64.0f) / 64.0f;  // coarse: many ties
    for (int i = 0; i < kVocab; i += 97) logits[static_cast<size_t>(i)] = -INFINITY;
    for (const SamplingParams& params : {SamplingParams{.temperature = 1.0f},
                                        SamplingParams{.temperature = 0.7f, .top_p = 0.9f},
                                        SamplingParams{.temperature = 1.3f, .top_k = 40},
                                        SamplingParams{.temperature = 1.0f, .top_p = 0.5f, .top_k = 3000},
                                        SamplingParams{.temperature = 1.0f, .min_p = 0.05f}}) {
      for (uint64_t seed = 0; seed < 20; ++seed) {
        std::mt19937_64 rng(seed), reference_rng(seed);
        Case c{.logits = logits, .params = params};
        EXPECT_EQ(sample(c, rng).token_id, sorted_walk(logits, params, reference_rng))
            << "spread " << spread << ", seed " << seed << ", top_p " << params.top_p << ", top_k " << params.top_k;
      }
    }
  }
}

TEST(Sampler, WeightsAreExpWithinTwoUlpAndZeroBelowTheNormalRange) {
  for (float x = -86.99f; x <= 0.0f; x += 0.00173f) {
    const double exact = std::exp(static_cast<double>(x));
    ASSERT_LE(std::fabs(sampling_weight(x) - exact) / exact, 2 * 0x1.0p-24) << x;
  }
  EXPECT_EQ(sampling_weight(0.0f), 1.0f);
  EXPECT_EQ(sampling_weight(-88.0f), 0.0f);
  EXPECT_EQ(sampling_weight(-INFINITY), 0.0f);
  EXPECT_EQ(sampling_weight(NAN), 0.0f);
}

TEST(Sampler, AnInfiniteLogitIsDrawnAndNothingOutsideTheKeptSetIs) {
  // +inf: every weight is exp(-inf) or NaN, so the draw runs past the end and takes the most likely token.
  Case c{.logits = {0.5f, INFINITY, 1.0f, 0, 0, 0, 0, 0}, .params = {.temperature = 1.0f}};
  EXPECT_EQ(histogram(c, 50), (std::map<int32_t, int>{{1, 50}}));
  // Tokens 100 below the best weigh nothing: never drawn, whatever u.
  Case far{.logits = {0.0f, -100.0f, -100.0f, -100.0f, -100.0f, -100.0f, -100.0f, -100.0f},
           .params = {.temperature = 1.0f}};
  EXPECT_EQ(histogram(far, 200), (std::map<int32_t, int>{{0, 200}}));
}

TEST(Sampler, NanLogitsAreNeverDrawn) {
  Case c{.logits = {NAN, 1.0f, NAN, 0.5f, NAN, NAN, NAN, NAN}, .params = {.temperature = 1.0f}};
  const auto counts = histogram(c, 500);
  EXPECT_EQ(counts.count(0) + counts.count(2), 0u);
  EXPECT_EQ(counts.at(1) + counts.at(3), 500);
  EXPECT_EQ(greedy(c), 1);
  c.params = {.temperature = 0.0f, .logprobs = 2};
  std::mt19937_64 rng(0);
  const SampledToken token = sample(c, rng);
  ASSERT_EQ(token.logprobs->top.size(), 2u);  // NaN logits are not among the most likely either
  EXPECT_EQ(token.logprobs->top[0].token_id, 1);
  EXPECT_EQ(token.logprobs->top[1].token_id, 3);
  EXPECT_NEAR(token.logprobs->top[0].logprob, 1.0 - std::log(std::exp(1.0) + std::exp(0.5)), 1e-6);
}

// The engine hands a request that needs nothing but logits to the backend's draw with token_draw(params, rng): the
// tokens and the generator's state afterwards must be those of sample_token with the same seed.
TEST(Sampler, TheBackendsDrawWithTokenDrawIsTheSamplersToken) {
  std::mt19937 values(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const SamplingParams& params : {SamplingParams{.temperature = 0.0f}, SamplingParams{.temperature = 0.7f},
                                       SamplingParams{.temperature = 1.0f, .top_p = 0.9f, .top_k = 20},
                                       SamplingParams{.temperature = 1.2f, .min_p = 0.1f}}) {
    std::mt19937_64 sampler_rng(5), draw_rng(5);
    for (int i = 0; i < 50; ++i) {
      std::vector<float> logits(1000);
      for (float& l : logits) l = normal(values);
      std::vector<float> copy = logits;
      const Case c{.logits = logits, .params = params};
      ASSERT_TRUE(needs_only_logits(SamplingInput{.params = c.params, .prompt = c.prompt, .output = c.output,
                                                  .eos_token_ids = c.eos, .rng = draw_rng}));
      const int32_t expected = sample(c, sampler_rng).token_id;
      EXPECT_EQ(draw_token(copy, token_draw(params, draw_rng)), expected) << "temperature " << params.temperature;
    }
    EXPECT_EQ(sampler_rng(), draw_rng()) << "temperature " << params.temperature;
  }
}

// What the backend's draw cannot do stays with the sampler: logprobs, logit bias, penalties, and EOS or stop ids
// suppressed before min_tokens.
TEST(Sampler, OnlyRequestsThatNeedNothingButLogitsGoToTheBackendsDraw) {
  std::mt19937_64 rng(1);
  const std::vector<int32_t> eos = {kEos}, none, one_token = {3};
  const auto only_logits = [&](const SamplingParams& params, const std::vector<int32_t>& output,
                               const std::vector<int32_t>& eos_ids) {
    return needs_only_logits(
        SamplingInput{.params = params, .prompt = one_token, .output = output, .eos_token_ids = eos_ids, .rng = rng});
  };
  EXPECT_TRUE(only_logits({}, none, eos));
  EXPECT_TRUE(only_logits({.temperature = 0.5f, .top_p = 0.5f, .top_k = 3, .min_p = 0.1f, .seed = 4}, none, eos));
  EXPECT_FALSE(only_logits({.logprobs = 0}, none, eos));
  EXPECT_FALSE(only_logits({.logit_bias = {{2, 1.0f}}}, none, eos));
  EXPECT_FALSE(only_logits({.repetition_penalty = 1.1f}, none, eos));
  EXPECT_FALSE(only_logits({.frequency_penalty = 0.5f}, none, eos));
  EXPECT_FALSE(only_logits({.presence_penalty = -0.5f}, none, eos));
  EXPECT_FALSE(only_logits({.min_tokens = 2}, one_token, eos));                      // EOS still suppressed
  EXPECT_TRUE(only_logits({.min_tokens = 1}, one_token, eos));                       // reached
  EXPECT_TRUE(only_logits({.min_tokens = 2, .ignore_eos = true}, one_token, eos));   // nothing to suppress
  EXPECT_FALSE(only_logits({.min_tokens = 2, .stop_token_ids = {5}, .ignore_eos = true}, one_token, eos));
  EXPECT_TRUE(only_logits({.min_tokens = 2}, one_token, none));
}

TEST(SamplingParams, OutOfRangeValuesAreRefusedNamingTheField) {
  const auto refuses = [](SamplingParams p, const char* field) {
    try {
      validate_sampling_params(p, 8, 5);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted a bad " << field;
  };
  refuses({.n = 0}, "n must");
  refuses({.temperature = -1.0f}, "temperature");
  refuses({.top_p = 0.0f}, "top_p");
  refuses({.top_k = -2}, "top_k");
  refuses({.min_p = 1.5f}, "min_p");
  refuses({.presence_penalty = 3.0f}, "presence_penalty");
  refuses({.frequency_penalty = -3.0f}, "frequency_penalty");
  refuses({.repetition_penalty = 0.0f}, "repetition_penalty");
  refuses({.logit_bias = {{8, 1.0f}}}, "logit_bias");
  refuses({.max_tokens = 0}, "max_tokens");
  refuses({.max_tokens = 2, .min_tokens = 3}, "min_tokens");
  refuses({.stop_token_ids = {-1}}, "stop_token_ids");
  refuses({.logprobs = 6}, "logprobs");
  EXPECT_NO_THROW(validate_sampling_params({.top_k = -1, .logprobs = 5}, 8, 5));
}

}  // namespace
}  // namespace kestrel
