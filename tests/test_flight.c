/* tests/test_flight.c — the flight recorder (tpk_flight: tpk/base/comm.h, tpk/runtime/coll.h,
 * tpk/runtime/mpi.h) against the calls made: each collective's entry (kind, the group's sequence
 * number, elements, bytes, state) after all-reduce, all-gather, reduce-scatter, broadcast and
 * barrier; a start form running until its wait; a point-to-point batch numbered apart from the
 * collectives; the ring keeping the newest 16 past a wrap; tpk_flight_log's lines; and the report
 * of a failure: rank 0 waits in a TP all-reduce (0.5 s timeout) that the other ranks never reach
 * (they wait in a world barrier), and its lines name every other rank as never reaching that
 * all-reduce's number, with the barrier they wait in, while each asked rank prints its own record.
 * Messages are caught through the context's logger. Run at 1..4 ranks (the report from 2). */
#include "test.h"

static const tpk_flight_entry *entry(tpk_comm *c, uint64_t id) { return tpk__flight_find(c, id); }

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int me = test__rank, np = test__size;
    static test_logbuf lb;
    tpk_comm world;
    tpk_ctx ctx;
    tpk_ctx_desc d = {0};
    d.world = &world, d.tp = np, d.logger.func = test_catch_log, d.logger.user_data = &lb;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK || tpk_ctx_init(&ctx, &d) != TPK_OK) {
        fprintf(stderr, "setup failed: %s\n", tpk_last_error(&ctx));
        return 1;
    }
    tpk_comm *c = &ctx.tp;
    float a[64], b[64 * 4];
    for (int i = 0; i < 64; i++) a[i] = tpk_rng_normal(7, (uint64_t)me, (uint64_t)i);

    TEST_CASE("the ring: each collective's kind, sequence number, elements, bytes and state") {
        uint64_t id0 = c->flight.ops, s0 = c->flight.colls;
        size_t counts[4], total = 0;
        for (int q = 0; q < np; q++) counts[q] = (size_t)(q + 1), total += counts[q];
        int32_t k[5] = {1, 2, 3, 4, 5};
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, a, b, 10, TPK_F32, TPK_SUM));
        CHECK_OK(&ctx, tpk_allgatherv(&ctx, c, a, counts[me], b, counts, total, TPK_F32));
        CHECK_OK(&ctx, tpk_reduce_scatterv(&ctx, c, a, total, b, counts, TPK_F32, TPK_SUM));
        CHECK_OK(&ctx, tpk_bcast(&ctx, c, k, 5, TPK_I32, 0));
        CHECK_OK(&ctx, tpk_barrier(&ctx, c));
        int kinds[5] = {TPK_COLL_ALLREDUCE, TPK_COLL_ALLGATHER, TPK_COLL_REDUCE_SCATTER,
                        TPK_COLL_BROADCAST, TPK_COLL_BARRIER};
        uint64_t elems[5] = {10, total, total, 5, 0}, bytes[5] = {40, 4 * total, 4 * total, 20, 0};
        CHECK(c->flight.ops == id0 + 5 && c->flight.colls == s0 + 5,
              "%llu operations and %llu collectives recorded, expected 5 each",
              (unsigned long long)(c->flight.ops - id0),
              (unsigned long long)(c->flight.colls - s0));
        for (int i = 0; i < 5; i++) {
            const tpk_flight_entry *e = entry(c, id0 + 1 + (uint64_t)i);
            CHECK(e && e->kind == kinds[i] && e->seq == s0 + 1 + (uint64_t)i &&
                      e->elems == elems[i] && e->bytes == bytes[i] && e->state == TPK_FLIGHT_DONE &&
                      e->t1 >= e->t0 && e->t0 > 0,
                  "entry %d: kind %d seq %llu elems %llu bytes %llu state %d", i, e ? e->kind : -1,
                  e ? (unsigned long long)e->seq : 0ull, e ? (unsigned long long)e->elems : 0ull,
                  e ? (unsigned long long)e->bytes : 0ull, e ? e->state : -1);
        }
        CHECK(c->flight.waiting == 0, "waiting in %llu after the calls returned",
              (unsigned long long)c->flight.waiting);
    }
    TEST_CASE("a start form runs until its wait; a point-to-point batch is numbered apart") {
        tpk_request rq = {0};
        CHECK_OK(&ctx, tpk_allreduce_start(&ctx, c, a, b, 3, TPK_F32, TPK_MAX, &rq));
        const tpk_flight_entry *e = entry(c, rq.flight);
        CHECK(e && e->state == TPK_FLIGHT_RUNNING && e->kind == TPK_COLL_ALLREDUCE,
              "started: state %d", e ? e->state : -1);
        CHECK_OK(&ctx, tpk_wait(&ctx, &rq));
        CHECK(e && e->state == TPK_FLIGHT_DONE && e->t1 >= e->t0, "waited: state %d",
              e ? e->state : -1);
        if (np > 1) {
            uint64_t colls = world.flight.colls, batches = world.flight.batches;
            tpk_p2p ops[2] = {{a, 4, TPK_F32, (me + 1) % np, 3, true},
                              {b, 4, TPK_F32, (me + np - 1) % np, 3, false}};
            CHECK_OK(&ctx, tpk_p2p_run(&ctx, &world, ops, 2));
            const tpk_flight_entry *p = entry(&world, world.flight.ops);
            CHECK(p && p->kind == TPK_COLL_SEND && p->seq == batches + 1 && p->nsend == 1 &&
                      p->nrecv == 1 && p->peer == (me + 1) % np && p->elems == 8 &&
                      p->bytes == 32 && world.flight.colls == colls,
                  "batch entry: seq %llu (batches before %llu), %d sends %d receives, peer %d",
                  p ? (unsigned long long)p->seq : 0ull, (unsigned long long)batches,
                  p ? p->nsend : -1, p ? p->nrecv : -1, p ? p->peer : -1);
            CHECK(b[0] == tpk_rng_normal(7, (uint64_t)((me + np - 1) % np), 0), "received %g",
                  (double)b[0]);
        }
    }
    TEST_CASE("the ring keeps the newest 16 operations past a wrap") {
        for (int i = 0; i < 40; i++)
            CHECK_OK(&ctx, tpk_allreduce(&ctx, c, a, b, 1, TPK_F32, TPK_SUM));
        uint64_t last = c->flight.ops, seq = c->flight.colls;
        int bad = 0;
        for (uint64_t j = 0; j < TPK_FLIGHT_N; j++) {
            const tpk_flight_entry *e = entry(c, last - j);
            bad += !e || e->seq != seq - j || e->elems != 1;
        }
        CHECK(bad == 0, "%d of the newest 16 entries wrong", bad);
        CHECK(entry(c, last - TPK_FLIGHT_N) == NULL, "an overwritten entry still found");
    }
    TEST_CASE("tpk_flight_log: a header line, then one line per operation, oldest first") {
        lb.n = 0;
        CHECK_OK(&ctx, tpk_flight_log(&ctx, NULL, TPK_LOG_INFO));
        char head[64], lastop[64];
        snprintf(head, sizeof head, "rank %d: last collectives", me);
        snprintf(lastop, sizeof lastop,
                 "TP all-reduce #%llu:", (unsigned long long)c->flight.colls);
        /* groups of one rank are left out: at 1 rank nothing but the header */
        int want = np > 1 ? 1 + TPK_FLIGHT_N : 1;
        CHECK(lb.n == want && test_lines_with(&lb, head, NULL) == 1, "%d lines, expected %d", lb.n,
              want);
        CHECK(np == 1 || (strstr(lb.lines[lb.n - 1], lastop) && strstr(lb.lines[lb.n - 1], "done")),
              "the last line '%s', expected '%s ... done'", lb.lines[lb.n - 1], lastop);
        CHECK(tpk_flight_log(NULL, NULL, TPK_LOG_INFO) == TPK_ERR_ARG,
              "nothing to print: accepted");
        CHECK_FAILS(&ctx, tpk_flight_log(&ctx, NULL, (tpk_log_level)9), TPK_ERR_ARG, "level");
    }
    if (np > 1) TEST_CASE("a failure's report names the ranks that never reached the collective") {
            static int32_t x, sum; /* the abandoned collective's buffers stay valid to the end */
            CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, c, me == 0 ? 0.5 : 60));
            uint64_t k = c->flight.colls + 1;
            char op[64];
            snprintf(op, sizeof op, "TP all-reduce #%llu", (unsigned long long)k);
            x = me + 1, sum = 0, lb.n = 0;
            if (me == 0) {
                CHECK_FAILS(&ctx, tpk_allreduce(&ctx, c, &x, &sum, 1, TPK_I32, TPK_SUM),
                            TPK_ERR_COMM, "no answer from a peer within 0.5 s");
                CHECK(test_lines_with(&lb, "rank 0: TP all-reduce #", "failed after") == 1 &&
                          test_lines_with(&lb, "rank 0: last collectives", NULL) == 1 &&
                          test_lines_with(&lb, op, "FAILED after") == 1,
                      "rank 0's record of %s missing (%d lines)", op, lb.n);
                for (int q = 1; q < np; q++) {
                    char who[256];
                    snprintf(
                        who, sizeof who,
                        "rank 0: rank %d never reached %s: it has begun %llu TP collectives; it "
                        "waits in world barrier #",
                        q, op, (unsigned long long)(k - 1));
                    CHECK(test_lines_with(&lb, who, NULL) == 1, "no line '%s...'", who);
                }
                CHECK_OK(&ctx, tpk_barrier(&ctx, &world)); /* lets the others go on */
                int seen = 0; /* rank 1's late all-reduce finished with ours */
                MPI_Request rr;
                MPI_Irecv(&seen, 1, MPI_INT, 1, 79, MPI_COMM_WORLD, &rr);
                CHECK_OK(&ctx, tpk_mpi_wait(&ctx, "test", "the world", &rr, 60));
                CHECK(seen == np * (np + 1) / 2, "the late sum %d, expected %d", seen,
                      np * (np + 1) / 2);
            } else {
                CHECK_OK(&ctx, tpk_barrier(&ctx, &world)); /* answers rank 0 while it waits */
                char asked[160];
                snprintf(asked, sizeof asked, "rank %d: asked by rank 0, which failed in %s", me,
                         op);
                CHECK(test_lines_with(&lb, asked, NULL) == 1 &&
                          test_lines_with(&lb, "last collectives", NULL) == 1,
                      "rank %d did not print its record when asked (%d lines)", me, lb.n);
                CHECK_OK(&ctx, tpk_allreduce(&ctx, c, &x, &sum, 1, TPK_I32, TPK_SUM)); /* late */
                CHECK(sum == np * (np + 1) / 2, "late sum %d", (int)sum);
                int seen = sum;
                if (me == 1) MPI_Send(&seen, 1, MPI_INT, 0, 79, MPI_COMM_WORLD);
            }
        }
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return test_finish();
}
