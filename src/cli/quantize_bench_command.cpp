// The benchmark times quantize_linear end to end (regularisation, scale search, Hessian rotation and block LDL,
// LDLQ with the trellis encoder, proxy error, packing) on Gaussian weights (std 0.02, like a trained expert's scale)
// and, with --hessian-rows R, a Hessian from R random correlated activation rows (its capture is not timed). Weights
// per second = out x in / wall seconds.
#include "cli/quantize_bench_command.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "formats/exl3_hessian.h"
#include "formats/exl3_quantizer.h"

namespace kestrel::cli {

Action add_quantize_bench_command(CLI::App& app) {
  struct Options {
    int64_t out_features = 2048, in_features = 4096, hessian_rows = 0;
    int bits = 4, threads = 0;
    std::string codebook = "mcg";
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("quantize-bench", "Time the EXL3 quantizer on one random linear");
  cmd->group("");  // hidden: a measurement tool, not part of the interface
  cmd->add_option("--out-features", options->out_features, "Rows of W (nn.Linear out)")->capture_default_str();
  cmd->add_option("--in-features", options->in_features, "Columns of W (nn.Linear in)")->capture_default_str();
  cmd->add_option("--hessian-rows", options->hessian_rows, "Activation rows for a Hessian (0: uncalibrated)")
      ->capture_default_str();
  cmd->add_option("--bits", options->bits, "K")->capture_default_str();
  cmd->add_option("--codebook", options->codebook, "mcg, mul1 or 3inst")->capture_default_str();
  cmd->add_option("--threads", options->threads, "Worker threads (default: KESTREL_THREADS or all cores)");
  return [cmd, options]() -> int {
    if (!cmd->parsed()) return -1;
    const auto codebook = exl3::codebook_from_name(options->codebook);
    require(codebook.has_value(), "--codebook {}: expected mcg, mul1 or 3inst", options->codebook);
    require(options->out_features > 0 && options->in_features > 0 && options->hessian_rows >= 0,
            "quantize-bench: shapes must be positive and --hessian-rows not negative");
    const int64_t out = options->out_features, in = options->in_features;
    std::mt19937 generator(1);
    std::normal_distribution<float> normal;
    std::vector<float> weight(static_cast<size_t>(out * in));
    for (auto& value : weight) value = 0.02f * normal(generator);

    std::vector<float> hessian;
    if (options->hessian_rows > 0) {
      // Rows with a decaying per-channel scale and channel mixing, so H is far from diagonal.
      exl3::HessianAccumulator accumulator(in);
      std::vector<float> row(static_cast<size_t>(in)), mixed(static_cast<size_t>(in));
      for (int64_t t = 0; t < options->hessian_rows; ++t) {
        for (int64_t i = 0; i < in; ++i) {
          row[static_cast<size_t>(i)] =
              normal(generator) * std::pow(10.0f, -static_cast<float>(i) / static_cast<float>(in));
        }
        for (int64_t i = 0; i < in; ++i) {
          mixed[static_cast<size_t>(i)] =
              row[static_cast<size_t>(i)] + 0.5f * row[static_cast<size_t>((i * 7 + 3) % in)];
        }
        accumulator.add(mixed.data(), 1);
      }
      hessian = accumulator.mean();
    }

    std::unique_ptr<ThreadPool> pool;
    if (options->threads > 0) pool = std::make_unique<ThreadPool>(options->threads);
    exl3::QuantizeOptions quantize;
    quantize.bits = options->bits;
    quantize.codebook = *codebook;
    quantize.pool = pool ? pool.get() : &ThreadPool::global();
    const auto started = std::chrono::steady_clock::now();
    const exl3::QuantizedLinear q =
        exl3::quantize_linear(weight.data(), out, in, hessian.empty() ? nullptr : hessian.data(), quantize);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf("shape [%lld x %lld] K=%d %s %s threads=%d: %.1f s, %.4g weights/s, proxy error %.4g, scale %.4f\n",
                static_cast<long long>(out), static_cast<long long>(in), options->bits, options->codebook.c_str(),
                q.calibrated ? "calibrated" : "uncalibrated", quantize.pool->num_threads(), seconds,
                static_cast<double>(out * in) / seconds, q.proxy_error, q.global_scale);
    return 0;
  };
}

}  // namespace kestrel::cli
