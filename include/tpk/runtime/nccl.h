/* tpk/runtime/nccl.h — the NCCL communicator bootstrapped through MPI (compile with mpicc, link
 * build/libtpk_cuda.a $(CUDA_LIBS)).
 *
 * tpk_comm_nccl_mpi(): rank 0 of `comm` creates an ncclUniqueId, MPI_Bcast sends it (with rank
 * 0's status, so a failure there fails every rank instead of hanging them), and every rank
 * joins with tpk_comm_nccl (tpk/runtime/cuda.h) on its current device. Without MPI, distribute the
 * id yourself and call tpk_comm_nccl. NCCL wants one device per rank: select it first
 * (tpk_cuda_set_device).
 *
 * The MPI side also gives the NCCL watchdog what the MPI waits have (tpk/runtime/mpi.h):
 *   progress  the desc's hook (tpk__nccl_mpi_progress) reads the MPI heartbeat's notes
 *             (tpk_mpi_heartbeat_init; tpk_busy on the other ranks) and returns the time until
 *             which the peers are known to make progress: a collective's deadline is the timeout
 *             after the later of its start and that time (tpk__watch_deadline, tpk/runtime/coll.h),
 *             so a peer hashing, loading or saving a checkpoint under tpk_busy times no one out,
 *             and a stopped peer still ends the wait within the timeout of its last note (the
 *             budget plus the timeout inside a phase). The same hook answers the flight
 *             recorder's questions from the other ranks while this rank's host waits for the GPU.
 *   report    the communicator's flight.report is tpk__mpi_report: when the watchdog aborts a
 *             collective of the context's groups (a timeout, NCCL's asynchronous error) this rank
 *             prints its record and asks the ranks of the failed group over an MPI side channel
 *             where they are, naming those that never reached the collective, as on an MPI world.
 *             The side channel is an MPI communicator (tpk_comm_mpi over `comm`, with the NCCL
 *             timeout) kept beside the NCCL world (tpk__mpi_side_other) and freed with it (the
 *             desc's release hook); one NCCL world at a time has one (a second one made while
 *             the first is alive prints its record without asking).
 * Not yet run on a GPU (one GPU cannot hold two NCCL ranks; tests/test_watchdog.c checks the rule
 * and the hook on the host). */
#ifndef TPK_NCCL_H
#define TPK_NCCL_H

#include "cuda.h"
#include "../base/ctx.h"


/* Without <mpi.h> on the include path (a plain C compiler) the header is empty beyond
 * tpk/runtime/cuda.h. */
#if defined(MPI_VERSION) || !defined(__has_include) || __has_include(<mpi.h>)
#include "mpi.h" /* tpk/runtime/mpi.h: <mpi.h> without its C++ bindings */

/* The NCCL watchdog's progress hook (tpk_nccl_desc.progress): the flight recorder's questions
 * answered (the recording context's world's side channel, tpk__mpi_serve), the heartbeat's notes
 * read, and the time until which the other ranks are known to make progress, in seconds from now
 * (-HUGE_VAL: nothing heard, or no heartbeat). */
static inline double tpk__nccl_mpi_progress(void *user) {
    (void)user;
    tpk__mpi_serve(tpk__flight_ctx());
    tpk__mpi_hb_poll();
    double alive = tpk__mpi_hb_alive();
    return alive > -HUGE_VAL ? alive - MPI_Wtime() : -HUGE_VAL;
}
/* Its release hook: the side channel (a tpk__mpi_side_of) freed with the NCCL world. */
static inline void tpk__nccl_mpi_release(void *user) {
    tpk__mpi_side_of *o = (tpk__mpi_side_of *)user;
    o->impl = NULL;
    tpk_comm_destroy(&o->mpi);
}

/* The NCCL communicator of comm's ranks (collective over comm; desc may be NULL, its progress,
 * release and user must be NULL: this function installs its own, above). */
static inline tpk_status tpk_comm_nccl_mpi(tpk_ctx *ctx, MPI_Comm comm, const tpk_nccl_desc *desc,
                                           tpk_comm *out) {
    static const char *fn = "tpk_comm_nccl_mpi";
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    if (desc && (desc->progress || desc->release || desc->user))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->%s: expected NULL (the MPI heartbeat's hooks are installed here; "
                         "tpk_comm_nccl takes hooks of your own)",
                         desc->progress  ? "progress"
                         : desc->release ? "release"
                                         : "user");
    if (desc && !(desc->timeout_s >= 0 && desc->timeout_s <= 1e9))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->timeout_s: expected seconds in [0, 1e9] (0: 600), got %g",
                         desc->timeout_s);
    int init = 0, rank = 0, size = 0;
    MPI_Initialized(&init);
    if (!init)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "MPI is not initialised: call MPI_Init first");
    if (comm == MPI_COMM_NULL) return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: MPI_COMM_NULL");
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    struct {
        int status;
        tpk_nccl_id id;
    } msg;
    memset(&msg, 0, sizeof msg);
    if (rank == 0) msg.status = (int)tpk_nccl_unique_id(ctx, &msg.id);
    int rc = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, comm);
    if (rc != MPI_SUCCESS)
        return tpk__fail(ctx, TPK_ERR_COMM, fn, "MPI_Bcast of the NCCL id failed (MPI error %d)",
                         rc);
    if (msg.status != TPK_OK) {
        if (rank != 0)
            tpk__fail(ctx, (tpk_status)msg.status, fn, "rank 0 could not create an NCCL id");
        return (tpk_status)msg.status;
    }
    tpk_nccl_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    d.progress = tpk__nccl_mpi_progress;
    tpk__mpi_side_of *o = tpk__mpi_side_other();
    bool side = !o->impl && !o->mpi.vt; /* the side channel: one NCCL world at a time */
    if (side) {
        TPK_TRY(tpk_comm_mpi(ctx, comm, &o->mpi));
        tpk_status s = tpk_comm_mpi_set_timeout(ctx, &o->mpi, d.timeout_s > 0 ? d.timeout_s : 600);
        if (s != TPK_OK) return tpk_comm_destroy(&o->mpi), s;
        d.release = tpk__nccl_mpi_release, d.user = o;
    }
    tpk_status s = tpk_comm_nccl(ctx, &msg.id, size, rank, &d, out);
    if (s != TPK_OK) {
        if (side) tpk_comm_destroy(&o->mpi);
        return s;
    }
    if (side) o->impl = out->impl;
    out->flight.report = tpk__mpi_report; /* without the side channel: this rank's record */
    return TPK_OK;
}

#endif /* <mpi.h> */
#endif /* TPK_NCCL_H */
