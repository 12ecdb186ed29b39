// The contract tier's judging (verify/contract/contract.hpp): the fits of
// the trace, the measured weights and every candidate's distance from them,
// and the checks and the verdict it calls (verify/contract/detail.hpp).
#include "verify/contract/contract.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "oracle/error_model.hpp"
#include "sim/errors.hpp"
#include "sim/limits.hpp"
#include "verify/certify/lr_channel.hpp"
#include "verify/contract/detail.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::contract_detail {

namespace {

// Per rank, W_t = beta W_{t-1} + sum_b a_b w_b e_{m(b)} (b over every
// rank's backward passes: DDP's all-reduce brings the others'),
// uncertainties alongside.
Measured compose(const ContractSection& c, const std::vector<double>& eps,
                 const std::vector<std::vector<double>>& step_bound) {
  Measured out;
  for (int64_t r = 0; r < c.ranks(); ++r) {
    out.W.emplace_back();
    out.U.emplace_back();
    auto& m = out;
    const auto& steps = c.steps[size_t(r)];
    for (size_t t = 0; t < steps.size(); ++t) {
      Weights W, U;
      const double bound = step_bound[size_t(r)][t];
      for (const auto& k : steps[t].coefs) {
        const double da = k.norm > 0 ? bound / k.norm : 0.0;
        if (k.backward < 0) {
          if (t == 0) continue;
          for (const auto& [j, w] : m.W[size_t(r)][t - 1]) {
            W[j] += k.a * w;
            U[j] +=
                da * std::abs(w) + std::abs(k.a) * m.U[size_t(r)][t - 1].at(j);
          }
        } else {
          const ContractBackward& b = c.backward[size_t(k.backward)];
          W[b.micro] += k.a * b.weight;
          U[b.micro] += da * std::abs(b.weight) +
                        std::abs(k.a * b.weight) * eps[size_t(k.backward)];
        }
      }
      m.W[size_t(r)].push_back(std::move(W));
      m.U[size_t(r)].push_back(std::move(U));
    }
  }
  return out;
}

}  // namespace

Distance distance(const Measured& m, const Prediction& p,
                  const ContractSection& c) {
  Distance out;
  const size_t R = m.W.size();
  auto who = [&](size_t r) {
    return R > 1 ? fmt::format("rank {} ", r) : std::string();
  };
  // The residual: a weight out counts 1, its excess ratio at most this
  // much (an order past any weight's), so no single step outweighs the
  // count.
  constexpr double kResidualCap = 1e3;
  Residual res;
  for (size_t r = 0; r < R; ++r) {
    const auto& longer = p.P[r].size() > m.W[r].size() ? p.P[r] : m.W[r];
    for (size_t t = std::min(p.P[r].size(), m.W[r].size()); t < longer.size();
         ++t) {
      res.out += int64_t(longer[t].size());
      res.excess += kResidualCap * double(longer[t].size());
    }
  }
  for (size_t r = 0; r < R; ++r)
    if (p.P[r].size() != m.W[r].size()) {
      out.d = kInf;
      out.why = fmt::format("{}takes {} optimizer steps, the trace {}", who(r),
                            p.P[r].size(), m.W[r].size());
    }
  const double u = error_model::kUnitRoundoff32;
  for (size_t r = 0; r < R; ++r)
    for (size_t t = 0; t < std::min(p.P[r].size(), m.W[r].size()); ++t) {
      const Weights& P_t = p.P[r][t];
      const Weights& W_t = m.W[r][t];
      double top = 0;
      for (const auto& [j, w] : P_t) top = std::max(top, std::abs(w));
      for (int64_t j : keys_of(P_t, W_t)) {
        const double P = at_or_0(P_t, j), W = at_or_0(W_t, j);
        const double U = std::max(at_or_0(m.U[r][t], j), u * top);
        double rr = U > 0 ? std::abs(W - P) / U : (W == P ? 0 : kInf);
        std::string why;
        if (P != 0 && j < int64_t(c.micro.size()) &&
            p.version[r][t].at(j) != c.micro[size_t(j)].version) {
          rr = kInf;
          why = fmt::format(
              "{}takes g of micro-batch {} at parameter version {}, the trace "
              "at {}",
              who(r), j, p.version[r][t].at(j), c.micro[size_t(j)].version);
        }
        if (rr > 1) {
          ++res.out;
          res.excess += std::min(rr, kResidualCap);
        }
        if (rr > out.d && !(std::isinf(out.d) && out.step < 0)) {
          out = {rr, int64_t(t), j, why, {}};
          if (why.empty())
            out.why = fmt::format(
                "{}step {} micro-batch {}: weight {:.9g}, predicted {:.9g}",
                who(r), t, j, W, P);
        }
      }
    }
  out.residual = res;
  return out;
}

}  // namespace accumcheck::contract_detail

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

  const double u = error_model::kUnitRoundoff32;
  const double fit_cal = error_model::tolerance("contract_fit_calibration");
  const double fit_ulps = error_model::tolerance("contract_fit_ulps");
  const double sum_ulps = error_model::tolerance("contract_sum_ulps");
  const double replay_ulps = error_model::tolerance("contract_replay_ulps");

  // 1. Each backward's weight fit, against its calibrated bound.
  double cal_max = 0;
  size_t cal_at = 0;
  for (size_t j = 0; j < c.micro.size(); ++j)
    if (!std::isnan(c.micro[j].calibration) &&
        c.micro[j].calibration > cal_max) {
      cal_max = c.micro[j].calibration;
      cal_at = j;
    }
  // A bfloat16 (or float16) model: its gradients differ from their
  // float64 recompute by its own rounding, far more than float32's, and
  // its loss weight may be rounded in that precision.  Its weights are read
  // with that uncertainty (the fit bound below: contract_fit_calibration x
  // the calibrated difference + contract_fit_ulps in the model's unit
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
                                 : u;
  // A float64 recompute of g_j that strays from the float32 one by more
  // than the precision at which weights are read (evidence_weight_rel) is
  // not the same function (randomness the recorder could not replay, such
  // as a compiled graph's own RNG): the weights would be too uncertain to
  // tell correct from a mistake, so the trace is not judged.
  const double weight_rel = error_model::tolerance("evidence_weight_rel");
  if (cal_max > weight_rel && !lowp_model)
    throw InputError(
        trace_dir + "/contract.csv", 0, 0, "calibration",
        fmt::format(
            "micro-batch {}'s gradient recomputed in float64 differs from "
            "the float32 one by {:.3g} of its norm (at most {:g} reads a "
            "weight): the recompute is not the forward your loop ran "
            "(randomness the recorder could not replay, e.g. a "
            "torch.compile'd model compiled before the recorder was made); "
            "record again with the recorder made first",
            cal_at, cal_max, weight_rel));
  std::vector<double> eps;
  CertifyCheck fit{"weight fit", true, false, ""};
  double worst_fit = 0;
  int64_t worst_b = -1;
  // A backward pass of a window whose gradient overflowed: in no step, its
  // fit of inf or NaN not judged (the loss scaler check is its).
  const auto overflowed = [&](const ContractBackward& bw) {
    const ContractMicro& m = c.micro[size_t(bw.micro)];
    const auto& steps = c.steps[size_t(m.rank)];
    return bw.version >= 0 && bw.version < int64_t(steps.size()) &&
           steps[size_t(bw.version)].overflow.has_value();
  };
  for (size_t b = 0; b < c.backward.size(); ++b) {
    const ContractBackward& bw = c.backward[b];
    const double cal = c.micro[size_t(bw.micro)].calibration;
    const double bound =
        fit_cal * (std::isnan(cal) ? cal_max : cal) + fit_ulps * u_model;
    eps.push_back(bound);
    if (overflowed(bw)) continue;
    const double ratio = std::isnan(bw.residual) ? kInf : bw.residual / bound;
    if (ratio > worst_fit || worst_b < 0) {
      worst_fit = ratio;
      worst_b = int64_t(b);
    }
  }
  if (worst_b >= 0) {
    const auto& bw = c.backward[size_t(worst_b)];
    fit.ok = worst_fit <= 1;
    fit.message = fmt::format(
        "{} backward passes, each w*g_j: worst residual {:.3g} = {} of its "
        "bound "
        "(backward {}, micro-batch {})",
        c.backward.size(), bw.residual, fmt_ratio(worst_fit), worst_b,
        bw.micro);
    if (!fit.ok)
      fit.message +=
          ": that gradient is not a multiple of the micro-batch's g_j "
          "(another loss than the declared summed loss, other "
          "randomness, or the gradient changed inside the backward)";
  } else {
    fit.ok = false;
    fit.message = "no backward pass recorded";
  }
  r.checks.push_back(fit);

  // 2. Each step's consumed gradient as a combination of what .grad held.
  // With R ranks the b run over every rank's backward passes (DDP's
  // all-reduce brings them), each rank's step fitted on its own.
  std::vector<std::vector<double>> step_bound(size_t(c.ranks()));
  CertifyCheck sfit{"step fit", true, false, ""};
  double worst_step = 0;
  for (int64_t q = 0; q < c.ranks(); ++q)
    for (const auto& st : c.steps[size_t(q)]) {
      if (st.overflow) {  // no fit: the loss scaler check judges it
        step_bound[size_t(q)].push_back(0);
        continue;
      }
      const double bound = (double(st.terms) + sum_ulps) * u * st.scale;
      step_bound[size_t(q)].push_back(bound);
      const double ratio =
          bound > 0 ? st.residual / bound : (st.residual == 0 ? 0 : kInf);
      worst_step = std::max(worst_step, ratio);
    }
  sfit.ok = worst_step <= 1;
  sfit.message = fmt::format(
      "{} optimizer steps{}, each consumed gradient = beta*G_prev + sum a_b "
      "c_b: worst residual {} of its bound",
      c.steps[0].size(), ranks_said, fmt_ratio(worst_step));
  // A step fit outside its float32 bound: .grad accumulates in bfloat16
  // (bf16_step_bound, precision.cpp), or .grad was changed unseen: exit 2.
  std::vector<std::vector<double>> lowp_bound(size_t(c.ranks()));
  bool lowp = false;
  if (!sfit.ok) {
    lowp_bound = bf16_step_bound(c, n, step_bound, worst_step, trace_dir, sfit);
    lowp = true;
  }
  r.checks.push_back(sfit);

  // 3. The optimizer update, replayed in float64.
  CertifyCheck rep{"optimizer replay", true, false, ""};
  double worst_rep = 0;
  for (const auto& steps : c.steps)
    for (const auto& st : steps)
      if (!st.overflow)
        worst_rep = std::max(
            worst_rep, std::isnan(st.replay) ? kInf : st.replay / replay_ulps);
  rep.ok = worst_rep <= 1;
  // What the recorder replayed its update against (meta.csv replay: each
  // recorder says it in its own words; the check is the same).
  const std::string replayed = tr.meta_value("replay");
  rep.message = fmt::format(
      "{}: worst {} of the bound ({} u32 of |p| + |update|)",
      replayed.empty() ? "the optimizer's update replayed from the recorded "
                         "parameters, state and gradient"
                       : replayed,
      fmt_ratio(worst_rep), replay_ulps);
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
  // declared clip's call pattern is each candidate's own (clip after every
  // backward calls it K times a step), judged even where a clip that never
  // engages leaves the weights the same.
  std::map<std::pair<int64_t, int64_t>, int64_t> trace_clips;
  for (const ContractClip& cl : c.clips) ++trace_clips[{cl.rank, cl.version}];
  const auto clips_differ = [&](const Prediction& p) -> std::string {
    if (!s.clip.enabled || p.clips == trace_clips) return "";
    const auto n_at = [](const auto& m, const auto& k) {
      const auto it = m.find(k);
      return it == m.end() ? int64_t(0) : it->second;
    };
    std::set<std::pair<int64_t, int64_t>> at;
    for (const auto& [k, n] : p.clips) at.insert(k);
    for (const auto& [k, n] : trace_clips) at.insert(k);
    for (const auto& k : at)
      if (n_at(p.clips, k) != n_at(trace_clips, k))
        return fmt::format(
            "clip: {}step {}: {} clip_grad_norm_ call(s), predicted {}",
            c.ranks() > 1 ? fmt::format("rank {} ", k.first) : std::string(),
            k.second, n_at(trace_clips, k), n_at(p.clips, k));
    return "";
  };
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
  const Measured meas = compose(c, eps, step_bound);
  const Measured meas_lowp = lowp ? compose(c, eps, lowp_bound) : Measured{};
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
          fmt_ratio(worst_step));
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
    if (const std::string why = clips_differ(p); !why.empty()) {
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
    r.checks.push_back(resolution_check(r, eps, cal_max, trace_dir));
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
