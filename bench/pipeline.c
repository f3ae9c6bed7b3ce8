/* bench/pipeline.c — the pipeline's bubble and activation memory, measured on a GPT-2 split over
 * the ranks (one stage a rank, the host backend; mpirun -np P):
 *   for 1F1B and interleaved (V = 2) at M = 4, 8, 16 micro-batches: each stage's idle fraction of
 *   a step — the time its executor waits in messages over the step (tpk_pipe.t_wait) — next to the
 *   schedule played with a forward costing 1 and a backward 2 (tpk_pipe_check) and the theory,
 *   (P - 1) / (M + P - 1) for 1F1B and (P - 1) / V / (M + (P - 1) / V) interleaved;
 *   and each stage's activation memory (its peak over a step minus what the model held before),
 *   in units of one micro-batch's (the same stage under GPipe with M = 1), against 1F1B's bound of
 *   P - s micro-batches on stage s (interleaved: more, its warm-up holds more chunks); each with
 *   the even split of the blocks and the one balanced by tpk_pipe_model_costs' flop estimate
 *   (the last stage also carries the LM head).
 *   mpirun -np 2 build/bench/pipeline [--layers 8] [--hidden 256] [--batch 4] [--seq 128]
 * Figures, not a test. Stages on fewer cores than ranks wait for the CPU too (oversubscribed). */
#define _POSIX_C_SOURCE 200809L
#include <tpk/runtime/mpi.h>
#include <tpk/tpk.h>
#include <tpk/train/pipe_model.h>

#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TRY(call)                                                                             \
    do {                                                                                      \
        tpk_status s_ = (call);                                                               \
        if (s_ != TPK_OK) {                                                                   \
            fprintf(stderr, "pipeline: %s (%s)\n", tpk_last_error(&ctx), tpk_status_str(s_)); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
        }                                                                                     \
    } while (0)

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int L = 8, H = 256, Bm = 4, S = 128, reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layers")) L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) Bm = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) S = atoi(argv[i + 1]);
    }
    tpk_comm world;
    tpk_ctx ctx = {0};
    TRY(tpk_comm_mpi(&ctx, MPI_COMM_WORLD, &world));
    int P = world.size, me = world.rank;
    TRY(tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .pp = P, .seed = 1}));
    tpk_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = TPK_ARCH_GPT2;
    cfg.gpt2 = (tpk_gpt2_config){
        .vocab = 4096, .positions = S, .layers = L, .hidden = H, .heads = H / 64 ? H / 64 : 1};
    int Ms[3] = {4, 8, 16};
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * 16 * (size_t)(Bm * S)),
            *tg = (int32_t *)malloc(sizeof(int32_t) * 16 * (size_t)(Bm * S));
    for (int i = 0; i < 16 * Bm * S; i++)
        ids[i] = (int32_t)(tpk_rng_uniform(1, 0, (uint64_t)i) * 4096) % 4096,
        tg[i] = (int32_t)(tpk_rng_uniform(2, 0, (uint64_t)i) * 4096) % 4096;
    /* one micro-batch's activations on each stage: GPipe, M = 1 (each model in a context of its
       own: parameters stay registered in their context) */
    double unit;
    {
        tpk_pipe_model pm;
        tpk_ctx_destroy(&ctx);
        TRY(tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .pp = P, .seed = 1}));
        TRY(tpk_pipe_model_init(&ctx, &pm, &cfg, TPK_PIPE_GPIPE, 1, 1, NULL, NULL, 0, 0));
        TRY(tpk_params_zero_grad(&ctx));
        size_t base = ctx.mem;
        tpk_mem_peak(&ctx, true);
        TRY(tpk_pipe_model_step(&ctx, &pm, ids, tg, Bm, S, 1.0f, 0, NULL));
        unit = (double)(tpk_mem_peak(&ctx, false) - base);
        tpk_pipe_model_destroy(&ctx, &pm);
    }
    if (me == 0)
        printf("pipeline: GPT-2 L=%d H=%d V=4096, micro-batches of B=%d S=%d, P=%d stages (one a "
               "rank), host backend\n"
               "%-12s %-9s %-8s %3s | %-32s | %-10s %-10s | %s\n",
               L, H, Bm, S, P, "schedule", "split", "blocks", "M", "measured idle per stage",
               "played", "theory", "activation memory per stage (micro-batches; 1F1B bound P - s)");
    double *cost = (double *)malloc(sizeof(double) * (size_t)L), cf = 0, cl = 0;
    tpk_pipe_model_costs(&cfg, S, cost, &cf, &cl);
    for (int bal = 0; bal < 2; bal++)
        for (int kind = TPK_PIPE_1F1B; kind <= TPK_PIPE_INTERLEAVED; kind++)
            for (int mi = 0; mi < 3; mi++) {
                int M = Ms[mi], V = kind == TPK_PIPE_INTERLEAVED ? 2 : 1;
                if (kind == TPK_PIPE_INTERLEAVED && (P < 2 || M % P || L < P * V)) continue;
                tpk_pipe_model pm;
                tpk_ctx_destroy(&ctx);
                TRY(tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .pp = P, .seed = 1}));
                TRY(tpk_pipe_model_init(&ctx, &pm, &cfg, (tpk_pipe_kind)kind, M, V, NULL,
                                        bal ? cost : NULL, cf, cl));
                TRY(tpk_params_zero_grad(&ctx));
                size_t base = ctx.mem; /* parameters, gradients: the activations come on top */
                tpk_mem_peak(&ctx, true);
                TRY(tpk_pipe_model_step(&ctx, &pm, ids, tg, Bm, S, 1.0f / M, 0,
                                        NULL)); /* warm-up */
                double act = (double)(tpk_mem_peak(&ctx, false) - base) / (unit > 0 ? unit : 1);
                double idle = 0, total = 0;
                for (int r = 0; r < reps; r++) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    double t0 = now();
                    TRY(tpk_params_zero_grad(&ctx));
                    TRY(tpk_pipe_model_step(&ctx, &pm, ids, tg, Bm, S, 1.0f / M, (uint64_t)r,
                                            NULL));
                    MPI_Barrier(MPI_COMM_WORLD); /* the step ends when the last stage's does */
                    double t = now() - t0;
                    total += t, idle += t - pm.exec.t_compute;
                }
                double played_idle[64], span = 1;
                TRY(tpk_pipe_check(&ctx, &pm.sched, 1, 2, played_idle, &span));
                double theory = kind == TPK_PIPE_1F1B
                                    ? (double)(P - 1) / (M + P - 1)
                                    : (double)(P - 1) / V / ((double)M + (double)(P - 1) / V);
                double mine[2] = {idle / total, act}, all[128];
                MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
                if (me == 0) {
                    char a[256] = "", b[256] = "";
                    for (int s = 0; s < P && s < 64; s++) {
                        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%.3f", s ? " " : "",
                                 all[2 * s]);
                        snprintf(b + strlen(b), sizeof b - strlen(b), "%s%.2f", s ? " " : "",
                                 all[2 * s + 1]);
                    }
                    char split[160] = "";
                    for (int u = 0; u < P * V; u++)
                        snprintf(split + strlen(split), sizeof split - strlen(split), "%s%lld",
                                 u ? "," : "", (long long)(pm.first[u + 1] - pm.first[u]));
                    printf("%-12s %-9s %-8s %3d | %-32s | %-10.3f %-10.3f | %s\n",
                           kind == TPK_PIPE_1F1B ? "1f1b" : "interleaved",
                           bal ? "balanced" : "even", split, M, a, played_idle[0] / span, theory,
                           b);
                }
                tpk_pipe_model_destroy(&ctx, &pm);
            }
    free(ids), free(tg), free(cost);
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    MPI_Finalize();
    return 0;
}
