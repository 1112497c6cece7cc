// The CUDA mHC pre-mix (rms_norm of the flattened streams, the fn linear, mhc_mix) and post-mix against the CPU
// backend's mhc_pre/mhc_post, at the nano model's shape and GLM-5.3-Flash's (hc 4, hidden 4096), with an fn of
// bf16 weights as in the checkpoints. The Sinkhorn weights are computed in the CPU's order; differences come from
// the linear's summation order and the device's expf, so the tolerance is 1e-5 of the largest value.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/mhc_kernels.h"
#include "backend/cuda/norm_kernels.h"
#include "base/error.h"
#include "base/numeric.h"
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

using namespace kestrel::cuda::testing;

constexpr double kTolerance = 1e-5;

struct Case {
  int64_t tokens, hc, hidden;
};

TEST(CudaMhcTest, PreAndPostMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  Scratch scratch;
  for (const Case c : {Case{1, 4, 256}, Case{6, 4, 256}, Case{2, 4, 4096}, Case{3, 2, 100}}) {
    const int64_t mix = (2 + c.hc) * c.hc, width = c.hc * c.hidden;
    const std::vector<float> fn = random_values(static_cast<size_t>(mix * width), 1, 0.05f);
    std::vector<uint16_t> fn_bf16(fn.size());
    for (size_t i = 0; i < fn.size(); ++i) fn_bf16[i] = f32_to_bf16(fn[i]);
    MhcWeights weights{.fn = LinearWeight{.name = "hc_fn", .dtype = DType::bf16, .out_features = mix,
                                          .in_features = width,
                                          .data = reinterpret_cast<const std::byte*>(fn_bf16.data())},
                       .base = random_values(static_cast<size_t>(mix), 2),
                       .scale = std::vector<float>{0.7f, 1.3f, 2.0f}};
    const MhcShape shape{.num_tokens = c.tokens, .hc_mult = c.hc, .hidden = c.hidden, .rms_eps = 1e-6f,
                         .hc_eps = 1e-6f, .sinkhorn_iters = 20};
    const std::vector<float> streams = random_values(static_cast<size_t>(c.tokens * width), 3, 2.0f);
    std::vector<float> post(static_cast<size_t>(c.tokens * c.hc)), comb(static_cast<size_t>(c.tokens * c.hc * c.hc));
    std::vector<float> collapsed(static_cast<size_t>(c.tokens * c.hidden));
    cpu.mhc_pre(shape, weights, streams.data(), post.data(), comb.data(), collapsed.data());

    const DeviceLinear fn_dev = DeviceLinear::upload(weights.fn, device_info(0).sm_count);
    const DeviceBuffer streams_dev = to_device(streams), base_dev = to_device(weights.base.values),
                       scale_dev = to_device(weights.scale.values);
    DeviceBuffer flat(streams.size() * sizeof(float)), mixes(static_cast<size_t>(c.tokens * mix) * sizeof(float));
    DeviceBuffer post_dev(post.size() * sizeof(float)), comb_dev(comb.size() * sizeof(float)),
        collapsed_dev(collapsed.size() * sizeof(float));
    check(rms_norm(streams_dev.as<float>(), c.tokens, width, nullptr, shape.rms_eps, flat.as<float>(), nullptr),
          "rms_norm");
    fn_dev.forward(flat.as<float>(), c.tokens, mixes.as<float>(), scratch, nullptr, nullptr);
    check(mhc_mix(MhcMixArgs{.num_tokens = c.tokens, .hc_mult = c.hc, .hidden = c.hidden, .hc_eps = shape.hc_eps,
                             .sinkhorn_iters = shape.sinkhorn_iters, .mixes = mixes.as<float>(),
                             .base = base_dev.as<float>(), .scale = scale_dev.as<float>(),
                             .streams = streams_dev.as<float>(), .post = post_dev.as<float>(),
                             .comb = comb_dev.as<float>(), .collapsed = collapsed_dev.as<float>()},
                  nullptr),
          "mhc_mix");
    const std::string where = "tokens " + std::to_string(c.tokens) + " hc " + std::to_string(c.hc) + " hidden " +
                              std::to_string(c.hidden);
    EXPECT_LT(relative_difference(to_host(post_dev), post), kTolerance) << where;
    EXPECT_LT(relative_difference(to_host(comb_dev), comb), kTolerance) << where;
    EXPECT_LT(relative_difference(to_host(collapsed_dev), collapsed), kTolerance) << where;

    // The post-mix from the CPU's weights, so that it is tested on its own.
    const std::vector<float> block_out = random_values(collapsed.size(), 4);
    std::vector<float> expected = streams;
    cpu.mhc_post(shape, post.data(), comb.data(), block_out.data(), expected.data());
    DeviceBuffer updated = to_device(streams);
    const DeviceBuffer cpu_post = to_device(post), cpu_comb = to_device(comb), out_dev = to_device(block_out);
    check(mhc_post(cpu_post.as<float>(), cpu_comb.as<float>(), out_dev.as<float>(), c.tokens, c.hc, c.hidden,
                   updated.as<float>(), nullptr),
          "mhc_post");
    EXPECT_LT(relative_difference(to_host(updated), expected), kTolerance) << where;
  }
}

// The fused site (two launches: pending post-mix, pre-mix, norm) through CudaBackend::mhc_site against the CPU
// backend's composition of mhc_post, mhc_pre and rms_norm, with and without a pending post-mix, fn in bf16 and f32;
// up to 16 tokens a block per (slice, token), from 17 tiles of 64 tokens (a partial tile, several, a hidden size
// that leaves a partial slice). The fused form divides fn · streams by the rms after the product instead of
// before, which moves the mixes by a few float32 roundings; the Sinkhorn weights amplify that, hence 1e-4.
TEST(CudaMhcTest, FusedSiteMatchesCpuComposition) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr double kSiteTolerance = 1e-4;
  CpuBackend cpu;
  CudaBackend gpu(0);
  struct SiteCase {
    int64_t tokens, hc, hidden;
    bool pending;
    DType fn_dtype;
  };
  for (const SiteCase c : {SiteCase{1, 4, 4096, true, DType::bf16}, SiteCase{1, 4, 4096, false, DType::bf16},
                           SiteCase{5, 4, 256, true, DType::f32}, SiteCase{16, 2, 100, true, DType::bf16},
                           SiteCase{17, 4, 256, true, DType::bf16}, SiteCase{200, 4, 4096, true, DType::bf16},
                           SiteCase{130, 4, 256, false, DType::f32}, SiteCase{70, 2, 100, true, DType::bf16},
                           SiteCase{65, 3, 96, true, DType::f32}}) {
    const int64_t mix = (2 + c.hc) * c.hc, width = c.hc * c.hidden, T = c.tokens;
    const std::vector<float> fn = random_values(static_cast<size_t>(mix * width), 11, 0.05f);
    std::vector<uint16_t> fn_bf16(fn.size());
    for (size_t i = 0; i < fn.size(); ++i) fn_bf16[i] = f32_to_bf16(fn[i]);
    const auto* fn_data = c.fn_dtype == DType::bf16 ? reinterpret_cast<const std::byte*>(fn_bf16.data())
                                                    : reinterpret_cast<const std::byte*>(fn.data());
    MhcWeights weights{.fn = LinearWeight{.name = "hc_fn", .dtype = c.fn_dtype, .out_features = mix,
                                          .in_features = width, .data = fn_data},
                       .base = random_values(static_cast<size_t>(mix), 12),
                       .scale = std::vector<float>{0.7f, 1.3f, 2.0f}};
    const MhcShape shape{.num_tokens = T, .hc_mult = c.hc, .hidden = c.hidden, .rms_eps = 1e-6f, .hc_eps = 1e-6f,
                         .sinkhorn_iters = 20};
    const WeightVector norm = random_values(static_cast<size_t>(c.hidden), 13);
    const std::vector<float> streams = random_values(static_cast<size_t>(T * width), 14, 2.0f);
    const std::vector<float> pending_post = random_values(static_cast<size_t>(T * c.hc), 15);
    const std::vector<float> pending_comb = random_values(static_cast<size_t>(T * c.hc * c.hc), 16, 0.5f);
    const std::vector<float> block_out = random_values(static_cast<size_t>(T * c.hidden), 17);
    const auto sized = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };

    std::vector<float> cpu_streams = streams, post = sized(T * c.hc), comb = sized(T * c.hc * c.hc),
                       collapsed = sized(T * c.hidden), normed = sized(T * c.hidden);
    const MhcPendingPost cpu_pending{.post = pending_post.data(), .comb = pending_comb.data(),
                                     .block_out = block_out.data()};
    cpu.mhc_site(shape, c.pending ? &cpu_pending : nullptr, weights, norm.data(), cpu_streams.data(), post.data(),
                 comb.data(), collapsed.data(), normed.data());

    MhcWeights placed = weights;
    WeightVector placed_norm = norm;
    gpu.place(placed.fn);
    gpu.place(placed.base);
    gpu.place(placed.scale);
    gpu.place(placed_norm);
    DeviceBuffer streams_dev = to_device(streams);
    const DeviceBuffer post_in = to_device(pending_post), comb_in = to_device(pending_comb),
                       out_in = to_device(block_out);
    DeviceBuffer post_dev(post.size() * sizeof(float)), comb_dev(comb.size() * sizeof(float)),
        collapsed_dev(collapsed.size() * sizeof(float)), normed_dev(normed.size() * sizeof(float));
    const MhcPendingPost gpu_pending{.post = post_in.as<float>(), .comb = comb_in.as<float>(),
                                     .block_out = out_in.as<float>()};
    gpu.mhc_site(shape, c.pending ? &gpu_pending : nullptr, placed, placed_norm.data(), streams_dev.as<float>(),
                 post_dev.as<float>(), comb_dev.as<float>(), collapsed_dev.as<float>(), normed_dev.as<float>());
    gpu.synchronize();
    const std::string where = "tokens " + std::to_string(T) + " hc " + std::to_string(c.hc) + " hidden " +
                              std::to_string(c.hidden) + (c.pending ? " pending" : "");
    EXPECT_LT(relative_difference(to_host(streams_dev), cpu_streams), kSiteTolerance) << where;
    EXPECT_LT(relative_difference(to_host(post_dev), post), kSiteTolerance) << where;
    EXPECT_LT(relative_difference(to_host(comb_dev), comb), kSiteTolerance) << where;
    EXPECT_LT(relative_difference(to_host(collapsed_dev), collapsed), kSiteTolerance) << where;
    EXPECT_LT(relative_difference(to_host(normed_dev), normed), kSiteTolerance) << where;
  }
}

// The few-token site as one launch (a grid barrier between its parts) writes what its two launches write, bit for
// bit, over consecutive sites of different sizes (the barrier's counters re-armed by each), and leaves the counters
// zeroed.
TEST(CudaMhcTest, OneLaunchSiteMatchesTwoLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kHc = 4, kHidden = 4096, kMix = (2 + kHc) * kHc, kMaxTokens = 16;
  std::vector<uint16_t> fn_bf16(static_cast<size_t>(kMix * kHc * kHidden));
  const std::vector<float> fn = random_values(fn_bf16.size(), 21, 0.05f);
  for (size_t i = 0; i < fn.size(); ++i) fn_bf16[i] = f32_to_bf16(fn[i]);
  const DeviceBuffer fn_dev = to_device(fn_bf16), base = to_device(random_values(kMix, 22)),
                     scale = to_device(std::vector<float>{0.7f, 1.3f, 2.0f}),
                     norm = to_device(random_values(kHidden, 23));
  const std::vector<float> streams = random_values(static_cast<size_t>(kMaxTokens * kHc * kHidden), 24, 2.0f);
  const DeviceBuffer pending_post = to_device(random_values(kMaxTokens * kHc, 25)),
                     pending_comb = to_device(random_values(kMaxTokens * kHc * kHc, 26, 0.5f)),
                     block_out = to_device(random_values(kMaxTokens * kHidden, 27));
  DeviceBuffer barrier(2 * sizeof(unsigned));
  barrier.zero();
  check(cudaDeviceSynchronize(), "zeroed");
  const auto floats = [](int64_t n) { return DeviceBuffer(static_cast<size_t>(n) * sizeof(float)); };
  DeviceBuffer partials = floats(mhc_site_scratch_floats(kMaxTokens, kHc, kHidden));
  // Each variant's outputs: streams (updated in place), post, comb, collapsed, normed.
  struct Outputs {
    DeviceBuffer streams, post, comb, collapsed, normed;
  };
  const auto run = [&](int64_t tokens, bool pending, unsigned* counters) {
    Outputs out{to_device(streams), floats(tokens * kHc), floats(tokens * kHc * kHc), floats(tokens * kHidden),
                floats(tokens * kHidden)};
    check(mhc_site(MhcSiteArgs{.num_tokens = tokens, .hc_mult = kHc, .hidden = kHidden, .rms_eps = 1e-6f,
                               .hc_eps = 1e-6f, .sinkhorn_iters = 20, .fn = fn_dev.data(),
                               .fn_type = DenseWeightType::bf16, .base = base.as<float>(), .scale = scale.as<float>(),
                               .norm_weight = norm.as<float>(),
                               .pending_post = pending ? pending_post.as<float>() : nullptr,
                               .pending_comb = pending ? pending_comb.as<float>() : nullptr,
                               .pending_block_out = pending ? block_out.as<float>() : nullptr,
                               .streams = out.streams.as<float>(), .post = out.post.as<float>(),
                               .comb = out.comb.as<float>(), .collapsed = out.collapsed.as<float>(),
                               .normed = out.normed.as<float>(), .partials = partials.as<float>(),
                               .barrier = counters},
                   nullptr),
          "mhc_site");
    check(cudaDeviceSynchronize(), "mhc_site");
    return out;
  };
  for (const auto& [tokens, pending] : std::vector<std::pair<int64_t, bool>>{{1, true}, {3, false}, {1, false},
                                                                              {16, true}, {2, true}}) {
    const Outputs two = run(tokens, pending, nullptr), one = run(tokens, pending, barrier.as<unsigned>());
    const std::string where = "tokens " + std::to_string(tokens) + (pending ? " pending" : "");
    EXPECT_EQ(to_host(one.streams), to_host(two.streams)) << where;
    EXPECT_EQ(to_host(one.post), to_host(two.post)) << where;
    EXPECT_EQ(to_host(one.comb), to_host(two.comb)) << where;
    EXPECT_EQ(to_host(one.collapsed), to_host(two.collapsed)) << where;
    EXPECT_EQ(to_host(one.normed), to_host(two.normed)) << where;
    EXPECT_EQ(to_host<unsigned>(barrier), (std::vector<unsigned>{0, 0})) << where;
  }
}

TEST(CudaMhcTest, UnsupportedStreamCountIsRefused) {
  // Argument checks run before any launch, so this holds with or without a GPU.
  EXPECT_EQ(mhc_post(nullptr, nullptr, nullptr, 1, kMaxHcMult + 1, 8, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(mhc_mix(MhcMixArgs{.num_tokens = 1, .hc_mult = 0, .hidden = 8, .sinkhorn_iters = 20}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(mhc_site(MhcSiteArgs{.num_tokens = 1, .hc_mult = kMaxHcMult + 1, .hidden = 8, .sinkhorn_iters = 20},
                     nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kestrel::cuda
