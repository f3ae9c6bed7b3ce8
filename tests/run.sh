#!/bin/sh
# The test driver: runs every test program under mpirun at its rank counts, counts the
# "ok"/"FAIL" lines the programs print, and ends with "N passed, M failed".
# Every time limit is multiplied by TPK_TIME_SCALE (tests/common.sh: $scale) on a busy machine.
. "$(dirname "$0")/common.sh" # the repository root, B (TPK_BUILD; make test-sanitize: build/san), mpiflags, scale
export TPK_BUILD=$B
log=$B/tests/log.txt
: > "$log"
passed=0 failed=0

# run NAME NP CMD...: one program at one rank count, within limit seconds (default 300) x TPK_TIME_SCALE
run() {
    name=$1 np=$2; shift 2
    lim=$((${limit:-300} * scale)) t0=$(date +%s)
    out=$(timeout $lim mpirun $mpiflags -np "$np" "$@" 2>&1)
    rc=$? secs=$(($(date +%s) - t0))
    printf '%s\n' "$out" >> "$log"
    p=$(printf '%s\n' "$out" | grep -c '^ok ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    printf '%s\n' "$out" | grep -E '^(FAIL |  \[rank)' | head -40
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name [np=$np]: exit status $rc"
        printf '%s\n' "$out" | tail -20
        f=1
    fi
    case "$name" in *_example) [ "$rc" -eq 0 ] && p=1 ;; esac  # a program, not a test: its exit status
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $name [np=$np]: ran no test case"; f=1; fi
    # the seconds taken against the limit: a program near its limit shows before it fails
    printf '%-28s np=%s  %3d ok  %d failed  %4d s of %d\n' "$name" "$np" "$p" "$f" "$secs" "$lim"
    passed=$((passed + p)) failed=$((failed + f))
}

for t in $B/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    case "$name" in
    test_ops_*) nps="1" ;;
    *) nps="1 2 3 4" ;;
    esac
    for np in $nps; do run "$name" "$np" "$t"; done
done
run readme_example 2 $B/readme_example
# the whole CUDA backend on the CPU (kernels/cuda/*.cu compiled by g++ against the CUDA emulation in
# tests/gpu/emu/): tests/gpu/ops.c, every CUDA op against the host op; then again with the emulated
# cuBLASLt finding no algorithm, so the backend's own GEMM kernel and composed linear_fwd run
run gpu_emu_ops 1 $B/tests/gpu_emu_ops
run gpu_emu_ops_fallback 1 -x TPK_EMU_LT_NOALGO=1 $B/tests/gpu_emu_ops
# and on a GPU that gives a block 99 KiB of shared memory (sm_86/89): the tensor-core attention
# takes at most 78 KB a block, so it runs there at D = 64 and 128 alike (the launchers' check)
# (not again under AddressSanitizer: the same code as gpu_emu_ops, only the launchers' check
# differs, and the sanitized emulation takes 87 s of CI's time)
[ "$B" = build/san ] || run gpu_emu_ops_smem99 1 -x TPK_EMU_SMEM_OPTIN=101376 $B/tests/gpu_emu_ops
# and on the checked build (every load and store of the kernels observed) under the shared-memory
# race detector, with each warp alone from barrier to barrier in descending and in a seeded random
# order, the grid-stride launches capped at 3 blocks so every loop takes several trips (a kernel
# whose answer depends on the schedule fails against the host; a load or store outside every
# allocation fails). The AddressSanitizer build cannot take the instrumentation: the schedules alone.
race=TPK_EMU_RACE=1
[ "$B" = build/san ] && race=TPK_EMU_RACE=0
# (one warp at a time, every access observed: the slowest programs, 49-66 s in build/ and 54 s in
# build/san on 2 cores; on a busier machine one once took 87% of a 300 s limit: these get 900 s)
limit=900
run gpu_emu_ops_race_desc 1 -x $race -x TPK_EMU_SCHED=desc -x TPK_EMU_GRID_CAP=3 $B/tests/gpu_emu_ops_chk
# (the random schedule in build/ only: under AddressSanitizer the descending one covers the same
# memory accesses)
[ "$B" = build/san ] ||
    run gpu_emu_ops_race_random 1 -x $race -x TPK_EMU_SCHED=random:2026 -x TPK_EMU_GRID_CAP=3 $B/tests/gpu_emu_ops_chk
limit=
# the emulation's own test: faulty kernels it must catch (races, cp.async read in flight, launch
# limits, reads past an allocation), their correct variants clean under every schedule; its
# detector needs the access instrumentation, which the AddressSanitizer build (build/san) lacks
if [ -x $B/tests/gpu_emu_race ]; then
    run gpu_emu_race 1 $B/tests/gpu_emu_race
elif [ "$B" = build ]; then
    echo "FAIL gpu_emu_race: $B/tests/gpu_emu_race was not built"; failed=$((failed + 1))
fi
# the CUDA layers and GPT-2 model (tests/gpu/layers.c) on the emulated backend against the host, ranks over MPI
run gpu_emu_layers 2 $B/tests/gpu_emu_layers
run gpu_emu_layers 3 $B/tests/gpu_emu_layers
run gpu_emu_layers_race_desc 2 -x $race -x TPK_EMU_SCHED=desc -x TPK_EMU_GRID_CAP=3 $B/tests/gpu_emu_layers_chk

# the kit from a CUDA C++ file (tests/cuda_cxx.cu): built where nvcc is found (make test / cuda-check)
if [ -x $B/tests/cuda_cxx ]; then
    run cuda_cxx 1 $B/tests/cuda_cxx
elif command -v nvcc >/dev/null 2>&1 && [ "$B" = build ]; then
    echo "FAIL cuda_cxx: nvcc is present but $B/tests/cuda_cxx was not built"; failed=$((failed + 1))
else
    echo "cuda_cxx: skipped (no nvcc: tests/cuda_cxx.cu not compiled)"
fi

# the PyTorch reference: where Debian's python3 (not another one first on PATH) imports torch
py=/usr/bin/python3
if [ -x "$py" ] && "$py" -c 'import torch' >/dev/null 2>&1; then
    # GPT-2; Llama (A=6, G=2: a key/value head on two ranks at t = 3, 4) untied, and tied; GPT-NeoX
    for model in gpt2 llama llama_tied neox neox_tanh; do
        for np in 1 2 3 4; do
            odd=""; even=""
            if [ $((np % 2)) = 1 ]; then odd=sp; else even=sp; fi
            case $model in  # sequence parallelism at odd t (the tied Llama: at even t)
            gpt2) args="$odd" row=torch_reference ;;
            llama) args="$odd llama" row=torch_reference_llama ;;
            llama_tied) args="$even llama tied" row=torch_reference_llama_tied ;;
            neox) args="$odd neox" row=torch_reference_neox ;;
            neox_tanh) args="$even neox tanh" row=torch_reference_neox_tanh ;;
            esac
            dir=$B/tests/torch_${model}_np$np
            rm -rf "$dir"
            if out=$(timeout $((300 * scale)) mpirun $mpiflags -np "$np" $B/tests/torch_dump "$dir" $args 2>&1); then
                out=$(timeout $((300 * scale)) "$py" tests/torch_ref.py "$dir" 2>&1)
            else
                out="$out
FAIL torch_dump $args at np=$np"
            fi
            printf '%s\n' "$out" >> "$log"
            printf '%s\n' "$out" | grep -E '^(FAIL|  )'
            p=$(printf '%s\n' "$out" | grep -c '^ok ')
            f=$(printf '%s\n' "$out" | grep -c '^FAIL')
            [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && { printf '%s\n' "$out" | tail -5; f=1; }
            printf '%-28s np=%s  %3d ok  %d failed\n' "$row" "$np" "$p" "$f"
            passed=$((passed + p)) failed=$((failed + f))
        done
    done
    # make bench-gpt2's script end to end on a tiny model (its numbers are not checked: not a timed test)
    out=$(timeout $((300 * scale)) "$py" bench/gpt2_step.py --trainer $B/train --model tiny --device cpu --dtype f32 --vocab 300 --steps 2 --warmup 1 --json 2>&1)
    printf '%s\n' "$out" >> "$log"
    if printf '%s\n' "$out" | "$py" -c 'import json, sys; r = json.loads(sys.stdin.read()); assert r["rows"]["tpk"]["tokens_per_s"] > 0 and any(k.startswith("torch eager") for k in r["rows"]), r' >/dev/null 2>&1; then
        echo "ok bench/gpt2_step.py runs tpk's trainer and PyTorch's eager model" >> "$log"; p=1 f=0
    else
        echo "FAIL bench/gpt2_step.py: $out" | head -5; p=0 f=1
    fi
    printf '%-28s np=%s  %3d ok  %d failed\n' bench_gpt2_script 1 "$p" "$f"
    passed=$((passed + p)) failed=$((failed + f))
else
    echo "torch_reference: skipped (Debian's python3-torch is not importable by $py; sudo apt-get install python3-torch)"
fi

# make gpu-report's report, checked on the CPU (tests/gpu_report.py): the generator on recorded GPU
# figures at each target's edge, the command without a GPU, a host dry run of the whole pipeline
py3=$(command -v python3 || echo /usr/bin/python3)
out=$(timeout $((300 * scale)) "$py3" tests/gpu_report.py "$B" 2>&1)
printf '%s\n' "$out" >> "$log"
printf '%s\n' "$out" | grep '^FAIL' | head -20
p=$(printf '%s\n' "$out" | grep -c '^ok ')
f=$(printf '%s\n' "$out" | grep -c '^FAIL')
[ "$p" -eq 0 ] && [ "$f" -eq 0 ] && { printf '%s\n' "$out" | tail -5; f=1; }
printf '%-28s np=%s  %3d ok  %d failed\n' gpu_report 1 "$p" "$f"
passed=$((passed + p)) failed=$((failed + f))

# script NAME NP FILE: a test script's "ok"/"FAIL" lines counted as one row
script() {
    out=$(sh "$3" 2>&1)
    printf '%s\n' "$out" >> "$log"
    printf '%s\n' "$out" | grep -E '^(FAIL|    |train: )'
    p=$(printf '%s\n' "$out" | grep -c '^ok ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL')
    [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && { echo "FAIL $3 ran no test"; f=1; }
    printf '%-28s np=%s  %3d ok  %d failed\n' "$1" "$2" "$p" "$f"
    passed=$((passed + p)) failed=$((failed + f))
}
# the GPT-2 trainer end to end (resume, resharding, evaluation, Hugging Face import, bad input)
script train 1-4 tests/train.sh
# the configuration planner against real runs (memory), its table, --json, --calibrate and bad input
script plan 1-4 tests/plan.sh
# text: Unicode classes, NFC and UTF-8 against Python (tests/unicode.sh); the tokenizer against
# Hugging Face tokenizers, build/tokenize, the trainer's --tokenizer, --prompt, sampling flags
script unicode 1 tests/unicode.sh
script tokenizer 1-2 tests/tokenizer.sh
# faults: a rank killed, the checkpoint writer killed, the disk full, a rank stopped (the collectives' timeout)
script faults 1-2 tests/faults.sh
# the trainer on the emulated CUDA backend against the host's
script train_emu 2 tests/train_emu.sh
# make cuda-report's figures and budget checks on a hand-counted ptxas log and SASS (no nvcc needed)
script cuda_report 1 tests/cuda_report.sh

# install into build/inst and build the README example against it with pkg-config (normal build only)
inst="$PWD/build/inst"
if [ "$B" != build ]; then
    echo "pkgconfig_example: skipped in $B (make install installs the normal build)"
elif make --no-print-directory -s install PREFIX="$inst" >> "$log" 2>&1 &&
   mpicc -std=c11 -Wall -Wextra -Werror build/readme_example.c \
       $(PKG_CONFIG_PATH="$inst/lib/pkgconfig" pkg-config --cflags --libs tpk) -o build/tests/pkgconfig_example >> "$log" 2>&1; then
    run pkgconfig_example 2 build/tests/pkgconfig_example
else
    echo "FAIL make install + pkg-config build of the README example (see $log)"; failed=$((failed + 1))
fi

# every header compiles alone with a plain C compiler, without MPI or CUDA headers
hfail=0
for h in include/tpk/*.h include/tpk/*/*.h; do
    case "$h" in */mpi.h) continue ;; esac
    printf '#include <%s>\nint tpk_header_check;\n' "${h#include/}" |
        ${CC:-cc} -std=c11 -Wall -Wextra -Werror -Iinclude -x c -c - -o /dev/null || { echo "FAIL header $h"; hfail=1; }
done
if [ "$hfail" -eq 0 ]; then passed=$((passed + 1)); echo "headers compile alone with ${CC:-cc} -std=c11 -Werror: ok"; else failed=$((failed + 1)); fi
# ... and as C++17 (mpi.h with mpicxx, which brings <mpi.h>)
hfail=0
for h in include/tpk/*.h include/tpk/*/*.h; do
    cxx=${CXX:-g++}
    case "$h" in */mpi.h) cxx=mpicxx ;; esac
    printf '#include <%s>\nint tpk_header_check;\n' "${h#include/}" |
        $cxx -std=c++17 -Wall -Wextra -Werror -pedantic -Iinclude -x c++ -c - -o /dev/null || { echo "FAIL header $h as C++17"; hfail=1; }
done
if [ "$hfail" -eq 0 ]; then passed=$((passed + 1)); echo "headers compile alone with ${CXX:-g++} -std=c++17 -pedantic -Werror: ok"; else failed=$((failed + 1)); fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
