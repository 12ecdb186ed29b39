// The scenario parser's reading machinery, shared by the files that parse
// the sections (sim/scenario_parse.cpp: the top level, [model], [data],
// [optimizer], [expect] and the checks across sections;
// sim/scenario_parse_batching.cpp: [batching] with its K schedule, and
// [schedule]; sim/scenario_parse_precision.cpp: [precision] and [ema]).
// Internal to sim/: nothing outside the parser includes it.
#pragma once

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/errors.hpp"
#include "sim/limits.hpp"
#include "sim/scenario.hpp"
#include "sim/scenario_text.hpp"

namespace accumcheck::scenario_reader {

using namespace scenario_text;

// Levenshtein distance, for "did you mean".
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The closest candidate within a small edit distance, or "".
template <class Range>
std::string_view closest(std::string_view word, const Range& candidates) {
  std::string_view best;
  size_t best_d = std::max<size_t>(2, word.size() / 4) + 1;
  for (std::string_view c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best = c, best_d = d;
  }
  return best;
}

// "got 0", "got \"tahn\"", "got an array".
inline std::string got(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::integer:
      return "got " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point:
      return "got " + float_text(n.as_floating_point()->get());
    case toml::node_type::boolean:
      return n.as_boolean()->get() ? "got true" : "got false";
    case toml::node_type::string:
      return "got " + toml_string(n.as_string()->get());
    case toml::node_type::array:
      return "got an array";
    case toml::node_type::table:
      return "got a table";
    default:
      return "got a date/time";
  }
}

inline std::string int_range_text(int64_t lo, int64_t hi) {
  if (hi == kIntMax) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer in {}..{}", lo, hi);
}

// A number predicate with its wording ("a number > 0").
struct NumberRule {
  std::string_view text;
  bool (*ok)(double);
};
constexpr NumberRule kPositive{"a number > 0", [](double x) { return x > 0; }};
constexpr NumberRule kNonNegative{"a number >= 0",
                                  [](double x) { return x >= 0; }};
constexpr NumberRule kUnitInterval{"a number in [0, 1)",
                                   [](double x) { return x >= 0 && x < 1; }};

class Parser {
 public:
  Parser(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const toml::source_region& r, const std::string& key,
                         const std::string& msg) const {
    throw InputError(file_, int64_t(r.begin.line), int64_t(r.begin.column), key,
                     msg);
  }
  [[noreturn]] void fail(const toml::node* n, const std::string& key,
                         const std::string& msg) const {
    if (n) fail(n->source(), key, msg);
    throw InputError(file_, 0, 0, key, msg);
  }

  const std::string& file() const { return file_; }

  // A value against a limit of sim/limits.hpp, reported at node `n`.
  void within(const toml::node* n, const std::string& key,
              std::string_view limit_key, std::optional<int64_t> value,
              const std::string& what) const {
    const int64_t line = n ? int64_t(n->source().begin.line) : 0;
    const int64_t col = n ? int64_t(n->source().begin.column) : 0;
    require_within(limit_key, value, what, file_, line, col, key);
  }

 private:
  std::string file_;
};

// One [section]: checks its keys against the allowed ones and reads typed,
// range-checked values.
class Section {
 public:
  Section(const Parser& p, const toml::table& root, std::string name,
          std::initializer_list<std::string_view> keys)
      : p_(p), name_(std::move(name)), keys_(keys) {
    const toml::node* n = root.get(name_);
    if (n && !n->is_table())
      p_.fail(n, name_, "expected a table [" + name_ + "], " + got(*n));
    table_ = n ? n->as_table() : nullptr;
    if (!table_) return;
    for (auto&& [k, v] : *table_) {
      (void)v;
      if (std::find(keys_.begin(), keys_.end(), k.str()) != keys_.end())
        continue;
      std::string msg = fmt::format("unknown key '{}' in [{}]", k.str(), name_);
      const std::string_view guess = closest(k.str(), keys_);
      if (!guess.empty())
        msg += fmt::format("; did you mean '{}'?", guess);
      else
        msg += "; known keys: " + join(keys_);
      p_.fail(k.source(), key(k.str()), msg);
    }
  }

  bool present() const { return table_ != nullptr; }
  std::string key(std::string_view k) const {
    return name_ + "." + std::string(k);
  }
  const toml::node* node(std::string_view k) const {
    return table_ ? table_->get(k) : nullptr;
  }
  bool has(std::string_view k) const { return node(k) != nullptr; }

  [[noreturn]] void missing(std::string_view k, std::string_view what) const {
    const std::string msg =
        fmt::format("missing required key '{}'; expected {}", k, what);
    if (table_) p_.fail(table_->source(), key(k), msg);
    p_.fail(nullptr, key(k),
            fmt::format("{} (section [{}] is absent)", msg, name_));
  }
  [[noreturn]] void bad(std::string_view k, std::string_view what) const {
    const toml::node* n = node(k);
    p_.fail(n, key(k), fmt::format("expected {}, {}", what, got(*n)));
  }
  // Rejects a key that has no meaning under the chosen setting.
  void forbid(std::string_view k, std::string_view why) const {
    if (const toml::node* n = node(k))
      p_.fail(n, key(k), fmt::format("'{}' {}", k, why));
  }

  std::optional<int64_t> integer(std::string_view k, int64_t lo,
                                 int64_t hi = kIntMax) const {
    const toml::node* n = node(k);
    if (!n) return std::nullopt;
    const auto* v = n->as_integer();
    if (!v || v->get() < lo || v->get() > hi) bad(k, int_range_text(lo, hi));
    return v->get();
  }
  int64_t required_integer(std::string_view k, int64_t lo,
                           int64_t hi = kIntMax) const {
    if (!has(k)) missing(k, int_range_text(lo, hi));
    return *integer(k, lo, hi);
  }

  std::optional<double> number(std::string_view k, NumberRule rule) const {
    const toml::node* n = node(k);
    if (!n) return std::nullopt;
    double x;
    if (const auto* i = n->as_integer())
      x = double(i->get());
    else if (const auto* f = n->as_floating_point())
      x = f->get();
    else
      bad(k, rule.text);
    if (!std::isfinite(x) || !rule.ok(x)) bad(k, rule.text);
    return x;
  }
  double required_number(std::string_view k, NumberRule rule) const {
    if (!has(k)) missing(k, rule.text);
    return *number(k, rule);
  }

  std::optional<bool> boolean(std::string_view k) const {
    const toml::node* n = node(k);
    if (!n) return std::nullopt;
    if (!n->is_boolean()) bad(k, "true or false");
    return n->as_boolean()->get();
  }

  std::optional<std::string> string(std::string_view k) const {
    const toml::node* n = node(k);
    if (!n) return std::nullopt;
    if (!n->is_string()) bad(k, "a string");
    return n->as_string()->get();
  }

  template <class E, size_t N>
  std::optional<E> choice(
      std::string_view k,
      const std::pair<std::string_view, E> (&names)[N]) const {
    const toml::node* n = node(k);
    if (!n) return std::nullopt;
    std::vector<std::string_view> spelled;
    for (const auto& [name, v] : names) spelled.push_back(name);
    std::string what = "one of";
    for (size_t i = 0; i < N; ++i) {
      what += i ? ", " : " ";
      what += toml_string(spelled[i]);
    }
    if (!n->is_string()) bad(k, what);
    const std::string& s = n->as_string()->get();
    for (const auto& [name, v] : names)
      if (name == s) return v;
    std::string msg = fmt::format("expected {}, {}", what, got(*n));
    const std::string_view guess = closest(s, spelled);
    if (!guess.empty())
      msg += fmt::format("; did you mean {}?", toml_string(guess));
    p_.fail(n, key(k), msg);
  }

  static std::string join(const std::vector<std::string_view>& v) {
    std::string s;
    for (std::string_view x : v) {
      if (!s.empty()) s += ", ";
      s += x;
    }
    return s;
  }

 private:
  const Parser& p_;
  std::string name_;
  std::vector<std::string_view> keys_;
  const toml::table* table_ = nullptr;
};

// sim/scenario_parse_batching.cpp
void parse_batching(const Parser& p, const Section& sec, Scenario& s);
void parse_schedule(const Parser& p, const Section& sec, ScheduleSpec& sc);

// sim/scenario_parse_precision.cpp
void parse_precision(const Parser& p, const Section& precision,
                     const Section& ema, Scenario& s);

}  // namespace accumcheck::scenario_reader
