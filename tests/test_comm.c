/* tests/test_comm.c — the collectives of the MPI communicator against values computed
 * locally: all-reduce (sum, max; f32, bf16, i32; in place; started and waited),
 * all-gather and reduce-scatter with uneven counts (some zero), broadcast, barrier, the call
 * and byte counters, the TP x DP mesh, bad arguments, and the timeout: a peer that does not
 * enter a collective gets its partner TPK_ERR_COMM, not a hang. Run at 1..4 ranks. */
#include "test.h"

/* rank q's value i: a function both sides can compute */
static float val(int q, int i) { return tpk_rng_normal(42, (uint64_t)q, (uint64_t)i); }

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int me = test__rank, np = test__size;
    tpk_comm world;
    tpk_ctx ctx;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK ||
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .tp = np}) != TPK_OK) {
        fprintf(stderr, "setup failed: %s\n", tpk_last_error(&ctx));
        return 1;
    }
    tpk_comm *c = &ctx.tp;
    enum { N = 1000 };
    float *a = malloc(sizeof(float) * N * 8), *b = malloc(sizeof(float) * N * 8),
          *want = malloc(sizeof(float) * N * 8);

    TEST_CASE("allreduce f32 sum and max, blocking and in place") {
        for (int i = 0; i < N; i++) a[i] = val(me, i);
        test_poison(b, N);
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, a, b, N, TPK_F32, TPK_SUM));
        for (int i = 0; i < N; i++) {
            double s = 0;
            for (int q = 0; q < np; q++) s += val(q, i);
            want[i] = (float)s;
        }
        CHECK_CLOSE(b, want, N, 1e-6, "sum");
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, a, a, N, TPK_F32, TPK_MAX));
        for (int i = 0; i < N; i++) {
            want[i] = val(0, i);
            for (int q = 1; q < np; q++) want[i] = fmaxf(want[i], val(q, i));
        }
        CHECK(memcmp(a, want, sizeof(float) * N) == 0, "in-place max differs");
    }
    TEST_CASE("allreduce bf16 and i32") {
        uint16_t *h = (uint16_t *)a, *hw = (uint16_t *)want;
        int32_t *k = (int32_t *)b;
        for (int i = 0; i < N; i++)
            h[i] = tpk_f32_to_bf16((float)(me + 1) * 0.5f + (float)(i % 7)), k[i] = me * 1000 + i;
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, h, h, N, TPK_BF16, TPK_SUM));
        int bad = 0;
        for (int i = 0; i < N; i++) {
            float s = 0;
            for (int q = 0; q < np; q++) s += (float)(q + 1) * 0.5f + (float)(i % 7);
            hw[i] = tpk_f32_to_bf16(s);
            bad += fabsf(tpk_bf16_to_f32(h[i]) - s) > 0.02f * fabsf(s);
        }
        CHECK(bad == 0, "%d bf16 sums off by more than 2%%", bad);
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, k, k, N, TPK_I32, TPK_MAX));
        bad = 0;
        for (int i = 0; i < N; i++) bad += k[i] != (np - 1) * 1000 + i;
        CHECK(bad == 0, "%d i32 max wrong", bad);
    }
    TEST_CASE("allreduce started, overlapped with local work, waited") {
        for (int i = 0; i < N; i++) a[i] = val(me, i);
        tpk_request req = {0};
        CHECK_OK(&ctx, tpk_allreduce_start(&ctx, c, a, b, N, TPK_F32, TPK_SUM, &req));
        CHECK(req.active, "request not active after start");
        double local = 0;
        for (int i = 0; i < N; i++) local += a[i] * a[i];
        CHECK_FAILS(&ctx, tpk_allreduce_start(&ctx, c, a, b, N, TPK_F32, TPK_SUM, &req),
                    TPK_ERR_ARG, "req");
        CHECK_OK(&ctx, tpk_wait(&ctx, &req));
        CHECK(!req.active, "request active after wait");
        CHECK_OK(&ctx, tpk_wait(&ctx, &req)); /* waiting on a finished request is a no-op */
        for (int i = 0; i < N; i++) {
            double s = 0;
            for (int q = 0; q < np; q++) s += val(q, i);
            want[i] = (float)s;
        }
        CHECK_CLOSE(b, want, N, 1e-6, "started sum");
        CHECK(local > 0, "local work");
    }
    TEST_CASE("allgatherv with uneven counts, some zero, blocking and started") {
        size_t counts[8], total = 0;
        for (int q = 0; q < np; q++)
            counts[q] = (size_t)((q * 7 + 3) % 5), total += counts[q]; /* 3, 0, 2, 4 */
        for (size_t i = 0; i < counts[me]; i++) a[i] = val(me, (int)i);
        for (int pass = 0; pass < 2; pass++) {
            test_poison(b, total + 1);
            tpk_request req = {0};
            if (pass == 0)
                CHECK_OK(&ctx, tpk_allgatherv(&ctx, c, a, counts[me], b, counts, total, TPK_F32));
            else {
                CHECK_OK(&ctx, tpk_allgatherv_start(&ctx, c, a, counts[me], b, counts, total,
                                                    TPK_F32, &req));
                CHECK_OK(&ctx, tpk_wait(&ctx, &req));
            }
            size_t off = 0;
            for (int q = 0; q < np; q++)
                for (size_t i = 0; i < counts[q]; i++) want[off++] = val(q, (int)i);
            CHECK(memcmp(b, want, sizeof(float) * total) == 0, "gathered data differ (pass %d)",
                  pass);
            CHECK(isnan(b[total]), "wrote past the end");
        }
    }
    TEST_CASE("reduce_scatterv with uneven counts, some zero, blocking and started") {
        size_t counts[8], total = 0, off = 0;
        for (int q = 0; q < np; q++) counts[q] = (size_t)(q == 1 ? 0 : 10 + q), total += counts[q];
        for (int q = 0; q < me; q++) off += counts[q];
        for (size_t i = 0; i < total; i++) a[i] = val(me, (int)i);
        for (int pass = 0; pass < 2; pass++) {
            test_poison(b, counts[me] + 1);
            tpk_request req = {0};
            if (pass == 0)
                CHECK_OK(&ctx, tpk_reduce_scatterv(&ctx, c, a, total, b, counts, TPK_F32, TPK_SUM));
            else {
                CHECK_OK(&ctx, tpk_reduce_scatterv_start(&ctx, c, a, total, b, counts, TPK_F32,
                                                         TPK_SUM, &req));
                CHECK_OK(&ctx, tpk_wait(&ctx, &req));
            }
            for (size_t i = 0; i < counts[me]; i++) {
                double s = 0;
                for (int q = 0; q < np; q++) s += val(q, (int)(off + i));
                want[i] = (float)s;
            }
            CHECK_CLOSE(b, want, counts[me], 1e-6, "reduce-scatter");
            CHECK(isnan(b[counts[me]]), "wrote past the end");
        }
    }
    TEST_CASE("bcast from every root, barrier") {
        for (int root = 0; root < np; root++) {
            for (int i = 0; i < N; i++) a[i] = val(me, i);
            CHECK_OK(&ctx, tpk_bcast(&ctx, c, a, N, TPK_F32, root));
            int bad = 0;
            for (int i = 0; i < N; i++) bad += a[i] != val(root, i);
            CHECK(bad == 0, "root %d: %d elements differ", root, bad);
        }
        tpk_request req = {0};
        CHECK_OK(&ctx, tpk_barrier(&ctx, c));
        CHECK_OK(&ctx, tpk_barrier_start(&ctx, c, &req));
        CHECK_OK(&ctx, tpk_wait(&ctx, &req));
    }
    TEST_CASE("counters: calls, elements and bytes per kind") {
        tpk_comm_stats_reset(c);
        size_t counts[8];
        for (int q = 0; q < np; q++) counts[q] = 5;
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, a, a, 100, TPK_F32, TPK_SUM));
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, a, a, 50, TPK_BF16, TPK_SUM));
        CHECK_OK(&ctx, tpk_allgatherv(&ctx, c, a, 5, b, counts, 5 * (size_t)np, TPK_F32));
        CHECK_OK(&ctx,
                 tpk_reduce_scatterv(&ctx, c, b, 5 * (size_t)np, a, counts, TPK_F32, TPK_SUM));
        CHECK_OK(&ctx, tpk_bcast(&ctx, c, a, 7, TPK_F32, 0));
        CHECK_OK(&ctx, tpk_barrier(&ctx, c));
        tpk_comm_stats s = c->stats;
        CHECK(s.calls[TPK_COLL_ALLREDUCE] == 2 && s.elems[TPK_COLL_ALLREDUCE] == 150 &&
                  s.bytes[TPK_COLL_ALLREDUCE] == 500,
              "all-reduce: %llu calls %llu elems %llu bytes", (unsigned long long)s.calls[0],
              (unsigned long long)s.elems[0], (unsigned long long)s.bytes[0]);
        CHECK(s.calls[TPK_COLL_ALLGATHER] == 1 && s.elems[TPK_COLL_ALLGATHER] == 5 * (uint64_t)np,
              "all-gather counters");
        CHECK(s.calls[TPK_COLL_REDUCE_SCATTER] == 1 &&
                  s.elems[TPK_COLL_REDUCE_SCATTER] == 5 * (uint64_t)np,
              "reduce-scatter counters");
        CHECK(s.calls[TPK_COLL_BROADCAST] == 1 && s.bytes[TPK_COLL_BROADCAST] == 28,
              "broadcast counters");
        CHECK(s.calls[TPK_COLL_BARRIER] == 1, "barrier counter");
    }
    TEST_CASE("mesh: TP groups of consecutive ranks, DP groups across") {
        for (int tp = 1; tp <= np; tp++) {
            if (np % tp) {
                tpk_ctx bad;
                tpk_status s = tpk_ctx_init(&bad, &(tpk_ctx_desc){.world = &world, .tp = tp});
                CHECK(s == TPK_ERR_ARG && strstr(tpk_last_error(&bad), "desc->tp"),
                      "tp=%d of %d: %s", tp, np, tpk_last_error(&bad));
                continue;
            }
            tpk_ctx m;
            CHECK_OK(&m, tpk_ctx_init(&m, &(tpk_ctx_desc){.world = &world, .tp = tp}));
            CHECK(m.tp.size == tp && m.tp.rank == me % tp, "tp=%d: TP rank %d of %d", tp, m.tp.rank,
                  m.tp.size);
            CHECK(m.dp.size == np / tp && m.dp.rank == me / tp, "tp=%d: DP rank %d of %d", tp,
                  m.dp.rank, m.dp.size);
            int x = me, sum = 0;
            CHECK_OK(&m, tpk_allreduce(&m, &m.tp, &x, &sum, 1, TPK_I32, TPK_SUM));
            int g = me / tp, expect = 0;
            for (int q = g * tp; q < g * tp + tp; q++) expect += q;
            CHECK(sum == expect, "tp=%d: TP group sum %d, expected %d", tp, sum, expect);
            CHECK_OK(&m, tpk_allreduce(&m, &m.dp, &x, &sum, 1, TPK_I32, TPK_SUM));
            expect = 0;
            for (int q = me % tp; q < np; q += tp) expect += q;
            CHECK(sum == expect, "tp=%d: DP group sum %d, expected %d", tp, sum, expect);
            tpk_ctx_destroy(&m);
        }
        tpk_ctx bad;
        CHECK(tpk_ctx_init(&bad, &(tpk_ctx_desc){.world = &world, .tp = -1}) == TPK_ERR_ARG,
              "tp = -1 accepted");
    }
    TEST_CASE("bad arguments get a status and a message naming them") {
        size_t counts[8], total = 0;
        for (int q = 0; q < np; q++) counts[q] = 3, total += 3;
        CHECK_FAILS(&ctx, tpk_allgatherv(&ctx, c, a, 3, b, counts, total + 1, TPK_F32), TPK_ERR_ARG,
                    "recvcount");
        CHECK_FAILS(&ctx, tpk_allgatherv(&ctx, c, a, 2, b, counts, total, TPK_F32), TPK_ERR_ARG,
                    "counts[");
        CHECK_FAILS(&ctx, tpk_allgatherv(&ctx, c, a, 3, b, NULL, total, TPK_F32), TPK_ERR_ARG,
                    "counts");
        CHECK_FAILS(&ctx, tpk_reduce_scatterv(&ctx, c, a, total - 1, b, counts, TPK_F32, TPK_SUM),
                    TPK_ERR_ARG, "sendcount");
        CHECK_FAILS(&ctx, tpk_reduce_scatterv(&ctx, c, a, total, a, counts, TPK_F32, TPK_SUM),
                    TPK_ERR_ARG, "alias");
        CHECK_FAILS(&ctx, tpk_allreduce(&ctx, c, NULL, b, 4, TPK_F32, TPK_SUM), TPK_ERR_ARG,
                    "send");
        CHECK_FAILS(&ctx, tpk_allreduce(&ctx, c, a, b, 4, TPK_F32, (tpk_redop)7), TPK_ERR_ARG,
                    "op");
        CHECK_FAILS(&ctx, tpk_allreduce(&ctx, c, a, b, 4, (tpk_dtype)9, TPK_SUM), TPK_ERR_DTYPE,
                    "dtype");
        CHECK_FAILS(&ctx, tpk_allreduce(&ctx, c, a, b, (size_t)INT_MAX + 1, TPK_F32, TPK_SUM),
                    TPK_ERR_ARG, "count");
        CHECK_FAILS(&ctx, tpk_allreduce(&ctx, NULL, a, b, 4, TPK_F32, TPK_SUM), TPK_ERR_ARG,
                    "comm");
        CHECK_FAILS(&ctx, tpk_bcast(&ctx, c, a, 4, TPK_F32, np), TPK_ERR_ARG, "root");
        CHECK_FAILS(&ctx, tpk_allreduce_start(&ctx, c, a, b, 4, TPK_F32, TPK_SUM, NULL),
                    TPK_ERR_ARG, "req");
        CHECK_FAILS(&ctx, tpk_wait(&ctx, NULL), TPK_ERR_ARG, "req");
        /* after all these the communicator still works */
        float one = 1.f, n = 0.f;
        CHECK_OK(&ctx, tpk_allreduce(&ctx, c, &one, &n, 1, TPK_F32, TPK_SUM));
        CHECK(n == (float)np, "sum of ones %g", (double)n);
    }
    TEST_CASE("self communicator: collectives are copies") {
        tpk_comm self = tpk_comm_self(false);
        size_t one[1] = {N};
        for (int i = 0; i < N; i++) a[i] = val(me, i);
        test_poison(b, N);
        CHECK_OK(&ctx, tpk_allreduce(&ctx, &self, a, b, N, TPK_F32, TPK_SUM));
        CHECK(memcmp(a, b, sizeof(float) * N) == 0, "allreduce");
        test_poison(b, N);
        CHECK_OK(&ctx, tpk_allgatherv(&ctx, &self, a, N, b, one, N, TPK_F32));
        CHECK(memcmp(a, b, sizeof(float) * N) == 0, "allgatherv");
        test_poison(b, N);
        CHECK_OK(&ctx, tpk_reduce_scatterv(&ctx, &self, a, N, b, one, TPK_F32, TPK_SUM));
        CHECK(memcmp(a, b, sizeof(float) * N) == 0, "reduce_scatterv");
        CHECK(self.stats.calls[TPK_COLL_ALLREDUCE] == 1, "self counts its calls");
    }
    TEST_CASE(
        "timeout: a peer that does not enter a collective is an error within the timeout, not a "
        "hang") {
        /* pairs of ranks (an odd last rank alone: a self communicator, which never waits); in a
         * pair the first starts one collective, then waits in a second with a 0.2 s timeout; the
         * started one's wait then fails at once (no second timeout), naming the first failure.
         * The second rank enters only after being told the first has given up, then finishes
         * both abandoned collectives with it */
        static int32_t x, sum, x2, sum2; /* the abandoned collectives' buffers stay valid */
        tpk_comm pair = {0};
        CHECK_OK(&ctx, tpk_comm_split(&ctx, &world, me / 2, me, &pair));
        CHECK_FAILS(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, -1), TPK_ERR_ARG, "timeout_s");
        CHECK_FAILS(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, NAN), TPK_ERR_ARG, "timeout_s");
        CHECK_FAILS(&ctx, tpk_comm_mpi_set_timeout(&ctx, NULL, 1), TPK_ERR_ARG, "comm");
        MPI_Request none = MPI_REQUEST_NULL;
        CHECK_FAILS(&ctx, tpk_mpi_wait(&ctx, "test", "none", &none, -2), TPK_ERR_ARG, "timeout_s");
        CHECK_OK(&ctx, tpk_mpi_wait(&ctx, "test", "none", &none, 1)); /* a null request is
                                                                         finished */
        CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, 0.2));
        x = x2 = me + 1, sum = sum2 = 0;
        if (pair.size == 1) {
            CHECK_OK(&ctx, tpk_allreduce(&ctx, &pair, &x, &sum, 1, TPK_I32, TPK_SUM));
            CHECK(sum == x, "self: %d, expected %d", (int)sum, (int)x);
        } else if (pair.rank == 0) {
            tpk_request started = {0};
            CHECK_OK(&ctx, tpk_allreduce_start(&ctx, &pair, &x2, &sum2, 1, TPK_I32, TPK_SUM,
                                               &started));
            double t0 = MPI_Wtime();
            CHECK_FAILS(&ctx, tpk_allreduce(&ctx, &pair, &x, &sum, 1, TPK_I32, TPK_SUM),
                        TPK_ERR_COMM, "no answer from a peer within 0.2 s");
            double waited = MPI_Wtime() - t0;
            CHECK(strstr(tpk_last_error(&ctx), "tpk_allreduce") &&
                      strstr(tpk_last_error(&ctx), "(2 ranks)"),
                  "message names the collective and group: %s", tpk_last_error(&ctx));
            CHECK(waited >= 0.2 && waited < 30, "gave up after %.3f s, expected 0.2 s", waited);
            /* the communicator is unusable now: the started collective's wait and every new
             * collective fail at once, repeating the first failure */
            CHECK_FAILS(&ctx, tpk_wait(&ctx, &started), TPK_ERR_COMM,
                        "unusable after an earlier failure on it (tpk_allreduce (mpi): no answer "
                        "from a peer within 0.2 s");
            int32_t y = 0;
            CHECK_FAILS(&ctx, tpk_allreduce(&ctx, &pair, &y, &y, 1, TPK_I32, TPK_SUM), TPK_ERR_COMM,
                        "earlier failure");
            tpk_request rq = {0};
            CHECK_FAILS(&ctx, tpk_barrier_start(&ctx, &pair, &rq), TPK_ERR_COMM,
                        "earlier failure");
            int go = 1, seen = 0;
            MPI_Send(&go, 1, MPI_INT, me + 1, 77, MPI_COMM_WORLD);
            MPI_Request rr; /* the partner's answer: its collective finished with ours */
            MPI_Irecv(&seen, 1, MPI_INT, me + 1, 78, MPI_COMM_WORLD, &rr);
            CHECK_OK(&ctx, tpk_mpi_wait(&ctx, "test", "the world", &rr, 60));
            CHECK(seen == 2 * ((me + 1) + (me + 2)), "partner's sums %d", seen);
        } else {
            int go = 0;
            MPI_Recv(&go, 1, MPI_INT, me - 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, 60));
            CHECK_OK(&ctx, tpk_allreduce(&ctx, &pair, &x2, &sum2, 1, TPK_I32,
                                         TPK_SUM)); /* the first rank's two are still under way */
            CHECK_OK(&ctx, tpk_allreduce(&ctx, &pair, &x, &sum, 1, TPK_I32, TPK_SUM));
            CHECK(sum == me + (me + 1) && sum2 == sum, "late sums %d %d, expected %d", (int)sum,
                  (int)sum2, me + (me + 1));
            int seen = sum + sum2;
            MPI_Send(&seen, 1, MPI_INT, me - 1, 78, MPI_COMM_WORLD);
        }
        tpk_comm_destroy(&pair);
    }
    TEST_CASE("a world whose vtable lacks an entry is refused, naming it (TPK__COMM_ENTRIES)") {
        static const char *names[] = {
            "allreduce", "allgatherv", "reduce_scatterv", "bcast", "barrier", "wait", "split"};
        for (int e = 0; e < 7; e++) {
            tpk_comm_vtable vt = *world.vt;
            switch (e) { /* the entry's function pointer, set to NULL */
            case 0: vt.allreduce = NULL; break;
            case 1: vt.allgatherv = NULL; break;
            case 2: vt.reduce_scatterv = NULL; break;
            case 3: vt.bcast = NULL; break;
            case 4: vt.barrier = NULL; break;
            case 5: vt.wait = NULL; break;
            case 6: vt.split = NULL; break;
            }
            tpk_comm holed = world;
            holed.vt = &vt;
            tpk_ctx bad;
            char want[96];
            snprintf(want, sizeof want, "desc->world: the communicator \"mpi\" has no %s entry",
                     names[e]);
            CHECK_FAILS(&bad, tpk_ctx_init(&bad, &(tpk_ctx_desc){.world = &holed, .tp = np}),
                        TPK_ERR_ARG, want);
            tpk_ctx_destroy(&bad);
        }
    }
    free(a), free(b), free(want);
    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return test_finish();
}
