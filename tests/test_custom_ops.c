/* tests/test_custom_ops.c — a program that brings its own compute backend: a minimal tpk_ops
 * table of naive C kernels written here (GEMM as three loops; the ops a linear layer does not
 * use answer TPK_ERR_UNSUPPORTED), linked WITHOUT libtpk_host.a or any other tpk archive (the
 * Makefile links it with -lm only: the headers name no backend). The table holds the core
 * entries only (TPK__OPS_CORE): no layer op, no fusion — the column linear's fused forward is
 * composed by the front end from this gemm and bias_add. On it, a column-parallel
 * linear with bias at t = ranks: y = x W^T + b and, backward, dx = dy W, dW = dy^T x, db =
 * colsum(dy) equal a double-precision computation from the gathered weights. Also: a table
 * with a NULL core entry is refused naming the entry, a NULL layer op fails when called; desc->ops
 * = NULL with no backend archive linked is refused with a message saying so; the checked front end
 * refuses bad arguments before the user's kernel is reached. */
#include "test.h"

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-parameter" /* the entries this backend does not provide
                                                       name every argument */
#endif

static int me, np, gemm_calls;

/* ---- the user's kernels (host memory) -------------------------------------------------------- */

static tpk_status my_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? TPK_OK : tpk_fail(ctx, TPK_ERR_NOMEM, "my.alloc", "out of memory");
}
static void my_free(tpk_ctx *ctx, void *p) { free(p); }
static tpk_status my_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes,
                            tpk_copy_dir dir) {
    if (bytes && dst != src) memmove(dst, src, bytes);
    return TPK_OK;
}
static tpk_status my_sync(tpk_ctx *ctx) { return TPK_OK; }
static tpk_status my_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    for (size_t i = 0; i < n; i++) ((float *)x)[i] = value;
    return TPK_OK;
}
static tpk_status my_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds,
                            int64_t rows, int64_t cols, tpk_dtype dt) {
    size_t es = tpk_dtype_size(dt);
    for (int64_t i = 0; i < rows; i++)
        memmove((char *)dst + (size_t)(i * ldd) * es, (const char *)src + (size_t)(i * lds) * es,
                (size_t)cols * es);
    return TPK_OK;
}
static tpk_status my_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt,
                           size_t n) {
    for (size_t i = 0; i < n; i++)
        ((float *)y)[i] = a * ((const float *)x)[i] + (b == 0 ? 0 : b * ((float *)y)[i]);
    return TPK_OK;
}
static tpk_status my_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                          float beta, void *c, int64_t ldc, tpk_dtype dt) {
    const float *A = (const float *)a, *B = (const float *)b;
    float *C = (float *)c;
    gemm_calls++;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++)
                s += (double)(ta ? A[p * lda + i] : A[i * lda + p]) *
                     (tb ? B[j * ldb + p] : B[p * ldb + j]);
            C[i * ldc + j] = (float)(alpha * s + (beta == 0 ? 0 : beta * C[i * ldc + j]));
        }
    return TPK_OK;
}
/* f32 only, as every kernel here: an f32 C is gemm's C */
static tpk_status my_gemm_acc(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                              float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                              float beta, float *c, int64_t ldc, tpk_dtype dt) {
    return my_gemm(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt);
}
static tpk_status my_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols,
                              tpk_dtype dt) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) ((float *)y)[i * cols + j] += ((const float *)bias)[j];
    return TPK_OK;
}
static tpk_status my_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols,
                               tpk_dtype dt, tpk_dtype db_dt, bool accumulate) {
    for (int64_t j = 0; j < cols; j++) {
        double s = accumulate ? ((float *)db)[j] : 0;
        for (int64_t i = 0; i < rows; i++) s += ((const float *)dy)[i * cols + j];
        ((float *)db)[j] = (float)s;
    }
    return TPK_OK;
}
static tpk_status my_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols,
                            int64_t gcols, int64_t row0, int64_t col0, uint64_t seed,
                            uint64_t stream, tpk_rng_dist dist, float a, float b) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            uint64_t at = (uint64_t)((row0 + i) * gcols + col0 + j);
            ((float *)x)[i * cols + j] =
                a + b * (dist == TPK_RNG_NORMAL ? tpk_rng_normal(seed, stream, at)
                                                : tpk_rng_uniform(seed, stream, at));
        }
    return TPK_OK;
}
/* A partial backend, as a user's may be: the ops it does not provide answer TPK_ERR_UNSUPPORTED
 * (the contract's status for "valid, but this backend does not provide it"), naming themselves;
 * the test checks that this status comes back through the front end. */
static tpk_status not_provided(tpk_ctx *ctx, const char *op) {
    return tpk_fail(ctx, TPK_ERR_UNSUPPORTED, op, "this backend does not provide it");
}
#define NOT_PROVIDED(name, ...)                              \
    static tpk_status my_##name(tpk_ctx *ctx, __VA_ARGS__) { \
        return not_provided(ctx, "my." #name);               \
    }
NOT_PROVIDED(cast, void *dst, tpk_dtype dst_dt, const void *src, tpk_dtype src_dt, size_t n)
NOT_PROVIDED(act_fwd, tpk_act act, void *y, const void *x, tpk_dtype dt, size_t n)
NOT_PROVIDED(act_bwd, tpk_act act, void *dx, const void *x, const void *dy, tpk_dtype dt, size_t n)
NOT_PROVIDED(adamw, float *w, const float *g, float *m, float *v, size_t n, float lr, float b1,
             float b2, float eps, float wd, int64_t step, float grad_scale, double *norm,
             float clip, const int64_t *decay, int64_t nruns, uint16_t *w16)
NOT_PROVIDED(sumsq, double *out, const float *x, size_t n, bool accumulate)

static tpk_ops my_table(void) {
    tpk_ops o;
    memset(&o, 0, sizeof o);
    o.name = "naive", o.device = false;
    o.alloc = my_alloc, o.free = my_free, o.memcpy = my_memcpy, o.sync = my_sync, o.fill = my_fill,
    o.copy2d = my_copy2d, o.cast = my_cast;
    o.axpby = my_axpby, o.gemm = my_gemm, o.gemm_acc = my_gemm_acc, o.bias_add = my_bias_add,
    o.bias_grad = my_bias_grad, o.act_fwd = my_act_fwd, o.act_bwd = my_act_bwd;
    o.rng_2d = my_rng_2d, o.adamw = my_adamw, o.sumsq = my_sumsq;
    return o; /* the core entries only: no layer op (a call fails naming it), no fusion (the front
                 end composes them) */
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    tpk_comm world;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    static tpk_ops table; /* the table must outlive the context */
    table = my_table();
    enum { T = 5, IN = 6, OUT = 11 }; /* 11 out features: uneven at t = 2, 3, 4 */

    TEST_CASE(
        "a user's own ops table (no tpk archive linked): column linear + bias at t = ranks equals "
        "a double computation") {
        tpk_ctx ctx;
        CHECK_OK(&ctx,
                 tpk_ctx_init(
                     &ctx, &(tpk_ctx_desc){.ops = &table, .world = &world, .tp = np, .seed = 9}));
        CHECK(!strcmp(ctx.ops->name, "naive"), "the context uses \"%s\"", ctx.ops->name);
        tpk_linear l;
        CHECK_OK(&ctx, tpk_col_linear_init(&ctx, &l, IN, OUT,
                                           &(tpk_linear_desc){.name = "fc", .bias = true}));
        test_set_weights(&ctx, 3, 0.5f);
        float x[T * IN], dy[T * OUT], W[OUT * IN], b[OUT], y[T * OUT], dx[T * IN], dW[OUT * IN],
            db[OUT];
        test_randn(x, T * IN, 1, 1.0f), test_randn(dy, T * OUT, 2, 1.0f);
        test_poison(y, T * OUT), test_poison(dx, T * IN), test_poison(dW, OUT * IN),
            test_poison(db, OUT);
        CHECK_OK(&ctx, tpk_param_get_global(&ctx, l.w, false, W));
        CHECK_OK(&ctx, tpk_param_get_global(&ctx, l.b, false, b));
        tpk_tensor ty, tdx, yg = {0}, dyl;
        yg.data = y;
        CHECK_OK(&ctx, tpk_params_zero_grad(&ctx));
        CHECK_OK(&ctx,
                 tpk_col_linear_forward(&ctx, &l, tpk_tensor_2d(x, TPK_F32, T, IN, TPK_R), &ty));
        CHECK_OK(&ctx, tpk_convert(&ctx, &ty, TPK_R, &yg));
        float dyb[T * OUT];
        dyl = tpk_tensor_shard_2d(dyb, TPK_F32, T, OUT, TPK_S(-1), np, me);
        CHECK_OK(&ctx,
                 tpk_convert(&ctx, &(tpk_tensor){dy, TPK_F32, 2, {T, OUT}, {T, OUT}, TPK_R, 0},
                             TPK_S(-1), &dyl));
        CHECK_OK(&ctx, tpk_col_linear_backward(&ctx, &l, dyl, &tdx));
        memcpy(dx, tdx.data, sizeof dx);
        CHECK_OK(&ctx, tpk_param_get_global(&ctx, l.w, true, dW));
        CHECK_OK(&ctx, tpk_param_get_global(&ctx, l.b, true, db));
        double ey = 0, edx = 0, edw = 0, edb = 0;
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OUT; o++) {
                double s = b[o];
                for (int i = 0; i < IN; i++) s += (double)x[t * IN + i] * W[o * IN + i];
                ey = fmax(ey, fabs(y[t * OUT + o] - s));
            }
        for (int t = 0; t < T; t++)
            for (int i = 0; i < IN; i++) {
                double s = 0;
                for (int o = 0; o < OUT; o++) s += (double)dy[t * OUT + o] * W[o * IN + i];
                edx = fmax(edx, fabs(dx[t * IN + i] - s));
            }
        for (int o = 0; o < OUT; o++) {
            double sb = 0;
            for (int t = 0; t < T; t++) sb += dy[t * OUT + o];
            edb = fmax(edb, fabs(db[o] - sb));
            for (int i = 0; i < IN; i++) {
                double s = 0;
                for (int t = 0; t < T; t++) s += (double)dy[t * OUT + o] * x[t * IN + i];
                edw = fmax(edw, fabs(dW[o * IN + i] - s));
            }
        }
        CHECK(ey < 1e-5 && edx < 1e-5 && edw < 1e-5 && edb < 1e-5,
              "max errors: y %g, dx %g, dW %g, db %g", ey, edx, edw, edb);
        CHECK(gemm_calls >= 3, "the user's gemm ran %d times", gemm_calls);
        /* the front end checks before the user's kernel is reached */
        int before = gemm_calls;
        float c[4];
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1.0f, x, 1, x, 2, 0.0f, c, 2, TPK_F32),
                    TPK_ERR_ARG, "lda");
        CHECK(gemm_calls == before, "the user's gemm was called with a bad lda");
        /* an op this backend does not have: its own error comes back */
        CHECK_FAILS(&ctx, tpk_op_sumsq(&ctx, &(double){0}, x, 3, false), TPK_ERR_UNSUPPORTED,
                    "my.sumsq");
        /* a layer op the table leaves NULL: refused by the front end, naming it */
        float o1[T * OUT], st[T];
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, o1, st, st, x, W, b, T, IN, 1e-5f, TPK_F32),
                    TPK_ERR_UNSUPPORTED, "the backend \"naive\" has no layernorm_fwd entry");
        tpk_linear_destroy(&ctx, &l);
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE(
        "an incomplete table is refused naming the entry; no default backend without an archive") {
        tpk_ctx ctx;
        static tpk_ops holed;
        holed = my_table();
        holed.bias_grad = NULL;
        CHECK_FAILS(&ctx,
                    tpk_ctx_init(&ctx, &(tpk_ctx_desc){.ops = &holed, .world = &world, .tp = np}),
                    TPK_ERR_ARG, "desc->ops: the table \"naive\" has no bias_grad entry");
        CHECK_FAILS(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}),
                    TPK_ERR_ARG, "none is linked");
        tpk_ctx_destroy(&ctx);
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
