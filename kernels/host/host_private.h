/* kernels/host/host_private.h — private helpers of the host backend: element access for both
 * dtypes, one-loop-per-op instantiation, OpenBLAS's int limit, out-of-memory errors. Arguments
 * are checked once, before an op is reached, by the front end (tpk/runtime/op.h); the backend
 * sees the context and the table through tpk/runtime/backend.h. Not installed. */
#ifndef TPK_HOST_PRIVATE_H
#define TPK_HOST_PRIVATE_H

#include <limits.h>
#include <math.h>

#include <tpk/runtime/backend.h>
#include <tpk/base/rng.h>

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
#define TPK__BY_DTYPE(dt, f, ...) \
    ((dt) == TPK_F32 ? f(TPK_F32, __VA_ARGS__) : f(TPK_BF16, __VA_ARGS__))

/* ---- what only this backend can know --------------------------------------------------------- */

/* Arguments arrive checked by the front end (tpk/runtime/op.h); OpenBLAS takes int sizes. */
static inline tpk_status tpk__host_blas_int(tpk_ctx *ctx, const char *fn, const char *arg,
                                            int64_t v) {
    if (v <= INT_MAX) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected <= %d (OpenBLAS int), got %lld", arg,
                     INT_MAX, (long long)v);
}
static inline tpk_status tpk__host_nomem(tpk_ctx *ctx, const char *fn, size_t bytes) {
    return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "could not allocate %zu bytes of host memory", bytes);
}

/* ---- threads (pool.c) ------------------------------------------------------------------------ */

enum { TPK__HOST_MAX_THREADS = 64 };
/* one part of an op's loop: the elements, rows or chunks [lo, hi) */
typedef void (*tpk__host_part_fn)(void *arg, int64_t lo, int64_t hi);
/* the threads an op's loop is split over (OpenBLAS's count, at most the CPUs allowed) */
int tpk__host_threads(void);
/* fn(arg, lo, hi) over [0, n) in contiguous parts of at least grain, one per thread, the caller
 * taking the first; returns when every part has run */
void tpk__host_par(int64_t n, int64_t grain, tpk__host_part_fn fn, void *arg);

/* u[j] = tpk_dropout_u(seed, stream, x0 + j) for j < n: Philox 8 calls at a time with AVX2
 * (rng.c) */
void tpk__host_dropout_u(uint64_t seed, uint64_t stream, uint64_t x0, int64_t n, float *u);

/* Each file of the backend fills its entries of the table (table.c). */
void tpk__host_state_ops(tpk_ops *o);
void tpk__host_elementwise_ops(tpk_ops *o);
void tpk__host_gemm_ops(tpk_ops *o);
void tpk__host_optim_ops(tpk_ops *o);
void tpk__host_rng_ops(tpk_ops *o);
void tpk__host_norm_ops(tpk_ops *o);
void tpk__host_rope_swiglu_ops(tpk_ops *o);
void tpk__host_embed_ops(tpk_ops *o);
void tpk__host_rows_ops(tpk_ops *o);
void tpk__host_xent_ops(tpk_ops *o);
void tpk__host_attn_ops(tpk_ops *o);

#endif
