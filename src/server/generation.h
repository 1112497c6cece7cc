// One generation request (chat or completions) from submission to the last byte: submits each prompt to the engine,
// turns engine outputs into choices (ChoiceState), and answers on the Exchange as SSE chunks or one JSON response.
// Engine outputs wake it through the stream's notify callback, which posts a pump onto the connection's strand, so
// all of its state is touched by one thread at a time. A client that goes away aborts every engine request.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/choice_state.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "text/tokenizer.h"

namespace kestrel::server {

struct GenerationContext {
  const text::Tokenizer& tokenizer;
  Engine& engine;
  Metrics& metrics;
  std::atomic<int>& in_flight;
};

struct PreparedPrompt {
  std::vector<int32_t> token_ids;
  std::string echo;  // completions with echo: the prompt text put before the output
};

class Generation : public std::enable_shared_from_this<Generation> {
public:
  Generation(GenerationContext context, GenerationRequest request, std::vector<PreparedPrompt> prompts,
             ChoiceOptions choice_options, ResponseHeader header, std::shared_ptr<Exchange> exchange);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Submits every prompt (throws Error when the engine refuses one) and starts answering. On the exchange's strand.
  void start();

private:
  struct Submitted {
    std::unique_ptr<RequestStream> stream;
    size_t first_choice = 0;
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;
  };

  void schedule_pump();
  void pump();
  void on_output(size_t stream_index, const RequestOutput& output);
  void stream_update(size_t choice, const ChoiceUpdate& update);
  void complete();
  void cancel();
  ojson usage(int64_t completion_tokens) const;

  GenerationContext context_;
  GenerationRequest request_;
  std::vector<PreparedPrompt> prompts_;
  ResponseHeader header_;
  std::shared_ptr<Exchange> exchange_;
  std::vector<Submitted> submitted_;
  std::vector<ChoiceState> choices_;
  std::vector<Clock::time_point> last_token_time_;
  Clock::time_point arrival_;
  bool first_token_seen_ = false;
  bool done_ = false;
  std::string pending_;  // SSE bytes gathered during one pump
  std::atomic<bool> pump_scheduled_{false};
};

}  // namespace kestrel::server
