// Errors: one exception type carrying a complete, user-facing message.
// Bad input (files, configs, requests) is reported by throwing kestrel::Error with a message that names the
// file and the tensor or field at fault; the CLI prints it and exits non-zero. Nothing catches and ignores it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace kestrel {

class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Checks an invariant of the input (not of our own code): throws Error with the formatted message if false.
template <typename... Args>
void require(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kestrel
