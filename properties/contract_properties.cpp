// The contract tier's foundation (DESIGN.md section 10): the coefficient
// engine (verify/contract/coefficient_engine.hpp), run through the one Trainer
// loop, predicts every optimizer step's gradient as exact rational weights
// over micro-batch gradients g_j.  Checked here against the oracle engine
// run through the same loop with the same Behavior: each step's gradient
// equals sum_j w_j g_j (+ the L2 terms lambda_v theta_v), every g_j
// computed independently -- a fresh oracle set to the parameters the run
// had when it took it (the trainer's own trajectory), the dropout masks of
// its epoch, weight 1 -- and the clip symbols evaluated from those vectors.
// Tolerance: the oracle tolerance (error_model::oracle_tolerance): the two
// sides agree in real arithmetic and differ only by the oracle's rounding.
// Ranks R in {1, 2, 3} (DDP): rank 0's steps are compared (the run records
// rank 0's gradient), each g_j taken at its own rank's parameters of its
// version (ranks diverge inside a window when a loop steps per micro-step
// and syncs at the window's end).
#include <rapidcheck.h>

#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "properties/contract.hpp"
#include "properties/generators.hpp"
#include "properties/harness.hpp"
#include "verify/contract/coefficient_engine.hpp"

namespace accumcheck::properties {

const std::vector<R>& MicroGrads::get(const std::vector<R>& theta,
                                      const std::vector<int64_t>& ids,
                                      int64_t epoch) {
  std::deque<Entry>& seen = seen_[{ids, epoch}];
  for (const Entry& e : seen)
    if (e.theta == theta) return e.grad;  // R's ==: exact (NaN: no match)
  seen.push_back({theta, predicted(c_, theta, {{ids, 1}}, epoch)});
  return seen.back().grad;
}

int64_t MicroGrads::items(const std::vector<int64_t>& ids) {
  if (!items_) items_ = c_.oracle();
  return items_->items(ids);
}

double coefficient_check(const Case& c, const std::vector<Pitfall>& sem,
                         bool break_on_purpose, MicroGrads* grads) {
  using contract::Term;
  MicroGrads own(c);
  MicroGrads& g = grads ? *grads : own;
  const Behavior b = behavior_of(sem);
  const double lr = base_lr(c.s);
  auto o = c.oracle();
  Trainer<O> ot(*o, c.s, b, lr);
  const Run<R> run = ot.run(c.plan, semantics_name(sem));

  contract::CoefficientEngine ce(
      [&](const std::vector<int64_t>& ids) { return g.items(ids); });
  Trainer<contract::CoefficientEngine> ct(ce, c.s, b, lr,
                                          TrainerOptions::unrecorded());
  ct.run(c.plan, semantics_name(sem));
  std::vector<contract::StepPrediction> steps;  // rank 0's
  for (const auto& st : ce.steps())
    if (st.rank == 0) steps.push_back(st);
  RC_ASSERT(steps.size() == run.steps.size());

  // Each term's vector, computed once, independently of both runs' buffers
  // (held by the run, or by `g`: the cache keeps where each is, no copy).
  std::map<Term, const std::vector<R>*> cache;
  const size_t n = c.init.size();
  const std::vector<R> init = theta_before(run, 0, c);
  const std::function<const std::vector<R>&(Term)> vec =
      [&](Term t) -> const std::vector<R>& {
    auto it = cache.find(t);
    if (it != cache.end()) return *it->second;
    // The parameters of a rank (rank_param: ranks 1..R-1) before step v.
    auto theta = [&](int64_t rank, int64_t v) -> const std::vector<R>& {
      if (v == 0) return init;
      const auto& st = run.steps[size_t(v) - 1];
      return rank == 0 ? st.param : st.rank_param[size_t(rank) - 1];
    };
    const std::vector<R>* v = nullptr;
    if (t.kind == Term::param) {
      v = &theta(t.rank, t.index);
    } else {
      const contract::MicroGrad& m = ce.micro()[size_t(t.index)];
      v = &g.get(theta(m.rank, m.version), m.ids, m.epoch);
    }
    return *cache.emplace(t, v).first->second;
  };
  const std::vector<R> sym =
      contract::clip_values<R>(ce.clips(), vec, n, ce.symbols());
  double worst = 0;
  for (size_t t = 0; t < run.steps.size(); ++t) {
    contract::Buffer buf = steps[t].grad;
    if (break_on_purpose && !buf.empty()) {
      // A wrong weight on the first term of every step.
      buf.begin()->second.scale(contract::Rational(2));
    }
    RC_ASSERT(steps[t].lr == run.steps[t].lr);
    const std::vector<R> want = contract::evaluate<R>(buf, sym, vec, n);
    worst = std::max(worst, rel(run.steps[t].grad, want));
  }
  return worst;
}

namespace {

void coefficients(bool break_on_purpose) {
  const std::string name = break_on_purpose ? "contract.coefficients.broken"
                                            : "contract.coefficients";
  Triggers t;
  t.partial_window = *rc::gen::arbitrary<bool>().as("partial window");
  t.short_micro = *rc::gen::arbitrary<bool>().as("short micro-batch");
  t.schedule = true;
  t.max_width = 6;
  t.max_ranks = 3;
  Scenario s = *scenario(t).as("scenario");
  s.model.dropout =
      s.model.widths.size() > 2 && *rc::gen::arbitrary<bool>() ? 0.25 : 0.0;
  const Case c(s);
  const auto sems = candidate_semantics(
      {.token_loss = s.model.kind == ModelKind::token, .contract_tier = true});
  // Every semantics of the catalog: correct, each pitfall, each pair.
  const double tol = oracle_tolerance();
  MicroGrads grads(c);  // each g_j computed once for all the semantics
  for (const auto& sem : sems) {
    const double worst = coefficient_check(c, sem, break_on_purpose, &grads);
    record_ratio(name, worst / tol);
    if (!(worst <= tol))
      RC_FAIL(semantics_name(sem) + ": a step's gradient is " +
              std::to_string(worst) +
              " (relative) away from the coefficient engine's weights times "
              "the g_j");
  }
  record_case(name);
}

}  // namespace

const std::vector<Property>& contract_properties() {
  static const std::vector<Property> props = {
      {"contract.coefficients", "oracle",
       "for correct, every pitfall and every pair, each step's gradient = "
       "the coefficient engine's exact weights times g_j computed "
       "independently at the parameters each was taken at",
       [] { coefficients(false); }},
  };
  return props;
}

}  // namespace accumcheck::properties
