/* tests/test_ops_table.c — the front end and the table (tpk/runtime/op.h, kernels/host/table.c):
 * bad arguments of every op fail naming the argument, before a backend entry is reached (the core
 * ops, then layernorm, embedding, cross-entropy); every required entry is required (tpk_ctx_init
 * names a NULL one), the optional ones may be NULL; a user's own table is checked before its
 * entries are reached; a dry run's table (tpk_ops.dry_run, the planner's) needs its memory entries
 * alone and hands every op to the profiler's hook as the host run does, calling none; the profiler
 * counts every op. Runs on one rank. */
#include "ops_test.h"

#include <tpk/plan/count.h>

#define IGNORE (-100) /* the cross-entropy's ignore index */

/* ---- bad arguments ------------------------------------------------------------------------- */

static void test_errors(void) {
    float a[64] = {0}, b[64] = {0}, c[64] = {0};
    TEST_CASE("fp8 ops: bad arguments fail with a message naming them") {
        uint8_t q[4] = {0};
        CHECK_FAILS(&ctx, tpk_op_fp8_quant(&ctx, q, NULL, a, TPK_F32, 4, 0.0f, TPK_E4M3, false),
                    TPK_ERR_ARG, "scale: expected a finite value > 0, got 0");
        CHECK_FAILS(&ctx,
                    tpk_op_fp8_quant(&ctx, q, NULL, a, TPK_F32, 4, 1.0f, (tpk_fp8_fmt)2, false),
                    TPK_ERR_ARG, "fmt: expected TPK_E4M3 or TPK_E5M2, got 2");
        CHECK_FAILS(&ctx, tpk_op_fp8_quant(&ctx, NULL, NULL, a, TPK_F32, 4, 1.0f, TPK_E5M2, false),
                    TPK_ERR_ARG, "q, amax: expected one");
        CHECK_FAILS(&ctx, tpk_op_fp8_dequant(&ctx, a, TPK_I32, q, 4, 1.0f, TPK_E4M3), TPK_ERR_DTYPE,
                    "dt: expected f32 or bf16");
        CHECK_FAILS(&ctx, tpk_op_fp8_dequant(&ctx, a, TPK_F32, q, 4, INFINITY, TPK_E4M3),
                    TPK_ERR_ARG, "scale_inv: expected a finite value");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_fp8(&ctx, false, true, 2, 2, 2, 1, q, TPK_E4M3, 1, q, TPK_E4M3, 2,
                                    0, c, 2, TPK_F32),
                    TPK_ERR_ARG, "lda: expected >= 2, got 1");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_fp8(&ctx, false, true, 2, 2, 2, 1, q, TPK_E4M3, 2, q,
                                    (tpk_fp8_fmt)-1, 2, 0, c, 2, TPK_F32),
                    TPK_ERR_ARG, "fb: expected TPK_E4M3 or TPK_E5M2");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm_fp8(&ctx, false, true, 2, 2, 2, NAN, q, TPK_E4M3, 2, q, TPK_E4M3, 2,
                                    0, c, 2, TPK_F32),
                    TPK_ERR_ARG, "alpha, beta: expected finite values");
    }
    TEST_CASE("host gemm: bad arguments fail with a message naming them") {
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, -1, 4, 4, 1, a, 4, b, 4, 0, c, 4, TPK_F32),
                    TPK_ERR_ARG, "m: expected >= 0, got -1");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, 4, -2, 4, 1, a, 4, b, 4, 0, c, 4, TPK_F32),
                    TPK_ERR_ARG, "n: expected >= 0, got -2");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, 4, 4, -3, 1, a, 4, b, 4, 0, c, 4, TPK_F32),
                    TPK_ERR_ARG, "k: expected >= 0, got -3");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, 6, 5, 1, a, 3, b, 6, 0, c, 6, TPK_F32),
                    TPK_ERR_ARG, "lda: expected >= 5, got 3");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, true, false, 4, 6, 5, 1, a, 3, b, 6, 0, c, 6, TPK_F32),
                    TPK_ERR_ARG, "lda: expected >= 4, got 3");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, 6, 5, 1, a, 5, b, 5, 0, c, 6, TPK_F32),
                    TPK_ERR_ARG, "ldb: expected >= 6, got 5");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, true, 4, 6, 5, 1, a, 5, b, 4, 0, c, 6, TPK_F32),
                    TPK_ERR_ARG, "ldb: expected >= 5, got 4");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 4, 6, 5, 1, a, 5, b, 6, 0, c, 2, TPK_F32),
                    TPK_ERR_ARG, "ldc: expected >= 6, got 2");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 0, 0, 0, 1, a, 0, b, 1, 0, c, 1, TPK_F32),
                    TPK_ERR_ARG, "lda: expected >= 1, got 0");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, NULL, 2, b, 2, 0, c, 2, TPK_F32),
                    TPK_ERR_ARG, "a: expected a buffer, got NULL");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, NULL, 2, 0, c, 2, TPK_F32),
                    TPK_ERR_ARG, "b: expected a buffer, got NULL");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, NULL, 2, TPK_F32),
                    TPK_ERR_ARG, "c: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2, TPK_I32),
                    TPK_ERR_DTYPE, "dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2, (tpk_dtype)7),
                    TPK_ERR_DTYPE, "got ? (7)");
        CHECK_FAILS(&ctx,
                    tpk_op_gemm(&ctx, false, false, (int64_t)1 << 32, 1, 1, 1, a, 1, b, 1, 0, c, 1,
                                TPK_F32),
                    TPK_ERR_ARG, "m: expected <= 2147483647");
        /* valid for the front end; OpenBLAS's int limit is the host backend's own check */
        CHECK(strncmp(tpk_last_error(&ctx), "host.gemm: ", 11) == 0,
              "message \"%s\" does not name host.gemm", tpk_last_error(&ctx));
    }
    TEST_CASE("host ops: bad arguments to the other entries") {
        void *p = NULL;
        CHECK_FAILS(&ctx, tpk_op_alloc(&ctx, 16, NULL), TPK_ERR_ARG, "out:");
        CHECK_FAILS(&ctx, tpk_op_memcpy(&ctx, NULL, a, 4, TPK_H2D), TPK_ERR_ARG,
                    "dst: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_memcpy(&ctx, b, NULL, 4, TPK_D2H), TPK_ERR_ARG,
                    "src: expected a buffer, got NULL");
        CHECK_FAILS(&ctx, tpk_op_memcpy(&ctx, b, a, 4, (tpk_copy_dir)9), TPK_ERR_ARG, "dir:");
        CHECK_FAILS(&ctx, tpk_op_fill(&ctx, NULL, TPK_F32, 3, 0), TPK_ERR_ARG,
                    "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_fill(&ctx, a, TPK_I32, 3, 0), TPK_ERR_DTYPE,
                    "dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 4, b, 2, 2, 3, TPK_F32), TPK_ERR_ARG,
                    "lds: expected >= 3, got 2");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 2, b, 4, 2, 3, TPK_F32), TPK_ERR_ARG,
                    "ldd: expected >= 3, got 2");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 4, b, 4, -1, 3, TPK_F32), TPK_ERR_ARG,
                    "rows: expected >= 0, got -1");
        CHECK_FAILS(&ctx, tpk_op_copy2d(&ctx, a, 4, b, 4, 1, 3, (tpk_dtype)5), TPK_ERR_DTYPE,
                    "dt:");
        CHECK_FAILS(&ctx, tpk_op_cast(&ctx, a, TPK_F32, b, TPK_I32, 3), TPK_ERR_DTYPE,
                    "src_dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_cast(&ctx, a, TPK_I32, b, TPK_BF16, 3), TPK_ERR_DTYPE,
                    "dst_dt: expected f32 or bf16, got i32");
        CHECK_FAILS(&ctx, tpk_op_cast(&ctx, NULL, TPK_BF16, b, TPK_F32, 3), TPK_ERR_ARG,
                    "dst: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_axpby(&ctx, a, 1, NULL, 1, TPK_F32, 3), TPK_ERR_ARG,
                    "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_axpby(&ctx, a, 1, b, 1, TPK_I32, 3), TPK_ERR_DTYPE, "dt:");
        CHECK_FAILS(&ctx, tpk_op_bias_add(&ctx, a, NULL, 2, 3, TPK_F32), TPK_ERR_ARG,
                    "bias: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_bias_add(&ctx, a, b, 2, -3, TPK_F32), TPK_ERR_ARG,
                    "cols: expected >= 0, got -3");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, -2, 3, TPK_F32, TPK_F32, false), TPK_ERR_ARG,
                    "rows: expected >= 0, got -2");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, NULL, b, 2, 3, TPK_F32, TPK_F32, false),
                    TPK_ERR_ARG, "db: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, 2, 3, TPK_I32, TPK_I32, true), TPK_ERR_DTYPE,
                    "got i32");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, 2, 3, TPK_F32, TPK_BF16, true),
                    TPK_ERR_DTYPE, "db_dt: expected f32 or f32, got bf16");
        CHECK_FAILS(&ctx, tpk_op_bias_grad(&ctx, a, b, 2, 3, TPK_BF16, TPK_I32, true),
                    TPK_ERR_DTYPE, "db_dt: expected bf16 or f32, got i32");
        CHECK_FAILS(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_GELU_TANH, a, NULL, TPK_F32, 3), TPK_ERR_ARG,
                    "x: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_act_fwd(&ctx, TPK_ACT_GELU_TANH, a, b, TPK_I32, 3), TPK_ERR_DTYPE,
                    "tpk_op_act_fwd: dt:");
        CHECK_FAILS(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, a, b, NULL, TPK_F32, 3),
                    TPK_ERR_ARG, "dy: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_act_bwd(&ctx, TPK_ACT_GELU_TANH, a, b, c, (tpk_dtype)-1, 3),
                    TPK_ERR_DTYPE, "tpk_op_act_bwd: dt:");
        CHECK_FAILS(&ctx,
                    tpk_op_rng_2d(&ctx, a, TPK_F32, 2, 3, 4, 0, 2, 1, 1, TPK_RNG_NORMAL, 0, 1),
                    TPK_ERR_ARG, "gcols: expected >= col0 + cols = 5, got 4");
        CHECK_FAILS(&ctx,
                    tpk_op_rng_2d(&ctx, a, TPK_F32, 2, 3, 4, -1, 0, 1, 1, TPK_RNG_NORMAL, 0, 1),
                    TPK_ERR_ARG, "row0: expected >= 0, got -1");
        CHECK_FAILS(&ctx,
                    tpk_op_rng_2d(&ctx, a, TPK_F32, 2, 3, 4, 0, 0, 1, 1, (tpk_rng_dist)3, 0, 1),
                    TPK_ERR_ARG, "dist:");
        CHECK_FAILS(&ctx,
                    tpk_op_rng_2d(&ctx, NULL, TPK_F32, 2, 3, 4, 0, 0, 1, 1, TPK_RNG_UNIFORM, 0, 1),
                    TPK_ERR_ARG, "x: expected a buffer");
        CHECK_FAILS(&ctx,
                    tpk_op_rng_2d(&ctx, a, TPK_I32, 2, 3, 4, 0, 0, 1, 1, TPK_RNG_UNIFORM, 0, 1),
                    TPK_ERR_DTYPE, "got i32");
        (void)p;
    }
}

/* ---- the front end: every entry required, a user's own table checked ---------------------- */

/* Every entry of tpk_ops after `device`; the list must tile the table up to its last field, the
 * dry-run flag (a new entry fails the test until it is listed here, and tpk__ops_missing must
 * then name it). */
#define OPS_ENTRY(e) {#e, offsetof(tpk_ops, e), sizeof(((tpk_ops *)0)->e)}
struct ops_entry {
    const char *name;
    size_t at, size;
};
static const struct ops_entry ops_entries[] = {
    /* required (TPK__OPS_CORE) */
    OPS_ENTRY(alloc),   OPS_ENTRY(free),     OPS_ENTRY(memcpy),   OPS_ENTRY(sync),
    OPS_ENTRY(fill),    OPS_ENTRY(copy2d),   OPS_ENTRY(cast),     OPS_ENTRY(axpby),
    OPS_ENTRY(gemm),    OPS_ENTRY(gemm_acc), OPS_ENTRY(bias_add), OPS_ENTRY(bias_grad),
    OPS_ENTRY(act_fwd), OPS_ENTRY(act_bwd),  OPS_ENTRY(rng_2d),   OPS_ENTRY(adamw),
    OPS_ENTRY(sumsq),
};
enum { OPS_N = sizeof ops_entries / sizeof *ops_entries };
/* the optional entries: the layers' ops (TPK__OPS_LAYERS: a call of a NULL one fails naming it),
 * the fusions (TPK__OPS_FUSED: the front end composes them) and the profiler's timer
 * (tpk/runtime/profile.h falls back to the host clock) */
static const struct ops_entry optional_entries[] = {
    OPS_ENTRY(dropout),          OPS_ENTRY(layernorm_fwd),
    OPS_ENTRY(layernorm_bwd),    OPS_ENTRY(embed_fwd),
    OPS_ENTRY(embed_bwd),        OPS_ENTRY(xent_stats),
    OPS_ENTRY(xent_loss),        OPS_ENTRY(xent_mean),
    OPS_ENTRY(xent_grad),        OPS_ENTRY(attn_fwd),
    OPS_ENTRY(attn_bwd),         OPS_ENTRY(attn_block_fwd),
    OPS_ENTRY(attn_block_bwd),   OPS_ENTRY(rope),
    OPS_ENTRY(rope_at),          OPS_ENTRY(fp8_quant),
    OPS_ENTRY(fp8_dequant),      OPS_ENTRY(gemm_fp8),
    OPS_ENTRY(gemm_grouped),     OPS_ENTRY(gather_rows),
    OPS_ENTRY(scatter_add_rows), OPS_ENTRY(moe_combine_fwd),
    OPS_ENTRY(moe_combine_bwd),  OPS_ENTRY(swiglu_fwd),
    OPS_ENTRY(swiglu_bwd),       OPS_ENTRY(rmsnorm_fwd),
    OPS_ENTRY(rmsnorm_bwd),      OPS_ENTRY(linear_fwd),
    OPS_ENTRY(linear_bwd_act),   OPS_ENTRY(residual_layernorm_fwd),
    OPS_ENTRY(xent_fused),       OPS_ENTRY(timer_mark),
    OPS_ENTRY(timer_ms)};
enum { OPTIONAL_N = sizeof optional_entries / sizeof *optional_entries };

/* a user's table: the host's, with entries that count their calls (and then do the host's work) */
static int user_calls;
static tpk_status user_gemm(tpk_ctx *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                            float beta, void *cc, int64_t ldc, tpk_dtype dt) {
    user_calls++;
    return tpk_ops_host()->gemm(c, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cc, ldc, dt);
}
static tpk_status user_act_fwd(tpk_ctx *c, tpk_act act, void *y, const void *x, tpk_dtype dt,
                               size_t n) {
    user_calls++;
    return tpk_ops_host()->act_fwd(c, act, y, x, dt, n);
}
static tpk_status user_xent_loss(tpk_ctx *c, float *loss, float *lse, const float *part, int64_t P,
                                 const int32_t *targets, int64_t T, int64_t V, float smoothing,
                                 int32_t ignore_index) {
    user_calls++;
    return tpk_ops_host()->xent_loss(c, loss, lse, part, P, targets, T, V, smoothing, ignore_index);
}
static tpk_status user_attn_fwd(tpk_ctx *c, void *out, float *lse, const void *qkv, int64_t B,
                                int64_t S, int64_t Al, int64_t D, int64_t A, int64_t G,
                                int64_t head0, float scale, float p, uint64_t seed, uint64_t stream,
                                tpk_dtype dt) {
    user_calls++;
    return tpk_ops_host()->attn_fwd(c, out, lse, qkv, B, S, Al, D, A, G, head0, scale, p, seed,
                                    stream, dt);
}
static tpk_status user_layernorm_fwd(tpk_ctx *c, void *y, float *mean, float *rstd, const void *x,
                                     const float *w, const float *b, int64_t rows, int64_t cols,
                                     float eps, tpk_dtype dt) {
    user_calls++;
    return tpk_ops_host()->layernorm_fwd(c, y, mean, rstd, x, w, b, rows, cols, eps, dt);
}

static void test_front_end(void) {
    TEST_CASE(
        "every required tpk_ops entry: tpk_ctx_init refuses a table with one NULL, naming it; "
        "layer ops, fusions, timer may be NULL") {
        size_t covered = 0;
        for (int e = 0; e < OPS_N; e++) covered += ops_entries[e].size;
        for (int e = 0; e < OPTIONAL_N; e++) covered += optional_entries[e].size;
        CHECK(
            offsetof(tpk_ops, alloc) + covered == offsetof(tpk_ops, dry_run),
            "tpk_ops has %zu bytes of entries, this test lists %zu: list the new entry in "
            "ops_entries",
            offsetof(tpk_ops, dry_run) - offsetof(tpk_ops, alloc), covered);
        CHECK(sizeof(tpk_ops) - offsetof(tpk_ops, dry_run) <= sizeof(void *),
              "dry_run is tpk_ops's last field (fields are appended): %zu bytes follow it",
              sizeof(tpk_ops) - offsetof(tpk_ops, dry_run) - sizeof(bool));
        for (int e = 0; e < OPS_N; e++) {
            static tpk_ops holed;
            holed = *tpk_ops_host();
            memset((char *)&holed + ops_entries[e].at, 0,
                   ops_entries[e].size); /* a NULL function pointer */
            tpk_ctx c;
            char want[160];
            snprintf(want, sizeof want, "desc->ops: the table \"host\" has no %s entry",
                     ops_entries[e].name);
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
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &unnamed}), TPK_ERR_ARG,
                    "has no name entry");
        tpk_ctx_destroy(&c);
    }
    TEST_CASE(
        "the front end checks a user's own table: bad arguments never reach its entries; no "
        "context, no table") {
        static tpk_ops mine;
        mine = *tpk_ops_host();
        mine.name = "mine";
        mine.gemm = user_gemm, mine.act_fwd = user_act_fwd, mine.xent_loss = user_xent_loss,
        mine.attn_fwd = user_attn_fwd;
        mine.layernorm_fwd = user_layernorm_fwd;
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &mine}));
        float a[64] = {0}, b[64] = {0}, o[64] = {0};
        int32_t tg[4] = {0};
        user_calls = 0;
        CHECK_FAILS(&c, tpk_op_gemm(&c, false, false, 4, 4, 4, 1, a, 3, b, 4, 0, o, 4, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm: lda: expected >= 4, got 3");
        CHECK_FAILS(&c, tpk_op_gemm(&c, false, false, 2, 2, 2, 1, NULL, 2, b, 2, 0, o, 2, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_gemm: a: expected a buffer");
        CHECK_FAILS(&c, tpk_op_gemm(&c, true, false, 2, 2, 2, 1, a, 2, b, 2, 0, o, 2, TPK_I32),
                    TPK_ERR_DTYPE, "tpk_op_gemm: dt:");
        CHECK_FAILS(&c, tpk_op_act_fwd(&c, (tpk_act)5, o, a, TPK_F32, 4), TPK_ERR_ARG,
                    "tpk_op_act_fwd: act:");
        CHECK_FAILS(&c, tpk_op_xent_loss(&c, o, o, a, 1, tg, 2, 4, -0.5f, -100), TPK_ERR_ARG,
                    "tpk_op_xent_loss: smoothing");
        CHECK_FAILS(&c, tpk_op_attn_fwd(&c, o, o, a, 1, 2, 2, 4, 2, 2, 1, 1, 0, 0, 0, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_attn_fwd: head0");
        CHECK_FAILS(&c, tpk_op_layernorm_fwd(&c, o, o, o, a, a, a, 2, 4, 0.0f, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_layernorm_fwd: eps");
        CHECK(user_calls == 0, "the user's entries were called %d times with bad arguments",
              user_calls);
        /* empty work is done by the front end too: the entries are not called */
        CHECK_OK(&c,
                 tpk_op_gemm(&c, false, false, 0, 4, 4, 1, NULL, 4, NULL, 4, 0, NULL, 4, TPK_F32));
        CHECK_OK(&c, tpk_op_act_fwd(&c, TPK_ACT_GELU_TANH, NULL, NULL, TPK_F32, 0));
        CHECK(user_calls == 0, "the user's entries were called %d times for empty work",
              user_calls);
        /* valid arguments reach them */
        CHECK_OK(&c, tpk_op_gemm(&c, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, o, 2, TPK_F32));
        CHECK_OK(&c, tpk_op_act_fwd(&c, TPK_ACT_GELU_TANH, o, a, TPK_F32, 4));
        CHECK(user_calls == 2, "the user's entries were called %d times for 2 valid calls",
              user_calls);
        tpk_ctx_destroy(&c);
        /* no context: TPK_ERR_ARG (nowhere to leave a message); a context without a table: named */
        CHECK(tpk_op_gemm(NULL, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, o, 2, TPK_F32) ==
                  TPK_ERR_ARG,
              "gemm without a context");
        tpk_ctx bare;
        memset(&bare, 0, sizeof bare);
        CHECK_FAILS(&bare, tpk_op_fill(&bare, o, TPK_F32, 4, 0.0f), TPK_ERR_ARG,
                    "tpk_op_fill: ctx->ops: expected a backend table, got NULL");
        CHECK_FAILS(&bare, tpk_op_sync(&bare), TPK_ERR_ARG, "tpk_op_sync: ctx->ops");
        tpk_op_free(&bare, o); /* nothing to free it with: nothing happens */
    }
}


/* ---- bad arguments of layernorm, embedding, cross-entropy ----------------------------------- */

static void test_layer_errors(void) {
    TEST_CASE("layers layernorm, embedding, cross-entropy: bad arguments fail naming them") {
        float a[64] = {0}, b[64] = {0}, c[64] = {0}, m[8] = {0}, r[8] = {0}, w[16] = {0};
        int32_t ids[4] = {0, 1, 2, 3};
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, 2, 0, 1e-5f, TPK_F32),
                    TPK_ERR_ARG, "cols: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, -1, 4, 1e-5f, TPK_F32),
                    TPK_ERR_ARG, "rows: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, 2, 4, 0.0f, TPK_F32),
                    TPK_ERR_ARG, "eps: expected > 0");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, NULL, b, w, w, 2, 4, 1e-5f, TPK_F32),
                    TPK_ERR_ARG, "rstd: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_layernorm_fwd(&ctx, a, m, r, b, w, w, 2, 4, 1e-5f, TPK_I32),
                    TPK_ERR_DTYPE, "dt:");
        CHECK_FAILS(&ctx, tpk_op_layernorm_bwd(&ctx, a, w, w, b, c, w, m, r, 2, 0, TPK_F32, false),
                    TPK_ERR_ARG, "cols: expected >= 1");
        CHECK_FAILS(&ctx,
                    tpk_op_layernorm_bwd(&ctx, a, NULL, w, b, c, w, m, r, 2, 4, TPK_F32, false),
                    TPK_ERR_ARG, "dw: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_embed_fwd(&ctx, a, NULL, w, 4, 2, 0, 8, TPK_F32, false),
                    TPK_ERR_ARG, "ids: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_embed_fwd(&ctx, a, ids, w, 4, -2, 0, 8, TPK_F32, false),
                    TPK_ERR_ARG, "H: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_embed_fwd(&ctx, a, ids, w, 4, 2, 0, -1, TPK_F32, false),
                    TPK_ERR_ARG, "vrows: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_embed_bwd(&ctx, NULL, b, ids, 4, 2, 0, 8, TPK_F32), TPK_ERR_ARG,
                    "dtable: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_embed_bwd(&ctx, w, b, ids, -4, 2, 0, 8, TPK_F32), TPK_ERR_ARG,
                    "T: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_xent_stats(&ctx, c, a, ids, 2, -3, 3, 0, TPK_F32), TPK_ERR_ARG,
                    "Vl: expected >= 0");
        CHECK_FAILS(&ctx, tpk_op_xent_stats(&ctx, c, a, ids, 2, 3, 2, 0, TPK_F32), TPK_ERR_ARG,
                    "tpk_op_xent_stats: ld: expected >= Vl = 3, got 2");
        CHECK_FAILS(&ctx,
                    tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 1, 0, 3, 0.0f, IGNORE, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_xent_grad: ld: expected >= Vl = 3, got 1");
        CHECK_FAILS(&ctx, tpk_op_xent_stats(&ctx, c, a, NULL, 2, 3, 3, 0, TPK_F32), TPK_ERR_ARG,
                    "targets: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 1, ids, 2, 0, 0.0f, IGNORE), TPK_ERR_ARG,
                    "V: expected >= 1, got 0");
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 0, ids, 2, 3, 0.0f, IGNORE), TPK_ERR_ARG,
                    "tpk_op_xent_loss: P: expected >= 1, got 0");
        CHECK_FAILS(&ctx,
                    tpk_op_xent_fused(&ctx, a, m, r, b, ids, 2, 3, 2, 0.0f, IGNORE, 1.0f, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_xent_fused: ld: expected >= Vl = 3, got 2");
        CHECK_FAILS(&ctx,
                    tpk_op_xent_fused(&ctx, a, m, r, b, ids, 2, 3, 3, 0.0f, IGNORE, NAN, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_xent_fused: g: expected a finite");
        CHECK_FAILS(
            &ctx, tpk_op_xent_fused(&ctx, a, NULL, r, b, ids, 2, 3, 3, 0.0f, IGNORE, 1.0f, TPK_F32),
            TPK_ERR_ARG, "tpk_op_xent_fused: loss");
        CHECK_FAILS(&ctx,
                    tpk_op_xent_fused(&ctx, a, m, r, b, ids, 2, 0, 0, 0.0f, IGNORE, 1.0f, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_xent_fused: V: expected >= 1");
        double acc = 0;
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, &acc, a, 2, -1, false), TPK_ERR_ARG,
                    "tpk_op_xent_mean: count: expected >= 0 counted positions");
        CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, a, 2, 3, false)); /* a CP group's count */
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, &acc, a, -2, 0, false), TPK_ERR_ARG,
                    "tpk_op_xent_mean: T: expected >= 0, got -2");
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, NULL, a, 2, 1, false), TPK_ERR_ARG,
                    "tpk_op_xent_mean: acc: expected a buffer");
        CHECK_FAILS(&ctx, tpk_op_xent_mean(&ctx, &acc, NULL, 2, 1, true), TPK_ERR_ARG,
                    "tpk_op_xent_mean: loss: expected a buffer");
        /* no rows: the mean is 0 */
        CHECK_OK(&ctx, tpk_op_xent_mean(&ctx, &acc, NULL, 0, 0, false));
        CHECK(acc == 0.0, "T = 0: mean %g", acc);
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 1, ids, 2, 5, 1.5f, IGNORE), TPK_ERR_ARG,
                    "smoothing:");
        CHECK_FAILS(&ctx, tpk_op_xent_loss(&ctx, a, b, c, 1, ids, 2, 5, -0.1f, IGNORE), TPK_ERR_ARG,
                    "smoothing:");
        CHECK_FAILS(&ctx,
                    tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 3, 0, 0, 0.0f, IGNORE, TPK_F32),
                    TPK_ERR_ARG, "V: expected >= 1");
        CHECK_FAILS(
            &ctx, tpk_op_xent_grad(&ctx, a, b, m, ids, NULL, 2, 3, 3, 0, 3, 0.0f, IGNORE, TPK_F32),
            TPK_ERR_ARG, "dloss: expected a buffer");
        CHECK_FAILS(&ctx,
                    tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 3, 0, 3, 0.0f, IGNORE, TPK_I32),
                    TPK_ERR_DTYPE, "tpk_op_xent_grad: dt:");
        CHECK_FAILS(&ctx,
                    tpk_op_xent_grad(&ctx, a, b, m, ids, r, 2, 3, 3, 0, 3, 1.5f, IGNORE, TPK_F32),
                    TPK_ERR_ARG, "tpk_op_xent_grad: smoothing: expected 0..1, got 1.5");
    }
}


/* ---- a dry run's table (tpk_ops.dry_run): the front end counts, calls no compute entry ------ */

enum { DRY_OPS = 35, DRY_SLOT = 256 }; /* ops run_all_ops calls; floats per buffer */
typedef struct dry_rec {
    int n;
    const char *name[2 * DRY_OPS];
    double bytes[2 * DRY_OPS], flops[2 * DRY_OPS];
} dry_rec;
static void dry_hook(tpk_ctx *c, void *user, const char *name, double bytes, double flops) {
    dry_rec *r = (dry_rec *)user;
    (void)c;
    if (r->n < 2 * DRY_OPS)
        r->name[r->n] = name, r->bytes[r->n] = bytes, r->flops[r->n] = flops, r->n++;
}
/* The buffers of run_all_ops: slot k of the arena (DRY_SLOT floats each). */
enum {
    S_X, S_Y, S_W, S_B, S_DX, S_DY, S_DW, S_DB, S_MEAN, S_RSTD, S_Y16, S_C2D, S_GACC, S_GBIAS,
    S_ACTF, S_ACTB, S_RNG, S_DROP, S_LNW, S_LNB, S_LNY, S_LNDX, S_IDS, S_TABLE, S_EMB, S_DTABLE,
    S_Z, S_PART, S_LOSS, S_LSE, S_ACC, S_DLOSS, S_DZ, S_FDZ, S_FLOSS, S_FLSE, S_QKV, S_OUT,
    S_ALSE, S_DOUT, S_DQKV, S_ROPE, S_GU, S_H, S_DGU, S_RMSY, S_RMSR, S_RMSDX, S_RMSDW, S_AW,
    S_AG, S_AM, S_AV, S_SQ, S_LIN, S_PRE, S_DU, S_LDB, S_R, S_X1, S_RLY, S_RMEAN, S_RRSTD, S_CPY,
    S_COUNT
};
/* Every compute op of the front end once (and a copy), on T = 4 rows of H = 8, a vocabulary of
 * V = 16, attention B = 1, S = 4, two heads of D = 4; the buffers in the arena A. */
static tpk_status run_all_ops(tpk_ctx *c, float *A) {
#define SL(k) (A + (size_t)(k) * DRY_SLOT)
    const int64_t T = 4, H = 8, V = 16, S = 4, Al = 2, D = 4, F = 8;
    const tpk_dtype f = TPK_F32;
    const tpk_act g = TPK_ACT_GELU_TANH;
    const int32_t *ids = (const int32_t *)SL(S_IDS);
    double *acc = (double *)SL(S_ACC), *sq = (double *)SL(S_SQ);
    TPK_TRY(tpk_op_fill(c, SL(S_Y), f, (size_t)(T * H), 0.5f));
    TPK_TRY(tpk_op_copy2d(c, SL(S_C2D), H, SL(S_X), H, T, H, f));
    TPK_TRY(tpk_op_cast(c, SL(S_Y16), TPK_BF16, SL(S_X), f, (size_t)(T * H)));
    TPK_TRY(tpk_op_axpby(c, SL(S_Y), 1.0f, SL(S_X), 0.5f, f, (size_t)(T * H)));
    TPK_TRY(
        tpk_op_gemm(c, false, true, T, H, H, 1.0f, SL(S_X), H, SL(S_W), H, 0.0f, SL(S_Y), H, f));
    TPK_TRY(tpk_op_gemm_acc(c, true, false, H, H, T, 1.0f, SL(S_X), H, SL(S_DY), H, 1.0f,
                            SL(S_GACC), H, f));
    TPK_TRY(tpk_op_bias_add(c, SL(S_Y), SL(S_B), T, H, f));
    TPK_TRY(tpk_op_bias_grad(c, SL(S_GBIAS), SL(S_DY), T, H, f, f, false));
    TPK_TRY(tpk_op_act_fwd(c, g, SL(S_ACTF), SL(S_X), f, (size_t)(T * H)));
    TPK_TRY(tpk_op_act_bwd(c, g, SL(S_ACTB), SL(S_X), SL(S_DY), f, (size_t)(T * H)));
    TPK_TRY(tpk_op_rng_2d(c, SL(S_RNG), f, T, H, H, 0, 0, 1, 2, TPK_RNG_NORMAL, 0.0f, 1.0f));
    TPK_TRY(tpk_op_dropout(c, SL(S_DROP), SL(S_X), T, H, H, 0, 0, 0.25f, 1, 3, f));
    TPK_TRY(tpk_op_layernorm_fwd(c, SL(S_LNY), SL(S_MEAN), SL(S_RSTD), SL(S_X), SL(S_LNW),
                                 SL(S_LNB), T, H, 1e-5f, f));
    TPK_TRY(tpk_op_layernorm_bwd(c, SL(S_LNDX), SL(S_DW), SL(S_DB), SL(S_DY), SL(S_X), SL(S_LNW),
                                 SL(S_MEAN), SL(S_RSTD), T, H, f, false));
    TPK_TRY(tpk_op_embed_fwd(c, SL(S_EMB), ids, SL(S_TABLE), T, H, 0, V, f, false));
    TPK_TRY(tpk_op_embed_bwd(c, SL(S_DTABLE), SL(S_DY), ids, T, H, 0, V, f));
    TPK_TRY(tpk_op_xent_stats(c, SL(S_PART), SL(S_Z), ids, T, V, V, 0, f));
    TPK_TRY(tpk_op_xent_loss(c, SL(S_LOSS), SL(S_LSE), SL(S_PART), 1, ids, T, V, 0.0f, IGNORE));
    TPK_TRY(tpk_op_xent_mean(c, acc, SL(S_LOSS), T, T, false));
    TPK_TRY(tpk_op_xent_grad(c, SL(S_DZ), SL(S_Z), SL(S_LSE), ids, SL(S_DLOSS), T, V, V, 0, V,
                             0.0f, IGNORE, f));
    TPK_TRY(tpk_op_xent_fused(c, SL(S_FDZ), SL(S_FLOSS), SL(S_FLSE), SL(S_Z), ids, T, V, V, 0.1f,
                              IGNORE, 0.25f, f));
    TPK_TRY(tpk_op_attn_fwd(c, SL(S_OUT), SL(S_ALSE), SL(S_QKV), 1, S, Al, D, Al, Al, 0, 0.5f,
                            0.0f, 1, 4, f));
    TPK_TRY(tpk_op_attn_bwd(c, SL(S_DQKV), SL(S_DOUT), SL(S_QKV), SL(S_OUT), SL(S_ALSE), 1, S, Al,
                            D, Al, Al, 0, 0.5f, 0.0f, 1, 4, f));
    TPK_TRY(tpk_op_rope(c, SL(S_ROPE), H, SL(S_X), H, T, S, 2, 4, 10000.0f, false, f));
    TPK_TRY(tpk_op_rope_at(c, SL(S_ROPE), H, SL(S_X), H, T, ids, S, 2, 4, 10000.0f, true, f));
    TPK_TRY(tpk_op_swiglu_fwd(c, SL(S_H), SL(S_GU), T, F, f));
    TPK_TRY(tpk_op_swiglu_bwd(c, SL(S_DGU), SL(S_GU), SL(S_DY), T, F, f));
    TPK_TRY(tpk_op_rmsnorm_fwd(c, SL(S_RMSY), SL(S_RMSR), SL(S_X), SL(S_LNW), T, H, 1e-6f, f));
    TPK_TRY(tpk_op_rmsnorm_bwd(c, SL(S_RMSDX), SL(S_RMSDW), SL(S_DY), SL(S_X), SL(S_LNW),
                               SL(S_RMSR), T, H, f, false));
    TPK_TRY(tpk_op_adamw(c, SL(S_AW), SL(S_AG), SL(S_AM), SL(S_AV), 64, 1e-3f, 0.9f, 0.95f, 1e-8f,
                         0.1f, 1, 1.0f, NULL, 0.0f, NULL, 0, NULL));
    TPK_TRY(tpk_op_sumsq(c, sq, SL(S_X), 64, false));
    TPK_TRY(tpk_op_linear_fwd(c, SL(S_LIN), SL(S_PRE), SL(S_X), SL(S_W), SL(S_B), T, H, H, g, f));
    TPK_TRY(tpk_op_linear_bwd_act(c, SL(S_DU), SL(S_LDB), SL(S_DY), SL(S_W), SL(S_PRE), T, H, H, g,
                                  f));
    TPK_TRY(tpk_op_residual_layernorm_fwd(c, SL(S_X1), SL(S_RLY), SL(S_RMEAN), SL(S_RRSTD),
                                          SL(S_X), SL(S_R), SL(S_LNW), SL(S_LNB), T, H, 1e-5f, f));
    return tpk_op_memcpy(c, SL(S_CPY), SL(S_X), sizeof(float) * (size_t)(T * H), TPK_H2H);
#undef SL
}
/* An arena of random inputs (seeded), the token ids in range, AdamW's second moment >= 0. */
static float *dry_arena(void) {
    float *A = fbuf((size_t)S_COUNT * DRY_SLOT);
    if (!A) return NULL;
    test_randn(A, (size_t)S_COUNT * DRY_SLOT, 77, 1.0f);
    int32_t *ids = (int32_t *)(A + (size_t)S_IDS * DRY_SLOT);
    for (int t = 0; t < DRY_SLOT; t++) ids[t] = (t * 7 + 3) % 16;
    float *v = A + (size_t)S_AV * DRY_SLOT;
    for (int i = 0; i < DRY_SLOT; i++) v[i] = fabsf(v[i]);
    return A;
}
/* A table with the host's memory entries and nothing else, flagged dry (or not). */
static tpk_ops dry_table(bool dry) {
    tpk_ops o;
    memset(&o, 0, sizeof o);
    const tpk_ops *h = tpk_ops_host();
    o.name = "dry", o.alloc = h->alloc, o.free = h->free, o.memcpy = h->memcpy, o.sync = h->sync;
    o.dry_run = dry;
    return o;
}

static void test_dry_run(void) {
    TEST_CASE("a dry run's table: tpk_ctx_init takes the memory entries alone with the flag, "
              "refuses them without it or with one missing, naming it") {
        static tpk_ops t;
        tpk_ctx c;
        t = dry_table(true);
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &t}));
        tpk_ctx_destroy(&c);
        t = dry_table(false);
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &t}), TPK_ERR_ARG,
                    "the table \"dry\" has no fill entry (the core entries");
        tpk_ctx_destroy(&c);
        const char *mem[] = {"alloc", "free", "memcpy", "sync"};
        for (int e = 0; e < 4; e++) {
            t = dry_table(true);
            memset((char *)&t + ops_entries[e].at, 0, ops_entries[e].size);
            char want[160];
            snprintf(want, sizeof want,
                     "the table \"dry\" has no %s entry (a dry run's memory entries, "
                     "TPK__OPS_MEMORY, are required)",
                     mem[e]);
            CHECK(!strcmp(ops_entries[e].name, mem[e]), "entry %d: %s", e, ops_entries[e].name);
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = &t}), TPK_ERR_ARG, want);
            tpk_ctx_destroy(&c);
        }
    }
    TEST_CASE("a dry run: every op's name, bytes and flops reach the profiler's hook as the host "
              "backend's run gives them; no compute entry called, no buffer written but the "
              "copy's; bad arguments still refused; the profiler off, nothing called") {
        static tpk_ops t;
        t = dry_table(true);
        tpk_ctx h, d;
        CHECK_OK(&h, tpk_ctx_init(&h, &(tpk_ctx_desc){.ops = tpk_ops_host()}));
        CHECK_OK(&d, tpk_ctx_init(&d, &(tpk_ctx_desc){.ops = &t}));
        static dry_rec real, dry;
        memset(&real, 0, sizeof real), memset(&dry, 0, sizeof dry);
        CHECK_OK(&h, tpk_profile_start(&h));
        CHECK_OK(&d, tpk_profile_start(&d));
        h.prof->hook = dry_hook, h.prof->hook_user = &real;
        d.prof->hook = dry_hook, d.prof->hook_user = &dry;
        float *Ah = dry_arena(), *Ad = dry_arena(), *A0 = dry_arena();
        size_t bytes = sizeof(float) * (size_t)S_COUNT * DRY_SLOT;
        CHECK(Ah && Ad && A0, "the arenas");
        if (Ah && Ad && A0) {
            CHECK_OK(&h, run_all_ops(&h, Ah));
            CHECK_OK(&d, run_all_ops(&d, Ad));
            CHECK(real.n == DRY_OPS && dry.n == DRY_OPS, "hook calls: host %d, dry %d, want %d",
                  real.n, dry.n, DRY_OPS);
            for (int i = 0; i < real.n && i < dry.n; i++)
                CHECK(!strcmp(real.name[i], dry.name[i]) && real.bytes[i] == dry.bytes[i] &&
                          real.flops[i] == dry.flops[i],
                      "op %d: host %s %g bytes %g flops, dry %s %g bytes %g flops", i,
                      real.name[i], real.bytes[i], real.flops[i], dry.name[i], dry.bytes[i],
                      dry.flops[i]);
            CHECK(memcmp(Ah, A0, bytes) != 0, "the host run wrote its outputs");
            size_t cpy = (size_t)S_CPY * DRY_SLOT, n = 32; /* the copy: the memory entry ran */
            CHECK(!memcmp(Ad + cpy, Ad + (size_t)S_X * DRY_SLOT, n * sizeof(float)),
                  "the dry run's copy (a memory entry) was made");
            memcpy(Ad + cpy, A0 + cpy, n * sizeof(float));
            CHECK(!memcmp(Ad, A0, bytes), "the dry run wrote a buffer besides the copy's");
            CHECK_FAILS(&d,
                        tpk_op_gemm(&d, false, false, 4, 4, 4, 1, Ad, 3, Ad, 4, 0, Ad, 4, TPK_F32),
                        TPK_ERR_ARG, "tpk_op_gemm: lda: expected >= 4, got 3");
            CHECK_FAILS(&d, tpk_op_rmsnorm_fwd(&d, Ad, Ad, Ad, Ad, 4, 8, 0.0f, TPK_F32),
                        TPK_ERR_ARG, "tpk_op_rmsnorm_fwd: eps: expected > 0, got 0");
            CHECK(dry.n == DRY_OPS, "a refused call reached the hook: %d", dry.n);
            tpk_profile_stop(&d); /* no hook: still nothing called (the entries are NULL) */
            memcpy(Ad + cpy, A0 + cpy, n * sizeof(float));
            CHECK_OK(&d, run_all_ops(&d, Ad));
            memcpy(Ad + cpy, A0 + cpy, n * sizeof(float));
            CHECK(!memcmp(Ad, A0, bytes), "the dry run without a profiler wrote a buffer");
        }
        free(Ah), free(Ad), free(A0);
        tpk_ctx_destroy(&h);
        tpk_ctx_destroy(&d);
    }
    TEST_CASE("the planner's counting table (tpk/plan/count.h) is a dry one: the memory entries, "
              "no compute entry, the fusions marked as the backend planned for has them") {
        tpk_ctx err;
        memset(&err, 0, sizeof err);
        static tpk_count cnt;
        const tpk_ops *likes[] = {NULL, tpk_ops_host()};
        for (int l = 0; l < 2; l++) {
            CHECK_OK(&err, tpk_count_init(&err, &cnt, NULL, likes[l], 1, 1, 1, 0, 1));
            const tpk_ops *o = &cnt.ops;
            CHECK(o->dry_run && o->device && o->alloc && o->free && o->memcpy && o->sync,
                  "the flag, the device, the memory entries");
            const char *set = NULL; /* an entry set that is neither memory nor a fusion */
            for (int e = 4; e < OPS_N + OPTIONAL_N && !set; e++) {
                const struct ops_entry *x =
                    e < OPS_N ? &ops_entries[e] : &optional_entries[e - OPS_N];
                bool fused = !strcmp(x->name, "linear_fwd") ||
                             !strcmp(x->name, "linear_bwd_act") ||
                             !strcmp(x->name, "residual_layernorm_fwd") ||
                             !strcmp(x->name, "xent_fused");
                for (size_t b = 0; b < x->size && !fused; b++)
                    if (((const char *)o)[x->at + b]) set = x->name;
            }
            CHECK(!set, "the entry %s is set", set ? set : "");
            const tpk_ops *k = likes[l];
            CHECK(!o->linear_fwd == (k && !k->linear_fwd) &&
                      !o->linear_bwd_act == (k && !k->linear_bwd_act) &&
                      !o->residual_layernorm_fwd == (k && !k->residual_layernorm_fwd) &&
                      !o->xent_fused == (k && !k->xent_fused),
                  "like %s: the fusions marked %d %d %d %d", k ? k->name : "NULL",
                  !!o->linear_fwd, !!o->linear_bwd_act, !!o->residual_layernorm_fwd,
                  !!o->xent_fused);
        }
    }
}

/* a row of the profile by name, or NULL */
static const tpk__prof_row *prof_row(const tpk_ctx *c, const char *name) {
    for (int i = 0; i < c->prof->nrows; i++)
        if (!strcmp(c->prof->rows[i].name, name)) return &c->prof->rows[i];
    return NULL;
}
static void test_profile(void) {
    TEST_CASE(
        "profiler: every op call and collective counted per step with its bytes or flops and a "
        "time; the table; off by default") {
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
            for (int i = 0; i < 2; i++)
                CHECK_OK(&c, tpk_op_gemm(&c, false, false, 8, 4, 16, 1.0f, a, 16, b, 4, 0.0f, y, 4,
                                         TPK_F32));
            CHECK_OK(&c, tpk_allreduce(&c, &c.tp, x, x, 10, TPK_F32, TPK_SUM));
            CHECK_FAILS(&c, tpk_op_fill(&c, NULL, TPK_F32, 5, 0.0f), TPK_ERR_ARG,
                        "x:"); /* refused by the front end: not an op call */
            CHECK_OK(&c, tpk_profile_step(&c));
        }
        const tpk__prof_row *f = prof_row(&c, "fill"), *g = prof_row(&c, "gemm"),
                            *r = prof_row(&c, "tp.allreduce");
        CHECK(c.prof->steps == 2 && c.prof->wall_ms >= 0, "%d steps", c.prof->steps);
        CHECK(f && f->calls == 6 && f->bytes == 6 * 100 * 4.0 && f->flops == 0 && f->ms >= 0,
              "fill: %llu calls, %g bytes", f ? (unsigned long long)f->calls : 0ULL,
              f ? f->bytes : -1);
        CHECK(g && g->calls == 4 && g->flops == 4 * 2.0 * 8 * 4 * 16 && g->ms >= 0,
              "gemm: %llu calls, %g flops", g ? (unsigned long long)g->calls : 0ULL,
              g ? g->flops : -1);
        CHECK(r && r->calls == 2 && r->bytes == 2 * 10 * 4.0, "tp.allreduce: %llu calls",
              r ? (unsigned long long)r->calls : 0ULL);
        FILE *t = tmpfile();
        CHECK_OK(&c, tpk_profile_print(&c, t));
        char text[4096] = "";
        if (t) {
            rewind(t);
            size_t got = fread(text, 1, sizeof text - 1, t);
            text[got] = 0;
            fclose(t);
        }
        const char *want[] = {"profile: 2 steps",
                              "backend host, ops timed by the host clock",
                              "calls/step",
                              "\nfill  ",
                              "     3.0 ",
                              "\ngemm  ",
                              "TFLOP/s",
                              "\ntp.allreduce  ",
                              "GB/s",
                              "all timed ops"};
        for (int i = 0; i < 10; i++)
            CHECK(strstr(text, want[i]) != NULL, "the table lacks \"%s\":\n%s", want[i], text);
        CHECK_FAILS(&c, tpk_profile_print(&c, NULL), TPK_ERR_ARG, "f: NULL");
        tpk_profile_stop(&c);
        CHECK(c.prof == NULL, "stopped");
        tpk_ctx_destroy(&c);
    }
}

OPS_TEST_MAIN(test_errors, test_layer_errors, test_front_end, test_dry_run, test_profile)
