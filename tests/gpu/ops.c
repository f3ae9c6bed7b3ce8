/* tests/gpu/ops.c — every CUDA op against the host op on the same random inputs, f32 and bf16:
 * outputs poisoned (NaN) before each run, so an unwritten element fails; relative error < 1e-5
 * where the arithmetic is the same, < 1e-4 where sums are reordered, < 1e-2 for bf16 storage.
 * Also: bad arguments on the CUDA context are refused by the front end (tpk/runtime/op.h), naming
 * them. Runs at one rank; skipped (exit 0) without a GPU. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "gpu_test.h"

static tpk_ctx ch, cd; /* host, CUDA */
static const tpk_dtype dts[2] = {TPK_F32, TPK_BF16};

static void test_elementwise(tpk_dtype dt) {
    const size_t n = 4099;
    TEST_CASE("fill, cast, axpby, gelu, bias [%s]", tpk_dtype_name(dt)) {
        pair y = pair_randn(&cd, n, dt, 1, 1.0f), x = pair_randn(&cd, n, dt, 2, 2.0f);
        pair_poison(&cd, &y);
        CHECK_OK(&ch, ch.ops->fill(&ch, y.h, dt, n, 0.75f));
        CHECK_OK(&cd, cd.ops->fill(&cd, y.d, dt, n, 0.75f));
        pair_check(&cd, &y, TOL_SAME, "fill");
        CHECK_OK(&ch, ch.ops->fill(&ch, y.h, dt, n, 0.0f)); /* zero: cudaMemsetAsync */
        CHECK_OK(&cd, cd.ops->fill(&cd, y.d, dt, n, 0.0f));
        pair_check(&cd, &y, TOL_SAME, "fill 0");
        CHECK_OK(&ch, ch.ops->fill(&ch, y.h, dt, n, -0.0f)); /* -0: the kernel, sign kept */
        CHECK_OK(&cd, cd.ops->fill(&cd, y.d, dt, n, -0.0f));
        pair_check(&cd, &y, TOL_SAME, "fill -0");
        size_t es0 = tpk_dtype_size(dt); /* one element in: not 16-byte aligned, the element-wise
                                            path; the ends kept */
        CHECK_OK(&ch, ch.ops->fill(&ch, (char *)y.h + es0, dt, n - 2, -1.5f));
        CHECK_OK(&cd, cd.ops->fill(&cd, (char *)y.d + es0, dt, n - 2, -1.5f));
        pair_check(&cd, &y, TOL_SAME, "fill unaligned");
        pair_poison(&cd, &y); /* b = 0 ignores NaN in y */
        CHECK_OK(&ch, ch.ops->axpby(&ch, y.h, 1.5f, x.h, 0.0f, dt, n));
        CHECK_OK(&cd, cd.ops->axpby(&cd, y.d, 1.5f, x.d, 0.0f, dt, n));
        pair_check(&cd, &y, tol_for(dt, TOL_SAME), "axpby b=0");
        CHECK_OK(&ch, ch.ops->axpby(&ch, y.h, -0.5f, x.h, 0.25f, dt, n));
        CHECK_OK(&cd, cd.ops->axpby(&cd, y.d, -0.5f, x.d, 0.25f, dt, n));
        pair_check(&cd, &y, tol_for(dt, TOL_SAME), "axpby");
        pair_poison(&cd, &y);
        CHECK_OK(&ch, ch.ops->act_fwd(&ch, TPK_ACT_GELU_TANH, y.h, x.h, dt, n));
        CHECK_OK(&cd, cd.ops->act_fwd(&cd, TPK_ACT_GELU_TANH, y.d, x.d, dt, n));
        pair_check(&cd, &y, tol_for(dt, TOL_SAME), "gelu_fwd");
        pair dy = pair_randn(&cd, n, dt, 3, 1.0f); /* dx aliases dy */
        CHECK_OK(&ch, ch.ops->act_bwd(&ch, TPK_ACT_GELU_TANH, dy.h, x.h, dy.h, dt, n));
        CHECK_OK(&cd, cd.ops->act_bwd(&cd, TPK_ACT_GELU_TANH, dy.d, x.d, dy.d, dt, n));
        pair_check(&cd, &dy, tol_for(dt, TOL_SAME), "gelu_bwd (in place)");
        pair_poison(&cd, &y); /* the exact GELU (erf) */
        CHECK_OK(&ch, ch.ops->act_fwd(&ch, TPK_ACT_GELU, y.h, x.h, dt, n));
        CHECK_OK(&cd, cd.ops->act_fwd(&cd, TPK_ACT_GELU, y.d, x.d, dt, n));
        pair_check(&cd, &y, tol_for(dt, TOL_SAME), "gelu (erf) fwd");
        pair dye = pair_randn(&cd, n, dt, 5, 1.0f);
        CHECK_OK(&ch, ch.ops->act_bwd(&ch, TPK_ACT_GELU, dye.h, x.h, dye.h, dt, n));
        CHECK_OK(&cd, cd.ops->act_bwd(&cd, TPK_ACT_GELU, dye.d, x.d, dye.d, dt, n));
        pair_check(&cd, &dye, tol_for(dt, TOL_SAME), "gelu (erf) bwd (in place)");
        pair_free(&cd, &dye);
        /* TPK_ACT_NONE: y = x, dx = dy (copies: exact; of a fresh dy, the same on both sides — the
         * one above holds the host's and the GPU's GELU backward, a rounding apart) */
        pair_poison(&cd, &y);
        CHECK_OK(&ch, ch.ops->act_fwd(&ch, TPK_ACT_NONE, y.h, x.h, dt, n));
        CHECK_OK(&cd, cd.ops->act_fwd(&cd, TPK_ACT_NONE, y.d, x.d, dt, n));
        pair_check(&cd, &y, 1e-12, "act_fwd none");
        pair dy1 = pair_randn(&cd, n, dt, 4, 1.0f);
        pair_poison(&cd, &y);
        CHECK_OK(&ch, ch.ops->act_bwd(&ch, TPK_ACT_NONE, y.h, x.h, dy1.h, dt, n));
        CHECK_OK(&cd, cd.ops->act_bwd(&cd, TPK_ACT_NONE, y.d, x.d, dy1.d, dt, n));
        pair_check(&cd, &y, 1e-12, "act_bwd none");
        pair_free(&cd, &dy1);
        /* cast to the other float dtype and back */
        tpk_dtype other = dt == TPK_F32 ? TPK_BF16 : TPK_F32;
        pair c = pair_from(&cd, NULL, n, other);
        pair_poison(&cd, &c);
        CHECK_OK(&ch, ch.ops->cast(&ch, c.h, other, x.h, dt, n));
        CHECK_OK(&cd, cd.ops->cast(&cd, c.d, other, x.d, dt, n));
        pair_check(&cd, &c, TOL_SAME, "cast"); /* rounding to nearest even is exact arithmetic */
        /* pointers off the 16-byte grid take the one-element path (n - 1 elements from element
         * 1) */
        size_t es = tpk_dtype_size(dt);
        CHECK_OK(&ch,
                 ch.ops->axpby(&ch, (char *)y.h + es, 0.5f, (char *)x.h + es, 0.5f, dt, n - 1));
        CHECK_OK(&cd,
                 cd.ops->axpby(&cd, (char *)y.d + es, 0.5f, (char *)x.d + es, 0.5f, dt, n - 1));
        pair_check(&cd, &y, tol_for(dt, TOL_SAME), "axpby unaligned");
        CHECK_OK(&ch, ch.ops->act_bwd(&ch, TPK_ACT_GELU_TANH, (char *)y.h + es, (char *)x.h + es,
                                      (char *)y.h + es, dt, n - 1));
        CHECK_OK(&cd, cd.ops->act_bwd(&cd, TPK_ACT_GELU_TANH, (char *)y.d + es, (char *)x.d + es,
                                      (char *)y.d + es, dt, n - 1));
        pair_check(&cd, &y, tol_for(dt, TOL_SAME), "gelu_bwd unaligned");
        /* bias over rows of 64: 8-element vectors */
        pair yv = pair_randn(&cd, (size_t)(67 * 64), dt, 6, 1.0f),
             bv = pair_randn(&cd, 64, dt, 7, 1.0f);
        CHECK_OK(&ch, ch.ops->bias_add(&ch, yv.h, bv.h, 67, 64, dt));
        CHECK_OK(&cd, cd.ops->bias_add(&cd, yv.d, bv.d, 67, 64, dt));
        pair_check(&cd, &yv, tol_for(dt, TOL_SAME), "bias_add (rows of 64)");
        pair_free(&cd, &yv), pair_free(&cd, &bv);
        /* bias over [rows, cols] */
        int64_t rows = 67, cols = 61;
        pair yb = pair_randn(&cd, (size_t)(rows * cols), dt, 4, 1.0f),
             b = pair_randn(&cd, (size_t)cols, dt, 5, 1.0f);
        CHECK_OK(&ch, ch.ops->bias_add(&ch, yb.h, b.h, rows, cols, dt));
        CHECK_OK(&cd, cd.ops->bias_add(&cd, yb.d, b.d, rows, cols, dt));
        pair_check(&cd, &yb, tol_for(dt, TOL_SAME), "bias_add");
        for (int acc = 0; acc < 2; acc++) {
            int64_t r2 = acc ? 600 : 37; /* several row chunks */
            pair dyb = pair_randn(&cd, (size_t)(r2 * cols), dt, 6, 1.0f),
                 db = pair_randn(&cd, (size_t)cols, dt, 7, 1.0f);
            if (!acc) pair_poison(&cd, &db);
            CHECK_OK(&ch, ch.ops->bias_grad(&ch, db.h, dyb.h, r2, cols, dt, dt, acc));
            CHECK_OK(&cd, cd.ops->bias_grad(&cd, db.d, dyb.d, r2, cols, dt, dt, acc));
            pair_check(&cd, &db, tol_for(dt, TOL_SUM), acc ? "bias_grad accumulate" : "bias_grad");
            /* into an f32 db from dt's dy (a bf16 layer's bias gradient into the f32 gradients) */
            pair db32 = pair_randn(&cd, (size_t)cols, TPK_F32, 8, 1.0f);
            if (!acc) pair_poison(&cd, &db32);
            CHECK_OK(&ch, ch.ops->bias_grad(&ch, db32.h, dyb.h, r2, cols, dt, TPK_F32, acc));
            CHECK_OK(&cd, cd.ops->bias_grad(&cd, db32.d, dyb.d, r2, cols, dt, TPK_F32, acc));
            pair_check(&cd, &db32, TOL_SUM,
                       acc ? "bias_grad into f32, accumulate" : "bias_grad into f32");
            pair_free(&cd, &dyb), pair_free(&cd, &db), pair_free(&cd, &db32);
        }
        pair_free(&cd, &y), pair_free(&cd, &x), pair_free(&cd, &dy), pair_free(&cd, &c),
            pair_free(&cd, &yb), pair_free(&cd, &b);
    }
}

static void test_copy_rng_dropout(tpk_dtype dt) {
    TEST_CASE("copy2d, rng_2d, dropout [%s]", tpk_dtype_name(dt)) {
        int64_t rows = 19, cols = 23, lds = 31, ldd = 29;
        pair src = pair_randn(&cd, (size_t)(rows * lds), dt, 8, 1.0f),
             dst = pair_randn(&cd, (size_t)(rows * ldd), dt, 9, 1.0f);
        CHECK_OK(&ch, ch.ops->copy2d(&ch, dst.h, ldd, src.h, lds, rows, cols, dt));
        CHECK_OK(&cd, cd.ops->copy2d(&cd, dst.d, ldd, src.d, lds, rows, cols, dt));
        pair_check(&cd, &dst, TOL_SAME, "copy2d");
        pair x = pair_from(&cd, NULL, (size_t)(rows * cols), dt);
        for (int dist = 0; dist < 2; dist++) {
            pair_poison(&cd, &x);
            CHECK_OK(&ch, ch.ops->rng_2d(&ch, x.h, dt, rows, cols, 100, 5, 40, 42, 77,
                                         (tpk_rng_dist)dist, 0.5f, 2.0f));
            CHECK_OK(&cd, cd.ops->rng_2d(&cd, x.d, dt, rows, cols, 100, 5, 40, 42, 77,
                                         (tpk_rng_dist)dist, 0.5f, 2.0f));
            pair_check(&cd, &x, tol_for(dt, TOL_SAME), dist ? "rng_2d uniform" : "rng_2d normal");
        }
        pair xd = pair_randn(&cd, (size_t)(rows * cols), dt, 10, 1.0f),
             yd = pair_from(&cd, NULL, (size_t)(rows * cols), dt);
        pair_poison(&cd, &yd);
        CHECK_OK(&ch, ch.ops->dropout(&ch, yd.h, xd.h, rows, cols, 64, 3, 7, 0.3f, 11, 12, dt));
        CHECK_OK(&cd, cd.ops->dropout(&cd, yd.d, xd.d, rows, cols, 64, 3, 7, 0.3f, 11, 12, dt));
        pair_check(&cd, &yd, tol_for(dt, TOL_SAME), "dropout");
        CHECK_OK(&ch, ch.ops->dropout(&ch, xd.h, xd.h, rows, cols, 64, 3, 7, 0.3f, 11, 12, dt));
        CHECK_OK(&cd, cd.ops->dropout(&cd, xd.d, xd.d, rows, cols, 64, 3, 7, 0.3f, 11, 12, dt));
        pair_check(&cd, &xd, tol_for(dt, TOL_SAME), "dropout in place");
        /* the aligned geometry (cols, gcols, col0 multiples of 4: 8 elements, two Philox calls, per
         * thread; cols % 8 = 4, so a thread's second 4 start the next row; n % 8 = 4 left one by
         * one) */
        int64_t ar = 37, ac = 36;
        pair xa = pair_randn(&cd, (size_t)(ar * ac), dt, 13, 1.0f),
             ya = pair_from(&cd, NULL, (size_t)(ar * ac), dt);
        pair_poison(&cd, &ya);
        CHECK_OK(&ch, ch.ops->dropout(&ch, ya.h, xa.h, ar, ac, 44, 2, 8, 0.3f, 11, 12, dt));
        CHECK_OK(&cd, cd.ops->dropout(&cd, ya.d, xa.d, ar, ac, 44, 2, 8, 0.3f, 11, 12, dt));
        pair_check(&cd, &ya, tol_for(dt, TOL_SAME), "dropout, aligned geometry");
        pair_free(&cd, &xa), pair_free(&cd, &ya);
        pair_free(&cd, &src), pair_free(&cd, &dst), pair_free(&cd, &x), pair_free(&cd, &xd),
            pair_free(&cd, &yd);
    }
}

static void test_gemm(tpk_dtype dt) {
    TEST_CASE("gemm: transposes, strides, beta, k = 0 [%s]", tpk_dtype_name(dt)) {
        int64_t m = 37, n = 53, k = 71;
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 5;
            pair a = pair_randn(&cd, (size_t)((ta ? k : m) * lda), dt, 20 + t, 1.0f);
            pair b = pair_randn(&cd, (size_t)((tb ? n : k) * ldb), dt, 30 + t, 1.0f);
            pair c = pair_randn(&cd, (size_t)(m * ldc), dt, 40 + t, 1.0f);
            char what[64];
            snprintf(what, sizeof what, "gemm ta=%d tb=%d beta=0.5", ta, tb);
            CHECK_OK(&ch, ch.ops->gemm(&ch, ta, tb, m, n, k, 0.7f, a.h, lda, b.h, ldb, 0.5f, c.h,
                                       ldc, dt));
            CHECK_OK(&cd, cd.ops->gemm(&cd, ta, tb, m, n, k, 0.7f, a.d, lda, b.d, ldb, 0.5f, c.d,
                                       ldc, dt));
            pair_check(&cd, &c, tol_for(dt, TOL_SUM), what);
            pair_poison(&cd, &c); /* beta = 0 ignores NaN in C (the padding stays NaN on both) */
            snprintf(what, sizeof what, "gemm ta=%d tb=%d beta=0", ta, tb);
            CHECK_OK(&ch, ch.ops->gemm(&ch, ta, tb, m, n, k, 1.0f, a.h, lda, b.h, ldb, 0.0f, c.h,
                                       ldc, dt));
            CHECK_OK(&cd, cd.ops->gemm(&cd, ta, tb, m, n, k, 1.0f, a.d, lda, b.d, ldb, 0.0f, c.d,
                                       ldc, dt));
            {
                /* compare the written [m, n] part only */
                size_t nc = (size_t)(m * ldc);
                void *raw = malloc(nc * tpk_dtype_size(dt));
                float *got = malloc(nc * sizeof(float)), *want = malloc(nc * sizeof(float));
                CHECK_OK(&cd, cd.ops->memcpy(&cd, raw, c.d, nc * tpk_dtype_size(dt), TPK_D2H));
                pair_load(got, dt, raw, nc), pair_load(want, dt, c.h, nc);
                for (int64_t i = 0; i < m; i++)
                    CHECK_CLOSE(got + i * ldc, want + i * ldc, (size_t)n, tol_for(dt, TOL_SUM),
                                what);
                free(raw), free(got), free(want);
            }
            pair_free(&cd, &a), pair_free(&cd, &b), pair_free(&cd, &c);
        }
        pair c = pair_randn(&cd, (size_t)(m * n), dt, 50, 1.0f);
        CHECK_OK(&ch, ch.ops->gemm(&ch, false, false, m, n, 0, 1.0f, NULL, 1, NULL, n, 0.5f, c.h, n,
                                   dt));
        CHECK_OK(&cd, cd.ops->gemm(&cd, false, false, m, n, 0, 1.0f, NULL, 1, NULL, n, 0.5f, c.d, n,
                                   dt));
        pair_check(&cd, &c, tol_for(dt, TOL_SAME), "gemm k=0 (C = beta C)");
        pair_free(&cd, &c);
    }
}

/* n FP8 codes of both backends: the device copy downloaded and compared byte for byte with the
 * host's; the mismatches */
static size_t codes_differ(const uint8_t *dev, const uint8_t *host, size_t n) {
    uint8_t *got = malloc(n ? n : 1);
    CHECK_OK(&cd, cd.ops->memcpy(&cd, got, dev, n, TPK_D2H));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != host[i];
    free(got);
    return bad;
}
/* fp8_quant (codes bit for bit, the amax exact, fresh and accumulated, aligned and not, codes or
 * the amax alone), fp8_dequant, and gemm_fp8 on codes: every transpose, packed and strided
 * operands, sizes multiples of 16 (cuBLASLt's FP8 matmul, the operands not in its TN layout
 * transposed first) and not (the bf16 fallback), E4M3 x E4M3, E5M2 x E4M3, E5M2 x E5M2 (the
 * fallback), C in dt, beta 0.5 and 0 (C poisoned) */
static void test_fp8(tpk_dtype dt) {
    TEST_CASE("fp8_quant, fp8_dequant, gemm_fp8 [%s]", tpk_dtype_name(dt)) {
        const size_t n = 4099;
        float *v = malloc(n * sizeof(float));
        test_randn(v, n, 71, 3.0f);
        v[5] = 1e6f, v[6] = -2e5f, v[7] = NAN, v[8] = 1e-9f; /* saturation, NaN, underflow */
        pair x = pair_from(&cd, v, n, dt);
        uint8_t *qh = malloc(n), *qd = NULL;
        float *ah = NULL, *ad = NULL, amh = 0.0f, amd = 0.0f;
        CHECK_OK(&cd, cd.ops->alloc(&cd, n + 16, (void **)&qd));
        CHECK_OK(&cd, cd.ops->alloc(&cd, 16, (void **)&ad));
        ah = malloc(16);
        for (int f = 0; f < 2; f++) {
            tpk_fp8_fmt fmt = f ? TPK_E5M2 : TPK_E4M3;
            for (int off = 0; off < 2; off++) { /* off 1: x and q one element in, unaligned */
                size_t es = tpk_dtype_size(dt), m = n - (size_t)off;
                const char *xh = (const char *)x.h + off * es, *xd = (const char *)x.d + off * es;
                memset(qh, 0xab, n);
                CHECK_OK(&cd, cd.ops->memcpy(&cd, qd, qh, n, TPK_H2D)); /* poison */
                ah[0] = 0.5f;
                CHECK_OK(&cd, cd.ops->memcpy(&cd, ad, ah, 4, TPK_H2D));
                CHECK_OK(&ch, ch.ops->fp8_quant(&ch, qh, ah, xh, dt, m, 37.5f, fmt, false));
                CHECK_OK(&cd, cd.ops->fp8_quant(&cd, qd, ad, xd, dt, m, 37.5f, fmt, false));
                CHECK_OK(&cd, cd.ops->memcpy(&cd, &amd, ad, 4, TPK_D2H));
                size_t bad = codes_differ(qd, qh, m);
                CHECK(bad == 0 && amd == ah[0],
                      "fp8_quant %s off %d: %zu codes differ, amax %g vs %g", f ? "E5M2" : "E4M3",
                      off, bad, (double)amd, (double)ah[0]);
                ah[0] = amh = 2e6f; /* accumulated onto a larger amax, no codes */
                CHECK_OK(&cd, cd.ops->memcpy(&cd, ad, ah, 4, TPK_H2D));
                CHECK_OK(&ch, ch.ops->fp8_quant(&ch, NULL, ah, xh, dt, m, 1.0f, fmt, true));
                CHECK_OK(&cd, cd.ops->fp8_quant(&cd, NULL, ad, xd, dt, m, 1.0f, fmt, true));
                CHECK_OK(&cd, cd.ops->memcpy(&cd, &amd, ad, 4, TPK_D2H));
                CHECK(amd == amh && ah[0] == amh, "fp8_quant accumulate: amax %g, expected %g",
                      (double)amd, (double)amh);
                qh[7 - off] = 0x22; /* NaN's code replaced: NaN compares unequal */
                CHECK_OK(&cd, cd.ops->memcpy(&cd, qd + 7 - off, qh + 7 - off, 1, TPK_H2D));
                pair y = pair_randn(&cd, n, dt, 72, 1.0f);
                pair_poison(&cd, &y);
                CHECK_OK(&ch, ch.ops->fp8_dequant(&ch, y.h, dt, qh, m, 1.0f / 37.5f, fmt));
                CHECK_OK(&cd, cd.ops->fp8_dequant(&cd, y.d, dt, qd, m, 1.0f / 37.5f, fmt));
                y.n = m;
                pair_check(&cd, &y, 1e-12, "fp8_dequant");
                y.n = n;
                pair_free(&cd, &y);
            }
        }
        free(qh), free(ah), free(v), cd.ops->free(&cd, qd), cd.ops->free(&cd, ad);
        pair_free(&cd, &x);
        /* gemm_fp8: (m, n, k, ld pad, fa, fb) */
        static const int64_t shp[][6] = {{48, 32, 64, 0, 0, 0},  {32, 48, 80, 16, 1, 0},
                                         {48, 32, 64, 3, 0, 0},  {37, 53, 71, 2, 1, 0},
                                         {32, 16, 48, 0, 1, 1}};
        for (int c5 = 0; c5 < 5; c5++)
            for (int t = 0; t < 4; t++) {
                bool ta = t & 1, tb = t & 2;
                int64_t m = shp[c5][0], nn = shp[c5][1], k = shp[c5][2], pad = shp[c5][3];
                tpk_fp8_fmt fa = shp[c5][4] ? TPK_E5M2 : TPK_E4M3,
                            fb = shp[c5][5] ? TPK_E5M2 : TPK_E4M3;
                int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : nn) + pad, ldc = nn + pad;
                size_t na = (size_t)((ta ? k : m) * lda), nb = (size_t)((tb ? nn : k) * ldb);
                /* codes: random values quantized by the host op, copied to the device */
                float *va = malloc(na * sizeof(float)), *vb = malloc(nb * sizeof(float));
                test_randn(va, na, 80 + t, 40.0f), test_randn(vb, nb, 90 + t, 40.0f);
                uint8_t *a8 = malloc(na), *b8 = malloc(nb), *a8d = NULL, *b8d = NULL;
                CHECK_OK(&ch, ch.ops->fp8_quant(&ch, a8, NULL, va, TPK_F32, na, 1.0f, fa, false));
                CHECK_OK(&ch, ch.ops->fp8_quant(&ch, b8, NULL, vb, TPK_F32, nb, 1.0f, fb, false));
                CHECK_OK(&cd, cd.ops->alloc(&cd, na, (void **)&a8d));
                CHECK_OK(&cd, cd.ops->alloc(&cd, nb, (void **)&b8d));
                CHECK_OK(&cd, cd.ops->memcpy(&cd, a8d, a8, na, TPK_H2D));
                CHECK_OK(&cd, cd.ops->memcpy(&cd, b8d, b8, nb, TPK_H2D));
                pair c = pair_randn(&cd, (size_t)(m * ldc), dt, 95 + t, 1.0f);
                for (int z = 0; z < 2; z++) { /* beta 0.5, then 0 over a poisoned C */
                    float beta = z ? 0.0f : 0.5f;
                    if (z) pair_poison(&cd, &c);
                    CHECK_OK(&ch, ch.ops->gemm_fp8(&ch, ta, tb, m, nn, k, 1e-3f, a8, fa, lda, b8,
                                                   fb, ldb, beta, c.h, ldc, dt));
                    CHECK_OK(&cd, cd.ops->gemm_fp8(&cd, ta, tb, m, nn, k, 1e-3f, a8d, fa, lda,
                                                   b8d, fb, ldb, beta, c.d, ldc, dt));
                    size_t nc = (size_t)(m * ldc);
                    void *raw = malloc(nc * tpk_dtype_size(dt));
                    float *got = malloc(nc * sizeof(float)), *want = malloc(nc * sizeof(float));
                    CHECK_OK(&cd, cd.ops->memcpy(&cd, raw, c.d, nc * tpk_dtype_size(dt), TPK_D2H));
                    pair_load(got, dt, raw, nc), pair_load(want, dt, c.h, nc);
                    char what[96];
                    snprintf(what, sizeof what, "gemm_fp8 %lldx%lldx%lld pad %lld ta=%d tb=%d %s",
                             (long long)m, (long long)nn, (long long)k, (long long)pad, ta, tb,
                             z ? "beta=0" : "beta=0.5");
                    for (int64_t i = 0; i < m; i++) /* the written [m, n] part */
                        CHECK_CLOSE(got + i * ldc, want + i * ldc, (size_t)nn,
                                    tol_for(dt, TOL_FP8_ACC), what);
                    free(raw), free(got), free(want);
                }
                pair_free(&cd, &c);
                cd.ops->free(&cd, a8d), cd.ops->free(&cd, b8d);
                free(va), free(vb), free(a8), free(b8);
            }
    }
}

/* gemm_acc: A, B in dt into an f32 C (cuBLASLt bf16 x bf16 -> f32, or the fallback kernel's f32
 * output), against the host. C is f32 on both sides and never rounded: TOL_SUM (1e-4) is far below
 * a bf16 rounding (4e-3), and C's values (N(0,1) next to products of size ~8) fail any beta
 * ignored. beta = 0: the [m, n] part of C poisoned (not read); the padding (ldc > n) compared too
 * (not written); one C at a 4-byte offset (the plan's alignment key). */
static void test_gemm_acc(tpk_dtype dt) {
    TEST_CASE("gemm_acc: %s operands into f32 C, transposes, strides, beta 0 / 1 / 0.5, k = 0",
              tpk_dtype_name(dt)) {
        int64_t m = 37, n = 53, k = 71;
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 5,
                    off = t == 3; /* off: C one element in */
            size_t nc = (size_t)(m * ldc + off);
            pair a = pair_randn(&cd, (size_t)((ta ? k : m) * lda), dt, 120 + t, 1.0f);
            pair b = pair_randn(&cd, (size_t)((tb ? n : k) * ldb), dt, 130 + t, 1.0f);
            const float ab[3][2] = {{1.0f, 1.0f}, {0.7f, 0.5f}, {1.0f, 0.0f}};
            for (int s = 0; s < 3; s++) {
                float *v = malloc(nc * sizeof(float));
                test_randn(v, nc, 140 + t, 1.0f);
                if (ab[s][1] == 0.0f)
                    for (int64_t i = 0; i < m; i++) test_poison(v + off + i * ldc, (size_t)n);
                pair c = pair_from(&cd, v, nc, TPK_F32);
                free(v);
                float *hc = (float *)c.h + off, *dc = (float *)c.d + off;
                char what[80];
                snprintf(what, sizeof what, "gemm_acc ta=%d tb=%d alpha=%g beta=%g%s", ta, tb,
                         ab[s][0], ab[s][1], off ? " (C at +4 bytes)" : "");
                CHECK_OK(&ch, ch.ops->gemm_acc(&ch, ta, tb, m, n, k, ab[s][0], a.h, lda, b.h, ldb,
                                               ab[s][1], hc, ldc, dt));
                CHECK_OK(&cd, cd.ops->gemm_acc(&cd, ta, tb, m, n, k, ab[s][0], a.d, lda, b.d, ldb,
                                               ab[s][1], dc, ldc, dt));
                pair_check(&cd, &c, TOL_SUM, what);
                pair_free(&cd, &c);
            }
            pair_free(&cd, &a), pair_free(&cd, &b);
        }
        pair c = pair_randn(&cd, (size_t)(m * n), TPK_F32, 150, 1.0f);
        CHECK_OK(&ch, ch.ops->gemm_acc(&ch, false, false, m, n, 0, 1.0f, NULL, 1, NULL, n, 0.5f,
                                       (float *)c.h, n, dt));
        CHECK_OK(&cd, cd.ops->gemm_acc(&cd, false, false, m, n, 0, 1.0f, NULL, 1, NULL, n, 0.5f,
                                       (float *)c.d, n, dt));
        pair_check(&cd, &c, TOL_SAME, "gemm_acc k=0 (C = beta C)");
        pair_free(&cd, &c);
    }
}

/* gemm_grouped (a loop of the gemm path per group) against the host's: 6 groups, two of 0 rows,
 * each form — y_g = x_g op(W_g) (tw and not, beta 0 with y poisoned, and 0.5), op(W_g) += x_g^T
 * y_g (tw and not; W in dt, and f32 for bf16 operands) — padded leading dimensions compared too */
/* gemm_grouped against the host's, every form, groups of 0 rows; leading dimensions padded off
 * 16 bytes (lay 0: bf16 rows misaligned) or by 8 elements (lay 1). The one-launch path
 * (cublasGemmGroupedBatchedEx) must serve every form whose W is in x's type, f32 at any alignment
 * and bf16 aligned (tpk_cuda_gemm_grouped_launches counts it); a bf16 model's f32 gradients and
 * misaligned bf16 loop over cuBLASLt. Then again with the emulation's grouped GEMM answering
 * NOT_SUPPORTED (TPK_EMU_BLAS_GROUPED=0; no effect on a GPU): the loop, the same results. */
static void test_gemm_grouped(tpk_dtype dt) {
    TEST_CASE("gemm_grouped: forward and both gradient forms, groups of 0 rows, one launch where "
              "cuBLAS's grouped GEMM takes the form [%s]",
              tpk_dtype_name(dt)) {
        enum { G = 6 };
        const int64_t rows[G] = {17, 0, 40, 5, 0, 33};
        int64_t R = 95, n = 24, k = 40;
        for (int path = 0; path < 2; path++) {
            if (path) setenv("TPK_EMU_BLAS_GROUPED", "0", 1);
            for (int lay = 0; lay < 2; lay++) {
                int64_t pad = lay ? 8 : 3, ldx = k + pad, ldy = n + (lay ? 8 : 1);
                pair x = pair_randn(&cd, (size_t)(R * ldx), dt, 160, 1.0f);
                for (int f = 0; f < 6; f++) { /* 0-1: beta 0, 2-3: beta 0.5, 4-5: wgrad */
                    bool tw = f & 1, wgrad = f >= 4;
                    for (int wf = 0; wf < (wgrad && dt == TPK_BF16 ? 2 : 1); wf++) {
                        tpk_dtype w_dt = wf ? TPK_F32 : dt;
                        float beta = f < 2 ? 0.0f : wgrad ? 1.0f : 0.5f;
                        int64_t sr = tw ? n : k, ldw = (tw ? k : n) + (lay ? 8 : 2);
                        float *v = malloc((size_t)(R * ldy) * sizeof(float));
                        test_randn(v, (size_t)(R * ldy), 170 + f, 1.0f);
                        for (int64_t i = 0; i < R && beta == 0.0f; i++) /* not read; the padding
                                                                           kept */
                            test_poison(v + i * ldy, (size_t)n);
                        pair y = pair_from(&cd, v, (size_t)(R * ldy), dt), w[G];
                        free(v);
                        void *wh[G], *wd[G];
                        for (int g = 0; g < G; g++) {
                            w[g] = pair_randn(&cd, (size_t)(sr * ldw), w_dt, 180 + g + f, 1.0f);
                            wh[g] = w[g].h, wd[g] = w[g].d;
                        }
                        unsigned long long l0 = tpk_cuda_gemm_grouped_launches();
                        CHECK_OK(&ch,
                                 ch.ops->gemm_grouped(&ch, wgrad, tw, G, rows, n, k, 0.75f, x.h,
                                                      ldx, wh, ldw, w_dt, beta, y.h, ldy, dt));
                        CHECK_OK(&cd,
                                 cd.ops->gemm_grouped(&cd, wgrad, tw, G, rows, n, k, 0.75f, x.d,
                                                      ldx, wd, ldw, w_dt, beta, y.d, ldy, dt));
                        bool one = w_dt == dt && (dt == TPK_F32 || lay == 1);
                        unsigned long long got = tpk_cuda_gemm_grouped_launches() - l0;
                        char what[128];
                        snprintf(what, sizeof what,
                                 "gemm_grouped wgrad=%d tw=%d beta=%g w %s lay %d (%s)", wgrad, tw,
                                 (double)beta, tpk_dtype_name(w_dt), lay,
                                 got ? "one launch" : "a loop");
                        CHECK(path || got == (one ? 1u : 0u),
                              "%s: %llu grouped launches, expected %d", what, got, (int)one);
                        if (!wgrad) pair_check(&cd, &y, tol_for(dt, TOL_SUM), what);
                        for (int g = 0; g < G && wgrad; g++)
                            pair_check(&cd, &w[g], tol_for(w_dt, TOL_SUM), what);
                        for (int g = 0; g < G; g++) pair_free(&cd, &w[g]);
                        pair_free(&cd, &y);
                    }
                }
                pair_free(&cd, &x);
            }
            if (path) unsetenv("TPK_EMU_BLAS_GROUPED");
        }
    }
}

/* the fused linear forward (cuBLASLt bias / GELU epilogues) against the host's composition,
 * with and without bias and GELU; outputs poisoned first */
static void test_linear_fwd(tpk_dtype dt) {
    TEST_CASE("linear_fwd: x W^T + bias, with the fused GELU and its pre-activation [%s]",
              tpk_dtype_name(dt)) {
        int64_t T = 67, n = 96, k = 80;
        pair x = pair_randn(&cd, (size_t)(T * k), dt, 60, 1.0f),
             w = pair_randn(&cd, (size_t)(n * k), dt, 61, 0.2f);
        pair b = pair_randn(&cd, (size_t)n, dt, 62, 1.0f);
        for (int v = 0; v < 4; v++) {
            bool gelu = v & 1, bias = v & 2;
            pair y = pair_randn(&cd, (size_t)(T * n), dt, 63, 1.0f),
                 pre = pair_randn(&cd, (size_t)(T * n), dt, 64, 1.0f);
            pair_poison(&cd, &y), pair_poison(&cd, &pre);
            char what[64];
            snprintf(what, sizeof what, "linear_fwd gelu=%d bias=%d", gelu, bias);
            CHECK_OK(&ch, tpk_op_linear_fwd(&ch, y.h, pre.h, x.h, w.h, bias ? b.h : NULL, T, n, k,
                                            gelu ? TPK_ACT_GELU_TANH : TPK_ACT_NONE, dt));
            CHECK_OK(&cd, cd.ops->linear_fwd(&cd, y.d, pre.d, x.d, w.d, bias ? b.d : NULL, T, n, k,
                                             gelu ? TPK_ACT_GELU_TANH : TPK_ACT_NONE, dt));
            pair_check(&cd, &y, tol_for(dt, TOL_SUM), what);
            if (gelu) pair_check(&cd, &pre, tol_for(dt, TOL_SUM), "linear_fwd pre-activation");
            pair_free(&cd, &y), pair_free(&cd, &pre);
        }
        pair_free(&cd, &x), pair_free(&cd, &w), pair_free(&cd, &b);
    }
}

/* linear_bwd_act: du = (dy W) gelu'(pre), db = colsum(du) — the fused DGELU(_BGRAD) epilogue
 * reading its aux in the layout the forward's GELU_AUX writes (test_linear_fwd checks that one) —
 * against the host's composition, on the pre-activation of a GELU forward (the host's, on both
 * sides) */
static void test_linear_bwd_act(tpk_dtype dt) {
    TEST_CASE("linear_bwd_act: (dy W) gelu'(pre) and its column sums [%s]", tpk_dtype_name(dt)) {
        int64_t T = 67, n = 96, k = 80; /* the MLP's shapes: n = F_r, k = H */
        pair x = pair_randn(&cd, (size_t)(T * k), dt, 70, 1.0f),
             w1 = pair_randn(&cd, (size_t)(n * k), dt, 71, 0.2f),
             b1 = pair_randn(&cd, (size_t)n, dt, 72, 1.0f);
        pair y = pair_from(&cd, NULL, (size_t)(T * n), dt),
             pre = pair_from(&cd, NULL, (size_t)(T * n), dt);
        CHECK_OK(&ch, tpk_op_linear_fwd(&ch, y.h, pre.h, x.h, w1.h, b1.h, T, n, k,
                                        TPK_ACT_GELU_TANH, dt));
        CHECK_OK(&cd, cd.ops->linear_fwd(&cd, y.d, pre.d, x.d, w1.d, b1.d, T, n, k,
                                         TPK_ACT_GELU_TANH, dt));
        pair_sync_down(&cd, &pre); /* both sides from the same pre-activation (the host's) */
        pair dy = pair_randn(&cd, (size_t)(T * k), dt, 73, 1.0f),
             w2 = pair_randn(&cd, (size_t)(k * n), dt, 74, 0.2f);
        for (int with_db = 0; with_db < 2; with_db++) {
            pair du = pair_from(&cd, NULL, (size_t)(T * n), dt),
                 db = pair_from(&cd, NULL, (size_t)n, dt);
            pair_poison(&cd, &du), pair_poison(&cd, &db);
            CHECK_OK(&ch, tpk_op_linear_bwd_act(&ch, du.h, with_db ? db.h : NULL, dy.h, w2.h, pre.h,
                                                T, n, k, TPK_ACT_GELU_TANH, dt));
            CHECK_OK(&cd, cd.ops->linear_bwd_act(&cd, du.d, with_db ? db.d : NULL, dy.d, w2.d,
                                                 pre.d, T, n, k, TPK_ACT_GELU_TANH, dt));
            pair_check(&cd, &du, tol_for(dt, TOL_SUM),
                       with_db ? "linear_bwd_act du (with db)" : "linear_bwd_act du");
            if (with_db) pair_check(&cd, &db, tol_for(dt, TOL_SUM), "linear_bwd_act db");
            pair_free(&cd, &du), pair_free(&cd, &db);
        }
        pair_free(&cd, &x), pair_free(&cd, &w1), pair_free(&cd, &b1), pair_free(&cd, &y),
            pair_free(&cd, &pre), pair_free(&cd, &dy), pair_free(&cd, &w2);
    }
}

/* n elements at two device addresses, downloaded and compared (relative error < tol) */
static void dev_close(const void *got, const void *want, size_t n, tpk_dtype dt, double tol,
                      const char *what) {
    size_t bytes = n * tpk_dtype_size(dt);
    void *rg = malloc(bytes), *rw = malloc(bytes);
    float *g = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float));
    CHECK_OK(&cd, cd.ops->memcpy(&cd, rg, got, bytes, TPK_D2H));
    CHECK_OK(&cd, cd.ops->memcpy(&cd, rw, want, bytes, TPK_D2H));
    pair_load(g, dt, rg, n), pair_load(w, dt, rw, n);
    CHECK_CLOSE(g, w, n, tol, what);
    free(rg), free(rw), free(g), free(w);
}

/* Each fused cuBLASLt epilogue against the CUDA backend's own composed ops on the same inputs:
 *   linear_fwd      BIAS, GELU_AUX, GELU_AUX_BIAS  = gemm (x W^T) + bias_add + act_fwd
 *   linear_bwd_act  DGELU, DGELU_BGRAD             = gemm (dy W) + act_bwd(pre) + bias_grad
 * (within rounding: the epilogue rounds once, the composition after each op); and, with the bias
 * or the pre-activation one element past a 16-byte boundary, the backend's own composed path
 * (an epilogue needs 16-byte vectors) against the same composition, bit for bit. Outputs
 * poisoned first. x [T, k], W [n, k], pre / du [T, n], dy [T, k2], W2 [k2, n]. */
static void test_epilogues_composed(tpk_dtype dt) {
    TEST_CASE(
        "linear_fwd, linear_bwd_act: each epilogue against gemm + bias_add + act_fwd / act_bwd + "
        "bias_grad on the GPU [%s]",
        tpk_dtype_name(dt)) {
        int64_t T = 67, n = 96, k = 80, k2 = 48;
        /* pad: room for the copies at +1 element */
        size_t es = tpk_dtype_size(dt), tn = (size_t)(T * n), pad = 8;
        pair x = pair_randn(&cd, (size_t)(T * k), dt, 90, 1.0f),
             w = pair_randn(&cd, (size_t)(n * k), dt, 91, 0.2f);
        pair b = pair_randn(&cd, (size_t)n + pad, dt, 92, 1.0f),
             dy = pair_randn(&cd, (size_t)(T * k2), dt, 93, 1.0f);
        pair w2 = pair_randn(&cd, (size_t)(k2 * n), dt, 94, 0.2f),
             pre0 = pair_randn(&cd, tn + pad, dt, 95, 1.5f);
        void *y, *pre, *yc, *prec, *db, *dbc; /* fused, composed: [T, n] + pad (db: [n] + pad) */
        CHECK_OK(&cd, cd.ops->alloc(&cd, (tn + pad) * es, &y));
        CHECK_OK(&cd, cd.ops->alloc(&cd, (tn + pad) * es, &pre));
        CHECK_OK(&cd, cd.ops->alloc(&cd, (tn + pad) * es, &yc));
        CHECK_OK(&cd, cd.ops->alloc(&cd, (tn + pad) * es, &prec));
        CHECK_OK(&cd, cd.ops->alloc(&cd, ((size_t)n + pad) * es, &db));
        CHECK_OK(&cd, cd.ops->alloc(&cd, ((size_t)n + pad) * es, &dbc));
        char what[96];
        for (int off = 0; off < 2; off++) { /* 0: the epilogue; 1: every vector at +1 element: the
                                               backend composes */
            size_t o = (size_t)off * es;
            void *bo = (char *)b.d + o, *yo = (char *)y + o, *po = (char *)pre + o,
                 *yco = (char *)yc + o, *pco = (char *)prec + o;
            /* off: the same calls, so equal bit for bit */
            double tol = off ? 1e-30 : tol_for(dt, TOL_SUM);
            for (int v = 0; v < 4; v++) {
                bool gelu = v & 1, bias = v & 2;
                if (!gelu && !bias) continue; /* no epilogue: a plain gemm (test_gemm) */
                tpk_act act = gelu ? TPK_ACT_GELU_TANH : TPK_ACT_NONE;
                CHECK_OK(&cd, cd.ops->fill(&cd, y, dt, tn + pad, NAN));
                CHECK_OK(&cd, cd.ops->fill(&cd, pre, dt, tn + pad, NAN));
                CHECK_OK(&cd, cd.ops->fill(&cd, yc, dt, tn + pad, NAN));
                CHECK_OK(&cd, cd.ops->fill(&cd, prec, dt, tn + pad, NAN));
                CHECK_OK(&cd, cd.ops->linear_fwd(&cd, yo, po, x.d, w.d, bias ? bo : NULL, T, n, k,
                                                 act, dt));
                void *u = gelu ? pco : yco;
                CHECK_OK(&cd, cd.ops->gemm(&cd, false, true, T, n, k, 1.0f, x.d, k, w.d, k, 0.0f, u,
                                           n, dt));
                if (bias) CHECK_OK(&cd, cd.ops->bias_add(&cd, u, bo, T, n, dt));
                if (gelu) CHECK_OK(&cd, cd.ops->act_fwd(&cd, act, yco, u, dt, tn));
                snprintf(what, sizeof what, "linear_fwd %s%s%s", bias ? "bias" : "",
                         gelu ? (bias ? "+gelu" : "gelu") : "",
                         off ? " (composed: +1 element)" : "");
                dev_close(yo, yco, tn, dt, tol, what);
                if (gelu) dev_close(po, pco, tn, dt, tol, "linear_fwd pre-activation");
            }
            void *p0 = (char *)pre0.d + o, *duo = (char *)y + o, *duco = (char *)yc + o,
                 *dbo = (char *)db + o, *dbco = (char *)dbc + o;
            for (int with_db = 0; with_db < 2; with_db++) {
                CHECK_OK(&cd, cd.ops->fill(&cd, y, dt, tn + pad, NAN));
                CHECK_OK(&cd, cd.ops->fill(&cd, yc, dt, tn + pad, NAN));
                CHECK_OK(&cd, cd.ops->fill(&cd, db, dt, (size_t)n + pad, NAN));
                CHECK_OK(&cd, cd.ops->fill(&cd, dbc, dt, (size_t)n + pad, NAN));
                CHECK_OK(&cd, cd.ops->linear_bwd_act(&cd, duo, with_db ? dbo : NULL, dy.d, w2.d, p0,
                                                     T, n, k2, TPK_ACT_GELU_TANH, dt));
                CHECK_OK(&cd, cd.ops->gemm(&cd, false, false, T, n, k2, 1.0f, dy.d, k2, w2.d, n,
                                           0.0f, duco, n, dt));
                CHECK_OK(&cd, cd.ops->act_bwd(&cd, TPK_ACT_GELU_TANH, duco, p0, duco, dt, tn));
                if (with_db) CHECK_OK(&cd, cd.ops->bias_grad(&cd, dbco, duco, T, n, dt, dt, false));
                snprintf(what, sizeof what, "linear_bwd_act du%s%s",
                         with_db ? " (dgelu_bgrad)" : " (dgelu)",
                         off ? " (composed: +1 element)" : "");
                dev_close(duo, duco, tn, dt, tol, what);
                if (with_db)
                    dev_close(dbo, dbco, (size_t)n, dt, tol,
                              off ? "linear_bwd_act db (composed: +1 element)"
                                  : "linear_bwd_act db");
            }
        }
        void *bufs[] = {y, pre, yc, prec, db, dbc};
        for (int i = 0; i < 6; i++) cd.ops->free(&cd, bufs[i]);
        pair_free(&cd, &x), pair_free(&cd, &w), pair_free(&cd, &b), pair_free(&cd, &dy),
            pair_free(&cd, &w2), pair_free(&cd, &pre0);
    }
}

/* the fused residual + layernorm forward against the host op */
static void test_residual_layernorm(tpk_dtype dt, int64_t rows, int64_t cols) {
    TEST_CASE("residual_layernorm_fwd [%s] %lld x %lld", tpk_dtype_name(dt), (long long)rows,
              (long long)cols) {
        size_t nx = (size_t)(rows * cols);
        pair x = pair_randn(&cd, nx, dt, 65, 2.0f), r = pair_randn(&cd, nx, dt, 66, 1.0f),
             x1 = pair_from(&cd, NULL, nx, dt), y = pair_from(&cd, NULL, nx, dt);
        pair w = pair_randn(&cd, (size_t)cols, TPK_F32, 67, 1.0f),
             b = pair_randn(&cd, (size_t)cols, TPK_F32, 68, 1.0f);
        pair m = pair_from(&cd, NULL, (size_t)rows, TPK_F32),
             rs = pair_from(&cd, NULL, (size_t)rows, TPK_F32);
        pair_poison(&cd, &x1), pair_poison(&cd, &y), pair_poison(&cd, &m), pair_poison(&cd, &rs);
        CHECK_OK(&ch, tpk_op_residual_layernorm_fwd(&ch, x1.h, y.h, (float *)m.h, (float *)rs.h,
                                                    x.h, r.h, (const float *)w.h,
                                                    (const float *)b.h, rows, cols, 1e-5f, dt));
        CHECK_OK(&cd, cd.ops->residual_layernorm_fwd(&cd, x1.d, y.d, (float *)m.d, (float *)rs.d,
                                                     x.d, r.d, (const float *)w.d,
                                                     (const float *)b.d, rows, cols, 1e-5f, dt));
        pair_check(&cd, &x1, tol_for(dt, TOL_SAME), "x1 = x + r");
        pair_check(&cd, &y, tol_for(dt, TOL_SUM), "y");
        pair_check(&cd, &m, TOL_SUM, "mean"), pair_check(&cd, &rs, TOL_SUM, "rstd");
        pair *all[] = {&x, &r, &x1, &y, &w, &b, &m, &rs};
        for (int i = 0; i < 8; i++) pair_free(&cd, all[i]);
    }
}

/* rows of 77 (not a multiple of 8) take the generic kernels; rows of a multiple of 8 up to 4096 the
 * register kernels: 64 and 768 a warp a row (one and three 16-byte vectors a lane), 1000 four
 * vectors a lane with the last lanes idle, 2000 two warps a row, 4096 four; 4000 rows of 64 give
 * 334 chunks of 12 rows, whose column partials are summed in 6 groups of 64; 30000 rows of 8 give
 * 40 groups, more than the final sum's 32 lanes */
static void test_layernorm(tpk_dtype dt, int64_t rows, int64_t cols) {
    TEST_CASE("layernorm fwd/bwd [%s] %lld x %lld", tpk_dtype_name(dt), (long long)rows,
              (long long)cols) {
        size_t nx = (size_t)(rows * cols);
        pair x = pair_randn(&cd, nx, dt, 60, 2.0f), y = pair_from(&cd, NULL, nx, dt);
        pair w = pair_randn(&cd, (size_t)cols, TPK_F32, 61, 1.0f),
             b = pair_randn(&cd, (size_t)cols, TPK_F32, 62, 1.0f);
        pair mean = pair_from(&cd, NULL, (size_t)rows, TPK_F32),
             rstd = pair_from(&cd, NULL, (size_t)rows, TPK_F32);
        pair_poison(&cd, &y), pair_poison(&cd, &mean), pair_poison(&cd, &rstd);
        CHECK_OK(&ch, ch.ops->layernorm_fwd(&ch, y.h, mean.h, rstd.h, x.h, w.h, b.h, rows, cols,
                                            1e-5f, dt));
        CHECK_OK(&cd, cd.ops->layernorm_fwd(&cd, y.d, mean.d, rstd.d, x.d, w.d, b.d, rows, cols,
                                            1e-5f, dt));
        pair_check(&cd, &y, tol_for(dt, TOL_SUM), "layernorm y");
        pair_check(&cd, &mean, TOL_SUM, "layernorm mean");
        pair_check(&cd, &rstd, TOL_SUM, "layernorm rstd");
        /* the same saved statistics for both */
        pair_sync_down(&cd, &mean), pair_sync_down(&cd, &rstd);
        for (int acc = 0; acc < 2; acc++) {
            pair dy = pair_randn(&cd, nx, dt, 63, 1.0f), dx = pair_randn(&cd, nx, dt, 64, 1.0f);
            pair dw = pair_randn(&cd, (size_t)cols, TPK_F32, 65, 1.0f),
                 db = pair_randn(&cd, (size_t)cols, TPK_F32, 66, 1.0f);
            if (!acc) pair_poison(&cd, &dx);
            CHECK_OK(&ch, ch.ops->layernorm_bwd(&ch, dx.h, dw.h, db.h, dy.h, x.h, w.h, mean.h,
                                                rstd.h, rows, cols, dt, acc));
            CHECK_OK(&cd, cd.ops->layernorm_bwd(&cd, dx.d, dw.d, db.d, dy.d, x.d, w.d, mean.d,
                                                rstd.d, rows, cols, dt, acc));
            pair_check(&cd, &dx, tol_for(dt, TOL_SUM),
                       acc ? "layernorm dx accumulate" : "layernorm dx");
            pair_check(&cd, &dw, TOL_SUM, "layernorm dw");
            pair_check(&cd, &db, TOL_SUM, "layernorm db");
            pair_free(&cd, &dy), pair_free(&cd, &dx), pair_free(&cd, &dw), pair_free(&cd, &db);
        }
        pair_free(&cd, &x), pair_free(&cd, &y), pair_free(&cd, &w), pair_free(&cd, &b),
            pair_free(&cd, &mean), pair_free(&cd, &rstd);
    }
}

/* RMSNorm: the layernorm kernels with the mean taken as 0 */
static void test_rmsnorm(tpk_dtype dt, int64_t rows, int64_t cols) {
    TEST_CASE("rmsnorm fwd/bwd [%s] %lld x %lld", tpk_dtype_name(dt), (long long)rows,
              (long long)cols) {
        size_t nx = (size_t)(rows * cols);
        pair x = pair_randn(&cd, nx, dt, 160, 2.0f), y = pair_from(&cd, NULL, nx, dt);
        pair w = pair_randn(&cd, (size_t)cols, TPK_F32, 161, 1.0f),
             rstd = pair_from(&cd, NULL, (size_t)rows, TPK_F32);
        pair_poison(&cd, &y), pair_poison(&cd, &rstd);
        CHECK_OK(&ch, ch.ops->rmsnorm_fwd(&ch, y.h, rstd.h, x.h, w.h, rows, cols, 1e-6f, dt));
        CHECK_OK(&cd, cd.ops->rmsnorm_fwd(&cd, y.d, rstd.d, x.d, w.d, rows, cols, 1e-6f, dt));
        pair_check(&cd, &y, tol_for(dt, TOL_SUM), "rmsnorm y");
        pair_check(&cd, &rstd, TOL_SUM, "rmsnorm rstd");
        pair_sync_down(&cd, &rstd);
        for (int acc = 0; acc < 2; acc++) {
            pair dy = pair_randn(&cd, nx, dt, 163, 1.0f), dx = pair_randn(&cd, nx, dt, 164, 1.0f),
                 dw = pair_randn(&cd, (size_t)cols, TPK_F32, 165, 1.0f);
            if (!acc) pair_poison(&cd, &dx);
            CHECK_OK(&ch, ch.ops->rmsnorm_bwd(&ch, dx.h, dw.h, dy.h, x.h, w.h, rstd.h, rows, cols,
                                              dt, acc));
            CHECK_OK(&cd, cd.ops->rmsnorm_bwd(&cd, dx.d, dw.d, dy.d, x.d, w.d, rstd.d, rows, cols,
                                              dt, acc));
            pair_check(&cd, &dx, tol_for(dt, TOL_SUM),
                       acc ? "rmsnorm dx accumulate" : "rmsnorm dx");
            pair_check(&cd, &dw, TOL_SUM, "rmsnorm dw");
            pair_free(&cd, &dy), pair_free(&cd, &dx), pair_free(&cd, &dw);
        }
        pair_free(&cd, &x), pair_free(&cd, &y), pair_free(&cd, &w), pair_free(&cd, &rstd);
    }
}

/* rows x ld values from seed with the first `cols` columns of each row poisoned (NaN): an op that
 * writes those columns must write all of them and leave the rest as they were */
static pair pair_rows_poisoned(int64_t rows, int64_t ld, int64_t cols, tpk_dtype dt,
                               uint64_t seed) {
    size_t n = (size_t)(rows * ld);
    float *v = (float *)malloc(n * sizeof(float));
    test_randn(v, n, seed, 1.0f);
    for (int64_t i = 0; i < rows; i++) test_poison(v + i * ld, (size_t)cols);
    pair p = pair_from(&cd, v, n, dt);
    free(v);
    return p;
}

/* rope (forward, inverse, strided rows, in place, 8 pairs a thread and one), rope_at (a table's
 * positions; at 0..S-1 rope's bits) and swiglu (forward, backward in place; 8 columns a thread and
 * one) */
static void test_rope_swiglu(tpk_dtype dt) {
    TEST_CASE("rope, swiglu [%s]", tpk_dtype_name(dt)) {
        int64_t rows = 300, S = 37, heads = 3, D = 64, ld = heads * D + 16, F = 200;
        pair x = pair_randn(&cd, (size_t)(rows * ld), dt, 170, 1.0f);
        for (int inv = 0; inv < 2; inv++) {
            /* the heads poisoned, the 16 columns past them not */
            pair y = pair_rows_poisoned(rows, ld, heads * D, dt, 173);
            CHECK_OK(&ch,
                     ch.ops->rope(&ch, y.h, ld, x.h, ld, rows, S, heads, D, 10000.0f, inv, dt));
            CHECK_OK(&cd,
                     cd.ops->rope(&cd, y.d, ld, x.d, ld, rows, S, heads, D, 10000.0f, inv, dt));
            pair_check(&cd, &y, tol_for(dt, TOL_SAME),
                       inv ? "rope inverse (the columns past the heads left as they were)"
                           : "rope");
            pair_free(&cd, &y);
        }
        /* rows of another stride into a packed y: the inverse undoes the forward */
        pair y = pair_rows_poisoned(rows, heads * D, heads * D, dt, 174),
             z = pair_rows_poisoned(rows, ld, heads * D, dt, 175);
        CHECK_OK(&ch, ch.ops->rope(&ch, y.h, heads * D, x.h, ld, rows, S, heads, D, 10000.0f, false,
                                   dt));
        CHECK_OK(&cd, cd.ops->rope(&cd, y.d, heads * D, x.d, ld, rows, S, heads, D, 10000.0f, false,
                                   dt));
        pair_check(&cd, &y, tol_for(dt, TOL_SAME), "rope ldy != ldx");
        CHECK_OK(&ch,
                 ch.ops->rope(&ch, z.h, ld, y.h, heads * D, rows, S, heads, D, 10000.0f, true, dt));
        CHECK_OK(&cd,
                 cd.ops->rope(&cd, z.d, ld, y.d, heads * D, rows, S, heads, D, 10000.0f, true, dt));
        pair_check(&cd, &z, tol_for(dt, TOL_SAME), "rope inverse, ldy != ldx");
        if (dt == TPK_F32) { /* the inverse rotation undoes the forward one: z's heads are x's */
            float *zf = (float *)z.h, *xf = (float *)x.h;
            double e = 0;
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < heads * D; j++)
                    e = fmax(e, fabs(zf[i * ld + j] - xf[i * ld + j]));
            CHECK(e < 1e-5, "rope: inverse(forward(x)) - x = %.3g", e);
        }
        pair_free(&cd, &y), pair_free(&cd, &z);
        CHECK_OK(&ch, ch.ops->rope(&ch, x.h, ld, x.h, ld, rows, S, heads, D, 500.0f, false, dt));
        CHECK_OK(&cd, cd.ops->rope(&cd, x.d, ld, x.d, ld, rows, S, heads, D, 500.0f, false, dt));
        pair_check(&cd, &x, tol_for(dt, TOL_SAME), "rope in place");
        { /* a head dim of 6 in rows of 13 (the table's one-pair path; 8 pairs above) */
            pair x6 = pair_randn(&cd, 50 * 13, dt, 178, 1.0f),
                 y6 = pair_rows_poisoned(50, 13, 12, dt, 179);
            CHECK_OK(&ch, ch.ops->rope(&ch, y6.h, 13, x6.h, 13, 50, 7, 2, 6, 10000.0f, false, dt));
            CHECK_OK(&cd, cd.ops->rope(&cd, y6.d, 13, x6.d, 13, 50, 7, 2, 6, 10000.0f, false, dt));
            pair_check(&cd, &y6, tol_for(dt, TOL_SAME), "rope D = 6, rows of 13");
            pair_free(&cd, &x6), pair_free(&cd, &y6);
        }
        /* rope at a table's positions (context parallelism's rows: two chunks of a sequence of
           1000, npos = 20), forward and inverse, and at the table 0..S-1 rope's bits */
        float posv[40];
        for (int k = 0; k < 20; k++) posv[k] = (float)(k < 10 ? 100 + k : 890 + k - 10);
        pair pos = pair_from(&cd, posv, 20, TPK_I32);
        for (int inv = 0; inv < 2; inv++) {
            pair y = pair_rows_poisoned(rows, ld, heads * D, dt, 176);
            CHECK_OK(&ch, tpk_op_rope_at(&ch, y.h, ld, x.h, ld, rows, (const int32_t *)pos.h, 20,
                                         heads, D, 10000.0f, inv, dt));
            CHECK_OK(&cd, tpk_op_rope_at(&cd, y.d, ld, x.d, ld, rows, (const int32_t *)pos.d, 20,
                                         heads, D, 10000.0f, inv, dt));
            pair_check(&cd, &y, tol_for(dt, TOL_SAME), inv ? "rope_at inverse" : "rope_at");
            pair_free(&cd, &y);
        }
        for (int k = 0; k < 37; k++) posv[k] = (float)k;
        pair iota = pair_from(&cd, posv, 37, TPK_I32),
             ya = pair_rows_poisoned(rows, ld, heads * D, dt, 177),
             yb = pair_rows_poisoned(rows, ld, heads * D, dt, 177);
        CHECK_OK(&cd, tpk_op_rope_at(&cd, ya.d, ld, x.d, ld, rows, (const int32_t *)iota.d, S,
                                     heads, D, 500.0f, false, dt));
        CHECK_OK(&cd, tpk_op_rope(&cd, yb.d, ld, x.d, ld, rows, S, heads, D, 500.0f, false, dt));
        dev_close(ya.d, yb.d, (size_t)(rows * ld), dt, 1e-30, "rope_at at 0..S-1 vs rope (bits)");
        pair_free(&cd, &pos), pair_free(&cd, &iota), pair_free(&cd, &ya), pair_free(&cd, &yb);
        pair_free(&cd, &x);
        for (int f = 0; f < 2; f++) { /* F = 200: 8 columns a thread; 37: one */
            int64_t Ff = f ? 37 : F;
            pair gu = pair_randn(&cd, (size_t)(rows * 2 * Ff), dt, 171, 2.0f),
                 h = pair_from(&cd, NULL, (size_t)(rows * Ff), dt);
            pair dh = pair_randn(&cd, (size_t)(rows * Ff), dt, 172, 1.0f);
            pair_poison(&cd, &h);
            CHECK_OK(&ch, ch.ops->swiglu_fwd(&ch, h.h, gu.h, rows, Ff, dt));
            CHECK_OK(&cd, cd.ops->swiglu_fwd(&cd, h.d, gu.d, rows, Ff, dt));
            pair_check(&cd, &h, tol_for(dt, TOL_SAME), "swiglu_fwd");
            CHECK_OK(&ch, ch.ops->swiglu_bwd(&ch, gu.h, gu.h, dh.h, rows, Ff, dt));
            CHECK_OK(&cd, cd.ops->swiglu_bwd(&cd, gu.d, gu.d, dh.d, rows, Ff, dt));
            pair_check(&cd, &gu, tol_for(dt, TOL_SAME), "swiglu_bwd (in place)");
            pair_free(&cd, &gu), pair_free(&cd, &h), pair_free(&cd, &dh);
        }
    }
}

/* H = 40: 16-byte vectors (5 a row); 37: one element at a time; 2056: vectors, several a thread */
static void test_embed(tpk_dtype dt, int64_t H) {
    TEST_CASE("embedding fwd/bwd (repeated and out-of-range ids) [%s] H = %lld", tpk_dtype_name(dt),
              (long long)H) {
        int64_t T = 700, v0 = 10, vrows = 25;
        float idv[700];
        /* 0..40: some below v0, some past v0 + vrows */
        for (int t = 0; t < T; t++) idv[t] = (float)((t * 7919 + 13) % 41);
        pair ids = pair_from(&cd, idv, (size_t)T, TPK_I32);
        pair E = pair_randn(&cd, (size_t)(vrows * H), TPK_F32, 70, 1.0f);
        for (int acc = 0; acc < 2; acc++) {
            pair y = pair_randn(&cd, (size_t)(T * H), dt, 71, 1.0f);
            if (!acc) pair_poison(&cd, &y);
            CHECK_OK(&ch, ch.ops->embed_fwd(&ch, y.h, (const int32_t *)ids.h, E.h, T, H, v0, vrows,
                                            dt, acc));
            CHECK_OK(&cd, cd.ops->embed_fwd(&cd, y.d, (const int32_t *)ids.d, E.d, T, H, v0, vrows,
                                            dt, acc));
            pair_check(&cd, &y, tol_for(dt, TOL_SAME), acc ? "embed_fwd accumulate" : "embed_fwd");
            pair_free(&cd, &y);
        }
        pair dy = pair_randn(&cd, (size_t)(T * H), dt, 72, 1.0f),
             dE = pair_randn(&cd, (size_t)(vrows * H), TPK_F32, 73, 1.0f);
        CHECK_OK(&ch,
                 ch.ops->embed_bwd(&ch, dE.h, dy.h, (const int32_t *)ids.h, T, H, v0, vrows, dt));
        CHECK_OK(&cd,
                 cd.ops->embed_bwd(&cd, dE.d, dy.d, (const int32_t *)ids.d, T, H, v0, vrows, dt));
        pair_check(&cd, &dE, 1e-7, "embed_bwd (token order: the host's sums exactly)");
        pair_free(&cd, &ids), pair_free(&cd, &E), pair_free(&cd, &dy), pair_free(&cd, &dE);
    }
}

/* Rows moved by an index: 300 indices over 97 rows (-3..101: repeats, -1 and below, past the
 * rows), widths H a multiple of 8 (16-byte vectors) or not, leading dimensions padded (the padding
 * kept: the accumulating scatter's y starts random) or not (outputs poisoned). The gather moves
 * bytes (i32 too); the scatter's, the combine's and dout's sums are the host's in the same order
 * with products and sums rounded apart (no FMA): the same bits; dw's dot products are summed in
 * another order. */
static void test_rows(tpk_dtype dt, int64_t H) {
    TEST_CASE("gather_rows, scatter_add_rows, moe_combine_fwd/bwd (repeats, dropped) [%s] H = %lld",
              tpk_dtype_name(dt), (long long)H) {
        const int64_t XR = 97, n = 300, T = 100, K = 3, ld = H + (H % 8 ? 3 : 8);
        float iv[300];
        for (int i = 0; i < n; i++) iv[i] = (float)((i * 7919 + 13) % 105) - 3.0f;
        iv[7] = -2147483648.0f, iv[8] = 1000.0f;
        pair idx = pair_from(&cd, iv, (size_t)n, TPK_I32);
        const int32_t *ih = (const int32_t *)idx.h, *id = (const int32_t *)idx.d;
        for (int k = 0; k < (dt == TPK_F32 ? 2 : 1); k++) { /* f32: i32 rows too */
            tpk_dtype gt = k ? TPK_I32 : dt;
            pair x = pair_randn(&cd, (size_t)(XR * ld), gt, 80, k ? 1000.0f : 1.0f),
                 y = pair_randn(&cd, (size_t)(n * H), gt, 81, 1.0f);
            pair_poison(&cd, &y);
            CHECK_OK(&ch, ch.ops->gather_rows(&ch, y.h, H, x.h, ld, XR, ih, n, H, gt));
            CHECK_OK(&cd, cd.ops->gather_rows(&cd, y.d, H, x.d, ld, XR, id, n, H, gt));
            pair_check(&cd, &y, 1e-12, k ? "gather_rows i32" : "gather_rows");
            pair_free(&cd, &x), pair_free(&cd, &y);
        }
        pair x = pair_randn(&cd, (size_t)(n * H), dt, 82, 1.0f);
        pair y = pair_randn(&cd, (size_t)(XR * H), dt, 83, 1.0f);
        pair_poison(&cd, &y);
        CHECK_OK(&ch, ch.ops->scatter_add_rows(&ch, y.h, H, XR, x.h, H, ih, n, H, dt, false));
        CHECK_OK(&cd, cd.ops->scatter_add_rows(&cd, y.d, H, XR, x.d, H, id, n, H, dt, false));
        pair_check(&cd, &y, 1e-7, "scatter_add_rows (index order: the host's sums exactly)");
        pair ya = pair_randn(&cd, (size_t)(XR * ld), dt, 84, 1.0f);
        CHECK_OK(&ch, ch.ops->scatter_add_rows(&ch, ya.h, ld, XR, x.h, H, ih, n, H, dt, true));
        CHECK_OK(&cd, cd.ops->scatter_add_rows(&cd, ya.d, ld, XR, x.d, H, id, n, H, dt, true));
        pair_check(&cd, &ya, 1e-7, "scatter_add_rows accumulate, padded");
        pair_free(&cd, &x), pair_free(&cd, &y), pair_free(&cd, &ya);
        /* the combine: T tokens of K entries (the same indices) over XR rows of o */
        pair o = pair_randn(&cd, (size_t)(XR * H), dt, 85, 1.0f),
             w = pair_randn(&cd, (size_t)n, TPK_F32, 86, 1.0f),
             dy = pair_randn(&cd, (size_t)(T * H), dt, 87, 1.0f),
             yc = pair_randn(&cd, (size_t)(T * H), dt, 88, 1.0f),
             dw = pair_randn(&cd, (size_t)n, TPK_F32, 89, 1.0f),
             dout = pair_randn(&cd, (size_t)(XR * H), dt, 90, 1.0f);
        pair_poison(&cd, &yc), pair_poison(&cd, &dw), pair_poison(&cd, &dout);
        CHECK_OK(&ch,
                 ch.ops->moe_combine_fwd(&ch, yc.h, o.h, XR, ih, (const float *)w.h, T, K, H, dt));
        CHECK_OK(&cd,
                 cd.ops->moe_combine_fwd(&cd, yc.d, o.d, XR, id, (const float *)w.d, T, K, H, dt));
        pair_check(&cd, &yc, 1e-7, "moe_combine_fwd (i order, no FMA: the host's bits)");
        CHECK_OK(&ch, ch.ops->moe_combine_bwd(&ch, (float *)dw.h, dout.h, dy.h, o.h, XR, ih,
                                              (const float *)w.h, T, K, H, dt));
        CHECK_OK(&cd, cd.ops->moe_combine_bwd(&cd, (float *)dw.d, dout.d, dy.d, o.d, XR, id,
                                              (const float *)w.d, T, K, H, dt));
        pair_check(&cd, &dw, TOL_SUM, "moe_combine_bwd dw (the dots summed in another order)");
        pair_check(&cd, &dout, 1e-7, "moe_combine_bwd dout (entry order: the host's sums)");
        pair_free(&cd, &o), pair_free(&cd, &w), pair_free(&cd, &dy), pair_free(&cd, &yc);
        pair_free(&cd, &dw), pair_free(&cd, &dout), pair_free(&cd, &idx);
    }
}

/* device bytes of a pair, downloaded */
static void *pair_bytes(pair *p) {
    size_t bytes = (p->n ? p->n : 1) * tpk_dtype_size(p->dt);
    void *raw = malloc(bytes);
    CHECK_OK(&cd, cd.ops->memcpy(&cd, raw, p->d, p->n * tpk_dtype_size(p->dt), TPK_D2H));
    return raw;
}

/* Vl = 517 columns in rows of ld = 576: a padded vocabulary's shard (59 padding columns, 16-byte
 * loads); ld = 517: unpadded. The statistics of two shards of the row (columns [0, h0) and
 * [h0, Vl), as two TP ranks hold them) go through xent_loss with P = 2; the fused op (one rank
 * holding V = Vl of the row) against the host's and, bit for bit, against the three device ops in
 * turn. Vl = 3001 in rows of 3008, h0 = 1504: both shards in 16-byte vectors, one a thread of the
 * 1024 (XENT_THREADS); Vl = 20001 in rows of 20008, h0 = 10004: several vectors a thread. */
static void test_xent(tpk_dtype dt, int64_t ld, int64_t Vl, int64_t h0) {
    TEST_CASE(
        "cross-entropy pieces [%s] %lld columns in rows of %lld: statistics of two shards, loss "
        "over P = 2, gradient, fused",
        tpk_dtype_name(dt), (long long)Vl, (long long)ld) {
        int64_t T = 33, v0 = 100, V = v0 + Vl + 383;
        float yv[33];
        for (int t = 0; t < T; t++)
            yv[t] = t == 5 ? -100.0f
                           : (float)((t * 131 * (V / 1000)) %
                                     V); /* in and out of the shard, one ignored */
        pair y = pair_from(&cd, yv, (size_t)T, TPK_I32),
             z = pair_randn(&cd, (size_t)(T * ld), dt, 80, 3.0f);
        pair part = pair_from(&cd, NULL, (size_t)(8 * T), TPK_F32);
        pair_poison(&cd, &part);
        size_t es = tpk_dtype_size(dt);
        for (int q = 0; q < 2; q++) { /* shard q: columns [q h0, ...) of each row, rows still of
                                         ld */
            int64_t c0 = q ? h0 : 0, n = q ? Vl - h0 : h0;
            CHECK_OK(&ch, ch.ops->xent_stats(&ch, (float *)part.h + 4 * T * q,
                                             (char *)z.h + (size_t)c0 * es, (const int32_t *)y.h, T,
                                             n, ld, v0 + c0, dt));
            CHECK_OK(&cd, cd.ops->xent_stats(&cd, (float *)part.d + 4 * T * q,
                                             (char *)z.d + (size_t)c0 * es, (const int32_t *)y.d, T,
                                             n, ld, v0 + c0, dt));
        }
        pair_check(&cd, &part, TOL_SUM, "xent_stats (max and z_y exact, the sums within f32)");
        pair_sync_down(&cd, &part);
        pair loss = pair_from(&cd, NULL, (size_t)T, TPK_F32),
             lse = pair_from(&cd, NULL, (size_t)T, TPK_F32);
        pair_poison(&cd, &loss), pair_poison(&cd, &lse);
        CHECK_OK(&ch, ch.ops->xent_loss(&ch, loss.h, lse.h, part.h, 2, (const int32_t *)y.h, T, V,
                                        0.1f, -100));
        CHECK_OK(&cd, cd.ops->xent_loss(&cd, loss.d, lse.d, part.d, 2, (const int32_t *)y.d, T, V,
                                        0.1f, -100));
        pair_check(&cd, &loss, TOL_SAME, "xent_loss (P = 2)");
        pair_check(&cd, &lse, TOL_SAME, "xent_loss lse (P = 2)");
        pair dl = pair_randn(&cd, (size_t)T, TPK_F32, 81, 1.0f),
             z2 = pair_from(&cd, NULL, (size_t)(T * ld), dt);
        memcpy(z2.h, z.h, (size_t)(T * ld) * es);
        CHECK_OK(&cd, cd.ops->memcpy(&cd, z2.d, z.d, (size_t)(T * ld) * es, TPK_D2D));
        CHECK_OK(&ch, ch.ops->xent_grad(&ch, z.h, z.h, lse.h, (const int32_t *)y.h, dl.h, T, Vl, ld,
                                        v0, V, 0.1f, -100, dt));
        CHECK_OK(&cd, cd.ops->xent_grad(&cd, z.d, z.d, lse.d, (const int32_t *)y.d, dl.d, T, Vl, ld,
                                        v0, V, 0.1f, -100, dt));
        pair_check(&cd, &z, tol_for(dt, TOL_SAME),
                   "xent_grad (in place, the padding columns zero)");

        /* fused, one rank holding the whole vocabulary V = Vl (targets below Vl): against the host,
         * and against stats, loss, grad apart */
        float yf[33], g = 0.0625f, dg[33];
        for (int t = 0; t < T; t++) yf[t] = t == 7 ? -100.0f : (float)((t * 37) % Vl), dg[t] = g;
        pair yy = pair_from(&cd, yf, (size_t)T, TPK_I32),
             gl = pair_from(&cd, dg, (size_t)T, TPK_F32),
             p1 = pair_from(&cd, NULL, (size_t)(4 * T), TPK_F32);
        pair fl = pair_from(&cd, NULL, (size_t)T, TPK_F32),
             flse = pair_from(&cd, NULL, (size_t)T, TPK_F32),
             fz = pair_from(&cd, NULL, (size_t)(T * ld), dt);
        pair_poison(&cd, &fl), pair_poison(&cd, &flse), pair_poison(&cd, &fz);
        CHECK_OK(&ch, ch.ops->xent_fused(&ch, fz.h, fl.h, flse.h, z2.h, (const int32_t *)yy.h, T,
                                         Vl, ld, 0.1f, -100, g, dt));
        CHECK_OK(&cd, cd.ops->xent_fused(&cd, fz.d, fl.d, flse.d, z2.d, (const int32_t *)yy.d, T,
                                         Vl, ld, 0.1f, -100, g, dt));
        pair_check(&cd, &fl, TOL_SAME, "xent_fused loss");
        pair_check(&cd, &flse, TOL_SAME, "xent_fused lse");
        pair_check(&cd, &fz, tol_for(dt, TOL_SAME), "xent_fused dz (the padding columns zero)");
        CHECK_OK(&cd, cd.ops->xent_stats(&cd, p1.d, z2.d, (const int32_t *)yy.d, T, Vl, ld, 0, dt));
        CHECK_OK(&cd, cd.ops->xent_loss(&cd, loss.d, lse.d, p1.d, 1, (const int32_t *)yy.d, T, Vl,
                                        0.1f, -100));
        CHECK_OK(&cd, cd.ops->xent_grad(&cd, z2.d, z2.d, lse.d, (const int32_t *)yy.d, gl.d, T, Vl,
                                        ld, 0, Vl, 0.1f, -100, dt));
        void *a1 = pair_bytes(&fl), *a2 = pair_bytes(&loss), *b1 = pair_bytes(&flse),
             *b2 = pair_bytes(&lse), *c1 = pair_bytes(&fz), *c2 = pair_bytes(&z2);
        CHECK(memcmp(a1, a2, (size_t)T * 4) == 0 && memcmp(b1, b2, (size_t)T * 4) == 0,
              "xent_fused: loss or lse differs from xent_stats + xent_loss");
        CHECK(memcmp(c1, c2, (size_t)(T * ld) * es) == 0,
              "xent_fused: dz differs from xent_grad's");
        free(a1), free(a2), free(b1), free(b2), free(c1), free(c2);
        pair_free(&cd, &y), pair_free(&cd, &z), pair_free(&cd, &part), pair_free(&cd, &loss),
            pair_free(&cd, &lse), pair_free(&cd, &dl), pair_free(&cd, &z2);
        pair_free(&cd, &yy), pair_free(&cd, &gl), pair_free(&cd, &p1), pair_free(&cd, &fl),
            pair_free(&cd, &flse), pair_free(&cd, &fz);
    }
}

/* The mean loss left on the device: CUDA's fixed tree against the host's ascending sum (both in
 * double, the mean a float: equal up to one float rounding), a poisoned output written, running
 * sums, the same value on a second run (deterministic). */
static void test_xent_mean(void) {
    TEST_CASE(
        "xent_mean: the mean loss in device memory against the host's, running sums, "
        "deterministic") {
        const int64_t Ts[4] = {0, 1, 333, 70000}, counts[4] = {0, 1, 300, 69999};
        for (int c = 0; c < 4; c++) {
            int64_t T = Ts[c], count = counts[c];
            float *l = (float *)malloc(sizeof(float) * (size_t)(T ? T : 1));
            test_randn(l, (size_t)T, 95 + (uint64_t)c, 2.0f);
            for (int64_t t = 0; t < T; t++) l[t] = fabsf(l[t]) + (t % 5 == 0 ? 1e3f : 0.0f);
            pair loss = pair_from(&cd, l, (size_t)T, TPK_F32);
            double *acc_d = NULL, poison = NAN, hacc = NAN, dacc[2] = {0, 0};
            CHECK_OK(&cd, cd.ops->alloc(&cd, sizeof(double), (void **)&acc_d));
            CHECK_OK(&cd, cd.ops->memcpy(&cd, acc_d, &poison, sizeof poison, TPK_H2D));
            CHECK_OK(&ch, ch.ops->xent_mean(&ch, &hacc, (const float *)loss.h, T, count, false));
            for (int run = 0; run < 2; run++) {
                CHECK_OK(&cd,
                         cd.ops->xent_mean(&cd, acc_d, (const float *)loss.d, T, count, false));
                CHECK_OK(&cd, cd.ops->memcpy(&cd, &dacc[run], acc_d, sizeof(double), TPK_D2H));
            }
            CHECK(fabs(dacc[0] - hacc) <= 1.2e-7 * fabs(hacc),
                  "T = %lld: device mean %.9g, host %.9g", (long long)T, dacc[0], hacc);
            CHECK(memcmp(&dacc[0], &dacc[1], sizeof(double)) == 0,
                  "T = %lld: two runs differ: %.17g, %.17g", (long long)T, dacc[0], dacc[1]);
            CHECK_OK(&ch, ch.ops->xent_mean(&ch, &hacc, (const float *)loss.h, T, count, true));
            CHECK_OK(&cd, cd.ops->xent_mean(&cd, acc_d, (const float *)loss.d, T, count, true));
            CHECK_OK(&cd, cd.ops->memcpy(&cd, &dacc[1], acc_d, sizeof(double), TPK_D2H));
            CHECK(dacc[1] == 2.0 * dacc[0], "T = %lld: accumulated %.17g, expected %.17g",
                  (long long)T, dacc[1], 2.0 * dacc[0]);
            cd.ops->free(&cd, acc_d);
            pair_free(&cd, &loss);
            free(l);
        }
    }
}

/* bf16 with D = 64 or 128 runs the tensor-core kernels (kernels/cuda/flash.cuh), bf16 at other
 * head dims without dropout the GEMM path (attn.cu's attn_gemm_*), the rest the generic kernels;
 * S = 45, 130, 200 are not multiples of their 64-row tiles */
static void test_attention(tpk_dtype dt, int64_t D, int64_t S, float p, int64_t A, int64_t G,
                           int64_t Al, int64_t head0) {
    TEST_CASE(
        "attention fwd/bwd D=%lld S=%lld p=%g, heads %lld..%lld of A=%lld over G=%lld key/value "
        "heads [%s]",
        (long long)D, (long long)S, (double)p, (long long)head0, (long long)(head0 + Al - 1),
        (long long)A, (long long)G, tpk_dtype_name(dt)) {
        int64_t B = 2, Gl = tpk_attn_kv_heads(A, G, head0, Al, NULL);
        float scale = 1.0f / sqrtf((float)D);
        size_t nq = (size_t)(B * S * (Al + 2 * Gl) * D), no = (size_t)(B * S * Al * D),
               nl = (size_t)(B * Al * S);
        pair qkv = pair_randn(&cd, nq, dt, 90, 1.0f), out = pair_from(&cd, NULL, no, dt),
             lse = pair_from(&cd, NULL, nl, TPK_F32);
        pair_poison(&cd, &out), pair_poison(&cd, &lse);
        CHECK_OK(&ch, ch.ops->attn_fwd(&ch, out.h, lse.h, qkv.h, B, S, Al, D, A, G, head0, scale, p,
                                       5, 6, dt));
        CHECK_OK(&cd, cd.ops->attn_fwd(&cd, out.d, lse.d, qkv.d, B, S, Al, D, A, G, head0, scale, p,
                                       5, 6, dt));
        pair_check(&cd, &out, tol_for(dt, TOL_SUM), "attn_fwd out");
        pair_check(&cd, &lse, tol_for(dt, TOL_SUM), "attn_fwd lse");
        pair_sync_down(&cd, &out), pair_sync_down(&cd, &lse);
        pair dout = pair_randn(&cd, no, dt, 91, 1.0f), dqkv = pair_from(&cd, NULL, nq, dt);
        pair_poison(&cd, &dqkv);
        CHECK_OK(&ch, ch.ops->attn_bwd(&ch, dqkv.h, dout.h, qkv.h, out.h, lse.h, B, S, Al, D, A, G,
                                       head0, scale, p, 5, 6, dt));
        /* by default (tensor cores: dQ added by the dK/dV kernel with f32 atomics) and
         * deterministic (tensor cores: a dQ kernel of its own), each poisoned and checked against
         * the host */
        size_t bytes = nq * tpk_dtype_size(dt);
        unsigned char *first = (unsigned char *)malloc(bytes),
                      *second = (unsigned char *)malloc(bytes);
        for (int det = 0; det < 2; det++) {
            cd.deterministic = det;
            memset(first, 0xff, bytes); /* NaN in f32 and bf16 */
            CHECK_OK(&cd, cd.ops->memcpy(&cd, dqkv.d, first, bytes, TPK_H2D));
            CHECK_OK(&cd, cd.ops->attn_bwd(&cd, dqkv.d, dout.d, qkv.d, out.d, lse.d, B, S, Al, D, A,
                                           G, head0, scale, p, 5, 6, dt));
            pair_check(&cd, &dqkv, tol_for(dt, TOL_SUM),
                       det ? "attn_bwd dqkv (deterministic)" : "attn_bwd dqkv");
        }
        /* deterministic: a second run gives the same bits */
        CHECK_OK(&cd, cd.ops->memcpy(&cd, first, dqkv.d, bytes, TPK_D2H));
        CHECK_OK(&cd, cd.ops->attn_bwd(&cd, dqkv.d, dout.d, qkv.d, out.d, lse.d, B, S, Al, D, A, G,
                                       head0, scale, p, 5, 6, dt));
        CHECK_OK(&cd, cd.ops->memcpy(&cd, second, dqkv.d, bytes, TPK_D2H));
        CHECK(memcmp(first, second, bytes) == 0, "attn_bwd: two deterministic runs differ");
        cd.deterministic = false;
        free(first), free(second);
        pair_free(&cd, &qkv), pair_free(&cd, &out), pair_free(&cd, &lse), pair_free(&cd, &dout),
            pair_free(&cd, &dqkv);
    }
}

/* n f32 values at a device address against the host's where -inf must match -inf (an lse's rows
 * that see no key), the rest by relative error */
static void lse_close(const float *got_d, const float *want, size_t n, double tol,
                      const char *what) {
    float *g = malloc(n * sizeof(float)), *gf = malloc(n * sizeof(float)),
          *wf = malloc(n * sizeof(float));
    CHECK_OK(&cd, cd.ops->memcpy(&cd, g, got_d, n * sizeof(float), TPK_D2H));
    size_t bad = 0;
    for (size_t k = 0; k < n; k++) {
        bool gi = g[k] == -INFINITY, wi = want[k] == -INFINITY;
        bad += gi != wi;
        gf[k] = gi ? 0.0f : g[k], wf[k] = wi ? 0.0f : want[k];
    }
    CHECK(bad == 0, "%s: %zu rows -inf on one side only", what, bad);
    CHECK_CLOSE(gf, wf, n, tol, what);
    free(g), free(gf), free(wf);
}

/* One block geometry of an attention over CP (tpk_attn_blk): Sq queries at q0 against two key
 * blocks (Sk1 at k1, Sk2 at k2), strided buffers (ld past the heads), grouped-query heads
 * head0.. of A over G, dropout p at batch index 1 of a sequence of S. */
typedef struct blk_case {
    int64_t D, Sq, q0, Sk1, k1, Sk2, k2, A, G, Al, head0, S;
    bool causal;
    float p;
} blk_case;

/* D, Sq, q0, Sk1, k1, Sk2, k2, A, G, Al, head0, S, causal, p */
static const blk_case blk_cases[3] = {
    {64, 40, 120, 40, 0, 40, 120, 4, 4, 2, 1, 160, true, 0.1f},   /* earlier chunk, diagonal */
    {40, 37, 0, 50, 5, 5, 0, 6, 2, 3, 2, 60, true, 0.0f},         /* rows seeing none at first */
    {16, 45, 100, 70, 0, 33, 200, 8, 1, 4, 4, 240, false, 0.2f}}; /* no mask, one key/value head */

/* attn_block_fwd on the first key block (merge = false: out, lse poisoned), merged with the
 * second, then attn_block_bwd of both blocks from the merged out (in dt) and lse, adding into dq
 * and each block's dkv (which hold random values first): CUDA against the host */
static void test_attn_block(tpk_dtype dt, blk_case c) {
    TEST_CASE("attn_block_fwd/bwd D=%lld Sq=%lld at %lld vs %lld at %lld and %lld at %lld %s "
              "p=%g, heads %lld..%lld of A=%lld over G=%lld [%s]",
              (long long)c.D, (long long)c.Sq, (long long)c.q0, (long long)c.Sk1, (long long)c.k1,
              (long long)c.Sk2, (long long)c.k2, c.causal ? "causal" : "no mask", (double)c.p,
              (long long)c.head0, (long long)(c.head0 + c.Al - 1), (long long)c.A, (long long)c.G,
              tpk_dtype_name(dt)) {
        int64_t D = c.D, Gl = tpk_attn_kv_heads(c.A, c.G, c.head0, c.Al, NULL), AD = c.Al * D;
        tpk_attn_blk b;
        memset(&b, 0, sizeof b);
        b.Sq = c.Sq, b.q0 = c.q0, b.causal = c.causal, b.Al = c.Al, b.D = D, b.A = c.A;
        b.G = c.G, b.head0 = c.head0, b.scale = 1.0f / sqrtf((float)D);
        b.ldq = (c.Al + 2 * Gl) * D + 8, b.lddq = AD + 5, b.ldkv = 2 * Gl * D + 3;
        b.ldo = AD + 4, b.ldl = c.Sq + 3;
        b.p = c.p, b.seed = 11, b.stream = 12, b.b = 1, b.S = c.S;
        int64_t ks[2] = {c.Sk1, c.Sk2}, k0s[2] = {c.k1, c.k2};
        pair q = pair_randn(&cd, (size_t)(c.Sq * b.ldq), dt, 180, 1.0f),
             kv[2] = {pair_randn(&cd, (size_t)(c.Sk1 * b.ldkv), dt, 181, 1.0f),
                      pair_randn(&cd, (size_t)(c.Sk2 * b.ldkv), dt, 182, 1.0f)},
             out = pair_rows_poisoned(c.Sq, b.ldo, AD, TPK_F32, 183),
             lse = pair_rows_poisoned(c.Al, b.ldl, c.Sq, TPK_F32, 184);
        size_t nl = (size_t)(c.Al * b.ldl);
        for (int k = 0; k < 2; k++) {
            b.Sk = ks[k], b.k0 = k0s[k];
            CHECK_OK(&ch, tpk_op_attn_block_fwd(&ch, (float *)out.h, (float *)lse.h, q.h, kv[k].h,
                                                &b, k > 0, dt));
            CHECK_OK(&cd, tpk_op_attn_block_fwd(&cd, (float *)out.d, (float *)lse.d, q.d, kv[k].d,
                                                &b, k > 0, dt));
            pair_check(&cd, &out, tol_for(dt, TOL_SUM),
                       k ? "attn_block_fwd out (merged)" : "attn_block_fwd out");
            lse_close((const float *)lse.d, (const float *)lse.h, nl, tol_for(dt, TOL_SUM),
                      k ? "attn_block_fwd lse (merged)" : "attn_block_fwd lse");
        }
        /* the whole attention's out in dt and lse: the host's, on both sides */
        pair_sync_down(&cd, &lse);
        pair ow = pair_from(&cd, (const float *)out.h, out.n, dt),
             dout = pair_randn(&cd, out.n, dt, 185, 1.0f),
             dq = pair_randn(&cd, (size_t)(c.Sq * b.lddq), TPK_F32, 186, 1.0f);
        for (int k = 0; k < 2; k++) {
            b.Sk = ks[k], b.k0 = k0s[k];
            pair dkv = pair_randn(&cd, (size_t)(ks[k] * b.ldkv), TPK_F32, 187 + (uint64_t)k, 1.0f);
            CHECK_OK(&ch, tpk_op_attn_block_bwd(&ch, (float *)dq.h, (float *)dkv.h, dout.h, ow.h,
                                                (const float *)lse.h, q.h, kv[k].h, &b, dt));
            CHECK_OK(&cd, tpk_op_attn_block_bwd(&cd, (float *)dq.d, (float *)dkv.d, dout.d, ow.d,
                                                (const float *)lse.d, q.d, kv[k].d, &b, dt));
            pair_check(&cd, &dkv, tol_for(dt, TOL_SUM),
                       k ? "attn_block_bwd dkv (second block)" : "attn_block_bwd dkv");
            pair_free(&cd, &dkv);
        }
        pair_check(&cd, &dq, tol_for(dt, TOL_SUM), "attn_block_bwd dq (both blocks)");
        pair_free(&cd, &q), pair_free(&cd, &kv[0]), pair_free(&cd, &kv[1]), pair_free(&cd, &out),
            pair_free(&cd, &lse), pair_free(&cd, &ow), pair_free(&cd, &dout), pair_free(&cd, &dq);
    }
}

/* The profiler on the CUDA backend: ops timed by CUDA events in stream order, read at the step's
 * end. */
static void test_profiler(void) {
    TEST_CASE(
        "profiler on the CUDA backend: CUDA events around each op, times read when the step "
        "closes") {
        int64_t m = 512, n = 512, k = 512;
        pair a = pair_randn(&cd, (size_t)(m * k), TPK_BF16, 95, 1.0f),
             b = pair_randn(&cd, (size_t)(k * n), TPK_BF16, 96, 1.0f);
        pair c = pair_from(&cd, NULL, (size_t)(m * n), TPK_BF16);
        CHECK(cd.ops->timer_mark && cd.ops->timer_ms, "the CUDA table has the timer entries");
        CHECK_OK(&cd, tpk_profile_start(&cd));
        for (int step = 0; step < 3; step++) {
            for (int i = 0; i < 4; i++)
                CHECK_OK(&cd, tpk_op_gemm(&cd, false, false, m, n, k, 1.0f, a.d, k, b.d, n, 0.0f,
                                          c.d, n, TPK_BF16));
            CHECK_OK(&cd, tpk_op_fill(&cd, c.d, TPK_BF16, (size_t)(m * n), 0.5f));
            CHECK_OK(&cd, tpk_profile_step(&cd));
        }
        const tpk__prof_row *g = NULL, *f = NULL;
        for (int i = 0; i < cd.prof->nrows; i++) {
            if (!strcmp(cd.prof->rows[i].name, "gemm")) g = &cd.prof->rows[i];
            if (!strcmp(cd.prof->rows[i].name, "fill")) f = &cd.prof->rows[i];
        }
        CHECK(g && g->calls == 12 && g->ms > 0 && g->flops == 12 * 2.0 * m * n * k,
              "gemm: %llu calls, %g ms", g ? (unsigned long long)g->calls : 0ULL, g ? g->ms : -1);
        CHECK(f && f->calls == 3 && f->ms > 0, "fill: %llu calls",
              f ? (unsigned long long)f->calls : 0ULL);
        CHECK(g && g->ms / 12 < cd.prof->wall_ms / 3, "a GEMM takes less than its step");
        CHECK_OK(&cd, tpk_profile_print(&cd, stdout));
        tpk_profile_stop(&cd);
        pair_free(&cd, &a), pair_free(&cd, &b), pair_free(&cd, &c);
    }
}

static void test_optimizer(void) {
    TEST_CASE("adamw, sumsq") {
        size_t n = 10007;
        pair w = pair_randn(&cd, n, TPK_F32, 100, 1.0f), g = pair_randn(&cd, n, TPK_F32, 101, 1.0f);
        pair m = pair_randn(&cd, n, TPK_F32, 102, 0.1f), v = pair_randn(&cd, n, TPK_F32, 103, 0.1f);
        float *vh = (float *)v.h;
        for (size_t i = 0; i < n; i++) vh[i] = fabsf(vh[i]);
        pair_sync_down(&cd, &v);
        int64_t runs[6] = {3, 100, 500, 501, 2000, (int64_t)n},
                *runs_d = NULL; /* decayed: three runs; step 3 everywhere */
        CHECK_OK(&cd, cd.ops->alloc(&cd, sizeof runs, (void **)&runs_d));
        CHECK_OK(&cd, cd.ops->memcpy(&cd, runs_d, runs, sizeof runs, TPK_H2D));
        /* steps 1, 2 on decayed runs, 3 everywhere; 4 clipped from a sum of squares in device
         * memory, 5 with an infinite one (skipped) */
        double *nd = NULL, nh[2] = {0, 0};
        CHECK_OK(&cd, cd.ops->alloc(&cd, 2 * sizeof(double), (void **)&nd));
        /* the bf16 copy of the weights written by steps 3..5 (5 is skipped: it stays); step 2 on
         * the elements from 1 on (every pointer 4 bytes past 16-byte alignment: the unvectorised
         * kernel) */
        pair w16 = pair_from(&cd, NULL, n, TPK_BF16);
        pair_poison(&cd, &w16);
        for (int step = 1; step <= 5; step++) {
            size_t o = step == 2;
            uint16_t *h16 = step >= 3 ? (uint16_t *)w16.h : NULL,
                     *d16 = step >= 3 ? (uint16_t *)w16.d : NULL;
            double *nhp = step < 4 ? NULL : nh, *ndp = step < 4 ? NULL : nd;
            if (step >= 4) {
                CHECK_OK(&ch, ch.ops->sumsq(&ch, nh, g.h, n, false));
                CHECK_OK(&cd, cd.ops->sumsq(&cd, nd, g.d, n, false));
            }
            if (step == 5) {
                double inf = INFINITY;
                nh[0] = inf;
                CHECK_OK(&cd, cd.ops->memcpy(&cd, nd, &inf, sizeof inf, TPK_H2D));
            }
            CHECK_OK(&ch,
                     ch.ops->adamw(&ch, (float *)w.h + o, (float *)g.h + o, (float *)m.h + o,
                                   (float *)v.h + o, n - o, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step,
                                   0.5f, nhp, 1.0f, step < 3 ? runs : NULL, step < 3 ? 3 : 0, h16));
            CHECK_OK(&cd, cd.ops->adamw(&cd, (float *)w.d + o, (float *)g.d + o, (float *)m.d + o,
                                        (float *)v.d + o, n - o, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                        step, 0.5f, ndp, 1.0f, step < 3 ? runs_d : NULL,
                                        step < 3 ? 3 : 0, d16));
        }
        /* on each side every element of the copy is bf16 of that side's weights (the weights agree
         * to TOL_SAME below; a last-bit difference may round the two sides' copies apart) */
        float *wd = (float *)malloc(n * sizeof(float));
        uint16_t *d16 = (uint16_t *)malloc(n * sizeof(uint16_t));
        CHECK_OK(&cd, cd.ops->memcpy(&cd, wd, w.d, n * sizeof(float), TPK_D2H));
        CHECK_OK(&cd, cd.ops->memcpy(&cd, d16, w16.d, n * sizeof(uint16_t), TPK_D2H));
        int bad16 = 0, badd16 = 0;
        for (size_t i = 0; i < n; i++) {
            bad16 += ((uint16_t *)w16.h)[i] != tpk_f32_to_bf16(((float *)w.h)[i]);
            badd16 += d16[i] != tpk_f32_to_bf16(wd[i]);
        }
        CHECK(bad16 == 0 && badd16 == 0,
              "adamw's bf16 copy: %d (host), %d (device) of %zu elements are not bf16(w)", bad16,
              badd16, n);
        free(wd), free(d16);
        pair_free(&cd, &w16);
        cd.ops->free(&cd, runs_d);
        pair_check(&cd, &w, TOL_SAME, "adamw w (clipped at step 4, step 5 skipped)");
        pair_check(&cd, &m, TOL_SAME, "adamw m");
        pair_check(&cd, &v, TOL_SAME, "adamw v");
        double got[2] = {0, 0};
        CHECK_OK(&cd, cd.ops->memcpy(&cd, got, nd, sizeof got, TPK_D2H));
        CHECK(nh[1] == 1 && got[1] == 1, "skipped steps: host %g, device %g, expected 1", nh[1],
              got[1]);
        double sh = -1, sd = -2, *sdd = nd;
        CHECK_OK(&ch, ch.ops->sumsq(&ch, &sh, g.h, n, false));
        CHECK_OK(&cd, cd.ops->sumsq(&cd, sdd, g.d, n, false));
        /* accumulated: the first 1000 again */
        CHECK_OK(&cd, cd.ops->sumsq(&cd, sdd, g.d, 1000, true));
        CHECK_OK(&ch, ch.ops->sumsq(&ch, &sh, g.h, 1000, true));
        CHECK_OK(&cd, cd.ops->memcpy(&cd, &sd, sdd, sizeof sd, TPK_D2H));
        CHECK(fabs(sh - sd) <= 1e-12 * fabs(sh), "sumsq: %.17g vs %.17g", sd, sh);
        CHECK_OK(&ch, ch.ops->sumsq(&ch, &sh, (const float *)g.h + 1, n - 1,
                                    false)); /* 4 bytes past alignment: element by element */
        CHECK_OK(&cd, cd.ops->sumsq(&cd, sdd, (const float *)g.d + 1, n - 1, false));
        CHECK_OK(&cd, cd.ops->memcpy(&cd, &sd, sdd, sizeof sd, TPK_D2H));
        CHECK(fabs(sh - sd) <= 1e-12 * fabs(sh), "sumsq from element 1: %.17g vs %.17g", sd, sh);
        cd.ops->free(&cd, nd);
        pair_free(&cd, &w), pair_free(&cd, &g), pair_free(&cd, &m), pair_free(&cd, &v);
    }
}

static void test_errors(void) {
    TEST_CASE(
        "bad arguments on the CUDA context: refused by the front end (tpk_op_*), the argument "
        "named") {
        void *p = NULL;
        CHECK_OK(&cd, tpk_op_alloc(&cd, 1024, &p));
        CHECK_FAILS(&cd,
                    tpk_op_gemm(&cd, false, false, 4, 4, 4, 1.0f, p, 3, p, 4, 0.0f, p, 4, TPK_F32),
                    TPK_ERR_ARG, "lda");
        CHECK_FAILS(&cd,
                    tpk_op_gemm(&cd, false, false, 4, 4, 4, 1.0f, p, 4, p, 4, 0.0f, p, 4, TPK_I32),
                    TPK_ERR_DTYPE, "dt");
        CHECK_FAILS(&cd, tpk_op_dropout(&cd, p, p, 2, 2, 2, 0, 0, 1.0f, 0, 0, TPK_F32), TPK_ERR_ARG,
                    "p:");
        CHECK_FAILS(&cd, tpk_op_layernorm_fwd(&cd, p, p, p, p, p, p, 2, 0, 1e-5f, TPK_F32),
                    TPK_ERR_ARG, "cols");
        CHECK_FAILS(&cd,
                    tpk_op_attn_fwd(&cd, p, p, p, 1, 4, 2, 8, 2, 2, 1, 1.0f, 0.0f, 0, 0, TPK_F32),
                    TPK_ERR_ARG, "head0");
        CHECK_FAILS(&cd, tpk_op_xent_loss(&cd, p, p, p, 1, p, 2, 0, 0.0f, -100), TPK_ERR_ARG, "V:");
        CHECK_FAILS(&cd,
                    tpk_op_adamw(&cd, p, p, p, p, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0, 1.0f, NULL,
                                 0.0f, NULL, 0, NULL),
                    TPK_ERR_ARG, "step");
        CHECK_FAILS(&cd, tpk_op_memcpy(&cd, p, NULL, 4, TPK_D2D), TPK_ERR_ARG, "src");
        CHECK_FAILS(&cd, tpk_op_act_fwd(&cd, (tpk_act)9, p, p, TPK_F32, 4), TPK_ERR_ARG, "act:");
        CHECK_FAILS(&cd, tpk_op_xent_grad(&cd, p, p, p, p, p, 2, 2, 2, 0, 2, 1.5f, -100, TPK_F32),
                    TPK_ERR_ARG, "smoothing");
    }
    TEST_CASE(
        "the CUDA backend's own limits (head dim, grid, 32-bit sort keys): refused before a "
        "launch, named") {
        void *p = NULL;
        CHECK_OK(&cd, tpk_op_alloc(&cd, 1024, &p));
        /* valid for the front end; the buffers are never touched */
        CHECK_FAILS(&cd,
                    tpk_op_attn_fwd(&cd, p, p, p, 1, 1, 1, 600, 1, 1, 0, 1.0f, 0.0f, 0, 0, TPK_F32),
                    TPK_ERR_UNSUPPORTED, "cuda.attn_fwd: D: head dims up to 512");
        CHECK_FAILS(
            &cd,
            tpk_op_attn_bwd(&cd, p, p, p, p, p, 70000, 1, 1, 8, 1, 1, 0, 1.0f, 0.0f, 0, 0, TPK_F32),
            TPK_ERR_ARG, "cuda.attn_bwd: B: expected <= 65535");
        CHECK_FAILS(&cd,
                    tpk_op_attn_fwd(&cd, p, p, p, 1, 1, 70000, 8, 70000, 70000, 0, 1.0f, 0.0f, 0, 0,
                                    TPK_F32),
                    TPK_ERR_ARG, "Al: expected <= 65535");
        CHECK_FAILS(&cd,
                    tpk_op_attn_fwd(&cd, p, p, p, 1, 1, 1, 8, (int64_t)1 << 31, (int64_t)1 << 31, 0,
                                    1.0f, 0.0f, 0, 0, TPK_F32),
                    TPK_ERR_ARG, "cuda.attn_fwd: A: expected <= 2147483647");
        CHECK_FAILS(&cd, tpk_op_xent_stats(&cd, p, p, p, (int64_t)1 << 31, 1, 1, 0, TPK_F32),
                    TPK_ERR_ARG, "cuda.xent_stats: T: expected <= 2147483647");
        CHECK_FAILS(&cd,
                    tpk_op_xent_fused(&cd, p, p, p, p, p, (int64_t)1 << 31, 1, 1, 0.0f, -100, 1.0f,
                                      TPK_F32),
                    TPK_ERR_ARG, "cuda.xent_fused: T: expected <= 2147483647");
        CHECK_FAILS(&cd, tpk_op_embed_bwd(&cd, p, p, p, 4, 1, 0, (int64_t)1 << 32, TPK_F32),
                    TPK_ERR_ARG, "cuda.embed_bwd: vrows");
        tpk_op_free(&cd, p);
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    gpu_require("tests/gpu/ops");
    if (test_host_ctx(&ch) != TPK_OK) return 1;
    tpk_comm self_d = tpk_comm_self_cuda();
    if (tpk_ctx_init(&cd, &(tpk_ctx_desc){.ops = tpk_ops_cuda(), .world = &self_d}) != TPK_OK) {
        fprintf(stderr, "tpk_ctx_init (cuda): %s\n", tpk_last_error(&cd));
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        tpk_dtype dt = dts[k];
        test_elementwise(dt);
        test_copy_rng_dropout(dt);
        test_gemm(dt);
        test_gemm_grouped(dt);
        test_gemm_acc(dt);
        test_fp8(dt);
        test_linear_fwd(dt);
        test_linear_bwd_act(dt);
        test_epilogues_composed(dt);
        test_residual_layernorm(dt, 300, 77);
        test_residual_layernorm(dt, 100, 768);
        test_residual_layernorm(dt, 30, 2048);
        test_layernorm(dt, 300, 77);
        test_layernorm(dt, 40, 2000);
        test_layernorm(dt, 1000, 768);
        test_layernorm(dt, 4000, 64);
        test_layernorm(dt, 29, 1000);
        test_layernorm(dt, 20, 4096);
        test_layernorm(dt, 30000, 8);
        test_embed(dt, 40);
        test_embed(dt, 37);
        test_embed(dt, 2056);
        test_rows(dt, 40);
        test_rows(dt, 37);
        test_rows(dt, 2056);
        test_xent(dt, 576, 517, 258);
        test_xent(dt, 517, 517, 258);
        test_xent(dt, 3008, 3001, 1504);
        test_xent(dt, 20008, 20001, 10004);
        /* more rows than a block's share: a width off the register kernels' (not a multiple of 8),
         * so the column-sum chunks of 256 rows run (a block strides over several under
         * TPK_EMU_GRID_CAP=3), and 9000 rows, more than two waves of 132 blocks */
        test_layernorm(dt, 800, 1540);
        test_layernorm(dt, 9000, 40);
        test_attention(dt, 16, 45, 0.0f, 5, 5, 2, 2);
        test_attention(dt, 64, 45, 0.0f, 5, 5, 2, 2);
        test_attention(dt, 64, 130, 0.2f, 5, 5, 2, 2);
        test_attention(dt, 128, 200, 0.0f, 5, 5, 2, 2);
        test_attention(dt, 128, 45, 0.1f, 5, 5, 2, 2);
        test_attention(dt, 40, 45, 0.1f, 5, 5, 2, 2); /* D not a multiple of 32 */
        test_attention(dt, 64, 130, 0.0f, 6, 2, 3, 2);  /* grouped-query: heads 2..4 over key/value
                                                           heads 0 and 1 */
        test_attention(dt, 128, 100, 0.1f, 8, 1, 4, 4); /* every query head reads the one key/value
                                                           head */
        test_attention(dt, 40, 70, 0.0f, 6, 3, 4, 1);   /* grouped, heads 1..4 of 3 groups: the
                                                           GEMM path in bf16, generic in f32 */
        test_attention(dt, 64, 200, 0.2f, 4, 1, 4, 0);  /* all four query heads over one key/value
                                                           head, dropout */
        test_attention(dt, 128, 130, 0.0f, 4, 2, 2, 1); /* heads 1, 2: one query head per key/value
                                                           head, a group cut by the split */
        test_attention(dt, 64, 64, 0.1f, 6, 2, 3, 3);   /* heads 3..5: the second key/value head
                                                           alone, read by all three */
        test_attention(dt, 64, 333, 0.1f, 4, 2, 4, 0);  /* several 128-row blocks and 64-row tiles,
                                                           the last ones partial */
        /* head dim 256 (Pythia 1B's): bf16 through GEMMs, once in chunks of 48 query rows
           (TPK_ATTN_GEMM_ROWS: 48, 48, 34 of 130), grouped-query with a group cut by the split;
           with dropout the generic kernels */
        test_attention(dt, 256, 130, 0.0f, 4, 4, 2, 1);
        setenv("TPK_ATTN_GEMM_ROWS", "48", 1);
        test_attention(dt, 256, 130, 0.0f, 8, 2, 5, 2);
        unsetenv("TPK_ATTN_GEMM_ROWS");
        test_attention(dt, 256, 45, 0.1f, 4, 4, 2, 0);
        /* attention over CP's blocks: a rank's later query chunk against an earlier key chunk and
           the diagonal; keys after some queries (rows that see none in the first block); no mask;
           grouped-query heads, dropout, D not a multiple of 32 */
        for (int k = 0; k < 3; k++) test_attn_block(dt, blk_cases[k]);
        test_rmsnorm(dt, 300, 77);
        test_rmsnorm(dt, 40, 2000);
        test_rmsnorm(dt, 1000, 768);
        test_rmsnorm(dt, 20, 4096);
        test_rope_swiglu(dt);
    }
    test_xent_mean();
    test_optimizer();
    test_profiler();
    test_errors();
    CHECK_OK(&cd, cd.ops->sync(&cd));
    tpk_ctx_destroy(&ch), tpk_ctx_destroy(&cd);
    return test_finish();
}
