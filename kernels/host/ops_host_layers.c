/* kernels/host/ops_host_layers.c — the transformer-layer ops of the host backend (contracts in
 * tpk/ops.h): dropout, layernorm, embedding, the cross-entropy pieces and causal attention.
 *
 *   dropout    y = x keep / (1-p),  keep = uniform(seed, stream, global index) >= p
 *   layernorm  y = (x - mean) rstd w + b,  rstd = 1/sqrt(var + eps)           (per row)
 *              dx = rstd (g - mean(g) - xh mean(g xh)),  g = dy w,  xh = (x - mean) rstd
 *   embedding  y[t] = E[ids[t] - v0] for ids in [v0, v0 + vrows),  dE[ids[t] - v0] += dy[t]
 *   xent       lse = max + log sum exp(z - max);  loss = lse - (1-eps) z_y - eps mean_V(z)
 *              dz = (softmax(z) - (1-eps) onehot - eps/V) dloss
 *   attention  per (batch, head): S = scale Q K^T (causal), P = softmax(S), O = P V, with
 *              Q K^T and P V through cblas_sgemm in blocks of query rows that skip the masked
 *              keys; backward recomputes P from the saved lse.
 * Arithmetic is f32 (sums of a row in double); bf16 is storage, widened on load. */
#include <cblas.h>

#include "host.h"

/* ---- dropout ------------------------------------------------------------------------------ */

HOST_INLINE void dropout_loop(tpk_dtype dt, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                              int64_t col0, float p, uint64_t seed, uint64_t stream) {
    float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            size_t k = (size_t)(i * cols + j);
            bool keep = tpk_rng_uniform(seed, stream, (uint64_t)((row0 + i) * gcols + col0 + j)) >= p;
            st(y, dt, k, keep ? ld(x, dt, k) * scale : 0.0f);
        }
}
tpk_status tpk__host_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                             int64_t col0, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "host.dropout";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "rows", rows));
    TPK_TRY(check_nonneg(ctx, fn, "cols", cols));
    if (!(p >= 0.0f && p < 1.0f)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "p: expected 0 <= p < 1, got %g", (double)p);
    if (row0 < 0 || col0 < 0 || gcols < col0 + cols)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "gcols: expected >= col0 + cols = %lld (row0, col0 >= 0), got %lld", (long long)(col0 + cols), (long long)gcols);
    TPK_TRY(check_ptr(ctx, fn, "x", x, rows * cols > 0));
    TPK_TRY(check_ptr(ctx, fn, "y", y, rows * cols > 0));
    BY_DTYPE(dt, dropout_loop, y, x, rows, cols, gcols, row0, col0, p, seed, stream);
    return TPK_OK;
}

/* ---- layernorm ------------------------------------------------------------------------------ */

HOST_INLINE void ln_fwd_loop(tpk_dtype dt, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                             int64_t rows, int64_t cols, float eps) {
    for (int64_t i = 0; i < rows; i++) {
        size_t r = (size_t)(i * cols);
        double s = 0, s2 = 0;
        for (int64_t j = 0; j < cols; j++) s += ld(x, dt, r + (size_t)j);
        double m = s / (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            double d = ld(x, dt, r + (size_t)j) - m;
            s2 += d * d;
        }
        float rs = (float)(1.0 / sqrt(s2 / (double)cols + eps));
        for (int64_t j = 0; j < cols; j++) st(y, dt, r + (size_t)j, (ld(x, dt, r + (size_t)j) - (float)m) * rs * w[j] + b[j]);
        mean[i] = (float)m, rstd[i] = rs;
    }
}
tpk_status tpk__host_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                                   int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    static const char *fn = "host.layernorm_fwd";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "rows", rows));
    if (cols < 1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cols: expected >= 1, got %lld", (long long)cols);
    if (!(eps > 0)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "eps: expected > 0, got %g", (double)eps);
    bool any = rows > 0;
    TPK_TRY(check_ptr(ctx, fn, "y", y, any));
    TPK_TRY(check_ptr(ctx, fn, "mean", mean, any));
    TPK_TRY(check_ptr(ctx, fn, "rstd", rstd, any));
    TPK_TRY(check_ptr(ctx, fn, "x", x, any));
    TPK_TRY(check_ptr(ctx, fn, "w", w, any));
    TPK_TRY(check_ptr(ctx, fn, "b", b, any));
    BY_DTYPE(dt, ln_fwd_loop, y, mean, rstd, x, w, b, rows, cols, eps);
    return TPK_OK;
}

/* x1 = x + r (rounded to dt), then layernorm_fwd on x1: the host composes the two */
HOST_INLINE void residual_loop(tpk_dtype dt, void *x1, const void *x, const void *r, size_t n) {
    for (size_t i = 0; i < n; i++) st(x1, dt, i, ld(x, dt, i) + ld(r, dt, i));
}
tpk_status tpk__host_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd, const void *x, const void *r,
                                            const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    static const char *fn = "host.residual_layernorm_fwd";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "rows", rows));
    if (cols < 1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cols: expected >= 1, got %lld", (long long)cols);
    TPK_TRY(check_ptr(ctx, fn, "x1", x1, rows > 0));
    TPK_TRY(check_ptr(ctx, fn, "x", x, rows > 0));
    TPK_TRY(check_ptr(ctx, fn, "r", r, rows > 0));
    BY_DTYPE(dt, residual_loop, x1, x, r, (size_t)(rows * cols));
    return tpk__host_layernorm_fwd(ctx, y, mean, rstd, x1, w, b, rows, cols, eps, dt);
}

HOST_INLINE void ln_bwd_loop(tpk_dtype dt, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                             const float *mean, const float *rstd, int64_t rows, int64_t cols, bool acc) {
    for (int64_t i = 0; i < rows; i++) {
        size_t r = (size_t)(i * cols);
        double mg = 0, mgx = 0;
        for (int64_t j = 0; j < cols; j++) {
            float xh = (ld(x, dt, r + (size_t)j) - mean[i]) * rstd[i], g = ld(dy, dt, r + (size_t)j);
            mg += g * w[j], mgx += g * w[j] * xh;
            dw[j] += g * xh, db[j] += g;
        }
        mg /= (double)cols, mgx /= (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            float xh = (ld(x, dt, r + (size_t)j) - mean[i]) * rstd[i], g = ld(dy, dt, r + (size_t)j) * w[j];
            float v = rstd[i] * (g - (float)mg - xh * (float)mgx);
            st(dx, dt, r + (size_t)j, acc ? ld(dx, dt, r + (size_t)j) + v : v);
        }
    }
}
tpk_status tpk__host_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                                   const float *mean, const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx) {
    static const char *fn = "host.layernorm_bwd";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "rows", rows));
    if (cols < 1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cols: expected >= 1, got %lld", (long long)cols);
    bool any = rows > 0;
    const void *ps[] = {dx, dw, db, dy, x, w, mean, rstd};
    const char *names[] = {"dx", "dw", "db", "dy", "x", "w", "mean", "rstd"};
    for (int k = 0; k < 8; k++) TPK_TRY(check_ptr(ctx, fn, names[k], ps[k], any));
    BY_DTYPE(dt, ln_bwd_loop, dx, dw, db, dy, x, w, mean, rstd, rows, cols, accumulate_dx);
    return TPK_OK;
}

/* ---- embedding ------------------------------------------------------------------------------ */

HOST_INLINE void embed_fwd_loop(tpk_dtype dt, void *y, const int32_t *ids, const float *E, int64_t T, int64_t H, int64_t v0,
                                int64_t vrows, bool acc) {
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        bool in = row >= 0 && row < vrows;
        for (int64_t j = 0; j < H; j++) {
            size_t k = (size_t)(t * H + j);
            float e = in ? E[row * H + j] : 0.0f;
            st(y, dt, k, acc ? ld(y, dt, k) + e : e);
        }
    }
}
tpk_status tpk__host_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt, bool accumulate) {
    static const char *fn = "host.embed_fwd";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "T", T));
    TPK_TRY(check_nonneg(ctx, fn, "H", H));
    TPK_TRY(check_nonneg(ctx, fn, "vrows", vrows));
    TPK_TRY(check_ptr(ctx, fn, "y", y, T * H > 0));
    TPK_TRY(check_ptr(ctx, fn, "ids", ids, T > 0));
    TPK_TRY(check_ptr(ctx, fn, "table", table, vrows * H > 0));
    BY_DTYPE(dt, embed_fwd_loop, y, ids, table, T, H, v0, vrows, accumulate);
    return TPK_OK;
}
HOST_INLINE void embed_bwd_loop(tpk_dtype dt, float *dE, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                                int64_t vrows) {
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        if (row < 0 || row >= vrows) continue;
        for (int64_t j = 0; j < H; j++) dE[row * H + j] += ld(dy, dt, (size_t)(t * H + j));
    }
}
tpk_status tpk__host_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt) {
    static const char *fn = "host.embed_bwd";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "T", T));
    TPK_TRY(check_nonneg(ctx, fn, "H", H));
    TPK_TRY(check_nonneg(ctx, fn, "vrows", vrows));
    TPK_TRY(check_ptr(ctx, fn, "dtable", dtable, vrows * H > 0));
    TPK_TRY(check_ptr(ctx, fn, "dy", dy, T * H > 0));
    TPK_TRY(check_ptr(ctx, fn, "ids", ids, T > 0));
    BY_DTYPE(dt, embed_bwd_loop, dtable, dy, ids, T, H, v0, vrows);
    return TPK_OK;
}

/* ---- cross-entropy pieces ------------------------------------------------------------------- */

HOST_INLINE void xent_max_loop(tpk_dtype dt, float *mx, const void *z, int64_t T, int64_t Vl) {
    for (int64_t t = 0; t < T; t++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < Vl; j++) m = fmaxf(m, ld(z, dt, (size_t)(t * Vl + j)));
        mx[t] = m;
    }
}
tpk_status tpk__host_xent_max(tpk_ctx *ctx, float *mx, const void *z, int64_t T, int64_t Vl, tpk_dtype dt) {
    static const char *fn = "host.xent_max";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "T", T));
    TPK_TRY(check_nonneg(ctx, fn, "Vl", Vl));
    TPK_TRY(check_ptr(ctx, fn, "mx", mx, T > 0));
    TPK_TRY(check_ptr(ctx, fn, "z", z, T * Vl > 0));
    BY_DTYPE(dt, xent_max_loop, mx, z, T, Vl);
    return TPK_OK;
}
HOST_INLINE void xent_partial_loop(tpk_dtype dt, float *part, const void *z, const float *mx, const int32_t *y, int64_t T,
                                   int64_t Vl, int64_t v0) {
    for (int64_t t = 0; t < T; t++) {
        double se = 0, sz = 0;
        for (int64_t j = 0; j < Vl; j++) {
            float v = ld(z, dt, (size_t)(t * Vl + j));
            se += exp((double)v - mx[t]), sz += v;
        }
        int64_t c = (int64_t)y[t] - v0;
        part[3 * t] = (float)se, part[3 * t + 1] = c >= 0 && c < Vl ? ld(z, dt, (size_t)(t * Vl + c)) : 0.0f, part[3 * t + 2] = (float)sz;
    }
}
tpk_status tpk__host_xent_partial(tpk_ctx *ctx, float *part, const void *z, const float *mx, const int32_t *targets, int64_t T,
                                  int64_t Vl, int64_t v0, tpk_dtype dt) {
    static const char *fn = "host.xent_partial";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "T", T));
    TPK_TRY(check_nonneg(ctx, fn, "Vl", Vl));
    TPK_TRY(check_ptr(ctx, fn, "part", part, T > 0));
    TPK_TRY(check_ptr(ctx, fn, "mx", mx, T > 0));
    TPK_TRY(check_ptr(ctx, fn, "targets", targets, T > 0));
    TPK_TRY(check_ptr(ctx, fn, "z", z, T * Vl > 0));
    BY_DTYPE(dt, xent_partial_loop, part, z, mx, targets, T, Vl, v0);
    return TPK_OK;
}
tpk_status tpk__host_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *mx, const float *part, const int32_t *targets,
                               int64_t T, int64_t V, float smoothing, int32_t ignore_index) {
    static const char *fn = "host.xent_loss";
    TPK_TRY(check_nonneg(ctx, fn, "T", T));
    if (V < 1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "V: expected >= 1, got %lld", (long long)V);
    if (!(smoothing >= 0 && smoothing <= 1)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "smoothing: expected 0..1, got %g", (double)smoothing);
    const void *ps[] = {loss, lse, mx, part, targets};
    const char *names[] = {"loss", "lse", "mx", "part", "targets"};
    for (int k = 0; k < 5; k++) TPK_TRY(check_ptr(ctx, fn, names[k], ps[k], T > 0));
    for (int64_t t = 0; t < T; t++) {
        double l = (double)mx[t] + log((double)part[3 * t]);
        lse[t] = (float)l;
        loss[t] = targets[t] == ignore_index ? 0.0f
                                             : (float)(l - (1.0 - smoothing) * part[3 * t + 1] - smoothing * (double)part[3 * t + 2] / (double)V);
    }
    return TPK_OK;
}
HOST_INLINE void xent_grad_loop(tpk_dtype dt, void *dz, const void *z, const float *lse, const int32_t *y, const float *dloss,
                                int64_t T, int64_t Vl, int64_t v0, int64_t V, float eps, int32_t ignore) {
    for (int64_t t = 0; t < T; t++) {
        bool skip = y[t] == ignore;
        int64_t c = (int64_t)y[t] - v0;
        for (int64_t j = 0; j < Vl; j++) {
            size_t k = (size_t)(t * Vl + j);
            float g = skip ? 0.0f
                           : (expf(ld(z, dt, k) - lse[t]) - (j == c ? 1.0f - eps : 0.0f) - eps / (float)V) * dloss[t];
            st(dz, dt, k, g);
        }
    }
}
tpk_status tpk__host_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse, const int32_t *targets, const float *dloss,
                               int64_t T, int64_t Vl, int64_t v0, int64_t V, float smoothing, int32_t ignore_index, tpk_dtype dt) {
    static const char *fn = "host.xent_grad";
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "T", T));
    TPK_TRY(check_nonneg(ctx, fn, "Vl", Vl));
    if (V < 1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "V: expected >= 1, got %lld", (long long)V);
    TPK_TRY(check_ptr(ctx, fn, "dz", dz, T * Vl > 0));
    TPK_TRY(check_ptr(ctx, fn, "z", z, T * Vl > 0));
    TPK_TRY(check_ptr(ctx, fn, "lse", lse, T > 0));
    TPK_TRY(check_ptr(ctx, fn, "targets", targets, T > 0));
    TPK_TRY(check_ptr(ctx, fn, "dloss", dloss, T > 0));
    BY_DTYPE(dt, xent_grad_loop, dz, z, lse, targets, dloss, T, Vl, v0, V, smoothing, ignore_index);
    return TPK_OK;
}

/* ---- attention ------------------------------------------------------------------------------ */

/* keep factor of P[i][j] of head (b, global head g): 0 or 1/(1-p) */
static inline float attn_keep(float p, uint64_t seed, uint64_t stream, int64_t b, int64_t A, int64_t g, int64_t S, int64_t i, int64_t j) {
    if (p <= 0.0f) return 1.0f;
    return tpk_rng_uniform(seed, stream, (uint64_t)((((b * A + g) * S + i) * S) + j)) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

/* Widen a [n] buffer of dtype dt into f32 scratch (or use it in place when f32). */
static float *widen(const void *x, size_t n, tpk_dtype dt, float **owned) {
    *owned = NULL;
    if (dt == TPK_F32) return (float *)x;
    float *f = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (f)
        for (size_t i = 0; i < n; i++) f[i] = ld(x, dt, i);
    *owned = f;
    return f;
}
static void narrow(void *y, const float *f, size_t n, tpk_dtype dt) {
    if (dt != TPK_F32)
        for (size_t i = 0; i < n; i++) st(y, dt, i, f[i]);
}

static tpk_status attn_check(tpk_ctx *ctx, const char *fn, int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t head0,
                             float p, tpk_dtype dt) {
    TPK_TRY(check_float_dtype(ctx, fn, "dt", dt));
    TPK_TRY(check_nonneg(ctx, fn, "B", B));
    TPK_TRY(check_nonneg(ctx, fn, "S", S));
    TPK_TRY(check_nonneg(ctx, fn, "Al", Al));
    if (D < 1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "D: expected >= 1, got %lld", (long long)D);
    if (head0 < 0 || head0 + Al > A)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "head0: expected 0 <= head0 and head0 + Al <= A = %lld, got %lld", (long long)A, (long long)head0);
    if (!(p >= 0.0f && p < 1.0f)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "p: expected 0 <= p < 1, got %g", (double)p);
    TPK_TRY(check_blas_int(ctx, fn, "S", S));
    return TPK_OK;
}

/* Query rows go in blocks of ATTN_ROWS: block [i0, i1) only needs keys [0, i1), so the causal
 * half of Q K^T is never computed. */
enum { ATTN_ROWS = 64 };

tpk_status tpk__host_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al, int64_t D,
                              int64_t A, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "host.attn_fwd";
    TPK_TRY(attn_check(ctx, fn, B, S, Al, D, A, head0, p, dt));
    size_t nq = (size_t)(B * S * 3 * Al * D), no = (size_t)(B * S * Al * D);
    if (!nq) return TPK_OK;
    TPK_TRY(check_ptr(ctx, fn, "out", out, true));
    TPK_TRY(check_ptr(ctx, fn, "lse", lse, true));
    TPK_TRY(check_ptr(ctx, fn, "qkv", qkv, true));
    float *qo, *oo = NULL, *P = (float *)malloc(sizeof(float) * (size_t)(ATTN_ROWS * S));
    const float *q = widen(qkv, nq, dt, &qo);
    float *o = dt == TPK_F32 ? (float *)out : (oo = (float *)malloc(sizeof(float) * no));
    if (!q || !o || !P) {
        free(qo), free(oo), free(P);
        return nomem(ctx, fn, sizeof(float) * (nq + no + (size_t)(ATTN_ROWS * S)));
    }
    int ld3 = (int)(3 * Al * D), ldo = (int)(Al * D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Al; h++) {
            const float *Q = q + b * S * ld3 + h * D, *K = Q + Al * D, *Vv = Q + 2 * Al * D;
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
                    for (int64_t j = 0; j <= i; j++) row[j] *= inv * attn_keep(p, seed, stream, b, A, head0 + h, S, i, j);
                    for (int64_t j = i + 1; j < keys; j++) row[j] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, 1.0f, P, keys, Vv, ld3, 0.0f, O + i0 * ldo, ldo);
            }
        }
    narrow(out, o, no, dt);
    free(qo), free(oo), free(P);
    return TPK_OK;
}

tpk_status tpk__host_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t head0, float scale, float p,
                              uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "host.attn_bwd";
    TPK_TRY(attn_check(ctx, fn, B, S, Al, D, A, head0, p, dt));
    size_t nq = (size_t)(B * S * 3 * Al * D), no = (size_t)(B * S * Al * D), ss = (size_t)(ATTN_ROWS * S);
    if (!nq) return TPK_OK;
    const void *ps[] = {dqkv, dout, qkv, out, lse};
    const char *names[] = {"dqkv", "dout", "qkv", "out", "lse"};
    for (int k = 0; k < 5; k++) TPK_TRY(check_ptr(ctx, fn, names[k], ps[k], true));
    float *o1, *o2, *o3, *o4 = NULL;
    const float *q = widen(qkv, nq, dt, &o1), *dO = widen(dout, no, dt, &o2), *O = widen(out, no, dt, &o3);
    float *dq = dt == TPK_F32 ? (float *)dqkv : (o4 = (float *)malloc(sizeof(float) * nq));
    float *P = (float *)malloc(sizeof(float) * ss), *dP = (float *)malloc(sizeof(float) * ss), *Dr = (float *)malloc(sizeof(float) * (size_t)S);
    if (!q || !dO || !O || !dq || !P || !dP || !Dr) {
        free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(Dr);
        return nomem(ctx, fn, sizeof(float) * (2 * nq + 2 * no + 2 * ss));
    }
    int ld3 = (int)(3 * Al * D), ldo = (int)(Al * D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Al; h++) {
            size_t qoff = (size_t)(b * S * ld3 + h * D), ooff = (size_t)(b * S * ldo + h * D);
            const float *Q = q + qoff, *K = Q + Al * D, *Vv = Q + 2 * Al * D, *L = lse + (b * Al + h) * S;
            const float *dOh = dO + ooff, *Oh = O + ooff;
            float *dQ = dq + qoff, *dK = dQ + Al * D, *dV = dQ + 2 * Al * D;
            for (int64_t i = 0; i < S; i++) /* dK, dV accumulate over the row blocks */
                for (int64_t e = 0; e < D; e++) dK[i * ld3 + e] = dV[i * ld3 + e] = 0.0f;
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
                for (int r = 0; r < n; r++)
                    for (int64_t j = 0; j < keys; j++) {
                        int64_t i = i0 + r;
                        size_t k = (size_t)r * (size_t)keys + (size_t)j;
                        float keep = j <= i ? attn_keep(p, seed, stream, b, A, head0 + h, S, i, j) : 0.0f, pij = P[k];
                        dP[k] = pij * (dP[k] * keep - Dr[r]); /* dS */
                        P[k] = pij * keep;                    /* dropped P, for dV */
                    }
                /* dV[0:keys] += Pd^T dO, dQ = scale dS K, dK[0:keys] += scale dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, 1.0f, P, keys, dOh + i0 * ldo, ldo, 1.0f, dV, ld3);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, scale, dP, keys, K, ld3, 0.0f, dQ + i0 * ld3, ld3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, scale, dP, keys, Q + i0 * ld3, ld3, 1.0f, dK, ld3);
            }
        }
    narrow(dqkv, dq, nq, dt);
    free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(Dr);
    return TPK_OK;
}
