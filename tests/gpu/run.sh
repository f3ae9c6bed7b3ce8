#!/bin/sh
# The GPU test driver (make test-gpu): the op tests, the layer and model tests at t = 1 (NCCL) and
# t = 2, 3 (MPI, ranks sharing one GPU), a bit-identical resume of the trainer on the CUDA backend;
# and the op tests under each of compute-sanitizer's four tools — memcheck (out-of-bounds and
# misaligned accesses), racecheck (shared-memory hazards), synccheck (barrier misuse), initcheck
# (reads of uninitialised global memory) — started first, side by side in the background, while
# the other programs run (they check, they do not time). A tool's row fails when its summary
# counts any finding (racecheck: errors and warnings), when it exits non-zero, or when it has no
# summary (it did not finish). Counts the "ok"/"FAIL" lines and ends with "N passed, M failed".
# Every row also goes to build/tests/gpu/results.tsv (name, passed, failed, exit status, seconds,
# findings or "-"), each tool's output to build/tests/gpu/sanitizer-TOOL.txt, everything to
# build/tests/gpu/log.txt (make gpu-report reads them). Without a GPU it says so and exits 0.
#   TPK_GPU_TIMEOUT        seconds per program (600)
#   TPK_SANITIZER_TIMEOUT  seconds per tool (600)
cd "$(dirname "$0")/../.." || exit 1
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "test-gpu: no GPU present: skipped"; exit 0
fi
if [ ! -x build/tests/gpu/ops ] || [ ! -x build/tests/gpu/layers ]; then
    echo "test-gpu: the GPU test programs are not built (make cuda-check needs nvcc)"; exit 1
fi
mpiflags="--oversubscribe"
[ "$(id -u)" = 0 ] && mpiflags="$mpiflags --allow-run-as-root"
dir=build/tests/gpu
log=$dir/log.txt res=$dir/results.tsv
: > "$log"; : > "$res"
limit=$((${TPK_GPU_TIMEOUT:-600} * ${TPK_TIME_SCALE:-1})) slimit=$((${TPK_SANITIZER_TIMEOUT:-600} * ${TPK_TIME_SCALE:-1})) # TPK_TIME_SCALE: a busy machine
passed=0 failed=0

# count NAME RC SECONDS FILE [FINDINGS]: one program's "ok"/"FAIL" lines, its row
count() {
    name=$1 rc=$2 secs=$3 out=$4 finds=${5:--}
    cat "$out" >> "$log"
    p=$(grep -c '^ok ' "$out") f=$(grep -c '^FAIL ' "$out")
    grep -E '^(FAIL |  \[rank|=+ ERROR|=+ Invalid|=+ Race|=+ Barrier|=+ Uninitialized)' "$out" | head -40
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "FAIL $name: timed out" || echo "FAIL $name: exit status $rc"
        tail -20 "$out"; f=1
    fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $name: ran no test case"; f=1; fi
    printf '%-40s %3d ok  %d failed\n' "$name" "$p" "$f"
    printf '%s\t%d\t%d\t%d\t%d\t%s\n' "$name" "$p" "$f" "$rc" "$secs" "$finds" >> "$res"
    passed=$((passed + p)) failed=$((failed + f))
}
# run NAME CMD...: one program in the foreground
run() {
    name=$1; shift
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$dir/out.txt" 2>&1
    rc=$?
    count "$name" "$rc" $(($(date +%s) - t0)) "$dir/out.txt"
}

# the sanitizers, in the background: each writes sanitizer-TOOL.txt and, at its end, sanitizer-TOOL.rc
tools="memcheck racecheck synccheck initcheck"
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ]; then
    for tool in $tools; do
        rm -f "$dir/sanitizer-$tool.rc"
        (
            t0=$(date +%s)
            timeout -k 10 "$slimit" "$san" --tool "$tool" --error-exitcode 3 build/tests/gpu/ops > "$dir/sanitizer-$tool.txt" 2>&1
            echo "$? $(($(date +%s) - t0))" > "$dir/sanitizer-$tool.rc"
        ) &
    done
fi

run "ops" mpirun $mpiflags -np 1 build/tests/gpu/ops
for np in 1 2 3; do run "layers np=$np" mpirun $mpiflags -np "$np" build/tests/gpu/layers; done
# determinism: on the CUDA backend (bf16, dropout on, --deterministic; head dim 64: the tensor-core
# attention) 10 steps straight equal 5 steps, save, load, 5 more — losses and gradient norms bit for bit
t0=$(date +%s)
if [ -x build/train ]; then
    d=build/tests/gpu/resume
    rm -rf "$d" && mkdir -p "$d"
    text=/usr/share/common-licenses/GPL-3
    [ -f "$text" ] || text=README.md
    a="--text $text --layers 2 --hidden 128 --heads 2 --batch 4 --seq-len 96 --lr 3e-3 --warmup 2 --seed 3 --dropout 0.1 --dtype bf16 --steps 10 --deterministic"
    mpirun $mpiflags -np 1 build/train $a --csv "$d/full.csv" >> "$log" 2>&1
    mpirun $mpiflags -np 1 build/train $a --save "$d/c" --save-every 5 >> "$log" 2>&1
    mpirun $mpiflags -np 1 build/train $a --load "$d/c/step-5" --csv "$d/resume.csv" >> "$log" 2>&1
    x=$(awk -F, 'NR>1 && $1>=6 {print $1, $2, $5}' "$d/full.csv" 2>/dev/null)
    y=$(awk -F, 'NR>1 && $1>=6 {print $1, $2, $5}' "$d/resume.csv" 2>/dev/null)
    if [ -n "$x" ] && [ "$x" = "$y" ] && [ "$(printf '%s\n' "$x" | wc -l)" -eq 5 ]; then
        echo "ok resume on the CUDA backend is bit-identical (steps 6-10)" > "$dir/out.txt"
    else
        echo "FAIL resume on the CUDA backend is not bit-identical: [$x] vs [$y]" > "$dir/out.txt"
    fi
else
    echo "FAIL build/train is not built" > "$dir/out.txt"
fi
count "resume" 0 $(($(date +%s) - t0)) "$dir/out.txt"

# the sanitizers' rows, once all have finished
wait
for tool in $tools; do
    name="ops under compute-sanitizer $tool" out=$dir/sanitizer-$tool.txt
    if [ ! -x "$san" ]; then
        echo "FAIL $name: compute-sanitizer not found" > "$dir/out.txt"
        count "$name" 1 0 "$dir/out.txt"; continue
    fi
    read -r rc secs < "$dir/sanitizer-$tool.rc" || { rc=1 secs=0; }
    # findings: the sum of "ERROR SUMMARY: N errors" and "RACECHECK SUMMARY: N hazards"; "none": no summary
    n=$(sed -n 's/.*ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p; s/.*RACECHECK SUMMARY: \([0-9][0-9]*\) hazard.*/\1/p' "$out" |
        awk '{ s += $1; c++ } END { print c ? s : "none" }')
    cp "$out" "$dir/out.txt"
    if [ "$n" = none ]; then
        [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why="stopped at its $slimit s limit" || why="exit status $rc"
        echo "FAIL $name: no summary from the tool (it did not finish: $why)" >> "$dir/out.txt"
    elif [ "$n" -gt 0 ]; then
        echo "FAIL $name: $n findings (see $out)" >> "$dir/out.txt"
    fi
    count "$name" "$rc" "$secs" "$dir/out.txt" "$n"
done
rm -f "$dir/out.txt"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
