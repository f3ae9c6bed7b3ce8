/* tests/ops_test.h — what the host backend's op tests (tests/test_ops_*.c, one per concern of
 * kernels/host/) share: the context they run on, buffers, bf16 conversions, double-precision
 * references used by more than one file (GEMM, GELU), finite-difference steps, and the
 * tolerances (macros, so that building with e.g. -DTOL_F32=0 prints the errors actually
 * reached). */
#ifndef TPK_OPS_TEST_H
#define TPK_OPS_TEST_H

#include "test.h"

static tpk_ctx ctx;

/* An op test file's main: the host context, the file's tests in order, the summary. */
static inline int ops_test_run(int *argc, char ***argv, void (*const *tests)(void), int n) {
    test_init(argc, argv);
    if (test_host_ctx(&ctx) != TPK_OK) return 1;
    for (int i = 0; i < n; i++) tests[i]();
    tpk_ctx_destroy(&ctx);
    return test_finish();
}
#define OPS_TEST_MAIN(...)                                                                         \
    int main(int argc, char **argv) {                                                              \
        void (*const tests[])(void) = {__VA_ARGS__};                                               \
        return ops_test_run(&argc, &argv, tests, (int)(sizeof tests / sizeof tests[0]));           \
    }

#ifndef TOL_F32
#define TOL_F32 1e-5 /* f32 op vs double reference: dropout, embedding, cross-entropy */
#endif
#ifndef TOL_LN
#define TOL_LN 1e-5 /* layernorm f32 vs double reference */
#endif
#ifndef TOL_ATTN
#define TOL_ATTN 1e-5 /* attention f32 vs double reference */
#endif
#ifndef TOL_FD
#define TOL_FD 1e-2 /* gradients vs central finite differences of a double loss of f32 outputs */
#endif
#ifndef TOL_BF16
#define TOL_BF16 1e-2 /* bf16 storage vs double reference on the rounded inputs */
#endif

static inline float *fbuf(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

static inline void to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tpk_f32_to_bf16(src[i]);
}
static inline void from_bf16(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tpk_bf16_to_f32(src[i]);
}
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* out[m, n] (contiguous) = alpha op(A) op(B) + beta C, in double; beta = 0 ignores C. */
static inline void ref_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                            const float *a, int64_t lda, const float *b, int64_t ldb, double beta,
                            const float *c, int64_t ldc, float *out) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) {
                double x = ta ? a[p * lda + i] : a[i * lda + p];
                double y = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += x * y;
            }
            out[i * n + j] = (float)(alpha * s + (beta != 0 ? beta * c[i * ldc + j] : 0.0));
        }
}

static inline double gelu_d(double x) {
    const double s = 0.7978845608028654, c = 0.044715;
    return 0.5 * x * (1.0 + tanh(s * (x + c * x * x * x)));
}
static inline double gelu_grad_d(double x) {
    const double s = 0.7978845608028654, c = 0.044715;
    double t = tanh(s * (x + c * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * c * x * x);
}
/* the exact GELU: x Phi(x), and its slope Phi(x) + x phi(x) */
static inline double gelu_erf_d(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static inline double gelu_erf_grad_d(double x) {
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * 3.141592653589793);
}
static inline double *dbuf(size_t n) { return malloc((n ? n : 1) * sizeof(double)); }
static inline uint16_t *hbuf(size_t n) { return malloc((n ? n : 1) * sizeof(uint16_t)); }

/* x = the bf16 value nearest x, so a reference sees what a bf16 kernel reads */
static inline void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(x[i]));
}
static inline void poison_bf16(uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = 0x7FC1; /* a bf16 NaN */
}
static inline void d2f(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}
/* elements whose bit patterns differ */
static inline size_t bitdiff(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, sizeof(float)) != 0;
    return d;
}
static inline size_t count_nan(const float *a, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += isnan(a[i]) != 0;
    return c;
}
/* (float)(x + h) and (float)(x - h), and the step actually taken between them */
static inline double fd_step(float x, double h, float *xp, float *xm) {
    *xp = (float)((double)x + h), *xm = (float)((double)x - h);
    return (double)*xp - (double)*xm;
}

#endif
