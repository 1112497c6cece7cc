// The model runner: computes the chunks the scheduler picked through the model's forward, and takes the KDA snapshots
// the cache manager planned. A chunk is split into forward calls by a rule that depends only on the request's tokens:
// within the prompt one call per cache block (so every block boundary is a point where the KDA state can be
// snapshot), after the prompt one call per token. A step runs in rounds, each one batched forward pass over the next
// call of every unfinished chunk, so that the decode steps of all running sequences (and the next block of each
// prefill) read the weights once. (Giving each sequence its own CPU thread instead served the embedded model 1.5x
// slower on 2 cores.)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/scheduler.h"
#include "model/glm5_next.h"

namespace kestrel {

class ModelRunner {
public:
  // Appends each call's tokens to its sequence in one pass; entry i holds the logits of call i's last token, [vocab],
  // when the call asks for them (the last call of a chunk that samples).
  using Forward = std::function<std::vector<std::vector<float>>(std::span<const SequenceCall> calls)>;

  ModelRunner(Forward forward, int64_t block_size);

  // Computes every chunk; entry i holds chunk i's last logits when it samples, else nothing. A chunk that samples and
  // has a draw (draws[i], when draws is not empty) gets its token drawn on the backend into draws[i]->token instead
  // of its logits.
  std::vector<std::vector<float>> execute(const SchedulerOutput& output, std::span<BackendDraw* const> draws = {});

private:
  // A chunk under way: the start of its next forward call and its next planned snapshot.
  struct Cursor {
    const ScheduledChunk* chunk;
    int64_t position;
    size_t snapshot = 0;
    BackendDraw* draw = nullptr;  // for the chunk's last call
    std::vector<float> logits;  // of the last call, when it asked for them
    bool done() const { return position == chunk->end; }
  };
  Cursor start(const ScheduledChunk& chunk, BackendDraw* draw) const;
  SequenceCall next_call(const Cursor& cursor) const;
  // Records a finished call's logits and takes the snapshots due where it ended.
  static void advance(Cursor& cursor, int64_t end, std::vector<float> logits);

  Forward forward_;
  int64_t block_size_;
};

}  // namespace kestrel
