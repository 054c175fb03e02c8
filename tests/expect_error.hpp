#pragma once
// Checks of the one-line trident::Error messages that bad input must produce.
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "util/error.hpp"

namespace trident::test {

// The message of the trident::Error `fn` throws ("" and a test failure if it throws none, or
// throws another exception).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-trident exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// `msg` is one line and contains every one of `parts`.
inline void expect_one_line_with(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

}  // namespace trident::test
