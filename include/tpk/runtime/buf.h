/* tpk/runtime/buf.h — growable buffers in the backend's memory, owned by layers and the context.
 *
 * A tpk_buf (tpk/base/ctx.h) is (pointer, bytes). Layers keep their outputs and saved values in
 * buffers they own; a buffer only grows (its contents are not kept when it does). */
#ifndef TPK_BUF_H
#define TPK_BUF_H

#include "op.h"

/* A layer's buffers in three sets, for activation recompute (tpk/layers/recompute.h):
 *   LENT     what selective recompute remakes before the backward (the cheap activations)
 *   KEPT     the rest of what the forward writes (GEMM outputs, statistics, the residual stream)
 *   SCRATCH  what only the backward uses (input gradients, scratch)
 * Each layer lists its own (tpk__<layer>_bufs(layer, set, out) -> how many), in the same order
 * every time; a layer that owns others lists theirs with its own. */
enum {
    TPK__SET_LENT = 1,
    TPK__SET_KEPT = 2,
    TPK__SET_SCRATCH = 4,
    TPK__SETS = 3,
    TPK__SET_MAX = 64 /* a block's of one set: grouped-query attention over CP, SwiGLU and a
                         parallel residual list 47 scratch buffers */
};

/* out[0..n) = l[0..n); returns n (a layer's list of one set). */
static inline int tpk__bufs_list(tpk_buf **out, tpk_buf *const *l, int n) {
    for (int i = 0; i < n; i++) out[i] = l[i];
    return n;
}

/* Grow a backend buffer to at least `bytes` (contents are not kept). */
static inline tpk_status tpk__buf_reserve(tpk_ctx *ctx, tpk_buf *b, size_t bytes) {
    if (b->bytes >= bytes && b->p) return TPK_OK;
    if (b->p) tpk_op_free(ctx, b->p), ctx->mem -= b->bytes;
    b->p = NULL, b->bytes = 0;
    TPK_TRY(tpk_op_alloc(ctx, bytes ? bytes : 1, &b->p));
    b->bytes = bytes;
    ctx->mem += bytes;
    if (ctx->mem > ctx->mem_peak) ctx->mem_peak = ctx->mem;
    return TPK_OK;
}
/* Count `bytes` more (grow) or fewer held outside a tpk_buf (the optimizer's moments) in ctx->mem
 * and its peak. */
static inline void tpk__mem_count(tpk_ctx *ctx, size_t bytes, bool grow) {
    ctx->mem = grow ? ctx->mem + bytes : ctx->mem - bytes;
    if (ctx->mem > ctx->mem_peak) ctx->mem_peak = ctx->mem;
}
static inline void tpk__buf_free(tpk_ctx *ctx, tpk_buf *b) {
    if (b->p) tpk_op_free(ctx, b->p), ctx->mem -= b->bytes;
    b->p = NULL, b->bytes = 0;
}
/* The most bytes the kit's buffers held at once since the context began (or since reset = true
 * last): parameters, gradients, activations, scratch and the optimizer's moments (this rank's
 * slice of them under ZeRO-1) — the allocator's high-water mark, in backend memory (device memory
 * on a GPU). */
static inline size_t tpk_mem_peak(tpk_ctx *ctx, bool reset) {
    size_t p = ctx->mem_peak;
    if (reset) ctx->mem_peak = ctx->mem;
    return p;
}

/* A view of a layer-owned buffer, grown to fit `t`'s local shape; sets t->data. */
static inline tpk_status tpk__buf_view(tpk_ctx *ctx, tpk_buf *b, tpk_tensor *t) {
    TPK_TRY(tpk__buf_reserve(ctx, b, tpk_nbytes(t)));
    t->data = b->p;
    return TPK_OK;
}

/* A view of the context's sequence-parallel scratch (ctx->sp), grown to fit `t`: full-token
 * activations that live only within one layer call (an all-gathered input or output gradient,
 * partial sums before their reduce-scatter), so that no layer keeps a [T, features] copy of its
 * own. Whatever it held before is overwritten. */
static inline tpk_status tpk__sp_view(tpk_ctx *ctx, tpk_tensor *t) {
    return tpk__buf_view(ctx, &ctx->sp, t);
}

/* Copy host int32 data to backend memory. */
static inline tpk_status tpk__upload_i32(tpk_ctx *ctx, tpk_buf *b, const int32_t *host, int64_t n) {
    TPK_TRY(tpk__buf_reserve(ctx, b, sizeof(int32_t) * (size_t)(n ? n : 1)));
    return n ? tpk_op_memcpy(ctx, b->p, host, sizeof(int32_t) * (size_t)n,
                             ctx->ops->device ? TPK_H2D : TPK_H2H)
             : TPK_OK;
}

#endif /* TPK_BUF_H */
