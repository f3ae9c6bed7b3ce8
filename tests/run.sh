#!/bin/sh
# The test driver: tests/run.sh [quick | long | all] runs the test programs under mpirun, the CUDA
# backend on the CPU emulation, the trainer's test scripts and the checks of the build, counts the
# "ok"/"FAIL" lines they print, and ends with "N passed, M failed".
#   quick (make test): each behaviour in one configuration — a program at the rank counts that
#     say something of their own (one rank, and its multi-rank case at an uneven split), the
#     emulated backend's op suite and its layers at 3 ranks, the trainer scripts' quick cases;
#   long (make test-long, CI): what quick leaves out — the other rank counts, the emulation's
#     fallback, 99 KiB and race-detector runs and its own test, the layers at 2 ranks, the CUDA
#     C++ test, the trainer on the emulated backend, each header alone as C++17, the trainer
#     scripts' long cases (other sizes, rank counts and sweeps);
#   all: both.
# Each program's line gives its wall and CPU seconds (user + sys of all its processes) against
# its limit; a summary per phase (build, C tests, emulator, trainer scripts, other, total) ends the
# run. Every time limit is multiplied by TPK_TIME_SCALE (tests/common.sh: $scale) on a busy machine.
# The build's figures come from make (TPK_BUILD_SECONDS, and TPK_BUILD_TIMES: a file with the
# shell's `times` after the build).
set_arg=${1:-quick}
case "$set_arg" in
quick | long | all) export TPK_TESTS=$set_arg ;;
*) echo "usage: tests/run.sh [quick | long | all]" >&2; exit 2 ;;
esac
. "$(dirname "$0")/common.sh" # the repository root, B (TPK_BUILD; make test-sanitize: build/san), mpiflags, scale, quick_set, long_set
export TPK_BUILD=$B
mkdir -p "$B/tests"
log=$B/tests/log.txt
: > "$log"
passed=0 failed=0

# CPU seconds (user + sys) of this shell's finished children: `times` in this shell (not in a
# command substitution's subshell, whose children are its own), read back from a file
tf=$B/tests/times.txt
cpu_of() { awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } printf "%d\n", t + 0.5 }' "$1"; }
cpu_now() { times > "$tf"; cpu=$(cpu_of "$tf"); }

# phase NAME: ends the running phase (its wall and CPU seconds into the summary), starts NAME
summary="" ph="" total_t0=$(date +%s)
cpu_now; total_c0=$cpu
phase() {
    now=$(date +%s); cpu_now
    [ -n "$ph" ] && summary="$summary$(printf '  %-16s %5d s  %5d s CPU' "$ph" $((now - ph_t0)) $((cpu - ph_c0)))
"
    ph=$1 ph_t0=$now ph_c0=$cpu
}

# row NAME NP OUT RC [SECS LIMIT CPU]: count OUT's "ok"/"FAIL" lines, print the program's line
row() {
    printf '%s\n' "$3" >> "$log"
    p=$(printf '%s\n' "$3" | grep -c '^ok ')
    f=$(printf '%s\n' "$3" | grep -c '^FAIL')
    printf '%s\n' "$3" | grep -E '^(FAIL|  |train: )' | head -40
    if [ "$4" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $1 [np=$2]: exit status $4"
        printf '%s\n' "$3" | tail -20
        f=1
    fi
    case "$1" in *_example) [ "$4" -eq 0 ] && p=1 ;; esac # a program, not a test: its exit status
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $1 [np=$2]: ran no test case"; f=1; fi
    # the seconds taken against the limit: a program near its limit shows before it fails
    if [ -n "$5" ]; then # (a script has no limit of its own: its runs have theirs)
        lt="of $6"
        [ "$6" = 0 ] && lt=""
        printf '%-28s np=%-3s %3d ok  %d failed  %4d s %-7s %4d s CPU\n' "$1" "$2" "$p" "$f" "$5" "$lt" "$7"
    else
        printf '%-28s np=%-3s %3d ok  %d failed\n' "$1" "$2" "$p" "$f"
    fi
    passed=$((passed + p)) failed=$((failed + f))
}

# run NAME NP CMD...: one program at one rank count, within limit seconds (default 300) x TPK_TIME_SCALE
run() {
    name=$1 np=$2; shift 2
    lim=$((${limit:-300} * scale)) t0=$(date +%s)
    cpu_now; c0=$cpu
    out=$(timeout $lim mpirun $mpiflags -np "$np" "$@" 2>&1)
    rc=$? secs=$(($(date +%s) - t0))
    cpu_now
    row "$name" "$np" "$out" "$rc" "$secs" "$lim" $((cpu - c0))
}

# script NAME NP FILE: a test script's "ok"/"FAIL" lines counted as one row (TPK_TESTS picks its cases)
script() {
    t0=$(date +%s)
    cpu_now; c0=$cpu
    out=$(sh "$3" 2>&1)
    rc=$? secs=$(($(date +%s) - t0))
    cpu_now
    # (a script's exit status is not its verdict: its "FAIL" lines are)
    row "$1" "$2" "$out" 0 "$secs" 0 $((cpu - c0))
}

# ---- the test programs --------------------------------------------------------------------------
# nps NAME: "QUICK|LONG", the rank counts a program runs at in each set. A TP test says at 3 ranks
# what it says at 2 (an uneven split: shards of different sizes, a rank with no head where A = 2)
# and at 4; at 1 the sharded code meets the unsharded one. The meshes of DP x TP (ZeRO-1, Adasum's
# powers of two, the collectives' groups, checkpoints resharded) need 4 ranks for DP 2 x TP 2 and
# 3 for an uneven DP; the pipeline's 2 and 4 (PP 2, TP 2 x PP 2, PP 4; 3: PP 3 and TP 3);
# context parallelism's 2, 3 and 4 (CP 2, 3, 4 and TP 2 x CP 2; the models, test_cp_lm, at 2 and
# 4: CP 2, CP 4 and TP 2 x CP 2; CP 3 and CP 1 in the long set); the mixture of experts'
# (test_moe) at 2 and 4: EP 2, EP 4 and TP 2 x EP 2, EP 1 and an uneven split in the long set.
# The planner's depth test plans alike on every rank (the counting backend needs no peers): one
# rank in the quick set, its 24 CPU seconds at 3 ranks in the long one.
# Programs without ranks of their own run on one.
nps() {
    case "$1" in
    test_ops_* | test_env) echo "1|" ;;
    test_plan_depth) echo "1|2 3 4" ;;
    test_safetensors | test_text) echo "1|2" ;;
    test_comm | test_optim | test_dp | test_ckpt) echo "3 4|1 2" ;;
    test_pipeline | test_pipeline_lm | test_cp_attn) echo "2 3 4|1" ;;
    test_cp_lm | test_moe) echo "2 4|1 3" ;;
    *) echo "1 3|2 4" ;;
    esac
}
phase "C tests"
for t in $B/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    s=$(nps "$name") q=${s%|*} l=${s#*|} n=""
    quick_set && n="$q"
    long_set && n="$n $l"
    for np in $(printf '%s\n' $n | sort -n); do run "$name" "$np" "$t"; done
done
quick_set && run readme_example 2 $B/readme_example

# ---- the CUDA backend on the CPU ----------------------------------------------------------------
# (kernels/cuda/*.cu compiled by g++ against the CUDA emulation in tests/gpu/emu/)
phase emulator
# tests/gpu/ops.c, every CUDA op against the host op (under AddressSanitizer, build/san, the same
# ops run in the descending schedule's run below: not a third time)
quick_set && [ "$B" != build/san ] && run gpu_emu_ops 1 $B/tests/gpu_emu_ops
# (with the emulated cuBLASLt finding no algorithm, so the backend's own GEMM kernel and composed
# linear_fwd run: the random schedule's checked run below, against the host as here)
# and on a GPU that gives a block 99 KiB of shared memory (sm_86/89): the tensor-core attention
# takes at most 78 KB a block, so it runs there at D = 64 and 128 alike (the launchers' check)
# (not again under AddressSanitizer: the same code as gpu_emu_ops, only the launchers' check
# differs, and the sanitized emulation takes 87 s of CI's time)
long_set && [ "$B" != build/san ] && run gpu_emu_ops_smem99 1 -x TPK_EMU_SMEM_OPTIN=101376 $B/tests/gpu_emu_ops
# and on the checked build (every load and store of the kernels observed) under the shared-memory
# race detector, with each warp alone from barrier to barrier in descending and in a seeded random
# order, the grid-stride launches capped at 3 blocks so every loop takes several trips (a kernel
# whose answer depends on the schedule fails against the host; a load or store outside every
# allocation fails). The AddressSanitizer build cannot take the instrumentation: the descending
# schedule alone, there in make test-sanitize's own run.
race=TPK_EMU_RACE=1
[ "$B" = build/san ] && race=TPK_EMU_RACE=0
# (one warp at a time, every access observed: the slowest programs, 49-66 s in build/ and 54 s in
# build/san on 2 cores; on a busier machine one once took 87% of a 300 s limit: these get 900 s)
limit=900
if long_set || [ "$B" = build/san ]; then
    run gpu_emu_ops_race_desc 1 -x $race -x TPK_EMU_SCHED=desc -x TPK_EMU_GRID_CAP=3 $B/tests/gpu_emu_ops_chk
fi
# (the random schedule in build/ only: under AddressSanitizer the descending one covers the same
# memory accesses; with the emulated cuBLASLt finding no algorithm, so the backend's own GEMM
# kernel and composed linear_fwd, which the descending run does not reach, are checked too: the
# cases of the GEMMs and the linears alone (TPK_TEST_MATCH, tests/test.h), the rest being the
# descending run's, which saves CI two minutes of the emulator's slowest program)
long_set && [ "$B" != build/san ] &&
    run gpu_emu_ops_race_random 1 -x $race -x TPK_EMU_SCHED=random:2026 -x TPK_EMU_GRID_CAP=3 -x TPK_EMU_LT_NOALGO=1 -x TPK_TEST_MATCH=gemm,linear $B/tests/gpu_emu_ops_chk
limit=
# the emulation's own test: faulty kernels it must catch (races, cp.async read in flight, launch
# limits, reads past an allocation), their correct variants clean under every schedule; its
# detector needs the access instrumentation, which the AddressSanitizer build (build/san) lacks
if long_set && [ "$B" != build/san ]; then
    if [ -x $B/tests/gpu_emu_race ]; then
        run gpu_emu_race 1 $B/tests/gpu_emu_race
    else
        echo "FAIL gpu_emu_race: $B/tests/gpu_emu_race was not built (make test-long builds it)"; failed=$((failed + 1))
    fi
fi
# the CUDA layers and GPT-2 model (tests/gpu/layers.c) on the emulated backend against the host,
# ranks over MPI: at 3 (uneven splits), and at 2 also on the checked build with the descending
# schedule (in build/san: make test-sanitize's run)
quick_set && run gpu_emu_layers 3 $B/tests/gpu_emu_layers
long_set && run gpu_emu_layers 2 $B/tests/gpu_emu_layers
if long_set || [ "$B" = build/san ]; then
    run gpu_emu_layers_race_desc 2 -x $race -x TPK_EMU_SCHED=desc -x TPK_EMU_GRID_CAP=3 $B/tests/gpu_emu_layers_chk
fi
# the trainer on the emulated CUDA backend against the host's (each emulated step takes seconds)
long_set && script train_emu 1-2 tests/train_emu.sh

# ---- the checks of the build and the references -------------------------------------------------
phase other
# the kit from a CUDA C++ file (tests/cuda_cxx.cu): built by make cuda-check where nvcc is found
if long_set; then
    if [ -x $B/tests/cuda_cxx ]; then
        run cuda_cxx 1 $B/tests/cuda_cxx
    elif command -v nvcc >/dev/null 2>&1 && [ "$B" = build ]; then
        echo "FAIL cuda_cxx: nvcc is present but $B/tests/cuda_cxx was not built"; failed=$((failed + 1))
    else
        echo "cuda_cxx: skipped (no nvcc: tests/cuda_cxx.cu not compiled)"
    fi
fi

# the PyTorch reference: where Debian's python3 (not another one first on PATH) imports torch
# (make test: at t = 2 and 3, sequence parallelism on at one and off at the other, a key/value
# head on two ranks at 3; make test-long: at t = 1 and 4. The tied Llama and GPT-NeoX's tanh GELU,
# variants of a family run at both: at t = 2 with SP in make test, at 3 in make test-long)
py=/usr/bin/python3
if [ -x "$py" ] && "$py" -c 'import torch' >/dev/null 2>&1; then
    tnp=""
    quick_set && tnp="2 3"
    long_set && tnp="$tnp 1 4"
    # GPT-2; Llama (A=6, G=2: a key/value head on two ranks at t = 3, 4) untied, and tied; GPT-NeoX;
    # Mixtral at EP 2 x DP 2 (2 ranks, quick), EP 1 (1) and TP 2 x EP 2 x DP 2 (4, long);
    # Qwen2-MoE the same, with norm_topk_prob at EP 1; with dense layers between the sparse ones
    # (decoder_sparse_step 2, mlp_only_layers [3]) at EP 2 x DP 2 alone (quick)
    for model in gpt2 llama llama_tied neox neox_tanh mixtral qwen2_moe qwen2_moe_dense; do
        mnp=$tnp
        case $model in llama_tied | neox_tanh) mnp=$(pick 2 "1 3 4") ;; esac
        case $model in qwen2_moe_dense) mnp=$(pick 2 "") ;; esac
        for np in $mnp; do
            case $model in mixtral | qwen2_moe*) [ "$np" = 3 ] && continue ;; esac
            odd=""; even=""
            if [ $((np % 2)) = 1 ]; then odd=sp; else even=sp; fi
            case $model in  # sequence parallelism at odd t (the tied Llama: at even t)
            gpt2) args="$odd" name=torch_reference ;;
            llama) args="$odd llama" name=torch_reference_llama ;;
            llama_tied) args="$even llama tied" name=torch_reference_llama_tied ;;
            neox) args="$odd neox" name=torch_reference_neox ;;
            neox_tanh) args="$even neox tanh" name=torch_reference_neox_tanh ;;
            mixtral) args="mixtral" name=torch_reference_mixtral
                     [ "$np" = 1 ] || args="mixtral ep2" ;;
            qwen2_moe) args="qwen2_moe norm" name=torch_reference_qwen2_moe
                       [ "$np" = 1 ] || args="qwen2_moe ep2" ;;
            qwen2_moe_dense) args="qwen2_moe ep2 dense" name=torch_reference_qwen2_moe_dense ;;
            esac
            dir=$B/tests/torch_${model}_np$np
            rm -rf "$dir"
            t0=$(date +%s)
            cpu_now; c0=$cpu
            if out=$(timeout $((300 * scale)) mpirun $mpiflags -np "$np" $B/tests/torch_dump "$dir" $args 2>&1); then
                out=$(timeout $((300 * scale)) "$py" tests/torch_ref.py "$dir" 2>&1)
            else
                out="$out
FAIL torch_dump $args at np=$np"
            fi
            secs=$(($(date +%s) - t0))
            cpu_now
            row "$name" "$np" "$out" 0 "$secs" $((300 * scale)) $((cpu - c0))
        done
    done
    # make bench-gpt2's script end to end on a tiny model (its numbers are not checked: not a timed test)
    if quick_set; then
        out=$(timeout $((300 * scale)) "$py" bench/gpt2_step.py --trainer $B/train --model tiny --device cpu --dtype f32 --vocab 300 --steps 2 --warmup 1 --json 2>&1)
        if printf '%s\n' "$out" | "$py" -c 'import json, sys; r = json.loads(sys.stdin.read()); assert r["rows"]["tpk"]["tokens_per_s"] > 0 and any(k.startswith("torch eager") for k in r["rows"]), r' >/dev/null 2>&1; then
            out="ok bench/gpt2_step.py runs tpk's trainer and PyTorch's eager model"
        else
            out="FAIL bench/gpt2_step.py: $(printf '%s\n' "$out" | head -5)"
        fi
        row bench_gpt2_script 1 "$out" 0
    fi
else
    echo "torch_reference: skipped (Debian's python3-torch is not importable by $py; sudo apt-get install python3-torch)"
fi

if quick_set; then
    # make gpu-report's report, checked on the CPU (tests/gpu_report.py): the generator on recorded GPU
    # figures at each target's edge, the command without a GPU, a host dry run of the whole pipeline
    py3=$(command -v python3 || echo /usr/bin/python3)
    t0=$(date +%s)
    cpu_now; c0=$cpu
    out=$(timeout $((300 * scale)) "$py3" tests/gpu_report.py "$B" 2>&1)
    rc=$? secs=$(($(date +%s) - t0))
    cpu_now
    row gpu_report 1 "$out" 0 "$secs" $((300 * scale)) $((cpu - c0))
    # make cuda-report's figures and budget checks on a hand-counted ptxas log and SASS (no nvcc needed)
    script cuda_report 1 tests/cuda_report.sh

    # install into build/inst and build the README example against it with pkg-config (normal build
    # only; the host kit, NVCC=: the CUDA archive is make cuda-check's)
    inst="$PWD/build/inst"
    if [ "$B" != build ]; then
        echo "pkgconfig_example: skipped in $B (make install installs the normal build)"
    elif make --no-print-directory -s NVCC= install PREFIX="$inst" >> "$log" 2>&1 &&
       mpicc -std=c11 -Wall -Wextra -Werror build/readme_example.c \
           $(PKG_CONFIG_PATH="$inst/lib/pkgconfig" pkg-config --cflags --libs tpk) -o build/tests/pkgconfig_example >> "$log" 2>&1; then
        run pkgconfig_example 2 build/tests/pkgconfig_example
    else
        echo "FAIL make install + pkg-config build of the README example (see $log)"; failed=$((failed + 1))
    fi
    # the CMake package (make install DESTDIR=..., find_package(tpk), tpk::tpk; tests/cmake.sh), on
    # the normal build only as above
    if [ "$B" = build ]; then script cmake 2 tests/cmake.sh
    else echo "cmake_example: skipped in $B (make install installs the normal build)"; fi
fi

# every header compiles alone with a plain C compiler, without MPI or CUDA headers — those that
# need MPI (runtime/mpi.h and the headers including one that does: the include graph read once,
# its fixed point in awk) with mpicc; and as C++17 (those needing MPI with mpicxx, which brings
# <mpi.h>): make test compiles every header in one C++ translation unit, make test-long each
# header alone as C++ too (76 compiles of 0.6 s; each alone already in C: the quick set's C pass)
mpi_headers=$(for h in include/tpk/*.h include/tpk/*/*.h; do
    sed -n 's/^#include "\(.*\)"/\1/p' "$h" | while read -r inc; do
        printf '%s %s\n' "$h" "$(realpath -m --relative-to=. "$(dirname "$h")/$inc")"
    done
done | awk '{ e[NR] = $1; t[NR] = $2; n = NR }
    END { m["include/tpk/runtime/mpi.h"] = 1
          do { grew = 0; for (i = 1; i <= n; i++) if ((t[i] in m) && !(e[i] in m)) { m[e[i]] = 1; grew = 1 } } while (grew)
          for (h in m) print h }')
needs_mpi() { printf '%s\n' "$mpi_headers" | grep -qx "$1"; }
# header_jobs LANG PLAIN MPI FLAGS: each header compiled alone by PLAIN (MPI where it needs MPI),
# two at a time (each compile is one process); prints "FAIL header H (LANG)" per failure
header_jobs() {
    for h in include/tpk/*.h include/tpk/*/*.h; do
        if needs_mpi "$h"; then echo "$3 $h"; else echo "$2 $h"; fi
    done | xargs -P 2 -n 2 sh -c 'printf "#include <%s>\nint tpk_header_check;\n" "${1#include/}" |
        $0 '"$4"' -Wall -Wextra -Werror -Iinclude -c - -o /dev/null || echo "FAIL header $1 ('"$1"')"'
}
# header_verdict WHAT: counts $hout (its FAIL lines shown) as one case
header_verdict() {
    printf '%s\n' "$hout" | grep -v '^$' | sed 's/^/    /'
    if ! printf '%s\n' "$hout" | grep -q '^FAIL'; then passed=$((passed + 1)); echo "$1: ok"; else failed=$((failed + 1)); fi
}
if quick_set; then
    hout=$(header_jobs C11 "${CC:-cc}" mpicc "-std=c11 -x c" 2>&1)
    header_verdict "headers compile alone with ${CC:-cc} -std=c11 -Werror"
    hout=$({ for h in include/tpk/*.h include/tpk/*/*.h; do printf '#include <%s>\n' "${h#include/}"; done
        echo 'int tpk_header_check;'; } |
        mpicxx -std=c++17 -pedantic -x c++ -Wall -Wextra -Werror -Iinclude -c - -o /dev/null 2>&1 ||
        echo "FAIL headers in one translation unit (C++17)")
    header_verdict "headers compile together with mpicxx -std=c++17 -pedantic -Werror"
fi
if long_set; then
    hout=$(header_jobs C++17 "${CXX:-g++}" mpicxx "-std=c++17 -pedantic -x c++" 2>&1)
    header_verdict "headers compile alone with ${CXX:-g++} -std=c++17 -pedantic -Werror"
fi

# ---- the trainer's test scripts -----------------------------------------------------------------
phase "trainer scripts"
# the GPT-2 trainer end to end (resume, resharding, evaluation, Hugging Face import, bad input)
script train 1-4 tests/train.sh
# a model of one's own (examples/custom_model.c): the same losses at 1, 2 and 4 ranks, a checkpoint
# saved at TP 2 x DP 2 and resumed at 1 and 2 ranks
quick_set && script custom_model 1-4 tests/custom_model.sh
# the configuration planner against real runs (memory), its table, --json, --calibrate and bad input
script plan 1-4 tests/plan.sh
# text: Unicode classes, NFC and UTF-8 against Python (tests/unicode.sh); the tokenizer against
# Hugging Face tokenizers, build/tokenize, the trainer's --tokenizer, --prompt, sampling flags
quick_set && script unicode 1 tests/unicode.sh
quick_set && script tokenizer 1-2 tests/tokenizer.sh
# faults: a rank killed, the checkpoint writer killed, the disk full, a rank stopped (the collectives'
# timeout); processes killed and stopped, not memory: not again under AddressSanitizer (build/san)
[ "$B" != build/san ] && script faults 1-2 tests/faults.sh
# what a save never touches or mixes: links, two runs on one folder (the lock), --keep, a resumed --csv
script ckpt_guard 2 tests/ckpt_guard.sh
# the timeout measures progress: a rank slow to read a checkpoint, a rank stopped (--timeout 2)
quick_set && [ "$B" != build/san ] && script slow_rank 2 tests/slow_rank.sh
phase ""

# ---- the summary per phase ----------------------------------------------------------------------
now=$(date +%s); cpu_now
bs=${TPK_BUILD_SECONDS:-} bc=""
[ -n "${TPK_BUILD_TIMES:-}" ] && [ -f "$TPK_BUILD_TIMES" ] && bc=$(cpu_of "$TPK_BUILD_TIMES")
echo "time per phase ($TPK_TESTS; wall seconds, and CPU seconds: user + sys of every process):"
if [ -n "$bs" ]; then printf '  %-16s %5d s  %5s s CPU\n' build "$bs" "${bc:-?}"; fi
printf '%s' "$summary"
printf '  %-16s %5d s  %5d s CPU\n' total $((now - total_t0 + ${bs:-0})) $((cpu - total_c0 + ${bc:-0}))
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
