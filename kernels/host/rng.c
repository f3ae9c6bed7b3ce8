/* kernels/host/rng.c — the host backend's counter-based random numbers (tpk/base/rng.h:
 * Philox4x32-10).
 *
 *   rng_2d   x[i, j] = a + b draw(seed, stream, (row0 + i) gcols + col0 + j), normal or uniform
 *   dropout  y = x keep / (1-p),  keep = dropout_u(seed, stream, global index) >= p: one Philox
 *            call per 4 consecutive global indices, the masks of every backend
 * Rows over the pool's threads (pool.c): each element's draw depends on its index alone. */
#include "host_private.h"

/* ---- counter-based random numbers ------------------------------------------------------------ */

typedef struct rng_job {
    tpk_dtype dt;
    void *y;
    const void *x;
    int64_t cols, gcols, row0, col0;
    uint64_t seed, stream;
    tpk_rng_dist dist;
    float a, b, p;
} rng_job;

TPK__HOST_INLINE void rng_loop(tpk_dtype dt, void *x, int64_t lo, int64_t hi, int64_t cols,
                               int64_t gcols, int64_t row0, int64_t col0, uint64_t seed,
                               uint64_t stream, tpk_rng_dist dist, float a, float b) {
    for (int64_t i = lo; i < hi; i++)
        for (int64_t j = 0; j < cols; j++) {
            uint64_t index = (uint64_t)(row0 + i) * (uint64_t)gcols + (uint64_t)(col0 + j);
            float draw = dist == TPK_RNG_NORMAL ? tpk_rng_normal(seed, stream, index)
                                                : tpk_rng_uniform(seed, stream, index);
            tpk__st(x, dt, (size_t)(i * cols + j), a + b * draw);
        }
}
static void rng_part(void *p, int64_t lo, int64_t hi) {
    const rng_job *j = (const rng_job *)p;
    TPK__BY_DTYPE(j->dt, rng_loop, j->y, lo, hi, j->cols, j->gcols, j->row0, j->col0, j->seed,
                  j->stream, j->dist, j->a, j->b);
}
static tpk_status host_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols,
                              int64_t gcols, int64_t row0, int64_t col0, uint64_t seed,
                              uint64_t stream, tpk_rng_dist dist, float a, float b) {
    (void)ctx;
    rng_job j = {dt, x, NULL, cols, gcols, row0, col0, seed, stream, dist, a, b, 0.0f};
    tpk__host_par(rows, 1 + 4096 / (cols ? cols : 1), rng_part, &j);
    return TPK_OK;
}

/* ---- dropout ------------------------------------------------------------------------------ */

TPK__HOST_INLINE void dropout_loop(tpk_dtype dt, void *y, const void *x, int64_t lo, int64_t hi,
                                   int64_t cols, int64_t gcols, int64_t row0, int64_t col0, float p,
                                   uint64_t seed, uint64_t stream) {
    float scale = 1.0f / (1.0f - p);
    for (int64_t i = lo; i < hi; i++) {
        uint64_t g0 = (uint64_t)((row0 + i) * gcols + col0); /* the global index of (i, 0) */
        tpk_f32x4 u = tpk_rng_uniform4(seed, stream, g0 >> 2);
        for (int64_t j = 0; j < cols; j++) {
            uint64_t g = g0 + (uint64_t)j;
            if (j > 0 && (g & 3) == 0) u = tpk_rng_uniform4(seed, stream, g >> 2); /* the next 4 */
            size_t k = (size_t)(i * cols + j);
            tpk__st(y, dt, k, u.v[g & 3] >= p ? tpk__ld(x, dt, k) * scale : 0.0f);
        }
    }
}
static void dropout_part(void *p, int64_t lo, int64_t hi) {
    const rng_job *j = (const rng_job *)p;
    TPK__BY_DTYPE(j->dt, dropout_loop, j->y, j->x, lo, hi, j->cols, j->gcols, j->row0, j->col0,
                  j->p, j->seed, j->stream);
}
static tpk_status host_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols,
                               int64_t gcols, int64_t row0, int64_t col0, float p, uint64_t seed,
                               uint64_t stream, tpk_dtype dt) {
    (void)ctx;
    rng_job j = {dt, y, x, cols, gcols, row0, col0, seed, stream, TPK_RNG_UNIFORM, 0, 0, p};
    tpk__host_par(rows, 1 + 4096 / (cols ? cols : 1), dropout_part, &j);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_rng_ops(tpk_ops *o) {
    o->rng_2d = host_rng_2d;
    o->dropout = host_dropout;
}
