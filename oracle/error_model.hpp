// The error model: the one place where float32 tolerances come from.
//
//  - The constants below pin what the device's own math functions promise
//    (gpu/ tests verify them); oracle/tracked.hpp turns them, with the
//    rounding rules derived there, into a per-element bound that
//    Oracle<Tracked<OracleReal>> carries through one pass.
//  - compare() is the one comparison of a float32 result against a
//    Tracked oracle result, reused by tests, properties and certify.
//  - kTolerances is the one table of every other tolerance, with reasons.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "oracle/dd.hpp"
#include "sim/layout.hpp"
#include "sim/scenario.hpp"

namespace accumcheck::error_model {

// Unit roundoff of float32 (round to nearest): u = 2^-24.
inline constexpr double kUnitRoundoff32 = 1.0 / 16777216.0;

// Accuracy promised by gpu/device_math.hpp for finite inputs, in units of
// u, verified against the oracle in tests/device_math_test.cpp:
//   |exp~(x) - exp(x)|   <= kExpUlp  * u * exp(x)        (|x| <= 87)
//   |tanh~(x) - tanh(x)| <= kTanhUlp * u * |tanh(x)|
//   |erf~(x) - erf(x)|   <= kErfUlp  * u * |erf(x)|
//   |log~(x) - log(x)|   <= kLogUlp  * u * max(1, |log(x)|)   (x > 0)
inline constexpr double kExpUlp = 8;
inline constexpr double kTanhUlp = 8;
inline constexpr double kErfUlp = 8;
inline constexpr double kLogUlp = 8;

// Every tolerance that is not derived by Tracked, with its reason.
struct Tolerance {
  std::string_view name;
  double value;
  std::string_view reason;
};

inline constexpr Tolerance kTolerances[] = {
    {"bound_slack", 1.0,
     "float32 vs Tracked oracle: the bound is rigorous (first order with "
     "the second-order terms kept), so a float32 result must lie within "
     "it, no slack; bound 0 means exact equality"},
    {"bound_min_use", 1e-4,
     "a test of the bound is only meaningful if it is not absurdly loose: "
     "somewhere the error must use at least this fraction of it"},
    {"bound_tightness", 0.25,
     "where float32 rounding is at its worst (every addition of a "
     "reduction rounding the same way, tests/error_model_adversarial_test) "
     "the error must use at least a quarter of the reduction bound "
     "gamma_n sum|terms|; those cases use about 0.998 of it, so a bound "
     "inflated by more than 4x fails"},
    {"fd_step", 1e-20,
     "central finite differences in the 50-digit oracle: truncation "
     "O(h^2) ~ 1e-40, cancellation ~ 1e-50/h = 1e-30"},
    {"fd_rel", 1e-15,
     "backward vs finite difference (relative to the gradient's max norm): "
     "far above both error terms of fd_step, far below any real bug"},
    {"oracle_rel_digits_margin", 10,
     "oracle vs oracle on equal-in-real-arithmetic runs (DESIGN.md 6.1): "
     "relative error below 10^-(digits - 10): trajectories of thousands "
     "of operations each rounding at 10^-digits"},
    {"fp64_bound_scale", 1.0 / 536870912.0,
     "certify --precision fp64: the float32 bound scaled by u64/u32 = "
     "2^-53/2^-24 = 2^-29 (same formulas, float64 rounding; not derived "
     "per operation like the float32 bound)"},
    {"bf16_bound_scale", 3.0 * 65536.0,
     "certify --precision bf16 (torch.autocast bfloat16): the forward's and "
     "backward's float32 bound scaled by u_bf16/u32 = 2^-8/2^-24 = 2^16 "
     "(the same formulas with bfloat16's rounding: autocast rounds every "
     "Linear's output and its gradients to bfloat16) times 3: autocast "
     "also rounds both factors of each product (input and weight cast to "
     "bfloat16, 2 roundings per term) on top of a dot product's n >= 1 "
     "roundings, at most 3x them; the optimizer step stays float32 and "
     "keeps the float32 bound"},
    {"fp16_bound_scale", 3.0 * 8192.0,
     "certify --precision fp16: as bf16_bound_scale with u_fp16 = 2^-11 "
     "(2^13 u32), times 3 for the casts of both factors; float16's "
     "underflow (subnormals below 2^-14) is not covered: a loss scale "
     "keeps gradients above it"},
    {"state_ema_ulps", 5.0,
     "certify's EMA check: an update e = d*e_prev + (1-d)*p in float32, "
     "replayed in float64 from the recorded e_prev and parameters: d and "
     "1-d rounded to float32 (1 u each), two products (1 u each) and the "
     "sum (1 u), so |e - e64| <= 5 u32 (d|e_prev| + (1-d)|p|) to first "
     "order (the second-order terms are below 2^-40 of it)"},
    {"logged_loss_ulps", 4.0,
     "certify's logged-loss check: the Tracked bound of the window's summed "
     "item losses covers the forward; the trainer's scaling of each "
     "micro-batch's loss (a division and a multiplication by constants "
     "rounded to float32, DESIGN.md 'three roundings') and its summation "
     "add at most 4 u32 of each micro-batch's term"},
    {"dd_bound_rel", 1e-10,
     "the Tracked bound in double-double (certify --bound-arith dd) vs in "
     "50-digit MPFR, relative to the MPFR bound, for values and bounds: "
     "DD values round at ~2^-104 per operation; DD bounds of +, *, / are "
     "formed in double and rounded up by (1 + 2^-49) per operation, which "
     "compounds to ~1e-13 over the ~100 operations of a pass; the "
     "reductions add their own error bound (n^2 2^-104 sum|terms|); far "
     "below this and far below any decision"},
    {"certify_proxy_ulps", 64,
     "certify's cheap ranking pass (double oracle, no Tracked bound): a "
     "candidate is scored against 64 u (|v| + 2^-10 max|v|), generous "
     "enough that a candidate inside the real bound scores below 1; only "
     "orders the candidates, never decides PASS or FAIL"},
    {"lr_channel_rel", 8.0 / 9007199254740992.0,
     "certify's lr channel: the lr a trainer read from its optimizer vs the "
     "accepted schedule, both double and the same formula (LambdaLR: "
     "base_lr * S(n)); 8 u64 covers a different libm's cos (1 ulp) and the "
     "multiplications, far below any lr mistake (a whole schedule step)"},
    {"lr_channel_rel_float32", 8.0 / 16777216.0,
     "certify's lr channel for a trainer that holds its lr in float32 "
     "(meta.csv lr_precision = float32: optax's inject_hyperparams, a Keras "
     "optimizer's learning_rate variable): the schedule evaluated in float32 "
     "(a division, a product, a max: each one rounding) and the lr stored "
     "rounded once more, against the schedule in double; 8 u32 covers them, "
     "far below any lr mistake (a whole schedule step)"},
    {"lr_channel_abs_float32", 16.0 / 16777216.0,
     "certify's lr channel for a schedule evaluated in float32 (meta.csv "
     "lr_precision = float32), beside lr_channel_rel_float32: an absolute "
     "allowance in units of the base lr, for the float32 formula's "
     "cancellation near a decay's end.  optax's and Keras's cosine decay "
     "0.5 (1 + cos(pi t / T)): the argument rounded 3 times (3 u of at "
     "most pi: 9.4 u of cos), cos's own 2 u, 1 + cos rounded (2 u), then "
     "the alpha mix and the base lr (3 u): 12 u of the base lr, which at "
     "t = 7T/8 is 315 u of the lr (measured: 20 u32 of the lr, 0.75 u32 "
     "of the base lr, at step 9 of a Flax NNX run's warmup-2, total-10 "
     "optax cosine, past the 8 u32 of lr_channel_rel_float32); a linear "
     "decay init + (end - init) t / T 4 u.  16 u covers both; every lr mistake "
     "certify tells apart (K x, "
     "one step ahead, a horizon in micro-batches) differs by a whole "
     "schedule step, thousands of u of the base lr but at a decay's last "
     "steps"},
    {"evidence_weight_rel", 1e-3,
     "certify's model-free evidence: a micro-batch weight fitted by least "
     "squares from float32 gradients (relative error ~1e3 u32 at worst) is "
     "read as a simple fraction (m/N_w, 1/(K*b_k), 1/b_k) when within 1e-3 "
     "of it; the fractions certify tells apart differ by far more"},
    {"contract_fit_calibration", 4.0,
     "contract tier: a captured backward gradient c_b fitted as w*g_j (g_j "
     "the float32 backward of the summed loss, from the trainer's own "
     "forward or a recompute on a copy) leaves a relative residual of the "
     "order of the float32-vs-float64 difference cal_j of g_j (calibrated "
     "on every 16th micro-batch; the run's largest stands for the others: "
     "a sample's maximum never exceeds the whole run's, so sampling can "
     "only tighten the bound, never hide a weight); two float32 "
     "evaluations (c_b and g_j) each ~cal_j from float64, doubled again "
     "for the spread of rounding between evaluations of equal inputs "
     "(measured 0-0.15 of the bound on the GPT-style and CNN examples); "
     "the same for a bfloat16 model, both evaluations in bf16 and cal_j "
     "its bf16-vs-float64 difference (measured 0.10 of the bound on "
     "DeepSpeed's bf16 MLP)"},
    {"contract_fit_ulps", 8.0,
     "contract tier: the loss weight's own roundings (a mean's 1/n, a /K, "
     "a /num_items: at most three roundings of the scalar, DESIGN.md "
     "'three roundings'), plus the norms' and dot products' float64 "
     "rounding, in the unit roundoff of the model's precision (u32; "
     "unit_roundoff_bf16 / _fp16 for a bfloat16 / float16 model, whose "
     "loss and its scaling may be computed in that precision), added to "
     "the calibrated residual bound"},
    {"contract_weight_read_ulps", 2.0,
     "contract tier, a bfloat16 forward (torch.autocast) whose weights "
     "were all read at its outputs (meta.csv weights_read = float32): the "
     "loss's gradient there is its float32 gradient rounded once to "
     "bfloat16 (the recorder checks s_j so on every calibrated "
     "micro-batch), so u_b = w_b*s32 and s_j = s32 each carry one rounding "
     "per element, relative at most u_bf16 (float32's exponent range: no "
     "underflow; float16's is not claimed): w_b = "
     "u_b.s_j / s_j.s_j errs by at most 2 of it, however the roundings "
     "correlate (a near-uniform softmax rounds every logit alike: measured "
     "0.3% on the 1M decoder at initialization); plus contract_fit_ulps u32 "
     "for the float32 scalar's roundings.  The backward's own bf16 rounding "
     "moves c_b, not the weight read at the outputs"},
    {"contract_sum_ulps", 2.0,
     "contract tier: a step's consumed gradient fitted as beta*G_prev + "
     "sum_b a_b*c_b: float32 accumulation of m terms into .grad errs by at "
     "most gamma_m * sum |a_b| |c_b| (Higham 4.3, normwise); 2 more u for a "
     "clip's or a rescale's multiplication"},
    {"contract_replay_ulps", 16.0,
     "contract tier: the trainer's update against PyTorch's own optimizer "
     "class replayed once, in the parameters' precision, from the recorded "
     "parameters, state and gradient: per element at most 16 u32 "
     "(|p_replay| + |update|) (the update's roundings: Adam's moment "
     "updates, sqrt, bias corrections, division, lr product, ~10, and the "
     "parameter's storage); the same class on the same inputs normally "
     "gives the same bits (measured 0), so any other change of the "
     "parameters shows"},
    {"contract_ema_ulps", 5.0,
     "contract tier: each EMA update the recorder saw, against d*e_prev + "
     "(1-d)*p in float64 from the EMA before it and the parameters then, in "
     "u32 of d|e_prev| + (1-d)|p|: timm's ModelEmaV2 and a hand-written "
     "mul_/add_ round as state_ema_ulps (5 u); AveragedModel's foreach lerp "
     "e + w(p - e), w = 1-d rounded to float32, errs by at most u|e_new| + "
     "3uw|p - e| <= u((d + 3w)|e| + 4w|p|): within 5 u of the base for d >= "
     "3/4, and within 2 + 3w/d u below it (certify takes the larger)"},
    {"unit_roundoff_bf16", 1.0 / 256.0,
     "bf16 gradient buffers: 8 significant bits, round to nearest even, "
     "u = 2^-8; each accumulation rounds twice (the float32 add, then to "
     "bf16), so the per-addition unit is (1 + 2^-24)(1 + 2^-8) - 1"},
    {"unit_roundoff_fp16", 1.0 / 2048.0,
     "fp16 gradient buffers: 11 significant bits, u = 2^-11; per addition "
     "(1 + 2^-24)(1 + 2^-11) - 1 as for bf16"},
    {"underflow_bf16", 0x1p-134,
     "bf16's absolute error below its normal range: half its subnormal "
     "quantum 2^-133 (the relative bound u|x| fails there)"},
    {"underflow_fp16", 0x1p-25,
     "fp16's absolute error below 2^-14: half its subnormal quantum 2^-24; "
     "what makes unscaled small fp16 gradients vanish and loss scaling "
     "necessary"},
    {"evidence_fit_residual", 1e-3,
     "certify's model-free evidence: a step's gradient is a weighted sum of "
     "its window's micro-batch gradients when the least-squares residual is "
     "below 1e-3 of its norm (float32 rounding leaves ~1e-6)"},
};

// Oracle runs that agree in real arithmetic are compared at relative
// 10^-(digits - oracle_rel_digits_margin): the one oracle tolerance, used
// by `accumcheck run` verdicts and the oracle properties alike.
double oracle_tolerance(unsigned digits);

// The value of a tolerance by name; throws std::out_of_range if unknown.
double tolerance(std::string_view name);

// ------------------------------------------ low-precision gradient buffers

// The unit roundoff of a gradient buffer's format: 2^-24, 2^-8, 2^-11.
double buffer_unit(GradBuffer b);

// The bound of a K-term sum accumulated in a gradient buffer of format b
// (sim/scenario.hpp GradBuffer; the device's AccumulateGradRounded:
// s = rnd(s + rnd(f_k)), k = 1..K, from s = 0), per element, against the
// exact sum of the oracle's terms t_k:
//   |s - sum t_k| <= gamma_n(u') sum |t_k| + (1 + gamma_n(u')) sum e_k
//                    + (2K - 1) eta (1 + gamma_n(u'))
// where f_k = the float32 term, |f_k - t_k| <= e_k (the Tracked bound of
// that backward alone), u' = (1 + u32)(1 + u) - 1 the unit of one
// rounding pair (the float32 add, then the format's rounding), and n = K:
// each term meets its own rounding and at most K - 1 additions (Higham,
// Accuracy and Stability, 4.2: recursive summation, gamma_n =
// n u' / (1 - n u')); eta = the format's underflow error per rounding
// (underflow_bf16, underflow_fp16), at most 2K - 1 of them, each carried
// through the later additions.  For fp32 (one rounding per addition, no
// rounding of the terms, no underflow in float32 addition) n = K - 1,
// u' = u32 and eta = 0.  Returns +inf where n u' >= 1 (no bound).
double lowp_sum_bound(GradBuffer b, int64_t K, double sum_abs_terms,
                      double sum_term_bounds);

// One element of a comparison.
struct ElementError {
  int64_t index = -1;
  std::string tensor;  // from ParamLayout::tensor_of, or "" without layout
  double f = 0;        // the float32 result
  double v = 0;        // the oracle's value
  double err = 0;      // |f - v|
  double bound = 0;    // e
  double ratio = 0;    // err / bound (inf if bound 0 and err > 0)
};

// A float32 vector judged against a Tracked oracle vector.
struct Comparison {
  std::string what;
  int64_t n = 0;
  int64_t violations = 0;  // elements with err > slack * bound
  double slack = 1;
  ElementError worst;    // the element with the largest ratio
  double max_err_u = 0;  // max of |f - v| / (u max(|v|, 2^-126))
  double rms_err_u = 0;  // RMS of the same
  double max_ratio = 0;  // max err / bound: 1 = the bound fully used
  // Per tensor (with a layout, in the order met): max err / bound.
  std::vector<std::pair<std::string, double>> tensor_ratio;
  // accumulate()'s cache: the tensor of tensor_ratio.back() (in the
  // layout it was given).
  const TensorView* last_tensor = nullptr;
  double bound_used_pct() const { return 100.0 * max_ratio; }
  bool ok() const { return violations == 0; }
  // "grads: 0 of 42 outside the bound; worst 0.weight[3] f=.. v=.. err=..
  //  bound=.. (37.5% of bound); max 3.1 u, rms 0.9 u"
  std::string summary() const;
};

// Fills the per-element statistics; `f`, `v`, `err`, `bound` come from the
// caller (computed in high precision).  Used by compare().
void accumulate(Comparison& c, const ParamLayout* layout, int64_t index,
                double f, double v, double err, double bound, double ratio,
                bool violated);

// certify's cheap proxy comparison (its ranking's double oracle, no
// Tracked bound): element i of `f` against `v` within the bound
// ulps u (|v_i| + 2^-10 max|v|) + 1e-300, ulps = the table's
// certify_proxy_ulps.  The Comparison accumulate() builds element by
// element, bit for bit (ErrorModel.ProxyComparisonIsAccumulateElementwise),
// but an element that raises no maximum, in the tensor accumulate() last
// met, is counted in registers instead of through accumulate()'s stores:
// the ranking compares every candidate's gradients and parameters at
// every step.
Comparison compare_proxy(std::string what, const std::vector<double>& f,
                         const std::vector<double>& v,
                         const ParamLayout* layout, double ulps);

// compare()'s shortcut for a DD oracle.  Whether err / bound, formed in
// DD and rounded to double as compare() forms it, is <= every maximum
// accumulate() would enter it into (the worst element's ratio, and the
// current tensor's, the element being in the tensor accumulate() last
// met), so that accumulating it would change only the error statistics.
// The bound on the ratio: err <= err.hi (1 + 2^-53), bound >= bound.hi
// (1 - 2^-53) (normalized DD, both normal numbers), the DD quotient is
// within 2^-100 and its rounding to double within 2^-53, the double
// quotient within 2^-53: all inside the factor 1 + 2^-48 (itself rounded
// once).  A zero err has ratio 0 exactly.
inline bool ratio_below_maxima(const Comparison& c, const ParamLayout* layout,
                               int64_t index, const DD& err, const DD& bound) {
  if (c.worst.index < 0) return false;
  const double eh = err.hi, bh = bound.hi;
  double ub = 0;
  if (eh != 0) {
    if (!(eh >= 0x1p-1000 && bh >= 0x1p-1000 &&
          bh < std::numeric_limits<double>::infinity()))
      return false;
    ub = eh / bh * (1 + 0x1p-48);
  }
  if (!(ub <= c.worst.ratio)) return false;
  if (!layout || layout->tensors.empty()) return true;
  const TensorView* last = c.tensor_ratio.empty() ? nullptr : c.last_tensor;
  return last && index >= last->offset && index < last->offset + last->size() &&
         ub <= c.tensor_ratio.back().second;
}

// accumulate()'s error statistics alone (an element within the bound
// whose ratio raises no maximum).
inline void count_error(Comparison& c, double v, double err) {
  const double scale = std::max(std::fabs(v), 0x1p-126);  // 2^-126
  const double err_u = err / (kUnitRoundoff32 * scale);
  ++c.n;
  c.max_err_u = std::max(c.max_err_u, err_u);
  c.rms_err_u += err_u * err_u;
}

// compare()'s terms of four consecutive elements of a Tracked<DD> oracle
// at once (oracle/dd_lanes_compare.cpp: the same double operations per
// element in the same order as compare's scalar DD code, one element per
// lane):
// err = |f - v|, bound = e * scale and the violation test in DD;
// ratio_below_maxima's upper bound on err / bound (ub; its `ub_ok` bit
// clear where that function would give up); count_error's err_u.  Bit k
// of `scalar`: element k leaves the common path (a non-finite value), to
// be computed by the scalar code.
struct CompareLanes {
  double err_hi[4], err_lo[4], bound_hi[4], bound_lo[4], ub[4], err_u[4];
  int violated = 0, ub_ok = 0, scalar = 0;
};
}  // namespace accumcheck::error_model
namespace accumcheck {
template <class B>
struct Tracked;
}  // namespace accumcheck
namespace accumcheck::error_model {
void compare_lanes(const float* f, const Tracked<DD>* v, double scale,
                   double slack, CompareLanes& out);
void compare_lanes(const double* f, const Tracked<DD>* v, double scale,
                   double slack, CompareLanes& out);

// Compares results `f` (float32, or float64 with bound_scale =
// fp64_bound_scale) against oracle values with bounds (any type with
// members v and e, i.e. Tracked<B>); the bound of element i is
// bound_scale * e_i.  err and the violation test are computed in B, so
// bound 0 demands exact equality.
// kLanes = false: the scalar code alone (the lanes' test compares the
// two).
template <class F, class TrackedT, bool kLanes = true>
Comparison compare(std::string_view what, const std::vector<F>& f,
                   const std::vector<TrackedT>& oracle,
                   const ParamLayout* layout = nullptr,
                   double slack = tolerance("bound_slack"),
                   double bound_scale = 1.0) {
  using B = decltype(oracle[0].v);
  using std::abs;
  Comparison c;
  c.what = std::string(what);
  c.slack = slack;
  const size_t n = std::min(f.size(), oracle.size());
  if (f.size() != oracle.size()) {
    c.violations = 1;
    c.what += " (size mismatch: " + std::to_string(f.size()) + " vs " +
              std::to_string(oracle.size()) + ")";
  }
  const B scale(bound_scale);
  const B slack_b(slack);
  // One element, its err, bound and violation computed.
  auto element = [&](size_t i, const B& err, const B& bound, bool violated) {
    // The ratio is formed in B: a bound below double's range must not
    // read as 0 (and the ratio as infinite) once converted.
    const double ratio =
        bound > B(0)
            ? static_cast<double>(err / bound)
            : (err > B(0) ? std::numeric_limits<double>::infinity() : 0.0);
    accumulate(c, layout, int64_t(i), double(f[i]),
               static_cast<double>(oracle[i].v), static_cast<double>(err),
               static_cast<double>(bound), ratio, violated);
  };
  auto scalar = [&](size_t i) {
    const B err = abs(B(f[i]) - oracle[i].v);
    const B bound = oracle[i].e * scale;
    // Written so that a NaN value or bound is a violation, never a pass.
    const bool violated = !(err <= slack_b * bound);
    if constexpr (std::is_same_v<B, DD>) {
      // Most elements' ratio raises no maximum: where an upper bound on
      // it (below) is <= the maxima it would enter, only the error
      // statistics are kept (as accumulate() keeps them), without the DD
      // division err / bound: the same Comparison, bit for bit.
      if (!violated && ratio_below_maxima(c, layout, int64_t(i), err, bound)) {
        count_error(c, static_cast<double>(oracle[i].v),
                    static_cast<double>(err));
        return;
      }
    }
    element(i, err, bound, violated);
  };
  size_t i = 0;
  if constexpr (kLanes && std::is_same_v<TrackedT, Tracked<DD>> &&
                (std::is_same_v<F, float> || std::is_same_v<F, double>)) {
    // Four elements' terms at a time (compare_lanes), then each element
    // in order as the scalar code takes it: the statistics are sums and
    // maxima in element order, so the same Comparison bit for bit.
    const bool tensors = layout && !layout->tensors.empty();
    for (; i + 4 <= n; i += 4) {
      CompareLanes L;
      compare_lanes(&f[i], &oracle[i], bound_scale, slack, L);
      // The common block: no lane for the scalar code, none violated,
      // every ratio's upper bound at most the maxima it would enter (the
      // worst element's and, with a layout, the current tensor's, which
      // holds the whole block).  Each element is then counted as the loop
      // below counts it, and none changes the maxima in between.
      if (L.scalar == 0 && L.violated == 0 && L.ub_ok == 0xf &&
          c.worst.index >= 0) {
        double cap = c.worst.ratio;
        const TensorView* tensor =
            c.tensor_ratio.empty() ? nullptr : c.last_tensor;
        if (tensors)
          cap = tensor && int64_t(i) >= tensor->offset &&
                        int64_t(i) + 4 <= tensor->offset + tensor->size()
                    ? std::min(cap, c.tensor_ratio.back().second)
                    : -1.0;
        if (std::max(std::max(L.ub[0], L.ub[1]), std::max(L.ub[2], L.ub[3])) <=
            cap) {
          c.n += 4;
          for (int k = 0; k < 4; ++k) {
            c.max_err_u = std::max(c.max_err_u, L.err_u[k]);
            c.rms_err_u += L.err_u[k] * L.err_u[k];
          }
          continue;
        }
      }
      for (int k = 0; k < 4; ++k) {
        const size_t j = i + size_t(k);
        if ((L.scalar >> k) & 1) {
          scalar(j);
          continue;
        }
        const bool violated = (L.violated >> k) & 1;
        // ratio_below_maxima with the lanes' bound on the ratio.
        bool below = !violated && c.worst.index >= 0 && ((L.ub_ok >> k) & 1) &&
                     L.ub[k] <= c.worst.ratio;
        if (below && tensors) {
          const TensorView* tensor =
              c.tensor_ratio.empty() ? nullptr : c.last_tensor;
          below = tensor && int64_t(j) >= tensor->offset &&
                  int64_t(j) < tensor->offset + tensor->size() &&
                  L.ub[k] <= c.tensor_ratio.back().second;
        }
        if (below) {  // count_error with the lanes' err_u
          ++c.n;
          c.max_err_u = std::max(c.max_err_u, L.err_u[k]);
          c.rms_err_u += L.err_u[k] * L.err_u[k];
          continue;
        }
        element(j, DD::raw(L.err_hi[k], L.err_lo[k]),
                DD::raw(L.bound_hi[k], L.bound_lo[k]), violated);
      }
    }
  }
  for (; i < n; ++i) scalar(i);
  if (c.n > 0) c.rms_err_u = std::sqrt(c.rms_err_u / double(c.n));
  return c;
}

// The float32 form (callers may pass a braced list of floats).
template <class TrackedT>
Comparison compare(std::string_view what, const std::vector<float>& f,
                   const std::vector<TrackedT>& oracle,
                   const ParamLayout* layout = nullptr,
                   double slack = tolerance("bound_slack"),
                   double bound_scale = 1.0) {
  return compare<float, TrackedT>(what, f, oracle, layout, slack, bound_scale);
}

}  // namespace accumcheck::error_model
