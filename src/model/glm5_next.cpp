// GLM-5.3-Flash forward, top to bottom. Mirrors transformers' Glm5NextTextModel (5.17): embedding copied into hc_mult
// streams; per layer an mHC site around the token mixer (KDA or NoPE MLA with the DSA indexer) and one around the FFN
// (dense or MoE); the streams' mean, the final norm and lm_head. Shapes: T new tokens of all the pass's sequences
// (each sequence's tokens consecutive), D hidden.
#include "model/glm5_next.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "base/error.h"
#include "base/log.h"

namespace kestrel {

std::unique_ptr<Glm5NextModel> Glm5NextModel::load(const std::string& dir, Backend& backend, CacheDtype latent_dtype) {
  Checkpoint checkpoint = Checkpoint::open(dir);
  Glm5NextConfig config = load_glm5_next_config(checkpoint.config_path());
  log_info("{}", config.summary());
  return std::unique_ptr<Glm5NextModel>(
      new Glm5NextModel(std::move(config), std::move(checkpoint), backend, latent_dtype));
}

Glm5NextModel::Glm5NextModel(Glm5NextConfig config, Checkpoint checkpoint, Backend& backend, CacheDtype latent_dtype)
    : config_(std::move(config)),
      checkpoint_(std::move(checkpoint)),
      backend_(backend),
      weights_(bind_glm5_next_weights(checkpoint_, config_)),
      pools_(config_, backend, latent_dtype) {
  place_glm5_next_weights(weights_, config_, backend_);
}

std::unique_ptr<SequenceState> Glm5NextModel::new_sequence() {
  return std::make_unique<SequenceState>(config_, pools_);
}

std::vector<float> Glm5NextModel::forward(SequenceState& sequence, std::span<const int32_t> tokens,
                                          const ForwardOptions& options) {
  const SequenceCall call{.sequence = &sequence, .tokens = tokens};
  return std::move(forward_batch(std::span(&call, 1), options).front());
}

std::vector<std::vector<float>> Glm5NextModel::forward_batch(std::span<const SequenceCall> calls,
                                                             const ForwardOptions& options) {
  const Glm5NextConfig& c = config_;
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  // Everything is checked before any sequence changes.
  std::vector<CallRows> rows;  // the calls with tokens, in order
  std::vector<size_t> call_of_rows;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < calls.size(); ++i) {
    const SequenceCall& call = calls[i];
    for (const int32_t id : call.tokens) {
      require(id >= 0 && id < c.vocab_size, "token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
    }
    for (size_t j = 0; j < i; ++j) {
      require(calls[j].sequence != call.sequence, "a batched forward names one sequence twice (calls {} and {})", j, i);
    }
    if (call.tokens.empty()) continue;
    rows.push_back(CallRows{.sequence = call.sequence,
                            .start = call.sequence->num_tokens(),
                            .offset = static_cast<int64_t>(tokens.size()),
                            .count = static_cast<int64_t>(call.tokens.size()),
                            .logits = call.logits,
                            .draw = call.logits ? call.draw : nullptr});
    call_of_rows.push_back(i);
    tokens.insert(tokens.end(), call.tokens.begin(), call.tokens.end());
  }
  std::vector<std::vector<float>> logits(calls.size());
  const auto T = static_cast<int64_t>(tokens.size());
  if (T == 0) return logits;
  profile_ = options.profile;
  const MhcShape mhc{.num_tokens = T,
                     .hc_mult = hc,
                     .hidden = D,
                     .rms_eps = static_cast<float>(c.rms_norm_eps),
                     .hc_eps = static_cast<float>(c.hc_eps),
                     .sinkhorn_iters = c.hc_sinkhorn_iters};
  const auto eps = static_cast<float>(c.rms_norm_eps);

  for (const CallRows& call : rows) call.sequence->reserve(call.start + call.count);
  Workspace ws(backend_);
  int32_t* ids = ws.int32s(T);
  backend_.copy_to_backend(ids, tokens.data(), tokens.size() * sizeof(int32_t));
  float* x = ws.floats(T * D);             // [T, D] embeddings, then each sub-block's collapsed input
  float* streams = ws.floats(T * hc * D);  // [T, hc, D] the residual streams
  float* normed = ws.floats(T * D);
  float* block_out = ws.floats(T * D);
  // Each site's post and comb; a site's post-mix is applied by the next site (fused with its pre-mix), so two sets
  // alternate.
  float* post[2] = {ws.floats(T * hc), ws.floats(T * hc)};
  float* comb[2] = {ws.floats(T * hc * hc), ws.floats(T * hc * hc)};
  std::optional<MhcPendingPost> pending;
  int site = 0;  // the set the next site writes
  const auto mhc_site = [&](const MhcWeights& weights, const WeightVector& norm) {
    const ProfileScope part(profile_, backend_, "mhc and norms");
    backend_.mhc_site(mhc, pending ? &*pending : nullptr, weights, norm.data(), streams, post[site], comb[site], x,
                      normed);
  };
  const auto sub_block_done = [&] {
    pending = MhcPendingPost{.post = post[site], .comb = comb[site], .block_out = block_out};
    site ^= 1;
  };
  {
    const ProfileScope part(profile_, backend_, "embedding");
    backend_.embed(ids, T, weights_.embed_tokens, x);
    backend_.stream_expand(x, T, hc, D, streams);
  }

  // The positions chosen by the last full indexer layer, reused by a following "shared" layer.
  const int64_t stride = indexer_max_positions(c.index_topk / c.index_kpool, c.index_kpool);
  Selection selection{.positions = ws.int32s(T * stride), .counts = ws.int32s(T), .stride = stride, .made = false};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& layer = weights_.layers[static_cast<size_t>(i)];

    mhc_site(layer.attn_hc, layer.input_norm);
    if (layer.type == LayerType::linear_attention) {
      kda_block(ws, layer.kda, i, rows, normed, T, block_out);
    } else {
      mla_block(ws, layer.mla, i, rows, normed, T, selection, block_out);
    }
    sub_block_done();
    mhc_site(layer.ffn_hc, layer.post_attention_norm);
    if (layer.mlp_type == MlpType::dense) {
      const ProfileScope part(profile_, backend_, "dense mlp");
      mlp_block(ws, layer.dense, normed, T, block_out);
    } else {
      moe_block(ws, layer.moe, normed, T, block_out);
    }
    sub_block_done();
  }
  if (pending) {
    const ProfileScope part(profile_, backend_, "mhc and norms");
    backend_.mhc_post(mhc, pending->post, pending->comb, pending->block_out, streams);
  }
  for (const CallRows& call : rows) call.sequence->advance(call.count);

  // Final collapse is a plain mean of the streams, then the norm and the head: for every row, or each call's last,
  // of the calls that want logits, gathered into consecutive rows, those of the calls drawn on the backend first
  // (their last row only).
  std::vector<int64_t> head_row(rows.size(), -1);  // each call's first row in the head's input
  std::vector<TokenDraw> draws;
  int64_t head_rows = 0;
  for (const bool drawn : {true, false}) {
    for (size_t k = 0; k < rows.size(); ++k) {
      if (!rows[k].logits || (rows[k].draw != nullptr) != drawn) continue;
      const int64_t count = options.all_logits && !drawn ? rows[k].count : 1;
      const int64_t first = rows[k].offset + rows[k].count - count;
      const ProfileScope part(profile_, backend_, "head");
      backend_.stream_mean(streams + first * hc * D, count, hc, D, x + head_rows * D);
      head_row[k] = head_rows;
      head_rows += count;
      if (drawn) draws.push_back(rows[k].draw->draw);
    }
  }
  if (head_rows == 0) return logits;
  float* head = ws.floats(head_rows * c.vocab_size);
  {
    const ProfileScope part(profile_, backend_, "head");
    const LinearWeight* head_weight[] = {&weights_.lm_head};
    float* const head_output[] = {head};
    backend_.norm_linears(x, head_rows, weights_.final_norm.data(), eps, head_weight, head_output, normed);
  }
  const auto drawn_rows = static_cast<int64_t>(draws.size());
  if (drawn_rows > 0) {
    const ProfileScope part(profile_, backend_, "draw");
    std::vector<int32_t> drawn(draws.size());
    backend_.draw_tokens(head, c.vocab_size, draws, drawn);
    for (size_t k = 0; k < rows.size(); ++k) {
      if (rows[k].logits && rows[k].draw != nullptr) rows[k].draw->token = drawn[static_cast<size_t>(head_row[k])];
    }
  }
  if (head_rows == drawn_rows) return logits;
  std::span<const float> host;
  {
    const ProfileScope part(profile_, backend_, "logits to host");
    host = backend_.read_back(head + drawn_rows * c.vocab_size,
                              static_cast<size_t>((head_rows - drawn_rows) * c.vocab_size));
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    if (head_row[k] < 0 || rows[k].draw != nullptr) continue;
    const int64_t count = options.all_logits ? rows[k].count : 1;
    const int64_t first = head_row[k] - drawn_rows;
    logits[call_of_rows[k]].assign(host.begin() + first * c.vocab_size, host.begin() + (first + count) * c.vocab_size);
  }
  return logits;
}

bool Glm5NextModel::one_token_each(std::span<const CallRows> calls) {
  return std::all_of(calls.begin(), calls.end(), [](const CallRows& call) { return call.count == 1; });
}

bool Glm5NextModel::is_decode_step(std::span<const CallRows> calls) {
  return calls.size() > 1 && one_token_each(calls);
}

void Glm5NextModel::kda_block(Workspace& ws, const KdaWeights& w, int64_t layer, std::span<const CallRows> calls,
                              const float* x, int64_t T, float* out) {
  const Glm5NextConfig& c = config_;
  const int64_t H = c.linear_num_heads, Dh = c.linear_head_dim, C = H * Dh, K = c.linear_conv_kernel_dim;
  const Workspace::Frame frame(ws);
  float* q_in = ws.floats(T * C);
  float* k_in = ws.floats(T * C);
  float* v_in = ws.floats(T * C);
  float* f_low = ws.floats(T * Dh);
  float* beta = ws.floats(T * H);
  float* gate_low = ws.floats(T * Dh);
  {
    // Every projection of x at once (the backend may run them as one pass); the forget gate's and the output
    // gate's low ranks and the write strength are used below.
    const ProfileScope part(profile_, backend_, "kda projections");
    const LinearWeight* weights[] = {&w.q_proj, &w.k_proj, &w.v_proj, &w.f_a_proj, &w.b_proj, &w.g_a_proj};
    float* const outputs[] = {q_in, k_in, v_in, f_low, beta, gate_low};
    backend_.linears(x, T, weights, outputs);
  }
  const float lower_bound = c.linear_lower_bound ? static_cast<float>(*c.linear_lower_bound) : 0.0f;
  if (one_token_each(calls)) {
    // A decode step: everything up to o_proj as one backend op.
    float* gated = ws.floats(T * C);
    {
      const ProfileScope part(profile_, backend_, "kda convolution and recurrence");
      std::vector<float*> conv_states, states;
      for (const CallRows& call : calls) {
        conv_states.push_back(call.sequence->kda(layer).conv.data());
        states.push_back(call.sequence->kda(layer).recurrent.data());
      }
      backend_.kda_decode_steps(KdaDecodeArgs{.num_sequences = T, .num_heads = H, .head_dim = Dh, .conv_kernel = K,
                                              .q_in = q_in, .k_in = k_in, .v_in = v_in, .q_conv = w.q_conv.data(),
                                              .k_conv = w.k_conv.data(), .v_conv = w.v_conv.data(), .f_low = f_low,
                                              .f_b_proj = &w.f_b_proj, .a_log = w.a_log.data(),
                                              .dt_bias = w.dt_bias.data(),
                                              .lower_bound = c.linear_lower_bound ? &lower_bound : nullptr,
                                              .beta = beta, .gate_low = gate_low, .g_b_proj = &w.g_b_proj,
                                              .o_norm = w.o_norm.data(), .eps = static_cast<float>(c.rms_norm_eps),
                                              .work = ws.floats(7 * T * C), .out = gated},
                                conv_states, states);
    }
    const ProfileScope part(profile_, backend_, "kda projections");
    backend_.linear(gated, T, w.o_proj, out);
    return;
  }

  float* q = ws.floats(T * C);
  float* k = ws.floats(T * C);
  float* v = ws.floats(T * C);
  for (const CallRows& call : calls) {
    const ProfileScope part(profile_, backend_, "kda convolution");
    float* conv_state = call.sequence->kda(layer).conv.data();  // [3, K-1, C]
    const int64_t r = call.offset * C;
    backend_.causal_conv_silu(q_in + r, call.count, C, K, w.q_conv.data(), conv_state, q + r);
    backend_.causal_conv_silu(k_in + r, call.count, C, K, w.k_conv.data(), conv_state + (K - 1) * C, k + r);
    backend_.causal_conv_silu(v_in + r, call.count, C, K, w.v_conv.data(), conv_state + 2 * (K - 1) * C, v + r);
  }

  // Forget gate g [T, H, Dh] (log-decay per key channel) and write strength beta [T, H].
  float* f = ws.floats(T * C);
  float* g = ws.floats(T * C);
  {
    const ProfileScope part(profile_, backend_, "kda projections");
    backend_.linear(f_low, T, w.f_b_proj, f);
    backend_.kda_gate(f, T, H, Dh, w.a_log.data(), w.dt_bias.data(), c.linear_lower_bound ? &lower_bound : nullptr,
                      g);
    backend_.sigmoid(beta, T * H);
  }

  float* attended = ws.floats(T * C);
  for (const CallRows& call : calls) {
    const ProfileScope part(profile_, backend_, "kda recurrence");
    const int64_t r = call.offset * C;
    const KdaArgs args{.num_tokens = call.count, .num_heads = H, .head_dim = Dh, .q = q + r, .k = k + r,
                       .v = v + r, .g = g + r, .beta = beta + call.offset * H,
                       .state = call.sequence->kda(layer).recurrent.data(), .out = attended + r};
    if (call.count == 1) {
      backend_.kda_recurrent(args);
    } else {
      backend_.kda_chunked(args, 64);
    }
  }

  // Output gate: per-head RMSNorm of the attended values times sigmoid(g_b(g_a(x))), then o_proj.
  float* gate = ws.floats(T * C);
  float* gated = ws.floats(T * C);
  const ProfileScope part(profile_, backend_, "kda projections");
  backend_.linear(gate_low, T, w.g_b_proj, gate);
  backend_.gated_rms_norm(attended, gate, T * H, Dh, w.o_norm.data(), static_cast<float>(c.rms_norm_eps), gated);
  backend_.linear(gated, T, w.o_proj, out);
}

void Glm5NextModel::mla_block(Workspace& ws, const MlaWeights& w, int64_t layer, std::span<const CallRows> calls,
                              const float* x, int64_t T, Selection& selection, float* out) {
  const Glm5NextConfig& c = config_;
  const int64_t H = c.num_attention_heads, rank = c.kv_lora_rank;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const Workspace::Frame frame(ws);

  const IndexerWeights* ix = w.indexer ? &*w.indexer : nullptr;
  const int64_t IH = c.index_n_heads, dim = c.index_head_dim;
  float* q_low = ws.floats(T * c.q_lora_rank);
  float* q_resid = ws.floats(T * c.q_lora_rank);
  float* query = ws.floats(T * H * c.qk_head_dim);
  // The cached latent: c = RMSNorm(kv_a_proj x), one row of kv_lora_rank per token.
  float* kv_low = ws.floats(T * rank);
  // The indexer's: keys, their pools' compression gates, per-head weights (of x) and queries (of the normed q latent).
  float* keys = ix ? ws.floats(T * dim) : nullptr;
  float* gates = ix ? ws.floats(T * dim) : nullptr;
  float* iw = ix ? ws.floats(T * IH) : nullptr;
  float* iq = ix ? ws.floats(T * IH * dim) : nullptr;
  {
    // Two passes of products: every product of x, then those of the normed q latent (the norm inside them).
    const ProfileScope part(profile_, backend_, "mla projections");
    const LinearWeight* x_weights[] = {&w.q_a_proj, &w.kv_a_proj, ix ? &ix->wk : nullptr,
                                       ix ? &ix->compress_gate : nullptr, ix ? &ix->weights_proj : nullptr};
    float* const x_outputs[] = {q_low, kv_low, keys, gates, iw};
    const size_t x_count = ix ? 5 : 2;
    backend_.linears(x, T, std::span(x_weights, x_count), std::span(x_outputs, x_count));
    const LinearWeight* q_weights[] = {&w.q_b_proj, ix ? &ix->wq_b : nullptr};
    float* const q_outputs[] = {query, iq};
    const size_t q_count = ix ? 2 : 1;
    backend_.norm_linears(q_low, T, w.q_a_norm.data(), eps, std::span(q_weights, q_count),
                          std::span(q_outputs, q_count), q_resid);
  }
  {
    // The pass's latents normed in one launch, then each call's into its cache in one write.
    const ProfileScope part(profile_, backend_, "mla cache appends");
    float* latents = ws.floats(T * rank);
    backend_.rms_norm(kv_low, T, rank, w.kv_a_norm.data(), eps, latents);
    for (const CallRows& call : calls) {
      PagedRows& cache = call.sequence->mla(layer).latents;
      backend_.write_rows(cache, cache.append_rows(call.count), latents + call.offset * rank, call.count);
    }
  }

  if (ix) {
    float* normed_keys = ws.floats(T * dim);
    {
      const ProfileScope part(profile_, backend_, "mla cache appends");
      backend_.layer_norm(keys, T, dim, ix->k_norm_weight.data(), ix->k_norm_bias.data(), 1e-6f, normed_keys);
    }
    for (const CallRows& call : calls) {
      const ProfileScope part(profile_, backend_, "mla cache appends");
      MlaLayerState& state = call.sequence->mla(layer);
      const int64_t row = call.offset * dim;
      backend_.write_rows(state.index_keys, state.index_keys.append_rows(call.count), normed_keys + row, call.count);
      backend_.write_rows(state.index_gates, state.index_gates.append_rows(call.count), gates + row, call.count);
      // Pools completed by these tokens are compressed once and kept: straight into the pooled cache's rows where
      // they fit its current block (a decode step's pool), else in one pass into the workspace and one write into
      // the blocks (a run a block at a time took 512 launches for an 8k prompt, 2.6 ms on an H100).
      const int64_t first = state.pooled_keys.size(), count = (call.start + call.count) / c.index_kpool - first;
      const int64_t block_rows = state.pooled_keys.pool().block_rows();
      if (count > 0 && count <= block_rows - first % block_rows) {
        const RowRun run = state.pooled_keys.append_run(count);
        backend_.kpool_compress(state.index_keys, state.index_gates, ix->compress_ape.data(), first, count,
                                c.index_kpool, run.rows);
      } else if (count > 0) {
        float* pooled = ws.floats(count * dim);
        backend_.kpool_compress(state.index_keys, state.index_gates, ix->compress_ape.data(), first, count,
                                c.index_kpool, pooled);
        backend_.write_rows(state.pooled_keys, state.pooled_keys.append_rows(count), pooled, count);
      }
    }
    for (const CallRows& call : calls) {
      const ProfileScope part(profile_, backend_, "dsa indexer select");
      backend_.indexer_select(IndexerArgs{.num_tokens = call.count,
                                          .start = call.start,
                                          .num_heads = IH,
                                          .head_dim = dim,
                                          .kpool = c.index_kpool,
                                          .topk_pools = c.index_topk / c.index_kpool,
                                          .select_tail = c.index_kpool_always_select_tail && c.index_kpool > 1,
                                          .query = iq + call.offset * IH * dim,
                                          .weights = iw + call.offset * IH,
                                          .weights_scale = 1.0f / std::sqrt(static_cast<float>(IH)),
                                          .pooled_keys = &call.sequence->mla(layer).pooled_keys,
                                          .positions = selection.positions + call.offset * selection.stride,
                                          .counts = selection.counts + call.offset,
                                          .positions_stride = selection.stride});
    }
    selection.made = true;
  }

  // A shared layer reuses the selection of the full layer before it (config validation guarantees there is one).
  require(selection.made, "DSA layer has no token selection to reuse");
  float* attended = ws.floats(T * H * c.v_head_dim);
  const auto attention_args = [&](int64_t offset, int64_t count, const PagedRows* latents) {
    return SparseMlaArgs{.num_tokens = count,
                         .num_heads = H,
                         .qk_head_dim = c.qk_head_dim,
                         .v_head_dim = c.v_head_dim,
                         .kv_lora_rank = rank,
                         .scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim)),
                         .query = query + offset * H * c.qk_head_dim,
                         .kv_b = &w.kv_b_proj,
                         .latents = latents,
                         .positions = selection.positions + offset * selection.stride,
                         .counts = selection.counts + offset,
                         .positions_stride = selection.stride,
                         .out = attended + offset * H * c.v_head_dim};
  };
  if (is_decode_step(calls)) {
    const ProfileScope part(profile_, backend_, "mla attention");
    std::vector<const PagedRows*> latents;
    for (const CallRows& call : calls) latents.push_back(&call.sequence->mla(layer).latents);
    backend_.sparse_mla_attention_steps(attention_args(0, T, nullptr), latents);
  } else {
    for (const CallRows& call : calls) {
      const ProfileScope part(profile_, backend_, "mla attention");
      backend_.sparse_mla_attention(attention_args(call.offset, call.count, &call.sequence->mla(layer).latents));
    }
  }
  const ProfileScope part(profile_, backend_, "mla projections");
  backend_.linear(attended, T, w.o_proj, out);
}

void Glm5NextModel::mlp_block(Workspace& ws, const MlpWeights& w, const float* x, int64_t T, float* out) {
  const int64_t I = w.gate_proj.out_features;
  const Workspace::Frame frame(ws);
  float* gate = ws.floats(T * I);
  float* up = ws.floats(T * I);
  float* hidden = ws.floats(T * I);
  const LinearWeight* weights[] = {&w.gate_proj, &w.up_proj};
  float* const outputs[] = {gate, up};
  backend_.linears(x, T, weights, outputs);
  backend_.swiglu_linear(gate, up, T, static_cast<float>(config_.swiglu_limit), w.down_proj, hidden, out);
}

// The shared expert runs first and the routed experts add into its output: its gate and up share the router's
// launch (one input), and its down projection's weights load while the router's top-k runs.
void Glm5NextModel::moe_block(Workspace& ws, const MoeWeights& w, const float* x, int64_t T, float* out) {
  const Glm5NextConfig& c = config_;
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok, D = c.hidden_size;
  const int64_t I = w.shared.gate_proj.out_features;
  const Workspace::Frame frame(ws);
  float* router_logits = ws.floats(T * E);
  float* shared_gate = ws.floats(T * I);
  float* shared_up = ws.floats(T * I);
  float* shared_hidden = ws.floats(T * I);
  float* expert_weights = ws.floats(T * k);
  int32_t* expert_ids = ws.int32s(T * k);
  std::optional<ProfileScope> part(std::in_place, profile_, backend_, "moe router and shared gate, up");
  const LinearWeight* weights[] = {&w.router, &w.shared.gate_proj, &w.shared.up_proj};
  float* const outputs[] = {router_logits, shared_gate, shared_up};
  backend_.linears(x, T, weights, outputs);
  backend_.route_experts(RouterArgs{.num_tokens = T,
                                    .num_experts = E,
                                    .top_k = k,
                                    .n_group = c.n_group,
                                    .topk_group = c.topk_group,
                                    .norm_topk_prob = c.norm_topk_prob,
                                    .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor),
                                    .logits = router_logits,
                                    .correction_bias = w.correction_bias.data(),
                                    .expert_ids = expert_ids,
                                    .expert_weights = expert_weights});
  part.emplace(profile_, backend_, "moe shared expert");
  backend_.swiglu_linear(shared_gate, shared_up, T, static_cast<float>(c.swiglu_limit), w.shared.down_proj,
                         shared_hidden, out);
  part.emplace(profile_, backend_, "moe routed experts");
  backend_.moe_experts(MoeArgs{.num_tokens = T,
                               .hidden = D,
                               .intermediate = c.moe_intermediate_size,
                               .top_k = k,
                               .swiglu_limit = static_cast<float>(c.swiglu_limit),
                               .x = x,
                               .experts = &w.experts,
                               .placed_experts = w.placed_experts.get(),
                               .expert_ids = expert_ids,
                               .expert_weights = expert_weights,
                               .out = out});
  part.reset();
  if (observer_ != nullptr) observe_experts(ws, w, x, T, expert_ids);
}

void Glm5NextModel::observe_experts(Workspace& ws, const MoeWeights& w, const float* x, int64_t T,
                                    const int32_t* expert_ids) {
  const int64_t D = config_.hidden_size, top_k = config_.num_experts_per_tok;
  std::vector<float> x_host(static_cast<size_t>(T * D));
  std::vector<int32_t> ids_host(static_cast<size_t>(T * top_k));
  backend_.copy_to_host(x_host.data(), x, x_host.size() * sizeof(float));
  backend_.copy_to_host(ids_host.data(), expert_ids, ids_host.size() * sizeof(int32_t));
  for (size_t e = 0; e < w.experts.size(); ++e) {
    const ExpertWeights& expert = w.experts[e];
    std::vector<float> rows;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        if (ids_host[static_cast<size_t>(t * top_k + j)] == static_cast<int32_t>(e)) {
          rows.insert(rows.end(), x_host.begin() + t * D, x_host.begin() + (t + 1) * D);
        }
      }
    }
    const auto n = static_cast<int64_t>(rows.size()) / D;
    if (n == 0) continue;
    const auto module = [](const LinearWeight& weight) {
      const std::string_view name = weight.name;
      return name.substr(0, name.rfind('.'));
    };
    observer_->observe(module(expert.gate), rows.data(), n, D);
    observer_->observe(module(expert.up), rows.data(), n, D);
    const int64_t I = expert.gate.out_features;
    const Workspace::Frame frame(ws);
    float* input = ws.floats(n * D);
    float* gate = ws.floats(n * I);
    float* up = ws.floats(n * I);
    float* hidden = ws.floats(n * I);
    backend_.copy_to_backend(input, rows.data(), rows.size() * sizeof(float));
    backend_.linear(input, n, expert.gate, gate);
    backend_.linear(input, n, expert.up, up);
    backend_.clamped_swiglu(gate, up, n, I, static_cast<float>(config_.swiglu_limit), hidden);
    std::vector<float> hidden_host(static_cast<size_t>(n * I));
    backend_.copy_to_host(hidden_host.data(), hidden, hidden_host.size() * sizeof(float));
    observer_->observe(module(expert.down), hidden_host.data(), n, I);
  }
}

}  // namespace kestrel
