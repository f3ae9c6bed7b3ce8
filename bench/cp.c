/* bench/cp.c — context parallelism measured on the host backend (make bench-cp; mpirun -np 4):
 *   (a) the longest sequence whose activations fit a fixed budget a rank, at c = 1, 2, 4: a
 *       Llama (rotary, L blocks, one sequence) forward and backward over a context of CP c (the
 *       other ranks DP), its activations a rank measured by the context's memory counters — the
 *       peak over the forward and backward above what the model held before (parameters and
 *       gradients), the largest over the ranks — and S found by doubling, then bisection in
 *       steps of 64 tokens; then each c's activations at the c = 1 length against c = 1's (they
 *       should fall about as 1 / c: a rank holds S / c rows of every activation);
 *   (b) the step (forward and backward) at a fixed S against c, the ring and the all-gather: the
 *       wall time a step (the slowest rank's, between barriers), and the time spent in the CP
 *       group's calls — the K|V steps' starts and waits, the blocking dK|dV steps, the
 *       all-gather and reduce-scatter, the loss's all-reduces (the profiler's rows of collectives
 *       on a communicator other than TP and DP: tpk/runtime/profile.h) — the part of the ring's
 *       communication the compute did not hide; with the messages and bytes a step and layer
 *       counted on ctx->cp (tpk_comm_stats) against the table of docs/DESIGN.md: the ring's sends
 *       (c - 1 forward, c - 1 + c backward), the all-gather's collectives and their whole buffers.
 *   mpirun -np 4 build/bench/cp [--layers 2] [--hidden 64] [--heads 4] [--budget-mb 16]
 *                               [--seq 2048] [--steps 3] [--part a|b|ab]
 * Figures, not a test. More ranks than cores (4 on 2) time-share the cores: a rank waiting in a
 * message may be waiting for its peer to be scheduled, so the communication times are upper
 * bounds of a machine with a core a rank; the memory figures do not depend on it. */
#define _POSIX_C_SOURCE 200809L
#include <tpk/runtime/mpi.h>
#include <tpk/tpk.h>
#include <tpk/train/model.h>

#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TRY(ctx, call)                                                                       \
    do {                                                                                     \
        tpk_status s_ = (call);                                                              \
        if (s_ != TPK_OK) {                                                                  \
            fprintf(stderr, "bench-cp: %s (%s)\n", tpk_last_error(ctx), tpk_status_str(s_)); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
        }                                                                                    \
    } while (0)

typedef struct bench {
    tpk_comm world;
    int L, H, A, V, steps;
    int64_t positions;
} bench;

/* A Llama of b's shape over a context of CP c (DP the rest) in ctx, its model in m. */
static void model_init(bench *b, tpk_ctx *ctx, tpk_model *m, int c, tpk_cp_comm mode) {
    memset(ctx, 0, sizeof *ctx);
    TRY(ctx, tpk_ctx_init(ctx, &(tpk_ctx_desc){.world = &b->world, .cp = c, .seed = 1}));
    tpk_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = TPK_ARCH_LLAMA;
    cfg.llama.vocab = b->V, cfg.llama.positions = b->positions, cfg.llama.layers = b->L;
    cfg.llama.hidden = b->H, cfg.llama.heads = b->A, cfg.llama.kv_heads = b->A;
    cfg.llama.ffn = 2 * b->H, cfg.llama.cp_comm = mode;
    TRY(ctx, tpk_model_init(ctx, m, &cfg));
    TRY(ctx, tpk_params_zero_grad(ctx));
}

/* This CP rank's rows of one sequence of S tokens (ids, targets), host memory. */
static void rows(tpk_ctx *ctx, int64_t S, int V, int32_t **ids, int32_t **tg) {
    int32_t *wi = (int32_t *)malloc(sizeof(int32_t) * (size_t)S),
            *wt = (int32_t *)malloc(sizeof(int32_t) * (size_t)S);
    size_t n = (size_t)tpk_cp_rows(ctx, 1, S);
    *ids = (int32_t *)malloc(sizeof(int32_t) * n), *tg = (int32_t *)malloc(sizeof(int32_t) * n);
    if (!wi || !wt || !*ids || !*tg) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int64_t i = 0; i < S; i++)
        wi[i] = (int32_t)(tpk_rng_uniform(1, 0, (uint64_t)i) * V) % V,
        wt[i] = (int32_t)(tpk_rng_uniform(2, 0, (uint64_t)i) * V) % V;
    TRY(ctx, tpk_cp_scatter_host(ctx, *ids, wi, 1, S, sizeof(int32_t)));
    TRY(ctx, tpk_cp_scatter_host(ctx, *tg, wt, 1, S, sizeof(int32_t)));
    free(wi), free(wt);
}

/* One forward and backward of a sequence of S tokens at CP c: the activations a rank held at
 * most (bytes, the largest over the ranks). */
static double activations(bench *b, int c, int64_t S) {
    tpk_ctx ctx;
    tpk_model m;
    model_init(b, &ctx, &m, c, TPK_CP_P2P);
    int32_t *ids, *tg;
    rows(&ctx, S, b->V, &ids, &tg);
    size_t base = ctx.mem; /* parameters and gradients: the activations come on top */
    tpk_mem_peak(&ctx, true);
    tpk_lm *lm = tpk_model_lm(&m);
    TRY(&ctx, tpk_lm_forward(&ctx, lm, ids, tg, 1, S, NULL));
    TRY(&ctx, tpk_lm_backward(&ctx, lm, 1.0f));
    double act = (double)(tpk_mem_peak(&ctx, false) - base);
    MPI_Allreduce(MPI_IN_PLACE, &act, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    free(ids), free(tg);
    tpk_model_destroy(&ctx, &m);
    tpk_ctx_destroy(&ctx);
    return act;
}

/* The CP group's share of a profile: the ms of its rows (collectives on a communicator other than
 * TP and DP: "p2p", "p2p (start)", "wait (p2p)", "allgather (start)", "reduce_scatter", ...). */
static double cp_ms(const tpk_profile *p) {
    static const char *const cp_rows[] = {"p2p",
                                          "p2p (start)",
                                          "wait (p2p)",
                                          "wait (allgather)",
                                          "wait (reduce_scatter)",
                                          "wait (allreduce)",
                                          "allgather",
                                          "allgather (start)",
                                          "reduce_scatter",
                                          "reduce_scatter (start)",
                                          "allreduce",
                                          "allreduce (start)"};
    double ms = 0;
    for (int r = 0; r < p->nrows; r++)
        for (size_t k = 0; k < sizeof cp_rows / sizeof cp_rows[0]; k++)
            if (!strcmp(p->rows[r].name, cp_rows[k])) ms += p->rows[r].ms;
    return ms;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    bench b = {.L = 2, .H = 64, .A = 4, .V = 256, .steps = 3, .positions = 1 << 16};
    double budget_mb = 16;
    int64_t Sb = 2048;
    const char *part = "ab";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layers")) b.L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) b.H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) b.A = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--budget-mb")) budget_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) Sb = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) b.steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--part")) part = argv[i + 1];
        else {
            fprintf(stderr, "bench-cp: unknown flag %s\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    tpk_ctx e = {0};
    TRY(&e, tpk_comm_mpi(&e, MPI_COMM_WORLD, &b.world));
    int W = b.world.size, me = b.world.rank, cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int g = 64; /* the search's step: a multiple of 2 c for every c here */
    bool pa = strchr(part, 'a') != NULL, pb = strchr(part, 'b') != NULL;
    if (Sb % g || Sb < g || b.L < 1 || b.H < 1 || b.A < 1 || b.H % b.A || budget_mb <= 0 ||
        b.steps < 1 || strspn(part, "ab") != strlen(part) || !*part) {
        if (me == 0)
            fprintf(stderr,
                    "bench-cp: expected --seq a multiple of %d, --hidden a multiple of --heads, "
                    "--budget-mb and --steps > 0, --part a, b or ab\n",
                    g);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (me == 0)
        printf("bench-cp: Llama L=%d H=%d A=%d (D=%d) V=%d, one sequence, f32, host backend; %d "
               "ranks on %d cores%s\n",
               b.L, b.H, b.A, b.H / b.A, b.V, W, cores,
               W > cores ? " (oversubscribed: the ranks time-share the cores, so a rank's wait in "
                           "a message includes its peer's turn for a core)"
                         : "");
    int cs[3] = {1, 2, 4}, nc = 0;
    for (int i = 0; i < 3; i++)
        if (cs[i] <= W && W % cs[i] == 0) cs[nc++] = cs[i];

    /* (a) the longest sequence within the budget */
    double budget = budget_mb * 1e6, act1 = 0;
    int64_t S1 = 0;
    if (me == 0 && pa)
        printf("\n(a) activations a rank within %.0f MB (measured: the peak over a forward and "
               "backward above the parameters and gradients, the largest rank)\n"
               "%4s %12s %14s %14s %22s\n",
               budget_mb, "c", "longest S", "its MB a rank", "bytes a token",
               "at c=1's S: x c=1's");
    for (int i = 0; pa && i < nc; i++) {
        int c = cs[i];
        int64_t lo = 0, hi = g;
        double at_lo = 0;
        for (;;) { /* doubling until past the budget */
            double a = activations(&b, c, hi);
            if (a > budget || hi * 2 > b.positions) break;
            lo = hi, at_lo = a, hi *= 2;
        }
        while (hi - lo > g) { /* bisection in steps of g */
            int64_t mid = (lo + hi) / 2 / g * g;
            double a = activations(&b, c, mid);
            if (a <= budget) lo = mid, at_lo = a;
            else hi = mid;
        }
        if (c == 1) S1 = lo, act1 = at_lo;
        double at1 = c == 1 ? at_lo : S1 ? activations(&b, c, S1) : 0;
        if (me == 0)
            printf("%4d %12lld %14.2f %14.1f %15.3f (1/c %.3f)\n", c, (long long)lo, at_lo / 1e6,
                   lo ? at_lo / (double)lo : 0.0, act1 > 0 ? at1 / act1 : 0.0, 1.0 / c);
    }

    /* (b) the step against c at a fixed S */
    if (me == 0 && pb)
        printf("\n(b) a step (forward and backward) of S = %lld, the mean of %d after a warm-up; "
               "CP ms: the time in the CP group's calls (the ring's starts, waits and blocking "
               "dK|dV steps; the all-gather, reduce-scatter; the loss's all-reduces), the mean "
               "over the ranks and the most; on ctx->cp a layer: the ring's sends and MB sent by "
               "a rank, the all-gather's collectives and their whole buffers' MB\n"
               "%4s %-10s %10s %12s %12s %9s %16s %16s\n",
               (long long)Sb, b.steps, "c", "mode", "step ms", "CP ms mean", "CP ms most",
               "CP share", "msgs/layer f+b", "MB/layer");
    for (int i = 0; pb && i < nc; i++) {
        for (int mode = 0; mode <= (cs[i] > 1 ? TPK_CP_ALLGATHER : 0); mode++) {
            int c = cs[i];
            tpk_ctx ctx;
            tpk_model m;
            model_init(&b, &ctx, &m, c, (tpk_cp_comm)mode);
            int32_t *ids, *tg;
            rows(&ctx, Sb, b.V, &ids, &tg);
            tpk_lm *lm = tpk_model_lm(&m);
            TRY(&ctx, tpk_lm_forward(&ctx, lm, ids, tg, 1, Sb, NULL)); /* warm-up */
            TRY(&ctx, tpk_lm_backward(&ctx, lm, 1.0f));
            TRY(&ctx, tpk_profile_start(&ctx));
            tpk_comm_stats_reset(&ctx.cp);
            double wall = 0;
            for (int s = 0; s < b.steps; s++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = now();
                TRY(&ctx, tpk_lm_forward(&ctx, lm, ids, tg, 1, Sb, NULL));
                TRY(&ctx, tpk_lm_backward(&ctx, lm, 1.0f));
                TRY(&ctx, tpk_profile_step(&ctx));
                MPI_Barrier(MPI_COMM_WORLD); /* the step ends with the slowest rank's */
                wall += now() - t0;
            }
            double ms = cp_ms(ctx.prof) / b.steps, most = ms, mean = ms;
            MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            mean /= W;
            const tpk_comm_stats *st = &ctx.cp.stats;
            double per = (double)b.steps * b.L, msgs = (double)st->calls[TPK_COLL_SEND] / per;
            double sent = (double)st->bytes[TPK_COLL_SEND];
            if (mode == TPK_CP_ALLGATHER) /* collectives: their calls, a rank's share of bytes */
                msgs =
                    (double)(st->calls[TPK_COLL_ALLGATHER] + st->calls[TPK_COLL_REDUCE_SCATTER]) /
                    per,
                sent = (double)(st->bytes[TPK_COLL_ALLGATHER] + st->bytes[TPK_COLL_REDUCE_SCATTER]);
            double step_ms = wall / b.steps * 1e3;
            if (me == 0)
                printf("%4d %-10s %10.1f %12.1f %12.1f %8.1f%% %16.1f %16.3f\n", c,
                       c == 1                     ? "-"
                       : mode == TPK_CP_ALLGATHER ? "allgather"
                                                  : "p2p ring",
                       step_ms, mean, most, step_ms > 0 ? 100 * mean / step_ms : 0.0, msgs,
                       sent / per / 1e6);
            free(ids), free(tg);
            tpk_model_destroy(&ctx, &m);
            tpk_ctx_destroy(&ctx);
        }
    }
    tpk_comm_destroy(&b.world);
    MPI_Finalize();
    return 0;
}
