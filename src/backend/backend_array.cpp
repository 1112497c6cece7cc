#include "backend/backend_array.h"

#include <utility>

#include "backend/backend.h"

namespace kestrel {

BackendArray::BackendArray(Backend& backend, size_t count)
    : backend_(&backend), data_(count > 0 ? backend.allocate_floats(count) : nullptr), count_(count) {}

BackendArray::~BackendArray() {
  if (data_ != nullptr) backend_->free_floats(data_);
}

BackendArray::BackendArray(BackendArray&& other) noexcept
    : backend_(other.backend_), data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}

BackendArray& BackendArray::operator=(BackendArray&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) backend_->free_floats(data_);
    backend_ = other.backend_;
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

}  // namespace kestrel
