// The CUDA backend: the Backend interface over the kernels of this directory, on one GPU and one stream. Every op is
// queued on the stream and returns at once; copy_to_host is the only point the host waits. Memory for activations,
// caches and states comes from the device's stream-ordered pool (cudaMallocAsync, kept cached), weights are copied
// to the GPU at placement in their on-disk format (EXL3 trellises, bf16, block-fp8), and a model's routed experts
// become one DeviceExperts when they are EXL3 of one format (the fused path, for calls of up to 64 tokens: decode),
// else a DeviceLinear each. Longer calls (prefill) and other experts group their tokens by expert, which reads the
// routing on the host once per MoE layer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/device_runtime.h"
#include "backend/cuda/dsa_kernels.h"

namespace kestrel::cuda {

class CudaBackend final : public Backend {
public:
  // Uses device `ordinal` (throws Error when there is none).
  explicit CudaBackend(int ordinal = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  const DeviceInfo& device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  float* allocate_floats(size_t count) override;
  void free_floats(float* data) override;
  void fill(float* data, int64_t count, float value) override;
  void copy_to_backend(void* dst, const void* host, size_t bytes) override;
  void copy_to_host(void* host, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  std::span<const float> read_back(const float* src, size_t count) override;
  void draw_tokens(float* logits, int64_t vocab, std::span<const TokenDraw> draws, std::span<int32_t> tokens) override;
  void synchronize() override;
  std::optional<DeviceMemory> device_memory() override;

  void place(LinearWeight& weight) override;
  void place(WeightVector& vector) override;
  void place_attention_kv_b(LinearWeight& kv_b, int64_t num_heads, int64_t qk_head_dim, int64_t v_head_dim) override;
  std::shared_ptr<const PlacedWeight> place_experts(const std::vector<ExpertWeights>& experts) override;

  void linear(const float* x, int64_t num_tokens, const LinearWeight& weight, float* y) override;
  void linears(const float* x, int64_t num_tokens, std::span<const LinearWeight* const> weights,
               std::span<float* const> ys) override;
  void swiglu_linear(const float* gate, const float* up, int64_t num_tokens, float limit, const LinearWeight& weight,
                     float* hidden, float* y) override;
  void embed(const int32_t* ids, int64_t num_tokens, const LinearWeight& table, float* out) override;
  void rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, float eps, float* y) override;
  void layer_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias, float eps,
                  float* y) override;
  void mhc_pre(const MhcShape& shape, const MhcWeights& weights, const float* streams, float* post, float* comb,
               float* collapsed) override;
  void mhc_post(const MhcShape& shape, const float* post, const float* comb, const float* block_out,
                float* streams) override;
  void mhc_site(const MhcShape& shape, const MhcPendingPost* pending, const MhcWeights& weights,
                const float* norm_weight, float* streams, float* post, float* comb, float* collapsed,
                float* normed) override;
  void causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel, const float* weight,
                        float* conv_state, float* y) override;
  void kda_chunked(const KdaArgs& args, int64_t chunk_size) override;
  void kda_recurrent(const KdaArgs& args) override;
  void kda_decode_steps(const KdaDecodeArgs& args, std::span<float* const> conv_states,
                        std::span<float* const> states) override;
  void indexer_select(const IndexerArgs& args) override;
  void sparse_mla_attention(const SparseMlaArgs& args) override;
  void sparse_mla_attention_steps(const SparseMlaArgs& args, std::span<const PagedRows* const> latents) override;
  void write_rows(PagedRows& rows, int64_t first_row, const float* src, int64_t count) override;
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

  // Bytes of weights placed on the GPU so far (shared copies counted once).
  size_t placed_bytes() const { return placed_bytes_; }

private:
  const DeviceLinear& placed_linear(const LinearWeight& weight) const;
  // The MoE with tokens grouped by expert on the host: each expert's linears over its tokens.
  void moe_by_expert(const MoeArgs& args, const std::vector<DeviceLinear>& linears);
  // The attention launchers' arguments for `latents`' pool (and, but in a decode step, block table), with scratch.
  cuda::SparseMlaDeviceArgs attention_args(const SparseMlaArgs& args, const PagedRows& latents,
                                           int64_t scratch_floats);

  DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  // Temporaries of the ops, each op's own (growing one synchronises the device): the linears' k-split partials,
  // the MoE's slot buffers, and two general arrays.
  Scratch linear_scratch_, moe_scratch_, scratch_a_, scratch_b_;
  DeviceBuffer int_scratch_;  // the by-expert MoE path's token and slot lists
  PinnedBuffer read_back_;    // what read_back returns (the logits each step)
  Scratch draw_scratch_;      // draw_tokens' tokens and sort arrays
  PinnedBuffer drawn_;        // draw_tokens' tokens on their way to the host
  Gemm gemm_;                 // prefill-sized linears on the tensor cores (cuBLASLt, when it loads)
  // Matrices placed once per checkpoint tensor (a tied head is the embedding's copy).
  std::map<const std::byte*, std::weak_ptr<const PlacedWeight>> placed_by_data_;
  size_t placed_bytes_ = 0;
};

}  // namespace kestrel::cuda
