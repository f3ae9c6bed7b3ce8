/* tests/test_ops_elementwise.c — the host backend's elementwise ops (kernels/host/elementwise.c)
 * against references in double: bias add and grad; GELU forward and backward (also against finite
 * differences) and the identity activation; fill, copy2d, cast (bf16 rounding on hand-picked
 * halfway cases), axpby; the FP8 casts (fp8_quant, fp8_dequant): every E4M3 and E5M2 code against
 * a table decoded here from the bit layout, and the rounding of f32s (ties to even at every
 * midpoint, saturation, NaN, subnormals, random magnitudes) against a search of that table, the
 * amax. Random inputs, outputs poisoned with NaN. Runs on one rank. */
#include "ops_test.h"

/* ---- bias ---------------------------------------------------------------------------------- */

static void test_bias(void) {
    TEST_CASE("host bias_add and bias_grad (f32, bf16, accumulate on and off)") {
        const int64_t shapes[][2] = {{7, 5}, {1, 1}, {33, 17}, {1, 64}, {64, 1}};
        for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
            int64_t rows = shapes[sh][0], cols = shapes[sh][1];
            size_t n = (size_t)(rows * cols);
            float *y = fbuf(n), *bias = fbuf((size_t)cols), *want = fbuf(n), *got = fbuf(n);
            float *db0 = fbuf((size_t)cols), *db = fbuf((size_t)cols), *dbw = fbuf((size_t)cols);
            uint16_t *hy = malloc(n * 2), *hb = malloc((size_t)cols * 2),
                     *hdb = malloc((size_t)cols * 2);
            for (int bf = 0; bf < 2; bf++) {
                tpk_dtype dt = bf ? TPK_BF16 : TPK_F32;
                double tol = bf ? 1e-2 : 1e-6;
                test_randn(y, n, 400 + sh, 1.0f);
                test_randn(bias, (size_t)cols, 410 + sh, 1.0f);
                if (bf) { /* reference inputs = the rounded ones */
                    to_bf16(hy, y, n), from_bf16(y, hy, n);
                    to_bf16(hb, bias, (size_t)cols), from_bf16(bias, hb, (size_t)cols);
                }
                for (int64_t i = 0; i < rows; i++)
                    for (int64_t j = 0; j < cols; j++)
                        want[i * cols + j] = (float)((double)y[i * cols + j] + bias[j]);
                if (bf) {
                    CHECK_OK(&ctx, tpk_op_bias_add(&ctx, hy, hb, rows, cols, dt));
                    from_bf16(got, hy, n);
                } else {
                    memcpy(got, y, n * sizeof(float));
                    CHECK_OK(&ctx, tpk_op_bias_add(&ctx, got, bias, rows, cols, dt));
                }
                CHECK(test_relerr(got, want, n) < tol, "bias_add %s %lldx%lld: relative error %.3g",
                      tpk_dtype_name(dt), (long long)rows, (long long)cols,
                      test_relerr(got, want, n));

                /* bias_grad: dy = y; accumulate off (db poisoned) and on */
                test_randn(db0, (size_t)cols, 420 + sh, 1.0f);
                if (bf) to_bf16(hdb, db0, (size_t)cols), from_bf16(db0, hdb, (size_t)cols);
                for (int acc = 0; acc < 2; acc++) {
                    for (int64_t j = 0; j < cols; j++) {
                        double s = acc ? db0[j] : 0.0;
                        for (int64_t i = 0; i < rows; i++) s += y[i * cols + j];
                        dbw[j] = (float)s;
                    }
                    if (acc) memcpy(db, db0, (size_t)cols * sizeof(float));
                    else test_poison(db, (size_t)cols);
                    if (bf) {
                        to_bf16(hy, y, n), to_bf16(hdb, db, (size_t)cols);
                        CHECK_OK(&ctx, tpk_op_bias_grad(&ctx, hdb, hy, rows, cols, dt, dt, acc));
                        from_bf16(db, hdb, (size_t)cols);
                    } else {
                        CHECK_OK(&ctx, tpk_op_bias_grad(&ctx, db, y, rows, cols, dt, dt, acc));
                    }
                    double e = test_relerr(db, dbw, (size_t)cols);
                    CHECK(e < tol, "bias_grad %s %lldx%lld accumulate=%d: relative error %.3g",
                          tpk_dtype_name(dt), (long long)rows, (long long)cols, acc, e);
                    if (bf) { /* db in f32 from bf16 dy: the sums not rounded to bf16 (1e-6, where a
                                 bf16 db is off by ~4e-3) */
                        if (acc) memcpy(db, db0, (size_t)cols * sizeof(float));
                        else test_poison(db, (size_t)cols);
                        CHECK_OK(&ctx,
                                 tpk_op_bias_grad(&ctx, db, hy, rows, cols, dt, TPK_F32, acc));
                        e = test_relerr(db, dbw, (size_t)cols);
                        CHECK(
                            e < 1e-6,
                            "bias_grad bf16 into f32 %lldx%lld accumulate=%d: relative error %.3g",
                            (long long)rows, (long long)cols, acc, e);
                    }
                }
            }
            free(y), free(bias), free(want), free(got), free(db0), free(db), free(dbw), free(hy),
                free(hb), free(hdb);
        }
        /* rows = 0: db = 0 (or unchanged when accumulating) */
        float db[3];
        test_poison(db, 3);
        CHECK_OK(&ctx, tpk_op_bias_grad(&ctx, db, NULL, 0, 3, TPK_F32, TPK_F32, false));
        CHECK(db[0] == 0 && db[1] == 0 && db[2] == 0, "rows = 0: db = %g %g %g", db[0], db[1],
              db[2]);
        db[0] = 1, db[1] = 2, db[2] = 3;
        CHECK_OK(&ctx, tpk_op_bias_grad(&ctx, db, NULL, 0, 3, TPK_F32, TPK_F32, true));
        CHECK(db[0] == 1 && db[1] == 2 && db[2] == 3, "rows = 0, accumulate: db = %g %g %g", db[0],
              db[1], db[2]);
    }
}

/* ---- GELU ---------------------------------------------------------------------------------- */

static void test_gelu(void) {
    for (int ai = 0; ai < 2; ai++) {
        tpk_act act = ai ? TPK_ACT_GELU : TPK_ACT_GELU_TANH;
        double (*ref)(double) = ai ? gelu_erf_d : gelu_d,
               (*slope)(double) = ai ? gelu_erf_grad_d : gelu_grad_d;
        TEST_CASE(
            "host act_fwd and act_bwd, %s (reference, finite differences, dx aliasing dy, bf16)",
            tpk_act_name(act)) {
            const size_t n = 1001;
            float *x = fbuf(n), *dy = fbuf(n), *y = fbuf(n), *dx = fbuf(n), *want = fbuf(n),
                  *fd = fbuf(n);
            test_randn(x, n, 500, 3.0f);
            x[0] = 0, x[1] = -10, x[2] = 10, x[3] = 1e-4f, x[4] = -6;
            test_randn(dy, n, 501, 1.0f);

            test_poison(y, n);
            CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, act, y, x, TPK_F32, n));
            for (size_t i = 0; i < n; i++) want[i] = (float)ref(x[i]);
            CHECK_CLOSE(y, want, n, 1e-6, "gelu_fwd f32");

            test_poison(dx, n);
            CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, act, dx, x, dy, TPK_F32, n));
            for (size_t i = 0; i < n; i++) {
                want[i] = (float)(dy[i] * slope(x[i]));
                double h = 1e-5;
                fd[i] = (float)(dy[i] * (ref((double)x[i] + h) - ref((double)x[i] - h)) / (2 * h));
            }
            CHECK_CLOSE(dx, want, n, 1e-6, "gelu_bwd f32 vs analytic");
            CHECK_CLOSE(dx, fd, n, 1e-5, "gelu_bwd f32 vs finite differences of gelu");

            /* dx aliasing dy */
            float *g = fbuf(n);
            memcpy(g, dy, n * sizeof(float));
            CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, act, g, x, g, TPK_F32, n));
            CHECK(memcmp(g, dx, n * sizeof(float)) == 0,
                  "gelu_bwd in place (dx == dy) differs from out of place");

            /* bf16: inputs rounded, output within bf16 precision */
            uint16_t *hx = malloc(n * 2), *hdy = malloc(n * 2), *hy = malloc(n * 2);
            to_bf16(hx, x, n), to_bf16(hdy, dy, n);
            float *xr = fbuf(n), *dyr = fbuf(n);
            from_bf16(xr, hx, n), from_bf16(dyr, hdy, n);
            CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, act, hy, hx, TPK_BF16, n));
            from_bf16(y, hy, n);
            for (size_t i = 0; i < n; i++) want[i] = (float)ref(xr[i]);
            CHECK_CLOSE(y, want, n, 1e-2, "gelu_fwd bf16");
            CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, act, hdy, hx, hdy, TPK_BF16, n)); /* in place */
            from_bf16(dx, hdy, n);
            for (size_t i = 0; i < n; i++) want[i] = (float)(dyr[i] * slope(xr[i]));
            CHECK_CLOSE(dx, want, n, 1e-2, "gelu_bwd bf16");

            free(x), free(dy), free(y), free(dx), free(want), free(fd), free(g), free(hx),
                free(hdy), free(hy), free(xr), free(dyr);
        }
    }
    TEST_CASE(
        "host act_fwd and act_bwd with TPK_ACT_NONE: y = x and dx = dy exactly, in place too, f32 "
        "and bf16") {
        const size_t n = 257;
        float x[257], dy[257], y[257], dx[257];
        test_randn(x, n, 510, 2.0f), test_randn(dy, n, 511, 1.0f);
        test_poison(y, n), test_poison(dx, n);
        CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_NONE, y, x, TPK_F32, n));
        CHECK(memcmp(y, x, sizeof x) == 0, "act_fwd none f32: y != x");
        CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_NONE, dx, x, dy, TPK_F32, n));
        CHECK(memcmp(dx, dy, sizeof dy) == 0, "act_bwd none f32: dx != dy");
        CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_NONE, y, y, TPK_F32, n));
        CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_NONE, dx, x, dx, TPK_F32, n));
        CHECK(memcmp(y, x, sizeof x) == 0 && memcmp(dx, dy, sizeof dy) == 0,
              "act none in place changed the values");
        uint16_t hx[257], hy[257];
        to_bf16(hx, x, n);
        memset(hy, 0xff, sizeof hy);
        CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_NONE, hy, hx, TPK_BF16, n));
        CHECK(memcmp(hy, hx, sizeof hx) == 0, "act_fwd none bf16: y != x");
        memset(hy, 0xff, sizeof hy);
        CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_NONE, hy, NULL, hx, TPK_BF16,
                                      n)); /* x is not read: may be NULL */
        CHECK(memcmp(hy, hx, sizeof hx) == 0, "act_bwd none bf16: dx != dy");
        CHECK_FAILS(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, hy, NULL, hx, TPK_BF16, n),
                    TPK_ERR_ARG, "tpk_op_act_bwd: x: expected a buffer");
    }
}

/* ---- fill, copy2d, axpby, cast ------------------------------------------------------------- */

static void test_elementwise(void) {
    TEST_CASE("host fill, copy2d (strided, i32) and axpby") {
        float x[37];
        test_poison(x, 37);
        CHECK_OK(&ctx, tpk_op_fill(&ctx, x, TPK_F32, 36, -2.5f));
        size_t bad = 0;
        for (int i = 0; i < 36; i++) bad += x[i] != -2.5f;
        CHECK(bad == 0, "fill f32: %zu elements wrong", bad);
        CHECK(isnan(x[36]), "fill wrote past n");
        uint16_t h[9] = {0};
        /* halfway: rounds to 1.0 */
        CHECK_OK(&ctx, tpk_op_fill(&ctx, h, TPK_BF16, 8, 1.0f + 1.0f / 256));
        bad = 0;
        for (int i = 0; i < 8; i++) bad += h[i] != 0x3F80;
        CHECK(bad == 0 && h[8] == 0, "fill bf16: %zu wrong, h[8] = %#x", bad, h[8]);
        CHECK_OK(&ctx, tpk_op_fill(&ctx, NULL, TPK_F32, 0, 1.0f));

        /* copy2d: a [5, 3] block from src (lds 7, at column 2) into dst (ldd 4) */
        float src[6 * 7], dst[5 * 4];
        test_randn(src, 42, 600, 1.0f);
        test_poison(dst, 20);
        CHECK_OK(&ctx, tpk_op_copy2d(&ctx, dst, 4, src + 2, 7, 5, 3, TPK_F32));
        bad = 0;
        for (int i = 0; i < 5; i++) {
            for (int j = 0; j < 3; j++) bad += dst[i * 4 + j] != src[i * 7 + 2 + j];
            bad += !isnan(dst[i * 4 + 3]);
        }
        CHECK(bad == 0, "copy2d f32: %zu elements wrong", bad);
        uint16_t hs[4 * 5], hd[3 * 6];
        for (int i = 0; i < 20; i++) hs[i] = (uint16_t)(1000 + i);
        memset(hd, 0xff, sizeof hd);
        CHECK_OK(&ctx, tpk_op_copy2d(&ctx, hd, 6, hs + 1, 5, 3, 4, TPK_BF16));
        bad = 0;
        for (int i = 0; i < 3; i++) {
            for (int j = 0; j < 4; j++) bad += hd[i * 6 + j] != hs[i * 5 + 1 + j];
            bad += hd[i * 6 + 4] != 0xffff || hd[i * 6 + 5] != 0xffff;
        }
        CHECK(bad == 0, "copy2d bf16: %zu elements wrong", bad);
        int32_t is[2 * 3] = {1, -2, 3, 2147483647, -2147483647 - 1, 6}, id[2 * 2] = {0};
        CHECK_OK(&ctx, tpk_op_copy2d(&ctx, id, 2, is + 1, 3, 2, 2, TPK_I32));
        CHECK(id[0] == -2 && id[1] == 3 && id[2] == -2147483647 - 1 && id[3] == 6,
              "copy2d i32: %d %d %d %d", id[0], id[1], id[2], id[3]);
        CHECK_OK(&ctx, tpk_op_copy2d(&ctx, NULL, 5, NULL, 5, 0, 5, TPK_F32));

        /* axpby: y = a x + b y; b = 0 ignores (NaN) y */
        const size_t n = 513;
        float *xx = fbuf(n), *y0 = fbuf(n), *y = fbuf(n), *want = fbuf(n);
        test_randn(xx, n, 610, 1.0f);
        test_randn(y0, n, 611, 1.0f);
        const float ab[][2] = {{2.0f, -0.5f}, {1.0f, 1.0f}, {-3.0f, 0.0f}, {0.0f, 2.0f}};
        for (int s = 0; s < 4; s++) {
            float a = ab[s][0], b = ab[s][1];
            if (b == 0) test_poison(y, n);
            else memcpy(y, y0, n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                want[i] = (float)((double)a * xx[i] + (b != 0 ? (double)b * y0[i] : 0.0));
            CHECK_OK(&ctx, tpk_op_axpby(&ctx, y, a, xx, b, TPK_F32, n));
            double e = test_relerr(y, want, n);
            CHECK(e < 1e-6, "axpby f32 a=%g b=%g: relative error %.3g", a, b, e);
        }
        uint16_t *hx = malloc(n * 2), *hy = malloc(n * 2);
        to_bf16(hx, xx, n), to_bf16(hy, y0, n);
        float *xr = fbuf(n), *yr = fbuf(n);
        from_bf16(xr, hx, n), from_bf16(yr, hy, n);
        CHECK_OK(&ctx, tpk_op_axpby(&ctx, hy, 0.5f, hx, -2.0f, TPK_BF16, n));
        from_bf16(y, hy, n);
        for (size_t i = 0; i < n; i++) want[i] = (float)(0.5 * xr[i] - 2.0 * yr[i]);
        CHECK_CLOSE(y, want, n, 1e-2, "axpby bf16");
        free(xx), free(y0), free(y), free(want), free(hx), free(hy), free(xr), free(yr);
    }

    TEST_CASE("host cast: f32 -> bf16 rounds to nearest even, NaN stays NaN, bf16 -> f32 exact") {
        /* f32 bits -> expected bf16 bits */
        static const uint32_t cases[][2] = {
            {0x3F800000u, 0x3F80u}, /* 1 */
            {0x3F808000u, 0x3F80u}, /* 1 + 2^-8: halfway between 1 and 1 + 2^-7, to even (down) */
            {0x3F818000u, 0x3F82u}, /* 1 + 3 * 2^-8: halfway, to even (up) */
            {0x3F808001u, 0x3F81u}, /* just above halfway: up */
            {0x3F817FFFu, 0x3F81u}, /* just below halfway: down */
            {0xBF818000u, 0xBF82u}, /* -(1 + 3 * 2^-8): halfway, to even, sign kept */
            {0xBF808000u, 0xBF80u}, /* -(1 + 2^-8) */
            {0x40490FDBu, 0x4049u}, /* pi: 0x0FDB < half, down */
            {0x7F7FFFFFu, 0x7F80u}, /* largest finite f32 rounds to +inf */
            {0x7F800000u, 0x7F80u}, /* +inf */
            {0xFF800000u, 0xFF80u}, /* -inf */
            {0x00000000u, 0x0000u}, /* +0 */
            {0x80000000u, 0x8000u}, /* -0 */
            {0x00000001u, 0x0000u}, /* smallest subnormal: down to 0 */
            {0x00018000u, 0x0002u}, /* subnormal halfway, to even (up) */
            {0x00008000u, 0x0000u}, /* subnormal halfway, to even (down) */
            {0x3F7FFFFFu, 0x3F80u}, /* just below 1: carries into the exponent */
        };
        const size_t nc = sizeof cases / sizeof *cases;
        float f[sizeof cases / sizeof *cases];
        uint16_t h[sizeof cases / sizeof *cases + 1];
        for (size_t i = 0; i < nc; i++) f[i] = bits_f32(cases[i][0]);
        h[nc] = 0xABCD;
        CHECK_OK(&ctx, tpk_op_cast(&ctx, h, TPK_BF16, f, TPK_F32, nc));
        for (size_t i = 0; i < nc; i++)
            CHECK(h[i] == cases[i][1], "cast %#010x -> bf16: got %#06x, expected %#06x",
                  cases[i][0], h[i], cases[i][1]);
        CHECK(h[nc] == 0xABCD, "cast wrote past n");

        /* NaNs (including one whose payload is only in the low 16 bits) stay NaN */
        const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FA00000u, 0xFF800100u};
        float fn[5];
        uint16_t hn[5];
        for (int i = 0; i < 5; i++) fn[i] = bits_f32(nans[i]);
        CHECK_OK(&ctx, tpk_op_cast(&ctx, hn, TPK_BF16, fn, TPK_F32, 5));
        for (int i = 0; i < 5; i++) {
            CHECK((hn[i] & 0x7F80u) == 0x7F80u && (hn[i] & 0x007Fu) != 0,
                  "NaN %#010x -> %#06x is not NaN", nans[i], hn[i]);
            CHECK((hn[i] & 0x8000u) == ((nans[i] >> 16) & 0x8000u),
                  "NaN %#010x -> %#06x lost its sign", nans[i], hn[i]);
        }

        /* bf16 -> f32 is exact for all 65536 patterns; f32 -> bf16 gives them back (NaN: a NaN) */
        uint16_t *all = malloc(65536 * 2), *back = malloc(65536 * 2);
        float *wide = fbuf(65536);
        for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
        test_poison(wide, 65536);
        CHECK_OK(&ctx, tpk_op_cast(&ctx, wide, TPK_F32, all, TPK_BF16, 65536));
        size_t bad = 0, badback = 0;
        for (uint32_t i = 0; i < 65536; i++) bad += f32_bits(wide[i]) != i << 16;
        CHECK(bad == 0, "bf16 -> f32: %zu patterns not exact", bad);
        CHECK_OK(&ctx, tpk_op_cast(&ctx, back, TPK_BF16, wide, TPK_F32, 65536));
        for (uint32_t i = 0; i < 65536; i++) {
            bool nan = (i & 0x7F80u) == 0x7F80u && (i & 0x7Fu);
            badback += nan ? !((back[i] & 0x7F80u) == 0x7F80u && (back[i] & 0x7Fu)) : back[i] != i;
        }
        CHECK(badback == 0, "f32 -> bf16 of exact bf16 values: %zu changed", badback);

        /* same dtype = copy, i32 included */
        float fa[5] = {1, -2, 3.25f, 1e-30f, -7}, fb[5];
        test_poison(fb, 5);
        CHECK_OK(&ctx, tpk_op_cast(&ctx, fb, TPK_F32, fa, TPK_F32, 5));
        CHECK(memcmp(fa, fb, sizeof fa) == 0, "cast f32 -> f32 is not a copy");
        int32_t ia[4] = {7, -1, 2147483647, 16777217}, ib[4] = {0};
        CHECK_OK(&ctx, tpk_op_cast(&ctx, ib, TPK_I32, ia, TPK_I32, 4));
        CHECK(memcmp(ia, ib, sizeof ia) == 0, "cast i32 -> i32 is not a copy");
        uint16_t hc[3] = {0x3F80, 0xFFC1, 0x0001}, hd[3] = {0};
        CHECK_OK(&ctx, tpk_op_cast(&ctx, hd, TPK_BF16, hc, TPK_BF16, 3));
        CHECK(memcmp(hc, hd, sizeof hc) == 0, "cast bf16 -> bf16 is not a copy");
        free(all), free(back), free(wide);
    }
}

/* ---- FP8 casts ------------------------------------------------------------------------------ */

/* code c's value, read from the bit layout alone (double): E4M3 (OCP E4M3FN) or E5M2 */
static double fp8_value(int c, tpk_fp8_fmt f) {
    int e4 = f == TPK_E4M3, mb = e4 ? 3 : 2, bias = e4 ? 7 : 15, emax = e4 ? 15 : 31;
    int sgn = c >> 7, E = (c & 0x7f) >> mb, M = c & ((1 << mb) - 1);
    double v;
    if (e4 && E == emax && M == (1 << mb) - 1) return NAN;
    if (!e4 && E == emax) v = M ? NAN : INFINITY;
    else if (E == 0) v = ldexp((double)M, 1 - bias - mb);
    else v = ldexp(1.0 + (double)M / (1 << mb), E - bias);
    return sgn ? -v : v;
}
/* the reference cast: the nearest finite value by search over the 128 non-negative codes, a tie
 * to the even code (its mantissa's last bit 0), |v| >= max saturated, NaN -> 0x7F, the sign kept */
static int fp8_ref(float v, tpk_fp8_fmt f) {
    if (isnan(v)) return 0x7f;
    int sgn = signbit(v) ? 0x80 : 0, best = 0;
    double a = fabs((double)v), mx = f == TPK_E4M3 ? 448.0 : 57344.0;
    if (a >= mx) return sgn | (f == TPK_E4M3 ? 0x7e : 0x7b);
    double bd = INFINITY;
    for (int c = 0; c < 128; c++) {
        double w = fp8_value(c, f);
        if (!isfinite(w)) continue;
        double d = fabs(w - a);
        if (d < bd || (d == bd && !(c & 1))) bd = d, best = c;
    }
    return sgn | best;
}

static void test_fp8_casts(void) {
    TEST_CASE("fp8: every E4M3 and E5M2 code decoded; casts rounded to nearest even, saturated") {
        uint8_t all[256];
        float y[257];
        uint16_t hy[257];
        for (int c = 0; c < 256; c++) all[c] = (uint8_t)c;
        for (int fi = 0; fi < 2; fi++) {
            tpk_fp8_fmt f = fi ? TPK_E5M2 : TPK_E4M3;
            const char *fname = fi ? "e5m2" : "e4m3";
            /* the table: every code, at scale 1 and 0.25 (exact), in f32 and bf16 */
            size_t bad = 0, badh = 0, nnan = 0;
            test_poison(y, 257);
            CHECK_OK(&ctx, tpk_op_fp8_dequant(&ctx, y, TPK_F32, all, 256, 1.0f, f));
            for (int c = 0; c < 256; c++) {
                double w = fp8_value(c, f);
                nnan += isnan(w);
                bad += isnan(w) ? !isnan(y[c]) : (double)y[c] != w || !signbit(y[c]) != !signbit(w);
            }
            CHECK(bad == 0 && isnan(y[256]), "dequant %s: %zu codes wrong (or wrote past n)", fname,
                  bad);
            CHECK(nnan == (fi ? 6u : 2u), "%s: %zu NaN codes in the reference", fname, nnan);
            CHECK(fp8_value(0x7e, TPK_E4M3) == 448 && fp8_value(0x7b, TPK_E5M2) == 57344 &&
                      fp8_value(0x01, TPK_E4M3) == ldexp(1, -9) &&
                      fp8_value(0x01, TPK_E5M2) == ldexp(1, -16) &&
                      isinf(fp8_value(0x7c, TPK_E5M2)),
                  "reference table: max, least subnormal, infinity");
            CHECK_OK(&ctx, tpk_op_fp8_dequant(&ctx, hy, TPK_BF16, all, 256, 0.25f, f));
            for (int c = 0; c < 256; c++) {
                double w = fp8_value(c, f) * 0.25;
                float g = tpk_bf16_to_f32(hy[c]);
                badh += isnan(w) ? !isnan(g) : (double)g != w;
            }
            CHECK(badh == 0, "dequant %s bf16 at scale_inv 0.25: %zu codes wrong", fname, badh);

            /* the casts: every finite value (round trip), midpoints (ties to even) and a step
             * either side of them, beyond max, infinities, NaN, f32 subnormals, random f32s */
            enum { NV = 4096 };
            float *v = fbuf(NV);
            int nv = 0;
            for (int c = 0; c < 256; c++) {
                double w = fp8_value(c, f);
                if (isnan(w)) continue;
                v[nv++] = (float)w;
                if (!isfinite(w) || (c & 0x7f) == (fi ? 0x7b : 0x7e)) continue;
                double w1 = fp8_value(c + 1, f); /* the next code up in magnitude */
                if (!isfinite(w1)) continue;
                float mid = (float)((w + w1) / 2); /* exact in f32 */
                v[nv++] = mid, v[nv++] = nextafterf(mid, 0), v[nv++] = nextafterf(mid, INFINITY);
                v[nv++] = -mid;
            }
            float mx = tpk_fp8_max(f);
            float extra[] = {
                mx * 1.03125f,    mx * 1.0625f, mx * 4, 3e38f, -3e38f,
                INFINITY,         -INFINITY,    NAN,    -NAN,  1e-40f,
                -1e-40f,          1e-45f,       0.0f,   -0.0f, nextafterf(mx, INFINITY),
                nextafterf(mx, 0)};
            for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) v[nv++] = extra[i];
            uint64_t st = 77 + (uint64_t)fi;
            while (nv < NV) { /* log-uniform magnitudes 2^-30 .. 2^20, random signs */
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                double u = (double)(st >> 11) / 9007199254740992.0;
                v[nv++] = (float)((st & 1 ? -1 : 1) * ldexp(1.0, -30) * pow(2.0, 50 * u));
            }
            uint8_t *q = malloc(NV + 1);
            memset(q, 0xA5, NV + 1);
            CHECK_OK(&ctx, tpk_op_fp8_quant(&ctx, q, NULL, v, TPK_F32, NV, 1.0f, f, false));
            size_t badq = 0;
            for (int i = 0; i < NV; i++)
                if (q[i] != fp8_ref(v[i], f)) {
                    if (badq++ < 5)
                        fprintf(stderr, "  %s cast of %a: got %#04x, expected %#04x\n", fname,
                                (double)v[i], q[i], fp8_ref(v[i], f));
                }
            CHECK(badq == 0 && q[NV] == 0xA5, "quant %s: %zu of %d wrong (or wrote past n)", fname,
                  badq, NV);
            /* the scale multiplies first (x scale, rounded in f32, then cast), and the amax of
             * the unscaled x in the same pass: accumulate off (poisoned), on */
            float sc = 3.7f, amax = NAN, want = 0;
            for (int i = 0; i < NV; i++)
                if (isfinite(v[i]) || isinf(v[i])) want = fmaxf(want, fabsf(v[i]));
            CHECK_OK(&ctx, tpk_op_fp8_quant(&ctx, q, &amax, v, TPK_F32, NV, sc, f, false));
            badq = 0;
            for (int i = 0; i < NV; i++) badq += q[i] != fp8_ref(v[i] * sc, f);
            CHECK(badq == 0, "quant %s at scale %g: %zu wrong", fname, (double)sc, badq);
            CHECK(amax == want, "amax %s: got %g, expected %g (NaN ignored, inf kept)", fname,
                  (double)amax, (double)want);
            float small[3] = {0.5f, -2.0f, 1.0f}, am = 7.0f;
            CHECK_OK(&ctx, tpk_op_fp8_quant(&ctx, NULL, &am, small, TPK_F32, 3, 1.0f, f, true));
            CHECK(am == 7.0f, "amax accumulate: got %g, expected 7", (double)am);
            CHECK_OK(&ctx, tpk_op_fp8_quant(&ctx, NULL, &am, small, TPK_F32, 3, 1.0f, f, false));
            CHECK(am == 2.0f, "amax: got %g, expected 2", (double)am);
            CHECK_OK(&ctx, tpk_op_fp8_quant(&ctx, NULL, &am, small, TPK_F32, 0, 1.0f, f, false));
            CHECK(am == 0.0f, "amax of no elements: got %g, expected 0", (double)am);
            /* bf16 input: the same casts of the rounded values; a long run over threads */
            size_t nb = 200000;
            float *xb = fbuf(nb);
            uint16_t *hb = hbuf(nb);
            uint8_t *qb = malloc(nb);
            test_randn(xb, nb, 91 + (uint64_t)fi, fi ? 3000.0f : 30.0f);
            xb[123457] = fi ? -90000.0f : 700.0f;
            to_bf16(hb, xb, nb), from_bf16(xb, hb, nb);
            CHECK_OK(&ctx, tpk_op_fp8_quant(&ctx, qb, &amax, hb, TPK_BF16, nb, 1.0f, f, false));
            badq = 0, want = 0;
            for (size_t i = 0; i < nb; i++)
                badq += qb[i] != fp8_ref(xb[i], f), want = fmaxf(want, fabsf(xb[i]));
            CHECK(badq == 0 && amax == want, "quant %s of bf16: %zu wrong, amax %g (want %g)",
                  fname, badq, (double)amax, (double)want);
            free(xb), free(hb), free(qb), free(q), free(v);
        }
    }
}

OPS_TEST_MAIN(test_bias, test_gelu, test_elementwise, test_fp8_casts)
