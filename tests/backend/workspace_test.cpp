// The forward's activation workspace: frames give their arrays back, the same requests get the same addresses (what
// CUDA graph replays rely on), arrays are aligned and never overlap, and requests larger than any chunk are served.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/workspace.h"
#include "base/error.h"

namespace kestrel {
namespace {

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(WorkspaceTest, AFrameGivesItsArraysBackAndTheSameRequestsGetTheSameAddresses) {
  CpuBackend cpu;
  Workspace ws(cpu);
  float* outer = ws.floats(100);
  std::vector<float*> first, second;
  for (std::vector<float*>* run : {&first, &second}) {
    const Workspace::Frame frame(ws);
    for (const int64_t n : {10, 70000, 5, 300000}) run->push_back(ws.floats(n));  // crosses into new chunks
  }
  EXPECT_EQ(first, second);
  // A different request pattern settles too: its second round allocates nothing and reuses the first's addresses.
  float* big[2];
  size_t capacity[2];
  for (int round = 0; round < 2; ++round) {
    const Workspace::Frame frame(ws);
    big[round] = ws.floats(300000);
    capacity[round] = ws.capacity();
  }
  EXPECT_EQ(big[0], big[1]);
  EXPECT_EQ(capacity[0], capacity[1]);
  EXPECT_EQ(ws.floats(1), outer + 112) << "after the frames, the stack continues after the outer array (100 -> 112)";
}

TEST(WorkspaceTest, ArraysAreAlignedAndDisjoint) {
  CpuBackend cpu;
  Workspace ws(cpu);
  std::vector<std::pair<float*, int64_t>> arrays;
  for (int64_t n = 1; n < 5000; n = n * 3 + 1) arrays.emplace_back(ws.floats(n), n);
  const Workspace::Frame frame(ws);
  arrays.emplace_back(ws.floats(1 << 20), 1 << 20);
  std::set<std::pair<float*, float*>> spans;
  for (const auto& [p, n] : arrays) {
    EXPECT_TRUE(aligned64(p));
    for (const auto& [begin, end] : spans) EXPECT_TRUE(p + n <= begin || p >= end) << "overlap";
    spans.emplace(p, p + n);
    p[0] = 1.0f;  // writable to the last element
    p[n - 1] = 1.0f;
  }
}

TEST(WorkspaceTest, ANegativeRequestIsAnError) {
  CpuBackend cpu;
  Workspace ws(cpu);
  EXPECT_THROW((void)ws.floats(-1), Error);
  EXPECT_NE(ws.floats(0), nullptr);
}

}  // namespace
}  // namespace kestrel
