/* kernels/host/ops_host.c — the host backend: every tpk_ops entry in plain C11 + OpenBLAS.
 *
 * The reference the CUDA backend and the layer tests are checked against. Buffers are host
 * memory (device = false), arithmetic is fp32; bf16 is a storage format only: elements are
 * widened to f32 on load and rounded to nearest even on store (tpk_f32_to_bf16).
 *
 *   gemm      C = alpha op(A) op(B) + beta C         cblas_sgemm (row-major); bf16 operands are
 *                                                    widened into f32 copies, C rounded back.
 *                                                    beta = 0 ignores C (NaN in C does not leak);
 *                                                    k = 0 or alpha = 0 gives C = beta C.
 *   gemm_acc  gemm into an f32 C whatever dt: bf16 A, B widened, C multiplied into in place (not rounded).
 *   axpby     y = a x + b y                          b = 0 ignores y, like beta in gemm
 *   bias_add  y[i, j] += bias[j]
 *   bias_grad db[j] = sum_i dy[i, j] (+ db[j])       summed in double, row by row
 *   act_fwd   GELU-tanh: y = x/2 (1 + tanh(s (x + c x^3)))    s = sqrt(2/pi), c = 0.044715;  NONE: y = x
 *   act_bwd   GELU-tanh: dx = dy (1/2 (1 + t) + x/2 (1 - t^2) s (1 + 3 c x^2)), t = tanh(s (x + c x^3))
 *   rng_2d    x[i, j] = a + b draw(seed, stream, (row0 + i) gcols + col0 + j)   (tpk/rng.h)
 *   adamw     m, v moments; w -= lr (m_hat / (sqrt(v_hat) + eps) + wd w)
 *   sumsq     sum x^2 in double (the gradient norm)
 *   linear_fwd  y = x W^T + bias (then the activation, keeping the pre-activation): gemm + bias_add + act_fwd
 * Arguments arrive checked by the front end (tpk/op.h); this backend checks only what is its own
 * (OpenBLAS's int sizes, allocation).
 *
 * Every op has one loop for both dtypes: it reads through tpk__ld() and writes through tpk__st(), and is
 * instantiated with a constant dtype (TPK__BY_DTYPE) so the compiler drops the dtype branch.
 * i32 buffers can be moved (memcpy, copy2d, same-dtype cast) but not computed on. */
#include <limits.h>
#include <math.h>

#include <cblas.h>
#include <pthread.h>

#include <tpk/host.h>
#include <tpk/op.h>
#include <tpk/rng.h>

#include "host_private.h"

/* ---- memory ------------------------------------------------------------------------------------ */

static tpk_status host_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    static const char *fn = "host.alloc";
    *out = NULL;
    if (bytes > SIZE_MAX - 63) return tpk__host_nomem(ctx, fn, bytes);
    size_t rounded = (bytes + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) return tpk__host_nomem(ctx, fn, bytes);
    memset(p, 0, rounded);
    *out = p;
    return TPK_OK;
}

static void host_free(tpk_ctx *ctx, void *p) {
    (void)ctx;
    free(p);
}

static tpk_status host_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes, tpk_copy_dir dir) {
    (void)ctx, (void)dir;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return TPK_OK;
}

static tpk_status host_sync(tpk_ctx *ctx) {
    (void)ctx;
    return TPK_OK;
}

/* ---- fill, copy2d, cast, axpby ---------------------------------------------------------------- */

TPK__HOST_INLINE void fill_loop(tpk_dtype dt, void *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++) tpk__st(x, dt, i, value);
}
static tpk_status host_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    (void)ctx;
    TPK__BY_DTYPE(dt, fill_loop, x, n, value);
    return TPK_OK;
}

/* Rows are moved as bytes, so every dtype (i32 too) is copied exactly. */
static tpk_status host_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                              int64_t cols, tpk_dtype dt) {
    (void)ctx;
    bool any = rows > 0 && cols > 0;
    if (!any) return TPK_OK;
    size_t es = tpk_dtype_size(dt), row = (size_t)cols * es;
    for (int64_t i = 0; i < rows; i++)
        memmove((char *)dst + (size_t)i * (size_t)ldd * es, (const char *)src + (size_t)i * (size_t)lds * es, row);
    return TPK_OK;
}

TPK__HOST_INLINE void cast_loop(tpk_dtype ddt, void *dst, const void *src, tpk_dtype sdt, size_t n) {
    for (size_t i = 0; i < n; i++) tpk__st(dst, ddt, i, tpk__ld(src, sdt, i));
}
static tpk_status host_cast(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src, tpk_dtype src_dt, size_t n) {
    (void)ctx;
    if (n == 0) return TPK_OK;
    if (dst_dt == src_dt) {
        if (dst != src) memmove(dst, src, n * tpk_dtype_size(dst_dt));
        return TPK_OK;
    }
    /* f32 -> bf16 rounds to nearest even; bf16 -> f32 is exact */
    TPK__BY_DTYPE(dst_dt, cast_loop, dst, src, src_dt, n);
    return TPK_OK;
}

TPK__HOST_INLINE void axpby_loop(tpk_dtype dt, void *y, float a, const void *x, float b, size_t n) {
    if (b == 0.0f)
        for (size_t i = 0; i < n; i++) tpk__st(y, dt, i, a * tpk__ld(x, dt, i));
    else
        for (size_t i = 0; i < n; i++) tpk__st(y, dt, i, a * tpk__ld(x, dt, i) + b * tpk__ld(y, dt, i));
}
static tpk_status host_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt, size_t n) {
    (void)ctx;
    TPK__BY_DTYPE(dt, axpby_loop, y, a, x, b, n);
    return TPK_OK;
}

/* ---- gemm ---------------------------------------------------------------------------------------- */

/* dst[rows, cols] (contiguous f32) = src[rows, cols] with leading dimension ld. */
TPK__HOST_INLINE void widen_loop(tpk_dtype dt, float *dst, const void *src, int64_t lds, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) dst[i * cols + j] = tpk__ld(src, dt, (size_t)(i * lds + j));
}
/* C = beta C over [m, n] with leading dimension ldc; beta = 0 writes zeros whatever C held. */
TPK__HOST_INLINE void scale_loop(tpk_dtype dt, void *c, int64_t ldc, int64_t m, int64_t n, float beta) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            size_t at = (size_t)(i * ldc + j);
            tpk__st(c, dt, at, beta == 0.0f ? 0.0f : beta * tpk__ld(c, dt, at));
        }
}

/* C = alpha op(A) op(B) + beta C with A, B in dt and C in cdt (dt, or f32 for gemm_acc). */
static tpk_status gemm_run(tpk_ctx *ctx, const char *fn, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                           int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt, tpk_dtype cdt) {
    /* stored shapes: A is [m, k] or [k, m] (ta), B is [k, n] or [n, k] (tb), C is [m, n] */
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    TPK_TRY(tpk__host_blas_int(ctx, fn, "m", m));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "n", n));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "k", k));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "lda", lda));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "ldb", ldb));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "ldc", ldc));
    /* an operand may be NULL only when the product does not touch it (an empty C, or k = 0) */
    if (m == 0 || n == 0) return TPK_OK;
    if (k == 0 || alpha == 0.0f) { /* no product: C = beta C (and no reads of A, B) */
        if (beta != 1.0f) TPK__BY_DTYPE(cdt, scale_loop, c, ldc, m, n, beta);
        return TPK_OK;
    }
    enum CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    if (dt == TPK_F32) {
        cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, alpha, (const float *)a, (int)lda,
                    (const float *)b, (int)ldb, beta, (float *)c, (int)ldc);
        return TPK_OK;
    }
    /* bf16: widen A, B into packed f32; an f32 C is multiplied into in place, a bf16 C is widened
     * (when read), multiplied into and rounded back */
    bool wide_c = cdt == TPK_BF16;
    size_t na = (size_t)a_rows * (size_t)a_cols, nb = (size_t)b_rows * (size_t)b_cols, nc = wide_c ? (size_t)m * (size_t)n : 1;
    float *fa = malloc(na * sizeof(float)), *fb = malloc(nb * sizeof(float)), *fc = wide_c ? malloc(nc * sizeof(float)) : (float *)c;
    if (!fa || !fb || !fc) {
        size_t want = !fa ? na : !fb ? nb : nc;
        free(fa), free(fb);
        if (wide_c) free(fc);
        return tpk__host_nomem(ctx, fn, want * sizeof(float));
    }
    widen_loop(TPK_BF16, fa, a, lda, a_rows, a_cols);
    widen_loop(TPK_BF16, fb, b, ldb, b_rows, b_cols);
    if (wide_c && beta != 0.0f) widen_loop(TPK_BF16, fc, c, ldc, m, n);
    cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, alpha, fa, (int)a_cols, fb, (int)b_cols, beta, fc,
                wide_c ? (int)n : (int)ldc);
    if (wide_c) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) tpk__st(c, TPK_BF16, (size_t)(i * ldc + j), fc[i * n + j]);
        free(fc);
    }
    free(fa), free(fb);
    return TPK_OK;
}
static tpk_status host_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                            int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt) {
    return gemm_run(ctx, "host.gemm", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, dt);
}
static tpk_status host_gemm_acc(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                                int64_t lda, const void *b, int64_t ldb, float beta, float *c, int64_t ldc, tpk_dtype dt) {
    return gemm_run(ctx, "host.gemm_acc", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, TPK_F32);
}

/* ---- bias ------------------------------------------------------------------------------------------ */

TPK__HOST_INLINE void bias_add_loop(tpk_dtype dt, void *y, const void *bias, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            size_t at = (size_t)(i * cols + j);
            tpk__st(y, dt, at, tpk__ld(y, dt, at) + tpk__ld(bias, dt, (size_t)j));
        }
}
static tpk_status host_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, bias_add_loop, y, bias, rows, cols);
    return TPK_OK;
}

/* acc[cols] (double) sums dy row by row, so dy is read in memory order. */
TPK__HOST_INLINE void bias_grad_loop(tpk_dtype dt, void *db, const void *dy, int64_t rows, int64_t cols, tpk_dtype db_dt, bool accumulate,
                                double *acc) {
    for (int64_t j = 0; j < cols; j++) acc[j] = accumulate ? tpk__ld(db, db_dt, (size_t)j) : 0.0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) acc[j] += tpk__ld(dy, dt, (size_t)(i * cols + j));
    for (int64_t j = 0; j < cols; j++) tpk__st(db, db_dt, (size_t)j, (float)acc[j]);
}
static tpk_status host_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols, tpk_dtype dt, tpk_dtype db_dt,
                                 bool accumulate) {
    static const char *fn = "host.bias_grad";
    if (cols == 0) return TPK_OK;
    double *acc = malloc((size_t)cols * sizeof(double));
    if (!acc) return tpk__host_nomem(ctx, fn, (size_t)cols * sizeof(double));
    TPK__BY_DTYPE(dt, bias_grad_loop, db, dy, rows, cols, db_dt, accumulate, acc);
    free(acc);
    return TPK_OK;
}

/* ---- activations (tpk_act): one loop per direction, the activation a switch ----------------------- */

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* 1/2 (1 + tanh(u)) = sigmoid(2u): one expf, no tanhf (expf(-2u) = inf gives 0, not NaN) */
static inline float gelu_sig(float v) { return 1.0f / (1.0f + expf(-2.0f * GELU_S * (v + GELU_C * v * v * v))); }

/* act(v) and act'(v); GELU-tanh: 1 - t^2 = 4 sg (1 - sg) */
TPK__HOST_INLINE float act_value(tpk_act act, float v) {
    switch (act) {
    case TPK_ACT_GELU_TANH: return v * gelu_sig(v);
    default: return v;
    }
}
TPK__HOST_INLINE float act_slope(tpk_act act, float v) {
    switch (act) {
    case TPK_ACT_GELU_TANH: {
        float sg = gelu_sig(v);
        return sg + 2.0f * v * sg * (1.0f - sg) * GELU_S * (1.0f + 3.0f * GELU_C * v * v);
    }
    default: return 1.0f;
    }
}

TPK__HOST_INLINE void act_fwd_loop(tpk_dtype dt, tpk_act act, void *y, const void *x, size_t n) {
    for (size_t i = 0; i < n; i++) tpk__st(y, dt, i, act_value(act, tpk__ld(x, dt, i)));
}
/* NONE is a copy (nothing in place) */
static tpk_status host_act_fwd(tpk_ctx *ctx, tpk_act act, void *y, const void *x, tpk_dtype dt, size_t n) {
    (void)ctx;
    if (act == TPK_ACT_NONE) {
        if (y != x) memmove(y, x, n * tpk_dtype_size(dt));
        return TPK_OK;
    }
    TPK__BY_DTYPE(dt, act_fwd_loop, act, y, x, n);
    return TPK_OK;
}

/* dy[i] is read before dx[i] is written, so dx may alias dy. */
TPK__HOST_INLINE void act_bwd_loop(tpk_dtype dt, tpk_act act, void *dx, const void *x, const void *dy, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = tpk__ld(x, dt, i), g = tpk__ld(dy, dt, i);
        tpk__st(dx, dt, i, g * act_slope(act, v));
    }
}
/* NONE: dx = dy */
static tpk_status host_act_bwd(tpk_ctx *ctx, tpk_act act, void *dx, const void *x, const void *dy, tpk_dtype dt, size_t n) {
    (void)ctx;
    if (act == TPK_ACT_NONE) {
        if (dx != dy) memmove(dx, dy, n * tpk_dtype_size(dt));
        return TPK_OK;
    }
    TPK__BY_DTYPE(dt, act_bwd_loop, act, dx, x, dy, n);
    return TPK_OK;
}

/* ---- optimizer ------------------------------------------------------------------------------------ */

static tpk_status host_adamw(tpk_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                             float eps, float wd, int64_t step, float grad_scale, double *norm, float clip, const int64_t *decay, int64_t nruns,
                             uint16_t *w16) {
    (void)ctx;
    if (norm) { /* the gradient's norm from its sum of squares: skip a step whose norm is not finite, else clip */
        double N = sqrt(norm[0]) * grad_scale;
        if (!isfinite(N)) return norm[1] += 1, TPK_OK;
        grad_scale *= TPK__CLIP_FACTOR(N, clip);
    }
    float c1 = 1.0f / (1.0f - powf(b1, (float)step)), c2 = 1.0f / (1.0f - powf(b2, (float)step));
    int64_t r = 0; /* the first run that does not end at or before i */
    for (size_t i = 0; i < n; i++) {
        while (decay && r < nruns && decay[2 * r + 1] <= (int64_t)i) r++;
        float wdi = !decay || (r < nruns && decay[2 * r] <= (int64_t)i) ? wd : 0.0f;
        float gi = g[i] * grad_scale;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        w[i] -= lr * (m[i] * c1 / (sqrtf(v[i] * c2) + eps) + wdi * w[i]);
        if (w16) w16[i] = tpk_f32_to_bf16(w[i]);
    }
    return TPK_OK;
}

static tpk_status host_sumsq(tpk_ctx *ctx, double *out, const float *x, size_t n, bool accumulate) {
    (void)ctx;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    *out = (accumulate ? *out : 0.0) + s;
    return TPK_OK;
}

/* ---- fused linear forward ------------------------------------------------------------------------- */

/* u = x W^T + bias; y = u or (pre = u, y = act(u)): the host composes gemm, bias_add, act_fwd */
static tpk_status host_linear_fwd(tpk_ctx *ctx, void *y, void *pre, const void *x, const void *w, const void *bias, int64_t T, int64_t n,
                                  int64_t k, tpk_act act, tpk_dtype dt) {
    void *u = act != TPK_ACT_NONE ? pre : y;
    TPK_TRY(host_gemm(ctx, false, true, T, n, k, 1.0f, x, k, w, k, 0.0f, u, n, dt));
    if (bias) TPK_TRY(host_bias_add(ctx, u, bias, T, n, dt));
    if (act != TPK_ACT_NONE) TPK_TRY(host_act_fwd(ctx, act, y, u, dt, (size_t)(T * n)));
    return TPK_OK;
}

/* du = (dy W) act'(pre), db = colsum(du): the host composes gemm, act_bwd (in place) and bias_grad */
static tpk_status host_linear_bwd_act(tpk_ctx *ctx, void *du, void *db, const void *dy, const void *w, const void *pre, int64_t T, int64_t n,
                                      int64_t k, tpk_act act, tpk_dtype dt) {
    TPK_TRY(host_gemm(ctx, false, false, T, n, k, 1.0f, dy, k, w, n, 0.0f, du, n, dt));
    TPK_TRY(host_act_bwd(ctx, act, du, pre, du, dt, (size_t)(T * n)));
    return db ? host_bias_grad(ctx, db, du, T, n, dt, dt, false) : TPK_OK;
}

/* ---- counter-based random numbers ---------------------------------------------------------------- */

TPK__HOST_INLINE void rng_loop(tpk_dtype dt, void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0, int64_t col0,
                          uint64_t seed, uint64_t stream, tpk_rng_dist dist, float a, float b) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            uint64_t index = (uint64_t)(row0 + i) * (uint64_t)gcols + (uint64_t)(col0 + j);
            float draw = dist == TPK_RNG_NORMAL ? tpk_rng_normal(seed, stream, index) : tpk_rng_uniform(seed, stream, index);
            tpk__st(x, dt, (size_t)(i * cols + j), a + b * draw);
        }
}
static tpk_status host_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                              int64_t col0, uint64_t seed, uint64_t stream, tpk_rng_dist dist, float a, float b) {
    (void)ctx;
    TPK__BY_DTYPE(dt, rng_loop, x, rows, cols, gcols, row0, col0, seed, stream, dist, a, b);
    return TPK_OK;
}

/* ---- the table ------------------------------------------------------------------------------------- */

/* Made once (pthread_once): this file's entries, then ops_host_layers.c's. */
static tpk_ops host_table;
static pthread_once_t host_table_once = PTHREAD_ONCE_INIT;
static void host_table_make(void) {
    tpk_ops o = {.name = "host", .self = NULL, .device = false};
#define TPK__HOST_ENTRY(e) o.e = host_##e;
    TPK__OPS_CORE(TPK__HOST_ENTRY) /* o.alloc = host_alloc, ... */
#undef TPK__HOST_ENTRY
    o.linear_fwd = host_linear_fwd, o.linear_bwd_act = host_linear_bwd_act;
    tpk__host_layer_ops(&o);
    host_table = o;
}
const tpk_ops *tpk_ops_host(void) {
    pthread_once(&host_table_once, host_table_make);
    return &host_table;
}

/* The default backend of a context created with desc->ops = NULL (tpk/init.h declares it weak). */
const tpk_ops *tpk_ops_default(void) { return tpk_ops_host(); }
