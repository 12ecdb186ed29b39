#!/usr/bin/env python3
"""CTest Report.Chromium: `accumcheck report` rendered in headless Chromium.

  report_chromium.py --accumcheck BIN --scenarios DIR --work DIR

Writes the reports of three flagship scenarios (`run --html`) and of one
certify run (a float32 device trace of zero-grad-every-micro-step
certified against the scenario, `certify --html`), loads each in headless
Chromium (--dump-dom, console logging on stderr) and checks, from the
self-test the page writes into its DOM (<pre id="selftest">):
  - no script error and no console error;
  - the four charts, each with its axis labels and every run of the trace
    as a series, drawn in the uPlot legend, with points;
  - for the certify report: the heat strip (one row per tensor and kind),
    the ranking and the first failing check.
Then writes a PNG screenshot of each page next to it, and a stamp
(<page>.html.checked: the page's SHA-256) once the page passed.  Exits 77
(CTest: skipped) with a message when chromium is not installed.

Under scripts/check-hardened.sh (ACCUMCHECK_THIS_BUILD = build-asan/,
ACCUMCHECK_RECORDED_BUILD = build/, as for the PyTorch cases) a page that
the sanitized accumcheck wrote byte for byte equal to one Chromium already
checked in build/ (its stamp holds the same SHA-256) is not rendered
again: what the sanitizers watch is accumcheck writing the page, and
Chromium gives an identical file the same DOM.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "adapters", "pytorch"))
from ctest_driver import in_recorded_build  # noqa: E402  the PyTorch cases' rule

CHARTS = {
    "loss": ("window", "mean loss"),
    "dist": ("window", "relative distance (log)"),
    "lr": ("optimizer step", "lr"),
    "gnorm": ("optimizer step", "|G|"),
}


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browse(browser, html, extra, timeout=120):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-dev-shm-usage", "--no-first-run", "--enable-logging=stderr",
           "--v=0", "--virtual-time-budget=10000",
           "--user-data-dir=" + os.path.join(os.path.dirname(html), ".chromium-profile")]
    return subprocess.run(cmd + extra + ["file://" + os.path.abspath(html)],
                          capture_output=True, text=True, timeout=timeout)


def check_page(browser, html, runs, certify):
    errors = []
    r = browse(browser, html, ["--dump-dom", "--window-size=1200,900"])
    m = re.search(r'<pre id="selftest">(.*?)</pre>', r.stdout, re.S)
    if not m or not m.group(1).strip():
        return [f"{html}: no self-test in the DOM (the page script did not run); "
                f"chromium rc {r.returncode}: {r.stderr[-2000:]}"]
    st = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<")
                    .replace("&gt;", ">").replace("&amp;", "&"))
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l and
               ("ERROR" in l or "Uncaught" in l or "error" in l.lower())]
    errors += [f"{html}: console: {l}" for l in console]
    errors += [f"{html}: script error: {e}" for e in st["errors"]]
    charts = {c["id"]: c for c in st["charts"]}
    for cid, (xlabel, ylabel) in CHARTS.items():
        c = charts.get(cid)
        if not c:
            errors.append(f"{html}: chart {cid} missing")
            continue
        if c["axes"] != [xlabel, ylabel]:
            errors.append(f"{html}: chart {cid} axis labels {c['axes']} != {[xlabel, ylabel]}")
        want = [r for r in runs if not (cid == "dist" and r == "reference")]
        if cid in ("lr", "gnorm"):
            want = [r for r in want if r in runs_that_step]
        if sorted(c["series"]) != sorted(want):
            errors.append(f"{html}: chart {cid} series {c['series']} != {want}")
        for s in want:
            if s not in c["legend"]:
                errors.append(f"{html}: chart {cid}: series {s} not drawn in the legend {c['legend']}")
        if not isinstance(c["points"], list) or any(p == 0 for p in c["points"]):
            errors.append(f"{html}: chart {cid}: a series without points: {c['points']}")
    if certify:
        cs = st.get("certify") or {}
        if cs.get("heat_rows", 0) < 2:
            errors.append(f"{html}: heat strip has {cs.get('heat_rows')} rows")
        if cs.get("ranking_rows", 0) < 1:
            errors.append(f"{html}: ranking has no rows")
        if not cs.get("first_fail"):
            errors.append(f"{html}: no first failing check")
    png = html[:-5] + ".png"
    s = browse(browser, html, ["--screenshot=" + png, "--window-size=1200,2300",
                               "--hide-scrollbars"])
    if not os.path.exists(png) or os.path.getsize(png) < 10000:
        errors.append(f"{html}: no screenshot ({s.stderr[-1000:]})")
    return errors


runs_that_step = set()


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def checked_before(html):
    """The same page in ACCUMCHECK_RECORDED_BUILD, when Chromium checked it
    there and it is byte for byte this one (see the top), else None."""
    page = in_recorded_build(html)
    if not page:
        return None
    try:
        with open(page + ".checked") as f:
            return page if f.read().strip() == digest(html) else None
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accumcheck", required=True)
    ap.add_argument("--scenarios", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    browser = chromium()
    if not browser:
        print("SKIP: chromium is not installed (scripts/setup.sh installs Debian's chromium)")
        return 77
    os.makedirs(a.work, exist_ok=True)
    pages = []
    for name in ("zero-grad-every-micro-step", "scheduler-per-micro-step",
                 "step-every-micro-step"):
        trace = os.path.join(a.work, name)
        html = os.path.join(a.work, name + ".html")
        subprocess.run([a.accumcheck, "run", os.path.join(a.scenarios, name + ".toml"),
                        "--quiet", "--out", trace, "--html", html], check=True)
        pages.append((html, trace, False))
    name = "zero-grad-every-micro-step"
    trace = os.path.join(a.work, "certify-trace")
    html = os.path.join(a.work, "certify-" + name + ".html")
    scen = os.path.join(a.scenarios, name + ".toml")
    subprocess.run([a.accumcheck, "run", scen, "--engine", "device", "--quiet",
                    "--out", trace], check=True)
    rc = subprocess.run([a.accumcheck, "certify", scen, "--trace", trace, "--run", name,
                         "--quiet", "--html", html]).returncode
    if rc != 1:
        print(f"certify of the buggy trainer exited {rc}, expected 1 (FAIL)")
        return 1
    pages.append((html, trace, True))
    errors = []
    for html, trace, certify in pages:
        # The runs and which of them step, from the trace itself.
        runs = []
        runs_that_step.clear()
        with open(os.path.join(trace, "events.csv")) as f:
            next(f)
            for line in f:
                run, event = line.split(",")[0], line.split(",")[4]
                if run not in runs:
                    runs.append(run)
                if event == "optimizer_step":
                    runs_that_step.add(run)
        stamp = html + ".checked"
        if os.path.exists(stamp):
            os.remove(stamp)
        seen = checked_before(html)
        if seen:
            print(f"{os.path.basename(html)}: byte for byte the page Chromium "
                  f"checked in {os.path.dirname(seen)}: not rendered again")
            continue
        e = check_page(browser, html, runs, certify)
        print(f"{os.path.basename(html)}: {len(runs)} runs, "
              f"{'ok' if not e else str(len(e)) + ' problems'}")
        errors += e
        if not e:
            with open(stamp, "w") as f:
                f.write(digest(html) + "\n")
    for e in errors:
        print(e)
    if errors:
        return 1
    print("report_chromium: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
