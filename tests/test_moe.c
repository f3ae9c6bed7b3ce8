/* tests/test_moe.c — mixture of experts with expert parallelism.
 *
 * The all-to-all with per-peer counts (tpk_alltoallv, tpk/runtime/coll.h) on the MPI communicator,
 * a split of it and the one-rank `self`: blocks of uneven sizes, some zero, every rank's received
 * blocks against what each sender computes (f32, bf16, i32; blocking and started), the counts
 * exchanged by tpk_alltoallv_counts, the call, element and byte counters, the flight recorder's
 * entry, a peer that never enters it timed out (TPK_ERR_COMM, not a hang), bad counts and buffers
 * refused by name. Run at 1..4 ranks (tests/run.sh: 2 and 4 quick, 1 and 3 long). */
#include "test.h"

/* the elements world rank p sends to rank q: uneven, zero where (p + 2 q) % 3 == 1 */
static size_t cnt(int p, int q) {
    return (p + 2 * q) % 3 == 1 ? 0 : (size_t)(1 + (3 * p + q) % 5) * 7;
}
/* element i of that block */
static float val(int p, int q, size_t i) {
    return tpk_rng_normal(44, (uint64_t)(p * 64 + q), (uint64_t)i);
}

static test_logbuf logs;
static tpk_comm world;
static int me, np;

/* ---- the mesh: EP groups out of the DP ranks ------------------------------------------------ */

/* The context TP x CP x DP x PP with EP groups of ep DP ranks: sizes, ranks and members of ctx->ep
 * and ctx->edp against the formula; the others as without EP. */
static void test_mesh(int tp, int cp, int pp, int ep) {
    tpk_ctx c;
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.world = &world, d.tp = tp, d.cp = cp, d.pp = pp, d.ep = ep;
    CHECK_OK(&c, tpk_ctx_init(&c, &d));
    int dp = np / (tp * cp * pp), tr = me % tp, cr = me / tp % cp, dr = me / (tp * cp) % dp,
        pr = me / (tp * cp * dp), e = ep ? ep : 1;
    CHECK(c.tp.size == tp && c.cp.size == cp && c.dp.size == dp && c.pp.size == pp &&
              c.dp.rank == dr && c.tp.rank == tr,
          "TP %d CP %d DP %d PP %d (rank %d in DP), expected %d %d %d %d (%d)", c.tp.size,
          c.cp.size, c.dp.size, c.pp.size, c.dp.rank, tp, cp, dp, pp, dr);
    CHECK(c.ep.size == e && c.ep.rank == dr % e, "ep: size %d rank %d, expected %d %d", c.ep.size,
          c.ep.rank, e, dr % e);
    CHECK(c.edp && (e > 1 ? c.edp == &c.edp_group : c.edp == c.dp_cp) &&
              c.edp->size == dp / e * cp && c.edp->rank == cr + cp * (dr / e),
          "edp: size %d rank %d, expected %d %d (%s)", c.edp ? c.edp->size : -1,
          c.edp ? c.edp->rank : -1, dp / e * cp, cr + cp * (dr / e),
          e > 1 ? "a group of its own" : "dp_cp");
    tpk_comm *g[2] = {&c.ep, c.edp};
    for (int k = 0; k < 2; k++) {
        int32_t mine = me, all[16];
        size_t counts[16];
        for (int q = 0; q < g[k]->size; q++) counts[q] = 1;
        if (g[k]->size > 1)
            CHECK_OK(&c,
                     tpk_allgatherv(&c, g[k], &mine, 1, all, counts, (size_t)g[k]->size, TPK_I32));
        else all[0] = mine;
        for (int q = 0; q < g[k]->size; q++) {
            int qd = k == 0 ? dr / e * e + q : q / cp * e + dr % e, qc = k == 0 ? cr : q % cp;
            int want = tr + tp * (qc + cp * (qd + dp * pr));
            CHECK(all[q] == want, "%s rank %d: world rank %d, expected %d", k ? "edp" : "ep", q,
                  all[q], want);
        }
    }
    tpk_ctx_destroy(&c);
}

/* One all-to-all over c (rank r of c is world rank map[r]) in dtype dt, started when `start`,
 * against the blocks the senders compute. */
static void a2a_case(tpk_ctx *ctx, tpk_comm *c, const int *map, tpk_dtype dt, bool start) {
    int n = c->size, me = c->rank, wme = map[me];
    size_t sc[8], rc[8], rc2[8], ns = 0, nr = 0;
    for (int q = 0; q < n; q++) sc[q] = cnt(wme, map[q]), rc[q] = cnt(map[q], wme);
    for (int q = 0; q < n; q++) ns += sc[q], nr += rc[q];
    for (int q = 0; q < n; q++) rc2[q] = 12345;
    CHECK_OK(ctx, tpk_alltoallv_counts(ctx, c, sc, rc2));
    CHECK(!memcmp(rc, rc2, sizeof(size_t) * (size_t)n), "tpk_alltoallv_counts: wrong counts");
    size_t es = tpk_dtype_size(dt);
    unsigned char *s = malloc(ns * es + 1), *r = malloc(nr * es + 1);
    for (int q = 0, o = 0; q < n; q++)
        for (size_t i = 0; i < sc[q]; i++, o++) {
            float v = val(wme, map[q], i);
            if (dt == TPK_F32) ((float *)s)[o] = v;
            else if (dt == TPK_BF16) ((uint16_t *)s)[o] = tpk_f32_to_bf16(v);
            else ((int32_t *)s)[o] = (int32_t)(v * 1000);
        }
    memset(r, 0xff, nr * es + 1); /* poison */
    tpk_comm_stats before = c->stats;
    if (start) {
        tpk_request req = {0};
        CHECK_OK(ctx, tpk_alltoallv_start(ctx, c, s, sc, r, rc, dt, &req));
        CHECK(req.active || n == 1, "request not active after start");
        CHECK_OK(ctx, tpk_wait(ctx, &req));
    } else {
        CHECK_OK(ctx, tpk_alltoallv(ctx, c, s, sc, r, rc, dt));
    }
    int bad = 0;
    for (int q = 0, o = 0; q < n; q++)
        for (size_t i = 0; i < rc[q]; i++, o++) {
            float v = val(map[q], wme, i);
            if (dt == TPK_F32) bad += ((float *)r)[o] != v;
            else if (dt == TPK_BF16) bad += ((uint16_t *)r)[o] != tpk_f32_to_bf16(v);
            else bad += ((int32_t *)r)[o] != (int32_t)(v * 1000);
        }
    CHECK(bad == 0 && r[nr * es] == 0xff, "%s%s: %d of %zu elements wrong (or past the end)",
          tpk_dtype_name(dt), start ? " started" : "", bad, nr);
    uint64_t dc = c->stats.calls[TPK_COLL_ALLTOALL] - before.calls[TPK_COLL_ALLTOALL],
             de = c->stats.elems[TPK_COLL_ALLTOALL] - before.elems[TPK_COLL_ALLTOALL],
             db = c->stats.bytes[TPK_COLL_ALLTOALL] - before.bytes[TPK_COLL_ALLTOALL];
    CHECK(dc == 1 && de == ns && db == ns * es, "counted %llu calls, %llu elements, %llu bytes",
          (unsigned long long)dc, (unsigned long long)de, (unsigned long long)db);
    const tpk_flight_entry *e = &c->flight.ring[c->flight.ops % TPK_FLIGHT_N];
    CHECK(e->kind == TPK_COLL_ALLTOALL && e->state == TPK_FLIGHT_DONE && e->elems == ns,
          "flight record: kind %d state %d elems %llu", e->kind, e->state,
          (unsigned long long)e->elems);
    free(s), free(r);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    tpk_ctx ctx;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK ||
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .logger = {test_catch_log, &logs}}) !=
            TPK_OK) {
        fprintf(stderr, "setup failed: %s\n", tpk_last_error(&ctx));
        return 1;
    }
    int wmap[8], half[8];
    for (int q = 0; q < np; q++) wmap[q] = q;

    TEST_CASE("mesh: EP groups of consecutive DP ranks, the experts' replicas (EDP)") {
        for (int tp = 1; tp <= np; tp++)
            for (int cp = 1; cp <= np / tp; cp++)
                for (int pp = 1; pp <= np / (tp * cp); pp++) {
                    if (np % (tp * cp * pp)) continue;
                    int dp = np / (tp * cp * pp);
                    for (int ep = 0; ep <= dp; ep++)
                        if (!ep || dp % ep == 0) test_mesh(tp, cp, pp, ep);
                }
        tpk_ctx c;
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .ep = -1}), TPK_ERR_ARG,
                    "desc->ep: expected a divisor of the DP size");
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .ep = 2 * np}),
                    TPK_ERR_ARG, "desc->ep: expected a divisor of the DP size");
        if (np == 4) {
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .ep = 3}),
                        TPK_ERR_ARG, "desc->ep: expected a divisor of the DP size 4");
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = 2, .ep = 4}),
                        TPK_ERR_ARG, "desc->ep: expected a divisor of the DP size 2");
        }
        if (np > 1) {
            tpk_comm_vtable vt = *world.vt; /* a world without the all-to-all */
            vt.alltoallv = NULL;
            tpk_comm holed = world;
            holed.vt = &vt;
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &holed, .ep = np}),
                        TPK_ERR_ARG, "has no alltoallv entry");
        }
    }
    TEST_CASE("alltoallv: uneven and zero counts, f32, bf16, i32, blocking and started") {
        a2a_case(&ctx, &world, wmap, TPK_F32, false);
        a2a_case(&ctx, &world, wmap, TPK_BF16, true);
        a2a_case(&ctx, &world, wmap, TPK_I32, false);
        a2a_case(&ctx, &world, wmap, TPK_F32, true);
    }
    TEST_CASE("alltoallv: on a split (odd and even ranks), on self, and with nothing to send") {
        tpk_comm sub = {0};
        CHECK_OK(&ctx, tpk_comm_split(&ctx, &world, me % 2, me, &sub));
        for (int r = 0; r < sub.size; r++) half[r] = me % 2 + 2 * r;
        a2a_case(&ctx, &sub, half, TPK_F32, false);
        a2a_case(&ctx, &sub, half, TPK_I32, true);
        tpk_comm_destroy(&sub);
        tpk_comm self = tpk_comm_self(false);
        int one[1] = {me};
        a2a_case(&ctx, &self, one, TPK_F32, false);
        a2a_case(&ctx, &self, one, TPK_BF16, true);
        size_t zero[8] = {0};
        CHECK_OK(&ctx, tpk_alltoallv(&ctx, &world, NULL, zero, NULL, zero, TPK_F32));
        CHECK(world.stats.elems[TPK_COLL_ALLTOALL] > 0, "elements counted");
    }
    TEST_CASE("alltoallv: bad counts and buffers refused by name") {
        size_t sc[8], rc[8];
        float x[64], y[64];
        for (int q = 0; q < np; q++) sc[q] = rc[q] = q == me ? 2 : 0;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, NULL, y, rc, TPK_F32), TPK_ERR_ARG,
                    "sendcounts: expected");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, NULL, TPK_F32), TPK_ERR_ARG,
                    "recvcounts: expected");
        sc[0] = (size_t)INT_MAX + 1;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, rc, TPK_F32), TPK_ERR_ARG,
                    "sendcounts[0]");
        sc[0] = me == 0 ? 2 : 0;
        if (np > 1) {
            size_t big[8];
            for (int q = 0; q < np; q++) big[q] = (size_t)INT_MAX / 2 + 1;
            CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, big, TPK_F32), TPK_ERR_ARG,
                        "recvcounts: the");
        }
        rc[me] = 3;
        char want[64];
        snprintf(want, sizeof want, "recvcounts[%d]", me);
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, rc, TPK_F32), TPK_ERR_ARG, want);
        rc[me] = 2;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, NULL, sc, y, rc, TPK_F32), TPK_ERR_ARG,
                    "send: NULL");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, NULL, rc, TPK_F32), TPK_ERR_ARG,
                    "recv: NULL");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, x, rc, TPK_F32), TPK_ERR_ARG,
                    "recv: must not alias send");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, rc, (tpk_dtype)99), TPK_ERR_DTYPE,
                    "dtype");
        CHECK_FAILS(&ctx, tpk_alltoallv_start(&ctx, &world, x, sc, y, rc, TPK_F32, NULL),
                    TPK_ERR_ARG, "req: expected a request");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, NULL, x, sc, y, rc, TPK_F32), TPK_ERR_ARG, "comm");
        CHECK_FAILS(&ctx, tpk_alltoallv_counts(&ctx, &world, sc, NULL), TPK_ERR_ARG, "recvcounts");
        tpk_comm_vtable vt = *world.vt; /* a communicator without the optional entry */
        vt.alltoallv = NULL;
        tpk_comm holed = world;
        holed.vt = &vt;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &holed, x, sc, y, rc, TPK_F32), TPK_ERR_ARG,
                    "the communicator \"mpi\" has no all-to-all entry (alltoallv)");
        CHECK(world.stats.calls[TPK_COLL_ALLTOALL] == 9, /* 4 cases of 2, the empty one */
              "%llu calls counted, expected 9 (a refused call is not counted)",
              (unsigned long long)world.stats.calls[TPK_COLL_ALLTOALL]);
    }
    TEST_CASE("alltoallv: a peer that never enters it is TPK_ERR_COMM within the timeout") {
        /* pairs of ranks (an odd last one alone: self, which never waits): the first waits with a
         * 0.3 s timeout, the second enters after it has given up and finishes the abandoned
         * collective with it */
        static float x[4], y[4]; /* the abandoned collective's buffers stay valid to the end */
        tpk_comm pair = {0};
        CHECK_OK(&ctx, tpk_comm_split(&ctx, &world, me / 2, me, &pair));
        CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, 0.3));
        size_t two[2] = {2, 2};
        for (int i = 0; i < 4; i++) x[i] = (float)(10 * me + i), y[i] = NAN;
        if (pair.size == 1) {
            CHECK_OK(&ctx, tpk_alltoallv(&ctx, &pair, x, two, y, two, TPK_F32));
        } else if (pair.rank == 0) {
            logs.n = 0;
            CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &pair, x, two, y, two, TPK_F32), TPK_ERR_COMM,
                        "no answer from a peer within 0.3 s");
            CHECK(strstr(tpk_last_error(&ctx), "tpk_alltoallv"), "message names it: %s",
                  tpk_last_error(&ctx));
            const tpk_flight_entry *e = &pair.flight.ring[pair.flight.ops % TPK_FLIGHT_N];
            CHECK(e->kind == TPK_COLL_ALLTOALL && e->state == TPK_FLIGHT_FAILED,
                  "flight record: kind %d state %d", e->kind, e->state);
            CHECK(test_lines_with(&logs, "all-to-all #1", "failed") >= 1,
                  "the report names the all-to-all (%d lines)", logs.n);
            int go = 1, seen = 0;
            MPI_Send(&go, 1, MPI_INT, me + 1, 77, MPI_COMM_WORLD);
            MPI_Recv(&seen, 1, MPI_INT, me + 1, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(seen == 1, "the partner's all-to-all finished");
        } else {
            int go = 0;
            MPI_Recv(&go, 1, MPI_INT, me - 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, 60));
            CHECK_OK(&ctx, tpk_alltoallv(&ctx, &pair, x, two, y, two, TPK_F32));
            int seen = y[0] == (float)(10 * (me - 1) + 2) && y[2] == (float)(10 * me + 2);
            CHECK(seen, "late all-to-all: %g %g", y[0], y[2]);
            MPI_Send(&seen, 1, MPI_INT, me - 1, 78, MPI_COMM_WORLD);
        }
        tpk_comm_destroy(&pair);
    }

    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return test_finish();
}
