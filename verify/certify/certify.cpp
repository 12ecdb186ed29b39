// Certification of an outside trainer's trace (verify/certify/certify.hpp): the
// stages in order, each in a file of its own (verify/certify/stages.hpp).
#include "verify/certify/certify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "sim/errors.hpp"
#include "sim/limits.hpp"
#include "verify/certify/drawn.hpp"
#include "verify/certify/evidence.hpp"
#include "verify/certify/lr_channel.hpp"
#include "verify/certify/stages.hpp"
#include "verify/certify/state_check.hpp"
#include "verify/export/export.hpp"
#include "verify/trace/unseen.hpp"

namespace accumcheck {

using namespace certify_detail;

CertifyReport certify(const Scenario& s, const std::string& trace_dir,
                      const CertifyConfig& cfg) {
  require_exportable_model(s);
  require_scenario_within_limits(s, cfg.bound_arith == BoundArith::dd
                                        ? "oracle_madds_dd"
                                        : "oracle_madds");
  const auto t0 = std::chrono::steady_clock::now();
  // 1. Load and validate.
  const ParamLayout layout = layout_of(s.model);
  const LoadedTrace L = load(s, trace_dir, cfg, layout);
  const Dataset data = make_dataset(s);
  const std::vector<float> init = initial_parameters(s, layout);
  // The micro-batches the trainer drew (its own order, when the trace's
  // sample ids say so), cut into the scenario's windows.
  const DrawnPlan drawn = drawn_plan(s, make_plan(s), *L.run);
  const Plan& plan = drawn.plan;
  const int64_t max_windows = window_cap(s, L.steps.size());
  // The steps judged: cfg.steps within the trace's.
  const int64_t n = int64_t(L.steps.size());
  StepRange range = cfg.steps;
  range.end = range.end < 0 ? n : std::min(range.end, n);
  range.begin = std::min(range.begin, range.end);
  if (!cfg.autocast.empty() && cfg.autocast != "bf16" && cfg.autocast != "fp16")
    throw InputError("", 0, 0, "--precision",
                     "expected fp32, fp64, bf16 or fp16, got " + cfg.autocast);
  const double grad_scale =
      cfg.autocast.empty()
          ? 1.0
          : error_model::tolerance(cfg.autocast + "_bound_scale");
  {  // A trace recorded under autocast is judged at its precision.
    const std::string ac = L.trace.meta_value("autocast");
    const std::string want = ac == "bfloat16"  ? "bf16"
                             : ac == "float16" ? "fp16"
                                               : "";
    if (!ac.empty() && want != cfg.autocast)
      throw InputError(
          L.trace.meta_path(), 0, 0, "autocast",
          fmt::format("the trainer's forwards ran under torch.autocast({}); "
                      "certify it with --precision {} (the bound of its "
                      "rounding), not {}",
                      ac, want.empty() ? ac : want,
                      cfg.autocast.empty() ? (cfg.fp64 ? "fp64" : "fp32")
                                           : cfg.autocast));
  }
  const ClipNorms clip_norms = clip_norms_of(*L.run, L.steps.size());
  const TraceScaling scaling = trace_scaling(s, L);
  // The training state beyond gradients (state.csv, values.bin's state
  // blocks), when recorded: Adam's moments are judged with the steps.
  StateSection state = read_state(L.trace, *L.run, layout);
  const RecordedMoments moments = take_moments(state, layout);
  Ctx ctx{s,           data,         init,
          plan,        layout,       L.steps,
          cfg.fp64,    range,        cfg.bound_arith,
          cfg.threads, max_windows,  grad_scale,
          clip_norms,  scaling.exps, scaling.skipped,
          &moments};
  StepProgress progress;
  progress.cfg = &cfg;
  progress.start("judging", range.end - range.begin);
  ctx.progress = &progress;
  // The ranking's runs judge gradients and parameters only.
  Ctx rank_ctx = ctx;
  rank_ctx.moments = nullptr;

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
  check_ranks(L, layout, r);
  if (drawn.known)
    r.checks.push_back({.name = "order and coverage",
                        .ok = drawn.ok,
                        .message = drawn.message});
  else
    r.notes.push_back(drawn.message);
  const LrChannel lr = check_lr(s, plan, *L.run, accepted_b);
  if (lr.checked)
    r.checks.push_back(
        {.name = "lr",
         .ok = lr.ok,
         .message = lr.ok ? lr.message : lr.message + "; " + lr.evidence});
  else
    r.notes.push_back(lr.message);
  if (grad_scale != 1) {  // the autocast bound's use, said
    r.autocast = cfg.autocast;
    r.grad_scale = grad_scale;
    for (const StepEval& ev : acc.eval)
      if (ev.seen) r.grad_worst = std::max(r.grad_worst, ev.grad.max_ratio);
    r.notes.push_back(certify_precision_note(r));
  }
  // The rest of the training state: whole, in every part.
  std::vector<std::string> state_findings;
  check_state(ctx, L, state, grad_scale, r, state_findings);

  // 4. The call pattern (when the trace has events).  A difference that
  // changes no value (the accepted semantics within the bound at every
  // step, the step counts equal) is a note, not a failure -- unless it
  // changes the number of all-reduces: then it passes only as a
  // performance-only pitfall's pattern (ddp-sync-every-micro-step: the
  // same values at K times the communication), with a performance finding
  // on the check.
  const PatternCheck pc =
      check_pattern(s, plan, *L.run, accepted_b, max_windows, r);
  if (!r.pattern_ok && acc_d.first_out < 0 && acc.steps == r.trace_steps) {
    const std::string perf = pc.collectives_differ
                                 ? performance_finding(s, plan, pc, r.accepted)
                                 : std::string();
    for (CertifyCheck& c : r.checks)
      if (c.name == "call pattern" && !c.ok &&
          (!pc.collectives_differ || !perf.empty())) {
        c.ok = true;
        c.performance = perf;
        if (perf.empty())
          r.notes.push_back(c.message + " (changes no value: a note)");
      }
  }
  {
    const std::string notes = L.trace.meta_value("notes");
    size_t at = 0;
    while (!notes.empty() && at != std::string::npos) {
      const size_t bar = notes.find(" | ", at);
      r.notes.push_back("recorder: " + notes.substr(at, bar == std::string::npos
                                                            ? bar
                                                            : bar - at));
      at = bar == std::string::npos ? bar : bar + 3;
    }
  }

  // 5. Verdict; on FAIL, every candidate ranked (3: cheaply, then the
  // closest few rigorously) and the diagnosis.  A PASS needs no ranking.
  verdict_of(acc, acc_d, r);
  refuse_unseen(L.trace, r.pass, r.verdict);
  // Gradients and parameters within the bound, the step counts equal, the
  // state wrong: no candidate to rank, the state findings are the diagnosis.
  bool state_only = !r.pass && acc_d.first_out < 0 && acc.steps == n;
  for (const CertifyCheck& c : r.checks)
    if (!c.ok && !c.separate && !is_state_check(c.name) && !is_moment_check(c))
      state_only = false;
  if (state_only) {
    r.diagnosis = "the gradients and parameters are " + r.accepted +
                  "'s; the training state is not";
    for (const std::string& f : state_findings)
      r.diagnosis.append("\nstate finding: ").append(f);
  } else if (!r.pass) {
    std::vector<Behavior> behaviors;
    rank_cheap(rank_ctx, accepted_b, r, behaviors);
    // The pattern first: the candidates whose call pattern is the trace's
    // are judged rigorously whatever their cheap distance (launch()).
    mark_pattern_matches(s, plan, pc, behaviors, r);
    Refiner refiner(rank_ctx, cfg, r, behaviors, accepted_b);
    refiner.launch();
    refiner.finish(acc);
    if (r.ranking.front().distance > 1) {
      r.unexplained = true;
      const EvidenceInput in{s,
                             data,
                             init,
                             plan,
                             layout,
                             L.steps,
                             *L.run,
                             accepted_b,
                             r.accepted,
                             acc_d.first_out,
                             acc_d.first_out_what,
                             r.trace_steps,
                             acc.steps,
                             lr};
      r.evidence = unexplained_evidence(in);
    }
    diagnose(acc, acc_d, r);
    for (const std::string& f : state_findings)
      r.diagnosis.append("\nstate finding: ").append(f);
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

}  // namespace accumcheck
