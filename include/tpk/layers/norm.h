/* tpk/layers/norm.h — layernorm and RMSNorm over the hidden dim, weights replicated.
 *
 * Layernorm (GPT-2):
 *   forward   x [T, H] R (S(0) under sequence parallelism: this rank's token rows)
 *             y = (x - mean) rstd w + b, same layout; mean, rstd saved
 *   backward  dx = rstd (g - mean(g) - xh mean(g xh)), g = dy w;  dw += sum dy xh, db += sum dy
 * tpk_layernorm_forward_residual fuses the residual add before it: x1 = x + r, y = LN(x1).
 * RMSNorm (Llama): y = x rstd w, rstd = 1/sqrt(mean(x^2) + eps); dx = rstd (g - xh mean(g xh)),
 *   dw += sum dy xh (xh = x rstd). Same layouts, same partial_dy.
 * No communication. Under sequence parallelism each rank sees only its token rows, so the weight
 * gradients are partial sums over TP: the parameters are marked tp_partial_grad and
 * tpk_params_reduce_partial_grads() all-reduces them once per step (it also sums the grouped
 * key/value weights that several ranks hold, tpk/layers/attn.h).
 * Partial gradients (desc.partial_dy; the input R, not with sequence parallelism): the backward
 * takes dy P [T, H] and returns dx P. Given the forward's saved statistics the backward is linear
 * in dy, dx = J^T dy, so each rank's dx_r = J^T dy_r sums to the true dx (a parallel residual
 * block adds both norms' and reduces once, tpk_stream_gather_backward); the weight (and bias)
 * gradients sum dy_r xh and dy_r, partial over TP likewise, so the parameters are marked
 * tp_partial_grad and summed once per step as under SP. */
#ifndef TPK_NORM_H
#define TPK_NORM_H

#include "params.h"

typedef struct tpk_layernorm_desc {
    const char *name;       /* "<name>.weight", "<name>.bias"; default "ln<N>" */
    float eps;              /* default 1e-5 */
    bool sequence_parallel; /* input S(0) */
    bool partial_dy;        /* backward: dy P [T, H] -> dx P (input R; not with
                               sequence_parallel); the weight and bias gradients partial over TP */
} tpk_layernorm_desc;

typedef struct tpk_layernorm {
    char name[80];
    int64_t H;
    float eps;
    bool sp;
    bool partial; /* desc.partial_dy */
    int w, b;
    tpk_tensor x; /* saved input */
    tpk_buf y, mean, rstd, dx, x1; /* x1: the sum of the fused residual forward */
} tpk_layernorm;

static inline tpk_status tpk_layernorm_init(tpk_ctx *ctx, tpk_layernorm *l, int64_t H,
                                            const tpk_layernorm_desc *desc) {
    static const char *fn = "tpk_layernorm_init";
    tpk_layernorm_desc d;
    TPK__INIT_LAYER(ctx, fn, l, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (d.eps < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->eps: expected > 0, got %g", (double)d.eps);
    if (d.partial_dy && d.sequence_parallel)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->partial_dy: not with desc->sequence_parallel (a partial gradient "
                         "is whole-shaped [T, H]: the input must be R)");
    l->H = H, l->eps = d.eps > 0 ? d.eps : 1e-5f, l->sp = d.sequence_parallel;
    l->partial = d.partial_dy;
    TPK_TRY(tpk__layer_name(ctx, fn, l->name, sizeof l->name, d.name, "ln"));
    char pn[128];
    snprintf(pn, sizeof pn, "%s.weight", l->name);
    TPK_TRY(tpk__param_add(ctx, pn, 1, H, 0, TPK_R, TPK_INIT_ONES, 0, false, &l->w));
    snprintf(pn, sizeof pn, "%s.bias", l->name);
    TPK_TRY(tpk__param_add(ctx, pn, 1, H, 0, TPK_R, TPK_INIT_ZEROS, 0, false, &l->b));
    ctx->params.list[l->w].tp_partial_grad = ctx->params.list[l->b].tp_partial_grad =
        l->sp || l->partial;
    return TPK_OK;
}

/* A backward added into weight gradients partial over TP (sequence parallelism, partial_dy; at
 * t > 1): they are P until tpk_params_reduce_partial_grads, and the optimizer refuses them so. */
static inline void tpk__norm_partial_added(tpk_ctx *ctx, bool partial) {
    if (partial && ctx->tp.size > 1) ctx->params.tp_partial_open = true;
}

static inline tpk_status tpk__ln_check(tpk_ctx *ctx, const char *fn, tpk_layernorm *l,
                                       const tpk_tensor *x, const char *arg, const void *out,
                                       int64_t T) {
    if (!ctx) return TPK_ERR_ARG;
    if (!l || !l->H)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised layernorm");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", arg[0] == 'x' ? "y" : "dx");
    int64_t want[2] = {T, l->H};
    tpk_layout lay = l->sp ? TPK_S(0) : l->partial && arg[0] != 'x' ? TPK_P : TPK_R;
    return tpk__check(ctx, fn, arg, x, lay, ctx->dtype, 2, want);
}

/* y = layernorm(x): x R [T, H] (S(0) under sequence parallelism), y the same layout. */
static inline tpk_status tpk_layernorm_forward(tpk_ctx *ctx, tpk_layernorm *l, tpk_tensor x,
                                               tpk_tensor *y) {
    static const char *fn = "tpk_layernorm_forward";
    TPK_TRY(tpk__ln_check(ctx, fn, l, &x, "x", y, -1));
    int64_t rows = x.shape[0];
    tpk_tensor o = x;
    TPK_TRY(tpk__buf_view(ctx, &l->y, &o));
    TPK_TRY(tpk__buf_reserve(ctx, &l->mean, sizeof(float) * (size_t)(rows ? rows : 1)));
    TPK_TRY(tpk__buf_reserve(ctx, &l->rstd, sizeof(float) * (size_t)(rows ? rows : 1)));
    if (rows)
        TPK_TRY(tpk_op_layernorm_fwd(ctx, o.data, (float *)l->mean.p, (float *)l->rstd.p, x.data,
                                     tpk_param_data(ctx, l->w), tpk_param_data(ctx, l->b), rows,
                                     l->H, l->eps, ctx->dtype));
    l->x = x;
    *y = o;
    return TPK_OK;
}

/* The residual add fused with the layernorm after it: *x1 = x + r (in the layer's buffer, valid
 * until its next forward; it is the input backward uses) and *y = layernorm(x1), one pass
 * (ops->residual_layernorm_fwd). x, r: the layout of a plain forward's x. */
static inline tpk_status tpk_layernorm_forward_residual(tpk_ctx *ctx, tpk_layernorm *l,
                                                        tpk_tensor x, tpk_tensor r, tpk_tensor *x1,
                                                        tpk_tensor *y) {
    static const char *fn = "tpk_layernorm_forward_residual";
    TPK_TRY(tpk__ln_check(ctx, fn, l, &x, "x", y, -1));
    if (!x1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "x1: NULL");
    TPK_TRY(tpk__check(ctx, fn, "r", &r, x.layout, x.dtype, 2, x.gshape));
    int64_t rows = x.shape[0];
    tpk_tensor s = x, o = x;
    TPK_TRY(tpk__buf_view(ctx, &l->x1, &s));
    TPK_TRY(tpk__buf_view(ctx, &l->y, &o));
    TPK_TRY(tpk__buf_reserve(ctx, &l->mean, sizeof(float) * (size_t)(rows ? rows : 1)));
    TPK_TRY(tpk__buf_reserve(ctx, &l->rstd, sizeof(float) * (size_t)(rows ? rows : 1)));
    if (rows)
        TPK_TRY(tpk_op_residual_layernorm_fwd(
            ctx, s.data, o.data, (float *)l->mean.p, (float *)l->rstd.p, x.data, r.data,
            tpk_param_data(ctx, l->w), tpk_param_data(ctx, l->b), rows, l->H, l->eps, ctx->dtype));
    l->x = s;
    *x1 = s, *y = o;
    return TPK_OK;
}

/* dx of the last forward; accumulates dw, db. dy in the layout of y (partial_dy: dy P [T, H],
 * dx P, dw and db partial over TP). */
static inline tpk_status tpk_layernorm_backward(tpk_ctx *ctx, tpk_layernorm *l, tpk_tensor dy,
                                                tpk_tensor *dx) {
    static const char *fn = "tpk_layernorm_backward";
    if (l && !l->x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", l->name);
    TPK_TRY(tpk__ln_check(ctx, fn, l, &dy, "dy", dx, l ? l->x.gshape[0] : 0));
    int64_t rows = dy.shape[0];
    tpk_tensor o = dy;
    TPK_TRY(tpk__buf_view(ctx, &l->dx, &o));
    if (rows)
        TPK_TRY(tpk_op_layernorm_bwd(ctx, o.data, tpk_param_grad(ctx, l->w),
                                     tpk_param_grad(ctx, l->b), dy.data, l->x.data,
                                     tpk_param_data(ctx, l->w), (const float *)l->mean.p,
                                     (const float *)l->rstd.p, rows, l->H, ctx->dtype, false));
    *dx = o;
    tpk__norm_partial_added(ctx, l->sp || l->partial);
    return TPK_OK;
}

/* *acc += dx of the last forward, in one pass (the op adds its dx onto acc): a residual block's
 * skip gradient and its branch's gradient joined without a buffer or an add of their own. acc: the
 * layout and shape of the forward's input; dy in the layout of y. */
static inline tpk_status tpk_layernorm_backward_add(tpk_ctx *ctx, tpk_layernorm *l, tpk_tensor dy,
                                                    tpk_tensor acc) {
    static const char *fn = "tpk_layernorm_backward_add";
    if (l && !l->x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", l->name);
    TPK_TRY(tpk__ln_check(ctx, fn, l, &dy, "dy", &acc, l ? l->x.gshape[0] : 0));
    TPK_TRY(tpk__check(ctx, fn, "acc", &acc, dy.layout, ctx->dtype, 2, dy.gshape));
    if (acc.data == dy.data && dy.shape[0])
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "acc: must not alias dy");
    if (dy.shape[0])
        TPK_TRY(tpk_op_layernorm_bwd(
            ctx, acc.data, tpk_param_grad(ctx, l->w), tpk_param_grad(ctx, l->b), dy.data, l->x.data,
            tpk_param_data(ctx, l->w), (const float *)l->mean.p, (const float *)l->rstd.p,
            dy.shape[0], l->H, ctx->dtype, true));
    tpk__norm_partial_added(ctx, l->sp || l->partial);
    return TPK_OK;
}

/* Its buffers by recompute set (tpk/runtime/buf.h): LENT the output; KEPT the statistics and the
 * fused residual forward's sum; SCRATCH the input gradient. */
static inline int tpk__layernorm_bufs(tpk_layernorm *l, int set, tpk_buf **o) {
    if (set == TPK__SET_LENT) return o[0] = &l->y, 1;
    if (set == TPK__SET_KEPT) return o[0] = &l->mean, o[1] = &l->rstd, o[2] = &l->x1, 3;
    return o[0] = &l->dx, 1;
}

static inline void tpk_layernorm_destroy(tpk_ctx *ctx, tpk_layernorm *l) {
    tpk__buf_free(ctx, &l->y), tpk__buf_free(ctx, &l->mean), tpk__buf_free(ctx, &l->rstd),
        tpk__buf_free(ctx, &l->dx), tpk__buf_free(ctx, &l->x1);
}

/* ---- RMSNorm --------------------------------------------------------------------------------- */

typedef struct tpk_rmsnorm_desc {
    const char *name;       /* "<name>.weight"; default "rms<N>" */
    float eps;              /* default 1e-6 (Llama's rms_norm_eps) */
    bool sequence_parallel; /* input S(0) */
    bool partial_dy;        /* backward: dy P [T, H] -> dx P (as tpk_layernorm_desc's) */
} tpk_rmsnorm_desc;

typedef struct tpk_rmsnorm {
    char name[80];
    int64_t H;
    float eps;
    bool sp;
    bool partial; /* desc.partial_dy */
    int w;
    tpk_tensor x; /* saved input */
    tpk_buf y, rstd, dx;
} tpk_rmsnorm;

static inline tpk_status tpk_rmsnorm_init(tpk_ctx *ctx, tpk_rmsnorm *l, int64_t H,
                                          const tpk_rmsnorm_desc *desc) {
    static const char *fn = "tpk_rmsnorm_init";
    tpk_rmsnorm_desc d;
    TPK__INIT_LAYER(ctx, fn, l, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (!(d.eps >= 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->eps: expected > 0 (0 = 1e-6), got %g",
                         (double)d.eps);
    if (d.partial_dy && d.sequence_parallel)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->partial_dy: not with desc->sequence_parallel (a partial gradient "
                         "is whole-shaped [T, H]: the input must be R)");
    l->H = H, l->eps = d.eps > 0 ? d.eps : 1e-6f, l->sp = d.sequence_parallel;
    l->partial = d.partial_dy;
    TPK_TRY(tpk__layer_name(ctx, fn, l->name, sizeof l->name, d.name, "rms"));
    char pn[128];
    snprintf(pn, sizeof pn, "%s.weight", l->name);
    TPK_TRY(tpk__param_add(ctx, pn, 1, H, 0, TPK_R, TPK_INIT_ONES, 0, false, &l->w));
    ctx->params.list[l->w].tp_partial_grad = l->sp || l->partial;
    return TPK_OK;
}

static inline tpk_status tpk__rms_check(tpk_ctx *ctx, const char *fn, tpk_rmsnorm *l,
                                        const tpk_tensor *x, const char *arg, const void *out,
                                        int64_t T) {
    if (!ctx) return TPK_ERR_ARG;
    if (!l || !l->H)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised RMSNorm");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", arg[0] == 'x' ? "y" : "dx");
    int64_t want[2] = {T, l->H};
    tpk_layout lay = l->sp ? TPK_S(0) : l->partial && arg[0] != 'x' ? TPK_P : TPK_R;
    return tpk__check(ctx, fn, arg, x, lay, ctx->dtype, 2, want);
}

/* y = rmsnorm(x): x R [T, H] (S(0) under sequence parallelism), y the same layout. x must stay
 * unchanged until backward. */
static inline tpk_status tpk_rmsnorm_forward(tpk_ctx *ctx, tpk_rmsnorm *l, tpk_tensor x,
                                             tpk_tensor *y) {
    static const char *fn = "tpk_rmsnorm_forward";
    TPK_TRY(tpk__rms_check(ctx, fn, l, &x, "x", y, -1));
    int64_t rows = x.shape[0];
    tpk_tensor o = x;
    TPK_TRY(tpk__buf_view(ctx, &l->y, &o));
    TPK_TRY(tpk__buf_reserve(ctx, &l->rstd, sizeof(float) * (size_t)(rows ? rows : 1)));
    if (rows)
        TPK_TRY(tpk_op_rmsnorm_fwd(ctx, o.data, (float *)l->rstd.p, x.data,
                                   tpk_param_data(ctx, l->w), rows, l->H, l->eps, ctx->dtype));
    l->x = x;
    *y = o;
    return TPK_OK;
}

/* dx of the last forward; accumulates dw. dy in the layout of y (partial_dy: dy P [T, H], dx P,
 * dw partial over TP). */
static inline tpk_status tpk_rmsnorm_backward(tpk_ctx *ctx, tpk_rmsnorm *l, tpk_tensor dy,
                                              tpk_tensor *dx) {
    static const char *fn = "tpk_rmsnorm_backward";
    if (l && !l->x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", l->name);
    TPK_TRY(tpk__rms_check(ctx, fn, l, &dy, "dy", dx, l ? l->x.gshape[0] : 0));
    int64_t rows = dy.shape[0];
    tpk_tensor o = dy;
    TPK_TRY(tpk__buf_view(ctx, &l->dx, &o));
    if (rows)
        TPK_TRY(tpk_op_rmsnorm_bwd(ctx, o.data, tpk_param_grad(ctx, l->w), dy.data, l->x.data,
                                   tpk_param_data(ctx, l->w), (const float *)l->rstd.p, rows, l->H,
                                   ctx->dtype, false));
    *dx = o;
    tpk__norm_partial_added(ctx, l->sp || l->partial);
    return TPK_OK;
}

/* *acc += dx of the last forward, in one pass (as tpk_layernorm_backward_add). */
static inline tpk_status tpk_rmsnorm_backward_add(tpk_ctx *ctx, tpk_rmsnorm *l, tpk_tensor dy,
                                                  tpk_tensor acc) {
    static const char *fn = "tpk_rmsnorm_backward_add";
    if (l && !l->x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", l->name);
    TPK_TRY(tpk__rms_check(ctx, fn, l, &dy, "dy", &acc, l ? l->x.gshape[0] : 0));
    TPK_TRY(tpk__check(ctx, fn, "acc", &acc, dy.layout, ctx->dtype, 2, dy.gshape));
    if (acc.data == dy.data && dy.shape[0])
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "acc: must not alias dy");
    if (dy.shape[0])
        TPK_TRY(tpk_op_rmsnorm_bwd(ctx, acc.data, tpk_param_grad(ctx, l->w), dy.data, l->x.data,
                                   tpk_param_data(ctx, l->w), (const float *)l->rstd.p, dy.shape[0],
                                   l->H, ctx->dtype, true));
    tpk__norm_partial_added(ctx, l->sp || l->partial);
    return TPK_OK;
}

/* Its buffers by recompute set (tpk/runtime/buf.h): LENT the output; KEPT rstd; SCRATCH the input
 * gradient. */
static inline int tpk__rmsnorm_bufs(tpk_rmsnorm *l, int set, tpk_buf **o) {
    if (set == TPK__SET_LENT) return o[0] = &l->y, 1;
    if (set == TPK__SET_KEPT) return o[0] = &l->rstd, 1;
    return o[0] = &l->dx, 1;
}

static inline void tpk_rmsnorm_destroy(tpk_ctx *ctx, tpk_rmsnorm *l) {
    tpk__buf_free(ctx, &l->y), tpk__buf_free(ctx, &l->rstd), tpk__buf_free(ctx, &l->dx);
}

/* ---- the partial gradients of a step --------------------------------------------------------- */

/* Whether some key/value head of grouped parameter p is held by two ranks (t > G, or uneven
 * query-head splits that cut a group): its gradient is then partial over the holders. */
static inline bool tpk__param_shared(const tpk_ctx *ctx, const tpk_param *p) {
    if (tpk_layout_group(p->layout) == 1) return false;
    for (int q = 0; q < ctx->tp.size; q++)
        if (tpk_tp_shard_owned(ctx, p->gshape[0], p->layout, q).size !=
            tpk_tp_shard_size(ctx, p->gshape[0], p->layout, q))
            return true;
    return false;
}

/* Parameter i's part of tpk_params_reduce_partial_grads (nothing when its gradient is whole). */
static inline tpk_status tpk__param_reduce_partial(tpk_ctx *ctx, int i) {
    tpk_param *p = &ctx->params.list[i];
    if (p->tp_partial_grad && p->numel)
        TPK_TRY(tpk_allreduce(ctx, &ctx->tp, tpk_param_grad(ctx, i), tpk_param_grad(ctx, i),
                              p->numel, TPK_F32, TPK_SUM));
    if (!tpk__param_shared(ctx, p)) return TPK_OK;
    size_t gn = tpk__gnumel(p), inner = gn / (size_t)p->gshape[0];
    tpk_range r = tpk_tp_shard_run(ctx, p->gshape[0], p->layout, ctx->tp.rank, 0);
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->work[1], gn * sizeof(float)));
    float *g = (float *)ctx->work[1].p;
    tpk_copy_dir dd = ctx->ops->device ? TPK_D2D : TPK_H2H;
    TPK_TRY(tpk_op_fill(ctx, g, TPK_F32, gn, 0.f));
    if (p->numel)
        TPK_TRY(tpk_op_memcpy(ctx, g + (size_t)r.off * inner, tpk_param_grad(ctx, i),
                              p->numel * sizeof(float), dd));
    TPK_TRY(tpk_allreduce(ctx, &ctx->tp, g, g, gn, TPK_F32, TPK_SUM));
    if (p->numel)
        TPK_TRY(tpk_op_memcpy(ctx, tpk_param_grad(ctx, i), g + (size_t)r.off * inner,
                              p->numel * sizeof(float), dd));
    return TPK_OK;
}

/* Sum over TP the gradients that are partial sums there, once per step after the last backward:
 *   - layernorm / RMSNorm weights under sequence parallelism or with partial_dy
 *     (tp_partial_grad): all-reduce;
 *   - grouped-query key/value weights whose heads are held by several ranks: every rank places
 *     its rows in a zeroed global-shaped buffer, one all-reduce sums them, and each takes back
 *     its rows: a shared head's gradient becomes the sum over the ranks that hold it.
 * Every rank makes the same calls (the decisions depend only on the layouts). */
static inline tpk_status tpk_params_reduce_partial_grads(tpk_ctx *ctx) {
    /* (ZeRO-3's sharded gradients: each unit's summed as its backward ends, tpk/train/zero3.h) */
    for (int i = 0; i < ctx->params.n && !ctx->params.gat; i++)
        TPK_TRY(tpk__param_reduce_partial(ctx, i));
    ctx->params.tp_partial_open = false; /* R now */
    return TPK_OK;
}

#endif /* TPK_NORM_H */
