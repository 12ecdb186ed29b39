#include "sim/errors.hpp"

#include <utility>

namespace accumcheck {

InputError::InputError(std::string file, int64_t line, int64_t column,
                       std::string key, std::string message)
    : std::runtime_error(format(file, line, column, key, message)),
      file_(std::move(file)),
      line_(line),
      column_(column),
      key_(std::move(key)) {}

std::string InputError::format(const std::string& file, int64_t line,
                               int64_t column, const std::string& key,
                               const std::string& message) {
  // Appended piece by piece: `"x" + std::string` trips GCC 12's
  // -Wrestrict false positive (PR105329) once inlined.
  std::string s = file;
  if (line > 0) s.append(":").append(std::to_string(line));
  if (column > 0) s.append(":").append(std::to_string(column));
  if (!s.empty()) s.append(": ");  // no file: a command-line option
  if (!key.empty()) s.append(key).append(": ");
  s.append(message);
  return s;
}

}  // namespace accumcheck
