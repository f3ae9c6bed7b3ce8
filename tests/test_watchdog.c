/* tests/test_watchdog.c — the watchdog's rule (tpk__watch_note, tpk__watch_alive,
 * tpk__watch_deadline in tpk/runtime/coll.h), shared by the MPI waits (tpk/runtime/mpi.h) and the
 * NCCL communicator's watchdog (kernels/cuda/comm_nccl.cu), and the host side of the NCCL
 * watchdog's progress hook and report (tpk/runtime/nccl.h).
 *
 * The rule: a wait that began at t0 times out timeout_s after max(t0, alive), alive = the latest of
 * the last note's arrival (a heartbeat, a phase's start or end) and the end of any peer's
 * announced phase (its note's arrival + its budget). Checked on fixed cases (a peer's phase extends
 * the deadline, a heartbeat restarts it, a stopped peer ends the wait within the timeout, a phase's
 * budget bounds it) and on random note sequences against an independent reference: the MPI wait
 * loop's former form, a counter of the seconds waited that every note or busy peer resets to 0,
 * stepped every millisecond (the two agree to a step).
 * From 2 ranks, over MPI with the world's heartbeat: rank 0 waits in a barrier with a 0.3 s timeout
 * while rank 1 is 0.8 s away in an announced phase, or sending heartbeats: no timeout; rank 1
 * announces a 0.4 s phase and stays away 2 s: rank 0 fails after about 0.7 s (the budget plus the
 * timeout), not at 0.3 s and not when rank 1 comes back. tpk__nccl_mpi_progress (the NCCL desc's
 * hook) returns -HUGE_VAL before any note, about +5 s while rank 1 is in a 5 s phase, about 0 just
 * after the phase ends. The side channel kept beside a (stand-in) NCCL world is found by
 * tpk__mpi_side, and a failure reported on that world asks the other ranks, which answer from the
 * progress hook, and names each as never reaching the collective; released, it is gone.
 * Run at 1..4 ranks (the MPI cases from 2). */
#include "test.h"

#include <tpk/runtime/nccl.h>


/* A peer's note: at time t, from peer q, budget b (> 0 a phase, 0 a heartbeat, < 0 the end). */
typedef struct note {
    double t, b;
    int q;
} note;

/* The reference: the seconds waited counted in steps of dt from t0, reset to 0 at a step where a
 * note arrives or a peer is inside its announced phase; the time it reaches timeout_s (notes sorted
 * by time; those before t0 only set the phases). */
static double ref_timeout(double t0, double timeout_s, const note *ns, int n, double dt) {
    double until[4] = {-HUGE_VAL, -HUGE_VAL, -HUGE_VAL, -HUGE_VAL}, waited = 0;
    int i = 0;
    for (; i < n && ns[i].t <= t0; i++)
        until[ns[i].q] = ns[i].b > 0 ? ns[i].t + ns[i].b : -HUGE_VAL;
    for (double t = t0 + dt;; t += dt) {
        bool busy = false;
        for (; i < n && ns[i].t <= t; i++)
            until[ns[i].q] = ns[i].b > 0 ? ns[i].t + ns[i].b : -HUGE_VAL, busy = true;
        for (int q = 0; q < 4; q++) busy = busy || until[q] > t;
        waited = busy ? 0 : waited + dt;
        if (waited >= timeout_s - 1e-9) return t;
    }
}
/* The rule's: the first step t at which t >= tpk__watch_deadline of the notes arrived by t. */
static double rule_timeout(double t0, double timeout_s, const note *ns, int n, double dt) {
    double until[4] = {-HUGE_VAL, -HUGE_VAL, -HUGE_VAL, -HUGE_VAL}, heard = -HUGE_VAL;
    int i = 0;
    for (; i < n && ns[i].t <= t0; i++) tpk__watch_note(ns[i].t, ns[i].b, &heard, &until[ns[i].q]);
    for (double t = t0 + dt;; t += dt) {
        for (; i < n && ns[i].t <= t; i++)
            tpk__watch_note(ns[i].t, ns[i].b, &heard, &until[ns[i].q]);
        if (t >= tpk__watch_deadline(t0, tpk__watch_alive(heard, until, 4), timeout_s) - 1e-9)
            return t;
    }
}

/* Spin (no sleep, no notes unless beat) for sec seconds. */
static void spin(double sec, bool beat) {
    for (double t0 = MPI_Wtime(); MPI_Wtime() - t0 < sec;)
        if (beat) tpk_busy(NULL, 0);
}
/* Call the NCCL progress hook until pred(value) holds or 5 s pass; the last value. */
static double hook_until(int want_sign) {
    double v = tpk__nccl_mpi_progress(NULL);
    for (double t0 = MPI_Wtime(); MPI_Wtime() - t0 < 5; v = tpk__nccl_mpi_progress(NULL))
        if ((want_sign > 0 && v > 0) || (want_sign < 0 && v <= 0 && v > -HUGE_VAL)) break;
    return v;
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    int me = test__rank, np = test__size;
    static test_logbuf lb;
    tpk_comm world;
    tpk_ctx ctx;
    tpk_ctx_desc d = {0};
    d.world = &world, d.tp = np, d.logger.func = test_catch_log, d.logger.user_data = &lb;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK || tpk_ctx_init(&ctx, &d) != TPK_OK ||
        tpk_mpi_heartbeat_init(&ctx) != TPK_OK) {
        fprintf(stderr, "setup failed: %s\n", tpk_last_error(&ctx));
        return 1;
    }

    TEST_CASE("the rule: a phase extends the deadline, a heartbeat restarts it, a stopped peer "
              "ends the wait within the timeout, a phase's budget bounds it") {
        double t0 = 100, T = 2, heard = -HUGE_VAL, until[2] = {-HUGE_VAL, -HUGE_VAL};
        double dl = tpk__watch_deadline(t0, tpk__watch_alive(heard, until, 2), T);
        CHECK(dl == t0 + T, "no note: deadline %g, expected %g (a stopped peer)", dl, t0 + T);
        CHECK(tpk__watch_deadline(t0, NAN, T) == t0 + T, "alive NaN: not t0 + T");
        tpk__watch_note(99, 0, &heard, &until[1]); /* a heartbeat before the wait: no effect */
        dl = tpk__watch_deadline(t0, tpk__watch_alive(heard, until, 2), T);
        CHECK(dl == t0 + T, "a heartbeat before t0: deadline %g, expected %g", dl, t0 + T);
        tpk__watch_note(101, 0, &heard, &until[1]); /* a heartbeat: the count restarts */
        dl = tpk__watch_deadline(t0, tpk__watch_alive(heard, until, 2), T);
        CHECK(dl == 101 + T && until[1] == -HUGE_VAL,
              "a heartbeat at 101: deadline %g, expected %g", dl, 101 + T);
        tpk__watch_note(101.5, 10, &heard, &until[0]); /* rank 0's phase of 10 s */
        dl = tpk__watch_deadline(t0, tpk__watch_alive(heard, until, 2), T);
        CHECK(dl == 101.5 + 10 + T, "a phase of 10 s at 101.5: deadline %g, expected %g", dl,
              101.5 + 10 + T);
        tpk__watch_note(105, 0, &heard, &until[1]); /* the other's heartbeat inside the phase */
        dl = tpk__watch_deadline(t0, tpk__watch_alive(heard, until, 2), T);
        CHECK(dl == 101.5 + 10 + T, "a heartbeat inside a peer's phase: deadline %g, expected %g",
              dl, 101.5 + 10 + T);
        tpk__watch_note(106, -1, &heard, &until[0]); /* the phase's end: from its note */
        dl = tpk__watch_deadline(t0, tpk__watch_alive(heard, until, 2), T);
        CHECK(dl == 106 + T && until[0] == -HUGE_VAL,
              "the phase ended at 106: deadline %g, "
              "expected %g",
              dl, 106 + T);
        CHECK(tpk__watch_deadline(t0, 1e9, 0) == HUGE_VAL &&
                  tpk__watch_deadline(t0, -HUGE_VAL, NAN) == HUGE_VAL,
              "timeout 0 or NaN: a deadline");
        CHECK(tpk__watch_alive(-HUGE_VAL, NULL, 3) == -HUGE_VAL, "no peers: something heard");
    }

    TEST_CASE("the rule against the former waited-seconds counter, on random notes") {
        int bad = 0;
        double worst = 0, dt = 1e-3;
        for (int trial = 0; trial < 300; trial++) {
            note ns[8];
            int n = (int)(tpk_rng_uniform(11, (uint64_t)trial, 0) * 8);
            double T = 0.1 + 1.4 * tpk_rng_uniform(11, (uint64_t)trial, 1), t0 = 10;
            for (int i = 0; i < n; i++) {
                double u = tpk_rng_uniform(11, (uint64_t)trial, (uint64_t)(2 + 3 * i));
                double k = tpk_rng_uniform(11, (uint64_t)trial, (uint64_t)(3 + 3 * i));
                ns[i].t = t0 - 1 + 5 * u;
                ns[i].q = (int)(4 * tpk_rng_uniform(11, (uint64_t)trial, (uint64_t)(4 + 3 * i)));
                ns[i].b = k < 0.4 ? 0 : k < 0.6 ? -1 : 0.05 + 2 * (k - 0.6);
            }
            for (int i = 1; i < n; i++) /* by time */
                for (int j = i; j > 0 && ns[j - 1].t > ns[j].t; j--) {
                    note x = ns[j];
                    ns[j] = ns[j - 1], ns[j - 1] = x;
                }
            double a = ref_timeout(t0, T, ns, n, dt), b = rule_timeout(t0, T, ns, n, dt);
            double err = fabs(a - b);
            worst = err > worst ? err : worst;
            bad += err > 2.5 * dt;
        }
        CHECK(bad == 0, "%d of 300 sequences disagree (worst by %.4f s)", bad, worst);
    }

    TEST_CASE("the NCCL desc's progress hook (tpk/runtime/nccl.h) from the MPI heartbeat") {
        double v = tpk__nccl_mpi_progress(NULL);
        CHECK(v == -HUGE_VAL, "before any note: %g, expected -HUGE_VAL", v);
        if (np > 1) {
            MPI_Barrier(MPI_COMM_WORLD);
            if (me == 1) CHECK_OK(&ctx, tpk_busy(&ctx, 5));
            v = me == 1 ? tpk__nccl_mpi_progress(NULL) : hook_until(1);
            if (me != 1) CHECK(v > 3.5 && v <= 5, "rank 1 in a 5 s phase: %g s ahead", v);
            else CHECK(v == -HUGE_VAL, "rank 1 heard itself: %g", v);
            MPI_Barrier(MPI_COMM_WORLD);
            if (me == 1) CHECK_OK(&ctx, tpk_busy_end(&ctx));
            v = me == 1 ? tpk__nccl_mpi_progress(NULL) : hook_until(-1);
            if (me != 1) CHECK(v <= 0 && v > -1, "rank 1's phase ended: %g s ahead", v);
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }

    if (np > 1)
        TEST_CASE("MPI waits: a peer's phase or heartbeats hold a 0.3 s timeout; a phase's budget "
                  "bounds it") {
            CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &world, me == 0 ? 0.3 : 60));
            for (int beat = 0; beat < 2; beat++) { /* 0.8 s away: in a phase, then beating */
                MPI_Barrier(MPI_COMM_WORLD);
                if (me == 1 && !beat) CHECK_OK(&ctx, tpk_busy(&ctx, 5));
                if (me == 1) spin(0.8, beat);
                if (me == 1 && !beat) CHECK_OK(&ctx, tpk_busy_end(&ctx));
                double t = MPI_Wtime();
                CHECK_OK(&ctx, tpk_barrier(&ctx, &world));
                if (me == 0)
                    CHECK(MPI_Wtime() - t > 0.5, "%s: the barrier took %.2f s, expected 0.8",
                          beat ? "heartbeats" : "a phase", MPI_Wtime() - t);
            }
            /* a 0.4 s phase, then 2 s away without a note: rank 0 fails after 0.4 + 0.3 s */
            tpk_comm pair;
            CHECK_OK(&ctx, tpk_comm_mpi(&ctx, MPI_COMM_WORLD, &pair));
            CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, me == 0 ? 0.3 : 60));
            pair.flight.reported = true; /* its report is test_flight's */
            MPI_Barrier(MPI_COMM_WORLD);
            if (me == 1) {
                CHECK_OK(&ctx, tpk_busy(&ctx, 0.4));
                spin(2, false);
                CHECK_OK(&ctx, tpk_busy_end(&ctx));
            }
            double t = MPI_Wtime();
            if (me == 0) {
                CHECK_FAILS(&ctx, tpk_barrier(&ctx, &pair), TPK_ERR_COMM, "within 0.3 s");
                t = MPI_Wtime() - t;
                CHECK(t > 0.6 && t < 1.6, "failed after %.2f s, expected 0.7 (0.4 + 0.3)", t);
            } else {
                CHECK_OK(&ctx, tpk_barrier(&ctx, &pair)); /* rank 0's abandoned one completes */
            }
            MPI_Barrier(MPI_COMM_WORLD);
            tpk_comm_destroy(&pair);
            CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &world, 60));
        }

    TEST_CASE("the side channel kept beside an NCCL world: found, asked, answered, released") {
        static const tpk_comm_vtable fake_vt = {"nccl-stand-in", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        static int fake_impl;
        static tpk_comm fw;
        static tpk_ctx fake; /* a context on a stand-in for an NCCL world: a table of another
                                name (no call reaches it), impl an address */
        fw.vt = &fake_vt, fw.impl = &fake_impl, fw.rank = me, fw.size = np;
        fake.world = &fw, fake.tp.size = np, fake.dp.size = fake.pp.size = 1;
        fake.logger.func = test_catch_log, fake.logger.user_data = &lb;
        tpk__mpi_side_of *o = tpk__mpi_side_other();
        CHECK(tpk__mpi_side(&fake) == NULL, "a side channel before one was made");
        CHECK(tpk__mpi_side(&ctx) == (tpk__mpi *)world.impl, "the MPI world's own not found");
        CHECK_OK(&ctx, tpk_comm_mpi(&ctx, MPI_COMM_WORLD, &o->mpi));
        CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &o->mpi, 8));
        o->impl = &fake_impl;
        CHECK(tpk__mpi_side(&fake) == (tpk__mpi *)o->mpi.impl, "the kept side channel not found");
        if (np > 1) {
            uintptr_t keep = *tpk__flight_slot(); /* the NCCL world's context records */
            *tpk__flight_slot() = (uintptr_t)&fake;
            fw.flight.report = tpk__mpi_report;
            lb.n = 0;
            MPI_Barrier(MPI_COMM_WORLD);
            if (me == 0) { /* a failed all-reduce of the world, as comm_nccl.cu reports one */
                uint64_t id = tpk__flight_begin(&fw, TPK_COLL_ALLREDUCE, 8, TPK_F32, NULL, 0);
                tpk_flight_entry *e = tpk__flight_find(&fw, id);
                e->state = TPK_FLIGHT_FAILED, e->t1 = e->t0 + 1;
                tpk__flight_report(&fake, &fw, e, 1.0);
                CHECK(test_lines_with(&lb, "rank 0: world all-reduce #1 failed after 1.000 s",
                                      NULL) == 1,
                      "no line naming the failed collective (%d lines)", lb.n);
                for (int q = 1; q < np; q++) {
                    char who[160];
                    snprintf(who, sizeof who,
                             "rank 0: rank %d never reached world all-reduce #1: it has begun 0 "
                             "world collectives",
                             q);
                    CHECK(test_lines_with(&lb, who, NULL) == 1, "no line '%s'", who);
                    MPI_Send(&q, 1, MPI_INT, q, 77, MPI_COMM_WORLD);
                }
            } else { /* waiting on the GPU: the watchdog calls the hook, which answers */
                int got = 0, flag = 0;
                for (double t0 = MPI_Wtime(); !flag && MPI_Wtime() - t0 < 30;) {
                    tpk__nccl_mpi_progress(NULL);
                    MPI_Iprobe(0, 77, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
                }
                CHECK(flag, "rank 0 never finished its report");
                if (flag) MPI_Recv(&got, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                char asked[128];
                snprintf(asked, sizeof asked,
                         "rank %d: asked by rank 0, which failed in world all-reduce #1", me);
                CHECK(test_lines_with(&lb, asked, NULL) == 1, "no line '%s' (%d lines)", asked,
                      lb.n);
            }
            *tpk__flight_slot() = keep;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        tpk__nccl_mpi_release(o);
        CHECK(o->impl == NULL && o->mpi.vt == NULL && tpk__mpi_side(&fake) == NULL,
              "released, still found");
    }

    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return test_finish();
}
