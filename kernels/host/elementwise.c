/* kernels/host/elementwise.c — the host backend's elementwise ops, one loop per op for both dtypes
 * (TPK__BY_DTYPE; bf16 widened to f32 on load, rounded to nearest even on store).
 *
 *   fill      x = value
 *   copy2d    rows of cols elements between leading dimensions (bytes: any dtype)
 *   cast      dst = src in another dtype
 *   axpby     y = a x + b y  (b = 0 ignores y, like beta in gemm)
 *   bias_add  y[i, j] += bias[j];  bias_grad: db[j] = sum_i dy[i, j] (+ db[j]), summed in double
 *   act_fwd   GELU-tanh: y = x/2 (1 + tanh(s (x + c x^3))), s = sqrt(2/pi), c = 0.044715;
 *             GELU: y = x Phi(x) = x/2 (1 + erf(x / sqrt 2));  NONE: y = x
 *   act_bwd   GELU-tanh: dx = dy (1/2 (1 + t) + x/2 (1 - t^2) s (1 + 3 c x^2)),
 *             t = tanh(s (x + c x^3));  GELU: dx = dy (Phi(x) + x phi(x)) */
#include <math.h>

#include "host_private.h"

/* ---- fill, copy2d, cast, axpby --------------------------------------------------------------- */

TPK__HOST_INLINE void fill_loop(tpk_dtype dt, void *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++) tpk__st(x, dt, i, value);
}
static tpk_status host_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    (void)ctx;
    TPK__BY_DTYPE(dt, fill_loop, x, n, value);
    return TPK_OK;
}

/* Rows are moved as bytes, so every dtype (i32 too) is copied exactly. */
static tpk_status host_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds,
                              int64_t rows, int64_t cols, tpk_dtype dt) {
    (void)ctx;
    bool any = rows > 0 && cols > 0;
    if (!any) return TPK_OK;
    size_t es = tpk_dtype_size(dt), row = (size_t)cols * es;
    for (int64_t i = 0; i < rows; i++)
        memmove((char *)dst + (size_t)i * (size_t)ldd * es,
                (const char *)src + (size_t)i * (size_t)lds * es, row);
    return TPK_OK;
}

TPK__HOST_INLINE void cast_loop(tpk_dtype ddt, void *dst, const void *src, tpk_dtype sdt,
                                size_t n) {
    for (size_t i = 0; i < n; i++) tpk__st(dst, ddt, i, tpk__ld(src, sdt, i));
}
static tpk_status host_cast(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src,
                            tpk_dtype src_dt, size_t n) {
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
        for (size_t i = 0; i < n; i++)
            tpk__st(y, dt, i, a * tpk__ld(x, dt, i) + b * tpk__ld(y, dt, i));
}
static tpk_status host_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt,
                             size_t n) {
    (void)ctx;
    TPK__BY_DTYPE(dt, axpby_loop, y, a, x, b, n);
    return TPK_OK;
}

/* ---- bias ------------------------------------------------------------------------------------ */

TPK__HOST_INLINE void bias_add_loop(tpk_dtype dt, void *y, const void *bias, int64_t rows,
                                    int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            size_t at = (size_t)(i * cols + j);
            tpk__st(y, dt, at, tpk__ld(y, dt, at) + tpk__ld(bias, dt, (size_t)j));
        }
}
static tpk_status host_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols,
                                tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, bias_add_loop, y, bias, rows, cols);
    return TPK_OK;
}

/* acc[cols] (double) sums dy row by row, so dy is read in memory order. */
TPK__HOST_INLINE void bias_grad_loop(tpk_dtype dt, void *db, const void *dy, int64_t rows,
                                     int64_t cols, tpk_dtype db_dt, bool accumulate, double *acc) {
    for (int64_t j = 0; j < cols; j++) acc[j] = accumulate ? tpk__ld(db, db_dt, (size_t)j) : 0.0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) acc[j] += tpk__ld(dy, dt, (size_t)(i * cols + j));
    for (int64_t j = 0; j < cols; j++) tpk__st(db, db_dt, (size_t)j, (float)acc[j]);
}
static tpk_status host_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols,
                                 tpk_dtype dt, tpk_dtype db_dt, bool accumulate) {
    static const char *fn = "host.bias_grad";
    if (cols == 0) return TPK_OK;
    double *acc = malloc((size_t)cols * sizeof(double));
    if (!acc) return tpk__host_nomem(ctx, fn, (size_t)cols * sizeof(double));
    TPK__BY_DTYPE(dt, bias_grad_loop, db, dy, rows, cols, db_dt, accumulate, acc);
    free(acc);
    return TPK_OK;
}

/* ---- activations (tpk_act): one loop per direction, the activation a switch ------------------ */

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* 1/2 (1 + tanh(u)) = sigmoid(2u): one expf, no tanhf (expf(-2u) = inf gives 0, not NaN) */
static inline float gelu_sig(float v) {
    return 1.0f / (1.0f + expf(-2.0f * GELU_S * (v + GELU_C * v * v * v)));
}

#define GELU_RSQRT2 0.7071067811865476f  /* 1 / sqrt(2) */
#define GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */

/* act(v) and act'(v); GELU-tanh: 1 - t^2 = 4 sg (1 - sg); GELU: Phi(v) = (1 + erf(v/sqrt2)) / 2 */
TPK__HOST_INLINE float act_value(tpk_act act, float v) {
    switch (act) {
    case TPK_ACT_GELU_TANH: return v * gelu_sig(v);
    case TPK_ACT_GELU: return 0.5f * v * (1.0f + erff(v * GELU_RSQRT2));
    default: return v;
    }
}
TPK__HOST_INLINE float act_slope(tpk_act act, float v) {
    switch (act) {
    case TPK_ACT_GELU_TANH: {
        float sg = gelu_sig(v);
        return sg + 2.0f * v * sg * (1.0f - sg) * GELU_S * (1.0f + 3.0f * GELU_C * v * v);
    }
    case TPK_ACT_GELU:
        return 0.5f * (1.0f + erff(v * GELU_RSQRT2)) + v * GELU_RSQRT2PI * expf(-0.5f * v * v);
    default: return 1.0f;
    }
}

TPK__HOST_INLINE void act_fwd_loop(tpk_dtype dt, tpk_act act, void *y, const void *x, size_t n) {
    for (size_t i = 0; i < n; i++) tpk__st(y, dt, i, act_value(act, tpk__ld(x, dt, i)));
}
/* NONE is a copy (nothing in place) */
static tpk_status host_act_fwd(tpk_ctx *ctx, tpk_act act, void *y, const void *x, tpk_dtype dt,
                               size_t n) {
    (void)ctx;
    if (act == TPK_ACT_NONE) {
        if (y != x) memmove(y, x, n * tpk_dtype_size(dt));
        return TPK_OK;
    }
    TPK__BY_DTYPE(dt, act_fwd_loop, act, y, x, n);
    return TPK_OK;
}

/* dy[i] is read before dx[i] is written, so dx may alias dy. */
TPK__HOST_INLINE void act_bwd_loop(tpk_dtype dt, tpk_act act, void *dx, const void *x,
                                   const void *dy, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = tpk__ld(x, dt, i), g = tpk__ld(dy, dt, i);
        tpk__st(dx, dt, i, g * act_slope(act, v));
    }
}
/* NONE: dx = dy */
static tpk_status host_act_bwd(tpk_ctx *ctx, tpk_act act, void *dx, const void *x, const void *dy,
                               tpk_dtype dt, size_t n) {
    (void)ctx;
    if (act == TPK_ACT_NONE) {
        if (dx != dy) memmove(dx, dy, n * tpk_dtype_size(dt));
        return TPK_OK;
    }
    TPK__BY_DTYPE(dt, act_bwd_loop, act, dx, x, dy, n);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_elementwise_ops(tpk_ops *o) {
    o->fill = host_fill;
    o->copy2d = host_copy2d;
    o->cast = host_cast;
    o->axpby = host_axpby;
    o->bias_add = host_bias_add;
    o->bias_grad = host_bias_grad;
    o->act_fwd = host_act_fwd;
    o->act_bwd = host_act_bwd;
}
