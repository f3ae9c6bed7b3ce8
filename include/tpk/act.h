/* tpk/act.h — GELU (tanh approximation, as GPT-2), forward and backward.
 *
 *   y  = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   dx = dy * gelu'(x)
 * Elementwise, so it keeps the layout of its input: R, or S(d) (a column linear's shard).
 * A partial (P) input is an error: GELU of a partial sum is not the partial of GELU. */
#ifndef TPK_ACT_H
#define TPK_ACT_H

#include "buf.h"

typedef struct tpk_gelu {
    tpk_tensor x; /* saved input; the caller keeps it alive until backward */
    tpk_buf y, dx;
} tpk_gelu;

static inline tpk_status tpk__gelu_check(tpk_ctx *ctx, const char *fn, tpk_gelu *g, const tpk_tensor *x, const char *arg, void *out) {
    char a[64];
    if (!ctx) return TPK_ERR_ARG;
    if (!g || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", g ? "out" : "layer");
    if (x->layout.kind == TPK_LAYOUT_P)
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn, "%s: expected layout R or S(d), got %s (reduce it first)", arg, tpk_layout_str(x->layout, a, sizeof a));
    if (x->ndim < 1 || x->ndim > TPK_MAX_DIMS) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: expected 1..%d dimensions, got %d", arg, TPK_MAX_DIMS, x->ndim);
    if (x->dtype != TPK_F32 && x->dtype != TPK_BF16) return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "%s: expected f32 or bf16, got %s", arg, tpk_dtype_name(x->dtype));
    return tpk__check(ctx, fn, arg, x, x->layout, x->dtype, x->ndim, NULL, ctx->tp.size, ctx->tp.rank);
}

/* y = gelu(x), same layout and shape as x. */
static inline tpk_status tpk_gelu_forward(tpk_ctx *ctx, tpk_gelu *g, tpk_tensor x, tpk_tensor *y) {
    static const char *fn = "tpk_gelu_forward";
    TPK_TRY(tpk__gelu_check(ctx, fn, g, &x, "x", y));
    tpk_tensor o = x;
    TPK_TRY(tpk__buf_view(ctx, &g->y, &o));
    if (tpk_numel(&x)) TPK_TRY(tpk_op_gelu_fwd(ctx, o.data, x.data, x.dtype, (size_t)tpk_numel(&x)));
    g->x = x;
    *y = o;
    return TPK_OK;
}

/* dx = dy * gelu'(x) for the x of the last forward; dy has x's layout and shape. */
static inline tpk_status tpk_gelu_backward(tpk_ctx *ctx, tpk_gelu *g, tpk_tensor dy, tpk_tensor *dx) {
    static const char *fn = "tpk_gelu_backward";
    TPK_TRY(tpk__gelu_check(ctx, fn, g, &dy, "dy", dx));
    if (!g->x.ndim) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: backward before forward");
    TPK_TRY(tpk__check(ctx, fn, "dy", &dy, g->x.layout, g->x.dtype, g->x.ndim, g->x.gshape, ctx->tp.size, ctx->tp.rank));
    tpk_tensor o = dy;
    TPK_TRY(tpk__buf_view(ctx, &g->dx, &o));
    if (tpk_numel(&dy)) TPK_TRY(tpk_op_gelu_bwd(ctx, o.data, g->x.data, dy.data, dy.dtype, (size_t)tpk_numel(&dy)));
    *dx = o;
    return TPK_OK;
}

static inline void tpk_gelu_destroy(tpk_ctx *ctx, tpk_gelu *g) {
    tpk__buf_free(ctx, &g->y), tpk__buf_free(ctx, &g->dx);
}

#endif /* TPK_ACT_H */
