/* tests/test_ops_host.c — the host backend's core ops (kernels/host/) against naive references.
 *
 * Every op is run on random inputs (test_randn) into outputs poisoned with NaN, and compared
 * with a reference written here in double precision: GEMM in all four transpose combinations
 * with padded leading dimensions, alpha/beta, bf16, odd and empty sizes, and gemm_acc (f32 or bf16
 * operands into an f32 C, not rounded); bias add/grad; GELU
 * forward and backward (also against finite differences) and the identity activation; fill,
 * copy2d, cast (bf16 rounding on hand-picked halfway cases), axpby; the counter-based RNG
 * (moments and sharded draws);
 * and bad arguments, which must fail with a message naming the argument. The front end
 * (tpk/op.h): every table entry is required (tpk_ctx_init names a NULL one), and a user's own
 * table is checked before its entries are reached. Runs on one rank. */
#include "test.h"

static tpk_ctx ctx;

/* ---- helpers ------------------------------------------------------------------------------- */

static float *fbuf(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

static void to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tpk_f32_to_bf16(src[i]);
}
static void from_bf16(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tpk_bf16_to_f32(src[i]);
}
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* out[m, n] (contiguous) = alpha op(A) op(B) + beta C, in double; beta = 0 ignores C. */
static void ref_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const float *a, int64_t lda,
                     const float *b, int64_t ldb, double beta, const float *c, int64_t ldc, float *out) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) {
                double x = ta ? a[p * lda + i] : a[i * lda + p];
                double y = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += x * y;
            }
            out[i * n + j] = (float)(alpha * s + (beta != 0 ? beta * c[i * ldc + j] : 0.0));
        }
}

static double gelu_d(double x) {
    const double s = 0.7978845608028654, c = 0.044715;
    return 0.5 * x * (1.0 + tanh(s * (x + c * x * x * x)));
}
static double gelu_grad_d(double x) {
    const double s = 0.7978845608028654, c = 0.044715;
    double t = tanh(s * (x + c * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * c * x * x);
}

/* ---- memory -------------------------------------------------------------------------------- */

static void test_memory(void) {
    const tpk_ops *ops = ctx.ops;
    TEST_CASE("host ops: table, alloc, memcpy, sync") {
        CHECK(ops == tpk_ops_host(), "ctx.ops is not the host table");
        CHECK(strcmp(ops->name, "host") == 0, "name = %s", ops->name);
        CHECK(!ops->device && ops->self == NULL, "device = %d", (int)ops->device);
        CHECK(ops->alloc && ops->free && ops->memcpy && ops->sync && ops->fill && ops->copy2d && ops->cast &&
                  ops->axpby && ops->gemm && ops->bias_add && ops->bias_grad && ops->act_fwd && ops->act_bwd &&
                  ops->rng_2d,
              "an entry is NULL");

        size_t sizes[] = {0, 1, 3, 100, 4096, (size_t)1 << 22};
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            unsigned char *p = NULL;
            CHECK_OK(&ctx, tpk_op_alloc(&ctx, sizes[s], (void **)&p));
            CHECK(p != NULL, "alloc(%zu) gave NULL", sizes[s]);
            if (!p) continue;
            CHECK(((uintptr_t)p & 63) == 0, "alloc(%zu) = %p is not 64-byte aligned", sizes[s], (void *)p);
            size_t nz = 0;
            for (size_t i = 0; i < sizes[s]; i++) nz += p[i] != 0;
            CHECK(nz == 0, "alloc(%zu): %zu bytes not zero", sizes[s], nz);
            tpk_op_free(&ctx, p);
        }
        tpk_op_free(&ctx, NULL);

        void *huge = (void *)1;
        CHECK_FAILS(&ctx, tpk_op_alloc(&ctx, (size_t)1 << 62, &huge), TPK_ERR_NOMEM, "4611686018427387904 bytes");
        CHECK(huge == NULL, "failed alloc left %p", huge);
        CHECK_FAILS(&ctx, tpk_op_alloc(&ctx, SIZE_MAX, &huge), TPK_ERR_NOMEM, "bytes");

        float src[17], dst[17];
        test_randn(src, 17, 1, 1.0f);
        tpk_copy_dir dirs[] = {TPK_H2D, TPK_D2H, TPK_D2D, TPK_H2H};
        for (int d = 0; d < 4; d++) {
            test_poison(dst, 17);
            CHECK_OK(&ctx, tpk_op_memcpy(&ctx, dst, src, sizeof src, dirs[d]));
            CHECK(memcmp(dst, src, sizeof src) == 0, "memcpy dir %d differs", d);
        }
        CHECK_OK(&ctx, tpk_op_memcpy(&ctx, NULL, NULL, 0, TPK_H2H));
        CHECK_OK(&ctx, tpk_op_sync(&ctx));
    }
}

/* ---- gemm ---------------------------------------------------------------------------------- */

typedef struct gemm_case {
    int64_t m, n, k;
} gemm_case;

static const gemm_case gemm_cases[] = {{7, 5, 3}, {1, 1, 1}, {33, 17, 65}, {16, 32, 8}, {2, 9, 1}};

#define SENTINEL 12345.0f /* in C's padding, which gemm must leave alone */

/* One f32 or bf16 run of C = alpha op(A) op(B) + beta C against ref_gemm: gemm (C in dt) or, with
 * acc, gemm_acc (C f32, never rounded). pad > 0 makes every leading dimension larger than the
 * minimum; A's and B's padding is poisoned (a read shows in C) and C's must be left alone. */
static void run_gemm(tpk_dtype dt, bool acc, bool ta, bool tb, gemm_case g, int pad, float alpha, float beta, uint64_t seed,
                     double tol) {
    const char *op = acc ? "gemm_acc" : "gemm";
    int64_t m = g.m, n = g.n, k = g.k;
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    if (ldc < 1) ldc = 1;
    size_t na = (size_t)(ar * lda), nb = (size_t)(br * ldb), nc = (size_t)(m * ldc);
    float *a = fbuf(na), *b = fbuf(nb), *c = fbuf(nc), *c0 = fbuf(nc), *want = fbuf((size_t)(m * n)),
          *got = fbuf((size_t)(m * n));
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
        s = acc ? tpk_op_gemm_acc(&ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, TPK_F32)
                : tpk_op_gemm(&ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, TPK_F32);
    } else {
        uint16_t *ha = malloc(na * 2 + 2), *hb = malloc(nb * 2 + 2), *hc = malloc(nc * 2 + 2);
        to_bf16(ha, a, na), to_bf16(hb, b, nb), to_bf16(hc, c0, nc);
        if (acc) {
            s = tpk_op_gemm_acc(&ctx, ta, tb, m, n, k, alpha, ha, lda, hb, ldb, beta, c, ldc, TPK_BF16);
        } else {
            s = tpk_op_gemm(&ctx, ta, tb, m, n, k, alpha, ha, lda, hb, ldb, beta, hc, ldc, TPK_BF16);
            from_bf16(c, hc, nc);
        }
        free(ha), free(hb), free(hc);
    }
    CHECK(s == TPK_OK, "%s %s ta=%d tb=%d %lldx%lldx%lld: %s %s", tpk_dtype_name(dt), op, ta, tb, (long long)m,
          (long long)n, (long long)k, tpk_status_str(s), tpk_last_error(&ctx));
    size_t touched = 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) got[i * n + j] = c[i * ldc + j];
        for (int64_t j = n; j < ldc; j++) touched += f32_bits(c[i * ldc + j]) != f32_bits(c0[i * ldc + j]);
    }
    double e = test_relerr(got, want, (size_t)(m * n));
    CHECK(e < tol, "%s %s ta=%d tb=%d m=%lld n=%lld k=%lld alpha=%g beta=%g pad=%d: relative error %.3g >= %.3g",
          tpk_dtype_name(dt), op, ta, tb, (long long)m, (long long)n, (long long)k, alpha, beta, pad, e, tol);
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
                        run_gemm(TPK_F32, false, t & 1, t & 2, gemm_cases[g], pad, ab[s][0], ab[s][1], seed += 3, 1e-5);
    }
    TEST_CASE("host gemm bf16: 4 transposes x sizes x alpha/beta") {
        uint64_t seed = 200;
        for (size_t g = 0; g < sizeof gemm_cases / sizeof *gemm_cases; g++)
            for (int t = 0; t < 4; t++)
                for (size_t s = 0; s < sizeof ab / sizeof *ab; s++)
                    run_gemm(TPK_BF16, false, t & 1, t & 2, gemm_cases[g], 2, ab[s][0], ab[s][1], seed += 3, 1e-2);
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
        CHECK_OK(&ctx, tpk_op_gemm(&ctx, false, false, 0, 4, 3, 1.0f, NULL, 3, NULL, 4, 0.0f, NULL, 4, TPK_F32));
        CHECK_OK(&ctx, tpk_op_gemm(&ctx, true, true, 3, 0, 2, 1.0f, NULL, 3, NULL, 2, 0.0f, NULL, 1, TPK_BF16));
        CHECK_OK(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 0, 1.0f, NULL, 1, NULL, 2, 0.0f, c, 2, TPK_F32));
        CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 0, "k = 0, beta = 0: C = %g %g %g %g", c[0], c[1], c[2], c[3]);
        /* alpha = 0: C = beta C even with NaN in A and B */
        float a[6], b[6], c2[4] = {1, 2, 3, 4};
        test_poison(a, 6), test_poison(b, 6);
        CHECK_OK(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 3, 0.0f, a, 3, b, 2, 2.0f, c2, 2, TPK_F32));
        CHECK(c2[0] == 2 && c2[1] == 4 && c2[2] == 6 && c2[3] == 8, "alpha = 0: C = %g %g %g %g", c2[0], c2[1], c2[2],
              c2[3]);
    }
}

/* ---- gemm_acc: f32 or bf16 operands into an f32 C ------------------------------------------ */

static void test_gemm_acc(void) {
    const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 1.0f}, {1.5f, 0.25f}};
    TEST_CASE("host gemm_acc f32 and bf16 operands into f32 C: 4 transposes x sizes x alpha/beta, padded leading dims") {
        uint64_t seed = 700;
        for (int d = 0; d < 2; d++)
            for (size_t g = 0; g < sizeof gemm_cases / sizeof *gemm_cases; g++)
                for (int t = 0; t < 4; t++)
                    for (size_t s = 0; s < sizeof ab / sizeof *ab; s++)
                        for (int pad = 0; pad <= 3; pad += 3)
                            run_gemm(d ? TPK_BF16 : TPK_F32, true, t & 1, t & 2, gemm_cases[g], pad, ab[s][0], ab[s][1], seed += 3, 1e-5);
        const gemm_case empty[] = {{0, 5, 3}, {4, 0, 3}, {0, 0, 0}, {4, 5, 0}, {1, 1, 0}};
        for (size_t g = 0; g < sizeof empty / sizeof *empty; g++)
            for (int t = 0; t < 4; t++) {
                run_gemm(TPK_BF16, true, t & 1, t & 2, empty[g], 1, 1.0f, 0.0f, 800 + g, 1e-5);
                run_gemm(TPK_BF16, true, t & 1, t & 2, empty[g], 2, 1.0f, 1.0f, 810 + g, 1e-5);
                run_gemm(TPK_F32, true, t & 1, t & 2, empty[g], 1, 2.0f, -3.0f, 820 + g, 1e-5);
            }
        /* the sum carries f32 precision: most elements are not bf16 values (a rounded C would be) */
        enum { M = 33, N = 17, K = 65 };
        float a[M * K], b[K * N], c[M * N];
        uint16_t ha[M * K], hb[K * N];
        test_randn(a, M * K, 900, 1.0f), test_randn(b, K * N, 901, 1.0f), test_randn(c, M * N, 902, 1.0f);
        to_bf16(ha, a, M * K), to_bf16(hb, b, K * N);
        CHECK_OK(&ctx, tpk_op_gemm_acc(&ctx, false, false, M, N, K, 1.0f, ha, K, hb, N, 1.0f, c, N, TPK_BF16));
        size_t exact = 0;
        for (int i = 0; i < M * N; i++) exact += c[i] == tpk_bf16_to_f32(tpk_f32_to_bf16(c[i]));
        CHECK(exact < (size_t)(M * N / 8), "%zu of %d elements of C are bf16 values", exact, M * N);
        /* alpha = 0: C = beta C, NaN in A and B not read */
        uint16_t na[6], nb[6];
        float c2[4] = {1, 2, 3, 4};
        for (int i = 0; i < 6; i++) na[i] = nb[i] = 0x7fc0; /* bf16 NaN */
        CHECK_OK(&ctx, tpk_op_gemm_acc(&ctx, false, false, 2, 2, 3, 0.0f, na, 3, nb, 2, 2.0f, c2, 2, TPK_BF16));
        CHECK(c2[0] == 2 && c2[1] == 4 && c2[2] == 6 && c2[3] == 8, "alpha = 0: C = %g %g %g %g", c2[0], c2[1], c2[2], c2[3]);
        CHECK_OK(&ctx, tpk_op_gemm_acc(&ctx, true, true, 3, 0, 2, 1.0f, NULL, 3, NULL, 2, 0.0f, NULL, 1, TPK_BF16)); /* nothing touched */
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
            {0, 0, -1, 4, 4, 4, 4, 4, 0, "m: expected >= 0, got -1"},  {0, 0, 4, -2, 4, 4, 4, 4, 0, "n: expected >= 0, got -2"},
            {0, 0, 4, 4, -3, 4, 4, 4, 0, "k: expected >= 0, got -3"},  {0, 0, 4, 6, 5, 3, 6, 6, 0, "lda: expected >= 5, got 3"},
            {1, 0, 4, 6, 5, 3, 6, 6, 0, "lda: expected >= 4, got 3"},  {0, 0, 4, 6, 5, 5, 5, 6, 0, "ldb: expected >= 6, got 5"},
            {0, 1, 4, 6, 5, 5, 4, 6, 0, "ldb: expected >= 5, got 4"},  {0, 0, 4, 6, 5, 5, 6, 2, 0, "ldc: expected >= 6, got 2"},
            {0, 0, 2, 2, 2, 2, 2, 2, 1, "a: expected a buffer, got NULL"}, {0, 0, 2, 2, 2, 2, 2, 2, 2, "b: expected a buffer, got NULL"},
            {0, 0, 2, 2, 2, 2, 2, 2, 3, "c: expected a buffer, got NULL"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            char want[96];
            snprintf(want, sizeof want, "%s%s", fn, bad[i].msg);
            CHECK_FAILS(&ctx, tpk_op_gemm_acc(&ctx, bad[i].ta, bad[i].tb, bad[i].m, bad[i].n, bad[i].k, 1, bad[i].nul == 1 ? NULL : a, bad[i].lda,
                                              bad[i].nul == 2 ? NULL : b, bad[i].ldb, 0, bad[i].nul == 3 ? NULL : c, bad[i].ldc, TPK_BF16),
                        TPK_ERR_ARG, want);
        }
        CHECK_FAILS(&ctx, tpk_op_gemm_acc(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2, TPK_I32), TPK_ERR_DTYPE,
                    "tpk_op_gemm_acc: dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_gemm_acc(&ctx, false, false, (int64_t)1 << 32, 1, 1, 1, a, 1, b, 1, 0, c, 1, TPK_BF16), TPK_ERR_ARG,
                    "host.gemm_acc: m: expected <= 2147483647");
        CHECK(c[0] == 0, "a refused call wrote C");
    }
}

/* ---- bias ---------------------------------------------------------------------------------- */

static void test_bias(void) {
    TEST_CASE("host bias_add and bias_grad (f32, bf16, accumulate on and off)") {
        const int64_t shapes[][2] = {{7, 5}, {1, 1}, {33, 17}, {1, 64}, {64, 1}};
        for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
            int64_t rows = shapes[sh][0], cols = shapes[sh][1];
            size_t n = (size_t)(rows * cols);
            float *y = fbuf(n), *bias = fbuf((size_t)cols), *want = fbuf(n), *got = fbuf(n);
            float *db0 = fbuf((size_t)cols), *db = fbuf((size_t)cols), *dbw = fbuf((size_t)cols);
            uint16_t *hy = malloc(n * 2), *hb = malloc((size_t)cols * 2), *hdb = malloc((size_t)cols * 2);
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
                    for (int64_t j = 0; j < cols; j++) want[i * cols + j] = (float)((double)y[i * cols + j] + bias[j]);
                if (bf) {
                    CHECK_OK(&ctx, tpk_op_bias_add(&ctx, hy, hb, rows, cols, dt));
                    from_bf16(got, hy, n);
                } else {
                    memcpy(got, y, n * sizeof(float));
                    CHECK_OK(&ctx, tpk_op_bias_add(&ctx, got, bias, rows, cols, dt));
                }
                CHECK(test_relerr(got, want, n) < tol, "bias_add %s %lldx%lld: relative error %.3g", tpk_dtype_name(dt),
                      (long long)rows, (long long)cols, test_relerr(got, want, n));

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
                    CHECK(e < tol, "bias_grad %s %lldx%lld accumulate=%d: relative error %.3g", tpk_dtype_name(dt),
                          (long long)rows, (long long)cols, acc, e);
                    if (bf) { /* db in f32 from bf16 dy: the sums not rounded to bf16 (1e-6, where a bf16 db is off by ~4e-3) */
                        if (acc) memcpy(db, db0, (size_t)cols * sizeof(float));
                        else test_poison(db, (size_t)cols);
                        CHECK_OK(&ctx, tpk_op_bias_grad(&ctx, db, hy, rows, cols, dt, TPK_F32, acc));
                        e = test_relerr(db, dbw, (size_t)cols);
                        CHECK(e < 1e-6, "bias_grad bf16 into f32 %lldx%lld accumulate=%d: relative error %.3g", (long long)rows, (long long)cols, acc, e);
                    }
                }
            }
            free(y), free(bias), free(want), free(got), free(db0), free(db), free(dbw), free(hy), free(hb), free(hdb);
        }
        /* rows = 0: db = 0 (or unchanged when accumulating) */
        float db[3];
        test_poison(db, 3);
        CHECK_OK(&ctx, tpk_op_bias_grad(&ctx, db, NULL, 0, 3, TPK_F32, TPK_F32, false));
        CHECK(db[0] == 0 && db[1] == 0 && db[2] == 0, "rows = 0: db = %g %g %g", db[0], db[1], db[2]);
        db[0] = 1, db[1] = 2, db[2] = 3;
        CHECK_OK(&ctx, tpk_op_bias_grad(&ctx, db, NULL, 0, 3, TPK_F32, TPK_F32, true));
        CHECK(db[0] == 1 && db[1] == 2 && db[2] == 3, "rows = 0, accumulate: db = %g %g %g", db[0], db[1], db[2]);
    }
}

/* ---- GELU ---------------------------------------------------------------------------------- */

static void test_gelu(void) {
    TEST_CASE("host gelu_fwd and gelu_bwd (reference, finite differences, dx aliasing dy, bf16)") {
        const size_t n = 1001;
        float *x = fbuf(n), *dy = fbuf(n), *y = fbuf(n), *dx = fbuf(n), *want = fbuf(n), *fd = fbuf(n);
        test_randn(x, n, 500, 3.0f);
        x[0] = 0, x[1] = -10, x[2] = 10, x[3] = 1e-4f, x[4] = -6;
        test_randn(dy, n, 501, 1.0f);

        test_poison(y, n);
        CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_GELU_TANH, y, x, TPK_F32, n));
        for (size_t i = 0; i < n; i++) want[i] = (float)gelu_d(x[i]);
        CHECK_CLOSE(y, want, n, 1e-6, "gelu_fwd f32");

        test_poison(dx, n);
        CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, dx, x, dy, TPK_F32, n));
        for (size_t i = 0; i < n; i++) {
            want[i] = (float)(dy[i] * gelu_grad_d(x[i]));
            double h = 1e-5;
            fd[i] = (float)(dy[i] * (gelu_d((double)x[i] + h) - gelu_d((double)x[i] - h)) / (2 * h));
        }
        CHECK_CLOSE(dx, want, n, 1e-6, "gelu_bwd f32 vs analytic");
        CHECK_CLOSE(dx, fd, n, 1e-5, "gelu_bwd f32 vs finite differences of gelu");

        /* dx aliasing dy */
        float *g = fbuf(n);
        memcpy(g, dy, n * sizeof(float));
        CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, g, x, g, TPK_F32, n));
        CHECK(memcmp(g, dx, n * sizeof(float)) == 0, "gelu_bwd in place (dx == dy) differs from out of place");

        /* bf16: inputs rounded, output within bf16 precision */
        uint16_t *hx = malloc(n * 2), *hdy = malloc(n * 2), *hy = malloc(n * 2);
        to_bf16(hx, x, n), to_bf16(hdy, dy, n);
        float *xr = fbuf(n), *dyr = fbuf(n);
        from_bf16(xr, hx, n), from_bf16(dyr, hdy, n);
        CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_GELU_TANH, hy, hx, TPK_BF16, n));
        from_bf16(y, hy, n);
        for (size_t i = 0; i < n; i++) want[i] = (float)gelu_d(xr[i]);
        CHECK_CLOSE(y, want, n, 1e-2, "gelu_fwd bf16");
        CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, hdy, hx, hdy, TPK_BF16, n)); /* in place */
        from_bf16(dx, hdy, n);
        for (size_t i = 0; i < n; i++) want[i] = (float)(dyr[i] * gelu_grad_d(xr[i]));
        CHECK_CLOSE(dx, want, n, 1e-2, "gelu_bwd bf16");

        free(x), free(dy), free(y), free(dx), free(want), free(fd), free(g), free(hx), free(hdy), free(hy), free(xr),
            free(dyr);
    }
    TEST_CASE("host act_fwd and act_bwd with TPK_ACT_NONE: y = x and dx = dy exactly, in place too, f32 and bf16") {
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
        CHECK(memcmp(y, x, sizeof x) == 0 && memcmp(dx, dy, sizeof dy) == 0, "act none in place changed the values");
        uint16_t hx[257], hy[257];
        to_bf16(hx, x, n);
        memset(hy, 0xff, sizeof hy);
        CHECK_OK(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_NONE, hy, hx, TPK_BF16, n));
        CHECK(memcmp(hy, hx, sizeof hx) == 0, "act_fwd none bf16: y != x");
        memset(hy, 0xff, sizeof hy);
        CHECK_OK(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_NONE, hy, NULL, hx, TPK_BF16, n)); /* x is not read: may be NULL */
        CHECK(memcmp(hy, hx, sizeof hx) == 0, "act_bwd none bf16: dx != dy");
        CHECK_FAILS(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, hy, NULL, hx, TPK_BF16, n), TPK_ERR_ARG, "tpk_op_act_bwd: x: expected a buffer");
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
        CHECK_OK(&ctx, tpk_op_fill(&ctx, h, TPK_BF16, 8, 1.0f + 1.0f / 256)); /* halfway: rounds to 1.0 */
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
        CHECK(id[0] == -2 && id[1] == 3 && id[2] == -2147483647 - 1 && id[3] == 6, "copy2d i32: %d %d %d %d", id[0],
              id[1], id[2], id[3]);
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
            for (size_t i = 0; i < n; i++) want[i] = (float)((double)a * xx[i] + (b != 0 ? (double)b * y0[i] : 0.0));
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
            CHECK(h[i] == cases[i][1], "cast %#010x -> bf16: got %#06x, expected %#06x", cases[i][0], h[i], cases[i][1]);
        CHECK(h[nc] == 0xABCD, "cast wrote past n");

        /* NaNs (including one whose payload is only in the low 16 bits) stay NaN */
        const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FA00000u, 0xFF800100u};
        float fn[5];
        uint16_t hn[5];
        for (int i = 0; i < 5; i++) fn[i] = bits_f32(nans[i]);
        CHECK_OK(&ctx, tpk_op_cast(&ctx, hn, TPK_BF16, fn, TPK_F32, 5));
        for (int i = 0; i < 5; i++) {
            CHECK((hn[i] & 0x7F80u) == 0x7F80u && (hn[i] & 0x007Fu) != 0, "NaN %#010x -> %#06x is not NaN", nans[i], hn[i]);
            CHECK((hn[i] & 0x8000u) == ((nans[i] >> 16) & 0x8000u), "NaN %#010x -> %#06x lost its sign", nans[i], hn[i]);
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

/* ---- rng ----------------------------------------------------------------------------------- */

static void test_rng(void) {
    TEST_CASE("host rng_2d: normal and uniform moments, a + b draw, sub-blocks equal the full draw") {
        const int64_t rows = 250, cols = 400; /* 1e5 draws */
        const size_t n = (size_t)(rows * cols);
        float *x = fbuf(n);
        test_poison(x, n);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, x, TPK_F32, rows, cols, cols, 0, 0, 42, 7, TPK_RNG_NORMAL, 0.0f, 1.0f));
        double s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
        double mean = s / n, sd = sqrt(s2 / n - mean * mean);
        CHECK(fabs(mean) < 0.02 && fabs(sd - 1) < 0.02, "normal: mean %.4f std %.4f", mean, sd);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += x[i] != tpk_rng_normal(42, 7, i);
        CHECK(bad == 0, "normal: %zu draws differ from tpk_rng_normal", bad);

        test_poison(x, n);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, x, TPK_F32, rows, cols, cols, 0, 0, 42, 8, TPK_RNG_UNIFORM, 0.0f, 1.0f));
        double lo = 1, hi = 0;
        s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) {
            lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
            s += x[i], s2 += (double)x[i] * x[i];
            bad += !(x[i] >= 0.0f && x[i] < 1.0f);
        }
        mean = s / n, sd = sqrt(s2 / n - mean * mean);
        CHECK(bad == 0, "uniform: %zu draws outside [0, 1) (min %g max %g)", bad, lo, hi);
        CHECK(fabs(mean - 0.5) < 0.01 && fabs(sd - sqrt(1.0 / 12)) < 0.01, "uniform: mean %.4f std %.4f", mean, sd);

        /* a + b draw */
        float *ref = fbuf(n);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, x, TPK_F32, rows, cols, cols, 0, 0, 3, 9, TPK_RNG_NORMAL, 2.0f, 0.02f));
        for (size_t i = 0; i < n; i++) ref[i] = (float)(2.0 + 0.02 * (double)tpk_rng_normal(3, 9, i));
        CHECK_CLOSE(x, ref, n, 1e-6, "a + b * normal");

        /* shards: [r0, r0 + sr) x [c0, c0 + sc) of the full [rows, cols] draw, bitwise */
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, ref, TPK_F32, rows, cols, cols, 0, 0, 11, 12, TPK_RNG_NORMAL, 0.5f, 0.1f));
        const int64_t blocks[][4] = {{0, 0, 250, 400}, {0, 133, 250, 134}, {17, 0, 5, 400}, {101, 257, 33, 143}, {249, 399, 1, 1}};
        for (int bi = 0; bi < 5; bi++) {
            int64_t r0 = blocks[bi][0], c0 = blocks[bi][1], sr = blocks[bi][2], sc = blocks[bi][3];
            float *blk = fbuf((size_t)(sr * sc));
            test_poison(blk, (size_t)(sr * sc));
            CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, blk, TPK_F32, sr, sc, cols, r0, c0, 11, 12, TPK_RNG_NORMAL, 0.5f, 0.1f));
            size_t diff = 0;
            for (int64_t i = 0; i < sr; i++)
                for (int64_t j = 0; j < sc; j++) diff += f32_bits(blk[i * sc + j]) != f32_bits(ref[(r0 + i) * cols + c0 + j]);
            CHECK(diff == 0, "block rows %lld+%lld cols %lld+%lld: %zu elements differ from the full draw", (long long)r0,
                  (long long)sr, (long long)c0, (long long)sc, diff);
            free(blk);
        }

        /* bf16 draws are the f32 draws rounded */
        uint16_t *h = malloc(n * 2);
        CHECK_OK(&ctx, tpk_op_rng_2d(&ctx, h, TPK_BF16, rows, cols, cols, 0, 0, 11, 12, TPK_RNG_NORMAL, 0.5f, 0.1f));
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += h[i] != tpk_f32_to_bf16(ref[i]);
        CHECK(bad == 0, "bf16 rng: %zu elements are not the rounded f32 draws", bad);
        free(x), free(ref), free(h);
    }
}

/* ---- bad arguments ------------------------------------------------------------------------- */

static void test_errors(void) {
    float a[64] = {0}, b[64] = {0}, c[64] = {0};
    TEST_CASE("host gemm: bad arguments fail with a message naming them") {
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, -1, 4, 4, 1, a, 4, b, 4, 0, c, 4, TPK_F32), TPK_ERR_ARG,
                    "m: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, -2, 4, 1, a, 4, b, 4, 0, c, 4, TPK_F32), TPK_ERR_ARG,
                    "n: expected >= 0, got -2");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, 4, -3, 1, a, 4, b, 4, 0, c, 4, TPK_F32), TPK_ERR_ARG,
                    "k: expected >= 0, got -3");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, 6, 5, 1, a, 3, b, 6, 0, c, 6, TPK_F32), TPK_ERR_ARG,
                    "lda: expected >= 5, got 3");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, true, false, 4, 6, 5, 1, a, 3, b, 6, 0, c, 6, TPK_F32), TPK_ERR_ARG,
                    "lda: expected >= 4, got 3");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, 6, 5, 1, a, 5, b, 5, 0, c, 6, TPK_F32), TPK_ERR_ARG,
                    "ldb: expected >= 6, got 5");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, true, 4, 6, 5, 1, a, 5, b, 4, 0, c, 6, TPK_F32), TPK_ERR_ARG,
                    "ldb: expected >= 5, got 4");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, 6, 5, 1, a, 5, b, 6, 0, c, 2, TPK_F32), TPK_ERR_ARG,
                    "ldc: expected >= 6, got 2");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 0, 0, 0, 1, a, 0, b, 1, 0, c, 1, TPK_F32), TPK_ERR_ARG,
                    "lda: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, NULL, 2, b, 2, 0, c, 2, TPK_F32), TPK_ERR_ARG,
                    "a: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, NULL, 2, 0, c, 2, TPK_F32), TPK_ERR_ARG,
                    "b: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, NULL, 2, TPK_F32), TPK_ERR_ARG,
                    "c: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2, TPK_I32), TPK_ERR_DTYPE,
                    "dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2, (tpk_dtype)7), TPK_ERR_DTYPE,
                    "got ? (7)");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, (int64_t)1 << 32, 1, 1, 1, a, 1, b, 1, 0, c, 1, TPK_F32),
                    TPK_ERR_ARG, "m: expected <= 2147483647");
        /* valid for the front end; OpenBLAS's int limit is the host backend's own check */
        CHECK(strncmp(tpk_last_error(&ctx), "host.gemm: ", 11) == 0, "message \"%s\" does not name host.gemm",
              tpk_last_error(&ctx));
    }
    TEST_CASE("host ops: bad arguments to the other entries") {
        void *p = NULL;
        CHECK_FAILS(&ctx, tpk_op_alloc(&ctx, 16, NULL), TPK_ERR_ARG, "out:");
        CHECK_FAILS(&ctx, tpk_op_memcpy(&ctx, NULL, a, 4, TPK_H2D), TPK_ERR_ARG, "dst: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_memcpy(&ctx, b, NULL, 4, TPK_D2H), TPK_ERR_ARG, "src: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_memcpy(&ctx, b, a, 4, (tpk_copy_dir)9), TPK_ERR_ARG, "dir:");
        CHECK_FAILS(&ctx, tpk_op_fill(&ctx, NULL, TPK_F32, 3, 0), TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_fill(&ctx, a, TPK_I32, 3, 0), TPK_ERR_DTYPE, "dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 4, b, 2, 2, 3, TPK_F32), TPK_ERR_ARG, "lds: expected >= 3, got 2");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 2, b, 4, 2, 3, TPK_F32), TPK_ERR_ARG, "ldd: expected >= 3, got 2");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 4, b, 4, -1, 3, TPK_F32), TPK_ERR_ARG, "rows: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 4, b, 4, 1, 3, (tpk_dtype)5), TPK_ERR_DTYPE, "dt:");
        CHECK_FAILS(&ctx, tpk_op_cast(&ctx, a, TPK_F32, b, TPK_I32, 3), TPK_ERR_DTYPE, "src_dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_cast(&ctx, a, TPK_I32, b, TPK_BF16, 3), TPK_ERR_DTYPE, "dst_dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_cast(&ctx, NULL, TPK_BF16, b, TPK_F32, 3), TPK_ERR_ARG, "dst: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_axpby(&ctx, a, 1, NULL, 1, TPK_F32, 3), TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_axpby(&ctx, a, 1, b, 1, TPK_I32, 3), TPK_ERR_DTYPE, "dt:");
        CHECK_FAILS(&ctx, tpk_op_bias_add(&ctx, a, NULL, 2, 3, TPK_F32), TPK_ERR_ARG, "bias: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_bias_add(&ctx, a, b, 2, -3, TPK_F32), TPK_ERR_ARG, "cols: expected >= 0, got -3");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, -2, 3, TPK_F32, TPK_F32, false), TPK_ERR_ARG, "rows: expected >= 0, got -2");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, NULL, b, 2, 3, TPK_F32, TPK_F32, false), TPK_ERR_ARG, "db: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, 2, 3, TPK_I32, TPK_I32, true), TPK_ERR_DTYPE, "got i32");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, 2, 3, TPK_F32, TPK_BF16, true), TPK_ERR_DTYPE, "db_dt: expected f32 or f32, got bf16");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, 2, 3, TPK_BF16, TPK_I32, true), TPK_ERR_DTYPE, "db_dt: expected bf16 or f32, got i32");
        CHECK_FAILS(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_GELU_TANH, a, NULL, TPK_F32, 3), TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_GELU_TANH, a, b, TPK_I32, 3), TPK_ERR_DTYPE, "tpk_op_act_fwd: dt:");
        CHECK_FAILS(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, a, b, NULL, TPK_F32, 3), TPK_ERR_ARG, "dy: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, a, b, c, (tpk_dtype)-1, 3), TPK_ERR_DTYPE, "tpk_op_act_bwd: dt:");
        CHECK_FAILS(&ctx, tpk_op_rng_2d(&ctx, a, TPK_F32, 2, 3, 4, 0, 2, 1, 1, TPK_RNG_NORMAL, 0, 1), TPK_ERR_ARG,
                    "gcols: expected >= col0 + cols = 5, got 4");
        CHECK_FAILS(&ctx, tpk_op_rng_2d(&ctx, a, TPK_F32, 2, 3, 4, -1, 0, 1, 1, TPK_RNG_NORMAL, 0, 1), TPK_ERR_ARG,
                    "row0: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_rng_2d(&ctx, a, TPK_F32, 2, 3, 4, 0, 0, 1, 1, (tpk_rng_dist)3, 0, 1), TPK_ERR_ARG, "dist:");
        CHECK_FAILS(&ctx, tpk_op_rng_2d(&ctx, NULL, TPK_F32, 2, 3, 4, 0, 0, 1, 1, TPK_RNG_UNIFORM, 0, 1), TPK_ERR_ARG,
                    "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_rng_2d(&ctx, a, TPK_I32, 2, 3, 4, 0, 0, 1, 1, TPK_RNG_UNIFORM, 0, 1), TPK_ERR_DTYPE,
                    "got i32");
        (void)p;
    }
}

/* ---- the front end: every entry required, a user's own table checked ---------------------- */

/* Every entry of tpk_ops after `device`; the list must tile the table (a new entry fails the
 * test until it is listed here, and tpk__ops_missing must then name it). */
#define OPS_ENTRY(e) {#e, offsetof(tpk_ops, e), sizeof(((tpk_ops *)0)->e)}
struct ops_entry {
    const char *name;
    size_t at, size;
};
static const struct ops_entry ops_entries[] = { /* required (TPK__OPS_CORE) */
    OPS_ENTRY(alloc),   OPS_ENTRY(free),     OPS_ENTRY(memcpy),   OPS_ENTRY(sync),   OPS_ENTRY(fill),   OPS_ENTRY(copy2d),
    OPS_ENTRY(cast),    OPS_ENTRY(axpby),    OPS_ENTRY(gemm),     OPS_ENTRY(gemm_acc), OPS_ENTRY(bias_add), OPS_ENTRY(bias_grad),
    OPS_ENTRY(act_fwd), OPS_ENTRY(act_bwd),  OPS_ENTRY(rng_2d),   OPS_ENTRY(adamw),  OPS_ENTRY(sumsq),
};
enum { OPS_N = sizeof ops_entries / sizeof *ops_entries };
/* the optional entries: the layers' ops (TPK__OPS_LAYERS: a call of a NULL one fails naming it),
 * the fusions (TPK__OPS_FUSED: the front end composes them) and the profiler's timer (tpk/profile.h
 * falls back to the host clock) */
static const struct ops_entry optional_entries[] = {
    OPS_ENTRY(dropout),     OPS_ENTRY(layernorm_fwd), OPS_ENTRY(layernorm_bwd), OPS_ENTRY(embed_fwd),  OPS_ENTRY(embed_bwd),
    OPS_ENTRY(xent_stats),  OPS_ENTRY(xent_loss),     OPS_ENTRY(xent_mean),     OPS_ENTRY(xent_grad),  OPS_ENTRY(attn_fwd),
    OPS_ENTRY(attn_bwd),    OPS_ENTRY(rope),          OPS_ENTRY(swiglu_fwd),    OPS_ENTRY(swiglu_bwd), OPS_ENTRY(rmsnorm_fwd),
    OPS_ENTRY(rmsnorm_bwd), OPS_ENTRY(linear_fwd),    OPS_ENTRY(linear_bwd_act), OPS_ENTRY(residual_layernorm_fwd),
    OPS_ENTRY(xent_fused),  OPS_ENTRY(timer_mark),    OPS_ENTRY(timer_ms)};
enum { OPTIONAL_N = sizeof optional_entries / sizeof *optional_entries };

/* a user's table: the host's, with entries that count their calls (and then do the host's work) */
static int user_calls;
static tpk_status user_gemm(tpk_ctx *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *cc, int64_t ldc, tpk_dtype dt) {
    user_calls++;
    return tpk_ops_host()->gemm(c, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cc, ldc, dt);
}
static tpk_status user_act_fwd(tpk_ctx *c, tpk_act act, void *y, const void *x, tpk_dtype dt, size_t n) {
    user_calls++;
    return tpk_ops_host()->act_fwd(c, act, y, x, dt, n);
}
static tpk_status user_xent_loss(tpk_ctx *c, float *loss, float *lse, const float *part, int64_t P, const int32_t *targets,
                                 int64_t T, int64_t V, float smoothing, int32_t ignore_index) {
    user_calls++;
    return tpk_ops_host()->xent_loss(c, loss, lse, part, P, targets, T, V, smoothing, ignore_index);
}
static tpk_status user_attn_fwd(tpk_ctx *c, void *out, float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al, int64_t D,
                                int64_t A, int64_t G, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    user_calls++;
    return tpk_ops_host()->attn_fwd(c, out, lse, qkv, B, S, Al, D, A, G, head0, scale, p, seed, stream, dt);
}
static tpk_status user_layernorm_fwd(tpk_ctx *c, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                                     int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    user_calls++;
    return tpk_ops_host()->layernorm_fwd(c, y, mean, rstd, x, w, b, rows, cols, eps, dt);
}

static void test_front_end(void) {
    TEST_CASE("every required tpk_ops entry: tpk_ctx_init refuses a table with one NULL, naming it; layer ops, fusions, timer may be NULL") {
        size_t covered = 0;
        for (int e = 0; e < OPS_N; e++) covered += ops_entries[e].size;
        for (int e = 0; e < OPTIONAL_N; e++) covered += optional_entries[e].size;
        CHECK(offsetof(tpk_ops, alloc) + covered == sizeof(tpk_ops),
              "tpk_ops has %zu bytes of entries, this test lists %zu: list the new entry in ops_entries",
              sizeof(tpk_ops) - offsetof(tpk_ops, alloc), covered);
        for (int e = 0; e < OPS_N; e++) {
            static tpk_ops holed;
            holed = *tpk_ops_host();
            memset((char *)&holed + ops_entries[e].at, 0, ops_entries[e].size); /* a NULL function pointer */
            tpk_ctx c;
            char want[160];
            snprintf(want, sizeof want, "desc->ops: the table \"host\" has no %s entry", ops_entries[e].name);
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &holed}), TPK_ERR_ARG, want);
            CHECK(c.ops == NULL, "%s: a refused table stays in the context", ops_entries[e].name);
            tpk_ctx_destroy(&c);
        }
        for (int e = 0; e < OPTIONAL_N; e++) { /* the optional entries may be NULL */
            static tpk_ops bare;
            bare = *tpk_ops_host();
            memset((char *)&bare + optional_entries[e].at, 0, optional_entries[e].size);
            tpk_ctx c;
            CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &bare}));
            tpk_ctx_destroy(&c);
        }
        static tpk_ops unnamed;
        unnamed = *tpk_ops_host();
        unnamed.name = NULL;
        tpk_ctx c;
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &unnamed}), TPK_ERR_ARG, "has no name entry");
        tpk_ctx_destroy(&c);
    }
    TEST_CASE("the front end checks a user's own table: bad arguments never reach its entries; no context, no table") {
        static tpk_ops mine;
        mine = *tpk_ops_host();
        mine.name = "mine";
        mine.gemm = user_gemm, mine.act_fwd = user_act_fwd, mine.xent_loss = user_xent_loss, mine.attn_fwd = user_attn_fwd;
        mine.layernorm_fwd = user_layernorm_fwd;
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &mine}));
        float a[64] = {0}, b[64] = {0}, o[64] = {0};
        int32_t tg[4] = {0};
        user_calls = 0;
        CHECK_FAILS(&c, tpk_op_gemm(&c, false, false, 4, 4, 4, 1, a, 3, b, 4, 0, o, 4, TPK_F32), TPK_ERR_ARG, "tpk_op_gemm: lda: expected >= 4, got 3");
        CHECK_FAILS(&c, tpk_op_gemm(&c, false, false, 2, 2, 2, 1, NULL, 2, b, 2, 0, o, 2, TPK_F32), TPK_ERR_ARG, "tpk_op_gemm: a: expected a buffer");
        CHECK_FAILS(&c, tpk_op_gemm(&c, true, false, 2, 2, 2, 1, a, 2, b, 2, 0, o, 2, TPK_I32), TPK_ERR_DTYPE, "tpk_op_gemm: dt:");
        CHECK_FAILS(&c, tpk_op_act_fwd(&c, (tpk_act)5, o, a, TPK_F32, 4), TPK_ERR_ARG, "tpk_op_act_fwd: act:");
        CHECK_FAILS(&c, tpk_op_xent_loss(&c, o, o, a, 1, tg, 2, 4, -0.5f, -100), TPK_ERR_ARG, "tpk_op_xent_loss: smoothing");
        CHECK_FAILS(&c, tpk_op_attn_fwd(&c, o, o, a, 1, 2, 2, 4, 2, 2, 1, 1, 0, 0, 0, TPK_F32), TPK_ERR_ARG, "tpk_op_attn_fwd: head0");
        CHECK_FAILS(&c, tpk_op_layernorm_fwd(&c, o, o, o, a, a, a, 2, 4, 0.0f, TPK_F32), TPK_ERR_ARG, "tpk_op_layernorm_fwd: eps");
        CHECK(user_calls == 0, "the user's entries were called %d times with bad arguments", user_calls);
        /* empty work is done by the front end too: the entries are not called */
        CHECK_OK(&c, tpk_op_gemm(&c, false, false, 0, 4, 4, 1, NULL, 4, NULL, 4, 0, NULL, 4, TPK_F32));
        CHECK_OK(&c, tpk_op_act_fwd(&c, TPK_ACT_GELU_TANH, NULL, NULL, TPK_F32, 0));
        CHECK(user_calls == 0, "the user's entries were called %d times for empty work", user_calls);
        /* valid arguments reach them */
        CHECK_OK(&c, tpk_op_gemm(&c, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, o, 2, TPK_F32));
        CHECK_OK(&c, tpk_op_act_fwd(&c, TPK_ACT_GELU_TANH, o, a, TPK_F32, 4));
        CHECK(user_calls == 2, "the user's entries were called %d times for 2 valid calls", user_calls);
        tpk_ctx_destroy(&c);
        /* no context: TPK_ERR_ARG (nowhere to leave a message); a context without a table: named */
        CHECK(tpk_op_gemm(NULL, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, o, 2, TPK_F32) == TPK_ERR_ARG, "gemm without a context");
        tpk_ctx bare;
        memset(&bare, 0, sizeof bare);
        CHECK_FAILS(&bare, tpk_op_fill(&bare, o, TPK_F32, 4, 0.0f), TPK_ERR_ARG, "tpk_op_fill: ctx->ops: expected a backend table, got NULL");
        CHECK_FAILS(&bare, tpk_op_sync(&bare), TPK_ERR_ARG, "tpk_op_sync: ctx->ops");
        tpk_op_free(&bare, o); /* nothing to free it with: nothing happens */
    }
}

/* AdamW and sum of squares against a double reference over 3 steps */
static void test_optimizer(void) {
    TEST_CASE("host adamw (3 steps, grad_scale, weight decay on runs of elements, then on all) and sumsq against double references") {
        enum { N = 257 };
        const int64_t runs[4] = {3, 10, 20, 257}; /* decayed: [3, 10) and [20, 257) */
        float w[N], g[N], m[N] = {0}, v[N] = {0};
        double wr[N], mr[N] = {0}, vr[N] = {0};
        test_randn(w, N, 81, 1.0f);
        for (int i = 0; i < N; i++) wr[i] = w[i];
        const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
        for (int step = 1; step <= 3; step++) {
            test_randn(g, N, 90 + (uint64_t)step, 1.0f);
            bool all = step == 3; /* steps 1, 2 with the runs, step 3 with decay everywhere (NULL) */
            for (int i = 0; i < N; i++) {
                double gi = g[i] * gs, wdi = all || (i >= 3 && i < 10) || i >= 20 ? wd : 0.0;
                mr[i] = b1 * mr[i] + (1 - b1) * gi, vr[i] = b2 * vr[i] + (1 - b2) * gi * gi;
                wr[i] -= lr * (mr[i] / (1 - pow(b1, step)) / (sqrt(vr[i] / (1 - pow(b2, step))) + eps) + wdi * wr[i]);
            }
            CHECK_OK(&ctx, tpk_op_adamw(&ctx, w, g, m, v, N, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, step, (float)gs, NULL, 0.0f,
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
        uint16_t w16[N], w16p[N]; /* the bf16 copy made by the update: every element bf16(w), nothing else changed */
        memset(w16, 0xff, sizeof w16);
        CHECK_OK(&ctx, tpk_op_adamw(&ctx, w1, g, m1, v1, N, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, 0.5f, nrm, 1.0f, runs, 2, w16));
        CHECK_OK(&ctx, tpk_op_adamw(&ctx, w2, g, m2, v2, N, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, 0.5f * (float)(1.0 / N0), NULL, 0.0f, runs, 2, NULL));
        CHECK(N0 > 1.0 && !memcmp(w1, w2, sizeof w1) && !memcmp(m1, m2, sizeof m1) && !memcmp(v1, v2, sizeof v1) && nrm[1] == 0,
              "clipping from the sum of squares (norm %g) differs from the scale given", N0);
        int bad16 = 0;
        for (int i = 0; i < N; i++) bad16 += w16[i] != tpk_f32_to_bf16(w1[i]);
        CHECK(bad16 == 0, "adamw's bf16 copy: %d of %d elements are not bf16(w)", bad16, N);
        memcpy(w1, w, sizeof w1), memset(w16, 0xff, sizeof w16), memcpy(w16p, w16, sizeof w16p);
        double big[2] = {INFINITY, 2};
        CHECK_OK(&ctx, tpk_op_adamw(&ctx, w1, g, m1, v1, N, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f, big, 1.0f, runs, 2, w16));
        CHECK(!memcmp(w1, w, sizeof w1) && !memcmp(m1, m2, sizeof m1) && big[1] == 3 && !memcmp(w16, w16p, sizeof w16),
              "a step with an infinite norm: weights %s, bf16 copy %s, %g skipped", memcmp(w1, w, sizeof w1) ? "changed" : "kept",
              memcmp(w16, w16p, sizeof w16) ? "written" : "kept", big[1]);
        CHECK_FAILS(&ctx, tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 0, 1, NULL, 0.0f, NULL, 0, NULL), TPK_ERR_ARG, "step: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_adamw(&ctx, w, NULL, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, NULL, 0.0f, NULL, 0, NULL), TPK_ERR_ARG, "g: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 1.0f, 0.95f, 1e-8f, 0, 1, 1, NULL, 0.0f, NULL, 0, NULL), TPK_ERR_ARG, "b1, b2");
        CHECK_FAILS(&ctx, tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, NULL, 0.0f, runs, -1, NULL), TPK_ERR_ARG, "nruns: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, NULL, 0.0f, runs, 0, NULL), TPK_ERR_ARG, "nruns: expected >= 1 runs");
        CHECK_FAILS(&ctx, tpk_op_sumsq(&ctx, NULL, g, N, false), TPK_ERR_ARG, "out: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_adamw(&ctx, w, g, m, v, N, 0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1, nrm, NAN, NULL, 0, NULL), TPK_ERR_ARG, "grad_scale, clip");
    }
}

/* linear_fwd against gemm + bias_add (+ gelu_fwd), f32 and bf16, bias and GELU on and off */
static void test_linear_fwd(void) {
    TEST_CASE("host linear_fwd equals gemm + bias_add (+ gelu_fwd, pre-activation kept), f32 and bf16") {
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
            CHECK_OK(&ctx, tpk_op_linear_fwd(&ctx, ya, pa, xa, wa, bias ? ba : NULL, T, N, K, gelu ? TPK_ACT_GELU_TANH : TPK_ACT_NONE, dt));
            /* the reference: double sums of the (rounded) inputs */
            for (int t = 0; t < T; t++)
                for (int j = 0; j < N; j++) {
                    double s = bias ? (dt == TPK_BF16 ? tpk_bf16_to_f32(bh[j]) : b[j]) : 0;
                    for (int q = 0; q < K; q++)
                        s += (dt == TPK_BF16 ? (double)tpk_bf16_to_f32(xh[t * K + q]) * tpk_bf16_to_f32(wh[j * K + q]) : (double)x[t * K + q] * w[j * K + q]);
                    u[t * N + j] = (float)s;
                    ref[t * N + j] = gelu ? (float)(0.5 * s * (1 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)))) : (float)s;
                }
            if (dt == TPK_BF16)
                for (int i = 0; i < T * N; i++) y[i] = tpk_bf16_to_f32(yh[i]), pre[i] = tpk_bf16_to_f32(ph[i]);
            double tol = dt == TPK_BF16 ? 1e-2 : 1e-5;
            CHECK_CLOSE(y, ref, T * N, tol, gelu ? "gelu(x W^T + b)" : "x W^T + b");
            if (gelu) CHECK_CLOSE(pre, u, T * N, tol, "pre-activation");
        }
        CHECK_FAILS(&ctx, tpk_op_linear_fwd(&ctx, NULL, NULL, x, w, b, T, N, K, TPK_ACT_NONE, TPK_F32), TPK_ERR_ARG, "y: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_linear_fwd(&ctx, y, NULL, x, w, b, T, N, K, TPK_ACT_GELU_TANH, TPK_F32), TPK_ERR_ARG, "pre: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_linear_fwd(&ctx, y, pre, x, w, b, T, N, K, TPK_ACT_GELU_TANH, TPK_I32), TPK_ERR_DTYPE, "dt:");
        CHECK_FAILS(&ctx, tpk_op_linear_fwd(&ctx, y, pre, x, w, b, T, N, K, (tpk_act)7, TPK_F32), TPK_ERR_ARG, "act: expected TPK_ACT_NONE or TPK_ACT_GELU_TANH, got 7");
    }
}

/* linear_bwd_act against a double reference: du = (dy W) gelu'(pre), db = colsum(du) */
static void test_linear_bwd_act(void) {
    TEST_CASE("host linear_bwd_act: du = (dy W) gelu'(pre) and db = its column sums against double references, f32 and bf16, db or not; bad input") {
        enum { T = 9, N = 13, K = 11 };
        float dy[T * K], w[K * N], pre[T * N], du[T * N], db[N], rdu[T * N], rdb[N];
        test_randn(dy, T * K, 75, 1.0f), test_randn(w, K * N, 76, 0.5f), test_randn(pre, T * N, 77, 1.5f);
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
            CHECK_OK(&ctx, tpk_op_linear_bwd_act(&ctx, dua, with_db ? dba : NULL, dya, wa, pa, T, N, K, TPK_ACT_GELU_TANH, dt));
            for (int j = 0; j < N; j++) rdb[j] = 0;
            double sdb[N] = {0};
            for (int t = 0; t < T; t++)
                for (int j = 0; j < N; j++) {
                    double g = 0, u = dt == TPK_BF16 ? tpk_bf16_to_f32(ph[t * N + j]) : pre[t * N + j];
                    for (int q = 0; q < K; q++)
                        g += dt == TPK_BF16 ? (double)tpk_bf16_to_f32(dyh[t * K + q]) * tpk_bf16_to_f32(wh[q * N + j]) : (double)dy[t * K + q] * w[q * N + j];
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
            else CHECK(dt == TPK_BF16 ? dbh[0] == 0xffff : isnan(db[0]), "db written without being asked for");
        }
        CHECK_OK(&ctx, tpk_op_linear_bwd_act(&ctx, NULL, db, NULL, NULL, NULL, 0, N, K, TPK_ACT_GELU_TANH, TPK_F32)); /* no rows: db = 0 */
        CHECK(db[0] == 0.0f && db[N - 1] == 0.0f, "no rows: db %g, expected 0", db[0]);
        CHECK_FAILS(&ctx, tpk_op_linear_bwd_act(&ctx, du, db, dy, w, pre, T, N, K, TPK_ACT_NONE, TPK_F32), TPK_ERR_ARG, "act: expected an activation");
        CHECK_FAILS(&ctx, tpk_op_linear_bwd_act(&ctx, pre, db, dy, w, pre, T, N, K, TPK_ACT_GELU_TANH, TPK_F32), TPK_ERR_ARG, "du: must not alias");
        CHECK_FAILS(&ctx, tpk_op_linear_bwd_act(&ctx, du, db, dy, w, NULL, T, N, K, TPK_ACT_GELU_TANH, TPK_F32), TPK_ERR_ARG, "pre: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_linear_bwd_act(&ctx, du, db, dy, w, pre, T, -1, K, TPK_ACT_GELU_TANH, TPK_F32), TPK_ERR_ARG, "n: expected >= 0");
    }
}

/* a row of the profile by name, or NULL */
static const tpk__prof_row *prof_row(const tpk_ctx *c, const char *name) {
    for (int i = 0; i < c->prof->nrows; i++)
        if (!strcmp(c->prof->rows[i].name, name)) return &c->prof->rows[i];
    return NULL;
}
static void test_profile(void) {
    TEST_CASE("profiler: every op call and collective counted per step with its bytes or flops and a time; the table; off by default") {
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = tpk_ops_host()}));
        CHECK(!c.prof || c.prof->from_env, "the profiler is on without being asked");
        tpk_profile_stop(&c); /* whatever the environment says */
        CHECK_FAILS(&c, tpk_profile_print(&c, stdout), TPK_ERR_ARG, "the profiler is off");
        float x[128], a[8 * 16], b[16 * 4], y[8 * 4];
        test_randn(a, 128, 3, 1.0f), test_randn(b, 64, 4, 1.0f);
        CHECK_OK(&c, tpk_op_fill(&c, x, TPK_F32, 100, 1.0f)); /* before the start: not counted */
        CHECK_OK(&c, tpk_profile_start(&c));
        for (int step = 0; step < 2; step++) {
            for (int i = 0; i < 3; i++) CHECK_OK(&c, tpk_op_fill(&c, x, TPK_F32, 100, (float)i));
            for (int i = 0; i < 2; i++) CHECK_OK(&c, tpk_op_gemm(&c, false, false, 8, 4, 16, 1.0f, a, 16, b, 4, 0.0f, y, 4, TPK_F32));
            CHECK_OK(&c, tpk_allreduce(&c, &c.tp, x, x, 10, TPK_F32, TPK_SUM));
            CHECK_FAILS(&c, tpk_op_fill(&c, NULL, TPK_F32, 5, 0.0f), TPK_ERR_ARG, "x:"); /* refused by the front end: not an op call */
            CHECK_OK(&c, tpk_profile_step(&c));
        }
        const tpk__prof_row *f = prof_row(&c, "fill"), *g = prof_row(&c, "gemm"), *r = prof_row(&c, "tp.allreduce");
        CHECK(c.prof->steps == 2 && c.prof->wall_ms >= 0, "%d steps", c.prof->steps);
        CHECK(f && f->calls == 6 && f->bytes == 6 * 100 * 4.0 && f->flops == 0 && f->ms >= 0, "fill: %llu calls, %g bytes",
              f ? (unsigned long long)f->calls : 0ULL, f ? f->bytes : -1);
        CHECK(g && g->calls == 4 && g->flops == 4 * 2.0 * 8 * 4 * 16 && g->ms >= 0, "gemm: %llu calls, %g flops", g ? (unsigned long long)g->calls : 0ULL,
              g ? g->flops : -1);
        CHECK(r && r->calls == 2 && r->bytes == 2 * 10 * 4.0, "tp.allreduce: %llu calls", r ? (unsigned long long)r->calls : 0ULL);
        FILE *t = tmpfile();
        CHECK_OK(&c, tpk_profile_print(&c, t));
        char text[4096] = "";
        if (t) {
            rewind(t);
            size_t got = fread(text, 1, sizeof text - 1, t);
            text[got] = 0;
            fclose(t);
        }
        const char *want[] = {"profile: 2 steps", "backend host, ops timed by the host clock", "calls/step", "\nfill  ", "     3.0 ", "\ngemm  ",
                              "TFLOP/s", "\ntp.allreduce  ", "GB/s", "all timed ops"};
        for (int i = 0; i < 10; i++) CHECK(strstr(text, want[i]) != NULL, "the table lacks \"%s\":\n%s", want[i], text);
        CHECK_FAILS(&c, tpk_profile_print(&c, NULL), TPK_ERR_ARG, "f: NULL");
        tpk_profile_stop(&c);
        CHECK(c.prof == NULL, "stopped");
        tpk_ctx_destroy(&c);
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    if (test_host_ctx(&ctx) != TPK_OK) return 1;
    test_memory();
    test_gemm();
    test_gemm_acc();
    test_bias();
    test_gelu();
    test_elementwise();
    test_rng();
    test_errors();
    test_front_end();
    test_optimizer();
    test_linear_fwd();
    test_linear_bwd_act();
    test_profile();
    tpk_ctx_destroy(&ctx);
    return test_finish();
}
