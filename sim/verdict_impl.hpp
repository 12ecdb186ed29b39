// judge(): the [expect] verdicts of sim/experiment.hpp.
#pragma once

#include <cstdio>
#include <string>

namespace accumcheck {

namespace detail {
inline std::string fmt_g(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}
// Largest finite entry (NaN entries are windows a run did not reach).
inline double max_finite(const std::vector<double>& v, size_t* at) {
  double m = 0;
  *at = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == v[i] && v[i] > m) {
      m = v[i];
      *at = i;
    }
  return m;
}
}  // namespace detail

template <class Real>
Verdict judge(const Scenario& s, const Experiment<Real>& x,
              double match_tolerance) {
  using detail::fmt_g;
  Verdict v;
  switch (s.expect.kind) {
    case ExpectKind::matches_reference:
    case ExpectKind::matches_accepted: {
      const bool vs_accepted = s.expect.kind == ExpectKind::matches_accepted;
      const auto& d = vs_accepted ? x.trainer_to_accepted : x.trainer_distance;
      size_t at = 0;
      const double worst = detail::max_finite(d, &at);
      v.holds = worst <= match_tolerance && !d.empty();
      v.message =
          std::string(v.holds ? "holds" : "FAILS") + ": " + x.trainer.name +
          " matches the " +
          (vs_accepted ? "accepted semantics" : "large-batch reference") +
          " at every window (max relative distance " + fmt_g(worst) +
          " at window " + std::to_string(at) + ", tolerance " +
          fmt_g(match_tolerance) + ")";
      return v;
    }
    case ExpectKind::diverges_from_reference: {
      const auto& d = x.trainer_distance;
      size_t w = d.empty() ? 0 : d.size() - 1;
      if (s.expect.at_step >= 0) w = size_t(s.expect.at_step);
      double got = w < d.size() ? d[w] : kNaN;
      // A run that stopped before window w (step-budget-drops-micro-
      // batches) leaves the user its last window's parameters: those
      // against the reference's at w.
      const bool stopped = got != got && !x.trainer.windows.empty() &&
                           x.trainer.windows.size() <= w &&
                           w < x.reference.windows.size();
      if (stopped)
        got = relative_distance(x.trainer.windows.back().param,
                                x.reference.windows[w].param);
      v.holds = got > s.expect.min_distance;  // false for NaN
      v.message =
          std::string(v.holds ? "holds" : "FAILS") + ": " + x.trainer.name +
          " leaves the large-batch reference by more than " +
          fmt_g(s.expect.min_distance) + " at window " + std::to_string(w) +
          (stopped ? " (the run stopped after window " +
                         std::to_string(x.trainer.windows.size() - 1) +
                         ": its last parameters)"
                   : "") +
          " (relative distance " + fmt_g(got) + "; correct accumulation: " +
          fmt_g(w < x.correct_distance.size() ? x.correct_distance[w] : kNaN) +
          ")";
      return v;
    }
    case ExpectKind::never_steps: {
      v.holds = x.trainer.steps.empty();
      v.message = std::string(v.holds ? "holds" : "FAILS") + ": " +
                  x.trainer.name + " never calls optimizer.step() (" +
                  std::to_string(x.trainer.steps.size()) + " steps taken; " +
                  "the reference took " +
                  std::to_string(x.reference.steps.size()) + ")";
      return v;
    }
  }
  return v;
}

}  // namespace accumcheck
