// Limits as data: the one table of every size accumcheck accepts, each
// with its reason, like the tolerance table (oracle/error_model.hpp).
//
// A scenario or an input file over a limit is refused before anything is
// allocated for it: an InputError (exit 2) naming the file, the key, the
// value and the limit, and saying how to raise it.  A user who means it
// raises a limit with the environment variable
//
//   ACCUMCHECK_LIMITS="samples=20000000,oracle_madds=1e12"
//
// (comma-separated key=value; a value is a positive integer, 1e12 style
// allowed).  Raising a limit never switches off the overflow checks: every
// size is computed with checked arithmetic (checked_mul / checked_add), and
// a size that does not fit in 63 bits is refused whatever the limits say.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "sim/scenario.hpp"

namespace accumcheck {

struct Limit {
  std::string_view key;     // "samples"
  int64_t value;            // the default
  std::string_view unit;    // "samples", "bytes", ...
  std::string_view reason;  // why this value
};

// The table (defaults, in a fixed order).
std::span<const Limit> limits_table();

// The limit in force for `key`: the table's value, or ACCUMCHECK_LIMITS's
// (InputError, exit 2, on a malformed ACCUMCHECK_LIMITS or an unknown key
// in it).  An unknown `key` here is a programming error (std::logic_error).
int64_t limit(std::string_view key);

// The table as text, one row per limit, with the value in force (the
// output of `accumcheck limits`, shown in docs/limits-and-exit-codes.md).
std::string limits_text();

// Checked int64 arithmetic: nullopt on overflow (or a negative operand).
std::optional<int64_t> checked_mul(int64_t a, int64_t b);
std::optional<int64_t> checked_add(int64_t a, int64_t b);

// Throws InputError(file, line, column, key, ...) when `value` exceeds the
// limit `limit_key` (nullopt = does not fit in 63 bits): the message names
// `what` (e.g. "data.samples = 4611686018427387905"), the limit and its
// reason, and how to raise it.
void require_within(std::string_view limit_key, std::optional<int64_t> value,
                    const std::string& what, const std::string& file,
                    int64_t line, int64_t column, const std::string& key);

// The sizes of one scenario, computed with checked arithmetic (nullopt:
// beyond 63 bits).  `windows` and the work counts are those the commands
// run: optimizer windows over every epoch, capped by batching.max_steps
// (a run stops there), so `--steps 1` makes any epoch count cheap.
struct ScenarioSize {
  std::optional<int64_t> parameters, data_values, windows_per_epoch, windows,
      samples_seen, oracle_madds;
};
ScenarioSize scenario_size(const Scenario& s);

// Every scenario-wide limit (parameters, data values, windows, the
// oracle's multiply-adds): call after the command's overrides (--steps)
// and before any allocation.  The per-key limits (samples, width, layers,
// file sizes) are checked where the value is read, with its line.
// `madds_key` names the limit on the oracle's estimated work: oracle_madds
// (the 50-digit MPFR oracle: run, export, certify --bound-arith mpfr) or
// oracle_madds_dd (certify's default double-double bound, ~100x cheaper).
void require_scenario_within_limits(
    const Scenario& s, std::string_view madds_key = "oracle_madds");

// Opens nothing: why `path` cannot be read as a file ("does not exist",
// "is a folder", "is not a regular file (a device, pipe or socket)"), or
// "" when it is a regular file.
std::string why_not_a_file(const std::string& path);

// Opens nothing: refuses a path that is not a regular file or is larger
// than the limit `limit_key` (InputError naming the path), before the file
// is read.  A missing file is left to the reader's "cannot open" message.
void require_file_within_limit(const std::string& path,
                               std::string_view limit_key);

}  // namespace accumcheck
