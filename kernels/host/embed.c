/* kernels/host/embed.c — the host backend's embedding.
 *
 *   embed_fwd  y[t] = E[ids[t] - v0] for ids in [v0, v0 + vrows) (others: zero or, accumulating,
 *   nothing)
 *   embed_bwd  dE[ids[t] - v0] += dy[t], tokens in order (the sums every backend reproduces)
 * Over the pool's threads (pool.c): the forward by tokens, the backward by columns, each column's
 * tokens in order: the same sums at any thread count. */
#include "vec.h"

/* ---- embedding ------------------------------------------------------------------------------ */

typedef struct embed_job {
    tpk_dtype dt;
    void *y;
    float *dE;
    const void *dy;
    const int32_t *ids;
    const float *E;
    int64_t T, H, v0, vrows;
    bool acc;
} embed_job;

/* tokens [lo, hi) */
TPK__HOST_INLINE void embed_fwd_loop(tpk_dtype dt, void *y, const int32_t *ids, const float *E,
                                     int64_t lo, int64_t hi, int64_t H, int64_t v0, int64_t vrows,
                                     bool acc) {
    for (int64_t t = lo; t < hi; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        bool in = row >= 0 && row < vrows;
        if (!in && acc) continue;
        for (int64_t j = 0; j < H; j += TPK__VL) {
            int64_t n = H - j < TPK__VL ? H - j : TPK__VL;
            size_t k = (size_t)(t * H + j), e = (size_t)(row * H + j);
            tpk__v8f v = !in            ? tpk__vsplat(0.0f)
                         : n == TPK__VL ? tpk__vld(E, TPK_F32, e)
                                        : tpk__vld_n(E, TPK_F32, e, n);
            if (acc) v += n == TPK__VL ? tpk__vld(y, dt, k) : tpk__vld_n(y, dt, k, n);
            if (n == TPK__VL) tpk__vst(y, dt, k, v);
            else tpk__vst_n(y, dt, k, v, n);
        }
    }
}
TPK__HOST_SIMD static void embed_fwd_part(void *p, int64_t lo, int64_t hi) {
    const embed_job *a = (const embed_job *)p;
    TPK__BY_DTYPE(a->dt, embed_fwd_loop, a->y, a->ids, a->E, lo, hi, a->H, a->v0, a->vrows, a->acc);
}
static tpk_status host_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table,
                                 int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt,
                                 bool accumulate) {
    (void)ctx;
    embed_job a = {dt, y, NULL, NULL, ids, table, T, H, v0, vrows, accumulate};
    tpk__host_par(T, 1 + 8192 / (H ? H : 1), embed_fwd_part, &a);
    return TPK_OK;
}
/* columns [c0, c1) of every token, tokens in order */
TPK__HOST_INLINE void embed_bwd_loop(tpk_dtype dt, float *dE, const void *dy, const int32_t *ids,
                                     int64_t T, int64_t H, int64_t v0, int64_t vrows, int64_t c0,
                                     int64_t c1) {
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - v0;
        if (row < 0 || row >= vrows) continue;
        for (int64_t j = c0; j < c1; j++) dE[row * H + j] += tpk__ld(dy, dt, (size_t)(t * H + j));
    }
}
static void embed_bwd_part(void *p, int64_t lo, int64_t hi) {
    const embed_job *a = (const embed_job *)p;
    TPK__BY_DTYPE(a->dt, embed_bwd_loop, a->dE, a->dy, a->ids, a->T, a->H, a->v0, a->vrows, lo, hi);
}
static tpk_status host_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids,
                                 int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt) {
    (void)ctx;
    embed_job a = {dt, NULL, dtable, dy, ids, NULL, T, H, v0, vrows, false};
    tpk__host_par(H, T > 64 ? 64 : H, embed_bwd_part, &a); /* few tokens: one part */
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_embed_ops(tpk_ops *o) {
    o->embed_fwd = host_embed_fwd;
    o->embed_bwd = host_embed_bwd;
}
