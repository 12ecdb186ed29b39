#include "properties/generators.hpp"

#include <cmath>
#include <ostream>

#include "sim/scenario_parse.hpp"

namespace accumcheck::properties {

using rc::Gen;
namespace gen = rc::gen;

Gen<double> dyadic_real(int m_lo, int m_hi, int e_lo, int e_hi) {
  return gen::map(
      gen::pair(gen::inRange(m_lo, m_hi + 1), gen::inRange(e_lo, e_hi + 1)),
      [](std::pair<int, int> me) {
        return std::ldexp(double(me.first), -me.second);
      });
}

namespace {

Gen<Scenario> scenario_one_rank(const Triggers& t);

struct Shape {
  int64_t b = 1, K = 1, n = 1;
};

// b, K and n with the requested window structure.  M micro-steps per
// epoch = q*K + r; the last micro-batch holds `last` in [1, b] samples.
Gen<Shape> shape(const Triggers& t) {
  const int k_lo = t.accumulation ? 2 : 1;
  const int b_lo = t.short_micro ? 2 : 1;
  if (t.dyadic_bitwise)
    return gen::build<Shape>(
        gen::set(&Shape::b, gen::element<int64_t>(1, 2, 4)),
        gen::set(&Shape::K, gen::element<int64_t>(2, 4)),
        gen::set(&Shape::n, gen::inRange<int64_t>(1, 3)));  // windows
  return gen::mapcat(
      gen::pair(gen::inRange<int64_t>(b_lo, 6),
                t.k_power_of_two ? gen::element<int64_t>(2, 4)
                                 : gen::inRange<int64_t>(k_lo, 6)),
      [t](std::pair<int64_t, int64_t> bk) {
        // Plain variables, not a structured binding: clang 14 cannot
        // capture a binding in the lambda below (C++20 allows it; P1091).
        const int64_t b = bk.first, K = bk.second;
        const int64_t r_lo = t.partial_window ? 1 : 0;
        const int64_t r_hi = t.full_windows ? 0 : K - 1;
        const int64_t last_hi =
            t.full_windows ? b : (t.short_micro ? b - 1 : b);
        const int64_t last_lo = t.full_windows ? b : 1;
        return gen::map(
            gen::tuple(gen::inRange<int64_t>(1, 3),  // full windows
                       gen::inRange<int64_t>(r_lo, std::max(r_lo, r_hi) + 1),
                       gen::inRange<int64_t>(last_lo, last_hi + 1)),
            [b, K](std::tuple<int64_t, int64_t, int64_t> x) {
              auto [q, r, last] = x;
              int64_t M = q * K + r;
              if (M == 0) M = K;  // at least one window
              return Shape{b, K, (M - 1) * b + last};
            });
      });
}

}  // namespace

// R ranks over a one-rank case: n' = R*n - d, d in [0, R-1], so that
// ceil(n'/R) = n (DistributedSampler's shard of the longest rank keeps the
// drawn window structure); bitwise cases keep full windows (d = 0).
namespace {
Gen<Scenario> with_ranks(const Triggers& t, Scenario s) {
  if (t.max_ranks <= 1) return gen::just(s);
  const bool bitwise = s.data.dyadic;
  return gen::mapcat(
      gen::inRange<int64_t>(std::max(1, t.min_ranks), t.max_ranks + 1),
      [t, s, bitwise](int64_t R) {
        // n' >= R: every rank holds a sample under drop-last too.
        const int64_t n = s.data.samples;
        const int64_t d_hi =
            bitwise || R == 1 ? 0 : std::min(R - 1, R * (n - 1));
        const int64_t d_lo = std::min<int64_t>(t.uneven_shards ? 1 : 0, d_hi);
        return gen::apply(
            [s, R](int64_t d, Sampler sampler) {
              Scenario r = s;
              r.batching.ranks = R;
              r.data.samples = R * s.data.samples - d;
              r.batching.sampler = sampler;
              return r;
            },
            gen::inRange<int64_t>(d_lo, d_hi + 1),
            t.sampler ? gen::just(*t.sampler)
                      : gen::element(Sampler::pad, Sampler::drop_last,
                                     Sampler::split));
      });
}

}  // namespace

Gen<Scenario> scenario(const Triggers& t) {
  return gen::mapcat(scenario_one_rank(t),
                     [t](Scenario s) { return with_ranks(t, s); });
}

namespace {
Gen<Scenario> scenario_one_rank(const Triggers& t) {
  return gen::mapcat(shape(t), [t](Shape sh) {
    const bool bitwise = t.dyadic_bitwise;
    Gen<Activation> act =
        bitwise    ? gen::element(Activation::identity, Activation::relu)
        : t.smooth ? gen::element(Activation::tanh, Activation::gelu)
                   : gen::element(Activation::identity, Activation::tanh,
                                  Activation::relu, Activation::gelu);
    Gen<LossKind> loss =
        (bitwise || t.smooth)
            ? gen::just(LossKind::mse)
            : gen::element(LossKind::mse, LossKind::cross_entropy);
    Gen<OptimizerKind> opt =
        t.adam        ? gen::element(OptimizerKind::adam, OptimizerKind::adamw)
        : t.sgd_plain ? gen::just(OptimizerKind::sgd)
                      : gen::element(OptimizerKind::sgd, OptimizerKind::adam,
                                     OptimizerKind::adamw);
    Gen<ScheduleKind> sched =
        t.schedule ? gen::element(ScheduleKind::step, ScheduleKind::linear,
                                  ScheduleKind::cosine)
                   : gen::element(ScheduleKind::constant, ScheduleKind::step,
                                  ScheduleKind::linear, ScheduleKind::cosine);
    const int w = t.max_width;
    return gen::apply(
        [t, sh, bitwise](Activation a, LossKind l, OptimizerKind o,
                         ScheduleKind sk, std::vector<int> widths,
                         uint64_t seed, double lr, double mom, double wd,
                         double l2, int64_t warmup, int64_t total, double clip,
                         bool clip_on, bool shuffle, int64_t epochs) {
          Scenario s;
          s.name = "generated";
          s.story = "generated case";
          for (int x : widths) s.model.widths.push_back(x);
          // MSE's 2/(d_out*den) is dyadic only for d_out a power of two.
          if (bitwise && s.model.widths.back() == 3) s.model.widths.back() = 4;
          if (l == LossKind::cross_entropy && s.model.widths.back() < 2)
            s.model.widths.back() = 2;
          s.model.activation = a;
          s.model.loss = l;
          s.data.seed = seed;
          s.data.dyadic = bitwise;
          s.data.shuffle = shuffle;
          s.batching.micro_batch = sh.b;
          s.batching.accumulation = sh.K;
          if (bitwise) {
            // sh.n counts windows: full windows of K micro-batches of b.
            s.data.samples = sh.n * sh.K * sh.b;
          } else {
            s.data.samples = sh.n;
          }
          s.batching.epochs = t.single_epoch || bitwise ? 1 : epochs;
          s.optimizer.kind = o;
          s.optimizer.lr = lr;
          const bool plain = t.sgd_plain || bitwise;
          s.optimizer.momentum =
              (o == OptimizerKind::sgd && !plain) ? mom : 0.0;
          s.optimizer.weight_decay = (plain || t.no_weight_decay) ? 0.0 : wd;
          s.optimizer.l2_in_loss = (plain || t.no_weight_decay) ? 0.0 : l2;
          s.schedule.kind = bitwise ? ScheduleKind::constant : sk;
          s.schedule.warmup = warmup;
          s.schedule.total = warmup + total;
          s.schedule.step_size = std::max<int64_t>(1, total / 2);
          s.schedule.gamma = 0.5;
          s.clip.enabled = !t.no_clip && !bitwise && (t.clip || clip_on);
          s.clip.max_norm = clip;
          s.trainer.pitfalls = t.pitfalls;
          return s;
        },
        act, loss, opt, sched,
        gen::mapcat(gen::inRange(0, bitwise ? 2 : 3),
                    [w, bitwise](int hidden) {
                      return gen::container<std::vector<int>>(
                          size_t(hidden + 2),
                          gen::inRange(1, (bitwise ? 4 : w) + 1));
                    }),
        gen::inRange<uint64_t>(0, 1000000), dyadic_real(1, 15, 4, 9),
        gen::map(gen::inRange(0, 15), [](int m) { return m / 16.0; }),
        gen::element(0.0, 0.01, 0.125), gen::element(0.0, 0.001, 0.0625),
        gen::inRange<int64_t>(0, 4), gen::inRange<int64_t>(1, 12),
        dyadic_real(1, 15, 2, 8), gen::arbitrary<bool>(),
        gen::arbitrary<bool>(), gen::inRange<int64_t>(1, 3));
  });
}

}  // namespace

}  // namespace accumcheck::properties

void accumcheck::showValue(const Scenario& s, std::ostream& os) {
  os << "\n# " << describe(s) << "\n" << to_toml(s);
}

void accumcheck::showValue(Pitfall p, std::ostream& os) { os << pitfall_id(p); }
