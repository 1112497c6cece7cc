// CUDA linears against the CPU backend: the EXL3 tensor-core GEMV for every codebook and bitrate, shapes that need
// padding on both dims, and token counts that fill and cross the 16-token pass; the dense GEMV for f32/f16/bf16 and
// block-fp8 weights; the prefill-sized GEMM paths for bf16 (cuBLASLt) and EXL3 weights (Ŵ decoded once for cuBLASLt,
// or in registers). Without a GPU, only the error paths run (a device allocation must fail with a clear Error, not
// crash).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/exl3_kernels.h"
#include "base/error.h"
#include "base/numeric.h"
#include "cuda_test_util.h"
#include "exl3_random_matrix.h"
#include "formats/exl3_codec.h"

namespace kestrel::cuda {
namespace {

using exl3::Codebook;
using kestrel::testing::random_exl3_matrix;
using kestrel::testing::RandomExl3Matrix;
using namespace kestrel::cuda::testing;

// Runs `weight` on the GPU for x [T, in] and returns y [T, out]; with `gemm`, token counts from the matrix's
// gemm_min_tokens() on take the GEMM path.
std::vector<float> gpu_linear(const LinearWeight& weight, const std::vector<float>& x, int64_t tokens,
                              Gemm* gemm = nullptr) {
  const DeviceLinear linear = DeviceLinear::upload(weight, device_info(0).sm_count);
  const DeviceBuffer x_dev = testing::to_device(x);
  DeviceBuffer y_dev(static_cast<size_t>(tokens * weight.out_features) * sizeof(float));
  Scratch scratch;
  linear.forward(x_dev.as<float>(), tokens, y_dev.as<float>(), scratch, gemm, nullptr);
  return testing::to_host(y_dev);
}

// The same through DeviceLinear::forward_jobs as a one-job list: an EXL3 matrix from gemm_min_tokens() takes the
// in-register GEMM (exl3_trellis_gemm) there, where forward alone decodes Ŵ once for cuBLASLt.
std::vector<float> gpu_job(const LinearWeight& weight, const std::vector<float>& x, int64_t tokens, Gemm& gemm) {
  const DeviceLinear linear = DeviceLinear::upload(weight, device_info(0).sm_count);
  const DeviceBuffer x_dev = testing::to_device(x);
  DeviceBuffer y_dev(static_cast<size_t>(tokens * weight.out_features) * sizeof(float));
  Scratch scratch;
  const LinearJob jobs[] = {{.linear = &linear, .x = x_dev.as<float>(), .num_tokens = tokens, .y = y_dev.as<float>()}};
  DeviceLinear::forward_jobs(jobs, scratch, &gemm, nullptr);
  return testing::to_host(y_dev);
}

std::vector<float> cpu_linear(const LinearWeight& weight, const std::vector<float>& x, int64_t tokens) {
  CpuBackend cpu;
  std::vector<float> y(static_cast<size_t>(tokens * weight.out_features));
  cpu.linear(x.data(), tokens, weight, y.data());
  return y;
}

// The EXL3 kernel rounds the rotated inputs to fp16 for the tensor cores (the weights are fp16 values already):
// about 2.5e-4 of the largest output at these shapes, simulated in float64. The dense kernel is float32 throughout
// and differs from the CPU only in summation order.
constexpr double kExl3Tolerance = 1e-3, kDenseTolerance = 1e-5;

TEST(CudaLinearTest, Exl3MatchesCpuForEveryCodebookAndBitrate) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int64_t in, out;
  };
  uint32_t seed = 7;
  for (const Shape shape : {Shape{32, 64}, Shape{200, 300}, Shape{1024, 384}}) {
    for (const Codebook codebook : {Codebook::inst3, Codebook::mcg, Codebook::mul1}) {
      for (int bits = exl3::kMinBits; bits <= exl3::kMaxBits; ++bits) {
        const RandomExl3Matrix m = random_exl3_matrix(shape.out, shape.in, bits, codebook, ++seed);
        for (const int64_t tokens : {1, 3, 11, 16, 21}) {
          const std::vector<float> x = random_values(static_cast<size_t>(tokens * shape.in), seed + 100);
          const double diff = relative_difference(gpu_linear(m.weight(), x, tokens), cpu_linear(m.weight(), x, tokens));
          EXPECT_LT(diff, kExl3Tolerance) << "in " << shape.in << " out " << shape.out << " codebook "
                                << exl3::codebook_name(codebook) << " bits " << bits << " tokens " << tokens;
        }
      }
    }
  }
}

TEST(CudaLinearTest, Exl3AtExpertShapeMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // GLM-5.3-Flash's routed expert down_proj: 2048 -> 4096, 4 bpw MCG, long enough k for many k slices.
  const RandomExl3Matrix m = random_exl3_matrix(4096, 2048, 4, Codebook::mcg, 99);
  const std::vector<float> x = random_values(2 * 2048, 5);
  EXPECT_LT(relative_difference(gpu_linear(m.weight(), x, 2), cpu_linear(m.weight(), x, 2)), kExl3Tolerance);
}

TEST(CudaLinearTest, Exl3ResultsDoNotDependOnTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // The k slices (4 at this shape) finish in whatever order the GPU runs them; the last one sums them in slice order.
  const RandomExl3Matrix m = random_exl3_matrix(4096, 2048, 4, Codebook::mcg, 98);
  const std::vector<float> x = random_values(3 * 2048, 6);
  const std::vector<float> first = gpu_linear(m.weight(), x, 3);
  for (int run = 0; run < 5; ++run) EXPECT_EQ(gpu_linear(m.weight(), x, 3), first) << "run " << run;
}

TEST(CudaLinearTest, Exl3WideMatrixWithLongSlicesMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // More 16-column strips than 48 per SM: one k slice of 64 tiles per column block, whose 16 tokens' doubled inputs
  // (66.5 KB) need the kernel's opt-in past 48 KB of shared memory.
  const int sm_count = device_info(0).sm_count;
  const int64_t in = 1024, out = 16 * 48 * int64_t{sm_count} + 128;
  const Exl3Plan plan = exl3_plan(Exl3DeviceView{.bits = 4, .in_features = in, .out_features = out, .in_padded = in,
                                                 .out_padded = out},
                                  sm_count);
  ASSERT_EQ(plan.slice_tiles, 64);
  const RandomExl3Matrix m = random_exl3_matrix(out, in, 4, Codebook::mcg, 97);
  for (const int64_t tokens : {16, 5}) {
    const std::vector<float> x = random_values(static_cast<size_t>(tokens * in), 8);
    EXPECT_LT(relative_difference(gpu_linear(m.weight(), x, tokens), cpu_linear(m.weight(), x, tokens)),
              kExl3Tolerance)
        << "tokens " << tokens;
  }
}

TEST(CudaLinearTest, Exl3DecodedOnTheGpuIsBitExactWithTheCpuDecoder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 40;
  for (const Codebook codebook : {Codebook::inst3, Codebook::mcg, Codebook::mul1}) {
    for (int bits = exl3::kMinBits; bits <= exl3::kMaxBits; ++bits) {
      const RandomExl3Matrix m = random_exl3_matrix(300, 200, bits, codebook, ++seed);
      std::vector<uint16_t> expected(static_cast<size_t>(m.in_padded * m.out_padded));
      exl3::decode_rotated(m.trellis.data(), m.in_padded, m.out_padded, bits, codebook, expected.data());
      const DeviceLinear linear = DeviceLinear::upload(m.weight(), device_info(0).sm_count);
      DeviceBuffer decoded(expected.size() * sizeof(uint16_t));
      Exl3Group group;
      group.count = 1;
      group.members[0] = Exl3GroupMember{.trellis = linear.exl3()->trellis, .decoded = decoded.as<uint16_t>()};
      check(exl3_decode_rotated(*linear.exl3(), group, nullptr), "decode");
      std::vector<uint16_t> got(expected.size());
      decoded.download(got.data(), got.size() * sizeof(uint16_t));
      EXPECT_EQ(got, expected) << exl3::codebook_name(codebook) << " bits " << bits;
    }
  }
}

// The in-register GEMM's 128-row blocks take 102 KiB of shared memory: where a block may not have that (99 KiB on
// sm_86, sm_89 and the 12.x parts), 64-row blocks (51 KiB). No GPU needed.
TEST(CudaLinearTest, Exl3GemmTakesShortBlocksWhereSharedMemoryIsSmall) {
  Exl3Group group;
  group.count = 1;
  group.members[0].num_tokens = 4096;  // 32 x 16 blocks of 128 rows for 2048 outputs: every SM has one
  EXPECT_EQ(exl3_gemm_block_rows(group, 2048, 132, 227 * 1024), 128);
  EXPECT_EQ(exl3_gemm_block_rows(group, 2048, 132, 99 * 1024), 64);
  group.members[0].num_tokens = 256;  // 2 x 16 blocks of 128 rows would leave SMs idle
  EXPECT_EQ(exl3_gemm_block_rows(group, 2048, 132, 227 * 1024), 64);
}

TEST(CudaLinearTest, Exl3GemmPathMatchesCpuForEveryCodebookAndBitrate) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Gemm gemm;
  ASSERT_TRUE(gemm.available()) << "cuBLASLt did not load on a GPU machine";
  uint32_t seed = 60;
  // k padded to 2 and to 3 chunks of 128 (the kernel's register buffers alternate by pairs of chunks); rows that fill
  // 64-row blocks, end one part-way through an mma pair, and leave a second block 33 rows.
  for (const auto& [in, out] : {std::pair<int64_t, int64_t>{200, 300}, std::pair<int64_t, int64_t>{300, 200}}) {
    for (const Codebook codebook : {Codebook::inst3, Codebook::mcg, Codebook::mul1}) {
      for (int bits = exl3::kMinBits; bits <= exl3::kMaxBits; ++bits) {
        const RandomExl3Matrix m = random_exl3_matrix(out, in, bits, codebook, ++seed);
        const LinearWeight weight = m.weight();
        for (const int64_t tokens : {48, 53, 64, 97}) {
          const std::vector<float> x = random_values(static_cast<size_t>(tokens * in), seed + 100);
          const std::vector<float> expected = cpu_linear(weight, x, tokens);
          EXPECT_LT(relative_difference(gpu_linear(weight, x, tokens, &gemm), expected), kExl3Tolerance)
              << "decoded once: in " << in << " out " << out << " " << exl3::codebook_name(codebook) << " bits "
              << bits << " tokens " << tokens;
          EXPECT_LT(relative_difference(gpu_job(weight, x, tokens, gemm), expected), kExl3Tolerance)
              << "in registers: in " << in << " out " << out << " " << exl3::codebook_name(codebook) << " bits "
              << bits << " tokens " << tokens;
        }
      }
    }
  }
  // GLM-5.3-Flash's expert down_proj, 4 bpw MCG, at a prefill chunk's worth of tokens.
  const RandomExl3Matrix m = random_exl3_matrix(4096, 2048, 4, Codebook::mcg, 99);
  const std::vector<float> x = random_values(300 * 2048, 5);
  const std::vector<float> expected = cpu_linear(m.weight(), x, 300);
  EXPECT_LT(relative_difference(gpu_linear(m.weight(), x, 300, &gemm), expected), kExl3Tolerance);
  EXPECT_LT(relative_difference(gpu_job(m.weight(), x, 300, gemm), expected), kExl3Tolerance);
}

// DeviceLinear::forward_jobs: 24 EXL3 matrices, 20 of one format at GEMM-sized token counts (48 to 347 rows, most not
// a whole 64-row block), two of it at GEMV-sized counts, one of another bitrate and an empty job. The whole list holds
// a full group of the format, so the small ones join the GEMM too (groups of 16 and 6); its first six jobs do not, so
// there the small one takes the GEMV. Every output matches the CPU, as each matrix alone would.
TEST(CudaLinearTest, Exl3JobsMatchCpuGroupedOrNot) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Gemm gemm;
  ASSERT_TRUE(gemm.available()) << "cuBLASLt did not load on a GPU machine";
  constexpr int64_t kIn = 256, kOut = 384;
  std::vector<RandomExl3Matrix> matrices;
  std::vector<int64_t> tokens;
  for (int i = 0; i < 24; ++i) {
    matrices.push_back(random_exl3_matrix(kOut, kIn, i == 7 ? 3 : 4, Codebook::mcg, 300 + static_cast<uint32_t>(i)));
    tokens.push_back(i == 3 || i == 11 ? 20 + i : i == 5 ? 0 : 48 + 13 * i);
  }
  std::vector<DeviceLinear> linears;
  std::vector<std::vector<float>> xs;
  std::vector<DeviceBuffer> x_dev;
  for (size_t i = 0; i < matrices.size(); ++i) {
    linears.push_back(DeviceLinear::upload(matrices[i].weight(), device_info(0).sm_count));
    xs.push_back(random_values(static_cast<size_t>(tokens[i] * kIn), 400 + static_cast<uint32_t>(i)));
    x_dev.push_back(testing::to_device(xs.back().empty() ? std::vector<float>(1) : xs.back()));
  }
  for (const size_t count : {matrices.size(), size_t{6}}) {
    std::vector<DeviceBuffer> y_dev;
    std::vector<LinearJob> jobs;
    for (size_t i = 0; i < count; ++i) {
      y_dev.emplace_back(static_cast<size_t>(std::max<int64_t>(tokens[i], 1) * kOut) * sizeof(float));
      jobs.push_back(LinearJob{.linear = &linears[i], .x = x_dev[i].as<float>(), .num_tokens = tokens[i],
                               .y = y_dev[i].as<float>()});
    }
    Scratch scratch;
    DeviceLinear::forward_jobs(jobs, scratch, &gemm, nullptr);
    for (size_t i = 0; i < count; ++i) {
      if (tokens[i] == 0) continue;
      std::vector<float> got(static_cast<size_t>(tokens[i] * kOut));
      y_dev[i].download(got.data(), got.size() * sizeof(float));
      EXPECT_LT(relative_difference(got, cpu_linear(matrices[i].weight(), xs[i], tokens[i])), kExl3Tolerance)
          << count << " jobs: job " << i << " tokens " << tokens[i];
    }
  }
}

TEST(CudaLinearTest, Bf16GemmPathMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Gemm gemm;
  ASSERT_TRUE(gemm.available()) << "cuBLASLt did not load on a GPU machine";
  for (const int64_t in : {512, 4096}) {
    for (const int64_t out : {77, 1000}) {
      std::vector<uint16_t> bf16(static_cast<size_t>(out * in));
      const std::vector<float> w = random_values(bf16.size(), 3);
      for (size_t i = 0; i < w.size(); ++i) bf16[i] = f32_to_bf16(w[i]);
      const LinearWeight weight{.name = "dense", .dtype = DType::bf16, .out_features = out, .in_features = in,
                                .data = reinterpret_cast<const std::byte*>(bf16.data())};
      for (const int64_t tokens : {32, 33, 250}) {
        const std::vector<float> x = random_values(static_cast<size_t>(tokens * in), 11);
        EXPECT_LT(relative_difference(gpu_linear(weight, x, tokens, &gemm), cpu_linear(weight, x, tokens)),
                  kDenseTolerance)
            << "in " << in << " out " << out << " tokens " << tokens;
      }
    }
  }
}

// Matrices sharing an input: the bf16 ones on the GEMV go through one grouped launch (rows of several sizes, one not
// a multiple of the 128-row block, k split at in = 4096), the bf16 ones at the GEMM's token counts share one split of
// x into bf16 terms (after the f32 one, whose forward uses the same scratch); every output matches the CPU. One scratch serves every call, as in the backend: the split counters
// each call re-arms are the next call's.
TEST(CudaLinearTest, MatricesSharingAnInputMatchCpuGroupedOrNot) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Gemm gemm;
  for (const int64_t in : {512, 4096}) {
    const int64_t outs[] = {1000, 77, 8192, 64};
    std::vector<std::vector<uint16_t>> bf16;
    std::vector<LinearWeight> weights;
    for (const int64_t out : outs) {
      const std::vector<float> w = random_values(static_cast<size_t>(out * in), static_cast<uint32_t>(out));
      bf16.emplace_back(w.size());
      for (size_t i = 0; i < w.size(); ++i) bf16.back()[i] = f32_to_bf16(w[i]);
    }
    const std::vector<float> f32 = random_values(static_cast<size_t>(300 * in), 5);
    for (size_t m = 0; m < bf16.size(); ++m) {
      weights.push_back(LinearWeight{.name = "bf16", .dtype = DType::bf16, .out_features = outs[m],
                                     .in_features = in, .data = reinterpret_cast<const std::byte*>(bf16[m].data())});
    }
    weights.push_back(LinearWeight{.name = "f32", .dtype = DType::f32, .out_features = 300, .in_features = in,
                                   .data = reinterpret_cast<const std::byte*>(f32.data())});
    std::vector<DeviceLinear> linears;
    for (const LinearWeight& weight : weights) linears.push_back(DeviceLinear::upload(weight, device_info(0).sm_count));
    std::vector<const DeviceLinear*> placed;
    for (const DeviceLinear& linear : linears) placed.push_back(&linear);
    Scratch scratch;
    for (const int64_t tokens : {1, 5, 16, 17, 40, 1}) {
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * in), 11);
      const DeviceBuffer x_dev = testing::to_device(x);
      std::vector<DeviceBuffer> ys;
      std::vector<float*> y_ptrs;
      for (const LinearWeight& weight : weights) {
        ys.emplace_back(static_cast<size_t>(tokens * weight.out_features) * sizeof(float));
        y_ptrs.push_back(ys.back().as<float>());
      }
      DeviceLinear::forward_shared_input(placed, x_dev.as<float>(), tokens, y_ptrs, scratch, &gemm, nullptr);
      for (size_t m = 0; m < weights.size(); ++m) {
        EXPECT_LT(relative_difference(testing::to_host(ys[m]), cpu_linear(weights[m], x, tokens)), kDenseTolerance)
            << weights[m].name << " " << weights[m].out_features << " x " << in << ", " << tokens << " tokens";
      }
    }
  }
}

// The MLP's down projection with its activation applied as the input is staged computes, bit for bit, what the
// activation's launch and then the GEMV compute (k split at in = 2048, one pass and a pass with a remainder); a
// matrix that is not bf16, or a count on the GEMM, is left to the caller.
TEST(CudaLinearTest, SwigluInsideTheDownProjectionEqualsTheTwoLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kIn = 2048, kOut = 4096;
  constexpr float kLimit = 7.0f;
  const std::vector<float> w = random_values(static_cast<size_t>(kOut * kIn), 21);
  std::vector<uint16_t> bf16(w.size());
  for (size_t i = 0; i < w.size(); ++i) bf16[i] = f32_to_bf16(w[i]);
  const LinearWeight weight{.name = "down", .dtype = DType::bf16, .out_features = kOut, .in_features = kIn,
                            .data = reinterpret_cast<const std::byte*>(bf16.data())};
  const LinearWeight f32{.name = "down_f32", .dtype = DType::f32, .out_features = kOut, .in_features = kIn,
                         .data = reinterpret_cast<const std::byte*>(w.data())};
  const DeviceLinear linear = DeviceLinear::upload(weight, device_info(0).sm_count);
  const DeviceLinear linear_f32 = DeviceLinear::upload(f32, device_info(0).sm_count);
  Gemm gemm;
  Scratch scratch;
  for (const int64_t tokens : {1, 17, 3}) {
    // Gate and up around the limit on both sides, so the clamps are exercised.
    const std::vector<float> gate = random_values(static_cast<size_t>(tokens * kIn), 22, 10.0f);
    const std::vector<float> up = random_values(static_cast<size_t>(tokens * kIn), 23, 10.0f);
    const DeviceBuffer gate_dev = testing::to_device(gate), up_dev = testing::to_device(up);
    DeviceBuffer fused(static_cast<size_t>(tokens * kOut) * sizeof(float));
    DeviceBuffer hidden(gate.size() * sizeof(float)), unfused(static_cast<size_t>(tokens * kOut) * sizeof(float));
    ASSERT_TRUE(linear.forward_swiglu(gate_dev.as<float>(), up_dev.as<float>(), kLimit, tokens, fused.as<float>(),
                                      scratch, &gemm, nullptr));
    check(clamped_swiglu(gate_dev.as<float>(), up_dev.as<float>(), tokens * kIn, kLimit, hidden.as<float>(), nullptr),
          "clamped_swiglu");
    linear.forward(hidden.as<float>(), tokens, unfused.as<float>(), scratch, &gemm, nullptr);
    EXPECT_EQ(testing::to_host(fused), testing::to_host(unfused)) << tokens << " tokens";
    EXPECT_FALSE(linear_f32.forward_swiglu(gate_dev.as<float>(), up_dev.as<float>(), kLimit, tokens,
                                           fused.as<float>(), scratch, &gemm, nullptr));
  }
  const std::vector<float> many(static_cast<size_t>(64 * kIn), 1.0f);
  const DeviceBuffer many_dev = testing::to_device(many);
  DeviceBuffer out(static_cast<size_t>(64 * kOut) * sizeof(float));
  EXPECT_EQ(linear.forward_swiglu(many_dev.as<float>(), many_dev.as<float>(), kLimit, 64, out.as<float>(), scratch,
                                  &gemm, nullptr),
            !gemm.available())
      << "64 tokens run as a GEMM where cuBLASLt is usable";
}

// --dtype bfloat16: every path of a bf16 matrix (the CUDA-core GEMV at a width the tensor cores do not take, the
// tensor-core GEMV alone, grouped and with the SwiGLU inside, the cuBLASLt GEMM) takes x rounded to bf16, as the
// CPU backend does; the float32 product differs from it by x's rounding (about 1e-3 here), far above the bound.
TEST(CudaLinearTest, Bf16InputsAreRoundedOnEveryPath) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Gemm gemm;
  CpuBackend cpu;
  cpu.set_product_input(ProductInput::bf16);
  const auto cpu_rounded = [&](const LinearWeight& weight, const std::vector<float>& x, int64_t tokens) {
    std::vector<float> y(static_cast<size_t>(tokens * weight.out_features));
    cpu.linear(x.data(), tokens, weight, y.data());
    return y;
  };
  Scratch scratch;
  for (const int64_t in : {100, 512, 4096}) {
    const int64_t outs[] = {1000, 77};
    std::vector<std::vector<uint16_t>> bf16;
    std::vector<LinearWeight> weights;
    std::vector<DeviceLinear> linears;
    for (const int64_t out : outs) {
      const std::vector<float> w = random_values(static_cast<size_t>(out * in), static_cast<uint32_t>(out + in));
      bf16.emplace_back(w.size());
      for (size_t i = 0; i < w.size(); ++i) bf16.back()[i] = f32_to_bf16(w[i]);
      weights.push_back(LinearWeight{.name = "bf16", .dtype = DType::bf16, .out_features = out, .in_features = in,
                                     .data = reinterpret_cast<const std::byte*>(bf16.back().data())});
    }
    for (const LinearWeight& weight : weights) {
      linears.push_back(DeviceLinear::upload(weight, device_info(0).sm_count, ProductInput::bf16));
    }
    const std::vector<const DeviceLinear*> placed = {&linears[0], &linears[1]};
    for (const int64_t tokens : {1, 5, 17, 40}) {
      SCOPED_TRACE(::testing::Message() << "in " << in << ", " << tokens << " tokens");
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * in), 12);
      const std::vector<float> up = random_values(x.size(), 13);
      const DeviceBuffer x_dev = testing::to_device(x), up_dev = testing::to_device(up);
      DeviceBuffer alone(static_cast<size_t>(tokens * outs[0]) * sizeof(float));
      linears[0].forward(x_dev.as<float>(), tokens, alone.as<float>(), scratch, &gemm, nullptr);
      const std::vector<float> expected = cpu_rounded(weights[0], x, tokens);
      EXPECT_LT(relative_difference(testing::to_host(alone), expected), kDenseTolerance);
      EXPECT_GT(relative_difference(cpu_linear(weights[0], x, tokens), expected), 30 * kDenseTolerance);
      std::vector<DeviceBuffer> ys;
      ys.emplace_back(static_cast<size_t>(tokens * outs[0]) * sizeof(float));
      ys.emplace_back(static_cast<size_t>(tokens * outs[1]) * sizeof(float));
      float* const y_ptrs[] = {ys[0].as<float>(), ys[1].as<float>()};
      DeviceLinear::forward_shared_input(placed, x_dev.as<float>(), tokens, y_ptrs, scratch, &gemm, nullptr);
      for (size_t m = 0; m < 2; ++m) {
        EXPECT_LT(relative_difference(testing::to_host(ys[m]), cpu_rounded(weights[m], x, tokens)), kDenseTolerance)
            << "shared input, matrix " << m;
      }
      if (linears[0].forward_swiglu(x_dev.as<float>(), up_dev.as<float>(), 7.0f, tokens, alone.as<float>(), scratch,
                                    &gemm, nullptr)) {  // the activation rounded, as its launch then the GEMV do
        DeviceBuffer hidden(x.size() * sizeof(float)), unfused(alone.size());
        check(clamped_swiglu(x_dev.as<float>(), up_dev.as<float>(), tokens * in, 7.0f, hidden.as<float>(), nullptr),
              "clamped_swiglu");
        linears[0].forward(hidden.as<float>(), tokens, unfused.as<float>(), scratch, &gemm, nullptr);
        EXPECT_EQ(testing::to_host(alone), testing::to_host(unfused)) << "SwiGLU inside";
      }
    }
  }
}

TEST(CudaLinearTest, DenseMatchesCpuForEachWeightType) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // in = 512 and 4096 take the 16-byte vector loads for f32/f16 (4096: every unrolled load in use) and the
  // tensor-core kernel for bf16 (4096: k split over blocks); in = 300 the scalar loop for f16/bf16. Token counts
  // cover one pass of each size class and a pass and a remainder (17: a 16-token and a 1-token tensor-core pass).
  for (const int64_t in : {300, 512, 4096}) {
    const int64_t out = 77;
    const std::vector<float> w = random_values(static_cast<size_t>(out * in), 3);
    std::vector<uint16_t> bf16(w.size()), f16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      bf16[i] = f32_to_bf16(w[i]);
      f16[i] = f32_to_f16(w[i]);
    }
    const std::pair<DType, const void*> cases[] = {{DType::f32, w.data()}, {DType::f16, f16.data()},
                                                   {DType::bf16, bf16.data()}};
    for (const auto& [dtype, data] : cases) {
      const LinearWeight weight{.name = "dense", .dtype = dtype, .out_features = out, .in_features = in,
                                .data = static_cast<const std::byte*>(data)};
      for (const int64_t tokens : {1, 4, 5, 8, 17}) {
        const std::vector<float> x = random_values(static_cast<size_t>(tokens * in), 11);
        EXPECT_LT(relative_difference(gpu_linear(weight, x, tokens), cpu_linear(weight, x, tokens)), kDenseTolerance)
            << dtype_name(dtype) << " in " << in << " tokens " << tokens;
      }
    }
  }
}

TEST(CudaLinearTest, BlockFp8MatchesCpuForEachScaleType) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // 300 rows: a ragged last row block. in = 512 and 400 (a ragged 16-column last block) take the vector path,
  // in = 300 the scalar loop, in = 8192 the vector path with k split over blocks (dense_splits).
  const int64_t out = 300, block = 128;
  std::mt19937 rng(21);
  for (const int64_t in : {512, 400, 300, 8192}) {
    std::vector<uint8_t> codes(static_cast<size_t>(out * in));
    for (uint8_t& c : codes) {
      do c = static_cast<uint8_t>(rng()); while ((c & 0x7F) == 0x7F);  // every finite e4m3 code (0x7F/0xFF are NaN)
    }
    const int64_t grid = ((out + block - 1) / block) * ((in + block - 1) / block);
    const std::vector<float> scales = random_values(static_cast<size_t>(grid), 22, 0.01f);
    std::vector<uint16_t> scales_bf16(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) scales_bf16[i] = f32_to_bf16(scales[i]);
    const std::pair<DType, const void*> cases[] = {{DType::f32, scales.data()}, {DType::bf16, scales_bf16.data()}};
    for (const auto& [scale_dtype, scale_data] : cases) {
      const LinearWeight weight{.name = "fp8", .dtype = DType::f8_e4m3, .out_features = out, .in_features = in,
                                .data = reinterpret_cast<const std::byte*>(codes.data()),
                                .scale = static_cast<const std::byte*>(scale_data), .scale_dtype = scale_dtype,
                                .block_rows = block, .block_cols = block};
      for (const int64_t tokens : {1, 5, 17}) {
        const std::vector<float> x = random_values(static_cast<size_t>(tokens * in), 23);
        EXPECT_LT(relative_difference(gpu_linear(weight, x, tokens), cpu_linear(weight, x, tokens)), kDenseTolerance)
            << "in " << in << " scales " << dtype_name(scale_dtype) << " tokens " << tokens;
      }
    }
  }
}

// Few long rows (the mHC mixes: 24 x 16384) are split along k so that they occupy the GPU; tall matrices are not.
// bf16 matrices with in_features a multiple of 32 take the tensor-core kernel (128 rows a block, k in stages of 256);
// the others the CUDA-core one (8 rows a block for one token, whole 512-byte warp passes per split). Host arithmetic
// only: runs without a GPU.
TEST(CudaLinearTest, FewRowsAreSplitAlongK) {
  EXPECT_EQ(dense_splits(DenseWeightType::bf16, 24, 16384), 64);  // one row block; 64 stages
  EXPECT_EQ(dense_splits(DenseWeightType::bf16, 77, 4096), 16);
  EXPECT_EQ(dense_splits(DenseWeightType::f16, 77, 4096), 4);
  EXPECT_EQ(dense_splits(DenseWeightType::f8_e4m3, 300, 8192), 4);
  EXPECT_EQ(dense_splits(DenseWeightType::bf16, 154880, 4096), 1);  // lm_head: rows enough
  EXPECT_EQ(dense_splits(DenseWeightType::bf16, 77, 256), 1);       // one stage
  EXPECT_EQ(dense_splits(DenseWeightType::f16, 77, 512), 1);        // under two passes per row
  // Room for either kernel (a bf16 call with unaligned pointers falls back to the CUDA-core one).
  EXPECT_EQ(dense_scratch_floats(DenseWeightType::bf16, 24, 16384), 64 * 16 * 24);
  EXPECT_EQ(dense_scratch_floats(DenseWeightType::f16, 24, 16384), 16 * 8 * 24);
  EXPECT_EQ(dense_scratch_floats(DenseWeightType::bf16, 154880, 4096), 0);
}

TEST(CudaLinearTest, Fp8BlocksTheKernelCannotTakeAreRefusedWithTheName) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<uint8_t> data(128 * 128, 0x38);
  const std::vector<float> scales(16 * 16, 1.0f);
  const LinearWeight weight{.name = "layers.0.mlp.gate_proj.weight", .dtype = DType::f8_e4m3, .out_features = 128,
                            .in_features = 128, .data = reinterpret_cast<const std::byte*>(data.data()),
                            .scale = reinterpret_cast<const std::byte*>(scales.data()), .scale_dtype = DType::f32,
                            .block_rows = 8, .block_cols = 8};
  try {
    (void)DeviceLinear::upload(weight, 1);
    FAIL() << "fp8 with 8-column scale blocks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.mlp.gate_proj.weight"), std::string::npos) << e.what();
  }
}

TEST(CudaRuntimeTest, WithoutAGpuAllocationFailsWithAClearError) {
  if (have_gpu()) GTEST_SKIP() << "a CUDA device is present";
  try {
    DeviceBuffer buffer(1024);
    FAIL() << "cudaMalloc succeeded without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
}

TEST(CudaRuntimeTest, TransfersOutsideTheBufferAreRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer buffer(16);
  const std::vector<char> host(32, 1);
  EXPECT_THROW(buffer.upload(host.data(), 32), Error);
  EXPECT_THROW(buffer.upload(host.data(), 8, 12), Error);
  std::vector<char> back(16);
  buffer.upload(host.data(), 16);
  buffer.download(back.data(), 16);
  EXPECT_EQ(back, std::vector<char>(16, 1));
}

}  // namespace
}  // namespace kestrel::cuda
