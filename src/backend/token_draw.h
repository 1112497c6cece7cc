// The sampler's last stage, one row of logits to a token: greedy argmax, or temperature → min_p → top_k → top_p
// and a walk from the most likely kept token down to where a uniform u lands in their mass. Everything before it (logit
// bias, min_tokens, penalties, logprobs) needs the request's tokens and stays with the engine's sampler; this part
// needs only the logits and u, so a backend runs it where the logits are (Backend::draw_tokens: here on the host, the
// CUDA backend on the GPU, which then copies back a token instead of a vocabulary of logits).
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <vector>

namespace kestrel {

struct TokenDraw {
  float temperature = 1.0f;  // below 1e-5: greedy (SamplingParams::greedy)
  float min_p = 0.0f;        // [0, 1]
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0 or negative: off
  double u = 0.0;            // [0, 1): where the draw lands in the kept tokens' mass; unused when greedy

  bool greedy() const { return temperature < 1e-5f; }
};

// u as the sampler takes it from a generator's 64-bit output: its top 53 bits as a fraction.
inline double uniform_of(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// A token's weight as the draw and the logprobs take it, exp(x) for x = logit - largest logit <= 0: a degree-7
// polynomial on a Cody-Waite reduction, within 2 ulp of exp, 0 below -87 (where exp leaves float's normal range) and
// for NaN; float operations only (no fused multiply-adds), so the same bits on every machine and on the GPU.
inline float sampling_weight(float x) {
  const bool kept = x > -87.0f;  // false for NaN
  x = kept ? x : -87.0f;
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // x / ln 2 rounded to an integer
  const float r = (x - n * 0.693145752f) - n * 1.42860682e-6f;   // x - n ln 2, ln 2 in two parts
  float p = 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = p * r + c;
  const auto two_to_n = std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return p * two_to_n * (kept ? 1.0f : 0.0f);
}

// A token's place in the ranking as one integer, larger ranking first: the logit's bits made monotonic (-0 as +0, so
// that equal logits tie), then the id inverted (ties go to the lower id).
inline uint64_t rank_key(float logit, int32_t id) {
  const uint32_t bits = std::bit_cast<uint32_t>(logit == 0.0f ? 0.0f : logit);
  const uint32_t ordered = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<uint64_t>(ordered) << 32) | ~static_cast<uint32_t>(id);
}
inline int32_t id_of_rank_key(uint64_t key) { return static_cast<int32_t>(~static_cast<uint32_t>(key)); }

// The largest logit, NaN ignored (-inf when every logit is NaN or -inf).
float largest_logit(std::span<const float> logits);

// Every token's sampling_weight(l - max_logit), in a per-thread buffer kept from call to call (valid until the
// thread's next call).
std::span<const float> token_weights(std::span<const float> logits, float max_logit);

// The weights' total over the tokens whose logit is at least `threshold` (weights[i] belongs to logits[i]): summed in
// double in eight interleaved runs of ids (so the additions do not wait on each other), then the runs in order.
double kept_weight_total(std::span<const float> logits, std::span<const float> weights, float threshold);

// The token `draw` takes from `logits` [vocab]. The logits are divided by the temperature in place (when it is not 1).
// Greedy: the first largest logit's id, NaN never (0 when none is finite or +inf). Otherwise the kept tokens are
// those within min_p of the most likely, then the top_k most likely (ties with the k-th kept), then the smallest set
// of the most likely whose mass reaches top_p; the draw walks them from the most likely down, summing weights in
// double, and takes the first whose running sum exceeds u times their total (past the end, the least likely that
// weighs anything, else the most likely; 0 when every logit is NaN or -inf).
int32_t draw_token(std::span<float> logits, const TokenDraw& draw);

}  // namespace kestrel
