// EXL3 linears on the CPU backend: the rotated-basis matmul (CpuBackend::linear on an EXL3 LinearWeight) equals x·W
// with W from the float32 dequantizer, and dequantize_row gives the rows of that W, for every bitrate, every codebook
// and shapes that need padding on both dims.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "exl3_random_matrix.h"

namespace kestrel {
namespace {

using exl3::Codebook;
using testing::random_exl3_matrix;
using testing::RandomExl3Matrix;

constexpr Codebook kCodebooks[] = {Codebook::inst3, Codebook::mcg, Codebook::mul1};

struct Shape {
  int64_t in, out;
};
constexpr Shape kShapes[] = {{32, 64}, {200, 300}, {256, 384}};

std::vector<float> random_inputs(int64_t tokens, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(tokens * in));
  for (float& value : x) value = normal(rng);
  return x;
}

// max |actual - expected| relative to max |expected|.
double relative_error(const std::vector<float>& actual, const std::vector<double>& expected) {
  double worst = 0.0, largest = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::fabs(actual[i] - expected[i]));
    largest = std::max(largest, std::fabs(expected[i]));
  }
  return worst / largest;
}

TEST(Exl3LinearTest, MatmulEqualsDequantizedProduct) {
  CpuBackend backend;
  const int64_t tokens = 3;
  uint32_t seed = 1;
  for (const Shape shape : kShapes) {
    for (const Codebook codebook : kCodebooks) {
      for (int bits = exl3::kMinBits; bits <= exl3::kMaxBits; ++bits) {
        const RandomExl3Matrix m = random_exl3_matrix(shape.out, shape.in, bits, codebook, ++seed);
        const std::vector<float> w = m.hf_weight();
        const std::vector<float> x = random_inputs(tokens, shape.in, seed);
        std::vector<double> expected(static_cast<size_t>(tokens * shape.out), 0.0);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t o = 0; o < shape.out; ++o) {
            for (int64_t i = 0; i < shape.in; ++i) {
              expected[static_cast<size_t>(t * shape.out + o)] +=
                  static_cast<double>(x[static_cast<size_t>(t * shape.in + i)]) * w[static_cast<size_t>(o * shape.in + i)];
            }
          }
        }
        std::vector<float> y(expected.size());
        backend.linear(x.data(), tokens, m.weight(), y.data());
        EXPECT_LT(relative_error(y, expected), 1e-5)
            << "in " << shape.in << ", out " << shape.out << ", K " << bits << ", " << exl3::codebook_name(codebook);
      }
    }
  }
}

TEST(Exl3LinearTest, DequantizeRowGivesRowsOfTheEffectiveWeight) {
  for (const Shape shape : kShapes) {
    for (const Codebook codebook : kCodebooks) {
      const int bits = codebook == Codebook::mul1 ? 2 : 4;
      const RandomExl3Matrix m = random_exl3_matrix(shape.out, shape.in, bits, codebook, 77);
      const std::vector<float> w = m.hf_weight();
      const LinearWeight weight = m.weight();
      std::vector<float> row(static_cast<size_t>(shape.in));
      for (int64_t o = 0; o < shape.out; ++o) {
        dequantize_row(weight, o, row.data());
        const std::vector<double> expected(w.begin() + o * shape.in, w.begin() + (o + 1) * shape.in);
        ASSERT_LT(relative_error(row, expected), 1e-5) << "row " << o << " of in " << shape.in << ", out " << shape.out;
      }
    }
  }
}

// safetensors data need not be aligned: the trellis and scales are read through unaligned pointers.
TEST(Exl3LinearTest, UnalignedStorageGivesTheSameResult) {
  const RandomExl3Matrix m = random_exl3_matrix(40, 130, 3, Codebook::mcg, 5);
  const LinearWeight aligned = m.weight();
  const auto shifted_copy = [](const std::vector<uint16_t>& values) {
    std::vector<std::byte> bytes(values.size() * 2 + 1);
    std::memcpy(bytes.data() + 1, values.data(), values.size() * 2);
    return bytes;
  };
  const std::vector<std::byte> trellis = shifted_copy(m.trellis), suh = shifted_copy(m.suh), svh = shifted_copy(m.svh);
  LinearWeight unaligned = aligned;
  unaligned.data = trellis.data() + 1;
  unaligned.exl3->trellis = trellis.data() + 1;
  unaligned.exl3->suh = suh.data() + 1;
  unaligned.exl3->svh = svh.data() + 1;

  CpuBackend backend;
  const std::vector<float> x = random_inputs(2, 130, 6);
  std::vector<float> y_aligned(80), y_unaligned(80);
  backend.linear(x.data(), 2, aligned, y_aligned.data());
  backend.linear(x.data(), 2, unaligned, y_unaligned.data());
  EXPECT_EQ(y_aligned, y_unaligned);
}

// Embedding lookups read rows through dequantize_row, so an EXL3 table works there too.
TEST(Exl3LinearTest, EmbedReadsExl3Rows) {
  const RandomExl3Matrix m = random_exl3_matrix(20, 32, 4, Codebook::inst3, 9);
  const std::vector<float> w = m.hf_weight();
  CpuBackend backend;
  const int32_t ids[] = {0, 19, 7};
  std::vector<float> out(3 * 32);
  backend.embed(ids, 3, m.weight(), out.data());
  for (size_t t = 0; t < 3; ++t) {
    for (size_t i = 0; i < 32; ++i) {
      EXPECT_NEAR(out[t * 32 + i], w[static_cast<size_t>(ids[t]) * 32 + i], 1e-5);
    }
  }
}

}  // namespace
}  // namespace kestrel
