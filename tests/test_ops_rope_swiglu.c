/* tests/test_ops_rope_swiglu.c — the host backend's Llama ops (kernels/host/rope_swiglu.c, and
 * RMSNorm of kernels/host/norm.c) against double references: RoPE forward and inverse (at row
 * mod S, and at a table's positions: rope_at), SwiGLU forward and backward, RMSNorm forward and
 * backward. Runs on one rank. */
#include "ops_test.h"

/* ---- rotary embedding, SwiGLU, RMSNorm (Llama) ----------------------------------------------- */

/* y = rope(x) in double: rows [rows, ld], heads of D at h D, position i mod S, or (pos) pos[i mod
 * S] */
static void rope_ref_at(const float *x, int64_t ld, int64_t rows, const int32_t *pos, int64_t S,
                        int64_t heads, int64_t D, double theta, bool inverse, double *y) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t j = 0; j < D / 2; j++) {
                double s = pos ? (double)pos[i % S] : (double)(i % S);
                double a = s * pow(theta, -2.0 * (double)j / (double)D), c = cos(a),
                       n = inverse ? -sin(a) : sin(a);
                double x1 = x[i * ld + h * D + j], x2 = x[i * ld + h * D + j + D / 2];
                y[i * heads * D + h * D + j] = x1 * c - x2 * n;
                y[i * heads * D + h * D + j + D / 2] = x2 * c + x1 * n;
            }
}
static void rope_ref(const float *x, int64_t ld, int64_t rows, int64_t S, int64_t heads, int64_t D,
                     double theta, bool inverse, double *y) {
    rope_ref_at(x, ld, rows, NULL, S, heads, D, theta, inverse, y);
}
/* RMSNorm in double: y, rstd; with dy: dx and dw */
static void rms_ref(const float *x, const float *w, const float *dy, int64_t rows, int64_t cols,
                    double eps, double *y, double *rstd, double *dx, double *dw) {
    for (int64_t j = 0; dw && j < cols; j++) dw[j] = 0;
    for (int64_t i = 0; i < rows; i++) {
        double ss = 0, gx = 0;
        for (int64_t j = 0; j < cols; j++) ss += (double)x[i * cols + j] * x[i * cols + j];
        double r = 1.0 / sqrt(ss / (double)cols + eps);
        rstd[i] = r;
        for (int64_t j = 0; j < cols; j++) y[i * cols + j] = x[i * cols + j] * r * w[j];
        if (!dy) continue;
        for (int64_t j = 0; j < cols; j++)
            gx += (double)dy[i * cols + j] * w[j] * x[i * cols + j] * r;
        for (int64_t j = 0; j < cols; j++) {
            double xh = x[i * cols + j] * r;
            dx[i * cols + j] = r * (dy[i * cols + j] * w[j] - xh * gx / (double)cols);
            dw[j] += dy[i * cols + j] * xh;
        }
    }
}
static double silu_d(double g) { return g / (1.0 + exp(-g)); }

static void test_llama_ops(void) {
    TEST_CASE(
        "layers rope f32/bf16: the rotate-half formula per position, inverse undoes it, in place, "
        "strided rows, columns past the heads untouched") {
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
                for (int c = 0; c < NH * D; c++)
                    w[i * NH * D + c] = y[i * LD + c], nan_inside += isnan(y[i * LD + c]);
                for (int c = NH * D; c < LD; c++) written_outside += !isnan(y[i * LD + c]);
            }
            float wr[R * NH * D];
            d2f(wr, ref, R * NH * D);
            CHECK_CLOSE(w, wr, R * NH * D, 1e-6, inv ? "inverse rope vs double" : "rope vs double");
            CHECK(nan_inside == 0 && written_outside == 0,
                  "%zu heads' elements unwritten, %zu columns past the heads written", nan_inside,
                  written_outside);
        }
        CHECK_OK(&ctx, tpk_op_rope(&ctx, y, LD, x, LD, R, S, NH, D, 100.0f, false, TPK_F32));
        memcpy(back, y, sizeof back);
        CHECK_OK(&ctx, tpk_op_rope(&ctx, back, LD, back, LD, R, S, NH, D, 100.0f, true,
                                   TPK_F32)); /* in place */
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

    TEST_CASE("layers rope_at f32/bf16: each row at its table's position pos[i mod npos] (a CP "
              "rank's two chunks), inverse undoes it, in place; the table 0..S-1 gives rope's "
              "bits") {
        enum { R = 12, NP = 6, NH = 2, D = 6, LD = NH * D + 3 };
        const int32_t pos[NP] = {2, 3, 4, 13, 14, 15}, iota[NP] = {0, 1, 2, 3, 4, 5};
        float x[R * LD], y[R * LD], w[R * NH * D], wr[R * NH * D], back[R * LD];
        double ref[R * NH * D];
        test_randn(x, R * LD, 1205, 1.0f);
        for (int inv = 0; inv < 2; inv++) {
            test_poison(y, R * LD);
            CHECK_OK(&ctx,
                     tpk_op_rope_at(&ctx, y, LD, x, LD, R, pos, NP, NH, D, 500.0f, inv, TPK_F32));
            rope_ref_at(x, LD, R, pos, NP, NH, D, 500.0, inv, ref);
            size_t written_outside = 0;
            for (int i = 0; i < R; i++) {
                for (int c = 0; c < NH * D; c++) w[i * NH * D + c] = y[i * LD + c];
                for (int c = NH * D; c < LD; c++) written_outside += !isnan(y[i * LD + c]);
            }
            d2f(wr, ref, R * NH * D);
            CHECK_CLOSE(w, wr, R * NH * D, 1e-6,
                        inv ? "inverse rope_at vs double" : "rope_at vs double");
            CHECK(written_outside == 0, "%zu columns past the heads written", written_outside);
        }
        memcpy(back, x, sizeof back);
        CHECK_OK(&ctx, tpk_op_rope_at(&ctx, back, LD, back, LD, R, pos, NP, NH, D, 500.0f, false,
                                      TPK_F32));
        CHECK_OK(&ctx, tpk_op_rope_at(&ctx, back, LD, back, LD, R, pos, NP, NH, D, 500.0f, true,
                                      TPK_F32)); /* in place */
        CHECK_CLOSE(back, x, R * LD, 1e-6, "inverse(rope_at(x)) = x");
        memcpy(y, x, sizeof y), memcpy(back, x, sizeof back);
        CHECK_OK(&ctx, tpk_op_rope(&ctx, y, LD, y, LD, R, NP, NH, D, 500.0f, false, TPK_F32));
        CHECK_OK(&ctx, tpk_op_rope_at(&ctx, back, LD, back, LD, R, iota, NP, NH, D, 500.0f, false,
                                      TPK_F32));
        CHECK(bitdiff(y, back, R * LD) == 0, "rope_at at 0..S-1 differs from rope");
        uint16_t hx[R * LD], hy[R * NH * D];
        float fx[R * LD], fy[R * NH * D];
        to_bf16(hx, x, R * LD), from_bf16(fx, hx, R * LD), poison_bf16(hy, R * NH * D);
        CHECK_OK(&ctx, tpk_op_rope_at(&ctx, hy, NH * D, hx, LD, R, pos, NP, NH, D, 500.0f, false,
                                      TPK_BF16));
        from_bf16(fy, hy, R * NH * D);
        rope_ref_at(fx, LD, R, pos, NP, NH, D, 500.0, false, ref);
        d2f(wr, ref, R * NH * D);
        CHECK_CLOSE(fy, wr, R * NH * D, 1e-2, "bf16 rope_at vs double on the rounded input");
    }

    TEST_CASE(
        "layers swiglu f32/bf16: h = silu(gate) up; backward vs the analytic gradient and finite "
        "differences; dgu may be gu") {
        enum { R = 7, F = 9 };
        float gu[R * 2 * F], h[R * F], dh[R * F], dgu[R * 2 * F], wh[R * F], wg[R * 2 * F],
            fd[R * 2 * F], tmp[R * F];
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
        to_bf16(hg, gu, R * 2 * F), to_bf16(hd, dh, R * F), poison_bf16(hh, R * F),
            poison_bf16(hdg, R * 2 * F);
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
        float x[R * C], w[C], dy[R * C], y[R * C], rstd[R], dx[R * C], dw[C], wy[R * C], wdx[R * C],
            wdw[C], wr[R], fd[R * C];
        double ry[R * C], rr[R], rdx[R * C], rdw[C];
        test_randn(x, R * C, 1220, 1.5f), test_randn(w, C, 1221, 1.0f),
            test_randn(dy, R * C, 1222, 1.0f);
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
        to_bf16(hx, x, R * C), to_bf16(hdy, dy, R * C), poison_bf16(hy, R * C),
            poison_bf16(hdx, R * C);
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

    TEST_CASE(
        "layers rope, swiglu, rmsnorm: bad arguments fail naming them; empty sizes are no-ops") {
        float a[64] = {0}, b[64] = {0};
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 2, 1, 7, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "D: expected an even head size >= 2");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 2, 1, 8, 1.0f, false, TPK_F32),
                    TPK_ERR_ARG, "theta: expected a finite base > 1");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 6, 2, 2, 1, 8, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "ldx: expected >= 8, got 6");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 16, a, 8, 2, 2, 1, 8, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "ldy: in place (y == x) expected ldx = 8, got 16");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 0, 1, 8, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "S: expected >= 1");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, NULL, 8, 2, 2, 1, 8, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rope(&ctx, a, 8, b, 8, 2, 2, 1, 8, 100.0f, false, TPK_I32),
                    TPK_ERR_DTYPE, "tpk_op_rope: dt:");
        const int32_t pos[2] = {5, 9};
        CHECK_FAILS(&ctx, tpk_op_rope_at(&ctx, a, 8, b, 8, 2, pos, 0, 1, 8, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_rope_at: npos: expected >= 1, got 0");
        CHECK_FAILS(&ctx,
                    tpk_op_rope_at(&ctx, a, 8, b, 8, 2, NULL, 2, 1, 8, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_rope_at: pos: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rope_at(&ctx, a, 8, b, 8, 2, pos, 2, 1, 5, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_rope_at: D: expected an even head size >= 2");
        CHECK_FAILS(&ctx, tpk_op_rope_at(&ctx, a, 8, b, 8, 2, pos, 2, 1, 8, 1.0f, false, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_rope_at: theta");
        CHECK_FAILS(&ctx,
                    tpk_op_rope_at(&ctx, a, 16, a, 8, 2, pos, 2, 1, 8, 100.0f, false, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_rope_at: ldy: in place");
        CHECK_OK(&ctx,
                 tpk_op_rope_at(&ctx, NULL, 8, NULL, 8, 0, NULL, 1, 1, 8, 100.0f, false, TPK_F32));
        CHECK_FAILS(&ctx, tpk_op_swiglu_fwd(&ctx, a, NULL, 2, 3, TPK_F32), TPK_ERR_ARG,
                    "gu: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_swiglu_bwd(&ctx, a, b, NULL, 2, 3, TPK_F32), TPK_ERR_ARG,
                    "dh: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_swiglu_fwd(&ctx, a, b, -2, 3, TPK_F32), TPK_ERR_ARG,
                    "rows: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_fwd(&ctx, a, b, a, b, 2, 3, 0.0f, TPK_F32), TPK_ERR_ARG,
                    "eps: expected > 0");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_fwd(&ctx, a, NULL, a, b, 2, 3, 1e-5f, TPK_F32),
                    TPK_ERR_ARG, "rstd: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_bwd(&ctx, a, NULL, a, a, b, b, 2, 3, TPK_F32, false),
                    TPK_ERR_ARG, "dw: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rmsnorm_bwd(&ctx, a, b, a, a, b, b, 2, 0, TPK_F32, false),
                    TPK_ERR_ARG, "cols: expected >= 1");
        CHECK_OK(&ctx, tpk_op_rope(&ctx, NULL, 8, NULL, 8, 0, 2, 1, 8, 100.0f, false, TPK_F32));
        CHECK_OK(&ctx, tpk_op_swiglu_fwd(&ctx, NULL, NULL, 0, 3, TPK_F32));
        CHECK_OK(&ctx, tpk_op_rmsnorm_fwd(&ctx, NULL, NULL, NULL, NULL, 0, 3, 1e-5f, TPK_F32));
    }
}

OPS_TEST_MAIN(test_llama_ops)
