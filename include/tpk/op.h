/* tpk/op.h — the checked front end of the compute backend: one inline entry per op.
 *
 * Layers and users call tpk_op_<name>(ctx, ...) with the arguments of the table entry
 * ctx->ops-><name> (contracts in tpk/ops.h). Each entry validates its arguments once, for every
 * backend (a user's own table included), naming the argument and the expected value in the
 * context's error, and then dispatches to the table. Backends hold kernels and launchers only. */
#ifndef TPK_OP_H
#define TPK_OP_H

#include "ctx.h"

/* The first entry of a backend table that is NULL ("" for a complete table): tpk_ctx_init
 * refuses an incomplete table, naming the entry. */
static inline const char *tpk__ops_missing(const tpk_ops *ops) {
    if (!ops->name) return "name";
    if (!ops->alloc) return "alloc";
    if (!ops->free) return "free";
    if (!ops->memcpy) return "memcpy";
    if (!ops->sync) return "sync";
    if (!ops->fill) return "fill";
    if (!ops->copy2d) return "copy2d";
    if (!ops->cast) return "cast";
    if (!ops->axpby) return "axpby";
    if (!ops->gemm) return "gemm";
    if (!ops->bias_add) return "bias_add";
    if (!ops->bias_grad) return "bias_grad";
    if (!ops->gelu_fwd) return "gelu_fwd";
    if (!ops->gelu_bwd) return "gelu_bwd";
    if (!ops->rng_2d) return "rng_2d";
    if (!ops->dropout) return "dropout";
    if (!ops->layernorm_fwd) return "layernorm_fwd";
    if (!ops->layernorm_bwd) return "layernorm_bwd";
    if (!ops->embed_fwd) return "embed_fwd";
    if (!ops->embed_bwd) return "embed_bwd";
    if (!ops->xent_max) return "xent_max";
    if (!ops->xent_partial) return "xent_partial";
    if (!ops->xent_loss) return "xent_loss";
    if (!ops->xent_grad) return "xent_grad";
    if (!ops->attn_fwd) return "attn_fwd";
    if (!ops->attn_bwd) return "attn_bwd";
    if (!ops->adamw) return "adamw";
    if (!ops->sumsq) return "sumsq";
    if (!ops->linear_fwd) return "linear_fwd";
    if (!ops->residual_layernorm_fwd) return "residual_layernorm_fwd";
    return "";
}

static inline tpk_status tpk_op_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    return ctx->ops->alloc(ctx, bytes, out);
}
static inline void tpk_op_free(tpk_ctx *ctx, void *p) { ctx->ops->free(ctx, p); }
static inline tpk_status tpk_op_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes, tpk_copy_dir dir) {
    return ctx->ops->memcpy(ctx, dst, src, bytes, dir);
}
static inline tpk_status tpk_op_sync(tpk_ctx *ctx) {
    return ctx->ops->sync(ctx);
}
static inline tpk_status tpk_op_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    return ctx->ops->fill(ctx, x, dt, n, value);
}
static inline tpk_status tpk_op_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows, int64_t cols, tpk_dtype dt) {
    return ctx->ops->copy2d(ctx, dst, ldd, src, lds, rows, cols, dt);
}
static inline tpk_status tpk_op_cast(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src, tpk_dtype src_dt, size_t n) {
    return ctx->ops->cast(ctx, dst, dst_dt, src, src_dt, n);
}
static inline tpk_status tpk_op_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt, size_t n) {
    return ctx->ops->axpby(ctx, y, a, x, b, dt, n);
}
static inline tpk_status tpk_op_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt) {
    return ctx->ops->gemm(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt);
}
static inline tpk_status tpk_op_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols, tpk_dtype dt) {
    return ctx->ops->bias_add(ctx, y, bias, rows, cols, dt);
}
static inline tpk_status tpk_op_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate) {
    return ctx->ops->bias_grad(ctx, db, dy, rows, cols, dt, accumulate);
}
static inline tpk_status tpk_op_gelu_fwd(tpk_ctx *ctx, void *y, const void *x, tpk_dtype dt, size_t n) {
    return ctx->ops->gelu_fwd(ctx, y, x, dt, n);
}
static inline tpk_status tpk_op_gelu_bwd(tpk_ctx *ctx, void *dx, const void *x, const void *dy, tpk_dtype dt, size_t n) {
    return ctx->ops->gelu_bwd(ctx, dx, x, dy, dt, n);
}
static inline tpk_status tpk_op_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols, int64_t gcols, int64_t row0, int64_t col0, uint64_t seed, uint64_t stream, tpk_rng_dist dist, float a, float b) {
    return ctx->ops->rng_2d(ctx, x, dt, rows, cols, gcols, row0, col0, seed, stream, dist, a, b);
}
static inline tpk_status tpk_op_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0, int64_t col0, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    return ctx->ops->dropout(ctx, y, x, rows, cols, gcols, row0, col0, p, seed, stream, dt);
}
static inline tpk_status tpk_op_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    return ctx->ops->layernorm_fwd(ctx, y, mean, rstd, x, w, b, rows, cols, eps, dt);
}
static inline tpk_status tpk_op_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w, const float *mean, const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx) {
    return ctx->ops->layernorm_bwd(ctx, dx, dw, db, dy, x, w, mean, rstd, rows, cols, dt, accumulate_dx);
}
static inline tpk_status tpk_op_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table, int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt, bool accumulate) {
    return ctx->ops->embed_fwd(ctx, y, ids, table, T, H, v0, vrows, dt, accumulate);
}
static inline tpk_status tpk_op_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt) {
    return ctx->ops->embed_bwd(ctx, dtable, dy, ids, T, H, v0, vrows, dt);
}
static inline tpk_status tpk_op_xent_max(tpk_ctx *ctx, float *mx, const void *z, int64_t T, int64_t Vl, tpk_dtype dt) {
    return ctx->ops->xent_max(ctx, mx, z, T, Vl, dt);
}
static inline tpk_status tpk_op_xent_partial(tpk_ctx *ctx, float *part, const void *z, const float *mx, const int32_t *targets, int64_t T, int64_t Vl, int64_t v0, tpk_dtype dt) {
    return ctx->ops->xent_partial(ctx, part, z, mx, targets, T, Vl, v0, dt);
}
static inline tpk_status tpk_op_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *mx, const float *part, const int32_t *targets, int64_t T, int64_t V, float smoothing, int32_t ignore_index) {
    return ctx->ops->xent_loss(ctx, loss, lse, mx, part, targets, T, V, smoothing, ignore_index);
}
static inline tpk_status tpk_op_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse, const int32_t *targets, const float *dloss, int64_t T, int64_t Vl, int64_t v0, int64_t V, float smoothing, int32_t ignore_index, tpk_dtype dt) {
    return ctx->ops->xent_grad(ctx, dz, z, lse, targets, dloss, T, Vl, v0, V, smoothing, ignore_index, dt);
}
static inline tpk_status tpk_op_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    return ctx->ops->attn_fwd(ctx, out, lse, qkv, B, S, Al, D, A, head0, scale, p, seed, stream, dt);
}
static inline tpk_status tpk_op_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse, int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    return ctx->ops->attn_bwd(ctx, dqkv, dout, qkv, out, lse, B, S, Al, D, A, head0, scale, p, seed, stream, dt);
}
static inline tpk_status tpk_op_adamw(tpk_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int64_t step, float grad_scale) {
    return ctx->ops->adamw(ctx, w, g, m, v, n, lr, b1, b2, eps, wd, step, grad_scale);
}
static inline tpk_status tpk_op_sumsq(tpk_ctx *ctx, double *out, const float *x, size_t n) {
    return ctx->ops->sumsq(ctx, out, x, n);
}
static inline tpk_status tpk_op_linear_fwd(tpk_ctx *ctx, void *y, void *pre, const void *x, const void *w, const void *bias, int64_t T, int64_t n, int64_t k, bool gelu, tpk_dtype dt) {
    return ctx->ops->linear_fwd(ctx, y, pre, x, w, bias, T, n, k, gelu, dt);
}
static inline tpk_status tpk_op_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd, const void *x, const void *r, const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    return ctx->ops->residual_layernorm_fwd(ctx, x1, y, mean, rstd, x, r, w, b, rows, cols, eps, dt);
}

#endif /* TPK_OP_H */
