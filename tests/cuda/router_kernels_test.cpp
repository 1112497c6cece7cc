// The CUDA MoE router against the CPU backend's route_experts: GLM-5.3-Flash's shape (288 experts, top 8, one
// group), the nano model's (24, top 4), grouped routing (8 groups, 4 kept), ties, NaN logits, and with and without
// normalisation, at 3 tokens (a block of 256 threads each) and 19 (a warp each). The chosen experts must be identical
// (same order); weights within 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/router_kernels.h"
#include "base/error.h"
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

using namespace kestrel::cuda::testing;

struct Case {
  int64_t experts, top_k, n_group, topk_group;
  bool normalise;
};

TEST(CudaRouterTest, MatchesCpuSelectionAndWeights) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  uint32_t seed = 1;
  for (const int64_t T : {int64_t{3}, int64_t{19}}) {
    // GLM-5.3-Flash's one group, DeepSeek's 8 groups of which 4 are kept, and 4 groups all kept (no masking).
    for (const Case c : {Case{288, 8, 1, 1, true}, Case{24, 4, 1, 1, true}, Case{256, 8, 8, 4, true},
                         Case{64, 6, 1, 1, false}, Case{96, 6, 4, 4, true}}) {
      std::vector<float> logits = random_values(static_cast<size_t>(T * c.experts), ++seed, 2.0f);
      // Token 0: every logit equal, so the selection is decided by the tie rule alone.
      std::fill(logits.begin(), logits.begin() + c.experts, 0.5f);
      // Token 1: NaN logits in a third of the experts, which rank last on both backends.
      for (int64_t e = 0; e < c.experts; e += 3) logits[static_cast<size_t>(c.experts + e)] = NAN;
      const std::vector<float> bias = random_values(static_cast<size_t>(c.experts), ++seed, 0.1f);
      std::vector<int32_t> ids(static_cast<size_t>(T * c.top_k));
      std::vector<float> weights(ids.size());
      // With a zero bias token 0's choices tie exactly; with the random bias they are ordered by the bias.
      for (const bool with_bias : {true, false}) {
        const std::vector<float> used_bias = with_bias ? bias : std::vector<float>(bias.size(), 0.0f);
        cpu.route_experts(RouterArgs{.num_tokens = T, .num_experts = c.experts, .top_k = c.top_k, .n_group = c.n_group,
                                     .topk_group = c.topk_group, .norm_topk_prob = c.normalise,
                                     .routed_scaling_factor = 2.5f, .logits = logits.data(),
                                     .correction_bias = used_bias.data(), .expert_ids = ids.data(),
                                     .expert_weights = weights.data()});
        const DeviceBuffer logits_dev = to_device(logits), bias_dev = to_device(used_bias);
        DeviceBuffer ids_dev(ids.size() * sizeof(int32_t)), weights_dev(weights.size() * sizeof(float));
        check(route_experts(RouterDeviceArgs{.num_tokens = T, .num_experts = c.experts, .top_k = c.top_k,
                                             .n_group = c.n_group, .topk_group = c.topk_group,
                                             .norm_topk_prob = c.normalise, .routed_scaling_factor = 2.5f,
                                             .logits = logits_dev.as<float>(), .correction_bias = bias_dev.as<float>(),
                                             .expert_ids = ids_dev.as<int32_t>(),
                                             .expert_weights = weights_dev.as<float>()},
                            nullptr),
              "route_experts");
        const std::string where = "tokens " + std::to_string(T) + " experts " + std::to_string(c.experts) +
                                  " bias " + std::to_string(with_bias);
        EXPECT_EQ(to_host<int32_t>(ids_dev), ids) << where;
        EXPECT_LT(relative_difference(to_host(weights_dev), weights), 1e-6) << where;
      }
    }
  }
}

TEST(CudaRouterTest, ImpossibleSelectionsAreRefused) {
  // Checked before any launch: with or without a GPU.
  const auto status = [](int64_t experts, int64_t top_k, int64_t n_group, int64_t topk_group) {
    return route_experts(RouterDeviceArgs{.num_tokens = 1, .num_experts = experts, .top_k = top_k,
                                          .n_group = n_group, .topk_group = topk_group},
                         nullptr);
  };
  EXPECT_EQ(status(10, 2, 3, 1), cudaErrorInvalidValue);  // groups do not divide the experts
  EXPECT_EQ(status(16, 5, 8, 2), cudaErrorInvalidValue);  // two kept groups of two hold only four experts
  EXPECT_EQ(status(8, 1, 8, 1), cudaErrorInvalidValue);   // one expert per group has no second best
  EXPECT_EQ(status(kMaxRoutedExperts + 2, 8, 1, 1), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kestrel::cuda
