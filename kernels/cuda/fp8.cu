/* kernels/cuda/fp8.cu — the CUDA backend's FP8 ops (the FP8 linears, tpk/layers/fp8.h).
 *
 *   fp8_quant    q[i] = fp8(x[i] s) by tpk_f32_to_fp8 (tpk/base/ops.h: the host's definition, so
 *                both backends give the same codes) and amax = max(accumulate ? amax : 0,
 *                max_i |x[i]|) in the same pass: each block's maximum by warp shuffles and shared
 *                memory, then one atomicMax on the float's bits (non-negative floats order as
 *                their bits do as ints; a NaN ignored as fmaxf ignores it, an infinity kept).
 *                8 elements a thread (16-byte loads, an 8-byte store of codes) where aligned.
 *   fp8_dequant  y[i] = f32(q[i]) s_inv (exact decode, one rounding to y's dtype).
 *   gemm_fp8     C = alpha op(A) op(B) + beta C on codes, f32 sums (the FP8 MMA's accumulator
 *                keeps about 14 mantissa bits: ~1e-4 relative from the host's sums, measured on
 *                an H100 at k = 80; tests/gpu/ops.c's TOL_FP8_ACC). On sm_89 and later through
 *                cuBLASLt's FP8 matmul (A, B CUDA_R_8F_E4M3 / _E5M2, C and D bf16 or f32, compute
 *                32F; alpha the dequantising 1 / (s_a s_b), so no scale pointers). cuBLASLt's FP8
 *                kernels take only the TN layout (in row-major terms C = A B^T: ta false, tb
 *                true) with m, n, k multiples of 16 and 16-byte aligned operands: an operand in
 *                the other orientation (the linear's dgrad B = W, its wgrad A = dy^T, B = x) is
 *                transposed into scratch first (a tiled copy of the codes), as TransformerEngine
 *                keeps transposed copies. Elsewhere (before sm_89, other sizes, both operands
 *                E5M2, no cuBLASLt algorithm): the codes decoded into bf16 — exact, every FP8
 *                value is a bf16 — and the backend's bf16 GEMM (gemm for a bf16 C, gemm_acc for
 *                an f32 C): f32 sums either way. */
#include "common.cuh"

#include <mutex>

/* ---- fp8_quant, fp8_dequant ------------------------------------------------------------------ */

template <bool VEC, class T>
__global__ void fp8_quant_kernel(uint8_t *q, float *amax, const T *x, size_t n, float s,
                                 tpk_fp8_fmt fmt) {
    __shared__ float sh[32];
    float m = 0.0f;
    tpk__elementwise<VEC>(n, [&](size_t i, auto vw) {
        constexpr int V = decltype(vw)::value;
        float v[V];
        tpk__ldn<V>(x, i, v);
        uint8_t c[V];
        for (int k = 0; k < V; k++) {
            m = fmaxf(m, fabsf(v[k]));
            c[k] = tpk_f32_to_fp8(v[k] * s, fmt);
        }
        if (!q) return;
        if constexpr (V == 8) {
            uint2 u;
            memcpy(&u, c, 8);
            *reinterpret_cast<uint2 *>(q + i) = u;
        } else {
            for (int k = 0; k < V; k++) q[i + (size_t)k] = c[k];
        }
    });
    if (!amax) return; /* uniform over the grid */
    m = tpk__block_max(m, sh);
    if (threadIdx.x == 0 && m > 0.0f) atomicMax(reinterpret_cast<int *>(amax), __float_as_int(m));
}
static tpk_status cuda_fp8_quant(tpk_ctx *ctx, uint8_t *q, float *amax, const void *x,
                                 tpk_dtype dt, size_t n, float scale, tpk_fp8_fmt fmt,
                                 bool accumulate) {
    static const char *fn = "cuda.fp8_quant";
    TPK__CUDA_STATE(st, ctx, fn);
    if (amax && !accumulate) TPK__CUDA_TRY(ctx, fn, cudaMemsetAsync(amax, 0, 4, st->stream));
    if (n == 0) return TPK_OK;
    bool vec = tpk__aligned16({x}) && (uintptr_t)q % 8 == 0;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        tpk__by_vec(vec, [&](auto v) {
            fp8_quant_kernel<decltype(v)::value, T>
                <<<tpk__grid_elementwise(n, vec), 256, 0, st->stream>>>(q, amax, (const T *)x, n,
                                                                        scale, fmt);
        });
    });
    return tpk__cuda_launched(ctx, fn);
}

template <class T>
__global__ void fp8_dequant_kernel(T *y, const uint8_t *q, size_t n, float s, tpk_fp8_fmt fmt) {
    TPK__GRID_STRIDE(i, n) tpk__stf(y, i, tpk_fp8_to_f32(q[i], fmt) * s);
}
static tpk_status cuda_fp8_dequant(tpk_ctx *ctx, void *y, tpk_dtype dt, const uint8_t *q,
                                   size_t n, float scale_inv, tpk_fp8_fmt fmt) {
    static const char *fn = "cuda.fp8_dequant";
    TPK__CUDA_STATE(st, ctx, fn);
    if (n == 0) return TPK_OK;
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        fp8_dequant_kernel<T>
            <<<tpk__grid_for(n, 256), 256, 0, st->stream>>>((T *)y, q, n, scale_inv, fmt);
    });
    return tpk__cuda_launched(ctx, fn);
}

/* ---- gemm_fp8 -------------------------------------------------------------------------------- */

/* out[c, r] (ld rows) = in[r, c] (ld ldi) over [rows, cols] of codes: 32 x 32 tiles through
 * shared memory, 32 x 8 threads, each 4 elements */
enum { TR_TILE = 32 };
__global__ void fp8_transpose_kernel(uint8_t *out, const uint8_t *in, int64_t rows, int64_t cols,
                                     int64_t ldi) {
    __shared__ uint8_t t[TR_TILE][TR_TILE + 1];
    int64_t r0 = (int64_t)blockIdx.y * TR_TILE, c0 = (int64_t)blockIdx.x * TR_TILE;
    for (int j = threadIdx.y; j < TR_TILE; j += 8) {
        int64_t r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) t[j][threadIdx.x] = in[r * ldi + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TR_TILE; j += 8) {
        int64_t c = c0 + j, r = r0 + threadIdx.x; /* out row c, column r */
        if (r < rows && c < cols) out[c * rows + r] = t[threadIdx.x][j];
    }
}
static tpk_status fp8_transpose(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, uint8_t *out,
                                const uint8_t *in, int64_t rows, int64_t cols, int64_t ldi) {
    dim3 grid((unsigned)((cols + TR_TILE - 1) / TR_TILE),
              (unsigned)((rows + TR_TILE - 1) / TR_TILE)),
        block(TR_TILE, 8);
    fp8_transpose_kernel<<<grid, block, 0, st->stream>>>(out, in, rows, cols, ldi);
    return tpk__cuda_launched(ctx, fn);
}

/* out[rows, cols] (contiguous bf16) = the codes in[rows, cols] (ld ldi) decoded: exact */
__global__ void fp8_widen_kernel(tpk__bf16 *out, const uint8_t *in, int64_t rows, int64_t cols,
                                 int64_t ldi, tpk_fp8_fmt fmt) {
    size_t total = (size_t)rows * (size_t)cols;
    TPK__GRID_STRIDE(i, total) {
        size_t r = i / (size_t)cols, c = i % (size_t)cols;
        out[i] = __float2bfloat16_rn(tpk_fp8_to_f32(in[r * (size_t)ldi + c], fmt));
    }
}

/* cuBLASLt FP8 plans, cached per problem (as gemm.cu's) */
struct fp8_key {
    int fa, fb, cdt;
    int64_t m, n, k, lda, ldb, ldc;
    uint32_t aa, ab, ac;
    bool operator==(const fp8_key &o) const {
        return fa == o.fa && fb == o.fb && cdt == o.cdt && m == o.m && n == o.n && k == o.k &&
               lda == o.lda && ldb == o.ldb && ldc == o.ldc && aa == o.aa && ab == o.ab &&
               ac == o.ac;
    }
};
struct fp8_plan {
    fp8_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* la: B's storage (cuBLASLt's A), lb: A's */
    cublasLtMatmulAlgo_t algo;
    bool used, none; /* none: cuBLASLt has no algorithm (remembered: the fallback at once) */
};
enum { FP8_CACHE = 32 };
static fp8_plan g_fp8[FP8_CACHE];
static int g_fp8_next;
static std::mutex g_fp8_mutex;

static inline uint32_t fp8_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u % a)) a >>= 1;
    return a;
}
static void fp8_plan_release(fp8_plan *p) {
    if (p->used && !p->none) {
        cublasLtMatmulDescDestroy(p->op);
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->lc);
    }
    p->used = false;
}
/* The plan of a TN problem (C[m, n] = A[m, k] B[n, k]^T, row-major), made on first use; NULL when
 * cuBLASLt has no algorithm for it. */
static fp8_plan *fp8_plan_get(tpk__cuda_state *st, const fp8_key &key) {
    for (int i = 0; i < FP8_CACHE; i++)
        if (g_fp8[i].used && g_fp8[i].key == key) return g_fp8[i].none ? NULL : &g_fp8[i];
    fp8_plan *p = &g_fp8[g_fp8_next];
    g_fp8_next = (g_fp8_next + 1) % FP8_CACHE;
    fp8_plan_release(p);
    p->key = key, p->used = true, p->none = true;
    cudaDataType_t ta = key.fa == TPK_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2,
                   tb = key.fb == TPK_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2,
                   tc = key.cdt == TPK_F32 ? CUDA_R_32F : CUDA_R_16BF;
    /* column-major: cuBLASLt's A = our B's storage [k, n] (ld ldb) transposed, its B = our A's
     * storage [k, m] (ld lda), D = C^T [n, m] (ld ldc): TN */
    cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    bool mo = false, ma = false, mb = false, mc = false;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    mo = s == CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN);
    if (s == CUBLAS_STATUS_SUCCESS)
        ma = (s = cublasLtMatrixLayoutCreate(&p->la, tb, key.k, key.n, key.ldb)) ==
             CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS)
        mb = (s = cublasLtMatrixLayoutCreate(&p->lb, ta, key.k, key.m, key.lda)) ==
             CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS)
        mc = (s = cublasLtMatrixLayoutCreate(&p->lc, tc, key.n, key.m, key.ldc)) ==
             CUBLAS_STATUS_SUCCESS;
    int found = 0;
    cublasLtMatmulHeuristicResult_t res = {};
    if (s == CUBLAS_STATUS_SUCCESS)
        s = tpk__lt_heuristic(st, p->op, p->la, p->lb, p->lc, key.ab, key.aa, key.ac, &res,
                              &found);
    if (s != CUBLAS_STATUS_SUCCESS || found < 1) {
        if (mo) cublasLtMatmulDescDestroy(p->op);
        if (ma) cublasLtMatrixLayoutDestroy(p->la);
        if (mb) cublasLtMatrixLayoutDestroy(p->lb);
        if (mc) cublasLtMatrixLayoutDestroy(p->lc);
        return NULL; /* remembered as none */
    }
    p->algo = res.algo, p->none = false;
    return p;
}

/* The fallback: both operands decoded into bf16 (exact) in scratch, then the backend's bf16 GEMM
 * into C (gemm_acc for an f32 C: bf16 A, B, f32 C and sums). */
static tpk_status fp8_gemm_widened(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, bool ta,
                                   bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const uint8_t *a, tpk_fp8_fmt fa, int64_t lda, const uint8_t *b,
                                   tpk_fp8_fmt fb, int64_t ldb, float beta, void *c, int64_t ldc,
                                   tpk_dtype c_dt) {
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    size_t na = (size_t)ar * (size_t)ac, nb = (size_t)br * (size_t)bc,
           off = (na * 2 + 255) / 256 * 256; /* B's at a 256-byte boundary */
    void *ws = NULL;
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, off + nb * 2, &ws));
    tpk__bf16 *wa = (tpk__bf16 *)ws, *wb = (tpk__bf16 *)((char *)ws + off);
    fp8_widen_kernel<<<tpk__grid_for(na, 256), 256, 0, st->stream>>>(wa, a, ar, ac, lda, fa);
    TPK_TRY(tpk__cuda_launched(ctx, fn));
    fp8_widen_kernel<<<tpk__grid_for(nb, 256), 256, 0, st->stream>>>(wb, b, br, bc, ldb, fb);
    TPK_TRY(tpk__cuda_launched(ctx, fn));
    const tpk_ops *o = tpk_ops_cuda();
    if (c_dt == TPK_F32)
        return o->gemm_acc(ctx, ta, tb, m, n, k, alpha, wa, ac, wb, bc, beta, (float *)c, ldc,
                           TPK_BF16);
    return o->gemm(ctx, ta, tb, m, n, k, alpha, wa, ac, wb, bc, beta, c, ldc, TPK_BF16);
}

static tpk_status cuda_gemm_fp8(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const uint8_t *a, tpk_fp8_fmt fa, int64_t lda,
                                const uint8_t *b, tpk_fp8_fmt fb, int64_t ldb, float beta, void *c,
                                int64_t ldc, tpk_dtype c_dt) {
    static const char *fn = "cuda.gemm_fp8";
    if (m == 0 || n == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    const tpk_ops *o = tpk_ops_cuda();
    if (k == 0 || alpha == 0.0f) /* C = beta C: the GEMM's own path (reads neither A nor B) */
        return c_dt == TPK_F32
                   ? o->gemm_acc(ctx, ta, tb, m, n, k, 0.0f, NULL, ta ? m : k, NULL, tb ? k : n,
                                 beta, (float *)c, ldc, TPK_BF16)
                   : o->gemm(ctx, ta, tb, m, n, k, 0.0f, NULL, ta ? m : k, NULL, tb ? k : n, beta,
                             c, ldc, TPK_BF16);
    /* cuBLASLt's FP8 path: sm_89 and later, sizes multiples of 16, not two E5M2 operands; the
     * operands not in TN orientation (or at an ld or address cuBLASLt's FP8 kernels do not take)
     * transposed into packed scratch copies */
    const int64_t big = (int64_t)65535 * TR_TILE; /* the transpose's grid */
    bool lt = st->cc >= 89 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && m <= big && n <= big &&
              k <= big &&
              !(fa == TPK_E5M2 && fb == TPK_E5M2) && ldc % 16 == 0 && fp8_align(c) >= 16;
    if (lt) {
        bool copy_a = ta || lda % 16 || fp8_align(a) < 16,
             copy_b = !tb || ldb % 16 || fp8_align(b) < 16;
        fp8_key key = {(int)fa, (int)fb, (int)c_dt, m, n, k, copy_a ? k : lda, copy_b ? k : ldb,
                       ldc, copy_a ? 256u : fp8_align(a), copy_b ? 256u : fp8_align(b),
                       fp8_align(c)};
        std::lock_guard<std::mutex> lock(g_fp8_mutex);
        fp8_plan *p = fp8_plan_get(st, key);
        if (p) {
            const uint8_t *ua = a, *ub = b;
            if (copy_a || copy_b) {
                size_t na = copy_a ? (size_t)m * (size_t)k : 0, off = (na + 255) / 256 * 256;
                void *ws = NULL;
                TPK_TRY(tpk__cuda_scratch(ctx, fn, st, off + (copy_b ? (size_t)n * (size_t)k : 0),
                                          &ws));
                if (copy_a) { /* A [m, k] row-major from its storage */
                    uint8_t *t = (uint8_t *)ws;
                    if (ta) TPK_TRY(fp8_transpose(ctx, fn, st, t, a, k, m, lda));
                    else
                        TPK__CUDA_TRY(ctx, fn,
                                      cudaMemcpy2DAsync(t, (size_t)k, a, (size_t)lda, (size_t)k,
                                                        (size_t)m, cudaMemcpyDeviceToDevice,
                                                        st->stream));
                    ua = t;
                }
                if (copy_b) { /* B [n, k] row-major from its storage */
                    uint8_t *t = (uint8_t *)ws + off;
                    if (!tb) TPK_TRY(fp8_transpose(ctx, fn, st, t, b, k, n, ldb));
                    else
                        TPK__CUDA_TRY(ctx, fn,
                                      cudaMemcpy2DAsync(t, (size_t)k, b, (size_t)ldb, (size_t)k,
                                                        (size_t)n, cudaMemcpyDeviceToDevice,
                                                        st->stream));
                    ub = t;
                }
            }
            cublasStatus_t s = cublasLtMatmul(st->lt, p->op, &alpha, ub, p->la, ua, p->lb, &beta, c,
                                              p->lc, c, p->lc, &p->algo, st->lt_ws,
                                              st->lt_ws_bytes, st->stream);
            if (s != CUBLAS_STATUS_SUCCESS)
                return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "cublasLtMatmul (FP8): %s",
                                 cublasLtGetStatusString(s));
            return TPK_OK;
        }
    }
    return fp8_gemm_widened(ctx, fn, st, ta, tb, m, n, k, alpha, a, fa, lda, b, fb, ldb, beta, c,
                            ldc, c_dt);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_fp8_ops(tpk_ops *o) {
    o->fp8_quant = cuda_fp8_quant;
    o->fp8_dequant = cuda_fp8_dequant;
    o->gemm_fp8 = cuda_gemm_fp8;
}
