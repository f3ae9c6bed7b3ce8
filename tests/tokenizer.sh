#!/bin/sh
# tests/tokenizer.sh — text in, text out (tpk/text/tokenizer.h, build/tokenize, the trainer's
# --tokenizer, --prompt and sampling flags):
#   where Hugging Face tokenizers is importable (make deps: build/pylib), tests/tokenizer_ref.py:
#   tokenizers trained on local text (GPT-2's and GPT-NeoX's settings, GPT-2's two files, merges
#   ignored) against the library on >= 10,000 strings, id for id and byte for byte, and the round
#   trip; else the committed fixture (tests/tokenizer/: a tokenizer.json trained by tokenizers, and
#   the ids it gave for 120 strings) alone;
#   the fixture's recorded ids; build/tokenize --print then --decode giving the file back; llm.c
#   shards (header, counts, the end-of-text token before each document, the validation split) that
#   the trainer reads; the trainer on --text with a tokenizer at TP 2 (the loss falls, a sample
#   after --prompt prints the prompt and text), its checkpoint keeping the tokenizer, a --load that
#   samples text with it; bad files and input: no merges, a merge naming an unknown token, a merge
#   whose result is not a token, truncated JSON, a bad merges.txt line, a folder without a
#   tokenizer, an unsupported model, ids that are no tokens, a model vocabulary too small.
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup tokenizer
fail() { echo "FAIL $1"; printf '%s\n' "$out" | tail -6 | sed 's/^/    /'; }
tk=$B/tokenize
py=
for p in /usr/bin/python3 python3; do
    if PYTHONPATH=build/pylib "$p" -c 'import tokenizers' >/dev/null 2>&1; then py=$p; break; fi
done
py3=$(command -v python3 || echo /usr/bin/python3)

# ---- against Hugging Face tokenizers ---------------------------------------------------------
tok=tests/tokenizer
if [ -n "$py" ]; then
    out=$(PYTHONPATH=build/pylib timeout $((300 * scale)) "$py" tests/tokenizer_ref.py "$B" "$T/ref" 2>&1)
    printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
    printf '%s\n' "$out" | grep -q '^ok tokenizer_gpt2_encode' || fail "tokenizer_ref.py"
    tok=$T/ref/gpt2
else
    echo "tokenizer_reference: skipped (Hugging Face tokenizers is not importable; make deps" \
         "installs it from PyPI into build/pylib)"
fi

# ---- the fixture's recorded ids (tests/tokenizer/golden.txt: hex string, tab, ids) -------------
# (each string's bytes written by one python3 for all: a python3 a string took most of the time)
n=0 bad=
"$py3" - tests/tokenizer/golden.txt "$T/fx" <<'EOF'
import os, sys
os.makedirs(sys.argv[2], exist_ok=True)
for i, line in enumerate(open(sys.argv[1], encoding="ascii")):
    with open(os.path.join(sys.argv[2], "%d.txt" % i), "wb") as f:
        f.write(bytes.fromhex(line.rstrip("\n").split("\t")[0]))
EOF
while IFS='	' read -r hex ids; do
    got=$($tk --tokenizer tests/tokenizer --print "$T/fx/$n.txt" 2>&1)
    n=$((n + 1))
    [ "$got" = "$ids" ] || { bad="$hex: $got, recorded $ids"; break; }
done < tests/tokenizer/golden.txt
if [ -z "$bad" ] && [ "$n" -ge 100 ]; then ok "tokenizer_fixture ($n strings give the ids Hugging Face gave)"
else out=$bad; fail "tokenizer_fixture ($n strings)"; fi

# ---- --print and --decode --------------------------------------------------------------------
for f in "$text" README.md; do
    $tk --tokenizer "$tok" --print "$f" > "$T/ids.txt" 2> "$T/err.txt" &&
        $tk --tokenizer "$tok" --decode "$T/ids.txt" > "$T/back.txt" 2>> "$T/err.txt"
    if cmp -s "$f" "$T/back.txt" && [ "$(wc -l < "$T/ids.txt")" -eq 1 ]; then
        ok "tokenize --print then --decode gives $(basename "$f") back ($(wc -w < "$T/ids.txt") ids for $(wc -c < "$f") bytes)"
    else out=$(cat "$T/err.txt"); fail "tokenize --print, --decode of $f"; fi
done

# ---- llm.c shards --------------------------------------------------------------------------------
out=$($tk --tokenizer "$tok" --out "$T/sh" --val 0.1 "$text" README.md 2>&1)
a=$($tk --tokenizer "$tok" --print "$text" | wc -w) b=$($tk --tokenizer "$tok" --print README.md | wc -w)
eot=$(printf '<|endoftext|>' > "$T/e.txt" && $tk --tokenizer "$tok" --print "$T/e.txt")
if r=$("$py3" - "$T" "$a" "$b" "$eot" <<'EOF'
import struct, sys
T, a, b, eot = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def shard(p):
    d = open(p, "rb").read()
    h = struct.unpack_from("<256i", d)
    assert h[0] == 20240520 and h[1] == 1 and len(d) == 1024 + 2 * h[2], (p, h[:3], len(d))
    return list(struct.unpack_from("<%dH" % h[2], d, 1024))
v, t = shard(T + "/sh_val_000000.bin"), shard(T + "/sh_train_000000.bin")
n = a + b + 2
# the validation share rounded half up, as the tool does (Python's round() goes half to even)
assert len(v) + len(t) == n and len(v) == int(n * 0.1 + 0.5), (len(v), len(t), n)
s = v + t
assert s[0] == eot and s[a + 1] == eot and s.count(eot) == 2, "end-of-text before each document"
print("%d validation and %d training" % (len(v), len(t)))
EOF
); then ok "tokenize --out: llm.c shards ($r tokens; end-of-text before each file)"
else fail "tokenize --out: llm.c shards"; fi

# ---- the trainer ---------------------------------------------------------------------------------
M="--layers 2 --hidden 32 --heads 4 --batch 4 --seq-len 32 --lr 1e-2 --warmup 5 --seed 3"
out=$(timeout $((300 * scale)) mpirun $mpiflags -np 2 $B/train --text "$text" --tokenizer "$tok" \
      --tp 2 $M --steps 60 --eval-every 30 --csv "$T/loss.csv" --save "$T/ck" --sample 24 \
      --prompt "This License" --temperature 0.8 --top-k 40 --top-p 0.95 2>&1)
rc=$?
first=$(awk -F, 'NR==2{print $2}' "$T/loss.csv" 2>/dev/null) last=$(awk -F, 'END{print $2}' "$T/loss.csv" 2>/dev/null)
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '^data: .* tokens' &&
   awk -v a="$first" -v b="$last" 'BEGIN{exit !(a > 0 && b < a - 1)}' &&
   printf '%s\n' "$out" | grep -A1 -e '--- sample' | grep -q '^This License'; then
    ok "trainer: --text with a tokenizer at TP 2 trains (loss $first -> $last) and samples text after --prompt"
else fail "trainer: --text with a tokenizer (rc $rc, loss '$first' -> '$last')"; fi
if [ -f "$T/ck/tokenizer.json" ] || [ -f "$T/ck/vocab.json" ]; then
    out=$(timeout $((120 * scale)) mpirun $mpiflags -np 1 $B/train --load "$T/ck" --prompt "You may" --sample 8 --temperature 0 2>&1)
    if printf '%s\n' "$out" | grep -A1 -e '--- sample' | grep -q '^You may'; then
        ok "a checkpoint keeps its tokenizer: --load DIR --prompt samples text"
    else fail "--load DIR --prompt with the checkpoint's tokenizer"; fi
else out=$(ls "$T/ck"); fail "the checkpoint has no tokenizer file"; fi
out=$(timeout $((120 * scale)) mpirun $mpiflags -np 2 $B/train --data "$T/sh_train_000000.bin" \
      --val-data "$T/sh_val_000000.bin" --vocab "$($tk --tokenizer "$tok" --print "$T/e.txt" >/dev/null; \
      $B/tests/tokenizer_check load "$tok" | awk '{print $3}')" $M --steps 4 --eval-every 2 2>&1)
if [ $? -eq 0 ]; then ok "trainer: the shards of build/tokenize train (--data, --val-data)"
else fail "trainer: --data on build/tokenize's shards"; fi

# ---- bad files and input --------------------------------------------------------------------------
mkdir -p "$T/bad"
"$py3" - "$tok" "$T/bad" <<'EOF'
import json, os, sys
src, d = sys.argv[1], sys.argv[2]
if os.path.isdir(src):
    src = os.path.join(src, "tokenizer.json")
raw = open(src, encoding="utf-8").read()
j = json.loads(raw)
def put(name, obj=None, text=None):
    os.makedirs(os.path.join(d, name), exist_ok=True)
    with open(os.path.join(d, name, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text if text is not None else json.dumps(obj))
m = json.loads(raw); del m["model"]["merges"]; put("no_merges", m)
m = json.loads(raw); m["model"]["merges"].insert(0, "Qzx Qzy"); put("unknown_token", m)
m = json.loads(raw); v = m["model"]["vocab"]; m["model"]["merges"].append(["Q", "Z"])
v.pop("QZ", None); put("merge_result", m)
put("truncated", text=raw[: len(raw) // 2])
m = json.loads(raw); m["model"]["type"] = "WordPiece"; put("wordpiece", m)
os.makedirs(os.path.join(d, "files"), exist_ok=True)
json.dump(j["model"]["vocab"], open(os.path.join(d, "files", "vocab.json"), "w"))
with open(os.path.join(d, "files", "merges.txt"), "w") as f:
    f.write("#version: 0.2\nĠ t\nbad_line_without_space\n")
os.makedirs(os.path.join(d, "empty"), exist_ok=True)
EOF
bad() { # NAME EXPECTED ARGS...: exit status 1 and the message
    name=$1 want=$2; shift 2
    out=$("$@" 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && printf '%s\n' "$out" | grep -q -- "$want"; then ok "bad input: $name: $(printf '%s\n' "$out" | tail -1 | cut -c1-150)"
    else fail "bad input: $name (exit $rc, expected \"$want\")"; fi
}
bad "no merges" 'no "model.merges" list' $tk --tokenizer "$T/bad/no_merges" --print README.md
bad "a merge naming an unknown token" 'merges\[0\] "Qzx Qzy": "Qzx" is not in the vocabulary' $tk --tokenizer "$T/bad/unknown_token" --print README.md
bad "a merge whose result is no token" 'the merged token is not in the vocabulary' $tk --tokenizer "$T/bad/merge_result" --print README.md
bad "truncated JSON" 'truncated JSON' $tk --tokenizer "$T/bad/truncated" --print README.md
bad "an unsupported model" 'model WordPiece: not supported (expected BPE)' $tk --tokenizer "$T/bad/wordpiece" --print README.md
bad "a bad merges.txt line" 'merges.txt: line 3: expected "a b"' $tk --tokenizer "$T/bad/files" --print README.md
bad "a folder without a tokenizer" 'no tokenizer.json, and no vocab.json with merges.txt' $tk --tokenizer "$T/bad/empty" --print README.md
bad "a missing folder" 'cannot open' $tk --tokenizer "$T/bad/none" --print README.md
printf '1 2 99999999 3\n' > "$T/ids_bad.txt"
bad "an id that is no token" 'ids\[2\]: 99999999 is not a token id' $tk --tokenizer "$tok" --decode "$T/ids_bad.txt"
printf '1 2 x3\n' > "$T/ids_bad2.txt"
bad "ids that are not numbers" 'expected token ids' $tk --tokenizer "$tok" --decode "$T/ids_bad2.txt"
bad "a model vocabulary smaller than the tokenizer's" 'more than the model' \
    mpirun $mpiflags -np 1 $B/train --text "$text" --tokenizer "$tok" --vocab 300 $M --steps 1
bad "--prompt without a tokenizer for a GPT-2 vocabulary" '--prompt: needs a tokenizer' \
    mpirun $mpiflags -np 1 $B/train --text "$text" --vocab 1000 $M --steps 1 --prompt "Hi"
