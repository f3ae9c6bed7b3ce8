/* kernels/cuda/rng.cu — the CUDA backend's counter-based random numbers (tpk/base/rng.h:
 * Philox4x32-10).
 *
 *   rng_2d     x[i, j] = a + b draw(seed, stream, (row0 + i) gcols + col0 + j)   (tpk/base/rng.h)
 *   dropout    y = x keep / (1-p),  keep = dropout_u(seed, stream, global index) >= p: one Philox
 *   call
 *              per 4 consecutive global indices, a thread taking 8 elements (two calls) where the
 *              geometry is aligned, else one call's part of a row */
#include <type_traits>

#include "common.cuh"

/* ---- counter-based random numbers ------------------------------------------------------------ */

template <class T>
__global__ void rng_kernel(T *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                           int64_t col0, uint64_t seed, uint64_t stream, int normal, float a,
                           float b) {
    size_t total = (size_t)rows * (size_t)cols;
    TPK__GRID_STRIDE(t, total) {
        int64_t i = (int64_t)(t / (size_t)cols), j = (int64_t)(t % (size_t)cols);
        uint64_t index = (uint64_t)(row0 + i) * (uint64_t)gcols + (uint64_t)(col0 + j);
        float draw =
            normal ? tpk_rng_normal(seed, stream, index) : tpk_rng_uniform(seed, stream, index);
        tpk__stf(x, t, a + b * draw);
    }
}
static tpk_status cuda_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols,
                              int64_t gcols, int64_t row0, int64_t col0, uint64_t seed,
                              uint64_t stream, tpk_rng_dist dist, float a, float b) {
    static const char *fn = "cuda.rng_2d";
    if (rows == 0 || cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t total = (size_t)rows * (size_t)cols;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        rng_kernel<T><<<tpk__grid_for(total, 256), 256, 0, st->stream>>>(
            (T *)x, rows, cols, gcols, row0, col0, seed, stream, dist == TPK_RNG_NORMAL, a, b);
    });
    return tpk__cuda_launched(ctx, fn);
}


/* ---- dropout --------------------------------------------------------------------------------- */

/* One Philox call per 4 consecutive global indices (tpk/base/rng.h: index x takes output x % 4 of
 * call x / 4). VEC (x, y 16-byte aligned; cols, gcols and col0 multiples of 4, so local elements 4k
 * .. 4k + 3 are one call's 4): a thread takes 8 elements — two calls, one 16-byte vector of bf16 or
 * two of f32 — the last n % 8 one by one (tpk_dropout_u). Otherwise a thread takes one call's part
 * of one row: item (i, q) is call q of row i counted from the one holding (i, 0), up to
 * (cols + 6) / 4 per row (items past the row's end do nothing). SMALL (rows x cols < 2^32): element
 * k's row and column by a 32-bit division — the 64-bit one is a call of some 60 instructions, as
 * many as a Philox call's share of 8 bf16 elements, and held bf16 dropout at 70% of copy
 * bandwidth. */
template <class T, bool VEC, bool SMALL>
__global__ void dropout_kernel(T *y, const T *x, int64_t rows, int64_t cols, int64_t gcols,
                               int64_t row0, int64_t col0, float p, uint64_t seed,
                               uint64_t stream) {
    float scale = 1.0f / (1.0f - p);
    if constexpr (VEC) {
        tpk__elementwise<true>((size_t)rows * (size_t)cols, [&](size_t k, auto vn) {
            constexpr int V = decltype(vn)::value;
            int64_t i, j; /* element k = (i, j) */
            if constexpr (SMALL)
                i = (uint32_t)k / (uint32_t)cols, j = (uint32_t)k - (uint32_t)i * (uint32_t)cols;
            else i = (int64_t)(k / (size_t)cols), j = (int64_t)(k - (size_t)i * (size_t)cols);
            uint64_t g = (uint64_t)((row0 + i) * gcols + col0 + j); /* its global index */
            float v[V];
            tpk__ldn<V>(x, k, v);
            if constexpr (V == 1) {
                v[0] = tpk_dropout_u(seed, stream, g) >= p ? v[0] * scale : 0.0f;
            } else {
                for (int h = 0; h < V / 4; h++) { /* elements k + 4h .. + 3: one call, from a
                                                     multiple of 4 */
                    /* the second 4 start the next row */
                    if (h && j + 4 >= cols) g += (uint64_t)(gcols - cols);
                    tpk_f32x4 u = tpk_rng_uniform4(seed, stream, (g + 4 * (uint64_t)h) >> 2);
                    for (int e = 0; e < 4; e++)
                        v[4 * h + e] = u.v[e] >= p ? v[4 * h + e] * scale : 0.0f;
                }
            }
            tpk__stn<V>(y, k, v);
        });
    } else {
        int64_t per_row = (cols + 6) / 4;
        TPK__GRID_STRIDE(it, (size_t)rows * (size_t)per_row) {
            int64_t i = (int64_t)(it / (size_t)per_row),
                    q = (int64_t)(it - (size_t)i * (size_t)per_row);
            uint64_t first = (uint64_t)((row0 + i) * gcols + col0),
                     g = ((first >> 2) + (uint64_t)q) << 2; /* (i, 0); the call's first index */
            if (g >= first + (uint64_t)cols) continue;
            tpk_f32x4 u = tpk_rng_uniform4(seed, stream, g >> 2);
            for (int e = 0; e < 4; e++) {
                if (g + e < first || g + e >= first + (uint64_t)cols) continue;
                size_t k = (size_t)(i * cols) + (size_t)(g + e - first);
                tpk__stf(y, k, u.v[e] >= p ? tpk__ldf(x, k) * scale : 0.0f);
            }
        }
    }
}
static tpk_status cuda_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols,
                               int64_t gcols, int64_t row0, int64_t col0, float p, uint64_t seed,
                               uint64_t stream, tpk_dtype dt) {
    static const char *fn = "cuda.dropout";
    if (rows * cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t total = (size_t)rows * (size_t)cols;
    bool vec = tpk__aligned16({y, x}) && cols % 4 == 0 && gcols % 4 == 0 && col0 % 4 == 0;
    unsigned grid = vec ? tpk__grid_elementwise(total, true)
                        : tpk__grid_for((size_t)rows * (size_t)((cols + 6) / 4), 256);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            constexpr bool V = decltype(v)::value;
            auto kernel = total < ((size_t)1 << 32) ? dropout_kernel<T, V, true>
                                                    : dropout_kernel<T, V, false>;
            kernel<<<grid, 256, 0, st->stream>>>((T *)y, (const T *)x, rows, cols, gcols, row0,
                                                 col0, p, seed, stream);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_rng_ops(tpk_ops *o) {
    o->rng_2d = cuda_rng_2d;
    o->dropout = cuda_dropout;
}
