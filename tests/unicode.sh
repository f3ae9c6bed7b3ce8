#!/bin/sh
# tests/unicode.sh — tpk/text/unicode.h (through build/tests/unicode_check) against Python's
# unicodedata and codecs (Unicode 16.0.0, the tables' version: PyPI's unicodedata2 in build/pylib,
# which make deps installs; where only another version is importable the class and NFC checks are
# skipped, saying so):
#   unicode_class_all: the class of every code point 0..10FFFF (letter L*, number N*, space
#     White_Space, other; and \w, the word characters); unicode_nfc_random: NFC of 12,000 random strings byte for byte (marks in
#     random orders, long runs of marks, Hangul jamo and syllables, singletons, composition
#     exclusions, decomposables, code points of every plane, ASCII); utf8_decode_random: the code
#     points tpk__utf8_decode reads from 12,000 random byte strings, valid and not (overlongs,
#     surrogates, past U+10FFFF, truncated, stray continuation bytes), against decode("utf-8",
#     "replace"); utf8_roundtrip, utf8_encode_python: every scalar value encoded and decoded, the
#     bytes against Python's; unicode_tables_current: the header is what tools/unicode_tables.py
#     writes; unicode_cxx17: the program compiles as C++17 (g++ -pedantic) and gives the same NFC.
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup unicode
py=$(command -v python3 || echo /usr/bin/python3)
prog=$B/tests/unicode_check
[ -x "$prog" ] || { echo "FAIL unicode: $prog not built (make $prog)"; exit 1; }
"$prog" speed || echo "FAIL unicode_speed: exit status $?"

cxx=
if command -v g++ > /dev/null 2>&1; then
    if g++ -std=c++17 -Wall -Wextra -Werror -pedantic -O1 -Iinclude -x c++ tests/unicode_check.c \
        -o "$T/unicode_check_cxx" 2> "$T/cxx.log"; then cxx=$T/unicode_check_cxx
    else echo "FAIL unicode_cxx17"; sed 's/^/    /' "$T/cxx.log" | head -20; fi
else echo "    unicode_cxx17: no g++, skipped"; fi

PYTHONPATH=build/pylib "$py" tools/unicode_tables.py --check > "$T/gen.log" 2>&1; rc=$?
case $rc in
0) ok unicode_tables_current ;;
2) echo "    unicode_tables_current: skipped: $(cat "$T/gen.log")" ;;
*) echo "FAIL unicode_tables_current"; sed 's/^/    /' "$T/gen.log" ;;
esac

PYTHONPATH=build/pylib "$py" - "$prog" "$T" "$cxx" <<'EOF' || echo "FAIL unicode_python: exit status $?"
import random, subprocess, sys, unicodedata as ud

if ud.unidata_version != "16.0.0":
    try:
        import unicodedata2 as ud
    except ImportError:
        pass

prog, tmp, cxx = sys.argv[1], sys.argv[2], sys.argv[3]
rng = random.Random(1234)
same_unicode = ud.unidata_version == "16.0.0"
if not same_unicode:
    print("    unicode_class_all, unicode_nfc_random: skipped: Python's unicodedata is Unicode %s,"
          " not 16.0.0 (make deps installs unicodedata2 into build/pylib)" % ud.unidata_version)


def run(args, data=b""):
    return subprocess.run(args, input=data, stdout=subprocess.PIPE, check=True).stdout


def report(name, bad, count, show):
    if bad:
        print("FAIL %s (%d of %d)" % (name, len(bad), count))
        for b in bad[:5]:
            print("    " + show(b))
    else:
        print("ok %s (%d)" % (name, count))


# (a) classes: runs "START END CLASS" against unicodedata
def word(cp):  # Rust regex's \w: Alphabetic (L*, Nl, Other_Alphabetic), M*, Nd, Pc, Join_Control
    cat = ud.category(chr(cp))
    so = (0x24B6 <= cp <= 0x24E9 or 0x1F130 <= cp <= 0x1F149 or 0x1F150 <= cp <= 0x1F169 or
          0x1F170 <= cp <= 0x1F189)  # Other_Alphabetic outside the marks: circled, squared letters
    return 4 if cat[0] in "LM" or cat in ("Nl", "Nd", "Pc") or cp in (0x200C, 0x200D) or so else 0


def cls(cp):
    cat = ud.category(chr(cp))
    if cat[0] == "L":
        return 1 | word(cp)
    if cat[0] == "N":
        return 2 | word(cp)
    return (3 if 9 <= cp <= 13 or cp == 0x85 or cat in ("Zs", "Zl", "Zp") else 0) | word(cp)


if same_unicode:
    got = [0] * 0x110000
    covered = 0
    for line in run([prog, "classes"]).split(b"\n"):
        if line:
            a, b, c = line.split()
            a, b, c = int(a, 16), int(b, 16), int(c)
            got[a : b + 1] = [c] * (b - a + 1)
            covered += b - a + 1
    bad = [cp for cp in range(0x110000) if got[cp] != cls(cp)]
    if covered != 0x110000:
        bad.append(-1)
    report(
        "unicode_class_all",
        bad,
        0x110000,
        lambda cp: "U+%04X: %d, want %d" % (cp, got[cp], cls(cp)),
    )
else:
    print("    unicode class and NFC checks skipped: Python's Unicode is %s" % ud.unidata_version)

# (b) NFC of random strings
dec = {}
for cp in range(0x110000):
    d = ud.decomposition(chr(cp))
    if d and not d.startswith("<"):
        dec[cp] = [int(x, 16) for x in d.split()]
marks = [cp for cp in range(0x110000) if ud.combining(chr(cp))]
pairs = [(v[0], v[1]) for cp, v in dec.items() if len(v) == 2]
singles = [cp for cp, v in dec.items() if len(v) == 1]
excluded = [cp for cp, v in dec.items() if len(v) == 2 and ud.normalize("NFC", chr(cp)) != chr(cp)]
decomposable = list(dec)
seconds = sorted({b for _, b in pairs})
firsts = sorted({a for a, _ in pairs})
jamo = list(range(0x1100, 0x1200)) + list(range(0xA960, 0xA980)) + list(range(0xD7B0, 0xD800))
syllables = list(range(0xAC00, 0xD7A4))
lv = list(range(0xAC00, 0xD7A4, 28))
ascii_ = [c for c in range(0x20, 0x7F)] + [9, 13]


def anycp():
    while True:
        plane = rng.choice([0, 0, 0, 1, 2, 3, 14, 15, 16, rng.randrange(17)])
        cp = plane << 16 | rng.randrange(0x10000)
        if not 0xD800 <= cp < 0xE000 and cp != 10:
            return cp


pools = [
    lambda: rng.choice(ascii_),
    lambda: rng.choice(marks),
    lambda: rng.choice(marks),
    lambda: rng.choice(seconds),
    lambda: rng.choice(firsts),
    lambda: rng.choice(singles),
    lambda: rng.choice(excluded),
    lambda: rng.choice(decomposable),
    lambda: rng.choice(jamo),
    lambda: rng.choice(syllables),
    lambda: rng.choice(lv),
    lambda: rng.randrange(0x1100, 0x1113),
    lambda: rng.randrange(0x1161, 0x1176),
    lambda: rng.randrange(0x11A7, 0x11C3),
    lambda: rng.randrange(0x80, 0x300),
    anycp,
]


def nfc_case(i):
    if i % 50 == 0:  # a long run of marks (the counting sort), a starter before it or not
        s = [rng.choice(firsts)] if i % 100 else []
        return s + [rng.choice(marks) for _ in range(rng.randrange(33, 400))] + [0x41]
    if i % 10 == 0:  # below U+0300 only: the copy
        return [rng.randrange(0x20, 0x300) for _ in range(rng.randrange(0, 30))]
    if i % 7 == 0:  # a pair with marks shuffled after it
        a, b = rng.choice(pairs)
        ms = [b] + [rng.choice(marks) for _ in range(rng.randrange(0, 4))]
        rng.shuffle(ms)
        return [rng.choice(ascii_), a] + ms + [rng.choice(ascii_)]
    weights = rng.sample(range(len(pools)), rng.randrange(1, 5))
    return [pools[rng.choice(weights)]() for _ in range(rng.randrange(0, 40))]


cases = ["".join(map(chr, nfc_case(i))) for i in range(12000)]
data = b"".join(c.encode() + b"\n" for c in cases)
for name, exe in [("unicode_nfc_random", prog)] + ([("unicode_cxx17", cxx)] if cxx else []):
    if not same_unicode:
        break
    got = run([exe, "nfc"], data).split(b"\n")[:-1]
    want = [ud.normalize("NFC", c).encode() for c in cases]
    n = min(len(got), len(want))
    bad = [i for i in range(n) if got[i] != want[i]] + list(range(n, max(len(got), len(want))))
    show = lambda i: "%s -> %s, want %s" % (
        " ".join("%04X" % ord(c) for c in cases[i]),
        (
            got[i].decode("utf-8", "replace").encode("unicode_escape").decode()
            if i < len(got)
            else "-"
        ),
        " ".join("%04X" % ord(c) for c in ud.normalize("NFC", cases[i])),
    )
    report(name, bad, len(cases), show)

# (c) tpk__utf8_decode against decode("utf-8", "replace")
# ASCII, continuation bytes at the second byte's limits, then lead bytes and bytes never valid
edge = list(bytes.fromhex("007F 808F909FA0BF C0C1C2DFE0E1ECEDEEEFF0F1F3F4F5F7F8FBFCFEFF"))


def bytes_case(i):
    k = i % 5
    if k == 0:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 24)))
    if k == 1:  # boundary bytes only
        return bytes(rng.choice(edge) for _ in range(rng.randrange(1, 12)))
    if k == 2:  # a lead byte, then continuation-range bytes, cut anywhere
        out = []
        for _ in range(rng.randrange(1, 5)):
            out.append(rng.choice(edge[8:]))
            out += [rng.choice(edge[2:8] + [0x41]) for _ in range(rng.randrange(0, 4))]
        return bytes(out)
    if k == 3:  # surrogates, overlongs, past U+10FFFF, written out in full
        cp = rng.choice(
            [
                rng.randrange(0xD800, 0xE000),
                rng.randrange(0x110000, 0x200000),
                rng.randrange(0, 0x800),
            ]
        )
        n = rng.choice([2, 3, 4]) if cp < 0x10000 else 4
        lead = {2: 0xC0, 3: 0xE0, 4: 0xF0}[n]
        b = [lead | cp >> 6 * (n - 1)] + [0x80 | (cp >> 6 * j) & 0x3F for j in range(n - 2, -1, -1)]
        return bytes(x & 0xFF for x in b[: rng.randrange(1, n + 1)]) + bytes([0x41])
    s = "".join(chr(anycp()) for _ in range(rng.randrange(1, 8))).encode()  # valid, then damaged
    b = bytearray(s)
    for _ in range(rng.randrange(0, 3)):
        j = rng.randrange(len(b))
        op = rng.randrange(3)
        if op == 0:
            b[j] = rng.randrange(256)
        elif op == 1:
            del b[j]
        else:
            b.insert(j, rng.choice(edge))
    return bytes(b)


bcases = [bytes_case(i) for i in range(12000)]
got = run([prog, "decode"], b"".join(c.hex().encode() + b"\n" for c in bcases)).split(b"\n")[:-1]
want = [" ".join("%X" % ord(c) for c in b.decode("utf-8", "replace")).encode() for b in bcases]
n = min(len(got), len(want))
bad = [i for i in range(n) if got[i] != want[i]] + list(range(n, max(len(got), len(want))))
show = lambda i: "%s -> %s, want %s" % (
    bcases[i].hex(" "),
    got[i].decode() if i < len(got) else "-",
    want[i].decode(),
)
report("utf8_decode_random", bad, len(bcases), show)

# (d) every scalar value encoded, in order, against Python's encoder; the C side checks decoding
out = run([prog, "roundtrip", tmp + "/scalars.bin"]).decode()
sys.stdout.write(out)
want = "".join(map(chr, list(range(0xD800)) + list(range(0xE000, 0x110000)))).encode()
got = open(tmp + "/scalars.bin", "rb").read()
n = min(len(got), len(want))
first = next((i for i in range(n) if got[i] != want[i]), n)
bad = [] if got == want else [first]
report("utf8_encode_python", bad, 0x110000 - 0x800, lambda i: "first difference at byte %d" % i)
EOF
