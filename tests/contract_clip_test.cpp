// The contract tier's clip check (verify/contract/clip.cpp): each clip's
// factor against clip_grad_norm_'s formula on the recorded norm, within
// gamma_{n+2} of the n terms the two norms differ by the rounding of.  That
// bound holds for (n + 2) u < 1 only; past it (a norm over more than 2^24
// float32 elements) it must say nothing, never turn negative and fail a
// factor that is right to a few ulps.
#include <gtest/gtest.h>

#include <string>

#include "sim/scenario.hpp"
#include "verify/contract/detail.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {
namespace {

using contract_detail::clip_check;

// One step on one rank, clipped once with max_norm 1 on a gradient of
// norm `norm`, applying `factor`.
ContractSection one_clip(double norm, double factor) {
  ContractSection c;
  c.steps = {{ContractStep{}}};
  ContractClip cl;
  cl.factor = factor;
  cl.norm = norm;
  cl.max_norm = 1.0;
  c.clips = {cl};
  return c;
}

Scenario clipping() {
  Scenario s;
  s.clip.enabled = true;
  s.clip.max_norm = 1.0;
  return s;
}

TEST(ContractClip, AFactorWithinItsBoundHolds) {
  const double want = 1.0 / (231.85269 + 1e-6);
  const auto ck = clip_check(one_clip(231.85269, want * (1 + 1e-6)), clipping(),
                             100000, false);
  EXPECT_TRUE(ck.ok) << ck.message;
}

TEST(ContractClip, AFactorOffByMoreThanItsBoundFails) {
  // 100 terms: gamma_102 ~ 6e-6; the factor 1e-4 off.
  const double want = 1.0 / (231.85269 + 1e-6);
  const auto ck = clip_check(one_clip(231.85269, want * (1 + 1e-4)), clipping(),
                             100, false);
  EXPECT_FALSE(ck.ok);
  EXPECT_NE(ck.message.find("factor"), std::string::npos) << ck.message;
}

TEST(ContractClip, PastOneOverUTheBoundSaysNothing) {
  // 50M elements (a model's whole gradient taken over its elements): the
  // worst case (n + 2) u is 3, where nu / (1 - nu) would be -1.5 and fail
  // a factor 3e-5 from the float64 norm's.
  const double want = 1.0 / (231.85269 + 1e-6);
  const auto ck = clip_check(one_clip(231.85269, want * (1 + 3e-5)), clipping(),
                             50468864, false);
  EXPECT_TRUE(ck.ok) << ck.message;
  EXPECT_NE(ck.message.find("not judged"), std::string::npos) << ck.message;
}

}  // namespace
}  // namespace accumcheck
