#include "properties/harness.hpp"

#include <algorithm>
#include <cstdio>

#include "oracle/error_model.hpp"

namespace accumcheck::properties {

double oracle_tolerance() {
  return error_model::oracle_tolerance(oracle_digits());
}

Case::Case(Scenario sc)
    : s(std::move(sc)),
      data(make_dataset(s)),
      layout(layout_of(s.model)),
      init(initial_parameters(s, layout)),
      plan(materialize(make_plan(s))) {}

std::unique_ptr<O> Case::oracle() const {
  return std::make_unique<O>(s.model, data, init);
}

Run<R> Case::run(const Plan& p, const std::vector<Pitfall>& pitfalls, double lr,
                 EngineState<R>* final_state) const {
  auto o = oracle();
  Trainer<O> t(*o, s, behavior_of(pitfalls), lr);
  Run<R> r = t.run(p, semantics_name(pitfalls));
  if (final_state) *final_state = o->state();
  return r;
}

double rel(const std::vector<R>& a, const std::vector<R>& b) {
  return relative_distance(a, b);
}

std::vector<R> weighted_gradient(O& o, const Parts& parts) {
  o.zero_grad();
  for (const auto& [ids, den] : parts)
    if (!ids.empty()) o.forward_backward(ids, den);
  return o.state().grads;
}

std::vector<R> predicted(const Case& c, const std::vector<R>& theta,
                         const Parts& ps, int64_t epoch) {
  auto o = c.oracle();
  EngineState<R> st = o->state();
  st.params = theta;
  o->set_state(st);
  o->set_epoch(epoch);
  return weighted_gradient(*o, ps);
}

std::vector<R> theta_before(const Run<R>& run, size_t t, const Case& c) {
  if (t > 0) return run.steps[t - 1].param;
  return std::vector<R>(c.init.begin(), c.init.end());
}

bool assert_differs_where_predicted(const std::string& property,
                                    const std::vector<R>& got,
                                    const std::vector<R>& want,
                                    const std::vector<R>& correct) {
  const double tol = oracle_tolerance();
  const double gap = rel(want, correct);
  if (!(gap > tol)) return false;
  record_gap(property, gap / tol);
  RC_ASSERT(rel(got, correct) > tol);
  return true;
}

void run_property(const std::string& name) {
  for (const Property& p : all_properties())
    if (p.name == name) return p.body();
  RC_FAIL("no property named " + name);
}

namespace {
std::mutex stats_mutex;
std::map<std::string, PropertyStats>& stats() {
  static std::map<std::string, PropertyStats> m;
  return m;
}
}  // namespace

void record_ratio(const std::string& property, double ratio) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  auto& s = stats()[property];
  s.worst_ratio = std::max(s.worst_ratio, ratio);
}

void record_gap(const std::string& property, double ratio) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  auto& s = stats()[property];
  s.min_gap_ratio =
      s.min_gap_ratio < 0 ? ratio : std::min(s.min_gap_ratio, ratio);
}

void record_case(const std::string& property) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  ++stats()[property].cases;
}

std::map<std::string, PropertyStats> property_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  return stats();
}

void assert_close(const std::string& property, const std::vector<R>& a,
                  const std::vector<R>& b, double tol, const char* what) {
  RC_ASSERT(a.size() == b.size());
  RC_ASSERT(!a.empty());
  const double d = rel(a, b);
  record_ratio(property, d / tol);
  if (!(d <= tol)) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  ": relative difference %.6g exceeds tolerance %.3g", d, tol);
    RC_FAIL(std::string(what) + buf);
  }
}

}  // namespace accumcheck::properties
