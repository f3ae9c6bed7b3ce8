/* kernels/host/rope_swiglu.c — the host backend's rotary embedding and SwiGLU (Llama).
 *
 *   rope    pairs (j, j + D/2) of each head rotated by s theta^(-2j/D), s = i mod S (inverse: by
 *           minus it); rope_at: s = pos[i mod npos], a table's (context parallelism's rows)
 *   swiglu  h = silu(gate) up over gu = [gate | up];  backward dgate, dup from both inputs */
#include <math.h>

#include "host_private.h"

/* ---- rotary embedding, SwiGLU ---------------------------------------------------------------- */

/* row i at position pos[i mod S], or (pos NULL) i mod S */
TPK__HOST_INLINE void rope_loop(tpk_dtype dt, void *y, int64_t ldy, const void *x, int64_t ldx,
                                int64_t rows, const int32_t *pos, int64_t S, int64_t heads,
                                int64_t D, float theta, bool inverse) {
    int64_t half = D / 2;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < half; j++) {
            int64_t s = pos ? (int64_t)pos[i % S] : i % S;
            double a = (double)s * pow((double)theta, -2.0 * (double)j / (double)D);
            float c = (float)cos(a), n = inverse ? -(float)sin(a) : (float)sin(a);
            for (int64_t h = 0; h < heads; h++) {
                size_t xi = (size_t)(i * ldx + h * D + j), yi = (size_t)(i * ldy + h * D + j);
                float x1 = tpk__ld(x, dt, xi), x2 = tpk__ld(x, dt, xi + (size_t)half);
                tpk__st(y, dt, yi, x1 * c - x2 * n);
                tpk__st(y, dt, yi + (size_t)half, x2 * c + x1 * n);
            }
        }
}
static tpk_status host_rope(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                            int64_t rows, int64_t S, int64_t heads, int64_t D, float theta,
                            bool inverse, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, rope_loop, y, ldy, x, ldx, rows, NULL, S, heads, D, theta, inverse);
    return TPK_OK;
}
static tpk_status host_rope_at(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                               int64_t rows, const int32_t *pos, int64_t npos, int64_t heads,
                               int64_t D, float theta, bool inverse, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, rope_loop, y, ldy, x, ldx, rows, pos, npos, heads, D, theta, inverse);
    return TPK_OK;
}

TPK__HOST_INLINE float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* fwd: h = silu(gate) up;  bwd (dh given): dgate = dh up sig (1 + gate (1 - sig)), dup = dh
 * silu(gate) */
TPK__HOST_INLINE void swiglu_loop(tpk_dtype dt, void *out, const void *gu, const void *dh,
                                  int64_t rows, int64_t F) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < F; j++) {
            size_t k = (size_t)(i * 2 * F + j);
            float g = tpk__ld(gu, dt, k), u = tpk__ld(gu, dt, k + (size_t)F), sg = sigmoid(g);
            if (!dh) {
                tpk__st(out, dt, (size_t)(i * F + j), g * sg * u);
                continue;
            }
            float d = tpk__ld(dh, dt, (size_t)(i * F + j));
            tpk__st(out, dt, k, d * u * sg * (1.0f + g * (1.0f - sg)));
            tpk__st(out, dt, k + (size_t)F, d * g * sg);
        }
}
static tpk_status host_swiglu_fwd(tpk_ctx *ctx, void *h, const void *gu, int64_t rows, int64_t F,
                                  tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, swiglu_loop, h, gu, NULL, rows, F);
    return TPK_OK;
}
static tpk_status host_swiglu_bwd(tpk_ctx *ctx, void *dgu, const void *gu, const void *dh,
                                  int64_t rows, int64_t F, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, swiglu_loop, dgu, gu, dh, rows, F);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_rope_swiglu_ops(tpk_ops *o) {
    o->rope = host_rope;
    o->rope_at = host_rope_at;
    o->swiglu_fwd = host_swiglu_fwd;
    o->swiglu_bwd = host_swiglu_bwd;
}
