#!/usr/bin/env python3
"""tools/cuda_report.py — static speed and resource report of the CUDA archive, checked against a
budget (make cuda-report; Python 3 standard library only; no GPU needed).

Inputs: the objects nvcc made of kernels/cuda/*.cu for sm_80 and sm_90 (build/cuda/*.o, each with
the SASS of both architectures inside) and ptxas's resource usage captured when they were compiled
(build/cuda/*.res.txt, `-Xptxas -v`: the Makefile keeps it). Nothing is compiled twice: the SASS
comes out of the objects with cuobjdump. Per kernel (demangled, without its parameter list) and
architecture it prints:

  regs          registers per thread (ptxas)
  spill         bytes of spill stores / spill loads (ptxas); stack: bytes of stack frame
  smem          static shared memory (ptxas) + dynamic shared memory at launch
  threads       threads per block at launch, and where that figure comes from: lb (the kernel's
                __launch_bounds__), src (its launch sites), code (--launch lines)
  blocks/SM     resident blocks per SM at that launch configuration, and what limits it

Launch configuration, taken from the code, not written by hand:
  threads       the kernel's __launch_bounds__ (EIATTR_MAX_THREADS in the cubin: what the compiler
                allocated registers for; every tensor-core attention kernel is launched with exactly
                its bound); else the block-size argument of the kernel's launch sites in
                kernels/cuda (`name<...><<<grid, block, smem, stream>>>`, or a launch through
                `auto kernel = name<...>;`), evaluated where it is a constant expression of literals
                and the files' enum / #define / constexpr int constants (the largest where the sites
                differ); else unknown ("?").
  dynamic smem  for the tensor-core attention kernels: tpk__flash_smem() of kernels/cuda/flash.cuh,
                the function the launchers pass to <<<>>> and to cudaFuncSetAttribute, evaluated by
                a small host program compiled against flash.cuh (its source is LAUNCH_PROBE below,
                which also names which kernel gets which of the function's cases, as
                attn.cu's launchers do); for other kernels the third launch argument
                where it is a constant; else unknown ("?", and blocks/SM then counts static shared
                memory only, printed as "<=N").

Blocks per SM (the CUDA occupancy calculator's rules, cudaOccupancy.h, for sm_80 and sm_90):
  warps     = ceil(threads / 32)
  by warps  = floor(64 / warps)                                   (2048 threads per SM)
  by regs   = floor(floor(16384 / rpw) * 4 / warps),  rpw = ceil(regs * 32 / 256) * 256
              (65536 registers per SM in 4 sub-partitions; a warp's registers come in units of 256)
  by smem   = floor(SMEM_SM / (ceil((static + dynamic + 1024) / 128) * 128))
              (1 KiB reserved per block; SMEM_SM = 164 KiB on sm_80, 228 KiB on sm_90; a block may
              have at most 163 KiB / 227 KiB: more is 0 blocks, the launch fails)
  blocks/SM = min(by warps, by regs, by smem, 32)

SASS figures, for every kernel with tensor-core instructions (the attention kernels tpk__flash_*):
  HMMA      tensor-core multiplies counted as m16n8k16 equivalents (HMMA.16816 = 1, HMMA.1688 = 1/2)
  insn      SASS instructions, each counted once as it stands in the code (static), NOPs excluded
  smem B    bytes moved to or from shared memory per warp instruction, all 32 lanes counted:
            LDS/STS/ATOMS by their width (.U8 1, .U16 2, none 4, .64 8, .128 16 bytes a lane:
            4 bytes a lane = 128 B a warp), LDSM/STSM (ldmatrix/stmatrix) 4 bytes a lane per
            matrix (.x4 = 16 B a lane = 512 B a warp), and LDGSTS (cp.async, global to shared) by
            its width (.128 = 512 B a warp) — shown apart as "cp.async"; "smem B/HMMA" counts both
  main loop the innermost loop holding the tensor-core work, defined on the control-flow graph of
            the SASS: basic blocks split at branch targets and after branches, EXIT and RET; an edge
            n -> h is a back edge where h dominates n; the natural loop of header h is h and every
            block that reaches one of its back edges' sources without passing h. The main loop is
            the natural loop containing the most HMMAs; among loops with equally many, the one with
            the fewest instructions (the innermost). Its figures count each instruction of its body
            once — an inner loop inside it (e.g. a k loop unrolled by 2) once, not once per trip —
            so "insn/HMMA" is the body's instructions over the body's HMMAs and "smem B/HMMA" the
            body's shared-memory bytes (per warp) over its HMMAs (per m16n8k16, per warp).
            The table also gives the number of inner loops holding HMMAs ("inner"), the local-memory
            instructions in the body ("local": LDL/STL, spills), and the header's and the body's
            last SASS address.
  totals    the same counts over the whole kernel.

Budget (tools/cuda-budget.txt, --budget): lines `metric arch limit target kernel-glob`; the LAST
line whose arch and glob match a kernel sets that metric's limit and target for it. Metrics:
regs (max), spill (max bytes, stores + loads), blocks (min per SM), insn/hmma (max, main loop),
smem/hmma (max, main loop, cp.async included). The limit is enforced: a kernel past it is a
violation, named, and the report exits 1. The target is the issue's goal: a kernel past it is
printed "over target" but does not fail. A budget line matching no kernel is a violation too (a
renamed kernel must not lose its budget silently). A line `nvcc X.Y` says which compiler the limits
were measured with: under another, violations are printed and not enforced. --suggest prints a
budget line at the measured value for every figure past its target.

Offline inputs for the self-test (tests/cuda_report.sh) and for reports from elsewhere:
--res FILE (ptxas -v output), --sass FILE (cuobjdump -sass), --elf FILE (cuobjdump -elf),
--launch FILE (lines `threads dynamic-smem kernel-glob`, threads "-" for unknown; the format
LAUNCH_PROBE prints), with --no-probe --no-source.
"""

import argparse
import fnmatch
import glob
import math
import os
import re
import shutil
import subprocess
import sys

ARCHS = {  # shared memory per SM and the most one block may have, bytes
    "sm_80": {"smem_sm": 164 * 1024, "smem_block": 163 * 1024},
    "sm_90": {"smem_sm": 228 * 1024, "smem_block": 227 * 1024},
}
REGS_SUBPART, SUBPARTS, REG_UNIT = 16384, 4, 256
MAX_WARPS, MAX_BLOCKS = 64, 32
SMEM_RESERVED, SMEM_UNIT = 1024, 128
METRICS = ("regs", "spill", "blocks", "insn/hmma", "smem/hmma")

# The host program that reads the attention kernels' dynamic shared memory from flash.cuh: each
# line `threads dynamic-bytes kernel-glob` (threads "-": from the kernel's __launch_bounds__).
LAUNCH_PROBE = r"""
#include "common.cuh"
#include "flash.cuh"
#include <stdio.h>
int main(void) {
    for (int D = 64; D <= 128; D *= 2) {
        printf("- %zu tpk__flash_fwd<%d, *>\n", tpk__flash_smem(0, D), D);
        printf("- %zu tpk__flash_dkv<%d, *, *, false>\n", tpk__flash_smem(1, D), D);
        printf("- %zu tpk__flash_dkv<%d, *, *, true>\n", tpk__flash_smem(3, D), D);
        printf("- %zu tpk__flash_dq<%d, *>\n", tpk__flash_smem(2, D), D);
    }
    return 0;
}
"""


def die(msg):
    print("cuda-report: " + msg, file=sys.stderr)
    sys.exit(2)


# ---- tools ------------------------------------------------------------------------------------


def find_tool(name, nvcc=None):
    """name on PATH, beside nvcc, in $CUDA_HOME/bin, or in the bin folders of Python's `nvidia`
    packages (PyPI's nvidia-cuda-cuobjdump puts it in site-packages/nvidia/cu13/bin)"""
    dirs = []
    if nvcc:
        dirs.append(os.path.dirname(os.path.realpath(nvcc)))
    if os.environ.get("CUDA_HOME"):
        dirs.append(os.path.join(os.environ["CUDA_HOME"], "bin"))
    p = shutil.which(name)
    if p:
        return p
    for d in dirs:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    try:
        import nvidia  # a namespace package: every install location

        for root in list(nvidia.__path__):
            for cand in sorted(glob.glob(os.path.join(root, "*", "bin", name)), reverse=True):
                if os.access(cand, os.X_OK):
                    return cand
    except ImportError:
        pass
    return None


def run(cmd, **kw):
    r = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, **kw
    )
    if r.returncode != 0:
        die("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()[-2000:]))
    return r.stdout


def demangle_all(names):
    """mangled -> demangled without the parameter list (c++filt; the mangled name where absent)"""
    names = sorted(set(names))
    out = {n: n for n in names}
    cf = shutil.which("c++filt")
    if cf and names:
        r = subprocess.run(
            [cf], input="\n".join(names) + "\n", stdout=subprocess.PIPE, universal_newlines=True
        )
        lines = r.stdout.splitlines()
        if len(lines) == len(names):
            for n, d in zip(names, lines):
                out[n] = strip_params(re.sub(r"^void ", "", d))
    return out


def strip_params(d):
    """'f<a, b>(int, float)' -> 'f<a, b>': cut at the '(' that opens the outermost parameter list"""
    depth = 0
    for i, c in enumerate(d):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0:
            return d[:i].strip()
    return d.strip()


# ---- parsers ----------------------------------------------------------------------------------


def parse_res(text):
    """ptxas -v output -> {(mangled, arch): {regs, spill_st, spill_ld, stack, smem}}"""
    res, cur, props = {}, None, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
        if m:
            cur, props = (m.group(1), m.group(2)), None
            res[cur] = {"regs": 0, "spill_st": 0, "spill_ld": 0, "stack": 0, "smem": 0}
            continue
        if cur is None:
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)  # the entry's, or a called function's (not counted)
            continue
        m = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        )
        if m and props == cur[0]:
            res[cur]["stack"], res[cur]["spill_st"], res[cur]["spill_ld"] = (
                int(x) for x in m.groups()
            )
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            res[cur]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            res[cur]["smem"] = int(s.group(1)) if s else 0
            cur = None
    return res


INSN = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")


def parse_sass(text):
    """cuobjdump -sass output -> {(mangled, arch): [(addr, pred, opcode, operands)]}"""
    funcs, arch, cur = {}, None, None
    for line in text.splitlines():
        m = re.match(r"\s*(?:arch = |code for )(sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault((m.group(1), arch), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            body = m.group(2).strip()
            pred = None
            pm = re.match(r"(@!?U?P[T0-9]+)\s+(.*)", body)
            if pm:
                pred, body = pm.group(1), pm.group(2)
            op, _, rest = body.partition(" ")
            cur.append((int(m.group(1), 16), pred, op, rest.strip()))
    return funcs


def parse_elf(text):
    """cuobjdump -elf output -> {(mangled, arch): max threads per block (__launch_bounds__)}"""
    out, arch, cur, attr = {}, None, None, None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"^\.nv\.info\.(\S+)\s*$", line)
        if m:
            cur = m.group(1)
            continue
        if line.startswith("."):
            cur = None
            continue
        m = re.match(r"\s*Attribute:\s*(\w+)", line)
        if m:
            attr = m.group(1)
            continue
        m = re.match(r"\s*Value:\s*(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)", line)
        if m and cur and attr == "EIATTR_MAX_THREADS":
            out[(cur, arch)] = int(m.group(1), 16) * int(m.group(2), 16) * int(m.group(3), 16)
    return out


def parse_launch(text):
    """lines `threads dynamic-smem kernel-glob` -> [(glob, threads or None, smem)]"""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        t, s, pat = line.split(None, 2)
        out.append((pat, None if t == "-" else int(t), int(s)))
    return out


# ---- launch sites in the source -----------------------------------------------------------------


def source_constants(texts):
    consts = {}
    pats = [
        r"\benum\s*\{([^}]*)\}",
        r"#define\s+([A-Z_][A-Z0-9_]*)\s+([0-9][0-9xa-fA-F]*)\b",
        r"constexpr\s+int\s+(\w+)\s*=\s*([^;,]+)[;,]",
    ]
    for t in texts:
        for body in re.findall(pats[0], t):
            body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
            for item in body.split(","):
                m = re.match(r"\s*(\w+)\s*=\s*(.+?)\s*$", item)
                if m:
                    consts.setdefault(m.group(1), m.group(2))
        for name, val in re.findall(pats[1], t):
            consts.setdefault(name, val)
        for name, val in re.findall(pats[2], t):
            consts.setdefault(name, val)
    return consts


def eval_const(expr, consts, depth=0):
    """an integer constant expression of literals and known constants, else None"""
    expr = re.sub(r"/\*.*?\*/", "", expr).strip()
    if depth > 8:
        return None

    def sub(m):
        v = consts.get(m.group(0))
        if v is None:
            raise KeyError(m.group(0))
        r = eval_const(v, consts, depth + 1)
        if r is None:
            raise KeyError(m.group(0))
        return str(r)

    try:
        e = re.sub(r"\b[A-Za-z_]\w*\b", sub, expr)
    except KeyError:
        return None
    e = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", e)
    if not re.fullmatch(r"[0-9xa-fA-F+\-*/()<> ]+", e):
        return None
    try:
        return int(eval(e.replace("/", "//"), {"__builtins__": {}}))  # digits and operators only
    except Exception:
        return None


def split_args(s):
    args, depth, cur = [], 0, ""
    for c in s:
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
        if c == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        args.append(cur.strip())
    return args


def source_launches(src_dir):
    """{kernel base name: set of (threads or None, dynamic smem or None)} from its launch sites
    (a launch through a variable, `auto kernel = name<...>;`, counts for name)"""
    texts = []
    for f in sorted(
        glob.glob(os.path.join(src_dir, "*.cu")) + glob.glob(os.path.join(src_dir, "*.cuh"))
    ):
        with open(f) as fh:
            texts.append(fh.read())
    consts = source_constants(texts)
    out = {}
    for t in texts:
        for m in re.finditer(r"\b([A-Za-z_]\w*)\s*(?:<[^;{}]*?>)?\s*<<<(.*?)>>>", t, re.S):
            args = split_args(m.group(2))
            if len(args) < 2:
                continue
            thr = eval_const(args[1], consts)
            smem = eval_const(args[2], consts) if len(args) > 2 else 0
            name = m.group(1)
            alias = list(
                re.finditer(
                    r"\bauto\s+%s\s*=\s*(?:[\w.>-]+\s*\?\s*)?([A-Za-z_]\w*)" % re.escape(name),
                    t[: m.start()],
                )
            )
            if (
                alias
            ):  # `auto kernel = some_kernel<...>;` ... kernel<<<...>>>: the nearest one before
                name = alias[-1].group(1)
            out.setdefault(name, set()).add((thr, smem))
    return out


def probe_launch(nvcc, src_dir, include_dir, workdir, nvccflags):
    os.makedirs(workdir, exist_ok=True)
    src, exe = os.path.join(workdir, "flash_launch.cu"), os.path.join(workdir, "flash_launch")
    with open(src, "w") as f:
        f.write(LAUNCH_PROBE)
    cmd = (
        [nvcc, "-std=c++17", "-arch=sm_80", "-I" + src_dir, "-I" + include_dir]
        + nvccflags
        + [src, "-o", exe]
    )
    r = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True
    )
    if r.returncode != 0:
        die(
            "the launch probe (the attention kernels' shared memory, from flash.cuh's "
            "tpk__flash_smem) did not "
            "compile: update LAUNCH_PROBE in tools/cuda_report.py to the launchers' code\n"
            + r.stdout[-3000:]
        )
    return parse_launch(run([exe]))


# ---- SASS analysis ------------------------------------------------------------------------------


def hmma_weight(op):
    m = re.match(r"HMMA\.(16)(8)(16|8|32)\b", op)
    if not m:
        return 1.0 if op.startswith("HMMA") else 0.0
    return int(m.group(1)) * int(m.group(2)) * int(m.group(3)) / (16 * 8 * 16)


WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}


def smem_bytes(op):
    """(bytes per warp between registers and shared memory, bytes per warp global -> shared) of
    one instruction"""
    parts = op.split(".")
    base = parts[0]
    if base in ("LDSM", "STSM"):
        n = 1
        for p in parts[1:]:
            if p in ("1", "2", "4"):
                n = int(p)
        return 32 * 4 * n, 0
    if base in ("LDS", "STS", "ATOMS"):
        w = 4
        for p in parts[1:]:
            if p in WIDTH:
                w = WIDTH[p]
        return 32 * w, 0
    if base == "LDGSTS":
        w = 4
        for p in parts[1:]:
            if p in WIDTH:
                w = WIDTH[p]
        return 0, 32 * w
    return 0, 0


def branch_target(rest):
    m = re.findall(r"0x([0-9a-f]+)", rest)
    return int(m[-1], 16) if m else None


def cfg(insns):
    """basic blocks [(start index, end index)] and successor lists"""
    n = len(insns)
    index = {a: i for i, (a, _, _, _) in enumerate(insns)}
    leaders = {0}
    for i, (a, pred, op, rest) in enumerate(insns):
        if op.startswith(("BRA", "BRX", "JMP", "JMX", "EXIT", "RET")):
            if i + 1 < n:
                leaders.add(i + 1)
            if op.startswith(("BRA", "JMP")):
                t = branch_target(rest)
                if t in index:
                    leaders.add(index[t])
    starts = sorted(leaders)
    blocks = [(s, (starts[k + 1] if k + 1 < len(starts) else n)) for k, s in enumerate(starts)]
    bidx = {s: k for k, (s, _) in enumerate(blocks)}
    succ = []
    for k, (s, e) in enumerate(blocks):
        a, pred, op, rest = insns[e - 1]
        out = []
        never = pred == "@!PT"
        cond = (pred is not None and pred != "@PT") or op.startswith("BRA.DIV")
        if op.startswith(("BRA", "JMP")) and not never:
            t = branch_target(rest)
            if t in index:
                out.append(bidx[index[t]])
            if cond and e < n:
                out.append(bidx[e])
        elif op.startswith(("EXIT", "RET", "BRX", "JMX")) and not never:
            if cond and e < n:
                out.append(bidx[e])
        elif e < n:
            out.append(bidx[e])
        succ.append(out)
    return blocks, succ


def dominators(succ):
    """immediate dominators of the blocks reachable from block 0 (Cooper, Harvey, Kennedy)"""
    order, seen, stack = [], {0}, [(0, iter(succ[0]))]
    while stack:
        v, it = stack[-1]
        for w in it:
            if w not in seen:
                seen.add(w)
                stack.append((w, iter(succ[w])))
                break
        else:
            order.append(v)
            stack.pop()
    rpo = order[::-1]
    num = {v: i for i, v in enumerate(rpo)}
    preds = {v: [] for v in rpo}
    for v in rpo:
        for w in succ[v]:
            preds[w].append(v)
    idom = {0: 0}
    changed = True
    while changed:
        changed = False
        for v in rpo[1:]:
            ps = [p for p in preds[v] if p in idom]
            new = ps[0]
            for p in ps[1:]:
                a, b = p, new
                while a != b:
                    while num[a] > num[b]:
                        a = idom[a]
                    while num[b] > num[a]:
                        b = idom[b]
                new = a
            if idom.get(v) != new:
                idom[v], changed = new, True
    return idom, preds


def dominates(idom, h, v):
    while True:
        if v == h:
            return True
        if v == 0:
            return False
        v = idom[v]


def natural_loops(blocks, succ):
    """{header block: set of blocks} for every loop (back edges to one header merged)"""
    idom, preds = dominators(succ)
    loops = {}
    for v in idom:
        for h in succ[v]:
            if h in idom and dominates(idom, h, v):
                body = loops.setdefault(h, {h})
                stack = [v]
                while stack:
                    x = stack.pop()
                    if x not in body:
                        body.add(x)
                        stack.extend(preds[x])
    return loops


def count(insns, idxs):
    c = {"insn": 0, "hmma": 0.0, "smem": 0, "cpasync": 0, "local": 0}
    for i in idxs:
        op = insns[i][2]
        if op == "NOP":
            continue
        c["insn"] += 1
        c["hmma"] += hmma_weight(op)
        ld, cp = smem_bytes(op)
        c["smem"] += ld
        c["cpasync"] += cp
        if op.startswith(("LDL", "STL")):
            c["local"] += 1
    return c


def analyze_sass(insns):
    """the whole kernel's counts and its main loop's (None without HMMA)"""
    total = count(insns, range(len(insns)))
    if total["hmma"] == 0:
        return None
    blocks, succ = cfg(insns)
    best = None
    for h, body in natural_loops(blocks, succ).items():
        idxs = [i for b in body for i in range(*blocks[b])]
        c = count(insns, idxs)
        if c["hmma"] == 0:
            continue
        c["addr"] = insns[blocks[h][0]][0]
        c["end"] = max(insns[blocks[b][1] - 1][0] for b in body)
        c["body"] = body
        if best is None or (c["hmma"], -c["insn"]) > (best["hmma"], -best["insn"]):
            best = c
    if best is not None:  # inner loops with HMMAs inside the main loop: counted once each
        best["inner"] = 0
        for h, body in natural_loops(blocks, succ).items():
            if (
                body < best["body"]
                and count(insns, [i for b in body for i in range(*blocks[b])])["hmma"] > 0
            ):
                best["inner"] += 1
        del best["body"]
    return {"total": total, "loop": best}


# ---- occupancy --------------------------------------------------------------------------------


def occupancy(arch, regs, smem_static, smem_dyn, threads):
    """(blocks per SM, the limiting resource); smem_dyn None: static only ('<=')"""
    if threads is None:
        return None, "threads?"
    warps = -(-threads // 32)
    lim = {"warps": MAX_WARPS // warps, "max": MAX_BLOCKS}
    rpw = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    lim["regs"] = (REGS_SUBPART // rpw) * SUBPARTS // warps
    smem = smem_static + (smem_dyn or 0)
    if smem > ARCHS[arch]["smem_block"]:
        return 0, "smem>%dK" % (ARCHS[arch]["smem_block"] // 1024)
    per = -(-(smem + SMEM_RESERVED) // SMEM_UNIT) * SMEM_UNIT
    lim["smem"] = ARCHS[arch]["smem_sm"] // per
    why = min(lim, key=lambda k: (lim[k], ["regs", "smem", "warps", "max"].index(k)))
    return lim[why], why


# ---- budget -----------------------------------------------------------------------------------


def parse_budget(text, path):
    rules = []
    for no, line in enumerate(text.splitlines(), 1):
        s = line.split("#", 1)[0].strip()
        if not s:
            continue
        f = s.split(None, 4)
        if f[0] == "nvcc" and len(f) == 2:
            rules.append({"line": no, "metric": "nvcc", "version": f[1], "used": True})
            continue
        if len(f) != 5 or f[0] not in METRICS:
            die(
                "%s:%d: expected `metric arch limit target kernel-glob` (metric one of %s): %s"
                % (path, no, ", ".join(METRICS), line)
            )
        try:
            lim, tgt = float(f[2]), (None if f[3] == "-" else float(f[3]))
        except ValueError:
            die("%s:%d: limit and target must be numbers (target may be -): %s" % (path, no, line))
        rules.append(
            {
                "line": no,
                "metric": f[0],
                "arch": f[1],
                "limit": lim,
                "target": tgt,
                "glob": f[4],
                "used": False,
            }
        )
    return rules


def metric_value(k, metric):
    if metric == "regs":
        return k["regs"]
    if metric == "spill":
        return k["spill_st"] + k["spill_ld"]
    if metric == "blocks":
        return k["blocks"]
    loop = k["sass"]["loop"] if k.get("sass") else None
    if loop is None or loop["hmma"] == 0:
        return None
    return (
        loop["insn"] / loop["hmma"]
        if metric == "insn/hmma"
        else (loop["smem"] + loop["cpasync"]) / loop["hmma"]
    )


def check_budget(kernels, rules):
    """(violations, over-target notes, suggested lines: the measured value as the limit where past
    the target)"""
    bad, over, suggest = [], [], []
    for k in kernels:
        for metric in METRICS:
            rule = None
            for r in rules:
                if r["metric"] == "nvcc":
                    continue
                if (
                    r["metric"] == metric
                    and fnmatch.fnmatchcase(k["arch"], r["arch"])
                    and fnmatch.fnmatchcase(k["name"], r["glob"])
                ):
                    r["used"] = (
                        True  # the line matches a kernel, even where a later line overrides it
                    )
                    rule = r
            if rule is None:
                continue
            v = metric_value(k, metric)
            where = "%s %s: %s" % (k["arch"], k["name"], metric)
            if v is None:
                bad.append("%s unknown (budget line %d)" % (where, rule["line"]))
                continue
            lo = metric == "blocks"  # a minimum; the others are maxima
            past = lambda x: x is not None and ((v < x) if lo else (v > x))
            fmt = "%g" if metric in ("regs", "spill", "blocks") else "%.2f"
            rel = "<" if lo else ">"
            if past(rule["limit"]):
                bad.append(
                    ("%s " + fmt + " %s limit %g (budget line %d)")
                    % (where, v, rel, rule["limit"], rule["line"])
                )
            elif past(rule["target"]):
                over.append(
                    ("%s " + fmt + " %s target %g (limit %g, budget line %d)")
                    % (where, v, rel, rule["target"], rule["limit"], rule["line"])
                )
            if past(rule["target"]):
                lim = (
                    v if lo or fmt == "%g" else math.ceil(v * 100 - 1e-9) / 100
                )  # rounded up: the value passes
                suggest.append(
                    "%-10s %s %8s %5g  %s"
                    % (metric, k["arch"], fmt % lim, rule["target"], k["name"])
                )
    for r in rules:
        if not r["used"]:
            bad.append(
                "budget line %d (%s %s %s) matches no kernel"
                % (r["line"], r["metric"], r["arch"], r["glob"])
            )
    return bad, over, suggest


# ---- the report -------------------------------------------------------------------------------


def collect(res, sass, elf, launch, src, names):
    kernels = []
    for (mangled, arch), r in sorted(
        res.items(), key=lambda kv: (kv[0][1], names.get(kv[0][0], kv[0][0]))
    ):
        if arch not in ARCHS:
            continue
        name = names.get(mangled, mangled)
        k = dict(r, name=name, arch=arch, mangled=mangled)
        thr, how = elf.get((mangled, arch)), "lb"
        dyn = None
        for pat, t, s in launch:
            if fnmatch.fnmatchcase(name, pat):
                dyn = s
                if thr is None and t is not None:
                    thr, how = t, "code"
        base = re.split(r"[<(]", name)[0].split("::")[-1]
        sites = src.get(base, set())
        if dyn is None and sites:
            smems = {s for _, s in sites}
            dyn = max(smems) if None not in smems else None
        if thr is None and sites:
            ts = {t for t, _ in sites}
            if None not in ts:
                thr, how = max(ts), ("src" if len(ts) == 1 else "src max")
        k["threads"], k["threads_from"], k["dyn"] = thr, how if thr else "?", dyn
        k["blocks"], k["why"] = occupancy(arch, k["regs"], k["smem"], dyn, thr)
        if dyn is None and k["blocks"] is not None:
            k["blocks_le"] = True
        ins = sass.get((mangled, arch))
        k["sass"] = analyze_sass(ins) if ins else None
        kernels.append(k)
    return kernels


def short(name, width):
    return name if len(name) <= width else name[: width - 3] + "..."


def print_report(kernels, out):
    for arch in sorted({k["arch"] for k in kernels}):
        ks = [k for k in kernels if k["arch"] == arch]
        a = ARCHS[arch]
        out.write(
            "\n== %s: %d kernels; per SM 65536 registers, %d KiB shared memory, 2048 threads, 32 "
            "blocks ==\n"
            % (arch, len(ks), a["smem_sm"] // 1024)
        )
        out.write(
            "%-64s %4s %9s %5s %13s %8s %9s\n"
            % ("kernel", "regs", "spill B", "stack", "smem st+dyn", "threads", "blocks/SM")
        )
        for k in ks:
            dyn = "?" if k["dyn"] is None else str(k["dyn"])
            thr = (
                "?"
                if k["threads"] is None
                else "%d %s" % (k["threads"], k["threads_from"].split()[0])
            )
            blk = (
                "?"
                if k["blocks"] is None
                else ("<=" if k.get("blocks_le") else "") + "%d %s" % (k["blocks"], k["why"])
            )
            out.write(
                "%-64s %4d %9s %5d %13s %8s %9s\n"
                % (
                    short(k["name"], 64),
                    k["regs"],
                    "%d/%d" % (k["spill_st"], k["spill_ld"]),
                    k["stack"],
                    "%d+%s" % (k["smem"], dyn),
                    thr,
                    blk,
                )
            )
        tc = [k for k in ks if k["sass"]]
        if not tc:
            continue
        out.write(
            "\n-- %s tensor-core kernels, SASS: main loop (per m16n8k16 HMMA, shared-memory bytes "
            "per warp) | whole kernel --\n"
            % arch
        )
        out.write(
            "%-40s %6s %5s %5s %9s %10s %8s %6s | %6s %5s %9s %10s | %s\n"
            % (
                "kernel",
                "insn",
                "HMMA",
                "inner",
                "insn/HMMA",
                "smem B/HMMA",
                "cp.async",
                "local",
                "insn",
                "HMMA",
                "insn/HMMA",
                "smem B/HMMA",
                "main loop's header, last address",
            )
        )
        for k in tc:
            t, l = k["sass"]["total"], k["sass"]["loop"]
            tot = "%6d %5g %9.2f %10.1f" % (
                t["insn"],
                t["hmma"],
                t["insn"] / t["hmma"],
                (t["smem"] + t["cpasync"]) / t["hmma"],
            )
            if l is None:
                out.write(
                    "%-40s %6s %5s %5s %9s %10s %8s %6s | %s\n"
                    % (short(k["name"], 40), "-", "-", "-", "no loop", "-", "-", "-", tot)
                )
                continue
            out.write(
                "%-40s %6d %5g %5d %9.2f %10.1f %8.1f %6d | %s | %#06x %#06x\n"
                % (
                    short(k["name"], 40),
                    l["insn"],
                    l["hmma"],
                    l["inner"],
                    l["insn"] / l["hmma"],
                    (l["smem"] + l["cpasync"]) / l["hmma"],
                    l["cpasync"] / l["hmma"],
                    l["local"],
                    tot,
                    l["addr"],
                    l["end"],
                )
            )


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "objects", nargs="*", help="nvcc objects (a ptxas log FILE.res.txt beside FILE.o)"
    )
    ap.add_argument("--budget", help="the budget file (tools/cuda-budget.txt)")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc"))
    ap.add_argument(
        "--src", default="kernels/cuda", help="the CUDA sources (launch sites, flash.cuh)"
    )
    ap.add_argument("--include", default="include")
    ap.add_argument(
        "--nvccflags", default="", help="extra flags for the launch probe (e.g. -DTPK_NO_NCCL)"
    )
    ap.add_argument("--workdir", default="build/cuda-report")
    ap.add_argument("--res", action="append", default=[], help="ptxas -v output (offline)")
    ap.add_argument("--sass", action="append", default=[], help="cuobjdump -sass output (offline)")
    ap.add_argument("--elf", action="append", default=[], help="cuobjdump -elf output (offline)")
    ap.add_argument(
        "--launch",
        action="append",
        default=[],
        help="`threads dynamic-smem kernel-glob` lines (offline)",
    )
    ap.add_argument("--no-probe", action="store_true", help="do not compile the launch probe")
    ap.add_argument("--no-source", action="store_true", help="do not read launch sites from --src")
    ap.add_argument(
        "--suggest",
        action="store_true",
        help="print budget lines with today's values where a kernel is past its target",
    )
    ap.add_argument(
        "--find-tool",
        metavar="NAME",
        help="print where NAME (cuobjdump, nvdisasm) is found, exit 1 if nowhere",
    )
    a = ap.parse_args(argv)
    if a.find_tool:
        p = find_tool(a.find_tool, a.nvcc)
        if p:
            print(p)
        return 0 if p else 1

    res_t, sass_t, elf_t, launch = [], [], [], []
    for f in a.res + a.sass + a.elf + a.launch:
        if not os.path.exists(f):
            die("no such file: " + f)
    res_t += [open(f).read() for f in a.res]
    sass_t += [open(f).read() for f in a.sass]
    elf_t += [open(f).read() for f in a.elf]
    for f in a.launch:
        launch += parse_launch(open(f).read())
    if a.objects:
        cuobjdump = find_tool("cuobjdump", a.nvcc)
        if not cuobjdump:
            die(
                "cuobjdump not found (PATH, beside nvcc, $CUDA_HOME/bin, Python's nvidia "
                "packages): sh tools/cuda-deps.sh installs it"
            )
        for o in a.objects:
            r = os.path.splitext(o)[0] + ".res.txt"
            if not os.path.exists(o) or not os.path.exists(r):
                die("%s or %s missing: build them with make %s" % (o, r, o))
            res_t.append(open(r).read())
            sass_t.append(run([cuobjdump, "-sass", o]))
            elf_t.append(run([cuobjdump, "-elf", o]))
    if not res_t:
        die("nothing to report: give objects or --res")
    if not a.no_probe:
        if not a.nvcc:
            die("nvcc not found (for the launch probe); --no-probe to go without")
        launch += probe_launch(a.nvcc, a.src, a.include, a.workdir, a.nvccflags.split())
    src = {} if a.no_source else source_launches(a.src)

    res, sass, elf = {}, {}, {}
    for t in res_t:
        res.update(parse_res(t))
    for t in sass_t:
        sass.update(parse_sass(t))
    for t in elf_t:
        elf.update(parse_elf(t))
    names = demangle_all(m for m, _ in res)
    kernels = collect(res, sass, elf, launch, src, names)

    out = sys.stdout
    nvcc_version = None
    if a.nvcc and a.objects:
        ver = re.findall(r"release ([\d.]+)", run([a.nvcc, "--version"]))
        nvcc_version = ver[0] if ver else "?"
        out.write(
            "cuda-report: %s (nvcc %s), %s\n"
            % (", ".join(a.objects), nvcc_version, ", ".join(sorted({k["arch"] for k in kernels})))
        )
    print_report(kernels, out)
    if not a.budget:
        return 0
    rules = parse_budget(open(a.budget).read(), a.budget)
    bad, over, suggest = check_budget(kernels, rules)
    if a.suggest:
        out.write(
            "\n== budget lines at today's values, for every kernel past its target ==\n"
            + "\n".join(suggest)
            + "\n"
        )
    rules_n = sum(1 for r in rules if r["metric"] != "nvcc")
    out.write("\n== budget %s: %d lines ==\n" % (a.budget, rules_n))
    for s in over:
        out.write("over target: %s\n" % s)
    for s in bad:
        out.write("VIOLATION: %s\n" % s)
    want = [r["version"] for r in rules if r["metric"] == "nvcc"]
    lenient = bool(want and nvcc_version and not nvcc_version.startswith(want[0]))
    if lenient and bad:
        out.write(
            "cuda-report: the budget was measured with nvcc %s, this is nvcc %s: the violations "
            "above are not enforced "
            "(registers and SASS differ between compilers)\n" % (want[0], nvcc_version)
        )
    out.write(
        "cuda-report: %d kernels, %d budget lines: %d violations, %d over target\n"
        % (len(kernels), rules_n, len(bad), len(over))
    )
    return 1 if bad and not lenient else 0


if __name__ == "__main__":
    sys.exit(main())
