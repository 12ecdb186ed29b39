// One experiment: the scenario's trainer beside the large-batch reference
// and correct accumulation, on the same engine, data and initial state.
//
//   reference  K = 1, each window one micro-batch holding all its samples,
//              the `correct` semantics, the scenario's lr
//   correct    the scenario's K, the `correct` semantics, the scenario's lr
//   accepted   (only when the scenario accepts other semantics)
//   trainer    the scenario's K, its pitfalls, its lr scaling
// Runs are compared at window boundaries (a run that steps more often is
// compared where windows end), by the relative parameter distance
// |theta - theta_ref| / |theta_ref|, computed in the engine's arithmetic.
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/run.hpp"
#include "sim/scenario.hpp"
#include "sim/trainer.hpp"

namespace accumcheck {

template <class Real>
double relative_distance(const std::vector<Real>& a,
                         const std::vector<Real>& ref) {
  Real diff2(0), ref2(0);
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    const Real d = a[i] - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
  }
  using std::sqrt;
  if (ref2 == Real(0)) return static_cast<double>(sqrt(diff2));
  return static_cast<double>(sqrt(diff2 / ref2));
}

template <class Real>
struct Experiment {
  Run<Real> reference, correct, trainer;
  std::optional<Run<Real>> accepted;
  // Per window: relative distance of each run's parameters to the
  // reference's (NaN where a run has no record for that window).
  std::vector<double> correct_distance, trainer_distance, accepted_distance;
  // trainer vs accepted (the accepted run, or correct when none).
  std::vector<double> trainer_to_accepted;
};

template <class Real>
std::vector<double> window_distances(const Run<Real>& run,
                                     const Run<Real>& ref) {
  std::vector<double> d(ref.windows.size(), kNaN);
  for (size_t w = 0; w < ref.windows.size() && w < run.windows.size(); ++w)
    d[w] = relative_distance(run.windows[w].param, ref.windows[w].param);
  return d;
}

// `make_engine()` returns a std::unique_ptr to a fresh engine at the
// scenario's initial state; it is called once per run.
template <class MakeEngine>
auto run_experiment(const Scenario& s, MakeEngine make_engine,
                    TrainerOptions options = {}) {
  using E = typename decltype(make_engine())::element_type;
  using Real = typename E::Real;
  options.max_steps = s.batching.max_steps;
  // The reference steps once per window, so it ends after max_steps
  // windows; every run ends there too (a run that stops stepping as well).
  options.max_windows = s.batching.max_steps;
  const Plan plan = make_plan(s);
  const Plan big = as_large_batch(plan);
  auto run_one = [&](const Plan& p, const std::vector<Pitfall>& pitfalls,
                     double lr, std::string name) {
    auto engine = make_engine();
    Trainer<E> t(*engine, s, behavior_of(pitfalls), lr, options);
    return t.run(p, std::move(name));
  };
  Experiment<Real> x;
  x.reference = run_one(big, {}, s.optimizer.lr, "reference");
  x.correct = run_one(plan, {}, s.optimizer.lr, "correct");
  // The trainer's run is named by its pitfall ids; a trainer without
  // pitfalls is "trainer:correct" (the name "correct" is the column's).
  x.trainer =
      run_one(plan, s.trainer.pitfalls, base_lr(s),
              s.trainer.pitfalls.empty() ? std::string("trainer:correct")
                                         : semantics_name(s.trainer.pitfalls));
  if (s.trainer.lr_scaling != LrScaling::none)
    x.trainer.name +=
        s.trainer.lr_scaling == LrScaling::linear ? "@lr*K" : "@lr*sqrt(K)";
  if (!s.trainer.accepted.empty())
    x.accepted = run_one(plan, s.trainer.accepted, s.optimizer.lr,
                         "accepted:" + semantics_name(s.trainer.accepted));
  x.correct_distance = window_distances(x.correct, x.reference);
  x.trainer_distance = window_distances(x.trainer, x.reference);
  if (x.accepted) {
    x.accepted_distance = window_distances(*x.accepted, x.reference);
    x.trainer_to_accepted = window_distances(x.trainer, *x.accepted);
  } else {
    x.trainer_to_accepted = window_distances(x.trainer, x.correct);
  }
  return x;
}

struct Verdict {
  bool holds = false;
  std::string message;  // one line: what was asserted and what was found
};

// Judges the scenario's [expect] on an experiment.  `match_tolerance` is
// the relative distance under which two runs count as equal on this
// engine (the oracle: 10^-(digits-10)).
template <class Real>
Verdict judge(const Scenario& s, const Experiment<Real>& x,
              double match_tolerance);

}  // namespace accumcheck

#include "sim/verdict_impl.hpp"
