/* kernels/cuda/optim.cu — the CUDA backend's optimizer ops.
 *
 *   adamw   m, v moments; w -= lr (m c1 / (sqrt(v c2) + eps) + wd w), c1, c2 as on the host; the
 *           clipping factor from the norm's sum of squares on the device (no host wait); 8
 *           elements a step in 16-byte vectors; the bf16 copy of the weights written in the same
 *           pass
 *   sumsq   sum x^2 in double: per-block sums, then one block adds them in order, left on the
 *   device */
#include <cmath>

#include "common.cuh"

/* ---- optimizer ------------------------------------------------------------------------------- */

/* the decay of elements i0 .. i0 + V - 1 (sorted runs [decay[2r], decay[2r+1]); NULL: all): one
 * binary search for i0, then a step along the runs per element */
template <int V>
static __device__ __forceinline__ void adamw_decayed(const int64_t *decay, int64_t nruns,
                                                     int64_t i0, bool *d) {
    if (!decay) {
        for (int k = 0; k < V; k++) d[k] = true;
        return;
    }
    int64_t lo = 0, hi = nruns; /* the last run starting at or before i0 is lo - 1 */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (decay[2 * mid] <= i0) lo = mid + 1;
        else hi = mid;
    }
    int64_t r = lo - 1;
    for (int k = 0; k < V; k++) {
        while (r + 1 < nruns && decay[2 * (r + 1)] <= i0 + k) r++;
        d[k] = r >= 0 && i0 + k < decay[2 * r + 1];
    }
}
/* the whole parameter buffer in one launch, 8 elements per step in 16-byte vectors (VEC), weight
 * decay by run, and (W16) the updated weights' bf16 copy written in the same pass; with norm (the
 * gradient's sum of squares in device memory) the clipping factor is computed here, by every thread
 * alike, and a step whose norm is not finite writes nothing (block 0 counts it in norm[1]) */
template <bool VEC, bool W16>
static __global__ void adamw_kernel(float *w, const float *g, float *m, float *v, tpk__bf16 *w16,
                                    size_t n, float lr, float b1, float b2, float eps, float wd,
                                    float c1, float c2, float grad_scale, double *norm, float clip,
                                    const int64_t *decay, int64_t nruns) {
    if (norm) {
        double N = sqrt(norm[0]) * grad_scale;
        if (!isfinite(N)) {
            if (blockIdx.x == 0 && threadIdx.x == 0) norm[1] += 1;
            return;
        }
        grad_scale *= TPK__CLIP_FACTOR(N, clip);
    }
    tpk__elementwise<VEC>(n, [&](size_t i, auto vw) {
        constexpr int V = decltype(vw)::value;
        float wi[V], gi[V], mi[V], vi[V];
        bool d[V];
        tpk__ldn<V>(w, i, wi), tpk__ldn<V>(g, i, gi), tpk__ldn<V>(m, i, mi), tpk__ldn<V>(v, i, vi);
        adamw_decayed<V>(decay, nruns, (int64_t)i, d);
        for (int k = 0; k < V; k++) {
            float gk = gi[k] * grad_scale;
            mi[k] = b1 * mi[k] + (1.0f - b1) * gk, vi[k] = b2 * vi[k] + (1.0f - b2) * gk * gk;
            wi[k] -= lr * (mi[k] * c1 / (sqrtf(vi[k] * c2) + eps) + (d[k] ? wd : 0.0f) * wi[k]);
        }
        tpk__stn<V>(w, i, wi), tpk__stn<V>(m, i, mi), tpk__stn<V>(v, i, vi);
        if (W16) tpk__stn<V>(w16, i, wi);
    });
}
static tpk_status cuda_adamw(tpk_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n,
                             float lr, float b1, float b2, float eps, float wd, int64_t step,
                             float grad_scale, double *norm, float clip, const int64_t *decay,
                             int64_t nruns, uint16_t *w16) {
    static const char *fn = "cuda.adamw";
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    /* the bias corrections exactly as the host computes them */
    float c1 = 1.0f / (1.0f - powf(b1, (float)step)), c2 = 1.0f / (1.0f - powf(b2, (float)step));
    bool vec = tpk__aligned16({w, g, m, v, w16});
    auto launch = [&](auto vc, auto has16) {
        adamw_kernel<decltype(vc)::value, decltype(has16)::value>
            <<<tpk__grid_for(vec ? n / TPK__VEC + 1 : n, 256), 256, 0, st->stream>>>(
                w, g, m, v, (tpk__bf16 *)w16, n, lr, b1, b2, eps, wd, c1, c2, grad_scale, norm,
                clip, decay, nruns);
    };
    if (vec)
        w16 ? launch(std::true_type{}, std::true_type{})
            : launch(std::true_type{}, std::false_type{});
    else
        w16 ? launch(std::false_type{}, std::true_type{})
            : launch(std::false_type{}, std::false_type{});
    return tpk__cuda_launched(ctx, fn);
}

/* The sum of squares in double, left in device memory: per-block sums (8 elements a step in
 * 16-byte loads where x is aligned; a fixed tree), then one warp adds them in a fixed order onto
 * *out (accumulate) or 0 — deterministic, no host wait. */
enum { SUMSQ_BLOCKS = 1024 };
template <bool VEC>
static __global__ void sumsq_partial_kernel(double *part, const float *x, size_t n) {
    __shared__ double sh[256];
    double s = 0;
    tpk__elementwise<VEC>(n, [&](size_t i, auto vw) {
        constexpr int V = decltype(vw)::value;
        float v[V];
        tpk__ldn<V>(x, i, v);
        for (int k = 0; k < V; k++) s += (double)v[k] * v[k];
    });
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}
/* one warp: lane l adds parts l, l + 32, ... in order, then a fixed butterfly over the lanes */
static __global__ void sumsq_final_kernel(double *out, const double *part, int nparts,
                                          bool accumulate) {
    double s = 0;
    for (int i = (int)threadIdx.x; i < nparts; i += 32) s += part[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) *out = (accumulate ? *out : 0.0) + s;
}
static tpk_status cuda_sumsq(tpk_ctx *ctx, double *out, const float *x, size_t n, bool accumulate) {
    static const char *fn = "cuda.sumsq";
    TPK__CUDA_STATE(st, ctx, fn);
    double *part = NULL;
    unsigned blocks = n ? tpk__grid_for(n, 256) : 0;
    if (blocks > SUMSQ_BLOCKS) blocks = SUMSQ_BLOCKS;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(double) * SUMSQ_BLOCKS, (void **)&part));
    if (blocks && tpk__aligned16({x}))
        sumsq_partial_kernel<true><<<blocks, 256, 0, st->stream>>>(part, x, n);
    else if (blocks) sumsq_partial_kernel<false><<<blocks, 256, 0, st->stream>>>(part, x, n);
    sumsq_final_kernel<<<1, 32, 0, st->stream>>>(out, part, (int)blocks, accumulate);
    return tpk__cuda_launched(ctx, fn);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_optim_ops(tpk_ops *o) {
    o->adamw = cuda_adamw;
    o->sumsq = cuda_sumsq;
}
