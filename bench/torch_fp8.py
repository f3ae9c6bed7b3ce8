"""bench/torch_fp8.py: PyTorch's FP8 GEMM (torch._scaled_mm) and its bf16 matmul at the FP8 linear's
shapes, the reference beside bench/gemm --fp8 (make gpu-report runs both in the same run).

The same seven GEMMs as bench/gemm --fp8, for T tokens, H hidden, F feed-forward (t = 1):
  square         P x P x P, E4M3 x E4M3, bf16 out
  column fwd     y = qx qw^T     [T, F] = [T, H] [F, H]^T  E4M3 x E4M3, bf16 out
  column dgrad   dx = qdy qw     [T, H] = [T, F] [F, H]    E5M2 x E4M3, bf16 out
  column wgrad   dW = qdy^T qx   [F, H] = [T, F]^T [T, H]  E5M2 x E4M3, f32 out
  row fwd, row dgrad, row wgrad  the same with H and F exchanged
torch._scaled_mm takes its first operand row-major and its second column-major (cuBLASLt's FP8
layout, TN): an operand in the other orientation is transposed (.t().contiguous()) inside the
timed call, as tpk_op_gemm_fp8 transposes into scratch; the scales are per-tensor f32 scalars.
The weight gradient is written, not accumulated (_scaled_mm has no beta; tpk's adds into the f32
gradient). bf16: torch.matmul of the same shapes (the operands' orientation free). Median of
--iters calls after 5 warm-up calls, CUDA events, buffers rotated past the L2 cache. --json
prints one JSON object. Needs a CUDA GPU of compute capability 8.9 or later.

    python3 bench/torch_fp8.py [--H 2048] [--F 8192] [--tokens 8192] [--peak 8192] [--iters 50]
        [--json]
"""

import argparse
import json
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--H", type=int, default=2048)
    p.add_argument("--F", type=int, default=8192)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--peak", type=int, default=8192)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        sys.exit("bench/torch_fp8.py: needs a CUDA GPU of compute capability 8.9 or later")
    if not hasattr(torch, "_scaled_mm"):
        sys.exit("bench/torch_fp8.py: PyTorch %s has no torch._scaled_mm" % torch.__version__)
    dev, e4, e5 = "cuda", torch.float8_e4m3fn, torch.float8_e5m2
    T, H, F, P = a.tokens, a.H, a.F, a.peak
    # (name, m, n, k, format of the first operand, its orientation, the second's, f32 out)
    # orientation: "rm" the operand stored as _scaled_mm takes it, "t" stored the other way
    cases = [
        ("square", P, P, P, e4, "rm", "rm", False),
        ("column fwd", T, F, H, e4, "rm", "rm", False),
        ("column dgrad", T, H, F, e5, "rm", "t", False),
        ("column wgrad", F, H, T, e5, "t", "t", True),
        ("row fwd", T, H, F, e4, "rm", "rm", False),
        ("row dgrad", T, F, H, e5, "rm", "t", False),
        ("row wgrad", H, F, T, e5, "t", "t", True),
    ]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    one = torch.ones((), device=dev, dtype=torch.float32)

    def timed(fn, sets, iters):
        for i in range(5):
            fn(i % sets)
        s0 = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        s1 = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        torch.cuda.synchronize()
        for i in range(iters):
            s0[i].record()
            fn(i % sets)
            s1[i].record()
        torch.cuda.synchronize()
        return statistics.median(s0[i].elapsed_time(s1[i]) for i in range(iters))

    rows = []
    for name, m, n, k, fa, oa, ob, f32 in cases:
        sets = max(1, min(8, int(2 * l2 // ((m * k + k * n) * 3 + m * n * 4)) + 2))
        A, B, A16, B16 = [], [], [], []
        for _ in range(sets):
            # a: [m, k] row-major ("rm") or stored [k, m] ("t"); b: column-major [k, n], i.e.
            # stored [n, k] ("rm"), or stored [k, n] row-major ("t")
            xa = torch.randn((m, k) if oa == "rm" else (k, m), device=dev)
            xb = torch.randn((n, k) if ob == "rm" else (k, n), device=dev)
            A.append(xa.to(fa)), B.append(xb.to(e4))
            A16.append(xa.to(torch.bfloat16)), B16.append(xb.to(torch.bfloat16))
            del xa, xb
        out = torch.float32 if f32 else torch.bfloat16

        def fp8(i):
            qa = A[i] if oa == "rm" else A[i].t().contiguous()  # row-major [m, k]
            qb = B[i].t() if ob == "rm" else B[i].t().contiguous().t()  # column-major [k, n]
            return torch._scaled_mm(qa, qb, scale_a=one, scale_b=one, out_dtype=out)

        def bf16(i):
            a16 = A16[i] if oa == "rm" else A16[i].t()
            b16 = B16[i].t() if ob == "rm" else B16[i]
            return torch.matmul(a16, b16)

        it = 2 * a.iters if name == "square" else a.iters
        fl = 2.0 * m * n * k
        row = dict(gemm=name, m=m, n=n, k=k, formats="E5M2xE4M3" if fa == e5 else "E4M3xE4M3")
        try:  # a form this PyTorch or GPU refuses is reported, the other rows measured
            ms8, ms16 = timed(fp8, sets, it), timed(bf16, sets, it)
            row.update(ms=ms8, rate=fl / (ms8 * 1e-3) / 1e12, bf16_ms=ms16,
                       bf16_rate=fl / (ms16 * 1e-3) / 1e12, ratio=ms16 / ms8)
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
        rows.append(row)
        del A, B, A16, B16
        torch.cuda.empty_cache()
    res = dict(torch=torch.__version__, device=torch.cuda.get_device_name(0), H=H, F=F, tokens=T,
               unit="TFLOP/s", rows=rows)
    if a.json:
        print(json.dumps(res))
        return
    print("torch._scaled_mm against torch.matmul bf16 (%s, PyTorch %s), H=%d F=%d tokens=%d"
          % (res["device"], res["torch"], H, F, T))
    print("%-14s %6s %6s %6s  %-9s  %9s  %8s  %9s  %8s  %6s"
          % ("gemm", "m", "n", "k", "formats", "fp8 ms", "TFLOP/s", "bf16 ms", "TFLOP/s", "ratio"))
    for r in rows:
        if "error" in r:
            print("%-14s %6d %6d %6d  %-9s  not measured: %s"
                  % (r["gemm"], r["m"], r["n"], r["k"], r["formats"], r["error"]))
            continue
        print("%-14s %6d %6d %6d  %-9s  %9.3f  %8.2f  %9.3f  %8.2f  %6.2f"
              % (r["gemm"], r["m"], r["n"], r["k"], r["formats"], r["ms"], r["rate"],
                 r["bf16_ms"], r["bf16_rate"], r["ratio"]))


if __name__ == "__main__":
    main()
