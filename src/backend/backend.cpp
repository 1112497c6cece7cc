#include "backend/backend.h"

#include "base/thread_pool.h"

namespace kestrel {

void Backend::draw_tokens(float* logits, int64_t vocab, std::span<const TokenDraw> draws, std::span<int32_t> tokens) {
  require(tokens.size() == draws.size(), "draw_tokens: {} tokens for {} draws", tokens.size(), draws.size());
  if (draws.empty()) return;
  const std::span<const float> host = read_back(logits, draws.size() * static_cast<size_t>(vocab));
  ThreadPool::global().parallel_for(static_cast<int64_t>(draws.size()), [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row;  // draw_token scales its row in place; the read-back view is the backend's
    for (int64_t i = begin; i < end; ++i) {
      const auto first = host.begin() + i * vocab;
      row.assign(first, first + vocab);
      tokens[static_cast<size_t>(i)] = draw_token(row, draws[static_cast<size_t>(i)]);
    }
  });
}

}  // namespace kestrel
