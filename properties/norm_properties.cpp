// Properties of batch-coupled layers, token losses and dropout (DESIGN.md
// section 6, items 2, 5 and 7): oracle tier exact (oracle_tolerance());
// device tier teacher-forced, one window from the initial state, against
// Oracle<Tracked<OracleReal>> with error_model::compare() (the derived
// bound, no slack).
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/emulated.hpp"
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "gpu/cuda/cuda_executor.hpp"
#endif
#include "oracle/error_model.hpp"
#include "properties/generators.hpp"
#include "properties/harness.hpp"

namespace accumcheck::properties {

namespace {

namespace gen = rc::gen;

// A token-model scenario: small vocabulary, variable lengths.
Scenario token_scenario(bool equal_lengths) {
  Scenario s;
  s.story = "generated token case";
  s.name = "generated";
  s.model.kind = ModelKind::token;
  s.model.vocab = *gen::inRange<int64_t>(2, 7).as("vocab");
  s.model.embed = *gen::inRange<int64_t>(1, 5).as("embed");
  s.model.widths = {s.model.embed, s.model.vocab};
  s.model.activation = Activation::identity;
  s.model.loss = LossKind::cross_entropy;
  s.data.seed = *gen::inRange<uint64_t>(0, 1000).as("seed");
  s.data.shuffle = *gen::arbitrary<bool>().as("shuffle");
  s.data.lengths = equal_lengths ? SequenceLengths::fixed
                                 : *gen::element(SequenceLengths::uniform,
                                                 SequenceLengths::long_tailed)
                                        .as("lengths");
  s.data.max_len =
      *gen::inRange<int64_t>(equal_lengths ? 1 : 2, 9).as("max_len");
  s.data.min_len =
      equal_lengths ? s.data.max_len
                    : *gen::inRange<int64_t>(1, s.data.max_len).as("min_len");
  s.batching.micro_batch = *gen::inRange<int64_t>(1, 4).as("b");
  s.batching.accumulation = *gen::inRange<int64_t>(2, 5).as("K");
  const int64_t windows = *gen::inRange<int64_t>(1, 3).as("windows");
  s.data.samples = s.batching.micro_batch * s.batching.accumulation * windows;
  if (!equal_lengths)  // a short or partial tail, sometimes
    s.data.samples += *gen::inRange<int64_t>(0, s.batching.micro_batch + 1)
                           .as("extra samples");
  s.batching.epochs = *gen::inRange<int64_t>(1, 3).as("epochs");
  s.optimizer.lr = *dyadic_real(1, 8, 1, 3).as("lr");
  return s;
}

// An MLP with a norm and/or dropout, smooth activations.  BatchNorm
// micro-batches hold >= 3 samples: with 2, xh = +-1/sqrt(1 + eps/var) and
// the backward's (dxh - mean dxh - xh mean(dxh xh)) cancels to O(eps/var)
// of its terms, amplifying the oracle's rounding past the 10 digits of
// headroom oracle_tolerance() leaves (a conditioning effect, not a
// difference in real arithmetic).
Scenario mlp_scenario(NormKind norm, bool dropout, bool replicate) {
  Scenario s;
  s.story = "generated norm case";
  s.name = "generated";
  const int64_t d_in = *gen::inRange<int64_t>(1, 5).as("d_in");
  // GroupNorm: ng groups of 2..3 features each.
  const int64_t ng = norm == NormKind::groupnorm
                         ? *gen::inRange<int64_t>(1, 4).as("norm_groups")
                         : 1;
  const int64_t h = norm == NormKind::groupnorm
                        ? ng * *gen::inRange<int64_t>(2, 4).as("group size")
                        : *gen::inRange<int64_t>(2, 7).as("hidden");
  const bool two = *gen::arbitrary<bool>().as("two hidden layers");
  const int64_t d_out = *gen::inRange<int64_t>(2, 4).as("d_out");
  s.model.widths = two ? std::vector<int64_t>{d_in, h, h, d_out}
                       : std::vector<int64_t>{d_in, h, d_out};
  if (norm == NormKind::batchnorm && !replicate)
    s.model.widths = {d_in, h, d_out};  // running stats formula: one BN
  s.model.norm = norm;
  s.model.norm_groups = ng;
  s.model.activation =
      *gen::element(Activation::tanh, Activation::gelu).as("activation");
  s.model.loss =
      *gen::element(LossKind::mse, LossKind::cross_entropy).as("loss");
  if (dropout) s.model.dropout = *gen::element(0.125, 0.25, 0.5).as("dropout");
  s.data.seed = *gen::inRange<uint64_t>(0, 1000).as("seed");
  s.data.replicate = replicate;
  s.data.shuffle = replicate ? false : *gen::arbitrary<bool>().as("shuffle");
  s.batching.micro_batch =
      *gen::inRange<int64_t>(norm == NormKind::batchnorm ? 3 : 1, 5).as("b");
  s.batching.accumulation = *gen::inRange<int64_t>(2, 5).as("K");
  const int64_t windows = *gen::inRange<int64_t>(1, 3).as("windows");
  s.data.samples = s.batching.micro_batch * s.batching.accumulation * windows;
  s.batching.epochs = *gen::inRange<int64_t>(1, 3).as("epochs");
  s.optimizer.kind =
      *gen::element(OptimizerKind::sgd, OptimizerKind::adam).as("optimizer");
  s.optimizer.lr = s.optimizer.kind == OptimizerKind::sgd
                       ? *dyadic_real(1, 8, 2, 4).as("lr")
                       : *dyadic_real(1, 8, 6, 9).as("lr");
  return s;
}

// Windows of the plan in run order.
std::vector<const Window*> windows_of(const Plan& p) {
  std::vector<const Window*> out;
  for (const EpochPlan& e : p.epochs)
    for (const Window& w : e.windows) out.push_back(&w);
  return out;
}

// Every run equals the large batch, window by window.
void assert_equivalent(const std::string& name, const Case& c) {
  const Run<R> ref = c.run(as_large_batch(c.plan), {}, c.s.optimizer.lr);
  const Run<R> acc = c.run(c.plan, {}, c.s.optimizer.lr);
  RC_ASSERT(!acc.steps.empty());
  RC_ASSERT(acc.steps.size() == ref.steps.size());
  for (size_t t = 0; t < acc.steps.size(); ++t) {
    assert_close(name, acc.steps[t].grad, ref.steps[t].grad, oracle_tolerance(),
                 "gradient");
    assert_close(name, acc.steps[t].param, ref.steps[t].param,
                 oracle_tolerance(), "parameters");
  }
}

// ---------------------------------------------------------------- tokens

void token_equivalence() {
  const std::string name = "token.correct-equals-large-batch";
  const Case c(token_scenario(false));
  assert_equivalent(name, c);
  record_case(name);
}

void token_mean_of_means() {
  const std::string name = "token.mean-of-means-weights";
  Scenario s = token_scenario(false);
  s.trainer.pitfalls = {Pitfall::token_mean_of_means};
  const Case c(s);
  auto o = c.oracle();
  const Run<R> bug =
      c.run(c.plan, {Pitfall::token_mean_of_means}, s.optimizer.lr);
  const auto ws = windows_of(c.plan);
  RC_ASSERT(!bug.steps.empty());
  for (size_t t = 0; t < bug.steps.size(); ++t) {
    const Window& w = *ws[size_t(bug.steps[t].window)];
    const int64_t Kw = int64_t(w.micro.size());
    Parts bugw, ok;
    int64_t T = 0;
    for (const MicroBatch& m : w.micro) T += o->items(m.shards[0]);
    for (const MicroBatch& m : w.micro) {
      const int64_t Tk = o->items(m.shards[0]);
      bugw.push_back({m.shards[0], Kw * Tk});  // 1/(K*T_k)
      ok.push_back({m.shards[0], T});          // 1/T
    }
    const auto theta = theta_before(bug, t, c);
    const auto want = predicted(c, theta, bugw);
    assert_close(name, bug.steps[t].grad, want, oracle_tolerance(),
                 "gradient with token weights 1/(K*T_k)");
    // Where the oracle predicts a gap beyond the tolerance, the bug's
    // gradient leaves correct's.
    assert_differs_where_predicted(name, bug.steps[t].grad, want,
                                   predicted(c, theta, ok));
  }
  record_case(name);
}

void token_count_unshifted_labels() {
  const std::string name = "token.unshifted-label-count-weights";
  Scenario s = token_scenario(false);
  s.trainer.pitfalls = {Pitfall::token_count_unshifted_labels};
  const Case c(s);
  auto o = c.oracle();
  const Run<R> bug =
      c.run(c.plan, {Pitfall::token_count_unshifted_labels}, s.optimizer.lr);
  const auto ws = windows_of(c.plan);
  RC_ASSERT(!bug.steps.empty());
  for (size_t t = 0; t < bug.steps.size(); ++t) {
    const Window& w = *ws[size_t(bug.steps[t].window)];
    // T: the window's loss-bearing tokens; S: its sequences (each one's
    // position 0 counted by the unshifted labels).
    int64_t T = 0, S = 0;
    for (const MicroBatch& m : w.micro) {
      T += o->items(m.shards[0]);
      S += int64_t(m.shards[0].size());
    }
    Parts bugw, ok;
    for (const MicroBatch& m : w.micro) {
      bugw.push_back({m.shards[0], T + S});  // 1/(T + S)
      ok.push_back({m.shards[0], T});        // 1/T
    }
    const auto theta = theta_before(bug, t, c);
    const auto want = predicted(c, theta, bugw);
    assert_close(name, bug.steps[t].grad, want, oracle_tolerance(),
                 "gradient with token weights 1/(T + S_w)");
    assert_differs_where_predicted(name, bug.steps[t].grad, want,
                                   predicted(c, theta, ok));
  }
  record_case(name);
}

void token_mean_of_means_equal_lengths() {
  const std::string name = "token.mean-of-means-equal-lengths-is-correct";
  Scenario s = token_scenario(true);
  s.trainer.pitfalls = {Pitfall::token_mean_of_means};
  const Case c(s);
  const Run<R> ok = c.run(c.plan, {}, s.optimizer.lr);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::token_mean_of_means}, s.optimizer.lr);
  RC_ASSERT(ok.steps.size() == bug.steps.size());
  for (size_t w = 0; w < ok.windows.size(); ++w)
    assert_close(name, bug.windows[w].param, ok.windows[w].param,
                 oracle_tolerance(), "parameters with equal token counts");
  record_case(name);
}

// ------------------------------------------------------------- BatchNorm

void bn_replicated() {
  const std::string name = "batchnorm.replicated-zero-divergence";
  const Case c(mlp_scenario(NormKind::batchnorm, false, true));
  assert_equivalent(name, c);
  record_case(name);
}

void bn_divergence() {
  const std::string name = "batchnorm.micro-stats-divergence";
  const Case c(mlp_scenario(NormKind::batchnorm, false, false));
  const Window& w = *windows_of(c.plan).front();
  const int64_t N = w.items();
  Parts micro, whole;
  std::vector<int64_t> all;
  for (const MicroBatch& m : w.micro) {
    micro.push_back({m.shards[0], N});
    all.insert(all.end(), m.shards[0].begin(), m.shards[0].end());
  }
  whole.push_back({all, N});
  const std::vector<R> theta(c.init.begin(), c.init.end());
  const auto want_micro = predicted(c, theta, micro);
  const auto want_big = predicted(c, theta, whole);
  const Run<R> acc = c.run(c.plan, {}, c.s.optimizer.lr);
  RC_ASSERT(!acc.steps.empty());
  assert_close(name, acc.steps[0].grad, want_micro, oracle_tolerance(),
               "gradient = sum of micro-batch-statistics gradients / N");
  RC_PRE(rel(want_micro, want_big) > 1e3 * oracle_tolerance());
  assert_differs_where_predicted(name, acc.steps[0].grad, want_micro, want_big);
  record_case(name);
}

void bn_running_stats() {
  const std::string name = "batchnorm.running-stats-k-updates";
  const Case c(mlp_scenario(NormKind::batchnorm, false, false));
  const Window& w = *windows_of(c.plan).front();
  auto o = c.oracle();
  Trainer<O> tr(*o, c.s, behavior_of({}), c.s.optimizer.lr);
  tr.run_window(w, c.plan.accumulation, {});
  const std::vector<R> got = o->state().buffers;
  // r = (1-m)^K r0 + m sum_k (1-m)^(K-k) mu_k, from the first hidden
  // Linear's outputs at theta_0 (parameters do not move inside a window).
  const ParamLayout& L = c.layout;
  const int64_t in = c.s.model.widths[0], H = c.s.model.widths[1];
  const TensorView& W = L.weight(0);
  const TensorView& B = L.bias(0);
  const R m = R(0.1), omm = R(1) - m;
  std::vector<R> rm(size_t(H), R(0)), rv(size_t(H), R(1));
  for (const MicroBatch& mb : w.micro) {
    const auto& ids = mb.shards[0];
    const int64_t b = int64_t(ids.size());
    for (int64_t j = 0; j < H; ++j) {
      std::vector<R> z;
      for (int64_t id : ids) {
        R acc = R(c.init[size_t(B.offset + j)]);
        for (int64_t i = 0; i < in; ++i)
          acc +=
              R(c.init[size_t(W.offset + j * in + i)]) * R(c.data.input(id)[i]);
        z.push_back(acc);
      }
      R mu = 0;
      for (const R& v : z) mu += v;
      mu /= R(b);
      R ss = 0;
      for (const R& v : z) ss += (v - mu) * (v - mu);
      rm[size_t(j)] = omm * rm[size_t(j)] + m * mu;
      rv[size_t(j)] = omm * rv[size_t(j)] + m * (ss / R(b - 1));  // b/(b-1)
    }
  }
  std::vector<R> want = rm;
  want.insert(want.end(), rv.begin(), rv.end());
  assert_close(name, got, want, oracle_tolerance(),
               "running mean and unbiased variance");
  record_case(name);
}

// ------------------------------------------------- LayerNorm, dropout

void layernorm_equivalence() {
  const std::string name = "layernorm.correct-equals-large-batch";
  const Case c(mlp_scenario(NormKind::layernorm,
                            *gen::arbitrary<bool>().as("dropout too"), false));
  assert_equivalent(name, c);
  record_case(name);
}

// GroupNorm normalizes per sample (each group of a row), so accumulation
// cannot see the micro-batch boundaries.
void groupnorm_equivalence() {
  const std::string name = "groupnorm.correct-equals-large-batch";
  const Case c(mlp_scenario(NormKind::groupnorm,
                            *gen::arbitrary<bool>().as("dropout too"), false));
  assert_equivalent(name, c);
  record_case(name);
}

void dropout_equivalence() {
  const std::string name = "dropout.sample-keyed-equals-large-batch";
  const Case c(mlp_scenario(NormKind::none, true, false));
  assert_equivalent(name, c);
  record_case(name);
}

// ------------------------------------------------ device, teacher-forced

using TR = Tracked<OracleReal>;

// One window from the initial state on the device and on the Tracked
// oracle: the accumulated gradient, the parameters after the step and the
// buffers must lie within the derived bound.
template <class Dev>
void device_window(const std::string& name, const Scenario& s,
                   const std::vector<Pitfall>& pitfalls) {
  const Case c(s);
  const Window& w = *windows_of(c.plan).front();
  Dev dev(s.model, c.data, c.init);
  Oracle<TR> orc(s.model, c.data, c.init);
  Trainer<Dev> td(dev, s, behavior_of(pitfalls), s.optimizer.lr);
  Trainer<Oracle<TR>> to(orc, s, behavior_of(pitfalls), s.optimizer.lr);
  const Run<float> rd = td.run_window(w, c.plan.accumulation, {});
  const Run<TR> ro = to.run_window(w, c.plan.accumulation, {});
  RC_ASSERT(rd.steps.size() == 1u);
  RC_ASSERT(ro.steps.size() == 1u);
  namespace em = error_model;
  const em::Comparison cg =
      em::compare("grads", rd.steps[0].grad, ro.steps[0].grad, &c.layout);
  const em::Comparison cp =
      em::compare("params", rd.steps[0].param, ro.steps[0].param, &c.layout);
  record_ratio(name, std::max(cg.max_ratio, cp.max_ratio));
  if (!cg.ok()) RC_FAIL(cg.summary());
  if (!cp.ok()) RC_FAIL(cp.summary());
  const auto bd = dev.state().buffers;
  const auto bo = orc.state().buffers;
  if (!bo.empty()) {
    const em::Comparison cb = em::compare("buffers", bd, bo);
    record_ratio(name, cb.max_ratio);
    if (!cb.ok()) RC_FAIL(cb.summary());
  }
  record_case(name);
}

// "device.x" on the emulated executor, "cuda.x" on the CUDA executor.
template <class Dev>
std::string tier_name(const char* what);
template <>
std::string tier_name<EmulatedDevice>(const char* what) {
  return std::string("device.") + what;
}
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
template <>
std::string tier_name<CudaDevice>(const char* what) {
  return std::string("cuda.") + what;
}
#endif

template <class Dev>
void device_token() {
  Scenario s = token_scenario(false);
  const bool bug = *gen::arbitrary<bool>().as("token-mean-of-means");
  if (bug) s.trainer.pitfalls = {Pitfall::token_mean_of_means};
  device_window<Dev>(tier_name<Dev>("token"), s, s.trainer.pitfalls);
}
template <class Dev>
void device_batchnorm() {
  const bool rep = *gen::arbitrary<bool>().as("replicate");
  device_window<Dev>(tier_name<Dev>("batchnorm"),
                     mlp_scenario(NormKind::batchnorm, false, rep), {});
}
template <class Dev>
void device_layernorm_dropout() {
  const bool drop = *gen::arbitrary<bool>().as("dropout");
  const NormKind n =
      *gen::element(NormKind::none, NormKind::layernorm).as("norm");
  device_window<Dev>(tier_name<Dev>("layernorm-dropout"),
                     mlp_scenario(n, drop || n == NormKind::none, false), {});
}

template <class Dev>
void device_groupnorm() {
  device_window<Dev>(tier_name<Dev>("groupnorm"),
                     mlp_scenario(NormKind::groupnorm,
                                  *gen::arbitrary<bool>().as("dropout"), false),
                     {});
}

template <class Dev>
std::vector<Property> device_tier(bool needs_gpu) {
  const std::string e = needs_gpu ? "cuda" : "device";
  return {
      {tier_name<Dev>("token"), e,
       "token model (correct or token-mean-of-means), one window: float32 "
       "within the Tracked bound",
       device_token<Dev>, needs_gpu},
      {tier_name<Dev>("batchnorm"), e,
       "BatchNorm, one window: float32 grads, params, running stats within "
       "the Tracked bound",
       device_batchnorm<Dev>, needs_gpu},
      {tier_name<Dev>("layernorm-dropout"), e,
       "LayerNorm and/or dropout, one window: float32 within the Tracked "
       "bound",
       device_layernorm_dropout<Dev>, needs_gpu},
      {tier_name<Dev>("groupnorm"), e,
       "GroupNorm (with or without dropout), one window: float32 within the "
       "Tracked bound",
       device_groupnorm<Dev>, needs_gpu},
  };
}

}  // namespace

const std::vector<Property>& norm_properties() {
  static const std::vector<Property> props = {
      {"token.correct-equals-large-batch", "oracle",
       "token losses: correct accumulation (1/T over the window's tokens) "
       "equals the large batch, any lengths",
       token_equivalence},
      {"token.mean-of-means-weights", "oracle",
       "token-mean-of-means weighs a token 1/(K*T_k); leaves correct where the "
       "predicted gap exceeds the tolerance",
       token_mean_of_means},
      {"token.unshifted-label-count-weights", "oracle",
       "token-count-unshifted-labels weighs a token 1/(T + S_w) (position 0 "
       "of each sequence counted); leaves correct where the predicted gap "
       "exceeds the tolerance",
       token_count_unshifted_labels},
      {"token.mean-of-means-equal-lengths-is-correct", "oracle",
       "token-mean-of-means equals correct when every T_k is equal",
       token_mean_of_means_equal_lengths},
      {"batchnorm.replicated-zero-divergence", "oracle",
       "BatchNorm: replicated micro-batches give exactly the large batch",
       bn_replicated},
      {"batchnorm.micro-stats-divergence", "oracle",
       "BatchNorm: the gradient uses micro-batch statistics; differs from the "
       "large batch where predicted",
       bn_divergence},
      {"batchnorm.running-stats-k-updates", "oracle",
       "BatchNorm running stats: (1-m)^K r0 + m sum_k (1-m)^(K-k) mu_k, "
       "variance with b/(b-1)",
       bn_running_stats},
      {"layernorm.correct-equals-large-batch", "oracle",
       "LayerNorm (with or without dropout): correct accumulation equals the "
       "large batch",
       layernorm_equivalence},
      {"groupnorm.correct-equals-large-batch", "oracle",
       "GroupNorm (with or without dropout): correct accumulation equals the "
       "large batch (per-sample statistics)",
       groupnorm_equivalence},
      {"dropout.sample-keyed-equals-large-batch", "oracle",
       "dropout masks keyed by sample: correct accumulation equals the large "
       "batch",
       dropout_equivalence},
  };
  static const std::vector<Property> all = [] {
    std::vector<Property> v = props;
    for (Property& p : device_tier<EmulatedDevice>(false)) v.push_back(p);
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
    for (Property& p : device_tier<CudaDevice>(true)) v.push_back(p);
#endif
    return v;
  }();
  return all;
}

}  // namespace accumcheck::properties
