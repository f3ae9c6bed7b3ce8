"""bench/torch_block.py: the PyTorch side of bench/host_block.

One GPT-2 block (pre-LN: x + attn(ln_1(x)), x + mlp(ln_2(x))) built from PyTorch's own layers,
float32 on the CPU, one thread; forward and backward (input and parameter gradients) timed
separately, median over ITERS after one warm-up iteration. Prints "fwd_seconds bwd_seconds".

    python3 bench/torch_block.py H A B S ITERS
"""

import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, H, A):
        super().__init__()
        self.A = A
        self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.c_attn, self.attn_proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.c_fc, self.mlp_proj = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def attn(self, x):
        B, S, H = x.shape
        D = H // self.A
        q, k, v = (t.view(B, S, self.A, D).transpose(1, 2) for t in self.c_attn(x).split(H, dim=-1))
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        return self.attn_proj((att @ v).transpose(1, 2).reshape(B, S, H))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def main():
    H, A, B, S, iters = (int(a) for a in sys.argv[1:6])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blk = Block(H, A)
    x = torch.randn(B, S, H, requires_grad=True)
    dy = torch.randn(B, S, H)
    tf, tb = [], []
    for it in range(iters + 1):
        t0 = time.perf_counter()
        y = blk(x)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        if it:
            tf.append(t1 - t0)
            tb.append(t2 - t1)
    print("%.6f %.6f" % (statistics.median(tf), statistics.median(tb)))


if __name__ == "__main__":
    main()
