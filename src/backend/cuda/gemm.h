// Prefill-sized matrix products on the tensor cores through cuBLASLt: y[T, n] (float32) = x[T, k] · B with x and B
// in fp16 or bf16 and float32 accumulation. cuBLASLt is loaded when the first Gemm is made (dlopen of
// libcublasLt.so.13 from the loader's path, else /usr/local/cuda/lib64), not linked: the kestrel binary keeps running on machines without the CUDA libraries, and a
// GPU machine without cuBLASLt keeps every token count on the GEMV kernels (`available()` is false, logged once).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/device_runtime.h"

namespace kestrel::cuda {

enum class GemmInput { f16, bf16 };

// B's layout: the weights as a checkpoint stores them, W [n, k] row-major (y = x Wᵀ), or EXL3's Ŵ [k, n] row-major
// (y = x Ŵ).
enum class GemmWeights { rows_are_outputs, rows_are_inputs };

// Several products of one shape in one call (per-head projections): product i reads x + i * x_stride and
// w + i * w_stride and writes y + i * y_stride (in elements); rows of x and y lie x_ld and y_ld elements apart, so a
// head's slice of [T, heads, k] activations is read and written in place. y is float32, or fp16 with y_f16; y = alpha
// x · B.
struct GemmBatch {
  int64_t count = 1;
  int64_t x_ld = 0, x_stride = 0, w_stride = 0, y_ld = 0, y_stride = 0;
  float alpha = 1.0f;
  bool y_f16 = false;
  auto operator<=>(const GemmBatch&) const = default;
};

class Gemm {
public:
  struct Api;  // the cuBLASLt entry points, resolved once per process

  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  bool available() const { return api_ != nullptr; }
  // y[T, n] = x[T, k] · B (see GemmWeights), or y += x · B with `accumulate`; x, w 16-bit device memory of `input`'s
  // type, y float32 device memory. Errors (no cuBLASLt, no algorithm for the shape, a failed launch) throw
  // kestrel::Error.
  void run(GemmInput input, const void* x, int64_t num_tokens, int64_t k, const void* w, GemmWeights layout,
           int64_t n, float* y, cudaStream_t stream, bool accumulate = false);
  // batch.count products y_i = alpha x_i · B_i, laid out as GemmBatch says (x_ld >= k, y_ld >= n).
  void run_batched(GemmInput input, const void* x, int64_t num_tokens, int64_t k, const void* w, GemmWeights layout,
                   int64_t n, void* y, const GemmBatch& batch, cudaStream_t stream);

private:
  struct Plan;
  using Shape = std::tuple<GemmInput, GemmWeights, int64_t, int64_t, int64_t, GemmBatch>;  // input, layout, T, k, n
  void matmul(GemmInput input, const void* x, int64_t num_tokens, int64_t k, const void* w, GemmWeights layout,
              int64_t n, void* y, const GemmBatch& batch, float beta, cudaStream_t stream);
  const Api* api_ = nullptr;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  std::map<Shape, std::unique_ptr<Plan>> plans_;  // descriptors and the chosen algorithm per shape
};

}  // namespace kestrel::cuda
