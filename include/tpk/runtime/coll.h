/* tpk/runtime/coll.h — checked, counted collectives over a tpk_comm (tpk/base/comm.h).
 *
 * tpk_allreduce & co. check their arguments (null buffers, count arrays that do not add up,
 * counts past INT_MAX), count calls/elements/bytes in comm->stats, then call the table.
 * The *_start forms return at once; tpk_wait finishes them. Point-to-point batches (tpk_p2p_run,
 * tpk_send, tpk_recv) the same way. tpk_comm_split makes sub-groups (the context's TP x DP x PP
 * mesh, tpk/runtime/init.h). */
#ifndef TPK_COLL_H
#define TPK_COLL_H

#include <limits.h>

#include "buf.h"

static inline void tpk__count(tpk_comm *c, tpk_coll_kind k, size_t elems, tpk_dtype dt) {
    c->stats.calls[k] += 1;
    c->stats.elems[k] += elems;
    c->stats.bytes[k] += elems * tpk_dtype_size(dt);
}
static inline void tpk_comm_stats_reset(tpk_comm *c) { memset(&c->stats, 0, sizeof c->stats); }

static inline tpk_status tpk__started(tpk_request *req, tpk_status s) {
    if (req && s == TPK_OK) req->active = true;
    return s;
}

static inline tpk_status tpk__check_comm(tpk_ctx *ctx, const char *fn, tpk_comm *c, tpk_dtype dt,
                                         tpk_request *req) {
    if (!c || !c->vt)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "comm: expected an initialised communicator, got %s",
                         c ? "one with no table" : "NULL");
    if (!tpk_dtype_valid(dt))
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "dtype: expected f32, bf16 or i32, got %d",
                         (int)dt);
    if (req && req->active)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "req: still holds an unfinished collective; tpk_wait it first");
    return TPK_OK;
}
static inline tpk_status tpk__check_count(tpk_ctx *ctx, const char *fn, const char *arg, size_t n) {
    if (n > (size_t)INT_MAX)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: %zu elements, expected at most %d per call",
                         arg, n, INT_MAX);
    return TPK_OK;
}

/* The profiler's name of a collective: kind (0 allreduce, 1 allgather, 2 reduce_scatter, 3 bcast,
 * 4 wait) on the TP group, the DP group or another communicator, started (req) or blocking. */
static inline const char *tpk__coll_name(const tpk_ctx *ctx, const tpk_comm *c, int kind,
                                         const tpk_request *req) {
    static const char *const names[3][2][5] = {
        {{"tp.allreduce", "tp.allgather", "tp.reduce_scatter", "tp.bcast", "tp.wait"},
         {"tp.allreduce (start)", "tp.allgather (start)", "tp.reduce_scatter (start)",
          "tp.bcast (start)", "tp.wait"}},
        {{"dp.allreduce", "dp.allgather", "dp.reduce_scatter", "dp.bcast", "dp.wait"},
         {"dp.allreduce (start)", "dp.allgather (start)", "dp.reduce_scatter (start)",
          "dp.bcast (start)", "dp.wait"}},
        {{"allreduce", "allgather", "reduce_scatter", "bcast", "wait"},
         {"allreduce (start)", "allgather (start)", "reduce_scatter (start)", "bcast (start)",
          "wait"}}};
    int g = c == &ctx->tp ? 0 : c == &ctx->dp ? 1 : 2;
    return names[g][req ? 1 : 0][kind];
}

static inline tpk_status tpk__allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                        size_t count, tpk_dtype dt, tpk_redop op, tpk_request *req,
                                        const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_count(ctx, fn, "count", count));
    if (count && (!send || !recv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL buffer for %zu elements",
                         send ? "recv" : "send", count);
    if (op != TPK_SUM && op != TPK_MAX)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "op: expected TPK_SUM or TPK_MAX, got %d", (int)op);
    tpk__count(c, TPK_COLL_ALLREDUCE, count, dt);
    if (req) req->comm = c, req->state = NULL;
    return tpk__started(req,
                        TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 0, req),
                                     (double)count * (double)tpk_dtype_size(dt), 0,
                                     c->vt->allreduce(ctx, c, send, recv, count, dt, op, req)));
}
/* recv = op over ranks of send (count elements); send may equal recv. */
static inline tpk_status tpk_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                       size_t count, tpk_dtype dt, tpk_redop op) {
    return tpk__allreduce(ctx, c, send, recv, count, dt, op, NULL, "tpk_allreduce");
}
static inline tpk_status tpk_allreduce_start(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             void *recv, size_t count, tpk_dtype dt, tpk_redop op,
                                             tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_allreduce_start",
                         "req: expected a request, got NULL");
    return tpk__allreduce(ctx, c, send, recv, count, dt, op, req, "tpk_allreduce_start");
}

static inline tpk_status tpk__check_counts(tpk_ctx *ctx, const char *fn, tpk_comm *c,
                                           const size_t *counts, size_t total,
                                           const char *total_name) {
    if (!counts)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "counts: expected %d counts, got NULL", c->size);
    size_t sum = 0;
    for (int q = 0; q < c->size; q++) {
        TPK_TRY(tpk__check_count(ctx, fn, "counts[q]", counts[q]));
        sum += counts[q];
    }
    TPK_TRY(tpk__check_count(ctx, fn, "sum of counts", sum));
    if (sum != total)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "counts: the %d counts add up to %zu, expected %s = %zu", c->size, sum,
                         total_name, total);
    return TPK_OK;
}

static inline tpk_status tpk__allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                         size_t sendcount, void *recv, const size_t *counts,
                                         size_t recvcount, tpk_dtype dt, tpk_request *req,
                                         const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_counts(ctx, fn, c, counts, recvcount, "recvcount"));
    if (counts[c->rank] != sendcount)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "counts[%d]: is %zu, expected this rank's sendcount = %zu", c->rank,
                         counts[c->rank], sendcount);
    if ((sendcount && !send) || (recvcount && !recv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL buffer", recv ? "send" : "recv");
    tpk__count(c, TPK_COLL_ALLGATHER, recvcount, dt);
    if (req) req->comm = c, req->state = NULL;
    return tpk__started(req, TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 1, req),
                                          (double)recvcount * (double)tpk_dtype_size(dt), 0,
                                          c->vt->allgatherv(ctx, c, send, recv, counts, dt, req)));
}
/* recv[recvcount] = the ranks' send buffers concatenated in rank order; counts[q] is rank q's
 * count (counts[rank] == sendcount, sum == recvcount). Uneven counts are allowed. */
static inline tpk_status tpk_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                        size_t sendcount, void *recv, const size_t *counts,
                                        size_t recvcount, tpk_dtype dt) {
    return tpk__allgatherv(ctx, c, send, sendcount, recv, counts, recvcount, dt, NULL,
                           "tpk_allgatherv");
}
static inline tpk_status tpk_allgatherv_start(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                              size_t sendcount, void *recv, const size_t *counts,
                                              size_t recvcount, tpk_dtype dt, tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_allgatherv_start",
                         "req: expected a request, got NULL");
    return tpk__allgatherv(ctx, c, send, sendcount, recv, counts, recvcount, dt, req,
                           "tpk_allgatherv_start");
}

static inline tpk_status tpk__reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                              size_t sendcount, void *recv, const size_t *counts,
                                              tpk_dtype dt, tpk_redop op, tpk_request *req,
                                              const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_counts(ctx, fn, c, counts, sendcount, "sendcount"));
    if ((sendcount && !send) || (counts[c->rank] && !recv))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL buffer", send ? "recv" : "send");
    if (send == recv && sendcount)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "recv: must not alias send");
    if (op != TPK_SUM && op != TPK_MAX)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "op: expected TPK_SUM or TPK_MAX, got %d", (int)op);
    tpk__count(c, TPK_COLL_REDUCE_SCATTER, sendcount, dt);
    if (req) req->comm = c, req->state = NULL;
    return tpk__started(
        req, TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 2, req),
                          (double)sendcount * (double)tpk_dtype_size(dt), 0,
                          c->vt->reduce_scatterv(ctx, c, send, recv, counts, dt, op, req)));
}
/* send[sendcount] holds the ranks' blocks in rank order (counts[q] each, sum == sendcount);
 * recv[counts[rank]] = op over ranks of this rank's block. */
static inline tpk_status tpk_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             size_t sendcount, void *recv, const size_t *counts,
                                             tpk_dtype dt, tpk_redop op) {
    return tpk__reduce_scatterv(ctx, c, send, sendcount, recv, counts, dt, op, NULL,
                                "tpk_reduce_scatterv");
}
static inline tpk_status tpk_reduce_scatterv_start(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                                   size_t sendcount, void *recv,
                                                   const size_t *counts, tpk_dtype dt, tpk_redop op,
                                                   tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_reduce_scatterv_start",
                         "req: expected a request, got NULL");
    return tpk__reduce_scatterv(ctx, c, send, sendcount, recv, counts, dt, op, req,
                                "tpk_reduce_scatterv_start");
}

static inline tpk_status tpk__bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count,
                                    tpk_dtype dt, int root, tpk_request *req, const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, dt, req));
    TPK_TRY(tpk__check_count(ctx, fn, "count", count));
    if (count && !buf)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "buf: NULL buffer for %zu elements", count);
    if (root < 0 || root >= c->size)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "root: expected 0..%d, got %d", c->size - 1, root);
    tpk__count(c, TPK_COLL_BROADCAST, count, dt);
    if (req) req->comm = c, req->state = NULL;
    return tpk__started(req, TPK__PROF_OP(ctx, tpk__coll_name(ctx, c, 3, req),
                                          (double)count * (double)tpk_dtype_size(dt), 0,
                                          c->vt->bcast(ctx, c, buf, count, dt, root, req)));
}
static inline tpk_status tpk_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt,
                                   int root) {
    return tpk__bcast(ctx, c, buf, count, dt, root, NULL, "tpk_bcast");
}
static inline tpk_status tpk_bcast_start(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count,
                                         tpk_dtype dt, int root, tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_bcast_start", "req: expected a request, got NULL");
    return tpk__bcast(ctx, c, buf, count, dt, root, req, "tpk_bcast_start");
}

static inline tpk_status tpk_barrier(tpk_ctx *ctx, tpk_comm *c) {
    TPK_TRY(tpk__check_comm(ctx, "tpk_barrier", c, TPK_F32, NULL));
    tpk__count(c, TPK_COLL_BARRIER, 0, TPK_F32);
    return c->vt->barrier(ctx, c, NULL);
}
static inline tpk_status tpk_barrier_start(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_barrier_start",
                         "req: expected a request, got NULL");
    TPK_TRY(tpk__check_comm(ctx, "tpk_barrier_start", c, TPK_F32, req));
    tpk__count(c, TPK_COLL_BARRIER, 0, TPK_F32);
    req->comm = c, req->state = NULL;
    return tpk__started(req, c->vt->barrier(ctx, c, req));
}

/* ---- point-to-point ------------------------------------------------------------------------- */

#define TPK_P2P_MAX 16        /* parts of one batch */
#define TPK_P2P_TAG_MAX 32767 /* the largest tag (the least MPI_TAG_UB an MPI may have) */

static inline tpk_status tpk__p2p(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n,
                                  tpk_request *req, const char *fn) {
    TPK_TRY(tpk__check_comm(ctx, fn, c, TPK_F32, req));
    if (n < 0 || n > TPK_P2P_MAX || (n && !ops))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "n: expected 0..%d parts%s, got %d", TPK_P2P_MAX,
                         n && !ops ? " and ops" : "", n);
    for (int i = 0; i < n; i++) {
        const tpk_p2p *o = &ops[i];
        if (!tpk_dtype_valid(o->dtype))
            return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "ops[%d].dtype: expected a dtype, got %d", i,
                             (int)o->dtype);
        TPK_TRY(tpk__check_count(ctx, fn, "ops[i].count", o->count));
        if (o->count && !o->buf)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "ops[%d].buf: NULL buffer for %zu elements", i,
                             o->count);
        if (o->peer < 0 || o->peer >= c->size || o->peer == c->rank)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "ops[%d].peer: expected a rank of 0..%d other than this rank %d, "
                             "got %d",
                             i, c->size - 1, c->rank, o->peer);
        if (o->tag < 0 || o->tag > TPK_P2P_TAG_MAX)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "ops[%d].tag: expected 0..%d, got %d", i,
                             TPK_P2P_TAG_MAX, o->tag);
    }
    if (!c->vt->p2p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "comm: the communicator \"%s\" has no point-to-point entry (p2p)",
                         c->vt->name ? c->vt->name : "?");
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        tpk__count(c, ops[i].send ? TPK_COLL_SEND : TPK_COLL_RECV, ops[i].count, ops[i].dtype);
        bytes += (double)ops[i].count * (double)tpk_dtype_size(ops[i].dtype);
    }
    if (req) req->comm = c, req->state = NULL;
    if (!n) return TPK_OK;
    return tpk__started(req, TPK__PROF_OP(ctx, req ? "p2p (start)" : "p2p", bytes, 0,
                                          c->vt->p2p(ctx, c, ops, n, req)));
}
/* Run the batch ops[n] of sends and receives (tpk_p2p, tpk/base/comm.h) and wait for all of it:
 * each peer a rank of c other than this one, tags 0..TPK_P2P_TAG_MAX; counted in c->stats as
 * TPK_COLL_SEND and TPK_COLL_RECV. A batch is what NCCL runs as one group: a send and the receive
 * its peer posts in its own batch at the same point do not wait for each other. */
static inline tpk_status tpk_p2p_run(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n) {
    return tpk__p2p(ctx, c, ops, n, NULL, "tpk_p2p_run");
}
static inline tpk_status tpk_p2p_start(tpk_ctx *ctx, tpk_comm *c, const tpk_p2p *ops, int n,
                                       tpk_request *req) {
    if (!req)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_p2p_start", "req: expected a request, got NULL");
    return tpk__p2p(ctx, c, ops, n, req, "tpk_p2p_start");
}
/* One part: a blocking send of count elements to `peer`, and a blocking receive from it. */
static inline tpk_status tpk_send(tpk_ctx *ctx, tpk_comm *c, const void *buf, size_t count,
                                  tpk_dtype dt, int peer, int tag) {
    tpk_p2p o = {(void *)buf, count, dt, peer, tag, true};
    return tpk__p2p(ctx, c, &o, 1, NULL, "tpk_send");
}
static inline tpk_status tpk_recv(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt,
                                  int peer, int tag) {
    tpk_p2p o = {buf, count, dt, peer, tag, false};
    return tpk__p2p(ctx, c, &o, 1, NULL, "tpk_recv");
}

/* Finish a started collective. Waiting on a request that holds nothing is a no-op. */
static inline tpk_status tpk_wait(tpk_ctx *ctx, tpk_request *req) {
    if (!req) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_wait", "req: expected a request, got NULL");
    if (!req->active) return TPK_OK;
    tpk_status s = TPK__PROF_OP(ctx, tpk__coll_name(ctx, req->comm, 4, NULL), 0, 0,
                                req->comm->vt->wait(ctx, req));
    req->active = false, req->state = NULL;
    return s;
}

static inline tpk_status tpk_comm_split(tpk_ctx *ctx, tpk_comm *c, int color, int key,
                                        tpk_comm *out) {
    if (!c || !c->vt || !out)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_comm_split", "%s: NULL", !out ? "out" : "comm");
    if (color < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_comm_split", "color: expected >= 0, got %d", color);
    return c->vt->split(ctx, c, color, key, out);
}
static inline void tpk_comm_destroy(tpk_comm *c) {
    if (c && c->vt && c->vt->destroy) c->vt->destroy(c);
    if (c) memset(c, 0, sizeof *c);
}

/* ---- host values over a communicator --------------------------------------------------------- */

/* Collectives on a few values in host memory (a loss, a squared norm, a flag, a token): staged
 * through the context's backend memory (ctx->work[0]), so they run on any communicator, NCCL's
 * device-only ones included. vals[n] of dt; blocking. */
static inline tpk_status tpk__host_coll(tpk_ctx *ctx, const char *fn, tpk_comm *c, void *vals,
                                        size_t n, tpk_dtype dt, tpk_redop op, int root,
                                        bool bcast) {
    if (!ctx || !ctx->ops) return TPK_ERR_ARG;
    if (n && !vals) return tpk__fail(ctx, TPK_ERR_ARG, fn, "vals: NULL buffer for %zu elements", n);
    size_t bytes = n * tpk_dtype_size(dt);
    bool dev = ctx->ops->device && bytes;
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->work[0], bytes));
    void *b = dev ? ctx->work[0].p : vals;
    if (dev) TPK_TRY(tpk_op_memcpy(ctx, b, vals, bytes, TPK_H2D));
    TPK_TRY(bcast ? tpk_bcast(ctx, c, b, n, dt, root) : tpk_allreduce(ctx, c, b, b, n, dt, op));
    return dev ? tpk_op_memcpy(ctx, vals, b, bytes, TPK_D2H) : TPK_OK;
}
static inline tpk_status tpk_allreduce_host(tpk_ctx *ctx, tpk_comm *c, void *vals, size_t n,
                                            tpk_dtype dt, tpk_redop op) {
    return tpk__host_coll(ctx, "tpk_allreduce_host", c, vals, n, dt, op, 0, false);
}
static inline tpk_status tpk_bcast_host(tpk_ctx *ctx, tpk_comm *c, void *vals, size_t n,
                                        tpk_dtype dt, int root) {
    return tpk__host_coll(ctx, "tpk_bcast_host", c, vals, n, dt, TPK_SUM, root, true);
}
/* Every rank of c passes its own status; all get TPK_OK only when all passed TPK_OK, else a
 * failing status (a rank's own when it failed) — so ranks stop together instead of hanging. */
static inline tpk_status tpk_agree(tpk_ctx *ctx, tpk_comm *c, tpk_status mine) {
    int32_t v[2] = {mine == TPK_OK ? 0 : 1, mine == TPK_OK ? 0 : (int32_t)mine};
    tpk_status s = tpk_allreduce_host(ctx, c, v, 2, TPK_I32, TPK_MAX);
    if (s != TPK_OK) return s;
    return v[0] ? (mine != TPK_OK ? mine : (tpk_status)v[1]) : TPK_OK;
}

#endif /* TPK_COLL_H */
