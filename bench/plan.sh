#!/bin/sh
# bench/plan.sh — the planner's step times against measured ones (make bench-plan): this machine
# calibrated (build/plan --calibrate on 2 ranks: GEMMs by class, each op's rate in a step of the
# model, the all-reduce), then for each configuration the trainer's mean step time over steps 3..8
# (host backend, its printed "ms" of each step) next to the plan's step_seconds for the same
# configuration (--json, restricted to it). A Markdown table on stdout. Figures, not a test.
cd "$(dirname "$0")/.." || exit 1
B=${TPK_BUILD:-build}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mpi="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && mpi="$mpi --allow-run-as-root"
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=README.md
M=${PLAN_MODEL:-"--layers 4 --hidden 256 --heads 4 --seq-len 128"}
prof=$B/bench/host.prof
mkdir -p "$B/bench"
$mpi -np 2 $B/plan --calibrate "$prof" $M --batch 4 || exit 1
echo
echo "| configuration | ranks | measured ms/step | planned ms/step | planned / measured | peak MB measured | planned |"
echo "|---|---|---|---|---|---|---|"
# row NP "trainer flags" "plan flags" LABEL
row() {
    out=$($mpi -np "$1" $B/train --text "$text" --steps 8 --log-every 1 $M $2 2>&1)
    ms=$(printf '%s\n' "$out" | awk '/^step/ { for (i = 1; i <= NF; i++) if ($(i+1) == "ms") { n++; if (n >= 3) { s += $i; k++ } } } END { if (k) printf "%.2f", s / k }')
    peak=$(printf '%s\n' "$out" | grep -o 'peak memory[a-z ]* [0-9., ]* MB' | grep -o '[0-9][0-9.]*' | sort -g | tail -1)
    js=$($B/plan --profile "$prof" --vocab 256 --gpus "$1" --gpus-per-node "$1" $M $3 --json)
    pl=$(printf '%s\n' "$js" | grep -o '"step_seconds": [0-9.e+-]*' | head -1 | awk '{ printf "%.2f", $2 * 1e3 }')
    pk=$(printf '%s\n' "$js" | grep -o '"peak_bytes": [0-9]*' | head -1 | awk '{ printf "%.2f", $2 / 1e6 }')
    echo "| $4 | $1 | $ms | $pl | $(awk -v a="$pl" -v b="$ms" 'BEGIN { if (b > 0) printf "%.2f", a / b }') | $peak | $pk |"
}
row 1 "--batch 8" "--batch 8 --micro-batch 8 --recompute none" "GPT-2, B 8"
row 1 "--batch 4 --grad-accum 2 --recompute selective" "--batch 8 --micro-batch 4 --recompute selective" "GPT-2, B 4 x 2, selective"
row 1 "--batch 8 --recompute full" "--batch 8 --micro-batch 8 --recompute full" "GPT-2, B 8, full recompute"
row 2 "--tp 2 --batch 8" "--tp 2 --batch 8 --micro-batch 8 --recompute none --sequence-parallel 0" "GPT-2, TP 2"
row 2 "--tp 2 --batch 8 --sequence-parallel" "--tp 2 --batch 8 --micro-batch 8 --recompute none --sequence-parallel 1" "GPT-2, TP 2, SP"
row 2 "--batch 4" "--tp 1 --pp 1 --batch 8 --micro-batch 4 --recompute none --zero 0" "GPT-2, DP 2"
row 2 "--batch 4 --zero 1" "--tp 1 --pp 1 --batch 8 --micro-batch 4 --recompute none --zero 1" "GPT-2, DP 2, ZeRO-1"
row 2 "--pp 2 --batch 2 --grad-accum 8" "--tp 1 --pp 2 --batch 16 --micro-batch 2 --recompute none" "GPT-2, PP 2, 8 micro-batches"
row 1 "--arch llama --batch 8" "--arch llama --batch 8 --micro-batch 8 --recompute none" "Llama, B 8"
row 2 "--arch llama --tp 2 --batch 8 --recompute selective" "--arch llama --tp 2 --batch 8 --micro-batch 8 --recompute selective --sequence-parallel 0" "Llama, TP 2, selective"
row 2 "--arch llama --batch 4 --zero 1" "--arch llama --tp 1 --pp 1 --batch 8 --micro-batch 4 --recompute none --zero 1" "Llama, DP 2, ZeRO-1"
row 2 "--arch llama --pp 2 --batch 2 --grad-accum 8" "--arch llama --tp 1 --pp 2 --batch 16 --micro-batch 2 --recompute none" "Llama, PP 2, 8 micro-batches"
