/* tests/test_ops_norm.c — the host backend's layernorm (kernels/host/norm.c) forward and backward
 * against a double reference and finite differences, with accumulation; the residual-layernorm
 * forward the front end composes. Random inputs, outputs poisoned with NaN. Runs on one rank.
 * (RMSNorm is tested with the other Llama ops, tests/test_ops_rope_swiglu.c.) */
#include "ops_test.h"

/* ---- layernorm ----------------------------------------------------------------------------- */

/* y = (x - mean) rstd w + b per row, in double (two-pass variance, biased) */
static void ln_ref_fwd(const float *x, const float *w, const float *b, int64_t rows, int64_t cols,
                       double eps, double *y, double *mean, double *rstd) {
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols;
        double s = 0, v = 0;
        for (int64_t j = 0; j < cols; j++) s += xr[j];
        double m = s / (double)cols;
        for (int64_t j = 0; j < cols; j++) v += ((double)xr[j] - m) * ((double)xr[j] - m);
        double r = 1.0 / sqrt(v / (double)cols + eps);
        for (int64_t j = 0; j < cols; j++) y[i * cols + j] = ((double)xr[j] - m) * r * w[j] + b[j];
        mean[i] = m, rstd[i] = r;
    }
}
/* Backward through the explicit Jacobian d xh_j / d x_k = rstd (delta_jk - 1/n - xh_j xh_k / n):
 * dx_k = sum_j dy_j w_j d xh_j / d x_k; dw_j = sum_i dy xh, db_j = sum_i dy (set, not added). */
static void ln_ref_bwd(const float *x, const float *w, const float *dy, int64_t rows, int64_t cols,
                       double eps, double *dx, double *dw, double *db) {
    double *xh = dbuf((size_t)cols);
    for (int64_t j = 0; j < cols; j++) dw[j] = 0, db[j] = 0;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols, *g = dy + i * cols;
        double s = 0, v = 0, n = (double)cols;
        for (int64_t j = 0; j < cols; j++) s += xr[j];
        double m = s / n;
        for (int64_t j = 0; j < cols; j++) v += ((double)xr[j] - m) * ((double)xr[j] - m);
        double r = 1.0 / sqrt(v / n + eps);
        for (int64_t j = 0; j < cols; j++) xh[j] = ((double)xr[j] - m) * r;
        for (int64_t k = 0; k < cols; k++) {
            double acc = 0;
            for (int64_t j = 0; j < cols; j++)
                acc +=
                    (double)g[j] * w[j] * r * ((j == k ? 1.0 : 0.0) - 1.0 / n - xh[j] * xh[k] / n);
            dx[i * cols + k] = acc;
        }
        for (int64_t j = 0; j < cols; j++) dw[j] += (double)g[j] * xh[j], db[j] += g[j];
    }
    free(xh);
}

/* L = sum y R in double, y from the f32 op */
static double ln_loss(const float *x, const float *w, const float *b, const float *R, int64_t rows,
                      int64_t cols, float eps, float *y, float *mean, float *rstd) {
    size_t n = (size_t)(rows * cols);
    test_poison(y, n), test_poison(mean, (size_t)rows), test_poison(rstd, (size_t)rows);
    CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, y, mean, rstd, x, w, b, rows, cols, eps, TPK_F32));
    double L = 0;
    for (size_t k = 0; k < n; k++) L += (double)y[k] * R[k];
    return L;
}

/* central differences of ln_loss over every entry of v (x, w or b; perturbed in place, restored) */
static void ln_fd(float *v, size_t nv, double h, float *fd, const float *x, const float *w,
                  const float *b, const float *R, int64_t rows, int64_t cols, float eps, float *y,
                  float *mean, float *rstd) {
    for (size_t k = 0; k < nv; k++) {
        float save = v[k], xp, xm;
        double step = fd_step(save, h, &xp, &xm);
        v[k] = xp;
        double Lp = ln_loss(x, w, b, R, rows, cols, eps, y, mean, rstd);
        v[k] = xm;
        double Lm = ln_loss(x, w, b, R, rows, cols, eps, y, mean, rstd);
        v[k] = save;
        fd[k] = (float)((Lp - Lm) / step);
    }
}

static void test_layernorm(void) {
    const float eps = 1e-5f;
    /* rows, cols, offset added to x (stability of the variance) */
    const int64_t shapes[][3] = {{5, 7, 0}, {3, 64, 10}, {2, 1, 0}, {6, 33, -3}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int64_t rows = shapes[sh][0], cols = shapes[sh][1];
        const size_t n = (size_t)(rows * cols), nc = (size_t)cols, nr = (size_t)rows;
        TEST_CASE(
            "layers layernorm f32 rows %lld cols %lld: reference, finite differences, accumulation",
            (long long)rows, (long long)cols) {
            float *x = fbuf(n), *w = fbuf(nc), *b = fbuf(nc), *R = fbuf(n), *y = fbuf(n),
                  *mean = fbuf(nr), *rstd = fbuf(nr);
            float *dx = fbuf(n), *dw = fbuf(nc), *db = fbuf(nc), *dx0 = fbuf(n), *fx = fbuf(n),
                  *fw = fbuf(nc), *fb = fbuf(nc);
            float *wy = fbuf(n), *wm = fbuf(nr), *wr = fbuf(nr), *wdx = fbuf(n), *wdw = fbuf(nc),
                  *wdb = fbuf(nc);
            double *ry = dbuf(n), *rm = dbuf(nr), *rr = dbuf(nr), *rdx = dbuf(n), *rdw = dbuf(nc),
                   *rdb = dbuf(nc);
            test_randn(x, n, 800 + sh, 1.5f);
            for (size_t k = 0; k < n; k++) x[k] += (float)shapes[sh][2];
            test_randn(w, nc, 810 + sh, 0.5f);
            for (size_t k = 0; k < nc; k++) w[k] += 1.0f;
            test_randn(b, nc, 820 + sh, 0.5f);
            test_randn(R, n, 830 + sh, 1.0f);

            /* forward */
            ln_ref_fwd(x, w, b, rows, cols, eps, ry, rm, rr);
            d2f(wy, ry, n), d2f(wm, rm, nr), d2f(wr, rr, nr);
            test_poison(y, n), test_poison(mean, nr), test_poison(rstd, nr);
            CHECK_OK(&ctx,
                     tpk_op_layernorm_fwd(&ctx, y, mean, rstd, x, w, b, rows, cols, eps, TPK_F32));
            CHECK_CLOSE(y, wy, n, TOL_LN, "layernorm_fwd y");
            CHECK_CLOSE(mean, wm, nr, TOL_LN, "layernorm_fwd mean");
            CHECK_CLOSE(rstd, wr, nr, TOL_LN, "layernorm_fwd rstd");

            /* backward, dy = R: dx poisoned, dw = db = 0 */
            ln_ref_bwd(x, w, R, rows, cols, eps, rdx, rdw, rdb);
            d2f(wdx, rdx, n), d2f(wdw, rdw, nc), d2f(wdb, rdb, nc);
            test_poison(dx, n);
            memset(dw, 0, nc * sizeof(float)), memset(db, 0, nc * sizeof(float));
            CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, dx, dw, db, R, x, w, mean, rstd, rows, cols,
                                                TPK_F32, false));
            CHECK_CLOSE(dx, wdx, n, TOL_LN, "layernorm_bwd dx vs analytic");
            CHECK_CLOSE(dw, wdw, nc, TOL_LN, "layernorm_bwd dw vs analytic");
            CHECK_CLOSE(db, wdb, nc, TOL_LN, "layernorm_bwd db vs analytic");

            /* finite differences of L = sum y R over every entry of x, w, b */
            float *ty = fbuf(n), *tm = fbuf(nr), *tr = fbuf(nr);
            ln_fd(x, n, 3e-3, fx, x, w, b, R, rows, cols, eps, ty, tm, tr);
            ln_fd(w, nc, 1e-2, fw, x, w, b, R, rows, cols, eps, ty, tm, tr);
            ln_fd(b, nc, 1e-2, fb, x, w, b, R, rows, cols, eps, ty, tm, tr);
            free(ty), free(tm), free(tr);
            if (cols > 1) CHECK_CLOSE(dx, fx, n, TOL_FD, "layernorm_bwd dx vs finite differences");
            else { /* one column: y = b, so the true dx (and the FD) are exactly 0 */
                size_t nz = 0;
                for (size_t k = 0; k < n; k++) nz += dx[k] != 0.0f || fx[k] != 0.0f;
                CHECK(nz == 0, "cols = 1: %zu nonzero dx or FD entries", nz);
            }
            CHECK_CLOSE(dw, fw, nc, TOL_FD, "layernorm_bwd dw vs finite differences");
            CHECK_CLOSE(db, fb, nc, TOL_FD, "layernorm_bwd db vs finite differences");

            /* accumulate_dx adds into dx; dw and db always accumulate: a second call doubles
             * them */
            test_randn(dx0, n, 840 + sh, 1.0f);
            memcpy(dx, dx0, n * sizeof(float));
            CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, dx, dw, db, R, x, w, mean, rstd, rows, cols,
                                                TPK_F32, true));
            for (size_t k = 0; k < n; k++) wdx[k] = (float)(dx0[k] + rdx[k]);
            for (size_t k = 0; k < nc; k++)
                wdw[k] = (float)(2 * rdw[k]), wdb[k] = (float)(2 * rdb[k]);
            CHECK_CLOSE(dx, wdx, n, TOL_LN, "layernorm_bwd accumulate_dx: dx0 + dx");
            CHECK_CLOSE(dw, wdw, nc, TOL_LN, "layernorm_bwd second call: dw doubled");
            CHECK_CLOSE(db, wdb, nc, TOL_LN, "layernorm_bwd second call: db doubled");

            /* dw, db starting from nonzero values */
            test_randn(dw, nc, 850 + sh, 1.0f), test_randn(db, nc, 851 + sh, 1.0f);
            for (size_t k = 0; k < nc; k++)
                wdw[k] = (float)(dw[k] + rdw[k]), wdb[k] = (float)(db[k] + rdb[k]);
            test_poison(dx, n);
            CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, dx, dw, db, R, x, w, mean, rstd, rows, cols,
                                                TPK_F32, false));
            CHECK_CLOSE(dw, wdw, nc, TOL_LN, "layernorm_bwd dw0 + dw");
            CHECK_CLOSE(db, wdb, nc, TOL_LN, "layernorm_bwd db0 + db");

            free(x), free(w), free(b), free(R), free(y), free(mean), free(rstd), free(dx), free(dw),
                free(db), free(dx0);
            free(fx), free(fw), free(fb), free(wy), free(wm), free(wr), free(wdx), free(wdw),
                free(wdb);
            free(ry), free(rm), free(rr), free(rdx), free(rdw), free(rdb);
        }
    }

    TEST_CASE(
        "layers layernorm bf16: y and dx within bf16, mean/rstd/dw/db from the rounded inputs") {
        const int64_t rows = 4, cols = 48;
        const size_t n = (size_t)(rows * cols), nc = (size_t)cols, nr = (size_t)rows;
        float *x = fbuf(n), *w = fbuf(nc), *b = fbuf(nc), *dy = fbuf(n), *dx0 = fbuf(n),
              *got = fbuf(n), *mean = fbuf(nr), *rstd = fbuf(nr), *dw = fbuf(nc), *db = fbuf(nc),
              *want = fbuf(n), *wm = fbuf(nr), *wr = fbuf(nr), *wdw = fbuf(nc), *wdb = fbuf(nc);
        double *ry = dbuf(n), *rm = dbuf(nr), *rr = dbuf(nr), *rdx = dbuf(n), *rdw = dbuf(nc),
               *rdb = dbuf(nc);
        uint16_t *hx = hbuf(n), *hy = hbuf(n), *hdy = hbuf(n), *hdx = hbuf(n);
        test_randn(x, n, 860, 2.0f), test_randn(w, nc, 861, 0.3f), test_randn(b, nc, 862, 0.3f);
        test_randn(dy, n, 863, 1.0f), test_randn(dx0, n, 864, 1.0f);
        for (size_t k = 0; k < nc; k++) w[k] += 1.0f;
        round_bf16(x, n), round_bf16(dy, n), round_bf16(dx0, n);
        to_bf16(hx, x, n), to_bf16(hdy, dy, n);
        ln_ref_fwd(x, w, b, rows, cols, 1e-5, ry, rm, rr);
        poison_bf16(hy, n), test_poison(mean, nr), test_poison(rstd, nr);
        CHECK_OK(&ctx,
                 tpk_op_layernorm_fwd(&ctx, hy, mean, rstd, hx, w, b, rows, cols, 1e-5f, TPK_BF16));
        from_bf16(got, hy, n), d2f(want, ry, n), d2f(wm, rm, nr), d2f(wr, rr, nr);
        CHECK_CLOSE(got, want, n, TOL_BF16, "layernorm_fwd bf16 y");
        CHECK_CLOSE(mean, wm, nr, TOL_LN, "layernorm_fwd bf16 mean");
        CHECK_CLOSE(rstd, wr, nr, TOL_LN, "layernorm_fwd bf16 rstd");

        ln_ref_bwd(x, w, dy, rows, cols, 1e-5, rdx, rdw, rdb);
        poison_bf16(hdx, n);
        memset(dw, 0, nc * sizeof(float)), memset(db, 0, nc * sizeof(float));
        CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, hdx, dw, db, hdy, hx, w, mean, rstd, rows, cols,
                                            TPK_BF16, false));
        from_bf16(got, hdx, n), d2f(want, rdx, n), d2f(wdw, rdw, nc), d2f(wdb, rdb, nc);
        CHECK_CLOSE(got, want, n, TOL_BF16, "layernorm_bwd bf16 dx");
        CHECK_CLOSE(dw, wdw, nc, TOL_LN, "layernorm_bwd bf16 dw");
        CHECK_CLOSE(db, wdb, nc, TOL_LN, "layernorm_bwd bf16 db");
        to_bf16(hdx, dx0, n);
        CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, hdx, dw, db, hdy, hx, w, mean, rstd, rows, cols,
                                            TPK_BF16, true));
        from_bf16(got, hdx, n);
        for (size_t k = 0; k < n; k++) want[k] = (float)(dx0[k] + rdx[k]);
        CHECK_CLOSE(got, want, n, TOL_BF16, "layernorm_bwd bf16 accumulate_dx");

        /* rows = 0: nothing read or written */
        CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 1e-5f,
                                            TPK_F32));
        CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0,
                                            8, TPK_F32, false));
        free(x), free(w), free(b), free(dy), free(dx0), free(got), free(mean), free(rstd), free(dw),
            free(db), free(want);
        free(wm), free(wr), free(wdw), free(wdb), free(ry), free(rm), free(rr), free(rdx),
            free(rdw), free(rdb);
        free(hx), free(hy), free(hdy), free(hdx);
    }
}


/* residual_layernorm_fwd: x1 = x + r, then exactly layernorm_fwd of x1 (f32 and bf16, x1 aliasing
 * x) */
static void test_residual_layernorm(void) {
    TEST_CASE(
        "layers residual_layernorm_fwd equals the add then layernorm_fwd (f32, bf16, x1 aliasing "
        "x)") {
        enum { R = 7, C = 19 };
        float x[R * C], r[R * C], w[C], b[C], x1[R * C], y[R * C], m[R], rs[R], xr[R * C],
            yr[R * C], mr[R], rsr[R];
        test_randn(x, R * C, 80, 2.0f), test_randn(r, R * C, 81, 1.0f), test_randn(w, C, 82, 1.0f),
            test_randn(b, C, 83, 1.0f);
        for (int v = 0; v < 3; v++) {
            tpk_dtype dt = v == 1 ? TPK_BF16 : TPK_F32;
            uint16_t xh[R * C], rh[R * C], x1h[R * C], yh[R * C], xrh[R * C], yrh[R * C];
            for (int i = 0; i < R * C; i++)
                xh[i] = tpk_f32_to_bf16(x[i]), rh[i] = tpk_f32_to_bf16(r[i]);
            const void *xa = dt == TPK_BF16 ? (const void *)xh : x,
                       *ra = dt == TPK_BF16 ? (const void *)rh : r;
            void *x1a = dt == TPK_BF16 ? (void *)x1h : x1, *ya = dt == TPK_BF16 ? (void *)yh : y;
            void *xra = dt == TPK_BF16 ? (void *)xrh : xr, *yra = dt == TPK_BF16 ? (void *)yrh : yr;
            test_poison(x1, R * C), test_poison(y, R * C), test_poison(m, R), test_poison(rs, R);
            if (v == 2) memcpy(x1, x, sizeof x1), xa = x1; /* in place: x1 is x */
            CHECK_OK(&ctx, tpk_op_residual_layernorm_fwd(&ctx, x1a, ya, m, rs, xa, ra, w, b, R, C,
                                                         1e-5f, dt));
            /* the composition */
            CHECK_OK(&ctx, tpk_op_axpby(&ctx, xra, 1.0f, dt == TPK_BF16 ? (const void *)xh : x,
                                        0.0f, dt, R * C));
            CHECK_OK(&ctx, tpk_op_axpby(&ctx, xra, 1.0f, ra, 1.0f, dt, R * C));
            CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, yra, mr, rsr, xra, w, b, R, C, 1e-5f, dt));
            float g1[R * C], g2[R * C], g3[R * C], g4[R * C];
            for (int i = 0; i < R * C; i++) {
                g1[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(x1h[i]) : x1[i],
                g2[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(xrh[i]) : xr[i];
                g3[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(yh[i]) : y[i],
                g4[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(yrh[i]) : yr[i];
            }
            CHECK_CLOSE(g1, g2, R * C, 1e-7, "x1 = x + r");
            CHECK_CLOSE(g3, g4, R * C, 1e-6, "y = layernorm(x1)");
            CHECK_CLOSE(m, mr, R, 1e-6, "mean");
            CHECK_CLOSE(rs, rsr, R, 1e-6, "rstd");
        }
        CHECK_FAILS(
            &ctx,
            tpk_op_residual_layernorm_fwd(&ctx, NULL, y, m, rs, x, r, w, b, R, C, 1e-5f, TPK_F32),
            TPK_ERR_ARG, "x1: expected a buffer");
        CHECK_FAILS(
            &ctx,
            tpk_op_residual_layernorm_fwd(&ctx, x1, y, m, rs, x, NULL, w, b, R, C, 1e-5f, TPK_F32),
            TPK_ERR_ARG, "r: expected a buffer");
    }
}

OPS_TEST_MAIN(test_layernorm, test_residual_layernorm)
