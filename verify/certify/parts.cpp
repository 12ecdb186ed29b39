// Certification in parts and their merge (verify/certify/parts.hpp).
#include "verify/certify/parts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "sim/errors.hpp"

namespace accumcheck {

namespace {

constexpr std::string_view kSchema = "accumcheck-certify-part/3";

std::string esc(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '\\')
      o.append("\\\\");
    else if (c == '\t')
      o.append("\\t");
    else if (c == '\n')
      o.append("\\n");
    else
      o.push_back(c);
  }
  return o;
}

std::string unesc(std::string_view s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      o.push_back(s[i]);
      continue;
    }
    const char n = s[++i];
    o.push_back(n == 't' ? '\t' : n == 'n' ? '\n' : n);
  }
  return o;
}

std::string num(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt::format("{:.17g}", x);
}

std::string join(const std::vector<std::string>& v) {
  std::string o;
  for (size_t i = 0; i < v.size(); ++i) o.append(i ? "|" : "").append(v[i]);
  return o;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> o;
  if (s.empty()) return o;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      o.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  o.push_back(cur);
  return o;
}

struct PartInfo {
  std::string scenario_digest, bound_arith;
  StepRange range;
  double worst = 0;
  int64_t first_out = -1;
};

// One part file, read.
struct Part {
  std::string file;
  std::map<std::string, std::string> kv;
  std::map<std::string, int> line_of;
  CertifyReport r;
  PartInfo info;
};

[[noreturn]] void bad(const std::string& file, int line,
                      const std::string& what) {
  throw InputError(file, line, 0, "", what);
}

int64_t to_int(const Part& p, const std::string& key) {
  auto it = p.kv.find(key);
  if (it == p.kv.end()) bad(p.file, 1, "missing key '" + key + "'");
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end)
    bad(p.file, p.line_of.at(key),
        fmt::format("{}: expected an integer, got '{}'", key, it->second));
  return v;
}

double to_num(const Part& p, const std::string& key, const std::string& text,
              int line) {
  if (text == "inf") return INFINITY;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end)
    bad(p.file, line,
        fmt::format("{}: expected a number, got '{}'", key, text));
  return v;
}

const std::string& str(const Part& p, const std::string& key) {
  auto it = p.kv.find(key);
  if (it == p.kv.end()) bad(p.file, 1, "missing key '" + key + "'");
  return it->second;
}

Part read_part(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(file, 0, 0, "", "cannot read the part file");
  Part p;
  p.file = file;
  std::string line;
  int n = 0;
  auto fields_of = [](const std::string& l) {
    std::vector<std::string> f = split(l, '\t');
    for (std::string& x : f) x = unesc(x);
    return f;
  };
  while (std::getline(in, line)) {
    ++n;
    if (n == 1) {
      if (line != kSchema)
        bad(file, 1,
            fmt::format("not a certify part file (expected '{}')", kSchema));
      continue;
    }
    const std::vector<std::string> f = fields_of(line);
    if (f.empty()) continue;
    if (f[0] == "check") {
      if (f.size() != 4) bad(file, n, "check: expected 3 fields");
      CertifyCheck c;
      c.name = f[1];
      c.ok = f[2] == "1";
      c.message = f[3];
      c.separate = c.name == "logged loss";  // verify/state_check's own check
      p.r.checks.push_back(c);
    } else if (f[0] == "performance") {  // the check above's finding
      if (f.size() != 2 || p.r.checks.empty())
        bad(file, n, "performance: expected one field, after a check");
      p.r.checks.back().performance = f[1];
    } else if (f[0] == "note") {
      if (f.size() != 2) bad(file, n, "note: expected one field");
      p.r.notes.push_back(f[1]);
    } else if (f[0] == "candidate") {
      if (f.size() != 12) bad(file, n, "candidate: expected 11 fields");
      CertifyCandidate c;
      c.name = f[1];
      c.aliases = split(f[2], '|');
      c.inert = split(f[3], '|');
      c.steps = std::strtoll(f[4].c_str(), nullptr, 10);
      c.proxy = to_num(p, "candidate proxy", f[5], n);
      c.tracked = f[6] == "1";
      c.distance = to_num(p, "candidate distance", f[7], n);
      c.first_out = std::strtoll(f[8].c_str(), nullptr, 10);
      c.first_out_what = f[9];
      c.pattern_matches = f[10] == "1";
      // f[11]: the pitfall ids (names suffice for the report).
      p.r.ranking.push_back(c);
    } else {
      if (f.size() != 2) bad(file, n, f[0] + ": expected one value");
      p.kv[f[0]] = f[1];
      p.line_of[f[0]] = n;
    }
  }
  if (n == 0) bad(file, 1, "empty part file");
  CertifyReport& r = p.r;
  r.scenario = str(p, "scenario");
  r.run = str(p, "run");
  r.engine = str(p, "engine");
  r.precision = str(p, "precision");
  r.accepted = str(p, "accepted");
  r.trace_steps = to_int(p, "trace_steps");
  r.expected_steps = to_int(p, "expected_steps");
  r.pass = str(p, "pass") == "1";
  r.pattern_checked = str(p, "pattern_checked") == "1";
  r.pattern_ok = str(p, "pattern_ok") == "1";
  r.pattern_message = str(p, "pattern_message");
  r.verdict = str(p, "verdict");
  r.diagnosis = str(p, "diagnosis");
  r.seconds = to_num(p, "seconds", str(p, "seconds"), p.line_of["seconds"]);
  p.info.scenario_digest = str(p, "scenario_digest");
  p.info.bound_arith = str(p, "bound_arith");
  p.info.range.begin = to_int(p, "range_begin");
  p.info.range.end = to_int(p, "range_end");
  p.info.worst = to_num(p, "worst", str(p, "worst"), p.line_of["worst"]);
  p.info.first_out = to_int(p, "first_out");
  r.moment_steps = to_int(p, "moment_steps");
  r.moment_worst = to_num(p, "moment_worst", str(p, "moment_worst"),
                          p.line_of["moment_worst"]);
  for (const std::string& t : split(str(p, "unforced_steps"), '|')) {
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || *end || v < 0)
      bad(p.file, p.line_of.at("unforced_steps"),
          fmt::format("unforced_steps: expected steps separated by '|', got "
                      "'{}'",
                      str(p, "unforced_steps")));
    r.unforced_steps.push_back(v);
  }
  r.autocast = str(p, "autocast");
  r.grad_scale =
      to_num(p, "grad_scale", str(p, "grad_scale"), p.line_of["grad_scale"]);
  r.grad_worst =
      to_num(p, "grad_worst", str(p, "grad_worst"), p.line_of["grad_worst"]);
  return p;
}

bool is_step_check(const CertifyCheck& c) {
  return c.name.rfind("step ", 0) == 0 && c.name != "step count";
}

}  // namespace

StepRange parse_step_range(const std::string& text, const std::string& what) {
  const size_t colon = text.find(':');
  auto bad_range = [&] {
    return InputError("", 0, 0, what,
                      fmt::format("expected A:B (optimizer steps A..B-1, A: or "
                                  ":B open-ended, 0 <= A <= B), got '{}'",
                                  text));
  };
  if (colon == std::string::npos) throw bad_range();
  auto parse = [&](const std::string& s, int64_t dflt) -> int64_t {
    if (s.empty()) return dflt;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (*end || v < 0) throw bad_range();
    return v;
  };
  StepRange r;
  r.begin = parse(text.substr(0, colon), 0);
  r.end = parse(text.substr(colon + 1), -1);
  if (r.end >= 0 && r.end < r.begin) throw bad_range();
  return r;
}

std::string certify_part_text(const CertifyReport& r,
                              const std::string& scenario_digest,
                              const std::string& bound_arith) {
  std::string o(kSchema);
  o.append("\n");
  auto kv = [&](std::string_view k, const std::string& v) {
    o.append(k).append("\t").append(esc(v)).append("\n");
  };
  kv("scenario", r.scenario);
  kv("scenario_digest", scenario_digest);
  kv("run", r.run);
  kv("engine", r.engine);
  kv("precision", r.precision);
  kv("bound_arith", bound_arith);
  kv("accepted", r.accepted);
  kv("trace_steps", std::to_string(r.trace_steps));
  kv("expected_steps", std::to_string(r.expected_steps));
  kv("range_begin", std::to_string(r.steps.begin));
  kv("range_end", std::to_string(r.steps.end));
  kv("pass", r.pass ? "1" : "0");
  kv("worst", num(r.max_ratio));
  kv("moment_steps", std::to_string(r.moment_steps));
  kv("moment_worst", num(r.moment_worst));
  {
    std::vector<std::string> u;
    for (int64_t t : r.unforced_steps) u.push_back(std::to_string(t));
    kv("unforced_steps", join(u));
  }
  kv("autocast", r.autocast);
  kv("grad_scale", num(r.grad_scale));
  kv("grad_worst", num(r.grad_worst));
  kv("first_out", std::to_string(r.first_out));
  kv("pattern_checked", r.pattern_checked ? "1" : "0");
  kv("pattern_ok", r.pattern_ok ? "1" : "0");
  kv("pattern_message", r.pattern_message);
  kv("verdict", r.verdict);
  kv("diagnosis", r.diagnosis);
  kv("seconds", num(r.seconds));
  for (const CertifyCheck& c : r.checks) {
    o.append(fmt::format("check\t{}\t{}\t{}\n", esc(c.name), c.ok ? 1 : 0,
                         esc(c.message)));
    if (!c.performance.empty())
      o.append("performance\t" + esc(c.performance) + "\n");
  }
  for (const std::string& n : r.notes) o.append("note\t" + esc(n) + "\n");
  for (const CertifyCandidate& c : r.ranking) {
    std::vector<std::string> ids;
    for (Pitfall x : c.pitfalls) ids.emplace_back(pitfall_id(x));
    o.append(fmt::format(
        "candidate\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n", esc(c.name),
        esc(join(c.aliases)), esc(join(c.inert)), c.steps, num(c.proxy),
        c.tracked ? 1 : 0, num(c.distance), c.first_out, esc(c.first_out_what),
        c.pattern_matches ? 1 : 0, esc(join(ids))));
  }
  return o;
}

CertifyReport certify_merge(const std::vector<std::string>& files) {
  if (files.empty())
    throw InputError("", 0, 0, "certify-merge", "no part files");
  std::vector<Part> parts;
  for (const std::string& f : files) parts.push_back(read_part(f));
  std::stable_sort(parts.begin(), parts.end(),
                   [](const Part& a, const Part& b) {
                     return a.info.range.begin < b.info.range.begin;
                   });
  const Part& first = parts.front();
  for (const Part& p : parts)
    for (const char* key :
         {"scenario", "scenario_digest", "run", "precision", "bound_arith",
          "accepted", "trace_steps", "expected_steps", "pattern_checked",
          "pattern_ok", "pattern_message"})
      if (str(p, key) != str(first, key))
        bad(p.file, p.line_of.at(key),
            fmt::format("{} '{}' differs from {}'s '{}': the parts are not of "
                        "one certification",
                        key, str(p, key), first.file, str(first, key)));
  // Cover 0..n-1 exactly once (an empty trace: one part 0:0).
  int64_t next = 0;
  for (const Part& p : parts) {
    if (p.info.range.begin != next)
      bad(p.file, p.line_of.at("range_begin"),
          fmt::format("steps {}:{} {} (the parts must cover steps 0:{} exactly "
                      "once, in any order)",
                      p.info.range.begin, p.info.range.end,
                      p.info.range.begin > next
                          ? fmt::format("leave steps {}:{} unjudged", next,
                                        p.info.range.begin)
                          : std::string("overlap another part"),
                      first.r.trace_steps));
    next = p.info.range.end;
  }
  if (next != first.r.trace_steps)
    bad(parts.back().file, parts.back().line_of.at("range_end"),
        fmt::format("the parts end at step {}, the trace has {} optimizer "
                    "steps",
                    next, first.r.trace_steps));

  CertifyReport m = first.r;
  m.checks.clear();
  m.ranking.clear();
  m.seconds = 0;
  double worst = 0;
  for (const Part& p : parts) {
    m.seconds += p.r.seconds;
    worst = std::max(worst, p.info.worst);
  }
  // The notes of one certify over every step: the first part's, with
  // those on judged steps (Adam's moments, clips no recorded norm forced,
  // the autocast bound's use) over every part's steps, each where the
  // first part has it, else first (where judge_accepted puts the first
  // two; the third is there whenever the trace is bf16/fp16).
  m.moment_steps = 0;
  m.moment_worst = 0;
  m.unforced_steps.clear();
  for (const Part& p : parts) {
    m.moment_steps += p.r.moment_steps;
    m.moment_worst = std::max(m.moment_worst, p.r.moment_worst);
    m.unforced_steps.insert(m.unforced_steps.end(), p.r.unforced_steps.begin(),
                            p.r.unforced_steps.end());
    m.grad_worst = std::max(m.grad_worst, p.r.grad_worst);
  }
  size_t front = 0;
  for (auto note :
       {certify_moments_note, certify_unforced_note, certify_precision_note}) {
    const std::string own = note(first.r), merged = note(m);
    const auto at = own.empty()
                        ? m.notes.end()
                        : std::find(m.notes.begin(), m.notes.end(), own);
    if (at != m.notes.end())
      *at = merged;
    else if (!merged.empty())
      m.notes.insert(m.notes.begin() + long(front++), merged);
  }
  // Checks in one certify's order: the whole-trace ones of the first part
  // around every part's step checks.
  for (const CertifyCheck& c : first.r.checks)
    if (c.name == "step count") m.checks.push_back(c);
  for (const Part& p : parts)
    for (const CertifyCheck& c : p.r.checks)
      if (is_step_check(c)) m.checks.push_back(c);
  for (const CertifyCheck& c : first.r.checks)
    if (!is_step_check(c) && c.name != "step count") m.checks.push_back(c);
  m.pass =
      std::all_of(m.checks.begin(), m.checks.end(),
                  [](const CertifyCheck& c) { return c.ok || c.separate; });
  m.steps = StepRange{0, m.trace_steps};
  m.max_ratio = worst;
  m.first_out = -1;
  for (const Part& p : parts)
    if (p.info.first_out >= 0) {
      m.first_out = p.info.first_out;
      break;
    }
  if (m.pass) {
    m.verdict = certify_pass_verdict(m, worst);
    if (!m.pattern_checked) m.verdict.append("; " + m.pattern_message);
    m.diagnosis.clear();
    return m;
  }
  // The verdict of one certify: a step count mismatch first (every part
  // has it), then the first step outside the bound, then the first part
  // that fails otherwise (a step's moments outside the bound with the
  // gradients and parameters within it; the call pattern, every part's).
  const Part* why = &first;
  const bool count_ok = first.r.trace_steps == first.r.expected_steps;
  if (count_ok) {
    const Part *out = nullptr, *failed = nullptr;
    for (const Part& p : parts) {
      if (!out && p.info.first_out >= 0) out = &p;
      if (!failed && !p.r.pass) failed = &p;
    }
    why = out ? out : failed ? failed : &first;
  }
  m.verdict = why->r.verdict;
  m.ranking = why->r.ranking;
  m.diagnosis = why->r.diagnosis;
  if (parts.size() > 1 && !m.diagnosis.empty() && !m.ranking.empty())
    m.diagnosis = fmt::format("(ranked over steps {}:{}, the part of {})\n{}",
                              why->info.range.begin, why->info.range.end,
                              why->file, m.diagnosis);
  return m;
}

}  // namespace accumcheck
