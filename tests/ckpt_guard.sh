#!/bin/sh
# tests/ckpt_guard.sh — what the trainer (build/train) never touches and never mixes, on the host
# backend at 2 ranks (TP 2):
#   (a) --save a symbolic link, or DIR.tpk-old a link left beside it: refused before step 1 with one
#       error line naming the link; the folder linked to keeps every file byte for byte;
#   (b) two runs saving into one folder at once: the second refused before step 1 ("in use by
#       another run", naming DIR.tpk-lock), the first ends 0, its checkpoint loads, the lock gone;
#       a lock left by a process that has ended (a dead PID on this host) taken over;
#   (c) --keep 1 beside a user's step-9 folder (no checkpoint) and another run's step-8 checkpoint:
#       both stay and neither counts as newer (this run's newest periodic checkpoint stays);
#   (d) --csv of a resume: a curve that ends before the checkpoint's step, another run's curve
#       whose steps fit (its rows name another run id than the checkpoint's tpk_run_id), or whose
#       steps jump (two runs' rows), refused by name and left byte for byte; the run's own curve
#       continued equals an uninterrupted run's; a CSV removed mid-run noticed at the next row (one
#       error line).
# make test (TPK_TESTS=quick) runs (a), (b)'s concurrent pair, (d)'s gap, another run's curve and
# the removal; make test-long (TPK_TESTS=long) the others. Processes by PID, time limits scaled (TPK_TIME_SCALE).
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup ckpt_guard

# tr ARGS...: the trainer at 2 ranks, output in $out, status in $rc
tr() {
    out=$(timeout $((120 * scale)) mpirun $mpiflags -np 2 "$B/train" "$@" 2>&1)
    rc=$?
}
fail() { echo "FAIL $1"; printf '%s\n' "$out" | tail -6 | sed 's/^/    /'; }
# refused NAME WANT: the last run failed, with one error line saying WANT
refused() {
    n=$(printf '%s\n' "$out" | grep -c '^train: error: ')
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && printf '%s\n' "$out" | grep -q -- "$2"; then ok "$1"
    else fail "$1 (exit $rc, $n error lines, expected \"$2\")"; fi
}
# a user's folder: three files, their digest
mkdir -p "$T/user"
echo mine > "$T/user/notes.txt"; echo '{"mine": 1}' > "$T/user/config.json"; echo w > "$T/user/model.safetensors"
sum() { (cd "$1" && ls -la --time-style=+ . | awk '{print $1, $5, $NF}'; cat ./*) | cksum; }
usum=$(sum "$T/user")
run="--text $text $small --tp 2"

# ---- (a) links ---------------------------------------------------------------------------------
ln -s user "$T/ln"
tr $run --steps 3 --save "$T/ln"
refused "--save a symbolic link refused before step 1" "ln is a symbolic link"
if ! printf '%s\n' "$out" | grep -q '^step ' && [ "$(sum "$T/user")" = "$usum" ]; then ok "--save a link: no step run, the folder linked to untouched"
else fail "--save a link: a step ran or the folder linked to changed"; fi
mkdir -p "$T/c"
ln -s user "$T/c.tpk-old"
tr $run --steps 3 --save "$T/c"
refused "DIR.tpk-old a symbolic link refused before step 1" "c.tpk-old is a symbolic link"
if [ "$(sum "$T/user")" = "$usum" ] && [ -L "$T/c.tpk-old" ]; then ok "DIR.tpk-old a link: the link and the folder linked to untouched"
else fail "DIR.tpk-old a link: the link or the folder linked to changed"; fi
rm -f "$T/c.tpk-old"
if long_set; then
    ln -s user "$T/c.tpk-new"
    tr $run --steps 3 --save "$T/c"
    refused "DIR.tpk-new a symbolic link refused before step 1" "c.tpk-new is a symbolic link"
    [ "$(sum "$T/user")" = "$usum" ] && ok "DIR.tpk-new a link: the folder linked to untouched" || fail "DIR.tpk-new a link: the folder linked to changed"
    rm -f "$T/c.tpk-new"
fi

# ---- (b) the lock ------------------------------------------------------------------------------
(timeout $((300 * scale)) mpirun $mpiflags -np 2 "$B/train" $run --steps 1000 --save "$T/shared" --save-every 500 > "$T/first.log" 2>&1; echo $? > "$T/first.rc") &
first=$!
i=0
while [ $i -lt $((300 * scale)) ] && ! grep -q '^step ' "$T/first.log" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
tr $run --steps 3 --save "$T/shared"
refused "a second run saving into the same folder at once refused" "in use by another run (.*shared.tpk-lock"
if ! printf '%s\n' "$out" | grep -q '^step '; then ok "the second run refused before step 1"; else fail "the second run ran a step"; fi
wait $first
tr $run --steps 1000 --load "$T/shared" --eval-only --eval-batches 1
if [ "$(cat "$T/first.rc")" = 0 ] && [ $rc -eq 0 ] && [ ! -e "$T/shared.tpk-lock" ]; then ok "the first run ends 0, its checkpoint loads, its lock released"
else fail "the first run (exit $(cat "$T/first.rc")) or its checkpoint (exit $rc) or its lock"; fi
if long_set; then
    sh -c 'exit 0' & dead=$!; wait $dead # a PID that has ended
    echo "tpk-lock host $(uname -n) pid $dead start 1" > "$T/shared.tpk-lock"
    tr $run --steps 3 --save "$T/shared"
    if [ $rc -eq 0 ] && [ ! -e "$T/shared.tpk-lock" ]; then ok "a dead process's lock taken over, then released"
    else fail "a dead process's lock (exit $rc)"; fi
fi

# ---- (c) --keep ---------------------------------------------------------------------------------
if long_set; then
    tr $run --steps 9 --save "$T/other" --save-every 8 # another run's step-8 checkpoint
    mkdir -p "$T/k/step-9" && echo mine > "$T/k/step-9/notes.txt" && cp -r "$T/other/step-8" "$T/k/step-8"
    ksum=$(sum "$T/k/step-8")
    tr $run --steps 6 --save "$T/k" --save-every 2 --keep 1
    if [ $rc -eq 0 ] && [ -f "$T/k/step-9/notes.txt" ] && [ "$(sum "$T/k/step-8")" = "$ksum" ] && [ -f "$T/k/step-4/model.safetensors" ] && [ ! -e "$T/k/step-2" ]; then
        ok "--keep 1: a user's step-9 and another run's step-8 stay and do not count: this run's step-4 kept, step-2 removed"
    else fail "--keep 1 beside a user's step-9 and another run's step-8 (exit $rc): $(ls "$T/k" | tr '\n' ' ')"; fi
fi

# ---- (d) --csv of a resume ------------------------------------------------------------------------
tr $run --steps 6 --save "$T/r" --save-every 3 --csv "$T/full.csv"
rcf=$rc
head -3 "$T/full.csv" > "$T/gap.csv"; cp "$T/gap.csv" "$T/gap0.csv"
tr $run --steps 6 --load "$T/r/step-3" --csv "$T/gap.csv"
refused "a --csv that ends before the checkpoint's step refused" "gap.csv: its rows are steps 1..2, the run continues from step 3: a gap"
cmp -s "$T/gap.csv" "$T/gap0.csv" && ok "the refused --csv left byte for byte" || fail "the refused --csv changed"
# another run of the same model: its curve has every step, but its rows name its own run
id=$(sed -n 's/.*"tpk_run_id": "\([0-9a-z]*\)".*/\1/p' "$T/r/step-3/config.json")
tr $run --steps 6 --csv "$T/other.csv"
cp "$T/other.csv" "$T/other0.csv"
oid=$(awk -F, 'NR == 2 {print $6}' "$T/other.csv")
tr $run --steps 6 --load "$T/r/step-3" --csv "$T/other.csv"
if [ -n "$id" ] && [ -n "$oid" ] && [ "$id" != "$oid" ] && [ "$(awk -F, 'NR > 1 {print $6}' "$T/full.csv" | sort -u)" = "$id" ]; then
    refused "another run's --csv (every step there) refused by its run id" "other.csv: step 1 is run \"$oid\"'s and this run is \"$id\": another run's curve"
else fail "run ids: the checkpoint's \"$id\", the other curve's \"$oid\", the curve's rows $(awk -F, 'NR > 1 {print $6}' "$T/full.csv" | sort -u | tr '\n' ' ')"; fi
cmp -s "$T/other.csv" "$T/other0.csv" && ok "another run's --csv left byte for byte" || fail "another run's --csv changed"
if long_set; then
    (sed -n 1,3p "$T/full.csv"; echo "9,1,,1,1,$id"; sed -n 4,7p "$T/full.csv") > "$T/mix.csv"; cp "$T/mix.csv" "$T/mix0.csv"
    tr $run --steps 6 --load "$T/r/step-3" --csv "$T/mix.csv"
    refused "a --csv whose steps jump (two runs' rows) refused" "mix.csv: step 9 follows step 2: not one run's curve"
    cmp -s "$T/mix.csv" "$T/mix0.csv" && ok "the mixed --csv left byte for byte" || fail "the mixed --csv changed"
    cp "$T/full.csv" "$T/own.csv"
    tr $run --steps 6 --load "$T/r/step-3" --csv "$T/own.csv"
    if [ $rcf -eq 0 ] && [ $rc -eq 0 ] && cmp -s "$T/full.csv" "$T/own.csv"; then ok "a resume continues its own --csv: equal to the uninterrupted run's"
    else fail "a resume of its own --csv (exit $rc)"; fi
fi
(timeout $((300 * scale)) mpirun $mpiflags -np 2 "$B/train" $run --steps 3000 --csv "$T/rm.csv" > "$T/rm.log" 2>&1; echo $? > "$T/rm.rc") &
rmjob=$!
i=0
while [ $i -lt $((300 * scale)) ] && ! grep -q '^2,' "$T/rm.csv" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
rm -f "$T/rm.csv"
wait $rmjob
out=$(cat "$T/rm.log") rc=$(cat "$T/rm.rc")
refused "a --csv removed mid-run noticed at the next row" "rm.csv: removed during the run"
