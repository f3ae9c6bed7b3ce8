/* kernels/host/norm.c — the host backend's layernorm and RMSNorm (per row, sums in double).
 *
 *   layernorm  y = (x - mean) rstd w + b,  rstd = 1/sqrt(var + eps)
 *              dx = rstd (g - mean(g) - xh mean(g xh)),  g = dy w,  xh = (x - mean) rstd;
 *              dw += sum over the rows of dy xh, db += sum over the rows of dy (accumulated)
 *   rmsnorm    the same loops with mean = 0 and no bias: dx = rstd (g - xh mean(g xh))
 * The residual add before a layernorm is composed by the front end (axpby, layernorm_fwd).
 * A row's sums run in 8 float lanes (vec.h) added in double, lane order; rows over the pool's
 * threads (pool.c). The backward goes by chunks of rows (32, or rows / 64 when more), each with its
 * own partial dw and db
 * (float, rows in order), then adds the chunks' partials in double in chunk order: the chunks are
 * fixed by the row count, so the results do not depend on the thread count. */
#include <math.h>

#include "vec.h"

typedef struct ln_job {
    tpk_dtype dt;
    void *y;            /* fwd: y; bwd: dx */
    float *mean, *rstd; /* fwd: written; bwd: read */
    float *dw, *db;
    float *part; /* bwd: the chunks' partial dw, db [chunks, 2, cols] */
    const void *x, *dy;
    const float *w, *b;
    int64_t rows, cols;
    float eps;
    bool rms, acc;
} ln_job;

/* ---- forward: rows -------------------------------------------------------------------------- */

/* One loop for both norms: rms (RMSNorm) takes the mean as 0 and has no bias (mean, b unused). */
TPK__HOST_INLINE void ln_fwd_rows(tpk_dtype dt, const ln_job *a, int64_t lo, int64_t hi) {
    int64_t C = a->cols, nv = C / TPK__VL * TPK__VL, tail = C - nv;
    for (int64_t i = lo; i < hi; i++) {
        size_t r = (size_t)(i * C);
        tpk__v8f s = tpk__vsplat(0.0f);
        if (!a->rms) {
            for (int64_t j = 0; j < nv; j += TPK__VL) s += tpk__vld(a->x, dt, r + (size_t)j);
            s += tpk__vld_n(a->x, dt, r + (size_t)nv, tail);
        }
        double m = tpk__vhsum(s) / (double)C;
        tpk__v8f vm = tpk__vsplat((float)m), s2 = tpk__vsplat(0.0f), d;
        for (int64_t j = 0; j < nv; j += TPK__VL)
            d = tpk__vld(a->x, dt, r + (size_t)j) - vm, s2 += d * d;
        d = tpk__vld_n(a->x, dt, r + (size_t)nv, tail) - vm;
        for (int64_t k = tail; k < TPK__VL; k++) d[k] = 0.0f; /* the lanes past the row */
        s2 += d * d;
        float rs = (float)(1.0 / sqrt(tpk__vhsum(s2) / (double)C + a->eps));
        tpk__v8f vr = tpk__vsplat(rs), zero = tpk__vsplat(0.0f);
        int64_t j = 0;
        for (; j < nv; j += TPK__VL)
            tpk__vst(a->y, dt, r + (size_t)j,
                     (tpk__vld(a->x, dt, r + (size_t)j) - vm) * vr *
                             tpk__vld(a->w, TPK_F32, (size_t)j) +
                         (a->rms ? zero : tpk__vld(a->b, TPK_F32, (size_t)j)));
        tpk__vst_n(a->y, dt, r + (size_t)j,
                   (tpk__vld_n(a->x, dt, r + (size_t)j, tail) - vm) * vr *
                           tpk__vld_n(a->w, TPK_F32, (size_t)j, tail) +
                       (a->rms ? zero : tpk__vld_n(a->b, TPK_F32, (size_t)j, tail)),
                   tail);
        if (!a->rms) a->mean[i] = (float)m;
        a->rstd[i] = rs;
    }
}
TPK__HOST_SIMD static void ln_fwd_part(void *p, int64_t lo, int64_t hi) {
    const ln_job *a = (const ln_job *)p;
    TPK__BY_DTYPE(a->dt, ln_fwd_rows, a, lo, hi);
}
static void ln_fwd(ln_job *a) {
    tpk__host_par(a->rows, 1 + 4096 / (a->cols ? a->cols : 1), ln_fwd_part, a);
}
static tpk_status host_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x,
                                     const float *w, const float *b, int64_t rows, int64_t cols,
                                     float eps, tpk_dtype dt) {
    (void)ctx;
    ln_job a;
    memset(&a, 0, sizeof a);
    a.dt = dt, a.y = y, a.mean = mean, a.rstd = rstd, a.x = x, a.w = w, a.b = b, a.rows = rows,
    a.cols = cols, a.eps = eps;
    ln_fwd(&a);
    return TPK_OK;
}
static tpk_status host_rmsnorm_fwd(tpk_ctx *ctx, void *y, float *rstd, const void *x,
                                   const float *w, int64_t rows, int64_t cols, float eps,
                                   tpk_dtype dt) {
    (void)ctx;
    ln_job a;
    memset(&a, 0, sizeof a);
    a.dt = dt, a.y = y, a.rstd = rstd, a.x = x, a.w = w, a.rows = rows, a.cols = cols, a.eps = eps,
    a.rms = true;
    ln_fwd(&a);
    return TPK_OK;
}

/* ---- backward: chunks of rows, then their partial dw, db summed ----------------------------- */

/* xh = (x - mean) rstd of 8 columns of row i */
TPK__HOST_INLINE tpk__v8f ln_xh(const ln_job *a, int64_t i, tpk__v8f x) {
    return (x - tpk__vsplat(a->rms ? 0.0f : a->mean[i])) * tpk__vsplat(a->rstd[i]);
}
/* The rows of one chunk of the backward, each chunk with its own partial dw, db: at least 32, and
 * at most 64 chunks (the partials stay small); a function of the row count alone. */
static int64_t chunk_rows(int64_t rows) {
    int64_t r = (rows + 63) / 64;
    return r < 32 ? 32 : r;
}

/* chunk c's rows: dx, and the chunk's sums of dy xh and dy into part[c] = [dw | db] [2, cols] */
TPK__HOST_INLINE void ln_bwd_chunk(tpk_dtype dt, const ln_job *a, int64_t c) {
    int64_t C = a->cols, nv = C / TPK__VL * TPK__VL, tail = C - nv;
    int64_t R = chunk_rows(a->rows), i1 = (c + 1) * R < a->rows ? (c + 1) * R : a->rows;
    float *pw = a->part + (size_t)(2 * c * C), *pb = pw + C;
    memset(pw, 0, sizeof(float) * (size_t)(2 * C));
    for (int64_t i = c * R; i < i1; i++) {
        size_t r = (size_t)(i * C);
        tpk__v8f mg = tpk__vsplat(0.0f), mgx = mg; /* sum g w, sum g w xh (lanes past C: 0) */
        for (int64_t j = 0; j < nv; j += TPK__VL) {
            tpk__v8f xh = ln_xh(a, i, tpk__vld(a->x, dt, r + (size_t)j)),
                     gw = tpk__vld(a->dy, dt, r + (size_t)j) * tpk__vld(a->w, TPK_F32, (size_t)j);
            mg += gw, mgx += gw * xh;
        }
        tpk__v8f gt = tpk__vld_n(a->dy, dt, r + (size_t)nv, tail) *
                      tpk__vld_n(a->w, TPK_F32, (size_t)nv, tail);
        mg += gt, mgx += gt * ln_xh(a, i, tpk__vld_n(a->x, dt, r + (size_t)nv, tail));
        float m1 = a->rms ? 0.0f : (float)(tpk__vhsum(mg) / (double)C),
              m2 = (float)(tpk__vhsum(mgx) / (double)C);
        tpk__v8f vm1 = tpk__vsplat(m1), vm2 = tpk__vsplat(m2), vr = tpk__vsplat(a->rstd[i]);
        int64_t j = 0;
        for (; j < nv; j += TPK__VL) { /* full vectors */
            size_t k = r + (size_t)j;
            tpk__v8f g = tpk__vld(a->dy, dt, k), xh = ln_xh(a, i, tpk__vld(a->x, dt, k));
            tpk__v8f v = vr * (g * tpk__vld(a->w, TPK_F32, (size_t)j) - vm1 - xh * vm2);
            if (a->acc) v += tpk__vld(a->y, dt, k);
            tpk__vst(a->y, dt, k, v);
            tpk__vst(pw, TPK_F32, (size_t)j, tpk__vld(pw, TPK_F32, (size_t)j) + g * xh);
            if (!a->rms) tpk__vst(pb, TPK_F32, (size_t)j, tpk__vld(pb, TPK_F32, (size_t)j) + g);
        }
        if (tail) { /* the tail through the same vector code */
            size_t k = r + (size_t)j;
            tpk__v8f g = tpk__vld_n(a->dy, dt, k, tail),
                     xh = ln_xh(a, i, tpk__vld_n(a->x, dt, k, tail));
            tpk__v8f v = vr * (g * tpk__vld_n(a->w, TPK_F32, (size_t)j, tail) - vm1 - xh * vm2);
            if (a->acc) v += tpk__vld_n(a->y, dt, k, tail);
            tpk__vst_n(a->y, dt, k, v, tail);
            tpk__vst_n(pw, TPK_F32, (size_t)j, tpk__vld_n(pw, TPK_F32, (size_t)j, tail) + g * xh,
                       tail);
            if (!a->rms)
                tpk__vst_n(pb, TPK_F32, (size_t)j, tpk__vld_n(pb, TPK_F32, (size_t)j, tail) + g,
                           tail);
        }
    }
}
TPK__HOST_SIMD static void ln_bwd_part(void *p, int64_t lo, int64_t hi) {
    const ln_job *a = (const ln_job *)p;
    for (int64_t c = lo; c < hi; c++) TPK__BY_DTYPE(a->dt, ln_bwd_chunk, a, c);
}
/* columns [lo, hi): dw += the chunks' partial sums, added in double in chunk order (db alike) */
static void ln_sum_part(void *p, int64_t lo, int64_t hi) {
    const ln_job *a = (const ln_job *)p;
    int64_t C = a->cols, chunks = (a->rows + chunk_rows(a->rows) - 1) / chunk_rows(a->rows);
    for (int64_t j = lo; j < hi; j++) {
        double w = 0, b = 0;
        for (int64_t c = 0; c < chunks; c++)
            w += a->part[2 * c * C + j], b += a->part[(2 * c + 1) * C + j];
        a->dw[j] += (float)w;
        if (!a->rms) a->db[j] += (float)b;
    }
}
static tpk_status ln_bwd(tpk_ctx *ctx, ln_job *a) {
    int64_t chunks = (a->rows + chunk_rows(a->rows) - 1) / chunk_rows(a->rows);
    size_t bytes = sizeof(float) * (size_t)(2 * chunks * a->cols);
    if (!bytes) return TPK_OK;
    if (!(a->part = (float *)malloc(bytes)))
        return tpk__host_nomem(ctx, "host.layernorm_bwd", bytes);
    tpk__host_par(chunks, 1, ln_bwd_part, a);
    tpk__host_par(a->cols, 256, ln_sum_part, a);
    free(a->part);
    return TPK_OK;
}
static tpk_status host_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy,
                                     const void *x, const float *w, const float *mean,
                                     const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt,
                                     bool accumulate_dx) {
    ln_job a;
    memset(&a, 0, sizeof a);
    a.dt = dt, a.y = dx, a.dw = dw, a.db = db, a.dy = dy, a.x = x, a.w = w, a.mean = (float *)mean,
    a.rstd = (float *)rstd, a.rows = rows, a.cols = cols, a.acc = accumulate_dx;
    return ln_bwd(ctx, &a);
}
static tpk_status host_rmsnorm_bwd(tpk_ctx *ctx, void *dx, float *dw, const void *dy, const void *x,
                                   const float *w, const float *rstd, int64_t rows, int64_t cols,
                                   tpk_dtype dt, bool accumulate_dx) {
    ln_job a;
    memset(&a, 0, sizeof a);
    a.dt = dt, a.y = dx, a.dw = dw, a.dy = dy, a.x = x, a.w = w, a.rstd = (float *)rstd,
    a.rows = rows, a.cols = cols, a.acc = accumulate_dx, a.rms = true;
    return ln_bwd(ctx, &a);
}

/* this file's entries of the host table (table.c) */
void tpk__host_norm_ops(tpk_ops *o) {
    o->layernorm_fwd = host_layernorm_fwd;
    o->layernorm_bwd = host_layernorm_bwd;
    o->rmsnorm_fwd = host_rmsnorm_fwd;
    o->rmsnorm_bwd = host_rmsnorm_bwd;
}
