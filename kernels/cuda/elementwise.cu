/* kernels/cuda/elementwise.cu — the CUDA backend's elementwise ops, 16-byte vectors where aligned.
 *
 *   fill      x = value (+0: cudaMemsetAsync)     copy2d   rows as bytes (cudaMemcpy2DAsync)
 *   cast      dst = src in another dtype          axpby    y = a x + b y  (b = 0 ignores y)
 *   bias_add  y[i, j] += bias[j]                  bias_grad db[j] (+)= sum_i dy[i, j] (column sums
 *                                                 by row chunks, chunks added in order:
 *                                                 deterministic)
 *   act       one kernel per direction, the activation (tpk_act) a template parameter:
 *             GELU-tanh: y = x sigmoid(2 s (x + c x^3)),
 *                        dx = dy (sg + 2 x sg (1 - sg) s (1 + 3 c x^2));
 *             GELU:      y = x Phi(x), dx = dy (Phi(x) + x phi(x))  (erff, expf);
 *             NONE: a copy
 * f32 arithmetic, bf16 widened on load and rounded to nearest even on store. */
#include <cmath>
#include <type_traits>

#include "common.cuh"

/* ---- fill, copy2d, cast, axpby --------------------------------------------------------------- */

/* Thread j of the grid writes the 16-byte units j, j + stride, ... (VEC: x aligned), so a warp's
 * one store covers 512 contiguous bytes, whole 32-byte sectors — tpk__elementwise's 8 f32 a thread
 * are two stores 32 bytes apart, half sectors each, and a write-only stream of those ran at half
 * the copy bandwidth on an H100 (1.5 of 2.9 TB/s); then the elements past the last whole unit. */
template <class T, bool VEC> __global__ void fill_kernel(T *x, size_t n, float value) {
    constexpr int E = 16 / sizeof(T); /* elements per unit */
    alignas(16) T e[E];
    for (int k = 0; k < E; k++) tpk__stf(e, (size_t)k, value);
    size_t nu = VEC ? n / E : 0;
    uint4 u = *reinterpret_cast<const uint4 *>(e);
    TPK__GRID_STRIDE(j, nu) reinterpret_cast<uint4 *>(x)[j] = u;
    TPK__GRID_STRIDE(i, n - nu * E) x[nu * E + i] = e[0];
}
static tpk_status cuda_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    static const char *fn = "cuda.fill";
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (value == 0.0f && !std::signbit(value)) { /* +0 is all-zero bits in f32 and bf16: the copy
                                                    engine's memset */
        TPK__CUDA_TRY(ctx, fn, cudaMemsetAsync(x, 0, n * tpk_dtype_size(dt), st->stream));
        return TPK_OK;
    }
    bool vec = tpk__aligned16({x});
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            fill_kernel<T, decltype(v)::value>
                <<<tpk__grid_for(vec ? n / (16 / sizeof(T)) + 1 : n, 256), 256, 0, st->stream>>>(
                    (T *)x, n, value);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* Rows are moved as bytes (cudaMemcpy2DAsync), so every dtype (i32 too) is copied exactly. */
static tpk_status cuda_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds,
                              int64_t rows, int64_t cols, tpk_dtype dt) {
    static const char *fn = "cuda.copy2d";
    bool any = rows > 0 && cols > 0;
    if (!any || dst == src) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t es = tpk_dtype_size(dt);
    TPK__CUDA_TRY(ctx, fn,
                  cudaMemcpy2DAsync(dst, (size_t)ldd * es, src, (size_t)lds * es, (size_t)cols * es,
                                    (size_t)rows, cudaMemcpyDeviceToDevice, st->stream));
    return TPK_OK;
}

template <class D, class S, bool VEC> __global__ void cast_kernel(D *dst, const S *src, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float v[V];
        tpk__ldn<V>(src, i, v);
        tpk__stn<V>(dst, i, v);
    });
}
static tpk_status cuda_cast(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src,
                            tpk_dtype src_dt, size_t n) {
    static const char *fn = "cuda.cast";
    if (n == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (dst_dt == src_dt) {
        if (dst != src)
            TPK__CUDA_TRY(ctx, fn,
                          cudaMemcpyAsync(dst, src, n * tpk_dtype_size(dst_dt),
                                          cudaMemcpyDeviceToDevice, st->stream));
        return TPK_OK;
    }
    tpk__by_dtype(dst_dt, [&](auto dtag) {
        using D = decltype(dtag);
        tpk__by_dtype(src_dt, [&](auto stag) {
            using S = decltype(stag);
            bool vec = tpk__aligned16({dst, src});
            tpk__by_vec(vec, [&](auto v) {
                cast_kernel<D, S, decltype(v)::value>
                    <<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>((D *)dst,
                                                                            (const S *)src, n);
            });
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* y is read (b != 0) before it is written by the same thread */
template <class T, bool VEC>
__global__ void axpby_kernel(T *y, float a, const T *x, float b, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float xv[V], yv[V];
        tpk__ldn<V>(x, i, xv);
        if (b != 0.0f) tpk__ldn<V>(y, i, yv);
        for (int k = 0; k < V; k++) xv[k] = b == 0.0f ? a * xv[k] : a * xv[k] + b * yv[k];
        tpk__stn<V>(y, i, xv);
    });
}
static tpk_status cuda_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt,
                             size_t n) {
    static const char *fn = "cuda.axpby";
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        bool vec = tpk__aligned16({y, x});
        tpk__by_vec(vec, [&](auto v) {
            axpby_kernel<T, decltype(v)::value>
                <<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>((T *)y, a, (const T *)x, b,
                                                                        n);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}


/* ---- bias ------------------------------------------------------------------------------------ */

/* vectors (VEC) only when cols is a multiple of 8: the 8 elements of a vector share a row */
template <class T, bool VEC>
__global__ void bias_add_kernel(T *y, const T *bias, int64_t rows, int64_t cols) {
    tpk__elementwise<VEC>((size_t)rows * (size_t)cols, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float yv[V], bv[V];
        tpk__ldn<V>(y, i, yv);
        tpk__ldn<V>(bias, i % (size_t)cols, bv);
        for (int k = 0; k < V; k++) yv[k] += bv[k];
        tpk__stn<V>(y, i, yv);
    });
}
static tpk_status cuda_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols,
                                tpk_dtype dt) {
    static const char *fn = "cuda.bias_add";
    if (rows == 0 || cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t total = (size_t)rows * (size_t)cols;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        bool vec = cols % TPK__VEC == 0 && tpk__aligned16({y, bias});
        tpk__by_vec(vec, [&](auto v) {
            bias_add_kernel<T, decltype(v)::value>
                <<<tpk__grid_elementwise(total, vec), 256, 0, st->stream>>>((T *)y, (const T *)bias,
                                                                            rows, cols);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* element (i, j) of dy, for the column sums */
template <class T> struct dy_elem {
    const T *dy;
    int64_t cols;
    __device__ void operator()(int64_t i, int64_t j, float *v) const {
        v[0] = tpk__ldf(dy, (size_t)(i * cols + j));
    }
};
/* out[j] = sum_c part[c][j] (+ out[j]) in chunk order */
template <class T>
__global__ void colsum_final_kernel(T *out, const float *part, int64_t chunks, int64_t cols,
                                    bool accumulate) {
    TPK__GRID_STRIDE(j, (size_t)cols) {
        float s = accumulate ? tpk__ldf(out, j) : 0.0f;
        for (int64_t c = 0; c < chunks; c++) s += part[(size_t)c * (size_t)cols + j];
        tpk__stf(out, j, s);
    }
}
static tpk_status cuda_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols,
                                 tpk_dtype dt, tpk_dtype db_dt, bool accumulate) {
    static const char *fn = "cuda.bias_grad";
    if (cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    int64_t chunks = (rows + TPK__COLSUM_ROWS - 1) / TPK__COLSUM_ROWS;
    float *part = NULL;
    if (chunks)
        TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(float) * (size_t)(chunks * cols),
                                  (void **)&part));
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if (chunks) {
            dim3 grid((unsigned)((cols + 31) / 32), tpk__colsum_grid_y(chunks)), block(32, 8);
            tpk__colsum_partial_kernel<1>
                <<<grid, block, 0, st->stream>>>(dy_elem<T>{(const T *)dy, cols}, rows, cols, part);
        }
        if (db_dt == TPK_F32)
            colsum_final_kernel<float><<<tpk__grid_for((size_t)cols, 256), 256, 0, st->stream>>>(
                (float *)db, part, chunks, cols, accumulate);
        else
            colsum_final_kernel<T><<<tpk__grid_for((size_t)cols, 256), 256, 0, st->stream>>>(
                (T *)db, part, chunks, cols, accumulate);
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- activations (tpk_act): one kernel per direction, the activation a template parameter ---- */

#define GELU_S 0.7978845608028654f
#define GELU_C 0.044715f
__device__ __forceinline__ float gelu_sig(float v) {
    return 1.0f / (1.0f + expf(-2.0f * GELU_S * (v + GELU_C * v * v * v)));
}

/* act(v) and act'(v); GELU-tanh: 1 - t^2 = 4 sg (1 - sg) */
#define GELU_RSQRT2 0.7071067811865476f  /* 1 / sqrt(2) */
#define GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */
template <tpk_act A> __device__ __forceinline__ float act_value(float v) {
    if constexpr (A == TPK_ACT_GELU) return 0.5f * v * (1.0f + erff(v * GELU_RSQRT2));
    if constexpr (A == TPK_ACT_GELU_TANH) return v * gelu_sig(v);
    else return v;
}
template <tpk_act A> __device__ __forceinline__ float act_slope(float v) {
    if constexpr (A == TPK_ACT_GELU)
        return 0.5f * (1.0f + erff(v * GELU_RSQRT2)) + v * GELU_RSQRT2PI * expf(-0.5f * v * v);
    if constexpr (A == TPK_ACT_GELU_TANH) {
        float sg = gelu_sig(v);
        return sg + 2.0f * v * sg * (1.0f - sg) * GELU_S * (1.0f + 3.0f * GELU_C * v * v);
    } else {
        return 1.0f;
    }
}
template <tpk_act A, class T, bool VEC> __global__ void act_fwd_kernel(T *y, const T *x, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float v[V];
        tpk__ldn<V>(x, i, v);
        for (int k = 0; k < V; k++) v[k] = act_value<A>(v[k]);
        tpk__stn<V>(y, i, v);
    });
}
/* dy[i] is read before dx[i] is written by the same thread, so dx may alias dy. */
template <tpk_act A, class T, bool VEC>
__global__ void act_bwd_kernel(T *dx, const T *x, const T *dy, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float v[V], g[V];
        tpk__ldn<V>(x, i, v);
        tpk__ldn<V>(dy, i, g);
        for (int k = 0; k < V; k++) g[k] *= act_slope<A>(v[k]);
        tpk__stn<V>(dx, i, g);
    });
}
/* Call f(std::integral_constant<tpk_act, A>{}) for an activation other than NONE (checked by the
 * front end). */
template <class F> static inline void by_act(tpk_act act, F f) {
    switch (act) {
    case TPK_ACT_GELU_TANH: f(std::integral_constant<tpk_act, TPK_ACT_GELU_TANH>{}); break;
    case TPK_ACT_GELU: f(std::integral_constant<tpk_act, TPK_ACT_GELU>{}); break;
    default: break;
    }
}
/* act = NONE is a copy (nothing when in place) */
static tpk_status cuda_act_fwd(tpk_ctx *ctx, tpk_act act, void *y, const void *x, tpk_dtype dt,
                               size_t n) {
    static const char *fn = "cuda.act_fwd";
    TPK__CUDA_STATE(st, ctx, fn);
    if (act == TPK_ACT_NONE) {
        if (y != x)
            TPK__CUDA_TRY(ctx, fn,
                          cudaMemcpyAsync(y, x, n * tpk_dtype_size(dt), cudaMemcpyDeviceToDevice,
                                          st->stream));
        return TPK_OK;
    }
    bool vec = tpk__aligned16({y, x});
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        by_act(act, [&](auto a) {
            tpk__by_vec(vec, [&](auto v) {
                act_fwd_kernel<decltype(a)::value, T, decltype(v)::value>
                    <<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>((T *)y, (const T *)x,
                                                                            n);
            });
        });
    });
    return tpk__cuda_launched(ctx, fn);
}
/* act = NONE: dx = dy */
static tpk_status cuda_act_bwd(tpk_ctx *ctx, tpk_act act, void *dx, const void *x, const void *dy,
                               tpk_dtype dt, size_t n) {
    static const char *fn = "cuda.act_bwd";
    TPK__CUDA_STATE(st, ctx, fn);
    if (act == TPK_ACT_NONE) {
        if (dx != dy)
            TPK__CUDA_TRY(ctx, fn,
                          cudaMemcpyAsync(dx, dy, n * tpk_dtype_size(dt), cudaMemcpyDeviceToDevice,
                                          st->stream));
        return TPK_OK;
    }
    bool vec = tpk__aligned16({dx, x, dy});
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        by_act(act, [&](auto a) {
            tpk__by_vec(vec, [&](auto v) {
                act_bwd_kernel<decltype(a)::value, T, decltype(v)::value>
                    <<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>((T *)dx, (const T *)x,
                                                                            (const T *)dy, n);
            });
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_elementwise_ops(tpk_ops *o) {
    o->fill = cuda_fill;
    o->copy2d = cuda_copy2d;
    o->cast = cuda_cast;
    o->axpby = cuda_axpby;
    o->bias_add = cuda_bias_add;
    o->bias_grad = cuda_bias_grad;
    o->act_fwd = cuda_act_fwd;
    o->act_bwd = cuda_act_bwd;
}
