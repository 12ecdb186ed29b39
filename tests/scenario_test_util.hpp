// Helpers of the scenario-file tests: edit a scenario text in place.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace accumcheck::testing_util {

// `text` with the first `from` replaced by `to` (a test failure if absent).
inline std::string with(std::string text, const std::string& from,
                        const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

}  // namespace accumcheck::testing_util
