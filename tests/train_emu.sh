#!/bin/sh
# tests/train_emu.sh — the GPT-2 trainer on the CUDA backend emulated on the CPU
# ($B/tests/gpt2_train_emu: examples/gpt2_train.c linked with the emulated CUDA archive; two ranks
# share the one emulated device over MPI) against the same trainer on the host backend:
#   f32, t = 2, dropout 0.1: the cross-entropy's loss by statistics, all-gather and gradient per
#       chunk, the generic attention kernels, the fused GELU backward, clipping on the device —
#       every printed loss, gradient norm and validation loss equal to the host's (4 digits);
#   bf16, DP 2 (t = 1), D = 64: the fused cross-entropy kernel (xent_fused), the tensor-core
#       attention with dropout, the DP buckets — every loss within 1e-3 relative of the host's.
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup train_emu
fail() { echo "FAIL $1"; [ -n "$2" ] && tail -8 "$2" | sed 's/^/    /'; }
# the step lines' "loss", "grad norm" and "val loss" values, one per line
values() { grep '^step' "$1" | sed 's/ | /\n/g' | grep -E '^(step|loss|grad norm|val loss)' | sed 's/^[a-z ]* //'; }

run2() { # NAME BINARY ARGS...: two ranks
    name=$1 bin=$2; shift 2
    timeout 600 mpirun $mpiflags -np 2 "$bin" "$@" > "$T/$name.log" 2>&1
}
f32="--text $text --layers 2 --hidden 64 --heads 4 --batch 4 --seq-len 32 --steps 6 --lr 3e-3 --warmup 2 --eval-every 3 --log-every 2 --seed 3 --tp 2 --dtype f32 --dropout 0.1"
if run2 f32_emu "$B/tests/gpt2_train_emu" $f32 && run2 f32_host "$B/gpt2_train" $f32 && grep -q "cuda backend" "$T/f32_emu.log" &&
   [ "$(values "$T/f32_emu.log")" = "$(values "$T/f32_host.log")" ] && [ -n "$(values "$T/f32_host.log")" ]; then
    ok "the trainer on the emulated CUDA backend, f32, t = 2, dropout: every loss, gradient norm and validation loss the host's"
else
    fail "the trainer on the emulated CUDA backend, f32, t = 2: losses differ from the host's" "$T/f32_emu.log"
    diff "$T/f32_emu.log" "$T/f32_host.log" | head -10 | sed 's/^/    /'
fi
bf="--text $text --layers 2 --hidden 128 --heads 2 --batch 2 --seq-len 64 --steps 4 --lr 3e-3 --warmup 2 --eval-every 2 --log-every 2 --seed 3 --tp 1 --dtype bf16 --dropout 0.1"
if run2 bf16_emu "$B/tests/gpt2_train_emu" $bf && run2 bf16_host "$B/gpt2_train" $bf && grep -q "cuda backend, bf16" "$T/bf16_emu.log"; then
    bad=$(grep '^step' "$T/bf16_emu.log" | sed 's/.*| loss \([0-9.]*\) .*/\1/' > "$T/a"; grep '^step' "$T/bf16_host.log" | sed 's/.*| loss \([0-9.]*\) .*/\1/' > "$T/b";
          paste "$T/a" "$T/b" | awk 'BEGIN { n = 0 } { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-3 * $2) bad++ } END { print (n < 2 ? "few" : bad + 0) }')
    if [ "$bad" = 0 ]; then ok "the trainer on the emulated CUDA backend, bf16, DP 2, D = 64: every loss within 1e-3 of the host's"
    else fail "the trainer on the emulated CUDA backend, bf16: $bad losses differ from the host's by more than 1e-3" "$T/bf16_emu.log"; fi
else
    fail "the trainer on the emulated CUDA backend, bf16, DP 2: did not run" "$T/bf16_emu.log"
fi
