// Learning-rate schedules, as the multiplier S(n) after n scheduler.step()
// calls, with the formulas of PyTorch and Transformers pinned exactly,
// including past their horizon (some pitfalls run past it):
//   constant   S(n) = 1
//   step       S(n) = gamma^floor(n / step_size)            (StepLR)
//   linear     warmup n/W, then max(0, (T-n)/max(1,T-W))
//   (get_linear_schedule_with_warmup) cosine     warmup n/W, then
//   0.5*(1+cos(pi*p)), p=(n-W)/max(1,T-W)
//                                                  (get_cosine_schedule_with_warmup,
//                                                  0.5 cycles:
//                                                   past T the cosine rises
//                                                   again)
//   table      S(n) = table[n]  (a declared schedule, tabulated by the
//              recorder stepping its own copy of the scheduler; NaN past
//              the table's end)
// Computed in double, as the Python schedulers compute them; every engine
// takes the same double lr (the oracle exactly, float32 engines rounded).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

inline double lr_multiplier(const ScheduleSpec& s, int64_t n) {
  if (s.table)
    return n >= 0 && n < int64_t(s.table->size())
               ? (*s.table)[size_t(n)]
               : std::numeric_limits<double>::quiet_NaN();
  const double x = double(n);
  switch (s.kind) {
    case ScheduleKind::constant:
      return 1.0;
    case ScheduleKind::step:
      return std::pow(s.gamma, double(n / std::max<int64_t>(1, s.step_size)));
    case ScheduleKind::linear:
    case ScheduleKind::cosine: {
      if (n < s.warmup) return x / double(std::max<int64_t>(1, s.warmup));
      const double span = double(std::max<int64_t>(1, s.total - s.warmup));
      if (s.kind == ScheduleKind::linear)
        return std::max(0.0, double(s.total - n) / span);
      const double progress = double(n - s.warmup) / span;
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return 1.0;
}

// schedule-horizon-in-micro-steps: every length counted in micro-batches
// (`num_training_steps = len(loader) * epochs`).  With M micro-batches an
// epoch (micro_per_epoch > 0) in W = ceil(M / k) windows, the last of
// M - (W - 1) k, a length of L optimizer steps is the micro-batches of the
// real windows it spans: (L / W) M + (L mod W) k -- L k only where k
// divides M.  A declared table is replaced by its stretched table (an
// empty one, all NaN, where the declaration could not rebuild it).
inline int64_t micro_length(int64_t L, int64_t k, int64_t micro_per_epoch) {
  if (micro_per_epoch <= 0 || k <= 0) return L * k;
  const int64_t W = (micro_per_epoch + k - 1) / k;
  return (L / W) * micro_per_epoch + (L % W) * k;
}
inline ScheduleSpec stretched(ScheduleSpec s, int64_t k,
                              int64_t micro_per_epoch = 0) {
  if (s.table) {
    s.table = s.stretched_table ? s.stretched_table
                                : std::make_shared<const std::vector<double>>();
    s.stretched_table = nullptr;
  }
  s.warmup = micro_length(s.warmup, k, micro_per_epoch);
  s.total = micro_length(s.total, k, micro_per_epoch);
  s.step_size = micro_length(s.step_size, k, micro_per_epoch);
  return s;
}

// step-budget-drops-micro-batches: a trainer that counts its step budget
// before training builds its scheduler with that budget as the horizon
// (Transformers' create_scheduler(num_training_steps=max_steps)): a linear
// or cosine schedule's total becomes the budget, and a warmup given as a
// ratio (warmup_ratio >= 0, get_warmup_steps) is taken of it.  A constant
// or step schedule has no horizon; a declared table is the user's own
// scheduler, built before the trainer counts anything: both unchanged.
inline ScheduleSpec with_horizon(ScheduleSpec s, int64_t total) {
  if (s.table ||
      (s.kind != ScheduleKind::linear && s.kind != ScheduleKind::cosine))
    return s;
  s.total = total;
  if (s.warmup_ratio >= 0)
    s.warmup = int64_t(std::ceil(double(total) * s.warmup_ratio));
  return s;
}

}  // namespace accumcheck
