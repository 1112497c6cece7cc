#include "base/log.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kestrel {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* env = std::getenv("KESTREL_LOG");
    const std::string value = env ? env : "info";
    if (value == "error") return LogLevel::error;
    if (value == "warn") return LogLevel::warn;
    if (value == "debug") return LogLevel::debug;
    return LogLevel::info;
  }();
  return level;
}

void log_line(LogLevel level, std::string_view message) {
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  std::fprintf(stderr, "[kestrel %s] %.*s\n", kNames[static_cast<int>(level)], static_cast<int>(message.size()),
               message.data());
}

}  // namespace kestrel
