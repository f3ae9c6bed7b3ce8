/* kernels/host/xent.c — the host backend's cross-entropy pieces (vocabulary-parallel).
 *
 *   stats  per row and rank: (m = max, s = sum exp(z - m), z_y, sum z)
 *   loss   over the ranks: lse = M + log sum_r s_r exp(m_r - M), M = max_r m_r;
 *          loss = lse - (1-eps) z_y - eps mean_V(z)
 *   mean   the mean loss: sum in double, t ascending, / count
 *   grad   dz = (softmax(z) - (1-eps) onehot - eps/V) dloss
 *   fused  one rank holding the whole vocabulary: the three per row, the same bits */
#include <math.h>

#include "host_private.h"

/* ---- cross-entropy pieces ------------------------------------------------------------------- */

/* row t's statistics over its Vl columns: (max m, sum exp(z - m) in double, z at local column
 * c = y - v0 (0 when outside), sum z in double) */
TPK__HOST_INLINE void xent_stats_row(tpk_dtype dt, float *p, const void *z, size_t base, int64_t Vl,
                                     int64_t c) {
    float m = -INFINITY;
    for (int64_t j = 0; j < Vl; j++) m = fmaxf(m, tpk__ld(z, dt, base + (size_t)j));
    double se = 0, sz = 0;
    for (int64_t j = 0; j < Vl; j++) {
        float v = tpk__ld(z, dt, base + (size_t)j);
        se += exp((double)v - m), sz += v;
    }
    p[0] = m, p[1] = (float)se, p[2] = c >= 0 && c < Vl ? tpk__ld(z, dt, base + (size_t)c) : 0.0f,
    p[3] = (float)sz;
}
/* dz of row t (the Vl real columns and the padding up to ld) with dloss d */
TPK__HOST_INLINE void xent_grad_row(tpk_dtype dt, void *dz, const void *z, size_t base, float lse,
                                    bool skip, int64_t c, float d, int64_t Vl, int64_t ld,
                                    int64_t V, float eps) {
    for (int64_t j = 0; j < ld; j++) {
        size_t k = base + (size_t)j;
        float g =
            skip || j >= Vl
                ? 0.0f
                : (expf(tpk__ld(z, dt, k) - lse) - (j == c ? 1.0f - eps : 0.0f) - eps / (float)V) *
                      d;
        tpk__st(dz, dt, k, g);
    }
}

TPK__HOST_INLINE void xent_stats_loop(tpk_dtype dt, float *part, const void *z, const int32_t *y,
                                      int64_t T, int64_t Vl, int64_t ld, int64_t v0) {
    for (int64_t t = 0; t < T; t++)
        xent_stats_row(dt, part + 4 * t, z, (size_t)(t * ld), Vl, (int64_t)y[t] - v0);
}
static tpk_status host_xent_stats(tpk_ctx *ctx, float *part, const void *z, const int32_t *targets,
                                  int64_t T, int64_t Vl, int64_t ld, int64_t v0, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, xent_stats_loop, part, z, targets, T, Vl, ld, v0);
    return TPK_OK;
}
static tpk_status host_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *part,
                                 int64_t P, const int32_t *targets, int64_t T, int64_t V,
                                 float smoothing, int32_t ignore_index) {
    (void)ctx;
    for (int64_t t = 0; t < T; t++)
        lse[t] =
            tpk__xent_loss_row(loss + t, part, P, T, t, targets[t] == ignore_index, V, smoothing);
    return TPK_OK;
}
/* the losses summed in double, t ascending (the order the host always used), divided once */
static tpk_status host_xent_mean(tpk_ctx *ctx, double *acc, const float *loss, int64_t T,
                                 int64_t count, bool accumulate) {
    (void)ctx;
    double sum = 0;
    for (int64_t t = 0; t < T; t++) sum += loss[t];
    float m = count ? (float)(sum / (double)count) : 0.0f;
    *acc = (accumulate ? *acc : 0.0) + (double)m;
    return TPK_OK;
}
TPK__HOST_INLINE void xent_grad_loop(tpk_dtype dt, void *dz, const void *z, const float *lse,
                                     const int32_t *y, const float *dloss, int64_t T, int64_t Vl,
                                     int64_t ld, int64_t v0, int64_t V, float eps, int32_t ignore) {
    for (int64_t t = 0; t < T; t++)
        xent_grad_row(dt, dz, z, (size_t)(t * ld), lse[t], y[t] == ignore, (int64_t)y[t] - v0,
                      dloss[t], Vl, ld, V, eps);
}
static tpk_status host_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse,
                                 const int32_t *targets, const float *dloss, int64_t T, int64_t Vl,
                                 int64_t ld, int64_t v0, int64_t V, float smoothing,
                                 int32_t ignore_index, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, xent_grad_loop, dz, z, lse, targets, dloss, T, Vl, ld, v0, V, smoothing,
                  ignore_index);
    return TPK_OK;
}
/* row by row: the statistics, the loss, the gradient (the row still in cache) */
TPK__HOST_INLINE void xent_fused_loop(tpk_dtype dt, void *dz, float *loss, float *lse,
                                      const void *z, const int32_t *y, int64_t T, int64_t V,
                                      int64_t ld, float eps, int32_t ignore, float g) {
    for (int64_t t = 0; t < T; t++) {
        float p[4];
        size_t base = (size_t)(t * ld);
        bool skip = y[t] == ignore;
        xent_stats_row(dt, p, z, base, V, y[t]);
        lse[t] = tpk__xent_loss_row(loss + t, p, 1, 1, 0, skip, V, eps);
        xent_grad_row(dt, dz, z, base, lse[t], skip, y[t], g, V, ld, V, eps);
    }
}
static tpk_status host_xent_fused(tpk_ctx *ctx, void *dz, float *loss, float *lse, const void *z,
                                  const int32_t *targets, int64_t T, int64_t V, int64_t ld,
                                  float smoothing, int32_t ignore_index, float g, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, xent_fused_loop, dz, loss, lse, z, targets, T, V, ld, smoothing, ignore_index,
                  g);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_xent_ops(tpk_ops *o) {
    o->xent_stats = host_xent_stats;
    o->xent_loss = host_xent_loss;
    o->xent_mean = host_xent_mean;
    o->xent_grad = host_xent_grad;
    o->xent_fused = host_xent_fused;
}
