/* kernels/cuda/embed.cu — the CUDA backend's embedding.
 *
 *   embedding  y[t] = E[ids[t] - v0], a block per token row;  backward: a stable radix sort of
 *              the token indices by row (out-of-range ids sort last), then one block per run of
 *              equal rows adds its tokens' dy in token order, each column by one thread: the host's
 *              sums, bit for bit, no atomics; both 8 columns a thread in 16-byte vectors where H is
 *              a multiple of 8 and the buffers 16-byte aligned */
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

/* ---- embedding ------------------------------------------------------------------------------- */

/* VEC (H a multiple of 8, y or dy and the table 16-byte aligned): a thread takes 8 columns at a
 * time — one 16-byte vector of bf16 (two of f32) and two of the f32 table; otherwise one. */
static bool embed_vec(int64_t H, std::initializer_list<const void *> ps) {
    return H % TPK__VEC == 0 && tpk__aligned16(ps);
}
/* threads of a block over a row of H columns: enough for the row's vectors, 32 to 256 */
static int embed_block(int64_t H, bool vec) {
    int64_t n = vec ? H / TPK__VEC : H, b = (n + 31) / 32 * 32;
    return (int)(b < 32 ? 32 : b > 256 ? 256 : b);
}
/* y[t] = E[ids[t] - v0] (0 for an id outside the shard; acc: added to y): a block per token row
 * (the blocks stride over the rows), its threads over the row's columns */
template <class T, bool VEC>
__global__ void embed_fwd_kernel(T *y, const int32_t *ids, const float *E, int64_t T_, int64_t H,
                                 int64_t v0, int64_t vrows, bool acc) {
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
static tpk_status cuda_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table,
                                 int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt,
                                 bool accumulate) {
    static const char *fn = "cuda.embed_fwd";
    if (T * H == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    bool vec = embed_vec(H, {y, table});
    unsigned grid = (unsigned)(T < INT_MAX ? T : INT_MAX);
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            embed_fwd_kernel<Tt, decltype(v)::value><<<grid, embed_block(H, vec), 0, st->stream>>>(
                (Tt *)y, ids, table, T, H, v0, vrows, accumulate);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* key[t] = ids[t] - v0 when in range, else vrows (sorts after every row); val[t] = t */
static __global__ void embed_keys_kernel(uint32_t *key, uint32_t *val, const int32_t *ids,
                                         int64_t T, int64_t v0, int64_t vrows) {
    TPK__GRID_STRIDE(t, (size_t)T) {
        int64_t row = (int64_t)ids[t] - v0;
        key[t] = row >= 0 && row < vrows ? (uint32_t)row : (uint32_t)vrows;
        val[t] = (uint32_t)t;
    }
}
/* block b starts a run when key[b] differs from key[b-1]; it adds its tokens' rows in token order,
 * each column by one thread (VEC: 8 columns a thread, in 16-byte vectors) */
template <class T, bool VEC>
__global__ void embed_bwd_kernel(float *dE, const T *dy, const uint32_t *key, const uint32_t *tok,
                                 int64_t T_, int64_t H, int64_t vrows) {
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
static tpk_status cuda_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids,
                                 int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt) {
    static const char *fn = "cuda.embed_bwd";
    if (T == 0 || H == 0 || vrows == 0) return TPK_OK;
    TPK_TRY(tpk__cuda_limit(ctx, fn, "T", T, INT_MAX, "tokens of one radix sort"));
    TPK_TRY(tpk__cuda_limit(ctx, fn, "vrows", vrows, (int64_t)UINT32_MAX - 1, "32-bit sort keys"));
    TPK__CUDA_STATE(st, ctx, fn);
    int end_bit = 1;
    while (end_bit < 32 && ((uint64_t)1 << end_bit) <= (uint64_t)vrows) end_bit++;
    size_t n = (size_t)T, sort_bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(
        NULL, sort_bytes, (uint32_t *)NULL, (uint32_t *)NULL, (uint32_t *)NULL, (uint32_t *)NULL,
        (int)T, 0, end_bit, st->stream);
    if (e != cudaSuccess)
        return tpk__cuda_err(ctx, fn, "cub::DeviceRadixSort::SortPairs (size query)", e);
    size_t keys_bytes = (4 * n * sizeof(uint32_t) + 255) / 256 * 256;
    char *scratch;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, keys_bytes + sort_bytes, (void **)&scratch));
    uint32_t *k_in = (uint32_t *)scratch, *v_in = k_in + n, *k_out = v_in + n, *v_out = k_out + n;
    embed_keys_kernel<<<tpk__grid_for(n, 256), 256, 0, st->stream>>>(k_in, v_in, ids, T, v0, vrows);
    TPK_TRY(tpk__cuda_launched(ctx, fn));
    /* LSD radix sort is stable: equal rows keep token order */
    e = cub::DeviceRadixSort::SortPairs(scratch + keys_bytes, sort_bytes, k_in, k_out, v_in, v_out,
                                        (int)T, 0, end_bit, st->stream);
    if (e != cudaSuccess) return tpk__cuda_err(ctx, fn, "cub::DeviceRadixSort::SortPairs", e);
    unsigned grid = T < 65535 ? (unsigned)T : 65535u;
    bool vec = embed_vec(H, {dtable, dy});
    tpk__by_dtype(dt, [&](auto tag) {
        using Tt = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            embed_bwd_kernel<Tt, decltype(v)::value><<<grid, embed_block(H, vec), 0, st->stream>>>(
                dtable, (const Tt *)dy, k_out, v_out, T, H, vrows);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_embed_ops(tpk_ops *o) {
    o->embed_fwd = cuda_embed_fwd;
    o->embed_bwd = cuda_embed_bwd;
}
