#!/bin/sh
# tools/cuda_report.py (make cuda-report) on a small ptxas log and SASS listing written for this test
# (tests/cuda_report/: a kernel with an outer loop around an inner HMMA loop and a cold block that
# jumps back into the outer loop, and a kernel that spills), without nvcc: the figures it must
# compute are counted by hand below, and a budget past each limit must fail.
cd "$(dirname "$0")/.." || exit 1
py=python3
d=tests/cuda_report
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
report() { # BUDGET-TEXT: the report's output in $tmp/out, its exit status returned
    printf '%s\n' "$1" > "$tmp/budget.txt"
    $py tools/cuda_report.py --no-probe --no-source --res $d/ptxas.txt --sass $d/kernel.sass --launch $d/launch.txt \
        --budget "$tmp/budget.txt" > "$tmp/out" 2>&1
}
check() { # NAME PATTERN: a line of the last output matches the extended regular expression
    if grep -Eq "$2" "$tmp/out"; then echo "ok cuda_report: $1"; else echo "FAIL cuda_report: $1: no line matching /$2/ in:"; sed 's/^/    /' "$tmp/out"; fi
}
status() { # NAME WANT GOT
    if [ "$2" = "$3" ]; then echo "ok cuda_report: $1 (exit $3)"; else echo "FAIL cuda_report: $1: exit $3, expected $2"; sed 's/^/    /' "$tmp/out"; fi
}

# Every limit met; the spilling kernel past its target only. By hand, tiny_mma's outer loop (header
# 0x50, the cold block at 0x1c0 .. 0x1d0 inside it, the NOP left out): 21 instructions, HMMAs 1 + 1 + 1/2
# (HMMA.1688) = 2.5, so 8.40 a HMMA; shared memory LDSM .x4 512 + .x2 256 + LDS.U16 64 + STS.64 256
# = 1088 B and cp.async LDGSTS.128 512 B: 1600 / 2.5 = 640.0 B a HMMA, of which cp.async 204.8; one
# inner loop with HMMAs; whole kernel 29 instructions. Blocks per SM: 128 threads, 50000 B dynamic +
# 1 KiB reserved = 51072 B (128-byte units): sm_80 167936 / 51072 = 3, sm_90 233472 / 51072 = 4 (128
# registers: 4 warps a sub-partition, 16 a SM, 4 blocks); spilly_kernel 255 registers x 256 threads:
# 8 warps a SM, 1 block; its stack 64 B (not its callee's 16), spills 40 / 24 B.
report "spill * 0 0 *
spill sm_80 64 0 spilly_kernel
blocks * 3 2 tiny_mma<*>
insn/hmma sm_80 8.4 5.5 tiny_mma<64>
smem/hmma sm_80 640 700 tiny_mma<64>"
status "every limit met" 0 $?
check "main loop figures" '^tiny_mma<64> +21 +2\.5 +1 +8\.40 +640\.0 +204\.8 +0 \| +29 +2\.5 +11\.60 +640\.0 \| 0x0050 0x01d0$'
check "sm_80 blocks per SM limited by shared memory" '^tiny_mma<64> +128 +0/0 +0 +0\+50000 +128 code +3 smem$'
check "sm_90 blocks per SM" '^tiny_mma<64> +96 +0/0 +0 +0\+50000 +128 code +4 smem$'
check "spills and stack of the entry, not its callee" '^spilly_kernel +255 +40/24 +64 +1024\+0 +256 code +1 regs$'
check "over target, not failing" '^over target: sm_80 spilly_kernel: spill 64 > target 0 \(limit 64'
check "over target: insn/hmma" '^over target: sm_80 tiny_mma<64>: insn/hmma 8\.40 > target 5\.5'
check "summary" '^cuda-report: 3 kernels, 5 budget lines: 0 violations, 2 over target$'

report "spill * 0 0 *"
status "a spill fails" 1 $?
check "the spill named" '^VIOLATION: sm_80 spilly_kernel: spill 64 > limit 0 \(budget line 1\)$'

report "insn/hmma sm_80 8.3 5.5 tiny_mma<*>"
status "instructions per HMMA past the limit fail" 1 $?
check "insn/hmma named" '^VIOLATION: sm_80 tiny_mma<64>: insn/hmma 8\.40 > limit 8\.3'

report "smem/hmma * 639 280 tiny_mma<64>"
status "shared bytes per HMMA past the limit fail" 1 $?
check "smem/hmma named" '^VIOLATION: sm_80 tiny_mma<64>: smem/hmma 640\.00 > limit 639'

report "blocks * 4 4 tiny_mma<*>"
status "too few blocks per SM fail" 1 $?
check "blocks named, sm_80 only" '^VIOLATION: sm_80 tiny_mma<64>: blocks 3 < limit 4'
check "sm_90 meets it" '^cuda-report: 3 kernels, 1 budget lines: 1 violations, 0 over target$'

report "spill * 1000 0 *
spill sm_80 0 0 spilly_kernel"
status "the last matching line wins" 1 $?

report "regs * 255 255 *
spill sm_80 0 0 no_such_kernel"
status "a budget line matching no kernel fails" 1 $?
check "the stale line named" '^VIOLATION: budget line 2 \(spill sm_80 no_such_kernel\) matches no kernel$'

report "spill * zero 0 *"
status "a malformed budget line is refused" 2 $?
