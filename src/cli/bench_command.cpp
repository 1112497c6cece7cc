// `kestrel bench`: the model's own speed on this machine, without the HTTP server. For each context length: every
// sequence is prefilled with random tokens in chunks (prefill tokens/s), then for each concurrency S the first S
// sequences decode `--steps` tokens each, a step being one token of every sequence (decode tokens/s over all S, and
// ms per step). Alongside: the bytes one decoded token reads (the non-routed weights, top_k routed experts per MoE
// layer, the cache rows the indexer scores and attention reads, the KDA state) and what that is per second at one
// stream, against the backend's measured memory copy bandwidth. A decode step of S sequences is one batched forward
// pass (Glm5NextModel::forward_batch), as the engine runs it. --prefill-lengths times prefills of fresh sequences
// (tokens/s, and TFLOP/s by prefill_flops' count, to set against the GPU's tensor-core throughput). --draw greedy or
// sample ends each step as the engine does, with the next tokens drawn on the backend and fed back (by default the
// logits come back to the host and random tokens go in). With --profile,
// each measurement is followed by a profiled one: where a step's (or prompt's) time goes, by part of the model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/device_option.h"
#include "formats/dtype.h"
#include "model/glm5_next.h"

namespace kestrel::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The backend's memory bandwidth as a copy between two 256 MiB arrays sees it, read + write counted (the yardstick the
// bytes a decode step reads per second are compared with). Runs of copies are timed on the host, each ended by a
// synchronising read of one float; the rate is taken from the difference between a long and a short run, so that the
// synchronisation's fixed cost (about 15 % of one copy's time on an H200) does not count as copying time.
double copy_bandwidth(Backend& backend) {
  constexpr size_t kCount = size_t{1} << 26, kBytes = kCount * sizeof(float);
  constexpr int kShortRun = 2, kLongRun = 12, kTries = 2;
  float* from = backend.allocate_floats(kCount);
  float* to = backend.allocate_floats(kCount);
  backend.fill(from, static_cast<int64_t>(kCount), 1.0f);
  float probe = 0.0f;
  const auto run_seconds = [&](int copies) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < copies; ++i) backend.copy(to, from, kBytes);
    backend.copy_to_host(&probe, to, sizeof(float));
    return seconds_since(start);
  };
  run_seconds(1);  // first touch of the destination
  double short_run = 1e30, long_run = 1e30;
  for (int i = 0; i < kTries; ++i) {
    short_run = std::min(short_run, run_seconds(kShortRun));
    long_run = std::min(long_run, run_seconds(kLongRun));
  }
  backend.free_floats(from);
  backend.free_floats(to);
  return 2.0 * static_cast<double>(kBytes) * (kLongRun - kShortRun) / std::max(long_run - short_run, 1e-9);
}

// Bytes a linear reads per call: the stored matrix (EXL3 trellis and scales, or the dense elements and block scales).
double matrix_bytes(const LinearWeight& w) {
  if (w.exl3) {
    const Exl3Matrix& m = *w.exl3;
    return static_cast<double>(m.in_padded * m.out_padded * m.bits / 8 + 2 * (m.in_padded + m.out_padded));
  }
  double bytes = static_cast<double>(w.out_features * w.in_features) * static_cast<double>(dtype_size(w.dtype));
  if (w.scale != nullptr) {
    bytes += static_cast<double>((w.out_features + w.block_rows - 1) / w.block_rows *
                                 ((w.in_features + w.block_cols - 1) / w.block_cols) * dtype_size(w.scale_dtype));
  }
  return bytes;
}

// Weights in a matrix (the FLOPs of applying it to one token are twice that).
double matrix_params(const LinearWeight& w) { return static_cast<double>(w.out_features * w.in_features); }

// A per-matrix measure summed over the matrices one token goes through in the main layers: every non-routed matrix
// and top_k routed experts per MoE layer (not the embedding or the head).
template <typename Measure>
double layer_matrices(const Glm5NextModel& model, Measure&& measure) {
  const Glm5NextConfig& c = model.config();
  double sum = 0.0;
  const auto mlp = [&](const MlpWeights& w) { return measure(w.gate_proj) + measure(w.up_proj) + measure(w.down_proj); };
  for (const LayerWeights& layer : model.weights().layers) {
    sum += measure(layer.attn_hc.fn) + measure(layer.ffn_hc.fn);
    if (layer.type == LayerType::linear_attention) {
      const KdaWeights& k = layer.kda;
      for (const LinearWeight* m : {&k.q_proj, &k.k_proj, &k.v_proj, &k.f_a_proj, &k.f_b_proj, &k.b_proj, &k.g_a_proj,
                                    &k.g_b_proj, &k.o_proj}) {
        sum += measure(*m);
      }
    } else {
      const MlaWeights& m = layer.mla;
      for (const LinearWeight* x : {&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.o_proj}) sum += measure(*x);
      if (m.indexer) {
        for (const LinearWeight* x : {&m.indexer->wq_b, &m.indexer->wk, &m.indexer->weights_proj,
                                      &m.indexer->compress_gate}) {
          sum += measure(*x);
        }
      }
    }
    if (layer.mlp_type == MlpType::dense) {
      sum += mlp(layer.dense);
    } else {
      const ExpertWeights& e = layer.moe.experts.front();
      sum += measure(layer.moe.router) + mlp(layer.moe.shared) +
             static_cast<double>(c.num_experts_per_tok) * (measure(e.gate) + measure(e.up) + measure(e.down));
    }
  }
  return sum;
}

// Weight bytes one decoded token reads: the layers' matrices, the head, and one row of the embedding.
double weight_bytes_per_token(const Glm5NextModel& model) {
  const Glm5NextWeights& w = model.weights();
  return layer_matrices(model, matrix_bytes) + matrix_bytes(w.lm_head) +
         matrix_bytes(w.embed_tokens) / static_cast<double>(model.config().vocab_size);
}

// Positions a token at `position` attends to in a DSA layer: all before it up to the indexer's selection.
int64_t attended_positions(const Glm5NextConfig& c, int64_t position) {
  return std::min(position + 1, c.index_topk + c.index_kpool - 1);
}

// FLOPs of prefilling `length` tokens in chunks of `chunk`: per token twice the weights of the layers' matrices; per
// DSA layer the indexer's scores over the pooled keys and attention's scores and weighted sum over the attended
// latents, per head (the absorbed projections are kv_b_proj's weights, counted with the matrices); per KDA layer the
// state's decay, S·k, rank-one update and S·q (7 D² per head); and the head once per chunk (logits for its last token).
double prefill_flops(const Glm5NextModel& model, int64_t length, int64_t chunk) {
  const Glm5NextConfig& c = model.config();
  const double dsa_layers = static_cast<double>(c.num_sparse_attention_layers());
  const double kda_layers = static_cast<double>(c.num_linear_attention_layers());
  double flops = 2.0 * layer_matrices(model, matrix_params) * static_cast<double>(length);
  for (int64_t p = 0; p < length; ++p) {
    const double indexer = static_cast<double>((p + 1) / c.index_kpool * c.index_n_heads * c.index_head_dim);
    const double attention = static_cast<double>(attended_positions(c, p) * c.num_attention_heads * c.kv_lora_rank);
    flops += dsa_layers * 2.0 * (indexer + 2.0 * attention);
  }
  flops += kda_layers * 7.0 * static_cast<double>(c.linear_head_dim * c.linear_head_dim * c.linear_num_heads * length);
  flops += 2.0 * matrix_params(model.weights().lm_head) * static_cast<double>((length + chunk - 1) / chunk);
  return flops;
}

// Cache and state bytes one decoded token reads at `context` tokens: per DSA layer the pooled keys the indexer
// scores (float32) and the latents attention reads (rows of `latent_dtype`); the KDA state, read and written.
double cache_bytes_per_token(const Glm5NextConfig& c, int64_t context, CacheDtype latent_dtype) {
  const double dsa_layers = static_cast<double>(
      std::count(c.layer_types.begin(), c.layer_types.end(), LayerType::sparse_attention));
  const int64_t attended = attended_positions(c, context - 1);
  const int64_t latent_row = RowFormat{.dtype = latent_dtype, .width = c.kv_lora_rank}.row_bytes();
  const double per_layer =
      static_cast<double>(4 * (context / c.index_kpool) * c.index_head_dim + attended * latent_row);
  return dsa_layers * per_layer + 8.0 * static_cast<double>(SequenceState::kda_state_size(c));
}

// A profile as ms per `unit` (a decode step, a prompt) by part, largest first, with each part's share of the
// profiled total.
void print_profile(const ForwardProfile& profile, int64_t units, const char* unit) {
  std::vector<ForwardProfile::Part> parts = profile.parts;
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  const double total = profile.total_seconds(), n = static_cast<double>(units);
  std::printf("    profile (synchronised parts): %.3f ms per %s\n", total * 1e3 / n, unit);
  for (const ForwardProfile::Part& part : parts) {
    std::printf("    %-32s %8.3f ms per %s %5.1f %%  (runs %lld times a %s)\n", part.name.c_str(),
                part.seconds * 1e3 / n, unit, 100.0 * part.seconds / total,
                static_cast<long long>(part.count / units), unit);
  }
}

std::vector<int32_t> random_prompt(const Glm5NextConfig& c, int64_t length, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t& id : prompt) id = token(rng);
  return prompt;
}

// Prefills `sequence` with `prompt` in chunks (logits for each chunk's last token only); returns the seconds it took.
double prefill(Glm5NextModel& model, SequenceState& sequence, std::span<const int32_t> prompt, int64_t chunk,
               ForwardProfile* profile = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t begin = 0; begin < prompt.size(); begin += static_cast<size_t>(chunk)) {
    const size_t n = std::min(prompt.size() - begin, static_cast<size_t>(chunk));
    (void)model.forward(sequence, prompt.subspan(begin, n), {.all_logits = false, .profile = profile});
  }
  return seconds_since(start);
}

// A prefill of a fresh sequence with a random prompt of `length` tokens.
double prefill_new(Glm5NextModel& model, int64_t length, int64_t chunk, std::mt19937& rng,
                   ForwardProfile* profile = nullptr) {
  const std::vector<int32_t> prompt = random_prompt(model.config(), length, rng);
  return prefill(model, *model.new_sequence(), prompt, chunk, profile);
}

}  // namespace

Action add_bench_command(CLI::App& app) {
  struct Options {
    std::string model, device = "auto", draw = "logits", kv_cache_dtype = "auto", dtype = "auto";
    std::vector<int64_t> contexts{1024}, sequences{1, 4}, prefill_lengths;
    int64_t steps = 32, chunk = 2048;
    uint32_t seed = 1;
    bool profile = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed of a model on this machine (no server)");
  cmd->add_option("--model", o->model, "Checkpoint directory")->required();
  add_device_option(cmd, o->device);
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_dtype_option(cmd, o->dtype);
  cmd->add_option("--contexts", o->contexts, "Context lengths to decode at (prompt tokens), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--sequences", o->sequences, "Concurrent sequences to decode, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--prefill-lengths", o->prefill_lengths,
                 "Prompt lengths to time a prefill of (one new sequence each, after one untimed prefill of the "
                 "first), comma-separated; none by default")
      ->delimiter(',');
  cmd->add_option("--steps", o->steps, "Decode steps per measurement")->capture_default_str();
  cmd->add_option("--prefill-chunk", o->chunk, "Tokens per prefill forward call")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random tokens")->capture_default_str();
  cmd->add_option("--draw", o->draw,
                  "What a decode step ends with: `logits` (every sequence's logits copied to the host, random tokens "
                  "fed next), `greedy` or `sample` (temperature 1, top_p 0.95): the next tokens drawn on the backend "
                  "and fed back, as the engine does for requests without penalties or logprobs")
      ->check(CLI::IsMember({"logits", "greedy", "sample"}))
      ->capture_default_str();
  cmd->add_flag("--profile", o->profile,
                "After each decode measurement, as many steps again with the time of each part of the model "
                "(each part synchronised, so the parts add up to more than a step)");
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    require(o->steps >= 1, "--steps must be at least 1");
    require(o->chunk >= 1, "--prefill-chunk must be at least 1");
    require(!o->contexts.empty() && std::all_of(o->contexts.begin(), o->contexts.end(), [](int64_t n) { return n >= 1; }),
            "--contexts must be positive");
    require(std::all_of(o->prefill_lengths.begin(), o->prefill_lengths.end(), [](int64_t n) { return n >= 1; }),
            "--prefill-lengths must be positive");
    require(!o->sequences.empty() &&
                std::all_of(o->sequences.begin(), o->sequences.end(), [](int64_t n) { return n >= 1 && n <= 1024; }),
            "--sequences must be in [1, 1024]");
    const CacheDtype kv_cache_dtype = parse_kv_cache_dtype(o->kv_cache_dtype);
    const ProductInput product_input = parse_dtype(o->dtype);
    const auto backend = make_backend(o->device, product_input);
    const auto model = Glm5NextModel::load(o->model, *backend, kv_cache_dtype);
    const Glm5NextConfig& c = model->config();
    std::mt19937 rng(o->seed);
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size - 1));
    const double weights = weight_bytes_per_token(*model);
    const double bandwidth = copy_bandwidth(*backend);
    std::printf("%s memory copy bandwidth (read + write, 256 MiB arrays): %.0f GB/s\n",
                std::string(backend->name()).c_str(), bandwidth / 1e9);
    std::printf("model %s on %s: %.2f MB of weights read per decoded token\n", o->model.c_str(),
                std::string(backend->name()).c_str(), weights / 1e6);
    if (!o->prefill_lengths.empty()) (void)prefill_new(*model, o->prefill_lengths.front(), o->chunk, rng);
    for (const int64_t length : o->prefill_lengths) {
      const double seconds = prefill_new(*model, length, o->chunk, rng);
      const double flops = prefill_flops(*model, length, o->chunk);
      std::printf("prefill of %lld tokens (chunks of %lld): %.1f tokens/s, %.3f s, %.2f TFLOP/s (%.2f GFLOP per "
                  "token)\n",
                  static_cast<long long>(length), static_cast<long long>(o->chunk),
                  static_cast<double>(length) / seconds, seconds, flops / seconds / 1e12,
                  flops / static_cast<double>(length) / 1e9);
      if (o->profile) {
        ForwardProfile profile;
        (void)prefill_new(*model, length, o->chunk, rng, &profile);
        print_profile(profile, 1, "prompt");
      }
    }
    const int64_t most = *std::max_element(o->sequences.begin(), o->sequences.end());
    for (const int64_t context : o->contexts) {
      std::vector<std::unique_ptr<SequenceState>> sequences;
      double prefill_seconds = 0.0;
      for (int64_t s = 0; s < most; ++s) {
        sequences.push_back(model->new_sequence());
        prefill_seconds += prefill(*model, *sequences.back(), random_prompt(c, context, rng), o->chunk);
      }
      const double cache = cache_bytes_per_token(c, context, kv_cache_dtype);
      std::printf("context %lld: prefill %.1f tokens/s (%lld sequences of %lld tokens, chunks of %lld); cache and "
                  "state read per decoded token %.2f MB\n",
                  static_cast<long long>(context), static_cast<double>(most * context) / prefill_seconds,
                  static_cast<long long>(most), static_cast<long long>(context), static_cast<long long>(o->chunk),
                  cache / 1e6);
      for (const auto& sequence : sequences) {  // warm-up: the first decode step of each sequence is not timed
        const int32_t next = token(rng);
        (void)model->forward(*sequence, std::span(&next, 1), {.all_logits = false});
      }
      for (const int64_t count : o->sequences) {
        std::vector<int32_t> next(static_cast<size_t>(count));
        std::vector<SequenceCall> calls(static_cast<size_t>(count));
        std::vector<BackendDraw> draws(static_cast<size_t>(count));
        std::uniform_real_distribution<double> unit;
        for (int32_t& id : next) id = token(rng);
        const auto decode = [&](ForwardProfile* profile) {
          for (int64_t step = 0; step < o->steps; ++step) {
            for (size_t s = 0; s < calls.size(); ++s) {
              BackendDraw* draw = nullptr;
              if (o->draw == "logits") {
                next[s] = token(rng);
              } else {
                draws[s].draw = o->draw == "greedy" ? TokenDraw{.temperature = 0.0f}
                                                    : TokenDraw{.top_p = 0.95f, .u = unit(rng)};
                draw = &draws[s];
              }
              calls[s] = SequenceCall{.sequence = sequences[s].get(), .tokens = std::span(&next[s], 1), .draw = draw};
            }
            (void)model->forward_batch(calls, {.all_logits = false, .profile = profile});
            if (o->draw != "logits") {
              for (size_t s = 0; s < calls.size(); ++s) next[s] = draws[s].token;
            }
          }
        };
        const auto start = std::chrono::steady_clock::now();
        decode(nullptr);
        const double elapsed = seconds_since(start);
        const double step_seconds = elapsed / static_cast<double>(o->steps);
        std::printf("  decode, %lld sequences: %.1f tokens/s, %.3f ms per step", static_cast<long long>(count),
                    static_cast<double>(count * o->steps) / elapsed, step_seconds * 1e3);
        if (count == 1) {
          const double rate = (weights + cache) / step_seconds;
          std::printf(", %.1f GB/s of weights, cache and state (%.0f %% of the copy bandwidth)", rate / 1e9,
                      100.0 * rate / bandwidth);
        }
        std::printf("\n");
        if (o->profile) {
          ForwardProfile profile;
          decode(&profile);
          print_profile(profile, o->steps, "step");
        }
      }
    }
    return 0;
  };
}

}  // namespace kestrel::cli
