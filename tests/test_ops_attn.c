/* tests/test_ops_attn.c — the host backend's causal attention (kernels/host/attn.c), grouped-query:
 * forward and backward, with and without dropout, against a double reference and finite
 * differences; a head's result does not depend on the other heads' global indices; bf16; one
 * block of an attention split over the sequence (attn_block_fwd / _bwd), whose blocks merged give
 * the whole attention with its dropout. Runs on one rank. */
#include "ops_test.h"

/* ---- attention ----------------------------------------------------------------------------- */

typedef struct attn_shape {
    int64_t B, S, Al, D, A, head0, G; /* G key/value heads; 0 = A */
} attn_shape;

static int64_t attn_G(const attn_shape *s) { return s->G ? s->G : s->A; }
/* the local key/value heads [*g0, *g0 + Gl) of the query heads [head0, head0 + Al) */
static int64_t attn_Gl(const attn_shape *s, int64_t *g0) {
    return tpk_attn_kv_heads(s->A, attn_G(s), s->head0, s->Al, g0);
}
static size_t attn_nq(const attn_shape *s) {
    return (size_t)(s->B * s->S * (s->Al + 2 * attn_Gl(s, NULL)) * s->D);
}
static size_t attn_no(const attn_shape *s) { return (size_t)(s->B * s->S * s->Al * s->D); }
static size_t attn_nl(const attn_shape *s) { return (size_t)(s->B * s->Al * s->S); }

/* keep factor of P_ij of batch b, global head g: 0 or 1/(1-p) (1 when p = 0) */
static double attn_keep_ref(double p, uint64_t seed, uint64_t stream, const attn_shape *s,
                            int64_t b, int64_t g, int64_t i, int64_t j) {
    if (p <= 0) return 1.0;
    uint64_t idx = (uint64_t)(((b * s->A + g) * s->S + i) * s->S + j);
    return test_dropout_u(seed, stream, idx) >= (float)p ? 1.0 / (1.0 - (double)(float)p) : 0.0;
}

/* Naive causal attention in double: out, lse and (with dout) dqkv. */
static void attn_ref(const attn_shape *s, const float *qkv, const float *dout, double scale,
                     float p, uint64_t seed, uint64_t stream, double *out, double *lse,
                     double *dqkv) {
    int64_t g0, Gl = attn_Gl(s, &g0), grp = s->A / attn_G(s);
    const int64_t S = s->S, D = s->D, Al = s->Al, ld3 = (Al + 2 * Gl) * D, ldo = Al * D;
    double *P = dbuf((size_t)(S * S)), *K = dbuf((size_t)(S * S)), *dPk = dbuf((size_t)(S * S)),
           *dS = dbuf((size_t)(S * S));
    if (dqkv)
        for (size_t k = 0; k < attn_nq(s); k++) dqkv[k] = 0;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < Al; h++) {
#define Qe(i, d) ((double)qkv[(b * S + (i)) * ld3 + h * D + (d)])
#define Ke(i, d) ((double)qkv[(b * S + (i)) * ld3 + (Al + kv) * D + (d)])
#define Ve(i, d) ((double)qkv[(b * S + (i)) * ld3 + (Al + Gl + kv) * D + (d)])
            int64_t kv = (s->head0 + h) / grp - g0; /* the key/value head query head h reads */
            for (int64_t i = 0; i < S; i++) {
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double sc = 0;
                    for (int64_t d = 0; d < D; d++) sc += Qe(i, d) * Ke(j, d);
                    P[i * S + j] = scale * sc;
                    m = P[i * S + j] > m ? P[i * S + j] : m;
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(P[i * S + j] - m);
                double l = m + log(sum);
                lse[(b * Al + h) * S + i] = l;
                for (int64_t j = 0; j < S; j++) {
                    P[i * S + j] = j <= i ? exp(P[i * S + j] - l) : 0.0;
                    K[i * S + j] =
                        j <= i ? attn_keep_ref(p, seed, stream, s, b, s->head0 + h, i, j) : 0.0;
                }
                for (int64_t d = 0; d < D; d++) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; j++) o += P[i * S + j] * K[i * S + j] * Ve(j, d);
                    out[(b * S + i) * ldo + h * D + d] = o;
                }
            }
            if (!dqkv) continue;
#define dOe(i, d) ((double)dout[(b * S + (i)) * ldo + h * D + (d)])
            /* out_i = sum_j P_ij k_ij V_j: dL/dP_ij = k_ij dO_i . V_j; softmax: dS_ij = P_ij
             * (dPk_ij - sum_l P_il dPk_il) */
            for (int64_t i = 0; i < S; i++) {
                double Dr = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double g = 0;
                    for (int64_t d = 0; d < D; d++) g += dOe(i, d) * Ve(j, d);
                    dPk[i * S + j] = K[i * S + j] * g;
                    Dr += P[i * S + j] * dPk[i * S + j];
                }
                for (int64_t j = 0; j <= i; j++)
                    dS[i * S + j] = P[i * S + j] * (dPk[i * S + j] - Dr);
            }
            for (int64_t i = 0; i < S; i++)
                for (int64_t d = 0; d < D; d++) {
                    double gq = 0, gk = 0, gv = 0;
                    for (int64_t j = 0; j <= i; j++)
                        gq += dS[i * S + j] * Ke(j, d); /* dQ_i = scale sum_j dS_ij K_j */
                    for (int64_t r = i; r < S; r++)
                        gk += dS[r * S + i] * Qe(r, d); /* dK_i = scale sum_r dS_ri Q_r */
                    for (int64_t r = i; r < S; r++)
                        gv += P[r * S + i] * K[r * S + i] * dOe(r, d); /* dV_i = sum_r Pk_ri dO_r */
                    dqkv[(b * S + i) * ld3 + h * D + d] = scale * gq;
                    /* summed over the query heads of a group */
                    dqkv[(b * S + i) * ld3 + (Al + kv) * D + d] += scale * gk;
                    dqkv[(b * S + i) * ld3 + (Al + Gl + kv) * D + d] += gv;
                }
#undef Qe
#undef Ke
#undef Ve
#undef dOe
        }
    free(P), free(K), free(dPk), free(dS);
}

/* attn_fwd in dt on f32 data (bf16-exact when dt is bf16): out f32 [no], lse f32 [nl], poisoned
 * first */
static void attn_run_fwd(const attn_shape *s, const float *qkv, float scale, float p, uint64_t seed,
                         uint64_t stream, tpk_dtype dt, float *out, float *lse) {
    size_t nq = attn_nq(s), no = attn_no(s);
    test_poison(out, no), test_poison(lse, attn_nl(s));
    if (dt == TPK_F32) {
        CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, out, lse, qkv, s->B, s->S, s->Al, s->D, s->A,
                                       attn_G(s), s->head0, scale, p, seed, stream, dt));
        return;
    }
    uint16_t *hq = hbuf(nq), *ho = hbuf(no);
    to_bf16(hq, qkv, nq), poison_bf16(ho, no);
    CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, ho, lse, hq, s->B, s->S, s->Al, s->D, s->A, attn_G(s),
                                   s->head0, scale, p, seed, stream, dt));
    from_bf16(out, ho, no);
    free(hq), free(ho);
}
static void attn_run_bwd(const attn_shape *s, const float *qkv, const float *dout, const float *out,
                         const float *lse, float scale, float p, uint64_t seed, uint64_t stream,
                         tpk_dtype dt, float *dqkv) {
    size_t nq = attn_nq(s), no = attn_no(s);
    test_poison(dqkv, nq);
    if (dt == TPK_F32) {
        CHECK_OK(&ctx, tpk_op_attn_bwd(&ctx, dqkv, dout, qkv, out, lse, s->B, s->S, s->Al, s->D,
                                       s->A, attn_G(s), s->head0, scale, p, seed, stream, dt));
        return;
    }
    uint16_t *hq = hbuf(nq), *hd = hbuf(no), *ho = hbuf(no), *hg = hbuf(nq);
    to_bf16(hq, qkv, nq), to_bf16(hd, dout, no), to_bf16(ho, out, no), poison_bf16(hg, nq);
    CHECK_OK(&ctx, tpk_op_attn_bwd(&ctx, hg, hd, hq, ho, lse, s->B, s->S, s->Al, s->D, s->A,
                                   attn_G(s), s->head0, scale, p, seed, stream, dt));
    from_bf16(dqkv, hg, nq);
    free(hq), free(hd), free(ho), free(hg);
}

/* L = sum out R in double, out from the f32 op */
static double attn_loss(const attn_shape *s, const float *qkv, const float *R, float scale, float p,
                        uint64_t seed, uint64_t stream, float *out, float *lse) {
    attn_run_fwd(s, qkv, scale, p, seed, stream, TPK_F32, out, lse);
    double L = 0;
    for (size_t k = 0; k < attn_no(s); k++) L += (double)out[k] * R[k];
    return L;
}

/* forward + backward of one f32 configuration against the reference and finite differences */
static void attn_check_f32(const attn_shape *s, float p, uint64_t seed, uint64_t stream,
                           uint64_t dseed, bool fd) {
    const size_t nq = attn_nq(s), no = attn_no(s), nl = attn_nl(s);
    const float scale = 1.0f / sqrtf((float)s->D);
    float *qkv = fbuf(nq), *R = fbuf(no), *out = fbuf(no), *lse = fbuf(nl), *dqkv = fbuf(nq),
          *wo = fbuf(no), *wl = fbuf(nl), *wd = fbuf(nq), *fdq = fbuf(nq), *to = fbuf(no),
          *tl = fbuf(nl);
    double *ro = dbuf(no), *rl = dbuf(nl), *rd = dbuf(nq);
    test_randn(qkv, nq, dseed, 1.0f);
    test_randn(R, no, dseed + 1, 1.0f);

    attn_run_fwd(s, qkv, scale, p, seed, stream, TPK_F32, out, lse);
    attn_ref(s, qkv, R, scale, p, seed, stream, ro, rl, rd);
    d2f(wo, ro, no), d2f(wl, rl, nl), d2f(wd, rd, nq);
    CHECK_CLOSE(out, wo, no, TOL_ATTN, "attn_fwd out vs naive causal attention");
    CHECK_CLOSE(lse, wl, nl, TOL_ATTN, "attn_fwd lse");

    attn_run_bwd(s, qkv, R, out, lse, scale, p, seed, stream, TPK_F32, dqkv);
    CHECK_CLOSE(dqkv, wd, nq, TOL_ATTN, "attn_bwd dqkv vs analytic reference");
    /* Q, K and V blocks separately, so a small block is not hidden by a large one. The scale of a
     * block is floored at 1e-2 of the whole: with S = 1 the true dQ and dK are exactly 0. */
    const int64_t Gl = attn_Gl(s, NULL), ld = (s->Al + 2 * Gl) * s->D, rowsN = s->B * s->S;
    const int64_t c0[3] = {0, s->Al * s->D, (s->Al + Gl) * s->D},
                  cw[3] = {s->Al * s->D, Gl * s->D, Gl * s->D};
    double wmax = 0;
    for (size_t k = 0; k < nq; k++) wmax = fabs(wd[k]) > wmax ? fabs(wd[k]) : wmax;
    const char *blk[3] = {"dQ", "dK", "dV"};
    for (int c = 0; c < 3; c++) {
        int64_t AD = cw[c];
        size_t nb = (size_t)(rowsN * AD);
        float *gb = fbuf(nb), *wb = fbuf(nb);
        for (int64_t r = 0; r < rowsN; r++)
            for (int64_t k = 0; k < AD; k++)
                gb[r * AD + k] = dqkv[r * ld + c0[c] + k], wb[r * AD + k] = wd[r * ld + c0[c] + k];
        double num = 0, den = 1e-2 * wmax;
        for (size_t k = 0; k < nb; k++) {
            double d = isnan(gb[k]) ? INFINITY : fabs((double)gb[k] - wb[k]);
            num = d > num ? d : num, den = fabs(wb[k]) > den ? fabs(wb[k]) : den;
        }
        CHECK(num / den < TOL_ATTN,
              "attn_bwd %s block vs analytic reference: relative error %.3g >= %.3g", blk[c],
              num / den, (double)TOL_ATTN);
        free(gb), free(wb);
    }

    if (fd) { /* every entry of Q, K and V */
        float *qq = fbuf(nq);
        memcpy(qq, qkv, nq * sizeof(float));
        for (size_t k = 0; k < nq; k++) {
            float save = qq[k], xp, xm;
            double step = fd_step(save, 1e-2, &xp, &xm);
            qq[k] = xp;
            double Lp = attn_loss(s, qq, R, scale, p, seed, stream, to, tl);
            qq[k] = xm;
            double Lm = attn_loss(s, qq, R, scale, p, seed, stream, to, tl);
            qq[k] = save;
            fdq[k] = (float)((Lp - Lm) / step);
        }
        CHECK_CLOSE(dqkv, fdq, nq, TOL_FD, "attn_bwd dqkv vs finite differences of sum(out R)");
        free(qq);
    }
    free(qkv), free(R), free(out), free(lse), free(dqkv), free(wo), free(wl), free(wd), free(fdq),
        free(to), free(tl);
    free(ro), free(rl), free(rd);
}

/* attn_fwd / attn_bwd of s through attn_block_fwd / _bwd: each sequence's queries in the blocks
 * [qc[m], qc[m + 1]) against the keys' blocks [qc[k], qc[k + 1]), merged (causal blocks after the
 * query block skipped); out, lse merged in f32, dqkv the f32 sums in qkv's layout. */
static void attn_by_blocks(const attn_shape *s, const float *qkv, const float *dout,
                           const float *whole_out, const float *whole_lse, float scale, float p,
                           uint64_t seed, uint64_t stream, const int64_t *qc, int nc, float *out,
                           float *lse, float *dqkv) {
    int64_t Gl = attn_Gl(s, NULL), S = s->S, D = s->D, ld3 = (s->Al + 2 * Gl) * D, ldo = s->Al * D;
    tpk_attn_blk b;
    memset(&b, 0, sizeof b);
    b.causal = true, b.Al = s->Al, b.D = D, b.A = s->A, b.G = attn_G(s), b.head0 = s->head0;
    b.scale = scale, b.ldq = b.lddq = b.ldkv = ld3, b.ldo = ldo, b.ldl = S;
    b.p = p, b.seed = seed, b.stream = stream, b.S = S;
    test_poison(out, attn_no(s)), test_poison(lse, attn_nl(s));
    for (size_t k = 0; k < attn_nq(s); k++) dqkv[k] = 0.0f;
    for (int64_t bb = 0; bb < s->B; bb++)
        for (int m = 0; m < nc; m++)
            for (int k = 0; k <= m; k++) {
                b.b = bb, b.q0 = qc[m], b.Sq = qc[m + 1] - qc[m], b.k0 = qc[k];
                b.Sk = qc[k + 1] - qc[k];
                const float *q = qkv + (bb * S + b.q0) * ld3, *kv = qkv + (bb * S + b.k0) * ld3;
                size_t l0 = (size_t)(bb * s->Al * S + b.q0);
                CHECK_OK(&ctx, tpk_op_attn_block_fwd(&ctx, out + (bb * S + b.q0) * ldo, lse + l0, q,
                                                     kv + s->Al * D, &b, k > 0, TPK_F32));
                CHECK_OK(&ctx, tpk_op_attn_block_bwd(
                                   &ctx, dqkv + (bb * S + b.q0) * ld3,
                                   dqkv + (bb * S + b.k0) * ld3 + s->Al * D,
                                   dout + (bb * S + b.q0) * ldo, whole_out + (bb * S + b.q0) * ldo,
                                   whole_lse + l0, q, kv + s->Al * D, &b, TPK_F32));
            }
}

static void test_attention_blocks(void) {
    TEST_CASE("layers attn_block_fwd/bwd f32, dropout p = 0.1 (and 0): blocks covering a sequence, "
              "merged, give attn_fwd's output and lse and attn_bwd's gradients within 1e-6; bad "
              "dropout arguments refused by name") {
        const attn_shape s = {.B = 2, .S = 13, .Al = 2, .D = 8, .A = 4, .head0 = 2, .G = 2};
        const int64_t qc[] = {0, 5, 6, 10, 13}; /* uneven blocks, one of a single row */
        const size_t nq = attn_nq(&s), no = attn_no(&s), nl = attn_nl(&s);
        const float scale = 0.4f;
        const uint64_t seed = 77, stream = 3;
        float *qkv = fbuf(nq), *R = fbuf(no), *out = fbuf(no), *lse = fbuf(nl), *dq = fbuf(nq),
              *bo = fbuf(no), *bl = fbuf(nl), *bd = fbuf(nq);
        test_randn(qkv, nq, 1170, 1.0f), test_randn(R, no, 1171, 1.0f);
        for (int pi = 0; pi < 2; pi++) {
            const float p = pi ? 0.0f : 0.1f;
            attn_run_fwd(&s, qkv, scale, p, seed, stream, TPK_F32, out, lse);
            attn_run_bwd(&s, qkv, R, out, lse, scale, p, seed, stream, TPK_F32, dq);
            attn_by_blocks(&s, qkv, R, out, lse, scale, p, seed, stream, qc, 4, bo, bl, bd);
            CHECK_CLOSE(bo, out, no, 1e-6, pi ? "blocks' out, p = 0" : "blocks' out, p = 0.1");
            CHECK_CLOSE(bl, lse, nl, 1e-6, pi ? "blocks' lse, p = 0" : "blocks' lse, p = 0.1");
            CHECK_CLOSE(bd, dq, nq, 1e-6, pi ? "blocks' dqkv, p = 0" : "blocks' dqkv, p = 0.1");
        }
        /* another seed changes the blocks' output as attn_fwd's */
        attn_by_blocks(&s, qkv, R, out, lse, scale, 0.1f, seed + 1, stream, qc, 4, bo, bl, bd);
        attn_run_fwd(&s, qkv, scale, 0.1f, seed, stream, TPK_F32, out, lse);
        CHECK(bitdiff(bo, out, no) > 0, "p = 0.1: another seed gave the same blocks' output");
        tpk_attn_blk b;
        memset(&b, 0, sizeof b);
        b.Sq = 2, b.Sk = 3, b.q0 = 4, b.k0 = 1, b.causal = true, b.Al = 1, b.D = 8, b.A = 1;
        b.G = 1, b.scale = 0.5f, b.ldq = b.lddq = 8, b.ldkv = 16, b.ldo = 8, b.ldl = 2;
        b.p = 1.0f;
        CHECK_FAILS(&ctx, tpk_op_attn_block_fwd(&ctx, bo, bl, qkv, qkv, &b, false, TPK_F32),
                    TPK_ERR_ARG, "b->p: expected 0 <= p < 1, got 1");
        b.p = 0.1f, b.S = 5;
        CHECK_FAILS(&ctx, tpk_op_attn_block_bwd(&ctx, bd, bd, R, out, lse, qkv, qkv, &b, TPK_F32),
                    TPK_ERR_ARG,
                    "b->S: with dropout expected the whole sequence's length, >= "
                    "the block's last position + 1 = 6, got 5");
        b.S = 6, b.b = -1;
        CHECK_FAILS(&ctx, tpk_op_attn_block_fwd(&ctx, bo, bl, qkv, qkv, &b, false, TPK_F32),
                    TPK_ERR_ARG, "b->b: expected >= 0");
        free(qkv), free(R), free(out), free(lse), free(dq), free(bo), free(bl), free(bd);
    }
}

static void test_attention(void) {
    const attn_shape s0 = {.B = 2, .S = 5, .Al = 2, .D = 4, .A = 3, .head0 = 1};
    const uint64_t seed = 2024, stream = 5;

    TEST_CASE(
        "layers attention f32 B=2 S=5 Al=2 of A=3 head0=1 D=4: forward, backward, finite "
        "differences") {
        attn_check_f32(&s0, 0.0f, seed, stream, 1100, true);
    }
    TEST_CASE(
        "layers attention f32 with dropout p = 0.25: same mask formula, backward vs finite "
        "differences") {
        /* the test's premise: the mask drops some causal entries and keeps others */
        size_t kept = 0, dropped = 0;
        for (int64_t b = 0; b < s0.B; b++)
            for (int64_t h = 0; h < s0.Al; h++)
                for (int64_t i = 0; i < s0.S; i++)
                    for (int64_t j = 0; j <= i; j++) {
                        double k = attn_keep_ref(0.25, seed, stream, &s0, b, s0.head0 + h, i, j);
                        kept += k != 0, dropped += k == 0;
                    }
        CHECK(kept > 0 && dropped > 0, "premise: kept %zu, dropped %zu", kept, dropped);
        attn_check_f32(&s0, 0.25f, seed, stream, 1110, true);
    }
    TEST_CASE(
        "layers attention f32 larger (B=1 S=37 Al=3 of A=5 head0=2 D=8; B=2 S=150), with and "
        "without dropout") {
        const attn_shape s1 = {.B = 1, .S = 37, .Al = 3, .D = 8, .A = 5, .head0 = 2};
        attn_check_f32(&s1, 0.0f, seed, stream, 1120, false);
        attn_check_f32(&s1, 0.1f, seed, stream, 1130, false);
        const attn_shape s3 = {.B = 2,
                               .S = 150,
                               .Al = 2,
                               .D = 8,
                               .A = 2,
                               .head0 = 0}; /* 3 query-row blocks, the last partial */
        attn_check_f32(&s3, 0.1f, seed, stream, 1135, false);
        const attn_shape s2 = {
            .B = 3, .S = 1, .Al = 1, .D = 3, .A = 1, .head0 = 0}; /* one token: out = V */
        attn_check_f32(&s2, 0.0f, seed, stream, 1140, true);
    }

    TEST_CASE(
        "layers attention, grouped-query: A=6 query heads over G=2 and G=1 key/value heads, a "
        "shared head read in place; "
        "forward, backward (dK, dV summed over the group) and finite differences") {
        const attn_shape g1 = {.B = 2,
                               .S = 5,
                               .Al = 3,
                               .D = 4,
                               .A = 6,
                               .head0 = 2,
                               .G = 2}; /* heads 2..4: key/value heads 0 and 1 */
        const attn_shape g2 = {.B = 1, .S = 6, .Al = 6, .D = 4, .A = 6, .head0 = 0, .G = 1};
        const attn_shape g3 = {
            .B = 1, .S = 70, .Al = 2, .D = 8, .A = 6, .head0 = 4, .G = 3}; /* two row blocks */
        CHECK(attn_Gl(&g1, NULL) == 2 && attn_Gl(&g2, NULL) == 1 && attn_Gl(&g3, NULL) == 1,
              "key/value heads per call");
        attn_check_f32(&g1, 0.0f, seed, stream, 1160, true);
        attn_check_f32(&g1, 0.25f, seed, stream, 1161, true);
        attn_check_f32(&g2, 0.0f, seed, stream, 1162, true);
        attn_check_f32(&g3, 0.1f, seed, stream, 1163, false);
    }

    TEST_CASE("layers attention: a head's result does not depend on head0 of other heads") {
        const float ps[2] = {0.0f, 0.25f};
        const int64_t B = s0.B, S = s0.S, D = s0.D, Al = s0.Al;
        const attn_shape s1 = {.B = B, .S = S, .Al = 1, .D = D, .A = s0.A, .head0 = 2};
        const size_t nq = attn_nq(&s0), no = attn_no(&s0), nl = attn_nl(&s0), nq1 = attn_nq(&s1),
                     no1 = attn_no(&s1), nl1 = attn_nl(&s1);
        const float scale = 0.5f;
        float *qkv = fbuf(nq), *R = fbuf(no), *out = fbuf(no), *lse = fbuf(nl), *dq = fbuf(nq);
        float *q1 = fbuf(nq1), *R1 = fbuf(no1), *out1 = fbuf(no1), *lse1 = fbuf(nl1),
              *dq1 = fbuf(nq1);
        float *xo = fbuf(no1), *xl = fbuf(nl1), *xd = fbuf(nq1), *alt = fbuf(no1),
              *altl = fbuf(nl1);
        test_randn(qkv, nq, 1150, 1.0f);
        test_randn(R, no, 1151, 1.0f);
        /* head h = 1's columns of Q, K, V and of out */
        for (int64_t r = 0; r < B * S; r++) {
            for (int c = 0; c < 3; c++)
                for (int64_t d = 0; d < D; d++)
                    q1[r * 3 * D + c * D + d] = qkv[r * 3 * Al * D + c * Al * D + D + d];
            for (int64_t d = 0; d < D; d++) R1[r * D + d] = R[r * Al * D + D + d];
        }
        for (int pi = 0; pi < 2; pi++) {
            const float p = ps[pi];
            attn_run_fwd(&s0, qkv, scale, p, seed, stream, TPK_F32, out, lse);
            attn_run_bwd(&s0, qkv, R, out, lse, scale, p, seed, stream, TPK_F32, dq);
            attn_run_fwd(&s1, q1, scale, p, seed, stream, TPK_F32, out1, lse1);
            attn_run_bwd(&s1, q1, R1, out1, lse1, scale, p, seed, stream, TPK_F32, dq1);
            for (int64_t r = 0; r < B * S; r++) {
                for (int64_t d = 0; d < D; d++) xo[r * D + d] = out[r * Al * D + D + d];
                for (int c = 0; c < 3; c++)
                    for (int64_t d = 0; d < D; d++)
                        xd[r * 3 * D + c * D + d] = dq[r * 3 * Al * D + c * Al * D + D + d];
            }
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < S; i++) xl[b * S + i] = lse[(b * Al + 1) * S + i];
            CHECK(
                bitdiff(out1, xo, no1) == 0,
                "p = %g: Al = 1, head0 = 2 out differs from head 1 of (Al = 2, head0 = 1) in %zu "
                "elements",
                (double)p, bitdiff(out1, xo, no1));
            CHECK(bitdiff(lse1, xl, nl1) == 0, "p = %g: lse differs in %zu elements", (double)p,
                  bitdiff(lse1, xl, nl1));
            CHECK(bitdiff(dq1, xd, nq1) == 0, "p = %g: dqkv differs in %zu elements", (double)p,
                  bitdiff(dq1, xd, nq1));
            CHECK(count_nan(out, no) == 0 && count_nan(dq, nq) == 0, "NaN left in out or dqkv");
        }
        /* with dropout the global head index matters: head0 = 0 on the same data is another mask */
        const attn_shape s1b = {.B = B, .S = S, .Al = 1, .D = D, .A = s0.A, .head0 = 0};
        attn_run_fwd(&s1, q1, scale, 0.25f, seed, stream, TPK_F32, out1, lse1);
        attn_run_fwd(&s1b, q1, scale, 0.25f, seed, stream, TPK_F32, alt, altl);
        CHECK(bitdiff(out1, alt, no1) > 0,
              "p = 0.25: head0 = 0 and head0 = 2 gave the same output");
        CHECK(bitdiff(lse1, altl, nl1) == 0, "lse does not depend on the dropout mask");
        free(qkv), free(R), free(out), free(lse), free(dq), free(q1), free(R1), free(out1),
            free(lse1), free(dq1);
        free(xo), free(xl), free(xd), free(alt), free(altl);
    }

    TEST_CASE(
        "layers attention bf16 storage (p = 0 and 0.25): within 1e-2 of the reference on rounded "
        "inputs") {
        const size_t nq = attn_nq(&s0), no = attn_no(&s0), nl = attn_nl(&s0);
        const float scale = 0.5f;
        float *qkv = fbuf(nq), *R = fbuf(no), *out = fbuf(no), *lse = fbuf(nl), *dq = fbuf(nq),
              *wo = fbuf(no), *wl = fbuf(nl), *wd = fbuf(nq);
        double *ro = dbuf(no), *rl = dbuf(nl), *rd = dbuf(nq);
        test_randn(qkv, nq, 1160, 1.0f), test_randn(R, no, 1161, 1.0f);
        round_bf16(qkv, nq), round_bf16(R, no);
        for (int pi = 0; pi < 2; pi++) {
            const float p = pi ? 0.25f : 0.0f;
            attn_ref(&s0, qkv, R, scale, p, seed, stream, ro, rl, rd);
            d2f(wo, ro, no), d2f(wl, rl, nl), d2f(wd, rd, nq);
            attn_run_fwd(&s0, qkv, scale, p, seed, stream, TPK_BF16, out, lse);
            CHECK_CLOSE(out, wo, no, TOL_BF16,
                        pi ? "bf16 attn_fwd out, p = 0.25" : "bf16 attn_fwd out, p = 0");
            CHECK_CLOSE(lse, wl, nl, TOL_ATTN,
                        pi ? "bf16 attn_fwd lse (f32 on exact bf16 inputs), p = 0.25"
                           : "bf16 attn_fwd lse, p = 0");
            attn_run_bwd(&s0, qkv, R, out, lse, scale, p, seed, stream, TPK_BF16, dq);
            CHECK_CLOSE(dq, wd, nq, TOL_BF16,
                        pi ? "bf16 attn_bwd dqkv, p = 0.25" : "bf16 attn_bwd dqkv, p = 0");
        }
        free(qkv), free(R), free(out), free(lse), free(dq), free(wo), free(wl), free(wd), free(ro),
            free(rl), free(rd);
    }

    TEST_CASE("layers attention: bad arguments fail naming them; empty sizes are no-ops") {
        float q[256] = {0}, out[128], lse[64], dq[256], dO[128] = {0};
        const float sc = 0.5f;
        /* fwd */
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 2, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "head0:");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, -1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "head0:");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 2, 1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "G: expected a divisor of A = 3 (key/value heads), got 2");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 0, 1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "G: expected a divisor");
        CHECK_FAILS(&ctx,
                    tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 4, 3, 6, 1, sc, 0.0f, 1, 1,
                                    TPK_F32),
                    TPK_ERR_ARG, "G: expected a divisor");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 1, sc, 1.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "p: expected 0 <= p < 1, got 1");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 1, sc, -0.5f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "p:");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 0, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "D: expected >= 1, got 0");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, -2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "B: expected >= 0");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, -5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "S: expected >= 0");
        CHECK_FAILS(
            &ctx,
            tpk_op_attn_fwd(&ctx, out, lse, NULL, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "qkv: expected a buffer");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, NULL, q, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_F32),
            TPK_ERR_ARG, "lse: expected a buffer");
        CHECK_FAILS(
            &ctx, tpk_op_attn_fwd(&ctx, out, lse, q, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1, TPK_I32),
            TPK_ERR_DTYPE, "tpk_op_attn_fwd: dt:");
        /* bwd */
        CHECK_FAILS(&ctx,
                    tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 4, 3, 3, 2, sc, 0.0f, 1, 1,
                                    TPK_F32),
                    TPK_ERR_ARG, "head0:");
        CHECK_FAILS(&ctx,
                    tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 4, 3, 3, 1, sc, 1.0f, 1, 1,
                                    TPK_F32),
                    TPK_ERR_ARG, "p:");
        CHECK_FAILS(&ctx,
                    tpk_op_attn_bwd(&ctx, dq, dO, q, out, lse, 2, 5, 2, 0, 3, 3, 1, sc, 0.0f, 1, 1,
                                    TPK_F32),
                    TPK_ERR_ARG, "D:");
        CHECK_FAILS(&ctx,
                    tpk_op_attn_bwd(&ctx, dq, NULL, q, out, lse, 2, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1,
                                    1, TPK_F32),
                    TPK_ERR_ARG, "dout: expected a buffer");
        CHECK(strncmp(tpk_last_error(&ctx), "tpk_op_attn_bwd: ", 17) == 0,
              "message \"%s\" does not name tpk_op_attn_bwd", tpk_last_error(&ctx));
        /* empty: nothing read */
        CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, NULL, NULL, NULL, 0, 5, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1,
                                       TPK_F32));
        CHECK_OK(&ctx, tpk_op_attn_fwd(&ctx, NULL, NULL, NULL, 2, 0, 2, 4, 3, 3, 1, sc, 0.0f, 1, 1,
                                       TPK_F32));
        CHECK_OK(&ctx, tpk_op_attn_bwd(&ctx, NULL, NULL, NULL, NULL, NULL, 2, 5, 0, 4, 3, 3, 1, sc,
                                       0.0f, 1, 1, TPK_F32));
    }
}

OPS_TEST_MAIN(test_attention, test_attention_blocks)
