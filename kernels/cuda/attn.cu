/* kernels/cuda/attn.cu — the CUDA backend's causal attention (grouped-query).
 *
 *   attention  bf16 with head dim 64 or 128 on sm_80 and later: FlashAttention-2 on tensor cores
 *              (flash.cuh). bf16 at other head dims (a multiple of 8), without dropout: through
 *              cuBLASLt GEMMs and two row kernels (attn_gemm_fwd / _bwd below). Otherwise these
 *              generic kernels (f32, dropout at other head dims; any head dim up to ATT_MAXD),
 *              flash-style, never an S x S matrix. Grouped-query: query head h reads key/value
 *              head (head0 + h) / (A / G) - g0 of qkv [Q (Al D) | K (Gl D) | V (Gl D)] in place
 *              (tpk__fl_heads, 32-bit head indices). Forward: a block of ATT_WARPS query rows of
 *              one (batch, head) walks the keys 0..i in tiles of 32 staged in shared memory; each
 *              lane scores one key of the tile, the warp keeps the running max m and sum l, and
 *              each
 *              lane accumulates its columns of O:  o = o e^(m - m') + sum_j keep_ij e^(s_ij - m')
 *              V_j,
 *              O = o / l, lse = m + log l. Backward (no atomics, every output written once):
 *              Dr_i = dO_i . O_i;  dQ: one warp per query row over key tiles,
 *              dQ_i = scale sum_j dS_ij K_j;  dK, dV: one warp per key row of one key/value head,
 *              over the local query heads reading it (ascending) and their query tiles i >= j,
 *              dV_j = sum_h sum_i keep_ij P_ij dO_i,  dK_j = scale sum_h sum_i dS_ij Q_i,
 *              P_ij = exp(s_ij - lse_i),  dS_ij = P_ij (keep_ij dO_i . V_j - Dr_i)
 *              (summed in registers in a fixed order: deterministic, bit for bit).
 *              Head dims up to ATT_MAXD; the keep bits are the host's (tpk/base/rng.h), drawn here
 *              one Philox call per element (tpk_dropout_u: a lane holds one key of a row, so the 4
 *              keys of a call sit in 4 lanes; the tensor-core kernels share a call between
 *              lanes).
 *   block      attn_block_fwd / _bwd (context parallelism's blocks, tpk_attn_blk): the generic
 *              kernels' structure on Sq queries at q0 + i against Sk keys at k0 + j (causal: j
 *              visible when k0 + j <= q0 + i; rows that see no key give lse -inf, o 0), strided
 *              q, kv, out, lse, keep_ij drawn at index ((b A + g) S + q0 + i) S + k0 + j; the
 *              forward merges o, lse into the running f32 out, lse, L = log(e^lse' + e^lse); the
 *              backward's dQ kernel (also Dr_i = dO_i . O_i) then dK/dV kernel add into f32
 *              sums. */
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "flash.cuh"

/* ---- attention ------------------------------------------------------------------------------- */

enum { ATT_WARPS = 8, ATT_TILE = 32, ATT_MAXD = 512 };

/* Shared memory, in floats, of the three attention kernels for head dim D:
 * two padded [ATT_TILE][D+1] tiles, ATT_WARPS rows of 2 D, ATT_WARPS x ATT_TILE x 2 weights. */
static inline size_t att_smem(int64_t D) {
    return sizeof(float) *
           (size_t)(2 * ATT_TILE * (D + 1) + ATT_WARPS * 2 * D + ATT_WARPS * ATT_TILE * 2);
}

/* Stage rows [r0, r0 + ATT_TILE) (rows >= S as zeros) of column block `col` of qkv-like
 * storage (leading dimension ld) into dst [ATT_TILE][D+1] floats. */
template <class T>
__device__ __forceinline__ void att_stage(float *dst, const T *base, int64_t ld, int64_t r0,
                                          int64_t S, int64_t D) {
    for (int64_t k = threadIdx.x; k < ATT_TILE * D; k += blockDim.x) {
        int64_t r = k / D, e = k % D;
        dst[r * (D + 1) + e] = r0 + r < S ? tpk__ldf(base, (size_t)((r0 + r) * ld + e)) : 0.0f;
    }
}

/* Both tiles of a step (rows [r0, r0 + ATT_TILE) of a into as, of b into bs), between barriers. */
template <class T>
__device__ __forceinline__ void att_stage2(float *as, const T *a, int64_t lda, float *bs,
                                           const T *b, int64_t ldb, int64_t r0, int64_t S,
                                           int64_t D) {
    __syncthreads();
    att_stage(as, a, lda, r0, S, D);
    att_stage(bs, b, ldb, r0, S, D);
    __syncthreads();
}

/* The tile steps of a warp, shared by the generic kernels and the block kernels (lane: the
 * warp's lane; keep(jj): keep_ij of the tile's row or key jj, called only for visible pairs).
 *
 * Forward: query row q (scaled) sees the tile's first n keys (n > 0, may pass ATT_TILE); lane
 * scores key lane; m, l, o[NE] (columns lane + 32 e) step on:
 * o = o e^(m - m') + sum_j keep_j e^(s_j - m') V_j, l = l e^(m - m') + sum_j e^(s_j - m'). */
template <int NE, class Keep>
__device__ __forceinline__ void att_fwd_tile(float (&o)[NE], float &m, float &l, const float *q,
                                             const float *Ks, const float *Vs, float *pw, int64_t D,
                                             int lane, int64_t n, Keep keep) {
    float s = -INFINITY;
    if (lane < n) {
        s = 0.0f;
        for (int64_t e = 0; e < D; e++) s += q[e] * Ks[lane * (D + 1) + e];
    }
    /* finite: key 0 of the tile is visible; m = -inf at first: corr = 0 */
    float mn = fmaxf(m, tpk__warp_max(s));
    float pe = lane < n ? expf(s - mn) : 0.0f, corr = expf(m - mn);
    l = l * corr + tpk__warp_sum(pe);
    pw[lane] = lane < n ? pe * keep(lane) : 0.0f;
    __syncwarp();
    int64_t nt = n < ATT_TILE ? n : ATT_TILE;
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        float acc = o[e] * corr;
        if (c < D)
            for (int64_t jj = 0; jj < nt; jj++) acc += pw[jj] * Vs[jj * (D + 1) + c];
        o[e] = acc;
    }
    __syncwarp();
    m = mn;
}

/* dQ: query row q, its dO row go, lse L and Dr Di see the tile's first n keys; lane's key:
 * P = exp(scale q.k - L), dS = P (keep dO.v - Di); acc[e] += sum_j dS_j K_j (columns lane + 32 e,
 * unscaled). */
template <int NE, class Keep>
__device__ __forceinline__ void
att_dq_tile(float (&acc)[NE], const float *q, const float *go, const float *Ks, const float *Vs,
            float *dsw, int64_t D, int lane, int64_t n, float scale, float L, float Di, Keep keep) {
    float ds = 0.0f;
    if (lane < n) {
        float s = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < D; e++)
            s += q[e] * Ks[lane * (D + 1) + e], dp += go[e] * Vs[lane * (D + 1) + e];
        float P = expf(scale * s - L);
        ds = P * (dp * keep(lane) - Di);
    }
    dsw[lane] = ds;
    __syncwarp();
    int64_t nt = n < ATT_TILE ? n : ATT_TILE;
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        if (c < D)
            for (int64_t jj = 0; jj < nt; jj++) acc[e] += dsw[jj] * Ks[jj * (D + 1) + c];
    }
    __syncwarp();
}

/* dK, dV: key row k, value row v against the query tile Qs, dOs; lane's query i (vis: the pair is
 * visible; Lh[i], Dh[i] its lse and Dr): P = exp(scale q.k - lse), dS = P (keep dO.v - Dr);
 * dv[e] += sum_i keep_i P_i dO_i, dk[e] += sum_i dS_i Q_i (columns lane + 32 e, in tile order). */
template <int NE, class Keep>
__device__ __forceinline__ void
att_dkv_tile(float (&dk)[NE], float (&dv)[NE], const float *Qs, const float *dOs, const float *k,
             const float *v, float *pk, float *dsw, int64_t D, int lane, bool vis, float scale,
             const float *Lh, const float *Dh, int64_t i, Keep keep) {
    float pd = 0.0f, ds = 0.0f;
    if (vis) {
        float s = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < D; e++)
            s += Qs[lane * (D + 1) + e] * k[e], dp += dOs[lane * (D + 1) + e] * v[e];
        float P = expf(scale * s - Lh[i]), kp = keep(i);
        pd = P * kp;
        ds = P * (dp * kp - Dh[i]);
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

/* grid (ceil(S / ATT_WARPS), Al, B); warp w handles query row i = blockIdx.x * ATT_WARPS + w.
 * Registers: o[NE] holds O_i columns lane + 32 e. */
template <class T, int NE>
__global__ void attn_fwd_kernel(T *out, float *lse, const T *qkv, int64_t S, int64_t Al, int64_t D,
                                int64_t A, int64_t G, int64_t head0, float scale, float p,
                                uint64_t seed, uint64_t stream) {
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + ATT_TILE * (D + 1), *qs = Vs + ATT_TILE * (D + 1),
          *ps = qs + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_WARPS, i = i0 + w;
    /* query head h reads key/value head kv */
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int64_t ld3 = hd.ld, ldo = Al * D, kv = tpk__fl_kv_of(hd, head0, h);
    const T *Q = qkv + b * S * ld3 + h * D, *K = qkv + b * S * ld3 + (Al + kv) * D,
            *V = K + (int64_t)hd.Gl * D;
    float *q = qs + w * 2 * D, *pw = ps + w * ATT_TILE;
    for (int64_t e = lane; e < D; e += 32)
        q[e] = i < S ? tpk__ldf(Q, (size_t)(i * ld3 + e)) * scale : 0.0f;
    float o[NE], m = -INFINITY, l = 0.0f;
    for (int e = 0; e < NE; e++) o[e] = 0.0f;
    /* the block's last query row */
    int64_t last = (i0 + ATT_WARPS - 1 < S - 1 ? i0 + ATT_WARPS - 1 : S - 1);
    for (int64_t j0 = 0; j0 <= last; j0 += ATT_TILE) {
        att_stage2(Ks, K, ld3, Vs, V, ld3, j0, S, D);
        if (i >= S || j0 > i) continue;
        /* keys j0 .. i of the tile */
        att_fwd_tile<NE>(o, m, l, q, Ks, Vs, pw, D, lane, i - j0 + 1, [&](int64_t jj) {
            return tpk__att_keep(p, seed, stream, b, A, head0 + h, S, i, j0 + jj);
        });
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
    else
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "D: head dims up to %d are supported, got %lld", ATT_MAXD, (long long)D);
    return TPK_OK;
}

/* The front end checked the arguments; this backend's own limits are the head dim, the grid
 * (ceil(S / ATT_WARPS), Al, B) and 32-bit head indices (tpk__fl_heads). */
static tpk_status att_check(tpk_ctx *ctx, const char *fn, int64_t B, int64_t S, int64_t Al,
                            int64_t D, int64_t A) {
    if (D > ATT_MAXD)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "D: head dims up to %d are supported, got %lld", ATT_MAXD, (long long)D);
    TPK_TRY(tpk__cuda_limit(ctx, fn, "B", B, 65535, "grid z"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "Al", Al, 65535, "grid y"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "A", A, INT_MAX, "32-bit head indices"));
    return tpk__cuda_limit(ctx, fn, "S", S, (int64_t)INT_MAX * ATT_WARPS,
                           "grid x: ATT_WARPS query rows per block");
}

/* Allow the dynamic shared memory a kernel needs beyond the default 48 KiB; more than the GPU
 * gives a block is refused by name. */
template <class K>
static tpk_status att_smem_attr(tpk_ctx *ctx, const char *fn, const tpk__cuda_state *st, int64_t D,
                                K kernel, size_t bytes) {
    if (bytes > st->smem_optin)
        return tpk__fail(
            ctx, TPK_ERR_UNSUPPORTED, fn,
            "D: head dim %lld needs %zu bytes of shared memory per block, this GPU allows %zu",
            (long long)D, bytes, st->smem_optin);
    if (bytes > 48 * 1024)
        TPK__CUDA_TRY(
            ctx, fn,
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return TPK_OK;
}

/* dQ of dqkv (bf16, rows of ld3) = scale dq_acc (f32 [rows, AlD], the tensor-core backward's sums
 * of dS K), 8 elements per step: AlD is a multiple of 8 and both 16-byte aligned */
__global__ void attn_dq_store_kernel(tpk__bf16 *dqkv, const float *dq_acc, size_t rows, int64_t AlD,
                                     int64_t ld3, float scale) {
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
static bool flash_usable(const tpk__cuda_state *st, tpk_dtype dt, int64_t D, const void *a,
                         const void *b) {
    if (dt != TPK_BF16 || (D != 64 && D != 128) || st->cc < 80 || !tpk__aligned16({a, b}))
        return false;
    for (int k = 0; k < 4; k++)
        if (tpk__flash_smem(k, (int)D) > st->smem_optin) return false;
    return !attn_env_is("generic");
}
/* bf16 at other head dims without dropout: through GEMMs (attn_gemm_fwd / _bwd, further down) */
static bool attn_gemm_usable(tpk_dtype dt, int64_t D, float p, const void *a, const void *b);
static tpk_status attn_gemm_fwd(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, void *out,
                                float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al,
                                int64_t D, int64_t A, int64_t G, int64_t head0, float scale);

/* f(D, DROP) with the head dim and whether dropout is on as compile-time constants */
template <class F> static void flash_by_d(int64_t D, float p, F f) {
    auto drop = [&](auto d) {
        if (p > 0.0f) f(d, std::true_type{});
        else f(d, std::false_type{});
    };
    if (D == 64) drop(std::integral_constant<int, 64>{});
    else drop(std::integral_constant<int, 128>{});
}

static tpk_status cuda_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B,
                                int64_t S, int64_t Al, int64_t D, int64_t A, int64_t G,
                                int64_t head0, float scale, float p, uint64_t seed, uint64_t stream,
                                tpk_dtype dt) {
    static const char *fn = "cuda.attn_fwd";
    TPK_TRY(att_check(ctx, fn, B, S, Al, D, A));
    if (B == 0 || S == 0 || Al == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (flash_usable(st, dt, D, qkv, out) &&
        tpk__flash_fits(S, Al, tpk_attn_kv_heads(A, G, head0, Al, NULL), D)) {
        tpk_status s = TPK_OK;
        flash_by_d(D, p, [&](auto d, auto drop) {
            constexpr int DD = decltype(d)::value, W = tpk__fl_warps(0),
                          ROWS = tpk__fl_fwd_rows(DD);
            auto kernel = tpk__flash_fwd<DD, W, tpk__fl_fwd_mt(DD), decltype(drop)::value>;
            size_t bytes = tpk__flash_smem(0, DD);
            if ((s = att_smem_attr(ctx, fn, st, D, kernel, bytes)) != TPK_OK) return;
            dim3 fgrid((unsigned)((S + ROWS - 1) / ROWS), (unsigned)Al, (unsigned)B);
            kernel<<<fgrid, 32 * W, bytes, st->stream>>>((uint16_t *)out, lse,
                                                         (const uint16_t *)qkv, S, Al, A, G, head0,
                                                         scale, p, seed, stream);
        });
        TPK_TRY(s);
        return tpk__cuda_launched(ctx, fn);
    }
    if (attn_gemm_usable(dt, D, p, qkv, out))
        return attn_gemm_fwd(ctx, fn, st, out, lse, qkv, B, S, Al, D, A, G, head0, scale);
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
            kernel<<<grid, 32 * ATT_WARPS, smem, st->stream>>>(
                (T *)out, lse, (const T *)qkv, S, Al, D, A, G, head0, scale, p, seed, stream);
        });
        if (s == TPK_OK) s = r;
    });
    TPK_TRY(s);
    return tpk__cuda_launched(ctx, fn);
}

/* Dr[b, h, i] = sum_e dO_i O_i (rows r = (b Al + h) S + i; the warps stride over the rows, so the
 * grid stays within limits whatever B Al S is). D a multiple of 8 and dO, O 16-byte aligned: a
 * row's D / 8 16-byte vectors go to a group of L lanes (the power of two at or above D / 8, at most
 * 32), a warp takes 32 / L rows at a time (4 at D = 64) and sums a group by butterflies within it;
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
template <class T>
__global__ void attn_dr_kernel(float *Dr, const T *dout, const T *out, int64_t B, int64_t S,
                               int64_t Al, int64_t D) {
    int lane = threadIdx.x & 31;
    int64_t nrows = B * Al * S, warp = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5),
            nwarps = (int64_t)gridDim.x * ATT_WARPS;
    if (D % TPK__VEC == 0 && ((uintptr_t)dout | (uintptr_t)out) % 16 == 0) { /* uniform over the
                                                                                grid */
        int64_t nv = D / TPK__VEC;
        int R = attn_dr_rows(D), L = 32 / R, g = lane / L, li = lane % L;
        bool small = nrows <= (int64_t)UINT32_MAX; /* 32-bit divisions (a 64-bit one costs about 10
                                                      times the instructions) */
        for (int64_t r0 = warp * R; r0 < nrows; r0 += nwarps * R) { /* uniform over the warp */
            int64_t r = r0 + g, bh, i;
            if (small) {
                uint32_t q = (uint32_t)r / (uint32_t)S;
                bh = q, i = (int64_t)((uint32_t)r - q * (uint32_t)S);
            } else {
                bh = r / S, i = r - bh * S;
            }
            int64_t b = small ? (int64_t)((uint32_t)bh / (uint32_t)Al) : bh / Al,
                    h = bh - b * Al; /* r = (b Al + h) S + i */
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
        for (int64_t e = lane; e < D; e += 32)
            s += tpk__ldf(dout, base + e) * tpk__ldf(out, base + e);
        s = tpk__warp_sum(s); /* r is the same on every lane of the warp */
        if (lane == 0) Dr[r] = s;
    }
}

/* dQ: warp w owns query row i; over key tiles j0 <= i: lane j scores s = scale q.k_j, dp =
 * dO_i.v_j */
template <class T, int NE>
__global__ void attn_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                               const float *Dr, int64_t S, int64_t Al, int64_t D, int64_t A,
                               int64_t G, int64_t head0, float scale, float p, uint64_t seed,
                               uint64_t stream) {
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + ATT_TILE * (D + 1), *rows = Vs + ATT_TILE * (D + 1),
          *ps = rows + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_WARPS, i = i0 + w;
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int64_t ld3 = hd.ld, ldo = Al * D, kv = tpk__fl_kv_of(hd, head0, h);
    const T *Q = qkv + b * S * ld3 + h * D, *K = qkv + b * S * ld3 + (Al + kv) * D,
            *V = K + (int64_t)hd.Gl * D, *dO = dout + b * S * ldo + h * D;
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
        att_stage2(Ks, K, ld3, Vs, V, ld3, j0, S, D);
        if (i >= S || j0 > i) continue;
        att_dq_tile<NE>(acc, q, go, Ks, Vs, dsw, D, lane, i - j0 + 1, scale, L, Di,
                        [&](int64_t jj) {
                            return tpk__att_keep(p, seed, stream, b, A, head0 + h, S, i, j0 + jj);
                        });
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
__global__ void attn_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                                const float *Dr, int64_t S, int64_t Al, int64_t D, int64_t A,
                                int64_t G, int64_t head0, float scale, float p, uint64_t seed,
                                uint64_t stream) {
    extern __shared__ float sm[];
    float *Qs = sm, *dOs = Qs + ATT_TILE * (D + 1), *rows = dOs + ATT_TILE * (D + 1),
          *ps = rows + ATT_WARPS * 2 * D;
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
            att_stage2(Qs, Q, ld3, dOs, dO, ldo, q0, S, D);
            if (j >= S || q0 + ATT_TILE - 1 < j) continue;
            int64_t i = q0 + lane;
            att_dkv_tile<NE>(dk, dv, Qs, dOs, k, v, pk, dsw, D, lane, i < S && i >= j, scale, Lh,
                             Dh, i, [&](int64_t ii) {
                                 return tpk__att_keep(p, seed, stream, b, A, head0 + h, S, ii, j);
                             });
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

/* ---- attention through GEMMs: bf16 at head dims the tensor-core kernels do not take ----------
 * bf16 without dropout at a head dim not 64 or 128 (GPT-NeoX/Pythia 1B's 256, 80, 96, ...; a
 * multiple of 8, rows 16-byte aligned), where the generic kernels would run on CUDA cores: per
 * (batch, query head h, chunk of R query rows i0 .. i1 - 1), with key/value head y = kv(h) and the
 * keys 0 .. i1 - 1 (causal: no later key of any row in the chunk),
 *   forward   S = scale Q_h[i0:i1] K_y[0:i1]^T (gemm_acc: f32 [R, i1])
 *             lse_i = log sum_{j <= i} e^(S_ij);  P_ij = e^(S_ij - lse_i) (j <= i, else 0; bf16)
 *             O_h[i0:i1] = P V_y[0:i1] (gemm, bf16 into out)
 *   backward  Dr_i = dO_i . O_i; S again, dP = dO_h[i0:i1] V_y[0:i1]^T (gemm_acc, f32),
 *             P as above, dS_ij = P_ij (dP_ij - Dr_i) (bf16), then
 *             dQ_h[i0:i1] = scale dS K_y[0:i1]          (gemm, bf16 into dqkv)
 *             dK_y[0:i1] += scale dS^T Q_h[i0:i1],  dV_y[0:i1] += P^T dO_h[i0:i1]
 *             (gemm_acc into f32 sums of the key/value head over its query heads and chunks, in
 *             that fixed order, then written as bf16: deterministic, no atomics).
 * R = S where a head's S, dP (f32) and P, dS (bf16) take at most ATT_GEMM_BYTES, else the most
 * rows that do (multiples of 64; TPK_ATTN_GEMM_ROWS=R in the environment sets it, for tests).
 * Five GEMMs and the S x S products computed in full (the causal
 * half too): cuBLASLt's speed instead of the CUDA cores', not FlashAttention's; the row kernels
 * read only the visible part. Rows of the S and P buffers are padded to 8 elements (16 bytes). */
enum : int64_t { ATT_GEMM_BYTES = (int64_t)256 << 20 };

static bool attn_gemm_usable(tpk_dtype dt, int64_t D, float p, const void *a, const void *b) {
    return dt == TPK_BF16 && p == 0.0f && D % 8 == 0 && tpk__aligned16({a, b}) &&
           !attn_env_is("generic");
}
/* the query rows of a chunk (TPK_ATTN_GEMM_ROWS in the environment: that many, for tests) */
static int64_t attn_gemm_rows(int64_t S) {
    const char *env = getenv("TPK_ATTN_GEMM_ROWS");
    if (env && atoll(env) > 0) return atoll(env) < S ? atoll(env) : S;
    int64_t ld = (S + 7) / 8 * 8, per_row = 12 * ld, R = ATT_GEMM_BYTES / per_row;
    if (R >= S) return S;
    R = R / 64 * 64;
    return R < 64 ? 64 : R;
}
/* The forward's rows: warp w of the grid takes row r of the chunk (i = i0 + r), keys 0..i of
 * s [R, lds] (f32), writes lse[i] and p [R, lds] (bf16: e^(s - lse) for j <= i, 0 for
 * i < j < kc) */
__global__ void attn_gemm_softmax_kernel(tpk__bf16 *p, float *lse, const float *s, int64_t R,
                                         int64_t lds, int64_t kc, int64_t i0) {
    int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (r >= R) return;
    const float *row = s + r * lds;
    int64_t n = i0 + r + 1; /* visible keys */
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = lane; j < n; j += 32) {
        float v = row[j], m2 = fmaxf(m, v);
        l = l * expf(m - m2) + expf(v - m2), m = m2;
    }
    for (int o = 16; o > 0; o >>= 1) { /* merge the lanes' (m, l) */
        float m_o = __shfl_xor_sync(0xffffffffu, m, o), l_o = __shfl_xor_sync(0xffffffffu, l, o),
              m2 = fmaxf(m, m_o);
        l = (m == -INFINITY ? 0.0f : l * expf(m - m2)) +
            (m_o == -INFINITY ? 0.0f : l_o * expf(m_o - m2));
        m = m2;
    }
    float L = m + logf(l);
    if (lane == 0) lse[r] = L;
    for (int64_t j = lane; j < kc; j += 32)
        tpk__stf(p + r * lds, (size_t)j, j < n ? expf(row[j] - L) : 0.0f);
}
/* The backward's rows: P as in the forward from s and lse, dS = P (dp - Dr) (0 past the diagonal),
 * both bf16 [R, lds] */
__global__ void attn_gemm_ds_kernel(tpk__bf16 *p, tpk__bf16 *ds, const float *s, const float *dp,
                                    const float *lse, const float *Dr, int64_t R, int64_t lds,
                                    int64_t kc, int64_t i0) {
    int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (r >= R) return;
    int64_t n = i0 + r + 1, at = r * lds;
    float L = lse[r], d = Dr[r];
    for (int64_t j = lane; j < kc; j += 32) {
        float pv = j < n ? expf(s[at + j] - L) : 0.0f;
        tpk__stf(p, (size_t)(at + j), pv);
        tpk__stf(ds, (size_t)(at + j), j < n ? pv * (dp[at + j] - d) : 0.0f);
    }
}

static tpk_status attn_gemm_fwd(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, void *out,
                                float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al,
                                int64_t D, int64_t A, int64_t G, int64_t head0, float scale) {
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int64_t Gl = hd.Gl, ld3 = hd.ld, ldo = Al * D;
    int64_t R = attn_gemm_rows(S), lds = (S + 7) / 8 * 8;
    size_t sbytes = (size_t)(R * lds) * sizeof(float);
    float *s32;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sbytes + (size_t)(R * lds) * 2, (void **)&s32));
    tpk__bf16 *p16 = reinterpret_cast<tpk__bf16 *>(reinterpret_cast<char *>(s32) + sbytes);
    const tpk__bf16 *x = (const tpk__bf16 *)qkv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Al; h++) {
            int64_t y = tpk__fl_kv_of(hd, head0, h);
            const tpk__bf16 *Q = x + b * S * ld3 + h * D, *K = x + b * S * ld3 + (Al + y) * D,
                            *V = K + Gl * D;
            tpk__bf16 *O = (tpk__bf16 *)out + b * S * ldo + h * D;
            for (int64_t i0 = 0; i0 < S; i0 += R) {
                int64_t rows = S - i0 < R ? S - i0 : R, kc = i0 + rows;
                TPK_TRY(ctx->ops->gemm_acc(ctx, false, true, rows, kc, D, scale, Q + i0 * ld3, ld3,
                                           K, ld3, 0.0f, s32, lds, TPK_BF16));
                attn_gemm_softmax_kernel<<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS),
                                           32 * ATT_WARPS, 0, st->stream>>>(
                    p16, lse + (b * Al + h) * S + i0, s32, rows, lds, kc, i0);
                TPK_TRY(tpk__cuda_launched(ctx, fn));
                TPK_TRY(ctx->ops->gemm(ctx, false, false, rows, D, kc, 1.0f, p16, lds, V, ld3, 0.0f,
                                       O + i0 * ldo, ldo, TPK_BF16));
            }
        }
    return TPK_OK;
}

static tpk_status attn_gemm_bwd(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, void *dqkv,
                                const void *dout, const void *qkv, const void *out,
                                const float *lse, int64_t B, int64_t S, int64_t Al, int64_t D,
                                int64_t A, int64_t G, int64_t head0, float scale) {
    tpk__fl_heads hd = tpk__fl_heads_of(Al, A, G, head0, D);
    int64_t Gl = hd.Gl, ld3 = hd.ld, ldo = Al * D;
    int64_t R = attn_gemm_rows(S), lds = (S + 7) / 8 * 8;
    size_t nrows = (size_t)(B * Al * S), a256 = 256;
    size_t dr_b = (sizeof(float) * nrows + a256 - 1) / a256 * a256,
           f_b = (size_t)(R * lds) * sizeof(float), h_b = (size_t)(R * lds) * 2,
           acc_b = (size_t)(S * D) * sizeof(float);
    char *base;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, dr_b + 2 * f_b + 2 * h_b + 2 * acc_b, (void **)&base));
    float *Dr = (float *)base, *s32 = (float *)(base + dr_b), *dp32 = (float *)(base + dr_b + f_b);
    tpk__bf16 *p16 = (tpk__bf16 *)(base + dr_b + 2 * f_b),
              *ds16 = (tpk__bf16 *)(base + dr_b + 2 * f_b + h_b);
    float *dk = (float *)(base + dr_b + 2 * f_b + 2 * h_b), *dv = dk + S * D;
    attn_dr_kernel<tpk__bf16><<<attn_dr_grid((int64_t)nrows, D), 32 * ATT_WARPS, 0, st->stream>>>(
        Dr, (const tpk__bf16 *)dout, (const tpk__bf16 *)out, B, S, Al, D);
    TPK_TRY(tpk__cuda_launched(ctx, fn));
    const tpk__bf16 *x = (const tpk__bf16 *)qkv, *go = (const tpk__bf16 *)dout;
    for (int64_t b = 0; b < B; b++)
        for (int64_t y = 0; y < Gl; y++) {
            const tpk__bf16 *K = x + b * S * ld3 + (Al + y) * D, *V = K + Gl * D;
            TPK__CUDA_TRY(ctx, fn, cudaMemsetAsync(dk, 0, 2 * acc_b, st->stream));
            int h0, h1; /* the local query heads reading y */
            tpk__fl_q_of(hd, head0, Al, y, &h0, &h1);
            for (int64_t h = h0; h < h1; h++) {
                const tpk__bf16 *Q = x + b * S * ld3 + h * D, *dO = go + b * S * ldo + h * D;
                tpk__bf16 *dQ = (tpk__bf16 *)dqkv + b * S * ld3 + h * D;
                const float *L = lse + (b * Al + h) * S, *Dh = Dr + (b * Al + h) * S;
                for (int64_t i0 = 0; i0 < S; i0 += R) {
                    int64_t rows = S - i0 < R ? S - i0 : R, kc = i0 + rows;
                    TPK_TRY(ctx->ops->gemm_acc(ctx, false, true, rows, kc, D, scale,
                                               Q + i0 * ld3, ld3, K, ld3, 0.0f, s32, lds,
                                               TPK_BF16));
                    TPK_TRY(ctx->ops->gemm_acc(ctx, false, true, rows, kc, D, 1.0f, dO + i0 * ldo,
                                               ldo, V, ld3, 0.0f, dp32, lds, TPK_BF16));
                    attn_gemm_ds_kernel<<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS),
                                          32 * ATT_WARPS, 0, st->stream>>>(
                        p16, ds16, s32, dp32, L + i0, Dh + i0, rows, lds, kc, i0);
                    TPK_TRY(tpk__cuda_launched(ctx, fn));
                    TPK_TRY(ctx->ops->gemm_acc(ctx, true, false, kc, D, rows, 1.0f, p16, lds,
                                               dO + i0 * ldo, ldo, 1.0f, dv, D, TPK_BF16));
                    TPK_TRY(ctx->ops->gemm_acc(ctx, true, false, kc, D, rows, scale, ds16, lds,
                                               Q + i0 * ld3, ld3, 1.0f, dk, D, TPK_BF16));
                    TPK_TRY(ctx->ops->gemm(ctx, false, false, rows, D, kc, scale, ds16, lds, K, ld3,
                                           0.0f, dQ + i0 * ld3, ld3, TPK_BF16));
                }
            }
            tpk__bf16 *dK = (tpk__bf16 *)dqkv + b * S * ld3 + (Al + y) * D, *dV = dK + Gl * D;
            unsigned g = tpk__grid_for((size_t)(S * D) / 8, 256);
            attn_dq_store_kernel<<<g, 256, 0, st->stream>>>(dK, dk, (size_t)S, D, ld3, 1.0f);
            attn_dq_store_kernel<<<g, 256, 0, st->stream>>>(dV, dv, (size_t)S, D, ld3, 1.0f);
            TPK_TRY(tpk__cuda_launched(ctx, fn));
        }
    return TPK_OK;
}

static tpk_status cuda_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                                const void *out, const float *lse, int64_t B, int64_t S, int64_t Al,
                                int64_t D, int64_t A, int64_t G, int64_t head0, float scale,
                                float p, uint64_t seed, uint64_t stream, tpk_dtype dt) {
    static const char *fn = "cuda.attn_bwd";
    TPK_TRY(att_check(ctx, fn, B, S, Al, D, A));
    if (B == 0 || S == 0 || Al == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    float *Dr;
    size_t nrows = (size_t)(B * Al * S);
    if (flash_usable(st, dt, D, qkv, out) && flash_usable(st, dt, D, dqkv, dout) &&
        tpk__flash_fits(S, Al, tpk_attn_kv_heads(A, G, head0, Al, NULL), D)) {
        /* Dr [B, Al, S]; unless deterministic, dq_acc [B, S, Al, D] f32, zeroed, that the dK/dV
         * kernel adds dS K into with atomics (FlashAttention-2); deterministic: the dQ kernel
         * instead */
        bool fused = !ctx->deterministic;
        size_t dr_bytes = (sizeof(float) * nrows + 255) / 256 * 256, nq = nrows * (size_t)D;
        float *dq_acc = NULL;
        TPK_TRY(tpk__cuda_scratch(ctx, fn, st, dr_bytes + (fused ? sizeof(float) * nq : 0),
                                  (void **)&Dr));
        if (fused) {
            dq_acc = reinterpret_cast<float *>(reinterpret_cast<char *>(Dr) + dr_bytes);
            TPK__CUDA_TRY(ctx, fn, cudaMemsetAsync(dq_acc, 0, sizeof(float) * nq, st->stream));
        }
        attn_dr_kernel<tpk__bf16><<<attn_dr_grid(nrows, D), 32 * ATT_WARPS, 0, st->stream>>>(
            Dr, (const tpk__bf16 *)dout, (const tpk__bf16 *)out, B, S, Al, D);
        int64_t Gl = tpk_attn_kv_heads(A, G, head0, Al, NULL);
        dim3 fgrid((unsigned)((S + TPK__FL_ROWS - 1) / TPK__FL_ROWS), (unsigned)Al,
                   (unsigned)B); /* dQ: 64 queries a block */
        tpk_status s = TPK_OK;
        flash_by_d(D, p, [&](auto d, auto drop) {
            constexpr int DD = decltype(d)::value, W = tpk__fl_warps(1);
            constexpr bool DROP = decltype(drop)::value;
            dim3 kvgrid((unsigned)((S + 16 * W - 1) / (16 * W)), (unsigned)Gl,
                        (unsigned)B); /* dK, dV: one block row per key/value head */
            if (fused) {
                auto kkv = tpk__flash_dkv<DD, W, DROP, true>;
                size_t bkv = tpk__flash_smem(3, DD);
                if ((s = att_smem_attr(ctx, fn, st, D, kkv, bkv)) != TPK_OK) return;
                kkv<<<kvgrid, 32 * W, bkv, st->stream>>>(
                    (uint16_t *)dqkv, dq_acc, (const uint16_t *)dout, (const uint16_t *)qkv, lse,
                    Dr, S, Al, A, G, head0, scale, p, seed, stream);
                int64_t ld3 = (Al + 2 * Gl) * DD;
                attn_dq_store_kernel<<<tpk__grid_for(nq / 8, 256), 256, 0, st->stream>>>(
                    (tpk__bf16 *)dqkv, dq_acc, (size_t)(B * S), Al * DD, ld3, scale);
                return;
            }
            auto kkv = tpk__flash_dkv<DD, W, DROP, false>;
            auto kq = tpk__flash_dq<DD, DROP>;
            size_t bkv = tpk__flash_smem(1, DD), bq = tpk__flash_smem(2, DD);
            if ((s = att_smem_attr(ctx, fn, st, D, kkv, bkv)) != TPK_OK ||
                (s = att_smem_attr(ctx, fn, st, D, kq, bq)) != TPK_OK)
                return;
            kkv<<<kvgrid, 32 * W, bkv, st->stream>>>(
                (uint16_t *)dqkv, (float *)NULL, (const uint16_t *)dout, (const uint16_t *)qkv, lse,
                Dr, S, Al, A, G, head0, scale, p, seed, stream);
            kq<<<fgrid, 128, bq, st->stream>>>((uint16_t *)dqkv, (const uint16_t *)dout,
                                               (const uint16_t *)qkv, lse, Dr, S, Al, A, G, head0,
                                               scale, p, seed, stream);
        });
        TPK_TRY(s);
        return tpk__cuda_launched(ctx, fn);
    }
    if (attn_gemm_usable(dt, D, p, qkv, out) && tpk__aligned16({dqkv, dout}))
        return attn_gemm_bwd(ctx, fn, st, dqkv, dout, qkv, out, lse, B, S, Al, D, A, G, head0,
                             scale);
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(float) * nrows, (void **)&Dr));
    size_t smem = att_smem(D);
    dim3 grid((unsigned)((S + ATT_WARPS - 1) / ATT_WARPS), (unsigned)Al, (unsigned)B);
    dim3 kvgrid(grid.x, (unsigned)tpk_attn_kv_heads(A, G, head0, Al, NULL), (unsigned)B);
    tpk_status s = TPK_OK;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        attn_dr_kernel<T><<<attn_dr_grid(nrows, D), 32 * ATT_WARPS, 0, st->stream>>>(
            Dr, (const T *)dout, (const T *)out, B, S, Al, D);
        tpk_status r =
            att_by_ne(ctx, fn, D,
                      [&](auto ne) { /* failures recorded in s, as in
                                                               attn_fwd */
                                     auto kq = attn_dq_kernel<T, decltype(ne)::value>;
                                     auto kkv = attn_dkv_kernel<T, decltype(ne)::value>;
                                     if ((s = att_smem_attr(ctx, fn, st, D, kq, smem)) != TPK_OK ||
                                         (s = att_smem_attr(ctx, fn, st, D, kkv, smem)) != TPK_OK)
                                         return;
                                     kq<<<grid, 32 * ATT_WARPS, smem, st->stream>>>(
                                         (T *)dqkv, (const T *)dout, (const T *)qkv, lse, Dr, S, Al,
                                         D, A, G, head0, scale, p, seed, stream);
                                     kkv<<<kvgrid, 32 * ATT_WARPS, smem, st->stream>>>(
                                         (T *)dqkv, (const T *)dout, (const T *)qkv, lse, Dr, S, Al,
                                         D, A, G, head0, scale, p, seed, stream);
                      });
        if (s == TPK_OK) s = r;
    });
    TPK_TRY(s);
    return tpk__cuda_launched(ctx, fn);
}

/* ---- one block of an attention split over the sequence (context parallelism) ----------------- */

/* The keys [0, n) of block b that query row i sees: all, or those at k0 + j <= q0 + i. */
__device__ __forceinline__ int64_t att_blk_vis(const tpk_attn_blk &b, int64_t i) {
    if (!b.causal) return b.Sk;
    int64_t n = b.q0 + i - b.k0 + 1;
    return n < 0 ? 0 : n > b.Sk ? b.Sk : n;
}

/* grid (ceil(Sq / ATT_WARPS), Al); warp w owns query row i = blockIdx.x ATT_WARPS + w of local
 * head h = blockIdx.y, over the key tiles of its visible keys [0, vis_i) as attn_fwd_kernel (online
 * softmax, keep_ij at the pair's sequence positions), then merges the block's o, lse into out,
 * lse: L = log(e^lse' + e^lse), out = e^(lse' - L) out + e^(lse - L) o (a side at -inf adds
 * nothing; merge = false or lse' = -inf: written). Every lane reads lse' before lane 0 writes L. */
template <class T, int NE>
__global__ void attn_blk_fwd_kernel(float *out, float *lse, const T *q, const T *kv,
                                    tpk_attn_blk bk, bool merge) {
    extern __shared__ float sm[];
    const int64_t D = bk.D;
    float *Ks = sm, *Vs = Ks + ATT_TILE * (D + 1), *qs = Vs + ATT_TILE * (D + 1),
          *ps = qs + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t h = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_WARPS, i = i0 + w;
    tpk__fl_heads hd = tpk__fl_heads_of(bk.Al, bk.A, bk.G, bk.head0, D);
    int64_t kvh = tpk__fl_kv_of(hd, bk.head0, h), g = bk.head0 + h;
    const T *Q = q + h * D, *K = kv + kvh * D, *V = K + (int64_t)hd.Gl * D;
    float *qw = qs + w * 2 * D, *pw = ps + w * ATT_TILE;
    for (int64_t e = lane; e < D; e += 32)
        qw[e] = i < bk.Sq ? tpk__ldf(Q, (size_t)(i * bk.ldq + e)) * bk.scale : 0.0f;
    float o[NE], m = -INFINITY, l = 0.0f;
    for (int e = 0; e < NE; e++) o[e] = 0.0f;
    /* the keys of the block's last row bound every row's */
    int64_t last = i0 + ATT_WARPS - 1 < bk.Sq - 1 ? i0 + ATT_WARPS - 1 : bk.Sq - 1,
            nk = att_blk_vis(bk, last), vi = i < bk.Sq ? att_blk_vis(bk, i) : 0;
    for (int64_t j0 = 0; j0 < nk; j0 += ATT_TILE) {
        att_stage2(Ks, K, bk.ldkv, Vs, V, bk.ldkv, j0, bk.Sk, D);
        if (j0 >= vi) continue; /* uniform over the warp: one row */
        att_fwd_tile<NE>(o, m, l, qw, Ks, Vs, pw, D, lane, vi - j0, [&](int64_t jj) {
            return tpk__att_keep(bk.p, bk.seed, bk.stream, bk.b, bk.A, g, bk.S, bk.q0 + i,
                                 bk.k0 + j0 + jj);
        });
    }
    if (i >= bk.Sq) return;
    float lb = l > 0.0f ? m + logf(l) : -INFINITY, inv = l > 0.0f ? 1.0f / l : 0.0f;
    float *O = out + i * bk.ldo + h * D, *L = lse + h * bk.ldl + i;
    float la = merge ? *L : -INFINITY;
    __syncwarp();
    bool put = !merge || la == -INFINITY;
    if (!put && lb == -INFINITY) return; /* this block adds nothing */
    float wa = 0.0f, wb = 1.0f, Ln = lb;
    if (!put) {
        float mx = fmaxf(la, lb);
        Ln = mx + logf(expf(la - mx) + expf(lb - mx));
        wa = expf(la - Ln), wb = expf(lb - Ln);
    }
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        if (c < D) O[c] = put ? o[e] * inv : wa * O[c] + wb * (o[e] * inv);
    }
    if (lane == 0) *L = Ln;
}

/* dQ of a block: grid (ceil(Sq / ATT_WARPS), Al); warp w owns query row i of local head h:
 * Dr_i = dO_i . O_i (written to Dr [Al, Sq] for the dK/dV kernel), then over the key tiles of its
 * visible keys: P_ij = exp(scale q_i.k_j - lse_i) (0 where lse_i = -inf: the row sees no key),
 * dS_ij = P_ij (keep_ij dO_i.v_j - Dr_i); dq_i += scale sum_j dS_ij k_j (f32, added) */
template <class T, int NE>
__global__ void attn_blk_dq_kernel(float *dq, float *Dr, const T *dout, const T *out,
                                   const float *lse, const T *q, const T *kv, tpk_attn_blk bk) {
    extern __shared__ float sm[];
    const int64_t D = bk.D;
    float *Ks = sm, *Vs = Ks + ATT_TILE * (D + 1), *rows = Vs + ATT_TILE * (D + 1),
          *ps = rows + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t h = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_WARPS, i = i0 + w;
    tpk__fl_heads hd = tpk__fl_heads_of(bk.Al, bk.A, bk.G, bk.head0, D);
    int64_t kvh = tpk__fl_kv_of(hd, bk.head0, h), g = bk.head0 + h;
    const T *Q = q + h * D, *K = kv + kvh * D, *V = K + (int64_t)hd.Gl * D, *dO = dout + h * D,
            *Oh = out + h * D;
    float *qw = rows + w * 2 * D, *go = qw + D, *dsw = ps + w * ATT_TILE;
    float di = 0.0f;
    for (int64_t e = lane; e < D; e += 32) {
        float a = i < bk.Sq ? tpk__ldf(dO, (size_t)(i * bk.ldo + e)) : 0.0f;
        qw[e] = i < bk.Sq ? tpk__ldf(Q, (size_t)(i * bk.ldq + e)) : 0.0f;
        go[e] = a;
        di += i < bk.Sq ? a * tpk__ldf(Oh, (size_t)(i * bk.ldo + e)) : 0.0f;
    }
    di = tpk__warp_sum(di);
    float Li = i < bk.Sq ? lse[h * bk.ldl + i] : -INFINITY, acc[NE];
    if (i < bk.Sq && lane == 0) Dr[h * bk.Sq + i] = di;
    for (int e = 0; e < NE; e++) acc[e] = 0.0f;
    int64_t last = i0 + ATT_WARPS - 1 < bk.Sq - 1 ? i0 + ATT_WARPS - 1 : bk.Sq - 1,
            nk = att_blk_vis(bk, last), vi = i < bk.Sq && Li != -INFINITY ? att_blk_vis(bk, i) : 0;
    for (int64_t j0 = 0; j0 < nk; j0 += ATT_TILE) {
        att_stage2(Ks, K, bk.ldkv, Vs, V, bk.ldkv, j0, bk.Sk, D);
        if (j0 >= vi) continue;
        att_dq_tile<NE>(acc, qw, go, Ks, Vs, dsw, D, lane, vi - j0, bk.scale, Li, di,
                        [&](int64_t jj) {
                            return tpk__att_keep(bk.p, bk.seed, bk.stream, bk.b, bk.A, g, bk.S,
                                                 bk.q0 + i, bk.k0 + j0 + jj);
                        });
    }
    if (i >= bk.Sq || vi == 0) return;
    float *dQ = dq + i * bk.lddq + h * D;
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        if (c < D) dQ[c] += bk.scale * acc[e];
    }
}

/* dK, dV of a block: grid (ceil(Sk / ATT_WARPS), Gl); warp w owns key row j of local key/value
 * head y; over the local query heads reading it (ascending) and their query tiles from the first
 * that sees the block's first key: lane i scores s = scale q_i.k_j, dp = dO_i.v_j (the visible
 * pairs, lse_i finite); dv_j += sum P_ij keep_ij dO_i, dk_j += scale sum dS_ij q_i (registers,
 * a fixed order; added into dkv f32) */
template <class T, int NE>
__global__ void attn_blk_dkv_kernel(float *dkv, const float *Dr, const T *dout, const float *lse,
                                    const T *q, const T *kv, tpk_attn_blk bk) {
    extern __shared__ float sm[];
    const int64_t D = bk.D;
    float *Qs = sm, *dOs = Qs + ATT_TILE * (D + 1), *rows = dOs + ATT_TILE * (D + 1),
          *ps = rows + ATT_WARPS * 2 * D;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t y = blockIdx.y, j0 = (int64_t)blockIdx.x * ATT_WARPS, j = j0 + w;
    tpk__fl_heads hd = tpk__fl_heads_of(bk.Al, bk.A, bk.G, bk.head0, D);
    int h0, h1; /* the local query heads reading key/value head y */
    tpk__fl_q_of(hd, bk.head0, bk.Al, y, &h0, &h1);
    const T *K = kv + y * D, *V = K + (int64_t)hd.Gl * D;
    float *kw = rows + w * 2 * D, *vw = kw + D, *pk = ps + w * 2 * ATT_TILE, *dsw = pk + ATT_TILE;
    for (int64_t e = lane; e < D; e += 32) {
        kw[e] = j < bk.Sk ? tpk__ldf(K, (size_t)(j * bk.ldkv + e)) : 0.0f;
        vw[e] = j < bk.Sk ? tpk__ldf(V, (size_t)(j * bk.ldkv + e)) : 0.0f;
    }
    /* the first query that sees key j (causal: q0 + i >= k0 + j); the block's, tile-aligned */
    int64_t fj = bk.causal ? bk.k0 + j - bk.q0 : 0, f0 = bk.causal ? bk.k0 + j0 - bk.q0 : 0;
    f0 = f0 < 0 ? 0 : f0 / ATT_TILE * ATT_TILE;
    float dk[NE], dv[NE];
    for (int e = 0; e < NE; e++) dk[e] = dv[e] = 0.0f;
    for (int64_t h = h0; h < h1; h++) {
        const T *Q = q + h * D, *dO = dout + h * D;
        const float *Lh = lse + h * bk.ldl, *Dh = Dr + h * bk.Sq;
        int64_t g = bk.head0 + h;
        for (int64_t t0 = f0; t0 < bk.Sq; t0 += ATT_TILE) {
            att_stage2(Qs, Q, bk.ldq, dOs, dO, bk.ldo, t0, bk.Sq, D);
            if (j >= bk.Sk || t0 + ATT_TILE - 1 < fj) continue;
            int64_t i = t0 + lane;
            /* visible, and the row sees some key (lse finite) */
            bool vis = i < bk.Sq && i >= fj && Lh[i] != -INFINITY;
            att_dkv_tile<NE>(dk, dv, Qs, dOs, kw, vw, pk, dsw, D, lane, vis, bk.scale, Lh, Dh, i,
                             [&](int64_t ii) {
                                 return tpk__att_keep(bk.p, bk.seed, bk.stream, bk.b, bk.A, g, bk.S,
                                                      bk.q0 + ii, bk.k0 + j);
                             });
        }
    } /* the next query head reading this key/value head */
    if (j >= bk.Sk) return;
    float *dK = dkv + j * bk.ldkv + y * D, *dV = dK + (int64_t)hd.Gl * D;
    for (int e = 0; e < NE; e++) {
        int64_t c = lane + 32 * e;
        if (c < D) dK[c] += bk.scale * dk[e], dV[c] += dv[e];
    }
}

/* The front end checked the block; this backend's own limits: the head dim, the grids
 * (ceil(Sq / ATT_WARPS) or ceil(Sk / ATT_WARPS), Al or Gl) and 32-bit head indices. */
static tpk_status att_blk_check(tpk_ctx *ctx, const char *fn, const tpk_attn_blk *b) {
    if (b->D > ATT_MAXD)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "b->D: head dims up to %d are supported, got %lld", ATT_MAXD,
                         (long long)b->D);
    TPK_TRY(tpk__cuda_limit(ctx, fn, "b->Al", b->Al, 65535, "grid y"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "b->A", b->A, INT_MAX, "32-bit head indices"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "b->Sq", b->Sq, (int64_t)INT_MAX * ATT_WARPS,
                            "grid x: ATT_WARPS query rows per block"));
    return tpk__cuda_limit(ctx, fn, "b->Sk", b->Sk, (int64_t)INT_MAX * ATT_WARPS,
                           "grid x: ATT_WARPS key rows per block");
}

static tpk_status cuda_attn_block_fwd(tpk_ctx *ctx, float *out, float *lse, const void *q,
                                      const void *kv, const tpk_attn_blk *b, bool merge,
                                      tpk_dtype dt) {
    static const char *fn = "cuda.attn_block_fwd";
    TPK_TRY(att_blk_check(ctx, fn, b));
    if (b->Sq == 0 || b->Al == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t smem = att_smem(b->D);
    dim3 grid((unsigned)((b->Sq + ATT_WARPS - 1) / ATT_WARPS), (unsigned)b->Al);
    tpk_status s = TPK_OK;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        /* failures in s, as attn_fwd's */
        tpk_status r = att_by_ne(ctx, fn, b->D, [&](auto ne) {
            auto kernel = attn_blk_fwd_kernel<T, decltype(ne)::value>;
            if ((s = att_smem_attr(ctx, fn, st, b->D, kernel, smem)) != TPK_OK) return;
            kernel<<<grid, 32 * ATT_WARPS, smem, st->stream>>>(out, lse, (const T *)q,
                                                               (const T *)kv, *b, merge);
        });
        if (s == TPK_OK) s = r;
    });
    TPK_TRY(s);
    return tpk__cuda_launched(ctx, fn);
}

static tpk_status cuda_attn_block_bwd(tpk_ctx *ctx, float *dq, float *dkv, const void *dout,
                                      const void *out, const float *lse, const void *q,
                                      const void *kv, const tpk_attn_blk *b, tpk_dtype dt) {
    static const char *fn = "cuda.attn_block_bwd";
    TPK_TRY(att_blk_check(ctx, fn, b));
    if (b->Sq == 0 || b->Sk == 0 || b->Al == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    float *Dr; /* [Al, Sq]: the dQ kernel's, read by the dK/dV kernel after it */
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(float) * (size_t)(b->Al * b->Sq), (void **)&Dr));
    size_t smem = att_smem(b->D);
    int64_t Gl = tpk_attn_kv_heads(b->A, b->G, b->head0, b->Al, NULL);
    dim3 grid((unsigned)((b->Sq + ATT_WARPS - 1) / ATT_WARPS), (unsigned)b->Al),
        kvgrid((unsigned)((b->Sk + ATT_WARPS - 1) / ATT_WARPS), (unsigned)Gl);
    tpk_status s = TPK_OK;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tpk_status r = att_by_ne(ctx, fn, b->D, [&](auto ne) {
            auto kq = attn_blk_dq_kernel<T, decltype(ne)::value>;
            auto kkv = attn_blk_dkv_kernel<T, decltype(ne)::value>;
            if ((s = att_smem_attr(ctx, fn, st, b->D, kq, smem)) != TPK_OK ||
                (s = att_smem_attr(ctx, fn, st, b->D, kkv, smem)) != TPK_OK)
                return;
            kq<<<grid, 32 * ATT_WARPS, smem, st->stream>>>(dq, Dr, (const T *)dout, (const T *)out,
                                                           lse, (const T *)q, (const T *)kv, *b);
            kkv<<<kvgrid, 32 * ATT_WARPS, smem, st->stream>>>(dkv, Dr, (const T *)dout, lse,
                                                              (const T *)q, (const T *)kv, *b);
        });
        if (s == TPK_OK) s = r;
    });
    TPK_TRY(s);
    return tpk__cuda_launched(ctx, fn);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_attn_ops(tpk_ops *o) {
    o->attn_fwd = cuda_attn_fwd;
    o->attn_bwd = cuda_attn_bwd;
    o->attn_block_fwd = cuda_attn_block_fwd;
    o->attn_block_bwd = cuda_attn_block_bwd;
}
