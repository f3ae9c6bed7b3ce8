#!/bin/sh
# bench/zero.sh — ZeRO 0 to 3 on the host (make bench-zero): a GPT-2 at DP 4 (4 ranks under mpirun,
# host backend) whose ZeRO-0 peak per rank is past a budget (ZERO_BUDGET_MB, default 80), trained
# ZERO_STEPS steps (default 8) at --zero 0, 1, 2 and 3, in ZERO_ROUNDS rounds (default 3: 0 1 2 3 0
# 1 2 3 ..., so a slower spell of a shared machine falls on every stage). A Markdown table on
# stdout, a row a stage: the trainer's measured peak per rank (its "peak memory" line: the largest
# rank; its split into weights, ZeRO-3's gathered buffers, gradients, optimizer and activations),
# whether it fits the budget,
# the median ms of a step over steps 3..N of every round (the step lines' "ms", rank 0's clock:
# every rank waits for the others in the step), and the planner's peak for the same configuration
# (build/plan --json restricted to it, the built-in cpu profile) with planned / measured.
#
# Then the share of ZeRO-3's all-gather time hidden under compute, on the same 4 ranks and again on
# 2 (ZERO_HIDDEN_ALSO; a core each here, where 4 ranks time-share 2), from the profiler (--profile:
# world rank 0's table over steps 2..N, ms a step, the mean of ZERO_ROUNDS runs each, alternated):
#   G(run)   = "dp.allgather (start)" + "dp.wait (allgather)": the time the rank spent in the
#              gathers' start calls and blocked in their waits (tpk/runtime/coll.h names a wait's
#              row by the kind of collective it finishes);
#   hidden   = 1 - G(--zero 3) / G(--zero 3 --zero3-no-prefetch),
# where --zero3-no-prefetch runs the same gathers (the same units, sizes and order) but starts each
# where its unit is used and waits at once, so G there is the gathers' exposed time. 1: the gathers
# cost the step nothing; 0: prefetching hid nothing. A wait also lasts while a slower rank has not
# started its part yet (the ranks' skew, in both runs alike). A started gather also progresses in
# the rank's other MPI calls (a reduce-scatter's wait, the next gather's start), which may take over
# time the gathers' waits no longer show: so beside it the same share of all the rank's DP calls,
# hidden_DP = 1 - D(--zero 3) / D(--zero3-no-prefetch), D = the sum of every "dp." row, and the
# step's wall time in both runs (time truly hidden shortens the step by as much). Open MPI over
# shared memory progresses a started collective mostly inside MPI calls (no progress thread by
# default), so a gather started before a block's compute may advance little until its wait: the
# figure is what this machine does, not what a GPU's copy engines would. Figures, not a test.
cd "$(dirname "$0")/.." || exit 1
B=${TPK_BUILD:-build}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mpi="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && mpi="$mpi --allow-run-as-root"
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=README.md
budget=${ZERO_BUDGET_MB:-80}
steps=${ZERO_STEPS:-8}
rounds=${ZERO_ROUNDS:-3}
np=4
M=${ZERO_MODEL:-"--layers 8 --hidden 256 --heads 4 --seq-len 128"}
b=1 # sequences a rank a step
W=$B/bench/zero.tmp
rm -rf "$W" && mkdir -p "$W" || exit 1
echo "GPT-2 $M, byte vocabulary (256), batch $b a rank, DP $np, f32, host backend; budget $budget MB"
echo "a rank; $rounds rounds of $steps steps"
echo
r=0
while [ $r -lt "$rounds" ]; do
    for z in 0 1 2 3; do
        out=$($mpi -np $np $B/train --text "$text" --steps "$steps" --log-every 1 $M --batch $b --zero $z 2>&1)
        printf '%s\n' "$out" > "$W/run$z.$r"
        printf '%s\n' "$out" | awk '/^step/ { for (i = 1; i <= NF; i++) if ($(i+1) == "ms") { n++; if (n >= 3) print $i } }' >> "$W/ms$z"
    done
    r=$((r + 1))
done
echo "| ZeRO | peak MB a rank | weights | gathered | gradients | optimizer | activations | fits $budget MB | ms/step (median) | planned MB | planned / measured |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for z in 0 1 2 3; do
    out=$(cat "$W/run$z.0")
    peak=$(cat "$W"/run$z.* | grep -o 'peak memory[a-z ]* [0-9., ]* MB' | grep -o '[0-9][0-9.]*' | sort -g | tail -1)
    # (ZeRO-3's line names its gathered buffers beside the shard; the others hold none: 0)
    split=$(printf '%s\n' "$out" | sed -n 's/.* = weights \([0-9.]*\)\( + gathered [0-9.]*\)* + gradients \([0-9.]*\) + optimizer \([0-9.]*\) + activations[a-z ]* \([0-9.]*\).*/\1 |\2 | \3 | \4 | \5/p' |
            sed 's/| + gathered /| /; s/^\([0-9.]*\) | |/\1 | 0 |/' | head -1)
    ms=$(sort -g "$W/ms$z" | awk '{ v[NR] = $1 } END { if (NR) printf "%.1f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    js=$($B/plan --profile cpu --vocab 256 --gpus $np --gpus-per-node $np --cp 1 $M --tp 1 --pp 1 \
         --batch $((b * np)) --micro-batch $b --recompute none --zero $z --json 2>&1)
    pk=$(printf '%s\n' "$js" | grep -o '"peak_bytes": [0-9]*' | head -1 | awk '{ printf "%.2f", $2 / 1e6 }')
    if [ -z "$peak" ]; then
        echo "| $z | (the run failed: $(printf '%s\n' "$out" | grep -m1 'error' | cut -c1-80)) |"
        continue
    fi
    fits=$(awk -v p="$peak" -v b="$budget" 'BEGIN { print p <= b ? "yes" : "no" }')
    echo "| $z | $peak | ${split:-- | - | - | - | -} | $fits | $ms | $pk | $(awk -v a="$pk" -v m="$peak" 'BEGIN { if (m > 0 && a != "") printf "%.4f", a / m }') |"
done
echo
# prof PROFILE: the ms a step in the all-gathers' start calls, blocked in their waits, their
# waits a step, the step's wall time and the ms in every DP call (world rank 0's table)
prof() {
    printf '%s\n' "$1" | awk '/^dp\.allgather \(start\)/ { s = $4 } /^dp\.wait \(allgather\)/ { w = $4; c = $3 }
                              /^profile: / { for (i = 1; i <= NF; i++) if ($(i + 1) == "ms") t = $i }
                              /^dp\./ { d += $2 ~ /^\(/ ? $4 : $3 }
                              END { printf "%s %s %s %s %s\n", s, w, c, t, d }'
}
echo "ZeRO-3's all-gathers, world rank 0's profile over steps 2..$steps, ms a step, the mean of $rounds runs"
echo "(4 ranks time-share the 2 cores; 2 ranks have a core each):"
echo
echo "| ranks | run | gathers a step | step (wall) | in the starts | blocked in the waits | gathers' time G | hidden | all DP calls D | hidden_DP |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in $np ${ZERO_HIDDEN_ALSO:-2}; do
    : > "$W/pf" && : > "$W/ex"
    r=0
    while [ $r -lt "$rounds" ]; do
        prof "$($mpi -np $n $B/train --text "$text" --steps "$steps" $M --batch $b --zero 3 --profile 2>&1)" >> "$W/pf"
        prof "$($mpi -np $n $B/train --text "$text" --steps "$steps" $M --batch $b --zero 3 --zero3-no-prefetch --profile 2>&1)" >> "$W/ex"
        r=$((r + 1))
    done
    # the means: starts, waits, calls, wall, D, G
    mean='{ for (i = 1; i <= 5; i++) m[i] += $i } END { printf "%.3f %.3f %.1f %.1f %.3f %.3f\n", m[1] / NR, m[2] / NR, m[3] / NR, m[4] / NR, m[5] / NR, (m[1] + m[2]) / NR }'
    set -- $(awk "$mean" "$W/pf") $(awk "$mean" "$W/ex")
    share='BEGIN { if (e > 0) printf "%.1f%%", 100 * (1 - a / e); else print "-" }'
    hid=$(awk -v a="$6" -v e="${12}" "$share") hdp=$(awk -v a="$5" -v e="${11}" "$share")
    echo "| $n | --zero 3 (the next block's gather in flight) | $3 | $4 | $1 | $2 | $6 | $hid | $5 | $hdp |"
    echo "| $n | --zero 3 --zero3-no-prefetch (exposed) | $9 | ${10} | $7 | $8 | ${12} | | ${11} | |"
done
rm -rf "$W"
