/* kernels/cuda/rope_swiglu.cu — the CUDA backend's rotary embedding and SwiGLU (Llama).
 *
 *   rope       (x_j, x_{j+D/2}) of each (row, head, pair j < D/2) rotated by a = s theta^(-2j/D),
 *              s = row mod S; y may be x. cos a and sin a come from a table [S, D/2] made once
 *              per (S, D, theta) on the device (the angle in double, as the host, rounded to
 *              float) and kept (rope_table: 8 kept, at most 128 MB each); a thread rotates 8
 *              pairs with 16-byte loads where rows and heads allow, else one. Without a table
 *              (too large) the per-element kernel below.
 *   rope_at    one thread per (row, head, pair) at s = pos[row mod npos] (an int32 table in device
 *              memory: context parallelism's rows at their true positions), cos and sin of the
 *              angle computed in double there — the same values as rope's table, so at
 *              pos = 0..S-1 the same bits
 *   swiglu     h = silu(gate) up, 8 columns a thread (16-byte loads) where F and the pointers
 *              allow, else one; backward dgate, dup written after both inputs are read (dgu may
 *              be gu) */
#include <cmath>
#include <mutex>

#include "common.cuh"

/* ---- rotary embedding, SwiGLU ---------------------------------------------------------------- */

/* cos a, sin a of a = s theta^(-2j/D): the angle in double, as the host; rounded to float */
__device__ __forceinline__ float2 rope_cs(int64_t s, int64_t j, int64_t D, float theta) {
    double a = (double)s * pow((double)theta, -2.0 * (double)j / (double)D);
    return make_float2((float)cos(a), (float)sin(a));
}
/* the pair (x1, x2) rotated by (c, n = sin or -sin): both kernels' one expression */
__device__ __forceinline__ void rope_rot(float x1, float x2, float c, float n, float *o1,
                                         float *o2) {
    *o1 = x1 * c - x2 * n;
    *o2 = x2 * c + x1 * n;
}

/* one thread per (row, head, pair j < D/2): the angle computed here; row i at position i mod S, or
 * pos[i mod S] where pos is not NULL (rope_at, S = npos) */
template <class T>
__global__ void rope_kernel(T *y, int64_t ldy, const T *x, int64_t ldx, int64_t rows,
                            const int32_t *pos, int64_t S, int64_t heads, int64_t D, float theta,
                            bool inverse) {
    int64_t half = D / 2;
    TPK__GRID_STRIDE(k, (size_t)(rows * heads * half)) {
        int64_t j = (int64_t)(k % (size_t)half), h = (int64_t)(k / (size_t)half % (size_t)heads),
                i = (int64_t)(k / (size_t)(half * heads));
        int64_t s = pos ? (int64_t)pos[i % S] : i % S;
        float2 cs = rope_cs(s, j, D, theta);
        size_t xi = (size_t)(i * ldx + h * D + j), yi = (size_t)(i * ldy + h * D + j);
        float o1, o2;
        rope_rot(tpk__ldf(x, xi), tpk__ldf(x, xi + half), cs.x, inverse ? -cs.y : cs.y, &o1, &o2);
        tpk__stf(y, yi, o1);
        tpk__stf(y, yi + half, o2);
    }
}

/* rope's table: tab[s D/2 + j] = (cos a, sin a) for s < S, j < D/2 */
__global__ void rope_table_kernel(float2 *tab, int64_t S, int64_t D, float theta) {
    int64_t half = D / 2;
    TPK__GRID_STRIDE(k, (size_t)(S * half))
    tab[k] = rope_cs((int64_t)(k / (size_t)half), (int64_t)(k % (size_t)half), D, theta);
}
/* rope from the table: one thread per (row, head, V pairs j .. j + V - 1); V = 8: 16-byte loads */
template <class T, int V>
__global__ void rope_tab_kernel(T *y, int64_t ldy, const T *x, int64_t ldx, int64_t rows,
                                const float2 *tab, int64_t S, int64_t heads, int64_t D,
                                bool inverse) {
    int64_t half = D / 2, nv = half / V;
    TPK__GRID_STRIDE(k, (size_t)(rows * heads * nv)) {
        size_t hk = k / (size_t)nv;
        int64_t j = (int64_t)(k - hk * (size_t)nv) * V, h = (int64_t)(hk % (size_t)heads),
                i = (int64_t)(hk / (size_t)heads);
        size_t xi = (size_t)(i * ldx + h * D + j), yi = (size_t)(i * ldy + h * D + j);
        const float2 *t = tab + (i % S) * half + j;
        float x1[V], x2[V], o1[V], o2[V];
        tpk__ldn<V>(x, xi, x1);
        tpk__ldn<V>(x, xi + (size_t)half, x2);
        for (int e = 0; e < V; e++) {
            float2 cs = t[e];
            rope_rot(x1[e], x2[e], cs.x, inverse ? -cs.y : cs.y, &o1[e], &o2[e]);
        }
        tpk__stn<V>(y, yi, o1);
        tpk__stn<V>(y, yi + (size_t)half, o2);
    }
}
/* The table of (S, D, theta), made on the stream on first use and kept (8 tables, the oldest
 * replaced); NULL where it would take more than 128 MB. */
enum { ROPE_TABLES = 8 };
struct rope_table_entry {
    int64_t S, D;
    float theta;
    float2 *p;
};
static rope_table_entry g_rope_tab[ROPE_TABLES];
static int g_rope_next;
static std::mutex g_rope_mutex;
static tpk_status rope_table(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, int64_t S,
                             int64_t D, float theta, const float2 **out) {
    *out = NULL;
    size_t n = (size_t)(S * (D / 2));
    if (n * sizeof(float2) > ((size_t)128 << 20)) return TPK_OK;
    std::lock_guard<std::mutex> lock(g_rope_mutex);
    for (int k = 0; k < ROPE_TABLES; k++) {
        rope_table_entry &e = g_rope_tab[k];
        if (e.p && e.S == S && e.D == D && e.theta == theta) return *out = e.p, TPK_OK;
    }
    rope_table_entry &e = g_rope_tab[g_rope_next];
    g_rope_next = (g_rope_next + 1) % ROPE_TABLES;
    if (e.p) cudaFree(e.p), e.p = NULL; /* (cudaFree waits for the kernels that read it) */
    TPK__CUDA_TRY(ctx, fn, cudaMalloc(&e.p, n * sizeof(float2)));
    e.S = S, e.D = D, e.theta = theta;
    rope_table_kernel<<<tpk__grid_for(n, 256), 256, 0, st->stream>>>(e.p, S, D, theta);
    TPK_TRY(tpk__cuda_launched(ctx, fn));
    *out = e.p;
    return TPK_OK;
}

static tpk_status rope_launch(tpk_ctx *ctx, const char *fn, void *y, int64_t ldy, const void *x,
                              int64_t ldx, int64_t rows, const int32_t *pos, int64_t S,
                              int64_t heads, int64_t D, float theta, bool inverse, tpk_dtype dt) {
    size_t n = (size_t)(rows * heads * (D / 2));
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    const float2 *tab = NULL;
    if (!pos) TPK_TRY(rope_table(ctx, fn, st, S, D, theta, &tab));
    if (tab) {
        bool vec = (D / 2) % 8 == 0 && ldx % 8 == 0 && ldy % 8 == 0 && tpk__aligned16({x, y});
        tpk__by_dtype(dt, [&](auto tag) {
            using T = decltype(tag);
            if (vec)
                rope_tab_kernel<T, 8><<<tpk__grid_for(n / 8, 256), 256, 0, st->stream>>>(
                    (T *)y, ldy, (const T *)x, ldx, rows, tab, S, heads, D, inverse);
            else
                rope_tab_kernel<T, 1><<<tpk__grid_for(n, 256), 256, 0, st->stream>>>(
                    (T *)y, ldy, (const T *)x, ldx, rows, tab, S, heads, D, inverse);
        });
        return tpk__cuda_launched(ctx, fn);
    }
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

/* SwiGLU, one thread per (row, V columns j .. j + V - 1 of F): forward h = silu(g) u; backward
 * (dh given) dg, du written after both inputs are read (dgu may be gu). V = 8 (16-byte loads and
 * stores) where F is a multiple of 8 and the pointers 16-byte aligned, else 1; the same arithmetic
 * either way. */
template <class T, int V>
__global__ void swiglu_kernel(T *out, const T *gu, const T *dh, int64_t rows, int64_t F) {
    int64_t nv = F / V;
    TPK__GRID_STRIDE(kv, (size_t)(rows * nv)) {
        int64_t i = (int64_t)(kv / (size_t)nv), j = ((int64_t)kv - i * nv) * V;
        size_t a = (size_t)(i * 2 * F + j), k = (size_t)(i * F + j);
        float g[V], u[V], sg[V], o1[V], o2[V];
        tpk__ldn<V>(gu, a, g);
        tpk__ldn<V>(gu, a + (size_t)F, u);
        for (int e = 0; e < V; e++) sg[e] = 1.0f / (1.0f + expf(-g[e]));
        if (!dh) {
            for (int e = 0; e < V; e++) o1[e] = g[e] * sg[e] * u[e];
            tpk__stn<V>(out, k, o1);
            continue;
        }
        float d[V];
        tpk__ldn<V>(dh, k, d);
        for (int e = 0; e < V; e++) {
            o1[e] = d[e] * u[e] * sg[e] * (1.0f + g[e] * (1.0f - sg[e]));
            o2[e] = d[e] * g[e] * sg[e];
        }
        tpk__stn<V>(out, a, o1);
        tpk__stn<V>(out, a + (size_t)F, o2);
    }
}
static tpk_status swiglu_launch(tpk_ctx *ctx, const char *fn, void *out, const void *gu,
                                const void *dh, int64_t rows, int64_t F, tpk_dtype dt) {
    size_t n = (size_t)(rows * F);
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    bool vec = F % 8 == 0 && tpk__aligned16({out, gu, dh});
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if (vec)
            swiglu_kernel<T, 8><<<tpk__grid_for(n / 8, 256), 256, 0, st->stream>>>(
                (T *)out, (const T *)gu, (const T *)dh, rows, F);
        else
            swiglu_kernel<T, 1><<<tpk__grid_for(n, 256), 256, 0, st->stream>>>(
                (T *)out, (const T *)gu, (const T *)dh, rows, F);
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
