/* tests/test_cp_attn.c — context parallelism: the mesh TP x CP x DP x PP (ranks and groups
 * against the formula w = tp + t (cp + c (dp + d pp)), unchanged at cp = 1, bad sizes refused by
 * name); the load-balanced split (every position once over the CP ranks, equal causal work, the
 * scatter and the gather against the formula, a length not divisible by 2c refused). Runs at 2, 3
 * and 4 ranks (CP 2, 3, 4; TP 2 x CP 2). */
#include "test.h"

static tpk_comm world;
static int me, np;

/* ---- the mesh -------------------------------------------------------------------------------- */

static void test_mesh(int tp, int cp, int pp) {
    tpk_ctx c;
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.world = &world, d.tp = tp, d.cp = cp, d.pp = pp;
    CHECK_OK(&c, tpk_ctx_init(&c, &d));
    int dp = np / (tp * cp * pp), tr = me % tp, cr = me / tp % cp, dr = me / (tp * cp) % dp,
        pr = me / (tp * cp * dp);
    CHECK(c.tp.size == tp && c.cp.size == cp && c.dp.size == dp && c.pp.size == pp,
          "sizes TP %d CP %d DP %d PP %d, expected %d %d %d %d", c.tp.size, c.cp.size, c.dp.size,
          c.pp.size, tp, cp, dp, pp);
    CHECK(c.tp.rank == tr && c.cp.rank == cr && c.dp.rank == dr && c.pp.rank == pr,
          "world rank %d: ranks TP %d CP %d DP %d PP %d, expected %d %d %d %d", me, c.tp.rank,
          c.cp.rank, c.dp.rank, c.pp.rank, tr, cr, dr, pr);
    /* each group's members by world rank, against the formula */
    tpk_comm *g[4] = {&c.tp, &c.cp, &c.dp, &c.pp};
    for (int k = 0; k < 4; k++) {
        int32_t mine = me, all[16];
        size_t counts[16];
        for (int q = 0; q < g[k]->size; q++) counts[q] = 1;
        if (g[k]->size > 1)
            CHECK_OK(&c,
                     tpk_allgatherv(&c, g[k], &mine, 1, all, counts, (size_t)g[k]->size, TPK_I32));
        else all[0] = mine;
        for (int q = 0; q < g[k]->size; q++) {
            int want = k == 0   ? q + tp * (cr + cp * (dr + dp * pr))
                       : k == 1 ? tr + tp * (q + cp * (dr + dp * pr))
                       : k == 2 ? tr + tp * (cr + cp * (q + dp * pr))
                                : tr + tp * (cr + cp * (dr + dp * q));
            CHECK(all[q] == want, "group %d rank %d: world rank %d, expected %d", k, q, all[q],
                  want);
        }
    }
    tpk_ctx_destroy(&c);
}

static void test_mesh_cases(void) {
    TEST_CASE("mesh TP x CP x DP x PP: every (tp, cp, pp) dividing %d ranks gives the ranks and "
              "group members of w = tp + t (cp + c (dp + d pp)); cp = 0 is cp = 1",
              np) {
        for (int tp = 1; tp <= np; tp++)
            for (int cp = 1; cp <= np / tp; cp++)
                for (int pp = 1; pp <= np / (tp * cp); pp++)
                    if (np % (tp * cp * pp) == 0) test_mesh(tp, cp, pp);
        tpk_ctx a, b;
        int t = np % 2 ? 1 : 2;
        CHECK_OK(&a, tpk_ctx_init(&a, &(tpk_ctx_desc){.world = &world, .tp = t}));
        CHECK_OK(&b, tpk_ctx_init(&b, &(tpk_ctx_desc){.world = &world, .tp = t, .cp = 1}));
        CHECK(a.cp.size == 1 && a.cp.rank == 0 && a.dp.rank == b.dp.rank &&
                  a.pp.rank == b.pp.rank && a.tp.rank == b.tp.rank,
              "cp = 0 and cp = 1: one mesh");
        tpk_ctx_destroy(&a), tpk_ctx_destroy(&b);
    }
    TEST_CASE("mesh: cp < 1, cp not dividing the ranks, pp not dividing ranks / (tp cp) refused "
              "by name") {
        tpk_ctx c;
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = -1}), TPK_ERR_ARG,
                    "desc->cp: expected a divisor of world size / tp");
        tpk_ctx_destroy(&c);
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = np + 1}),
                    TPK_ERR_ARG, "got");
        CHECK(strstr(tpk_last_error(&c), "desc->cp"), "%s", tpk_last_error(&c));
        tpk_ctx_destroy(&c);
        if (np == 4) {
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = 3}),
                        TPK_ERR_ARG, "desc->cp: expected a divisor of world size / tp = 4 / 1 = 4");
            tpk_ctx_destroy(&c);
            CHECK_FAILS(
                &c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = 2, .cp = 2, .pp = 2}),
                TPK_ERR_ARG, "desc->pp: expected a divisor of world size / (tp cp)");
            tpk_ctx_destroy(&c);
        }
    }
}

/* ---- the split ------------------------------------------------------------------------------- */

static void test_split(int tp) {
    int cp = np / tp;
    tpk_ctx c;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .cp = cp}));
    const int64_t B = 2, S = 6 * cp, Sl = S / cp, cols = 5;
    int64_t pos[64];
    CHECK_OK(&c, tpk_cp_positions(&c, S, pos));
    /* every position once over the CP ranks; the same causal work (visible pairs) on each */
    int32_t mine[64], all[256], work = 0, works[16];
    for (int64_t i = 0; i < Sl; i++) mine[i] = (int32_t)pos[i], work += (int32_t)pos[i] + 1;
    size_t counts[16], wc[16];
    for (int q = 0; q < cp; q++) counts[q] = (size_t)Sl, wc[q] = 1;
    CHECK_OK(&c, tpk_allgatherv(&c, &c.cp, mine, (size_t)Sl, all, counts, (size_t)S, TPK_I32));
    CHECK_OK(&c, tpk_allgatherv(&c, &c.cp, &work, 1, works, wc, (size_t)cp, TPK_I32));
    int seen[256] = {0};
    for (int64_t i = 0; i < S; i++)
        if (all[i] >= 0 && all[i] < S) seen[all[i]]++;
    for (int64_t i = 0; i < S; i++)
        CHECK(seen[i] == 1, "position %lld held %d times", (long long)i, seen[i]);
    for (int q = 0; q < cp; q++)
        CHECK(works[q] == works[0], "CP rank %d: %d visible pairs, rank 0 %d", q, works[q],
              works[0]);
    for (int64_t i = 0; i < Sl; i++) {
        int64_t sc = S / (2 * cp), k = i / sc,
                want = (k ? 2 * cp - 1 - c.cp.rank : c.cp.rank) * sc + i % sc;
        CHECK(pos[i] == want, "row %lld: position %lld, expected %lld", (long long)i,
              (long long)pos[i], (long long)want);
    }
    /* scatter, gather: against the positions; every element written (poison) */
    float *whole = (float *)malloc(sizeof(float) * (size_t)(B * S * cols)),
          *back = (float *)malloc(sizeof(float) * (size_t)(B * S * cols)),
          *local = (float *)malloc(sizeof(float) * (size_t)(B * Sl * cols));
    test_randn(whole, (size_t)(B * S * cols), 11, 1.0f);
    test_poison(local, (size_t)(B * Sl * cols)), test_poison(back, (size_t)(B * S * cols));
    CHECK_OK(&c, tpk_cp_scatter(&c, local, whole, B, S, cols, TPK_F32));
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sl; i++)
            for (int64_t e = 0; e < cols; e++)
                bad += local[(b * Sl + i) * cols + e] != whole[(b * S + pos[i]) * cols + e];
    CHECK(bad == 0, "scatter: %d elements not at their positions", bad);
    CHECK_OK(&c, tpk_cp_gather(&c, back, local, B, S, cols, TPK_F32));
    CHECK(!memcmp(back, whole, sizeof(float) * (size_t)(B * S * cols)), "gather(scatter(x)) != x");
    int32_t ids[64], lids[64];
    for (int64_t i = 0; i < B * S; i++) ids[i] = (int32_t)(1000 * (i / S) + i % S);
    CHECK_OK(&c, tpk_cp_scatter_host(&c, lids, ids, B, S, sizeof(int32_t)));
    bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sl; i++) bad += lids[b * Sl + i] != (int32_t)(1000 * b + pos[i]);
    CHECK(bad == 0, "scatter_host: %d token ids not at their positions", bad);
    CHECK_FAILS(&c, tpk_cp_positions(&c, S + 1, pos), TPK_ERR_SHAPE,
                "S: expected a sequence length that is a multiple of 2 x cp");
    CHECK_FAILS(&c, tpk_cp_scatter(&c, local, whole, B, S + 2 * cp - 1, cols, TPK_F32),
                TPK_ERR_SHAPE, "tpk_cp_scatter: S: expected a sequence length");
    CHECK_FAILS(&c, tpk_cp_gather(&c, back, NULL, B, S, cols, TPK_F32), TPK_ERR_ARG,
                "local: expected a buffer");
    free(whole), free(back), free(local);
    tpk_ctx_destroy(&c);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    test_mesh_cases();
    TEST_CASE("split of S = 6c over CP %d: positions r Sc + i and (2c - 1 - r) Sc + i, each once, "
              "equal causal work; scatter and gather by them; S not a multiple of 2c refused",
              np) {
        test_split(1);
    }
    if (np == 4) TEST_CASE("split under TP 2 x CP 2: the same over each TP rank's CP group") {
            test_split(2);
        }
    tpk_comm_destroy(&world);
    return test_finish();
}
