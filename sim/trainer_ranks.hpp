// Trainer<Engine>'s ranks (sim/trainer.hpp: R > 1 is DDP): every rank a
// full replica whose EngineState the trainer keeps and swaps into the one
// engine; DDP's all-reduce of .grad in rank order; zero_grad on the rank
// the engine holds.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "sim/trainer_loop.hpp"

namespace accumcheck {

template <Engine E>
void Trainer<E>::init_ranks(int64_t R) {
  R_ = std::max<int64_t>(R, 1);
  active_ = rank_ = 0;
  rank_state_.clear();
  if (R_ > 1) rank_state_.assign(size_t(R_), e_.state());
}

// Makes the engine hold rank r (saving the rank it held).
template <Engine E>
void Trainer<E>::use_rank(int64_t r) {
  rank_ = r;
  if (R_ == 1 || r == active_) return;
  // The active rank's state into its slot, rank r's out of its own (the
  // slot of the rank the engine holds is stale, as after a copy).
  stash_state(active_);
  load_state(r);
  // An engine whose gradient buffer is not numbers (the coefficient
  // engine) swaps it itself.
  if constexpr (requires { e_.hold_rank(r); }) e_.hold_rank(r);
  active_ = r;
}

// DDP's all-reduce of .grad: every rank gets
// sum_r fl(g_r * fl(1/R)), summed in rank order (a fixed order: the
// device's bits do not depend on timing).
template <Engine E>
void Trainer<E>::all_reduce(int64_t micro) {
  if (R_ == 1) return;
  if constexpr (requires { e_.average_ranks(R_); }) {
    e_.average_ranks(R_);  // exact coefficients: the order is moot
    event(EventKind::all_reduce, micro, [](Event& ev) { ev.rank = -1; });
    return;
  }
  stash_state(active_);
  const size_t P = rank_state_[0].grads.size();
  const Real inv = Real(1) / Real(R_);
  std::vector<Real> avg(P);
  for (size_t i = 0; i < P; ++i) {
    Real acc = rank_state_[0].grads[i] * inv;
    for (size_t r = 1; r < size_t(R_); ++r) {
      const Real t = rank_state_[r].grads[i] * inv;
      acc += t;
    }
    avg[i] = acc;
  }
  for (auto& st : rank_state_) st.grads = avg;
  load_state(active_);
  event(EventKind::all_reduce, micro, [](Event& ev) { ev.rank = -1; });
}

// On the rank the engine holds.
template <Engine E>
void Trainer<E>::zero_grad(int64_t micro) {
  e_.zero_grad();
  inf_pending_ = false;  // an injected overflow lives until zero_grad
  event(EventKind::zero_grad, micro);
}

}  // namespace accumcheck
