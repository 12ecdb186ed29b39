#!/usr/bin/env python3
"""Docs.links: every relative link in README.md and docs/*.md leads
somewhere.  A link to a file names one that exists in the repository; a
link to an anchor (`#name`, or `page.md#name`) names a heading of that page
(GitHub's slug of it: lower case, punctuation but `-` and `_` dropped,
spaces as `-`, a repeated heading's slug suffixed -1, -2, ...) or an
`<a id="name">` in it.  Links that leave the repository (a scheme such as
https:) are not followed.

Usage: links.py --repo ROOT [PAGE.md ...]   (default: README.md, docs/*.md)
Exit 0: every link resolves; 1: the broken ones listed, one a line, as
PAGE:LINE: LINK: what is missing; 2: bad arguments."""

import argparse
import glob
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", text)              # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)             # punctuation (keeps _ and -)
    return text.replace(" ", "-")


def lines_outside_fences(path):
    """(line number, text) of each line not inside a fenced block."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m:
                if fence is None:
                    fence = m.group(1)
                elif m.group(1) == fence:
                    fence = None
                continue
            if fence is None:
                yield n, line


_ANCHORS = {}  # page -> its anchors, each page parsed once a run


def anchors(path, cache=_ANCHORS):
    """The anchors a link into page `path` may name."""
    if path not in cache:
        found, seen = set(), {}
        for _, line in lines_outside_fences(path):
            found.update(ANCHOR_TAG.findall(line))
            m = HEADING.match(line)
            if m:
                s = slug(m.group(2))
                k = seen.get(s, 0)
                seen[s] = k + 1
                found.add(s if k == 0 else "%s-%d" % (s, k))
        cache[path] = found
    return cache[path]


def broken(page, repo):
    """Each broken link of page: (line, link, what is missing).  A link's
    text may run over lines, as a wrapped paragraph's does."""
    kept = {n: line for n, line in lines_outside_fences(page)}
    text = "".join(re.sub(r"`[^`\n]*`", "", kept.get(n, "\n"))  # code spans hold no links
                   for n in range(1, max(kept, default=0) + 1))
    for m in LINK.finditer(text):
        link, n = m.group(1), text.count("\n", 0, m.start(1)) + 1
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", link):
            continue  # https:, mailto: ...: outside the repository
        target, _, anchor = link.partition("#")
        path = os.path.normpath(os.path.join(os.path.dirname(page), target)) if target else page
        if not os.path.exists(path):
            yield n, link, "no file %s" % os.path.relpath(path, repo)
        elif anchor and path.endswith(".md") and anchor not in anchors(path):
            yield n, link, "no heading or <a id> '%s' in %s" % (anchor, os.path.relpath(path, repo))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="the repository's root")
    ap.add_argument("pages", nargs="*", help="pages to check (default: README.md and docs/*.md)")
    a = ap.parse_args()
    pages = a.pages or [os.path.join(a.repo, "README.md")] + sorted(glob.glob(os.path.join(a.repo, "docs", "*.md")))
    bad = 0
    for page in pages:
        if not os.path.isfile(page):
            print("links.py: no page %s" % page, file=sys.stderr)
            return 2
        for n, link, why in broken(os.path.abspath(page), os.path.abspath(a.repo)):
            print("%s:%d: %s: %s" % (os.path.relpath(page, a.repo), n, link, why))
            bad += 1
    print("%d page(s), %d broken link(s)" % (len(pages), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
