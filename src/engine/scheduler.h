// The scheduler (vLLM v1's, without phases): each step it gives every request a number of tokens to compute so that
// its computed count catches up with its known tokens, within a token budget — running requests past their prompt
// first (a decode, or the replay after a preemption), then running prompts, then waiting requests admitted in
// arrival order up to max_num_seqs. Memory is granted by the cache manager; when a running request cannot get its
// blocks, the latest admitted request is preempted (its cache freed, put back at the head of the queue, recomputed
// later). A waiting request that does not fit waits, and so does everything behind it.
//
// Chunks depend on a request's own tokens only, never on the batch: prompt chunks end at a multiple of the block size
// or at the end of the prompt, and the model runner splits them into one forward call per block; tokens after the
// prompt are computed one per call, as decoding computed them. A recomputed request therefore redoes exactly the
// computation it lost, a prefix-cache hit restores exactly the state an uncached run has at that block boundary, and
// a request's logits are identical alone or in any batch.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/request.h"
#include "engine/sampler.h"

namespace kestrel {

struct SchedulerConfig {
  int64_t max_num_seqs = 0;
  int64_t max_num_batched_tokens = 0;
  int64_t max_model_len = 0;
  bool wait_for_shared_prompt = true;  // n > 1: siblings wait for the first to cache the prompt (prefix caching on)
  std::vector<int32_t> eos_token_ids{};
};

// A part of one request computed in a step.
struct ScheduledChunk {
  Request* request;
  int64_t start, end;                     // tokens [start, end)
  std::vector<SnapshotTarget> snapshots;  // KDA snapshots to take on the way
  bool samples() const { return end == request->num_tokens(); }  // its last token's logits give the next token
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  int64_t num_scheduled_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

struct SchedulerStats {
  int64_t num_running = 0, num_waiting = 0;
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;      // prompts of requests that produced their first token
  int64_t generation_tokens = 0;  // tokens sampled
  int64_t num_finished[4] = {};   // by FinishReason
};

class Scheduler {
public:
  Scheduler(SchedulerConfig config, CacheManager& cache);

  void add(std::unique_ptr<Request> request);
  // Completion `index` of request `id` (every completion when unset) finishes with `reason` at the next schedule(),
  // unless it finished before: a cancellation (abort), or a stop string the caller found in the text (stop).
  void finish_later(uint64_t id, std::optional<int64_t> index, FinishReason reason);
  bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || !finish_requests_.empty(); }

  SchedulerOutput schedule();
  // After the forward: `sampled[i]` is the token sampled for chunk i (when it samples). Advances the requests,
  // indexes their computed prompt blocks, applies stop conditions, emits outputs and frees what finished.
  void update(const SchedulerOutput& output, std::span<const std::optional<SampledToken>> sampled);
  // Ends every request with `reason` (shutdown).
  void finish_all(FinishReason reason, std::string_view error = {});
  // Ends the requests of a step that failed with FinishReason::error; the others go on.
  void fail(const SchedulerOutput& output, std::string_view error);

  SchedulerStats stats() const;

private:
  int64_t chunk_end(const Request& request, int64_t budget) const;
  bool waits_for_sibling(const Request& request) const;
  // Blocks for `request` up to `end` tokens, preempting from the back of the running list; false if `request` itself
  // was preempted.
  bool reserve(Request& request, int64_t end, SchedulerOutput& output, int64_t& budget);
  void preempt(SchedulerOutput& output, int64_t& budget);
  void schedule_chunk(Request& request, int64_t end, SchedulerOutput& output, int64_t& budget);
  std::optional<FinishReason> stop_reason(const Request& request, std::optional<int32_t>& stop_token) const;
  void emit(Request& request, RequestOutput output);
  // Frees the request and emits `last`, whose finish_reason is set.
  void finish(Request& request, RequestOutput last);
  static RequestOutput final_output(FinishReason reason, std::string_view error = {});
  void apply_finish_requests();

  struct FinishRequest {
    uint64_t id;
    std::optional<int64_t> index;
    FinishReason reason;
  };

  SchedulerConfig config_;
  CacheManager& cache_;
  std::vector<std::unique_ptr<Request>> running_;  // in admission order
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<FinishRequest> finish_requests_;
  SchedulerStats stats_;
};

}  // namespace kestrel
