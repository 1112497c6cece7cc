// The operations a model forward is written against. One backend per device kind implements all of them (cpu/,
// cuda/) so that src/model reads the same whatever runs it. Every pointer an op takes is in the backend's memory
// (device memory for CUDA), except where a comment says host: activations are float32 arrays laid out row-major with
// the token index outermost, shapes given as [rows, cols]; int32 arrays hold token ids, expert ids and selected
// positions. Weights arrive as LinearWeight (matrices in their on-disk format) and WeightVector, which the backend
// placed in its memory at load (place_*), and the caches as PagedRows over RowBlockPools in its memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backend/dsa_selection.h"
#include "backend/linear_weight.h"
#include "backend/product_input.h"
#include "backend/token_draw.h"
#include "base/error.h"
#include "engine/paged_rows.h"

namespace kestrel {

// mHC (manifold-constrained hyper-connections) parameters of one sub-block site.
struct MhcWeights {
  LinearWeight fn;            // [(2 + hc) * hc, hc * hidden]
  WeightVector base;          // [(2 + hc) * hc]
  WeightVector scale;         // [3]
};

struct MhcShape {
  int64_t num_tokens, hc_mult, hidden;
  float rms_eps, hc_eps;
  int64_t sinkhorn_iters;
};

// The post-mix a site applies before its own pre-mix: the sub-block before it wrote block_out [T, hidden], mixed
// back with that site's post [T, hc] and comb [T, hc, hc].
struct MhcPendingPost {
  const float* post;
  const float* comb;
  const float* block_out;
};

// KDA recurrence inputs for one forward call of one layer (all float32, [T, heads, head_dim] unless noted).
struct KdaArgs {
  int64_t num_tokens, num_heads, head_dim;
  const float* q;      // after conv + SiLU, not yet normalised
  const float* k;      // after conv + SiLU, not yet normalised
  const float* v;      // after conv + SiLU
  const float* g;      // log-decay per key channel, [T, heads, head_dim]
  const float* beta;   // [T, heads]
  float* state;        // [heads, head_dim (k), head_dim (v)], read and updated in place
  float* out;          // [T, heads, head_dim]
};

// One decode step of the KDA block after its projections from x, for S sequences of one token each (row s of every
// [S, ...] tensor is sequence s's; Backend::kda_decode_steps takes each one's conv state [3, K-1, C] (q, k, v) and
// recurrent state): the causal conv + SiLU of q, k and v, the gates' second projections (f_b, g_b), the forget gate
// (kda_gate), the write strength's sigmoid, the gated delta rule, then per head rms_norm(attended; o_norm, eps) *
// sigmoid(gate). C = num_heads * head_dim.
struct KdaDecodeArgs {
  int64_t num_sequences, num_heads, head_dim, conv_kernel;
  const float* q_in;  // [S, C] the projections, before the conv
  const float* k_in;
  const float* v_in;
  const float* q_conv;  // [C, conv_kernel]
  const float* k_conv;
  const float* v_conv;
  const float* f_low;        // [S, head_dim] the forget gate's first projection (f_a), and its second (f_b)
  const LinearWeight* f_b_proj;
  const float* a_log;        // as kda_gate's
  const float* dt_bias;
  const float* lower_bound;  // host pointer, or none
  float* beta;               // [S, heads] write-strength logits; the default turns them into their sigmoid in place
  const float* gate_low;     // [S, head_dim] the output gate's first projection (g_a), and its second (g_b)
  const LinearWeight* g_b_proj;
  const float* o_norm;       // [head_dim]
  float eps;
  float* work;  // 7 * S * C floats for the default's intermediates (q, k, v, f, g, gate, attended); a fused backend
                // may leave it untouched
  float* out;   // [S, C]
};

// One DSA layer's indexer inputs for T new tokens at positions [start, start + T).
struct IndexerArgs {
  int64_t num_tokens, start;
  int64_t num_heads, head_dim, kpool, topk_pools;
  bool select_tail;
  const float* query;    // [T, heads, head_dim] indexer queries (wq_b of q_resid)
  const float* weights;  // [T, heads] per-head weights (weights_proj's output)
  float weights_scale = 1.0f;  // each weight taken as weights[t, h] * weights_scale (heads^-1/2): no launch of its own
  const PagedRows* pooled_keys;  // one row per complete pool of the whole sequence, [pools, head_dim]
  // Out: per new token, the attended positions in ascending order, then -1 up to positions_stride
  // (indexer_max_positions); counts[t] of them.
  int32_t* positions = nullptr;  // [T, positions_stride]
  int32_t* counts = nullptr;     // [T]
  int64_t positions_stride = 0;
};


// Sparse NoPE MLA attention for T new tokens, computed in the absorbed form over the cached latents.
struct SparseMlaArgs {
  int64_t num_tokens, num_heads, qk_head_dim, v_head_dim, kv_lora_rank;
  float scale;
  const float* query;                 // [T, heads, qk_head_dim]
  const LinearWeight* kv_b;           // [heads * (qk_head_dim + v_head_dim), kv_lora_rank], place_attention_kv_b'd
  const PagedRows* latents;           // [positions, kv_lora_rank]
  const int32_t* positions;           // [T, positions_stride]: each token's attended positions, as indexer_select
  const int32_t* counts;              // [T]
  int64_t positions_stride;
  float* out;                         // [T, heads, v_head_dim]
};

struct RouterArgs {
  int64_t num_tokens, num_experts, top_k, n_group, topk_group;
  bool norm_topk_prob;
  float routed_scaling_factor;
  const float* logits;                // [T, experts] router logits
  const float* correction_bias;       // [experts]
  int32_t* expert_ids;                // [T, top_k]
  float* expert_weights;              // [T, top_k]
};

struct ExpertWeights {
  LinearWeight gate, up;  // [intermediate, hidden]
  LinearWeight down;      // [hidden, intermediate]
};

struct MoeArgs {
  int64_t num_tokens, hidden, intermediate, top_k;
  float swiglu_limit;
  const float* x;                            // [T, hidden]
  const std::vector<ExpertWeights>* experts;
  const PlacedWeight* placed_experts = nullptr;  // what place_experts returned for them (null on the CPU)
  const int32_t* expert_ids;                 // [T, top_k]
  const float* expert_weights;               // [T, top_k]
  float* out;                                // [T, hidden]: the experts' weighted sum is added to it
};

// A device's memory as its driver reports it, and what the backend's own allocator holds for activations, caches
// and states (the allocator statistics a leak would show in).
struct DeviceMemory {
  size_t free_bytes = 0, total_bytes = 0;
  size_t allocator_used_bytes = 0;
};

class Backend {
public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // The input of the products with bf16 weights (product_input.h); set before the weights are placed, since a GPU
  // fixes each matrix's kernels then.
  void set_product_input(ProductInput input) { product_input_ = input; }
  ProductInput product_input() const { return product_input_; }

  // Float arrays in the backend's memory, 64-byte aligned (activations, caches, states); allocation failure throws.
  virtual float* allocate_floats(size_t count) = 0;
  virtual void free_floats(float* data) = 0;
  virtual void fill(float* data, int64_t count, float value) = 0;
  // Copies between host memory and the backend's memory, and within the backend's memory; to_host returns when the
  // bytes are there (after every op queued before it).
  virtual void copy_to_backend(void* dst, const void* host, size_t bytes) = 0;
  virtual void copy_to_host(void* host, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Rows [first_row, first_row + count) of `rows` (appended already) = src [count, row_width], stored in the pool's
  // format. The default, for a backend whose memory is the host's, copies a block's run of float32 rows at a time
  // and encodes bf16 and fp8 rows one by one; a GPU writes them all in one launch through the block table.
  virtual void write_rows(PagedRows& rows, int64_t first_row, const float* src, int64_t count);
  // `count` floats of the backend's memory, readable on the host once it returns (after every op queued before it):
  // a view of host memory the backend owns (page-locked on a GPU, so the copy runs at the bus's speed, not through
  // the driver's staging), valid until the next read_back or the backend's end.
  virtual std::span<const float> read_back(const float* src, size_t count) = 0;
  // tokens[i] (host) = draw_token(row i of `logits` [draws.size(), vocab], draws[i]): the sampler's last stage run
  // where the logits are, so that a token comes back instead of a vocabulary of floats. The logits may be
  // overwritten. This default reads them back and draws on the host, the rows in parallel.
  virtual void draw_tokens(float* logits, int64_t vocab, std::span<const TokenDraw> draws, std::span<int32_t> tokens);
  // Returns when every op queued so far has finished (a host backend's ops finish before they return).
  virtual void synchronize() {}
  // The memory of a device of its own, or nothing for host memory.
  virtual std::optional<DeviceMemory> device_memory() = 0;

  // Weights into the backend's memory, once at load, before any op uses them. A LinearWeight used by linear() or
  // embed() and a WeightVector get `placed` set (or nothing, when the backend reads the host copy as it is);
  // kv_b is placed for sparse_mla_attention; the returned experts go into MoeArgs::placed_experts.
  virtual void place(LinearWeight& weight) = 0;
  virtual void place(WeightVector& vector) = 0;
  virtual void place_attention_kv_b(LinearWeight& kv_b, int64_t num_heads, int64_t qk_head_dim,
                                    int64_t v_head_dim) = 0;
  virtual std::shared_ptr<const PlacedWeight> place_experts(const std::vector<ExpertWeights>& experts) = 0;

  // y[T, out] = x[T, in] W^T
  virtual void linear(const float* x, int64_t num_tokens, const LinearWeight& weight, float* y) = 0;
  // ys[i][T, out_i] = x[T, in] weights[i]^T for weights sharing x (a layer's q, k and v projections), which a
  // backend may run as one pass; by default one linear() each.
  virtual void linears(const float* x, int64_t num_tokens, std::span<const LinearWeight* const> weights,
                       std::span<float* const> ys) {
    require(weights.size() == ys.size(), "{} matrices for {} outputs", weights.size(), ys.size());
    for (size_t i = 0; i < weights.size(); ++i) linear(x, num_tokens, *weights[i], ys[i]);
  }
  // y[T, out] = clamped_swiglu(gate, up, limit) [T, in] weight^T, the MLP's down projection of its activation;
  // hidden [T, in] holds the activation (a backend that applies it inside the product may leave it unwritten).
  virtual void swiglu_linear(const float* gate, const float* up, int64_t num_tokens, float limit,
                             const LinearWeight& weight, float* hidden, float* y) {
    clamped_swiglu(gate, up, num_tokens, weight.in_features, limit, hidden);
    linear(hidden, num_tokens, weight, y);
  }
  // ys[i][T, out_i] = rms_norm(x; norm_weight, eps) [T, in] weights[i]^T, a norm that only feeds products (the q
  // latent's, the final one before the head); normed [T, in] holds the normed rows (a backend that norms inside the
  // products may leave it unwritten).
  virtual void norm_linears(const float* x, int64_t num_tokens, const float* norm_weight, float eps,
                            std::span<const LinearWeight* const> weights, std::span<float* const> ys, float* normed) {
    require(!weights.empty(), "norm_linears without matrices");
    rms_norm(x, num_tokens, weights.front()->in_features, norm_weight, eps, normed);
    linears(normed, num_tokens, weights, ys);
  }
  // out[T, hidden] = rows `ids` of the embedding table (ids in [0, rows), checked by the caller)
  virtual void embed(const int32_t* ids, int64_t num_tokens, const LinearWeight& table, float* out) = 0;
  // y = x / sqrt(mean(x^2) + eps) * weight (weight may be null: unweighted), over rows of width n
  virtual void rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, float eps, float* y) = 0;
  // y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance)
  virtual void layer_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias, float eps,
                          float* y) = 0;

  // mHC pre-mix: from streams [T, hc, hidden] computes post [T, hc], comb [T, hc, hc] (Sinkhorn-normalised) and the
  // collapsed input [T, hidden] of the sub-block.
  virtual void mhc_pre(const MhcShape& shape, const MhcWeights& weights, const float* streams, float* post,
                       float* comb, float* collapsed) = 0;
  // mHC post-mix in place: streams[t, j] = post[t, j] * block_out[t] + sum_i comb[t, i, j] * streams[t, i].
  virtual void mhc_post(const MhcShape& shape, const float* post, const float* comb, const float* block_out,
                        float* streams) = 0;
  // One mHC site of a decoder layer: the pending post-mix into the streams (when given), this site's pre-mix, and
  // the RMS norm (norm_weight, shape.rms_eps) of the collapsed input into normed. The composition of mhc_post,
  // mhc_pre and rms_norm, which a backend may fuse (post and comb must not be pending's).
  virtual void mhc_site(const MhcShape& shape, const MhcPendingPost* pending, const MhcWeights& weights,
                        const float* norm_weight, float* streams, float* post, float* comb, float* collapsed,
                        float* normed) {
    if (pending != nullptr) mhc_post(shape, pending->post, pending->comb, pending->block_out, streams);
    mhc_pre(shape, weights, streams, post, comb, collapsed);
    rms_norm(collapsed, shape.num_tokens, shape.hidden, norm_weight, shape.rms_eps, normed);
  }
  // Causal depthwise conv (kernel K) over [T, channels] followed by SiLU; conv_state [K-1, channels] holds the
  // previous inputs (zeros at sequence start) and is updated to the last K-1 inputs.
  virtual void causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel,
                                const float* weight, float* conv_state, float* y) = 0;
  // KDA gated delta rule: the chunked (WY) form for a multi-token call, the recurrent form for one token.
  virtual void kda_chunked(const KdaArgs& args, int64_t chunk_size) = 0;
  virtual void kda_recurrent(const KdaArgs& args) = 0;

  // One decode step of the KDA block between its projections from x and o_proj (KdaDecodeArgs). The default composes
  // the single-sequence ops above, linear, kda_gate, sigmoid and gated_rms_norm; a GPU runs the step as one launch.
  virtual void kda_decode_steps(const KdaDecodeArgs& args, std::span<float* const> conv_states,
                                std::span<float* const> states) {
    const int64_t S = args.num_sequences, H = args.num_heads, Dh = args.head_dim, C = H * Dh, K = args.conv_kernel;
    require(static_cast<int64_t>(conv_states.size()) == S && static_cast<int64_t>(states.size()) == S,
            "KDA decode step: {} sequences, {} conv states, {} states", S, conv_states.size(), states.size());
    float* q = args.work;
    float* k = q + S * C;
    float* v = k + S * C;
    float* f = v + S * C;
    float* g = f + S * C;
    float* gate = g + S * C;
    float* attended = gate + S * C;
    for (int64_t s = 0; s < S; ++s) {
      float* conv = conv_states[static_cast<size_t>(s)];
      causal_conv_silu(args.q_in + s * C, 1, C, K, args.q_conv, conv, q + s * C);
      causal_conv_silu(args.k_in + s * C, 1, C, K, args.k_conv, conv + (K - 1) * C, k + s * C);
      causal_conv_silu(args.v_in + s * C, 1, C, K, args.v_conv, conv + 2 * (K - 1) * C, v + s * C);
    }
    linear(args.f_low, S, *args.f_b_proj, f);
    linear(args.gate_low, S, *args.g_b_proj, gate);
    kda_gate(f, S, H, Dh, args.a_log, args.dt_bias, args.lower_bound, g);
    sigmoid(args.beta, S * H);
    for (int64_t s = 0; s < S; ++s) {
      kda_recurrent(KdaArgs{.num_tokens = 1, .num_heads = H, .head_dim = Dh, .q = q + s * C, .k = k + s * C,
                            .v = v + s * C, .g = g + s * C, .beta = args.beta + s * H,
                            .state = states[static_cast<size_t>(s)], .out = attended + s * C});
    }
    gated_rms_norm(attended, gate, S * H, Dh, args.o_norm, args.eps, args.out);
  }

  // DSA indexer selection: for each new token, the positions it attends to (ascending).
  virtual void indexer_select(const IndexerArgs& args) = 0;
  virtual void sparse_mla_attention(const SparseMlaArgs& args) = 0;
  // A decode step's attention: token s (of args.num_tokens) is the one new token of the sequence whose latents are
  // latents[s] (args.latents is not used). The default runs sparse_mla_attention per sequence; a GPU runs the step as
  // one pass.
  virtual void sparse_mla_attention_steps(const SparseMlaArgs& args, std::span<const PagedRows* const> latents) {
    require(static_cast<int64_t>(latents.size()) == args.num_tokens, "attention step: {} tokens for {} sequences",
            args.num_tokens, latents.size());
    for (size_t s = 0; s < latents.size(); ++s) {
      const auto i = static_cast<int64_t>(s);
      SparseMlaArgs one = args;
      one.num_tokens = 1;
      one.query = args.query + i * args.num_heads * args.qk_head_dim;
      one.latents = latents[s];
      one.positions = args.positions + i * args.positions_stride;
      one.counts = args.counts + i;
      one.out = args.out + i * args.num_heads * args.v_head_dim;
      sparse_mla_attention(one);
    }
  }

  // Pooled indexer keys of pools [first_pool, first_pool + num_pools) into pooled [num_pools, dim]: per channel,
  // softmax over the pool's slots of (gate + ape) weighting the keys.
  virtual void kpool_compress(const PagedRows& keys, const PagedRows& gates, const float* ape, int64_t first_pool,
                              int64_t num_pools, int64_t kpool, float* pooled) = 0;

  virtual void route_experts(const RouterArgs& args) = 0;
  // out[T, hidden] += sum over each token's experts of weight * down(clamped_swiglu(gate x, up x)).
  virtual void moe_experts(const MoeArgs& args) = 0;
  // KDA forget gate, per head h and channel: g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)) when a lower
  // bound (a host pointer) is set, else -exp(A_log[h]) * softplus(f + dt_bias). f and g are [T, heads, head_dim].
  virtual void kda_gate(const float* f, int64_t num_tokens, int64_t num_heads, int64_t head_dim, const float* a_log,
                        const float* dt_bias, const float* lower_bound, float* g) = 0;
  // y = rms_norm(x; weight, eps) * sigmoid(gate) over rows of width n.
  virtual void gated_rms_norm(const float* x, const float* gate, int64_t rows, int64_t n, const float* weight,
                              float eps, float* y) = 0;
  virtual void sigmoid(float* x, int64_t n) = 0;
  // y += x
  virtual void add(const float* x, int64_t n, float* y) = 0;
  // out[T, hidden] = mean over the hc streams of streams[T, hc, hidden]
  virtual void stream_mean(const float* streams, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* out) = 0;
  // Each token's input copied into every stream: streams[T, hc, hidden].
  virtual void stream_expand(const float* x, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* streams) = 0;
  // out[T, n] = silu(min(gate, limit)) * clamp(up, -limit, limit).
  virtual void clamped_swiglu(const float* gate, const float* up, int64_t rows, int64_t n, float limit, float* out) = 0;

private:
  ProductInput product_input_ = ProductInput::float32;
};

}  // namespace kestrel
