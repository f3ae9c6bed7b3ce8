/* kernels/host/rng.c — the host backend's counter-based random numbers (tpk/base/rng.h:
 * Philox4x32-10).
 *
 *   rng_2d   x[i, j] = a + b draw(seed, stream, (row0 + i) gcols + col0 + j), normal or uniform
 *   dropout  y = x keep / (1-p),  keep = dropout_u(seed, stream, global index) >= p: one Philox
 *            call per 4 consecutive global indices, the masks of every backend
 * Rows over the pool's threads (pool.c): each element's draw depends on its index alone. With
 * AVX2, dropout runs Philox on 8 calls at once (philox8: the same draws, bit for bit). */
#include "host_private.h"

/* ---- counter-based random numbers ------------------------------------------------------------ */

typedef struct rng_job {
    tpk_dtype dt;
    void *y;
    const void *x;
    int64_t cols, gcols, row0, col0;
    uint64_t seed, stream;
    tpk_rng_dist dist;
    float a, b, p;
} rng_job;

TPK__HOST_INLINE void rng_loop(tpk_dtype dt, void *x, int64_t lo, int64_t hi, int64_t cols,
                               int64_t gcols, int64_t row0, int64_t col0, uint64_t seed,
                               uint64_t stream, tpk_rng_dist dist, float a, float b) {
    for (int64_t i = lo; i < hi; i++)
        for (int64_t j = 0; j < cols; j++) {
            uint64_t index = (uint64_t)(row0 + i) * (uint64_t)gcols + (uint64_t)(col0 + j);
            float draw = dist == TPK_RNG_NORMAL ? tpk_rng_normal(seed, stream, index)
                                                : tpk_rng_uniform(seed, stream, index);
            tpk__st(x, dt, (size_t)(i * cols + j), a + b * draw);
        }
}
static void rng_part(void *p, int64_t lo, int64_t hi) {
    const rng_job *j = (const rng_job *)p;
    TPK__BY_DTYPE(j->dt, rng_loop, j->y, lo, hi, j->cols, j->gcols, j->row0, j->col0, j->seed,
                  j->stream, j->dist, j->a, j->b);
}
static tpk_status host_rng_2d(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols,
                              int64_t gcols, int64_t row0, int64_t col0, uint64_t seed,
                              uint64_t stream, tpk_rng_dist dist, float a, float b) {
    (void)ctx;
    rng_job j = {dt, x, NULL, cols, gcols, row0, col0, seed, stream, dist, a, b, 0.0f};
    tpk__host_par(rows, 1 + 4096 / (cols ? cols : 1), rng_part, &j);
    return TPK_OK;
}

/* ---- dropout ------------------------------------------------------------------------------ */

/* Row i's elements j in [j0, cols) with their 4-draw Philox calls one at a time (the reference
 * loop, and every x86-64 machine without AVX2) */
TPK__HOST_INLINE void dropout_row(tpk_dtype dt, void *y, const void *x, int64_t i, int64_t cols,
                                  uint64_t g0, int64_t j0, float p, float scale, uint64_t seed,
                                  uint64_t stream) {
    tpk_f32x4 u = tpk_rng_uniform4(seed, stream, (g0 + (uint64_t)j0) >> 2);
    for (int64_t j = j0; j < cols; j++) {
        uint64_t g = g0 + (uint64_t)j;
        if (j > j0 && (g & 3) == 0) u = tpk_rng_uniform4(seed, stream, g >> 2); /* the next 4 */
        size_t k = (size_t)(i * cols + j);
        tpk__st(y, dt, k, u.v[g & 3] >= p ? tpk__ld(x, dt, k) * scale : 0.0f);
    }
}
TPK__HOST_INLINE void dropout_loop(tpk_dtype dt, void *y, const void *x, int64_t lo, int64_t hi,
                                   int64_t cols, int64_t gcols, int64_t row0, int64_t col0, float p,
                                   uint64_t seed, uint64_t stream) {
    float scale = 1.0f / (1.0f - p);
    for (int64_t i = lo; i < hi; i++)
        dropout_row(dt, y, x, i, cols, (uint64_t)((row0 + i) * gcols + col0), 0, p, scale, seed,
                    stream);
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#include <immintrin.h>
#define HAVE_PHILOX8 1
/* u[e] = the uniform of draw 4 q + e, e < 32: the 10 rounds of tpk_philox on calls q .. q + 7 at
 * once (the 32 x 32 -> 64-bit products of the even and the odd lanes apart), then the 4 words of
 * the 8 calls transposed into draw order */
__attribute__((target("avx2"))) static void philox8(uint64_t seed, uint64_t stream, uint64_t q,
                                                    float u[32]) {
    uint32_t lo[8], hi[8];
    for (int k = 0; k < 8; k++)
        lo[k] = (uint32_t)(q + (uint64_t)k), hi[k] = (uint32_t)((q + (uint64_t)k) >> 32);
    __m256i c0 = _mm256_loadu_si256((const __m256i *)lo),
            c1 = _mm256_loadu_si256((const __m256i *)hi),
            c2 = _mm256_set1_epi32((int)(uint32_t)stream),
            c3 = _mm256_set1_epi32((int)(uint32_t)(stream >> 32));
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u),
                  m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
        __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
        __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA),
                hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA),
                lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA),
                hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        c1 = lo1;
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
        c3 = lo0;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    /* c_w lane k = word w of call q + k; draw 4 k + w: a 4 x 8 transpose */
    __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1),
            t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    __m256i r0 = _mm256_unpacklo_epi64(t0, t2), r1 = _mm256_unpackhi_epi64(t0, t2),
            r2 = _mm256_unpacklo_epi64(t1, t3), r3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i d[4] = {
        _mm256_permute2x128_si256(r0, r1, 0x20), _mm256_permute2x128_si256(r2, r3, 0x20),
        _mm256_permute2x128_si256(r0, r1, 0x31), _mm256_permute2x128_si256(r2, r3, 0x31)};
    const __m256 s = _mm256_set1_ps(1.0f / 16777216.0f);
    for (int k = 0; k < 4; k++) /* (bits >> 8) 2^-24: tpk_rng_u24, exactly */
        _mm256_storeu_ps(u + 8 * k,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(d[k], 8)), s));
}
/* the rows with 8 Philox calls (32 draws) at a time: the same draws, so the same bits */
__attribute__((target("avx2"))) static void dropout_rows8(tpk_dtype dt, void *y, const void *x,
                                                          int64_t lo, int64_t hi, int64_t cols,
                                                          int64_t gcols, int64_t row0, int64_t col0,
                                                          float p, uint64_t seed, uint64_t stream) {
    float scale = 1.0f / (1.0f - p), u[32];
    const __m256 vp = _mm256_set1_ps(p), vs = _mm256_set1_ps(scale);
    for (int64_t i = lo; i < hi; i++) {
        uint64_t g0 = (uint64_t)((row0 + i) * gcols + col0), end = g0 + (uint64_t)cols;
        for (uint64_t q = g0 >> 2; 4 * q < end; q += 8) {
            philox8(seed, stream, q, u);
            uint64_t e0 = 4 * q > g0 ? 4 * q : g0, e1 = 4 * q + 32 < end ? 4 * q + 32 : end;
            size_t k0 = (size_t)(i * cols + (int64_t)(e0 - g0));
            if (dt == TPK_F32 && e1 - e0 == 32) { /* a whole block: y = u >= p ? x scale : 0 */
                for (int v = 0; v < 4; v++) {
                    __m256 xv = _mm256_loadu_ps((const float *)x + k0 + 8 * v),
                           keep = _mm256_cmp_ps(_mm256_loadu_ps(u + 8 * v), vp, _CMP_GE_OQ);
                    _mm256_storeu_ps((float *)y + k0 + 8 * v,
                                     _mm256_and_ps(keep, _mm256_mul_ps(xv, vs)));
                }
                continue;
            }
            for (uint64_t e = e0; e < e1; e++) {
                size_t k = k0 + (size_t)(e - e0);
                tpk__st(y, dt, k, u[e - 4 * q] >= p ? tpk__ld(x, dt, k) * scale : 0.0f);
            }
        }
    }
}
#endif

/* u[j] = tpk_dropout_u(seed, stream, x0 + j) for j < n (host_private.h; the attention's mask) */
void tpk__host_dropout_u(uint64_t seed, uint64_t stream, uint64_t x0, int64_t n, float *u) {
    uint64_t end = x0 + (uint64_t)n, q = x0 >> 2;
#ifdef HAVE_PHILOX8
    if (__builtin_cpu_supports("avx2")) {
        float d[32];
        for (; 4 * q < end; q += 8) {
            philox8(seed, stream, q, d);
            for (uint64_t e = 4 * q > x0 ? 4 * q : x0; e < end && e < 4 * q + 32; e++)
                u[e - x0] = d[e - 4 * q];
        }
        return;
    }
#endif
    for (; 4 * q < end; q++) {
        tpk_f32x4 d = tpk_rng_uniform4(seed, stream, q);
        for (uint64_t e = 4 * q > x0 ? 4 * q : x0; e < end && e < 4 * q + 4; e++)
            u[e - x0] = d.v[e - 4 * q];
    }
}

static void dropout_part(void *p, int64_t lo, int64_t hi) {
    const rng_job *j = (const rng_job *)p;
#ifdef HAVE_PHILOX8
    if (__builtin_cpu_supports("avx2")) {
        dropout_rows8(j->dt, j->y, j->x, lo, hi, j->cols, j->gcols, j->row0, j->col0, j->p, j->seed,
                      j->stream);
        return;
    }
#endif
    TPK__BY_DTYPE(j->dt, dropout_loop, j->y, j->x, lo, hi, j->cols, j->gcols, j->row0, j->col0,
                  j->p, j->seed, j->stream);
}
static tpk_status host_dropout(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols,
                               int64_t gcols, int64_t row0, int64_t col0, float p, uint64_t seed,
                               uint64_t stream, tpk_dtype dt) {
    (void)ctx;
    rng_job j = {dt, y, x, cols, gcols, row0, col0, seed, stream, TPK_RNG_UNIFORM, 0, 0, p};
    tpk__host_par(rows, 1 + 4096 / (cols ? cols : 1), dropout_part, &j);
    return TPK_OK;
}

/* this file's entries of the host table (table.c) */
void tpk__host_rng_ops(tpk_ops *o) {
    o->rng_2d = host_rng_2d;
    o->dropout = host_dropout;
}
