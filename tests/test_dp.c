/* tests/test_dp.c — the checked data-parallel protocol of tpk/train/dp.h, at TP t = 1 and 2 with
 * DP = ranks / t (DP > 1 wherever the rank count allows; DP 1 at one rank and at 2 ranks x t = 2):
 *   a correct protocol over M = 3 micro-batches (tpk_dp_begin, the hook's buckets in the
 *     backward's order, tpk_dp_finish) gives every gradient equal to the sum over the DP replicas
 *     and the micro-batches of each one's random gradient, against a double-precision sum of the
 *     global tensors (gathered over TP, poisoned first); so do one bucket (tpk_dp_grad_ready_all)
 *     after tpk_dp_init, a pipeline's windows (`active` set around each chunk's last micro-batch,
 *     no tpk_dp_begin), and tpk_train_step finishing a begun step itself (its gradient norm equal
 *     to the reference sum's);
 *   each misuse refused with TPK_ERR_ARG and a message naming the parameter, at every DP size: no
 *     tpk_dp_begin (tpk_dp_finish; tpk_train_step at DP > 1, accepted at DP 1 where nothing is
 *     reduced), only micro-batches that are not the last, one range never reported, a range
 *     reported twice, overlapping ranges (no all-reduce started for the refused one), a refusal
 *     kept for tpk_dp_finish, tpk_dp_finish twice, tpk_adamw_step on gradients whose reduction
 *     was begun and not finished, a window of a pipeline missing a range, Adasum buckets missing a
 *     range (DP a power of two);
 *   a pipeline stage (PP 2) at one DP rank may finish with nothing begun, not at DP 2. */
#include "test.h"

#include <tpk/train/train.h>

static int me, np;
static tpk_comm world;
enum { NP = 5, M = 3 };

/* w [6, 10] S(0), b [10] R, e [9, 4] S(0), g [4] R, h [8, 6] S(1) */
static void add_params(tpk_ctx *ctx) {
    static const struct {
        const char *name;
        int ndim;
        int64_t d0, d1;
        int split;
    } P[NP] = {{"w", 2, 6, 10, 0},
               {"b", 1, 10, 0, -1},
               {"e", 2, 9, 4, 0},
               {"g", 1, 4, 0, -1},
               {"h", 2, 8, 6, 1}};
    for (int i = 0; i < NP; i++) {
        int id;
        CHECK_OK(ctx, tpk__param_add(ctx, P[i].name, P[i].ndim, P[i].d0, P[i].d1,
                                     P[i].split < 0 ? TPK_R : TPK_S(P[i].split), TPK_INIT_NORMAL,
                                     0.5f, true, &id));
    }
}

/* Replica r's gradient of parameter i on micro-batch k, element e of the global tensor. */
static float grad_of(int r, int k, int i, size_t e) {
    return tpk_rng_normal(100 + (uint64_t)k, (uint64_t)(r * 64 + i), e);
}

/* The backward of parameters first..last on micro-batch k: this replica's gradient added into the
 * flat gradient buffer (this rank's shards). */
static void backward(tpk_ctx *ctx, int k, int first, int last) {
    float *tmp = calloc(ctx->params.numel, 4), *g = (float *)ctx->params.grad.p;
    for (int i = first; i <= last; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        float *glob = malloc(gn * 4);
        for (size_t e = 0; e < gn; e++) glob[e] = grad_of(ctx->dp.rank, k, i, e);
        CHECK_OK(ctx, tpk_param_scatter(ctx, i, glob, tmp));
        const tpk_param *p = &ctx->params.list[i];
        for (size_t e = p->offset; e < p->offset + p->numel; e++) g[e] += tmp[e];
        free(glob);
    }
    free(tmp);
}

/* The buckets of a backward, in its order (the last parameters first). */
static const int bucket[3][2] = {{3, 4}, {1, 2}, {0, 0}};

/* Every gradient (gathered over TP) against the double sum over the DP replicas and micro-batches
 * k0..k1-1; *normsq (may be NULL) = the squared norm of that sum. */
static void check_sums(tpk_ctx *ctx, int k0, int k1, const char *what, double *normsq) {
    double nsq = 0;
    for (int i = 0; i < NP; i++) {
        size_t gn = tpk_param_global_numel(ctx, i);
        float *got = malloc(gn * 4), *want = malloc(gn * 4);
        test_poison(got, gn);
        CHECK_OK(ctx, tpk_param_get_global(ctx, i, true, got));
        for (size_t e = 0; e < gn; e++) {
            double s = 0;
            for (int r = 0; r < ctx->dp.size; r++)
                for (int k = k0; k < k1; k++) s += grad_of(r, k, i, e);
            want[e] = (float)s, nsq += s * s;
        }
        char msg[160];
        snprintf(msg, sizeof msg, "%s: the gradient of %s", what, ctx->params.list[i].name);
        CHECK_CLOSE(got, want, gn, 1e-5, msg);
        free(got), free(want);
    }
    if (normsq) *normsq = nsq;
}

/* A fresh step: the gradients zeroed. */
static void zero_grads(tpk_ctx *ctx) { CHECK_OK(ctx, tpk_params_zero_grad(ctx)); }

/* The step's last micro-batch (k = M - 1) with every bucket but `skip` (-1: none) reported. */
static void last_backward(tpk_ctx *ctx, tpk_dp_buckets *b, int skip) {
    for (int q = 0; q < 3; q++) {
        backward(ctx, M - 1, bucket[q][0], bucket[q][1]);
        if (q != skip) CHECK_OK(ctx, tpk_dp_grad_ready(ctx, bucket[q][0], bucket[q][1], b));
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;

    for (int tp = 1; tp <= 2; tp++) {
        if (np % tp || (tp > 1 && np == 1)) continue;
        int dp = np / tp;
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = tp, .seed = 7}));
        add_params(&ctx);
        char w_etc[96]; /* how the messages name the whole registry */
        snprintf(w_etc, sizeof w_etc, "parameter \"w\" and the %d others this rank holds", NP - 1);

        TEST_CASE("DP %d x TP %d: begin, the hook's buckets, finish over %d micro-batches give the "
                  "sum over the DP replicas",
                  dp, tp, M) {
            tpk_dp_buckets b = {0};
            zero_grads(&ctx);
            tpk_comm_stats_reset(&ctx.dp);
            for (int k = 0; k < M; k++) {
                CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, k == M - 1));
                for (int q = 0; q < 3; q++) {
                    backward(&ctx, k, bucket[q][0], bucket[q][1]);
                    CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, bucket[q][0], bucket[q][1], &b));
                }
                if (k < M - 1)
                    CHECK(ctx.dp.stats.calls[TPK_COLL_ALLREDUCE] == 0,
                          "micro-batch %d (not the last) started %llu all-reduces", k,
                          (unsigned long long)ctx.dp.stats.calls[TPK_COLL_ALLREDUCE]);
            }
            CHECK(ctx.params.dp_open, "the reduction begun is not marked open");
            CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
            CHECK(!ctx.params.dp_open, "the reduction finished is still marked open");
            CHECK(ctx.dp.stats.calls[TPK_COLL_ALLREDUCE] == (dp > 1 ? 3u : 0u),
                  "%llu all-reduces for 3 buckets at DP %d",
                  (unsigned long long)ctx.dp.stats.calls[TPK_COLL_ALLREDUCE], dp);
            check_sums(&ctx, 0, M, "3 buckets", NULL);
            tpk_dp_destroy(&b);
        }

        TEST_CASE("DP %d x TP %d: tpk_dp_init and one bucket (tpk_dp_grad_ready_all) after the "
                  "backward; the next step begins after the finish",
                  dp, tp) {
            tpk_dp_buckets b = {0};
            CHECK_OK(&ctx, tpk_dp_init(&ctx, &b));
            CHECK(b.words == 1 && b.seen, "tpk_dp_init made %d words for %d parameters", b.words,
                  NP);
            for (int step = 0; step < 2; step++) {
                zero_grads(&ctx);
                for (int k = 0; k < M; k++) {
                    CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, k == M - 1));
                    backward(&ctx, k, 0, NP - 1);
                }
                CHECK_OK(&ctx, tpk_dp_grad_ready_all(&ctx, &b));
                CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
                check_sums(&ctx, 0, M, step ? "one bucket, second step" : "one bucket", NULL);
            }
            tpk_dp_destroy(&b);
        }

        TEST_CASE("DP %d x TP %d: a pipeline's windows (active around each chunk's last "
                  "micro-batch, no begin) are recorded and checked",
                  dp, tp) {
            tpk_dp_buckets b = {0};
            zero_grads(&ctx);
            /* chunk 1 holds parameters 3..4, chunk 0 parameters 0..2; micro-batches interleave */
            for (int k = 0; k < M; k++)
                for (int c = 1; c >= 0; c--) {
                    int lo = c ? 3 : 0, hi = c ? 4 : 2;
                    b.active = k == M - 1;
                    backward(&ctx, k, lo, hi);
                    CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, lo, hi, &b));
                    b.active = false;
                }
            CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
            check_sums(&ctx, 0, M, "pipeline windows", NULL);
            /* a window that misses parameter 1: refused */
            b.active = true;
            CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 2, 4, &b));
            CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 0, 0, &b));
            b.active = false;
            CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG,
                        "parameter \"b\" (id 1): never reported (tpk_dp_grad_ready) on the "
                        "step's last micro-batch");
            tpk_dp_destroy(&b);
        }

        TEST_CASE("DP %d x TP %d: tpk_train_step finishes a begun step itself; its norm is the "
                  "reference sum's",
                  dp, tp) {
            tpk_dp_buckets b = {0};
            tpk_adamw o;
            CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
            zero_grads(&ctx);
            for (int k = 0; k < M; k++) {
                CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, k == M - 1));
                if (k < M - 1) backward(&ctx, k, 0, NP - 1);
            }
            last_backward(&ctx, &b, -1);
            double norm = -1, nsq = 0;
            CHECK_OK(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 0.0f, 1.0f, &norm));
            check_sums(&ctx, 0, M, "after tpk_train_step", &nsq);
            CHECK(fabs(norm - sqrt(nsq)) <= 1e-5 * sqrt(nsq), "norm %.9g, the sum's %.9g", norm,
                  sqrt(nsq));
            CHECK(b.state == TPK_DP_IDLE, "the buckets after the step: state %d", (int)b.state);
            tpk_adamw_destroy(&ctx, &o);
            tpk_dp_destroy(&b);
        }

        TEST_CASE("DP %d x TP %d: no begin, or no last micro-batch begun: refused naming the "
                  "parameter",
                  dp, tp) {
            tpk_dp_buckets b = {0};
            tpk_adamw o;
            CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
            zero_grads(&ctx);
            for (int k = 0; k < M; k++) last_backward(&ctx, &b, -1); /* the hook, no begin */
            CHECK(!ctx.params.dp_open, "marked open without a begin");
            char want[320];
            snprintf(want, sizeof want,
                     "tpk_dp_finish: no tpk_dp_begin this step: the gradients "
                     "of %s are not reduced over DP",
                     w_etc);
            CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG, want);
            float *w0 = malloc(ctx.params.numel * 4);
            memcpy(w0, ctx.params.data.p, ctx.params.numel * 4);
            if (dp > 1) {
                snprintf(want, sizeof want,
                         "tpk_train_step: buckets: no tpk_dp_begin this step: the gradients of "
                         "%s are not reduced over the %d DP ranks",
                         w_etc, dp);
                CHECK_FAILS(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, NULL),
                            TPK_ERR_ARG, want);
                CHECK(!memcmp(w0, ctx.params.data.p, ctx.params.numel * 4),
                      "a refused step changed the weights");
            } else { /* one DP rank, nothing begun: nothing to reduce (a model without the hook) */
                CHECK_OK(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, NULL));
            }
            /* micro-batches begun, none as the last */
            memcpy(w0, ctx.params.data.p, ctx.params.numel * 4);
            for (int k = 0; k < M; k++) {
                CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, false));
                last_backward(&ctx, &b, -1);
            }
            snprintf(want, sizeof want,
                     "tpk_train_step: buckets: no micro-batch of this step was begun as the last "
                     "(tpk_dp_begin(ctx, b, true)): the gradients of %s",
                     w_etc);
            CHECK_FAILS(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, NULL), TPK_ERR_ARG,
                        want);
            CHECK(!memcmp(w0, ctx.params.data.p, ctx.params.numel * 4),
                  "a refused step changed the weights");
            CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, false));
            CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG,
                        "tpk_dp_finish: no micro-batch of this step was begun as the last");
            free(w0);
            tpk_adamw_destroy(&ctx, &o);
            tpk_dp_destroy(&b);
        }

        TEST_CASE("DP %d x TP %d: a range never reported: refused naming the parameter", dp, tp) {
            tpk_dp_buckets b = {0};
            tpk_adamw o;
            CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
            for (int via_step = 0; via_step < 2; via_step++) {
                zero_grads(&ctx);
                CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true));
                last_backward(&ctx, &b, 1); /* parameters 1..2 not reported */
                const char *want = "tpk_dp_finish: parameter \"b\" (id 1): never reported "
                                   "(tpk_dp_grad_ready) on the step's last micro-batch: its "
                                   "gradient is not reduced over DP (2 of 5 parameters not "
                                   "reported)";
                if (via_step)
                    CHECK_FAILS(&ctx, tpk_train_step(&ctx, &o, &b, 1e-3f, 1.0f, 1.0f, NULL),
                                TPK_ERR_ARG, want);
                else CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG, want);
                CHECK(!ctx.params.dp_open && b.state == TPK_DP_IDLE,
                      "after the refusal: open %d, state %d", ctx.params.dp_open, (int)b.state);
            }
            CHECK(o.step == 0, "a refused step counted: step %lld", (long long)o.step);
            tpk_adamw_destroy(&ctx, &o);
            tpk_dp_destroy(&b);
        }

        TEST_CASE("DP %d x TP %d: a range reported twice, overlapping ranges: refused naming the "
                  "parameter, nothing started for them, the refusal kept for tpk_dp_finish",
                  dp, tp) {
            tpk_dp_buckets b = {0};
            zero_grads(&ctx);
            tpk_comm_stats_reset(&ctx.dp);
            CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true));
            backward(&ctx, 0, 0, NP - 1);
            CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 3, 4, &b));
            CHECK_FAILS(&ctx, tpk_dp_grad_ready(&ctx, 3, 4, &b), TPK_ERR_ARG,
                        "tpk_dp_grad_ready: parameter \"g\" (id 3): reported twice on the step's "
                        "last micro-batch (first, last = 3, 4 overlaps an earlier report): its "
                        "gradient would be reduced over DP twice");
            CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 0, 1, &b));
            CHECK_FAILS(&ctx, tpk_dp_grad_ready(&ctx, 1, 2, &b), TPK_ERR_ARG,
                        "parameter \"b\" (id 1): reported twice on the step's last micro-batch "
                        "(first, last = 1, 2 overlaps");
            CHECK_FAILS(&ctx, tpk_dp_grad_ready(&ctx, 2, 4, &b), TPK_ERR_ARG,
                        "parameter \"g\" (id 3): reported twice");
            CHECK(ctx.dp.stats.calls[TPK_COLL_ALLREDUCE] == (dp > 1 ? 2u : 0u),
                  "%llu all-reduces started (2 ranges accepted)",
                  (unsigned long long)ctx.dp.stats.calls[TPK_COLL_ALLREDUCE]);
            CHECK_OK(&ctx, tpk_dp_grad_ready(&ctx, 2, 2, &b)); /* now every parameter once */
            CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG,
                        "tpk_dp_finish: a report of the step's last micro-batch was refused, the "
                        "reduction is not whole: tpk_dp_grad_ready: parameter \"g\" (id 3): "
                        "reported twice");
            CHECK(!ctx.params.dp_open, "open after the refused finish");
            /* each parameter was reduced once all the same (the refused reports started nothing) */
            check_sums(&ctx, 0, 1, "after the refused reports", NULL);
            tpk_dp_destroy(&b);
        }

        TEST_CASE("DP %d x TP %d: tpk_dp_finish twice, tpk_adamw_step before the finish: refused "
                  "naming the parameters",
                  dp, tp) {
            tpk_dp_buckets b = {0};
            tpk_adamw o;
            CHECK_OK(&ctx, tpk_adamw_init(&ctx, &o, NULL));
            zero_grads(&ctx);
            CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true));
            last_backward(&ctx, &b, -1);
            float *w0 = malloc(ctx.params.numel * 4);
            memcpy(w0, ctx.params.data.p, ctx.params.numel * 4);
            CHECK_FAILS(&ctx, tpk_adamw_step(&ctx, &o, 1e-3f, 1.0f), TPK_ERR_ARG,
                        "tpk_adamw_step: ctx->params: the data-parallel reduction of the "
                        "gradients (parameters \"w\" to \"h\") was begun and not finished");
            CHECK(o.step == 0 && !memcmp(w0, ctx.params.data.p, ctx.params.numel * 4),
                  "a refused optimizer step changed the weights (step %lld)", (long long)o.step);
            CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
            char want[320];
            snprintf(want, sizeof want,
                     "tpk_dp_finish: called twice: the gradients of %s were already reduced",
                     w_etc);
            CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG, want);
            check_sums(&ctx, M - 1, M, "after a second finish", NULL); /* reduced once */
            CHECK_OK(&ctx, tpk_adamw_step(&ctx, &o, 1e-3f, 1.0f));
            CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true)); /* the next step */
            CHECK_FAILS(&ctx, tpk_dp_begin(&ctx, &b, true), TPK_ERR_ARG,
                        "tpk_dp_begin: buckets: the step's last micro-batch is still running");
            CHECK_OK(&ctx, tpk_dp_grad_ready_all(&ctx, &b));
            CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
            free(w0);
            tpk_adamw_destroy(&ctx, &o);
            tpk_dp_destroy(&b);
        }

        if (!(dp & (dp - 1)))
            TEST_CASE("DP %d x TP %d: Adasum buckets record the reports too: a missing range is "
                      "refused",
                      dp, tp) {
                tpk_dp_buckets b = {0};
                CHECK_OK(&ctx, tpk_dp_adasum_init(&ctx, &b));
                tpk_comm_stats_reset(&ctx.dp);
                CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, true));
                last_backward(&ctx, &b, 0);
                CHECK(ctx.dp.stats.calls[TPK_COLL_ALLREDUCE] == 0,
                      "Adasum buckets started %llu all-reduces",
                      (unsigned long long)ctx.dp.stats.calls[TPK_COLL_ALLREDUCE]);
                CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG,
                            "parameter \"g\" (id 3): never reported");
                tpk_dp_destroy(&b);
            }
        tpk_ctx_destroy(&ctx);
    }
    /* a pipeline stage at one DP rank: its schedule begins nothing, yet finishes the buckets before
     * the tied embedding's sum; at DP > 1 (or with a micro-batch begun) that is still refused */
    for (int tp = 1; tp <= 2; tp++) {
        if (np % (2 * tp)) continue;
        int dp = np / (2 * tp);
        TEST_CASE("PP 2 x DP %d x TP %d: tpk_dp_finish with nothing begun %s", dp, tp,
                  dp == 1 ? "accepted (the pipeline at one DP rank); a micro-batch begun as not "
                            "the last refused"
                          : "refused") {
            tpk_ctx ctx;
            CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = tp, .pp = 2}));
            add_params(&ctx);
            tpk_dp_buckets b = {0};
            CHECK(ctx.pp.size == 2 && ctx.dp.size == dp, "mesh: PP %d, DP %d", ctx.pp.size,
                  ctx.dp.size);
            if (dp == 1) {
                CHECK_OK(&ctx, tpk_dp_finish(&ctx, &b));
                CHECK_OK(&ctx, tpk_dp_begin(&ctx, &b, false));
                CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG,
                            "no micro-batch of this step was begun as the last");
            } else {
                CHECK_FAILS(&ctx, tpk_dp_finish(&ctx, &b), TPK_ERR_ARG,
                            "tpk_dp_finish: no tpk_dp_begin this step: the gradients of "
                            "parameter \"w\"");
            }
            tpk_dp_destroy(&b);
            tpk_ctx_destroy(&ctx);
        }
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
