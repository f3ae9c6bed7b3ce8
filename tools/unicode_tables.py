#!/usr/bin/env python3
"""tools/unicode_tables.py — writes include/tpk/text/unicode_data.h, the tables of
tpk/text/unicode.h, from Python's unicodedata (standard library only):

  class runs    the GPT-2 pre-tokenizer's class of every code point (letter: L*, number: N*,
                space: White_Space = U+0009..000D, U+0085, Zs, Zl, Zp; else other) and whether
                it is a word character (Rust regex's Unicode \w, added tokens' single_word) as runs
  NFC runs      per code point its canonical combining class and NFC quick-check flags (No: NFC
                never keeps it; Maybe: it can be the second of a primary composition) as runs
  decompositions  every canonical decomposition, one level (cp -> a [b]), sorted by cp
  compositions  every primary composition pair (a b -> c: NFC(a b) == c), sorted by (a, b)

    python3 tools/unicode_tables.py            (re)write the header
    python3 tools/unicode_tables.py --check    exit 1 when the header differs from what it writes
    --any-version                              accept a unicodedata other than Unicode 16.0.0

The Unicode version is the one of Hugging Face tokenizers' regex engine (tokenizers 0.23.3, probed
with characters new in Unicode 15 and 16: 16.0.0). Debian 12's Python has Unicode 14.0.0: the data
then comes from PyPI's unicodedata2 16.0.0 (make deps installs it into build/pylib;
PYTHONPATH=build/pylib); another version's tables would silently differ, so it is refused.
"""

import os
import sys
import unicodedata as ud

VERSION = "16.0.0"
if ud.unidata_version != VERSION:
    try:
        import unicodedata2 as ud  # noqa: F811  (PyPI: a newer Unicode than the standard library's)
    except ImportError:
        pass
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include", "tpk", "text")
OUT = os.path.normpath(os.path.join(OUT, "unicode_data.h"))
WIDTH = 100
MAX_CP = 0x110000
NFC_NO, NFC_MAYBE = 0x100, 0x200


# Other_Alphabetic code points outside the marks (Mn, Mc): circled and squared Latin letters (So)
OTHER_ALPHA_SO = [(0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189)]


def is_word(cp):
    """Rust regex's Unicode \\w: Alphabetic (L*, Nl, Other_Alphabetic), M*, Nd, Pc, Join_Control."""
    cat = ud.category(chr(cp))
    if cat[0] in "LM" or cat in ("Nl", "Nd", "Pc") or cp in (0x200C, 0x200D):
        return True
    return any(a <= cp <= b for a, b in OTHER_ALPHA_SO)


def uc_class(cp):
    """bits 0-1: 1 letter (L*), 2 number (N*), 3 space (White_Space), 0 other; bit 2: \\w"""
    cat = ud.category(chr(cp))
    w = 4 if is_word(cp) else 0
    if cat[0] == "L":
        return 1 | w
    if cat[0] == "N":
        return 2 | w
    if 0x09 <= cp <= 0x0D or cp == 0x85 or cat in ("Zs", "Zl", "Zp"):
        return 3 | w
    return 0 | w


def runs(values):
    """[(start, value)] where the value changes, the first at 0."""
    out, prev = [], None
    for cp, v in enumerate(values):
        if v != prev:
            out.append((cp, v))
            prev = v
    return out


def tables():
    classes = [uc_class(cp) for cp in range(MAX_CP)]
    dec = {}
    for cp in range(MAX_CP):
        d = ud.decomposition(chr(cp))
        if d and not d.startswith("<"):
            dec[cp] = [int(x, 16) for x in d.split()]
    assert all(1 <= len(v) <= 2 for v in dec.values())
    # the second of a pair never decomposes: unicode.h expands only the first, iteratively
    assert not any(len(v) == 2 and v[1] in dec for v in dec.values())
    depth = {}
    for cp in dec:
        k, c = 0, cp
        while c in dec:
            k, c = k + 1, dec[c][0]
        depth[cp] = k
    nfd_max = max(len(ud.normalize("NFD", chr(c))) for c in dec)
    assert max(depth.values()) <= 4 and nfd_max <= max(depth.values()) + 1
    pairs = sorted(
        (v[0], v[1], cp)
        for cp, v in dec.items()
        if len(v) == 2 and ud.normalize("NFC", chr(v[0]) + chr(v[1])) == chr(cp)
    )
    # a primary composition's first character is a starter (unicode.h's composition relies on it)
    assert all(ud.combining(chr(a)) == 0 for a, _, _ in pairs)
    maybe = {b for _, b, _ in pairs} | set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    props = []
    for cp in range(MAX_CP):
        ch = chr(cp)
        v = ud.combining(ch)
        if 0xD800 <= cp < 0xE000:
            pass
        elif ud.normalize("NFC", ch) != ch:
            v |= NFC_NO
        if cp in maybe:
            v |= NFC_MAYBE
        assert v & (NFC_NO | NFC_MAYBE) != NFC_NO | NFC_MAYBE
        assert cp >= 0x300 or v == 0  # unicode.h's fast path: below U+0300 nothing to do
        props.append(v)
    return classes, runs(classes), runs(props), sorted(dec.items()), pairs, max(depth.values())


def wrap(items, indent="    ", per_line=None):
    lines, line, k = [], indent, 0
    for it in items:
        piece = it + ","
        if len(line) + len(piece) + (1 if line != indent else 0) > WIDTH or k == per_line:
            k = 0
            lines.append(line)
            line = indent
        line += (" " if line != indent else "") + piece
        k += 1
    if line != indent:
        lines.append(line)
    return "\n".join(lines)


def table_fn(name, ctype, count, items, what, per_line=None):
    return (
        "/* %s */\n#define %s %d\nstatic inline const %s *%s(void) {\n"
        "    static const %s t[%d] = {\n%s\n    };\n    return t;\n}\n"
        % (what, name.upper(), count, ctype, name, ctype, count, wrap(items, "        ", per_line))
    )


def render():
    classes, cls_runs, nfc_runs, dec, pairs, depth = tables()
    dec_items = []
    for cp, v in dec:
        b = v[1] if len(v) == 2 else 0
        dec_items.append("0x%XULL" % (cp << 42 | v[0] << 21 | b))
    out = []
    out.append(
        "/* tpk/text/unicode_data.h — the Unicode %s tables of tpk/text/unicode.h: character\n"
        " * classes, canonical combining classes with NFC quick-check flags, canonical "
        "decompositions,\n"
        " * primary compositions.\n"
        " *\n"
        " * GENERATED by tools/unicode_tables.py from Unicode %s (Python's unicodedata): do not "
        "edit;\n"
        " * run `python3 tools/unicode_tables.py` instead. Each table is a function returning "
        "its array\n"
        " * (no global variables in headers). */\n" % (VERSION, ud.unidata_version)
    )
    out.append("#ifndef TPK_TEXT_UNICODE_DATA_H\n#define TPK_TEXT_UNICODE_DATA_H\n")
    out.append("/* clang-format off */ /* generated: the layout is the generator's */\n")
    out.append("#include <stdint.h>\n")
    out.append('#define TPK__UNICODE_VERSION "%s"\n' % ud.unidata_version)
    out.append(
        "/* The longest chain of canonical decompositions through first characters (U+1F82 ->"
        " U+1F02 U+0345,\n * U+1F02 -> U+1F00 U+0300, U+1F00 -> U+03B1 U+0313: 3); a full"
        " decomposition has at most\n * TPK__UC_DECOMP_DEPTH + 1 code points. */\n"
        "#define TPK__UC_DECOMP_DEPTH %d\n" % depth
    )
    out.append(
        table_fn(
            "tpk__uc_ascii_class",
            "uint8_t",
            128,
            [str(c) for c in classes[:128]],
            "The class of each ASCII character (bits 0-1: TPK__UC_OTHER 0, LETTER 1, NUMBER 2,"
            " SPACE 3;\n * bit 2: a word character, \\w).",
            16,
        )
    )
    out.append(
        table_fn(
            "tpk__uc_class_runs",
            "uint32_t",
            len(cls_runs),
            ["0x%X" % (s << 3 | v) for s, v in cls_runs],
            "The class of every code point as runs [%d]: start << 3 | class (bits 0-1) | \\w"
            " (bit 2),\n * by start, the first at 0; a run lasts until the next one's start."
            % len(cls_runs),
        )
    )
    out.append(
        table_fn(
            "tpk__uc_nfc_runs",
            "uint32_t",
            len(nfc_runs),
            ["0x%X" % (s << 11 | v) for s, v in nfc_runs],
            "NFC properties of every code point as runs [%d]: start << 11 | value, by start, the"
            " first at\n * 0; value: bits 0-7 the canonical combining class, bit 8 NFC_QC=No"
            " (NFC never keeps it),\n * bit 9 NFC_QC=Maybe (the second character of a primary"
            " composition, Hangul V and T jamo).\n * Every code point below U+0300 has value 0."
            % len(nfc_runs),
        )
    )
    out.append(
        table_fn(
            "tpk__uc_decomp",
            "uint64_t",
            len(dec_items),
            dec_items,
            "Canonical decompositions, one level [%d]: cp << 42 | a << 21 | b (b = 0: a singleton,"
            " cp -> a),\n * by cp; b never decomposes, a may (Hangul syllables are not here:"
            " computed)." % len(dec_items),
        )
    )
    out.append(
        table_fn(
            "tpk__uc_comp",
            "uint64_t",
            len(pairs),
            ["0x%XULL" % (a << 42 | b << 21 | c) for a, b, c in pairs],
            "Primary compositions [%d]: a << 42 | b << 21 | c for NFC(a b) = c, by (a, b); a is"
            " a starter\n * (Hangul LV and LVT are not here: computed)." % len(pairs),
        )
    )
    out.append("/* clang-format on */\n")
    out.append("#endif\n")
    return "\n".join(out)


def main(argv):
    if ud.unidata_version != VERSION and "--any-version" not in argv:
        sys.stderr.write(
            "unicode_tables.py: this Python's unicodedata is Unicode %s, the tables are %s "
            "(--any-version to write them anyway)\n" % (ud.unidata_version, VERSION)
        )
        return 2
    text = render()
    if "--check" in argv:
        old = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if old != text:
            print("unicode_tables.py: %s differs from what the generator writes" % OUT)
            return 1
        print("unicode_tables.py: %s is up to date (Unicode %s)" % (OUT, ud.unidata_version))
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print("unicode_tables.py: wrote %s (Unicode %s)" % (OUT, ud.unidata_version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
