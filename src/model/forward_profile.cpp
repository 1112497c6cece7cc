#include "model/forward_profile.h"

#include <exception>

namespace kestrel {

void ForwardProfile::add(std::string_view name, double seconds) {
  for (Part& part : parts) {
    if (part.name == name) {
      part.seconds += seconds;
      ++part.count;
      return;
    }
  }
  parts.push_back(Part{.name = std::string(name), .seconds = seconds, .count = 1});
}

double ForwardProfile::total_seconds() const {
  double total = 0.0;
  for (const Part& part : parts) total += part.seconds;
  return total;
}

ProfileScope::ProfileScope(ForwardProfile* profile, Backend& backend, std::string_view name)
    : profile_(profile), backend_(backend), name_(name), exceptions_(std::uncaught_exceptions()) {
  if (profile_ == nullptr) return;
  backend_.synchronize();  // the ops queued before the part are not its time
  start_ = std::chrono::steady_clock::now();
}

ProfileScope::~ProfileScope() noexcept(false) {
  if (profile_ == nullptr || std::uncaught_exceptions() > exceptions_) return;
  backend_.synchronize();
  profile_->add(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

}  // namespace kestrel
