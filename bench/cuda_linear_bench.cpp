// CUDA linear benchmark: the measured HBM copy bandwidth, then µs per call and the weight bandwidth achieved by the
// EXL3 trellis GEMV and the dense bf16 GEMV at GLM-5.3-Flash's shapes, and by the fused MoE path over one layer's
// 288 experts (top 8); the EXL3 k-slice sweep; cuBLASLt's bf16 throughput and the GEMV/GEMM crossover per shape. Weights are random (any trellis bit pattern is a valid EXL3 matrix); the single-expert rows
// cycle through 64 distinct experts (about 800 MB at 4 bpw) and the MoE rows route each call to fresh random
// experts, so that the 50 MB L2 cannot serve the reads. Usage: kestrel_cuda_bench [iterations] (default 200).
//
// kestrel_cuda_bench --exl3-file FILE [iterations] [--outputs DIR] [--compare FILE]: the side-by-side with exllamav3
// (tools/run_exl3_bench.sh). FILE, from `tools/bench_exllamav3.py write`, holds EXL3 weights in exllamav3's layout,
// the routings and the inputs; its dense linear and MoE layer run through CudaBackend as the model runs them, timed
// as `bench_exllamav3.py time` times exllamav3's. --outputs writes our outputs on the file's inputs
// (DIR/model.safetensors); --compare sets them against exllamav3's (the file `time --out` wrote).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_experts.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/device_runtime.h"
#include "backend/cuda/gemm.h"
#include "base/error.h"
#include "base/numeric.h"
#include "formats/exl3_tensors.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"

namespace kestrel::cuda {
namespace {

// Times `body` (which launches work on `stream`) over `iterations` runs after `warmups` untimed ones; returns µs per
// run.
template <typename Body>
double time_us(int iterations, Body&& body, cudaStream_t stream = nullptr, int warmups = 1) {
  for (int i = 0; i < warmups; ++i) body();
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  check(cudaEventRecord(begin, stream), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) body();
  check(cudaEventRecord(end, stream), "cudaEventRecord");
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

// One MoE layer at GLM-5.3-Flash's size: 288 EXL3 experts, top 8, the fused path (src/backend/cuda/device_experts.h). Routings are drawn
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
    std::printf("| fused MoE | %lld | %.2f | %.1f | %.0f | %.0f%% |\n", static_cast<long long>(tokens), us,
                static_cast<double>(bytes) / 1e6, gbs, 100.0 * gbs / hbm);
  }
}

// One token through EXL3 matrices of one shape with each k-slice length the kernel takes, against the length
// exl3_plan picks: the data behind the plan (the matrices cycle so that L2 cannot serve them).
void plan_sweep(int iterations, int sm_count, const std::vector<const DeviceLinear*>& matrices, const char* label) {
  const Exl3DeviceView& shape = *matrices.front()->exl3();
  const Exl3Plan chosen = exl3_plan(shape, sm_count);
  const int64_t tiles_k = shape.in_padded / 16;
  DeviceBuffer x(static_cast<size_t>(shape.in_features) * 4), y(static_cast<size_t>(shape.out_features) * 4);
  x.zero();
  DeviceBuffer counters(exl3_counter_count(shape) * sizeof(unsigned));
  counters.zero();
  std::printf("| %s, 1 token: slice tiles | splits | µs per call | plan's choice |\n|---|---|---|---|\n", label);
  for (int64_t slice_tiles = 8; slice_tiles <= 64; slice_tiles += 8) {
    const Exl3Plan plan{.slice_tiles = slice_tiles, .splits = static_cast<int>((tiles_k + slice_tiles - 1) / slice_tiles)};
    DeviceBuffer partial(exl3_scratch_floats(shape, plan) * sizeof(float));
    int next = 0;
    const double us = time_us(iterations, [&] {
      const Exl3DeviceView& m = *matrices[static_cast<size_t>(next++) % matrices.size()]->exl3();
      check(exl3_linear(m, plan, x.as<float>(), 1, y.as<float>(), partial.as<float>(), counters.as<unsigned>(), nullptr),
            "exl3_linear");
    });
    std::printf("| %lld | %d | %.2f | %s |\n", static_cast<long long>(slice_tiles), plan.splits, us,
                slice_tiles == chosen.slice_tiles ? "yes" : "");
  }
  std::printf("\n");
}

// GEMV against GEMM over token counts for matrices of one shape (cycled so that L2 cannot serve them): where
// DeviceLinear::gemm_min_tokens should be.
void gemm_sweep(int iterations, Gemm& gemm, const std::vector<const DeviceLinear*>& matrices, const char* label) {
  const DeviceLinear& shape = *matrices.front();
  std::printf("| %s: tokens | GEMV µs | GEMM µs | GEMM TFLOP/s | forward takes |\n|---|---|---|---|---|\n", label);
  Scratch scratch;
  for (const int64_t tokens : {16, 32, 48, 64, 96, 128, 256, 1024, 4096}) {
    DeviceBuffer x(static_cast<size_t>(tokens * shape.in_features()) * 4);
    DeviceBuffer y(static_cast<size_t>(tokens * shape.out_features()) * 4);
    x.zero();
    int next = 0;
    const auto matrix = [&]() -> const DeviceLinear& { return *matrices[static_cast<size_t>(next++) % matrices.size()]; };
    const int runs = std::max(2, iterations / static_cast<int>(std::max<int64_t>(1, tokens / 64)));
    const double gemv = time_us(runs, [&] { matrix().forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr, nullptr); });
    const double gemm_us = time_us(runs, [&] {
      matrix().forward_as_gemm(x.as<float>(), tokens, y.as<float>(), scratch, gemm, nullptr);
    });
    const double flops = 2.0 * static_cast<double>(tokens * shape.in_features() * shape.out_features());
    std::printf("| %lld | %.2f | %.2f | %.1f | %s |\n", static_cast<long long>(tokens), gemv, gemm_us,
                flops / (gemm_us * 1e6), tokens >= shape.gemm_min_tokens() ? "GEMM" : "GEMV");
  }
  std::printf("\n");
}

// cuBLASLt's bf16 throughput on a large square product (bf16 inputs, float32 outputs, as the prefill linears run):
// the yardstick prefill TFLOP/s is set against.
void tensor_core_throughput(int iterations, Gemm& gemm) {
  constexpr int64_t kSide = 8192;
  DeviceBuffer a(static_cast<size_t>(kSide * kSide) * 2), b(static_cast<size_t>(kSide * kSide) * 2);
  DeviceBuffer c(static_cast<size_t>(kSide * kSide) * 4);
  a.zero();
  b.zero();
  const double us = time_us(std::max(2, iterations / 10), [&] {
    gemm.run(GemmInput::bf16, a.data(), kSide, kSide, b.data(), GemmWeights::rows_are_outputs, kSide, c.as<float>(),
             nullptr);
  });
  std::printf("bf16 tensor-core throughput (cuBLASLt, %lld^3, bf16 in, f32 out): %.1f TFLOP/s\n\n",
              static_cast<long long>(kSide), 2.0 * std::pow(static_cast<double>(kSide), 3) / (us * 1e6));
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
      gate_up[2 * e].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr, nullptr);
      gate_up[2 * e + 1].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr, nullptr);
      down[e].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr, nullptr);
    });
    report("EXL3 4bpw expert (gate+up+down, 3 calls)", expert_us,
           gate_up[0].weight_bytes() * 2 + down[0].weight_bytes());
    const double down_us = time_us(iterations, [&] {
      down[next++ % kExperts].forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr, nullptr);
    });
    report("EXL3 4bpw down_proj 2048->4096", down_us, down[0].weight_bytes());
    const double head_us = time_us(std::max(1, iterations / 10), [&] {
      lm_head.forward(x.as<float>(), tokens, y.as<float>(), scratch, nullptr, nullptr);
    });
    report("bf16 lm_head 4096->154880", head_us, lm_head.weight_bytes());
  }
  moe_layer(iterations, hbm, info.sm_count, rng);

  std::printf("\n");
  std::vector<const DeviceLinear*> gates, downs;
  for (int e = 0; e < kExperts; ++e) {
    gates.push_back(&gate_up[static_cast<size_t>(2 * e)]);
    downs.push_back(&down[static_cast<size_t>(e)]);
  }
  std::vector<DeviceLinear> wide;  // 16 x 25 MB
  for (int copy = 0; copy < 16; ++copy) {
    wide.push_back(DeviceLinear::upload(random_exl3(12288, kHidden, kBits, rng).weight(12288, kHidden, kBits),
                                        info.sm_count));
  }
  std::vector<const DeviceLinear*> wides;
  for (const DeviceLinear& linear : wide) wides.push_back(&linear);
  plan_sweep(iterations, info.sm_count, gates, "EXL3 4bpw 4096->2048");
  plan_sweep(iterations, info.sm_count, downs, "EXL3 4bpw 2048->4096");
  plan_sweep(iterations, info.sm_count, wides, "EXL3 4bpw 4096->12288");

  Gemm gemm;
  require(gemm.available(), "cuBLASLt did not load (libcublasLt.so.13 on the library path?)");
  tensor_core_throughput(iterations, gemm);
  std::vector<DeviceLinear> dense;  // 4 x 100 MB
  {
    std::vector<uint16_t> bits(static_cast<size_t>(12288 * kHidden));
    for (uint16_t& b : bits) b = f32_to_bf16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-5f);
    for (int copy = 0; copy < 4; ++copy) {
      dense.push_back(DeviceLinear::upload(
          LinearWeight{.name = "dense", .dtype = DType::bf16, .out_features = 12288, .in_features = kHidden,
                       .data = reinterpret_cast<const std::byte*>(bits.data())},
          info.sm_count));
    }
  }
  std::vector<const DeviceLinear*> denses;
  for (const DeviceLinear& linear : dense) denses.push_back(&linear);
  gemm_sweep(iterations, gemm, denses, "bf16 4096->12288");
  gemm_sweep(iterations, gemm, wides, "EXL3 4bpw 4096->12288");
  gemm_sweep(iterations, gemm, gates, "EXL3 4bpw 4096->2048");
  gemm_sweep(iterations, gemm, downs, "EXL3 4bpw 2048->4096");
}

// ---- Side-by-side with exllamav3 on the weights of one file (tools/bench_exllamav3.py) ----

// Row labels shared with bench_exllamav3.py, whose summary pairs the two tables by them.
constexpr const char* kDenseOp = "dense EXL3 linear 4096->12288";
constexpr const char* kMoeOp = "MoE routed experts (288, top 8)";
constexpr int64_t kSideBySideTokens[] = {1, 8, 64};

struct SideBySideOptions {
  std::string file;
  int iterations = 200;
  std::string outputs_dir, compare_file;
};

// One token count's routings (`routings` of them, cycled), weights and fixed input, from the file.
struct SideBySideCase {
  int64_t tokens = 0, routings = 0;
  std::vector<int32_t> ids;     // [routings, tokens, top_k]
  std::vector<float> weights;   // [routings, tokens, top_k]
  std::vector<float> x;         // [tokens, hidden]
};

// The file's tensors bound as the model binds a checkpoint's, checked before any GPU work.
struct SideBySideFile {
  explicit SideBySideFile(const std::string& path) : file(path) {}
  SafetensorsFile file;
  std::vector<LinearWeight> dense;  // copies of one matrix, cycled so that L2 cannot serve them
  std::vector<ExpertWeights> experts;
  int64_t top_k = 0;
  float swiglu_limit = 0.0f;
  std::vector<SideBySideCase> cases;
};

// An EXL3 module as a LinearWeight, its tensors read and checked by the checkpoint loader's read_exl3_tensors.
LinearWeight exl3_module(const SafetensorsFile& file, const std::string& module) {
  const Exl3Tensors t = read_exl3_tensors([&](const std::string& name) { return file.find(name); }, module);
  return exl3_linear_weight(module, t, t.out_padded, t.in_padded);
}

const TensorView& expect_tensor(const SafetensorsFile& file, const std::string& name, DType dtype, size_t rank) {
  const TensorView* view = file.find(name);
  require(view != nullptr, "{}: tensor '{}' is missing (write the file with tools/bench_exllamav3.py write)",
          file.path(), name);
  require(view->dtype == dtype && view->shape.size() == rank, "{}: tensor '{}' is {} {}; expected {} of rank {}",
          file.path(), name, dtype_name(view->dtype), view->shape_string(), dtype_name(dtype), rank);
  return *view;
}

template <typename T>
std::vector<T> values_of(const TensorView& view) {
  std::vector<T> values(static_cast<size_t>(view.numel()));
  std::memcpy(values.data(), view.data, values.size() * sizeof(T));
  return values;
}

SideBySideFile bind_side_by_side(const std::string& path) {
  SideBySideFile f(path);
  const SafetensorsFile& file = f.file;
  const auto limit = file.metadata().find("swiglu_limit");
  require(limit != file.metadata().end(), "{}: no swiglu_limit in __metadata__ (write the file with "
          "tools/bench_exllamav3.py write)", path);
  f.swiglu_limit = std::stof(limit->second);
  for (int c = 0; file.find("dense." + std::to_string(c) + ".up_proj.trellis"); ++c) {
    f.dense.push_back(exl3_module(file, "dense." + std::to_string(c) + ".up_proj"));
    require(f.dense.back().out_features == f.dense.front().out_features &&
                f.dense.back().in_features == f.dense.front().in_features,
            "{}: dense copy {} has another shape than copy 0", path, c);
  }
  for (int e = 0; file.find("moe.experts." + std::to_string(e) + ".gate_proj.trellis"); ++e) {
    const std::string prefix = "moe.experts." + std::to_string(e) + ".";
    f.experts.push_back(ExpertWeights{.gate = exl3_module(file, prefix + "gate_proj"),
                                      .up = exl3_module(file, prefix + "up_proj"),
                                      .down = exl3_module(file, prefix + "down_proj")});
  }
  require(!f.dense.empty() && !f.experts.empty(), "{}: no dense.0.up_proj or moe.experts.0 EXL3 module", path);
  const int64_t hidden = f.experts.front().gate.in_features;
  for (const int64_t tokens : kSideBySideTokens) {
    const std::string t = ".t" + std::to_string(tokens);
    const TensorView& ids = expect_tensor(file, "routing" + t + ".ids", DType::i32, 3);
    const TensorView& weights = expect_tensor(file, "routing" + t + ".weights", DType::f32, 3);
    const TensorView& x = expect_tensor(file, "input" + t, DType::f16, 2);
    require(ids.shape[1] == tokens && weights.shape == ids.shape && x.shape == std::vector<int64_t>{tokens, hidden},
            "{}: routing{}.ids {}, .weights {} and input{} {} do not fit {} tokens of width {}", path, t,
            ids.shape_string(), weights.shape_string(), t, x.shape_string(), tokens, hidden);
    require(f.top_k == 0 || f.top_k == ids.shape[2], "{}: routings of different top_k", path);
    f.top_k = ids.shape[2];
    SideBySideCase c{.tokens = tokens, .routings = ids.shape[0], .ids = values_of<int32_t>(ids),
                     .weights = values_of<float>(weights), .x = {}};
    const auto experts = static_cast<int32_t>(f.experts.size());
    require(std::all_of(c.ids.begin(), c.ids.end(), [&](int32_t e) { return e >= 0 && e < experts; }),
            "{}: routing{}.ids holds an expert id outside [0, {})", path, t, experts);
    for (const uint16_t h : values_of<uint16_t>(x)) c.x.push_back(f16_to_f32(h));
    f.cases.push_back(std::move(c));
  }
  const LinearWeight& d = f.dense.front();
  const ExpertWeights& e = f.experts.front();
  std::printf("%s: %zu dense copies [%lld x %lld], %zu experts (gate/up [%lld x %lld], down [%lld x %lld]), "
              "EXL3 K=%d %s, top %lld, swiglu limit %g; routings per token count: %lld\n",
              path.c_str(), f.dense.size(), static_cast<long long>(d.out_features),
              static_cast<long long>(d.in_features), f.experts.size(), static_cast<long long>(e.gate.out_features),
              static_cast<long long>(e.gate.in_features), static_cast<long long>(e.down.out_features),
              static_cast<long long>(e.down.in_features), d.exl3->bits,
              std::string(exl3::codebook_name(d.exl3->codebook)).c_str(), static_cast<long long>(f.top_k),
              static_cast<double>(f.swiglu_limit), static_cast<long long>(f.cases.front().routings));
  std::fflush(stdout);
  return f;
}

// An op's output on the file's fixed input, float32 [rows, cols], named as exllamav3's outputs name it.
struct SideBySideOutput {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> values;
};

// Our outputs against exllamav3's, per output: the largest difference beside exllamav3's largest magnitude, and the
// RMS difference relative to exllamav3's RMS. Returns whether all agree within the rounding of exllamav3's fp16 path.
bool compare_outputs(const std::vector<SideBySideOutput>& ours, const std::string& path) {
  constexpr double kTolerance = 1e-2;  // relative RMS: exllamav3 keeps activations in fp16, we keep them in fp32
  const SafetensorsFile theirs(path);
  bool all_agree = true;
  std::printf("\n| output (ours vs exllamav3, %s) | max abs diff | max abs (exllamav3) | relative RMS diff | |\n"
              "|---|---|---|---|---|\n", path.c_str());
  for (const auto& [name, rows, cols, values] : ours) {
    const TensorView* view = theirs.find(name);
    if (view == nullptr || view->dtype != DType::f32 || view->shape != std::vector<int64_t>{rows, cols}) {
      std::printf("| %s | | | | MISSING from exllamav3's outputs, or not F32 [%lld, %lld] |\n", name.c_str(),
                  static_cast<long long>(rows), static_cast<long long>(cols));
      all_agree = false;
      continue;
    }
    const std::vector<float> reference = values_of<float>(*view);
    double max_diff = 0.0, max_ref = 0.0, diff_sq = 0.0, ref_sq = 0.0;
    for (size_t i = 0; i < values.size(); ++i) {
      const double d = static_cast<double>(values[i]) - reference[i];
      max_diff = std::max(max_diff, std::abs(d));
      max_ref = std::max(max_ref, std::abs(static_cast<double>(reference[i])));
      diff_sq += d * d;
      ref_sq += static_cast<double>(reference[i]) * reference[i];
    }
    const double relative_rms = ref_sq > 0.0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
    const bool agree = std::isfinite(relative_rms) && relative_rms <= kTolerance;
    all_agree = all_agree && agree;
    std::printf("| %s | %.3g | %.3g | %.3g | %s |\n", name.c_str(), max_diff, max_ref, relative_rms,
                agree ? "agree" : "DIFFER");
  }
  return all_agree;
}

int side_by_side(const SideBySideOptions& options) {
  SideBySideFile f = bind_side_by_side(options.file);
  if (device_count() == 0) {
    std::fprintf(stderr, "kestrel_cuda_bench: the file binds, but there is no CUDA device to time it on\n");
    return 1;
  }
  CudaBackend backend(0);
  for (LinearWeight& weight : f.dense) backend.place(weight);
  const std::shared_ptr<const PlacedWeight> experts = backend.place_experts(f.experts);
  const LinearWeight& dense0 = f.dense.front();
  const int64_t hidden = f.experts.front().gate.in_features, intermediate = f.experts.front().gate.out_features;
  const auto copies = static_cast<int>(f.dense.size());
  std::printf("device: %s, %d SMs; %d calls per row\n\n| op (Kestrel) | tokens | µs per call |\n|---|---|---|\n",
              backend.device().name.c_str(), backend.device().sm_count, options.iterations);
  std::fflush(stdout);

  std::vector<SideBySideOutput> outputs;
  int failed = 0;
  for (const SideBySideCase& c : f.cases) {
    const int64_t T = c.tokens, slots = T * f.top_k;
    const DeviceBuffer x = DeviceBuffer::copy_of(c.x.data(), c.x.size() * sizeof(float));
    const DeviceBuffer ids = DeviceBuffer::copy_of(c.ids.data(), c.ids.size() * sizeof(int32_t));
    const DeviceBuffer weights = DeviceBuffer::copy_of(c.weights.data(), c.weights.size() * sizeof(float));
    DeviceBuffer y(static_cast<size_t>(T * dense0.out_features) * sizeof(float));
    DeviceBuffer out(static_cast<size_t>(T * hidden) * sizeof(float));
    check(cudaDeviceSynchronize(), "input upload");  // the backend's stream does not wait for the legacy one
    const auto row = [&](const char* op, const std::string& output, int64_t width, float* result, auto&& call,
                         int cycle) {
      try {
        int next = 0;
        const double us = time_us(options.iterations, [&] { call(next++ % cycle); }, backend.stream(), cycle);
        // On copy 0 / routing 0, for the comparison; the MoE layer adds into its output, so it starts from zeros.
        check(cudaMemsetAsync(result, 0, static_cast<size_t>(T * width) * sizeof(float), backend.stream()),
              "output clear");
        call(0);
        std::vector<float> host(static_cast<size_t>(T * width));
        backend.copy_to_host(host.data(), result, host.size() * sizeof(float));
        outputs.push_back({output, T, width, std::move(host)});
        std::printf("| %s | %lld | %.2f |\n", op, static_cast<long long>(T), us);
      } catch (const std::exception& e) {
        std::printf("| %s | %lld | FAILED: %s |\n", op, static_cast<long long>(T), e.what());
        ++failed;
      }
      std::fflush(stdout);
    };
    row(kDenseOp, "dense.t" + std::to_string(T), dense0.out_features, y.as<float>(), [&](int copy) {
      backend.linear(x.as<float>(), T, f.dense[static_cast<size_t>(copy)], y.as<float>());
    }, copies);
    row(kMoeOp, "moe.t" + std::to_string(T), hidden, out.as<float>(), [&](int routing) {
      backend.moe_experts(MoeArgs{.num_tokens = T, .hidden = hidden, .intermediate = intermediate,
                                  .top_k = f.top_k, .swiglu_limit = f.swiglu_limit, .x = x.as<float>(),
                                  .experts = &f.experts, .placed_experts = experts.get(),
                                  .expert_ids = ids.as<int32_t>() + routing * slots,
                                  .expert_weights = weights.as<float>() + routing * slots, .out = out.as<float>()});
    }, static_cast<int>(c.routings));
  }

  if (!options.outputs_dir.empty()) {
    std::filesystem::create_directories(options.outputs_dir);
    SafetensorsWriter writer(options.outputs_dir, uint64_t{1} << 40);
    for (const auto& [name, rows, cols, values] : outputs) {
      std::vector<std::byte> bytes(values.size() * sizeof(float));
      std::memcpy(bytes.data(), values.data(), bytes.size());
      writer.add(name, DType::f32, {rows, cols}, std::move(bytes));
    }
    writer.finish();
    std::printf("\nour outputs on input.t{1,8,64} (copy 0, routing 0): %s/model.safetensors\n",
                options.outputs_dir.c_str());
  }
  const bool agree = options.compare_file.empty() || compare_outputs(outputs, options.compare_file);
  return failed == 0 && agree ? 0 : 1;
}

// kestrel_cuda_bench --exl3-file FILE [iterations] [--outputs DIR] [--compare FILE]
SideBySideOptions side_by_side_options(int argc, char** argv) {
  SideBySideOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      require(i + 1 < argc, "{} needs a value", arg);
      return argv[++i];
    };
    if (arg == "--exl3-file") {
      options.file = value();
    } else if (arg == "--outputs") {
      options.outputs_dir = value();
    } else if (arg == "--compare") {
      options.compare_file = value();
    } else {
      char* end = nullptr;
      options.iterations = static_cast<int>(std::strtol(arg.c_str(), &end, 10));
      require(*end == '\0' && options.iterations > 0, "unknown argument '{}' (usage: kestrel_cuda_bench --exl3-file "
              "FILE [iterations] [--outputs DIR] [--compare FILE])", arg);
    }
  }
  return options;
}

}  // namespace
}  // namespace kestrel::cuda

int main(int argc, char** argv) {
  try {
    // The side-by-side binds its file before it looks for a device, so a bad file fails the same everywhere.
    if (std::any_of(argv + 1, argv + argc, [](const char* arg) { return std::strcmp(arg, "--exl3-file") == 0; })) {
      return kestrel::cuda::side_by_side(kestrel::cuda::side_by_side_options(argc, argv));
    }
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
