// certify, stage 5: the verdict, the diagnosis, and the report as text
// and JUnit XML (verify/certify/stages.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "verify/certify/markup.hpp"
#include "verify/certify/stages.hpp"
#include "verify/certify/state_check.hpp"

namespace accumcheck {
std::string certify_moments_note(const CertifyReport& r) {
  if (r.moment_steps == 0) return "";
  return fmt::format(
      "Adam's moments (exp_avg, exp_avg_sq) replayed from the recorded ones "
      "and judged at {} step(s): max error {} of the bound",
      r.moment_steps, certify_detail::ratio_text(r.moment_worst));
}

std::string certify_unforced_note(const CertifyReport& r) {
  const std::vector<int64_t>& u = r.unforced_steps;
  if (u.empty()) return "";
  std::string steps;
  for (size_t i = 0; i < u.size() && i < 5; ++i)
    steps.append(fmt::format("{}{}", i ? ", " : "", u[i]));
  if (u.size() > 5) steps.append(", ...");
  return fmt::format(
      "clip: at {} step(s) ({}) {} clips where the trace records no "
      "pre-clip norm to force the decision: the oracle's own norm decided "
      "it",
      u.size(), steps, r.accepted);
}

std::string certify_precision_note(const CertifyReport& r) {
  if (r.autocast.empty()) return "";
  return fmt::format(
      "--precision {}: gradients within {:.3g} of their bound (the float32 "
      "bound x {:g}, error_model's {}_bound_scale), i.e. {:.3g} x the "
      "float32 bound; parameters judged with the float32 bound",
      r.autocast, r.grad_worst, r.grad_scale, r.autocast,
      r.grad_worst * r.grad_scale);
}

namespace certify_detail {

std::string ratio_text(double r) {
  if (std::isinf(r)) return "inf";
  return fmt::format("{:.3g}", r);
}

}  // namespace certify_detail

std::string certify_pass_verdict(const CertifyReport& r, double max_ratio) {
  // A part (certify --steps) names its steps.
  const bool part = r.steps.begin != 0 || r.steps.end != r.trace_steps;
  std::string wrong;  // checks of their own that failed (the logged loss)
  for (const CertifyCheck& c : r.checks)
    if (!c.ok && c.separate)
      wrong.append(fmt::format(
          "; but the {} is wrong (a check of its own, not training's)",
          c.name));
  return fmt::format(
      "PASS: {} within the bound of {} (max error {} of bound){}",
      part ? fmt::format("steps {}:{} of {}", r.steps.begin, r.steps.end,
                         r.trace_steps)
           : fmt::format("{} steps", r.trace_steps),
      r.accepted, certify_detail::ratio_text(max_ratio), wrong);
}

namespace certify_detail {

void verdict_of(const Forced& acc, const Distance& acc_d, CertifyReport& r) {
  r.pass =
      std::all_of(r.checks.begin(), r.checks.end(),
                  [](const CertifyCheck& c) { return c.ok || c.separate; });
  double worst = 0;
  for (const StepEval& ev : acc.eval)
    if (ev.seen)
      worst = std::max({worst, ev.norm.max_ratio, ev.grad.max_ratio,
                        ev.param.max_ratio, ev.exp_avg.max_ratio,
                        ev.exp_avg_sq.max_ratio});
  r.max_ratio = worst;
  if (r.pass) {
    r.verdict = certify_pass_verdict(r, worst);
    if (!r.pattern_checked) r.verdict.append("; " + r.pattern_message);
  } else {
    std::string why;
    if (acc.steps != r.trace_steps)
      why = fmt::format("the trace has {} optimizer steps, {} takes {}",
                        r.trace_steps, r.accepted, acc.steps);
    else if (acc_d.first_out >= 0)
      why = fmt::format("{} leaves the bound at step {} ({})", r.accepted,
                        acc_d.first_out, acc_d.first_out_what);
    else
      for (const CertifyCheck& c : r.checks)
        if (!c.ok && !c.separate) {
          why = c.message;
          break;
        }
    r.verdict = fmt::format("FAIL: {}", why);
    if (!r.pattern_checked) r.verdict.append("; " + r.pattern_message);
  }
}

void diagnose(const Forced& acc, const Distance& acc_d, CertifyReport& r) {
  const CertifyCandidate& best = r.ranking.front();
  auto full_name = [](const CertifyCandidate& c) {
    std::string n = c.name;
    for (const std::string& a : c.aliases) n.append(" = ").append(a);
    return n;
  };
  auto inert_text = [](const CertifyCandidate& c) {
    std::string n;
    for (const std::string& a : c.inert) {
      n.append(n.empty() ? "" : ", ").append(a);
    }
    return n.empty() ? n
                     : fmt::format(" (inert here, so equally close: +{})", n);
  };
  std::vector<const CertifyCandidate*> ties;
  for (const CertifyCandidate& c : r.ranking)
    if (c.tracked && (c.distance == best.distance ||
                      (c.distance <= 1 && best.distance <= 1)))
      ties.push_back(&c);
  // Tied on the values, told apart by the call pattern: the candidates
  // whose pattern is the trace's first.
  if (r.pattern_checked && !r.pattern_ok)
    std::stable_partition(
        ties.begin(), ties.end(),
        [](const CertifyCandidate* c) { return c->pattern_matches; });
  std::string d;
  if (best.distance <= 1) {
    if (ties.size() > 1) {
      d = "matches, tied (all within the bound): ";
      for (size_t i = 0; i < ties.size(); ++i) {
        if (i) d.append(" | ");
        d.append(fmt::format("{} (max error {} of bound)", full_name(*ties[i]),
                             ratio_text(ties[i]->distance)));
      }
    } else {
      d = fmt::format("matches {} (max error {} of bound){}", full_name(best),
                      ratio_text(best.distance), inert_text(best));
    }
  } else {
    // No candidate within its bound: say so first, then the model-free
    // evidence, then the candidates, marked as not matching.
    d = "no modelled pitfall explains this trace";
    for (const std::string& e : r.evidence) d.append("\nevidence: ").append(e);
    d.append(fmt::format(
        "\ncandidates (none matching): closest {} (max error {} of "
        "bound{})",
        full_name(best), ratio_text(best.distance),
        best.first_out >= 0
            ? fmt::format(", first leaves it at step {}", best.first_out)
            : std::string()));
  }
  if (acc_d.first_out >= 0)
    d.append(fmt::format("; {} leaves the bound at step {} ({})", r.accepted,
                         acc_d.first_out, acc_d.first_out_what));
  else if (acc.steps != r.trace_steps)
    d.append(fmt::format("; {} takes {} steps, the trace {}", r.accepted,
                         acc.steps, r.trace_steps));
  // Margin: the runner-up that is not tied.
  for (const CertifyCandidate& c : r.ranking)
    if (std::find(ties.begin(), ties.end(), &c) == ties.end() && &c != &best) {
      d.append(fmt::format("\nmargin: next is {} at {} of bound{}", c.name,
                           ratio_text(c.distance),
                           c.tracked ? "" : " (cheap proxy bound)"));
      if (best.distance > 0 && std::isfinite(c.distance))
        d.append(fmt::format(" ({}x the best)",
                             ratio_text(c.distance / best.distance)));
      break;
    }
  // The checks of their own that failed: order and coverage, lr.
  for (const CertifyCheck& c : r.checks)
    if (!c.ok && (c.name == "order and coverage" || c.name == "lr") &&
        d.find(c.message) == std::string::npos)
      d.append("\n").append(c.message);
  if (r.pattern_checked) {
    d.append("\n").append(r.pattern_message);
    if (!r.pattern_ok) {
      std::string m;
      for (const CertifyCandidate& c : r.ranking)
        if (c.pattern_matches) {
          if (!m.empty()) m.append(", ");
          m.append(c.name);
        }
      d.append(fmt::format("; the trace's call pattern is that of: {}",
                           m.empty() ? std::string("no candidate") : m));
    }
  }
  r.diagnosis = d;
}

}  // namespace certify_detail

using certify_detail::is_state_check;
using certify_detail::ratio_text;

std::string certify_text(const CertifyReport& r, int top) {
  std::string o = fmt::format(
      "certify {}: run '{}' ({}, {}), {} optimizer steps; accepted semantics "
      "{} takes {}\n",
      r.scenario, r.run, r.engine, r.precision, r.trace_steps, r.accepted,
      r.expected_steps);
  o.append(r.verdict).append("\n");
  for (const CertifyCheck& c : r.checks)
    if (!c.performance.empty()) o.append(c.performance).append("\n");
  for (const std::string& n : r.notes)
    o.append("note: ").append(n).append("\n");
  for (const CertifyCheck& c : r.checks)
    if (is_state_check(c.name))
      o.append(fmt::format("{} {}: {}\n", c.ok ? "ok  " : "FAIL", c.name,
                           c.message));
  if (r.pass) {
    for (const CertifyCheck& c : r.checks)
      if (c.name == "order and coverage" || c.name == "lr")
        o.append(c.message).append("\n");
    if (r.pattern_checked && r.pattern_ok)
      o.append(r.pattern_message).append("\n");
    return o;
  }
  for (const CertifyCheck& c : r.checks)
    if (!c.ok && !c.separate) {
      o.append("first failing check: ").append(c.message).append("\n");
      break;
    }
  o.append("diagnosis: ").append(r.diagnosis).append("\n");
  if (r.ranking.empty()) return o;
  o.append(
      "ranking (distance = max over steps of error/bound; * = rigorous "
      "Tracked bound, else the cheap proxy):\n");
  for (size_t i = 0; i < r.ranking.size() && int(i) < top; ++i) {
    const CertifyCandidate& c = r.ranking[i];
    std::string name = c.name;
    for (const std::string& a : c.aliases) name.append(" = ").append(a);
    if (!c.inert.empty()) {
      // Single pitfalls that change nothing here are named; pairs of
      // them are only counted (they would bury the ranking).
      name.append("  [+ inert here:");
      size_t pairs = 0;
      for (const std::string& a : c.inert) {
        if (a.find('+') != std::string::npos) {
          ++pairs;
          continue;
        }
        name.append(" ").append(a);
      }
      if (pairs) name.append(fmt::format(" and {} pairs of them", pairs));
      name.append("]");
    }
    o.append(fmt::format("  {:2}. {:<10}{} {}{}{}\n", i + 1,
                         ratio_text(c.distance), c.tracked ? "*" : " ", name,
                         std::isinf(c.distance)
                             ? fmt::format(" ({} steps)", c.steps)
                             : std::string(),
                         c.distance > 1 ? "  (not matching)" : ""));
  }
  return o;
}

std::string certify_junit(const CertifyReport& r) {
  int64_t failures = 0;
  for (const CertifyCheck& c : r.checks) failures += c.ok ? 0 : 1;
  std::string o = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o.append(fmt::format(
      "<testsuites>\n<testsuite name=\"accumcheck certify {}\" tests=\"{}\" "
      "failures=\"{}\" errors=\"0\" time=\"{:.3f}\">\n",
      xml_escape(r.scenario), r.checks.size(), failures, r.seconds));
  const std::string cls = xml_escape("accumcheck.certify." + r.scenario);
  for (const CertifyCheck& c : r.checks) {
    o.append(fmt::format("  <testcase classname=\"{}\" name=\"{}\"", cls,
                         xml_escape(c.name)));
    if (c.ok && !c.skipped && c.performance.empty()) {
      o.append("/>\n");
      continue;
    }
    o.append(">\n");
    if (c.ok && !c.skipped) {  // passing, with a performance finding
      o.append(
          fmt::format("    <properties><property name=\"performance\" "
                      "value=\"{}\"/></properties>\n"
                      "    <system-out>{}</system-out>\n  </testcase>\n",
                      xml_escape(c.performance), xml_escape(c.performance)));
      continue;
    }
    if (c.skipped)
      o.append(fmt::format("    <skipped message=\"{}\"/>\n",
                           xml_escape(c.message)));
    else
      o.append(fmt::format(
          "    <failure message=\"{}\">{}</failure>\n", xml_escape(c.message),
          xml_escape(r.diagnosis.empty() ? c.message : r.diagnosis)));
    o.append("  </testcase>\n");
  }
  o.append("</testsuite>\n</testsuites>\n");
  return o;
}

}  // namespace accumcheck
