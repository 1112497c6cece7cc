#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/metrics.h"
#include "server/sse.h"

#include <nlohmann/json.hpp>

namespace kestrel::server {
namespace {

TEST(Sse, EventAndDoneFraming) {
  EXPECT_EQ(sse_event("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(Sse, ChunkedEncodingHexLengths) {
  EXPECT_EQ(http_chunk("hello"), "5\r\nhello\r\n");
  EXPECT_EQ(http_chunk(std::string(26, 'x')), "1a\r\n" + std::string(26, 'x') + "\r\n");
  EXPECT_EQ(http_last_chunk(), "0\r\n\r\n");
}

TEST(ApiErrorBody, OpenAiShapeWithNullParam) {
  const auto body = nlohmann::json::parse(error_body(ApiError(400, "bad 'n'", "n")));
  EXPECT_EQ(body["error"]["message"], "bad 'n'");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "n");
  EXPECT_EQ(body["error"]["code"], 400);
  const auto no_param = nlohmann::json::parse(error_body(404, "missing", "not_found_error"));
  EXPECT_TRUE(no_param["error"]["param"].is_null());
  // Client bytes quoted in a message never make the error body invalid JSON.
  EXPECT_TRUE(nlohmann::json::accept(error_body(400, "bad \xff byte", "invalid_request_error")));
}

TEST(Metrics, VllmNamesAndCumulativeBuckets) {
  Metrics m("tiny \"model\"");
  m.observe_time_to_first_token(0.003);
  m.observe_time_to_first_token(0.5);
  m.observe_inter_token_latency(0.02);
  m.observe_request("stop", 1.0, 10, 5);
  EngineStats stats;
  stats.scheduler.num_running = 3;
  stats.scheduler.num_waiting = 2;
  stats.scheduler.prompt_tokens = 100;
  stats.scheduler.generation_tokens = 40;
  stats.cache.prefix_cache_queries = 64;
  stats.cache.prefix_cache_hits = 32;
  stats.kv_cache_usage = 0.25;
  const std::string text = m.render(stats);
  const std::string label = "model_name=\"tiny \\\"model\\\"\"";
  for (const std::string& line : std::vector<std::string>{
           "vllm:num_requests_running{" + label + "} 3",
           "vllm:num_requests_waiting{" + label + "} 2",
           "vllm:kv_cache_usage_perc{" + label + "} 0.25",
           "vllm:prompt_tokens_total{" + label + "} 100",
           "vllm:generation_tokens_total{" + label + "} 40",
           "vllm:prefix_cache_queries_total{" + label + "} 64",
           "vllm:prefix_cache_hits_total{" + label + "} 32",
           "vllm:request_success_total{" + label + ",finished_reason=\"stop\"} 1",
           "vllm:time_to_first_token_seconds_bucket{" + label + ",le=\"0.001\"} 0",
           "vllm:time_to_first_token_seconds_bucket{" + label + ",le=\"0.005\"} 1",
           "vllm:time_to_first_token_seconds_bucket{" + label + ",le=\"0.5\"} 2",
           "vllm:time_to_first_token_seconds_bucket{" + label + ",le=\"+Inf\"} 2",
           "vllm:time_to_first_token_seconds_count{" + label + "} 2",
           "vllm:inter_token_latency_seconds_count{" + label + "} 1",
           "# TYPE vllm:time_to_first_token_seconds histogram",
           "# TYPE vllm:prompt_tokens_total counter",
       }) {
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << "\n" << text;
  }
  // GPU memory gauges only on a device.
  EXPECT_EQ(text.find("kestrel:gpu_"), std::string::npos);
  stats.device_memory = DeviceMemory{.free_bytes = 60, .total_bytes = 100, .allocator_used_bytes = 25};
  const std::string gpu = m.render(stats);
  EXPECT_NE(gpu.find("kestrel:gpu_memory_used_bytes{" + label + "} 40\n"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("kestrel:gpu_allocator_used_bytes{" + label + "} 25\n"), std::string::npos) << gpu;
}

}  // namespace
}  // namespace kestrel::server
