/* kernels/cuda/ops_cuda.cu — the CUDA backend: state, memory, elementwise ops, GEMM, the table.
 *
 * Same contract as the host backend (tpk/ops.h, kernels/host/): f32 and bf16 storage,
 * f32 arithmetic (bf16 widened on load, rounded to nearest even on store). Every op runs on the
 * backend's stream; every kernel is one template instantiated for float and bf16.
 *
 *   linear_fwd  x W^T + bias (+ GELU-tanh keeping the pre-activation) in one cuBLASLt call with an epilogue
 *             (BIAS, GELU_AUX, GELU_AUX_BIAS); an activation without an epilogue is composed
 *   gemm      C = alpha op(A) op(B) + beta C    cuBLASLt. Row-major C[m, n] is column-major
 *             C^T[n, m] = op(B)^T op(A)^T, so B goes first with the transposes unchanged. The
 *             descriptors and the heuristic's algorithm are cached per shape, strides and pointer
 *             alignment. f32 computes in f32 (TF32 only when allowed), bf16 in f32. A layout
 *             cuBLASLt has no algorithm for goes to a tiled shared-memory kernel instead.
 *   gemm_acc  gemm into an f32 C with A, B in dt: the same path, cuBLASLt with A, B bf16 and
 *             C, D f32 (compute 32F), or the tiled kernel instantiated for an f32 C.
 *   axpby     y = a x + b y              (b = 0 ignores y)
 *   bias_add  y[i, j] += bias[j]         bias_grad db[j] (+)= sum_i dy[i, j] (column sums by row
 *                                        chunks, chunks added in order: deterministic)
 *   act       one kernel per direction, the activation (tpk_act) a template parameter:
 *             GELU-tanh: y = x sigmoid(2 s (x + c x^3)),  dx = dy (sg + 2 x sg (1 - sg) s (1 + 3 c x^2));
 *             NONE: a copy
 * Arguments arrive checked by the front end (tpk/op.h); this backend reports only its own
 * failures (CUDA, cuBLASLt, the head-dim limit of the attention kernels).
 *   rng_2d    x[i, j] = a + b draw(seed, stream, (row0 + i) gcols + col0 + j)   (tpk/rng.h)
 *   adamw     m, v moments; w -= lr (m c1 / (sqrt(v c2) + eps) + wd w), c1, c2 as on the host
 *   sumsq     sum x^2 in double: per-block sums, then one block adds them in order, left on the device
 *   adamw's clipping: the factor from the norm's sum of squares on the device (no host wait) */
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <type_traits>

#include "common.cuh"

/* ---- state --------------------------------------------------------------------------------------- */

static tpk__cuda_state g_state;
static std::atomic<bool> g_ready;
static std::mutex g_mutex;
static std::atomic<bool> g_tf32;

tpk__cuda_state *tpk__cuda_get(tpk_ctx *ctx, const char *fn) {
    if (g_ready) return &g_state;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_ready) return &g_state;
    tpk__cuda_state s = {};
    cudaError_t e = cudaGetDevice(&s.device);
    int major = 0, minor = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s.device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, s.device);
    s.cc = 10 * major + minor;
    int optin = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, s.device);
    s.smem_optin = (size_t)optin;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        tpk__cuda_err(ctx, fn, "CUDA initialisation (cudaGetDevice, cudaDeviceGetAttribute, cudaStreamCreate)", e);
        return NULL;
    }
    cublasStatus_t b = cublasLtCreate(&s.lt);
    if (b != CUBLAS_STATUS_SUCCESS) {
        tpk__fail(ctx, TPK_ERR_BACKEND, fn, "cublasLtCreate: %s", cublasLtGetStatusString(b));
        cudaStreamDestroy(s.stream);
        return NULL;
    }
    s.lt_ws_bytes = (size_t)32 << 20;
    e = cudaMalloc(&s.lt_ws, s.lt_ws_bytes);
    if (e != cudaSuccess) {
        tpk__cuda_err(ctx, fn, "cudaMalloc of the cuBLASLt workspace", e);
        cublasLtDestroy(s.lt);
        cudaStreamDestroy(s.stream);
        return NULL;
    }
    g_state = s;
    g_ready = true;
    return &g_state;
}

tpk_status tpk__cuda_event_wait(tpk_ctx *ctx, const char *fn, cudaEvent_t ev) {
    if (!tpk__nccl_live()) { /* nothing that could hang: block */
        TPK__CUDA_TRY(ctx, fn, cudaEventSynchronize(ev));
        return TPK_OK;
    }
    for (int spins = 0;; spins++) {
        cudaError_t e = tpk__event_query(ev);
        if (e == cudaSuccess) return TPK_OK;
        if (e != cudaErrorNotReady) return tpk__cuda_err(ctx, fn, "cudaEventQuery", e);
        TPK_TRY(tpk__nccl_watch(ctx, fn));
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

static std::atomic<unsigned long long> g_syncs;
tpk_status tpk__cuda_wait(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st) {
    g_syncs++;
    if (!st->sync_ev) TPK__CUDA_TRY(ctx, fn, cudaEventCreateWithFlags(&st->sync_ev, cudaEventDisableTiming));
    TPK__CUDA_TRY(ctx, fn, cudaEventRecord(st->sync_ev, st->stream));
    return tpk__cuda_event_wait(ctx, fn, st->sync_ev);
}
extern "C" unsigned long long tpk_cuda_sync_count(void) { return g_syncs.load(); }

tpk_status tpk__cuda_scratch(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, size_t bytes, void **out) {
    if (st->scratch_bytes < bytes) {
        /* earlier kernels on the stream may still read the old buffer */
        TPK_TRY(tpk__cuda_wait(ctx, fn, st));
        if (st->scratch) cudaFree(st->scratch);
        st->scratch = NULL, st->scratch_bytes = 0;
        size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
        TPK__CUDA_TRY(ctx, fn, cudaMalloc(&st->scratch, want));
        st->scratch_bytes = want;
    }
    *out = st->scratch;
    return TPK_OK;
}

extern "C" int tpk_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}
extern "C" tpk_status tpk_cuda_set_device(tpk_ctx *ctx, int device) {
    TPK__CUDA_TRY(ctx, "tpk_cuda_set_device", cudaSetDevice(device));
    return TPK_OK;
}
extern "C" void *tpk_cuda_stream(void) {
    tpk__cuda_state *st = tpk__cuda_get(NULL, "tpk_cuda_stream");
    return st ? (void *)st->stream : NULL;
}
extern "C" void tpk_cuda_allow_tf32(bool allow) { g_tf32 = allow; }

extern "C" void *tpk_cuda_event_new(void) {
    cudaEvent_t e;
    return cudaEventCreate(&e) == cudaSuccess ? (void *)e : NULL;
}
extern "C" void tpk_cuda_event_record(void *ev) {
    tpk__cuda_state *st = tpk__cuda_get(NULL, "tpk_cuda_event_record");
    if (st && ev) cudaEventRecord((cudaEvent_t)ev, st->stream);
}
extern "C" float tpk_cuda_event_ms(void *start, void *end) {
    float ms = -1.0f;
    if (!start || !end || cudaEventSynchronize((cudaEvent_t)end) != cudaSuccess) return -1.0f;
    if (cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end) != cudaSuccess) return -1.0f;
    return ms;
}
extern "C" void tpk_cuda_event_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
extern "C" size_t tpk_cuda_l2_bytes(void) {
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess) return 0;
    return (size_t)l2;
}

/* ---- memory ----------------------------------------------------------------------------------------- */

static tpk_status cuda_alloc(tpk_ctx *ctx, size_t bytes, void **out) {
    static const char *fn = "cuda.alloc";
    *out = NULL;
    TPK__CUDA_STATE(st, ctx, fn);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "could not allocate %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
    }
    e = cudaMemsetAsync(p, 0, bytes ? bytes : 1, st->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return tpk__cuda_err(ctx, fn, "cudaMemsetAsync", e);
    }
    *out = p;
    return TPK_OK;
}

static void cuda_free(tpk_ctx *ctx, void *p) {
    (void)ctx;
    if (p) cudaFree(p); /* cudaFree waits for the device: no kernel still uses p */
}

static tpk_status cuda_memcpy(tpk_ctx *ctx, void *dst, const void *src, size_t bytes, tpk_copy_dir dir) {
    static const char *fn = "cuda.memcpy";
    if (!bytes || dst == src) return TPK_OK;
    if (dir == TPK_H2H) {
        memmove(dst, src, bytes);
        return TPK_OK;
    }
    TPK__CUDA_STATE(st, ctx, fn);
    if (dir == TPK_H2D && bytes <= TPK__CUDA_UPLOAD_MAX) { /* token ids, targets, host values: through a pinned slot, no wait */
        int k = st->up_next;
        st->up_next = (k + 1) % TPK__CUDA_UPLOAD_SLOTS;
        if (!st->up_done[k]) TPK__CUDA_TRY(ctx, fn, cudaEventCreateWithFlags(&st->up_done[k], cudaEventDisableTiming));
        TPK_TRY(tpk__cuda_event_wait(ctx, fn, st->up_done[k])); /* its last copy has been done (long ago, as a rule) */
        if (st->up_bytes[k] < bytes) {
            if (st->up[k]) cudaFreeHost(st->up[k]);
            st->up[k] = NULL, st->up_bytes[k] = 0;
            size_t want = bytes < 4096 ? 4096 : bytes;
            TPK__CUDA_TRY(ctx, fn, cudaHostAlloc(&st->up[k], want, cudaHostAllocDefault));
            st->up_bytes[k] = want;
        }
        memcpy(st->up[k], src, bytes); /* the caller may reuse src as soon as we return */
        TPK__CUDA_TRY(ctx, fn, cudaMemcpyAsync(dst, st->up[k], bytes, cudaMemcpyHostToDevice, st->stream));
        TPK__CUDA_TRY(ctx, fn, cudaEventRecord(st->up_done[k], st->stream));
        return TPK_OK;
    }
    cudaMemcpyKind k = dir == TPK_H2D ? cudaMemcpyHostToDevice : dir == TPK_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    TPK__CUDA_TRY(ctx, fn, cudaMemcpyAsync(dst, src, bytes, k, st->stream));
    /* the host side may be reused (large H2D) or read (D2H) as soon as we return */
    if (dir != TPK_D2D) TPK_TRY(tpk__cuda_wait(ctx, fn, st));
    return TPK_OK;
}

static tpk_status cuda_sync(tpk_ctx *ctx) {
    static const char *fn = "cuda.sync";
    TPK__CUDA_STATE(st, ctx, fn);
    return tpk__cuda_wait(ctx, fn, st);
}

/* ---- fill, copy2d, cast, axpby ---------------------------------------------------------------------- */

/* Thread j of the grid writes the 16-byte units j, j + stride, ... (VEC: x aligned), so a warp's
 * one store covers 512 contiguous bytes, whole 32-byte sectors — tpk__elementwise's 8 f32 a thread
 * are two stores 32 bytes apart, half sectors each, and a write-only stream of those ran at half the
 * copy bandwidth on an H100 (1.5 of 2.9 TB/s); then the elements past the last whole unit. */
template <class T, bool VEC> __global__ void fill_kernel(T *x, size_t n, float value) {
    constexpr int E = 16 / sizeof(T); /* elements per unit */
    alignas(16) T e[E];
    for (int k = 0; k < E; k++) tpk__stf(e, (size_t)k, value);
    size_t nu = VEC ? n / E : 0;
    uint4 u = *reinterpret_cast<const uint4 *>(e);
    TPK__GRID_STRIDE(j, nu) reinterpret_cast<uint4 *>(x)[j] = u;
    TPK__GRID_STRIDE(i, n - nu * E) x[nu * E + i] = e[0];
}
static tpk_status cuda_fill(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value) {
    static const char *fn = "cuda.fill";
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (value == 0.0f && !std::signbit(value)) { /* +0 is all-zero bits in f32 and bf16: the copy engine's memset */
        TPK__CUDA_TRY(ctx, fn, cudaMemsetAsync(x, 0, n * tpk_dtype_size(dt), st->stream));
        return TPK_OK;
    }
    bool vec = tpk__aligned16({x});
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tpk__by_vec(vec, [&](auto v) { fill_kernel<T, decltype(v)::value><<<tpk__grid_for(vec ? n / (16 / sizeof(T)) + 1 : n, 256), 256, 0, st->stream>>>((T *)x, n, value); });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* Rows are moved as bytes (cudaMemcpy2DAsync), so every dtype (i32 too) is copied exactly. */
static tpk_status cuda_copy2d(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows, int64_t cols,
                              tpk_dtype dt) {
    static const char *fn = "cuda.copy2d";
    bool any = rows > 0 && cols > 0;
    if (!any || dst == src) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t es = tpk_dtype_size(dt);
    TPK__CUDA_TRY(ctx, fn, cudaMemcpy2DAsync(dst, (size_t)ldd * es, src, (size_t)lds * es, (size_t)cols * es, (size_t)rows,
                                        cudaMemcpyDeviceToDevice, st->stream));
    return TPK_OK;
}

template <class D, class S, bool VEC> __global__ void cast_kernel(D *dst, const S *src, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float v[V];
        tpk__ldn<V>(src, i, v);
        tpk__stn<V>(dst, i, v);
    });
}
static tpk_status cuda_cast(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src, tpk_dtype src_dt, size_t n) {
    static const char *fn = "cuda.cast";
    if (n == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (dst_dt == src_dt) {
        if (dst != src) TPK__CUDA_TRY(ctx, fn, cudaMemcpyAsync(dst, src, n * tpk_dtype_size(dst_dt), cudaMemcpyDeviceToDevice, st->stream));
        return TPK_OK;
    }
    tpk__by_dtype(dst_dt, [&](auto dtag) {
        using D = decltype(dtag);
        tpk__by_dtype(src_dt, [&](auto stag) {
            using S = decltype(stag);
            bool vec = tpk__aligned16({dst, src});
            tpk__by_vec(vec, [&](auto v) {
                cast_kernel<D, S, decltype(v)::value><<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>((D *)dst, (const S *)src, n);
            });
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* y is read (b != 0) before it is written by the same thread */
template <class T, bool VEC> __global__ void axpby_kernel(T *y, float a, const T *x, float b, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float xv[V], yv[V];
        tpk__ldn<V>(x, i, xv);
        if (b != 0.0f) tpk__ldn<V>(y, i, yv);
        for (int k = 0; k < V; k++) xv[k] = b == 0.0f ? a * xv[k] : a * xv[k] + b * yv[k];
        tpk__stn<V>(y, i, xv);
    });
}
static tpk_status cuda_axpby(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt, size_t n) {
    static const char *fn = "cuda.axpby";
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        bool vec = tpk__aligned16({y, x});
        tpk__by_vec(vec, [&](auto v) {
            axpby_kernel<T, decltype(v)::value><<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>((T *)y, a, (const T *)x, b, n);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- gemm ---------------------------------------------------------------------------------------------- */

/* C = beta C over [m, n] with leading dimension ldc; beta = 0 writes zeros whatever C held. */
template <class T> __global__ void scale2d_kernel(T *c, int64_t ldc, int64_t m, int64_t n, float beta) {
    size_t total = (size_t)m * (size_t)n;
    TPK__GRID_STRIDE(t, total) {
        size_t at = (t / (size_t)n) * (size_t)ldc + t % (size_t)n;
        tpk__stf(c, at, beta == 0.0f ? 0.0f : beta * tpk__ldf(c, at));
    }
}

/* Largest power of two (<= 256) dividing the address: cuBLASLt picks kernels by alignment. */
static inline uint32_t ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u % a)) a >>= 1;
    return a;
}

/* epilogues of the fused linear forward (linear_fwd): none, + bias, gelu keeping the
 * pre-activation (aux) with or without bias; of the fused backward (linear_bwd_act): the gelu
 * gradient from that aux, with or without the bias gradient (the column sums of the result) */
enum { EPI_NONE = 0, EPI_BIAS, EPI_GELU_AUX, EPI_GELU_AUX_BIAS, EPI_DGELU, EPI_DGELU_BGRAD };
struct gemm_key {
    int ta, tb, dt, cdt, tf32; /* dt: A's and B's type, cdt: C's and D's */
    int64_t m, n, k, lda, ldb, ldc;
    uint32_t aa, ab, ac;
    int epi;
    uint32_t abias, aaux; /* the epilogue's vectors' alignment: the heuristic chose for pointers of it */
    bool operator==(const gemm_key &o) const {
        return ta == o.ta && tb == o.tb && dt == o.dt && cdt == o.cdt && tf32 == o.tf32 && m == o.m && n == o.n && k == o.k && lda == o.lda &&
               ldb == o.ldb && ldc == o.ldc && aa == o.aa && ab == o.ab && ac == o.ac && epi == o.epi && abias == o.abias && aaux == o.aaux;
    }
};
/* whether an epilogue reads or writes the bias vector / the aux matrix */
static inline bool epi_bias(int epi) { return epi == EPI_BIAS || epi == EPI_GELU_AUX_BIAS || epi == EPI_DGELU_BGRAD; }
static inline bool epi_aux(int epi) { return epi != EPI_NONE && epi != EPI_BIAS; }
struct gemm_plan {
    gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* la: B's storage (first operand), lb: A's storage */
    cublasLtMatmulAlgo_t algo;
    bool used;
};
enum { GEMM_CACHE = 64 };
static gemm_plan g_plans[GEMM_CACHE];
static int g_plan_next;
static std::mutex g_plan_mutex;

static void plan_release(gemm_plan *p) {
    if (!p->used) return;
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    p->used = false;
}

/* The cached plan of a shape, created (descriptors + heuristic) on first use; TPK_ERR_BACKEND
 * (no message) when cuBLASLt has no algorithm for it. The epilogue's bias and aux pointers are set
 * before the heuristic runs (it reads their alignment), and their alignment is part of the key. */
static tpk_status gemm_plan_get(tpk__cuda_state *st, const gemm_key &key, const void *bias, const void *aux, gemm_plan **out) {
    for (int i = 0; i < GEMM_CACHE; i++)
        if (g_plans[i].used && g_plans[i].key == key) {
            *out = &g_plans[i];
            return TPK_OK;
        }
    gemm_plan *p = &g_plans[g_plan_next];
    g_plan_next = (g_plan_next + 1) % GEMM_CACHE;
    plan_release(p);
    p->key = key;
    cudaDataType_t ty = key.dt == TPK_F32 ? CUDA_R_32F : CUDA_R_16BF, tc = key.cdt == TPK_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasComputeType_t ct = key.dt == TPK_F32 && key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    /* column-major view: first operand = B's storage [tb ? k : n, tb ? n : k] ld ldb with op tb,
     * second = A's storage [ta ? m : k, ta ? k : m] ld lda with op ta, result [n, m] ld ldc */
    cublasOperation_t opa = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F);
    bool made_op = s == CUBLAS_STATUS_SUCCESS, made_a = false, made_b = false, made_c = false;
    if (made_op) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (s == CUBLAS_STATUS_SUCCESS && key.epi != EPI_NONE) {
        /* the result is column-major [n, m]: its rows are our output features, so the bias
         * (one value per row of D) is per feature; the aux (pre-activation) has D's shape */
        cublasLtEpilogue_t e = key.epi == EPI_BIAS        ? CUBLASLT_EPILOGUE_BIAS
                               : key.epi == EPI_GELU_AUX  ? CUBLASLT_EPILOGUE_GELU_AUX
                               : key.epi == EPI_DGELU     ? CUBLASLT_EPILOGUE_DGELU
                               : key.epi == EPI_DGELU_BGRAD ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                                          : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
        if (s == CUBLAS_STATUS_SUCCESS && epi_aux(key.epi)) {
            int64_t ld = key.ldc;
            s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
            if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        }
        if (s == CUBLAS_STATUS_SUCCESS && epi_bias(key.epi))
            s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    if (s == CUBLAS_STATUS_SUCCESS)
        made_a = (s = cublasLtMatrixLayoutCreate(&p->la, ty, key.tb ? key.k : key.n, key.tb ? key.n : key.k, key.ldb)) ==
                 CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS)
        made_b = (s = cublasLtMatrixLayoutCreate(&p->lb, ty, key.ta ? key.m : key.k, key.ta ? key.k : key.m, key.lda)) ==
                 CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS) made_c = (s = cublasLtMatrixLayoutCreate(&p->lc, tc, key.n, key.m, key.ldc)) == CUBLAS_STATUS_SUCCESS;
    int found = 0;
    cublasLtMatmulHeuristicResult_t res = {};
    if (s == CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulPreference_t pref;
        s = cublasLtMatmulPreferenceCreate(&pref);
        if (s == CUBLAS_STATUS_SUCCESS) {
            uint64_t ws = st->lt_ws_bytes;
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
            /* A and B in cuBLASLt's order are our B and A */
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.ab, sizeof key.ab);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.aa, sizeof key.aa);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.ac, sizeof key.ac);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.ac, sizeof key.ac);
            s = cublasLtMatmulAlgoGetHeuristic(st->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
            cublasLtMatmulPreferenceDestroy(pref);
        }
    }
    if (s != CUBLAS_STATUS_SUCCESS || found < 1) {
        if (made_op) cublasLtMatmulDescDestroy(p->op);
        if (made_a) cublasLtMatrixLayoutDestroy(p->la);
        if (made_b) cublasLtMatrixLayoutDestroy(p->lb);
        if (made_c) cublasLtMatrixLayoutDestroy(p->lc);
        return TPK_ERR_BACKEND; /* no algorithm: the caller falls back, without an error */
    }
    p->algo = res.algo;
    p->used = true;
    *out = p;
    return TPK_OK;
}

/* The fallback when cuBLASLt has no algorithm for a layout (unusual strides or alignment):
 * C = alpha op(A) op(B) + beta C in 16 x 16 tiles through shared memory, f32 accumulation;
 * beta = 0 does not read C. A, B of type T, C of type TC (T, or float: gemm_acc). */
enum { FB_TILE = 16 };
template <class T, class TC>
__global__ void gemm_fallback_kernel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const T *a, int64_t lda, const T *b,
                                     int64_t ldb, float beta, TC *c, int64_t ldc) {
    __shared__ float As[FB_TILE][FB_TILE + 1], Bs[FB_TILE][FB_TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t row = (int64_t)blockIdx.y * FB_TILE + ty, col = (int64_t)blockIdx.x * FB_TILE + tx;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += FB_TILE) {
        int64_t ar = (int64_t)blockIdx.y * FB_TILE + ty, ak = k0 + tx; /* op(A)[ar, ak] */
        As[ty][tx] = ar < m && ak < k ? tpk__ldf(a, (size_t)(ta ? ak * lda + ar : ar * lda + ak)) : 0.0f;
        int64_t bk = k0 + ty, bc = (int64_t)blockIdx.x * FB_TILE + tx; /* op(B)[bk, bc] */
        Bs[ty][tx] = bk < k && bc < n ? tpk__ldf(b, (size_t)(tb ? bc * ldb + bk : bk * ldb + bc)) : 0.0f;
        __syncthreads();
        for (int q = 0; q < FB_TILE; q++) acc += As[ty][q] * Bs[q][tx];
        __syncthreads();
    }
    if (row < m && col < n) {
        size_t at = (size_t)(row * ldc + col);
        tpk__stf(c, at, beta == 0.0f ? alpha * acc : alpha * acc + beta * tpk__ldf(c, at));
    }
}
static tpk_status gemm_fallback(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc,
                                tpk_dtype dt, tpk_dtype cdt) {
    if ((m + FB_TILE - 1) / FB_TILE > 65535)
        return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "cuBLASLt has no algorithm and m = %lld is too large for the fallback", (long long)m);
    dim3 grid((unsigned)((n + FB_TILE - 1) / FB_TILE), (unsigned)((m + FB_TILE - 1) / FB_TILE)), block(FB_TILE, FB_TILE);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        auto launch = [&](auto ctag) { /* C of type T, or f32 */
            using TC = decltype(ctag);
            gemm_fallback_kernel<T, TC><<<grid, block, 0, st->stream>>>(ta, tb, m, n, k, alpha, (const T *)a, lda, (const T *)b, ldb, beta,
                                                                        (TC *)c, ldc);
        };
        if (cdt == TPK_F32) launch(float{});
        else launch(T{});
    });
    return tpk__cuda_launched(ctx, fn);
}

/* C = alpha op(A) op(B) + beta C, A and B in dt, C in cdt (dt, or f32: gemm_acc), through cuBLASLt
 * (the tiled kernel where it has no algorithm). With an epilogue (epi != EPI_NONE, linear_fwd
 * only): bias and aux pointers set per call; TPK_ERR_UNSUPPORTED without a message when cuBLASLt
 * has no fused algorithm (the caller composes the pieces instead). */
static tpk_status gemm_run(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc,
                           tpk_dtype dt, tpk_dtype cdt, int epi = EPI_NONE, const void *bias = NULL, void *aux = NULL) {
    gemm_key key = {ta, tb, (int)dt, (int)cdt, dt == TPK_F32 && g_tf32, m, n, k, lda, ldb, ldc, ptr_align(a), ptr_align(b), ptr_align(c), epi,
                    epi_bias(epi) ? ptr_align(bias) : 0, epi_aux(epi) ? ptr_align(aux) : 0};
    /* an epilogue's vectors at less than 16 bytes: cuBLASLt's epilogue kernels load them 16 bytes at
     * a time (a parameter's bias at an unaligned offset) — the caller composes instead */
    if ((epi_bias(epi) && key.abias < 16) || (epi_aux(epi) && key.aaux < 16)) return TPK_ERR_UNSUPPORTED;
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    gemm_plan *p = NULL;
    if (gemm_plan_get(st, key, bias, aux, &p) != TPK_OK) { /* no cuBLASLt algorithm */
        if (epi != EPI_NONE) return TPK_ERR_UNSUPPORTED;
        return gemm_fallback(ctx, fn, st, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, cdt); /* the tiled kernel */
    }
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (epi_bias(epi)) /* DGELU_BGRAD writes the bias gradient there */
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (s == CUBLAS_STATUS_SUCCESS && epi_aux(epi))
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(st->lt, p->op, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc, &p->algo, st->lt_ws, st->lt_ws_bytes, st->stream);
    if (s != CUBLAS_STATUS_SUCCESS) return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "cublasLtMatmul: %s", cublasLtGetStatusString(s));
    return TPK_OK;
}

/* gemm (cdt = dt) and gemm_acc (cdt = f32): one path */
static tpk_status gemm_any(tpk_ctx *ctx, const char *fn, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                           int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt, tpk_dtype cdt) {
    if (m == 0 || n == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (k == 0 || alpha == 0.0f) { /* no product: C = beta C (and no reads of A, B) */
        if (beta == 1.0f) return TPK_OK;
        size_t total = (size_t)m * (size_t)n;
        tpk__by_dtype(cdt, [&](auto tag) {
            using T = decltype(tag);
            scale2d_kernel<T><<<tpk__grid_for(total, 256), 256, 0, st->stream>>>((T *)c, ldc, m, n, beta);
        });
        return tpk__cuda_launched(ctx, fn);
    }
    return gemm_run(ctx, fn, st, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, cdt);
}
static tpk_status cuda_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt) {
    return gemm_any(ctx, "cuda.gemm", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, dt);
}
static tpk_status cuda_gemm_acc(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                                const void *b, int64_t ldb, float beta, float *c, int64_t ldc, tpk_dtype dt) {
    return gemm_any(ctx, "cuda.gemm_acc", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, TPK_F32);
}

extern "C" tpk_status tpk_cuda_plain_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                                          const void *b, void *c, tpk_dtype dt) {
    static const char *fn = "tpk_cuda_plain_gemm";
    TPK__CUDA_STATE(st, ctx, fn);
    return gemm_run(ctx, fn, st, ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n, dt, dt);
}

/* ---- bias --------------------------------------------------------------------------------------------- */

/* vectors (VEC) only when cols is a multiple of 8: the 8 elements of a vector share a row */
template <class T, bool VEC> __global__ void bias_add_kernel(T *y, const T *bias, int64_t rows, int64_t cols) {
    tpk__elementwise<VEC>((size_t)rows * (size_t)cols, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float yv[V], bv[V];
        tpk__ldn<V>(y, i, yv);
        tpk__ldn<V>(bias, i % (size_t)cols, bv);
        for (int k = 0; k < V; k++) yv[k] += bv[k];
        tpk__stn<V>(y, i, yv);
    });
}
static tpk_status cuda_bias_add(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols, tpk_dtype dt) {
    static const char *fn = "cuda.bias_add";
    if (rows == 0 || cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t total = (size_t)rows * (size_t)cols;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        bool vec = cols % TPK__VEC == 0 && tpk__aligned16({y, bias});
        tpk__by_vec(vec, [&](auto v) {
            bias_add_kernel<T, decltype(v)::value><<<tpk__grid_elementwise(total, vec), 256, 0, st->stream>>>((T *)y, (const T *)bias, rows, cols);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* element (i, j) of dy, for the column sums */
template <class T> struct dy_elem {
    const T *dy;
    int64_t cols;
    __device__ void operator()(int64_t i, int64_t j, float *v) const { v[0] = tpk__ldf(dy, (size_t)(i * cols + j)); }
};
/* out[j] = sum_c part[c][j] (+ out[j]) in chunk order */
template <class T> __global__ void colsum_final_kernel(T *out, const float *part, int64_t chunks, int64_t cols, bool accumulate) {
    TPK__GRID_STRIDE(j, (size_t)cols) {
        float s = accumulate ? tpk__ldf(out, j) : 0.0f;
        for (int64_t c = 0; c < chunks; c++) s += part[(size_t)c * (size_t)cols + j];
        tpk__stf(out, j, s);
    }
}
static tpk_status cuda_bias_grad(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols, tpk_dtype dt, tpk_dtype db_dt,
                                 bool accumulate) {
    static const char *fn = "cuda.bias_grad";
    if (cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    int64_t chunks = (rows + TPK__COLSUM_ROWS - 1) / TPK__COLSUM_ROWS;
    float *part = NULL;
    if (chunks) TPK_TRY(tpk__cuda_scratch(ctx, fn, st, sizeof(float) * (size_t)(chunks * cols), (void **)&part));
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if (chunks) {
            dim3 grid((unsigned)((cols + 31) / 32), tpk__colsum_grid_y(chunks)), block(32, 8);
            tpk__colsum_partial_kernel<1><<<grid, block, 0, st->stream>>>(dy_elem<T>{(const T *)dy, cols}, rows, cols, part);
        }
        if (db_dt == TPK_F32) colsum_final_kernel<float><<<tpk__grid_for((size_t)cols, 256), 256, 0, st->stream>>>((float *)db, part, chunks, cols, accumulate);
        else colsum_final_kernel<T><<<tpk__grid_for((size_t)cols, 256), 256, 0, st->stream>>>((T *)db, part, chunks, cols, accumulate);
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- activations (tpk_act): one kernel per direction, the activation a template parameter --------- */

#define GELU_S 0.7978845608028654f
#define GELU_C 0.044715f
__device__ __forceinline__ float gelu_sig(float v) { return 1.0f / (1.0f + expf(-2.0f * GELU_S * (v + GELU_C * v * v * v))); }

/* act(v) and act'(v); GELU-tanh: 1 - t^2 = 4 sg (1 - sg) */
template <tpk_act A> __device__ __forceinline__ float act_value(float v) {
    if constexpr (A == TPK_ACT_GELU_TANH) return v * gelu_sig(v);
    else return v;
}
template <tpk_act A> __device__ __forceinline__ float act_slope(float v) {
    if constexpr (A == TPK_ACT_GELU_TANH) {
        float sg = gelu_sig(v);
        return sg + 2.0f * v * sg * (1.0f - sg) * GELU_S * (1.0f + 3.0f * GELU_C * v * v);
    } else {
        return 1.0f;
    }
}
template <tpk_act A, class T, bool VEC> __global__ void act_fwd_kernel(T *y, const T *x, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float v[V];
        tpk__ldn<V>(x, i, v);
        for (int k = 0; k < V; k++) v[k] = act_value<A>(v[k]);
        tpk__stn<V>(y, i, v);
    });
}
/* dy[i] is read before dx[i] is written by the same thread, so dx may alias dy. */
template <tpk_act A, class T, bool VEC> __global__ void act_bwd_kernel(T *dx, const T *x, const T *dy, size_t n) {
    tpk__elementwise<VEC>(n, [&](size_t i, auto vn) {
        constexpr int V = decltype(vn)::value;
        float v[V], g[V];
        tpk__ldn<V>(x, i, v);
        tpk__ldn<V>(dy, i, g);
        for (int k = 0; k < V; k++) g[k] *= act_slope<A>(v[k]);
        tpk__stn<V>(dx, i, g);
    });
}
/* Call f(std::integral_constant<tpk_act, A>{}) for an activation other than NONE (checked by the front end). */
template <class F> static inline void by_act(tpk_act act, F f) {
    switch (act) {
    case TPK_ACT_GELU_TANH: f(std::integral_constant<tpk_act, TPK_ACT_GELU_TANH>{}); break;
    default: break;
    }
}
/* act = NONE is a copy (nothing when in place) */
static tpk_status cuda_act_fwd(tpk_ctx *ctx, tpk_act act, void *y, const void *x, tpk_dtype dt, size_t n) {
    static const char *fn = "cuda.act_fwd";
    TPK__CUDA_STATE(st, ctx, fn);
    if (act == TPK_ACT_NONE) {
        if (y != x) TPK__CUDA_TRY(ctx, fn, cudaMemcpyAsync(y, x, n * tpk_dtype_size(dt), cudaMemcpyDeviceToDevice, st->stream));
        return TPK_OK;
    }
    bool vec = tpk__aligned16({y, x});
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        by_act(act, [&](auto a) {
            tpk__by_vec(vec, [&](auto v) {
                act_fwd_kernel<decltype(a)::value, T, decltype(v)::value><<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>((T *)y, (const T *)x, n);
            });
        });
    });
    return tpk__cuda_launched(ctx, fn);
}
/* act = NONE: dx = dy */
static tpk_status cuda_act_bwd(tpk_ctx *ctx, tpk_act act, void *dx, const void *x, const void *dy, tpk_dtype dt, size_t n) {
    static const char *fn = "cuda.act_bwd";
    TPK__CUDA_STATE(st, ctx, fn);
    if (act == TPK_ACT_NONE) {
        if (dx != dy) TPK__CUDA_TRY(ctx, fn, cudaMemcpyAsync(dx, dy, n * tpk_dtype_size(dt), cudaMemcpyDeviceToDevice, st->stream));
        return TPK_OK;
    }
    bool vec = tpk__aligned16({dx, x, dy});
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        by_act(act, [&](auto a) {
            tpk__by_vec(vec, [&](auto v) {
                act_bwd_kernel<decltype(a)::value, T, decltype(v)::value><<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>(
                    (T *)dx, (const T *)x, (const T *)dy, n);
            });
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- optimizer ------------------------------------------------------------------------------------------ */

/* the decay of elements i0 .. i0 + V - 1 (sorted runs [decay[2r], decay[2r+1]); NULL: all): one
 * binary search for i0, then a step along the runs per element */
template <int V>
static __device__ __forceinline__ void adamw_decayed(const int64_t *decay, int64_t nruns, int64_t i0, bool *d) {
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
static __global__ void adamw_kernel(float *w, const float *g, float *m, float *v, tpk__bf16 *w16, size_t n, float lr, float b1, float b2,
                                    float eps, float wd, float c1, float c2, float grad_scale, double *norm, float clip, const int64_t *decay,
                                    int64_t nruns) {
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
static tpk_status cuda_adamw(tpk_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                             float eps, float wd, int64_t step, float grad_scale, double *norm, float clip, const int64_t *decay, int64_t nruns,
                             uint16_t *w16) {
    static const char *fn = "cuda.adamw";
    if (!n) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    /* the bias corrections exactly as the host computes them */
    float c1 = 1.0f / (1.0f - powf(b1, (float)step)), c2 = 1.0f / (1.0f - powf(b2, (float)step));
    bool vec = tpk__aligned16({w, g, m, v, w16});
    auto launch = [&](auto vc, auto has16) {
        adamw_kernel<decltype(vc)::value, decltype(has16)::value><<<tpk__grid_for(vec ? n / TPK__VEC + 1 : n, 256), 256, 0, st->stream>>>(
            w, g, m, v, (tpk__bf16 *)w16, n, lr, b1, b2, eps, wd, c1, c2, grad_scale, norm, clip, decay, nruns);
    };
    if (vec) w16 ? launch(std::true_type{}, std::true_type{}) : launch(std::true_type{}, std::false_type{});
    else w16 ? launch(std::false_type{}, std::true_type{}) : launch(std::false_type{}, std::false_type{});
    return tpk__cuda_launched(ctx, fn);
}

/* The sum of squares in double, left in device memory: per-block sums (8 elements a step in
 * 16-byte loads where x is aligned; a fixed tree), then one warp adds them in a fixed order onto
 * *out (accumulate) or 0 — deterministic, no host wait. */
enum { SUMSQ_BLOCKS = 1024 };
template <bool VEC> static __global__ void sumsq_partial_kernel(double *part, const float *x, size_t n) {
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
static __global__ void sumsq_final_kernel(double *out, const double *part, int nparts, bool accumulate) {
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
    if (blocks && tpk__aligned16({x})) sumsq_partial_kernel<true><<<blocks, 256, 0, st->stream>>>(part, x, n);
    else if (blocks) sumsq_partial_kernel<false><<<blocks, 256, 0, st->stream>>>(part, x, n);
    sumsq_final_kernel<<<1, 32, 0, st->stream>>>(out, part, (int)blocks, accumulate);
    return tpk__cuda_launched(ctx, fn);
}

/* ---- counter-based random numbers ----------------------------------------------------------------------- */

template <class T>
__global__ void rng_kernel(T *x, int64_t rows, int64_t cols, int64_t gcols, int64_t row0, int64_t col0, uint64_t seed, uint64_t stream,
                           int normal, float a, float b) {
    size_t total = (size_t)rows * (size_t)cols;
    TPK__GRID_STRIDE(t, total) {
        int64_t i = (int64_t)(t / (size_t)cols), j = (int64_t)(t % (size_t)cols);
        uint64_t index = (uint64_t)(row0 + i) * (uint64_t)gcols + (uint64_t)(col0 + j);
        float draw = normal ? tpk_rng_normal(seed, stream, index) : tpk_rng_uniform(seed, stream, index);
        tpk__stf(x, t, a + b * draw);
    }
}
static tpk_status cuda_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols, int64_t gcols, int64_t row0,
                              int64_t col0, uint64_t seed, uint64_t stream, tpk_rng_dist dist, float a, float b) {
    static const char *fn = "cuda.rng_2d";
    if (rows == 0 || cols == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    size_t total = (size_t)rows * (size_t)cols;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        rng_kernel<T><<<tpk__grid_for(total, 256), 256, 0, st->stream>>>((T *)x, rows, cols, gcols, row0, col0, seed, stream,
                                                                    dist == TPK_RNG_NORMAL, a, b);
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- fused linear forward ---------------------------------------------------------------------------------- */

/* u = x W^T + bias, y = u or (pre = u, y = act(u)): one cuBLASLt call with the BIAS / GELU_AUX(_BIAS)
 * epilogue; where cuBLASLt has no fused algorithm (or the activation has no epilogue), the front
 * end's composition (tpk__compose_linear_fwd, tpk/op.h: gemm + bias_add + act_fwd through this
 * table; the same result). */
static tpk_status cuda_linear_fwd(tpk_ctx *ctx, void *y, void *pre, const void *x, const void *w, const void *bias, int64_t T, int64_t n,
                                  int64_t k, tpk_act act, tpk_dtype dt) {
    static const char *fn = "cuda.linear_fwd";
    TPK__CUDA_STATE(st, ctx, fn);
    bool gelu = act == TPK_ACT_GELU_TANH;
    int epi = gelu ? (bias ? EPI_GELU_AUX_BIAS : EPI_GELU_AUX) : act == TPK_ACT_NONE && bias ? EPI_BIAS : EPI_NONE;
    if (k > 0 && epi != EPI_NONE) {
        tpk_status s = gemm_run(ctx, fn, st, false, true, T, n, k, 1.0f, x, k, w, k, 0.0f, y, n, dt, dt, epi, bias, pre);
        if (s != TPK_ERR_UNSUPPORTED) return s;
    }
    return tpk__compose_linear_fwd(ctx, y, pre, x, w, bias, T, n, k, act, dt);
}

/* du = (dy W) act'(pre), db = colsum(du): one cuBLASLt call with the DGELU(_BGRAD) epilogue, which
 * reads the pre-activation the forward's GELU_AUX epilogue kept (aux, D's shape: [T, n] row-major
 * is cuBLASLt's column-major [n, T]; the bias gradient, one value per row of D, is per feature);
 * where cuBLASLt has no fused algorithm (or the activation has no epilogue), the front end's
 * composition (tpk__compose_linear_bwd_act: gemm + act_bwd + bias_grad; the same result). */
static tpk_status cuda_linear_bwd_act(tpk_ctx *ctx, void *du, void *db, const void *dy, const void *w, const void *pre, int64_t T, int64_t n,
                                      int64_t k, tpk_act act, tpk_dtype dt) {
    static const char *fn = "cuda.linear_bwd_act";
    TPK__CUDA_STATE(st, ctx, fn);
    if (k > 0 && act == TPK_ACT_GELU_TANH) {
        tpk_status s = gemm_run(ctx, fn, st, false, false, T, n, k, 1.0f, dy, k, w, n, 0.0f, du, n, dt, dt, db ? EPI_DGELU_BGRAD : EPI_DGELU, db,
                                const_cast<void *>(pre));
        if (s != TPK_ERR_UNSUPPORTED) return s;
    }
    return tpk__compose_linear_bwd_act(ctx, du, db, dy, w, pre, T, n, k, act, dt);
}

/* ---- the table ---------------------------------------------------------------------------------------------- */

/* Made once (a function-local static): this file's entries, then ops_cuda_layers.cu's. */
/* ---- the profiler's timer: CUDA events recorded on the stream (tpk/profile.h) ---------------------- */

static tpk_status cuda_timer_mark(tpk_ctx *ctx, int slot) {
    static const char *fn = "cuda.timer_mark";
    TPK__CUDA_STATE(st, ctx, fn);
    if (slot < 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "slot: expected >= 0, got %d", slot);
    if (slot >= st->nev) {
        int n = st->nev ? st->nev : 256;
        while (n <= slot) n *= 2;
        cudaEvent_t *e = (cudaEvent_t *)realloc(st->ev, sizeof *e * (size_t)n);
        if (!e) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d timer events", n);
        st->ev = e;
        for (; st->nev < n; st->nev++) TPK__CUDA_TRY(ctx, fn, cudaEventCreate(&st->ev[st->nev]));
    }
    TPK__CUDA_TRY(ctx, fn, cudaEventRecord(st->ev[slot], st->stream));
    return TPK_OK;
}
static tpk_status cuda_timer_ms(tpk_ctx *ctx, int a, int b, float *ms) {
    static const char *fn = "cuda.timer_ms";
    TPK__CUDA_STATE(st, ctx, fn);
    if (a < 0 || b < 0 || a >= st->nev || b >= st->nev)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "marks %d, %d: expected recorded marks 0..%d", a, b, st->nev - 1);
    TPK__CUDA_TRY(ctx, fn, cudaEventSynchronize(st->ev[b]));
    TPK__CUDA_TRY(ctx, fn, cudaEventElapsedTime(ms, st->ev[a], st->ev[b]));
    return TPK_OK;
}

static tpk_ops cuda_table_make() {
    tpk_ops o = {};
    o.name = "cuda", o.self = &g_state, o.device = true;
#define TPK__CUDA_ENTRY(e) o.e = cuda_##e;
    TPK__OPS_CORE(TPK__CUDA_ENTRY) /* o.alloc = cuda_alloc, ... */
#undef TPK__CUDA_ENTRY
    o.linear_fwd = cuda_linear_fwd, o.linear_bwd_act = cuda_linear_bwd_act; /* fusions (TPK__OPS_FUSED) */
    o.timer_mark = cuda_timer_mark, o.timer_ms = cuda_timer_ms;
    tpk__cuda_layer_ops(&o);
    return o;
}
extern "C" const tpk_ops *tpk_ops_cuda(void) {
    static const tpk_ops ops = cuda_table_make();
    return &ops;
}
