// Certification of an outside trainer's trace (verify/certify.hpp): the
// stages in order, each in a file of its own (verify/certify_stages.hpp).
#include "verify/certify.hpp"

#include <chrono>
#include <future>

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
  const Ctx ctx{s, data, init, plan, layout, L.steps, cfg.fp64, max_windows};

  CertifyReport r;
  r.scenario = s.name;
  r.run = L.run->name;
  r.engine = L.trace.meta_value("engine");
  r.precision = L.trace.meta_value("precision");
  r.accepted = semantics_name(s.trainer.accepted);
  r.trace_steps = int64_t(L.steps.size());

  // 2. The accepted semantics, with the rigorous bound, on a thread of its
  // own while every candidate is ranked cheaply here (3).
  const Behavior accepted_b = behavior_of(s.trainer.accepted);
  auto acc_future = std::async(std::launch::async,
                               [&] { return forced_run<TR>(ctx, accepted_b); });
  std::vector<Behavior> behaviors;
  rank_cheap(ctx, accepted_b, r, behaviors);
  Refiner refiner(ctx, cfg, r, behaviors, accepted_b);
  refiner.launch_if_accepted_looks_out();
  const Forced acc = acc_future.get();
  const Distance acc_d = distance_of(acc, L.steps.size());
  judge_accepted(acc, r);
  check_ranks(L, layout, r);

  // 4. The call pattern (when the trace has events).
  const PatternCheck pc =
      check_pattern(s, plan, *L.run, accepted_b, max_windows, r);

  // 5. Verdict; on FAIL, the rigorous ranking and the diagnosis.
  verdict_of(acc, acc_d, r);
  if (!r.pass) {
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
