// certify, stage 4: the call pattern of the trace's events against the
// accepted semantics and every candidate (verify/certify/stages.hpp).
//
// zero_grads before the first backward or after the last, and repeated
// zero_grads with nothing between them, are no-ops and not counted (beyond
// the first of a repeat).
#include <fmt/format.h>

#include <algorithm>

#include "sim/errors.hpp"
#include "sim/trainer.hpp"
#include "verify/certify/stages.hpp"
#include "verify/export/null_engine.hpp"

namespace accumcheck::certify_detail {

namespace {

size_t kind_slot(EventKind k) {
  switch (k) {
    case EventKind::forward_backward:
      return 0;
    case EventKind::zero_grad:
      return 1;
    case EventKind::clip:
      return 2;
    case EventKind::optimizer_step:
      return 3;
    case EventKind::scheduler_step:
      return 4;
    case EventKind::all_reduce:
      return 5;
    case EventKind::unscale:
    case EventKind::scaler_update:
    case EventKind::ema_update:
      break;  // not counted (pattern_of skips them)
  }
  return 0;
}
constexpr std::string_view kSlotNames[] = {"backward",       "zero_grad",
                                           "clip",           "optimizer.step",
                                           "scheduler.step", "all_reduce"};

// Rank `rank`'s calls and the collectives (rank -1).
Pattern pattern_of(const std::vector<Event>& all_events, bool ignore_scheduler,
                   int64_t rank) {
  std::vector<Event> events;
  for (const Event& e : all_events)
    if (e.rank == rank || e.rank < 0) events.push_back(e);
  Pattern p;
  bool seen_fb = false, last_zero = false;
  // zero_grads after the last backward change nothing either.
  size_t last_fb = 0;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].kind == EventKind::forward_backward) last_fb = i;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind == EventKind::zero_grad && i > last_fb) continue;
    if (e.kind == EventKind::zero_grad) {
      if (!seen_fb || last_zero) continue;
      last_zero = true;
    } else {
      last_zero = false;
    }
    if (e.kind == EventKind::forward_backward) seen_fb = true;
    if (ignore_scheduler && e.kind == EventKind::scheduler_step) continue;
    // The GradScaler's and the EMA's calls are state, judged by values,
    // not by the call pattern (a recorder may not see them).
    if (e.kind == EventKind::unscale || e.kind == EventKind::scaler_update ||
        e.kind == EventKind::ema_update)
      continue;
    if (p.size() <= size_t(e.step)) p.resize(size_t(e.step) + 1, Counts{});
    ++p[size_t(e.step)][kind_slot(e.kind)];
  }
  return p;
}

std::string counts_text(const Pattern& p, size_t step) {
  const Counts c = step < p.size() ? p[step] : Counts{};
  std::string s;
  for (size_t k = 0; k < c.size(); ++k) {
    if (k == 5 && c[k] == 0) continue;  // all_reduce: ranks only
    if (!s.empty()) s.append(", ");
    s.append(fmt::format("{} {}", c[k], kSlotNames[k]));
  }
  return s;
}

// Every rank's pattern, ranks 0..R-1 (R: the scenario's ranks, or more
// when the trace's events name a higher rank).
std::vector<Pattern> patterns_of(const std::vector<Event>& events,
                                 bool ignore_scheduler, int64_t ranks) {
  for (const Event& e : events) ranks = std::max(ranks, e.rank + 1);
  std::vector<Pattern> out;
  for (int64_t r = 0; r < ranks; ++r)
    out.push_back(pattern_of(events, ignore_scheduler, r));
  return out;
}

std::vector<Pattern> semantics_pattern(const Scenario& s, const Plan& plan,
                                       const Behavior& b, bool ignore_scheduler,
                                       int64_t max_windows) {
  NullEngine null;
  TrainerOptions opt;
  opt.record_values = false;
  opt.max_steps = s.batching.max_steps;
  opt.max_windows = max_windows;
  Trainer<NullEngine> t(null, s, b, s.optimizer.lr, opt);
  return patterns_of(t.run(plan, "pattern").events, ignore_scheduler,
                     s.batching.ranks);
}

// The first (rank, optimizer step) where two patterns differ.
std::pair<size_t, size_t> first_difference(const std::vector<Pattern>& a,
                                           const std::vector<Pattern>& b) {
  for (size_t r = 0; r < std::max(a.size(), b.size()); ++r) {
    const Pattern none;
    const Pattern& x = r < a.size() ? a[r] : none;
    const Pattern& y = r < b.size() ? b[r] : none;
    if (x == y) continue;
    size_t at = 0;
    while (at < x.size() && at < y.size() && x[at] == y[at]) ++at;
    return {r, at};
  }
  return {0, 0};
}

}  // namespace

PatternCheck check_pattern(const Scenario& s, const Plan& plan,
                           const TraceRun& run, const Behavior& accepted_b,
                           int64_t max_windows, CertifyReport& r) {
  PatternCheck pc;
  pc.max_windows = max_windows;
  r.pattern_checked = !run.events.empty();
  if (!r.pattern_checked) {
    // The check cannot run (a run without events, judged on its values
    // alone: CertifyConfig::values_only): said in the verdict, the text
    // and the JUnit report (a skipped testcase), never hidden behind a
    // PASS.
    r.pattern_message = fmt::format(
        "call pattern NOT checked: events.csv has no rows for run '{}'",
        run.name);
    CertifyCheck c;
    c.name = "call pattern";
    c.skipped = true;
    c.message = r.pattern_message;
    r.checks.push_back(c);
    return pc;
  }
  std::vector<Event> evs;
  bool any_sched = false;
  for (const TraceEvent& e : run.events) {
    evs.push_back(e.event);
    any_sched = any_sched || e.event.kind == EventKind::scheduler_step;
  }
  // A constant schedule needs no scheduler object at all.
  pc.ignore_sched = !any_sched && s.schedule.kind == ScheduleKind::constant;
  pc.trace = patterns_of(evs, pc.ignore_sched, s.batching.ranks);
  const std::vector<Pattern> want =
      semantics_pattern(s, plan, accepted_b, pc.ignore_sched, max_windows);
  r.pattern_ok = pc.trace == want;
  // The collectives (rank -1) are in every rank's pattern: rank 0's says.
  const Pattern& w0 = want.front();
  const Pattern& t0 = pc.trace.front();
  for (size_t i = 0; i < std::max(w0.size(), t0.size()); ++i)
    if ((i < w0.size() ? w0[i][5] : 0) != (i < t0.size() ? t0[i][5] : 0))
      pc.collectives_differ = true;
  const std::string on_ranks =
      want.size() > 1 ? fmt::format(" on each of the {} ranks", want.size())
                      : "";
  if (r.pattern_ok) {
    r.pattern_message = fmt::format(
        "call pattern as {}{} (optimizer step 1: {})", r.accepted, on_ranks,
        counts_text(w0, std::min<size_t>(1, w0.size() - 1)));
  } else {
    const auto [rank, at] = first_difference(pc.trace, want);
    const Pattern none;
    const Pattern& tr = rank < pc.trace.size() ? pc.trace[rank] : none;
    const Pattern& wr = rank < want.size() ? want[rank] : none;
    r.pattern_message = fmt::format(
        "call pattern differs from {} at optimizer step {}{}: the trace has "
        "{}; {} has {}",
        r.accepted, at,
        want.size() > 1 || pc.trace.size() > 1
            ? fmt::format(" on rank {}", rank)
            : "",
        counts_text(tr, at), r.accepted, counts_text(wr, at));
  }
  CertifyCheck c;
  c.name = "call pattern";
  c.ok = r.pattern_ok;
  c.message = r.pattern_message;
  r.checks.push_back(c);
  return pc;
}

std::string performance_finding(const Scenario& s, const Plan& plan,
                                const PatternCheck& pc,
                                const std::string& accepted) {
  const auto collectives = [](const Pattern& p) {
    int64_t n = 0;
    for (const Counts& c : p) n += c[5];
    return n;
  };
  const std::vector<Pitfall>& base = s.trainer.accepted;
  const std::vector<Pattern> want = semantics_pattern(
      s, plan, behavior_of(base), pc.ignore_sched, pc.max_windows);
  for (const Pitfall p : kAllPitfalls) {
    if (!pitfall_performance_only(p) ||
        std::find(base.begin(), base.end(), p) != base.end())
      continue;
    std::vector<Pitfall> with = base;
    with.push_back(p);
    if (semantics_pattern(s, plan, behavior_of(with), pc.ignore_sched,
                          pc.max_windows) != pc.trace)
      continue;
    return fmt::format(
        "performance: {} ({}): {} gradient all-reduces where {} needs {}; "
        "the values are {}'s",
        pitfall_id(p), pitfall_story(p), collectives(pc.trace.front()),
        accepted, collectives(want.front()), accepted);
  }
  return "";
}

void mark_pattern_matches(const Scenario& s, const Plan& plan,
                          const PatternCheck& pc,
                          const std::vector<Behavior>& behaviors,
                          CertifyReport& r) {
  if (!r.pattern_checked) return;
  for (size_t i = 0; i < r.ranking.size(); ++i) try {
      r.ranking[i].pattern_matches =
          semantics_pattern(s, plan, behaviors[i], pc.ignore_sched,
                            pc.max_windows) == pc.trace;
    } catch (const ScaleRangeError&) {  // a candidate that cannot be run
      r.ranking[i].pattern_matches = false;
    }
}

}  // namespace accumcheck::certify_detail
