/* tests/test_ops_optim.c — the host backend's optimizer ops (kernels/host/optim.c): AdamW and the
 * sum of squares against double references (decay runs, clipping, a non-finite norm skipping the
 * step, the bf16 weight copy). Runs on one rank. */
#include "ops_test.h"

/* AdamW and sum of squares against a double reference over 3 steps */
static void test_optimizer(void) {
    TEST_CASE(
        "host adamw (3 steps, grad_scale, weight decay on runs of elements, then on all) and sumsq "
        "against double references") {
        enum { N = 257 };
        const int64_t runs[4] = {3, 10, 20, 257}; /* decayed: [3, 10) and [20, 257) */
        float w[N], g[N], m[N] = {0}, v[N] = {0};
        double wr[N], mr[N] = {0}, vr[N] = {0};
        test_randn(w, N, 81, 1.0f);
        for (int i = 0; i < N; i++) wr[i] = w[i];
        const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
        for (int step = 1; step <= 3; step++) {
            test_randn(g, N, 90 + (uint64_t)step, 1.0f);
            bool all = step == 3; /* steps 1, 2 with the runs, step 3 with decay everywhere
                                     (NULL) */
            for (int i = 0; i < N; i++) {
                double gi = g[i] * gs, wdi = all || (i >= 3 && i < 10) || i >= 20 ? wd : 0.0;
                mr[i] = b1 * mr[i] + (1 - b1) * gi, vr[i] = b2 * vr[i] + (1 - b2) * gi * gi;
                wr[i] -=
                    lr * (mr[i] / (1 - pow(b1, step)) / (sqrt(vr[i] / (1 - pow(b2, step))) + eps) +
                          wdi * wr[i]);
            }
            CHECK_OK(&ctx, tpk_op_adamw(&ctx, w, g, m, v, N, (float)lr, (float)b1, (float)b2,
                                        (float)eps, (float)wd, step, (float)gs, NULL, 0.0f,
                                        all ? NULL : runs, all ? 0 : 2, NULL));
        }
        float wrf[N];
        for (int i = 0; i < N; i++) wrf[i] = (float)wr[i];
        CHECK_CLOSE(w, wrf, N, 1e-5, "weights after 3 AdamW steps");
        double ss = -1, ref = 0;
        for (int i = 0; i < N; i++) ref += (double)g[i] * g[i];
        CHECK_OK(&ctx, tpk_op_sumsq(&ctx, &ss, g, N, false));
        CHECK(fabs(ss - ref) <= 1e-12 * ref, "sumsq %.17g, reference %.17g", ss, ref);
        double acc = 0.5;
        CHECK_OK(&ctx, tpk_op_sumsq(&ctx, &acc, g, N, true));
        CHECK(acc == 0.5 + ss, "sumsq accumulated onto 0.5: %.17g, expected %.17g", acc, 0.5 + ss);
        CHECK_OK(&ctx, tpk_op_sumsq(&ctx, &acc, NULL, 0, false));
        CHECK(acc == 0.0, "sumsq of nothing: %g", acc);
        /* the norm from the sum of squares: clipping in the op equals the scale computed apart; a
         * non-finite norm writes nothing and counts a skipped step */
        float w1[N], m1[N], v1[N], w2[N], m2[N], v2[N];
        memcpy(w1, w, sizeof w1), memcpy(m1, m, sizeof m1), memcpy(v1, v, sizeof v1);
        memcpy(w2, w, sizeof w2), memcpy(m2, m, sizeof m2), memcpy(v2, v, sizeof v2);
        double nrm[2] = {ss, 0}, N0 = sqrt(ss) * 0.5;
        uint16_t w16[N], w16p[N]; /* the bf16 copy made by the update: every element bf16(w),
                                     nothing else changed */
        memset(w16, 0xff, sizeof w16);
        CHECK_OK(&ctx, tpk_op_adamw(&ctx, w1, g, m1, v1, N, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 4,
                                    0.5f, nrm, 1.0f, runs, 2, w16));
        CHECK_OK(&ctx, tpk_op_adamw(&ctx, w2, g, m2, v2, N, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 4,
                                    0.5f * (float)(1.0 / N0), NULL, 0.0f, runs, 2, NULL));
        CHECK(N0 > 1.0 && !memcmp(w1, w2, sizeof w1) && !memcmp(m1, m2, sizeof m1) &&
                  !memcmp(v1, v2, sizeof v1) && nrm[1] == 0,
              "clipping from the sum of squares (norm %g) differs from the scale given", N0);
        int bad16 = 0;
        for (int i = 0; i < N; i++) bad16 += w16[i] != tpk_f32_to_bf16(w1[i]);
        CHECK(bad16 == 0, "adamw's bf16 copy: %d of %d elements are not bf16(w)", bad16, N);
        memcpy(w1, w, sizeof w1), memset(w16, 0xff, sizeof w16), memcpy(w16p, w16, sizeof w16p);
        double big[2] = {INFINITY, 2};
        CHECK_OK(&ctx, tpk_op_adamw(&ctx, w1, g, m1, v1, N, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                                    0.5f, big, 1.0f, runs, 2, w16));
        CHECK(!memcmp(w1, w, sizeof w1) && !memcmp(m1, m2, sizeof m1) && big[1] == 3 &&
                  !memcmp(w16, w16p, sizeof w16),
              "a step with an infinite norm: weights %s, bf16 copy %s, %g skipped",
              memcmp(w1, w, sizeof w1) ? "changed" : "kept",
              memcmp(w16, w16p, sizeof w16) ? "written" : "kept", big[1]);
        CHECK_FAILS(&ctx,
                    tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 0, 1, NULL, 0.0f,
                                 NULL, 0, NULL),
                    TPK_ERR_ARG, "step: expected >= 1, got 0");
        CHECK_FAILS(&ctx,
                    tpk_op_adamw(&ctx, w, NULL, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, NULL,
                                 0.0f, NULL, 0, NULL),
                    TPK_ERR_ARG, "g: expected a buffer");
        CHECK_FAILS(&ctx,
                    tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 1.0f, 0.95f, 1e-8f, 0, 1, 1, NULL, 0.0f,
                                 NULL, 0, NULL),
                    TPK_ERR_ARG, "b1, b2");
        CHECK_FAILS(&ctx,
                    tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, NULL, 0.0f,
                                 runs, -1, NULL),
                    TPK_ERR_ARG, "nruns: expected >= 0, got -1");
        CHECK_FAILS(&ctx,
                    tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, NULL, 0.0f,
                                 runs, 0, NULL),
                    TPK_ERR_ARG, "nruns: expected >= 1 runs");
        CHECK_FAILS(&ctx, tpk_op_sumsq(&ctx, NULL, g, N, false), TPK_ERR_ARG,
                    "out: expected a buffer");
        CHECK_FAILS(&ctx,
                    tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, nrm, NAN,
                                 NULL, 0, NULL),
                    TPK_ERR_ARG, "grad_scale, clip");
    }
}

OPS_TEST_MAIN(test_optimizer)
