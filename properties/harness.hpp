// Shared machinery of the property battery: a generated case with its data
// and engines, oracle tolerances, teacher-forced predictions, and the
// statistics every property reports (cases, worst error/bound).
#pragma once

#include <rapidcheck.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "oracle/oracle.hpp"
#include "sim/data.hpp"
#include "sim/experiment.hpp"
#include "sim/layout.hpp"
#include "sim/plan.hpp"
#include "sim/scenario.hpp"
#include "sim/trainer.hpp"

namespace accumcheck::properties {

using O = Oracle<OracleReal>;
using R = OracleReal;

// error_model::oracle_tolerance at the oracle's current digits.
double oracle_tolerance();

struct Case {
  Scenario s;
  Dataset data;
  ParamLayout layout;
  std::vector<float> init;
  Plan plan;

  explicit Case(Scenario sc);
  std::unique_ptr<O> oracle() const;
  // A trainer run on the oracle with these pitfalls (lr as the scenario's
  // trainer: scaled when the scenario says so).
  Run<R> run(const Plan& p, const std::vector<Pitfall>& pitfalls, double lr,
             EngineState<R>* final_state = nullptr) const;
};

// Normwise relative difference |a - b| / |b| (|a - b| when b = 0).
double rel(const std::vector<R>& a, const std::vector<R>& b);

// (shard, den): the shard's items weighted 1/den.
using Parts = std::vector<std::pair<std::vector<int64_t>, int64_t>>;

// The gradient sum_k sum_{i in shard} (1/den_k) dl_i/dtheta of a list of
// (shard, den) at the oracle's current parameters, on a zeroed buffer.
std::vector<R> weighted_gradient(O& o, const Parts& parts);

// The same at parameters `theta` (dropout masks of `epoch`), on a fresh
// oracle: a prediction written from DESIGN.md's weights, not by the
// trainer switch it checks.
std::vector<R> predicted(const Case& c, const std::vector<R>& theta,
                         const Parts& ps, int64_t epoch = 0);

// Parameters before optimizer step t of a run (the initial ones for t = 0).
std::vector<R> theta_before(const Run<R>& run, size_t t, const Case& c);

// DESIGN.md section 6: a property that claims a difference asserts it only
// where the oracle's predicted gap exceeds the tolerance.  If the predicted
// buggy result `want` is farther than oracle_tolerance() from `correct`,
// records the gap and asserts that `got` leaves `correct` too.  Returns
// whether a difference was asserted.
bool assert_differs_where_predicted(const std::string& property,
                                    const std::vector<R>& got,
                                    const std::vector<R>& want,
                                    const std::vector<R>& correct);

// Statistics per property, printed by tests and `accumcheck check`.
struct PropertyStats {
  int64_t cases = 0;
  double worst_ratio = 0;     // max error / tolerance over all checks
  double min_gap_ratio = -1;  // min predicted gap / tolerance where a
                              // difference was asserted (-1: none)
};
void record_ratio(const std::string& property, double ratio);
void record_gap(const std::string& property, double ratio);
void record_case(const std::string& property);
std::map<std::string, PropertyStats> property_stats();

// Asserts rel(a, b) <= tol and records the ratio.
void assert_close(const std::string& property, const std::vector<R>& a,
                  const std::vector<R>& b, double tol, const char* what);

struct Property {
  std::string name;            // "equivalence.oracle"
  std::string engine;          // "oracle", "device" (emulated) or "cuda"
  std::string claim;           // one line
  std::function<void()> body;  // uses *gen and RC_ASSERT
  bool needs_gpu = false;      // the CUDA executor's instantiation
};
const std::vector<Property>& oracle_properties();
// BatchNorm, LayerNorm, token losses, dropout (properties/norm_properties.cpp).
const std::vector<Property>& norm_properties();
// Data parallelism: R ranks, repartition, DDP pitfalls
// (properties/ddp_properties.cpp).
const std::vector<Property>& ddp_properties();
// K per epoch (properties/ramp_properties.cpp).
const std::vector<Property>& ramp_properties();
// Window cutting, drawing and scheduler order (properties/loop_properties.cpp).
const std::vector<Property>& loop_properties();
// The mistakes only a framework's loop makes, and windows carried across an
// epoch's end (properties/framework_loop_properties.cpp).
const std::vector<Property>& framework_loop_properties();
// The coefficient engine against the oracle
// (properties/contract_properties.cpp).
const std::vector<Property>& contract_properties();
// Precision, loss scaling, EMA and optimizer state
// (properties/precision_properties.cpp).
const std::vector<Property>& precision_properties();
// Every property: oracle, norm, ramp, loop, contract, ddp, then device
// (properties/device_properties.cpp).
const std::vector<Property>& all_properties();
// Runs the body of the property of that name (RC_FAIL when there is none).
void run_property(const std::string& name);

}  // namespace accumcheck::properties
