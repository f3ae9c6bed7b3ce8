/* tests/test_ops_rng.c — the host backend's random numbers (kernels/host/rng.c): rng_2d (moments,
 * sharded draws equal to the whole call's) and dropout (identity at p = 0, the mask formula with
 * row/col offsets, sub-blocks equal to the full call bitwise, the drop rate, aliasing, bf16).
 * Runs on one rank. */
#include "ops_test.h"

/* ---- rng ----------------------------------------------------------------------------------- */

static void test_rng(void) {
    TEST_CASE(
        "host rng_2d: normal and uniform moments, a + b draw, sub-blocks equal the full draw") {
        const int64_t rows = 250, cols = 400; /* 1e5 draws */
        const size_t n = (size_t)(rows * cols);
        float *x = fbuf(n);
        test_poison(x, n);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, x, TPK_F32, rows, cols, cols, 0, 0, 42, 7,
                                     TPK_RNG_NORMAL, 0.0f, 1.0f));
        double s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
        double mean = s / n, sd = sqrt(s2 / n - mean * mean);
        CHECK(fabs(mean) < 0.02 && fabs(sd - 1) < 0.02, "normal: mean %.4f std %.4f", mean, sd);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += x[i] != tpk_rng_normal(42, 7, i);
        CHECK(bad == 0, "normal: %zu draws differ from tpk_rng_normal", bad);

        test_poison(x, n);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, x, TPK_F32, rows, cols, cols, 0, 0, 42, 8,
                                     TPK_RNG_UNIFORM, 0.0f, 1.0f));
        double lo = 1, hi = 0;
        s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) {
            lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
            s += x[i], s2 += (double)x[i] * x[i];
            bad += !(x[i] >= 0.0f && x[i] < 1.0f);
        }
        mean = s / n, sd = sqrt(s2 / n - mean * mean);
        CHECK(bad == 0, "uniform: %zu draws outside [0, 1) (min %g max %g)", bad, lo, hi);
        CHECK(fabs(mean - 0.5) < 0.01 && fabs(sd - sqrt(1.0 / 12)) < 0.01,
              "uniform: mean %.4f std %.4f", mean, sd);

        /* a + b draw */
        float *ref = fbuf(n);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, x, TPK_F32, rows, cols, cols, 0, 0, 3, 9, TPK_RNG_NORMAL,
                                     2.0f, 0.02f));
        for (size_t i = 0; i < n; i++)
            ref[i] = (float)(2.0 + 0.02 * (double)tpk_rng_normal(3, 9, i));
        CHECK_CLOSE(x, ref, n, 1e-6, "a + b * normal");

        /* shards: [r0, r0 + sr) x [c0, c0 + sc) of the full [rows, cols] draw, bitwise */
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, ref, TPK_F32, rows, cols, cols, 0, 0, 11, 12,
                                     TPK_RNG_NORMAL, 0.5f, 0.1f));
        const int64_t blocks[][4] = {{0, 0, 250, 400},
                                     {0, 133, 250, 134},
                                     {17, 0, 5, 400},
                                     {101, 257, 33, 143},
                                     {249, 399, 1, 1}};
        for (int bi = 0; bi < 5; bi++) {
            int64_t r0 = blocks[bi][0], c0 = blocks[bi][1], sr = blocks[bi][2], sc = blocks[bi][3];
            float *blk = fbuf((size_t)(sr * sc));
            test_poison(blk, (size_t)(sr * sc));
            CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, blk, TPK_F32, sr, sc, cols, r0, c0, 11, 12,
                                         TPK_RNG_NORMAL, 0.5f, 0.1f));
            size_t diff = 0;
            for (int64_t i = 0; i < sr; i++)
                for (int64_t j = 0; j < sc; j++)
                    diff += f32_bits(blk[i * sc + j]) != f32_bits(ref[(r0 + i) * cols + c0 + j]);
            CHECK(diff == 0,
                  "block rows %lld+%lld cols %lld+%lld: %zu elements differ from the full draw",
                  (long long)r0, (long long)sr, (long long)c0, (long long)sc, diff);
            free(blk);
        }

        /* bf16 draws are the f32 draws rounded */
        uint16_t *h = malloc(n * 2);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, h, TPK_BF16, rows, cols, cols, 0, 0, 11, 12,
                                     TPK_RNG_NORMAL, 0.5f, 0.1f));
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += h[i] != tpk_f32_to_bf16(ref[i]);
        CHECK(bad == 0, "bf16 rng: %zu elements are not the rounded f32 draws", bad);
        free(x), free(ref), free(h);
    }
}


/* ---- dropout ------------------------------------------------------------------------------- */

static void test_dropout(void) {
    TEST_CASE(
        "the dropout draw: Philox4x32-10 known answers; dropout_u(i) = output i %% 4 of call i / "
        "4; parameter draws unchanged") {
        /* Random123's known-answer vectors (counter, key) -> output: key = seed, counter = (index,
         * stream) */
        static const uint64_t kat[3][3] = {
            {0, 0, 0},
            {~0ull, ~0ull, ~0ull},
            {0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull}};
        static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                            {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                            {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
        for (int k = 0; k < 3; k++) {
            tpk_u32x4 r = tpk_philox(kat[k][0], kat[k][1], kat[k][2]);
            CHECK(!memcmp(r.v, want[k], sizeof r.v), "philox known answer %d: %08x %08x %08x %08x",
                  k, r.v[0], r.v[1], r.v[2], r.v[3]);
        }
        size_t bad = 0, bad4 = 0, badp = 0;
        const uint64_t seed = 0x1234567890abcull, stream = 0xfeedull << 40;
        for (uint64_t i = 0; i < 4096; i++) {
            /* the low and a high index range (64-bit counters) */
            uint64_t idx = i < 2048 ? i : (1ull << 40) - 2048 + i;
            bad += tpk_dropout_u(seed, stream, idx) != test_dropout_u(seed, stream, idx);
            bad4 += tpk_rng_uniform4(seed, stream, idx >> 2).v[idx & 3] !=
                    test_dropout_u(seed, stream, idx);
            /* parameters and rng_2d keep one call per element, output 0 */
            badp += tpk_rng_uniform(seed, stream, idx) !=
                    (float)(tpk_philox(seed, stream, idx).v[0] >> 8) / 16777216.0f;
        }
        CHECK(
            bad == 0 && bad4 == 0,
            "%zu tpk_dropout_u, %zu tpk_rng_uniform4 draws differ from output i %% 4 of call i / 4",
            bad, bad4);
        CHECK(badp == 0, "%zu tpk_rng_uniform draws are not output 0 of call i", badp);
    }
    TEST_CASE(
        "layers dropout f32: p = 0 identity; p = 0.3 mask formula, values, drop rate, sub-blocks, "
        "aliasing") {
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
        CHECK_OK(&ctx,
                 tpk_op_dropout(&ctx, y, x, rows, cols, cols, 0, 0, 0.0f, seed, stream, TPK_F32));
        CHECK(bitdiff(y, x, n) == 0, "p = 0: %zu elements differ from x", bitdiff(y, x, n));

        /* p = 0.3: y = 0 where dropout_u(index) < p, else x / (1 - p) */
        test_poison(y, n);
        CHECK_OK(&ctx,
                 tpk_op_dropout(&ctx, y, x, rows, cols, cols, 0, 0, p, seed, stream, TPK_F32));
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
        CHECK(badmask == 0, "p = 0.3: %zu elements where (y == 0) is not the mask uniform < p",
              badmask);
        CHECK(badval == 0, "p = 0.3: %zu elements neither 0 nor x / (1 - p)", badval);
        CHECK_CLOSE(y, want, n, TOL_F32, "dropout p = 0.3 vs x keep / (1 - p)");
        double frac = (double)dropped / (double)n;
        CHECK(fabs(frac - p) < 0.01, "dropped fraction %.4f, expected %.2f +- 0.01", frac,
              (double)p);

        /* shards: block [r0, r0 + sr) x [c0, c0 + sc) with row0/col0 offsets = that block of the
         * full call */
        const int64_t blocks[][4] = {{0, 0, 250, 400},
                                     {17, 133, 5, 100},
                                     {0, 399, 250, 1},
                                     {249, 0, 1, 400},
                                     {101, 257, 33, 143}};
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
            CHECK_OK(&ctx,
                     tpk_op_dropout(&ctx, yb, xb, sr, sc, cols, r0, c0, p, seed, stream, TPK_F32));
            CHECK(bitdiff(yb, ref, nb) == 0,
                  "block rows %lld+%lld cols %lld+%lld: %zu elements differ from the full call",
                  (long long)r0, (long long)sr, (long long)c0, (long long)sc, bitdiff(yb, ref, nb));
            free(xb), free(yb), free(ref);
        }

        /* a block of a wider tensor: index (row0 + i) * gcols + col0 + j, checked directly */
        {
            const int64_t br = 7, bc = 9, gcols = 1000, row0 = 3, col0 = 500;
            float yb[7 * 9], wb[7 * 9];
            test_poison(yb, 63);
            CHECK_OK(&ctx, tpk_op_dropout(&ctx, yb, x, br, bc, gcols, row0, col0, p, seed, stream,
                                          TPK_F32));
            for (int64_t i = 0; i < br; i++)
                for (int64_t j = 0; j < bc; j++) {
                    bool keep = test_dropout_u(seed, stream,
                                               (uint64_t)((row0 + i) * gcols + col0 + j)) >= p;
                    wb[i * bc + j] =
                        keep ? (float)((double)x[i * bc + j] / (1.0 - (double)p)) : 0.0f;
                }
            CHECK_CLOSE(yb, wb, 63, TOL_F32, "dropout block rows 3+7, cols 500+9 of gcols 1000");
            size_t zw = 0, zg = 0;
            for (int k = 0; k < 63; k++) zw += wb[k] == 0.0f, zg += yb[k] == 0.0f;
            CHECK(zw == zg, "block: %zu zeros, reference %zu", zg, zw);
        }

        /* another stream is another mask */
        test_poison(z, n);
        CHECK_OK(&ctx,
                 tpk_op_dropout(&ctx, z, x, rows, cols, cols, 0, 0, p, seed, stream + 1, TPK_F32));
        CHECK(bitdiff(z, y, n) > n / 10, "stream + 1 changed only %zu elements", bitdiff(z, y, n));

        /* y aliasing x */
        memcpy(z, x, n * sizeof(float));
        CHECK_OK(&ctx,
                 tpk_op_dropout(&ctx, z, z, rows, cols, cols, 0, 0, p, seed, stream, TPK_F32));
        CHECK(bitdiff(z, y, n) == 0, "in place (y == x): %zu elements differ from out of place",
              bitdiff(z, y, n));

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
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, hy, hx, rows, cols, cols + 5, 2, 4, p, seed, stream,
                                      TPK_BF16));
        from_bf16(got, hy, n);
        size_t badmask = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                size_t k = (size_t)(i * cols + j);
                bool keep =
                    test_dropout_u(seed, stream, (uint64_t)((2 + i) * (cols + 5) + 4 + j)) >= p;
                want[k] = keep ? (float)((double)x[k] / (1.0 - (double)p)) : 0.0f;
                badmask += (got[k] == 0.0f) == keep;
            }
        CHECK(badmask == 0, "bf16: %zu elements where (y == 0) is not the mask", badmask);
        CHECK_CLOSE(got, want, n, TOL_BF16, "dropout bf16");
        memcpy(hz, hx, n * 2);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, hz, hz, rows, cols, cols + 5, 2, 4, p, seed, stream,
                                      TPK_BF16));
        CHECK(memcmp(hz, hy, n * 2) == 0, "bf16 in place differs from out of place");
        /* p = 0 in bf16: the identity, bitwise */
        poison_bf16(hy, n);
        CHECK_OK(&ctx, tpk_op_dropout(&ctx, hy, hx, rows, cols, cols, 0, 0, 0.0f, seed, stream,
                                      TPK_BF16));
        CHECK(memcmp(hx, hy, n * 2) == 0, "bf16 p = 0 is not the identity");
        free(x), free(got), free(want), free(hx), free(hy), free(hz);
    }

    TEST_CASE("layers dropout: bad arguments fail naming them") {
        float a[16] = {0}, b[16] = {0};
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, 1.0f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "p: expected 0 <= p < 1, got 1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, -0.1f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "p: expected 0 <= p < 1, got -0.1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, NAN, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "p: expected 0 <= p < 1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 4, 0, 2, 0.5f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "gcols: expected >= col0 + cols = 5");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 2, 0, 0, 0.5f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "gcols: expected >= col0 + cols = 3");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, -1, 0, 0.5f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "row0");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, -1, 0.5f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "col0");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, -1, 3, 3, 0, 0, 0.5f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "rows: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, NULL, 2, 3, 3, 0, 0, 0.5f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, NULL, a, 2, 3, 3, 0, 0, 0.5f, 1, 1, TPK_F32),
                    TPK_ERR_ARG, "y: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_dropout(&ctx, b, a, 2, 3, 3, 0, 0, 0.5f, 1, 1, TPK_I32),
                    TPK_ERR_DTYPE, "tpk_op_dropout: dt:");
    }
}

OPS_TEST_MAIN(test_rng, test_dropout)
