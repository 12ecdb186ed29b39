// Tracked<DD> kernels four elements at a time (Linear forward, the weight
// gradient of Linear backward): every output is bit for bit what the
// scalar code (dot_into_dd, oracle/tracked_dd_reductions.hpp) gives for
// it, term by term in the same order with the same double operations;
// only four independent outputs run side by side, one per lane of a
// vector of four doubles (AVX with -mfma; without it GCC splits each
// vector operation in two), their varying inputs copied into structure of
// arrays once per call.  IEEE operations on a lane are those on a double,
// and no contraction is allowed (-ffp-contract=off), so the values and
// bounds are the same doubles.
//
// Where the scalar code would branch off its common path in a lane (every
// input exact: the exact-sum test; a non-finite value), that lane is
// finished by the scalar code itself: the exact-sum test runs on the
// lane's own sums (the value is the same in both branches), a non-finite
// lane is computed again by dot_into_dd from its inputs.
#pragma once

#include <cstdint>

#include "oracle/tracked.hpp"

namespace accumcheck {
template <class T>
struct AdamScalars;
}  // namespace accumcheck

namespace accumcheck::dd_lanes {

using TD = Tracked<DD>;

// out[b, o] = bias[o] + sum_i W[o, i] inp[b, i]  (SETS out): linear_forward.
void linear_forward(TD* out, const TD* inp, const TD* W, const TD* bias,
                    int64_t B, int64_t in, int64_t out_dim);

// dinp[b, i] = sum_o dout[b, o] W[o, i]  (SETS): linear_backward's input
// gradient.
void input_grad(TD* dinp, const TD* dout, const TD* W, int64_t B, int64_t in,
                int64_t out_dim);

// dW[o, i] += sum_b dout[b, o] inp[b, i]  (ACCUMULATES): linear_backward's
// weight gradient.
void weight_grad(TD* dW, const TD* dout, const TD* inp, int64_t B, int64_t in,
                 int64_t out_dim);

// One Adam / AdamW step (layers.hpp's adam_step for Tracked<DD>, the same
// Tracked operations per element in the same order): four elements at a
// time where every operation takes its common path in every lane (bounded
// inputs, no exact zero but an exact zero factor, finite values, a
// divisor bounded away from 0), otherwise those four elements by the
// scalar loop.  `g` and `tmp` end as the scalar loop leaves them.
void adam_step(int64_t n, TD* p, const TD* grad, TD* m, TD* v,
               const AdamScalars<TD>& s, TD& g, TD& tmp);

// The same step on doubles (the double oracle of certify's cheap ranking):
// layers_detail::adam_loop's double operations in its order, four
// elements at a time in vector lanes (sqrt and the divisions are
// correctly rounded there as in scalar code: the same bits), the rest by
// adam_loop.
void adam_step(int64_t n, double* p, const double* grad, double* m, double* v,
               const AdamScalars<double>& s);

// out[i] = tanh(inp[i])  (SETS; out may be inp): activation_forward's
// tanh.  The DD values four at a time (dd.cpp's tanh, its DD operations
// per lane in its order, both of expm1's branches formed and the lane's
// own kept), a lane off the common path (NaN, |x| > 40, a non-finite
// step) by the scalar tanh; each bound by Tracked::tanh_of.
void tanh_forward(TD* out, const TD* inp, int64_t n);

// out[i] = exp(inp[i])  (SETS; out may be inp): the softmax's
// exponentials.  The DD values eight or four at a time (dd.cpp's exp, its
// DD operations per lane in its order), a lane off the common path (NaN,
// beyond exp's range, a power of two outside the normal doubles) by the
// scalar exp; each bound by Tracked's exp from that value.
void exp_forward(TD* out, const TD* inp, int64_t n);

}  // namespace accumcheck::dd_lanes
