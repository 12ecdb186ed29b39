// certify, stage 3: rank every candidate semantics by its distance to the
// trace (verify/certify/stages.hpp).
//
// Every single pitfall and every pair, deduplicated by behaviour
// (sim/pitfalls.hpp), is ranked first with a double-precision oracle and
// a proxy bound (cheap); the accepted semantics and the closest few are
// then judged with Oracle<Tracked<OracleReal>>, whose distances are the
// ones reported.
#include <algorithm>
#include <cstdlib>
#include <limits>

#include "sim/errors.hpp"
#include "sim/limits.hpp"
#include "verify/certify/parallel.hpp"
#include "verify/certify/stages.hpp"

namespace accumcheck::certify_detail {

namespace {

// What a cheap run leaves unexplained (sim/pitfalls.hpp Residual): each
// step's clip norm, gradient and parameters out of their bound, and every
// step only one of the trace and the run takes (3 each).
Residual residual_of(const Forced& f, size_t trace_steps) {
  constexpr double kCap = 1e3;  // one value's excess counts at most this
  if (f.steps < 0) return {std::numeric_limits<int64_t>::max(), kInf};
  Residual res;
  for (const StepEval& ev : f.eval) {
    if (!ev.seen) continue;
    for (const auto* c : {&ev.norm, &ev.grad, &ev.param})
      if (!c->ok()) {
        ++res.out;
        res.excess += std::min(c->max_ratio, kCap);
      }
  }
  const int64_t extra = std::abs(f.steps - int64_t(trace_steps));
  res.out += 3 * extra;
  res.excess += 3 * kCap * double(extra);
  return res;
}

}  // namespace

void rank_cheap(const Ctx& ctx, const Behavior& accepted_b, CertifyReport& r,
                std::vector<Behavior>& behaviors) {
  const Scenario& s = ctx.s;
  // Diagnosis: every single pitfall and pair, deduplicated by behaviour.
  // The mean-of-means pitfall of the scenario's loss: sample- for sample
  // losses, token- for token losses (the same switch, named for the
  // loss; the scenario parser refuses the other).  The loss-scale
  // pitfalls with the scenario's loss scaling or the trainer's own
  // (ctx.scale_exps: the trace's scales, forced on every candidate).
  const CandidateScope scope{
      .token_loss = s.model.kind == ModelKind::token,
      .loss_scaling = s.precision.loss_scaling || !ctx.scale_exps.empty(),
      .ema = s.ema.enabled,
      .ranks_clip = s.batching.ranks > 1 && s.clip.enabled,
      .schedule_frequency = s.schedule.frequency > 1};
  std::vector<std::vector<Pitfall>> sems = candidate_semantics(scope);
  sems.push_back(s.trainer.accepted);
  // Per candidate: every step's cheap gradient and parameter ratios.
  std::vector<std::vector<double>> fingerprints;
  for (const auto& sem : sems) {
    const Behavior b = behavior_of(sem);
    const std::string name = semantics_name(sem);
    auto it = std::find(behaviors.begin(), behaviors.end(), b);
    if (it != behaviors.end()) {
      auto& cand = r.ranking[size_t(it - behaviors.begin())];
      if (cand.name != name &&
          std::find(cand.aliases.begin(), cand.aliases.end(), name) ==
              cand.aliases.end())
        cand.aliases.push_back(name);
      continue;
    }
    behaviors.push_back(b);
    CertifyCandidate c;
    c.name = name;
    c.pitfalls = sem;
    r.ranking.push_back(c);
  }
  // Cheap pass: double oracle, proxy bound; the candidates on every
  // thread (results by index: the same for any thread count).
  std::vector<Forced> cheap(behaviors.size());
  if (ctx.progress)
    ctx.progress->start("ranking", int64_t(behaviors.size()) *
                                       (ctx.range.end - ctx.range.begin));
  parallel_for(behaviors.size(), ctx.threads, [&](size_t i) {
    try {
      cheap[i] = forced_run<double>(ctx, behaviors[i], ctx.range);
    } catch (const ScaleRangeError&) {
      // Its loss scale leaves the exact range: it cannot be followed
      // (no step matches: infinitely far).  The accepted semantics' own
      // run reports it to the user.
      if (behaviors[i] == accepted_b) throw;
      cheap[i] = Forced{-1, {}};
    }
  });
  for (size_t i = 0; i < behaviors.size(); ++i) {
    const Forced& f = cheap[i];
    CertifyCandidate& c = r.ranking[i];
    fingerprints.emplace_back();
    c.steps = f.steps;
    c.proxy = distance_of(f, ctx.trace.size()).value;
    for (const StepEval& ev : f.eval) {
      // The forced clip norms too: where the trainer's recorded norm
      // forces the clip, two semantics may clip to the same gradient and
      // differ only in the norm they see (clip-before-unscale: S times).
      fingerprints.back().push_back(ev.norm.max_ratio);
      fingerprints.back().push_back(ev.grad.max_ratio);
      fingerprints.back().push_back(ev.param.max_ratio);
    }
  }
  // No candidate within its bound: combinations of more pitfalls, by the
  // beam search from the closest (sim/pitfalls.hpp), each judged as
  // cheaply, on every thread; one whose extra pitfall changes nothing here
  // is folded below like any other.
  const size_t n = ctx.trace.size();
  const bool none_matches =
      std::all_of(r.ranking.begin(), r.ranking.end(),
                  [](const CertifyCandidate& c) { return !(c.proxy <= 1); });
  const size_t searched_from = r.ranking.size();
  if (none_matches) {
    std::vector<std::pair<std::vector<Pitfall>, Residual>> ranked;
    for (size_t i = 0; i < r.ranking.size(); ++i)
      ranked.emplace_back(r.ranking[i].pitfalls, residual_of(cheap[i], n));
    search_combinations(
        scope, ranked,
        [&](const std::vector<std::vector<Pitfall>>& ext) {
          std::vector<Forced> runs(ext.size());
          parallel_for(ext.size(), ctx.threads, [&](size_t i) {
            try {
              runs[i] = forced_run<double>(ctx, behavior_of(ext[i]), ctx.range);
            } catch (const ScaleRangeError&) {
              runs[i] = Forced{-1, {}};
            }
          });
          std::vector<Residual> out;
          for (size_t i = 0; i < ext.size(); ++i) {
            out.push_back(residual_of(runs[i], n));
            CertifyCandidate c;
            c.name = semantics_name(ext[i]);
            c.pitfalls = ext[i];
            c.steps = runs[i].steps;
            c.proxy = distance_of(runs[i], n).value;
            r.ranking.push_back(c);
            behaviors.push_back(behavior_of(ext[i]));
            fingerprints.emplace_back();
            for (const StepEval& ev : runs[i].eval) {
              fingerprints.back().push_back(ev.norm.max_ratio);
              fingerprints.back().push_back(ev.grad.max_ratio);
              fingerprints.back().push_back(ev.param.max_ratio);
            }
            cheap.push_back(std::move(runs[i]));
          }
          return out;
        },
        size_t(limit("combination_pitfalls")),
        size_t(limit("combination_beam")));
  }
  // Fold a candidate into a simpler one (a strict subset of its
  // pitfalls) that gave bitwise the same cheap result: the extra
  // pitfalls are inert on this scenario.
  {
    auto subset = [](const std::vector<Pitfall>& a,
                     const std::vector<Pitfall>& b) {
      if (a.size() >= b.size()) return false;
      for (Pitfall p : a)
        if (std::find(b.begin(), b.end(), p) == b.end()) return false;
      return true;
    };
    std::vector<CertifyCandidate> kept;
    std::vector<Behavior> kept_b;
    std::vector<size_t> kept_i;
    for (size_t i = 0; i < r.ranking.size(); ++i) {
      CertifyCandidate& x = r.ranking[i];
      const bool is_acc = behaviors[i] == accepted_b;
      CertifyCandidate* into = nullptr;
      for (size_t k = 0; k < kept.size(); ++k)
        // With R > 1 a candidate that changes the all-reduces
        // (Behavior::sync) is never inert: its damage is in the events.
        if (!is_acc && x.steps >= 0 && subset(kept[k].pitfalls, x.pitfalls) &&
            (s.batching.ranks == 1 || kept_b[k].sync == behaviors[i].sync) &&
            fingerprints[kept_i[k]] == fingerprints[i] &&
            kept[k].steps == x.steps) {
          into = &kept[k];
          break;
        }
      if (!into) {
        kept.push_back(x);
        kept_b.push_back(behaviors[i]);
        kept_i.push_back(i);
        continue;
      }
      // A searched combination folded into a simpler one: its extras
      // change nothing here, and the catalog's own inert singles and
      // pairs already say so.
      if (i >= searched_from) continue;
      std::string extra;
      for (Pitfall p : x.pitfalls)
        if (std::find(into->pitfalls.begin(), into->pitfalls.end(), p) ==
            into->pitfalls.end()) {
          if (!extra.empty()) extra.append("+");
          extra.append(pitfall_id(p));
        }
      if (std::find(into->inert.begin(), into->inert.end(), extra) ==
          into->inert.end())
        into->inert.push_back(extra);
    }
    r.ranking = std::move(kept);
    behaviors = std::move(kept_b);
  }
}

// The closest few candidates are judged with the Tracked bound too:
// plausible matches only (within 10x of the best cheap distance, or of
// the bound), at most cfg.refine of them, and besides them every
// candidate tied with the best, and every plausible one whose call
// pattern is the trace's where correct's is not (mark_pattern_matches,
// before launch).  The pattern ones because
// diagnose() tells candidates tied on the values apart by their call
// pattern, which it can do only for candidates judged rigorously; the
// cheap proxy cannot be trusted to pick them: under --precision bf16 or
// fp16 its error is the autocast's rounding, the same size as a wrong
// semantics' (the proxy's relative bound, 64 u32 (|v| + 2^-10 max|v|),
// is one a gradient off by any factor leaves by at most 1 / (64 u32),
// while bf16's rounding of a cancelling sum leaves it by as much), so
// which of the candidates equal within the bf16 bound ranks first is
// noise (zero-grad-every-micro-step and scaler-update-every-micro-step's
// variants differ by the earlier micro-batches' 1/S).
void Refiner::launch() {
  CertifyReport& r = r_;
  launched_ = true;
  std::vector<size_t> order(r.ranking.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return r.ranking[a].proxy < r.ranking[b].proxy;
  });
  const double plausible =
      10 * std::max(1.0, order.empty() ? 1.0 : r.ranking[order[0]].proxy);
  const double best_proxy = order.empty() ? 0.0 : r.ranking[order[0]].proxy;
  for (size_t k = 0; k < order.size(); ++k) {
    const CertifyCandidate& c = r.ranking[order[k]];
    const Behavior& b = behaviors_[order[k]];
    if (b == accepted_b_) continue;
    // Candidates tied with the best cheap distance are always judged
    // rigorously, so a tie is reported as a tie.
    const bool tied = c.proxy == best_proxy;
    // A plausible candidate with the trace's call pattern, past the
    // cfg.refine closest: judged all the same (see above).
    const bool pattern =
        r.pattern_checked && !r.pattern_ok && c.pattern_matches;
    if (!(c.proxy <= plausible) && !tied) continue;
    if (int(jobs_.size()) >= cfg_.refine && !tied && !pattern) continue;
    jobs_.push_back(order[k]);
  }
}

void Refiner::finish(const Forced& acc) {
  CertifyReport& r = r_;
  const size_t n = ctx_.trace.size();
  if (!launched_) launch();
  for (size_t k = 0; k < r.ranking.size(); ++k)
    if (behaviors_[k] == accepted_b_) {
      CertifyCandidate& c = r.ranking[k];
      const Distance d = distance_of(acc, n);
      c.tracked = true;
      c.distance = d.value;
      c.first_out = d.first_out;
      c.first_out_what = d.first_out_what;
    }
  // One candidate after the other, each on every thread.
  if (ctx_.progress)
    ctx_.progress->start("refining", int64_t(jobs_.size()) *
                                         (ctx_.range.end - ctx_.range.begin));
  for (size_t i : jobs_) {
    const Distance d = distance_of(judge_steps(ctx_, behaviors_[i], true), n);
    CertifyCandidate& c = r.ranking[i];
    c.tracked = true;
    c.distance = d.value;
    c.first_out = d.first_out;
    c.first_out_what = d.first_out_what;
  }
  for (CertifyCandidate& c : r.ranking)
    if (!c.tracked) c.distance = c.proxy;
  std::stable_sort(r.ranking.begin(), r.ranking.end(),
                   [](const CertifyCandidate& a, const CertifyCandidate& b) {
                     return a.distance < b.distance;
                   });
}

}  // namespace accumcheck::certify_detail
