/* kernels/cuda/ops_cuda_layers.cu — the transformer-layer ops of the CUDA backend (contracts in
 * tpk/ops.h, reference in kernels/host/): dropout, layernorm and RMSNorm,
 * rotary embeddings, SwiGLU, embedding, the cross-entropy pieces and flash-style causal attention
 * (grouped-query: a key/value head shared by several query heads read in place).
 *
 *   dropout    y = x keep / (1-p),  keep = dropout_u(seed, stream, global index) >= p: one Philox call
 *              per 4 consecutive global indices, a thread taking 8 elements (two calls) where the
 *              geometry is aligned, else one call's part of a row
 *   layernorm  y = (x - mean) rstd w + b, rstd = 1/sqrt(var + eps), the variance around the mean;
 *              dx = rstd (g - mean(g) - xh mean(g xh)), g = dy w; dw += sum_i dy xh, db += sum_i dy.
 *              Rows of a multiple of 8 up to 4096, 16-byte aligned: a team of 1, 2 or 4 warps holds
 *              a row in registers (16-byte loads, read once; the mean, then the variance from the
 *              registers); the backward's team also adds the row's (dy xh, dy) into its threads'
 *              column partials in registers, per chunk of 12 rows (a block), and the chunks'
 *              partials are summed in parallel in a fixed order (column-sum kernel, then a final
 *              pass). Other rows: one warp per row re-reading the row from the cache, dw and db by
 *              the column-sum kernels
 *   rmsnorm    the same kernels with the template parameter RMS: the mean taken as 0 (not
 *              computed, saved or read), no bias (db untouched), dx = rstd (g - xh mean(g xh))
 *   rope       one thread per (row, head, pair j < D/2): (x_j, x_{j+D/2}) rotated by
 *              (row mod S) theta^(-2j/D), the angle in double as the host; y may be x
 *   swiglu     one thread per (row, j < F): h = silu(gate) up; backward dgate, dup written after
 *              both inputs are read (dgu may be gu)
 *   embedding  y[t] = E[ids[t] - v0], a block per token row;  backward: a stable radix sort of
 *              the token indices by row (out-of-range ids sort last), then one block per run of
 *              equal rows adds its tokens' dy in token order, each column by one thread: the host's
 *              sums, bit for bit, no atomics; both 8 columns a thread in 16-byte vectors where H is
 *              a multiple of 8 and the buffers 16-byte aligned
 *   xent       per row (one block), one read: the running max m and sum exp(z - m) (online
 *              softmax, merged across threads by butterflies), z_target, sum z; the loss from the
 *              ranks' parts (double); the mean over the rows in one block (double, a fixed tree),
 *              left on the device; dz = (exp(z - lse) - (1-eps) onehot - eps/V) dloss, a block
 *              per row; fused (one rank): statistics, loss and dz of a row in one block. Rows of a
 *              padded vocabulary in 16-byte vectors; exp(x) = 2^(x log2 e) by ex2.approx.ftz
 *   attention  bf16 with head dim 64 or 128 on sm_80 and later: FlashAttention-2 on tensor cores
 *              (flash.cuh). Otherwise these generic kernels (f32, any head dim up to ATT_MAXD),
 *              flash-style, never an S x S matrix. Grouped-query: query head h reads key/value
 *              head (head0 + h) / (A / G) - g0 of qkv [Q (Al D) | K (Gl D) | V (Gl D)] in place
 *              (tpk__fl_heads, 32-bit head indices). Forward: a block of ATT_WARPS query rows of one
 *              (batch, head) walks the keys 0..i in tiles of 32 staged in shared memory; each lane
 *              scores one key of the tile, the warp keeps the running max m and sum l, and each
 *              lane accumulates its columns of O:  o = o e^(m - m') + sum_j keep_ij e^(s_ij - m') V_j,
 *              O = o / l, lse = m + log l. Backward (no atomics, every output written once):
 *              Dr_i = dO_i . O_i;  dQ: one warp per query row over key tiles,
 *              dQ_i = scale sum_j dS_ij K_j;  dK, dV: one warp per key row of one key/value head,
 *              over the local query heads reading it (ascending) and their query tiles i >= j,
 *              dV_j = sum_h sum_i keep_ij P_ij dO_i,  dK_j = scale sum_h sum_i dS_ij Q_i,
 *              P_ij = exp(s_ij - lse_i),  dS_ij = P_ij (keep_ij dO_i . V_j - Dr_i)
 *              (summed in registers in a fixed order: deterministic, bit for bit).
 *              Head dims up to ATT_MAXD; the keep bits are the host's (tpk/rng.h), drawn here one
 *              Philox call per element (tpk_dropout_u: a lane holds one key of a row, so the 4 keys
 *              of a call sit in 4 lanes; the tensor-core kernels share a call between lanes). */
#include <cstdlib>
#include <cstring>

#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "flash.cuh"

/* ---- dropout ------------------------------------------------------------------------------------- */

/* One Philox call per 4 consecutive global indices (tpk/rng.h: index x takes output x % 4 of call
 * x / 4). VEC (x, y 16-byte aligned; cols, gcols and col0 multiples of 4, so local elements 4k ..
 * 4k + 3 are one call's 4): a thread takes 8 elements — two calls, one 16-byte vector of bf16 or two
 * of f32 — the last n % 8 one by one (tpk_dropout_u). Otherwise a thread takes one call's part of
 * one row: item (i, q) is call q of row i counted from the one holding (i, 0), up to
 * (cols + 6) / 4 per row (items past the row's end do nothing). SMALL (rows x cols < 2^32): element
 * k's row and column by a 32-bit division — the 64-bit one is a call of some 60 instructions, as
 * many as a Philox call's share of 8 bf16 elements, and held bf16 dropout at 70% of copy bandwidth. */
template <class T, bool VEC, bool SMALL>
__global__ void dropout_kernel(T *y, const T *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0, int64_t col0, float p,
                               uint64_t seed, uint64_t stream) {
    float scale = 1.0f / (1.0f - p);
    if constexpr (VEC) {
        tpk__elementwise<true>((size_t)rows * (size_t)cols, [&](size_t k, auto vn) {
            constexpr int V = decltype(vn)::value;
            int64_t i, j; /* element k = (i, j) */
            if constexpr (SMALL) i = (uint32_t)k / (uint32_t)cols, j = (uint32_t)k - (uint32_t)i * (uint32_t)cols;
            else i = (int64_t)(k / (size_t)cols), j = (int64_t)(k - (size_t)i * (size_t)cols);
            uint64_t g = (uint64_t)((row0 + i) * gcols + col0 + j);                              /* its global index */
            float v[V];
            tpk__ldn<V>(x, k, v);
            if constexpr (V == 1) {
                v[0] = tpk_dropout_u(seed, stream, g) >= p ? v[0] * scale : 0.0f;
            } else {
                for (int h = 0; h < V / 4; h++) { /* elements k + 4h .. + 3: one call, from a multiple of 4 */
                    if (h && j + 4 >= cols) g += (uint64_t)(gcols - cols); /* the second 4 start the next row */
                    tpk_f32x4 u = tpk_rng_uniform4(seed, stream, (g + 4 * (uint64_t)h) >> 2);
                    for (int e = 0; e < 4; e++) v[4 * h + e] = u.v[e] >= p ? v[4 * h + e] * scale : 0.0f;
                }
            }
            tpk__stn<V>(y, k, v);
        });
    } else {
        int64_t per_row = (cols + 6) / 4;
        TPK__GRID_STRIDE(it, (size_t)rows * (size_t)per_row) {
            int64_t i = (int64_t)(it / (size_t)per_row), q = (int64_t)(it - (size_t)i * (size_t)per_row);
            uint64_t first = (uint64_t)((row0 + i) * gcols + col0), g = ((first >> 2) + (uint64_t)q) << 2; /* (i, 0); the call's first index */
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
static tpk_status cuda_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                             int64_t col0, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "cuda.dropout";
    if (rows * cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t total = (size_t)rows * (size_t)cols;
    bool vec = tpk__aligned16({y, x}) && cols % 4 == 0 && gcols % 4 == 0 && col0 % 4 == 0;
    unsigned grid = vec ? tpk__grid_elementwise(total, true) : tpk__grid_for((size_t)rows * (size_t)((cols + 6) / 4), 256);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            constexpr bool V = decltype(v)::value;
            auto kernel = total < ((size_t)1 << 32) ? dropout_kernel<T, V, true> : dropout_kernel<T, V, false>;
            kernel<<<grid, 256, 0, st->stream>>>((T *)y, (const T *)x, rows, cols, gcols, row0, col0, p, seed, stream);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- layernorm, RMSNorm ------------------------------------------------------------------------------ */

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
__global__ void __launch_bounds__(32 * LN_WARPS) ln_fwd_vec_kernel(T *y, float *mean, float *rstd, const T *x, const float *w, const float *b,
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
__global__ void ln_fwd_kernel(T *y, float *mean, float *rstd, const T *x, const float *w, const float *b, int64_t rows, int64_t cols,
                              float eps, T *x1, const T *r) {
    int64_t i = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (i >= rows) return;
    size_t o = (size_t)i * (size_t)cols;
    if (r) {
        for (int64_t j = lane; j < cols; j += 32) tpk__stf(x1, o + j, tpk__ldf(x, o + j) + tpk__ldf(r, o + j));
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
    for (int64_t j = lane; j < cols; j += 32) tpk__stf(y, o + j, (tpk__ldf(x, o + j) - m) * rs * w[j] + (RMS ? 0.0f : b[j]));
    if (lane == 0) {
        if (!RMS) mean[i] = m;
        rstd[i] = rs;
    }
}
static bool ln_vec(int64_t cols, std::initializer_list<const void *> ps) { return cols % 8 == 0 && cols <= LN_VEC_COLS && tpk__aligned16(ps); }
static tpk_status ln_fwd_launch(tpk_ctx *ctx, const char *fn, void *x1, const void *r, void *y, float *mean, float *rstd, const void *x,
                                const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt, bool rms) {
    bool any = rows > 0;
    if (!any) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "rows", rows, (int64_t)INT_MAX, "grid: up to LN_WARPS rows a block"));
    TPK__CUDA_STATE(st, ctx, fn);
    bool vec = ln_vec(cols, {x1, r, y, x, w, b});
    ln_team tm = ln_team_for(cols);
    int rpb = vec ? LN_WARPS / tm.tw : LN_WARPS; /* rows a block */
    unsigned grid = (unsigned)((rows + rpb - 1) / rpb);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if (!vec) {
            auto kernel = rms ? ln_fwd_kernel<T, true> : ln_fwd_kernel<T, false>;
            kernel<<<grid, 32 * LN_WARPS, 0, st->stream>>>((T *)y, mean, rstd, (const T *)x, w, b, rows, cols, eps, (T *)x1, (const T *)r);
            return;
        }
        ln_by_nv(tm.nv, [&](auto nv) {
            constexpr int NV = decltype(nv)::value;
            auto kernel = rms ? ln_fwd_vec_kernel<T, true, NV> : ln_fwd_vec_kernel<T, false, NV>;
            kernel<<<grid, 32 * LN_WARPS, 0, st->stream>>>((T *)y, mean, rstd, (const T *)x, w, b, rows, (int)cols, eps, (T *)x1, (const T *)r,
                                                          tm.tw);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                                   int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    return ln_fwd_launch(ctx, "cuda.layernorm_fwd", NULL, NULL, y, mean, rstd, x, w, b, rows, cols, eps, dt, false);
}
/* x1 = x + r and the layernorm of x1 in one kernel (one read of x and r, no separate add pass) */
static tpk_status cuda_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd, const void *x, const void *r,
                                            const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt) {
    static const char *fn = "cuda.residual_layernorm_fwd";
    return ln_fwd_launch(ctx, fn, x1, r, y, mean, rstd, x, w, b, rows, cols, eps, dt, false);
}
static tpk_status cuda_rmsnorm_fwd(tpk_ctx *ctx, void *y, float *rstd, const void *x, const float *w, int64_t rows, int64_t cols, float eps,
                                   tpk_dtype dt) {
    return ln_fwd_launch(ctx, "cuda.rmsnorm_fwd", NULL, NULL, y, NULL, rstd, x, w, NULL, rows, cols, eps, dt, true);
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
__global__ void __launch_bounds__(32 * LN_WARPS) ln_bwd_vec_kernel(T *dx, float *part, const T *dy, const T *x, const float *w, const float *mean,
                                                                  const float *rstd, int64_t rows, int cols, bool acc, int tw) {
    extern __shared__ float ln_sm[]; /* [LN_WARPS / tw - 1][NO][cols]: the partials of teams 1.. */
    constexpr int NO = RMS ? 1 : 2;      /* partials a column: dw (, db) */
    __shared__ float sh[2][2][LN_WARPS]; /* the row sums, by row parity: one barrier a row */
    constexpr int W = sizeof(T) == 2 ? 1 : 2; /* 16-byte words of 8 elements */
    int nt = 32 * tw, teams = LN_WARPS / tw, q = threadIdx.x / nt, u = threadIdx.x - q * nt;
    float pw[NV][8], pb[NV][8];
    for (int k = 0; k < NV; k++)
        for (int e = 0; e < 8; e++) pw[k][e] = pb[k][e] = 0.0f;
    int64_t r0 = (int64_t)blockIdx.x * LN_BWD_ROWS;
    for (int n = 0; n < (LN_BWD_ROWS + teams - 1) / teams; n++) { /* the same trips in every team: the barriers */
        int64_t i = r0 + (int64_t)n * teams + q;
        bool live = n * teams + q < LN_BWD_ROWS && i < rows;
        size_t o = (size_t)(live ? i : 0) * (size_t)cols;
        float mu = live && !RMS ? mean[i] : 0.0f, rs = live ? rstd[i] : 0.0f, mg = 0.0f, mgx = 0.0f;
        uint4 dyr[NV][W], xr[NV][W]; /* the row's dy and x as loaded, all loads issued before the sums */
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
        /* dx = rs (g w - mg - xh mgx) = (rs w) g + (x - mu) kx + k0: four instructions an element */
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
            reinterpret_cast<float4 *>(pc + c)[0] = make_float4(pw[k][0], pw[k][1], pw[k][2], pw[k][3]);
            reinterpret_cast<float4 *>(pc + c)[1] = make_float4(pw[k][4], pw[k][5], pw[k][6], pw[k][7]);
            if (!RMS) {
                reinterpret_cast<float4 *>(pc + cols + c)[0] = make_float4(pb[k][0], pb[k][1], pb[k][2], pb[k][3]);
                reinterpret_cast<float4 *>(pc + cols + c)[1] = make_float4(pb[k][4], pb[k][5], pb[k][6], pb[k][7]);
            }
        }
    }
}

/* dx of row i by one warp (any row: the row's second read comes from the cache; dy is read before
 * dx is written) */
template <class T, bool RMS>
__global__ void ln_bwd_dx_kernel(T *dx, const T *dy, const T *x, const float *w, const float *mean, const float *rstd, int64_t rows,
                                 int64_t cols, bool acc) {
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
    __device__ void operator()(int64_t c, int64_t j, float *v) const { v[0] = part[(size_t)c * (size_t)n + (size_t)j]; }
};
/* dw[j] += sum over the chunks c of part[c][0][j] (part [chunks][nout][cols]), db[j] likewise of
 * part[c][1][j] (not with RMS): a warp per sum, its lanes over the chunks, then a fixed butterfly
 * (deterministic) — every sum at once, where a thread per column adding the chunks one after
 * another waited for each load */
template <bool RMS> __global__ void ln_wb_final_kernel(float *dw, float *db, const float *part, int64_t chunks, int64_t cols, int nout) {
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    int64_t nsum = (RMS ? 1 : 2) * cols;
    for (int64_t q = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); q < nsum; q += (int64_t)gridDim.x * wpb) { /* uniform over the warp */
        int k = (int)(q / cols);
        int64_t j = q - k * cols;
        float s = 0.0f;
        for (int64_t c = lane; c < chunks; c += 32) s += part[((size_t)c * nout + k) * (size_t)cols + (size_t)j];
        s = tpk__warp_sum(s);
        if (lane == 0) (k ? db : dw)[j] += s;
    }
}
/* the final kernel's grid: a warp per column sum, 8 warps a block */
static unsigned ln_final_grid(int64_t cols, bool rms) { return tpk__grid_for((size_t)((rms ? 1 : 2) * cols), 8); }

/* VEC: the register kernel (part [chunks][nout][cols], chunks of LN_BWD_ROWS), then its partials as a
 * [chunks, nout cols] matrix summed by tpk__colsum_partial_kernel over groups of LN_GROUP chunks (a
 * block per 32 columns and group: 1056 blocks at GPT-2 124M's 16384 rows) into
 * part2 [groups][nout][cols], and ln_wb_final_kernel adds the groups, a warp per column sum. Otherwise dw, db by the column-sum kernels over
 * (dy xh, dy) and dx by ln_bwd_dx_kernel. Both orders are fixed by the shape: deterministic. */
static tpk_status ln_bwd_launch(tpk_ctx *ctx, const char *fn, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                                const float *mean, const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx, bool rms) {
    bool any = rows > 0;
    if (!any) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "rows", rows, (int64_t)INT_MAX * LN_WARPS, "grid: one warp per row"));
    TPK__CUDA_STATE(st, ctx, fn);
    auto final_kernel = rms ? ln_wb_final_kernel<true> : ln_wb_final_kernel<false>;
    if (ln_vec(cols, {dx, dy, x, w})) {
        ln_team tm = ln_team_for(cols);
        int nout = rms ? 1 : 2; /* partials a column: dw (, db) */
        int64_t chunks = (rows + LN_BWD_ROWS - 1) / LN_BWD_ROWS, groups = (chunks + LN_GROUP - 1) / LN_GROUP;
        size_t part_bytes = (sizeof(float) * (size_t)nout * (size_t)(chunks * cols) + 255) / 256 * 256;
        float *part;
        TPK_TRY(tpk__cuda_scratch(ctx, fn, st, part_bytes + sizeof(float) * (size_t)nout * (size_t)(groups * cols), (void **)&part));
        float *part2 = reinterpret_cast<float *>(reinterpret_cast<char *>(part) + part_bytes);
        size_t smem = sizeof(float) * (size_t)nout * (size_t)cols * (size_t)(LN_WARPS / tm.tw - 1); /* <= 24 KiB */
        tpk__by_dtype(dt, [&](auto tag) {
            using T = decltype(tag);
            ln_by_nv(tm.nv, [&](auto nv) {
                constexpr int NV = decltype(nv)::value;
                auto kernel = rms ? ln_bwd_vec_kernel<T, true, NV> : ln_bwd_vec_kernel<T, false, NV>;
                kernel<<<(unsigned)chunks, 32 * LN_WARPS, smem, st->stream>>>((T *)dx, part, (const T *)dy, (const T *)x, w, mean, rstd, rows,
                                                                              (int)cols, accumulate_dx, tm.tw);
            });
        });
        dim3 grid((unsigned)((nout * cols + 31) / 32), tpk__colsum_grid_y(groups)), block(32, 8);
        tpk__colsum_partial_kernel<1><<<grid, block, 0, st->stream>>>(ln_part_elem{part, nout * cols}, chunks, nout * cols, part2, (int64_t)LN_GROUP);
        final_kernel<<<ln_final_grid(cols, rms), 256, 0, st->stream>>>(dw, db, part2, groups, cols, nout);
        return tpk__cuda_launched(ctx, fn);
    }
    int64_t chunks = (rows + TPK__COLSUM_ROWS - 1) / TPK__COLSUM_ROWS;
    float *part;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(float) * 2 * (size_t)(chunks * cols), (void **)&part));
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        dim3 grid((unsigned)((cols + 31) / 32), tpk__colsum_grid_y(chunks)), block(32, 8);
        unsigned dgrid = (unsigned)((rows + LN_WARPS - 1) / LN_WARPS);
        auto by_rms = [&](auto r) {
            constexpr bool RMS = decltype(r)::value;
            tpk__colsum_partial_kernel<2><<<grid, block, 0, st->stream>>>(ln_wb_elem<T, RMS>{(const T *)dy, (const T *)x, mean, rstd, cols}, rows,
                                                                     cols, part);
            final_kernel<<<ln_final_grid(cols, RMS), 256, 0, st->stream>>>(dw, db, part, chunks, cols, 2);
            ln_bwd_dx_kernel<T, RMS><<<dgrid, 32 * LN_WARPS, 0, st->stream>>>((T *)dx, (const T *)dy, (const T *)x, w, mean, rstd, rows, cols,
                                                                              accumulate_dx);
        };
        if (rms) by_rms(std::true_type{});
        else by_rms(std::false_type{});
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                                   const float *mean, const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx) {
    return ln_bwd_launch(ctx, "cuda.layernorm_bwd", dx, dw, db, dy, x, w, mean, rstd, rows, cols, dt, accumulate_dx, false);
}
static tpk_status cuda_rmsnorm_bwd(tpk_ctx *ctx, void *dx, float *dw, const void *dy, const void *x, const float *w, const float *rstd,
                                   int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx) {
    return ln_bwd_launch(ctx, "cuda.rmsnorm_bwd", dx, dw, NULL, dy, x, w, NULL, rstd, rows, cols, dt, accumulate_dx, true);
}

/* ---- rotary embedding, SwiGLU ---------------------------------------------------------------------- */

/* one thread per (row, head, pair j < D/2): the angle in double, as the host */
template <class T>
__global__ void rope_kernel(T *y, int64_t ldy, const T *x, int64_t ldx, int64_t rows, int64_t S, int64_t heads, int64_t D, float theta, bool inverse) {
    int64_t half = D / 2;
    TPK__GRID_STRIDE(k, (size_t)(rows * heads * half)) {
        int64_t j = (int64_t)(k % (size_t)half), h = (int64_t)(k / (size_t)half % (size_t)heads), i = (int64_t)(k / (size_t)(half * heads));
        double a = (double)(i % S) * pow((double)theta, -2.0 * (double)j / (double)D);
        float c = (float)cos(a), n = inverse ? -(float)sin(a) : (float)sin(a);
        size_t xi = (size_t)(i * ldx + h * D + j), yi = (size_t)(i * ldy + h * D + j);
        float x1 = tpk__ldf(x, xi), x2 = tpk__ldf(x, xi + half);
        tpk__stf(y, yi, x1 * c - x2 * n);
        tpk__stf(y, yi + half, x2 * c + x1 * n);
    }
}
static tpk_status cuda_rope(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx, int64_t rows, int64_t S, int64_t heads, int64_t D,
                            float theta, bool inverse, tpk_dtype dt) {
    static const char *fn = "cuda.rope";
    size_t n = (size_t)(rows * heads * (D / 2));
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        rope_kernel<T><<<tpk__grid_for(n, 256), 256, 0, st->stream>>>((T *)y, ldy, (const T *)x, ldx, rows, S, heads, D, theta, inverse);
    });
    return tpk__cuda_launched(ctx, fn);
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
static tpk_status swiglu_launch(tpk_ctx *ctx, const char *fn, void *out, const void *gu, const void *dh, int64_t rows, int64_t F, tpk_dtype dt) {
    size_t n = (size_t)(rows * F);
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        swiglu_kernel<T><<<tpk__grid_for(n, 256), 256, 0, st->stream>>>((T *)out, (const T *)gu, (const T *)dh, rows, F);
    });
    return tpk__cuda_launched(ctx, fn);
}
static tpk_status cuda_swiglu_fwd(tpk_ctx *ctx, void *h, const void *gu, int64_t rows, int64_t F, tpk_dtype dt) {
    return swiglu_launch(ctx, "cuda.swiglu_fwd", h, gu, NULL, rows, F, dt);
}
static tpk_status cuda_swiglu_bwd(tpk_ctx *ctx, void *dgu, const void *gu, const void *dh, int64_t rows, int64_t F, tpk_dtype dt) {
    return swiglu_launch(ctx, "cuda.swiglu_bwd", dgu, gu, dh, rows, F, dt);
}

/* ---- embedding ------------------------------------------------------------------------------------ */

/* VEC (H a multiple of 8, y or dy and the table 16-byte aligned): a thread takes 8 columns at a
 * time — one 16-byte vector of bf16 (two of f32) and two of the f32 table; otherwise one. */
static bool embed_vec(int64_t H, std::initializer_list<const void *> ps) { return H % TPK__VEC == 0 && tpk__aligned16(ps); }
/* threads of a block over a row of H columns: enough for the row's vectors, 32 to 256 */
static int embed_block(int64_t H, bool vec) {
    int64_t n = vec ? H / TPK__VEC : H, b = (n + 31) / 32 * 32;
    return (int)(b < 32 ? 32 : b > 256 ? 256 : b);
}
/* y[t] = E[ids[t] - v0] (0 for an id outside the shard; acc: added to y): a block per token row
 * (the blocks stride over the rows), its threads over the row's columns */
template <class T, bool VEC>
__global__ void embed_fwd_kernel(T *y, const int32_t *ids, const float *E, int64_t T_, int64_t H, int64_t v0, int64_t vrows, bool acc) {
    constexpr int N = VEC ? TPK__VEC : 1;
    for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
        int64_t row = (int64_t)ids[t] - v0;
        bool in = row >= 0 && row < vrows;
        const float *er = E + (size_t)(in ? row : 0) * (size_t)H;
        size_t o = (size_t)t * (size_t)H;
        for (int64_t k = threadIdx.x; k < H / N; k += blockDim.x) {
            float e[N] = {}, v[N];
            if (in) tpk__ldn<N>(er, (size_t)k * N, e);
            if (acc) {
                tpk__ldn<N>(y, o + (size_t)k * N, v);
                for (int q = 0; q < N; q++) e[q] += v[q];
            }
            tpk__stn<N>(y, o + (size_t)k * N, e);
        }
    }
}
static tpk_status cuda_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt, bool accumulate) {
    static const char *fn = "cuda.embed_fwd";
    if (T * H == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    bool vec = embed_vec(H, {y, table});
    unsigned grid = (unsigned)(T < INT_MAX ? T : INT_MAX);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            embed_fwd_kernel<Tt, decltype(v)::value><<<grid, embed_block(H, vec), 0, st->stream>>>((Tt *)y, ids, table, T, H, v0, vrows, accumulate);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* key[t] = ids[t] - v0 when in range, else vrows (sorts after every row); val[t] = t */
static __global__ void embed_keys_kernel(uint32_t *key, uint32_t *val, const int32_t *ids, int64_t T, int64_t v0, int64_t vrows) {
    TPK__GRID_STRIDE(t, (size_t)T) {
        int64_t row = (int64_t)ids[t] - v0;
        key[t] = row >= 0 && row < vrows ? (uint32_t)row : (uint32_t)vrows;
        val[t] = (uint32_t)t;
    }
}
/* block b starts a run when key[b] differs from key[b-1]; it adds its tokens' rows in token order,
 * each column by one thread (VEC: 8 columns a thread, in 16-byte vectors) */
template <class T, bool VEC>
__global__ void embed_bwd_kernel(float *dE, const T *dy, const uint32_t *key, const uint32_t *tok, int64_t T_, int64_t H,
                                 int64_t vrows) {
    constexpr int N = VEC ? TPK__VEC : 1;
    for (int64_t b = blockIdx.x; b < T_; b += gridDim.x) {
        uint32_t row = key[b];
        if ((int64_t)row >= vrows || (b > 0 && key[b - 1] == row)) continue;
        int64_t end = b + 1;
        while (end < T_ && key[end] == row) end++;
        float *er = dE + (size_t)row * (size_t)H;
        for (int64_t k = threadIdx.x; k < H / N; k += blockDim.x) {
            float acc[N], g[N];
            tpk__ldn<N>(er, (size_t)k * N, acc);
            for (int64_t s = b; s < end; s++) {
                tpk__ldn<N>(dy, (size_t)tok[s] * (size_t)H + (size_t)k * N, g);
                for (int q = 0; q < N; q++) acc[q] += g[q];
            }
            tpk__stn<N>(er, (size_t)k * N, acc);
        }
    }
}
static tpk_status cuda_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt) {
    static const char *fn = "cuda.embed_bwd";
    if (T == 0 || H == 0 || vrows == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "tokens of one radix sort"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "vrows", vrows, (int64_t)UINT32_MAX - 1, "32-bit sort keys"));
    TPK__CUDA_STATE(st, ctx, fn);
    int end_bit = 1;
    while (end_bit < 32 && ((uint64_t)1 << end_bit) <= (uint64_t)vrows) end_bit++;
    size_t n = (size_t)T, sort_bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (uint32_t *)NULL, (uint32_t *)NULL, (uint32_t *)NULL,
                                                    (uint32_t *)NULL, (int)T, 0, end_bit, st->stream);
    if (e != cudaSuccess) return tpk__cuda_err(ctx, fn, "cub::DeviceRadixSort::SortPairs (size query)", e);
    size_t keys_bytes = (4 * n * sizeof(uint32_t) + 255) / 256 * 256;
    char *scratch;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, keys_bytes + sort_bytes, (void **)&scratch));
    uint32_t *k_in = (uint32_t *)scratch, *v_in = k_in + n, *k_out = v_in + n, *v_out = k_out + n;
    embed_keys_kernel<<<tpk__grid_for(n, 256), 256, 0, st->stream>>>(k_in, v_in, ids, T, v0, vrows);
    TPK_TRY(tpk__cuda_launched(ctx, fn));
    /* LSD radix sort is stable: equal rows keep token order */
    e = cub::DeviceRadixSort::SortPairs(scratch + keys_bytes, sort_bytes, k_in, k_out, v_in, v_out, (int)T, 0, end_bit, st->stream);
    if (e != cudaSuccess) return tpk__cuda_err(ctx, fn, "cub::DeviceRadixSort::SortPairs", e);
    unsigned grid = T < 65535 ? (unsigned)T : 65535u;
    bool vec = embed_vec(H, {dtable, dy});
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            embed_bwd_kernel<Tt, decltype(v)::value><<<grid, embed_block(H, vec), 0, st->stream>>>(dtable, (const Tt *)dy, k_out, v_out, T, H, vrows);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- cross-entropy pieces ----------------------------------------------------------------------- */

/* Rows go to a block each: XENT_THREADS for the statistics and the fused op (one constant: the same
 * threads add the same elements in the same order, so both give the same bits), two blocks an SM
 * (__launch_bounds__(XENT_THREADS, 2): at most 32 registers), XENT_GRAD_THREADS for the gradient
 * alone (no sums: any block size gives the same bits). 1024 threads a row, not 256: the fused op
 * reads its row twice, the second read from the L2 cache, and the rows in flight at once (264 on
 * an H100, 100 KB each for GPT-2's bf16 row: 26 MB) stay inside its 50 MB; at 8 rows of 256 threads
 * an SM they were 105 MB, and the second read went to memory (58% of copy bandwidth). */
enum { XENT_THREADS = 1024, XENT_GRAD_THREADS = 256 };

/* Rows go to a block each. VEC (rows of ld, a multiple of 8, 16-byte aligned — a padded
 * vocabulary's): thread u takes the 8-element vectors u, u + blockDim.x, ... of the row's Vl / 8
 * whole ones in 16-byte loads, then the rest one element at a time; otherwise every element one at
 * a time. The exponentials are 2^(z log2 e - m log2 e): one FFMA and one MUFU.EX2 (tpk__ex2) an
 * element. */
static bool xent_vec(const void *z, int64_t ld) { return ld % TPK__VEC == 0 && tpk__aligned16({z}); }

/* Add N elements z[] to a thread's running max m, sum s of e^(z - m) and sum sz of z: the new
 * max M first, s rescaled once by e^(m - M), then each element's e^(z - M) (nothing to rescale while
 * every element so far is -inf: 2^-inf = 0) */
template <int N> __device__ __forceinline__ void xent_acc(float &m, float &s, float &sz, const float *z) {
    float M = m;
    for (int e = 0; e < N; e++) M = fmaxf(M, z[e]);
    float Ml = M == -INFINITY ? 0.0f : M * TPK__LOG2E;
    s *= tpk__ex2(m * TPK__LOG2E - Ml);
    for (int e = 0; e < N; e++) s += tpk__ex2(fmaf(z[e], TPK__LOG2E, -Ml)), sz += z[e];
    m = M;
}
/* (m, s) += (m2, s2): the running (max, sum exp(z - max)) of two sets of elements; symmetric, so
 * both lanes of a butterfly get the same pair, bit for bit: the two products rounded apart
 * (__fmul_rn) and added (commutative) — a contracted s * a + s2 * b is fma(s, a, s2 * b) in one lane
 * and fma(s2, b, s * a) in the other, and the threads of a row would then hold lse one ulp apart
 * (seen on an H100: xent_fused's dz off xent_grad's). Two empty sets (-inf, 0) stay empty. */
__device__ __forceinline__ void xent_merge(float &m, float &s, float m2, float s2) {
    float M = fmaxf(m, m2);
    if (M == -INFINITY) return;
    s = __fadd_rn(__fmul_rn(s, expf(m - M)), __fmul_rn(s2, expf(m2 - M))), m = M;
}
__device__ __forceinline__ void xent_warp_merge(float &m, float &s) {
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        xent_merge(m, s, m2, s2);
    }
}
/* The block's statistics of row t in one read (online softmax): each thread keeps the running
 * max and sum of its elements, the warps merge them by butterflies, warp 0's lanes the warps';
 * p = (m, s, z[t, c] or 0, sum z) in every thread. sh: [96] floats. */
template <bool VEC, class T>
__device__ __forceinline__ void xent_stats_block(float p[4], const T *z, int64_t t, int64_t Vl, int64_t ld, int64_t c, float *sh) {
    float m = -INFINITY, s = 0.0f, sz = 0.0f;
    const T *row = z + (size_t)t * (size_t)ld;
    int nv = VEC ? (int)(Vl / TPK__VEC) : 0; /* whole vectors (columns in int: ld <= INT_MAX, the launchers) */
    for (int k = threadIdx.x; k < nv; k += blockDim.x) {
        float v[TPK__VEC];
        tpk__ldn<TPK__VEC>(row, (size_t)k * TPK__VEC, v);
        xent_acc<TPK__VEC>(m, s, sz, v);
    }
    for (int j = nv * TPK__VEC + threadIdx.x; j < (int)Vl; j += blockDim.x) {
        float v = tpk__ldf(row, (size_t)j);
        xent_acc<1>(m, s, sz, &v);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    xent_warp_merge(m, s);
    if (lane == 0) sh[w] = m, sh[32 + w] = s;
    __syncthreads();
    m = lane < nw ? sh[lane] : -INFINITY, s = lane < nw ? sh[32 + lane] : 0.0f;
    xent_warp_merge(m, s);
    p[0] = m, p[1] = s, p[2] = c >= 0 && c < Vl ? tpk__ldf(row, (size_t)c) : 0.0f, p[3] = tpk__block_sum(sz, sh + 64);
}
template <class T, bool VEC>
__global__ void __launch_bounds__(XENT_THREADS, 2) xent_stats_kernel(float *part, const T *z, const int32_t *y, int64_t Vl, int64_t ld, int64_t v0) {
    __shared__ float sh[96];
    int64_t t = blockIdx.x;
    float p[4];
    xent_stats_block<VEC>(p, z, t, Vl, ld, (int64_t)y[t] - v0, sh);
    if (threadIdx.x == 0) part[4 * t] = p[0], part[4 * t + 1] = p[1], part[4 * t + 2] = p[2], part[4 * t + 3] = p[3];
}
static tpk_status cuda_xent_stats(tpk_ctx *ctx, float *part, const void *z, const int32_t *targets, int64_t T, int64_t Vl, int64_t ld,
                                  int64_t v0, tpk_dtype dt) {
    static const char *fn = "cuda.xent_stats";
    if (T == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "grid: one block per row"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "ld", ld, INT_MAX, "32-bit column indices"));
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(xent_vec(z, ld), [&](auto v) {
            xent_stats_kernel<Tt, decltype(v)::value><<<(unsigned)T, XENT_THREADS, 0, st->stream>>>(part, (const Tt *)z, targets, Vl, ld, v0);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* the loss and lse of each row: tpk__xent_loss_row (tpk/ops.h), the host's arithmetic */
static __global__ void xent_loss_kernel(float *loss, float *lse, const float *part, int64_t P, const int32_t *y, int64_t T, int64_t V, float eps,
                                        int32_t ignore) {
    TPK__GRID_STRIDE(t, (size_t)T) lse[t] = tpk__xent_loss_row(loss + t, part, P, T, (int64_t)t, y[t] == ignore, V, eps);
}
static tpk_status cuda_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *part, int64_t P, const int32_t *targets, int64_t T,
                                 int64_t V, float smoothing, int32_t ignore_index) {
    static const char *fn = "cuda.xent_loss";
    if (T == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    xent_loss_kernel<<<tpk__grid_for((size_t)T, 256), 256, 0, st->stream>>>(loss, lse, part, P, targets, T, V, smoothing, ignore_index);
    return tpk__cuda_launched(ctx, fn);
}

/* The mean loss, left on the device (no host wait): one block of THREADS; thread i sums loss[i],
 * loss[i + THREADS], ... in double, the warps' lanes by a fixed butterfly, thread 0 the warps in
 * order — an order fixed by T alone, so the same value every run (the host sums t ascending: the
 * two agree to double rounding before the cast to float). */
template <int THREADS>
__global__ void __launch_bounds__(THREADS) xent_mean_kernel(double *acc, const float *loss, int64_t T, int64_t count, bool accumulate) {
    __shared__ double sh[THREADS / 32];
    double s = 0.0;
    for (int64_t t = threadIdx.x; t < T; t += THREADS) s += (double)loss[t];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int w = 0; w < THREADS / 32; w++) sum += sh[w];
        float m = count > 0 ? (float)(sum / (double)count) : 0.0f;
        *acc = (accumulate ? *acc : 0.0) + (double)m;
    }
}
static tpk_status cuda_xent_mean(tpk_ctx *ctx, double *acc, const float *loss, int64_t T, int64_t count, bool accumulate) {
    static const char *fn = "cuda.xent_mean";
    TPK__CUDA_STATE(st, ctx, fn);
    xent_mean_kernel<512><<<1, 512, 0, st->stream>>>(acc, loss, T, count, accumulate);
    return tpk__cuda_launched(ctx, fn);
}

/* dz of one element: (e^(z - l) - eps/V - (1-eps) [target]) d, as e^(z - l) d - (eps/V) d, less
 * (1-eps) d at the target (Ll = l log2 e, ed = (eps/V) d, td = (1-eps) d) */
__device__ __forceinline__ float xent_dz(float z, float Ll, float d, float ed, float td, bool target) {
    float v = fmaf(tpk__ex2(fmaf(z, TPK__LOG2E, -Ll)), d, -ed);
    return target ? v - td : v;
}
/* dz of row t by a block (l its lse, d its dloss, c its local target column, skip: ignored): the
 * columns from Vl on zero; z[k] is read before dz[k] is written by the same thread, so dz may alias
 * z. VEC: the whole vectors inside the row's Vl columns without a test of the target, then the
 * vectors from there to ld (the padding) element by element; the thread whose whole vector holds
 * the target reads z[c] first and writes dz[c] again, as the target's, after its vectors.
 * Otherwise one element at a time. Columns in int (ld <= INT_MAX: the launchers). */
template <bool VEC, class T>
__device__ __forceinline__ void xent_grad_row(T *dz, const T *z, int Vl, int ld, float l, float d, bool skip, int64_t c, int64_t V, float eps) {
    constexpr int N = VEC ? TPK__VEC : 1;
    int nt = blockDim.x, u = threadIdx.x;
    if (skip) { /* uniform over the block */
        for (int k = u; k < ld / N; k += nt) {
            float v[N] = {};
            tpk__stn<N>(dz, (size_t)k * N, v);
        }
        return;
    }
    float Ll = l * TPK__LOG2E, ed = eps / (float)V * d, td = (1.0f - eps) * d;
    int nv = VEC ? Vl / N : 0;                                            /* whole vectors inside the Vl columns */
    bool owner = c >= 0 && c < (int64_t)nv * N && (int)(c / N) % nt == u; /* of the target's, among them */
    float zc = owner ? tpk__ldf(z, (size_t)c) : 0.0f;
    for (int k = u; k < nv; k += nt) {
        float v[N];
        tpk__ldn<N>(z, (size_t)k * N, v);
        for (int e = 0; e < N; e++) v[e] = xent_dz(v[e], Ll, d, ed, td, false);
        tpk__stn<N>(dz, (size_t)k * N, v);
    }
    if (owner) tpk__stf(dz, (size_t)c, xent_dz(zc, Ll, d, ed, td, true));
    for (int k = nv + u; k < ld / N; k += nt) {
        float v[N];
        tpk__ldn<N>(z, (size_t)k * N, v);
        for (int e = 0; e < N; e++) {
            int64_t j = (int64_t)k * N + e;
            v[e] = j >= Vl ? 0.0f : xent_dz(v[e], Ll, d, ed, td, j == c);
        }
        tpk__stn<N>(dz, (size_t)k * N, v);
    }
}
template <class T, bool VEC>
__global__ void __launch_bounds__(XENT_GRAD_THREADS) xent_grad_kernel(T *dz, const T *z, const float *lse, const int32_t *y, const float *dloss,
                                                                 int64_t Vl, int64_t ld, int64_t v0, int64_t V, float eps, int32_t ignore) {
    int64_t t = blockIdx.x;
    int32_t yt = y[t];
    size_t o = (size_t)t * (size_t)ld;
    xent_grad_row<VEC>(dz + o, z + o, (int)Vl, (int)ld, lse[t], dloss[t], yt == ignore, (int64_t)yt - v0, V, eps);
}
static tpk_status cuda_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse, const int32_t *targets, const float *dloss,
                               int64_t T, int64_t Vl, int64_t ld, int64_t v0, int64_t V, float smoothing, int32_t ignore_index, tpk_dtype dt) {
    static const char *fn = "cuda.xent_grad";
    if (T * ld == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "grid: one block per row"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "ld", ld, INT_MAX, "32-bit column indices"));
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(xent_vec(z, ld) && tpk__aligned16({dz}), [&](auto v) {
            xent_grad_kernel<Tt, decltype(v)::value><<<(unsigned)T, XENT_GRAD_THREADS, 0, st->stream>>>((Tt *)dz, (const Tt *)z, lse, targets, dloss, Vl, ld,
                                                                                                  v0, V, smoothing, ignore_index);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* The loss and gradient of one rank holding the whole vocabulary, a row per block: the statistics
 * (xent_stats_block: one read of the row from memory), the loss and lse (tpk__xent_loss_row, P = 1,
 * computed alike by every thread), then dz over the row, padding included (its second read comes
 * from the L2 cache the first one filled: 100 KB for GPT-2's bf16 row) — the same functions as
 * xent_stats, xent_loss and xent_grad, so the same bits. dz may alias z (each element read
 * before the same thread writes it; the statistics are complete before any write). */
template <class T, bool VEC>
__global__ void __launch_bounds__(XENT_THREADS, 2) xent_fused_kernel(T *dz, float *loss, float *lse, const T *z, const int32_t *y, int64_t V,
                                                                  int64_t ld, float eps, int32_t ignore, float g) {
    __shared__ float sh[96];
    int64_t t = blockIdx.x;
    int32_t yt = y[t];
    bool skip = yt == ignore;
    float p[4], lt;
    xent_stats_block<VEC>(p, z, t, V, ld, yt, sh);
    float l = tpk__xent_loss_row(&lt, p, 1, 1, 0, skip, V, eps);
    if (threadIdx.x == 0) loss[t] = lt, lse[t] = l;
    __syncthreads(); /* every thread's reads of the row for the statistics precede any write of dz */
    size_t o = (size_t)t * (size_t)ld;
    xent_grad_row<VEC>(dz + o, z + o, (int)V, (int)ld, l, g, skip, yt, V, eps);
}
static tpk_status cuda_xent_fused(tpk_ctx *ctx, void *dz, float *loss, float *lse, const void *z, const int32_t *targets, int64_t T, int64_t V,
                                  int64_t ld, float smoothing, int32_t ignore_index, float g, tpk_dtype dt) {
    static const char *fn = "cuda.xent_fused";
    if (T == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "grid: one block per row"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "ld", ld, INT_MAX, "32-bit column indices"));
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(xent_vec(z, ld) && tpk__aligned16({dz}), [&](auto v) {
            xent_fused_kernel<Tt, decltype(v)::value><<<(unsigned)T, XENT_THREADS, 0, st->stream>>>((Tt *)dz, loss, lse, (const Tt *)z, targets, V,
                                                                                                   ld, smoothing, ignore_index, g);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- attention ------------------------------------------------------------------------------------ */

enum { ATT_WARPS = 8, ATT_TILE = 32, ATT_MAXD = 512 };

/* Shared memory, in floats, of the three attention kernels for head dim D:
 * two padded [ATT_TILE][D+1] tiles, ATT_WARPS rows of 2 D, ATT_WARPS x ATT_TILE x 2 weights. */
static inline size_t att_smem(int64_t D) {
    return sizeof(float) * (size_t)(2 * ATT_TILE * (D + 1) + ATT_WARPS * 2 * D + ATT_WARPS * ATT_TILE * 2);
}

/* Stage rows [r0, r0 + ATT_TILE) (rows >= S as zeros) of column block `col` of qkv-like
 * storage (leading dimension ld) into dst [ATT_TILE][D+1] floats. */
template <class T>
__device__ __forceinline__ void att_stage(float *dst, const T *base, int64_t ld, int64_t r0, int64_t S, int64_t D) {
    for (int64_t k = threadIdx.x; k < ATT_TILE * D; k += blockDim.x) {
        int64_t r = k / D, e = k % D;
        dst[r * (D + 1) + e] = r0 + r < S ? tpk__ldf(base, (size_t)((r0 + r) * ld + e)) : 0.0f;
    }
}

/* grid (ceil(S / ATT_WARPS), Al, B); warp w handles query row i = blockIdx.x * ATT_WARPS + w.
 * Registers: o[NE] holds O_i columns lane + 32 e. */
template <class T, int NE>
__global__ void attn_fwd_kernel(T *out, float *lse, const T *qkv, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t G, int64_t head0,
                                float scale, float p, uint64_t seed, uint64_t stream) {
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + ATT_TILE * (D + 1), *qs = Vs + ATT_TILE * (D + 1), *ps = qs + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_WARPS, i = i0 + w;
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D); /* query head h reads key/value head kv */
    int64_t ld3 = hd.ld, ldo = Al * D, kv = tpk__fl_kv_of(hd, head0, h);
    const T *Q = qkv + b * S * ld3 + h * D, *K = qkv + b * S * ld3 + (Al + kv) * D, *V = K + (int64_t)hd.Gl * D;
    float *q = qs + w * 2 * D, *pw = ps + w * ATT_TILE;
    for (int64_t e = lane; e < D; e += 32) q[e] = i < S ? tpk__ldf(Q, (size_t)(i * ld3 + e)) * scale : 0.0f;
    float o[NE], m = -INFINITY, l = 0.0f;
    for (int e = 0; e < NE; e++) o[e] = 0.0f;
    int64_t last = (i0 + ATT_WARPS - 1 < S - 1 ? i0 + ATT_WARPS - 1 : S - 1); /* the block's last query row */
    for (int64_t j0 = 0; j0 <= last; j0 += ATT_TILE) {
        __syncthreads();
        att_stage(Ks, K, ld3, j0, S, D);
        att_stage(Vs, V, ld3, j0, S, D);
        __syncthreads();
        if (i >= S || j0 > i) continue;
        /* lane scores key j0 + lane */
        int64_t j = j0 + lane;
        float s = -INFINITY;
        if (j <= i) {
            s = 0.0f;
            for (int64_t e = 0; e < D; e++) s += q[e] * Ks[lane * (D + 1) + e];
        }
        float mn = fmaxf(m, tpk__warp_max(s));
        float pe = j <= i ? expf(s - mn) : 0.0f, corr = expf(m - mn); /* m = -inf at first: corr = 0 */
        l = l * corr + tpk__warp_sum(pe);
        pw[lane] = pe * (j <= i ? tpk__att_keep(p, seed, stream, b, A, head0 + h, S, i, j) : 0.0f);
        __syncwarp();
        int64_t nk = i - j0 + 1 < ATT_TILE ? i - j0 + 1 : ATT_TILE;
        for (int e = 0; e < NE; e++) {
            int64_t c = lane + 32 * e;
            float acc = o[e] * corr;
            if (c < D)
                for (int64_t jj = 0; jj < nk; jj++) acc += pw[jj] * Vs[jj * (D + 1) + c];
            o[e] = acc;
        }
        __syncwarp();
        m = mn;
    }
    if (i >= S) return;
    float inv = 1.0f / l;
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        if (c < D) tpk__stf(out, (size_t)((b * S + i) * ldo + h * D + c), o[e] * inv);
    }
    if (lane == 0) lse[(b * Al + h) * S + i] = m + logf(l);
}

template <class F> static tpk_status att_by_ne(tpk_ctx *ctx, const char *fn, int64_t D, F f) {
    if (D <= 32) f(std::integral_constant<int, 1>{});
    else if (D <= 64) f(std::integral_constant<int, 2>{});
    else if (D <= 128) f(std::integral_constant<int, 4>{});
    else if (D <= 256) f(std::integral_constant<int, 8>{});
    else if (D <= ATT_MAXD) f(std::integral_constant<int, 16>{});
    else return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn, "D: head dims up to %d are supported, got %lld", ATT_MAXD, (long long)D);
    return TPK_OK;
}

/* The front end checked the arguments; this backend's own limits are the head dim, the grid
 * (ceil(S / ATT_WARPS), Al, B) and 32-bit head indices (tpk__fl_heads). */
static tpk_status att_check(tpk_ctx *ctx, const char *fn, int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A) {
    if (D > ATT_MAXD)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn, "D: head dims up to %d are supported, got %lld", ATT_MAXD, (long long)D);
    TPK_TRY(tpk__cuda_limit(ctx, fn, "B", B, 65535, "grid z"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "Al", Al, 65535, "grid y"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "A", A, INT_MAX, "32-bit head indices"));
    return tpk__cuda_limit(ctx, fn, "S", S, (int64_t)INT_MAX * ATT_WARPS, "grid x: ATT_WARPS query rows per block");
}

/* Allow the dynamic shared memory a kernel needs beyond the default 48 KiB; more than the GPU
 * gives a block is refused by name. */
template <class K> static tpk_status att_smem_attr(tpk_ctx *ctx, const char *fn, const tpk__cuda_state *st, int64_t D, K kernel, size_t bytes) {
    if (bytes > st->smem_optin)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn, "D: head dim %lld needs %zu bytes of shared memory per block, this GPU allows %zu", (long long)D,
                         bytes, st->smem_optin);
    if (bytes > 48 * 1024) TPK__CUDA_TRY(ctx, fn, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return TPK_OK;
}

/* dQ of dqkv (bf16, rows of ld3) = scale dq_acc (f32 [rows, AlD], the tensor-core backward's sums
 * of dS K), 8 elements per step: AlD is a multiple of 8 and both 16-byte aligned */
__global__ void attn_dq_store_kernel(tpk__bf16 *dqkv, const float *dq_acc, size_t rows, int64_t AlD, int64_t ld3, float scale) {
    size_t per = (size_t)AlD / 8;
    TPK__GRID_STRIDE(j, rows * per) {
        size_t r = j / per, c = (j % per) * 8;
        float v[8];
        tpk__ldn<8>(dq_acc, r * (size_t)AlD + c, v);
        for (int k = 0; k < 8; k++) v[k] *= scale;
        tpk__stn<8>(dqkv, r * (size_t)ld3 + c, v);
    }
}

/* TPK_ATTN=generic in the environment (for benchmarks) selects the generic kernels */
static bool attn_env_is(const char *v) {
    const char *env = getenv("TPK_ATTN");
    return env && strcmp(env, v) == 0;
}
/* The tensor-core kernels (flash.cuh) take bf16 with D = 64 or 128 on sm_80 and later where a block
 * may have the shared memory they need (at most 78 KB: the 99 KiB of sm_86/89 suffice), rows
 * 16-byte aligned, unless TPK_ATTN=generic. */
static bool flash_usable(const tpk__cuda_state *st, tpk_dtype dt, int64_t D, const void *a, const void *b) {
    if (dt != TPK_BF16 || (D != 64 && D != 128) || st->cc < 80 || !tpk__aligned16({a, b})) return false;
    for (int k = 0; k < 4; k++)
        if (tpk__flash_smem(k, (int)D) > st->smem_optin) return false;
    return !attn_env_is("generic");
}
/* f(D, DROP) with the head dim and whether dropout is on as compile-time constants */
template <class F> static void flash_by_d(int64_t D, float p, F f) {
    auto drop = [&](auto d) {
        if (p > 0.0f) f(d, std::true_type{});
        else f(d, std::false_type{});
    };
    if (D == 64) drop(std::integral_constant<int, 64>{});
    else drop(std::integral_constant<int, 128>{});
}

static tpk_status cuda_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al, int64_t D,
                              int64_t A, int64_t G, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "cuda.attn_fwd";
    TPK_TRY(att_check(ctx, fn, B, S, Al, D, A));
    if (B == 0 || S == 0 || Al == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (flash_usable(st, dt, D, qkv, out) && tpk__flash_fits(S, Al, tpk_attn_kv_heads(A, G, head0, Al, NULL), D)) {
        tpk_status s = TPK_OK;
        flash_by_d(D, p, [&](auto d, auto drop) {
            constexpr int DD = decltype(d)::value, W = tpk__fl_warps(0), ROWS = tpk__fl_fwd_rows(DD);
            auto kernel = tpk__flash_fwd<DD, W, tpk__fl_fwd_mt(DD), decltype(drop)::value>;
            size_t bytes = tpk__flash_smem(0, DD);
            if ((s = att_smem_attr(ctx, fn, st, D, kernel, bytes)) != TPK_OK) return;
            dim3 fgrid((unsigned)((S + ROWS - 1) / ROWS), (unsigned)Al, (unsigned)B);
            kernel<<<fgrid, 32 * W, bytes, st->stream>>>((uint16_t *)out, lse, (const uint16_t *)qkv, S, Al, A, G, head0, scale, p, seed, stream);
        });
        TPK_TRY(s);
        return tpk__cuda_launched(ctx, fn);
    }
    size_t smem = att_smem(D);
    dim3 grid((unsigned)((S + ATT_WARPS - 1) / ATT_WARPS), (unsigned)Al, (unsigned)B);
    tpk_status s = TPK_OK;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        /* the lambda records a failure of the shared-memory attribute in s; att_by_ne's own
         * status (an unsupported D) must not overwrite it with TPK_OK */
        tpk_status r = att_by_ne(ctx, fn, D, [&](auto ne) {
            auto kernel = attn_fwd_kernel<T, decltype(ne)::value>;
            if ((s = att_smem_attr(ctx, fn, st, D, kernel, smem)) != TPK_OK) return;
            kernel<<<grid, 32 * ATT_WARPS, smem, st->stream>>>((T *)out, lse, (const T *)qkv, S, Al, D, A, G, head0, scale, p, seed, stream);
        });
        if (s == TPK_OK) s = r;
    });
    TPK_TRY(s);
    return tpk__cuda_launched(ctx, fn);
}

/* Dr[b, h, i] = sum_e dO_i O_i (rows r = (b Al + h) S + i; the warps stride over the rows, so the
 * grid stays within limits whatever B Al S is). D a multiple of 8 and dO, O 16-byte aligned: a row's
 * D / 8 16-byte vectors go to a group of L lanes (the power of two at or above D / 8, at most 32),
 * a warp takes 32 / L rows at a time (4 at D = 64) and sums a group by butterflies within it;
 * otherwise a warp a row, one element a lane. attn_dr_rows: the rows a warp takes at a time on the
 * vector path, which the kernel and its launch grid share. */
static __host__ __device__ inline int attn_dr_rows(int64_t D) {
    int64_t nv = D / TPK__VEC;
    int L = 1;
    while (L < nv && L < 32) L *= 2;
    return 32 / L;
}
static inline unsigned attn_dr_grid(int64_t nrows, int64_t D) {
    int R = D % TPK__VEC == 0 ? attn_dr_rows(D) : 1;
    return tpk__grid_for((size_t)((nrows + R - 1) / R), ATT_WARPS);
}
template <class T> __global__ void attn_dr_kernel(float *Dr, const T *dout, const T *out, int64_t B, int64_t S, int64_t Al, int64_t D) {
    int lane = threadIdx.x & 31;
    int64_t nrows = B * Al * S, warp = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5), nwarps = (int64_t)gridDim.x * ATT_WARPS;
    if (D % TPK__VEC == 0 && ((uintptr_t)dout | (uintptr_t)out) % 16 == 0) { /* uniform over the grid */
        int64_t nv = D / TPK__VEC;
        int R = attn_dr_rows(D), L = 32 / R, g = lane / L, li = lane % L;
        bool small = nrows <= (int64_t)UINT32_MAX; /* 32-bit divisions (a 64-bit one costs about 10 times the instructions) */
        for (int64_t r0 = warp * R; r0 < nrows; r0 += nwarps * R) { /* uniform over the warp */
            int64_t r = r0 + g, bh, i;
            if (small) {
                uint32_t q = (uint32_t)r / (uint32_t)S;
                bh = q, i = (int64_t)((uint32_t)r - q * (uint32_t)S);
            } else {
                bh = r / S, i = r - bh * S;
            }
            int64_t b = small ? (int64_t)((uint32_t)bh / (uint32_t)Al) : bh / Al, h = bh - b * Al; /* r = (b Al + h) S + i */
            float s = 0.0f;
            if (r < nrows) {
                size_t base = (size_t)((b * S + i) * Al * D + h * D);
                for (int64_t v = li; v < nv; v += L) {
                    float a[TPK__VEC], o[TPK__VEC];
                    tpk__ldn<TPK__VEC>(dout, base + (size_t)v * TPK__VEC, a);
                    tpk__ldn<TPK__VEC>(out, base + (size_t)v * TPK__VEC, o);
                    for (int e = 0; e < TPK__VEC; e++) s += a[e] * o[e];
                }
            }
            for (int m = L / 2; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
            if (li == 0 && r < nrows) Dr[r] = s;
        }
        return;
    }
    for (int64_t r = warp; r < nrows; r += nwarps) {
        int64_t i = r % S, h = (r / S) % Al, b = r / (S * Al); /* r = (b Al + h) S + i */
        size_t base = (size_t)((b * S + i) * Al * D + h * D);
        float s = 0.0f;
        for (int64_t e = lane; e < D; e += 32) s += tpk__ldf(dout, base + e) * tpk__ldf(out, base + e);
        s = tpk__warp_sum(s); /* r is the same on every lane of the warp */
        if (lane == 0) Dr[r] = s;
    }
}

/* dQ: warp w owns query row i; over key tiles j0 <= i: lane j scores s = scale q.k_j, dp = dO_i.v_j */
template <class T, int NE>
__global__ void attn_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *Dr, int64_t S, int64_t Al, int64_t D,
                               int64_t A, int64_t G, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream) {
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + ATT_TILE * (D + 1), *rows = Vs + ATT_TILE * (D + 1), *ps = rows + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_WARPS, i = i0 + w;
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int64_t ld3 = hd.ld, ldo = Al * D, kv = tpk__fl_kv_of(hd, head0, h);
    const T *Q = qkv + b * S * ld3 + h * D, *K = qkv + b * S * ld3 + (Al + kv) * D, *V = K + (int64_t)hd.Gl * D, *dO = dout + b * S * ldo + h * D;
    float *q = rows + w * 2 * D, *go = q + D, *dsw = ps + w * ATT_TILE;
    for (int64_t e = lane; e < D; e += 32) {
        q[e] = i < S ? tpk__ldf(Q, (size_t)(i * ld3 + e)) : 0.0f;
        go[e] = i < S ? tpk__ldf(dO, (size_t)(i * ldo + e)) : 0.0f;
    }
    float L = 0.0f, Di = 0.0f, acc[NE];
    if (i < S) L = lse[(b * Al + h) * S + i], Di = Dr[(b * Al + h) * S + i];
    for (int e = 0; e < NE; e++) acc[e] = 0.0f;
    int64_t last = (i0 + ATT_WARPS - 1 < S - 1 ? i0 + ATT_WARPS - 1 : S - 1);
    for (int64_t j0 = 0; j0 <= last; j0 += ATT_TILE) {
        __syncthreads();
        att_stage(Ks, K, ld3, j0, S, D);
        att_stage(Vs, V, ld3, j0, S, D);
        __syncthreads();
        if (i >= S || j0 > i) continue;
        int64_t j = j0 + lane;
        float ds = 0.0f;
        if (j <= i) {
            float s = 0.0f, dp = 0.0f;
            for (int64_t e = 0; e < D; e++) s += q[e] * Ks[lane * (D + 1) + e], dp += go[e] * Vs[lane * (D + 1) + e];
            float P = expf(scale * s - L);
            ds = P * (dp * tpk__att_keep(p, seed, stream, b, A, head0 + h, S, i, j) - Di);
        }
        dsw[lane] = ds;
        __syncwarp();
        int64_t nk = i - j0 + 1 < ATT_TILE ? i - j0 + 1 : ATT_TILE;
        for (int e = 0; e < NE; e++) {
            int64_t c = lane + 32 * e;
            if (c < D)
                for (int64_t jj = 0; jj < nk; jj++) acc[e] += dsw[jj] * Ks[jj * (D + 1) + c];
        }
        __syncwarp();
    }
    if (i >= S) return;
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        if (c < D) tpk__stf(dqkv, (size_t)((b * S + i) * ld3 + h * D + c), scale * acc[e]);
    }
}

/* dK, dV: grid (ceil(S / ATT_WARPS), Gl, B); warp w owns key row j of local key/value head y; over
 * the local query heads reading it and their query tiles i0 >= (block's first key, tile-aligned):
 * lane i scores s = scale q_i.k_j, dp = dO_i.v_j; dK, dV sum over those heads in registers */
template <class T, int NE>
__global__ void attn_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *Dr, int64_t S, int64_t Al, int64_t D,
                                int64_t A, int64_t G, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream) {
    extern __shared__ float sm[];
    float *Qs = sm, *dOs = Qs + ATT_TILE * (D + 1), *rows = dOs + ATT_TILE * (D + 1), *ps = rows + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t b = blockIdx.z, kv = blockIdx.y, j0 = (int64_t)blockIdx.x * ATT_WARPS, j = j0 + w;
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int64_t ld3 = hd.ld, ldo = Al * D;
    int h0, h1; /* the local query heads reading key/value head kv */
    tpk__fl_q_of(hd, head0, Al, kv, &h0, &h1);
    const T *K = qkv + b * S * ld3 + (Al + kv) * D, *V = K + (int64_t)hd.Gl * D;
    float *k = rows + w * 2 * D, *v = k + D, *pk = ps + w * 2 * ATT_TILE, *dsw = pk + ATT_TILE;
    for (int64_t e = lane; e < D; e += 32) {
        k[e] = j < S ? tpk__ldf(K, (size_t)(j * ld3 + e)) : 0.0f;
        v[e] = j < S ? tpk__ldf(V, (size_t)(j * ld3 + e)) : 0.0f;
    }
    float dk[NE], dv[NE];
    for (int e = 0; e < NE; e++) dk[e] = dv[e] = 0.0f;
    for (int64_t h = h0; h < h1; h++) {
        const T *Q = qkv + b * S * ld3 + h * D, *dO = dout + b * S * ldo + h * D;
        const float *Lh = lse + (b * Al + h) * S, *Dh = Dr + (b * Al + h) * S;
        for (int64_t q0 = j0 / ATT_TILE * ATT_TILE; q0 < S; q0 += ATT_TILE) {
            __syncthreads();
            att_stage(Qs, Q, ld3, q0, S, D);
            att_stage(dOs, dO, ldo, q0, S, D);
            __syncthreads();
            if (j >= S || q0 + ATT_TILE - 1 < j) continue;
            int64_t i = q0 + lane;
            float pd = 0.0f, ds = 0.0f;
            if (i < S && i >= j) {
                float s = 0.0f, dp = 0.0f;
                for (int64_t e = 0; e < D; e++) s += Qs[lane * (D + 1) + e] * k[e], dp += dOs[lane * (D + 1) + e] * v[e];
                float P = expf(scale * s - Lh[i]), keep = tpk__att_keep(p, seed, stream, b, A, head0 + h, S, i, j);
                pd = P * keep;
                ds = P * (dp * keep - Dh[i]);
            }
            pk[lane] = pd, dsw[lane] = ds;
            __syncwarp();
            for (int e = 0; e < NE; e++) {
                int64_t c = lane + 32 * e;
                if (c < D)
                    for (int ii = 0; ii < ATT_TILE; ii++) {
                        dv[e] += pk[ii] * dOs[ii * (D + 1) + c];
                        dk[e] += dsw[ii] * Qs[ii * (D + 1) + c];
                    }
            }
            __syncwarp();
        }
    } /* the next query head reading this key/value head */
    if (j >= S) return;
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        if (c < D) {
            tpk__stf(dqkv, (size_t)((b * S + j) * ld3 + (Al + kv) * D + c), scale * dk[e]);
            tpk__stf(dqkv, (size_t)((b * S + j) * ld3 + (Al + hd.Gl + kv) * D + c), dv[e]);
        }
    }
}

static tpk_status cuda_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t G, int64_t head0, float scale, float p,
                              uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "cuda.attn_bwd";
    TPK_TRY(att_check(ctx, fn, B, S, Al, D, A));
    if (B == 0 || S == 0 || Al == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    float *Dr;
    size_t nrows = (size_t)(B * Al * S);
    if (flash_usable(st, dt, D, qkv, out) && flash_usable(st, dt, D, dqkv, dout) && tpk__flash_fits(S, Al, tpk_attn_kv_heads(A, G, head0, Al, NULL), D)) {
        /* Dr [B, Al, S]; unless deterministic, dq_acc [B, S, Al, D] f32, zeroed, that the dK/dV kernel
         * adds dS K into with atomics (FlashAttention-2); deterministic: the dQ kernel instead */
        bool fused = !ctx->deterministic;
        size_t dr_bytes = (sizeof(float) * nrows + 255) / 256 * 256, nq = nrows * (size_t)D;
        float *dq_acc = NULL;
        TPK_TRY(tpk__cuda_scratch(ctx, fn, st, dr_bytes + (fused ? sizeof(float) * nq : 0), (void **)&Dr));
        if (fused) {
            dq_acc = reinterpret_cast<float *>(reinterpret_cast<char *>(Dr) + dr_bytes);
            TPK__CUDA_TRY(ctx, fn, cudaMemsetAsync(dq_acc, 0, sizeof(float) * nq, st->stream));
        }
        attn_dr_kernel<tpk__bf16><<<attn_dr_grid(nrows, D), 32 * ATT_WARPS, 0, st->stream>>>(Dr, (const tpk__bf16 *)dout,
                                                                                                     (const tpk__bf16 *)out, B, S, Al, D);
        int64_t Gl = tpk_attn_kv_heads(A, G, head0, Al, NULL);
        dim3 fgrid((unsigned)((S + TPK__FL_ROWS - 1) / TPK__FL_ROWS), (unsigned)Al, (unsigned)B); /* dQ: 64 queries a block */
        tpk_status s = TPK_OK;
        flash_by_d(D, p, [&](auto d, auto drop) {
            constexpr int DD = decltype(d)::value, W = tpk__fl_warps(1);
            constexpr bool DROP = decltype(drop)::value;
            dim3 kvgrid((unsigned)((S + 16 * W - 1) / (16 * W)), (unsigned)Gl, (unsigned)B); /* dK, dV: one block row per key/value head */
            if (fused) {
                auto kkv = tpk__flash_dkv<DD, W, DROP, true>;
                size_t bkv = tpk__flash_smem(3, DD);
                if ((s = att_smem_attr(ctx, fn, st, D, kkv, bkv)) != TPK_OK) return;
                kkv<<<kvgrid, 32 * W, bkv, st->stream>>>((uint16_t *)dqkv, dq_acc, (const uint16_t *)dout, (const uint16_t *)qkv, lse, Dr, S, Al, A, G,
                                                         head0, scale, p, seed, stream);
                int64_t ld3 = (Al + 2 * Gl) * DD;
                attn_dq_store_kernel<<<tpk__grid_for(nq / 8, 256), 256, 0, st->stream>>>((tpk__bf16 *)dqkv, dq_acc, (size_t)(B * S), Al * DD, ld3,
                                                                                         scale);
                return;
            }
            auto kkv = tpk__flash_dkv<DD, W, DROP, false>;
            auto kq = tpk__flash_dq<DD, DROP>;
            size_t bkv = tpk__flash_smem(1, DD), bq = tpk__flash_smem(2, DD);
            if ((s = att_smem_attr(ctx, fn, st, D, kkv, bkv)) != TPK_OK || (s = att_smem_attr(ctx, fn, st, D, kq, bq)) != TPK_OK) return;
            kkv<<<kvgrid, 32 * W, bkv, st->stream>>>((uint16_t *)dqkv, (float *)NULL, (const uint16_t *)dout, (const uint16_t *)qkv, lse, Dr, S, Al, A,
                                                     G, head0, scale, p, seed, stream);
            kq<<<fgrid, 128, bq, st->stream>>>((uint16_t *)dqkv, (const uint16_t *)dout, (const uint16_t *)qkv, lse, Dr, S, Al, A, G, head0, scale, p,
                                               seed, stream);
        });
        TPK_TRY(s);
        return tpk__cuda_launched(ctx, fn);
    }
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(float) * nrows, (void **)&Dr));
    size_t smem = att_smem(D);
    dim3 grid((unsigned)((S + ATT_WARPS - 1) / ATT_WARPS), (unsigned)Al, (unsigned)B);
    dim3 kvgrid(grid.x, (unsigned)tpk_attn_kv_heads(A, G, head0, Al, NULL), (unsigned)B);
    tpk_status s = TPK_OK;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        attn_dr_kernel<T><<<attn_dr_grid(nrows, D), 32 * ATT_WARPS, 0, st->stream>>>(Dr, (const T *)dout,
                                                                                                         (const T *)out, B, S, Al, D);
        tpk_status r = att_by_ne(ctx, fn, D, [&](auto ne) { /* failures recorded in s, as in attn_fwd */
            auto kq = attn_dq_kernel<T, decltype(ne)::value>;
            auto kkv = attn_dkv_kernel<T, decltype(ne)::value>;
            if ((s = att_smem_attr(ctx, fn, st, D, kq, smem)) != TPK_OK || (s = att_smem_attr(ctx, fn, st, D, kkv, smem)) != TPK_OK) return;
            kq<<<grid, 32 * ATT_WARPS, smem, st->stream>>>((T *)dqkv, (const T *)dout, (const T *)qkv, lse, Dr, S, Al, D, A, G, head0, scale,
                                                           p, seed, stream);
            kkv<<<kvgrid, 32 * ATT_WARPS, smem, st->stream>>>((T *)dqkv, (const T *)dout, (const T *)qkv, lse, Dr, S, Al, D, A, G, head0,
                                                              scale, p, seed, stream);
        });
        if (s == TPK_OK) s = r;
    });
    TPK_TRY(s);
    return tpk__cuda_launched(ctx, fn);
}

/* This file's entries of the cuda backend's table. */
void tpk__cuda_layer_ops(tpk_ops *o) {
#define TPK__CUDA_ENTRY(e) o->e = cuda_##e;
    TPK__OPS_LAYERS(TPK__CUDA_ENTRY) /* o->dropout = cuda_dropout, ... */
#undef TPK__CUDA_ENTRY
    o->residual_layernorm_fwd = cuda_residual_layernorm_fwd, o->xent_fused = cuda_xent_fused; /* fusions (TPK__OPS_FUSED) */
}
