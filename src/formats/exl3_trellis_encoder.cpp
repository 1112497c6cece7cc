// The two-pass tail-biting Viterbi of §4.6. The step kernel is the hot loop of quantization (2^16 candidate states
// per step, 512 steps per tile). For a block of 32 consecutive out edges, the 2^K candidate states of each edge lie in
// 2^K contiguous codebook slices (one per high part k), and consecutive out edges share their predecessor in runs of
// 2^K; so the kernel works on 8-lane vectors (GCC vector extensions, lowered to whatever the target has): one slice
// load, a broadcast (or, for K < 3, a shuffle) of the predecessor costs, and selects, never branches, to keep the
// running minimum and its k in registers. It is compiled for the baseline ISA, AVX2+FMA and AVX-512 (mask-register
// selects, 32 registers: about 1.5x the AVX2 speed on Zen 4) and picked at run time. The two SIMD builds contract
// `cost + error * error` into the same FMA and give identical results; the baseline build (no FMA) rounds the
// product separately, so on a CPU without AVX2 a near-tie may be decided differently.
#include "formats/exl3_trellis_encoder.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <utility>

#include "base/error.h"

namespace kestrel::exl3 {

namespace {

constexpr int kSteps = kTileElements;
constexpr int kLanes = 8;
constexpr int kBlock = 64;  // out edges whose running minima stay in registers (measured best on Zen 4)
constexpr int kBlockVectors = kBlock / kLanes;

using Floats = float __attribute__((vector_size(kLanes * sizeof(float))));
using Ints = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
using Bytes = uint8_t __attribute__((vector_size(kLanes)));

template <int K>
struct Trellis {
  static constexpr int kEdges = 1 << (16 - K);            // out edges (low 16-K bits of a state)
  static constexpr int kFanIn = 1 << K;                   // states ending in one edge: one per high part k
  static constexpr int kInEdgesPerK = 1 << (16 - 2 * K);  // predecessor of (k, e) is k * kInEdgesPerK + (e >> K)
};

// Cost buffers are read 8 floats at a time from any predecessor edge, so they carry this much slack.
constexpr size_t kCostSlack = kLanes;

// (Vectors are passed by reference: returning a 32-byte vector by value changes the ABI between the two ISAs.)
[[gnu::always_inline]] inline void load(Floats& vector, const float* from) { std::memcpy(&vector, from, sizeof vector); }

// The predecessor costs of 8 consecutive out edges, the first of which has its predecessor at `in_cost`: runs of 2^K
// lanes share one predecessor.
template <int K>
[[gnu::always_inline]] inline void load_predecessor_costs(Floats& costs, const float* in_cost) {
  if constexpr (K >= 3) {
    costs = Floats{} + in_cost[0];
  } else {
    Floats raw;
    load(raw, in_cost);
    if constexpr (K == 2) {
      costs = __builtin_shufflevector(raw, raw, 0, 0, 0, 0, 1, 1, 1, 1);
    } else {
      costs = __builtin_shufflevector(raw, raw, 0, 0, 1, 1, 2, 2, 3, 3);
    }
  }
}

// One trellis step: next[e] = min over k of cost[in_edge(k, e)] + (value(k, e) - target)^2, back[e] = that k.
template <int K>
[[gnu::always_inline]] inline void viterbi_step(const float* __restrict values, float target,
                                                const float* __restrict cost, float* __restrict next,
                                                uint8_t* __restrict back) {
  using T = Trellis<K>;
  for (int first = 0; first < T::kEdges; first += kBlock) {
    std::array<Floats, kBlockVectors> best;
    std::array<Ints, kBlockVectors> best_k;
    best.fill(Floats{} + std::numeric_limits<float>::infinity());
    best_k.fill(Ints{});
    for (int k = 0; k < T::kFanIn; ++k) {
      const float* slice = values + (k << (16 - K)) + first;
      const float* in_cost = cost + k * T::kInEdgesPerK + (first >> K);
      const Ints k_lanes = Ints{} + k;
      for (int v = 0; v < kBlockVectors; ++v) {
        const int lane0 = v * kLanes;
        Floats value, previous;
        load(value, slice + lane0);
        load_predecessor_costs<K>(previous, in_cost + (lane0 >> K));
        const Floats error = value - target;
        const Floats candidate = previous + error * error;
        const Ints better = candidate < best[static_cast<size_t>(v)];  // strict: ties keep the smaller k
        best[static_cast<size_t>(v)] = better ? candidate : best[static_cast<size_t>(v)];
        best_k[static_cast<size_t>(v)] = better ? k_lanes : best_k[static_cast<size_t>(v)];
      }
    }
    for (int v = 0; v < kBlockVectors; ++v) {
      std::memcpy(next + first + v * kLanes, &best[static_cast<size_t>(v)], sizeof(Floats));
      const Bytes narrowed = __builtin_convertvector(best_k[static_cast<size_t>(v)], Bytes);
      std::memcpy(back + first + v * kLanes, &narrowed, sizeof narrowed);
    }
  }
}

// Runs the 256 steps of one pass over `targets` (already in the pass's position order); `cost` holds the start
// costs and ends with the final ones.
template <int K>
[[gnu::always_inline]] inline void viterbi_pass(const float* values, const float* targets, float* cost, float* next,
                                                uint8_t* back) {
  for (int step = 0; step < kSteps; ++step) {
    viterbi_step<K>(values, targets[step], cost, next, back + static_cast<size_t>(step) * Trellis<K>::kEdges);
    std::swap(cost, next);
  }
  // 256 swaps: the final costs are back in the first buffer.
}

using PassFunction = void (*)(const float*, const float*, float*, float*, uint8_t*);

template <int K>
void viterbi_pass_baseline(const float* values, const float* targets, float* cost, float* next, uint8_t* back) {
  viterbi_pass<K>(values, targets, cost, next, back);
}

#if defined(__x86_64__)
template <int K>
[[gnu::target("avx2,fma")]] void viterbi_pass_avx2(const float* values, const float* targets, float* cost,
                                                   float* next, uint8_t* back) {
  viterbi_pass<K>(values, targets, cost, next, back);
}

template <int K>
[[gnu::target("avx512f,avx512vl,avx512bw,avx512dq")]] void viterbi_pass_avx512(const float* values,
                                                                               const float* targets, float* cost,
                                                                               float* next, uint8_t* back) {
  viterbi_pass<K>(values, targets, cost, next, back);
}

bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}
#endif

template <int K>
PassFunction pass_function() {
#if defined(__x86_64__)
  if (has_avx512()) return viterbi_pass_avx512<K>;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return viterbi_pass_avx2<K>;
#endif
  return viterbi_pass_baseline<K>;
}

PassFunction pass_function(int bits) {
  switch (bits) {
    case 1: return pass_function<1>();
    case 2: return pass_function<2>();
    case 3: return pass_function<3>();
    case 4: return pass_function<4>();
    case 5: return pass_function<5>();
    case 6: return pass_function<6>();
    case 7: return pass_function<7>();
    default: return pass_function<8>();
  }
}

// Follows the back pointers of a pass from `edge` after its last step down to before step `stop`; returns the
// edge entering step `stop`. With `states`, writes the state of every step visited (index = step).
int trace_back(const uint8_t* back, int bits, int edge, int stop, uint16_t* states) {
  const int edges = 1 << (16 - bits);
  for (int step = kSteps - 1; step >= stop; --step) {
    const auto state = static_cast<uint32_t>((back[static_cast<size_t>(step) * edges + edge] << (16 - bits)) | edge);
    if (states != nullptr) states[step] = static_cast<uint16_t>(state);
    edge = static_cast<int>(state >> bits);
  }
  return edge;
}

}  // namespace

TrellisEncoder::TrellisEncoder(int bits, Codebook codebook)
    : bits_(bits), codebook_values_(codebook_f32(codebook).data()) {
  require(bits >= kMinBits && bits <= kMaxBits, "EXL3 bits must be between {} and {}, not {}", kMinBits, kMaxBits,
          bits);
  const size_t edges = size_t{1} << (16 - bits);
  cost_.resize(edges + kCostSlack);
  next_cost_.resize(edges + kCostSlack);
  back_.resize(edges * kSteps);
}

double TrellisEncoder::encode(const float* targets, uint16_t* states, float* decoded) {
  const PassFunction pass = pass_function(bits_);

  // Pass 1: positions 128..255 then 0..127 from free start edges; the traced edge entering position 0 (step 128)
  // is where the circular stream closes.
  std::array<float, kSteps> rotated;
  for (int step = 0; step < kSteps; ++step) {
    rotated[static_cast<size_t>(step)] = targets[(step + kSteps / 2) % kSteps];
  }
  const auto final_costs = cost_.end() - kCostSlack;
  std::fill(cost_.begin(), cost_.end(), 0.0f);
  pass(codebook_values_, rotated.data(), cost_.data(), next_cost_.data(), back_.data());
  const auto cheapest = static_cast<int>(std::min_element(cost_.begin(), final_costs) - cost_.begin());
  const int wrap_edge = trace_back(back_.data(), bits_, cheapest, kSteps / 2, nullptr);

  // Pass 2: positions 0..255 starting from the wrap edge and ending in it.
  std::fill(cost_.begin(), cost_.end(), std::numeric_limits<float>::infinity());
  cost_[static_cast<size_t>(wrap_edge)] = 0.0f;
  pass(codebook_values_, targets, cost_.data(), next_cost_.data(), back_.data());
  trace_back(back_.data(), bits_, wrap_edge, 0, states);

  double squared_error = 0.0;
  for (int p = 0; p < kSteps; ++p) {
    decoded[p] = codebook_values_[states[p]];
    const double error = static_cast<double>(decoded[p]) - targets[p];
    squared_error += error * error;
  }
  return squared_error;
}

}  // namespace kestrel::exl3
