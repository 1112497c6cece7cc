#include "server/choice_state.h"

#include <utility>

namespace kestrel::server {

ChoiceState::ChoiceState(const text::Tokenizer& tokenizer, ChoiceOptions options)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      detokenizer_(tokenizer, options_.skip_special_tokens),
      stops_(options_.stop, options_.include_stop_str_in_output) {
  if (options_.chat) parser_.emplace(options_.parser);
}

TokenLogprobEntry ChoiceState::logprob_entry(int32_t id, const SampleLogprobs& lp) const {
  TokenLogprobEntry e;
  e.token_id = id;
  e.sampled = {.token = tokenizer_.decode({id}), .logprob = lp.logprob};
  for (const auto& t : lp.top) e.top.push_back({.token = tokenizer_.decode({t.token_id}), .logprob = t.logprob});
  return e;
}

void ChoiceState::emit(const std::string& text, ChoiceUpdate& out) {
  if (text.empty()) return;
  text_ += text;
  if (parser_) {
    ChatDelta d = parser_->feed(text);
    out.delta.reasoning += d.reasoning;
    out.delta.content += d.content;
    for (auto& call : d.tool_calls) out.delta.tool_calls.push_back(std::move(call));
  } else {
    out.delta.content += text;
  }
}

void ChoiceState::end(ChoiceUpdate& out) {
  if (!parser_) return;
  ChatDelta d = parser_->finish();
  out.delta.reasoning += d.reasoning;
  out.delta.content += d.content;
  for (auto& call : d.tool_calls) out.delta.tool_calls.push_back(std::move(call));
}

ChoiceUpdate ChoiceState::add(const RequestOutput& output) {
  ChoiceUpdate out;
  if (finished()) return out;
  for (size_t i = 0; i < output.token_ids.size(); ++i) {
    const int32_t id = output.token_ids[i];
    ++num_tokens_;
    if (options_.want_logprobs && i < output.logprobs.size()) {
      out.logprobs.push_back(logprob_entry(id, output.logprobs[i]));
    }
    // vLLM checks stop strings only once min_tokens are out.
    const auto r = stops_.feed(detokenizer_.feed(id), num_tokens_ > options_.min_tokens);
    emit(r.text, out);
    if (r.matched) {
      stop_string_ = r.matched;
      finish_reason_ = FinishReason::stop;
      stopped_by_string_ = !output.finish_reason || i + 1 < output.token_ids.size();
      break;
    }
  }
  if (!finish_reason_ && output.finish_reason) {
    finish_reason_ = output.finish_reason;
    stop_token_ = output.stop_token_id;
    error_ = output.error;
    const auto tail = stops_.feed(detokenizer_.finish(), num_tokens_ > options_.min_tokens);
    emit(tail.text, out);
    if (tail.matched) stop_string_ = tail.matched, finish_reason_ = FinishReason::stop;
    emit(stops_.finish(), out);
  }
  logprobs_.insert(logprobs_.end(), out.logprobs.begin(), out.logprobs.end());
  if (finished()) {
    end(out);
    out.finished = true;
  }
  return out;
}

std::string ChoiceState::finish_reason() const {
  if (!finish_reason_) return "";
  if (*finish_reason_ == FinishReason::stop && parser_ && !parser_->tool_calls().empty()) return "tool_calls";
  return std::string(finish_reason_name(*finish_reason_));
}

nlohmann::json ChoiceState::stop_reason() const {
  if (stop_string_) return *stop_string_;
  if (stop_token_) return *stop_token_;
  return nullptr;
}

}  // namespace kestrel::server
