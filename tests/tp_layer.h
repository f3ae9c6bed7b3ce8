/* tests/tp_layer.h — the shared half of the tensor-parallel layer tests (tests/test_gpt2.c,
 * tests/test_llama.c): a layer given as four callbacks runs forward and backward on [T, H]
 * activations (R, or this rank's S(0) rows under sequence parallelism), and the sharded run is
 * compared with the unsharded one (outputs, input gradients, every gathered parameter gradient,
 * the gradient norm), its collectives counted, and its backward checked by finite differences. */
#ifndef TPK_TEST_TP_LAYER_H
#define TPK_TEST_TP_LAYER_H

#include "test.h"

/* A layer under test: `l` points at the caller's storage for it; kind and arg pick what init builds. */
typedef struct test_layer {
    tpk_status (*init)(tpk_ctx *ctx, void *l, int kind, int64_t arg, bool sp, float p);
    tpk_status (*fwd)(tpk_ctx *ctx, void *l, tpk_tensor x, tpk_tensor *y);
    tpk_status (*bwd)(tpk_ctx *ctx, void *l, tpk_tensor dy, tpk_tensor *dx);
    void (*destroy)(tpk_ctx *ctx, void *l);
    void *l;
    int kind;
    int64_t arg, T, H;
    bool sp;
    float p;
} test_layer;

/* The input x / dy of a [T, H] activation: R, or this rank's S(0) rows of the global one. */
static inline tpk_tensor test_act(tpk_ctx *ctx, float *global, int64_t T, int64_t H, bool sp) {
    if (!sp) return tpk_tensor_2d(global, TPK_F32, T, H, TPK_R);
    tpk_range r = tpk_split(T, ctx->tp.size, ctx->tp.rank);
    return tpk_tensor_shard_2d(global + r.off * H, TPK_F32, T, H, TPK_S(0), ctx->tp.size, ctx->tp.rank);
}
/* A [T, H] activation gathered to R into out[T H] (poisoned first). */
static inline void test_gather_act(tpk_ctx *ctx, tpk_tensor t, float *out) {
    size_t n = (size_t)(t.gshape[0] * t.gshape[1]);
    test_poison(out, n);
    tpk_tensor g;
    memset(&g, 0, sizeof g);
    g.data = out;
    if (t.layout.kind == TPK_LAYOUT_R) memcpy(out, t.data, sizeof(float) * n);
    else CHECK_OK(ctx, tpk_convert(ctx, &t, TPK_R, &g));
}

typedef struct test_layer_result {
    float *y, *dx; /* [T, H] gathered */
    float *grad[64];
    int n;
    double norm;
    tpk_comm_stats fwd, bwd;
} test_layer_result;
static inline void test_layer_result_free(test_layer_result *r) {
    free(r->y), free(r->dx), r->y = r->dx = NULL;
    test_free_grads(r->grad, &r->n);
}

/* Forward and backward of the layer on ctx with fixed weights (test_set_weights(7, 0.3)), the
 * partial gradients summed; nonzero on failure. */
static inline int test_run_layer(tpk_ctx *ctx, const test_layer *L, float *xin, float *dyin, test_layer_result *o) {
    int f0 = test__fails_case;
    memset(o, 0, sizeof *o);
    o->y = (float *)malloc(sizeof(float) * (size_t)(L->T * L->H)), o->dx = (float *)malloc(sizeof(float) * (size_t)(L->T * L->H));
    CHECK_OK(ctx, L->init(ctx, L->l, L->kind, L->arg, L->sp, L->p));
    if (test__fails_case > f0) return 1;
    test_set_weights(ctx, 7, 0.3f);
    tpk_tensor y, dx;
    tpk_comm_stats_reset(&ctx->tp);
    CHECK_OK(ctx, L->fwd(ctx, L->l, test_act(ctx, xin, L->T, L->H, L->sp), &y));
    o->fwd = ctx->tp.stats;
    if (test__fails_case > f0) return 1;
    test_gather_act(ctx, y, o->y);
    tpk_comm_stats_reset(&ctx->tp);
    CHECK_OK(ctx, L->bwd(ctx, L->l, test_act(ctx, dyin, L->T, L->H, L->sp), &dx));
    o->bwd = ctx->tp.stats;
    if (test__fails_case > f0) return 1;
    test_gather_act(ctx, dx, o->dx);
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    CHECK_OK(ctx, tpk_grad_norm(ctx, 1.0f, &o->norm));
    o->n = test_gather_grads(ctx, o->grad, 64);
    L->destroy(ctx, L->l);
    return test__fails_case > f0;
}

/* The sharded result a (parameters of sh) against the unsharded b, to relative 1e-5. */
static inline void test_compare_layers(tpk_ctx *sh, const test_layer *L, const test_layer_result *a, const test_layer_result *b) {
    size_t n = (size_t)(L->T * L->H);
    CHECK_CLOSE(a->y, b->y, n, 1e-5, "output");
    CHECK_CLOSE(a->dx, b->dx, n, 1e-5, "input gradient");
    CHECK(a->n == b->n, "%d parameters, unsharded %d", a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++) {
        char what[160];
        snprintf(what, sizeof what, "gradient of %s", sh->params.list[i].name);
        CHECK_CLOSE(a->grad[i], b->grad[i], tpk_param_global_numel(sh, i), 1e-5, what);
    }
    CHECK(fabs(a->norm - b->norm) <= 1e-5 * b->norm, "gradient norm %.9g, unsharded %.9g", a->norm, b->norm);
}

static inline uint64_t test_total_calls(const tpk_comm_stats *s) {
    uint64_t c = 0;
    for (int q = 0; q < TPK_COLL_N; q++) c += s->calls[q];
    return c;
}
/* The collectives of one layer in one direction: n all-reduces of TH elements, or under SP n
 * all-gathers and n reduce-scatters of TH each, and nothing else. */
static inline void test_check_counts(const tpk_comm_stats *s, bool sp, int n, uint64_t TH, const char *dir) {
    if (!sp) {
        CHECK(s->calls[TPK_COLL_ALLREDUCE] == (uint64_t)n && test_total_calls(s) == (uint64_t)n && s->elems[TPK_COLL_ALLREDUCE] == (uint64_t)n * TH,
              "%s: %llu collectives, %llu all-reduces of %llu elements; expected %d all-reduces of T H", dir, (unsigned long long)test_total_calls(s),
              (unsigned long long)s->calls[TPK_COLL_ALLREDUCE], (unsigned long long)s->elems[TPK_COLL_ALLREDUCE], n);
    } else {
        CHECK(s->calls[TPK_COLL_ALLGATHER] == (uint64_t)n && s->calls[TPK_COLL_REDUCE_SCATTER] == (uint64_t)n && test_total_calls(s) == 2 * (uint64_t)n &&
                  s->elems[TPK_COLL_ALLGATHER] == (uint64_t)n * TH && s->elems[TPK_COLL_REDUCE_SCATTER] == (uint64_t)n * TH,
              "%s: %llu collectives (%llu all-gathers, %llu reduce-scatters); expected %d + %d of T H", dir, (unsigned long long)test_total_calls(s),
              (unsigned long long)s->calls[TPK_COLL_ALLGATHER], (unsigned long long)s->calls[TPK_COLL_REDUCE_SCATTER], n, n);
    }
}

/* L = sum(y dyin) in double for input x. */
static inline double test_layer_loss(tpk_ctx *ctx, const test_layer *L, const float *x, const float *dyin) {
    tpk_tensor y;
    size_t n = (size_t)(L->T * L->H);
    float *yg = (float *)malloc(sizeof(float) * n);
    CHECK_OK(ctx, L->fwd(ctx, L->l, test_act(ctx, (float *)x, L->T, L->H, L->sp), &y));
    test_gather_act(ctx, y, yg);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)yg[i] * dyin[i];
    free(yg);
    return s;
}
/* Finite differences on the sharded layer: for 6 elements of x and `per` spread elements of every
 * parameter (through the global tensor), (L(+h) - L(-h)) / 2h against the backward, h = 1e-2,
 * error relative to |analytic| + 0.05 below 2e-2. */
static inline void test_layer_fd(tpk_ctx *ctx, const test_layer *L, float *xin, float *dyin, int per) {
    test_layer_result an;
    memset(&an, 0, sizeof an);
    size_t n = (size_t)(L->T * L->H);
    an.dx = (float *)malloc(sizeof(float) * n);
    CHECK_OK(ctx, L->init(ctx, L->l, L->kind, L->arg, L->sp, L->p));
    test_set_weights(ctx, 7, 0.3f);
    tpk_tensor y, dx;
    CHECK_OK(ctx, L->fwd(ctx, L->l, test_act(ctx, xin, L->T, L->H, L->sp), &y));
    CHECK_OK(ctx, L->bwd(ctx, L->l, test_act(ctx, dyin, L->T, L->H, L->sp), &dx));
    test_gather_act(ctx, dx, an.dx);
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    an.n = test_gather_grads(ctx, an.grad, 64);
    const float h = 1e-2f;
    double worst = 0;
    float *xp = (float *)malloc(sizeof(float) * n);
    for (int k = 0; k < 6; k++) { /* input elements */
        size_t i = ((size_t)k * 97 + 13) % n;
        memcpy(xp, xin, sizeof(float) * n);
        xp[i] = xin[i] + h;
        double lp = test_layer_loss(ctx, L, xp, dyin);
        xp[i] = xin[i] - h;
        double lm = test_layer_loss(ctx, L, xp, dyin);
        double fd = (lp - lm) / (2 * h), err = fabs(fd - an.dx[i]) / (fabs(an.dx[i]) + 0.05);
        worst = err > worst ? err : worst;
        CHECK(err < 2e-2, "d/dx[%zu]: finite difference %.6g, backward %.6g", i, fd, (double)an.dx[i]);
    }
    for (int q = 0; q < ctx->params.n && q < an.n; q++) { /* parameter elements, through the global tensor */
        size_t gn = tpk_param_global_numel(ctx, q);
        float *w = (float *)malloc(gn * sizeof(float));
        CHECK_OK(ctx, tpk_param_get_global(ctx, q, false, w));
        for (int k = 0; k < per; k++) {
            size_t i = ((size_t)k * 1009 + 5 + (size_t)k * gn / (size_t)per) % gn; /* spread over the tensor (every head) */
            float w0 = w[i];
            w[i] = w0 + h;
            CHECK_OK(ctx, tpk_param_set_global(ctx, q, w));
            double lp = test_layer_loss(ctx, L, xin, dyin);
            w[i] = w0 - h;
            CHECK_OK(ctx, tpk_param_set_global(ctx, q, w));
            double lm = test_layer_loss(ctx, L, xin, dyin);
            w[i] = w0;
            CHECK_OK(ctx, tpk_param_set_global(ctx, q, w));
            double fd = (lp - lm) / (2 * h), err = fabs(fd - an.grad[q][i]) / (fabs(an.grad[q][i]) + 0.05);
            worst = err > worst ? err : worst;
            CHECK(err < 2e-2, "d/d %s[%zu]: finite difference %.6g, backward %.6g", ctx->params.list[q].name, i, fd, (double)an.grad[q][i]);
        }
        free(w);
    }
    if (getenv("TPK_TEST_VERBOSE") && test__rank == 0) printf("  worst finite-difference error %.3g\n", worst);
    free(xp);
    test_layer_result_free(&an);
    L->destroy(ctx, L->l);
}

#endif /* TPK_TEST_TP_LAYER_H */
