/* tests/test_ops_embed.c — the host backend's embedding (kernels/host/embed.c): the lookup and its
 * scatter-add against references (repeated and out-of-range ids, sharded tables, bf16). Runs on
 * one rank. */
#include "ops_test.h"

/* ---- embedding ----------------------------------------------------------------------------- */

/* reference embedding backward: wdE = dE0 + sum over tokens t with ids[t] = v0 + r of dy[t] */
static void ref_scatter_add(float *wdE, const float *dE0, const float *dy, const int32_t *ids,
                            int T, int H, int v0, int vrows) {
    for (int r = 0; r < vrows; r++)
        for (int j = 0; j < H; j++) {
            double s = dE0[r * H + j];
            for (int t = 0; t < T; t++)
                if (ids[t] == v0 + r) s += dy[t * H + j];
            wdE[r * H + j] = (float)s;
        }
}

static void test_embedding(void) {
    /* rows [v0, v0 + vrows) = [4, 10) of a vocabulary of 14. 5 three times; 4 and 9 the first and
     * last rows; 3 and 10 just outside; -100 far outside. Rows 6 and 8 are not used. */
    enum { T = 9, H = 5, VROWS = 6, V0 = 4, VTOT = 14 };
    const int32_t ids[T] = {5, 4, 9, 10, 3, 5, -100, 5, 7};
    const size_t ny = T * H, ne = VROWS * H;
    TEST_CASE(
        "layers embed_fwd/embed_bwd f32: lookup, out-of-range zeros, accumulate, repeated ids, "
        "shards") {
        float E[VROWS * H], y[T * H], y0[T * H], want[T * H], dy[T * H], dE[VROWS * H],
            dE0[VROWS * H], wdE[VROWS * H];
        test_randn(E, ne, 900, 1.0f);
        test_poison(y, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids, E, T, H, V0, VROWS, TPK_F32, false));
        size_t bad = 0;
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++)
                bad += in ? memcmp(&y[t * H + j], &E[r * H + j], 4) != 0 : !(y[t * H + j] == 0.0f);
        }
        CHECK(bad == 0, "embed_fwd: %zu elements are not the table row (or 0 out of range)", bad);

        /* accumulate: y0 + row, out-of-range tokens unchanged */
        test_randn(y0, ny, 901, 1.0f);
        memcpy(y, y0, sizeof y);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids, E, T, H, V0, VROWS, TPK_F32, true));
        size_t moved = 0;
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++) {
                want[t * H + j] =
                    (float)((double)y0[t * H + j] + (in ? (double)E[r * H + j] : 0.0));
                if (!in) moved += memcmp(&y[t * H + j], &y0[t * H + j], 4) != 0;
            }
        }
        CHECK_CLOSE(y, want, ny, TOL_F32, "embed_fwd accumulate");
        CHECK(moved == 0, "embed_fwd accumulate changed %zu elements of out-of-range tokens",
              moved);

        /* two vocabulary shards [0, 7) and [7, 14) of a table, the second accumulated: the full
         * lookup */
        const int32_t ids2[T] = {0, 6, 7, 13, 3, 7, 12, 1, 6};
        float Efull[VTOT * H];
        test_randn(Efull, VTOT * H, 902, 1.0f);
        test_poison(y, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids2, Efull, T, H, 0, 7, TPK_F32, false));
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids2, Efull + 7 * H, T, H, 7, 7, TPK_F32, true));
        bad = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < H; j++)
                bad += memcmp(&y[t * H + j], &Efull[ids2[t] * H + j], 4) != 0;
        CHECK(bad == 0, "two shards: %zu elements differ from the full table's rows", bad);

        /* backward: dE = dE0 + scatter-add of dy, repeated ids summed, out-of-range ignored */
        test_randn(dy, ny, 903, 1.0f);
        test_randn(dE0, ne, 904, 1.0f);
        memcpy(dE, dE0, sizeof dE);
        CHECK_OK(&ctx, tpk_op_embed_bwd(&ctx, dE, dy, ids, T, H, V0, VROWS, TPK_F32));
        ref_scatter_add(wdE, dE0, dy, ids, T, H, V0, VROWS);
        CHECK_CLOSE(dE, wdE, ne, TOL_F32, "embed_bwd scatter-add");
        size_t untouched = 0; /* rows 2 (id 6) and 4 (id 8) are not used: bitwise unchanged */
        for (int j = 0; j < H; j++)
            untouched += memcmp(&dE[2 * H + j], &dE0[2 * H + j], 4) != 0,
                untouched += memcmp(&dE[4 * H + j], &dE0[4 * H + j], 4) != 0;
        CHECK(untouched == 0, "embed_bwd changed %zu elements of unused rows", untouched);
        /* id 5 (row 1) three times: dE0 + dy[0] + dy[5] + dy[7] */
        for (int j = 0; j < H; j++) {
            double w3 = (double)dE0[H + j] + dy[0 * H + j] + dy[5 * H + j] + dy[7 * H + j];
            CHECK(fabs(dE[H + j] - w3) <= 1e-6 * (fabs(w3) + 1),
                  "repeated id 5, j = %d: %g, expected %g", j, dE[H + j], w3);
        }

        /* empty */
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, NULL, NULL, E, 0, H, V0, VROWS, TPK_F32, false));
        CHECK_OK(&ctx, tpk_op_embed_bwd(&ctx, dE, NULL, NULL, 0, H, V0, VROWS, TPK_F32));
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, y, ids, NULL, T, H, V0, 0, TPK_F32,
                                        false)); /* an empty shard: zeros */
        bad = 0;
        for (size_t k = 0; k < ny; k++) bad += y[k] != 0.0f;
        CHECK(bad == 0, "vrows = 0: %zu nonzero outputs", bad);
    }

    TEST_CASE("layers embed_fwd/embed_bwd bf16: rounded rows, accumulate, scatter of bf16 dy") {
        float E[VROWS * H], y0[T * H], got[T * H], want[T * H], dy[T * H], dE[VROWS * H],
            dE0[VROWS * H], wdE[VROWS * H];
        uint16_t hy[T * H], hdy[T * H];
        test_randn(E, ne, 910, 1.0f);
        poison_bf16(hy, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, hy, ids, E, T, H, V0, VROWS, TPK_BF16, false));
        size_t bad = 0;
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++)
                bad += hy[t * H + j] != (in ? tpk_f32_to_bf16(E[r * H + j]) : 0);
        }
        CHECK(bad == 0, "embed_fwd bf16: %zu elements are not the rounded row (or +0)", bad);

        test_randn(y0, ny, 911, 1.0f);
        round_bf16(y0, ny);
        to_bf16(hy, y0, ny);
        CHECK_OK(&ctx, tpk_op_embed_fwd(&ctx, hy, ids, E, T, H, V0, VROWS, TPK_BF16, true));
        from_bf16(got, hy, ny);
        for (int t = 0; t < T; t++) {
            int r = ids[t] - V0;
            bool in = r >= 0 && r < VROWS;
            for (int j = 0; j < H; j++)
                want[t * H + j] =
                    (float)((double)y0[t * H + j] + (in ? (double)E[r * H + j] : 0.0));
        }
        CHECK_CLOSE(got, want, ny, TOL_BF16, "embed_fwd bf16 accumulate");

        test_randn(dy, ny, 912, 1.0f);
        round_bf16(dy, ny);
        to_bf16(hdy, dy, ny);
        test_randn(dE0, ne, 913, 1.0f);
        memcpy(dE, dE0, sizeof dE);
        CHECK_OK(&ctx, tpk_op_embed_bwd(&ctx, dE, hdy, ids, T, H, V0, VROWS, TPK_BF16));
        ref_scatter_add(wdE, dE0, dy, ids, T, H, V0, VROWS);
        CHECK_CLOSE(dE, wdE, ne, TOL_F32, "embed_bwd bf16 dy (f32 table)");
    }
}

OPS_TEST_MAIN(test_embedding)
