#!/bin/sh
# tests/plan.sh — the configuration planner (build/plan, tpk/plan) against real runs, on the host:
#   memory: for 21 configurations (GPT-2, Llama, NeoX; TP, DP, PP, gradient accumulation, every
#   recompute mode, ZeRO-1, 2 and 3, HSDP, sequence parallelism; 1, 2 and 4 ranks) the planned
#   peak per rank
#   (--json peak_bytes, the largest over stages) is within 2% of the trainer's measured peak of a
#   real 2-step run (its "peak memory" line; with stages, the largest stage's), and the line's
#   weights, gradients, optimizer and ZeRO-3's gathered buffers (with stages the largest stage's
#   line) each the plan's part (tpk/train/memory.h; no gathered part in the line: the plan's 0);
#   --load DIR (a Hugging Face config.json) planned as the same flags; --json's keys and rejected
#   rows' reasons (a TP group past a node, a batch that does not divide, 3 heads over TP 2 planned
#   as the uneven split it is), ZeRO 0 to 3 planned at DP > 1 (the moments 1/DP from stage 1
#   on; ZeRO-2's gradients: the whole buffer the backward fills and its slice; ZeRO-3's weights:
#   the shard, less than ZeRO-2's, each stage its own with stages; gathered_bytes positive exactly
#   at ZeRO-3; the parts adding up to the peak); the trainer's
#   --plan trains with the configuration it prints;
#   --calibrate writes a profile that plan reads back; bad input: zero GPUs, GPUs that are not
#   whole nodes, a model that fits nowhere, a profile file without a key, an unknown profile.
#   Context parallelism: the planned peak of CP configurations against the trainer's (GPT-2 CP 2,
#   make test; Llama CP 2 with the all-gather and selective recompute, GPT-2 CP 4, CP 2 x DP 2
#   with ZeRO-1, TP 2 x CP 2 with SP and full recompute, CP 2 x PP 2, GPT-NeoX CP 2: make
#   test-long), --json's keys cp and cp_comm (every CP size of the ranks, both modes, with and
#   without stages, ZeRO at DP 1 x CP 2, the refusals: a sequence not a multiple of 2 CP, CP on the
#   CUDA backend), and the
#   trainer's --cp 2 --plan training with the configuration it prints (make test-long).
#   Mixture of experts (a balanced router assumed): Mixtral's planned peak at EP 2 and ZeRO-3 at
#   DP 4 x EP 2 (make test), at TP 2 x EP 2, EP 2 with full recompute, PP 2, CP 2 and ZeRO-2 at DP
#   4 x EP 2, a capacity factor's bound at PP 2 x EP 2, Qwen2-MoE's at EP 2 (and with dense
#   layers between the sparse ones), --json's ep, EP rejections, the trainer's --ep 2 --plan (make
#   test-long).
# make test (TPK_TESTS=quick) plans 10 of the 21 configurations (one per feature: each ZeRO stage —
# 0 at DP 1, 1, 2 and 3 at DP 2 —, TP with SP and selective recompute, PP, ZeRO-3 at PP x DP, TP x
# DP, GQA, TP x PP), reads a handwritten profile file and runs the rest; make test-long the other
# 11 (HSDP among them) and --calibrate (a minute of measurements).
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup plan
py=$(command -v python3 || echo /usr/bin/python3)
fail() { echo "FAIL $1"; printf '%s\n' "$out" | tail -6 | sed 's/^/    /'; }
M="--layers 2 --hidden 32 --heads 4 --seq-len 16"

# mem NAME NP "trainer flags" "plan flags": the trainer's peak (MB, largest stage) against the plan's
mem() {
    out=$(timeout $((120 * scale)) mpirun $mpiflags -np "$2" $B/train --text "$text" --steps 2 $3 2>&1)
    run=$(printf '%s\n' "$out" | grep -o 'peak memory[a-z ]* [0-9., ]* MB' | grep -o '[0-9][0-9.]*' |
          sort -g | tail -1)
    case "$4" in *--cp\ *) cp= ;; *) cp="--cp 1" ;; esac # one CP size: the flags' (else 1)
    out="$out
$($B/plan --profile cpu --vocab 256 --gpus "$2" --gpus-per-node "$2" $cp $4 --json 2>&1)"
    planned=$(printf '%s\n' "$out" | grep -c '"peak_bytes"')
    pk=$(printf '%s\n' "$out" | grep -o '"peak_bytes": [0-9]*' | grep -o '[0-9]*$')
    # the trainer splits its peak (without stages its line, with stages each stage's line: that of
    # the largest peak, the first on a tie, as the plan's parts are its peak stage's): each of
    # weights, gradients, optimizer and (ZeRO-3's, where the line names it) gathered equal to the
    # plan's part (to the line's 0.01 MB); a line without gathered: the plan's gathered_bytes 0
    split=$(printf '%s\n' "$out" | sed -n 's/.*peak memory \([0-9.]*\) MB.* = weights \([0-9.]*\)\( + gathered [0-9.]*\)* + gradients \([0-9.]*\) + optimizer \([0-9.]*\) .*/\1 \2 \4 \5\3/p' |
            sed 's/ + gathered / /' |
            awk 'NR == 1 || $1 + 0 > m { m = $1 + 0; s = $2 " " $3 " " $4 (NF == 5 ? " " $5 : "") } END { print s }')
    parts=$(for k in weights grads optimizer gathered; do printf '%s\n' "$out" | grep -o "\"${k}_bytes\": [0-9]*" | grep -o '[0-9]*$'; done | tr '\n' ' ')
    same=$(echo "$split $parts" | awk 'NF == 7 || NF == 8 { n = NF - 4; ok = 1; for (i = 1; i <= 4; i++) { if (i > n) { if ($(n + i) != 0) ok = 0; continue }; d = $(n + i) / 1e6 - $i; if (d < -0.006 || d > 0.006) ok = 0 }; print ok; exit } { print 0 }')
    what="weights, gradients, optimizer"; [ "$(echo "$split" | wc -w)" = 4 ] && what="$what, gathered"
    if [ -n "$run" ] && [ "$planned" = 1 ] && [ "$same" = 1 ] &&
       awk -v r="$run" -v p="$pk" 'BEGIN { d = p / 1e6 - r; if (d < 0) d = -d; exit !(d <= 0.02 * r) }'; then
        ok "plan_memory_$1 (trainer $run MB, planned $(awk -v p="$pk" 'BEGIN { printf "%.2f", p / 1e6 }') MB${split:+; $what $split MB as planned})"
    else
        fail "plan_memory_$1: trainer '$run' MB, planned '$pk' bytes ($planned rows); parts: trainer '$split' MB, planned '$parts' bytes"
    fi
}
quick_set && mem gpt2_1 1 "$M --batch 4" "$M --batch 4 --micro-batch 4 --recompute none"
long_set && mem gpt2_accum 1 "$M --batch 2 --grad-accum 3 --recompute selective" "$M --batch 6 --micro-batch 2 --recompute selective"
long_set && mem gpt2_tp2 2 "$M --tp 2 --batch 4" "$M --tp 2 --batch 4 --micro-batch 4 --recompute none --sequence-parallel 0"
quick_set && mem gpt2_tp2_sp_sel 2 "$M --tp 2 --batch 4 --sequence-parallel --recompute selective" "$M --tp 2 --batch 4 --micro-batch 4 --recompute selective --sequence-parallel 1"
long_set && mem gpt2_dp2_full 2 "$M --batch 4 --recompute full" "$M --tp 1 --pp 1 --batch 8 --micro-batch 4 --recompute full --zero 0"
quick_set && mem gpt2_dp2_zero 2 "$M --batch 4 --zero 1 --grad-accum 2" "$M --tp 1 --pp 1 --batch 16 --micro-batch 4 --recompute none --zero 1"
quick_set && mem gpt2_dp2_zero3 2 "$M --batch 4 --zero 3 --grad-accum 2" "$M --tp 1 --pp 1 --batch 16 --micro-batch 4 --recompute none --zero 3"
long_set && mem llama_tp2_dp2_zero3_full 4 "--arch llama $M --tp 2 --batch 2 --zero 3 --recompute full" "--arch llama $M --tp 2 --pp 1 --batch 4 --micro-batch 2 --recompute full --zero 3 --sequence-parallel 0"
long_set && mem neox_dp2_zero3_sel 2 "--arch neox $M --batch 4 --zero 3 --recompute selective" "--arch neox $M --tp 1 --pp 1 --batch 8 --micro-batch 4 --recompute selective --zero 3"
long_set && mem gpt2_dp4_zero3_hsdp 4 "$M --batch 2 --zero 3 --zero-shard-size 2" "$M --tp 1 --pp 1 --batch 8 --micro-batch 2 --recompute none --zero 3 --zero-shard-size 2"
quick_set && mem gpt2_pp2 2 "$M --pp 2 --batch 4 --grad-accum 4" "$M --tp 1 --pp 2 --batch 16 --micro-batch 4 --recompute none"
quick_set && mem gpt2_tp2_dp2_zero_sp 4 "$M --tp 2 --batch 2 --zero 1 --sequence-parallel --recompute full" "$M --tp 2 --pp 1 --batch 4 --micro-batch 2 --recompute full --zero 1 --sequence-parallel 1"
long_set && mem gpt2_pp2_dp2_zero 4 "$M --pp 2 --batch 2 --grad-accum 4 --zero 1" "$M --tp 1 --pp 2 --batch 16 --micro-batch 2 --recompute none --zero 1"
quick_set && mem gpt2_dp2_zero2 2 "$M --batch 4 --zero 2 --grad-accum 2" "$M --tp 1 --pp 1 --batch 16 --micro-batch 4 --recompute none --zero 2"
quick_set && mem gpt2_pp2_dp2_zero3 4 "$M --pp 2 --batch 2 --grad-accum 4 --zero 3" "$M --tp 1 --pp 2 --batch 16 --micro-batch 2 --recompute none --zero 3"
long_set && mem llama_pp2_dp2_zero2_sel 4 "--arch llama $M --pp 2 --batch 2 --grad-accum 4 --zero 2 --recompute selective" "--arch llama $M --tp 1 --pp 2 --batch 16 --micro-batch 2 --recompute selective --zero 2"
long_set && mem llama_1 1 "--arch llama $M --batch 4 --recompute selective" "--arch llama $M --batch 4 --micro-batch 4 --recompute selective"
quick_set && mem llama_tp2_gqa 2 "--arch llama $M --tp 2 --batch 4 --kv-heads 2" "--arch llama --kv-heads 2 $M --tp 2 --batch 4 --micro-batch 4 --recompute none --sequence-parallel 0"
long_set && mem llama_dp2_zero_full 2 "--arch llama $M --batch 4 --zero 1 --recompute full" "--arch llama $M --tp 1 --pp 1 --batch 8 --micro-batch 4 --recompute full --zero 1"
quick_set && mem llama_tp2_pp2_sp_full 4 "--arch llama $M --tp 2 --pp 2 --batch 2 --grad-accum 4 --sequence-parallel --recompute full" "--arch llama $M --tp 2 --pp 2 --batch 8 --micro-batch 2 --recompute full --sequence-parallel 1"
long_set && mem llama_pp2_sel 2 "--arch llama $M --pp 2 --batch 2 --grad-accum 2 --recompute selective" "--arch llama $M --tp 1 --pp 2 --batch 4 --micro-batch 2 --recompute selective"
# context parallelism: a rank's B S / c rows and the attention's K|V and dK|dV blocks (S = 64: the
# activations most of the peak); the row carries "cp" and "cp_comm"
C="--layers 2 --hidden 32 --heads 4 --seq-len 64"
P1="--tp 1 --pp 1 --zero 0"
if quick_set; then
    mem gpt2_cp2 2 "$C --cp 2 --batch 4" "$C $P1 --cp 2 --cp-comm p2p --batch 4 --micro-batch 4 --recompute none"
    if printf '%s\n' "$out" | grep -q '"tp": 1, "cp": 2, "pp": 1, "dp": 1, .*"cp_comm": "p2p"'; then
        ok plan_json_cp_key
    else fail plan_json_cp_key; fi
fi
long_set && mem llama_cp2_allgather_sel 2 "--arch llama $C --cp 2 --cp-comm allgather --batch 4 --recompute selective" "--arch llama $C $P1 --cp 2 --cp-comm allgather --batch 4 --micro-batch 4 --recompute selective"
long_set && mem gpt2_cp4 4 "$C --cp 4 --batch 4" "$C $P1 --cp 4 --cp-comm p2p --batch 4 --micro-batch 4 --recompute none"
long_set && mem gpt2_cp4_allgather 4 "$C --cp 4 --cp-comm allgather --batch 4" "$C $P1 --cp 4 --cp-comm allgather --batch 4 --micro-batch 4 --recompute none"
long_set && mem gpt2_cp2_dp2_zero 4 "$C --cp 2 --batch 2 --grad-accum 2 --zero 1" "--layers 2 --hidden 32 --heads 4 --seq-len 64 --tp 1 --pp 1 --cp 2 --cp-comm p2p --batch 8 --micro-batch 2 --recompute none --zero 1"
long_set && mem llama_tp2_cp2_sp_full 4 "--arch llama $C --tp 2 --cp 2 --batch 4 --sequence-parallel --recompute full" "--arch llama $C --tp 2 --pp 1 --zero 0 --cp 2 --cp-comm p2p --batch 4 --micro-batch 4 --recompute full --sequence-parallel 1"
long_set && mem gpt2_cp2_pp2 4 "$C --cp 2 --pp 2 --batch 2 --grad-accum 2" "$C --tp 1 --pp 2 --zero 0 --cp 2 --cp-comm p2p --batch 4 --micro-batch 2 --recompute none"
long_set && mem neox_cp2 2 "--arch neox $C --cp 2 --batch 4" "--arch neox $C $P1 --cp 2 --cp-comm p2p --batch 4 --micro-batch 4 --recompute none"

# mixture of experts (Mixtral): the experts 1/EP a rank, the all-to-alls on ctx->ep, under a
# balanced router (the dry run's assumption; a real router's imbalance is within the tolerance at
# these shapes): EP 2 (make test); TP 2 x EP 2 with and without SP, EP 2 with full recompute, CP 2,
# PP 2 (long)
X="--arch mixtral --layers 2 --hidden 32 --heads 4 --seq-len 16"
quick_set && mem mixtral_ep2 2 "$X --batch 4 --ep 2" "$X $P1 --ep 2 --batch 8 --micro-batch 4 --recompute none"
long_set && mem mixtral_tp2_ep2 4 "$X --tp 2 --batch 4 --ep 2" "$X --tp 2 --pp 1 --ep 2 --batch 8 --micro-batch 4 --recompute none --sequence-parallel 0"
long_set && mem mixtral_tp2_ep2_sp 4 "$X --tp 2 --batch 4 --ep 2 --sequence-parallel" "$X --tp 2 --pp 1 --ep 2 --batch 8 --micro-batch 4 --recompute none --sequence-parallel 1"
long_set && mem mixtral_cp2 2 "$X --cp 2 --batch 4" "$X $P1 --cp 2 --cp-comm p2p --batch 4 --micro-batch 4 --recompute none"
long_set && mem mixtral_pp2 2 "$X --pp 2 --batch 2 --grad-accum 2" "$X --tp 1 --pp 2 --zero 0 --batch 4 --micro-batch 2 --recompute none"
long_set && mem mixtral_ep2_full 2 "$X --batch 4 --ep 2 --recompute full" "$X $P1 --ep 2 --batch 8 --micro-batch 4 --recompute full"
# ZeRO at DP 4 x EP 2: the slices over the 2 ranks holding the same experts (4 layers: ZeRO-3's
# gradients sharded), ZeRO-3 (make test) and ZeRO-2 (make test-long)
X4="--arch mixtral --layers 4 --hidden 32 --heads 4 --seq-len 16"
quick_set && mem mixtral_ep2_zero3 4 "$X4 --batch 2 --ep 2 --zero 3" "$X4 --tp 1 --pp 1 --ep 2 --batch 8 --micro-batch 2 --recompute none --zero 3"
long_set && mem mixtral_ep2_zero2 4 "$X4 --batch 2 --ep 2 --zero 2" "$X4 --tp 1 --pp 1 --ep 2 --batch 8 --micro-batch 2 --recompute none --zero 2"
# under a capacity factor the dry run fills every expert to its capacity from the other EP ranks
# (the most they can send): the trainer's peak at PP 2 x EP 2 (a real router, dropless above the
# balanced plan) at or below the planned one at --capacity-factor 1.5 and 3 (make test-long)
bound() {
    out=$(timeout $((120 * scale)) mpirun $mpiflags -np 4 $B/train --text "$text" --steps 2 $X --pp 2 --ep 2 --batch 2 --grad-accum 2 --capacity-factor "$1" 2>&1)
    run=$(printf '%s\n' "$out" | grep -o 'peak memory[a-z ]* [0-9., ]* MB' | grep -o '[0-9][0-9.]*' | sort -g | tail -1)
    out="$out
$($B/plan --profile cpu --vocab 256 --gpus 4 --gpus-per-node 4 --cp 1 $X --tp 1 --pp 2 --zero 0 --ep 2 --batch 8 --micro-batch 2 --recompute none --capacity-factor "$1" 2>&1)
$($B/plan --profile cpu --vocab 256 --gpus 4 --gpus-per-node 4 --cp 1 $X --tp 1 --pp 2 --zero 0 --ep 2 --batch 8 --micro-batch 2 --recompute none --capacity-factor "$1" --json 2>&1)"
    pk=$(printf '%s\n' "$out" | grep -o '"peak_bytes": [0-9]*' | grep -o '[0-9]*$')
    if [ -n "$run" ] && [ -n "$pk" ] && printf '%s\n' "$out" | grep -q '^assumed: every expert full to its capacity' &&
       awk -v r="$run" -v p="$pk" 'BEGIN { exit !(r <= p / 1e6 && p / 1e6 <= 2 * r) }'; then
        ok "plan_moe_capacity_bound_$1 (trainer $run MB, planned $(awk -v p="$pk" 'BEGIN { printf "%.2f", p / 1e6 }') MB)"
    else fail "plan_moe_capacity_bound_$1: trainer '$run' MB, planned '$pk' bytes"; fi
}
long_set && bound 1.5
long_set && bound 3
# Qwen2-MoE (the q, k, v biases, the shared expert on every EP rank) at EP 2 (make test-long)
X="--arch qwen2_moe --layers 2 --hidden 32 --heads 4 --seq-len 16 --experts 4 --moe-top-k 2 --moe-ffn 24 --shared-ffn 40"
long_set && mem qwen2_moe_ep2 2 "$X --batch 4 --ep 2" "$X $P1 --ep 2 --batch 8 --micro-batch 4 --recompute none"
# with dense layers between the sparse ones (layers 0, 2, 3, 4 a SwiGLU MLP of 48, 1 and 5 the MoE):
# each dense layer counted where it stands (its stages dry-run whole), under selective recompute
# (the two kinds of block borrowing the pools in turn)
XD="$X --layers 6 --decoder-sparse-step 2 --mlp-only-layers 3 --dense-ffn 48"
long_set && mem qwen2_moe_dense_ep2 2 "$XD --batch 4 --ep 2 --recompute selective" "$XD $P1 --ep 2 --batch 8 --micro-batch 4 --recompute selective"
if long_set; then
    # every EP size of 4 ranks: --json's ep; ZeRO at EP > 1 only where DP x CP / EP > 1 (its slices
    # over the ranks holding the same experts), SP at TP 2; the experts' weights 1/EP;
    # an EP that does not divide DP or the experts rejected by name; the assumption printed
    out=$($B/plan --profile cpu --gpus 4 --gpus-per-node 4 --vocab 256 $X --batch 8 --micro-batch 2 --json 2>&1)
    if printf '%s
' "$out" | "$py" -c '
import json, sys
rows = json.load(sys.stdin)
fit = [r for r in rows if r["fits"]]
assert {r["ep"] for r in fit} == {1, 2, 4}, {r["ep"] for r in fit}
assert all(r["dp"] % r["ep"] == 0 for r in rows)
assert all(r["zero"] == 0 for r in fit if r["ep"] > 1 and r["dp"] * r["cp"] == r["ep"])
assert any(r["zero"] > 0 for r in fit if r["ep"] > 1)
assert any(r["sp"] for r in fit if r["ep"] > 1 and r["tp"] == 2) and not any(r["sp"] for r in rows if r["tp"] == 1)
assert any(r["zero"] > 0 for r in fit if r["ep"] == 1)
def key(r): return (r["tp"], r["pp"], r["dp"], r["micro_batch"], r["recompute"], r["zero"])
# (weights whole but under ZeRO-3, whose shard is over the ranks of the same experts at EP 2)
pairs = [(r, q) for r in fit for q in fit if r["ep"] == 2 and q["ep"] == 1 and key(q) == key(r)
         and r["zero"] < 3]
assert pairs and all(r["weights_bytes"] < q["weights_bytes"] for r, q in pairs), pairs
' 2>&1; then ok plan_ep_json; else fail plan_ep_json; fi
    out=$($B/plan --profile cpu --gpus 4 --gpus-per-node 4 --vocab 256 $X --experts 6 --batch 8 --ep 4 --all 2>&1)
    if printf '%s
' "$out" | grep -q 'rejected: does not divide: the 6 experts over EP 4' &&
       printf '%s
' "$out" | grep -q 'rejected: does not divide: DP 2 into EP groups of 4' &&
       printf '%s
' "$out" | grep -q '^assumed: a balanced router'; then
        ok plan_ep_rejected
    else fail plan_ep_rejected; fi
    out=$($B/plan --profile cpu --gpus 4 --vocab 256 $M --batch 8 --ep 2 2>&1); rc=$?
    if [ $rc -ne 0 ] && printf '%s
' "$out" | grep -q '^plan: error: .*ep: 2 expert-parallel ranks, and the model has no experts'; then
        ok plan_ep_no_experts
    else fail "plan_ep_no_experts (rc $rc)"; fi
    # the trainer's --ep 2 --plan: the planner chooses around EP 2, the trainer runs its choice
    out=$(timeout $((120 * scale)) mpirun $mpiflags -np 4 $B/train --text "$text" $X --batch 2 --steps 2 --ep 2 --plan 2>&1)
    choice=$(printf '%s
' "$out" | sed -n 's/^plan: TP \([0-9]*\) x PP 1 x DP \([0-9]*\) (EP 2),.*/TP \1 x DP \2 (EP 2)/p')
    if [ -n "$choice" ] && printf '%s
' "$out" | grep -q "= $choice" && printf '%s
' "$out" | grep -q '^step     2/2'; then
        ok "train_plan_ep ($choice)"
    else fail "train_plan_ep ($choice)"; fi
fi

# CP on the host (make test-long): every CP size of 8 ranks, both modes; --json's cp and cp_comm;
# the refusals by name; ZeRO over DP x CP at DP 1; a rank's activations fall with CP
if long_set; then
    out=$($B/plan --profile cpu --gpus 8 --gpus-per-node 8 --vocab 256 --layers 2 --hidden 32 --heads 4 --seq-len 20 --batch 2 --micro-batch 1 --json 2>&1)
    if printf '%s\n' "$out" | "$py" -c '
import json, sys
rows = json.load(sys.stdin)
fit = [r for r in rows if r["fits"]]
assert all(r["tp"] * r["cp"] * r["pp"] * r["dp"] == 8 for r in rows)
assert {r["cp"] for r in fit} == {1, 2}, {r["cp"] for r in fit}   # 20 = 2 x 2 x 5, not 2 x 4 x k
assert {r["cp_comm"] for r in fit if r["cp"] > 1} == {"p2p", "allgather"}
why = " | ".join(r["reason"] for r in rows if not r["fits"])
assert "the sequence length 20 into 2 x CP 4 chunks" in why, why
assert any(r["pp"] > 1 for r in fit if r["cp"] == 2)   # CP with pipeline stages
assert any(r["zero"] == 2 for r in fit if r["cp"] == 2 and r["dp"] == 1)   # ZeRO over DP x CP
def key(r): return (r["tp"], r["pp"], r["micro_batch"], r["recompute"], r["zero"], r["sp"])
# CP 2 beside CP 1 x twice the DP (the same TP, micro-batch, ..., no stages: the peak stage may
# differ): the activations a rank holds fall, its weights do not
pairs = [(r, q) for r in fit for q in fit if r["cp"] == 2 and r["cp_comm"] == "p2p" and
         r["pp"] == 1 and q["cp"] == 1 and q["dp"] == 2 * r["dp"] and key(q) == key(r)]
assert pairs and all(q["activation_bytes"] > r["activation_bytes"] and
                     q["weights_bytes"] == r["weights_bytes"] for r, q in pairs), pairs
' 2>&1; then ok plan_cp_json_host; else fail plan_cp_json_host; fi
    # the trainer's --cp 2 --plan: the planner chooses around CP 2, the trainer runs its choice
    out=$(timeout $((120 * scale)) mpirun $mpiflags -np 4 $B/train --text "$text" $small --steps 2 --cp 2 --plan 2>&1)
    choice=$(printf '%s\n' "$out" | sed -n 's/^plan: TP \([0-9]*\) x CP 2 (\([a-z0-9 -]*\)) x PP 1 x DP \([0-9]*\),.*/TP \1 x CP 2 (\2) x DP \3/p')
    if [ -n "$choice" ] && printf '%s\n' "$out" | grep -q "= $choice" && printf '%s\n' "$out" | grep -q '^step     2/2'; then
        ok "train_plan_cp ($choice)"
    else fail "train_plan_cp ($choice)"; fi
fi

# --calibrate on 2 ranks writes a profile; plan reads it back (make test-long: it measures this
# machine for a minute; make test reads a profile file below)
if long_set; then
    # --calibrate on 2 ranks writes a profile; plan reads it back
    out=$(timeout $((300 * scale)) mpirun $mpiflags -np 2 $B/plan --calibrate "$T/host.prof" $M --batch 4 2>&1)
    if [ -s "$T/host.prof" ] && grep -q '^op layernorm_fwd gbs' "$T/host.prof" &&
       out=$($B/plan --profile "$T/host.prof" --vocab 256 $M --batch 4 --gpus 2 2>&1) && printf '%s\n' "$out" | grep -q '^best: '; then
        ok plan_calibrate_roundtrip
    else fail plan_calibrate_roundtrip; fi
fi
quick_set || exit 0
# --json: every configuration an object with the issue's keys; rejected ones carry their reason
out=$($B/plan --profile h100 --gpus 16 --gpus-per-node 8 --layers 4 --hidden 96 --heads 3 --seq-len 64 --batch 12 --json 2>&1)
if printf '%s\n' "$out" | "$py" -c '
import json, sys
rows = json.load(sys.stdin)
keys = {"tp", "pp", "dp", "micro_batch", "recompute", "zero", "sp", "peak_bytes", "step_seconds"}
assert rows and all(keys <= set(r) for r in rows), "keys"
fit = [r for r in rows if r["fits"]]
rej = [r for r in rows if not r["fits"]]
assert fit and all(r["tp"] * r["cp"] * r["pp"] * r["dp"] == 16 for r in rows)
assert all(r.get("reason") for r in rej) and not any("reason" in r for r in fit)
why = " | ".join(r["reason"] for r in rej)
assert "exceeds a node" in why and "does not divide" in why, why
assert any(r["tp"] == 2 for r in fit)   # 3 heads over TP 2: an uneven split, planned
assert [r["step_seconds"] for r in fit] == sorted(r["step_seconds"] for r in fit)
assert all(r["peak_bytes"] > 0 and r["step_seconds"] > 0 for r in fit)
parts = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activation_bytes")
for r in fit:   # the peak in parts: each positive, adding up to it with the gathered buffers of
    # ZeRO-3 (positive exactly at ZeRO-3); ZeRO-1 shards the moments
    assert all(r[k] > 0 for k in parts) and (r["gathered_bytes"] > 0) == (r["zero"] == 3), r
    assert sum(r[k] for k in parts) + r["gathered_bytes"] == r["peak_bytes"], r
    twin = [q for q in fit if q["zero"] != r["zero"] and all(q[k] == r[k] for k in
            ("tp", "pp", "dp", "micro_batch", "recompute", "sp", "zero_shard_size"))]
    assert all(q["optimizer_bytes"] < r["optimizer_bytes"] for q in twin if q["zero"] and
               not r["zero"]), (r, twin)
    # ZeRO-2: the moments of ZeRO-1; the gradient buffer (the backward fills it whole) and its slice
    one = [q for q in twin if q["zero"] == 1]
    assert r["zero"] != 2 or all(q["optimizer_bytes"] == r["optimizer_bytes"] and
                                 q["grads_bytes"] < r["grads_bytes"] for q in one), (r, one)
    # ZeRO-3: the moments of ZeRO-2; the weights a shard (less than the whole buffer of ZeRO-2),
    # beside the gathered buffers; the gradients sharded (the slice, the buffers of two blocks and
    # of the rest: not the whole buffer of ZeRO-2) but with stages, which keep it
    two = [q for q in twin if q["zero"] == 2]
    assert r["zero"] != 3 or all(q["optimizer_bytes"] == r["optimizer_bytes"] and
                                 (q["grads_bytes"] == r["grads_bytes"]) == (r["pp"] > 1) and
                                 q["weights_bytes"] > r["weights_bytes"] for q in two), (r, two)
assert {r["zero"] for r in fit if r["dp"] > 1} == {0, 1, 2, 3}, "ZeRO 0 to 3 at DP > 1"
assert any(r["zero"] == 3 and r["pp"] > 1 and r["dp"] > 1 for r in fit), "ZeRO-3 with stages"
assert {r["zero"] for r in rows if r["dp"] * r["cp"] == 1} <= {0}, "ZeRO at DP 1"
# HSDP: ZeRO 1-3 also in shards of the DP ranks of a node (8 of 16 at TP 1), the moments 1/8
hs = [r for r in fit if r["zero_shard_size"]]
assert hs and all(r["zero"] and r["tp"] * r["zero_shard_size"] == 8 and
                  r["dp"] * r["cp"] % r["zero_shard_size"] == 0 and
                  r["dp"] * r["cp"] > r["zero_shard_size"] for r in hs), hs
for r in hs:
    whole = [q for q in fit if not q["zero_shard_size"] and all(q[k] == r[k] for k in
             ("tp", "pp", "dp", "micro_batch", "recompute", "sp", "zero"))]
    assert whole and all(q["optimizer_bytes"] < r["optimizer_bytes"] for q in whole), (r, whole)
# CP on the CUDA backend (the h100 profile counts like it): rejected by name, not planned
assert "no attention over CP" in why and not any(r["cp"] > 1 for r in fit), why
' 2>&1; then ok plan_json_keys_and_reasons; else fail plan_json_keys_and_reasons; fi

# the table and the guideline answers
out=$($B/plan --profile h100 --gpus 8 --layers 12 --hidden 768 --heads 12 --seq-len 1024 --batch 64 --tokens 1e10 --target 6e6 2>&1)
if printf '%s\n' "$out" | grep -q '^best: TP' && printf '%s\n' "$out" | grep -q '^largest micro-batch that fits: 64' &&
   printf '%s\n' "$out" | grep -q '^time to train 1e+10 tokens' && printf '%s\n' "$out" | grep -q '^GPUs for 6000000 tokens/s: [0-9]'; then
    ok plan_table_answers
else fail plan_table_answers; fi

# --load DIR: the model of a Hugging Face checkpoint's config.json (a Llama saved by the trainer)
out=$(timeout $((120 * scale)) mpirun $mpiflags -np 1 $B/train --text "$text" --arch llama $M --batch 4 --steps 1 --save "$T/ck" 2>&1)
out="$out
$($B/plan --load "$T/ck" --profile cpu --seq-len 16 --batch 4 --gpus 1 --micro-batch 4 --recompute none --json 2>&1)"
pk=$(printf '%s\n' "$out" | grep -o '"peak_bytes": [0-9]*' | grep -o '[0-9]*$')
want=$($B/plan --arch llama --vocab 256 $M --profile cpu --batch 4 --gpus 1 --micro-batch 4 --recompute none --json 2>&1 |
       grep -o '"peak_bytes": [0-9]*' | grep -o '[0-9]*$')
if [ -n "$pk" ] && [ "$pk" = "$want" ]; then ok "plan_load_config ($pk bytes)"; else fail "plan_load_config ('$pk' vs '$want')"; fi

# the trainer's --plan: prints its choice, then trains with it
out=$(timeout $((120 * scale)) mpirun $mpiflags -np 2 $B/train --text "$text" $small --steps 2 --plan 2>&1)
choice=$(printf '%s\n' "$out" | sed -n 's/^plan: TP \([0-9]*\) x PP \([0-9]*\) x DP \([0-9]*\).*/TP \1 x DP \3 x PP \2/p' | sed 's/ x PP 1$//')
if [ -n "$choice" ] && printf '%s\n' "$out" | grep -q "= $choice" && printf '%s\n' "$out" | grep -q '^step     2/2'; then
    ok "train_plan ($choice)"
else fail "train_plan ($choice)"; fi

# a profile FILE with the keys --calibrate writes (its op rates are optional): plan plans with it
[ -s "$T/host.prof" ] || cat > "$T/host.prof" <<'EOF'
# tpk hardware profile (tpk/plan/hw.h)
name handwritten
source tests/plan.sh: the figures of a 2-rank calibration of a small host
mem_gb 12
reserve_gb 0
peak_tflops 0.07
gemm_tflops 0.035 0.05 0.07 0.05 0.033 0.042
attn_tflops 0.0004
mem_gbs 3.5
op_us 0.32
intra_gbs 0.18
intra_us 0
inter_gbs 0.18
inter_us 0
gpus_per_node 2
host 1
EOF
out=$($B/plan --profile "$T/host.prof" --vocab 256 $M --batch 4 --gpus 2 2>&1)
if printf '%s\n' "$out" | grep -q '^best: '; then ok plan_profile_file; else fail plan_profile_file; fi

# bad input: a clear message, a non-zero exit
bad() {
    name=$1 want=$2; shift 2
    out=$($B/plan "$@" 2>&1); rc=$?
    # refused in the one form of every program: one line "plan: error: ..." saying want
    n=$(printf '%s\n' "$out" | grep -c '^plan: error: ')
    if [ $rc -ne 0 ] && [ "$n" -eq 1 ] && printf '%s\n' "$out" | grep -q -- "$want"; then ok "plan_bad_$name"; else fail "plan_bad_$name (rc $rc, $n error lines)"; fi
}
bad zero_gpus "--gpus: expected at least 1 GPU (rank), got 0" --gpus 0
bad not_nodes "--gpus: expected a whole number of nodes of --gpus-per-node 8 GPUs, got 12" --gpus 12 --gpus-per-node 8
# nothing fits: an answer (exit 3, the table with every rejection), not an error line
out=$($B/plan --arch llama --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 32000 --seq-len 4096 --batch 8 --gpus 1 2>&1); rc=$?
if [ $rc -eq 3 ] && printf '%s\n' "$out" | grep -q -- "nothing fits: the smallest peak"; then ok "plan_bad_fits_nowhere"; else fail "plan_bad_fits_nowhere (rc $rc)"; fi
sed '/^inter_gbs/d' "$T/host.prof" > "$T/missing.prof" 2>/dev/null || printf 'name x\n' > "$T/missing.prof"
bad profile_missing_key 'has no "inter_gbs"' --profile "$T/missing.prof"
{ cat "$T/host.prof"; echo 'mem_gbs 5'; } > "$T/twice.prof"
bad profile_key_twice 'the key "mem_gbs" appears twice (first at line' --profile "$T/twice.prof"
sed 's/^gpus_per_node .*/gpus_per_node 1e300/' "$T/host.prof" > "$T/range.prof"
bad profile_out_of_range 'gpus_per_node: expected 1 whole (1..1000000) number' --profile "$T/range.prof"
bad unknown_profile "not a built-in profile" --profile h300
bad seq_past_positions "longer than the model's" --positions 128 --seq-len 256
