/* kernels/host/attn.c — the host backend's causal attention (grouped-query), and one block of an
 * attention split over the sequence (context parallelism's).
 *
 * Per (batch, query head; its key/value head): S = scale Q K^T (causal), P = softmax(S) (dropout
 * on P by tpk/base/rng.h's masks), O = P V, with Q K^T and P V through cblas_sgemm in blocks of
 * query rows that skip the masked keys; the backward recomputes P from the saved lse. Arithmetic is
 * f32 (row sums in float lanes and double, vec.h's exponential); bf16 is storage, widened on load.
 * The GEMMs use OpenBLAS's threads; the softmax runs on the calling thread.
 * A block (attn_block_fwd / _bwd): the same on Sq query rows at positions q0 + i against Sk keys
 * at k0 + j (causal: j visible when k0 + j <= q0 + i), its o and lse merged into a running pair
 * by log-sum-exp, L = log(e^L' + e^l), o = e^(L' - L) o' + e^(l - L) o_block; the backward takes
 * the whole attention's lse and output and adds the block's dQ, dK, dV into f32 sums. Dropout in
 * a block keeps (q0 + i, k0 + j) by the mask attn_fwd draws at that pair of the whole sequence
 * (attn_keep_row at row q0 + i from column k0), so blocks merged are attn_fwd's dropout. */
#include <math.h>
#include <stdlib.h>

#include <cblas.h>

#include "vec.h"

/* ---- attention ------------------------------------------------------------------------------ */

/* keep[j] = the keep factor of P[i][j] of head (b, global head g) for keys j < n: 0 or 1/(1-p)
 * (1 without dropout); P[i][j] has dropout index ((b A + g) S + i) S + j, one Philox call per 4 */
static void attn_keep_row_at(float *keep, float p, uint64_t seed, uint64_t stream, int64_t b,
                             int64_t A, int64_t g, int64_t S, int64_t i, int64_t j0, int64_t n) {
    if (p <= 0.0f) {
        for (int64_t j = 0; j < n; j++) keep[j] = 1.0f;
        return;
    }
    float scale = 1.0f / (1.0f - p);
    tpk__host_dropout_u(seed, stream, (uint64_t)(((b * A + g) * S + i) * S + j0), n, keep);
    for (int64_t j = 0; j < n; j++) keep[j] = keep[j] >= p ? scale : 0.0f;
}
/* the keep factors of keys [0, n) of row i (attn_keep_row_at from key 0) */
static void attn_keep_row(float *keep, float p, uint64_t seed, uint64_t stream, int64_t b,
                          int64_t A, int64_t g, int64_t S, int64_t i, int64_t n) {
    attn_keep_row_at(keep, p, seed, stream, b, A, g, S, i, 0, n);
}

/* row[j] = exp(row[j] - sub) for j < n (vec.h's exponential); returns their sum (float lanes over
 * blocks of 256, double across) */
TPK__HOST_SIMD static double exp_row(float *row, int64_t n, float sub) {
    tpk__v8f vs = tpk__vsplat(sub);
    double sum = 0;
    for (int64_t j0 = 0; j0 < n; j0 += 256) {
        int64_t j1 = j0 + 256 < n ? j0 + 256 : n, j = j0;
        tpk__v8f acc = tpk__vsplat(0.0f), e;
        for (; j + TPK__VL <= j1; j += TPK__VL)
            e = tpk__vexp(tpk__vld(row, TPK_F32, (size_t)j) - vs), acc += e,
            tpk__vst(row, TPK_F32, (size_t)j, e);
        e = tpk__vexp(tpk__vld_n(row, TPK_F32, (size_t)j, j1 - j) - vs);
        for (int k = (int)(j1 - j); k < TPK__VL; k++) e[k] = 0.0f; /* the lanes past the row */
        tpk__vst_n(row, TPK_F32, (size_t)j, e, j1 - j);
        sum += tpk__vhsum(acc + e);
    }
    return sum;
}
/* row[0, n) = exp(row - max) and *lse = max + log(sum); returns the sum */
TPK__HOST_SIMD static double softmax_row(float *row, int64_t n, float *lse) {
    int64_t j = 0;
    tpk__v8f vm = tpk__vsplat(-INFINITY);
    for (; j + TPK__VL <= n; j += TPK__VL) vm = tpk__vmax(vm, tpk__vld(row, TPK_F32, (size_t)j));
    float m = tpk__vhmax(vm);
    for (; j < n; j++) m = fmaxf(m, row[j]);
    double sum = exp_row(row, n, m);
    *lse = m + (float)log(sum);
    return sum;
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

static tpk_status host_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B,
                                int64_t S, int64_t Al, int64_t D, int64_t A, int64_t G,
                                int64_t head0, float scale, float p, uint64_t seed, uint64_t stream,
                                tpk_dtype dt) {
    static const char *fn = "host.attn_fwd";
    TPK_TRY(tpk__host_blas_int(ctx, fn, "S", S)); /* the attention GEMMs take int sizes */
    int64_t g0, Gl = tpk_attn_kv_heads(A, G, head0, Al, &g0), grp = A / G;
    size_t nq = (size_t)(B * S * (Al + 2 * Gl) * D), no = (size_t)(B * S * Al * D);
    if (!nq) return TPK_OK;
    float *qo, *oo = NULL, *P = (float *)malloc(sizeof(float) * (size_t)(ATTN_ROWS * S)),
               *kp = (float *)malloc(sizeof(float) * (size_t)S);
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
            const float *Q = q + b * S * ld3 + h * D, *K = q + b * S * ld3 + (Al + kv) * D,
                        *Vv = K + Gl * D;
            float *O = o + b * S * ldo + h * D, *L = lse + (b * Al + h) * S;
            for (int64_t i0 = 0; i0 < S; i0 += ATTN_ROWS) {
                int n = (int)(S - i0 < ATTN_ROWS ? S - i0 : ATTN_ROWS),
                    keys = (int)i0 + n; /* P [n, keys] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, scale,
                            Q + i0 * ld3, ld3, K, ld3, 0.0f, P, keys);
                for (int r = 0; r < n; r++) {
                    int64_t i = i0 + r;
                    float *row = P + (size_t)r * (size_t)keys;
                    double sum = softmax_row(row, i + 1, &L[i]);
                    float inv = (float)(1.0 / sum);
                    attn_keep_row(kp, p, seed, stream, b, A, head0 + h, S, i, i + 1);
                    for (int64_t j = 0; j <= i; j++) row[j] *= inv * kp[j];
                    for (int64_t j = i + 1; j < keys; j++) row[j] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, 1.0f, P,
                            keys, Vv, ld3, 0.0f, O + i0 * ldo, ldo);
            }
        }
    narrow(out, o, no, dt);
    free(qo), free(oo), free(P), free(kp);
    return TPK_OK;
}

static tpk_status host_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                                const void *out, const float *lse, int64_t B, int64_t S, int64_t Al,
                                int64_t D, int64_t A, int64_t G, int64_t head0, float scale,
                                float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "host.attn_bwd";
    TPK_TRY(tpk__host_blas_int(ctx, fn, "S", S)); /* the attention GEMMs take int sizes */
    int64_t g0, Gl = tpk_attn_kv_heads(A, G, head0, Al, &g0), grp = A / G;
    size_t nq = (size_t)(B * S * (Al + 2 * Gl) * D), no = (size_t)(B * S * Al * D),
           ss = (size_t)(ATTN_ROWS * S);
    if (!nq) return TPK_OK;
    float *o1, *o2, *o3, *o4 = NULL;
    const float *q = widen(qkv, nq, dt, &o1), *dO = widen(dout, no, dt, &o2),
                *O = widen(out, no, dt, &o3);
    float *dq = dt == TPK_F32 ? (float *)dqkv : (o4 = (float *)malloc(sizeof(float) * nq));
    float *P = (float *)malloc(sizeof(float) * ss), *dP = (float *)malloc(sizeof(float) * ss),
          *Dr = (float *)malloc(sizeof(float) * (size_t)S);
    float *kp = (float *)malloc(sizeof(float) * (size_t)S);
    if (!q || !dO || !O || !dq || !P || !dP || !Dr || !kp) {
        free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(Dr), free(kp);
        return tpk__host_nomem(ctx, fn, sizeof(float) * (2 * nq + 2 * no + 2 * ss + 2 * (size_t)S));
    }
    int ld3 = (int)((Al + 2 * Gl) * D), ldo = (int)(Al * D);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < S; i++) /* dK, dV accumulate over the row blocks and the query heads
                                           of a group */
            for (int64_t e = 0; e < 2 * Gl * D; e++) dq[(b * S + i) * ld3 + Al * D + e] = 0.0f;
        for (int64_t h = 0; h < Al; h++) {
            int64_t kv = (head0 + h) / grp - g0;
            size_t qoff = (size_t)(b * S * ld3 + h * D),
                   kvoff = (size_t)(b * S * ld3 + (Al + kv) * D),
                   ooff = (size_t)(b * S * ldo + h * D);
            const float *Q = q + qoff, *K = q + kvoff, *Vv = K + Gl * D,
                        *L = lse + (b * Al + h) * S;
            const float *dOh = dO + ooff, *Oh = O + ooff;
            float *dQ = dq + qoff, *dK = dq + kvoff, *dV = dK + Gl * D;
            for (int64_t i0 = 0; i0 < S; i0 += ATTN_ROWS) {
                int n = (int)(S - i0 < ATTN_ROWS ? S - i0 : ATTN_ROWS),
                    keys = (int)i0 + n; /* P, dP [n, keys] */
                /* P (without dropout) from lse; Dr_i = sum_d dO_i O_i */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, scale,
                            Q + i0 * ld3, ld3, K, ld3, 0.0f, P, keys);
                for (int r = 0; r < n; r++) {
                    int64_t i = i0 + r;
                    float *row = P + (size_t)r * (size_t)keys;
                    exp_row(row, i + 1, L[i]);
                    for (int64_t j = i + 1; j < keys; j++) row[j] = 0.0f;
                    double d = 0;
                    for (int64_t e = 0; e < D; e++) d += (double)dOh[i * ldo + e] * Oh[i * ldo + e];
                    Dr[r] = (float)d;
                }
                /* dP = dO V^T (gradient w.r.t. the dropped probabilities), then through the mask */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, 1.0f,
                            dOh + i0 * ldo, ldo, Vv, ld3, 0.0f, dP, keys);
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
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, 1.0f, P, keys,
                            dOh + i0 * ldo, ldo, 1.0f, dV, ld3);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, scale, dP,
                            keys, K, ld3, 0.0f, dQ + i0 * ld3, ld3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, scale, dP,
                            keys, Q + i0 * ld3, ld3, 1.0f, dK, ld3);
            }
        }
    }
    narrow(dqkv, dq, nq, dt);
    free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(Dr), free(kp);
    return TPK_OK;
}

/* ---- one block of an attention split over the sequence (context parallelism) ---------------- */

/* the keys [0, n) of block b that query row i sees: all, or those at k0 + j <= q0 + i */
static int64_t blk_vis(const tpk_attn_blk *b, int64_t i) {
    if (!b->causal) return b->Sk;
    int64_t n = b->q0 + i - b->k0 + 1;
    return n < 0 ? 0 : n > b->Sk ? b->Sk : n;
}
/* keep[j], j < n: the keep factors of block row i against keys j of global head g */
static void blk_keep_row(float *keep, const tpk_attn_blk *b, int64_t g, int64_t i, int64_t n) {
    attn_keep_row_at(keep, b->p, b->seed, b->stream, b->b, b->A, g, b->S, b->q0 + i, b->k0, n);
}
/* rows x cols of x (leading dimension ld, dtype dt) as f32 with the same ld (x itself when f32);
 * only those elements are read */
static float *widen2d(const void *x, int64_t rows, int64_t cols, int64_t ld, tpk_dtype dt,
                      float **owned) {
    *owned = NULL;
    if (dt == TPK_F32 || !rows) return (float *)x;
    float *f = (float *)malloc(sizeof(float) * (size_t)(rows * ld));
    if (f)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                f[i * ld + j] = tpk__ld(x, dt, (size_t)(i * ld + j));
    *owned = f;
    return f;
}

static tpk_status host_attn_block_fwd(tpk_ctx *ctx, float *out, float *lse, const void *q,
                                      const void *kv, const tpk_attn_blk *b, bool merge,
                                      tpk_dtype dt) {
    static const char *fn = "host.attn_block_fwd";
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->Sk", b->Sk)); /* the GEMMs take int sizes */
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->ldq", b->ldq));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->ldkv", b->ldkv));
    int64_t g0, Gl = tpk_attn_kv_heads(b->A, b->G, b->head0, b->Al, &g0), grp = b->A / b->G;
    int64_t Sq = b->Sq, Sk = b->Sk, D = b->D, keys_max = Sk > 0 ? Sk : 1;
    if (!Sq || !b->Al) return TPK_OK;
    float *qo, *ko = NULL, *P = (float *)malloc(sizeof(float) * (size_t)(ATTN_ROWS * keys_max)),
               *ob = (float *)malloc(sizeof(float) * (size_t)(ATTN_ROWS * D)),
               *kp = (float *)malloc(sizeof(float) * (size_t)keys_max), lb[ATTN_ROWS];
    const float *Q = widen2d(q, Sq, b->Al * D, b->ldq, dt, &qo);
    const float *KV = Sk ? widen2d(kv, Sk, 2 * Gl * D, b->ldkv, dt, &ko) : NULL;
    if (!Q || (Sk && !KV) || !P || !ob || !kp) {
        free(qo), free(ko), free(P), free(ob), free(kp);
        return tpk__host_nomem(ctx, fn, sizeof(float) * (size_t)(Sq * b->ldq + Sk * b->ldkv));
    }
    int ldq = (int)b->ldq, ldkv = (int)b->ldkv;
    for (int64_t h = 0; h < b->Al; h++) { /* query head h reads key/value head kv */
        int64_t kvh = (b->head0 + h) / grp - g0;
        const float *Qh = Q + h * D, *K = KV ? KV + kvh * D : NULL, *V = KV ? K + Gl * D : NULL;
        float *O = out + h * D, *L = lse + h * b->ldl;
        for (int64_t i0 = 0; i0 < Sq; i0 += ATTN_ROWS) {
            int n = (int)(Sq - i0 < ATTN_ROWS ? Sq - i0 : ATTN_ROWS),
                keys = (int)blk_vis(b, i0 + n - 1); /* the most any row of the block sees */
            if (keys > 0) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, b->scale,
                            Qh + i0 * ldq, ldq, K, ldkv, 0.0f, P, keys);
                for (int r = 0; r < n; r++) {
                    int64_t v = blk_vis(b, i0 + r);
                    float *row = P + (size_t)r * (size_t)keys;
                    if (v > 0) { /* lse of the undropped softmax, o of the dropped P */
                        float inv = (float)(1.0 / softmax_row(row, v, &lb[r]));
                        blk_keep_row(kp, b, b->head0 + h, i0 + r, v);
                        for (int64_t j = 0; j < v; j++) row[j] *= inv * kp[j];
                    } else {
                        lb[r] = -INFINITY;
                    }
                    for (int64_t j = v; j < keys; j++) row[j] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, 1.0f, P,
                            keys, V, ldkv, 0.0f, ob, (int)D);
            } else {
                for (int r = 0; r < n; r++) lb[r] = -INFINITY;
                for (int64_t e = 0; e < n * D; e++) ob[e] = 0.0f;
            }
            for (int r = 0; r < n; r++) { /* into out and lse, or merged with them */
                int64_t i = i0 + r;
                float *o = O + i * b->ldo;
                const float *x = ob + (size_t)r * (size_t)D;
                double la = L[i], lbr = lb[r];
                if (!merge || la == -INFINITY) {
                    for (int64_t d = 0; d < D; d++) o[d] = x[d];
                    L[i] = lb[r];
                } else if (lbr != -INFINITY) {
                    double m = la > lbr ? la : lbr, l = m + log(exp(la - m) + exp(lbr - m));
                    float wa = (float)exp(la - l), wb = (float)exp(lbr - l);
                    for (int64_t d = 0; d < D; d++) o[d] = wa * o[d] + wb * x[d];
                    L[i] = (float)l;
                }
            }
        }
    }
    free(qo), free(ko), free(P), free(ob), free(kp);
    return TPK_OK;
}

static tpk_status host_attn_block_bwd(tpk_ctx *ctx, float *dq, float *dkv, const void *dout,
                                      const void *out, const float *lse, const void *q,
                                      const void *kv, const tpk_attn_blk *b, tpk_dtype dt) {
    static const char *fn = "host.attn_block_bwd";
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->Sk", b->Sk)); /* the GEMMs take int sizes */
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->ldq", b->ldq));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->lddq", b->lddq));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->ldkv", b->ldkv));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "b->ldo", b->ldo));
    int64_t g0, Gl = tpk_attn_kv_heads(b->A, b->G, b->head0, b->Al, &g0), grp = b->A / b->G;
    int64_t Sq = b->Sq, Sk = b->Sk, D = b->D, AD = b->Al * D;
    if (!Sq || !Sk || !b->Al) return TPK_OK;
    size_t ss = (size_t)(ATTN_ROWS * Sk);
    float *o1, *o2, *o3, *o4;
    const float *Q = widen2d(q, Sq, AD, b->ldq, dt, &o1),
                *KV = widen2d(kv, Sk, 2 * Gl * D, b->ldkv, dt, &o2),
                *dO = widen2d(dout, Sq, AD, b->ldo, dt, &o3), *O = widen2d(out, Sq, AD, b->ldo, dt,
                                                                          &o4);
    float *P = (float *)malloc(sizeof(float) * ss), *dP = (float *)malloc(sizeof(float) * ss),
          *kp = (float *)malloc(sizeof(float) * (size_t)Sk), Dr[ATTN_ROWS];
    if (!Q || !KV || !dO || !O || !P || !dP || !kp) {
        free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(kp);
        return tpk__host_nomem(ctx, fn, sizeof(float) * (2 * ss + (size_t)(Sk * b->ldkv)));
    }
    int ldq = (int)b->ldq, lddq = (int)b->lddq, ldkv = (int)b->ldkv, ldo = (int)b->ldo;
    for (int64_t h = 0; h < b->Al; h++) {
        int64_t kvh = (b->head0 + h) / grp - g0;
        const float *Qh = Q + h * D, *K = KV + kvh * D, *V = K + Gl * D, *dOh = dO + h * D,
                    *Oh = O + h * D, *L = lse + h * b->ldl;
        float *dQ = dq + h * D, *dK = dkv + kvh * D, *dV = dK + Gl * D;
        for (int64_t i0 = 0; i0 < Sq; i0 += ATTN_ROWS) {
            int n = (int)(Sq - i0 < ATTN_ROWS ? Sq - i0 : ATTN_ROWS),
                keys = (int)blk_vis(b, i0 + n - 1); /* P, dP [n, keys] */
            if (keys <= 0) continue;
            /* P from the whole attention's lse; Dr_i = dO_i . O_i */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, b->scale,
                        Qh + i0 * ldq, ldq, K, ldkv, 0.0f, P, keys);
            for (int r = 0; r < n; r++) {
                int64_t i = i0 + r, v = L[i] == -INFINITY ? 0 : blk_vis(b, i);
                float *row = P + (size_t)r * (size_t)keys;
                if (v > 0) exp_row(row, v, L[i]);
                for (int64_t j = v; j < keys; j++) row[j] = 0.0f;
                double d = 0;
                for (int64_t e = 0; e < D; e++) d += (double)dOh[i * ldo + e] * Oh[i * ldo + e];
                Dr[r] = (float)d;
            }
            /* dP = dO V^T (w.r.t. the dropped P), dS = P (dP keep - Dr), P keep for dV */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, (int)D, 1.0f,
                        dOh + i0 * ldo, ldo, V, ldkv, 0.0f, dP, keys);
            for (int r = 0; r < n; r++) {
                blk_keep_row(kp, b, b->head0 + h, i0 + r, keys);
                for (int64_t j = 0; j < keys; j++) {
                    size_t k = (size_t)r * (size_t)keys + (size_t)j;
                    float pij = P[k];
                    dP[k] = pij * (dP[k] * kp[j] - Dr[r]);
                    P[k] = pij * kp[j];
                }
            }
            /* dV[0:keys] += (P keep)^T dO, dQ += scale dS K, dK[0:keys] += scale dS^T Q */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, 1.0f, P, keys,
                        dOh + i0 * ldo, ldo, 1.0f, dV, ldkv);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, (int)D, keys, b->scale, dP,
                        keys, K, ldkv, 1.0f, dQ + i0 * lddq, lddq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, (int)D, n, b->scale, dP,
                        keys, Qh + i0 * ldq, ldq, 1.0f, dK, ldkv);
        }
    }
    free(o1), free(o2), free(o3), free(o4), free(P), free(dP), free(kp);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_attn_ops(tpk_ops *o) {
    o->attn_fwd = host_attn_fwd;
    o->attn_bwd = host_attn_bwd;
    o->attn_block_fwd = host_attn_block_fwd;
    o->attn_block_bwd = host_attn_block_bwd;
}
