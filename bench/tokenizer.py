"""bench/tokenizer.py — encoding speed on one core: tpk's tokenizer (bench/tokenizer.c) next to
Hugging Face tokenizers on the same text with the same tokenizer.

usage: tokenizer.py BENCH_BINARY [MB]

A byte-level BPE (GPT-2's settings, up to 32,000 tokens) is trained by tokenizers on the license
texts, README.md and docs/DESIGN.md; the text, repeated to MB megabytes (default 20), is encoded
line by line (each line with its newline: a batch of documents; encode_batch for Hugging Face) by
each, three times; the best and the first (empty caches) MB/s are printed with their ratio.
Hugging Face runs with one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false). Both give the
same ids (checked).
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

binary = sys.argv[1]
mb = float(sys.argv[2]) if len(sys.argv) > 2 else 20
files = ["README.md", "docs/DESIGN.md"] + sorted(
    f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f))
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.train(files, trainers.BpeTrainer(vocab_size=32000, min_frequency=2,
                                   special_tokens=["<|endoftext|>"], show_progress=False,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
one = "".join(open(f, "rb").read().decode("utf-8", "replace") for f in files)
text = one * max(1, int(mb * 1e6 / len(one.encode())))
d = tempfile.mkdtemp()
t.save(os.path.join(d, "tokenizer.json"))
with open(os.path.join(d, "text.txt"), "w", encoding="utf-8") as f:
    f.write(text)
n = len(text.encode())
lines = re.findall(r"[^\n]*\n|[^\n]+$", text)  # each line with its newline
print(f"tokenizer: {t.get_vocab_size()} tokens; text: {n / 1e6:.1f} MB")
hf = []
for p in range(3):
    t0 = time.perf_counter()
    ids = [i for e in t.encode_batch(lines, add_special_tokens=False) for i in e.ids]
    hf.append(n / 1e6 / (time.perf_counter() - t0))
    print(f"tokenizers pass {p}: {hf[-1]:.1f} MB/s, {len(ids)} ids")
out = subprocess.run([binary, d, os.path.join(d, "text.txt")], capture_output=True, text=True,
                     check=True).stdout
print(out, end="")
ours = [float(ln.split(": ")[2].split(" MB/s")[0]) for ln in out.splitlines()]
n_ours = int(out.splitlines()[-1].split(", ")[-1].split()[0])
assert n_ours == len(ids), (n_ours, len(ids))
print(f"tpk/tokenizers: first pass {ours[0] / hf[0]:.2f}x, best {max(ours) / max(hf):.2f}x "
      f"({max(ours):.1f} against {max(hf):.1f} MB/s, one core; the same {len(ids)} ids)")
