// certify, stage 1: load and validate the trace (verify/certify/stages.hpp).
// Anything malformed or inconsistent is an InputError naming file:line.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "sim/errors.hpp"
#include "verify/certify/stages.hpp"
#include "verify/trace/values_bin.hpp"

namespace accumcheck::certify_detail {

namespace {

// The run's events against its values: every events row's step is the
// number of optimizer_step rows before it (so optimizer_step rows count
// 0, 1, 2, ... with no duplicate and no gap, and rows after the last step
// carry the step count), and there is one optimizer_step row per step of
// values.csv.  A trace that contradicts itself is bad input, never a
// trainer behaviour.
void check_events(const Trace& t, const TraceRun& run, int64_t value_steps) {
  const std::string file = t.events_path();
  // Counted per rank (a multi-rank trace: every rank calls optimizer.step
  // once per step; the collective all_reduce, rank -1, counts as rank 0).
  std::map<int64_t, std::pair<int64_t, int64_t>> per_rank;  // steps, line
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    auto& [steps, last_step_line] = per_rank[std::max<int64_t>(e.rank, 0)];
    const bool is_step = e.kind == EventKind::optimizer_step;
    if (e.step != steps) {
      std::string why;
      if (is_step && e.step < steps)
        why = fmt::format(
            "optimizer_step {} appears twice (first at line {}); each "
            "optimizer step is one row",
            e.step, last_step_line);
      else if (is_step)
        why = fmt::format(
            "optimizer_step {} follows optimizer_step {}; steps count 0, 1, "
            "2, ... without gaps",
            e.step, steps - 1);
      else
        why = fmt::format(
            "step {}, but {} optimizer_step rows precede this row; a row's "
            "step is the number of optimizer steps before it",
            e.step, steps);
      throw InputError(file, te.line, 0, "step",
                       fmt::format("run '{}': {}", run.name, why));
    }
    if (is_step) {
      ++steps;
      last_step_line = te.line;
    }
    if (steps > value_steps)
      throw InputError(
          file, te.line, 0, "step",
          fmt::format("run '{}': optimizer_step {} has no values: values.csv "
                      "holds {} of this run",
                      run.name, e.step,
                      value_steps == 0
                          ? std::string("no steps")
                          : fmt::format("steps 0..{}", value_steps - 1)));
  }
  const int64_t steps = per_rank[0].first;
  if (steps != value_steps)
    throw InputError(
        file, run.events.back().line, 0, "step",
        fmt::format("run '{}': {} optimizer_step rows, but values.csv holds "
                    "{} steps of this run; events and values must describe "
                    "the same steps",
                    run.name, steps, value_steps));
}

// A run without events.csv rows, refused at the file's last line (the
// header's, or the last row of the other runs named).
[[noreturn]] void refuse_no_events(const Trace& t, const TraceRun& run) {
  int64_t last = 1;  // the header
  std::string others;
  for (const TraceRun& r : t.runs) {
    if (r.events.empty()) continue;
    last = std::max(last, r.events.back().line);
    others += fmt::format("{}'{}'", others.empty() ? "" : ", ", r.name);
  }
  throw InputError(
      t.events_path(), last, 0, "run",
      fmt::format("no rows for run '{}' ({}); expected its events "
                  "(forward_backward, optimizer_step, ...: a recorder always "
                  "writes them, so a trace without them is broken or "
                  "altered), or --values-only to judge its values alone "
                  "without the call pattern",
                  run.name,
                  others.empty()
                      ? "the file holds no rows"
                      : "the file holds rows of run " + others + " only"));
}

// The checks of the values.csv loop in load(), for values.bin: every
// value a finite number, float32 unless --precision fp64.
void check_numbers(const Trace& t, const TraceRun& run,
                   const std::vector<TraceStep>& steps,
                   const CertifyConfig& cfg, const ParamLayout& layout) {
  for (const TraceStep& st : steps)
    for (const auto* vals : {&st.grad, &st.param})
      for (size_t i = 0; i < vals->size(); ++i) {
        const double x = (*vals)[i];
        const bool is_float = cfg.fp64 || double(float(x)) == x;
        if (std::isfinite(x) && is_float) continue;
        const ValueKind kind =
            vals == &st.grad ? ValueKind::grad : ValueKind::param;
        const ValueWhere w =
            locate_value(t, run, st.step, kind, int64_t(i), layout);
        const TensorView& tv = layout.tensor_of(int64_t(i));
        const std::string what =
            fmt::format("step {} {} {}[{}]: ", st.step, value_kind_name(kind),
                        tv.name, int64_t(i) - tv.offset);
        if (!std::isfinite(x))
          throw InputError(
              w.file, w.line, 0, "value",
              what + fmt::format("expected a finite number, got {}", x));
        throw InputError(w.file, w.line, 0, "value",
                         what + fmt::format("{} is not a float32 value; a "
                                            "float64 trainer is certified "
                                            "with --precision fp64",
                                            x));
      }
}

}  // namespace

LoadedTrace load(const Scenario& s, const std::string& dir,
                 const CertifyConfig& cfg, const ParamLayout& layout) {
  LoadedTrace L;
  L.trace = read_trace(dir);
  const Trace& t = L.trace;
  const std::string digest = t.meta_value("scenario_digest");
  if (digest != s.digest) {
    int64_t line = 0;
    for (size_t i = 0; i < t.meta.size(); ++i)
      if (t.meta[i].first == "scenario_digest") line = int64_t(i) + 2;
    throw InputError(t.meta_path(), line, 0, "scenario_digest",
                     fmt::format("the trace was made for scenario digest "
                                 "'{}', but {} has digest {} (re-export the "
                                 "bundle and retrain, or certify against the "
                                 "scenario file the bundle holds)",
                                 digest, s.path, s.digest));
  }
  if (t.runs.empty())
    throw InputError(t.values_path(), 0, 0, "run",
                     "the trace holds no run (no events or values rows)");
  if (!cfg.run.empty()) {
    L.run = t.run(cfg.run);
    if (!L.run) {
      std::string names;
      for (const TraceRun& r : t.runs) {
        if (!names.empty()) names.append(", ");
        names.append(r.name);
      }
      throw InputError(
          t.values_path(), 0, 0, "run",
          fmt::format("no run '{}' in the trace; it holds {}", cfg.run, names));
    }
  } else {
    L.run = &t.runs.back();
  }
  const TraceRun& run = *L.run;
  for (const TraceValue& v : run.values) {
    if (std::isnan(v.value))
      throw InputError(t.values_path(), v.line, 0, "value",
                       "expected a number, got an empty field (NaN)");
    if (!std::isfinite(v.value))
      throw InputError(
          t.values_path(), v.line, 0, "value",
          fmt::format("expected a finite number, got {}", v.value));
    if (!cfg.fp64 && double(float(v.value)) != v.value)
      throw InputError(
          t.values_path(), v.line, 0, "value",
          fmt::format("{} is not a float32 value; a float64 trainer is "
                      "certified with --precision fp64",
                      v.value));
  }
  L.steps = gather_steps(t, run, layout);
  if (t.binary) check_numbers(t, run, L.steps, cfg, layout);
  for (size_t i = 0; i < L.steps.size(); ++i) {
    const TraceStep& st = L.steps[i];
    auto line_of = [&](int64_t step) {
      for (const TraceValue& v : run.values)
        if (v.step == step) return v.line;
      for (const TraceBlock& b : run.blocks)
        if (b.step == step && b.rank == 0) return b.at;
      return int64_t(0);
    };
    auto where = [&](int64_t step) {
      const int64_t at = line_of(step);
      return t.binary ? ValueWhere{trace_detail::byte_at(t.binary->path, at), 0}
                      : ValueWhere{t.values_path(), at};
    };
    if (st.step != int64_t(i))
      throw InputError(
          where(st.step).file, where(st.step).line, 0, "step",
          fmt::format("run '{}': step {} follows step {}; "
                      "steps must be 0, 1, 2, ... without gaps",
                      run.name, st.step, i == 0 ? -1 : L.steps[i - 1].step));
    if (st.grad.empty() || st.param.empty())
      throw InputError(
          where(st.step).file, where(st.step).line, 0,
          st.grad.empty() ? "grad" : "param",
          fmt::format("run '{}' step {} has no {} values; each "
                      "step needs its gradient and parameters",
                      run.name, st.step, st.grad.empty() ? "grad" : "param"));
  }
  // Events: a recorder always writes them, so a run without any is a
  // broken or altered trace, judged on its values alone only when asked
  // (the verdict then says the call pattern was not checked).
  if (!run.events.empty())
    check_events(t, run, int64_t(L.steps.size()));
  else if (!cfg.values_only)
    refuse_no_events(t, run);
  return L;
}

void check_ranks(const LoadedTrace& L, const ParamLayout& layout,
                 CertifyReport& r) {
  const std::vector<int64_t> ranks = value_ranks(*L.run);
  if (ranks.size() < 2) return;
  CertifyCheck c;
  c.name = "ranks agree";
  c.message = fmt::format(
      "ranks {}..{} hold rank 0's parameters after every "
      "step",
      ranks[1], ranks.back());
  for (size_t q = 1; q < ranks.size() && c.ok; ++q) {
    const std::vector<TraceStep> other =
        gather_steps(L.trace, *L.run, layout, ranks[q]);
    for (const TraceStep& st : other) {
      if (st.param.empty() || st.step >= int64_t(L.steps.size())) continue;
      const TraceValues& p0 = L.steps[size_t(st.step)].param;
      for (size_t i = 0; i < p0.size(); ++i) {
        if (st.param[i] == p0[i]) continue;
        c.ok = false;
        c.message = fmt::format(
            "rank {}'s parameters differ from rank 0's after step {}: {}[{}] "
            "{} vs {}; DDP ranks that all-reduce hold identical parameters "
            "(ranks stepping on local gradients: ddp-no-sync-everywhere)",
            ranks[q], st.step, layout.tensor_of(int64_t(i)).name,
            int64_t(i) - layout.tensor_of(int64_t(i)).offset, st.param[i],
            p0[i]);
        break;
      }
      if (!c.ok) break;
    }
  }
  r.checks.push_back(c);
}

TraceScaling trace_scaling(const Scenario& s, const LoadedTrace& L) {
  if (s.precision.loss_scaling) return {};
  const StateSection st = read_state(L.trace.dir, L.run->name);
  std::vector<int64_t> exps, skipped;
  bool scaled = false;
  for (const StateValue& v : st.rows) {
    if (v.kind == "skipped") {
      skipped.push_back(v.index);
      continue;
    }
    if (v.kind != "loss_scale") continue;
    int e = 0;
    const double m = std::frexp(v.value, &e);  // v = m 2^e, m in [0.5, 1)
    if (v.index != int64_t(exps.size()) || m != 0.5 || e - 1 > 62 ||
        e - 1 < -62)
      return {};
    exps.push_back(e - 1);
    scaled = scaled || e - 1 != 0;
  }
  if (!scaled) return {};
  int64_t backward = 0;
  for (const TraceEvent& te : L.run->events)
    if (te.event.kind == EventKind::forward_backward && te.event.rank <= 0)
      ++backward;
  if (backward != int64_t(exps.size())) return {};
  std::sort(skipped.begin(), skipped.end());
  return {std::move(exps), std::move(skipped)};
}

ClipNorms clip_norms_of(const TraceRun& run, size_t steps) {
  ClipNorms n(steps);
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    if (e.kind != EventKind::clip || e.rank < 0 || e.step < 0 ||
        size_t(e.step) >= steps)
      continue;
    std::vector<std::vector<double>>& ranks = n[size_t(e.step)];
    if (ranks.size() <= size_t(e.rank)) ranks.resize(size_t(e.rank) + 1);
    ranks[size_t(e.rank)].push_back(e.grad_norm);
  }
  return n;
}

}  // namespace accumcheck::certify_detail
