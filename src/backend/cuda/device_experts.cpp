#include "backend/cuda/device_experts.h"

#include <algorithm>

#include "backend/cuda/elementwise_kernels.h"
#include "base/error.h"

namespace kestrel::cuda {

DeviceExperts DeviceExperts::upload(const std::vector<ExpertWeights>& experts, int sm_count) {
  require(!experts.empty(), "an MoE layer without experts");
  DeviceExperts result;
  result.linears_.reserve(experts.size() * 3);
  for (const ExpertWeights& expert : experts) {
    for (const LinearWeight* weight : {&expert.gate, &expert.up, &expert.down}) {
      require(weight->exl3.has_value(), "expert weight '{}' is {}: the CUDA MoE path takes EXL3 experts", weight->name,
              dtype_name(weight->dtype));
      result.linears_.push_back(DeviceLinear::upload(*weight, sm_count));
    }
  }
  Projection* projections[] = {&result.gate_, &result.up_, &result.down_};
  for (int which = 0; which < 3; ++which) {
    const DeviceLinear& first = result.linears_[static_cast<size_t>(which)];
    std::vector<Exl3MatrixRef> refs;
    for (size_t e = 0; e < experts.size(); ++e) {
      const DeviceLinear& linear = result.linears_[e * 3 + static_cast<size_t>(which)];
      const Exl3DeviceView& view = *linear.exl3();
      const Exl3DeviceView& base = *first.exl3();
      require(view.bits == base.bits && view.codebook == base.codebook && view.in_features == base.in_features &&
                  view.out_features == base.out_features,
              "expert weight '{}' differs from '{}' in shape, bitrate or codebook", linear.name(), first.name());
      refs.push_back(Exl3MatrixRef{.trellis = view.trellis, .suh = view.suh, .svh = view.svh});
    }
    Projection& projection = *projections[which];
    projection.shape = *first.exl3();
    projection.table = DeviceBuffer::copy_of(refs.data(), refs.size() * sizeof(Exl3MatrixRef));
  }
  result.sm_count_ = sm_count;
  result.expert_bytes_ = result.linears_[0].weight_bytes() + result.linears_[1].weight_bytes() +
                         result.linears_[2].weight_bytes();
  return result;
}

unsigned* DeviceExperts::counters(int64_t slots) const {
  const size_t per_slot = std::max({exl3_counter_count(gate_.shape), exl3_counter_count(up_.shape),
                                    exl3_counter_count(down_.shape)});
  const size_t bytes = static_cast<size_t>(slots) * per_slot * sizeof(unsigned);
  if (counters_.size() < bytes) {
    check(cudaDeviceSynchronize(), "expert counters resize");  // kernels in flight may still use the old ones
    counters_ = DeviceBuffer(bytes);
    counters_.zero();
  }
  return counters_.as<unsigned>();
}

void DeviceExperts::forward(const float* x, int64_t num_tokens, int64_t top_k, const int32_t* ids,
                            const float* weights, float swiglu_limit, float* out, Scratch& scratch,
                            cudaStream_t stream) const {
  const int64_t slots = num_tokens * top_k;
  if (slots == 0) return;
  require(slots <= 65535, "CUDA MoE: {} token-expert slots in one call (at most 65535)", slots);
  const int64_t hidden = gate_.shape.in_features, intermediate = gate_.shape.out_features;
  // The slots share the SMs: each projection's k-split is planned for its share, so a decode step's 8 slots get
  // long slices (fewer partials and hand-offs) instead of the single-matrix split.
  const int share = std::max<int>(1, sm_count_ / static_cast<int>(std::min<int64_t>(slots, sm_count_)));
  const Exl3Plan gate_plan = exl3_plan(gate_.shape, share), up_plan = exl3_plan(up_.shape, share),
                 down_plan = exl3_plan(down_.shape, share);
  // Scratch: gate and up outputs [slots, I] (the activation overwrites gate), down outputs [slots, hidden], then the
  // k-split partials of the largest projection.
  const size_t partial = std::max({exl3_scratch_floats(gate_.shape, gate_plan), exl3_scratch_floats(up_.shape, up_plan),
                                   exl3_scratch_floats(down_.shape, down_plan)}) *
                         static_cast<size_t>(slots);
  const auto n_i = static_cast<size_t>(slots * intermediate), n_d = static_cast<size_t>(slots * hidden);
  float* gate = scratch.floats(2 * n_i + n_d + partial);
  float* up = gate + n_i;
  float* down = up + n_i;
  float* partials = down + n_d;
  unsigned* slot_counters = counters(slots);
  check(exl3_slot_linear(gate_.shape, gate_plan, gate_.table.as<Exl3MatrixRef>(), ids, slots, x, top_k, gate,
                         partials, slot_counters, stream),
        "expert gate launch");
  check(exl3_slot_linear(up_.shape, up_plan, up_.table.as<Exl3MatrixRef>(), ids, slots, x, top_k, up, partials,
                         slot_counters, stream),
        "expert up launch");
  check(clamped_swiglu(gate, up, static_cast<int64_t>(n_i), swiglu_limit, gate, stream), "expert activation launch");
  check(exl3_slot_linear(down_.shape, down_plan, down_.table.as<Exl3MatrixRef>(), ids, slots, gate, 1, down,
                         partials, slot_counters, stream),
        "expert down launch");
  check(weighted_slot_sum(down, weights, num_tokens, top_k, hidden, out, stream), "expert combine launch");
}

}  // namespace kestrel::cuda
