/* tests/test_ops_fusions.c — the fusions (TPK__OPS_FUSED) composed by the front end.
 *
 * A table may leave linear_fwd, linear_bwd_act, residual_layernorm_fwd and xent_fused NULL; the
 * front end (tpk/runtime/op.h, tpk__compose_*) then runs each as its contract in tpk/base/ops.h
 * states it, from the required entries. Here the host table with its fusions removed is run against
 * the host table itself, in f32 and bf16, on random inputs with poisoned outputs: the same bytes
 * (the host fills xent_fused only, which equals xent_stats, xent_loss and xent_grad in turn bit for
 * bit, so its other two tables' rows meet the compositions themselves; the GPU tests hold
 * cuBLASLt's epilogues against the composed ops), including the aliasings the contracts allow (x1 =
 * x or r, dz = z). And the host table is complete: every core and layer entry, assembled from its
 * files. */
#include "test.h"

enum { T = 37, N = 29, K = 23, LD = 40, V = 35 }; /* V columns of logits in rows of LD: 5 padding
                                                     columns */

static tpk_ctx full, bare; /* the host table, and the host table without its fusions */

/* n random values in dt (f32 drawn, cast), in host memory */
static void *rnd(size_t n, tpk_dtype dt, uint64_t seed, float scale) {
    float *f = malloc(n * sizeof(float));
    void *p = malloc(n * 4);
    test_randn(f, n, seed, scale);
    if (tpk_op_cast(&full, p, dt, f, TPK_F32, n) != TPK_OK) abort();
    free(f);
    return p;
}
/* a poisoned copy pair: two buffers of n elements of es bytes, all bits set (NaN in f32 and
 * bf16) */
static void *poisoned(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    memset(p, 0xff, bytes);
    return p;
}

static void test_linear(tpk_dtype dt) {
    size_t es = tpk_dtype_size(dt);
    TEST_CASE(
        "linear_fwd, linear_bwd_act composed by the front end (and the host's linear_fwd) equal "
        "gemm, bias_add, act_fwd / act_bwd, bias_grad called apart, bit for bit [%s]",
        tpk_dtype_name(dt)) {
        void *x = rnd((size_t)(T * K), dt, 1, 1.0f), *w = rnd((size_t)(N * K), dt, 2, 0.3f),
             *b = rnd(N, dt, 3, 0.5f);
        for (int act = 0; act < 2; act++)
            for (int bias = 0; bias < 2; bias++) {
                void *y1 = poisoned((size_t)(T * N) * es), *y2 = poisoned((size_t)(T * N) * es);
                void *p1 = poisoned((size_t)(T * N) * es), *p2 = poisoned((size_t)(T * N) * es);
                tpk_act a = act ? TPK_ACT_GELU_TANH : TPK_ACT_NONE;
                void *u1 = act ? p1 : y1; /* the ops apart, as the contract states them */
                CHECK_OK(&full, tpk_op_gemm(&full, false, true, T, N, K, 1.0f, x, K, w, K, 0.0f, u1,
                                            N, dt));
                if (bias) CHECK_OK(&full, tpk_op_bias_add(&full, u1, b, T, N, dt));
                if (act) CHECK_OK(&full, tpk_op_act_fwd(&full, a, y1, u1, dt, (size_t)(T * N)));
                CHECK_OK(&bare,
                         tpk_op_linear_fwd(&bare, y2, p2, x, w, bias ? b : NULL, T, N, K, a, dt));
                CHECK(!memcmp(y1, y2, (size_t)(T * N) * es),
                      "linear_fwd y differs (act %d, bias %d)", act, bias);
                if (act)
                    CHECK(!memcmp(p1, p2, (size_t)(T * N) * es), "linear_fwd pre differs (bias %d)",
                          bias);
                /* and the host table's own linear_fwd (its GEMM called directly): the same */
                void *y3 = poisoned((size_t)(T * N) * es), *p3 = poisoned((size_t)(T * N) * es);
                CHECK_OK(&full,
                         tpk_op_linear_fwd(&full, y3, p3, x, w, bias ? b : NULL, T, N, K, a, dt));
                CHECK(!memcmp(y1, y3, (size_t)(T * N) * es) &&
                          (!act || !memcmp(p1, p3, (size_t)(T * N) * es)),
                      "the host's linear_fwd differs (act %d, bias %d)", act, bias);
                free(y3), free(p3);
                if (act) { /* the backward through that activation: dy [T, K] and the next weight W
                              [K, N] */
                    void *dy = rnd((size_t)(T * K), dt, 4, 1.0f),
                         *w2 = rnd((size_t)(K * N), dt, 5, 0.3f);
                    void *d1 = poisoned((size_t)(T * N) * es), *d2 = poisoned((size_t)(T * N) * es),
                         *db1 = poisoned(N * es), *db2 = poisoned(N * es);
                    CHECK_OK(&full, tpk_op_gemm(&full, false, false, T, N, K, 1.0f, dy, K, w2, N,
                                                0.0f, d1, N, dt));
                    CHECK_OK(&full, tpk_op_act_bwd(&full, a, d1, p1, d1, dt, (size_t)(T * N)));
                    if (bias)
                        CHECK_OK(&full, tpk_op_bias_grad(&full, db1, d1, T, N, dt, dt, false));
                    CHECK_OK(&bare, tpk_op_linear_bwd_act(&bare, d2, bias ? db2 : NULL, dy, w2, p1,
                                                          T, N, K, a, dt));
                    CHECK(!memcmp(d1, d2, (size_t)(T * N) * es),
                          "linear_bwd_act du differs (db %d)", bias);
                    if (bias) CHECK(!memcmp(db1, db2, N * es), "linear_bwd_act db differs");
                    free(dy), free(w2), free(d1), free(d2), free(db1), free(db2);
                }
                free(y1), free(y2), free(p1), free(p2);
            }
        free(x), free(w), free(b);
    }
}

static void test_residual_layernorm(tpk_dtype dt) {
    size_t es = tpk_dtype_size(dt), n = (size_t)(T * N);
    TEST_CASE(
        "residual_layernorm_fwd composed equals x + r (a plain loop, rounded to dt) then "
        "layernorm_fwd, bit for bit: x1 apart, x1 = x, x1 = r [%s]",
        tpk_dtype_name(dt)) {
        void *x = rnd(n, dt, 6, 1.0f), *r = rnd(n, dt, 7, 1.0f);
        float *w = rnd(N, TPK_F32, 8, 0.5f), *b = rnd(N, TPK_F32, 9, 0.5f);
        for (int alias = 0; alias < 3; alias++) { /* 0: x1 its own buffer, 1: x1 = x, 2: x1 = r */
            void *x1[2], *xs[2], *rs[2], *y[2];
            float *mean[2], *rstd[2];
            for (int c = 0; c < 2; c++) {
                xs[c] = malloc(n * es), rs[c] = malloc(n * es);
                memcpy(xs[c], x, n * es), memcpy(rs[c], r, n * es);
                x1[c] = alias == 1 ? xs[c] : alias == 2 ? rs[c] : poisoned(n * es);
                y[c] = poisoned(n * es), mean[c] = poisoned(T * 4), rstd[c] = poisoned(T * 4);
                if (c) {
                    CHECK_OK(&bare,
                             tpk_op_residual_layernorm_fwd(&bare, x1[c], y[c], mean[c], rstd[c],
                                                           xs[c], rs[c], w, b, T, N, 1e-5f, dt));
                } else { /* the reference: the sum in f32, rounded to dt, then the layernorm */
                    for (size_t i = 0; i < n; i++) {
                        float v = dt == TPK_F32 ? ((float *)xs[c])[i] + ((float *)rs[c])[i]
                                                : tpk_bf16_to_f32(((uint16_t *)xs[c])[i]) +
                                                      tpk_bf16_to_f32(((uint16_t *)rs[c])[i]);
                        if (dt == TPK_F32) ((float *)x1[c])[i] = v;
                        else ((uint16_t *)x1[c])[i] = tpk_f32_to_bf16(v);
                    }
                    CHECK_OK(&full, tpk_op_layernorm_fwd(&full, y[c], mean[c], rstd[c], x1[c], w, b,
                                                         T, N, 1e-5f, dt));
                }
            }
            CHECK(!memcmp(x1[0], x1[1], n * es) && !memcmp(y[0], y[1], n * es),
                  "x1 or y differs (alias %d)", alias);
            CHECK(!memcmp(mean[0], mean[1], T * 4) && !memcmp(rstd[0], rstd[1], T * 4),
                  "mean or rstd differs (alias %d)", alias);
            for (int c = 0; c < 2; c++) {
                if (!alias) free(x1[c]);
                free(xs[c]), free(rs[c]), free(y[c]), free(mean[c]), free(rstd[c]);
            }
        }
        free(x), free(r), free(w), free(b);
    }
}

static void test_xent(tpk_dtype dt) {
    size_t es = tpk_dtype_size(dt), n = (size_t)(T * LD);
    TEST_CASE(
        "xent_fused composed (stats, loss, grad) equals the host's fused op, bit for bit, dz apart "
        "and dz = z [%s]",
        tpk_dtype_name(dt)) {
        void *z = rnd(n, dt, 10, 3.0f);
        int32_t y[T];
        for (int t = 0; t < T; t++) y[t] = t == 4 ? -100 : (t * 13) % V; /* one ignored row */
        for (int inplace = 0; inplace < 2; inplace++) {
            void *dz[2], *zs[2];
            float *loss[2], *lse[2];
            for (int c = 0; c < 2; c++) {
                zs[c] = malloc(n * es);
                memcpy(zs[c], z, n * es);
                dz[c] = inplace ? zs[c] : poisoned(n * es);
                loss[c] = poisoned(T * 4), lse[c] = poisoned(T * 4);
                tpk_ctx *ctx = c ? &bare : &full;
                CHECK_OK(ctx, tpk_op_xent_fused(ctx, dz[c], loss[c], lse[c], zs[c], y, T, V, LD,
                                                0.1f, -100, 0.0625f, dt));
            }
            CHECK(!memcmp(dz[0], dz[1], n * es), "dz differs (in place %d)", inplace);
            CHECK(!memcmp(loss[0], loss[1], T * 4) && !memcmp(lse[0], lse[1], T * 4),
                  "loss or lse differs (in place %d)", inplace);
            for (int c = 0; c < 2; c++) {
                if (!inplace) free(dz[c]);
                free(zs[c]), free(loss[c]), free(lse[c]);
            }
        }
        free(z);
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    static tpk_ops nofuse;
    nofuse = *tpk_ops_host();
    nofuse.name = "host without fusions";
#define TPK__NULL_ENTRY(e) nofuse.e = NULL;
    TPK__OPS_FUSED(TPK__NULL_ENTRY)
#undef TPK__NULL_ENTRY
    if (tpk_ctx_init(&full, &(tpk_ctx_desc){.ops = tpk_ops_host()}) != TPK_OK ||
        tpk_ctx_init(&bare, &(tpk_ctx_desc){.ops = &nofuse}) != TPK_OK) {
        fprintf(stderr, "test_ops_fusions: %s %s\n", tpk_last_error(&full), tpk_last_error(&bare));
        return 1;
    }
    TEST_CASE(
        "the host table (kernels/host/table.c, each file's entries) fills every core and layer "
        "entry; of the fusions xent_fused and linear_fwd (its GEMM called directly)") {
        const tpk_ops *h = tpk_ops_host();
#define TPK__HAS_ENTRY(e) CHECK(h->e != NULL, "the host table has no " #e);
        TPK__OPS_CORE(TPK__HAS_ENTRY)
        TPK__OPS_LAYERS(TPK__HAS_ENTRY)
#undef TPK__HAS_ENTRY
        CHECK(h->xent_fused && h->linear_fwd && !h->linear_bwd_act && !h->residual_layernorm_fwd,
              "the host fuses the cross-entropy and the linear forward (its GEMM without the "
              "front end's detour) alone (its other fusions would be the compositions again)");
    }
    const tpk_dtype dts[2] = {TPK_F32, TPK_BF16};
    for (int d = 0; d < 2; d++) {
        test_linear(dts[d]);
        test_residual_layernorm(dts[d]);
        test_xent(dts[d]);
    }
    tpk_ctx_destroy(&full), tpk_ctx_destroy(&bare);
    return test_finish();
}
