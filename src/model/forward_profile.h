// Where a forward's time goes, by part of the model (ForwardOptions::profile, `kestrel bench --profile`). Each part
// is timed from one backend synchronisation to the next, so a profiled pass serialises the host and the device: the
// parts add up to more than an unprofiled pass by the overlap of launching with running that this removes.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace kestrel {

struct ForwardProfile {
  struct Part {
    std::string name;
    double seconds = 0.0;
    int64_t count = 0;  // times the part ran
  };
  std::vector<Part> parts;  // in the order first timed

  void add(std::string_view name, double seconds);
  double total_seconds() const;
};

// Times one part of a forward into `profile`; without a profile it does nothing.
class ProfileScope {
public:
  ProfileScope(ForwardProfile* profile, Backend& backend, std::string_view name);
  // Synchronises the backend (which may throw), unless the scope is left by an exception.
  ~ProfileScope() noexcept(false);
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

private:
  ForwardProfile* profile_;
  Backend& backend_;
  std::string_view name_;
  int exceptions_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kestrel
