"""bench/conformance.py's own logic (no framework venv): a cell against its
expectation (a combination is a set of pitfalls), a row's cells= list, and
bench/conformance/cells.py running a row's cells as forks of one process
(each its own exit status, log and CPU time)."""

import importlib.util
import json
import os
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _conformance():
    spec = importlib.util.spec_from_file_location(
        "conformance", os.path.join(ROOT, "bench", "conformance.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_combination_agrees_in_any_order():
    c = _conformance()
    res = {"expect": "a-b+c-d+e", "cell": "c-d+e+a-b (fit 0.02)"}
    assert c.agrees(res)
    # One pitfall fewer or more is another answer.
    assert not c.agrees({"expect": "a-b+c-d", "cell": "c-d+e+a-b (fit 0.02)"})
    assert not c.agrees({"expect": "a-b+c-d+e+f", "cell": "c-d+e+a-b (fit 0.02)"})
    assert c.agrees({"expect": "PASS", "cell": "PASS"})
    assert not c.agrees({"expect": "PASS", "cell": "a-b (fit 0.02)"})
    assert c.agrees({"expect": "no-modelled-pitfall", "cell": "no modelled pitfall"})
    assert c.agrees({"expect": "refused", "cell": "refused (exit 2)"})
    assert c.agrees({"expect": "case-failed", "cell": "case failed (exit 1)"})
    assert not c.agrees({"expect": "case-failed", "cell": "PASS"})


def test_an_lr_the_named_pitfall_leaves_unexplained_disagrees():
    """certify names each channel when the weights and the lr match
    different candidates: the cell says both, and an lr no modelled
    pitfall explains agrees with no expectation of the weights alone."""
    c = _conformance()
    report = ("FAIL weights: which g_j with which weight each step holds, against correct: max 7.75e+04 "
              "of the uncertainty (step 5 micro-batch 20: weight 0.0243902431, predicted 0.0285714286)\n"
              "FAIL lr: step 0 used lr 0, the accepted schedule gives 0.1\n"
              "diagnosis: matches a-b (weights, max 0.0291 of the uncertainty) and %s (lr)\n"
              "evidence: lr ratio at step 0: 0 x the schedule\n")
    cell = c.parse(1, report % "no modelled lr pitfall")[0]
    assert cell == "a-b, lr: no modelled pitfall (fit 0.0291)"
    assert not c.agrees({"expect": "a-b", "cell": cell})
    assert not c.agrees({"expect": "no-modelled-pitfall", "cell": cell})
    cell = c.parse(1, report % "c-d")[0]
    assert c.agrees({"expect": "a-b+c-d", "cell": cell}) and c.agrees({"expect": "c-d+a-b", "cell": cell})
    assert not c.agrees({"expect": "a-b", "cell": cell})
    # One diagnosis for both channels: as before.
    one = c.parse(1, "diagnosis: matches a-b+c-d (max 0.02 of the uncertainty)\n")[0]
    assert one == "a-b+c-d (fit 0.02)" and c.agrees({"expect": "c-d+a-b", "cell": one})


def test_cells_restricts_a_row(tmp_path):
    c = _conformance()
    f = tmp_path / "versions.txt"
    f.write_text("# a comment\nfw==1.0 dep==2.0 cells=sgd,attach sgd=x-y\nfw==2.0 ci=sgd\n")
    rows = c.read_versions(str(f))
    assert rows[0]["cells"] == ["sgd", "attach"] and rows[0]["pins"] == ["dep==2.0"]
    assert rows[0]["expect"] == {"sgd": "x-y"}
    assert rows[1]["cells"] is None and rows[1]["ci"] == ["sgd"]


def test_cells_runs_each_case_as_a_fork(tmp_path):
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "fw_ok.py").write_text(
        "import sys\nprint('to the log')\nopen(sys.argv[2], 'w').write(__name__)\n")
    (cases / "fw_refused.py").write_text("import sys\nsys.exit(2)\n")
    (cases / "fw_raises.py").write_text("raise RuntimeError('the case broke')\n")
    lines = []
    for name in ("ok", "refused", "raises"):
        lines.append(json.dumps({"case": name, "script": str(cases / ("fw_%s.py" % name)),
                                 "argv": ["--out", str(tmp_path / (name + ".out"))],
                                 "log": str(tmp_path / (name + ".log"))}))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    # A fork of this process (warm_python.run_here): cells.py's own
    # imports of torch and accumcheck_torch are done already.
    p = warm_python.run_here([os.path.join(ROOT, "bench", "conformance", "cells.py"),
                              str(cases), "fw", "60"], input="\n".join(lines) + "\n",
                             env=env, timeout=240)
    assert p.returncode == 0, p.stderr
    first, *rows = map(json.loads, p.stdout.splitlines())
    # The first line says how the framework imported (here "fw", which is
    # not a package: not ok), before any cell.
    assert set(first) == {"imported"} and first["imported"]["ok"] is False
    got = {r["case"]: r for r in rows}
    assert [got[n]["rc"] for n in ("ok", "refused", "raises")] == [0, 2, 1]
    assert (tmp_path / "ok.out").read_text() == "__main__"
    assert "to the log" in (tmp_path / "ok.log").read_text()
    assert "the case broke" in (tmp_path / "raises.log").read_text()
    assert all(r["cpu_s"] >= 0 for r in got.values())
