"""tests/gpu_report.py: `make gpu-report`'s report checked on a CPU (run by tests/run.sh).

1. tools/gpu_report.py on recorded GPU figures written here, each next to its target's edge
   (70% of SDPA, 80% of copy bandwidth, 1.0x torch.compile, 0.85x a plain GEMM, the 1B Llama's
   and GPT-NeoX's 1.0x torch.compile and 45% MFU, the FP8 step's 1.25x bf16 and the FP8 GEMMs'
   0.9x torch._scaled_mm: at the target is PASS, just under it BELOW),
   with a racecheck finding, a step stopped at its time limit, a step left out for time, a
   missing benchmark and a NaN figure: every section present, each verdict where it belongs, the
   failure named and exit status 1; the same figures with clean tests: exit status 0; a family
   run without figures; TPK_REPORT_ONLY leaving the tests out (not judged, exit status 0).
2. tools/gpu_report.sh on this machine as it is (no GPU): a report saying "NO GPU", exit status 2.
3. tools/gpu_report.sh as a host dry run (TPK_REPORT_HOST=1): the real benchmark programs at tiny
   sizes on the host backend, their --json read into every table.
Prints "ok ..." / "FAIL ..." lines.

    python3 tests/gpu_report.py [BUILD_DIR]
"""

import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = sys.argv[1] if len(sys.argv) > 1 else "build"
SECTIONS = [
    "# GPU report",
    "## Steps",
    "## Tests (make test-gpu)",
    "## Sanitizers (compute-sanitizer on tests/gpu/ops)",
    "## Attention vs PyTorch SDPA",
    "## Memory-bound kernels vs copy bandwidth",
    "## LM-head GEMMs vs a plain GEMM",
    "## GPT-2 training step vs PyTorch",
    "## Llama and GPT-NeoX training steps vs PyTorch",
    "## FP8 GEMMs vs bf16 and vs torch._scaled_mm",
    "## Not measured, failed or skipped",
]
failures = 0


def check(cond, what):
    global failures
    print(("ok " if cond else "FAIL ") + what)
    failures += 0 if cond else 1


def row(md, *needles):
    """the cells of the first table row holding every needle (in its cells), or None"""
    for line in md.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(any(n == c for c in cells) for n in needles):
                return cells
    return None


def verdict_of(md, *needles):
    r = row(md, *needles)
    return r[-1].strip("*") if r else None


def write(d, name, text):
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


def gpt2(model, tpk_ms, compile_ms, extra_skipped=None):
    tok = 16 * 1024
    rows = {
        "tpk": {
            "ms": tpk_ms,
            "tokens_per_s": tok / (tpk_ms * 1e-3),
            "mfu": 0.3,
            "peak_mem_mb": 9000.0,
        },
        "torch eager": {"ms": 80.0, "tokens_per_s": tok / 0.08, "mfu": 0.2, "peak_mem_mb": 20000.0},
    }
    if compile_ms:
        rows["torch.compile"] = {
            "ms": compile_ms,
            "tokens_per_s": tok / (compile_ms * 1e-3),
            "mfu": 0.3,
            "peak_mem_mb": 15000.0,
        }
    return json.dumps(
        {
            "model": model,
            "batch": 16,
            "seq": 1024,
            "dtype": "bf16",
            "device": "cuda",
            "rows": rows,
            "tpk_ratio": {k: rows[k]["ms"] / tpk_ms for k in rows if k != "tpk"},
            "skipped": extra_skipped or {},
        }
    )


def family(model, tpk_ms, compile_ms, mfu, seq=2048, batch=4, fp8_ms=None):
    """bench/gpt2_step.py --json of a Llama or GPT-NeoX run: tpk at mfu, eager, torch.compile
    (fp8_ms: and the trainer with --fp8 delayed)"""
    tok = batch * seq
    rows = {
        "tpk": {"ms": tpk_ms, "tokens_per_s": tok / (tpk_ms * 1e-3), "mfu": mfu},
        "torch eager": {"ms": 2 * tpk_ms, "tokens_per_s": tok / (2e-3 * tpk_ms), "mfu": mfu / 2},
        "torch.compile": {"ms": compile_ms, "tokens_per_s": tok / (compile_ms * 1e-3), "mfu": 0.4},
    }
    if fp8_ms:
        rows["tpk --fp8 delayed"] = {
            "ms": fp8_ms,
            "tokens_per_s": tok / (fp8_ms * 1e-3),
            "mfu": mfu * tpk_ms / fp8_ms,
            "first_loss": 10.4,
            "last_loss": 10.2,
        }
    for r in rows.values():
        r["peak_mem_mb"] = 40000.0
    return json.dumps(
        {
            "model": model,
            "batch": batch,
            "seq": seq,
            "dtype": "bf16",
            "device": "cuda",
            "rows": rows,
            "tpk_ratio": {k: rows[k]["ms"] / tpk_ms for k in rows if k != "tpk"},
            "fp8_ratio": {k: rows[k]["ms"] / fp8_ms for k in rows if fp8_ms and "fp8" not in k},
            "skipped": {},
        }
    )


def fp8_gemms(rates):
    """bench/gemm --fp8 --json (tpk) or bench/torch_fp8.py --json (torch) rows: (gemm, FP8 rate,
    bf16 rate) each, or (gemm, error) for a form PyTorch refused"""
    rows = []
    for r in rates:
        row = {"gemm": r[0], "m": 8192, "n": 8192, "k": 2048, "formats": "E4M3xE4M3"}
        if len(r) == 2:
            row["error"] = r[1]
        else:
            row.update(ms=1.0, rate=r[1], bf16_ms=1.5, bf16_rate=r[2], ratio=r[1] / r[2])
        rows.append(row)
    return json.dumps({"backend": "cuda", "fp8": True, "unit": "TFLOP/s", "rows": rows})


def kernels(fwd_pair, fb_pair, copy, mem_rows, shape=(16, 1024, 12, 64)):
    """bench/kernels --json as it prints it (bare nan / inf allowed, as C's printf writes them)"""
    rows = ",\n".join('  {"op": "%s", "ms": %s, "gbs": %s}' % (op, ms, g) for op, ms, g in mem_rows)
    (tf, sf), (tb, sb) = fwd_pair, fb_pair
    return (
        '{"backend": "cuda", "dtype": "bf16", "n": 67108864, "attn_shape": {"B": %d, "S": %d, "A": '
        '%d, "D": %d}, "copy_gbs": %s, "rows": [\n%s,\n'
        '  {"op": "attn_fwd", "ms": %.4f, "tflops": 300.0},\n  {"op": "attn_bwd", "ms": %.4f, '
        '"tflops": 200.0}\n],'
        ' "attn_bwd_deterministic_ms": 0.9000, "generic_attn": {"fwd_ms": 2.0, "bwd_ms": 5.0},'
        ' "torch_attn": {"impl": "sdpa", "fwd_ms": %.4f, "bwd_ms": %.4f, "tpk_fwd_ms": %.4f, '
        '"tpk_bwd_ms": %.4f}}\n'
        % (shape + (copy, rows, tf, tb - tf, sf, sb - sf, tf, tb - tf))
    )


def fixtures(d, racecheck_findings):
    os.makedirs(d)
    write(
        d,
        "env.tsv",
        "mode\tgpu\ndate\t2026-01-01 00:00 UTC\ncommit\tabc1234\ngpu\tNVIDIA H100 80GB HBM3, "
        "580.00, 81559 MiB\n"
        "nvcc\tcuda_13.0\ntorch\t2.11.0 cuda\nbudget\t570\n",
    )
    steps = [
        "build\tok\t30\t180\t",
        "test-gpu\t%s\t200\t240\t%s"
        % (("failed", "exit status 2") if racecheck_findings else ("ok", "")),
        "gemm-f32\tok\t20\t45\t",
        "gemm-bf16\tok\t20\t45\t",
        "kernels-f32\tok\t10\t40\t",
        "kernels-bf16-gpt2-124M\tok\t10\t40\t",
        "kernels-bf16-gpt2-350M\tfailed\t3\t40\texit status 1",
        "kernels-bf16-d128\tok\t10\t40\t",
        "gpt2-124M\tok\t90\t150\t",
        "gpt2-350M\ttimeout\t150\t150\tstopped at its 150 s limit",
        "llama-1B\tok\t120\t180\t",
        "neox-1B\tok\t120\t180\t",
        "neox-410M\tskipped\t0\t0\tno time left in the 570 s budget",
    ]
    write(d, "steps.tsv", "\n".join(steps) + "\n")
    res = [
        "ops\t63\t0\t0\t5\t-",
        "layers np=1\t7\t0\t0\t9\t-",
        "layers np=2\t6\t0\t0\t9\t-",
        "layers np=3\t6\t0\t0\t9\t-",
        "resume\t1\t0\t0\t20\t-",
        "ops under compute-sanitizer memcheck\t63\t0\t0\t60\t0",
        "ops under compute-sanitizer racecheck\t63\t%d\t%d\t90\t%d"
        % ((1, 3, racecheck_findings) if racecheck_findings else (0, 0, 0)),
        "ops under compute-sanitizer synccheck\t63\t0\t0\t50\t0",
        "ops under compute-sanitizer initcheck\t63\t0\t0\t70\t0",
    ]
    write(d, "results.tsv", "\n".join(res) + "\n")
    mem = [
        ("fill", "0.1000", "2400.0000"),
        ("layernorm_fwd", "0.2000", "2000.0000"),
        ("layernorm_bwd", "0.3000", "1999.9000"),
        ("xent_fused", "inf", "nan"),
    ]
    write(
        d, "kernels-bf16-gpt2-124M.json", kernels((1.0, 0.7), (3.0, 2.09), 2500.0, mem)
    )  # fwd 70%: PASS; fwd+bwd 69.7%: BELOW
    write(
        d,
        "kernels-bf16-d128.json",
        kernels((2.0, 1.5), (6.0, 5.0), 2500.0, mem, (8, 2048, 16, 128)),
    )
    write(d, "kernels-bf16-gpt2-350M.json", "")  # the failed step left nothing
    write(
        d,
        "kernels-f32.json",
        kernels(
            (4.0, 1.0), (9.0, 3.0), 2600.0, [("axpby", "0.5", "2080.0")], (8, 1024, 12, 64)
        ).replace('"bf16"', '"f32"'),
    )
    lm = [("lm fwd", 0.85), ("lm dgrad", 0.849), ("lm wgrad", 0.9), ("lm fwd unpad", 0.2)]
    write(
        d,
        "gemm-bf16.json",
        json.dumps(
            {
                "backend": "cuda",
                "dtype": "bf16",
                "unit": "TFLOP/s",
                "peak": 790.0,
                "rows": [
                    {
                        "t": 1,
                        "gemm": "column fwd",
                        "m": 8192,
                        "n": 3072,
                        "k": 768,
                        "ms": 0.1,
                        "rate": 600.0,
                        "pct_peak": 76.0,
                        "plain_rate": 610.0,
                        "ratio": 0.98,
                    }
                ]
                + [
                    {
                        "t": 1,
                        "gemm": g,
                        "m": 8192,
                        "n": 50304,
                        "k": 768,
                        "ms": 1.0,
                        "rate": 600.0 * r,
                        "pct_peak": 76.0 * r,
                        "plain_rate": 600.0,
                        "ratio": r,
                    }
                    for g, r in lm
                ],
            }
        ),
    )
    write(
        d,
        "gemm-f32.json",
        '{"backend": "cuda", "dtype": "f32", "unit": "TFLOP/s", "peak": 50.0, "rows": [\n'
        '  {"t": 2, "gemm": "lm fwd", "m": 8192, "n": 25152, "k": 768, "ms": 3.0, "rate": 40.0, '
        '"pct_peak": 80.0, "plain_rate": 40.0, "ratio": 1.000}\n]}\n',
    )
    write(d, "gpt2-124M.json", gpt2("124M", 39.0, 39.0))  # 1.0x torch.compile: PASS
    # both at the target: PASS; --fp8 at 1.25x: PASS
    write(d, "llama-1B.json", family("llama-1B", 200.0, 200.0, 0.45, fp8_ms=160.0))
    # FP8 GEMMs: square at 0.90x torch's (PASS), column fwd at 0.899x (BELOW), column dgrad: torch
    # refused the form (not measured)
    write(
        d,
        "gemm-fp8.json",
        fp8_gemms(
            [("square", 1350.0, 700.0), ("column fwd", 899.0, 600.0), ("column dgrad", 800.0, 60.0)]
        ),
    )
    write(
        d,
        "torch-fp8.json",
        fp8_gemms(
            [("square", 1500.0, 700.0), ("column fwd", 1000.0, 600.0), ("column dgrad", "refused")]
        ),
    )
    write(d, "neox-1B.json", family("neox-1B", 200.0, 198.0, 0.449))  # 0.99x, 44.9%: BELOW


def run_generator(d):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools/gpu_report.py"), d, d + ".md"],
        capture_output=True,
        text=True,
    )
    return out.returncode, read_report(d + ".md"), out.stdout + out.stderr


def read_report(path):
    """the Markdown a run wrote ("" when it wrote none)"""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def case_fixtures(work):
    d = os.path.join(work, "findings")
    fixtures(d, racecheck_findings=2)
    rc, md, out = run_generator(d)
    check(rc == 1, "generator: a racecheck finding fails the report (exit status %d, want 1)" % rc)
    missing = [s for s in SECTIONS if s + "\n" not in md]
    check(not missing, "generator: every section is in the report (missing: %s)" % missing)
    check(
        "**Tests and sanitizers: FAILED**" in md
        and "compute-sanitizer racecheck: 2 findings, 1 op cases failed" in md,
        "generator: the summary names the failed sanitizer",
    )
    r = row(md, "racecheck")
    check(
        r is not None and r[1] == "2" and r[-1] == "**FAIL**",
        "generator: the racecheck row shows 2 findings, FAIL: %s" % r,
    )
    check(
        verdict_of(md, "memcheck") == "PASS"
        and verdict_of(md, "ops") == "PASS"
        and verdict_of(md, "resume") == "PASS",
        "generator: clean tests and tools PASS",
    )
    check(
        verdict_of(md, "GPT-2 124M", "fwd") == "PASS", "generator: attention at 70% of SDPA is PASS"
    )
    check(
        verdict_of(md, "GPT-2 124M", "fwd+bwd") == "BELOW",
        "generator: attention at 69.7% of SDPA is BELOW",
    )
    r = row(md, "GPT-2 124M", "fwd+bwd")
    check(
        r is not None and r[7] == "69.7%" and r[5] == "3.000",
        "generator: the attention row shows the times and the speed: %s" % r,
    )
    check(
        verdict_of(md, "head dim 128", "fwd") == "PASS"
        and verdict_of(md, "head dim 128", "fwd+bwd") == "PASS",
        "generator: the D = 128 attention rows (75%, 83%) PASS",
    )
    check(
        verdict_of(md, "f32 default shape", "fwd") == "-",
        "generator: f32 attention is shown without a target",
    )
    check(
        verdict_of(md, "bf16", "layernorm_fwd") == "PASS",
        "generator: a memory-bound kernel at 80% of copy bandwidth is PASS",
    )
    check(
        verdict_of(md, "bf16", "layernorm_bwd") == "BELOW",
        "generator: a memory-bound kernel at 79.996% of copy bandwidth is BELOW",
    )
    check(
        verdict_of(md, "bf16", "fill") == "PASS",
        "generator: a memory-bound kernel above copy bandwidth is PASS",
    )
    check(
        verdict_of(md, "bf16", "xent_fused") == "not measured",
        "generator: a NaN figure (bare nan / inf in the JSON) is not measured",
    )
    check(
        verdict_of(md, "f32", "axpby") == "PASS",
        "generator: the f32 memory-bound rows are judged too (80% of 2600 GB/s)",
    )
    check(
        verdict_of(md, "bf16", "lm fwd") == "PASS"
        and verdict_of(md, "bf16", "lm dgrad") == "BELOW",
        "generator: LM-head GEMMs at 0.85x a plain GEMM PASS, at 0.849x BELOW",
    )
    check(
        verdict_of(md, "bf16", "lm fwd unpad") == "-",
        "generator: the unpadded LM head is shown for comparison, not judged",
    )
    check(
        verdict_of(md, "124M B=16 S=1024 bf16 on cuda", "tpk") == "PASS",
        "generator: GPT-2 124M at 1.0x torch.compile's tokens/s is PASS",
    )
    r = row(md, "124M B=16 S=1024 bf16 on cuda", "torch eager")
    check(
        r is not None and r[6] == "2.05x" and r[4] == "20.0%",
        "generator: the eager row shows tpk's speed over it and MFU: %s" % r,
    )
    check(
        "step gpt2-350M: timeout (stopped at its 150 s limit)" in md
        and "step kernels-bf16-gpt2-350M: failed (exit status 1)" in md,
        "generator: the step stopped at its limit and the failed benchmark are named",
    )
    check(
        verdict_of(md, "350M", "all") == "not measured",
        "generator: the GPT-2 350M row says not measured",
    )
    check(
        verdict_of(md, "GPT-2 350M", "fwd+bwd") == "not measured",
        "generator: the attention of the failed 350M run says not measured",
    )
    check(
        verdict_of(md, "llama-1B B=4 S=2048 bf16 on cuda", "tpk") == "PASS"
        and verdict_of(md, "llama-1B B=4 S=2048 bf16 on cuda", "torch.compile") == "PASS",
        "generator: Llama 1B at 45% MFU and 1.0x torch.compile is PASS on both rows",
    )
    r = row(md, "neox-1B B=4 S=2048 bf16 on cuda", "tpk")
    check(
        r is not None
        and r[4] == "44.9%"
        and r[-1] == "**BELOW**"
        and verdict_of(md, "neox-1B B=4 S=2048 bf16 on cuda", "torch.compile") == "BELOW",
        "generator: GPT-NeoX 1B at 44.9%% MFU and 0.99x torch.compile is BELOW: %s" % r,
    )
    r = row(md, "neox-1B B=4 S=2048 bf16 on cuda", "torch eager")
    check(
        r is not None and r[6] == "2.00x" and r[-1] == "",
        "generator: the families' eager row shows the ratio, not judged: %s" % r,
    )
    check(
        verdict_of(md, "neox-410M", "all") == "not measured"
        and "step neox-410M: skipped (no time left in the 570 s budget)" in md,
        "generator: the GPT-NeoX 410M step left out for time says not measured, not judged",
    )
    r = row(md, "llama-1B B=4 S=2048 bf16 on cuda", "tpk --fp8 delayed")
    check(
        r is not None and r[-1] == "PASS (1.25x)" and r[6] == "0.80x",
        "generator: the Llama 1B with --fp8 at 1.25x the bf16 trainer is PASS: %s" % r,
    )
    r = row(md, "llama-1B B=4 S=2048 bf16 on cuda", "tpk --fp8 delayed: losses")
    check(
        r is not None and "first 10.4000, last 10.2000" in r[2],
        "generator: the FP8 run's losses beside bf16's: %s" % r,
    )
    check(
        verdict_of(md, "square") == "PASS"
        and verdict_of(md, "column fwd", "E4M3xE4M3") == "BELOW"
        and verdict_of(md, "column dgrad", "E4M3xE4M3") == "not measured"
        and "torch._scaled_mm column dgrad: refused" in md,
        "generator: FP8 GEMMs at 0.9x torch._scaled_mm PASS, at 0.899x BELOW, refused named",
    )
    check(
        "14 PASS, 6 BELOW, 4 not measured" in md,
        "generator: the counts of PASS / BELOW / not measured: %s"
        % [l for l in md.splitlines() if l.startswith("Figures against")],
    )

    # the same figures, GPT-2 124M at 0.99x torch.compile and clean tests: exit status 0
    d = os.path.join(work, "clean")
    fixtures(d, racecheck_findings=0)
    write(d, "gpt2-124M.json", gpt2("124M", 39.4, 39.0))
    rc, md, out = run_generator(d)
    check(
        rc == 0 and "**Tests and sanitizers: PASS**" in md,
        "generator: clean tests and sanitizers exit 0 (%d), figures BELOW or not" % rc,
    )
    check(
        verdict_of(md, "124M B=16 S=1024 bf16 on cuda", "tpk") == "BELOW",
        "generator: GPT-2 124M at 0.99x torch.compile is BELOW",
    )

    # a judged family run that left no figures: both its targets not measured, not a failure
    os.remove(os.path.join(d, "llama-1B.json"))
    rc, md, out = run_generator(d)
    check(
        rc == 0
        and verdict_of(md, "llama-1B", "tpk") == "not measured"
        and verdict_of(md, "llama-1B", "torch.compile") == "not measured"
        and "llama-1B: step llama-1B ran but left no figures" in md,
        "generator: a Llama 1B run without figures: both targets not measured, exit 0 (%d)" % rc,
    )

    # TPK_REPORT_ONLY without test-gpu: the tests not judged, exit status 0
    o = os.path.join(work, "only")
    fixtures(o, racecheck_findings=0)
    write(o, "env.tsv", "mode\tgpu\nonly\tllama-1B neox-1B neox-410M\n")
    with open(os.path.join(o, "steps.tsv")) as f:
        keep = [l for l in f if l.split("\t")[0] in ("build", "llama-1B", "neox-1B")]
    skipped = "\tskipped\t0\t0\tnot in TPK_REPORT_ONLY\n"
    write(o, "steps.tsv", "".join(keep) + "test-gpu" + skipped + "gpt2-124M" + skipped)
    os.remove(os.path.join(o, "results.tsv"))
    rc, md, out = run_generator(o)
    check(
        rc == 0
        and "**Tests and sanitizers: not asked for** (TPK_REPORT_ONLY: llama-1B neox-1B "
        "neox-410M)" in md
        and verdict_of(md, "llama-1B B=4 S=2048 bf16 on cuda", "tpk") == "PASS",
        "generator: TPK_REPORT_ONLY without test-gpu: tests not judged, exit 0 (%d)" % rc,
    )

    # a test program that did not run (no row) fails the report
    with open(os.path.join(d, "results.tsv")) as f:
        lines = [l for l in f if not l.startswith("layers np=2")]
    write(d, "results.tsv", "".join(lines))
    rc, md, out = run_generator(d)
    check(
        rc == 1 and verdict_of(md, "layers np=2") == "did not run",
        "generator: a GPU test that left no row fails the report (%d)" % rc,
    )


def run_script(env_extra, report_dir):
    env = dict(os.environ, B=B, TPK_REPORT_DIR=report_dir, PYTHON=sys.executable, **env_extra)
    out = subprocess.run(
        ["sh", os.path.join(ROOT, "tools/gpu_report.sh")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )
    return out.returncode, read_report(report_dir + ".md"), out.stdout + out.stderr


def case_nogpu(work):
    if (
        shutil.which("nvidia-smi")
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    ):
        print("ok tools/gpu_report.sh without a GPU: not checked (this machine has one)")
        return
    d = os.path.join(work, "nogpu")
    rc, md, out = run_script({"TPK_REPORT_HOST": ""}, d)
    check(
        rc == 2 and "**NO GPU**" in md and "not run (no GPU)" in md,
        "make gpu-report without a GPU: a report saying NO GPU, exit 2 (%d)" % rc,
    )
    check(
        all(s + "\n" in md for s in SECTIONS)
        and "step gpt2-124M: skipped (no GPU)" in md
        and "step llama-1B: skipped (no GPU)" in md,
        "make gpu-report without a GPU: every section, every step named skipped",
    )
    check(
        os.path.exists(d + "-logs.tar.gz"),
        "make gpu-report without a GPU: the logs tarred beside the report",
    )


def case_host(work):
    d = os.path.join(work, "host")
    rc, md, out = run_script({"TPK_REPORT_HOST": "1"}, d)
    check(
        rc == 0 and "**HOST DRY RUN**" in md,
        "host dry run of tools/gpu_report.sh: exit 0, marked as a dry run (%d)%s"
        % (rc, "" if rc == 0 else ": " + out[-800:]),
    )
    check(all(s + "\n" in md for s in SECTIONS), "host dry run: every section")
    v = [verdict_of(md, "f32", op) for op in ("layernorm_fwd", "adamw")] + [
        verdict_of(md, "bf16", "xent_fused")
    ]
    check(
        all(x in ("PASS", "BELOW") for x in v),
        "host dry run: bench/kernels --json read into the memory-bound table: %s" % v,
    )
    v = [verdict_of(md, "f32", "1", g) for g in ("lm fwd", "lm dgrad", "lm wgrad")]
    check(
        all(x in ("PASS", "BELOW") for x in v),
        "host dry run: bench/gemm --json read into the LM-head table: %s" % v,
    )
    r = row(md, "tpk")
    check(
        r is not None and float(r[3]) > 0,
        "host dry run: bench/gpt2_step.py --json read into the GPT-2 table: %s" % r,
    )
    r = row(md, "llama-tiny B=4 S=64 f32 on cpu", "tpk")
    x = row(md, "neox-tiny B=4 S=64 f32 on cpu", "tpk")
    check(
        r is not None and float(r[3]) > 0 and x is not None and float(x[3]) > 0,
        "host dry run: bench/gpt2_step.py --json of the Llama and GPT-NeoX (tpk's side) read "
        "into their table: %s %s" % (r, x),
    )
    r = row(md, "llama-tiny B=4 S=64 f32 on cpu", "tpk --fp8 delayed")
    x = row(md, "column wgrad", "E5M2xE4M3")
    check(
        r is not None and float(r[3]) > 0 and x is not None and float(x[3]) > 0,
        "host dry run: the --fp8 trainer row and bench/gemm --fp8's rows read: %s %s" % (r, x),
    )
    r = row(md, "GPT-2 124M", "B=1 S=64 A=2 D=64", "fwd")
    check(r is not None, "host dry run: the attention row of bench/kernels' bf16 run: %s" % r)
    check(
        os.path.exists(d + "-logs.tar.gz") and os.path.exists(os.path.join(d, "gemm-f32.json")),
        "host dry run: the JSON and the logs tarred",
    )


def main():
    work = os.path.join(ROOT, B, "tests", "gpu_report")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    case_fixtures(work)
    case_nogpu(work)
    if all(
        os.access(os.path.join(ROOT, B, p), os.X_OK)
        for p in ("bench/gemm", "bench/kernels", "train")
    ):
        case_host(work)
    else:
        check(
            False,
            "host dry run: %s/bench/gemm, %s/bench/kernels or %s/train is not built" % (B, B, B),
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
