#!/bin/sh
# The GPU test driver (make test-gpu): the op tests (also under compute-sanitizer memcheck), the
# layer and model tests at t = 1 (NCCL) and t = 2, 3 (MPI, ranks sharing one GPU). Counts the
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
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
