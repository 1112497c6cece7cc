// The sampler's last stage on the GPU (Backend::draw_tokens, backend/token_draw.h's draw_token): rows of logits to
// tokens, so that a decode step copies back a token per sequence instead of a vocabulary of floats. Greedy rows take
// the first largest logit; the others rank their kept tokens by a radix sort (stable, so equal logits keep the lower
// id first, as the host's ranking does), sum the weights and walk them from the most likely down to u's place.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kestrel::cuda {

// backend/token_draw.h's TokenDraw as the kernels take it.
struct DeviceDraw {
  float temperature = 1.0f, min_p = 0.0f, top_p = 1.0f;
  int64_t top_k = 0;
  double u = 0.0;
};

constexpr int kMaxDrawRows = 16;  // rows one draw_tokens call takes (its sort scratch grows with them)

struct DrawTokensArgs {
  int rows = 0;  // <= kMaxDrawRows
  int64_t vocab = 0;
  const float* logits = nullptr;  // [rows, vocab]
  DeviceDraw draws[kMaxDrawRows];
  int32_t* tokens = nullptr;      // device [rows]
  void* scratch = nullptr;        // draw_tokens_scratch_bytes(rows, vocab), 256-byte aligned
};

size_t draw_tokens_scratch_bytes(int rows, int64_t vocab);
// Queues the draw on `stream`; invalid shapes give cudaErrorInvalidValue.
cudaError_t draw_tokens(const DrawTokensArgs& args, cudaStream_t stream);

}  // namespace kestrel::cuda
