"""tools/gpu_report.py: the Markdown report of `make gpu-report`, from what tools/gpu_report.sh
left in DIR.

    python3 tools/gpu_report.py DIR OUT.md

Reads (any may be missing; the report then names what is):
  env.tsv         mode (gpu, nogpu, host: a dry run on the host backend), date, commit, gpu,
                  nvcc, torch
  steps.tsv       one row a step: name, status (ok, failed, timeout, skipped), seconds, limit, note
  results.tsv     tests/gpu/run.sh's rows: name, passed, failed, exit status, seconds, findings
  gemm-*.json     bench/gemm --json           (the LM-head GEMMs against a plain GEMM of the
                                              same shape)
  kernels-*.json  bench/kernels --json        (memory-bound ops against copy bandwidth,
                                              attention against SDPA)
  gpt2-*.json     bench/gpt2_step.py --json   (GPT-2 steps against PyTorch eager and torch.compile)
  llama-1B.json, neox-1B.json, neox-410M.json
                  bench/gpt2_step.py --json   (the Llama and GPT-NeoX steps, the same way; the
                                              Llama's with --fp8 delayed: a row of its own)
  gemm-fp8.json   bench/gemm --fp8 --json     (the FP8 linear's GEMMs against bf16)
  torch-fp8.json  bench/torch_fp8.py --json   (torch._scaled_mm against torch.matmul bf16, the
                                              same shapes)
Targets (the project's GPU-speed issue): attention at >= 70% of PyTorch SDPA's speed, forward and
forward+backward (bf16); each memory-bound kernel at >= 80% of the measured copy bandwidth (bytes
it must move over time, against a device-to-device copy's); GPT-2 124M at >= 1.0x torch.compile's
tokens/s; the Llama 1B and GPT-NeoX 1B steps at >= 1.0x torch.compile's tokens/s and >= 45% MFU
(the 410M shown, not judged); with --fp8 delayed the Llama 1B step at >= 1.25x the bf16
trainer's tokens/s, and each FP8 GEMM at >= 0.9x torch._scaled_mm's rate; and, from the
earlier GPU-speed work (bench/RESULTS.md), the padded LM-head GEMMs at >= 0.85x a plain GEMM.
A figure at or above its target is PASS, below it BELOW; a missing one is "not measured" with
the reason. Speeds as a percentage: 100 x the reference's time / ours.
Exit status: 1 when a GPU test or a sanitizer failed or did not run (or, in a dry run, a step
failed), 2 without a GPU, else 0. Where env.tsv's "only" (TPK_REPORT_ONLY) left make test-gpu
out, the tests are not judged: 1 only when the build failed. A figure BELOW its target does not
fail: it is a measurement.
Standard library only.
"""

import json
import os
import re
import sys

ATTN_TARGET = 70.0  # % of SDPA's speed
MEM_TARGET = 80.0  # % of copy bandwidth
GPT2_TARGET = 1.0  # x torch.compile's tokens/s (124M)
LM_TARGET = 0.85  # x a plain GEMM (padded LM head)
TESTS = ["ops", "layers np=1", "layers np=2", "layers np=3", "resume"]
TOOLS = ["memcheck", "racecheck", "synccheck", "initcheck"]
KERNEL_RUNS = [
    ("kernels-bf16-gpt2-124M", "GPT-2 124M"),
    ("kernels-bf16-gpt2-350M", "GPT-2 350M"),
    ("kernels-bf16-d128", "head dim 128"),
    ("kernels-f32", "f32 default shape"),
]
GPT2_RUNS = [("gpt2-124M", "124M"), ("gpt2-350M", "350M")]
FAMILY_SPEED = 1.0  # x torch.compile's tokens/s (the 1B models)
FAMILY_MFU = 45.0  # % MFU (the 1B models)
FAMILY_RUNS = [("llama-1B", True), ("neox-1B", True), ("neox-410M", False)]  # (step, judged)
FP8_STEP = 1.25  # x the bf16 trainer's tokens/s with --fp8 (the 1B Llama)
FP8_GEMM = 0.90  # x torch._scaled_mm's rate at the same shape (tpk_op_gemm_fp8)


def read_tsv(path):
    try:
        with open(path) as f:
            return [line.rstrip("\n").split("\t") for line in f if line.strip()]
    except OSError:
        return []


def read_json(path, problems):
    """A benchmark's JSON, or None (the reason added to problems). Bare inf / nan (C's printf)
    read as null."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    if not text.strip():
        problems.append("%s: empty (the benchmark printed nothing)" % os.path.basename(path))
        return None
    try:
        return json.loads(re.sub(r"(?<![\w.])-?(inf|nan)(?![\w.])", "null", text))
    except ValueError as e:
        problems.append("%s: not JSON (%s)" % (os.path.basename(path), e))
        return None


def verdict(value, target):
    """PASS at or above target, BELOW under it, None when there is no value"""
    if value is None:
        return None
    return "PASS" if value >= target else "BELOW"


def fmt(x, spec="%.3f", none="-"):
    return none if x is None else spec % x



def step_json(j):
    """bench/gpt2_step.py's --json: the shape's label, the rows, tpk's ratios, the skipped"""
    shape = "%s B=%s S=%s %s on %s" % (
        j.get("model"),
        j.get("batch"),
        j.get("seq"),
        j.get("dtype"),
        j.get("device"),
    )
    return shape, j.get("rows", {}), j.get("tpk_ratio", {}), j.get("skipped", {})


def step_cells(r):
    """a step row's ms, tokens/s, MFU and peak MB cells"""
    mfu = r["mfu"] * 100 if r.get("mfu") is not None else None
    return [
        fmt(r.get("ms"), "%.1f"),
        fmt(r.get("tokens_per_s"), "%.0f"),
        fmt(mfu, "%.1f%%"),
        fmt(r.get("peak_mem_mb"), "%.0f"),
    ]


# the columns of a training step's table (GPT-2's, and Llama's and GPT-NeoX's)
STEP_COLUMNS = [
    "model",
    "implementation",
    "ms/step",
    "tokens/s",
    "MFU",
    "peak MB",
    "tpk tokens/s / this",
    "target",
    "result",
]

class Report:
    def __init__(self, d):
        self.d = d
        self.out = []
        self.problems = []  # files that could not be read
        self.missing = []  # (what, why): figures not measured
        self.counts = {"PASS": 0, "BELOW": 0, "not measured": 0}
        self.env = {r[0]: r[1] for r in read_tsv(os.path.join(d, "env.tsv")) if len(r) > 1}
        self.mode = self.env.get("mode", "gpu")
        self.steps = {r[0]: r + [""] * (5 - len(r)) for r in read_tsv(os.path.join(d, "steps.tsv"))}

    def w(self, line=""):
        self.out.append(line)

    def table(self, head, rows):
        self.w("| " + " | ".join(head) + " |")
        self.w("|" + "---|" * len(head))
        for r in rows:
            self.w("| " + " | ".join(str(c) for c in r) + " |")
        self.w()

    def judge(self, value, target):
        """the verdict cell of a figure, counted (a missing figure as "not measured")"""
        v = verdict(value, target)
        if v is None:
            self.counts["not measured"] += 1
            return "not measured"
        self.counts[v] += 1
        return "**%s**" % v if v == "BELOW" else v

    def step_why(self, name):
        """why a step left no figures: its status and note"""
        s = self.steps.get(name)
        if s is None:
            return "step %s did not run" % name
        if s[1] == "ok":
            return "step %s ran but left no figures" % name
        return "step %s %s%s" % (name, s[1], (": " + s[4]) if s[4] else "")

    def bench(self, name):
        problems = []
        j = read_json(os.path.join(self.d, name + ".json"), problems)
        st = self.steps.get(name)
        if st is None or st[1] == "ok":  # (a step that failed or did not run is listed as such)
            self.problems += problems
            if j is None:
                self.missing.append((name, self.step_why(name)))
        return j

    # ---- sections ----------------------------------------------------------------------------

    def steps_section(self):
        self.w("## Steps")
        self.w()
        rows = [
            [n, s[1] if s[1] == "ok" else "**%s**" % s[1], s[2] + " s", s[3] + " s", s[4] or ""]
            for n, s in self.steps.items()
        ]
        if not rows:
            self.w("No step recorded (steps.tsv missing).")
            self.w()
        else:
            self.table(["step", "status", "time", "limit", "note"], rows)

    def tests_section(self):
        """make test-gpu's programs and the sanitizers; returns the failures"""
        res = {
            r[0]: r + ["-"] * (6 - len(r)) for r in read_tsv(os.path.join(self.d, "results.tsv"))
        }
        fails = []
        st = self.steps.get("test-gpu")
        ran = st is not None and st[1] != "skipped"
        self.w("## Tests (make test-gpu)")
        self.w()
        self.w(
            "Every CUDA op against the host op (the fused cuBLASLt epilogues against the composed "
            "ops among them), "
            "the layers and GPT-2 at t = 1 (NCCL) and t = 2, 3 (MPI, ranks sharing the GPU), a "
            "bit-identical resume "
            "(tests/gpu/run.sh; counts of `ok` / `FAIL` lines)."
        )
        self.w()
        if not ran:
            self.w("Not run: %s." % self.step_why("test-gpu"))
            self.w()
        else:
            if st[1] != "ok":
                fails.append("make test-gpu " + st[1] + (" (" + st[4] + ")" if st[4] else ""))
            rows = []
            for name in TESTS + sorted(
                n for n in res if n not in TESTS and not n.startswith("ops under compute-sanitizer")
            ):
                r = res.get(name)
                if r is None:
                    rows.append([name, "-", "-", "-", "-", "**did not run**"])
                    fails.append("%s did not run" % name)
                    continue
                ok = r[2] == "0" and r[3] == "0"
                if not ok:
                    fails.append("%s: %s failed, exit status %s" % (name, r[2], r[3]))
                rows.append([name, r[1], r[2], r[3], r[4] + " s", "PASS" if ok else "**FAIL**"])
            self.table(["program", "ok", "failed", "exit", "time", "result"], rows)
        self.w("## Sanitizers (compute-sanitizer on tests/gpu/ops)")
        self.w()
        self.w(
            "Each tool over the whole op suite; any finding (racecheck: errors and warnings), a "
            "non-zero exit or a "
            "missing summary (the tool did not finish) is a failure. Outputs: sanitizer-TOOL.txt "
            "in the logs."
        )
        self.w()
        if not ran:
            self.w("Not run: %s." % self.step_why("test-gpu"))
            self.w()
        else:
            rows = []
            for tool in TOOLS:
                name = "ops under compute-sanitizer " + tool
                r = res.get(name)
                if r is None:
                    rows.append([tool, "-", "-", "-", "-", "**did not run**"])
                    fails.append("compute-sanitizer %s did not run" % tool)
                    continue
                ok = r[2] == "0" and r[3] == "0" and r[5] == "0"
                if not ok:
                    fails.append(
                        "compute-sanitizer %s: %s, %s op cases failed, exit status %s"
                        % (tool, "no summary" if r[5] == "none" else r[5] + " findings", r[2], r[3])
                    )
                rows.append(
                    [
                        tool,
                        r[5] if r[5] != "none" else "no summary",
                        r[1],
                        r[3],
                        r[4] + " s",
                        "PASS" if ok else "**FAIL**",
                    ]
                )
            self.table(["tool", "findings", "op cases ok", "exit", "time", "result"], rows)
        return fails, ran

    def attention_section(self):
        self.w("## Attention vs PyTorch SDPA")
        self.w()
        self.w(
            "bench/kernels: tpk's causal attention and "
            "`F.scaled_dot_product_attention(is_causal=True)` "
            "(bench/torch_attn.py) on the same shape and dtype in the same run, median times; "
            "speed = 100 x SDPA's time / tpk's. "
            "Target: >= %.0f%% of SDPA's speed (bf16), forward and forward+backward." % ATTN_TARGET
        )
        self.w()
        rows, extra = [], []
        for name, label in KERNEL_RUNS:
            j = self.bench(name)
            judged = not name.startswith("kernels-f32")
            if j is None:
                for part in ("fwd", "fwd+bwd"):
                    rows.append(
                        [
                            label,
                            "-",
                            "bf16" if judged else "f32",
                            part,
                            "-",
                            "-",
                            "-",
                            "-",
                            ">= %.0f%%" % ATTN_TARGET if judged else "(f32: no target)",
                            self.judge(None, 0) if judged else "not measured",
                        ]
                    )
                continue
            sh = j.get("attn_shape") or {}
            shape = "B=%s S=%s A=%s D=%s" % (
                sh.get("B", "?"),
                sh.get("S", "?"),
                sh.get("A", "?"),
                sh.get("D", "?"),
            )
            tf = {r["op"]: r.get("tflops") for r in j.get("rows", []) if "tflops" in r}
            t = j.get("torch_attn")
            if not t:
                why = "PyTorch not measured: bench/kernels found no python that imports torch"
                for part in ("fwd", "fwd+bwd"):
                    rows.append(
                        [
                            label,
                            shape,
                            j.get("dtype"),
                            part,
                            fmt(tf.get("attn_fwd") if part == "fwd" else None, "%.1f"),
                            "-",
                            "-",
                            "-",
                            ">= %.0f%%" % ATTN_TARGET if judged else "(f32: no target)",
                            self.judge(None, 0) if judged else "not measured",
                        ]
                    )
                self.missing.append(("attention vs SDPA, %s (%s)" % (label, shape), why))
            else:
                for part, ours, theirs, rate in (
                    ("fwd", t["tpk_fwd_ms"], t["fwd_ms"], tf.get("attn_fwd")),
                    ("fwd+bwd", t["tpk_fwd_ms"] + t["tpk_bwd_ms"], t["fwd_ms"] + t["bwd_ms"], None),
                ):
                    pct = 100.0 * theirs / ours if ours else None
                    rows.append(
                        [
                            label,
                            shape,
                            j.get("dtype"),
                            part,
                            fmt(rate, "%.1f"),
                            fmt(ours, "%.3f"),
                            fmt(theirs, "%.3f") + " (%s)" % t.get("impl", "?"),
                            fmt(pct, "%.1f%%"),
                            ">= %.0f%%" % ATTN_TARGET if judged else "(f32: no target)",
                            self.judge(pct, ATTN_TARGET) if judged else "-",
                        ]
                    )
            g = j.get("generic_attn") or {}
            extra.append(
                [
                    label,
                    fmt(j.get("attn_bwd_deterministic_ms")),
                    fmt(g.get("fwd_ms")),
                    fmt(g.get("bwd_ms")),
                ]
            )
        if rows:
            self.table(
                [
                    "run",
                    "shape",
                    "dtype",
                    "timed",
                    "tpk TFLOP/s",
                    "tpk ms",
                    "SDPA ms",
                    "speed vs SDPA",
                    "target",
                    "result",
                ],
                rows,
            )
        else:
            self.w("No attention figures.")
            self.w()
        if extra:
            self.w(
                "Other attention paths timed in the same runs (ms; `-`: not timed there): the "
                "deterministic backward, the generic kernels (`TPK_ATTN=generic`)."
            )
            self.w()
            self.table(["run", "bwd deterministic", "generic fwd", "generic bwd"], extra)

    def memory_section(self):
        self.w("## Memory-bound kernels vs copy bandwidth")
        self.w()
        self.w(
            "bench/kernels: the fewest bytes each op must move over its median time, against a "
            "device-to-device "
            "copy's bandwidth (read + write) measured in the same run. Target: >= %.0f%% of copy "
            "bandwidth."
            % MEM_TARGET
        )
        self.w()
        runs = [("kernels-f32", "f32")]
        for (
            name,
            _,
        ) in KERNEL_RUNS:  # the first bf16 run (every bf16 run times the same elementwise sizes)
            if name.startswith("kernels-bf16") and os.path.exists(
                os.path.join(self.d, name + ".json")
            ):
                runs.append((name, "bf16"))
                break
        else:
            runs.append(("kernels-bf16-gpt2-124M", "bf16"))
        rows = []
        for name, dt in runs:
            j = read_json(os.path.join(self.d, name + ".json"), [])
            if j is None:  # (already listed by attention_section)
                rows.append(
                    ["-", dt, "all", "-", "-", "-", ">= %.0f%%" % MEM_TARGET, self.judge(None, 0)]
                )
                continue
            copy = j.get("copy_gbs")
            for r in j.get("rows", []):
                if "gbs" not in r:
                    continue
                pct = 100.0 * r["gbs"] / copy if copy and r.get("gbs") is not None else None
                rows.append(
                    [
                        fmt(copy, "%.0f"),
                        j.get("dtype", dt),
                        r["op"],
                        fmt(r.get("ms"), "%.4f"),
                        fmt(r.get("gbs"), "%.1f"),
                        fmt(pct, "%.1f%%"),
                        ">= %.0f%%" % MEM_TARGET,
                        self.judge(pct, MEM_TARGET),
                    ]
                )
        self.table(
            ["copy GB/s", "dtype", "op", "ms", "GB/s", "% of copy", "target", "result"], rows
        )

    def gemm_section(self):
        self.w("## LM-head GEMMs vs a plain GEMM")
        self.w()
        self.w(
            "bench/gemm: the vocabulary-parallel LM head's three GEMMs per rank at t = 1, 2, 4, 8 "
            "through the op front end "
            "(bf16 weight gradient through gemm_acc into f32), against a plain cuBLASLt GEMM of "
            "the same shape (the same "
            "flops) on packed operands in the same process; the padded shard (Vp / t) is judged, "
            "the unpadded one shown "
            "for comparison. Target: >= %.2fx the plain GEMM (the earlier GPU-speed target, "
            "bench/RESULTS.md)."
            % LM_TARGET
        )
        self.w()
        rows = []
        for name in ("gemm-bf16", "gemm-f32"):
            j = self.bench(name)
            if j is None:
                rows.append(
                    [
                        name[5:],
                        "-",
                        "all",
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        ">= %.2fx" % LM_TARGET,
                        self.judge(None, 0),
                    ]
                )
                continue
            self.w(
                "%s: measured peak %s %s (a large square GEMM, its fastest call), backend %s."
                % (j.get("dtype"), fmt(j.get("peak"), "%.1f"), j.get("unit", ""), j.get("backend"))
            )
            self.w()
            for r in j.get("rows", []):
                if not r.get("gemm", "").startswith("lm"):
                    continue
                padded = "unpad" not in r["gemm"]
                rows.append(
                    [
                        j.get("dtype"),
                        r["t"],
                        r["gemm"],
                        "%d x %d x %d" % (r["m"], r["n"], r["k"]),
                        fmt(r.get("rate"), "%.1f"),
                        fmt(r.get("pct_peak"), "%.0f%%"),
                        fmt(r.get("plain_rate"), "%.1f"),
                        fmt(r.get("ratio"), "%.2fx"),
                        ">= %.2fx" % LM_TARGET if padded else "(comparison)",
                        self.judge(r.get("ratio"), LM_TARGET) if padded else "-",
                    ]
                )
        self.table(
            [
                "dtype",
                "t",
                "gemm",
                "m x n x k",
                "rate",
                "% peak",
                "plain rate",
                "vs plain",
                "target",
                "result",
            ],
            rows,
        )

    def gpt2_section(self):
        self.w("## GPT-2 training step vs PyTorch")
        self.w()
        self.w(
            "bench/gpt2_step.py: tpk's trainer (one rank) next to PyTorch eager and torch.compile "
            "of the same model "
            "(fused QKV, SDPA, tied head, fused AdamW, bf16 autocast) in the same run, median step "
            "after the warm-up. "
            "MFU: (6 N + 12 L H S) flops per token x tokens/s over the peak given (790 TFLOP/s: "
            "bf16 dense, as cuBLASLt "
            "reaches it on an H100). Peak memory: tpk's buffers (its trainer's `peak memory`), "
            "PyTorch's `torch.cuda.max_memory_allocated`. Target: GPT-2 124M at >= %.1fx "
            "torch.compile's tokens/s."
            % GPT2_TARGET
        )
        self.w()
        rows = []
        for name, model in GPT2_RUNS:
            j = self.bench(name)
            if j is None:
                rows.append(
                    [
                        model,
                        "all",
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        ">= %.1fx torch.compile" % GPT2_TARGET if model == "124M" else "-",
                        self.judge(None, 0) if model == "124M" else "not measured",
                    ]
                )
                continue
            shape, rr, ratio, skipped = step_json(j)
            for impl in ("tpk", "torch eager", "torch eager (no SDPA)", "torch.compile"):
                r = rr.get(impl)
                if r is None:
                    if impl in skipped:
                        rows.append(
                            [
                                shape,
                                impl,
                                "-",
                                "-",
                                "-",
                                "-",
                                "-",
                                "",
                                "not measured: " + skipped[impl],
                            ]
                        )
                        self.missing.append(("GPT-2 %s, %s" % (model, impl), skipped[impl]))
                    continue
                target, res = "", ""
                if impl == "tpk" and model == "124M":
                    target = ">= %.1fx torch.compile" % GPT2_TARGET
                    res = self.judge(ratio.get("torch.compile"), GPT2_TARGET)
                rows.append(
                    [shape, impl]
                    + step_cells(r)
                    + [fmt(ratio.get(impl), "%.2fx") if impl != "tpk" else "1.00x", target, res]
                )
            if model == "124M" and "tpk" not in rr:
                self.judge(None, 0)
        self.table(STEP_COLUMNS, rows)

    def families_section(self):
        self.w("## Llama and GPT-NeoX training steps vs PyTorch")
        self.w()
        self.w(
            "bench/gpt2_step.py --model llama-1B, neox-1B, neox-410M: tpk's trainer (`--arch "
            "llama|neox`, one rank) next to PyTorch eager and torch.compile of the same model "
            "written as Hugging Face computes it (Llama: RMSNorm, rotate-half RoPE, grouped-query "
            "attention by repeat_kv, SwiGLU, untied head; GPT-NeoX: LayerNorms, the per-head "
            "packed query_key_value, RoPE on rotary_pct 0.25 of each head, the parallel residual, "
            "exact GELU, untied head), SDPA, fused AdamW, bf16 autocast, S = 2048. MFU: (6 N + "
            "12 L H S) flops per token, N every parameter (the input embedding, a lookup, counted, "
            "as the trainer's own MFU counts it; Llama: 2 V H + L (2 H^2 + 2 H G D + "
            "3 H F + 2 H) + H, the K/V projections G D wide; GPT-NeoX: 2 V H + L (4 H^2 + 2 H F + "
            "F + 9 H) + 2 H), over the peak given (790 TFLOP/s). Targets at 1B: tpk >= %.1fx "
            "torch.compile's tokens/s (judged on the torch.compile row) and >= %.0f%% MFU (on the "
            "tpk row); the 410M is shown without a target." % (FAMILY_SPEED, FAMILY_MFU)
        )
        self.w()
        rows = []
        targets = {
            "tpk": (">= %.0f%% MFU" % FAMILY_MFU, FAMILY_MFU),
            "torch.compile": ("tpk >= %.1fx this" % FAMILY_SPEED, FAMILY_SPEED),
        }
        for name, judged in FAMILY_RUNS:
            j = self.bench(name)
            if j is None:
                if not judged:
                    rows.append([name, "all"] + ["-"] * 5 + ["-", "not measured"])
                for impl, (target, _) in targets.items() if judged else ():
                    rows.append([name, impl] + ["-"] * 5 + [target, self.judge(None, 0)])
                continue
            shape, rr, ratio, skipped = step_json(j)
            f8 = [k for k in list(rr) + list(skipped) if k.startswith("tpk --fp8")]
            for impl in ["tpk"] + f8 + ["torch eager", "torch eager (no SDPA)", "torch.compile"]:
                r = rr.get(impl)
                target = targets[impl][0] if judged and impl in targets else ""
                if impl in f8 and r is not None:  # FP8's speed-up over the bf16 trainer
                    up = j.get("fp8_ratio", {}).get("tpk")
                    rows.append(
                        [shape, impl]
                        + step_cells(r)
                        + [
                            fmt(ratio.get(impl), "%.2fx"),
                            ">= %.2fx tpk (bf16) tokens/s" % FP8_STEP if judged else "",
                            ("%s (%sx)" % (self.judge(up, FP8_STEP), fmt(up, "%.2f")))
                            if judged
                            else fmt(up, "%.2fx tpk"),
                        ]
                    )
                    rows.append(
                        [
                            shape,
                            impl + ": losses",
                            "first %s, last %s; bf16 first %s, last %s"
                            % (
                                fmt(r.get("first_loss"), "%.4f"),
                                fmt(r.get("last_loss"), "%.4f"),
                                fmt(rr.get("tpk", {}).get("first_loss"), "%.4f"),
                                fmt(rr.get("tpk", {}).get("last_loss"), "%.4f"),
                            ),
                        ]
                        + [""] * 6
                    )
                    continue
                if r is None:
                    why = skipped.get(impl)
                    if judged and impl in targets:
                        why = why or "not in the benchmark's output"
                        rows.append([shape, impl] + ["-"] * 5 + [target, self.judge(None, 0)])
                        self.missing.append(("%s, %s" % (name, impl), why))
                    elif why:
                        rows.append([shape, impl] + ["-"] * 5 + ["", "not measured: " + why])
                        self.missing.append(("%s, %s" % (name, impl), why))
                    continue
                mfu = r["mfu"] * 100 if r.get("mfu") is not None else None
                res = ""
                if target:
                    value = mfu if impl == "tpk" else ratio.get(impl)
                    res = self.judge(value, targets[impl][1])
                rows.append(
                    [shape, impl]
                    + step_cells(r)
                    + [fmt(ratio.get(impl), "%.2fx") if impl != "tpk" else "1.00x", target, res]
                )
        self.table(STEP_COLUMNS, rows)

    def fp8_section(self):
        self.w("## FP8 GEMMs vs bf16 and vs torch._scaled_mm")
        self.w()
        self.w(
            "bench/gemm --fp8: the FP8 linear's GEMMs through tpk_op_gemm_fp8 (cuBLASLt FP8; an "
            "operand in the other orientation transposed into scratch inside the call) against "
            "tpk_op_gemm in bf16 of the same shape; bench/torch_fp8.py: torch._scaled_mm (its "
            "transposes inside the call too) against torch.matmul bf16, in the same run. The "
            "casts are not in the times. Target: tpk's FP8 rate >= %.2fx torch._scaled_mm's at "
            "each shape." % FP8_GEMM
        )
        self.w()
        j, t = self.bench("gemm-fp8"), self.bench("torch-fp8")
        trow = {r["gemm"]: r for r in (t or {}).get("rows", [])}
        rows = []
        for r in (j or {}).get("rows", []):
            tr = trow.get(r["gemm"], {})
            vs = r["rate"] / tr["rate"] if tr.get("rate") else None
            if tr.get("error"):
                self.missing.append(("torch._scaled_mm %s" % r["gemm"], tr["error"]))
            rows.append(
                [
                    r["gemm"],
                    "%d x %d x %d" % (r["m"], r["n"], r["k"]),
                    r.get("formats", ""),
                    fmt(r.get("rate"), "%.1f"),
                    fmt(r.get("bf16_rate"), "%.1f"),
                    fmt(r.get("ratio"), "%.2fx"),
                    fmt(tr.get("rate"), "%.1f"),
                    fmt(tr.get("bf16_rate"), "%.1f"),
                    fmt(tr.get("ratio"), "%.2fx"),
                    fmt(vs, "%.2fx"),
                    ">= %.2fx" % FP8_GEMM,
                    self.judge(vs, FP8_GEMM),
                ]
            )
        if j is None:
            rows.append(["all"] + ["-"] * 9 + [">= %.2fx" % FP8_GEMM, self.judge(None, 0)])
        self.table(
            [
                "gemm",
                "m x n x k",
                "formats",
                "tpk FP8 TFLOP/s",
                "tpk bf16",
                "FP8 / bf16",
                "torch FP8",
                "torch bf16",
                "torch FP8 / bf16",
                "tpk FP8 / torch FP8",
                "target",
                "result",
            ],
            rows,
        )

    def missing_section(self):
        self.w("## Not measured, failed or skipped")
        self.w()
        items = [
            "step %s: %s%s" % (n, s[1], (" (" + s[4] + ")") if s[4] else "")
            for n, s in self.steps.items()
            if s[1] != "ok"
        ]
        items += ["%s: %s" % m for m in self.missing]
        items += ["unreadable: %s" % p for p in self.problems]
        if items:
            for i in items:
                self.w("- " + i)
        else:
            self.w("Nothing: every step ran and left its figures.")
        self.w()

    def write(self, path):
        body_start = len(self.out)
        self.steps_section()
        fails, ran = self.tests_section()
        self.attention_section()
        self.memory_section()
        self.gemm_section()
        self.gpt2_section()
        self.families_section()
        self.fp8_section()
        self.missing_section()
        body = self.out[body_start:]
        self.out = self.out[:body_start]
        e = self.env
        self.w("# GPU report")
        self.w()
        if self.mode == "nogpu":
            self.w(
                "**NO GPU**: no GPU was found on this machine (nvidia-smi lists none), so nothing "
                "was built, tested or "
                "measured; every step below is skipped. Run `make gpu-report` on a machine with a "
                "GPU."
            )
            self.w()
        elif self.mode == "host":
            self.w(
                "**HOST DRY RUN**: the benchmarks ran on the host backend at tiny sizes to check "
                "this report's pipeline; "
                "none of these figures is a GPU figure, and the GPU tests did not run."
            )
            self.w()
        self.w(
            "%s; commit %s; GPU: %s; %s; PyTorch %s; time budget %s s."
            % (
                e.get("date", "?"),
                e.get("commit", "?"),
                e.get("gpu", "none"),
                e.get("nvcc") or "no nvcc",
                e.get("torch", "?"),
                e.get("budget", "?"),
            )
        )
        self.w()
        failed_steps = [n for n, s in self.steps.items() if s[1] in ("failed", "timeout")]
        only = self.env.get("only", "")
        left_out = only and not ran  # TPK_REPORT_ONLY without test-gpu: the tests not judged
        if self.mode == "gpu":
            if not ran and not left_out:
                fails.insert(0, "make test-gpu did not run (%s)" % self.step_why("test-gpu"))
            build = self.steps.get("build")
            if build is None or build[1] != "ok":
                fails.insert(0, "the build %s" % (build[1] if build else "did not run"))
            ok = not fails
            if left_out and ok:
                self.w("**Tests and sanitizers: not asked for** (TPK_REPORT_ONLY: %s)" % only)
            else:
                self.w(
                    "**Tests and sanitizers: %s**%s"
                    % ("PASS" if ok else "FAILED", "" if ok else " — " + "; ".join(fails))
                )
        elif self.mode == "host":
            ok = not failed_steps
            self.w(
                "**Dry run: %s**%s"
                % (
                    "the steps that ran succeeded" if ok else "FAILED",
                    "" if ok else " — " + ", ".join(failed_steps),
                )
            )
        else:
            ok = False
            self.w("**Tests and sanitizers: not run (no GPU)**")
        self.w()
        c = self.counts
        self.w(
            "Figures against their targets: %d PASS, %d BELOW, %d not measured."
            % (c["PASS"], c["BELOW"], c["not measured"])
        )
        self.w()
        self.out += body
        with open(path, "w") as f:
            f.write("\n".join(self.out).rstrip() + "\n")
        if self.mode == "nogpu":
            return 2
        return 0 if ok else 1


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: python3 tools/gpu_report.py DIR OUT.md")
    rep = Report(sys.argv[1])
    rc = rep.write(sys.argv[2])
    print(
        "gpu-report: %s: %d PASS, %d BELOW, %d not measured%s"
        % (
            sys.argv[2],
            rep.counts["PASS"],
            rep.counts["BELOW"],
            rep.counts["not measured"],
            {
                0: "",
                1: "; a test, sanitizer or step failed (exit status 1)",
                2: "; no GPU (exit status 2)",
            }[rc],
        )
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
