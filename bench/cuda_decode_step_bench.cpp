// How much of a one-stream decode step is the GPU's own time and how much the host's launching: a step run as
// `kestrel bench` runs it, and the same step enqueued behind a host callback that holds the stream for a few
// milliseconds, so that every launch of the step is queued before the GPU reaches the first. The difference bounds
// what launching the step as one CUDA graph could save. Usage: kestrel_cuda_decode_step_bench MODEL_DIR [steps]
// (default 64); the prompt is 1,024 random tokens.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_runtime.h"
#include "base/error.h"
#include "model/glm5_next.h"
#include "model_bench_main.h"

namespace kestrel::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// The stream's hold: the callback sleeps, and notes when it let the stream go.
struct Hold {
  std::chrono::microseconds length{3000};
  Clock::time_point released;
};

void CUDART_CB hold_stream(void* data) {
  auto* hold = static_cast<Hold*>(data);
  std::this_thread::sleep_for(hold->length);
  hold->released = Clock::now();
}

int run(const std::string& model_dir, int steps) {
  CudaBackend backend;
  const auto model = Glm5NextModel::load(model_dir, backend);
  const int64_t vocab = model->config().vocab_size;
  std::mt19937 rng(7);
  const auto token = [&] { return static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)); };
  const auto sequence = model->new_sequence();
  std::vector<int32_t> prompt(1024);
  for (int32_t& t : prompt) t = token();
  (void)model->forward(*sequence, prompt, {.all_logits = false});
  const auto step = [&] {
    const int32_t next = token();
    (void)model->forward(*sequence, std::span(&next, 1), {.all_logits = false});
  };
  for (int i = 0; i < 4; ++i) step();  // warm-up

  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double free_running = std::chrono::duration<double>(Clock::now() - start).count() / steps;

  Hold hold;
  double queued = 0.0;
  for (int i = 0; i < steps; ++i) {
    check(cudaLaunchHostFunc(backend.stream(), hold_stream, &hold), "host callback");
    step();
    queued += std::chrono::duration<double>(Clock::now() - hold.released).count();
  }
  queued /= steps;
  std::printf("one-stream decode step at 1k context: %.3f ms free-running, %.3f ms with every launch queued ahead "
              "(the GPU's own time); launching costs at most %.3f ms a step\n",
              free_running * 1e3, queued * 1e3, (free_running - queued) * 1e3);
  return 0;
}

}  // namespace
}  // namespace kestrel::cuda

int main(int argc, char** argv) {
  return kestrel::cuda::model_bench_main(argc, argv, "kestrel_cuda_decode_step_bench", 64, kestrel::cuda::run);
}
