/* kernels/host/gemm.c — the host backend's GEMMs through OpenBLAS (cblas_sgemm, row-major).
 *
 *   gemm      C = alpha op(A) op(B) + beta C: bf16 operands widened into f32 copies, C rounded
 *   back;
 *             beta = 0 ignores C (NaN in C does not leak); k = 0 or alpha = 0 gives C = beta C
 *   gemm_acc  gemm into an f32 C whatever dt: bf16 A, B widened, C multiplied into in place
 *   gemm_grouped  G GEMMs on row groups of x and y, a matrix W_g each (a mixture of experts'
 *             experts): one gemm per group in a loop, a group of 0 rows skipped (or W_g = beta W_g
 *             under wgrad)
 *   gemm_fp8  gemm on FP8 codes (E4M3, E5M2) decoded exactly into f32: FP8 tensor cores' inputs
 *             with f32 sums; C f32 or bf16
 *   linear_fwd  u = x W^T (+ bias), y = u or (act) pre = u, y = act(u): the GEMM here, the bias
 *             and the activation the table's own entries, as the composition of
 *             tpk/runtime/backend.h does it (the same numbers) without its detour
 * linear_bwd_act is left to the front end, which composes it from gemm, the activations and
 * bias_grad (tpk/runtime/op.h). OpenBLAS takes int sizes: larger ones are refused, named. */
#include <stdlib.h>

#include <cblas.h>

#include "host_private.h"

/* ---- gemm ------------------------------------------------------------------------------------ */

/* dst[rows, cols] (contiguous f32) = src[rows, cols] with leading dimension ld. */
TPK__HOST_INLINE void widen_loop(tpk_dtype dt, float *dst, const void *src, int64_t lds,
                                 int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[i * cols + j] = tpk__ld(src, dt, (size_t)(i * lds + j));
}
/* C = beta C over [m, n] with leading dimension ldc; beta = 0 writes zeros whatever C held. */
TPK__HOST_INLINE void scale_loop(tpk_dtype dt, void *c, int64_t ldc, int64_t m, int64_t n,
                                 float beta) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            size_t at = (size_t)(i * ldc + j);
            tpk__st(c, dt, at, beta == 0.0f ? 0.0f : beta * tpk__ld(c, dt, at));
        }
}

/* C = alpha op(A) op(B) + beta C with A, B in dt and C in cdt (dt, or f32 for gemm_acc). */
static tpk_status gemm_run(tpk_ctx *ctx, const char *fn, bool ta, bool tb, int64_t m, int64_t n,
                           int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                           int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt,
                           tpk_dtype cdt) {
    /* stored shapes: A is [m, k] or [k, m] (ta), B is [k, n] or [n, k] (tb), C is [m, n] */
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    TPK_TRY(tpk__host_blas_int(ctx, fn, "m", m));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "n", n));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "k", k));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "lda", lda));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "ldb", ldb));
    TPK_TRY(tpk__host_blas_int(ctx, fn, "ldc", ldc));
    /* an operand may be NULL only when the product does not touch it (an empty C, or k = 0) */
    if (m == 0 || n == 0) return TPK_OK;
    if (k == 0 || alpha == 0.0f) { /* no product: C = beta C (and no reads of A, B) */
        if (beta != 1.0f) TPK__BY_DTYPE(cdt, scale_loop, c, ldc, m, n, beta);
        return TPK_OK;
    }
    enum CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    if (dt == TPK_F32) {
        cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, alpha, (const float *)a,
                    (int)lda, (const float *)b, (int)ldb, beta, (float *)c, (int)ldc);
        return TPK_OK;
    }
    /* bf16: widen A, B into packed f32; an f32 C is multiplied into in place, a bf16 C is widened
     * (when read), multiplied into and rounded back */
    bool wide_c = cdt == TPK_BF16;
    size_t na = (size_t)a_rows * (size_t)a_cols, nb = (size_t)b_rows * (size_t)b_cols,
           nc = wide_c ? (size_t)m * (size_t)n : 1;
    float *fa = malloc(na * sizeof(float)), *fb = malloc(nb * sizeof(float)),
          *fc = wide_c ? malloc(nc * sizeof(float)) : (float *)c;
    if (!fa || !fb || !fc) {
        size_t want = !fa ? na : !fb ? nb : nc;
        free(fa), free(fb);
        if (wide_c) free(fc);
        return tpk__host_nomem(ctx, fn, want * sizeof(float));
    }
    widen_loop(TPK_BF16, fa, a, lda, a_rows, a_cols);
    widen_loop(TPK_BF16, fb, b, ldb, b_rows, b_cols);
    if (wide_c && beta != 0.0f) widen_loop(TPK_BF16, fc, c, ldc, m, n);
    cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, alpha, fa, (int)a_cols, fb,
                (int)b_cols, beta, fc, wide_c ? (int)n : (int)ldc);
    if (wide_c) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                tpk__st(c, TPK_BF16, (size_t)(i * ldc + j), fc[i * n + j]);
        free(fc);
    }
    free(fa), free(fb);
    return TPK_OK;
}
static tpk_status host_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                            float beta, void *c, int64_t ldc, tpk_dtype dt) {
    return gemm_run(ctx, "host.gemm", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, dt);
}
static tpk_status host_gemm_acc(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                                float beta, float *c, int64_t ldc, tpk_dtype dt) {
    return gemm_run(ctx, "host.gemm_acc", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt,
                    TPK_F32);
}

/* ---- gemm_grouped ---------------------------------------------------------------------------- */

/* Group g's block of x and y (rows [off_g, off_g + rows[g])) through gemm_run, one call each:
 * y_g = alpha x_g op(W_g) + beta y_g, or (wgrad) op(W_g) = alpha x_g^T y_g + beta op(W_g), W_g in
 * w_dt (f32: an f32 gradient) — W_g^T = y_g^T x_g when tw. A group of 0 rows: skipped, or under
 * wgrad W_g = beta W_g (gemm_run's k = 0). */
static tpk_status host_gemm_grouped(tpk_ctx *ctx, bool wgrad, bool tw, int64_t groups,
                                    const int64_t *rows, int64_t n, int64_t k, float alpha,
                                    const void *x, int64_t ldx, void *const *w, int64_t ldw,
                                    tpk_dtype w_dt, float beta, void *y, int64_t ldy,
                                    tpk_dtype dt) {
    static const char *fn = "host.gemm_grouped";
    size_t es = tpk_dtype_size(dt);
    for (int64_t g = 0, off = 0; g < groups; off += rows[g++]) {
        int64_t r = rows[g];
        const char *xg = (const char *)x + (size_t)(off * ldx) * es;
        char *yg = (char *)y + (size_t)(off * ldy) * es;
        if (!wgrad) {
            if (r) TPK_TRY(gemm_run(ctx, fn, false, tw, r, n, k, alpha, xg, ldx, w[g], ldw, beta,
                                    yg, ldy, dt, dt));
        } else if (!tw) { /* W_g [k, n] = alpha x_g^T y_g + beta W_g */
            TPK_TRY(gemm_run(ctx, fn, true, false, k, n, r, alpha, xg, ldx, yg, ldy, beta, w[g],
                             ldw, dt, w_dt));
        } else { /* W_g [n, k] = alpha y_g^T x_g + beta W_g */
            TPK_TRY(gemm_run(ctx, fn, true, false, n, k, r, alpha, yg, ldy, xg, ldx, beta, w[g],
                             ldw, dt, w_dt));
        }
    }
    return TPK_OK;
}

/* ---- gemm_fp8 -------------------------------------------------------------------------------- */

/* dst[rows, cols] (contiguous f32) = the codes src[rows, cols] (leading dimension ld) decoded
 * through a table of the format's 256 values: exact */
static void fp8_widen(float *dst, const uint8_t *src, int64_t ld, int64_t rows, int64_t cols,
                      tpk_fp8_fmt f) {
    float tab[256];
    for (int c = 0; c < 256; c++) tab[c] = tpk_fp8_to_f32((uint8_t)c, f);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) dst[i * cols + j] = tab[src[i * ld + j]];
}
/* C = alpha op(A) op(B) + beta C on FP8 codes: both decoded exactly into f32, cblas_sgemm (f32
 * products and sums), C in c_dt (a bf16 C widened, multiplied into and rounded back) */
static tpk_status host_gemm_fp8(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const uint8_t *a, tpk_fp8_fmt fa, int64_t lda,
                                const uint8_t *b, tpk_fp8_fmt fb, int64_t ldb, float beta, void *c,
                                int64_t ldc, tpk_dtype c_dt) {
    static const char *fn = "host.gemm_fp8";
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (m == 0 || n == 0 || k == 0 || alpha == 0.0f)
        return gemm_run(ctx, fn, ta, tb, m, n, k, alpha, NULL, lda, NULL, ldb, beta, c, ldc, c_dt,
                        c_dt);
    size_t na = (size_t)a_rows * (size_t)a_cols, nb = (size_t)b_rows * (size_t)b_cols;
    float *wa = malloc(na * sizeof(float)), *wb = malloc(nb * sizeof(float));
    if (!wa || !wb) {
        free(wa), free(wb);
        return tpk__host_nomem(ctx, fn, (wa ? nb : na) * sizeof(float));
    }
    fp8_widen(wa, a, lda, a_rows, a_cols, fa);
    fp8_widen(wb, b, ldb, b_rows, b_cols, fb);
    tpk_status s = TPK_OK;
    if (c_dt == TPK_F32) {
        s = gemm_run(ctx, fn, ta, tb, m, n, k, alpha, wa, a_cols, wb, b_cols, beta, c, ldc, TPK_F32,
                     TPK_F32);
    } else {
        float *fc = malloc((size_t)m * (size_t)n * sizeof(float));
        if (!fc) {
            s = tpk__host_nomem(ctx, fn, (size_t)m * (size_t)n * sizeof(float));
        } else {
            if (beta != 0.0f) widen_loop(TPK_BF16, fc, c, ldc, m, n);
            s = gemm_run(ctx, fn, ta, tb, m, n, k, alpha, wa, a_cols, wb, b_cols, beta, fc, n,
                         TPK_F32, TPK_F32);
            for (int64_t i = 0; s == TPK_OK && i < m; i++)
                for (int64_t j = 0; j < n; j++)
                    tpk__st(c, TPK_BF16, (size_t)(i * ldc + j), fc[i * n + j]);
            free(fc);
        }
    }
    free(wa), free(wb);
    return s;
}

/* this file's entries of the host table (table.c) */
/* ---- linear_fwd ------------------------------------------------------------------------------ */

static tpk_status host_linear_fwd(tpk_ctx *ctx, void *y, void *pre, const void *x, const void *w,
                                  const void *bias, int64_t T, int64_t n, int64_t k, tpk_act act,
                                  tpk_dtype dt) {
    void *u = act != TPK_ACT_NONE ? pre : y;
    TPK_TRY(host_gemm(ctx, false, true, T, n, k, 1.0f, x, k, w, k, 0.0f, u, n, dt));
    if (bias) TPK_TRY(ctx->ops->bias_add(ctx, u, bias, T, n, dt));
    return act != TPK_ACT_NONE ? ctx->ops->act_fwd(ctx, act, y, u, dt, (size_t)(T * n)) : TPK_OK;
}

void tpk__host_gemm_ops(tpk_ops *o) {
    o->gemm = host_gemm;
    o->gemm_acc = host_gemm_acc;
    o->linear_fwd = host_linear_fwd;
    o->gemm_fp8 = host_gemm_fp8;
    o->gemm_grouped = host_gemm_grouped;
}
