/* tests/test_ops_gemm.c — the host backend's GEMMs (kernels/host/gemm.c) against a double-precision
 * GEMM: all four transpose combinations with padded leading dimensions, alpha/beta, bf16, odd and
 * empty sizes; gemm_acc (f32 or bf16 operands into an f32 C, not rounded); and the fused linear
 * ops through the front end (linear_fwd against gemm + bias_add + GELU, linear_bwd_act against
 * double references); gemm_fp8 on random FP8 codes of both formats (decoded here from the bit
 * layout), C f32 or bf16. Random inputs, outputs poisoned with NaN. Runs on one rank. */
#include "ops_test.h"

/* ---- gemm ---------------------------------------------------------------------------------- */

typedef struct gemm_case {
    int64_t m, n, k;
} gemm_case;

static const gemm_case gemm_cases[] = {{7, 5, 3}, {1, 1, 1}, {33, 17, 65}, {16, 32, 8}, {2, 9, 1}};

#define SENTINEL 12345.0f /* in C's padding, which gemm must leave alone */

/* One f32 or bf16 run of C = alpha op(A) op(B) + beta C against ref_gemm: gemm (C in dt) or, with
 * acc, gemm_acc (C f32, never rounded). pad > 0 makes every leading dimension larger than the
 * minimum; A's and B's padding is poisoned (a read shows in C) and C's must be left alone. */
static void run_gemm(tpk_dtype dt, bool acc, bool ta, bool tb, gemm_case g, int pad, float alpha,
                     float beta, uint64_t seed, double tol) {
    const char *op = acc ? "gemm_acc" : "gemm";
    int64_t m = g.m, n = g.n, k = g.k;
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    if (ldc < 1) ldc = 1;
    size_t na = (size_t)(ar * lda), nb = (size_t)(br * ldb), nc = (size_t)(m * ldc);
    float *a = fbuf(na), *b = fbuf(nb), *c = fbuf(nc), *c0 = fbuf(nc),
          *want = fbuf((size_t)(m * n)), *got = fbuf((size_t)(m * n));
    test_randn(a, na, seed, 1.0f);
    test_randn(b, nb, seed + 1, 1.0f);
    test_randn(c0, nc, seed + 2, 1.0f);
    if (beta == 0) test_poison(c0, nc); /* beta = 0 must ignore C entirely */
    for (int64_t i = 0; i < ar; i++) test_poison(a + i * lda + ac, (size_t)(lda - ac));
    for (int64_t i = 0; i < br; i++) test_poison(b + i * ldb + bc, (size_t)(ldb - bc));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = n; j < ldc; j++) c0[i * ldc + j] = SENTINEL;
    if (dt == TPK_BF16) { /* the reference sees the bf16-rounded inputs (gemm_acc's C stays f32) */
        for (size_t i = 0; i < na; i++) a[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(a[i]));
        for (size_t i = 0; i < nb; i++) b[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(b[i]));
        for (size_t i = 0; i < nc && !acc; i++) c0[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(c0[i]));
    }
    ref_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want);
    memcpy(c, c0, nc * sizeof(float));

    tpk_status s;
    if (dt == TPK_F32) {
        s = acc ? tpk_op_gemm_acc(&ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                                  TPK_F32)
                : tpk_op_gemm(&ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, TPK_F32);
    } else {
        uint16_t *ha = malloc(na * 2 + 2), *hb = malloc(nb * 2 + 2), *hc = malloc(nc * 2 + 2);
        to_bf16(ha, a, na), to_bf16(hb, b, nb), to_bf16(hc, c0, nc);
        if (acc) {
            s = tpk_op_gemm_acc(&ctx, ta, tb, m, n, k, alpha, ha, lda, hb, ldb, beta, c, ldc,
                                TPK_BF16);
        } else {
            s = tpk_op_gemm(&ctx, ta, tb, m, n, k, alpha, ha, lda, hb, ldb, beta, hc, ldc,
                            TPK_BF16);
            from_bf16(c, hc, nc);
        }
        free(ha), free(hb), free(hc);
    }
    CHECK(s == TPK_OK, "%s %s ta=%d tb=%d %lldx%lldx%lld: %s %s", tpk_dtype_name(dt), op, ta, tb,
          (long long)m, (long long)n, (long long)k, tpk_status_str(s), tpk_last_error(&ctx));
    size_t touched = 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) got[i * n + j] = c[i * ldc + j];
        for (int64_t j = n; j < ldc; j++)
            touched += f32_bits(c[i * ldc + j]) != f32_bits(c0[i * ldc + j]);
    }
    double e = test_relerr(got, want, (size_t)(m * n));
    CHECK(
        e < tol,
        "%s %s ta=%d tb=%d m=%lld n=%lld k=%lld alpha=%g beta=%g pad=%d: relative error %.3g >= "
        "%.3g",
        tpk_dtype_name(dt), op, ta, tb, (long long)m, (long long)n, (long long)k, alpha, beta, pad,
        e, tol);
    CHECK(touched == 0, "%s wrote %zu elements of C's padding", op, touched);
    free(a), free(b), free(c), free(c0), free(want), free(got);
}

static void test_gemm(void) {
    const float ab[][2] = {{1.0f, 0.0f}, {1.5f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}};
    TEST_CASE("host gemm f32: 4 transposes x sizes x alpha/beta, padded leading dims") {
        uint64_t seed = 100;
        for (size_t g = 0; g < sizeof gemm_cases / sizeof *gemm_cases; g++)
            for (int t = 0; t < 4; t++)
                for (size_t s = 0; s < sizeof ab / sizeof *ab; s++)
                    for (int pad = 0; pad <= 3; pad += 3)
                        run_gemm(TPK_F32, false, t & 1, t & 2, gemm_cases[g], pad, ab[s][0],
                                 ab[s][1], seed += 3, 1e-5);
    }
    TEST_CASE("host gemm bf16: 4 transposes x sizes x alpha/beta") {
        uint64_t seed = 200;
        for (size_t g = 0; g < sizeof gemm_cases / sizeof *gemm_cases; g++)
            for (int t = 0; t < 4; t++)
                for (size_t s = 0; s < sizeof ab / sizeof *ab; s++)
                    run_gemm(TPK_BF16, false, t & 1, t & 2, gemm_cases[g], 2, ab[s][0], ab[s][1],
                             seed += 3, 1e-2);
    }
    TEST_CASE("host gemm: empty sizes, k = 0 and alpha = 0 give C = beta C") {
        const gemm_case empty[] = {{0, 5, 3}, {4, 0, 3}, {0, 0, 0}, {4, 5, 0}, {1, 1, 0}};
        for (size_t g = 0; g < sizeof empty / sizeof *empty; g++)
            for (int t = 0; t < 4; t++) {
                run_gemm(TPK_F32, false, t & 1, t & 2, empty[g], 1, 1.0f, 0.0f, 300 + g, 1e-6);
                run_gemm(TPK_F32, false, t & 1, t & 2, empty[g], 0, 2.0f, 1.0f, 310 + g, 1e-6);
                run_gemm(TPK_F32, false, t & 1, t & 2, empty[g], 2, 1.0f, -3.0f, 320 + g, 1e-6);
                run_gemm(TPK_BF16, false, t & 1, t & 2, empty[g], 1, 1.0f, 0.0f, 330 + g, 1e-6);
                run_gemm(TPK_BF16, false, t & 1, t & 2, empty[g], 1, 1.0f, 0.5f, 340 + g, 1e-6);
            }
        /* operands the product does not read may be NULL */
        float c[4] = {1, 2, 3, 4};
        CHECK_OK(&ctx, tpk_op_gemm(&ctx, false, false, 0, 4, 3, 1.0f, NULL, 3, NULL, 4, 0.0f, NULL,
                                   4, TPK_F32));
        CHECK_OK(&ctx, tpk_op_gemm(&ctx, true, true, 3, 0, 2, 1.0f, NULL, 3, NULL, 2, 0.0f, NULL, 1,
                                   TPK_BF16));
        CHECK_OK(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 0, 1.0f, NULL, 1, NULL, 2, 0.0f, c, 2,
                                   TPK_F32));
        CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 0, "k = 0, beta = 0: C = %g %g %g %g",
              c[0], c[1], c[2], c[3]);
        /* alpha = 0: C = beta C even with NaN in A and B */
        float a[6], b[6], c2[4] = {1, 2, 3, 4};
        test_poison(a, 6), test_poison(b, 6);
        CHECK_OK(&ctx,
                 tpk_op_gemm(&ctx, false, false, 2, 2, 3, 0.0f, a, 3, b, 2, 2.0f, c2, 2, TPK_F32));
        CHECK(c2[0] == 2 && c2[1] == 4 && c2[2] == 6 && c2[3] == 8, "alpha = 0: C = %g %g %g %g",
              c2[0], c2[1], c2[2], c2[3]);
    }
}

/* ---- gemm_acc: f32 or bf16 operands into an f32 C ------------------------------------------ */

static void test_gemm_acc(void) {
    const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 1.0f}, {1.5f, 0.25f}};
    TEST_CASE(
        "host gemm_acc f32 and bf16 operands into f32 C: 4 transposes x sizes x alpha/beta, padded "
        "leading dims") {
        uint64_t seed = 700;
        for (int d = 0; d < 2; d++)
            for (size_t g = 0; g < sizeof gemm_cases / sizeof *gemm_cases; g++)
                for (int t = 0; t < 4; t++)
                    for (size_t s = 0; s < sizeof ab / sizeof *ab; s++)
                        for (int pad = 0; pad <= 3; pad += 3)
                            run_gemm(d ? TPK_BF16 : TPK_F32, true, t & 1, t & 2, gemm_cases[g], pad,
                                     ab[s][0], ab[s][1], seed += 3, 1e-5);
        const gemm_case empty[] = {{0, 5, 3}, {4, 0, 3}, {0, 0, 0}, {4, 5, 0}, {1, 1, 0}};
        for (size_t g = 0; g < sizeof empty / sizeof *empty; g++)
            for (int t = 0; t < 4; t++) {
                run_gemm(TPK_BF16, true, t & 1, t & 2, empty[g], 1, 1.0f, 0.0f, 800 + g, 1e-5);
                run_gemm(TPK_BF16, true, t & 1, t & 2, empty[g], 2, 1.0f, 1.0f, 810 + g, 1e-5);
                run_gemm(TPK_F32, true, t & 1, t & 2, empty[g], 1, 2.0f, -3.0f, 820 + g, 1e-5);
            }
        /* the sum carries f32 precision: most elements are not bf16 values (a rounded C would
         * be) */
        enum { M = 33, N = 17, K = 65 };
        float a[M * K], b[K * N], c[M * N];
        uint16_t ha[M * K], hb[K * N];
        test_randn(a, M * K, 900, 1.0f), test_randn(b, K * N, 901, 1.0f),
            test_randn(c, M * N, 902, 1.0f);
        to_bf16(ha, a, M * K), to_bf16(hb, b, K * N);
        CHECK_OK(&ctx, tpk_op_gemm_acc(&ctx, false, false, M, N, K, 1.0f, ha, K, hb, N, 1.0f, c, N,
                                       TPK_BF16));
        size_t exact = 0;
        for (int i = 0; i < M * N; i++) exact += c[i] == tpk_bf16_to_f32(tpk_f32_to_bf16(c[i]));
        CHECK(exact < (size_t)(M * N / 8), "%zu of %d elements of C are bf16 values", exact, M * N);
        /* alpha = 0: C = beta C, NaN in A and B not read */
        uint16_t na[6], nb[6];
        float c2[4] = {1, 2, 3, 4};
        for (int i = 0; i < 6; i++) na[i] = nb[i] = 0x7fc0; /* bf16 NaN */
        CHECK_OK(&ctx, tpk_op_gemm_acc(&ctx, false, false, 2, 2, 3, 0.0f, na, 3, nb, 2, 2.0f, c2, 2,
                                       TPK_BF16));
        CHECK(c2[0] == 2 && c2[1] == 4 && c2[2] == 6 && c2[3] == 8, "alpha = 0: C = %g %g %g %g",
              c2[0], c2[1], c2[2], c2[3]);
        CHECK_OK(&ctx, tpk_op_gemm_acc(&ctx, true, true, 3, 0, 2, 1.0f, NULL, 3, NULL, 2, 0.0f,
                                       NULL, 1, TPK_BF16)); /* nothing touched */
    }
    TEST_CASE("host gemm_acc: bad arguments fail with a message naming them") {
        uint16_t a[64] = {0}, b[64] = {0};
        float c[64] = {0};
        const char *fn = "tpk_op_gemm_acc: ";
        struct {
            bool ta, tb;
            int64_t m, n, k, lda, ldb, ldc;
            int nul; /* 1: a, 2: b, 3: c NULL */
            const char *msg;
        } bad[] = {
            {0, 0, -1, 4, 4, 4, 4, 4, 0, "m: expected >= 0, got -1"},
            {0, 0, 4, -2, 4, 4, 4, 4, 0, "n: expected >= 0, got -2"},
            {0, 0, 4, 4, -3, 4, 4, 4, 0, "k: expected >= 0, got -3"},
            {0, 0, 4, 6, 5, 3, 6, 6, 0, "lda: expected >= 5, got 3"},
            {1, 0, 4, 6, 5, 3, 6, 6, 0, "lda: expected >= 4, got 3"},
            {0, 0, 4, 6, 5, 5, 5, 6, 0, "ldb: expected >= 6, got 5"},
            {0, 1, 4, 6, 5, 5, 4, 6, 0, "ldb: expected >= 5, got 4"},
            {0, 0, 4, 6, 5, 5, 6, 2, 0, "ldc: expected >= 6, got 2"},
            {0, 0, 2, 2, 2, 2, 2, 2, 1, "a: expected a buffer, got NULL"},
            {0, 0, 2, 2, 2, 2, 2, 2, 2, "b: expected a buffer, got NULL"},
            {0, 0, 2, 2, 2, 2, 2, 2, 3, "c: expected a buffer, got NULL"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            char want[96];
            snprintf(want, sizeof want, "%s%s", fn, bad[i].msg);
            CHECK_FAILS(&ctx,
                        tpk_op_gemm_acc(&ctx, bad[i].ta, bad[i].tb, bad[i].m, bad[i].n, bad[i].k, 1,
                                        bad[i].nul == 1 ? NULL : a, bad[i].lda,
                                        bad[i].nul == 2 ? NULL : b, bad[i].ldb, 0,
                                        bad[i].nul == 3 ? NULL : c, bad[i].ldc, TPK_BF16),
                        TPK_ERR_ARG, want);
        }
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_acc(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2, TPK_I32),
                    TPK_ERR_DTYPE, "tpk_op_gemm_acc: dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_acc(&ctx, false, false, (int64_t)1 << 32, 1, 1, 1, a, 1, b, 1, 0, c,
                                    1, TPK_BF16),
                    TPK_ERR_ARG, "host.gemm_acc: m: expected <= 2147483647");
        CHECK(c[0] == 0, "a refused call wrote C");
    }
}


/* linear_fwd against gemm + bias_add (+ gelu_fwd), f32 and bf16, bias and GELU on and off */
static void test_linear_fwd(void) {
    TEST_CASE(
        "host linear_fwd equals gemm + bias_add (+ gelu_fwd, pre-activation kept), f32 and bf16") {
        enum { T = 9, N = 13, K = 11 };
        float x[T * K], w[N * K], b[N], y[T * N], pre[T * N], u[T * N], ref[T * N];
        test_randn(x, T * K, 70, 1.0f), test_randn(w, N * K, 71, 0.5f), test_randn(b, N, 72, 1.0f);
        for (int v = 0; v < 8; v++) {
            bool gelu = v & 1, bias = v & 2;
            tpk_dtype dt = (v & 4) ? TPK_BF16 : TPK_F32;
            uint16_t xh[T * K], wh[N * K], bh[N], yh[T * N], ph[T * N];
            const void *xa = x, *wa = w, *ba = b;
            void *ya = y, *pa = pre;
            if (dt == TPK_BF16) {
                for (int i = 0; i < T * K; i++) xh[i] = tpk_f32_to_bf16(x[i]);
                for (int i = 0; i < N * K; i++) wh[i] = tpk_f32_to_bf16(w[i]);
                for (int i = 0; i < N; i++) bh[i] = tpk_f32_to_bf16(b[i]);
                xa = xh, wa = wh, ba = bh, ya = yh, pa = ph;
            }
            test_poison(y, T * N), test_poison(pre, T * N);
            CHECK_OK(&ctx, tpk_op_linear_fwd(&ctx, ya, pa, xa, wa, bias ? ba : NULL, T, N, K,
                                             gelu ? TPK_ACT_GELU_TANH : TPK_ACT_NONE, dt));
            /* the reference: double sums of the (rounded) inputs */
            for (int t = 0; t < T; t++)
                for (int j = 0; j < N; j++) {
                    double s = bias ? (dt == TPK_BF16 ? tpk_bf16_to_f32(bh[j]) : b[j]) : 0;
                    for (int q = 0; q < K; q++)
                        s += (dt == TPK_BF16 ? (double)tpk_bf16_to_f32(xh[t * K + q]) *
                                                   tpk_bf16_to_f32(wh[j * K + q])
                                             : (double)x[t * K + q] * w[j * K + q]);
                    u[t * N + j] = (float)s;
                    ref[t * N + j] =
                        gelu ? (float)(0.5 * s *
                                       (1 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s))))
                             : (float)s;
                }
            if (dt == TPK_BF16)
                for (int i = 0; i < T * N; i++)
                    y[i] = tpk_bf16_to_f32(yh[i]), pre[i] = tpk_bf16_to_f32(ph[i]);
            double tol = dt == TPK_BF16 ? 1e-2 : 1e-5;
            CHECK_CLOSE(y, ref, T * N, tol, gelu ? "gelu(x W^T + b)" : "x W^T + b");
            if (gelu) CHECK_CLOSE(pre, u, T * N, tol, "pre-activation");
        }
        CHECK_FAILS(&ctx,
                    tpk_op_linear_fwd(&ctx, NULL, NULL, x, w, b, T, N, K, TPK_ACT_NONE, TPK_F32),
                    TPK_ERR_ARG, "y: expected a buffer");
        CHECK_FAILS(&ctx,
                    tpk_op_linear_fwd(&ctx, y, NULL, x, w, b, T, N, K, TPK_ACT_GELU_TANH, TPK_F32),
                    TPK_ERR_ARG, "pre: expected a buffer");
        CHECK_FAILS(&ctx,
                    tpk_op_linear_fwd(&ctx, y, pre, x, w, b, T, N, K, TPK_ACT_GELU_TANH, TPK_I32),
                    TPK_ERR_DTYPE, "dt:");
        CHECK_FAILS(&ctx, tpk_op_linear_fwd(&ctx, y, pre, x, w, b, T, N, K, (tpk_act)7, TPK_F32),
                    TPK_ERR_ARG,
                    "act: expected TPK_ACT_NONE, TPK_ACT_GELU_TANH or TPK_ACT_GELU, got 7");
    }
}

/* linear_bwd_act against a double reference: du = (dy W) gelu'(pre), db = colsum(du) */
static void test_linear_bwd_act(void) {
    TEST_CASE(
        "host linear_bwd_act: du = (dy W) gelu'(pre) and db = its column sums against double "
        "references, f32 and bf16, db or not; bad input") {
        enum { T = 9, N = 13, K = 11 };
        float dy[T * K], w[K * N], pre[T * N], du[T * N], db[N], rdu[T * N], rdb[N];
        test_randn(dy, T * K, 75, 1.0f), test_randn(w, K * N, 76, 0.5f),
            test_randn(pre, T * N, 77, 1.5f);
        for (int v = 0; v < 4; v++) {
            bool with_db = v & 1;
            tpk_dtype dt = (v & 2) ? TPK_BF16 : TPK_F32;
            uint16_t dyh[T * K], wh[K * N], ph[T * N], duh[T * N], dbh[N];
            const void *dya = dy, *wa = w, *pa = pre;
            void *dua = du, *dba = db;
            if (dt == TPK_BF16) {
                for (int i = 0; i < T * K; i++) dyh[i] = tpk_f32_to_bf16(dy[i]);
                for (int i = 0; i < K * N; i++) wh[i] = tpk_f32_to_bf16(w[i]);
                for (int i = 0; i < T * N; i++) ph[i] = tpk_f32_to_bf16(pre[i]);
                dya = dyh, wa = wh, pa = ph, dua = duh, dba = dbh;
            }
            test_poison(du, T * N), test_poison(db, N);
            if (dt == TPK_BF16) memset(duh, 0xff, sizeof duh), memset(dbh, 0xff, sizeof dbh);
            CHECK_OK(&ctx, tpk_op_linear_bwd_act(&ctx, dua, with_db ? dba : NULL, dya, wa, pa, T, N,
                                                 K, TPK_ACT_GELU_TANH, dt));
            for (int j = 0; j < N; j++) rdb[j] = 0;
            double sdb[N] = {0};
            for (int t = 0; t < T; t++)
                for (int j = 0; j < N; j++) {
                    double g = 0,
                           u = dt == TPK_BF16 ? tpk_bf16_to_f32(ph[t * N + j]) : pre[t * N + j];
                    for (int q = 0; q < K; q++)
                        g += dt == TPK_BF16 ? (double)tpk_bf16_to_f32(dyh[t * K + q]) *
                                                  tpk_bf16_to_f32(wh[q * N + j])
                                            : (double)dy[t * K + q] * w[q * N + j];
                    rdu[t * N + j] = (float)(g * gelu_grad_d(u)), sdb[j] += g * gelu_grad_d(u);
                }
            for (int j = 0; j < N; j++) rdb[j] = (float)sdb[j];
            if (dt == TPK_BF16) {
                for (int i = 0; i < T * N; i++) du[i] = tpk_bf16_to_f32(duh[i]);
                for (int i = 0; i < N; i++) db[i] = tpk_bf16_to_f32(dbh[i]);
            }
            double tol = dt == TPK_BF16 ? 2e-2 : 1e-5;
            CHECK_CLOSE(du, rdu, T * N, tol, "du = (dy W) gelu'(pre)");
            if (with_db) CHECK_CLOSE(db, rdb, N, tol, "db = column sums of du");
            else
                CHECK(dt == TPK_BF16 ? dbh[0] == 0xffff : isnan(db[0]),
                      "db written without being asked for");
        }
        CHECK_OK(&ctx, tpk_op_linear_bwd_act(&ctx, NULL, db, NULL, NULL, NULL, 0, N, K,
                                             TPK_ACT_GELU_TANH, TPK_F32)); /* no rows: db = 0 */
        CHECK(db[0] == 0.0f && db[N - 1] == 0.0f, "no rows: db %g, expected 0", db[0]);
        CHECK_FAILS(&ctx,
                    tpk_op_linear_bwd_act(&ctx, du, db, dy, w, pre, T, N, K, TPK_ACT_NONE, TPK_F32),
                    TPK_ERR_ARG, "act: expected an activation");
        CHECK_FAILS(
            &ctx,
            tpk_op_linear_bwd_act(&ctx, pre, db, dy, w, pre, T, N, K, TPK_ACT_GELU_TANH, TPK_F32),
            TPK_ERR_ARG, "du: must not alias");
        CHECK_FAILS(
            &ctx,
            tpk_op_linear_bwd_act(&ctx, du, db, dy, w, NULL, T, N, K, TPK_ACT_GELU_TANH, TPK_F32),
            TPK_ERR_ARG, "pre: expected a buffer");
        CHECK_FAILS(
            &ctx,
            tpk_op_linear_bwd_act(&ctx, du, db, dy, w, pre, T, -1, K, TPK_ACT_GELU_TANH, TPK_F32),
            TPK_ERR_ARG, "n: expected >= 0");
    }
}

/* ---- gemm_fp8 ------------------------------------------------------------------------------ */

/* a random finite code of f (NaN and infinity codes redrawn) and its value, decoded here from the
 * bit layout (E4M3: bias 7, 3 mantissa bits; E5M2: bias 15, 2) */
static double fp8_dec(uint8_t c, tpk_fp8_fmt f) {
    int mb = f == TPK_E4M3 ? 3 : 2, bias = f == TPK_E4M3 ? 7 : 15;
    int E = (c & 0x7f) >> mb, M = c & ((1 << mb) - 1);
    double v = E ? ldexp(1.0 + (double)M / (1 << mb), E - bias) : ldexp((double)M, 1 - bias - mb);
    return c & 0x80 ? -v : v;
}
static void fp8_rand(uint8_t *q, float *v, size_t n, tpk_fp8_fmt f, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        uint8_t c;
        do {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            c = (uint8_t)(seed >> 56);
        } while (f == TPK_E4M3 ? (c & 0x7f) == 0x7f : (c & 0x7c) == 0x7c);
        q[i] = c, v[i] = (float)fp8_dec(c, f);
    }
}

static void test_gemm_fp8(void) {
    TEST_CASE(
        "host gemm_fp8: FP8 codes decoded exactly, f32 sums, alpha and beta, C f32 and bf16") {
        for (size_t gi = 0; gi < sizeof gemm_cases / sizeof *gemm_cases; gi++)
            for (int tr = 0; tr < 4; tr++)
                for (int cv = 0; cv < 3; cv++) {
                    gemm_case g = gemm_cases[gi];
                    bool ta = tr & 1, tb = tr & 2;
                    tpk_fp8_fmt fa = cv == 1 ? TPK_E5M2 : TPK_E4M3, fb = TPK_E4M3;
                    tpk_dtype cdt = cv == 2 ? TPK_BF16 : TPK_F32;
                    float beta = cv == 1 ? 1.0f : 0.0f, alpha = 0.0078125f * (1 + cv);
                    int64_t lda = (ta ? g.m : g.k) + 1, ldb = (tb ? g.k : g.n) + 2, ldc = g.n + 1;
                    size_t na = (size_t)((ta ? g.k : g.m) * lda),
                           nb = (size_t)((tb ? g.n : g.k) * ldb), nc = (size_t)(g.m * ldc);
                    uint8_t *qa = malloc(na), *qb = malloc(nb);
                    float *a = fbuf(na), *b = fbuf(nb), *c = fbuf(nc), *c0 = fbuf(nc),
                          *want = fbuf((size_t)(g.m * g.n));
                    uint16_t *hc = hbuf(nc);
                    fp8_rand(qa, a, na, fa, 100 + gi * 8 + (uint64_t)tr);
                    fp8_rand(qb, b, nb, fb, 200 + gi * 8 + (uint64_t)tr);
                    test_randn(c0, nc, 300 + gi, 1.0f);
                    if (beta == 0) test_poison(c0, nc);
                    if (cdt == TPK_BF16) round_bf16(c0, nc);
                    ref_gemm(ta, tb, g.m, g.n, g.k, alpha, a, lda, b, ldb, beta, c0, ldc, want);
                    if (cdt == TPK_BF16) {
                        to_bf16(hc, c0, nc);
                        CHECK_OK(&ctx, tpk_op_gemm_fp8(&ctx, ta, tb, g.m, g.n, g.k, alpha, qa, fa,
                                                       lda, qb, fb, ldb, beta, hc, ldc, cdt));
                        from_bf16(c, hc, nc);
                    } else {
                        memcpy(c, c0, nc * sizeof(float));
                        CHECK_OK(&ctx, tpk_op_gemm_fp8(&ctx, ta, tb, g.m, g.n, g.k, alpha, qa, fa,
                                                       lda, qb, fb, ldb, beta, c, ldc, cdt));
                    }
                    for (int64_t i = 0; i < g.m; i++) /* packed, for test_relerr */
                        memmove(c + i * g.n, c + i * ldc, (size_t)g.n * sizeof(float));
                    double e = test_relerr(c, want, (size_t)(g.m * g.n));
                    double tol = cdt == TPK_BF16 ? TOL_BF16 : 1e-5;
                    CHECK(e < tol, "gemm_fp8 %lldx%lldx%lld ta=%d tb=%d %s: relative error %.3g",
                          (long long)g.m, (long long)g.n, (long long)g.k, ta, tb,
                          tpk_dtype_name(cdt), e);
                    free(qa), free(qb), free(a), free(b), free(c), free(c0), free(want), free(hc);
                }
    }
}

/* ---- gemm_grouped: G GEMMs on row groups against a matrix each ----------------------------- */

/* One run of gemm_grouped (dt; W in w_dt) on groups of rows[0 .. G) rows, against ref_gemm on each
 * group's block: y_g = alpha x_g op(W_g) + beta y_g, or (wgrad) op(W_g) = alpha x_g^T y_g +
 * beta op(W_g). Every leading dimension padded by 2: x's padding poisoned (a read shows), y's and
 * W's sentinels (must be left alone); the output poisoned where beta = 0; the W of a group of 0
 * rows poisoned in the forward (not read). */
static void run_grouped(tpk_dtype dt, tpk_dtype w_dt, bool wgrad, bool tw, const int64_t *rows,
                        int64_t G, int64_t n, int64_t k, float alpha, float beta, uint64_t seed,
                        double tol) {
    int64_t R = 0, sr = tw ? n : k, sc = tw ? k : n; /* W_g stored [sr, sc] */
    for (int64_t g = 0; g < G; g++) R += rows[g];
    int64_t ldx = k + 2, ldy = n + 2, ldw = sc + 2;
    size_t nx = (size_t)(R * ldx), ny = (size_t)(R * ldy), nw = (size_t)(sr * ldw);
    float *x = fbuf(nx), *y = fbuf(ny), *want = fbuf(wgrad ? (size_t)G * nw : ny), *got;
    float *w[8], *w0[8];
    void *wp[8];
    test_randn(x, nx, seed, 1.0f), test_randn(y, ny, seed + 1, 1.0f);
    for (int64_t i = 0; i < R; i++) test_poison(x + i * ldx + k, 2);
    for (int64_t i = 0; i < R; i++) y[i * ldy + n] = y[i * ldy + n + 1] = SENTINEL;
    if (!wgrad && beta == 0) /* the output ignored */
        for (int64_t i = 0; i < R; i++) test_poison(y + i * ldy, (size_t)n);
    for (int64_t g = 0; g < G; g++) {
        w0[g] = fbuf(nw), w[g] = fbuf(nw);
        test_randn(w0[g], nw, seed + 10 + (uint64_t)g, 1.0f);
        if ((wgrad && beta == 0) || (!wgrad && !rows[g])) test_poison(w0[g], nw);
        for (int64_t i = 0; i < sr; i++) w0[g][i * ldw + sc] = w0[g][i * ldw + sc + 1] = SENTINEL;
    }
    if (dt == TPK_BF16) { /* the reference sees the rounded inputs */
        round_bf16(x, nx), round_bf16(y, ny);
        for (int64_t g = 0; g < G && w_dt == TPK_BF16; g++) round_bf16(w0[g], nw);
    }
    if (!wgrad) memcpy(want, y, ny * sizeof(float)); /* y's untouched elements: as they were */
    for (int64_t g = 0, off = 0; g < G; off += rows[g++]) {
        const float *xg = x + off * ldx, *yg = y + off * ldy;
        float *blk = fbuf((size_t)((wgrad ? sr : rows[g]) * (wgrad ? sc : n)));
        if (!wgrad) {
            ref_gemm(false, tw, rows[g], n, k, alpha, xg, ldx, w0[g], ldw, beta, yg, ldy, blk);
            for (int64_t i = 0; i < rows[g]; i++)
                memcpy(want + (off + i) * ldy, blk + i * n, (size_t)n * sizeof(float));
            free(blk);
            continue;
        }
        if (!tw)
            ref_gemm(true, false, k, n, rows[g], alpha, xg, ldx, yg, ldy, beta, w0[g], ldw, blk);
        else ref_gemm(true, false, n, k, rows[g], alpha, yg, ldy, xg, ldx, beta, w0[g], ldw, blk);
        memcpy(want + (size_t)g * nw, w0[g], nw * sizeof(float));
        for (int64_t i = 0; i < sr; i++)
            memcpy(want + (size_t)g * nw + i * ldw, blk + i * sc, (size_t)sc * sizeof(float));
        free(blk);
    }
    /* the backend's buffers: dt (x, y) and w_dt (W) */
    uint16_t *hx = hbuf(nx), *hy = hbuf(ny), *hw[8];
    for (int64_t g = 0; g < G; g++) {
        memcpy(w[g], w0[g], nw * sizeof(float));
        hw[g] = hbuf(nw);
        if (w_dt == TPK_BF16) to_bf16(hw[g], w[g], nw);
        wp[g] = w_dt == TPK_BF16 ? (void *)hw[g] : (void *)w[g];
    }
    if (dt == TPK_BF16) to_bf16(hx, x, nx), to_bf16(hy, y, ny);
    tpk_status s = tpk_op_gemm_grouped(&ctx, wgrad, tw, G, rows, n, k, alpha,
                                       dt == TPK_BF16 ? (void *)hx : (void *)x, ldx, wp, ldw, w_dt,
                                       beta, dt == TPK_BF16 ? (void *)hy : (void *)y, ldy, dt);
    CHECK(s == TPK_OK, "gemm_grouped %s: %s %s", tpk_dtype_name(dt), tpk_status_str(s),
          tpk_last_error(&ctx));
    if (dt == TPK_BF16 && !wgrad) from_bf16(y, hy, ny);
    for (int64_t g = 0; g < G && w_dt == TPK_BF16 && wgrad; g++) from_bf16(w[g], hw[g], nw);
    size_t ng = wgrad ? (size_t)G * nw : ny, touched = 0;
    got = fbuf(ng);
    for (int64_t g = 0; g < G && wgrad; g++) memcpy(got + (size_t)g * nw, w[g], nw * 4);
    if (!wgrad) memcpy(got, y, ny * sizeof(float));
    /* compare the written elements; the padding's sentinels bit for bit */
    size_t cols = wgrad ? (size_t)ldw : (size_t)ldy, inner = wgrad ? (size_t)sc : (size_t)n;
    for (size_t i = 0; i < ng; i++)
        if (i % cols >= inner) {
            touched += f32_bits(got[i]) != f32_bits(want[i]); /* as they were */
            got[i] = want[i] = 0;
        }
    double e = test_relerr(got, want, ng);
    CHECK(e < tol,
          "gemm_grouped %s w %s wgrad=%d tw=%d G=%lld n=%lld k=%lld alpha=%g beta=%g: relative "
          "error %.3g >= %.3g",
          tpk_dtype_name(dt), tpk_dtype_name(w_dt), wgrad, tw, (long long)G, (long long)n,
          (long long)k, alpha, beta, e, tol);
    CHECK(touched == 0, "gemm_grouped wrote %zu padding elements", touched);
    for (int64_t g = 0; g < G; g++) free(w[g]), free(w0[g]), free(hw[g]);
    free(x), free(y), free(want), free(got), free(hx), free(hy);
}

static void test_gemm_grouped(void) {
    const int64_t rows_a[] = {3, 0, 5, 1, 0, 4}, rows_z[] = {0, 0, 0};
    const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.0f, 0.5f}};
    TEST_CASE("host gemm_grouped: forward, data and weight gradient forms, f32 and bf16 (W f32 "
              "or bf16), groups of 0 rows, against a GEMM per group") {
        uint64_t seed = 1200;
        for (int d = 0; d < 2; d++)
            for (int f = 0; f < 4; f++)
                for (size_t s = 0; s < sizeof ab / sizeof *ab; s++) {
                    tpk_dtype dt = d ? TPK_BF16 : TPK_F32;
                    bool wgrad = f & 2, tw = f & 1;
                    double tol = d ? TOL_BF16 : 1e-5;
                    run_grouped(dt, dt, wgrad, tw, rows_a, 6, 7, 5, ab[s][0], ab[s][1], seed += 20,
                                tol);
                    run_grouped(dt, dt, wgrad, tw, rows_z, 3, 4, 3, ab[s][0], ab[s][1], seed += 20,
                                tol);
                    if (wgrad && d) /* the f32 gradient of bf16 operands, not rounded */
                        run_grouped(dt, TPK_F32, wgrad, tw, rows_a, 6, 9, 6, ab[s][0], ab[s][1],
                                    seed += 20, 1e-5);
                }
        run_grouped(TPK_F32, TPK_F32, false, true, rows_a, 0, 4, 3, 1.0f, 0.0f, 1300, 1e-5);
        run_grouped(TPK_F32, TPK_F32, true, false, rows_a, 1, 4, 3, 1.0f, 1.0f, 1301, 1e-5);
    }
    TEST_CASE("host gemm_grouped: bad arguments fail with a message naming them") {
        float x[64] = {0}, y[64] = {0}, wa[64] = {0};
        void *w[2] = {wa, wa}, *wn[2] = {wa, NULL};
        int64_t rows[2] = {2, 1}, neg[2] = {2, -1};
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, -1, rows, 4, 4, 1, x, 4, w, 4, TPK_F32,
                                        0, y, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm_grouped: groups: expected >= 0, got -1");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, NULL, 4, 4, 1, x, 4, w, 4, TPK_F32, 0,
                                        y, 4, TPK_F32),
                    TPK_ERR_ARG,
                    "tpk_op_gemm_grouped: rows: expected a host array of 2 row counts, got NULL");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, neg, 4, 4, 1, x, 4, w, 4, TPK_F32, 0,
                                        y, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm_grouped: rows[1]: expected >= 0, got -1");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, rows, 4, 4, 1, x, 4, NULL, 4, TPK_F32,
                                        0, y, 4, TPK_F32),
                    TPK_ERR_ARG,
                    "tpk_op_gemm_grouped: w: expected a host array of 2 matrices, got NULL");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, rows, 4, 4, 1, x, 4, wn, 4, TPK_F32,
                                        0, y, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm_grouped: w[1]: expected a buffer, got NULL");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, rows, 4, 5, 1, x, 4, w, 5, TPK_F32, 0,
                                        y, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm_grouped: ldx: expected >= 5, got 4");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, false, 2, rows, 6, 4, 1, x, 4, w, 5, TPK_F32,
                                        0, y, 6, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm_grouped: ldw: expected >= 6, got 5");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, rows, 6, 4, 1, x, 4, w, 4, TPK_F32, 0,
                                        y, 5, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm_grouped: ldy: expected >= 6, got 5");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, rows, 4, 4, 1, x, 4, w, 4, TPK_F32, 0,
                                        NULL, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm_grouped: y: expected a buffer, got NULL");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, false, true, 2, rows, 4, 4, 1, x, 4, w, 4, TPK_F32, 0,
                                        y, 4, TPK_BF16),
                    TPK_ERR_DTYPE, "tpk_op_gemm_grouped: w_dt: expected bf16, got f32 (0)");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, true, false, 2, rows, 4, 4, 1, x, 4, w, 4, TPK_I32, 0,
                                        y, 4, TPK_BF16),
                    TPK_ERR_DTYPE, "tpk_op_gemm_grouped: w_dt: expected bf16 or f32, got i32");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_grouped(&ctx, true, false, 2, rows, 4, 4, 1, x, 4, w, 4, TPK_F32, 0,
                                        y, 4, TPK_I32),
                    TPK_ERR_DTYPE, "tpk_op_gemm_grouped: dt: expected f32 or bf16, got i32");
        CHECK(wa[0] == 0 && y[0] == 0, "a refused call wrote its output");
    }
}

OPS_TEST_MAIN(test_gemm, test_gemm_acc, test_linear_fwd, test_linear_bwd_act, test_gemm_fp8,
              test_gemm_grouped)
