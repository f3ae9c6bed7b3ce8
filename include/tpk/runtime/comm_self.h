/* tpk/runtime/comm_self.h — the `self` communicator: one rank, every collective a copy (or
 * nothing).
 *
 * For unsharded reference runs and single-process programs: all-reduce, all-gather and
 * reduce-scatter copy send to recv (device buffers through the context's memcpy op), and so does
 * the all-to-all (its one block, sendcounts[0] elements); broadcast, barrier and wait do nothing; a
 * split gives another self communicator. */
#ifndef TPK_COMM_SELF_H
#define TPK_COMM_SELF_H

#include "op.h"

/* recv = send; device buffers (the context's backend holds them) go through ops->memcpy */
static inline tpk_status tpk__self_copy(tpk_ctx *ctx, const void *send, void *recv, size_t bytes) {
    if (send == recv || !bytes) return TPK_OK;
    if (ctx && ctx->ops && ctx->ops->device) return tpk_op_memcpy(ctx, recv, send, bytes, TPK_D2D);
    memmove(recv, send, bytes);
    return TPK_OK;
}
static inline tpk_status tpk__self_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             void *recv, size_t count, tpk_dtype dt, tpk_redop op,
                                             tpk_request *req) {
    (void)c, (void)op, (void)req;
    return tpk__self_copy(ctx, send, recv, count * tpk_dtype_size(dt));
}
static inline tpk_status tpk__self_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                              void *recv, const size_t *counts, tpk_dtype dt,
                                              tpk_request *req) {
    (void)c, (void)req;
    return tpk__self_copy(ctx, send, recv, counts[0] * tpk_dtype_size(dt));
}
static inline tpk_status tpk__self_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                                   void *recv, const size_t *counts, tpk_dtype dt,
                                                   tpk_redop op, tpk_request *req) {
    (void)c, (void)op, (void)req;
    return tpk__self_copy(ctx, send, recv, counts[0] * tpk_dtype_size(dt));
}
static inline tpk_status tpk__self_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count,
                                         tpk_dtype dt, int root, tpk_request *req) {
    (void)ctx, (void)c, (void)buf, (void)count, (void)dt, (void)root, (void)req;
    return TPK_OK;
}
static inline tpk_status tpk__self_barrier(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    (void)ctx, (void)c, (void)req;
    return TPK_OK;
}
static inline tpk_status tpk__self_wait(tpk_ctx *ctx, tpk_request *req) {
    (void)ctx, (void)req;
    return TPK_OK;
}
static inline tpk_status tpk__self_alltoallv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                             const size_t *sendcounts, void *recv,
                                             const size_t *recvcounts, tpk_dtype dt,
                                             tpk_request *req) {
    (void)c, (void)recvcounts, (void)req;
    return tpk__self_copy(ctx, send, recv, sendcounts[0] * tpk_dtype_size(dt));
}
static inline tpk_status tpk__self_split(tpk_ctx *ctx, tpk_comm *c, int color, int key,
                                         tpk_comm *out);
static inline const tpk_comm_vtable *tpk__self_vtable(void) {
    static const tpk_comm_vtable vt = {"self", TPK__COMM_TABLE(tpk__self_), NULL, NULL,
                                       tpk__self_alltoallv};
    return &vt;
}
/* A communicator of one rank on host memory (or device memory: `device`), for unsharded runs. */
static inline tpk_comm tpk_comm_self(bool device) {
    tpk_comm c;
    memset(&c, 0, sizeof c);
    c.vt = tpk__self_vtable(), c.rank = 0, c.size = 1, c.device = device;
    return c;
}
static inline tpk_status tpk__self_split(tpk_ctx *ctx, tpk_comm *c, int color, int key,
                                         tpk_comm *out) {
    (void)ctx, (void)color, (void)key;
    *out = tpk_comm_self(c->device);
    return TPK_OK;
}

#endif /* TPK_COMM_SELF_H */
