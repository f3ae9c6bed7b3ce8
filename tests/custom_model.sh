#!/bin/sh
# examples/custom_model.c, a model of one's own (GPT-J's layout: one RMSNorm feeding attention and
# MLP in parallel, grouped-query attention with rotary embeddings, a GELU MLP, an untied head)
# trained from the kit's public parts: the same losses at 1 rank, TP 2 and TP 2 x DP 2 (ZeRO-1),
# falling; a checkpoint saved at TP 2 x DP 2 and resumed at 1 and at 2 ranks continues the run
# exactly; bad flags refused by name. Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh.
. "$(dirname "$0")/common.sh"
P=$B/custom_model
lim=$((120 * scale))
fail() { echo "FAIL $1"; printf '%s\n' "$out" | tail -6 | sed 's/^/    /'; }
setup custom_model
run() { # NP TP ARGS...: the loss lines of the run in $out, its status in $rc
    np=$1 tp=$2; shift 2
    out=$(timeout $lim mpirun $mpiflags -np "$np" "$P" --tp "$tp" "$@" 2>&1)
    rc=$?
}
losses() { printf '%s\n' "$1" | awk '/^step [0-9]+\/[0-9]+ \| loss /{print $2, $5}'; }
# the same numbers within 1e-5 relative (the rows in the same order)
same() {
    paste -d' ' "$1" "$2" | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * $2) bad++; n++ }
        END { exit !(n > 0 && bad == 0) }'
}
run 1 1 --steps 6
losses "$out" > "$T/l1"
[ $rc -eq 0 ] && [ "$(wc -l < "$T/l1")" -eq 6 ] &&
    awk 'NR == 1 { a = $2 } END { exit !($2 < a) }' "$T/l1" &&
    ok "custom model at 1 rank: 6 steps, the loss falls ($(head -1 "$T/l1" | cut -d' ' -f2) to $(tail -1 "$T/l1" | cut -d' ' -f2))" ||
    fail "custom model at 1 rank"
for c in "2 2" "4 2"; do
    set -- $c
    run "$1" "$2" --steps 6
    losses "$out" > "$T/l$1"
    [ $rc -eq 0 ] && same "$T/l1" "$T/l$1" &&
        ok "custom model at $1 ranks (TP $2 x DP $(($1 / $2))): every step's loss the 1-rank run's" ||
        fail "custom model at $1 ranks (TP $2 x DP $(($1 / $2))): losses differ from 1 rank"
done
# save after 3 steps at TP 2 x DP 2 (ZeRO-1's moments gathered), resume to 6 at 1 and at 2 ranks
run 4 2 --steps 3 --save "$T/ck"
[ $rc -eq 0 ] && [ -f "$T/ck/model.safetensors" ] && [ -f "$T/ck/optim.safetensors" ] &&
    grep -q custom_gptj "$T/ck/config.json" && ok "custom model: checkpoint saved at TP 2 x DP 2" ||
    fail "custom model: checkpoint saved at TP 2 x DP 2"
tail -3 "$T/l1" > "$T/tail"
for c in "1 1" "2 2"; do
    set -- $c
    run "$1" "$2" --steps 6 --load "$T/ck"
    losses "$out" > "$T/r$1"
    [ $rc -eq 0 ] && [ "$(head -1 "$T/r$1" | cut -d' ' -f1)" = "4/6" ] && same "$T/tail" "$T/r$1" &&
        ok "custom model: resumed at $1 rank(s) from the TP 2 x DP 2 checkpoint: steps 4-6 the uninterrupted run's" ||
        fail "custom model: resumed at $1 rank(s): steps 4-6 differ"
done
# bad input: an unknown flag, a TP size that does not divide the ranks, a checkpoint that is none
run 1 1 --steps 2 --layers 3
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'unknown flag --layers' && ok "custom model: an unknown flag refused by name" || fail "custom model: unknown flag"
run 2 3 --steps 2
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'expected a divisor of the 2 ranks' && ok "custom model: --tp 3 on 2 ranks refused" || fail "custom model: --tp 3 on 2 ranks"
mkdir -p "$T/empty"
run 1 1 --steps 2 --load "$T/empty"
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'tpk_ckpt_load' && ok "custom model: --load of a folder without a checkpoint refused" || fail "custom model: --load of an empty folder"
