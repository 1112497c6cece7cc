// Test helper: asserts that a call throws kestrel::Error whose message contains given fragments.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "base/error.h"

namespace kestrel::testing {

// Runs `body`; fails the test unless it throws Error with every fragment in its message. Returns the message.
template <typename Body>
std::string expect_error(Body&& body, std::initializer_list<std::string_view> fragments) {
  try {
    body();
  } catch (const Error& error) {
    const std::string message = error.what();
    for (std::string_view fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "missing \"" << fragment << "\" in: " << message;
    }
    return message;
  }
  ADD_FAILURE() << "expected a kestrel::Error";
  return {};
}

}  // namespace kestrel::testing
