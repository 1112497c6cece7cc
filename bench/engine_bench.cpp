// The engine's own per-step cost, without a model forward: Scheduler::schedule() + Scheduler::update() with the
// cache manager granting blocks, indexing prompt blocks and freeing finished requests, at 64 running sequences. The
// model has GLM-5.3-Flash's layout (45 layers, 16-token k-pools, so 16-token blocks) with small KDA state, since KDA
// snapshot copies are the runner's cost, not the scheduler's.
//
//   ninja -C build-e kestrel_bench && build-e/kestrel_bench --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/process_memory.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "formats/glm5_next_config.h"

namespace kestrel {
namespace {

constexpr int64_t kSequences = 64;

struct NullSink final : OutputSink {
  void push(RequestOutput) override {}
};

struct Harness {
  Glm5NextConfig model = parse_glm5_next_config(R"({"model_type": "glm5_next", "q_lora_rank": 1536,
                                                    "linear_attn_config": {"num_heads": 2, "head_dim": 16}})",
                                                "bench");
  CpuBackend backend;
  CacheManager cache;
  Scheduler scheduler;
  std::shared_ptr<NullSink> sink = std::make_shared<NullSink>();
  uint64_t next_id = 1;

  explicit Harness(bool prefix_caching)
      : cache(model, backend,
              CacheConfig{.block_size = 16,
                          .num_blocks = kSequences * 256,
                          .num_slots = kSequences,
                          .num_kda_snapshots = 2 * kSequences,
                          .enable_prefix_caching = prefix_caching}),
        scheduler(SchedulerConfig{.max_num_seqs = kSequences,
                                  .max_num_batched_tokens = 8192,
                                  .max_model_len = 4096,
                                  .wait_for_shared_prompt = prefix_caching,
                                  .eos_token_ids = {0}},
                  cache) {}

  void add(int64_t prompt_length, int64_t max_tokens) {
    auto request = std::make_unique<Request>();
    request->id = next_id++;
    request->token_ids.resize(static_cast<size_t>(prompt_length));
    // Requests share their first 256 tokens (a system prompt), then differ.
    std::iota(request->token_ids.begin(), request->token_ids.end(), 1);
    const auto own = static_cast<int32_t>(request->id * 7919 % 100000);
    for (int64_t t = 256; t < prompt_length; ++t) request->token_ids[static_cast<size_t>(t)] += own;
    request->num_prompt_tokens = prompt_length;
    request->params = SamplingParams{.max_tokens = max_tokens};
    request->sink = sink;
    scheduler.add(std::move(request));
  }

  // One step with a made-up token for every sampling chunk; returns the tokens scheduled.
  int64_t step() {
    const SchedulerOutput output = scheduler.schedule();
    std::vector<std::optional<SampledToken>> sampled(output.chunks.size());
    for (size_t i = 0; i < output.chunks.size(); ++i) {
      if (output.chunks[i].samples()) sampled[i] = SampledToken{.token_id = 17, .logprobs = {}};
    }
    scheduler.update(output, sampled);
    return output.num_scheduled_tokens;
  }
};

// 64 sequences decoding: one token each per step; a block is granted every 16 steps per sequence.
void BM_DecodeStep64(benchmark::State& state) {
  Harness h(/*prefix_caching=*/true);
  for (int64_t i = 0; i < kSequences; ++i) h.add(512, 1'000'000);
  // Prefill everyone first: the timed steps are decodes only.
  while (h.step() > kSequences || h.scheduler.stats().num_waiting > 0) {
  }
  int64_t tokens = 0;
  for (auto _ : state) {
    tokens += h.step();
    if (h.scheduler.stats().num_running < kSequences) state.SkipWithError("a sequence stopped");
  }
  state.counters["tokens/step"] =
      benchmark::Counter(static_cast<double>(tokens) / static_cast<double>(state.iterations()));
}
// A fixed count keeps every sequence below max_model_len (512 + 3000 < 4096).
BENCHMARK(BM_DecodeStep64)->Unit(benchmark::kMicrosecond)->Iterations(3000);

// 64 sequences with churn: each generates 64 tokens, then a new request (512-token prompt sharing 256 with the
// others, so prefix-cache lookups and indexing run) takes its place.
void BM_ChurnStep64(benchmark::State& state) {
  Harness h(/*prefix_caching=*/true);
  for (int64_t i = 0; i < kSequences; ++i) h.add(512, 64);
  for (auto _ : state) {
    h.step();
    const SchedulerStats stats = h.scheduler.stats();
    for (int64_t i = stats.num_running + stats.num_waiting; i < kSequences; ++i) h.add(512, 64);
  }
  state.counters["hit rate"] = static_cast<double>(h.cache.stats().prefix_cache_hits) /
                               static_cast<double>(std::max<int64_t>(1, h.cache.stats().prefix_cache_queries));
}
BENCHMARK(BM_ChurnStep64)->Unit(benchmark::kMicrosecond);

// One sampled token from GLM-5.3-Flash-sized logits (154,880), as the engine samples each sequence after a step.
// Logits are normal with a spread of 2 ("peaked": ten tokens 12 above the rest, as a confident model's head) or 3
// with no head ("flat": the mass spread over thousands of tokens). Arguments: the distribution, then the parameters
// (0 greedy, 1 temperature 1, 2 temperature 1 and top_p 0.95, 3 temperature 0.6, top_p 0.95 and top_k 20).
void BM_SampleToken(benchmark::State& state) {
  constexpr size_t kVocab = 154880;
  const bool peaked = state.range(0) == 0;
  std::mt19937 make(11);
  std::normal_distribution<float> normal(0.0f, peaked ? 2.0f : 3.0f);
  std::vector<float> logits(kVocab);
  for (float& l : logits) l = normal(make);
  if (peaked) {
    for (size_t i = 0; i < 10; ++i) logits[i * 977] += 12.0f;
  }
  static const SamplingParams kParams[] = {{.temperature = 0.0f},
                                           {.temperature = 1.0f},
                                           {.temperature = 1.0f, .top_p = 0.95f},
                                           {.temperature = 0.6f, .top_p = 0.95f, .top_k = 20}};
  const SamplingParams& params = kParams[state.range(1)];
  std::mt19937_64 rng(5);
  std::vector<float> work(kVocab);
  for (auto _ : state) {
    state.PauseTiming();
    work = logits;
    state.ResumeTiming();
    const SamplingInput input{.params = params, .prompt = {}, .output = {}, .eos_token_ids = {}, .rng = rng};
    benchmark::DoNotOptimize(sample_token(work, input));
  }
}
BENCHMARK(BM_SampleToken)->ArgsProduct({{0, 1}, {0, 1, 2, 3}})->Unit(benchmark::kMicrosecond);

// What a step does with its logits after the forward: one vocabulary-sized vector per sequence (GLM-5.3-Flash's
// 154,880), filled from the read-back buffer, then freed after sampling. Argument: the sequences. The "Kept" run calls
// keep_freed_memory() first, as `kestrel` does at start; it is registered last because the setting stays.
void logits_hand_off(benchmark::State& state) {
  constexpr size_t kVocab = 154880;
  const auto sequences = static_cast<size_t>(state.range(0));
  const std::vector<float> read_back(sequences * kVocab, 1.0f);
  for (auto _ : state) {
    std::vector<std::vector<float>> logits(sequences);
    for (size_t s = 0; s < sequences; ++s) {
      logits[s].assign(read_back.begin() + static_cast<std::ptrdiff_t>(s * kVocab),
                       read_back.begin() + static_cast<std::ptrdiff_t>((s + 1) * kVocab));
    }
    benchmark::DoNotOptimize(logits.back().data());
  }
}
void BM_LogitsHandOff(benchmark::State& state) { logits_hand_off(state); }
void BM_LogitsHandOffKept(benchmark::State& state) {
  keep_freed_memory();
  logits_hand_off(state);
}
BENCHMARK(BM_LogitsHandOff)->Arg(1)->Arg(4)->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LogitsHandOffKept)->Arg(1)->Arg(4)->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kestrel

BENCHMARK_MAIN();
