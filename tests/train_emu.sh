#!/bin/sh
# tests/train_emu.sh — the GPT-2 trainer on the CUDA backend emulated on the CPU
# ($B/tests/train_cuda_emu: examples/train.c linked with the emulated CUDA archive; two ranks
# share the one emulated device over MPI) against the same trainer on the host backend:
#   f32, t = 2, dropout 0.1: the cross-entropy's loss by statistics, all-gather and gradient per
#       chunk, the generic attention kernels, the fused GELU backward, clipping on the device —
#       every printed loss, gradient norm and validation loss equal to the host's (4 digits); the
#       same with sequence parallelism and selective recompute, for Llama (grouped-query
#       attention, SwiGLU, RMSNorm, RoPE) and for GPT-NeoX (per-head QKV packed with partial RoPE,
#       the exact GELU); Qwen2-MoE (its MoE block's sums over TP through the device: the routing
#       weights' gradient and the shared gate's dots) under sequence parallelism, full recompute;
#   bf16, DP 2 (t = 1), D = 64: the fused cross-entropy kernel (xent_fused), the tensor-core
#       attention with dropout, the DP buckets — every loss within 1e-3 relative of the host's;
#   one rank in this build without NCCL: the world over MPI, the host's losses.
# A long run (each emulated step takes seconds): make test-long's (tests/run.sh runs it there).
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup train_emu
fail() { echo "FAIL $1"; [ -n "$2" ] && tail -8 "$2" | sed 's/^/    /'; }
# the step lines' "loss", "grad norm" and "val loss" values, one per line
values() { grep '^step' "$1" | sed 's/ | /\n/g' | grep -E '^(step|loss|grad norm|val loss)' | sed 's/^[a-z ]* //'; }

run2() { # NAME BINARY ARGS...: two ranks
    name=$1 bin=$2; shift 2
    timeout $((600 * scale)) mpirun $mpiflags -np 2 "$bin" "$@" > "$T/$name.log" 2>&1
}
# same NAME WHAT ARGS...: f32 at t = 2, every printed loss, gradient norm and validation loss equal to the host's
same() {
    sn=$1 what=$2; shift 2 # (run2 sets name and bin)
    if run2 "${sn}_emu" "$B/tests/train_cuda_emu" "$@" && run2 "${sn}_host" "$B/train" "$@" && grep -q "cuda backend" "$T/${sn}_emu.log" &&
       [ "$(values "$T/${sn}_emu.log")" = "$(values "$T/${sn}_host.log")" ] && [ -n "$(values "$T/${sn}_host.log")" ]; then
        ok "the trainer on the emulated CUDA backend, $what: every loss, gradient norm and validation loss the host's"
    else
        fail "the trainer on the emulated CUDA backend, $what: losses differ from the host's" "$T/${sn}_emu.log"
        diff "$T/${sn}_emu.log" "$T/${sn}_host.log" | head -10 | sed 's/^/    /'
    fi
}
f32="--text $text --layers 2 --hidden 64 --heads 4 --batch 4 --seq-len 32 --steps 6 --lr 3e-3 --warmup 2 --eval-every 3 --log-every 2 --seed 3 --tp 2 --dtype f32"
same f32 "f32, t = 2, dropout" $f32 --dropout 0.1
same f32_sp "f32, t = 2, sequence parallel, selective recompute, dropout" $f32 --dropout 0.1 --sequence-parallel --recompute selective
same llama "Llama (G = 2, SwiGLU, RMSNorm, RoPE), f32, t = 2" $f32 --arch llama --kv-heads 2
same neox "GPT-NeoX (parallel residual, per-head QKV, half of each head rotated, exact GELU), f32, t = 2" $f32 --arch neox --rotary-pct 0.5
same qwen_sp "Qwen2-MoE (E 4, k 2, a shared expert), f32, t = 2, sequence parallel, full recompute" $f32 --arch qwen2_moe --kv-heads 2 --experts 4 --moe-top-k 2 --moe-ffn 32 --shared-ffn 48 --sequence-parallel --recompute full
bf="--text $text --layers 2 --hidden 128 --heads 2 --batch 2 --seq-len 64 --steps 4 --lr 3e-3 --warmup 2 --eval-every 2 --log-every 2 --seed 3 --tp 1 --dtype bf16 --dropout 0.1"
if run2 bf16_emu "$B/tests/train_cuda_emu" $bf && run2 bf16_host "$B/train" $bf && grep -q "cuda backend, bf16" "$T/bf16_emu.log"; then
    bad=$(grep '^step' "$T/bf16_emu.log" | sed 's/.*| loss \([0-9.]*\) .*/\1/' > "$T/a"; grep '^step' "$T/bf16_host.log" | sed 's/.*| loss \([0-9.]*\) .*/\1/' > "$T/b";
          paste "$T/a" "$T/b" | awk 'BEGIN { n = 0 } { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-3 * $2) bad++ } END { print (n < 2 ? "few" : bad + 0) }')
    if [ "$bad" = 0 ]; then ok "the trainer on the emulated CUDA backend, bf16, DP 2, D = 64: every loss within 1e-3 of the host's"
    else fail "the trainer on the emulated CUDA backend, bf16: $bad losses differ from the host's by more than 1e-3" "$T/bf16_emu.log"; fi
else
    fail "the trainer on the emulated CUDA backend, bf16, DP 2: did not run" "$T/bf16_emu.log"
fi
# one rank with one GPU in a build without NCCL: the world over MPI instead (no NCCL to ask for)
one="--text $text --layers 2 --hidden 64 --heads 4 --batch 4 --seq-len 32 --steps 4 --lr 3e-3 --warmup 2 --log-every 2 --seed 3 --dtype f32"
if timeout $((600 * scale)) mpirun $mpiflags -np 1 "$B/tests/train_cuda_emu" $one > "$T/one_emu.log" 2>&1 && timeout $((600 * scale)) mpirun $mpiflags -np 1 "$B/train" $one > "$T/one_host.log" 2>&1 &&
   grep -q "cuda backend" "$T/one_emu.log" && [ "$(values "$T/one_emu.log")" = "$(values "$T/one_host.log")" ] && [ -n "$(values "$T/one_host.log")" ]; then
    ok "the trainer on the emulated CUDA backend, one rank in a build without NCCL: trains over MPI, the host's losses"
else
    fail "the trainer on the emulated CUDA backend, one rank without NCCL: did not train as the host did" "$T/one_emu.log"
fi
