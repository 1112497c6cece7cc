#include "model/sequence_state.h"

#include <algorithm>
#include <array>

#include "backend/backend.h"
#include "base/error.h"

namespace kestrel {

namespace {

int64_t conv_floats(const Glm5NextConfig& c) {
  return 3 * (c.linear_conv_kernel_dim - 1) * c.linear_num_heads * c.linear_head_dim;
}
int64_t recurrent_floats(const Glm5NextConfig& c) {
  return c.linear_num_heads * c.linear_head_dim * c.linear_head_dim;
}

}  // namespace

CachePools::CachePools(const Glm5NextConfig& c, Backend& backend, CacheDtype latent_dtype)
    : backend_(backend),
      block_tokens_(c.index_kpool * std::max<int64_t>(1, 16 / c.index_kpool)),
      own_source_(std::make_unique<GrowingBlockSource>()),
      source_(own_source_.get()) {
  add_layers(c, 0, latent_dtype);
}

CachePools::CachePools(const Glm5NextConfig& c, Backend& backend, int64_t block_tokens, BlockSource& source,
                       int64_t num_blocks, CacheDtype latent_dtype)
    : backend_(backend), block_tokens_(block_tokens), source_(&source) {
  require(block_tokens > 0 && block_tokens % c.index_kpool == 0,
          "cache block size {} must be a positive multiple of index_kpool ({})", block_tokens, c.index_kpool);
  add_layers(c, num_blocks, latent_dtype);
}

namespace {

// The row format and rows per block of each pool kind, in CachePools' member order.
struct PoolShape {
  RowFormat format;
  int64_t rows;
};
std::array<PoolShape, 4> pool_shapes(const Glm5NextConfig& c, int64_t block_tokens, CacheDtype latent_dtype) {
  const RowFormat index_row{.width = c.index_head_dim};
  return {PoolShape{RowFormat{.dtype = latent_dtype, .width = c.kv_lora_rank}, block_tokens},
          PoolShape{index_row, block_tokens}, PoolShape{index_row, block_tokens},
          PoolShape{index_row, block_tokens / c.index_kpool}};
}

}  // namespace

void CachePools::add_layers(const Glm5NextConfig& c, int64_t num_blocks, CacheDtype latent_dtype) {
  const std::array<PoolShape, 4> shapes = pool_shapes(c, block_tokens_, latent_dtype);
  std::array<std::vector<std::unique_ptr<RowBlockPool>>*, 4> families = {&latents, &index_keys, &index_gates,
                                                                         &pooled_keys};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool dsa = c.layer_types[static_cast<size_t>(i)] == LayerType::sparse_attention;
    for (size_t kind = 0; kind < shapes.size(); ++kind) {
      families[kind]->push_back(
          dsa ? std::make_unique<RowBlockPool>(backend_, shapes[kind].format, shapes[kind].rows, num_blocks) : nullptr);
    }
  }
}

size_t CachePools::block_bytes(const Glm5NextConfig& c, int64_t block_tokens, CacheDtype latent_dtype) {
  int64_t bytes = 0;
  for (const PoolShape& shape : pool_shapes(c, block_tokens, latent_dtype)) {
    bytes += shape.format.row_bytes() * shape.rows;
  }
  const auto layers = std::count(c.layer_types.begin(), c.layer_types.end(), LayerType::sparse_attention);
  return static_cast<size_t>(layers * bytes);
}

SequenceState::SequenceState(const Glm5NextConfig& c, CachePools& pools)
    : backend_(pools.backend()), block_tokens_(pools.block_tokens()), kpool_(c.index_kpool),
      kda_state_size_(kda_state_size(c)), blocks_(pools.source(), pools.backend()) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto layer = static_cast<size_t>(i);
    full_indexer_.push_back(c.indexer_types[layer] == IndexerType::full);
    if (c.layer_types[layer] == LayerType::linear_attention) {
      kda_.push_back(KdaLayerState{.conv = BackendArray(backend_, static_cast<size_t>(conv_floats(c))),
                                   .recurrent = BackendArray(backend_, static_cast<size_t>(recurrent_floats(c)))});
      mla_.push_back(nullptr);
    } else {
      for (const auto* family : {&pools.latents, &pools.index_keys, &pools.index_gates, &pools.pooled_keys}) {
        pools_.push_back((*family)[layer].get());
      }
      kda_.emplace_back();
      mla_.push_back(std::make_unique<MlaLayerState>(
          MlaLayerState{.latents = PagedRows(*pools.latents[layer], blocks_),
                        .index_keys = PagedRows(*pools.index_keys[layer], blocks_),
                        .index_gates = PagedRows(*pools.index_gates[layer], blocks_),
                        .pooled_keys = PagedRows(*pools.pooled_keys[layer], blocks_)}));
    }
  }
  zero_kda_state();
}

void SequenceState::reserve(int64_t num_tokens) {
  blocks_.grow_to((num_tokens + block_tokens_ - 1) / block_tokens_);
  if (blocks_.size() == 0) return;
  const int32_t largest = *std::max_element(blocks_.ids().begin(), blocks_.ids().end());
  for (RowBlockPool* pool : pools_) pool->reserve_blocks(largest + int64_t{1});
}

void SequenceState::zero_kda_state() {
  for (KdaLayerState& kda : kda_) {
    backend_.fill(kda.conv.data(), static_cast<int64_t>(kda.conv.size()), 0.0f);
    backend_.fill(kda.recurrent.data(), static_cast<int64_t>(kda.recurrent.size()), 0.0f);
  }
}

void SequenceState::resume_on(std::span<const int32_t> blocks) {
  require(num_tokens_ == 0 && blocks_.size() == 0, "a sequence resumes on a shared prefix only when empty");
  blocks_.share(blocks);
  num_tokens_ = static_cast<int64_t>(blocks.size()) * block_tokens_;
  for (size_t layer = 0; layer < mla_.size(); ++layer) {
    if (!mla_[layer]) continue;
    MlaLayerState& mla = *mla_[layer];
    const bool indexed = full_indexer_[layer];
    mla.latents.resize(num_tokens_);
    mla.index_keys.resize(indexed ? num_tokens_ : 0);
    mla.index_gates.resize(indexed ? num_tokens_ : 0);
    mla.pooled_keys.resize(indexed ? num_tokens_ / kpool_ : 0);
  }
}

void SequenceState::reset() {
  num_tokens_ = 0;
  blocks_.clear();
  for (auto& mla : mla_) {
    if (!mla) continue;
    mla->latents.resize(0);
    mla->index_keys.resize(0);
    mla->index_gates.resize(0);
    mla->pooled_keys.resize(0);
  }
  zero_kda_state();
}

int64_t SequenceState::kda_state_size(const Glm5NextConfig& c) {
  return c.num_linear_attention_layers() * (conv_floats(c) + recurrent_floats(c));
}

void SequenceState::save_kda_state(std::span<float> out) const {
  require(static_cast<int64_t>(out.size()) == kda_state_size_, "KDA snapshot has {} floats, the state {}",
          out.size(), kda_state_size_);
  float* cursor = out.data();
  for (const KdaLayerState& kda : kda_) {
    for (const BackendArray* part : {&kda.conv, &kda.recurrent}) {
      backend_.copy_to_host(cursor, part->data(), part->size() * sizeof(float));
      cursor += part->size();
    }
  }
}

void SequenceState::load_kda_state(std::span<const float> in) {
  require(static_cast<int64_t>(in.size()) == kda_state_size_, "KDA snapshot has {} floats, the state {}",
          in.size(), kda_state_size_);
  const float* cursor = in.data();
  for (KdaLayerState& kda : kda_) {
    for (BackendArray* part : {&kda.conv, &kda.recurrent}) {
      backend_.copy_to_backend(part->data(), cursor, part->size() * sizeof(float));
      cursor += part->size();
    }
  }
}

}  // namespace kestrel
