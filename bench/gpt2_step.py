"""bench/gpt2_step.py: tokens/s of a training step, tpk's trainer next to PyTorch, for GPT-2, a
Llama and a GPT-NeoX (Pythia).

The same model, batch and dtype, in the same run, on the same device:
  tpk        build/train (one rank; --arch llama|neox with --kv-heads, --ffn, --rotary-pct,
             --rope-theta, --norm-eps for the families) on a synthetic llm.c token shard:
             per-step times from its log (--log-every 1), median over the steps after the warm-up;
  eager      PyTorch, each model written here as Hugging Face computes it (F.scaled_dot_product_
             attention, causal; before PyTorch 2.0 the plain masked softmax, labelled "no SDPA"):
               GPT-2     fused QKV linear, GELU-tanh, learned positions, the LM head tied to wte;
               Llama     RMSNorm (in f32, as LlamaRMSNorm), q/k/v/o projections without biases,
                         rotate-half RoPE, grouped-query attention by repeat_kv, SwiGLU
                         (down(silu(gate) * up)), an untied lm_head;
               GPT-NeoX  LayerNorms, one query_key_value linear packed per head [q_h; k_h; v_h],
                         rotate-half RoPE on the first rotary_pct of each head, the parallel
                         residual x + attn(ln_1(x)) + mlp(ln_2(x)), exact GELU, biases, an
                         untied embed_out;
             Hugging Face's initialisation (weights N(0, 0.02), biases 0, norms 1), AdamW (betas
             0.9, 0.95 and weight decay 0.1 as the trainer's; fused=True on a GPU), gradient
             clipping at 1, bf16 autocast with f32 weights when --dtype bf16; each step
             synchronised, median after the warm-up;
  compile    the same module under torch.compile (where PyTorch has it, 2.0 and later).
Both sides train on the same uniformly random tokens (the trainer's shard; PyTorch cycles through
its first four batches), at a constant learning rate. Ratios are tpk's tokens/s over each
reference's. MFU: model flops per token 6 N + 12 L H S times tokens/s over --peak-tflops (790:
the bf16 dense rate cuBLASLt reaches on an H100), N every parameter of the model (the trainer's
convention: the untied input embedding counted too, though it is a lookup):
  GPT-2     N = V H (wte, tied) + S H (wpe) + L (12 H^2 + 13 H) + 2 H
  Llama     N = 2 V H (embed_tokens, lm_head) + L (2 H^2 + 2 H G D + 3 H F + 2 H) + H,
            D = H / A: q_proj and o_proj H x H, k_proj and v_proj H x G D (grouped-query
            attention's smaller K/V: G key/value heads of the A); the attention's 12 L H S is
            unchanged by G (every query head still reads S keys)
  GPT-NeoX  N = 2 V H (embed_in, embed_out) + L (4 H^2 + 2 H F + F + 9 H) + 2 H
            (query_key_value 3 H^2 + 3 H, dense H^2 + H, the MLP 2 H F + F + H, two LayerNorms 4 H)
The PyTorch model's parameter count is checked against N, and the trainer's (its banner) too.
Peak memory: tpk's buffers (the trainer's "peak memory" line), PyTorch's
torch.cuda.max_memory_allocated (none on the CPU). --json prints one JSON object instead of the
table. Stopped by SIGTERM (a time limit), it still prints what it measured, the rest under
"skipped".

--fp8 current|delayed: the trainer is run a second time with FP8 linears (--fp8, its recipe's
defaults: the embeddings, the LM head, norms and attention stay in the run's dtype), a row of its
own; "fp8_ratio" gives its tokens/s over each other row's (over "tpk": FP8's speed-up).

--check (a functional check, for the CPU at the tiny shapes; not a timing): tpk and PyTorch eager
each train --steps steps (default 20, --lr 1e-3) from their own random initialisation on the same
batches; each side's first loss must be within 5% of ln V (a fresh model predicts about
uniformly), the mean of its last three losses at least 0.05 ln V below its first (both learn the
repeated batches) and within 0.03 ln V of the other side's, and the trainer's parameter count
(its banner) N; exit status 1 otherwise.

    python3 bench/gpt2_step.py [--model 124M|350M|tiny|llama-1B|llama-tiny|neox-410M|neox-1B|
        neox-tiny|...] [--batch B] [--seq S] [--steps N] [--warmup W] [--lr LR]
        [--dtype bf16|f32] [--device cuda|cpu] [--vocab V] [--trainer PATH] [--no-torch]
        [--no-compile] [--peak-tflops T] [--fp8 current|delayed] [--check] [--json]
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# Each model: its family (arch), layers L, hidden H, heads A; the Llama's key/value heads G and
# the families' MLP width F, rotated fraction (NeoX), RoPE base and norm epsilon; its vocabulary,
# batch and sequence length by default (GPT-2's: see main).
MODELS = {
    "124M": dict(arch="gpt2", L=12, H=768, A=12),
    "350M": dict(arch="gpt2", L=24, H=1024, A=16),
    "tiny": dict(arch="gpt2", L=2, H=64, A=4),
    "L4C256": dict(arch="gpt2", L=4, H=256, A=4),  # the CPU comparison (make bench-cpu): B=4 S=256
    "L6C384": dict(arch="gpt2", L=6, H=384, A=6),
    # Llama 3.2 1B's shape (its vocabulary of 128256 does not fit the uint16 token shard: 32000,
    # Llama 2's)
    "llama-1B": dict(
        arch="llama", L=16, H=2048, A=32, G=8, F=8192, theta=5e5, eps=1e-5, V=32000, B=4, S=2048
    ),
    "llama-tiny": dict(
        arch="llama", L=2, H=64, A=4, G=2, F=128, theta=10000.0, eps=1e-5, V=512, B=4, S=64
    ),
    # Pythia 410M and 1B (vocabulary 50304, rotary_pct 0.25, the parallel residual, exact GELU)
    "neox-410M": dict(
        arch="neox", L=24, H=1024, A=16, F=4096, rot=0.25, theta=10000.0, eps=1e-5, V=50304, B=8,
        S=2048,
    ),
    "neox-1B": dict(
        arch="neox", L=16, H=2048, A=8, F=8192, rot=0.25, theta=10000.0, eps=1e-5, V=50304, B=4,
        S=2048,
    ),
    "neox-tiny": dict(
        arch="neox", L=2, H=64, A=4, F=256, rot=0.25, theta=10000.0, eps=1e-5, V=512, B=4, S=64
    ),
}
FAMILY = {"gpt2": "GPT-2", "llama": "Llama", "neox": "GPT-NeoX"}


class Stopped(Exception):
    """SIGTERM: the caller's time limit"""


def on_term(signum, frame):
    raise Stopped("stopped by SIGTERM (time limit)")


def n_params(m, V, S):
    """N, every parameter of the model (see the file's head)"""
    L, H, A = m["L"], m["H"], m["A"]
    if m["arch"] == "gpt2":
        return V * H + S * H + L * (12 * H * H + 13 * H) + 2 * H
    F = m["F"]
    if m["arch"] == "llama":
        kv = m["G"] * (H // A)  # k_proj and v_proj rows: G heads of D
        return 2 * V * H + L * (2 * H * H + 2 * H * kv + 3 * H * F + 2 * H) + H
    return 2 * V * H + L * (4 * H * H + 2 * H * F + F + 9 * H) + 2 * H


def flops_per_token(m, V, S):
    """6 N + 12 L H S"""
    return 6 * n_params(m, V, S) + 12 * m["L"] * m["H"] * S


def shard_tokens(n, vocab, seed=1):
    """the synthetic tokens: uniformly random, the same for the trainer and PyTorch"""
    import random

    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def write_shard(path, tokens):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def arch_flags(m):
    """the trainer's flags of the family (none for GPT-2, its default)"""
    if m["arch"] == "llama":
        return ["--arch", "llama", "--kv-heads", str(m["G"]), "--ffn", str(m["F"])] + [
            "--rope-theta",
            repr(m["theta"]),
            "--norm-eps",
            repr(m["eps"]),
        ]
    if m["arch"] == "neox":
        return ["--arch", "neox", "--ffn", str(m["F"]), "--rotary-pct", repr(m["rot"])] + [
            "--rope-theta",
            repr(m["theta"]),
            "--norm-eps",
            repr(m["eps"]),
        ]
    return []


def run_tpk(a, m, extra=()):
    """the trainer's median step (ms), peak memory (MB or None), losses, parameters (banner, M);
    extra: more trainer flags (--fp8 X)"""
    tmp = tempfile.mkdtemp(prefix="tpk_bench_")
    try:
        shard = os.path.join(tmp, "tokens.bin")
        write_shard(shard, shard_tokens(a.batch * a.seq * 4 + 1, a.vocab))
        cmd = [a.trainer, "--data", shard] + arch_flags(m) + list(extra)
        for flag, v in (
            ("--layers", m["L"]),
            ("--hidden", m["H"]),
            ("--heads", m["A"]),
            ("--vocab", a.vocab),
            ("--positions", a.seq),
            ("--batch", a.batch),
            ("--seq-len", a.seq),
            ("--steps", a.warmup + a.steps),
            ("--log-every", 1),
            ("--dtype", a.dtype),
            ("--eval-every", 0),
            ("--warmup", 1),
            ("--min-lr-frac", 1),  # a constant rate (--warmup 1: full from step 1), as PyTorch's
            ("--lr", repr(a.lr)),
        ):
            cmd += [flag, str(v)]
        mpirun = shutil.which("mpirun")
        if mpirun:
            flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            if a.threads:  # the rank's threads on every core, not bound to one
                flags += ["--bind-to", "none"]
            cmd = [mpirun] + flags + ["-np", "1"] + cmd
        threads = str(a.threads) if a.threads else os.environ.get("OPENBLAS_NUM_THREADS", "1")
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads)
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        try:
            so, se = proc.communicate(timeout=3600)
        except (
            BaseException
        ):  # stopped (SIGTERM) or too long: mpirun given time to stop the trainer
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
        out = subprocess.CompletedProcess(cmd, proc.returncode, so, se)
        if out.returncode != 0:
            raise RuntimeError(
                "%s failed (%d): %s"
                % (a.trainer, out.returncode, (out.stdout + out.stderr)[-2000:])
            )
        steps = [
            (int(mt.group(1)), float(mt.group(2)), float(mt.group(3)))
            for mt in re.finditer(
                r"^step\s+(\d+)/\d+ \| loss ([0-9.naif]+) \|.*?\| ([0-9.]+) ms \|", out.stdout, re.M
            )
        ]
        ms = [t for s, _, t in steps if s > a.warmup]
        if len(ms) < 1:
            raise RuntimeError("no step times in the trainer's output:\n" + out.stdout[-2000:])
        mem = re.search(r"peak memory ([0-9.]+) MB", out.stdout)
        npar = re.search(r"([0-9.]+)M parameters", out.stdout)
        return (
            statistics.median(ms),
            (float(mem.group(1)) if mem else None),
            [l for _, l, _ in steps],
            (float(npar.group(1)) if npar else None),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def causal_attention(torch, q, k, v):
    """softmax(q k^T / sqrt(D) + causal mask) v on [B, A, S, D]: SDPA, or before PyTorch 2.0 the
    plain masked softmax"""
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    S, D = q.shape[-2], q.shape[-1]
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    att = ((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(~mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def rope_cos_sin(torch, dim, theta, S, x):
    """Hugging Face's rotary tables: inv_freq = theta^(-2i/dim), the angles of positions 0..S-1
    duplicated (cat(freqs, freqs)), computed in f32 outside autocast, cast to x's dtype"""
    with torch.autocast(x.device.type, enabled=False):
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device).float() / dim))
        freqs = torch.outer(torch.arange(S, device=x.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def apply_rope(torch, x, cos, sin):
    """x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1] (the halves of the last dim)"""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def group(torch, **mods):
    """a module holding mods under their names (Hugging Face's nesting: parameter names as its)"""
    g = torch.nn.Module()
    for k, v in mods.items():
        setattr(g, k, v)
    return g


def gpt2_model(torch, m, V, P):
    """GPT-2 (tpk's layout: weights [out, in]), parameters named as tests/torch_ref.py's"""
    nn, F = torch.nn, torch.nn.functional
    L, H, A = m["L"], m["H"], m["A"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
            self.attn = group(torch, c_attn=nn.Linear(H, 3 * H), c_proj=nn.Linear(H, H))
            self.mlp = group(torch, c_fc=nn.Linear(H, 4 * H), c_proj=nn.Linear(4 * H, H))

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = (
                t.view(B, S, A, H // A).transpose(1, 2)
                for t in self.attn.c_attn(self.ln_1(x)).split(H, dim=-1)
            )
            y = causal_attention(torch, q, k, v).transpose(1, 2).reshape(B, S, H)
            x = x + self.attn.c_proj(y)
            u = F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
            return x + self.mlp.c_proj(u)

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(P, H)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(H)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return GPT2()


def llama_model(torch, m, V):
    """LlamaForCausalLM as Hugging Face computes it (no biases, untied head; its names)"""
    nn, F = torch.nn, torch.nn.functional
    L, H, A, G, FF, eps = m["L"], m["H"], m["A"], m["G"], m["F"], m["eps"]
    D = H // A

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):  # LlamaRMSNorm: in f32, cast back before the weight
            dt = x.dtype
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * h.to(dt)

    def repeat_kv(x):  # [B, G, S, D] -> [B, A, S, D]: each key/value head for its A/G queries
        B, _, S, _ = x.shape
        return x[:, :, None].expand(B, G, A // G, S, D).reshape(B, A, S, D)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
            self.self_attn = group(
                torch,
                q_proj=nn.Linear(H, A * D, bias=False),
                k_proj=nn.Linear(H, G * D, bias=False),  # G key/value heads
                v_proj=nn.Linear(H, G * D, bias=False),
                o_proj=nn.Linear(A * D, H, bias=False),
            )
            self.mlp = group(
                torch,
                gate_proj=nn.Linear(H, FF, bias=False),
                up_proj=nn.Linear(H, FF, bias=False),
                down_proj=nn.Linear(FF, H, bias=False),
            )

        def forward(self, x, cos, sin):
            B, S, _ = x.shape
            at, mlp = self.self_attn, self.mlp
            h = self.input_layernorm(x)
            q = at.q_proj(h).view(B, S, A, D).transpose(1, 2)
            k = at.k_proj(h).view(B, S, G, D).transpose(1, 2)
            v = at.v_proj(h).view(B, S, G, D).transpose(1, 2)
            q, k = apply_rope(torch, q, cos, sin), apply_rope(torch, k, cos, sin)
            y = causal_attention(torch, q, repeat_kv(k), repeat_kv(v))
            x = x + at.o_proj(y.transpose(1, 2).reshape(B, S, A * D))
            h = self.post_attention_layernorm(x)
            return x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = group(
                torch,
                embed_tokens=nn.Embedding(V, H),
                layers=nn.ModuleList(Block() for _ in range(L)),
                norm=RMSNorm(),
            )
            self.lm_head = nn.Linear(H, V, bias=False)

        def forward(self, idx, targets):
            x = self.model.embed_tokens(idx)
            cos, sin = rope_cos_sin(torch, D, m["theta"], idx.shape[1], x)
            for b in self.model.layers:
                x = b(x, cos, sin)
            logits = self.lm_head(self.model.norm(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return Llama()


def neox_model(torch, m, V):
    """GPTNeoXForCausalLM as Hugging Face computes it (use_parallel_residual, hidden_act gelu; its
    names)"""
    nn, F = torch.nn, torch.nn.functional
    L, H, A, FF, eps = m["L"], m["H"], m["A"], m["F"], m["eps"]
    D = H // A
    R = int(D * m["rot"])  # rotary_ndims

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.LayerNorm(H, eps=eps)
            self.post_attention_layernorm = nn.LayerNorm(H, eps=eps)
            self.attention = group(
                torch, query_key_value=nn.Linear(H, 3 * H), dense=nn.Linear(H, H)
            )
            self.mlp = group(
                torch, dense_h_to_4h=nn.Linear(H, FF), dense_4h_to_h=nn.Linear(FF, H)
            )

        def forward(self, x, cos, sin):
            B, S, _ = x.shape
            qkv = self.attention.query_key_value(self.input_layernorm(x)).view(B, S, A, 3 * D)
            q, k, v = (qkv[..., i * D : (i + 1) * D].permute(0, 2, 1, 3) for i in range(3))
            q = torch.cat((apply_rope(torch, q[..., :R], cos, sin), q[..., R:]), dim=-1)
            k = torch.cat((apply_rope(torch, k[..., :R], cos, sin), k[..., R:]), dim=-1)
            y = causal_attention(torch, q, k, v).transpose(1, 2).reshape(B, S, H)
            attn = self.attention.dense(y)
            h = self.post_attention_layernorm(x)  # the parallel residual: from x
            mlp = self.mlp.dense_4h_to_h(F.gelu(self.mlp.dense_h_to_4h(h)))
            return mlp + attn + x

    class NeoX(nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt_neox = group(
                torch,
                embed_in=nn.Embedding(V, H),
                layers=nn.ModuleList(Block() for _ in range(L)),
                final_layer_norm=nn.LayerNorm(H, eps=eps),
            )
            self.embed_out = nn.Linear(H, V, bias=False)

        def forward(self, idx, targets):
            x = self.gpt_neox.embed_in(idx)
            cos, sin = rope_cos_sin(torch, R, m["theta"], idx.shape[1], x)
            for b in self.gpt_neox.layers:
                x = b(x, cos, sin)
            logits = self.embed_out(self.gpt_neox.final_layer_norm(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return NeoX()


def reference_check(torch, model, m, idx, tgt):
    """--check: the model in f32 against tests/torch_ref.py's float64 reference of its family
    (the one tpk's layers are tested against) on the same weights and batch: the relative error
    of the loss and the worst of every gradient (relative to its largest reference value)"""
    import importlib.util

    ref_py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    spec = importlib.util.spec_from_file_location("torch_ref", os.path.join(ref_py, "torch_ref.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    B, S = idx.shape
    cfg = {"L": m["L"], "H": m["H"], "A": m["A"], "B": B, "S": S, "smoothing": 0.0}
    if m["arch"] == "llama":
        cfg.update(kv_heads=m["G"], norm_eps=m["eps"], rope_theta=m["theta"])
        fn = ref.llama_loss
    elif m["arch"] == "neox":
        cfg.update(ln_eps=m["eps"], rotary_pct=m["rot"], rope_theta=m["theta"])
        fn = ref.neox_loss
    else:
        cfg.update(ln_eps=1e-5)
        fn = ref.gpt2_loss
    W = {
        k: p.detach().cpu().double().clone().requires_grad_(True)
        for k, p in model.named_parameters()
    }
    want = fn(cfg, W, idx.cpu().reshape(-1), tgt.cpu().reshape(-1))
    want.backward()
    model.zero_grad(set_to_none=True)
    got = model(idx, tgt)
    got.backward()
    gerr = max(
        float((p.grad.double().cpu() - W[k].grad).abs().max() / W[k].grad.abs().max())
        for k, p in model.named_parameters()
    )
    model.zero_grad(set_to_none=True)
    return {
        "loss": float(got),
        "ref_loss": float(want),
        "loss_rel": abs(float(got) - float(want)) / abs(float(want)),
        "grad_rel": gerr,
    }


def torch_model(torch, m, V, P):
    """the model of m's family, initialised as Hugging Face's _init_weights (initializer_range
    0.02): linear and embedding weights N(0, 0.02), biases 0, norm weights 1"""
    if m["arch"] == "llama":
        model = llama_model(torch, m, V)
    elif m["arch"] == "neox":
        model = neox_model(torch, m, V)
    else:
        model = gpt2_model(torch, m, V, P)
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(mod.weight, 0.0, 0.02)
            if getattr(mod, "bias", None) is not None:
                torch.nn.init.zeros_(mod.bias)
    n = sum(p.numel() for p in model.parameters())
    if n != n_params(m, V, P):
        raise RuntimeError("the PyTorch model has %d parameters, N = %d" % (n, n_params(m, V, P)))
    return model


def run_torch(a, m, compiled):
    """PyTorch's median step (ms), peak memory (MB or None), losses, under --check the comparison
    with the reference (reference_check; else None), and whether it has SDPA"""
    import torch

    if compiled and not hasattr(torch, "compile"):
        raise RuntimeError("PyTorch %s has no torch.compile" % torch.__version__)
    dev = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torch_model(torch, m, a.vocab, a.seq).to(dev)
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(
        model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1, **fused
    )
    step_model = torch.compile(model) if compiled else model
    n = a.batch * a.seq
    toks = torch.tensor(shard_tokens(n * 4 + 1, a.vocab), dtype=torch.long, device=dev)
    batches = [
        (
            toks[i * n : (i + 1) * n].view(a.batch, a.seq),
            toks[i * n + 1 : (i + 1) * n + 1].view(a.batch, a.seq),
        )
        for i in range(4)
    ]
    ctx = (
        torch.autocast(dev.type, dtype=torch.bfloat16)
        if a.dtype == "bf16"
        else torch.autocast(dev.type, enabled=False)
    )
    ref = reference_check(torch, model, m, *batches[0]) if a.check and not compiled else None
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        idx, tgt = batches[i % 4]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with ctx:
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(1e3 * (time.perf_counter() - t0))
        losses.append(loss.detach())
    losses = [float(l) for l in losses]
    if not all(math.isfinite(l) for l in losses):
        raise RuntimeError("PyTorch's loss is not finite")
    mem = torch.cuda.max_memory_allocated() / 1e6 if dev.type == "cuda" else None
    del model, opt, step_model
    sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    return statistics.median(times), mem, losses, ref, sdpa


def torch_python():
    """the first of $TPK_PYTHON, this interpreter and Debian's /usr/bin/python3 that imports torch
    (as bench/kernels and bench/host_block choose)"""
    for py in (os.environ.get("TPK_PYTHON"), sys.executable, "/usr/bin/python3"):
        if py and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    return sys.executable


def run_torch_child(a, compiled, policy):
    """PyTorch in its own process, so OMP_WAIT_POLICY (read when PyTorch starts its OpenMP threads)
    takes effect: policy None leaves it unset (OpenMP's default: idle threads spin), "PASSIVE"
    makes idle threads sleep. Returns run_torch's."""
    cmd = [torch_python(), os.path.abspath(__file__)] + sys.argv[1:] + ["--torch-child"]
    cmd += ["compile" if compiled else "eager"]
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError((out.stderr or out.stdout).strip().splitlines()[-1])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["ms"], r["mem"], r["losses"], r["ref"], r["sdpa"]


def check_losses(losses, V):
    """--check: the first loss within 5% of ln V, the mean of the last three at least 0.05 ln V
    below it; (passed, what was found)"""
    lnv = math.log(V)
    if len(losses) < 4:
        return False, "%d losses (--check needs at least 4 steps)" % len(losses)
    first, last = losses[0], sum(losses[-3:]) / 3
    ok = abs(first - lnv) <= 0.05 * lnv and last <= first - 0.05 * lnv
    return ok, "first loss %.4f (ln V %.4f), last three %.4f" % (first, lnv, last)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=list(MODELS), default="124M")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--trainer", default="build/train")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--fp8", choices=["current", "delayed"], default=None)
    p.add_argument("--check", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--torch-child", choices=["eager", "compile"], help=argparse.SUPPRESS)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    m = MODELS[a.model]
    L, H, A = m["L"], m["H"], m["A"]
    small = a.model == "tiny"
    cpu_model = a.model.startswith("L")
    a.batch = a.batch or m.get("B") or (4 if small or cpu_model else 16 if a.model == "124M" else 8)
    a.seq = a.seq or m.get("S") or (64 if small else 256 if cpu_model else 1024)
    a.vocab = a.vocab or m.get("V") or 50257
    a.steps = a.steps if a.steps is not None else 20 if a.check else 10
    a.warmup = a.warmup if a.warmup is not None else 0 if a.check else 3
    a.lr = a.lr if a.lr is not None else 1e-3 if a.check else 1e-4
    if a.device is None:
        try:
            import torch

            a.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            a.device = "cpu"
    if a.steps < 1 or a.warmup < 0 or a.batch < 1 or a.seq < 1 or a.vocab < 1 or a.vocab > 65536:
        p.error("steps >= 1, warmup >= 0, batch, seq >= 1 and 1 <= vocab <= 65536 (uint16 tokens)")
    if not a.lr > 0:
        p.error("--lr: a positive number")
    tokens = a.batch * a.seq
    if a.torch_child:  # one PyTorch measurement for run_torch_child
        ms, mem, losses, ref, sdpa = run_torch(a, m, a.torch_child == "compile")
        print(json.dumps({"ms": ms, "mem": mem, "losses": losses, "ref": ref, "sdpa": sdpa}))
        return
    rows, mem, losses, refs, skipped = {}, {}, {}, {}, {}
    tpk_params = None
    try:
        rows["tpk"], mem["tpk"], losses["tpk"], tpk_params = run_tpk(a, m)
    except Stopped as e:
        skipped["tpk"] = str(e)
    fp8_row = "tpk --fp8 %s" % a.fp8 if a.fp8 else None
    if fp8_row and not skipped.get("tpk", "").startswith("stopped"):
        try:  # the same trainer with FP8 linears: its own row (not judged against PyTorch)
            rows[fp8_row], mem[fp8_row], losses[fp8_row], _ = run_tpk(a, m, ("--fp8", a.fp8))
        except Stopped as e:
            skipped[fp8_row] = str(e)
        except RuntimeError as e:
            skipped[fp8_row] = "failed: %s" % str(e)[-500:]
    eager = "torch eager"
    runs = [(eager, False, None), ("torch.compile", True, None)]
    if a.check:  # the functional check: eager once
        runs = [(eager, False, None)]
    elif a.device == "cpu":  # both OpenMP wait policies, each in its own process
        policies = (("", None), (" PASSIVE", "PASSIVE"))
        runs = [(n + s, c, pol) for n, c, _ in runs for s, pol in policies]
    sdpa = True
    for name, compiled, policy in runs:
        if a.no_torch or (compiled and a.no_compile):
            skipped[name] = "not asked for"
            continue
        if skipped.get("tpk", "").startswith("stopped"):
            skipped[name] = skipped["tpk"]
            continue
        try:
            if a.device == "cpu":
                r = run_torch_child(a, compiled, policy)
            else:
                r = run_torch(a, m, compiled)
            rows[name], mem[name], losses[name], refs[name], sdpa = r
        except (
            Exception
        ) as e:  # a missing PyTorch or feature, or the time limit, is reported, not fatal
            skipped[name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    if not sdpa:  # the eager rows named for the attention they ran
        eager = "torch eager (no SDPA)"
        for d in (rows, mem, losses, refs, skipped):
            for k in [k for k in d if k.startswith("torch eager")]:
                d[eager + k[len("torch eager") :]] = d.pop(k)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    npar, fpt = n_params(m, a.vocab, a.seq), flops_per_token(m, a.vocab, a.seq)
    res = {
        "model": a.model,
        "arch": m["arch"],
        "layers": L,
        "hidden": H,
        "heads": A,
        "kv_heads": m.get("G"),
        "ffn": m.get("F"),
        "rotary_pct": m.get("rot"),
        "vocab": a.vocab,
        "batch": a.batch,
        "seq": a.seq,
        "dtype": a.dtype,
        "device": a.device,
        "threads": a.threads or None,
        "steps": a.steps,
        "warmup": a.warmup,
        "lr": a.lr,
        "params": npar,
        "tpk_params_m": tpk_params,
        "flops_per_token": fpt,
        "peak_tflops": a.peak_tflops,
        "rows": {
            k: {
                "ms": v,
                "tokens_per_s": tokens / (v * 1e-3),
                "mfu": (
                    fpt * tokens / (v * 1e-3) / (a.peak_tflops * 1e12)
                    if a.device != "cpu"
                    else None  # --peak-tflops is a GPU's
                ),
                "peak_mem_mb": mem.get(k),
                "first_loss": losses[k][0] if losses.get(k) else None,
                "last_loss": losses[k][-1] if losses.get(k) else None,
            }
            for k, v in rows.items()
        },
        "tpk_ratio": {k: rows[k] / rows["tpk"] for k in rows if k != "tpk" and "tpk" in rows},
        # --fp8: the FP8 trainer's tokens/s over the bf16 trainer's, and over each PyTorch's
        "fp8_ratio": (
            {k: rows[k] / rows[fp8_row] for k in rows if k != fp8_row}
            if fp8_row in rows
            else {}
        ),
        "skipped": skipped,
    }
    failed = []
    if a.check:
        res["check"] = {}
        for k in ["tpk", eager]:
            if k not in losses:
                ok, what = False, "not run (%s)" % skipped.get(k, "?")
            else:
                ok, what = check_losses(losses[k], a.vocab)
                res["rows"][k]["losses"] = losses[k]
            res["check"][k] = {"ok": ok, "found": what}
            if not ok:
                failed.append("%s: %s" % (k, what))
        # the same data and hyperparameters: the two sides end near each other
        if all(losses.get(k) for k in ("tpk", eager)):
            ends = [sum(losses[k][-3:]) / 3 for k in ("tpk", eager)]
            ok = abs(ends[0] - ends[1]) <= 0.03 * math.log(a.vocab)
            res["check"]["tpk and PyTorch"] = {
                "ok": ok,
                "found": "last three %.4f and %.4f (within 0.03 ln V = %.4f)"
                % (ends[0], ends[1], 0.03 * math.log(a.vocab)),
            }
            if not ok:
                failed.append("tpk's and PyTorch's losses apart: %.4f, %.4f" % tuple(ends))
        # the PyTorch model against the float64 reference tpk's layers are tested against
        r = refs.get(eager)
        if r is not None:
            ok = r["loss_rel"] <= 1e-4 and r["grad_rel"] <= 1e-3
            res["check"]["PyTorch model = tests/torch_ref.py"] = {
                "ok": ok,
                "found": "loss %.6f against %.6f (relative %.1e), gradients within %.1e"
                % (r["loss"], r["ref_loss"], r["loss_rel"], r["grad_rel"]),
            }
            if not ok:
                failed.append("the PyTorch model is not the reference's: %s" % r)
        # the trainer's banner (M, 2 decimals) against N, when the vocabulary needs no padding
        if tpk_params is not None and a.vocab % 64 == 0:
            ok = abs(tpk_params - npar / 1e6) <= 0.0051
            res["check"]["tpk parameters"] = {
                "ok": ok,
                "found": "the trainer's %.2fM, N %.4fM" % (tpk_params, npar / 1e6),
            }
            if not ok:
                failed.append("the trainer's parameters %.2fM, N %.4fM" % (tpk_params, npar / 1e6))
    if a.json:
        print(json.dumps(res))
    else:
        shape = "L=%d H=%d A=%d" % (L, H, A)
        if m["arch"] == "llama":
            shape += " G=%d F=%d" % (m["G"], m["F"])
        elif m["arch"] == "neox":
            shape += " F=%d rotary %.2f" % (m["F"], m["rot"])
        print(
            "%s %s (%s V=%d, %.2fM parameters), B=%d S=%d, %s on %s, median of %d steps after %d"
            " warm-up"
            % (FAMILY[m["arch"]], a.model, shape, a.vocab, npar / 1e6, a.batch, a.seq, a.dtype,
               a.device, a.steps, a.warmup)
        )
        print(
            "%-30s %10s %12s %7s %12s %14s %9s %9s"
            % ("", "ms/step", "tokens/s", "MFU", "peak MB", "tpk / this", "loss 1", "loss end")
        )
        for k, r in res["rows"].items():
            print(
                "%-30s %10.1f %12.0f %7s %12s %13s %9s %9s"
                % (
                    k,
                    r["ms"],
                    r["tokens_per_s"],
                    "%.1f%%" % (100 * r["mfu"]) if r["mfu"] is not None else "-",
                    "%.0f" % r["peak_mem_mb"] if r["peak_mem_mb"] is not None else "-",
                    "%.3fx" % res["tpk_ratio"][k] if k in res["tpk_ratio"] else "-",
                    "%.4f" % r["first_loss"] if r["first_loss"] is not None else "-",
                    "%.4f" % r["last_loss"] if r["last_loss"] is not None else "-",
                )
            )
        for k, why in skipped.items():
            print("%-30s not measured (%s)" % (k, why))
        for k, c in res.get("check", {}).items():
            print("check %s: %s (%s)" % (k, "ok" if c["ok"] else "FAIL", c["found"]))
    if failed:
        raise RuntimeError("--check failed: " + "; ".join(failed))


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit("bench/gpt2_step.py: %s" % e)
