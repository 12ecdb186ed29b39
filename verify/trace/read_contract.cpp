// Trace reading, the contract tier's contract.csv (verify/trace/trace.hpp
// ContractSection); the rest of the trace is read by verify/trace/read.cpp.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "sim/errors.hpp"
#include "sim/limits.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

namespace {

std::vector<std::string_view> split_commas(std::string_view line) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    const size_t c = line.find(',', at);
    out.push_back(line.substr(at, c == std::string_view::npos ? c : c - at));
    if (c == std::string_view::npos) return out;
    at = c + 1;
  }
}

}  // namespace

ContractSection read_contract(const std::string& dir) {
  const std::string path =
      (std::filesystem::path(dir) / "contract.csv").string();
  std::ifstream in(path);
  if (!in)
    throw InputError(path, 0, 0, "",
                     "cannot open (a contract-tier trace "
                     "has contract.csv beside meta.csv)");
  constexpr std::string_view kHeader =
      "kind,index,ref,epoch,version,items,samples,value,residual,scale";
  constexpr std::string_view kRanked =
      "kind,index,ref,epoch,version,items,samples,value,residual,scale,rank";
  std::string line;
  int64_t ln = 1;
  if (!std::getline(in, line) || (line != kHeader && line != kRanked))
    throw InputError(
        path, 1, 1, "",
        fmt::format("expected the header '{}' (or with ',rank')", kHeader));
  const size_t fields = line == kRanked ? 11 : 10;
  // The ranks' own counts (step and epoch indices are per rank).
  constexpr int64_t kMaxRanks = 1 << 16;
  ContractSection c;
  while (std::getline(in, line)) {
    ++ln;
    if (line.empty()) continue;
    const auto f = split_commas(line);
    if (f.size() != fields)
      throw InputError(
          path, ln, 1, "",
          fmt::format("expected {} fields, got {}", fields, f.size()));
    auto integer = [&](size_t i, bool required) -> int64_t {
      if (f[i].empty()) {
        if (required)
          throw InputError(path, ln, 1, std::string(split_commas(kHeader)[i]),
                           "expected an integer, got an empty field");
        return -1;
      }
      int64_t v = 0;
      const auto r = std::from_chars(f[i].data(), f[i].data() + f[i].size(), v);
      if (r.ec != std::errc() || r.ptr != f[i].data() + f[i].size())
        throw InputError(path, ln, 1, std::string(split_commas(kHeader)[i]),
                         fmt::format("expected an integer, got '{}'", f[i]));
      return v;
    };
    auto number = [&](size_t i) -> double {
      if (f[i].empty()) return kNaN;
      const std::string t(f[i]);
      char* end = nullptr;
      const double v = std::strtod(t.c_str(), &end);
      if (end != t.c_str() + t.size())
        throw InputError(path, ln, 1, std::string(split_commas(kHeader)[i]),
                         fmt::format("expected a number, got '{}'", t));
      return v;
    };
    const std::string_view kind = f[0];
    const int64_t index = integer(1, true);
    const int64_t rank = fields == 11 ? integer(10, true) : 0;
    if (rank < 0 || rank >= kMaxRanks)
      throw InputError(
          path, ln, 1, "rank",
          fmt::format("expected 0 <= rank < {}, got {}", kMaxRanks, rank));
    if (rank >= c.ranks()) {
      c.steps.resize(size_t(rank) + 1);
      c.epochs.resize(size_t(rank) + 1);
    }
    auto& steps = c.steps[size_t(rank)];
    auto expect_index = [&](size_t next) {
      if (index != int64_t(next))
        throw InputError(
            path, ln, 1, "index",
            fmt::format("expected {} (rows of a kind in order), got {}", next,
                        index));
    };
    if (kind == "micro") {
      expect_index(c.micro.size());
      c.micro.push_back({rank, integer(3, true), integer(4, true),
                         integer(5, true), integer(6, true), number(9),
                         integer(2, false)});
    } else if (kind == "backward") {
      expect_index(c.backward.size());
      const int64_t j = integer(2, true);
      if (j < 0 || j >= int64_t(c.micro.size()))
        throw InputError(path, ln, 1, "ref",
                         fmt::format("unknown micro-batch {}", j));
      c.backward.push_back({j, integer(4, true), number(7), number(8)});
    } else if (kind == "epoch") {
      expect_index(c.epochs[size_t(rank)].size());
      c.epochs[size_t(rank)].push_back({integer(5, true), integer(6, true)});
    } else if (kind == "step") {
      expect_index(steps.size());
      ContractStep st;
      st.terms = integer(2, true);
      st.off_bf16 = integer(5, false);
      st.lr = number(7);
      st.residual = number(8);
      st.scale = number(9);
      steps.push_back(st);
    } else if (kind == "overflow") {
      expect_index(steps.size());
      ContractStep st;
      ContractStep::Overflow o;
      o.passes = integer(2, true);
      st.terms = o.passes;
      o.skipped = integer(4, true) != 0;
      o.own = integer(5, true);
      o.changed = integer(6, true);
      o.scale_before = number(7);
      o.scale_after = number(8);
      o.backoff = number(9);
      st.overflow = o;
      steps.push_back(st);
    } else if (kind == "clip") {
      expect_index(c.clips.size());
      c.clips.push_back({rank, integer(2, true), number(7), number(8),
                         number(9), number(5), integer(6, false)});
    } else if (kind == "ema") {
      ContractEma e;
      e.rank = rank;
      e.since = integer(2, true);
      e.version = integer(4, true);
      e.at_step = integer(5, true) != 0;
      e.decay_u = number(7);
      e.copy_u = number(8);
      e.fitted = number(9);
      c.ema.push_back(e);
    } else if (kind == "idle") {
      expect_index(c.idle.size());
      ContractIdle e;
      e.rank = rank;
      e.micro = integer(2, true);
      if (e.micro < 0 || e.micro >= int64_t(c.micro.size()))
        throw InputError(path, ln, 1, "ref",
                         fmt::format("unknown micro-batch {}", e.micro));
      e.version = integer(4, true);
      e.changed = integer(5, true);
      e.state_changed = integer(6, false);
      const auto at_least = [&](int64_t v, int64_t lo, size_t i) {
        if (v < lo)
          throw InputError(
              path, ln, 1, std::string(split_commas(kHeader)[i]),
              fmt::format("expected an integer >= {}, got {}", lo, v));
      };
      at_least(e.version, 0, 4);
      at_least(e.changed, 0, 5);
      at_least(e.state_changed, -1, 6);
      e.worst = number(7);
      if (!(e.worst >= 0) || std::isinf(e.worst))
        throw InputError(path, ln, 1, "value",
                         fmt::format("expected a finite number >= 0 (the "
                                     "largest relative change), got '{}'",
                                     f[7]));
      e.lambda = number(8);
      e.fit_residual = number(9);
      c.idle.push_back(e);
    } else if (kind == "coef" || kind == "replay") {
      if (index < 0 || index >= int64_t(steps.size()))
        throw InputError(path, ln, 1, "index",
                         fmt::format("unknown step {}", index));
      ContractStep& st = steps[size_t(index)];
      if (st.overflow)
        throw InputError(path, ln, 1, "index",
                         fmt::format("step {} is an overflow row: it has no "
                                     "coef or replay rows",
                                     index));
      if (kind == "coef") {
        const int64_t b = integer(2, true);
        if (b < -1 || b >= int64_t(c.backward.size()))
          throw InputError(path, ln, 1, "ref",
                           fmt::format("unknown backward {}", b));
        st.coefs.push_back({b, number(7), number(9)});
      } else {
        st.replay = number(7);
      }
    } else {
      throw InputError(
          path, ln, 1, "kind",
          fmt::format("unknown kind '{}' (micro, backward, epoch, "
                      "step, overflow, coef, replay, clip, ema, idle)",
                      kind));
    }
  }
  return c;
}

std::optional<ScheduleTable> read_schedule_table(const std::string& dir) {
  const std::string path =
      (std::filesystem::path(dir) / "schedule.csv").string();
  if (!std::filesystem::exists(path)) return std::nullopt;
  require_file_within_limit(path, "trace_bytes");
  std::ifstream in(path);
  if (!in) throw InputError(path, 0, 0, "", "cannot open");
  constexpr std::string_view kHeader = "calls,lr,lr_stretched";
  std::string line;
  if (!std::getline(in, line) || line != kHeader)
    throw InputError(path, 1, 1, "",
                     fmt::format("expected the header '{}'", kHeader));
  const int64_t max_rows = limit("schedule_rows");
  ScheduleTable t;
  int64_t ln = 1;
  bool stretched = false;
  while (std::getline(in, line)) {
    ++ln;
    if (line.empty()) continue;
    const auto f = split_commas(line);
    if (f.size() != 3)
      throw InputError(path, ln, 1, "",
                       fmt::format("expected 3 fields, got {}", f.size()));
    int64_t calls = -1;
    const auto r =
        std::from_chars(f[0].data(), f[0].data() + f[0].size(), calls);
    if (r.ec != std::errc() || r.ptr != f[0].data() + f[0].size() ||
        calls != int64_t(t.lr.size()))
      throw InputError(
          path, ln, 1, "calls",
          fmt::format("expected {} (rows in order from 0), got '{}'",
                      t.lr.size(), f[0]));
    if (calls >= max_rows)
      throw InputError(
          path, ln, 1, "calls",
          fmt::format("more than {} rows (limit schedule_rows; raise it with "
                      "ACCUMCHECK_LIMITS=schedule_rows=N)",
                      max_rows));
    auto number = [&](size_t i, const char* col) {
      const std::string v(f[i]);
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x) ||
          x < 0)
        throw InputError(path, ln, 1, col,
                         fmt::format("expected a number >= 0, got '{}'", v));
      return x;
    };
    t.lr.push_back(number(1, "lr"));
    if (ln == 2) stretched = !f[2].empty();
    if (stretched != !f[2].empty())
      throw InputError(path, ln, 1, "lr_stretched",
                       "expected a number on every row or on none");
    if (stretched) t.stretched.push_back(number(2, "lr_stretched"));
  }
  if (t.lr.empty())
    throw InputError(path, 1, 1, "", "expected at least one row (calls 0)");
  return t;
}

}  // namespace accumcheck
