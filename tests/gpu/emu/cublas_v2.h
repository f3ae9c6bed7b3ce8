/* tests/gpu/emu/cublas_v2.h — stands in for cuBLAS (cublas_v2.h) in the CPU emulation of the CUDA
 * backend: what kernels/cuda/gemm.cu calls of it — the handle (its stream and workspace) and the
 * grouped GEMM, cublasGemmGroupedBatchedEx — implemented in cublas.cpp as a plain loop that
 * accumulates in double, independently of the host backend. The types are those cuBLAS's grouped
 * GEMM takes (its documentation's table): A, B and C alike in f32 (CUBLAS_COMPUTE_32F,
 * _32F_PEDANTIC, _32F_FAST_TF32) or bf16 (CUBLAS_COMPUTE_32F); anything else is
 * CUBLAS_STATUS_NOT_SUPPORTED, as cuBLAS answers. The status, operation and compute-type enums
 * are cublasLt.h's (cuBLAS's own values). */
#ifndef TPK_EMU_CUBLAS_V2_H
#define TPK_EMU_CUBLAS_V2_H

#include "cublasLt.h"

/* the cuBLAS of CUDA 13.0 (13.1.0): major 10000 + minor 100 + patch, as cublas_api.h's */
#define CUBLAS_VERSION 130100

struct tpk_emu_blas;
typedef tpk_emu_blas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes);
const char *cublasGetStatusString(cublasStatus_t s);
/* For each group i < group_count, group_size[i] problems idx (counted through the groups):
 * C[idx] = alpha[i] op(A[idx]) op(B[idx]) + beta[i] C[idx] (column-major, C not read when beta is
 * 0), op(A) m[i] x k[i], op(B) k[i] x n[i]; the dimension, leading-dimension, operation and scalar
 * arrays in host memory, the arrays of pointers Aarray, Barray, Carray in device memory. */
cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t h, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void *alpha_array, const void *const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void *beta_array, void *const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType);

#endif
