// CUDA runtime basics for the CUDA backend: errors become kestrel::Error with the failing call named, device memory
// is owned by DeviceBuffer (freed on destruction, never copied), and the device's properties are read once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kestrel::cuda {

// Throws Error("<what>: <CUDA error name>: <description>") unless status is cudaSuccess.
void check(cudaError_t status, const char* what);

struct DeviceInfo {
  std::string name;
  int ordinal = 0;
  int sm_count = 0;
  int compute_major = 0, compute_minor = 0;
  size_t total_memory = 0;
};

// The number of usable CUDA devices: 0 when there is no driver or no GPU (never throws).
int device_count();
DeviceInfo device_info(int ordinal);

class DeviceBuffer {
public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // A buffer holding a copy of `bytes` bytes of host memory (any alignment).
  static DeviceBuffer copy_of(const void* host, size_t bytes);
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void zero();

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }
  size_t size() const { return bytes_; }

private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (cudaMallocHost): device-to-host copies into it run at the bus's speed.
class PinnedBuffer {
public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` bytes; a smaller buffer is replaced (its contents are not kept).
  void* reserve(size_t bytes);

private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kestrel::cuda
