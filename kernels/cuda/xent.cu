/* kernels/cuda/xent.cu — the CUDA backend's cross-entropy pieces (vocabulary-parallel).
 *
 *   xent       per row (one block), one read: the running max m and sum exp(z - m) (online
 *              softmax, merged across threads by butterflies), z_target, sum z; the loss from the
 *              ranks' parts (double); the mean over the rows in one block (double, a fixed tree),
 *              left on the device; dz = (exp(z - lse) - (1-eps) onehot - eps/V) dloss, a block
 *              per row; fused (one rank): statistics, loss and dz of a row in one block. Rows of a
 *              padded vocabulary in 16-byte vectors; exp(x) = 2^(x log2 e) by ex2.approx.ftz */
#include <cmath>

#include "common.cuh"

/* ---- cross-entropy pieces -------------------------------------------------------------------- */

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
static bool xent_vec(const void *z, int64_t ld) {
    return ld % TPK__VEC == 0 && tpk__aligned16({z});
}

/* Add N elements z[] to a thread's running max m, sum s of e^(z - m) and sum sz of z: the new
 * max M first, s rescaled once by e^(m - M), then each element's e^(z - M) (nothing to rescale
 * while every element so far is -inf: 2^-inf = 0) */
template <int N>
__device__ __forceinline__ void xent_acc(float &m, float &s, float &sz, const float *z) {
    float M = m;
    for (int e = 0; e < N; e++) M = fmaxf(M, z[e]);
    float Ml = M == -INFINITY ? 0.0f : M * TPK__LOG2E;
    s *= tpk__ex2(m * TPK__LOG2E - Ml);
    for (int e = 0; e < N; e++) s += tpk__ex2(fmaf(z[e], TPK__LOG2E, -Ml)), sz += z[e];
    m = M;
}
/* (m, s) += (m2, s2): the running (max, sum exp(z - max)) of two sets of elements; symmetric, so
 * both lanes of a butterfly get the same pair, bit for bit: the two products rounded apart
 * (__fmul_rn) and added (commutative) — a contracted s * a + s2 * b is fma(s, a, s2 * b) in one
 * lane and fma(s2, b, s * a) in the other, and the threads of a row would then hold lse one ulp
 * apart (seen on an H100: xent_fused's dz off xent_grad's). Two empty sets (-inf, 0) stay empty. */
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
__device__ __forceinline__ void xent_stats_block(float p[4], const T *z, int64_t t, int64_t Vl,
                                                 int64_t ld, int64_t c, float *sh) {
    float m = -INFINITY, s = 0.0f, sz = 0.0f;
    const T *row = z + (size_t)t * (size_t)ld;
    int nv = VEC ? (int)(Vl / TPK__VEC) : 0; /* whole vectors (columns in int: ld <= INT_MAX, the
                                                launchers) */
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
    p[0] = m, p[1] = s, p[2] = c >= 0 && c < Vl ? tpk__ldf(row, (size_t)c) : 0.0f,
    p[3] = tpk__block_sum(sz, sh + 64);
}
template <class T, bool VEC>
__global__ void __launch_bounds__(XENT_THREADS, 2)
    xent_stats_kernel(float *part, const T *z, const int32_t *y, int64_t Vl, int64_t ld,
                      int64_t v0) {
    __shared__ float sh[96];
    int64_t t = blockIdx.x;
    float p[4];
    xent_stats_block<VEC>(p, z, t, Vl, ld, (int64_t)y[t] - v0, sh);
    if (threadIdx.x == 0)
        part[4 * t] = p[0], part[4 * t + 1] = p[1], part[4 * t + 2] = p[2], part[4 * t + 3] = p[3];
}
static tpk_status cuda_xent_stats(tpk_ctx *ctx, float *part, const void *z, const int32_t *targets,
                                  int64_t T, int64_t Vl, int64_t ld, int64_t v0, tpk_dtype dt) {
    static const char *fn = "cuda.xent_stats";
    if (T == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "grid: one block per row"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "ld", ld, INT_MAX, "32-bit column indices"));
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(xent_vec(z, ld), [&](auto v) {
            xent_stats_kernel<Tt, decltype(v)::value><<<(unsigned)T, XENT_THREADS, 0, st->stream>>>(
                part, (const Tt *)z, targets, Vl, ld, v0);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* the loss and lse of each row: tpk__xent_loss_row (tpk/base/ops.h), the host's arithmetic */
static __global__ void xent_loss_kernel(float *loss, float *lse, const float *part, int64_t P,
                                        const int32_t *y, int64_t T, int64_t V, float eps,
                                        int32_t ignore) {
    TPK__GRID_STRIDE(t, (size_t)T)
    lse[t] = tpk__xent_loss_row(loss + t, part, P, T, (int64_t)t, y[t] == ignore, V, eps);
}
static tpk_status cuda_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *part,
                                 int64_t P, const int32_t *targets, int64_t T, int64_t V,
                                 float smoothing, int32_t ignore_index) {
    static const char *fn = "cuda.xent_loss";
    if (T == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    xent_loss_kernel<<<tpk__grid_for((size_t)T, 256), 256, 0, st->stream>>>(
        loss, lse, part, P, targets, T, V, smoothing, ignore_index);
    return tpk__cuda_launched(ctx, fn);
}

/* The mean loss, left on the device (no host wait): one block of THREADS; thread i sums loss[i],
 * loss[i + THREADS], ... in double, the warps' lanes by a fixed butterfly, thread 0 the warps in
 * order — an order fixed by T alone, so the same value every run (the host sums t ascending: the
 * two agree to double rounding before the cast to float). */
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    xent_mean_kernel(double *acc, const float *loss, int64_t T, int64_t count, bool accumulate) {
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
static tpk_status cuda_xent_mean(tpk_ctx *ctx, double *acc, const float *loss, int64_t T,
                                 int64_t count, bool accumulate) {
    static const char *fn = "cuda.xent_mean";
    TPK__CUDA_STATE(st, ctx, fn);
    xent_mean_kernel<512><<<1, 512, 0, st->stream>>>(acc, loss, T, count, accumulate);
    return tpk__cuda_launched(ctx, fn);
}

/* dz of one element: (e^(z - l) - eps/V - (1-eps) [target]) d, as e^(z - l) d - (eps/V) d, less
 * (1-eps) d at the target (Ll = l log2 e, ed = (eps/V) d, td = (1-eps) d) */
__device__ __forceinline__ float xent_dz(float z, float Ll, float d, float ed, float td,
                                         bool target) {
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
__device__ __forceinline__ void xent_grad_row(T *dz, const T *z, int Vl, int ld, float l, float d,
                                              bool skip, int64_t c, int64_t V, float eps) {
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
    /* whole vectors inside the Vl columns */
    int nv = VEC ? Vl / N : 0;
    /* of the target's, among them */
    bool owner = c >= 0 && c < (int64_t)nv * N && (int)(c / N) % nt == u;
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
__global__ void __launch_bounds__(XENT_GRAD_THREADS)
    xent_grad_kernel(T *dz, const T *z, const float *lse, const int32_t *y, const float *dloss,
                     int64_t Vl, int64_t ld, int64_t v0, int64_t V, float eps, int32_t ignore) {
    int64_t t = blockIdx.x;
    int32_t yt = y[t];
    size_t o = (size_t)t * (size_t)ld;
    xent_grad_row<VEC>(dz + o, z + o, (int)Vl, (int)ld, lse[t], dloss[t], yt == ignore,
                       (int64_t)yt - v0, V, eps);
}
static tpk_status cuda_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse,
                                 const int32_t *targets, const float *dloss, int64_t T, int64_t Vl,
                                 int64_t ld, int64_t v0, int64_t V, float smoothing,
                                 int32_t ignore_index, tpk_dtype dt) {
    static const char *fn = "cuda.xent_grad";
    if (T * ld == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "grid: one block per row"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "ld", ld, INT_MAX, "32-bit column indices"));
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(xent_vec(z, ld) && tpk__aligned16({dz}), [&](auto v) {
            xent_grad_kernel<Tt, decltype(v)::value>
                <<<(unsigned)T, XENT_GRAD_THREADS, 0, st->stream>>>((Tt *)dz, (const Tt *)z, lse,
                                                                    targets, dloss, Vl, ld, v0, V,
                                                                    smoothing, ignore_index);
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
__global__ void __launch_bounds__(XENT_THREADS, 2)
    xent_fused_kernel(T *dz, float *loss, float *lse, const T *z, const int32_t *y, int64_t V,
                      int64_t ld, float eps, int32_t ignore, float g) {
    __shared__ float sh[96];
    int64_t t = blockIdx.x;
    int32_t yt = y[t];
    bool skip = yt == ignore;
    float p[4], lt;
    xent_stats_block<VEC>(p, z, t, V, ld, yt, sh);
    float l = tpk__xent_loss_row(&lt, p, 1, 1, 0, skip, V, eps);
    if (threadIdx.x == 0) loss[t] = lt, lse[t] = l;
    __syncthreads(); /* every thread's reads of the row for the statistics precede any write of
                        dz */
    size_t o = (size_t)t * (size_t)ld;
    xent_grad_row<VEC>(dz + o, z + o, (int)V, (int)ld, l, g, skip, yt, V, eps);
}
static tpk_status cuda_xent_fused(tpk_ctx *ctx, void *dz, float *loss, float *lse, const void *z,
                                  const int32_t *targets, int64_t T, int64_t V, int64_t ld,
                                  float smoothing, int32_t ignore_index, float g, tpk_dtype dt) {
    static const char *fn = "cuda.xent_fused";
    if (T == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "grid: one block per row"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "ld", ld, INT_MAX, "32-bit column indices"));
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(xent_vec(z, ld) && tpk__aligned16({dz}), [&](auto v) {
            xent_fused_kernel<Tt, decltype(v)::value><<<(unsigned)T, XENT_THREADS, 0, st->stream>>>(
                (Tt *)dz, loss, lse, (const Tt *)z, targets, V, ld, smoothing, ignore_index, g);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_xent_ops(tpk_ops *o) {
    o->xent_stats = cuda_xent_stats;
    o->xent_loss = cuda_xent_loss;
    o->xent_mean = cuda_xent_mean;
    o->xent_grad = cuda_xent_grad;
    o->xent_fused = cuda_xent_fused;
}
