"""tools/docs_check.py — make format-check's check of the documents (README.md, docs/DESIGN.md by
default): what they quote must still be so. Outside fenced code blocks it checks that

  - every repository path quoted in backticks (include/..., tests/..., examples/..., bench/...,
    kernels/..., tools/..., docs/..., and headers named as <tpk/...> or tpk/...) exists, as a file
    or a folder; a glob (tests/test_*.c) must match something; a <placeholder> is not checked;
  - every claim "N lines" names its file: the nearest path before it in the same paragraph, whose
    line count must lie within 10% of N;
  - every link to a file resolves, and every #anchor (in the same document or in another .md
    file) is a heading there, the anchor made as GitHub makes it (lower case, punctuation but
    '-' and '_' dropped, each space a '-', a repeated heading suffixed -1, -2, ...).
  - a document with a "## Contents" list links there every ## and ### heading after it.

Prints each problem as FILE:LINE: what, and exits 1 when there is one.

    python3 tools/docs_check.py [FILE.md...]   (default: README.md docs/DESIGN.md)
"""

import glob
import os
import re
import sys

DEFAULT = ["README.md", "docs/DESIGN.md"]
TOPS = "include|tests|examples|bench|kernels|tools|docs"
PATH_RE = re.compile(r"(?<![\w/.<-])(?:%s)/[\w.*+/<>-]*" % TOPS)
HEADER_RE = re.compile(r"(?<![\w/.-])tpk/[\w./]*")
LINES_RE = re.compile(r"\b(\d[\d,]*) lines\b")
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TOLERANCE = 0.10


def prose(text):
    """Yields (line number, line) outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(text.split("\n")):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield i + 1, line


def anchors(path):
    """The anchors GitHub makes for the headings of a Markdown file."""
    seen, out = {}, set()
    for _, line in prose(open(path, encoding="utf-8").read()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else "%s-%d" % (a, n))
    return out


def exists(path):
    if "<" in path or ">" in path:
        return True
    if any(c in path for c in "*?["):
        return bool(glob.glob(path))
    return os.path.exists(path)


def quoted_paths(line):
    """(column, path) of each repository path inside a backtick span of the line."""
    out = []
    for span in re.finditer(r"`([^`]+)`", line):
        for m in PATH_RE.finditer(span.group(1)):
            out.append((span.start(1) + m.start(), m.group(0).rstrip(".,:;")))
        for m in HEADER_RE.finditer(span.group(1)):
            p = m.group(0).rstrip(".,:;")
            out.append((span.start(1) + m.start(), "include/" + p))
    return out


def line_count(path):
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def check(doc):
    bad = []
    text = open(doc, encoding="utf-8").read()
    here = os.path.dirname(doc)
    own = anchors(doc)
    paragraph = []  # (line number, line) of the current paragraph
    for n, line in prose(text):
        if not line.strip():
            paragraph = []
            continue
        paragraph.append((n, line))
        for _, p in quoted_paths(line):
            if not exists(p):
                bad.append("%s:%d: `%s` does not exist" % (doc, n, p))
        for m in LINK_RE.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(here, file)) if file else doc
            if file and not os.path.exists(path):
                bad.append("%s:%d: link to %s: no such file" % (doc, n, file))
                continue
            if anchor:
                known = own if not file else anchors(path) if path.endswith(".md") else set()
                if anchor not in known:
                    bad.append("%s:%d: link %s: no heading with that anchor" % (doc, n, target))
        for m in LINES_RE.finditer(line):
            claim = int(m.group(1).replace(",", ""))
            before = [(ln, c, p) for ln, l in paragraph for c, p in quoted_paths(l)]
            before += [
                (ln, lm.start(), lm.group(1).partition("#")[0])
                for ln, l in paragraph
                for lm in LINK_RE.finditer(l)
            ]
            before = [b for b in before if b[0] < n or b[1] < m.start()]
            if not before:
                bad.append("%s:%d: '%s' names no file before it" % (doc, n, m.group(0)))
                continue
            _, _, p = max(before)
            if not os.path.isfile(p):
                p = os.path.normpath(os.path.join(here, p))
            if not os.path.isfile(p):
                bad.append("%s:%d: '%s' is about %s, not a file" % (doc, n, m.group(0), p))
                continue
            real = line_count(p)
            if abs(real - claim) > TOLERANCE * real:
                bad.append(
                    "%s:%d: '%s' about %s, which has %d lines" % (doc, n, m.group(0), p, real)
                )
    return bad + contents(doc, text)


def contents(doc, text):
    """A "## Contents" list must link every ## and ### heading after it."""
    if "\n## Contents\n" not in text:
        return []
    head, _, rest = text.partition("\n## Contents\n")
    toc, _, body = rest.partition("\n## ")
    linked = set(re.findall(r"\]\(#([^)]+)\)", toc))
    bad = []
    for a in sorted(anchors_of_levels(doc, "\n## " + body)):
        if a not in linked:
            bad.append("%s: the Contents list lacks the heading #%s" % (doc, a))
    return bad


def anchors_of_levels(doc, text):
    """The anchors of the ## and ### headings of text (numbered as in the whole document)."""
    every = anchors(doc)
    out = set()
    for _, line in prose(text):
        m = re.match(r"#{2,3}\s+(.*?)\s*#*\s*$", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(a if a in every else a + "-1")
    return out


def main(argv):
    docs = argv or DEFAULT
    bad = [b for d in docs for b in check(d)]
    for b in bad:
        print(b)
    print("docs-check: %d files, %s" % (len(docs), "%d problems" % len(bad) if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
