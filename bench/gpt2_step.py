"""bench/gpt2_step.py: tokens/s of a GPT-2 training step, tpk's trainer next to PyTorch.

The same model, batch and dtype, in the same run, on the same device:
  tpk        build/train (one rank) on a synthetic llm.c token shard: per-step times from
             its log (--log-every 1), median over the steps after the warm-up;
  eager      PyTorch: GPT-2 with a fused QKV linear, F.scaled_dot_product_attention (causal; before
             PyTorch 2.0 the plain masked softmax, labelled "no SDPA"),
             GELU-tanh, the LM head tied to wte, AdamW (fused=True on a GPU), bf16 autocast with
             f32 weights when --dtype bf16; each step synchronised, median after the warm-up;
  compile    the same module under torch.compile (where PyTorch has it, 2.0 and later).
Every side trains on uniformly random tokens (the step's cost does not depend on them). Ratios
are tpk's tokens/s over each reference's. MFU: model flops per token 6 N + 12 L H S (N the
parameters of the unpadded model, wte tied; the trainer's convention) times tokens/s over
--peak-tflops (790: the bf16 dense rate cuBLASLt reaches on an H100, bench/gemm's 8192^3).
Peak memory: tpk's buffers (the trainer's "peak memory" line), PyTorch's
torch.cuda.max_memory_allocated (none on the CPU). --json prints one JSON object instead of the
table. Stopped by SIGTERM (a time limit), it still prints what it measured, the rest under
"skipped".

    python3 bench/gpt2_step.py [--model 124M|350M|tiny] [--batch B] [--seq S] [--steps N]
        [--warmup W] [--dtype bf16|f32] [--device cuda|cpu] [--vocab V] [--trainer PATH]
        [--no-torch] [--no-compile] [--peak-tflops T] [--json]
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

MODELS = {
    "124M": (12, 768, 12),
    "350M": (24, 1024, 16),
    "tiny": (2, 64, 4),
    "L4C256": (4, 256, 4),  # the CPU comparison (make bench-cpu): B=4 S=256
    "L6C384": (6, 384, 6),
}  # layers, hidden, heads


class Stopped(Exception):
    """SIGTERM: the caller's time limit"""


def on_term(signum, frame):
    raise Stopped("stopped by SIGTERM (time limit)")


def flops_per_token(L, H, V, S):
    """6 N + 12 L H S: N = wte (tied) + wpe + L blocks (12 H^2 + 13 H) + ln_f"""
    n = V * H + S * H + L * (12 * H * H + 13 * H) + 2 * H
    return 6 * n + 12 * L * H * S


def write_shard(path, n, vocab, seed=1):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    import random

    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *(rng.randrange(vocab) for _ in range(n))))


def run_tpk(a, L, H, A):
    tmp = tempfile.mkdtemp(prefix="tpk_bench_")
    try:
        shard = os.path.join(tmp, "tokens.bin")
        write_shard(shard, a.batch * a.seq * 4 + 1, a.vocab)
        cmd = [
            a.trainer,
            "--data",
            shard,
            "--layers",
            str(L),
            "--hidden",
            str(H),
            "--heads",
            str(A),
            "--vocab",
            str(a.vocab),
            "--positions",
            str(a.seq),
            "--batch",
            str(a.batch),
            "--seq-len",
            str(a.seq),
            "--steps",
            str(a.warmup + a.steps),
            "--log-every",
            "1",
            "--dtype",
            a.dtype,
            "--eval-every",
            "0",
            "--warmup",
            "1",
            "--lr",
            "1e-4",
        ]
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
        ms = [
            float(m.group(2))
            for m in re.finditer(r"^step\s+(\d+)/\d+ \|.*?\| ([0-9.]+) ms \|", out.stdout, re.M)
            if int(m.group(1)) > a.warmup
        ]
        if len(ms) < 1:
            raise RuntimeError("no step times in the trainer's output:\n" + out.stdout[-2000:])
        mem = re.search(r"peak memory ([0-9.]+) MB", out.stdout)
        return statistics.median(ms), (float(mem.group(1)) if mem else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def torch_model(torch, L, H, A, V, P):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
            self.c_attn, self.attn_proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
            self.c_fc, self.mlp_proj = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = (
                t.view(B, S, A, H // A).transpose(1, 2)
                for t in self.c_attn(self.ln_1(x)).split(H, dim=-1)
            )
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # PyTorch before 2.0: the plain causal softmax
                mask = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
                y = (
                    F.softmax(
                        ((q @ k.transpose(-2, -1)) / math.sqrt(H // A)).masked_fill(
                            ~mask, float("-inf")
                        ),
                        dim=-1,
                    )
                    @ v
                )
            y = y.transpose(1, 2).reshape(B, S, H)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

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


def run_torch(a, L, H, A, compiled):
    import torch

    if compiled and not hasattr(torch, "compile"):
        raise RuntimeError("PyTorch %s has no torch.compile" % torch.__version__)
    dev = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torch_model(torch, L, H, A, a.vocab, a.seq).to(dev)
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    step_model = torch.compile(model) if compiled else model
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    ctx = (
        torch.autocast(dev.type, dtype=torch.bfloat16)
        if a.dtype == "bf16"
        else torch.autocast(dev.type, enabled=False)
    )
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.warmup + a.steps):
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
    if not math.isfinite(loss.item()):
        raise RuntimeError("PyTorch's loss is not finite")
    mem = torch.cuda.max_memory_allocated() / 1e6 if dev.type == "cuda" else None
    del model, opt, step_model
    return statistics.median(times), mem


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
    makes idle threads sleep. Returns (median ms, peak MB or None)."""
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
    return r["ms"], r["mem"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="124M")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--trainer", default="build/train")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--torch-child", choices=["eager", "compile"], help=argparse.SUPPRESS)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    L, H, A = MODELS[a.model]
    small = a.model == "tiny"
    cpu_model = a.model.startswith("L")
    a.batch = a.batch or (4 if small or cpu_model else 16 if a.model == "124M" else 8)
    a.seq = a.seq or (64 if small else 256 if cpu_model else 1024)
    if a.device is None:
        try:
            import torch

            a.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            a.device = "cpu"
    if a.steps < 1 or a.warmup < 0 or a.batch < 1 or a.seq < 1 or a.vocab < 1 or a.vocab > 65536:
        p.error("steps >= 1, warmup >= 0, batch, seq >= 1 and 1 <= vocab <= 65536 (uint16 tokens)")
    tokens = a.batch * a.seq
    if a.torch_child:  # one PyTorch measurement for run_torch_child
        ms, m = run_torch(a, L, H, A, a.torch_child == "compile")
        print(json.dumps({"ms": ms, "mem": m}))
        return
    rows, mem, skipped = {}, {}, {}
    try:
        rows["tpk"], mem["tpk"] = run_tpk(a, L, H, A)
    except Stopped as e:
        skipped["tpk"] = str(e)
    try:
        import torch

        sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    except ImportError:
        sdpa = True
    eager = "torch eager" if sdpa else "torch eager (no SDPA)"
    runs = [(eager, False, None), ("torch.compile", True, None)]
    if a.device == "cpu":  # both OpenMP wait policies, each in its own process
        policies = (("", None), (" PASSIVE", "PASSIVE"))
        runs = [(n + s, c, pol) for n, c, _ in runs for s, pol in policies]
    for name, compiled, policy in runs:
        if a.no_torch or (compiled and a.no_compile):
            skipped[name] = "not asked for"
            continue
        if skipped.get("tpk", "").startswith("stopped"):
            skipped[name] = skipped["tpk"]
            continue
        try:
            if a.device == "cpu":
                rows[name], mem[name] = run_torch_child(a, compiled, policy)
            else:
                rows[name], mem[name] = run_torch(a, L, H, A, compiled)
        except (
            Exception
        ) as e:  # a missing PyTorch or feature, or the time limit, is reported, not fatal
            skipped[name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    fpt = flops_per_token(L, H, a.vocab, a.seq)
    res = {
        "model": a.model,
        "layers": L,
        "hidden": H,
        "heads": A,
        "vocab": a.vocab,
        "batch": a.batch,
        "seq": a.seq,
        "dtype": a.dtype,
        "device": a.device,
        "threads": a.threads or None,
        "steps": a.steps,
        "warmup": a.warmup,
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
            }
            for k, v in rows.items()
        },
        "tpk_ratio": {k: rows[k] / rows["tpk"] for k in rows if k != "tpk" and "tpk" in rows},
        "skipped": skipped,
    }
    if a.json:
        print(json.dumps(res))
        return
    print(
        "GPT-2 %s (L=%d H=%d A=%d V=%d), B=%d S=%d, %s on %s, median of %d steps after %d warm-up"
        % (a.model, L, H, A, a.vocab, a.batch, a.seq, a.dtype, a.device, a.steps, a.warmup)
    )
    print(
        "%-30s %10s %12s %7s %12s %14s"
        % ("", "ms/step", "tokens/s", "MFU", "peak MB", "tpk / this")
    )
    for k, r in res["rows"].items():
        print(
            "%-30s %10.1f %12.0f %7s %12s %13s"
            % (
                k,
                r["ms"],
                r["tokens_per_s"],
                "%.1f%%" % (100 * r["mfu"]) if r["mfu"] is not None else "-",
                "%.0f" % r["peak_mem_mb"] if r["peak_mem_mb"] is not None else "-",
                "%.3fx" % res["tpk_ratio"][k] if k in res["tpk_ratio"] else "-",
            )
        )
    for k, why in skipped.items():
        print("%-30s not measured (%s)" % (k, why))


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit("bench/gpt2_step.py: %s" % e)
