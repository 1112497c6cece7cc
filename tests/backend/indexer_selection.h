// A DSA indexer selection as the tests read it: Backend::indexer_select's arrays (positions padded with -1 to the
// stride, a count per token) and the same as one list of positions per token.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace kestrel::testing {

struct IndexerSelection {
  int64_t stride = 0;
  std::vector<int32_t> positions, counts;

  // Each token's positions; a count out of range or padding other than -1 fails the test.
  std::vector<std::vector<int64_t>> lists() const {
    std::vector<std::vector<int64_t>> lists;
    for (size_t t = 0; t < counts.size(); ++t) {
      const auto row = positions.begin() + static_cast<int64_t>(t) * stride;
      const int32_t n = counts[t];
      EXPECT_TRUE(n >= 0 && n <= stride) << "token " << t << " count " << n;
      lists.emplace_back(row, row + std::clamp<int64_t>(n, 0, stride));
      EXPECT_TRUE(std::all_of(row + std::clamp<int64_t>(n, 0, stride), row + stride, [](int32_t p) { return p == -1; }))
          << "token " << t;
    }
    return lists;
  }
};

// Runs indexer_select on a backend whose memory is the host's (the CPU backend).
inline IndexerSelection select_on_host(Backend& backend, IndexerArgs args) {
  IndexerSelection selection;
  selection.stride = indexer_max_positions(args.topk_pools, args.kpool);
  selection.positions.resize(static_cast<size_t>(args.num_tokens * selection.stride));
  selection.counts.resize(static_cast<size_t>(args.num_tokens));
  args.positions = selection.positions.data();
  args.counts = selection.counts.data();
  args.positions_stride = selection.stride;
  backend.indexer_select(args);
  return selection;
}

}  // namespace kestrel::testing
