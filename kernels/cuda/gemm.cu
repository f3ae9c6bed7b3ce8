/* kernels/cuda/gemm.cu — the CUDA backend's GEMMs (cuBLASLt) and the fused linear ops (its
 * epilogues).
 *
 *   gemm      C = alpha op(A) op(B) + beta C    cuBLASLt. Row-major C[m, n] is column-major
 *             C^T[n, m] = op(B)^T op(A)^T, so B goes first with the transposes unchanged. The
 *             descriptors and the heuristic's algorithm are cached per shape, strides and pointer
 *             alignment. f32 computes in f32 (TF32 only when allowed), bf16 in f32. A layout
 *             cuBLASLt has no algorithm for goes to a tiled shared-memory kernel instead.
 *   gemm_acc  gemm into an f32 C with A, B in dt: the same path, cuBLASLt with A, B bf16 and
 *             C, D f32 (compute 32F), or the tiled kernel instantiated for an f32 C.
 *   gemm_grouped    G GEMMs on row groups (the experts): one cublasGemmGroupedBatchedEx launch
 *                   over the groups with rows where cuBLAS's grouped GEMM takes the form (x, y
 *                   and W of one type, aligned), else a loop of the gemm path; a group of 0 rows
 *                   skipped (under wgrad W_g = beta W_g)
 *   linear_fwd      x W^T + bias (+ GELU-tanh keeping the pre-activation) in one cuBLASLt call with
 *                   an epilogue (BIAS, GELU_AUX, GELU_AUX_BIAS)
 *   linear_bwd_act  (dy W) gelu'(pre) and its column sums: the DGELU(_BGRAD) epilogue
 *   without an algorithm for an epilogue: the front end's compositions (tpk__compose_*,
 *   tpk/runtime/op.h) */
#include <algorithm>
#include <atomic>
#include <mutex>
#include <type_traits>
#include <vector>

#include "common.cuh"

/* ---- gemm ------------------------------------------------------------------------------------ */

/* C = beta C over [m, n] with leading dimension ldc; beta = 0 writes zeros whatever C held. */
template <class T>
__global__ void scale2d_kernel(T *c, int64_t ldc, int64_t m, int64_t n, float beta) {
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
    uint32_t abias, aaux; /* the epilogue's vectors' alignment: the heuristic chose for pointers of
                             it */
    bool operator==(const gemm_key &o) const {
        return ta == o.ta && tb == o.tb && dt == o.dt && cdt == o.cdt && tf32 == o.tf32 &&
               m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldc == o.ldc &&
               aa == o.aa && ab == o.ab && ac == o.ac && epi == o.epi && abias == o.abias &&
               aaux == o.aaux;
    }
};
/* whether an epilogue reads or writes the bias vector / the aux matrix */
static inline bool epi_bias(int epi) {
    return epi == EPI_BIAS || epi == EPI_GELU_AUX_BIAS || epi == EPI_DGELU_BGRAD;
}
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
static tpk_status gemm_plan_get(tpk__cuda_state *st, const gemm_key &key, const void *bias,
                                const void *aux, gemm_plan **out) {
    for (int i = 0; i < GEMM_CACHE; i++)
        if (g_plans[i].used && g_plans[i].key == key) {
            *out = &g_plans[i];
            return TPK_OK;
        }
    gemm_plan *p = &g_plans[g_plan_next];
    g_plan_next = (g_plan_next + 1) % GEMM_CACHE;
    plan_release(p);
    p->key = key;
    cudaDataType_t ty = key.dt == TPK_F32 ? CUDA_R_32F : CUDA_R_16BF,
                   tc = key.cdt == TPK_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasComputeType_t ct =
        key.dt == TPK_F32 && key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    /* column-major view: first operand = B's storage [tb ? k : n, tb ? n : k] ld ldb with op tb,
     * second = A's storage [ta ? m : k, ta ? k : m] ld lda with op ta, result [n, m] ld ldc */
    cublasOperation_t opa = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      opb = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F);
    bool made_op = s == CUBLAS_STATUS_SUCCESS, made_a = false, made_b = false, made_c = false;
    if (made_op)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
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
            s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                               sizeof ld);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                   &aux, sizeof aux);
        }
        if (s == CUBLAS_STATUS_SUCCESS && epi_bias(key.epi))
            s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof bias);
    }
    if (s == CUBLAS_STATUS_SUCCESS)
        made_a = (s = cublasLtMatrixLayoutCreate(&p->la, ty, key.tb ? key.k : key.n,
                                                 key.tb ? key.n : key.k, key.ldb)) ==
                 CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS)
        made_b = (s = cublasLtMatrixLayoutCreate(&p->lb, ty, key.ta ? key.m : key.k,
                                                 key.ta ? key.k : key.m, key.lda)) ==
                 CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS)
        made_c = (s = cublasLtMatrixLayoutCreate(&p->lc, tc, key.n, key.m, key.ldc)) ==
                 CUBLAS_STATUS_SUCCESS;
    int found = 0;
    cublasLtMatmulHeuristicResult_t res = {};
    if (s == CUBLAS_STATUS_SUCCESS) /* A and B in cuBLASLt's order are our B and A */
        s = tpk__lt_heuristic(st, p->op, p->la, p->lb, p->lc, key.ab, key.aa, key.ac, &res,
                              &found);
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
__global__ void gemm_fallback_kernel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                     const T *a, int64_t lda, const T *b, int64_t ldb, float beta,
                                     TC *c, int64_t ldc) {
    __shared__ float As[FB_TILE][FB_TILE + 1], Bs[FB_TILE][FB_TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t row = (int64_t)blockIdx.y * FB_TILE + ty, col = (int64_t)blockIdx.x * FB_TILE + tx;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += FB_TILE) {
        int64_t ar = (int64_t)blockIdx.y * FB_TILE + ty, ak = k0 + tx; /* op(A)[ar, ak] */
        As[ty][tx] =
            ar < m && ak < k ? tpk__ldf(a, (size_t)(ta ? ak * lda + ar : ar * lda + ak)) : 0.0f;
        int64_t bk = k0 + ty, bc = (int64_t)blockIdx.x * FB_TILE + tx; /* op(B)[bk, bc] */
        Bs[ty][tx] =
            bk < k && bc < n ? tpk__ldf(b, (size_t)(tb ? bc * ldb + bk : bk * ldb + bc)) : 0.0f;
        __syncthreads();
        for (int q = 0; q < FB_TILE; q++) acc += As[ty][q] * Bs[q][tx];
        __syncthreads();
    }
    if (row < m && col < n) {
        size_t at = (size_t)(row * ldc + col);
        tpk__stf(c, at, beta == 0.0f ? alpha * acc : alpha * acc + beta * tpk__ldf(c, at));
    }
}
static tpk_status gemm_fallback(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, bool ta, bool tb,
                                int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                                int64_t lda, const void *b, int64_t ldb, float beta, void *c,
                                int64_t ldc, tpk_dtype dt, tpk_dtype cdt) {
    if ((m + FB_TILE - 1) / FB_TILE > 65535)
        return tpk__fail(ctx, TPK_ERR_BACKEND, fn,
                         "cuBLASLt has no algorithm and m = %lld is too large for the fallback",
                         (long long)m);
    dim3 grid((unsigned)((n + FB_TILE - 1) / FB_TILE), (unsigned)((m + FB_TILE - 1) / FB_TILE)),
        block(FB_TILE, FB_TILE);
    tpk__by_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        auto launch = [&](auto ctag) { /* C of type T, or f32 */
            using TC = decltype(ctag);
            gemm_fallback_kernel<T, TC><<<grid, block, 0, st->stream>>>(
                ta, tb, m, n, k, alpha, (const T *)a, lda, (const T *)b, ldb, beta, (TC *)c, ldc);
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
static tpk_status gemm_run(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, bool ta, bool tb,
                           int64_t m, int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                           const void *b, int64_t ldb, float beta, void *c, int64_t ldc,
                           tpk_dtype dt, tpk_dtype cdt, int epi = EPI_NONE, const void *bias = NULL,
                           void *aux = NULL) {
    gemm_key key = {ta,
                    tb,
                    (int)dt,
                    (int)cdt,
                    dt == TPK_F32 && tpk__cuda_tf32(),
                    m,
                    n,
                    k,
                    lda,
                    ldb,
                    ldc,
                    ptr_align(a),
                    ptr_align(b),
                    ptr_align(c),
                    epi,
                    epi_bias(epi) ? ptr_align(bias) : 0,
                    epi_aux(epi) ? ptr_align(aux) : 0};
    /* an epilogue's vectors at less than 16 bytes: cuBLASLt's epilogue kernels load them 16 bytes
     * at a time (a parameter's bias at an unaligned offset) — the caller composes instead */
    if ((epi_bias(epi) && key.abias < 16) || (epi_aux(epi) && key.aaux < 16))
        return TPK_ERR_UNSUPPORTED;
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    gemm_plan *p = NULL;
    if (gemm_plan_get(st, key, bias, aux, &p) != TPK_OK) { /* no cuBLASLt algorithm */
        if (epi != EPI_NONE) return TPK_ERR_UNSUPPORTED;
        return gemm_fallback(ctx, fn, st, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt,
                             cdt); /* the tiled kernel */
    }
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (epi_bias(epi)) /* DGELU_BGRAD writes the bias gradient there */
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof bias);
    if (s == CUBLAS_STATUS_SUCCESS && epi_aux(epi))
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof aux);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(st->lt, p->op, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc,
                           &p->algo, st->lt_ws, st->lt_ws_bytes, st->stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "cublasLtMatmul: %s",
                         cublasLtGetStatusString(s));
    return TPK_OK;
}

/* gemm (cdt = dt) and gemm_acc (cdt = f32): one path */
static tpk_status gemm_any(tpk_ctx *ctx, const char *fn, bool ta, bool tb, int64_t m, int64_t n,
                           int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                           int64_t ldb, float beta, void *c, int64_t ldc, tpk_dtype dt,
                           tpk_dtype cdt) {
    if (m == 0 || n == 0) return TPK_OK;
    TPK__CUDA_STATE(st, ctx, fn);
    if (k == 0 || alpha == 0.0f) { /* no product: C = beta C (and no reads of A, B) */
        if (beta == 1.0f) return TPK_OK;
        size_t total = (size_t)m * (size_t)n;
        tpk__by_dtype(cdt, [&](auto tag) {
            using T = decltype(tag);
            scale2d_kernel<T>
                <<<tpk__grid_for(total, 256), 256, 0, st->stream>>>((T *)c, ldc, m, n, beta);
        });
        return tpk__cuda_launched(ctx, fn);
    }
    return gemm_run(ctx, fn, st, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, cdt);
}
static tpk_status cuda_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                            float beta, void *c, int64_t ldc, tpk_dtype dt) {
    return gemm_any(ctx, "cuda.gemm", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt, dt);
}
static tpk_status cuda_gemm_acc(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                                float beta, float *c, int64_t ldc, tpk_dtype dt) {
    return gemm_any(ctx, "cuda.gemm_acc", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt,
                    TPK_F32);
}

/* ---- gemm_grouped ---------------------------------------------------------------------------- */

/* A group's product in gemm's row-major terms: C[m, n] = alpha op(A) op(B) + beta C */
struct gg_prob {
    bool ta, tb;
    int64_t m, n, k;
    const void *a;
    int64_t lda;
    const void *b;
    int64_t ldb;
    void *c;
    int64_t ldc;
};
/* group g's product (r rows of x and y at xg, yg; W_g at wg): y_g = x_g op(W_g); under wgrad
 * W_g = x_g^T y_g, or (tw) W_g [n, k] = y_g^T x_g */
static gg_prob gg_group(bool wgrad, bool tw, int64_t r, int64_t n, int64_t k, const void *xg,
                        int64_t ldx, void *wg, int64_t ldw, void *yg, int64_t ldy) {
    if (!wgrad) return {false, tw, r, n, k, xg, ldx, wg, ldw, yg, ldy};
    if (!tw) return {true, false, k, n, r, xg, ldx, yg, ldy, wg, ldw};
    return {true, false, n, k, r, yg, ldy, xg, ldx, wg, ldw};
}

static std::atomic<unsigned long long> g_grouped_launches;
extern "C" unsigned long long tpk_cuda_gemm_grouped_launches(void) {
    return g_grouped_launches.load();
}

/* The groups with rows in one cublasGemmGroupedBatchedEx launch (cuBLAS >= 12.5, CUDA 12.5; an
 * older toolkit's cuBLAS has none: always the loop; cuBLASLt has no grouped matmul in CUDA 13.0,
 * only batches of one shape): one cuBLAS group of one problem per GEMM group, each in the
 * column-major terms gemm_plan_get uses (B's storage first); the dimensions, leading dimensions,
 * operations and scalars in host arrays, the matrices' addresses uploaded (the backend's pinned
 * slots: no wait) into the scratch buffer, which the launch reads in stream order. Returns
 * TPK_ERR_UNSUPPORTED (no message) where that launch cannot serve, for the caller's loop: W in
 * another type than x and y (its types are A, B and C alike: f32, or bf16 with f32 compute — not
 * a bf16 model's f32 gradients under wgrad), alpha 0 or k 0 (no product), fewer than two groups
 * with rows (the loop is one launch then, with a cached plan), a size or leading dimension past
 * int, or under bf16 or TF32 a matrix not 16-byte aligned (cuBLAS's alignment rule); or when
 * cuBLAS answers NOT_SUPPORTED. Groups of 0 rows are not in the launch. */
static tpk_status gemm_grouped_blas(tpk_ctx *ctx, const char *fn, tpk__cuda_state *st, bool wgrad,
                                    bool tw, int64_t groups, const int64_t *rows, int64_t n,
                                    int64_t k, float alpha, const void *x, int64_t ldx,
                                    void *const *w, int64_t ldw, tpk_dtype w_dt, float beta,
                                    void *y, int64_t ldy, tpk_dtype dt) {
#if !defined(CUBLAS_VERSION) || CUBLAS_VERSION < 120500 /* before cuBLAS 12.5: no grouped GEMM */
    (void)ctx, (void)fn, (void)st, (void)wgrad, (void)tw, (void)groups, (void)rows, (void)n,
        (void)k;
    (void)alpha, (void)x, (void)ldx, (void)w, (void)ldw, (void)w_dt, (void)beta, (void)y, (void)ldy;
    (void)dt;
    return TPK_ERR_UNSUPPORTED;
#else
    if (w_dt != dt || alpha == 0.0f || n == 0 || k == 0) return TPK_ERR_UNSUPPORTED;
    bool tf32 = dt == TPK_F32 && tpk__cuda_tf32(), align = dt == TPK_BF16 || tf32;
    size_t es = tpk_dtype_size(dt);
    std::vector<gg_prob> p;
    for (int64_t g = 0, off = 0; g < groups; off += rows[g++]) {
        if (!rows[g]) continue;
        gg_prob q = gg_group(wgrad, tw, rows[g], n, k, (const char *)x + (size_t)(off * ldx) * es,
                             ldx, w[g], ldw, (char *)y + (size_t)(off * ldy) * es, ldy);
        int64_t most = std::max({q.m, q.n, q.k, q.lda, q.ldb, q.ldc});
        if (most > INT_MAX || (align && !tpk__aligned16({q.a, q.b, q.c})))
            return TPK_ERR_UNSUPPORTED;
        p.push_back(q);
    }
    int G = (int)p.size();
    if (G < 2) return TPK_ERR_UNSUPPORTED;
    std::vector<cublasOperation_t> opa(G), opb(G);
    std::vector<int> M(G), N(G), K(G), lda(G), ldb(G), ldc(G), one(G, 1);
    std::vector<float> al(G, alpha), be(G, beta);
    std::vector<const void *> ptr(3 * (size_t)G); /* A, then B, then C: cuBLAS's three arrays */
    for (int i = 0; i < G; i++) { /* C^T [n, m] = op(B)^T op(A)^T: B's storage is cuBLAS's A */
        const gg_prob &q = p[(size_t)i];
        opa[i] = q.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb[i] = q.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        M[i] = (int)q.n, N[i] = (int)q.m, K[i] = (int)q.k;
        lda[i] = (int)q.ldb, ldb[i] = (int)q.lda, ldc[i] = (int)q.ldc;
        ptr[(size_t)i] = q.b, ptr[(size_t)(G + i)] = q.a, ptr[(size_t)(2 * G + i)] = q.c;
    }
    void *dptr;
    size_t bytes = ptr.size() * sizeof(void *);
    TPK_TRY(tpk__cuda_scratch(ctx, fn, st, bytes, &dptr));
    TPK_TRY(ctx->ops->memcpy(ctx, dptr, ptr.data(), bytes, TPK_H2D));
    const void *const *dA = (const void *const *)dptr;
    cudaDataType_t ty = dt == TPK_F32 ? CUDA_R_32F : CUDA_R_16BF;
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (!st->blas) { /* on the backend's stream, with cuBLASLt's workspace */
        cublasHandle_t h = NULL;
        s = cublasCreate(&h);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(h, st->stream);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(h, st->lt_ws, st->lt_ws_bytes);
        if (s != CUBLAS_STATUS_SUCCESS) {
            if (h) cublasDestroy(h);
            return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "the cuBLAS handle: %s",
                             cublasGetStatusString(s));
        }
        st->blas = h;
    }
    s = cublasGemmGroupedBatchedEx(st->blas, opa.data(), opb.data(), M.data(), N.data(), K.data(),
                                   al.data(), dA, ty, lda.data(), dA + G, ty, ldb.data(), be.data(),
                                   (void *const *)(dA + 2 * G), ty, ldc.data(), G, one.data(),
                                   tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) return TPK_ERR_UNSUPPORTED;
    if (s != CUBLAS_STATUS_SUCCESS)
        return tpk__fail(ctx, TPK_ERR_BACKEND, fn, "cublasGemmGroupedBatchedEx: %s",
                         cublasGetStatusString(s));
    g_grouped_launches++;
    return TPK_OK;
#endif
}

/* G GEMMs on row groups of x and y (tpk_ops.gemm_grouped). The groups with rows in one launch
 * (gemm_grouped_blas) where it serves: the forward and the data gradient (y in dt), and the weight
 * gradient into W of x's type (an f32 model's f32 gradients, beta 1 included); else — a bf16
 * model's gradients into f32 W (gemm_acc's accumulation, which cuBLAS's grouped GEMM does not
 * take), misaligned bf16 or TF32 operands, a single group with rows — one gemm_any per group, in
 * order (cuBLASLt plans cached per shape: a group's row count is part of its key). Either way a
 * group of 0 rows is skipped, or under wgrad W_g = beta W_g (gemm_any's k = 0). */
static tpk_status cuda_gemm_grouped(tpk_ctx *ctx, bool wgrad, bool tw, int64_t groups,
                                    const int64_t *rows, int64_t n, int64_t k, float alpha,
                                    const void *x, int64_t ldx, void *const *w, int64_t ldw,
                                    tpk_dtype w_dt, float beta, void *y, int64_t ldy,
                                    tpk_dtype dt) {
    static const char *fn = "cuda.gemm_grouped";
    TPK__CUDA_STATE(st, ctx, fn);
    tpk_status one = gemm_grouped_blas(ctx, fn, st, wgrad, tw, groups, rows, n, k, alpha, x, ldx, w,
                                       ldw, w_dt, beta, y, ldy, dt);
    if (one != TPK_OK && one != TPK_ERR_UNSUPPORTED) return one;
    size_t es = tpk_dtype_size(dt);
    for (int64_t g = 0, off = 0; g < groups; off += rows[g++]) {
        int64_t r = rows[g];
        if ((!wgrad && !r) || (one == TPK_OK && r)) continue; /* none, or in the launch */
        gg_prob q = gg_group(wgrad, tw, r, n, k, (const char *)x + (size_t)(off * ldx) * es, ldx,
                             w[g], ldw, (char *)y + (size_t)(off * ldy) * es, ldy);
        TPK_TRY(gemm_any(ctx, fn, q.ta, q.tb, q.m, q.n, q.k, alpha, q.a, q.lda, q.b, q.ldb, beta,
                         q.c, q.ldc, dt, wgrad ? w_dt : dt));
    }
    return TPK_OK;
}

extern "C" tpk_status tpk_cuda_plain_gemm(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n,
                                          int64_t k, const void *a, const void *b, void *c,
                                          tpk_dtype dt) {
    static const char *fn = "tpk_cuda_plain_gemm";
    TPK__CUDA_STATE(st, ctx, fn);
    return gemm_run(ctx, fn, st, ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n,
                    dt, dt);
}


/* ---- fused linear forward -------------------------------------------------------------------- */

/* u = x W^T + bias, y = u or (pre = u, y = act(u)): one cuBLASLt call with the BIAS /
 * GELU_AUX(_BIAS) epilogue; where cuBLASLt has no fused algorithm (or the activation has no
 * epilogue), the front end's composition (tpk__compose_linear_fwd, tpk/runtime/op.h: gemm +
 * bias_add + act_fwd through this table; the same result). */
static tpk_status cuda_linear_fwd(tpk_ctx *ctx, void *y, void *pre, const void *x, const void *w,
                                  const void *bias, int64_t T, int64_t n, int64_t k, tpk_act act,
                                  tpk_dtype dt) {
    static const char *fn = "cuda.linear_fwd";
    TPK__CUDA_STATE(st, ctx, fn);
    bool gelu = act == TPK_ACT_GELU_TANH;
    int epi = gelu                          ? (bias ? EPI_GELU_AUX_BIAS : EPI_GELU_AUX)
              : act == TPK_ACT_NONE && bias ? EPI_BIAS
                                            : EPI_NONE;
    if (k > 0 && epi != EPI_NONE) {
        tpk_status s = gemm_run(ctx, fn, st, false, true, T, n, k, 1.0f, x, k, w, k, 0.0f, y, n, dt,
                                dt, epi, bias, pre);
        if (s != TPK_ERR_UNSUPPORTED) return s;
    }
    return tpk__compose_linear_fwd(ctx, y, pre, x, w, bias, T, n, k, act, dt);
}

/* du = (dy W) act'(pre), db = colsum(du): one cuBLASLt call with the DGELU(_BGRAD) epilogue, which
 * reads the pre-activation the forward's GELU_AUX epilogue kept (aux, D's shape: [T, n] row-major
 * is cuBLASLt's column-major [n, T]; the bias gradient, one value per row of D, is per feature);
 * where cuBLASLt has no fused algorithm (or the activation has no epilogue), the front end's
 * composition (tpk__compose_linear_bwd_act: gemm + act_bwd + bias_grad; the same result). */
static tpk_status cuda_linear_bwd_act(tpk_ctx *ctx, void *du, void *db, const void *dy,
                                      const void *w, const void *pre, int64_t T, int64_t n,
                                      int64_t k, tpk_act act, tpk_dtype dt) {
    static const char *fn = "cuda.linear_bwd_act";
    TPK__CUDA_STATE(st, ctx, fn);
    if (k > 0 && act == TPK_ACT_GELU_TANH) {
        tpk_status s =
            gemm_run(ctx, fn, st, false, false, T, n, k, 1.0f, dy, k, w, n, 0.0f, du, n, dt, dt,
                     db ? EPI_DGELU_BGRAD : EPI_DGELU, db, const_cast<void *>(pre));
        if (s != TPK_ERR_UNSUPPORTED) return s;
    }
    return tpk__compose_linear_bwd_act(ctx, du, db, dy, w, pre, T, n, k, act, dt);
}

/* this file's entries of the CUDA table (table.cu) */
void tpk__cuda_gemm_ops(tpk_ops *o) {
    o->gemm = cuda_gemm;
    o->gemm_acc = cuda_gemm_acc;
    o->linear_fwd = cuda_linear_fwd;
    o->linear_bwd_act = cuda_linear_bwd_act;
    o->gemm_grouped = cuda_gemm_grouped;
}
