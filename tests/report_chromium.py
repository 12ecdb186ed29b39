#!/usr/bin/env python3
"""CTest Report.Chromium: `accumcheck report` rendered in headless Chromium.

  report_chromium.py --accumcheck BIN --scenarios DIR --work DIR

Writes the reports of three flagship scenarios (`run --html`) and of one
certify run (a float32 device trace of zero-grad-every-micro-step
certified against the scenario, `certify --html`), loads each in one
headless Chromium driven over the DevTools protocol (a pipe: its console
errors and uncaught exceptions, its DOM, a screenshot) and checks, from
the self-test the page writes into its DOM (<pre id="selftest">):
  - no script error and no console error;
  - the four charts, each with its axis labels and every run of the trace
    as a series, drawn in the uPlot legend, with points;
  - for the certify report: the heat strip (one row per tensor and kind),
    the ranking and the first failing check.
  - for the certify report (issue 44), the page leads with what the run
    behaves like (the pitfall's explain entry: title, story, the fix) before
    the evidence, shows the closest five candidates and every candidate
    only in a collapsed list.
With --contract --python PY (CTest Report.Chromium.contract, where PyTorch
is): the contract tier's pages instead, of traces examples/contract/train.py
records: `certify --contract --html` of a FAIL (an inert clip after every
backward: behaves like clip-per-micro-step) and of one no modelled pitfall
explains (a window's first micro-batch stepped alone), and `accumcheck
report` of a correct trace (PASS): the lr and weight charts, the table of
every optimizer step, the same certify sections.
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
import base64
import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch"))
import warm_python
from ctest_driver import in_recorded_build  # noqa: E402  the PyTorch cases' rule

CHARTS = {
    "loss": ("window", "mean loss"),
    "dist": ("window", "relative distance (log)"),
    "lr": ("optimizer step", "lr"),
    "gnorm": ("optimizer step", "|G|"),
}
CONTRACT_CHARTS = {
    "lr": ("optimizer step", "lr"),
    "weights": ("micro-batch", "weight × N"),
}


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium for every page, driven over the DevTools
    protocol on a pipe (--remote-debugging-pipe: JSON messages ended by a
    NUL byte, commands on the child's fd 3, replies and events on its fd 4).
    Starting Chromium costs about 4.4 s of CPU; the pages used to start it
    twice each (--dump-dom, then --screenshot), 37 s of CPU in all."""

    def __init__(self, exe, profile, timeout=120):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def fds():
            # The child's fds 3 and 4 (os.dup2 makes them inheritable),
            # through copies above both: a pipe end may itself be 3 or 4.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
             "--remote-debugging-pipe", "--user-data-dir=" + profile, "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, preexec_fn=fds, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self.deadline = time.monotonic() + timeout
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read(self):
        while b"\0" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium: no reply in time")
            ready, _, _ = select.select([self.from_child], [], [], left)
            chunk = os.read(self.from_child, 1 << 20) if ready else b""
            if ready and not chunk:
                raise RuntimeError("chromium closed its DevTools pipe: %s" %
                                   self.proc.stderr.read().decode()[-2000:])
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, session=None, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError("chromium: %s: %s" % (method, m["error"]))
                return m["result"]
            self.events.append(m)

    def wait_event(self, method, session):
        while True:
            for i, m in enumerate(self.events):
                if m.get("method") == method and m.get("sessionId") == session:
                    return self.events.pop(i)
            self.events.append(self._read())

    def close(self):
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_child)
        os.close(self.from_child)

    def evaluate(self, session, expression):
        r = self.call("Runtime.evaluate", session, expression=expression,
                      returnByValue=True)
        return r.get("result", {}).get("value")

    def load(self, html):
        """Opens `html` in a new 1200x900 tab and waits (at most 30 s)
        for the page's self-test; returns the tab's session, its DOM and
        the console errors and uncaught exceptions seen while loading."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target,
                            flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(domain + ".enable", session)
        self.call("Emulation.setDeviceMetricsOverride", session, width=1200,
                  height=900, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", session, url="file://" + os.path.abspath(html))
        self.wait_event("Page.loadEventFired", session)
        until = time.monotonic() + 30
        while time.monotonic() < until and not self.evaluate(
                session, "(document.getElementById('selftest') || {}).textContent"):
            time.sleep(0.05)
        dom = self.evaluate(session, "document.documentElement.outerHTML") or ""
        errors = []
        for m in self.events:
            if m.get("sessionId") != session:
                continue
            p = m.get("params", {})
            if m.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
                errors.append("console.error: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m.get("method") == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                errors.append("Uncaught: " + str(d.get("exception", {}).get(
                    "description", d.get("text", ""))))
            elif m.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append("log error: " + p["entry"].get("text", ""))
        self.events = [m for m in self.events if m.get("sessionId") != session]
        return session, target, dom, errors

    def screenshot(self, session, png):
        """The page at 1200x2300, as a PNG file."""
        self.call("Emulation.setDeviceMetricsOverride", session, width=1200,
                  height=2300, deviceScaleFactor=1, mobile=False)
        time.sleep(0.2)  # the charts redraw for the new size
        data = self.call("Page.captureScreenshot", session, format="png")["data"]
        with open(png, "wb") as f:
            f.write(base64.b64decode(data))


def check_certify(html, cs, want):
    """The certify sections (issue 44): `want` is (verdict, the pitfall the
    run behaves like or None for no modelled pitfall, or "" on PASS)."""
    errors = []
    verdict, pitfall = want
    order = cs.get("order", [])
    if not order or order[0] != "certify: " + verdict:
        errors.append(f"{html}: the certify section starts {order[:1]}, not certify: {verdict}")
    if verdict == "FAIL":
        title = ("The run behaves like " + pitfall) if pitfall else "No modelled pitfall explains this run"
        if order[1:2] != [title]:
            errors.append(f"{html}: after the verdict {order[1:2]}, not {title!r}")
        if "Evidence" not in order or order.index("Evidence") != 2:
            errors.append(f"{html}: the evidence is not third: {order}")
        if pitfall and not any(b.startswith(pitfall + ": ") for b in cs.get("behaves", [])):
            errors.append(f"{html}: no explain entry of {pitfall}: {cs.get('behaves')}")
        if not cs.get("first_fail"):
            errors.append(f"{html}: no first failing check")
        if cs.get("evidence_rows", 0) < 1:
            errors.append(f"{html}: no evidence lines")
        if not 1 <= cs.get("ranking_rows", 0) <= 5:
            errors.append(f"{html}: {cs.get('ranking_rows')} candidates shown, expected 1 to 5")
        if cs.get("ranking_all_rows", 0) <= cs.get("ranking_rows", 0):
            errors.append(f"{html}: the collapsed list has {cs.get('ranking_all_rows')} candidates")
        if order[-1:] != ["Closest candidates"]:
            errors.append(f"{html}: the ranking is not last: {order}")
    elif len(order) > 1 and order[1].startswith(("The run behaves", "No modelled")):
        errors.append(f"{html}: a PASS page names a pitfall: {order}")
    if cs.get("checks", 0) < 1:
        errors.append(f"{html}: no checks listed")
    return errors


def check_page(browser, html, runs, certify, want=None, contract=False):
    errors = []
    session, target, dom, console = browser.load(html)
    m = re.search(r'<pre id="selftest">(.*?)</pre>', dom, re.S)
    if not m or not m.group(1).strip():
        return [f"{html}: no self-test in the DOM (the page script did not run); "
                f"console: {console}"]
    st = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<")
                    .replace("&gt;", ">").replace("&amp;", "&"))
    errors += [f"{html}: console: {line}" for line in console]
    errors += [f"{html}: script error: {e}" for e in st["errors"]]
    charts = {c["id"]: c for c in st["charts"]}
    if sorted(charts) != sorted(CONTRACT_CHARTS if contract else CHARTS):
        errors.append(f"{html}: charts {sorted(charts)}")
    for cid, (xlabel, ylabel) in (CONTRACT_CHARTS if contract else CHARTS).items():
        c = charts.get(cid)
        if not c:
            errors.append(f"{html}: chart {cid} missing")
            continue
        if c["axes"] != [xlabel, ylabel]:
            errors.append(f"{html}: chart {cid} axis labels {c['axes']} != {[xlabel, ylabel]}")
        series = [r for r in runs if not (cid == "dist" and r == "reference")]
        if cid in ("lr", "gnorm"):
            series = [r for r in series if r in runs_that_step]
        if contract:
            series = ["trainer"]
        if sorted(c["series"]) != sorted(series):
            errors.append(f"{html}: chart {cid} series {c['series']} != {series}")
        for s in series:
            if s not in c["legend"]:
                errors.append(f"{html}: chart {cid}: series {s} not drawn in the legend {c['legend']}")
        if not isinstance(c["points"], list) or any(p == 0 for p in c["points"]):
            errors.append(f"{html}: chart {cid}: a series without points: {c['points']}")
    if certify:
        cs = st.get("certify") or {}
        if not contract and cs.get("heat_rows", 0) < 2:
            errors.append(f"{html}: heat strip has {cs.get('heat_rows')} rows")
        errors += check_certify(html, cs, want)
    if contract:
        steps = (st.get("contract") or {}).get("step_rows", 0)
        if steps != contract:
            errors.append(f"{html}: {steps} optimizer steps in the table, the trace has {contract}")
    png = html[:-5] + ".png"
    browser.screenshot(session, png)
    browser.call("Target.closeTarget", targetId=target)
    if not os.path.exists(png) or os.path.getsize(png) < 10000:
        errors.append(f"{html}: no screenshot")
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
    ap.add_argument("--contract", action="store_true",
                    help="the contract tier's pages (needs --python)")
    ap.add_argument("--python", help="a Python with torch and accumcheck_torch")
    a = ap.parse_args()
    exe = chromium()
    if not exe:
        print("SKIP: chromium is not installed (scripts/setup.sh installs Debian's chromium)")
        return 77
    os.makedirs(a.work, exist_ok=True)
    if a.contract:
        return render(exe, a, contract_pages(a))
    pages = []
    for name in ("zero-grad-every-micro-step", "scheduler-per-micro-step",
                 "step-every-micro-step"):
        trace = os.path.join(a.work, name)
        html = os.path.join(a.work, name + ".html")
        subprocess.run([a.accumcheck, "run", os.path.join(a.scenarios, name + ".toml"),
                        "--quiet", "--out", trace, "--html", html], check=True)
        pages.append((html, trace, None, False))
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
    pages.append((html, trace, ("FAIL", name), False))
    return render(exe, a, pages)


def contract_pages(a):
    """The contract tier's pages: (html, trace, want, steps)."""
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                            "examples", "contract", "train.py")
    pages = []
    for name, args, kind, want in (
            ("inert-clip", ["--loop", "clip_per_micro_step", "--clip", "1000"], "certify",
             ("FAIL", "clip-per-micro-step")),
            ("first-alone", ["--loop", "step_first_alone"], "certify", ("FAIL", None)),
            ("correct", ["--loop", "transformers"], "report", ("PASS", ""))):
        trace = os.path.join(a.work, "contract-" + name)
        html = os.path.join(a.work, "contract-" + name + ".html")
        if os.path.exists(html):
            os.remove(html)  # the page must be this run's
        argv = [examples, "--model", "gpt", "--out", trace, "--quiet"] + args
        if os.path.abspath(a.python) == os.path.abspath(sys.executable):
            warm_python.run(argv, check=True)  # a fork of CTest's warm Python
        else:
            subprocess.run([a.python] + argv, check=True)
        if kind == "certify":
            cmd = [a.accumcheck, "certify", "--contract", "--trace", trace, "--quiet",
                   "--html", html]
        else:
            cmd = [a.accumcheck, "report", trace, "--out", html]
        rc = subprocess.run(cmd).returncode
        if rc != (1 if want[0] == "FAIL" and kind == "certify" else 0):
            raise SystemExit(f"{' '.join(cmd)} exited {rc}")
        if not os.path.exists(html):
            raise SystemExit(f"{' '.join(cmd)} wrote no {html}")
        with open(os.path.join(trace, "contract.csv")) as f:
            steps = sum(1 for line in f if line.startswith("step,"))
        pages.append((html, trace, want, steps))
    return pages


def render(exe, a, pages):
    errors = []
    browser = None
    for html, trace, want, contract in pages:
        certify = want is not None
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
        if browser is None:
            browser = Browser(exe, os.path.join(a.work, ".chromium-profile"))
        e = check_page(browser, html, runs, certify, want, contract)
        print(f"{os.path.basename(html)}: {len(runs)} runs, "
              f"{'ok' if not e else str(len(e)) + ' problems'}")
        errors += e
        if not e:
            with open(stamp, "w") as f:
                f.write(digest(html) + "\n")
    if browser is not None:
        browser.close()
    for e in errors:
        print(e)
    if errors:
        return 1
    print("report_chromium: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
