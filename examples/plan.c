/* examples/plan.c — build/plan: which TP x CP x PP x DP (x EP of the DP ranks, a Mixtral's),
 * micro-batch, recompute, ZeRO stage and sequence parallelism to train a model with on a cluster,
 * by a dry run of the kit's own code on every configuration (tpk/plan/plan.h) costed on a hardware
 * profile (tpk/plan/hw.h).
 *
 * The model's flags (--arch, the shape, a family's, --load) and --dtype are the trainer's table
 * (tpk/train/options.h: the same ranges and messages); the planner's own are a table here.
 *   plan [model flags | --load DIR] --seq-len S --batch B --gpus N --gpus-per-node G
 *        --profile h100|h200|a100-40|a100-80|cpu|FILE [--json] [--all] [--top K]
 *        [--tokens N] [--target TOKENS_PER_S] [--tp T --cp C --cp-comm p2p|allgather --pp P
 *        --micro-batch M --recompute R --zero 0|1|2|3 --sequence-parallel 0|1 --ep E: restrict]
 *   plan --calibrate FILE [model flags] [--seq-len S --batch B]   (under mpirun: collectives too)
 *
 * The table: the fitting configurations fastest first — memory per rank (what the trainer reports
 * as its peak), step time, tokens/s, MFU — then the rejected ones with their reason; then the
 * answers: the largest micro-batch that fits, the time to train --tokens, the GPUs that reach
 * --target tokens/s (nodes doubled from --gpus, the global batch kept). --batch is the global
 * batch in sequences; the trainer's --batch is a DP rank's micro-batch (--micro-batch here).
 * A Mixtral is planned under a stated assumption, printed: a balanced router (tpk/plan/plan.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tpk/tpk.h>
#include <tpk/plan/plan.h>
#include <tpk/runtime/mpi.h>
#include <tpk/train/options.h>

/* The planner's own flags; the model's (--arch, the shape, a family's flags, --load) and --dtype
 * are the trainer's table (tpk/train/options.h): the same ranges and messages. */
typedef struct opts {
    const char *profile, *calibrate, *recompute, *cp_comm;
    int64_t seq, batch, gpus, gpn, top, tp, pp, mb, zero, sp, cp, ep; /* -1: not given */
    int64_t zero_shard;                                               /* 0: not given */
    bool json, all;
    double tokens, target;
    tpk_run_opts model;
} opts;

static const tpk_flag plan_flags[] = {
    {"--seq-len", TPK_FLAG_INT, 1, 1e9, "1024", NULL, NULL, 1, "plan", NULL, offsetof(opts, seq)},
    {"--batch", TPK_FLAG_INT, 1, 1e9, "512", NULL, NULL, 1, "plan", "global, sequences",
     offsetof(opts, batch)},
    {"--gpus", TPK_FLAG_INT, 0, 1e6, "8", NULL, NULL, 1, "plan", NULL, offsetof(opts, gpus)},
    {"--gpus-per-node", TPK_FLAG_INT, 0, 1e6, NULL, "G", NULL, 1, "plan", "default: the profile's",
     offsetof(opts, gpn)},
    {"--profile", TPK_FLAG_STR, 0, 0, "h100", NULL, NULL, 1, "plan",
     "h100|h200|a100-40|a100-80|cpu|FILE", offsetof(opts, profile)},
    {"--json", TPK_FLAG_BOOL, 0, 0, NULL, NULL, NULL, 1, "output", NULL, offsetof(opts, json)},
    {"--all", TPK_FLAG_BOOL, 0, 0, NULL, NULL, NULL, 1, "output", NULL, offsetof(opts, all)},
    {"--top", TPK_FLAG_INT, 0, 1e9, "10", NULL, NULL, 1, "output", NULL, offsetof(opts, top)},
    {"--tokens", TPK_FLAG_NUM, 1, 1e20, NULL, "N", NULL, 1, "output", "the time to train them",
     offsetof(opts, tokens)},
    {"--target", TPK_FLAG_NUM, 1, 1e20, NULL, "TOKENS_PER_S", NULL, 1, "output",
     "the GPUs that reach it", offsetof(opts, target)},
    {"--tp", TPK_FLAG_INT, 1, 1e6, NULL, "T", NULL, 1, "restrict", NULL, offsetof(opts, tp)},
    {"--cp", TPK_FLAG_INT, 1, 1e6, NULL, "C", NULL, 1, "restrict",
     "context parallelism's size (every size dividing the ranks unless given)", offsetof(opts, cp)},
    {"--cp-comm", TPK_FLAG_CHOICE, 0, 0, NULL, "p2p|allgather", NULL, 1, "restrict",
     "the attention's mode under CP (both unless given)", offsetof(opts, cp_comm)},
    {"--pp", TPK_FLAG_INT, 1, 1e6, NULL, "P", NULL, 1, "restrict", NULL, offsetof(opts, pp)},
    {"--micro-batch", TPK_FLAG_INT, 1, 1e9, NULL, "M", NULL, 1, "restrict", NULL,
     offsetof(opts, mb)},
    {"--recompute", TPK_FLAG_CHOICE, 0, 0, NULL, "none|selective|full", NULL, 1, "restrict", NULL,
     offsetof(opts, recompute)},
    {"--zero", TPK_FLAG_INT, 0, 3, NULL, "0|1|2|3", "0, 1, 2 or 3", 1, "restrict", NULL,
     offsetof(opts, zero)},
    {"--zero-shard-size", TPK_FLAG_INT, 1, 1e6, NULL, "S", NULL, 1, "restrict",
     "HSDP's shard size under ZeRO 1-3 (DP x CP ranks; both none and a node's unless given)",
     offsetof(opts, zero_shard)},
    {"--sequence-parallel", TPK_FLAG_INT, 0, 1, NULL, "0|1", "0 or 1", 1, "restrict", NULL,
     offsetof(opts, sp)},
    {"--ep", TPK_FLAG_INT, 1, 1e6, NULL, "E", NULL, 1, "restrict",
     "expert parallelism's size, a Mixtral's or Qwen2-MoE's (every size dividing DP and the "
     "experts unless given)",
     offsetof(opts, ep)},
    {"--calibrate", TPK_FLAG_STR, 0, 0, NULL, "FILE", NULL, 1, "calibrate",
     "measure this machine (the host backend; under mpirun its collectives) into a profile file; "
     "with the model flags, --seq-len and --micro-batch",
     offsetof(opts, calibrate)},
};

/* The flag sets: the planner's and the trainer's model flags and --dtype. */
static void flag_sets(opts *o, tpk_flag_set sets[2]) {
    int nt = 0;
    const tpk_flag *t = tpk_run_flags(&nt);
    sets[0] = (tpk_flag_set){t, nt, TPK_OPT_MODEL | TPK_OPT_DTYPE, &o->model};
    sets[1] = (tpk_flag_set){plan_flags, (int)(sizeof plan_flags / sizeof plan_flags[0]), 1, o};
}

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "plan: error: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 2;
}

/* The flags into o: 0, -1 for --help, or 2 with the error printed. */
static int parse(int argc, char **argv, opts *o) {
    tpk_flag_set sets[2];
    char err[512];
    flag_sets(o, sets);
    int r = tpk_flags_parse(sets, 2, argc, argv, NULL, NULL, err, sizeof err);
    if (r > 0) return fprintf(stderr, "plan: error: %s\n", err), 2;
    if (o->mb < 0) o->mb = 0;
    if (o->tp < 0) o->tp = 0;
    if (o->pp < 0) o->pp = 0;
    if (o->gpn < 0) o->gpn = 0;
    if (o->tokens < 0) o->tokens = 0;
    if (o->target < 0) o->target = 0;
    o->model.seq = o->seq; /* the model's positions: --positions, else --seq-len */
    return r;
}

/* The model config from the flags or --load DIR (GPT-2 small unless given); false with the
 * message printed. */
static bool model_config(tpk_ctx *ctx, const opts *o, tpk_model_config *cfg) {
    char err[512];
    int64_t def[4] = {50257, 12, 768, 12}, S = 0;
    if (tpk_run_model_config(ctx, &o->model, def, o->seq, cfg, &S, err, sizeof err) == TPK_OK)
        return true;
    fprintf(stderr, "plan: error: %s\n", err);
    return false;
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
        return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&ctx)), 1;
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
            return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&ctx)), 1;
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
            return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&ctx)), 1;
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
        /* each family in a context of its own (a context keeps what was registered in it: the
           data-parallel check asks for every parameter), the one profile carried from one to
           the next */
        tpk_profile *prof = NULL;
        for (int a = 0; a < TPK_ARCH_COUNT; a++) {
            if (a == TPK_ARCH_CUSTOM) continue;              /* a program's own model */
            if (tpk_arch_has_experts((tpk_arch)a)) continue; /* Llama's ops, the dispatcher's */
            opts fo = *o;
            tpk_model_config cfg;
            tpk_model m;
            tpk_adamw opt = {0};
            tpk_dp_buckets b = {0};
            tpk_ctx fc;
            const char *arch = o->model.arch;
            fo.model.arch = tpk_arch_name((tpk_arch)a), fo.model.load = NULL;
            if (arch && strcmp(arch, fo.model.arch)) fo.model.fam.n = 0; /* its family's flags */
            if (!arch && a != TPK_ARCH_GPT2) fo.model.fam.n = 0;
            if (tpk_ctx_init(&fc, &(tpk_ctx_desc){.ops = tpk_ops_host(), .seed = 1}) != TPK_OK)
                return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&fc)), 1;
            fc.prof = prof;
            if (!model_config(&fc, &fo, &cfg)) return 1;
            if (tpk_model_init(&fc, &m, &cfg) ||
                tpk_adamw_init(&fc, &opt, &(tpk_adamw_desc){.b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f}))
                return fprintf(stderr, "plan: error: --calibrate: %s\n", tpk_last_error(&fc)), 1;
            tpk_model_set_grad_ready(&m, tpk_dp_grad_ready, &b);
            for (int step = 0; step < 4; step++) {
                if (step == 1 && tpk_profile_start(&fc)) return 1; /* after a warm-up step */
                if (tpk_model_train_step(&fc, &m, NULL, &opt, &b, ids, ids, B, S, 1, 1.0f,
                                         (uint64_t)step, 1e-4f, 1.0f, NULL) ||
                    (fc.prof && tpk_profile_step(&fc)))
                    return fprintf(stderr, "plan: error: --calibrate: %s\n", tpk_last_error(&fc)),
                           1;
            }
            tpk_model_destroy(&fc, &m), tpk_adamw_destroy(&fc, &opt), tpk_dp_destroy(&b);
            prof = fc.prof, fc.prof = NULL; /* to the next family's context, then ctx's */
            tpk_ctx_destroy(&fc);
        }
        ctx.prof = prof;
        free(ids);
        tpk_profile *p = ctx.prof;
        for (int r = 0; r < p->nrows && h.nops < TPK_HW_OPS; r++) {
            const char *name = p->rows[r].name;
            double ms = p->rows[r].ms, flops = p->rows[r].flops, bytes = p->rows[r].bytes;
            if (ms <= 0 || strchr(name, '.') || strchr(name, ' ') || !strcmp(name, "gemm") ||
                !strcmp(name, "gemm_acc") || strlen(name) >= sizeof h.op[0].name)
                continue; /* plain GEMMs by class; collectives apart */
            tpk_hw_op *q = &h.op[h.nops];
            snprintf(q->name, sizeof q->name, "%s", name);
            /* the rate net of the fixed cost each call pays */
            double sec = ms * 1e-3 - (double)p->rows[r].calls * h.op_us * 1e-6;
            if (sec <= ms * 1e-4) sec = ms * 1e-4;
            if (flops > 0) q->tflops = flops / sec * 1e-12;
            else if (bytes > 0) q->gbs = bytes / sec * 1e-9;
            else continue;
            h.nops++;
        }
        const tpk_hw_op *af = NULL;
        for (int i = 0; i < h.nops && !af; i++)
            af = strcmp(h.op[i].name, "attn_fwd") ? NULL : &h.op[i];
        if (af) h.attn_tflops = af->tflops;
    }
    tpk_ctx_destroy(&ctx);
    /* collectives: all-reduce over the world at 4 KB .. 16 MB, t = a + b S fitted:
       ring: a = 2 (n - 1) alpha, b = 2 (n - 1) / n / bandwidth */
    if (size > 1) {
        tpk_ctx c2;
        if (tpk_ctx_init(&c2, &(tpk_ctx_desc){.ops = tpk_ops_host(), .world = world}) != TPK_OK)
            return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&c2)), 1;
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
                    return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&c2)), 1;
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
    char mesh[96];
    char ep[32] = "";
    if (p->ep > 1) snprintf(ep, sizeof ep, "e%d", p->ep); /* EP e of the DP ranks */
    if (p->zero_shard > 0) /* HSDP: ZeRO in shards of S DP x CP ranks */
        snprintf(ep + strlen(ep), sizeof ep - strlen(ep), "h%d", p->zero_shard);
    snprintf(mesh, sizeof mesh, "%dx%d%sx%dx%d%s", p->tp, tpk_plan_cp(p),
             p->cp > 1 ? (p->cp_comm == TPK_CP_ALLGATHER ? "ag" : "r") : "", p->pp, p->dp, ep);
    if (p->fits)
        printf("%4d  %-13s %5d %5d  %-9s %4d %3s %9.2f %10.4f %12.0f %6.1f%% %6.1f%%\n", i, mesh,
               p->micro_batch, p->accum, tpk_recompute_name(p->recompute), p->zero,
               p->sp ? "on" : "off", p->peak_bytes / 1e9, p->step_seconds, p->tokens_per_s,
               100 * p->mfu, 100 * p->bubble);
    else
        printf("   -  %-13s %5d %5d  %-9s %4d %3s  rejected: %s\n", mesh, p->micro_batch, p->accum,
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
    if (pr < 0) {
        tpk_flag_set sets[2];
        flag_sets(&o, sets);
        tpk_flags_usage(
            stdout,
            "usage: plan [model flags | --load DIR] [plan flags]: the fastest TP x CP x PP x DP, "
            "micro-batch,\n  recompute, ZeRO stage and SP that fit; a GPT-2 small (--layers 12 "
            "--hidden 768 --heads 12\n  --vocab 50257) unless given\n"
            "       plan --calibrate FILE [model flags] [--seq-len S] [--micro-batch M]\n",
            sets, 2);
        return 0;
    }
    if (pr) return pr;
    if (o.calibrate) { /* under mpirun: the world's collectives too */
        MPI_Init(&argc, &argv);
        int rank = 0, size = 1, rc;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank), MPI_Comm_size(MPI_COMM_WORLD, &size);
        tpk_ctx e = {0};
        tpk_comm world = {0};
        if (tpk_comm_mpi(&e, MPI_COMM_WORLD, &world) != TPK_OK)
            return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&e)), MPI_Finalize(), 1;
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
            fprintf(stderr, "plan: error: --profile %s: not a built-in profile (%s) nor a file\n",
                    o.profile, tpk_hw_builtin_names());
        else fprintf(stderr, "plan: error: --profile: %s\n", msg);
        return 2;
    }
    if (o.gpus < 1)
        return fprintf(stderr, "plan: error: --gpus: expected at least 1 GPU (rank), got %d\n",
                       (int)o.gpus),
               2;
    int gpn = o.gpn ? (int)o.gpn : hw.gpus_per_node;
    if (gpn < 1)
        return fprintf(stderr, "plan: error: --gpus-per-node: expected at least 1, got %d\n", gpn),
               2;
    if (gpn > o.gpus) gpn = (int)o.gpus;
    if (o.gpus % gpn)
        return fprintf(stderr,
                       "plan: error: --gpus: expected a whole number of nodes of --gpus-per-node "
                       "%d GPUs, got %d\n",
                       gpn, (int)o.gpus),
               2;
    tpk_recompute rc = TPK_RECOMPUTE_NONE;
    if (o.recompute) tpk_recompute_parse(o.recompute, &rc); /* one of them (the table's) */
    tpk_plan_desc d;
    memset(&d, 0, sizeof d);
    if (!model_config(&err, &o, &d.model)) return 2;
    d.seq = o.seq, d.batch = o.batch, d.gpus = (int)o.gpus, d.gpus_per_node = gpn, d.hw = &hw;
    d.like = hw.host ? tpk_ops_host() : NULL;
    d.dtype = o.model.dtype ? (strcmp(o.model.dtype, "bf16") ? TPK_F32 : TPK_BF16)
              : hw.host     ? TPK_F32
                            : TPK_BF16;
    d.tp = (int)o.tp, d.pp = (int)o.pp, d.micro_batch = (int)o.mb, d.zero = (int)o.zero;
    d.sp = (int)o.sp, d.cp = o.cp > 0 ? (int)o.cp : -1, d.ep = o.ep > 0 ? (int)o.ep : -1;
    d.zero_shard = (int)o.zero_shard;
    d.cp_comm = !o.cp_comm ? -1 : strcmp(o.cp_comm, "allgather") ? TPK_CP_P2P : TPK_CP_ALLGATHER;
    d.recompute = o.recompute ? (int)rc : -1;
    tpk_plan_cfg *v = NULL;
    int n = 0;
    double t0 = now();
    if (tpk_plan(&err, &d, &v, &n) != TPK_OK)
        return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&err)), 1;
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
           tpk_run_family_title(d.model.arch), (long long)*sh[2], (long long)*sh[3],
           (long long)*sh[4], (long long)*sh[0], params / 1e6, (long long)d.seq, (long long)d.batch,
           (double)d.batch * d.seq, d.gpus, d.gpus / gpn, d.gpus / gpn == 1 ? "" : "s", gpn,
           hw.name, d.dtype == TPK_BF16 ? "bf16" : "f32");
    printf("profile: %s\n", hw.source);
    float cf = d.model.arch == TPK_ARCH_MIXTRAL     ? d.model.mixtral.capacity_factor
               : d.model.arch == TPK_ARCH_QWEN2_MOE ? d.model.qwen2_moe.capacity_factor
                                                    : 0;
    if (tpk_arch_has_experts(d.model.arch) && cf > 0)
        printf("assumed: every expert full to its capacity from each other EP rank "
               "(--capacity-factor %g: min(T, C) rows, C = ceil(T k / E x %g), the most it can "
               "send) and a rank's own rows as a balanced router's: the peak a bound for any "
               "router but those\n",
               (double)cf, (double)cf);
    else if (tpk_arch_has_experts(d.model.arch))
        printf("assumed: a balanced router (every expert T k / E of a rank's T tokens' rows, so "
               "each EP rank receives T k rows); a real router's imbalance moves the experts' "
               "activations and the all-to-alls' time\n");
    printf("%d configurations, %d fit (dry runs in %.1f s)\n", n, fit, now() - t0);
    printf("rank  TPxCPxPPxDP      mb     M  recompute ZeRO  SP   GB/rank     s/step     tokens/s "
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
                   "%.0f GB devices; add GPUs, or allow recompute, ZeRO or pipeline stages\n",
                   least / 1e9, hw.reserve_gb, hw.mem_gb);
        else printf("nothing fits: no configuration passes (the reasons above)\n");
        free(v);
        return 3;
    }
    const tpk_plan_cfg *b = &v[0];
    int mbmax = 0;
    for (int i = 0; i < fit; i++) mbmax = v[i].micro_batch > mbmax ? v[i].micro_batch : mbmax;
    char cpw[48], zw[48];
    char epw[24] = "";
    if (b->ep > 1) snprintf(epw, sizeof epw, " (EP %d)", b->ep);
    printf("best: TP %d%s x PP %d x DP %d%s, micro-batch %d (%d a step per DP rank), recompute %s, "
           "ZeRO %s, SP %s: %.3f s a step, %.0f tokens/s, MFU %.1f%%, %.2f GB a rank\n",
           b->tp, tpk_plan_cp_words(b, cpw, sizeof cpw), b->pp, b->dp, epw, b->micro_batch,
           b->accum, tpk_recompute_name(b->recompute), tpk_plan_zero_words(b, zw, sizeof zw),
           b->sp ? "on" : "off", b->step_seconds, b->tokens_per_s, 100 * b->mfu,
           b->peak_bytes / 1e9);
    char gw[64] = ""; /* ZeRO-3's gathered buffers, where it holds them */
    if (b->gathered_bytes > 0)
        snprintf(gw, sizeof gw, ", gathered buffers %.2f", b->gathered_bytes / 1e9);
    printf("its %.2f GB a GPU: weights %.2f (%s)%s, gradients %.2f, AdamW's moments %.2f, "
           "activations and scratch %.2f\n",
           b->peak_bytes / 1e9, b->weights_bytes / 1e9,
           b->zero == 3 ? "the f32 shard" : "f32 and bf16", gw, b->grads_bytes / 1e9,
           b->optim_bytes / 1e9, b->activ_bytes / 1e9);
    printf("largest micro-batch that fits: %d\n", mbmax);
    if (o.tokens > 0) {
        char t[64];
        duration(o.tokens / b->tokens_per_s, t, sizeof t);
        printf("time to train %.3g tokens: %s\n", o.tokens, t);
    }
    if (o.target > 0) { /* nodes doubled until the best reaches the target */
        int g = (int)o.gpus;
        double best = b->tokens_per_s;
        while (best < o.target && g < (1 << 16)) {
            double before = best;
            g *= 2;
            tpk_plan_desc d2 = d;
            d2.gpus = g;
            tpk_plan_cfg *w = NULL;
            int m = 0;
            if (tpk_plan(&err, &d2, &w, &m) != TPK_OK)
                return fprintf(stderr, "plan: error: %s\n", tpk_last_error(&err)), 1;
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
