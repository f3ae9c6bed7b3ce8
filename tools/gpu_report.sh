#!/bin/sh
# tools/gpu_report.sh — `make gpu-report`: a GPU's first hour in one command, within a time budget.
# Runs, each step under a time limit cut to what is left of TPK_REPORT_BUDGET (570 s, so the whole
# command ends within 10 minutes on one H100):
#   build       make cuda-check, build/train and the GPU benchmarks         (limit 180 s)
#   test-gpu    make test-gpu: every op against the host (the fused cuBLASLt epilogues against the
#               composed ops among them), the layers at t = 1, 2, 3, the resume; the op tests under
#               compute-sanitizer memcheck, racecheck, synccheck and initcheck, side by side
#                                                                                (limit 240 s)
#   bench-gpu   bench/gemm f32 and bf16 (the LM-head GEMMs against a plain GEMM), bench/gemm --fp8
#               and bench/torch_fp8.py (the FP8 linear's GEMMs at the Llama 1B's shapes against bf16
#               and against torch._scaled_mm; 45 s each); bench/kernels f32,
#               and bf16 at the GPT-2 124M and 350M attention shapes and at D = 128 (memory-bound
#               ops against copy bandwidth, attention against PyTorch SDPA), all with --json
#                                                                       (limits 45 s, 45 s, 4 x 40 s)
#   bench-gpt2 and bench-families: bench/gpt2_step.py --json, the models with a target first:
#               GPT-2 124M (150 s), Llama 1B (240 s: its trainer also with --fp8 delayed),
#               GPT-NeoX 1B (180 s), then GPT-2 350M (150 s)
#               and GPT-NeoX 410M (150 s)
# Every step's output goes to DIR (build/gpu-report/): STEP.json (a benchmark's figures), STEP.log
# (its output), steps.tsv (step, status: ok, failed, timeout or skipped, seconds, limit, note), the
# GPU tests' results.tsv and sanitizer outputs; tools/gpu_report.py then writes build/gpu-report.md
# (every figure beside its target, PASS or BELOW; every step that failed or did not run named) and
# the logs are tarred into build/gpu-report-logs.tar.gz. The report is written whatever happened.
# Exit status (gpu_report.py's): 0 when every test and sanitizer ran and passed (a benchmark below
# its target does not fail the command: it is a figure), 1 when one failed or did not run, 2
# without a GPU (the report then says "no GPU" and nothing is measured).
# TPK_REPORT_HOST=1: a dry run on the host backend (the benchmarks at tiny sizes, no build, no GPU
# tests), to check the pipeline on a CPU (tests/gpu_report.py does); the report says so.
# TPK_REPORT_ONLY="STEP ...": only these steps (and the build; e.g. "llama-1B neox-1B neox-410M"
# when the budget holds no more), the others named as skipped; the tests are then not judged.
# Environment: B (build dir), MAKE, PYTHON, TPK_REPORT_BUDGET, TPK_REPORT_DIR, TPK_REPORT_HOST,
# TPK_REPORT_ONLY.
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}
MAKE=${MAKE:-make}
PYTHON=${PYTHON:-python3}
budget=${TPK_REPORT_BUDGET:-570}
dir=${TPK_REPORT_DIR:-$B/gpu-report}
host=${TPK_REPORT_HOST:-}
only=${TPK_REPORT_ONLY:-}
benches="gemm-f32 gemm-bf16 gemm-fp8 torch-fp8 kernels-f32 kernels-bf16-gpt2-124M kernels-bf16-gpt2-350M kernels-bf16-d128 gpt2-124M llama-1B neox-1B gpt2-350M neox-410M"
md=$dir.md tar=$dir-logs.tar.gz
start=$(date +%s)
rm -rf "$dir" && mkdir -p "$dir" || exit 1
steps=$dir/steps.tsv
: > "$steps"

gpu=
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
mode=gpu
[ -n "$gpu" ] || mode=nogpu
[ -n "$host" ] && mode=host

# the machine, for the report's head
{
    echo "mode	$mode"
    echo "date	$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit	$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    [ -n "$gpu" ] && echo "gpu	$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "nvcc	$(nvcc --version 2>/dev/null | tail -1)"
    echo "torch	$($PYTHON -c 'import torch; print(torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo none)"
    echo "budget	$budget"
    echo "only	$only"
} > "$dir/env.tsv"

# step NAME LIMIT CMD...: runs CMD (output in DIR/NAME.log) under min(LIMIT, what is left); a row of steps.tsv
step() {
    name=$1 lim=$2; shift 2
    if [ -n "$only" ]; then # TPK_REPORT_ONLY: its steps and the build
        case " build $only " in
        *" $name "*) ;;
        *) skip "$name" "not in TPK_REPORT_ONLY"; echo "gpu-report: $name skipped: not in TPK_REPORT_ONLY"; return 1 ;;
        esac
    fi
    left=$((budget - ($(date +%s) - start)))
    [ "$lim" -gt "$left" ] && lim=$left
    if [ "$lim" -lt 10 ]; then
        printf '%s\tskipped\t0\t0\tno time left in the %d s budget\n' "$name" "$budget" >> "$steps"
        echo "gpu-report: $name skipped: no time left"; return 1
    fi
    echo "gpu-report: $name (limit $lim s)"
    t0=$(date +%s)
    timeout -k 10 "$lim" "$@" > "$dir/$name.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    case $rc in
    0) st=ok note= ;;
    124 | 137) st=timeout note="stopped at its $lim s limit" ;;
    *) st=failed note="exit status $rc" ;;
    esac
    printf '%s\t%s\t%d\t%d\t%s\n' "$name" "$st" "$secs" "$lim" "$note" >> "$steps"
    tail -2 "$dir/$name.log" | sed 's/^/    /'
    return $rc
}
# skip NAME WHY: a step that does not run
skip() { printf '%s\tskipped\t0\t0\t%s\n' "$1" "$2" >> "$steps"; }
# bench NAME LIMIT CMD...: a benchmark whose stdout is JSON (DIR/NAME.json; stderr in DIR/NAME.log)
bench() {
    name=$1 lim=$2; shift 2
    step "$name" "$lim" sh -c '"$@" > "$0"' "$dir/$name.json" "$@"
}

if [ "$mode" = nogpu ]; then
    echo "gpu-report: no GPU present (nvidia-smi finds none): nothing measured; the report says so"
    for s in build test-gpu $benches; do
        skip "$s" "no GPU"
    done
elif [ "$mode" = host ]; then
    skip build "host dry run: built beforehand"
    skip test-gpu "host dry run: no GPU tests"
    bench gemm-f32 60 "$B/bench/gemm" --host --H 64 --tokens 64 --vocab 500 --iters 1 --t 1,2 --peak 256 --json
    skip gemm-bf16 "host dry run: f32 only"
    bench gemm-fp8 60 "$B/bench/gemm" --host --fp8 --H 64 --F 128 --tokens 64 --peak 128 --iters 1 --json
    skip torch-fp8 "host dry run: torch._scaled_mm needs a GPU"
    bench kernels-f32 60 "$B/bench/kernels" --host --n 4096 --iters 1 --B 1 --S 64 --A 2 --D 64 --json
    bench kernels-bf16-gpt2-124M 60 "$B/bench/kernels" --host --dtype bf16 --n 4096 --iters 1 --B 1 --S 64 --A 2 --D 64 --json
    skip kernels-bf16-gpt2-350M "host dry run: one bf16 shape"
    skip kernels-bf16-d128 "host dry run: one bf16 shape"
    bench gpt2-124M 120 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model tiny --device cpu --dtype f32 --vocab 300 --steps 1 --warmup 0 --no-compile --json
    bench llama-1B 120 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model llama-tiny --device cpu --dtype f32 --steps 1 --warmup 0 --no-torch --fp8 delayed --json
    bench neox-1B 120 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model neox-tiny --device cpu --dtype f32 --steps 1 --warmup 0 --no-torch --json
    # (the families without PyTorch: make test's time; make bench-families-check runs their models)
    skip gpt2-350M "host dry run: one model a family"
    skip neox-410M "host dry run: one model a family"
else
    built=
    step build 180 $MAKE --no-print-directory cuda-check "$B/train" && built=1
    if [ -n "$built" ]; then
        # the sanitizers end 20 s before the step's limit, so their rows are written
        lim=240 left=$((budget - ($(date +%s) - start)))
        [ "$lim" -gt "$left" ] && lim=$left
        rm -f "$B/tests/gpu/results.tsv" "$B/tests/gpu/log.txt" "$B"/tests/gpu/sanitizer-*.txt # (no rows of an earlier run)
        TPK_SANITIZER_TIMEOUT=$((lim - 20)) TPK_GPU_TIMEOUT=$((lim - 20)) step test-gpu "$lim" $MAKE --no-print-directory test-gpu
        for f in "$B/tests/gpu/results.tsv" "$B/tests/gpu/log.txt" "$B"/tests/gpu/sanitizer-*.txt; do
            [ -f "$f" ] && cp "$f" "$dir/"
        done
        # the benchmarks, one at a time, each alone on the GPU (the runs of make bench-gpu, and the 350M attention shape)
        bench gemm-f32 45 "$B/bench/gemm" --json
        bench gemm-bf16 45 "$B/bench/gemm" --dtype bf16 --json
        # the FP8 linear's GEMMs at the Llama 1B's shapes, tpk's and PyTorch's
        bench gemm-fp8 45 "$B/bench/gemm" --fp8 --H 2048 --F 8192 --json
        bench torch-fp8 45 "$PYTHON" bench/torch_fp8.py --H 2048 --F 8192 --json
        bench kernels-f32 40 "$B/bench/kernels" --json
        bench kernels-bf16-gpt2-124M 40 "$B/bench/kernels" --dtype bf16 --B 16 --S 1024 --A 12 --D 64 --json
        bench kernels-bf16-gpt2-350M 40 "$B/bench/kernels" --dtype bf16 --B 8 --S 1024 --A 16 --D 64 --json
        bench kernels-bf16-d128 40 "$B/bench/kernels" --dtype bf16 --B 8 --S 2048 --A 16 --D 128 --json
        # make bench-gpt2's and bench-families' runs: tpk's trainer, PyTorch eager and
        # torch.compile; the models with a target first
        bench gpt2-124M 150 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model 124M --json
        bench llama-1B 240 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model llama-1B --fp8 delayed --json
        bench neox-1B 180 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model neox-1B --json
        bench gpt2-350M 150 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model 350M --json
        bench neox-410M 150 "$PYTHON" bench/gpt2_step.py --trainer "$B/train" --model neox-410M --json
    else
        for s in test-gpu $benches; do
            skip "$s" "the build failed"
        done
    fi
fi

"$PYTHON" tools/gpu_report.py "$dir" "$md"
rc=$?
if [ "$rc" -gt 2 ]; then # no python, or the generator failed: the steps at least, by hand
    { echo "# GPU report: the generator failed (exit status $rc)"; echo; echo "step, status, seconds, limit, note:"; echo
      sed 's/\t/ | /g; s/^/    /' "$steps"; } > "$md"
    rc=1
fi
tar -czf "$tar" -C "$(dirname "$dir")" "$(basename "$dir")" 2>/dev/null || echo "gpu-report: could not write $tar"
echo "gpu-report: wrote $md and $tar in $(($(date +%s) - start)) s"
exit $rc
