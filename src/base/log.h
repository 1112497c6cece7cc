// Logging to stderr with a level taken from KESTREL_LOG (error|warn|info|debug; default info).
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace kestrel {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

LogLevel log_level();
void log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::info) log_line(LogLevel::info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::warn) log_line(LogLevel::warn, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::debug) log_line(LogLevel::debug, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kestrel
