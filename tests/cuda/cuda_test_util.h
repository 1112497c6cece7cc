// Helpers shared by the CUDA tests: random inputs, host <-> device round trips and the relative difference the
// tolerances are stated in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/device_runtime.h"

namespace kestrel::cuda::testing {

inline bool have_gpu() { return device_count() > 0; }

// n values f(z) for z ~ N(0, 1).
template <typename F>
std::vector<float> random_transformed(size_t n, uint32_t seed, F f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = f(normal(rng));
  return v;
}

inline std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  return random_transformed(n, seed, [scale](float z) { return scale * z; });
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  return DeviceBuffer::copy_of(host.data(), host.size() * sizeof(T));
}

// Waits for the device and copies the whole buffer back.
template <typename T = float>
std::vector<T> to_host(const DeviceBuffer& buffer) {
  check(cudaDeviceSynchronize(), "kernel");
  std::vector<T> host(buffer.size() / sizeof(T));
  buffer.download(host.data(), host.size() * sizeof(T));
  return host;
}

// max |gpu - cpu| / max |cpu|
inline double relative_difference(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double worst = 0.0, largest = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(gpu[i] - cpu[i])));
    largest = std::max(largest, static_cast<double>(std::fabs(cpu[i])));
  }
  return worst / largest;
}

}  // namespace kestrel::cuda::testing
