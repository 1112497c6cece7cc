#include "backend/cuda/device_runtime.h"

#include <utility>

#include "base/error.h"

namespace kestrel::cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("{}: {}: {}", what, cudaGetErrorName(status), cudaGetErrorString(status));
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" status so later calls report their own errors
    return 0;
  }
  return count;
}

DeviceInfo device_info(int ordinal) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  return DeviceInfo{.name = prop.name,
                    .ordinal = ordinal,
                    .sm_count = prop.multiProcessorCount,
                    .compute_major = prop.major,
                    .compute_minor = prop.minor,
                    .total_memory = prop.totalGlobalMem};
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) (void)cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer DeviceBuffer::copy_of(const void* host, size_t bytes) {
  DeviceBuffer buffer(bytes);
  buffer.upload(host, bytes);
  return buffer;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  require(offset + bytes <= bytes_, "device upload of {} bytes at {} overruns a {}-byte buffer", bytes, offset, bytes_);
  if (bytes > 0) check(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice), "upload");
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  require(offset + bytes <= bytes_, "device download of {} bytes at {} overruns a {}-byte buffer", bytes, offset,
          bytes_);
  if (bytes > 0) {
    check(cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost), "download");
  }
}

void DeviceBuffer::zero() {
  if (bytes_ > 0) check(cudaMemset(data_, 0, bytes_), "cudaMemset");
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
}

void* PinnedBuffer::reserve(size_t bytes) {
  if (bytes > bytes_) {
    if (data_ != nullptr) check(cudaFreeHost(std::exchange(data_, nullptr)), "cudaFreeHost");
    bytes_ = 0;
    check(cudaMallocHost(&data_, bytes), "cudaMallocHost");
    bytes_ = bytes;
  }
  return data_;
}

}  // namespace kestrel::cuda
