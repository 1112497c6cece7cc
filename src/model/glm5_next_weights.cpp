#include "model/glm5_next_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <set>

#include "base/error.h"
#include "base/log.h"
#include "base/numeric.h"
#include "formats/exl3_tensors.h"

namespace kestrel {

namespace {

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

bool is_float_dtype(DType dtype) { return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16; }

// Binds tensors by name and records which ones were used, so that leftovers can be reported.
class Binder {
public:
  Binder(const Checkpoint& checkpoint, const Glm5NextConfig& config) : checkpoint_(checkpoint), config_(config) {
    if (config.quantization && config.quantization->quant_method == "fp8") {
      block_rows_ = config.quantization->fp8_block_rows;
      block_cols_ = config.quantization->fp8_block_cols;
    }
  }

  const TensorView& tensor(const std::string& name) {
    const TensorView* view = checkpoint_.find(name);
    if (!view) fail("{}: tensor '{}' is missing (required by {})", checkpoint_.dir(), name, config_.source);
    used_.insert(name);
    return *view;
  }

  bool has(const std::string& name) const { return checkpoint_.find(name) != nullptr; }

  void expect_shape(const TensorView& view, const std::vector<int64_t>& shape) {
    if (view.shape != shape) {
      fail("{}: tensor '{}' has shape {} but {} implies {}", *view.path, view.name, shape_string(view.shape),
           config_.source, shape_string(shape));
    }
  }

  // A matrix [rows, cols]: f32/f16/bf16, fp8 e4m3 with its `weight_scale_inv` block scales, or EXL3 (for a name
  // `<module>.weight` that is absent while `<module>.trellis` is present).
  LinearWeight matrix(const std::string& name, int64_t rows, int64_t cols) {
    if (name.ends_with(".weight")) {
      const std::string module = name.substr(0, name.size() - 7);
      if (has(module + ".trellis")) {
        if (has(name)) {
          fail("{}: module '{}' has both '{}' and an EXL3 trellis", *checkpoint_.find(name)->path, module, name);
        }
        return exl3_matrix(module, rows, cols);
      }
    }
    const TensorView& view = tensor(name);
    expect_shape(view, {rows, cols});
    LinearWeight weight{.name = name, .dtype = view.dtype, .out_features = rows, .in_features = cols, .data = view.data};
    const std::string scale_name = name + "_scale_inv";
    if (view.dtype == DType::f8_e4m3) {
      if (block_rows_ <= 0) {
        fail("{}: tensor '{}' is F8_E4M3 but {} has no fp8 quantization_config with weight_block_size", *view.path,
             name, config_.source);
      }
      if (!has(scale_name)) fail("{}: tensor '{}' is F8_E4M3 but its block scale '{}' is missing", *view.path, name, scale_name);
      const TensorView& scale = tensor(scale_name);
      expect_shape(scale, {(rows + block_rows_ - 1) / block_rows_, (cols + block_cols_ - 1) / block_cols_});
      if (scale.dtype != DType::f32 && scale.dtype != DType::bf16) {
        fail("{}: tensor '{}' has dtype {}; block scales must be F32 or BF16", *scale.path, scale_name,
             dtype_name(scale.dtype));
      }
      weight.scale = scale.data;
      weight.scale_dtype = scale.dtype;
      weight.block_rows = block_rows_;
      weight.block_cols = block_cols_;
    } else if (!is_float_dtype(view.dtype)) {
      fail("{}: tensor '{}' has dtype {}; expected F32, F16, BF16 or F8_E4M3", *view.path, name,
           dtype_name(view.dtype));
    } else if (has(scale_name)) {
      fail("{}: tensor '{}' has a block scale '{}' but is {}, not F8_E4M3", *view.path, name, scale_name,
           dtype_name(view.dtype));
    }
    return weight;
  }

  // An EXL3 linear (formats/exl3_tensors.h), bound in place like any other matrix.
  LinearWeight exl3_matrix(const std::string& module, int64_t rows, int64_t cols) {
    const TensorView& trellis = tensor(module + ".trellis");
    if (!config_.quantization || config_.quantization->quant_method != "exl3") {
      fail("{}: module '{}' is stored as EXL3 but {} has no quantization_config with quant_method \"exl3\"",
           *trellis.path, module, config_.source);
    }
    const Exl3Tensors t = read_exl3_tensors(
        [this](const std::string& name) {
          const TensorView* view = checkpoint_.find(name);
          if (view) used_.insert(name);
          return view;
        },
        module, rows, cols);
    return exl3_linear_weight(module, t, rows, cols);
  }

  // A small float tensor of the given shape, converted to float32.
  std::vector<float> vector(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView& view = tensor(name);
    expect_shape(view, shape);
    if (!is_float_dtype(view.dtype)) {
      fail("{}: tensor '{}' has dtype {}; expected F32, F16 or BF16", *view.path, name, dtype_name(view.dtype));
    }
    std::vector<float> values(static_cast<size_t>(view.numel()));
    const size_t element = dtype_size(view.dtype);
    for (size_t i = 0; i < values.size(); ++i) {
      const std::byte* p = view.data + i * element;
      if (view.dtype == DType::f32) {
        std::memcpy(&values[i], p, 4);
      } else {
        uint16_t bits;
        std::memcpy(&bits, p, 2);
        values[i] = view.dtype == DType::bf16 ? bf16_to_f32(bits) : f16_to_f32(bits);
      }
    }
    return values;
  }

  const std::set<std::string>& used() const { return used_; }

private:
  const Checkpoint& checkpoint_;
  const Glm5NextConfig& config_;
  std::set<std::string> used_;
  int64_t block_rows_ = 0, block_cols_ = 0;
};

MhcWeights bind_mhc(Binder& b, const std::string& prefix, const std::string& site, const Glm5NextConfig& c) {
  const int64_t mix = (2 + c.hc_mult) * c.hc_mult;
  return MhcWeights{.fn = b.matrix(prefix + "hc_" + site + "_fn", mix, c.hc_mult * c.hidden_size),
                    .base = b.vector(prefix + "hc_" + site + "_base", {mix}),
                    .scale = b.vector(prefix + "hc_" + site + "_scale", {3})};
}

KdaWeights bind_kda(Binder& b, const std::string& p, const Glm5NextConfig& c) {
  const int64_t D = c.hidden_size, Dh = c.linear_head_dim, C = c.linear_num_heads * c.linear_head_dim;
  const int64_t K = c.linear_conv_kernel_dim;
  auto conv = [&](const std::string& name) {
    std::vector<float> taps = b.vector(p + name + ".weight", {C, 1, K});
    return taps;
  };
  return KdaWeights{.q_proj = b.matrix(p + "q_proj.weight", C, D),
                    .k_proj = b.matrix(p + "k_proj.weight", C, D),
                    .v_proj = b.matrix(p + "v_proj.weight", C, D),
                    .q_conv = conv("q_conv1d"),
                    .k_conv = conv("k_conv1d"),
                    .v_conv = conv("v_conv1d"),
                    .f_a_proj = b.matrix(p + "f_a_proj.weight", Dh, D),
                    .f_b_proj = b.matrix(p + "f_b_proj.weight", C, Dh),
                    .a_log = b.vector(p + "A_log", {c.linear_num_heads}),
                    .dt_bias = b.vector(p + "dt_bias", {C}),
                    .b_proj = b.matrix(p + "b_proj.weight", c.linear_num_heads, D),
                    .g_a_proj = b.matrix(p + "g_a_proj.weight", Dh, D),
                    .g_b_proj = b.matrix(p + "g_b_proj.weight", C, Dh),
                    .o_norm = b.vector(p + "o_norm.weight", {Dh}),
                    .o_proj = b.matrix(p + "o_proj.weight", D, C)};
}

MlaWeights bind_mla(Binder& b, const std::string& p, const Glm5NextConfig& c, bool with_indexer) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  MlaWeights w{.q_a_proj = b.matrix(p + "q_a_proj.weight", c.q_lora_rank, D),
               .q_a_norm = b.vector(p + "q_a_layernorm.weight", {c.q_lora_rank}),
               .q_b_proj = b.matrix(p + "q_b_proj.weight", H * c.qk_head_dim, c.q_lora_rank),
               .kv_a_proj = b.matrix(p + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, D),
               .kv_a_norm = b.vector(p + "kv_a_layernorm.weight", {c.kv_lora_rank}),
               .kv_b_proj = b.matrix(p + "kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
               .o_proj = b.matrix(p + "o_proj.weight", D, H * c.v_head_dim),
               .indexer = std::nullopt};
  if (with_indexer) {
    const std::string q = p + "indexer.";
    const int64_t dim = c.index_head_dim;
    w.indexer = IndexerWeights{.wq_b = b.matrix(q + "wq_b.weight", c.index_n_heads * dim, c.q_lora_rank),
                               .wk = b.matrix(q + "wk.weight", dim, D),
                               .k_norm_weight = b.vector(q + "k_norm.weight", {dim}),
                               .k_norm_bias = b.vector(q + "k_norm.bias", {dim}),
                               .weights_proj = b.matrix(q + "weights_proj.weight", c.index_n_heads, D),
                               .compress_ape = b.vector(q + "index_kpool_compress_ape", {c.index_kpool, dim}),
                               .compress_gate = b.matrix(q + "index_kpool_compress_gate", dim, D)};
  }
  return w;
}

MlpWeights bind_mlp(Binder& b, const std::string& p, int64_t hidden, int64_t intermediate) {
  return MlpWeights{.gate_proj = b.matrix(p + "gate_proj.weight", intermediate, hidden),
                    .up_proj = b.matrix(p + "up_proj.weight", intermediate, hidden),
                    .down_proj = b.matrix(p + "down_proj.weight", hidden, intermediate)};
}

MoeWeights bind_moe(Binder& b, const std::string& p, const Glm5NextConfig& c) {
  const int64_t D = c.hidden_size, I = c.moe_intermediate_size;
  MoeWeights w{.router = b.matrix(p + "gate.weight", c.n_routed_experts, D),
               .correction_bias = b.vector(p + "gate.e_score_correction_bias", {c.n_routed_experts}),
               .experts = {},
               .placed_experts = nullptr,
               .shared = bind_mlp(b, p + "shared_experts.", D, I * c.n_shared_experts)};
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const std::string q = fmt::format("{}experts.{}.", p, e);
    w.experts.push_back(ExpertWeights{.gate = b.matrix(q + "gate_proj.weight", I, D),
                                      .up = b.matrix(q + "up_proj.weight", I, D),
                                      .down = b.matrix(q + "down_proj.weight", D, I)});
  }
  return w;
}

}  // namespace

Glm5NextWeights bind_glm5_next_weights(const Checkpoint& checkpoint, const Glm5NextConfig& config) {
  Binder b(checkpoint, config);
  const Glm5NextConfig& c = config;
  // Multimodal checkpoints nest the text model under model.language_model; text-only ones use model.
  const std::string root = b.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";

  Glm5NextWeights w;
  w.embed_tokens = b.matrix(root + "embed_tokens.weight", c.vocab_size, c.hidden_size);
  w.final_norm = b.vector(root + "norm.weight", {c.hidden_size});
  if (b.has("lm_head.weight") || !c.tie_word_embeddings) {
    w.lm_head = b.matrix("lm_head.weight", c.vocab_size, c.hidden_size);
  } else {
    w.lm_head = w.embed_tokens;
  }

  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("{}layers.{}.", root, i);
    LayerWeights layer{.type = c.layer_types[static_cast<size_t>(i)],
                       .mlp_type = c.mlp_layer_types[static_cast<size_t>(i)],
                       .input_norm = b.vector(p + "input_layernorm.weight", {c.hidden_size}),
                       .post_attention_norm = b.vector(p + "post_attention_layernorm.weight", {c.hidden_size}),
                       .attn_hc = bind_mhc(b, p, "attn", c),
                       .ffn_hc = bind_mhc(b, p, "ffn", c),
                       .kda = {},
                       .mla = {},
                       .dense = {},
                       .moe = {}};
    if (layer.type == LayerType::linear_attention) {
      layer.kda = bind_kda(b, p + "self_attn.", c);
    } else {
      const bool full = c.indexer_types[static_cast<size_t>(i)] == IndexerType::full;
      layer.mla = bind_mla(b, p + "self_attn.", c, full);
    }
    if (layer.mlp_type == MlpType::dense) {
      layer.dense = bind_mlp(b, p + "mlp.", c.hidden_size, c.intermediate_size);
    } else {
      layer.moe = bind_moe(b, p + "mlp.", c);
    }
    w.layers.push_back(std::move(layer));
  }

  for (int64_t n = 0; n < c.num_nextn_predict_layers; ++n) {
    const std::string p = fmt::format("{}layers.{}.", root, c.num_hidden_layers + n);
    MtpLayerWeights mtp{.enorm = b.vector(p + "enorm.weight", {c.hidden_size}),
                        .hnorm = b.vector(p + "hnorm.weight", {c.hidden_size}),
                        .shared_head_norm = b.vector(p + "shared_head.norm.weight", {c.hidden_size}),
                        .input_norm = b.vector(p + "input_layernorm.weight", {c.hidden_size}),
                        .post_attention_norm = b.vector(p + "post_attention_layernorm.weight", {c.hidden_size}),
                        .eh_proj = b.matrix(p + "eh_proj.weight", c.hidden_size, 2 * c.hidden_size),
                        .mla = bind_mla(b, p + "self_attn.", c, true),
                        .mlp_type = b.has(p + "mlp.gate.weight") ? MlpType::sparse : MlpType::dense,
                        .dense = {},
                        .moe = {}};
    if (mtp.mlp_type == MlpType::sparse) {
      mtp.moe = bind_moe(b, p + "mlp.", c);
    } else {
      mtp.dense = bind_mlp(b, p + "mlp.", c.hidden_size, c.intermediate_size);
    }
    // DeepSeek-style MTP layers may carry their own copies of the embedding and head; they equal the shared ones.
    if (b.has(p + "embed_tokens.weight")) b.matrix(p + "embed_tokens.weight", c.vocab_size, c.hidden_size);
    if (b.has(p + "shared_head.head.weight")) b.matrix(p + "shared_head.head.weight", c.vocab_size, c.hidden_size);
    w.mtp_layers.push_back(std::move(mtp));
  }

  // Every tensor must be accounted for: bound above, or the vision tower, which a text-only forward skips.
  std::vector<std::string> unknown;
  for (const std::string& name : checkpoint.names()) {
    if (b.used().count(name)) continue;
    if (name.rfind("model.visual.", 0) == 0 && c.has_vision_config) {
      ++w.num_vision_tensors_skipped;
      continue;
    }
    unknown.push_back(name);
  }
  if (!unknown.empty()) {
    const TensorView& first = *checkpoint.find(unknown.front());
    fail("{}: tensor '{}' is not part of the glm5_next model described by {}{}", *first.path, unknown.front(),
         config.source,
         unknown.size() > 1 ? fmt::format(" ({} more unknown tensors)", unknown.size() - 1) : std::string());
  }
  if (w.num_vision_tensors_skipped > 0) {
    log_info("vision tower: {} tensors recognised and skipped (text-only forward)", w.num_vision_tensors_skipped);
  }
  return w;
}

namespace {

void place_mhc(MhcWeights& w, Backend& backend) {
  backend.place(w.fn);
  backend.place(w.base);
  backend.place(w.scale);
}

void place_mlp(MlpWeights& w, Backend& backend) {
  for (LinearWeight* m : {&w.gate_proj, &w.up_proj, &w.down_proj}) backend.place(*m);
}

void place_kda(KdaWeights& w, Backend& backend) {
  for (LinearWeight* m : {&w.q_proj, &w.k_proj, &w.v_proj, &w.f_a_proj, &w.f_b_proj, &w.b_proj, &w.g_a_proj,
                          &w.g_b_proj, &w.o_proj}) {
    backend.place(*m);
  }
  for (WeightVector* v : {&w.q_conv, &w.k_conv, &w.v_conv, &w.a_log, &w.dt_bias, &w.o_norm}) backend.place(*v);
}

void place_mla(MlaWeights& w, const Glm5NextConfig& c, Backend& backend) {
  for (LinearWeight* m : {&w.q_a_proj, &w.q_b_proj, &w.kv_a_proj, &w.o_proj}) backend.place(*m);
  backend.place(w.q_a_norm);
  backend.place(w.kv_a_norm);
  backend.place_attention_kv_b(w.kv_b_proj, c.num_attention_heads, c.qk_head_dim, c.v_head_dim);
  if (w.indexer) {
    IndexerWeights& ix = *w.indexer;
    for (LinearWeight* m : {&ix.wq_b, &ix.wk, &ix.weights_proj, &ix.compress_gate}) backend.place(*m);
    for (WeightVector* v : {&ix.k_norm_weight, &ix.k_norm_bias, &ix.compress_ape}) backend.place(*v);
  }
}

}  // namespace

void place_glm5_next_weights(Glm5NextWeights& w, const Glm5NextConfig& c, Backend& backend) {
  backend.place(w.embed_tokens);
  backend.place(w.lm_head);
  backend.place(w.final_norm);
  for (LayerWeights& layer : w.layers) {
    backend.place(layer.input_norm);
    backend.place(layer.post_attention_norm);
    place_mhc(layer.attn_hc, backend);
    place_mhc(layer.ffn_hc, backend);
    if (layer.type == LayerType::linear_attention) {
      place_kda(layer.kda, backend);
    } else {
      place_mla(layer.mla, c, backend);
    }
    if (layer.mlp_type == MlpType::dense) {
      place_mlp(layer.dense, backend);
    } else {
      backend.place(layer.moe.router);
      backend.place(layer.moe.correction_bias);
      layer.moe.placed_experts = backend.place_experts(layer.moe.experts);
      place_mlp(layer.moe.shared, backend);
    }
  }
}

}  // namespace kestrel
