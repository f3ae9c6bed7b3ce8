/* tpk/norm.h — layernorm over the hidden dim, weight and bias replicated.
 *
 *   forward   x [T, H] R (S(0) under sequence parallelism: this rank's token rows)
 *             y = (x - mean) rstd w + b, same layout; mean, rstd saved
 *   backward  dx = rstd (g - mean(g) - xh mean(g xh)), g = dy w;  dw += sum dy xh, db += sum dy
 * tpk_layernorm_forward_residual fuses the residual add before it: x1 = x + r, y = LN(x1).
 * No communication. Under sequence parallelism each rank sees only its token rows, so dw and
 * db are partial sums over TP: the parameters are marked tp_partial_grad and
 * tpk_params_reduce_partial_grads() all-reduces them once per step. */
#ifndef TPK_NORM_H
#define TPK_NORM_H

#include "params.h"

typedef struct tpk_layernorm_desc {
    const char *name;       /* "<name>.weight", "<name>.bias"; default "ln<N>" */
    float eps;              /* default 1e-5 */
    bool sequence_parallel; /* input S(0) */
} tpk_layernorm_desc;

typedef struct tpk_layernorm {
    char name[80];
    int64_t H;
    float eps;
    bool sp;
    int w, b;
    tpk_tensor x; /* saved input */
    tpk_buf y, mean, rstd, dx, x1; /* x1: the sum of the fused residual forward */
} tpk_layernorm;

static inline tpk_status tpk_layernorm_init(tpk_ctx *ctx, tpk_layernorm *l, int64_t H, const tpk_layernorm_desc *desc) {
    static const char *fn = "tpk_layernorm_init";
    tpk_layernorm_desc d;
    TPK__INIT_LAYER(ctx, fn, l, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (d.eps < 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->eps: expected > 0, got %g", (double)d.eps);
    l->H = H, l->eps = d.eps > 0 ? d.eps : 1e-5f, l->sp = d.sequence_parallel;
    TPK_TRY(tpk__layer_name(ctx, fn, l->name, sizeof l->name, d.name, "ln"));
    char pn[128];
    snprintf(pn, sizeof pn, "%s.weight", l->name);
    TPK_TRY(tpk__param_add(ctx, pn, 1, H, 0, TPK_R, TPK_INIT_ONES, 0, false, &l->w));
    snprintf(pn, sizeof pn, "%s.bias", l->name);
    TPK_TRY(tpk__param_add(ctx, pn, 1, H, 0, TPK_R, TPK_INIT_ZEROS, 0, false, &l->b));
    ctx->params.list[l->w].tp_partial_grad = ctx->params.list[l->b].tp_partial_grad = l->sp;
    return TPK_OK;
}

static inline tpk_status tpk__ln_check(tpk_ctx *ctx, const char *fn, tpk_layernorm *l, const tpk_tensor *x, const char *arg, const void *out,
                                       int64_t T) {
    if (!ctx) return TPK_ERR_ARG;
    if (!l || !l->H) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised layernorm");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", arg[0] == 'x' ? "y" : "dx");
    int64_t want[2] = {T, l->H};
    return tpk__check(ctx, fn, arg, x, l->sp ? TPK_S(0) : TPK_R, ctx->dtype, 2, want, ctx->tp.size, ctx->tp.rank);
}

/* y = layernorm(x): x R [T, H] (S(0) under sequence parallelism), y the same layout. */
static inline tpk_status tpk_layernorm_forward(tpk_ctx *ctx, tpk_layernorm *l, tpk_tensor x, tpk_tensor *y) {
    static const char *fn = "tpk_layernorm_forward";
    TPK_TRY(tpk__ln_check(ctx, fn, l, &x, "x", y, -1));
    int64_t rows = x.shape[0];
    tpk_tensor o = x;
    TPK_TRY(tpk__buf_view(ctx, &l->y, &o));
    TPK_TRY(tpk__buf_reserve(ctx, &l->mean, sizeof(float) * (size_t)(rows ? rows : 1)));
    TPK_TRY(tpk__buf_reserve(ctx, &l->rstd, sizeof(float) * (size_t)(rows ? rows : 1)));
    if (rows)
        TPK_TRY(tpk_op_layernorm_fwd(ctx, o.data, (float *)l->mean.p, (float *)l->rstd.p, x.data, tpk_param_data(ctx, l->w),
                                        tpk_param_data(ctx, l->b), rows, l->H, l->eps, ctx->dtype));
    l->x = x;
    *y = o;
    return TPK_OK;
}

/* The residual add fused with the layernorm after it: *x1 = x + r (in the layer's buffer, valid
 * until its next forward; it is the input backward uses) and *y = layernorm(x1), one pass
 * (ops->residual_layernorm_fwd). x, r: the layout of a plain forward's x. */
static inline tpk_status tpk_layernorm_forward_residual(tpk_ctx *ctx, tpk_layernorm *l, tpk_tensor x, tpk_tensor r, tpk_tensor *x1, tpk_tensor *y) {
    static const char *fn = "tpk_layernorm_forward_residual";
    TPK_TRY(tpk__ln_check(ctx, fn, l, &x, "x", y, -1));
    if (!x1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "x1: NULL");
    TPK_TRY(tpk__check(ctx, fn, "r", &r, x.layout, x.dtype, 2, x.gshape, ctx->tp.size, ctx->tp.rank));
    int64_t rows = x.shape[0];
    tpk_tensor s = x, o = x;
    TPK_TRY(tpk__buf_view(ctx, &l->x1, &s));
    TPK_TRY(tpk__buf_view(ctx, &l->y, &o));
    TPK_TRY(tpk__buf_reserve(ctx, &l->mean, sizeof(float) * (size_t)(rows ? rows : 1)));
    TPK_TRY(tpk__buf_reserve(ctx, &l->rstd, sizeof(float) * (size_t)(rows ? rows : 1)));
    if (rows)
        TPK_TRY(tpk_op_residual_layernorm_fwd(ctx, s.data, o.data, (float *)l->mean.p, (float *)l->rstd.p, x.data, r.data, tpk_param_data(ctx, l->w),
                                                 tpk_param_data(ctx, l->b), rows, l->H, l->eps, ctx->dtype));
    l->x = s;
    *x1 = s, *y = o;
    return TPK_OK;
}

/* dx of the last forward; accumulates dw, db. dy in the layout of y. */
static inline tpk_status tpk_layernorm_backward(tpk_ctx *ctx, tpk_layernorm *l, tpk_tensor dy, tpk_tensor *dx) {
    static const char *fn = "tpk_layernorm_backward";
    if (l && !l->x.ndim) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", l->name);
    TPK_TRY(tpk__ln_check(ctx, fn, l, &dy, "dy", dx, l ? l->x.gshape[0] : 0));
    int64_t rows = dy.shape[0];
    tpk_tensor o = dy;
    TPK_TRY(tpk__buf_view(ctx, &l->dx, &o));
    if (rows)
        TPK_TRY(tpk_op_layernorm_bwd(ctx, o.data, tpk_param_grad(ctx, l->w), tpk_param_grad(ctx, l->b), dy.data, l->x.data,
                                        tpk_param_data(ctx, l->w), (const float *)l->mean.p, (const float *)l->rstd.p, rows, l->H, ctx->dtype,
                                        false));
    *dx = o;
    return TPK_OK;
}

static inline void tpk_layernorm_destroy(tpk_ctx *ctx, tpk_layernorm *l) {
    tpk__buf_free(ctx, &l->y), tpk__buf_free(ctx, &l->mean), tpk__buf_free(ctx, &l->rstd), tpk__buf_free(ctx, &l->dx), tpk__buf_free(ctx, &l->x1);
}

/* All-reduce over TP the gradients that are partial sums there (layernorm under sequence
 * parallelism). Call once per step, after the last backward. */
static inline tpk_status tpk_params_reduce_partial_grads(tpk_ctx *ctx) {
    for (int i = 0; i < ctx->params.n; i++) {
        tpk_param *p = &ctx->params.list[i];
        if (p->tp_partial_grad && p->numel)
            TPK_TRY(tpk_allreduce(ctx, &ctx->tp, tpk_param_grad(ctx, i), tpk_param_grad(ctx, i), p->numel, TPK_F32, TPK_SUM));
    }
    return TPK_OK;
}

#endif /* TPK_NORM_H */
