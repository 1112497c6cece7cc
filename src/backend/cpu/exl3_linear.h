// The CPU backend's linear over an EXL3 matrix (see Exl3Matrix in backend/linear_weight.h).
#pragma once

#include <cstdint>

#include "backend/linear_weight.h"

namespace kestrel {

// y[T, out_features] = x[T, in_features] W^T for weight.exl3 set, computed as y = ((x ⊙ suh) · Hk · Ŵ) · Hn ⊙ svh.
void exl3_linear(const float* x, int64_t num_tokens, const LinearWeight& weight, float* y);

}  // namespace kestrel
