// CUDA linear benchmark: the measured HBM copy bandwidth, then µs per call and the weight bandwidth achieved by the
// EXL3 trellis GEMV and the dense bf16 GEMV at GLM-5.3-Flash's shapes, and by the fused MoE path over one layer's
// 288 experts (top 8). Weights are random (any trellis bit pattern is a valid EXL3 matrix); the single-expert rows
// cycle through 64 distinct experts (about 800 MB at 4 bpw) and the MoE rows route each call to fresh random
// experts, so that the 50 MB L2 cannot serve the reads. Usage: kestrel_cuda_bench [iterations] (default 200).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <vector>

#include "backend/cuda/device_experts.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/device_runtime.h"
#include "base/numeric.h"

namespace kestrel::cuda {
namespace {

// Times `body` (which launches work on the default stream) over `iterations` runs; returns µs per run.
template <typename Body>
double time_us(int iterations, Body&& body) {
  body();  // warm-up
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  check(cudaEventRecord(begin), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) body();
  check(cudaEventRecord(end), "cudaEventRecord");
  check(cudaEventSynchronize(end), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
  check(cudaEventDestroy(begin), "cudaEventDestroy");
  check(cudaEventDestroy(end), "cudaEventDestroy");
  return 1000.0 * ms / iterations;
}

double copy_bandwidth_gbs() {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer a(bytes), b(bytes);
  a.zero();
  const double us = time_us(20, [&] { check(cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice), "copy"); });
  return 2.0 * static_cast<double>(bytes) / (us * 1e3);  // read + write
}

// Host copy of one random EXL3 matrix in checkpoint layout, [in, out] logical shape `out x in`.
struct HostExl3 {
  std::vector<uint32_t> trellis;
  std::vector<uint16_t> suh, svh;
  LinearWeight weight(int64_t out, int64_t in, int bits) const {
    LinearWeight w{.name = "bench_exl3", .dtype = DType::i16, .out_features = out, .in_features = in,
                   .data = reinterpret_cast<const std::byte*>(trellis.data())};
    w.exl3 = Exl3Matrix{.trellis = w.data, .suh = reinterpret_cast<const std::byte*>(suh.data()),
                        .svh = reinterpret_cast<const std::byte*>(svh.data()), .bits = bits,
                        .codebook = exl3::Codebook::mcg, .in_padded = in, .out_padded = out};
    return w;
  }
};

HostExl3 random_exl3(int64_t out, int64_t in, int bits, std::mt19937& rng) {
  HostExl3 m;
  m.trellis.resize(static_cast<size_t>(in / 16 * (out / 16) * 8 * bits));
  for (uint32_t& word : m.trellis) word = static_cast<uint32_t>(rng());
  const auto scale = [&] { return f32_to_f16((rng() & 1u) ? 0.05f : -0.05f); };
  for (int64_t i = 0; i < in; ++i) m.suh.push_back(scale());
  for (int64_t o = 0; o < out; ++o) m.svh.push_back(scale());
  return m;
}

// One MoE layer at GLM-5.3-Flash's size: 288 EXL3 experts, top 8, the fused five-launch path. Routings are drawn
// up front (distinct experts per token) and the calls cycle through them.
void moe_layer(int iterations, double hbm, int sm_count, std::mt19937& rng) {
  constexpr int64_t kHidden = 4096, kExpert = 2048, kExperts = 288, kTopK = 8;
  constexpr int kBits = 4, kRoutings = 16;
  std::vector<HostExl3> host;  // kept alive until the upload: ExpertWeights point into it
  std::vector<ExpertWeights> weights;
  DeviceExperts experts;
  {
    host.reserve(3 * kExperts);
    for (int64_t e = 0; e < kExperts; ++e) {
      host.push_back(random_exl3(kExpert, kHidden, kBits, rng));
      host.push_back(random_exl3(kExpert, kHidden, kBits, rng));
      host.push_back(random_exl3(kHidden, kExpert, kBits, rng));
      const size_t i = host.size() - 3;
      weights.push_back(ExpertWeights{.gate = host[i].weight(kExpert, kHidden, kBits),
                                      .up = host[i + 1].weight(kExpert, kHidden, kBits),
                                      .down = host[i + 2].weight(kHidden, kExpert, kBits)});
    }
    experts = DeviceExperts::upload(weights, sm_count);
  }
  host = {};
  Scratch scratch;
  std::printf("\n| MoE layer (288 experts, top 8, EXL3 4bpw) | tokens | µs per call | expert MB read | GB/s | of HBM "
              "copy |\n|---|---|---|---|---|---|\n");
  for (const int64_t tokens : {1, 8, 64}) {
    std::vector<int32_t> ids;
    std::vector<int32_t> order(kExperts);
    for (int r = 0; r < kRoutings; ++r) {
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t e = 0; e < kExperts; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
        std::shuffle(order.begin(), order.end(), rng);
        ids.insert(ids.end(), order.begin(), order.begin() + kTopK);
      }
    }
    const std::vector<float> route_weights(ids.size(), 0.125f);
    const DeviceBuffer ids_dev = DeviceBuffer::copy_of(ids.data(), ids.size() * sizeof(int32_t));
    const DeviceBuffer weights_dev = DeviceBuffer::copy_of(route_weights.data(), route_weights.size() * sizeof(float));
    DeviceBuffer x(static_cast<size_t>(tokens * kHidden) * 4), y(static_cast<size_t>(tokens * kHidden) * 4);
    x.zero();
    int next = 0;
    const double us = time_us(iterations, [&] {
      const int64_t offset = (next++ % kRoutings) * tokens * kTopK;
      experts.forward(x.as<float>(), tokens, kTopK, ids_dev.as<int32_t>() + offset,
                      weights_dev.as<float>() + offset, 7.0f, y.as<float>(), scratch, nullptr);
    });
    const size_t bytes = static_cast<size_t>(tokens * kTopK) * experts.expert_bytes();
    const double gbs = static_cast<double>(bytes) / (us * 1e3);
    std::printf("| fused MoE (5 launches) | %lld | %.2f | %.1f | %.0f | %.0f%% |\n", static_cast<long long>(tokens), us,
                static_cast<double>(bytes) / 1e6, gbs, 100.0 * gbs / hbm);
  }
}

void run(int iterations) {
  const DeviceInfo info = device_info(0);
  std::printf("device: %s, %d SMs, %.1f GiB\n", info.name.c_str(), info.sm_count,
              static_cast<double>(info.total_memory) / (1u << 30));
  const double hbm = copy_bandwidth_gbs();
  std::printf("HBM copy bandwidth (cudaMemcpy D2D, 2 GiB, read + write): %.0f GB/s\n\n", hbm);

  constexpr int64_t kHidden = 4096, kExpert = 2048;
  constexpr int kExperts = 64, kBits = 4;
  std::mt19937 rng(1);
  std::vector<DeviceLinear> gate_up, down;  // per expert: gate, up (4096 -> 2048) and down (2048 -> 4096)
  for (int e = 0; e < kExperts; ++e) {
    for (int j = 0; j < 2; ++j) {
      gate_up.push_back(DeviceLinear::upload(random_exl3(kExpert, kHidden, kBits, rng).weight(kExpert, kHidden, kBits),
                                             info.sm_count));
    }
    down.push_back(DeviceLinear::upload(random_exl3(kHidden, kExpert, kBits, rng).weight(kHidden, kExpert, kBits),
                                        info.sm_count));
  }
  std::vector<uint16_t> lm_head_bits(static_cast<size_t>(kHidden) * 154880, f32_to_bf16(0.01f));
  const DeviceLinear lm_head = DeviceLinear::upload(
      LinearWeight{.name = "lm_head", .dtype = DType::bf16, .out_features = 154880, .in_features = kHidden,
                   .data = reinterpret_cast<const std::byte*>(lm_head_bits.data())},
      info.sm_count);
  lm_head_bits = {};

  Scratch scratch;
  std::printf("| op | tokens | µs per call | weight MB per call | weight GB/s | of HBM copy |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const int64_t tokens : {1, 8, 16, 64}) {
    DeviceBuffer x(static_cast<size_t>(tokens * kHidden) * 4), y(static_cast<size_t>(tokens * 154880) * 4);
    x.zero();
    int next = 0;
    const auto report = [&](const char* op, double us, size_t bytes) {
      const double gbs = static_cast<double>(bytes) / (us * 1e3);
      std::printf("| %s | %lld | %.2f | %.2f | %.0f | %.0f%% |\n", op, static_cast<long long>(tokens), us,
                  static_cast<double>(bytes) / 1e6, gbs, 100.0 * gbs / hbm);
    };
    // One expert's three projections, a different expert each call (the decode access pattern).
    const double expert_us = time_us(iterations, [&] {
      const int e = next++ % kExperts;
      gate_up[2 * e].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr);
      gate_up[2 * e + 1].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr);
      down[e].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr);
    });
    report("EXL3 4bpw expert (gate+up+down, 3 calls)", expert_us,
           gate_up[0].weight_bytes() * 2 + down[0].weight_bytes());
    const double down_us = time_us(iterations, [&] {
      down[next++ % kExperts].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr);
    });
    report("EXL3 4bpw down_proj 2048->4096", down_us, down[0].weight_bytes());
    const double head_us = time_us(std::max(1, iterations / 10), [&] {
      lm_head.forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr);
    });
    report("bf16 lm_head 4096->154880", head_us, lm_head.weight_bytes());
  }
  moe_layer(iterations, hbm, info.sm_count, rng);
}

}  // namespace
}  // namespace kestrel::cuda

int main(int argc, char** argv) {
  try {
    if (kestrel::cuda::device_count() == 0) {
      std::fprintf(stderr, "kestrel_cuda_bench: no CUDA device\n");
      return 1;
    }
    kestrel::cuda::run(argc > 1 ? std::atoi(argv[1]) : 200);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kestrel_cuda_bench: %s\n", e.what());
    return 1;
  }
}
