// Prometheus metrics with vLLM's names and `model_name` label, so dashboards and routers built for vLLM read them
// unchanged. Latency histograms are observed by the server as outputs reach it; gauges and token/cache counters are
// the engine's own (EngineStats), read at scrape time.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_core.h"

namespace kestrel::server {

class Histogram {
public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double value);
  // `name`_bucket{le=...}, _sum, _count lines with `labels` (e.g. model_name="x").
  void render(std::string& out, const std::string& name, const std::string& labels) const;

private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // counts_[i]: values <= bounds_[i] and > bounds_[i-1]; last: +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class Metrics {
public:
  explicit Metrics(std::string model_name);

  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  void observe_request(const std::string& finished_reason, double e2e_seconds, int64_t prompt_tokens,
                       int64_t generation_tokens);

  // The text exposition format (version 0.0.4).
  std::string render(const EngineStats& stats) const;

private:
  std::string labels_;
  mutable std::mutex mutex_;
  Histogram ttft_, itl_, e2e_, prompt_tokens_, generation_tokens_;
  std::vector<std::pair<std::string, uint64_t>> success_;  // finished_reason -> count
};

}  // namespace kestrel::server
