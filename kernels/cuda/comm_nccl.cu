/* kernels/cuda/comm_nccl.cu — the NCCL communicator: a tpk_comm on device buffers.
 *
 * Every collective runs on the communicator's own stream, ordered by events:
 *   start:  record `ready` on the compute stream; the comm stream waits for it; the NCCL call;
 *           record the request's `done` on the comm stream
 *   wait:   the compute stream waits for `done` (kernels issued later see the result) and the
 *           host goes on: the collective joins the communicator's list of pending ones. So
 *           collectives overlap with compute, and a training step does not stop the host at each
 *           one. Failures are caught by a watchdog that runs at every wait and at every host
 *           synchronisation of the CUDA backend (tpk__cuda_event_wait polls and calls the wait
 *           hook this file registers while communicators are alive): finished collectives leave the
 *           list; NCCL's asynchronous error, or a collective unfinished past its deadline,
 *           aborts the communicator (ncclCommAbort) and that wait or synchronisation returns
 *           TPK_ERR_COMM — a bounded failure, never a hang. tpk_nccl_desc.blocking_wait: the host
 *           waits at each tpk_wait instead (polling the same way); no_poll: no watchdog for this
 *           communicator.
 * The deadline measures progress: timeout_s after the later of the collective's start and the
 * time until which the peers are known to make progress (tpk__watch_deadline, tpk/runtime/coll.h,
 * the MPI waits' rule), which the desc's progress hook reports (tpk/runtime/nccl.h: the MPI
 * heartbeat's notes, tpk_busy), asked at most once a millisecond per communicator. A failure is
 * reported through the flight recorder when the communicator is one of the waiting context's
 * groups (world, TP, DP, PP, CP, EP): its pending collectives marked failed in the record, the
 * oldest named to tpk__flight_report (the world's report hook: nccl.h's asks the other ranks over
 * MPI where they are; else this rank's record printed), once per communicator.
 * Uneven all-gathers / reduce-scatters are grouped broadcasts / reduces, one per rank (NCCL has
 * no v-collectives); even ones call ncclAllGather / ncclReduceScatter. bf16 reduces in NCCL's
 * bf16 arithmetic. Barrier is a one-element all-reduce. Split is ncclCommSplit. A point-to-point
 * batch is one group of ncclSend / ncclRecv, and so is the all-to-all with per-peer counts (a send
 * and a receive per peer with a non-zero count; the rank's own block copied on the comm stream).
 * A communicator of one rank (the TP group at t = 1) calls no NCCL: each collective is a copy on
 * the compute stream, with nothing for the host to wait for. */
#include <chrono>
#include <mutex>
#include <thread>

#include "common.cuh"

typedef std::chrono::steady_clock tpk__clock;

#ifndef TPK_NO_NCCL
#include <nccl.h>

#include <tpk/runtime/coll.h> /* the flight recorder, the watchdog's deadline */

enum { NCCL_PENDING = 256 }; /* collectives waited for but maybe unfinished, per communicator */

struct nccl_pending {
    cudaEvent_t done;
    tpk__clock::time_point t0; /* when the collective was started */
    uint64_t flight;           /* its operation number in the communicator's flight recorder */
};
struct nccl_impl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready;
    float *one; /* device scratch for the barrier */
    double timeout_s;
    bool no_poll, blocking, aborted;
    nccl_pending pend[NCCL_PENDING]; /* a ring: the oldest at head */
    int head, npend;
    nccl_impl *next; /* the live communicators (the watchdog's list) */
    double (*progress)(void *user); /* tpk_nccl_desc's hooks */
    void (*release)(void *user);
    void *user;
    double alive, asked; /* the peers known to make progress until `alive` (the steady clock's
                            seconds; -HUGE_VAL: nothing heard), as `progress` said at `asked` */
};
typedef nccl_pending nccl_req; /* a started collective, until its wait */

static std::mutex g_live_mu;
static nccl_impl *g_live;

static tpk_status nccl_fail(tpk_ctx *ctx, const char *fn, const char *what, ncclResult_t r) {
    return tpk__fail(ctx, TPK_ERR_COMM, fn, "%s: %s", what, ncclGetErrorString(r));
}
#define NCCL_TRY(ctx, fn, call)                                                                    \
    do {                                                                                           \
        ncclResult_t nccl__r = (call);                                                             \
        if (nccl__r != ncclSuccess) return nccl_fail(ctx, fn, #call, nccl__r);                     \
    } while (0)

static ncclDataType_t nccl_type(tpk_dtype dt) {
    return dt == TPK_F32    ? ncclFloat32
           : dt == TPK_BF16 ? ncclBfloat16
           : dt == TPK_F64  ? ncclFloat64
                            : ncclInt32;
}
static ncclRedOp_t nccl_op(tpk_redop op) { return op == TPK_MAX ? ncclMax : ncclSum; }

/* Order the comm stream after the compute stream. */
static tpk_status nccl_begin(tpk_ctx *ctx, const char *fn, nccl_impl *m) {
    if (m->aborted)
        return tpk__fail(ctx, TPK_ERR_COMM, fn,
                         "the communicator was aborted after an earlier failure");
    TPK__CUDA_STATE(st, ctx, fn);
    TPK__CUDA_TRY(ctx, fn, cudaEventRecord(m->ready, st->stream));
    TPK__CUDA_TRY(ctx, fn, cudaStreamWaitEvent(m->stream, m->ready, 0));
    return TPK_OK;
}

static double nccl_secs(tpk__clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
}

/* The context's group whose communicator is m (the world, TP, DP, PP, CP, EP), or NULL. */
static tpk_comm *nccl_group(tpk_ctx *ctx, const nccl_impl *m) {
    if (!ctx) return NULL;
    tpk_comm *cs[6] = {ctx->world, &ctx->tp, &ctx->dp, &ctx->pp, &ctx->cp, &ctx->ep};
    for (tpk_comm *c : cs)
        if (c && c->impl == m) return c;
    return NULL;
}

/* Abort the communicator (its handle is freed; every later call fails), fail with `why`, and
 * report it through the flight recorder (once per communicator): when m is one of ctx's groups,
 * its pending collectives (and `late`, the one that timed out) are marked failed in the group's
 * record and the oldest of them named to tpk__flight_report (the world's report hook, else this
 * rank's record printed). A communicator of the program's own is reported by coll.h when the
 * failure reaches one of its calls. */
static tpk_status nccl_abort(tpk_ctx *ctx, const char *fn, nccl_impl *m, const char *why,
                             const nccl_pending *late) {
    ncclCommAbort(m->comm);
    m->aborted = true;
    tpk_status s = tpk__fail(
        ctx, TPK_ERR_COMM, fn,
        "%s: communicator aborted (a rank stopped taking part, or the network failed)", why);
    tpk_comm *c = nccl_group(ctx, m);
    const nccl_pending *named = late ? late : m->npend ? &m->pend[m->head] : NULL;
    tpk_flight_entry *e = c && named ? tpk__flight_find(c, named->flight) : NULL;
    double waited = named ? nccl_secs(tpk__clock::now()) - nccl_secs(named->t0) : 0,
           now = tpk__flight_now();
    for (; m->npend; m->head = (m->head + 1) % NCCL_PENDING, m->npend--) {
        tpk_flight_entry *p = c ? tpk__flight_find(c, m->pend[m->head].flight) : NULL;
        if (p) p->state = TPK_FLIGHT_FAILED, p->t1 = now;
        cudaEventDestroy(m->pend[m->head].done);
    }
    if (e) e->state = TPK_FLIGHT_FAILED, e->t1 = now;
    if (c && !c->flight.reported) {
        c->flight.reported = true;
        tpk__flight_report(ctx, c, e, waited);
    }
    return s;
}
static tpk_status nccl_async_error(tpk_ctx *ctx, const char *fn, nccl_impl *m,
                                   const nccl_pending *waited) {
    ncclResult_t async = ncclSuccess, q = ncclCommGetAsyncError(m->comm, &async);
    if (q == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) return TPK_OK;
    char why[160];
    snprintf(why, sizeof why, "asynchronous NCCL error: %s",
             ncclGetErrorString(q != ncclSuccess ? q : async));
    return nccl_abort(ctx, fn, m, why, waited);
}
/* The peers' progress (tpk_nccl_desc.progress) into m->alive, at most once a millisecond. */
static void nccl_progress(nccl_impl *m, double now) {
    if (!m->progress || now - m->asked < 1e-3) return;
    m->asked = now;
    double ahead = m->progress(m->user);
    m->alive = ahead > -HUGE_VAL ? now + ahead : -HUGE_VAL; /* NaN: nothing heard */
}
/* Collective p past its deadline (tpk__watch_deadline: timeout_s after the later of its start and
 * the peers' last sign of progress) aborts the communicator. */
static tpk_status nccl_timed_out(tpk_ctx *ctx, const char *fn, nccl_impl *m,
                                 const nccl_pending *p) {
    double now = nccl_secs(tpk__clock::now()), t0 = nccl_secs(p->t0);
    nccl_progress(m, now);
    if (now < tpk__watch_deadline(t0, m->alive, m->timeout_s)) return TPK_OK;
    char why[224];
    int k = snprintf(why, sizeof why, "a collective not finished %.1f s after it started",
                     now - t0);
    if (m->progress && k > 0 && (size_t)k < sizeof why)
        snprintf(why + k, sizeof why - (size_t)k, ", %.1f s without a note from a peer",
                 now - (m->alive > t0 ? m->alive : t0));
    k = (int)strlen(why);
    snprintf(why + k, sizeof why - (size_t)k, " (timeout %.1f s)", m->timeout_s);
    return nccl_abort(ctx, fn, m, why, p);
}

/* The host waits for collective r, polling NCCL's error and the deadline. */
static tpk_status nccl_poll(tpk_ctx *ctx, const char *fn, nccl_impl *m, const nccl_pending *r) {
    for (int spins = 0;; spins++) {
        cudaError_t e = tpk__event_query(r->done);
        if (e == cudaSuccess) return TPK_OK;
        if (e != cudaErrorNotReady) return tpk__cuda_err(ctx, fn, "cudaEventQuery", e);
        TPK_TRY(nccl_async_error(ctx, fn, m, r));
        TPK_TRY(nccl_timed_out(ctx, fn, m, r));
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

/* The watchdog's look at one communicator: finished collectives released (oldest first), NCCL's
 * asynchronous error, the oldest unfinished collective's deadline; the peers' progress asked even
 * with nothing pending (the hook answers the flight recorder's questions meanwhile). */
static tpk_status nccl_check(tpk_ctx *ctx, const char *fn, nccl_impl *m) {
    if (m->aborted || m->no_poll) return TPK_OK;
    while (m->npend && tpk__event_query(m->pend[m->head].done) == cudaSuccess) {
        cudaEventDestroy(m->pend[m->head].done);
        m->head = (m->head + 1) % NCCL_PENDING, m->npend--;
    }
    TPK_TRY(nccl_async_error(ctx, fn, m, NULL));
    if (!m->npend) {
        nccl_progress(m, nccl_secs(tpk__clock::now()));
        return TPK_OK;
    }
    return nccl_timed_out(ctx, fn, m, &m->pend[m->head]);
}

/* The watchdog over every live communicator: the CUDA backend's wait hook while any is alive
 * (registered and cleared with the list, under g_live_mu). */
static tpk_status nccl_watch(tpk_ctx *ctx, const char *fn) {
    std::lock_guard<std::mutex> lock(g_live_mu);
    for (nccl_impl *m = g_live; m; m = m->next) TPK_TRY(nccl_check(ctx, fn, m));
    return TPK_OK;
}

/* Wait for a request: order the compute stream after it; then either the host waits (blocking:
 * polling) or the collective joins the pending list (when the list is full, the host first waits
 * for its oldest). Once the communicator was aborted (by this wait or an earlier one) its handle
 * is freed: a request still outstanding then fails without calling into NCCL. */
static tpk_status nccl_finish(tpk_ctx *ctx, const char *fn, nccl_impl *m, nccl_req *r) {
    tpk_status s = TPK_OK;
    if (m->aborted)
        s = tpk__fail(ctx, TPK_ERR_COMM, fn,
                      "the communicator was aborted after an earlier failure");
    tpk__cuda_state *st = s == TPK_OK ? tpk__cuda_get(ctx, fn) : NULL;
    if (s == TPK_OK && !st) s = TPK_ERR_BACKEND;
    cudaError_t e = s == TPK_OK ? cudaStreamWaitEvent(st->stream, r->done, 0) : cudaSuccess;
    if (e != cudaSuccess) s = tpk__cuda_err(ctx, fn, "cudaStreamWaitEvent", e);
    if (s == TPK_OK && m->blocking && !m->no_poll) s = nccl_poll(ctx, fn, m, r);
    if (s != TPK_OK || m->blocking || m->no_poll) {
        cudaEventDestroy(r->done);
        free(r);
        return s;
    }
    std::lock_guard<std::mutex> lock(g_live_mu); /* the watchdog reads the list */
    if (m->npend == NCCL_PENDING) { /* full: the oldest must finish first */
        nccl_pending *o = &m->pend[m->head];
        s = nccl_poll(ctx, fn, m, o);
        if (s == TPK_OK)
            cudaEventDestroy(o->done), m->head = (m->head + 1) % NCCL_PENDING, m->npend--;
    }
    if (s == TPK_OK) {
        m->pend[(m->head + m->npend) % NCCL_PENDING] = *r;
        m->npend++;
    } else {
        cudaEventDestroy(r->done);
    }
    free(r);
    return s == TPK_OK ? nccl_check(ctx, fn, m) : s;
}

/* After the NCCL call(s) of c: record `done`, then hand the request over or finish it. The
 * operation is the one coll.h's wrapper recorded just before calling the table (c->flight.ops). */
static tpk_status nccl_end(tpk_ctx *ctx, const char *fn, tpk_comm *c, ncclResult_t rc,
                           tpk_request *req) {
    nccl_impl *m = (nccl_impl *)c->impl;
    if (rc != ncclSuccess) return nccl_fail(ctx, fn, "NCCL call", rc);
    nccl_req *r = (nccl_req *)calloc(1, sizeof *r);
    if (!r) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for a request");
    r->t0 = tpk__clock::now(), r->flight = c->flight.ops;
    cudaError_t e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
    bool made = e == cudaSuccess;
    if (made) e = cudaEventRecord(r->done, m->stream);
    if (e != cudaSuccess) {
        if (made) cudaEventDestroy(r->done);
        free(r);
        return tpk__cuda_err(ctx, fn, "cudaEventRecord", e);
    }
    if (req) {
        req->state = r;
        return TPK_OK;
    }
    return nccl_finish(ctx, fn, m, r);
}

/* One rank: dst = src on the compute stream; no request to wait for. */
static tpk_status nccl_one(tpk_ctx *ctx, const char *fn, nccl_impl *m, void *dst, const void *src,
                           size_t bytes, tpk_request *req) {
    if (m->aborted)
        return tpk__fail(ctx, TPK_ERR_COMM, fn,
                         "the communicator was aborted after an earlier failure");
    if (req) req->state = NULL;
    if (!bytes || dst == src) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    TPK__CUDA_TRY(ctx, fn, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream));
    return TPK_OK;
}

static tpk_status nccl_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                 size_t count, tpk_dtype dt, tpk_redop op, tpk_request *req) {
    static const char *fn = "tpk_allreduce (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    if (c->size == 1) return nccl_one(ctx, fn, m, recv, send, count * tpk_dtype_size(dt), req);
    TPK_TRY(nccl_begin(ctx, fn, m));
    return nccl_end(
        ctx, fn, c,
        ncclAllReduce(send, recv, count, nccl_type(dt), nccl_op(op), m->comm, m->stream), req);
}

static tpk_status nccl_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                  const size_t *counts, tpk_dtype dt, tpk_request *req) {
    static const char *fn = "tpk_allgatherv (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    if (c->size == 1) return nccl_one(ctx, fn, m, recv, send, counts[0] * tpk_dtype_size(dt), req);
    TPK_TRY(nccl_begin(ctx, fn, m));
    bool even = true;
    for (int q = 1; q < c->size; q++) even = even && counts[q] == counts[0];
    ncclResult_t rc;
    if (even) {
        rc = ncclAllGather(send, recv, counts[0], nccl_type(dt), m->comm, m->stream);
    } else {
        size_t es = tpk_dtype_size(dt), off = 0;
        rc = ncclGroupStart();
        for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
            rc = ncclBroadcast(q == c->rank ? send : NULL, (char *)recv + off * es, counts[q],
                               nccl_type(dt), q, m->comm, m->stream);
            off += counts[q];
        }
        ncclResult_t g = ncclGroupEnd();
        if (rc == ncclSuccess) rc = g;
    }
    return nccl_end(ctx, fn, c, rc, req);
}

static tpk_status nccl_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                       const size_t *counts, tpk_dtype dt, tpk_redop op,
                                       tpk_request *req) {
    static const char *fn = "tpk_reduce_scatterv (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    if (c->size == 1) return nccl_one(ctx, fn, m, recv, send, counts[0] * tpk_dtype_size(dt), req);
    TPK_TRY(nccl_begin(ctx, fn, m));
    bool even = true;
    for (int q = 1; q < c->size; q++) even = even && counts[q] == counts[0];
    ncclResult_t rc;
    if (even) {
        rc = ncclReduceScatter(send, recv, counts[0], nccl_type(dt), nccl_op(op), m->comm,
                               m->stream);
    } else {
        size_t es = tpk_dtype_size(dt), off = 0;
        rc = ncclGroupStart();
        for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
            rc = ncclReduce((const char *)send + off * es, q == c->rank ? recv : NULL, counts[q],
                            nccl_type(dt), nccl_op(op), q, m->comm, m->stream);
            off += counts[q];
        }
        ncclResult_t g = ncclGroupEnd();
        if (rc == ncclSuccess) rc = g;
    }
    return nccl_end(ctx, fn, c, rc, req);
}

static tpk_status nccl_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt,
                             int root, tpk_request *req) {
    static const char *fn = "tpk_bcast (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    if (c->size == 1) return nccl_one(ctx, fn, m, buf, buf, 0, req);
    TPK_TRY(nccl_begin(ctx, fn, m));
    return nccl_end(ctx, fn, c,
                    ncclBroadcast(buf, buf, count, nccl_type(dt), root, m->comm, m->stream), req);
}

static tpk_status nccl_barrier(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    static const char *fn = "tpk_barrier (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    if (c->size == 1) return nccl_one(ctx, fn, m, NULL, NULL, 0, req);
    TPK_TRY(nccl_begin(ctx, fn, m));
    return nccl_end(ctx, fn, c,
                    ncclAllReduce(m->one, m->one, 1, ncclFloat32, ncclSum, m->comm, m->stream),
                    req);
}

/* A point-to-point batch: one NCCL group of ncclSend / ncclRecv (no tags in NCCL: between two
 * ranks the parts match in the order posted). */
static tpk_status nccl_p2p(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n, tpk_request *req) {
    static const char *fn = "tpk_p2p (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    TPK_TRY(nccl_begin(ctx, fn, m));
    ncclResult_t rc = ncclGroupStart();
    for (int i = 0; i < n && rc == ncclSuccess; i++)
        rc = ops[i].send ? ncclSend(ops[i].buf, ops[i].count, nccl_type(ops[i].dtype), ops[i].peer,
                                    m->comm, m->stream)
                         : ncclRecv(ops[i].buf, ops[i].count, nccl_type(ops[i].dtype), ops[i].peer,
                                    m->comm, m->stream);
    ncclResult_t g = ncclGroupEnd();
    if (rc == ncclSuccess) rc = g;
    return nccl_end(ctx, fn, c, rc, req);
}

/* The all-to-all with per-peer counts: one NCCL group of an ncclSend and an ncclRecv per peer with
 * a non-zero count (the blocks packed: offsets the counts' prefix sums); this rank's own block a
 * copy on the comm stream inside the same ordering. */
static tpk_status nccl_alltoallv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                 const size_t *sendcounts, void *recv, const size_t *recvcounts,
                                 tpk_dtype dt, tpk_request *req) {
    static const char *fn = "tpk_alltoallv (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    size_t es = tpk_dtype_size(dt), so = 0, ro = 0;
    if (c->size == 1) return nccl_one(ctx, fn, m, recv, send, sendcounts[0] * es, req);
    TPK_TRY(nccl_begin(ctx, fn, m));
    for (int q = 0; q < c->rank; q++) so += sendcounts[q], ro += recvcounts[q];
    if (sendcounts[c->rank]) /* the own block, first on the comm stream */
        TPK__CUDA_TRY(ctx, fn,
                      cudaMemcpyAsync((char *)recv + ro * es, (const char *)send + so * es,
                                      sendcounts[c->rank] * es, cudaMemcpyDeviceToDevice,
                                      m->stream));
    so = ro = 0;
    ncclResult_t rc = ncclGroupStart();
    for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
        if (q != c->rank && sendcounts[q])
            rc = ncclSend((const char *)send + so * es, sendcounts[q], nccl_type(dt), q, m->comm,
                          m->stream);
        if (rc == ncclSuccess && q != c->rank && recvcounts[q])
            rc = ncclRecv((char *)recv + ro * es, recvcounts[q], nccl_type(dt), q, m->comm,
                          m->stream);
        so += sendcounts[q], ro += recvcounts[q];
    }
    ncclResult_t g = ncclGroupEnd();
    if (rc == ncclSuccess) rc = g;
    return nccl_end(ctx, fn, c, rc, req);
}

static tpk_status nccl_wait(tpk_ctx *ctx, tpk_request *req) {
    nccl_req *r = (nccl_req *)req->state;
    if (!r) return TPK_OK;
    return nccl_finish(ctx, "tpk_wait (nccl)", (nccl_impl *)req->comm->impl, r);
}

static void nccl_destroy(tpk_comm *c) {
    nccl_impl *m = (nccl_impl *)c->impl;
    if (!m) return;
    {
        std::lock_guard<std::mutex> lock(g_live_mu); /* off the watchdog's list */
        for (nccl_impl **p = &g_live; *p; p = &(*p)->next)
            if (*p == m) {
                *p = m->next;
                break;
            }
        if (!g_live) tpk__cuda_set_wait_hook(NULL);
    }
    if (!m->aborted) {
        cudaStreamSynchronize(m->stream);
        ncclCommDestroy(m->comm);
    }
    for (; m->npend; m->head = (m->head + 1) % NCCL_PENDING, m->npend--)
        cudaEventDestroy(m->pend[m->head].done);
    cudaEventDestroy(m->ready);
    cudaStreamDestroy(m->stream);
    cudaFree(m->one);
    void (*release)(void *) = m->release;
    void *user = m->user;
    free(m);
    c->impl = NULL;
    if (release) release(user);
}

static tpk_status nccl_wrap(tpk_ctx *ctx, const char *fn, ncclComm_t comm,
                            const tpk_nccl_desc *d, tpk_comm *out);

static tpk_status nccl_split(tpk_ctx *ctx, tpk_comm *c, int color, int key, tpk_comm *out) {
    static const char *fn = "tpk_comm_split (nccl)";
    nccl_impl *m = (nccl_impl *)c->impl;
    if (m->aborted)
        return tpk__fail(ctx, TPK_ERR_COMM, fn,
                         "the communicator was aborted after an earlier failure");
    ncclComm_t sub = NULL;
    NCCL_TRY(ctx, fn, ncclCommSplit(m->comm, color, key, &sub, NULL));
    tpk_nccl_desc d = {}; /* the parent's settings and progress hook; its release stays its own */
    d.timeout_s = m->timeout_s, d.no_poll = m->no_poll, d.blocking_wait = m->blocking;
    d.progress = m->progress, d.user = m->user;
    return nccl_wrap(ctx, fn, sub, &d, out);
}

static const tpk_comm_vtable *nccl_vtable(void) {
    static const tpk_comm_vtable vt = {"nccl", TPK__COMM_TABLE(nccl_), nccl_destroy,
                                       nccl_p2p, nccl_alltoallv};
    return &vt;
}

/* Take ownership of `comm` and fill `out` (d: the settings and hooks). */
static tpk_status nccl_wrap(tpk_ctx *ctx, const char *fn, ncclComm_t comm,
                            const tpk_nccl_desc *d, tpk_comm *out) {
    memset(out, 0, sizeof *out);
    nccl_impl *m = (nccl_impl *)calloc(1, sizeof *m);
    if (!m) {
        ncclCommDestroy(comm);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    m->comm = comm, m->timeout_s = d->timeout_s > 0 ? d->timeout_s : 600.0,
    m->no_poll = d->no_poll, m->blocking = d->blocking_wait;
    m->progress = d->progress, m->release = d->release, m->user = d->user;
    m->alive = m->asked = -HUGE_VAL;
    cudaError_t e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc(&m->one, sizeof(float));
    /* on the communicator's stream: a legacy-stream memset is not ordered with a non-blocking
     * stream */
    if (e == cudaSuccess) e = cudaMemsetAsync(m->one, 0, sizeof(float), m->stream);
    if (e != cudaSuccess) {
        ncclCommDestroy(comm);
        if (m->one) cudaFree(m->one);
        if (m->ready) cudaEventDestroy(m->ready);
        if (m->stream) cudaStreamDestroy(m->stream);
        free(m);
        return tpk__cuda_err(ctx, fn, "stream, event or scratch of the communicator", e);
    }
    int rank = 0, size = 0;
    ncclResult_t q = ncclCommUserRank(comm, &rank);
    if (q == ncclSuccess) q = ncclCommCount(comm, &size);
    if (q != ncclSuccess) {
        ncclCommDestroy(comm);
        cudaFree(m->one), cudaEventDestroy(m->ready), cudaStreamDestroy(m->stream);
        free(m);
        return nccl_fail(ctx, fn, "ncclCommUserRank / ncclCommCount", q);
    }
    out->vt = nccl_vtable(), out->impl = m, out->rank = rank, out->size = size, out->device = true;
    std::lock_guard<std::mutex> lock(g_live_mu); /* on the watchdog's list */
    m->next = g_live, g_live = m;
    tpk__cuda_set_wait_hook(nccl_watch);
    return TPK_OK;
}

static_assert(sizeof(tpk_nccl_id) == sizeof(ncclUniqueId), "tpk_nccl_id must hold an ncclUniqueId");

extern "C" tpk_status tpk_nccl_unique_id(tpk_ctx *ctx, tpk_nccl_id *id) {
    static const char *fn = "tpk_nccl_unique_id";
    if (!id) return tpk__fail(ctx, TPK_ERR_ARG, fn, "id: expected a pointer, got NULL");
    ncclUniqueId u;
    NCCL_TRY(ctx, fn, ncclGetUniqueId(&u));
    memcpy(id->bytes, &u, sizeof u);
    return TPK_OK;
}

extern "C" tpk_status tpk_comm_nccl(tpk_ctx *ctx, const tpk_nccl_id *id, int nranks, int rank,
                                    const tpk_nccl_desc *desc, tpk_comm *out) {
    static const char *fn = "tpk_comm_nccl";
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: expected a pointer, got NULL");
    if (!id) return tpk__fail(ctx, TPK_ERR_ARG, fn, "id: expected a unique id, got NULL");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "rank: expected 0 <= rank < nranks (nranks >= 1), got rank %d of %d", rank,
                         nranks);
    if (desc && !(desc->timeout_s >= 0 && desc->timeout_s <= 1e9))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->timeout_s: expected seconds in [0, 1e9] (0: 600), got %g",
                         desc->timeout_s);
    TPK__CUDA_STATE(st, ctx, fn); /* the compute stream's device is the communicator's */
    (void)st;
    ncclUniqueId u;
    memcpy(&u, id->bytes, sizeof u);
    ncclComm_t comm = NULL;
    NCCL_TRY(ctx, fn, ncclCommInitRank(&comm, nranks, u, rank));
    tpk_nccl_desc d = {};
    if (desc) d = *desc;
    return nccl_wrap(ctx, fn, comm, &d, out);
}

#else /* a build without NCCL */


extern "C" tpk_status tpk_nccl_unique_id(tpk_ctx *ctx, tpk_nccl_id *id) {
    (void)id;
    return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, "tpk_nccl_unique_id",
                     "this build of tpk has no NCCL (nccl.h was not found)");
}
extern "C" tpk_status tpk_comm_nccl(tpk_ctx *ctx, const tpk_nccl_id *id, int nranks, int rank,
                                    const tpk_nccl_desc *desc, tpk_comm *out) {
    (void)id, (void)nranks, (void)rank, (void)desc, (void)out;
    return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, "tpk_comm_nccl",
                     "this build of tpk has no NCCL (nccl.h was not found)");
}

#endif
