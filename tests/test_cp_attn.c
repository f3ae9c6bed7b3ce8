/* tests/test_cp_attn.c — context parallelism: the mesh TP x CP x DP x PP (ranks and groups, DP x CP
 * among them, against the formula w = tp + t (cp + c (dp + d pp)), unchanged at cp = 1, bad sizes
 * refused by name); the load-balanced split (every position once over the CP ranks, equal causal
 * work, the scatter and the gather against the formula, a length not divisible by 2c refused);
 * attention over CP (tpk/layers/cp_attn.h), the ring and the all-gather, causal and not, multi-head
 * and grouped-query, f32 and bf16, against an unsharded double-precision attention and the kit's
 * own attention op on the whole sequence (out, lse, dQ, dK, dV; random inputs, outputs poisoned),
 * the two modes bit for bit alike, their messages and bytes against the formula, bad input refused.
 * Runs at 2, 3 and 4 ranks (CP 2, 3, 4; TP 2 x CP 2). */
#include "test.h"

static tpk_comm world;
static int me, np;

/* ---- the mesh -------------------------------------------------------------------------------- */

static void test_mesh(int tp, int cp, int pp) {
    tpk_ctx c;
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.world = &world, d.tp = tp, d.cp = cp, d.pp = pp;
    CHECK_OK(&c, tpk_ctx_init(&c, &d));
    int dp = np / (tp * cp * pp), tr = me % tp, cr = me / tp % cp, dr = me / (tp * cp) % dp,
        pr = me / (tp * cp * dp);
    CHECK(c.tp.size == tp && c.cp.size == cp && c.dp.size == dp && c.pp.size == pp,
          "sizes TP %d CP %d DP %d PP %d, expected %d %d %d %d", c.tp.size, c.cp.size, c.dp.size,
          c.pp.size, tp, cp, dp, pp);
    CHECK(c.tp.rank == tr && c.cp.rank == cr && c.dp.rank == dr && c.pp.rank == pr,
          "world rank %d: ranks TP %d CP %d DP %d PP %d, expected %d %d %d %d", me, c.tp.rank,
          c.cp.rank, c.dp.rank, c.pp.rank, tr, cr, dr, pr);
    /* each group's members by world rank, against the formula; DP x CP (a weight's replicas) the
       DP group itself at cp = 1 */
    CHECK(c.dp_cp && (cp > 1 ? c.dp_cp == &c.dp_cp_group : c.dp_cp == &c.dp) &&
              c.dp_cp->size == dp * cp && c.dp_cp->rank == cr + cp * dr,
          "dp_cp: size %d rank %d, expected %d %d (%s)", c.dp_cp ? c.dp_cp->size : -1,
          c.dp_cp ? c.dp_cp->rank : -1, dp * cp, cr + cp * dr,
          cp > 1 ? "a group of its own" : "the DP group");
    tpk_comm *g[5] = {&c.tp, &c.cp, &c.dp, &c.pp, c.dp_cp};
    for (int k = 0; k < 5; k++) {
        int32_t all[16];
        test_group_ranks(&c, g[k], me, all);
        for (int q = 0; q < g[k]->size; q++) {
            int want = k == 0   ? q + tp * (cr + cp * (dr + dp * pr))
                       : k == 1 ? tr + tp * (q + cp * (dr + dp * pr))
                       : k == 2 ? tr + tp * (cr + cp * (q + dp * pr))
                       : k == 3 ? tr + tp * (cr + cp * (dr + dp * q))
                                : tr + tp * (q + cp * dp * pr); /* q = cp rank + cp dp rank */
            CHECK(all[q] == want, "group %d rank %d: world rank %d, expected %d", k, q, all[q],
                  want);
        }
    }
    tpk_ctx_destroy(&c);
}

static void test_mesh_cases(void) {
    TEST_CASE("mesh TP x CP x DP x PP: every (tp, cp, pp) dividing %d ranks gives the ranks and "
              "group members of w = tp + t (cp + c (dp + d pp)); cp = 0 is cp = 1",
              np) {
        for (int tp = 1; tp <= np; tp++)
            for (int cp = 1; cp <= np / tp; cp++)
                for (int pp = 1; pp <= np / (tp * cp); pp++)
                    if (np % (tp * cp * pp) == 0) test_mesh(tp, cp, pp);
        tpk_ctx a, b;
        int t = np % 2 ? 1 : 2;
        CHECK_OK(&a, tpk_ctx_init(&a, &(tpk_ctx_desc){.world = &world, .tp = t}));
        CHECK_OK(&b, tpk_ctx_init(&b, &(tpk_ctx_desc){.world = &world, .tp = t, .cp = 1}));
        CHECK(a.cp.size == 1 && a.cp.rank == 0 && a.dp.rank == b.dp.rank &&
                  a.pp.rank == b.pp.rank && a.tp.rank == b.tp.rank,
              "cp = 0 and cp = 1: one mesh");
        tpk_ctx_destroy(&a), tpk_ctx_destroy(&b);
    }
    TEST_CASE("mesh: cp < 1, cp not dividing the ranks, pp not dividing ranks / (tp cp) refused "
              "by name") {
        tpk_ctx c;
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = -1}), TPK_ERR_ARG,
                    "desc->cp: expected a divisor of world size / tp");
        tpk_ctx_destroy(&c);
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = np + 1}),
                    TPK_ERR_ARG, "got");
        CHECK(strstr(tpk_last_error(&c), "desc->cp"), "%s", tpk_last_error(&c));
        tpk_ctx_destroy(&c);
        if (np == 4) {
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = 3}),
                        TPK_ERR_ARG, "desc->cp: expected a divisor of world size / tp = 4 / 1 = 4");
            tpk_ctx_destroy(&c);
            CHECK_FAILS(
                &c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = 2, .cp = 2, .pp = 2}),
                TPK_ERR_ARG, "desc->pp: expected a divisor of world size / (tp cp)");
            tpk_ctx_destroy(&c);
        }
    }
}

/* ---- the split ------------------------------------------------------------------------------- */

static void test_split(int tp) {
    int cp = np / tp;
    tpk_ctx c;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .cp = cp}));
    const int64_t B = 2, S = 6 * cp, Sl = S / cp, cols = 5;
    int64_t pos[64];
    CHECK_OK(&c, tpk_cp_positions(&c, S, pos));
    /* every position once over the CP ranks; the same causal work (visible pairs) on each */
    int32_t mine[64], all[256], work = 0, works[16];
    for (int64_t i = 0; i < Sl; i++) mine[i] = (int32_t)pos[i], work += (int32_t)pos[i] + 1;
    size_t counts[16], wc[16];
    for (int q = 0; q < cp; q++) counts[q] = (size_t)Sl, wc[q] = 1;
    CHECK_OK(&c, tpk_allgatherv(&c, &c.cp, mine, (size_t)Sl, all, counts, (size_t)S, TPK_I32));
    CHECK_OK(&c, tpk_allgatherv(&c, &c.cp, &work, 1, works, wc, (size_t)cp, TPK_I32));
    int seen[256] = {0};
    for (int64_t i = 0; i < S; i++)
        if (all[i] >= 0 && all[i] < S) seen[all[i]]++;
    for (int64_t i = 0; i < S; i++)
        CHECK(seen[i] == 1, "position %lld held %d times", (long long)i, seen[i]);
    for (int q = 0; q < cp; q++)
        CHECK(works[q] == works[0], "CP rank %d: %d visible pairs, rank 0 %d", q, works[q],
              works[0]);
    for (int64_t i = 0; i < Sl; i++) {
        int64_t sc = S / (2 * cp), k = i / sc,
                want = (k ? 2 * cp - 1 - c.cp.rank : c.cp.rank) * sc + i % sc;
        CHECK(pos[i] == want, "row %lld: position %lld, expected %lld", (long long)i,
              (long long)pos[i], (long long)want);
    }
    /* scatter, gather: against the positions; every element written (poison) */
    float *whole = (float *)malloc(sizeof(float) * (size_t)(B * S * cols)),
          *back = (float *)malloc(sizeof(float) * (size_t)(B * S * cols)),
          *local = (float *)malloc(sizeof(float) * (size_t)(B * Sl * cols));
    test_randn(whole, (size_t)(B * S * cols), 11, 1.0f);
    test_poison(local, (size_t)(B * Sl * cols)), test_poison(back, (size_t)(B * S * cols));
    CHECK_OK(&c, tpk_cp_scatter(&c, local, whole, B, S, cols, TPK_F32));
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sl; i++)
            for (int64_t e = 0; e < cols; e++)
                bad += local[(b * Sl + i) * cols + e] != whole[(b * S + pos[i]) * cols + e];
    CHECK(bad == 0, "scatter: %d elements not at their positions", bad);
    CHECK_OK(&c, tpk_cp_gather(&c, back, local, B, S, cols, TPK_F32));
    CHECK(!memcmp(back, whole, sizeof(float) * (size_t)(B * S * cols)), "gather(scatter(x)) != x");
    int32_t ids[64], lids[64];
    for (int64_t i = 0; i < B * S; i++) ids[i] = (int32_t)(1000 * (i / S) + i % S);
    CHECK_OK(&c, tpk_cp_scatter_host(&c, lids, ids, B, S, sizeof(int32_t)));
    bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sl; i++) bad += lids[b * Sl + i] != (int32_t)(1000 * b + pos[i]);
    CHECK(bad == 0, "scatter_host: %d token ids not at their positions", bad);
    CHECK_FAILS(&c, tpk_cp_positions(&c, S + 1, pos), TPK_ERR_SHAPE,
                "S: expected a sequence length that is a multiple of 2 x cp");
    CHECK_FAILS(&c, tpk_cp_scatter(&c, local, whole, B, S + 2 * cp - 1, cols, TPK_F32),
                TPK_ERR_SHAPE, "tpk_cp_scatter: S: expected a sequence length");
    CHECK_FAILS(&c, tpk_cp_gather(&c, back, NULL, B, S, cols, TPK_F32), TPK_ERR_ARG,
                "local: expected a buffer");
    free(whole), free(back), free(local);
    tpk_ctx_destroy(&c);
}

/* ---- attention over CP ----------------------------------------------------------------------- */

/* One configuration: TP x CP = the ranks, heads A over G key/value heads, head size D, B
 * sequences of S = 2c Sc tokens, causal or not, the mode, the dtype. */
typedef struct cpcase {
    int tp;
    int64_t A, G, D, B, Sc;
    bool full;
    tpk_cp_comm comm;
    tpk_dtype dt;
} cpcase;

/* The global inputs, the same on every rank: q [B, S, A, D], k, v [B, S, G, D], dout
 * [B, S, A, D]. */
typedef struct glob {
    int64_t B, S, A, G, D;
    float *q, *k, *v, *dout;
} glob;
#define GQ(g, b, i, a, d) (g)->q[(((b) * (g)->S + (i)) * (g)->A + (a)) * (g)->D + (d)]
#define GK(g, b, i, a, d) (g)->k[(((b) * (g)->S + (i)) * (g)->G + (a)) * (g)->D + (d)]
#define GV(g, b, i, a, d) (g)->v[(((b) * (g)->S + (i)) * (g)->G + (a)) * (g)->D + (d)]
#define GO(g, b, i, a, d) (g)->dout[(((b) * (g)->S + (i)) * (g)->A + (a)) * (g)->D + (d)]

/* The attention in double of the query heads [a0, a0 + Al): out, lse [B, S, Al(, D)] and dq
 * [B, S, Al, D], dk, dv [B, S, G, D] (the sums over those query heads alone), causal or not. */
static void attn_ref(const glob *g, bool full, int64_t a0, int64_t Al, double scale, double *out,
                     double *lse, double *dq, double *dk, double *dv) {
    int64_t S = g->S, D = g->D, grp = g->A / g->G;
    double *P = (double *)malloc(sizeof(double) * (size_t)S);
    memset(dq, 0, sizeof(double) * (size_t)(g->B * S * Al * D));
    memset(dk, 0, sizeof(double) * (size_t)(g->B * S * g->G * D));
    memset(dv, 0, sizeof(double) * (size_t)(g->B * S * g->G * D));
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t h = 0; h < Al; h++) {
            int64_t a = a0 + h, kv = a / grp;
            for (int64_t i = 0; i < S; i++) {
                int64_t n = full ? S : i + 1;
                double m = -INFINITY, sum = 0, Dr = 0;
                for (int64_t j = 0; j < n; j++) {
                    double sc = 0;
                    for (int64_t d = 0; d < D; d++)
                        sc += (double)GQ(g, b, i, a, d) * GK(g, b, j, kv, d);
                    P[j] = scale * sc, m = P[j] > m ? P[j] : m;
                }
                for (int64_t j = 0; j < n; j++) sum += exp(P[j] - m);
                double l = m + log(sum);
                lse[(b * S + i) * Al + h] = l;
                for (int64_t j = 0; j < n; j++) P[j] = exp(P[j] - l);
                double *o = out + ((b * S + i) * Al + h) * D;
                for (int64_t d = 0; d < D; d++) {
                    o[d] = 0;
                    for (int64_t j = 0; j < n; j++) o[d] += P[j] * GV(g, b, j, kv, d);
                    Dr += o[d] * GO(g, b, i, a, d);
                }
                for (int64_t j = 0; j < n; j++) {
                    double dp = 0;
                    for (int64_t d = 0; d < D; d++)
                        dp += (double)GO(g, b, i, a, d) * GV(g, b, j, kv, d);
                    double ds = P[j] * (dp - Dr);
                    for (int64_t d = 0; d < D; d++) {
                        dq[((b * S + i) * Al + h) * D + d] += scale * ds * GK(g, b, j, kv, d);
                        dk[((b * S + j) * g->G + kv) * D + d] += scale * ds * GQ(g, b, i, a, d);
                        dv[((b * S + j) * g->G + kv) * D + d] += P[j] * GO(g, b, i, a, d);
                    }
                }
            }
        }
    free(P);
}

/* max |got - want| / max(max |want|, 1e-30) of n values at got[i] (float, NaN: INFINITY) */
static double relerr_d(const float *got, const double *want, size_t n) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        num = fmax(num, fabs(got[i] - want[i])), den = fmax(den, fabs(want[i]));
    }
    return num / den;
}
static void to_f32(float *dst, const void *src, size_t n, tpk_dtype dt) {
    for (size_t i = 0; i < n; i++)
        dst[i] =
            dt == TPK_F32 ? ((const float *)src)[i] : tpk_bf16_to_f32(((const uint16_t *)src)[i]);
}
static void from_f32(void *dst, const float *src, size_t n, tpk_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        if (dt == TPK_F32) ((float *)dst)[i] = src[i];
        else ((uint16_t *)dst)[i] = tpk_f32_to_bf16(src[i]);
    }
}

/* Results of one run on this rank, as f32: out [T, Al D], lse [B, Al, Sl], dqkv [T, ld3]. */
typedef struct cpres {
    float *out, *lse, *dqkv;
    size_t no, nl, nd;
    int64_t ld, qcols; /* dqkv's row, its Q columns */
} cpres;

/* The block op's backward wrapped: at each call, whether one of the ring's dK|dV halves (a batch
 * of dkv_elems, its send and receive of n / 2 f32 each) is in flight on the CP communicator (its
 * flight record started, not yet waited). */
static tpk_status (*bwd_op)(tpk_ctx *, float *, float *, const void *, const void *, const float *,
                            const void *, const void *, const tpk_attn_blk *, tpk_dtype);
static uint64_t dkv_elems, bwd_calls, bwd_overlapped;
static tpk_status bwd_watch(tpk_ctx *ctx, float *dq, float *dkv, const void *dout, const void *out,
                            const float *lse, const void *q, const void *kv, const tpk_attn_blk *b,
                            tpk_dtype dt) {
    const tpk_flight *f = &ctx->cp.flight;
    bool in = false;
    for (int i = 0; i < TPK_FLIGHT_N; i++)
        in |= f->ring[i].id && f->ring[i].kind == TPK_COLL_SEND &&
              f->ring[i].state == TPK_FLIGHT_RUNNING && f->ring[i].elems == dkv_elems;
    bwd_calls++, bwd_overlapped += in;
    return bwd_op(ctx, dq, dkv, dout, out, lse, q, kv, b, dt);
}

static void test_cp_case(const cpcase *cc, cpres *res) {
    int cp = np / cc->tp;
    tpk_ctx c;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){
                                      .world = &world, .tp = cc->tp, .cp = cp, .dtype = cc->dt}));
    glob g = {cc->B, 2 * cp * cc->Sc, cc->A, cc->G, cc->D, NULL, NULL, NULL, NULL};
    int64_t S = g.S, Sl = S / cp, T = g.B * Sl, D = g.D;
    size_t nq = (size_t)(g.B * S * g.A * D), nk = (size_t)(g.B * S * g.G * D);
    g.q = (float *)malloc(sizeof(float) * nq), g.dout = (float *)malloc(sizeof(float) * nq);
    g.k = (float *)malloc(sizeof(float) * nk), g.v = (float *)malloc(sizeof(float) * nk);
    test_randn(g.q, nq, 101, 1.0f), test_randn(g.dout, nq, 102, 1.0f);
    test_randn(g.k, nk, 103, 1.0f), test_randn(g.v, nk, 104, 1.0f);
    if (cc->dt != TPK_F32) /* the reference on the inputs as the bf16 run sees them */
        for (size_t i = 0; i < nq; i++)
            g.q[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(g.q[i])),
            g.dout[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(g.dout[i]));
    if (cc->dt != TPK_F32)
        for (size_t i = 0; i < nk; i++)
            g.k[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(g.k[i])),
            g.v[i] = tpk_bf16_to_f32(tpk_f32_to_bf16(g.v[i]));
    tpk_range hr = tpk_tp_split(&c, g.A, c.tp.rank);
    int64_t a0 = hr.off, Al = hr.size, g0, Gl = tpk_attn_kv_heads(g.A, g.G, a0, Al, &g0);
    int64_t ld3 = (Al + 2 * Gl) * D, AD = Al * D;
    int64_t pos[256];
    CHECK_OK(&c, tpk_cp_positions(&c, S, pos));
    /* this rank's rows: qkv [T, ld3], dout [T, Al D] */
    float *qkv = (float *)malloc(sizeof(float) * (size_t)(T * ld3 + 1)),
          *dout = (float *)malloc(sizeof(float) * (size_t)(T * AD + 1));
    for (int64_t b = 0; b < g.B; b++)
        for (int64_t i = 0; i < Sl; i++) {
            float *row = qkv + (b * Sl + i) * ld3;
            for (int64_t h = 0; h < Al; h++)
                for (int64_t d = 0; d < D; d++)
                    row[h * D + d] = GQ(&g, b, pos[i], a0 + h, d),
                                dout[(b * Sl + i) * AD + h * D + d] = GO(&g, b, pos[i], a0 + h, d);
            for (int64_t h = 0; h < Gl; h++)
                for (int64_t d = 0; d < D; d++)
                    row[AD + h * D + d] = GK(&g, b, pos[i], g0 + h, d),
                                     row[AD + (Gl + h) * D + d] = GV(&g, b, pos[i], g0 + h, d);
        }
    size_t es = tpk_dtype_size(cc->dt);
    void *qkv_d = malloc(es * (size_t)(T * ld3 + 1)), *dout_d = malloc(es * (size_t)(T * AD + 1)),
         *out_d = malloc(es * (size_t)(T * AD + 1)), *dqkv_d = malloc(es * (size_t)(T * ld3 + 1));
    float *lse = (float *)malloc(sizeof(float) * (size_t)(g.B * Al * Sl + 1));
    from_f32(qkv_d, qkv, (size_t)(T * ld3), cc->dt),
        from_f32(dout_d, dout, (size_t)(T * AD), cc->dt);
    memset(out_d, 0xff, es * (size_t)(T * AD + 1)),
        memset(dqkv_d, 0xff, es * (size_t)(T * ld3 + 1));
    test_poison(lse, (size_t)(g.B * Al * Sl + 1));
    tpk_cp_attn a;
    tpk_cp_attn_desc ad;
    memset(&ad, 0, sizeof ad);
    ad.comm = cc->comm, ad.full = cc->full;
    CHECK_OK(&c, tpk_cp_attn_init(&c, &a, &ad));
    float scale = 1.0f / sqrtf((float)D);
    int64_t n = T * 2 * Gl * D; /* elements of one K|V block */
    tpk_comm_stats_reset(&c.cp), tpk_comm_stats_reset(&c.tp);
    CHECK_OK(&c, tpk_profile_start(&c));
    CHECK_OK(&c,
             tpk_cp_attn_forward(&c, &a, out_d, lse, qkv_d, g.B, S, g.A, g.G, a0, Al, D, scale));
    CHECK_OK(&c, tpk_profile_step(&c));
    /* the blocks computed: causal, query chunk m sees key chunks 0..m (2c + 1 blocks a sequence:
       the masked ones skipped), else all 4c; the same work (flops) on every CP rank */
    double calls = 0, flops[2] = {0, 0};
    for (int i = 0; i < c.prof->nrows; i++)
        if (!strcmp(c.prof->rows[i].name, "attn_block_fwd"))
            calls = (double)c.prof->rows[i].calls, flops[0] = c.prof->rows[i].flops;
    flops[1] = -flops[0];
    CHECK_OK(&c, tpk_allreduce_host(&c, &c.cp, flops, 2, TPK_F64, TPK_MAX));
    if (Al)
        CHECK(calls == (double)(g.B * (cc->full ? 4 * cp : 2 * cp + 1)) && flops[0] == -flops[1],
              "%g blocks computed, expected B (%s) = %lld; flops from %g to %g over the CP ranks",
              calls, cc->full ? "4c" : "2c + 1",
              (long long)(g.B * (cc->full ? 4 * cp : 2 * cp + 1)), -flops[1], flops[0]);
    tpk_profile_stop(&c);
    const tpk_comm_stats *st = &c.cp.stats;
    if (cc->comm == TPK_CP_P2P && Al) {
        CHECK(st->calls[TPK_COLL_SEND] == (uint64_t)(cp - 1) &&
                  st->calls[TPK_COLL_RECV] == (uint64_t)(cp - 1) &&
                  st->bytes[TPK_COLL_SEND] == (uint64_t)((cp - 1) * n) * es &&
                  st->bytes[TPK_COLL_RECV] == (uint64_t)((cp - 1) * n) * es,
              "forward ring: %llu sends of %llu bytes, %llu receives of %llu, expected c - 1 = %d "
              "of n = B (S/c) 2 Gl D = %lld elements (%zu bytes each)",
              (unsigned long long)st->calls[TPK_COLL_SEND],
              (unsigned long long)st->bytes[TPK_COLL_SEND],
              (unsigned long long)st->calls[TPK_COLL_RECV],
              (unsigned long long)st->bytes[TPK_COLL_RECV], cp - 1, (long long)n, es);
    } else if (Al) {
        CHECK(st->calls[TPK_COLL_ALLGATHER] == (cp > 1) &&
                  st->bytes[TPK_COLL_ALLGATHER] == (uint64_t)(cp > 1 ? cp * n : 0) * es &&
                  st->calls[TPK_COLL_SEND] == 0,
              "forward all-gather: %llu of %llu bytes, expected 1 of c n = %lld elements (c > 1)",
              (unsigned long long)st->calls[TPK_COLL_ALLGATHER],
              (unsigned long long)st->bytes[TPK_COLL_ALLGATHER], (long long)(cp * n));
    }
    tpk_comm_stats_reset(&c.cp);
    tpk_ops watched = *c.ops;
    const tpk_ops *plain = c.ops;
    bwd_op = plain->attn_block_bwd, watched.attn_block_bwd = bwd_watch, c.ops = &watched;
    dkv_elems = (uint64_t)n, bwd_calls = bwd_overlapped = 0; /* a half's send and receive */
    CHECK_OK(&c, tpk_cp_attn_backward(&c, &a, dqkv_d, dout_d, qkv_d, out_d, lse, g.B, S, g.A, g.G,
                                      a0, Al, D, scale));
    c.ops = plain;
    if (cc->comm == TPK_CP_P2P && Al) {
        uint64_t want = (uint64_t)((cp - 1) * n) * es + (uint64_t)(cp > 1 ? cp * n : 0) * 4;
        CHECK(st->calls[TPK_COLL_SEND] == (uint64_t)(cp > 1 ? 3 * cp - 1 : 0) &&
                  st->bytes[TPK_COLL_SEND] == want && st->bytes[TPK_COLL_RECV] == want,
              "backward ring: %llu sends of %llu bytes, expected (c - 1) K|V + c f32 gradients "
              "in halves = %d of %llu",
              (unsigned long long)st->calls[TPK_COLL_SEND],
              (unsigned long long)st->bytes[TPK_COLL_SEND], 3 * cp - 1, (unsigned long long)want);
        /* every call but those of the first step's first half (the own block's key pieces
           p = 2 s + ka < B; chunk 0 seen by both query chunks, chunk 2c - 1 - r by one, causal)
           runs with a dK|dV half in flight: started before it, waited after it */
        uint64_t bare = 0;
        for (int64_t p = 0; p < g.B; p++) bare += p % 2 && !cc->full ? 1 : 2;
        if (cp == 1) bare = bwd_calls;
        CHECK(bwd_calls - bwd_overlapped == bare,
              "backward ring: %llu of %llu block calls ran with a dK|dV half in flight, "
              "expected all but %llu",
              (unsigned long long)bwd_overlapped, (unsigned long long)bwd_calls,
              (unsigned long long)bare);
    } else if (Al) {
        CHECK(st->calls[TPK_COLL_ALLGATHER] == (cp > 1) &&
                  st->calls[TPK_COLL_REDUCE_SCATTER] == (cp > 1) &&
                  st->bytes[TPK_COLL_REDUCE_SCATTER] == (uint64_t)(cp > 1 ? cp * n : 0) * 4,
              "backward: %llu all-gathers, %llu reduce-scatters of %llu bytes, expected 1, 1 of "
              "c n f32",
              (unsigned long long)st->calls[TPK_COLL_ALLGATHER],
              (unsigned long long)st->calls[TPK_COLL_REDUCE_SCATTER],
              (unsigned long long)st->bytes[TPK_COLL_REDUCE_SCATTER]);
    }
    uint64_t tpc = 0;
    for (int k = 0; k < TPK_COLL_N; k++) tpc += c.tp.stats.calls[k];
    CHECK(tpc == 0, "%llu collectives over TP: the attention has none", (unsigned long long)tpc);
    /* against the double reference, at this rank's positions and heads */
    size_t nr = (size_t)(g.B * S * Al * D), nrk = (size_t)(g.B * S * g.G * D);
    double *ro = (double *)malloc(sizeof(double) * (nr + 1)),
           *rl = (double *)malloc(sizeof(double) * (size_t)(g.B * S * Al + 1)),
           *rq = (double *)malloc(sizeof(double) * (nr + 1)),
           *rk = (double *)malloc(sizeof(double) * (nrk + 1)),
           *rv = (double *)malloc(sizeof(double) * (nrk + 1));
    attn_ref(&g, cc->full, a0, Al, scale, ro, rl, rq, rk, rv);
    res->out = (float *)malloc(sizeof(float) * (size_t)(T * AD + 1));
    res->dqkv = (float *)malloc(sizeof(float) * (size_t)(T * ld3 + 1));
    res->lse = lse;
    res->no = (size_t)(T * AD), res->nl = (size_t)(g.B * Al * Sl), res->nd = (size_t)(T * ld3);
    res->ld = ld3 > 0 ? ld3 : 1, res->qcols = AD;
    to_f32(res->out, out_d, (size_t)(T * AD), cc->dt);
    to_f32(res->dqkv, dqkv_d, (size_t)(T * ld3), cc->dt);
    float *go = (float *)malloc(sizeof(float) * (nr + 1)),
          *gl = (float *)malloc(sizeof(float) * (size_t)(g.B * S * Al + 1)),
          *gq = (float *)malloc(sizeof(float) * (nr + 1)),
          *gk = (float *)malloc(sizeof(float) * (size_t)(T * Gl * D + 1)),
          *gv = (float *)malloc(sizeof(float) * (size_t)(T * Gl * D + 1));
    double *wo = (double *)malloc(sizeof(double) * (nr + 1)),
           *wl = (double *)malloc(sizeof(double) * (size_t)(g.B * S * Al + 1)),
           *wq = (double *)malloc(sizeof(double) * (nr + 1)),
           *wk = (double *)malloc(sizeof(double) * (size_t)(T * Gl * D + 1)),
           *wv = (double *)malloc(sizeof(double) * (size_t)(T * Gl * D + 1));
    size_t m = 0, ml = 0, mk = 0;
    for (int64_t b = 0; b < g.B; b++)
        for (int64_t i = 0; i < Sl; i++) {
            int64_t p = pos[i];
            for (int64_t h = 0; h < Al; h++) {
                gl[ml] = lse[(b * Al + h) * Sl + i], wl[ml++] = rl[(b * S + p) * Al + h];
                for (int64_t d = 0; d < D; d++, m++) {
                    go[m] = res->out[(b * Sl + i) * AD + h * D + d];
                    wo[m] = ro[((b * S + p) * Al + h) * D + d];
                    gq[m] = res->dqkv[(b * Sl + i) * ld3 + h * D + d];
                    wq[m] = rq[((b * S + p) * Al + h) * D + d];
                }
            }
            for (int64_t h = 0; h < Gl; h++)
                for (int64_t d = 0; d < D; d++, mk++) {
                    gk[mk] = res->dqkv[(b * Sl + i) * ld3 + AD + h * D + d];
                    gv[mk] = res->dqkv[(b * Sl + i) * ld3 + AD + (Gl + h) * D + d];
                    wk[mk] = rk[((b * S + p) * g.G + g0 + h) * D + d];
                    wv[mk] = rv[((b * S + p) * g.G + g0 + h) * D + d];
                }
        }
    double tol = cc->dt == TPK_F32 ? 2e-5 : 3e-2;
    double e[5] = {relerr_d(go, wo, m), relerr_d(gl, wl, ml), relerr_d(gq, wq, m),
                   relerr_d(gk, wk, mk), relerr_d(gv, wv, mk)};
    const char *what[5] = {"out", "lse", "dQ", "dK", "dV"};
    for (int k = 0; k < 5; k++)
        CHECK(e[k] < tol, "%s: relative error %.3g >= %.3g against the unsharded attention",
              what[k], e[k], tol);
    /* every element written (the poison gone): out, lse, dqkv */
    int nan = 0;
    for (int64_t i = 0; i < T * AD; i++) nan += isnan(res->out[i]);
    for (int64_t i = 0; i < g.B * Al * Sl; i++) nan += isnan(lse[i]);
    for (int64_t i = 0; i < T * ld3; i++) nan += isnan(res->dqkv[i]);
    CHECK(nan == 0, "%d elements of out, lse, dqkv not written", nan);
    /* causal: also the kit's own attention op on the whole sequence (one rank, no CP) */
    if (!cc->full && cc->dt == TPK_F32 && Al) {
        tpk_ctx one;
        CHECK_OK(&one, tpk_ctx_init(&one, &(tpk_ctx_desc){.ops = tpk_ops_host()}));
        int64_t ldf = (Al + 2 * Gl) * D;
        float *fq = (float *)malloc(sizeof(float) * (size_t)(g.B * S * ldf)),
              *fd = (float *)malloc(sizeof(float) * (size_t)(g.B * S * AD)),
              *fo = (float *)malloc(sizeof(float) * (size_t)(g.B * S * AD)),
              *fl = (float *)malloc(sizeof(float) * (size_t)(g.B * Al * S)),
              *fg = (float *)malloc(sizeof(float) * (size_t)(g.B * S * ldf));
        for (int64_t b = 0; b < g.B; b++)
            for (int64_t i = 0; i < S; i++) {
                for (int64_t h = 0; h < Al; h++)
                    for (int64_t d = 0; d < D; d++)
                        fq[(b * S + i) * ldf + h * D + d] = GQ(&g, b, i, a0 + h, d),
                                                       fd[(b * S + i) * AD + h * D + d] =
                                                           GO(&g, b, i, a0 + h, d);
                for (int64_t h = 0; h < Gl; h++)
                    for (int64_t d = 0; d < D; d++)
                        fq[(b * S + i) * ldf + AD + h * D +
                           d] = GK(&g, b, i, g0 + h, d),
                           fq[(b * S + i) * ldf + AD + (Gl + h) * D + d] = GV(&g, b, i, g0 + h, d);
            }
        CHECK_OK(&one, tpk_op_attn_fwd(&one, fo, fl, fq, g.B, S, Al, D, g.A, g.G, a0, scale, 0, 0,
                                       0, TPK_F32));
        CHECK_OK(&one, tpk_op_attn_bwd(&one, fg, fd, fq, fo, fl, g.B, S, Al, D, g.A, g.G, a0, scale,
                                       0, 0, 0, TPK_F32));
        double eo = 0, eg = 0, so = 1e-30, sg = 1e-30;
        for (int64_t b = 0; b < g.B; b++)
            for (int64_t i = 0; i < Sl; i++) {
                for (int64_t e2 = 0; e2 < AD; e2++) {
                    double w = fo[(b * S + pos[i]) * AD + e2];
                    eo = fmax(eo, fabs(res->out[(b * Sl + i) * AD + e2] - w)),
                    so = fmax(so, fabs(w));
                }
                for (int64_t e2 = 0; e2 < ld3; e2++) {
                    double w = fg[(b * S + pos[i]) * ldf + e2];
                    eg = fmax(eg, fabs(res->dqkv[(b * Sl + i) * ld3 + e2] - w)),
                    sg = fmax(sg, fabs(w));
                }
            }
        CHECK(eo / so < 2e-5 && eg / sg < 2e-5,
              "against tpk_op_attn_fwd/bwd on the whole sequence: out %.3g, dqkv %.3g", eo / so,
              eg / sg);
        free(fq), free(fd), free(fo), free(fl), free(fg);
        tpk_ctx_destroy(&one);
    }
    free(go), free(gl), free(gq), free(gk), free(gv), free(wo), free(wl), free(wq), free(wk),
        free(wv);
    free(ro), free(rl), free(rq), free(rk), free(rv);
    free(qkv), free(dout), free(qkv_d), free(dout_d), free(out_d), free(dqkv_d);
    free(g.q), free(g.k), free(g.v), free(g.dout);
    tpk_cp_attn_destroy(&c, &a);
    tpk_ctx_destroy(&c);
}
static void cpres_free(cpres *r) { free(r->out), free(r->lse), free(r->dqkv); }

static void test_cp_cases(void) {
    int tps[2] = {1, np == 4 ? 2 : 0};
    for (int ti = 0; ti < 2; ti++) {
        int tp = tps[ti];
        if (!tp) continue;
        for (int full = 0; full < 2; full++)
            for (int gqa = 0; gqa < 2; gqa++)
                TEST_CASE(
                    "attention over TP %d x CP %d, %s, %s: ring and all-gather equal the "
                    "unsharded attention (out, lse, dQ, dK, dV; double reference%s), each other "
                    "bit for bit in out, lse, dQ; every output written; masked blocks skipped, "
                    "equal work per rank; messages per step",
                    tp, np / tp, full ? "no mask" : "causal", gqa ? "GQA A 4 / G 2" : "MHA A 4",
                    full ? "" : " and tpk_op_attn_fwd/bwd") {
                    cpcase cc = {tp, 4, gqa ? 2 : 4, 8, 2, 3, full != 0, TPK_CP_P2P, TPK_F32};
                    cpres r1, r2;
                    test_cp_case(&cc, &r1);
                    cc.comm = TPK_CP_ALLGATHER;
                    test_cp_case(&cc, &r2);
                    CHECK(r1.no == r2.no && !memcmp(r1.out, r2.out, sizeof(float) * r1.no),
                          "out: the ring and the all-gather differ");
                    CHECK(!memcmp(r1.lse, r2.lse, sizeof(float) * r1.nl),
                          "lse: the ring and the all-gather differ");
                    int dqd = 0; /* dQ summed in one order; dK, dV in the ring's or MPI's */
                    for (size_t i = 0; i < r1.nd; i++)
                        dqd += i % (size_t)r1.ld < (size_t)r1.qcols && r1.dqkv[i] != r2.dqkv[i];
                    CHECK(dqd == 0, "dQ: the ring and the all-gather differ in %d elements", dqd);
                    cpres_free(&r1), cpres_free(&r2);
                }
    }
    TEST_CASE("attention over CP %d in bf16 (GQA, causal, the ring): the unsharded attention on "
              "the rounded inputs within 3e-2",
              np) {
        cpcase cc = {1, 4, 2, 8, 2, 3, false, TPK_CP_P2P, TPK_BF16};
        cpres r;
        test_cp_case(&cc, &r);
        cpres_free(&r);
    }
}

/* The block op where no key is visible to some rows (queries before the keys): lse -inf and o 0,
 * and merged into a running pair they change nothing; its geometry refused by name. */
static void test_block_op(void) {
    TEST_CASE("attn_block_fwd/bwd: rows that see no key give lse -inf and o 0 and merge as "
              "nothing; their gradients 0; bad geometry refused by name") {
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.ops = tpk_ops_host()}));
        enum { SQ = 4, SK = 3, DD = 4 };
        float q[SQ * DD], kv[SK * 2 * DD], out[SQ * DD], lse[SQ], o2[SQ * DD], l2[SQ];
        test_randn(q, SQ * DD, 5, 1.0f), test_randn(kv, SK * 2 * DD, 6, 1.0f);
        tpk_attn_blk b;
        memset(&b, 0, sizeof b);
        b.Sq = SQ, b.Sk = SK, b.q0 = 10, b.k0 = 11, b.causal = true, b.Al = 1, b.D = DD, b.A = 1,
        b.G = 1, b.scale = 0.5f, b.ldq = b.lddq = DD, b.ldkv = 2 * DD, b.ldo = DD, b.ldl = SQ;
        test_poison(out, SQ * DD), test_poison(lse, SQ);
        CHECK_OK(&c, tpk_op_attn_block_fwd(&c, out, lse, q, kv, &b, false, TPK_F32));
        /* row 0 (position 10) sees none of the keys at 11.., row i sees i of them */
        CHECK(lse[0] == -INFINITY && out[0] == 0 && out[DD - 1] == 0,
              "row 0: lse %g, o[0] %g (expected -inf, 0)", (double)lse[0], (double)out[0]);
        CHECK(isfinite(lse[1]) && isfinite(lse[3]), "rows 1..3: lse %g %g", (double)lse[1],
              (double)lse[3]);
        memcpy(o2, out, sizeof out), memcpy(l2, lse, sizeof lse);
        b.q0 = 0; /* every key after every query: all rows -inf, merged: nothing changes */
        CHECK_OK(&c, tpk_op_attn_block_fwd(&c, o2, l2, q, kv, &b, true, TPK_F32));
        CHECK(!memcmp(o2, out, sizeof out) && !memcmp(l2, lse, sizeof lse),
              "a block no row sees changed the merged result");
        float dq[SQ * DD], dkv[SK * 2 * DD];
        memset(dq, 0, sizeof dq), memset(dkv, 0, sizeof dkv);
        CHECK_OK(&c, tpk_op_attn_block_bwd(&c, dq, dkv, out, out, lse, q, kv, &b, TPK_F32));
        int nz = 0;
        for (int i = 0; i < SQ * DD; i++) nz += dq[i] != 0;
        for (int i = 0; i < SK * 2 * DD; i++) nz += dkv[i] != 0;
        CHECK(nz == 0, "%d gradients of a block no row sees are not 0", nz);
        CHECK_FAILS(&c, tpk_op_attn_block_fwd(&c, out, lse, q, kv, NULL, false, TPK_F32),
                    TPK_ERR_ARG, "b: expected a block's geometry");
        b.ldkv = DD;
        CHECK_FAILS(&c, tpk_op_attn_block_fwd(&c, out, lse, q, kv, &b, false, TPK_F32), TPK_ERR_ARG,
                    "b->ldkv: expected >= 8");
        b.ldkv = 2 * DD, b.G = 2;
        CHECK_FAILS(&c, tpk_op_attn_block_bwd(&c, dq, dkv, out, out, lse, q, kv, &b, TPK_F32),
                    TPK_ERR_ARG, "b->G: expected a divisor of b->A = 1");
        tpk_ctx_destroy(&c);
    }
}

/* a communicator table like the CP group's without point-to-point */
static tpk_comm_vtable nop2p;

static void test_cp_refusals(void) {
    TEST_CASE("attention over CP %d: bad input refused by name (a length not a multiple of 2c, "
              "the ring on a communicator without point-to-point, the mode, the heads, buffers)",
              np) {
        tpk_ctx c;
        CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .cp = np}));
        tpk_cp_attn a;
        tpk_cp_attn_desc d;
        memset(&d, 0, sizeof d);
        float buf[4096];
        memset(buf, 0, sizeof buf);
        CHECK_OK(&c, tpk_cp_attn_init(&c, &a, &d));
        int64_t S = 2 * np * 2;
        CHECK_FAILS(&c, tpk_cp_attn_forward(&c, &a, buf, buf, buf, 1, S + 1, 2, 2, 0, 2, 4, 0.5f),
                    TPK_ERR_SHAPE, "S: expected a sequence length that is a multiple of 2 x cp");
        CHECK_FAILS(
            &c,
            tpk_cp_attn_backward(&c, &a, buf, buf, buf, buf, buf, 1, S + np, 2, 2, 0, 2, 4, 0.5f),
            TPK_ERR_SHAPE, "tpk_cp_attn_backward: S: expected");
        CHECK_FAILS(&c, tpk_cp_attn_forward(&c, &a, buf, buf, buf, 1, S, 4, 3, 0, 4, 4, 0.5f),
                    TPK_ERR_SHAPE, "G: expected a divisor of A = 4");
        CHECK_FAILS(&c, tpk_cp_attn_forward(&c, &a, buf, buf, buf, 1, S, 2, 2, 1, 2, 4, 0.5f),
                    TPK_ERR_SHAPE, "a0, Al: expected local heads");
        CHECK_FAILS(&c, tpk_cp_attn_forward(&c, &a, buf, buf, NULL, 1, S, 2, 2, 0, 2, 4, 0.5f),
                    TPK_ERR_ARG, "qkv: expected a buffer");
        tpk_cp_attn_destroy(&c, &a);
        CHECK_FAILS(&c, tpk_cp_attn_forward(&c, &a, buf, buf, buf, 1, S, 2, 2, 0, 2, 4, 0.5f),
                    TPK_ERR_ARG, "a: expected an attention initialised by tpk_cp_attn_init");
        d.comm = (tpk_cp_comm)7;
        CHECK_FAILS(&c, tpk_cp_attn_init(&c, &a, &d), TPK_ERR_ARG,
                    "desc->comm: expected TPK_CP_P2P or TPK_CP_ALLGATHER, got 7");
        /* the CP group's table without its p2p entry: the ring refused, the all-gather taken */
        const tpk_comm_vtable *keep = c.cp.vt;
        nop2p = *keep, nop2p.p2p = NULL, c.cp.vt = &nop2p;
        d.comm = TPK_CP_P2P;
        if (np > 1)
            CHECK_FAILS(&c, tpk_cp_attn_init(&c, &a, &d), TPK_ERR_ARG,
                        "desc->comm: the p2p ring needs point-to-point, and the CP communicator");
        d.comm = TPK_CP_ALLGATHER;
        CHECK_OK(&c, tpk_cp_attn_init(&c, &a, &d));
        a.comm = TPK_CP_P2P; /* a layer made before the communicator lost it */
        if (np > 1)
            CHECK_FAILS(&c, tpk_cp_attn_forward(&c, &a, buf, buf, buf, 1, S, 2, 2, 0, 2, 4, 0.5f),
                        TPK_ERR_ARG, "ctx->cp: the p2p ring needs point-to-point");
        c.cp.vt = keep;
        tpk_cp_attn_destroy(&c, &a);
        tpk_ctx_destroy(&c);
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK) return 1;
    test_mesh_cases();
    TEST_CASE("split of S = 6c over CP %d: positions r Sc + i and (2c - 1 - r) Sc + i, each once, "
              "equal causal work; scatter and gather by them; S not a multiple of 2c refused",
              np) {
        test_split(1);
    }
    if (np == 4) TEST_CASE("split under TP 2 x CP 2: the same over each TP rank's CP group") {
            test_split(2);
        }
    test_block_op();
    test_cp_cases();
    test_cp_refusals();
    tpk_comm_destroy(&world);
    return test_finish();
}
