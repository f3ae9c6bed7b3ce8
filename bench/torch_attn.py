"""bench/torch_attn.py: PyTorch's causal attention, timed, for bench/kernels' comparison.

F.scaled_dot_product_attention(is_causal=True) where PyTorch has it (2.0 and later; on a GPU it
picks its flash or memory-efficient kernel), else the plain softmax(Q K^T / sqrt(D)) V. Forward
and backward timed separately (CUDA events on a GPU), median over ITERS after 3 warm-ups.
Prints "fwd_ms bwd_ms backend-name".

    python3 bench/torch_attn.py B S A D f32|bf16 cpu|cuda ITERS
"""

import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    S = q.shape[-2]
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v


def main():
    B, S, A, D = (int(a) for a in sys.argv[1:5])
    dtype = torch.bfloat16 if sys.argv[5] == "bf16" else torch.float32
    dev, iters = sys.argv[6], int(sys.argv[7])
    if dev == "cpu":
        torch.set_num_threads(1)
    q, k, v = (
        torch.randn(B, A, S, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    do = torch.randn(B, A, S, D, device=dev, dtype=dtype)

    def clock():
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    tf, tb = [], []
    for it in range(iters + 3):
        t0 = clock()
        o = attention(q, k, v)
        t1 = clock()
        o.backward(do)
        t2 = clock()
        if it >= 3:
            tf.append(1e3 * (t1 - t0))
            tb.append(1e3 * (t2 - t1))
    name = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "softmax(QK^T)V"
    print("%.4f %.4f %s" % (statistics.median(tf), statistics.median(tb), name))


if __name__ == "__main__":
    main()
