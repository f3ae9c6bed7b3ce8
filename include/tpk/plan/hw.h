/* tpk/plan/hw.h — a machine's rates for the planner's cost model, built in or measured.
 *
 * A profile holds what the cost model needs of one device and its links:
 *   an op with flops (GEMMs, the fused linear): flops / the GEMM rate of its size class (classes
 *     by flops: < 1e7, < 1e8, < 1e9, < 1e10, < 1e11, more: small GEMMs run far below the peak);
 *     attention (attn_*): flops / attn_tflops;
 *   any other op: bytes / mem_gbs (the fewest bytes it must move, as the profiler counts them);
 *   plus op_us per op (a kernel launch; the host's call);
 *   an op the profile measured (--calibrate: "op NAME"; plain GEMMs stay by class) at its own
 *     rate (a fused linear's: its GEMM, bias and activation together);
 *   a collective over n ranks of S bytes (alpha: the link's latency per step, beta = 1 / its bus
 *     bandwidth; intra inside a node, inter when the group spans nodes, the slowest link bounds):
 *       all-reduce      min(ring 2 (n-1) alpha + 2 (n-1)/n S beta, tree 2 log2(n) alpha + 2 S beta)
 *       all-gather, reduce-scatter  (n-1) alpha + (n-1)/n S beta   (S the gathered whole)
 *       broadcast       log2(n) alpha + S beta;   point-to-point  alpha + S beta.
 * Built-in profiles (tpk_hw_builtin): A100 40/80 GB, H100 SXM, H200 — the vendors' published
 * peak rates, memory and link bandwidths, times stated efficiencies (the `source` line says which);
 * "cpu" a generic CPU core. tpk_hw_read / tpk_hw_write: a profile file, one "key value..." a line
 * (tpk_hw_write's keys; '#' comments), read as strictly as the kit's JSON files: a missing key, a
 * key twice, a number out of its range, a line cut by the 512-byte buffer are errors naming the
 * file and the line. */
#ifndef TPK_HW_H
#define TPK_HW_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/comm.h"

enum { TPK_HW_GEMM_N = 6, TPK_HW_OPS = 64 };

typedef struct tpk_hw_op { /* a measured op's rate (--calibrate) */
    char name[40];
    double gbs, tflops; /* the one the op is counted in (the other 0) */
} tpk_hw_op;

typedef struct tpk_hw {
    char name[64];
    char source[256];                  /* where the figures come from */
    double mem_gb;                     /* memory per device (1e9 bytes) */
    double reserve_gb;                 /* held outside the kit's buffers: the runtime, library
                                          workspaces, communicator buffers, fragmentation */
    double peak_tflops;                /* the dense peak of the compute dtype (MFU's denominator) */
    double gemm_tflops[TPK_HW_GEMM_N]; /* achieved by GEMM size class (above) */
    double attn_tflops;                /* attention, forward and backward */
    double mem_gbs;                    /* memory-bound ops */
    double op_us;                      /* fixed time per op */
    double intra_gbs, intra_us;        /* collectives inside a node: bus bandwidth, latency */
    double inter_gbs, inter_us;        /* across nodes, per rank */
    int gpus_per_node;                 /* the default node size */
    int host;                          /* 1: the host backend (its fused ops: xent_fused alone) */
    int nops;
    tpk_hw_op op[TPK_HW_OPS];
} tpk_hw;

/* ---- built-in profiles -------------------------------------------------------------------- */

/* Efficiencies over the published peaks, from this project's H100 measurements (bench/RESULTS.md,
 * make gpu-report): cuBLASLt's bf16 GEMMs of a GPT-2 step 657-756 TFLOP/s (66-76% of 989) at the
 * largest sizes, less below; the tensor-core attention 181-249 TFLOP/s in the profiler's nominal
 * flops (about 22%); the memory-bound ops 65-80% of a copy that reaches 2.8-3 TB/s of 3.35 (about
 * 62%); NCCL's bus bandwidth taken as 80% of a link's per-direction bandwidth (not measured here:
 * one GPU). Applied alike to the A100 and the H200. */
static const double tpk__hw_gemm_eff[TPK_HW_GEMM_N] = {0.02, 0.06, 0.20, 0.45, 0.65, 0.72};
#define TPK__HW_ATTN_EFF 0.22
#define TPK__HW_MEM_EFF 0.62
#define TPK__HW_LINK_EFF 0.80

static inline void tpk__hw_gpu(tpk_hw *h, const char *name, const char *what, double mem_gb,
                               double tflops, double gbs, double nvlink_gbs, double nic_gbs) {
    memset(h, 0, sizeof *h);
    snprintf(h->name, sizeof h->name, "%s", name);
    snprintf(
        h->source, sizeof h->source,
        "published: %s, %.0f GB, %.0f TFLOP/s bf16 dense, %.0f GB/s memory, NVLink %.0f GB/s "
        "a direction, %.0f GB/s network per GPU; efficiencies (H100-measured, links assumed): GEMM "
        "%.0f-%.0f%%, attention %.0f%%, memory %.0f%%, links %.0f%% of those",
        what, mem_gb, tflops, gbs, nvlink_gbs, nic_gbs, 100 * tpk__hw_gemm_eff[0],
        100 * tpk__hw_gemm_eff[TPK_HW_GEMM_N - 1], 100 * TPK__HW_ATTN_EFF, 100 * TPK__HW_MEM_EFF,
        100 * TPK__HW_LINK_EFF);
    h->mem_gb = mem_gb, h->reserve_gb = 4, h->peak_tflops = tflops;
    for (int k = 0; k < TPK_HW_GEMM_N; k++) h->gemm_tflops[k] = tflops * tpk__hw_gemm_eff[k];
    h->attn_tflops = tflops * TPK__HW_ATTN_EFF, h->mem_gbs = gbs * TPK__HW_MEM_EFF, h->op_us = 3;
    h->intra_gbs = nvlink_gbs * TPK__HW_LINK_EFF, h->intra_us = 8;
    h->inter_gbs = nic_gbs * TPK__HW_LINK_EFF, h->inter_us = 20;
    h->gpus_per_node = 8;
}

/* The built-in profile `name` (a100-40, a100-80, h100, h200, cpu) into *h; false when none. */
static inline bool tpk_hw_builtin(const char *name, tpk_hw *h) {
    if (!name) return false;
    if (!strcmp(name, "a100-40"))
        tpk__hw_gpu(h, name, "NVIDIA A100 SXM4 40GB", 40, 312, 1555, 300, 25);
    else if (!strcmp(name, "a100-80"))
        tpk__hw_gpu(h, name, "NVIDIA A100 SXM4 80GB", 80, 312, 2039, 300, 25);
    else if (!strcmp(name, "h100"))
        tpk__hw_gpu(h, name, "NVIDIA H100 SXM5 80GB", 80, 989, 3350, 450, 50);
    else if (!strcmp(name, "h200"))
        tpk__hw_gpu(h, name, "NVIDIA H200 SXM 141GB", 141, 989, 4800, 450, 50);
    else if (!strcmp(name, "cpu")) { /* one core of a current x86-64 server, OpenBLAS, MPI over
                                        shared memory: rough; --calibrate measures a machine */
        memset(h, 0, sizeof *h);
        snprintf(h->name, sizeof h->name, "cpu");
        snprintf(h->source, sizeof h->source,
                 "assumed: one CPU core (f32 GEMM 5-60 GFLOP/s, 3 GB/s memory-bound ops, MPI over "
                 "shared memory 3 GB/s); measure a machine with --calibrate");
        h->mem_gb = 16, h->reserve_gb = 0, h->peak_tflops = 0.08;
        const double g[TPK_HW_GEMM_N] = {0.005, 0.015, 0.03, 0.05, 0.06, 0.06};
        memcpy(h->gemm_tflops, g, sizeof g);
        h->attn_tflops = 0.01, h->mem_gbs = 3, h->op_us = 2;
        h->intra_gbs = 3, h->intra_us = 5, h->inter_gbs = 1, h->inter_us = 30;
        h->gpus_per_node = 1, h->host = 1;
    } else return false;
    return true;
}
static inline const char *tpk_hw_builtin_names(void) { return "a100-40, a100-80, h100, h200, cpu"; }

/* ---- the cost model ----------------------------------------------------------------------- */

static inline int tpk__hw_class(double flops) {
    int k = 0;
    for (double lim = 1e7; k < TPK_HW_GEMM_N - 1 && flops >= lim; lim *= 10) k++;
    return k;
}
static inline const tpk_hw_op *tpk__hw_find(const tpk_hw *h, const char *name) {
    for (int i = 0; i < h->nops; i++)
        if (!strcmp(h->op[i].name, name)) return &h->op[i];
    return NULL;
}

/* Seconds of one op (the profiler's name, bytes and flops). */
static inline double tpk_hw_op_seconds(const tpk_hw *h, const char *name, double bytes,
                                       double flops) {
    const tpk_hw_op *m = tpk__hw_find(h, name);
    bool attn = !strncmp(name, "attn", 4);
    double s;
    if (m && flops > 0 && m->tflops > 0) s = flops / (m->tflops * 1e12);
    else if (flops > 0)
        s = flops / ((attn ? h->attn_tflops : h->gemm_tflops[tpk__hw_class(flops)]) * 1e12);
    else if (m && m->gbs > 0) s = bytes / (m->gbs * 1e9);
    else s = bytes / (h->mem_gbs * 1e9);
    return s + h->op_us * 1e-6;
}

/* Seconds of a collective of `kind` moving `bytes` (all-gather, reduce-scatter: the whole;
 * all-to-all: the larger of what this rank sends to and receives from the others, exchanged with
 * each of the n - 1 peers in turn) over n ranks, inside a node or across nodes (inter). */
static inline double tpk_hw_coll_seconds(const tpk_hw *h, tpk_coll_kind kind, double bytes, int n,
                                         bool inter) {
    double a = (inter ? h->inter_us : h->intra_us) * 1e-6,
           b = 1.0 / ((inter ? h->inter_gbs : h->intra_gbs) * 1e9), lg = log2((double)n);
    if (kind == TPK_COLL_SEND || kind == TPK_COLL_RECV) return a + bytes * b;
    if (n <= 1) return 0;
    switch (kind) {
        case TPK_COLL_ALLREDUCE: {
            double ring = 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * bytes * b,
                   tree = 2.0 * ceil(lg) * a + 2.0 * bytes * b;
            return ring < tree ? ring : tree;
        }
        case TPK_COLL_ALLGATHER:
        case TPK_COLL_REDUCE_SCATTER: return (n - 1) * a + (double)(n - 1) / n * bytes * b;
        case TPK_COLL_BROADCAST: return ceil(lg) * a + bytes * b;
        case TPK_COLL_ALLTOALL: return (n - 1) * a + bytes * b;
        default: return ceil(lg) * a; /* barrier */
    }
}

/* ---- profile files ------------------------------------------------------------------------ */

static inline bool tpk_hw_write(const tpk_hw *h, FILE *f) {
    fprintf(f, "# tpk hardware profile (tpk/plan/hw.h)\nname %s\nsource %s\n", h->name, h->source);
    fprintf(f, "mem_gb %.6g\nreserve_gb %.6g\npeak_tflops %.6g\ngemm_tflops", h->mem_gb,
            h->reserve_gb, h->peak_tflops);
    for (int k = 0; k < TPK_HW_GEMM_N; k++) fprintf(f, " %.6g", h->gemm_tflops[k]);
    fprintf(f,
            "\nattn_tflops %.6g\nmem_gbs %.6g\nop_us %.6g\nintra_gbs %.6g\nintra_us %.6g\n"
            "inter_gbs %.6g\ninter_us %.6g\ngpus_per_node %d\nhost %d\n",
            h->attn_tflops, h->mem_gbs, h->op_us, h->intra_gbs, h->intra_us, h->inter_gbs,
            h->inter_us, h->gpus_per_node, h->host);
    for (int i = 0; i < h->nops; i++)
        fprintf(f, "op %s %s %.6g\n", h->op[i].name, h->op[i].tflops > 0 ? "tflops" : "gbs",
                h->op[i].tflops > 0 ? h->op[i].tflops : h->op[i].gbs);
    return !ferror(f);
}

/* Read a profile file into *h; false with err[n] naming the file, the line or the missing key. */
static inline bool tpk_hw_read(const char *path, tpk_hw *h, char *err, size_t n) {
    static const char *const keys[] = {
        "name",  "mem_gb",    "reserve_gb", "peak_tflops", "gemm_tflops", "attn_tflops",  "mem_gbs",
        "op_us", "intra_gbs", "intra_us",   "inter_gbs",   "inter_us",    "gpus_per_node"};
    enum { NKEYS = sizeof keys / sizeof keys[0] };
    int seen[NKEYS] = {0}; /* the line of each key, 0 before it appears */
    int seen_source = 0, seen_host = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, n, "%s: cannot open the profile (%s)", path, strerror(errno));
        return false;
    }
    memset(h, 0, sizeof *h);
    char line[512];
    int ln = 0;
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        ln++;
        char key[64], rest[448];
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, n, "%s:%d: a line longer than %d bytes", path, ln, (int)sizeof line - 2);
            ok = false;
            break;
        }
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || sscanf(line, "%63s", key) != 1) continue;
        const char *v = line + strspn(line, " \t") + strlen(key);
        v += strspn(v, " \t");
        snprintf(rest, sizeof rest, "%s", v);
        int k = 0;
        while (k < NKEYS && strcmp(keys[k], key)) k++;
        double x[TPK_HW_GEMM_N];
        char *end = NULL;
        int *once = !strcmp(key, "source") ? &seen_source
                    : !strcmp(key, "host")   ? &seen_host
                    : k < NKEYS              ? &seen[k]
                                             : NULL;
        if (once && *once) { /* each key once, as in the kit's JSON files */
            snprintf(err, n, "%s:%d: the key \"%s\" appears twice (first at line %d)", path, ln,
                     key, *once);
            ok = false;
            break;
        }
        if (once) *once = ln;
        if (!strcmp(key, "source")) {
            snprintf(h->source, sizeof h->source, "%.255s", rest);
            continue;
        }
        if (!strcmp(key, "host")) {
            ok = !strcmp(rest, "0") || !strcmp(rest, "1");
            if (!ok)
                snprintf(err, n, "%s:%d: host: expected 0 or 1, got \"%.80s\"", path, ln, rest);
            else h->host = rest[0] == '1';
            continue;
        }
        if (!strcmp(key, "op")) {
            char name[64], unit[16];
            double r = 0;
            ok = h->nops < TPK_HW_OPS && sscanf(rest, "%63s %15s %lf", name, unit, &r) == 3 &&
                 r > 0 && strlen(name) < sizeof h->op[0].name &&
                 (!strcmp(unit, "gbs") || !strcmp(unit, "tflops"));
            if (!ok)
                snprintf(err, n,
                         "%s:%d: expected \"op NAME gbs|tflops RATE\" with a rate > 0 (at most %d)",
                         path, ln, TPK_HW_OPS);
            else {
                tpk_hw_op *o = &h->op[h->nops++];
                snprintf(o->name, sizeof o->name, "%.39s", name);
                *(strcmp(unit, "gbs") ? &o->tflops : &o->gbs) = r;
            }
            continue;
        }
        if (k == NKEYS) {
            snprintf(err, n, "%s:%d: unknown key \"%s\"", path, ln, key);
            ok = false;
            break;
        }
        if (k == 0) {
            snprintf(h->name, sizeof h->name, "%.63s", rest);
            continue;
        }
        int want = k == 4 ? TPK_HW_GEMM_N : 1, got = 0;
        const char *c = rest;
        while (got < want) {
            x[got] = strtod(c, &end);
            if (end == c) break;
            got++, c = end;
        }
        ok = got == want && !*(c + strspn(c, " \t"));
        for (int i = 0; ok && i < got; i++) ok = isfinite(x[i]) && x[i] >= 0;
        if (ok && k != 1 && k != 2 && k != 9 && k != 11) /* rates > 0; memory, latency >= 0 */
            for (int i = 0; ok && i < got; i++) ok = x[i] > 0;
        if (ok && k == NKEYS - 1) /* a whole number, range-checked before the conversion */
            ok = x[0] <= 1e6 && x[0] == floor(x[0]);
        if (!ok) {
            snprintf(err, n, "%s:%d: %s: expected %d %s number%s, got \"%.80s\"", path, ln, key,
                     want,
                     k == 2 || k == 9 || k == 11 ? "non-negative"
                     : k == NKEYS - 1            ? "whole (1..1000000)"
                                                 : "positive",
                     want > 1 ? "s" : "", rest);
            break;
        }
        double *dst[NKEYS] = {NULL,
                              &h->mem_gb,
                              &h->reserve_gb,
                              &h->peak_tflops,
                              h->gemm_tflops,
                              &h->attn_tflops,
                              &h->mem_gbs,
                              &h->op_us,
                              &h->intra_gbs,
                              &h->intra_us,
                              &h->inter_gbs,
                              &h->inter_us,
                              NULL};
        if (k == NKEYS - 1) h->gpus_per_node = (int)x[0];
        else memcpy(dst[k], x, sizeof(double) * (size_t)want);
    }
    fclose(f);
    for (int k = 0; ok && k < NKEYS; k++)
        if (!seen[k]) {
            snprintf(err, n, "%s: the profile has no \"%s\" (every key of tpk_hw_write is needed)",
                     path, keys[k]);
            ok = false;
        }
    if (ok && h->mem_gb <= 0) {
        snprintf(err, n, "%s: mem_gb: expected a device memory > 0", path);
        ok = false;
    }
    return ok;
}

#endif /* TPK_HW_H */
