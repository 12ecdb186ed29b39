// values.bin: the binary values file of a trace (format in
// verify/trace/trace.hpp; the one Python writer is
// python/accumcheck_trace/trace.py).  Every malformed input is an InputError naming the file and
// the byte offset where the problem starts.
#include "verify/trace/values_bin.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "sim/atomic_file.hpp"
#include "sim/errors.hpp"

namespace accumcheck {

namespace trace_detail {

std::string byte_at(const std::string& path, int64_t offset) {
  return fmt::format("{}:byte {}", path, offset);
}

namespace {

static_assert(std::numeric_limits<float>::is_iec559 &&
                  std::numeric_limits<double>::is_iec559,
              "values.bin holds IEEE 754 numbers");

// Little-endian fields read at a cursor, with the file's bounds checked.
class Cursor {
 public:
  Cursor(const std::string& path, std::string_view b) : path_(path), b_(b) {}
  int64_t at() const { return at_; }
  bool done() const { return at_ == int64_t(b_.size()); }
  int64_t left() const { return int64_t(b_.size()) - at_; }

  [[noreturn]] void fail(int64_t offset, const std::string& key,
                         const std::string& msg) const {
    throw InputError(byte_at(path_, offset), 0, 0, key, msg);
  }
  void need(int64_t n, std::string_view what) const {
    if (n > left())
      fail(at_, "",
           fmt::format("truncated file: {} needs {} bytes, {} left", what, n,
                       left()));
  }
  uint64_t uint(int bytes, std::string_view what) {
    need(bytes, what);
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i)
      v = (v << 8) | uint64_t(static_cast<unsigned char>(b_[size_t(at_ + i)]));
    at_ += bytes;
    return v;
  }
  uint32_t u32(std::string_view what) { return uint32_t(uint(4, what)); }
  uint64_t u64(std::string_view what) { return uint(8, what); }
  int64_t i64(std::string_view what) { return int64_t(uint(8, what)); }
  std::string text(uint32_t n, std::string_view what) {
    need(n, what);
    std::string s(b_.substr(size_t(at_), n));
    at_ += n;
    return s;
  }
  void skip(int64_t n, std::string_view what) {
    need(n, what);
    at_ += n;
  }

 private:
  const std::string& path_;
  std::string_view b_;
  int64_t at_ = 0;
};

}  // namespace

void read_values_bin(Trace& t, const std::string& path) {
  auto bin = std::make_shared<TraceBinary>();
  bin->path = path;
  bin->bytes = FileBytes(path, "trace_bin_bytes");
  Cursor c(path, bin->bytes.view());
  const std::string magic = c.text(8, "the magic");
  if (magic != kValuesMagic)
    c.fail(0, "magic",
           fmt::format("not an accumcheck values file: expected the magic "
                       "'{}'",
                       kValuesMagic));
  const uint32_t version = c.u32("the version");
  if (version != kValuesVersion && version != 1)
    c.fail(8, "version",
           fmt::format("values file version {}; this build reads versions 1 "
                       "and {}",
                       version, kValuesVersion));
  bin->width = c.u32("the value width");
  if (bin->width != 4 && bin->width != 8)
    c.fail(12, "width",
           fmt::format("{} bytes per value; expected 4 (float32) or 8 "
                       "(float64)",
                       bin->width));
  const uint32_t n_tensors = c.u32("the tensor count");
  if (n_tensors == 0) c.fail(16, "tensors", "no tensors in the header");
  std::set<std::string> names;
  for (uint32_t k = 0; k < n_tensors; ++k) {
    TraceBinary::Tensor tn;
    tn.at = c.at();
    const uint32_t len = c.u32("a tensor name's length");
    tn.name = c.text(len, "a tensor name");
    if (tn.name.empty()) c.fail(tn.at, "tensor", "an empty tensor name");
    if (!names.insert(tn.name).second)
      c.fail(tn.at, "tensor",
             fmt::format("tensor '{}' appears twice in the header", tn.name));
    const uint64_t elements = c.u64("a tensor's element count");
    // Each element needs `width` bytes of every block: a count beyond the
    // file cannot be right (and this keeps the sums below from overflowing).
    if (elements == 0 || elements > uint64_t(bin->bytes.size()))
      c.fail(tn.at + 4 + len, "elements",
             fmt::format("tensor '{}' has {} elements; expected 1 to the "
                         "file's size",
                         tn.name, elements));
    tn.elements = int64_t(elements);
    bin->per_block += tn.elements;
    if (bin->per_block > int64_t(bin->bytes.size()))
      c.fail(tn.at, "elements",
             fmt::format("{} values per block cannot fit in a file of {} "
                         "bytes",
                         bin->per_block, bin->bytes.size()));
    bin->tensors.push_back(std::move(tn));
  }

  // Blocks: per run contiguous, grad and param steps not decreasing, no
  // (step, kind, rank) twice.
  std::map<std::string, size_t, std::less<>> index;
  for (size_t i = 0; i < t.runs.size(); ++i) index[t.runs[i].name] = i;
  std::set<std::string, std::less<>> closed;
  std::string current;
  std::map<std::tuple<int64_t, int, int64_t>, int64_t> seen;  // this step
  // State blocks of the current run: (kind, step, rank) -> byte.
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> seen_state;
  const uint32_t max_kind = version == 1 ? 1 : uint32_t(kStateBlockKinds) + 1;
  while (!c.done()) {
    TraceBlock b;
    b.at = c.at();
    const uint32_t len = c.u32("a block's run name length");
    const std::string run = c.text(len, "a block's run name");
    if (run.empty()) c.fail(b.at, "run", "expected a run name, got ''");
    const int64_t step_at = c.at();
    b.step = c.i64("a block's step");
    b.rank = c.i64("a block's rank");
    const int64_t kind_at = c.at();
    const uint32_t kind = c.u32("a block's kind");
    if (b.step < 0)
      c.fail(step_at, "step",
             fmt::format("expected a step >= 0, got {}", b.step));
    if (b.rank < 0)
      c.fail(step_at + 8, "rank",
             fmt::format("expected a rank >= 0, got {}", b.rank));
    if (kind > max_kind)
      c.fail(kind_at, "kind",
             version == 1
                 ? fmt::format("unknown kind {}; expected 0 (grad) or 1 "
                               "(param) in a version 1 file",
                               kind)
                 : fmt::format("unknown kind {}; expected 0 (grad), 1 "
                               "(param), 2 (exp_avg), 3 (exp_avg_sq) or 4 "
                               "(ema)",
                               kind));
    b.kind = kind == 0 ? ValueKind::grad : ValueKind::param;
    const std::string_view kind_name =
        kind <= 1 ? value_kind_name(b.kind) : state_block_kind(kind);
    b.values = c.at();
    c.skip(bin->per_block * int64_t(bin->width),
           fmt::format("run '{}' step {} {}'s {} values", run, b.step,
                       kind_name, bin->per_block));
    if (run != current) {
      if (closed.count(run))
        c.fail(b.at, "run",
               fmt::format("blocks of run '{}' are split by another run's; "
                           "each run's blocks must be contiguous",
                           run));
      if (!current.empty()) closed.insert(current);
      current = run;
      seen.clear();
      seen_state.clear();
    }
    auto it = index.find(run);
    if (it == index.end()) {
      it = index.emplace(run, t.runs.size()).first;
      t.runs.push_back(TraceRun{run, {}, {}, {}, {}});
    }
    TraceRun& tr = t.runs[it->second];
    if (kind > 1) {
      const auto [dup, fresh] =
          seen_state.emplace(std::make_tuple(int(kind), b.step, b.rank), b.at);
      if (!fresh)
        c.fail(b.at, "",
               fmt::format("duplicated block: run '{}' step {} {} rank {} "
                           "was given at byte {}",
                           run, b.step, kind_name, b.rank, dup->second));
      tr.state_blocks.push_back({kind_name, b.step, b.rank, b.at, b.values});
      continue;
    }
    if (!tr.blocks.empty()) {
      const TraceBlock& prev = tr.blocks.back();
      if (b.step < prev.step)
        c.fail(step_at, "step",
               fmt::format("steps out of order in run '{}': {} after {} "
                           "(byte {})",
                           run, b.step, prev.step, prev.at));
      if (b.step != prev.step) seen.clear();
    }
    const auto [dup, fresh] =
        seen.emplace(std::make_tuple(b.step, int(kind), b.rank), b.at);
    if (!fresh)
      c.fail(b.at, "",
             fmt::format("duplicated block: run '{}' step {} {} rank {} was "
                         "given at byte {}",
                         run, b.step, value_kind_name(b.kind), b.rank,
                         dup->second));
    tr.blocks.push_back(b);
  }
  t.binary = std::move(bin);
}

namespace {

// The header's tensors must be the scenario's, in layout order.
void check_header(const TraceBinary& bin, const ParamLayout& layout) {
  auto expected = [&] {
    std::string s;
    for (const TensorView& tv : layout.tensors)
      s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", tv.name, tv.size());
    return s;
  };
  for (size_t k = 0; k < bin.tensors.size(); ++k) {
    const TraceBinary::Tensor& tn = bin.tensors[k];
    if (k >= layout.tensors.size() || tn.name != layout.tensors[k].name ||
        tn.elements != layout.tensors[k].size())
      throw InputError(
          byte_at(bin.path, tn.at), 0, 0, "tensor",
          fmt::format("tensor {} is '{}' ({} elements); this scenario's model "
                      "has, in order: {}",
                      k, tn.name, tn.elements, expected()));
  }
  if (bin.tensors.size() != layout.tensors.size())
    throw InputError(
        byte_at(bin.path, 16), 0, 0, "tensors",
        fmt::format("{} tensors in the header; this scenario's "
                    "model has {}: {}",
                    bin.tensors.size(), layout.tensors.size(), expected()));
}

// The values of the block whose values start at byte `values`.
TraceValues block_values(const TraceBinary& bin, int64_t values) {
  return TraceValues::in_file(bin.bytes.data() + values, bin.width,
                              size_t(bin.per_block));
}

}  // namespace

std::string_view state_block_kind(uint32_t kind) {
  static constexpr std::string_view names[] = {"exp_avg", "exp_avg_sq", "ema"};
  return kind >= 2 && kind - 2 < std::size(names) ? names[kind - 2] : "";
}

std::vector<TraceStep> gather_blocks(const Trace& t, const TraceRun& run,
                                     const ParamLayout& layout, int64_t rank) {
  const TraceBinary& bin = *t.binary;
  check_header(bin, layout);
  std::vector<TraceStep> steps;
  for (const TraceBlock& b : run.blocks) {
    if (b.rank != rank) continue;
    if (steps.empty() || steps.back().step != b.step)
      steps.push_back(TraceStep{b.step, {}, {}});
    (b.kind == ValueKind::grad ? steps.back().grad : steps.back().param) =
        block_values(bin, b.values);
  }
  return steps;
}

void gather_state_blocks(const Trace& t, const TraceRun& run,
                         const ParamLayout& layout, StateSection& st) {
  if (!t.binary || run.state_blocks.empty()) return;
  check_header(*t.binary, layout);
  for (const TraceStateBlock& b : run.state_blocks) {
    if (b.rank != 0) continue;
    st.blocks[std::string(b.kind)][b.step] = block_values(*t.binary, b.values);
  }
  st.present = true;
}

}  // namespace trace_detail

double TraceBinary::value(int64_t values, int64_t i) const {
  return trace_detail::block_values(*this, values)[size_t(i)];
}

}  // namespace accumcheck
