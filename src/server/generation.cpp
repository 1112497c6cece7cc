#include "server/generation.h"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <utility>

#include "base/log.h"
#include "server/api_error.h"
#include "server/sse.h"

namespace kestrel::server {

Generation::Generation(GenerationContext context, GenerationRequest request, std::vector<PreparedPrompt> prompts,
                       ChoiceOptions choice_options, ResponseHeader header, std::shared_ptr<Exchange> exchange)
    : context_(context),
      request_(std::move(request)),
      prompts_(std::move(prompts)),
      header_(std::move(header)),
      exchange_(std::move(exchange)),
      arrival_(Clock::now()) {
  ++context_.in_flight;
  const size_t n = static_cast<size_t>(request_.sampling.n);
  choices_.reserve(prompts_.size() * n);
  for (size_t i = 0; i < prompts_.size() * n; ++i) choices_.emplace_back(context_.tokenizer, choice_options);
  last_token_time_.resize(choices_.size());
}

Generation::~Generation() { --context_.in_flight; }

void Generation::start() {
  const std::weak_ptr<Generation> weak = weak_from_this();
  const size_t n = static_cast<size_t>(request_.sampling.n);
  for (size_t p = 0; p < prompts_.size(); ++p) {
    GenerateRequest r{.prompt_token_ids = prompts_[p].token_ids, .sampling = request_.sampling,
                      .cache_salt = request_.cache_salt};
    Submitted s;
    s.first_choice = p * n;
    s.prompt_tokens = static_cast<int64_t>(prompts_[p].token_ids.size());
    s.stream = context_.engine.submit(std::move(r), [weak] {
      if (auto self = weak.lock()) self->schedule_pump();
    });
    submitted_.push_back(std::move(s));
  }
  // The connection owns the generation through this callback until the answer is complete.
  exchange_->on_disconnect([self = shared_from_this()] { self->cancel(); });
  if (request_.stream) {
    exchange_->start_stream("text/event-stream; charset=utf-8");
    for (size_t c = 0; c < choices_.size(); ++c) {
      if (request_.chat) {
        pending_ += sse_event(dump_json(chat_chunk(header_, static_cast<int64_t>(c), chat_delta_json({}, true),
                                                   nullptr, std::nullopt)));
      } else if (request_.echo) {
        pending_ += sse_event(dump_json(completion_chunk(header_, static_cast<int64_t>(c), prompts_[c / n].echo,
                                                         nullptr, std::nullopt)));
      }
    }
  }
  pump();
}

void Generation::schedule_pump() {
  if (pump_scheduled_.exchange(true)) return;
  boost::asio::post(exchange_->executor(), [self = shared_from_this()] {
    self->pump_scheduled_ = false;
    self->pump();
  });
}

void Generation::pump() {
  if (done_) return;
  for (size_t s = 0; s < submitted_.size() && !done_; ++s) {
    while (auto output = submitted_[s].stream->try_next()) {
      on_output(s, *output);
      if (done_) return;
    }
  }
  if (!pending_.empty()) exchange_->send(std::exchange(pending_, {}));
  bool all = true;
  for (const auto& c : choices_) all = all && c.finished();
  if (all) complete();
}

void Generation::on_output(size_t stream_index, const RequestOutput& output) {
  Submitted& s = submitted_[stream_index];
  s.cached_tokens = std::max(s.cached_tokens, output.num_cached_tokens);
  const size_t index = s.first_choice + static_cast<size_t>(output.index);
  if (index >= choices_.size()) return;
  ChoiceState& choice = choices_[index];
  if (choice.finished()) return;
  if (!output.token_ids.empty()) {
    const Clock::time_point now = output.time;
    if (!first_token_seen_) {
      first_token_seen_ = true;
      context_.metrics.observe_time_to_first_token(std::chrono::duration<double>(now - arrival_).count());
    } else if (last_token_time_[index] != Clock::time_point{}) {
      const double gap = std::chrono::duration<double>(now - last_token_time_[index]).count();
      for (size_t i = 0; i < output.token_ids.size(); ++i) {
        context_.metrics.observe_inter_token_latency(gap / static_cast<double>(output.token_ids.size()));
      }
    }
    last_token_time_[index] = now;
  }
  const ChoiceUpdate update = choice.add(output);
  // A stop string ended this choice: the engine stops generating it now, its siblings go on.
  if (choice.stopped_by_string()) s.stream->stop(output.index);
  if (request_.stream) stream_update(index, update);
}

void Generation::stream_update(size_t index, const ChoiceUpdate& update) {
  const ChoiceState& choice = choices_[index];
  const bool has_logprobs = request_.logprobs && !update.logprobs.empty();
  if (update.delta.empty() && !has_logprobs && !update.finished) return;
  std::optional<std::string> finish;
  ojson stop_reason = nullptr;
  if (update.finished) {
    finish = choice.finish_reason();
    stop_reason = choice.stop_reason();
  }
  ojson chunk;
  if (request_.chat) {
    const ojson logprobs = has_logprobs ? chat_logprobs_json(update.logprobs) : ojson(nullptr);
    chunk = chat_chunk(header_, static_cast<int64_t>(index), chat_delta_json(update.delta, false), logprobs, finish,
                       stop_reason);
  } else {
    const int64_t offset = static_cast<int64_t>(choice.text().size() - update.delta.content.size());
    const ojson logprobs = has_logprobs ? completion_logprobs_json(update.logprobs, offset) : ojson(nullptr);
    chunk = completion_chunk(header_, static_cast<int64_t>(index), update.delta.content, logprobs, finish, stop_reason);
  }
  if (request_.continuous_usage) {
    int64_t completion = 0;
    for (const auto& c : choices_) completion += c.num_tokens();
    chunk["usage"] = usage(completion);
  }
  pending_ += sse_event(dump_json(chunk));
}

ojson Generation::usage(int64_t completion_tokens) const {
  int64_t prompt = 0, cached = 0;
  for (const auto& s : submitted_) {
    prompt += s.prompt_tokens;
    cached += s.cached_tokens;
  }
  return usage_json(prompt, completion_tokens, cached);
}

void Generation::complete() {
  done_ = true;
  for (auto& s : submitted_) {
    if (!s.stream->finished()) s.stream->abort();
  }
  int64_t completion = 0;
  std::string error;
  for (const auto& c : choices_) {
    completion += c.num_tokens();
    if (c.finish_reason() == "error" && error.empty()) error = c.error().empty() ? "the engine failed" : c.error();
  }
  const std::string reason = choices_.empty() ? "stop" : choices_[0].finish_reason();
  context_.metrics.observe_request(reason == "tool_calls" ? "stop" : reason,
                                   std::chrono::duration<double>(Clock::now() - arrival_).count(),
                                   submitted_.empty() ? 0 : submitted_[0].prompt_tokens, completion);
  if (!error.empty()) log_warn("request {} failed: {}", header_.id, error);
  if (request_.stream) {
    if (!error.empty()) {
      pending_ += sse_event(error_body(500, error, "internal_server_error"));
    } else if (request_.include_usage) {
      pending_ += sse_event(dump_json(usage_chunk(header_, request_.chat, usage(completion))));
    }
    pending_ += sse_done();
    exchange_->send(std::exchange(pending_, {}));
    exchange_->end_stream();
    return;
  }
  if (!error.empty()) {
    exchange_->respond(500, "application/json", error_body(500, error, "internal_server_error"));
    return;
  }
  std::vector<const ChoiceState*> choices;
  for (const auto& c : choices_) choices.push_back(&c);
  ojson body;
  if (request_.chat) {
    body = chat_response(header_, choices, request_.logprobs, usage(completion));
  } else {
    std::vector<std::string> prefixes;
    const size_t n = static_cast<size_t>(request_.sampling.n);
    if (request_.echo) {
      for (size_t c = 0; c < choices_.size(); ++c) prefixes.push_back(prompts_[c / n].echo);
    }
    body = completion_response(header_, choices, prefixes, request_.logprobs, usage(completion));
  }
  exchange_->respond(200, "application/json", dump_json(body));
}

void Generation::cancel() {
  if (done_) return;
  done_ = true;
  for (auto& s : submitted_) s.stream->abort();
  int64_t completion = 0;
  for (const auto& c : choices_) completion += c.num_tokens();
  context_.metrics.observe_request("abort", std::chrono::duration<double>(Clock::now() - arrival_).count(),
                                   submitted_.empty() ? 0 : submitted_[0].prompt_tokens, completion);
}

}  // namespace kestrel::server
