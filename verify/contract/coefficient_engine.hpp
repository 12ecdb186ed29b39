// The coefficient engine: the contract tier's prediction (DESIGN.md
// section 10).  An Engine (sim/engine.hpp) whose gradient buffer holds no
// numbers but exact coefficients over the micro-batch gradients
//   g_j = d/dtheta sum_{i in micro-batch j} l_i, at the parameters of the
//         optimizer step it is taken at,
// so that, run through the one Trainer loop (sim/trainer.hpp) with any
// Behavior, it says which g_j with which weights form each optimizer
// step's gradient -- for any model, since it never looks at one.
//
//   forward_backward(shard, w)    adds w = num/den to the coefficient of a new
//                                 term g_j (j counts backward passes; the
//                                 term remembers the shard, its epoch and
//                                 the parameter version: optimizer steps
//                                 taken before it);
//   add_l2(lambda, den)           adds lambda/den to the coefficient of the
//                                 parameter vector theta_v (L2 in the loss);
//   zero_grad                     clears every coefficient;
//   scale_grads(r)                multiplies every coefficient by r, exactly
//                                 (a double is a dyadic rational);
//   clip_grad_norm(c)             multiplies every coefficient by a new
//                                 symbol s_m = min(1, c / (|G| + 1e-6)),
//                                 G the buffer at that moment (recorded):
//                                 clipping enters as a recorded scalar,
//                                 evaluated by whoever has the g_j;
//   clip_grad_norm_shard(c, R)    the same, the norm of the rank's own
//                                 shard of G (ddp-clip-local-norm: chunk
//                                 `rank` of ceil(n/R) elements, as the
//                                 oracle's trainer cuts it);
//   optimizer_step(opt, lr)       records the buffer (the step's gradient)
//                                 with its lr and counts a version; the
//                                 buffer stays, as PyTorch's .grad does;
//   hold_rank(r), average_ranks(R) DDP (sim/trainer.hpp): each rank a
//                                 replica with its own buffer and version
//                                 (the trainer swaps the version with
//                                 EngineState, the buffer here); DDP's
//                                 all-reduce replaces every rank's buffer
//                                 by sum_r (1/R) buffer_r, exactly.
// Coefficients are polynomials in the symbols with exact
// Boost.Multiprecision cpp_rational coefficients.  Losses and norms are
// unknown here and returned as NaN (the engine's Real is double).
//
// A symbol is a clip's factor, or a mean: an all-reduce's average of a
// coefficient that holds other ranks' clip factors (each rank's clip
// multiplies its own buffer by its own symbol) is itself a sum of several
// products of symbols, and expanding it where the buffer is never zeroed
// (zero-grad-never with clip-per-micro-step under DDP, say) multiplies the
// monomials by R at every all-reduce: R^W after W windows (3^12 = 531441
// monomials a term, GBs for one buffer).  Such an average is kept as a new
// symbol defined by that sum (of earlier symbols: R monomials), so every
// coefficient stays as small as the loop's own operations; the value is
// the same, exactly (symbols()).
#pragma once

#include <algorithm>
#include <boost/multiprecision/cpp_int.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sim/engine.hpp"
#include "sim/scenario.hpp"
#include "sim/trainer.hpp"

namespace accumcheck::contract {

using Rational = boost::multiprecision::cpp_rational;

// A double as the exact rational it is (every finite double is dyadic).
inline Rational exact_rational(double x) {
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m * 2^e, 0.5 <= |m| < 1
  // 53 bits of mantissa as an integer.
  const auto mi = static_cast<int64_t>(std::ldexp(m, 53));
  Rational q(mi);
  const int shift = e - 53;
  const Rational two_pow =
      Rational(boost::multiprecision::cpp_int(1) << std::abs(shift));
  if (shift >= 0) return Rational(q * two_pow);
  return Rational(q / two_pow);
}

// Product of clip symbols (ids, sorted, with multiplicity); {} is 1.
using Monomial = std::vector<int32_t>;

// sum over monomials of rational * monomial.
struct Coef {
  std::map<Monomial, Rational> terms;

  bool zero() const { return terms.empty(); }
  void add(const Monomial& m, const Rational& q) {
    auto [it, fresh] = terms.emplace(m, q);
    if (!fresh) it->second += q;
    if (it->second == 0) terms.erase(it);
  }
  void scale(const Rational& q) {
    if (q == 0) {
      terms.clear();
      return;
    }
    for (auto& [m, v] : terms) v *= q;
  }
  void times_symbol(int32_t s) {
    std::map<Monomial, Rational> out;
    for (auto& [m, v] : terms) {
      Monomial n = m;
      n.insert(std::upper_bound(n.begin(), n.end(), s), s);
      out.emplace(std::move(n), v);
    }
    terms = std::move(out);
  }
  // The value with symbol m worth sym[m] (T: a number type constructible
  // from a decimal string, e.g. OracleReal, or double).
  template <class T>
  T value(const std::vector<T>& sym) const;
  // "1/12", "3/8*s0*s2 + 1/4": exact, for messages and tests.
  std::string str() const;
  bool operator==(const Coef&) const = default;
};

// What a coefficient multiplies: the gradient g_j of backward pass j, or
// the parameter vector theta_v (v = optimizer steps taken).
struct Term {
  enum Kind { grad, param } kind = grad;
  int64_t index = 0;
  int64_t rank = 0;  // param: whose theta_v (DDP ranks may diverge)
  auto operator<=>(const Term&) const = default;
};

using Buffer = std::map<Term, Coef>;

// One backward pass: micro-batch shard j.
struct MicroGrad {
  std::vector<int64_t> ids;  // the shard's ids, as the plan holds them
  int64_t rank = 0;          // the rank whose backward it is
  int64_t epoch = 0;         // for dropout masks keyed by epoch
  int64_t version = 0;       // optimizer steps taken before it
  int64_t items = 0;         // loss-bearing items (Engine::items)
};

// One clip_grad_norm_ call: its symbol, the buffer it saw.
struct ClipRecord {
  int64_t rank = 0;
  int64_t version = 0;
  double max_norm = 0;
  Buffer before;
  int64_t shards = 0;  // > 0: the norm of chunk `rank` of `shards`
};

// Symbol s_i: clip `clip`'s factor, or (clip < 0) the mean `mean`, a
// polynomial of the symbols before it (an all-reduce's average).
struct Symbol {
  int64_t clip = -1;
  Coef mean;
};

// One optimizer step: the gradient it consumed.
struct StepPrediction {
  int64_t rank = 0;
  int64_t step = 0;  // == version before the step
  double lr = std::numeric_limits<double>::quiet_NaN();
  Buffer grad;
};

class CoefficientEngine {
 public:
  using Real = double;  // losses and norms: unknown here (NaN)

  // `items` counts a shard's loss-bearing items (samples or tokens), as
  // the engine whose run this predicts would.
  // `unshifted`, where given, counts them over the unshifted labels
  // (token-count-unshifted-labels: each sequence's position 0 too, where
  // its label is not -100).
  explicit CoefficientEngine(
      std::function<int64_t(const std::vector<int64_t>&)> items,
      std::function<int64_t(const std::vector<int64_t>&)> unshifted = {})
      : items_(std::move(items)), unshifted_(std::move(unshifted)) {}

  void zero_grad() { buf_.clear(); }
  int64_t items(const std::vector<int64_t>& ids) const { return items_(ids); }
  int64_t unshifted_items(const std::vector<int64_t>& ids) const {
    return unshifted_ ? unshifted_(ids) : items_(ids) + int64_t(ids.size());
  }
  double forward_backward(const std::vector<int64_t>& ids, LossWeight w) {
    const int64_t j = int64_t(micro_.size());
    micro_.push_back({ids, rank_, epoch_, version_, items_(ids)});
    buf_[Term{Term::grad, j}].add({}, Rational(w.num, w.den));
    return nan();
  }
  void add_l2(double lambda, int64_t den) {
    if (lambda == 0) return;
    Coef& c = buf_[Term{Term::param, version_, rank_}];
    c.add({}, exact_rational(lambda) / den);
    if (c.zero()) buf_.erase(Term{Term::param, version_, rank_});
  }
  double grad_norm() const { return nan(); }
  // Coefficients are finite by construction: an overflow is the trace's
  // (the scaler's skip), never the prediction's.
  bool grads_finite() const { return true; }
  void scale_grads(double r) {
    const Rational q = exact_rational(r);
    for (auto& [t, c] : buf_) c.scale(q);
    prune();
  }
  // The trainer's clip (sim/trainer.hpp calls this instead of its own
  // formula when an engine offers it): the factor stays a symbol.
  double clip_grad_norm(double max_norm) {
    const int32_t s = int32_t(symbols_.size());
    symbols_.push_back({int64_t(clips_.size()), {}});
    clips_.push_back({rank_, version_, max_norm, buf_});
    for (auto& [t, c] : buf_) c.times_symbol(s);
    return nan();
  }
  double clip_grad_norm_shard(double max_norm, int64_t ranks) {
    const double out = clip_grad_norm(max_norm);
    clips_.back().shards = ranks;
    return out;
  }
  void optimizer_step(const OptimizerSpec&, double lr) {
    steps_.push_back({rank_, version_, lr, buf_});
    ++version_;
  }
  // The trainer makes this engine hold rank r (after set_state).
  void hold_rank(int64_t r) {
    if (r == rank_) return;
    if (size_t(std::max(r, rank_)) >= rank_buf_.size())
      rank_buf_.resize(size_t(std::max(r, rank_)) + 1);
    rank_buf_[size_t(rank_)] = std::move(buf_);
    buf_ = std::move(rank_buf_[size_t(r)]);
    rank_ = r;
  }
  // DDP's all-reduce over ranks 0..R-1: every rank's buffer becomes
  // sum_r (1/R) buffer_r (the reducer's average), exactly.
  void average_ranks(int64_t R) {
    if (size_t(R) > rank_buf_.size()) rank_buf_.resize(size_t(R));
    rank_buf_[size_t(rank_)] = std::move(buf_);
    Buffer avg;
    const Rational inv(1, R);
    for (int64_t r = 0; r < R; ++r)
      for (const auto& [t, c] : rank_buf_[size_t(r)])
        for (const auto& [m, q] : c.terms) avg[t].add(m, q * inv);
    for (auto it = avg.begin(); it != avg.end();) {
      if (it->second.zero()) {
        it = avg.erase(it);
        continue;
      }
      // A sum of several products of symbols: a mean symbol of its own.
      Coef& c = it->second;
      if (c.terms.size() > 1 && !c.terms.rbegin()->first.empty()) {
        const int32_t s = int32_t(symbols_.size());
        symbols_.push_back({-1, std::move(c)});
        c = Coef{};
        c.add({s}, Rational(1));
      }
      ++it;
    }
    for (int64_t r = 0; r < R; ++r) rank_buf_[size_t(r)] = avg;
    buf_ = std::move(rank_buf_[size_t(rank_)]);
  }
  EngineState<double> state() const {
    EngineState<double> st;
    st.optimizer_steps = version_;
    return st;
  }
  void set_state(const EngineState<double>& st) {
    version_ = st.optimizer_steps;
  }
  void set_epoch(int64_t e) { epoch_ = e; }

  const std::vector<MicroGrad>& micro() const { return micro_; }
  const std::vector<ClipRecord>& clips() const { return clips_; }
  // Every symbol in order (each clip's, each mean's).
  const std::vector<Symbol>& symbols() const { return symbols_; }
  const std::vector<StepPrediction>& steps() const { return steps_; }
  const Buffer& buffer() const { return buf_; }

 private:
  static double nan() { return std::numeric_limits<double>::quiet_NaN(); }
  void prune() {
    for (auto it = buf_.begin(); it != buf_.end();)
      it = it->second.zero() ? buf_.erase(it) : std::next(it);
  }

  std::function<int64_t(const std::vector<int64_t>&)> items_, unshifted_;
  Buffer buf_;                    // the buffer of the rank held
  std::vector<Buffer> rank_buf_;  // the other ranks' (hold_rank)
  int64_t rank_ = 0;
  std::vector<MicroGrad> micro_;
  std::vector<ClipRecord> clips_;
  std::vector<Symbol> symbols_;
  std::vector<StepPrediction> steps_;
  int64_t version_ = 0;
  int64_t epoch_ = 0;
};

static_assert(Engine<CoefficientEngine>);

// ---- evaluation

template <class T>
T to_number(const Rational& q) {
  if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(q);
  } else {
    return T(boost::multiprecision::numerator(q).str()) /
           T(boost::multiprecision::denominator(q).str());
  }
}

template <class T>
T Coef::value(const std::vector<T>& sym) const {
  T out = T(0);
  for (const auto& [m, q] : terms) {
    T v = to_number<T>(q);
    for (int32_t s : m) v *= sym.at(size_t(s));
    out += v;
  }
  return out;
}

inline std::string Coef::str() const {
  if (terms.empty()) return "0";
  std::string out;
  for (const auto& [m, q] : terms) {
    if (!out.empty()) out += " + ";
    out += q.str();
    for (int32_t s : m) out += "*s" + std::to_string(s);
  }
  return out;
}

// The vector a buffer stands for, given each term's vector (g_j or theta_v,
// evaluated by the caller -- independently of the run predicted) and the
// clip symbols' values.
template <class T>
std::vector<T> evaluate(const Buffer& b, const std::vector<T>& sym,
                        const std::function<const std::vector<T>&(Term)>& vec,
                        size_t n) {
  std::vector<T> out(n, T(0));
  for (const auto& [term, c] : b) {
    const T w = c.value(sym);
    const std::vector<T>& v = vec(term);
    for (size_t i = 0; i < n; ++i) out[i] += w * v[i];
  }
  return out;
}

// One clip's factor s = min(1, c / (|G| + 1e-6)), G the buffer it saw
// evaluated with the symbols before it (`sym`); a shard clip: the norm of
// its rank's chunk of ceil(n/R) elements.
template <class T>
T clip_value(const ClipRecord& c, const std::vector<T>& sym,
             const std::function<const std::vector<T>&(Term)>& vec, size_t n) {
  const std::vector<T> g = evaluate(c.before, sym, vec, n);
  size_t lo = 0, hi = n;
  if (c.shards > 0) {
    const size_t chunk = (n + size_t(c.shards) - 1) / size_t(c.shards);
    lo = std::min(n, size_t(c.rank) * chunk);
    hi = std::min(n, lo + chunk);
  }
  T sq = T(0);
  for (size_t i = lo; i < hi; ++i) sq += g[i] * g[i];
  using std::sqrt;
  const T coef = T(c.max_norm) / (T(sqrt(sq)) + T(1e-6));
  return coef < T(1) ? coef : T(1);
}

// Every symbol's value, in order: a clip's from clip_value(its index,
// the symbols before it), a mean's from its polynomial.
template <class T>
std::vector<T> symbol_values(
    const std::vector<Symbol>& symbols,
    const std::function<T(size_t, const std::vector<T>&)>& clip_value) {
  std::vector<T> sym;
  for (const Symbol& s : symbols)
    sym.push_back(s.clip >= 0 ? clip_value(size_t(s.clip), sym)
                              : s.mean.value(sym));
  return sym;
}

// The symbols' values (symbols: the engine's symbols(); empty: each clip
// is the symbol of its index): a clip's s = min(1, c / (|G| + 1e-6)) with
// G the buffer it saw, evaluated with the earlier symbols (a shard clip:
// the norm of its rank's chunk of ceil(n/R) elements).
template <class T>
std::vector<T> clip_values(
    const std::vector<ClipRecord>& clips,
    const std::function<const std::vector<T>&(Term)>& vec, size_t n,
    const std::vector<Symbol>& symbols = {}) {
  std::vector<Symbol> table = symbols;
  if (table.empty())
    for (size_t m = 0; m < clips.size(); ++m) table.push_back({int64_t(m), {}});
  return symbol_values<T>(table, [&](size_t m, const std::vector<T>& sym) {
    return clip_value(clips[m], sym, vec, n);
  });
}

}  // namespace accumcheck::contract

namespace accumcheck {
// Compiled once, in verify/contract/predict.cpp (docs/development.md
// "Build": the cold build's CPU).
extern template class Trainer<contract::CoefficientEngine>;
}  // namespace accumcheck
