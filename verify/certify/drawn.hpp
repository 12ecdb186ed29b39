// The micro-batches a trainer actually drew, from its trace's sample ids
// (trace schema 2), and the order-and-coverage check of certify.
//
// A trainer may draw its own order (its own DataLoader, sampler, shuffle,
// drop_last): certify judges the accumulation on what it drew.  Per epoch
// (the events' epoch column), the forward_backward events' sample ids in
// order are the drawn micro-batches.  From them certify rebuilds the
// loader's output:
//   - a micro-batch whose samples were all drawn before in the epoch is a
//     repeat (the same micro-batch counted again): not a new micro-batch
//     of the loader, so it is left out of the plan (the gradient it added
//     is the trace's, and is judged against the plan without it);
//   - samples of the epoch never drawn are appended, in the scenario's
//     order, as the epoch's last micro-batch(es) of b (what drop_last
//     skips), so that a trainer that skipped them is judged against one
//     that did not;
// then cut into windows of K (the last one partial), as the scenario's
// plan is.  When that equals the scenario's plan, the plan is used as is.
//
// The order-and-coverage check passes when every epoch draws every sample
// exactly once and, where the scenario pins the order ([data]
// pinned_order = true), in the plan's order.
//
// With R > 1 ranks (DDP), rank r's forward_backward events are its shards
// and micro-step k is every rank's k-th; the epoch's samples over all ranks
// must be the sampler's (each once, plus DistributedSampler's padding
// repeats), and a trainer's own order is judged on the shards it drew.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/plan.hpp"
#include "sim/scenario.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

struct DrawnPlan {
  bool known = false;      // every forward_backward event has sample ids
  bool reordered = false;  // `plan` is not the scenario's plan
  Plan plan;               // the plan certify judges on
  bool ok = true;          // the order-and-coverage check
  // One line: the check's message (every sample once, the order), or
  // what is wrong with the first few epochs; "not checked: ..." when the
  // ids are unknown.
  std::string message;
  // Epoch by epoch, the samples never drawn and the samples drawn more
  // than once (for the diagnosis).
  std::vector<std::vector<int64_t>> skipped, repeated;
  // Every skip is an epoch's last, short micro-batch (fewer than b
  // samples, the scenario's last ones): what drop_last = True does.
  bool skips_are_short_last = false;
};

DrawnPlan drawn_plan(const Scenario& s, const Plan& scenario_plan,
                     const TraceRun& run);

}  // namespace accumcheck
