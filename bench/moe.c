/* bench/moe.c — the mixture of experts' all-to-all measured on the host backend (make bench-moe;
 * mpirun -np 4): a Mixtral (L layers, E experts, top-k) at DP = the ranks and EP e = 1, 2, 4, each
 * rank its own T = B S tokens; over `steps` forwards and backwards (no recompute) the elements and
 * bytes the EP group's all-to-alls send (tpk_comm_stats of ctx->ep, TPK_COLL_ALLTOALL: each rank's
 * sends, its own block included), against the theory of docs/DESIGN.md (*Mixture of experts*,
 * "The all-to-all's cost") per layer and step:
 *   counts: E int32 (El to each of the e ranks, forward only);
 *   rows:   N H (dispatch) + R H (combine) forward, the same two backward: 2 (N + R) H elements of
 *           the context's dtype, N the rows this rank sends (T k less the dropped), R the rows it
 *           receives (the dispatcher's counts of the step, read after each forward);
 * the measured counts must equal the theory exactly (a difference is printed as a failure of the
 * accounting). Then the share that leaves the rank (the blocks to the other e - 1 ranks) against
 * the balanced router's (e - 1) / e of 2 (N + R) H, and the wall time of a step's all-to-alls (the
 * profiler's rows, the slowest rank's) beside the step's.
 *   mpirun -np 4 build/bench/moe [--layers 2] [--hidden 64] [--experts 8] [--top-k 2]
 *                                [--batch 4] [--seq 64] [--steps 3]
 * Figures, not a test. More ranks than cores time-share them: the times are upper bounds. */
#define _POSIX_C_SOURCE 200809L
#include <tpk/runtime/mpi.h>
#include <tpk/tpk.h>
#include <tpk/train/model.h>

#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A failed call: its message, and every rank stops. */
static void check(tpk_ctx *ctx, tpk_status s) {
    if (s == TPK_OK) return;
    fprintf(stderr, "bench-moe: %s (%s)\n", tpk_last_error(ctx), tpk_status_str(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

typedef struct bench {
    tpk_comm world;
    int L, H, E, k, steps;
    int64_t B, S;
} bench;

/* The all-to-all time of a profile: its rows' ms ("alltoallv", started and waited). */
static double a2a_ms(const tpk_profile *p) {
    double ms = 0;
    for (int r = 0; p && r < p->nrows; r++)
        if (strstr(p->rows[r].name, "alltoallv")) ms += p->rows[r].ms;
    return ms;
}

/* One EP size: the figures of `steps` forwards and backwards, printed by rank 0. */
static void run(bench *b, int e, int me) {
    tpk_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    check(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &b->world, .ep = e, .seed = 1}));
    tpk_mixtral_config c = {.vocab = 256,
                            .positions = b->S,
                            .layers = b->L,
                            .hidden = b->H,
                            .heads = 4,
                            .kv_heads = 4,
                            .ffn = 2 * b->H,
                            .experts = b->E,
                            .top_k = b->k,
                            .aux_coef = 0.01f};
    tpk_lm_config lc;
    tpk_lm m;
    check(&ctx, tpk_mixtral_lm_config(&ctx, &c, &lc));
    check(&ctx, tpk_lm_init(&ctx, &m, &lc));
    int64_t T = b->B * b->S;
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)T),
            *tg = (int32_t *)malloc(sizeof(int32_t) * (size_t)T);
    if (!ids || !tg) MPI_Abort(MPI_COMM_WORLD, 1);
    size_t es = tpk_dtype_size(ctx.dtype);
    double theory = 0, leaves = 0, balanced = 0, secs = 0; /* bytes; the steps' wall time */
    tpk_comm_stats s0 = ctx.ep.stats;
    check(&ctx, tpk_profile_start(&ctx));
    for (int step = 0; step < b->steps; step++) {
        for (int64_t i = 0; i < T; i++) /* each DP rank its own tokens, each step new ones */
            ids[i] = (int32_t)(tpk_rng_uniform(1, (uint64_t)(step * 64 + me), (uint64_t)i) * 256),
            tg[i] = (int32_t)(tpk_rng_uniform(2, (uint64_t)(step * 64 + me), (uint64_t)i) * 256);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        check(&ctx, tpk_params_zero_grad(&ctx));
        check(&ctx, tpk_lm_forward(&ctx, &m, ids, tg, b->B, b->S, NULL));
        for (int l = 0; l < b->L; l++) { /* the routing of this forward: N sent, R received */
            const tpk_moe_dispatcher *d = &m.blocks[l].mlp.u.moe.disp;
            double own = 0; /* the rows to this rank's own experts stay (a copy) */
            for (int64_t j = 0; j < d->El; j++) own += (double)d->rcount[d->rank * d->El + j];
            if (e > 1) theory += 4.0 * (double)b->E; /* the counts, forward */
            if (e > 1) theory += 2.0 * (double)(d->N + d->R) * b->H * (double)es;
            leaves += 2.0 * ((double)(d->N + d->R) - 2 * own) * b->H * (double)es;
            balanced += 2.0 * (e - 1.0) / e * (2.0 * (double)T * b->k) * b->H * (double)es;
        }
        check(&ctx, tpk_lm_backward(&ctx, &m, 1.0f));
        secs += now() - t0;
        check(&ctx, tpk_profile_step(&ctx)); /* (the step's op times into its rows) */
    }
    double a2a = a2a_ms(ctx.prof) / 1e3;
    tpk_profile_stop(&ctx);
    double got = (double)(ctx.ep.stats.bytes[TPK_COLL_ALLTOALL] - s0.bytes[TPK_COLL_ALLTOALL]),
           calls = (double)(ctx.ep.stats.calls[TPK_COLL_ALLTOALL] - s0.calls[TPK_COLL_ALLTOALL]);
    double v[6] = {got, theory, leaves, balanced, a2a, secs}, mx[6];
    MPI_Allreduce(v, mx, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int exact = got == theory, all = 0;
    MPI_Allreduce(&exact, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    double per = 1.0 / b->steps;
    if (!me)
        printf("| %d | %.0f | %.1f | %.1f | %s | %.1f | %.1f | %.2f | %.1f | %.1f |\n", e,
               calls * per, mx[0] * per / 1e3, mx[1] * per / 1e3, all ? "yes" : "**NO**",
               mx[2] * per / 1e3, mx[3] * per / 1e3, mx[3] > 0 ? mx[2] / mx[3] : 0.0,
               mx[4] * per * 1e3, mx[5] * per * 1e3);
    free(ids), free(tg);
    tpk_lm_destroy(&ctx, &m);
    tpk_ctx_destroy(&ctx);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    bench b = {.L = 2, .H = 64, .E = 8, .k = 2, .steps = 3, .B = 4, .S = 64};
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) b.L = v;
        else if (!strcmp(argv[i], "--hidden")) b.H = v;
        else if (!strcmp(argv[i], "--experts")) b.E = v;
        else if (!strcmp(argv[i], "--top-k")) b.k = v;
        else if (!strcmp(argv[i], "--batch")) b.B = v;
        else if (!strcmp(argv[i], "--seq")) b.S = v;
        else if (!strcmp(argv[i], "--steps")) b.steps = v;
        else {
            fprintf(stderr, "bench-moe: unknown flag %s\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    int me, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    tpk_ctx boot;
    memset(&boot, 0, sizeof boot);
    check(&boot, tpk_comm_mpi(&boot, MPI_COMM_WORLD, &b.world));
    if (!me) {
        printf("Mixtral L=%d H=%d E=%d k=%d, T = %lld x %lld tokens a rank, %d ranks (DP), f32; "
               "per step (forward and backward), the largest rank's\n\n",
               b.L, b.H, b.E, b.k, (long long)b.B, (long long)b.S, np);
        printf("| EP | all-to-alls | KB sent (stats) | KB theory | equal | KB leaving the rank "
               "| KB balanced | leaving / balanced | all-to-all ms | step ms |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for (int e = 1; e <= np; e *= 2)
        if (np % e == 0 && b.E % e == 0) run(&b, e, me);
    MPI_Finalize();
    return 0;
}
