#!/bin/sh
# The GPU test driver (make test-gpu): the op tests (also under compute-sanitizer memcheck), the
# layer and model tests at t = 1 (NCCL) and t = 2, 3 (MPI, ranks sharing one GPU), a bit-identical
# resume of the trainer on the CUDA backend. Counts the
# "ok"/"FAIL" lines and ends with "N passed, M failed". Without a GPU it says so and exits 0.
cd "$(dirname "$0")/../.." || exit 1
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "test-gpu: no GPU present: skipped"; exit 0
fi
if [ ! -x build/tests/gpu/ops ] || [ ! -x build/tests/gpu/layers ]; then
    echo "test-gpu: the GPU test programs are not built (make cuda-check needs nvcc)"; exit 1
fi
mpiflags="--oversubscribe"
[ "$(id -u)" = 0 ] && mpiflags="$mpiflags --allow-run-as-root"
log=build/tests/gpu/log.txt
: > "$log"
passed=0 failed=0
run() {
    name=$1; shift
    out=$(timeout 600 "$@" 2>&1); rc=$?
    printf '%s\n' "$out" >> "$log"
    p=$(printf '%s\n' "$out" | grep -c '^ok ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    printf '%s\n' "$out" | grep -E '^(FAIL |  \[rank|=+ ERROR|=+ Invalid)' | head -40
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $name: exit status $rc"; printf '%s\n' "$out" | tail -20; f=1; fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $name: ran no test case"; f=1; fi
    printf '%-36s %3d ok  %d failed\n' "$name" "$p" "$f"
    passed=$((passed + p)) failed=$((failed + f))
}
run "ops" mpirun $mpiflags -np 1 build/tests/gpu/ops
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ]; then
    run "ops under compute-sanitizer memcheck" "$san" --tool memcheck --error-exitcode 3 build/tests/gpu/ops
else
    echo "compute-sanitizer not found: memcheck skipped"
fi
for np in 1 2 3; do run "layers np=$np" mpirun $mpiflags -np "$np" build/tests/gpu/layers; done
# determinism: on the CUDA backend (bf16, dropout on, --deterministic; head dim 64: the tensor-core
# attention) 10 steps straight equal 5 steps, save, load, 5 more — losses and gradient norms bit for bit
if [ -x build/gpt2_train ]; then
    d=build/tests/gpu/resume
    rm -rf "$d" && mkdir -p "$d"
    text=/usr/share/common-licenses/GPL-3
    [ -f "$text" ] || text=README.md
    a="--text $text --layers 2 --hidden 128 --heads 2 --batch 4 --seq-len 96 --lr 3e-3 --warmup 2 --seed 3 --dropout 0.1 --dtype bf16 --steps 10 --deterministic"
    mpirun $mpiflags -np 1 build/gpt2_train $a --csv "$d/full.csv" >> "$log" 2>&1
    mpirun $mpiflags -np 1 build/gpt2_train $a --save "$d/c" --save-every 5 >> "$log" 2>&1
    mpirun $mpiflags -np 1 build/gpt2_train $a --load "$d/c/step-5" --csv "$d/resume.csv" >> "$log" 2>&1
    x=$(awk -F, 'NR>1 && $1>=6 {print $1, $2, $5}' "$d/full.csv" 2>/dev/null)
    y=$(awk -F, 'NR>1 && $1>=6 {print $1, $2, $5}' "$d/resume.csv" 2>/dev/null)
    if [ -n "$x" ] && [ "$x" = "$y" ] && [ "$(printf '%s\n' "$x" | wc -l)" -eq 5 ]; then
        echo "ok resume on the CUDA backend is bit-identical (steps 6-10)"; passed=$((passed + 1))
    else
        echo "FAIL resume on the CUDA backend is not bit-identical: [$x] vs [$y]"; failed=$((failed + 1))
    fi
else
    echo "FAIL build/gpt2_train is not built"; failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
