/* tpk/ops.h — the compute backend interface: a table of kernels over raw buffers.
 *
 * tpk_ops_host() (build/libtpk_host.a, OpenBLAS + plain C) and tpk_ops_cuda()
 * (build/libtpk_cuda.a) fill the same table with the same contract, so one layer runs on
 * either and a test can compare them. A user may fill a table with their own kernels.
 * All matrices are row-major; leading dimensions are in elements. Buffers are in the
 * backend's memory (`device`); memcpy moves between host and backend memory.
 * Every entry reports failure as a status and a message in ctx (tpk__fail). */
#ifndef TPK_OPS_H
#define TPK_OPS_H

#include "core.h"

typedef struct tpk_ctx tpk_ctx;

typedef enum tpk_copy_dir { TPK_H2D = 0, TPK_D2H, TPK_D2D, TPK_H2H } tpk_copy_dir;
typedef enum tpk_rng_dist { TPK_RNG_NORMAL = 0, TPK_RNG_UNIFORM = 1 } tpk_rng_dist;

typedef struct tpk_ops {
    const char *name;
    void *self;  /* backend state (handles, streams) */
    bool device; /* buffers live in device memory */

    /* memory */
    tpk_status (*alloc)(tpk_ctx *ctx, size_t bytes, void **out); /* zero-filled */
    void (*free)(tpk_ctx *ctx, void *p);
    tpk_status (*memcpy)(tpk_ctx *ctx, void *dst, const void *src, size_t bytes, tpk_copy_dir dir);
    tpk_status (*sync)(tpk_ctx *ctx);

    /* x[0..n) = value */
    tpk_status (*fill)(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value);
    /* dst[i, j] = src[i, j] for i < rows, j < cols; ldd, lds in elements */
    tpk_status (*copy2d)(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                         int64_t cols, tpk_dtype dt);
    /* dst[i] = (dst dtype) src[i]; f32 -> bf16 rounds to nearest even */
    tpk_status (*cast)(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src, tpk_dtype src_dt, size_t n);
    /* y[i] = a * x[i] + b * y[i]; b = 0 ignores y (NaN in y does not leak) */
    tpk_status (*axpby)(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt, size_t n);

    /* C[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * C; op = transpose when ta / tb.
     * A is [m, k] (or [k, m] when ta), B is [k, n] (or [n, k] when tb). beta = 0 ignores C;
     * k = 0 or alpha = 0 gives C = beta C without reading A or B. */
    tpk_status (*gemm)(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                       int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt);
    /* y[i, j] += bias[j]  for y [rows, cols] */
    tpk_status (*bias_add)(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols, tpk_dtype dt);
    /* db[j] = sum_i dy[i, j] + (accumulate ? db[j] : 0)  for dy [rows, cols]; db has dy's dtype */
    tpk_status (*bias_grad)(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols, tpk_dtype dt,
                            bool accumulate);
    /* GELU, tanh approximation (GPT-2): y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    tpk_status (*gelu_fwd)(tpk_ctx *ctx, void *y, const void *x, tpk_dtype dt, size_t n);
    /* dx = dy * gelu'(x); dx may alias dy */
    tpk_status (*gelu_bwd)(tpk_ctx *ctx, void *dx, const void *x, const void *dy, tpk_dtype dt, size_t n);

    /* Counter-based random numbers (tpk/rng.h): x[i, j] = a + b * draw(seed, stream,
     * index = (row0 + i) * gcols + col0 + j) for x [rows, cols], contiguous. NORMAL draws are
     * N(0,1), UNIFORM draws are in [0, 1). The value depends only on (seed, stream, index),
     * so a shard draws exactly its slice of the unsharded tensor. */
    tpk_status (*rng_2d)(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols, int64_t gcols,
                         int64_t row0, int64_t col0, uint64_t seed, uint64_t stream, tpk_rng_dist dist, float a,
                         float b);
} tpk_ops;

/* The host backend (build/libtpk_host.a): fp32 arithmetic, OpenBLAS GEMMs. */
const tpk_ops *tpk_ops_host(void);

#endif /* TPK_OPS_H */
