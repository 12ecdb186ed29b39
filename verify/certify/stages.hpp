// Internal to certify (verify/certify/certify.hpp): the stages of
// certify(), one file each in verify/certify/, called in this order by
// certify.cpp.
//
//   load.cpp     load and validate the trace (InputError, exit 2)
//   judge.cpp    the forced run of one semantics against the trace and
//                the accepted semantics' checks
//   rank.cpp     every candidate, ranked cheaply, the closest few judged
//                rigorously (in parallel)
//   pattern.cpp  the call pattern of the trace's events
//   report.cpp   verdict, diagnosis, text and JUnit
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "oracle/error_model.hpp"
#include "oracle/real.hpp"
#include "oracle/tracked.hpp"
#include "sim/data.hpp"
#include "sim/layout.hpp"
#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "verify/certify/certify.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::certify_detail {

// The float32 unit roundoff of the error model's one table.
inline constexpr double kU = error_model::kUnitRoundoff32;

// The rigorous bound's number types (CertifyConfig::bound_arith).
using TR = Tracked<BoundReal>;
using TD = Tracked<DD>;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A trace value as T (double: itself; a Tracked type: exact, bound 0).
template <class T>
T lift(double x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return T::exact(decltype(T::v)(x));  // exact: x is a trace value
}

// `v` as float32 (the trace's values, validated exact), in one buffer per
// thread that is kept: at 1M parameters a fresh vector per comparison is
// a fresh mmap of MBs faulted in every time.  Valid until the thread's
// next call.
template <class Values>  // std::vector<double> or TraceValues
const std::vector<float>& as_float(const Values& v) {
  thread_local std::vector<float> f;
  f.resize(v.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(v[i]);
  return f;
}
// `v` as doubles: its own, or decoded into one buffer per thread that is
// kept (as as_float's).  Valid until the thread's next call.
inline const std::vector<double>& as_double(const TraceValues& v) {
  thread_local std::vector<double> d;
  return v.doubles(d);
}

// ------------------------------------------------------------- load

struct LoadedTrace {
  Trace trace;
  const TraceRun* run = nullptr;
  std::vector<TraceStep> steps;
};

// Reads and validates the trace of `dir` for scenario `s` (InputError on
// anything malformed).
LoadedTrace load(const Scenario& s, const std::string& dir,
                 const CertifyConfig& cfg, const ParamLayout& layout);

// The trainer's own loss scale, to force on every semantics
// (TrainerOptions::forced_scale_exp): the exponent of each backward pass's
// scale from state.csv's loss_scale rows, when the scenario declares no
// loss scaling of its own ([precision] loss_scale: its Trainer's scaler is
// the model then) and the trace shows one: a scale other than 1 at some
// backward pass, every backward pass's scale recorded, each a power of
// two 2^e with |e| <= 62 (the exactly representable loss weights).
// Empty otherwise: the loss-scale pitfalls are then no candidates.  With
// the scales, the windows the trainer's scaler skipped for an inf/NaN
// (state.csv's skipped rows: the backward count after which each was
// skipped, TrainerOptions::forced_skip): the oracle, holding no float16 or
// float32 overflow, cannot find them itself; the recorder saw the
// gradient's inf/NaN and no optimizer step, and the state check judges
// what followed each (no scheduler step, the scaler's back-off).
struct TraceScaling {
  std::vector<int64_t> exps;
  std::vector<int64_t> skipped;  // sorted
};
TraceScaling trace_scaling(const Scenario& s, const LoadedTrace& L);

// DDP: every rank's parameters after each step must equal rank 0's bit
// for bit (all-reduced gradients and one optimizer give identical
// updates).  Adds the check "ranks agree" to the report when the trace
// holds values of more than one rank.
void check_ranks(const LoadedTrace& L, const ParamLayout& layout,
                 CertifyReport& r);

// ------------------------------------------------------------ judge

struct StepEval {
  bool seen = false;
  error_model::Comparison grad, param;
  // The trainer's recorded pre-clip norms (rank 0's clip calls of the
  // step, as its gradient is rank 0's) against the oracle's, within the
  // norm's bound; n = 0: no clip decision was forced at this step.
  error_model::Comparison norm;
  // Clip calls of the semantics with no recorded norm to force them: the
  // oracle's own norm decided (a trace without them, or a semantics that
  // clips where the trainer did not).
  int64_t unforced = 0;
  // Adam's recorded moments after the step against their replay from the
  // recorded ones before it (verify/certify/state_check.hpp, judge_moments); n
  // = 0: not judged (no moments recorded, or a run that does not judge them).
  error_model::Comparison exp_avg, exp_avg_sq;
};

struct Forced {
  int64_t steps = 0;
  std::vector<StepEval> eval;
  // Whether Adam's moments of the range's last step were found within the
  // bound (judge_moments), so that a whole run forces the next step's
  // moments from them.
  bool moments_trusted_last = false;
  // Whether the range took Adam's moments before it as the recorded ones
  // without rebuilding them (forced_run's assume_moments).
  bool assumed_moments = false;
};

// The trainer's recorded pre-clip total norms (events.csv: each clip
// row's grad_norm, clip_grad_norm_'s return), [step][rank][call], NaN
// where a row has none.
using ClipNorms = std::vector<std::vector<std::vector<double>>>;
ClipNorms clip_norms_of(const TraceRun& run, size_t steps);

// CertifyConfig::progress's count of one stage's judged steps.
struct StepProgress {
  const CertifyConfig* cfg = nullptr;
  const char* stage = "";
  int64_t total = 0;
  std::atomic<int64_t> done{0};
  void start(const char* name, int64_t steps) {
    stage = name;
    total = steps;
    done = 0;
  }
  void step() {
    if (cfg && cfg->progress) cfg->progress(stage, ++done, total);
  }
};

// Context shared by every forced run.
struct Ctx {
  const Scenario& s;
  const Dataset& data;
  const std::vector<float>& init;
  const Plan& plan;
  const ParamLayout& layout;
  const std::vector<TraceStep>& trace;
  bool fp64;
  StepRange range;      // the steps judged (end resolved: <= trace.size())
  BoundArith arith;     // the rigorous bound's numbers
  int threads;          // CertifyConfig::threads
  int64_t max_windows;  // window_cap()
  // The gradient bound's scale (CertifyConfig::autocast: bf16_bound_scale,
  // fp16_bound_scale; 1 otherwise).  Parameters keep the float32 bound.
  double grad_scale;
  const ClipNorms& clip_norms;  // clip_norms_of(the run, trace.size())
  // The trainer's loss scale per backward pass and its skipped windows
  // (trace_scaling; empty: the scenario's own scaling, if any).
  const std::vector<int64_t>& scale_exps;
  const std::vector<int64_t>& forced_skip;
  // Adam's recorded moments, judged at every judged step of a rigorous
  // run (the accepted semantics'); nullptr: not judged (the ranking).
  const struct RecordedMoments* moments = nullptr;
  // Counts each judged step (rank 0's) for CertifyConfig::progress.
  StepProgress* progress = nullptr;
};

// Windows after which a forced run stops (-1: none): with max_steps, a
// semantics that skips more than half the windows (never stepping, say)
// would otherwise walk every epoch of a long plan; cut off there it takes
// fewer steps than the trace, which is what it is.
int64_t window_cap(const Scenario& s, size_t trace_steps);

// The semantics `b` walked on the oracle over real type T (double: the
// cheap proxy; TR, TD: the rigorous Tracked bound), teacher-forced by the
// trace at every optimizer step, judging the steps of `range` only (the
// rest skipped, verify/certify/judge.cpp says how); one thread.
// assume_moments (a range after the first of judge_steps' split): where
// Adam's moments are judged and the step before the range has complete
// recorded ones, they are taken as a whole run would take them if they
// were within the bound there (force_moments), and the optimizer's state
// before the range is not rebuilt from step 0; the caller checks that
// assumption against the previous range (Forced::moments_trusted_last).
template <class T>
Forced forced_run(const Ctx& c, const Behavior& b, StepRange range,
                  bool assume_moments = false);
extern template Forced forced_run<double>(const Ctx&, const Behavior&,
                                          StepRange, bool);
extern template Forced forced_run<TR>(const Ctx&, const Behavior&, StepRange,
                                      bool);
extern template Forced forced_run<TD>(const Ctx&, const Behavior&, StepRange,
                                      bool);

// forced_run over c.range, split into contiguous step ranges judged on
// c.threads threads and put back together: the same result for every
// thread count.  rigorous: the Tracked bound in c.arith; else the cheap
// double proxy.
Forced judge_steps(const Ctx& c, const Behavior& b, bool rigorous);

struct Distance {
  double value = 0;
  int64_t first_out = -1;
  std::string first_out_what;
};

// Max over steps of err/bound (inf when the step counts differ).
Distance distance_of(const Forced& f, size_t trace_steps);

// The accepted semantics' checks: step count, every step's gradient,
// parameters and forced clip norms (r.checks, r.expected_steps), and a
// note for clip decisions the trace gave no norm to force.
void judge_accepted(const Forced& acc, CertifyReport& r);

// ------------------------------------------------------------- rank

// Every single pitfall and pair, deduplicated by behaviour, each with its
// cheap distance; r.ranking and `behaviors` are parallel.
void rank_cheap(const Ctx& ctx, const Behavior& accepted_b, CertifyReport& r,
                std::vector<Behavior>& behaviors);

// The closest few candidates judged with the Tracked bound, one after the
// other, each on every thread (judge_steps).
class Refiner {
 public:
  Refiner(const Ctx& ctx, const CertifyConfig& cfg, CertifyReport& r,
          const std::vector<Behavior>& behaviors, const Behavior& accepted_b)
      : ctx_(ctx),
        cfg_(cfg),
        r_(r),
        behaviors_(behaviors),
        accepted_b_(accepted_b) {}
  // Chooses the candidates to judge rigorously (once).
  void launch();
  // Judges them, records every distance (the accepted semantics' from
  // `acc`) and sorts r.ranking, best first.
  void finish(const Forced& acc);

 private:
  const Ctx& ctx_;
  const CertifyConfig& cfg_;
  CertifyReport& r_;
  const std::vector<Behavior>& behaviors_;
  const Behavior& accepted_b_;
  bool launched_ = false;
  std::vector<size_t> jobs_;  // indices into r.ranking
};

// ---------------------------------------------------------- pattern

// Per optimizer step: forward_backward, zero_grad, clip, optimizer_step,
// scheduler_step and all_reduce calls.  With R > 1 ranks the pattern is
// rank 0's calls and the collectives: ranks run in lockstep, and a rank
// that does not shows in its parameters.
using Counts = std::array<int64_t, 6>;
using Pattern = std::vector<Counts>;

struct PatternCheck {
  // The trace's pattern (when checked), one per rank: rank r's own calls
  // and the collectives (rank -1).
  std::vector<Pattern> trace;
  bool ignore_sched = false;  // scheduler calls not counted
  int64_t max_windows = -1;   // window_cap()
  // The trace's all-reduces differ from the accepted semantics' in number
  // (DDP's gradient collectives: their cost is the damage, never a note).
  bool collectives_differ = false;
};

// Checks the trace's call pattern against the accepted semantics when the
// run has events (r.pattern_*, one check appended).
PatternCheck check_pattern(const Scenario& s, const Plan& plan,
                           const TraceRun& run, const Behavior& accepted_b,
                           int64_t max_windows, CertifyReport& r);

// A call pattern that differs from the accepted semantics' only as a
// performance-only pitfall's does (sim/pitfalls.hpp
// pitfall_performance_only: the trace's pattern is that of the accepted
// pitfalls plus it): the finding naming it and the collectives it costs
// (the trace's against the accepted semantics'); "" when none explains
// the difference.  The caller has checked the values.
std::string performance_finding(const Scenario& s, const Plan& plan,
                                const PatternCheck& pc,
                                const std::string& accepted);

// Marks the candidates whose call pattern is the trace's.
void mark_pattern_matches(const Scenario& s, const Plan& plan,
                          const PatternCheck& pc,
                          const std::vector<Behavior>& behaviors,
                          CertifyReport& r);

// ----------------------------------------------------------- report

std::string ratio_text(double r);

// The verdict line (and, on FAIL, nothing else).
void verdict_of(const Forced& acc, const Distance& acc_d, CertifyReport& r);

// The diagnosis lines of a FAIL (after Refiner::finish).
void diagnose(const Forced& acc, const Distance& acc_d, CertifyReport& r);

}  // namespace accumcheck::certify_detail
