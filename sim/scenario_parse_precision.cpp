// Scenario files: the [precision] and [ema] sections (sim/scenario.hpp
// PrecisionSpec, EmaSpec).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "sim/scenario_reader.hpp"

namespace accumcheck::scenario_reader {

namespace {

// A factor of GradScaler that must be a power of two (so that scaling and
// unscaling are exact): its exponent.
int64_t power_of_two(const Section& sec, std::string_view k, double x,
                     bool above_one, bool below_one) {
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  const bool pow2 = m == 0.5;
  const int64_t exp = e - 1;
  if (!pow2 || (above_one && exp < 1) || (below_one && exp > -1) || exp < -60 ||
      exp > 60)
    sec.bad(k, above_one   ? "a power of two > 1 (2, 4, ...)"
               : below_one ? "a power of two < 1 (0.5, 0.25, ...)"
                           : "a power of two in 2^-60..2^60 (65536 = 2^16)");
  return exp;
}

}  // namespace

void parse_precision(const Parser& p, const Section& sec, const Section& ema,
                     Scenario& s) {
  PrecisionSpec& pr = s.precision;
  pr = PrecisionSpec{};
  pr.grad_buffer =
      sec.choice("grad_buffer", kGradBuffers).value_or(GradBuffer::fp32);
  static constexpr std::pair<std::string_view, bool> kScales[] = {
      {"none", false}, {"dynamic", true}};
  pr.loss_scaling = sec.choice("loss_scale", kScales).value_or(false);
  if (!pr.loss_scaling) {
    for (std::string_view k : {"init_scale", "growth_factor", "backoff_factor",
                               "growth_interval", "overflow"})
      sec.forbid(k, "applies to loss_scale = \"dynamic\" only");
  } else {
    if (const auto x = sec.number("init_scale", kPositive))
      pr.scale_exp = power_of_two(sec, "init_scale", *x, false, false);
    if (const auto x = sec.number("growth_factor", kPositive))
      pr.growth_exp = power_of_two(sec, "growth_factor", *x, true, false);
    if (const auto x = sec.number("backoff_factor", kPositive))
      pr.backoff_exp = power_of_two(sec, "backoff_factor", *x, false, true);
    pr.growth_interval =
        sec.integer("growth_interval", 1).value_or(pr.growth_interval);
    if (const toml::node* n = sec.node("overflow")) {
      const auto* arr = n->as_array();
      if (!arr) sec.bad("overflow", "an array of [window, micro] pairs");
      for (size_t i = 0; i < arr->size(); ++i) {
        const toml::node& el = (*arr)[i];
        const std::string key = fmt::format("precision.overflow[{}]", i);
        const auto* pair = el.as_array();
        if (!pair || pair->size() != 2 || !(*pair)[0].is_integer() ||
            !(*pair)[1].is_integer() || (*pair)[0].as_integer()->get() < 0 ||
            (*pair)[1].as_integer()->get() < 0)
          p.fail(&el, key,
                 "expected [window, micro] (two integers >= 0: the window "
                 "from 0 over the whole run, the micro-step in it), " +
                     got(el));
        pr.overflow.emplace_back((*pair)[0].as_integer()->get(),
                                 (*pair)[1].as_integer()->get());
      }
    }
  }
  s.ema = EmaSpec{};
  if (ema.present()) {
    s.ema.enabled = true;
    s.ema.decay = ema.required_number("decay", kUnitInterval);
  }
}

}  // namespace accumcheck::scenario_reader
