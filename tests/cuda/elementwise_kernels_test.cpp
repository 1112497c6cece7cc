// The CUDA norms, elementwise ops, stream copies and the embedding gather against the CPU backend, on random inputs
// at the model's row widths (nano 256, GLM-5.3-Flash 4096 and 4 x 4096 for the flattened mHC streams). They differ
// from the CPU only in summation order and in the device's expf, so the tolerance is 1e-5 of the largest output.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/norm_kernels.h"
#include "base/error.h"
#include "base/numeric.h"
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

using namespace kestrel::cuda::testing;

constexpr double kTolerance = 1e-5;
// Up to 512 elements a row takes a warp, above a block.
constexpr int64_t kWidths[] = {256, 4096, 16384, 300, 512, 513};

TEST(CudaNormTest, RmsNormMatchesCpuWithAndWithoutWeight) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  for (const int64_t n : kWidths) {
    const int64_t rows = 7;
    const std::vector<float> x = random_values(static_cast<size_t>(rows * n), 1, 3.0f);
    const std::vector<float> weight = random_values(static_cast<size_t>(n), 2);
    const DeviceBuffer x_dev = to_device(x), w_dev = to_device(weight);
    for (const bool weighted : {true, false}) {
      std::vector<float> expected(x.size());
      cpu.rms_norm(x.data(), rows, n, weighted ? weight.data() : nullptr, 1e-5f, expected.data());
      DeviceBuffer y(x.size() * sizeof(float));
      check(rms_norm(x_dev.as<float>(), rows, n, weighted ? w_dev.as<float>() : nullptr, 1e-5f, y.as<float>(),
                     nullptr),
            "rms_norm");
      EXPECT_LT(relative_difference(to_host(y), expected), kTolerance) << "n " << n;
    }
  }
}

TEST(CudaNormTest, RmsNormInPlaceEqualsOutOfPlace) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t n : {int64_t{4096}, int64_t{128}}) {
    const std::vector<float> x = random_values(static_cast<size_t>(3 * n), 3);
    DeviceBuffer in_place = to_device(x), out(x.size() * sizeof(float));
    const DeviceBuffer source = to_device(x);
    check(rms_norm(source.as<float>(), 3, n, nullptr, 1e-6f, out.as<float>(), nullptr), "rms_norm");
    check(rms_norm(in_place.as<float>(), 3, n, nullptr, 1e-6f, in_place.as<float>(), nullptr), "rms_norm");
    EXPECT_EQ(to_host(in_place), to_host(out)) << "n " << n;
  }
}

TEST(CudaNormTest, LayerNormAndGatedRmsNormMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  for (const int64_t n : {int64_t{32}, int64_t{128}, int64_t{300}}) {
    const int64_t rows = 9;
    std::vector<float> x = random_values(static_cast<size_t>(rows * n), 4, 2.0f);
    for (float& v : x) v += 1.5f;  // a mean far from zero exercises the centring
    const std::vector<float> weight = random_values(static_cast<size_t>(n), 5);
    const std::vector<float> bias = random_values(static_cast<size_t>(n), 6);
    const std::vector<float> gate = random_values(x.size(), 7, 3.0f);
    const DeviceBuffer x_dev = to_device(x), w_dev = to_device(weight), b_dev = to_device(bias),
                       g_dev = to_device(gate);
    DeviceBuffer y(x.size() * sizeof(float));

    std::vector<float> expected(x.size());
    cpu.layer_norm(x.data(), rows, n, weight.data(), bias.data(), 1e-6f, expected.data());
    check(layer_norm(x_dev.as<float>(), rows, n, w_dev.as<float>(), b_dev.as<float>(), 1e-6f, y.as<float>(), nullptr),
          "layer_norm");
    EXPECT_LT(relative_difference(to_host(y), expected), kTolerance) << "layer_norm n " << n;

    cpu.gated_rms_norm(x.data(), gate.data(), rows, n, weight.data(), 1e-5f, expected.data());
    check(gated_rms_norm(x_dev.as<float>(), g_dev.as<float>(), rows, n, w_dev.as<float>(), 1e-5f, y.as<float>(),
                         nullptr),
          "gated_rms_norm");
    EXPECT_LT(relative_difference(to_host(y), expected), kTolerance) << "gated n " << n;
  }
}

TEST(CudaElementwiseTest, OpsMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  const size_t n = 70001;  // not a multiple of the block size
  const std::vector<float> a = random_values(n, 8, 8.0f), b = random_values(n, 9, 8.0f);
  const DeviceBuffer a_dev = to_device(a), b_dev = to_device(b);

  std::vector<float> expected(n);
  cpu.clamped_swiglu(a.data(), b.data(), 1, static_cast<int64_t>(n), 7.0f, expected.data());
  DeviceBuffer out(n * sizeof(float));
  check(clamped_swiglu(a_dev.as<float>(), b_dev.as<float>(), static_cast<int64_t>(n), 7.0f, out.as<float>(), nullptr),
        "clamped_swiglu");
  EXPECT_LT(relative_difference(to_host(out), expected), kTolerance) << "clamped_swiglu";

  expected = a;
  cpu.sigmoid(expected.data(), static_cast<int64_t>(n));
  DeviceBuffer work = to_device(a);
  check(sigmoid(work.as<float>(), static_cast<int64_t>(n), nullptr), "sigmoid");
  EXPECT_LT(relative_difference(to_host(work), expected), kTolerance) << "sigmoid";

  expected = a;
  cpu.add(b.data(), static_cast<int64_t>(n), expected.data());
  work = to_device(a);
  check(add(b_dev.as<float>(), static_cast<int64_t>(n), work.as<float>(), nullptr), "add");
  EXPECT_EQ(to_host(work), expected) << "add";
}

TEST(CudaElementwiseTest, StreamExpandAndMeanMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  const int64_t T = 5, hc = 4, D = 300;
  const std::vector<float> x = random_values(static_cast<size_t>(T * D), 10);
  std::vector<float> streams = random_values(static_cast<size_t>(T * hc * D), 11);
  std::vector<float> expected(streams.size());
  cpu.stream_expand(x.data(), T, hc, D, expected.data());
  const DeviceBuffer x_dev = to_device(x);
  DeviceBuffer s_dev(streams.size() * sizeof(float));
  check(stream_expand(x_dev.as<float>(), T, hc, D, s_dev.as<float>(), nullptr), "stream_expand");
  EXPECT_EQ(to_host(s_dev), expected);

  std::vector<float> mean(x.size());
  cpu.stream_mean(streams.data(), T, hc, D, mean.data());
  const DeviceBuffer streams_dev = to_device(streams);
  DeviceBuffer mean_dev(x.size() * sizeof(float));
  check(stream_mean(streams_dev.as<float>(), T, hc, D, mean_dev.as<float>(), nullptr), "stream_mean");
  EXPECT_LT(relative_difference(to_host(mean_dev), mean), kTolerance);
}

TEST(CudaElementwiseTest, EmbeddingGatherMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t vocab = 1000, D = 256;
  const std::vector<float> table = random_values(static_cast<size_t>(vocab * D), 12);
  std::vector<uint16_t> bf16(table.size());
  for (size_t i = 0; i < table.size(); ++i) bf16[i] = f32_to_bf16(table[i]);
  const LinearWeight weight{.name = "embed_tokens", .dtype = DType::bf16, .out_features = vocab, .in_features = D,
                            .data = reinterpret_cast<const std::byte*>(bf16.data())};
  const std::vector<int32_t> ids = {0, 999, 17, 17, 512};
  const auto T = static_cast<int64_t>(ids.size());
  std::vector<float> expected(static_cast<size_t>(T * D));
  CpuBackend().embed(ids.data(), T, weight, expected.data());
  const DeviceLinear table_dev = DeviceLinear::upload(weight, 1);
  const DeviceBuffer ids_dev = to_device(ids);
  DeviceBuffer out(expected.size() * sizeof(float));
  table_dev.gather_rows(ids_dev.as<int32_t>(), T, out.as<float>(), nullptr);
  EXPECT_EQ(to_host(out), expected);
}

}  // namespace
}  // namespace kestrel::cuda
