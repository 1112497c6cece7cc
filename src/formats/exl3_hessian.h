// Hessian capture for the EXL3 quantizer (shared/docs/exl3-format.md §4.2): H = Σ xᵀx over the calibration rows x
// that reach a linear's input, divided by their count. Rows holding inf or NaN are dropped, as exllamav3 does, and
// counted. Only the lower triangle is accumulated (H is symmetric), in double, so that millions of rows add up
// without the float32 drift of a long running sum.
#pragma once

#include <cstdint>
#include <vector>

namespace kestrel::exl3 {

class HessianAccumulator {
public:
  explicit HessianAccumulator(int64_t in_features);

  int64_t in_features() const { return in_features_; }
  int64_t rows() const { return rows_; }             // rows accumulated
  int64_t dropped_rows() const { return dropped_; }  // rows skipped for a non-finite value

  // Adds `count` rows of x, row-major [count, in_features].
  void add(const float* x, int64_t count);

  // The mean Hessian Σ xᵀx / rows as float32 [in_features, in_features] (what quantize_linear takes); empty when no
  // row was accumulated, which means "uncalibrated".
  std::vector<float> mean() const;

private:
  int64_t in_features_;
  int64_t rows_ = 0;
  int64_t dropped_ = 0;
  std::vector<double> lower_;  // [in, in], entries with column <= row
};

}  // namespace kestrel::exl3
