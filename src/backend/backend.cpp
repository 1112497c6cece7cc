#include "backend/backend.h"

#include <algorithm>

#include "base/thread_pool.h"

namespace kestrel {

void Backend::write_rows(PagedRows& rows, int64_t first_row, const float* src, int64_t count) {
  const int64_t width = rows.row_width(), block_rows = rows.pool().block_rows();
  require(first_row >= 0 && count >= 0 && first_row + count <= rows.size(),
          "writing rows {}..{} of a cache holding {}", first_row, first_row + count, rows.size());
  if (rows.format().dtype != CacheDtype::float32) {
    for (int64_t i = 0; i < count; ++i) encode_row(rows.format(), src + i * width, rows.row_bytes(first_row + i));
    return;
  }
  for (int64_t i = 0; i < count;) {
    const int64_t run = std::min(count - i, block_rows - (first_row + i) % block_rows);
    copy(rows.row(first_row + i), src + i * width, static_cast<size_t>(run * width) * sizeof(float));
    i += run;
  }
}

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
