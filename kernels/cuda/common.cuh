/* kernels/cuda/common.cuh — private helpers of the CUDA backend: the backend state (stream,
 * cuBLASLt handle, workspace, scratch), element access for both dtypes, one-kernel-per-op
 * dtype dispatch, argument checks mirroring the host backend's, launch error checks and
 * warp/block reductions. Not installed. */
#ifndef TPK_CUDA_COMMON_CUH
#define TPK_CUDA_COMMON_CUH

#include <climits>
#include <cstdint>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* tpk/ctx.h is C-only (compound literals), so the kernels see the context as an opaque type and
 * record failures through tpk__cuda_fail (fail.c, compiled as C). */
extern "C" {
#include <tpk/comm.h>
#include <tpk/cuda.h>
#include <tpk/ops.h>
#include <tpk/rng.h>
tpk_status tpk__cuda_fail(tpk_ctx *ctx, tpk_status s, const char *fn, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
}
#define tpk__fail tpk__cuda_fail

typedef __nv_bfloat16 bf16;

/* ---- backend state ------------------------------------------------------------------------------
 * One per process, created on first use on the device current at that moment: the compute
 * stream every op runs on, the cuBLASLt handle and its workspace, and a scratch buffer that
 * reductions use for their per-block partial results (grown in stream order). */
struct cuda_state {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    void *scratch;
    size_t scratch_bytes;
    bool tf32;
};

/* The state, created lazily; NULL with an error in ctx when CUDA cannot be initialised. */
cuda_state *cuda_get(tpk_ctx *ctx, const char *fn);
/* A scratch buffer of at least `bytes` on the state's stream (valid until the next call). */
tpk_status cuda_scratch(tpk_ctx *ctx, const char *fn, cuda_state *st, size_t bytes, void **out);

static inline tpk_status cuda_fail(tpk_ctx *ctx, const char *fn, const char *what, cudaError_t e) {
    return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
/* After a launch: a launch error becomes TPK_ERR_BACKEND naming the op. */
static inline tpk_status cuda_launched(tpk_ctx *ctx, const char *fn) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? TPK_OK : cuda_fail(ctx, fn, "kernel launch failed", e);
}
#define CUDA_TRY(ctx, fn, call)                                                                    \
    do {                                                                                           \
        cudaError_t cuda__e = (call);                                                              \
        if (cuda__e != cudaSuccess) return cuda_fail(ctx, fn, #call, cuda__e);                     \
    } while (0)

/* The state of an op, or return its failure. */
#define CUDA_STATE(st, ctx, fn)                                                                    \
    cuda_state *st = cuda_get(ctx, fn);                                                            \
    if (!st) return TPK_ERR_BACKEND

/* ---- element access ------------------------------------------------------------------------------ */

__device__ __forceinline__ float ldf(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ldf(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stf(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(bf16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* Call f(T{}) with T = float or bf16: a kernel written once as a template, launched for the
 * dtype at hand (the CUDA counterpart of the host's BY_DTYPE). */
template <class F> static inline void by_dtype(tpk_dtype dt, F f) {
    if (dt == TPK_F32) f(float{});
    else f(bf16{});
}

/* Grid of 1-D launches over n elements: a grid-stride loop covers the rest. */
static inline unsigned grid_for(size_t n, int block) {
    size_t g = (n + (size_t)block - 1) / (size_t)block;
    if (g < 1) g = 1;
    if (g > 65535u * 8u) g = 65535u * 8u;
    return (unsigned)g;
}
#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* ---- reductions ------------------------------------------------------------------------------------ */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum / max over a block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. */
__device__ __forceinline__ float block_sum(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

/* ---- argument checks (the host backend's, with "cuda." names) ------------------------------------- */

static inline tpk_status check_float_dtype(tpk_ctx *ctx, const char *fn, const char *arg, tpk_dtype dt) {
    if (dt == TPK_F32 || dt == TPK_BF16) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_DTYPE, fn, "%s: expected f32 or bf16, got %s (%d)", arg, tpk_dtype_name(dt), (int)dt);
}
static inline tpk_status check_nonneg(tpk_ctx *ctx, const char *fn, const char *arg, int64_t v) {
    if (v >= 0) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected >= 0, got %lld", arg, (long long)v);
}
static inline tpk_status check_ptr(tpk_ctx *ctx, const char *fn, const char *arg, const void *p, bool needed) {
    if (p || !needed) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected a buffer, got NULL", arg);
}
static inline tpk_status check_ld(tpk_ctx *ctx, const char *fn, const char *arg, int64_t ld, int64_t min) {
    if (min < 1) min = 1;
    if (ld >= min) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected >= %lld, got %lld", arg, (long long)min, (long long)ld);
}

/* ---- the ops of ops_cuda_layers.cu (contracts in tpk/ops.h) ---------------------------------------- */

tpk_status tpk__cuda_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                             int64_t col0, float p, uint64_t seed, uint64_t stream, tpk_dtype dt);
tpk_status tpk__cuda_layernorm_fwd(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x, const float *w, const float *b,
                                   int64_t rows, int64_t cols, float eps, tpk_dtype dt);
tpk_status tpk__cuda_residual_layernorm_fwd(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd, const void *x, const void *r,
                                            const float *w, const float *b, int64_t rows, int64_t cols, float eps, tpk_dtype dt);
tpk_status tpk__cuda_layernorm_bwd(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy, const void *x, const float *w,
                                   const float *mean, const float *rstd, int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx);
tpk_status tpk__cuda_embed_fwd(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt, bool accumulate);
tpk_status tpk__cuda_embed_bwd(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids, int64_t T, int64_t H, int64_t v0,
                               int64_t vrows, tpk_dtype dt);
tpk_status tpk__cuda_xent_max(tpk_ctx *ctx, float *mx, const void *z, int64_t T, int64_t Vl, tpk_dtype dt);
tpk_status tpk__cuda_xent_partial(tpk_ctx *ctx, float *part, const void *z, const float *mx, const int32_t *targets, int64_t T,
                                  int64_t Vl, int64_t v0, tpk_dtype dt);
tpk_status tpk__cuda_xent_loss(tpk_ctx *ctx, float *loss, float *lse, const float *mx, const float *part, const int32_t *targets,
                               int64_t T, int64_t V, float smoothing, int32_t ignore_index);
tpk_status tpk__cuda_xent_grad(tpk_ctx *ctx, void *dz, const void *z, const float *lse, const int32_t *targets, const float *dloss,
                               int64_t T, int64_t Vl, int64_t v0, int64_t V, float smoothing, int32_t ignore_index, tpk_dtype dt);
tpk_status tpk__cuda_attn_fwd(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B, int64_t S, int64_t Al, int64_t D,
                              int64_t A, int64_t head0, float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt);
tpk_status tpk__cuda_attn_bwd(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int64_t B, int64_t S, int64_t Al, int64_t D, int64_t A, int64_t head0, float scale, float p,
                              uint64_t seed, uint64_t stream, tpk_dtype dt);

/* Column sums over row chunks, deterministic (no atomics): part[c][k][j] = sum over rows i of
 * chunk c of f(i, j)[k] (NOUT outputs per element), then out_k[j] (+)= sum_c part[c][k][j] in
 * chunk order. Used by bias_grad and layernorm's dw, db. Launch with grid (ceil(cols / 32),
 * colsum_grid_y(chunks)), block (32, 8): gridDim.y is at most 65535, so a block strides over the
 * chunks (rows > 65535 * COLSUM_ROWS); a chunk's sum does not depend on which block adds it. */
enum { COLSUM_ROWS = 256 }; /* rows per chunk */
static inline unsigned colsum_grid_y(int64_t chunks) { return (unsigned)(chunks < 65535 ? chunks : 65535); }
template <int NOUT, class F>
__global__ void colsum_partial_kernel(F f, int64_t rows, int64_t cols, float *part) {
    __shared__ float sh[NOUT][8][33];
    int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x, chunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) { /* uniform over the block */
        int64_t r0 = c * COLSUM_ROWS, r1 = r0 + COLSUM_ROWS < rows ? r0 + COLSUM_ROWS : rows;
        float acc[NOUT];
        for (int k = 0; k < NOUT; k++) acc[k] = 0.0f;
        if (j < cols)
            for (int64_t i = r0 + threadIdx.y; i < r1; i += 8) {
                float v[NOUT];
                f(i, j, v);
                for (int k = 0; k < NOUT; k++) acc[k] += v[k];
            }
        __syncthreads(); /* the previous chunk's sums have been read */
        for (int k = 0; k < NOUT; k++) sh[k][threadIdx.y][threadIdx.x] = acc[k];
        __syncthreads();
        if (threadIdx.y == 0 && j < cols)
            for (int k = 0; k < NOUT; k++) {
                float s = 0.0f;
                for (int y = 0; y < 8; y++) s += sh[k][y][threadIdx.x];
                part[((size_t)c * NOUT + k) * (size_t)cols + (size_t)j] = s;
            }
    }
}
#endif
