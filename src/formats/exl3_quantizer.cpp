// quantize_linear: exllamav3's quantize_exl3 (§4.1) step by step. Matrices are row-major float32 in the EXL3
// orientation, Wr [k = in_padded, n = out_padded]. The Hessian is damped and rotated in float32 as exllamav3 does;
// Cholesky, block LDL, the proxy error and every reduction run in double. The tile encoder dominates the cost (§4.8):
// the scale search and the LDLQ rows run their tiles in parallel on the thread pool with one TrellisEncoder per worker;
// the other steps are O(k²n) at most.
#include "formats/exl3_quantizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>

#include "base/error.h"
#include "base/numeric.h"
#include "base/thread_pool.h"
#include "formats/exl3_trellis_encoder.h"

namespace kestrel::exl3 {

namespace {

constexpr int kMaxCholeskyRetries = 10;  // as exllamav3's block_ldl

int64_t pad_to_block(int64_t x) { return (x + kHadamardBlock - 1) / kHadamardBlock * kHadamardBlock; }

// One encoder per worker: an encoder's back-pointer buffer is up to 8 MiB (K = 1), so they are reused.
class EncoderPool {
public:
  EncoderPool(int bits, Codebook codebook) : bits_(bits), codebook_(codebook) {}

  std::unique_ptr<TrellisEncoder> acquire() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) return std::make_unique<TrellisEncoder>(bits_, codebook_);
    auto encoder = std::move(free_.back());
    free_.pop_back();
    return encoder;
  }
  void release(std::unique_ptr<TrellisEncoder> encoder) {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(encoder));
  }

private:
  int bits_;
  Codebook codebook_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<TrellisEncoder>> free_;
};

// ±1 signs; exllamav3 draws sign(randn) per channel, any fair coin is equivalent.
std::vector<float> random_signs(int64_t count, uint64_t seed, uint64_t stream) {
  std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(stream)};
  std::mt19937_64 generator(sequence);
  std::vector<float> signs(static_cast<size_t>(count));
  for (auto& sign : signs) sign = (generator() >> 63) != 0 ? -1.0f : 1.0f;
  return signs;
}

// x <- x · Hn for every row (blocks of 128 columns).
void rotate_rows(float* matrix, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += kHadamardBlock) hadamard128(matrix + r * cols + c);
  }
}

// x <- Hk · x (blocks of 128 rows): each column's 128-row slices.
void rotate_columns(float* matrix, int64_t rows, int64_t cols) {
  std::array<float, kHadamardBlock> buffer;
  for (int64_t r0 = 0; r0 < rows; r0 += kHadamardBlock) {
    for (int64_t c = 0; c < cols; ++c) {
      for (int i = 0; i < kHadamardBlock; ++i) buffer[static_cast<size_t>(i)] = matrix[(r0 + i) * cols + c];
      hadamard128(buffer.data());
      for (int i = 0; i < kHadamardBlock; ++i) matrix[(r0 + i) * cols + c] = buffer[static_cast<size_t>(i)];
    }
  }
}

// Cholesky factor of the k x k matrix `a` (row-major, lower triangle read), returned transposed: u = Lᵀ, row-major
// upper triangular. Right-looking, so the trailing update is a row-contiguous axpy that vectorises; false if a pivot
// is not positive.
bool cholesky_upper(const std::vector<double>& a, int64_t k, std::vector<double>& u, ThreadPool& pool) {
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j)
      u[static_cast<size_t>(i * k + j)] = j >= i ? a[static_cast<size_t>(j * k + i)] : 0.0;
  }
  for (int64_t j = 0; j < k; ++j) {
    double* uj = u.data() + j * k;
    const double pivot = uj[j];
    if (!(pivot > 0.0) || !std::isfinite(pivot)) return false;
    const double diagonal = std::sqrt(pivot);
    for (int64_t i = j; i < k; ++i) uj[i] /= diagonal;
    // Trailing rows p > j: u[p][i] -= u[j][p] * u[j][i] for i >= p.
    pool.parallel_for(
        k - j - 1,
        [&](int64_t begin, int64_t end) {
          for (int64_t p = j + 1 + begin; p < j + 1 + end; ++p) {
            const double factor = uj[p];
            double* up = u.data() + p * k;
            for (int64_t i = p; i < k; ++i) up[i] -= factor * uj[i];
          }
        },
        std::max<int64_t>(16, (k - j) / 8));
  }
  return true;
}

// The Hessian side of §4.2 for a mean Hessian: damping, rotation by the input signs and Hk, block LDL.
struct PreparedHessian {
  bool fallback = true;
  std::vector<double> rotated;  // [k, k] damped H in the rotated basis (the proxy error's metric)
  std::vector<float> l;         // [k, k] strictly block-lower-triangular LDL factor (16 x 16 blocks)
};

PreparedHessian prepare_hessian(const float* hessian, int64_t in_features, int64_t k, const std::vector<float>& signs,
                                float sigma_reg, ThreadPool& pool) {
  PreparedHessian prepared;
  // Padded inputs are zero, so the padded Hessian is zero outside [in, in].
  std::vector<float> h(static_cast<size_t>(k * k), 0.0f);
  double diagonal_sum = 0.0;
  for (int64_t i = 0; i < in_features; ++i) {
    for (int64_t j = 0; j < in_features; ++j) {
      const float value = hessian[i * in_features + j];
      require(std::isfinite(value), "EXL3 quantizer: the Hessian has a non-finite value at [{}, {}]", i, j);
      h[static_cast<size_t>(i * k + j)] = value;
    }
    diagonal_sum += hessian[i * in_features + i];
  }
  const double diagonal_mean = diagonal_sum / static_cast<double>(k);
  // exllamav3 quantizes uncalibrated when the diagonal is ~zero (no activations reached the layer).
  if (diagonal_mean < 1e-20) return prepared;
  prepared.fallback = false;

  for (int64_t i = 0; i < k; ++i) h[static_cast<size_t>(i * k + i)] += static_cast<float>(sigma_reg * diagonal_mean);
  // H <- Hk S H S Hk in float32, as exllamav3 does it on the GPU.
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j)
      h[static_cast<size_t>(i * k + j)] *= signs[static_cast<size_t>(i)] * signs[static_cast<size_t>(j)];
  }
  rotate_rows(h.data(), k, k);
  rotate_columns(h.data(), k, k);

  prepared.rotated.assign(h.begin(), h.end());
  std::vector<double> u(static_cast<size_t>(k * k));
  int retries = 0;
  while (!cholesky_upper(prepared.rotated, k, u, pool)) {
    require(++retries <= kMaxCholeskyRetries,
            "EXL3 quantizer: the Hessian is not positive definite even after {} damping retries (is it X^T X of real "
            "activations?)",
            kMaxCholeskyRetries);
    double mean = 0.0;
    for (int64_t i = 0; i < k; ++i) mean += prepared.rotated[static_cast<size_t>(i * k + i)];
    mean /= static_cast<double>(k);
    for (int64_t i = 0; i < k; ++i) prepared.rotated[static_cast<size_t>(i * k + i)] += 2.0 * sigma_reg * mean;
  }

  std::vector<double> l(static_cast<size_t>(k * k));
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t c = 0; c <= r; ++c) l[static_cast<size_t>(r * k + c)] = u[static_cast<size_t>(c * k + r)];
  }
  u = {};
  // Block LDL: right-multiply each 16-column block by the inverse of its diagonal block (making those blocks I), then
  // drop the diagonal blocks: L[r, block b] = L[r, block b] · D_b⁻¹ for rows below the block.
  constexpr int B = kTileSide;
  for (int64_t b0 = 0; b0 < k; b0 += B) {
    // D_b⁻¹ of the lower-triangular 16 x 16 diagonal block, by forward substitution.
    std::array<double, B * B> inverse{};
    for (int c = 0; c < B; ++c) {
      for (int r = c; r < B; ++r) {
        double sum = r == c ? 1.0 : 0.0;
        for (int p = c; p < r; ++p)
          sum -= l[static_cast<size_t>((b0 + r) * k + b0 + p)] * inverse[static_cast<size_t>(p * B + c)];
        inverse[static_cast<size_t>(r * B + c)] = sum / l[static_cast<size_t>((b0 + r) * k + b0 + r)];
      }
    }
    pool.parallel_for(
        k - b0 - B,
        [&](int64_t begin, int64_t end) {
          std::array<double, B> row;
          for (int64_t r = b0 + B + begin; r < b0 + B + end; ++r) {
            double* lr = l.data() + r * k + b0;
            for (int c = 0; c < B; ++c) {
              double sum = 0.0;
              for (int p = c; p < B; ++p) sum += lr[p] * inverse[static_cast<size_t>(p * B + c)];
              row[static_cast<size_t>(c)] = sum;
            }
            std::copy(row.begin(), row.end(), lr);
          }
        },
        64);
  }
  prepared.l.assign(static_cast<size_t>(k * k), 0.0f);
  for (int64_t r = 0; r < k; ++r) {
    const int64_t block_start = r / B * B;  // columns from here on (the diagonal block and above) stay zero
    for (int64_t c = 0; c < block_start; ++c) {
      prepared.l[static_cast<size_t>(r * k + c)] = static_cast<float>(l[static_cast<size_t>(r * k + c)]);
    }
  }
  return prepared;
}

// Tile (a, b) of a row-major [*, n] matrix, gathered in trellis (tensor-core) order.
void gather_tile(const float* matrix, int64_t n, int64_t a, int64_t b, float* tile) {
  for (int p = 0; p < kTileElements; ++p) {
    const TileCoord at = tile_coord(p);
    tile[p] = matrix[(a * kTileSide + at.row) * n + b * kTileSide + at.col];
  }
}

// Mean squared error of quantizing every tile scaled by `scale`, measured back in the unscaled domain.
double scaled_tiles_mse(const std::vector<float>& tiles, size_t first_tile, size_t tile_step, float scale,
                        EncoderPool& encoders, ThreadPool& pool) {
  const size_t count = (tiles.size() / kTileElements - first_tile + tile_step - 1) / tile_step;
  std::vector<double> errors(count);
  pool.parallel_for(static_cast<int64_t>(count), [&](int64_t begin, int64_t end) {
    auto encoder = encoders.acquire();
    std::array<float, kTileElements> scaled, decoded;
    std::array<uint16_t, kTileElements> states;
    for (int64_t i = begin; i < end; ++i) {
      const float* tile = tiles.data() + (first_tile + static_cast<size_t>(i) * tile_step) * kTileElements;
      for (int p = 0; p < kTileElements; ++p) scaled[static_cast<size_t>(p)] = tile[p] * scale;
      encoder->encode(scaled.data(), states.data(), decoded.data());
      double sum = 0.0;
      for (int p = 0; p < kTileElements; ++p) {
        const double error = static_cast<double>(decoded[static_cast<size_t>(p)]) / scale - tile[p];
        sum += error * error;
      }
      errors[static_cast<size_t>(i)] = sum;
    }
    encoders.release(std::move(encoder));
  });
  return std::accumulate(errors.begin(), errors.end(), 0.0) / static_cast<double>(count * kTileElements);
}

// LDLQ error feedback makes the tiles the encoder sees slightly larger than Wr's at low K; exllamav3 inflates the
// scale-search samples by this measured factor so the chosen scale fits the recursion's inputs.
float ldlq_drift(int bits) {
  switch (bits) {
    case 1:
      return 1.08f;
    case 2:
      return 1.018f;
    case 3:
      return 1.004f;
    default:
      return 1.0f;
  }
}

// §4.4: sample tiles on a wrapped diagonal of width 3 plus the highest- and lowest-energy tiles, then a coarse grid
// of scales on a third of them, a fine grid on all, and a parabolic refinement.
double search_global_scale(const std::vector<float>& wr, int64_t k, int64_t n, int bits, EncoderPool& encoders,
                           ThreadPool& pool) {
  const int64_t tiles_k = k / kTileSide, tiles_n = n / kTileSide;
  constexpr int64_t kWidth = 3;
  const int64_t diagonal = std::max(tiles_k, tiles_n);
  std::vector<std::pair<int64_t, int64_t>> picks;
  for (int64_t i = 0; i < diagonal; ++i) {
    for (int64_t w = 0; w < kWidth; ++w) picks.emplace_back(i % tiles_k, (i + w) % tiles_n);
  }
  std::vector<double> energy(static_cast<size_t>(tiles_k * tiles_n), 0.0);
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      const double value = wr[static_cast<size_t>(r * n + c)];
      energy[static_cast<size_t>(r / kTileSide * tiles_n + c / kTileSide)] += value * value;
    }
  }
  const auto num_extremes =
      static_cast<size_t>(std::min(std::max<int64_t>(8, diagonal * kWidth / 16), (tiles_k * tiles_n + 1) / 2));
  std::vector<int64_t> order(energy.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return energy[static_cast<size_t>(x)] > energy[static_cast<size_t>(y)];
  });
  for (size_t i = 0; i < num_extremes; ++i) picks.emplace_back(order[i] / tiles_n, order[i] % tiles_n);
  for (size_t i = 0; i < num_extremes; ++i) {
    const int64_t tile = order[order.size() - 1 - i];
    picks.emplace_back(tile / tiles_n, tile % tiles_n);
  }

  std::vector<float> tiles(picks.size() * kTileElements);
  const float drift = ldlq_drift(bits);
  for (size_t t = 0; t < picks.size(); ++t) {
    float* tile = tiles.data() + t * kTileElements;
    gather_tile(wr.data(), n, picks[t].first, picks[t].second, tile);
    for (int p = 0; p < kTileElements; ++p) tile[p] *= drift;
  }

  double best_coarse = 0.0, best_coarse_mse = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 10; ++i) {
    const double scale = 0.1 + 0.2 * i;
    const double mse = scaled_tiles_mse(tiles, 0, 3, static_cast<float>(scale), encoders, pool);
    if (mse < best_coarse_mse) best_coarse_mse = mse, best_coarse = scale;
  }
  constexpr double kStep = 0.075;
  std::array<double, 5> fine, mse;
  for (int i = 0; i < 5; ++i) {
    fine[static_cast<size_t>(i)] = best_coarse + kStep * (i - 2);
    mse[static_cast<size_t>(i)] =
        scaled_tiles_mse(tiles, 0, 1, static_cast<float>(fine[static_cast<size_t>(i)]), encoders, pool);
  }
  const auto best = static_cast<size_t>(std::min_element(mse.begin(), mse.end()) - mse.begin());
  double offset = 0.0;
  if (best > 0 && best < 4) {
    const double denominator = mse[best - 1] - 2.0 * mse[best] + mse[best + 1];
    if (denominator > 0.0) offset = std::clamp(0.5 * (mse[best - 1] - mse[best + 1]) / denominator, -0.5, 0.5);
  }
  return std::max(fine[best] + offset * kStep, 0.01);
}

// §4.5 (or the fallback without L): encodes 16-row blocks from the last to the first; with L, each block's target
// adds Σ_{rows below} L[below, block]ᵀ · (Wr − Ŵ)[below]. Fills the rotated Ŵ and the states (tile order, trellis
// positions) and returns nothing; errors are computed by the caller.
void encode_rows(const std::vector<float>& wr, const std::vector<float>* l, int64_t k, int64_t n, EncoderPool& encoders,
                 ThreadPool& pool, std::vector<float>& decoded_weight, std::vector<uint16_t>& states) {
  const int64_t tiles_k = k / kTileSide, tiles_n = n / kTileSide;
  std::vector<float> error(static_cast<size_t>(k * n), 0.0f);  // Wr − Ŵ of the rows done so far
  for (int64_t a = tiles_k - 1; a >= 0; --a) {
    const int64_t r0 = a * kTileSide;
    pool.parallel_for(tiles_n, [&](int64_t begin, int64_t end) {
      auto encoder = encoders.acquire();
      const int64_t c0 = begin * kTileSide, c1 = end * kTileSide, width = c1 - c0;
      // rows[16][width]: the block's targets for this worker's columns.
      std::vector<float> rows(static_cast<size_t>(kTileSide * width));
      for (int j = 0; j < kTileSide; ++j) {
        std::copy_n(wr.data() + (r0 + j) * n + c0, width, rows.data() + j * width);
      }
      if (l != nullptr) {
        for (int64_t r = r0 + kTileSide; r < k; ++r) {
          const float* e = error.data() + r * n + c0;
          const float* lr = l->data() + r * k + r0;
          for (int j = 0; j < kTileSide; ++j) {
            const float factor = lr[j];
            float* row = rows.data() + j * width;
            for (int64_t c = 0; c < width; ++c) row[c] += factor * e[c];
          }
        }
      }
      std::array<float, kTileElements> targets, values;
      for (int64_t b = begin; b < end; ++b) {
        gather_tile(rows.data(), width, 0, b - begin, targets.data());
        uint16_t* tile_states = states.data() + (a * tiles_n + b) * kTileElements;
        encoder->encode(targets.data(), tile_states, values.data());
        for (int p = 0; p < kTileElements; ++p) {
          const TileCoord at = tile_coord(p);
          const int64_t index = (r0 + at.row) * n + b * kTileSide + at.col;
          decoded_weight[static_cast<size_t>(index)] = values[static_cast<size_t>(p)];
          error[static_cast<size_t>(index)] = wr[static_cast<size_t>(index)] - values[static_cast<size_t>(p)];
        }
      }
      encoders.release(std::move(encoder));
    });
  }
}

// tr(Eᵀ H E) / tr(Wrᵀ H Wr) in double, over column ranges: (H E)[i, c] accumulates along rows of E, a
// contiguous axpy per (i, j) that vectorises.
double proxy_error(const std::vector<float>& wr, const std::vector<float>& decoded, const std::vector<double>& h,
                   int64_t k, int64_t n, ThreadPool& pool) {
  constexpr int64_t kColumns = 64;
  const int64_t ranges = (n + kColumns - 1) / kColumns;
  std::vector<double> numerators(static_cast<size_t>(ranges)), denominators(static_cast<size_t>(ranges));
  pool.parallel_for(ranges, [&](int64_t begin, int64_t end) {
    std::vector<double> e(static_cast<size_t>(k * kColumns)), w(static_cast<size_t>(k * kColumns));
    std::array<double, kColumns> he, hw;
    for (int64_t range = begin; range < end; ++range) {
      const int64_t c0 = range * kColumns, width = std::min(kColumns, n - c0);
      for (int64_t r = 0; r < k; ++r) {
        for (int64_t c = 0; c < width; ++c) {
          const size_t from = static_cast<size_t>(r * n + c0 + c), to = static_cast<size_t>(r * kColumns + c);
          w[to] = wr[from];
          e[to] = double{wr[from]} - decoded[from];
        }
      }
      double numerator = 0.0, denominator = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        he.fill(0.0);
        hw.fill(0.0);
        const double* hi = h.data() + i * k;
        for (int64_t j = 0; j < k; ++j) {
          const double factor = hi[j];
          const double* ej = e.data() + j * kColumns;
          const double* wj = w.data() + j * kColumns;
          for (int64_t c = 0; c < kColumns; ++c) {
            he[static_cast<size_t>(c)] += factor * ej[c];
            hw[static_cast<size_t>(c)] += factor * wj[c];
          }
        }
        for (int64_t c = 0; c < width; ++c) {
          numerator += e[static_cast<size_t>(i * kColumns + c)] * he[static_cast<size_t>(c)];
          denominator += w[static_cast<size_t>(i * kColumns + c)] * hw[static_cast<size_t>(c)];
        }
      }
      numerators[static_cast<size_t>(range)] = numerator;
      denominators[static_cast<size_t>(range)] = denominator;
    }
  });
  const double numerator = std::accumulate(numerators.begin(), numerators.end(), 0.0);
  const double denominator = std::accumulate(denominators.begin(), denominators.end(), 0.0);
  return numerator / std::max(denominator, 1e-8);
}

}  // namespace

int32_t codebook_marker(Codebook codebook) {
  switch (codebook) {
    case Codebook::mcg:
      return static_cast<int32_t>(kMcgMultiplier);
    case Codebook::mul1:
      return static_cast<int32_t>(kMul1Multiplier);
    case Codebook::inst3:
      break;
  }
  return 0;
}

QuantizedLinear quantize_linear(const float* weight, int64_t out_features, int64_t in_features, const float* hessian,
                                const QuantizeOptions& options) {
  require(out_features > 0 && in_features > 0, "EXL3 quantizer: empty weight [{}, {}]", out_features, in_features);
  require(options.bits >= kMinBits && options.bits <= kMaxBits, "EXL3 quantizer: bits must be {}..{}, not {}", kMinBits,
          kMaxBits, options.bits);
  ThreadPool& pool = options.pool != nullptr ? *options.pool : ThreadPool::global();
  QuantizedLinear result;
  result.in_features = in_features;
  result.out_features = out_features;
  const int64_t k = result.in_padded = pad_to_block(in_features);
  const int64_t n = result.out_padded = pad_to_block(out_features);
  result.bits = options.bits;
  result.codebook = options.codebook;

  // Wr starts as the padded transpose, [k, n].
  std::vector<float> wr(static_cast<size_t>(k * n), 0.0f);
  for (int64_t o = 0; o < out_features; ++o) {
    for (int64_t i = 0; i < in_features; ++i) {
      const float value = weight[o * in_features + i];
      require(std::isfinite(value), "EXL3 quantizer: the weight has a non-finite value at [{}, {}]", o, i);
      wr[static_cast<size_t>(i * n + o)] = value;
    }
  }

  const uint64_t sign_seed = options.sign_seed >= 0 ? static_cast<uint64_t>(options.sign_seed) : options.seed;
  const std::vector<float> su_signs = random_signs(k, sign_seed, 1);
  const std::vector<float> sv_signs = random_signs(n, options.seed, 2);
  PreparedHessian prepared;
  if (hessian != nullptr) prepared = prepare_hessian(hessian, in_features, k, su_signs, options.sigma_reg, pool);
  result.calibrated = !prepared.fallback;

  // §4.3 regularisation (output scales "always", exllamav3's default).
  std::vector<double> out_scale(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t c = 0; c < n; ++c)
      out_scale[static_cast<size_t>(c)] +=
          double{wr[static_cast<size_t>(r * n + c)]} * wr[static_cast<size_t>(r * n + c)];
  }
  for (auto& scale : out_scale) scale = std::sqrt(scale / static_cast<double>(k));
  const double out_mean = std::accumulate(out_scale.begin(), out_scale.end(), 0.0) / static_cast<double>(n);
  std::vector<float> sv(static_cast<size_t>(n));
  std::vector<bool> zero_column(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    double scale = out_mean > 1e-30 ? out_scale[static_cast<size_t>(c)] / out_mean : 0.0;
    zero_column[static_cast<size_t>(c)] = std::abs(scale) < 1e-30;
    if (zero_column[static_cast<size_t>(c)]) scale = 0.1;
    sv[static_cast<size_t>(c)] = static_cast<float>(sv_signs[static_cast<size_t>(c)] * scale + 1e-10);
  }
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t c = 0; c < n; ++c) wr[static_cast<size_t>(r * n + c)] /= sv[static_cast<size_t>(c)];
  }
  for (int64_t c = 0; c < n; ++c) {
    if (zero_column[static_cast<size_t>(c)]) sv[static_cast<size_t>(c)] = 0.0f;
  }
  rotate_rows(wr.data(), k, n);

  std::vector<float> su(static_cast<size_t>(k));
  for (int64_t r = 0; r < k; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < n; ++c)
      sum += double{wr[static_cast<size_t>(r * n + c)]} * wr[static_cast<size_t>(r * n + c)];
    double scale = std::sqrt(sum / static_cast<double>(n));
    if (scale < 1e-30) scale = 0.1;
    su[static_cast<size_t>(r)] =
        static_cast<float>(su_signs[static_cast<size_t>(r)] * scale / -static_cast<double>(kCodebookRms) + 1e-10);
    for (int64_t c = 0; c < n; ++c) wr[static_cast<size_t>(r * n + c)] /= su[static_cast<size_t>(r)];
  }
  rotate_columns(wr.data(), k, n);

  EncoderPool encoders(options.bits, options.codebook);
  result.global_scale = options.scale_search ? search_global_scale(wr, k, n, options.bits, encoders, pool) : 1.0;
  const auto g = static_cast<float>(result.global_scale);
  for (auto& value : wr) value *= g;
  for (auto& value : su) value /= g;

  // §4.5/4.6: the trellis search.
  result.rotated.assign(static_cast<size_t>(k * n), 0.0f);
  std::vector<uint16_t> states(static_cast<size_t>(k * n));
  encode_rows(wr, result.calibrated ? &prepared.l : nullptr, k, n, encoders, pool, result.rotated, states);

  if (result.calibrated) {
    result.proxy_error = proxy_error(wr, result.rotated, prepared.rotated, k, n, pool);
  } else {
    double sum = 0.0;
    for (size_t i = 0; i < wr.size(); ++i) {
      const double error = double{wr[i]} - result.rotated[i];
      sum += error * error;
    }
    result.proxy_error = sum / static_cast<double>(wr.size());
  }

  const int64_t words = kTileSide * options.bits;
  result.trellis.resize(static_cast<size_t>(k / kTileSide * (n / kTileSide) * words));
  for (int64_t tile = 0; tile < k / kTileSide * (n / kTileSide); ++tile) {
    pack_tile(states.data() + tile * kTileElements, options.bits, result.trellis.data() + tile * words);
  }
  result.suh.resize(static_cast<size_t>(k));
  result.svh.resize(static_cast<size_t>(n));
  std::transform(su.begin(), su.end(), result.suh.begin(), f32_to_f16);
  std::transform(sv.begin(), sv.end(), result.svh.begin(), f32_to_f16);
  return result;
}

}  // namespace kestrel::exl3
