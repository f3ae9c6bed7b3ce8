/* kernels/host/ops_host_layers.c — the transformer-layer ops of the host backend (contracts in
 * tpk/ops.h): dropout, layernorm, embedding, the cross-entropy pieces and causal attention.
 *
 *   dropout    y = x keep / (1-p),  keep = dropout_u(seed, stream, global index) >= p (tpk/rng.h: one
 *              Philox call per 4 consecutive global indices)
 *   layernorm  y = (x - mean) rstd w + b,  rstd = 1/sqrt(var + eps)           (per row)
 *              dx = rstd (g - mean(g) - xh mean(g xh)),  g = dy w,  xh = (x - mean) rstd
 *   rmsnorm    the same loops with mean = 0 and no bias: dx = rstd (g - xh mean(g xh))
 *   rope       pairs (j, j + D/2) of each head rotated by (i mod S) theta^(-2j/D)
 *   swiglu     h = silu(gate) up over gu = [gate | up]
 *   embedding  y[t] = E[ids[t] - v0] for ids in [v0, v0 + vrows),  dE[ids[t] - v0] += dy[t]
 *   xent       per row and rank: (m = max, s = sum exp(z - m), z_y, sum z); over the ranks
 *              lse = M + log sum_r s_r exp(m_r - M), M = max_r m_r;  loss = lse - (1-eps) z_y - eps mean_V(z);
 *              the mean loss: sum in double, t ascending, / count
 *              dz = (softmax(z) - (1-eps) onehot - eps/V) dloss;  fused (one rank): the three per row
 *   attention  per (batch, query head; grouped-query: its key/value head): S = scale Q K^T (causal), P = softmax(S), O = P V, with
 *              Q K^T and P V through cblas_sgemm in blocks of query rows that skip the masked
 *              keys; backward recomputes P from the saved lse.
 * Arithmetic is f32 (sums of a row in double); bf16 is storage, widened on load. */
#include <cblas.h>

#include "host_private.h"

/* ---- dropout ------------------------------------------------------------------------------ */

TPK__HOST_INLINE void dropout_loop(tpk_dtype dt, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                              int64_t col0, float p, uint64_t seed, uint64_t stream) {
    float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < rows; i++) {
        uint64_t g0 = (uint64_t)((row0 + i) * gcols + col0); /* the global index of (i, 0) */
        tpk_f32x4 u = tpk_rng_uniform4(seed, stream, g0 >> 2);
        for (int64_t j = 0; j < cols; j++) {
            uint64_t g = g0 + (uint64_t)j;
            if (j > 0 && (g & 3) == 0) u = tpk_rng_uniform4(seed, stream, g >> 2); /* the next 4 */
            size_t k = (size_t)(i * cols + j);
            tpk__st(y, dt, k, u.v[g & 3] >= p ? tpk__ld(x, dt, k) * scale : 0.0f);
        }
    }
}
static tpk_status host_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                             int64_t col0, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, dropout_loop, y, x, rows, cols, gcols, row0, col0, p, seed, stream);
    return TPK_OK;
}

/* ---- layernorm ------------------------------------------------------------------------------ */

/* One loop for both norms: rms (RMSNorm) takes the mean as 0 and has no bias (mean, b unused). */
TPK__HOST_INLINE void ln_fwd_loop(tpk_dtype dt, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                             int64_t rows, int64_t cols, float eps, bool rms) {
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
            tpk__st(y, dt, r + (size_t)j, (tpk__ld(x, dt, r + (size_t)j) - (float)m) * rs * w[j] + (rms ? 0.0f : b[j]));
        if (!rms) mean[i] = (float)m;
        rstd[i] = rs;
    }
}
static tpk_status host_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                                   int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_fwd_loop, y, mean, rstd, x, w, b, rows, cols, eps, false);
    return TPK_OK;
}

/* x1 = x + r (rounded to dt), then layernorm_fwd on x1: the host composes the two */
TPK__HOST_INLINE void residual_loop(tpk_dtype dt, void *x1, const void *x, const void *r, size_t n) {
    for (size_t i = 0; i < n; i++) tpk__st(x1, dt, i, tpk__ld(x, dt, i) + tpk__ld(r, dt, i));
}
static tpk_status host_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd, const void *x, const void *r,
                                            const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    TPK__BY_DTYPE(dt, residual_loop, x1, x, r, (size_t)(rows * cols));
    return host_layernorm_fwd(ctx, y, mean, rstd, x1, w, b, rows, cols, eps, dt);
}

TPK__HOST_INLINE void ln_bwd_loop(tpk_dtype dt, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                             const float *mean, const float *rstd, int64_t rows, int64_t cols, bool acc, bool rms) {
    for (int64_t i = 0; i < rows; i++) {
        size_t r = (size_t)(i * cols);
        double mg = 0, mgx = 0;
        float mu = rms ? 0.0f : mean[i];
        for (int64_t j = 0; j < cols; j++) {
            float xh = (tpk__ld(x, dt, r + (size_t)j) - mu) * rstd[i], g = tpk__ld(dy, dt, r + (size_t)j);
            mg += g * w[j], mgx += g * w[j] * xh;
            dw[j] += g * xh;
            if (!rms) db[j] += g;
        }
        mg = rms ? 0 : mg / (double)cols, mgx /= (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            float xh = (tpk__ld(x, dt, r + (size_t)j) - mu) * rstd[i], g = tpk__ld(dy, dt, r + (size_t)j) * w[j];
            float v = rstd[i] * (g - (float)mg - xh * (float)mgx);
            tpk__st(dx, dt, r + (size_t)j, acc ? tpk__ld(dx, dt, r + (size_t)j) + v : v);
        }
    }
}
static tpk_status host_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                                   const float *mean, const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_bwd_loop, dx, dw, db, dy, x, w, mean, rstd, rows, cols, accumulate_dx, false);
    return TPK_OK;
}
static tpk_status host_rmsnorm_fwd(tpk_ctx *ctx, void *y, float *rstd, const void *x, const float *w, int64_t rows, int64_t cols, float eps,
                                   tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_fwd_loop, y, NULL, rstd, x, w, NULL, rows, cols, eps, true);
    return TPK_OK;
}
static tpk_status host_rmsnorm_bwd(tpk_ctx *ctx, void *dx, float *dw, const void *dy, const void *x, const float *w, const float *rstd,
                                   int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx) {
    (void)ctx;
    TPK__BY_DTYPE(dt, ln_bwd_loop, dx, dw, NULL, dy, x, w, NULL, rstd, rows, cols, accumulate_dx, true);
    return TPK_OK;
}

/* ---- rotary embedding, SwiGLU ------------------------------------------------------------------ */

TPK__HOST_INLINE void rope_loop(tpk_dtype dt, void *y, int64_t ldy, const void *x, int64_t ldx, int64_t rows, int64_t S, int64_t heads,
                                int64_t D, float theta, bool inverse) {
    int64_t half = D / 2;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < half; j++) {
            double a = (double)(i % S) * pow((double)theta, -2.0 * (double)j / (double)D);
            float c = (float)cos(a), n = inverse ? -(float)sin(a) : (float)sin(a);
            for (int64_t h = 0; h < heads; h++) {
                size_t xi = (size_t)(i * ldx + h * D + j), yi = (size_t)(i * ldy + h * D + j);
                float x1 = tpk__ld(x, dt, xi), x2 = tpk__ld(x, dt, xi + (size_t)half);
                tpk__st(y, dt, yi, x1 * c - x2 * n);
                tpk__st(y, dt, yi + (size_t)half, x2 * c + x1 * n);
            }
        }
}
static tpk_status host_rope(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx, int64_t rows, int64_t S, int64_t heads, int64_t D,
                            float theta, bool inverse, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, rope_loop, y, ldy, x, ldx, rows, S, heads, D, theta, inverse);
    return TPK_OK;
}

TPK__HOST_INLINE float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* fwd: h = silu(gate) up;  bwd (dh given): dgate = dh up sig (1 + gate (1 - sig)), dup = dh silu(gate) */
TPK__HOST_INLINE void swiglu_loop(tpk_dtype dt, void *out, const void *gu, const void *dh, int64_t rows, int64_t F) {
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
static tpk_status host_swiglu_fwd(tpk_ctx *ctx, void *h, const void *gu, int64_t rows, int64_t F, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, swiglu_loop, h, gu, NULL, rows, F);
    return TPK_OK;
}
static tpk_status host_swiglu_bwd(tpk_ctx *ctx, void *dgu, const void *gu, const void *dh, int64_t rows, int64_t F, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, swiglu_loop, dgu, gu, dh, rows, F);
    return TPK_OK;
}

/* ---- embedding ------------------------------------------------------------------------------ */

TPK__HOST_INLINE void embed_fwd_loop(tpk_dtype dt, void *y, const int32_t *ids, const float *E, int64_t T, int64_t H, int64_t v0,
                                int64_t vrows, bool acc) {
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        bool in = row >= 0 && row < vrows;
        for (int64_t j = 0; j < H; j++) {
            size_t k = (size_t)(t * H + j);
            float e = in ? E[row * H + j] : 0.0f;
            tpk__st(y, dt, k, acc ? tpk__ld(y, dt, k) + e : e);
        }
    }
}
static tpk_status host_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt, bool accumulate) {
    (void)ctx;
    TPK__BY_DTYPE(dt, embed_fwd_loop, y, ids, table, T, H, v0, vrows, accumulate);
    return TPK_OK;
}
TPK__HOST_INLINE void embed_bwd_loop(tpk_dtype dt, float *dE, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                                int64_t vrows) {
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        if (row < 0 || row >= vrows) continue;
        for (int64_t j = 0; j < H; j++) dE[row * H + j] += tpk__ld(dy, dt, (size_t)(t * H + j));
    }
}
static tpk_status host_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, embed_bwd_loop, dtable, dy, ids, T, H, v0, vrows);
    return TPK_OK;
}

/* ---- cross-entropy pieces ------------------------------------------------------------------- */

/* row t's statistics over its Vl columns: (max m, sum exp(z - m) in double, z at local column
 * c = y - v0 (0 when outside), sum z in double) */
TPK__HOST_INLINE void xent_stats_row(tpk_dtype dt, float *p, const void *z, size_t base, int64_t Vl, int64_t c) {
    float m = -INFINITY;
    for (int64_t j = 0; j < Vl; j++) m = fmaxf(m, tpk__ld(z, dt, base + (size_t)j));
    double se = 0, sz = 0;
    for (int64_t j = 0; j < Vl; j++) {
        float v = tpk__ld(z, dt, base + (size_t)j);
        se += exp((double)v - m), sz += v;
    }
    p[0] = m, p[1] = (float)se, p[2] = c >= 0 && c < Vl ? tpk__ld(z, dt, base + (size_t)c) : 0.0f, p[3] = (float)sz;
}
/* dz of row t (the Vl real columns and the padding up to ld) with dloss d */
TPK__HOST_INLINE void xent_grad_row(tpk_dtype dt, void *dz, const void *z, size_t base, float lse, bool skip, int64_t c, float d, int64_t Vl,
                                    int64_t ld, int64_t V, float eps) {
    for (int64_t j = 0; j < ld; j++) {
        size_t k = base + (size_t)j;
        float g = skip || j >= Vl ? 0.0f : (expf(tpk__ld(z, dt, k) - lse) - (j == c ? 1.0f - eps : 0.0f) - eps / (float)V) * d;
        tpk__st(dz, dt, k, g);
    }
}

TPK__HOST_INLINE void xent_stats_loop(tpk_dtype dt, float *part, const void *z, const int32_t *y, int64_t T, int64_t Vl, int64_t ld, int64_t v0) {
    for (int64_t t = 0; t < T; t++) xent_stats_row(dt, part + 4 * t, z, (size_t)(t * ld), Vl, (int64_t)y[t] - v0);
}
static tpk_status host_xent_stats(tpk_ctx *ctx, float *part, const void *z, const int32_t *targets, int64_t T, int64_t Vl, int64_t ld,
                                  int64_t v0, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, xent_stats_loop, part, z, targets, T, Vl, ld, v0);
    return TPK_OK;
}
static tpk_status host_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *part, int64_t P, const int32_t *targets, int64_t T,
                                 int64_t V, float smoothing, int32_t ignore_index) {
    (void)ctx;
    for (int64_t t = 0; t < T; t++) lse[t] = tpk__xent_loss_row(loss + t, part, P, T, t, targets[t] == ignore_index, V, smoothing);
    return TPK_OK;
}
/* the losses summed in double, t ascending (the order the host always used), divided once */
static tpk_status host_xent_mean(tpk_ctx *ctx, double *acc, const float *loss, int64_t T, int64_t count, bool accumulate) {
    (void)ctx;
    double sum = 0;
    for (int64_t t = 0; t < T; t++) sum += loss[t];
    float m = count ? (float)(sum / (double)count) : 0.0f;
    *acc = (accumulate ? *acc : 0.0) + (double)m;
    return TPK_OK;
}
TPK__HOST_INLINE void xent_grad_loop(tpk_dtype dt, void *dz, const void *z, const float *lse, const int32_t *y, const float *dloss,
                                int64_t T, int64_t Vl, int64_t ld, int64_t v0, int64_t V, float eps, int32_t ignore) {
    for (int64_t t = 0; t < T; t++)
        xent_grad_row(dt, dz, z, (size_t)(t * ld), lse[t], y[t] == ignore, (int64_t)y[t] - v0, dloss[t], Vl, ld, V, eps);
}
static tpk_status host_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse, const int32_t *targets, const float *dloss,
                               int64_t T, int64_t Vl, int64_t ld, int64_t v0, int64_t V, float smoothing, int32_t ignore_index, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, xent_grad_loop, dz, z, lse, targets, dloss, T, Vl, ld, v0, V, smoothing, ignore_index);
    return TPK_OK;
}
/* row by row: the statistics, the loss, the gradient (the row still in cache) */
TPK__HOST_INLINE void xent_fused_loop(tpk_dtype dt, void *dz, float *loss, float *lse, const void *z, const int32_t *y, int64_t T, int64_t V,
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
static tpk_status host_xent_fused(tpk_ctx *ctx, void *dz, float *loss, float *lse, const void *z, const int32_t *targets, int64_t T, int64_t V,
                                  int64_t ld, float smoothing, int32_t ignore_index, float g, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, xent_fused_loop, dz, loss, lse, z, targets, T, V, ld, smoothing, ignore_index, g);
    return TPK_OK;
}

/* ---- attention ------------------------------------------------------------------------------ */

/* keep[j] = the keep factor of P[i][j] of head (b, global head g) for keys j < n: 0 or 1/(1-p)
 * (1 without dropout); P[i][j] has dropout index ((b A + g) S + i) S + j, one Philox call per 4 */
static void attn_keep_row(float *keep, float p, uint64_t seed, uint64_t stream, int64_t b, int64_t A, int64_t g, int64_t S, int64_t i, int64_t n) {
    if (p <= 0.0f) {
        for (int64_t j = 0; j < n; j++) keep[j] = 1.0f;
        return;
    }
    float scale = 1.0f / (1.0f - p);
    uint64_t x0 = (uint64_t)(((b * A + g) * S + i) * S);
    tpk_f32x4 u = tpk_rng_uniform4(seed, stream, x0 >> 2);
    for (int64_t j = 0; j < n; j++) {
        uint64_t x = x0 + (uint64_t)j;
        if (j > 0 && (x & 3) == 0) u = tpk_rng_uniform4(seed, stream, x >> 2);
        keep[j] = u.v[x & 3] >= p ? scale : 0.0f;
    }
}

/* Widen a [n] buffer of dtype dt into f32 scratch (or use it in place when f32). */
static float *widen(const void *x, size_t n, tpk_dtype dt, float **owned) {
    *owned = NULL;
    if (dt == TPK_F32) return (float *)x;
    float *f = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (f)
        for (size_t i = 0; i < n; i++) f[i] = tpk__ld(x, dt, i);
    *owned = f;
    return f;
}
static void narrow(void *y, const float *f, size_t n, tpk_dtype dt) {
    if (dt != TPK_F32)
        for (size_t i = 0; i < n; i++) tpk__st(y, dt, i, f[i]);
}


/* Query rows go in blocks of ATTN_ROWS: block [i0, i1) only needs keys [0, i1), so the causal
 * half of Q K^T is never computed. */
enum { ATTN_ROWS = 64 };

static tpk_status host_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al, int64_t D,
                              int64_t A, int64_t G, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "host.attn_fwd";
    TPK_TRY(tpk__host_blas_int(ctx, fn, "S", S)); /* the attention GEMMs take int sizes */
    int64_t g0, Gl = tpk_attn_kv_heads(A, G, head0, Al, &g0), grp = A / G;
    size_t nq = (size_t)(B * S * (Al + 2 * Gl) * D), no = (size_t)(B * S * Al * D);
    if (!nq) return TPK_OK;
    float *qo, *oo = NULL, *P = (float *)malloc(sizeof(float) * (size_t)(ATTN_ROWS * S)), *kp = (float *)malloc(sizeof(float) * (size_t)S);
    const float *q = widen(qkv, nq, dt, &qo);
    float *o = dt == TPK_F32 ? (float *)out : (oo = (float *)malloc(sizeof(float) * no));
    if (!q || !o || !P || !kp) {
        free(qo), free(oo), free(P), free(kp);
        return tpk__host_nomem(ctx, fn, sizeof(float) * (nq + no + (size_t)(ATTN_ROWS * S + S)));
    }
    int ld3 = (int)((Al + 2 * Gl) * D), ldo = (int)(Al * D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Al; h++) { /* query head h reads key/value head kv */
            int64_t kv = (head0 + h) / grp - g0;
            const float *Q = q + b * S * ld3 + h * D, *K = q + b * S * ld3 + (Al + kv) * D, *Vv = K + Gl * D;
            float *O = o + b * S * ldo + h * D, *L = lse + (b * Al + h) * S;
            for (int64_t i0 = 0; i0 < S; i0 += ATTN_ROWS) {
                int n = (int)(S - i0 < ATTN_ROWS ? S - i0 : ATTN_ROWS), keys = (int)i0 + n; /* P [n, keys] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, scale, Q + i0 * ld3, ld3, K, ld3, 0.0f, P, keys);
                for (int r = 0; r < n; r++) {
                    int64_t i = i0 + r;
                    float *row = P + (size_t)r * (size_t)keys, m = -INFINITY;
                    for (int64_t j = 0; j <= i; j++) m = fmaxf(m, row[j]);
                    double sum = 0;
                    for (int64_t j = 0; j <= i; j++) sum += row[j] = expf(row[j] - m);
                    L[i] = m + (float)log(sum);
                    float inv = (float)(1.0 / sum);
                    attn_keep_row(kp, p, seed, stream, b, A, head0 + h, S, i, i + 1);
                    for (int64_t j = 0; j <= i; j++) row[j] *= inv * kp[j];
                    for (int64_t j = i + 1; j < keys; j++) row[j] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, 1.0f, P, keys, Vv, ld3, 0.0f, O + i0 * ldo, ldo);
            }
        }
    narrow(out, o, no, dt);
    free(qo), free(oo), free(P), free(kp);
    return TPK_OK;
}

static tpk_status host_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t G, int64_t head0, float scale, float p,
                              uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "host.attn_bwd";
    TPK_TRY(tpk__host_blas_int(ctx, fn, "S", S)); /* the attention GEMMs take int sizes */
    int64_t g0, Gl = tpk_attn_kv_heads(A, G, head0, Al, &g0), grp = A / G;
    size_t nq = (size_t)(B * S * (Al + 2 * Gl) * D), no = (size_t)(B * S * Al * D), ss = (size_t)(ATTN_ROWS * S);
    if (!nq) return TPK_OK;
    float *o1, *o2, *o3, *o4 = NULL;
    const float *q = widen(qkv, nq, dt, &o1), *dO = widen(dout, no, dt, &o2), *O = widen(out, no, dt, &o3);
    float *dq = dt == TPK_F32 ? (float *)dqkv : (o4 = (float *)malloc(sizeof(float) * nq));
    float *P = (float *)malloc(sizeof(float) * ss), *dP = (float *)malloc(sizeof(float) * ss), *Dr = (float *)malloc(sizeof(float) * (size_t)S);
    float *kp = (float *)malloc(sizeof(float) * (size_t)S);
    if (!q || !dO || !O || !dq || !P || !dP || !Dr || !kp) {
        free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(Dr), free(kp);
        return tpk__host_nomem(ctx, fn, sizeof(float) * (2 * nq + 2 * no + 2 * ss + 2 * (size_t)S));
    }
    int ld3 = (int)((Al + 2 * Gl) * D), ldo = (int)(Al * D);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < S; i++) /* dK, dV accumulate over the row blocks and the query heads of a group */
            for (int64_t e = 0; e < 2 * Gl * D; e++) dq[(b * S + i) * ld3 + Al * D + e] = 0.0f;
        for (int64_t h = 0; h < Al; h++) {
            int64_t kv = (head0 + h) / grp - g0;
            size_t qoff = (size_t)(b * S * ld3 + h * D), kvoff = (size_t)(b * S * ld3 + (Al + kv) * D), ooff = (size_t)(b * S * ldo + h * D);
            const float *Q = q + qoff, *K = q + kvoff, *Vv = K + Gl * D, *L = lse + (b * Al + h) * S;
            const float *dOh = dO + ooff, *Oh = O + ooff;
            float *dQ = dq + qoff, *dK = dq + kvoff, *dV = dK + Gl * D;
            for (int64_t i0 = 0; i0 < S; i0 += ATTN_ROWS) {
                int n = (int)(S - i0 < ATTN_ROWS ? S - i0 : ATTN_ROWS), keys = (int)i0 + n; /* P, dP [n, keys] */
                /* P (without dropout) from lse; Dr_i = sum_d dO_i O_i */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, scale, Q + i0 * ld3, ld3, K, ld3, 0.0f, P, keys);
                for (int r = 0; r < n; r++) {
                    int64_t i = i0 + r;
                    float *row = P + (size_t)r * (size_t)keys;
                    for (int64_t j = 0; j < keys; j++) row[j] = j <= i ? expf(row[j] - L[i]) : 0.0f;
                    double d = 0;
                    for (int64_t e = 0; e < D; e++) d += (double)dOh[i * ldo + e] * Oh[i * ldo + e];
                    Dr[r] = (float)d;
                }
                /* dP = dO V^T (gradient w.r.t. the dropped probabilities), then through the mask */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, 1.0f, dOh + i0 * ldo, ldo, Vv, ld3, 0.0f, dP, keys);
                for (int r = 0; r < n; r++) {
                    int64_t i = i0 + r;
                    attn_keep_row(kp, p, seed, stream, b, A, head0 + h, S, i, i + 1);
                    for (int64_t j = 0; j < keys; j++) {
                        size_t k = (size_t)r * (size_t)keys + (size_t)j;
                        float keep = j <= i ? kp[j] : 0.0f, pij = P[k];
                        dP[k] = pij * (dP[k] * keep - Dr[r]); /* dS */
                        P[k] = pij * keep;                    /* dropped P, for dV */
                    }
                }
                /* dV[0:keys] += Pd^T dO, dQ = scale dS K, dK[0:keys] += scale dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, 1.0f, P, keys, dOh + i0 * ldo, ldo, 1.0f, dV, ld3);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, scale, dP, keys, K, ld3, 0.0f, dQ + i0 * ld3, ld3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, scale, dP, keys, Q + i0 * ld3, ld3, 1.0f, dK, ld3);
            }
        }
    }
    narrow(dqkv, dq, nq, dt);
    free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(Dr), free(kp);
    return TPK_OK;
}

/* This file's entries of the host backend's table. */
void tpk__host_layer_ops(tpk_ops *o) {
#define TPK__HOST_ENTRY(e) o->e = host_##e;
    TPK__OPS_LAYERS(TPK__HOST_ENTRY) /* o->dropout = host_dropout, ... */
#undef TPK__HOST_ENTRY
    o->residual_layernorm_fwd = host_residual_layernorm_fwd, o->xent_fused = host_xent_fused;
}
