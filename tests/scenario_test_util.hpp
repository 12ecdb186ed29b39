// Helpers of the scenario-file tests: edit a scenario text in place.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "sim/errors.hpp"
#include "sim/scenario_parse.hpp"

namespace accumcheck::testing_util {

// `text` with the first `from` replaced by `to` (a test failure if absent).
inline std::string with(std::string text, const std::string& from,
                        const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// parse_scenario_string(text, file) must refuse `text` with an InputError
// at `line` (and `column`, when given) naming `key`, whose message contains
// `needle`.
inline void expect_scenario_error(const std::string& text, int64_t line,
                                  const std::string& key,
                                  const std::string& needle,
                                  int64_t column = -1,
                                  const std::string& file = "s.toml") {
  try {
    parse_scenario_string(text, file);
    ADD_FAILURE() << "no error; expected " << key << ": " << needle;
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), file);
    EXPECT_EQ(e.line(), line) << e.what();
    if (column >= 0) {
      EXPECT_EQ(e.column(), column) << e.what();
    }
    EXPECT_EQ(e.key(), key) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << e.what() << "\n  expected to contain: " << needle;
  }
}

}  // namespace accumcheck::testing_util
