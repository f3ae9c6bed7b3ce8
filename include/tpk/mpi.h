/* tpk/mpi.h — the MPI communicator on host buffers (compile with mpicc).
 *
 * tpk_comm_mpi() wraps a duplicate of an MPI communicator with errors returned, not fatal.
 * Collectives map one to one: MPI_Iallreduce, MPI_Iallgatherv, MPI_Ireduce_scatter,
 * MPI_Ibcast, MPI_Ibarrier; the blocking forms start and wait. bf16 travels as 16-bit words
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
 * (tpk/comm_self.h: collectives are copies on the backend), as the NCCL one does. */
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

typedef struct tpk__mpi {
    MPI_Comm comm;
    MPI_Op bf16_sum, bf16_max;
} tpk__mpi;

typedef struct tpk__mpi_req {
    MPI_Request req;
    int *counts, *displs; /* [size] each, for v-collectives */
    void *hsend, *hrecv;  /* host staging of device buffers (NULL when not staged) */
    void *drecv;          /* the device buffer the result goes back to */
    size_t recv_bytes;
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
static inline tpk_status tpk__mpi_stage_in(tpk_ctx *ctx, const char *fn, tpk__mpi_req *r, const void *send, size_t send_bytes,
                                           void *recv, size_t recv_bytes) {
    r->hsend = malloc(send_bytes ? send_bytes : 1);
    r->hrecv = malloc(recv_bytes ? recv_bytes : 1);
    r->drecv = recv, r->recv_bytes = recv_bytes;
    if (!r->hsend || !r->hrecv) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %zu staging bytes", send_bytes + recv_bytes);
    if (send_bytes) return tpk_op_memcpy(ctx, r->hsend, send, send_bytes, TPK_D2H);
    return TPK_OK;
}
static inline void tpk__mpi_req_free(tpk__mpi_req *r) {
    free(r->counts), free(r->displs), free(r->hsend), free(r->hrecv), free(r);
}
/* A finished collective: copy a staged result back, free the request. */
static inline tpk_status tpk__mpi_done(tpk_ctx *ctx, tpk__mpi_req *r) {
    tpk_status s = TPK_OK;
    if (r->drecv && r->recv_bytes) s = tpk_op_memcpy(ctx, r->drecv, r->hrecv, r->recv_bytes, TPK_H2D);
    tpk__mpi_req_free(r);
    return s;
}

static inline void tpk__mpi_bf16_reduce(void *in, void *inout, int *len, MPI_Datatype *dt, bool is_max) {
    (void)dt;
    const uint16_t *a = (const uint16_t *)in;
    uint16_t *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) {
        float x = tpk_bf16_to_f32(a[i]), y = tpk_bf16_to_f32(b[i]);
        b[i] = tpk_f32_to_bf16(is_max ? (x > y ? x : y) : x + y);
    }
}
static inline void tpk__mpi_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) { tpk__mpi_bf16_reduce(in, inout, len, dt, false); }
static inline void tpk__mpi_bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) { tpk__mpi_bf16_reduce(in, inout, len, dt, true); }

static inline tpk_status tpk__mpi_err(tpk_ctx *ctx, const char *fn, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return tpk__fail(ctx, TPK_ERR_COMM, fn, "%s", msg);
}

static inline MPI_Datatype tpk__mpi_type(tpk_dtype dt) {
    return dt == TPK_F32 ? MPI_FLOAT : dt == TPK_I32 ? MPI_INT32_T : dt == TPK_F64 ? MPI_DOUBLE : MPI_UINT16_T;
}
static inline MPI_Op tpk__mpi_op(tpk__mpi *m, tpk_dtype dt, tpk_redop op) {
    if (dt == TPK_BF16) return op == TPK_MAX ? m->bf16_max : m->bf16_sum;
    return op == TPK_MAX ? MPI_MAX : MPI_SUM;
}

/* Run a started MPI request to completion when the caller asked for the blocking form,
 * otherwise hand it to the tpk request. */
static inline tpk_status tpk__mpi_finish(tpk_ctx *ctx, const char *fn, int rc, tpk__mpi_req *r, tpk_request *req) {
    if (rc != MPI_SUCCESS) {
        tpk__mpi_req_free(r);
        return tpk__mpi_err(ctx, fn, rc);
    }
    if (req) {
        req->state = r;
        return TPK_OK;
    }
    rc = MPI_Wait(&r->req, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        tpk__mpi_req_free(r);
        return tpk__mpi_err(ctx, fn, rc);
    }
    return tpk__mpi_done(ctx, r);
}
static inline tpk__mpi_req *tpk__mpi_req_new(tpk_ctx *ctx, const char *fn, int size, const size_t *counts) {
    tpk__mpi_req *r = (tpk__mpi_req *)calloc(1, sizeof *r);
    if (r && counts) {
        r->counts = (int *)malloc(sizeof(int) * (size_t)size);
        r->displs = (int *)malloc(sizeof(int) * (size_t)size);
        if (r->counts && r->displs) {
            int off = 0;
            for (int q = 0; q < size; q++) r->counts[q] = (int)counts[q], r->displs[q] = off, off += (int)counts[q];
        } else {
            free(r->counts), free(r->displs), free(r), r = NULL;
        }
    }
    if (!r) tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for a request");
    return r;
}

static inline tpk_status tpk__mpi_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv, size_t count,
                                            tpk_dtype dt, tpk_redop op, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r = tpk__mpi_req_new(ctx, "tpk_allreduce (mpi)", c->size, NULL);
    if (!r) return TPK_ERR_NOMEM;
    if (tpk__mpi_stage(ctx, dt, true)) {
        size_t bytes = count * tpk_dtype_size(dt);
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_allreduce (mpi)", r, send, bytes, recv, bytes);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, tpk__mpi_type(dt),
                            tpk__mpi_op(m, dt, op), m->comm, &r->req);
    return tpk__mpi_finish(ctx, "tpk_allreduce (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv, const size_t *counts,
                                             tpk_dtype dt, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r = tpk__mpi_req_new(ctx, "tpk_allgatherv (mpi)", c->size, counts);
    if (!r) return TPK_ERR_NOMEM;
    if (tpk__mpi_stage(ctx, dt, false)) {
        size_t es = tpk_dtype_size(dt), total = 0;
        for (int q = 0; q < c->size; q++) total += counts[q];
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_allgatherv (mpi)", r, send, counts[c->rank] * es, recv, total * es);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    MPI_Datatype t = tpk__mpi_type(dt);
    int rc = MPI_Iallgatherv(send, r->counts[c->rank], t, recv, r->counts, r->displs, t, m->comm, &r->req);
    return tpk__mpi_finish(ctx, "tpk_allgatherv (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                                  const size_t *counts, tpk_dtype dt, tpk_redop op, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r = tpk__mpi_req_new(ctx, "tpk_reduce_scatterv (mpi)", c->size, counts);
    if (!r) return TPK_ERR_NOMEM;
    if (tpk__mpi_stage(ctx, dt, true)) {
        size_t es = tpk_dtype_size(dt), total = 0;
        for (int q = 0; q < c->size; q++) total += counts[q];
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_reduce_scatterv (mpi)", r, send, total * es, recv, counts[c->rank] * es);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        send = r->hsend, recv = r->hrecv;
    }
    int rc = MPI_Ireduce_scatter(send, recv, r->counts, tpk__mpi_type(dt), tpk__mpi_op(m, dt, op), m->comm, &r->req);
    return tpk__mpi_finish(ctx, "tpk_reduce_scatterv (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt, int root,
                                        tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r = tpk__mpi_req_new(ctx, "tpk_bcast (mpi)", c->size, NULL);
    if (!r) return TPK_ERR_NOMEM;
    if (tpk__mpi_stage(ctx, dt, false)) { /* the root sends from host; the others receive there */
        size_t bytes = count * tpk_dtype_size(dt);
        bool root_ = c->rank == root;
        tpk_status s = tpk__mpi_stage_in(ctx, "tpk_bcast (mpi)", r, buf, root_ ? bytes : 0, root_ ? NULL : buf, root_ ? 0 : bytes);
        if (s != TPK_OK) return tpk__mpi_req_free(r), s;
        buf = root_ ? r->hsend : r->hrecv;
    }
    int rc = MPI_Ibcast(buf, (int)count, tpk__mpi_type(dt), root, m->comm, &r->req);
    return tpk__mpi_finish(ctx, "tpk_bcast (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_barrier(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    tpk__mpi_req *r = tpk__mpi_req_new(ctx, "tpk_barrier (mpi)", c->size, NULL);
    if (!r) return TPK_ERR_NOMEM;
    int rc = MPI_Ibarrier(m->comm, &r->req);
    return tpk__mpi_finish(ctx, "tpk_barrier (mpi)", rc, r, req);
}
static inline tpk_status tpk__mpi_wait(tpk_ctx *ctx, tpk_request *req) {
    tpk__mpi_req *r = (tpk__mpi_req *)req->state;
    if (!r) return TPK_OK;
    int rc = MPI_Wait(&r->req, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        tpk__mpi_req_free(r);
        return tpk__mpi_err(ctx, "tpk_wait (mpi)", rc);
    }
    return tpk__mpi_done(ctx, r);
}
static inline void tpk__mpi_destroy(tpk_comm *c) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    if (!m) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        MPI_Op_free(&m->bf16_sum);
        MPI_Op_free(&m->bf16_max);
        MPI_Comm_free(&m->comm);
    }
    free(m);
    c->impl = NULL;
}
static inline tpk_status tpk__mpi_wrap(tpk_ctx *ctx, const char *fn, MPI_Comm owned, tpk_comm *out);
static inline tpk_status tpk__mpi_split(tpk_ctx *ctx, tpk_comm *c, int color, int key, tpk_comm *out) {
    tpk__mpi *m = (tpk__mpi *)c->impl;
    MPI_Comm sub;
    int rc = MPI_Comm_split(m->comm, color, key, &sub), n = 0;
    if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, "tpk_comm_split (mpi)", rc);
    MPI_Comm_size(sub, &n);
    if (n == 1) { /* one rank (the TP group at t = 1): its collectives are copies, no MPI call and no host staging */
        MPI_Comm_free(&sub);
        *out = tpk_comm_self(c->device);
        return TPK_OK;
    }
    return tpk__mpi_wrap(ctx, "tpk_comm_split (mpi)", sub, out);
}

static inline const tpk_comm_vtable *tpk__mpi_vtable(void) {
    static const tpk_comm_vtable vt = {"mpi", tpk__mpi_allreduce, tpk__mpi_allgatherv, tpk__mpi_reduce_scatterv,
                                       tpk__mpi_bcast, tpk__mpi_barrier, tpk__mpi_wait, tpk__mpi_split, tpk__mpi_destroy};
    return &vt;
}

/* Take ownership of `owned` (a communicator of our own) and fill `out`. */
static inline tpk_status tpk__mpi_wrap(tpk_ctx *ctx, const char *fn, MPI_Comm owned, tpk_comm *out) {
    memset(out, 0, sizeof *out);
    tpk__mpi *m = (tpk__mpi *)calloc(1, sizeof *m);
    if (!m) {
        MPI_Comm_free(&owned);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    m->comm = owned;
    MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN);
    MPI_Op_create(tpk__mpi_bf16_sum, 1, &m->bf16_sum);
    MPI_Op_create(tpk__mpi_bf16_max, 1, &m->bf16_max);
    MPI_Comm_rank(owned, &out->rank);
    MPI_Comm_size(owned, &out->size);
    out->vt = tpk__mpi_vtable(), out->impl = m, out->device = false;
    return TPK_OK;
}

/* A tpk communicator over (a duplicate of) `comm`; MPI must be initialised. ctx may be NULL. */
static inline tpk_status tpk_comm_mpi(tpk_ctx *ctx, MPI_Comm comm, tpk_comm *out) {
    static const char *fn = "tpk_comm_mpi";
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    int init = 0;
    MPI_Initialized(&init);
    if (!init) return tpk__fail(ctx, TPK_ERR_ARG, fn, "MPI is not initialised: call MPI_Init first");
    if (comm == MPI_COMM_NULL) return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: MPI_COMM_NULL");
    MPI_Comm dup;
    int rc = MPI_Comm_dup(comm, &dup);
    if (rc != MPI_SUCCESS) return tpk__mpi_err(ctx, fn, rc);
    return tpk__mpi_wrap(ctx, fn, dup, out);
}

#endif /* TPK_MPI_H */
