// Traces: the one versioned trace schema (DESIGN.md section 7).
//
// A trace is a folder of three or four tidy CSV files (steps counted from
// 0):
//   meta.csv    key,value          schema, scenario, scenario_digest,
//                                  engine, precision, tool_version, extras
//   events.csv  run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm,
//               sample_ids,rank
//                 micro: the micro-batch's index within its window for
//                 forward_backward, -1 for window-level events
//                 sample_ids: forward_backward: the micro-batch's sample
//                 ids, space-separated, in the order drawn ("" unknown)
//   values.csv  run,step,kind,tensor,index,value,rank
//                 kind grad: the gradient handed to optimizer step `step`
//                 kind param: the parameters just after it
//               rank: the data-parallel rank that made the call or holds
//               the value (-1 for a collective event, all_reduce).  Written
//               only for a multi-rank scenario (TraceWriter::with_ranks),
//               so one-rank traces keep their bytes; absent, every row is
//               rank 0 (one-rank recorders need not write it).
//   state.csv   run,kind,step,tensor,index,value (when a run keeps state
//               beyond gradients: loss scale, EMA, optimizer state...;
//               see StateValue below)
// Several runs ("reference", "correct", a pitfall id...) share the files,
// told apart by `run`; each run's rows are contiguous.  Floats are written
// with 17 significant digits (%.17g) so they read back exactly; NaN is an
// empty field.  Fields holding ',' or '"' are double-quoted.  Files are
// written atomically and their bytes depend only on the content.
//
// values.bin, the binary alternative to values.csv (a trace holds one or
// the other; written by python/accumcheck_trace/trace.py, read
// here).  All numbers little-endian:
//   offset 0   8 bytes  magic "ACVALUES"
//          8   u32      version (kValuesVersion)
//          12  u32      bytes per value: 4 (float32) or 8 (float64), IEEE
//          16  u32      T, the number of tensors
//          20  T x { u32 name length L, L bytes of name, u64 elements }
//                       (the scenario's tensors, layout order)
//   then blocks to the end of the file, each
//       u32 run name length L, L bytes of run name,
//       i64 step, i64 rank, u32 kind (0 grad, 1 param; version 2 also
//       2 exp_avg, 3 exp_avg_sq, 4 ema: per-element training state in
//       the parameters' layout, see state.csv below),
//       sum(elements) values: every tensor in header order, flat.
// A block is one (run, step, kind, rank): the rows values.csv (or, for
// kinds 2-4, state.csv) would hold.  grad and param blocks come in
// non-decreasing step order within a run; state blocks may come anywhere
// in their run's part (an EMA update's number is not an optimizer step).
// Errors name the file and the byte offset: `values.bin:byte 20: ...`.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sim/atomic_file.hpp"
#include "sim/layout.hpp"
#include "sim/run.hpp"

namespace accumcheck {

// Written: version 2 (events carry sample_ids).  Read: versions 2 and 1
// (version 1 has no sample_ids column; its events have none).
inline constexpr std::string_view kTraceSchema = "accumcheck-trace/2";
inline constexpr std::string_view kTraceSchemaV1 = "accumcheck-trace/1";

enum class ValueKind { param, grad };
std::string_view value_kind_name(ValueKind k);

// Accumulates the rows of one trace, run after run.
class TraceWriter {
 public:
  // The required meta rows.  tool_version defaults to this build's.
  TraceWriter(std::string scenario_name, std::string scenario_digest,
              std::string engine, std::string precision,
              std::string tool_version = "");

  // Adds the rank column to events.csv and values.csv (R > 1); before
  // any row.
  void with_ranks();

  // Extra meta rows (BLAS, device, ...), written after the required ones
  // in the order added.  A key may appear once.
  void add_meta(std::string key, std::string value);

  // Starts a run; its name must be new.  Rows added until the next
  // begin_run belong to it.
  void begin_run(std::string_view name);
  void add_event(const Event& e);
  void add_value(int64_t step, ValueKind kind, std::string_view tensor,
                 int64_t index, double value, int64_t rank = 0);
  // A state.csv row of the current run (kinds: see StateValue below).
  void add_state(std::string_view kind, int64_t step, std::string_view tensor,
                 int64_t index, double value);

  std::string meta_csv() const;
  const std::string& events_csv() const { return events_; }
  const std::string& values_csv() const { return values_; }
  // state.csv, or "" when no run added a state row.
  std::string state_csv() const;

 private:
  std::vector<std::pair<std::string, std::string>> meta_;
  std::vector<std::string> runs_;
  std::string events_, values_, state_;
  bool ranks_ = false;
};

// The run's training state beyond gradients as state.csv rows: the loss
// scale of rank 0's backward passes (Event::loss_scale), the windows
// skipped for overflow, each EMA update and the EMA after it.
template <class Real>
void add_run_state(TraceWriter& w, const Run<Real>& run,
                   const ParamLayout& layout) {
  int64_t backward = 0;
  for (const Event& e : run.events)
    if (e.kind == EventKind::forward_backward && e.rank == 0) {
      if (!std::isnan(e.loss_scale))
        w.add_state("loss_scale", e.step, "", backward, e.loss_scale);
      ++backward;
    }
  for (const SkippedWindow& s : run.skipped)
    w.add_state("skipped", s.step, "", s.backward, s.loss_scale);
  for (size_t c = 0; c < run.ema.size(); ++c) {
    const EmaRecord<Real>& u = run.ema[c];
    w.add_state("ema_update", int64_t(c), "", u.steps, double(u.since));
    if (u.ema.empty()) continue;
    for (const TensorView& t : layout.tensors)
      for (int64_t i = 0; i < t.size(); ++i)
        w.add_state("ema", int64_t(c), t.name, i,
                    static_cast<double>(u.ema[size_t(t.offset + i)]));
  }
}

// A run's events, then per optimizer step its gradient and parameters
// (layout order, flat index within each tensor), Real -> double, then its
// state rows (add_run_state).
template <class Real>
void add_run(TraceWriter& w, const Run<Real>& run, const ParamLayout& layout) {
  w.begin_run(run.name);
  for (const Event& e : run.events) w.add_event(e);
  for (const StepRecord<Real>& s : run.steps) {
    const std::pair<ValueKind, const std::vector<Real>*> kinds[] = {
        {ValueKind::grad, &s.grad}, {ValueKind::param, &s.param}};
    auto add = [&](ValueKind kind, const std::vector<Real>& vals,
                   int64_t rank) {
      for (const TensorView& t : layout.tensors)
        for (int64_t i = 0; i < t.size(); ++i)
          w.add_value(s.step, kind, t.name, i,
                      static_cast<double>(vals[size_t(t.offset + i)]), rank);
    };
    for (const auto& [kind, vals] : kinds)
      if (!vals->empty()) add(kind, *vals, 0);
    for (size_t r = 0; r < s.rank_param.size(); ++r)
      add(ValueKind::param, s.rank_param[r], int64_t(r) + 1);
  }
  add_run_state(w, run, layout);
}

// Writes meta.csv, events.csv, values.csv and state.csv (when a run has
// state rows; an earlier trace's state.csv is removed otherwise) into
// `dir` (created when missing), each atomically, then the completion
// record complete.csv last (an earlier trace's removed first).
void write_trace(const std::string& dir, const TraceWriter& w);

// ---- the completion record: complete.csv, the file every writer writes
// LAST, once the run has finished and every other file of the trace is
// written (TraceWriter's write_trace; python/accumcheck_trace/trace.py
// write_trace for the recorders):
//   file,rows,bytes,sha256
//   meta.csv,9,412,<64 hex digits>      one row per file the writer wrote:
//   events.csv,412,20345,<...>          rows = its lines after the header
//   values.bin,,1638400,<...>           (empty for values.bin), its size
//   ...                                 and its SHA-256
//   complete.csv,3,,                    last: the number of rows above
// read_trace checks it first (check_complete): a missing record (the run
// never reached close(), or a writer that predates it), a record cut (its
// last row missing), a listed file missing, emptied, cut (fewer rows or
// bytes), grown or changed (another SHA-256: replaced by another run's),
// or a trace file the record does not list, is an InputError naming the
// file and what happened.  The run that did not finish at all leaves a
// marker instead (refuse_incomplete_ranks, read_csv.hpp).
inline constexpr std::string_view kCompleteFile = "complete.csv";
inline constexpr std::string_view kCompleteHeader = "file,rows,bytes,sha256";
// The files of a trace (any other file in the folder is not the trace's).
inline constexpr std::string_view kTraceFiles[] = {
    "meta.csv",  "events.csv",   "values.csv",  "values.bin",
    "state.csv", "contract.csv", "schedule.csv"};
// complete.csv's text for the files written, (name, bytes) in the order
// written.
std::string complete_csv(
    const std::vector<std::pair<std::string, std::string_view>>& files);
// Writes `dir`/complete.csv for the trace files the folder holds now: for
// a writer that writes the files itself (and the tests that edit a trace
// to reach the reader's later checks).
void seal_trace(const std::string& dir);
// The completion check (above); nothing when the folder holds neither
// complete.csv nor meta.csv (no trace: the reader of meta.csv says so).
void check_complete(const std::string& dir);

struct TraceEvent {
  Event event;
  int64_t line = 0;  // in events.csv
};

struct TraceValue {
  int64_t step = 0;
  ValueKind kind = ValueKind::param;
  std::string tensor;
  int64_t index = 0;
  double value = 0;
  int64_t rank = 0;
  int64_t line = 0;  // in values.csv
};

inline constexpr std::string_view kValuesMagic = "ACVALUES";
// Written: version 2 (state blocks allowed).  Read: versions 2 and 1.
inline constexpr uint32_t kValuesVersion = 2;

// One block of values.bin.
struct TraceBlock {
  int64_t step = 0;
  ValueKind kind = ValueKind::param;
  int64_t rank = 0;
  int64_t at = 0;      // byte offset of the block
  int64_t values = 0;  // byte offset of its first value
};

// One state block of values.bin (kinds 2-4).
struct TraceStateBlock {
  std::string_view kind;  // "exp_avg", "exp_avg_sq" or "ema" (static)
  int64_t step = 0;       // as state.csv's step column
  int64_t rank = 0;
  int64_t at = 0;      // byte offset of the block
  int64_t values = 0;  // byte offset of its first value
};

// values.bin held in memory, its header read.
struct TraceBinary {
  std::string path;
  FileBytes bytes;     // mapped (sim/atomic_file.hpp)
  uint32_t width = 4;  // bytes per value
  struct Tensor {
    std::string name;
    int64_t elements = 0;
    int64_t at = 0;  // byte offset of its header entry
  };
  std::vector<Tensor> tensors;
  int64_t per_block = 0;  // values per block
  // Value i of the block starting its values at byte `values`.
  double value(int64_t values, int64_t i) const;
  // The byte offset of value i of block b.
  int64_t offset(const TraceBlock& b, int64_t i) const {
    return b.values + i * int64_t(width);
  }
};

struct TraceRun {
  std::string name;
  std::vector<TraceEvent> events;             // file order
  std::vector<TraceValue> values;             // file order (values.csv)
  std::vector<TraceBlock> blocks;             // file order (values.bin)
  std::vector<TraceStateBlock> state_blocks;  // file order (values.bin)
};

struct Trace {
  std::string dir;
  std::vector<std::pair<std::string, std::string>> meta;  // file order
  std::vector<TraceRun> runs;  // in order of first appearance
  // values.bin when the trace has one (then values.csv is absent).
  std::shared_ptr<const TraceBinary> binary;

  // The meta value for `key`, or "" when absent.
  std::string meta_value(std::string_view key) const;
  // The run called `name`, or nullptr.
  const TraceRun* run(std::string_view name) const;
  std::string events_path() const;
  // values.csv, or values.bin when the trace has that.
  std::string values_path() const;
  std::string meta_path() const;
};

// Where a value of a run sits, for messages: "values.csv" and its line,
// or "values.bin:byte N" and line 0 (0 / the file alone when not found).
struct ValueWhere {
  std::string file;
  int64_t line = 0;
};
ValueWhere locate_value(const Trace& t, const TraceRun& run, int64_t step,
                        ValueKind kind, int64_t flat, const ParamLayout& layout,
                        int64_t rank = 0);

// Reads a trace folder.  Every malformed input is an InputError naming the
// file and line (values.bin: the byte offset; a truncated file, a bad
// magic, version or width, a name or block running past the end, a kind
// other than 0 or 1, a negative step or rank, both values.csv and
// values.bin present, and the CSV rules below): a missing or unknown column, a
// schema version other than kTraceSchema or kTraceSchemaV1, a missing required
// meta key, an unknown event or kind, a non-number where a number belongs (NaN
// is only ever an empty field), a file whose last line has no line end
// (truncated), steps going backwards within a run, a run's rows split by
// another run's, a duplicated meta key or values row (per rank).  (Identical
// events rows are legitimate with R > 1 and are not rejected.)  Digests and
// tensor shapes against a scenario are the caller's (see check_values).
Trace read_trace(const std::string& dir);

// One block of a trace's values in the layout's flat order (a step's
// gradient or parameters, a state tensor's): the doubles of values.csv,
// or a view of values.bin's float32 or float64 values, decoded where they
// are read.  values.bin is mapped, not read: its values are never copied
// or decoded whole (at 1M parameters x 100 steps that was 3.2 GB of
// doubles, and at 1k most of certify's reading: fresh memory costs about
// 1 ms per MB on this VM).  A view lives as long as the Trace (its
// `binary`) it points into.
class TraceValues {
 public:
  TraceValues() = default;
  TraceValues(std::vector<double> v) : own_(std::move(v)), n_(own_.size()) {}
  // `n` values of `width` bytes (4 or 8, little-endian) at `at`.
  static TraceValues in_file(const char* at, uint32_t width, size_t n) {
    TraceValues t;
    t.at_ = at;
    t.width_ = width;
    t.n_ = n;
    return t;
  }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  double operator[](size_t i) const {
    if (!at_) return own_[i];
    return width_ == 4 ? load<float>(at_ + 4 * i) : load<double>(at_ + 8 * i);
  }
  // Every value as a double: the held ones, or decoded into `scratch`
  // (a caller's buffer, reused from step to step).
  const std::vector<double>& doubles(std::vector<double>& scratch) const {
    if (!at_) return own_;
    scratch.resize(n_);
    if (width_ == 4)
      for (size_t i = 0; i < n_; ++i) scratch[i] = load<float>(at_ + 4 * i);
    else
      for (size_t i = 0; i < n_; ++i) scratch[i] = load<double>(at_ + 8 * i);
    return scratch;
  }
  // A copy as doubles.
  std::vector<double> vector() const {
    if (!at_) return own_;
    std::vector<double> v;
    doubles(v);
    return v;
  }

 private:
  // A little-endian IEEE 754 value at `p` (any alignment).
  template <class F>
  static double load(const char* p) {
    using U = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
    U u;
    std::memcpy(&u, p, sizeof u);
    if constexpr (std::endian::native == std::endian::big) {
      U r = 0;
      for (size_t k = 0; k < sizeof u; ++k, u >>= 8) r = (r << 8) | (u & 0xff);
      u = r;
    }
    F f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  std::vector<double> own_;
  const char* at_ = nullptr;  // the view, or nullptr (own_)
  uint32_t width_ = 0;
  size_t n_ = 0;
};

// Per optimizer step of a run, the flat gradient and parameters in
// `layout`'s order (empty when the run wrote none of that kind).
struct TraceStep {
  int64_t step = 0;
  TraceValues grad, param;
};

// Checks a run's values against `layout` (every tensor name known, every
// index in range, each step's grad or param complete) and gathers them by
// step.  Throws InputError naming values.csv and the offending line.
// Only the rows of `rank` (rank 0: what one process holds; its gradient is
// the all-reduced one).
std::vector<TraceStep> gather_steps(const Trace& t, const TraceRun& run,
                                    const ParamLayout& layout,
                                    int64_t rank = 0);

// The ranks a run's values name (sorted; {0} for a one-rank trace).
std::vector<int64_t> value_ranks(const TraceRun& run);

// ---- the contract tier's section (contract.csv, written by
// adapters/pytorch/accumcheck_torch/contract.py beside meta/events/values;
// meta.csv says tier = contract).  One row per record:
//   kind,index,ref,epoch,version,items,samples,value,residual,scale
//   micro    index j (drawn order), epoch, version (optimizer steps before
//            its forward), items (loss-bearing), samples (rows),
//            scale = calibration |g32 - g64| / |g64| ("" not calibrated)
//   backward index b, ref = its micro-batch j, version, value = fitted
//            weight w_b, residual = |c_b - w_b g_j| / |w_b g_j|
//   epoch    index e, items = the loader's dataset size (-1 unknown),
//            samples = its batch size
//   step     index t, ref = number of fitted terms, value = lr,
//            residual = |G_t - fit| (absolute), scale = sum |a| |term|,
//            items = elements of G_t bfloat16 cannot hold ("" unknown)
//   coef     index t, ref = backward b (-1: the previous step's gradient),
//            value = its fitted coefficient a, scale = |term vector|
//   replay   index t, value = 16 * max_i |p_i - r_i| / (16 u32 (|r_i| +
//            |update_i|)): r the step replayed by PyTorch's optimizer class
//            from the recorded state (certify divides by contract_replay_ulps)
//   clip     index m (call order), ref = version (optimizer steps before
//            it), value = the factor clip_grad_norm_ applied, residual = the
//            float64 norm of the gradient it saw (whole: a sharded
//            recorder's from its ranks' shard norms), scale = its max_norm
//            ("": a scaling of .grad seen by a sharded recorder, no clip
//            function called: the declared clip's), items = the float64
//            norm of this rank's shard of it ("": not sharded)
//   overflow index t in place of step t's step row: a window whose gradient
//            held inf or NaN (ContractStep::Overflow): ref = its backward
//            passes, version = 1 when the optimizer updated nothing (the
//            loss scaler skipped it), 0 when it stepped anyway, items = its
//            backward passes holding inf or NaN, samples = the sampled
//            parameter and optimizer-state coordinates the skipped step
//            changed (-1: not measured), value / residual = the loss scale
//            before the step / after scaler.update() ("": none seen),
//            scale = the scaler's backoff factor
//   ema      index i (update order), ref = backward passes since the last
//            step, version = optimizer steps before it, items = 1 when seen
//            at optimizer.step()'s pre-hook, value / residual = its error
//            in u32 against the decay update / a copy (ContractEma), scale
//            = the decay it moved by (meta.csv: ema, ema_decay)
//   idle     index i (call order), ref = the micro-batch j whose call it
//            was: an optimizer call that applied no update (a micro-step
//            that accumulated only; ContractIdle), version = optimizer
//            steps before it, items = the recorder's sampled parameter
//            coordinates that changed across it, samples = the sampled
//            optimizer-state values that changed ("": not measured), value
//            = the largest |change| / |p| among them, residual = lambda
//            of the change fitted as -lambda * p ("": none), scale = that
//            fit's relative residual
// A DDP trace (accumcheck_torch.ContractDistributedRecorder, its ranks'
// parts merged) has an 11th column, rank: the rank that drew a micro-batch,
// whose loader an epoch row describes, that called clip_grad_norm_, whose
// optimizer step a step/coef/replay row is (step and epoch indices count
// per rank; micro, backward and clip indices over the whole trace, so a
// coef row's backward may be another rank's: DDP's all-reduce brings it).
struct ContractMicro {
  int64_t rank = 0;
  int64_t epoch = 0, version = 0, items = 0, samples = 0;
  double calibration = kNaN;
  // Its items over the unshifted labels (the `ref` field: the recorder's
  // unshifted_count_fn, a causal-LM head's labels != -100 position 0
  // included); -1: not recorded (each sequence's position 0 is taken as
  // counted).
  int64_t unshifted = -1;
};
struct ContractBackward {
  int64_t micro = 0, version = 0;
  double weight = kNaN, residual = kNaN;
};
struct ContractStep {
  int64_t terms = 0;
  // Elements of the consumed gradient bfloat16 cannot hold (0: a bf16
  // gradient buffer; -1: not recorded).
  int64_t off_bf16 = -1;
  double lr = kNaN, residual = kNaN, scale = kNaN, replay = kNaN;
  struct Coef {
    int64_t backward = -1;  // -1: the previous step's gradient
    double a = kNaN;        // fitted coefficient
    double norm = kNaN;     // |term vector|
  };
  std::vector<Coef> coefs;
  // An overflow row's (a window whose gradient held inf or NaN: no fit, no
  // replay; its backward passes in no step).
  struct Overflow {
    bool skipped = false;  // the optimizer updated nothing
    int64_t passes = 0;    // the window's backward passes
    int64_t own = 0;       // of them, holding inf or NaN
    int64_t changed = -1;  // sampled coordinates the skip changed
    double scale_before = kNaN, scale_after = kNaN, backoff = kNaN;
  };
  std::optional<Overflow> overflow;
};
struct ContractClip {
  int64_t rank = 0;
  int64_t version = 0;
  double factor = kNaN, norm = kNaN, max_norm = kNaN;
  double shard_norm = kNaN;  // this rank's shard's (a sharded recorder's)
  // Elements of the gradient it saw bfloat16 cannot hold (the `samples`
  // field; 0: a bf16 gradient buffer before the clip); -1: not recorded.
  int64_t off_bf16 = -1;
};
// One EMA update the recorder saw (ContractRecorder.ema), in order: the
// optimizer steps done before it (version), the backward passes since the
// last one (since), whether it came between a window's backward passes
// and optimizer.step() (at_step); its error against d*prev + (1-d)*p with
// the parameters then (decay_u) and against a copy of them (copy_u), in
// u32 of d|prev| + (1-d)|p| (of |p| for the copy); the decay it moved by
// (fitted).
struct ContractEma {
  int64_t rank = 0;
  int64_t version = 0, since = 0;
  bool at_step = false;
  double decay_u = kNaN, copy_u = kNaN, fitted = kNaN;
};
// One optimizer call that applied no update (an idle row): a call
// accumulation makes on a micro-step that does not end its window.  It
// must move nothing: the sampled parameters (changed) and optimizer state
// (state_changed, -1: not measured) it changed, the largest relative
// change, and the change fitted as a decay -lambda * p (lambda; its
// relative residual fit_residual).
struct ContractIdle {
  int64_t rank = 0;
  int64_t micro = 0, version = 0;
  int64_t changed = 0, state_changed = -1;
  double worst = 0, lambda = kNaN, fit_residual = kNaN;
};
struct ContractEpoch {
  int64_t dataset = -1, batch_size = -1;
};
struct ContractSection {
  std::vector<ContractMicro> micro;
  std::vector<ContractBackward> backward;
  // [rank][t]: each rank's optimizer steps, and its loader's epochs.
  std::vector<std::vector<ContractStep>> steps{{}};
  std::vector<std::vector<ContractEpoch>> epochs{{}};
  std::vector<ContractClip> clips;
  std::vector<ContractEma> ema;
  std::vector<ContractIdle> idle;
  int64_t ranks() const { return int64_t(steps.size()); }
};

// Reads `dir`/contract.csv (InputError naming the file and line on
// anything malformed: an unknown kind, indices out of order, a missing
// number, a reference to an unknown backward or micro-batch).
ContractSection read_contract(const std::string& dir);

// ---- a declared lr schedule's table (schedule.csv, written by
// accumcheck_torch.ContractRecorder(schedule=...) when the schedule is a
// scheduler, a factory or an lr_lambda: the recorder stepped its own copy
// and wrote the lr after each number of scheduler.step() calls):
//   calls,lr,lr_stretched
// calls 0, 1, 2, ... in order; lr the group-0 lr after `calls`
// scheduler.step() calls; lr_stretched the same of the schedule rebuilt
// with every length K times longer (schedule-horizon-in-micro-steps),
// empty on every row where the declaration could not rebuild it.
struct ScheduleTable {
  std::vector<double> lr, stretched;  // stretched: empty, or lr's size
};
// nullopt when `dir` has no schedule.csv; InputError naming the file and
// line on anything malformed, or past the schedule_rows limit.
std::optional<ScheduleTable> read_schedule_table(const std::string& dir);

// ---- the training state beyond gradients (state.csv, written by
// adapters/pytorch/accumcheck_torch/recorder.py and by TraceWriter
// (add_run_state) beside meta/events/values when the trainer keeps any;
// verify/certify/state_check.hpp judges it).  One row per value:
//   run,kind,step,tensor,index,value
// run: the run the row belongs to, as in events.csv and values.csv.
// Optional: a file without it (recorders before it was added) holds the
// rows of one run, whichever the trace is judged on.
//   loss_scale           step t (the window), index = backward pass
//                        (0-based over the run), value = the scale it used
//   skipped              step t: a window whose gradients overflowed
//                        (inf/NaN) and that was zeroed without an
//                        optimizer step; index = backward passes so far,
//                        value = the loss scale
//   opt_step             step t, tensor: Adam's state['step'] after
//                        optimizer step t (index 0)
//   exp_avg, exp_avg_sq  step t, tensor, index: Adam's moments after it
//   ema_update           step = the EMA update's number c, index =
//                        optimizer steps before it, value = backward
//                        passes since the last optimizer step
//   ema                  step = update c, tensor, index: the EMA's
//                        parameters after it
//   running_mean, running_var, num_batches_tracked
//                        step t, tensor (the scenario's buffer name,
//                        "1.running_mean"), index: BatchNorm's buffers
//                        when optimizer step t is taken
//   logged_loss          step t: the loss the trainer logged for window t
struct StateValue {
  std::string run, kind, tensor;
  int64_t step = 0, index = 0;
  double value = kNaN;
  int64_t line = 0;
};
struct StateSection {
  std::string path;
  std::vector<StateValue> rows;  // file order
  bool present = false;          // state.csv exists, or values.bin has state
  // Per-element state given as values.bin blocks (rank 0): kind ->
  // step -> the values in the parameters' layout order.
  std::map<std::string, std::map<int64_t, TraceValues>, std::less<>> blocks;
};

// Reads `dir`/state.csv when present (absent: present = false, no rows):
// the rows of run `run` (all of them when the file has no run column).
// InputError naming the file and line on an unknown kind, a missing or
// malformed number, an empty run name.
StateSection read_state(const std::string& dir, std::string_view run);
// The same, with the run's state blocks of values.bin (when the trace has
// one) in `blocks`: InputError naming values.bin and the byte when the
// header's tensors are not the scenario's (layout).
StateSection read_state(const Trace& t, const TraceRun& run,
                        const ParamLayout& layout);

}  // namespace accumcheck
