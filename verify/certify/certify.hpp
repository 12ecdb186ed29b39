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
// The plan judged on is the one the trainer drew (verify/certify/drawn.hpp: its
// own order and loader, from the trace's sample ids), with an "order and
// coverage" check of its own; each step's lr is judged against the
// accepted schedule ("lr", verify/certify/lr_channel.hpp).  A trace whose
// recorder reports something it could not see (meta.csv `unseen`) and that
// would FAIL is refused (InputError, exit 2) naming what was not seen.
//
// Verdict: PASS when the accepted semantics stays within the bound at
// every step and the step counts match.  A clip decision is never left
// open: the trainer's own pre-clip norm (each clip row's grad_norm in
// events.csv, clip_grad_norm_'s return) is judged against the oracle's
// within the norm's bound (the check "step t clip norm"), and it forces
// the decision and the factor clamp(c/(norm + 1e-6), max = 1), so the
// clipped gradient is predicted as the trainer computed it and judged
// against the gradient's bound.  (Left to the oracle's norm, a decision
// within the bound of the threshold could go either way: under bf16
// autocast every one does.)
//
// Diagnosis (on FAIL): every single pitfall and every pair, deduplicated
// by behaviour (sim/pitfalls.hpp), is ranked by distance to the trace =
// max over steps of err/bound (infinite on a step-count mismatch).  All
// candidates are ranked first with a double-precision oracle and a proxy
// bound (64 u |v|, cheap); the accepted semantics and the closest few are
// then judged with the Tracked bound, whose distances are the ones
// reported.  The events table, when it has rows, is checked for the call
// pattern (per optimizer step: backward, zero_grad, clip, step and
// scheduler calls) against the accepted semantics and every candidate.
// A PASS needs no ranking and computes none.
//
// At scale (issue 14): the Tracked bound is computed in double-double by
// default (oracle/dd.hpp; BoundArith::mpfr: 40-digit MPFR, ~50x slower,
// the same verdicts).  Steps are judged on every core: teacher forcing
// makes each step depend on the trace only, so a run judges a range of
// steps by skipping the forward and backward passes before it (the
// optimizer still steps on the trace's gradients when it keeps state, so
// its state at the range's start is bit for bit a whole run's); the
// ranges are put back together in step order, and the report is the same
// for every thread count.  A range can also be judged alone (a CI matrix:
// CertifyConfig::steps, merged by verify/certify/parts.hpp).
//
// The trace is validated before any judging (InputError, exit 2, with
// file:line): steps 0, 1, 2, ... in values.csv; in events.csv every row's
// step is the number of optimizer_step rows before it and there is one
// optimizer_step row per step of values.csv.  A run with no events rows is
// refused (a recorder always writes them: such a trace is broken or
// altered) unless CertifyConfig::values_only asks for its values alone;
// then the verdict line, the text and the JUnit report (a skipped
// testcase) say that the call pattern was NOT checked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

// A half-open range of optimizer steps [begin, end); end < 0: to the end.
struct StepRange {
  int64_t begin = 0;
  int64_t end = -1;
  bool whole() const { return begin == 0 && end < 0; }
  bool contains(int64_t step) const {
    return step >= begin && (end < 0 || step < end);
  }
};

// The numbers the Tracked float32 bound is computed in: double-double
// (oracle/dd.hpp, the default: ~50x faster) or 40-digit MPFR.  Both give
// the same verdicts; their bounds agree to error_model's dd_bound_rel.
enum class BoundArith { dd, mpfr };

struct CertifyConfig {
  std::string run;    // run to judge; "" = the only or the last run
  bool fp64 = false;  // the trainer computes in float64
  // A run without events.csv rows is judged on its values alone, the call
  // pattern NOT checked (`certify --values-only`); false: refused
  // (InputError naming events.csv and the run).
  bool values_only = false;
  // The trainer's forward and backward run in a lower precision (bf16,
  // fp16 autocast): the gradient bound (and the clip decisions, the
  // BatchNorm statistics, the logged loss) scaled by error_model's
  // bf16_bound_scale / fp16_bound_scale; the optimizer step stays float32.
  // "" for float32 / float64.
  std::string autocast;
  BoundArith bound_arith = BoundArith::dd;
  // Threads that judge steps (teacher forcing makes steps independent:
  // each thread takes a contiguous range of steps); 0: every core.  The
  // report is the same for every count.
  int threads = 0;
  // Judge only these optimizer steps (a part of a CI matrix, merged by
  // certify_merge, verify/certify/parts.hpp); the step count and the call
  // pattern are checked whole.
  StepRange steps;
  // Candidates judged with the Tracked bound beyond the accepted semantics
  // (the rest keep their cheap proxy distance, marked as such); each is
  // judged on `threads` threads.  Not tied to `threads`, so the report
  // does not depend on it.
  int refine = std::max(3, int(std::thread::hardware_concurrency()) - 1);
  // Told while steps are judged: the stage ("judging" the accepted
  // semantics, "ranking" every candidate on a FAIL, "refining" the
  // closest), the steps judged in it so far (every run's judged steps
  // count) and its total.  Called from the judging threads at every
  // step: thread-safe and cheap (the command line prints at most five
  // lines a second, on a terminal).  Empty: nothing is told.
  std::function<void(std::string_view stage, int64_t done, int64_t total)>
      progress;
};

// One check (a JUnit testcase).
struct CertifyCheck {
  // "step count", "step 3 clip norm", "step 3 gradient", "call pattern"
  std::string name;
  bool ok = true;
  bool skipped = false;  // could not run (no events): not failed, said so
  std::string message;   // summary (error_model::Comparison::summary())
  // Step checks: the optimizer step, "clip norm", "gradient" or
  // "parameters", and max err / bound per tensor (the report's heat strip).
  int64_t step = -1;
  std::string kind{};
  std::vector<std::pair<std::string, double>> tensor_ratio{};
  // Judged on its own, never part of training's verdict (the logged loss):
  // a failure is reported, the exit code stays that of training.
  bool separate = false;
  // A passing check's performance finding (a performance-only pitfall,
  // sim/pitfalls.hpp: the same values at more cost): "performance: ID
  // (story): what it costs"; printed with the verdict, and the JUnit
  // testcase's system-out.  "" when none.
  std::string performance{};
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
  std::vector<CertifyCheck> checks;       // of the accepted semantics
  std::vector<CertifyCandidate> ranking;  // best first (FAIL only)
  bool pattern_checked = false, pattern_ok = true;
  std::string pattern_message;
  std::string verdict;    // one line
  std::string diagnosis;  // lines (FAIL only)
  // Notes: what was not checked, call-pattern differences that change no
  // value, what the recorder noted (meta.csv `notes`).
  std::vector<std::string> notes;
  // FAIL with no candidate within its bound: the model-free evidence
  // (verify/certify/evidence.hpp), printed after "no modelled pitfall explains
  // this trace".
  bool unexplained = false;
  std::vector<std::string> evidence;
  double seconds = 0;
  StepRange steps;       // the steps judged (end resolved)
  double max_ratio = 0;  // accepted: max error/bound over judged steps
  // Adam's moments judged with the steps (judge_moments): at how many
  // judged steps, and their max error/bound (certify_moments_note).
  int64_t moment_steps = 0;
  double moment_worst = 0;
  // Judged steps where the accepted semantics clipped with no recorded
  // pre-clip norm to force the decision (certify_unforced_note).
  std::vector<int64_t> unforced_steps;
  // --precision bf16/fp16 (CertifyConfig::autocast; "" otherwise): the
  // gradient bound's scale and the gradients' max error/bound under it
  // (certify_precision_note).
  std::string autocast;
  double grad_scale = 1;
  double grad_worst = 0;
  int64_t first_out = -1;  // accepted: first judged step outside the bound
};

// The PASS verdict line (certify and certify_merge share it).
std::string certify_pass_verdict(const CertifyReport& r, double max_ratio);
// The note on r.moment_steps and r.moment_worst ("" when none judged): one
// certify's, and certify-merge's over the parts.
std::string certify_moments_note(const CertifyReport& r);
// The note on r.unforced_steps ("" when none), likewise.
std::string certify_unforced_note(const CertifyReport& r);
// The note on the autocast bound's use ("" without --precision bf16/fp16),
// likewise.
std::string certify_precision_note(const CertifyReport& r);

// Reads and validates the trace (InputError on anything malformed,
// including a digest that is not the scenario's), then judges it.
CertifyReport certify(const Scenario& s, const std::string& trace_dir,
                      const CertifyConfig& config = {});

// The report as JUnit XML: one testcase per check.
std::string certify_junit(const CertifyReport& r);

// The report as text: verdict, failure, diagnosis, ranking (top n).
std::string certify_text(const CertifyReport& r, int top = 5);

}  // namespace accumcheck
