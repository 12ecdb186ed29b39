// Traces: write -> read is exact, bytes are deterministic, and every kind
// of malformed file is an InputError naming the file and line; the
// completion record (complete.csv) refuses a damaged or unfinished trace.
#include "verify/trace/trace.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>

#include "sim/atomic_file.hpp"
#include "sim/errors.hpp"
#include "verify/trace/sha256.hpp"

namespace accumcheck {
namespace {

namespace fs = std::filesystem;

constexpr double kInf = std::numeric_limits<double>::infinity();

ParamLayout layout() {
  ModelSpec m;
  m.widths = {2, 3, 1};
  return layout_of(m);  // 0.weight 3x2, 0.bias 3, 2.weight 1x3, 2.bias 1
}

// Values chosen to stress exact printing: non-terminating binary
// fractions, extremes, subnormals, signed zero, infinities.
double tricky(int64_t i) {
  const double v[] = {0.1,          1.0 / 3.0,
                      -2.0 / 3.0,   1e-300,
                      5e-324,       std::numeric_limits<double>::max(),
                      -0.0,         123456789.123456789,
                      double(0.1f), kInf,
                      -kInf,        std::nextafter(1.0, 2.0),
                      1.0};
  return v[i % int64_t(std::size(v))] * (i / int64_t(std::size(v)) + 1);
}

template <class Real>
Run<Real> make_run(const std::string& name, int64_t steps, int64_t total) {
  Run<Real> r;
  r.name = name;
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t k = 0; k < 2; ++k) {
      Event fb;
      fb.epoch = t / 2;
      fb.step = t;
      fb.micro = k;
      fb.kind = EventKind::forward_backward;
      fb.samples = 3;
      fb.loss = tricky(t * 2 + k);
      fb.sample_ids = {t * 2 + k, 7};
      r.events.push_back(fb);
    }
    Event clip;
    clip.epoch = t / 2;
    clip.step = t;
    clip.micro = -1;
    clip.kind = EventKind::clip;
    clip.grad_norm = 1.0 / 7.0 + double(t);
    r.events.push_back(clip);
    Event opt = clip;
    opt.kind = EventKind::optimizer_step;
    opt.grad_norm = kNaN;
    opt.lr = 0.001 * double(t + 1);
    r.events.push_back(opt);
    Event sched = opt;
    sched.kind = EventKind::scheduler_step;
    sched.step = t + 1;
    r.events.push_back(sched);
    Event zg = sched;
    zg.kind = EventKind::zero_grad;
    zg.lr = kNaN;
    zg.tokens = 5;
    r.events.push_back(zg);

    StepRecord<Real> s;
    s.step = t;
    for (int64_t i = 0; i < total; ++i) {
      s.grad.push_back(Real(tricky(i + t)));
      s.param.push_back(Real(-tricky(i + 3 * t + 1)));
    }
    r.steps.push_back(s);
  }
  return r;
}

std::string temp_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "accumcheck_trace_test/" + name;
  fs::remove_all(d);
  return d;
}

TraceWriter sample_writer() {
  TraceWriter w("zero-grad", "0123456789abcdef", "oracle", "mpfr-50", "9.9.9");
  w.add_meta("blas", "OpenBLAS 0.3.21, \"pthreads\"");
  const ParamLayout L = layout();
  add_run(w, make_run<double>("reference", 3, L.total), L);
  add_run(w, make_run<float>("zero-grad-never", 2, L.total), L);
  return w;
}

bool same(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

TEST(Trace, WriteReadRoundTripIsExact) {
  const ParamLayout L = layout();
  const std::string dir = temp_dir("roundtrip");
  write_trace(dir, sample_writer());
  const Trace t = read_trace(dir);

  EXPECT_EQ(t.meta_value("schema"), "accumcheck-trace/2");
  EXPECT_EQ(t.meta_value("scenario"), "zero-grad");
  EXPECT_EQ(t.meta_value("scenario_digest"), "0123456789abcdef");
  EXPECT_EQ(t.meta_value("engine"), "oracle");
  EXPECT_EQ(t.meta_value("precision"), "mpfr-50");
  EXPECT_EQ(t.meta_value("tool_version"), "9.9.9");
  EXPECT_EQ(t.meta_value("blas"), "OpenBLAS 0.3.21, \"pthreads\"");
  ASSERT_EQ(t.runs.size(), 2u);

  const accumcheck::Run<double> ref = make_run<double>("reference", 3, L.total);
  const TraceRun* r = t.run("reference");
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->events.size(), ref.events.size());
  for (size_t i = 0; i < ref.events.size(); ++i) {
    const Event& a = ref.events[i];
    const Event& b = r->events[i].event;
    EXPECT_EQ(a.epoch, b.epoch);
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.micro, b.micro);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.samples, b.samples);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_TRUE(same(a.loss, b.loss)) << a.loss << " " << b.loss;
    EXPECT_TRUE(same(a.lr, b.lr)) << a.lr << " " << b.lr;
    EXPECT_TRUE(same(a.grad_norm, b.grad_norm));
    EXPECT_EQ(a.sample_ids, b.sample_ids);
    EXPECT_EQ(r->events[i].line, int64_t(i) + 2);
  }

  const std::vector<TraceStep> steps = gather_steps(t, *r, L);
  ASSERT_EQ(steps.size(), ref.steps.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_EQ(steps[s].step, ref.steps[s].step);
    for (int64_t i = 0; i < L.total; ++i) {
      EXPECT_TRUE(same(steps[s].grad[size_t(i)], ref.steps[s].grad[size_t(i)]))
          << s << " " << i;
      EXPECT_TRUE(
          same(steps[s].param[size_t(i)], ref.steps[s].param[size_t(i)]));
    }
  }

  // float runs come back as the doubles of their floats.
  const accumcheck::Run<float> zg =
      make_run<float>("zero-grad-never", 2, L.total);
  const std::vector<TraceStep> zsteps =
      gather_steps(t, *t.run("zero-grad-never"), L);
  ASSERT_EQ(zsteps.size(), 2u);
  for (int64_t i = 0; i < L.total; ++i)
    EXPECT_TRUE(
        same(zsteps[1].param[size_t(i)], double(zg.steps[1].param[size_t(i)])));
}

// R > 1: a rank column on both files; each rank's parameters read back
// under its rank, collective events under -1.
TEST(Trace, RanksRoundTrip) {
  const std::string dir = temp_dir("ranks");
  const ParamLayout L = layout();
  accumcheck::Run<double> r = make_run<double>("ddp", 2, L.total);
  Event ar = r.events.back();
  ar.kind = EventKind::all_reduce;
  ar.rank = -1;
  r.events.push_back(ar);
  for (auto& st : r.steps) {
    st.rank_param.push_back(st.param);
    st.rank_param.back()[0] += 1.0;  // rank 1 diverged
  }
  TraceWriter w("ddp", "0123456789abcdef", "oracle", "mpfr-50", "9.9.9");
  w.with_ranks();
  add_run(w, r, L);
  write_trace(dir, w);
  EXPECT_NE(read_file_bytes(dir + "/events.csv", "trace_bytes")
                .find("grad_norm,sample_ids,rank\n"),
            std::string::npos);
  const Trace t = read_trace(dir);
  const TraceRun& run = *t.run("ddp");
  EXPECT_EQ(value_ranks(run), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(run.events.back().event.kind, EventKind::all_reduce);
  EXPECT_EQ(run.events.back().event.rank, -1);
  const auto s0 = gather_steps(t, run, L, 0), s1 = gather_steps(t, run, L, 1);
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_TRUE(s1[0].grad.empty());  // ranks > 0: parameters only
  EXPECT_EQ(s1[1].param[0], s0[1].param[0] + 1.0);
  EXPECT_EQ(s1[1].param[1], s0[1].param[1]);
  // One-rank writers keep the rank-free layout and refuse other ranks.
  TraceWriter one("x", "0123456789abcdef", "oracle", "mpfr-50", "9.9.9");
  one.begin_run("a");
  EXPECT_THROW(one.add_value(0, ValueKind::param, "0.weight", 0, 1.0, 1),
               std::logic_error);
}

// The training state beyond gradients goes to state.csv, one run's rows
// told apart by `run` (as the recorder writes it): the loss scale of each
// rank-0 backward pass, skipped windows, each EMA update and the EMA after
// it; events.csv and values.csv keep their columns and kinds.
TEST(Trace, StateRowsRoundTrip) {
  const std::string dir = temp_dir("state");
  const ParamLayout L = layout();
  accumcheck::Run<float> r = make_run<float>("scaled", 2, L.total);
  for (Event& e : r.events)
    if (e.kind == EventKind::forward_backward) e.loss_scale = 65536.0 / 3.0;
  r.skipped.push_back({1, 4, 32768});
  for (int64_t c = 0; c < 2; ++c) {
    EmaRecord<float> u{c + 1, c, {}};
    for (int64_t i = 0; i < L.total; ++i) u.ema.push_back(float(tricky(i)));
    r.ema.push_back(u);
  }
  TraceWriter w("scaled", "0123456789abcdef", "device", "float32", "9.9.9");
  add_run(w, make_run<double>("plain", 1, L.total), L);  // no state rows
  add_run(w, r, L);
  fs::create_directories(dir);
  std::ofstream(dir + "/state.csv") << "stale\n";
  write_trace(dir, w);
  const std::string state = read_file_bytes(dir + "/state.csv", "trace_bytes");
  EXPECT_EQ(state.substr(0, state.find('\n')),
            "run,kind,step,tensor,index,value");
  EXPECT_NE(state.find("\nscaled,loss_scale,1,,3,21845.333333333332\n"),
            std::string::npos)
      << state;
  EXPECT_NE(state.find("\nscaled,skipped,1,,4,32768\n"), std::string::npos);
  EXPECT_NE(state.find("\nscaled,ema_update,1,,2,1\n"), std::string::npos);
  EXPECT_NE(state.find("\nscaled,ema,1,2.bias,0,"), std::string::npos);
  EXPECT_EQ(
      read_file_bytes(dir + "/events.csv", "trace_bytes").find("loss_scale"),
      std::string::npos);
  EXPECT_EQ(read_file_bytes(dir + "/values.csv", "trace_bytes").find(",ema,"),
            std::string::npos);

  const StateSection st = read_state(dir, "scaled");
  ASSERT_TRUE(st.present);
  ASSERT_EQ(st.rows.size(), 4u + 1 + 2 * (1 + size_t(L.total)));
  EXPECT_EQ(st.rows[0].run, "scaled");
  EXPECT_EQ(st.rows[0].kind, "loss_scale");
  EXPECT_EQ(st.rows[0].value, 65536.0 / 3.0);
  EXPECT_EQ(st.rows.back().kind, "ema");
  EXPECT_EQ(st.rows.back().value, double(float(tricky(L.total - 1))));
  EXPECT_TRUE(read_state(dir, "plain").rows.empty());

  // A file without the run column (recorders before it): one run's rows,
  // whichever run is asked for.
  std::ofstream(dir + "/state.csv") << "kind,step,tensor,index,value\n"
                                       "loss_scale,0,,0,1024\n";
  const StateSection old = read_state(dir, "plain");
  ASSERT_EQ(old.rows.size(), 1u);
  EXPECT_EQ(old.rows[0].run, "plain");
  EXPECT_EQ(old.rows[0].line, 2);
  // An empty run name is refused with its line.
  std::ofstream(dir + "/state.csv") << "run,kind,step,tensor,index,value\n"
                                       ",loss_scale,0,,0,1024\n";
  try {
    read_state(dir, "plain");
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("state.csv:2"), std::string::npos)
        << e.what();
  }
  // Rewritten without state rows: no state.csv left behind.
  write_trace(dir, sample_writer());
  EXPECT_FALSE(fs::exists(dir + "/state.csv"));
}

TEST(Trace, BytesAreDeterministicAndTidy) {
  const std::string a = temp_dir("det_a"), b = temp_dir("det_b");
  write_trace(a, sample_writer());
  write_trace(b, sample_writer());
  for (const char* f : {"meta.csv", "events.csv", "values.csv", "complete.csv"})
    EXPECT_EQ(read_file_bytes(a + "/" + f, "trace_bytes"),
              read_file_bytes(b + "/" + f, "trace_bytes"))
        << f;

  const std::string events = read_file_bytes(a + "/events.csv", "trace_bytes");
  EXPECT_EQ(events.substr(0, events.find('\n')),
            "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm,"
            "sample_ids");
  EXPECT_NE(events.find("\nreference,0,0,0,forward_backward,3,0,"
                        "0.10000000000000001,,,0 7\n"),
            std::string::npos);
  const std::string values = read_file_bytes(a + "/values.csv", "trace_bytes");
  EXPECT_EQ(values.substr(0, values.find('\n')),
            "run,step,kind,tensor,index,value");
  EXPECT_NE(values.find("\nreference,0,grad,0.weight,0,0.10000000000000001\n"),
            std::string::npos);
  // No temporary files left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 4);
}

// ---- the completion record (complete.csv): written last by write_trace,
// checked first by read_trace.

TEST(TraceComplete, RecordsEveryFileAndReadsBack) {
  const std::string dir = temp_dir("complete_record");
  write_trace(dir, sample_writer());
  const std::string rec = read_file_bytes(dir + "/complete.csv", "trace_bytes");
  const std::string events =
      read_file_bytes(dir + "/events.csv", "trace_bytes");
  const auto rows = std::count(events.begin(), events.end(), '\n') - 1;
  EXPECT_EQ(rec.substr(0, rec.find('\n')), "file,rows,bytes,sha256");
  EXPECT_NE(rec.find(fmt::format("\nevents.csv,{},{},{}\n", rows, events.size(),
                                 sha256_hex(events))),
            std::string::npos)
      << rec;
  // The last row counts the files above it (events, values, meta).
  EXPECT_TRUE(rec.ends_with("\ncomplete.csv,3,,\n")) << rec;
  EXPECT_NO_THROW(read_trace(dir));
  // seal_trace writes the same record for the same files.
  seal_trace(dir);
  EXPECT_NE(read_file_bytes(dir + "/complete.csv", "trace_bytes")
                .find(fmt::format("events.csv,{},{},", rows, events.size())),
            std::string::npos);
}

TEST(TraceComplete, Sha256IsFips180) {
  // FIPS 180-2 appendix B's examples, and a multi-block input.
  EXPECT_EQ(sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // a million 'a', fed in uneven pieces
  const std::string part(999, 'a');
  for (int i = 0; i < 1001; ++i) h.update(part);
  h.update("a");
  EXPECT_EQ(h.hex(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Each damage gives an InputError naming the damaged file and what
// happened (PyTorch.trace.damaged runs the whole battery on recorded
// traces; these need no PyTorch).
class TraceDamaged : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_trace(dir_, sample_writer());
  }
  std::string text(const std::string& f) {
    return read_file_bytes(dir_ + "/" + f, "trace_bytes");
  }
  void put(const std::string& f, const std::string& bytes) {
    std::ofstream(dir_ + "/" + f, std::ios::binary | std::ios::trunc) << bytes;
  }
  void expect(const std::string& file, const std::string& needle) {
    try {
      read_trace(dir_);
      ADD_FAILURE() << "no error; expected " << needle;
    } catch (const InputError& e) {
      EXPECT_EQ(fs::path(e.file()).filename().string(), file) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << e.what() << "\n  expected to contain: " << needle;
    }
  }
  std::string dir_;
};

TEST_F(TraceDamaged, CutAtALineEnd) {
  const std::string t = text("events.csv");
  const auto rows = std::count(t.begin(), t.end(), '\n') - 1;
  put("events.csv", t.substr(0, t.find('\n', t.find('\n') + 1) + 1));
  expect(
      "events.csv",
      fmt::format("{} rows recorded in complete.csv, 1 read: the file was cut",
                  rows));
  put("events.csv", t.substr(0, t.find('\n') + 1));
  expect("events.csv", "0 read: the file was cut (emptied to its header)");
}

TEST_F(TraceDamaged, CutMidLineEmptiedRemoved) {
  const std::string t = text("values.csv");
  put("values.csv", t.substr(0, t.size() - 3));
  expect("values.csv", "and its last line has no line end: the file was cut");
  put("values.csv", "");
  expect("values.csv", "empty, but complete.csv records");
  fs::remove(fs::path(dir_) / "values.csv");
  expect("values.csv", "missing, but complete.csv records");
}

TEST_F(TraceDamaged, ChangedOrSwapped) {
  std::string t = text("meta.csv");
  t[t.size() - 2] = t[t.size() - 2] == 'x' ? 'y' : 'x';  // same size
  put("meta.csv", t);
  expect("meta.csv", "its SHA-256 is not the one recorded");
  put("meta.csv", text("meta.csv") + "notes,x\n");
  expect("meta.csv", "rows were added after the run");
}

TEST_F(TraceDamaged, RecordMissingCutOrStray) {
  const std::string rec = text("complete.csv");
  put("complete.csv", rec.substr(0, rec.rfind("complete.csv,")));
  expect("complete.csv", "its last row (complete.csv,N,,) is missing");
  put("complete.csv", rec.substr(0, rec.size() - 1));
  expect("complete.csv", "truncated file");
  put("complete.csv", rec);
  put("state.csv", "run,kind,step,tensor,index,value\n");
  expect("state.csv", "a trace file that complete.csv does not list");
  fs::remove(fs::path(dir_) / "state.csv");
  fs::remove(fs::path(dir_) / "complete.csv");
  expect("complete.csv", "missing: the trace has no completion record");
}

TEST_F(TraceDamaged, MarkerOfARunThatStopped) {
  put("rank0.incomplete",
      "key,value\nrank,0\nranks,1\nstate,ended\nsteps,5\nbackward,20\n"
      "why,KeyboardInterrupt\nplanned,8\n");
  expect("rank0.incomplete",
         "the run stopped after 5 of 8 optimizer steps (20 backward passes): "
         "KeyboardInterrupt");
  put("rank0.incomplete",
      "key,value\nrank,0\nranks,1\nstate,recording\nsteps,1\nbackward,"
      "1\nwhy,\n");
  expect("rank0.incomplete",
         "after at least 1 optimizer step (1 backward pass): the process died "
         "while recording");
}

TEST(Trace, WriterRefusesAmbiguousInput) {
  TraceWriter w("s", "d", "e", "p");
  w.begin_run("a");
  EXPECT_THROW(w.begin_run("a"), std::invalid_argument);
  EXPECT_THROW(w.begin_run("line\nbreak"), std::invalid_argument);
  EXPECT_THROW(w.add_meta("schema", "x"), std::invalid_argument);
}

// Rewrites one file of a fresh sample trace and expects read_trace to
// fail at `file`:`line` with a message containing `needle`.
class TraceErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_trace(dir_, sample_writer());
  }
  std::string text(const std::string& file) {
    return read_file_bytes(dir_ + "/" + file, "trace_bytes");
  }
  void put(const std::string& file, const std::string& bytes) {
    {
      std::ofstream(dir_ + "/" + file, std::ios::binary | std::ios::trunc)
          << bytes;
    }
    seal_trace(dir_);  // past the completion record: the reader's checks
  }
  void replace(const std::string& file, const std::string& from,
               const std::string& to) {
    std::string t = text(file);
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    put(file, t);
  }
  void expect_error(const std::string& file, int64_t line,
                    const std::string& needle) {
    try {
      read_trace(dir_);
      ADD_FAILURE() << "no error; expected " << needle;
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), (fs::path(dir_) / file).string());
      EXPECT_EQ(e.line(), line) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << e.what() << "\n  expected to contain: " << needle;
    }
  }
  // The 1-based line of the first line containing `s`.
  int64_t line_of(const std::string& file, const std::string& s) {
    std::istringstream in(text(file));
    std::string l;
    for (int64_t n = 1; std::getline(in, l); ++n)
      if (l.find(s) != std::string::npos) return n;
    ADD_FAILURE() << s;
    return -1;
  }
  std::string dir_;
};

TEST_F(TraceErrors, MissingColumn) {
  replace("events.csv", ",grad_norm,", ",");
  expect_error("events.csv", 1, "missing column 'grad_norm'");
}

TEST_F(TraceErrors, UnknownColumn) {
  replace("values.csv", "index,value", "idx,value");
  expect_error("values.csv", 1, "unknown column 'idx'");
}

TEST_F(TraceErrors, UnknownEvent) {
  const int64_t line = line_of("events.csv", "optimizer_step");
  replace("events.csv", "optimizer_step", "optimiser_step");
  expect_error("events.csv", line, "unknown event 'optimiser_step'");
}

TEST_F(TraceErrors, NanText) {
  replace("events.csv", "0.10000000000000001", "nan");
  expect_error("events.csv", 2,
               "expected a number (NaN is an empty field), "
               "got 'nan'");
}

TEST_F(TraceErrors, Garbage) {
  replace("values.csv", "0.10000000000000001", "0.1x");
  expect_error("values.csv", 2, "got '0.1x'");
  write_trace(dir_, sample_writer());
  replace("events.csv", "reference,0,0,0,", "reference,zero,0,0,");
  expect_error("events.csv", 2, "expected an integer >= 0, got 'zero'");
}

TEST_F(TraceErrors, TooFewColumns) {
  replace("events.csv", "reference,0,0,0,forward_backward,3,0,",
          "reference,0,0,0,forward_backward,3,");
  expect_error("events.csv", 2, "too few columns");
}

TEST_F(TraceErrors, Truncated) {
  std::string t = text("values.csv");
  const int64_t lines = int64_t(std::count(t.begin(), t.end(), '\n'));
  t.resize(t.size() - 4);  // cut inside the last line
  put("values.csv", t);
  expect_error("values.csv", lines, "truncated file");
}

TEST_F(TraceErrors, EmptyFile) {
  put("events.csv", "");
  expect_error("events.csv", 1, "empty file");
}

TEST_F(TraceErrors, MissingFile) {
  fs::remove(fs::path(dir_) / "values.csv");
  seal_trace(dir_);
  expect_error("values.csv", 0, "cannot open");
}

TEST_F(TraceErrors, StepsOutOfOrder) {
  // Move the first step-1 row of the reference run above a step-0 row.
  std::string t = text("events.csv");
  const size_t first = t.find('\n') + 1;  // line 2: step 0
  const size_t step1 = t.find("\nreference,0,1,") + 1;
  const size_t step1_end = t.find('\n', step1) + 1;
  const std::string row = t.substr(step1, step1_end - step1);
  t.erase(step1, step1_end - step1);
  t.insert(first, row);
  put("events.csv", t);
  expect_error("events.csv", 3,
               "steps out of order in run 'reference': 0 "
               "after 1 (line 2)");
}

TEST_F(TraceErrors, DuplicatedValuesRow) {
  std::string t = text("values.csv");
  const size_t l3 = t.find('\n', t.find('\n') + 1) + 1;
  const size_t l3_end = t.find('\n', l3) + 1;
  t.insert(l3_end, t.substr(l3, l3_end - l3));
  put("values.csv", t);
  expect_error("values.csv", 4, "duplicated row");
}

TEST_F(TraceErrors, SplitRun) {
  put("events.csv", text("events.csv") + "reference,9,9,0,zero_grad,0,0,,,,\n");
  const int64_t lines = line_of("events.csv", "reference,9,9");
  expect_error("events.csv", lines, "rows of run 'reference' are split");
}

TEST_F(TraceErrors, SchemaMismatch) {
  replace("meta.csv", "accumcheck-trace/2", "accumcheck-trace/9");
  expect_error("meta.csv", 2,
               "schema version mismatch: expected "
               "'accumcheck-trace/2' (or 'accumcheck-trace/1'), got "
               "'accumcheck-trace/9'");
}

// Version 1 (no sample_ids column) is still read; its events carry no ids.
TEST_F(TraceErrors, Version1IsRead) {
  replace("meta.csv", "accumcheck-trace/2", "accumcheck-trace/1");
  std::string t = text("events.csv"), v1;
  for (size_t at = 0; at < t.size();) {
    const size_t end = t.find('\n', at);
    const std::string line = t.substr(at, end - at);
    v1 += line.substr(0, line.rfind(',')) + "\n";
    at = end + 1;
  }
  put("events.csv", v1);
  const Trace tr = read_trace(dir_);
  ASSERT_FALSE(tr.runs.empty());
  ASSERT_FALSE(tr.runs[0].events.empty());
  for (const TraceEvent& e : tr.runs[0].events)
    EXPECT_TRUE(e.event.sample_ids.empty());
  // A version 1 trace with the column, or version 2 without it, is refused.
  put("events.csv", t);
  expect_error("events.csv", 1, "column 'sample_ids' in a accumcheck-trace/1");
  replace("meta.csv", "accumcheck-trace/1", "accumcheck-trace/2");
  put("events.csv", v1);
  expect_error("events.csv", 1, "missing column 'sample_ids'");
}

TEST_F(TraceErrors, SampleIds) {
  replace("events.csv", ",0 7\n", ",0 x\n");
  expect_error("events.csv", 2, "expected an integer >= 0, got 'x'");
  write_trace(dir_, sample_writer());
  const int64_t line = line_of("events.csv", "optimizer_step");
  std::string t = text("events.csv");
  const size_t at = t.find("optimizer_step");
  t.insert(t.find('\n', at), "3");
  put("events.csv", t);
  expect_error("events.csv", line,
               "sample ids on a optimizer_step event; only forward_backward");
}

TEST_F(TraceErrors, MissingMetaKey) {
  replace("meta.csv", "engine,oracle\n", "");
  expect_error("meta.csv", 0, "missing required meta key 'engine'");
}

TEST_F(TraceErrors, DuplicatedMetaKey) {
  put("meta.csv", text("meta.csv") + "engine,cuda\n");
  expect_error("meta.csv", 9, "meta key 'engine' appears twice");
}

TEST_F(TraceErrors, UnknownKind) {
  replace("values.csv", ",grad,", ",gradient,");
  expect_error("values.csv", 2, "unknown kind 'gradient'");
}

TEST(TraceGather, ShapeChecks) {
  const std::string dir = temp_dir("gather");
  write_trace(dir, sample_writer());
  const Trace t = read_trace(dir);
  ModelSpec other;
  other.widths = {2, 2, 1};  // 0.weight is 2x2: index 4 is out of range
  try {
    gather_steps(t, *t.run("reference"), layout_of(other));
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "index");
    EXPECT_EQ(e.line(), 6) << e.what();
  }
  ModelSpec linear;
  linear.widths = {2, 1};
  try {
    gather_steps(t, *t.run("reference"), layout_of(linear));
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "index");
  }
}

// A mapped file (values.bin) cut short under its reader: the SIGBUS is
// the input error's message and exit code 2, naming the file; a SIGBUS
// that is not a fault in a mapped file is left to the previous handler or
// the default (not exit 2).
std::string mapped_file(const std::string& name) {
  const std::string dir = temp_dir(name);
  fs::create_directories(dir);
  const std::string path = dir + "/values.bin";
  write_file_atomically(path, std::string(size_t{1} << 16, 'x'));
  return path;
}

TEST(FileBytesMapped, CutShortWhileHeldIsAnInputErrorNotACrash) {
  const std::string path = mapped_file("cut-short");
  EXPECT_EXIT(
      {
        const FileBytes bytes(path, "trace_bin_bytes");
        std::filesystem::resize_file(path, 0);
        volatile char last = bytes.data()[bytes.size() - 1];
        (void)last;
        std::_Exit(0);  // not reached where the file was mapped
      },
      ::testing::ExitedWithCode(2),
      "values.bin: the file was cut short while accumcheck was reading it");
  // Replaced as the recorder writes (a new file renamed over it): the
  // bytes held stay.
  const std::string replaced = mapped_file("replaced");
  const FileBytes held(replaced, "trace_bin_bytes");
  write_file_atomically(replaced, "y");
  EXPECT_EQ(held.size(), size_t{1} << 16);
  EXPECT_EQ(held.data()[held.size() - 1], 'x');
}

TEST(FileBytesMapped, OtherSigbusIsNotAnInputError) {
  const std::string path = mapped_file("other-sigbus");
  EXPECT_EXIT(
      {
        const FileBytes bytes(path, "trace_bin_bytes");
        std::raise(SIGBUS);
        std::_Exit(0);
      },
      // Killed by it (or, under AddressSanitizer, its report's exit 1).
      [](int status) {
        return WIFSIGNALED(status) ||
               (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                WEXITSTATUS(status) != 2);
      },
      "");
}

}  // namespace
}  // namespace accumcheck
