// EXL3 linear on the GPU (shared/docs/exl3-format.md §2.6 forward pipeline): y = ((x ⊙ suh)·Hk · Ŵ)·Hn ⊙ svh, with
// Ŵ decoded from the packed trellis in registers (never stored) and multiplied on the tensor cores: float32
// activations in and out, the rotated inputs rounded to fp16, each weight's two fp16 codebook halves multiplied
// and summed in float32 (the CPU decoder rounds their sum to fp16 first; the difference is within fp16 rounding). One launch per 16 tokens does the input rotation, the GEMM split over k, and the output rotation
// (exl3_kernels.cu); the k-split partials are summed in a fixed order, so results are deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kestrel::cuda {

// The device data of one EXL3 matrix.
struct Exl3MatrixRef {
  const uint32_t* trellis = nullptr;
  const uint16_t* suh = nullptr;
  const uint16_t* svh = nullptr;
};

// Device pointers of one EXL3 matrix: trellis int16 [in_padded/16, out_padded/16, 16*bits] read as 32-bit words,
// suh fp16 [in_padded], svh fp16 [out_padded]. codebook is exl3::Codebook's value.
struct Exl3DeviceView {
  const uint32_t* trellis = nullptr;
  const uint16_t* suh = nullptr;
  const uint16_t* svh = nullptr;
  int bits = 0;
  int codebook = 0;
  int64_t in_features = 0, out_features = 0, in_padded = 0, out_padded = 0;
};

// Whether two matrices have one size, padding, bitrate and codebook: what one launch over several of them needs.
inline bool same_exl3_format(const Exl3DeviceView& a, const Exl3DeviceView& b) {
  return a.bits == b.bits && a.codebook == b.codebook && a.in_features == b.in_features &&
         a.out_features == b.out_features && a.in_padded == b.in_padded && a.out_padded == b.out_padded;
}

// How a matrix's k dimension is cut for a device: slices of slice_tiles 16-row tiles (a multiple of 8, so that a
// slice is whole 128-row Hadamard blocks), enough of them to occupy every SM at batch 1.
struct Exl3Plan {
  int64_t slice_tiles = 8;
  int splits = 1;
};
Exl3Plan exl3_plan(const Exl3DeviceView& matrix, int sm_count);
// Floats of scratch one exl3_linear call needs (the per-slice partial sums), and the number of unsigned counters it
// synchronises its slices with: device memory, zero before the first call, left zero by every call.
size_t exl3_scratch_floats(const Exl3DeviceView& matrix, const Exl3Plan& plan);
// The same per slot of exl3_slot_linear (one token each).
size_t exl3_slot_scratch_floats(const Exl3DeviceView& matrix, const Exl3Plan& plan);
size_t exl3_counter_count(const Exl3DeviceView& matrix);
// y[T, out_features] = x[T, in_features] W^T, all float32 device memory. Calls sharing `counters` must not overlap.
cudaError_t exl3_linear(const Exl3DeviceView& matrix, const Exl3Plan& plan, const float* x, int64_t num_tokens,
                        float* y, float* scratch, unsigned* counters, cudaStream_t stream);

// Which matrix each slot of exl3_slot_linear applies: slot s takes matrices[ids[s / id_group] * stride +
// s % id_group]. A table of `stride` matrices per expert (gate and up interleaved: stride 2) serves one launch for
// all of an expert's matrices (id_group = stride: slot s is routed slot s / stride) or one per matrix (id_group 1,
// matrices offset to the wanted one). matrices and ids are device memory; every id must index the table.
struct Exl3SlotTable {
  const Exl3MatrixRef* matrices = nullptr;
  const int32_t* ids = nullptr;
  int64_t id_group = 1, stride = 1;
};

// What the slots of exl3_slot_linear multiply: slot s reads row s / group of x. With swiglu, row r is the pair of
// rows 2r (gate) and 2r + 1 (up) of x, each in_features wide, and the input is clamped_swiglu(gate, up,
// swiglu_limit) elementwise: the MoE down projection reading the gate and up launch's output directly.
struct Exl3SlotInput {
  const float* x = nullptr;
  int64_t group = 1;
  bool swiglu = false;
  float swiglu_limit = 0.0f;
};

// The routed-expert form, one launch for all slots (a slot is one token's use of one expert matrix): for s in
// [0, slots), y[s, out_features] = input(s) W^T with W the table's matrix of slot s. All the table's matrices have
// `shape`'s size, bits and codebook (its pointers are not used). Scratch and counters are per slot: slots times
// exl3_slot_scratch_floats / exl3_counter_count. At most 65535 slots.
cudaError_t exl3_slot_linear(const Exl3DeviceView& shape, const Exl3Plan& plan, const Exl3SlotTable& table,
                             int64_t slots, const Exl3SlotInput& input, float* y, float* scratch, unsigned* counters,
                             cudaStream_t stream);

// The large-batch forms, both after the inputs are rotated into fp16 [T, in_padded] (exl3_rotate_inputs):
//  - in registers (exl3_trellis_gemm): the product with Ŵ on the tensor cores, Ŵ decoded tile by tile in registers
//    once per 64 or 128 rows (the fp16 sums exl3::decode_rotated makes, never stored), rotated back into y; for
//    matrices with a few hundred rows each, such as a MoE layer's experts in a prefill chunk, a group at a time;
//  - decoded once (exllamav3 reconstructs too): Ŵ into fp16 [in_padded, out_padded] (exl3_decode_rotated, bit-exact
//    with exl3::decode_rotated), the product by cuBLASLt (gemm.h) into rotated_y, rotated back by
//    exl3_rotate_outputs; for one matrix with many rows, whose Ŵ fits in scratch.
// Each step takes a group of up to kExl3GroupMax matrices of one shape and format at once, each with its own rows
// (one launch per step for the group instead of one per matrix).
constexpr int kExl3GroupMax = 16;
struct Exl3GroupMember {
  const uint32_t* trellis = nullptr;
  const uint16_t* suh = nullptr;
  const uint16_t* svh = nullptr;
  int64_t num_tokens = 0;
  const float* x = nullptr;           // [num_tokens, in_features]
  uint16_t* rotated_x = nullptr;      // fp16 [num_tokens, in_padded]
  float* y = nullptr;                 // [num_tokens, out_features]
  uint16_t* decoded = nullptr;        // decoded once: fp16 [in_padded, out_padded]
  const float* rotated_y = nullptr;   // decoded once: the product, [num_tokens, out_padded]
};
struct Exl3Group {
  Exl3GroupMember members[kExl3GroupMax];
  int count = 0;
};
// shape gives the members' size, bits and codebook (its pointers are not used).
cudaError_t exl3_rotate_inputs(const Exl3DeviceView& shape, const Exl3Group& group, cudaStream_t stream);
// The GEMM's block rows: 128 where that still gives every SM a block and the block's 102 KiB of shared memory fit
// in max_shared (sm_90's 227 KiB do, the 99 KiB of sm_86, sm_89 and the 12.x parts do not), else 64 (51 KiB).
int exl3_gemm_block_rows(const Exl3Group& group, int64_t out_padded, int sm_count, size_t max_shared);
// sm_count (the device's) and its shared memory choose the block rows (exl3_gemm_block_rows).
cudaError_t exl3_trellis_gemm(const Exl3DeviceView& shape, const Exl3Group& group, int sm_count, cudaStream_t stream);
cudaError_t exl3_decode_rotated(const Exl3DeviceView& shape, const Exl3Group& group, cudaStream_t stream);
cudaError_t exl3_rotate_outputs(const Exl3DeviceView& shape, const Exl3Group& group, cudaStream_t stream);

}  // namespace kestrel::cuda
