#include "engine/model_runner.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "base/error.h"
#include "base/thread_pool.h"

namespace kestrel {

ModelRunner::ModelRunner(Forward forward, int64_t block_size, bool parallel_sequences)
    : forward_(std::move(forward)), block_size_(block_size), parallel_sequences_(parallel_sequences) {}

ModelRunner::Cursor ModelRunner::start(const ScheduledChunk& chunk) const {
  const Request& request = *chunk.request;
  require(request.cache.state->num_tokens() == chunk.start, "request {}: sequence holds {} tokens, the chunk starts at {}",
          request.id, request.cache.state->num_tokens(), chunk.start);
  return Cursor{.chunk = &chunk, .position = chunk.start, .snapshot = 0, .logits = {}};
}

SequenceCall ModelRunner::next_call(const Cursor& cursor) const {
  const Request& request = *cursor.chunk->request;
  const int64_t position = cursor.position, P = request.num_prompt_tokens;
  const int64_t end = position < P ? std::min({cursor.chunk->end, P, (position / block_size_ + 1) * block_size_})
                                   : position + 1;
  return SequenceCall{.sequence = request.cache.state,
                      .tokens = std::span<const int32_t>(request.token_ids)
                                    .subspan(static_cast<size_t>(position), static_cast<size_t>(end - position))};
}

void ModelRunner::advance(Cursor& cursor, int64_t end, std::vector<float> logits) {
  cursor.position = end;
  cursor.logits = std::move(logits);
  const auto& snapshots = cursor.chunk->snapshots;
  for (; cursor.snapshot < snapshots.size() && snapshots[cursor.snapshot].num_tokens == end; ++cursor.snapshot) {
    cursor.chunk->request->cache.state->save_kda_state(snapshots[cursor.snapshot].kda_state);
  }
}

std::vector<float> ModelRunner::run_chunk(const ScheduledChunk& chunk) {
  Cursor cursor = start(chunk);
  while (!cursor.done()) {
    const SequenceCall call = next_call(cursor);
    advance(cursor, cursor.position + static_cast<int64_t>(call.tokens.size()),
            std::move(forward_(std::span(&call, 1)).front()));
  }
  if (!chunk.samples()) cursor.logits.clear();
  return std::move(cursor.logits);
}

std::vector<std::vector<float>> ModelRunner::execute(const SchedulerOutput& output) {
  return parallel_sequences_ ? execute_parallel(output) : execute_batched(output);
}

std::vector<std::vector<float>> ModelRunner::execute_batched(const SchedulerOutput& output) {
  std::vector<Cursor> cursors;
  cursors.reserve(output.chunks.size());
  for (const ScheduledChunk& chunk : output.chunks) cursors.push_back(start(chunk));
  std::vector<SequenceCall> calls;
  std::vector<Cursor*> callers;
  for (;;) {
    calls.clear();
    callers.clear();
    for (Cursor& cursor : cursors) {
      if (cursor.done()) continue;
      calls.push_back(next_call(cursor));
      callers.push_back(&cursor);
    }
    if (calls.empty()) break;
    std::vector<std::vector<float>> logits = forward_(calls);
    for (size_t i = 0; i < calls.size(); ++i) {
      advance(*callers[i], callers[i]->position + static_cast<int64_t>(calls[i].tokens.size()), std::move(logits[i]));
    }
  }
  std::vector<std::vector<float>> last(cursors.size());
  for (size_t i = 0; i < cursors.size(); ++i) {
    if (cursors[i].chunk->samples()) last[i] = std::move(cursors[i].logits);
  }
  return last;
}

std::vector<std::vector<float>> ModelRunner::execute_parallel(const SchedulerOutput& output) {
  const auto& chunks = output.chunks;
  std::vector<std::vector<float>> logits(chunks.size());
  std::vector<size_t> small;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].end - chunks[i].start <= block_size_) {
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
