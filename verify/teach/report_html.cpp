// `accumcheck report`: the HTML page (verify/teach/report.hpp).
//
// One self-contained file: the data as a JSON literal, uPlot's minified
// JavaScript and CSS inlined (generated/verify/teach/report_assets.hpp), and a
// small script that draws the charts and then writes a self-test into the
// page (<pre id="selftest">: every chart's series and axis labels, the
// legend rows it rendered, and any script error) so a headless browser's
// DOM dump can be checked (tests/report_chromium.py).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

#include "verify/certify/markup.hpp"
#include "verify/teach/explain.hpp"
#include "verify/teach/report.hpp"
#include "verify/teach/report_assets.hpp"

namespace accumcheck {

namespace {

// A JSON string literal that is also safe inside <script> ("</" escaped).
std::string json_str(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (c == '\n')
      o += "\\n";
    else if (c == '/')
      o += "\\/";
    else if (static_cast<unsigned char>(c) < 0x20)
      o += fmt::format("\\u{:04x}", int(c));
    else
      o += c;
  }
  return o + "\"";
}

std::string json_num(double v) {
  return std::isfinite(v) ? fmt::format("{:.17g}", v) : "null";
}

std::string json_nums(const std::vector<double>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + json_num(v[i]);
  return o + "]";
}

// The catalog ids a FAIL's diagnosis names as what the run behaves like:
// "matches X", "matches, tied (...): X (...) | Y", "matches X (weights,
// ...) and Y (lr)"; none for "no modelled pitfall".
std::vector<std::string> named_in_diagnosis(std::string_view d) {
  d = d.substr(0, d.find('\n'));
  if (d.starts_with("diagnosis: ")) d.remove_prefix(11);
  std::vector<std::string> out;
  const auto id_at = [&](size_t at) {
    size_t e = at;
    while (e < d.size() && d[e] != ' ' && d[e] != ',' && d[e] != ')') ++e;
    return std::string(d.substr(at, e - at));
  };
  if (d.starts_with("matches, tied")) {
    const size_t colon = d.find(": ");
    if (colon != std::string_view::npos) out.push_back(id_at(colon + 2));
  } else if (d.starts_with("matches ")) {
    out.push_back(id_at(8));
    const size_t and_at = d.find(") and ");
    if (d.find("(weights, ") != std::string_view::npos &&
        and_at != std::string_view::npos &&
        d.substr(and_at + 6).starts_with("no modelled") == false)
      out.push_back(id_at(and_at + 6));
  }
  return out;
}

// What a FAIL behaves like, each id (a pitfall or a combination) with its
// parts' explain entries: the text `accumcheck explain ID` gives.
std::string behaves_json(const CertifyReport& r) {
  std::string o = "[";
  if (r.pass) return o + "]";
  bool first = true;
  for (const std::string& id : named_in_diagnosis(r.diagnosis)) {
    std::string unknown;
    const std::vector<const ExplainEntry*> parts =
        find_explain_parts(id, unknown);
    if (parts.empty()) continue;
    o += std::string(first ? "" : ",") + "{\"id\":" + json_str(id) +
         ",\"parts\":[";
    first = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      const ExplainEntry& e = *parts[i];
      o += fmt::format(
          "{}{{\"id\":{},\"title\":{},\"story\":{},\"diff\":{},"
          "\"formula\":{}}}",
          i ? "," : "", json_str(e.id), json_str(e.title), json_str(e.story),
          json_str(e.diff), json_str(e.formula));
    }
    o += "]}";
  }
  return o + "]";
}

std::string certify_json(const CertifyReport& r) {
  std::string o = "{";
  o += "\"verdict\":" + json_str(r.verdict);
  o += ",\"behaves_like\":" + behaves_json(r);
  // The checks of the whole trace (a step's own checks are the heat strip).
  o += ",\"checks\":[";
  bool any = false;
  for (const CertifyCheck& c : r.checks) {
    if (c.step >= 0) continue;
    o += fmt::format("{}{{\"name\":{},\"ok\":{},\"message\":{}}}",
                     any ? "," : "", json_str(c.name), c.ok ? "true" : "false",
                     json_str(c.message));
    any = true;
  }
  o += "]";
  std::string notes;
  for (const std::string& n : r.notes) notes += (notes.empty() ? "" : "\n") + n;
  o += ",\"notes\":" + json_str(notes);
  o += fmt::format(",\"pass\":{}", r.pass ? "true" : "false");
  o += ",\"accepted\":" + json_str(r.accepted);
  o += ",\"diagnosis\":" + json_str(r.diagnosis);
  const CertifyCheck* first = nullptr;
  for (const CertifyCheck& c : r.checks)
    if (!c.ok && !first) first = &c;
  o += ",\"first_fail\":";
  o += first ? "{\"name\":" + json_str(first->name) +
                   ",\"message\":" + json_str(first->message) + "}"
             : "null";
  o += ",\"ranking\":[";
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const CertifyCandidate& c = r.ranking[i];
    o += fmt::format(
        "{}{{\"name\":{},\"distance\":{},\"tracked\":{},\"first_out\":{},"
        "\"first_out_what\":{},\"pattern\":{}}}",
        i ? "," : "", json_str(c.name),
        json_num(c.tracked ? c.distance : c.proxy),
        c.tracked ? "true" : "false", c.first_out, json_str(c.first_out_what),
        c.pattern_matches ? "true" : "false");
  }
  // The heat strip: rows (kind, tensor), columns optimizer steps.
  std::vector<std::string> rows;
  std::vector<std::vector<double>> cells;
  int64_t steps = 0;
  for (const CertifyCheck& c : r.checks) steps = std::max(steps, c.step + 1);
  for (const CertifyCheck& c : r.checks) {
    if (c.step < 0) continue;
    for (const auto& [tensor, ratio] : c.tensor_ratio) {
      const std::string row = c.kind + " " + tensor;
      size_t k = 0;
      while (k < rows.size() && rows[k] != row) ++k;
      if (k == rows.size()) {
        rows.push_back(row);
        cells.emplace_back(size_t(steps), kNaN);
      }
      cells[k][size_t(c.step)] = ratio;
    }
  }
  o += "],\"heat\":{\"steps\":" + std::to_string(steps) + ",\"rows\":[";
  for (size_t k = 0; k < rows.size(); ++k)
    o += (k ? "," : "") + std::string("{\"label\":") + json_str(rows[k]) +
         ",\"cells\":" + json_nums(cells[k]) + "}";
  return o + "]}}";
}

std::string data_json(const ReportData& d) {
  std::string o = "{\"scenario\":" + json_str(d.scenario);
  o += ",\"windows\":" + std::to_string(d.windows) + ",\"runs\":[";
  for (size_t i = 0; i < d.runs.size(); ++i) {
    const ReportRun& r = d.runs[i];
    o += (i ? "," : "") + std::string("{\"name\":") + json_str(r.name) +
         ",\"loss\":" + json_nums(r.window_loss) +
         ",\"dist\":" + json_nums(r.window_dist) +
         ",\"lr\":" + json_nums(r.step_lr) +
         ",\"gnorm\":" + json_nums(r.step_grad_norm) + "}";
  }
  o += "],\"certify\":" + (d.certify ? certify_json(*d.certify) : "null");
  o += ",\"contract\":";
  if (!d.contract) return o + "null}";
  const ReportContract& c = *d.contract;
  o += fmt::format("{{\"K\":{},\"ranks\":{},\"micro\":{},\"steps\":[",
                   c.accumulation, c.ranks, c.micro_batches);
  for (size_t t = 0; t < c.steps.size(); ++t) {
    const ReportContractStep& st = c.steps[t];
    std::string micro = "[";
    for (size_t i = 0; i < st.micro.size(); ++i)
      micro += (i ? "," : "") + std::to_string(st.micro[i]);
    o += fmt::format(
        "{}{{\"lr\":{},\"items\":{},\"micro\":{}],\"w\":{},"
        "\"clip\":{}}}",
        t ? "," : "", json_num(st.lr), st.items, micro, json_nums(st.weight_n),
        json_nums(st.clip));
  }
  return o + "]}}";
}

std::string explain_html(const ReportData& d) {
  // A certify FAIL's own section explains what the run behaves like: the
  // scenario's pitfall is not repeated above it.
  const std::vector<std::string> named =
      d.certify && !d.certify->pass ? named_in_diagnosis(d.certify->diagnosis)
                                    : std::vector<std::string>{};
  std::string o;
  for (const std::string& id : d.pitfalls) {
    const ExplainEntry* e = find_explain(id);
    if (!e || std::find(named.begin(), named.end(), id) != named.end())
      continue;
    o += fmt::format(
        "<section class=\"explain\"><h2>{}: {}</h2><p>{}</p>"
        "<pre class=\"diff\">{}</pre><p><b>The oracle predicts:</b> {}</p>"
        "<p class=\"small\">Field reports: {}. Guarded by: {}. More: "
        "<code>accumcheck explain {}</code>.</p></section>\n",
        xml_escape(e->id), xml_escape(e->title), xml_escape(e->story),
        xml_escape(e->diff), xml_escape(e->formula), xml_escape(e->field),
        xml_escape(e->properties), xml_escape(e->id));
  }
  return o;
}

// The page's own script: charts, certify tables, self-test.
constexpr const char* kPageScript = R"js(
"use strict";
const ERRORS = [];
window.addEventListener("error", e => ERRORS.push(String(e.message)));
const COLORS = {reference: "#222222", correct: "#1b9e44", accepted: "#2c6fbb"};
const TRAINER_COLORS = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b"];
function color(name, i) { return COLORS[name] || TRAINER_COLORS[i % TRAINER_COLORS.length]; }
const CHARTS = [];
function chart(id, title, xlabel, ylabel, n, series, log) {
  const box = document.getElementById(id);
  const xs = Array.from({length: n}, (_, i) => i);
  // On the log scale an exact 0 (a run identical to the reference in
  // double precision) is drawn at FLOOR and said so below the chart.
  const FLOOR = 1e-17;
  let floored = [];
  if (log) series = series.map(s => {
    if (!s.values.some(v => v === 0)) return s;
    floored.push(s.label);
    return Object.assign({}, s, {values: s.values.map(v => v === 0 ? FLOOR : v)});
  });
  const kept = series.filter(s => s.values.some(v => v !== null && (!log || v > 0)));
  if (kept.length === 0 || n === 0) {
    box.textContent = title + ": nothing to plot in this trace.";
    CHARTS.push({id, title, series: [], axes: [xlabel, ylabel], legend: [], points: 0});
    return;
  }
  const data = [xs].concat(kept.map(s => xs.map(i => {
    const v = i < s.values.length ? s.values[i] : null;
    return v === null || (log && !(v > 0)) ? null : v;
  })));
  const opts = {
    title, width: Math.min(1100, window.innerWidth - 40), height: 280,
    scales: {x: {time: false}, y: log ? {distr: 3} : {}},
    axes: [{label: xlabel}, log ? {label: ylabel, size: 70, values: (u, splits) =>
      // uPlot passes null for the ticks it leaves unlabelled.
      splits.map(v => v == null ? null : "1e" + Math.round(Math.log10(v)))} : {label: ylabel, size: 70}],
    series: [{label: xlabel}].concat(kept.map(s => ({
      label: s.label, stroke: s.color, width: s.width || 2,
      dash: s.dash, points: {show: n <= 60}}))),
  };
  const u = new uPlot(opts, data, box);
  if (floored.length) {
    const note = document.createElement("p");
    note.className = "small";
    note.textContent = `${floored.join(", ")}: a distance of exactly 0 in double precision (the same parameters as the large batch) is drawn at ${FLOOR}.`;
    box.appendChild(note);
  }
  const legend = Array.from(box.querySelectorAll(".u-legend .u-series .u-label"))
      .map(el => el.textContent);
  CHARTS.push({id, title, series: kept.map(s => s.label),
               axes: u.axes.map(a => a.label), legend,
               points: data.slice(1).map(col => col.filter(v => v !== null).length)});
}
function runSeries(key) {
  let t = 0;
  return DATA.runs.map(r => {
    const trainer = !COLORS[r.name];
    const s = {label: r.name, values: r[key], color: color(r.name, trainer ? t++ : 0)};
    if (r.name === "correct") { s.dash = [6, 4]; s.width = 3; }
    return s;
  });
}
function longest(key) { return Math.max(0, ...DATA.runs.map(r => r[key].length)); }
function cell(v) { return v === null ? "-" : (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e4 ? v.toExponential(3) : v.toPrecision(4)); }
function heat(v) {
  if (v === null) return "#eeeeee";
  if (v <= 1) { const t = Math.max(0, Math.min(1, (Math.log10(Math.max(v, 1e-3)) + 3) / 3));
    return `hsl(130, 55%, ${88 - 40 * t}%)`; }
  const t = Math.max(0, Math.min(1, Math.log10(v) / 8));
  return `hsl(0, 75%, ${70 - 40 * t}%)`;
}
const TOP = 5;  // candidates shown before the full list (collapsed)
function certifyTables() {
  const c = DATA.certify, box = document.getElementById("certify");
  if (!c) { box.remove(); return; }
  const h = [];
  const contract = !!DATA.contract;
  const unit = contract ? "of the uncertainty" : "of bound";
  h.push(`<h2>certify: <span class="${c.pass ? "pass" : "fail"}">${c.pass ? "PASS" : "FAIL"}</span></h2>`);
  h.push(`<p id="verdict">${esc(c.verdict).replace(/\n/g, "<br>")}</p>`);
  // What the run behaves like first: each pitfall's story and fix, the
  // text of `accumcheck explain`.
  if (c.behaves_like.length) {
    h.push(`<section id="behaves"><h3>The run behaves like ${c.behaves_like.map(b => `<code>${esc(b.id)}</code>`).join(" and ")}</h3>`);
    for (const b of c.behaves_like) {
      if (b.parts.length > 1)
        h.push(`<p><code>${esc(b.id)}</code>: ${b.parts.length} pitfalls at once (certify ranks the combination as one candidate: the loop with each of these mistakes); fix each.</p>`);
      for (const p of b.parts)
        h.push(`<div class="explain"><h4>${esc(p.id)}: ${esc(p.title)}</h4><p>${esc(p.story)}</p>` +
               `<p><b>The fix</b>, the loop wrong (-) and right (+):</p><pre class="diff">${esc(p.diff)}</pre>` +
               `<p><b>What the oracle predicts:</b> ${esc(p.formula)}</p></div>`);
      h.push(`<p class="small">The same in a terminal: <code>accumcheck explain ${esc(b.id)}</code></p>`);
    }
    h.push(`</section>`);
  } else if (!c.pass) {
    h.push(`<section id="behaves"><h3>No modelled pitfall explains this run</h3><p>No catalog pitfall (or combination of them) stays within its bound; the evidence below is model-free.</p></section>`);
  }
  if (!c.pass) {
    h.push(`<h3>Evidence</h3>`);
    if (c.first_fail) h.push(`<p><b>First failing check</b> (${esc(c.first_fail.name)}): <span id="first-fail">${esc(c.first_fail.message)}</span></p>`);
    const lines = c.diagnosis.split("\n").map(l => l.replace(/^diagnosis: /, "")).filter(l => l);
    h.push(`<ul id="evidence">${lines.map((l, i) => `<li>${i === 0 ? "<b>diagnosis:</b> " : ""}${esc(l)}</li>`).join("")}</ul>`);
  }
  if (c.checks.length) {
    h.push(`<h3>Checks</h3><ul id="checks">${c.checks.map(k => `<li><span class="${k.ok ? "pass" : "fail"}">${k.ok ? "ok" : "FAIL"}</span> ${esc(k.name)}: ${esc(k.message)}</li>`).join("")}</ul>`);
  }
  if (c.notes) h.push(`<p class="small">${esc(c.notes).replace(/\n/g, "<br>")}</p>`);
  if (c.heat.rows.length) {
    h.push(`<h3>Error / bound per optimizer step and tensor</h3><p class="small">green: inside the bound (darker: closer to it); red: outside (darker: further, log scale up to 1e8); grey: not judged.</p>`);
    h.push(`<table id="heat" class="heat"><tr><th>step</th>${Array.from({length: c.heat.steps}, (_, i) => `<th>${i}</th>`).join("")}</tr>`);
    for (const row of c.heat.rows)
      h.push(`<tr><th>${esc(row.label)}</th>${row.cells.map((v, i) => `<td style="background:${heat(v)}" title="step ${i}: ${cell(v)} of bound"></td>`).join("")}</tr>`);
    h.push(`</table>`);
  }
  if (c.ranking.length) {
    const head = `<tr><th>#</th><th>semantics</th><th>distance (${unit})</th><th>${contract ? "where" : "first step out"}</th>${contract ? "" : "<th>call pattern</th>"}</tr>`;
    const row = (r, i) => `<tr><td>${i + 1}</td><td>${esc(r.name)}</td><td>${r.distance === null ? "inf" : cell(r.distance)}${r.tracked ? "" : " (proxy)"}${r.distance !== null && r.distance <= 1 ? "" : " (not matching)"}</td><td>${contract ? esc(r.first_out_what) : (r.first_out < 0 ? "-" : r.first_out + " " + esc(r.first_out_what))}</td>${contract ? "" : `<td>${r.pattern ? "matches" : ""}</td>`}</tr>`;
    h.push(`<h3>Closest candidates</h3><table id="ranking" class="rank">${head}${c.ranking.slice(0, TOP).map(row).join("")}</table>`);
    if (c.ranking.length > TOP)
      h.push(`<details id="ranking-all"><summary>all ${c.ranking.length} candidates</summary><table class="rank">${head}${c.ranking.map(row).join("")}</table></details>`);
  }
  box.innerHTML = h.join("\n");
}
function contractTables() {
  const k = DATA.contract, box = document.getElementById("contract");
  if (!k) { box.remove(); return; }
  const h = [`<h3>Per optimizer step (rank 0)</h3><p class="small">The micro-batches each step holds, each with its measured weight × N (N: the items of the micro-batches the step holds; 1 each under correct accumulation), the step's lr and its clip factors. K = ${k.K}, ${k.ranks} rank(s), ${k.micro} micro-batches drawn.</p>`];
  h.push(`<table id="contract-steps" class="rank"><tr><th>step</th><th>lr</th><th>clip factors</th><th>items N</th><th>micro-batch: weight × N</th></tr>`);
  k.steps.forEach((st, t) => h.push(`<tr><td>${t}</td><td>${cell(st.lr)}</td><td>${st.clip.length ? st.clip.map(cell).join(", ") : "-"}</td><td>${st.items}</td><td>${st.micro.map((j, i) => `${j}: ${cell(st.w[i])}`).join("; ")}</td></tr>`));
  h.push(`</table>`);
  box.innerHTML = h.join("\n");
}
function esc(s) { return String(s).replace(/[&<>"]/g, ch => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[ch])); }
try {
  if (DATA.contract) {
    const k = DATA.contract;
    chart("lr", "Learning rate per optimizer step", "optimizer step", "lr", k.steps.length,
          [{label: "trainer", values: k.steps.map(s => s.lr), color: TRAINER_COLORS[0]}], false);
    // Fitted weights read to 6 digits: a float32 fit's last digits would
    // give uPlot a y range of 1e-7 around 1 to split.
    const w = Array.from({length: k.micro}, () => null);
    k.steps.forEach(s => s.micro.forEach((j, i) => { if (j < w.length) w[j] = Number(s.w[i].toPrecision(6)); }));
    chart("weights", "Each micro-batch's weight × N in the step that holds it (1: correct accumulation)", "micro-batch",
          "weight × N", k.micro, [{label: "trainer", values: w, color: TRAINER_COLORS[0]}], false);
  } else {
    chart("loss", "Loss per window", "window", "mean loss", DATA.windows, runSeries("loss"), false);
    chart("dist", "Relative distance to the large batch |θ − θ_ref| / |θ_ref|", "window", "relative distance (log)", DATA.windows,
          runSeries("dist").filter(s => s.label !== "reference"), true);
    chart("lr", "Learning rate per optimizer step", "optimizer step", "lr", longest("lr"), runSeries("lr"), false);
    chart("gnorm", "Gradient norm per optimizer step", "optimizer step", "|G|", longest("gnorm"), runSeries("gnorm"), false);
  }
  certifyTables();
  contractTables();
} catch (e) { ERRORS.push(String(e && e.stack || e)); }
const rows = sel => Math.max(0, document.querySelectorAll(sel).length - 1);
const st = document.getElementById("selftest");
st.textContent = JSON.stringify({charts: CHARTS, errors: ERRORS,
  certify: DATA.certify ? {heat_rows: rows("#heat tr"),
                           ranking_rows: rows("#ranking tr"),
                           ranking_all_rows: rows("#ranking-all tr"),
                           first_fail: !!document.getElementById("first-fail"),
                           behaves: Array.from(document.querySelectorAll("#behaves h4")).map(e => e.textContent),
                           behaves_title: (document.querySelector("#behaves h3") || {}).textContent || "",
                           evidence_rows: document.querySelectorAll("#evidence li").length,
                           checks: document.querySelectorAll("#checks li").length,
                           // The order of the sections, as the page shows them.
                           order: Array.from(document.querySelectorAll("#certify > h2, #certify > h3, #certify > section > h3"))
                             .map(e => e.textContent)} : null,
  contract: DATA.contract ? {step_rows: rows("#contract-steps tr")} : null});
)js";

constexpr const char* kPageCss = R"css(
body { font-family: system-ui, sans-serif; margin: 20px; max-width: 1140px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; } h3 { font-size: 1em; }
.settings { font-family: monospace; background: #f4f4f4; padding: 6px 10px; }
.small { font-size: 0.85em; color: #555; }
#certify pre { white-space: pre-wrap; font-size: 0.85em; }
#evidence li, #checks li { margin: 2px 0; }
details summary { cursor: pointer; margin: 6px 0; }
pre.diff { background: #f8f8f8; padding: 6px 10px; border-left: 3px solid #ccc; }
.explain { border: 1px solid #ddd; padding: 4px 14px; margin: 10px 0; border-radius: 4px; }
.chart { margin: 18px 0; }
.pass { color: #1b9e44; } .fail { color: #d62728; }
table.heat { border-collapse: collapse; font-size: 10px; }
table.heat td { width: 9px; height: 14px; border: 1px solid #fff; padding: 0; }
table.heat th { font-weight: normal; text-align: right; padding-right: 4px; white-space: nowrap; }
table.rank { border-collapse: collapse; font-size: 0.9em; }
table.rank td, table.rank th { border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; }
#selftest { display: none; }
)css";

}  // namespace

std::string report_html(const ReportData& d) {
  std::string o;
  o += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  o += "<title>accumcheck report: " + xml_escape(d.scenario) + "</title>\n";
  o += "<style>" + std::string(report_assets::kUplotCss) + "</style>\n";
  o += "<style>" + std::string(kPageCss) + "</style>\n</head><body>\n";
  o += "<h1>" + xml_escape(d.scenario) + "</h1>\n";
  o += "<p class=\"story\">" + xml_escape(d.story) + "</p>\n";
  o += "<p class=\"settings\">" + xml_escape(d.settings) +
       "<br>trace: " + xml_escape(d.engine) + ", " + xml_escape(d.precision) +
       "</p>\n";
  o += explain_html(d);
  o += "<section id=\"certify\"></section>\n";
  const std::vector<const char*> charts =
      d.contract ? std::vector<const char*>{"lr", "weights"}
                 : std::vector<const char*>{"loss", "dist", "lr", "gnorm"};
  for (const char* id : charts)
    o += fmt::format("<div class=\"chart\" id=\"{}\"></div>\n", id);
  o += "<section id=\"contract\"></section>\n";
  o += d.contract
           ? "<p class=\"small\">The contract tier judges which micro-batch "
             "gradients enter each step with which weights, not the model's "
             "numerics. Made by accumcheck; charts by uPlot 1.6.32 (MIT, "
             "inlined).</p>\n"
           : "<p class=\"small\">Windows are the large-batch reference's "
             "optimizer steps; a run is cut where it has consumed as many "
             "samples. Made by accumcheck report; charts by uPlot 1.6.32 "
             "(MIT, inlined).</p>\n";
  o += "<pre id=\"selftest\"></pre>\n";
  o += "<script>/* uPlot license:\n" +
       std::string(report_assets::kUplotLicense) + "*/\n" +
       report_assets::kUplotJs + "</script>\n";
  o += "<script>const DATA = " + data_json(d) + ";\n" + kPageScript +
       "</script>\n</body></html>\n";
  return o;
}

}  // namespace accumcheck
