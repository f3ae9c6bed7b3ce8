/* tests/tp_layer.h — the shared half of the tensor-parallel layer tests (tests/test_gpt2.c,
 * tests/test_llama.c): a layer given as four callbacks runs forward and backward on [T, H]
 * activations (R, or this rank's S(0) rows under sequence parallelism), and the sharded run is
 * compared with the unsharded one (outputs, input gradients, every gathered parameter gradient,
 * the gradient norm), its collectives counted, and its backward checked by finite differences.
 * The same for a whole model (tpk/train/model.h: GPT-2 or Llama): loss, gradient norm, every
 * gradient, and the padding of a padded vocabulary untouched. */
#ifndef TPK_TEST_TP_LAYER_H
#define TPK_TEST_TP_LAYER_H

#include "test.h"

#include <tpk/train/model.h>

/* A layer under test: `l` points at the caller's storage for it; kind and arg pick what init
 * builds. */
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
    tpk_range r = tpk_tp_split(ctx, T, ctx->tp.rank);
    return tpk_tp_tensor_2d(ctx, global + r.off * H, TPK_F32, T, H, TPK_S(0));
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
static inline int test_run_layer(tpk_ctx *ctx, const test_layer *L, float *xin, float *dyin,
                                 test_layer_result *o) {
    int f0 = test__fails_case;
    memset(o, 0, sizeof *o);
    o->y = (float *)malloc(sizeof(float) * (size_t)(L->T * L->H)),
    o->dx = (float *)malloc(sizeof(float) * (size_t)(L->T * L->H));
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
static inline void test_compare_layers(tpk_ctx *sh, const test_layer *L, const test_layer_result *a,
                                       const test_layer_result *b) {
    size_t n = (size_t)(L->T * L->H);
    CHECK_CLOSE(a->y, b->y, n, 1e-5, "output");
    CHECK_CLOSE(a->dx, b->dx, n, 1e-5, "input gradient");
    CHECK(a->n == b->n, "%d parameters, unsharded %d", a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++) {
        char what[160];
        snprintf(what, sizeof what, "gradient of %s", sh->params.list[i].name);
        CHECK_CLOSE(a->grad[i], b->grad[i], tpk_param_global_numel(sh, i), 1e-5, what);
    }
    CHECK(fabs(a->norm - b->norm) <= 1e-5 * b->norm, "gradient norm %.9g, unsharded %.9g", a->norm,
          b->norm);
}

static inline uint64_t test_total_calls(const tpk_comm_stats *s) {
    uint64_t c = 0;
    for (int q = 0; q < TPK_COLL_N; q++) c += s->calls[q];
    return c;
}
/* The collectives of one layer in one direction: n all-reduces of TH elements, or under SP n
 * all-gathers and n reduce-scatters of TH each — in the backward 2 n all-gathers: each column
 * linear gathers its input's tokens again rather than keeping them gathered — and nothing else. */
static inline void test_check_counts(const tpk_comm_stats *s, bool sp, int n, uint64_t TH,
                                     const char *dir) {
    if (!sp) {
        CHECK(
            s->calls[TPK_COLL_ALLREDUCE] == (uint64_t)n && test_total_calls(s) == (uint64_t)n &&
                s->elems[TPK_COLL_ALLREDUCE] == (uint64_t)n * TH,
            "%s: %llu collectives, %llu all-reduces of %llu elements; expected %d all-reduces of T "
            "H",
            dir, (unsigned long long)test_total_calls(s),
            (unsigned long long)s->calls[TPK_COLL_ALLREDUCE],
            (unsigned long long)s->elems[TPK_COLL_ALLREDUCE], n);
    } else {
        uint64_t ag = (uint64_t)n * (strcmp(dir, "backward") ? 1 : 2);
        CHECK(
            s->calls[TPK_COLL_ALLGATHER] == ag &&
                s->calls[TPK_COLL_REDUCE_SCATTER] == (uint64_t)n &&
                test_total_calls(s) == ag + (uint64_t)n &&
                s->elems[TPK_COLL_ALLGATHER] == ag * TH &&
                s->elems[TPK_COLL_REDUCE_SCATTER] == (uint64_t)n * TH,
            "%s: %llu collectives (%llu all-gathers, %llu reduce-scatters); expected %llu + %d of "
            "T H",
            dir, (unsigned long long)test_total_calls(s),
            (unsigned long long)s->calls[TPK_COLL_ALLGATHER],
            (unsigned long long)s->calls[TPK_COLL_REDUCE_SCATTER], (unsigned long long)ag, n);
    }
}

/* L = sum(y dyin) in double for input x. */
static inline double test_layer_loss(tpk_ctx *ctx, const test_layer *L, const float *x,
                                     const float *dyin) {
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
static inline void test_layer_fd(tpk_ctx *ctx, const test_layer *L, float *xin, float *dyin,
                                 int per) {
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
        CHECK(err < 2e-2, "d/dx[%zu]: finite difference %.6g, backward %.6g", i, fd,
              (double)an.dx[i]);
    }
    for (int q = 0; q < ctx->params.n && q < an.n; q++) { /* parameter elements, through the global
                                                             tensor */
        size_t gn = tpk_param_global_numel(ctx, q);
        float *w = (float *)malloc(gn * sizeof(float));
        CHECK_OK(ctx, tpk_param_get_global(ctx, q, false, w));
        for (int k = 0; k < per; k++) {
            size_t i = ((size_t)k * 1009 + 5 + (size_t)k * gn / (size_t)per) %
                       gn; /* spread over the tensor (every head) */
            float w0 = w[i];
            w[i] = w0 + h;
            CHECK_OK(ctx, tpk_param_set_global(ctx, q, w));
            double lp = test_layer_loss(ctx, L, xin, dyin);
            w[i] = w0 - h;
            CHECK_OK(ctx, tpk_param_set_global(ctx, q, w));
            double lm = test_layer_loss(ctx, L, xin, dyin);
            w[i] = w0;
            CHECK_OK(ctx, tpk_param_set_global(ctx, q, w));
            double fd = (lp - lm) / (2 * h),
                   err = fabs(fd - an.grad[q][i]) / (fabs(an.grad[q][i]) + 0.05);
            worst = err > worst ? err : worst;
            CHECK(err < 2e-2, "d/d %s[%zu]: finite difference %.6g, backward %.6g",
                  ctx->params.list[q].name, i, fd, (double)an.grad[q][i]);
        }
        free(w);
    }
    if (getenv("TPK_TEST_VERBOSE") && test__rank == 0)
        printf("  worst finite-difference error %.3g\n", worst);
    free(xp);
    test_layer_result_free(&an);
    L->destroy(ctx, L->l);
}

/* ---- whole models ---------------------------------------------------------------------------- */

typedef struct test_model_result {
    float loss;
    double norm;
    float *grad[64];
    size_t numel[64]; /* of grad[i] */
    size_t peak;      /* the most bytes the kit's buffers held in the forward and backward */
    int n;
    tpk_comm_stats fwd, bwd;
} test_model_result;
static inline void test_model_result_free(test_model_result *r) { test_free_grads(r->grad, &r->n); }


/* test_run_model's forward: 0 with a loss pointer (the loss computed in the forward); 1 with
 * loss = NULL (deferred: computed with the logits' gradient by the backward, then read); 2 as 1
 * after a deferred forward of other tokens that no backward follows (the next forward must settle
 * its loss before overwriting the logits: the running sum holds both) */
static int test_model_deferred;

/* One forward and backward of the model of cfg on ctx at ctx->rng_step = step, weights from
 * test_set_weights(11, 0.3); the padding rows of every padded parameter must get no gradient
 * and (f32) the padding columns of the logits must be zero. Nonzero on failure. */
static inline int test_run_model(tpk_ctx *ctx, const tpk_model_config *cfg, uint64_t step,
                                 const int32_t *ids, const int32_t *tg, int64_t B, int64_t S,
                                 test_model_result *o) {
    tpk_model m;
    int f0 = test__fails_case;
    memset(o, 0, sizeof *o);
    CHECK_OK(ctx, tpk_model_init(ctx, &m, cfg));
    if (test__fails_case > f0) return 1;
    test_set_weights(ctx, 11, 0.3f);
    ctx->rng_step = step;
    float other = 0;
    if (test_model_deferred == 2) { /* the tokens shifted by one: their loss at once, then
                                       deferred */
        int32_t *ids2 = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B * S));
        for (int64_t i = 0; i < B * S; i++) ids2[i] = ids[(i + 1) % (B * S)];
        CHECK_OK(ctx, tpk_model_forward(ctx, &m, ids2, tg, B, S, &other));
        CHECK_OK(ctx, tpk_model_forward(ctx, &m, ids2, tg, B, S, NULL));
        free(ids2);
    }
    tpk_mem_peak(ctx, true); /* from here: the step's activations over the parameters */
    tpk_comm_stats_reset(&ctx->tp);
    CHECK_OK(ctx, tpk_model_forward(ctx, &m, ids, tg, B, S, test_model_deferred ? NULL : &o->loss));
    o->fwd = ctx->tp.stats;
    tpk_comm_stats_reset(&ctx->tp);
    CHECK_OK(ctx, tpk_model_backward(ctx, &m, 1.0f));
    o->bwd = ctx->tp.stats;
    if (test_model_deferred) {
        double sum = NAN;
        int64_t n = 0;
        CHECK_OK(ctx, tpk_model_loss_read(ctx, &m, &sum, &n));
        CHECK(n == test_model_deferred,
              "deferred forwards: %lld losses in the running sum, expected %d", (long long)n,
              test_model_deferred);
        o->loss = (float)(sum - other); /* exact: two floats added in double */
        CHECK(sum - other == (double)o->loss,
              "the running sum %.17g is not the other tokens' loss %.9g plus a float", sum,
              (double)other);
    }
    o->peak = tpk_mem_peak(ctx, false);
    int64_t V = tpk_model_vocab(&m);
    int bad = 0;
    for (int w = 0; w < ctx->params.n; w++) { /* a padded vocabulary: no gradient in the padding
                                                 rows */
        const tpk_param *p = &ctx->params.list[w];
        if (p->padded_rows == p->gshape[0]) continue;
        int64_t v0 = tpk_tp_vocab_split(ctx, p->padded_rows, ctx->tp.rank).off;
        const float *g = tpk_param_grad(ctx, w);
        for (int64_t r = 0; r < p->shape[0]; r++)
            for (int64_t c = 0; c < p->shape[1] && v0 + r >= V; c++)
                bad += g[r * p->shape[1] + c] != 0.0f;
    }
    /* ... and the padding columns of the logits (now their gradient) zero (checked in f32) */
    tpk_lm *lm = tpk_model_lm(&m);
    const tpk_tensor *z = &lm->logits;
    int64_t Vp = lm->embed.Vp,
            v0 = tpk_tp_vocab_split(ctx, Vp, ctx->tp.rank).off, ld = z->shape[1];
    for (int64_t t = 0; t < z->shape[0] && ctx->dtype == TPK_F32; t++)
        for (int64_t c = 0; c < ld; c++)
            bad += v0 + c >= V && ((const float *)z->data)[t * ld + c] != 0.0f;
    /* every rank fails alike: no rank skips a collective */
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(bad == 0, "%d non-zero gradients in the vocabulary's padding", bad);
    /* every parameter at a multiple of TPK_PARAM_ALIGN elements (or right after the one before it:
     * the parts of a strided shard), the gaps between them zero in the weights and the gradients */
    size_t end = 0;
    int misplaced = 0, gaps = 0;
    for (int w = 0; w < ctx->params.n; w++) {
        const tpk_param *p = &ctx->params.list[w];
        misplaced += p->offset % TPK_PARAM_ALIGN != 0 && p->offset != end;
        for (size_t k = end; k < p->offset; k++)
            gaps += ((const float *)ctx->params.data.p)[k] != 0.0f ||
                    ((const float *)ctx->params.grad.p)[k] != 0.0f;
        end = p->offset + p->numel;
    }
    CHECK(misplaced == 0 && gaps == 0,
          "%d parameters off the alignment, %d non-zero elements between parameters", misplaced,
          gaps);
    CHECK_OK(ctx, tpk_params_reduce_partial_grads(ctx));
    CHECK_OK(ctx, tpk_grad_norm(ctx, 1.0f, &o->norm));
    o->n = test_gather_grads(ctx, o->grad, 64);
    for (int i = 0; i < o->n; i++) o->numel[i] = tpk_param_global_numel(ctx, i);
    /* the blocks' buffers borrowed from the stack's pools (tpk/layers/recompute.h) are back there:
     * no block holds any of the sets its mode borrows, and under full recompute no buffer at all
     * (its destroy frees nothing: every buffer is in one of its sets) */
    tpk_recompute rc = lm->c.recompute;
    size_t held = 0;
    for (int64_t i = 0; i < lm->c.layers; i++) {
        tpk_block *blk = &lm->blocks[i];
        for (int set = 1; set <= TPK__SET_SCRATCH; set <<= 1) {
            tpk_buf *bufs[TPK__SET_MAX];
            int n = tpk__stack_sets(rc, true) & set ? tpk_block_bufs(blk, set, bufs) : 0;
            for (int k = 0; k < n; k++) held += bufs[k]->bytes;
        }
        size_t mem = ctx->mem;
        if (rc == TPK_RECOMPUTE_FULL) tpk_block_destroy(ctx, blk);
        held += mem - ctx->mem;
    }
    CHECK(held == 0, "the blocks hold %zu bytes of the buffers they borrow (recompute %s)", held,
          tpk_recompute_name(rc));
    tpk_model_destroy(ctx, &m);
    return test__fails_case > f0;
}

/* A block's backward in place (*inplace set while it runs: the test file's bwd then gives the
 * block a copy of dy to work in) against the backward apart, on fresh contexts of t ranks: y, dx
 * and every gradient bit for bit (f32). */
static inline void test_block_inplace(tpk_comm *world, int tp, test_layer L, bool *inplace,
                                      float *x, float *dy) {
    tpk_ctx c[2];
    test_layer_result r[2];
    memset(r, 0, sizeof r);
    int failed = 0;
    size_t n = (size_t)(L.T * L.H);
    for (int k = 0; k < 2; k++) {
        tpk_ctx_init(&c[k], &(tpk_ctx_desc){.world = world, .tp = tp, .seed = 5});
        *inplace = k;
        failed |= test_run_layer(&c[k], &L, x, dy, &r[k]);
        *inplace = false;
    }
    if (!failed) {
        CHECK(!memcmp(r[0].y, r[1].y, sizeof(float) * n) &&
                  !memcmp(r[0].dx, r[1].dx, sizeof(float) * n),
              "y or dx differs in place");
        CHECK(r[0].n == r[1].n, "%d gradients, in place %d", r[0].n, r[1].n);
        for (int i = 0; i < r[0].n && i < r[1].n; i++)
            CHECK(!memcmp(r[0].grad[i], r[1].grad[i],
                          sizeof(float) * tpk_param_global_numel(&c[0], i)),
                  "the gradient of %s differs in place", c[0].params.list[i].name);
    }
    for (int k = 0; k < 2; k++) test_layer_result_free(&r[k]), tpk_ctx_destroy(&c[k]);
}

/* a (sharded, parameters of sh) against b: loss and gradient norm within `tol` relative, every
 * gradient within gtol (test_relerr). */
static inline void test_compare_models(tpk_ctx *sh, const test_model_result *a,
                                       const test_model_result *b, double tol, double gtol) {
    CHECK(fabs((double)a->loss - b->loss) <= tol * fabs((double)b->loss),
          "loss %.8g, reference %.8g", (double)a->loss, (double)b->loss);
    CHECK(isfinite(a->loss) && a->loss > 1.0f, "loss %g", (double)a->loss);
    CHECK(fabs(a->norm - b->norm) <= tol * b->norm, "gradient norm %.9g, reference %.9g", a->norm,
          b->norm);
    CHECK(a->n == b->n, "%d parameters, reference %d", a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++) {
        double e = test_relerr(a->grad[i], b->grad[i], tpk_param_global_numel(sh, i));
        CHECK(e < gtol, "gradient of %s: relative error %.3g >= %.3g", sh->params.list[i].name, e,
              gtol);
    }
}

/* Activation recompute (cfg with recompute = mode: FULL or SELECTIVE) against none on fresh
 * contexts of the same mesh: the loss and every gradient bit-identical, and the peak of the kit's
 * buffers during the forward and backward lower. */
static inline void test_recompute(tpk_comm *world, int tp, tpk_dtype dt,
                                  const tpk_model_config *cfg, tpk_recompute mode,
                                  const int32_t *ids, const int32_t *tg, int64_t B, int64_t S) {
    test_model_result r[2];
    size_t peak[2] = {0, 0};
    int failed = 0;
    const char *name = tpk_recompute_name(mode);
    for (int k = 0; k < 2; k++) {
        tpk_ctx c;
        tpk_model_config mc = *cfg;
        mc.gpt2.recompute = mc.llama.recompute = mc.neox.recompute = mc.custom.recompute =
            k ? mode : TPK_RECOMPUTE_NONE;
        CHECK_OK(&c, tpk_ctx_init(
                         &c, &(tpk_ctx_desc){.world = world, .tp = tp, .seed = 3, .dtype = dt}));
        failed |= test_run_model(&c, &mc, 5, ids, tg, B, S, &r[k]);
        peak[k] = r[k].peak;
        tpk_ctx_destroy(&c);
    }
    if (!failed) {
        CHECK(r[0].loss == r[1].loss, "loss %.9g, with %s recompute %.9g", (double)r[0].loss, name,
              (double)r[1].loss);
        CHECK(r[0].n == r[1].n, "%d parameters, with %s recompute %d", r[0].n, name, r[1].n);
        for (int i = 0; i < r[0].n && i < r[1].n; i++)
            CHECK(!memcmp(r[0].grad[i], r[1].grad[i], 4 * r[0].numel[i]),
                  "gradient %d differs with %s recompute", i, name);
        CHECK(peak[1] < peak[0], "peak memory %zu bytes with %s recompute, %zu without", peak[1],
              name, peak[0]);
        if (getenv("TPK_TEST_VERBOSE") && test__rank == 0)
            printf("  peak memory: %zu bytes, %zu with %s recompute\n", peak[0], peak[1], name);
    }
    test_model_result_free(&r[0]), test_model_result_free(&r[1]);
}

/* The deferred loss (tpk_model_forward with loss = NULL: computed with the logits' gradient by the
 * backward, at t = 1 by one fused op) against forward then backward, on fresh contexts of the same
 * mesh: the loss and every gradient bit-identical; the cross-entropy's all-gather (t > 1) moves
 * from the forward to the backward. */
static inline void test_deferred(tpk_comm *world, int tp, tpk_dtype dt, const tpk_model_config *cfg,
                                 const int32_t *ids, const int32_t *tg, int64_t B, int64_t S) {
    test_model_result r[3];
    int failed = 0;
    for (int k = 0; k < 3; k++) {
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(
                         &c, &(tpk_ctx_desc){.world = world, .tp = tp, .seed = 3, .dtype = dt}));
        test_model_deferred = k;
        failed |= test_run_model(&c, cfg, 5, ids, tg, B, S, &r[k]);
        test_model_deferred = 0;
        tpk_ctx_destroy(&c);
    }
    for (int k = 1; k < 3 && !failed; k++) {
        CHECK(r[0].loss == r[k].loss, "loss %.9g, deferred%s %.9g", (double)r[0].loss,
              k == 2 ? " after another" : "", (double)r[k].loss);
        CHECK(r[0].n == r[k].n, "%d parameters, deferred %d", r[0].n, r[k].n);
        for (int i = 0; i < r[0].n && i < r[k].n; i++)
            CHECK(!memcmp(r[0].grad[i], r[k].grad[i], 4 * r[0].numel[i]),
                  "gradient %d differs when deferred%s", i, k == 2 ? " after another" : "");
    }
    if (!failed) {
        uint64_t xg = tp > 1;
        CHECK(r[1].fwd.calls[TPK_COLL_ALLGATHER] + xg == r[0].fwd.calls[TPK_COLL_ALLGATHER] &&
                  r[1].bwd.calls[TPK_COLL_ALLGATHER] == r[0].bwd.calls[TPK_COLL_ALLGATHER] + xg,
              "all-gathers forward %llu, backward %llu; deferred %llu, %llu",
              (unsigned long long)r[0].fwd.calls[TPK_COLL_ALLGATHER],
              (unsigned long long)r[0].bwd.calls[TPK_COLL_ALLGATHER],
              (unsigned long long)r[1].fwd.calls[TPK_COLL_ALLGATHER],
              (unsigned long long)r[1].bwd.calls[TPK_COLL_ALLGATHER]);
    }
    test_model_result_free(&r[0]), test_model_result_free(&r[1]), test_model_result_free(&r[2]);
}

/* Weighted TP splits (tpk_ctx_desc.tp_weights: 2 | 3:1 | 3:1:2 | 1:2:3:4 at t = 1..4): the model
 * (cfg, its vocabulary padded or not) against the unsharded one (ref, unpadded) — loss, gradient
 * norm and every gathered gradient within 1e-5 — and the first block's query heads (A = 6) split as
 * the weights say: [6] | [4, 2] | [3, 1, 2] | [0, 1, 2, 3], b_i = floor(A W_i / W); the vocabulary
 * (V = 509) too: unpadded 509 | 381, 128 | 254, 85, 170 | 50, 102, 153, 204 rows; padded (Vp = 512,
 * 576 at t = 3) in units of 64 rows: 512 | 384, 128 | 256, 128, 192 | 0, 128, 128, 256. */
static inline void test_weighted(tpk_comm *world, int tp, const tpk_model_config *cfg,
                                 const tpk_model_config *ref, const int32_t *ids, const int32_t *tg,
                                 int64_t B, int64_t S) {
    static const double w[4][4] = {{2}, {3, 1}, {3, 1, 2}, {1, 2, 3, 4}};
    static const int64_t heads[4][4] = {{6}, {4, 2}, {3, 1, 2}, {0, 1, 2, 3}};
    static const int64_t rows[2][4][4] = {{{509}, {381, 128}, {254, 85, 170}, {50, 102, 153, 204}},
                                          {{512}, {384, 128}, {256, 128, 192}, {0, 128, 128, 256}}};
    tpk_ctx sh, un, c;
    tpk_ctx_desc wd = {.world = world, .tp = tp, .seed = 3, .tp_weights = w[tp - 1]};
    CHECK_OK(&c, tpk_ctx_init(&c, &wd));
    tpk_model m;
    if (tpk_model_init(&c, &m, cfg) == TPK_OK) {
        tpk_lm *lm = tpk_model_lm(&m);
        int64_t Al = lm->blocks[0].attn.kind == TPK_ATTN_GQA ? lm->blocks[0].attn.u.gqa.Al
                                                            : lm->blocks[0].attn.u.fused.Al;
        CHECK(Al == heads[tp - 1][c.tp.rank], "rank %d holds %lld query heads, expected %lld",
              c.tp.rank, (long long)Al, (long long)heads[tp - 1][c.tp.rank]);
        const tpk_embedding *e = &lm->embed;
        int pad = e->Vp != e->V;
        int64_t v0 = 0;
        for (int q = 0; q < c.tp.rank; q++) v0 += rows[pad][tp - 1][q];
        CHECK(e->V == 509 && e->v0 == v0 && e->vl == rows[pad][tp - 1][c.tp.rank],
              "rank %d holds vocabulary rows [%lld, +%lld) of %lld, expected [%lld, +%lld)",
              c.tp.rank, (long long)e->v0, (long long)e->vl, (long long)e->Vp, (long long)v0,
              (long long)rows[pad][tp - 1][c.tp.rank]);
        int head = lm->head_w; /* the LM head's weight: the same rows */
        CHECK(c.params.list[head].shape[0] == e->vl && c.params.list[e->wte].shape[0] == e->vl,
              "the vocabulary tables hold %lld and %lld rows, expected %lld",
              (long long)c.params.list[head].shape[0], (long long)c.params.list[e->wte].shape[0],
              (long long)e->vl);
        tpk_model_destroy(&c, &m);
    }
    tpk_ctx_destroy(&c);
    CHECK_OK(&sh, tpk_ctx_init(&sh, &wd));
    CHECK_OK(&un, tpk_ctx_init(&un, &(tpk_ctx_desc){.seed = 3}));
    test_model_result a = {0}, b = {0};
    if (!test_run_model(&sh, cfg, 4, ids, tg, B, S, &a) &&
        !test_run_model(&un, ref, 4, ids, tg, B, S, &b))
        test_compare_models(&sh, &a, &b, 1e-5, 1e-5);
    test_model_result_free(&a), test_model_result_free(&b);
    tpk_ctx_destroy(&sh), tpk_ctx_destroy(&un);
}

#endif /* TPK_TEST_TP_LAYER_H */
