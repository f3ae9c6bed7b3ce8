#!/bin/sh
# bench/plan_depth.sh — the planner's wall time against depth: build/plan on every configuration
# of a GPT-2 shape (H 1024, 16 heads, S 1024, global batch 8) on 8 GPUs of the h100 profile (216
# configurations), at L = 8, 80, 800, 8,000 and 100,000 blocks. A Markdown table on stdout.
# Figures, not a test (tests/test_plan_depth.c checks the extrapolation against the full run).
cd "$(dirname "$0")/.." || exit 1
B=${TPK_BUILD:-build}
echo "| layers | configurations | planning wall s |"
echo "|---|---|---|"
for L in 8 80 800 8000 100000; do
    t0=$(date +%s.%N)
    n=$($B/plan --layers $L --hidden 1024 --heads 16 --seq-len 1024 --batch 8 --gpus 8 --json |
        grep -c '"tp"')
    t1=$(date +%s.%N)
    echo "| $L | $n | $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') |"
done
