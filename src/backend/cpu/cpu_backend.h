// The CPU backend: the reference implementation of every op, float32 throughout, multi-threaded with the global
// ThreadPool. Each op family lives in its own file (memory.cpp, linear.cpp, norm.cpp, mhc.cpp, kda.cpp, dsa.cpp,
// moe.cpp).
// Numeric policy: float32 storage and arithmetic as in transformers' float32 path; reductions of one output element
// run in a fixed order inside one thread, so results do not depend on the thread count.
#pragma once

#include "backend/backend.h"

namespace kestrel {

class CpuBackend final : public Backend {
public:
  std::string_view name() const override { return "cpu"; }

  float* allocate_floats(size_t count) override;
  void free_floats(float* data) override;
  void fill(float* data, int64_t count, float value) override;
  void copy_to_backend(void* dst, const void* host, size_t bytes) override;
  void copy_to_host(void* host, const void* src, size_t bytes) override;
  std::span<const float> read_back(const float* src, size_t count) override { return {src, count}; }
  void copy(void* dst, const void* src, size_t bytes) override;
  std::optional<DeviceMemory> device_memory() override { return std::nullopt; }

  void place(LinearWeight& weight) override;
  void place(WeightVector& vector) override;
  void place_attention_kv_b(LinearWeight& kv_b, int64_t num_heads, int64_t qk_head_dim, int64_t v_head_dim) override;
  std::shared_ptr<const PlacedWeight> place_experts(const std::vector<ExpertWeights>& experts) override;

  void linear(const float* x, int64_t num_tokens, const LinearWeight& weight, float* y) override;
  void embed(const int32_t* ids, int64_t num_tokens, const LinearWeight& table, float* out) override;
  void rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, float eps, float* y) override;
  void layer_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias, float eps,
                  float* y) override;
  void mhc_pre(const MhcShape& shape, const MhcWeights& weights, const float* streams, float* post, float* comb,
               float* collapsed) override;
  void mhc_post(const MhcShape& shape, const float* post, const float* comb, const float* block_out,
                float* streams) override;
  void causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel, const float* weight,
                        float* conv_state, float* y) override;
  void kda_chunked(const KdaArgs& args, int64_t chunk_size) override;
  void kda_recurrent(const KdaArgs& args) override;
  void indexer_select(const IndexerArgs& args) override;
  void sparse_mla_attention(const SparseMlaArgs& args) override;
  void kpool_compress(const PagedRows& keys, const PagedRows& gates, const float* ape, int64_t first_pool,
                      int64_t num_pools, int64_t kpool, float* pooled) override;
  void route_experts(const RouterArgs& args) override;
  void moe_experts(const MoeArgs& args) override;
  void kda_gate(const float* f, int64_t num_tokens, int64_t num_heads, int64_t head_dim, const float* a_log,
                const float* dt_bias, const float* lower_bound, float* g) override;
  void gated_rms_norm(const float* x, const float* gate, int64_t rows, int64_t n, const float* weight, float eps,
                      float* y) override;
  void sigmoid(float* x, int64_t n) override;
  void add(const float* x, int64_t n, float* y) override;
  void stream_mean(const float* streams, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* out) override;
  void stream_expand(const float* x, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* streams) override;
  void clamped_swiglu(const float* gate, const float* up, int64_t rows, int64_t n, float limit, float* out) override;

 private:
  // linear with the input taken as `input` says rather than as product_input() does (the mHC mixes: float32's).
  void linear_taking(const float* x, int64_t num_tokens, const LinearWeight& weight, ProductInput input, float* y);
};

}  // namespace kestrel
