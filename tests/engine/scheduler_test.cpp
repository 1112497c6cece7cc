// The scheduler without a model (as vLLM's tests/v1/core/test_scheduler.py): which chunks it picks under the token
// budget, admission by sequences and memory, preemption with recompute, stop conditions and caller finishes. Sampled
// tokens are made up by the test; the model's part is covered by engine_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "../model/golden_fixture.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/scheduler.h"

namespace kestrel {
namespace {

struct Collector final : OutputSink {
  std::vector<RequestOutput> outputs;
  void push(RequestOutput output) override { outputs.push_back(std::move(output)); }

  std::vector<int32_t> tokens(int64_t index = 0) const {
    std::vector<int32_t> ids;
    for (const RequestOutput& o : outputs) {
      if (o.index == index) ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
    }
    return ids;
  }
  std::optional<FinishReason> finish_reason(int64_t index = 0) const {
    for (const RequestOutput& o : outputs) {
      if (o.index == index && o.finish_reason) return o.finish_reason;
    }
    return std::nullopt;
  }
};

struct Chunk {
  uint64_t id;
  int64_t start, end;
  bool operator==(const Chunk&) const = default;
};

void PrintTo(const Chunk& c, std::ostream* os) { *os << "{" << c.id << ": " << c.start << ".." << c.end << "}"; }

class SchedulerTest : public ::testing::Test {
protected:
  static constexpr int64_t B = 4;
  Glm5NextConfig model = load_glm5_next_config(testing::golden_dir("bf16_hc4_kp4") + "/config.json");
  CpuBackend backend;
  std::unique_ptr<CacheManager> cache;
  std::unique_ptr<Scheduler> scheduler;
  std::map<uint64_t, std::shared_ptr<Collector>> sinks;

  void SetUp() override { configure({}); }

  struct Limits {
    int64_t max_num_seqs = 8, max_num_batched_tokens = 64, max_model_len = 256, num_blocks = 256;
    bool prefix_caching = false;
    std::vector<int32_t> eos = {255};
  };
  void configure(const Limits& l) {
    scheduler.reset();
    cache = std::make_unique<CacheManager>(model, backend,
                                           CacheConfig{.block_size = B,
                                                       .num_blocks = l.num_blocks,
                                                       .num_slots = l.max_num_seqs,
                                                       .num_kda_snapshots = 16,
                                                       .enable_prefix_caching = l.prefix_caching});
    scheduler = std::make_unique<Scheduler>(SchedulerConfig{.max_num_seqs = l.max_num_seqs,
                                                            .max_num_batched_tokens = l.max_num_batched_tokens,
                                                            .max_model_len = l.max_model_len,
                                                            .wait_for_shared_prompt = l.prefix_caching,
                                                            .eos_token_ids = l.eos},
                                            *cache);
  }

  void add(uint64_t id, int64_t prompt_length, SamplingParams params = {.max_tokens = 100}) {
    auto& sink = sinks[id];
    if (!sink) sink = std::make_shared<Collector>();
    const auto group = params.n > 1 ? std::make_shared<RequestGroup>() : nullptr;
    for (int64_t index = 0; index < params.n; ++index) {
      auto request = std::make_unique<Request>();
      request->id = id;
      request->index = index;
      request->token_ids.resize(static_cast<size_t>(prompt_length));
      std::iota(request->token_ids.begin(), request->token_ids.end(), static_cast<int32_t>(id));
      request->num_prompt_tokens = prompt_length;
      request->params = params;
      request->params.n = 1;
      request->sink = sink;
      request->group = group;
      request->leads_group = index == 0;
      scheduler->add(std::move(request));
    }
  }

  // One step; a sampling chunk gets token `next(request)` (by default 1). Returns the chunks scheduled.
  std::vector<Chunk> step(const std::function<int32_t(const Request&)>& next = {}) {
    const SchedulerOutput output = scheduler->schedule();
    std::vector<Chunk> chunks;
    std::vector<std::optional<SampledToken>> sampled(output.chunks.size());
    int64_t total = 0;
    for (size_t i = 0; i < output.chunks.size(); ++i) {
      const ScheduledChunk& c = output.chunks[i];
      chunks.push_back({c.request->id, c.start, c.end});
      total += c.end - c.start;
      if (c.samples()) sampled[i] = SampledToken{.token_id = next ? next(*c.request) : 1, .logprobs = {}};
    }
    EXPECT_EQ(total, output.num_scheduled_tokens);
    scheduler->update(output, sampled);
    return chunks;
  }
};

TEST_F(SchedulerTest, PromptsAreChunkedAtBlockBoundariesWithinTheBudget) {
  configure({.max_num_batched_tokens = 10});
  add(1, 23);
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 0, 8}}));  // 10 rounded down to whole blocks
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 8, 16}}));
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 16, 23}}));  // the prompt's end need not be a block boundary
  EXPECT_EQ(sinks[1]->tokens().size(), 1u);
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 23, 24}}));
}

TEST_F(SchedulerTest, DecodesComeFirstThenRunningPromptsThenWaitingRequests) {
  configure({.max_num_batched_tokens = 12});
  add(1, 3);
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 0, 3}}));
  add(2, 20);
  add(3, 5);
  // 1 decodes (1 token), 2 is admitted with 11 rounded down to 8; the 3 left are less than a block, so 3 waits.
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 3, 4}, {2, 0, 8}}));
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 4, 5}, {2, 8, 16}}));
  // 2's last 4 prompt tokens, then 3's whole prompt (5 <= 12 - 1 - 4).
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 5, 6}, {2, 16, 20}, {3, 0, 5}}));
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 6, 7}, {2, 20, 21}, {3, 5, 6}}));
}

TEST_F(SchedulerTest, AtMostMaxNumSeqsRunAndTheRestWaitInArrivalOrder) {
  configure({.max_num_seqs = 2});
  add(1, 4, {.max_tokens = 2});
  add(2, 4, {.max_tokens = 3});
  add(3, 4, {.max_tokens = 1});
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 0, 4}, {2, 0, 4}}));
  EXPECT_EQ(scheduler->stats().num_waiting, 1);
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 4, 5}, {2, 4, 5}}));  // 1 finishes (2 tokens)
  EXPECT_EQ(sinks[1]->finish_reason(), FinishReason::length);
  EXPECT_EQ(step(), (std::vector<Chunk>{{2, 5, 6}, {3, 0, 4}}));
  EXPECT_FALSE(scheduler->has_unfinished());
}

TEST_F(SchedulerTest, AFullCacheQueuesRequestsInsteadOfFailingThem) {
  configure({.max_model_len = 16, .num_blocks = 5});
  add(1, 16, {.max_tokens = 1});  // 4 blocks
  add(2, 8, {.max_tokens = 1});   // 2 blocks: only 1 left, so it waits
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 0, 16}}));
  EXPECT_EQ(scheduler->stats().num_waiting, 1);
  EXPECT_EQ(step(), (std::vector<Chunk>{{2, 0, 8}}));  // 1 finished and freed its blocks
  EXPECT_EQ(sinks[2]->finish_reason(), FinishReason::length);
  EXPECT_EQ(scheduler->stats().num_preemptions, 0);
}

TEST_F(SchedulerTest, RunningOutOfBlocksPreemptsTheLatestRequestWhichIsRecomputedLater) {
  configure({.max_model_len = 16, .num_blocks = 4});
  add(1, 7, {.max_tokens = 6});
  add(2, 6, {.max_tokens = 6});
  const auto next = [](const Request& r) { return static_cast<int32_t>(r.num_tokens() % 200); };
  EXPECT_EQ(step(next), (std::vector<Chunk>{{1, 0, 7}, {2, 0, 6}}));  // 2 blocks each
  EXPECT_EQ(step(next), (std::vector<Chunk>{{1, 7, 8}, {2, 6, 7}}));
  // 1 needs a third block for token 8: 2, admitted last, is preempted and goes back to the head of the queue.
  EXPECT_EQ(step(next), (std::vector<Chunk>{{1, 8, 9}}));
  EXPECT_EQ(scheduler->stats().num_preemptions, 1);
  EXPECT_EQ(scheduler->stats().num_waiting, 1);
  for (int i = 0; i < 3; ++i) step(next);  // 1 runs to its 6 tokens
  EXPECT_EQ(sinks[1]->finish_reason(), FinishReason::length);
  // 2 recomputes its prompt and its two generated tokens in one chunk (the replay), then goes on.
  EXPECT_EQ(step(next), (std::vector<Chunk>{{2, 0, 8}}));
  while (scheduler->has_unfinished()) step(next);
  EXPECT_EQ(sinks[2]->tokens(), (std::vector<int32_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(sinks[2]->finish_reason(), FinishReason::length);
}

TEST_F(SchedulerTest, TheLatestRequestPreemptsItselfWhenItCannotGrow) {
  configure({.max_model_len = 16, .num_blocks = 4});
  add(1, 5, {.max_tokens = 3});
  add(2, 8, {.max_tokens = 3});
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 0, 5}, {2, 0, 8}}));
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 5, 6}}));  // 2 needs a third block; nobody after it can yield one
  EXPECT_EQ(scheduler->stats().num_preemptions, 1);
  while (scheduler->has_unfinished()) step();
  EXPECT_EQ(sinks[2]->tokens().size(), 3u);
  EXPECT_EQ(sinks[2]->finish_reason(), FinishReason::length);
}

TEST_F(SchedulerTest, EosStopsAfterMinTokensUnlessIgnored) {
  add(1, 4, {.max_tokens = 10});
  add(2, 4, {.max_tokens = 10, .min_tokens = 3});
  add(3, 4, {.max_tokens = 3, .ignore_eos = true});
  while (scheduler->has_unfinished()) step([](const Request&) { return 255; });  // always EOS
  EXPECT_EQ(sinks[1]->tokens(), std::vector<int32_t>{255});
  EXPECT_EQ(sinks[1]->finish_reason(), FinishReason::stop);
  EXPECT_FALSE(sinks[1]->outputs.back().stop_token_id.has_value());
  EXPECT_EQ(sinks[2]->tokens(), (std::vector<int32_t>{255, 255, 255}));
  EXPECT_EQ(sinks[2]->finish_reason(), FinishReason::stop);
  EXPECT_EQ(sinks[3]->tokens(), (std::vector<int32_t>{255, 255, 255}));
  EXPECT_EQ(sinks[3]->finish_reason(), FinishReason::length);
  EXPECT_EQ(scheduler->stats().generation_tokens, 1 + 3 + 3);
}

TEST_F(SchedulerTest, MaxModelLenEndsARequestWithLength) {
  configure({.max_model_len = 12});
  add(1, 10, {});
  while (scheduler->has_unfinished()) step();
  EXPECT_EQ(sinks[1]->tokens().size(), 2u);
  EXPECT_EQ(sinks[1]->finish_reason(), FinishReason::length);
}

TEST_F(SchedulerTest, AStopTokenIdIsReported) {
  add(1, 4, {.max_tokens = 10, .stop_token_ids = {9}});
  while (scheduler->has_unfinished()) step([](const Request&) { return 9; });
  EXPECT_EQ(sinks[1]->outputs.back().stop_token_id, 9);
}

TEST_F(SchedulerTest, CallersFinishOneCompletionOrAWholeRequest) {
  add(1, 4, {.n = 2, .max_tokens = 50});
  add(2, 4, {.max_tokens = 50});
  step();
  step();
  scheduler->finish_later(1, 1, FinishReason::stop);  // a stop string matched in completion 1
  scheduler->finish_later(2, std::nullopt, FinishReason::abort);
  step();
  EXPECT_EQ(sinks[1]->finish_reason(1), FinishReason::stop);
  EXPECT_FALSE(sinks[1]->finish_reason(0).has_value());
  EXPECT_EQ(sinks[2]->finish_reason(), FinishReason::abort);
  EXPECT_EQ(scheduler->stats().num_running, 1);
  scheduler->finish_later(1, std::nullopt, FinishReason::abort);
  step();
  EXPECT_EQ(sinks[1]->finish_reason(0), FinishReason::abort);
  EXPECT_FALSE(scheduler->has_unfinished());
}

TEST_F(SchedulerTest, SiblingsWaitForTheFirstCompletionToCacheTheSharedPrompt) {
  configure({.prefix_caching = true});
  add(1, 10, {.n = 3, .max_tokens = 2});
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 0, 10}}));
  // The siblings resume on the first's two full blocks: only the partial one is computed again.
  EXPECT_EQ(step(), (std::vector<Chunk>{{1, 10, 11}, {1, 8, 10}, {1, 8, 10}}));
  while (scheduler->has_unfinished()) step();
  for (int64_t index = 0; index < 3; ++index) {
    const RequestOutput& last = [&]() -> const RequestOutput& {
      for (const RequestOutput& o : sinks[1]->outputs) {
        if (o.index == index && o.finish_reason) return o;
      }
      return sinks[1]->outputs.front();
    }();
    EXPECT_EQ(last.num_cached_tokens, index == 0 ? 0 : 8) << index;
  }
  EXPECT_EQ(cache->stats().prefix_cache_queries, 30);
  EXPECT_EQ(cache->stats().prefix_cache_hits, 16);
}

}  // namespace
}  // namespace kestrel
