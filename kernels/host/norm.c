/* kernels/host/norm.c — the host backend's layernorm and RMSNorm (per row, sums in double).
 *
 *   layernorm  y = (x - mean) rstd w + b,  rstd = 1/sqrt(var + eps)
 *              dx = rstd (g - mean(g) - xh mean(g xh)),  g = dy w,  xh = (x - mean) rstd;
 *              dw += sum over the rows of dy xh, db += sum over the rows of dy (accumulated)
 *   rmsnorm    the same loops with mean = 0 and no bias: dx = rstd (g - xh mean(g xh))
 * The residual add before a layernorm is composed by the front end (axpby, layernorm_fwd). */
#include <math.h>

#include "host_private.h"

/* ---- layernorm ------------------------------------------------------------------------------ */

/* One loop for both norms: rms (RMSNorm) takes the mean as 0 and has no bias (mean, b unused). */
TPK__HOST_INLINE void ln_fwd_loop(tpk_dtype dt, void *y, float *mean, float *rstd, const void *x,
                                  const float *w, const float *b, int64_t rows, int64_t cols,
                                  float eps, bool rms) {
    for (int64_t i = 0; i < rows; i++) {
        size_t r = (size_t)(i * cols);
        double s = 0, s2 = 0;
        for (int64_t j = 0; j < cols && !rms; j++) s += tpk__ld(x, dt, r + (size_t)j);
        double m = s / (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            double d = tpk__ld(x, dt, r + (size_t)j) - m;
            s2 += d * d;
        }
        float rs = (float)(1.0 / sqrt(s2 / (double)cols + eps));
        for (int64_t j = 0; j < cols; j++)
            tpk__st(y, dt, r + (size_t)j,
                    (tpk__ld(x, dt, r + (size_t)j) - (float)m) * rs * w[j] + (rms ? 0.0f : b[j]));
        if (!rms) mean[i] = (float)m;
        rstd[i] = rs;
    }
}
static tpk_status host_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x,
                                     const float *w, const float *b, int64_t rows, int64_t cols,
                                     float eps, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_fwd_loop, y, mean, rstd, x, w, b, rows, cols, eps, false);
    return TPK_OK;
}

TPK__HOST_INLINE void ln_bwd_loop(tpk_dtype dt, void *dx, float *dw, float *db, const void *dy,
                                  const void *x, const float *w, const float *mean,
                                  const float *rstd, int64_t rows, int64_t cols, bool acc,
                                  bool rms) {
    for (int64_t i = 0; i < rows; i++) {
        size_t r = (size_t)(i * cols);
        double mg = 0, mgx = 0;
        float mu = rms ? 0.0f : mean[i];
        for (int64_t j = 0; j < cols; j++) {
            float xh = (tpk__ld(x, dt, r + (size_t)j) - mu) * rstd[i],
                  g = tpk__ld(dy, dt, r + (size_t)j);
            mg += g * w[j], mgx += g * w[j] * xh;
            dw[j] += g * xh;
            if (!rms) db[j] += g;
        }
        mg = rms ? 0 : mg / (double)cols, mgx /= (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            float xh = (tpk__ld(x, dt, r + (size_t)j) - mu) * rstd[i],
                  g = tpk__ld(dy, dt, r + (size_t)j) * w[j];
            float v = rstd[i] * (g - (float)mg - xh * (float)mgx);
            tpk__st(dx, dt, r + (size_t)j, acc ? tpk__ld(dx, dt, r + (size_t)j) + v : v);
        }
    }
}
static tpk_status host_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy,
                                     const void *x, const float *w, const float *mean,
                                     const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt,
                                     bool accumulate_dx) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_bwd_loop, dx, dw, db, dy, x, w, mean, rstd, rows, cols, accumulate_dx,
                  false);
    return TPK_OK;
}
static tpk_status host_rmsnorm_fwd(tpk_ctx *ctx, void *y, float *rstd, const void *x,
                                   const float *w, int64_t rows, int64_t cols, float eps,
                                   tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_fwd_loop, y, NULL, rstd, x, w, NULL, rows, cols, eps, true);
    return TPK_OK;
}
static tpk_status host_rmsnorm_bwd(tpk_ctx *ctx, void *dx, float *dw, const void *dy, const void *x,
                                   const float *w, const float *rstd, int64_t rows, int64_t cols,
                                   tpk_dtype dt, bool accumulate_dx) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_bwd_loop, dx, dw, NULL, dy, x, w, NULL, rstd, rows, cols, accumulate_dx,
                  true);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_norm_ops(tpk_ops *o) {
    o->layernorm_fwd = host_layernorm_fwd;
    o->layernorm_bwd = host_layernorm_bwd;
    o->rmsnorm_fwd = host_rmsnorm_fwd;
    o->rmsnorm_bwd = host_rmsnorm_bwd;
}
