#include "formats/exl3_hessian.h"

#include <cmath>

#include "base/error.h"

namespace kestrel::exl3 {

HessianAccumulator::HessianAccumulator(int64_t in_features) : in_features_(in_features) {
  require(in_features > 0, "Hessian accumulator: in_features must be positive, not {}", in_features);
  lower_.assign(static_cast<size_t>(in_features * in_features), 0.0);
}

void HessianAccumulator::add(const float* x, int64_t count) {
  const int64_t k = in_features_;
  std::vector<double> row(static_cast<size_t>(k));
  for (int64_t t = 0; t < count; ++t) {
    const float* xt = x + t * k;
    bool finite = true;
    for (int64_t i = 0; i < k; ++i) {
      finite = finite && std::isfinite(xt[i]);
      row[static_cast<size_t>(i)] = xt[i];
    }
    if (!finite) {
      ++dropped_;
      continue;
    }
    for (int64_t i = 0; i < k; ++i) {
      const double xi = row[static_cast<size_t>(i)];
      if (xi == 0.0) continue;  // SwiGLU outputs and padded inputs are often exactly zero
      double* out = lower_.data() + i * k;
      for (int64_t j = 0; j <= i; ++j) out[j] += xi * row[static_cast<size_t>(j)];
    }
    ++rows_;
  }
}

std::vector<float> HessianAccumulator::mean() const {
  if (rows_ == 0) return {};
  const int64_t k = in_features_;
  std::vector<float> h(static_cast<size_t>(k * k));
  const double scale = 1.0 / static_cast<double>(rows_);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      const auto value = static_cast<float>(lower_[static_cast<size_t>(i * k + j)] * scale);
      h[static_cast<size_t>(i * k + j)] = value;
      h[static_cast<size_t>(j * k + i)] = value;
    }
  }
  return h;
}

}  // namespace kestrel::exl3
