"""tests/torch_ref.py: the PyTorch reference for the GPT-2 model.

Reads what tests/torch_dump.c wrote (the global weights of a tensor-parallel run, its tokens,
its loss and its gathered gradients), rebuilds the same GPT-2 with PyTorch's own layers
(F.embedding, F.layer_norm, F.linear, causal softmax attention, F.gelu(approximate="tanh"),
F.cross_entropy with ignore_index and label_smoothing) in float64, and compares the loss and
every gradient (relative error < 1e-4, the error relative to the largest reference value).
Prints "ok ..." or "FAIL ..." (counted by tests/run.sh); exit status 1 on failure.

    python3 tests/torch_ref.py DIR
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

TOL = 1e-4


def load(d):
    params, cfg, loss = [], {}, None
    with open(os.path.join(d, "model.txt")) as f:
        for line in f:
            w = line.split()
            if w[0] == "config":
                cfg = {w[i]: float(w[i + 1]) for i in range(1, len(w), 2)}
            elif w[0] == "loss":
                loss = float(w[1])
            elif w[0] == "param":
                ndim = int(w[3])
                params.append((w[1], int(w[2]), [int(x) for x in w[4:4 + ndim]]))

    def floats(name):
        with open(os.path.join(d, name), "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.float32)

    def ints(name):
        with open(os.path.join(d, name), "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.int32).long()

    wflat, gflat = floats("weights.bin"), floats("grads.bin")
    W, G = {}, {}
    for name, off, shape in params:
        n = math.prod(shape)
        W[name] = wflat[off:off + n].reshape(shape).double().clone().requires_grad_(True)
        G[name] = gflat[off:off + n].reshape(shape).double()
    return cfg, loss, W, G, ints("ids.bin"), ints("targets.bin")


def gpt2_loss(cfg, W, ids, targets):
    L, H, A = int(cfg["L"]), int(cfg["H"]), int(cfg["A"])
    B, S, eps = int(cfg["B"]), int(cfg["S"]), cfg["ln_eps"]
    D = H // A
    ids = ids.view(B, S)
    x = F.embedding(ids, W["wte.weight"]) + F.embedding(torch.arange(S), W["wpe.weight"])[None]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(L):
        p = "h.%d." % i
        h = F.layer_norm(x, (H,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = F.linear(h, W[p + "attn.c_attn.weight"], W[p + "attn.c_attn.bias"])
        q, k, v = (t.view(B, S, A, D).transpose(1, 2) for t in qkv.split(H, dim=-1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, S, H)
        x = x + F.linear(y, W[p + "attn.c_proj.weight"], W[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (H,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        u = F.gelu(F.linear(h, W[p + "mlp.c_fc.weight"], W[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(u, W[p + "mlp.c_proj.weight"], W[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (H,), W["ln_f.weight"], W["ln_f.bias"], eps)
    logits = x @ W["wte.weight"].t()  # the tied LM head
    return F.cross_entropy(logits.view(B * S, -1), targets, ignore_index=-100, label_smoothing=cfg["smoothing"])


def main():
    d = sys.argv[1]
    cfg, c_loss, W, G, ids, targets = load(d)
    what = "PyTorch reference: GPT-2 (L=%d, H=%d, A=%d, V=%d) at t=%d%s, smoothing %.1f" % (
        cfg["L"], cfg["H"], cfg["A"], cfg["V"], cfg["tp"], " SP" if cfg["sp"] else "", cfg["smoothing"])
    loss = gpt2_loss(cfg, W, ids, targets)
    loss.backward()
    fails = []
    lerr = abs(c_loss - loss.item()) / abs(loss.item())
    if not lerr < TOL:
        fails.append("loss %.8g, PyTorch %.8g (relative %.3g)" % (c_loss, loss.item(), lerr))
    worst = lerr
    for name, w in W.items():
        ref = w.grad
        err = ((G[name] - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err)
        if not err < TOL:  # NaN fails too
            fails.append("gradient of %s: relative error %.3g" % (name, err))
    for f in fails:
        print("  " + f)
    print("%s %s: loss and %d gradients match (worst relative error %.2g)" % ("FAIL" if fails else "ok", what, len(W), worst))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
