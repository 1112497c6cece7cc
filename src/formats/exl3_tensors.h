// The tensor group of one EXL3 linear in a checkpoint (shared/docs/exl3-format.md §1.2), found by module name and
// checked for consistency: `<module>.trellis` I16 [k/16, n/16, 16K] with K in 1..8, `.suh` F16 [k], `.svh` F16 [n],
// and at most one codebook marker, `.mcg` or `.mul1`, an I32 scalar holding the multiplier exllamav3 locked
// (neither: 3INST). k and n are the padded input and output widths, multiples of 128.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "formats/exl3_codec.h"
#include "formats/safetensors.h"

namespace kestrel {

struct Exl3Tensors {
  const TensorView* trellis = nullptr;
  const TensorView* suh = nullptr;
  const TensorView* svh = nullptr;
  const TensorView* marker = nullptr;  // null for 3INST
  int bits = 0;
  exl3::Codebook codebook = exl3::Codebook::inst3;
  int64_t in_padded = 0, out_padded = 0;
};

// The name's tensor, or nullptr when the checkpoint has none.
using TensorLookup = std::function<const TensorView*(const std::string& name)>;

// Reads the group of `module`, whose trellis must exist. With out_features / in_features > 0 (the HF shape the
// model expects) the padded widths must match them rounded up to 128; with 0 they are taken from the trellis.
// Throws Error naming the file and tensor at fault.
Exl3Tensors read_exl3_tensors(const TensorLookup& find, const std::string& module, int64_t out_features = 0,
                              int64_t in_features = 0);

}  // namespace kestrel
