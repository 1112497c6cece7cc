// The model runner: computes the chunks the scheduler picked, one sequence at a time through the model's forward
// (the CPU forward is per sequence), and takes the KDA snapshots the cache manager planned. A chunk is split into
// forward calls by a rule that depends only on the request's tokens: within the prompt one call per cache block (so
// every block boundary is a point where the KDA state can be snapshot), after the prompt one call per token.
//
// Chunks of at most one block run in parallel across sequences on the global thread pool (each forward then runs its
// ops serially in one worker, which gives the same results: every op reduces each output element in a fixed order in
// one thread); longer chunks run one after another with the pool inside each op. This relies on the forward being
// re-entrant across sequences — Glm5NextModel::forward touches only its sequence, its read-only weights and a
// stateless backend — and on block tables being sized beforehand (CacheManager::allocate), so no forward allocates.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/scheduler.h"
#include "model/sequence_state.h"

namespace kestrel {

class ModelRunner {
public:
  // Appends `tokens` to the sequence and returns the logits of the last one, [vocab].
  using Forward = std::function<std::vector<float>(SequenceState& sequence, std::span<const int32_t> tokens)>;

  ModelRunner(Forward forward, int64_t block_size, bool parallel_sequences);

  // Computes every chunk; entry i holds chunk i's last logits when it samples, else nothing.
  std::vector<std::vector<float>> execute(const SchedulerOutput& output);

private:
  std::vector<float> run_chunk(const ScheduledChunk& chunk);

  Forward forward_;
  int64_t block_size_;
  bool parallel_sequences_;
};

}  // namespace kestrel
