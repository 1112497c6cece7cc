// One MoE layer's routed experts on the GPU, EXL3 only (the format of the deployed checkpoint's experts), and the
// fused decode path over them: with the router's choices in device memory, a layer is three launches whatever the
// routing (gate and up together for every slot; down for every slot, applying the clamped SwiGLU to the gate and
// up outputs as it reads them; the weighted combine; five when gate and up differ in format), without a host round
// trip, so a decode step can be captured as a CUDA graph. A slot is one token's use of one of its top_k
// experts; each slot reads its expert's matrices once, so tokens sharing an expert read it once each (grouping
// them is future work for large batches).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_linear.h"

namespace kestrel::cuda {

class DeviceExperts {
public:
  // Uploads every expert's gate, up and down. All must be EXL3 with one bitrate and codebook per projection and the
  // same shapes; anything else is refused with an Error naming the tensor.
  static DeviceExperts upload(const std::vector<ExpertWeights>& experts, int sm_count);

  // out[T, hidden] += sum over j < top_k of weights[t, j] * down_e(clamped_swiglu(gate_e x_t, up_e x_t)), e = ids[t, j].
  // x, ids [T, top_k] (valid expert indices), weights [T, top_k] and out are device memory.
  void forward(const float* x, int64_t num_tokens, int64_t top_k, const int32_t* ids, const float* weights,
               float swiglu_limit, float* out, Scratch& scratch, cudaStream_t stream) const;

  int64_t num_experts() const { return static_cast<int64_t>(linears_.size() / 3); }
  // Each expert's matrices as single linears: gate, up, down of expert 0, then expert 1, ... (for calls with many
  // tokens per expert, which read each expert once per 16 of its tokens instead of once per slot).
  const std::vector<DeviceLinear>& linears() const { return linears_; }
  // Bytes of one expert's three matrices: what one slot reads.
  size_t expert_bytes() const { return expert_bytes_; }

private:
  struct Projection {
    Exl3DeviceView shape;  // pointers unused: the table holds them
    DeviceBuffer table;    // Exl3MatrixRef per expert
  };
  // Grows the slot counters to `slots` (new ones zeroed).
  unsigned* counters(int64_t slots) const;

  std::vector<DeviceLinear> linears_;  // gate, up, down of expert 0, then expert 1, ...
  Exl3DeviceView gate_shape_, up_shape_;  // pointers unused
  DeviceBuffer gate_up_table_;            // Exl3MatrixRef per expert: its gate, then its up
  bool one_gate_up_launch_ = false;       // gate and up of one shape, bitrate and codebook
  Projection down_;
  size_t expert_bytes_ = 0;
  int sm_count_ = 1;
  mutable DeviceBuffer counters_;  // per slot, the largest projection's counters; zero between calls
};

}  // namespace kestrel::cuda
