#include "engine/engine_core.h"

#include <algorithm>
#include <exception>
#include <random>

#include "base/error.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "engine/sampler.h"

namespace kestrel {

namespace {

// On a backend with a device memory of its own and no block count requested: first the largest forward pass the
// runner makes (the first block of as many prompts as one step takes, each on a scratch sequence, each drawing its
// next token on the backend), so that what the activations and the draw take is in use when the cache is sized, as
// vLLM's profile run does; then the device's memory.
std::optional<DeviceMemory> profiled_device_memory(Glm5NextModel& model, const EngineConfig& config) {
  if (config.num_blocks != 0 || !model.backend().device_memory()) return std::nullopt;
  {
    const int64_t block = std::max<int64_t>(config.block_size, 1);
    const int64_t count = std::clamp<int64_t>((config.max_num_batched_tokens + block - 1) / block, 1,
                                              std::max<int64_t>(config.max_num_seqs, 1));
    const std::vector<int32_t> tokens(static_cast<size_t>(block), 0);
    std::vector<std::unique_ptr<SequenceState>> sequences;
    std::vector<SequenceCall> calls;
    std::vector<BackendDraw> draws(static_cast<size_t>(count), BackendDraw{.draw = TokenDraw{.u = 0.5}});
    for (int64_t i = 0; i < count; ++i) {
      sequences.push_back(model.new_sequence());
      calls.push_back(
          SequenceCall{.sequence = sequences.back().get(), .tokens = tokens, .draw = &draws[static_cast<size_t>(i)]});
    }
    (void)model.forward_batch(calls, ForwardOptions{.all_logits = false});
  }
  return model.backend().device_memory();
}

}  // namespace

EngineCore::EngineCore(Glm5NextModel& model, const EngineConfig& config)
    : EngineCore(model.config(), model.backend(),
                 [&model](std::span<const SequenceCall> calls) {
                   return model.forward_batch(calls, ForwardOptions{.all_logits = false});
                 },
                 config, profiled_device_memory(model, config)) {}

EngineCore::EngineCore(const Glm5NextConfig& model, Backend& backend, ModelRunner::Forward forward,
                       const EngineConfig& config, const std::optional<DeviceMemory>& memory)
    : model_(model),
      config_(resolve_engine_config(config, model, memory)),
      backend_(backend),
      cache_(model_, backend,
             CacheConfig{.block_size = config_.block_size,
                                 .num_blocks = config_.num_blocks,
                                 .num_slots = config_.max_num_seqs,
                                 .num_kda_snapshots = config_.num_kda_snapshots,
                                 .enable_prefix_caching = config_.enable_prefix_caching,
                                 .latent_dtype = config_.kv_cache_dtype}),
      scheduler_(SchedulerConfig{.max_num_seqs = config_.max_num_seqs,
                                 .max_num_batched_tokens = config_.max_num_batched_tokens,
                                 .max_model_len = config_.max_model_len,
                                 .wait_for_shared_prompt = config_.enable_prefix_caching,
                                 .eos_token_ids = config_.eos_token_ids},
                 cache_),
      runner_(std::move(forward), config_.block_size) {
  log_info("engine: max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}, {} blocks of {} tokens, latents "
           "in {}, prefix caching {}, {} KDA snapshots of {:.1f} MiB",
           config_.max_model_len, config_.max_num_seqs, config_.max_num_batched_tokens, config_.num_blocks,
           config_.block_size, cache_dtype_name(config_.kv_cache_dtype), config_.enable_prefix_caching ? "on" : "off",
           config_.num_kda_snapshots,
           static_cast<double>(SequenceState::kda_state_size(model_)) * sizeof(float) / (1 << 20));
  if (memory) {
    const int64_t tokens = config_.num_blocks * config_.block_size;
    log_info("GPU KV cache size: {} tokens ({:.2f} GiB); maximum concurrency for {} tokens per request: {:.2f}x",
             tokens,
             static_cast<double>(CachePools::block_bytes(model_, config_.block_size, config_.kv_cache_dtype)) *
                 static_cast<double>(config_.num_blocks) / (1 << 30),
             config_.max_model_len, static_cast<double>(tokens) / static_cast<double>(config_.max_model_len));
  }
}

void EngineCore::validate(std::span<const int32_t> prompt, const SamplingParams& params) const {
  require(!prompt.empty(), "the prompt is empty");
  require(static_cast<int64_t>(prompt.size()) <= config_.max_model_len,
          "the prompt has {} tokens, more than this model's maximum context length (max_model_len {})", prompt.size(),
          config_.max_model_len);
  for (const int32_t id : prompt) {
    require(id >= 0 && id < model_.vocab_size, "prompt token id {} is outside the vocabulary [0, {})", id,
            model_.vocab_size);
  }
  validate_sampling_params(params, model_.vocab_size, config_.max_logprobs);
}

void EngineCore::add_request(uint64_t id, std::vector<int32_t> prompt, const SamplingParams& params,
                             std::string cache_salt, std::shared_ptr<OutputSink> sink) {
  validate(prompt, params);
  const auto group = params.n > 1 ? std::make_shared<RequestGroup>() : nullptr;
  std::random_device entropy;
  for (int64_t index = 0; index < params.n; ++index) {
    auto request = std::make_unique<Request>();
    request->id = id;
    request->index = index;
    request->token_ids = prompt;
    request->num_prompt_tokens = static_cast<int64_t>(prompt.size());
    request->params = params;
    request->params.n = 1;
    request->cache_salt = cache_salt;
    request->sink = sink;
    request->group = group;
    request->leads_group = index == 0;
    request->rng.seed(params.seed ? *params.seed + static_cast<uint64_t>(index)
                                  : (static_cast<uint64_t>(entropy()) << 32 | entropy()));
    scheduler_.add(std::move(request));
  }
}

SamplingInput EngineCore::sampling_input(Request& request) const {
  return SamplingInput{.params = request.params,
                       .prompt = request.prompt(),
                       .output = request.output(),
                       .eos_token_ids = config_.eos_token_ids,
                       .rng = request.rng};
}

void EngineCore::step() {
  const SchedulerOutput output = scheduler_.schedule();
  if (output.empty()) return;
  std::vector<std::optional<SampledToken>> sampled(output.chunks.size());
  try {
    // A token that needs nothing but its logits and the draw is drawn where the logits are (on a GPU, a token comes
    // back instead of the vocabulary's logits); the rest go through the sampler here.
    std::vector<BackendDraw> draws(output.chunks.size());
    std::vector<BackendDraw*> draw_of(output.chunks.size(), nullptr);
    for (size_t i = 0; i < output.chunks.size(); ++i) {
      Request& request = *output.chunks[i].request;
      if (!output.chunks[i].samples() || !needs_only_logits(sampling_input(request))) continue;
      draws[i].draw = token_draw(request.params, request.rng);
      draw_of[i] = &draws[i];
    }
    std::vector<std::vector<float>> logits = runner_.execute(output, draw_of);
    std::vector<size_t> sampling;
    for (size_t i = 0; i < output.chunks.size(); ++i) {
      if (draw_of[i] != nullptr) {
        sampled[i] = SampledToken{.token_id = draws[i].token, .logprobs = {}};
      } else if (!logits[i].empty()) {
        sampling.push_back(i);
      }
    }
    // The sequences draw in parallel (a draw over a large vocabulary is a millisecond of work): each depends only on
    // its request's logits, tokens and generator, so the tokens do not depend on the threads.
    std::vector<std::exception_ptr> failures(sampling.size());
    ThreadPool::global().parallel_for(static_cast<int64_t>(sampling.size()), [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const size_t i = sampling[static_cast<size_t>(k)];
        Request& request = *output.chunks[i].request;
        try {
          sampled[i] = sample_token(logits[i], sampling_input(request));
        } catch (...) {
          failures[static_cast<size_t>(k)] = std::current_exception();
        }
      }
    });
    for (const std::exception_ptr& failure : failures) {
      if (failure) std::rethrow_exception(failure);
    }
  } catch (const std::exception& e) {
    log_line(LogLevel::error, fmt::format("engine step failed: {}", e.what()));
    scheduler_.fail(output, e.what());
    return;
  }
  scheduler_.update(output, sampled);
}

EngineStats EngineCore::stats() const {
  return EngineStats{.scheduler = scheduler_.stats(),
                     .cache = cache_.stats(),
                     .kv_cache_usage = cache_.usage(),
                     .device_memory = backend_.device_memory()};
}

}  // namespace kestrel
