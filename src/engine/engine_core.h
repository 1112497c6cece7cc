// One engine iteration, synchronously (vLLM's EngineCore.step): the scheduler picks the chunks, the model runner
// computes them, the sampler picks a token for each sequence that has caught up, and the scheduler applies them.
// Single-threaded: the Engine facade runs it on its own thread; tests and benchmarks drive it directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/glm5_next.h"

namespace kestrel {

struct EngineStats {
  SchedulerStats scheduler;
  CacheStats cache;
  double kv_cache_usage = 0.0;  // fraction of blocks referenced by sequences
  std::optional<DeviceMemory> device_memory;  // on a GPU
};

class EngineCore {
public:
  // Serves `model` (which must outlive the core) with `config` resolved against it.
  EngineCore(Glm5NextModel& model, const EngineConfig& config);
  // Any forward with the layout of `model` whose caches live in `backend`'s memory; `memory` sizes the cache on a
  // device (resolve_engine_config).
  EngineCore(const Glm5NextConfig& model, Backend& backend, ModelRunner::Forward forward, const EngineConfig& config,
             const std::optional<DeviceMemory>& memory = std::nullopt);

  const EngineConfig& config() const { return config_; }

  // Throws Error when the request cannot be served: empty prompt, a token outside the vocabulary, a prompt longer
  // than max_model_len, sampling parameters out of range. Reads only the configuration: safe from any thread.
  void validate(std::span<const int32_t> prompt, const SamplingParams& params) const;
  // Validates, then queues the request's n completions; their outputs go to `sink`.
  void add_request(uint64_t id, std::vector<int32_t> prompt, const SamplingParams& params, std::string cache_salt,
                   std::shared_ptr<OutputSink> sink);
  // Completion `index` of request `id` (all when unset) ends with `reason` at the next step (see Scheduler).
  void finish_request(uint64_t id, std::optional<int64_t> index, FinishReason reason) {
    scheduler_.finish_later(id, index, reason);
  }
  bool has_unfinished_requests() const { return scheduler_.has_unfinished(); }
  void step();
  // Ends every request now: abort at shutdown, error when the engine itself failed.
  void finish_all(FinishReason reason, std::string_view error = {}) { scheduler_.finish_all(reason, error); }

  EngineStats stats() const;

private:
  // What the sampler takes for the request's next token.
  SamplingInput sampling_input(Request& request) const;

  Glm5NextConfig model_;
  EngineConfig config_;
  Backend& backend_;
  CacheManager cache_;
  Scheduler scheduler_;
  ModelRunner runner_;
};

}  // namespace kestrel
