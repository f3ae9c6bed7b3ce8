/* tests/gpu/gpu_test.h — helpers of the GPU tests: a buffer pair (the same data in host memory
 * for the host backend and in device memory for the CUDA backend, in a storage dtype), poisoning
 * on the device, download and comparison. Built by `make cuda-check`, run by tests/gpu/run.sh. */
#ifndef TPK_GPU_TEST_H
#define TPK_GPU_TEST_H

#include "test.h"
#include <tpk/runtime/cuda.h>

/* Exit 0 with a note when there is no usable GPU (every rank agrees). */
static inline void gpu_require(const char *prog) {
    int n = tpk_cuda_device_count(), all = 0;
    MPI_Allreduce(&n, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all < 1) {
        if (test__rank == 0) printf("%s: no CUDA device: skipped\n", prog);
        MPI_Finalize();
        exit(0);
    }
    /* ranks share the devices round-robin (several ranks on one GPU in the t > 1 tests) */
    tpk_ctx tmp;
    memset(&tmp, 0, sizeof tmp);
    if (tpk_cuda_set_device(&tmp, test__rank % n) != TPK_OK) fprintf(stderr, "%s\n", tmp.err);
}

/* n elements of dtype dt, the same values on the host (h) and on the device (d). */
typedef struct pair {
    void *h, *d;
    size_t n;
    tpk_dtype dt;
} pair;

static inline void pair_store(void *dst, tpk_dtype dt, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dt == TPK_F32) ((float *)dst)[i] = src[i];
        else if (dt == TPK_BF16) ((uint16_t *)dst)[i] = tpk_f32_to_bf16(src[i]);
        else ((int32_t *)dst)[i] = (int32_t)src[i];
    }
}
static inline void pair_load(float *dst, tpk_dtype dt, const void *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = dt == TPK_F32    ? ((const float *)src)[i]
                 : dt == TPK_BF16 ? tpk_bf16_to_f32(((const uint16_t *)src)[i])
                                  : (float)((const int32_t *)src)[i];
}
/* A pair holding `vals` (f32, rounded to dt). */
static inline pair pair_from(tpk_ctx *cd, const float *vals, size_t n, tpk_dtype dt) {
    pair p = {NULL, NULL, n, dt};
    size_t bytes = (n ? n : 1) * tpk_dtype_size(dt);
    p.h = calloc(1, bytes);
    if (vals) pair_store(p.h, dt, vals, n);
    CHECK_OK(cd, cd->ops->alloc(cd, bytes, &p.d));
    if (n) CHECK_OK(cd, cd->ops->memcpy(cd, p.d, p.h, n * tpk_dtype_size(dt), TPK_H2D));
    return p;
}
/* A pair of N(0, scale^2) values from seed. */
static inline pair pair_randn(tpk_ctx *cd, size_t n, tpk_dtype dt, uint64_t seed, float scale) {
    float *v = (float *)malloc((n ? n : 1) * sizeof(float));
    test_randn(v, n, seed, scale);
    pair p = pair_from(cd, v, n, dt);
    free(v);
    return p;
}
/* Poison both copies (NaN), so an element an op forgets to write fails the comparison. */
static inline void pair_poison(tpk_ctx *cd, pair *p) {
    float *v = (float *)malloc((p->n ? p->n : 1) * sizeof(float));
    test_poison(v, p->n);
    pair_store(p->h, p->dt, v, p->n);
    if (p->n) CHECK_OK(cd, cd->ops->memcpy(cd, p->d, p->h, p->n * tpk_dtype_size(p->dt), TPK_H2D));
    free(v);
}
/* Copy the host values to the device again (reset an in-out buffer). */
static inline void pair_sync_down(tpk_ctx *cd, pair *p) {
    if (p->n) CHECK_OK(cd, cd->ops->memcpy(cd, p->d, p->h, p->n * tpk_dtype_size(p->dt), TPK_H2D));
}
/* Compare the device copy against the host copy: relative error (test_relerr) < tol. */
static inline void pair_check(tpk_ctx *cd, pair *p, double tol, const char *what) {
    size_t n = p->n ? p->n : 1, bytes = p->n * tpk_dtype_size(p->dt);
    void *raw = malloc(n * tpk_dtype_size(p->dt));
    float *got = (float *)malloc(n * sizeof(float)), *want = (float *)malloc(n * sizeof(float));
    if (bytes) CHECK_OK(cd, cd->ops->memcpy(cd, raw, p->d, bytes, TPK_D2H));
    pair_load(got, p->dt, raw, p->n);
    pair_load(want, p->dt, p->h, p->n);
    CHECK_CLOSE(got, want, p->n, tol, what);
    free(raw), free(got), free(want);
}
static inline void pair_free(tpk_ctx *cd, pair *p) {
    free(p->h);
    if (p->d) cd->ops->free(cd, p->d);
    p->h = p->d = NULL;
}

/* Tolerances: f32 with the same arithmetic, f32 with reordered sums, bf16 storage, and an FP8
 * tensor-core GEMM's f32 C (sm_89/sm_90 FP8 MMA accumulate with fewer mantissa bits than an f32
 * sum, about 14 kept: the H100 measured 1.1e-4 at k = 80 against the host's f32 sums). */
#define TOL_SAME 1e-5
#define TOL_SUM 1e-4
#define TOL_BF16 1e-2
#define TOL_FP8_ACC 1e-3
static inline double tol_for(tpk_dtype dt, double f32) { return dt == TPK_BF16 ? TOL_BF16 : f32; }

#endif /* TPK_GPU_TEST_H */
