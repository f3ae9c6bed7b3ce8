/* kernels/host/xent.c — the host backend's cross-entropy pieces (vocabulary-parallel).
 *
 *   stats  per row and rank: (m = max, s = sum exp(z - m), z_y, sum z)
 *   loss   over the ranks: lse = M + log sum_r s_r exp(m_r - M), M = max_r m_r;
 *          loss = lse - (1-eps) z_y - eps mean_V(z)
 *   mean   the mean loss: sum in double, t ascending, / count
 *   grad   dz = (softmax(z) - (1-eps) onehot - eps/V) dloss
 *   fused  one rank holding the whole vocabulary: the three per row, the same bits
 * A row is read in 8-lane vectors (vec.h: tpk__vexp), its sums kept in float lanes over blocks of
 * 256 columns and in double across blocks, in a fixed order; rows are split over the pool's
 * threads (pool.c), so the results do not depend on the thread count. */
#include <math.h>

#include "vec.h"

/* ---- one row --------------------------------------------------------------------------------- */

enum { BLK = 256 }; /* columns summed in float lanes before the double sum */

/* row t's statistics over its Vl columns: (max m, sum exp(z - m), z at local column c = y - v0
 * (0 when outside), sum z) */
TPK__HOST_INLINE void xent_stats_row(tpk_dtype dt, float *p, const void *z, size_t base, int64_t Vl,
                                     int64_t c) {
    int64_t nv = Vl / TPK__VL * TPK__VL, j;
    tpk__v8f vm = tpk__vsplat(-INFINITY);
    for (j = 0; j < nv; j += TPK__VL) vm = tpk__vmax(vm, tpk__vld(z, dt, base + (size_t)j));
    float m = tpk__vhmax(vm);
    for (; j < Vl; j++) m = fmaxf(m, tpk__ld(z, dt, base + (size_t)j));
    double se = 0, sz = 0;
    tpk__v8f vmm = tpk__vsplat(m);
    for (int64_t j0 = 0; j0 < nv; j0 += BLK) {
        int64_t j1 = j0 + BLK < nv ? j0 + BLK : nv;
        tpk__v8f ae = tpk__vsplat(0.0f), az = ae;
        for (j = j0; j < j1; j += TPK__VL) {
            tpk__v8f v = tpk__vld(z, dt, base + (size_t)j);
            ae += tpk__vexp(v - vmm), az += v;
        }
        se += tpk__vhsum(ae), sz += tpk__vhsum(az);
    }
    for (j = nv; j < Vl; j++) {
        float v = tpk__ld(z, dt, base + (size_t)j);
        se += tpk__exp1(v - m), sz += v;
    }
    p[0] = m, p[1] = (float)se, p[2] = c >= 0 && c < Vl ? tpk__ld(z, dt, base + (size_t)c) : 0.0f,
    p[3] = (float)sz;
}

/* dz of row t (the Vl real columns and the padding up to ld) with dloss d; dz may alias z (the
 * target's logit is read before the row is written) */
TPK__HOST_INLINE void xent_grad_row(tpk_dtype dt, void *dz, const void *z, size_t base, float lse,
                                    bool skip, int64_t c, float d, int64_t Vl, int64_t ld,
                                    int64_t V, float eps) {
    int64_t j = 0;
    if (!skip) {
        bool hit = c >= 0 && c < Vl;
        float zc = hit ? tpk__ld(z, dt, base + (size_t)c) : 0.0f, off = eps / (float)V;
        int64_t nv = Vl / TPK__VL * TPK__VL;
        tpk__v8f vl = tpk__vsplat(lse), vo = tpk__vsplat(off), vd = tpk__vsplat(d);
        for (; j < nv; j += TPK__VL)
            tpk__vst(dz, dt, base + (size_t)j,
                     (tpk__vexp(tpk__vld(z, dt, base + (size_t)j) - vl) - vo) * vd);
        for (; j < Vl; j++)
            tpk__st(dz, dt, base + (size_t)j,
                    (tpk__exp1(tpk__ld(z, dt, base + (size_t)j) - lse) - off) * d);
        if (hit) tpk__st(dz, dt, base + (size_t)c, (tpk__exp1(zc - lse) - (1.0f - eps) - off) * d);
    }
    for (; j < ld; j++) tpk__st(dz, dt, base + (size_t)j, 0.0f);
}

/* ---- the ops: rows over the pool ------------------------------------------------------------- */

typedef struct xent_job {
    tpk_dtype dt;
    void *dz;
    float *part, *loss, *lse;
    const void *z;
    const float *lse_in, *dloss;
    const int32_t *y;
    int64_t Vl, ld, v0, V;
    float eps, g;
    int32_t ignore;
} xent_job;

TPK__HOST_INLINE void xent_stats_rows(tpk_dtype dt, const xent_job *a, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; t++)
        xent_stats_row(dt, a->part + 4 * t, a->z, (size_t)(t * a->ld), a->Vl,
                       (int64_t)a->y[t] - a->v0);
}
TPK__HOST_SIMD static void xent_stats_part(void *p, int64_t lo, int64_t hi) {
    const xent_job *a = (const xent_job *)p;
    TPK__BY_DTYPE(a->dt, xent_stats_rows, a, lo, hi);
}
static tpk_status host_xent_stats(tpk_ctx *ctx, float *part, const void *z, const int32_t *targets,
                                  int64_t T, int64_t Vl, int64_t ld, int64_t v0, tpk_dtype dt) {
    (void)ctx;
    xent_job a;
    memset(&a, 0, sizeof a);
    a.dt = dt, a.part = part, a.z = z, a.y = targets, a.Vl = Vl, a.ld = ld, a.v0 = v0;
    tpk__host_par(T, 1, xent_stats_part, &a);
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
TPK__HOST_INLINE void xent_grad_rows(tpk_dtype dt, const xent_job *a, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; t++)
        xent_grad_row(dt, a->dz, a->z, (size_t)(t * a->ld), a->lse_in[t], a->y[t] == a->ignore,
                      (int64_t)a->y[t] - a->v0, a->dloss[t], a->Vl, a->ld, a->V, a->eps);
}
TPK__HOST_SIMD static void xent_grad_part(void *p, int64_t lo, int64_t hi) {
    const xent_job *a = (const xent_job *)p;
    TPK__BY_DTYPE(a->dt, xent_grad_rows, a, lo, hi);
}
static tpk_status host_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse,
                                 const int32_t *targets, const float *dloss, int64_t T, int64_t Vl,
                                 int64_t ld, int64_t v0, int64_t V, float smoothing,
                                 int32_t ignore_index, tpk_dtype dt) {
    (void)ctx;
    xent_job a;
    memset(&a, 0, sizeof a);
    a.dt = dt, a.dz = dz, a.z = z, a.lse_in = lse, a.y = targets, a.dloss = dloss, a.Vl = Vl,
    a.ld = ld, a.v0 = v0, a.V = V, a.eps = smoothing, a.ignore = ignore_index;
    tpk__host_par(T, 1, xent_grad_part, &a);
    return TPK_OK;
}
/* row by row: the statistics, the loss, the gradient (the row still in cache) */
TPK__HOST_INLINE void xent_fused_rows(tpk_dtype dt, const xent_job *a, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; t++) {
        float p[4];
        size_t base = (size_t)(t * a->ld);
        bool skip = a->y[t] == a->ignore;
        xent_stats_row(dt, p, a->z, base, a->V, a->y[t]);
        a->lse[t] = tpk__xent_loss_row(a->loss + t, p, 1, 1, 0, skip, a->V, a->eps);
        xent_grad_row(dt, a->dz, a->z, base, a->lse[t], skip, a->y[t], a->g, a->V, a->ld, a->V,
                      a->eps);
    }
}
TPK__HOST_SIMD static void xent_fused_part(void *p, int64_t lo, int64_t hi) {
    const xent_job *a = (const xent_job *)p;
    TPK__BY_DTYPE(a->dt, xent_fused_rows, a, lo, hi);
}
static tpk_status host_xent_fused(tpk_ctx *ctx, void *dz, float *loss, float *lse, const void *z,
                                  const int32_t *targets, int64_t T, int64_t V, int64_t ld,
                                  float smoothing, int32_t ignore_index, float g, tpk_dtype dt) {
    (void)ctx;
    xent_job a;
    memset(&a, 0, sizeof a);
    a.dt = dt, a.dz = dz, a.loss = loss, a.lse = lse, a.z = z, a.y = targets, a.ld = ld, a.V = V,
    a.eps = smoothing, a.ignore = ignore_index, a.g = g;
    tpk__host_par(T, 1, xent_fused_part, &a);
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
