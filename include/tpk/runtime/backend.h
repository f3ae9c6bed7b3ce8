/* tpk/runtime/backend.h — what a compute backend's implementation includes (kernels/host/
 * host_private.h, kernels/cuda/common.cuh), rather than the front end tpk/runtime/op.h: the context
 * (tpk/base/ctx.h: errors, the table tpk/base/ops.h, the counter RNG tpk/base/rng.h) and what the
 * front end and a backend share — the missing-entry error and the fusions composed from the core
 * entries, which the front end calls where a table leaves a fused entry NULL and a backend calls
 * where its own fused kernel has no algorithm for a case (the CUDA epilogues). Private (tpk__). */
#ifndef TPK_BACKEND_H
#define TPK_BACKEND_H

#include "../base/ctx.h"

/* A layer op (TPK__OPS_LAYERS) the table leaves NULL, called: the error names it. */
static inline tpk_status tpk__op_no_entry(tpk_ctx *ctx, const char *fn, const char *entry) {
    return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                     "the backend \"%s\" has no %s entry (a layer op its table leaves NULL)",
                     ctx->ops->name, entry);
}

/* ---- the fusions composed: what a NULL fused entry does (TPK__OPS_FUSED), written once for every
 * backend from the required entries, as each fusion's contract in tpk/base/ops.h states it. The
 * arguments are checked by the front-end entry that calls them. ---- */

/* u = x W^T + bias; act = NONE: y = u, else pre = u, y = act(u) */
static inline tpk_status tpk__compose_linear_fwd(tpk_ctx *ctx, void *y, void *pre, const void *x,
                                                 const void *w, const void *bias, int64_t T,
                                                 int64_t n, int64_t k, tpk_act act, tpk_dtype dt) {
    const tpk_ops *o = ctx->ops;
    void *u = act != TPK_ACT_NONE ? pre : y;
    TPK_TRY(o->gemm(ctx, false, true, T, n, k, 1.0f, x, k, w, k, 0.0f, u, n, dt));
    if (bias) TPK_TRY(o->bias_add(ctx, u, bias, T, n, dt));
    return act != TPK_ACT_NONE ? o->act_fwd(ctx, act, y, u, dt, (size_t)(T * n)) : TPK_OK;
}
/* du = (dy W) act'(pre) (act_bwd in place), db = colsum(du) */
static inline tpk_status tpk__compose_linear_bwd_act(tpk_ctx *ctx, void *du, void *db,
                                                     const void *dy, const void *w, const void *pre,
                                                     int64_t T, int64_t n, int64_t k, tpk_act act,
                                                     tpk_dtype dt) {
    const tpk_ops *o = ctx->ops;
    TPK_TRY(o->gemm(ctx, false, false, T, n, k, 1.0f, dy, k, w, n, 0.0f, du, n, dt));
    TPK_TRY(o->act_bwd(ctx, act, du, pre, du, dt, (size_t)(T * n)));
    return db ? o->bias_grad(ctx, db, du, T, n, dt, dt, false) : TPK_OK;
}
/* x1 = x + r (axpby: 1 r + 1 x, the same sum in dt), then layernorm_fwd on x1 */
static inline tpk_status
tpk__compose_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd,
                                    const void *x, const void *r, const float *w, const float *b,
                                    int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    const tpk_ops *o = ctx->ops;
    size_t n = (size_t)(rows * cols);
    if (!o->layernorm_fwd)
        return tpk__op_no_entry(ctx, "tpk_op_residual_layernorm_fwd", "layernorm_fwd");
    if (x1 == r) { /* x1 = 1 x + 1 x1 */
        TPK_TRY(o->axpby(ctx, x1, 1.0f, x, 1.0f, dt, n));
    } else {
        if (x1 != x)
            TPK_TRY(o->memcpy(ctx, x1, x, n * tpk_dtype_size(dt), o->device ? TPK_D2D : TPK_H2H));
        TPK_TRY(o->axpby(ctx, x1, 1.0f, r, 1.0f, dt, n)); /* x1 = 1 r + 1 x1 */
    }
    return o->layernorm_fwd(ctx, y, mean, rstd, x1, w, b, rows, cols, eps, dt);
}
/* xent_stats, xent_loss (P = 1) and xent_grad with dloss[t] = g, in turn — the bits of the three
 * ops; the statistics [T, 4] and dloss [T] in backend memory allocated for the call */
static inline tpk_status tpk__compose_xent_fused(tpk_ctx *ctx, void *dz, float *loss, float *lse,
                                                 const void *z, const int32_t *targets, int64_t T,
                                                 int64_t V, int64_t ld, float smoothing,
                                                 int32_t ignore_index, float g, tpk_dtype dt) {
    const tpk_ops *o = ctx->ops;
    const char *fn = "tpk_op_xent_fused";
    if (!o->xent_stats || !o->xent_loss || !o->xent_grad)
        return tpk__op_no_entry(ctx, fn,
                                !o->xent_stats  ? "xent_stats"
                                : !o->xent_loss ? "xent_loss"
                                                : "xent_grad");
    void *scratch = NULL;
    TPK_TRY(o->alloc(ctx, sizeof(float) * 5 * (size_t)T, &scratch));
    float *part = (float *)scratch, *dloss = part + 4 * T;
    tpk_status s = o->fill(ctx, dloss, TPK_F32, (size_t)T, g);
    if (s == TPK_OK) s = o->xent_stats(ctx, part, z, targets, T, V, ld, 0, dt);
    if (s == TPK_OK)
        s = o->xent_loss(ctx, loss, lse, part, 1, targets, T, V, smoothing, ignore_index);
    if (s == TPK_OK)
        s = o->xent_grad(ctx, dz, z, lse, targets, dloss, T, V, ld, 0, V, smoothing, ignore_index,
                         dt);
    if (s == TPK_OK) s = o->sync(ctx); /* the scratch is in use until the ops are done */
    o->free(ctx, scratch);
    return s;
}

#endif /* TPK_BACKEND_H */
