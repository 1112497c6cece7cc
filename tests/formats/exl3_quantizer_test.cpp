// The EXL3 quantizer: its proxy error against exllamav3's on the same layer and Hessian (tests/data/exl3/proxy.*,
// written by tools/exl3_oracle.py with exllamav3 1.4.1 on an H200), that what it stores decodes to what it chose,
// the Hessian accumulator, and clear errors on bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/numeric.h"
#include "base/thread_pool.h"
#include "expect_error.h"
#include "formats/exl3_codec.h"
#include "formats/exl3_hessian.h"
#include "formats/exl3_quantizer.h"
#include "formats/safetensors.h"

namespace kestrel {
namespace {

using testing::expect_error;

std::string exl3_data(const std::string& name) {
  return (std::filesystem::path(KESTREL_TEST_DATA) / "exl3" / name).string();
}

std::vector<float> f32_values(const TensorView& view) {
  std::vector<float> values(view.nbytes / sizeof(float));
  std::memcpy(values.data(), view.data, view.nbytes);
  return values;
}

// Random activations with a decaying spectrum and a few loud channels, like tools/exl3_oracle.py's.
std::vector<float> correlated_rows(int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal;
  std::vector<float> basis(static_cast<size_t>(k * k));
  for (auto& value : basis) value = normal(generator);
  std::vector<float> x(static_cast<size_t>(rows * k), 0.0f);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t i = 0; i < k; ++i) {
      const float z = normal(generator) * std::pow(10.0f, -2.0f * static_cast<float>(i) / static_cast<float>(k));
      for (int64_t j = 0; j < k; ++j) x[static_cast<size_t>(t * k + j)] += z * basis[static_cast<size_t>(i * k + j)];
    }
    x[static_cast<size_t>(t * k + 3)] *= 8.0f;
  }
  return x;
}

// (Designated initialisers would leave trailing members unnamed, which -Wmissing-field-initializers rejects.)
exl3::QuantizeOptions options_for(int bits, exl3::Codebook codebook = exl3::Codebook::mcg, uint64_t seed = 0,
                                  bool scale_search = true) {
  exl3::QuantizeOptions options;
  options.bits = bits;
  options.codebook = codebook;
  options.seed = seed;
  options.scale_search = scale_search;
  return options;
}

std::vector<float> random_weight(int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (auto& value : w) value = normal(generator);
  return w;
}

// The acceptance check of issue 4: at K = 2, 3, 4, 6 (MCG) our proxy error is at most 1.10x exllamav3's mean over
// seeds 0, 1, 2 (meta.json). Each K costs ~1,450 tile encodings (the scale search's samples outnumber the layer's 512
// tiles), ~11 s of CPU in the release build. The ASan build (-O1, ~8x slower here) runs a reduced variant instead: K =
// 4 on the first 128 output columns (~670 encodings), which still runs every step, against a looser bound since a
// column subset's error is not the whole layer's.
TEST(Exl3Quantizer, ProxyErrorWithinTenPercentOfExllamav3) {
  const SafetensorsFile file(exl3_data("proxy.safetensors"));
  const TensorView* weight_view = file.find("layer.weight");
  const TensorView* hessian_view = file.find("layer.hessian");
  ASSERT_NE(weight_view, nullptr);
  ASSERT_NE(hessian_view, nullptr);
  // exllamav3's orientation, [in, out]; the quantizer takes the checkpoint's [out, in].
  ASSERT_EQ(weight_view->shape, (std::vector<int64_t>{256, 512}));
  ASSERT_EQ(hessian_view->shape, (std::vector<int64_t>{256, 256}));
  const int64_t in = 256, full_out = 512;
#if defined(__SANITIZE_ADDRESS__)
  const int64_t out = 128;
  const std::vector<int> bit_widths = {4};
  const double bound = 1.5;
#else
  const int64_t out = full_out;
  const std::vector<int> bit_widths = {2, 3, 4, 6};
  const double bound = 1.10;
#endif
  const std::vector<float> w_in_out = f32_values(*weight_view);
  std::vector<float> weight(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t o = 0; o < out; ++o)
      weight[static_cast<size_t>(o * in + i)] = w_in_out[static_cast<size_t>(i * full_out + o)];
  }
  const std::vector<float> hessian = f32_values(*hessian_view);

  std::ifstream meta_stream(exl3_data("meta.json"));
  const nlohmann::json meta = nlohmann::json::parse(meta_stream);
  for (const int bits : bit_widths) {
    const double reference = meta["proxy"][fmt::format("k{}", bits)]["mean"].get<double>();
    const exl3::QuantizedLinear q = exl3::quantize_linear(weight.data(), out, in, hessian.data(), options_for(bits));
    EXPECT_TRUE(q.calibrated);
    std::printf("K=%d: proxy error %.6g, exllamav3 %.6g (ratio %.3f), global scale %.4f\n", bits, q.proxy_error,
                reference, q.proxy_error / reference, q.global_scale);
    EXPECT_LE(q.proxy_error, bound * reference) << "K=" << bits;
    // Far better than the reference would mean a different (wrong) metric, not a better quantizer.
    EXPECT_GE(q.proxy_error, 0.5 * reference) << "K=" << bits;
  }
}

// What the quantizer stores decodes, with our codec, to exactly the codebook values it reports having chosen, and
// the dequantized weight is close to the input; odd shapes are padded to 128 and the padding decodes to 0. (The scale
// search is off here and below: it would cost more than these small layers and is exercised by the proxy test.)
TEST(Exl3Quantizer, StoredTensorsDecodeToTheChosenWeights) {
  const int64_t out = 100, in = 136;  // neither a multiple of 128: k = 256, n = 128
  const std::vector<float> weight = random_weight(out, in, 11);
  exl3::HessianAccumulator accumulator(in);
  const std::vector<float> x = correlated_rows(300, in, 5);
  accumulator.add(x.data(), 300);
  const std::vector<float> hessian = accumulator.mean();
  for (const exl3::Codebook codebook : {exl3::Codebook::mcg, exl3::Codebook::mul1, exl3::Codebook::inst3}) {
    const exl3::QuantizedLinear q =
        exl3::quantize_linear(weight.data(), out, in, hessian.data(), options_for(3, codebook, 3, false));
    ASSERT_EQ(q.in_padded, 256);
    ASSERT_EQ(q.out_padded, 128);
    ASSERT_EQ(q.trellis.size(), static_cast<size_t>(16 * 8 * 16 * 3));
    ASSERT_EQ(q.suh.size(), 256u);
    ASSERT_EQ(q.svh.size(), 128u);
    EXPECT_TRUE(q.calibrated);

    std::vector<uint16_t> decoded(256 * 128);
    exl3::decode_rotated(q.trellis.data(), 256, 128, 3, codebook, decoded.data());
    int mismatches = 0;
    for (size_t i = 0; i < decoded.size(); ++i) mismatches += decoded[i] != f32_to_f16(q.rotated[i]);
    EXPECT_EQ(mismatches, 0) << exl3::codebook_name(codebook);

    std::vector<float> effective(256 * 128);  // [in_padded, out_padded]
    exl3::dequantize(q.trellis.data(), q.suh.data(), q.svh.data(), 256, 128, 3, codebook, effective.data());
    double error = 0.0, energy = 0.0, padding = 0.0;
    for (int64_t i = 0; i < 256; ++i) {
      for (int64_t o = 0; o < 128; ++o) {
        const double value = effective[static_cast<size_t>(i * 128 + o)];
        if (i < in && o < out) {
          const double target = weight[static_cast<size_t>(o * in + i)];
          error += (value - target) * (value - target);
          energy += target * target;
        } else if (o >= out) {
          padding = std::max(padding, std::abs(value));  // svh is exactly 0 for all-zero output channels
        }
      }
    }
    // K = 3 on Gaussian weights: ~0.02 relative MSE (spec §4.7 measured 0.0177 uncalibrated).
    EXPECT_LT(error / energy, 0.05) << exl3::codebook_name(codebook);
    EXPECT_EQ(padding, 0.0) << exl3::codebook_name(codebook);
  }
}

// Without a Hessian (or with one whose diagonal is ~0: no activations), exllamav3's fallback: plain tile encoding,
// proxy error = MSE of the regularised weight. LDLQ must beat it in the Hessian's metric, or the feedback is broken.
TEST(Exl3Quantizer, UncalibratedFallbackAndLdlqGain) {
  const int64_t out = 128, in = 128;
  const std::vector<float> weight = random_weight(out, in, 21);
  const exl3::QuantizeOptions options = options_for(2, exl3::Codebook::mcg, 1, false);
  const exl3::QuantizedLinear plain = exl3::quantize_linear(weight.data(), out, in, nullptr, options);
  EXPECT_FALSE(plain.calibrated);
  EXPECT_GT(plain.proxy_error, 0.0);
  const std::vector<float> zeros(static_cast<size_t>(in * in), 0.0f);
  EXPECT_FALSE(exl3::quantize_linear(weight.data(), out, in, zeros.data(), options).calibrated);
  // Same signs and scales, so the same regularised weight: uncalibrated vs LDLQ in the Hessian's own metric.
  exl3::HessianAccumulator accumulator(in);
  const std::vector<float> x = correlated_rows(400, in, 9);
  accumulator.add(x.data(), 400);
  const std::vector<float> hessian = accumulator.mean();
  const exl3::QuantizedLinear ldlq = exl3::quantize_linear(weight.data(), out, in, hessian.data(), options);
  ASSERT_TRUE(ldlq.calibrated);
  auto output_error = [&](const exl3::QuantizedLinear& q) {
    std::vector<float> effective(static_cast<size_t>(in * out));
    exl3::dequantize(q.trellis.data(), q.suh.data(), q.svh.data(), in, out, 2, exl3::Codebook::mcg, effective.data());
    double sum = 0.0;  // Σ_rows |x (W_q − W)|²
    for (int64_t t = 0; t < 400; ++t) {
      for (int64_t o = 0; o < out; ++o) {
        double y = 0.0;
        for (int64_t i = 0; i < in; ++i) {
          y += double{x[static_cast<size_t>(t * in + i)]} *
               (effective[static_cast<size_t>(i * out + o)] - weight[static_cast<size_t>(o * in + i)]);
        }
        sum += y * y;
      }
    }
    return sum;
  };
  EXPECT_LT(output_error(ldlq), 0.8 * output_error(plain));
}

TEST(Exl3Quantizer, HessianAccumulatorMeansAndDropsNonFiniteRows) {
  exl3::HessianAccumulator accumulator(3);
  const float rows[] = {1, 2, 3, 0, 1, 0, std::numeric_limits<float>::quiet_NaN(), 1, 1};
  accumulator.add(rows, 3);
  EXPECT_EQ(accumulator.rows(), 2);
  EXPECT_EQ(accumulator.dropped_rows(), 1);
  const std::vector<float> h = accumulator.mean();
  const float expected[] = {0.5f, 1.0f, 1.5f, 1.0f, 2.5f, 3.0f, 1.5f, 3.0f, 4.5f};
  ASSERT_EQ(h.size(), 9u);
  for (size_t i = 0; i < 9; ++i) EXPECT_FLOAT_EQ(h[i], expected[i]) << i;
  EXPECT_TRUE(exl3::HessianAccumulator(4).mean().empty());
}

TEST(Exl3Quantizer, BadInputsAreClearErrors) {
  const int64_t n = 128;
  std::vector<float> weight = random_weight(n, n, 2);
  std::vector<float> identity(static_cast<size_t>(n * n), 0.0f);
  for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i * n + i)] = 1.0f;
  const exl3::QuantizeOptions options = options_for(2);

  expect_error([&] { exl3::quantize_linear(weight.data(), n, n, nullptr, options_for(9)); }, {"bits", "9"});
  expect_error([&] { exl3::quantize_linear(weight.data(), n, n, nullptr, options_for(0)); }, {"bits", "0"});
  expect_error([&] { exl3::quantize_linear(weight.data(), 0, n, nullptr, options); }, {"empty weight"});

  weight[5 * n + 7] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { exl3::quantize_linear(weight.data(), n, n, nullptr, options); },
               {"weight", "non-finite", "[5, 7]"});
  weight[5 * n + 7] = 0.0f;

  std::vector<float> bad = identity;
  bad[3 * n + 4] = std::numeric_limits<float>::infinity();
  expect_error([&] { exl3::quantize_linear(weight.data(), n, n, bad.data(), options); },
               {"Hessian", "non-finite", "[3, 4]"});

  // Positive diagonal but strongly indefinite (eigenvalues 1 ± 5 on each pair): damping cannot rescue it.
  bad = identity;
  for (int64_t i = 0; i + 1 < n; i += 2) {
    bad[static_cast<size_t>(i * n + i + 1)] = 5.0f;
    bad[static_cast<size_t>((i + 1) * n + i)] = 5.0f;
  }
  expect_error([&] { exl3::quantize_linear(weight.data(), n, n, bad.data(), options); },
               {"Hessian", "not positive definite"});
}

}  // namespace
}  // namespace kestrel
