// Generated and CSV datasets, and initial parameters (sim/data.hpp).
#include "sim/data.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <system_error>

#include "sim/atomic_file.hpp"
#include "sim/csv_lines.hpp"
#include "sim/errors.hpp"
#include "sim/limits.hpp"
#include "sim/rng.hpp"

namespace accumcheck {

namespace {

// a x b elements, overflow-checked and within the data_values limit: the
// size of a buffer is never computed in arithmetic that can wrap.
size_t checked_size(const Scenario& s, int64_t a, int64_t b) {
  const std::optional<int64_t> n = checked_mul(a, b);
  require_within("data_values", n,
                 fmt::format("data.samples = {} x {} values per sample", a, b),
                 s.path, 0, 0, "data.samples");
  return size_t(*n);
}

Dataset generated_tokens(const Scenario& s) {
  Dataset d;
  d.n = s.data.samples;
  d.d_in = s.model.d_in();
  d.d_out = s.model.d_out();
  d.loss = s.model.loss;
  d.max_len = s.data.max_len;
  const uint64_t seed = s.data.seed;
  const uint64_t V = uint64_t(s.model.vocab);
  const size_t cells = checked_size(s, d.n, d.max_len);
  d.tokens.assign(cells, 0);
  d.token_targets.assign(cells, Dataset::kIgnoreIndex);
  d.length.resize(size_t(d.n));
  for (int64_t i = 0; i < d.n; ++i) {
    const int64_t src = s.data.replicate ? i % s.batching.micro_batch : i;
    const int64_t len = sequence_length(s.data, src);
    d.length[size_t(i)] = int32_t(len);
    for (int64_t t = 0; t < len; ++t) {
      const size_t at = size_t(i * d.max_len + t);
      d.tokens[at] = int32_t(uniform_index(
          random_bits(seed, Stream::input, uint64_t(src), uint64_t(t)), V));
      d.token_targets[at] = int32_t(uniform_index(
          random_bits(seed, Stream::target, uint64_t(src), uint64_t(t)), V));
    }
  }
  return d;
}

Dataset generated(const Scenario& s) {
  if (s.model.kind == ModelKind::token) return generated_tokens(s);
  Dataset d;
  d.n = s.data.samples;
  d.d_in = s.model.d_in();
  d.d_out = s.model.d_out();
  d.loss = s.model.loss;
  const uint64_t seed = s.data.seed;
  auto value = [&](Stream stream, int64_t i, int64_t j) {
    if (s.data.replicate) i %= s.batching.micro_batch;
    const uint64_t bits = random_bits(seed, stream, uint64_t(i), uint64_t(j));
    return s.data.dyadic ? dyadic_pm1(bits) : uniform_pm1(bits);
  };
  d.x.resize(checked_size(s, d.n, d.d_in));
  for (int64_t i = 0; i < d.n; ++i)
    for (int64_t j = 0; j < d.d_in; ++j)
      d.x[size_t(i * d.d_in + j)] = value(Stream::input, i, j);
  // Targets come from a fixed linear teacher, so there is something to
  // learn and the side-by-side losses fall (a pitfall shows as a slower or
  // wrong descent, not only as a distance): teacher(x)_j = sum_k A_jk x_k /
  // sqrt(d_in), A_jk uniform in [-1, 1) keyed by (seed, j, k), summed in
  // double in a fixed order.  mse: t = teacher(x) + 0.1 * noise_i,j,
  // rounded once to float32; cross-entropy: the label is the teacher's
  // argmax (the lowest j on a tie).  Dyadic data keeps dyadic targets
  // (n/8), for which every sum stays exact.
  std::vector<double> teacher(size_t(d.d_out * d.d_in));
  for (int64_t j = 0; j < d.d_out; ++j)
    for (int64_t k = 0; k < d.d_in; ++k)
      teacher[size_t(j * d.d_in + k)] = double(uniform_pm1(
          random_bits(seed, Stream::target, uint64_t(j), uint64_t(k), 1)));
  const double scale = 1.0 / std::sqrt(double(d.d_in));
  auto teach = [&](int64_t i, int64_t j) {
    double acc = 0;
    for (int64_t k = 0; k < d.d_in; ++k)
      acc +=
          teacher[size_t(j * d.d_in + k)] * double(d.x[size_t(i * d.d_in + k)]);
    return acc * scale;
  };
  if (d.loss == LossKind::mse) {
    d.y.resize(checked_size(s, d.n, d.d_out));
    for (int64_t i = 0; i < d.n; ++i)
      for (int64_t j = 0; j < d.d_out; ++j)
        d.y[size_t(i * d.d_out + j)] =
            s.data.dyadic ? value(Stream::target, i, j)
                          : float(teach(i, j) +
                                  0.1 * double(value(Stream::target, i, j)));
  } else {
    d.label.resize(size_t(d.n));
    for (int64_t i = 0; i < d.n; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < d.d_out; ++j)
        if (teach(i, j) > teach(i, best)) best = j;
      d.label[size_t(i)] = int32_t(best);
    }
  }
  return d;
}

// The CSV dialect: comma-separated, no quoting, spaces and tabs trimmed,
// no comment lines (every line is a row).
using Trim = io::trim_chars<' ', '\t'>;
using Quote = io::no_quote_escape<','>;

// Splits one line into its fields with the parser's own column chopper.
std::vector<char*> split(char* line) {
  std::vector<char*> cols;
  while (line) {
    char *begin, *end;
    io::detail::chop_next_column<Quote>(line, begin, end);
    Trim::trim(begin, end);
    Quote::unescape(begin, end);
    cols.push_back(begin);
  }
  return cols;
}

// A decimal number, correctly rounded to float32 once.  Sets `inexact`
// when the text is not exactly a float32 value (judged against its double
// rounding, so a value within 2^-53 relative of a float counts as exact).
std::optional<float> parse_float32(std::string_view t, bool& inexact) {
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  if (t.empty()) return std::nullopt;
  double d;
  const auto rd = std::from_chars(t.data(), t.data() + t.size(), d);
  if (rd.ec != std::errc() || rd.ptr != t.data() + t.size() ||
      !std::isfinite(d))
    return std::nullopt;
  float f;
  const auto rf = std::from_chars(t.data(), t.data() + t.size(), f);
  if (rf.ec == std::errc::result_out_of_range) {
    // Beyond float32's range, or below its smallest subnormal.
    if (std::fabs(d) > double(std::numeric_limits<float>::max()))
      return std::nullopt;
    f = float(d);
  } else if (rf.ec != std::errc()) {
    return std::nullopt;
  }
  inexact = double(f) != d;
  return f;
}

Dataset from_csv(const Scenario& s) {
  const std::string& file = s.data.csv_path;
  Dataset d;
  d.d_in = s.model.d_in();
  d.d_out = s.model.d_out();
  d.loss = s.model.loss;

  std::vector<std::string> expected;
  for (int64_t j = 0; j < d.d_in; ++j)
    expected.push_back(fmt::format("x{}", j));
  if (d.loss == LossKind::mse)
    for (int64_t j = 0; j < d.d_out; ++j)
      expected.push_back(fmt::format("y{}", j));
  else
    expected.push_back("label");
  const size_t ncols = expected.size();
  auto expected_text = [&] {
    std::string t;
    for (const std::string& e : expected) {
      if (!t.empty()) t += ',';
      t += e;
    }
    return t;
  };

  std::string bytes = read_file_bytes(file, "csv_bytes");
  int64_t line_no = 0;
  try {
    CsvLines in(bytes);  // split in place: no buffer of its own
    char* header = in.next();
    if (!header)
      throw InputError(file, 1, 0, "",
                       "empty file; expected the header " + expected_text());
    line_no = 1;
    const std::vector<char*> names = split(header);
    for (size_t c = 0; c < std::max(names.size(), ncols); ++c) {
      if (c < names.size() && c < ncols && expected[c] == names[c]) continue;
      const std::string what = fmt::format(
          "expected the header {} (model widths {}..{}, {})", expected_text(),
          d.d_in, d.d_out, d.loss == LossKind::mse ? "mse" : "cross-entropy");
      if (c >= names.size())
        throw InputError(
            file, 1, 0, expected[c],
            fmt::format("missing column '{}'; {}", expected[c], what));
      if (c >= ncols)
        throw InputError(file, 1, 0, names[c],
                         fmt::format("extra column '{}'; {}", names[c], what));
      throw InputError(file, 1, 0, names[c],
                       fmt::format("column {} is '{}', expected '{}'; {}",
                                   c + 1, names[c], expected[c], what));
    }

    std::vector<int> order(ncols);
    for (size_t c = 0; c < ncols; ++c) order[c] = int(c);
    std::vector<char*> row(ncols);
    int64_t rounded = 0, first_rounded_line = 0;
    while (char* line = in.next()) {
      line_no = in.line();
      try {
        io::detail::parse_line<Trim, Quote>(line, row.data(), order);
      } catch (const io::error::too_few_columns&) {
        throw InputError(file, line_no, 0, "",
                         fmt::format("too few columns; expected {} ({})", ncols,
                                     expected_text()));
      } catch (const io::error::too_many_columns&) {
        throw InputError(file, line_no, 0, "",
                         fmt::format("too many columns; expected {} ({})",
                                     ncols, expected_text()));
      }
      for (size_t c = 0; c < ncols; ++c) {
        const std::string_view text(row[c]);
        const bool is_label =
            d.loss == LossKind::cross_entropy && c + 1 == ncols;
        if (is_label) {
          int64_t v = -1;
          const auto r =
              std::from_chars(text.data(), text.data() + text.size(), v);
          if (r.ec != std::errc() || r.ptr != text.data() + text.size() ||
              v < 0 || v >= d.d_out)
            throw InputError(
                file, line_no, 0, expected[c],
                fmt::format("expected an integer class id in 0..{}, got '{}'",
                            d.d_out - 1, text));
          d.label.push_back(int32_t(v));
          continue;
        }
        bool inexact = false;
        const std::optional<float> v = parse_float32(text, inexact);
        if (!v)
          throw InputError(
              file, line_no, 0, expected[c],
              fmt::format("expected a finite number (float32 range), got '{}'",
                          text));
        if (inexact && rounded++ == 0) first_rounded_line = line_no;
        (c < size_t(d.d_in) ? d.x : d.y).push_back(*v);
      }
      ++d.n;
    }
    if (d.n == 0)
      throw InputError(file, 1, 0, "", "no data rows after the header");
    if (rounded)
      d.notes.push_back(
          fmt::format("{} values rounded to float32 (first at {}:{})", rounded,
                      file, first_rounded_line));
  } catch (const io::error::base& e) {
    // Anything else the parser refuses (e.g. an over-long line).
    throw InputError(file, line_no + 1, 0, "", e.what());
  }
  if (s.data.samples != 0 && s.data.samples != d.n)
    throw InputError(file, 0, 0, "data.samples",
                     fmt::format("the scenario says {} samples, the file has "
                                 "{} rows",
                                 s.data.samples, d.n));
  return d;
}

}  // namespace

int64_t sequence_length(const DataSpec& d, int64_t id) {
  // A stream of its own position (b = 2^40) so lengths never correlate
  // with the token values drawn from the same stream.
  const uint64_t bits =
      random_bits(d.seed, Stream::input, uint64_t(id), uint64_t{1} << 40);
  switch (d.lengths) {
    case SequenceLengths::fixed:
      return d.max_len;
    case SequenceLengths::uniform:
      return d.min_len +
             int64_t(uniform_index(bits, uint64_t(d.max_len - d.min_len + 1)));
    case SequenceLengths::long_tailed: {
      // u in (0, 1]; len = floor(min_len / u): P(len >= x) = min_len / x.
      const double u = double((bits >> 11) + 1) * 0x1p-53;
      const double len = std::floor(double(d.min_len) / u);
      return len >= double(d.max_len) ? d.max_len : int64_t(len);
    }
  }
  return d.max_len;
}

Dataset make_dataset(const Scenario& s) {
  if (s.data.source == DataSource::generated)
    require_within("samples", s.data.samples,
                   fmt::format("data.samples = {}", s.data.samples), s.path, 0,
                   0, "data.samples");
  Dataset d = s.data.source == DataSource::csv ? from_csv(s) : generated(s);
  d.seed = s.data.seed;
  return d;
}

std::vector<float> initial_parameters(const Scenario& s,
                                      const ParamLayout& layout) {
  std::vector<float> p(size_t(layout.total));
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const TensorView& v = layout.tensors[t];
    if (v.init != TensorView::Init::uniform) {
      const float c = v.init == TensorView::Init::ones ? 1.0f : 0.0f;
      for (int64_t k = 0; k < v.size(); ++k) p[size_t(v.offset + k)] = c;
      continue;
    }
    const double fan_in = double(std::max<int64_t>(1, v.fan_in));
    // Dyadic: the largest power of two <= 1/sqrt(fan_in), exactly.
    double scale = 1.0;
    if (s.data.dyadic)
      while (scale * scale * fan_in > 1.0) scale *= 0.5;
    const double bound = 1.0 / std::sqrt(fan_in);
    for (int64_t k = 0; k < v.size(); ++k) {
      const uint64_t bits =
          random_bits(s.data.seed, Stream::init, uint64_t(t), uint64_t(k));
      p[size_t(v.offset + k)] = s.data.dyadic
                                    ? float(double(dyadic_pm1(bits)) * scale)
                                    : float(double(uniform_pm1(bits)) * bound);
    }
  }
  return p;
}

}  // namespace accumcheck
