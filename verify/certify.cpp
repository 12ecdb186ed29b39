// Certification of an outside trainer's trace (verify/certify.hpp): the
// stages in order, each in a file of its own (verify/certify_stages.hpp).
#include "verify/certify.hpp"

#include <algorithm>
#include <chrono>

#include "sim/limits.hpp"
#include "verify/certify_stages.hpp"
#include "verify/export.hpp"

namespace accumcheck {

using namespace certify_detail;

CertifyReport certify(const Scenario& s, const std::string& trace_dir,
                      const CertifyConfig& cfg) {
  require_exportable_model(s);
  require_scenario_within_limits(s);
  const auto t0 = std::chrono::steady_clock::now();
  // 1. Load and validate.
  const ParamLayout layout = layout_of(s.model);
  const LoadedTrace L = load(s, trace_dir, cfg, layout);
  const Dataset data = make_dataset(s);
  const std::vector<float> init = initial_parameters(s, layout);
  const Plan plan = make_plan(s);
  const int64_t max_windows = window_cap(s, L.steps.size());
  // The steps judged: cfg.steps within the trace's.
  const int64_t n = int64_t(L.steps.size());
  StepRange range = cfg.steps;
  range.end = range.end < 0 ? n : std::min(range.end, n);
  range.begin = std::min(range.begin, range.end);
  const Ctx ctx{s,           data,       init,
                plan,        layout,     L.steps,
                cfg.fp64,    range,      cfg.bound_arith,
                cfg.threads, max_windows};

  CertifyReport r;
  r.scenario = s.name;
  r.run = L.run->name;
  r.engine = L.trace.meta_value("engine");
  r.precision = L.trace.meta_value("precision");
  r.accepted = semantics_name(s.trainer.accepted);
  r.trace_steps = n;
  r.steps = range;

  // 2. The accepted semantics, with the rigorous bound, its steps judged
  // on every thread (teacher forcing makes them independent).
  const Behavior accepted_b = behavior_of(s.trainer.accepted);
  const Forced acc = judge_steps(ctx, accepted_b, true);
  const Distance acc_d = distance_of(acc, L.steps.size());
  r.first_out = acc_d.first_out;
  judge_accepted(acc, r);

  // 4. The call pattern (when the trace has events).
  const PatternCheck pc =
      check_pattern(s, plan, *L.run, accepted_b, max_windows, r);

  // 5. Verdict; on FAIL, every candidate ranked (3: cheaply, then the
  // closest few rigorously) and the diagnosis.  A PASS needs no ranking.
  verdict_of(acc, acc_d, r);
  if (!r.pass) {
    std::vector<Behavior> behaviors;
    rank_cheap(ctx, accepted_b, r, behaviors);
    Refiner refiner(ctx, cfg, r, behaviors, accepted_b);
    refiner.launch();
    mark_pattern_matches(s, plan, pc, behaviors, r);
    refiner.finish(acc);
    diagnose(acc, acc_d, r);
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

}  // namespace accumcheck
