/* tests/test_resid.c — the dropout and residual layers (tpk/layers/resid.h) at t = ranks, with and
 * without sequence parallelism, against a reference computed here element by element from the
 * counter RNG: y = x + b * keep / (1 - p) with keep = uniform(seed, stream, row * H + col) >= p
 * over the GLOBAL (row, col), so every TP size and SP on/off give the same y; backward
 * db = dy * keep / (1 - p) and the skip path's dx += dy; a new mask per rng_step; p = 0 is
 * the identity; no communication; bad input (P layout, wrong shape, backward before forward,
 * p out of range) refused with the argument named. Outputs are poisoned before they are written. */
#include "test.h"

static int me, np;
static tpk_comm world;
enum { T = 13, H = 7 }; /* 13 rows: uneven S(0) splits at t = 2, 3, 4 */

/* keep / (1 - p) of global element (row, col) of the mask of layer `name` at rng_step `step` */
static float ref_scale(const tpk_ctx *ctx, const char *name, uint64_t step, float p, int64_t row,
                       int64_t col) {
    tpk_ctx c = *ctx;
    c.rng_step = step;
    uint64_t stream = tpk__dropout_stream(&c, name);
    return test_dropout_u(ctx->seed, stream, (uint64_t)(row * H + col)) >= p ? 1.0f / (1.0f - p)
                                                                             : 0.0f;
}

static void run(bool sp, float p) {
    tpk_ctx ctx;
    CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 11}));
    tpk_range rows = sp ? tpk_split(T, np, me) : (tpk_range){0, T};
    tpk_layout lay = sp ? TPK_S(0) : TPK_R;
    float *x = malloc(sizeof(float) * T * H), *b = malloc(sizeof(float) * T * H),
          *dy = malloc(sizeof(float) * T * H);
    float *bl = malloc(sizeof(float) * T * H), *dyl = malloc(sizeof(float) * T * H),
          *dxl = malloc(sizeof(float) * T * H);
    test_randn(x, T * H, 1, 1.0f), test_randn(b, T * H, 2, 1.0f), test_randn(dy, T * H, 3, 1.0f);
    tpk_residual r;
    CHECK_OK(&ctx,
             tpk_residual_init(&ctx, &r, &(tpk_residual_desc){.name = "blk.resid", .dropout = p}));
    for (uint64_t step = 0; step < 2; step++) {
        ctx.rng_step = step;
        test_poison(bl, T * H);
        /* the branch output, overwritten by y */
        memcpy(bl, b + rows.off * H, sizeof(float) * rows.size * H);
        tpk_tensor tx = tpk_tensor_shard_2d(x + rows.off * H, TPK_F32, T, H, lay, np, me);
        tpk_tensor tb = tpk_tensor_shard_2d(bl, TPK_F32, T, H, lay, np, me), ty = {0},
                   tdb = {
                       0}; /* set by the calls below (zeroed: a failing call leaves them unset) */
        tpk_comm_stats_reset(&ctx.tp);
        CHECK_OK(&ctx, tpk_residual_forward(&ctx, &r, tx, tb, &ty));
        double err = 0, errb = 0;
        for (int64_t i = 0; i < rows.size; i++)
            for (int j = 0; j < H; j++) {
                int64_t g = rows.off + i;
                float s = ref_scale(&ctx, "blk.resid", step, p, g, j);
                err = fmax(err,
                           fabs(((float *)ty.data)[i * H + j] - (x[g * H + j] + b[g * H + j] * s)));
            }
        CHECK(err < 1e-6, "forward (SP %d, p %g, step %llu): max error %g", sp, (double)p,
              (unsigned long long)step, err);
        /* backward: db = drop'(dy), dx (the branch's input gradient, here poisoned-then-set) +=
         * dy */
        memcpy(dyl, dy + rows.off * H, sizeof(float) * rows.size * H);
        tpk_tensor tdy = tpk_tensor_shard_2d(dyl, TPK_F32, T, H, lay, np, me);
        CHECK_OK(&ctx, tpk_residual_backward(&ctx, &r, tdy, &tdb));
        for (int64_t i = 0; i < rows.size; i++)
            memcpy(dxl + i * H, b + (rows.off + i) * H,
                   sizeof(float) * H); /* a stand-in branch dx */
        tpk_tensor tdx = tpk_tensor_shard_2d(dxl, TPK_F32, T, H, lay, np, me);
        CHECK_OK(&ctx, tpk_residual_backward_add(&ctx, &r, tdx, tdy));
        err = 0;
        for (int64_t i = 0; i < rows.size; i++)
            for (int j = 0; j < H; j++) {
                int64_t g = rows.off + i;
                float s = ref_scale(&ctx, "blk.resid", step, p, g, j);
                errb = fmax(errb, fabs(((float *)tdb.data)[i * H + j] - dy[g * H + j] * s));
                err = fmax(err, fabs(dxl[i * H + j] - (b[g * H + j] + dy[g * H + j])));
                CHECK(dyl[i * H + j] == dy[g * H + j], "dy changed at (%lld, %d)", (long long)g, j);
            }
        CHECK(errb < 1e-6, "backward db (SP %d, p %g): max error %g", sp, (double)p, errb);
        CHECK(err < 1e-6, "backward skip path dx += dy (SP %d): max error %g", sp, err);
        uint64_t calls = 0;
        for (int k = 0; k < TPK_COLL_N; k++) calls += ctx.tp.stats.calls[k];
        CHECK(calls == 0, "%llu collectives, expected none", (unsigned long long)calls);
    }
    /* masks differ between rng steps (p > 0): count positions whose keep changed */
    if (p > 0) {
        int differ = 0;
        for (int i = 0; i < T * H; i++)
            differ += ref_scale(&ctx, "blk.resid", 0, p, i / H, i % H) !=
                      ref_scale(&ctx, "blk.resid", 1, p, i / H, i % H);
        CHECK(differ > 0, "the masks of rng_step 0 and 1 are equal");
    }
    tpk_residual_destroy(&ctx, &r);
    tpk_ctx_destroy(&ctx);
    free(x), free(b), free(dy), free(bl), free(dyl), free(dxl);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    TEST_CASE("residual y = x + drop(b), backward, R layout, p = 0.3, two rng steps")
    run(false, 0.3f);
    TEST_CASE("residual y = x + drop(b), backward, S(0) (sequence parallel, uneven rows), p = 0.3")
    run(true, 0.3f);
    TEST_CASE("residual without dropout (p = 0): y = x + b, db = dy") run(np > 1, 0.0f);

    TEST_CASE("dropout in place then backward in place: the same mask, zeros where dropped") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np, .seed = 4}));
        tpk_dropout d;
        CHECK_OK(&ctx, tpk_dropout_init(&ctx, &d, &(tpk_dropout_desc){.name = "drop", .p = 0.5f}));
        float x[T * H], g[T * H], x0[T * H];
        test_randn(x0, T * H, 5, 1.0f);
        for (int i = 0; i < T * H; i++) g[i] = x[i] = x0[i];
        tpk_tensor tx = tpk_tensor_2d(x, TPK_F32, T, H, TPK_R),
                   tg = tpk_tensor_2d(g, TPK_F32, T, H, TPK_R);
        CHECK_OK(&ctx, tpk_dropout_forward(&ctx, &d, &tx));
        CHECK_OK(&ctx, tpk_dropout_backward_inplace(&ctx, &d, &tg));
        int kept = 0;
        for (int i = 0; i < T * H; i++) {
            float s = ref_scale(&ctx, "drop", 0, 0.5f, i / H, i % H);
            CHECK(x[i] == g[i], "forward and backward masks differ at %d", i);
            CHECK(fabsf(x[i] - x0[i] * s) <= 1e-6f * fabsf(x0[i] * s),
                  "element %d: %g, expected %g", i, (double)x[i], (double)(x0[i] * s));
            kept += s != 0;
        }
        CHECK(kept > T * H / 4 && kept < 3 * T * H / 4, "%d of %d kept at p = 0.5", kept, T * H);
        tpk_dropout_destroy(&ctx, &d);
        tpk_ctx_destroy(&ctx);
    }

    TEST_CASE("bad input: P layout, p out of range, shapes that differ, backward before forward") {
        tpk_ctx ctx;
        CHECK_OK(&ctx, tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}));
        tpk_residual r;
        tpk_dropout d;
        float x[T * H], b[T * H];
        test_randn(x, T * H, 6, 1.0f), test_randn(b, T * H, 7, 1.0f);
        CHECK_FAILS(&ctx, tpk_dropout_init(&ctx, &d, &(tpk_dropout_desc){.p = 1.0f}), TPK_ERR_ARG,
                    "desc->p: expected 0 <= p < 1, got 1");
        CHECK_FAILS(&ctx, tpk_residual_init(&ctx, &r, &(tpk_residual_desc){.dropout = -0.1f}),
                    TPK_ERR_ARG, "expected 0 <= p < 1");
        CHECK_OK(&ctx, tpk_residual_init(&ctx, &r, &(tpk_residual_desc){.dropout = 0.1f}));
        tpk_tensor y, tdb;
        tpk_tensor tdy = tpk_tensor_2d(b, TPK_F32, T, H, TPK_R);
        CHECK_FAILS(&ctx, tpk_residual_backward(&ctx, &r, tdy, &tdb), TPK_ERR_ARG,
                    "backward before forward");
        CHECK_FAILS(&ctx,
                    tpk_residual_forward(&ctx, &r, tpk_tensor_2d(x, TPK_F32, T, H, TPK_R),
                                         tpk_tensor_2d(b, TPK_F32, T, H, TPK_P), &y),
                    TPK_ERR_LAYOUT, "b: expected layout R or S(0), got P");
        CHECK_FAILS(&ctx,
                    tpk_residual_forward(&ctx, &r, tpk_tensor_2d(x, TPK_F32, T - 1, H, TPK_R),
                                         tpk_tensor_2d(b, TPK_F32, T, H, TPK_R), &y),
                    TPK_ERR_SHAPE, "x: expected global shape [13, 7]");
        CHECK_FAILS(&ctx,
                    tpk_residual_forward(&ctx, &r, tpk_tensor_2d(x, TPK_BF16, T, H, TPK_R),
                                         tpk_tensor_2d(b, TPK_F32, T, H, TPK_R), &y),
                    TPK_ERR_DTYPE, "x: expected dtype f32, got bf16");
        CHECK_OK(&ctx, tpk_residual_forward(&ctx, &r, tpk_tensor_2d(x, TPK_F32, T, H, TPK_R),
                                            tpk_tensor_2d(b, TPK_F32, T, H, TPK_R), &y));
        CHECK_FAILS(
            &ctx, tpk_residual_backward(&ctx, &r, tpk_tensor_2d(b, TPK_F32, T, H + 1, TPK_R), &tdb),
            TPK_ERR_SHAPE, "dy: expected global shape");
        CHECK_FAILS(
            &ctx,
            tpk_residual_backward_add(&ctx, &r, tpk_tensor_2d(x, TPK_F32, T + 1, H, TPK_R), tdy),
            TPK_ERR_SHAPE, "dx: expected global shape");
        tpk_residual_destroy(&ctx, &r);
        tpk_ctx_destroy(&ctx);
    }
    tpk_comm_destroy(&world);
    return test_finish();
}
