#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/sampling_kernels.h"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRowBlocks = 64;      // blocks over one row in the maxima and key passes
constexpr int kWalkThreads = 512;
constexpr int kChunk = 32 * 64;        // the walk's unit: one warp's 64 steps of 32 tokens
constexpr int64_t kAlign = 256;

// Everything the kernels share: the caller's arguments, which rows are sorted and the scratch arrays.
struct DrawPlan {
  DrawTokensArgs args;
  int sorted = 0;                  // rows that are not greedy, sorted as segments 0 .. sorted - 1
  int sorted_row[kMaxDrawRows] = {};
  unsigned long long* partial = nullptr;  // [rows, kMaxRowBlocks] largest rank keys
  float* max_logit = nullptr;             // [rows], after the temperature
  unsigned* kept = nullptr;               // [rows] tokens kept by min_p
  unsigned long long* keys_in = nullptr;  // [sorted, vocab]: segment (high bits) and ordered logit (low 32)
  unsigned long long* keys_out = nullptr;
  int32_t* ids_in = nullptr;
  int32_t* ids_out = nullptr;
  void* sort_scratch = nullptr;
  size_t sort_bytes = 0;
  int row_blocks = 1;
};

__host__ __device__ __forceinline__ bool greedy(const DeviceDraw& d) { return d.temperature < 1e-5f; }

// A logit's bits made monotonic as unsigned integers (-0 as +0), and back: rank_key's high half.
__device__ __forceinline__ uint32_t ordered_bits(float logit) {
  const uint32_t bits = __float_as_uint(logit == 0.0f ? 0.0f : logit);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}
__device__ __forceinline__ float logit_of(uint32_t ordered) {
  return __uint_as_float((ordered & 0x80000000u) != 0 ? ordered & 0x7FFFFFFFu : ~ordered);
}

// The row's logit as the draw takes it: divided by the temperature unless greedy or 1 (IEEE division, as the host).
__device__ __forceinline__ float scaled_logit(const DeviceDraw& d, float l) {
  return greedy(d) || d.temperature == 1.0f ? l : __fdiv_rn(l, d.temperature);
}

// sampling_weight (backend/token_draw.h) with every operation rounded on its own, so the host's bits.
__device__ __forceinline__ float sampling_weight(float x) {
  const bool kept = x > -87.0f;
  x = kept ? x : -87.0f;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504f), 12582912.0f), 12582912.0f);
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693145752f)), __fmul_rn(n, 1.42860682e-6f));
  constexpr float kCoefficients[] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
  float p = 1.0f / 5040.0f;
#pragma unroll
  for (const float c : kCoefficients) p = __fadd_rn(__fmul_rn(p, r), c);
  const float two_to_n = __uint_as_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return __fmul_rn(__fmul_rn(p, two_to_n), kept ? 1.0f : 0.0f);
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ __forceinline__ double warp_inclusive_sum(double v) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  for (int offset = 1; offset < 32; offset <<= 1) {
    const double other = __shfl_up_sync(0xFFFFFFFFu, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

// Grid (row_blocks, rows): each block's largest rank key of its share of the row (the logit's ordered bits, then the
// id inverted, so the first largest wins), over logits above -inf (NaN never).
__global__ void __launch_bounds__(kThreads) row_maxima_kernel(DrawPlan p) {
  const int row = static_cast<int>(blockIdx.y);
  const DeviceDraw& d = p.args.draws[row];
  const int64_t V = p.args.vocab;
  const float* logits = p.args.logits + row * V;
  unsigned long long best = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < V;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float l = scaled_logit(d, logits[i]);
    if (l > -INFINITY) {
      const unsigned long long key =
          static_cast<unsigned long long>(ordered_bits(l)) << 32 | ~static_cast<uint32_t>(i);
      best = key > best ? key : best;
    }
  }
  __shared__ unsigned long long warps[kThreads / 32];
  best = warp_max(best);
  if ((threadIdx.x & 31u) == 0) warps[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = warp_max(threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : 0ull);
    if (threadIdx.x == 0) p.partial[row * kMaxRowBlocks + blockIdx.x] = best;
  }
}

// One warp per row: the row's largest key. Greedy rows take its id (0 when no logit is above -inf); the others keep
// the largest logit for the weights (-inf: the draw gives 0, as the host's).
__global__ void __launch_bounds__(32) finish_maxima_kernel(DrawPlan p) {
  const int row = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x);
  unsigned long long best = 0;
  for (int b = lane; b < p.row_blocks; b += 32) {
    const unsigned long long key = p.partial[row * kMaxRowBlocks + b];
    best = key > best ? key : best;
  }
  best = warp_max(best);
  if (lane != 0) return;
  p.kept[row] = 0;
  p.max_logit[row] = best == 0 ? -INFINITY : logit_of(static_cast<uint32_t>(best >> 32));
  if (greedy(p.args.draws[row]) || best == 0) {
    p.args.tokens[row] = best == 0 ? 0 : static_cast<int32_t>(~static_cast<uint32_t>(best));
  }
}

// Grid (row_blocks, sorted): segment s's keys and ids for the sort, a token min_p drops (or NaN, or -inf) with an
// ordered logit of 0 so that it sorts after every kept one; the kept tokens counted.
__global__ void __launch_bounds__(kThreads) rank_keys_kernel(DrawPlan p) {
  const int segment = static_cast<int>(blockIdx.y), row = p.sorted_row[segment];
  const DeviceDraw& d = p.args.draws[row];
  const int64_t V = p.args.vocab;
  const float* logits = p.args.logits + row * V;
  const float max_logit = p.max_logit[row];
  const float threshold = d.min_p > 0.0f ? __fadd_rn(max_logit, logf(d.min_p)) : -INFINITY;
  const unsigned long long high = static_cast<unsigned long long>(p.sorted - 1 - segment) << 32;
  unsigned kept = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < V;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float l = scaled_logit(d, logits[i]);
    const bool keep = l > -INFINITY && l >= threshold;
    kept += keep ? 1u : 0u;
    p.keys_in[segment * V + i] = high | (keep ? ordered_bits(l) : 0u);
    p.ids_in[segment * V + i] = static_cast<int32_t>(i);
  }
  for (int offset = 16; offset > 0; offset >>= 1) kept += __shfl_xor_sync(0xFFFFFFFFu, kept, offset);
  if ((threadIdx.x & 31u) == 0 && kept != 0) atomicAdd(&p.kept[row], kept);
}

// The first place in chunk c (tokens below `limit`) where the running sum from `carry` reaches `target` (at or past
// it when strict is false, past it when true), walked by one warp 32 tokens a step in ranking order; -1 when it does
// not, with `sum` the chunk's running sum at its end (else at the place).
__device__ int64_t walk_chunk(const unsigned long long* keys, float max_logit, int64_t c, int64_t limit, double carry,
                              double target, bool strict, double& sum) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  double running = carry;
  for (int step = 0; step < kChunk / 32; ++step) {
    const int64_t j = c * kChunk + step * 32 + lane;
    const double w = j < limit ? sampling_weight(__fsub_rn(logit_of(static_cast<uint32_t>(keys[j])), max_logit)) : 0.0;
    const double after = running + warp_inclusive_sum(w);
    const bool hit = j < limit && (strict ? after > target : after >= target);
    const unsigned mask = __ballot_sync(0xFFFFFFFFu, hit);
    if (mask != 0) {
      const int first = __ffs(static_cast<int>(mask)) - 1;
      sum = __shfl_sync(0xFFFFFFFFu, after, first);
      return c * kChunk + step * 32 + first;
    }
    running = __shfl_sync(0xFFFFFFFFu, after, 31);
    if (c * kChunk + (step + 1) * 32 >= limit) break;
  }
  sum = running;
  return -1;
}

// One block per sorted segment, its tokens in ranking order: top_k, the kept tokens' total (each warp sums whole
// chunks, the chunks added in order), top_p's count and the draw, each place found by summing chunk totals on one
// lane and walking the one chunk where the target falls.
__global__ void __launch_bounds__(kWalkThreads) walk_kernel(DrawPlan p) {
  extern __shared__ double chunk_sums[];
  __shared__ int64_t boundary;
  const int segment = static_cast<int>(blockIdx.x), row = p.sorted_row[segment];
  const DeviceDraw& d = p.args.draws[row];
  const float max_logit = p.max_logit[row];
  if (max_logit == -INFINITY) return;  // token 0, set by finish_maxima_kernel
  const int64_t V = p.args.vocab;
  const unsigned long long* keys = p.keys_out + segment * V;
  const int32_t* ids = p.ids_out + segment * V;
  int64_t kept = p.kept[row];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x & 31u);
  constexpr int kWarps = kWalkThreads / 32;

  // top_k: the tokens at least as likely as the k-th, so also the run of its ties after it.
  if (d.top_k > 0 && d.top_k < kept) {
    const uint32_t kth = static_cast<uint32_t>(keys[d.top_k - 1]);
    if (threadIdx.x == 0) boundary = kept;
    __syncthreads();
    for (int64_t start = d.top_k; start < kept; start += kWalkThreads) {
      const int64_t j = start + threadIdx.x;
      if (j < kept && static_cast<uint32_t>(keys[j]) != kth) atomicMin(reinterpret_cast<unsigned long long*>(&boundary),
                                                                         static_cast<unsigned long long>(j));
      __syncthreads();
      const bool found = boundary < kept;
      __syncthreads();
      if (found) break;
    }
    kept = boundary;
  }

  const int64_t chunks = (kept + kChunk - 1) / kChunk;
  for (int64_t c = warp; c < chunks; c += kWarps) {
    double sum = 0.0;
    for (int step = 0; step < kChunk / 32; ++step) {
      const int64_t j = c * kChunk + step * 32 + lane;
      if (j < kept) sum += sampling_weight(__fsub_rn(logit_of(static_cast<uint32_t>(keys[j])), max_logit));
    }
    sum = warp_sum(sum);
    if (lane == 0) chunk_sums[c] = sum;
  }
  __syncthreads();
  if (warp != 0) return;

  // The chunk where `target` falls among the first `limit` tokens, whose weights add up to `limit_mass` (the last
  // chunk when no earlier one reaches it), and the sum before it: chunk totals added in order on lane 0.
  const auto find_chunk = [&](int64_t limit, double limit_mass, double target, bool strict, double& before) {
    int64_t found = 0;
    double acc = 0.0;
    if (lane == 0) {
      const int64_t last = (limit + kChunk - 1) / kChunk - 1;
      for (int64_t c = 0; c <= last; ++c) {
        const double sum = c == last ? limit_mass - acc : chunk_sums[c];
        found = c;
        if (c == last || (strict ? acc + sum > target : acc + sum >= target)) break;
        acc += sum;
      }
    }
    before = __shfl_sync(0xFFFFFFFFu, acc, 0);
    return __shfl_sync(0xFFFFFFFFu, found, 0);
  };

  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += chunk_sums[c];
  int64_t count = kept;
  double mass = total;
  if (d.top_p < 1.0f && kept > 0) {
    // Keep the most likely tokens while the mass before each is below top_p (at least one, unless that is 0).
    const double target = static_cast<double>(d.top_p) * total;
    if (!(0.0 < target)) {
      count = 0;
    } else {
      double before = 0.0, sum = 0.0;
      const int64_t c = find_chunk(kept, total, target, false, before);
      const int64_t j = walk_chunk(keys, max_logit, c, kept, before, target, false, sum);
      count = j >= 0 ? j + 1 : min(kept, (c + 1) * kChunk);  // not reached, by rounding: through the chunk
      mass = j < 0 && count == kept ? total : sum;
    }
  }

  int64_t token_rank = 0;
  if (count > 0) {
    const double target = d.u * mass;
    double before = 0.0, sum = 0.0;
    const int64_t c = find_chunk(count, mass, target, true, before);
    token_rank = walk_chunk(keys, max_logit, c, count, before, target, true, sum);
    if (token_rank < 0) {
      // Past the end: the least likely kept token that weighs anything, else the most likely.
      token_rank = 0;
      for (int64_t start = ((count - 1) / 32) * 32; start >= 0; start -= 32) {
        const int64_t j = start + lane;
        const bool weighs =
            j < count && sampling_weight(__fsub_rn(logit_of(static_cast<uint32_t>(keys[j])), max_logit)) > 0.0f;
        const unsigned mask = __ballot_sync(0xFFFFFFFFu, weighs);
        if (mask != 0) {
          token_rank = start + 31 - __clz(static_cast<int>(mask));
          break;
        }
      }
    }
  }
  if (lane == 0) p.args.tokens[row] = ids[token_rank];
}

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

int row_bits(int rows) {
  int bits = 0;
  while ((1 << bits) < rows) ++bits;
  return bits;
}

size_t sort_scratch_bytes(int rows, int64_t vocab) {
  size_t bytes = 0;
  const int64_t n = rows * vocab;
  (void)cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, static_cast<const unsigned long long*>(nullptr),
                                                  static_cast<unsigned long long*>(nullptr),
                                                  static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                                  n, 0, 32 + row_bits(rows));
  return bytes;
}

// The scratch arrays of `plan` for `rows` rows from `base`; returns the bytes they take.
int64_t lay_out(DrawPlan* plan, char* base, int rows, int64_t vocab) {
  int64_t offset = 0;
  const auto take = [&](int64_t bytes) {
    char* at = base == nullptr ? nullptr : base + offset;
    offset += aligned(bytes);
    return at;
  };
  char* partial = take(rows * kMaxRowBlocks * sizeof(unsigned long long));
  char* max_logit = take(rows * sizeof(float));
  char* kept = take(rows * sizeof(unsigned));
  char* keys_in = take(rows * vocab * sizeof(unsigned long long));
  char* keys_out = take(rows * vocab * sizeof(unsigned long long));
  char* ids_in = take(rows * vocab * sizeof(int32_t));
  char* ids_out = take(rows * vocab * sizeof(int32_t));
  const size_t sort_bytes = sort_scratch_bytes(rows, vocab);
  char* sort = take(static_cast<int64_t>(sort_bytes));
  if (plan != nullptr) {
    plan->partial = reinterpret_cast<unsigned long long*>(partial);
    plan->max_logit = reinterpret_cast<float*>(max_logit);
    plan->kept = reinterpret_cast<unsigned*>(kept);
    plan->keys_in = reinterpret_cast<unsigned long long*>(keys_in);
    plan->keys_out = reinterpret_cast<unsigned long long*>(keys_out);
    plan->ids_in = reinterpret_cast<int32_t*>(ids_in);
    plan->ids_out = reinterpret_cast<int32_t*>(ids_out);
    plan->sort_scratch = sort;
    plan->sort_bytes = sort_bytes;
  }
  return offset;
}

}  // namespace

size_t draw_tokens_scratch_bytes(int rows, int64_t vocab) {
  return static_cast<size_t>(lay_out(nullptr, nullptr, rows, vocab));
}

cudaError_t draw_tokens(const DrawTokensArgs& args, cudaStream_t stream) {
  if (args.rows < 0 || args.rows > kMaxDrawRows || args.vocab < 1 || args.vocab > (int64_t{1} << 31) - 1) {
    return cudaErrorInvalidValue;
  }
  if (args.rows == 0) return cudaSuccess;
  DrawPlan plan;
  plan.args = args;
  for (int row = 0; row < args.rows; ++row) {
    if (!greedy(args.draws[row])) plan.sorted_row[plan.sorted++] = row;
  }
  (void)lay_out(&plan, static_cast<char*>(args.scratch), args.rows, args.vocab);
  constexpr int64_t kRowBlockTokens = 16 * kThreads;  // a block's share of a row: 16 tokens a thread or more
  plan.row_blocks =
      static_cast<int>(std::min<int64_t>(kMaxRowBlocks, (args.vocab + kRowBlockTokens - 1) / kRowBlockTokens));

  row_maxima_kernel<<<dim3(plan.row_blocks, args.rows), kThreads, 0, stream>>>(plan);
  finish_maxima_kernel<<<args.rows, 32, 0, stream>>>(plan);
  if (plan.sorted == 0) return cudaGetLastError();
  rank_keys_kernel<<<dim3(plan.row_blocks, plan.sorted), kThreads, 0, stream>>>(plan);
  size_t sort_bytes = plan.sort_bytes;
  cudaError_t status = cub::DeviceRadixSort::SortPairsDescending(
      plan.sort_scratch, sort_bytes, plan.keys_in, plan.keys_out, plan.ids_in, plan.ids_out,
      plan.sorted * args.vocab, 0, 32 + row_bits(plan.sorted), stream);
  if (status != cudaSuccess) return status;
  const size_t shared = static_cast<size_t>((args.vocab + kChunk - 1) / kChunk) * sizeof(double);
  if (shared > 48 * 1024) return cudaErrorInvalidValue;
  walk_kernel<<<plan.sorted, kWalkThreads, shared, stream>>>(plan);
  return cudaGetLastError();
}

}  // namespace kestrel::cuda
