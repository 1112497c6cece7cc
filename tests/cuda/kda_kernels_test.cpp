// CUDA KDA ops against the CPU backend on random inputs in the model's ranges: the causal conv + SiLU with its
// carried state, the forget gate with and without a lower bound, the recurrent delta rule at decode shapes (up to
// the model's 64 heads x 128) and the multi-token call against the CPU's chunked WY form; the fused decode step
// against the CPU's composition of those ops. Without a GPU, only the argument checks run (they return before any
// CUDA call).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/device_runtime.h"
#include "backend/cuda/kda_kernels.h"
#include "base/numeric.h"
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

using namespace kestrel::cuda::testing;

float logistic(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Conv and gate run the CPU's operations in the CPU's order: only FMA contraction and expf/logf's last bits differ.
constexpr double kElementwiseTolerance = 1e-5;
// The GPU sums S^T k and S^T q over the key rows as per-lane partials and a butterfly, the CPU in row order, and
// takes the output as S_d^T q + (k . q) delta (S_d the decayed state) where the CPU reads the updated state; the
// difference enters the state and carries to later tokens (damped by the decay). With the kernel's order emulated on
// the host it was at most 3.2e-7 for these cases (out and state) before the output's rewriting; the margin covers
// that, FMA contraction and expf.
constexpr double kRecurrentTolerance = 1e-5;
// The CPU's WY form reaches the same recurrence another way (forward substitution over the chunk, cumulative decays,
// dense products): 1.0e-6 from the CPU's own recurrent form at 150 tokens, and it grows with the chunk's conditioning,
// so a looser bound than for two recurrences.
constexpr double kChunkedTolerance = 1e-4;
constexpr int64_t kChunkSize = 64;

TEST(CudaKdaTest, CausalConvSiluMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t kernel = 4;
  uint32_t seed = 1;
  // 8192 channels: the model's 64 heads x 128 (each of q, k, v). Token counts: one, fewer than the history (the new
  // state keeps old slots), one tile, and several tiles with a partial last one.
  for (const int64_t channels : {256, 8192}) {
    for (const int64_t tokens : {1, 2, 16, 37, 300}) {
      const std::vector<float> x = random_values(static_cast<size_t>(tokens * channels), ++seed);
      const std::vector<float> weight =
          random_values(static_cast<size_t>(channels * kernel), ++seed, 0.5f);
      std::vector<float> cpu_state = random_values(static_cast<size_t>((kernel - 1) * channels), ++seed);
      DeviceBuffer x_dev = to_device(x), weight_dev = to_device(weight), state_dev = to_device(cpu_state);
      DeviceBuffer y_dev(x.size() * sizeof(float));
      check(causal_conv_silu(x_dev.as<float>(), tokens, channels, kernel, weight_dev.as<float>(),
                             state_dev.as<float>(), y_dev.as<float>(), nullptr),
            "causal_conv_silu");
      std::vector<float> cpu_y(x.size());
      CpuBackend().causal_conv_silu(x.data(), tokens, channels, kernel, weight.data(), cpu_state.data(),
                                    cpu_y.data());
      EXPECT_LT(relative_difference(to_host(y_dev), cpu_y), kElementwiseTolerance)
          << "channels " << channels << " tokens " << tokens;
      // The new state is copied inputs: exact.
      EXPECT_EQ(to_host(state_dev), cpu_state) << "channels " << channels << " tokens " << tokens;
    }
  }
}

TEST(CudaKdaTest, GateMatchesCpuWithAndWithoutLowerBound) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t tokens = 5, heads = 64, dim = 128;
  const std::vector<float> f = random_values(static_cast<size_t>(tokens * heads * dim), 1);
  // A_log as in Mamba's init, log of U(1, 16), here log of 1 + 15 sigmoid(z); dt_bias around zero.
  const std::vector<float> a_log =
      random_transformed(static_cast<size_t>(heads), 2, [](float z) { return std::log(1.0f + 15.0f * logistic(z)); });
  const std::vector<float> dt_bias = random_values(static_cast<size_t>(heads * dim), 3);
  DeviceBuffer f_dev = to_device(f), a_log_dev = to_device(a_log), dt_bias_dev = to_device(dt_bias);
  const float lower_bound = -5.0f;
  for (const float* bound : {&lower_bound, static_cast<const float*>(nullptr)}) {
    DeviceBuffer g_dev(f.size() * sizeof(float));
    check(kda_gate(f_dev.as<float>(), tokens, heads, dim, a_log_dev.as<float>(), dt_bias_dev.as<float>(), bound,
                   g_dev.as<float>(), nullptr),
          "kda_gate");
    std::vector<float> cpu_g(f.size());
    CpuBackend().kda_gate(f.data(), tokens, heads, dim, a_log.data(), dt_bias.data(), bound, cpu_g.data());
    EXPECT_LT(relative_difference(to_host(g_dev), cpu_g), kElementwiseTolerance)
        << (bound ? "with" : "without") << " lower bound";
  }
}

// KDA inputs as the block produces them: q, k, v after SiLU; g a log-decay in (-5, 0) (the bounded gate's range);
// beta in (0, 1); a small nonzero state, as left by earlier tokens.
struct KdaInputs {
  int64_t tokens, heads, dim;
  std::vector<float> q, k, v, g, beta, state;
};

KdaInputs random_kda_inputs(int64_t tokens, int64_t heads, int64_t dim, uint32_t seed) {
  const auto n = static_cast<size_t>(tokens * heads * dim);
  const auto silu = [](float z) { return z * logistic(z); };
  return {tokens,
          heads,
          dim,
          random_transformed(n, seed, silu),
          random_transformed(n, seed + 1, silu),
          random_transformed(n, seed + 2, silu),
          random_transformed(n, seed + 3, [](float z) { return -5.0f * logistic(z); }),
          random_transformed(static_cast<size_t>(tokens * heads), seed + 4, logistic),
          random_values(static_cast<size_t>(heads * dim * dim), seed + 5, 0.1f)};
}

struct KdaOutputs {
  std::vector<float> out, state;
};

enum class KdaForm { recurrent, chunked };

KdaOutputs cpu_kda(const KdaInputs& in, KdaForm form) {
  KdaOutputs result{std::vector<float>(in.q.size()), in.state};
  const KdaArgs args{.num_tokens = in.tokens, .num_heads = in.heads, .head_dim = in.dim, .q = in.q.data(),
                     .k = in.k.data(), .v = in.v.data(), .g = in.g.data(), .beta = in.beta.data(),
                     .state = result.state.data(), .out = result.out.data()};
  CpuBackend cpu;
  if (form == KdaForm::recurrent) {
    cpu.kda_recurrent(args);
  } else {
    cpu.kda_chunked(args, kChunkSize);
  }
  return result;
}

// max_shared: the shared memory the recurrence may take a block (0: the device's).
KdaOutputs gpu_kda(const KdaInputs& in, KdaForm form, size_t max_shared = 0) {
  DeviceBuffer q = to_device(in.q), k = to_device(in.k), v = to_device(in.v), g = to_device(in.g);
  DeviceBuffer beta = to_device(in.beta), state = to_device(in.state), out(in.q.size() * sizeof(float));
  const KdaDeviceArgs args{.num_tokens = in.tokens, .num_heads = in.heads, .head_dim = in.dim, .q = q.as<float>(),
                           .k = k.as<float>(), .v = v.as<float>(), .g = g.as<float>(), .beta = beta.as<float>(),
                           .state = state.as<float>(), .out = out.as<float>()};
  if (form == KdaForm::chunked) {
    check(kda_chunked(args, kChunkSize, nullptr), "kda");
  } else {
    check(max_shared > 0 ? kda_recurrent(args, nullptr, max_shared) : kda_recurrent(args, nullptr), "kda");
  }
  return {to_host(out), to_host(state)};
}

TEST(CudaKdaTest, RecurrentMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int64_t dim, heads, tokens;
  };
  uint32_t seed = 10;
  // 128 x 64 heads x 1 token is the model's decode step; 33 tokens carry the state across many steps at 128.
  // 16 and 32: head dims below a warp's 32 key rows (the golden fixtures use 16).
  for (const Shape s : {Shape{64, 4, 1}, Shape{64, 4, 5}, Shape{128, 64, 1}, Shape{128, 4, 33}, Shape{16, 4, 7},
                        Shape{32, 3, 5}}) {
    const KdaInputs in = random_kda_inputs(s.tokens, s.heads, s.dim, seed += 10);
    const KdaOutputs gpu = gpu_kda(in, KdaForm::recurrent), cpu = cpu_kda(in, KdaForm::recurrent);
    EXPECT_LT(relative_difference(gpu.out, cpu.out), kRecurrentTolerance)
        << "dim " << s.dim << " heads " << s.heads << " tokens " << s.tokens;
    EXPECT_LT(relative_difference(gpu.state, cpu.state), kRecurrentTolerance)
        << "dim " << s.dim << " heads " << s.heads << " tokens " << s.tokens;
  }
}

// Where a block may not have the 104 KiB of 32-token chunks at head_dim 128 (99 KiB on sm_86, sm_89 and the 12.x
// parts), the recurrence steps through chunks of 16: 37 tokens are two of them and a partial third.
TEST(CudaKdaTest, RecurrentInSmallerChunksMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const KdaInputs in = random_kda_inputs(37, 4, 128, 310);
  const KdaOutputs gpu = gpu_kda(in, KdaForm::recurrent, 99 * 1024), cpu = cpu_kda(in, KdaForm::recurrent);
  EXPECT_LT(relative_difference(gpu.out, cpu.out), kRecurrentTolerance);
  EXPECT_LT(relative_difference(gpu.state, cpu.state), kRecurrentTolerance);
}

TEST(CudaKdaTest, ChunkedMatchesCpuChunked) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // 150 tokens: two whole chunks of 64 and a partial one on the CPU.
  const KdaInputs in = random_kda_inputs(150, 4, 64, 100);
  const KdaOutputs gpu = gpu_kda(in, KdaForm::chunked), cpu = cpu_kda(in, KdaForm::chunked);
  EXPECT_LT(relative_difference(gpu.out, cpu.out), kChunkedTolerance);
  EXPECT_LT(relative_difference(gpu.state, cpu.state), kChunkedTolerance);
}

// A decode step in one launch (conv, the gates' second projections, gates, delta rule, gated norm) computes what the
// CPU's composition of the single ops computes, per sequence: outputs and states within the recurrence's bound (the
// projections' and the norm's sums add only rounding), the conv states exactly (copied inputs). 70 sequences cross the 64 a launch takes; head dim 16 is the
// golden fixtures', 128 the model's; with and without the gate's lower bound.
TEST(CudaKdaTest, DecodeStepMatchesCpuComposition) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int64_t sequences, heads, dim;
    bool bounded;
    bool bf16_inputs = false;  // --dtype bfloat16: the gates' low ranks rounded to bf16 before their products
  };
  constexpr int64_t kKernel = 4;
  uint32_t seed = 300;
  for (const Shape shape : {Shape{1, 64, 128, true}, Shape{3, 4, 128, false}, Shape{70, 4, 16, true},
                            Shape{5, 3, 32, false}, Shape{2, 2, 64, true}, Shape{3, 4, 128, true, true}}) {
    const int64_t S = shape.sequences, H = shape.heads, D = shape.dim, C = H * D;
    const auto n = static_cast<size_t>(S * C);
    const std::vector<float> q_in = random_values(n, ++seed), k_in = random_values(n, ++seed);
    const std::vector<float> v_in = random_values(n, ++seed);
    const auto lows = static_cast<size_t>(S * D);
    const std::vector<float> f_low = random_values(lows, ++seed), gate_low = random_values(lows, ++seed);
    // The gates' second projections [C, D] in bf16, as the checkpoint stores them.
    std::vector<uint16_t> f_b(static_cast<size_t>(C * D)), g_b(f_b.size());
    for (std::vector<uint16_t>* m : {&f_b, &g_b}) {
      const std::vector<float> values = random_values(m->size(), ++seed, 0.2f);
      for (size_t i = 0; i < values.size(); ++i) (*m)[i] = f32_to_bf16(values[i]);
    }
    const std::vector<float> beta = random_values(static_cast<size_t>(S * H), ++seed);
    const auto conv_weights = static_cast<size_t>(C * kKernel);
    const std::vector<float> q_conv = random_values(conv_weights, ++seed, 0.5f);
    const std::vector<float> k_conv = random_values(conv_weights, ++seed, 0.5f);
    const std::vector<float> v_conv = random_values(conv_weights, ++seed, 0.5f);
    const std::vector<float> a_log = random_transformed(static_cast<size_t>(H), ++seed,
                                                        [](float z) { return std::log(1.0f + 15.0f * logistic(z)); });
    const std::vector<float> dt_bias = random_values(static_cast<size_t>(C), ++seed);
    const std::vector<float> o_norm = random_transformed(static_cast<size_t>(D), ++seed,
                                                         [](float z) { return 1.0f + 0.1f * z; });
    const auto conv_floats = (kKernel - 1) * 3 * C, state_floats = H * D * D;
    std::vector<float> conv = random_values(static_cast<size_t>(S * conv_floats), ++seed);
    std::vector<float> states = random_values(static_cast<size_t>(S * state_floats), ++seed, 0.1f);
    const float lower_bound = -5.0f;
    const float eps = 1e-5f;

    DeviceBuffer q_dev = to_device(q_in), k_dev = to_device(k_in), v_dev = to_device(v_in);
    DeviceBuffer f_low_dev = to_device(f_low), gate_low_dev = to_device(gate_low);
    DeviceBuffer f_b_dev = DeviceBuffer::copy_of(f_b.data(), f_b.size() * 2);
    DeviceBuffer g_b_dev = DeviceBuffer::copy_of(g_b.data(), g_b.size() * 2);
    DeviceBuffer beta_dev = to_device(beta), qc_dev = to_device(q_conv);
    DeviceBuffer kc_dev = to_device(k_conv), vc_dev = to_device(v_conv), a_log_dev = to_device(a_log);
    DeviceBuffer dt_dev = to_device(dt_bias), o_norm_dev = to_device(o_norm), conv_dev = to_device(conv);
    DeviceBuffer states_dev = to_device(states), out_dev(n * sizeof(float));
    std::vector<float*> conv_pointers, state_pointers;
    for (int64_t s = 0; s < S; ++s) {
      conv_pointers.push_back(conv_dev.as<float>() + s * conv_floats);
      state_pointers.push_back(states_dev.as<float>() + s * state_floats);
    }
    check(kda_decode_steps(KdaDecodeDeviceArgs{.num_sequences = S, .num_heads = H, .head_dim = D,
                                               .conv_kernel = kKernel, .q_in = q_dev.as<float>(),
                                               .k_in = k_dev.as<float>(), .v_in = v_dev.as<float>(),
                                               .q_conv = qc_dev.as<float>(), .k_conv = kc_dev.as<float>(),
                                               .v_conv = vc_dev.as<float>(), .f_low = f_low_dev.as<float>(),
                                               .f_b = f_b_dev.data(), .a_log = a_log_dev.as<float>(),
                                               .dt_bias = dt_dev.as<float>(), .bounded = shape.bounded,
                                               .lower_bound = lower_bound, .beta = beta_dev.as<float>(),
                                               .gate_low = gate_low_dev.as<float>(), .g_b = g_b_dev.data(),
                                               .round_lows = shape.bf16_inputs, .o_norm = o_norm_dev.as<float>(),
                                               .eps = eps,
                                               .out = out_dev.as<float>()},
                           conv_pointers.data(), state_pointers.data(), nullptr),
          "kda_decode_steps");

    std::vector<float> cpu_beta = beta, work(7 * n), cpu_out(n);
    const LinearWeight f_b_weight{.name = "f_b", .dtype = DType::bf16, .out_features = C, .in_features = D,
                                  .data = reinterpret_cast<const std::byte*>(f_b.data())};
    const LinearWeight g_b_weight{.name = "g_b", .dtype = DType::bf16, .out_features = C, .in_features = D,
                                  .data = reinterpret_cast<const std::byte*>(g_b.data())};
    std::vector<float*> cpu_conv, cpu_states;
    for (int64_t s = 0; s < S; ++s) {
      cpu_conv.push_back(conv.data() + s * conv_floats);
      cpu_states.push_back(states.data() + s * state_floats);
    }
    CpuBackend cpu;
    if (shape.bf16_inputs) cpu.set_product_input(ProductInput::bf16);
    cpu.kda_decode_steps(KdaDecodeArgs{.num_sequences = S, .num_heads = H, .head_dim = D,
                                       .conv_kernel = kKernel, .q_in = q_in.data(), .k_in = k_in.data(),
                                       .v_in = v_in.data(), .q_conv = q_conv.data(),
                                       .k_conv = k_conv.data(), .v_conv = v_conv.data(),
                                       .f_low = f_low.data(), .f_b_proj = &f_b_weight,
                                       .a_log = a_log.data(), .dt_bias = dt_bias.data(),
                                       .lower_bound = shape.bounded ? &lower_bound : nullptr,
                                       .beta = cpu_beta.data(), .gate_low = gate_low.data(),
                                       .g_b_proj = &g_b_weight,
                                       .o_norm = o_norm.data(), .eps = eps, .work = work.data(),
                                       .out = cpu_out.data()},
                         cpu_conv, cpu_states);
    const std::string label = std::to_string(S) + " sequences, " + std::to_string(H) + " heads of " +
                              std::to_string(D) + (shape.bounded ? ", bounded" : "") +
                              (shape.bf16_inputs ? ", bf16 inputs" : "");
    EXPECT_LT(relative_difference(to_host(out_dev), cpu_out), kRecurrentTolerance) << label;
    EXPECT_LT(relative_difference(to_host(states_dev), states), kRecurrentTolerance) << label;
    EXPECT_EQ(to_host(conv_dev), conv) << label;
    EXPECT_EQ(to_host(beta_dev), beta) << label << ": the GPU step leaves beta as it was";
  }
}

TEST(CudaKdaTest, UnsupportedArgumentsAreRefused) {
  // Checked on the host before any launch, so these run without a GPU too; no pointer is dereferenced.
  alignas(16) float storage[8] = {};
  KdaDeviceArgs args{1, 1, 64, storage, storage, storage, storage, storage, storage, storage};
  args.head_dim = 96;
  EXPECT_EQ(kda_recurrent(args, nullptr), cudaErrorInvalidValue);
  args.head_dim = 128;
  args.state = storage + 1;  // the state is read as float4
  EXPECT_EQ(kda_recurrent(args, nullptr), cudaErrorInvalidValue);
  args.state = storage;
  for (const float** input : {&args.q, &args.k, &args.g, &args.v}) {  // rows copied 16 bytes at a time
    const float* aligned = *input;
    *input = storage + 1;
    EXPECT_EQ(kda_recurrent(args, nullptr), cudaErrorInvalidValue);
    *input = aligned;
  }
  EXPECT_EQ(kda_chunked(args, 0, nullptr), cudaErrorInvalidValue);
  for (const int64_t kernel : {0, 9}) {
    EXPECT_EQ(causal_conv_silu(storage, 1, 1, kernel, storage, storage, storage, nullptr), cudaErrorInvalidValue)
        << "kernel " << kernel;
  }
  float* pointers[] = {storage};
  KdaDecodeDeviceArgs step{};
  step.num_sequences = step.num_heads = 1;
  step.head_dim = 96;
  step.conv_kernel = 4;
  EXPECT_EQ(kda_decode_steps(step, pointers, pointers, nullptr), cudaErrorInvalidValue);
  step.head_dim = 128;
  step.conv_kernel = 9;
  EXPECT_EQ(kda_decode_steps(step, pointers, pointers, nullptr), cudaErrorInvalidValue);
  step.conv_kernel = 4;
  float* misaligned[] = {storage + 1};
  EXPECT_EQ(kda_decode_steps(step, pointers, misaligned, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kestrel::cuda
