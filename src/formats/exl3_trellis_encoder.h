// The EXL3 tile encoder (shared/docs/exl3-format.md §4.6): a Viterbi search over the bit-shift trellis for the 256
// states of one 16x16 tile whose codebook values are closest, in squared error, to the tile's targets, under the
// tail-biting constraint that the stream is circular (state 0 borrows its high bits from the end of the tile).
//
// The trellis has 2^(16-K) "edges" (the low 16-K bits of a state, shared with the next state). A state is
// (k << (16-K)) | out_edge with k in [0, 2^K); its predecessor edge is state >> K. Each step keeps, per out edge, the
// cheapest path over the 2^K states ending in it (ties keep the smallest k). Tail-biting takes two passes: the first
// runs positions 128..255, 0..127 from free start edges and traces back the edge that enters position 0; the second
// runs 0..255 from exactly that edge and must end in it. Costs are float32 against the codebook's float values.
//
// One encoder holds the back-pointer buffer of a pass (256 x 2^(16-K) bytes: 1 MiB at K = 4); use one per thread.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/exl3_codec.h"

namespace kestrel::exl3 {

class TrellisEncoder {
public:
  TrellisEncoder(int bits, Codebook codebook);

  int bits() const { return bits_; }

  // targets: the tile's 256 values in trellis (tensor-core) order. Writes the chosen states and their codebook
  // values in the same order and returns the squared error sum.
  double encode(const float* targets, uint16_t* states, float* decoded);

private:
  int bits_;
  const float* codebook_values_;
  std::vector<float> cost_, next_cost_;  // [2^(16-K) + slack] path cost per edge
  std::vector<uint8_t> back_;            // [256][2^(16-K)] the winning k of each step and out edge
};

}  // namespace kestrel::exl3
