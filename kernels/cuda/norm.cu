/* kernels/cuda/norm.cu — the CUDA backend's layernorm and RMSNorm.
 *
 *   layernorm  y = (x - mean) rstd w + b, rstd = 1/sqrt(var + eps), the variance around the mean;
 *              dx = rstd (g - mean(g) - xh mean(g xh)), g = dy w; dw += sum_i dy xh, db += sum_i
 *              dy. Rows of a multiple of 8 up to 4096, 16-byte aligned: a team of 1, 2 or 4 warps
 *              holds a row in registers (16-byte loads, read once; the mean, then the variance from
 *              the registers); the backward's team also adds the row's (dy xh, dy) into its
 *              threads' column partials in registers, per chunk of 12 rows (a block), and the
 *              chunks' partials are summed in parallel in a fixed order (column-sum kernel, then a
 *              final pass). Other rows: one warp per row re-reading the row from the cache, dw and
 *              db by the column-sum kernels
 *   rmsnorm    the same kernels with the template parameter RMS: the mean taken as 0 (not
 *              computed, saved or read), no bias (db untouched), dx = rstd (g - xh mean(g xh)) */
#include <type_traits>

#include "common.cuh"

/* ---- layernorm, RMSNorm ---------------------------------------------------------------------- */

/* One set of kernels for both norms: RMS (RMSNorm) takes the mean as 0 (neither computed, nor
 * saved, nor read), has no bias (b, db untouched) and drops the mean(g) term of dx — the host's
 * ln_fwd_loop / ln_bwd_loop with their `rms` flag, as a template parameter.
 *
 * Rows whose width is a multiple of 8, with every pointer 16-byte aligned, up to LN_VEC_COLS wide
 * (the common case: GPT-2's 768 and 1024, Llama's 4096) take the register kernels: a team of TW
 * warps (1, 2 or 4; ln_team) holds a row in registers, thread u of the team the 8-element vectors
 * starting at columns 8 (k 32 TW + u), k < NV (NV <= 4), loaded and stored 16 bytes at a time, read
 * from memory once. Other rows take the generic kernels (one element per lane, the row re-read
 * from the cache). */
enum { LN_WARPS = 4, LN_NV = 4, LN_VEC_COLS = 32 * 4 * 8 * LN_NV };

/* the team of a row of cols (VEC kernels): the fewest warps whose threads hold the row in at most
 * LN_NV vectors each, and that many vectors */
struct ln_team {
    int tw, nv;
};
static ln_team ln_team_for(int64_t cols) {
    int tw = cols <= 32 * 8 * LN_NV ? 1 : cols <= 2 * 32 * 8 * LN_NV ? 2 : 4;
    int64_t nv = (cols + 32 * 8 * tw - 1) / (32 * 8 * tw);
    return ln_team{tw, nv < 1 ? 1 : (int)nv};
}
/* f(std::integral_constant<int, NV>) */
template <class F> static void ln_by_nv(int nv, F f) {
    switch (nv) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
    }
}
/* The sum of v over the team of tw warps (warps tw q .. tw q + tw - 1 of the block), in every
 * thread: the warps' sums by butterflies, then (tw > 1) through sh[LN_WARPS] in warp order. A
 * barrier when tw > 1 (tw is the same in the whole block); a later call must use another sh, or
 * come after another barrier, before it writes sh again. */
__device__ __forceinline__ float ln_team_sum(float v, float *sh, int tw) {
    v = tpk__warp_sum(v);
    if (tw == 1) return v;
    int w = threadIdx.x >> 5, w0 = w / tw * tw;
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    float s = 0.0f;
    for (int q = 0; q < tw; q++) s += sh[w0 + q];
    return s;
}
/* 8 f32 at p (16-byte aligned) */
__device__ __forceinline__ void ln_ld8f(const float *p, float *v) {
    float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* Forward, the row in registers: mean, then the variance around it from the registers (the host's
 * two passes: no cancellation, as sum and sum of squares would suffer when |mean| >> std, and no
 * Welford merge per element), then y. With r (the fused residual): x1 = x + r is written and the
 * row kept rounded to T, as the host stores and reads it back. Block LN_WARPS warps, LN_WARPS / tw
 * rows. */
template <class T, bool RMS, int NV>
__global__ void __launch_bounds__(32 * LN_WARPS)
    ln_fwd_vec_kernel(T *y, float *mean, float *rstd, const T *x, const float *w, const float *b,
                      int64_t rows, int cols, float eps, T *x1, const T *r, int tw) {
    __shared__ float sh[2][LN_WARPS];
    int nt = 32 * tw, q = threadIdx.x / nt, u = threadIdx.x - q * nt;
    int64_t i = (int64_t)blockIdx.x * (LN_WARPS / tw) + q;
    bool live = i < rows; /* no early return: the team's barriers */
    size_t o = (size_t)(live ? i : 0) * (size_t)cols;
    float v[NV][8], s = 0.0f;
    for (int k = 0; k < NV; k++) {
        int c = (k * nt + u) * 8;
        for (int e = 0; e < 8; e++) v[k][e] = 0.0f;
        if (live && c < cols) {
            tpk__ldn<8>(x, o + c, v[k]);
            if (r) {
                float a[8];
                tpk__ldn<8>(r, o + c, a);
                for (int e = 0; e < 8; e++) v[k][e] = tpk__round<T>(v[k][e] + a[e]);
                tpk__stn<8>(x1, o + c, v[k]);
            }
        }
        for (int e = 0; e < 8; e++) s += v[k][e];
    }
    float m = RMS ? 0.0f : ln_team_sum(s, sh[0], tw) / (float)cols, s2 = 0.0f;
    for (int k = 0; k < NV; k++)
        if ((k * nt + u) * 8 < cols)
            for (int e = 0; e < 8; e++) s2 += (v[k][e] - m) * (v[k][e] - m);
    float rs = rsqrtf(ln_team_sum(s2, sh[1], tw) / (float)cols + eps);
    for (int k = 0; k < NV; k++) {
        int c = (k * nt + u) * 8;
        if (!live || c >= cols) continue;
        float wv[8], bv[8];
        ln_ld8f(w + c, wv);
        if (!RMS) ln_ld8f(b + c, bv);
        for (int e = 0; e < 8; e++) v[k][e] = (v[k][e] - m) * rs * wv[e] + (RMS ? 0.0f : bv[e]);
        tpk__stn<8>(y, o + c, v[k]);
    }
    if (live && u == 0) {
        if (!RMS) mean[i] = m;
        rstd[i] = rs;
    }
}
/* Forward, any row: one warp per row, mean, then the variance around it (two passes over the row,
 * as the host), then y; with r, x1 = x + r is written first and each lane reads back only what it
 * wrote. */
template <class T, bool RMS>
__global__ void ln_fwd_kernel(T *y, float *mean, float *rstd, const T *x, const float *w,
                              const float *b, int64_t rows, int64_t cols, float eps, T *x1,
                              const T *r) {
    int64_t i = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (i >= rows) return;
    size_t o = (size_t)i * (size_t)cols;
    if (r) {
        for (int64_t j = lane; j < cols; j += 32)
            tpk__stf(x1, o + j, tpk__ldf(x, o + j) + tpk__ldf(r, o + j));
        x = x1;
    }
    float m = 0.0f, s2 = 0.0f;
    if (!RMS) {
        float s = 0.0f;
        for (int64_t j = lane; j < cols; j += 32) s += tpk__ldf(x, o + j);
        m = tpk__warp_sum(s) / (float)cols;
    }
    for (int64_t j = lane; j < cols; j += 32) {
        float d = tpk__ldf(x, o + j) - m;
        s2 += d * d;
    }
    float rs = rsqrtf(tpk__warp_sum(s2) / (float)cols + eps);
    for (int64_t j = lane; j < cols; j += 32)
        tpk__stf(y, o + j, (tpk__ldf(x, o + j) - m) * rs * w[j] + (RMS ? 0.0f : b[j]));
    if (lane == 0) {
        if (!RMS) mean[i] = m;
        rstd[i] = rs;
    }
}
static bool ln_vec(int64_t cols, std::initializer_list<const void *> ps) {
    return cols % 8 == 0 && cols <= LN_VEC_COLS && tpk__aligned16(ps);
}
static tpk_status ln_fwd_launch(tpk_ctx *ctx, const char *fn, void *x1, const void *r, void *y,
                                float *mean, float *rstd, const void *x, const float *w,
                                const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt,
                                bool rms) {
    bool any = rows > 0;
    if (!any) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "rows", rows, (int64_t)INT_MAX,
                            "grid: up to LN_WARPS rows a block"));
    TPK__CUDA_STATE(st, ctx, fn);
    bool vec = ln_vec(cols, {x1, r, y, x, w, b});
    ln_team tm = ln_team_for(cols);
    int rpb = vec ? LN_WARPS / tm.tw : LN_WARPS; /* rows a block */
    unsigned grid = (unsigned)((rows + rpb - 1) / rpb);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if (!vec) {
            auto kernel = rms ? ln_fwd_kernel<T, true> : ln_fwd_kernel<T, false>;
            kernel<<<grid, 32 * LN_WARPS, 0, st->stream>>>((T *)y, mean, rstd, (const T *)x, w, b,
                                                           rows, cols, eps, (T *)x1, (const T *)r);
            return;
        }
        ln_by_nv(tm.nv, [&](auto nv) {
            constexpr int NV = decltype(nv)::value;
            auto kernel = rms ? ln_fwd_vec_kernel<T, true, NV> : ln_fwd_vec_kernel<T, false, NV>;
            kernel<<<grid, 32 * LN_WARPS, 0, st->stream>>>((T *)y, mean, rstd, (const T *)x, w, b,
                                                           rows, (int)cols, eps, (T *)x1,
                                                           (const T *)r, tm.tw);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x,
                                     const float *w, const float *b, int64_t rows, int64_t cols,
                                     float eps, tpk_dtype dt) {
    return ln_fwd_launch(ctx, "cuda.layernorm_fwd", NULL, NULL, y, mean, rstd, x, w, b, rows, cols,
                         eps, dt, false);
}
/* x1 = x + r and the layernorm of x1 in one kernel (one read of x and r, no separate add pass) */
static tpk_status cuda_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean,
                                              float *rstd, const void *x, const void *r,
                                              const float *w, const float *b, int64_t rows,
                                              int64_t cols, float eps, tpk_dtype dt) {
    static const char *fn = "cuda.residual_layernorm_fwd";
    return ln_fwd_launch(ctx, fn, x1, r, y, mean, rstd, x, w, b, rows, cols, eps, dt, false);
}
static tpk_status cuda_rmsnorm_fwd(tpk_ctx *ctx, void *y, float *rstd, const void *x,
                                   const float *w, int64_t rows, int64_t cols, float eps,
                                   tpk_dtype dt) {
    return ln_fwd_launch(ctx, "cuda.rmsnorm_fwd", NULL, NULL, y, NULL, rstd, x, w, NULL, rows, cols,
                         eps, dt, true);
}

/* Backward, the register kernel: block c (LN_WARPS warps, teams of tw) takes the LN_BWD_ROWS rows
 * of chunk c, each team a row at a time: dy and x held in registers as loaded (16-byte vectors,
 * read once), mean(g) and mean(g xh) summed over the team, dx written (16-byte vectors), and the
 * row's (dy xh, dy) added into the thread's column partials in registers (its columns are the same
 * in every row). The teams' partials are added in team order through shared memory into
 * part[c][NO][cols] (NO = 2: dw, db; RMS: 1, dw); ln_bwd_launch sums the chunks in parallel and in
 * a fixed order (no atomics: deterministic). LN_BWD_ROWS = 12: 1366 blocks at GPT-2's 16384 rows,
 * 2.6 waves on an H100 at H = 768 (bench/RESULTS.md has the figures from ptxas). */
enum { LN_BWD_ROWS = 12, LN_GROUP = 64 /* chunks a column-sum block adds */ };
template <class T, bool RMS, int NV>
__global__ void __launch_bounds__(32 * LN_WARPS)
    ln_bwd_vec_kernel(T *dx, float *part, const T *dy, const T *x, const float *w,
                      const float *mean, const float *rstd, int64_t rows, int cols, bool acc,
                      int tw) {
    extern __shared__ float ln_sm[]; /* [LN_WARPS / tw - 1][NO][cols]: the partials of teams 1.. */
    constexpr int NO = RMS ? 1 : 2;      /* partials a column: dw (, db) */
    __shared__ float sh[2][2][LN_WARPS]; /* the row sums, by row parity: one barrier a row */
    constexpr int W = sizeof(T) == 2 ? 1 : 2; /* 16-byte words of 8 elements */
    int nt = 32 * tw, teams = LN_WARPS / tw, q = threadIdx.x / nt, u = threadIdx.x - q * nt;
    float pw[NV][8], pb[NV][8];
    for (int k = 0; k < NV; k++)
        for (int e = 0; e < 8; e++) pw[k][e] = pb[k][e] = 0.0f;
    int64_t r0 = (int64_t)blockIdx.x * LN_BWD_ROWS;
    for (int n = 0; n < (LN_BWD_ROWS + teams - 1) / teams; n++) { /* the same trips in every team:
                                                                     the barriers */
        int64_t i = r0 + (int64_t)n * teams + q;
        bool live = n * teams + q < LN_BWD_ROWS && i < rows;
        size_t o = (size_t)(live ? i : 0) * (size_t)cols;
        float mu = live && !RMS ? mean[i] : 0.0f, rs = live ? rstd[i] : 0.0f, mg = 0.0f, mgx = 0.0f;
        uint4 dyr[NV][W], xr[NV][W]; /* the row's dy and x as loaded, all loads issued before the
                                        sums */
        for (int k = 0; k < NV; k++) {
            int c = (k * nt + u) * 8;
            for (int h = 0; h < W; h++) dyr[k][h] = xr[k][h] = make_uint4(0, 0, 0, 0);
            if (!live || c >= cols) continue;
            for (int h = 0; h < W; h++) {
                dyr[k][h] = reinterpret_cast<const uint4 *>(dy + o + c)[h];
                xr[k][h] = reinterpret_cast<const uint4 *>(x + o + c)[h];
            }
        }
        for (int k = 0; k < NV; k++) {
            int c = (k * nt + u) * 8;
            if (!live || c >= cols) continue;
            float wv[8], g[8], xv[8];
            ln_ld8f(w + c, wv);
            tpk__ldn<8>(reinterpret_cast<const T *>(dyr[k]), 0, g);
            tpk__ldn<8>(reinterpret_cast<const T *>(xr[k]), 0, xv);
            for (int e = 0; e < 8; e++) {
                float xh = (xv[e] - mu) * rs, gw = g[e] * wv[e];
                pw[k][e] = fmaf(g[e], xh, pw[k][e]);
                if (!RMS) pb[k][e] += g[e], mg += gw;
                mgx = fmaf(gw, xh, mgx);
            }
        }
        mg = RMS ? 0.0f : ln_team_sum(mg, sh[n & 1][0], tw) / (float)cols;
        mgx = ln_team_sum(mgx, sh[n & 1][1], tw) / (float)cols;
        /* dx = rs (g w - mg - xh mgx) = (rs w) g + (x - mu) kx + k0: four instructions an
         * element */
        float kx = -rs * rs * mgx, k0 = -rs * mg;
        for (int k = 0; k < NV; k++) {
            int c = (k * nt + u) * 8;
            if (!live || c >= cols) continue;
            float wv[8], g[8], xv[8], d[8];
            ln_ld8f(w + c, wv);
            tpk__ldn<8>(reinterpret_cast<const T *>(dyr[k]), 0, g);
            tpk__ldn<8>(reinterpret_cast<const T *>(xr[k]), 0, xv);
            if (acc) tpk__ldn<8>(dx, o + c, d);
            for (int e = 0; e < 8; e++) {
                float v = fmaf(rs * wv[e], g[e], fmaf(xv[e] - mu, kx, k0));
                d[e] = acc ? d[e] + v : v;
            }
            tpk__stn<8>(dx, o + c, d);
        }
    }
    /* teams 1.. leave their partials in shared memory, team 0 adds them in team order */
    if (teams > 1) {
        if (q > 0)
            for (int k = 0; k < NV; k++) {
                int c = (k * nt + u) * 8;
                if (c >= cols) continue;
                float *p = ln_sm + (size_t)(q - 1) * NO * (size_t)cols + c;
                for (int e = 0; e < 8; e++) {
                    p[e] = pw[k][e];
                    if (!RMS) p[cols + e] = pb[k][e];
                }
            }
        __syncthreads();
        if (q == 0)
            for (int t = 1; t < teams; t++)
                for (int k = 0; k < NV; k++) {
                    int c = (k * nt + u) * 8;
                    if (c >= cols) continue;
                    const float *p = ln_sm + (size_t)(t - 1) * NO * (size_t)cols + c;
                    for (int e = 0; e < 8; e++) {
                        pw[k][e] += p[e];
                        if (!RMS) pb[k][e] += p[cols + e];
                    }
                }
    }
    if (q == 0) {
        float *pc = part + (size_t)blockIdx.x * NO * (size_t)cols;
        for (int k = 0; k < NV; k++) {
            int c = (k * nt + u) * 8;
            if (c >= cols) continue;
            reinterpret_cast<float4 *>(pc + c)[0] =
                make_float4(pw[k][0], pw[k][1], pw[k][2], pw[k][3]);
            reinterpret_cast<float4 *>(pc + c)[1] =
                make_float4(pw[k][4], pw[k][5], pw[k][6], pw[k][7]);
            if (!RMS) {
                reinterpret_cast<float4 *>(pc + cols + c)[0] =
                    make_float4(pb[k][0], pb[k][1], pb[k][2], pb[k][3]);
                reinterpret_cast<float4 *>(pc + cols + c)[1] =
                    make_float4(pb[k][4], pb[k][5], pb[k][6], pb[k][7]);
            }
        }
    }
}

/* dx of row i by one warp (any row: the row's second read comes from the cache; dy is read before
 * dx is written) */
template <class T, bool RMS>
__global__ void ln_bwd_dx_kernel(T *dx, const T *dy, const T *x, const float *w, const float *mean,
                                 const float *rstd, int64_t rows, int64_t cols, bool acc) {
    int64_t i = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (i >= rows) return;
    int lane = threadIdx.x & 31;
    size_t r = (size_t)i * (size_t)cols;
    float mu = RMS ? 0.0f : mean[i], rs = rstd[i], mg = 0.0f, mgx = 0.0f;
    for (int64_t j = lane; j < cols; j += 32) {
        float xh = (tpk__ldf(x, r + j) - mu) * rs, g = tpk__ldf(dy, r + j) * w[j];
        if (!RMS) mg += g;
        mgx += g * xh;
    }
    mg = RMS ? 0.0f : tpk__warp_sum(mg) / (float)cols, mgx = tpk__warp_sum(mgx) / (float)cols;
    for (int64_t j = lane; j < cols; j += 32) {
        float xh = (tpk__ldf(x, r + j) - mu) * rs, g = tpk__ldf(dy, r + j) * w[j];
        float v = rs * (g - mg - xh * mgx);
        tpk__stf(dx, r + j, acc ? tpk__ldf(dx, r + j) + v : v);
    }
}
/* (dy xh, dy) of element (i, j), for the dw, db column sums of any row */
template <class T, bool RMS> struct ln_wb_elem {
    const T *dy, *x;
    const float *mean, *rstd;
    int64_t cols;
    __device__ void operator()(int64_t i, int64_t j, float *v) const {
        size_t k = (size_t)(i * cols + j);
        float g = tpk__ldf(dy, k);
        v[0] = g * (tpk__ldf(x, k) - (RMS ? 0.0f : mean[i])) * rstd[i];
        v[1] = g;
    }
};
/* element (c, j) of a [chunks][n] matrix of partials: the column sums over the chunks */
struct ln_part_elem {
    const float *part;
    int64_t n;
    __device__ void operator()(int64_t c, int64_t j, float *v) const {
        v[0] = part[(size_t)c * (size_t)n + (size_t)j];
    }
};
/* dw[j] += sum over the chunks c of part[c][0][j] (part [chunks][nout][cols]), db[j] likewise of
 * part[c][1][j] (not with RMS): a warp per sum, its lanes over the chunks, then a fixed butterfly
 * (deterministic) — every sum at once, where a thread per column adding the chunks one after
 * another waited for each load */
template <bool RMS>
__global__ void ln_wb_final_kernel(float *dw, float *db, const float *part, int64_t chunks,
                                   int64_t cols, int nout) {
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    int64_t nsum = (RMS ? 1 : 2) * cols;
    for (int64_t q = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); q < nsum;
         q += (int64_t)gridDim.x * wpb) { /* uniform over the warp */
        int k = (int)(q / cols);
        int64_t j = q - k * cols;
        float s = 0.0f;
        for (int64_t c = lane; c < chunks; c += 32)
            s += part[((size_t)c * nout + k) * (size_t)cols + (size_t)j];
        s = tpk__warp_sum(s);
        if (lane == 0) (k ? db : dw)[j] += s;
    }
}
/* the final kernel's grid: a warp per column sum, 8 warps a block */
static unsigned ln_final_grid(int64_t cols, bool rms) {
    return tpk__grid_for((size_t)((rms ? 1 : 2) * cols), 8);
}

/* VEC: the register kernel (part [chunks][nout][cols], chunks of LN_BWD_ROWS), then its partials as
 * a [chunks, nout cols] matrix summed by tpk__colsum_partial_kernel over groups of LN_GROUP chunks
 * (a block per 32 columns and group: 1056 blocks at GPT-2 124M's 16384 rows) into
 * part2 [groups][nout][cols], and ln_wb_final_kernel adds the groups, a warp per column sum.
 * Otherwise dw, db by the column-sum kernels over (dy xh, dy) and dx by ln_bwd_dx_kernel. Both
 * orders are fixed by the shape: deterministic. */
static tpk_status ln_bwd_launch(tpk_ctx *ctx, const char *fn, void *dx, float *dw, float *db,
                                const void *dy, const void *x, const float *w, const float *mean,
                                const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt,
                                bool accumulate_dx, bool rms) {
    bool any = rows > 0;
    if (!any) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "rows", rows, (int64_t)INT_MAX * LN_WARPS,
                            "grid: one warp per row"));
    TPK__CUDA_STATE(st, ctx, fn);
    auto final_kernel = rms ? ln_wb_final_kernel<true> : ln_wb_final_kernel<false>;
    if (ln_vec(cols, {dx, dy, x, w})) {
        ln_team tm = ln_team_for(cols);
        int nout = rms ? 1 : 2; /* partials a column: dw (, db) */
        int64_t chunks = (rows + LN_BWD_ROWS - 1) / LN_BWD_ROWS,
                groups = (chunks + LN_GROUP - 1) / LN_GROUP;
        size_t part_bytes =
            (sizeof(float) * (size_t)nout * (size_t)(chunks * cols) + 255) / 256 * 256;
        float *part;
        TPK_TRY(tpk__cuda_scratch(
            ctx, fn, st, part_bytes + sizeof(float) * (size_t)nout * (size_t)(groups * cols),
            (void **)&part));
        float *part2 = reinterpret_cast<float *>(reinterpret_cast<char *>(part) + part_bytes);
        size_t smem = sizeof(float) * (size_t)nout * (size_t)cols *
                      (size_t)(LN_WARPS / tm.tw - 1); /* <= 24 KiB */
        tpk__by_dtype(dt, [&](auto tag) {
            using T = decltype(tag);
            ln_by_nv(tm.nv, [&](auto nv) {
                constexpr int NV = decltype(nv)::value;
                auto kernel =
                    rms ? ln_bwd_vec_kernel<T, true, NV> : ln_bwd_vec_kernel<T, false, NV>;
                kernel<<<(unsigned)chunks, 32 * LN_WARPS, smem, st->stream>>>(
                    (T *)dx, part, (const T *)dy, (const T *)x, w, mean, rstd, rows, (int)cols,
                    accumulate_dx, tm.tw);
            });
        });
        dim3 grid((unsigned)((nout * cols + 31) / 32), tpk__colsum_grid_y(groups)), block(32, 8);
        tpk__colsum_partial_kernel<1><<<grid, block, 0, st->stream>>>(
            ln_part_elem{part, nout * cols}, chunks, nout * cols, part2, (int64_t)LN_GROUP);
        final_kernel<<<ln_final_grid(cols, rms), 256, 0, st->stream>>>(dw, db, part2, groups, cols,
                                                                       nout);
        return tpk__cuda_launched(ctx, fn);
    }
    int64_t chunks = (rows + TPK__COLSUM_ROWS - 1) / TPK__COLSUM_ROWS;
    float *part;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(float) * 2 * (size_t)(chunks * cols),
                              (void **)&part));
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        dim3 grid((unsigned)((cols + 31) / 32), tpk__colsum_grid_y(chunks)), block(32, 8);
        unsigned dgrid = (unsigned)((rows + LN_WARPS - 1) / LN_WARPS);
        auto by_rms = [&](auto r) {
            constexpr bool RMS = decltype(r)::value;
            tpk__colsum_partial_kernel<2><<<grid, block, 0, st->stream>>>(
                ln_wb_elem<T, RMS>{(const T *)dy, (const T *)x, mean, rstd, cols}, rows, cols,
                part);
            final_kernel<<<ln_final_grid(cols, RMS), 256, 0, st->stream>>>(dw, db, part, chunks,
                                                                           cols, 2);
            ln_bwd_dx_kernel<T, RMS><<<dgrid, 32 * LN_WARPS, 0, st->stream>>>(
                (T *)dx, (const T *)dy, (const T *)x, w, mean, rstd, rows, cols, accumulate_dx);
        };
        if (rms) by_rms(std::true_type{});
        else by_rms(std::false_type{});
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy,
                                     const void *x, const float *w, const float *mean,
                                     const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt,
                                     bool accumulate_dx) {
    return ln_bwd_launch(ctx, "cuda.layernorm_bwd", dx, dw, db, dy, x, w, mean, rstd, rows, cols,
                         dt, accumulate_dx, false);
}
static tpk_status cuda_rmsnorm_bwd(tpk_ctx *ctx, void *dx, float *dw, const void *dy, const void *x,
                                   const float *w, const float *rstd, int64_t rows, int64_t cols,
                                   tpk_dtype dt, bool accumulate_dx) {
    return ln_bwd_launch(ctx, "cuda.rmsnorm_bwd", dx, dw, NULL, dy, x, w, NULL, rstd, rows, cols,
                         dt, accumulate_dx, true);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_norm_ops(tpk_ops *o) {
    o->layernorm_fwd = cuda_layernorm_fwd;
    o->layernorm_bwd = cuda_layernorm_bwd;
    o->rmsnorm_fwd = cuda_rmsnorm_fwd;
    o->rmsnorm_bwd = cuda_rmsnorm_bwd;
    o->residual_layernorm_fwd = cuda_residual_layernorm_fwd;
}
