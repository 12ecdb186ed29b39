// K per epoch, and the horizon a trainer derives from it.
//
// K may change during training (seed 002's "cold start"
// `accumulation_steps = min(epoch * 2, 8)`, GPT-3's and Megatron-LM's
// batch-size ramp): BatchingSpec::accumulation_per_epoch holds one K per
// epoch.  The `correct` semantics does not change: every window is
// normalized by its own N_w and stepped; a window never spans epochs.
//
// A schedule with total = "auto" gets its horizon the way a trainer
// computes it: the optimizer steps of the run (sum over epochs of
// ceil(micro-steps / K_e)), or max_steps when set.  The pitfall
// ramp-schedule-horizon-fixed computes it once with the initial K
// (epochs * ceil(micro-steps / K_0)), so warmup and decay end early (K
// ramps down) or late (K ramps up).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "sim/limits.hpp"
#include "sim/scenario.hpp"

namespace accumcheck {

// K of epoch e (from 0).
inline int64_t accumulation_at(const BatchingSpec& b, int64_t epoch) {
  if (b.accumulation_per_epoch.empty()) return b.accumulation;
  const size_t i = std::min(size_t(std::max<int64_t>(0, epoch)),
                            b.accumulation_per_epoch.size() - 1);
  return b.accumulation_per_epoch[i];
}

// The epochs whose K is stored: from the next one on, K is the last stored
// one (accumulation_at).  Loops over epochs stop there, so that a run of
// 10^12 epochs costs nothing here (the sanitizer build's -O1 does not fold
// a loop over every epoch away: it ran for minutes).
inline int64_t stored_k_epochs(const BatchingSpec& b) {
  return std::min(b.epochs, int64_t(b.accumulation_per_epoch.size()));
}

// Whether K differs between two epochs of the run.
inline bool k_changes(const BatchingSpec& b) {
  for (int64_t e = 1; e < stored_k_epochs(b); ++e)
    if (accumulation_at(b, e) != accumulation_at(b, 0)) return true;
  return false;
}

// Micro-steps per epoch: ceil(ceil(n / R) / b), the same every epoch.
inline int64_t micro_steps_per_epoch(const Scenario& s) {
  const int64_t per_rank =
      (s.data.samples + s.batching.ranks - 1) / s.batching.ranks;
  return (per_rank + s.batching.micro_batch - 1) / s.batching.micro_batch;
}

// The optimizer steps a trainer plans for: sum_e ceil(M / K_e), or with
// `initial_k_only` epochs * ceil(M / K_0); max_steps when set.
inline int64_t planned_optimizer_steps(const Scenario& s,
                                       bool initial_k_only = false) {
  if (s.batching.max_steps >= 0) return s.batching.max_steps;
  const BatchingSpec& b = s.batching;
  const int64_t M = micro_steps_per_epoch(s);
  auto windows = [&](int64_t e) {
    const int64_t K = accumulation_at(b, initial_k_only ? 0 : e);
    return (M + K - 1) / K;
  };
  // The stored epochs one by one, the rest (same K) at once; saturating.
  const int64_t stored = initial_k_only ? 0 : stored_k_epochs(b);
  int64_t n = 0;
  for (int64_t e = 0; e < stored; ++e) n += windows(e);
  const std::optional<int64_t> rest =
      checked_mul(b.epochs - stored, windows(stored));
  const std::optional<int64_t> total =
      rest ? checked_add(n, *rest) : std::nullopt;
  return total.value_or(std::numeric_limits<int64_t>::max());
}

// The scenario's schedule with total = "auto" resolved (unchanged
// otherwise); `initial_k_only`: the horizon of ramp-schedule-horizon-fixed.
inline ScheduleSpec resolved_schedule(const Scenario& s,
                                      bool initial_k_only = false) {
  ScheduleSpec sc = s.schedule;
  if (!sc.total_auto) return sc;
  sc.total = std::max<int64_t>(1, planned_optimizer_steps(s, initial_k_only));
  if (sc.warmup_ratio >= 0)
    sc.warmup = int64_t(std::ceil(double(sc.total) * sc.warmup_ratio));
  return sc;
}

}  // namespace accumcheck
