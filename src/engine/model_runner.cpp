#include "engine/model_runner.h"

#include <algorithm>
#include <utility>

#include "base/error.h"

namespace kestrel {

ModelRunner::ModelRunner(Forward forward, int64_t block_size)
    : forward_(std::move(forward)), block_size_(block_size) {}

ModelRunner::Cursor ModelRunner::start(const ScheduledChunk& chunk, BackendDraw* draw) const {
  const Request& request = *chunk.request;
  require(request.cache.state->num_tokens() == chunk.start, "request {}: sequence holds {} tokens, the chunk starts at {}",
          request.id, request.cache.state->num_tokens(), chunk.start);
  return Cursor{.chunk = &chunk, .position = chunk.start, .snapshot = 0, .draw = draw, .logits = {}};
}

SequenceCall ModelRunner::next_call(const Cursor& cursor) const {
  const Request& request = *cursor.chunk->request;
  const int64_t position = cursor.position, P = request.num_prompt_tokens;
  const int64_t end = position < P ? std::min({cursor.chunk->end, P, (position / block_size_ + 1) * block_size_})
                                   : position + 1;
  const bool logits = end == cursor.chunk->end && cursor.chunk->samples();
  return SequenceCall{.sequence = request.cache.state,
                      .tokens = std::span<const int32_t>(request.token_ids)
                                    .subspan(static_cast<size_t>(position), static_cast<size_t>(end - position)),
                      .logits = logits,
                      .draw = logits ? cursor.draw : nullptr};
}

void ModelRunner::advance(Cursor& cursor, int64_t end, std::vector<float> logits) {
  cursor.position = end;
  cursor.logits = std::move(logits);
  const auto& snapshots = cursor.chunk->snapshots;
  for (; cursor.snapshot < snapshots.size() && snapshots[cursor.snapshot].num_tokens == end; ++cursor.snapshot) {
    cursor.chunk->request->cache.state->save_kda_state(snapshots[cursor.snapshot].kda_state);
  }
}

std::vector<std::vector<float>> ModelRunner::execute(const SchedulerOutput& output,
                                                     std::span<BackendDraw* const> draws) {
  require(draws.empty() || draws.size() == output.chunks.size(), "{} draws for {} chunks", draws.size(),
          output.chunks.size());
  std::vector<Cursor> cursors;
  cursors.reserve(output.chunks.size());
  for (size_t i = 0; i < output.chunks.size(); ++i) {
    cursors.push_back(start(output.chunks[i], draws.empty() ? nullptr : draws[i]));
  }
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
  for (size_t i = 0; i < cursors.size(); ++i) last[i] = std::move(cursors[i].logits);
  return last;
}

}  // namespace kestrel
