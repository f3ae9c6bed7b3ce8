/* tpk/runtime/mpi.h — the MPI communicator on host buffers (compile with mpicc).
 *
 * tpk_comm_mpi() wraps a duplicate of an MPI communicator with errors returned, not fatal.
 * Collectives map one to one: MPI_Iallreduce, MPI_Iallgatherv, MPI_Ireduce_scatter,
 * MPI_Ibcast, MPI_Ibarrier, and point-to-point batches as MPI_Isend / MPI_Irecv (tags as given);
 * the blocking forms start and wait. bf16 travels as 16-bit words
 * and is reduced by user operations that add (or take the max) in f32 and round to nearest
 * even. The count and displacement arrays of a v-collective live in the request until
 * tpk_wait, as MPI requires.
 *
 * Device buffers: when the context's backend keeps buffers in device memory (ctx->ops->device),
 * each collective stages through host memory with ctx->ops->memcpy: the send data is copied to a
 * host buffer before the MPI call, and the result copied back to the device buffer when the
 * collective finishes (at once, or in tpk_wait). So several ranks can share one GPU. With a
 * CUDA-aware MPI (Open MPI's MPIX_Query_cuda_support) device buffers go to MPI directly, except
 * for bf16 reductions, whose user operations read the data on the host; TPK_MPI_STAGE=1 in the
 * environment forces staging. A split that leaves one rank gives the `self` communicator
 * (tpk/runtime/comm_self.h: collectives are copies on the backend), as the NCCL one does.
 *
 * Timeout (a watchdog, as NCCL's): every wait for a collective (the blocking forms, tpk_wait)
 * polls MPI_Test — busily for its first TPK__MPI_SPIN_S seconds, then sleeping 10 us doubling to
 * 1 ms between polls — until the collective finishes or it has waited timeout_s seconds (a gap
 * between two polls counts at most 1 s, so a rank that was itself stopped, on resuming, does not
 * blame its peers at once). Then it returns TPK_ERR_COMM, "no answer from a peer within S s"
 * naming the collective and the group
 * (TP, DP, world; its size): a rank is stopped, dead or far slower. The collective cannot be
 * cancelled (MPI forbids it for collectives), so its buffers are left to MPI and the communicator
 * is unusable afterwards: every later collective on it fails at once. The caller cannot agree
 * with a stopped peer either: end the job (MPI_Abort), as the trainer does. The timeout is
 * TPK_TIMEOUT seconds from the environment when set, else TPK_MPI_TIMEOUT_DEFAULT (600 s);
 * tpk_comm_mpi_set_timeout changes it (0: wait for ever, MPI_Wait); splits inherit it. */
#ifndef TPK_MPI_H
#define TPK_MPI_H

/* the C API only: no MPI C++ bindings when included from C++ */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include "comm_self.h"
#include "op.h"

#include <time.h>
#if !defined(__cplusplus) && !defined(_POSIX_C_SOURCE)
/* POSIX; strict C11's <time.h> hides it */
int nanosleep(const struct timespec *req, struct timespec *rem);
#endif

#ifndef TPK_MPI_TIMEOUT_DEFAULT
#define TPK_MPI_TIMEOUT_DEFAULT 600.0 /* seconds: a generous NCCL watchdog's */
#endif
#define TPK__MPI_SPIN_S 1e-3          /* the busy phase of a wait, seconds */

typedef struct tpk__mpi {
    MPI_Comm comm;
    MPI_Op bf16_sum, bf16_max;
    double timeout_s; /* 0: none */
    bool broken;      /* a collective timed out: the communicator is unusable */
    struct tpk__mpi_req *abandoned; /* the collectives that timed out, still MPI's (a list) */
    tpk_allocator al; /* this state's allocator: the creating context's (tpk_comm_mpi, split) */
} tpk__mpi;

typedef struct tpk__mpi_req {
    MPI_Request req;
    struct tpk__mpi_req *next; /* in tpk__mpi.abandoned */
    struct tpk__mpi_req *more; /* the next part of a point-to-point batch (tpk__mpi_p2p) */
    int *counts, *displs; /* [size] each, for v-collectives */
    void *hsend, *hrecv;  /* host staging of device buffers (NULL when not staged) */
    void *drecv;          /* the device buffer the result goes back to */
    size_t recv_bytes;
    tpk_allocator al; /* the request's allocator: the context that started it */
} tpk__mpi_req;

/* Whether a collective on this context's buffers goes through host staging buffers. */
static inline bool tpk__mpi_stage(const tpk_ctx *ctx, tpk_dtype dt, bool reduction) {
    if (!ctx || !ctx->ops || !ctx->ops->device) return false;
    if (reduction && dt == TPK_BF16) return true; /* user ops run on the host */
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    if (MPIX_Query_cuda_support() == 1 && !getenv("TPK_MPI_STAGE")) return false;
#endif
    return true;
}
/* Host staging: `send_bytes` of device data at `send` copied into r->hsend, r->hrecv allocated
 * for `recv_bytes` that go back to `recv` when the collective finishes. */
static inline tpk_status tpk__mpi_stage_in(tpk_ctx *ctx, const char *fn, tpk__mpi_req *r,
                                           const void *send, size_t send_bytes, void *recv,
                                           size_t recv_bytes) {
    r->hsend = tpk__al_malloc(&r->al, send_bytes);
    r->hrecv = tpk__al_malloc(&r->al, recv_bytes);
    r->drecv = recv, r->recv_bytes = recv_bytes;
    if (!r->hsend || !r->hrecv)
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %zu staging bytes",
                         send_bytes + recv_bytes);
    if (send_bytes) return tpk_op_memcpy(ctx, r->hsend, send, send_bytes, TPK_D2H);
    return TPK_OK;
}
static inline void tpk__mpi_req_free(tpk__mpi_req *r) {
    tpk_allocator al = r->al;
    tpk__al_free(&al, r->counts), tpk__al_free(&al, r->displs);
    tpk__al_free(&al, r->hsend), tpk__al_free(&al, r->hrecv), tpk__al_free(&al, r);
}
/* A finished collective: copy a staged result back, free the request. */
static inline tpk_status tpk__mpi_done(tpk_ctx *ctx, tpk__mpi_req *r) {
    tpk_status s = TPK_OK;
    if (r->drecv && r->recv_bytes)
        s = tpk_op_memcpy(ctx, r->drecv, r->hrecv, r->recv_bytes, TPK_H2D);
    tpk__mpi_req_free(r);
    return s;
}

static inline void tpk__mpi_bf16_reduce(void *in, void *inout, int *len, MPI_Datatype *dt,
                                        bool is_max) {
    (void)dt;
    const uint16_t *a = (const uint16_t *)in;
    uint16_t *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) {
        float x = tpk_bf16_to_f32(a[i]), y = tpk_bf16_to_f32(b[i]);
        b[i] = tpk_f32_to_bf16(is_max ? (x > y ? x : y) : x + y);
    }
}
static inline void tpk__mpi_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    tpk__mpi_bf16_reduce(in, inout, len, dt, false);
}
static inline void tpk__mpi_bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    tpk__mpi_bf16_reduce(in, inout, len, dt, true);
}

static inline tpk_status tpk__mpi_err(tpk_ctx *ctx, const char *fn, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    return tpk__fail(ctx, TPK_ERR_COMM, fn, "%s", msg);
}

/* Wait for `req` at most timeout_s seconds (0: MPI_Wait): MPI_Test busily for TPK__MPI_SPIN_S,
 * then with sleeps of 10 us doubling to 1 ms. TPK_ERR_COMM on an MPI error, or on the timeout
 * with a message naming `fn` and `what` (the group); the request is then left active. */
static inline tpk_status tpk_mpi_wait(tpk_ctx *ctx, const char *fn, const char *what,
                                      MPI_Request *req, double timeout_s) {
    if (!fn || !what || !req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mpi_wait", "%s: NULL",
                         !fn     ? "fn"
                         : !what ? "what"
                                 : "req");
    if (!(timeout_s >= 0) || timeout_s > 1e9)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "timeout_s: expected seconds in [0, 1e9] (0: none), got %g", timeout_s);
    int rc, done = 0;
    if (timeout_s == 0) {
        rc = MPI_Wait(req, MPI_STATUS_IGNORE);
        return rc == MPI_SUCCESS ? TPK_OK : tpk__mpi_err(ctx, fn, rc);
    }
    /* a gap between two polls counts at most 1 s: a rank that was itself stopped does not blame its
     * peers when it resumes */
    double t = MPI_Wtime(), waited = 0;
    long nap_ns = 10000;
    for (unsigned k = 0;; k++) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, fn, rc);
        if (done) return TPK_OK;
        if (k % 64 == 0 || waited >= TPK__MPI_SPIN_S) { /* the clock read every 64 polls while
                                                           busy */
            double t1 = MPI_Wtime();
            waited += t1 - t < 1 ? t1 - t : 1, t = t1;
        }
        if (waited >= timeout_s)
            return tpk__fail(
                ctx, TPK_ERR_COMM, fn,
                "no answer from a peer within %g s on %s: a rank is stopped, dead or far slower",
                timeout_s, what);
        if (waited >= TPK__MPI_SPIN_S) {
            struct timespec ts = {0, nap_ns};
            nanosleep(&ts, NULL);
            if (nap_ns < 1000000) nap_ns *= 2;
        }
    }
}
/* The group a collective runs on, for messages: "the TP group (2 ranks)" and so on. */
static inline const char *tpk__mpi_group(const tpk_ctx *ctx, const tpk_comm *c, char *buf,
                                         size_t n) {
    const char *g = ctx && c == &ctx->tp     ? "the TP group"
                    : ctx && c == &ctx->dp   ? "the DP group"
                    : ctx && c == ctx->world ? "the world"
                                             : "a communicator";
    snprintf(buf, n, "%s (%d ranks)", g, c->size);
    return buf;
}

static inline MPI_Datatype tpk__mpi_type(tpk_dtype dt) {
    return dt == TPK_F32   ? MPI_FLOAT
           : dt == TPK_I32 ? MPI_INT32_T
           : dt == TPK_F64 ? MPI_DOUBLE
                           : MPI_UINT16_T;
}
static inline MPI_Op tpk__mpi_op(tpk__mpi *m, tpk_dtype dt, tpk_redop op) {
    if (dt == TPK_BF16) return op == TPK_MAX ? m->bf16_max : m->bf16_sum;
    return op == TPK_MAX ? MPI_MAX : MPI_SUM;
}

/* Wait for a started collective within the communicator's timeout and finish it. On a timeout
 * the request and its buffers are left to MPI (it may still write them) and the communicator is
 * marked unusable. */
static inline tpk_status tpk__mpi_await(tpk_ctx *ctx, tpk_comm *c, const char *fn,
                                        tpk__mpi_req *r) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    char what[64];
    tpk_status s = TPK_OK;
    for (tpk__mpi_req *more; r; r = more) { /* a point-to-point batch: each part in turn */
        more = r->more, r->more = NULL;
        tpk_status si = s != TPK_OK
                            ? s
                            : tpk_mpi_wait(ctx, fn, tpk__mpi_group(ctx, c, what, sizeof what),
                                           &r->req, m->timeout_s);
        if (si == TPK_OK) {
            s = tpk__mpi_done(ctx, r);
        } else {
            s = si;
            if (r->req != MPI_REQUEST_NULL)
                m->broken = true, r->next = m->abandoned,
                m->abandoned = r; /* still running: kept until destroy */
            else tpk__mpi_req_free(r);
        }
    }
    return s;
}
/* Run a started MPI request to completion when the caller asked for the blocking form,
 * otherwise hand it to the tpk request. */
static inline tpk_status tpk__mpi_finish(tpk_ctx *ctx, tpk_comm *c, const char *fn, int rc,
                                         tpk__mpi_req *r, tpk_request *req) {
    if (rc != MPI_SUCCESS) {
        tpk__mpi_req_free(r);
        return tpk__mpi_err(ctx, fn, rc);
    }
    if (req) {
        req->state = r;
        return TPK_OK;
    }
    return tpk__mpi_await(ctx, c, fn, r);
}
/* *out = a request for a collective on c, with c->size counts and displacements when `counts`
 * is given; TPK_ERR_COMM when c is unusable (an earlier collective on it timed out). */
static inline tpk_status tpk__mpi_req_new(tpk_ctx *ctx, const char *fn, tpk_comm *c,
                                          const size_t *counts, tpk__mpi_req **out) {
    *out = NULL;
    if (((tpk__mpi *)c->impl)->broken)
        return tpk__fail(ctx, TPK_ERR_COMM, fn,
                         "the communicator is unusable: an earlier collective on it timed out");
    tpk__mpi_req *r = (tpk__mpi_req *)tpk__calloc(ctx, 1, sizeof *r);
    if (r && ctx) r->al = ctx->allocator;
    if (r && counts) {
        r->counts = (int *)tpk__al_malloc(&r->al, sizeof(int) * (size_t)c->size);
        r->displs = (int *)tpk__al_malloc(&r->al, sizeof(int) * (size_t)c->size);
        if (r->counts && r->displs) {
            int off = 0;
            for (int q = 0; q < c->size; q++)
                r->counts[q] = (int)counts[q], r->displs[q] = off, off += (int)counts[q];
        } else {
            tpk__mpi_req_free(r), r = NULL;
        }
    }
    if (!r) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for a request");
    *out = r;
    return TPK_OK;
}

static inline tpk_status tpk__mpi_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                            size_t count, tpk_dtype dt, tpk_redop op,
                                            tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_allreduce (mpi)", c, NULL, &r));
    if (tpk__mpi_stage(ctx, dt, true)) {
        size_t bytes = count * tpk_dtype_size(dt);
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_allreduce (mpi)", r, send, bytes, recv, bytes);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, tpk__mpi_type(dt),
                            tpk__mpi_op(m, dt, op), m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_allreduce (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             void *recv, const size_t *counts, tpk_dtype dt,
                                             tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_allgatherv (mpi)", c, counts, &r));
    if (tpk__mpi_stage(ctx, dt, false)) {
        size_t es = tpk_dtype_size(dt), total = 0;
        for (int q = 0; q < c->size; q++) total += counts[q];
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_allgatherv (mpi)", r, send, counts[c->rank] * es,
                                         recv, total * es);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    MPI_Datatype t = tpk__mpi_type(dt);
    int rc = MPI_Iallgatherv(send, r->counts[c->rank], t, recv, r->counts, r->displs, t, m->comm,
                             &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_allgatherv (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                                  void *recv, const size_t *counts, tpk_dtype dt,
                                                  tpk_redop op, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_reduce_scatterv (mpi)", c, counts, &r));
    if (tpk__mpi_stage(ctx, dt, true)) {
        size_t es = tpk_dtype_size(dt), total = 0;
        for (int q = 0; q < c->size; q++) total += counts[q];
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_reduce_scatterv (mpi)", r, send, total * es,
                                         recv, counts[c->rank] * es);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    int rc = MPI_Ireduce_scatter(send, recv, r->counts, tpk__mpi_type(dt), tpk__mpi_op(m, dt, op),
                                 m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_reduce_scatterv (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count,
                                        tpk_dtype dt, int root, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_bcast (mpi)", c, NULL, &r));
    if (tpk__mpi_stage(ctx, dt, false)) { /* the root sends from host; the others receive there */
        size_t bytes = count * tpk_dtype_size(dt);
        bool root_ = c->rank == root;
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_bcast (mpi)", r, buf, root_ ? bytes : 0,
                                         root_ ? NULL : buf, root_ ? 0 : bytes);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        buf = root_ ? r->hsend : r->hrecv;
    }
    int rc = MPI_Ibcast(buf, (int)count, tpk__mpi_type(dt), root, m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_bcast (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_barrier(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r;
    TPK_TRY(tpk__mpi_req_new(ctx, "tpk_barrier (mpi)", c, NULL, &r));
    int rc = MPI_Ibarrier(m->comm, &r->req);
    return tpk__mpi_finish(ctx, c, "tpk_barrier (mpi)", rc, r, req);
}
/* A batch of sends and receives: MPI_Isend / MPI_Irecv each (device buffers staged: a send's data
 * copied to the host first, a receive's copied back when it finishes), chained in one request. */
static inline tpk_status tpk__mpi_p2p(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n,
                                      tpk_request *req) {
    static const char *fn = "tpk_p2p (mpi)";
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *first = NULL, **tail = &first;
    int rc = MPI_SUCCESS;
    tpk_status s = TPK_OK;
    for (int i = 0; i < n && s == TPK_OK && rc == MPI_SUCCESS; i++) {
        tpk__mpi_req *r;
        s = tpk__mpi_req_new(ctx, fn, c, NULL, &r);
        if (s != TPK_OK) break;
        *tail = r, tail = &r->more;
        void *buf = ops[i].buf;
        size_t bytes = ops[i].count * tpk_dtype_size(ops[i].dtype);
        if (tpk__mpi_stage(ctx, ops[i].dtype, false)) {
            s = ops[i].send ? tpk__mpi_stage_in(ctx, fn, r, buf, bytes, NULL, 0)
                            : tpk__mpi_stage_in(ctx, fn, r, NULL, 0, buf, bytes);
            if (s != TPK_OK) break;
            buf = ops[i].send ? r->hsend : r->hrecv;
        }
        MPI_Datatype t = tpk__mpi_type(ops[i].dtype);
        rc = ops[i].send
                 ? MPI_Isend(buf, (int)ops[i].count, t, ops[i].peer, ops[i].tag, m->comm, &r->req)
                 : MPI_Irecv(buf, (int)ops[i].count, t, ops[i].peer, ops[i].tag, m->comm, &r->req);
    }
    if (s == TPK_OK && rc != MPI_SUCCESS) s = tpk__mpi_err(ctx, fn, rc);
    if (s != TPK_OK) { /* the parts already started stay MPI's (their peers may never post the
                          match): the communicator is unusable, as after a timeout */
        for (tpk__mpi_req *r = first, *more; r; r = more) {
            more = r->more, r->more = NULL;
            if (r->req != MPI_REQUEST_NULL)
                m->broken = true, r->next = m->abandoned, m->abandoned = r;
            else tpk__mpi_req_free(r);
        }
        return s;
    }
    if (req) {
        req->state = first;
        return TPK_OK;
    }
    return tpk__mpi_await(ctx, c, fn, first);
}
static inline tpk_status tpk__mpi_wait(tpk_ctx *ctx, tpk_request *req) {
    tpk__mpi_req *r = (tpk__mpi_req *)req->state;
    if (!r) return TPK_OK;
    return tpk__mpi_await(ctx, req->comm, "tpk_wait (mpi)", r);
}
static inline void tpk__mpi_destroy(tpk_comm *c) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    if (!m) return;
    int fin = 0;
    MPI_Finalized(&fin);
    for (tpk__mpi_req *r = m->abandoned, *next; r; r = next) { /* freed if MPI has finished them
                                                                  since; else left to MPI */
        int done = 0;
        next = r->next;
        if (!fin && MPI_Test(&r->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
            tpk__mpi_req_free(r);
    }
    if (!fin) {
        MPI_Op_free(&m->bf16_sum);
        MPI_Op_free(&m->bf16_max);
        MPI_Comm_free(&m->comm);
    }
    tpk_allocator al = m->al;
    tpk__al_free(&al, m);
    c->impl = NULL;
}
static inline tpk_status tpk__mpi_wrap(tpk_ctx *ctx, const char *fn, MPI_Comm owned,
                                       double timeout_s, tpk_comm *out);
static inline tpk_status tpk__mpi_split(tpk_ctx *ctx, tpk_comm *c, int color, int key,
                                        tpk_comm *out) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    MPI_Comm sub;
    int rc = MPI_Comm_split(m->comm, color, key, &sub), n = 0;
    if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, "tpk_comm_split (mpi)", rc);
    MPI_Comm_size(sub, &n);
    if (n == 1) { /* one rank (the TP group at t = 1): its collectives are copies, no MPI call and
                     no host staging */
        MPI_Comm_free(&sub);
        *out = tpk_comm_self(c->device);
        return TPK_OK;
    }
    return tpk__mpi_wrap(ctx, "tpk_comm_split (mpi)", sub, m->timeout_s, out); /* the parent's
                                                                                  timeout */
}

static inline const tpk_comm_vtable *tpk__mpi_vtable(void) {
    static const tpk_comm_vtable vt = {"mpi", TPK__COMM_TABLE(tpk__mpi_), tpk__mpi_destroy,
                                       TPK__COMM_P2P(tpk__mpi_)};
    return &vt;
}

/* Take ownership of `owned` (a communicator of our own) and fill `out`; collectives wait at most
 * timeout_s seconds. */
static inline tpk_status tpk__mpi_wrap(tpk_ctx *ctx, const char *fn, MPI_Comm owned,
                                       double timeout_s, tpk_comm *out) {
    memset(out, 0, sizeof *out);
    tpk__mpi *m = (tpk__mpi *)tpk__calloc(ctx, 1, sizeof *m);
    if (!m) {
        MPI_Comm_free(&owned);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    m->comm = owned, m->timeout_s = timeout_s;
    if (ctx) m->al = ctx->allocator;
    MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN);
    MPI_Op_create(tpk__mpi_bf16_sum, 1, &m->bf16_sum);
    MPI_Op_create(tpk__mpi_bf16_max, 1, &m->bf16_max);
    MPI_Comm_rank(owned, &out->rank);
    MPI_Comm_size(owned, &out->size);
    out->vt = tpk__mpi_vtable(), out->impl = m, out->device = false;
    return TPK_OK;
}

/* *timeout_s = the seconds a new MPI communicator's collectives wait: TPK_TIMEOUT from the
 * environment when set (TPK_ERR_ARG when it is not a number in [0, 1e9]), else 600. */
static inline tpk_status tpk_mpi_timeout_default(tpk_ctx *ctx, double *timeout_s) {
    if (!timeout_s)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mpi_timeout_default", "timeout_s: NULL");
    *timeout_s = TPK_MPI_TIMEOUT_DEFAULT;
    const char *env = getenv("TPK_TIMEOUT");
    if (!env) return TPK_OK;
    char *end = NULL;
    double t = strtod(env, &end);
    if (!*env || *end || !(t >= 0 && t <= 1e9))
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mpi_timeout_default",
                         "TPK_TIMEOUT: expected seconds in [0, 1e9] (0: none), got \"%s\"", env);
    *timeout_s = t;
    return TPK_OK;
}

/* A tpk communicator over (a duplicate of) `comm`; MPI must be initialised. ctx may be NULL (or
 * zeroed, before tpk_ctx_init): the communicator's state comes from ctx's allocator (NULL or
 * zeroed: the C library's; set ctx->allocator first to place it), each collective's request from
 * the allocator of the context that runs it.
 * Its collectives wait at most tpk_mpi_timeout_default's seconds (TPK_TIMEOUT, else 600). */
static inline tpk_status tpk_comm_mpi(tpk_ctx *ctx, MPI_Comm comm, tpk_comm *out) {
    static const char *fn = "tpk_comm_mpi";
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    double timeout_s;
    TPK_TRY(tpk_mpi_timeout_default(ctx, &timeout_s));
    int init = 0;
    MPI_Initialized(&init);
    if (!init)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "MPI is not initialised: call MPI_Init first");
    if (comm == MPI_COMM_NULL) return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: MPI_COMM_NULL");
    MPI_Comm dup;
    int rc = MPI_Comm_dup(comm, &dup);
    if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, fn, rc);
    return tpk__mpi_wrap(ctx, fn, dup, timeout_s, out);
}

/* How long c's collectives wait for the peers, in seconds (0: for ever); communicators split
 * from c afterwards inherit it. c: an MPI communicator, or one of a single rank (self), which
 * never waits (accepted, no effect). */
static inline tpk_status tpk_comm_mpi_set_timeout(tpk_ctx *ctx, tpk_comm *c, double timeout_s) {
    static const char *fn = "tpk_comm_mpi_set_timeout";
    if (!c || !c->vt)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: expected an initialised communicator, got %s",
                         c ? "one with no table" : "NULL");
    if (!(timeout_s >= 0 && timeout_s <= 1e9))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "timeout_s: expected seconds in [0, 1e9] (0: none), got %g", timeout_s);
    if (c->vt == tpk__mpi_vtable()) ((tpk__mpi *)c->impl)->timeout_s = timeout_s;
    else if (c->size != 1)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "comm: expected an MPI communicator, got \"%s\" (NCCL: tpk_nccl_desc.timeout_s)",
            c->vt->name);
    return TPK_OK;
}

#endif /* TPK_MPI_H */
