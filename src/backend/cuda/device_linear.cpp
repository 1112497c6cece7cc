#include "backend/cuda/device_linear.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "backend/cuda/elementwise_kernels.h"
#include "base/error.h"

namespace kestrel::cuda {

namespace {

// Where the GEMM overtakes the GEMV (H100 sweep, docs/benchmarks/cuda_linear.md): a bf16 pass reads the weights once
// per 8 tokens, an EXL3 pass decodes the trellis once per 16.
constexpr int64_t kDenseGemmMinTokens = 32;
constexpr int64_t kExl3GemmMinTokens = 48;
// One EXL3 matrix on the GEMM path decodes its Ŵ once into scratch for cuBLASLt where that fits: alone, it has too
// few column blocks for the in-register GEMM to fill the GPU (4096 -> 2048 at 1,024 tokens: 67.9 µs decoded once on
// an H100, run 13, against 93 in registers, run 45). Larger matrices (an EXL3 lm_head: 1.3 GB in fp16) take the
// in-register GEMM, so that no token count grows the scratch past what the memory plan leaves.
constexpr int64_t kExl3DecodeOnceMaxBytes = int64_t{256} << 20;

// Bytes rounded up to a whole number of 256-byte units (scratch regions carved from one buffer stay aligned).
size_t aligned_floats(size_t bytes) { return (bytes + 255) / 256 * 64; }

}  // namespace

float* Scratch::floats(size_t count) {
  if (buffer_.size() < count * sizeof(float)) {
    check(cudaDeviceSynchronize(), "scratch resize");  // kernels in flight may still read the old buffer
    buffer_ = DeviceBuffer(count * sizeof(float));
  }
  return buffer_.as<float>();
}

unsigned* Scratch::counters(size_t count) {
  if (counters_.size() < count * sizeof(unsigned)) {
    check(cudaDeviceSynchronize(), "scratch resize");
    counters_ = DeviceBuffer(count * sizeof(unsigned));
    counters_.zero();
    check(cudaDeviceSynchronize(), "counters zeroed");  // cudaMemset runs on the legacy stream, not ours
  }
  return counters_.as<unsigned>();
}

DeviceLinear DeviceLinear::upload(const LinearWeight& weight, int sm_count, ProductInput input) {
  require(weight.valid(), "weight '{}' has no data", weight.name);
  DeviceLinear linear;
  linear.input_ = input;
  linear.name_ = weight.name;
  linear.in_features_ = weight.in_features;
  linear.out_features_ = weight.out_features;
  if (weight.exl3) {
    const Exl3Matrix& m = *weight.exl3;
    const auto trellis_bytes = static_cast<size_t>(m.in_padded / 16 * (m.out_padded / 16) * 32 * m.bits);
    linear.data_ = DeviceBuffer::copy_of(m.trellis, trellis_bytes);
    linear.suh_ = DeviceBuffer::copy_of(m.suh, static_cast<size_t>(m.in_padded) * 2);
    linear.svh_ = DeviceBuffer::copy_of(m.svh, static_cast<size_t>(m.out_padded) * 2);
    linear.exl3_ = true;
    linear.view_ = Exl3DeviceView{.trellis = linear.data_.as<uint32_t>(),
                                  .suh = linear.suh_.as<uint16_t>(),
                                  .svh = linear.svh_.as<uint16_t>(),
                                  .bits = m.bits,
                                  .codebook = static_cast<int>(m.codebook),
                                  .in_features = weight.in_features,
                                  .out_features = weight.out_features,
                                  .in_padded = m.in_padded,
                                  .out_padded = m.out_padded};
    linear.plan_ = exl3_plan(linear.view_, sm_count);
    linear.sm_count_ = sm_count;
    linear.counters_ = DeviceBuffer(exl3_counter_count(linear.view_) * sizeof(unsigned));
    linear.counters_.zero();
    linear.weight_bytes_ = trellis_bytes + static_cast<size_t>(m.in_padded + m.out_padded) * 2;
    return linear;
  }
  switch (weight.dtype) {
    case DType::f32:
      linear.dense_type_ = DenseWeightType::f32;
      break;
    case DType::f16:
      linear.dense_type_ = DenseWeightType::f16;
      break;
    case DType::bf16:
      linear.dense_type_ = DenseWeightType::bf16;
      break;
    case DType::f8_e4m3: {
      require(weight.block_cols % 16 == 0, "weight '{}': fp8 scale blocks of {} columns (the CUDA kernel needs a "
              "multiple of 16)", weight.name, weight.block_cols);
      linear.dense_type_ = DenseWeightType::f8_e4m3;
      const std::vector<float> scales = block_scales(weight);
      linear.scales_ = DeviceBuffer::copy_of(scales.data(), scales.size() * sizeof(float));
      linear.block_rows_ = weight.block_rows;
      linear.block_cols_ = weight.block_cols;
      break;
    }
    default:
      fail("weight '{}': dtype {} has no CUDA linear kernel (f32, f16, bf16, block-fp8 and EXL3 do)", weight.name,
           dtype_name(weight.dtype));
  }
  const auto data_bytes = static_cast<size_t>(weight.out_features * weight.in_features) * dtype_size(weight.dtype);
  linear.data_ = DeviceBuffer::copy_of(weight.data, data_bytes);
  linear.weight_bytes_ = data_bytes + linear.scales_.size();
  return linear;
}

int64_t DeviceLinear::gemm_min_tokens() const {
  if (exl3_) return kExl3GemmMinTokens;
  return dense_type_ == DenseWeightType::bf16 ? kDenseGemmMinTokens : std::numeric_limits<int64_t>::max();
}

void DeviceLinear::forward(const float* x, int64_t num_tokens, float* y, Scratch& scratch, Gemm* gemm,
                           cudaStream_t stream) const {
  require(num_tokens <= 65535, "CUDA linear '{}': {} tokens in one call (at most 65535)", name_, num_tokens);
  if (gemm != nullptr && gemm->available() && num_tokens >= gemm_min_tokens()) {
    forward_as_gemm(x, num_tokens, y, scratch, *gemm, stream);
  } else if (exl3_) {
    float* partial = scratch.floats(exl3_scratch_floats(view_, plan_));
    check(exl3_linear(view_, plan_, x, num_tokens, y, partial, counters_.as<unsigned>(), stream),
          "EXL3 linear launch");
  } else {
    const BlockScales scales{.scales = scales_.size() ? scales_.as<float>() : nullptr,
                             .block_rows = block_rows_,
                             .block_cols = block_cols_};
    const int64_t scratch_floats = dense_scratch_floats(dense_type_, out_features_, in_features_);
    float* partial = scratch_floats > 0 ? scratch.floats(static_cast<size_t>(scratch_floats)) : nullptr;
    check(dense_linear(data_.data(), dense_type_, out_features_, in_features_, x, num_tokens, y, stream, scales,
                       partial, scratch.counters(static_cast<size_t>(dense_counter_count())), input_),
          "dense linear launch");
  }
}

bool DeviceLinear::forward_swiglu(const float* gate, const float* up, float limit, int64_t num_tokens, float* y,
                                  Scratch& scratch, Gemm* gemm, cudaStream_t stream) const {
  const bool gemv = gemm == nullptr || !gemm->available() || num_tokens < gemm_min_tokens();
  if (!gemv || exl3_ || dense_type_ != DenseWeightType::bf16 ||
      !bf16_swiglu_supported(in_features_, data_.data(), gate, up)) {
    return false;
  }
  require(num_tokens <= 65535, "CUDA linear '{}': {} tokens in one call (at most 65535)", name_, num_tokens);
  const int64_t scratch_floats = bf16_group_scratch_floats(out_features_, in_features_);
  float* partial = scratch_floats > 0 ? scratch.floats(static_cast<size_t>(scratch_floats)) : nullptr;
  check(bf16_swiglu_linear(data_.data(), out_features_, in_features_, gate, up, limit, num_tokens, y, partial,
                           scratch.counters(static_cast<size_t>(dense_counter_count())), stream, input_),
        "bf16 SwiGLU linear launch");
  return true;
}

void DeviceLinear::forward_shared_input(std::span<const DeviceLinear* const> linears, const float* x,
                                        int64_t num_tokens, std::span<float* const> ys, Scratch& scratch, Gemm* gemm,
                                        cudaStream_t stream) {
  require(linears.size() == ys.size(), "{} matrices for {} outputs", linears.size(), ys.size());
  require(num_tokens <= 65535, "CUDA linears: {} tokens in one call (at most 65535)", num_tokens);
  const bool gemm_usable = gemm != nullptr && gemm->available();
  const int64_t in_features = linears.empty() ? 0 : linears.front()->in_features_;
  std::vector<size_t> grouped;  // the bf16 matrices on the GEMV at this count
  std::vector<size_t> split_once;  // the bf16 matrices on the GEMM at this count: x is split into bf16 terms once
  const ProductInput input = linears.empty() ? ProductInput::float32 : linears.front()->input_;
  for (size_t i = 0; i < linears.size(); ++i) {
    const DeviceLinear& linear = *linears[i];
    const bool gemv = !(gemm_usable && num_tokens >= linear.gemm_min_tokens());
    const bool bf16 = !linear.exl3_ && linear.dense_type_ == DenseWeightType::bf16 &&
                      linear.in_features_ == in_features && linear.input_ == input;
    if (gemv && bf16 && grouped.size() < kMaxDenseGroup) {
      grouped.push_back(i);
    } else if (!gemv && bf16) {
      split_once.push_back(i);
    } else {
      linear.forward(x, num_tokens, ys[i], scratch, gemm, stream);
    }
  }
  if (!split_once.empty()) {  // after the others, which may use the scratch the terms live in
    const auto [high, low] = split_into(x, num_tokens, in_features, input, scratch, stream);
    for (const size_t i : split_once) linears[i]->bf16_gemm_terms(high, low, num_tokens, ys[i], *gemm, stream);
  }
  if (grouped.size() < 2 || !bf16_group_supported(in_features, x)) {
    for (const size_t i : grouped) linears[i]->forward(x, num_tokens, ys[i], scratch, gemm, stream);
    return;
  }
  std::vector<DenseGroupMember> members;
  int64_t rows = 0;
  for (const size_t i : grouped) {
    members.push_back(DenseGroupMember{.weight = linears[i]->data_.data(), .out_features = linears[i]->out_features_,
                                       .y = ys[i]});
    rows += linears[i]->out_features_;
  }
  const int64_t scratch_floats = bf16_group_scratch_floats(rows, in_features);
  float* partial = scratch_floats > 0 ? scratch.floats(static_cast<size_t>(scratch_floats)) : nullptr;
  check(bf16_linear_group(members.data(), static_cast<int>(members.size()), in_features, x, num_tokens, partial,
                          scratch.counters(static_cast<size_t>(dense_counter_count())), stream, input),
        "bf16 linear group launch");
}

void DeviceLinear::forward_as_gemm(const float* x, int64_t num_tokens, float* y, Scratch& scratch, Gemm& gemm,
                                   cudaStream_t stream) const {
  require(exl3_ || dense_type_ == DenseWeightType::bf16, "'{}': no GEMM path for {} weights", name_,
          dense_type_ == DenseWeightType::f8_e4m3 ? "fp8" : "f32/f16");
  if (exl3_ && view_.in_padded * view_.out_padded * 2 <= kExl3DecodeOnceMaxBytes) {
    exl3_decoded_gemm(x, num_tokens, y, scratch, gemm, stream);
  } else if (exl3_) {
    const LinearJob job{.linear = this, .x = x, .num_tokens = num_tokens, .y = y};
    const LinearJob* const jobs[] = {&job};
    exl3_gemm_groups(jobs, scratch, stream);
  } else {
    const auto [high, low] = split_into(x, num_tokens, in_features_, input_, scratch, stream);
    bf16_gemm_terms(high, low, num_tokens, y, gemm, stream);
  }
}

std::pair<const uint16_t*, const uint16_t*> DeviceLinear::split_into(const float* x, int64_t num_tokens, int64_t k,
                                                                     ProductInput input, Scratch& scratch,
                                                                     cudaStream_t stream) {
  const size_t plane = aligned_floats(static_cast<size_t>(num_tokens * k) * 2);
  auto* high = reinterpret_cast<uint16_t*>(scratch.floats(2 * plane));
  auto* low = input == ProductInput::bf16 ? nullptr
                                          : reinterpret_cast<uint16_t*>(reinterpret_cast<float*>(high) + plane);
  check(split_bf16(x, num_tokens * k, high, low, stream), "bf16 split launch");
  return {high, low};
}

void DeviceLinear::bf16_gemm_terms(const uint16_t* high, const uint16_t* low, int64_t num_tokens, float* y,
                                   Gemm& gemm, cudaStream_t stream) const {
  gemm.run(GemmInput::bf16, high, num_tokens, in_features_, data_.data(), GemmWeights::rows_are_outputs,
           out_features_, y, stream);
  if (low == nullptr) return;
  gemm.run(GemmInput::bf16, low, num_tokens, in_features_, data_.data(), GemmWeights::rows_are_outputs,
           out_features_, y, stream, /*accumulate=*/true);
}

void DeviceLinear::forward_jobs(std::span<const LinearJob> jobs, Scratch& scratch, Gemm* gemm, cudaStream_t stream) {
  const bool gemm_usable = gemm != nullptr && gemm->available();
  // The EXL3 jobs of the first one's format share the GEMM's launches: those from gemm_min_tokens() rows, and where
  // the list holds a full group of that format, every one (a block among a launch's hundreds costs less than GEMV
  // launches of its own: a MoE layer's experts that got few of a prefill chunk's tokens).
  const Exl3DeviceView* format = nullptr;
  size_t same_format = 0;
  for (const LinearJob& job : jobs) {
    if (!job.linear->exl3_ || job.num_tokens == 0) continue;
    if (format == nullptr) format = &job.linear->view_;
    if (same_exl3_format(*format, job.linear->view_)) ++same_format;
  }
  const bool group_all = same_format >= kExl3GroupMax;
  std::vector<const LinearJob*> grouped;
  for (const LinearJob& job : jobs) {
    const DeviceLinear& linear = *job.linear;
    require(job.num_tokens <= 65535, "CUDA linear '{}': {} tokens in one call (at most 65535)", linear.name_,
            job.num_tokens);
    const bool joins = gemm_usable && linear.exl3_ && job.num_tokens > 0 &&
                       same_exl3_format(*format, linear.view_) &&
                       (group_all || job.num_tokens >= linear.gemm_min_tokens());
    if (joins) {
      grouped.push_back(&job);
    } else {
      linear.forward(job.x, job.num_tokens, job.y, scratch, gemm, stream);
    }
  }
  if (!grouped.empty()) exl3_gemm_groups(grouped, scratch, stream);
}

void DeviceLinear::exl3_gemm_groups(std::span<const LinearJob* const> jobs, Scratch& scratch, cudaStream_t stream) {
  const Exl3DeviceView& shape = jobs.front()->linear->view_;
  const auto k = static_cast<size_t>(shape.in_padded);
  // Jobs sorted by rows, so that a group's members need alike numbers of 64-row blocks (the launch's grid has the
  // most of them; a shorter member's extra blocks return at once).
  std::vector<const LinearJob*> sorted(jobs.begin(), jobs.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const LinearJob* a, const LinearJob* b) { return a->num_tokens > b->num_tokens; });
  for (size_t first = 0; first < sorted.size(); first += kExl3GroupMax) {
    const size_t count = std::min<size_t>(kExl3GroupMax, sorted.size() - first);
    // Scratch: each member's rotated inputs, fp16 [rows, in_padded].
    const auto x_floats = [&](const LinearJob* job) {
      return aligned_floats(static_cast<size_t>(job->num_tokens) * k * 2);
    };
    size_t group_floats = 0;
    for (size_t i = 0; i < count; ++i) group_floats += x_floats(sorted[first + i]);
    float* rotated_x = scratch.floats(group_floats);
    Exl3Group group;
    group.count = static_cast<int>(count);
    for (size_t i = 0; i < count; ++i) {
      const LinearJob& job = *sorted[first + i];
      const Exl3DeviceView& view = job.linear->view_;
      group.members[i] = Exl3GroupMember{.trellis = view.trellis,
                                         .suh = view.suh,
                                         .svh = view.svh,
                                         .num_tokens = job.num_tokens,
                                         .x = job.x,
                                         .rotated_x = reinterpret_cast<uint16_t*>(rotated_x),
                                         .y = job.y};
      rotated_x += x_floats(&job);
    }
    check(exl3_rotate_inputs(shape, group, stream), "EXL3 input rotation launch");
    check(exl3_trellis_gemm(shape, group, jobs.front()->linear->sm_count_, stream), "EXL3 GEMM launch");
  }
}

void DeviceLinear::exl3_decoded_gemm(const float* x, int64_t num_tokens, float* y, Scratch& scratch, Gemm& gemm,
                                     cudaStream_t stream) const {
  const auto k = static_cast<size_t>(view_.in_padded), n = static_cast<size_t>(view_.out_padded),
             rows = static_cast<size_t>(num_tokens);
  // Scratch: Ŵ fp16 [in_padded, out_padded], the rotated inputs fp16 [T, in_padded], the product [T, out_padded].
  const size_t w_floats = aligned_floats(k * n * 2), x_floats = aligned_floats(rows * k * 2);
  float* decoded = scratch.floats(w_floats + x_floats + aligned_floats(rows * n * 4));
  float* rotated_x = decoded + w_floats;
  float* product = rotated_x + x_floats;
  Exl3Group group;
  group.count = 1;
  group.members[0] = Exl3GroupMember{.trellis = view_.trellis,
                                     .suh = view_.suh,
                                     .svh = view_.svh,
                                     .num_tokens = num_tokens,
                                     .x = x,
                                     .rotated_x = reinterpret_cast<uint16_t*>(rotated_x),
                                     .y = y,
                                     .decoded = reinterpret_cast<uint16_t*>(decoded),
                                     .rotated_y = product};
  check(exl3_decode_rotated(view_, group, stream), "EXL3 decode launch");
  check(exl3_rotate_inputs(view_, group, stream), "EXL3 input rotation launch");
  gemm.run(GemmInput::f16, rotated_x, num_tokens, view_.in_padded, decoded, GemmWeights::rows_are_inputs,
           view_.out_padded, product, stream);
  check(exl3_rotate_outputs(view_, group, stream), "EXL3 output rotation launch");
}

void DeviceLinear::gather_rows(const int32_t* ids, int64_t num_tokens, float* out, cudaStream_t stream) const {
  require(!exl3_, "'{}' is EXL3: the CUDA row gather takes f32, f16 and bf16 tables", name_);
  check(cuda::gather_rows(data_.data(), dense_type_, in_features_, ids, num_tokens, out, stream), "row gather launch");
}

}  // namespace kestrel::cuda
