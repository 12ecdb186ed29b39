// What one trainer run leaves behind: the event log and, per optimizer
// step, the accumulated gradient just before the step and the parameters
// just after it; per window, the parameters at the window's end (runs that
// step at different rates are compared there).  Real is the engine's own
// number type, so oracle runs keep their 50 digits.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace accumcheck {

enum class EventKind {
  zero_grad,
  forward_backward,
  clip,
  optimizer_step,
  scheduler_step,
  all_reduce,  // DDP's gradient all-reduce (R > 1), one per collective
  // GradScaler (sim/scenario.hpp PrecisionSpec): scaler.unscale_() and
  // scaler.update(); a window whose unscale_ found an inf or NaN has no
  // optimizer_step.
  unscale,
  scaler_update,
  ema_update,  // the EMA of the parameters updated (EmaSpec)
};

inline std::string_view event_name(EventKind k) {
  switch (k) {
    case EventKind::zero_grad:
      return "zero_grad";
    case EventKind::forward_backward:
      return "forward_backward";
    case EventKind::clip:
      return "clip";
    case EventKind::optimizer_step:
      return "optimizer_step";
    case EventKind::scheduler_step:
      return "scheduler_step";
    case EventKind::all_reduce:
      return "all_reduce";
    case EventKind::unscale:
      return "unscale";
    case EventKind::scaler_update:
      return "scaler_update";
    case EventKind::ema_update:
      return "ema_update";
  }
  return "?";
}

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Event {
  int64_t epoch = 0;
  int64_t step = 0;   // optimizer steps taken before this event
  int64_t micro = 0;  // micro-step within the window (-1: window level)
  EventKind kind = EventKind::zero_grad;
  int64_t samples = 0;  // forward_backward: items in the micro-batch
  int64_t tokens = 0;   // token losses: loss-bearing tokens
  double loss = kNaN;   // forward_backward: the micro-batch's mean item loss
  double lr = kNaN;     // optimizer_step: lr used; scheduler_step: lr after
  double grad_norm = kNaN;  // clip: the pre-clip total norm
  // The loss scale: on forward_backward the scale its loss was multiplied
  // by, on unscale the scale divided out, on scaler_update the new scale
  // (NaN without a GradScaler).
  double loss_scale = kNaN;
  // The rank that made the call (each rank records its own calls);
  // -1 for a collective (all_reduce).
  int64_t rank = 0;
  // forward_backward: the sample ids of its micro-batch (shard), in the
  // order drawn; empty when unknown.
  std::vector<int64_t> sample_ids;
};

template <class Real>
struct StepRecord {
  int64_t step = 0;  // optimizer step index, from 0
  int64_t epoch = 0;
  int64_t window = 0;  // global window index the step belongs to
  double lr = kNaN;
  double grad_norm = kNaN;  // of the gradient handed to the optimizer
  std::vector<Real> grad;   // just before the step (after any clipping)
  std::vector<Real> param;  // just after the step
  // R > 1: the parameters of ranks 1..R-1 just after the step (rank 0's
  // are `param`); equal to it whenever the ranks stay in sync.
  std::vector<std::vector<Real>> rank_param;
};

// A window skipped by the loss scaler: its gradients overflowed, no
// optimizer step was taken (runs with loss scaling).
struct SkippedWindow {
  int64_t step = 0;          // optimizer steps before it (the window)
  int64_t backward = 0;      // backward passes of the run so far (rank 0)
  double loss_scale = kNaN;  // the scale its backward passes used
};

// One update of the EMA of the parameters (runs with [ema]).
template <class Real>
struct EmaRecord {
  int64_t steps = 0;      // optimizer steps before it
  int64_t since = 0;      // backward passes since the last optimizer step
  std::vector<Real> ema;  // the EMA after it (empty: values not recorded)
};

template <class Real>
struct WindowRecord {
  int64_t window = 0;  // global index, from 0
  int64_t epoch = 0;
  int64_t steps = 0;        // optimizer steps taken by the window's end
  double loss = kNaN;       // mean item loss over the window's forward passes
  std::vector<Real> param;  // parameters at the window's end
};

template <class Real>
struct Run {
  std::string name;  // "reference", "correct", or the scenario's semantics
  std::vector<Event> events;
  std::vector<StepRecord<Real>> steps;
  std::vector<WindowRecord<Real>> windows;
  std::vector<SkippedWindow> skipped;  // in order
  std::vector<EmaRecord<Real>> ema;    // every EMA update, in order
};

}  // namespace accumcheck
