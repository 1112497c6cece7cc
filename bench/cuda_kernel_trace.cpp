// Where a one-stream decode step's time goes on the GPU, kernel by kernel, as it runs: CUPTI's concurrent-kernel
// activity records each kernel's start and end on the GPU's clock without serialising them (Nsight Compute replays
// each kernel alone with its caches flushed, and no Nsight Systems runs on the GPU machines here), so dependent
// launches overlap as they do in `kestrel bench`. The step is the engine's: one token, the next drawn greedily on
// the GPU, with bf16 product inputs (`--dtype bfloat16`, the setting of the bench's figures). Prints one CSV line
// per kernel of the traced steps (step, name, start and end in ns from the step's first kernel, grid, block) for
// tools/kernel_trace_table.py.
// Usage: kestrel_cuda_kernel_trace MODEL_DIR [steps] (default 4; the prompt is 1,024 random tokens).
#include <cupti.h>
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_runtime.h"
#include "base/error.h"
#include "model/glm5_next.h"
#include "model_bench_main.h"

namespace kestrel::cuda {
namespace {

struct KernelRecord {
  std::string name;
  uint64_t start = 0, end = 0;
  int32_t grid[3] = {}, block[3] = {};
};

std::mutex records_mutex;
std::vector<KernelRecord> records;

void cupti_check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  fail("CUPTI {}: {}", what, message ? message : "unknown error");
}

std::string demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> plain(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && plain ? std::string(plain.get()) : std::string(name);
}

// CUPTI's record buffers, allocated and touched before tracing and reused: a buffer allocated when CUPTI asks for it
// takes its page faults while the step's first records are written, the likely cause of the 0.7-8.7 ms idle gap
// after each traced step's first kernel in run 63 (not yet re-run with this).
constexpr size_t kBufferBytes = 16 << 20;
std::vector<uint8_t*> free_buffers;  // guarded by records_mutex

void allocate_buffers(int count) {
  std::lock_guard lock(records_mutex);
  for (int i = 0; i < count; ++i) {
    auto* buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    if (buffer == nullptr) fail("no memory for CUPTI's record buffers");
    std::memset(buffer, 0, kBufferBytes);
    free_buffers.push_back(buffer);
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  std::lock_guard lock(records_mutex);
  if (!free_buffers.empty()) {
    *buffer = free_buffers.back();
    free_buffers.pop_back();
  } else {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  }
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard lock(records_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    records.push_back(KernelRecord{.name = demangled(kernel->name),
                                   .start = kernel->start,
                                   .end = kernel->end,
                                   .grid = {kernel->gridX, kernel->gridY, kernel->gridZ},
                                   .block = {kernel->blockX, kernel->blockY, kernel->blockZ}});
  }
  free_buffers.push_back(buffer);
}

// CSV-safe: the demangled names hold commas.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

int run(const std::string& model_dir, int steps) {
  CudaBackend backend;
  backend.set_product_input(ProductInput::bf16);
  const auto model = Glm5NextModel::load(model_dir, backend);
  const int64_t vocab = model->config().vocab_size;
  std::mt19937 rng(7);
  const auto sequence = model->new_sequence();
  std::vector<int32_t> prompt(1024);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  (void)model->forward(*sequence, prompt, {.all_logits = false});
  int32_t next = prompt.back();
  BackendDraw draw{.draw = TokenDraw{.temperature = 0.0f}};
  const auto step = [&] {
    const SequenceCall call{.sequence = sequence.get(), .tokens = std::span(&next, 1), .draw = &draw};
    (void)model->forward_batch(std::span(&call, 1), {.all_logits = false});
    next = draw.token;
  };
  for (int i = 0; i < 8; ++i) step();  // warm-up
  check(cudaDeviceSynchronize(), "warm-up");

  allocate_buffers(4);
  cupti_check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
  cupti_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel activity");
  std::vector<size_t> step_first(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    check(cudaDeviceSynchronize(), "step boundary");
    cupti_check(cuptiActivityFlushAll(1), "flush");
    {
      std::lock_guard lock(records_mutex);
      step_first[static_cast<size_t>(i)] = records.size();
    }
    step();  // reads its drawn token back: the step has finished when it returns
  }
  check(cudaDeviceSynchronize(), "trace end");
  cupti_check(cuptiActivityFlushAll(1), "flush");
  cupti_check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable kernel activity");

  std::printf("step,kernel,start_ns,end_ns,grid,block\n");
  for (int i = 0; i < steps; ++i) {
    const size_t first = step_first[static_cast<size_t>(i)];
    const size_t last = i + 1 < steps ? step_first[static_cast<size_t>(i) + 1] : records.size();
    std::vector<KernelRecord> kernels(records.begin() + static_cast<std::ptrdiff_t>(first),
                                      records.begin() + static_cast<std::ptrdiff_t>(last));
    std::sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
    if (kernels.empty()) continue;
    const uint64_t origin = kernels.front().start;
    for (const KernelRecord& k : kernels) {
      std::printf("%d,%s,%llu,%llu,%dx%dx%d,%dx%dx%d\n", i, quoted(k.name).c_str(),
                  static_cast<unsigned long long>(k.start - origin), static_cast<unsigned long long>(k.end - origin),
                  k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2]);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kestrel::cuda

int main(int argc, char** argv) {
  return kestrel::cuda::model_bench_main(argc, argv, "kestrel_cuda_kernel_trace", 4, kestrel::cuda::run);
}
