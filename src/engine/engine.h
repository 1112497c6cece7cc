// The engine as the server uses it: an EngineCore stepping on a background thread, fed through a thread-safe inbox.
//
//   auto stream = engine.submit({.prompt_token_ids = ids, .sampling = params}, wake_my_event_loop);
//   while (auto output = stream->next()) { ... output->token_ids, output->logprobs, output->finish_reason ... }
//
// submit() validates on the caller's thread and throws Error for a request that can never be served (empty or
// too long a prompt, bad sampling parameters, the engine draining): the server answers those with 400 (503 while
// draining). Accepted requests are never failed for lack of memory: they wait, or are preempted and recomputed.
// Dropping a stream before its last output aborts the request; its slot and blocks are freed at the next step.
//
// Stop strings are text, so they are the caller's: the engine works in token ids and stops only on EOS,
// stop_token_ids, max_tokens and max_model_len. The server detokenizes each completion incrementally, holds back any
// text that could be the start of a stop string across token boundaries, and when one matches it truncates the text
// there and calls stream->stop(index): that completion then ends with FinishReason::stop at the next step (its
// blocks freed; tokens that arrive in between are to be ignored). usage.completion_tokens is then the caller's count.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_core.h"

namespace kestrel {

struct GenerateRequest {
  std::vector<int32_t> prompt_token_ids{};
  SamplingParams sampling{};
  std::string cache_salt{};  // prefix-cache entries are shared only between requests with the same salt
};

// The outputs of one submitted request (all n completions, told apart by RequestOutput::index).
class RequestStream {
public:
  ~RequestStream();
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  uint64_t id() const { return id_; }
  // The next output, waiting for it; nullopt once every completion has finished and its outputs were taken.
  std::optional<RequestOutput> next();
  // The next output if one is ready now.
  std::optional<RequestOutput> try_next();
  // Every completion finished and every output taken.
  bool finished() const;
  // Cancels the request; a last output with FinishReason::abort follows for each unfinished completion.
  void abort();
  // Ends completion `index` (a stop string matched): a last output with FinishReason::stop and no tokens follows,
  // unless it finished already.
  void stop(int64_t index);

  class Queue;
  struct Inbox;

private:
  friend class Engine;
  RequestStream(uint64_t id, std::shared_ptr<Queue> queue, std::shared_ptr<Inbox> inbox)
      : id_(id), queue_(std::move(queue)), inbox_(std::move(inbox)) {}

  uint64_t id_;
  std::shared_ptr<Queue> queue_;
  std::shared_ptr<Inbox> inbox_;
};

class Engine {
public:
  explicit Engine(std::unique_ptr<EngineCore> core);
  // Aborts what is still running and stops the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineConfig& config() const { return core_->config(); }

  // Queues a request. `notify`, if given, is called on the engine thread whenever an output for it arrives (to wake
  // an event loop); it must not block.
  std::unique_ptr<RequestStream> submit(GenerateRequest request, std::function<void()> notify = {});
  void abort(uint64_t id);
  // Refuses new requests from now on and returns once every accepted one has finished.
  void drain();
  // As of the end of the latest step.
  EngineStats stats() const;

private:
  void loop();

  std::unique_ptr<EngineCore> core_;
  std::shared_ptr<RequestStream::Inbox> inbox_;
  std::thread thread_;
};

}  // namespace kestrel
