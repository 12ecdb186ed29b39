// Input errors: everything a user can get wrong in a file they hand us.
// Each names the file, the line and column (0 when unknown), the key or
// column, and what was expected; the CLI prints what() and exits with 2.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace accumcheck {

class InputError : public std::runtime_error {
 public:
  // Defined in sim/errors.cpp: thrown from every parser, built in one
  // place instead of inline in each translation unit that throws it.
  InputError(std::string file, int64_t line, int64_t column, std::string key,
             std::string message);

  const std::string& file() const { return file_; }
  int64_t line() const { return line_; }
  int64_t column() const { return column_; }
  const std::string& key() const { return key_; }

 private:
  static std::string format(const std::string& file, int64_t line,
                            int64_t column, const std::string& key,
                            const std::string& message);
  std::string file_;
  int64_t line_, column_;
  std::string key_;
};

// Kept as the name the scenario code uses.
using ScenarioError = InputError;

// A run's loss scale left what the engines weigh exactly (2^-62 .. 2^62):
// the scenario's [precision] grows it too far in this run (exit 2).
// certify's ranking drops a candidate semantics that reaches it.
class ScaleRangeError : public InputError {
 public:
  using InputError::InputError;
};

}  // namespace accumcheck
