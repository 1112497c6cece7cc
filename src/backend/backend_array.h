// An array in a backend's memory that frees itself through the backend: cache pools, block-table mirrors, KDA states
// and placed weight vectors. The backend must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kestrel {

class Backend;

class BackendArray {
public:
  BackendArray() = default;
  // `count` floats (or int32s: same size), uninitialised.
  BackendArray(Backend& backend, size_t count);
  ~BackendArray();
  BackendArray(BackendArray&& other) noexcept;
  BackendArray& operator=(BackendArray&& other) noexcept;
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int32_t* int32s() { return reinterpret_cast<int32_t*>(data_); }
  const int32_t* int32s() const { return reinterpret_cast<const int32_t*>(data_); }
  size_t size() const { return count_; }

private:
  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace kestrel
