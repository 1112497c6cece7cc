#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "backend/cuda/device_experts.h"
#include "backend/cuda/dsa_kernels.h"
#include "backend/cuda/dynamic_shared.cuh"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/kda_kernels.h"
#include "backend/cuda/mhc_kernels.h"
#include "backend/cuda/mla_prefill.h"
#include "backend/cuda/mla_weights.h"
#include "backend/cuda/norm_kernels.h"
#include "backend/cuda/router_kernels.h"
#include "backend/cuda/sampling_kernels.h"
#include "base/error.h"
#include "base/log.h"

namespace kestrel::cuda {

namespace {

struct PlacedLinear final : PlacedWeight {
  explicit PlacedLinear(DeviceLinear device) : linear(std::move(device)) {}
  DeviceLinear linear;
};

struct PlacedMla final : PlacedWeight {
  explicit PlacedMla(DeviceMlaWeights device) : weights(std::move(device)) {}
  DeviceMlaWeights weights;
};

const DeviceMlaWeights& placed_mla(const LinearWeight& kv_b) {
  const auto* placed = dynamic_cast<const PlacedMla*>(kv_b.placed.get());
  require(placed != nullptr, "weight '{}' was not placed on the GPU for attention", kv_b.name);
  return placed->weights;
}

// Routed experts: one fused DeviceExperts, or a DeviceLinear per matrix (gate, up, down of expert 0, then 1, ...).
struct PlacedExperts final : PlacedWeight {
  std::optional<DeviceExperts> fused;
  std::vector<DeviceLinear> linears;
};

// Above this many tokens an MoE call groups its tokens by expert (CudaBackend::moe_experts). At 64 tokens of
// GLM-5.3-Flash's layer the fused path takes 3.7 ms and the grouped one 11.3 ms (H100, docs/benchmarks/cuda_linear.md).
constexpr int64_t kFusedMoeMaxTokens = 64;
// Scratch for the indexer's scores ([tokens, pools] floats: a 2048-token chunk at 1M tokens of context would take
// 2 GiB); a call runs in groups of tokens whose scores fit (cuda::indexer_select).
constexpr int64_t kIndexerScratchFloats = int64_t{64} << 20;  // 256 MiB

DevicePagedRows device_rows(const PagedRows& rows) {
  return device_paged_rows(rows.pool().bytes(), rows.table().backend_ids(), rows.pool().block_rows(), rows.size(),
                           rows.format());
}

// Whether every expert matrix is EXL3 and each projection has one shape, bitrate and codebook: what DeviceExperts
// takes.
bool one_exl3_format(const std::vector<ExpertWeights>& experts) {
  const auto same = [](const LinearWeight& a, const LinearWeight& b) {
    return a.exl3 && b.exl3 && a.exl3->bits == b.exl3->bits && a.exl3->codebook == b.exl3->codebook &&
           a.out_features == b.out_features && a.in_features == b.in_features;
  };
  return std::all_of(experts.begin(), experts.end(), [&](const ExpertWeights& e) {
    return same(e.gate, experts.front().gate) && same(e.up, experts.front().up) &&
           same(e.down, experts.front().down);
  });
}

}  // namespace

CudaBackend::CudaBackend(int ordinal) {
  require(ordinal >= 0 && ordinal < device_count(), "no CUDA device {} (this machine has {})", ordinal,
          device_count());
  check(cudaSetDevice(ordinal), "cudaSetDevice");
  device_ = device_info(ordinal);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  // Freed activation memory stays in the pool for the next forward instead of going back to the driver.
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, ordinal), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  log_info("cuda: {} (compute {}.{}, {} SMs, {:.1f} GiB)", device_.name, device_.compute_major, device_.compute_minor,
           device_.sm_count, static_cast<double>(device_.total_memory) / (1 << 30));
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

float* CudaBackend::allocate_floats(size_t count) {
  void* data = nullptr;
  const size_t bytes = std::max<size_t>(256, (count * sizeof(float) + 255) / 256 * 256);
  check(cudaMallocAsync(&data, bytes, stream_), "cudaMallocAsync");
  return static_cast<float*>(data);
}

void CudaBackend::free_floats(float* data) { check(cudaFreeAsync(data, stream_), "cudaFreeAsync"); }

void CudaBackend::fill(float* data, int64_t count, float value) {
  check(cuda::fill(data, count, value, stream_), "fill launch");
}

void CudaBackend::copy_to_backend(void* dst, const void* host, size_t bytes) {
  if (bytes > 0) check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
}

void CudaBackend::copy_to_host(void* host, const void* src, size_t bytes) {
  if (bytes > 0) check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  synchronize();
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
}

std::span<const float> CudaBackend::read_back(const float* src, size_t count) {
  // Every read_back waits for its copy, so no copy into the buffer is in flight when reserve replaces it.
  auto* host = static_cast<float*>(read_back_.reserve(std::max<size_t>(count, 1) * sizeof(float)));
  copy_to_host(host, src, count * sizeof(float));
  return {host, count};
}

void CudaBackend::draw_tokens(float* logits, int64_t vocab, std::span<const TokenDraw> draws,
                              std::span<int32_t> tokens) {
  require(tokens.size() == draws.size(), "draw_tokens: {} tokens for {} draws", tokens.size(), draws.size());
  if (draws.empty()) return;
  // Rows go kMaxDrawRows at a time through one scratch (a sorted row takes 24 bytes a token), after the tokens.
  const auto rows = static_cast<int64_t>(draws.size());
  const int64_t group = std::min<int64_t>(rows, kMaxDrawRows);
  const size_t token_bytes = (static_cast<size_t>(rows) * sizeof(int32_t) + 255) / 256 * 256;
  const size_t bytes = token_bytes + draw_tokens_scratch_bytes(static_cast<int>(group), vocab);
  auto* base = reinterpret_cast<char*>(draw_scratch_.floats((bytes + sizeof(float) - 1) / sizeof(float)));
  auto* device_tokens = reinterpret_cast<int32_t*>(base);
  for (int64_t first = 0; first < rows; first += group) {
    DrawTokensArgs args;
    args.rows = static_cast<int>(std::min(group, rows - first));
    args.vocab = vocab;
    args.logits = logits + first * vocab;
    for (int i = 0; i < args.rows; ++i) {
      const TokenDraw& d = draws[static_cast<size_t>(first + i)];
      args.draws[i] = DeviceDraw{.temperature = d.temperature, .min_p = d.min_p, .top_p = d.top_p, .top_k = d.top_k,
                                 .u = d.u};
    }
    args.tokens = device_tokens + first;
    args.scratch = base + token_bytes;
    check(cuda::draw_tokens(args, stream_), "draw_tokens");
  }
  auto* host = static_cast<int32_t*>(drawn_.reserve(static_cast<size_t>(rows) * sizeof(int32_t)));
  copy_to_host(host, device_tokens, static_cast<size_t>(rows) * sizeof(int32_t));
  std::copy(host, host + rows, tokens.begin());
}

void CudaBackend::synchronize() { check(cudaStreamSynchronize(stream_), "stream synchronize"); }

std::optional<DeviceMemory> CudaBackend::device_memory() {
  DeviceMemory memory;
  check(cudaMemGetInfo(&memory.free_bytes, &memory.total_bytes), "cudaMemGetInfo");
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device_.ordinal), "cudaDeviceGetDefaultMemPool");
  uint64_t used = 0;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used), "cudaMemPoolGetAttribute");
  memory.allocator_used_bytes = used;
  return memory;
}

void CudaBackend::place(LinearWeight& weight) {
  std::weak_ptr<const PlacedWeight>& known = placed_by_data_[weight.data];
  if (auto shared = known.lock()) {
    weight.placed = std::move(shared);
    return;
  }
  auto placed = std::make_shared<const PlacedLinear>(DeviceLinear::upload(weight, device_.sm_count, product_input()));
  placed_bytes_ += placed->linear.weight_bytes();
  known = placed;
  weight.placed = std::move(placed);
}

void CudaBackend::place(WeightVector& vector) {
  auto buffer = std::make_shared<DeviceBuffer>(DeviceBuffer::copy_of(vector.values.data(), vector.size() * sizeof(float)));
  placed_bytes_ += buffer->size();
  vector.placed = std::shared_ptr<const float>(buffer, buffer->as<float>());
}

void CudaBackend::place_attention_kv_b(LinearWeight& kv_b, int64_t num_heads, int64_t qk_head_dim,
                                       int64_t v_head_dim) {
  auto placed = std::make_shared<const PlacedMla>(DeviceMlaWeights::upload(kv_b, num_heads, qk_head_dim, v_head_dim));
  const DeviceMlaWeights& w = placed->weights;
  placed_bytes_ += w.w_uk.size() + w.w_uv.size() + w.w_uk_f16.size() + w.w_uv_f16.size();
  kv_b.placed = std::move(placed);
}

std::shared_ptr<const PlacedWeight> CudaBackend::place_experts(const std::vector<ExpertWeights>& experts) {
  auto placed = std::make_shared<PlacedExperts>();
  if (!experts.empty() && one_exl3_format(experts)) {
    placed->fused = DeviceExperts::upload(experts, device_.sm_count);
    placed_bytes_ += placed->fused->expert_bytes() * experts.size();
  } else {
    for (const ExpertWeights& expert : experts) {
      for (const LinearWeight* matrix : {&expert.gate, &expert.up, &expert.down}) {
        placed->linears.push_back(DeviceLinear::upload(*matrix, device_.sm_count, product_input()));
        placed_bytes_ += placed->linears.back().weight_bytes();
      }
    }
  }
  return placed;
}

const DeviceLinear& CudaBackend::placed_linear(const LinearWeight& weight) const {
  const auto* placed = dynamic_cast<const PlacedLinear*>(weight.placed.get());
  require(placed != nullptr, "weight '{}' was not placed on the GPU", weight.name);
  return placed->linear;
}

void CudaBackend::linear(const float* x, int64_t num_tokens, const LinearWeight& weight, float* y) {
  placed_linear(weight).forward(x, num_tokens, y, linear_scratch_, &gemm_, stream_);
}

void CudaBackend::linears(const float* x, int64_t num_tokens, std::span<const LinearWeight* const> weights,
                          std::span<float* const> ys) {
  std::vector<const DeviceLinear*> placed;
  for (const LinearWeight* weight : weights) placed.push_back(&placed_linear(*weight));
  DeviceLinear::forward_shared_input(placed, x, num_tokens, ys, linear_scratch_, &gemm_, stream_);
}

void CudaBackend::swiglu_linear(const float* gate, const float* up, int64_t num_tokens, float limit,
                                const LinearWeight& weight, float* hidden, float* y) {
  if (!placed_linear(weight).forward_swiglu(gate, up, limit, num_tokens, y, linear_scratch_, &gemm_, stream_)) {
    Backend::swiglu_linear(gate, up, num_tokens, limit, weight, hidden, y);
  }
}

void CudaBackend::embed(const int32_t* ids, int64_t num_tokens, const LinearWeight& table, float* out) {
  placed_linear(table).gather_rows(ids, num_tokens, out, stream_);
}

void CudaBackend::rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, float eps, float* y) {
  check(cuda::rms_norm(x, rows, n, weight, eps, y, stream_), "rms_norm launch");
}

void CudaBackend::layer_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
                             float eps, float* y) {
  check(cuda::layer_norm(x, rows, n, weight, bias, eps, y, stream_), "layer_norm launch");
}

void CudaBackend::mhc_pre(const MhcShape& shape, const MhcWeights& weights, const float* streams, float* post,
                          float* comb, float* collapsed) {
  const int64_t T = shape.num_tokens, hc = shape.hc_mult, width = hc * shape.hidden, mix = (2 + hc) * hc;
  // flat = streams / rms(streams) over the whole hc * hidden vector, then mixes = fn · flat.
  float* flat = scratch_a_.floats(static_cast<size_t>(T * width));
  float* mixes = scratch_b_.floats(static_cast<size_t>(T * mix));
  rms_norm(streams, T, width, nullptr, shape.rms_eps, flat);
  linear(flat, T, weights.fn, mixes);
  check(mhc_mix(MhcMixArgs{.num_tokens = T,
                           .hc_mult = hc,
                           .hidden = shape.hidden,
                           .hc_eps = shape.hc_eps,
                           .sinkhorn_iters = shape.sinkhorn_iters,
                           .mixes = mixes,
                           .base = weights.base.data(),
                           .scale = weights.scale.data(),
                           .streams = streams,
                           .post = post,
                           .comb = comb,
                           .collapsed = collapsed},
                stream_),
        "mhc_mix launch");
}

void CudaBackend::mhc_post(const MhcShape& shape, const float* post, const float* comb, const float* block_out,
                           float* streams) {
  check(cuda::mhc_post(post, comb, block_out, shape.num_tokens, shape.hc_mult, shape.hidden, streams, stream_),
        "mhc_post launch");
}

void CudaBackend::mhc_site(const MhcShape& shape, const MhcPendingPost* pending, const MhcWeights& weights,
                           const float* norm_weight, float* streams, float* post, float* comb, float* collapsed,
                           float* normed) {
  require(shape.hc_mult >= 1 && shape.hc_mult <= kMaxHcMult, "mHC with {} streams: the CUDA kernels take 1 to {}",
          shape.hc_mult, kMaxHcMult);
  const DeviceLinear& fn = placed_linear(weights.fn);
  if (fn.plain_data() == nullptr) {
    Backend::mhc_site(shape, pending, weights, norm_weight, streams, post, comb, collapsed, normed);
    return;
  }
  const int64_t T = shape.num_tokens;
  float* partials = scratch_b_.floats(static_cast<size_t>(mhc_site_scratch_floats(T, shape.hc_mult, shape.hidden)));
  check(cuda::mhc_site(MhcSiteArgs{.num_tokens = T,
                                   .hc_mult = shape.hc_mult,
                                   .hidden = shape.hidden,
                                   .rms_eps = shape.rms_eps,
                                   .hc_eps = shape.hc_eps,
                                   .sinkhorn_iters = shape.sinkhorn_iters,
                                   .fn = fn.plain_data(),
                                   .fn_type = fn.dense_type(),
                                   .base = weights.base.data(),
                                   .scale = weights.scale.data(),
                                   .norm_weight = norm_weight,
                                   .pending_post = pending ? pending->post : nullptr,
                                   .pending_comb = pending ? pending->comb : nullptr,
                                   .pending_block_out = pending ? pending->block_out : nullptr,
                                   .streams = streams,
                                   .post = post,
                                   .comb = comb,
                                   .collapsed = collapsed,
                                   .normed = normed,
                                   .partials = partials,
                                   .barrier = scratch_b_.counters(2)},
                       stream_),
        "mhc_site launch");
}

void CudaBackend::causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel,
                                   const float* weight, float* conv_state, float* y) {
  check(cuda::causal_conv_silu(x, num_tokens, channels, kernel, weight, conv_state, y, stream_),
        "causal_conv_silu launch");
}

namespace {

KdaDeviceArgs device_args(const KdaArgs& a) {
  return KdaDeviceArgs{.num_tokens = a.num_tokens, .num_heads = a.num_heads, .head_dim = a.head_dim, .q = a.q,
                       .k = a.k, .v = a.v, .g = a.g, .beta = a.beta, .state = a.state, .out = a.out};
}

}  // namespace

void CudaBackend::kda_chunked(const KdaArgs& args, int64_t chunk_size) {
  check(cuda::kda_chunked(device_args(args), chunk_size, stream_), "kda_chunked launch");
}

void CudaBackend::kda_recurrent(const KdaArgs& args) {
  check(cuda::kda_recurrent(device_args(args), stream_), "kda_recurrent launch");
}

void CudaBackend::kda_decode_steps(const KdaDecodeArgs& a, std::span<float* const> conv_states,
                                   std::span<float* const> states) {
  require(static_cast<int64_t>(conv_states.size()) == a.num_sequences &&
              static_cast<int64_t>(states.size()) == a.num_sequences,
          "KDA decode step: {} sequences, {} conv states, {} states", a.num_sequences, conv_states.size(),
          states.size());
  // The kernel reads the gates' second projections as bf16 [heads * head_dim, head_dim]; other formats compose.
  const DeviceLinear& f_b = placed_linear(*a.f_b_proj);
  const DeviceLinear& g_b = placed_linear(*a.g_b_proj);
  const auto takes = [&](const DeviceLinear& m) {
    return m.plain_data() != nullptr && m.dense_type() == DenseWeightType::bf16 && m.in_features() == a.head_dim &&
           m.out_features() == a.num_heads * a.head_dim;
  };
  if (!takes(f_b) || !takes(g_b)) {
    Backend::kda_decode_steps(a, conv_states, states);
    return;
  }
  check(cuda::kda_decode_steps(KdaDecodeDeviceArgs{.num_sequences = a.num_sequences, .num_heads = a.num_heads,
                                                   .head_dim = a.head_dim, .conv_kernel = a.conv_kernel,
                                                   .q_in = a.q_in, .k_in = a.k_in, .v_in = a.v_in,
                                                   .q_conv = a.q_conv, .k_conv = a.k_conv, .v_conv = a.v_conv,
                                                   .f_low = a.f_low, .f_b = f_b.plain_data(), .a_log = a.a_log,
                                                   .dt_bias = a.dt_bias, .bounded = a.lower_bound != nullptr,
                                                   .lower_bound = a.lower_bound ? *a.lower_bound : 0.0f,
                                                   .beta = a.beta, .gate_low = a.gate_low, .g_b = g_b.plain_data(),
                                                   .round_lows = product_input() == ProductInput::bf16,
                                                   .o_norm = a.o_norm, .eps = a.eps, .out = a.out},
                               conv_states.data(), states.data(), stream_),
        "kda_decode_steps launch");
}

void CudaBackend::indexer_select(const IndexerArgs& a) {
  require(a.positions_stride == indexer_max_positions(a.topk_pools, a.kpool),
          "indexer selection stride {} differs from the longest selection ({})", a.positions_stride,
          indexer_max_positions(a.topk_pools, a.kpool));
  const DevicePagedRows pooled = device_rows(*a.pooled_keys);
  // The whole cap from the first call on, so that the engine's profile forward, after which the KV cache takes the
  // memory left, finds it in use.
  const int64_t scratch_floats = std::max(kIndexerScratchFloats, pooled.num_rows);
  float* scratch = scratch_a_.floats(static_cast<size_t>(scratch_floats));
  check(cuda::indexer_select(IndexerDeviceArgs{.num_tokens = a.num_tokens,
                                               .start = a.start,
                                               .num_heads = a.num_heads,
                                               .head_dim = a.head_dim,
                                               .kpool = a.kpool,
                                               .topk_pools = a.topk_pools,
                                               .select_tail = a.select_tail,
                                               .query = a.query,
                                               .weights = a.weights,
                                               .weights_scale = a.weights_scale,
                                               .pooled_keys = pooled,
                                               .scratch = scratch,
                                               .scratch_floats = scratch_floats,
                                               .positions = a.positions,
                                               .counts = a.counts},
                             stream_),
        "indexer_select launch");
}

SparseMlaDeviceArgs CudaBackend::attention_args(const SparseMlaArgs& a, const PagedRows& latents,
                                               int64_t scratch_floats) {
  const DeviceMlaWeights& weights = placed_mla(*a.kv_b);
  return SparseMlaDeviceArgs{.num_tokens = a.num_tokens,
                             .num_heads = a.num_heads,
                             .qk_head_dim = a.qk_head_dim,
                             .v_head_dim = a.v_head_dim,
                             .kv_lora_rank = a.kv_lora_rank,
                             .scale = a.scale,
                             .query = a.query,
                             .w_uk = weights.w_uk.data(),
                             .w_uv = weights.w_uv.data(),
                             .weights_bf16 = weights.bf16,
                             .latents = device_rows(latents),
                             .positions = a.positions,
                             .counts = a.counts,
                             .positions_stride = a.positions_stride,
                             .out = a.out,
                             .scratch = scratch_floats > 0 ? scratch_a_.floats(static_cast<size_t>(scratch_floats))
                                                           : nullptr};
}

void CudaBackend::sparse_mla_attention(const SparseMlaArgs& a) {
  if (gemm_.available() &&
      cuda::sparse_mla_mma_supported(a.num_tokens, a.num_heads, a.positions_stride, a.kv_lora_rank,
                                     cuda::max_shared_optin())) {
    const int64_t group = cuda::sparse_mla_prefill_group_tokens(a.num_heads, a.qk_head_dim, a.kv_lora_rank);
    const size_t bytes = cuda::sparse_mla_prefill_scratch_bytes(std::min(group, a.num_tokens), a.num_heads,
                                                                a.qk_head_dim, a.kv_lora_rank);
    cuda::sparse_mla_prefill(attention_args(a, *a.latents, 0), placed_mla(*a.kv_b), gemm_,
                             scratch_a_.floats((bytes + sizeof(float) - 1) / sizeof(float)), group, stream_);
    return;
  }
  const int64_t scratch =
      cuda::sparse_mla_scratch_floats(a.num_tokens, a.num_heads, a.positions_stride, a.kv_lora_rank);
  check(cuda::sparse_mla_attention(attention_args(a, *a.latents, scratch), stream_), "sparse_mla_attention launch");
}

void CudaBackend::sparse_mla_attention_steps(const SparseMlaArgs& a, std::span<const PagedRows* const> latents) {
  require(static_cast<int64_t>(latents.size()) == a.num_tokens && !latents.empty(),
          "attention step: {} tokens for {} sequences", a.num_tokens, latents.size());
  std::vector<const int32_t*> block_ids;
  for (const PagedRows* rows : latents) {
    require(&rows->pool() == &latents.front()->pool(), "attention step: the sequences' latents are in different pools");
    block_ids.push_back(rows->table().backend_ids());
  }
  const int64_t scratch =
      cuda::sparse_mla_steps_scratch_floats(a.num_tokens, a.num_heads, a.positions_stride, a.kv_lora_rank);
  check(cuda::sparse_mla_attention_steps(attention_args(a, *latents.front(), scratch), block_ids.data(), stream_),
        "sparse_mla_attention_steps launch");
}

void CudaBackend::write_rows(PagedRows& rows, int64_t first_row, const float* src, int64_t count) {
  check(cuda::write_paged_rows(device_rows(rows), first_row, src, count, stream_), "write_paged_rows launch");
}

void CudaBackend::kpool_compress(const PagedRows& keys, const PagedRows& gates, const float* ape, int64_t first_pool,
                                 int64_t num_pools, int64_t kpool, float* pooled) {
  check(cuda::kpool_compress(device_rows(keys), device_rows(gates), ape, first_pool, num_pools, kpool, pooled,
                             stream_),
        "kpool_compress launch");
}

void CudaBackend::route_experts(const RouterArgs& a) {
  check(cuda::route_experts(RouterDeviceArgs{.num_tokens = a.num_tokens,
                                             .num_experts = a.num_experts,
                                             .top_k = a.top_k,
                                             .n_group = a.n_group,
                                             .topk_group = a.topk_group,
                                             .norm_topk_prob = a.norm_topk_prob,
                                             .routed_scaling_factor = a.routed_scaling_factor,
                                             .logits = a.logits,
                                             .correction_bias = a.correction_bias,
                                             .expert_ids = a.expert_ids,
                                             .expert_weights = a.expert_weights},
                            stream_),
        "route_experts launch");
}

void CudaBackend::moe_experts(const MoeArgs& a) {
  const auto* placed = dynamic_cast<const PlacedExperts*>(a.placed_experts);
  require(placed != nullptr, "routed experts were not placed on the GPU");
  // The fused path reads an expert once per slot: right for decode, where a call has a few tokens. A prefill chunk
  // has many tokens per expert, so they are grouped by expert (a host round trip for the routing) and each expert is
  // read once per 16 of its tokens.
  if (placed->fused && a.num_tokens <= kFusedMoeMaxTokens) {
    placed->fused->forward(a.x, a.num_tokens, a.top_k, a.expert_ids, a.expert_weights, a.swiglu_limit, a.out,
                           moe_scratch_, stream_);
  } else {
    moe_by_expert(a, placed->fused ? placed->fused->linears() : placed->linears);
  }
}

void CudaBackend::moe_by_expert(const MoeArgs& a, const std::vector<DeviceLinear>& linears) {
  const int64_t T = a.num_tokens, k = a.top_k, D = a.hidden, I = a.intermediate, slots = T * k;
  if (slots == 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(slots));
  copy_to_host(ids.data(), a.expert_ids, ids.size() * sizeof(int32_t));
  // Per expert, its slots' tokens (gathered as rows of x) and the slots its outputs go to.
  const auto num_experts = static_cast<int64_t>(linears.size() / 3);
  std::vector<std::vector<int32_t>> slots_of(static_cast<size_t>(num_experts));
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t e = ids[static_cast<size_t>(s)];
    require(e >= 0 && e < num_experts, "expert id {} is outside [0, {})", e, num_experts);
    slots_of[static_cast<size_t>(e)].push_back(static_cast<int32_t>(s));
  }
  std::vector<int32_t> lists;  // tokens, then slots, expert by expert
  for (const auto& expert_slots : slots_of) {
    for (const int32_t s : expert_slots) lists.push_back(static_cast<int32_t>(s / k));
  }
  for (const auto& expert_slots : slots_of) lists.insert(lists.end(), expert_slots.begin(), expert_slots.end());
  if (int_scratch_.size() < lists.size() * sizeof(int32_t)) {
    check(cudaStreamSynchronize(stream_), "stream synchronize");
    int_scratch_ = DeviceBuffer(lists.size() * sizeof(int32_t));
  }
  copy_to_backend(int_scratch_.data(), lists.data(), lists.size() * sizeof(int32_t));
  const int32_t* tokens = int_scratch_.as<int32_t>();
  const int32_t* slot_rows = tokens + slots;

  // Scratch, rows in expert order: the slot outputs [slots, D] (slot order), the inputs [slots, D], the outputs
  // [slots, D], gate and up [slots, I]. Each projection of every expert is one job list (DeviceLinear::forward_jobs
  // runs the GEMM-sized ones as groups), the gather, SwiGLU and scatter one launch each for all the slots.
  float* slot_out = moe_scratch_.floats(static_cast<size_t>(slots * D + 2 * slots * D + 2 * slots * I));
  float* xs = slot_out + slots * D;
  float* ys = xs + slots * D;
  float* gate = ys + slots * D;
  float* up = gate + slots * I;
  check(gather_rows(a.x, DenseWeightType::f32, D, tokens, slots, xs, stream_), "expert input gather");
  const auto jobs_of = [&](int64_t which, const float* x, int64_t x_width, float* y, int64_t y_width) {
    std::vector<LinearJob> jobs;
    int64_t offset = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      const auto n = static_cast<int64_t>(slots_of[static_cast<size_t>(e)].size());
      if (n == 0) continue;
      jobs.push_back(LinearJob{.linear = &linears[static_cast<size_t>(3 * e + which)],
                               .x = x + offset * x_width,
                               .num_tokens = n,
                               .y = y + offset * y_width});
      offset += n;
    }
    DeviceLinear::forward_jobs(jobs, linear_scratch_, &gemm_, stream_);
  };
  jobs_of(0, xs, D, gate, I);
  jobs_of(1, xs, D, up, I);
  check(cuda::clamped_swiglu(gate, up, slots * I, a.swiglu_limit, gate, stream_), "expert activation launch");
  jobs_of(2, gate, I, ys, D);
  check(scatter_rows(ys, slot_rows, slots, D, slot_out, stream_), "expert output scatter");
  check(weighted_slot_sum(slot_out, a.expert_weights, T, k, D, a.out, stream_), "expert combine launch");
}

void CudaBackend::kda_gate(const float* f, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                           const float* a_log, const float* dt_bias, const float* lower_bound, float* g) {
  check(cuda::kda_gate(f, num_tokens, num_heads, head_dim, a_log, dt_bias, lower_bound, g, stream_),
        "kda_gate launch");
}

void CudaBackend::gated_rms_norm(const float* x, const float* gate, int64_t rows, int64_t n, const float* weight,
                                 float eps, float* y) {
  check(cuda::gated_rms_norm(x, gate, rows, n, weight, eps, y, stream_), "gated_rms_norm launch");
}

void CudaBackend::sigmoid(float* x, int64_t n) { check(cuda::sigmoid(x, n, stream_), "sigmoid launch"); }

void CudaBackend::add(const float* x, int64_t n, float* y) { check(cuda::add(x, n, y, stream_), "add launch"); }

void CudaBackend::stream_mean(const float* streams, int64_t num_tokens, int64_t hc_mult, int64_t hidden,
                              float* out) {
  check(cuda::stream_mean(streams, num_tokens, hc_mult, hidden, out, stream_), "stream_mean launch");
}

void CudaBackend::stream_expand(const float* x, int64_t num_tokens, int64_t hc_mult, int64_t hidden,
                                float* streams) {
  check(cuda::stream_expand(x, num_tokens, hc_mult, hidden, streams, stream_), "stream_expand launch");
}

void CudaBackend::clamped_swiglu(const float* gate, const float* up, int64_t rows, int64_t n, float limit,
                                 float* out) {
  check(cuda::clamped_swiglu(gate, up, rows * n, limit, out, stream_), "clamped_swiglu launch");
}

}  // namespace kestrel::cuda
