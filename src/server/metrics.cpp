#include "server/metrics.h"

#include <fmt/format.h>

namespace kestrel::server {

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count_);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, sum_);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

static std::string escape_label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Bucket bounds as vLLM's (vllm/v1/metrics/loggers.py) so histograms from both servers aggregate.
Metrics::Metrics(std::string model_name)
    : labels_(fmt::format("model_name=\"{}\"", escape_label(model_name))),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0}),
      prompt_tokens_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}),
      generation_tokens_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}) {}

void Metrics::observe_time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::observe_inter_token_latency(double seconds) {
  std::lock_guard lock(mutex_);
  itl_.observe(seconds);
}

void Metrics::observe_request(const std::string& finished_reason, double e2e_seconds, int64_t prompt_tokens,
                              int64_t generation_tokens) {
  std::lock_guard lock(mutex_);
  e2e_.observe(e2e_seconds);
  prompt_tokens_.observe(static_cast<double>(prompt_tokens));
  generation_tokens_.observe(static_cast<double>(generation_tokens));
  for (auto& [reason, count] : success_) {
    if (reason == finished_reason) {
      ++count;
      return;
    }
  }
  success_.emplace_back(finished_reason, 1);
}

std::string Metrics::render(const EngineStats& stats) const {
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, labels_, value);
  };
  const auto counter = [&](const char* base, const char* help, int64_t value) {
    out += fmt::format("# HELP {}_total {}\n# TYPE {}_total counter\n{}_total{{{}}} {}\n", base, help, base, base,
                       labels_, value);
  };
  metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
         stats.scheduler.num_running);
  metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
         stats.scheduler.num_waiting);
  metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage);
  if (stats.device_memory) {
    metric("kestrel:gpu_memory_used_bytes", "gauge", "GPU memory in use on the device (all processes).",
           stats.device_memory->total_bytes - stats.device_memory->free_bytes);
    metric("kestrel:gpu_allocator_used_bytes", "gauge",
           "GPU memory Kestrel's allocator holds for activations, caches and states.",
           stats.device_memory->allocator_used_bytes);
  }
  counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.",
          stats.scheduler.num_preemptions);
  counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.scheduler.prompt_tokens);
  counter("vllm:generation_tokens", "Number of generation tokens processed.", stats.scheduler.generation_tokens);
  counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
          stats.cache.prefix_cache_queries);
  counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          stats.cache.prefix_cache_hits);

  std::lock_guard lock(mutex_);
  out += "# HELP vllm:request_success_total Count of successfully processed requests.\n"
         "# TYPE vllm:request_success_total counter\n";
  for (const char* reason : {"stop", "length", "abort"}) {
    uint64_t count = 0;
    for (const auto& [r, c] : success_) {
      if (r == reason) count = c;
    }
    out += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels_, reason, count);
  }
  const auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    h.render(out, name, labels_);
  };
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", generation_tokens_);
  return out;
}

}  // namespace kestrel::server
