#!/usr/bin/env python3
"""Runs the commands shown in Markdown files and checks their shown output.

A block is checked when an HTML comment `<!-- doctest -->` (or
`<!-- doctest: OPTIONS -->`) stands on the line right before its opening
fence (GitHub does not render the comment).  Inside the block, a line
starting with `$ ` is a command (a line ending in a backslash continues
it); the lines after it, up to the next command, are its expected output
(stdout and stderr together).  A command may end in `# exit N`: the exit
status it must have (default 0).  Commands run under `bash -o pipefail`,
so `accumcheck certify ... | grep FAIL # exit 1` is certify's status
(filter with grep or sed, which read all their input, not head).

Expected output may be trimmed or vary where it says so:

  - `…` inside a line matches any text on that line (a time, a path);
  - a line holding only `…` matches any number of lines (0 or more).

Everything else must match exactly (trailing spaces and trailing blank
lines aside).

OPTIONS, space separated:

  venv        the block needs the project's .venv (torch): .venv/bin comes
              first on PATH; without .venv/bin/python the block is
              reported as not run and counted, and the test fails unless
              --allow-missing-venv is given
  timeout=S   seconds per command (default 60)
  approx=R    numbers that depend on PyTorch's CPU kernels: in this block
              every number the doc shows with a decimal point or an
              exponent (0.928, 1.73e+04) matches the number printed at its
              place when they differ by at most R relative (|printed -
              shown| <= R * |shown|); everything else (words, verdicts,
              pitfall names, integers such as step counts) and the exit
              status must match exactly.  The doc must say so where a
              reader sees it: a line of the paragraph right before the
              mark (the 6 lines above it) must give the tolerance as a
              percentage, R * 100 followed by " %" ("within 2 %")
  run="CMD"   run CMD instead of the block's one shown command (for a
              shown command that cannot run inside the test suite, e.g.
              `bash scripts/demo.sh`, whose last step CMD is)

Every block of one file runs in one scratch folder, in order: it holds a
link to each top-level entry of the repository (scenarios/, examples/,
python/, ...), so commands read the repository's files as they would from
its root, and what they write (out/, bundle/, trace/) stays in the
scratch folder.  The build's `accumcheck` is first on PATH.

Usage: doctest_md.py --accumcheck BIN --repo DIR [--work DIR] FILE.md...
Exit 0 when every block matches, 1 otherwise; each mismatch is shown as a
diff.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

MARK = re.compile(r"^<!--\s*doctest(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
ELLIPSIS = "…"


@dataclass
class Command:
    line: int
    text: str
    exit: int = 0
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: str
    line: int
    options: dict[str, str]
    commands: list[Command]


def parse_options(text: str | None, where: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for word in shlex.split(text or ""):
        key, eq, value = word.partition("=")
        if key not in ("venv", "timeout", "run", "approx"):
            raise SystemExit(f"{where}: unknown doctest option '{key}'")
        options[key] = value if eq else "1"
    return options


def parse_blocks(path: str) -> list[Block]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks = []
    i = 0
    open_fence = None  # the fence of an unmarked block we are inside: marks there are text
    while i < len(lines):
        fm = FENCE.match(lines[i])
        if open_fence:
            if fm and fm.group(2).startswith(open_fence) and not fm.group(3).strip():
                open_fence = None
            i += 1
            continue
        if fm:
            open_fence = fm.group(2)
            i += 1
            continue
        m = MARK.match(lines[i])
        if not m:
            i += 1
            continue
        where = f"{path}:{i + 1}"
        options = parse_options(m.group(1), where)
        if i + 1 >= len(lines) or not FENCE.match(lines[i + 1]):
            raise SystemExit(f"{where}: a doctest mark must stand right before a fenced block")
        fm = FENCE.match(lines[i + 1])
        indent, fence = fm.group(1), fm.group(2)
        body = []
        j = i + 2
        while j < len(lines) and not (lines[j].strip().startswith(fence)
                                      and lines[j].strip().strip(fence[0]) == ""):
            body.append((j + 1, lines[j][len(indent):] if lines[j].startswith(indent) else lines[j]))
            j += 1
        if j >= len(lines):
            raise SystemExit(f"{where}: the block is not closed")
        commands: list[Command] = []
        k = 0
        while k < len(body):
            number, text = body[k]
            if text.startswith("$ "):
                cmd = text[2:]
                while cmd.endswith("\\") and k + 1 < len(body):
                    k += 1
                    cmd = cmd + "\n" + body[k][1]
                code = 0
                em = EXIT.search(cmd)
                if em:
                    code = int(em.group(1))
                    cmd = cmd[:em.start()]
                commands.append(Command(number, cmd, code))
            elif not commands:
                raise SystemExit(f"{path}:{number}: a doctest block starts with a `$ ` command line")
            else:
                commands[-1].expected.append(text)
            k += 1
        if not commands:
            raise SystemExit(f"{where}: a doctest block without a `$ ` command")
        if "run" in options and len(commands) != 1:
            raise SystemExit(f"{where}: run= needs a block of one command")
        if "approx" in options:
            try:
                rel = float(options["approx"])
            except ValueError:
                raise SystemExit(f"{where}: approx= takes a relative tolerance, e.g. approx=0.02")
            if not 0 < rel < 1:
                raise SystemExit(f"{where}: approx={options['approx']}: a relative tolerance in (0, 1)")
            stated = f"{rel * 100:g} %"
            if not any(stated in line for line in lines[max(0, i - 6):i]):
                raise SystemExit(f"{where}: approx={options['approx']} is not stated where a reader "
                                 f"sees it: the 6 lines above the mark must say \"{stated}\"")
        blocks.append(Block(path, i + 1, options, commands))
        i = j + 1
    return blocks


def normalize(lines: list[str]) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and out[-1] == "":
        out.pop()
    return out


# A number shown with a decimal point or an exponent (not part of a name or
# of a dotted version such as 2.13.0); approx= blocks compare these within
# their tolerance.
SHOWN_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\d.])")
PRINTED_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"


def literal(text: str, shown: list[float] | None) -> str:
    """The regex for literal expected text; with `shown`, its numbers become
    groups and their values are appended to `shown`."""
    if shown is None:
        return re.escape(text)
    out, at = [], 0
    for m in SHOWN_NUMBER.finditer(text):
        out.append(re.escape(text[at:m.start()]))
        out.append(PRINTED_NUMBER)
        shown.append(float(m.group(0)))
        at = m.end()
    out.append(re.escape(text[at:]))
    return "".join(out)


def pattern_for(expected: list[str], shown: list[float] | None = None) -> re.Pattern:
    parts = []
    for line in expected:
        if line.strip() == ELLIPSIS:
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*?".join(literal(p, shown) for p in line.split(ELLIPSIS)) + "\n")
    return re.compile("".join(parts), re.DOTALL)


def matches(expected: list[str], actual: list[str], rel: float | None = None) -> bool:
    """Exact but for `…`; with `rel`, the shown decimal numbers within rel."""
    text = "".join(line + "\n" for line in actual)
    shown: list[float] | None = [] if rel is not None else None
    m = pattern_for(normalize(expected), shown).fullmatch(text)
    if m is None:
        return False
    for want, got in zip(shown or [], m.groups()):
        if abs(float(got) - want) > rel * abs(want):
            return False
    return True


def make_scratch(repo: str, work: str | None, name: str) -> str:
    if work:
        scratch = os.path.join(work, name)
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
    else:
        scratch = tempfile.mkdtemp(prefix=f"doctest-{name}-")
    try:
        tracked = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True,
                                 text=True, check=True).stdout.split("\n")
        entries = sorted({t.split("/")[0] for t in tracked if t})
    except (OSError, subprocess.CalledProcessError):
        entries = [e for e in os.listdir(repo) if not e.startswith(".")]
    entries += [e for e in (".venv", "third_party") if os.path.exists(os.path.join(repo, e))]
    for entry in entries:
        if os.path.exists(os.path.join(repo, entry)):
            os.symlink(os.path.join(repo, entry), os.path.join(scratch, entry))
    return scratch


WARM_WRAPPER = """#!{python}
# `python SCRIPT.py ARGS...` as a fork of CTest's warm Python
# (tests/pytorch/warm_python.py: torch imported once), when the server
# ACCUMCHECK_WARM_PYTHON names answers; anything else, or no server: .venv's
# python itself.  Written by tests/docs/doctest_md.py.
import os
import sys

sys.path.insert(0, {tests!r})
import warm_python  # noqa: E402

argv = sys.argv[1:]
conn = warm_python._connect(os.environ.get("ACCUMCHECK_WARM_PYTHON", ""))
if conn is not None and argv and argv[0].endswith(".py"):
    conn.close()
    sys.exit(warm_python.exec_(argv))
os.execv({python!r}, [{python!r}] + argv)
"""


def warm_bin(scratch: str, venv_bin: str) -> str:
    """A folder with `python` and `python3` that run a script through
    CTest's warm Python (WARM_WRAPPER): each trainer a doc runs costs no
    `import torch` (about 1.5 s of CPU, more with torch._dynamo)."""
    folder = os.path.join(scratch, ".warm-bin")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pytorch")
        text = WARM_WRAPPER.format(python=os.path.join(venv_bin, "python"), tests=tests)
        for name in ("python", "python3"):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(folder, name), 0o755)
    return folder


def run_file(path: str, args) -> tuple[int, int, int]:
    """Returns (blocks checked, blocks not run, failures)."""
    blocks = parse_blocks(path)
    name = os.path.splitext(os.path.basename(path))[0]
    scratch = make_scratch(args.repo, args.work, name)
    venv_bin = os.path.join(args.repo, ".venv", "bin")
    have_venv = os.path.exists(os.path.join(venv_bin, "python"))
    checked = skipped = failed = 0
    fills: list[tuple[int, list[str]]] = []
    for block in blocks:
        where = f"{os.path.relpath(path, args.repo)}:{block.line}"
        if "venv" in block.options and not have_venv:
            print(f"{where}: NOT RUN: needs the project's .venv (bash scripts/venv.sh)")
            skipped += 1
            continue
        env = dict(os.environ)
        path_dirs = [os.path.dirname(os.path.abspath(args.accumcheck))]
        if "venv" in block.options:
            path_dirs.insert(0, venv_bin)
            if os.environ.get("ACCUMCHECK_WARM_PYTHON"):
                path_dirs.insert(0, warm_bin(scratch, venv_bin))
            # The package importable as `pip install .` makes it (the
            # shown commands are what an installed user types).
            env["PYTHONPATH"] = os.path.join(args.repo, "python")
        env["PATH"] = os.pathsep.join(path_dirs + [env.get("PATH", "")])
        timeout = float(block.options.get("timeout", 60))
        ok = True
        for cmd in block.commands:
            shown = cmd.text.replace("\n", "\n  ")
            command = block.options.get("run", cmd.text)
            start = time.monotonic()
            try:
                proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=scratch, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=timeout)
                output = proc.stdout.decode("utf-8", "replace")
                code = proc.returncode
            except subprocess.TimeoutExpired as e:
                output = (e.stdout or b"").decode("utf-8", "replace")
                code = None
            seconds = time.monotonic() - start
            actual = normalize(output.split("\n"))
            if args.fill and cmd.expected == [] and actual:
                cmd.expected = ["FILL"]
                fills.append((cmd.line, actual, True))
                cmd.expected = list(actual)
            elif args.fill and cmd.expected == ["FILL"]:
                fills.append((cmd.line, actual, False))
                cmd.expected = list(actual)
            problems = []
            if code is None:
                problems.append(f"timed out after {timeout:g} s")
            elif code != cmd.exit:
                problems.append(f"exit {code}, the doc says {cmd.exit}")
            rel = float(block.options["approx"]) if "approx" in block.options else None
            if not matches(cmd.expected, actual, rel):
                problems.append("output differs from the doc"
                                + (f" (numbers compared within {rel:g} relative)" if rel else ""))
            if problems:
                ok = False
                print(f"{os.path.relpath(path, args.repo)}:{cmd.line}: FAIL: $ {shown}: "
                      + "; ".join(problems))
                for d in difflib.unified_diff(normalize(cmd.expected), actual,
                                              "shown in the doc", "actual output", lineterm=""):
                    print("    " + d)
            else:
                print(f"{os.path.relpath(path, args.repo)}:{cmd.line}: ok ({seconds:.2f} s): $ {shown}")
        checked += 1
        failed += 0 if ok else 1
    if fills:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for number, actual, insert in sorted(fills, reverse=True):
            k = number  # the command's line (1-based); FILL is the line after it, or later
            if insert:
                while lines[k - 1].rstrip().endswith("\\"):
                    k += 1
                lines[k:k] = actual
                continue
            while lines[k].strip() != "FILL":
                k += 1
            lines[k:k + 1] = actual
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    if not args.work:
        shutil.rmtree(scratch, ignore_errors=True)
    return checked, skipped, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accumcheck", required=True, help="the build's accumcheck binary")
    parser.add_argument("--repo", required=True, help="the repository's root")
    parser.add_argument("--work", help="keep each file's scratch folder here (default: a temporary one)")
    parser.add_argument("--allow-missing-venv", action="store_true",
                        help="blocks marked venv are not run where .venv is missing")
    parser.add_argument("--fill", action="store_true",
                        help="(for writing docs) replace each expected output that is the one "
                        "line FILL with the command's actual output, in the file")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    args.repo = os.path.abspath(args.repo)
    total = [0, 0, 0]
    for path in args.files:
        for i, n in enumerate(run_file(os.path.abspath(path), args)):
            total[i] += n
    checked, skipped, failed = total
    print(f"doctest: {checked} block(s) checked, {failed} failed, {skipped} not run")
    if skipped and not args.allow_missing_venv:
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
