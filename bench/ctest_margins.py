"""certify's verdicts and margins in CTest JUnit files, side by side.

For each test named PyTorch.*, Memory.PyTorch.* or Package.* in one or more
`ctest --output-junit FILE` files, prints a Markdown table: per file, the
CTest result, certify's verdict, the pitfall it names, the max error
(the best candidate's distance: "of bound" for the oracle tier, "of the
uncertainty" for the contract tier) and the runner-up's ratio to it
("margin: next is ... (Zx the best)").

    python3 bench/ctest_margins.py --label 1.13 --label 2.13 a.xml b.xml
    python3 bench/ctest_margins.py --changed 2 a.xml b.xml

Run CTest with --test-output-size-passed/--test-output-size-failed large
(e.g. 1000000): CTest keeps 1024 bytes of a passed test's output by
default, which cuts a FAIL's margin line.  "?" in a cell: the output
holds no such line (or was cut)."""

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

PREFIXES = ("PyTorch.", "Memory.PyTorch.", "Package.")
COLUMNS = ("ctest", "verdict", "pitfall", "max err", "next ×")


def read_junit(path):
    """{test name: (CTest result, output)} of one JUnit file."""
    tests = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith(PREFIXES):
            continue
        tags = {child.tag for child in case}
        if "failure" in tags or "error" in tags or case.get("status") == "fail":
            result = "fail"
        elif "skipped" in tags or case.get("status") in ("notrun", "disabled"):
            result = "skip"
        else:
            result = "pass"
        out = "".join(c.text or "" for c in case if c.tag in ("system-out", "system-err"))
        tests[name] = (result, out)
    return tests


def search(pattern, text):
    m = re.search(pattern, text, re.M)
    return m.group(1) if m else None


def summarize(result, out):
    """(ctest, verdict, pitfall, max error, runner-up ratio) from a test's output."""
    if re.search(r"^quantity +predicted +measured", out, re.M):
        bad = len(re.findall(r"\bDIFFERS by\b", out))
        return result, "memory ok" if "driver: ok" in out and not bad else f"memory: {bad} differ", "", "", ""
    verdict, err = "", None
    exit_code = search(r"(?:exit|exited) (\d+)", out)
    head = re.search(r"^(PASS|FAIL)( \(contract tier\))?:", out, re.M)
    if head:
        verdict = head.group(1) + (" (contract)" if head.group(2) else "")
    elif re.search(r"^accumcheck: internal error", out, re.M) or exit_code == "3":
        verdict = "exit 3"
    elif re.search(r"^accumcheck: ", out, re.M) or exit_code == "2":
        verdict = "exit 2"
    if verdict.startswith("PASS"):
        err = search(r"^PASS.*?\(max (?:error )?(\S+) of (?:bound|the uncertainty)\)", out)
    pitfall = ""
    if search(r"^diagnosis: (no modelled pitfall)", out):
        # oracle: "closest X (max error Y of bound"; contract: "closest (not matching): X ... at Y of"
        closest = search(r"closest (?:\(not matching\): )?(\S+)", out)
        pitfall = "none" + (f" (closest {closest})" if closest else "")
        err = search(r"closest \S+ \(max error (\S+) of bound", out) or \
            search(r"^closest \(not matching\): .*? at (\S+) of the uncertainty", out)
    elif search(r"^diagnosis: matches, (tied)", out):
        m = re.search(r"^diagnosis: matches, tied[^:]*: ([^\s|]+)[^|]*?\(max error (\S+) of", out, re.M)
        pitfall, err = m.group(1) + " (tied)", m.group(2)
    elif search(r"^diagnosis: matches (\S+)", out):
        pitfall = search(r"^diagnosis: matches (\S+)", out)
        err = search(r"^diagnosis: matches .*?\(max (?:error )?(\S+) of (?:bound|the uncertainty)\)", out)
    elif search(r"^state finding: ([^:\s]+)", out):
        # the gradients are correct's, a training state is not: the reading named, replayed
        pitfall = search(r"^state finding: ([^:\s]+)", out) + " (state)"
        err = search(r"^FAIL: .*max error (\S+) of the bound", out)
    ratio = search(r"^margin: next is .*\((\S+)x the best\)", out)
    if verdict.startswith("FAIL") and not ratio and search(r"^margin: next is (\S+)", out):
        ratio = "inf" if number(err or "") == 0 else "?"  # the best at 0: no ratio printed
    if verdict.startswith("FAIL") and not pitfall:
        pitfall = "?"
    return result, verdict or "-", pitfall, err or ("?" if verdict.startswith(("PASS", "FAIL")) else ""), ratio or ""


def number(text):
    try:
        return float(text)
    except ValueError:
        return None


def changed(cells, factor):
    """Whether the files disagree on CTest result, verdict or pitfall, or a
    max error or ratio differs by more than factor between two of them."""
    if len({c[:3] for c in cells}) > 1:
        return True
    for i in (3, 4):
        values = [number(c[i]) for c in cells]
        if any(v is None for v in values) and len(set(c[i] for c in cells)) > 1:
            return True
        values = [v for v in values if v is not None]
        if values and min(values) > 0 and max(values) / min(values) > factor:
            return True
        if values and min(values) <= 0 < max(values):
            return True
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("junit", nargs="+", help="a CTest JUnit file (ctest --output-junit FILE)")
    ap.add_argument("--label", action="append", default=[],
                    help="a column group's header, one per file in order (default: the file's name)")
    ap.add_argument("--changed", type=float, metavar="FACTOR",
                    help="only the rows whose CTest result, verdict or pitfall differ between files, "
                         "or whose max error or runner-up ratio differ by more than FACTOR")
    args = ap.parse_args()
    if args.label and len(args.label) != len(args.junit):
        ap.error("give one --label per file (%d files, %d labels)" % (len(args.junit), len(args.label)))
    labels = args.label or [os.path.splitext(os.path.basename(p))[0] for p in args.junit]
    runs = [read_junit(p) for p in args.junit]
    names = sorted(set().union(*runs), key=lambda n: (not n.startswith("PyTorch."), n))
    missing = ("absent", "", "", "", "")
    head = ["test"] + [f"{lab} {col}" for lab in labels for col in COLUMNS]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in names:
        cells = [summarize(*run[name]) if name in run else missing for run in runs]
        if args.changed is not None and not changed(cells, args.changed):
            continue
        print("| " + " | ".join([f"`{name}`"] + [c for cell in cells for c in cell]) + " |")
    counts = ["%s: %d tests, %d passed" % (lab, len(run), sum(r == "pass" for r, _ in run.values()))
              for lab, run in zip(labels, runs)]
    print("\n" + "; ".join(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
