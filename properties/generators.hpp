// RapidCheck generators for scenarios.
//
// Floats are built from small integer mantissas and exponents (m * 2^-e),
// never with gen::real: they are exact in float32, cover small exponents,
// and shrink towards simple values.  Each property forces the trigger of
// the pitfall it tests through `Triggers`, so nothing passes vacuously.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <optional>
#include <string>

#include "sim/scenario.hpp"

namespace accumcheck::properties {

struct Triggers {
  bool accumulation = true;      // K >= 2
  bool partial_window = false;   // the epoch's micro-step count % K != 0
  bool short_micro = false;      // the last micro-batch is short (b >= 2)
  bool schedule = false;         // a non-constant lr schedule
  bool clip = false;             // clipping enabled
  bool adam = false;             // Adam or AdamW
  bool sgd_plain = false;        // SGD, no momentum, no weight decay, no L2
  bool no_clip = false;          // clipping disabled
  bool no_weight_decay = false;  // no coupled decay, no L2 in the loss
  bool smooth = false;           // tanh or gelu (no ReLU kinks), mse
  bool dyadic_bitwise = false;   // the bitwise tier: dyadic, identity/relu,
                                 // mse, b and K powers of two, full windows
  bool full_windows = false;     // K divides the micro-step count, no short
  bool single_epoch = false;
  bool k_power_of_two = false;  // K in {2, 4}
  int max_width = 16;           // layer widths drawn in 1..16
  // Data-parallel ranks R drawn in min_ranks..max_ranks (samples scaled
  // so each rank's shard keeps the window structure above); the sampler
  // drawn among pad, drop-last and split unless `sampler` is set.
  int min_ranks = 1, max_ranks = 1;
  std::optional<Sampler> sampler;
  bool uneven_shards = false;  // R does not divide n (sampler split: the
                               // ranks' shards differ in size)
  // Written into [trainer] so a counterexample file replays the pitfall.
  std::vector<Pitfall> pitfalls;
};

rc::Gen<Scenario> scenario(const Triggers& t);

// A power-of-two scaled small integer: m * 2^-e.
rc::Gen<double> dyadic_real(int m_lo, int m_hi, int e_lo, int e_hi);

}  // namespace accumcheck::properties

namespace accumcheck {
// Found by RapidCheck through ADL: a failing case prints as a complete,
// ready-to-run scenario file, a pitfall as its id.
void showValue(const Scenario& s, std::ostream& os);
void showValue(Pitfall p, std::ostream& os);
}  // namespace accumcheck
