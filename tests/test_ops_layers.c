/* tests/test_ops_layers.c — the layer ops of the host backend (kernels/host/)
 * against references written here in double precision (naive loops, never the op under test).
 *
 * Every op runs on random inputs (test_randn) into outputs poisoned with NaN, so an element the
 * kernel forgets to write fails. Covered: dropout (identity at p = 0, the mask formula with
 * row/col offsets, sub-blocks equal to the full call bitwise, the drop rate, aliasing, bf16);
 * layernorm forward and backward (double reference, finite differences, accumulation); the
 * embedding lookup and its scatter-add (repeated and out-of-range ids, sharded tables, bf16);
 * the cross-entropy pieces over three vocabulary shards (loss with and without label smoothing
 * and an ignored target, gradient against the reference and finite differences, aliasing, bf16);
 * causal attention (forward and backward, with and without dropout, against the reference and
 * finite differences; a head's result does not depend on the other heads' global indices; bf16);
 * and bad arguments, which must fail naming the argument. Runs on one rank.
 *
 * Tolerances (relative to the largest reference magnitude, test_relerr) are macros so that
 * building with e.g. -DTOL_F32=0 prints the errors actually reached. */
#include "test.h"

#ifndef TOL_F32
#define TOL_F32 1e-5 /* f32 op vs double reference: dropout, embedding, cross-entropy */
#endif
#ifndef TOL_LN
#define TOL_LN 1e-5 /* layernorm f32 vs double reference */
#endif
#ifndef TOL_ATTN
#define TOL_ATTN 1e-5 /* attention f32 vs double reference */
#endif
#ifndef TOL_FD
#define TOL_FD 1e-2 /* gradients vs central finite differences of a double loss of f32 outputs */
#endif
#ifndef TOL_BF16
#define TOL_BF16 1e-2 /* bf16 storage vs double reference on the rounded inputs */
#endif

static tpk_ctx ctx;

/* ---- helpers ------------------------------------------------------------------------------- */

static float *fbuf(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }
static double *dbuf(size_t n) { return malloc((n ? n : 1) * sizeof(double)); }
static uint16_t *hbuf(size_t n) { return malloc((n ? n : 1) * sizeof(uint16_t)); }

static void to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tpk_f32_to_bf16(src[i]);
}
static void from_bf16(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tpk_bf16_to_f32(src[i]);
}
/* x = the bf16 value nearest x, so a reference sees what a bf16 kernel reads */
static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(x[i]));
}
static void poison_bf16(uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = 0x7FC1; /* a bf16 NaN */
}
static void d2f(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}
/* elements whose bit patterns differ */
static size_t bitdiff(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, sizeof(float)) != 0;
    return d;
}
static size_t count_nan(const float *a, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += isnan(a[i]) != 0;
    return c;
}
/* (float)(x + h) and (float)(x - h), and the step actually taken between them */
static double fd_step(float x, double h, float *xp, float *xm) {
    *xp = (float)((double)x + h), *xm = (float)((double)x - h);
    return (double)*xp - (double)*xm;
}

/* ---- dropout ------------------------------------------------------------------------------- */

static void test_dropout(void) {
    TEST_CASE("the dropout draw: Philox4x32-10 known answers; dropout_u(i) = output i %% 4 of call i / 4; parameter draws unchanged") {
        /* Random123's known-answer vectors (counter, key) -> output: key = seed, counter = (index, stream) */
        static const uint64_t kat[3][3] = {{0, 0, 0}, {~0ull, ~0ull, ~0ull}, {0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull}};
        static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                            {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                            {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
        for (int k = 0; k < 3; k++) {
            tpk_u32x4 r = tpk_philox(kat[k][0], kat[k][1], kat[k][2]);
            CHECK(!memcmp(r.v, want[k], sizeof r.v), "philox known answer %d: %08x %08x %08x %08x", k, r.v[0], r.v[1], r.v[2], r.v[3]);
        }
        size_t bad = 0, bad4 = 0, badp = 0;
        const uint64_t seed = 0x1234567890abcull, stream = 0xfeedull << 40;
        for (uint64_t i = 0; i < 4096; i++) {
            uint64_t idx = i < 2048 ? i : (1ull << 40) - 2048 + i; /* the low and a high index range (64-bit counters) */
            bad += tpk_dropout_u(seed, stream, idx) != test_dropout_u(seed, stream, idx);
            bad4 += tpk_rng_uniform4(seed, stream, idx >> 2).v[idx & 3] != test_dropout_u(seed, stream, idx);
            /* parameters and rng_2d keep one call per element, output 0 */
            badp += tpk_rng_uniform(seed, stream, idx) != (float)(tpk_philox(seed, stream, idx).v[0] >> 8) / 16777216.0f;
        }
        CHECK(bad == 0 && bad4 == 0, "%zu tpk_dropout_u, %zu tpk_rng_uniform4 draws differ from output i %% 4 of call i / 4", bad, bad4);
        CHECK(badp == 0, "%zu tpk_rng_uniform draws are not output 0 of call i", badp);
    }
    TEST_CASE("layers dropout f32: p = 0 identity; p = 0.3 mask formula, values, drop rate, sub-blocks, aliasing") {
        const int64_t rows = 250, cols = 400; /* 1e5 elements */
        const size_t n = (size_t)(rows * cols);
        const uint64_t seed = 1234, stream = 99;
        const float p = 0.3f;
        float *x = fbuf(n), *y = fbuf(n), *want = fbuf(n), *z = fbuf(n);
        test_randn(x, n, 700, 1.0f);
        size_t xzero = 0;
        for (size_t i = 0; i < n; i++) xzero += x[i] == 0.0f;
        CHECK(xzero == 0, "test premise: x has %zu exact zeros", xzero);

        /* p = 0: the identity, bitwise */
        test_poison(y, n);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, y, x, rows, cols, cols, 0, 0, 0.0f, seed, stream, TPK_F32));
        CHECK(bitdiff(y, x, n) == 0, "p = 0: %zu elements differ from x", bitdiff(y, x, n));

        /* p = 0.3: y = 0 where dropout_u(index) < p, else x / (1 - p) */
        test_poison(y, n);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, y, x, rows, cols, cols, 0, 0, p, seed, stream, TPK_F32));
        size_t dropped = 0, badmask = 0, badval = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                size_t k = (size_t)(i * cols + j);
                bool keep = test_dropout_u(seed, stream, (uint64_t)(i * cols + j)) >= p;
                double w = keep ? (double)x[k] / (1.0 - (double)p) : 0.0;
                want[k] = (float)w;
                dropped += y[k] == 0.0f;
                badmask += (y[k] == 0.0f) == keep || isnan(y[k]);
                badval += keep ? !(fabs(y[k] - w) <= 1e-6 * fabs(w)) : !(y[k] == 0.0f);
            }
        CHECK(badmask == 0, "p = 0.3: %zu elements where (y == 0) is not the mask uniform < p", badmask);
        CHECK(badval == 0, "p = 0.3: %zu elements neither 0 nor x / (1 - p)", badval);
        CHECK_CLOSE(y, want, n, TOL_F32, "dropout p = 0.3 vs x keep / (1 - p)");
        double frac = (double)dropped / (double)n;
        CHECK(fabs(frac - p) < 0.01, "dropped fraction %.4f, expected %.2f +- 0.01", frac, (double)p);

        /* shards: block [r0, r0 + sr) x [c0, c0 + sc) with row0/col0 offsets = that block of the full call */
        const int64_t blocks[][4] = {{0, 0, 250, 400}, {17, 133, 5, 100}, {0, 399, 250, 1}, {249, 0, 1, 400}, {101, 257, 33, 143}};
        for (int bi = 0; bi < 5; bi++) {
            int64_t r0 = blocks[bi][0], c0 = blocks[bi][1], sr = blocks[bi][2], sc = blocks[bi][3];
            size_t nb = (size_t)(sr * sc);
            float *xb = fbuf(nb), *yb = fbuf(nb), *ref = fbuf(nb);
            for (int64_t i = 0; i < sr; i++)
                for (int64_t j = 0; j < sc; j++) {
                    xb[i * sc + j] = x[(r0 + i) * cols + c0 + j];
                    ref[i * sc + j] = y[(r0 + i) * cols + c0 + j];
                }
            test_poison(yb, nb);
            CHECK_OK(&ctx, tpk_op_dropout(&ctx, yb, xb, sr, sc, cols, r0, c0, p, seed, stream, TPK_F32));
            CHECK(bitdiff(yb, ref, nb) == 0, "block rows %lld+%lld cols %lld+%lld: %zu elements differ from the full call",
                  (long long)r0, (long long)sr, (long long)c0, (long long)sc, bitdiff(yb, ref, nb));
            free(xb), free(yb), free(ref);
        }

        /* a block of a wider tensor: index (row0 + i) * gcols + col0 + j, checked directly */
        {
            const int64_t br = 7, bc = 9, gcols = 1000, row0 = 3, col0 = 500;
            float yb[7 * 9], wb[7 * 9];
            test_poison(yb, 63);
            CHECK_OK(&ctx, tpk_op_dropout(&ctx, yb, x, br, bc, gcols, row0, col0, p, seed, stream, TPK_F32));
            for (int64_t i = 0; i < br; i++)
                for (int64_t j = 0; j < bc; j++) {
                    bool keep = test_dropout_u(seed, stream, (uint64_t)((row0 + i) * gcols + col0 + j)) >= p;
                    wb[i * bc + j] = keep ? (float)((double)x[i * bc + j] / (1.0 - (double)p)) : 0.0f;
                }
            CHECK_CLOSE(yb, wb, 63, TOL_F32, "dropout block rows 3+7, cols 500+9 of gcols 1000");
            size_t zw = 0, zg = 0;
            for (int k = 0; k < 63; k++) zw += wb[k] == 0.0f, zg += yb[k] == 0.0f;
            CHECK(zw == zg, "block: %zu zeros, reference %zu", zg, zw);
        }

        /* another stream is another mask */
        test_poison(z, n);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, z, x, rows, cols, cols, 0, 0, p, seed, stream + 1, TPK_F32));
        CHECK(bitdiff(z, y, n) > n / 10, "stream + 1 changed only %zu elements", bitdiff(z, y, n));

        /* y aliasing x */
        memcpy(z, x, n * sizeof(float));
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, z, z, rows, cols, cols, 0, 0, p, seed, stream, TPK_F32));
        CHECK(bitdiff(z, y, n) == 0, "in place (y == x): %zu elements differ from out of place", bitdiff(z, y, n));

        /* empty */
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, NULL, NULL, 0, 5, 5, 0, 0, p, seed, stream, TPK_F32));
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, NULL, NULL, 4, 0, 0, 0, 0, p, seed, stream, TPK_F32));
        free(x), free(y), free(want), free(z);
    }

    TEST_CASE("layers dropout bf16: mask, values within bf16, in place") {
        const int64_t rows = 37, cols = 53;
        const size_t n = (size_t)(rows * cols);
        const uint64_t seed = 77, stream = 3;
        const float p = 0.3f;
        float *x = fbuf(n), *got = fbuf(n), *want = fbuf(n);
        uint16_t *hx = hbuf(n), *hy = hbuf(n), *hz = hbuf(n);
        test_randn(x, n, 701, 2.0f);
        round_bf16(x, n);
        to_bf16(hx, x, n);
        poison_bf16(hy, n);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, hy, hx, rows, cols, cols + 5, 2, 4, p, seed, stream, TPK_BF16));
        from_bf16(got, hy, n);
        size_t badmask = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                size_t k = (size_t)(i * cols + j);
                bool keep = test_dropout_u(seed, stream, (uint64_t)((2 + i) * (cols + 5) + 4 + j)) >= p;
                want[k] = keep ? (float)((double)x[k] / (1.0 - (double)p)) : 0.0f;
                badmask += (got[k] == 0.0f) == keep;
            }
        CHECK(badmask == 0, "bf16: %zu elements where (y == 0) is not the mask", badmask);
        CHECK_CLOSE(got, want, n, TOL_BF16, "dropout bf16");
        memcpy(hz, hx, n * 2);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, hz, hz, rows, cols, cols + 5, 2, 4, p, seed, stream, TPK_BF16));
        CHECK(memcmp(hz, hy, n * 2) == 0, "bf16 in place differs from out of place");
        /* p = 0 in bf16: the identity, bitwise */
        poison_bf16(hy, n);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, hy, hx, rows, cols, cols, 0, 0, 0.0f, seed, stream, TPK_BF16));
        CHECK(memcmp(hx, hy, n * 2) == 0, "bf16 p = 0 is not the identity");
        free(x), free(got), free(want), free(hx), free(hy), free(hz);
    }

    TEST_CASE("layers dropout: bad arguments fail naming them") {
        float a[16] = {0}, b[16] = {0};
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, 1.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "p: expected 0 <= p < 1, got 1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, -0.1f, 1, 1, TPK_F32), TPK_ERR_ARG, "p: expected 0 <= p < 1, got -0.1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, NAN, 1, 1, TPK_F32), TPK_ERR_ARG, "p: expected 0 <= p < 1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 4, 0, 2, 0.5f, 1, 1, TPK_F32), TPK_ERR_ARG,
                    "gcols: expected >= col0 + cols = 5");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 2, 0, 0, 0.5f, 1, 1, TPK_F32), TPK_ERR_ARG,
                    "gcols: expected >= col0 + cols = 3");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, -1, 0, 0.5f, 1, 1, TPK_F32), TPK_ERR_ARG, "row0");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, -1, 0.5f, 1, 1, TPK_F32), TPK_ERR_ARG, "col0");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, -1, 3, 3, 0, 0, 0.5f, 1, 1, TPK_F32), TPK_ERR_ARG, "rows: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, NULL, 2, 3, 3, 0, 0, 0.5f, 1, 1, TPK_F32), TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, NULL, a, 2, 3, 3, 0, 0, 0.5f, 1, 1, TPK_F32), TPK_ERR_ARG, "y: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, 0.5f, 1, 1, TPK_I32), TPK_ERR_DTYPE, "tpk_op_dropout: dt:");
    }
}

/* ---- layernorm ----------------------------------------------------------------------------- */

/* y = (x - mean) rstd w + b per row, in double (two-pass variance, biased) */
static void ln_ref_fwd(const float *x, const float *w, const float *b, int64_t rows, int64_t cols, double eps, double *y,
                       double *mean, double *rstd) {
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
static void ln_ref_bwd(const float *x, const float *w, const float *dy, int64_t rows, int64_t cols, double eps, double *dx,
                       double *dw, double *db) {
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
            for (int64_t j = 0; j < cols; j++) acc += (double)g[j] * w[j] * r * ((j == k ? 1.0 : 0.0) - 1.0 / n - xh[j] * xh[k] / n);
            dx[i * cols + k] = acc;
        }
        for (int64_t j = 0; j < cols; j++) dw[j] += (double)g[j] * xh[j], db[j] += g[j];
    }
    free(xh);
}

/* L = sum y R in double, y from the f32 op */
static double ln_loss(const float *x, const float *w, const float *b, const float *R, int64_t rows, int64_t cols, float eps,
                      float *y, float *mean, float *rstd) {
    size_t n = (size_t)(rows * cols);
    test_poison(y, n), test_poison(mean, (size_t)rows), test_poison(rstd, (size_t)rows);
    CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, y, mean, rstd, x, w, b, rows, cols, eps, TPK_F32));
    double L = 0;
    for (size_t k = 0; k < n; k++) L += (double)y[k] * R[k];
    return L;
}

/* central differences of ln_loss over every entry of v (x, w or b; perturbed in place, restored) */
static void ln_fd(float *v, size_t nv, double h, float *fd, const float *x, const float *w, const float *b, const float *R,
                  int64_t rows, int64_t cols, float eps, float *y, float *mean, float *rstd) {
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
        TEST_CASE("layers layernorm f32 rows %lld cols %lld: reference, finite differences, accumulation", (long long)rows,
                  (long long)cols) {
            float *x = fbuf(n), *w = fbuf(nc), *b = fbuf(nc), *R = fbuf(n), *y = fbuf(n), *mean = fbuf(nr), *rstd = fbuf(nr);
            float *dx = fbuf(n), *dw = fbuf(nc), *db = fbuf(nc), *dx0 = fbuf(n), *fx = fbuf(n), *fw = fbuf(nc), *fb = fbuf(nc);
            float *wy = fbuf(n), *wm = fbuf(nr), *wr = fbuf(nr), *wdx = fbuf(n), *wdw = fbuf(nc), *wdb = fbuf(nc);
            double *ry = dbuf(n), *rm = dbuf(nr), *rr = dbuf(nr), *rdx = dbuf(n), *rdw = dbuf(nc), *rdb = dbuf(nc);
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
            CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, y, mean, rstd, x, w, b, rows, cols, eps, TPK_F32));
            CHECK_CLOSE(y, wy, n, TOL_LN, "layernorm_fwd y");
            CHECK_CLOSE(mean, wm, nr, TOL_LN, "layernorm_fwd mean");
            CHECK_CLOSE(rstd, wr, nr, TOL_LN, "layernorm_fwd rstd");

            /* backward, dy = R: dx poisoned, dw = db = 0 */
            ln_ref_bwd(x, w, R, rows, cols, eps, rdx, rdw, rdb);
            d2f(wdx, rdx, n), d2f(wdw, rdw, nc), d2f(wdb, rdb, nc);
            test_poison(dx, n);
            memset(dw, 0, nc * sizeof(float)), memset(db, 0, nc * sizeof(float));
            CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, dx, dw, db, R, x, w, mean, rstd, rows, cols, TPK_F32, false));
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

            /* accumulate_dx adds into dx; dw and db always accumulate: a second call doubles them */
            test_randn(dx0, n, 840 + sh, 1.0f);
            memcpy(dx, dx0, n * sizeof(float));
            CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, dx, dw, db, R, x, w, mean, rstd, rows, cols, TPK_F32, true));
            for (size_t k = 0; k < n; k++) wdx[k] = (float)(dx0[k] + rdx[k]);
            for (size_t k = 0; k < nc; k++) wdw[k] = (float)(2 * rdw[k]), wdb[k] = (float)(2 * rdb[k]);
            CHECK_CLOSE(dx, wdx, n, TOL_LN, "layernorm_bwd accumulate_dx: dx0 + dx");
            CHECK_CLOSE(dw, wdw, nc, TOL_LN, "layernorm_bwd second call: dw doubled");
            CHECK_CLOSE(db, wdb, nc, TOL_LN, "layernorm_bwd second call: db doubled");

            /* dw, db starting from nonzero values */
            test_randn(dw, nc, 850 + sh, 1.0f), test_randn(db, nc, 851 + sh, 1.0f);
            for (size_t k = 0; k < nc; k++) wdw[k] = (float)(dw[k] + rdw[k]), wdb[k] = (float)(db[k] + rdb[k]);
            test_poison(dx, n);
            CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, dx, dw, db, R, x, w, mean, rstd, rows, cols, TPK_F32, false));
            CHECK_CLOSE(dw, wdw, nc, TOL_LN, "layernorm_bwd dw0 + dw");
            CHECK_CLOSE(db, wdb, nc, TOL_LN, "layernorm_bwd db0 + db");

            free(x), free(w), free(b), free(R), free(y), free(mean), free(rstd), free(dx), free(dw), free(db), free(dx0);
            free(fx), free(fw), free(fb), free(wy), free(wm), free(wr), free(wdx), free(wdw), free(wdb);
            free(ry), free(rm), free(rr), free(rdx), free(rdw), free(rdb);
        }
    }

    TEST_CASE("layers layernorm bf16: y and dx within bf16, mean/rstd/dw/db from the rounded inputs") {
        const int64_t rows = 4, cols = 48;
        const size_t n = (size_t)(rows * cols), nc = (size_t)cols, nr = (size_t)rows;
        float *x = fbuf(n), *w = fbuf(nc), *b = fbuf(nc), *dy = fbuf(n), *dx0 = fbuf(n), *got = fbuf(n), *mean = fbuf(nr),
              *rstd = fbuf(nr), *dw = fbuf(nc), *db = fbuf(nc), *want = fbuf(n), *wm = fbuf(nr), *wr = fbuf(nr),
              *wdw = fbuf(nc), *wdb = fbuf(nc);
        double *ry = dbuf(n), *rm = dbuf(nr), *rr = dbuf(nr), *rdx = dbuf(n), *rdw = dbuf(nc), *rdb = dbuf(nc);
        uint16_t *hx = hbuf(n), *hy = hbuf(n), *hdy = hbuf(n), *hdx = hbuf(n);
        test_randn(x, n, 860, 2.0f), test_randn(w, nc, 861, 0.3f), test_randn(b, nc, 862, 0.3f);
        test_randn(dy, n, 863, 1.0f), test_randn(dx0, n, 864, 1.0f);
        for (size_t k = 0; k < nc; k++) w[k] += 1.0f;
        round_bf16(x, n), round_bf16(dy, n), round_bf16(dx0, n);
        to_bf16(hx, x, n), to_bf16(hdy, dy, n);
        ln_ref_fwd(x, w, b, rows, cols, 1e-5, ry, rm, rr);
        poison_bf16(hy, n), test_poison(mean, nr), test_poison(rstd, nr);
        CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, hy, mean, rstd, hx, w, b, rows, cols, 1e-5f, TPK_BF16));
        from_bf16(got, hy, n), d2f(want, ry, n), d2f(wm, rm, nr), d2f(wr, rr, nr);
        CHECK_CLOSE(got, want, n, TOL_BF16, "layernorm_fwd bf16 y");
        CHECK_CLOSE(mean, wm, nr, TOL_LN, "layernorm_fwd bf16 mean");
        CHECK_CLOSE(rstd, wr, nr, TOL_LN, "layernorm_fwd bf16 rstd");

        ln_ref_bwd(x, w, dy, rows, cols, 1e-5, rdx, rdw, rdb);
        poison_bf16(hdx, n);
        memset(dw, 0, nc * sizeof(float)), memset(db, 0, nc * sizeof(float));
        CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, hdx, dw, db, hdy, hx, w, mean, rstd, rows, cols, TPK_BF16, false));
        from_bf16(got, hdx, n), d2f(want, rdx, n), d2f(wdw, rdw, nc), d2f(wdb, rdb, nc);
        CHECK_CLOSE(got, want, n, TOL_BF16, "layernorm_bwd bf16 dx");
        CHECK_CLOSE(dw, wdw, nc, TOL_LN, "layernorm_bwd bf16 dw");
        CHECK_CLOSE(db, wdb, nc, TOL_LN, "layernorm_bwd bf16 db");
        to_bf16(hdx, dx0, n);
        CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, hdx, dw, db, hdy, hx, w, mean, rstd, rows, cols, TPK_BF16, true));
        from_bf16(got, hdx, n);
        for (size_t k = 0; k < n; k++) want[k] = (float)(dx0[k] + rdx[k]);
        CHECK_CLOSE(got, want, n, TOL_BF16, "layernorm_bwd bf16 accumulate_dx");

        /* rows = 0: nothing read or written */
        CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 1e-5f, TPK_F32));
        CHECK_OK(&ctx, tpk_op_layernorm_bwd(&ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, TPK_F32, false));
        free(x), free(w), free(b), free(dy), free(dx0), free(got), free(mean), free(rstd), free(dw), free(db), free(want);
        free(wm), free(wr), free(wdw), free(wdb), free(ry), free(rm), free(rr), free(rdx), free(rdw), free(rdb);
        free(hx), free(hy), free(hdy), free(hdx);
    }
}

/* ---- embedding ----------------------------------------------------------------------------- */

/* reference embedding backward: wdE = dE0 + sum over tokens t with ids[t] = v0 + r of dy[t] */
static void ref_scatter_add(float *wdE, const float *dE0, const float *dy, const int32_t *ids, int T, int H, int v0, int vrows) {
    for (int r = 0; r < vrows; r++)
        for (int j = 0; j < H; j++) {
            double s = dE0[r * H + j];
            for (int t = 0; t < T; t++)
                if (ids[t] == v0 + r) s += dy[t * H + j];
            wdE[r * H + j] = (float)s;
        }
}

static void test_embedding(void) {
    /* rows [v0, v0 + vrows) = [4, 10) of a vocabulary of 14. 5 three times; 4 and 9 the first and
     * last rows; 3 and 10 just outside; -100 far outside. Rows 6 and 8 are not used. */
    enum { T = 9, H = 5, VROWS = 6, V0 = 4, VTOT = 14 };
    const int32_t ids[T] = {5, 4, 9, 10, 3, 5, -100, 5, 7};
    const size_t ny = T * H, ne = VROWS * H;
    TEST_CASE("layers embed_fwd/embed_bwd f32: lookup, out-of-range zeros, accumulate, repeated ids, shards") {
        float E[VROWS * H], y[T * H], y0[T * H], want[T * H], dy[T * H], dE[VROWS * H], dE0[VROWS * H], wdE[VROWS * H];
        test_randn(E, ne, 900, 1.0f);
        test_poison(y, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids, E, T, H, V0, VROWS, TPK_F32, false));
        size_t bad = 0;
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++) bad += in ? memcmp(&y[t * H + j], &E[r * H + j], 4) != 0 : !(y[t * H + j] == 0.0f);
        }
        CHECK(bad == 0, "embed_fwd: %zu elements are not the table row (or 0 out of range)", bad);

        /* accumulate: y0 + row, out-of-range tokens unchanged */
        test_randn(y0, ny, 901, 1.0f);
        memcpy(y, y0, sizeof y);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids, E, T, H, V0, VROWS, TPK_F32, true));
        size_t moved = 0;
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++) {
                want[t * H + j] = (float)((double)y0[t * H + j] + (in ? (double)E[r * H + j] : 0.0));
                if (!in) moved += memcmp(&y[t * H + j], &y0[t * H + j], 4) != 0;
            }
        }
        CHECK_CLOSE(y, want, ny, TOL_F32, "embed_fwd accumulate");
        CHECK(moved == 0, "embed_fwd accumulate changed %zu elements of out-of-range tokens", moved);

        /* two vocabulary shards [0, 7) and [7, 14) of a table, the second accumulated: the full lookup */
        const int32_t ids2[T] = {0, 6, 7, 13, 3, 7, 12, 1, 6};
        float Efull[VTOT * H];
        test_randn(Efull, VTOT * H, 902, 1.0f);
        test_poison(y, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids2, Efull, T, H, 0, 7, TPK_F32, false));
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids2, Efull + 7 * H, T, H, 7, 7, TPK_F32, true));
        bad = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < H; j++) bad += memcmp(&y[t * H + j], &Efull[ids2[t] * H + j], 4) != 0;
        CHECK(bad == 0, "two shards: %zu elements differ from the full table's rows", bad);

        /* backward: dE = dE0 + scatter-add of dy, repeated ids summed, out-of-range ignored */
        test_randn(dy, ny, 903, 1.0f);
        test_randn(dE0, ne, 904, 1.0f);
        memcpy(dE, dE0, sizeof dE);
        CHECK_OK(&ctx, tpk_op_embed_bwd(&ctx, dE, dy, ids, T, H, V0, VROWS, TPK_F32));
        ref_scatter_add(wdE, dE0, dy, ids, T, H, V0, VROWS);
        CHECK_CLOSE(dE, wdE, ne, TOL_F32, "embed_bwd scatter-add");
        size_t untouched = 0; /* rows 2 (id 6) and 4 (id 8) are not used: bitwise unchanged */
        for (int j = 0; j < H; j++)
            untouched += memcmp(&dE[2 * H + j], &dE0[2 * H + j], 4) != 0, untouched += memcmp(&dE[4 * H + j], &dE0[4 * H + j], 4) != 0;
        CHECK(untouched == 0, "embed_bwd changed %zu elements of unused rows", untouched);
        /* id 5 (row 1) three times: dE0 + dy[0] + dy[5] + dy[7] */
        for (int j = 0; j < H; j++) {
            double w3 = (double)dE0[H + j] + dy[0 * H + j] + dy[5 * H + j] + dy[7 * H + j];
            CHECK(fabs(dE[H + j] - w3) <= 1e-6 * (fabs(w3) + 1), "repeated id 5, j = %d: %g, expected %g", j, dE[H + j], w3);
        }

        /* empty */
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, NULL, NULL, E, 0, H, V0, VROWS, TPK_F32, false));
        CHECK_OK(&ctx, tpk_op_embed_bwd(&ctx, dE, NULL, NULL, 0, H, V0, VROWS, TPK_F32));
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids, NULL, T, H, V0, 0, TPK_F32, false)); /* an empty shard: zeros */
        bad = 0;
        for (size_t k = 0; k < ny; k++) bad += y[k] != 0.0f;
        CHECK(bad == 0, "vrows = 0: %zu nonzero outputs", bad);
    }

    TEST_CASE("layers embed_fwd/embed_bwd bf16: rounded rows, accumulate, scatter of bf16 dy") {
        float E[VROWS * H], y0[T * H], got[T * H], want[T * H], dy[T * H], dE[VROWS * H], dE0[VROWS * H], wdE[VROWS * H];
        uint16_t hy[T * H], hdy[T * H];
        test_randn(E, ne, 910, 1.0f);
        poison_bf16(hy, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, hy, ids, E, T, H, V0, VROWS, TPK_BF16, false));
        size_t bad = 0;
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++) bad += hy[t * H + j] != (in ? tpk_f32_to_bf16(E[r * H + j]) : 0);
        }
        CHECK(bad == 0, "embed_fwd bf16: %zu elements are not the rounded row (or +0)", bad);

        test_randn(y0, ny, 911, 1.0f);
        round_bf16(y0, ny);
        to_bf16(hy, y0, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, hy, ids, E, T, H, V0, VROWS, TPK_BF16, true));
        from_bf16(got, hy, ny);
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++) want[t * H + j] = (float)((double)y0[t * H + j] + (in ? (double)E[r * H + j] : 0.0));
        }
        CHECK_CLOSE(got, want, ny, TOL_BF16, "embed_fwd bf16 accumulate");

        test_randn(dy, ny, 912, 1.0f);
        round_bf16(dy, ny);
        to_bf16(hdy, dy, ny);
        test_randn(dE0, ne, 913, 1.0f);
        memcpy(dE, dE0, sizeof dE);
        CHECK_OK(&ctx, tpk_op_embed_bwd(&ctx, dE, hdy, ids, T, H, V0, VROWS, TPK_BF16));
        ref_scatter_add(wdE, dE0, dy, ids, T, H, V0, VROWS);
        CHECK_CLOSE(dE, wdE, ne, TOL_F32, "embed_bwd bf16 dy (f32 table)");
    }
}

/* ---- cross-entropy ------------------------------------------------------------------------- */

#define IGNORE (-100)

/* Reference in double over the full z [T, V]: lse, loss (0 when ignored) and, with dloss,
 * dz = (softmax - (1-eps) onehot - eps/V) dloss (0 when ignored). */
static void xent_ref(const float *z, int64_t T, int64_t V, const int32_t *y, double eps, const float *dloss, double *loss,
                     double *lse, double *dz) {
    for (int64_t t = 0; t < T; t++) {
        const float *zt = z + t * V;
        double m = -INFINITY, s = 0, sz = 0;
        for (int64_t j = 0; j < V; j++) m = zt[j] > m ? zt[j] : m;
        for (int64_t j = 0; j < V; j++) s += exp((double)zt[j] - m), sz += zt[j];
        double l = m + log(s);
        bool ign = y[t] == IGNORE;
        lse[t] = l;
        loss[t] = ign ? 0.0 : l - (1 - eps) * zt[y[t]] - eps * sz / (double)V;
        if (dz)
            for (int64_t j = 0; j < V; j++)
                dz[t * V + j] = ign ? 0.0 : (exp((double)zt[j] - l) - (j == y[t] ? 1 - eps : 0.0) - eps / (double)V) * dloss[t];
    }
}

/* columns r of z [T, V] into a contiguous [T, r.size] shard of dtype dt */
static void shard_of(void *zq, const float *z, int64_t T, int64_t V, tpk_range r, tpk_dtype dt) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < r.size; j++) {
            float v = z[t * V + r.off + j];
            if (dt == TPK_F32) ((float *)zq)[t * r.size + j] = v;
            else ((uint16_t *)zq)[t * r.size + j] = tpk_f32_to_bf16(v);
        }
}

/* The sharded forward as TP ranks run it: xent_stats per shard into part [nsh, T, 4] (the
 * all-gather's order), xent_loss over the nsh parts. With check, every shard's statistics are
 * compared with the reference (z must already be bf16-exact for bf16): the max and z_y bit for
 * bit, the sums within f32. */
static void xent_forward(const float *z, int64_t T, int64_t V, int nsh, const int32_t *y, float eps, tpk_dtype dt, float *loss,
                         float *lse, bool check) {
    size_t nt = (size_t)T;
    float *part = fbuf(4 * nt * (size_t)nsh);
    void *zq = malloc((size_t)(T * V) * sizeof(float) + 4);
    test_poison(part, 4 * nt * (size_t)nsh);
    for (int q = 0; q < nsh; q++) {
        tpk_range r = tpk_split(V, nsh, q);
        float *pq = part + 4 * nt * (size_t)q;
        shard_of(zq, z, T, V, r, dt);
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, pq, zq, y, T, r.size, r.size, r.off, dt));
        if (!check) continue;
        float g1[64], g3[64], w1[64], w3[64];
        for (int64_t t = 0; t < T && t < 64; t++) {
            float m = -INFINITY;
            for (int64_t j = 0; j < r.size; j++) m = z[t * V + r.off + j] > m ? z[t * V + r.off + j] : m;
            CHECK(memcmp(&m, &pq[4 * t], 4) == 0, "xent_stats shard %d row %lld: max %g, expected %g", q, (long long)t, pq[4 * t], m);
            double se = 0, sz = 0;
            for (int64_t j = 0; j < r.size; j++) se += exp((double)z[t * V + r.off + j] - m), sz += z[t * V + r.off + j];
            w1[t] = (float)se, w3[t] = (float)sz, g1[t] = pq[4 * t + 1], g3[t] = pq[4 * t + 3];
            float zy = y[t] >= r.off && y[t] < r.off + r.size ? z[t * V + y[t]] : 0.0f;
            CHECK(memcmp(&zy, &pq[4 * t + 2], 4) == 0, "xent_stats shard %d row %lld: z_y part %g, expected %g", q, (long long)t,
                  pq[4 * t + 2], zy);
        }
        CHECK_CLOSE(g1, w1, (size_t)(T < 64 ? T : 64), TOL_F32, "xent_stats sum exp(z - max)");
        CHECK_CLOSE(g3, w3, (size_t)(T < 64 ? T : 64), TOL_F32, "xent_stats sum z");
    }
    test_poison(loss, nt), test_poison(lse, nt);
    CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, part, nsh, y, T, V, eps, IGNORE));
    free(part), free(zq);
}

/* dz of the full [T, V] assembled from xent_grad per shard; with check, dz aliasing z per shard
 * must give the same bits */
static void xent_backward(const float *z, const float *lse, const float *dloss, int64_t T, int64_t V, int nsh,
                          const int32_t *y, float eps, tpk_dtype dt, float *dz, bool check) {
    size_t esz = dt == TPK_F32 ? 4 : 2, n = (size_t)(T * V);
    unsigned char *zq = malloc(n * 4 + 4), *dq = malloc(n * 4 + 4), *aq = malloc(n * 4 + 4);
    for (int q = 0; q < nsh; q++) {
        tpk_range r = tpk_split(V, nsh, q);
        size_t nq = (size_t)(T * r.size);
        shard_of(zq, z, T, V, r, dt);
        if (dt == TPK_F32) test_poison((float *)dq, nq);
        else poison_bf16((uint16_t *)dq, nq);
        CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, dq, zq, lse, y, dloss, T, r.size, r.size, r.off, V, eps, IGNORE, dt));
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < r.size; j++)
                dz[t * V + r.off + j] = dt == TPK_F32 ? ((float *)dq)[t * r.size + j] : tpk_bf16_to_f32(((uint16_t *)dq)[t * r.size + j]);
        if (check) {
            memcpy(aq, zq, nq * esz);
            CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, aq, aq, lse, y, dloss, T, r.size, r.size, r.off, V, eps, IGNORE, dt));
            CHECK(memcmp(aq, dq, nq * esz) == 0, "xent_grad shard %d: dz aliasing z differs from out of place", q);
        }
    }
    free(zq), free(dq), free(aq);
}

static void test_xent(void) {
    enum { T = 6, V = 11, NSH = 3 };
    /* shards of 11 over 3: [0, 4), [4, 8), [8, 11). Targets on shard edges; row 2 ignored. */
    const int32_t y[T] = {0, 10, IGNORE, 4, 7, 3};
    const size_t n = T * V;
    const float epss[] = {0.0f, 0.1f};
    for (int e = 0; e < 2; e++) {
        const float eps = epss[e];
        TEST_CASE("layers cross-entropy f32 smoothing %g: 3 vocab shards, loss, ignore index, grad, finite differences, aliasing",
                  (double)eps) {
            float z[T * V], dloss[T], loss[T], lse[T], wl[T], wlse[T], dz[T * V], wdz[T * V], fd[T * V];
            double rl[T], rlse[T], rdz[T * V];
            test_randn(z, n, 1000 + e, 3.0f);
            for (int j = 0; j < V; j++) z[4 * V + j] += 30.0f; /* a row far from 0: the max must be subtracted */
            test_randn(dloss, T, 1010 + e, 1.0f);

            xent_forward(z, T, V, NSH, y, eps, TPK_F32, loss, lse, true);
            xent_ref(z, T, V, y, eps, dloss, rl, rlse, rdz);
            d2f(wl, rl, T), d2f(wlse, rlse, T), d2f(wdz, rdz, n);
            CHECK_CLOSE(loss, wl, T, TOL_F32, "xent_loss vs log-sum-exp reference");
            CHECK_CLOSE(lse, wlse, T, TOL_F32, "xent_loss lse");
            CHECK(loss[2] == 0.0f, "ignored target: loss %g, expected 0", loss[2]);

            xent_backward(z, lse, dloss, T, V, NSH, y, eps, TPK_F32, dz, true);
            CHECK_CLOSE(dz, wdz, n, TOL_F32, "xent_grad vs reference");
            size_t nz = 0;
            for (int j = 0; j < V; j++) nz += dz[2 * V + j] != 0.0f;
            CHECK(nz == 0, "ignored target: %zu nonzero dz", nz);

            /* finite differences of L = sum_t dloss_t loss_t over every logit */
            float zz[T * V], lp[T], lm[T], ls[T];
            memcpy(zz, z, sizeof zz);
            for (size_t k = 0; k < n; k++) {
                float save = zz[k], xp, xm;
                double step = fd_step(save, 1e-2, &xp, &xm), Lp = 0, Lm = 0;
                zz[k] = xp;
                xent_forward(zz, T, V, NSH, y, eps, TPK_F32, lp, ls, false);
                zz[k] = xm;
                xent_forward(zz, T, V, NSH, y, eps, TPK_F32, lm, ls, false);
                zz[k] = save;
                for (int t = 0; t < T; t++) Lp += (double)dloss[t] * lp[t], Lm += (double)dloss[t] * lm[t];
                fd[k] = (float)((Lp - Lm) / step);
            }
            CHECK_CLOSE(dz, fd, n, TOL_FD, "xent_grad vs finite differences of the loss");
        }
    }

    TEST_CASE("layers cross-entropy bf16 logits, smoothing 0.1: loss and grad within bf16") {
        float z[T * V], dloss[T], loss[T], lse[T], wl[T], dz[T * V], wdz[T * V];
        double rl[T], rlse[T], rdz[T * V];
        test_randn(z, n, 1020, 3.0f);
        round_bf16(z, n);
        test_randn(dloss, T, 1021, 1.0f);
        xent_forward(z, T, V, NSH, y, 0.1f, TPK_BF16, loss, lse, true);
        xent_ref(z, T, V, y, 0.1, dloss, rl, rlse, rdz);
        d2f(wl, rl, T), d2f(wdz, rdz, n);
        CHECK_CLOSE(loss, wl, T, TOL_F32, "bf16 logits: loss (f32 arithmetic on exact bf16 inputs)");
        xent_backward(z, lse, dloss, T, V, NSH, y, 0.1f, TPK_BF16, dz, true);
        CHECK_CLOSE(dz, wdz, n, TOL_BF16, "bf16 xent_grad");
    }

    TEST_CASE("layers cross-entropy: a padded shard (rows of ld > Vl) ignores its padding and gets a zero gradient there") {
        enum { LD = 9 };
        tpk_range r = tpk_split(V, NSH, 1); /* columns [4, 8) */
        float z[T * V], zs[T * 4], zp[T * LD], dloss[T], part[4 * T], partp[4 * T], lse[T], loss[T], dz[T * 4], dzp[T * LD];
        test_randn(z, n, 1030, 3.0f);
        test_randn(dloss, T, 1031, 1.0f);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < LD; j++) {
                if (j < r.size) zs[t * r.size + j] = zp[t * LD + j] = z[t * V + r.off + j];
                else zp[t * LD + j] = 1e30f; /* read as a logit, it would dominate the max and overflow the sums */
            }
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, part, zs, y, T, r.size, r.size, r.off, TPK_F32));
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, partp, zp, y, T, r.size, LD, r.off, TPK_F32));
        CHECK(memcmp(part, partp, sizeof part) == 0, "xent_stats of the padded rows differs from the unpadded");
        CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, part, 1, y, T, V, 0.1f, IGNORE));
        test_poison(dz, T * 4), test_poison(dzp, T * LD);
        CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, dz, zs, lse, y, dloss, T, r.size, r.size, r.off, V, 0.1f, IGNORE, TPK_F32));
        CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, dzp, zp, lse, y, dloss, T, r.size, LD, r.off, V, 0.1f, IGNORE, TPK_F32));
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < LD; j++) bad += j < r.size ? memcmp(&dz[t * r.size + j], &dzp[t * LD + j], 4) != 0 : dzp[t * LD + j] != 0.0f;
        CHECK(bad == 0, "xent_grad of the padded rows: %d elements differ from the unpadded or are not zero in the padding", bad);
    }

    TEST_CASE("layers cross-entropy: an empty shard (Vl = 0) gives (-inf, 0, 0, 0) and adds nothing to the loss") {
        float part[12], z[3 * V], loss[3], lse[3], loss2[3], lse2[3], two[2 * 12];
        const int32_t yy[3] = {0, 5, IGNORE};
        test_poison(part, 12);
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, part, NULL, yy, 3, 0, 0, 11, TPK_F32));
        int bad = 0;
        for (int t = 0; t < 3; t++) bad += !(isinf(part[4 * t]) && part[4 * t] < 0) + (part[4 * t + 1] != 0) + (part[4 * t + 2] != 0) + (part[4 * t + 3] != 0);
        CHECK(bad == 0, "Vl = 0: parts %g %g %g %g ...", part[0], part[1], part[2], part[3]);
        /* a rank with no columns before one with all of them: the same loss as the latter alone */
        test_randn(z, 3 * V, 1040, 3.0f);
        for (int t = 0; t < 3; t++) memcpy(two + 4 * t, part + 4 * t, 16);
        CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, two + 12, z, yy, 3, V, V, 0, TPK_F32));
        CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, two, 2, yy, 3, V, 0.1f, IGNORE));
        CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss2, lse2, two + 12, 1, yy, 3, V, 0.1f, IGNORE));
        CHECK(memcmp(loss, loss2, sizeof loss) == 0 && memcmp(lse, lse2, sizeof lse) == 0, "an empty rank's parts changed the loss: %g vs %g",
              loss[0], loss2[0]);
    }

    TEST_CASE("layers cross-entropy: xent_fused (one rank) equals xent_stats, xent_loss and xent_grad bit for bit, in place and not, "
              "padded rows, ignore index, f32 and bf16") {
        enum { LD = 16 };
        for (int d = 0; d < 2; d++) {
            tpk_dtype dt = d ? TPK_BF16 : TPK_F32;
            size_t es = d ? 2 : 4;
            float z[T * V], part[4 * T], loss[T], lse[T], fl[T], flse[T], dl[T], wl[T];
            double rl[T], rlse[T];
            unsigned char zp[T * LD * 4], dz[T * LD * 4], fz[T * LD * 4], az[T * LD * 4];
            test_randn(z, n, 1050 + d, 3.0f);
            if (d) round_bf16(z, n);
            for (int t = 0; t < T; t++)
                for (int j = 0; j < LD; j++) {
                    float v = j < V ? z[t * V + j] : 1e30f; /* the padding must not be read as logits */
                    if (d) ((uint16_t *)zp)[t * LD + j] = tpk_f32_to_bf16(v);
                    else ((float *)zp)[t * LD + j] = v;
                }
            const float g = 0.37f;
            for (int t = 0; t < T; t++) dl[t] = g;
            CHECK_OK(&ctx, tpk_op_xent_stats(&ctx, part, zp, y, T, V, LD, 0, dt));
            CHECK_OK(&ctx, tpk_op_xent_loss(&ctx, loss, lse, part, 1, y, T, V, 0.1f, IGNORE));
            CHECK_OK(&ctx, tpk_op_xent_grad(&ctx, dz, zp, lse, y, dl, T, V, LD, 0, V, 0.1f, IGNORE, dt));
            test_poison(fl, T), test_poison(flse, T), memset(fz, 0xff, sizeof fz);
            CHECK_OK(&ctx, tpk_op_xent_fused(&ctx, fz, fl, flse, zp, y, T, V, LD, 0.1f, IGNORE, g, dt));
            CHECK(memcmp(fl, loss, sizeof loss) == 0 && memcmp(flse, lse, sizeof lse) == 0, "%s fused loss %g lse %g, apart %g %g",
                  d ? "bf16" : "f32", fl[0], flse[0], loss[0], lse[0]);
            CHECK(memcmp(fz, dz, (size_t)(T * LD) * es) == 0, "%s fused dz differs from xent_grad's", d ? "bf16" : "f32");
            memcpy(az, zp, sizeof az);
            CHECK_OK(&ctx, tpk_op_xent_fused(&ctx, az, fl, flse, az, y, T, V, LD, 0.1f, IGNORE, g, dt));
            CHECK(memcmp(az, dz, (size_t)(T * LD) * es) == 0, "%s fused dz in place differs", d ? "bf16" : "f32");
            xent_ref(z, T, V, y, 0.1, NULL, rl, rlse, NULL);
            d2f(wl, rl, T);
            CHECK_CLOSE(fl, wl, T, TOL_F32, "fused loss vs reference");
        }
    }

    TEST_CASE("layers cross-entropy: xent_mean (the mean loss in backend memory) against a long double sum; running sums; poisoned output") {
        enum { NT = 4 };
        const int64_t Ts[NT] = {0, 1, 333, 20000}, counts[NT] = {0, 1, 300, 19999};
        for (int c = 0; c < NT; c++) {
            int64_t T = Ts[c], count = counts[c];
            float *l = fbuf((size_t)(T ? T : 1));
            test_randn(l, (size_t)T, 900 + (uint64_t)c, 3.0f);
            for (int64_t t = 0; t < T; t++) l[t] = fabsf(l[t]) + (t % 7 == 0 ? 1e4f : 0.0f); /* losses >= 0, some large: the order matters in f32 */
            long double ref = 0;
            for (int64_t t = 0; t < T; t++) ref += l[t];
            double want = count ? (double)(float)(ref / (long double)count) : 0.0, acc = NAN; /* poisoned */
            CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, l, T, count, false));
            CHECK(fabs(acc - want) <= 1.2e-7 * fabs(want), "T = %lld: mean %.9g, reference %.9g", (long long)T, acc, want);
            CHECK(acc == (double)(float)acc, "T = %lld: the mean is a float (%.17g)", (long long)T, acc);
            double m = acc;
            CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, l, T, count, true)); /* a running sum: acc + m */
            CHECK(acc == 2.0 * m, "T = %lld: accumulated %.17g, expected %.17g", (long long)T, acc, 2.0 * m);
            acc = 0.25;
            CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, l, T, count, true));
            CHECK(acc == 0.25 + m, "T = %lld: accumulated onto 0.25: %.17g", (long long)T, acc);
            free(l);
        }
    }
}

/* ---- attention ----------------------------------------------------------------------------- */

typedef struct attn_shape {
    int64_t B, S, Al, D, A, head0, G; /* G key/value heads; 0 = A */
} attn_shape;

static int64_t attn_G(const attn_shape *s) { return s->G ? s->G : s->A; }
/* the local key/value heads [*g0, *g0 + Gl) of the query heads [head0, head0 + Al) */
static int64_t attn_Gl(const attn_shape *s, int64_t *g0) { return tpk_attn_kv_heads(s->A, attn_G(s), s->head0, s->Al, g0); }
static size_t attn_nq(const attn_shape *s) { return (size_t)(s->B * s->S * (s->Al + 2 * attn_Gl(s, NULL)) * s->D); }
static size_t attn_no(const attn_shape *s) { return (size_t)(s->B * s->S * s->Al * s->D); }
static size_t attn_nl(const attn_shape *s) { return (size_t)(s->B * s->Al * s->S); }

/* keep factor of P_ij of batch b, global head g: 0 or 1/(1-p) (1 when p = 0) */
static double attn_keep_ref(double p, uint64_t seed, uint64_t stream, const attn_shape *s, int64_t b, int64_t g, int64_t i,
                            int64_t j) {
    if (p <= 0) return 1.0;
    uint64_t idx = (uint64_t)(((b * s->A + g) * s->S + i) * s->S + j);
    return test_dropout_u(seed, stream, idx) >= (float)p ? 1.0 / (1.0 - (double)(float)p) : 0.0;
}

/* Naive causal attention in double: out, lse and (with dout) dqkv. */
static void attn_ref(const attn_shape *s, const float *qkv, const float *dout, double scale, float p, uint64_t seed,
                     uint64_t stream, double *out, double *lse, double *dqkv) {
    int64_t g0, Gl = attn_Gl(s, &g0), grp = s->A / attn_G(s);
    const int64_t S = s->S, D = s->D, Al = s->Al, ld3 = (Al + 2 * Gl) * D, ldo = Al * D;
    double *P = dbuf((size_t)(S * S)), *K = dbuf((size_t)(S * S)), *dPk = dbuf((size_t)(S * S)), *dS = dbuf((size_t)(S * S));
    if (dqkv)
        for (size_t k = 0; k < attn_nq(s); k++) dqkv[k] = 0;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < Al; h++) {
#define Qe(i, d) ((double)qkv[(b * S + (i)) * ld3 + h * D + (d)])
#define Ke(i, d) ((double)qkv[(b * S + (i)) * ld3 + (Al + kv) * D + (d)])
#define Ve(i, d) ((double)qkv[(b * S + (i)) * ld3 + (Al + Gl + kv) * D + (d)])
            int64_t kv = (s->head0 + h) / grp - g0; /* the key/value head query head h reads */
            for (int64_t i = 0; i < S; i++) {
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double sc = 0;
                    for (int64_t d = 0; d < D; d++) sc += Qe(i, d) * Ke(j, d);
                    P[i * S + j] = scale * sc;
                    m = P[i * S + j] > m ? P[i * S + j] : m;
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(P[i * S + j] - m);
                double l = m + log(sum);
                lse[(b * Al + h) * S + i] = l;
                for (int64_t j = 0; j < S; j++) {
                    P[i * S + j] = j <= i ? exp(P[i * S + j] - l) : 0.0;
                    K[i * S + j] = j <= i ? attn_keep_ref(p, seed, stream, s, b, s->head0 + h, i, j) : 0.0;
                }
                for (int64_t d = 0; d < D; d++) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; j++) o += P[i * S + j] * K[i * S + j] * Ve(j, d);
                    out[(b * S + i) * ldo + h * D + d] = o;
                }
            }
            if (!dqkv) continue;
#define dOe(i, d) ((double)dout[(b * S + (i)) * ldo + h * D + (d)])
            /* out_i = sum_j P_ij k_ij V_j: dL/dP_ij = k_ij dO_i . V_j; softmax: dS_ij = P_ij (dPk_ij - sum_l P_il dPk_il) */
            for (int64_t i = 0; i < S; i++) {
                double Dr = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double g = 0;
                    for (int64_t d = 0; d < D; d++) g += dOe(i, d) * Ve(j, d);
                    dPk[i * S + j] = K[i * S + j] * g;
                    Dr += P[i * S + j] * dPk[i * S + j];
                }
                for (int64_t j = 0; j <= i; j++) dS[i * S + j] = P[i * S + j] * (dPk[i * S + j] - Dr);
            }
            for (int64_t i = 0; i < S; i++)
                for (int64_t d = 0; d < D; d++) {
                    double gq = 0, gk = 0, gv = 0;
                    for (int64_t j = 0; j <= i; j++) gq += dS[i * S + j] * Ke(j, d);           /* dQ_i = scale sum_j dS_ij K_j */
                    for (int64_t r = i; r < S; r++) gk += dS[r * S + i] * Qe(r, d);           /* dK_i = scale sum_r dS_ri Q_r */
                    for (int64_t r = i; r < S; r++) gv += P[r * S + i] * K[r * S + i] * dOe(r, d); /* dV_i = sum_r Pk_ri dO_r */
                    dqkv[(b * S + i) * ld3 + h * D + d] = scale * gq;
                    dqkv[(b * S + i) * ld3 + (Al + kv) * D + d] += scale * gk; /* summed over the query heads of a group */
                    dqkv[(b * S + i) * ld3 + (Al + Gl + kv) * D + d] += gv;
                }
#undef Qe
#undef Ke
#undef Ve
#undef dOe
        }
    free(P), free(K), free(dPk), free(dS);
}

/* attn_fwd in dt on f32 data (bf16-exact when dt is bf16): out f32 [no], lse f32 [nl], poisoned first */
static void attn_run_fwd(const attn_shape *s, const float *qkv, float scale, float p, uint64_t seed, uint64_t stream,
                         tpk_dtype dt, float *out, float *lse) {
    size_t nq = attn_nq(s), no = attn_no(s);
    test_poison(out, no), test_poison(lse, attn_nl(s));
    if (dt == TPK_F32) {
        CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, out, lse, qkv, s->B, s->S, s->Al, s->D, s->A, attn_G(s), s->head0, scale, p, seed, stream, dt));
        return;
    }
    uint16_t *hq = hbuf(nq), *ho = hbuf(no);
    to_bf16(hq, qkv, nq), poison_bf16(ho, no);
    CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, ho, lse, hq, s->B, s->S, s->Al, s->D, s->A, attn_G(s), s->head0, scale, p, seed, stream, dt));
    from_bf16(out, ho, no);
    free(hq), free(ho);
}
static void attn_run_bwd(const attn_shape *s, const float *qkv, const float *dout, const float *out, const float *lse,
                         float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt, float *dqkv) {
    size_t nq = attn_nq(s), no = attn_no(s);
    test_poison(dqkv, nq);
    if (dt == TPK_F32) {
        CHECK_OK(&ctx, tpk_op_attn_bwd(&ctx, dqkv, dout, qkv, out, lse, s->B, s->S, s->Al, s->D, s->A, attn_G(s), s->head0, scale, p, seed,
                                         stream, dt));
        return;
    }
    uint16_t *hq = hbuf(nq), *hd = hbuf(no), *ho = hbuf(no), *hg = hbuf(nq);
    to_bf16(hq, qkv, nq), to_bf16(hd, dout, no), to_bf16(ho, out, no), poison_bf16(hg, nq);
    CHECK_OK(&ctx, tpk_op_attn_bwd(&ctx, hg, hd, hq, ho, lse, s->B, s->S, s->Al, s->D, s->A, attn_G(s), s->head0, scale, p, seed, stream, dt));
    from_bf16(dqkv, hg, nq);
    free(hq), free(hd), free(ho), free(hg);
}

/* L = sum out R in double, out from the f32 op */
static double attn_loss(const attn_shape *s, const float *qkv, const float *R, float scale, float p, uint64_t seed,
                        uint64_t stream, float *out, float *lse) {
    attn_run_fwd(s, qkv, scale, p, seed, stream, TPK_F32, out, lse);
    double L = 0;
    for (size_t k = 0; k < attn_no(s); k++) L += (double)out[k] * R[k];
    return L;
}

/* forward + backward of one f32 configuration against the reference and finite differences */
static void attn_check_f32(const attn_shape *s, float p, uint64_t seed, uint64_t stream, uint64_t dseed, bool fd) {
    const size_t nq = attn_nq(s), no = attn_no(s), nl = attn_nl(s);
    const float scale = 1.0f / sqrtf((float)s->D);
    float *qkv = fbuf(nq), *R = fbuf(no), *out = fbuf(no), *lse = fbuf(nl), *dqkv = fbuf(nq), *wo = fbuf(no), *wl = fbuf(nl),
          *wd = fbuf(nq), *fdq = fbuf(nq), *to = fbuf(no), *tl = fbuf(nl);
    double *ro = dbuf(no), *rl = dbuf(nl), *rd = dbuf(nq);
    test_randn(qkv, nq, dseed, 1.0f);
    test_randn(R, no, dseed + 1, 1.0f);

    attn_run_fwd(s, qkv, scale, p, seed, stream, TPK_F32, out, lse);
    attn_ref(s, qkv, R, scale, p, seed, stream, ro, rl, rd);
    d2f(wo, ro, no), d2f(wl, rl, nl), d2f(wd, rd, nq);
    CHECK_CLOSE(out, wo, no, TOL_ATTN, "attn_fwd out vs naive causal attention");
    CHECK_CLOSE(lse, wl, nl, TOL_ATTN, "attn_fwd lse");

    attn_run_bwd(s, qkv, R, out, lse, scale, p, seed, stream, TPK_F32, dqkv);
    CHECK_CLOSE(dqkv, wd, nq, TOL_ATTN, "attn_bwd dqkv vs analytic reference");
    /* Q, K and V blocks separately, so a small block is not hidden by a large one. The scale of a
     * block is floored at 1e-2 of the whole: with S = 1 the true dQ and dK are exactly 0. */
    const int64_t Gl = attn_Gl(s, NULL), ld = (s->Al + 2 * Gl) * s->D, rowsN = s->B * s->S;
    const int64_t c0[3] = {0, s->Al * s->D, (s->Al + Gl) * s->D}, cw[3] = {s->Al * s->D, Gl * s->D, Gl * s->D};
    double wmax = 0;
    for (size_t k = 0; k < nq; k++) wmax = fabs(wd[k]) > wmax ? fabs(wd[k]) : wmax;
    const char *blk[3] = {"dQ", "dK", "dV"};
    for (int c = 0; c < 3; c++) {
        int64_t AD = cw[c];
        size_t nb = (size_t)(rowsN * AD);
        float *gb = fbuf(nb), *wb = fbuf(nb);
        for (int64_t r = 0; r < rowsN; r++)
            for (int64_t k = 0; k < AD; k++) gb[r * AD + k] = dqkv[r * ld + c0[c] + k], wb[r * AD + k] = wd[r * ld + c0[c] + k];
        double num = 0, den = 1e-2 * wmax;
        for (size_t k = 0; k < nb; k++) {
            double d = isnan(gb[k]) ? INFINITY : fabs((double)gb[k] - wb[k]);
            num = d > num ? d : num, den = fabs(wb[k]) > den ? fabs(wb[k]) : den;
        }
        CHECK(num / den < TOL_ATTN, "attn_bwd %s block vs analytic reference: relative error %.3g >= %.3g", blk[c], num / den,
              (double)TOL_ATTN);
        free(gb), free(wb);
    }

    if (fd) { /* every entry of Q, K and V */
        float *qq = fbuf(nq);
        memcpy(qq, qkv, nq * sizeof(float));
        for (size_t k = 0; k < nq; k++) {
            float save = qq[k], xp, xm;
            double step = fd_step(save, 1e-2, &xp, &xm);
            qq[k] = xp;
            double Lp = attn_loss(s, qq, R, scale, p, seed, stream, to, tl);
            qq[k] = xm;
            double Lm = attn_loss(s, qq, R, scale, p, seed, stream, to, tl);
            qq[k] = save;
            fdq[k] = (float)((Lp - Lm) / step);
        }
        CHECK_CLOSE(dqkv, fdq, nq, TOL_FD, "attn_bwd dqkv vs finite differences of sum(out R)");
        free(qq);
    }
    free(qkv), free(R), free(out), free(lse), free(dqkv), free(wo), free(wl), free(wd), free(fdq), free(to), free(tl);
    free(ro), free(rl), free(rd);
}

static void test_attention(void) {
    const attn_shape s0 = {.B = 2, .S = 5, .Al = 2, .D = 4, .A = 3, .head0 = 1};
    const uint64_t seed = 2024, stream = 5;

    TEST_CASE("layers attention f32 B=2 S=5 Al=2 of A=3 head0=1 D=4: forward, backward, finite differences") {
        attn_check_f32(&s0, 0.0f, seed, stream, 1100, true);
    }
    TEST_CASE("layers attention f32 with dropout p = 0.25: same mask formula, backward vs finite differences") {
        /* the test's premise: the mask drops some causal entries and keeps others */
        size_t kept = 0, dropped = 0;
        for (int64_t b = 0; b < s0.B; b++)
            for (int64_t h = 0; h < s0.Al; h++)
                for (int64_t i = 0; i < s0.S; i++)
                    for (int64_t j = 0; j <= i; j++) {
                        double k = attn_keep_ref(0.25, seed, stream, &s0, b, s0.head0 + h, i, j);
                        kept += k != 0, dropped += k == 0;
                    }
        CHECK(kept > 0 && dropped > 0, "premise: kept %zu, dropped %zu", kept, dropped);
        attn_check_f32(&s0, 0.25f, seed, stream, 1110, true);
    }
    TEST_CASE("layers attention f32 larger (B=1 S=37 Al=3 of A=5 head0=2 D=8; B=2 S=150), with and without dropout") {
        const attn_shape s1 = {.B = 1, .S = 37, .Al = 3, .D = 8, .A = 5, .head0 = 2};
        attn_check_f32(&s1, 0.0f, seed, stream, 1120, false);
        attn_check_f32(&s1, 0.1f, seed, stream, 1130, false);
        const attn_shape s3 = {.B = 2, .S = 150, .Al = 2, .D = 8, .A = 2, .head0 = 0}; /* 3 query-row blocks, the last partial */
        attn_check_f32(&s3, 0.1f, seed, stream, 1135, false);
        const attn_shape s2 = {.B = 3, .S = 1, .Al = 1, .D = 3, .A = 1, .head0 = 0}; /* one token: out = V */
        attn_check_f32(&s2, 0.0f, seed, stream, 1140, true);
    }

    TEST_CASE("layers attention, grouped-query: A=6 query heads over G=2 and G=1 key/value heads, a shared head read in place; "
              "forward, backward (dK, dV summed over the group) and finite differences") {
        const attn_shape g1 = {.B = 2, .S = 5, .Al = 3, .D = 4, .A = 6, .head0 = 2, .G = 2}; /* heads 2..4: key/value heads 0 and 1 */
        const attn_shape g2 = {.B = 1, .S = 6, .Al = 6, .D = 4, .A = 6, .head0 = 0, .G = 1};
        const attn_shape g3 = {.B = 1, .S = 70, .Al = 2, .D = 8, .A = 6, .head0 = 4, .G = 3}; /* two row blocks */
        CHECK(attn_Gl(&g1, NULL) == 2 && attn_Gl(&g2, NULL) == 1 && attn_Gl(&g3, NULL) == 1, "key/value heads per call");
        attn_check_f32(&g1, 0.0f, seed, stream, 1160, true);
        attn_check_f32(&g1, 0.25f, seed, stream, 1161, true);
        attn_check_f32(&g2, 0.0f, seed, stream, 1162, true);
        attn_check_f32(&g3, 0.1f, seed, stream, 1163, false);
    }

    TEST_CASE("layers attention: a head's result does not depend on head0 of other heads") {
        const float ps[2] = {0.0f, 0.25f};
        const int64_t B = s0.B, S = s0.S, D = s0.D, Al = s0.Al;
        const attn_shape s1 = {.B = B, .S = S, .Al = 1, .D = D, .A = s0.A, .head0 = 2};
        const size_t nq = attn_nq(&s0), no = attn_no(&s0), nl = attn_nl(&s0), nq1 = attn_nq(&s1), no1 = attn_no(&s1),
                     nl1 = attn_nl(&s1);
        const float scale = 0.5f;
        float *qkv = fbuf(nq), *R = fbuf(no), *out = fbuf(no), *lse = fbuf(nl), *dq = fbuf(nq);
        float *q1 = fbuf(nq1), *R1 = fbuf(no1), *out1 = fbuf(no1), *lse1 = fbuf(nl1), *dq1 = fbuf(nq1);
        float *xo = fbuf(no1), *xl = fbuf(nl1), *xd = fbuf(nq1), *alt = fbuf(no1), *altl = fbuf(nl1);
        test_randn(qkv, nq, 1150, 1.0f);
        test_randn(R, no, 1151, 1.0f);
        /* head h = 1's columns of Q, K, V and of out */
        for (int64_t r = 0; r < B * S; r++) {
            for (int c = 0; c < 3; c++)
                for (int64_t d = 0; d < D; d++) q1[r * 3 * D + c * D + d] = qkv[r * 3 * Al * D + c * Al * D + D + d];
            for (int64_t d = 0; d < D; d++) R1[r * D + d] = R[r * Al * D + D + d];
        }
        for (int pi = 0; pi < 2; pi++) {
            const float p = ps[pi];
            attn_run_fwd(&s0, qkv, scale, p, seed, stream, TPK_F32, out, lse);
            attn_run_bwd(&s0, qkv, R, out, lse, scale, p, seed, stream, TPK_F32, dq);
            attn_run_fwd(&s1, q1, scale, p, seed, stream, TPK_F32, out1, lse1);
            attn_run_bwd(&s1, q1, R1, out1, lse1, scale, p, seed, stream, TPK_F32, dq1);
            for (int64_t r = 0; r < B * S; r++) {
                for (int64_t d = 0; d < D; d++) xo[r * D + d] = out[r * Al * D + D + d];
                for (int c = 0; c < 3; c++)
                    for (int64_t d = 0; d < D; d++) xd[r * 3 * D + c * D + d] = dq[r * 3 * Al * D + c * Al * D + D + d];
            }
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < S; i++) xl[b * S + i] = lse[(b * Al + 1) * S + i];
            CHECK(bitdiff(out1, xo, no1) == 0, "p = %g: Al = 1, head0 = 2 out differs from head 1 of (Al = 2, head0 = 1) in %zu elements",
                  (double)p, bitdiff(out1, xo, no1));
            CHECK(bitdiff(lse1, xl, nl1) == 0, "p = %g: lse differs in %zu elements", (double)p, bitdiff(lse1, xl, nl1));
            CHECK(bitdiff(dq1, xd, nq1) == 0, "p = %g: dqkv differs in %zu elements", (double)p, bitdiff(dq1, xd, nq1));
            CHECK(count_nan(out, no) == 0 && count_nan(dq, nq) == 0, "NaN left in out or dqkv");
        }
        /* with dropout the global head index matters: head0 = 0 on the same data is another mask */
        const attn_shape s1b = {.B = B, .S = S, .Al = 1, .D = D, .A = s0.A, .head0 = 0};
        attn_run_fwd(&s1, q1, scale, 0.25f, seed, stream, TPK_F32, out1, lse1);
        attn_run_fwd(&s1b, q1, scale, 0.25f, seed, stream, TPK_F32, alt, altl);
        CHECK(bitdiff(out1, alt, no1) > 0, "p = 0.25: head0 = 0 and head0 = 2 gave the same output");
        CHECK(bitdiff(lse1, altl, nl1) == 0, "lse does not depend on the dropout mask");
        free(qkv), free(R), free(out), free(lse), free(dq), free(q1), free(R1), free(out1), free(lse1), free(dq1);
        free(xo), free(xl), free(xd), free(alt), free(altl);
    }

    TEST_CASE("layers attention bf16 storage (p = 0 and 0.25): within 1e-2 of the reference on rounded inputs") {
        const size_t nq = attn_nq(&s0), no = attn_no(&s0), nl = attn_nl(&s0);
        const float scale = 0.5f;
        float *qkv = fbuf(nq), *R = fbuf(no), *out = fbuf(no), *lse = fbuf(nl), *dq = fbuf(nq), *wo = fbuf(no), *wl = fbuf(nl),
              *wd = fbuf(nq);
        double *ro = dbuf(no), *rl = dbuf(nl), *rd = dbuf(nq);
        test_randn(qkv, nq, 1160, 1.0f), test_randn(R, no, 1161, 1.0f);
        round_bf16(qkv, nq), round_bf16(R, no);
        for (int pi = 0; pi < 2; pi++) {
            const float p = pi ? 0.25f : 0.0f;
            attn_ref(&s0, qkv, R, scale, p, seed, stream, ro, rl, rd);
            d2f(wo, ro, no), d2f(wl, rl, nl), d2f(wd, rd, nq);
            attn_run_fwd(&s0, qkv, scale, p, seed, stream, TPK_BF16, out, lse);
            CHECK_CLOSE(out, wo, no, TOL_BF16, pi ? "bf16 attn_fwd out, p = 0.25" : "bf16 attn_fwd out, p = 0");
            CHECK_CLOSE(lse, wl, nl, TOL_ATTN, pi ? "bf16 attn_fwd lse (f32 on exact bf16 inputs), p = 0.25" : "bf16 attn_fwd lse, p = 0");
            attn_run_bwd(&s0, qkv, R, out, lse, scale, p, seed, stream, TPK_BF16, dq);
            CHECK_CLOSE(dq, wd, nq, TOL_BF16, pi ? "bf16 attn_bwd dqkv, p = 0.25" : "bf16 attn_bwd dqkv, p = 0");
        }
        free(qkv), free(R), free(out), free(lse), free(dq), free(wo), free(wl), free(wd), free(ro), free(rl), free(rd);
    }

    TEST_CASE("layers attention: bad arguments fail naming them; empty sizes are no-ops") {
        float q[256] = {0}, out[128], lse[64], dq[256], dO[128] = {0};
        const float sc = 0.5f;
        /* fwd */
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 2, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "head0:");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, -1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "head0:");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 2, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG,
                    "G: expected a divisor of A = 3 (key/value heads), got 2");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 0, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "G: expected a divisor");
        CHECK_FAILS(&ctx, tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 4, 3, 6, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "G: expected a divisor");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 1, sc, 1.0f, 1, 1, TPK_F32), TPK_ERR_ARG,
                    "p: expected 0 <= p < 1, got 1");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 1, sc, -0.5f, 1, 1, TPK_F32), TPK_ERR_ARG, "p:");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 0, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG,
                    "D: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, -2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "B: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, -5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "S: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, NULL, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "qkv: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, NULL, q, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "lse: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_I32), TPK_ERR_DTYPE, "tpk_op_attn_fwd: dt:");
        /* bwd */
        CHECK_FAILS(&ctx, tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 4, 3, 3, 2, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "head0:");
        CHECK_FAILS(&ctx, tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 4, 3, 3, 1, sc, 1.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "p:");
        CHECK_FAILS(&ctx, tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 0, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG, "D:");
        CHECK_FAILS(&ctx, tpk_op_attn_bwd(&ctx, dq, NULL, q, out, lse, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32), TPK_ERR_ARG,
                    "dout: expected a buffer");
        CHECK(strncmp(tpk_last_error(&ctx), "tpk_op_attn_bwd: ", 17) == 0, "message \"%s\" does not name tpk_op_attn_bwd",
              tpk_last_error(&ctx));
        /* empty: nothing read */
        CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, NULL, NULL, NULL, 0, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32));
        CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, NULL, NULL, NULL, 2, 0, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32));
        CHECK_OK(&ctx, tpk_op_attn_bwd(&ctx, NULL, NULL, NULL, NULL, NULL, 2, 5, 0, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32));
    }
}

/* ---- bad arguments of layernorm, embedding, cross-entropy ----------------------------------- */

static void test_errors(void) {
    TEST_CASE("layers layernorm, embedding, cross-entropy: bad arguments fail naming them") {
        float a[64] = {0}, b[64] = {0}, c[64] = {0}, m[8] = {0}, r[8] = {0}, w[16] = {0};
        int32_t ids[4] = {0, 1, 2, 3};
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, 2, 0, 1e-5f, TPK_F32), TPK_ERR_ARG, "cols: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, -1, 4, 1e-5f, TPK_F32), TPK_ERR_ARG, "rows: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, 2, 4, 0.0f, TPK_F32), TPK_ERR_ARG, "eps: expected > 0");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, NULL, b, w, w, 2, 4, 1e-5f, TPK_F32), TPK_ERR_ARG, "rstd: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, 2, 4, 1e-5f, TPK_I32), TPK_ERR_DTYPE, "dt:");
        CHECK_FAILS(&ctx, tpk_op_layernorm_bwd(&ctx, a, w, w, b, c, w, m, r, 2, 0, TPK_F32, false), TPK_ERR_ARG, "cols: expected >= 1");
        CHECK_FAILS(&ctx, tpk_op_layernorm_bwd(&ctx, a, NULL, w, b, c, w, m, r, 2, 4, TPK_F32, false), TPK_ERR_ARG, "dw: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_embed_fwd(&ctx, a, NULL, w, 4, 2, 0, 8, TPK_F32, false), TPK_ERR_ARG, "ids: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_embed_fwd(&ctx, a, ids, w, 4, -2, 0, 8, TPK_F32, false), TPK_ERR_ARG, "H: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_embed_fwd(&ctx, a, ids, w, 4, 2, 0, -1, TPK_F32, false), TPK_ERR_ARG, "vrows: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_embed_bwd(&ctx, NULL, b, ids, 4, 2, 0, 8, TPK_F32), TPK_ERR_ARG, "dtable: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_embed_bwd(&ctx, w, b, ids, -4, 2, 0, 8, TPK_F32), TPK_ERR_ARG, "T: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_xent_stats(&ctx, c, a, ids, 2, -3, 3, 0, TPK_F32), TPK_ERR_ARG, "Vl: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_xent_stats(&ctx, c, a, ids, 2, 3, 2, 0, TPK_F32), TPK_ERR_ARG, "tpk_op_xent_stats: ld: expected >= Vl = 3, got 2");
        CHECK_FAILS(&ctx, tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 1, 0, 3, 0.0f, IGNORE, TPK_F32), TPK_ERR_ARG, "tpk_op_xent_grad: ld: expected >= Vl = 3, got 1");
        CHECK_FAILS(&ctx, tpk_op_xent_stats(&ctx, c, a, NULL, 2, 3, 3, 0, TPK_F32), TPK_ERR_ARG, "targets: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 1, ids, 2, 0, 0.0f, IGNORE), TPK_ERR_ARG, "V: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 0, ids, 2, 3, 0.0f, IGNORE), TPK_ERR_ARG, "tpk_op_xent_loss: P: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_xent_fused(&ctx, a, m, r, b, ids, 2, 3, 2, 0.0f, IGNORE, 1.0f, TPK_F32), TPK_ERR_ARG, "tpk_op_xent_fused: ld: expected >= Vl = 3, got 2");
        CHECK_FAILS(&ctx, tpk_op_xent_fused(&ctx, a, m, r, b, ids, 2, 3, 3, 0.0f, IGNORE, NAN, TPK_F32), TPK_ERR_ARG, "tpk_op_xent_fused: g: expected a finite");
        CHECK_FAILS(&ctx, tpk_op_xent_fused(&ctx, a, NULL, r, b, ids, 2, 3, 3, 0.0f, IGNORE, 1.0f, TPK_F32), TPK_ERR_ARG, "tpk_op_xent_fused: loss");
        CHECK_FAILS(&ctx, tpk_op_xent_fused(&ctx, a, m, r, b, ids, 2, 0, 0, 0.0f, IGNORE, 1.0f, TPK_F32), TPK_ERR_ARG, "tpk_op_xent_fused: V: expected >= 1");
        double acc = 0;
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, &acc, a, 2, 3, false), TPK_ERR_ARG, "tpk_op_xent_mean: count: expected 0 <= count <= T = 2, got 3");
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, &acc, a, 2, -1, false), TPK_ERR_ARG, "count: expected 0 <= count");
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, &acc, a, -2, 0, false), TPK_ERR_ARG, "tpk_op_xent_mean: T: expected >= 0, got -2");
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, NULL, a, 2, 1, false), TPK_ERR_ARG, "tpk_op_xent_mean: acc: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, &acc, NULL, 2, 1, true), TPK_ERR_ARG, "tpk_op_xent_mean: loss: expected a buffer");
        CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, NULL, 0, 0, false)); /* no rows: the mean is 0 */
        CHECK(acc == 0.0, "T = 0: mean %g", acc);
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 1, ids, 2, 5, 1.5f, IGNORE), TPK_ERR_ARG, "smoothing:");
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 1, ids, 2, 5, -0.1f, IGNORE), TPK_ERR_ARG, "smoothing:");
        CHECK_FAILS(&ctx, tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 3, 0, 0, 0.0f, IGNORE, TPK_F32), TPK_ERR_ARG, "V: expected >= 1");
        CHECK_FAILS(&ctx, tpk_op_xent_grad(&ctx, a, b, m, ids, NULL, 2, 3, 3, 0, 3, 0.0f, IGNORE, TPK_F32), TPK_ERR_ARG,
                    "dloss: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 3, 0, 3, 0.0f, IGNORE, TPK_I32), TPK_ERR_DTYPE, "tpk_op_xent_grad: dt:");
        CHECK_FAILS(&ctx, tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 3, 0, 3, 1.5f, IGNORE, TPK_F32), TPK_ERR_ARG,
                    "tpk_op_xent_grad: smoothing: expected 0..1, got 1.5");
    }
}

/* residual_layernorm_fwd: x1 = x + r, then exactly layernorm_fwd of x1 (f32 and bf16, x1 aliasing x) */
static void test_residual_layernorm(void) {
    TEST_CASE("layers residual_layernorm_fwd equals the add then layernorm_fwd (f32, bf16, x1 aliasing x)") {
        enum { R = 7, C = 19 };
        float x[R * C], r[R * C], w[C], b[C], x1[R * C], y[R * C], m[R], rs[R], xr[R * C], yr[R * C], mr[R], rsr[R];
        test_randn(x, R * C, 80, 2.0f), test_randn(r, R * C, 81, 1.0f), test_randn(w, C, 82, 1.0f), test_randn(b, C, 83, 1.0f);
        for (int v = 0; v < 3; v++) {
            tpk_dtype dt = v == 1 ? TPK_BF16 : TPK_F32;
            uint16_t xh[R * C], rh[R * C], x1h[R * C], yh[R * C], xrh[R * C], yrh[R * C];
            for (int i = 0; i < R * C; i++) xh[i] = tpk_f32_to_bf16(x[i]), rh[i] = tpk_f32_to_bf16(r[i]);
            const void *xa = dt == TPK_BF16 ? (const void *)xh : x, *ra = dt == TPK_BF16 ? (const void *)rh : r;
            void *x1a = dt == TPK_BF16 ? (void *)x1h : x1, *ya = dt == TPK_BF16 ? (void *)yh : y;
            void *xra = dt == TPK_BF16 ? (void *)xrh : xr, *yra = dt == TPK_BF16 ? (void *)yrh : yr;
            test_poison(x1, R * C), test_poison(y, R * C), test_poison(m, R), test_poison(rs, R);
            if (v == 2) memcpy(x1, x, sizeof x1), xa = x1; /* in place: x1 is x */
            CHECK_OK(&ctx, tpk_op_residual_layernorm_fwd(&ctx, x1a, ya, m, rs, xa, ra, w, b, R, C, 1e-5f, dt));
            /* the composition */
            CHECK_OK(&ctx, tpk_op_axpby(&ctx, xra, 1.0f, dt == TPK_BF16 ? (const void *)xh : x, 0.0f, dt, R * C));
            CHECK_OK(&ctx, tpk_op_axpby(&ctx, xra, 1.0f, ra, 1.0f, dt, R * C));
            CHECK_OK(&ctx, tpk_op_layernorm_fwd(&ctx, yra, mr, rsr, xra, w, b, R, C, 1e-5f, dt));
            float g1[R * C], g2[R * C], g3[R * C], g4[R * C];
            for (int i = 0; i < R * C; i++) {
                g1[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(x1h[i]) : x1[i], g2[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(xrh[i]) : xr[i];
                g3[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(yh[i]) : y[i], g4[i] = dt == TPK_BF16 ? tpk_bf16_to_f32(yrh[i]) : yr[i];
            }
            CHECK_CLOSE(g1, g2, R * C, 1e-7, "x1 = x + r");
            CHECK_CLOSE(g3, g4, R * C, 1e-6, "y = layernorm(x1)");
            CHECK_CLOSE(m, mr, R, 1e-6, "mean");
            CHECK_CLOSE(rs, rsr, R, 1e-6, "rstd");
        }
        CHECK_FAILS(&ctx, tpk_op_residual_layernorm_fwd(&ctx, NULL, y, m, rs, x, r, w, b, R, C, 1e-5f, TPK_F32), TPK_ERR_ARG, "x1: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_residual_layernorm_fwd(&ctx, x1, y, m, rs, x, NULL, w, b, R, C, 1e-5f, TPK_F32), TPK_ERR_ARG, "r: expected a buffer");
    }
}

/* ---- rotary embedding, SwiGLU, RMSNorm (Llama) ------------------------------------------------ */

/* y = rope(x) in double: rows [rows, ld], heads of D at h D, position i mod S */
static void rope_ref(const float *x, int64_t ld, int64_t rows, int64_t S, int64_t heads, int64_t D, double theta, bool inverse, double *y) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t j = 0; j < D / 2; j++) {
                double a = (double)(i % S) * pow(theta, -2.0 * (double)j / (double)D), c = cos(a), n = inverse ? -sin(a) : sin(a);
                double x1 = x[i * ld + h * D + j], x2 = x[i * ld + h * D + j + D / 2];
                y[i * heads * D + h * D + j] = x1 * c - x2 * n;
                y[i * heads * D + h * D + j + D / 2] = x2 * c + x1 * n;
            }
}
/* RMSNorm in double: y, rstd; with dy: dx and dw */
static void rms_ref(const float *x, const float *w, const float *dy, int64_t rows, int64_t cols, double eps, double *y, double *rstd, double *dx,
                    double *dw) {
    for (int64_t j = 0; dw && j < cols; j++) dw[j] = 0;
    for (int64_t i = 0; i < rows; i++) {
        double ss = 0, gx = 0;
        for (int64_t j = 0; j < cols; j++) ss += (double)x[i * cols + j] * x[i * cols + j];
        double r = 1.0 / sqrt(ss / (double)cols + eps);
        rstd[i] = r;
        for (int64_t j = 0; j < cols; j++) y[i * cols + j] = x[i * cols + j] * r * w[j];
        if (!dy) continue;
        for (int64_t j = 0; j < cols; j++) gx += (double)dy[i * cols + j] * w[j] * x[i * cols + j] * r;
        for (int64_t j = 0; j < cols; j++) {
            double xh = x[i * cols + j] * r;
            dx[i * cols + j] = r * (dy[i * cols + j] * w[j] - xh * gx / (double)cols);
            dw[j] += dy[i * cols + j] * xh;
        }
    }
}
static double silu_d(double g) { return g / (1.0 + exp(-g)); }

static void test_llama_ops(void) {
    TEST_CASE("layers rope f32/bf16: the rotate-half formula per position, inverse undoes it, in place, strided rows, columns past the heads untouched") {
        enum { R = 10, S = 4, NH = 3, D = 8, LD = NH * D + 5 };
        float x[R * LD], y[R * LD], z[R * LD], w[R * NH * D], back[R * LD];
        double ref[R * NH * D];
        test_randn(x, R * LD, 1200, 1.0f);
        for (int inv = 0; inv < 2; inv++) {
            test_poison(y, R * LD);
            CHECK_OK(&ctx, tpk_op_rope(&ctx, y, LD, x, LD, R, S, NH, D, 100.0f, inv, TPK_F32));
            rope_ref(x, LD, R, S, NH, D, 100.0, inv, ref);
            size_t nan_inside = 0, written_outside = 0;
            for (int i = 0; i < R; i++) {
                for (int c = 0; c < NH * D; c++) w[i * NH * D + c] = y[i * LD + c], nan_inside += isnan(y[i * LD + c]);
                for (int c = NH * D; c < LD; c++) written_outside += !isnan(y[i * LD + c]);
            }
            float wr[R * NH * D];
            d2f(wr, ref, R * NH * D);
            CHECK_CLOSE(w, wr, R * NH * D, 1e-6, inv ? "inverse rope vs double" : "rope vs double");
            CHECK(nan_inside == 0 && written_outside == 0, "%zu heads' elements unwritten, %zu columns past the heads written", nan_inside, written_outside);
        }
        CHECK_OK(&ctx, tpk_op_rope(&ctx, y, LD, x, LD, R, S, NH, D, 100.0f, false, TPK_F32));
        memcpy(back, y, sizeof back);
        CHECK_OK(&ctx, tpk_op_rope(&ctx, back, LD, back, LD, R, S, NH, D, 100.0f, true, TPK_F32)); /* in place */
        for (int i = 0; i < R; i++)
            for (int c = NH * D; c < LD; c++) back[i * LD + c] = x[i * LD + c];
        CHECK_CLOSE(back, x, R * LD, 1e-6, "inverse(rope(x)) = x");
        memcpy(z, x, sizeof z);
        CHECK_OK(&ctx, tpk_op_rope(&ctx, z, LD, z, LD, R, S, NH, D, 100.0f, false, TPK_F32));
        for (int i = 0; i < R; i++)
            for (int c = NH * D; c < LD; c++) y[i * LD + c] = x[i * LD + c];
        CHECK(bitdiff(z, y, R * LD) == 0, "in place differs from out of place");
        uint16_t hx[R * LD], hy[R * NH * D];
        float fx[R * LD], fy[R * NH * D];
        to_bf16(hx, x, R * LD), from_bf16(fx, hx, R * LD), poison_bf16(hy, R * NH * D);
        CHECK_OK(&ctx, tpk_op_rope(&ctx, hy, NH * D, hx, LD, R, S, NH, D, 100.0f, false, TPK_BF16));
        from_bf16(fy, hy, R * NH * D);
        rope_ref(fx, LD, R, S, NH, D, 100.0, false, ref);
        float wr[R * NH * D];
        d2f(wr, ref, R * NH * D);
        CHECK_CLOSE(fy, wr, R * NH * D, 1e-2, "bf16 rope vs double on the rounded input");
    }

    TEST_CASE("layers swiglu f32/bf16: h = silu(gate) up; backward vs the analytic gradient and finite differences; dgu may be gu") {
        enum { R = 7, F = 9 };
        float gu[R * 2 * F], h[R * F], dh[R * F], dgu[R * 2 * F], wh[R * F], wg[R * 2 * F], fd[R * 2 * F], tmp[R * F];
        test_randn(gu, R * 2 * F, 1210, 2.0f);
        test_randn(dh, R * F, 1211, 1.0f);
        test_poison(h, R * F), test_poison(dgu, R * 2 * F);
        CHECK_OK(&ctx, tpk_op_swiglu_fwd(&ctx, h, gu, R, F, TPK_F32));
        CHECK_OK(&ctx, tpk_op_swiglu_bwd(&ctx, dgu, gu, dh, R, F, TPK_F32));
        for (int i = 0; i < R; i++)
            for (int j = 0; j < F; j++) {
                double g = gu[i * 2 * F + j], u = gu[i * 2 * F + F + j], sg = 1.0 / (1.0 + exp(-g));
                wh[i * F + j] = (float)(silu_d(g) * u);
                wg[i * 2 * F + j] = (float)(dh[i * F + j] * u * (sg + g * sg * (1 - sg)));
                wg[i * 2 * F + F + j] = (float)(dh[i * F + j] * silu_d(g));
            }
        CHECK_CLOSE(h, wh, R * F, 1e-6, "swiglu_fwd vs double");
        CHECK_CLOSE(dgu, wg, R * 2 * F, 1e-6, "swiglu_bwd vs the analytic gradient");
        for (int k = 0; k < R * 2 * F; k++) { /* L = sum h dh */
            float save = gu[k], xp, xm;
            double step = fd_step(save, 1e-2, &xp, &xm), Lp = 0, Lm = 0;
            gu[k] = xp, tpk_op_swiglu_fwd(&ctx, tmp, gu, R, F, TPK_F32);
            for (int q = 0; q < R * F; q++) Lp += (double)tmp[q] * dh[q];
            gu[k] = xm, tpk_op_swiglu_fwd(&ctx, tmp, gu, R, F, TPK_F32);
            for (int q = 0; q < R * F; q++) Lm += (double)tmp[q] * dh[q];
            gu[k] = save, fd[k] = (float)((Lp - Lm) / step);
        }
        CHECK_CLOSE(dgu, fd, R * 2 * F, TOL_FD, "swiglu_bwd vs finite differences");
        float al[R * 2 * F];
        memcpy(al, gu, sizeof al);
        CHECK_OK(&ctx, tpk_op_swiglu_bwd(&ctx, al, al, dh, R, F, TPK_F32));
        CHECK(bitdiff(al, dgu, R * 2 * F) == 0, "dgu = gu (in place) differs");
        uint16_t hg[R * 2 * F], hh[R * F], hd[R * F], hdg[R * 2 * F];
        float fh[R * F], fg[R * 2 * F];
        round_bf16(gu, R * 2 * F), round_bf16(dh, R * F);
        to_bf16(hg, gu, R * 2 * F), to_bf16(hd, dh, R * F), poison_bf16(hh, R * F), poison_bf16(hdg, R * 2 * F);
        CHECK_OK(&ctx, tpk_op_swiglu_fwd(&ctx, hh, hg, R, F, TPK_BF16));
        CHECK_OK(&ctx, tpk_op_swiglu_bwd(&ctx, hdg, hg, hd, R, F, TPK_BF16));
        from_bf16(fh, hh, R * F), from_bf16(fg, hdg, R * 2 * F);
        CHECK_OK(&ctx, tpk_op_swiglu_fwd(&ctx, h, gu, R, F, TPK_F32));
        CHECK_OK(&ctx, tpk_op_swiglu_bwd(&ctx, dgu, gu, dh, R, F, TPK_F32));
        CHECK_CLOSE(fh, h, R * F, 1e-2, "bf16 swiglu_fwd");
        CHECK_CLOSE(fg, dgu, R * 2 * F, 1e-2, "bf16 swiglu_bwd");
    }

    TEST_CASE("layers rmsnorm f32/bf16: reference, finite differences, accumulation") {
        enum { R = 6, C = 13 };
        float x[R * C], w[C], dy[R * C], y[R * C], rstd[R], dx[R * C], dw[C], wy[R * C], wdx[R * C], wdw[C], wr[R], fd[R * C];
        double ry[R * C], rr[R], rdx[R * C], rdw[C];
        test_randn(x, R * C, 1220, 1.5f), test_randn(w, C, 1221, 1.0f), test_randn(dy, R * C, 1222, 1.0f);
        test_poison(y, R * C), test_poison(rstd, R), test_poison(dx, R * C);
        for (int j = 0; j < C; j++) dw[j] = 0.5f; /* accumulates */
        CHECK_OK(&ctx, tpk_op_rmsnorm_fwd(&ctx, y, rstd, x, w, R, C, 1e-5f, TPK_F32));
        CHECK_OK(&ctx, tpk_op_rmsnorm_bwd(&ctx, dx, dw, dy, x, w, rstd, R, C, TPK_F32, false));
        rms_ref(x, w, dy, R, C, 1e-5, ry, rr, rdx, rdw);
        for (int j = 0; j < C; j++) rdw[j] += 0.5;
        d2f(wy, ry, R * C), d2f(wr, rr, R), d2f(wdx, rdx, R * C), d2f(wdw, rdw, C);
        CHECK_CLOSE(y, wy, R * C, TOL_LN, "rmsnorm_fwd y");
        CHECK_CLOSE(rstd, wr, R, TOL_LN, "rmsnorm_fwd rstd");
        CHECK_CLOSE(dx, wdx, R * C, TOL_LN, "rmsnorm_bwd dx");
        CHECK_CLOSE(dw, wdw, C, TOL_LN, "rmsnorm_bwd dw (accumulated)");
        for (int k = 0; k < R * C; k++) { /* L = sum y dy */
            float save = x[k], xp, xm, ty[R * C], tr[R];
            double step = fd_step(save, 1e-2, &xp, &xm), Lp = 0, Lm = 0;
            x[k] = xp, tpk_op_rmsnorm_fwd(&ctx, ty, tr, x, w, R, C, 1e-5f, TPK_F32);
            for (int q = 0; q < R * C; q++) Lp += (double)ty[q] * dy[q];
            x[k] = xm, tpk_op_rmsnorm_fwd(&ctx, ty, tr, x, w, R, C, 1e-5f, TPK_F32);
            for (int q = 0; q < R * C; q++) Lm += (double)ty[q] * dy[q];
            x[k] = save, fd[k] = (float)((Lp - Lm) / step);
        }
        CHECK_CLOSE(dx, fd, R * C, TOL_FD, "rmsnorm_bwd dx vs finite differences");
        float acc[R * C];
        for (int k = 0; k < R * C; k++) acc[k] = 1.0f;
        CHECK_OK(&ctx, tpk_op_rmsnorm_bwd(&ctx, acc, dw, dy, x, w, rstd, R, C, TPK_F32, true));
        for (int k = 0; k < R * C; k++) acc[k] -= 1.0f;
        CHECK_CLOSE(acc, dx, R * C, 1e-5, "accumulate_dx adds");
        uint16_t hx[R * C], hy[R * C], hdy[R * C], hdx[R * C];
        float fy[R * C], fdx[R * C];
        round_bf16(x, R * C), round_bf16(dy, R * C);
        to_bf16(hx, x, R * C), to_bf16(hdy, dy, R * C), poison_bf16(hy, R * C), poison_bf16(hdx, R * C);
        CHECK_OK(&ctx, tpk_op_rmsnorm_fwd(&ctx, hy, rstd, hx, w, R, C, 1e-5f, TPK_BF16));
        for (int j = 0; j < C; j++) dw[j] = 0;
        CHECK_OK(&ctx, tpk_op_rmsnorm_bwd(&ctx, hdx, dw, hdy, hx, w, rstd, R, C, TPK_BF16, false));
        from_bf16(fy, hy, R * C), from_bf16(fdx, hdx, R * C);
        rms_ref(x, w, dy, R, C, 1e-5, ry, rr, rdx, rdw);
        d2f(wy, ry, R * C), d2f(wdx, rdx, R * C), d2f(wdw, rdw, C);
        CHECK_CLOSE(fy, wy, R * C, 1e-2, "bf16 rmsnorm_fwd");
        CHECK_CLOSE(fdx, wdx, R * C, 1e-2, "bf16 rmsnorm_bwd dx");
        CHECK_CLOSE(dw, wdw, C, 1e-5, "bf16 rmsnorm_bwd dw from the rounded inputs");
    }

    TEST_CASE("layers rope, swiglu, rmsnorm: bad arguments fail naming them; empty sizes are no-ops") {
        float a[64] = {0}, b[64] = {0};
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 2, 1, 7, 100.0f, false, TPK_F32), TPK_ERR_ARG, "D: expected an even head size >= 2");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 2, 1, 8, 1.0f, false, TPK_F32), TPK_ERR_ARG, "theta: expected a finite base > 1");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 6, 2, 2, 1, 8, 100.0f, false, TPK_F32), TPK_ERR_ARG, "ldx: expected >= 8, got 6");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 16, a, 8, 2, 2, 1, 8, 100.0f, false, TPK_F32), TPK_ERR_ARG, "ldy: in place (y == x) expected ldx = 8, got 16");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 0, 1, 8, 100.0f, false, TPK_F32), TPK_ERR_ARG, "S: expected >= 1");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, NULL, 8, 2, 2, 1, 8, 100.0f, false, TPK_F32), TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 2, 1, 8, 100.0f, false, TPK_I32), TPK_ERR_DTYPE, "tpk_op_rope: dt:");
        CHECK_FAILS(&ctx, tpk_op_swiglu_fwd(&ctx, a, NULL, 2, 3, TPK_F32), TPK_ERR_ARG, "gu: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_swiglu_bwd(&ctx, a, b, NULL, 2, 3, TPK_F32), TPK_ERR_ARG, "dh: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_swiglu_fwd(&ctx, a, b, -2, 3, TPK_F32), TPK_ERR_ARG, "rows: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_fwd(&ctx, a, b, a, b, 2, 3, 0.0f, TPK_F32), TPK_ERR_ARG, "eps: expected > 0");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_fwd(&ctx, a, NULL, a, b, 2, 3, 1e-5f, TPK_F32), TPK_ERR_ARG, "rstd: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_bwd(&ctx, a, NULL, a, a, b, b, 2, 3, TPK_F32, false), TPK_ERR_ARG, "dw: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_bwd(&ctx, a, b, a, a, b, b, 2, 0, TPK_F32, false), TPK_ERR_ARG, "cols: expected >= 1");
        CHECK_OK(&ctx, tpk_op_rope(&ctx, NULL, 8, NULL, 8, 0, 2, 1, 8, 100.0f, false, TPK_F32));
        CHECK_OK(&ctx, tpk_op_swiglu_fwd(&ctx, NULL, NULL, 0, 3, TPK_F32));
        CHECK_OK(&ctx, tpk_op_rmsnorm_fwd(&ctx, NULL, NULL, NULL, NULL, 0, 3, 1e-5f, TPK_F32));
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    if (test_host_ctx(&ctx) != TPK_OK) return 1;
    test_dropout();
    test_layernorm();
    test_residual_layernorm();
    test_embedding();
    test_xent();
    test_attention();
    test_llama_ops();
    test_errors();
    tpk_ctx_destroy(&ctx);
    return test_finish();
}
