// A checkpoint matrix (LinearWeight) copied to GPU memory in its on-disk format, with the kernels that apply it:
// the EXL3 trellis GEMV for EXL3 matrices, the dense GEMV for f32/f16/bf16 and block-fp8 (its scale grid kept as
// float32); for prefill-sized token counts, a tensor-core GEMM for bf16 (cuBLASLt, gemm.h) and EXL3 matrices (Ŵ
// decoded once for cuBLASLt, or exl3_trellis_gemm decoding in registers for job lists and matrices too large to
// decode), which reads the weights once per call or per 64 or 128 tokens where the GEMV would read them once per pass
// of 8 or 16 tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/device_runtime.h"
#include "backend/cuda/dense_kernels.h"
#include "backend/cuda/exl3_kernels.h"
#include "backend/cuda/gemm.h"
#include "backend/linear_weight.h"

namespace kestrel::cuda {

// Float scratch for kernels that need temporaries; grows on demand (growing synchronises the device).
class Scratch {
public:
  float* floats(size_t count);
  // Zeroed counters that the kernels using them leave zeroed (the bf16 GEMV's split counters).
  unsigned* counters(size_t count);

private:
  DeviceBuffer buffer_;
  DeviceBuffer counters_;
};

class DeviceLinear;

// One matrix's share of DeviceLinear::forward_jobs: y [num_tokens, out_features] = x [num_tokens, in_features] Wᵀ.
struct LinearJob {
  const DeviceLinear* linear = nullptr;
  const float* x = nullptr;
  int64_t num_tokens = 0;
  float* y = nullptr;
};

class DeviceLinear {
public:
  // Copies `weight` to the current device; `sm_count` sizes the EXL3 k-split and the EXL3 GEMM's block rows;
  // `input` is what a bf16 matrix's products take (product_input.h).
  static DeviceLinear upload(const LinearWeight& weight, int sm_count, ProductInput input = ProductInput::float32);

  // y[T, out_features] = x[T, in_features] W^T; x and y are float32 device memory. With a usable `gemm`, token
  // counts from gemm_min_tokens() on run as a GEMM; without one, every count runs on the GEMV kernels.
  void forward(const float* x, int64_t num_tokens, float* y, Scratch& scratch, Gemm* gemm, cudaStream_t stream) const;
  // ys[i] = linears[i]->forward(x): matrices sharing an input (a layer's q, k and v projections). bf16 matrices
  // that run the GEMV at this token count go through one launch (bf16_linear_group), the rest one forward each.
  // y = clamped_swiglu(gate, up, limit) W^T in one launch where this is a bf16 matrix on the GEMV at this count (see
  // bf16_swiglu_linear); false, with nothing run, where it is not.
  bool forward_swiglu(const float* gate, const float* up, float limit, int64_t num_tokens, float* y, Scratch& scratch,
                      Gemm* gemm, cudaStream_t stream) const;
  static void forward_shared_input(std::span<const DeviceLinear* const> linears, const float* x, int64_t num_tokens,
                                   std::span<float* const> ys, Scratch& scratch, Gemm* gemm, cudaStream_t stream);
  // Every job as forward() runs it, but the EXL3 jobs of the first one's shape and format go through the GEMM's
  // steps together (exl3_kernels.h's groups: one launch per step for up to kExl3GroupMax matrices, jobs grouped by
  // row count): those on the GEMM path at their count, and all of them where the list holds kExl3GroupMax or more
  // (a MoE layer's experts in a prefill chunk).
  static void forward_jobs(std::span<const LinearJob> jobs, Scratch& scratch, Gemm* gemm, cudaStream_t stream);
  // The fewest tokens this matrix runs as a GEMM (INT64_MAX: never, for formats without a GEMM path).
  int64_t gemm_min_tokens() const;
  // The GEMM path at any token count (bf16 and EXL3 matrices; `gemm`, which bf16 uses, must be available): what
  // forward runs from gemm_min_tokens() on, callable below it to find where that should be.
  void forward_as_gemm(const float* x, int64_t num_tokens, float* y, Scratch& scratch, Gemm& gemm,
                       cudaStream_t stream) const;
  // out[T, in_features] = rows ids[T] of W (the embedding lookup); ids are device memory, validated by the caller.
  // Dense weights only: an EXL3 table is refused.
  void gather_rows(const int32_t* ids, int64_t num_tokens, float* out, cudaStream_t stream) const;

  const std::string& name() const { return name_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  // Bytes of weight data one call reads (the trellis and scales for EXL3).
  size_t weight_bytes() const { return weight_bytes_; }
  // The matrix on the device and its k-split, for EXL3 weights (null otherwise).
  const Exl3DeviceView* exl3() const { return exl3_ ? &view_ : nullptr; }
  const Exl3Plan& plan() const { return plan_; }
  // The matrix as stored, for a dense weight that is not fp8 (null otherwise), and its element type.
  const void* plain_data() const {
    return exl3_ || dense_type_ == DenseWeightType::f8_e4m3 ? nullptr : data_.data();
  }
  DenseWeightType dense_type() const { return dense_type_; }

private:
  // x [T, k] float32 as the sum of two bf16 planes in scratch (high, then low), for the bf16 GEMMs; under
  // ProductInput::bf16, x rounded to bf16 as high alone (low null).
  static std::pair<const uint16_t*, const uint16_t*> split_into(const float* x, int64_t num_tokens, int64_t k,
                                                                ProductInput input, Scratch& scratch,
                                                                cudaStream_t stream);
  // y = (high + low) W^T as two products into y: the weights read twice, so that the result matches float32
  // activations to within the float32 sum's rounding (the tensor-core GEMV splits x the same way); one product
  // where low is null.
  void bf16_gemm_terms(const uint16_t* high, const uint16_t* low, int64_t num_tokens, float* y, Gemm& gemm,
                       cudaStream_t stream) const;
  // One EXL3 matrix's GEMM with Ŵ decoded once into scratch (exl3_kernels.h's decode-once form).
  void exl3_decoded_gemm(const float* x, int64_t num_tokens, float* y, Scratch& scratch, Gemm& gemm,
                         cudaStream_t stream) const;
  // The EXL3 in-register GEMM's steps for jobs of one shape and format, in groups.
  static void exl3_gemm_groups(std::span<const LinearJob* const> jobs, Scratch& scratch, cudaStream_t stream);

  std::string name_;
  int64_t in_features_ = 0, out_features_ = 0;
  size_t weight_bytes_ = 0;
  DeviceBuffer data_, suh_, svh_;
  DeviceBuffer scales_;  // block-fp8: the scale grid, float32
  int64_t block_rows_ = 0, block_cols_ = 0;
  mutable DeviceBuffer counters_;  // the EXL3 kernel's slice counters: written by every call, zero between calls
  bool exl3_ = false;
  Exl3DeviceView view_;
  Exl3Plan plan_;
  int sm_count_ = 1;  // the device's, for the EXL3 GEMM's block rows
  DenseWeightType dense_type_ = DenseWeightType::f32;
  ProductInput input_ = ProductInput::float32;  // for bf16 weights
};

}  // namespace kestrel::cuda
