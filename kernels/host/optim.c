/* kernels/host/optim.c — the host backend's optimizer ops.
 *
 *   adamw   m = b1 m + (1-b1) g s,  v = b2 v + (1-b2) (g s)^2  (s: grad_scale, times the clipping
 *           factor of the norm when given; a non-finite norm skips the step and counts it),
 *           w -= lr (m c1 / (sqrt(v c2) + eps) + wd w)  (c1, c2: the bias corrections; wd on the
 *           decay runs only), the bf16 copy w16 written in the same pass
 *   sumsq   sum x^2 in double (the gradient norm) */
#include <math.h>

#include "host_private.h"

/* ---- optimizer ------------------------------------------------------------------------------- */

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

/* this file's entries of the host table (table.c) */
void tpk__host_optim_ops(tpk_ops *o) {
    o->adamw = host_adamw;
    o->sumsq = host_sumsq;
}
