/* tpk/base/ops.h — the compute backend interface: a table of kernels over raw buffers.
 *
 * tpk_ops_host() (tpk/runtime/host.h; build/libtpk_host.a, OpenBLAS + plain C) and tpk_ops_cuda()
 * (tpk/runtime/cuda.h; build/libtpk_cuda.a) fill the same table with the same contract, so one
 * layer runs on either and a test can compare them. A user may fill a table with their own kernels.
 * All matrices are row-major; leading dimensions are in elements. Buffers are in the
 * backend's memory (`device`); memcpy moves between host and backend memory.
 * Every entry reports failure as a status and a message in ctx (tpk__fail). Callers go through
 * the checked front end, tpk_op_<name>(ctx, ...) in tpk/runtime/op.h, which validates the arguments
 * before an entry is called: an entry may assume them valid. */
#ifndef TPK_OPS_H
#define TPK_OPS_H

#include <math.h>

#include "core.h"
#include "rng.h" /* TPK_HD: the functions below serve the host and the device */

typedef struct tpk_ctx tpk_ctx;

typedef enum tpk_copy_dir { TPK_H2D = 0, TPK_D2H, TPK_D2D, TPK_H2H } tpk_copy_dir;
typedef enum tpk_rng_dist { TPK_RNG_NORMAL = 0, TPK_RNG_UNIFORM = 1 } tpk_rng_dist;

/* Elementwise activations (act_fwd, act_bwd, linear_fwd):
 *   TPK_ACT_NONE       y = x                                          dx = dy
 *   TPK_ACT_GELU_TANH  y = x/2 (1 + tanh(s (x + c x^3))), s = sqrt(2/pi), c = 0.044715 (GPT-2)
 *                      dx = dy (1/2 (1 + t) + x/2 (1 - t^2) s (1 + 3 c x^2)), t = tanh(s (x + c
 *                      x^3))
 *   TPK_ACT_GELU       y = x Phi(x) = x/2 (1 + erf(x / sqrt 2))  (the exact GELU: GPT-NeoX, BERT)
 *                      dx = dy (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 * New activations (SiLU, gated units) take the next values. */
typedef enum tpk_act {
    TPK_ACT_NONE = 0,
    TPK_ACT_GELU_TANH = 1,
    TPK_ACT_GELU = 2,
    TPK_ACT_COUNT
} tpk_act;
static inline const char *tpk_act_name(tpk_act a) {
    return a == TPK_ACT_NONE        ? "none"
           : a == TPK_ACT_GELU_TANH ? "gelu_tanh"
           : a == TPK_ACT_GELU      ? "gelu"
                                    : "?";
}

/* Grouped-query attention: the key/value heads [*g0, *g0 + Gl) read by the query heads
 * [head0, head0 + Al) of A when there are G key/value heads (G divides A); returns Gl. */
static inline int64_t tpk_attn_kv_heads(int64_t A, int64_t G, int64_t head0, int64_t Al,
                                        int64_t *g0) {
    int64_t q = G > 0 && A % G == 0 ? A / G : 1;
    if (g0) *g0 = head0 / q;
    return Al > 0 ? (head0 + Al - 1) / q - head0 / q + 1 : 0;
}

/* The factor that clips a gradient of norm N to `clip` (1 when clip <= 0 or N is within it): one
 * expression for the host (tpk_clip_factor) and every backend's adamw, device code included. */
#define TPK__CLIP_FACTOR(N, clip) \
    ((clip) > 0 && (N) > (double)(clip) ? (float)((double)(clip) / (N)) : 1.0f)

/* Row t's loss (*loss; 0 when skip: an ignored target) and lse (returned) from the P ranks'
 * statistics part [P, T, 4] of xent_stats: M = max_r m_r, lse = M + log sum_r s_r e^(m_r - M)
 * (ranks with no columns, s = 0, add nothing), in double, r ascending — xent_loss's and
 * xent_fused's arithmetic on every backend. */
TPK_HD static inline float tpk__xent_loss_row(float *loss, const float *part, int64_t P, int64_t T,
                                              int64_t t, bool skip, int64_t V, float eps) {
    float M = -INFINITY;
    for (int64_t r = 0; r < P; r++) M = fmaxf(M, part[4 * (r * T + t)]);
    double S = 0, zy = 0, sz = 0;
    for (int64_t r = 0; r < P; r++) {
        const float *q = part + 4 * (r * T + t);
        if (q[1] > 0) S += (double)q[1] * exp((double)q[0] - (double)M);
        zy += q[2], sz += q[3];
    }
    double l = (double)M + log(S);
    *loss = skip ? 0.0f : (float)(l - (1.0 - eps) * zy - eps * sz / (double)V);
    return (float)l;
}

/* FP8 formats (fp8_quant, fp8_dequant, gemm_fp8): one byte per element, sign | exponent | mantissa.
 *   TPK_E4M3  OCP's E4M3FN: bias 7, 3 mantissa bits, max 448, no infinities, NaN = S.1111.111
 *             (weights and activations)
 *   TPK_E5M2  bias 15, 2 mantissa bits, max 57344, infinities S.11111.00, NaN S.11111.{01,10,11}
 *             (gradients)
 * Exponent field 0: subnormal, M 2^(1 - bias - mbits). */
typedef enum tpk_fp8_fmt { TPK_E4M3 = 0, TPK_E5M2 = 1 } tpk_fp8_fmt;
TPK_HD static inline float tpk_fp8_max(tpk_fp8_fmt f) { return f == TPK_E4M3 ? 448.0f : 57344.0f; }
/* f32 -> FP8 rounded to nearest even and saturated: |x| >= max (infinity too) gives +-max, NaN
 * the code 0x7F (a NaN in both formats), a value that rounds to zero keeps its sign — what the
 * saturating casts of the scaled FP8 recipes do (cvt.rn.satfinite). One definition for every
 * backend. */
TPK_HD static inline uint8_t tpk_f32_to_fp8(float x, tpk_fp8_fmt f) {
    int mb = f == TPK_E4M3 ? 3 : 2, bias = f == TPK_E4M3 ? 7 : 15;
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    float af;
    memcpy(&af, &a, 4);
    if (af >= tpk_fp8_max(f)) return (uint8_t)(s | (f == TPK_E4M3 ? 0x7eu : 0x7bu));
    int e = (int)(a >> 23) - 127, emin = 1 - bias;
    int ef = e < -126 ? -126 : e; /* an f32 subnormal's exponent */
    uint32_t sig = (a & 0x7fffffu) | (e > -127 ? 0x800000u : 0u);
    int qe = (e < emin ? emin : e) - mb, sh = qe - (ef - 23); /* sh > 0: the bits dropped */
    uint32_t q = 0;
    if (sh <= 25) { /* round sig / 2^sh to nearest even */
        uint32_t rem = sig & ((1u << sh) - 1u), half = 1u << (sh - 1);
        q = sig >> sh;
        if (rem > half || (rem == half && (q & 1u))) q++;
    }
    /* q counts quanta of 2^qe, the leading bit included: a carry into the exponent and a
     * subnormal that rounds up to the least normal come out right */
    uint32_t code = ((uint32_t)((e < emin ? emin : e) + bias - 1) << mb) + q; /* subnormal: q */
    return (uint8_t)(s | code);
}
/* FP8 -> f32, exact */
TPK_HD static inline float tpk_fp8_to_f32(uint8_t c, tpk_fp8_fmt f) {
    int mb = f == TPK_E4M3 ? 3 : 2, bias = f == TPK_E4M3 ? 7 : 15;
    uint32_t s = (uint32_t)(c & 0x80u) << 24, E = (c & 0x7fu) >> mb, M = c & ((1u << mb) - 1u);
    uint32_t u;
    if (f == TPK_E4M3 && (c & 0x7fu) == 0x7fu) u = 0x7fc00000u;
    else if (f == TPK_E5M2 && E == 31) u = M ? 0x7fc00000u : 0x7f800000u;
    else if (E == 0 && M == 0) u = 0;
    else if (E == 0) { /* subnormal: normalise */ int e = 1 - bias;
        while (!(M & (1u << mb))) M <<= 1, e--;
        u = ((uint32_t)(e + 127) << 23) | ((M & ((1u << mb) - 1u)) << (23 - mb));
    } else {
        u = ((uint32_t)((int)E - bias + 127) << 23) | (M << (23 - mb));
    }
    u |= s;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* Every entry of tpk_ops by name, in three lists (X(entry) each); the backends fill their tables
 * from them (o->entry = <backend>_entry), so a new op is named in one place.
 *   TPK__OPS_CORE    required: tpk_ctx_init refuses a table without one of them (tpk__ops_missing);
 *                    its first four, TPK__OPS_MEMORY, are all a dry-run table needs (dry_run);
 *   TPK__OPS_LAYERS  the layers' ops: a user's table may leave those its layers do not use NULL,
 *                    and a call of a NULL one fails naming it (TPK_ERR_UNSUPPORTED);
 *   TPK__OPS_FUSED   the fusions: a backend fills those it really fuses and leaves the others NULL,
 *                    and the front end (tpk/runtime/op.h) composes a NULL one from the entries
 *                    above, once for every backend. */
#define TPK__OPS_MEMORY(X) X(alloc) X(free) X(memcpy) X(sync)
#define TPK__OPS_CORE(X)                                                                          \
    TPK__OPS_MEMORY(X)                                                                            \
    X(fill)                                                                                       \
    X(copy2d) X(cast) X(axpby) X(gemm) X(gemm_acc) X(bias_add) X(bias_grad) X(act_fwd) X(act_bwd) \
        X(rng_2d) X(adamw) X(sumsq)
#define TPK__OPS_LAYERS(X)                                                                      \
    X(dropout)                                                                                  \
    X(layernorm_fwd)                                                                            \
    X(layernorm_bwd) X(embed_fwd) X(embed_bwd) X(xent_stats) X(xent_loss) X(xent_mean)          \
        X(xent_grad) X(attn_fwd) X(attn_bwd) X(rope) X(swiglu_fwd) X(swiglu_bwd) X(rmsnorm_fwd) \
            X(rmsnorm_bwd) X(attn_block_fwd) X(attn_block_bwd) X(rope_at) X(fp8_quant)          \
                X(fp8_dequant) X(gemm_fp8) X(gemm_grouped) X(gather_rows) X(scatter_add_rows)   \
                    X(moe_combine_fwd) X(moe_combine_bwd)
#define TPK__OPS_FUSED(X) X(linear_fwd) X(linear_bwd_act) X(residual_layernorm_fwd) X(xent_fused)

/* One block of an attention split over the sequence (attn_block_fwd, attn_block_bwd; context
 * parallelism, tpk/layers/cp_attn.h): Sq query rows at sequence positions q0 + i against Sk
 * key/value rows at positions k0 + j, of one sequence. Key j is visible to query i when !causal or
 * k0 + j <= q0 + i. Heads as attn_fwd's: Al query heads [head0, head0 + Al) of A, reading the Gl
 * key/value heads [g0, g0 + Gl) (tpk_attn_kv_heads) of G. Leading dimensions (elements): ldq of q
 * (query head h at column h D), lddq of dq, ldkv of kv and dkv (K of local key/value head g at
 * column g D, V at column (Gl + g) D), ldo of out and dout (head h at column h D), ldl of lse
 * (head h's row at h ldl). Dropout (p > 0) on the probabilities by attn_fwd's masks: P_ij of
 * global head g = head0 + h is kept when dropout_u(seed, stream, ((b A + g) S + q0 + i) S + k0 + j)
 * >= p (b the sequence's batch index, S its whole length), so the mask of a (query, key) pair does
 * not depend on how the sequence is split into blocks. */
typedef struct tpk_attn_blk {
    int64_t Sq, Sk;  /* query rows, key/value rows */
    int64_t q0, k0;  /* the sequence positions of the first of each */
    bool causal;     /* mask keys after the query's position; false: every key visible */
    int64_t Al, D, A, G, head0;
    float scale;     /* s_ij = scale q_i . k_j */
    int64_t ldq, lddq, ldkv, ldo, ldl;
    float p;               /* dropout probability on P (0: none) */
    uint64_t seed, stream; /* attn_fwd's */
    int64_t b, S;          /* the batch index of the sequence, its whole length (p > 0) */
} tpk_attn_blk;

typedef struct tpk_ops {
    const char *name;
    void *self;  /* backend state (handles, streams) */
    bool device; /* buffers live in device memory */

    /* memory */
    tpk_status (*alloc)(tpk_ctx *ctx, size_t bytes, void **out); /* zero-filled */
    void (*free)(tpk_ctx *ctx, void *p);
    tpk_status (*memcpy)(tpk_ctx *ctx, void *dst, const void *src, size_t bytes, tpk_copy_dir dir);
    tpk_status (*sync)(tpk_ctx *ctx);

    /* x[0..n) = value */
    tpk_status (*fill)(tpk_ctx *ctx, void *x, tpk_dtype dt, size_t n, float value);
    /* dst[i, j] = src[i, j] for i < rows, j < cols; ldd, lds in elements */
    tpk_status (*copy2d)(tpk_ctx *ctx, void *dst, int64_t ldd, const void *src, int64_t lds,
                         int64_t rows, int64_t cols, tpk_dtype dt);
    /* dst[i] = (dst dtype) src[i]; f32 -> bf16 rounds to nearest even */
    tpk_status (*cast)(tpk_ctx *ctx, void *dst, tpk_dtype dst_dt, const void *src, tpk_dtype src_dt,
                       size_t n);
    /* y[i] = a * x[i] + b * y[i]; b = 0 ignores y (NaN in y does not leak) */
    tpk_status (*axpby)(tpk_ctx *ctx, void *y, float a, const void *x, float b, tpk_dtype dt,
                        size_t n);

    /* C[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * C; op = transpose when ta / tb.
     * A is [m, k] (or [k, m] when ta), B is [k, n] (or [n, k] when tb). beta = 0 ignores C;
     * k = 0 or alpha = 0 gives C = beta C without reading A or B. */
    tpk_status (*gemm)(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c,
                       int64_t ldc, tpk_dtype dt);
    /* gemm with an f32 C whatever dt is: C_f32[m, n] = alpha op(A) op(B) + beta C_f32, A and B in
     * dt, f32 accumulation, C neither read nor written in bf16 (no rounding). A weight gradient of
     * a bf16 model added straight into the f32 gradient (beta = 1; Megatron's gradient-accumulation
     * fusion). Same shapes and rules as gemm; with dt = f32 it is gemm. */
    tpk_status (*gemm_acc)(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                           float beta, float *c, int64_t ldc, tpk_dtype dt);
    /* y[i, j] += bias[j]  for y [rows, cols] */
    tpk_status (*bias_add)(tpk_ctx *ctx, void *y, const void *bias, int64_t rows, int64_t cols,
                           tpk_dtype dt);
    /* db[j] = sum_i dy[i, j] + (accumulate ? db[j] : 0)  for dy [rows, cols] in dt; db in db_dt:
     * dt, or TPK_F32 (a bf16 layer's bias gradient added straight into the f32 gradients) */
    tpk_status (*bias_grad)(tpk_ctx *ctx, void *db, const void *dy, int64_t rows, int64_t cols,
                            tpk_dtype dt, tpk_dtype db_dt, bool accumulate);
    /* y = act(x) elementwise (tpk_act above); y may alias x */
    tpk_status (*act_fwd)(tpk_ctx *ctx, tpk_act act, void *y, const void *x, tpk_dtype dt,
                          size_t n);
    /* dx = dy * act'(x); dx may alias dy; with TPK_ACT_NONE, dx = dy and x is not read (may be
     * NULL) */
    tpk_status (*act_bwd)(tpk_ctx *ctx, tpk_act act, void *dx, const void *x, const void *dy,
                          tpk_dtype dt, size_t n);

    /* Counter-based random numbers (tpk/base/rng.h): x[i, j] = a + b * draw(seed, stream,
     * index = (row0 + i) * gcols + col0 + j) for x [rows, cols], contiguous. NORMAL draws are
     * N(0,1), UNIFORM draws are in [0, 1). The value depends only on (seed, stream, index),
     * so a shard draws exactly its slice of the unsharded tensor. */
    tpk_status (*rng_2d)(tpk_ctx *ctx, void *x, tpk_dtype dt, int64_t rows, int64_t cols,
                         int64_t gcols, int64_t row0, int64_t col0, uint64_t seed, uint64_t stream,
                         tpk_rng_dist dist, float a, float b);
    /* y = x * keep / (1 - p), keep = (dropout_u(seed, stream, (row0 + i) * gcols + col0 + j) >= p)
     * for x, y [rows, cols] contiguous; y may alias x. The same call on dy gives dx. dropout_u
     * (tpk/base/rng.h, tpk_dropout_u): index k takes output k % 4 of Philox call k / 4. */
    tpk_status (*dropout)(tpk_ctx *ctx, void *y, const void *x, int64_t rows, int64_t cols,
                          int64_t gcols, int64_t row0, int64_t col0, float p, uint64_t seed,
                          uint64_t stream, tpk_dtype dt);

    /* Layernorm over the last dim of x [rows, cols]: mean, rstd = 1/sqrt(var + eps) (f32 [rows],
     * saved for backward), y = (x - mean) rstd w + b with w, b f32 [cols]. */
    tpk_status (*layernorm_fwd)(tpk_ctx *ctx, void *y, float *mean, float *rstd, const void *x,
                                const float *w, const float *b, int64_t rows, int64_t cols,
                                float eps, tpk_dtype dt);
    /* xh = (x - mean) rstd, g = dy w:  dx (+)= rstd (g - mean_j(g) - xh mean_j(g xh));
     * dw += sum_i dy xh, db += sum_i dy (f32). accumulate_dx adds into dx. */
    tpk_status (*layernorm_bwd)(tpk_ctx *ctx, void *dx, float *dw, float *db, const void *dy,
                                const void *x, const float *w, const float *mean, const float *rstd,
                                int64_t rows, int64_t cols, tpk_dtype dt, bool accumulate_dx);

    /* Rows [v0, v0 + vrows) of a table E f32 [vrows, H]: y[t] (+)= E[ids[t] - v0] where ids[t] is
     * in range, else 0 (unchanged with accumulate). y [T, H]; ids i32 [T] in backend memory. */
    tpk_status (*embed_fwd)(tpk_ctx *ctx, void *y, const int32_t *ids, const float *table,
                            int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt,
                            bool accumulate);
    /* dE[ids[t] - v0] += dy[t] for ids in range, in token order (deterministic). */
    tpk_status (*embed_bwd)(tpk_ctx *ctx, float *dtable, const void *dy, const int32_t *ids,
                            int64_t T, int64_t H, int64_t v0, int64_t vrows, tpk_dtype dt);

    /* Cross-entropy over logits z [T, ld] whose first Vl columns hold global columns [v0, v0 + Vl)
     * of V (columns Vl..ld-1: a padded vocabulary's padding, ignored; ld >= Vl):
     * xent_stats:   part[t] = (m = max_j z[t,j], s = sum_j exp(z[t,j] - m), z[t, y_t - v0] or 0,
     *               sum_j z[t,j])  f32 [T, 4], from one read of z; (-inf, 0, 0, 0) when Vl = 0
     * xent_loss:    from the P ranks' stats of each row, part f32 [P, T, 4] in rank order (P = 1:
     * one
     *               rank holds all of V): M = max_r m_r, lse = M + log sum_r s_r exp(m_r - M) (in
     *               double, r ascending); loss[t] = lse - (1-eps) sum_r zy_r - eps sum_r sz_r / V
     *               (0 where y_t == ignore_index), lse saved f32 [T]
     * xent_mean:    m = (float)(sum_{t<T} loss[t] / count), the sum in double in an order fixed by
     *               T alone (the host: t ascending; a device: a fixed tree), m = 0 when count = 0;
     *               count >= 0 the positions counted: this call's rows', or under context
     *               parallelism every CP rank's (may exceed T: each rank's m its share of the
     *               mean);
     *               *acc (f64, one element in backend memory) = (accumulate ? *acc : 0) +
     *               (double)m: the mean loss of a forward, or a running sum of them, left in
     *               backend memory for the host to read when it asks (no host wait here)
     * xent_grad:    dz = (exp(z - lse) - (1-eps) [j == y_t - v0] - eps / V) dloss[t]
     *               (0 where y_t == ignore_index; 0 in the padding columns); dz [T, ld] may alias
     *               z.
     * xent_fused:   one rank holding all V columns (v0 = 0, Vl = V): xent_stats, xent_loss (P = 1)
     *               and xent_grad with dloss[t] = g, row by row — the logits read once and the
     *               gradient written once — equal bit for bit to the three ops in turn; dz may
     *               alias z. */
    tpk_status (*xent_stats)(tpk_ctx *ctx, float *part, const void *z, const int32_t *targets,
                             int64_t T, int64_t Vl, int64_t ld, int64_t v0, tpk_dtype dt);
    tpk_status (*xent_loss)(tpk_ctx *ctx, float *loss, float *lse, const float *part, int64_t P,
                            const int32_t *targets, int64_t T, int64_t V, float smoothing,
                            int32_t ignore_index);
    tpk_status (*xent_mean)(tpk_ctx *ctx, double *acc, const float *loss, int64_t T, int64_t count,
                            bool accumulate);
    tpk_status (*xent_grad)(tpk_ctx *ctx, void *dz, const void *z, const float *lse,
                            const int32_t *targets, const float *dloss, int64_t T, int64_t Vl,
                            int64_t ld, int64_t v0, int64_t V, float smoothing,
                            int32_t ignore_index, tpk_dtype dt);
    tpk_status (*xent_fused)(tpk_ctx *ctx, void *dz, float *loss, float *lse, const void *z,
                             const int32_t *targets, int64_t T, int64_t V, int64_t ld,
                             float smoothing, int32_t ignore_index, float g, tpk_dtype dt);

    /* Causal self-attention, grouped-query: A query heads and G key/value heads of size D (G
     * divides A; query head a reads key/value head a / (A/G); G = A is multi-head attention).
     * This call holds the Al query heads [head0, head0 + Al) and the Gl key/value heads they read,
     * [g0, g0 + Gl) (tpk_attn_kv_heads). qkv [B*S, (Al + 2 Gl) D]: Q in columns [0, Al D), K in
     * [Al D, (Al + Gl) D), V in [(Al + Gl) D, (Al + 2 Gl) D), local head h at offset h D of its
     * block; a shared key/value head is read in place, never copied.
     * s_ij = scale q_i . k_j for j <= i;  P = softmax_j(s);  lse f32 [B, Al, S] saved;
     * dropout (p > 0): P_ij kept when dropout_u(seed, stream, ((b*A + head0 + h)*S + i)*S + j) >=
     * p, scaled by 1/(1-p), so a head's mask does not depend on the rank that holds it.
     * out [B*S, Al*D] = P V per head. Backward recomputes P from lse:
     * dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO o O)), dQ = scale dS K, dK = scale dS^T Q;
     * dqkv has qkv's layout, and the dK, dV of a key/value head are the sums over the local query
     * heads that read it (in a fixed order: deterministic). */
    tpk_status (*attn_fwd)(tpk_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B,
                           int64_t S, int64_t Al, int64_t D, int64_t A, int64_t G, int64_t head0,
                           float scale, float p, uint64_t seed, uint64_t stream, tpk_dtype dt);
    tpk_status (*attn_bwd)(tpk_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                           const void *out, const float *lse, int64_t B, int64_t S, int64_t Al,
                           int64_t D, int64_t A, int64_t G, int64_t head0, float scale, float p,
                           uint64_t seed, uint64_t stream, tpk_dtype dt);

    /* Attention of one block (tpk_attn_blk b), whose partial results merge by their
     * log-sum-exp into the attention over every block (tpk/layers/cp_attn.h):
     *   s_ij = scale q_i . k_j on the visible keys;  lse_i = log sum_j exp(s_ij) (-inf: no key
     *   visible; of the undropped softmax);  o_i = sum_j exp(s_ij - lse_i) keep_ij v_j (0: none),
     *   keep_ij = 1, or 0 or 1/(1-p) by b's dropout mask.
     * attn_block_fwd: q [Sq, ldq] and kv [Sk, ldkv] in dt; out f32 [Sq, ldo], lse f32 [Al, ldl].
     *   merge = false: out, lse = o, lse of this block. merge = true: out, lse hold the attention
     *   over other keys (o', lse') and become that over both, L = log(e^lse' + e^lse),
     *   out = e^(lse' - L) o' + e^(lse - L) o (a side at -inf adds nothing).
     * attn_block_bwd: with lse (as above) and out [Sq, ldo] (in dt) the whole attention's, over
     *   every block, and dout [Sq, ldo] in dt: P_ij = exp(s_ij - lse_i) on the visible keys,
     *   dP = dout V^T, dS = P (dP keep - rowsum(dout o out)); adds dq += scale dS K into dq f32
     *   [Sq, lddq] (the query heads' columns) and dK += scale dS^T Q, dV += (P keep)^T dout into
     *   dkv f32 [Sk, ldkv] (a key/value head's: the sum over the local query heads that read it,
     *   in a fixed order). Summed over the blocks of all keys, dq is the attention's dQ and each
     *   block's dkv its dK, dV. */
    tpk_status (*attn_block_fwd)(tpk_ctx *ctx, float *out, float *lse, const void *q,
                                 const void *kv, const tpk_attn_blk *b, bool merge, tpk_dtype dt);
    tpk_status (*attn_block_bwd)(tpk_ctx *ctx, float *dq, float *dkv, const void *dout,
                                 const void *out, const float *lse, const void *q, const void *kv,
                                 const tpk_attn_blk *b, tpk_dtype dt);

    /* Rotary position embedding (Hugging Face Llama's rotate-half convention) on `heads` heads of
     * size D (even) in each row of x [rows, ldx] (heads at columns h D), into y [rows, ldy] (y may
     * be x when ldy = ldx). Row i is at position s = i mod S (rows are [B, S] flattened). For
     * j < D/2, f_j = theta^(-2j/D), angle s f_j (computed in double), c = cos, n = sin:
     *   y[j] = x[j] c - x[j + D/2] n,  y[j + D/2] = x[j + D/2] c + x[j] n;
     * inverse: the rotation by -angle (the transpose: backward maps dy to dx with it). */
    tpk_status (*rope)(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx, int64_t rows,
                       int64_t S, int64_t heads, int64_t D, float theta, bool inverse,
                       tpk_dtype dt);
    /* The same rotation at positions read from a table: row i at position pos[i mod npos] (pos:
     * npos >= 1 int32 entries >= 0 in backend memory), so rope is rope_at with pos[s] = s,
     * npos = S. Context parallelism's rows at their true positions (a rank's rows of a sequence
     * are two chunks of it, tpk_cp_positions: npos = S / c). */
    tpk_status (*rope_at)(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                          int64_t rows, const int32_t *pos, int64_t npos, int64_t heads, int64_t D,
                          float theta, bool inverse, tpk_dtype dt);

    /* SwiGLU: gu [rows, 2F] holds gate in columns [0, F) and up in [F, 2F);
     * swiglu_fwd: h [rows, F] = silu(gate) up,  silu(x) = x sigmoid(x);
     * swiglu_bwd: dgate = dh up sigmoid(gate) (1 + gate (1 - sigmoid(gate))),  dup = dh silu(gate),
     *             into dgu [rows, 2F] (gu's layout; dgu may be gu). */
    tpk_status (*swiglu_fwd)(tpk_ctx *ctx, void *h, const void *gu, int64_t rows, int64_t F,
                             tpk_dtype dt);
    tpk_status (*swiglu_bwd)(tpk_ctx *ctx, void *dgu, const void *gu, const void *dh, int64_t rows,
                             int64_t F, tpk_dtype dt);

    /* RMSNorm over the last dim of x [rows, cols]: rstd = 1/sqrt(mean_j(x^2) + eps) (f32 [rows],
     * saved), y = x rstd w (w f32 [cols]). Backward, xh = x rstd, g = dy w:
     * dx (+)= rstd (g - xh mean_j(g xh)), dw += sum_i dy xh (f32). accumulate_dx adds into dx. */
    tpk_status (*rmsnorm_fwd)(tpk_ctx *ctx, void *y, float *rstd, const void *x, const float *w,
                              int64_t rows, int64_t cols, float eps, tpk_dtype dt);
    tpk_status (*rmsnorm_bwd)(tpk_ctx *ctx, void *dx, float *dw, const void *dy, const void *x,
                              const float *w, const float *rstd, int64_t rows, int64_t cols,
                              tpk_dtype dt, bool accumulate_dx);

    /* AdamW on n f32 elements (step >= 1; g is read as g * s):
     *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
     *   w -= lr (m / (1 - b1^step) / (sqrt(v / (1 - b2^step)) + eps) + wd_i w)
     * wd_i = wd on the elements of the runs [decay[2r], decay[2r+1]), r < nruns (backend memory;
     * sorted, disjoint, within [0, n): e.g. the 2-D weights of a flat parameter buffer), else 0;
     * decay = NULL: wd on every element. One call covers a whole parameter buffer.
     * norm = NULL: s = grad_scale. Otherwise norm f64 [2] in backend memory, norm[0] the sum of
     * squares of the gradient (sumsq, left there: the host does not wait for it): N =
     * sqrt(norm[0]) grad_scale; N not finite: nothing is written and norm[1] += 1 (a skipped
     * step); else s = grad_scale (clip > 0 && N > clip ? (float)(clip / N) : 1) — clipping
     * without a host wait. w16 (NULL: none): bf16 [n] that receives each updated weight rounded to
     * nearest even (a bf16 context's copy of the master weights, made in the same pass); a
     * skipped step writes nothing there either. */
    tpk_status (*adamw)(tpk_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n,
                        float lr, float b1, float b2, float eps, float wd, int64_t step,
                        float grad_scale, double *norm, float clip, const int64_t *decay,
                        int64_t nruns, uint16_t *w16);
    /* *out (f64 in backend memory) = (accumulate ? *out : 0) + sum_i x[i]^2 over n f32 elements
     * (n may be 0), accumulated in double; no host wait */
    tpk_status (*sumsq)(tpk_ctx *ctx, double *out, const float *x, size_t n, bool accumulate);

    /* FP8 (tpk_fp8_fmt above; the FP8 linears, tpk/layers/fp8.h), codes one byte each:
     * fp8_quant:   q[i] = tpk_f32_to_fp8(x[i] scale) for x [n] in dt (q NULL: not written);
     *              amax (NULL: none; f32 [1] in backend memory) = max(accumulate ? *amax : 0,
     *              max_i |x[i]|), the unscaled x's (a NaN ignored, an infinity kept), in the same
     *              pass
     * fp8_dequant: y[i] = tpk_fp8_to_f32(q[i]) scale_inv, in dt
     * gemm_fp8:    C[m, n] = alpha op(A) op(B) + beta C (gemm's shapes and rules), A and B codes
     *              of fa, fb decoded exactly, the products summed in f32 (FP8 tensor cores' inputs
     *              and accumulation: on sm_89/sm_90 the MMA's accumulator keeps fewer mantissa
     *              bits than f32, about 14, so a CUDA result may differ from the host's by
     *              ~1e-4 relative at small k); alpha carries the dequantising scales
     *              (1 / (s_a s_b)); C in c_dt, f32 or bf16; beta = 0 ignores C. */
    tpk_status (*fp8_quant)(tpk_ctx *ctx, uint8_t *q, float *amax, const void *x, tpk_dtype dt,
                            size_t n, float scale, tpk_fp8_fmt fmt, bool accumulate);
    tpk_status (*fp8_dequant)(tpk_ctx *ctx, void *y, tpk_dtype dt, const uint8_t *q, size_t n,
                              float scale_inv, tpk_fp8_fmt fmt);
    tpk_status (*gemm_fp8)(tpk_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const uint8_t *a, tpk_fp8_fmt fa, int64_t lda,
                           const uint8_t *b, tpk_fp8_fmt fb, int64_t ldb, float beta, void *c,
                           int64_t ldc, tpk_dtype c_dt);

    /* Grouped GEMM (a mixture of experts' local experts in one call): G = groups products, group g
     * owning rows [off_g, off_g + rows[g]) of x [R, k] (ldx) and y [R, n] (ldy), off_g = rows[0] +
     * ... + rows[g - 1], R = off_G (rows: a host array of G counts >= 0), and its own matrix W_g at
     * w[g] (w: a host array of G pointers to backend memory; op(W_g) = W_g [k, n], or W_g^T when
     * tw, W_g stored [n, k]; ldw its leading dimension):
     *   wgrad = false:  y_g = alpha x_g op(W_g) + beta y_g      (Y = X W^T: tw; dX = dY W: !tw)
     *   wgrad = true:   op(W_g) = alpha x_g^T y_g + beta op(W_g)  (dW += dY^T X: x = dY, y = X)
     * each group exactly gemm on its block (gemm's rules: beta = 0 ignores the output; k = 0, or a
     * group of 0 rows under wgrad, gives output = beta output; a group of 0 rows without wgrad
     * touches nothing). x, y and W in dt; with wgrad, W may be f32 instead (w_dt: gemm_acc's f32
     * accumulation, a bf16 model's expert gradients); without, w_dt = dt. */
    tpk_status (*gemm_grouped)(tpk_ctx *ctx, bool wgrad, bool tw, int64_t groups,
                               const int64_t *rows, int64_t n, int64_t k, float alpha,
                               const void *x, int64_t ldx, void *const *w, int64_t ldw,
                               tpk_dtype w_dt, float beta, void *y, int64_t ldy, tpk_dtype dt);

    /* Rows moved by an index: a mixture of experts' permutations, its combine and their adjoints
     * (tpk/layers/moe.h), one call each. idx and row: int32 in backend memory, read by the kernels
     * alone (the front end cannot check them): an index outside [0, the rows it indexes) names no
     * row (-1 by convention: a dropped row). Rows of cols (H) elements; ldy, ldx leading dimensions
     * in elements; an output overlaps none of the inputs. Every output element is written (or, with
     * accumulate, read and written) exactly as below, the same bits at any thread count.
     *   gather_rows:      y[i, :] = x[idx[i], :] for i < rows (x has xrows rows); a row idx[i]
     *                     names none is zeros. Any dtype: rows move as bytes, exactly.
     *   scatter_add_rows: its adjoint, y [yrows, cols]: row r of y is the sum of the rows x[i, :]
     *                     with idx[i] = r in index order (i ascending), the sum started from y[r]
     *                     (accumulate) or from the first such row, each next row added in f32,
     *                     y rounded to dt once; a row no index names is zeros (accumulate:
     *                     unchanged). Segmented by destination in index order on every backend,
     *                     so deterministic whatever the index (repeats included); a permutation
     *                     (each row named at most once) copies rows exactly. f32 or bf16.
     *   moe_combine_fwd:  y[t, :] = sum of w[e] o[row[e], :] over the kept entries e = t K + i,
     *                     i < K ascending (row[e] in [0, orows)), for t < T: each product rounded
     *                     to f32, the sum started from the first and kept in f32 (no FMA), y
     *                     rounded to dt once; zeros for a token whose every entry is dropped.
     *                     y [T, H], o [orows, H], w f32 [T K] and row [T K] in backend memory.
     *   moe_combine_bwd:  dw[e] = dy[e / K, :] . o[row[e], :] (f32 [T K] in backend memory, an
     *                     f32 sum in the backend's fixed order; 0 for a dropped entry) and dout
     *                     [orows, H], o's gradient: row r the terms w[e] dy[e / K, :] of the kept
     *                     entries naming it, summed as scatter_add_rows sums (e ascending, f32,
     *                     rounded once; a row named once: w dy rounded); zeros where none does.
     * The data f32 or bf16 (gather_rows': any dtype). */
    tpk_status (*gather_rows)(tpk_ctx *ctx, void *y, int64_t ldy, const void *x, int64_t ldx,
                              int64_t xrows, const int32_t *idx, int64_t rows, int64_t cols,
                              tpk_dtype dt);
    tpk_status (*scatter_add_rows)(tpk_ctx *ctx, void *y, int64_t ldy, int64_t yrows, const void *x,
                                   int64_t ldx, const int32_t *idx, int64_t rows, int64_t cols,
                                   tpk_dtype dt, bool accumulate);
    tpk_status (*moe_combine_fwd)(tpk_ctx *ctx, void *y, const void *o, int64_t orows,
                                  const int32_t *row, const float *w, int64_t T, int64_t K,
                                  int64_t H, tpk_dtype dt);
    tpk_status (*moe_combine_bwd)(tpk_ctx *ctx, float *dw, void *dout, const void *dy,
                                  const void *o, int64_t orows, const int32_t *row, const float *w,
                                  int64_t T, int64_t K, int64_t H, tpk_dtype dt);

    /* ---- the fusions (TPK__OPS_FUSED): optional; NULL, the front end composes each from the
     * required entries as its contract says (tpk__compose_* in tpk/runtime/op.h) ---- */

    /* The forward of a linear layer in one pass where the backend can fuse it (cuBLASLt's bias
     * and GELU epilogues):  u = x W^T + bias  for x [T, k], W [n, k], bias [n] (NULL: none);
     * act = NONE: y = u;  otherwise pre = u and y = act(u), both [T, n]. All in dt; pre is not
     * touched with NONE. Equal to gemm + bias_add (+ act_fwd). */
    tpk_status (*linear_fwd)(tpk_ctx *ctx, void *y, void *pre, const void *x, const void *w,
                             const void *bias, int64_t T, int64_t n, int64_t k, tpk_act act,
                             tpk_dtype dt);
    /* A data gradient through a GEMM, then back through the activation before it, in one pass
     * where the backend can fuse it (cuBLASLt's DGELU and BGRAD epilogues): for dy [T, k] and
     * W [k, n] (the next layer's weight, row-major [its out = k, its in = n]),
     *   du = (dy W) act'(pre)   [T, n], pre [T, n] the forward's pre-activation (act != NONE)
     *   db = sum_t du[t]        [n] (written, not accumulated; NULL: not computed)
     * all in dt; du aliases none of the inputs. Equal to gemm + act_bwd + bias_grad. */
    tpk_status (*linear_bwd_act)(tpk_ctx *ctx, void *du, void *db, const void *dy, const void *w,
                                 const void *pre, int64_t T, int64_t n, int64_t k, tpk_act act,
                                 tpk_dtype dt);

    /* The residual add and the layernorm after it in one pass:  x1 = x + r  (stored in dt; x1
     * may alias x), then exactly layernorm_fwd on x1 (y, mean, rstd). Equal to axpby +
     * layernorm_fwd. */
    tpk_status (*residual_layernorm_fwd)(tpk_ctx *ctx, void *x1, void *y, float *mean, float *rstd,
                                         const void *x, const void *r, const float *w,
                                         const float *b, int64_t rows, int64_t cols, float eps,
                                         tpk_dtype dt);

    /* Optional as well: timer marks for the profiler (tpk/runtime/profile.h).
     * timer_mark records mark `slot` (0, 1, 2, ...) in the order of the ops' stream; timer_ms
     * waits for mark b and gives the milliseconds from mark a to mark b. Without them the
     * profiler reads the host clock around each call (exact for a synchronous backend). */
    tpk_status (*timer_mark)(tpk_ctx *ctx, int slot);
    tpk_status (*timer_ms)(tpk_ctx *ctx, int a, int b, float *ms);

    /* A dry run (the planner's counting backend, tpk/plan/count.h): the front end calls no compute
     * entry — each op is checked and handed to the profiler (its name, bytes and flops, as in a
     * real run) and returns TPK_OK — so the table needs its memory entries alone
     * (TPK__OPS_MEMORY: alloc, free, memcpy, sync; tpk_ctx_init refuses one without them) and may
     * leave every other NULL. false (a real backend): one branch a call, always taken alike. */
    bool dry_run;
} tpk_ops;

#endif /* TPK_OPS_H */
