/* kernels/host/host_private.h — private helpers of the host backend: element access for both
 * dtypes, one-loop-per-op instantiation, OpenBLAS's int limit, out-of-memory errors. Arguments
 * are checked once, before an op is reached, by the front end (tpk/op.h). Not installed. */
#ifndef TPK_HOST_PRIVATE_H
#define TPK_HOST_PRIVATE_H

#include <limits.h>
#include <math.h>

#include <tpk/op.h>
#include <tpk/rng.h>

#if defined(__GNUC__)
#define TPK__HOST_INLINE static inline __attribute__((always_inline))
#else
#define TPK__HOST_INLINE static inline
#endif

/* ---- element access ------------------------------------------------------------------------- */

TPK__HOST_INLINE float tpk__ld(const void *p, tpk_dtype dt, size_t i) {
    return dt == TPK_F32 ? ((const float *)p)[i] : tpk_bf16_to_f32(((const uint16_t *)p)[i]);
}
TPK__HOST_INLINE void tpk__st(void *p, tpk_dtype dt, size_t i, float v) {
    if (dt == TPK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = tpk_f32_to_bf16(v);
}

/* Call f(TPK_F32, ...) or f(TPK_BF16, ...): a loop written once, compiled once per dtype. */
#define TPK__BY_DTYPE(dt, f, ...) ((dt) == TPK_F32 ? f(TPK_F32, __VA_ARGS__) : f(TPK_BF16, __VA_ARGS__))

/* ---- what only this backend can know ------------------------------------------------------------ */

/* Arguments arrive checked by the front end (tpk/op.h); OpenBLAS takes int sizes. */
static inline tpk_status tpk__host_blas_int(tpk_ctx *ctx, const char *fn, const char *arg, int64_t v) {
    if (v <= INT_MAX) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected <= %d (OpenBLAS int), got %lld", arg, INT_MAX, (long long)v);
}
static inline tpk_status tpk__host_nomem(tpk_ctx *ctx, const char *fn, size_t bytes) {
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
