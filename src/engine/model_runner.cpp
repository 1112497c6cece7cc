#include "engine/model_runner.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "base/error.h"
#include "base/thread_pool.h"

namespace kestrel {

ModelRunner::ModelRunner(Forward forward, int64_t block_size, bool parallel_sequences)
    : forward_(std::move(forward)), block_size_(block_size), parallel_sequences_(parallel_sequences) {}

std::vector<float> ModelRunner::run_chunk(const ScheduledChunk& chunk) {
  const Request& request = *chunk.request;
  SequenceState& sequence = *request.cache.state;
  require(sequence.num_tokens() == chunk.start, "request {}: sequence holds {} tokens, the chunk starts at {}",
          request.id, sequence.num_tokens(), chunk.start);
  const std::span<const int32_t> tokens = request.token_ids;
  const int64_t P = request.num_prompt_tokens;
  auto snapshot = chunk.snapshots.begin();
  std::vector<float> logits;
  for (int64_t position = chunk.start; position < chunk.end;) {
    const int64_t call_end =
        position < P ? std::min({chunk.end, P, (position / block_size_ + 1) * block_size_}) : position + 1;
    logits = forward_(sequence,
                      tokens.subspan(static_cast<size_t>(position), static_cast<size_t>(call_end - position)));
    position = call_end;
    for (; snapshot != chunk.snapshots.end() && snapshot->num_tokens == position; ++snapshot) {
      sequence.save_kda_state(snapshot->kda_state);
    }
  }
  if (!chunk.samples()) logits.clear();
  return logits;
}

std::vector<std::vector<float>> ModelRunner::execute(const SchedulerOutput& output) {
  const auto& chunks = output.chunks;
  std::vector<std::vector<float>> logits(chunks.size());
  std::vector<size_t> small;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (parallel_sequences_ && chunks[i].end - chunks[i].start <= block_size_) {
      small.push_back(i);
    } else {
      logits[i] = run_chunk(chunks[i]);
    }
  }
  // Pool workers must not throw: errors are carried out and rethrown here.
  std::vector<std::exception_ptr> errors(small.size());
  ThreadPool::global().parallel_for(static_cast<int64_t>(small.size()), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      try {
        logits[small[static_cast<size_t>(k)]] = run_chunk(chunks[small[static_cast<size_t>(k)]]);
      } catch (...) {
        errors[static_cast<size_t>(k)] = std::current_exception();
      }
    }
  });
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return logits;
}

}  // namespace kestrel
