// The Linear layer's forward and backward for Tracked<DD> (certify's fast
// bound): the same per-element reductions as oracle/layers.hpp's generic
// ones (dot_into, bit for bit the same values and bounds), computed in
// lanes of kDDLanes outputs at once so that the compiler vectorizes them
// (AVX/AVX-512 where the build enables it, plain scalar code elsewhere).
#pragma once

#include <cstdint>

#include "oracle/dd.hpp"
#include "oracle/tracked.hpp"

namespace accumcheck {

// out[b, o] = bias[o] + sum_i W[o, i] inp[b, i]  (SETS out)
void linear_forward(Tracked<DD>* out, const Tracked<DD>* inp,
                    const Tracked<DD>* W, const Tracked<DD>* bias, int64_t B,
                    int64_t in, int64_t out_dim);

// dinp = dout W (SETS; skipped if null), dW += dout^T inp, dbias += sum_b
// dout (ACCUMULATE), as oracle/layers.hpp's linear_backward.
void linear_backward(Tracked<DD>* dinp, Tracked<DD>* dW, Tracked<DD>* dbias,
                     const Tracked<DD>* dout, const Tracked<DD>* inp,
                     const Tracked<DD>* W, int64_t B, int64_t in,
                     int64_t out_dim);

}  // namespace accumcheck
