// The contract tier's verdict and, on FAIL, its diagnosis
// (verify/contract/detail.hpp): which candidate explains the trace, by its
// weights and by its lr, or the model-free evidence when none does.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

#include "verify/certify/evidence.hpp"
#include "verify/contract/detail.hpp"
#include "verify/trace/unseen.hpp"

namespace accumcheck::contract_detail {

namespace {

// A trace whose optimizer steps are not correct's in number: the counts,
// and the micro-batches that entered no step (rank 0's: drawn and never
// stepped, by epoch; and those its loaders held and never drew), read from
// the trace and its contract plan alone.
std::string step_count_evidence(const ContractSection& c,
                                const ContractPlan& cp,
                                const std::vector<Weights>& W,
                                int64_t correct_steps) {
  if (int64_t(W.size()) == correct_steps) return "";
  std::set<int64_t> stepped;
  for (const Weights& w : W)
    for (const auto& [j, x] : w)
      if (x != 0) stepped.insert(j);
  std::map<int64_t, std::vector<int64_t>> unstepped;  // epoch -> micro
  for (size_t j = 0; j < c.micro.size(); ++j)
    if (c.micro[j].rank == 0 && !stepped.count(int64_t(j)))
      unstepped[c.micro[j].epoch].push_back(int64_t(j));
  std::string out = fmt::format(
      "evidence: {} optimizer steps; correct accumulation takes {}; "
      "micro-batches in no optimizer step:",
      W.size(), correct_steps);
  if (unstepped.empty()) out += " every drawn one was stepped;";
  for (const auto& [e, js] : unstepped)
    out += fmt::format(" epoch {}: {} drawn, never stepped ({});", e, js.size(),
                       fmt::join(js, ", "));
  const int64_t never = int64_t(cp.items.size()) - cp.drawn;
  out += fmt::format(" {} never drawn{}", never,
                     c.ranks() > 1 ? " (all ranks)" : "");
  return out + "\n";
}

// Rank 0's windows as the trace recorded them: per optimizer step, its
// own micro-batches whose backward passes the step's fit ran over (those
// since the step before it; one backwarded twice counts once) and the
// epoch of the last of them.
std::vector<RunWindow> contract_windows(const ContractSection& c, int64_t K) {
  std::vector<RunWindow> out;
  int64_t epoch = 0;
  for (const ContractStep& st : c.steps[0]) {
    std::set<int64_t> micro;
    for (const auto& k : st.coefs) {
      if (k.backward < 0) continue;
      const int64_t j = c.backward[size_t(k.backward)].micro;
      const ContractMicro& m = c.micro[size_t(j)];
      if (m.rank != 0) continue;
      micro.insert(j);
      epoch = m.epoch;
    }
    out.push_back({epoch, int64_t(micro.size()), K});
  }
  return out;
}

}  // namespace

void conclude(CertifyReport& r, const Trace& tr, const ContractSection& c,
              const ContractPlan& cp, const Scenario& s,
              const std::vector<Pitfall>& accept, int64_t K,
              const Measured& meas, const Prediction& accepted,
              const Findings& f) {
  // The weights' best match (the fewest pitfalls among the nearest) and
  // the lr's (correct, or the first single pitfall whose lr is the
  // trace's): named each when no one candidate explains both.
  int64_t by_weights = -1, by_lr = -1;
  for (size_t k = 0; k < r.ranking.size(); ++k) {
    const auto& cand = r.ranking[k];
    if (by_weights < 0 || f.weight_d[k] < f.weight_d[size_t(by_weights)] ||
        (f.weight_d[k] == f.weight_d[size_t(by_weights)] &&
         cand.pitfalls.size() < r.ranking[size_t(by_weights)].pitfalls.size()))
      by_weights = int64_t(k);
    if (by_lr < 0 && f.lr_ok[k] && cand.pitfalls.size() <= 1)
      by_lr = int64_t(k);
  }
  const CertifyCandidate correct = r.ranking.front();
  r.pass = f.checks_ok && f.structure_ok && f.lr_correct.ok &&
           f.reduce_correct.empty() && f.ema_ok && f.scaler_ok && f.idle_ok;
  r.notes.push_back(not_judged(tr, f.idle_rows));
  // Their names (by_weights, by_lr index the ranking before sorting).
  const double weights_best =
      by_weights >= 0 ? f.weight_d[size_t(by_weights)] : kInf;
  const std::string weights_name =
      by_weights >= 0 ? r.ranking[size_t(by_weights)].name : "";
  const std::string lr_name = by_lr >= 0 ? r.ranking[size_t(by_lr)].name : "";
  const std::string horizon_note =
      f.horizon_unjudged
          ? "not judged: schedule-horizon-in-micro-steps (the declared "
            "scheduler cannot be rebuilt with a K times longer horizon: "
            "declare a factory of (optimizer, scale), docs/tiers.md)"
          : "";
  std::stable_sort(
      r.ranking.begin(), r.ranking.end(),
      [](const auto& a, const auto& b) { return a.distance < b.distance; });
  if (r.pass) {
    r.verdict = fmt::format(
        "PASS (contract tier): {} steps{}; every step holds the micro-batch "
        "gradients "
        "{} predicts (max {} of the uncertainty){}",
        c.steps[0].size(), f.ranks_said,
        accept.empty() ? std::string("correct accumulation")
                       : "the accepted " + r.accepted,
        fmt_ratio(correct.distance),
        f.lr_correct.checked ? "; lr as declared" : "");
    if (!accept.empty())
      for (const Pitfall p : accept)
        r.verdict += fmt::format(
            "\naccepted: {} (meta.csv accept; not exact large-batch "
            "equivalence: {})",
            pitfall_id(p), pitfall_story(p));
    r.ranking.clear();
  } else {
    r.verdict = "FAIL (contract tier): ";
    for (const auto& ck : r.checks)
      if (!ck.ok) {
        r.verdict += ck.name + ": " + ck.message;
        break;
      }
    refuse_unseen(tr, r.pass, r.verdict);
    const CertifyCandidate& best = r.ranking.front();
    const double next = r.ranking.size() > 1 ? r.ranking[1].distance : kInf;
    std::string names = best.name;
    if (!best.aliases.empty())
      names += " (same weights: " + best.aliases.front() +
               (best.aliases.size() > 1 ? ", ..." : "") + ")";
    const bool only_ema = !f.ema_ok && f.checks_ok && f.structure_ok &&
                          f.lr_correct.ok && f.reduce_correct.empty();
    const bool only_scaler = !f.scaler_ok && f.ema_ok && f.checks_ok &&
                             f.structure_ok && f.lr_correct.ok &&
                             f.reduce_correct.empty();
    // The calls between steps moved what they must not, and the rest is
    // correct's (the replay from a window's start fails by the same
    // moves: not required to hold).
    const bool others_ok = f.ema_ok && f.scaler_ok && f.structure_ok &&
                           f.lr_correct.ok && f.reduce_correct.empty();
    const bool only_idle = !f.idle_ok && others_ok && f.fits_ok;
    if (only_idle) {
      std::string msg;
      for (const auto& ck : r.checks)
        if (ck.name == "calls without an update") msg = ck.message;
      r.diagnosis = fmt::format(
          "diagnosis: matches {} (the weights are correct's: max {} of the "
          "uncertainty)\nevidence: {}{}",
          f.idle_pitfall, fmt_ratio(f.correct_weights.d), msg,
          f.replay_ok ? ""
                      : "\nevidence: the optimizer replay fails by the "
                        "same moves (the parameters moved between steps)");
      r.ranking.clear();
    } else if (only_scaler) {
      // The other windows are correct's; the loss scaler's skip is not.
      std::string msg;
      for (const auto& ck : r.checks)
        if (ck.name == "loss scaler") msg = ck.message;
      r.diagnosis = fmt::format(
          "diagnosis: no modelled pitfall explains this trace\n"
          "evidence: {}\nevidence: the other windows' weights are correct's: "
          "max {} of the uncertainty",
          msg, fmt_ratio(f.correct_weights.d));
      r.ranking.clear();
    } else if (only_ema) {
      // The gradients, steps and lr are correct's; the EMA is not.
      const std::string weights =
          fmt::format("the weights are correct's: max {} of the uncertainty",
                      fmt_ratio(f.correct_weights.d));
      std::string ema_msg;
      for (const auto& ck : r.checks)
        if (ck.name == "EMA") ema_msg = ck.message;
      r.diagnosis =
          f.ema_pitfall.empty()
              ? fmt::format(
                    "diagnosis: no modelled pitfall explains this trace\n"
                    "evidence: {}\nevidence: {}",
                    ema_msg, weights)
              : fmt::format("diagnosis: matches {} ({})\nevidence: {}",
                            f.ema_pitfall, weights, ema_msg);
      r.ranking.clear();
    } else if (best.distance <= 1 && best.pitfalls != accept) {
      // (The accepted semantics itself within its distance on a FAIL: the
      // failing check is one no candidate's distance holds, so nothing is
      // named; the evidence below says what fails.)
      r.diagnosis = fmt::format(
          "diagnosis: matches {} (max {} of the uncertainty)\nmargin: next is "
          "{} at {} "
          "({}x the best)",
          names, fmt_ratio(best.distance),
          r.ranking.size() > 1 ? r.ranking[1].name : "-", fmt_ratio(next),
          fmt_ratio(best.distance > 0 ? next / best.distance : kInf));
      const std::string steps_said =
          step_count_evidence(c, cp, meas.W[0], correct.steps);
      if (!steps_said.empty())
        r.diagnosis += "\n" + steps_said.substr(0, steps_said.size() - 1);
    } else if (weights_best <= 1 && weights_name != semantics_name(accept) &&
               f.lr_correct.checked && !f.lr_correct.ok) {
      // The weights match a candidate whose lr is not the trace's: each
      // channel's diagnosis.
      r.diagnosis = fmt::format(
          "diagnosis: matches {} (weights, max {} of the uncertainty) and {} "
          "(lr)\nevidence: {}",
          weights_name, fmt_ratio(weights_best),
          lr_name.empty() ? std::string("no modelled lr pitfall") : lr_name,
          f.lr_correct.evidence);
    } else {
      r.diagnosis = "diagnosis: no modelled pitfall explains this trace\n";
      // Windows of another size than the recorder's K: the K they look
      // like, and the weights judged with it.
      // When they are the accepted weights at that K, the weights read
      // against the recorder's K (counted twice, skipped) are not said.
      bool explained_by_k = false;
      const std::vector<RunWindow> windows = contract_windows(c, K);
      if (const int64_t k = windows_k(windows); k > 0) {
        r.diagnosis +=
            "evidence: " + windows_evidence(windows, "the recorder was told") +
            "\n";
        Scenario sk = s;
        const ContractPlan cpk = contract_plan(c, k, tr.dir + "/contract.csv");
        sk.batching.accumulation = k;
        sk.batching.micro_batch = cpk.micro_batch;
        sk.batching.epochs = int64_t(cpk.plan.epochs.size());
        const Distance d =
            distance(meas, predict(cpk, sk, behavior_of(accept), c), c);
        r.diagnosis += fmt::format(
            "evidence: with accumulation={} told to the recorder, the weights "
            "are {}{}'s (max {} of the uncertainty)\n",
            k, d.d <= 1 ? "" : "still not ", r.accepted, fmt_ratio(d.d));
        explained_by_k = d.d <= 1;
      }
      std::string failing;  // the failing checks, by name
      for (const auto& ck : r.checks)
        if (!ck.ok && ck.name != "weights")
          failing += (failing.empty() ? "" : ", ") + ck.name;
      if (f.structure_ok)
        r.diagnosis += fmt::format(
            "evidence: the weights are {}'s (max {} of the uncertainty); "
            "what fails: {}\n",
            r.accepted, fmt_ratio(f.correct_weights.d), failing);
      else if (!explained_by_k)
        for (const auto& line : contract_evidence(c, meas.W[0], meas.U[0],
                                                  accepted.P[0], K, r.accepted))
          r.diagnosis += "evidence: " + line + "\n";
      if (!f.lr_correct.ok)
        r.diagnosis += "evidence: " + f.lr_correct.evidence + "\n";
      if (!f.lr_correct.ok && !lr_name.empty())
        r.diagnosis += fmt::format("evidence: the lr matches {}\n", lr_name);
      if (!f.reduce_correct.empty())
        r.diagnosis += "evidence: all-reduce: " + f.reduce_correct + "\n";
      if (!s.clip.enabled && !c.clips.empty()) {
        // The trainer clips and the recorder was not told: correct with
        // that clip, for the evidence.
        Scenario clipped = s;
        clipped.clip.enabled = true;
        clipped.clip.max_norm = c.clips.front().max_norm;
        const Distance d =
            distance(meas, predict(cp, clipped, behavior_of({}), c), c);
        r.diagnosis += fmt::format(
            "evidence: with clip_grad_norm_(max_norm = {:.6g}) accepted, the "
            "weights are "
            "{}correct's (max {} of the uncertainty)\n",
            clipped.clip.max_norm, d.d <= 1 ? "" : "still not ",
            fmt_ratio(d.d));
      }
      r.diagnosis += fmt::format(
          "closest (not matching): {} at {} of the uncertainty ({})", names,
          fmt_ratio(best.distance),
          best.distance <= 1 ? "its weights match; what fails: " + failing
                             : best.first_out_what);
    }
    // Calls between steps that moved the optimizer, beside another
    // finding: said too.
    if (!f.idle_ok && !only_idle)
      for (const auto& ck : r.checks)
        if (ck.name == "calls without an update")
          r.diagnosis +=
              fmt::format("\nevidence: {} ({})", ck.message, f.idle_pitfall);
    if (!horizon_note.empty()) r.diagnosis += "\n" + horizon_note;
  }
  // What the recorder saw and reports (meta.csv's `notes`: e.g. a
  // backward that drew random numbers after its forward).
  if (const std::string notes = tr.meta_value("notes"); !notes.empty())
    r.diagnosis += (r.diagnosis.empty() ? "" : "\n") +
                   std::string("note (recorder): ") + notes;
}

}  // namespace accumcheck::contract_detail
