/* kernels/cuda/rows.cu — the CUDA backend's rows moved by an index: a mixture of experts'
 * permutations and combine (tpk/layers/moe.h).
 *
 *   gather_rows       a block per output row (the blocks stride over the rows), its threads over
 *                     the row's bytes in the widest unit the rows' bytes, leading dimensions and
 *                     pointers allow (16, 4 or 2 bytes): any dtype, exactly; zeros for an index
 *                     outside [0, xrows)
 *   scatter_add_rows  the segmented scatter: a stable radix sort of the entries by destination
 *                     (out-of-range ones sort last), then a block per destination row finds its
 *                     run of entries by binary search and adds their rows in entry order, each
 *                     column by one thread — the host's sums bit for bit, no atomics; every row
 *                     written once (zeros where no entry names it)
 *   moe_combine_fwd   a block per token: each column's kept terms w o, i ascending, products and
 *                     sums rounded separately (__fmul_rn, __fadd_rn: no FMA), the host's bits
 *   moe_combine_bwd   dw: a block per entry, its dot product over the columns in the block's
 *                     fixed order (threads' partial sums, then tpk__block_sum); dout: the
 *                     segmented scatter of the terms w[e] dy[e / K]
 * Columns 8 a thread in 16-byte vectors where the width is a multiple of 8 and the rows 16-byte
 * aligned, one otherwise. The indices are not trusted: one outside its range names no row. */
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

/* threads of a block over a row of n units: enough for the row, 32 to 256 */
static int rows_block(int64_t n) {
    int64_t b = (n + 31) / 32 * 32;
    return (int)(b < 32 ? 32 : b > 256 ? 256 : b);
}
/* the grid of a loop over n rows, a block each (the blocks stride over more) */
static unsigned rows_grid(int64_t n) { return tpk__grid_for((size_t)(n > 0 ? n : 1), 1); }
/* 16-byte vectors of 8 elements: cols and the leading dimensions multiples of 8, the pointers
 * 16-byte aligned */
static bool rows_vec(int64_t cols, int64_t ld1, int64_t ld2,
                     std::initializer_list<const void *> ps) {
    return cols % TPK__VEC == 0 && ld1 % TPK__VEC == 0 && ld2 % TPK__VEC == 0 && tpk__aligned16(ps);
}

/* ---- gather_rows ----------------------------------------------------------------------------- */

/* y[i] = x[idx[i]] or zeros, as units U (rows of nu units; leading dimensions in units) */
template <class U>
__global__ void gather_kernel(U *y, int64_t ldy, const U *x, int64_t ldx, int64_t xrows,
                              const int32_t *idx, int64_t rows, int64_t nu) {
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        int64_t r = idx[i];
        bool in = r >= 0 && r < xrows;
        U *yi = y + (size_t)i * (size_t)ldy;
        const U *xr = x + (size_t)(in ? r : 0) * (size_t)ldx;
        for (int64_t u = threadIdx.x; u < nu; u += blockDim.x) yi[u] = in ? xr[u] : U{};
    }
}
static tpk_status cuda_gather_rows(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                                   int64_t xrows, const int32_t *idx, int64_t rows, int64_t cols,
                                   tpk_dtype dt) {
    static const char *fn = "cuda.gather_rows";
    if (rows == 0 || cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t es = tpk_dtype_size(dt), rb = (size_t)cols * es, yb = (size_t)ldy * es,
           xb = (size_t)ldx * es;
    auto fits = [&](size_t u) {
        return rb % u == 0 && yb % u == 0 && xb % u == 0 && (uintptr_t)y % u == 0 &&
               (uintptr_t)x % u == 0;
    };
    size_t u = fits(16) ? 16 : fits(4) ? 4 : 2; /* es >= 2: 2 always fits */
    int64_t nu = (int64_t)(rb / u);
    dim3 grid(rows_grid(rows)), block(rows_block(nu));
    if (u == 16)
        gather_kernel<uint4><<<grid, block, 0, st->stream>>>((uint4 *)y, (int64_t)(yb / u),
                                                             (const uint4 *)x, (int64_t)(xb / u),
                                                             xrows, idx, rows, nu);
    else if (u == 4)
        gather_kernel<uint32_t>
            <<<grid, block, 0, st->stream>>>((uint32_t *)y, (int64_t)(yb / u), (const uint32_t *)x,
                                             (int64_t)(xb / u), xrows, idx, rows, nu);
    else
        gather_kernel<uint16_t>
            <<<grid, block, 0, st->stream>>>((uint16_t *)y, (int64_t)(yb / u), (const uint16_t *)x,
                                             (int64_t)(xb / u), xrows, idx, rows, nu);
    return tpk__cuda_launched(ctx, fn);
}

/* ---- the segmented scatter: scatter_add_rows and moe_combine_bwd's dout ---------------------- */

/* key[e] = idx[e] where it names a row of y, else yrows (sorts after every row); val[e] = e */
static __global__ void seg_keys_kernel(uint32_t *key, uint32_t *val, const int32_t *idx, int64_t n,
                                       int64_t yrows) {
    TPK__GRID_STRIDE(e, (size_t)n) {
        int64_t r = idx[e];
        key[e] = r >= 0 && r < yrows ? (uint32_t)r : (uint32_t)yrows;
        val[e] = (uint32_t)e;
    }
}
/* the first position of key[0, n) (sorted) holding a value >= r */
__device__ __forceinline__ int64_t seg_lower(const uint32_t *key, int64_t n, uint32_t r) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (key[mid] < r) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
/* Row r of y, a block each: its run [lo, hi) of the sorted entries; y[r] = (acc ? y[r] : the
 * first term) + the next terms in entry order, a term src[e / rep] times w[e] (w NULL: 1), each
 * column by one thread (VEC: 8 a thread); zeros where the run is empty (acc: left alone). */
template <class T, bool VEC>
__global__ void seg_rows_kernel(T *y, int64_t ldy, int64_t yrows, const T *src, int64_t ldx,
                                const uint32_t *key, const uint32_t *ent, int64_t n, int64_t rep,
                                const float *w, int64_t cols, bool acc) {
    constexpr int N = VEC ? TPK__VEC : 1;
    for (int64_t r = blockIdx.x; r < yrows; r += gridDim.x) {
        int64_t lo = seg_lower(key, n, (uint32_t)r), hi = seg_lower(key, n, (uint32_t)r + 1u);
        if (lo == hi && acc) continue; /* uniform over the block */
        size_t yr = (size_t)r * (size_t)ldy;
        for (int64_t c = threadIdx.x; c < cols / N; c += blockDim.x) {
            float v[N], t[N];
            if (acc) tpk__ldn<N>(y, yr + (size_t)c * N, v);
            else
                for (int q = 0; q < N; q++) v[q] = 0.0f;
            for (int64_t s = lo; s < hi; s++) {
                int64_t e = ent[s];
                tpk__ldn<N>(src, (size_t)(e / rep) * (size_t)ldx + (size_t)c * N, t);
                float we = w ? w[e] : 1.0f;
                for (int q = 0; q < N; q++) {
                    float term = w ? __fmul_rn(t[q], we) : t[q];
                    v[q] = s == lo && !acc ? term : __fadd_rn(v[q], term);
                }
            }
            tpk__stn<N>(y, yr + (size_t)c * N, v);
        }
    }
}
/* y [yrows, cols] (ldy) from the n entries' terms (see seg_rows_kernel): the keys, their stable
 * sort, the rows */
static tpk_status seg_scatter(tpk_ctx *ctx, const char *fn, void *y, int64_t ldy, int64_t yrows,
                              const void *src, int64_t ldx, const int32_t *idx, int64_t n,
                              int64_t rep, const float *w, int64_t cols, tpk_dtype dt, bool acc) {
    if (yrows == 0 || cols == 0 || (n == 0 && acc)) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "rows", n, INT_MAX, "entries of one radix sort"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "yrows", yrows, (int64_t)UINT32_MAX - 1, "32-bit sort keys"));
    TPK__CUDA_STATE(st, ctx, fn);
    int end_bit = 1;
    while (end_bit < 32 && ((uint64_t)1 << end_bit) <= (uint64_t)yrows) end_bit++;
    size_t m = (size_t)n, sort_bytes = 0;
    uint32_t *k_out = NULL, *v_out = NULL;
    if (n > 0) {
        cudaError_t e = cub::DeviceRadixSort::SortPairs(
            NULL, sort_bytes, (uint32_t *)NULL, (uint32_t *)NULL, (uint32_t *)NULL,
            (uint32_t *)NULL, (int)n, 0, end_bit, st->stream);
        if (e != cudaSuccess)
            return tpk__cuda_err(ctx, fn, "cub::DeviceRadixSort::SortPairs (size query)", e);
        size_t keys_bytes = (4 * m * sizeof(uint32_t) + 255) / 256 * 256;
        char *scratch;
        TPK_TRY(tpk__cuda_scratch(ctx, fn, st, keys_bytes + sort_bytes, (void **)&scratch));
        uint32_t *k_in = (uint32_t *)scratch, *v_in = k_in + m;
        k_out = v_in + m, v_out = k_out + m;
        seg_keys_kernel<<<tpk__grid_for(m, 256), 256, 0, st->stream>>>(k_in, v_in, idx, n, yrows);
        TPK_TRY(tpk__cuda_launched(ctx, fn));
        /* LSD radix sort is stable: a destination's entries keep their order */
        e = cub::DeviceRadixSort::SortPairs(scratch + keys_bytes, sort_bytes, k_in, k_out, v_in,
                                            v_out, (int)n, 0, end_bit, st->stream);
        if (e != cudaSuccess) return tpk__cuda_err(ctx, fn, "cub::DeviceRadixSort::SortPairs", e);
    }
    bool vec = rows_vec(cols, ldy, ldx, {y, src});
    int block = rows_block(vec ? cols / TPK__VEC : cols);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            seg_rows_kernel<Tt, decltype(v)::value><<<rows_grid(yrows), block, 0, st->stream>>>(
                (Tt *)y, ldy, yrows, (const Tt *)src, ldx, k_out, v_out, n, rep, w, cols, acc);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_scatter_add_rows(tpk_ctx *ctx, void *y, int64_t ldy, int64_t yrows,
                                        const void *x, int64_t ldx, const int32_t *idx,
                                        int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate) {
    return seg_scatter(ctx, "cuda.scatter_add_rows", y, ldy, yrows, x, ldx, idx, rows, 1, NULL,
                       cols, dt, accumulate);
}

/* ---- moe_combine_fwd, moe_combine_bwd -------------------------------------------------------- */

/* token t, a block each: y[t] = its kept entries' w o-rows, i ascending; zeros when none */
template <class T, bool VEC>
__global__ void combine_fwd_kernel(T *y, const T *o, int64_t orows, const int32_t *row,
                                   const float *w, int64_t T_, int64_t K, int64_t H) {
    constexpr int N = VEC ? TPK__VEC : 1;
    for (int64_t t = blockIdx.x; t < T_; t += gridDim.x)
        for (int64_t c = threadIdx.x; c < H / N; c += blockDim.x) {
            float v[N], p[N];
            for (int q = 0; q < N; q++) v[q] = 0.0f;
            bool first = true;
            for (int64_t i = 0; i < K; i++) {
                int64_t r = row[t * K + i];
                if (r < 0 || r >= orows) continue;
                float wi = w[t * K + i];
                tpk__ldn<N>(o, (size_t)r * (size_t)H + (size_t)c * N, p);
                for (int q = 0; q < N; q++) {
                    float term = __fmul_rn(p[q], wi);
                    v[q] = first ? term : __fadd_rn(v[q], term);
                }
                first = false;
            }
            tpk__stn<N>(y, (size_t)t * (size_t)H + (size_t)c * N, v);
        }
}
static tpk_status cuda_moe_combine_fwd(tpk_ctx *ctx, void *y, const void *o, int64_t orows,
                                       const int32_t *row, const float *w, int64_t T, int64_t K,
                                       int64_t H, tpk_dtype dt) {
    static const char *fn = "cuda.moe_combine_fwd";
    if (T == 0 || H == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    bool vec = rows_vec(H, H, H, {y, o});
    int block = rows_block(vec ? H / TPK__VEC : H);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            combine_fwd_kernel<Tt, decltype(v)::value><<<rows_grid(T), block, 0, st->stream>>>(
                (Tt *)y, (const Tt *)o, orows, row, w, T, K, H);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* entry e, a block each: dw[e] = dy[e / K] . o[row[e]] (0 when dropped), each thread's columns
 * summed in order, then the block's sum (a fixed tree) */
template <class T, bool VEC>
__global__ void combine_dw_kernel(float *dw, const T *dy, const T *o, int64_t orows,
                                  const int32_t *row, int64_t n, int64_t K, int64_t H) {
    constexpr int N = VEC ? TPK__VEC : 1;
    __shared__ float sh[32];
    for (int64_t e = blockIdx.x; e < n; e += gridDim.x) {
        int64_t r = row[e];
        bool in = r >= 0 && r < orows; /* uniform over the block */
        float s = 0.0f;
        for (int64_t c = threadIdx.x; in && c < H / N; c += blockDim.x) {
            float a[N], b[N];
            tpk__ldn<N>(dy, (size_t)(e / K) * (size_t)H + (size_t)c * N, a);
            tpk__ldn<N>(o, (size_t)r * (size_t)H + (size_t)c * N, b);
            for (int q = 0; q < N; q++) s = __fadd_rn(s, __fmul_rn(a[q], b[q]));
        }
        s = tpk__block_sum(s, sh);
        if (threadIdx.x == 0) dw[e] = in ? s : 0.0f;
    }
}
static tpk_status cuda_moe_combine_bwd(tpk_ctx *ctx, float *dw, void *dout, const void *dy,
                                       const void *o, int64_t orows, const int32_t *row,
                                       const float *w, int64_t T, int64_t K, int64_t H,
                                       tpk_dtype dt) {
    static const char *fn = "cuda.moe_combine_bwd";
    int64_t n = T * K;
    if (n > 0) {
        TPK__CUDA_STATE(st, ctx, fn);
        bool vec = rows_vec(H, H, H, {dy, o});
        int block = rows_block(vec ? H / TPK__VEC : H);
        tpk__by_dtype(dt, [&](auto tag) {
            using Tt = decltype(tag);
            tpk__by_vec(vec, [&](auto v) {
                combine_dw_kernel<Tt, decltype(v)::value><<<rows_grid(n), block, 0, st->stream>>>(
                    dw, (const Tt *)dy, (const Tt *)o, orows, row, n, K, H);
            });
        });
        TPK_TRY(tpk__cuda_launched(ctx, fn));
    }
    return seg_scatter(ctx, fn, dout, H, orows, dy, H, row, n, K, w, H, dt, false);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_rows_ops(tpk_ops *o) {
    o->gather_rows = cuda_gather_rows;
    o->scatter_add_rows = cuda_scatter_add_rows;
    o->moe_combine_fwd = cuda_moe_combine_fwd;
    o->moe_combine_bwd = cuda_moe_combine_bwd;
}
