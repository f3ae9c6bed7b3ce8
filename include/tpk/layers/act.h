/* tpk/layers/act.h — an elementwise activation layer (tpk_act: none, GELU-tanh), forward and
 * backward.
 *
 *   y  = act(x)            GELU-tanh (GPT-2): y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   dx = dy * act'(x)
 * Elementwise, so it keeps the layout of its input: R, or S(d) (a column linear's shard).
 * A partial (P) input is an error: the activation of a partial sum is not the partial of it.
 * A column linear fuses its activation into the GEMM instead (tpk_linear_desc.act).
 * tpk_gelu is the GELU case: a zeroed tpk_gelu works with tpk_gelu_forward/backward. */
#ifndef TPK_ACT_H
#define TPK_ACT_H

#include "../runtime/buf.h"

typedef struct tpk_activation {
    tpk_act act;  /* set before the first forward (TPK_ACT_NONE: identity) */
    tpk_tensor x; /* saved input; the caller keeps it alive until backward */
    tpk_buf y, dx;
} tpk_activation;
typedef tpk_activation tpk_gelu;

static inline tpk_status tpk__act_check(tpk_ctx *ctx, const char *fn, tpk_activation *g,
                                        const tpk_tensor *x, const char *arg, void *out) {
    char a[64];
    if (!ctx) return TPK_ERR_ARG;
    if (!g || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", g ? "out" : "layer");
    if ((unsigned)g->act >= (unsigned)TPK_ACT_COUNT)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer->act: expected a tpk_act, got %d",
                         (int)g->act);
    if (x->layout.kind == TPK_LAYOUT_P)
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn,
                         "%s: expected layout R or S(d), got %s (reduce it first)", arg,
                         tpk_layout_str(x->layout, a, sizeof a));
    if (x->ndim < 1 || x->ndim > TPK_MAX_DIMS)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: expected 1..%d dimensions, got %d", arg,
                         TPK_MAX_DIMS, x->ndim);
    if (x->dtype != TPK_F32 && x->dtype != TPK_BF16)
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "%s: expected f32 or bf16, got %s", arg,
                         tpk_dtype_name(x->dtype));
    return tpk__check(ctx, fn, arg, x, x->layout, x->dtype, x->ndim, NULL);
}

/* y = act(x), same layout and shape as x. */
static inline tpk_status tpk_activation_forward(tpk_ctx *ctx, tpk_activation *g, tpk_tensor x,
                                                tpk_tensor *y) {
    static const char *fn = "tpk_activation_forward";
    TPK_TRY(tpk__act_check(ctx, fn, g, &x, "x", y));
    tpk_tensor o = x;
    TPK_TRY(tpk__buf_view(ctx, &g->y, &o));
    TPK_TRY(tpk_op_act_fwd(ctx, g->act, o.data, x.data, x.dtype, (size_t)tpk_numel(&x)));
    g->x = x;
    *y = o;
    return TPK_OK;
}

/* dx = dy * act'(x) for the x of the last forward; dy has x's layout and shape. */
static inline tpk_status tpk_activation_backward(tpk_ctx *ctx, tpk_activation *g, tpk_tensor dy,
                                                 tpk_tensor *dx) {
    static const char *fn = "tpk_activation_backward";
    TPK_TRY(tpk__act_check(ctx, fn, g, &dy, "dy", dx));
    if (!g->x.ndim) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: backward before forward");
    TPK_TRY(tpk__check(ctx, fn, "dy", &dy, g->x.layout, g->x.dtype, g->x.ndim, g->x.gshape));
    tpk_tensor o = dy;
    TPK_TRY(tpk__buf_view(ctx, &g->dx, &o));
    TPK_TRY(
        tpk_op_act_bwd(ctx, g->act, o.data, g->x.data, dy.data, dy.dtype, (size_t)tpk_numel(&dy)));
    *dx = o;
    return TPK_OK;
}

static inline void tpk_activation_destroy(tpk_ctx *ctx, tpk_activation *g) {
    tpk__buf_free(ctx, &g->y), tpk__buf_free(ctx, &g->dx);
}

/* GELU (tanh approximation): the activation layer with act = TPK_ACT_GELU_TANH. */
static inline tpk_status tpk_gelu_forward(tpk_ctx *ctx, tpk_gelu *g, tpk_tensor x, tpk_tensor *y) {
    if (g) g->act = TPK_ACT_GELU_TANH;
    return tpk_activation_forward(ctx, g, x, y);
}
static inline tpk_status tpk_gelu_backward(tpk_ctx *ctx, tpk_gelu *g, tpk_tensor dy,
                                           tpk_tensor *dx) {
    if (g) g->act = TPK_ACT_GELU_TANH;
    return tpk_activation_backward(ctx, g, dy, dx);
}
static inline void tpk_gelu_destroy(tpk_ctx *ctx, tpk_gelu *g) { tpk_activation_destroy(ctx, g); }

#endif /* TPK_ACT_H */
