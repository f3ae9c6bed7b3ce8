"""tools/format_check.py — make format-check: the C, C++, CUDA and Python sources follow the
project's format (.clang-format, .editorconfig; Python as black -l 100 writes it) where a machine
can check it without a particular formatter: lines of at most 100 characters, no tab, no
trailing space, a final newline, UTF-8. Prints each offending line as FILE:LINE: what, and exits
1 when there is one.

    python3 tools/format_check.py [FILE...]   (default: every tracked *.c *.h *.cu *.cuh *.cpp *.py)
"""

import subprocess
import sys

WIDTH = 100
PATTERNS = ["*.c", "*.h", "*.cu", "*.cuh", "*.cpp", "*.py"]


def check(path):
    bad = []
    try:
        text = open(path, "rb").read().decode("utf-8")
    except UnicodeDecodeError as e:
        return ["%s: not UTF-8 (%s)" % (path, e)]
    if text and not text.endswith("\n"):
        bad.append("%s: no newline at the end" % path)
    for i, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")):
        where = "%s:%d:" % (path, i + 1)
        if len(line) > WIDTH:
            bad.append("%s %d characters (at most %d)" % (where, len(line), WIDTH))
        if "\t" in line:
            bad.append("%s a tab (indent with spaces)" % where)
        if line != line.rstrip():
            bad.append("%s trailing whitespace" % where)
    return bad


def main(argv):
    files = argv or subprocess.check_output(["git", "ls-files"] + PATTERNS).decode().split()
    bad = [b for f in files for b in check(f)]
    for b in bad:
        print(b)
    print("format-check: %d files, %s" % (len(files), "%d problems" % len(bad) if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
