#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/sampling_kernels.h"
#include "backend/cuda/dependent_launch.cuh"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRowBlocks = 256;     // blocks over one row in the maxima and key passes
constexpr int kWalkThreads = 256;
constexpr int kTileItems = 16;
constexpr int kTile = kWalkThreads * kTileItems;  // the walk's unit: 16 ranks a thread
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
  double* tile_sums = nullptr;            // [sorted, tiles]
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

// Grid (row_blocks, rows): each block's largest rank key of its share of the row (the logit's ordered bits, then the
// id inverted, so the first largest wins), over logits above -inf (NaN never).
__global__ void __launch_bounds__(kThreads) row_maxima_kernel(DrawPlan p) {
  wait_for_previous_grid();
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
  wait_for_previous_grid();
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
  wait_for_previous_grid();
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

__device__ __forceinline__ float rank_weight(const unsigned long long* keys, int64_t rank, float max_logit) {
  return sampling_weight(__fsub_rn(logit_of(static_cast<uint32_t>(keys[rank])), max_logit));
}

// The block's sum of one double a thread, in a fixed order (deterministic); every thread gets it.
__device__ double block_sum(double v, double* shared) {
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x / 32);
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWalkThreads / 32; ++w) total += shared[w];
  return total;
}

// Grid (tiles, sorted): tile t's weight total over the segment's kept ranks (min_p's), kTile ranks a block, so that
// the walk adds up whole tiles instead of summing the vocabulary on one block.
__global__ void __launch_bounds__(kWalkThreads) tile_sums_kernel(DrawPlan p) {
  wait_for_previous_grid();
  __shared__ double warps[kWalkThreads / 32];
  const int segment = static_cast<int>(blockIdx.y), row = p.sorted_row[segment];
  const float max_logit = p.max_logit[row];
  const int64_t kept = max_logit == -INFINITY ? 0 : p.kept[row], tiles = gridDim.x;
  const unsigned long long* keys = p.keys_out + segment * p.args.vocab;
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kTileItems; ++i) {
    const int64_t rank = static_cast<int64_t>(blockIdx.x) * kTile + i * kWalkThreads + threadIdx.x;
    if (rank < kept) sum += rank_weight(keys, rank, max_logit);
  }
  sum = block_sum(sum, warps);
  if (threadIdx.x == 0) p.tile_sums[segment * tiles + blockIdx.x] = sum;
}

// The walk of one tile by the block: thread i holds ranks t * kTile + i * kTileItems ..., the block's exclusive scan
// of their sums gives each thread its running sum from `carry`, and each finds its first rank below `limit` where the
// running sum reaches `target` (at or past it; past it when strict). The least such rank, with the running sum after
// it in `after`; -1 when none, with `after` the running sum at the tile's end.
struct TileWalk {
  using Scan = cub::BlockScan<double, kWalkThreads>;
  Scan::TempStorage scan;
  double warps[kWalkThreads / 32];
  unsigned long long hit;
  double hit_after;
};

__device__ int64_t walk_tile(TileWalk& shared, const unsigned long long* keys, float max_logit, int64_t tile,
                             int64_t limit, double carry, double target, bool strict, double& after) {
  const int64_t first = tile * kTile + static_cast<int64_t>(threadIdx.x) * kTileItems;
  float weights[kTileItems];
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kTileItems; ++i) {
    weights[i] = first + i < limit ? rank_weight(keys, first + i, max_logit) : 0.0f;
    sum += weights[i];
  }
  double before = 0.0, tile_total = 0.0;
  TileWalk::Scan(shared.scan).ExclusiveSum(sum, before, tile_total);
  if (threadIdx.x == 0) shared.hit = ~0ull;
  __syncthreads();
  double running = carry + before, mine = 0.0;
  int64_t found = -1;
#pragma unroll
  for (int i = 0; i < kTileItems; ++i) {
    running += weights[i];
    if (found < 0 && first + i < limit && (strict ? running > target : running >= target)) {
      found = first + i;
      mine = running;
    }
  }
  if (found >= 0) atomicMin(&shared.hit, static_cast<unsigned long long>(found));
  __syncthreads();
  if (found >= 0 && static_cast<unsigned long long>(found) == shared.hit) shared.hit_after = mine;
  __syncthreads();
  const bool hit = shared.hit != ~0ull;
  const int64_t rank = hit ? static_cast<int64_t>(shared.hit) : -1;
  after = hit ? shared.hit_after : carry + tile_total;
  __syncthreads();  // the shared state is read by every thread before the next walk writes it
  return rank;
}

// One block per sorted segment, its tokens in ranking order: top_k, the kept tokens' total (the tile totals added in
// order), top_p's count and the draw, each place found by adding tile totals on one thread and walking the one tile
// where the target falls.
__global__ void __launch_bounds__(kWalkThreads) walk_kernel(DrawPlan p, int tiles) {
  wait_for_previous_grid();
  __shared__ TileWalk shared;
  __shared__ unsigned long long boundary;
  __shared__ int64_t chosen_tile;
  __shared__ double chosen_before;
  const int segment = static_cast<int>(blockIdx.x), row = p.sorted_row[segment];
  const DeviceDraw& d = p.args.draws[row];
  const float max_logit = p.max_logit[row];
  if (max_logit == -INFINITY) return;  // token 0, set by finish_maxima_kernel
  const int64_t V = p.args.vocab;
  const unsigned long long* keys = p.keys_out + segment * V;
  const int32_t* ids = p.ids_out + segment * V;
  const double* tile_sums = p.tile_sums + segment * tiles;
  int64_t kept = p.kept[row];

  // top_k: the tokens at least as likely as the k-th, so also the run of its ties after it.
  if (d.top_k > 0 && d.top_k < kept) {
    const uint32_t kth = static_cast<uint32_t>(keys[d.top_k - 1]);
    if (threadIdx.x == 0) boundary = static_cast<unsigned long long>(kept);
    __syncthreads();
    for (int64_t start = d.top_k; start < kept; start += kWalkThreads) {
      const int64_t j = start + threadIdx.x;
      if (j < kept && static_cast<uint32_t>(keys[j]) != kth) atomicMin(&boundary, static_cast<unsigned long long>(j));
      __syncthreads();
      const bool found = boundary < static_cast<unsigned long long>(kept);
      __syncthreads();
      if (found) break;
    }
    kept = static_cast<int64_t>(boundary);
  }

  // The weight of the first `limit` ranks: whole tiles' totals, then a walk of the tile that `limit` cuts.
  const auto mass_below = [&](int64_t limit) {
    const int64_t whole = limit / kTile;
    double sum = 0.0;
    for (int64_t t = 0; t < whole; ++t) sum += tile_sums[t];
    if (limit % kTile == 0) return sum;
    double after = 0.0;
    (void)walk_tile(shared, keys, max_logit, whole, limit, sum, INFINITY, false, after);
    return after;
  };
  // The rank where the running sum over the first `limit` ranks reaches `target`: the tile found by adding tile
  // totals on thread 0 (the last tile when none before it reaches it), then that tile's walk.
  const auto find_rank = [&](int64_t limit, double target, bool strict, double& after) {
    if (threadIdx.x == 0) {
      const int64_t last = (limit + kTile - 1) / kTile - 1;
      double acc = 0.0;
      int64_t t = 0;
      for (; t < last; ++t) {
        const double sum = tile_sums[t];
        if (strict ? acc + sum > target : acc + sum >= target) break;
        acc += sum;
      }
      chosen_tile = t;
      chosen_before = acc;
    }
    __syncthreads();
    const int64_t tile = chosen_tile;
    const double before = chosen_before;
    return walk_tile(shared, keys, max_logit, tile, limit, before, target, strict, after);
  };

  const double total = mass_below(kept);
  int64_t count = kept;
  double mass = total;
  if (d.top_p < 1.0f && kept > 0) {
    // Keep the most likely tokens while the mass before each is below top_p (at least one, unless that is 0).
    const double target = static_cast<double>(d.top_p) * total;
    if (!(0.0 < target)) {
      count = 0;
    } else {
      double after = 0.0;
      const int64_t rank = find_rank(kept, target, false, after);
      count = rank >= 0 ? rank + 1 : kept;  // not reached, by rounding: all of them
      mass = rank >= 0 ? after : total;
    }
  }

  int64_t token_rank = 0;
  if (count > 0) {
    double after = 0.0;
    token_rank = find_rank(count, d.u * mass, true, after);
    if (token_rank < 0) {
      // Past the end: the least likely kept token that weighs anything, else the most likely.
      if (threadIdx.x == 0) boundary = 0;
      __syncthreads();
      for (int64_t j = threadIdx.x; j < count; j += kWalkThreads) {
        if (rank_weight(keys, j, max_logit) > 0.0f) atomicMax(&boundary, static_cast<unsigned long long>(j));
      }
      __syncthreads();
      token_rank = static_cast<int64_t>(boundary);
    }
  }
  if (threadIdx.x == 0) p.args.tokens[row] = ids[token_rank];
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
  char* tile_sums = take(rows * ((vocab + kTile - 1) / kTile) * static_cast<int64_t>(sizeof(double)));
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
    plan->tile_sums = reinterpret_cast<double*>(tile_sums);
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
  constexpr int64_t kRowBlockTokens = 4 * kThreads;  // a block's share of a row: 4 tokens a thread or more (loads in flight)
  plan.row_blocks =
      static_cast<int>(std::min<int64_t>(kMaxRowBlocks, (args.vocab + kRowBlockTokens - 1) / kRowBlockTokens));

  // Dependent launches: each kernel's launch overlaps the one before it (the first, the lm_head's tail).
  if (const cudaError_t status =
          launch_dependent(row_maxima_kernel, dim3(plan.row_blocks, args.rows), dim3(kThreads), 0, stream, plan);
      status != cudaSuccess) {
    return status;
  }
  if (const cudaError_t status = launch_dependent(finish_maxima_kernel, dim3(args.rows), dim3(32), 0, stream, plan);
      status != cudaSuccess || plan.sorted == 0) {
    return status;
  }
  if (const cudaError_t status =
          launch_dependent(rank_keys_kernel, dim3(plan.row_blocks, plan.sorted), dim3(kThreads), 0, stream, plan);
      status != cudaSuccess) {
    return status;
  }
  size_t sort_bytes = plan.sort_bytes;
  cudaError_t status = cub::DeviceRadixSort::SortPairsDescending(
      plan.sort_scratch, sort_bytes, plan.keys_in, plan.keys_out, plan.ids_in, plan.ids_out,
      plan.sorted * args.vocab, 0, 32 + row_bits(plan.sorted), stream);
  if (status != cudaSuccess) return status;
  const auto tiles = static_cast<int>((args.vocab + kTile - 1) / kTile);
  status = launch_dependent(tile_sums_kernel, dim3(tiles, plan.sorted), dim3(kWalkThreads), 0, stream, plan);
  if (status != cudaSuccess) return status;
  return launch_dependent(walk_kernel, dim3(plan.sorted), dim3(kWalkThreads), 0, stream, plan, tiles);
}

}  // namespace kestrel::cuda
