// The fused CUDA MoE path (DeviceExperts: gate/up/down over every token-expert slot in one launch each, clamped
// SwiGLU, weighted combine) against the CPU backend's moe_experts on random EXL3 experts, for decode (1 token) and
// small batches where tokens share experts. The EXL3 kernel rounds each projection's rotated input to fp16
// (about 2.5e-4 of the output per projection, see device_linear_test); two projections in a row give the 2e-3 bound.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_experts.h"
#include "base/error.h"
#include "cuda_test_util.h"
#include "exl3_random_matrix.h"

namespace kestrel::cuda {
namespace {

using exl3::Codebook;
using kestrel::testing::random_exl3_matrix;
using kestrel::testing::RandomExl3Matrix;
using namespace kestrel::cuda::testing;

constexpr double kTolerance = 2e-3;

struct RandomExperts {
  std::vector<RandomExl3Matrix> matrices;  // gate, up, down per expert
  std::vector<ExpertWeights> weights;
};

RandomExperts random_experts(int64_t count, int64_t hidden, int64_t intermediate, uint32_t seed) {
  RandomExperts result;
  result.matrices.reserve(static_cast<size_t>(count * 3));
  for (int64_t e = 0; e < count; ++e) {
    result.matrices.push_back(random_exl3_matrix(intermediate, hidden, 4, Codebook::mcg, seed++));
    result.matrices.push_back(random_exl3_matrix(intermediate, hidden, 4, Codebook::mcg, seed++));
    result.matrices.push_back(random_exl3_matrix(hidden, intermediate, 4, Codebook::mcg, seed++));
  }
  for (int64_t e = 0; e < count; ++e) {
    const auto m = [&](int64_t which) { return result.matrices[static_cast<size_t>(e * 3 + which)].weight(); };
    result.weights.push_back(ExpertWeights{.gate = m(0), .up = m(1), .down = m(2)});
  }
  return result;
}

// What a call added to out: after - before, element by element.
std::vector<float> added(std::vector<float> after, const std::vector<float>& before) {
  for (size_t i = 0; i < after.size(); ++i) after[i] -= before[i];
  return after;
}

// Distinct experts per token (as a router picks them), weights in (0, 1).
void random_routing(int64_t tokens, int64_t top_k, int64_t experts, uint32_t seed, std::vector<int32_t>& ids,
                    std::vector<float>& weights) {
  std::mt19937 rng(seed);
  std::vector<int32_t> order(static_cast<size_t>(experts));
  ids.clear();
  weights.clear();
  for (int64_t t = 0; t < tokens; ++t) {
    for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int32_t>(e);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t j = 0; j < top_k; ++j) {
      ids.push_back(order[static_cast<size_t>(j)]);
      weights.push_back(std::uniform_real_distribution<float>(0.05f, 1.0f)(rng));
    }
  }
}

TEST(CudaExpertsTest, FusedMoeMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int64_t experts, hidden, intermediate, top_k;
  };
  CpuBackend cpu;
  Scratch scratch;
  uint32_t seed = 1;
  for (const Shape shape : {Shape{24, 256, 128, 4}, Shape{16, 1024, 512, 8}}) {
    const RandomExperts experts = random_experts(shape.experts, shape.hidden, shape.intermediate, seed += 100);
    const DeviceExperts device = DeviceExperts::upload(experts.weights, device_info(0).sm_count);
    for (const int64_t tokens : {1, 3, 20}) {
      std::vector<int32_t> ids;
      std::vector<float> weights;
      random_routing(tokens, shape.top_k, shape.experts, ++seed, ids, weights);
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * shape.hidden), ++seed);
      // The experts add into what out holds.
      const std::vector<float> initial = random_values(x.size(), ++seed);
      std::vector<float> expected = initial;
      const DeviceBuffer x_dev = to_device(x), ids_dev = to_device(ids), weights_dev = to_device(weights);
      DeviceBuffer out = to_device(initial);
      cpu.moe_experts(MoeArgs{.num_tokens = tokens, .hidden = shape.hidden, .intermediate = shape.intermediate,
                              .top_k = shape.top_k, .swiglu_limit = 7.0f, .x = x.data(), .experts = &experts.weights,
                              .expert_ids = ids.data(), .expert_weights = weights.data(), .out = expected.data()});
      device.forward(x_dev.as<float>(), tokens, shape.top_k, ids_dev.as<int32_t>(), weights_dev.as<float>(), 7.0f,
                     out.as<float>(), scratch, nullptr);
      EXPECT_LT(relative_difference(added(to_host(out), initial), added(expected, initial)), kTolerance)
          << "experts " << shape.experts << " hidden " << shape.hidden << " tokens " << tokens;
    }
  }
}

// CudaBackend::moe_experts runs the fused path up to 64 tokens and groups longer calls' tokens by expert: both,
// either side of the switch, against the CPU.
TEST(CudaExpertsTest, BackendMoeMatchesCpuOnBothPaths) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kExperts = 12, kHidden = 256, kIntermediate = 128, kTopK = 4;
  CpuBackend cpu;
  CudaBackend gpu(0);
  const RandomExperts experts = random_experts(kExperts, kHidden, kIntermediate, 900);
  const std::shared_ptr<const PlacedWeight> placed = gpu.place_experts(experts.weights);
  uint32_t seed = 950;
  // 64 tokens: the fused path; 65: grouped by expert, about 22 tokens each (the GEMV); 700: about 233 each, the
  // EXL3 GEMM path's steps as groups of the 12 experts' matrices (DeviceLinear::forward_jobs).
  for (const int64_t tokens : {64, 65, 700}) {
    std::vector<int32_t> ids;
    std::vector<float> weights;
    random_routing(tokens, kTopK, kExperts, ++seed, ids, weights);
    const std::vector<float> x = random_values(static_cast<size_t>(tokens * kHidden), ++seed);
    // The experts add into what out holds.
    const std::vector<float> initial = random_values(x.size(), ++seed);
    std::vector<float> expected = initial;
    const DeviceBuffer x_dev = to_device(x), ids_dev = to_device(ids), weights_dev = to_device(weights);
    DeviceBuffer out = to_device(initial);
    const MoeArgs args{.num_tokens = tokens, .hidden = kHidden, .intermediate = kIntermediate, .top_k = kTopK,
                       .swiglu_limit = 7.0f, .x = x.data(), .experts = &experts.weights,
                       .expert_ids = ids.data(), .expert_weights = weights.data(), .out = expected.data()};
    cpu.moe_experts(args);
    MoeArgs device_args = args;
    device_args.x = x_dev.as<float>();
    device_args.placed_experts = placed.get();
    device_args.expert_ids = ids_dev.as<int32_t>();
    device_args.expert_weights = weights_dev.as<float>();
    device_args.out = out.as<float>();
    gpu.moe_experts(device_args);
    gpu.synchronize();
    EXPECT_LT(relative_difference(added(to_host(out), initial), added(expected, initial)), kTolerance)
        << "tokens " << tokens;
  }
}

TEST(CudaExpertsTest, NonExl3ExpertsAreRefusedWithTheirName) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<uint16_t> bf16(128 * 256, 0x3F80);
  const LinearWeight dense{.name = "layers.1.mlp.experts.0.gate_proj.weight", .dtype = DType::bf16,
                           .out_features = 128, .in_features = 256,
                           .data = reinterpret_cast<const std::byte*>(bf16.data())};
  try {
    (void)DeviceExperts::upload({ExpertWeights{.gate = dense, .up = dense, .down = dense}}, 1);
    FAIL() << "bf16 experts were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.0.gate_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel::cuda
