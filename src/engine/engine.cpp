#include "engine/engine.h"

#include <exception>
#include <utility>

#include "base/error.h"
#include "base/log.h"

namespace kestrel {

// The outputs of one request, pushed by the engine thread and taken by the client's.
class RequestStream::Queue final : public OutputSink {
public:
  Queue(int64_t completions, std::function<void()> notify) : unfinished_(completions), notify_(std::move(notify)) {}

  void push(RequestOutput output) override {
    {
      std::lock_guard lock(mutex_);
      if (output.finish_reason) --unfinished_;
      outputs_.push_back(std::move(output));
    }
    ready_.notify_all();
    if (notify_) notify_();
  }

  std::optional<RequestOutput> pop(bool wait) {
    std::unique_lock lock(mutex_);
    if (wait) ready_.wait(lock, [&] { return !outputs_.empty() || unfinished_ == 0; });
    if (outputs_.empty()) return std::nullopt;
    RequestOutput output = std::move(outputs_.front());
    outputs_.pop_front();
    return output;
  }

  bool all_finished() const {
    std::lock_guard lock(mutex_);
    return unfinished_ == 0;
  }
  bool drained() const {
    std::lock_guard lock(mutex_);
    return unfinished_ == 0 && outputs_.empty();
  }

private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> outputs_;
  int64_t unfinished_;
  std::function<void()> notify_;
};

// What client threads hand to the engine thread, and what it publishes back.
struct RequestStream::Inbox {
  struct Submission {
    uint64_t id;
    GenerateRequest request;
    std::shared_ptr<Queue> queue;
  };

  std::mutex mutex;
  std::condition_variable wake;  // the engine thread: something to do
  std::condition_variable idle;  // drain(): nothing left to do
  struct Finish {
    uint64_t id;
    std::optional<int64_t> index;
    FinishReason reason;
  };

  std::vector<Submission> submissions;
  std::vector<Finish> finishes;
  uint64_t next_id = 1;
  bool stopping = false, draining = false;
  bool busy = false;  // accepted requests not finished yet
  EngineStats stats;

  void finish(uint64_t id, std::optional<int64_t> index, FinishReason reason) {
    {
      std::lock_guard lock(mutex);
      finishes.push_back({.id = id, .index = index, .reason = reason});
    }
    wake.notify_one();
  }
};

RequestStream::~RequestStream() {
  if (!queue_->all_finished()) abort();
}

std::optional<RequestOutput> RequestStream::next() { return queue_->pop(true); }
std::optional<RequestOutput> RequestStream::try_next() { return queue_->pop(false); }
bool RequestStream::finished() const { return queue_->drained(); }
void RequestStream::abort() { inbox_->finish(id_, std::nullopt, FinishReason::abort); }
void RequestStream::stop(int64_t index) { inbox_->finish(id_, index, FinishReason::stop); }

Engine::Engine(std::unique_ptr<EngineCore> core)
    : core_(std::move(core)), inbox_(std::make_shared<RequestStream::Inbox>()) {
  inbox_->stats = core_->stats();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(inbox_->mutex);
    inbox_->stopping = true;
  }
  inbox_->wake.notify_one();
  thread_.join();
}

std::unique_ptr<RequestStream> Engine::submit(GenerateRequest request, std::function<void()> notify) {
  core_->validate(request.prompt_token_ids, request.sampling);
  auto queue = std::make_shared<RequestStream::Queue>(request.sampling.n, std::move(notify));
  uint64_t id;
  {
    std::lock_guard lock(inbox_->mutex);
    require(!inbox_->draining && !inbox_->stopping, "the engine is shutting down and accepts no new requests");
    id = inbox_->next_id++;
    inbox_->submissions.push_back({.id = id, .request = std::move(request), .queue = queue});
    inbox_->busy = true;
  }
  inbox_->wake.notify_one();
  return std::unique_ptr<RequestStream>(new RequestStream(id, std::move(queue), inbox_));
}

void Engine::abort(uint64_t id) { inbox_->finish(id, std::nullopt, FinishReason::abort); }

void Engine::drain() {
  std::unique_lock lock(inbox_->mutex);
  inbox_->draining = true;
  inbox_->idle.wait(lock, [&] { return !inbox_->busy; });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(inbox_->mutex);
  return inbox_->stats;
}

void Engine::loop() {
  bool has_work = false;
  for (;;) {
    std::vector<RequestStream::Inbox::Submission> submissions;
    std::vector<RequestStream::Inbox::Finish> finishes;
    bool stopping;
    {
      std::unique_lock lock(inbox_->mutex);
      inbox_->wake.wait(lock, [&] {
        return has_work || inbox_->stopping || !inbox_->submissions.empty() || !inbox_->finishes.empty();
      });
      submissions.swap(inbox_->submissions);
      finishes.swap(inbox_->finishes);
      stopping = inbox_->stopping;
    }
    for (auto& submission : submissions) {
      GenerateRequest& request = submission.request;
      try {
        core_->add_request(submission.id, std::move(request.prompt_token_ids), request.sampling,
                           std::move(request.cache_salt), submission.queue);
      } catch (const Error& e) {
        for (int64_t index = 0; index < request.sampling.n; ++index) {
          RequestOutput output;
          output.request_id = submission.id;
          output.index = index;
          output.finish_reason = FinishReason::error;
          output.error = e.what();
          submission.queue->push(std::move(output));
        }
      }
    }
    for (const auto& finish : finishes) core_->finish_request(finish.id, finish.index, finish.reason);
    if (stopping) core_->finish_all(FinishReason::abort);
    try {
      core_->step();
    } catch (const std::exception& e) {
      // A failed forward is handled inside step(); anything else leaves the scheduler's state unknown, so every
      // request ends with the error rather than the thread dying with clients waiting.
      log_line(LogLevel::error, fmt::format("engine step failed: {}", e.what()));
      core_->finish_all(FinishReason::error, e.what());
    }
    has_work = core_->has_unfinished_requests();
    {
      std::lock_guard lock(inbox_->mutex);
      inbox_->stats = core_->stats();
      inbox_->busy = has_work || !inbox_->submissions.empty();
    }
    if (!has_work) inbox_->idle.notify_all();
    if (stopping) return;
  }
}

}  // namespace kestrel
