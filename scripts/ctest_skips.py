#!/usr/bin/env python3
"""Prints why each test of a CTest run was skipped.

CTest's summary lists skipped tests without their reasons.  scripts/test.sh
and scripts/check-hardened.sh have CTest write a JUnit report
(BUILD/ctest-junit.xml, with each test's output); for every skipped test
this prints its name and the lines of its output that say why:
GoogleTest's GTEST_SKIP message (the lines after "...: Skipped"), and any
line of a script's output that mentions a skip or a test not run.

Usage: ctest_skips.py BUILD_DIR     (exit 0; no report or no skip is fine)
"""
from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET

GTEST_SKIP = re.compile(r": Skipped$")
MENTION = re.compile(r"\bskip|\bnot run\b", re.IGNORECASE)


def reasons(output: str) -> list[str]:
    lines = output.split("\n")
    why = []
    for i, line in enumerate(lines):
        if GTEST_SKIP.search(line):
            for nxt in lines[i + 1:]:
                if nxt.startswith("[  SKIPPED ]"):
                    break
                if nxt.strip():
                    why.append(nxt.strip())
        elif MENTION.search(line) and not line.startswith("[  SKIPPED ]"):
            why.append(line.strip())
    return list(dict.fromkeys(why))


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    report = os.path.join(sys.argv[1], "ctest-junit.xml")
    if not os.path.exists(report):
        print(f"ctest_skips: no {report} (CTest did not run)")
        return 0
    found = []
    for case in ET.parse(report).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None and case.get("status") != "notrun":
            continue
        why = reasons(case.findtext("system-out") or "")
        if not why and skipped is not None and skipped.get("message"):
            why = [skipped.get("message")]
        found.append((case.get("name"), why))
    print(f"ctest_skips: {len(found)} test(s) skipped in {sys.argv[1]}")
    for name, why in found:
        print(f"  {name}: {' / '.join(why) if why else '(its output gives no reason)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
