// The one tensor-core instruction the GEMV kernels use: D += A (16x16, row-major) x B (16x8, column-major) with fp32
// accumulators, mma.sync.m16n8k16 (sm_80+). Per lane l (g = l / 4, t = l % 4): A registers {a0, a1, a2, a3} hold
// elements (g, 2t..2t+1), (g+8, 2t..2t+1), (g, 2t+8..2t+9), (g+8, 2t+8..2t+9); B registers {b0, b1} hold
// (2t..2t+1, g), (2t+8..2t+9, g); D holds (g, 2t..2t+1), (g+8, 2t..2t+1).
#pragma once

#include <cstdint>

namespace kestrel::cuda {

enum class MmaInput { f16, bf16 };

template <MmaInput Input>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  if constexpr (Input == MmaInput::f16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

}  // namespace kestrel::cuda
