/* kernels/cuda/comm_self_cuda.cu — the one-rank communicator on device buffers.
 *
 * tpk_comm_self (tpk/runtime/comm_self.h) copies through the context's memcpy op; this one, for a
 * CUDA context, calls the runtime directly: every collective of one rank is a copy of the
 * rank's own block (all-reduce: send -> recv; all-gather and reduce-scatter: counts[0]
 * elements; all-to-all: sendcounts[0]), done with cudaMemcpyAsync on the backend's stream, so it
 * is ordered with the ops. */
#include "common.cuh"

static tpk_status self_copy(tpk_ctx *ctx, const char *fn, const void *send, void *recv,
                            size_t bytes) {
    if (send == recv || !bytes) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    TPK__CUDA_TRY(ctx, fn,
                  cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, st->stream));
    return TPK_OK;
}
static tpk_status self_allreduce(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                 size_t count, tpk_dtype dt, tpk_redop op, tpk_request *req) {
    (void)c, (void)op, (void)req;
    return self_copy(ctx, "tpk_allreduce (cuda self)", send, recv, count * tpk_dtype_size(dt));
}
static tpk_status self_allgatherv(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                  const size_t *counts, tpk_dtype dt, tpk_request *req) {
    (void)c, (void)req;
    return self_copy(ctx, "tpk_allgatherv (cuda self)", send, recv, counts[0] * tpk_dtype_size(dt));
}
static tpk_status self_reduce_scatterv(tpk_ctx *ctx, tpk_comm *c, const void *send, void *recv,
                                       const size_t *counts, tpk_dtype dt, tpk_redop op,
                                       tpk_request *req) {
    (void)c, (void)op, (void)req;
    return self_copy(ctx, "tpk_reduce_scatterv (cuda self)", send, recv,
                     counts[0] * tpk_dtype_size(dt));
}
static tpk_status self_alltoallv(tpk_ctx *ctx, tpk_comm *c, const void *send,
                                 const size_t *sendcounts, void *recv, const size_t *recvcounts,
                                 tpk_dtype dt, tpk_request *req) {
    (void)c, (void)recvcounts, (void)req;
    return self_copy(ctx, "tpk_alltoallv (cuda self)", send, recv,
                     sendcounts[0] * tpk_dtype_size(dt));
}
static tpk_status self_bcast(tpk_ctx *ctx, tpk_comm *c, void *buf, size_t count, tpk_dtype dt,
                             int root, tpk_request *req) {
    (void)ctx, (void)c, (void)buf, (void)count, (void)dt, (void)root, (void)req;
    return TPK_OK;
}
static tpk_status self_barrier(tpk_ctx *ctx, tpk_comm *c, tpk_request *req) {
    (void)ctx, (void)c, (void)req;
    return TPK_OK;
}
static tpk_status self_wait(tpk_ctx *ctx, tpk_request *req) {
    (void)ctx, (void)req;
    return TPK_OK;
}
static tpk_status self_split(tpk_ctx *ctx, tpk_comm *c, int color, int key, tpk_comm *out) {
    (void)ctx, (void)c, (void)color, (void)key;
    *out = tpk_comm_self_cuda();
    return TPK_OK;
}

extern "C" tpk_comm tpk_comm_self_cuda(void) {
    static const tpk_comm_vtable vt = {"cuda self", TPK__COMM_TABLE(self_), NULL, NULL,
                                       self_alltoallv};
    tpk_comm c;
    memset(&c, 0, sizeof c);
    c.vt = &vt, c.rank = 0, c.size = 1, c.device = true;
    return c;
}
