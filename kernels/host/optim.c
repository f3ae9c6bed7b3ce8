/* kernels/host/optim.c — the host backend's optimizer ops.
 *
 *   adamw   m = b1 m + (1-b1) g s,  v = b2 v + (1-b2) (g s)^2  (s: grad_scale, times the clipping
 *           factor of the norm when given; a non-finite norm skips the step and counts it),
 *           w -= lr (m c1 / (sqrt(v c2) + eps) + wd w)  (c1, c2: the bias corrections; wd on the
 *           decay runs only), the bf16 copy w16 written in the same pass
 *   sumsq   sum x^2 in double (the gradient norm): chunks of 2^15 elements, each summed in 8
 *           double lanes (two 4-lane halves), the chunks' sums added in order
 * Both in 8-lane vectors (vec.h) over the pool's threads (pool.c); neither result depends on the
 * thread count (AdamW is elementwise; sumsq's chunks are fixed by n alone). */
#include <math.h>

#include "vec.h"

/* ---- optimizer ------------------------------------------------------------------------------- */

typedef struct adamw_job {
    float *w, *m, *v;
    const float *g;
    uint16_t *w16;
    float lr, b1, b2, eps, wd, c1, c2, s;
    const int64_t *decay;
    int64_t nruns;
} adamw_job;

/* elements [lo, hi) with weight decay wd */
TPK__HOST_INLINE void adamw_range(const adamw_job *a, int64_t lo, int64_t hi, float wd) {
    int64_t i = lo;
    for (; i < hi; i += TPK__VL) {
        int64_t n = hi - i < TPK__VL ? hi - i : TPK__VL;
        size_t k = (size_t)i;
        bool full = n == TPK__VL;
        tpk__v8f g = full ? tpk__vld(a->g, TPK_F32, k) : tpk__vld_n(a->g, TPK_F32, k, n),
                 m = full ? tpk__vld(a->m, TPK_F32, k) : tpk__vld_n(a->m, TPK_F32, k, n),
                 v = full ? tpk__vld(a->v, TPK_F32, k) : tpk__vld_n(a->v, TPK_F32, k, n),
                 w = full ? tpk__vld(a->w, TPK_F32, k) : tpk__vld_n(a->w, TPK_F32, k, n);
        tpk__v8f gi = g * a->s;
        m = a->b1 * m + (1.0f - a->b1) * gi;
        v = a->b2 * v + (1.0f - a->b2) * gi * gi;
        w -= a->lr * (m * a->c1 / (tpk__vsqrt(v * a->c2) + a->eps) + wd * w);
        tpk__vst_n(a->m, TPK_F32, k, m, n), tpk__vst_n(a->v, TPK_F32, k, v, n);
        tpk__vst_n(a->w, TPK_F32, k, w, n);
        if (a->w16) tpk__vst_n(a->w16, TPK_BF16, k, w, n);
    }
}
/* [lo, hi) cut at the decay runs' ends: wd inside a run, 0 outside (every element decays without
 * runs) */
TPK__HOST_SIMD static void adamw_part(void *p, int64_t lo, int64_t hi) {
    const adamw_job *a = (const adamw_job *)p;
    if (!a->decay) {
        adamw_range(a, lo, hi, a->wd);
        return;
    }
    int64_t r = 0, i = lo;
    while (i < hi) {
        while (r < a->nruns && a->decay[2 * r + 1] <= i) r++; /* the first run not ending at i */
        bool in = r < a->nruns && a->decay[2 * r] <= i;
        int64_t end = r >= a->nruns ? hi : in ? a->decay[2 * r + 1] : a->decay[2 * r];
        end = end < hi ? end : hi;
        adamw_range(a, i, end, in ? a->wd : 0.0f);
        i = end;
    }
}
static tpk_status host_adamw(tpk_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n,
                             float lr, float b1, float b2, float eps, float wd, int64_t step,
                             float grad_scale, double *norm, float clip, const int64_t *decay,
                             int64_t nruns, uint16_t *w16) {
    (void)ctx;
    if (norm) { /* the gradient's norm from its sum of squares: skip a step whose norm is not
                   finite, else clip */
        double N = sqrt(norm[0]) * grad_scale;
        if (!isfinite(N)) return norm[1] += 1, TPK_OK;
        grad_scale *= TPK__CLIP_FACTOR(N, clip);
    }
    adamw_job a = {w,
                   m,
                   v,
                   g,
                   w16,
                   lr,
                   b1,
                   b2,
                   eps,
                   wd,
                   1.0f / (1.0f - powf(b1, (float)step)),
                   1.0f / (1.0f - powf(b2, (float)step)),
                   grad_scale,
                   decay,
                   nruns};
    tpk__host_par((int64_t)n, 1 << 13, adamw_part, &a);
    return TPK_OK;
}

enum { CHUNK = 1 << 15 };
typedef struct sumsq_job {
    const float *x;
    int64_t n;
    double *part; /* [chunks] */
} sumsq_job;
TPK__HOST_SIMD static void sumsq_part(void *p, int64_t lo, int64_t hi) {
    const sumsq_job *a = (const sumsq_job *)p;
    for (int64_t c = lo; c < hi; c++) {
        int64_t i0 = c * CHUNK, i1 = i0 + CHUNK < a->n ? i0 + CHUNK : a->n;
        tpk__v4d a0 = {0, 0, 0, 0}, a1 = a0, d; /* x^2 is exact in double */
        tpk__v4f h[2];
        for (int64_t i = i0; i < i1; i += TPK__VL) {
            if (i + TPK__VL <= i1) memcpy(h, a->x + i, sizeof h);
            else { /* the tail: lanes past the end are 0 */
                tpk__v8f t = tpk__vld_n(a->x, TPK_F32, (size_t)i, i1 - i);
                memcpy(h, &t, sizeof h);
            }
            d = __builtin_convertvector(h[0], tpk__v4d), a0 += d * d;
            d = __builtin_convertvector(h[1], tpk__v4d), a1 += d * d;
        }
        a0 += a1;
        double s = (a0[0] + a0[1]) + (a0[2] + a0[3]);
        a->part[c] = s;
    }
}
static tpk_status host_sumsq(tpk_ctx *ctx, double *out, const float *x, size_t n, bool accumulate) {
    int64_t chunks = ((int64_t)n + CHUNK - 1) / CHUNK;
    double one, *part = chunks <= 1 ? &one : (double *)malloc(sizeof(double) * (size_t)chunks);
    if (!part) return tpk__host_nomem(ctx, "host.sumsq", sizeof(double) * (size_t)chunks);
    sumsq_job a = {x, (int64_t)n, part};
    tpk__host_par(chunks, 1, sumsq_part, &a);
    double s = 0;
    for (int64_t c = 0; c < chunks; c++) s += part[c];
    if (part != &one) free(part);
    *out = (accumulate ? *out : 0.0) + s;
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_optim_ops(tpk_ops *o) {
    o->adamw = host_adamw;
    o->sumsq = host_sumsq;
}
