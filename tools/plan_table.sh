#!/bin/sh
# tools/plan_table.sh — the planner table of bench/RESULTS.md: build/plan's best configuration for GPT-2 124M
# .. 1.5B and Llama 2 7B and 70B on 8 .. 1,024 H100s (the built-in h100 profile, bf16), one
# Markdown row each. Takes a few minutes (the 70B on 1,024 GPUs alone about one).
cd "$(dirname "$0")/.." || exit 1
B=${TPK_BUILD:-build}
gpt2="--vocab 50257 --seq-len 1024 --batch 512"
llama="--arch llama --vocab 32000 --seq-len 4096"
echo "| model | GPUs | global batch | TP x PP x DP | micro-batch x M | recompute | ZeRO | SP | GB a GPU | s a step | tokens/s a GPU | MFU | bubble |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
row() {
    name=$1 gpus=$2 gb=$3; shift 3
    out=$($B/plan --profile h100 --gpus "$gpus" --json "$@" | grep '"fits": true' | head -1)
    printf '%s\n' "$out" | awk -v n="$name" -v g="$gpus" -v gb="$gb" -F'[:,]' '{
        for (i = 1; i < NF; i++) { k = $i; gsub(/[ "{]/, "", k); v[k] = $(i + 1); gsub(/[ "}]/, "", v[k]) }
        printf "| %s | %d | %s | %dx%dx%d | %d x %d | %s | %d | %s | %.1f | %.3f | %.0f | %.1f%% | %.1f%% |\n",
            n, g, gb, v["tp"], v["pp"], v["dp"], v["micro_batch"], v["accum"], v["recompute"],
            v["zero"] + 0, v["sp"] == "true" ? "on" : "off", v["peak_bytes"] / 1e9,
            v["step_seconds"], v["tokens_per_s"] / g, 100 * v["mfu"], 100 * v["bubble"] }'
}
for g in 8 64; do
    row "GPT-2 124M" $g 512 $gpt2 --layers 12 --hidden 768 --heads 12
    row "GPT-2 350M" $g 512 $gpt2 --layers 24 --hidden 1024 --heads 16
    row "GPT-2 774M" $g 512 $gpt2 --layers 36 --hidden 1280 --heads 20
    row "GPT-2 1.5B" $g 512 $gpt2 --layers 48 --hidden 1600 --heads 25
done
L7="--layers 32 --hidden 4096 --heads 32 --ffn 11008"
L70="--layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672"
row "Llama 2 7B" 8 128 $llama $L7 --batch 128
row "Llama 2 7B" 64 1024 $llama $L7 --batch 1024
row "Llama 2 7B" 1024 1024 $llama $L7 --batch 1024
row "Llama 2 70B" 64 128 $llama $L70 --batch 128
row "Llama 2 70B" 1024 1024 $llama $L70 --batch 1024
