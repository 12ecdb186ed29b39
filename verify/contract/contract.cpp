// The contract tier's judging (verify/contract/contract.hpp): what meta.csv
// says, the checks in order (the fits: fits.cpp; the clip, idle calls, loss
// scaler, EMA, precision: their files), every candidate judged against the
// measured weights (weights.cpp), its lr, all-reduces and clips, the
// combination search, and the verdict (diagnose.cpp); one file a part, as
// verify/contract/detail.hpp lists them.
#include "verify/contract/contract.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "oracle/error_model.hpp"
#include "sim/errors.hpp"
#include "sim/limits.hpp"
#include "verify/certify/lr_channel.hpp"
#include "verify/contract/detail.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

CertifyReport certify_contract(const std::string& trace_dir) {
  using namespace contract_detail;
  const auto t0 = std::chrono::steady_clock::now();
  const Trace tr = read_trace(trace_dir);
  if (tr.meta_value("tier") != "contract")
    throw InputError(
        tr.meta_path(), 0, 0, "tier",
        "not a contract-tier trace (meta.csv has no 'tier,contract'); "
        "judge oracle-tier traces with `certify SCENARIO --trace DIR`");
  const ContractSection c = read_contract(trace_dir);
  int64_t K = 0;
  try {
    K = std::stoll(tr.meta_value("accumulation"));
  } catch (...) {
    K = 0;
  }
  if (K < 1)
    throw InputError(tr.meta_path(), 0, 0, "accumulation",
                     "expected an integer >= 1");
  const bool tokens = tr.meta_value("items") == "tokens";
  // How many terms the recorder's clip norm and the clip's own differ by
  // the rounding of (clip_norm_terms: the tensors whose float32 norms both
  // combine, each the same computation on the same tensor); else every
  // element (a norm taken over the elements in float64).
  int64_t clip_terms = 0;
  if (const std::string v = tr.meta_value("clip_norm_terms"); !v.empty()) {
    try {
      size_t used = 0;
      clip_terms = std::stoll(v, &used);
      if (used != v.size()) clip_terms = 0;
    } catch (...) {
      clip_terms = 0;
    }
    if (clip_terms < 1)
      throw InputError(tr.meta_path(), 0, 0, "clip_norm_terms",
                       "expected an integer >= 1 (the tensors a clip's norm "
                       "combines), got '" +
                           v + "'");
  }
  // The precision the trainer held its lr in (a float32 lr: optax, Keras).
  const std::string lr_prec = tr.meta_value("lr_precision");
  if (!lr_prec.empty() && lr_prec != "float32" && lr_prec != "float64")
    throw InputError(tr.meta_path(), 0, 0, "lr_precision",
                     "expected float32 or float64 (the precision the trainer "
                     "holds its lr in), got '" +
                         lr_prec + "'");
  const bool lr32 = lr_prec == "float32";
  Scenario s;
  s.name = "contract";
  declared(tr, s);
  int64_t n = 0;
  try {
    n = std::stoll(tr.meta_value("parameters"));
  } catch (...) {
    n = 0;
  }
  CertifyReport r;
  r.scenario = "contract";
  r.run = tr.runs.empty() ? "trainer" : tr.runs.front().name;
  r.engine = tr.meta_value("engine");
  r.precision = tr.meta_value("precision");
  const std::vector<Pitfall> accept = accepted_semantics(tr);
  r.accepted = semantics_name(accept);
  r.trace_steps = int64_t(c.steps[0].size());
  const std::string ranks_said =
      c.ranks() > 1 ? fmt::format(" on each of {} ranks", c.ranks()) : "";

  // 1. Each backward's weight fit, against its calibrated bound (fits.cpp).
  // A bfloat16 (or float16) model: its gradients differ from their
  // float64 recompute by its own rounding, far more than float32's, and
  // its loss weight may be rounded in that precision.  Its weights are read
  // with that uncertainty (the fit bound: contract_fit_calibration x the
  // calibrated difference + contract_fit_ulps in the model's unit
  // roundoff), and the trace is judged only where that resolution tells
  // correct accumulation apart from every modelled candidate (the
  // "precision" check below, after the ranking).
  const bool lowp_model = r.precision == "bfloat16" || r.precision == "float16";
  if (!lowp_model && r.precision != "float32" && r.precision != "float64")
    throw InputError(trace_dir + "/meta.csv", 0, 0, "precision",
                     "'" + r.precision +
                         "': expected float32, float64, bfloat16 or "
                         "float16 (the model parameters' dtype)");
  const double u_model =
      r.precision == "bfloat16"  ? error_model::buffer_unit(GradBuffer::bf16)
      : r.precision == "float16" ? error_model::buffer_unit(GradBuffer::fp16)
                                 : error_model::kUnitRoundoff32;
  const WeightFit wfit = weight_fit_check(c, u_model, lowp_model, trace_dir);
  const CertifyCheck& fit = wfit.check;
  r.checks.push_back(fit);
  // Each weight's uncertainty: its fit bound, or, for a bfloat16 forward
  // (float32's exponent range: a rounding to it stays relative) whose
  // every weight was read at its outputs against the float32
  // gradient rounded once (meta.csv weights_read), that reading's own
  // (contract_weight_read_ulps): the backward's rounding moves c_b (the fit
  // bound above judges it), not the weight read at the outputs.
  const std::string weights_read = tr.meta_value("weights_read");
  if (!weights_read.empty() && weights_read != "float32")
    throw InputError(tr.meta_path(), 0, 0, "weights_read",
                     "expected float32 (every weight read at the outputs "
                     "against the float32 gradient of the summed loss), got '" +
                         weights_read + "'");
  const bool read_once = r.precision == "bfloat16" && weights_read == "float32";
  std::vector<double> weight_eps = wfit.eps;
  if (read_once)
    for (double& e : weight_eps)
      e = std::min(
          e, error_model::tolerance("contract_weight_read_ulps") * u_model +
                 error_model::tolerance("contract_fit_ulps") *
                     error_model::kUnitRoundoff32);

  // 2. Each step's consumed gradient as a combination of what .grad held
  // (with a bfloat16 .grad, its own bound).
  const StepFit sf = step_fit_check(c, n, ranks_said, trace_dir);
  const CertifyCheck& sfit = sf.check;
  const bool lowp = sf.lowp;
  r.checks.push_back(sfit);

  // 3. The optimizer update, replayed in float64.
  const CertifyCheck rep = replay_check(tr, c);
  // 3'. The optimizer calls that applied no update moved nothing (before
  // the replay: a parameter moved between steps fails the replay too).
  std::string idle_pitfall;
  bool idle_ok = true;
  if (const auto ck = idle_check(c, idle_pitfall)) {
    idle_ok = ck->ok;
    r.checks.push_back(*ck);
  }
  r.checks.push_back(rep);

  // 3a. The windows whose gradient overflowed: the loss scaler's skips.
  bool scaler_ok = true;
  if (const auto ck = scaler_check(c)) {
    scaler_ok = ck->ok;
    r.checks.push_back(*ck);
  }

  // 3b. The clip factors, when the loop clips or the recorder declared one
  // (on the norm the accepted loop's clip takes).  A sharded trace (its
  // clips' shard norms recorded) judges each candidate's clip rule too:
  // the whole gradient's norm, or ddp-clip-local-norm's shard norm.
  const bool judge_clip = s.clip.enabled || !c.clips.empty();
  const bool shard_clips = std::any_of(
      c.clips.begin(), c.clips.end(),
      [](const ContractClip& cl) { return !std::isnan(cl.shard_norm); });
  // The trace's clip_grad_norm_ calls per (rank, parameter version): a
  // declared clip's call pattern is each candidate's own (clip.cpp).
  const ClipCalls trace_clips = clip_calls(c);
  bool clip_ok = true;
  if (judge_clip) {
    const CertifyCheck ck = clip_check(c, s, clip_terms ? clip_terms : n,
                                       behavior_of(accept).clip_local_norm);
    clip_ok = ck.ok;
    r.checks.push_back(ck);
  }

  // 3c. The declared EMA.
  std::string ema_pitfall;
  bool ema_ok = true;
  if (!tr.meta_value("ema").empty()) {
    const CertifyCheck ck = ema_check(tr, c, ema_pitfall);
    ema_ok = ck.ok;
    r.checks.push_back(ck);
  }

  // 4. Which g_j with which weights: against every semantics (with a bf16
  // gradient buffer, its own candidates, their uncertainty propagated
  // from the bf16 step bound).
  const Measured meas = compose(c, weight_eps, sf.bound);
  const Measured meas_lowp =
      lowp ? compose(c, weight_eps, sf.lowp_bound) : Measured{};
  const ContractPlan cp = contract_plan(c, K, trace_dir + "/contract.csv");
  s.batching.accumulation = K;
  s.batching.micro_batch = cp.micro_batch;
  s.batching.epochs = int64_t(cp.plan.epochs.size());
  s.model.kind = tokens ? ModelKind::token : ModelKind::mlp;
  // A trace with fewer optimizer steps than the accepted loop takes
  // stopped short: the step budget is a candidate beside every pair.
  const bool stopped_short =
      predict(cp, s, behavior_of(accept), c).P[0].size() > c.steps[0].size();
  std::vector<std::vector<Pitfall>> sems =
      candidate_semantics({.token_loss = tokens,
                           .contract_tier = true,
                           .contract_lowp_buffer = lowp,
                           .stopped_short = stopped_short,
                           .contract_shard_clip = shard_clips,
                           .ranks_clip = c.ranks() > 1 && s.clip.enabled,
                           .schedule_frequency = s.schedule.frequency > 1});
  // The accepted semantics first: every check below is against it.
  sems.erase(std::remove(sems.begin(), sems.end(), accept), sems.end());
  sems.insert(sems.begin(), accept);
  std::vector<Prediction> preds;
  std::vector<bool> lowps, shard_rules;
  std::vector<Distance> dists;
  std::vector<std::vector<double>> lrs;
  // DDP's gradient all-reduces per step (the recorder saw them: a
  // DistributedDataParallel module), against each semantics' own.
  const bool reduces_seen =
      c.ranks() > 1 && tr.meta_value("all_reduces") == "seen";
  Reduces trace_reduces;
  if (reduces_seen && !tr.runs.empty()) {
    std::vector<Event> evs;
    for (const auto& te : tr.runs.front().events) evs.push_back(te.event);
    trace_reduces = all_reduces(evs, c);
  }
  std::string reduce_correct;  // "" or how correct's count differs
  // The all-reduces differ from the accepted semantics' only as a
  // performance-only pitfall's (the same weights): its finding.
  std::string reduce_perf;
  LrChannel lr_correct;
  Distance correct_weights;  // correct's weight distance, whatever its lr
  // Per candidate (r.ranking's order before sorting): its weight distance
  // whatever its lr, and whether its lr is the trace's.  A failed lr
  // check does not hide what the weights say (and the other way round).
  std::vector<double> weight_d;
  std::vector<bool> lr_ok;
  // A declared table the recorder could not rebuild with a K times longer
  // horizon: schedule-horizon-in-micro-steps has no lr to judge.
  const bool horizon_unjudged =
      s.schedule.table != nullptr && s.schedule.stretched_table == nullptr;
  const bool fits_ok =
      fit.ok && sfit.ok && rep.ok && clip_ok && ema_ok && scaler_ok && idle_ok;
  // Per candidate (r.ranking's order): what it leaves unexplained (the
  // combination search's measure).
  std::vector<Residual> residuals;
  // Judges one semantics: its distance, lr, all-reduces and clips; a new
  // candidate, or an alias of one with its very prediction.
  auto judge = [&](const std::vector<Pitfall>& sem) -> Residual {
    if (horizon_unjudged && sem != accept &&
        std::find(sem.begin(), sem.end(),
                  Pitfall::schedule_horizon_in_micro_steps) != sem.end())
      return {std::numeric_limits<int64_t>::max(), kInf};
    const Prediction p = predict(cp, s, behavior_of(sem), c);
    const bool sem_lowp = behavior_of(sem).low_precision_grad_buffer;
    const bool sem_shard = behavior_of(sem).clip_local_norm;
    Distance d = distance(sem_lowp ? meas_lowp : meas, p, c);
    // The weights check: correct's weights, with a bf16 .grad's
    // uncertainty where .grad accumulates in bf16.
    const Distance d_weights =
        lowp && !sem_lowp ? distance(meas_lowp, p, c) : d;
    if (lowp && !sem_lowp) {
      d.d = kInf;
      d.why = fmt::format(
          "step fit: residual {} of the float32 bound, a float32 .grad's",
          fmt_ratio(sf.worst));
    }
    // The lr channel: each step's lr against this semantics' schedule.
    LrChannel lr;
    if (!tr.runs.empty())
      lr = check_lr(s, cp.plan, tr.runs.front(), behavior_of(sem), lr32);
    const std::string reduce_why =
        reduces_seen ? reduces_differ(trace_reduces, p.reduces) : "";
    if (preds.empty()) {
      lr_correct = lr;
      correct_weights = d_weights;
      reduce_correct = reduce_why;
      if (!reduce_why.empty()) {
        reduce_perf =
            performance_finding(cp, s, accept, c, p, trace_reduces, r.accepted);
        if (!reduce_perf.empty()) reduce_correct.clear();
      }
    }
    if (!reduce_why.empty() && reduce_perf.empty()) {
      d.d = kInf;
      d.why = reduce_why;
    }
    if (const std::string why =
            s.clip.enabled ? clip_calls_differ(trace_clips, p.clips, c.ranks())
                           : "";
        !why.empty()) {
      d.d = kInf;
      d.why = why;
    }
    // The micro-batches in no step: backwarded (left in .grad) or never
    // (a window buffer's last leftover), as the trace's backward passes
    // say.  Judged where the weights match (elsewhere the weights say).
    if (const std::string why = unstepped_differ(cp, c, p);
        !why.empty() && d.d <= 1) {
      d.d = kInf;
      d.why = why;
    }
    // The clip symbols take the trace's factors: which norm gave them is
    // the candidate's clip rule, judged here.
    if (shard_clips && judge_clip) {
      const CertifyCheck ck =
          clip_check(c, s, clip_terms ? clip_terms : n, sem_shard);
      if (!ck.ok) {
        d.d = kInf;
        d.why = "clip: " + ck.message;
      }
    }
    const double wd = d.d;
    if (!lr.ok) {
      d.d = kInf;
      d.why = lr.message;
    }
    // The weights' residual, and each other channel that fails: one more.
    Residual res = d_weights.residual;
    if (lowp && !sem_lowp) ++res.out;
    if (std::isinf(d.d) && wd <= 1 && !(lowp && !sem_lowp)) ++res.out;
    if (!lr.ok) ++res.out;
    // Semantics with the same prediction (e.g. scheduler pitfalls: the
    // contract tier sees weights, not the lr) are one candidate.
    bool merged = false;
    for (size_t k = 0; k < preds.size(); ++k)
      if (preds[k].P == p.P && preds[k].version == p.version &&
          lowps[k] == sem_lowp && lrs[k] == lr.accepted_lr &&
          (!shard_clips || shard_rules[k] == sem_shard) &&
          (!s.clip.enabled || preds[k].clips == p.clips) &&
          (!reduces_seen || preds[k].reduces == p.reduces) &&
          preds[k].unstepped_backward == p.unstepped_backward) {
        r.ranking[k].aliases.push_back(semantics_name(sem));
        merged = true;
        break;
      }
    if (merged) return res;
    CertifyCandidate cand;
    cand.name = semantics_name(sem);
    cand.pitfalls = sem;
    cand.steps = int64_t(p.P[0].size());
    cand.distance = d.d;
    cand.tracked = true;
    cand.first_out = d.step;
    cand.first_out_what = d.why;
    r.ranking.push_back(cand);
    preds.push_back(p);
    lowps.push_back(sem_lowp);
    shard_rules.push_back(sem_shard);
    dists.push_back(d);
    lrs.push_back(lr.accepted_lr);
    weight_d.push_back(wd);
    // Its lr explains the trace's only where it also takes as many steps
    // (the channel compares the steps both have).
    lr_ok.push_back(lr.checked && lr.ok &&
                    lr.accepted_lr.size() == lr.trace_lr.size());
    residuals.push_back(res);
    return res;
  };
  for (const auto& sem : sems) {
    // When the trace passes (every fit within its bound and correct
    // within 1, lr included), the ranking is not printed: the other
    // candidates are not predicted at all.
    // A low-precision model's every candidate is predicted: its PASS
    // needs each of them told apart (the "precision" check).
    if (!preds.empty() && fits_ok && r.ranking.front().distance <= 1 &&
        !lowp_model)
      break;
    judge(sem);
  }
  // No candidate explains the trace: combinations of more pitfalls, by
  // the beam search from the closest (sim/pitfalls.hpp).
  const bool none_matches =
      std::all_of(r.ranking.begin(), r.ranking.end(),
                  [](const CertifyCandidate& k) { return !(k.distance <= 1); });
  if (fit.ok && sfit.ok && rep.ok && none_matches) {
    std::vector<std::pair<std::vector<Pitfall>, Residual>> ranked;
    for (size_t k = 0; k < r.ranking.size(); ++k)
      ranked.emplace_back(r.ranking[k].pitfalls, residuals[k]);
    search_combinations(
        {.token_loss = tokens,
         .contract_tier = true,
         .contract_lowp_buffer = lowp,
         .stopped_short = stopped_short,
         .contract_shard_clip = shard_clips,
         .ranks_clip = c.ranks() > 1 && s.clip.enabled,
         .schedule_frequency = s.schedule.frequency > 1},
        ranked,
        [&](const std::vector<std::vector<Pitfall>>& ext) {
          std::vector<Residual> out;
          for (const auto& sem : ext) out.push_back(judge(sem));
          return out;
        },
        size_t(limit("combination_pitfalls")),
        size_t(limit("combination_beam")));
  }
  r.expected_steps = r.ranking.front().steps;
  const bool structure_ok = correct_weights.d <= 1;
  CertifyCheck st{
      "weights", structure_ok, false,
      fmt::format("which g_j with which weight each step holds, against "
                  "{}: max {} of the uncertainty{}{}",
                  r.accepted, fmt_ratio(correct_weights.d),
                  lowp ? " (a bf16 .grad's: the bf16 step bound)" : "",
                  structure_ok ? "" : " (" + correct_weights.why + ")")};
  r.checks.push_back(st);
  if (lowp_model)
    r.checks.push_back(
        resolution_check(r, weight_eps, wfit.cal_max, read_once, trace_dir));
  if (reduces_seen) {
    int64_t n = 0;
    for (const auto& [t, k] : trace_reduces) n += int64_t(k.size());
    CertifyCheck rc{
        "all-reduce", reduce_correct.empty(), false,
        !reduce_perf.empty()
            ? fmt::format("{} gradient all-reduces (the values are {}'s)", n,
                          r.accepted)
        : reduce_correct.empty()
            ? fmt::format("{} gradient all-reduces, one per step at the "
                          "window's last micro-step (no_sync before it)",
                          n)
            : reduce_correct +
                  " (correct: one per step, at the window's "
                  "last micro-step)"};
    rc.performance = reduce_perf;
    r.checks.push_back(rc);
  }
  if (lr_correct.checked) {
    std::string msg = lr_correct.message;
    if (msg.rfind("lr: ", 0) == 0) msg = msg.substr(4);
    CertifyCheck lc{"lr", lr_correct.ok, false, msg};
    if (!lr_correct.ok) lc.message += ": " + lr_correct.evidence;
    r.checks.push_back(lc);
  }
  conclude(r, tr, c, cp, s, accept, K, meas, preds.front(),
           {.checks_ok = fit.ok && sfit.ok && rep.ok && clip_ok,
            .structure_ok = structure_ok,
            .ema_ok = ema_ok,
            .ema_pitfall = ema_pitfall,
            .scaler_ok = scaler_ok,
            .idle_ok = idle_ok,
            .idle_pitfall = idle_pitfall,
            .replay_ok = rep.ok,
            .idle_rows = !c.idle.empty(),
            .fits_ok = fit.ok && sfit.ok && clip_ok,
            .correct_weights = correct_weights,
            .lr_correct = lr_correct,
            .reduce_correct = reduce_correct,
            .horizon_unjudged = horizon_unjudged,
            .ranks_said = ranks_said,
            .weight_d = std::move(weight_d),
            .lr_ok = std::move(lr_ok)});
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

std::string contract_text(const CertifyReport& r, int top) {
  using contract_detail::fmt_ratio;
  std::string o;
  for (const auto& c : r.checks)
    o += fmt::format("{} {}: {}\n", c.ok ? "ok  " : "FAIL", c.name, c.message);
  o += r.verdict + "\n";
  for (const auto& c : r.checks)
    if (!c.performance.empty()) o += c.performance + "\n";
  for (const auto& n : r.notes) o += n + "\n";
  if (!r.diagnosis.empty()) o += r.diagnosis + "\n";
  if (!r.pass && !r.ranking.empty()) {
    o += "ranking (distance = max over steps and micro-batches of |weight - "
         "predicted| / uncertainty):\n";
    for (size_t i = 0; i < r.ranking.size() && int(i) < top; ++i) {
      const auto& c = r.ranking[i];
      o += fmt::format("  {:>2}. {:<52} {:>10}  {}\n", i + 1, c.name,
                       fmt_ratio(c.distance), c.first_out_what);
    }
  }
  return o;
}

}  // namespace accumcheck
