// Limits as data (sim/limits.hpp).
#include "sim/limits.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "sim/errors.hpp"
#include "sim/layout.hpp"

namespace accumcheck {

namespace {

// The one table.  Reasons are measured or derived on the reference
// machine (2 cores); docs/limits-and-exit-codes.md "Limits" prints this table.
constexpr Limit kLimits[] = {
    {"scenario_bytes", int64_t{1} << 20, "bytes",
     "a scenario file is a few dozen lines; 1 MiB is read whole and "
     "parsed in milliseconds"},
    {"csv_bytes", int64_t{256} << 20, "bytes",
     "a [data] csv file is read whole into memory and parsed once; 256 MiB "
     "(about 10 million rows of a few columns) parses in seconds"},
    {"trace_bytes", int64_t{1} << 30, "bytes",
     "each trace CSV (meta, events, values) is read whole; a values row "
     "becomes a ~80-byte record, so 1 GiB of text stays within a few GiB"},
    {"trace_bin_bytes", int64_t{4} << 30, "bytes",
     "values.bin is mapped and each value decoded where it is read "
     "(resident: about the file's size plus the oracle's state); a "
     "1M-parameter model's 100 steps with Adam's moments are 1.6 GB (1.8 GB "
     "resident)"},
    {"samples", 10'000'000, "samples",
     "the plan permutes every sample id each epoch (8 bytes each) and the "
     "dataset is held in memory"},
    {"width", 4096, "units",
     "kept from the scenario format's first version: one 4096 x 4096 layer "
     "already exceeds the parameters limit 16 times over"},
    {"layers", 32, "Linear layers",
     "deeper nets add nothing to the accumulation semantics and multiply "
     "the oracle's cost"},
    {"parameters", 1'000'000, "parameters",
     "the oracle keeps about ten copies of the parameters (weights, "
     "gradients, optimizer state, teacher-forcing) at ~120 bytes per "
     "50-digit Tracked number: 1e6 parameters is about 1.2 GB"},
    {"data_values", 100'000'000, "float32 values",
     "the dataset (samples x (d_in + d_out), or samples x max_len x 2 for "
     "token models) is held in memory: 1e8 values is 400 MB"},
    {"windows", 1'000'000, "optimizer windows",
     "each window is a table row and a trace record per run, and one "
     "optimizer step on every engine; cap a long run with --steps"},
    {"schedule_rows", 10'000'000, "rows",
     "a declared lr schedule's table (schedule.csv: one lr per count of "
     "scheduler.step() calls, about K x steps + epochs rows) is read whole "
     "at ~50 bytes of text and 16 bytes of memory a row: 1e7 rows is 500 MB "
     "of text; the recorder steps PyTorch's scheduler once a row (LambdaLR: "
     "3.4 us of CPU a row on the reference machine, 1e7 rows about 34 s)"},
    {"oracle_madds", 10'000'000'000, "multiply-adds",
     "estimated oracle work of a run: 3 x parameters per sample (forward "
     "and backward) x samples seen x 4 runs; the 50-digit oracle did 2.6 to "
     "3.9 million per second on the 2-core reference machine (certify-mlp-200: "
     "3.2e7 in 12.6 s), so 1e10 is about an hour"},
    {"oracle_madds_dd", 1'000'000'000'000, "multiply-adds",
     "the same estimate for certify with the double-double bound (the "
     "default --bound-arith dd): 1M parameters x 100 steps of 16 samples "
     "(1.9e10) took 47.5 s of CPU on the reference machine, about 4e8 per "
     "CPU second, so 1e12 is about 40 minutes of CPU"},
    {"combination_pitfalls", 5, "pitfalls",
     "certify's diagnosis searches combinations of catalog pitfalls beyond "
     "pairs up to this size (issue 44: framework releases combine three to "
     "five); each size adds at most combination_beam x catalog candidates"},
    {"combination_beam", 4, "candidates",
     "the closest candidates the combination search extends at each size: "
     "4 x about 40 catalog pitfalls is about 160 more candidates a size, "
     "each as cheap as a pair's"},
};

constexpr std::string_view kEnv = "ACCUMCHECK_LIMITS";

// 123, 1e12, 2.5e9 (an integer value, >= 1).
std::optional<int64_t> parse_limit_value(std::string_view t) {
  if (t.empty()) return std::nullopt;
  int64_t v = 0;
  auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (r.ec == std::errc() && r.ptr == t.data() + t.size())
    return v >= 1 ? std::optional<int64_t>(v) : std::nullopt;
  double d = 0;
  auto rd = std::from_chars(t.data(), t.data() + t.size(), d);
  if (rd.ec != std::errc() || rd.ptr != t.data() + t.size() ||
      !std::isfinite(d) || d < 1 || d >= 0x1p63 || std::floor(d) != d)
    return std::nullopt;
  return int64_t(d);
}

const Limit* find_limit(std::string_view key) {
  for (const Limit& l : kLimits)
    if (l.key == key) return &l;
  return nullptr;
}

std::string known_keys() {
  std::string s;
  for (const Limit& l : kLimits) {
    if (!s.empty()) s += ", ";
    s += l.key;
  }
  return s;
}

// ACCUMCHECK_LIMITS, parsed (each call: the environment may change
// between in-process test runs).
std::map<std::string, int64_t, std::less<>> overrides() {
  std::map<std::string, int64_t, std::less<>> m;
  const char* env = std::getenv(std::string(kEnv).c_str());
  if (!env) return m;
  std::string_view rest(env);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view()
                                           : rest.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    if (eq == std::string_view::npos || !find_limit(key))
      throw InputError(
          std::string(kEnv), 0, 0, std::string(key),
          fmt::format("expected key=value with a key among {}, got '{}'",
                      known_keys(), item));
    const std::optional<int64_t> v = parse_limit_value(item.substr(eq + 1));
    if (!v)
      throw InputError(std::string(kEnv), 0, 0, std::string(key),
                       fmt::format("expected an integer >= 1 (1e12 style "
                                   "allowed) below 2^63, got '{}'",
                                   item.substr(eq + 1)));
    m[std::string(key)] = *v;
  }
  return m;
}

std::string count_text(int64_t v) {
  // 1000000 -> 1000000 (1e6) for readability of large round values.
  if (v >= 100000 && v % 1000 == 0) {
    int e = 0;
    int64_t m = v;
    while (m % 10 == 0) {
      m /= 10;
      ++e;
    }
    return fmt::format("{} ({}e{})", v, m, e);
  }
  return std::to_string(v);
}

}  // namespace

std::span<const Limit> limits_table() { return kLimits; }

int64_t limit(std::string_view key) {
  const Limit* l = find_limit(key);
  if (!l) throw std::logic_error("no limit '" + std::string(key) + "'");
  const auto m = overrides();
  const auto it = m.find(key);
  return it == m.end() ? l->value : it->second;
}

std::string limits_text() {
  std::string o = fmt::format("{:<15} {:>26}  {:<18} {}\n", "limit", "value",
                              "unit", "reason");
  for (const Limit& l : kLimits)
    o += fmt::format("{:<15} {:>26}  {:<18} {}\n", l.key,
                     count_text(limit(l.key)), l.unit, l.reason);
  return o;
}

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

void require_within(std::string_view limit_key, std::optional<int64_t> value,
                    const std::string& what, const std::string& file,
                    int64_t line, int64_t column, const std::string& key) {
  const Limit* l = find_limit(limit_key);
  if (!l) throw std::logic_error("no limit '" + std::string(limit_key) + "'");
  const int64_t lim = limit(limit_key);
  if (value && *value <= lim) return;
  const std::string raise =
      fmt::format("to raise it, set {}={}=N in the environment", kEnv, l->key);
  if (!value)
    throw InputError(
        file, line, column, key,
        fmt::format("{}: too large, its {} do not fit in 63 bits "
                    "(limit {} {}: {})",
                    what, l->unit, count_text(lim), l->key, l->reason));
  throw InputError(
      file, line, column, key,
      fmt::format("{} exceeds the limit {} = {} {} ({}); {}", what, l->key,
                  count_text(lim), l->unit, l->reason, raise));
}

ScenarioSize scenario_size(const Scenario& s) {
  ScenarioSize z;
  const ModelSpec& m = s.model;
  // Parameters: every Linear (weights + bias), norms' affine pair, or the
  // token model's embedding and head; layout_of() is the authority, but
  // it may only run once the widths are known to be bounded.
  {
    std::optional<int64_t> p = 0;
    for (size_t i = 0; i + 1 < m.widths.size() && p; ++i) {
      const auto w = checked_mul(m.widths[i], m.widths[i + 1]);
      p = w ? checked_add(*p, *w) : std::nullopt;
      if (p) p = checked_add(*p, 3 * m.widths[i + 1]);  // bias (+ norm pair)
    }
    if (m.kind == ModelKind::token && p) {
      const auto e = checked_mul(m.vocab, m.embed);
      p = e ? checked_add(*p, *e) : std::nullopt;
    }
    z.parameters = p;
    if (p && *p <= limit("parameters") && m.widths.size() >= 2)
      z.parameters = layout_of(m).total;  // exact
  }
  const DataSpec& d = s.data;
  const int64_t per_sample =
      m.kind == ModelKind::token
          ? (checked_mul(d.max_len, 2).value_or(-1))
          : (checked_add(m.d_in(), m.d_out()).value_or(-1));
  z.data_values =
      per_sample < 0 ? std::nullopt : checked_mul(d.samples, per_sample);

  const BatchingSpec& b = s.batching;
  if (d.samples >= 1 && b.ranks >= 1 && b.micro_batch >= 1 &&
      b.accumulation >= 1) {
    const int64_t per_rank = d.samples / b.ranks + (d.samples % b.ranks != 0);
    const int64_t micro =
        per_rank / b.micro_batch + (per_rank % b.micro_batch != 0);
    z.windows_per_epoch =
        micro / b.accumulation + (micro % b.accumulation != 0);
    z.windows = checked_mul(b.epochs, *z.windows_per_epoch);
    // A run stops after max_steps windows (sim/trainer.hpp).
    if (b.max_steps >= 0 && (!z.windows || *z.windows > b.max_steps))
      z.windows = b.max_steps;
    if (z.windows) {
      const auto window_samples = checked_mul(
          b.micro_batch, checked_mul(b.accumulation, b.ranks).value_or(-1));
      z.samples_seen = window_samples ? checked_mul(*z.windows, *window_samples)
                                      : std::nullopt;
    }
  }
  if (z.parameters && z.samples_seen) {
    const auto per = checked_mul(*z.parameters, 3 * 4);  // fwd+bwd, 4 runs
    z.oracle_madds = per ? checked_mul(*per, *z.samples_seen) : std::nullopt;
  }
  return z;
}

void require_scenario_within_limits(const Scenario& s,
                                    std::string_view madds_key) {
  const ScenarioSize z = scenario_size(s);
  // Each limit reported at the key it is about, where the file wrote it.
  auto within = [&](std::string_view limit_key, std::optional<int64_t> value,
                    const std::string& what, const std::string& key) {
    const auto at = s.written_at.find(key);
    const auto [line, column] = at == s.written_at.end()
                                    ? std::pair<int64_t, int64_t>{0, 0}
                                    : at->second;
    require_within(limit_key, value, what, s.path, line, column, key);
  };
  within("layers", int64_t(s.model.widths.size()) - 1,
         fmt::format("{} Linear layers", s.model.widths.size() - 1),
         "model.widths");
  within("samples", s.data.samples,
         fmt::format("data.samples = {}", s.data.samples), "data.samples");
  within(
      "parameters", z.parameters,
      fmt::format("the model's parameter count {}",
                  z.parameters ? std::to_string(*z.parameters) : "(overflow)"),
      s.model.kind == ModelKind::token ? "model.vocab" : "model.widths");
  within(
      "data_values", z.data_values,
      fmt::format("the dataset's {} values ({} samples)",
                  z.data_values ? std::to_string(*z.data_values) : "(overflow)",
                  s.data.samples),
      "data.samples");
  within(
      "windows", z.windows,
      fmt::format(
          "batching.epochs = {} x {} windows per epoch = {} optimizer windows",
          s.batching.epochs,
          z.windows_per_epoch ? std::to_string(*z.windows_per_epoch) : "?",
          z.windows ? std::to_string(*z.windows) : "(overflow)"),
      "batching.epochs");
  within(madds_key, z.oracle_madds,
         fmt::format(
             "the oracle's estimated {} multiply-adds ({} parameters x "
             "{} samples seen x 12)",
             z.oracle_madds ? std::to_string(*z.oracle_madds) : "(overflow)",
             z.parameters ? std::to_string(*z.parameters) : "?",
             z.samples_seen ? std::to_string(*z.samples_seen) : "?"),
         "batching.epochs");
}

std::string why_not_a_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT
               ? "does not exist"
               : std::string("cannot be read: ") + std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "is a folder";
  if (!S_ISREG(st.st_mode))
    return "is not a regular file (a device, pipe or socket)";
  return "";
}

void require_file_within_limit(const std::string& path,
                               std::string_view limit_key) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // the reader says why
  if (const std::string why = why_not_a_file(path); !why.empty())
    throw InputError(path, 0, 0, "", why + "; expected a file");
  require_within(limit_key, int64_t(st.st_size),
                 fmt::format("its size {} bytes", int64_t(st.st_size)), path, 0,
                 0, "");
}

}  // namespace accumcheck
