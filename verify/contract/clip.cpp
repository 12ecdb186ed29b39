// The contract tier's clip check (verify/contract/detail.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "oracle/error_model.hpp"
#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

// The clip_grad_norm_ calls against the declared clip: one per optimizer
// step, before it, with the declared max_norm, and each factor what
// clip_grad_norm_'s formula gives on the float64 norm of the gradient it
// saw, within gamma_{n+2} (float32 norm of n values, Higham 3.1, and the
// division); n: the terms the two norms differ by the rounding of (meta.csv
// clip_norm_terms, else every element).  by_shard: the norm of the rank's shard
// of that gradient instead (ddp-clip-local-norm, on a sharded trace).  A clip
// row without max_norm is a scaling a sharded recorder saw on .grad (no clip
// function called): the declared max_norm is its.
CertifyCheck clip_check(const ContractSection& c, const Scenario& s, int64_t n,
                        bool by_shard) {
  CertifyCheck ck{"clip", true, false, ""};
  // gamma_{n+2} = nu / (1 - nu) holds for nu < 1 only (Higham 3.1): past
  // 1/u terms the worst case bounds nothing (the formula turns negative),
  // and no factor's value can be told from another's.
  const double nu = double(n + 2) * error_model::kUnitRoundoff32;
  const double rel =
      nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
  double lo = 1, hi = 0;
  for (const auto& cl : c.clips) {
    lo = std::min(lo, cl.factor);
    hi = std::max(hi, cl.factor);
  }
  // clip_grad_norm_(max_norm = inf) only measures the norm (Transformers'
  // Trainer calls it so when max_grad_norm is 0): its factor is exactly
  // 1, the gradient unchanged, so a loop that accepts no clip holds.
  const bool only_measures =
      !c.clips.empty() &&
      std::all_of(c.clips.begin(), c.clips.end(), [](const ContractClip& cl) {
        return std::isinf(cl.max_norm) && cl.max_norm > 0 && cl.factor == 1.0;
      });
  if (!s.clip.enabled && only_measures) {
    ck.message = fmt::format(
        "{} clip_grad_norm_ calls with max_norm inf: factor 1 each, the "
        "gradient unchanged (no clip, as accepted)",
        c.clips.size());
    return ck;
  }
  if (!s.clip.enabled) {
    ck.ok = false;
    ck.message = fmt::format(
        "the trainer called clip_grad_norm_ {} times (max_norm {:.6g}, factors "
        "{:.6g} to "
        "{:.6g}); the accepted loop does not clip (declare "
        "ContractRecorder(clip=...))",
        c.clips.size(), c.clips.front().max_norm, lo, hi);
    return ck;
  }
  std::map<std::pair<int64_t, int64_t>, int64_t> per;  // (rank, version)
  for (const auto& cl : c.clips) ++per[{cl.rank, cl.version}];
  for (int64_t r = 0; r < c.ranks() && ck.ok; ++r)
    for (size_t t = 0; t < c.steps[size_t(r)].size() && ck.ok; ++t)
      if (per[{r, int64_t(t)}] != 1) {
        ck.ok = false;
        ck.message = fmt::format(
            "{}step {}: {} clip_grad_norm_ calls, the accepted loop clips "
            "once before each optimizer step",
            c.ranks() > 1 ? fmt::format("rank {} ", r) : std::string(), t,
            per[{r, int64_t(t)}]);
      }
  const auto want_of = [&](const ContractClip& cl, bool shard) {
    return std::min(
        1.0, s.clip.max_norm / ((shard ? cl.shard_norm : cl.norm) + 1e-6));
  };
  const auto max_of = [&](const ContractClip& cl) {
    return std::isnan(cl.max_norm) ? s.clip.max_norm : cl.max_norm;
  };
  bool seen_on_grad = false, sharded = false;
  for (const auto& cl : c.clips) {
    seen_on_grad = seen_on_grad || std::isnan(cl.max_norm);
    sharded = sharded || !std::isnan(cl.shard_norm);
  }
  for (size_t m = 0; m < c.clips.size() && ck.ok; ++m) {
    const ContractClip& cl = c.clips[m];
    const double want = want_of(cl, by_shard);
    if (max_of(cl) != s.clip.max_norm ||
        !(std::abs(cl.factor - want) <= rel * want)) {
      ck.ok = false;
      ck.message = fmt::format(
          "clip {} (step {}{}): factor {:.9g} {}; the declared max_norm "
          "{:.6g} on {} norm {:.9g} gives {:.9g}",
          m, cl.version,
          c.ranks() > 1 ? fmt::format(", rank {}", cl.rank) : std::string(),
          cl.factor,
          std::isnan(cl.max_norm)
              ? std::string("(a scaling of .grad, no clip function)")
              : fmt::format("with max_norm {:.6g}", cl.max_norm),
          s.clip.max_norm,
          by_shard  ? "its rank's shard's"
          : sharded ? "the whole gradient's"
                    : "the gradient's",
          by_shard ? cl.shard_norm : cl.norm, want);
      if (sharded && !by_shard) {
        // Each rank's factor at that step against the whole gradient's
        // and its own shard's.
        std::string per;
        for (const auto& o : c.clips)
          if (o.version == cl.version)
            per += fmt::format(
                "{}rank {} applied {:.6g}: the whole gradient's norm {:.6g} "
                "gives {:.6g}, its shard's norm {:.6g} gives {:.6g}",
                per.empty() ? "" : "; ", o.rank, o.factor, o.norm,
                want_of(o, false), o.shard_norm, want_of(o, true));
        ck.message += fmt::format(" (step {}: {})", cl.version, per);
      }
    }
  }
  if (ck.ok)
    ck.message =
        fmt::format(
            "{} {}, one before each step, max_norm {:.6g}: factors {:.6g} to "
            "{:.6g}, each clip_grad_norm_'s formula on {} (within {:.2g})",
            c.clips.size(),
            seen_on_grad ? "clips (scalings of .grad the recorder saw included)"
                         : "clip_grad_norm_ calls",
            s.clip.max_norm, lo, hi,
            by_shard  ? "its rank's shard's norm"
            : sharded ? "the whole gradient's norm (every rank's shard)"
                      : "the gradient it saw",
            rel) +
        (std::isinf(rel)
             ? fmt::format(" (the norms differ by the rounding of {} terms, "
                           "past 1/u: the factors' values are not judged)",
                           n)
             : std::string());
  return ck;
}

ClipCalls clip_calls(const ContractSection& c) {
  ClipCalls out;
  for (const ContractClip& cl : c.clips) ++out[{cl.rank, cl.version}];
  return out;
}

std::string clip_calls_differ(const ClipCalls& trace, const ClipCalls& pred,
                              int64_t ranks) {
  if (pred == trace) return "";
  const auto n_at = [](const auto& m, const auto& k) {
    const auto it = m.find(k);
    return it == m.end() ? int64_t(0) : it->second;
  };
  std::set<std::pair<int64_t, int64_t>> at;
  for (const auto& [k, n] : pred) at.insert(k);
  for (const auto& [k, n] : trace) at.insert(k);
  for (const auto& k : at)
    if (n_at(pred, k) != n_at(trace, k))
      return fmt::format(
          "clip: {}step {}: {} clip_grad_norm_ call(s), predicted {}",
          ranks > 1 ? fmt::format("rank {} ", k.first) : std::string(),
          k.second, n_at(trace, k), n_at(pred, k));
  return "";
}

}  // namespace accumcheck::contract_detail
