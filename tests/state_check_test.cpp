// certify's state checks (verify/state_check.hpp) on the device engine's
// correct trace with a state.csv written beside it: a loss scale constant
// within each window passes, one that changes inside a window fails naming
// scaler-update-every-micro-step, a wrong logged loss is a check of its
// own that leaves the training verdict alone, and a malformed state.csv is
// an InputError naming the file and line.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "certify_test_util.hpp"
#include "sim/errors.hpp"
#include "sim/pitfalls.hpp"
#include "verify/certify.hpp"
#include "verify/trace.hpp"

namespace accumcheck {
namespace {

using certify_test::device_trace;
using certify_test::scenario;

// One loss_scale row per backward pass of the trace; backward `odd` (if
// >= 0) gets twice the scale.
std::string scale_rows(const std::string& dir, int64_t odd) {
  const Trace t = read_trace(dir);
  std::string o;
  int64_t b = 0;
  for (const TraceEvent& te : t.runs.back().events)
    if (te.event.kind == EventKind::forward_backward) {
      o += "loss_scale," + std::to_string(te.event.step) + ",," +
           std::to_string(b) + "," + (b == odd ? "131072" : "65536") + "\n";
      ++b;
    }
  return o;
}

void write_state(const std::string& dir, const std::string& rows) {
  std::ofstream(dir + "/state.csv") << "kind,step,tensor,index,value\n" << rows;
}

const CertifyCheck* check(const CertifyReport& r, const std::string& name) {
  for (const CertifyCheck& c : r.checks)
    if (c.name == name) return &c;
  return nullptr;
}

TEST(StateCheck, ConstantLossScalePasses) {
  const std::string dir = device_trace("state_scale_ok", {});
  write_state(dir, scale_rows(dir, -1));
  const CertifyReport r = certify(scenario(), dir);
  EXPECT_TRUE(r.pass) << certify_text(r);
  ASSERT_NE(check(r, "loss scale"), nullptr);
  EXPECT_TRUE(check(r, "loss scale")->ok);
}

TEST(StateCheck, ScaleChangedWithinAWindowIsNamed) {
  const std::string dir = device_trace("state_scale_bad", {});
  write_state(dir, scale_rows(dir, 2));  // backward 2: inside window 0
  const CertifyReport r = certify(scenario(), dir);
  EXPECT_FALSE(r.pass);
  ASSERT_NE(check(r, "loss scale"), nullptr);
  EXPECT_FALSE(check(r, "loss scale")->ok);
  EXPECT_NE(r.diagnosis.find("state finding: " +
                             std::string(pitfall_id(
                                 Pitfall::scaler_update_every_micro_step))),
            std::string::npos)
      << r.diagnosis;
  // Gradients and parameters are correct's: no ranking, the state is the
  // diagnosis.
  EXPECT_TRUE(r.ranking.empty());
}

TEST(StateCheck, WrongLoggedLossIsACheckOfItsOwn) {
  const std::string dir = device_trace("state_logged", {});
  write_state(dir, "logged_loss,0,,0,1000\n");
  const CertifyReport r = certify(scenario(), dir);
  EXPECT_TRUE(r.pass) << certify_text(r);
  const CertifyCheck* c = check(r, "logged loss");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->ok);
  EXPECT_TRUE(c->separate);
  EXPECT_NE(r.verdict.find("the logged loss is wrong"), std::string::npos)
      << r.verdict;
}

TEST(StateCheck, MalformedStateIsInputErrorWithLine) {
  const std::string dir = device_trace("state_bad_kind", {});
  write_state(dir, "loss_scale,0,,0,65536\nmomentum,0,,0,1\n");
  try {
    certify(scenario(), dir);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("state.csv:3"), std::string::npos) << what;
    EXPECT_NE(what.find("unknown kind 'momentum'"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace accumcheck
