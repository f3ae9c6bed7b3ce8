/* kernels/cuda/rope_swiglu.cu — the CUDA backend's rotary embedding and SwiGLU (Llama).
 *
 *   rope       one thread per (row, head, pair j < D/2): (x_j, x_{j+D/2}) rotated by
 *              s theta^(-2j/D), s = row mod S, the angle in double as the host; y may be x
 *   rope_at    the same at s = pos[row mod npos] (an int32 table in device memory: context
 *              parallelism's rows at their true positions)
 *   swiglu     one thread per (row, j < F): h = silu(gate) up; backward dgate, dup written after
 *              both inputs are read (dgu may be gu) */
#include <cmath>

#include "common.cuh"

/* ---- rotary embedding, SwiGLU ---------------------------------------------------------------- */

/* one thread per (row, head, pair j < D/2): the angle in double, as the host; row i at position
 * i mod S, or pos[i mod S] where pos is not NULL (rope_at, S = npos) */
template <class T>
__global__ void rope_kernel(T *y, int64_t ldy, const T *x, int64_t ldx, int64_t rows,
                            const int32_t *pos, int64_t S, int64_t heads, int64_t D, float theta,
                            bool inverse) {
    int64_t half = D / 2;
    TPK__GRID_STRIDE(k, (size_t)(rows * heads * half)) {
        int64_t j = (int64_t)(k % (size_t)half), h = (int64_t)(k / (size_t)half % (size_t)heads),
                i = (int64_t)(k / (size_t)(half * heads));
        int64_t s = pos ? (int64_t)pos[i % S] : i % S;
        double a = (double)s * pow((double)theta, -2.0 * (double)j / (double)D);
        float c = (float)cos(a), n = inverse ? -(float)sin(a) : (float)sin(a);
        size_t xi = (size_t)(i * ldx + h * D + j), yi = (size_t)(i * ldy + h * D + j);
        float x1 = tpk__ldf(x, xi), x2 = tpk__ldf(x, xi + half);
        tpk__stf(y, yi, x1 * c - x2 * n);
        tpk__stf(y, yi + half, x2 * c + x1 * n);
    }
}
static tpk_status rope_launch(tpk_ctx *ctx, const char *fn, void *y, int64_t ldy, const void *x,
                              int64_t ldx, int64_t rows, const int32_t *pos, int64_t S,
                              int64_t heads, int64_t D, float theta, bool inverse, tpk_dtype dt) {
    size_t n = (size_t)(rows * heads * (D / 2));
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        rope_kernel<T><<<tpk__grid_for(n, 256), 256, 0, st->stream>>>(
            (T *)y, ldy, (const T *)x, ldx, rows, pos, S, heads, D, theta, inverse);
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_rope(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                            int64_t rows, int64_t S, int64_t heads, int64_t D, float theta,
                            bool inverse, tpk_dtype dt) {
    return rope_launch(ctx, "cuda.rope", y, ldy, x, ldx, rows, NULL, S, heads, D, theta, inverse,
                       dt);
}
static tpk_status cuda_rope_at(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                               int64_t rows, const int32_t *pos, int64_t npos, int64_t heads,
                               int64_t D, float theta, bool inverse, tpk_dtype dt) {
    return rope_launch(ctx, "cuda.rope_at", y, ldy, x, ldx, rows, pos, npos, heads, D, theta,
                       inverse, dt);
}

/* SwiGLU, one thread per (row, j < F): forward h = silu(g) u; backward (dh given) dg, du written
 * after both inputs are read (dgu may be gu) */
template <class T>
__global__ void swiglu_kernel(T *out, const T *gu, const T *dh, int64_t rows, int64_t F) {
    TPK__GRID_STRIDE(k, (size_t)(rows * F)) {
        int64_t i = (int64_t)(k / (size_t)F), j = (int64_t)(k % (size_t)F);
        size_t a = (size_t)(i * 2 * F + j);
        float g = tpk__ldf(gu, a), u = tpk__ldf(gu, a + F), sg = 1.0f / (1.0f + expf(-g));
        if (!dh) {
            tpk__stf(out, k, g * sg * u);
            continue;
        }
        float d = tpk__ldf(dh, k);
        tpk__stf(out, a, d * u * sg * (1.0f + g * (1.0f - sg)));
        tpk__stf(out, a + F, d * g * sg);
    }
}
static tpk_status swiglu_launch(tpk_ctx *ctx, const char *fn, void *out, const void *gu,
                                const void *dh, int64_t rows, int64_t F, tpk_dtype dt) {
    size_t n = (size_t)(rows * F);
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        swiglu_kernel<T><<<tpk__grid_for(n, 256), 256, 0, st->stream>>>((T *)out, (const T *)gu,
                                                                        (const T *)dh, rows, F);
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_swiglu_fwd(tpk_ctx *ctx, void *h, const void *gu, int64_t rows, int64_t F,
                                  tpk_dtype dt) {
    return swiglu_launch(ctx, "cuda.swiglu_fwd", h, gu, NULL, rows, F, dt);
}
static tpk_status cuda_swiglu_bwd(tpk_ctx *ctx, void *dgu, const void *gu, const void *dh,
                                  int64_t rows, int64_t F, tpk_dtype dt) {
    return swiglu_launch(ctx, "cuda.swiglu_bwd", dgu, gu, dh, rows, F, dt);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_rope_swiglu_ops(tpk_ops *o) {
    o->rope = cuda_rope;
    o->rope_at = cuda_rope_at;
    o->swiglu_fwd = cuda_swiglu_fwd;
    o->swiglu_bwd = cuda_swiglu_bwd;
}
