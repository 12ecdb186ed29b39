// `accumcheck certify`: judge an outside trainer's trace against a
// scenario, step by step and teacher-forced (DESIGN.md section 7).
//
// For a semantics (correct, a pitfall, a pair of pitfalls) the one
// Trainer walks the scenario's plan on the oracle with step hooks: before
// each optimizer step the oracle's accumulated gradient (computed from the
// trace's own parameters) is compared with the trace's gradient and then
// replaced by it, so optimizer state is rebuilt from the trace's
// gradients; after the step the oracle's parameters are compared with the
// trace's and reset to them.  Comparisons use error_model::compare() with
// the Tracked float32 bound (fp32), or that bound scaled by 2^-29 =
// u64/u32 for float64 trainers (fp64: every rounding of the float32 model
// becomes one of double; hyperparameters are exact in double, so scaling
// their float32 rounding too is conservative).
//
// Verdict: PASS when the accepted semantics stays within the bound at
// every step and the step counts match.  A step whose clip decision lies
// within the bound of the threshold (coef = c/(norm + 1e-6) within its
// bound of 1) is ambiguous: reported, never failed on.
//
// Diagnosis (on FAIL): every single pitfall and every pair, deduplicated
// by behaviour (sim/pitfalls.hpp), is ranked by distance to the trace =
// max over steps of err/bound (infinite on a step-count mismatch).  All
// candidates are ranked first with a double-precision oracle and a proxy
// bound (64 u |v|, cheap); the accepted semantics and the closest few are
// then judged with Oracle<Tracked<OracleReal>>, whose distances are the
// ones reported.  The events table, when it has rows, is checked for the
// call pattern (per optimizer step: backward, zero_grad, clip, step and
// scheduler calls) against the accepted semantics and every candidate.
//
// The trace is validated before any judging (InputError, exit 2, with
// file:line): steps 0, 1, 2, ... in values.csv; in events.csv every row's
// step is the number of optimizer_step rows before it and there is one
// optimizer_step row per step of values.csv.  A run with no events rows is
// judged on its values alone: the verdict line, the text and the JUnit
// report (a skipped testcase) say that the call pattern was NOT checked.
#pragma once

#include <cstdint>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

struct CertifyConfig {
  std::string run;    // run to judge; "" = the only or the last run
  bool fp64 = false;  // the trainer computes in float64
  // Candidates judged with the Tracked bound beyond the accepted semantics,
  // run in parallel with it: one round on this machine's cores (the rest
  // keep their cheap proxy distance, marked as such).
  int refine = std::max(1, int(std::thread::hardware_concurrency()) - 1);
};

// One check (a JUnit testcase).
struct CertifyCheck {
  std::string name;  // "step count", "step 3 gradient", "call pattern"
  bool ok = true;
  bool ambiguous = false;  // a clip decision within the bound: not failed
  bool skipped = false;    // could not run (no events): not failed, said so
  std::string message;     // summary (error_model::Comparison::summary())
};

struct CertifyCandidate {
  std::string name;  // "correct", "a", "a+b"
  std::vector<Pitfall> pitfalls;
  std::vector<std::string> aliases;  // the same behaviour under other names
  // Pitfalls that change nothing on this scenario when added to this
  // candidate (the pair gave bitwise the same cheap distance); folded in.
  std::vector<std::string> inert;
  int64_t steps = 0;       // optimizer steps it takes
  double proxy = 0;        // double-precision proxy distance
  bool tracked = false;    // distance below is Tracked's
  double distance = 0;     // max err/bound over steps (inf: step counts differ)
  int64_t first_out = -1;  // first step outside the bound
  std::string first_out_what;    // "gradient 0.weight[3]" ...
  bool pattern_matches = false;  // its call pattern equals the trace's
};

struct CertifyReport {
  std::string scenario, run, engine, precision, accepted;
  int64_t trace_steps = 0, expected_steps = 0;
  bool pass = false;
  std::vector<CertifyCheck> checks;  // of the accepted semantics
  std::vector<int64_t> ambiguous_steps;
  std::vector<CertifyCandidate> ranking;  // best first (FAIL only)
  bool pattern_checked = false, pattern_ok = true;
  std::string pattern_message;
  std::string verdict;    // one line
  std::string diagnosis;  // lines (FAIL only)
  double seconds = 0;
};

// Reads and validates the trace (InputError on anything malformed,
// including a digest that is not the scenario's), then judges it.
CertifyReport certify(const Scenario& s, const std::string& trace_dir,
                      const CertifyConfig& config = {});

// The report as JUnit XML: one testcase per check.
std::string certify_junit(const CertifyReport& r);

// The report as text: verdict, failure, diagnosis, ranking (top n).
std::string certify_text(const CertifyReport& r, int top = 5);

}  // namespace accumcheck
