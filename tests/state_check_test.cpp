// certify's state checks (verify/certify/state_check.hpp) on the device
// engine's correct trace with a state.csv written beside it: a loss scale
// constant within each window passes, one that changes inside a window fails
// naming scaler-update-every-micro-step, a wrong logged loss is a check of its
// own that leaves the training verdict alone, the run column selects the
// judged run's rows (a file without it, as recorders wrote before it, is
// one run's), and a malformed state.csv is an InputError naming the file
// and line.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "certify_test_util.hpp"
#include "sim/errors.hpp"
#include "sim/pitfalls.hpp"
#include "verify/certify/certify.hpp"
#include "verify/trace/trace.hpp"

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
  {
    std::ofstream(dir + "/state.csv") << "kind,step,tensor,index,value\n"
                                      << rows;
  }
  seal_trace(dir);  // a trace whose record lists the state written here
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
  // The trainer's own scales (state.csv) are forced on every candidate, so
  // under them correct would weigh micro-batch 2 twice (scaled by 2^17,
  // unscaled by 2^16); this trace was written without a scaler, so its
  // values leave that bound.  The evidence shows the trace's own weights
  // are correct's (each micro-batch 1/N_w): the state is the cause named.
  const std::string text = certify_text(r);
  EXPECT_NE(text.find("micro-batch 2 weighs 1/N_w"), std::string::npos) << text;
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

// state.csv with the run column (as TraceWriter and the recorder write
// it): only the judged run's rows count.  The trace holds one run; rows of
// another run that change the scale inside a window are not its.
TEST(StateCheck, RunColumnSelectsTheJudgedRunsRows) {
  const std::string dir = device_trace("state_run_column", {});
  const std::string judged = read_trace(dir).runs.back().name;
  auto with_run = [](const std::string& run, const std::string& rows) {
    std::string o;
    size_t at = 0;
    while (at < rows.size()) {
      const size_t end = rows.find('\n', at);
      o += run + "," + rows.substr(at, end + 1 - at);
      at = end + 1;
    }
    return o;
  };
  auto write = [&](const std::string& rows) {
    {
      std::ofstream(dir + "/state.csv") << "run,kind,step,tensor,index,value\n"
                                        << rows;
    }
    seal_trace(dir);
  };
  write(with_run(judged, scale_rows(dir, -1)) +
        with_run("other", scale_rows(dir, 2)));
  const CertifyReport ok = certify(scenario(), dir);
  EXPECT_TRUE(ok.pass) << certify_text(ok);
  ASSERT_NE(check(ok, "loss scale"), nullptr);
  EXPECT_TRUE(check(ok, "loss scale")->ok);

  write(with_run("other", scale_rows(dir, -1)) +
        with_run(judged, scale_rows(dir, 2)));
  const CertifyReport bad = certify(scenario(), dir);
  EXPECT_FALSE(bad.pass);
  ASSERT_NE(check(bad, "loss scale"), nullptr);
  EXPECT_FALSE(check(bad, "loss scale")->ok);

  // Rows of other runs only: no state check at all.
  write(with_run("other", scale_rows(dir, 2)));
  EXPECT_EQ(check(certify(scenario(), dir), "loss scale"), nullptr);
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
