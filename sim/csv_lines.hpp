// CSV files held in memory, split in place.
//
// The Fast C++ CSV Parser's LineReader (and its CSVReader) copies its
// input into a buffer of its own of 3 x 16 MiB = 48 MiB per file; every
// CSV accumcheck reads is already in memory (read_file_bytes, bounded by a
// limit of sim/limits.hpp), so lines are cut where they lie instead.  The
// parser's column chopper, header matcher and number parsers are reused
// (io::detail), so the dialect and its error types stay the parser's.
#pragma once

// The Fast C++ CSV Parser needs <limits> before it.
#include <libfccp/csv.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace accumcheck {

// The lines of a buffer, NUL-terminated in place ("\n" or "\r\n" ends a
// line; a last line without a line end is a line too).
class CsvLines {
 public:
  explicit CsvLines(std::string& bytes)
      : p_(bytes.data()), end_(bytes.data() + bytes.size()) {}

  // The next line, or nullptr at the end.
  char* next() {
    if (p_ >= end_) return nullptr;
    char* line = p_;
    char* nl = static_cast<char*>(std::memchr(p_, '\n', size_t(end_ - p_)));
    char* stop = nl ? nl : end_;
    p_ = nl ? nl + 1 : end_;
    if (stop != line && stop[-1] == '\r') --stop;
    *stop = '\0';  // at end_: std::string's own terminating NUL
    ++line_;
    return line;
  }
  // The 1-based number of the line last returned.
  int64_t line() const { return line_; }

 private:
  char* p_;
  char* end_;
  int64_t line_ = 0;
};

// A CSV table of N named columns (any order in the file) over CsvLines:
// the interface of io::CSVReader (read_header, read_row, get_file_line)
// without its buffer.
template <unsigned N, class Trim, class Quote>
class CsvTable {
 public:
  explicit CsvTable(std::string& bytes) : lines_(bytes) {
    order_.resize(N);
    for (unsigned i = 0; i < N; ++i) order_[i] = int(i);
  }

  template <class... Names>
  void read_header(io::ignore_column policy, Names... names) {
    static_assert(sizeof...(Names) == N, "one name per column");
    unsigned i = 0;
    ((names_[i++] = std::string(names)), ...);
    char* line = lines_.next();
    if (!line) throw io::error::header_missing();
    io::detail::parse_header_line<N, Trim, Quote>(line, order_, names_, policy);
  }

  template <class... Cols>
  bool read_row(Cols&... cols) {
    static_assert(sizeof...(Cols) == N, "one variable per column");
    char* line = lines_.next();
    if (!line) return false;
    try {
      io::detail::parse_line<Trim, Quote>(line, row_, order_);
      unsigned i = 0;
      (parse(i++, cols), ...);
    } catch (io::error::with_file_line& e) {
      e.set_file_line(int(lines_.line()));
      throw;
    }
    return true;
  }

  unsigned get_file_line() const { return unsigned(lines_.line()); }
  // After read_header: whether the file has the column `name` (with
  // io::ignore_missing_column a column may be absent; read_row then leaves
  // its variable as it was).
  bool has_column(const std::string& name) const {
    for (unsigned i = 0; i < N; ++i)
      if (names_[i] == name)
        return std::find(order_.begin(), order_.end(), int(i)) != order_.end();
    return false;
  }

 private:
  template <class T>
  void parse(unsigned i, T& x) {
    if (!row_[i]) return;
    try {
      io::detail::parse<io::throw_on_overflow>(row_[i], x);
    } catch (io::error::with_column_content& e) {
      e.set_column_content(row_[i]);
      throw;
    }
  }

  CsvLines lines_;
  std::vector<int> order_;
  std::string names_[N];
  char* row_[N] = {};
};

}  // namespace accumcheck
