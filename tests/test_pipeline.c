/* tests/test_pipeline.c — pipeline parallelism's parts: the TP x DP x PP mesh, point-to-point
 * batches on MPI (data, tags, counters, bad arguments), the schedules (the published orders of
 * GPipe, 1F1B and Megatron's interleaving; every schedule plays through without deadlock; mutated
 * ones are caught; the bubble against theory; 1F1B's bound on live activations), the split of
 * blocks over stages (even, a list, balanced by cost against a brute-force optimum) and the
 * executor: a toy model of P V elementwise stages run under every schedule gives the losses and
 * gradients of the same micro-batches run without a pipeline, bit for bit, with the schedule's
 * count of messages. Run at 1..4 ranks. */
#include <tpk/train/pipeline.h>

#include "test.h"

/* ---- schedules ------------------------------------------------------------------------------- */

/* stage r's compute steps as text */
static const char *order_str(const tpk_pipe_schedule *s, int r, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < s->n[r] && k + 16 < n; i++) {
        char b[32];
        if (s->step[r][i].action > TPK_PIPE_B) continue;
        k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? " " : "",
                              tpk_pipe_step_str(s, s->step[r][i], b, sizeof b));
    }
    return buf;
}

static void check_order(tpk_pipe_kind kind, int P, int M, int V, int r, const char *want) {
    tpk_pipe_schedule s;
    char got[2048];
    tpk_status st = tpk_pipe_schedule_make(NULL, &s, kind, P, M, V);
    CHECK(st == TPK_OK, "make %s P=%d M=%d V=%d", tpk_pipe_kind_name(kind), P, M, V);
    if (st != TPK_OK) return;
    CHECK(!strcmp(order_str(&s, r, got, sizeof got), want),
          "%s P=%d M=%d V=%d stage %d:\n got %s\nwant %s", tpk_pipe_kind_name(kind), P, M, V, r,
          got, want);
    tpk_pipe_schedule_free(&s);
}

/* ---- the toy pipeline: virtual stage u is y = tanh(a_u x + b_u) on this TP rank's slice ------ */

enum { NX = 37 };
typedef struct toy {
    int P, V, M, U;
    int64_t lo, nloc; /* this TP rank's slice of the NX elements */
    int stage, dpr;
    float *y;           /* [V M][nloc] each (chunk, mb)'s output */
    const float **x;    /* [V M] its input */
    float *dx;          /* [nloc] */
    float ga[8], gb[8]; /* per chunk */
    float loss[64];     /* per micro-batch, on the last virtual stage */
} toy;
static float toy_a(int u) { return 0.7f + 0.11f * (float)u; }
static float toy_b(int u) { return -0.2f + 0.05f * (float)u; }
static float toy_in(int dpr, int mb, int64_t j) {
    return tpk_rng_normal(7, (uint64_t)(dpr * 1000 + mb), (uint64_t)j);
}
static float toy_tgt(int dpr, int mb, int64_t j) {
    return tpk_rng_normal(8, (uint64_t)(dpr * 1000 + mb), (uint64_t)j);
}

/* one virtual stage's forward and backward, shared by the pipeline and the reference */
static void toy_fwd(int u, const float *x, float *y, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = tanhf(toy_a(u) * x[j] + toy_b(u));
}
static void toy_bwd(int u, const float *x, const float *y, const float *dy, float *dx, float *ga,
                    float *gb, int64_t n) {
    float sa = 0, sb = 0;
    for (int64_t j = 0; j < n; j++) {
        float d = dy[j] * (1 - y[j] * y[j]);
        sa += d * x[j], sb += d, dx[j] = d * toy_a(u);
    }
    *ga += sa, *gb += sb;
}
static float toy_loss(const float *y, const float *tgt, float *dy, int64_t n) {
    float l = 0;
    for (int64_t j = 0; j < n; j++) l += y[j] * tgt[j] / NX, dy[j] = tgt[j] / NX;
    return l;
}

static tpk_status toy_forward(tpk_ctx *ctx, void *user, int chunk, int mb, const void *x,
                              const void **y) {
    toy *t = (toy *)user;
    (void)ctx;
    int u = chunk * t->P + t->stage, cell = chunk * t->M + mb;
    float *in = NULL;
    if (!x) { /* the first virtual stage makes its input */
        in = (float *)malloc(sizeof(float) * (size_t)t->nloc);
        for (int64_t j = 0; j < t->nloc; j++) in[j] = toy_in(t->dpr, mb, t->lo + j);
        x = in;
    }
    t->x[cell] = (const float *)x;
    float *out = t->y + (size_t)cell * (size_t)t->nloc;
    toy_fwd(u, (const float *)x, out, t->nloc);
    *y = out;
    return TPK_OK;
}
static tpk_status toy_backward(tpk_ctx *ctx, void *user, int chunk, int mb, const void *dy,
                               const void **dx) {
    toy *t = (toy *)user;
    (void)ctx;
    int u = chunk * t->P + t->stage, cell = chunk * t->M + mb;
    float *g = NULL;
    const float *y = t->y + (size_t)cell * (size_t)t->nloc;
    if (!dy) { /* the loss */
        float *tg = (float *)malloc(sizeof(float) * (size_t)t->nloc);
        g = (float *)malloc(sizeof(float) * (size_t)t->nloc);
        for (int64_t j = 0; j < t->nloc; j++) tg[j] = toy_tgt(t->dpr, mb, t->lo + j);
        t->loss[mb] = toy_loss(y, tg, g, t->nloc);
        free(tg);
        dy = g;
    }
    toy_bwd(u, t->x[cell], y, (const float *)dy, t->dx, &t->ga[chunk], &t->gb[chunk], t->nloc);
    if (u == 0) free((void *)t->x[cell]);
    free(g);
    *dx = t->dx;
    return TPK_OK;
}

/* The same micro-batches through all U virtual stages on one rank, in order: per micro-batch the
 * forward through every stage, then the backward (gradients summed in micro-batch order). */
static void toy_reference(int U, int M, int dpr, int64_t lo, int64_t n, float *ga, float *gb,
                          float *loss) {
    float *y = (float *)malloc(sizeof(float) * (size_t)(U + 1) * (size_t)n);
    float *g = (float *)malloc(sizeof(float) * (size_t)n),
          *d = (float *)malloc(sizeof(float) * (size_t)n);
    float *tg = (float *)malloc(sizeof(float) * (size_t)n);
    for (int u = 0; u < U; u++) ga[u] = gb[u] = 0;
    for (int k = 0; k < M; k++) {
        for (int64_t j = 0; j < n; j++)
            y[j] = toy_in(dpr, k, lo + j), tg[j] = toy_tgt(dpr, k, lo + j);
        for (int u = 0; u < U; u++) toy_fwd(u, y + (size_t)u * n, y + (size_t)(u + 1) * n, n);
        loss[k] = toy_loss(y + (size_t)U * n, tg, g, n);
        for (int u = U - 1; u >= 0; u--) {
            toy_bwd(u, y + (size_t)u * n, y + (size_t)(u + 1) * n, g, d, &ga[u], &gb[u], n);
            memcpy(g, d, sizeof(float) * (size_t)n);
        }
    }
    free(y), free(g), free(d), free(tg);
}

static void run_toy(tpk_comm *world, int tp, int pp, tpk_pipe_kind kind, int M, int V) {
    tpk_ctx ctx;
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.world = world, d.tp = tp, d.pp = pp;
    CHECK_OK(&ctx, tpk_ctx_init(&ctx, &d));
    tpk_pipe_schedule s;
    CHECK_OK(&ctx, tpk_pipe_schedule_make(&ctx, &s, kind, pp, M, V));
    toy t;
    memset(&t, 0, sizeof t);
    tpk_range rg = tpk_tp_split(&ctx, NX, ctx.tp.rank);
    t.P = pp, t.V = V, t.M = M, t.U = pp * V, t.lo = rg.off, t.nloc = rg.size;
    t.stage = ctx.pp.rank, t.dpr = ctx.dp.rank;
    t.y = (float *)malloc(sizeof(float) * (size_t)(V * M) * (size_t)t.nloc);
    t.x = (const float **)calloc((size_t)(V * M), sizeof *t.x);
    t.dx = (float *)malloc(sizeof(float) * (size_t)t.nloc);
    tpk_pipe_stage st;
    memset(&st, 0, sizeof st);
    st.count = (size_t)t.nloc, st.dtype = TPK_F32, st.forward = toy_forward,
    st.backward = toy_backward, st.user = &t;
    tpk_pipe p;
    memset(&p, 0, sizeof p);
    for (int rep = 0; rep < 2; rep++) { /* twice: the executor's buffers are reused */
        memset(t.ga, 0, sizeof t.ga), memset(t.gb, 0, sizeof t.gb);
        tpk_comm_stats_reset(&ctx.pp);
        CHECK_OK(&ctx, tpk_pipe_run(&ctx, &p, &s, &st));
    }
    float ga[64], gb[64], loss[64];
    toy_reference(t.U, M, t.dpr, t.lo, t.nloc, ga, gb, loss);
    int bad = 0;
    for (int c = 0; c < V; c++) {
        int u = c * pp + t.stage;
        bad += memcmp(&t.ga[c], &ga[u], sizeof(float)) || memcmp(&t.gb[c], &gb[u], sizeof(float));
    }
    if (t.stage == pp - 1)
        for (int k = 0; k < M; k++) bad += memcmp(&t.loss[k], &loss[k], sizeof(float)) != 0;
    int sends, recvs;
    tpk_pipe_messages(&s, t.stage, &sends, &recvs);
    CHECK(bad == 0,
          "%s tp=%d pp=%d M=%d V=%d: %d gradients or losses differ from the run without a pipeline",
          tpk_pipe_kind_name(kind), tp, pp, M, V, bad);
    CHECK(ctx.pp.stats.calls[TPK_COLL_SEND] == (uint64_t)sends &&
              ctx.pp.stats.calls[TPK_COLL_RECV] == (uint64_t)recvs &&
              ctx.pp.stats.elems[TPK_COLL_SEND] == (uint64_t)sends * (uint64_t)t.nloc,
          "%s pp=%d M=%d: %llu sends, %llu receives, expected %d, %d", tpk_pipe_kind_name(kind), pp,
          M, (unsigned long long)ctx.pp.stats.calls[TPK_COLL_SEND],
          (unsigned long long)ctx.pp.stats.calls[TPK_COLL_RECV], sends, recvs);
    CHECK(pp == 1 || sends > 0, "no messages at pp = %d", pp);
    tpk_pipe_free(&ctx, &p);
    tpk_pipe_schedule_free(&s);
    free(t.y), free(t.x), free(t.dx);
    tpk_ctx_destroy(&ctx);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int me = test__rank, np = test__size;
    tpk_comm world;
    tpk_ctx ctx;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK ||
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}) != TPK_OK) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }

    TEST_CASE("schedules: the published orders") {
        check_order(TPK_PIPE_GPIPE, 2, 3, 1, 1, "F0 F1 F2 B0 B1 B2");
        check_order(TPK_PIPE_1F1B, 4, 8, 1, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
        check_order(TPK_PIPE_1F1B, 4, 8, 1, 1, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
        check_order(TPK_PIPE_1F1B, 4, 8, 1, 3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
        check_order(TPK_PIPE_1F1B, 4, 2, 1, 0, "F0 F1 B0 B1"); /* M < P */
        check_order(
            TPK_PIPE_INTERLEAVED, 2, 4, 2, 0,
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
        check_order(
            TPK_PIPE_INTERLEAVED, 2, 4, 2, 1,
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
        /* M = P: all forwards first */
        check_order(TPK_PIPE_INTERLEAVED, 2, 2, 2, 1, "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
        /* the messages, in batches */
        tpk_pipe_schedule s;
        CHECK_OK(&ctx, tpk_pipe_schedule_make(&ctx, &s, TPK_PIPE_1F1B, 2, 2, 1));
        char buf[1024] = "";
        FILE *f = tmpfile();
        if (f) {
            tpk_pipe_print(&s, true, f);
            rewind(f);
            buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
            fclose(f);
        }
        CHECK(strstr(buf, "stage 0: F0 [>a0] F1 [>a1 <g0] B0 [<g1] B1\n") &&
                  strstr(buf, "stage 1: [<a0] F0 B0 [>g0 <a1] F1 B1 [>g1]\n"),
              "printed:\n%s", buf);
        tpk_pipe_schedule_free(&s);
    }

    TEST_CASE("schedules: every one plays through (and its forwards alone); bubble against theory; "
              "1F1B's live bound") {
        int bad = 0, runs = 0;
        for (int kind = 0; kind < TPK_PIPE_KINDS; kind++)
            for (int P = 1; P <= 5; P++)
                for (int M = 1; M <= 12; M++)
                    for (int V = 1; V <= 3; V++) {
                        if ((kind == TPK_PIPE_INTERLEAVED) != (V > 1)) continue;
                        if (kind == TPK_PIPE_INTERLEAVED && (M % P || P < 2)) continue;
                        tpk_pipe_schedule s;
                        if (tpk_pipe_schedule_make(&ctx, &s, (tpk_pipe_kind)kind, P, M, V) !=
                            TPK_OK) {
                            bad++;
                            continue;
                        }
                        double idle[8], span = 0;
                        tpk_status st = tpk_pipe_check(&ctx, &s, 1, 2, idle, &span);
                        runs++;
                        if (st != TPK_OK) {
                            bad++;
                            fprintf(stderr, "  %s P=%d M=%d V=%d: %s\n",
                                    tpk_pipe_kind_name((tpk_pipe_kind)kind), P, M, V,
                                    tpk_last_error(&ctx));
                        }
                        double theory = (double)(P - 1) / (double)(M * V + P - 1);
                        if (st == TPK_OK && kind != TPK_PIPE_INTERLEAVED &&
                            fabs(idle[0] / span - theory) > 1e-12) {
                            bad++;
                            fprintf(stderr, "  %s P=%d M=%d: bubble %g, theory %g\n",
                                    tpk_pipe_kind_name((tpk_pipe_kind)kind), P, M, idle[0] / span,
                                    theory);
                        }
                        /* interleaved: the warm-up's (P - 1) divided by V (Narayanan et al. 2021),
                           exactly when M > P (M = P runs every forward first) */
                        double ti = (double)(P - 1) / V / ((double)M + (double)(P - 1) / V);
                        if (st == TPK_OK && kind == TPK_PIPE_INTERLEAVED && M > P &&
                            fabs(idle[0] / span - ti) > 1e-12) {
                            bad++;
                            fprintf(stderr, "  interleaved P=%d M=%d V=%d: bubble %g, theory %g\n",
                                    P, M, V, idle[0] / span, ti);
                        }
                        for (int r = 0; kind == TPK_PIPE_1F1B && r < P; r++) {
                            int live = 0, most = 0;
                            for (int i = 0; i < s.n[r]; i++) {
                                live += s.step[r][i].action == TPK_PIPE_F;
                                live -= s.step[r][i].action == TPK_PIPE_B;
                                most = live > most ? live : most;
                            }
                            if (most > (P - r < M ? P - r : M)) bad++;
                        }
                        tpk_pipe_schedule_free(&s);
                        /* and the forwards alone (evaluation) */
                        if (tpk_pipe_schedule_forward(&ctx, &s, (tpk_pipe_kind)kind, P, M, V) !=
                                TPK_OK ||
                            tpk_pipe_check(&ctx, &s, 1, 2, NULL, NULL) != TPK_OK) {
                            bad++;
                            fprintf(stderr, "  forward-only %s P=%d M=%d V=%d: %s\n",
                                    tpk_pipe_kind_name((tpk_pipe_kind)kind), P, M, V,
                                    tpk_last_error(&ctx));
                        }
                        for (int r = 0; s.n && r < P; r++)
                            for (int i = 0; i < s.n[r]; i++)
                                bad += s.step[r][i].action == TPK_PIPE_B ||
                                       s.step[r][i].action >= TPK_PIPE_RECV_GRAD;
                        tpk_pipe_schedule_free(&s);
                    }
        CHECK(bad == 0 && runs > 100, "%d of %d schedules failed", bad, runs);
    }

    TEST_CASE("schedules: faults are caught (order, a missing step, a deadlock)") {
        tpk_pipe_schedule s;
        CHECK_OK(&ctx, tpk_pipe_schedule_make(&ctx, &s, TPK_PIPE_1F1B, 3, 4, 1));
        CHECK_OK(&ctx, tpk_pipe_check(&ctx, &s, 1, 2, NULL, NULL));
        /* stage 1's first two receives of activations swapped: the tags disagree */
        int a = -1, b = -1;
        for (int i = 0; i < s.n[1]; i++)
            if (s.step[1][i].action == TPK_PIPE_RECV_ACT) {
                if (a < 0) a = i;
                else if (b < 0) b = i;
            }
        int k = s.step[1][a].mb;
        s.step[1][a].mb = s.step[1][b].mb, s.step[1][b].mb = k;
        CHECK(tpk_pipe_check(&ctx, &s, 1, 2, NULL, NULL) == TPK_ERR_ARG, "swapped receives passed");
        s.step[1][b].mb = s.step[1][a].mb, s.step[1][a].mb = k;
        /* a backward dropped from stage 2 */
        int n2 = s.n[2], j = 0;
        while (s.step[2][j].action != TPK_PIPE_B) j++;
        tpk_pipe_step keep = s.step[2][j];
        memmove(&s.step[2][j], &s.step[2][j + 1], sizeof keep * (size_t)(n2 - j - 1));
        s.n[2] = n2 - 1;
        CHECK(tpk_pipe_check(&ctx, &s, 1, 2, NULL, NULL) == TPK_ERR_ARG, "a missing step passed");
        memmove(&s.step[2][j + 1], &s.step[2][j], sizeof keep * (size_t)(n2 - j - 1));
        s.step[2][j] = keep, s.n[2] = n2;
        CHECK_OK(&ctx, tpk_pipe_check(&ctx, &s, 1, 2, NULL, NULL));
        /* stage 0 waits for its first gradient before its first forward: a deadlock */
        for (j = 0; s.step[0][j].action != TPK_PIPE_RECV_GRAD; j++) {}
        keep = s.step[0][j];
        memmove(&s.step[0][1], &s.step[0][0], sizeof keep * (size_t)j);
        s.step[0][0] = keep;
        tpk_status st = tpk_pipe_check(&ctx, &s, 1, 2, NULL, NULL);
        CHECK(st == TPK_ERR_ARG && strstr(tpk_last_error(&ctx), "deadlock"), "got %s",
              tpk_last_error(&ctx));
        tpk_pipe_schedule_free(&s);
    }

    TEST_CASE("schedules: bad input names the value") {
        tpk_pipe_schedule s;
        CHECK(tpk_pipe_schedule_make(&ctx, &s, TPK_PIPE_INTERLEAVED, 4, 6, 2) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "multiple of the 4 stages, got 6"),
              "%s", tpk_last_error(&ctx));
        CHECK(tpk_pipe_schedule_make(&ctx, &s, TPK_PIPE_INTERLEAVED, 2, 4, 1) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "got 1"),
              "%s", tpk_last_error(&ctx));
        CHECK(tpk_pipe_schedule_make(&ctx, &s, TPK_PIPE_1F1B, 2, 4, 2) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "V = 1"),
              "%s", tpk_last_error(&ctx));
        CHECK(tpk_pipe_schedule_make(&ctx, &s, TPK_PIPE_1F1B, 0, 4, 1) == TPK_ERR_ARG, "P = 0");
        CHECK(tpk_pipe_schedule_make(&ctx, &s, TPK_PIPE_GPIPE, 2, 0, 1) == TPK_ERR_ARG, "M = 0");
        tpk_pipe_kind k;
        CHECK(tpk_pipe_kind_parse("1f1b", &k) && k == TPK_PIPE_1F1B &&
                  !tpk_pipe_kind_parse("pipedream", &k),
              "parse");
    }

    TEST_CASE("split: even, a list, balanced by cost (the optimum), bad lists") {
        int64_t first[9];
        CHECK_OK(&ctx, tpk_pipe_split(&ctx, 10, 4, NULL, NULL, 0, 0, first));
        CHECK(first[1] == 2 && first[2] == 5 && first[3] == 8 && first[4] == 10,
              "even: %lld %lld %lld %lld", (long long)first[1], (long long)first[2],
              (long long)first[3], (long long)first[4]);
        int64_t counts[3] = {5, 7, 0};
        CHECK_OK(&ctx, tpk_pipe_split(&ctx, 12, 2, counts, NULL, 0, 0, first));
        CHECK(first[1] == 5 && first[2] == 12, "list");
        CHECK(tpk_pipe_split(&ctx, 12, 3, counts, NULL, 0, 0, first) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "entry 2 is 0"),
              "%s", tpk_last_error(&ctx));
        counts[2] = 1;
        CHECK(tpk_pipe_split(&ctx, 12, 3, counts, NULL, 0, 0, first) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "entry 2 is 1, expected every stage to hold >= 1 "
                                               "block and the 3 counts to add up to the 12 blocks"),
              "%s", tpk_last_error(&ctx));
        CHECK(tpk_pipe_split(&ctx, 3, 4, NULL, NULL, 0, 0, first) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "4 virtual stages"),
              "%s", tpk_last_error(&ctx));
        /* balanced: the costliest stage of the split costs the least possible (all splits tried) */
        int bad = 0;
        for (int trial = 0; trial < 60; trial++) {
            int L = 3 + trial % 7, U = 1 + trial % 4;
            if (U > L) continue;
            double cost[16], cf = tpk_rng_uniform(3, 1, (uint64_t)trial) * 4,
                             cl = tpk_rng_uniform(3, 2, (uint64_t)trial) * 6;
            for (int i = 0; i < L; i++)
                cost[i] = 0.5 + tpk_rng_uniform(3, 3, (uint64_t)(trial * 16 + i));
            CHECK_OK(&ctx, tpk_pipe_split(&ctx, L, U, NULL, cost, cf, cl, first));
            double got = 0, best = 1e30;
            for (int u = 0; u < U; u++) {
                double c = (u == 0 ? cf : 0) + (u == U - 1 ? cl : 0);
                for (int64_t i = first[u]; i < first[u + 1]; i++) c += cost[i];
                if (first[u + 1] <= first[u]) c = 1e30;
                got = c > got ? c : got;
            }
            /* brute force over the cut positions: bits of a mask of L - 1 possible cuts */
            for (unsigned m = 0; m < 1u << (L - 1); m++) {
                if (__builtin_popcount(m) != U - 1) continue;
                double worst = 0, c = cf;
                int u = 0;
                for (int i = 0; i < L; i++) {
                    c += cost[i];
                    if (i == L - 1 || (m >> i & 1)) {
                        if (i == L - 1) c += cl;
                        worst = c > worst ? c : worst, c = 0, u++;
                    }
                }
                best = worst < best ? worst : best;
            }
            bad += got > best * (1 + 1e-9);
        }
        CHECK(bad == 0, "%d balanced splits worse than the optimum", bad);
    }

    TEST_CASE("p2p: a ring of batches (two tags, f32 and bf16), started and waited, counters") {
        if (np > 1) {
            enum { N = 333 };
            float *s1 = malloc(sizeof(float) * N), *r1 = malloc(sizeof(float) * N);
            uint16_t s2[17], r2[17];
            for (int i = 0; i < N; i++) s1[i] = tpk_rng_normal(5, (uint64_t)me, (uint64_t)i);
            for (int i = 0; i < 17; i++)
                s2[i] = tpk_f32_to_bf16((float)(me * 20 + i)); /* exact in bf16 */
            test_poison(r1, N);
            int nx = (me + 1) % np, pv = (me + np - 1) % np;
            tpk_p2p ops[4] = {{r2, 17, TPK_BF16, pv, 9, false},
                              {s1, N, TPK_F32, nx, 3, true},
                              {r1, N, TPK_F32, pv, 3, false},
                              {s2, 17, TPK_BF16, nx, 9, true}};
            tpk_comm_stats_reset(&ctx.tp);
            tpk_request req;
            memset(&req, 0, sizeof req);
            CHECK_OK(&ctx, tpk_p2p_start(&ctx, &ctx.tp, ops, 4, &req));
            CHECK_OK(&ctx, tpk_wait(&ctx, &req));
            int bad = 0;
            for (int i = 0; i < N; i++)
                bad += r1[i] != tpk_rng_normal(5, (uint64_t)pv, (uint64_t)i);
            for (int i = 0; i < 17; i++) bad += tpk_bf16_to_f32(r2[i]) != (float)(pv * 20 + i);
            CHECK(bad == 0, "%d values wrong", bad);
            CHECK(ctx.tp.stats.calls[TPK_COLL_SEND] == 2 &&
                      ctx.tp.stats.calls[TPK_COLL_RECV] == 2 &&
                      ctx.tp.stats.bytes[TPK_COLL_SEND] == N * 4 + 17 * 2,
                  "counters");
            /* the blocking forms, one part each: ranks 2i send to 2i + 1 */
            if (me % 2 == 0 && me + 1 < np) {
                CHECK_OK(&ctx, tpk_send(&ctx, &ctx.tp, s1, N, TPK_F32, me + 1, 0));
            } else if (me % 2 == 1) {
                test_poison(r1, N);
                CHECK_OK(&ctx, tpk_recv(&ctx, &ctx.tp, r1, N, TPK_F32, me - 1, 0));
                bad = 0;
                for (int i = 0; i < N; i++)
                    bad += r1[i] != tpk_rng_normal(5, (uint64_t)(me - 1), (uint64_t)i);
                CHECK(bad == 0, "send/recv: %d wrong", bad);
            }
            free(s1), free(r1);
        }
        /* bad arguments: this rank, out of range, a tag, no entry; one rank (self) has no peer */
        float v = 1;
        tpk_comm self = tpk_comm_self(false);
        CHECK(tpk_send(&ctx, &self, &v, 1, TPK_F32, 0, 0) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&ctx), "other than this rank 0"),
              "%s", tpk_last_error(&ctx));
        CHECK(tpk_send(&ctx, &ctx.tp, &v, 1, TPK_F32, np, 0) == TPK_ERR_ARG, "peer out of range");
        CHECK(tpk_send(&ctx, &ctx.tp, &v, 1, TPK_F32, (me + 1) % np, -1) == TPK_ERR_ARG || np == 1,
              "tag -1");
        tpk_comm_vtable vt = *world.vt;
        vt.p2p = NULL;
        tpk_comm w2 = world;
        w2.vt = &vt;
        CHECK(np == 1 || (tpk_send(&ctx, &w2, &v, 1, TPK_F32, (me + 1) % np, 0) == TPK_ERR_ARG &&
                          strstr(tpk_last_error(&ctx), "no point-to-point entry")),
              "%s", tpk_last_error(&ctx));
        tpk_ctx c2;
        CHECK(np == 1 ||
                  (tpk_ctx_init(&c2, &(tpk_ctx_desc){.world = &w2, .pp = np}) == TPK_ERR_ARG &&
                   strstr(tpk_last_error(&c2), "no p2p entry")),
              "%s", tpk_last_error(&c2));
    }

    TEST_CASE("mesh: world rank = tp + t (dp + d pp); the groups; bad sizes") {
        for (int tp = 1; tp <= np; tp++)
            for (int pp = 1; pp <= np; pp++) {
                if (np % (tp * pp)) continue;
                int dp = np / tp / pp;
                tpk_ctx c;
                CHECK_OK(&c,
                         tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .pp = pp}));
                CHECK(c.tp.size == tp && c.pp.size == pp && c.dp.size == dp &&
                          c.tp.rank == me % tp && c.dp.rank == me / tp % dp &&
                          c.pp.rank == me / (tp * dp),
                      "tp %d pp %d: ranks %d %d %d", tp, pp, c.tp.rank, c.dp.rank, c.pp.rank);
                /* the PP group's members: the same TP and DP rank, every stage */
                int32_t w[8] = {0};
                w[c.pp.rank] = me;
                CHECK_OK(&c, tpk_allreduce_host(&c, &c.pp, w, (size_t)pp, TPK_I32, TPK_SUM));
                for (int s = 0; s < pp; s++)
                    CHECK(w[s] == c.tp.rank + tp * (c.dp.rank + dp * s),
                          "stage %d is world rank %d", s, w[s]);
                tpk_ctx_destroy(&c);
            }
        tpk_ctx c;
        CHECK(tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .pp = np + 1}) == TPK_ERR_ARG &&
                  strstr(tpk_last_error(&c), "desc->pp"),
              "%s", tpk_last_error(&c));
        if (np == 4)
            CHECK(tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = 2, .pp = 4}) ==
                          TPK_ERR_ARG &&
                      strstr(tpk_last_error(&c), "4 / 2 = 2"),
                  "%s", tpk_last_error(&c));
    }

    TEST_CASE(
        "executor: a toy pipeline under every schedule equals the run without one, bit for bit") {
        for (int tp = 1; tp <= np; tp++)
            for (int pp = 1; pp <= np; pp++) {
                if (np % (tp * pp)) continue;
                int Ms[3] = {pp, 2 * pp + 1, 1};
                for (int kind = 0; kind < TPK_PIPE_KINDS - (pp < 2); kind++)
                    for (int mi = 0; mi < 3; mi++) {
                        int M = Ms[mi], V = kind == TPK_PIPE_INTERLEAVED ? 2 : 1;
                        if (kind == TPK_PIPE_INTERLEAVED && M % pp) M = 2 * pp;
                        run_toy(&world, tp, pp, (tpk_pipe_kind)kind, M, V);
                    }
            }
    }

    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return test_finish();
}
