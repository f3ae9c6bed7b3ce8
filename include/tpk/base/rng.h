/* tpk/base/rng.h — the counter-based random number generator shared by every backend.
 *
 * Philox4x32-10 (Salmon et al., SC'11): a bijection of a 128-bit counter under a 64-bit key.
 * A draw is a pure function of (seed, stream, index):
 *   key     = seed
 *   counter = (index lo, index hi, stream lo, stream hi)
 * so element i of a tensor has the same value whichever rank draws it and whichever backend
 * runs. Parameters use stream = tpk_rng_stream(name); dropout uses a stream per call site.
 * With bits = philox(seed, stream, index):
 *   uniform(i) = (bits0 >> 8) * 2^-24                     in [0, 1)   (tpk_rng_uniform, rng_2d)
 *   normal(i)  = sqrt(-2 ln u1) cos(2 pi u2), u1 = (bits0 >> 8 + 1) 2^-24, u2 = (bits1 >> 8) 2^-24
 * Dropout masks (plain and residual dropout, the attention's keep_ij) use all four outputs of a
 * call, one Philox call per four consecutive indices:
 *   dropout_u(i) = (philox(seed, stream, i / 4).v[i % 4] >> 8) * 2^-24     in [0, 1)
 * (tpk_dropout_u; tpk_rng_uniform4 gives the four of indices 4q .. 4q + 3 at once), kept when
 * dropout_u(i) >= p. Every backend draws its masks through these two functions.
 * Compiles as C and, with TPK_HD = __host__ __device__, as CUDA. */
#ifndef TPK_RNG_H
#define TPK_RNG_H

#include <math.h>
#include <stdint.h>

#ifndef TPK_HD
#if defined(__CUDACC__)
#define TPK_HD __host__ __device__
#else
#define TPK_HD
#endif
#endif

typedef struct tpk_u32x4 { uint32_t v[4]; } tpk_u32x4;

TPK_HD static inline tpk_u32x4 tpk_philox(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32), c2 = (uint32_t)stream,
             c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    tpk_u32x4 r = {{c0, c1, c2, c3}};
    return r;
}

TPK_HD static inline float tpk_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (float)(tpk_philox(seed, stream, index).v[0] >> 8) * (1.0f / 16777216.0f);
}

/* The dropout draws (see above): the uniforms of indices 4 q .. 4 q + 3, and of index i alone. */
typedef struct tpk_f32x4 { float v[4]; } tpk_f32x4;
TPK_HD static inline float tpk_rng_u24(uint32_t bits) {
    return (float)(bits >> 8) * (1.0f / 16777216.0f);
}
TPK_HD static inline tpk_f32x4 tpk_rng_uniform4(uint64_t seed, uint64_t stream, uint64_t q) {
    tpk_u32x4 b = tpk_philox(seed, stream, q);
    tpk_f32x4 r = {
        {tpk_rng_u24(b.v[0]), tpk_rng_u24(b.v[1]), tpk_rng_u24(b.v[2]), tpk_rng_u24(b.v[3])}};
    return r;
}
/* word i % 4 picked with selects, not an array index: a GPU kernel keeps it in registers */
TPK_HD static inline float tpk_dropout_u(uint64_t seed, uint64_t stream, uint64_t i) {
    tpk_u32x4 b = tpk_philox(seed, stream, i >> 2);
    uint32_t lo = (i & 1) ? b.v[1] : b.v[0], hi = (i & 1) ? b.v[3] : b.v[2];
    return tpk_rng_u24((i & 2) ? hi : lo);
}

TPK_HD static inline float tpk_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    tpk_u32x4 b = tpk_philox(seed, stream, index);
    double u1 = ((double)(b.v[0] >> 8) + 1.0) * (1.0 / 16777216.0); /* (0, 1] */
    double u2 = (double)(b.v[1] >> 8) * (1.0 / 16777216.0);         /* [0, 1) */
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* 64-bit FNV-1a of a name: the stream of a parameter. */
TPK_HD static inline uint64_t tpk_rng_stream(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *name; name++) h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
    return h;
}

#endif /* TPK_RNG_H */
