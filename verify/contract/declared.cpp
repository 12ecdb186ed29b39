// What a contract trace's meta.csv declares (verify/contract/detail.hpp):
// the semantics the user accepted, the lr schedule and clip of the loop,
// and what the contract tier does not judge.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>

#include "sim/errors.hpp"
#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

// The semantics the user accepted (meta.csv `accept`: pitfall ids joined by
// '+' or ','; empty: correct).  A framework whose documented loop differs
// from exact large-batch equivalence (Lightning's partial window, say) is
// judged against that loop once the user accepts it by name; the report
// says so.  Unknown ids are the user's mistake (exit 2).
std::vector<Pitfall> accepted_semantics(const Trace& tr) {
  std::vector<Pitfall> out;
  std::string v = tr.meta_value("accept");
  std::replace(v.begin(), v.end(), ',', '+');
  size_t at = 0;
  while (at <= v.size() && !v.empty()) {
    const size_t end = std::min(v.find('+', at), v.size());
    const std::string id = v.substr(at, end - at);
    at = end + 1;
    if (id.empty()) continue;
    const auto p = pitfall_from_id(id);
    if (!p)
      throw InputError(tr.meta_path(), 0, 0, "accept",
                       "unknown pitfall id '" + id +
                           "' (expected pitfall ids as docs/pitfalls.md names "
                           "them, joined by '+')");
    if (std::find(out.begin(), out.end(), *p) == out.end()) out.push_back(*p);
  }
  // The catalog's order, as candidate_semantics names its pairs.
  auto rank = [](Pitfall p) {
    return std::find(std::begin(kAllPitfalls), std::end(kAllPitfalls), p) -
           std::begin(kAllPitfalls);
  };
  std::sort(out.begin(), out.end(),
            [&](Pitfall a, Pitfall b) { return rank(a) < rank(b); });
  return out;
}

// The accepted lr schedule and clip the recorder declared (meta.csv: lr,
// schedule_kind, schedule_warmup, schedule_total, schedule_step_size,
// schedule_gamma, schedule_frequency, schedule_warmup_ratio, clip), as a
// scenario's [optimizer] lr,
// [schedule] and [clip] would give them.
void declared(const Trace& tr, Scenario& s) {
  auto number = [&](const char* key, double fallback) {
    const std::string v = tr.meta_value(key);
    if (v.empty()) return fallback;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end != v.c_str() + v.size() || !std::isfinite(x) || x < 0)
      throw InputError(tr.meta_path(), 0, 0, key,
                       fmt::format("expected a number >= 0, got '{}'", v));
    return x;
  };
  auto integer = [&](const char* key, int64_t fallback) {
    const double x = number(key, double(fallback));
    if (x != std::floor(x) || x > 9e15)
      throw InputError(tr.meta_path(), 0, 0, key, "expected an integer >= 0");
    return int64_t(x);
  };
  s.optimizer.lr = number("lr", 1.0);
  const std::string kind = tr.meta_value("schedule_kind");
  ScheduleSpec& sc = s.schedule;
  if (kind == "table") {
    // A declared scheduler, tabulated by the recorder (schedule.csv): the
    // multipliers of the meta lr, as LambdaLR's base_lr * lambda(n).
    const std::optional<ScheduleTable> t = read_schedule_table(tr.dir);
    if (!t)
      throw InputError(tr.meta_path(), 0, 0, "schedule_kind",
                       "'table' needs schedule.csv beside meta.csv (written "
                       "by ContractRecorder(schedule=...)); record again");
    const double base = s.optimizer.lr > 0 ? s.optimizer.lr : 1.0;
    s.optimizer.lr = base;
    auto multipliers = [&](const std::vector<double>& lr) {
      std::vector<double> m;
      m.reserve(lr.size());
      for (double x : lr) m.push_back(x / base);
      return std::make_shared<const std::vector<double>>(std::move(m));
    };
    sc.table = multipliers(t->lr);
    if (!t->stretched.empty()) sc.stretched_table = multipliers(t->stretched);
  } else if (kind.empty() || kind == "constant") {
    sc.kind = ScheduleKind::constant;
  } else if (kind == "step") {
    sc.kind = ScheduleKind::step;
  } else if (kind == "linear") {
    sc.kind = ScheduleKind::linear;
  } else if (kind == "cosine") {
    sc.kind = ScheduleKind::cosine;
  } else {
    throw InputError(
        tr.meta_path(), 0, 0, "schedule_kind",
        fmt::format("expected constant, step, linear, cosine or table, got "
                    "'{}'",
                    kind));
  }
  sc.warmup = integer("schedule_warmup", 0);
  sc.total = integer("schedule_total", 0);
  sc.step_size = std::max<int64_t>(1, integer("schedule_step_size", 1));
  sc.gamma = number("schedule_gamma", sc.gamma);
  // Stepped every f optimizer steps (a table of scheduler.step() calls).
  sc.frequency = std::max<int64_t>(1, integer("schedule_frequency", 1));
  // The ratio the warmup was taken of the horizon with (a trainer whose
  // horizon is its own budget takes it of that: with_horizon).
  if (!tr.meta_value("schedule_warmup_ratio").empty()) {
    sc.warmup_ratio = number("schedule_warmup_ratio", 0);
    if (sc.warmup_ratio > 1)
      throw InputError(tr.meta_path(), 0, 0, "schedule_warmup_ratio",
                       fmt::format("expected a number in [0, 1], got '{}'",
                                   tr.meta_value("schedule_warmup_ratio")));
  }
  if ((sc.kind == ScheduleKind::linear || sc.kind == ScheduleKind::cosine) &&
      sc.total <= sc.warmup)
    throw InputError(
        tr.meta_path(), 0, 0, "schedule_total",
        fmt::format("expected an integer > schedule_warmup = {}", sc.warmup));
  s.clip.enabled = !tr.meta_value("clip").empty();
  s.clip.max_norm = number("clip", 1.0);
}

// What the contract tier did not judge in this run (printed with every
// verdict, never left out).
std::string not_judged(const Trace& tr, bool idle_rows) {
  std::vector<std::string> out = {
      "the model's numerics (each g_j is measured from your forward, not "
      "derived)",
      idle_rows ? "the optimizer's state from step to step (each step is "
                  "replayed from the state it had; the calls between steps "
                  "are checked to move nothing)"
                : "the optimizer's state from step to step (each step is "
                  "replayed from the state it had: "
                  "optimizer-state-every-micro-step is the oracle tier's)"};
  if (tr.meta_value("ema").empty())
    out.push_back("EMA: none declared (rec.ema(...))");
  if (!tr.meta_value("batchnorm").empty())
    out.push_back(fmt::format("BatchNorm running statistics ({} modules)",
                              tr.meta_value("batchnorm")));
  out.push_back(
      "a loss scaler's scale outside the windows it skipped (GradScaler)");
  std::string s = "not judged: ";
  for (size_t i = 0; i < out.size(); ++i) s += (i ? "; " : "") + out[i];
  return s;
}

}  // namespace accumcheck::contract_detail
