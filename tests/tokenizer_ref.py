"""tests/tokenizer_ref.py — tpk/text/tokenizer.h against Hugging Face `tokenizers`.

usage: tokenizer_ref.py BUILD OUTDIR
       tokenizer_ref.py --fixture DIR    (re)writes the committed fixture tests/tokenizer/: a
                                         GPT-2-style tokenizer.json of 1,000 tokens and
                                         golden.txt, 120 strings (hex) and the ids Hugging Face
                                         gives them, for tests/tokenizer.sh where tokenizers is
                                         not installed

Trains byte-level BPE tokenizers with `tokenizers` on local text (README.md, docs/DESIGN.md and the
license texts of /usr/share/common-licenses):
  gpt2        GPT-2's settings (ByteLevel, no prefix space, "<|endoftext|>"), as tokenizer.json
  gpt2_files  the same model as GPT-2's vocab.json + merges.txt
  neox        GPT-NeoX's: an NFC normalizer, a prefix space, NeoX's whitespace added tokens, added
              tokens with lstrip, rstrip, single_word, normalized and not (one NFC-normalized)
  plain       merges ignored where a word is a token (ignore_merges), no regex split (use_regex
              false), merges written as pairs
then encodes >= 10,000 strings with each (the files' lines and paragraphs; random Unicode from
every plane; combining marks; emoji with joiners; whitespace runs; digits of many scripts;
contractions; the added tokens inside text; invalid UTF-8, whose expected ids are those of its
U+FFFD-replaced text) through BUILD/tests/tokenizer_check and compares id for id; decodes every
encoding, 2,000 random id sequences (invalid UTF-8 among them) and, with skip_special, the
strings holding special tokens, byte for byte; and checks decode(encode(x)) = x for the valid
strings with gpt2. Prints "ok NAME" / "FAIL NAME" lines; also writes OUTDIR/gpt2/tokenizer.json for
tests/tokenizer.sh.
"""
import glob
import os
import random
import struct
import subprocess
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import trainers

build, out = sys.argv[1], sys.argv[2]
fixture = build == "--fixture"
check = os.path.join(build, "tests", "tokenizer_check")
rng = random.Random(2026)

files = ["README.md", "docs/DESIGN.md"] + sorted(
    f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f))
texts = []
for f in files:
    with open(f, "rb") as fh:
        texts.append(fh.read().decode("utf-8", "replace"))


def train(pre, norm=None, special=("<|endoftext|>",), vocab=3000):
    t = Tokenizer(models.BPE())
    if norm:
        t.normalizer = norm
    t.pre_tokenizer = pre
    t.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=list(special),
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    t.train(files, tr)
    return t


toks = {}
toks["gpt2"] = train(pre_tokenizers.ByteLevel(add_prefix_space=False),
                     vocab=1000 if fixture else 3000)
neox = train(pre_tokenizers.ByteLevel(add_prefix_space=True), normalizers.NFC(),
             ("<|endoftext|>", "<|padding|>"), 2500)
neox.add_tokens([AddedToken(" " * k, normalized=True) for k in (2, 4, 8)] +
                [AddedToken("\t\t", normalized=True)])
neox.add_tokens([AddedToken("<mask>", lstrip=True, normalized=False),
                 AddedToken("[X]", rstrip=True, normalized=False),
                 AddedToken("word", single_word=True, normalized=True),
                 AddedToken("e\u0301x", normalized=True)])
neox.add_special_tokens([AddedToken("<|sep|>", normalized=False)])
toks["neox"] = neox
g = toks["gpt2"]
vocab = g.get_vocab(with_added_tokens=False)
ranked = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
          for m in __import__("json").loads(g.to_str())["model"]["merges"]]
plain = Tokenizer(models.BPE(vocab=vocab, merges=ranked, ignore_merges=True))
plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
plain.decoder = decoders.ByteLevel()
plain.add_special_tokens(["<|endoftext|>"])
toks["plain"] = plain
for name, t in ({} if fixture else toks).items():
    os.makedirs(os.path.join(out, name), exist_ok=True)
    t.save(os.path.join(out, name, "tokenizer.json"))
# GPT-2's two files, and the tokenizer Hugging Face makes of them (+ its special token)
os.makedirs(os.path.join(out, "work" if fixture else "gpt2_files"), exist_ok=True)
gdir = os.path.join(out, "work" if fixture else "gpt2_files")
g.model.save(gdir)
gf = Tokenizer(models.BPE.from_file(os.path.join(gdir, "vocab.json"),
                                    os.path.join(gdir, "merges.txt")))
gf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
gf.decoder = decoders.ByteLevel()
gf.add_special_tokens(["<|endoftext|>"])
toks["gpt2_files"] = gf

# ---- the strings ----------------------------------------------------------------------------
strings = []  # bytes
for t in texts:
    lines = t.split("\n")
    strings += [ln.encode() for ln in lines[:400] if ln]
    strings += [p.encode() for p in t.split("\n\n")[:60]]
    strings.append(t[:20000].encode())  # a long stretch, whole
spaces = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x85", "\xa0", "\u1680", "\u2000", "\u2005",
          "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u180e", "\u200b", "\ufeff"]
digits = "0123456789\u0660\u0669\u0966\u096f\uff10\uff19\u00b2\u00bd\u2167\u216b\u3007\U0001d7ce"
marks = [chr(c) for c in list(range(0x300, 0x370)) + list(range(0x1ab0, 0x1abf)) +
         list(range(0x20d0, 0x20f1)) + [0x302a, 0x3099, 0x309a, 0x0f71, 0x0f72, 0x0f74]]
contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "\u2019s", "'", "''"]
specials = ["<|endoftext|>", "<|padding|>", "<|sep|>", "<mask>", "[X]", "word", "e\u0301x",
            "\u00e9x"]
emoji = ["\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u2764\ufe0f",
         "\U0001f44d\U0001f3fd", "\U0001f1fa\U0001f1f8", "\U0001fae8", "\U0001f979"]
scripts = ["hello", "Hello", "WORLD", "caf\u00e9", "cafe\u0301", "\u0436\u0438\u0437\u043d\u044c",
           "\u4e2d\u6587\u5b57", "\u65e5\u672c\u8a9e", "\ud55c\uad6d\uc5b4", "\u1100\u1161\u11a8",
           "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u05e2\u05d1\u05e8\u05d9\u05ea",
           "\u0939\u093f\u0928\u094d\u0926\u0940", "\u0e44\u0e17\u0e22", "\u03b1\u03b2\u03b3",
           "\U00020000\U0002a6d6", "\U00031350", "\u1c89", "\U00010d4a", "\U0001ccf5"]


def rand_cp():
    r = rng.random()
    if r < 0.3:  # any plane, assigned or not
        c = rng.randrange(0x110000)
    elif r < 0.5:
        c = rng.randrange(0x10000)
    elif r < 0.7:
        c = rng.randrange(0x20, 0x7f)
    elif r < 0.8:
        c = rng.randrange(0x80, 0x800)
    else:
        c = rng.choice([0x1f300, 0x20000, 0xe000, 0xf0000, 0x10000, 0x1d400, 0xac00]) + \
            rng.randrange(0x400)
    return chr(c) if not 0xd800 <= c < 0xe000 else "?"


pieces = [lambda: rand_cp(), lambda: rng.choice(spaces), lambda: rng.choice(digits),
          lambda: rng.choice(marks), lambda: rng.choice(contractions),
          lambda: rng.choice(specials), lambda: rng.choice(emoji), lambda: rng.choice(scripts),
          lambda: " " * rng.randrange(1, 6), lambda: rng.choice(spaces) * rng.randrange(2, 5)]
for i in range(6500):
    k = rng.randrange(1, 24)
    strings.append("".join(rng.choice(pieces)() for _ in range(k)).encode("utf-8"))
for i in range(800):  # whitespace runs before and after words
    s = "".join(rng.choice(spaces) for _ in range(rng.randrange(1, 8)))
    strings.append((s + rng.choice(scripts) + s[::-1] + rng.choice(digits)).encode())
for i in range(1500):  # invalid UTF-8: stray, truncated, overlong, surrogate, > U+10FFFF bytes
    good = "".join(rng.choice(pieces)() for _ in range(rng.randrange(0, 6))).encode()
    bad = rng.choice([b"\x80", b"\xff", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
                      b"\xf4\x90\x80\x80", b"\xf0\x9f\x98", b"\xe2\x82", b"\xc3", b"\xfe\xfe",
                      bytes([rng.randrange(256) for _ in range(rng.randrange(1, 6))])])
    cut = rng.randrange(len(good) + 1)
    strings.append(good[:cut] + bad + good[cut:])
strings += [b"", b" ", b"  ", b"\n\n\n", b"'s", b"a'll", b" 's", b"123 456", b"<|endoftext|>",
            b"x<|endoftext|>y", b"a" * 3000, b" " * 500, "\u00e9".encode() * 300]
assert len(strings) >= 10000, len(strings)
if fixture:  # 120 strings: lines, random Unicode, whitespace runs, invalid UTF-8, the specials
    g, picks = toks["gpt2"], []
    n = len(strings)
    for lo, hi, k in [(0, 1000, 30), (n - 9800, n - 2400, 60), (n - 2300, n - 1500, 10),
                      (n - 1500, n - 13, 12), (n - 13, n, 8)]:
        picks += rng.sample(strings[lo:hi], k)
    os.makedirs(out, exist_ok=True)
    g.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "golden.txt"), "w") as fh:
        for b in picks:
            ids = g.encode(b.decode("utf-8", "replace"), add_special_tokens=False).ids
            fh.write(b.hex() + "\t" + " ".join(map(str, ids)) + "\n")
    __import__("shutil").rmtree(os.path.join(out, "work"))
    sys.exit(0)


def run(args, stdin=None):
    p = subprocess.run([check] + args, capture_output=True)
    if p.returncode:
        raise RuntimeError(" ".join(args) + ": " + p.stderr.decode(errors="replace"))


def records(bs):
    return b"".join(struct.pack("<I", len(b)) + b for b in bs)


def read_records(path):
    b, p, r = open(path, "rb").read(), 0, []
    while p < len(b):
        (n,) = struct.unpack_from("<I", b, p)
        r.append(b[p + 4:p + 4 + n])
        p += 4 + n
    return r


def show(b):
    return repr(b[:80])


work = os.path.join(out, "work")
os.makedirs(work, exist_ok=True)
rin, rout = os.path.join(work, "in.bin"), os.path.join(work, "out.txt")
with open(rin, "wb") as fh:
    fh.write(records(strings))
texts_u = [s.decode("utf-8", "replace") for s in strings]
failed = 0


def report(name, bad, n, what):
    global failed
    if bad is None:
        print(f"ok tokenizer_{name} ({n} {what})")
    else:
        failed += 1
        print(f"FAIL tokenizer_{name}: {bad}")


for name, t in toks.items():
    d = os.path.join(out, name)
    want = [e.ids for e in t.encode_batch(texts_u, add_special_tokens=False)]
    try:
        run(["encode", d, rin, rout])
        got = [[int(x) for x in ln.split()] for ln in open(rout).read().split("\n")[:-1]]
    except RuntimeError as e:
        report(f"{name}_encode", str(e), 0, "")
        continue
    bad = None
    if len(got) != len(want):
        bad = f"{len(got)} encodings for {len(want)} strings"
    for s, a, b in zip(strings, got, want):
        if a != b and bad is None:
            bad = f"{show(s)}: ids {a[:24]} against Hugging Face's {b[:24]}"
    report(f"{name}_encode", bad, len(strings), "strings, id for id, against Hugging Face")
    # decode: every encoding, then random id sequences (partial UTF-8 among them)
    V = t.get_vocab_size(with_added_tokens=True)
    seqs = want + [[rng.randrange(V) for _ in range(rng.randrange(1, 20))] for _ in range(2000)]
    din, dout = os.path.join(work, "ids.txt"), os.path.join(work, "dec.bin")
    with open(din, "w") as fh:
        fh.write("".join(" ".join(map(str, q)) + "\n" for q in seqs))
    for skip in (False, True):
        wantd = [t.decode(q, skip_special_tokens=skip).encode() for q in seqs]
        try:
            run(["decode", d, din, dout] + (["skip"] if skip else []))
            gotd = read_records(dout)
        except RuntimeError as e:
            report(f"{name}_decode", str(e), 0, "")
            break
        bad = None if len(gotd) == len(wantd) else f"{len(gotd)} decodings for {len(wantd)}"
        for q, a, b in zip(seqs, gotd, wantd):
            if a != b and bad is None:
                bad = f"ids {q[:16]}: {show(a)} against Hugging Face's {show(b)}"
        report(f"{name}_decode{'_skip_special' if skip else ''}", bad, len(seqs),
               "id sequences, byte for byte, against Hugging Face")
    if name == "gpt2":  # decode(encode(x)) = x, for valid UTF-8 (independent of the library)
        run(["decode", d, rout, dout])
        back = read_records(dout)
        bad, n = None, 0
        for s, b in zip(strings, back):
            try:
                s.decode("utf-8")
            except UnicodeDecodeError:
                continue
            n += 1
            if s != b and bad is None:
                bad = f"{show(s)} came back as {show(b)}"
        report("gpt2_round_trip", bad, n, "valid UTF-8 strings: decode(encode(x)) = x")
print(f"tokenizer_ref: {len(strings)} strings, {len(toks)} tokenizers, {failed} failed")
