/* tests/gpu/emu/cublas.cpp — cuBLAS's grouped GEMM emulated for the CPU run of the CUDA backend
 * (cublas_v2.h).
 *
 * cublasGemmGroupedBatchedEx computes each problem C = alpha op(A) op(B) + beta C (C not read when
 * beta = 0) in column-major layouts with double accumulation, one problem after another. As
 * cuBLAS it checks what it is given (its documentation's error list): a live handle, the host
 * arrays present, sizes, group sizes and leading dimensions (ld >= max(1, rows)), the operations;
 * INVALID_VALUE then. Unlike cuBLAS it also checks that the arrays of pointers lie in device
 * allocations (cuBLAS reads them on the device: a host array would fault there), that every
 * matrix lies inside one, and the alignment rule for bf16 or a FAST compute type (when k times
 * the element size is a multiple of 16, pointers 16-byte aligned; of 4, 4-byte aligned): a
 * violation prints a "FAIL emu:" line and returns EXECUTION_FAILED. Unsupported (NOT_SUPPORTED, as
 * cuBLAS answers, no failure): types outside cublas_v2.h's list, the device pointer mode (never
 * set here); TPK_EMU_BLAS_GROUPED=0 in the environment answers so for every call (the backend's
 * loop of cuBLASLt GEMMs then runs). */
#include "cublas_v2.h"

#include <set>
#include <vector>

struct tpk_emu_blas {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
};
static std::set<const void *> g_handles;
static bool live(cublasHandle_t h, const char *fn) {
    if (h && g_handles.count(h)) return true;
    tpk_emu_fail("%s: %p is not a live cuBLAS handle", fn, (const void *)h);
    return false;
}

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = new tpk_emu_blas{NULL, NULL, 0};
    g_handles.insert(*h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!live(h, "cublasDestroy")) return CUBLAS_STATUS_NOT_INITIALIZED;
    g_handles.erase(h);
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream) {
    if (!live(h, "cublasSetStream")) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes) {
    static const char *fn = "cublasSetWorkspace";
    if (!live(h, fn)) return CUBLAS_STATUS_NOT_INITIALIZED;
    /* "the workspace pointer has to be aligned to at least 256 bytes" */
    if ((bytes && !tpk_emu_check_device(workspace, bytes, fn)) || (uintptr_t)workspace % 256) {
        tpk_emu_fail("%s: %p (%zu bytes) is not 256-byte aligned device memory", fn, workspace,
                     bytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    h->ws = workspace, h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) { return cublasLtGetStatusString(s); }

static double ld_el(const void *p, cudaDataType_t t, size_t i) {
    return t == CUDA_R_32F ? (double)((const float *)p)[i]
                           : (double)tpk_emu_bf2f(((const uint16_t *)p)[i]);
}
static void st_el(void *p, cudaDataType_t t, size_t i, double v) {
    if (t == CUDA_R_32F) ((float *)p)[i] = (float)v;
    else ((uint16_t *)p)[i] = tpk_emu_f2bf((float)v);
}
/* the bytes a column-major rows x cols matrix of leading dimension ld spans */
static size_t span(int rows, int cols, int ld, size_t es) {
    return rows > 0 && cols > 0 ? ((size_t)ld * (size_t)(cols - 1) + (size_t)rows) * es : 0;
}

cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t h, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void *alpha_array, const void *const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void *beta_array, void *const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
    static const char *fn = "cublasGemmGroupedBatchedEx";
    if (!live(h, fn)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!transa_array || !transb_array || !m_array || !n_array || !k_array || !alpha_array ||
        !lda_array || !ldb_array || !beta_array || !ldc_array || !group_size || group_count < 0) {
        tpk_emu_fail("%s: a host array is NULL or group_count %d < 0", fn, group_count);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    int64_t problems = 0;
    for (int i = 0; i < group_count; i++) {
        int m = m_array[i], n = n_array[i], k = k_array[i];
        bool ta = transa_array[i] != CUBLAS_OP_N, tb = transb_array[i] != CUBLAS_OP_N;
        bool ops = (transa_array[i] == CUBLAS_OP_N || transa_array[i] == CUBLAS_OP_T ||
                    transa_array[i] == CUBLAS_OP_C) &&
                   (transb_array[i] == CUBLAS_OP_N || transb_array[i] == CUBLAS_OP_T ||
                    transb_array[i] == CUBLAS_OP_C);
        auto mx = [](int v) { return v > 1 ? v : 1; };
        if (m < 0 || n < 0 || k < 0 || group_size[i] < 0 || !ops || lda_array[i] < mx(ta ? k : m) ||
            ldb_array[i] < mx(tb ? n : k) || ldc_array[i] < mx(m)) {
            tpk_emu_fail("%s: group %d: m %d, n %d, k %d, size %d, ops %d %d, lda %d, ldb %d, "
                         "ldc %d: an invalid value (cuBLAS's list)",
                         fn, i, m, n, k, group_size[i], (int)transa_array[i], (int)transb_array[i],
                         lda_array[i], ldb_array[i], ldc_array[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        problems += group_size[i];
    }
    const char *off = getenv("TPK_EMU_BLAS_GROUPED");
    if (off && !strcmp(off, "0")) return CUBLAS_STATUS_NOT_SUPPORTED;
    bool f32 = Atype == CUDA_R_32F && Btype == CUDA_R_32F && Ctype == CUDA_R_32F,
         b16 = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && Ctype == CUDA_R_16BF;
    bool fast = computeType == CUBLAS_COMPUTE_32F_FAST_TF32;
    if (!(f32 && (computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC ||
                  fast)) &&
        !(b16 && computeType == CUBLAS_COMPUTE_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    size_t es = f32 ? 4 : 2, pb = (size_t)problems * sizeof(void *);
    if (problems && (!tpk_emu_check_device(Aarray, pb, "cublasGemmGroupedBatchedEx Aarray") ||
                     !tpk_emu_check_device(Barray, pb, "cublasGemmGroupedBatchedEx Barray") ||
                     !tpk_emu_check_device(Carray, pb, "cublasGemmGroupedBatchedEx Carray")))
        return CUBLAS_STATUS_INVALID_VALUE;
    const float *alpha = (const float *)alpha_array, *beta = (const float *)beta_array;
    std::vector<double> acc;
    for (int i = 0, idx = 0; i < group_count; i++)
        for (int j = 0; j < group_size[i]; j++, idx++) {
            int m = m_array[i], n = n_array[i], k = k_array[i];
            int lda = lda_array[i], ldb = ldb_array[i], ldc = ldc_array[i];
            bool ta = transa_array[i] != CUBLAS_OP_N, tb = transb_array[i] != CUBLAS_OP_N;
            const void *A = Aarray[idx], *B = Barray[idx];
            void *C = Carray[idx];
            const void *ptr[3] = {A, B, C};
            static const char *names[3] = {"A", "B", "C"};
            for (int q = 0; q < 3 && (b16 || fast); q++) { /* cuBLAS's alignment rule */
                size_t need = (size_t)k * es % 16 == 0 ? 16 : (size_t)k * es % 4 == 0 ? 4 : 1;
                if ((uintptr_t)ptr[q] % need) {
                    tpk_emu_fail("%s: problem %d: %s = %p, k %d: expected %zu-byte alignment", fn,
                                 idx, names[q], ptr[q], k, need);
                    return CUBLAS_STATUS_EXECUTION_FAILED;
                }
            }
            bool touch = m > 0 && n > 0;
            if (touch &&
                (!tpk_emu_check_device(C, span(m, n, ldc, es), "cublasGemmGroupedBatchedEx C") ||
                 (k > 0 && !tpk_emu_check_device(A, span(ta ? k : m, ta ? m : k, lda, es),
                                                 "cublasGemmGroupedBatchedEx A")) ||
                 (k > 0 && !tpk_emu_check_device(B, span(tb ? n : k, tb ? k : n, ldb, es),
                                                 "cublasGemmGroupedBatchedEx B"))))
                return CUBLAS_STATUS_INVALID_VALUE;
            acc.assign((size_t)m, 0.0);
            for (int c = 0; c < n; c++) {
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int p = 0; p < k; p++) {
                    double bv = ld_el(B, Btype, tb ? (size_t)p * ldb + c : (size_t)c * ldb + p);
                    for (int r = 0; r < m; r++)
                        acc[(size_t)r] +=
                            ld_el(A, Atype, ta ? (size_t)r * lda + p : (size_t)p * lda + r) * bv;
                }
                for (int r = 0; r < m; r++) {
                    size_t at = (size_t)c * ldc + r;
                    double v = (double)alpha[i] * acc[(size_t)r];
                    if (beta[i] != 0.0f) v += (double)beta[i] * ld_el(C, Ctype, at);
                    st_el(C, Ctype, at, (double)(float)v);
                }
            }
        }
    return CUBLAS_STATUS_SUCCESS;
}
