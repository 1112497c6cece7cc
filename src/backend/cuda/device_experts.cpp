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
  // Per projection, every expert's matrix checked against expert 0's; gate and up go into one table, interleaved.
  std::vector<Exl3MatrixRef> refs[3];
  for (int which = 0; which < 3; ++which) {
    const Exl3DeviceView& base = *result.linears_[static_cast<size_t>(which)].exl3();
    for (size_t e = 0; e < experts.size(); ++e) {
      const DeviceLinear& linear = result.linears_[e * 3 + static_cast<size_t>(which)];
      const Exl3DeviceView& view = *linear.exl3();
      require(view.bits == base.bits && view.codebook == base.codebook && view.in_features == base.in_features &&
                  view.out_features == base.out_features,
              "expert weight '{}' differs from '{}' in shape, bitrate or codebook", linear.name(),
              result.linears_[static_cast<size_t>(which)].name());
      refs[which].push_back(Exl3MatrixRef{.trellis = view.trellis, .suh = view.suh, .svh = view.svh});
    }
  }
  std::vector<Exl3MatrixRef> gate_up;
  for (size_t e = 0; e < experts.size(); ++e) gate_up.insert(gate_up.end(), {refs[0][e], refs[1][e]});
  result.gate_shape_ = *result.linears_[0].exl3();
  result.up_shape_ = *result.linears_[1].exl3();
  result.gate_up_table_ = DeviceBuffer::copy_of(gate_up.data(), gate_up.size() * sizeof(Exl3MatrixRef));
  result.one_gate_up_launch_ = same_exl3_format(result.gate_shape_, result.up_shape_);
  result.down_.shape = *result.linears_[2].exl3();
  result.down_.table = DeviceBuffer::copy_of(refs[2].data(), refs[2].size() * sizeof(Exl3MatrixRef));
  result.sm_count_ = sm_count;
  result.expert_bytes_ = result.linears_[0].weight_bytes() + result.linears_[1].weight_bytes() +
                         result.linears_[2].weight_bytes();
  return result;
}

unsigned* DeviceExperts::counters(int64_t slots) const {
  const size_t per_slot = std::max({exl3_counter_count(gate_shape_), exl3_counter_count(up_shape_),
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
  require(2 * slots <= 65535, "CUDA MoE: {} token-expert slots in one call (at most 32767)", slots);
  const int64_t hidden = gate_shape_.in_features, intermediate = gate_shape_.out_features;
  // The launch's matrices share the SMs: each projection's k-split is planned for its share, so a decode step's 16
  // gate and up matrices get long slices (fewer partials and hand-offs) instead of the single-matrix split.
  const auto share = [&](int64_t matrices) {
    return std::max<int>(1, sm_count_ / static_cast<int>(std::min<int64_t>(matrices, sm_count_)));
  };
  const int64_t gate_up_matrices = one_gate_up_launch_ ? 2 * slots : slots;
  const Exl3Plan gate_plan = exl3_plan(gate_shape_, share(gate_up_matrices)),
                 up_plan = exl3_plan(up_shape_, share(gate_up_matrices)),
                 down_plan = exl3_plan(down_.shape, share(slots));
  // Scratch: gate and up outputs [slots, 2, I] (interleaved when one launch computes both, else gate [slots, I]
  // then up, and their activation [slots, I]), down outputs [slots, hidden], then the k-split partials of the largest
  // projection for every matrix of a launch.
  const size_t partial = std::max({exl3_slot_scratch_floats(gate_shape_, gate_plan),
                                   exl3_slot_scratch_floats(up_shape_, up_plan),
                                   exl3_slot_scratch_floats(down_.shape, down_plan)}) *
                         static_cast<size_t>(2 * slots);
  const auto n_i = static_cast<size_t>(slots * intermediate), n_d = static_cast<size_t>(slots * hidden);
  float* gate_up = scratch.floats(3 * n_i + n_d + partial);
  float* activation = gate_up + 2 * n_i;
  float* down = activation + n_i;
  float* partials = down + n_d;
  unsigned* slot_counters = counters(2 * slots);
  const auto* table = gate_up_table_.as<Exl3MatrixRef>();
  Exl3SlotInput down_input{.x = activation};
  if (one_gate_up_launch_) {
    check(exl3_slot_linear(gate_shape_, gate_plan, Exl3SlotTable{.matrices = table, .ids = ids, .id_group = 2,
                                                                 .stride = 2},
                           2 * slots, Exl3SlotInput{.x = x, .group = 2 * top_k}, gate_up, partials, slot_counters,
                           stream),
          "expert gate and up launch");
    // The down launch applies the activation to the (gate, up) row pairs as it reads them.
    down_input = Exl3SlotInput{.x = gate_up, .swiglu = true, .swiglu_limit = swiglu_limit};
  } else {
    float* up = gate_up + n_i;
    check(exl3_slot_linear(gate_shape_, gate_plan, Exl3SlotTable{.matrices = table, .ids = ids, .stride = 2}, slots,
                           Exl3SlotInput{.x = x, .group = top_k}, gate_up, partials, slot_counters, stream),
          "expert gate launch");
    check(exl3_slot_linear(up_shape_, up_plan, Exl3SlotTable{.matrices = table + 1, .ids = ids, .stride = 2}, slots,
                           Exl3SlotInput{.x = x, .group = top_k}, up, partials, slot_counters, stream),
          "expert up launch");
    check(clamped_swiglu(gate_up, up, static_cast<int64_t>(n_i), swiglu_limit, activation, stream),
          "expert activation launch");
  }
  check(exl3_slot_linear(down_.shape, down_plan, Exl3SlotTable{.matrices = down_.table.as<Exl3MatrixRef>(),
                                                                .ids = ids},
                         slots, down_input, down, partials, slot_counters, stream),
        "expert down launch");
  check(weighted_slot_sum(down, weights, num_tokens, top_k, hidden, out, stream), "expert combine launch");
}

}  // namespace kestrel::cuda
