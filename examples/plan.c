/* examples/plan.c — build/plan: which TP x PP x DP, micro-batch, recompute, ZeRO-1 and sequence
 * parallelism to train a model with on a cluster, by a dry run of the kit's own code on every
 * configuration (tpk/plan/plan.h) costed on a hardware profile (tpk/plan/hw.h).
 *
 *   plan [model flags | --load DIR] --seq-len S --batch B --gpus N --gpus-per-node G
 *        --profile h100|h200|a100-40|a100-80|cpu|FILE [--json] [--all] [--top K]
 *        [--tokens N] [--target TOKENS_PER_S] [--tp T --pp P --micro-batch M --recompute R
 *        --zero 0|1 --sequence-parallel 0|1: restrict]
 *   plan --calibrate FILE [model flags] [--seq-len S --batch B]   (under mpirun: collectives too)
 *
 * The table: the fitting configurations fastest first — memory per rank (what the trainer reports
 * as its peak), step time, tokens/s, MFU — then the rejected ones with their reason; then the
 * answers: the largest micro-batch that fits, the time to train --tokens, the GPUs that reach
 * --target tokens/s (nodes doubled from --gpus, the global batch kept). --batch is the global
 * batch in sequences; the trainer's --batch is a DP rank's micro-batch (--micro-batch here). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tpk/tpk.h>
#include <tpk/plan/plan.h>
#include <tpk/runtime/mpi.h>

static const char *usage =
    "usage: plan [--arch gpt2|llama|neox --layers L --hidden H --heads A --vocab V --positions P "
    "(family flags: --kv-heads, --ffn, ...) | --load DIR]\n"
    "            --seq-len 1024 --batch 512 (global, sequences) --gpus 8 --gpus-per-node 8\n"
    "            --profile h100|h200|a100-40|a100-80|cpu|FILE (default h100) --dtype bf16|f32\n"
    "            [--json] [--all] [--top 10] [--tokens N] [--target TOKENS_PER_S]\n"
    "            [--tp T] [--pp P] [--micro-batch M] [--recompute none|selective|full] [--zero "
    "0|1] [--sequence-parallel 0|1]\n"
    "       plan --calibrate FILE [model flags] [--seq-len S] [--batch B]: measure this machine "
    "(the host backend; under mpirun its collectives) into a profile file\n";

typedef struct opts {
    const char *arch, *load, *profile, *dtype, *calibrate, *recompute;
    int64_t layers, hidden, heads, vocab, positions, seq, batch;
    int gpus, gpn, top, tp, pp, mb, zero, sp;
    bool json, all;
    double tokens, target;
    struct {
        const char *flag, *value;
    } fam[16];
    int nfam;
} opts;

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "plan: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 2;
}

static bool num(const char *v, double lo, double hi, double *x) {
    char *end = NULL;
    if (!v) return false;
    *x = strtod(v, &end);
    return end != v && !*end && *x >= lo && *x <= hi;
}

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){.profile = "h100",
                .seq = 1024,
                .batch = 512,
                .gpus = 8,
                .top = 10,
                .tp = 0,
                .zero = -1,
                .sp = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!strcmp(a, "--all")) {
            o->all = true;
            continue;
        }
        const char **str[] = {&o->arch,  &o->load,      &o->profile,
                              &o->dtype, &o->calibrate, &o->recompute};
        const char *sname[] = {"--arch",  "--load",      "--profile",
                               "--dtype", "--calibrate", "--recompute"};
        int k = 0;
        while (k < 6 && strcmp(a, sname[k])) k++;
        if (k < 6) {
            if (!v || !*v) return fail("%s: expects a value%s", a, "");
            *str[k] = v, i++;
            continue;
        }
        struct {
            const char *n;
            double lo, hi;
            int64_t *i64;
            int *i32;
            double *d;
        } nums[] = {{"--layers", 1, 1e6, &o->layers, NULL, NULL},
                    {"--hidden", 1, 1e7, &o->hidden, NULL, NULL},
                    {"--heads", 1, 1e5, &o->heads, NULL, NULL},
                    {"--vocab", 1, 1e8, &o->vocab, NULL, NULL},
                    {"--positions", 1, 1e8, &o->positions, NULL, NULL},
                    {"--seq-len", 1, 1e8, &o->seq, NULL, NULL},
                    {"--batch", 1, 1e9, &o->batch, NULL, NULL},
                    {"--gpus", -1e9, 1e9, NULL, &o->gpus, NULL},
                    {"--gpus-per-node", -1e9, 1e6, NULL, &o->gpn, NULL},
                    {"--top", 0, 1e9, NULL, &o->top, NULL},
                    {"--tp", 1, 1e6, NULL, &o->tp, NULL},
                    {"--pp", 1, 1e6, NULL, &o->pp, NULL},
                    {"--micro-batch", 1, 1e9, NULL, &o->mb, NULL},
                    {"--zero", 0, 1, NULL, &o->zero, NULL},
                    {"--sequence-parallel", 0, 1, NULL, &o->sp, NULL},
                    {"--tokens", 1, 1e20, NULL, NULL, &o->tokens},
                    {"--target", 1, 1e20, NULL, NULL, &o->target}};
        int nn = (int)(sizeof nums / sizeof nums[0]);
        for (k = 0; k < nn && strcmp(a, nums[k].n); k++) {}
        if (k < nn) {
            if (!num(v, nums[k].lo, nums[k].hi, &x) ||
                ((nums[k].i64 || nums[k].i32) && x != floor(x))) {
                char range[64];
                snprintf(range, sizeof range, "[%g, %g]", nums[k].lo, nums[k].hi);
                fprintf(stderr, "plan: %s: expected %s in %s, got \"%s\"\n", a,
                        nums[k].d ? "a number" : "an integer", range, v ? v : "nothing");
                return 2;
            }
            if (nums[k].i64) *nums[k].i64 = (int64_t)x;
            else if (nums[k].i32) *nums[k].i32 = (int)x;
            else *nums[k].d = x;
            i++;
            continue;
        }
        if (tpk_model_flag(TPK_ARCH_COUNT, a)) {
            if (!v || o->nfam == 16) return fail("%s: expects a value%s", a, "");
            o->fam[o->nfam].flag = a, o->fam[o->nfam++].value = v, i++;
            continue;
        }
        return fail("unknown argument \"%s\"%s (--help lists them)", a, "");
    }
    return 0;
}

/* The model config from the flags or --load DIR; false with the message printed. */
static bool model_config(tpk_ctx *ctx, const opts *o, tpk_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = TPK_ARCH_GPT2;
    if (o->arch && !tpk_arch_from_name(o->arch, false, &cfg->arch)) {
        fprintf(stderr, "plan: --arch %s: expected gpt2, llama or neox\n", o->arch);
        return false;
    }
    if (o->load && tpk_model_config_read(ctx, o->load, cfg) != TPK_OK) {
        fprintf(stderr, "plan: --load %s: %s\n", o->load, tpk_last_error(ctx));
        return false;
    }
    int64_t *sh[5];
    tpk_model_config_common(cfg, sh, 0, false, TPK_RECOMPUTE_NONE);
    if (!o->load) {
        *sh[0] = o->vocab ? o->vocab : 50257, *sh[2] = o->layers ? o->layers : 12;
        *sh[3] = o->hidden ? o->hidden : 768, *sh[4] = o->heads ? o->heads : 12;
    }
    if (!*sh[1] || o->positions) *sh[1] = o->positions ? o->positions : o->seq;
    if (o->seq > *sh[1]) {
        fprintf(stderr, "plan: --seq-len %lld is longer than the model's %lld positions\n",
                (long long)o->seq, (long long)*sh[1]);
        return false;
    }
    for (int k = 0; k < o->nfam; k++) {
        const tpk_lm_flag *f = tpk_model_flag(cfg->arch, o->fam[k].flag);
        double x = 0;
        if (!f) {
            fprintf(stderr, "plan: %s: not a flag of --arch %s\n", o->fam[k].flag,
                    tpk_arch_name(cfg->arch));
            return false;
        }
        if (!num(o->fam[k].value, f->lo, f->hi, &x) || (f->is_int && x != floor(x))) {
            fprintf(stderr, "plan: %s: expected %s in [%g, %g], got \"%s\"\n", o->fam[k].flag,
                    f->is_int ? "an integer" : "a number", f->lo, f->hi, o->fam[k].value);
            return false;
        }
        void *field = (char *)tpk__model_cfg(cfg) + f->off;
        if (f->is_int) *(int64_t *)field = (int64_t)x;
        else *(float *)field = (float)x;
    }
    return true;
}

static double now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- --calibrate ----------------------------------------------------------------------------- */

/* Seconds per call of fn(arg), the best of a few rounds of about 0.05 s. */
#define TIME_CALLS(sec, call)                                         \
    do {                                                              \
        double best = 1e30;                                           \
        for (int round = 0; round < 3; round++) {                     \
            int reps = 0;                                             \
            double t0 = now(), t1 = t0;                               \
            while (t1 - t0 < 0.05 || reps < 2) {                      \
                if ((call) != TPK_OK) return 1;                       \
                reps++, t1 = now();                                   \
            }                                                         \
            best = (t1 - t0) / reps < best ? (t1 - t0) / reps : best; \
        }                                                             \
        sec = best;                                                   \
    } while (0)

static int calibrate(const opts *o, tpk_comm *world, int rank, int size) {
    tpk_ctx ctx;
    tpk_hw h;
    tpk_hw_builtin("cpu", &h);
    snprintf(h.name, sizeof h.name, "calibrated");
    if (tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = tpk_ops_host(), .seed = 1}) != TPK_OK)
        return fprintf(stderr, "plan: %s\n", tpk_last_error(&ctx)), 1;
    /* GEMMs by size class: square n^3 with 2 n^3 near 3 x 10^(6 + k) flops (the largest two
       classes measured at 3e10: a CPU core takes seconds beyond) */
    double best = 0;
    for (int k = 0; k < TPK_HW_GEMM_N; k++) {
        double f = 3 * pow(10, 6 + (k < 4 ? k : 4)), sec = 0;
        int64_t n = (int64_t)cbrt(f / 2);
        void *a = NULL, *b = NULL, *c = NULL;
        size_t bytes = sizeof(float) * (size_t)(n * n);
        if (tpk_op_alloc(&ctx, bytes, &a) || tpk_op_alloc(&ctx, bytes, &b) ||
            tpk_op_alloc(&ctx, bytes, &c))
            return fprintf(stderr, "plan: %s\n", tpk_last_error(&ctx)), 1;
        tpk_op_fill(&ctx, a, TPK_F32, (size_t)(n * n), 0.5f);
        tpk_op_fill(&ctx, b, TPK_F32, (size_t)(n * n), 0.25f);
        TIME_CALLS(sec,
                   tpk_op_gemm(&ctx, false, true, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, TPK_F32));
        h.gemm_tflops[k] = 2.0 * (double)(n * n * n) / sec * 1e-12;
        best = h.gemm_tflops[k] > best ? h.gemm_tflops[k] : best;
        tpk_op_free(&ctx, a), tpk_op_free(&ctx, b), tpk_op_free(&ctx, c);
    }
    h.peak_tflops = best;
    { /* memory-bound: y = a x + b y over 64 MB; the fixed cost: a one-element op */
        size_t n = 1 << 24;
        void *x = NULL, *y = NULL;
        double sec = 0;
        if (tpk_op_alloc(&ctx, 4 * n, &x) || tpk_op_alloc(&ctx, 4 * n, &y))
            return fprintf(stderr, "plan: %s\n", tpk_last_error(&ctx)), 1;
        TIME_CALLS(sec, tpk_op_axpby(&ctx, y, 0.5f, x, 0.5f, TPK_F32, n));
        h.mem_gbs = 12.0 * (double)n / sec * 1e-9;
        TIME_CALLS(sec, tpk_op_fill(&ctx, y, TPK_F32, 1, 1.0f));
        h.op_us = sec * 1e6;
        tpk_op_free(&ctx, x), tpk_op_free(&ctx, y);
    }
    { /* each op's rate in real steps of every family at the shape given (one rank, f32), by
         the profiler: the ops of GPT-2, Llama and GPT-NeoX all measured */
        int64_t B = o->mb ? o->mb : 4, S = o->seq;
        int32_t *ids = (int32_t *)calloc((size_t)(B * S), sizeof(int32_t));
        for (int64_t i = 0; ids && i < B * S; i++) ids[i] = (int32_t)((i * 7919) % 97);
        if (!ids) return 1;
        for (int a = 0; a < TPK_ARCH_COUNT; a++) {
            opts fo = *o;
            tpk_model_config cfg;
            tpk_model m;
            tpk_adamw opt = {0};
            tpk_dp_buckets b = {0};
            fo.arch = tpk_arch_name((tpk_arch)a), fo.load = NULL;
            if (o->arch && strcmp(o->arch, fo.arch)) fo.nfam = 0; /* its flags: its family's */
            if (!o->arch && a != TPK_ARCH_GPT2) fo.nfam = 0;
            if (!model_config(&ctx, &fo, &cfg)) return 1;
            if (tpk_model_init(&ctx, &m, &cfg) ||
                tpk_adamw_init(&ctx, &opt,
                               &(tpk_adamw_desc){.b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f}))
                return fprintf(stderr, "plan: --calibrate: %s\n", tpk_last_error(&ctx)), 1;
            tpk_model_set_grad_ready(&m, tpk_dp_grad_ready, &b);
            for (int step = 0; step < 4; step++) {
                if (step == 1 && tpk_profile_start(&ctx)) return 1; /* after a warm-up step */
                if (tpk_model_train_step(&ctx, &m, NULL, &opt, &b, ids, ids, B, S, 1, 1.0f,
                                         (uint64_t)step, 1e-4f, 1.0f, NULL) ||
                    (ctx.prof && tpk_profile_step(&ctx)))
                    return fprintf(stderr, "plan: --calibrate: %s\n", tpk_last_error(&ctx)), 1;
            }
            tpk_model_destroy(&ctx, &m), tpk_adamw_destroy(&ctx, &opt), tpk_dp_destroy(&b);
        }
        free(ids);
        tpk_profile *p = ctx.prof;
        for (int r = 0; r < p->nrows && h.nops < TPK_HW_OPS; r++) {
            const tpk__prof_row *row = &p->rows[r];
            if (row->ms <= 0 || strchr(row->name, '.') || strchr(row->name, ' ') ||
                !strcmp(row->name, "gemm") || !strcmp(row->name, "gemm_acc") ||
                strlen(row->name) >= sizeof h.op[0].name)
                continue; /* plain GEMMs by class; collectives apart */
            tpk_hw_op *q = &h.op[h.nops];
            snprintf(q->name, sizeof q->name, "%s", row->name);
            /* the rate net of the fixed cost each call pays */
            double sec = row->ms * 1e-3 - (double)row->calls * h.op_us * 1e-6;
            if (sec <= row->ms * 1e-4) sec = row->ms * 1e-4;
            if (row->flops > 0) q->tflops = row->flops / sec * 1e-12;
            else if (row->bytes > 0) q->gbs = row->bytes / sec * 1e-9;
            else continue;
            h.nops++;
        }
        const tpk_hw_op *af = tpk__hw_find(&h, "attn_fwd");
        if (af) h.attn_tflops = af->tflops;
    }
    tpk_ctx_destroy(&ctx);
    /* collectives: all-reduce over the world at 4 KB .. 16 MB, t = a + b S fitted:
       ring: a = 2 (n - 1) alpha, b = 2 (n - 1) / n / bandwidth */
    if (size > 1) {
        tpk_ctx c2;
        if (tpk_ctx_init(&c2, &(tpk_ctx_desc){.ops = tpk_ops_host(), .world = world}) != TPK_OK)
            return fprintf(stderr, "plan: %s\n", tpk_last_error(&c2)), 1;
        double t[8] = {0}, sz[8] = {0};
        int np = 0;
        for (size_t bytes = 4096; bytes <= (16u << 20) && np < 8; bytes *= 4) {
            float *buf = (float *)calloc(bytes / 4, sizeof(float));
            double sec = 0;
            if (!buf) return 1;
            /* the same number of calls on every rank (a collective): 20, 5 past 1 MB */
            int reps = bytes > (1u << 20) ? 5 : 20;
            for (int r = 0; r <= reps; r++) { /* the first a warm-up */
                double t0 = now();
                if (tpk_allreduce(&c2, world, buf, buf, bytes / 4, TPK_F32, TPK_SUM) != TPK_OK)
                    return fprintf(stderr, "plan: %s\n", tpk_last_error(&c2)), 1;
                if (r) sec += (now() - t0) / reps;
            }
            /* every rank the slowest's time: they leave together */
            tpk_allreduce_host(&c2, world, &sec, 1, TPK_F64, TPK_MAX);
            free(buf);
            t[np] = sec, sz[np++] = (double)bytes;
        }
        /* ring: t = 2 (n - 1) alpha + 2 (n - 1) / n S / bandwidth: the bandwidth from the two
           largest sizes' slope, alpha from the smallest size's time less its bytes' */
        double f = 2.0 * (size - 1) / size,
               slope = (t[np - 1] - t[np - 2]) / (sz[np - 1] - sz[np - 2]);
        if (slope > 0) h.intra_gbs = f / slope * 1e-9;
        double lat = t[0] - f * sz[0] / (h.intra_gbs * 1e9);
        h.intra_us = lat > 0 ? lat / (2.0 * (size - 1)) * 1e6 : 0;
        h.inter_us = h.intra_us, h.inter_gbs = h.intra_gbs;
        tpk_ctx_destroy(&c2);
    }
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    h.mem_gb = pages > 0 && psize > 0 ? (double)pages * (double)psize / 1e9 / size : 16;
    h.gpus_per_node = size, h.reserve_gb = 0, h.host = 1;
    snprintf(h.source, sizeof h.source,
             "measured by plan --calibrate on %d rank%s: host backend GEMMs by class, op rates "
             "of a step of the given model, all-reduce %s",
             size, size > 1 ? "s" : "", size > 1 ? "4 KB..16 MB" : "not measured (one rank)");
    if (rank == 0) {
        FILE *f = fopen(o->calibrate, "w");
        bool ok = f && tpk_hw_write(&h, f);
        if (f && fclose(f)) ok = false;
        if (!ok) return fail("--calibrate %s: cannot write the profile%s", o->calibrate, ""), 1;
        printf("calibrated: GEMM %.1f-%.1f GFLOP/s, memory-bound %.2f GB/s, %.2f us an op, %d "
               "op rates, all-reduce %.2f GB/s %.1f us -> %s\n",
               h.gemm_tflops[0] * 1e3, best * 1e3, h.mem_gbs, h.op_us, h.nops, h.intra_gbs,
               h.intra_us, o->calibrate);
    }
    return 0;
}

/* ---- the plan ------------------------------------------------------------------------------ */

static void print_row(int i, const tpk_plan_cfg *p) {
    char mesh[48];
    snprintf(mesh, sizeof mesh, "%dx%dx%d", p->tp, p->pp, p->dp);
    if (p->fits)
        printf("%4d  %-11s %5d %5d  %-9s %4d %3s %9.2f %10.4f %12.0f %6.1f%% %6.1f%%\n", i, mesh,
               p->micro_batch, p->accum, tpk_recompute_name(p->recompute), p->zero,
               p->sp ? "on" : "off", p->peak_bytes / 1e9, p->step_seconds, p->tokens_per_s,
               100 * p->mfu, 100 * p->bubble);
    else
        printf("   -  %-11s %5d %5d  %-9s %4d %3s  rejected: %s\n", mesh, p->micro_batch, p->accum,
               tpk_recompute_name(p->recompute), p->zero, p->sp ? "on" : "off", p->reason);
}

static void duration(double s, char *buf, size_t n) {
    if (s < 3600) snprintf(buf, n, "%.1f minutes", s / 60);
    else if (s < 86400 * 2) snprintf(buf, n, "%.1f hours", s / 3600);
    else snprintf(buf, n, "%.1f days", s / 86400);
}

int main(int argc, char **argv) {
    opts o;
    int pr = parse(argc, argv, &o);
    if (pr < 0) return fputs(usage, stdout), 0;
    if (pr) return pr;
    if (o.calibrate) { /* under mpirun: the world's collectives too */
        MPI_Init(&argc, &argv);
        int rank = 0, size = 1, rc;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank), MPI_Comm_size(MPI_COMM_WORLD, &size);
        tpk_ctx e = {0};
        tpk_comm world = {0};
        if (tpk_comm_mpi(&e, MPI_COMM_WORLD, &world) != TPK_OK)
            return fprintf(stderr, "plan: %s\n", tpk_last_error(&e)), MPI_Finalize(), 1;
        rc = calibrate(&o, &world, rank, size);
        tpk_comm_destroy(&world);
        MPI_Finalize();
        return rc;
    }
    tpk_ctx err = {0};
    tpk_hw hw;
    char msg[512];
    if (!tpk_hw_builtin(o.profile, &hw) && !tpk_hw_read(o.profile, &hw, msg, sizeof msg)) {
        if (access(o.profile, F_OK) != 0 && !strchr(o.profile, '/'))
            fprintf(stderr, "plan: --profile %s: not a built-in profile (%s) nor a file\n",
                    o.profile, tpk_hw_builtin_names());
        else fprintf(stderr, "plan: --profile: %s\n", msg);
        return 2;
    }
    if (o.gpus < 1)
        return fprintf(stderr, "plan: --gpus %d: expected at least 1 GPU (rank)\n", o.gpus), 2;
    int gpn = o.gpn ? o.gpn : hw.gpus_per_node;
    if (gpn < 1) return fprintf(stderr, "plan: --gpus-per-node %d: expected at least 1\n", gpn), 2;
    if (gpn > o.gpus) gpn = o.gpus;
    if (o.gpus % gpn)
        return fprintf(stderr,
                       "plan: --gpus %d is not a whole number of nodes of --gpus-per-node %d\n",
                       o.gpus, gpn),
               2;
    tpk_recompute rc = TPK_RECOMPUTE_NONE;
    if (o.recompute && !tpk_recompute_parse(o.recompute, &rc))
        return fail("--recompute %s: expected none, selective or full%s", o.recompute, ""), 2;
    if (o.dtype && strcmp(o.dtype, "bf16") && strcmp(o.dtype, "f32"))
        return fail("--dtype %s: expected bf16 or f32%s", o.dtype, ""), 2;
    tpk_plan_desc d;
    memset(&d, 0, sizeof d);
    if (!model_config(&err, &o, &d.model)) return 2;
    d.seq = o.seq, d.batch = o.batch, d.gpus = o.gpus, d.gpus_per_node = gpn, d.hw = &hw;
    d.like = hw.host ? tpk_ops_host() : NULL;
    d.dtype = o.dtype   ? (strcmp(o.dtype, "bf16") ? TPK_F32 : TPK_BF16)
              : hw.host ? TPK_F32
                        : TPK_BF16;
    d.tp = o.tp, d.pp = o.pp, d.micro_batch = o.mb, d.zero = o.zero, d.sp = o.sp;
    d.recompute = o.recompute ? (int)rc : -1;
    tpk_plan_cfg *v = NULL;
    int n = 0;
    double t0 = now();
    if (tpk_plan(&err, &d, &v, &n) != TPK_OK)
        return fprintf(stderr, "plan: %s\n", tpk_last_error(&err)), 1;
    int fit = 0;
    for (int i = 0; i < n; i++) fit += v[i].fits;
    if (o.json) {
        printf("[\n");
        for (int i = 0; i < n; i++) {
            printf("  ");
            tpk_plan_json(&v[i], stdout);
            printf("%s\n", i + 1 < n ? "," : "");
        }
        printf("]\n");
        free(v);
        return fit ? 0 : 3;
    }
    int64_t *sh[5];
    tpk_model_config mc = d.model;
    tpk_model_config_common(&mc, sh, 0, false, TPK_RECOMPUTE_NONE);
    double params = 0;
    tpk_plan_model_params(&err, &d, &params);
    printf("plan: %s L=%lld H=%lld A=%lld V=%lld, %.1fM parameters | S=%lld, global batch %lld "
           "sequences (%.0f tokens) | %d GPUs = %d node%s x %d | %s %s\n",
           tpk__model_family(d.model.arch)->title, (long long)*sh[2], (long long)*sh[3],
           (long long)*sh[4], (long long)*sh[0], params / 1e6, (long long)d.seq, (long long)d.batch,
           (double)d.batch * d.seq, d.gpus, d.gpus / gpn, d.gpus / gpn == 1 ? "" : "s", gpn,
           hw.name, d.dtype == TPK_BF16 ? "bf16" : "f32");
    printf("profile: %s\n", hw.source);
    printf("%d configurations, %d fit (dry runs in %.1f s)\n", n, fit, now() - t0);
    printf("rank  TPxPPxDP       mb     M  recompute ZeRO  SP   GB/rank     s/step     tokens/s "
           "   MFU  bubble\n");
    int shown = 0;
    for (int i = 0; i < n && (o.all || shown < o.top || !v[i].fits); i++) {
        if (!v[i].fits && !o.all && i >= fit) break;
        print_row(i + 1, &v[i]), shown++;
    }
    if (!o.all && n > fit) { /* the rejected: one of each reason's kind */
        int printed = 0;
        for (int i = fit; i < n && printed < 5; i++) {
            bool dup = false;
            for (int j = fit; j < i && !dup; j++) dup = !strncmp(v[j].reason, v[i].reason, 16);
            if (!dup) print_row(0, &v[i]), printed++;
        }
        printf("      (%d rejected; --all lists them)\n", n - fit);
    }
    if (!fit) {
        double least = 0; /* the smallest peak a dry run found */
        for (int i = 0; i < n; i++)
            if (v[i].peak_bytes > 0 && (least == 0 || v[i].peak_bytes < least))
                least = v[i].peak_bytes;
        if (least > 0)
            printf("nothing fits: the smallest peak is %.2f GB a rank (+ %.1f GB reserved) on "
                   "%.0f GB devices; add GPUs, or allow recompute, ZeRO-1 or pipeline stages\n",
                   least / 1e9, hw.reserve_gb, hw.mem_gb);
        else printf("nothing fits: no configuration passes (the reasons above)\n");
        free(v);
        return 3;
    }
    const tpk_plan_cfg *b = &v[0];
    int mbmax = 0;
    for (int i = 0; i < fit; i++) mbmax = v[i].micro_batch > mbmax ? v[i].micro_batch : mbmax;
    printf("best: TP %d x PP %d x DP %d, micro-batch %d (%d a step per DP rank), recompute %s, "
           "ZeRO-1 %s, SP %s: %.3f s a step, %.0f tokens/s, MFU %.1f%%, %.2f GB a rank\n",
           b->tp, b->pp, b->dp, b->micro_batch, b->accum, tpk_recompute_name(b->recompute),
           b->zero ? "on" : "off", b->sp ? "on" : "off", b->step_seconds, b->tokens_per_s,
           100 * b->mfu, b->peak_bytes / 1e9);
    printf("its %.2f GB a GPU: weights %.2f (f32 and bf16), gradients %.2f, AdamW's moments %.2f, "
           "activations and scratch %.2f\n",
           b->peak_bytes / 1e9, b->weights_bytes / 1e9, b->grads_bytes / 1e9, b->optim_bytes / 1e9,
           b->activ_bytes / 1e9);
    printf("largest micro-batch that fits: %d\n", mbmax);
    if (o.tokens > 0) {
        char t[64];
        duration(o.tokens / b->tokens_per_s, t, sizeof t);
        printf("time to train %.3g tokens: %s\n", o.tokens, t);
    }
    if (o.target > 0) { /* nodes doubled until the best reaches the target */
        int g = o.gpus;
        double best = b->tokens_per_s;
        while (best < o.target && g < (1 << 16)) {
            double before = best;
            g *= 2;
            tpk_plan_desc d2 = d;
            d2.gpus = g;
            tpk_plan_cfg *w = NULL;
            int m = 0;
            if (tpk_plan(&err, &d2, &w, &m) != TPK_OK)
                return fprintf(stderr, "plan: %s\n", tpk_last_error(&err)), 1;
            best = m && w[0].fits ? w[0].tokens_per_s : 0;
            free(w);
            if (best == 0 && before > 0) break; /* past what the global batch can use */
        }
        if (best >= o.target)
            printf("GPUs for %.0f tokens/s: %d (%.0f tokens/s; global batch %lld kept)\n", o.target,
                   g, best, (long long)d.batch);
        else
            printf("GPUs for %.0f tokens/s: not reached up to %d GPUs with a global batch of "
                   "%lld\n",
                   o.target, g, (long long)d.batch);
    }
    free(v);
    return 0;
}
