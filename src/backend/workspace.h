// The activations of one forward call, in the backend's memory: a stack of float arrays. A block of the forward opens
// a Frame, takes the arrays it needs, and gives all of them back when the frame closes, so the memory held is the
// deepest the stack gets, not the sum of every array; and within one workspace the same sequence of requests gets
// the same addresses, which CUDA graph replays need (the forward makes one workspace per call today; keeping one per
// sequence slot across decode steps comes with the graphs). Arrays are uninitialised: every op writes its whole output (debug builds fill new
// arrays with NaN, so that a read before a write shows in the results).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend_array.h"

namespace kestrel {

class Backend;

class Workspace {
public:
  explicit Workspace(Backend& backend) : backend_(backend) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // count floats, 64-byte aligned, valid until the innermost open Frame closes (or the workspace ends).
  float* floats(int64_t count);
  // count int32 values (expert ids), from the same stack.
  int32_t* int32s(int64_t count) { return reinterpret_cast<int32_t*>(floats(count)); }

  // Everything taken while a Frame is open is given back when it closes.
  class Frame {
  public:
    explicit Frame(Workspace& workspace)
        : workspace_(workspace), chunk_(workspace.current_), used_(workspace.used_in_current()) {}
    ~Frame() { workspace_.rewind(chunk_, used_); }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;

  private:
    Workspace& workspace_;
    size_t chunk_, used_;
  };

  // Floats the workspace holds from the backend (for tests and memory accounting).
  size_t capacity() const;

private:
  struct Chunk {
    BackendArray array;
    size_t used = 0;
  };

  size_t used_in_current() const { return chunks_.empty() ? 0 : chunks_[current_].used; }
  void rewind(size_t chunk, size_t used);

  Backend& backend_;
  std::vector<Chunk> chunks_;  // chunks after current_ are empty and kept for the next requests
  size_t current_ = 0;
};

}  // namespace kestrel
