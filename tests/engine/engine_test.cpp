// The engine on a golden fixture model (vocab 256, token ids only) — the acceptance points of issue 5:
//   - greedy tokens equal a plain greedy loop over the model's forward (the engine computes the right thing);
//   - batch invariance: a request's tokens and logprobs are bit-identical alone and among 16 others;
//   - prefix caching: a repeated prompt reports cached tokens and yields logprobs (over the whole vocabulary, i.e.
//     the logits up to a constant) bit-identical to an engine without the cache;
//   - preemption with a tiny cache recomputes and changes nothing;
//   - seeds, n > 1, EOS ids, the threaded Engine facade (streams, stop, abort, refusals, drain).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <memory>
#include <random>
#include <vector>

#include "../formats/expect_error.h"
#include "../formats/safetensors_builder.h"
#include "../model/golden_fixture.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"

namespace kestrel {
namespace {

constexpr const char* kFixture = "bf16_hc4_kp4";

Glm5NextModel& fixture_model() {
  static CpuBackend backend;
  static const std::unique_ptr<Glm5NextModel> model = Glm5NextModel::load(testing::golden_dir(kFixture), backend);
  return *model;
}

std::vector<int32_t> random_prompt(uint64_t seed, int64_t length) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(length));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 256);
  return tokens;
}

struct Completion {
  std::vector<int32_t> tokens{};
  std::vector<SampleLogprobs> logprobs{};
  std::optional<FinishReason> finish_reason{};
  int64_t num_cached_tokens = 0;
};

// Collects one request's outputs by completion index.
struct Collector final : OutputSink {
  std::map<int64_t, Completion> completions;
  void push(RequestOutput output) override {
    Completion& c = completions[output.index];
    c.tokens.insert(c.tokens.end(), output.token_ids.begin(), output.token_ids.end());
    c.logprobs.insert(c.logprobs.end(), output.logprobs.begin(), output.logprobs.end());
    if (output.finish_reason) c.finish_reason = output.finish_reason;
    c.num_cached_tokens = output.num_cached_tokens;
  }
};

struct Job {
  std::vector<int32_t> prompt{};
  SamplingParams params{};
  int64_t start_step = 0;  // submitted before this step
};

// Runs `jobs` through one EngineCore, stepping synchronously; returns each job's outputs.
std::vector<std::shared_ptr<Collector>> run_jobs(EngineCore& core, const std::vector<Job>& jobs) {
  std::vector<std::shared_ptr<Collector>> sinks;
  for (size_t i = 0; i < jobs.size(); ++i) sinks.push_back(std::make_shared<Collector>());
  static uint64_t next_id = 1;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < jobs.size(); ++i) ids.push_back(next_id++);
  size_t submitted = 0;
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].start_step < jobs[b].start_step; });
  for (int64_t step = 0; submitted < jobs.size() || core.has_unfinished_requests(); ++step) {
    for (; submitted < jobs.size() && jobs[order[submitted]].start_step <= step; ++submitted) {
      const Job& job = jobs[order[submitted]];
      core.add_request(ids[order[submitted]], job.prompt, job.params, "", sinks[order[submitted]]);
    }
    core.step();
  }
  return sinks;
}

Completion run_alone(const EngineConfig& config, const Job& job) {
  EngineCore core(fixture_model(), config);
  return run_jobs(core, {job})[0]->completions.at(0);
}

void expect_same_logprobs(const std::vector<SampleLogprobs>& a, const std::vector<SampleLogprobs>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].logprob, b[t].logprob) << "token " << t;
    EXPECT_EQ(a[t].rank, b[t].rank) << "token " << t;
    ASSERT_EQ(a[t].top.size(), b[t].top.size());
    for (size_t k = 0; k < a[t].top.size(); ++k) {
      EXPECT_EQ(a[t].top[k].token_id, b[t].top[k].token_id) << "token " << t << " top " << k;
      EXPECT_EQ(a[t].top[k].logprob, b[t].top[k].logprob) << "token " << t << " top " << k;
    }
  }
}

SamplingParams greedy(int64_t max_tokens, std::optional<int64_t> logprobs = std::nullopt) {
  return SamplingParams{.temperature = 0.0f, .max_tokens = max_tokens, .logprobs = logprobs};
}

TEST(EngineCore, GreedyTokensEqualAPlainGreedyLoopOverTheModel) {
  Glm5NextModel& model = fixture_model();
  const std::vector<int32_t> prompt = random_prompt(1, 37);
  const int64_t max_tokens = 12;

  // The split the engine promises: one call per cache block of the prompt, then one per token.
  const auto sequence = model.new_sequence();
  std::vector<int32_t> expected;
  std::vector<float> logits;
  for (size_t start = 0; start < prompt.size(); start += 16) {
    const size_t length = std::min<size_t>(16, prompt.size() - start);
    logits = model.forward(*sequence, std::span(prompt).subspan(start, length), ForwardOptions{.all_logits = false});
  }
  for (int64_t i = 0; i < max_tokens; ++i) {
    const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    expected.push_back(best);
    const int32_t next[] = {best};
    logits = model.forward(*sequence, next, ForwardOptions{.all_logits = false});
  }

  const Completion alone =
      run_alone(EngineConfig{.max_model_len = 256}, {.prompt = prompt, .params = greedy(max_tokens)});
  EXPECT_EQ(alone.tokens, expected);
  EXPECT_EQ(alone.finish_reason, FinishReason::length);
}

// A request's tokens and log-probabilities do not depend on what else runs with it: the CPU ops compute each row
// alone, so its rows in a batched pass equal those of a lone one exactly.
TEST(EngineCore, BatchInvarianceTokensAndLogprobsAreTheSameAloneAndAmong16Others) {
  const EngineConfig config{.max_model_len = 256, .max_num_seqs = 17, .max_num_batched_tokens = 48};
  const Job target{.prompt = random_prompt(7, 37), .params = greedy(24, 5)};
  const Completion alone = run_alone(config, target);

  std::vector<Job> jobs;
  for (int i = 0; i < 16; ++i) {
    SamplingParams params = greedy(8 + i % 5 * 4);
    if (i % 3 == 0) params = SamplingParams{.temperature = 0.8f, .top_p = 0.9f, .seed = uint64_t(i), .max_tokens = 16};
    // Some arrive with the target, some before and after it, so that it shares steps with prompts and decodes.
    jobs.push_back({.prompt = random_prompt(100 + i, 1 + i * 5 % 70), .params = params, .start_step = i % 4});
  }
  jobs.insert(jobs.begin() + 8, Job{.prompt = target.prompt, .params = target.params, .start_step = 2});
  EngineCore core(fixture_model(), config);
  const auto sinks = run_jobs(core, jobs);
  const Completion& batched = sinks[8]->completions.at(0);
  EXPECT_EQ(batched.tokens, alone.tokens);
  expect_same_logprobs(batched.logprobs, alone.logprobs);
  EXPECT_GT(core.stats().scheduler.generation_tokens, 24 + 16 * 8);

  // Every other greedy request too.
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (j == 8 || !jobs[j].params.greedy()) continue;
    EXPECT_EQ(sinks[j]->completions.at(0).tokens, run_alone(config, jobs[j]).tokens) << "job " << j;
  }
}

TEST(EngineCore, ARepeatedPromptIsServedFromThePrefixCacheWithIdenticalLogits) {
  EngineConfig config{.max_model_len = 256, .max_logprobs = 256};
  const std::vector<int32_t> prompt = random_prompt(3, 45);  // two full blocks of 16, then 13 tokens
  const Job job{.prompt = prompt, .params = greedy(6, 256)};
  std::vector<int32_t> follow_up = prompt;  // a later turn of the same conversation
  follow_up.insert(follow_up.end(), {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21});
  const Job longer{.prompt = follow_up, .params = greedy(6, 256)};

  config.enable_prefix_caching = false;
  const Completion uncached = run_alone(config, job);
  const Completion uncached_longer = run_alone(config, longer);
  EXPECT_EQ(uncached.num_cached_tokens, 0);

  config.enable_prefix_caching = true;
  EngineCore core(fixture_model(), config);
  const Completion first = run_jobs(core, {job})[0]->completions.at(0);
  const Completion repeated = run_jobs(core, {job})[0]->completions.at(0);
  const Completion extended = run_jobs(core, {longer})[0]->completions.at(0);
  EXPECT_EQ(first.num_cached_tokens, 0);
  EXPECT_EQ(repeated.num_cached_tokens, 32);
  EXPECT_EQ(extended.num_cached_tokens, 32);  // the first prompt's full blocks; its tail was never a full block
  EXPECT_EQ(core.stats().cache.prefix_cache_queries, 45 + 45 + 62);
  EXPECT_EQ(core.stats().cache.prefix_cache_hits, 32 + 32);

  EXPECT_EQ(repeated.tokens, uncached.tokens);
  expect_same_logprobs(repeated.logprobs, uncached.logprobs);
  ASSERT_EQ(repeated.logprobs.front().top.size(), 256u);  // the whole distribution: the logits up to a constant
  EXPECT_EQ(extended.tokens, uncached_longer.tokens);
  expect_same_logprobs(extended.logprobs, uncached_longer.logprobs);
}

TEST(EngineCore, PreemptionWithATinyCacheRecomputesAndChangesNoToken) {
  // 4 blocks of 16 hold one sequence of max_model_len 64; 6 blocks cannot hold four growing ones.
  for (const bool prefix_caching : {false, true}) {
    const EngineConfig config{.max_model_len = 64, .max_num_seqs = 4, .num_blocks = 6,
                              .enable_prefix_caching = prefix_caching};
    std::vector<Job> jobs;
    for (int i = 0; i < 4; ++i) jobs.push_back({.prompt = random_prompt(40 + i, 18 + i), .params = greedy(30)});
    jobs[3].params = SamplingParams{.temperature = 1.0f, .seed = 5, .max_tokens = 30};  // its generator carries over
    EngineCore core(fixture_model(), config);
    const auto sinks = run_jobs(core, jobs);
    EXPECT_GT(core.stats().scheduler.num_preemptions, 0) << "prefix caching " << prefix_caching;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const Completion& c = sinks[j]->completions.at(0);
      EXPECT_EQ(c.finish_reason, FinishReason::length);
      EXPECT_EQ(c.tokens, run_alone(config, jobs[j]).tokens) << "job " << j << ", prefix caching " << prefix_caching;
    }
  }
}

TEST(EngineCore, SeedsRepeatAndNCompletionsDifferAndShareThePrompt) {
  const EngineConfig config{.max_model_len = 256};
  const Job job{.prompt = random_prompt(9, 40),
                .params = SamplingParams{.n = 3, .temperature = 1.0f, .seed = 1234, .max_tokens = 12}};
  EngineCore core(fixture_model(), config);
  const auto first = run_jobs(core, {job})[0];
  ASSERT_EQ(first->completions.size(), 3u);
  EXPECT_NE(first->completions.at(0).tokens, first->completions.at(1).tokens);
  EXPECT_NE(first->completions.at(1).tokens, first->completions.at(2).tokens);
  EXPECT_EQ(first->completions.at(0).num_cached_tokens, 0);
  EXPECT_EQ(first->completions.at(1).num_cached_tokens, 32);  // the siblings reuse the first one's prompt

  // The same seed gives the same completions, in another engine and among other requests.
  EngineCore other(fixture_model(), EngineConfig{.max_model_len = 256, .enable_prefix_caching = false});
  const auto again = run_jobs(other, {{.prompt = random_prompt(1, 30), .params = greedy(10)}, job,
                                      {.prompt = random_prompt(2, 50), .params = {.seed = 1, .max_tokens = 10}}})[1];
  for (int64_t index = 0; index < 3; ++index) {
    EXPECT_EQ(again->completions.at(index).tokens, first->completions.at(index).tokens) << index;
  }
  Job reseeded = job;
  reseeded.params.seed = 99;
  EXPECT_NE(run_jobs(core, {reseeded})[0]->completions.at(0).tokens, first->completions.at(0).tokens);
}

TEST(EngineCore, EosIdsStopUnlessIgnored) {
  const Job probe{.prompt = random_prompt(11, 20), .params = greedy(10)};
  const std::vector<int32_t> free_run = run_alone(EngineConfig{.max_model_len = 256}, probe).tokens;
  ASSERT_EQ(free_run.size(), 10u);
  const int32_t eos = free_run[4];
  const auto first_eos = std::ranges::find(free_run, eos) - free_run.begin();

  const Completion stopped = run_alone(EngineConfig{.max_model_len = 256, .eos_token_ids = {eos}}, probe);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + first_eos + 1));
  EXPECT_EQ(stopped.finish_reason, FinishReason::stop);

  Job ignoring = probe;
  ignoring.params.ignore_eos = true;
  EXPECT_EQ(run_alone(EngineConfig{.max_model_len = 256, .eos_token_ids = {eos}}, ignoring).tokens, free_run);
}

TEST(EngineConfig, EosIdsComeFromConfigAndGenerationConfig) {
  const testing::ScratchDir dir;
  Glm5NextConfig model = fixture_model().config();
  model.eos_token_ids = {3};
  EXPECT_EQ(model_eos_token_ids(dir.path(), model), std::vector<int32_t>{3});
  testing::write_file(dir.file("generation_config.json"), R"({"eos_token_id": [9, 3, 5]})");
  EXPECT_EQ(model_eos_token_ids(dir.path(), model), (std::vector<int32_t>{3, 5, 9}));
}

TEST(EngineConfig, LimitsAreCheckedNamingTheSetting) {
  const Glm5NextConfig& model = fixture_model().config();
  testing::expect_error([&] { resolve_engine_config({.block_size = 6}, model); }, {"block_size", "index_kpool"});
  testing::expect_error([&] { resolve_engine_config({.max_num_batched_tokens = 8}, model); },
                        {"max_num_batched_tokens"});
  testing::expect_error([&] { resolve_engine_config({.max_model_len = 64, .num_blocks = 3}, model); },
                        {"cannot hold one sequence"});
  testing::expect_error([&] { resolve_engine_config({.eos_token_ids = {256}}, model); }, {"EOS token id 256"});
  const EngineConfig resolved = resolve_engine_config({}, model);
  EXPECT_EQ(resolved.max_model_len, model.max_position_embeddings);
  EXPECT_EQ(resolved.num_kda_snapshots, 2 * resolved.max_num_seqs);
}

// On a GPU the cache gets what --gpu-memory-utilization leaves after the memory in use and the KDA slots, in whole
// blocks; too little for one max_model_len sequence is an Error giving the longest context that fits.
TEST(EngineConfig, OnADeviceTheCacheGetsTheMemoryLeftUnderTheUtilization) {
  const Glm5NextConfig& model = fixture_model().config();
  const size_t block = CachePools::block_bytes(model, 16, CacheDtype::float32);
  const size_t slots = 4 * static_cast<size_t>(SequenceState::kda_state_size(model)) * sizeof(float);
  ASSERT_GT(block, 0u);
  const size_t total = size_t{1} << 30, in_use = 100u << 20;
  const EngineConfig resolved = resolve_engine_config(
      {.max_model_len = 256, .max_num_seqs = 4, .gpu_memory_utilization = 0.5}, model,
      DeviceMemory{.free_bytes = total - in_use, .total_bytes = total});
  EXPECT_EQ(resolved.num_blocks, static_cast<int64_t>((total / 2 - in_use - slots) / block));
  // A block count asked for is kept; the device's memory is not consulted.
  EXPECT_EQ(resolve_engine_config({.max_model_len = 256, .num_blocks = 40}, model,
                                  DeviceMemory{.free_bytes = 0, .total_bytes = total})
                .num_blocks,
            40);
  // Room for 10 blocks, one 256-token sequence needs 16.
  const size_t tight = in_use + slots + 10 * block + block / 2;
  testing::expect_error(
      [&] {
        resolve_engine_config({.max_model_len = 256, .max_num_seqs = 4, .gpu_memory_utilization = 1.0}, model,
                              DeviceMemory{.free_bytes = tight - in_use, .total_bytes = tight});
      },
      {"max_model_len 256", "longest context that fits is 160 tokens", "--gpu-memory-utilization"});
  testing::expect_error(
      [&] {
        resolve_engine_config({.gpu_memory_utilization = 1.5}, model, DeviceMemory{.free_bytes = 1, .total_bytes = 1});
      },
      {"gpu_memory_utilization"});
}

// --kv-cache-dtype sizes the latents' rows: a block of fp8 latents (a byte a value and a float32 scale per 128,
// padded to 16 bytes) or bf16 ones takes less memory than float32, so the same GPU memory holds more blocks; the
// indexer's rows stay float32.
TEST(EngineConfig, SmallerLatentRowsGiveMoreCacheBlocks) {
  const Glm5NextConfig& model = fixture_model().config();
  const auto layers = static_cast<size_t>(std::count(model.layer_types.begin(), model.layer_types.end(),
                                                     LayerType::sparse_attention));
  const auto rank = static_cast<size_t>(model.kv_lora_rank), index = static_cast<size_t>(model.index_head_dim);
  const size_t indexer = 16 * 2 * 4 * index + 16 / static_cast<size_t>(model.index_kpool) * 4 * index;
  const auto padded = [](size_t bytes) { return (bytes + 15) / 16 * 16; };
  EXPECT_EQ(CachePools::block_bytes(model, 16, CacheDtype::float32), layers * (16 * 4 * rank + indexer));
  EXPECT_EQ(CachePools::block_bytes(model, 16, CacheDtype::bf16), layers * (16 * padded(2 * rank) + indexer));
  const size_t fp8_row = padded((rank + 3) / 4 * 4 + 4 * ((rank + 127) / 128));
  EXPECT_EQ(CachePools::block_bytes(model, 16, CacheDtype::fp8_e4m3), layers * (16 * fp8_row + indexer));

  const size_t total = size_t{1} << 30, in_use = 100u << 20;
  const size_t slots = 4 * static_cast<size_t>(SequenceState::kda_state_size(model)) * sizeof(float);
  for (const CacheDtype dtype : {CacheDtype::float32, CacheDtype::bf16, CacheDtype::fp8_e4m3}) {
    const EngineConfig resolved = resolve_engine_config(
        {.max_model_len = 256, .max_num_seqs = 4, .gpu_memory_utilization = 0.5, .kv_cache_dtype = dtype}, model,
        DeviceMemory{.free_bytes = total - in_use, .total_bytes = total});
    EXPECT_EQ(resolved.num_blocks,
              static_cast<int64_t>((total / 2 - in_use - slots) / CachePools::block_bytes(model, 16, dtype)))
        << cache_dtype_name(dtype);
  }
}

TEST(Engine, StreamsOutputsAndRefusesWhatItCannotServe) {
  Engine engine(std::make_unique<EngineCore>(fixture_model(), EngineConfig{.max_model_len = 64}));
  testing::expect_error([&] { engine.submit({.prompt_token_ids = random_prompt(1, 65), .sampling = greedy(4)}); },
                        {"65 tokens", "max_model_len 64"});
  testing::expect_error([&] { engine.submit({.prompt_token_ids = {}, .sampling = greedy(4)}); }, {"empty"});
  testing::expect_error([&] { engine.submit({.prompt_token_ids = {300}, .sampling = greedy(4)}); }, {"300"});
  testing::expect_error(
      [&] { engine.submit({.prompt_token_ids = {1}, .sampling = {.temperature = -1.0f}}); }, {"temperature"});

  const Job job{.prompt = random_prompt(5, 30), .params = greedy(8)};
  const Completion expected = run_alone(EngineConfig{.max_model_len = 64}, job);
  int notified = 0;
  std::mutex mutex;
  const auto stream = engine.submit({.prompt_token_ids = job.prompt, .sampling = job.params}, [&] {
    std::lock_guard lock(mutex);
    ++notified;
  });
  std::vector<int32_t> tokens;
  std::optional<FinishReason> reason;
  int64_t outputs = 0;
  while (auto output = stream->next()) {
    ++outputs;
    tokens.insert(tokens.end(), output->token_ids.begin(), output->token_ids.end());
    if (output->finish_reason) reason = output->finish_reason;
    EXPECT_EQ(output->num_prompt_tokens, 30);
  }
  EXPECT_TRUE(stream->finished());
  EXPECT_EQ(tokens, expected.tokens);
  EXPECT_EQ(reason, FinishReason::length);
  engine.drain();  // the last notify runs after its output is visible
  std::lock_guard lock(mutex);
  EXPECT_EQ(notified, outputs);
}

TEST(Engine, StopEndsOneCompletionAndDroppingAStreamAbortsTheRest) {
  Engine engine(std::make_unique<EngineCore>(fixture_model(), EngineConfig{.max_model_len = 256}));
  auto stream = engine.submit({.prompt_token_ids = random_prompt(6, 20),
                               .sampling = {.n = 2, .temperature = 1.0f, .seed = 3, .max_tokens = 200}});
  // As a server does when a stop string matches in completion 1's text.
  std::map<int64_t, std::optional<FinishReason>> reasons;
  bool stopped = false;
  while (!reasons[1]) {
    const auto output = stream->next();
    ASSERT_TRUE(output.has_value());
    if (output->finish_reason) reasons[output->index] = output->finish_reason;
    if (output->index == 1 && output->num_output_tokens >= 3 && !stopped) {
      stream->stop(1);
      stopped = true;
    }
  }
  EXPECT_EQ(reasons[1], FinishReason::stop);
  EXPECT_FALSE(reasons[0].has_value());
  stream.reset();  // a client gone: completion 0 is aborted and its memory freed
  engine.drain();
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.scheduler.num_running + stats.scheduler.num_waiting, 0);
  EXPECT_EQ(stats.scheduler.num_finished[static_cast<size_t>(FinishReason::abort)], 1);
  EXPECT_EQ(stats.kv_cache_usage, 0.0);
  testing::expect_error([&] { engine.submit({.prompt_token_ids = {1}, .sampling = greedy(1)}); }, {"shutting down"});
}

}  // namespace
}  // namespace kestrel
