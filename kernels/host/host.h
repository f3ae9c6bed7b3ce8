/* kernels/host/host.h — private helpers of the host backend: element access for both dtypes,
 * one-loop-per-op instantiation, argument checks. Not installed. */
#ifndef TPK_HOST_PRIVATE_H
#define TPK_HOST_PRIVATE_H

#include <limits.h>
#include <math.h>

#include <tpk/ctx.h>
#include <tpk/rng.h>

#if defined(__GNUC__)
#define HOST_INLINE static inline __attribute__((always_inline))
#else
#define HOST_INLINE static inline
#endif

/* ---- element access ------------------------------------------------------------------------- */

HOST_INLINE float ld(const void *p, tpk_dtype dt, size_t i) {
    return dt == TPK_F32 ? ((const float *)p)[i] : tpk_bf16_to_f32(((const uint16_t *)p)[i]);
}
HOST_INLINE void st(void *p, tpk_dtype dt, size_t i, float v) {
    if (dt == TPK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = tpk_f32_to_bf16(v);
}

/* Call f(TPK_F32, ...) or f(TPK_BF16, ...): a loop written once, compiled once per dtype. */
#define BY_DTYPE(dt, f, ...) ((dt) == TPK_F32 ? f(TPK_F32, __VA_ARGS__) : f(TPK_BF16, __VA_ARGS__))

/* ---- argument checks -------------------------------------------------------------------------- */

static inline tpk_status check_float_dtype(tpk_ctx *ctx, const char *fn, const char *arg, tpk_dtype dt) {
    if (dt == TPK_F32 || dt == TPK_BF16) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "%s: expected f32 or bf16, got %s (%d)", arg, tpk_dtype_name(dt), (int)dt);
}
static inline tpk_status check_nonneg(tpk_ctx *ctx, const char *fn, const char *arg, int64_t v) {
    if (v >= 0) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected >= 0, got %lld", arg, (long long)v);
}
static inline tpk_status check_ptr(tpk_ctx *ctx, const char *fn, const char *arg, const void *p, bool needed) {
    if (p || !needed) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a buffer, got NULL", arg);
}
/* Leading dimension: ld >= max(1, min). */
static inline tpk_status check_ld(tpk_ctx *ctx, const char *fn, const char *arg, int64_t ld, int64_t min) {
    if (min < 1) min = 1;
    if (ld >= min) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected >= %lld, got %lld", arg, (long long)min, (long long)ld);
}
static inline tpk_status check_blas_int(tpk_ctx *ctx, const char *fn, const char *arg, int64_t v) {
    if (v <= INT_MAX) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected <= %d (OpenBLAS int), got %lld", arg, INT_MAX, (long long)v);
}
static inline tpk_status nomem(tpk_ctx *ctx, const char *fn, size_t bytes) {
    return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "could not allocate %zu bytes of host memory", bytes);
}


/* The layer ops of the host backend (ops_host_layers.c); contracts in tpk/ops.h. */
tpk_status tpk__host_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                             int64_t col0, float p, uint64_t seed, uint64_t stream, tpk_dtype dt);
tpk_status tpk__host_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                                   int64_t rows, int64_t cols, float eps, tpk_dtype dt);
tpk_status tpk__host_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd, const void *x, const void *r,
                                            const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt);
tpk_status tpk__host_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                                   const float *mean, const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx);
tpk_status tpk__host_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt, bool accumulate);
tpk_status tpk__host_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt);
tpk_status tpk__host_xent_max(tpk_ctx *ctx, float *mx, const void *z, int64_t T, int64_t Vl, tpk_dtype dt);
tpk_status tpk__host_xent_partial(tpk_ctx *ctx, float *part, const void *z, const float *mx, const int32_t *targets, int64_t T,
                                  int64_t Vl, int64_t v0, tpk_dtype dt);
tpk_status tpk__host_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *mx, const float *part, const int32_t *targets,
                               int64_t T, int64_t V, float smoothing, int32_t ignore_index);
tpk_status tpk__host_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse, const int32_t *targets, const float *dloss,
                               int64_t T, int64_t Vl, int64_t v0, int64_t V, float smoothing, int32_t ignore_index, tpk_dtype dt);
tpk_status tpk__host_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al, int64_t D,
                              int64_t A, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt);
tpk_status tpk__host_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t head0, float scale, float p,
                              uint64_t seed, uint64_t stream, tpk_dtype dt);

#endif
