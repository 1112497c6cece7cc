// CPU backend ops against direct float64 references and against each other: weight formats in linear, the two KDA
// forms, and the deterministic tie-breaking of the indexer and the router.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "indexer_selection.h"
#include "base/error.h"
#include "base/numeric.h"

namespace kestrel {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// Stores `values` [rows, cols] in `dtype` (fp8: e4m3 codes chosen by rounding, with per-block scales) and returns the
// weight plus the exact float values it represents.
struct StoredMatrix {
  std::vector<std::byte> data, scale;
  std::vector<double> exact;
  LinearWeight weight;
};

uint8_t nearest_fp8_code(float value) {
  uint8_t best = 0;
  float best_error = INFINITY;
  for (int code = 0; code < 256; ++code) {
    const float decoded = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if (!std::isnan(decoded) && std::fabs(decoded - value) < best_error) {
      best_error = std::fabs(decoded - value);
      best = static_cast<uint8_t>(code);
    }
  }
  return best;
}

StoredMatrix store(const std::vector<float>& values, int64_t rows, int64_t cols, DType dtype, int64_t block = 128) {
  StoredMatrix m;
  m.exact.resize(values.size());
  m.weight = LinearWeight{.name = "w", .dtype = dtype, .out_features = rows, .in_features = cols};
  const size_t n = values.size();
  if (dtype == DType::f32) {
    m.data.resize(n * 4);
    std::memcpy(m.data.data(), values.data(), n * 4);
    for (size_t i = 0; i < n; ++i) m.exact[i] = values[i];
  } else if (dtype == DType::bf16 || dtype == DType::f16) {
    m.data.resize(n * 2);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t bits = dtype == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(m.data.data() + i * 2, &bits, 2);
      m.exact[i] = dtype == DType::bf16 ? bf16_to_f32(bits) : f16_to_f32(bits);
    }
  } else {
    const int64_t scale_rows = (rows + block - 1) / block, scale_cols = (cols + block - 1) / block;
    std::vector<float> scales(static_cast<size_t>(scale_rows * scale_cols));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.01f * static_cast<float>(i + 1);
    m.scale.resize(scales.size() * 4);
    std::memcpy(m.scale.data(), scales.data(), m.scale.size());
    m.data.resize(n);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto i = static_cast<size_t>(r * cols + c);
        const float s = scales[static_cast<size_t>((r / block) * scale_cols + c / block)];
        const uint8_t code = nearest_fp8_code(values[i] / s);
        m.data[i] = static_cast<std::byte>(code);
        m.exact[i] = static_cast<double>(fp8_e4m3_to_f32(code)) * s;
      }
    }
    m.weight.scale = m.scale.data();
    m.weight.scale_dtype = DType::f32;
    m.weight.block_rows = block;
    m.weight.block_cols = block;
  }
  m.weight.data = m.data.data();
  return m;
}

class LinearFormatTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearFormatTest, MatchesFloat64ProductOfStoredValues) {
  // 200 x 300 with 128 x 128 fp8 blocks: ragged blocks on both edges.
  const int64_t rows = 200, cols = 300, tokens = 3;
  const StoredMatrix m = store(random_values(static_cast<size_t>(rows * cols), 1, 0.05f), rows, cols, GetParam());
  const std::vector<float> x = random_values(static_cast<size_t>(tokens * cols), 2);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  CpuBackend backend;
  backend.linear(x.data(), tokens, m.weight, y.data());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double expected = 0.0;
      for (int64_t c = 0; c < cols; ++c) expected += m.exact[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(t * cols + c)];
      ASSERT_NEAR(y[static_cast<size_t>(t * rows + r)], expected, 1e-4 * (1.0 + std::fabs(expected))) << t << "," << r;
    }
  }
}

// Backend::linears (matrices sharing an input, which the CUDA backend runs as one launch): each output equals its
// own linear(), and a count of outputs that does not match the matrices is an Error, not a write past the list.
TEST(LinearsTest, EachOutputIsItsOwnLinearAndMismatchedCountsAreRefused) {
  const int64_t cols = 300, tokens = 2;
  const StoredMatrix a = store(random_values(static_cast<size_t>(200 * cols), 3, 0.05f), 200, cols, DType::bf16);
  const StoredMatrix b = store(random_values(static_cast<size_t>(17 * cols), 4, 0.05f), 17, cols, DType::f32);
  const std::vector<float> x = random_values(static_cast<size_t>(tokens * cols), 5);
  CpuBackend backend;
  std::vector<float> ya(static_cast<size_t>(tokens * 200)), yb(static_cast<size_t>(tokens * 17));
  const LinearWeight* weights[] = {&a.weight, &b.weight};
  float* const outputs[] = {ya.data(), yb.data()};
  backend.linears(x.data(), tokens, weights, outputs);
  std::vector<float> alone_a(ya.size()), alone_b(yb.size());
  backend.linear(x.data(), tokens, a.weight, alone_a.data());
  backend.linear(x.data(), tokens, b.weight, alone_b.data());
  EXPECT_EQ(ya, alone_a);
  EXPECT_EQ(yb, alone_b);
  EXPECT_THROW(backend.linears(x.data(), tokens, weights, std::span<float* const>(outputs, 1)), Error);
}

// --dtype bfloat16 (ProductInput::bf16): a bf16 matrix's product takes its input rounded to bf16, the same bits as
// rounding x first and multiplying in float32; other formats keep the float32 input. The products through
// swiglu_linear round the activation, not gate and up.
TEST(ProductInputTest, Bf16InputsAreRoundedForBf16MatricesOnly) {
  const int64_t rows = 40, cols = 96, tokens = 3;
  const StoredMatrix bf16 = store(random_values(static_cast<size_t>(rows * cols), 6, 0.05f), rows, cols, DType::bf16);
  const StoredMatrix f32 = store(random_values(static_cast<size_t>(rows * cols), 7, 0.05f), rows, cols, DType::f32);
  const std::vector<float> x = random_values(static_cast<size_t>(tokens * cols), 8);
  std::vector<float> x_rounded(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = bf16_to_f32(f32_to_bf16(x[i]));
  ASSERT_NE(x, x_rounded);
  CpuBackend exact, rounding;
  rounding.set_product_input(ProductInput::bf16);
  const auto product = [&](CpuBackend& backend, const std::vector<float>& input, const LinearWeight& w) {
    std::vector<float> y(static_cast<size_t>(tokens * rows));
    backend.linear(input.data(), tokens, w, y.data());
    return y;
  };
  EXPECT_EQ(product(rounding, x, bf16.weight), product(exact, x_rounded, bf16.weight));
  EXPECT_NE(product(rounding, x, bf16.weight), product(exact, x, bf16.weight));
  EXPECT_EQ(product(rounding, x, f32.weight), product(exact, x, f32.weight));
  const std::vector<float> up = random_values(x.size(), 9);
  std::vector<float> hidden(x.size()), y(static_cast<size_t>(tokens * rows));
  rounding.swiglu_linear(x.data(), up.data(), tokens, 7.0f, bf16.weight, hidden.data(), y.data());
  EXPECT_EQ(y, product(rounding, hidden, bf16.weight));
  EXPECT_EQ(parse_dtype("auto"), ProductInput::float32);
  EXPECT_EQ(parse_dtype("float"), ProductInput::float32);
  EXPECT_EQ(parse_dtype("bfloat16"), ProductInput::bf16);
  EXPECT_THROW(parse_dtype("float16"), Error);
  EXPECT_THROW(parse_dtype("half"), Error);
}

// The mHC mixes (fn · the normalised streams) are float32's under --dtype bfloat16 too, as the reference's and
// vLLM's are, and as the GPU's fused site computes them: a bf16 fn gives the same pre, post, comb and collapse in
// both modes.
TEST(ProductInputTest, MhcMixesTakeFloat32InputsEitherWay) {
  const int64_t hc = 4, hidden = 24, tokens = 3, mix = (2 + hc) * hc;
  const StoredMatrix fn = store(random_values(static_cast<size_t>(mix * hc * hidden), 10, 0.05f), mix, hc * hidden,
                                DType::bf16);
  const MhcWeights weights{.fn = fn.weight, .base = random_values(static_cast<size_t>(mix), 11),
                           .scale = std::vector<float>{0.7f, 1.3f, 2.0f}};
  const MhcShape shape{.num_tokens = tokens, .hc_mult = hc, .hidden = hidden, .rms_eps = 1e-6f, .hc_eps = 1e-6f,
                       .sinkhorn_iters = 20};
  const std::vector<float> streams = random_values(static_cast<size_t>(tokens * hc * hidden), 12, 2.0f);
  struct Site {
    std::vector<float> post, comb, collapsed;
    bool operator==(const Site&) const = default;
  };
  const auto site = [&](ProductInput input) {
    CpuBackend backend;
    backend.set_product_input(input);
    Site s{std::vector<float>(static_cast<size_t>(tokens * hc)), std::vector<float>(static_cast<size_t>(tokens * hc * hc)),
           std::vector<float>(static_cast<size_t>(tokens * hidden))};
    backend.mhc_pre(shape, weights, streams.data(), s.post.data(), s.comb.data(), s.collapsed.data());
    return s;
  };
  EXPECT_EQ(site(ProductInput::bf16), site(ProductInput::float32));
}

// Backend::sparse_mla_attention_steps (a decode step's attention, which the CUDA backend runs as one pass): token s
// attends over sequence s's latents, as sparse_mla_attention of that sequence alone gives, with the sequences'
// blocks interleaved in one pool; a count of sequences that does not match the tokens is an Error.
// Backend::write_rows' default: rows appended across block boundaries (append_rows) land in their blocks, another
// sequence's blocks between them untouched; rows outside the appended ones are refused.
TEST(WriteRowsTest, RowsLandInTheirBlocksAcrossBoundaries) {
  constexpr int64_t width = 3, block_rows = 4;
  CpuBackend backend;
  GrowingBlockSource source;
  RowBlockPool pool(backend, width, block_rows);
  BlockTable ours_table(source, backend), other_table(source, backend);
  PagedRows ours(pool, ours_table), other(pool, other_table);
  std::fill_n(ours.append(), width, -1.0f);  // row 0, written before
  for (int64_t r = 0; r < 6; ++r) std::fill_n(other.append(), width, 7.0f);
  const int64_t first = ours.append_rows(9);  // rows 1..9: the rest of block 0, block 1, two rows of block 2
  EXPECT_EQ(first, 1);
  EXPECT_EQ(ours.size(), 10);
  std::vector<float> src(9 * width);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  backend.write_rows(ours, first, src.data(), 9);
  EXPECT_EQ(ours.row(0)[0], -1.0f);
  for (int64_t r = 0; r < 9; ++r) {
    for (int64_t c = 0; c < width; ++c) EXPECT_EQ(ours.row(first + r)[c], static_cast<float>(r * width + c));
  }
  for (int64_t r = 0; r < 6; ++r) EXPECT_EQ(other.row(r)[0], 7.0f);
  EXPECT_THROW(backend.write_rows(ours, 8, src.data(), 3), Error);
}

TEST(AttentionStepsTest, EachTokenAttendsOverItsOwnSequence) {
  constexpr int64_t H = 2, qk = 8, vd = 8, rank = 16, block_rows = 4;
  CpuBackend backend;
  const std::vector<float> kv_b_values = random_values(static_cast<size_t>(H * (qk + vd) * rank), 6, 0.1f);
  const LinearWeight kv_b{.name = "kv_b", .dtype = DType::f32, .out_features = H * (qk + vd), .in_features = rank,
                          .data = reinterpret_cast<const std::byte*>(kv_b_values.data())};
  GrowingBlockSource source;
  RowBlockPool pool(backend, rank, block_rows);
  BlockTable first_table(source, backend), second_table(source, backend);
  PagedRows first(pool, first_table), second(pool, second_table);
  const int64_t lengths[] = {5, 9};
  uint32_t seed = 7;
  for (int64_t r = 0; r < 9; ++r) {  // interleaved, so that the sequences' blocks alternate in the pool
    for (PagedRows* rows : {&first, &second}) {
      if (r >= lengths[rows == &first ? 0 : 1]) continue;
      const std::vector<float> row = random_values(static_cast<size_t>(rank), ++seed);
      std::copy(row.begin(), row.end(), rows->append());
    }
  }
  const int64_t stride = 9;
  std::vector<int32_t> positions(2 * stride, -1);
  const std::vector<int32_t> counts{5, 9};
  for (int64_t s = 0; s < 2; ++s) {
    for (int32_t p = 0; p < counts[static_cast<size_t>(s)]; ++p) positions[static_cast<size_t>(s * stride + p)] = p;
  }
  const std::vector<float> query = random_values(static_cast<size_t>(2 * H * qk), 20);
  const auto args = [&](int64_t s, int64_t count, const PagedRows* latents, float* out) {
    return SparseMlaArgs{.num_tokens = count, .num_heads = H, .qk_head_dim = qk, .v_head_dim = vd,
                         .kv_lora_rank = rank, .scale = 0.35f, .query = query.data() + s * H * qk, .kv_b = &kv_b,
                         .latents = latents, .positions = positions.data() + s * stride,
                         .counts = counts.data() + s, .positions_stride = stride, .out = out};
  };
  std::vector<float> step(static_cast<size_t>(2 * H * vd)), alone(step.size());
  const PagedRows* latents[] = {&first, &second};
  backend.sparse_mla_attention_steps(args(0, 2, nullptr, step.data()), latents);
  backend.sparse_mla_attention(args(0, 1, &first, alone.data()));
  backend.sparse_mla_attention(args(1, 1, &second, alone.data() + H * vd));
  EXPECT_EQ(step, alone);
  EXPECT_THROW(backend.sparse_mla_attention_steps(args(0, 2, nullptr, step.data()),
                                                  std::span<const PagedRows* const>(latents, 1)),
               Error);
}

// A latent cache in bf16 or fp8 (--kv-cache-dtype): Backend::write_rows encodes each row into its block, across
// block boundaries, and sparse_mla_attention over those rows equals, to the bit, attention over a float32 cache
// holding the decoded rows; float32 reads of such a pool are refused.
class LatentRowFormatTest : public ::testing::TestWithParam<CacheDtype> {};

TEST_P(LatentRowFormatTest, AttentionReadsTheDecodedRows) {
  constexpr int64_t H = 2, qk = 8, vd = 8, rank = 160, block_rows = 4, T = 3, rows = 11;
  CpuBackend backend;
  const RowFormat format{.dtype = GetParam(), .width = rank};
  GrowingBlockSource source;
  RowBlockPool coded_pool(backend, format, block_rows), float_pool(backend, rank, block_rows);
  BlockTable coded_table(source, backend), float_table(source, backend);
  PagedRows coded(coded_pool, coded_table), decoded(float_pool, float_table);
  const std::vector<float> latents = random_values(static_cast<size_t>(rows * rank), 31, 2.0f);
  backend.write_rows(coded, coded.append_rows(2), latents.data(), 2);  // two calls, the second across blocks
  backend.write_rows(coded, coded.append_rows(rows - 2), latents.data() + 2 * rank, rows - 2);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> expected(static_cast<size_t>(rank)), stored(static_cast<size_t>(rank));
    std::vector<std::byte> encoded(static_cast<size_t>(format.row_bytes()));
    encode_row(format, latents.data() + r * rank, encoded.data());
    decode_row(format, encoded.data(), expected.data());
    decode_row(format, coded.row_bytes(r), stored.data());
    EXPECT_EQ(stored, expected) << "row " << r;
    std::copy(expected.begin(), expected.end(), decoded.append());
  }
  EXPECT_THROW(coded.row(0), Error);

  const std::vector<float> kv_b_values = random_values(static_cast<size_t>(H * (qk + vd) * rank), 32, 0.1f);
  const LinearWeight kv_b{.name = "kv_b", .dtype = DType::f32, .out_features = H * (qk + vd), .in_features = rank,
                          .data = reinterpret_cast<const std::byte*>(kv_b_values.data())};
  const std::vector<float> query = random_values(static_cast<size_t>(T * H * qk), 33);
  const int64_t stride = rows;
  std::vector<int32_t> positions(static_cast<size_t>(T * stride), -1);
  const std::vector<int32_t> counts{4, 11, 7};
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t p = 0; p < counts[static_cast<size_t>(t)]; ++p) {
      positions[static_cast<size_t>(t * stride + p)] = static_cast<int32_t>((p * 3 + t) % rows);
    }
    std::sort(positions.begin() + t * stride, positions.begin() + t * stride + counts[static_cast<size_t>(t)]);
  }
  const auto attend = [&](const PagedRows& cache) {
    std::vector<float> out(static_cast<size_t>(T * H * vd));
    backend.sparse_mla_attention(SparseMlaArgs{.num_tokens = T, .num_heads = H, .qk_head_dim = qk, .v_head_dim = vd,
                                               .kv_lora_rank = rank, .scale = 0.2f, .query = query.data(),
                                               .kv_b = &kv_b, .latents = &cache, .positions = positions.data(),
                                               .counts = counts.data(), .positions_stride = stride,
                                               .out = out.data()});
    return out;
  };
  EXPECT_EQ(attend(coded), attend(decoded));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LatentRowFormatTest, ::testing::Values(CacheDtype::bf16, CacheDtype::fp8_e4m3),
                         [](const auto& param_info) { return std::string(cache_dtype_name(param_info.param)); });

INSTANTIATE_TEST_SUITE_P(Formats, LinearFormatTest,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16, DType::f8_e4m3),
                         [](const auto& param_info) { return std::string(dtype_name(param_info.param)); });

TEST(KdaTest, ChunkedFormEqualsRecurrentForm) {
  const int64_t T = 150, H = 3, D = 16;  // 3 chunks of 64, the last partial
  const auto n = static_cast<size_t>(T * H * D);
  const std::vector<float> q = random_values(n, 3), k = random_values(n, 4), v = random_values(n, 5);
  std::vector<float> g = random_values(n, 6, 0.5f), beta = random_values(static_cast<size_t>(T * H), 7);
  for (float& value : g) value = -std::fabs(value);
  for (float& value : beta) value = 1.0f / (1.0f + std::exp(-value));
  const std::vector<float> initial = random_values(static_cast<size_t>(H * D * D), 8, 0.1f);
  std::vector<float> state_chunked = initial, state_recurrent = initial, out_chunked(n), out_recurrent(n);
  CpuBackend backend;
  KdaArgs args{.num_tokens = T, .num_heads = H, .head_dim = D, .q = q.data(), .k = k.data(), .v = v.data(),
               .g = g.data(), .beta = beta.data(), .state = state_chunked.data(), .out = out_chunked.data()};
  backend.kda_chunked(args, 64);
  args.state = state_recurrent.data();
  args.out = out_recurrent.data();
  backend.kda_recurrent(args);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(out_chunked[i], out_recurrent[i], 1e-4) << i;
  for (size_t i = 0; i < initial.size(); ++i) ASSERT_NEAR(state_chunked[i], state_recurrent[i], 1e-4) << i;
}

TEST(IndexerTest, EqualScoresSelectLowerPoolsThenTail) {
  const int64_t dim = 4, kpool = 4, pools = 10;
  CpuBackend backend;
  RowBlockPool pool(backend, dim, 16);
  GrowingBlockSource source;
  BlockTable table(source, backend);
  PagedRows pooled(pool, table);
  for (int64_t p = 0; p < pools; ++p) std::fill_n(pooled.append(), dim, 1.0f);  // every pool scores the same
  const std::vector<float> query(static_cast<size_t>(2 * dim), 1.0f), weights(2, 1.0f);
  const auto selected = testing::select_on_host(backend, IndexerArgs{.num_tokens = 1, .start = 41, .num_heads = 2, .head_dim = dim,
                                                    .kpool = kpool, .topk_pools = 3, .select_tail = true,
                                                    .query = query.data(), .weights = weights.data(),
                                                    .pooled_keys = &pooled}).lists();
  // Pools 0..2 win the tie; position 41 has the incomplete pool [40, 41] as its tail.
  EXPECT_EQ(selected.at(0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 40, 41}));
}

// Three pooled keys of width 2 whose dot product with the query (1, 0) grows with the pool: 1, 2, 3.
struct GrowingPools {
  static constexpr int64_t kDim = 2, kPool = 4;
  CpuBackend backend;
  RowBlockPool pool{backend, kDim, 16};
  GrowingBlockSource source;
  BlockTable table{source, backend};
  PagedRows pooled{pool, table};
  const std::vector<float> query = {1.0f, 0.0f}, weights = {1.0f};

  GrowingPools() {
    for (int64_t p = 0; p < 3; ++p) {
      float* row = pooled.append();
      row[0] = static_cast<float>(p + 1);
      row[1] = 0.0f;
    }
  }
};

TEST(IndexerTest, QueryNeverSeesPoolsEndingAfterIt) {
  GrowingPools pools;
  // Position 6: pool 1 ends at 7 (not visible), so pool 0 and the tail [4, 6].
  const auto selected =
      testing::select_on_host(pools.backend,
                              IndexerArgs{.num_tokens = 1, .start = 6, .num_heads = 1, .head_dim = GrowingPools::kDim,
                                          .kpool = GrowingPools::kPool, .topk_pools = 2, .select_tail = true,
                                          .query = pools.query.data(), .weights = pools.weights.data(),
                                          .pooled_keys = &pools.pooled})
          .lists();
  EXPECT_EQ(selected.at(0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(IndexerTest, WeightsScaleMultipliesEveryHeadsWeight) {
  GrowingPools pools;
  const auto best_pool = [&](float weights_scale) {
    const auto selected =
        testing::select_on_host(pools.backend,
                                IndexerArgs{.num_tokens = 1, .start = 11, .num_heads = 1, .head_dim = GrowingPools::kDim,
                                            .kpool = GrowingPools::kPool, .topk_pools = 1, .select_tail = false,
                                            .query = pools.query.data(), .weights = pools.weights.data(),
                                            .weights_scale = weights_scale, .pooled_keys = &pools.pooled})
            .lists();
    return selected.at(0).at(0) / GrowingPools::kPool;
  };
  // A positive scale keeps the highest dot product first; a negative one (a weight below zero) the lowest.
  EXPECT_EQ(best_pool(0.5f), 2);
  EXPECT_EQ(best_pool(-0.5f), 0);
}

TEST(RouterTest, TiesGoToLowerExpertAndWeightsUseUnbiasedScores) {
  const std::vector<float> logits = {0.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<float> bias = {2.0f, 0.0f, 0.0f, 0.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> weights(2);
  CpuBackend backend;
  backend.route_experts(RouterArgs{.num_tokens = 1, .num_experts = 4, .top_k = 2, .n_group = 1, .topk_group = 1,
                                   .norm_topk_prob = true, .routed_scaling_factor = 2.5f, .logits = logits.data(),
                                   .correction_bias = bias.data(), .expert_ids = ids.data(),
                                   .expert_weights = weights.data()});
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));  // bias lifts expert 0; experts 1..3 tie, 1 wins
  const double s0 = 0.5, s1 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(weights[0], s0 / (s0 + s1) * 2.5, 1e-6);
  EXPECT_NEAR(weights[1], s1 / (s0 + s1) * 2.5, 1e-6);
}

// A NaN logit (a broken checkpoint or activation) ranks last rather than breaking the sort's order: the choice is
// the best of the rest, in order, and every id is a real expert.
TEST(RouterTest, NanLogitRanksLast) {
  const std::vector<float> logits = {NAN, 0.5f, NAN, 2.0f, 1.0f};
  const std::vector<float> bias(5, 0.0f);
  std::vector<int32_t> ids(3);
  std::vector<float> weights(3);
  CpuBackend backend;
  backend.route_experts(RouterArgs{.num_tokens = 1, .num_experts = 5, .top_k = 3, .n_group = 1, .topk_group = 1,
                                   .norm_topk_prob = true, .routed_scaling_factor = 1.0f, .logits = logits.data(),
                                   .correction_bias = bias.data(), .expert_ids = ids.data(),
                                   .expert_weights = weights.data()});
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 4, 1}));
  for (const float w : weights) EXPECT_TRUE(std::isfinite(w));
}

}  // namespace
}  // namespace kestrel
