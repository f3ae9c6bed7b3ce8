/* kernels/host/vec.h — 8-lane float vectors for the host backend's loops (GCC's vector extension:
 * one AVX register, two SSE registers, or scalar code where the target has neither), and the
 * exponential the cross-entropy, the softmax and the activations use. Not installed.
 *
 *   tpk__vexp  e^x by range reduction: x = n ln2 + r, |r| <= ln2/2, e^r by Cephes' degree-6
 *              polynomial, times 2^n built in the exponent bits (in two halves, so 2^n stays a
 *              normal number down to the subnormal results). Within 2 ulp of exp and of expf
 *              over [-87, 88] (tests/test_ops_xent.c measures every 31st float there); +inf past
 *              88.73, 0 below -103.98, NaN stays NaN. Lanes are independent: the same x gives
 *              the same bits in any lane and at any position in a row. */
#ifndef TPK_HOST_VEC_H
#define TPK_HOST_VEC_H

#include <stdint.h>
#include <string.h>

#include "host_private.h"

/* the functions here are inlined: no vector crosses a call, so the ABI warning does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"

/* A loop's outermost function (an op's part, pool.c) compiled twice, for AVX2 and for the base
 * instruction set, the one to run chosen when the program starts: the same operations on the same
 * 8 lanes, so both give the same bits (no FMA contraction under -std=c11). Not under
 * ThreadSanitizer, whose run time is not up when the choice is made. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define TPK__HOST_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define TPK__HOST_SIMD
#endif

enum { TPK__VL = 8 }; /* lanes */
typedef float tpk__v8f __attribute__((vector_size(32)));
typedef int32_t tpk__v8i __attribute__((vector_size(32)));
typedef uint16_t tpk__v8h __attribute__((vector_size(16)));
typedef float tpk__v4f __attribute__((vector_size(16)));
typedef double tpk__v4d __attribute__((vector_size(32))); /* 8 double lanes are two of these */

TPK__HOST_INLINE tpk__v8f tpk__vsplat(float v) {
    tpk__v8f r = {v, v, v, v, v, v, v, v};
    return r;
}
/* m ? a : b per lane (m: a comparison's all-ones or zero lanes) */
TPK__HOST_INLINE tpk__v8f tpk__vsel(tpk__v8i m, tpk__v8f a, tpk__v8f b) {
    return (tpk__v8f)((m & (tpk__v8i)a) | (~m & (tpk__v8i)b));
}
TPK__HOST_INLINE tpk__v8f tpk__vmax(tpk__v8f a, tpk__v8f b) { return tpk__vsel(a > b, a, b); }
TPK__HOST_INLINE float tpk__vhmax(tpk__v8f a) {
    float m = a[0];
    for (int k = 1; k < TPK__VL; k++) m = a[k] > m ? a[k] : m;
    return m;
}
/* the lanes' sum in double, lane order */
TPK__HOST_INLINE double tpk__vhsum(tpk__v8f a) {
    double s = 0;
    for (int k = 0; k < TPK__VL; k++) s += a[k];
    return s;
}

/* 8 elements from p + i of dtype dt, widened to f32 (bf16: the high half of the word) */
TPK__HOST_INLINE tpk__v8f tpk__vld(const void *p, tpk_dtype dt, size_t i) {
    if (dt == TPK_F32) {
        tpk__v8f r;
        memcpy(&r, (const float *)p + i, sizeof r);
        return r;
    }
    tpk__v8h h;
    memcpy(&h, (const uint16_t *)p + i, sizeof h);
    return (tpk__v8f)(__builtin_convertvector(h, tpk__v8i) << 16);
}
/* 8 elements to p + i (bf16: rounded to nearest even, as tpk__st) */
TPK__HOST_INLINE void tpk__vst(void *p, tpk_dtype dt, size_t i, tpk__v8f v) {
    if (dt == TPK_F32) {
        memcpy((float *)p + i, &v, sizeof v);
        return;
    }
    for (int k = 0; k < TPK__VL; k++) ((uint16_t *)p)[i + (size_t)k] = tpk_f32_to_bf16(v[k]);
}

/* the last n < 8 elements: the lanes past n read as 0 and are not written, so a row's tail runs
 * the vector code (the same bits as the full vectors) */
TPK__HOST_INLINE tpk__v8f tpk__vld_n(const void *p, tpk_dtype dt, size_t i, int64_t n) {
    tpk__v8f r = tpk__vsplat(0.0f);
    for (int64_t k = 0; k < n; k++) r[k] = tpk__ld(p, dt, i + (size_t)k);
    return r;
}
TPK__HOST_INLINE void tpk__vst_n(void *p, tpk_dtype dt, size_t i, tpk__v8f v, int64_t n) {
    for (int64_t k = 0; k < n; k++) tpk__st(p, dt, i + (size_t)k, v[k]);
}
/* per lane: sqrt (the compiler's scalar square root, lane by lane) */
TPK__HOST_INLINE tpk__v8f tpk__vsqrt(tpk__v8f x) {
    for (int k = 0; k < TPK__VL; k++) x[k] = sqrtf(x[k]);
    return x;
}

TPK__HOST_INLINE tpk__v8f tpk__vexp(tpk__v8f x) {
    const tpk__v8f hi = tpk__vsplat(88.7228394f), lo = tpk__vsplat(-103.972084f);
    tpk__v8f c = tpk__vsel(x > hi, hi, tpk__vsel(x < lo, lo, x)); /* NaN: lo, restored below */
    const tpk__v8f magic = tpk__vsplat(12582912.0f);              /* 1.5 2^23: round to integer */
    tpk__v8f n = (c * 1.44269504088896341f + magic) - magic;
    tpk__v8f r = c - n * 0.693359375f - n * -2.12194440e-4f; /* ln2 in two parts */
    tpk__v8f p = tpk__vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f, p = p * r + 8.3334519073e-3f, p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f, p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    tpk__v8i e = __builtin_convertvector(n, tpk__v8i), e1 = e >> 1, e2 = e - e1;
    p = p * (tpk__v8f)((e1 + 127) << 23) * (tpk__v8f)((e2 + 127) << 23);
    p = tpk__vsel(x > hi, tpk__vsplat(INFINITY), p);
    return tpk__vsel(x != x, x, p);
}
/* e^x of one float, the same bits as lane k of tpk__vexp */
TPK__HOST_INLINE float tpk__exp1(float x) { return tpk__vexp(tpk__vsplat(x))[0]; }

#endif
