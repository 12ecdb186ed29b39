#include "oracle/error_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace accumcheck::error_model {

double oracle_tolerance(unsigned digits) {
  return std::pow(10.0,
                  -(double(digits) - tolerance("oracle_rel_digits_margin")));
}

double tolerance(std::string_view name) {
  for (const Tolerance& t : kTolerances)
    if (t.name == name) return t.value;
  throw std::out_of_range("unknown tolerance: " + std::string(name));
}

double buffer_unit(GradBuffer b) {
  switch (b) {
    case GradBuffer::fp32:
      return kUnitRoundoff32;
    case GradBuffer::bf16:
      return tolerance("unit_roundoff_bf16");
    case GradBuffer::fp16:
      return tolerance("unit_roundoff_fp16");
  }
  return kUnitRoundoff32;
}

double lowp_sum_bound(GradBuffer b, int64_t K, double sum_abs_terms,
                      double sum_term_bounds) {
  const bool lowp = b != GradBuffer::fp32;
  const double u32 = kUnitRoundoff32;
  const double u = lowp ? (1 + u32) * (1 + buffer_unit(b)) - 1 : u32;
  const double n = double(lowp ? K : K - 1);
  if (n * u >= 1) return std::numeric_limits<double>::infinity();
  const double gamma = n * u / (1 - n * u);
  const double eta = b == GradBuffer::bf16   ? tolerance("underflow_bf16")
                     : b == GradBuffer::fp16 ? tolerance("underflow_fp16")
                                             : 0.0;
  return gamma * sum_abs_terms + (1 + gamma) * sum_term_bounds +
         double(2 * K - 1) * eta * (1 + gamma);
}

namespace {
// accumulate()'s ratio: err > 0 in high precision but below double's
// range is still a violation, so never reported as at most 1.
double reported_ratio(double ratio, bool violated) {
  return violated && ratio <= 1
             ? std::nextafter(1.0, std::numeric_limits<double>::infinity())
             : ratio;
}
// |f - v| in float32 units of max(|v|, 2^-126).
double err_in_u(double err, double v) {
  return err / (kUnitRoundoff32 * std::max(std::fabs(v), 0x1p-126));
}
}  // namespace

void accumulate(Comparison& c, const ParamLayout* layout, int64_t index,
                double f, double v, double err, double bound, double ratio,
                bool violated) {
  ratio = reported_ratio(ratio, violated);
  const double err_u = err_in_u(err, v);
  ++c.n;
  if (violated) ++c.violations;
  c.max_err_u = std::max(c.max_err_u, err_u);
  c.rms_err_u += err_u * err_u;  // the sum; compare() takes the root
  if (c.worst.index < 0 || ratio > c.worst.ratio) {
    c.worst.index = index;
    c.worst.tensor = "";
    if (layout && !layout->tensors.empty()) {
      const TensorView& t = layout->tensor_of(index);
      c.worst.tensor = t.name + "[" + std::to_string(index - t.offset) + "]";
    }
    c.worst.f = f;
    c.worst.v = v;
    c.worst.err = err;
    c.worst.bound = bound;
    c.worst.ratio = ratio;
  }
  c.max_ratio = std::max(c.max_ratio, ratio);
  if (layout && !layout->tensors.empty()) {
    // Elements come in layout order: the last entry's tensor, found by
    // its range, saves a search and a name comparison per element.
    const TensorView* last = c.tensor_ratio.empty() ? nullptr : c.last_tensor;
    if (last && index >= last->offset && index < last->offset + last->size()) {
      c.tensor_ratio.back().second =
          std::max(c.tensor_ratio.back().second, ratio);
      return;
    }
    const TensorView& tv = layout->tensor_of(index);
    const std::string& name = tv.name;
    if (c.tensor_ratio.empty() || c.tensor_ratio.back().first != name) {
      auto it = std::find_if(c.tensor_ratio.begin(), c.tensor_ratio.end(),
                             [&](const auto& tr) { return tr.first == name; });
      if (it == c.tensor_ratio.end()) {
        c.tensor_ratio.emplace_back(name, ratio);
        c.last_tensor = &tv;
        return;
      }
      it->second = std::max(it->second, ratio);
      c.last_tensor = nullptr;  // back() is another tensor's entry
      return;
    }
    c.last_tensor = &tv;
    c.tensor_ratio.back().second =
        std::max(c.tensor_ratio.back().second, ratio);
  }
}

Comparison compare_proxy(std::string what, const std::vector<double>& f,
                         const std::vector<double>& v,
                         const ParamLayout* layout, double ulps) {
  Comparison c;
  c.what = std::move(what);
  double maxabs = 0;
  for (double x : v) maxabs = std::max(maxabs, std::fabs(x));
  const double floor_term = std::ldexp(maxabs, -10);
  const double k = ulps * kUnitRoundoff32;
  auto bound_of = [&](size_t i) {
    return k * (std::fabs(v[i]) + floor_term) + 1e-300;
  };
  const size_t n = std::min(f.size(), v.size());
  const bool tensors = layout && !layout->tensors.empty();
  size_t i = 0;
  while (i < n) {
    {  // the first element of a run through accumulate()
      const double err = std::fabs(f[i] - v[i]), bound = bound_of(i);
      accumulate(c, layout, int64_t(i), f[i], v[i], err, bound, err / bound,
                 err > bound);
      ++i;
    }
    // The run: the rest of the tensor accumulate() has cached (every
    // element without a layout), up to an element that raises the worst.
    size_t end = n;
    if (tensors) {
      const TensorView* t = c.last_tensor;
      if (!t || int64_t(i) < t->offset || int64_t(i) >= t->offset + t->size())
        continue;
      end = std::min(n, size_t(t->offset + t->size()));
    }
    int64_t count = c.n, violations = c.violations;
    double max_err_u = c.max_err_u, rms = c.rms_err_u, max_ratio = c.max_ratio;
    double tensor_max = tensors ? c.tensor_ratio.back().second : 0;
    const double worst = c.worst.ratio;
    for (; i < end; ++i) {
      const double err = std::fabs(f[i] - v[i]), bound = bound_of(i);
      const bool violated = err > bound;
      const double ratio = reported_ratio(err / bound, violated);
      if (ratio > worst) break;  // a new worst: accumulate() takes it
      const double err_u = err_in_u(err, v[i]);
      ++count;
      violations += violated;
      max_err_u = std::max(max_err_u, err_u);
      rms += err_u * err_u;
      max_ratio = std::max(max_ratio, ratio);
      tensor_max = std::max(tensor_max, ratio);
    }
    c.n = count;
    c.violations = violations;
    c.max_err_u = max_err_u;
    c.rms_err_u = rms;
    c.max_ratio = max_ratio;
    if (tensors) c.tensor_ratio.back().second = tensor_max;
  }
  return c;
}

namespace {
std::string fmt_g(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}
}  // namespace

std::string Comparison::summary() const {
  char buf[512];
  std::string where = worst.tensor;
  if (where.empty()) {
    where.append("[");
    where.append(std::to_string(worst.index));
    where.append("]");
  }
  // A zero bound is an exact comparison: said so, not "inf% of bound".
  char share[64];
  if (worst.bound == 0)
    std::snprintf(share, sizeof share, "%s",
                  worst.err == 0 ? "exact, as required" : "must be exact");
  else
    std::snprintf(share, sizeof share, "%.1f%% of bound", 100.0 * worst.ratio);
  const std::string bound_text = worst.bound == 0
                                     ? "bound=0, an exact comparison"
                                     : "bound=" + fmt_g(worst.bound);
  std::snprintf(buf, sizeof buf,
                "%s: %lld of %lld outside the bound; worst %s f=%.9g "
                "v=%.17g err=%.3g %s (%s); max %.3g u, rms %.3g u",
                what.c_str(), (long long)violations, (long long)n,
                where.c_str(), worst.f, worst.v, worst.err, bound_text.c_str(),
                share, max_err_u, rms_err_u);
  return buf;
}

}  // namespace accumcheck::error_model
