/* kernels/host/embed.c — the host backend's embedding.
 *
 *   embed_fwd  y[t] = E[ids[t] - v0] for ids in [v0, v0 + vrows) (others: zero or, accumulating,
 *   nothing)
 *   embed_bwd  dE[ids[t] - v0] += dy[t], tokens in order (the sums every backend reproduces) */
#include "host_private.h"

/* ---- embedding ------------------------------------------------------------------------------ */

TPK__HOST_INLINE void embed_fwd_loop(tpk_dtype dt, void *y, const int32_t *ids, const float *E,
                                     int64_t T, int64_t H, int64_t v0, int64_t vrows, bool acc) {
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        bool in = row >= 0 && row < vrows;
        for (int64_t j = 0; j < H; j++) {
            size_t k = (size_t)(t * H + j);
            float e = in ? E[row * H + j] : 0.0f;
            tpk__st(y, dt, k, acc ? tpk__ld(y, dt, k) + e : e);
        }
    }
}
static tpk_status host_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table,
                                 int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt,
                                 bool accumulate) {
    (void)ctx;
    TPK__BY_DTYPE(dt, embed_fwd_loop, y, ids, table, T, H, v0, vrows, accumulate);
    return TPK_OK;
}
TPK__HOST_INLINE void embed_bwd_loop(tpk_dtype dt, float *dE, const void *dy, const int32_t *ids,
                                     int64_t T, int64_t H, int64_t v0, int64_t vrows) {
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        if (row < 0 || row >= vrows) continue;
        for (int64_t j = 0; j < H; j++) dE[row * H + j] += tpk__ld(dy, dt, (size_t)(t * H + j));
    }
}
static tpk_status host_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids,
                                 int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt) {
    (void)ctx;
    TPK__BY_DTYPE(dt, embed_bwd_loop, dtable, dy, ids, T, H, v0, vrows);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_embed_ops(tpk_ops *o) {
    o->embed_fwd = host_embed_fwd;
    o->embed_bwd = host_embed_bwd;
}
