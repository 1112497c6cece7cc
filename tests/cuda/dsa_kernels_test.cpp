// The CUDA DSA ops against the CPU backend (cpu/dsa.cpp). Cached rows are host PagedRows on a scattered block table
// (two sequences taking blocks in turns), copied to one device pool at the same block ids, the blocks of the other
// sequence left NaN. k-pool compression within 1e-6 (only expf's last bits differ); the indexer's selection identical
// at the nano and GLM-5.3-Flash indexer shapes — decode deep in the context, prefill with per-token visibility,
// positions where every visible pool is kept, with and without the tail, ties from duplicated pooled keys; sparse
// MLA attention over the CPU's selection (up to 2051 positions) within 1e-5 at the nano and the model's MLA shapes,
// tokens with no position included, and within 3e-3 on the tensor cores (fp16 operands) for prefill-sized calls.
// Without a GPU, only the argument checks run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/dsa_kernels.h"
#include "backend/cuda/dynamic_shared.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/mla_prefill.h"
#include "backend/cuda/mla_weights.h"
#include "base/error.h"
#include "base/numeric.h"
#include "../backend/indexer_selection.h"
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

using namespace kestrel::cuda::testing;

// Pooled keys run the CPU's operations in its order; expf may differ in the last bits.
constexpr double kKpoolTolerance = 1e-6;
// Attention reduces the latent dot products over warp lanes and the softmax online in chunks of 16 positions, with
// FMAs; the CPU reduces in position order. The kernel's order emulated on the host is 3.0e-6 from the CPU at the
// model's shape (64 heads, 2051 positions); the CPU itself is 2.5e-6 from a float64 evaluation.
constexpr double kAttentionTolerance = 1e-5;
// The tensor-core prefill rounds q, q̂, the latent rows, the probabilities and ô to fp16 (2^-11 relative each).
constexpr double kMmaAttentionTolerance = 3e-3;
constexpr int64_t kKpool = 4, kBlockTokens = 64;

// The host-memory backend the cached rows are written through.
CpuBackend& host() {
  static CpuBackend backend;
  return backend;
}

// A block table whose ids are not 0, 1, 2, ...: another sequence takes 1 or 2 blocks after each of ours.
class ScatteredTable {
public:
  explicit ScatteredTable(int64_t num_blocks) {
    std::mt19937 rng(11);
    while (ours_.size() < num_blocks) {
      ours_.grow_to(ours_.size() + 1);
      other_.grow_to(other_.size() + 1 + static_cast<int64_t>(rng() % 2));
    }
  }
  BlockTable& table() { return ours_; }

private:
  GrowingBlockSource source_;
  BlockTable ours_{source_, host()}, other_{source_, host()};
};

int64_t blocks_for(int64_t tokens) { return (tokens + kBlockTokens - 1) / kBlockTokens; }

void append_rows(PagedRows& rows, const std::vector<float>& values) {
  const auto width = static_cast<size_t>(rows.row_width());
  for (size_t i = 0; i < values.size(); i += width) std::copy_n(&values[i], width, rows.append());
}

// The blocks of `pool` that `table` names, at the same ids in one device pool (vLLM's layout); other ids hold bytes
// 0xFF (NaN in float32, bf16 and e4m3), so a read through a wrong block id shows.
struct DeviceRows {
  DeviceBuffer pool, block_ids;
  DevicePagedRows view;
};

DeviceRows to_device_rows(RowBlockPool& pool, const BlockTable& table, int64_t num_rows) {
  const std::vector<int32_t>& ids = table.ids();
  const int64_t block_bytes = pool.block_rows() * pool.format().row_bytes();
  const int64_t max_id = *std::max_element(ids.begin(), ids.end());
  std::vector<unsigned char> host(static_cast<size_t>((max_id + 1) * block_bytes), 0xFF);
  for (const int32_t id : ids) {
    std::memcpy(host.data() + id * block_bytes, pool.block(id), static_cast<size_t>(block_bytes));
  }
  DeviceRows rows{.pool = to_device(host), .block_ids = to_device(ids), .view = {}};
  rows.view = device_paged_rows(rows.pool.as<unsigned char>(), rows.block_ids.as<int32_t>(), pool.block_rows(),
                                num_rows, pool.format());
  return rows;
}

TEST(CudaDsaTest, KpoolCompressMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  const int64_t tokens = 1003;  // 250 complete pools and a partial one
  struct Span {
    int64_t first, count;
  };
  for (const int64_t dim : {int64_t{32}, int64_t{128}}) {  // index_head_dim of the nano model, of GLM-5.3-Flash
    ScatteredTable seq(blocks_for(tokens));
    RowBlockPool key_pool(host(), dim, kBlockTokens), gate_pool(host(), dim, kBlockTokens);
    PagedRows keys(key_pool, seq.table()), gates(gate_pool, seq.table());
    append_rows(keys, random_values(static_cast<size_t>(tokens * dim), 21));
    append_rows(gates, random_values(static_cast<size_t>(tokens * dim), 22, 2.0f));
    const std::vector<float> ape = random_values(static_cast<size_t>(kKpool * dim), 23);
    const DeviceRows keys_dev = to_device_rows(key_pool, seq.table(), tokens);
    const DeviceRows gates_dev = to_device_rows(gate_pool, seq.table(), tokens);
    const DeviceBuffer ape_dev = to_device(ape);
    for (const Span span : {Span{0, 250}, Span{137, 1}}) {  // a prompt's pools; the one a decode step completes
      std::vector<float> expected(static_cast<size_t>(span.count * dim));
      cpu.kpool_compress(keys, gates, ape.data(), span.first, span.count, kKpool, expected.data());
      DeviceBuffer pooled(expected.size() * sizeof(float));
      check(kpool_compress(keys_dev.view, gates_dev.view, ape_dev.as<float>(), span.first, span.count, kKpool,
                           pooled.as<float>(), nullptr),
            "kpool_compress");
      EXPECT_LT(relative_difference(to_host<float>(pooled), expected), kKpoolTolerance)
          << "dim " << dim << " first pool " << span.first;
    }
  }
}

// A prefill chunk's cache rows in one launch: rows 37..186 of a sequence on a scattered table (other blocks NaN)
// land where the block table says, the rows before them and the other sequence's blocks untouched.
TEST(CudaDsaTest, PagedRowsAreWrittenThroughTheBlockTable) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kWidth = 128, kFirst = 37, kCount = 150;
  ScatteredTable seq(blocks_for(kFirst + kCount));
  RowBlockPool pool(host(), kWidth, kBlockTokens);
  PagedRows rows(pool, seq.table());
  append_rows(rows, random_values(static_cast<size_t>((kFirst + kCount) * kWidth), 31));
  DeviceRows device = to_device_rows(pool, seq.table(), kFirst + kCount);
  const std::vector<float> src = random_values(static_cast<size_t>(kCount * kWidth), 32);
  const DeviceBuffer src_dev = to_device(src);
  check(write_paged_rows(device.view, kFirst, src_dev.as<float>(), kCount, nullptr), "write_paged_rows");
  std::vector<float> after(device.pool.size() / sizeof(float));
  device.pool.download(after.data(), device.pool.size());
  const int64_t block_floats = kBlockTokens * kWidth;
  for (int64_t r = 0; r < kFirst + kCount; ++r) {
    const int64_t id = seq.table().ids()[static_cast<size_t>(r / kBlockTokens)];
    const float* got = &after[static_cast<size_t>(id * block_floats + r % kBlockTokens * kWidth)];
    const float* want = r < kFirst ? rows.row(r) : &src[static_cast<size_t>((r - kFirst) * kWidth)];
    ASSERT_TRUE(std::equal(got, got + kWidth, want)) << "row " << r;
  }
  int64_t untouched = 0;
  for (size_t b = 0; b * block_floats < after.size(); ++b) {
    const auto& ids = seq.table().ids();
    if (std::find(ids.begin(), ids.end(), static_cast<int32_t>(b)) != ids.end()) continue;
    untouched += std::all_of(after.begin() + static_cast<int64_t>(b) * block_floats,
                             after.begin() + static_cast<int64_t>(b + 1) * block_floats,
                             [](float v) { return std::isnan(v); });
    EXPECT_TRUE(std::isnan(after[b * block_floats])) << "block " << b;
  }
  EXPECT_GT(untouched, 0);
  EXPECT_EQ(write_paged_rows(device.view, kFirst, src_dev.as<float>(), kCount + 1, nullptr), cudaErrorInvalidValue);
}

// bf16 and fp8 latent rows (--kv-cache-dtype) written on the GPU are the bytes the CPU's encode_row makes, to the bit:
// values and, for fp8, each group's scale (widths of 512 and of 300: groups of 128, 128 and 44), on a scattered table
// whose other blocks stay untouched.
TEST(CudaDsaTest, CodedRowsAreTheCpusEncoding) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kFirst = 5, kCount = 70;
  for (const CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3}) {
    for (const int64_t width : {int64_t{512}, int64_t{300}}) {
      const RowFormat format{.dtype = dtype, .width = width};
      ScatteredTable seq(blocks_for(kFirst + kCount));
      RowBlockPool pool(host(), format, kBlockTokens);
      PagedRows rows(pool, seq.table());
      rows.append_rows(kFirst + kCount);
      DeviceRows device = to_device_rows(pool, seq.table(), kFirst + kCount);
      std::vector<float> src = random_values(static_cast<size_t>(kCount * width), 33);
      for (size_t i = 0; i < src.size(); i += 7) src[i] *= 300.0f;  // values far apart within a group
      const DeviceBuffer src_dev = to_device(src);
      check(write_paged_rows(device.view, kFirst, src_dev.as<float>(), kCount, nullptr), "write_paged_rows");
      const std::vector<unsigned char> after = to_host<unsigned char>(device.pool);
      const int64_t row_bytes = format.row_bytes(), block_bytes = kBlockTokens * row_bytes;
      const int64_t value_bytes = dtype == CacheDtype::bf16 ? 2 * width : width;
      std::vector<std::byte> want(static_cast<size_t>(row_bytes));
      for (int64_t r = 0; r < kCount; ++r) {
        const int64_t position = kFirst + r;
        const int64_t id = seq.table().ids()[static_cast<size_t>(position / kBlockTokens)];
        const unsigned char* got = after.data() + id * block_bytes + position % kBlockTokens * row_bytes;
        encode_row(format, &src[static_cast<size_t>(r * width)], want.data());
        ASSERT_EQ(std::memcmp(got, want.data(), static_cast<size_t>(value_bytes)), 0)
            << cache_dtype_name(dtype) << " width " << width << " row " << position;
        if (dtype == CacheDtype::fp8_e4m3) {
          ASSERT_EQ(std::memcmp(got + format.scale_offset(), want.data() + format.scale_offset(),
                                static_cast<size_t>(4 * format.num_scales())),
                    0)
              << "scales of row " << position;
        }
      }
      for (size_t b = 0; b * static_cast<size_t>(block_bytes) < after.size(); ++b) {
        const auto& ids = seq.table().ids();
        if (std::find(ids.begin(), ids.end(), static_cast<int32_t>(b)) != ids.end()) continue;
        EXPECT_EQ(after[b * static_cast<size_t>(block_bytes)], 0xFF) << "block " << b;
      }
    }
  }
}

struct IndexerShape {
  int64_t heads, head_dim, topk_pools;
};
constexpr IndexerShape kNanoIndexer{4, 32, 256};     // index_n_heads, index_head_dim, index_topk / index_kpool
constexpr IndexerShape kModelIndexer{32, 128, 512};  // GLM-5.3-Flash

// A sequence's pooled keys: PagedRows on a scattered table (block_tokens / kpool pools per block) and the device copy.
struct PooledKeys {
  PooledKeys(int64_t num_pools, int64_t dim, const std::vector<float>& values)
      : seq(blocks_for(num_pools * kKpool)), pool(host(), dim, kBlockTokens / kKpool), rows(pool, seq.table()) {
    append_rows(rows, values);
    device = to_device_rows(pool, seq.table(), num_pools);
  }
  ScatteredTable seq;
  RowBlockPool pool;
  PagedRows rows;
  DeviceRows device;
};

// The GPU's selection as lists, checking that each is padded with -1 to indexer_max_positions; with `group`, the
// scratch holds the scores of that many tokens, so the call runs as launches of `group` tokens.
std::vector<std::vector<int64_t>> gpu_select(const IndexerArgs& a, const DevicePagedRows& pooled_keys,
                                             int64_t group = 0) {
  const int64_t T = a.num_tokens, stride = indexer_max_positions(a.topk_pools, a.kpool);
  const DeviceBuffer query = to_device(std::vector<float>(a.query, a.query + T * a.num_heads * a.head_dim));
  const DeviceBuffer weights = to_device(std::vector<float>(a.weights, a.weights + T * a.num_heads));
  const int64_t scratch_floats = group > 0 ? indexer_scratch_floats(group, pooled_keys.num_rows) : 0;
  DeviceBuffer scratch(static_cast<size_t>(std::max<int64_t>(
                           group > 0 ? scratch_floats : indexer_scratch_floats(T, pooled_keys.num_rows), 1)) *
                       sizeof(float));
  DeviceBuffer positions(static_cast<size_t>(T * stride) * sizeof(int32_t));
  DeviceBuffer counts(static_cast<size_t>(T) * sizeof(int32_t));
  check(indexer_select(IndexerDeviceArgs{.num_tokens = T, .start = a.start, .num_heads = a.num_heads,
                                         .head_dim = a.head_dim, .kpool = a.kpool, .topk_pools = a.topk_pools,
                                         .select_tail = a.select_tail, .query = query.as<float>(),
                                         .weights = weights.as<float>(), .weights_scale = a.weights_scale,
                                         .pooled_keys = pooled_keys,
                                         .scratch = scratch.as<float>(), .scratch_floats = scratch_floats,
                                         .positions = positions.as<int32_t>(), .counts = counts.as<int32_t>()},
                       nullptr),
        "indexer_select");
  return kestrel::testing::IndexerSelection{.stride = stride, .positions = to_host<int32_t>(positions),
                                            .counts = to_host<int32_t>(counts)}
      .lists();
}

// Random queries and weights (of both signs) for T tokens from `start`; the GPU's lists must equal the CPU's, with
// and without the tail, whether the call runs as one launch or as launches of 3 tokens (a scratch too small for all
// of the call's scores).
void expect_cpu_selection(const IndexerShape& shape, const PooledKeys& keys, int64_t start, int64_t T, uint32_t seed) {
  const std::vector<float> query = random_values(static_cast<size_t>(T * shape.heads * shape.head_dim), seed);
  // The weights as weights_proj gives them, scaled by heads^-1/2 inside the selection (as the model calls it).
  const std::vector<float> weights = random_values(static_cast<size_t>(T * shape.heads), seed + 1);
  for (const bool tail : {true, false}) {
    const IndexerArgs args{.num_tokens = T, .start = start, .num_heads = shape.heads, .head_dim = shape.head_dim,
                           .kpool = kKpool, .topk_pools = shape.topk_pools, .select_tail = tail,
                           .query = query.data(), .weights = weights.data(),
                           .weights_scale = 1.0f / std::sqrt(static_cast<float>(shape.heads)),
                           .pooled_keys = &keys.rows};
    const std::vector<std::vector<int64_t>> expected = kestrel::testing::select_on_host(host(), args).lists();
    for (const int64_t group : {int64_t{0}, int64_t{3}}) {
      const std::vector<std::vector<int64_t>> got = gpu_select(args, keys.device.view, group);
      ASSERT_EQ(got.size(), expected.size());
      for (size_t t = 0; t < got.size(); ++t) {
        EXPECT_EQ(got[t], expected[t]) << "heads " << shape.heads << " pools " << keys.rows.size() << " position "
                                       << start + static_cast<int64_t>(t) << " tail " << tail << " group " << group;
      }
    }
  }
}

struct Step {
  int64_t start, num_tokens;
};

TEST(CudaDsaTest, IndexerSelectsAsCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t pools = 3000;  // 12000 tokens of context
  uint32_t seed = 30;
  for (const IndexerShape shape : {kNanoIndexer, kModelIndexer}) {
    const PooledKeys keys(pools, shape.head_dim, random_values(static_cast<size_t>(pools * shape.head_dim), ++seed));
    // Decode at 5000 (1250 pools visible) and past the last pool (all 3000, a 2-token tail); a 7-token prefill
    // whose tokens see 2997..2999 pools; early positions where every visible pool is kept (none at 0..2).
    for (const Step step : {Step{5000, 1}, Step{12001, 1}, Step{11990, 7}, Step{100, 7}, Step{0, 7}}) {
      expect_cpu_selection(shape, keys, step.start, step.num_tokens, seed += 2);
    }
  }
}

TEST(CudaDsaTest, IndexerBreaksTiesToLowerPools) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t pools = 3000;
  uint32_t seed = 50;
  // 37 distinct keys repeated (each score ~81 times, so the cut falls inside a tie), then one key for every pool.
  for (const int64_t distinct : {int64_t{37}, int64_t{1}}) {
    for (const IndexerShape shape : {kNanoIndexer, kModelIndexer}) {
      const std::vector<float> base = random_values(static_cast<size_t>(distinct * shape.head_dim), ++seed);
      std::vector<float> values(static_cast<size_t>(pools * shape.head_dim));
      for (int64_t p = 0; p < pools; ++p) {
        std::copy_n(base.begin() + (p % distinct) * shape.head_dim, shape.head_dim,
                    values.begin() + p * shape.head_dim);
      }
      const PooledKeys keys(pools, shape.head_dim, values);
      for (const Step step : {Step{12001, 1}, Step{11990, 7}, Step{5000, 1}}) {
        expect_cpu_selection(shape, keys, step.start, step.num_tokens, seed += 2);
      }
    }
  }
}

struct MlaShape {
  int64_t heads, qk_head_dim, v_head_dim, kv_lora_rank;
  DType dtype;  // of kv_b
};

// One attention call over a scattered cache on the GPU, with the CPU's output for it. The latent cache, the indexer's
// selection (the CPU's: pooled keys of random values, the model indexer's top 512 pools) and the query are random;
// kv_b is random in the shape's dtype.
struct AttentionCall {
  DeviceMlaWeights weights;
  DeviceRows latents;
  DeviceBuffer query, positions, counts, out;
  SparseMlaDeviceArgs args;  // everything but the scratch
  std::vector<float> expected;
};

AttentionCall attention_call(CpuBackend& cpu, const MlaShape& shape, const Step& step, uint32_t& seed,
                             CacheDtype latent_dtype = CacheDtype::float32) {
  const int64_t H = shape.heads, qk = shape.qk_head_dim, vd = shape.v_head_dim, rank = shape.kv_lora_rank;
  const std::vector<float> kv_b_values = random_values(static_cast<size_t>(H * (qk + vd) * rank), ++seed, 0.05f);
  std::vector<uint16_t> kv_b_bf16(kv_b_values.size());
  for (size_t i = 0; i < kv_b_values.size(); ++i) kv_b_bf16[i] = f32_to_bf16(kv_b_values[i]);
  const void* kv_b_data = shape.dtype == DType::bf16 ? static_cast<const void*>(kv_b_bf16.data())
                                                     : static_cast<const void*>(kv_b_values.data());
  const LinearWeight kv_b{.name = "self_attn.kv_b_proj.weight", .dtype = shape.dtype, .out_features = H * (qk + vd),
                          .in_features = rank, .data = static_cast<const std::byte*>(kv_b_data)};
  const int64_t T = step.num_tokens, tokens = step.start + T, pools = tokens / kKpool;
  ScatteredTable seq(blocks_for(tokens));
  RowBlockPool latent_pool(host(), RowFormat{.dtype = latent_dtype, .width = rank}, kBlockTokens);
  RowBlockPool pooled_pool(host(), kNanoIndexer.head_dim, kBlockTokens / kKpool);
  PagedRows latents(latent_pool, seq.table()), pooled(pooled_pool, seq.table());
  const std::vector<float> latent_values = random_values(static_cast<size_t>(tokens * rank), ++seed);
  cpu.write_rows(latents, latents.append_rows(tokens), latent_values.data(), tokens);
  append_rows(pooled, random_values(static_cast<size_t>(pools * kNanoIndexer.head_dim), ++seed));
  const std::vector<float> index_query =
      random_values(static_cast<size_t>(T * kNanoIndexer.heads * kNanoIndexer.head_dim), ++seed);
  const std::vector<float> index_weights = random_values(static_cast<size_t>(T * kNanoIndexer.heads), ++seed);
  const kestrel::testing::IndexerSelection selection = kestrel::testing::select_on_host(
      cpu, IndexerArgs{.num_tokens = T, .start = step.start, .num_heads = kNanoIndexer.heads,
                       .head_dim = kNanoIndexer.head_dim, .kpool = kKpool, .topk_pools = kModelIndexer.topk_pools,
                       .select_tail = step.start > 0, .query = index_query.data(), .weights = index_weights.data(),
                       .pooled_keys = &pooled});
  const std::vector<float> query = random_values(static_cast<size_t>(T * H * qk), ++seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
  AttentionCall call{.weights = DeviceMlaWeights::upload(kv_b, H, qk, vd),
                     .latents = to_device_rows(latent_pool, seq.table(), tokens),
                     .query = to_device(query),
                     .positions = to_device(selection.positions),
                     .counts = to_device(selection.counts),
                     .out = DeviceBuffer(static_cast<size_t>(T * H * vd) * sizeof(float)),
                     .args = {},
                     .expected = std::vector<float>(static_cast<size_t>(T * H * vd))};
  cpu.sparse_mla_attention(SparseMlaArgs{.num_tokens = T, .num_heads = H, .qk_head_dim = qk, .v_head_dim = vd,
                                         .kv_lora_rank = rank, .scale = scale, .query = query.data(), .kv_b = &kv_b,
                                         .latents = &latents, .positions = selection.positions.data(),
                                         .counts = selection.counts.data(), .positions_stride = selection.stride,
                                         .out = call.expected.data()});
  call.args = SparseMlaDeviceArgs{.num_tokens = T, .num_heads = H, .qk_head_dim = qk, .v_head_dim = vd,
                                  .kv_lora_rank = rank, .scale = scale, .query = call.query.as<float>(),
                                  .w_uk = call.weights.w_uk.data(), .w_uv = call.weights.w_uv.data(),
                                  .weights_bf16 = call.weights.bf16,
                                  .latents = call.latents.view, .positions = call.positions.as<int32_t>(),
                                  .counts = call.counts.as<int32_t>(), .positions_stride = selection.stride,
                                  .out = call.out.as<float>()};
  return call;
}

TEST(CudaDsaTest, SparseMlaAttentionMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  uint32_t seed = 70;
  // The nano model's MLA, GLM-5.3-Flash's (64 heads, 256 + 256, rank 512), an odd head count (a warp of the heads
  // kernel with one head), and a rank the heads kernel is not compiled for (96: a block per token and head).
  for (const MlaShape shape : {MlaShape{4, 64, 64, 128, DType::bf16}, MlaShape{64, 256, 256, 512, DType::f32},
                               MlaShape{5, 32, 48, 64, DType::f32}, MlaShape{3, 32, 32, 96, DType::f32}}) {
    // Positions 0..4 without the tail (the first three attend to nothing), then positions 5997..5999 of a 6000-token
    // context: 512 of 1500 pools and tails of 2, 3 and 0 positions (up to 2051 positions), then 16 tokens at
    // 100..115, then a prefill chunk of 300 tokens at 5600..5899. Split into parts (sparse_mla_splits) but for the
    // chunk, which fills the GPU as it is.
    for (const Step step : {Step{0, 5}, Step{5997, 3}, Step{100, 16}, Step{5600, 300}}) {
      AttentionCall call = attention_call(cpu, shape, step, seed);
      const int64_t T = step.num_tokens;
      const int64_t scratch_floats =
          sparse_mla_scratch_floats(T, shape.heads, call.args.positions_stride, shape.kv_lora_rank);
      EXPECT_EQ(scratch_floats == 0, T == 300) << "heads " << shape.heads << " tokens " << T;
      DeviceBuffer scratch(static_cast<size_t>(std::max<int64_t>(scratch_floats, 1)) * sizeof(float));
      call.args.scratch = scratch.as<float>();
      check(sparse_mla_attention(call.args, nullptr), "sparse_mla_attention");
      EXPECT_LT(relative_difference(to_host<float>(call.out), call.expected), kAttentionTolerance)
          << "heads " << shape.heads << " rank " << shape.kv_lora_rank << " start " << step.start;
    }
  }
}

// Latents cached in bf16 and fp8 (--kv-cache-dtype): each attention kernel decodes the rows as the CPU does, so it
// matches the CPU's attention over the same rows as closely as over float32 ones: the heads kernel split (a decode
// step deep in a 6000-token context) and unsplit (16 tokens), the per-pair kernel (rank 96), and the tensor cores
// (a 300-token prefill chunk at GLM-5.3-Flash's shape).
TEST(CudaDsaTest, CodedLatentsAttendAsOnTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Gemm gemm;
  CpuBackend cpu;
  uint32_t seed = 270;
  for (const CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3}) {
    for (const MlaShape shape : {MlaShape{4, 64, 64, 128, DType::bf16}, MlaShape{64, 256, 256, 512, DType::f32},
                                 MlaShape{3, 32, 32, 96, DType::f32}}) {
      for (const Step step : {Step{5997, 3}, Step{100, 16}}) {
        AttentionCall call = attention_call(cpu, shape, step, seed, dtype);
        const int64_t scratch_floats = sparse_mla_scratch_floats(step.num_tokens, shape.heads,
                                                                 call.args.positions_stride, shape.kv_lora_rank);
        DeviceBuffer scratch(static_cast<size_t>(std::max<int64_t>(scratch_floats, 1)) * sizeof(float));
        call.args.scratch = scratch.as<float>();
        check(sparse_mla_attention(call.args, nullptr), "sparse_mla_attention");
        EXPECT_LT(relative_difference(to_host<float>(call.out), call.expected), kAttentionTolerance)
            << cache_dtype_name(dtype) << " heads " << shape.heads << " rank " << shape.kv_lora_rank << " start "
            << step.start;
      }
    }
    if (!gemm.available()) continue;
    const MlaShape model{64, 256, 256, 512, DType::bf16};
    const AttentionCall call = attention_call(cpu, model, Step{5600, 300}, seed, dtype);
    DeviceBuffer scratch(sparse_mla_prefill_scratch_bytes(128, model.heads, model.qk_head_dim, model.kv_lora_rank));
    sparse_mla_prefill(call.args, call.weights, gemm, scratch.data(), 128, nullptr);
    const double difference = relative_difference(to_host<float>(call.out), call.expected);
    std::printf("tensor-core prefill over %s latents: %.3g\n", std::string(cache_dtype_name(dtype)).c_str(),
                difference);
    EXPECT_LT(difference, kMmaAttentionTolerance) << cache_dtype_name(dtype);
  }
}

// The tensor-core prefill's block at GLM-5.3-Flash's shape (64 heads, rank 512, 2,051 positions a token) takes
// 192 KiB of shared memory: where a block may not have that, the per-head kernels take the call. No GPU needed.
TEST(CudaDsaTest, TensorCorePrefillNeedsItsSharedMemory) {
  EXPECT_TRUE(sparse_mla_mma_supported(300, 64, 2051, 512, 227 * 1024));   // sm_90
  EXPECT_FALSE(sparse_mla_mma_supported(300, 64, 2051, 512, 163 * 1024));  // sm_80
  EXPECT_FALSE(sparse_mla_mma_supported(300, 64, 2051, 512, 99 * 1024));   // sm_86, sm_89, the 12.x parts
  EXPECT_TRUE(sparse_mla_mma_supported(300, 4, 2051, 128, 99 * 1024));     // a smaller rank fits there (74 KiB)
  EXPECT_FALSE(sparse_mla_mma_supported(300, 4, 2051, 96, 227 * 1024));    // a rank the kernel is not compiled for
}

// Prefill-sized calls on the tensor cores (mla_prefill.h): fp16 q̂, latents, probabilities and ô against the float32
// CPU, in groups of 128 tokens (so a 300-token call runs as 128, 128 and 44), at GLM-5.3-Flash's shape with a bf16
// kv_b, the nano model's, and 5 heads at rank 64 (one block's 64 rows mostly empty); a chunk deep in a 5900-token
// context (up to 2051 positions each) and one from position 0 without the tail (tokens 0..2 attend to nothing).
TEST(CudaDsaTest, TensorCorePrefillMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Gemm gemm;
  if (!gemm.available()) GTEST_SKIP() << "no cuBLASLt";
  CpuBackend cpu;
  uint32_t seed = 170;
  constexpr int64_t kGroup = 128;
  for (const MlaShape shape : {MlaShape{64, 256, 256, 512, DType::bf16}, MlaShape{4, 64, 64, 128, DType::bf16},
                               MlaShape{5, 32, 48, 64, DType::f32}}) {
    for (const Step step : {Step{5600, 300}, Step{0, 300}}) {
      const AttentionCall call = attention_call(cpu, shape, step, seed);
      ASSERT_TRUE(sparse_mla_mma_supported(step.num_tokens, shape.heads, call.args.positions_stride,
                                           shape.kv_lora_rank, max_shared_optin()));
      DeviceBuffer scratch(
          sparse_mla_prefill_scratch_bytes(kGroup, shape.heads, shape.qk_head_dim, shape.kv_lora_rank));
      sparse_mla_prefill(call.args, call.weights, gemm, scratch.data(), kGroup, nullptr);
      const double difference = relative_difference(to_host<float>(call.out), call.expected);
      std::printf("tensor-core prefill, heads %lld rank %lld start %lld: %.3g\n", static_cast<long long>(shape.heads),
                  static_cast<long long>(shape.kv_lora_rank), static_cast<long long>(step.start), difference);
      EXPECT_LT(difference, kMmaAttentionTolerance)
          << "heads " << shape.heads << " rank " << shape.kv_lora_rank << " start " << step.start;
    }
  }
}

// A decode step's attention as one pass (CudaBackend::sparse_mla_attention_steps: each token reads its own
// sequence's block table in a pool the sequences share, their blocks interleaved) against the CPU's attention of
// each sequence on its own, at GLM-5.3-Flash's shape, for 3 sequences and for 70 (two launches); the latents float32,
// and bf16 and fp8 (written through CudaBackend::write_rows and the CPU's, each encoding its own copy).
TEST(CudaDsaTest, AttentionStepMatchesEachSequenceOnItsOwn) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t H = 64, qk = 256, vd = 256, rank = 512;
  CudaBackend gpu(0);
  const std::vector<float> kv_b_values = random_values(static_cast<size_t>(H * (qk + vd) * rank), 90, 0.05f);
  const LinearWeight kv_b{.name = "self_attn.kv_b_proj.weight", .dtype = DType::f32, .out_features = H * (qk + vd),
                          .in_features = rank, .data = reinterpret_cast<const std::byte*>(kv_b_values.data())};
  LinearWeight placed = kv_b;
  gpu.place_attention_kv_b(placed, H, qk, vd);
  uint32_t seed = 91;
  const std::vector<std::pair<CacheDtype, int64_t>> cases = {
      {CacheDtype::float32, 3}, {CacheDtype::float32, 70}, {CacheDtype::bf16, 70}, {CacheDtype::fp8_e4m3, 70}};
  for (const auto& [dtype, S] : cases) {
    GrowingBlockSource cpu_source, gpu_source;
    const RowFormat format{.dtype = dtype, .width = rank};
    RowBlockPool cpu_pool(host(), format, kBlockTokens), gpu_pool(gpu, format, kBlockTokens);
    std::vector<std::unique_ptr<BlockTable>> cpu_tables, gpu_tables;
    std::vector<std::unique_ptr<PagedRows>> cpu_rows, gpu_rows;
    std::vector<int64_t> lengths;
    for (int64_t s = 0; s < S; ++s) {
      lengths.push_back(1 + (37 * s + 11) % 150);
      cpu_tables.push_back(std::make_unique<BlockTable>(cpu_source, host()));
      gpu_tables.push_back(std::make_unique<BlockTable>(gpu_source, gpu));
      cpu_rows.push_back(std::make_unique<PagedRows>(cpu_pool, *cpu_tables.back()));
      gpu_rows.push_back(std::make_unique<PagedRows>(gpu_pool, *gpu_tables.back()));
    }
    // Rows appended round-robin, so that each sequence's blocks lie between the others', then each sequence's
    // written in one call (encoded there for bf16 and fp8).
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    for (int64_t r = 0; r < longest; ++r) {
      for (int64_t s = 0; s < S; ++s) {
        if (r >= lengths[static_cast<size_t>(s)]) continue;
        cpu_rows[static_cast<size_t>(s)]->append_rows(1);
        gpu_rows[static_cast<size_t>(s)]->append_rows(1);
      }
    }
    // The rows uploaded first: a cudaMemcpy from pageable memory may return before its DMA lands, and the writes
    // run on the backend's own stream, which does not wait for the legacy one.
    std::vector<DeviceBuffer> uploaded;  // alive until the writes have run
    for (int64_t s = 0; s < S; ++s) {
      const int64_t length = lengths[static_cast<size_t>(s)];
      const std::vector<float> values = random_values(static_cast<size_t>(length * rank), ++seed);
      host().write_rows(*cpu_rows[static_cast<size_t>(s)], 0, values.data(), length);
      uploaded.push_back(to_device(values));
    }
    check(cudaDeviceSynchronize(), "uploads");
    for (int64_t s = 0; s < S; ++s) {
      gpu.write_rows(*gpu_rows[static_cast<size_t>(s)], 0, uploaded[static_cast<size_t>(s)].as<float>(),
                     lengths[static_cast<size_t>(s)]);
    }
    // Each token attends to every second position of its sequence, then its last.
    const int64_t stride = longest;
    std::vector<int32_t> positions(static_cast<size_t>(S * stride), -1), counts(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) {
      int32_t n = 0;
      const int64_t length = lengths[static_cast<size_t>(s)];
      for (int64_t p = 0; p < length; ++p) {
        if (p % 2 == 0 || p + 1 == length) positions[static_cast<size_t>(s * stride + n++)] = static_cast<int32_t>(p);
      }
      counts[static_cast<size_t>(s)] = n;
    }
    const std::vector<float> query = random_values(static_cast<size_t>(S * H * qk), ++seed);
    const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
    const auto args = [&](const float* q, const int32_t* pos, const int32_t* cnt, float* out) {
      return SparseMlaArgs{.num_tokens = S, .num_heads = H, .qk_head_dim = qk, .v_head_dim = vd,
                           .kv_lora_rank = rank, .scale = scale, .query = q, .kv_b = &kv_b, .latents = nullptr,
                           .positions = pos, .counts = cnt, .positions_stride = stride, .out = out};
    };
    std::vector<float> expected(static_cast<size_t>(S * H * vd));
    std::vector<const PagedRows*> cpu_latents, gpu_latents;
    for (int64_t s = 0; s < S; ++s) {
      cpu_latents.push_back(cpu_rows[static_cast<size_t>(s)].get());
      gpu_latents.push_back(gpu_rows[static_cast<size_t>(s)].get());
    }
    host().sparse_mla_attention_steps(args(query.data(), positions.data(), counts.data(), expected.data()),
                                      cpu_latents);
    const DeviceBuffer query_dev = to_device(query), positions_dev = to_device(positions),
                       counts_dev = to_device(counts);
    DeviceBuffer out(expected.size() * sizeof(float));
    SparseMlaArgs gpu_args = args(query_dev.as<float>(), positions_dev.as<int32_t>(), counts_dev.as<int32_t>(),
                                  out.as<float>());
    gpu_args.kv_b = &placed;
    gpu.sparse_mla_attention_steps(gpu_args, gpu_latents);
    gpu.synchronize();
    EXPECT_LT(relative_difference(to_host<float>(out), expected), kAttentionTolerance)
        << cache_dtype_name(dtype) << " sequences " << S;
  }
}

TEST(CudaDsaTest, BadShapesAreRefused) {
  // Checked before any CUDA call: with or without a GPU.
  EXPECT_EQ(indexer_max_positions(512, 4), 2051);
  EXPECT_EQ(indexer_scratch_floats(7, 3000), 21000);
  const DevicePagedRows empty{.block_rows = 16, .row_width = 128, .row_bytes = 512};
  EXPECT_EQ(kpool_compress(empty, empty, nullptr, 0, 1, 4, nullptr, nullptr), cudaErrorInvalidValue);  // uncached
  IndexerDeviceArgs indexer{.num_tokens = 1, .start = 0, .num_heads = 32, .head_dim = 64, .kpool = 4,
                            .topk_pools = 512, .pooled_keys = empty};
  EXPECT_EQ(indexer_select(indexer, nullptr), cudaErrorInvalidValue);  // keys 128 wide, head_dim 64
  indexer.head_dim = 128;
  indexer.kpool = 0;
  EXPECT_EQ(indexer_select(indexer, nullptr), cudaErrorInvalidValue);
  const DevicePagedRows three_pools{.pool = reinterpret_cast<const float*>(16),
                                    .block_ids = reinterpret_cast<const int32_t*>(16), .block_rows = 16,
                                    .row_width = 128, .num_rows = 3, .row_bytes = 512};  // refused before any launch
  indexer = IndexerDeviceArgs{.num_tokens = 2, .start = 12, .num_heads = 32, .head_dim = 128, .kpool = 4,
                              .topk_pools = 512, .pooled_keys = three_pools, .scratch_floats = 2};
  EXPECT_EQ(indexer_select(indexer, nullptr), cudaErrorInvalidValue);  // not even one token's 3 scores fit
  const SparseMlaDeviceArgs mla{.num_tokens = 1, .num_heads = 64, .qk_head_dim = 256, .v_head_dim = 256,
                                .kv_lora_rank = 512, .latents = empty};
  EXPECT_EQ(sparse_mla_attention(mla, nullptr), cudaErrorInvalidValue);  // latents 128 wide, rank 512
  // fp8 latents whose row size or scale offset is not their RowFormat's; the indexer's keys in fp8.
  const RowFormat fp8{.dtype = CacheDtype::fp8_e4m3, .width = 512};
  DevicePagedRows fp8_rows = device_paged_rows(three_pools.pool, three_pools.block_ids, 16, 3, fp8);
  SparseMlaDeviceArgs coded = mla;
  coded.latents = fp8_rows;
  coded.latents.row_bytes = 512;
  EXPECT_EQ(sparse_mla_attention(coded, nullptr), cudaErrorInvalidValue);
  coded.latents = fp8_rows;
  coded.latents.scale_offset = 508;
  EXPECT_EQ(sparse_mla_attention(coded, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(write_paged_rows(coded.latents, 0, nullptr, 1, nullptr), cudaErrorInvalidValue);
  const DevicePagedRows fp8_keys = device_paged_rows(three_pools.pool, three_pools.block_ids, 16, 3,
                                                     RowFormat{.dtype = CacheDtype::fp8_e4m3, .width = 128});
  EXPECT_EQ(kpool_compress(fp8_keys, fp8_keys, nullptr, 0, 0, 4, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(sparse_mla_splits(1, 64, 2051), 33);   // a decode step: 4 blocks of 16 heads, one part per 64 positions
  EXPECT_EQ(sparse_mla_splits(16, 64, 2051), 4);   // 64 blocks of 16 heads a part
  EXPECT_EQ(sparse_mla_splits(2048, 64, 2051), 1);
  EXPECT_EQ(sparse_mla_splits(1, 4, 2051), 33);    // at most one part per 64 positions
  const LinearWeight kv_b{.name = "kv_b", .dtype = DType::f32, .out_features = 10, .in_features = 4,
                          .data = reinterpret_cast<const std::byte*>(&mla)};
  EXPECT_THROW(DeviceMlaWeights::upload(kv_b, 2, 3, 3), Error);  // 10 rows, not 2 x (3 + 3)
}

}  // namespace
}  // namespace kestrel::cuda
