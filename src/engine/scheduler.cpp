#include "engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "base/error.h"

namespace kestrel {

Scheduler::Scheduler(SchedulerConfig config, CacheManager& cache) : config_(std::move(config)), cache_(cache) {}

void Scheduler::add(std::unique_ptr<Request> request) {
  request->times.arrival = Clock::now();
  waiting_.push_back(std::move(request));
}

void Scheduler::finish_later(uint64_t id, std::optional<int64_t> index, FinishReason reason) {
  finish_requests_.push_back({.id = id, .index = index, .reason = reason});
}

void Scheduler::apply_finish_requests() {
  const auto apply = [&](Request& request) {
    for (const FinishRequest& finish_request : finish_requests_) {
      if (finish_request.id == request.id && (!finish_request.index || *finish_request.index == request.index)) {
        finish(request, final_output(finish_request.reason));
        return;
      }
    }
  };
  for (auto& request : running_) apply(*request);
  for (auto& request : waiting_) apply(*request);
  std::erase_if(running_, [](const auto& request) { return request->finished; });
  std::erase_if(waiting_, [](const auto& request) { return request->finished; });
  finish_requests_.clear();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats stats = stats_;
  stats.num_running = static_cast<int64_t>(running_.size());
  stats.num_waiting = static_cast<int64_t>(waiting_.size());
  return stats;
}

int64_t Scheduler::chunk_end(const Request& request, int64_t budget) const {
  const int64_t B = cache_.block_size(), P = request.num_prompt_tokens, N = request.num_tokens();
  const int64_t start = request.num_computed_tokens;
  if (start >= P) return std::min(N, start + budget);
  int64_t end = std::min(P, start + budget);
  if (end < P) end = end / B * B;  // prompt chunks end on a block boundary
  if (end <= start) return start;
  // A recomputed request goes on replaying its generated tokens.
  if (end == P) end = std::min(N, P + budget - (P - start));
  return end;
}

bool Scheduler::waits_for_sibling(const Request& request) const {
  return config_.wait_for_shared_prompt && request.group && !request.leads_group && !request.group->prompt_ready;
}

void Scheduler::preempt(SchedulerOutput& output, int64_t& budget) {
  std::unique_ptr<Request> victim = std::move(running_.back());
  running_.pop_back();
  const auto scheduled = std::ranges::find(output.chunks, victim.get(), &ScheduledChunk::request);
  if (scheduled != output.chunks.end()) {
    budget += scheduled->end - scheduled->start;
    output.num_scheduled_tokens -= scheduled->end - scheduled->start;
    output.chunks.erase(scheduled);
  }
  cache_.close(victim->cache);
  victim->num_computed_tokens = 0;
  ++stats_.num_preemptions;
  waiting_.push_front(std::move(victim));
}

bool Scheduler::reserve(Request& request, int64_t end, SchedulerOutput& output, int64_t& budget) {
  while (!cache_.allocate(request.cache, end)) {
    const bool self = running_.back().get() == &request;
    preempt(output, budget);
    if (self) return false;
  }
  return true;
}

void Scheduler::schedule_chunk(Request& request, int64_t end, SchedulerOutput& output, int64_t& budget) {
  const int64_t start = request.num_computed_tokens;
  output.chunks.push_back(ScheduledChunk{
      .request = &request,
      .start = start,
      .end = end,
      .snapshots = cache_.plan_snapshots(request.cache, request.prompt(), request.cache_salt, start, end)});
  output.num_scheduled_tokens += end - start;
  budget -= end - start;
}

SchedulerOutput Scheduler::schedule() {
  if (!finish_requests_.empty()) apply_finish_requests();

  SchedulerOutput output;
  int64_t budget = config_.max_num_batched_tokens;
  // Requests past their prompt: a decode step, or the replay of a recomputed request.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& request = *running_[i];
    if (request.num_computed_tokens < request.num_prompt_tokens) continue;
    const int64_t end = chunk_end(request, budget);
    if (reserve(request, end, output, budget)) schedule_chunk(request, end, output, budget);
  }
  // Running prompts.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& request = *running_[i];
    if (request.num_computed_tokens >= request.num_prompt_tokens) continue;
    const int64_t end = chunk_end(request, budget);
    if (end > request.num_computed_tokens && reserve(request, end, output, budget)) {
      schedule_chunk(request, end, output, budget);
    }
  }
  // Waiting requests, in order; the first that does not fit holds back the rest.
  for (auto it = waiting_.begin();
       it != waiting_.end() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_num_seqs;) {
    Request& request = **it;
    if (waits_for_sibling(request)) {
      ++it;
      continue;
    }
    int64_t reused = 0;
    request.cache = cache_.open(request.token_ids, request.num_prompt_tokens, request.cache_salt, reused);
    request.num_computed_tokens = reused;
    const int64_t end = chunk_end(request, budget);
    if (end == reused || !cache_.allocate(request.cache, end)) {
      cache_.close(request.cache);
      request.num_computed_tokens = 0;
      break;
    }
    if (!request.num_cached_tokens) {
      request.num_cached_tokens = reused;
      cache_.record_prefix_query(request.num_prompt_tokens, reused);
      request.times.first_scheduled = Clock::now();
    }
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    schedule_chunk(request, end, output, budget);
  }
  return output;
}

std::optional<FinishReason> Scheduler::stop_reason(const Request& request, std::optional<int32_t>& stop_token) const {
  const SamplingParams& p = request.params;
  if (request.num_tokens() >= config_.max_model_len ||
      (p.max_tokens && request.num_output_tokens() >= *p.max_tokens)) {
    return FinishReason::length;
  }
  if (request.num_output_tokens() < p.min_tokens) return std::nullopt;
  const int32_t last = request.token_ids.back();
  if (!p.ignore_eos && std::ranges::find(config_.eos_token_ids, last) != config_.eos_token_ids.end()) {
    return FinishReason::stop;
  }
  if (std::ranges::find(p.stop_token_ids, last) != p.stop_token_ids.end()) {
    stop_token = last;
    return FinishReason::stop;
  }
  return std::nullopt;
}

void Scheduler::emit(Request& request, RequestOutput output) {
  output.request_id = request.id;
  output.index = request.index;
  output.num_prompt_tokens = request.num_prompt_tokens;
  output.num_cached_tokens = request.num_cached_tokens.value_or(0);
  output.num_output_tokens = request.num_output_tokens();
  output.time = Clock::now();
  output.times = request.times;
  request.sink->push(std::move(output));
}

void Scheduler::finish(Request& request, RequestOutput last) {
  if (request.cache.slot >= 0) cache_.close(request.cache);
  if (request.group && request.leads_group) request.group->prompt_ready = true;
  request.finished = true;
  request.times.finished = Clock::now();
  ++stats_.num_finished[static_cast<size_t>(*last.finish_reason)];
  emit(request, std::move(last));
}

RequestOutput Scheduler::final_output(FinishReason reason, std::string_view error) {
  RequestOutput output;
  output.finish_reason = reason;
  output.error = std::string(error);
  return output;
}

void Scheduler::update(const SchedulerOutput& output, std::span<const std::optional<SampledToken>> sampled) {
  for (size_t i = 0; i < output.chunks.size(); ++i) {
    const ScheduledChunk& chunk = output.chunks[i];
    Request& request = *chunk.request;
    request.num_computed_tokens = chunk.end;
    cache_.commit(request.cache, request.prompt(), request.cache_salt, chunk.end);
    if (request.group && request.leads_group && chunk.end >= request.num_prompt_tokens) {
      request.group->prompt_ready = true;
    }
    if (!sampled[i]) continue;

    const SampledToken& token = *sampled[i];
    request.token_ids.push_back(token.token_id);
    const Clock::time_point now = Clock::now();
    if (request.num_output_tokens() == 1) {
      request.times.first_token = now;
      stats_.prompt_tokens += request.num_prompt_tokens;
    }
    request.times.last_token = now;
    ++stats_.generation_tokens;

    RequestOutput out;
    out.token_ids.push_back(token.token_id);
    if (token.logprobs) out.logprobs.push_back(*token.logprobs);
    out.finish_reason = stop_reason(request, out.stop_token_id);
    if (out.finish_reason) {
      finish(request, std::move(out));
    } else {
      emit(request, std::move(out));
    }
  }
  std::erase_if(running_, [](const auto& request) { return request->finished; });
}

void Scheduler::fail(const SchedulerOutput& output, std::string_view error) {
  for (const ScheduledChunk& chunk : output.chunks) finish(*chunk.request, final_output(FinishReason::error, error));
  std::erase_if(running_, [](const auto& request) { return request->finished; });
}

void Scheduler::finish_all(FinishReason reason, std::string_view error) {
  for (auto& request : running_) finish(*request, final_output(reason, error));
  for (auto& request : waiting_) finish(*request, final_output(reason, error));
  running_.clear();
  waiting_.clear();
  finish_requests_.clear();
}

}  // namespace kestrel
