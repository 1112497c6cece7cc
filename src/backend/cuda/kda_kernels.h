// The KDA (Kimi Delta Attention) block's own ops on the GPU, with the semantics of the CPU backend (cpu/kda.cpp,
// cpu/elementwise.cpp): the short causal conv + SiLU, the forget gate and the gated delta rule. All pointers are
// float32 device memory unless noted; every launcher returns the launch's error (cudaSuccess when it was queued).
//
// The delta rule is decode-first: one warp owns 4 value columns of one head's [head_dim, head_dim] state in
// registers for every token of the call, so the state is read and written once per call and warps never
// synchronise; a decode step runs the whole block between the projections and o_proj in one launch. The
// multi-token form (kda_chunked) runs the same recurrence token by token; the chunked WY form on the tensor cores
// (what prefill wants) is future work. Both forms compute the same recurrence, so they differ from the CPU's WY form
// only by rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kestrel::cuda {

// KdaArgs (backend/backend.h) with device pointers; backend.h itself needs C++20, which nvcc is not given.
struct KdaDeviceArgs {
  int64_t num_tokens, num_heads, head_dim;
  const float* q;     // [T, heads, head_dim] after conv + SiLU, not yet normalised
  const float* k;     // [T, heads, head_dim] after conv + SiLU, not yet normalised
  const float* v;     // [T, heads, head_dim] after conv + SiLU
  const float* g;     // [T, heads, head_dim] log-decay per key channel
  const float* beta;  // [T, heads]
  float* state;       // [heads, head_dim (k), head_dim (v)], read and updated in place; 16-byte aligned
  float* out;         // [T, heads, head_dim]
};

// KdaDecodeArgs (backend/backend.h) with device pointers, the lower bound by value (bounded false: none).
struct KdaDecodeDeviceArgs {
  int64_t num_sequences, num_heads, head_dim, conv_kernel;
  const float *q_in, *k_in, *v_in;        // [S, heads * head_dim] before the conv
  const float *q_conv, *k_conv, *v_conv;  // [heads * head_dim, conv_kernel]
  const float* f_low;   // [S, head_dim] the forget gate's first projection
  const void* f_b;      // bf16 [heads * head_dim, head_dim], its second
  const float *a_log, *dt_bias;
  bool bounded;
  float lower_bound;
  const float* beta;  // [S, heads] write-strength logits (read only)
  const float* gate_low;  // [S, head_dim] the output gate's first projection
  const void* g_b;        // bf16 [heads * head_dim, head_dim], its second
  bool round_lows;        // f_low and gate_low rounded to bf16 before their products (ProductInput::bf16)
  const float* o_norm;
  float eps;
  float* out;  // [S, heads * head_dim]
};

// Per-sequence state pointers of a decode step, passed by value in the launch (no upload): at most
// kMaxStepSequences a launch, the launcher splits larger batches.
constexpr int kMaxStepSequences = 64;
struct DecodeStates {
  float* conv[kMaxStepSequences];       // [3, conv_kernel - 1, heads * head_dim]: q, k, v
  float* recurrent[kMaxStepSequences];  // [heads, head_dim, head_dim], 16-byte aligned
};

// Causal depthwise conv over x [T, channels] with weight [channels, kernel], then SiLU into y [T, channels].
// conv_state [kernel-1, channels] holds the previous inputs and is updated to the last kernel-1 inputs. kernel must
// be in 1..8 (the model uses 4), else cudaErrorInvalidValue.
cudaError_t causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel,
                             const float* weight, float* conv_state, float* y, cudaStream_t stream);

// Forget gate per head h and channel c of f [T, heads, head_dim]: g = lower_bound * sigmoid(exp(a_log[h]) * (f +
// dt_bias[h, c])) when lower_bound (a host pointer) is set, else -exp(a_log[h]) * softplus(f + dt_bias[h, c]).
cudaError_t kda_gate(const float* f, int64_t num_tokens, int64_t num_heads, int64_t head_dim, const float* a_log,
                     const float* dt_bias, const float* lower_bound, float* g, cudaStream_t stream);

// The gated delta rule token by token, per head: q, k L2-normalised (eps 1e-6), q scaled by head_dim^-1/2;
// S = diag(exp(g)) S; delta = (v - S^T k) * beta; S += k delta^T; out = S^T q. head_dim must be 16, 32, 64 or 128
// (the model uses 128, the test fixtures 16) and state, q, k, g and v 16-byte aligned, else cudaErrorInvalidValue.
cudaError_t kda_recurrent(const KdaDeviceArgs& args, cudaStream_t stream);
// The same with the shared memory a block may take given (the overload above asks the device): chunks of 32 tokens
// where they fit (104 KiB at head_dim 128), else of 16, as on sm_86, sm_89 and the 12.x parts.
cudaError_t kda_recurrent(const KdaDeviceArgs& args, cudaStream_t stream, size_t max_shared);

// A decode step of the KDA block after its projections (Backend::kda_decode_steps) in one launch per 64 sequences:
// a block per head and sequence holds the head's state and runs the conv, the gates' second projections (its head's
// rows of f_b and g_b), the gates, the delta rule and the gated norm. conv_states[s] and states[s] are sequence s's; head_dim and conv_kernel as above, states 16-byte aligned,
// else cudaErrorInvalidValue.
cudaError_t kda_decode_steps(const KdaDecodeDeviceArgs& args, float* const* conv_states, float* const* states,
                             cudaStream_t stream);

// The multi-token call (Backend::kda_chunked). Today the recurrence above over all T tokens; chunk_size (>= 1, else
// cudaErrorInvalidValue) is the chunk length the tensor-core WY form will take.
cudaError_t kda_chunked(const KdaDeviceArgs& args, int64_t chunk_size, cudaStream_t stream);

}  // namespace kestrel::cuda
