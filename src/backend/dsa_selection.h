// The shape of a DSA indexer selection, shared by the backend interface and the CUDA kernels (which nvcc compiles as
// C++17, so this header stays free of the interface's C++20).
#pragma once

#include <cstdint>

namespace kestrel {

// The longest selection of one token: topk_pools whole pools and an incomplete tail of up to kpool - 1 positions.
constexpr int64_t indexer_max_positions(int64_t topk_pools, int64_t kpool) { return topk_pools * kpool + kpool - 1; }

}  // namespace kestrel
