/* kernels/cuda/common.cuh — private helpers of the CUDA backend: the backend state (stream,
 * cuBLASLt handle, workspace, scratch), element access for both dtypes, one-kernel-per-op
 * dtype dispatch, launch error checks and warp/block reductions. Not installed. Names are
 * tpk__-prefixed. */
#ifndef TPK_CUDA_COMMON_CUH
#define TPK_CUDA_COMMON_CUH

#include <climits>
#include <initializer_list>
#include <type_traits>
#include <cstdint>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* The headers compile as C++17: the kernels record failures with tpk__fail (tpk/base/ctx.h)
 * directly; arguments arrive checked by the front end (tpk/runtime/op.h). */
#include <tpk/base/comm.h>
#include <tpk/runtime/cuda.h>
#include <tpk/runtime/backend.h>
#include <tpk/base/rng.h>

typedef __nv_bfloat16 tpk__bf16;

/* ---- backend state ------------------------------------------------------------------------------
 * One per process, created on first use on the device current at that moment: the compute
 * stream every op runs on, the cuBLASLt handle and its workspace (shared by the cuBLAS handle of
 * the grouped GEMM, made by gemm.cu on its first use: both run in the stream's order), and a
 * scratch buffer that reductions use for their per-block partial results (grown in stream
 * order). */
struct tpk__cuda_state {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas; /* gemm.cu's grouped GEMM (cublasGemmGroupedBatchedEx); NULL until used */
    void *lt_ws;
    size_t lt_ws_bytes;
    void *scratch;
    size_t scratch_bytes;
    bool tf32;
    int cc;          /* compute capability, 10 major + minor (80 = sm_80) */
    size_t smem_optin; /* the most dynamic shared memory a block may have (227 KiB on sm_90, 99 KiB
                          on sm_86/89) */
    cudaEvent_t sync_ev; /* tpk__cuda_wait's mark on the stream, created on first use */
    cudaEvent_t *ev; /* the profiler's timer marks (tpk/runtime/profile.h), created on first use */
    int nev;
    /* small uploads go through a ring of pinned host slots, each free again when its event has
     * passed, so an upload never waits for the device (TPK__CUDA_UPLOAD_SLOTS x up to 4 MiB) */
    void *up[8];
    size_t up_bytes[8];
    cudaEvent_t up_done[8];
    int up_next;
};
enum { TPK__CUDA_UPLOAD_SLOTS = 8 };
#define TPK__CUDA_UPLOAD_MAX ((size_t)4 << 20)

/* cuBLASLt's first algorithm for op on the layouts la, lb (its A and B), lc (C and D) within the
 * backend's workspace, for pointers aligned to align_a, align_b and align_c bytes (its A, B, C and
 * D) into *res; *found 0 when it has none (gemm.cu's and fp8.cu's plans). */
static inline cublasStatus_t tpk__lt_heuristic(const tpk__cuda_state *st, cublasLtMatmulDesc_t op,
                                               cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                               cublasLtMatrixLayout_t lc, uint32_t align_a,
                                               uint32_t align_b, uint32_t align_c,
                                               cublasLtMatmulHeuristicResult_t *res, int *found) {
    cublasLtMatmulPreference_t pref;
    cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    uint64_t ws = st->lt_ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                         sizeof align_a);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                         sizeof align_b);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                         sizeof align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                         sizeof align_c);
    s = cublasLtMatmulAlgoGetHeuristic(st->lt, op, la, lb, lc, lc, pref, 1, res, found);
    cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

/* The host waits for the compute stream: every such wait of the backend goes through here and
 * is counted (tpk_cuda_sync_count, tpk/runtime/cuda.h). */
tpk_status tpk__cuda_wait(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st);
/* The host waits until `ev` has passed. While a wait hook is registered it polls and runs the hook
 * meanwhile, so a collective that never finishes ends the wait with the hook's error (TPK_ERR_COMM,
 * its communicator aborted) after the communicator's timeout instead of hanging. */
tpk_status tpk__cuda_event_wait(tpk_ctx *ctx, const char *fn, cudaEvent_t ev);
/* The wait hook: a communicator that can leave a host wait hanging (comm_nccl.cu: its watchdog)
 * registers one while any of its communicators are alive and clears it (NULL) when none is left.
 * The backend calls it and never names a communicator: no call cycle between the .cu files. */
typedef tpk_status (*tpk__cuda_wait_hook)(tpk_ctx *ctx, const char *fn);
void tpk__cuda_set_wait_hook(tpk__cuda_wait_hook hook);
/* cudaEventQuery that leaves no cudaErrorNotReady behind as the thread's last error (the launch
 * checks read it) */
static inline cudaError_t tpk__event_query(cudaEvent_t ev) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    return e;
}

/* The state, created lazily; NULL with an error in ctx when CUDA cannot be initialised. */
tpk__cuda_state *tpk__cuda_get(tpk_ctx *ctx, const char *fn);
/* A scratch buffer of at least `bytes` on the state's stream (valid until the next call). */
tpk_status tpk__cuda_scratch(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, size_t bytes,
                             void **out);
/* whether f32 GEMMs may use TF32 (tpk_cuda_allow_tf32) */
bool tpk__cuda_tf32(void);

static inline tpk_status tpk__cuda_err(tpk_ctx *ctx, const char *fn, const char *what,
                                       cudaError_t e) {
    return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "%s: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}
/* After a launch: a launch error becomes TPK_ERR_BACKEND naming the op. */
static inline tpk_status tpk__cuda_launched(tpk_ctx *ctx, const char *fn) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? TPK_OK : tpk__cuda_err(ctx, fn, "kernel launch failed", e);
}
/* This backend's own size limits (grid dimensions, 32-bit counts and keys): TPK_ERR_ARG naming the
 * argument, the limit and why. The front end (tpk/runtime/op.h) has checked the contract itself. */
static inline tpk_status tpk__cuda_limit(tpk_ctx *ctx, const char *fn, const char *arg, int64_t v,
                                         int64_t max, const char *why) {
    if (v <= max) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected <= %lld (%s), got %lld", arg,
                     (long long)max, why, (long long)v);
}
#define TPK__CUDA_TRY(ctx, fn, call)                                                       \
    do {                                                                                   \
        cudaError_t tpk__cuda_e = (call);                                                  \
        if (tpk__cuda_e != cudaSuccess) return tpk__cuda_err(ctx, fn, #call, tpk__cuda_e); \
    } while (0)

/* The state of an op, or return its failure. */
#define TPK__CUDA_STATE(st, ctx, fn)              \
    tpk__cuda_state *st = tpk__cuda_get(ctx, fn); \
    if (!st) return TPK_ERR_BACKEND

/* ---- element access -------------------------------------------------------------------------- */

__device__ __forceinline__ float tpk__ldf(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float tpk__ldf(const tpk__bf16 *p, size_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void tpk__stf(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void tpk__stf(tpk__bf16 *p, size_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}

/* Call f(T{}) with T = float or bf16: a kernel written once as a template, launched for the
 * dtype at hand (the CUDA counterpart of the host's BY_DTYPE). */
template <class F> static inline void tpk__by_dtype(tpk_dtype dt, F f) {
    if (dt == TPK_F32) f(float{});
    else f(tpk__bf16{});
}

/* Grid of 1-D launches over n elements: a grid-stride loop covers the rest. */
static inline unsigned tpk__grid_for(size_t n, int block) {
    size_t g = (n + (size_t)block - 1) / (size_t)block;
    if (g < 1) g = 1;
    if (g > 65535u * 8u) g = 65535u * 8u;
#ifdef TPK_EMU
    g = tpk_emu_grid_cap(g); /* the CPU emulation's TPK_EMU_GRID_CAP: fewer blocks, several trips of
                                each grid-stride loop */
#endif
    return (unsigned)g;
}
#define TPK__GRID_STRIDE(i, n)                                              \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- 16-byte vectors for elementwise kernels ----------------------------------------------------
 * An elementwise kernel written once handles V = 8 consecutive elements per step with 16-byte
 * loads and stores (one for 8 bf16, two for 8 f32) when its launcher found every pointer 16-byte
 * aligned (VEC), else one element per step; tpk__elementwise runs its body over n elements with a
 * grid-stride loop, the last n % 8 elements one by one. */
template <int V, class T>
__device__ __forceinline__ void tpk__ldn(const T *p, size_t i, float *out) {
    if constexpr (V == 1) {
        out[0] = tpk__ldf(p, i);
    } else {
        static_assert(V * sizeof(T) % 16 == 0, "whole 16-byte vectors");
        uint4 u[V * sizeof(T) / 16];
        for (int q = 0; q < (int)(V * sizeof(T) / 16); q++)
            u[q] = reinterpret_cast<const uint4 *>(p + i)[q];
        const T *e = reinterpret_cast<const T *>(u);
        for (int k = 0; k < V; k++) out[k] = tpk__ldf(e, (size_t)k);
    }
}
template <int V, class T>
__device__ __forceinline__ void tpk__stn(T *p, size_t i, const float *in) {
    if constexpr (V == 1) {
        tpk__stf(p, i, in[0]);
    } else {
        uint4 u[V * sizeof(T) / 16];
        T *e = reinterpret_cast<T *>(u);
        for (int k = 0; k < V; k++) tpk__stf(e, (size_t)k, in[k]);
        for (int q = 0; q < (int)(V * sizeof(T) / 16); q++)
            reinterpret_cast<uint4 *>(p + i)[q] = u[q];
    }
}
enum { TPK__VEC = 8 };
template <bool VEC, class F> __device__ __forceinline__ void tpk__elementwise(size_t n, F body) {
    constexpr int V = VEC ? TPK__VEC : 1;
    size_t nv = n / V;
    TPK__GRID_STRIDE(j, nv) body(j * V, std::integral_constant<int, V>{});
    /* the tail: fewer than V elements */
    size_t i = nv * V + blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (VEC && i < n) body(i, std::integral_constant<int, 1>{});
}
/* x rounded to T (the value a store to T and a load back give) */
template <class T> __device__ __forceinline__ float tpk__round(float x) {
    if constexpr (std::is_same<T, float>::value) return x;
    else return __bfloat162float(__float2bfloat16_rn(x));
}
/* 2^x by one MUFU instruction on the GPU: ex2.approx.ftz.f32 (relative error about 2^-22, results
 * below 2^-126 and subnormal x flushed to 0 — a term that cannot move an f32 sum of exponentials
 * with a term of at least 1; 2^-inf = 0); in host code (the CUDA emulation) exp2f with the same
 * flushes. e^x = tpk__ex2(x log2 e). Every kernel's exponential (the attention, the
 * cross-entropy). */
__device__ __forceinline__ float tpk__ex2(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    const float tiny = 0x1p-126f; /* the least normal float */
    float y = exp2f(fabsf(x) < tiny ? 0.0f : x);
    return y < tiny ? 0.0f : y;
#endif
}
#define TPK__LOG2E 1.4426950408889634f
/* whether every pointer is 16-byte aligned (NULL counts as aligned) */
static inline bool tpk__aligned16(std::initializer_list<const void *> ps) {
    for (const void *p : ps)
        if ((uintptr_t)p % 16) return false;
    return true;
}
/* launch grid of an elementwise kernel over n elements: vectors when vec */
static inline unsigned tpk__grid_elementwise(size_t n, bool vec) {
    return tpk__grid_for(vec ? (n + TPK__VEC - 1) / TPK__VEC : n, 256);
}
/* Call f(std::bool_constant<vec>) */
template <class F> static inline void tpk__by_vec(bool vec, F f) {
    if (vec) f(std::true_type{});
    else f(std::false_type{});
}

/* ---- reductions ------------------------------------------------------------------------------ */

__device__ __forceinline__ float tpk__warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float tpk__warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum / max over a block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. */
__device__ __forceinline__ float tpk__block_sum(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tpk__warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return tpk__warp_sum(v);
}
__device__ __forceinline__ float tpk__block_max(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tpk__warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return tpk__warp_max(v);
}

/* Each file of the backend fills its entries of the table (table.cu). */
void tpk__cuda_state_ops(tpk_ops *o);
void tpk__cuda_elementwise_ops(tpk_ops *o);
void tpk__cuda_gemm_ops(tpk_ops *o);
void tpk__cuda_fp8_ops(tpk_ops *o);
void tpk__cuda_optim_ops(tpk_ops *o);
void tpk__cuda_rng_ops(tpk_ops *o);
void tpk__cuda_norm_ops(tpk_ops *o);
void tpk__cuda_rope_swiglu_ops(tpk_ops *o);
void tpk__cuda_embed_ops(tpk_ops *o);
void tpk__cuda_rows_ops(tpk_ops *o);
void tpk__cuda_xent_ops(tpk_ops *o);
void tpk__cuda_attn_ops(tpk_ops *o);

/* Column sums over row chunks, deterministic (no atomics): part[c][k][j] = sum over rows i of
 * chunk c (crows rows, TPK__COLSUM_ROWS unless given) of f(i, j)[k] (NOUT outputs per element),
 * then out_k[j] (+)= sum_c part[c][k][j] in chunk order. Used by bias_grad and layernorm's dw, db
 * (and to add up the layernorm backward's per-block partials, crows = 64). Launch with grid
 * (ceil(cols / 32), tpk__colsum_grid_y(chunks)), block (32, 8): gridDim.y is at most 65535, so a
 * block strides over the chunks (rows > 65535 * crows); a chunk's sum does not depend on which
 * block adds it. */
enum { TPK__COLSUM_ROWS = 256 }; /* rows per chunk */
static inline unsigned tpk__colsum_grid_y(int64_t chunks) {
    size_t g = (size_t)(chunks < 65535 ? chunks : 65535);
#ifdef TPK_EMU
    g = tpk_emu_grid_cap(g); /* TPK_EMU_GRID_CAP: blocks stride over several chunks */
#endif
    return (unsigned)g;
}
template <int NOUT, class F>
__global__ void tpk__colsum_partial_kernel(F f, int64_t rows, int64_t cols, float *part,
                                           int64_t crows = TPK__COLSUM_ROWS) {
    __shared__ float sh[NOUT][8][33];
    int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x, chunks = (rows + crows - 1) / crows;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) { /* uniform over the block */
        int64_t r0 = c * crows, r1 = r0 + crows < rows ? r0 + crows : rows;
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
