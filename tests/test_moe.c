/* tests/test_moe.c — mixture of experts with expert parallelism.
 *
 * The mesh: EP groups of consecutive DP ranks (ctx->ep) and an expert's replicas (ctx->edp), their
 * members against the formula on every mesh of the world, nothing split at ep = 1, bad sizes
 * refused by name. The router (tpk/layers/router.h) on one rank: the top-k with ties (integer
 * logits, repeated rows: the lower index first), the weights (renormalised or not), the counts and
 * the auxiliary loss against a plain C reference in double; its backward (dx, the gate's gradient)
 * against central differences of the routed objective. The dispatcher (tpk/layers/moe.h): the rows
 * each EP rank receives for its experts (an expert with none, ranks of 2 and 0 tokens), the
 * combine, its backward and the dispatch's backward against the senders' tokens, the all-to-alls
 * counted; the MoE block at EP 1, 2, 3, 4, TP 2 x EP 2, EP 2 x DP 2 and TP 2, 3 (expert TP, F
 * split unevenly): y, the aux loss, dx and every gradient (the gate's at every rank, each expert's
 * at its owning ranks) within 1e-5 of an unsharded dense loop over the experts in double, random
 * inputs, every output and gradient written again after the layer's buffers are poisoned, bad
 * input refused by name; the block's options (the router's z-loss, a capacity factor dropping the
 * lowest-weighted rows, a shared expert with its sigmoid gate) in the router's reference (the rows
 * kept exactly) and the dense loop, alone and together; the block under sequence parallelism (x,
 * y, dy, dx each TP rank's S(0) rows, 5 tokens over TP 2: 3 and 2) at TP 1, 2, 3 and TP 2 x EP 2
 * against the same dense loop, its TP collectives counted. The all-to-all with per-peer counts
 * (tpk_alltoallv, tpk/runtime/coll.h) on the MPI communicator, a split of it and the one-rank
 * `self`: blocks of uneven sizes, some zero, every rank's received blocks against what each sender
 * computes (f32, bf16, i32; blocking and started), the counts exchanged by tpk_alltoallv_counts,
 * the call, element and byte counters, the flight recorder's entry, a peer that never enters it
 * timed out (TPK_ERR_COMM, not a hang), bad counts and buffers refused by name. The Mixtral family
 * (tpk/models/mixtral.h) at EP 1, 2, 3, TP 2 x EP 2 x DP 2, EP 2 x DP 4 (EDP 2), CP 2 and CP 2 x
 * EP 2 x DP 2 (each CP rank its rows), each DP rank its own tokens, against one rank's EP 1 model
 * run on every DP rank's tokens: each rank's loss
 * (the aux pooled over the layers), every gradient (dense ones summed over DP, experts' over EDP),
 * 2 AdamW steps of tpk_train_step (norms, weights); ZeRO-1 with experts refused; under full and
 * selective recompute (a capacity, a z-loss and a shared expert, or none) the bits of no
 * recompute; dropout 0.2 at TP and EP sizes against TP 1 x EP 1 on the same DP ranks, replayed
 * by recompute bit for bit; the routers' z-loss under the pooled aux against a double reference
 * from each router's input (the loss, the last gate's gradient); its config.json parsed (keys,
 * defaults, refusals). The Qwen2-MoE family (tpk/models/qwen2_moe.h: q, k, v biases, a shared
 * expert, norm_topk_prob off and on) the same way at EP 1, 2, TP 3 (a key/value head and its
 * bias on two ranks), TP 2 x EP 2 x DP 2 and EP 2 x DP 4, its Hugging Face names, bad config
 * refused by name; with dense layers between the sparse ones (decoder_sparse_step 2,
 * mlp_only_layers [3]: a dense layer's SwiGLU MLP under its names, the aux over the sparse layers'
 * rows alone), a capacity factor and the z-loss at EP 2, TP 3 and EP 1; with the dense layers and
 * dropout 0.2 at EP 2 and TP 3 against TP 1 x EP 1 (recompute bit for bit);
 * a checkpoint saved at EP 1, 2, TP 3 or TP 2 x EP 2, all sparse and with dense layers, read back
 * (config.json; every tensor and the step, by one rank's EP 1 model and at the saving mesh), its
 * config.json parsed (Qwen2MoeConfig's keys and defaults, the dense layers' keys; sliding windows,
 * bad layer lists and steps and the rest refused by name). Mixtral and Qwen2-MoE under
 * sequence parallelism at TP 1, 2, 3 and TP 2 x EP 2 against the same model without it (the loss
 * within 1e-6, every gradient within 1e-5), full and selective recompute the bits of SP. Run at
 * 1..4 ranks (tests/run.sh: 2 and 4 quick, 1 and 3 long; TP 2 x EP 2 under SP in make
 * test-long). */
#include "test.h"

#include <tpk/train/hf.h>
#include <tpk/train/model.h>
#include <tpk/train/train.h>
#include <tpk/train/zero3.h>

/* the elements world rank p sends to rank q: uneven, zero where (p + 2 q) % 3 == 1 */
static size_t cnt(int p, int q) {
    return (p + 2 * q) % 3 == 1 ? 0 : (size_t)(1 + (3 * p + q) % 5) * 7;
}
/* element i of that block */
static float val(int p, int q, size_t i) {
    return tpk_rng_normal(44, (uint64_t)(p * 64 + q), (uint64_t)i);
}

static test_logbuf logs;
static tpk_comm world;
static int me, np;

/* ---- the mesh: EP groups out of the DP ranks ------------------------------------------------ */

/* The context TP x CP x DP x PP with EP groups of ep DP ranks: sizes, ranks and members of ctx->ep
 * and ctx->edp against the formula; the others as without EP. */
static void test_mesh(int tp, int cp, int pp, int ep) {
    tpk_ctx c;
    tpk_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.world = &world, d.tp = tp, d.cp = cp, d.pp = pp, d.ep = ep;
    CHECK_OK(&c, tpk_ctx_init(&c, &d));
    int dp = np / (tp * cp * pp), tr = me % tp, cr = me / tp % cp, dr = me / (tp * cp) % dp,
        pr = me / (tp * cp * dp), e = ep ? ep : 1;
    CHECK(c.tp.size == tp && c.cp.size == cp && c.dp.size == dp && c.pp.size == pp &&
              c.dp.rank == dr && c.tp.rank == tr,
          "TP %d CP %d DP %d PP %d (rank %d in DP), expected %d %d %d %d (%d)", c.tp.size,
          c.cp.size, c.dp.size, c.pp.size, c.dp.rank, tp, cp, dp, pp, dr);
    CHECK(c.ep.size == e && c.ep.rank == dr % e, "ep: size %d rank %d, expected %d %d", c.ep.size,
          c.ep.rank, e, dr % e);
    CHECK(c.edp && (e > 1 ? c.edp == &c.edp_group : c.edp == c.dp_cp) &&
              c.edp->size == dp / e * cp && c.edp->rank == cr + cp * (dr / e),
          "edp: size %d rank %d, expected %d %d (%s)", c.edp ? c.edp->size : -1,
          c.edp ? c.edp->rank : -1, dp / e * cp, cr + cp * (dr / e),
          e > 1 ? "a group of its own" : "dp_cp");
    tpk_comm *g[2] = {&c.ep, c.edp};
    for (int k = 0; k < 2; k++) {
        int32_t all[16];
        test_group_ranks(&c, g[k], me, all);
        for (int q = 0; q < g[k]->size; q++) {
            int qd = k == 0 ? dr / e * e + q : q / cp * e + dr % e, qc = k == 0 ? cr : q % cp;
            int want = tr + tp * (qc + cp * (qd + dp * pr));
            CHECK(all[q] == want, "%s rank %d: world rank %d, expected %d", k ? "edp" : "ep", q,
                  all[q], want);
        }
    }
    tpk_ctx_destroy(&c);
}

/* One all-to-all over c (rank r of c is world rank map[r]) in dtype dt, started when `start`,
 * against the blocks the senders compute. */
static void a2a_case(tpk_ctx *ctx, tpk_comm *c, const int *map, tpk_dtype dt, bool start) {
    int n = c->size, me = c->rank, wme = map[me];
    size_t sc[8], rc[8], rc2[8], ns = 0, nr = 0;
    for (int q = 0; q < n; q++) sc[q] = cnt(wme, map[q]), rc[q] = cnt(map[q], wme);
    for (int q = 0; q < n; q++) ns += sc[q], nr += rc[q];
    for (int q = 0; q < n; q++) rc2[q] = 12345;
    CHECK_OK(ctx, tpk_alltoallv_counts(ctx, c, sc, rc2));
    CHECK(!memcmp(rc, rc2, sizeof(size_t) * (size_t)n), "tpk_alltoallv_counts: wrong counts");
    size_t es = tpk_dtype_size(dt);
    unsigned char *s = malloc(ns * es + 1), *r = malloc(nr * es + 1);
    for (int q = 0, o = 0; q < n; q++)
        for (size_t i = 0; i < sc[q]; i++, o++) {
            float v = val(wme, map[q], i);
            if (dt == TPK_F32) ((float *)s)[o] = v;
            else if (dt == TPK_BF16) ((uint16_t *)s)[o] = tpk_f32_to_bf16(v);
            else ((int32_t *)s)[o] = (int32_t)(v * 1000);
        }
    memset(r, 0xff, nr * es + 1); /* poison */
    tpk_comm_stats before = c->stats;
    if (start) {
        tpk_request req = {0};
        CHECK_OK(ctx, tpk_alltoallv_start(ctx, c, s, sc, r, rc, dt, &req));
        CHECK(req.active || n == 1, "request not active after start");
        CHECK_OK(ctx, tpk_wait(ctx, &req));
    } else {
        CHECK_OK(ctx, tpk_alltoallv(ctx, c, s, sc, r, rc, dt));
    }
    int bad = 0;
    for (int q = 0, o = 0; q < n; q++)
        for (size_t i = 0; i < rc[q]; i++, o++) {
            float v = val(map[q], wme, i);
            if (dt == TPK_F32) bad += ((float *)r)[o] != v;
            else if (dt == TPK_BF16) bad += ((uint16_t *)r)[o] != tpk_f32_to_bf16(v);
            else bad += ((int32_t *)r)[o] != (int32_t)(v * 1000);
        }
    CHECK(bad == 0 && r[nr * es] == 0xff, "%s%s: %d of %zu elements wrong (or past the end)",
          tpk_dtype_name(dt), start ? " started" : "", bad, nr);
    uint64_t dc = c->stats.calls[TPK_COLL_ALLTOALL] - before.calls[TPK_COLL_ALLTOALL],
             de = c->stats.elems[TPK_COLL_ALLTOALL] - before.elems[TPK_COLL_ALLTOALL],
             db = c->stats.bytes[TPK_COLL_ALLTOALL] - before.bytes[TPK_COLL_ALLTOALL];
    CHECK(dc == 1 && de == ns && db == ns * es, "counted %llu calls, %llu elements, %llu bytes",
          (unsigned long long)dc, (unsigned long long)de, (unsigned long long)db);
    const tpk_flight_entry *e = &c->flight.ring[c->flight.ops % TPK_FLIGHT_N];
    CHECK(e->kind == TPK_COLL_ALLTOALL && e->state == TPK_FLIGHT_DONE && e->elems == ns,
          "flight record: kind %d state %d elems %llu", e->kind, e->state,
          (unsigned long long)e->elems);
    free(s), free(r);
}

/* ---- references: plain C in double ----------------------------------------------------------- */

/* The k largest of z[E] (value descending, ties: the lower index first, torch.topk's order), by a
 * sort of the indices. */
static const double *ref_z;
static int ref_cmp(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (ref_z[i] != ref_z[j]) return ref_z[i] > ref_z[j] ? -1 : 1;
    return i - j;
}
static void ref_topk(const double *z, int E, int K, int *idx) {
    int order[64];
    for (int e = 0; e < E; e++) order[e] = e;
    ref_z = z;
    qsort(order, (size_t)E, sizeof(int), ref_cmp);
    for (int i = 0; i < K; i++) idx[i] = order[i];
}
static void ref_softmax(const double *z, int E, double *p) {
    double m = z[0], s = 0;
    for (int e = 1; e < E; e++) m = z[e] > m ? z[e] : m;
    for (int e = 0; e < E; e++) s += exp(z[e] - m);
    for (int e = 0; e < E; e++) p[e] = exp(z[e] - m) / s;
}
/* One DP rank's routing of T tokens x [T, H] by Wg [E, H]: z, p [T, E], idx [T, K], w [T, K], the
 * counts [E] and balance; lse [T] and the z-loss mean_t lse² (times zc); under a capacity factor
 * cf > 0 the capacity C = ceil(T K / E cf) and sent [T, K] (-1: dropped; of an expert's rows the C
 * of the largest weight kept, ties the earlier row), the rows dropped. */
typedef struct ref_route {
    double *z, *p, *w, *lse, balance, zloss;
    int *idx, *sent, dropped;
    int64_t count[64];
} ref_route;
static void ref_route_drop(ref_route *r, int T, int E, int K, double cf) {
    int N = T * K;
    double C = cf > 0 ? ceil((double)N / E * cf) : N + 1;
    r->dropped = 0;
    for (int a = 0; a < N; a++) {
        int before = 0;
        for (int b = 0; b < N; b++)
            before += b != a && r->idx[b] == r->idx[a] &&
                      (r->w[b] > r->w[a] || (r->w[b] == r->w[a] && b < a));
        r->sent[a] = before < C ? r->idx[a] : -1;
        r->dropped += before >= C;
    }
}
static void ref_route_make(ref_route *r, const double *x, const double *Wg, int T, int H, int E,
                           int K, bool renorm, double zc, double cf) {
    r->z = calloc((size_t)(T * E + 1), sizeof(double)), r->p = calloc((size_t)(T * E + 1), 8);
    r->w = calloc((size_t)(T * K + 1), sizeof(double)), r->idx = calloc((size_t)(T * K + 1), 4);
    r->lse = calloc((size_t)(T + 1), 8), r->sent = calloc((size_t)(T * K + 1), 4), r->zloss = 0;
    double P[64] = {0};
    memset(r->count, 0, sizeof r->count);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            double a = 0;
            for (int h = 0; h < H; h++) a += x[t * H + h] * Wg[e * H + h];
            r->z[t * E + e] = a;
        }
        ref_softmax(r->z + t * E, E, r->p + t * E);
        double m = r->z[t * E], s = 0;
        for (int e = 1; e < E; e++) m = fmax(m, r->z[t * E + e]);
        for (int e = 0; e < E; e++) s += exp(r->z[t * E + e] - m);
        r->lse[t] = m + log(s), r->zloss += zc * r->lse[t] * r->lse[t] / T;
        ref_topk(r->z + t * E, E, K, r->idx + t * K);
        double S = 0;
        for (int i = 0; i < K; i++) S += r->p[t * E + r->idx[t * K + i]];
        for (int i = 0; i < K; i++) {
            double pi = r->p[t * E + r->idx[t * K + i]];
            r->w[t * K + i] = renorm ? pi / S : pi;
            r->count[r->idx[t * K + i]]++;
        }
        for (int e = 0; e < E; e++) P[e] += r->p[t * E + e];
    }
    r->balance = 0;
    for (int e = 0; T && e < E; e++) r->balance += (double)r->count[e] / T * (P[e] / T);
    r->balance *= E;
    ref_route_drop(r, T, E, K, cf);
}
static void ref_route_free(ref_route *r) {
    free(r->z), free(r->p), free(r->w), free(r->idx), free(r->lse), free(r->sent);
}
/* L(z) = sum_ti dw_ti w_ti(z) + g coef balance(z) + g zc lse(z)² / T, the top-k and the counts
 * held fixed: the function whose gradient the router's backward computes. */
static double ref_router_obj(const double *z, int E, int K, const int *idx, const int64_t *count,
                             int T, const double *dw, double g, double coef, bool renorm,
                             double zc) {
    double p[64], S = 0, L = 0, m = z[0], se = 0;
    ref_softmax(z, E, p);
    for (int e = 1; e < E; e++) m = fmax(m, z[e]);
    for (int e = 0; e < E; e++) se += exp(z[e] - m);
    L += g * zc * (m + log(se)) * (m + log(se)) / T;
    for (int i = 0; i < K; i++) S += p[idx[i]];
    for (int i = 0; i < K; i++) L += dw[i] * (renorm ? p[idx[i]] / S : p[idx[i]]);
    for (int e = 0; e < E; e++) L += g * coef * E * (double)count[e] / ((double)T * T) * p[e];
    return L;
}
/* dz [E] of token t by central differences of ref_router_obj (h = 1e-6). */
static void ref_router_dz(const ref_route *r, int t, int E, int K, int T, const double *dw,
                          double g, double coef, bool renorm, double zc, double *dz) {
    double z[64];
    for (int e = 0; e < E; e++) z[e] = r->z[t * E + e];
    for (int e = 0; e < E; e++) {
        double h = 1e-6, keep = z[e], lp, lm;
        z[e] = keep + h;
        lp = ref_router_obj(z, E, K, r->idx + t * K, r->count, T, dw + t * K, g, coef, renorm, zc);
        z[e] = keep - h;
        lm = ref_router_obj(z, E, K, r->idx + t * K, r->count, T, dw + t * K, g, coef, renorm, zc);
        z[e] = keep;
        dz[e] = (lp - lm) / (2 * h);
    }
}
/* The whole tensor of parameter `name` as test_set_weights draws it (seed, scale), in double. */
static double *ref_weights(const char *name, size_t n, uint64_t seed, float scale) {
    double *w = malloc(n * sizeof(double));
    for (size_t k = 0; k < n; k++)
        w[k] = (double)(scale * tpk_rng_normal(seed, tpk_rng_stream(name), k));
    return w;
}
static double ref_silu(double g) { return g / (1 + exp(-g)); }
static double ref_dsilu(double g) {
    double sg = 1 / (1 + exp(-g));
    return sg * (1 + g * (1 - sg));
}

static float *to_f32(const double *a, size_t n) {
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) f[i] = (float)a[i];
    return f;
}

/* ---- the router ------------------------------------------------------------------------------ */

/* The router on a one-rank context: T tokens, E experts, top-k, against ref_route (routing,
 * weights, counts, balance; idx exactly) and the backward against central differences (dx, dWg).
 * `ties`: integer-valued x and Wg with rows repeated, so many logits tie exactly. zc: the z-loss's
 * coefficient, cf the capacity factor (the rows kept, exactly). */
static void test_router(int T, int H, int E, int K, bool renorm, bool ties, float zc, float cf) {
    tpk_ctx c;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.seed = 3}));
    tpk_router r;
    tpk_router_desc rd = {.name = "gate",
                          .experts = E,
                          .top_k = K,
                          .renormalize = renorm,
                          .aux_coef = 0.02f,
                          .z_coef = zc,
                          .capacity_factor = cf};
    CHECK_OK(&c, tpk_router_init(&c, &r, H, &rd));
    float *x = malloc(sizeof(float) * (size_t)(T * H + 1)), *wg = malloc(sizeof(float) * E * H);
    double *xd = malloc(sizeof(double) * (size_t)(T * H + 1)), *wd = malloc(sizeof(double) * E * H);
    for (int i = 0; i < T * H; i++)
        x[i] = ties ? (float)((i * 7 + 3) % 5 - 2) : tpk_rng_normal(11, 1, (uint64_t)i);
    for (int i = 0; i < E * H; i++) { /* ties: expert e's row is row e / 2's pattern */
        int e = i / H, h = i % H;
        wg[i] =
            ties ? (float)(((e / 2) * 3 + h) % 3 - 1) : 0.5f * tpk_rng_normal(12, 1, (uint64_t)i);
    }
    for (int i = 0; i < T * H; i++) xd[i] = x[i];
    for (int i = 0; i < E * H; i++) wd[i] = wg[i];
    CHECK_OK(&c, tpk_param_set_global(&c, r.w, wg));
    CHECK_OK(&c, tpk_params_zero_grad(&c));
    ref_route ref;
    ref_route_make(&ref, xd, wd, T, H, E, K, renorm, zc, cf);
    CHECK_OK(&c, tpk_router_forward(&c, &r, tpk_tensor_2d(x, TPK_F32, T, H, TPK_R)));
    if (cf > 0) {
        int sbad = 0;
        for (int i = 0; i < T * K; i++) sbad += r.sent[i] != ref.sent[i];
        CHECK(sbad == 0 && r.dropped == ref.dropped && (!T || ref.dropped > 0),
              "capacity %g: %d rows kept or dropped wrong, %lld dropped, expected %d", (double)cf,
              sbad, (long long)r.dropped, ref.dropped);
    }
    int bad = 0, nties = 0;
    for (int i = 0; i < T * K; i++) bad += r.idx[i] != ref.idx[i];
    for (int t = 0; t < T; t++)
        for (int e = 1; e < E; e++) nties += ref.z[t * E + e] == ref.z[t * E + e - 1];
    CHECK(bad == 0, "%d of %d experts chosen differ from the reference%s", bad, T * K,
          ties ? " (ties)" : "");
    CHECK(!ties || nties > T, "only %d ties in the logits", nties);
    double werr = 0;
    for (int i = 0; i < T * K; i++) werr = fmax(werr, fabs(r.weight[i] - ref.w[i]));
    CHECK(werr < 1e-6, "weights off by %g", werr);
    for (int e = 0; e < E; e++)
        CHECK(r.count[e] == ref.count[e], "count[%d] = %lld, expected %lld", e,
              (long long)r.count[e], (long long)ref.count[e]);
    CHECK(fabs(r.balance - ref.balance) < 1e-6 * fmax(1, ref.balance) &&
              fabs(r.zloss - ref.zloss) < 1e-6 * fmax(1, ref.zloss) &&
              fabs(r.aux - (0.02 * ref.balance + ref.zloss)) < 1e-6 * fmax(1, ref.zloss),
          "balance %g zloss %g aux %g, expected %g %g %g", r.balance, r.zloss, (double)r.aux,
          ref.balance, ref.zloss, 0.02 * ref.balance + ref.zloss);
    CHECK(zc > 0 || r.zloss == 0, "zloss %g without a coefficient", r.zloss);
    /* backward: dz by central differences, then dx = dz Wg and dWg = dzᵀ x in double */
    float *dw = malloc(sizeof(float) * (size_t)(T * K + 1));
    double *dwd = malloc(sizeof(double) * (size_t)(T * K + 1)), g = 0.7;
    for (int i = 0; i < T * K; i++) dw[i] = tpk_rng_normal(13, 1, (uint64_t)i), dwd[i] = dw[i];
    /* sums that cancel (tied logits, repeated rows): errors measured against the terms' size */
    double *dxd = calloc((size_t)(T * H + 1), sizeof(double)), *gwd = calloc((size_t)E * H, 8);
    double dz[64], mdx = 1e-30, mgw = 1e-30, *adx = calloc((size_t)(T * H + 1), 8),
                   *agw = calloc((size_t)E * H, 8);
    for (int t = 0; t < T; t++) {
        ref_router_dz(&ref, t, E, K, T, dwd, g, 0.02, renorm, zc, dz);
        for (int e = 0; e < E; e++)
            for (int h = 0; h < H; h++) {
                dxd[t * H + h] += dz[e] * wd[e * H + h], gwd[e * H + h] += dz[e] * xd[t * H + h];
                adx[t * H + h] += fabs(dz[e] * wd[e * H + h]);
                agw[e * H + h] += fabs(dz[e] * xd[t * H + h]);
            }
    }
    for (int i = 0; i < T * H; i++) mdx = fmax(mdx, adx[i]);
    for (int i = 0; i < E * H; i++) mgw = fmax(mgw, agw[i]);
    tpk_tensor dx;
    CHECK_OK(&c, tpk_router_backward(&c, &r, dw, (float)g, &dx));
    double edx = 0, egw = 0;
    for (int i = 0; i < T * H; i++) edx = fmax(edx, fabs(((float *)dx.data)[i] - dxd[i]));
    CHECK(edx < 1e-5 * mdx, "router dx: off by %g, terms of %g", edx, mdx);
    float *got = malloc(sizeof(float) * E * H);
    CHECK_OK(&c, tpk_param_get_global(&c, r.w, true, got));
    for (int i = 0; i < E * H; i++) egw = fmax(egw, fabs(got[i] - gwd[i]));
    CHECK(egw < 1e-5 * mgw, "router dWg: off by %g, terms of %g", egw, mgw);
    /* bad input */
    CHECK_FAILS(&c, tpk_router_backward(&c, &r, NULL, 1, &dx), T ? TPK_ERR_ARG : TPK_OK,
                T ? "dweight" : "");
    CHECK_FAILS(&c, tpk_router_backward(&c, &r, dw, NAN, &dx), TPK_ERR_ARG, "aux_grad");
    CHECK_FAILS(&c, tpk_router_forward(&c, &r, tpk_tensor_2d(x, TPK_F32, T, H + 1, TPK_R)),
                TPK_ERR_SHAPE, "x: expected global shape");
    CHECK_FAILS(&c, tpk_router_forward(&c, &r, tpk_tensor_2d(x, TPK_F32, T, H, TPK_P)),
                TPK_ERR_LAYOUT, "x: expected layout R");
    if (T) {
        float keep = x[0];
        x[0] = NAN;
        CHECK_FAILS(&c, tpk_router_forward(&c, &r, tpk_tensor_2d(x, TPK_F32, T, H, TPK_R)),
                    TPK_ERR_ARG, "x: token 0's router logit");
        x[0] = keep;
    }
    tpk_router r2;
    rd.top_k = E + 1;
    CHECK_FAILS(&c, tpk_router_init(&c, &r2, H, &rd), TPK_ERR_ARG, "desc->top_k: expected 1..");
    rd.top_k = K, rd.experts = 0;
    CHECK_FAILS(&c, tpk_router_init(&c, &r2, H, &rd), TPK_ERR_ARG, "desc->experts");
    rd.experts = E, rd.aux_coef = -1;
    CHECK_FAILS(&c, tpk_router_init(&c, &r2, H, &rd), TPK_ERR_ARG, "desc->aux_coef");
    rd.aux_coef = 0, rd.z_coef = -1;
    CHECK_FAILS(&c, tpk_router_init(&c, &r2, H, &rd), TPK_ERR_ARG, "desc->z_coef");
    rd.z_coef = 0, rd.capacity_factor = NAN;
    CHECK_FAILS(&c, tpk_router_init(&c, &r2, H, &rd), TPK_ERR_ARG, "desc->capacity_factor");
    ref_route_free(&ref);
    free(x), free(wg), free(xd), free(wd), free(dw), free(dwd), free(got);
    free(dxd), free(gwd), free(adx), free(agw);
    tpk_router_destroy(&c, &r);
    tpk_ctx_destroy(&c);
}

/* ---- the dispatcher -------------------------------------------------------------------------- */

/* DP rank dq's tokens (the TP ranks of a DP rank hold the same): T, x [T, H], dy [T, H] */
static int tokens(int dq) { return dq == 1 ? 2 : dq == 3 ? 0 : 5 + 2 * dq; }
static void token_data(int dq, int H, float *x, float *dy) {
    for (int i = 0; i < tokens(dq) * H; i++)
        x[i] = 0.8f * tpk_rng_normal(200 + (uint64_t)dq, 0, (uint64_t)i),
        dy[i] = tpk_rng_normal(300 + (uint64_t)dq, 0, (uint64_t)i);
}
static void poison_bufs(tpk_buf *const *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i]->p) memset(b[i]->p, 0xff, b[i]->bytes); /* NaN in f32 and bf16 */
}

/* DP rank dq's routing for the dispatcher test: k distinct experts of 0..E-2 per token (expert
 * E - 1 receives nothing), weights 0.5 + u */
static void route_data(int dq, int E, int K, int32_t *idx, float *w) {
    for (int t = 0; t < tokens(dq); t++) {
        int perm[64];
        for (int e = 0; e < E - 1; e++) perm[e] = e;
        for (int e = E - 2; e > 0; e--) {
            int r = (int)(tpk_rng_uniform(400 + (uint64_t)dq, (uint64_t)t, (uint64_t)e) * (e + 1));
            int tmp = perm[e];
            perm[e] = perm[r > e ? e : r], perm[r > e ? e : r] = tmp;
        }
        for (int i = 0; i < K; i++)
            idx[t * K + i] = perm[i],
                        w[t * K + i] = 0.5f + tpk_rng_uniform(500 + (uint64_t)dq, (uint64_t)t, i);
    }
}

/* The dispatcher's round trip at TP tp x EP ep (the world's DP ranks in EP groups): the rows each
 * rank receives for its experts, the combine, its backward and the dispatch's backward against the
 * senders' tokens; every output written again after its buffers are poisoned. */
static void test_dispatch(int tp, int ep) {
    enum { H = 5, K = 2 };
    int E = 2 * ep + 1 - (ep > 1), El;
    E = E - E % ep, El = E / ep; /* a multiple of ep, > K */
    if (E <= K) E = ep * (K / ep + 1), El = E / ep;
    tpk_ctx c;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .ep = ep}));
    int dr = c.dp.rank, er = c.ep.rank, base = dr - er, T = tokens(dr);
    tpk_moe_dispatcher d;
    CHECK_OK(&c, tpk_moe_dispatcher_init(&c, &d, H, E, K));
    float *x[8], *dy[8], *w[8];
    int32_t *idx[8];
    for (int q = 0; q < ep; q++) {
        int n = tokens(base + q);
        x[q] = malloc(sizeof(float) * (size_t)(n * H + 1)),
        dy[q] = malloc(sizeof(float) * (n * H + 1));
        w[q] = malloc(sizeof(float) * (size_t)(n * K + 1)),
        idx[q] = malloc(4 * (size_t)(n * K + 1));
        token_data(base + q, H, x[q], dy[q]);
        route_data(base + q, E, K, idx[q], w[q]);
    }
    /* the reference: local expert j's rows from EP rank q's tokens in order */
    int R = 0;
    float *xg_ref = malloc(sizeof(float) * 4096), *dog_ref = malloc(sizeof(float) * 4096);
    int64_t rows[16] = {0};
    for (int j = 0; j < El; j++)
        for (int q = 0; q < ep; q++)
            for (int t = 0; t < tokens(base + q); t++)
                for (int i = 0; i < K; i++)
                    if (idx[q][t * K + i] == er * El + j) {
                        for (int h = 0; h < H; h++)
                            xg_ref[R * H + h] = x[q][t * H + h],
                                           dog_ref[R * H + h] = w[q][t * K + i] * dy[q][t * H + h];
                        R++, rows[j]++;
                    }
    float *y_ref = calloc((size_t)(T * H + 1), 4), *dx_ref = calloc((size_t)(T * H + 1), 4),
          *dw_ref = calloc((size_t)(T * K + 1), 4), *dw = malloc(4 * (size_t)(T * K + 1));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < K; i++) {
            double dot = 0, wi = w[er][t * K + i];
            for (int h = 0; h < H; h++)
                y_ref[t * H + h] += (float)(wi * x[er][t * H + h]),
                    dx_ref[t * H + h] += (float)(wi * dy[er][t * H + h]),
                    dot += (double)dy[er][t * H + h] * x[er][t * H + h];
            dw_ref[t * K + i] = (float)dot;
        }
    float *first[4] = {0};
    for (int round = 0; round < 2; round++) {
        tpk_comm_stats st = c.ep.stats;
        tpk_tensor xg, y, dog, dx;
        CHECK_OK(
            &c, tpk_moe_dispatch(&c, &d, tpk_tensor_2d(x[er], TPK_F32, T, H, TPK_R), idx[er], &xg));
        CHECK(xg.gshape[0] == R && !memcmp(xg.data, xg_ref, sizeof(float) * (size_t)(R * H)),
              "round %d: %lld rows dispatched, expected %d (or their values differ)", round,
              (long long)xg.gshape[0], R);
        for (int j = 0; j < El; j++)
            CHECK(d.rows[j] == rows[j], "rows[%d] = %lld, expected %lld", j, (long long)d.rows[j],
                  (long long)rows[j]);
        CHECK_OK(&c, tpk_moe_combine(&c, &d, xg, w[er], &y)); /* identity experts */
        CHECK_CLOSE((float *)y.data, y_ref, (size_t)(T * H), 1e-6, "combine");
        CHECK_OK(&c, tpk_moe_combine_backward(&c, &d, tpk_tensor_2d(dy[er], TPK_F32, T, H, TPK_R),
                                              w[er], dw, &dog));
        CHECK_CLOSE(dw, dw_ref, (size_t)(T * K), 1e-6, "dweight");
        CHECK_CLOSE((float *)dog.data, dog_ref, (size_t)(R * H), 1e-6, "dog");
        CHECK_OK(&c, tpk_moe_dispatch_backward(&c, &d, dog, &dx));
        CHECK_CLOSE((float *)dx.data, dx_ref, (size_t)(T * H), 1e-6, "dispatch backward");
        uint64_t calls = c.ep.stats.calls[TPK_COLL_ALLTOALL] - st.calls[TPK_COLL_ALLTOALL],
                 el = c.ep.stats.elems[TPK_COLL_ALLTOALL] - st.elems[TPK_COLL_ALLTOALL];
        uint64_t want = ep > 1 ? (uint64_t)(E + 2 * T * K * H + 2 * R * H) : 0;
        CHECK(calls == (ep > 1 ? 5u : 0u) && el == want,
              "%llu all-to-alls of %llu elements, expected %d of %llu", (unsigned long long)calls,
              (unsigned long long)el, ep > 1 ? 5 : 0, (unsigned long long)want);
        float *now[4] = {(float *)y.data, (float *)dog.data, (float *)dx.data, dw};
        size_t n[4] = {(size_t)(T * H), (size_t)(R * H), (size_t)(T * H), (size_t)(T * K)};
        for (int k = 0; k < 4; k++) {
            if (round) CHECK(!memcmp(first[k], now[k], 4 * n[k]), "output %d differs", k);
            else first[k] = malloc(4 * n[k] + 4), memcpy(first[k], now[k], 4 * n[k]);
        }
        tpk_buf *b[] = {&d.xs, &d.xr, &d.xg,  &d.orr, &d.obb, &d.y, &d.ds,
                        &d.dr, &d.dg, &d.dxr, &d.dxs, &d.dx,  &d.dw};
        if (!round) poison_bufs(b, 13), test_poison(dw, (size_t)(T * K));
    }
    /* bad input: the same on every rank, refused before any collective */
    tpk_tensor xg, y;
    tpk_moe_dispatcher fresh;
    CHECK_OK(&c, tpk_moe_dispatcher_init(&c, &fresh, H, E, K));
    CHECK_FAILS(&c,
                tpk_moe_combine(&c, &fresh, tpk_tensor_2d(x[er], TPK_F32, 0, H, TPK_R), w[er], &y),
                TPK_ERR_ARG, "combine before dispatch");
    tpk_moe_dispatcher_destroy(&c, &fresh);
    if (T > 1) {
        int32_t keep = idx[er][1];
        idx[er][1] = idx[er][0];
        CHECK_FAILS(
            &c, tpk_moe_dispatch(&c, &d, tpk_tensor_2d(x[er], TPK_F32, T, H, TPK_R), idx[er], &xg),
            TPK_ERR_ARG, "idx[1]: expected an expert");
        idx[er][1] = E;
        CHECK_FAILS(
            &c, tpk_moe_dispatch(&c, &d, tpk_tensor_2d(x[er], TPK_F32, T, H, TPK_R), idx[er], &xg),
            TPK_ERR_ARG, "idx[1]");
        idx[er][1] = keep;
    }
    CHECK_FAILS(&c, tpk_moe_dispatcher_init(&c, &fresh, H, E + (ep > 1), K),
                ep > 1 ? TPK_ERR_ARG : TPK_OK,
                ep > 1 ? "experts: expected a multiple of the EP size" : "");
    tpk_moe_dispatcher_destroy(&c, &fresh);
    CHECK_FAILS(&c, tpk_moe_dispatcher_init(&c, &fresh, H, E, E + 1), TPK_ERR_ARG,
                "top_k: expected 1..experts");
    for (int q = 0; q < ep; q++) free(x[q]), free(dy[q]), free(w[q]), free(idx[q]);
    for (int k = 0; k < 4; k++) free(first[k]);
    free(xg_ref), free(dog_ref), free(y_ref), free(dx_ref), free(dw_ref), free(dw);
    tpk_moe_dispatcher_destroy(&c, &d);
    tpk_ctx_destroy(&c);
}

/* ---- the MoE block against an unsharded dense loop over the experts -------------------------- */

typedef struct ref_grads {
    double *y, *dx, *gwg, *g1[64], *g2[64], *g3[64], aux;
    double *gsg, *gsu, *gsd, *gsw; /* the shared expert's gradients */
    int dropped;
} ref_grads;
/* The block's options: the z-loss's coefficient, the capacity factor, the shared expert's F_s
 * (0: none) and its weights Sg, Su [Fs, H], Sd [H, Fs], Sw [H]. */
typedef struct moe_opt {
    float zc, cf;
    int Fs;
    double *Sg, *Su, *Sd, *Sw;
} moe_opt;

/* The shared expert on token x [H] with dy [H] in double: y += s o, s = sigmoid(x . Sw), o =
 * (silu(Sg x) ∘ Su x) Sdᵀ; its dx and gradients from dy. */
static void ref_shared(const moe_opt *o, int H, const double *x, const float *dy, double *y,
                       double *dx, ref_grads *r) {
    int Fs = o->Fs;
    double gg[64], uu[64], a[64], out[64], da[64], l = 0, dot = 0;
    for (int h = 0; h < H; h++) l += x[h] * o->Sw[h];
    double sg = 1 / (1 + exp(-l));
    for (int f = 0; f < Fs; f++) {
        gg[f] = uu[f] = 0;
        for (int h = 0; h < H; h++)
            gg[f] += o->Sg[f * H + h] * x[h], uu[f] += o->Su[f * H + h] * x[h];
        a[f] = ref_silu(gg[f]) * uu[f];
    }
    for (int h = 0; h < H; h++) {
        out[h] = 0;
        for (int f = 0; f < Fs; f++) out[h] += o->Sd[h * Fs + f] * a[f];
        y[h] += sg * out[h], dot += dy[h] * out[h];
    }
    double dl = dot * sg * (1 - sg);
    for (int h = 0; h < H; h++) dx[h] += dl * o->Sw[h], r->gsw[h] += dl * x[h];
    for (int f = 0; f < Fs; f++) {
        da[f] = 0;
        for (int h = 0; h < H; h++) da[f] += o->Sd[h * Fs + f] * sg * dy[h];
        double dg = da[f] * uu[f] * ref_dsilu(gg[f]), du = da[f] * ref_silu(gg[f]);
        for (int h = 0; h < H; h++) {
            r->gsg[f * H + h] += dg * x[h], r->gsu[f * H + h] += du * x[h];
            r->gsd[h * Fs + f] += sg * dy[h] * a[f];
            dx[h] += o->Sg[f * H + h] * dg + o->Su[f * H + h] * du;
        }
    }
}

/* DP rank dq's tokens through the whole block in double: the router (ref_route; its backward by
 * central differences), each token's k experts (the rows the capacity keeps), the weighted sum,
 * the shared expert. Adds into r: y, dx, the gate's and the shared expert's gradients (when own)
 * and every expert's gradient (when grads). */
static void ref_moe_rank(int dq, int H, int F, int E, int K, bool renorm, double coef, double g,
                         const double *Wg, double *const *W1, double *const *W2, double *const *W3,
                         const moe_opt *op, bool own, bool grads, ref_grads *r) {
    int T = tokens(dq);
    float *xf = malloc(sizeof(float) * (size_t)(T * H + 1)), *dyf = malloc(4 * (size_t)(T * H + 1));
    token_data(dq, H, xf, dyf);
    double *x = malloc(8 * (size_t)(T * H + 1)), *dw = malloc(8 * (size_t)(T * K + 1));
    for (int i = 0; i < T * H; i++) x[i] = xf[i];
    ref_route rt;
    ref_route_make(&rt, x, Wg, T, H, E, K, renorm, op->zc, op->cf);
    if (own) r->aux = coef * rt.balance + rt.zloss, r->dropped = rt.dropped;
    double gg[64], uu[64], a[64], o[64], da[64];
    for (int t = 0; t < T; t++) {
        const double *xt = x + t * H;
        if (own && op->Fs) ref_shared(op, H, xt, dyf + t * H, r->y + t * H, r->dx + t * H, r);
        for (int i = 0; i < K; i++) {
            int e = rt.sent[t * K + i];
            dw[t * K + i] = 0;
            if (e < 0) continue; /* dropped by the capacity */
            double wi = rt.w[t * K + i], dot = 0;
            for (int f = 0; f < F; f++) {
                gg[f] = uu[f] = 0;
                for (int h = 0; h < H; h++)
                    gg[f] += W1[e][f * H + h] * xt[h], uu[f] += W3[e][f * H + h] * xt[h];
                a[f] = ref_silu(gg[f]) * uu[f];
            }
            for (int h = 0; h < H; h++) {
                o[h] = 0;
                for (int f = 0; f < F; f++) o[h] += W2[e][h * F + f] * a[f];
                if (own) r->y[t * H + h] += wi * o[h];
                dot += (double)dyf[t * H + h] * o[h];
            }
            dw[t * K + i] = dot;
            for (int f = 0; f < F; f++) { /* the expert's backward from do = w dy */
                da[f] = 0;
                for (int h = 0; h < H; h++) da[f] += W2[e][h * F + f] * wi * dyf[t * H + h];
            }
            for (int f = 0; f < F; f++) {
                double dg = da[f] * uu[f] * ref_dsilu(gg[f]), du = da[f] * ref_silu(gg[f]);
                for (int h = 0; h < H; h++) {
                    if (grads)
                        r->g1[e][f * H + h] += dg * xt[h], r->g3[e][f * H + h] += du * xt[h],
                            r->g2[e][h * F + f] += wi * dyf[t * H + h] * a[f];
                    if (own) r->dx[t * H + h] += W1[e][f * H + h] * dg + W3[e][f * H + h] * du;
                }
            }
        }
    }
    double dz[64];
    for (int t = 0; own && t < T; t++) {
        ref_router_dz(&rt, t, E, K, T, dw, g, coef, renorm, op->zc, dz);
        for (int e = 0; e < E; e++)
            for (int h = 0; h < H; h++)
                r->dx[t * H + h] += dz[e] * Wg[e * H + h],
                    r->gwg[e * H + h] += dz[e] * x[t * H + h];
    }
    ref_route_free(&rt);
    free(xf), free(dyf), free(x), free(dw);
}


/* The MoE block at TP tp x EP ep (E experts, renormalised or not) against ref_moe_rank: y, the aux
 * loss, dx, the gate's gradient, and each expert's gradient at its owning ranks (gathered over TP);
 * the parameters' names and placement; the all-to-alls counted; every output and gradient written
 * again after the layer's buffers are poisoned. zc, cf, Fs: the z-loss's coefficient, the capacity
 * factor and the shared expert's size (0: none of them; Fs need not divide tp). sp: sequence
 * parallelism, x, y, dy and dx each TP rank's S(0) rows of the same tokens (split unevenly where
 * T is odd), the TP collectives counted (each way one all-gather and one reduce-scatter, no
 * all-reduce of rows: one of the routing weights' gradient backward). */
static void test_moe_layer_in(int tp, int ep, int E, bool renorm, float zc, float cf, int Fs,
                              bool sp) {
    enum { H = 8, F = 7, K = 2 };
    const double coef = 0.01, g = 0.7;
    const char *name = "model.layers.0.block_sparse_moe";
    char pn[160];
    tpk_ctx c;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .ep = ep, .seed = 5}));
    int dr = c.dp.rank, er = c.ep.rank, base = dr - er, El = E / ep, T = tokens(dr);
    tpk_moe m;
    tpk_moe_desc md = {.name = name,
                       .experts = E,
                       .top_k = K,
                       .hidden = F,
                       .renormalize = renorm,
                       .aux_coef = (float)coef,
                       .z_coef = zc,
                       .capacity_factor = cf,
                       .shared_hidden = Fs,
                       .sequence_parallel = sp};
    CHECK_OK(&c, tpk_moe_init(&c, &m, H, &md));
    /* this TP rank's rows of the tokens (all of them without SP) */
    tpk_range rows = sp ? tpk_tp_split(&c, T, c.tp.rank) : (tpk_range){0, T};
    int r0 = (int)rows.off, Tl = (int)rows.size;
    static const char *sn[4] = {"shared_expert.gate_proj", "shared_expert.up_proj",
                                "shared_expert.down_proj", "shared_expert_gate"};
    int sid[4] = {m.sg, m.su, m.sd, m.sw};
    for (int k = 0; k < 4; k++) { /* the shared expert: on every rank, not an expert's weight */
        snprintf(pn, sizeof pn, "%s.%s.weight", name, sn[k]);
        int id = tpk_param_find(&c, pn);
        CHECK(Fs ? id >= 0 && id == sid[k] && !c.params.list[id].expert : id < 0 && sid[k] < 0,
              "%s: id %d", pn, id);
    }
    /* the parameters: the gate everywhere, an expert only at its EP rank */
    int placed = 0;
    snprintf(pn, sizeof pn, "%s.gate.weight", name);
    CHECK(tpk_param_find(&c, pn) == m.router.w, "%s not registered", pn);
    for (int e = 0; e < E; e++)
        for (int k = 1; k <= 3; k++) {
            snprintf(pn, sizeof pn, "%s.experts.%d.w%d.weight", name, e, k);
            int id = tpk_param_find(&c, pn);
            bool mine = e / El == er;
            placed += (id >= 0) == mine && (id < 0 || c.params.list[id].expert);
        }
    CHECK(placed == 3 * E, "%d of %d expert weights placed wrong", 3 * E - placed, 3 * E);
    test_set_weights(&c, 21, 0.3f);
    /* the reference's weights, whole, and its results */
    snprintf(pn, sizeof pn, "%s.gate.weight", name);
    double *Wg = ref_weights(pn, (size_t)(E * H), 21, 0.3f), *W1[64], *W2[64], *W3[64];
    ref_grads rg = {0};
    rg.y = calloc((size_t)(T * H + 1), 8), rg.dx = calloc((size_t)(T * H + 1), 8);
    rg.gwg = calloc((size_t)(E * H), 8);
    for (int e = 0; e < E; e++) {
        snprintf(pn, sizeof pn, "%s.experts.%d.w1.weight", name, e);
        W1[e] = ref_weights(pn, F * H, 21, 0.3f);
        snprintf(pn, sizeof pn, "%s.experts.%d.w2.weight", name, e);
        W2[e] = ref_weights(pn, F * H, 21, 0.3f);
        snprintf(pn, sizeof pn, "%s.experts.%d.w3.weight", name, e);
        W3[e] = ref_weights(pn, F * H, 21, 0.3f);
        rg.g1[e] = calloc(F * H, 8), rg.g2[e] = calloc(F * H, 8), rg.g3[e] = calloc(F * H, 8);
    }
    moe_opt op = {.zc = zc, .cf = cf, .Fs = Fs};
    size_t sz[4] = {(size_t)Fs * H, (size_t)Fs * H, (size_t)Fs * H, H};
    double **sw[4] = {&op.Sg, &op.Su, &op.Sd, &op.Sw},
           **sg[4] = {&rg.gsg, &rg.gsu, &rg.gsd, &rg.gsw};
    for (int k = 0; k < 4; k++) {
        snprintf(pn, sizeof pn, "%s.%s.weight", name, sn[k]);
        *sw[k] = ref_weights(pn, sz[k], 21, 0.3f), *sg[k] = calloc(sz[k] + 1, 8);
    }
    for (int q = 0; q < ep; q++) /* this EP group's tokens reach this rank's experts */
        ref_moe_rank(base + q, H, F, E, K, renorm, coef, g, Wg, W1, W2, W3, &op, base + q == dr,
                     true, &rg);
    float *x = malloc(sizeof(float) * (size_t)(T * H + 1)), *dy = malloc(4 * (size_t)(T * H + 1));
    token_data(dr, H, x, dy);
    float *y_ref = to_f32(rg.y, (size_t)(T * H)), *dx_ref = to_f32(rg.dx, (size_t)(T * H));
    float *first[2] = {0}, *gfirst[200] = {0};
    for (int round = 0; round < 2; round++) {
        CHECK_OK(&c, tpk_params_zero_grad(&c));
        tpk_comm_stats st = c.ep.stats, ts = c.tp.stats, tf;
        tpk_tensor y, dx;
        tpk_layout lay = sp ? TPK_S(0) : TPK_R;
        CHECK_OK(&c, tpk_moe_forward(&c, &m, tpk_tp_tensor_2d(&c, x + r0 * H, TPK_F32, T, H, lay),
                                     &y));
        uint64_t fwd = c.ep.stats.calls[TPK_COLL_ALLTOALL] - st.calls[TPK_COLL_ALLTOALL];
        tf = c.tp.stats;
        CHECK_OK(&c, tpk_moe_backward(&c, &m,
                                      tpk_tp_tensor_2d(&c, dy + r0 * H, TPK_F32, T, H, lay),
                                      (float)g, &dx));
        uint64_t bwd = c.ep.stats.calls[TPK_COLL_ALLTOALL] - st.calls[TPK_COLL_ALLTOALL] - fwd;
        CHECK(fwd == (ep > 1 ? 3u : 0u) && bwd == (ep > 1 ? 2u : 0u),
              "all-to-alls: %llu forward, %llu backward", (unsigned long long)fwd,
              (unsigned long long)bwd);
        if (sp && tp > 1) { /* over TP: gather, reduce-scatter; gather, dw's sum, reduce-scatter */
            uint64_t n[2][3];
            for (int k = 0; k < 3; k++)
                n[0][k] = tf.calls[k] - ts.calls[k], n[1][k] = c.tp.stats.calls[k] - tf.calls[k];
            CHECK(n[0][TPK_COLL_ALLREDUCE] == 0 && n[0][TPK_COLL_ALLGATHER] == 1 &&
                      n[0][TPK_COLL_REDUCE_SCATTER] == 1 && n[1][TPK_COLL_ALLREDUCE] == 1 &&
                      n[1][TPK_COLL_ALLGATHER] == 1 && n[1][TPK_COLL_REDUCE_SCATTER] == 1,
                  "TP collectives (all-reduce, all-gather, reduce-scatter): forward %llu %llu "
                  "%llu, backward %llu %llu %llu",
                  (unsigned long long)n[0][0], (unsigned long long)n[0][1],
                  (unsigned long long)n[0][2], (unsigned long long)n[1][0],
                  (unsigned long long)n[1][1], (unsigned long long)n[1][2]);
        }
        CHECK(y.shape[0] == Tl && y.gshape[0] == T && dx.shape[0] == Tl &&
                  tpk_layout_eq(y.layout, lay, 2) && tpk_layout_eq(dx.layout, lay, 2),
              "y: %lld of %lld rows, dx %lld, expected %d of %d", (long long)y.shape[0],
              (long long)y.gshape[0], (long long)dx.shape[0], Tl, T);
        CHECK_CLOSE((float *)y.data, y_ref + r0 * H, (size_t)(Tl * H), 1e-5, "y");
        CHECK_CLOSE((float *)dx.data, dx_ref + r0 * H, (size_t)(Tl * H), 1e-5, "dx");
        CHECK(fabs(m.router.aux - rg.aux) < 1e-6 * fmax(1, rg.aux), "aux %g, expected %g",
              (double)m.router.aux, rg.aux);
        CHECK(m.router.dropped == rg.dropped, "%lld rows dropped, expected %d",
              (long long)m.router.dropped, rg.dropped);
        int nd = (int)m.router.dropped, alld = 0; /* a capacity that drops somewhere */
        MPI_Allreduce(&nd, &alld, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(!(cf > 0) == !alld, "%d rows dropped over the ranks at capacity factor %g", alld,
              (double)cf);
        float *now[2] = {(float *)y.data, (float *)dx.data};
        for (int k = 0; k < 2; k++) {
            if (round) CHECK(!memcmp(first[k], now[k], sizeof(float) * Tl * H), "output %d", k);
            else
                first[k] = malloc(sizeof(float) * (size_t)(Tl * H + 1)),
                memcpy(first[k], now[k], sizeof(float) * (size_t)(Tl * H));
        }
        /* the gradients: the gate's from this rank's tokens; an expert's from its EP group's */
        float *got = malloc(sizeof(float) * (size_t)(E * H + F * H));
        CHECK_OK(&c, tpk_param_get_global(&c, m.router.w, true, got));
        float *want = to_f32(rg.gwg, (size_t)(E * H));
        CHECK_CLOSE(got, want, (size_t)(E * H), 1e-5, "gate gradient");
        free(want);
        int gi = 0;
        for (int j = 0; j < El; j++) {
            int e = er * El + j, ids[3] = {m.w1[j], m.w2[j], m.w3[j]};
            double *ref[3] = {rg.g1[e], rg.g2[e], rg.g3[e]};
            for (int k = 0; k < 3; k++, gi++) {
                CHECK_OK(&c, tpk_param_get_global(&c, ids[k], true, got));
                want = to_f32(ref[k], F * H);
                char what[64];
                snprintf(what, sizeof what, "expert %d's w%d gradient", e, k + 1);
                CHECK_CLOSE(got, want, F * H, 1e-5, what);
                if (round) CHECK(!memcmp(gfirst[gi], got, sizeof(float) * F * H), "%s", what);
                else
                    gfirst[gi] = malloc(sizeof(float) * F * H),
                    memcpy(gfirst[gi], got, sizeof(float) * F * H);
                free(want);
            }
        }
        for (int k = 0; Fs && k < 4; k++) { /* the shared expert's, from this rank's tokens */
            float *gs = malloc(sizeof(float) * sz[k]);
            CHECK_OK(&c, tpk_param_get_global(&c, sid[k], true, gs));
            want = to_f32(*sg[k], sz[k]);
            CHECK_CLOSE(gs, want, sz[k], 1e-5, sn[k]);
            if (round) CHECK(!memcmp(gfirst[100 + k], gs, sizeof(float) * sz[k]), "%s", sn[k]);
            else gfirst[100 + k] = gs, gs = NULL;
            free(gs), free(want);
        }
        free(got);
        tpk_moe_dispatcher *d = &m.disp;
        tpk_buf *b[] = {&d->xs,       &d->xr, &d->xg,  &d->orr, &d->obb, &d->y,       &d->ds,
                        &d->dr,       &d->dg, &d->dxr, &d->dxs, &d->dx,  &d->dw,      &m.gu,
                        &m.h,         &m.og,  &m.dh,   &m.dgu,  &m.dxg,  &m.router.z, &m.router.dz,
                        &m.router.dx, &m.sgu, &m.sh,   &m.so,   &m.sz,   &m.sdo,      &m.sdh,
                        &m.sdgu,      &m.sdx, &m.sdl,  &m.xa,   &m.ya,   &m.dya,      &m.dxa,
                        &m.red};
        if (!round) poison_bufs(b, (int)(sizeof b / sizeof b[0]));
    }
    /* bad input, the same on every rank */
    tpk_tensor y, dx;
    if (sp) { /* R where S(0) is expected, both ways */
        CHECK_FAILS(&c, tpk_moe_forward(&c, &m, tpk_tensor_2d(x, TPK_F32, T, H, TPK_R), &y),
                    TPK_ERR_LAYOUT, "x: expected layout S(0)");
        CHECK_FAILS(&c,
                    tpk_moe_backward(&c, &m, tpk_tensor_2d(dy, TPK_F32, T, H, TPK_R), 1, &dx),
                    TPK_ERR_LAYOUT, "dy: expected layout S(0)");
        CHECK_FAILS(&c,
                    tpk_moe_backward(&c, &m,
                                     tpk_tp_tensor_2d(&c, dy, TPK_F32, T + 1, H, TPK_S(0)), 1,
                                     &dx),
                    TPK_ERR_SHAPE, "dy: expected global shape");
        goto done;
    }
    CHECK_FAILS(&c, tpk_moe_forward(&c, &m, tpk_tensor_2d(x, TPK_F32, T, H - 1, TPK_R), &y),
                TPK_ERR_SHAPE, "x: expected global shape");
    CHECK_FAILS(&c, tpk_moe_forward(&c, &m, tpk_tensor_2d(x, TPK_F32, T, H, TPK_S(0)), &y),
                TPK_ERR_LAYOUT, "x: expected layout R");
    CHECK_FAILS(&c, tpk_moe_forward(&c, &m, tpk_tensor_2d(x, TPK_BF16, T, H, TPK_R), &y),
                TPK_ERR_DTYPE, "x: expected dtype f32");
    CHECK_FAILS(&c, tpk_moe_backward(&c, &m, tpk_tensor_2d(dy, TPK_F32, T + 1, H, TPK_R), 1, &dx),
                TPK_ERR_SHAPE, "dy: expected global shape");
    tpk_moe m2;
    memset(&m2, 0, sizeof m2);
    CHECK_FAILS(&c, tpk_moe_backward(&c, &m2, tpk_tensor_2d(dy, TPK_F32, T, H, TPK_R), 1, &dx),
                TPK_ERR_ARG, "expected an initialised MoE");
    tpk_moe_desc bad = md;
    bad.name = "bad", bad.experts = E + 1;
    if (ep > 1)
        CHECK_FAILS(&c, tpk_moe_init(&c, &m2, H, &bad), TPK_ERR_ARG,
                    "desc->experts: expected a multiple of the EP size");
    bad.experts = E, bad.top_k = E + 1;
    CHECK_FAILS(&c, tpk_moe_init(&c, &m2, H, &bad), TPK_ERR_ARG, "desc->top_k: expected 1..");
    bad.top_k = K, bad.hidden = 0;
    CHECK_FAILS(&c, tpk_moe_init(&c, &m2, H, &bad), TPK_ERR_SHAPE, "desc->hidden");
    bad.hidden = F, bad.shared_hidden = -1;
    CHECK_FAILS(&c, tpk_moe_init(&c, &m2, H, &bad), TPK_ERR_SHAPE, "desc->shared_hidden");
    bad.shared_hidden = 0, bad.capacity_factor = -1;
    CHECK_FAILS(&c, tpk_moe_init(&c, &m2, H, &bad), TPK_ERR_ARG, "desc->capacity_factor");
done:
    free(x), free(dy), free(y_ref), free(dx_ref), free(first[0]), free(first[1]);
    for (int k = 0; k < 200; k++) free(gfirst[k]);
    for (int e = 0; e < E; e++)
        free(W1[e]), free(W2[e]), free(W3[e]), free(rg.g1[e]), free(rg.g2[e]), free(rg.g3[e]);
    for (int k = 0; k < 4; k++) free(*sw[k]), free(*sg[k]);
    free(Wg), free(rg.y), free(rg.dx), free(rg.gwg);
    tpk_moe_destroy(&c, &m);
    tpk_ctx_destroy(&c);
}
static void test_moe_layer(int tp, int ep, int E, bool renorm, float zc, float cf, int Fs) {
    test_moe_layer_in(tp, ep, E, renorm, zc, cf, Fs, false);
}

/* ---- the Mixtral family: EP against one rank's EP 1 model ------------------------------------ */

enum { XV = 67, XL = 2, XH = 16, XA = 4, XB = 2, XS = 8, XT = XB * XS };
static tpk_mixtral_config mix_config(int E) {
    tpk_mixtral_config c = {.vocab = XV,
                            .positions = XS,
                            .layers = XL,
                            .hidden = XH,
                            .heads = XA,
                            .kv_heads = 2,
                            .ffn = 12,
                            .experts = E,
                            .top_k = 2,
                            .aux_coef = 0.05f,
                            .rope_theta = 1000};
    return c;
}
/* DP rank q's tokens and targets (one ignored) */
static void mix_tokens(int q, int32_t *ids, int32_t *tg) {
    for (int i = 0; i < XT; i++)
        ids[i] = (int32_t)((i * 23 + 7 + 31 * q) % XV), tg[i] = (int32_t)((i * 41 + 3 * q) % XV);
    tg[5] = -100;
}

/* A Qwen2-MoE of the same sizes: the shared expert's F_s 10, the top-k weights renormalised
 * with norm. */
static tpk_qwen2_moe_config qwen_config(int E, bool norm) {
    tpk_qwen2_moe_config c = {.vocab = XV,
                              .positions = XS,
                              .layers = XL,
                              .hidden = XH,
                              .heads = XA,
                              .kv_heads = 2,
                              .moe_ffn = 12,
                              .shared_ffn = 10,
                              .experts = E,
                              .top_k = 2,
                              .norm_topk_prob = norm,
                              .aux_coef = 0.05f,
                              .rope_theta = 1000};
    return c;
}

/* A Qwen2-MoE of QL layers with dense ones between the sparse: decoder_sparse_step 2 (layers 1,
 * 3, 5 sparse) and mlp_only_layers [3] (3 dense after all): sparse 1 and 5, dense 0, 2, 3, 4
 * (SwiGLU F_d 20). */
enum { QL = 6, QFD = 20 };
static void qwen_dense(tpk_qwen2_moe_config *c) {
    c->layers = QL, c->sparse_step = 2, c->dense_ffn = QFD;
    tpk_layer_set_add(&c->mlp_only, 3);
}

/* Mixtral (qwen 0) or Qwen2-MoE (qwen 1: the top-k weights as the softmax's; 2: renormalised; 3:
 * renormalised, with qwen_dense's dense layers, a capacity factor 0.75 dropping rows and the
 * routers' z-loss 0.01) at TP tp x EP ep x DP (world / tp), each DP rank its own tokens: each
 * rank's loss (the cross-entropy plus the aux pooled over the sparse layers), the dense gradients
 * summed over DP and an expert's over EDP (the sum of every DP rank's loss's), against a one-rank
 * EP 1 model run on every DP rank's tokens in turn. */
/* this CP rank's rows of DP rank q's tokens (all of them at CP 1) */
static void mix_rows(tpk_ctx *c, int q, int32_t *ids, int32_t *tg) {
    int32_t a[XT], b[XT];
    mix_tokens(q, a, b);
    CHECK_OK(c, tpk_cp_scatter_host(c, ids, a, XB, XS, sizeof(int32_t)));
    CHECK_OK(c, tpk_cp_scatter_host(c, tg, b, XB, XS, sizeof(int32_t)));
}
static void test_mixtral(int tp, int cp, int ep, int E, int qwen) {
    tpk_ctx c, r;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .cp = cp, .ep = ep,
                                                  .seed = 3}));
    CHECK_OK(&r, tpk_ctx_init(&r, &(tpk_ctx_desc){.seed = 3}));
    tpk_mixtral_config cfg = mix_config(E), rcfg = cfg;
    tpk_qwen2_moe_config qcfg = qwen_config(E, qwen >= 2), rqcfg;
    if (qwen == 3) qwen_dense(&qcfg), qcfg.capacity_factor = 0.75f, qcfg.z_coef = 0.01f;
    rqcfg = qcfg; /* (each model's mlp_2_user: its config, alive through tpk_lm_init) */
    int L = qwen == 3 ? QL : XL, Ls = qwen == 3 ? 2 : XL; /* layers, sparse ones */
    tpk_lm_config lc, rlc;
    tpk_lm m, mr;
    if (qwen) {
        CHECK_OK(&c, tpk_qwen2_moe_lm_config(&c, &qcfg, &lc));
        CHECK_OK(&r, tpk_qwen2_moe_lm_config(&r, &rqcfg, &rlc));
    } else {
        CHECK_OK(&c, tpk_mixtral_lm_config(&c, &cfg, &lc));
        CHECK_OK(&r, tpk_mixtral_lm_config(&r, &rcfg, &rlc));
    }
    CHECK_OK(&c, tpk_lm_init(&c, &m, &lc));
    CHECK_OK(&r, tpk_lm_init(&r, &mr, &rlc));
    test_set_weights(&c, 9, 0.3f), test_set_weights(&r, 9, 0.3f);
    int dps = c.dp.size, dr = c.dp.rank;
    int32_t ids[XT], tg[XT];
    float loss = 0, lref = 0, l;
    CHECK_OK(&r, tpk_params_zero_grad(&r));
    for (int q = 0; q < dps; q++) { /* the reference: every DP rank's loss's gradient, summed */
        mix_tokens(q, ids, tg);
        CHECK_OK(&r, tpk_lm_forward(&r, &mr, ids, tg, XB, XS, &l));
        CHECK_OK(&r, tpk_lm_backward(&r, &mr, 1.0f));
        if (q == dr) lref = l;
    }
    CHECK(mr.aux > 0 && lc.block.mlp.moe.aux_coef == 0.05f, "aux %g", (double)mr.aux);
    /* the aux pooled over the sparse layers' rows alone (a dense layer routes none) */
    CHECK(mr.moe_layers == Ls && m.moe_layers == Ls && mr.aux_N == Ls * XT,
          "MoE layers %lld (%lld), N %lld, expected %d, %d", (long long)mr.moe_layers,
          (long long)m.moe_layers, (long long)mr.aux_N, Ls, Ls * XT);
    if (qwen) { /* Hugging Face Qwen2MoeForCausalLM's names: q, k, v biases, no o_proj bias; a
                   sparse layer's MoE (s0, s1), a dense layer's SwiGLU MLP (3 and 4) */
        int s0 = qwen == 3 ? 1 : 0, s1 = qwen == 3 ? 5 : 1;
        char has[11][80];
        snprintf(has[0], 80, "model.layers.%d.self_attn.q_proj.bias", s1);
        snprintf(has[1], 80, "model.layers.%d.self_attn.v_proj.bias", s0);
        snprintf(has[2], 80, "model.layers.%d.mlp.experts.3.down_proj.weight", s0);
        snprintf(has[3], 80, "model.layers.%d.mlp.experts.0.gate_proj.weight", s1);
        snprintf(has[4], 80, "model.layers.%d.mlp.shared_expert.up_proj.weight", s1);
        snprintf(has[5], 80, "model.layers.%d.mlp.shared_expert_gate.weight", s0);
        snprintf(has[6], 80, "model.layers.%d.mlp.gate.weight", s0);
        snprintf(has[7], 80, "model.layers.3.mlp.gate_proj.weight");
        snprintf(has[8], 80, "model.layers.4.mlp.up_proj.weight");
        snprintf(has[9], 80, "model.layers.0.mlp.down_proj.weight");
        snprintf(has[10], 80, "model.layers.3.mlp.gate.weight");
        for (int k = 0; k < 11; k++) /* 7 .. 9: dense layers' alone, 10: not a dense layer's */
            CHECK((tpk_param_find(&r, has[k]) >= 0) == (k < 7 || (qwen == 3 && k < 10)),
                  "%s: %s", has[k], tpk_param_find(&r, has[k]) >= 0 ? "found" : "not found");
        int Ld = L - Ls, want = 3 + L * 9 + Ls * (5 + 3 * E) + Ld * 3; /* dense: its 3 weights */
        CHECK(tpk_param_find(&r, "model.layers.0.self_attn.o_proj.bias") < 0 &&
                  r.params.n == want,
              "o_proj.bias %d, %d parameters, expected %d",
              tpk_param_find(&r, "model.layers.0.self_attn.o_proj.bias"), r.params.n, want);
        int up = tpk_param_find(&r, "model.layers.4.mlp.up_proj.weight");
        if (qwen == 3)
            CHECK(up >= 0 && r.params.list[up].gshape[0] == QFD &&
                      r.params.list[up].gshape[1] == XH,
                  "a dense layer's up_proj [%lld, %lld], expected [%d, %d]",
                  up >= 0 ? (long long)r.params.list[up].gshape[0] : -1LL,
                  up >= 0 ? (long long)r.params.list[up].gshape[1] : -1LL, QFD, XH);
    }
    mix_rows(&c, dr, ids, tg); /* under CP this rank's rows */
    CHECK_OK(&c, tpk_params_zero_grad(&c));
    CHECK_OK(&c, tpk_lm_forward(&c, &m, ids, tg, XB, XS, &loss));
    CHECK_OK(&c, tpk_lm_backward(&c, &m, 1.0f));
    CHECK_OK(&c, tpk_params_reduce_partial_grads(&c));
    CHECK(fabsf(loss - lref) < 1e-5f * fabsf(lref), "DP rank %d's loss %.8g, EP 1's %.8g", dr,
          (double)loss, (double)lref);
    if (qwen == 3) { /* the capacity drops rows somewhere */
        int dropped = 0;
        for (int i = 0; i < L; i++)
            if (m.blocks[i].mlp.kind == TPK_MLP_MOE)
                dropped += (int)m.blocks[i].mlp.u.moe.router.dropped;
        MPI_Allreduce(MPI_IN_PLACE, &dropped, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(dropped > 0, "capacity factor 0.75: no row dropped");
    }
    int checked = 0;
    for (int i = 0; i < c.params.n; i++) {
        tpk_param *p = &c.params.list[i];
        int j = tpk_param_find(&r, p->name);
        size_t n = tpk_param_global_numel(&c, i);
        float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        test_poison(got, n);
        CHECK_OK(&c, tpk_param_get_global(&c, i, true, got));
        CHECK_OK(&c, tpk_allreduce_host(&c, p->expert ? c.edp : c.dp_cp, got, n, TPK_F32, TPK_SUM));
        CHECK(j >= 0, "%s: not in the EP 1 model", p->name);
        if (j >= 0) {
            CHECK_OK(&r, tpk_param_get_global(&r, j, true, want));
            char what[160];
            snprintf(what, sizeof what, "gradient of %s", p->name);
            CHECK_CLOSE(got, want, n, 1e-5, what);
            checked++;
        }
        free(got), free(want);
    }
    /* the experts here and at the other EP ranks: all of the reference's */
    int all = checked;
    CHECK_OK(&c, tpk_allreduce_host(&c, &c.ep, &all, 1, TPK_I32, TPK_SUM));
    int dense = r.params.n - 3 * Ls * E;
    CHECK(checked == dense + 3 * Ls * E / ep && all == ep * dense + 3 * Ls * E,
          "%d gradients checked here, %d over the EP group; the reference has %d", checked, all,
          r.params.n);
    /* training: 2 AdamW steps of tpk_train_step (the buckets under the backward: dense weights
     * over DP, experts over EDP; the norm's expert squares over EP; clipped) against the reference
     * stepping on the summed gradient, both scaled 1 / dp */
    tpk_adamw opt, ropt;
    tpk_dp_buckets b = {0}, rb = {0};
    const float lr = 1e-2f, clip = 0.05f, gs = 1.0f / (float)dps;
    /* eps 1e-4: a gradient element at rounding level (summed in another order) is no full step */
    const tpk_adamw_desc ad = {.weight_decay = 0.1f, .eps = 1e-4f};
    CHECK_OK(&c, tpk_adamw_init(&c, &opt, &ad));
    CHECK_OK(&r, tpk_adamw_init(&r, &ropt, &ad));
    CHECK_OK(&c, tpk_dp_init(&c, &b));
    tpk_lm_set_grad_ready(&m, tpk_dp_grad_ready, &b);
    for (int step = 0; step < 2; step++) {
        double norm = 0, rnorm = 0;
        CHECK_OK(&r, tpk_params_zero_grad(&r));
        for (int q = 0; q < dps; q++) {
            mix_tokens(q, ids, tg);
            CHECK_OK(&r, tpk_lm_forward(&r, &mr, ids, tg, XB, XS, &l));
            CHECK_OK(&r, tpk_lm_backward(&r, &mr, 1.0f));
        }
        CHECK_OK(&r, tpk_train_step(&r, &ropt, &rb, lr, clip, gs, &rnorm));
        mix_rows(&c, dr, ids, tg);
        CHECK_OK(&c, tpk_params_zero_grad(&c));
        CHECK_OK(&c, tpk_lm_forward(&c, &m, ids, tg, XB, XS, &loss));
        CHECK_OK(&c, tpk_dp_begin(&c, &b, true));
        CHECK_OK(&c, tpk_lm_backward(&c, &m, 1.0f));
        CHECK_OK(&c, tpk_train_step(&c, &opt, &b, lr, clip, gs, &norm));
        CHECK(fabs(norm - rnorm) < 1e-5 * rnorm && norm > clip, "step %d: norm %.8g, EP 1's %.8g",
              step, norm, rnorm);
    }
    for (int i = 0; i < c.params.n; i++) { /* the weights after the steps */
        int j = tpk_param_find(&r, c.params.list[i].name);
        size_t n = tpk_param_global_numel(&c, i);
        float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        CHECK_OK(&c, tpk_param_get_global(&c, i, false, got));
        if (j >= 0) {
            CHECK_OK(&r, tpk_param_get_global(&r, j, false, want));
            char what[160];
            snprintf(what, sizeof what, "%s after 2 steps", c.params.list[i].name);
            CHECK_CLOSE(got, want, n, 1e-5, what);
        }
        free(got), free(want);
    }
    if (ep > 1) { /* Adasum not yet with experts, nor HSDP's shard groups: refused by name */
        tpk_dp_buckets ab = {0};
        if ((c.dp.size & (c.dp.size - 1)) == 0) { /* (Adasum: a power-of-two DP size) */
            CHECK_OK(&c, tpk_dp_adasum_init(&c, &ab));
            CHECK_FAILS(&c, tpk_dp_begin(&c, &ab, true), TPK_ERR_UNSUPPORTED,
                        "Adasum not yet with expert parallelism");
        }
        tpk_dp_destroy(&ab);
        tpk_ctx h;
        if (c.dp_cp->size % 2 == 0 && c.dp_cp->size > 2)
            CHECK_FAILS(&h,
                        tpk_ctx_init(&h, &(tpk_ctx_desc){.world = &world,
                                                         .tp = tp,
                                                         .cp = cp,
                                                         .ep = ep,
                                                         .zero_shard_size = 2}),
                        TPK_ERR_UNSUPPORTED, "desc->zero_shard_size: 2 with desc->ep");
    }
    tpk_dp_destroy(&b), tpk_dp_destroy(&rb);
    tpk_adamw_destroy(&c, &opt), tpk_adamw_destroy(&r, &ropt);
    tpk_lm_destroy(&c, &m), tpk_lm_destroy(&r, &mr);
    /* refused by name: experts not a multiple of EP, top-k past the experts */
    if (!qwen) {
        tpk_mixtral xm;
        tpk_mixtral_config bad = cfg;
        if (ep > 1) {
            bad.experts = E + 1;
            CHECK_FAILS(&c, tpk_mixtral_init(&c, &xm, &bad), TPK_ERR_ARG,
                        "cfg->experts: expected a positive multiple of the EP size");
        }
        bad = cfg, bad.top_k = E + 1;
        CHECK_FAILS(&c, tpk_mixtral_init(&c, &xm, &bad), TPK_ERR_ARG, "cfg->top_k: expected 1..");
    } else { /* and Qwen2-MoE's own fields */
        tpk_qwen2_moe qm;
        tpk_qwen2_moe_config bad = qcfg;
        if (ep > 1) {
            bad.experts = E + 1;
            CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                        "cfg->experts: expected a positive multiple of the EP size");
        }
        bad = qcfg, bad.top_k = E + 1;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->top_k: expected 1..cfg->experts");
        bad = qcfg, bad.norm_topk_prob = 2;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->norm_topk_prob: expected 0 (the softmax's weights) or 1");
        bad = qcfg, bad.moe_ffn = -1;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->moe_ffn: expected 1..1e9");
        bad = qcfg, bad.shared_ffn = -3;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->shared_ffn: expected 1..1e9");
        bad = qcfg, bad.aux_coef = NAN;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->aux_coef: expected a finite value");
        bad = qcfg, bad.kv_heads = 3;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->kv_heads: expected a divisor of cfg->heads");
        bad = qcfg, bad.capacity_factor = -0.5f;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->capacity_factor: expected a finite value >= 0");
        bad = qcfg, bad.z_coef = INFINITY;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->z_coef: expected a finite value >= 0");
        bad = qcfg, bad.dropout = 1;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->dropout: expected 0 <= p < 1");
        bad = qcfg, bad.sparse_step = -2;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->sparse_step: expected 1..100000");
        bad = qcfg, bad.dense_ffn = -1;
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG,
                    "cfg->dense_ffn: expected 1..1e9");
        bad = qcfg, tpk_layer_set_add(&bad.mlp_only, L);
        char want[96];
        snprintf(want, sizeof want, "cfg->mlp_only: layer %d, expected layers below cfg->layers",
                 L);
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, &bad), TPK_ERR_ARG, want);
        CHECK_FAILS(&c, tpk_qwen2_moe_init(&c, &qm, NULL), TPK_ERR_ARG, "cfg: NULL");
        /* the model's second MLP is not a mixture of experts (the pooled aux is block.mlp's) */
        tpk_lm_config two = rlc;
        tpk_lm lm2;
        two.mlp_2 = two.block.mlp, two.mlp_2_at = tpk__qwen2_moe_dense_at, two.mlp_2_user = &qcfg;
        CHECK_FAILS(&c, tpk_lm_init(&c, &lm2, &two), TPK_ERR_ARG,
                    "cfg->mlp_2.kind: TPK_MLP_MOE, expected another MLP");
    }
    tpk_ctx_destroy(&c), tpk_ctx_destroy(&r);
}

/* Mixtral (or, qwen, a Qwen2-MoE with qwen_dense's dense layers among its sparse ones) with
 * dropout 0.2 at TP tp x EP ep (DP world / tp, each DP rank its own tokens) against TP 1 x EP 1 on
 * the same DP ranks (each TP rank's DP ranks a world of their own: the same DP ranks, so the same
 * masks): each rank's loss within 1e-6, every gradient within 1e-5 (dense ones summed over DP, an
 * expert's over EDP), the dropout seen (the loss moves at p = 0); and under full and selective
 * recompute the loss and every gradient the bits of no recompute (the masks drawn again alike;
 * the Qwen2-MoE's two kinds of block borrowing the same pools in turn). */
static double worst_dropout; /* the largest relative difference of a gradient found */
static void test_mixtral_dropout(int tp, int ep, int E, bool qwen) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, me % tp, me / tp, &sub);
    tpk_comm dw;
    CHECK_OK(NULL, tpk_comm_mpi(NULL, sub, &dw));
    MPI_Comm_free(&sub);
    tpk_ctx c[4]; /* TP tp x EP ep; TP 1 x EP 1; the first under full, and selective, recompute */
    tpk_lm m[4];
    float loss[4], l0 = 0;
    int32_t ids[XT], tg[XT];
    for (int k = 0; k < 4; k++) {
        tpk_ctx_desc d = {.world = k == 1 ? &dw : &world, .tp = k == 1 ? 1 : tp,
                          .ep = k == 1 ? 1 : ep, .seed = 3};
        CHECK_OK(&c[k], tpk_ctx_init(&c[k], &d));
        tpk_mixtral_config cfg = mix_config(E);
        tpk_qwen2_moe_config qc = qwen_config(E, true);
        qwen_dense(&qc);
        cfg.dropout = qc.dropout = 0.2f;
        cfg.recompute = qc.recompute = k == 2   ? TPK_RECOMPUTE_FULL
                                       : k == 3 ? TPK_RECOMPUTE_SELECTIVE
                                                : TPK_RECOMPUTE_NONE;
        tpk_lm_config lc;
        CHECK_OK(&c[k], qwen ? tpk_qwen2_moe_lm_config(&c[k], &qc, &lc)
                             : tpk_mixtral_lm_config(&c[k], &cfg, &lc));
        CHECK_OK(&c[k], tpk_lm_init(&c[k], &m[k], &lc)); /* (qc read here) */
        test_set_weights(&c[k], 9, 0.3f);
        mix_tokens(c[k].dp.rank, ids, tg);
        c[k].rng_step = 7;
        CHECK_OK(&c[k], tpk_params_zero_grad(&c[k]));
        CHECK_OK(&c[k], tpk_lm_forward(&c[k], &m[k], ids, tg, XB, XS, &loss[k]));
        CHECK_OK(&c[k], tpk_lm_backward(&c[k], &m[k], 1.0f));
        CHECK_OK(&c[k], tpk_params_reduce_partial_grads(&c[k])); /* a key/value head on several
                                                                      TP ranks (TP 3) */
    }
    CHECK(c[0].dp.rank == c[1].dp.rank, "DP rank %d, the reference's %d", c[0].dp.rank,
          c[1].dp.rank);
    CHECK(fabsf(loss[0] - loss[1]) < 1e-6f * fabsf(loss[1]),
          "TP %d x EP %d: loss %.9g, TP 1 x EP 1's %.9g", tp, ep, (double)loss[0],
          (double)loss[1]);
    CHECK(loss[2] == loss[0] && loss[3] == loss[0], "recompute: loss %.9g, %.9g, without %.9g",
          (double)loss[2], (double)loss[3], (double)loss[0]);
    /* the reference's gradients summed over its DP ranks first (every rank holds every expert
       there, in the same order; here the EP ranks hold others at the same index) */
    float **ref = calloc((size_t)c[1].params.n, sizeof *ref);
    for (int j = 0; j < c[1].params.n; j++) {
        size_t n = tpk_param_global_numel(&c[1], j);
        ref[j] = malloc(n * sizeof(float));
        test_poison(ref[j], n);
        CHECK_OK(&c[1], tpk_param_get_global(&c[1], j, true, ref[j]));
        CHECK_OK(&c[1], tpk_allreduce_host(&c[1], c[1].dp_cp, ref[j], n, TPK_F32, TPK_SUM));
    }
    int diff = 0, checked = 0;
    for (int i = 0; i < c[0].params.n; i++) {
        tpk_param *p = &c[0].params.list[i];
        int j = tpk_param_find(&c[1], p->name);
        size_t n = tpk_param_global_numel(&c[0], i);
        float *got = malloc(n * sizeof(float)), *rc = malloc(n * sizeof(float));
        for (int k = 2; k < 4; k++) { /* recompute: the same bits, before any reduction */
            CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, true, got));
            test_poison(rc, n);
            CHECK_OK(&c[k], tpk_param_get_global(&c[k], i, true, rc));
            if (memcmp(got, rc, n * sizeof(float)) && diff++ < 3)
                CHECK(false, "recompute %d: the gradient of %s differs", k, p->name);
        }
        test_poison(got, n);
        CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, true, got));
        CHECK_OK(&c[0], tpk_allreduce_host(&c[0], p->expert ? c[0].edp : c[0].dp_cp, got, n,
                                           TPK_F32, TPK_SUM));
        CHECK(j >= 0, "%s: not in the TP 1 x EP 1 model", p->name);
        if (j >= 0) {
            char what[160];
            snprintf(what, sizeof what, "dropout 0.2: gradient of %s", p->name);
            CHECK_CLOSE(got, ref[j], n, 1e-5, what);
            worst_dropout = fmax(worst_dropout, test_relerr(got, ref[j], n));
            checked++;
        }
        free(got), free(rc);
    }
    for (int j = 0; j < c[1].params.n; j++) free(ref[j]);
    free(ref);
    CHECK(diff == 0 && checked == c[0].params.n, "%d gradients differ under recompute, %d of %d "
          "checked", diff, checked, c[0].params.n);
    CHECK_OK(&c[1], tpk_lm_set_dropout(&c[1], &m[1], 0));
    mix_tokens(c[1].dp.rank, ids, tg);
    CHECK_OK(&c[1], tpk_lm_forward(&c[1], &m[1], ids, tg, XB, XS, &l0));
    CHECK(fabsf(l0 - loss[1]) > 1e-3f, "dropout 0.2: loss %.9g, at p = 0 %.9g", (double)loss[1],
          (double)l0);
    for (int k = 0; k < 4; k++) tpk_lm_destroy(&c[k], &m[k]), tpk_ctx_destroy(&c[k]);
    tpk_comm_destroy(&dw);
}

/* Every parameter of c (this rank's: its experts alone) against r's of the same name (one rank's
 * whole model), bit for bit; *n counts them. Collective over c's TP group. */
static void same_params(tpk_ctx *c, tpk_ctx *r, const char *what, int *n) {
    for (int i = 0; i < c->params.n; i++) {
        tpk_param *p = &c->params.list[i];
        int j = tpk_param_find(r, p->name);
        size_t k = tpk_param_global_numel(c, i);
        float *got = malloc(k * sizeof(float)), *want = malloc(k * sizeof(float));
        test_poison(got, k), test_poison(want, k);
        CHECK_OK(c, tpk_param_get_global(c, i, false, got));
        CHECK(j >= 0, "%s: %s not in the one-rank model", what, p->name);
        if (j >= 0) {
            CHECK_OK(r, tpk_param_get_global(r, j, false, want));
            CHECK(!memcmp(got, want, k * sizeof(float)), "%s: %s differs", what, p->name);
            (*n)++;
        }
        free(got), free(want);
    }
}

/* A Qwen2-MoE saved at TP tp x EP ep (each routed expert written from its EP rank, its AdamW
 * moments too) and read back: config.json's model_type, architectures and every field; loaded
 * by one rank's EP 1 model (every tensor the saved one's, bit for bit), and at the saving mesh
 * over other weights (the weights and the step back). dense: with qwen_dense's dense layers
 * (config.json's intermediate_size, decoder_sparse_step and mlp_only_layers round-trip, a dense
 * layer's mlp.gate_proj/up_proj/down_proj under their names). */
static void test_qwen_ckpt(int tp, int ep, bool dense) {
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "build/tests/qwen2_moe_ckpt%s_np%d_tp%d", dense ? "_dense" : "", np,
             tp);
    tpk_ctx c, r;
    CHECK_OK(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = tp, .ep = ep, .seed = 3}));
    CHECK_OK(&r, tpk_ctx_init(&r, &(tpk_ctx_desc){.seed = 5}));
    tpk_qwen2_moe_config cfg = qwen_config(4, true);
    cfg.rope_theta = 5e5f, cfg.norm_eps = 2e-6f, cfg.aux_coef = 0.02f;
    if (dense) qwen_dense(&cfg);
    int L = dense ? QL : XL, Ls = dense ? 2 : XL;
    tpk_qwen2_moe m, mr;
    CHECK_OK(&c, tpk_qwen2_moe_init(&c, &m, &cfg));
    CHECK_OK(&r, tpk_qwen2_moe_init(&r, &mr, &cfg));
    test_set_weights(&c, 21, 0.3f);
    tpk_adamw opt, ropt;
    CHECK_OK(&c, tpk_adamw_init(&c, &opt, &(tpk_adamw_desc){.b1 = 0.9f}));
    CHECK_OK(&r, tpk_adamw_init(&r, &ropt, &(tpk_adamw_desc){.b1 = 0.9f}));
    opt.step = 3;
    CHECK_OK(&c, tpk_qwen2_moe_save(&c, &m, &opt, dir, &(tpk_hf_save_desc){.step = 3, .seed = 3}));
    char type[32] = "";
    CHECK_OK(&r, tpk_hf_model_type(&r, dir, type, sizeof type));
    tpk_model_config mc;
    memset(&mc, 0, sizeof mc);
    CHECK_OK(&r, tpk_model_config_read(&r, dir, &mc));
    const tpk_qwen2_moe_config *q = &mc.qwen2_moe;
    CHECK(!strcmp(type, "qwen2_moe") && mc.arch == TPK_ARCH_QWEN2_MOE && q->layers == L &&
              q->hidden == XH && q->heads == XA && q->kv_heads == 2 && q->vocab == XV &&
              q->positions == XS && q->experts == 4 && q->top_k == 2 && q->moe_ffn == 12 &&
              q->shared_ffn == 10 && q->norm_topk_prob == 1 && q->aux_coef == 0.02f &&
              q->rope_theta == 5e5f && q->norm_eps == 2e-6f && !q->tie_embeddings &&
              q->sparse_step == (dense ? 2 : 1) && q->dense_ffn == (dense ? QFD : 48) &&
              !memcmp(&q->mlp_only, &m.c.mlp_only, sizeof q->mlp_only) &&
              tpk_layer_set_has(&q->mlp_only, 3) == dense,
          "config.json read back: type %s arch %d L %lld E %lld k %lld F %lld Fs %lld norm %lld "
          "coef %g theta %g eps %g step %lld F_d %lld",
          type, (int)mc.arch, (long long)q->layers, (long long)q->experts, (long long)q->top_k,
          (long long)q->moe_ffn, (long long)q->shared_ffn, (long long)q->norm_topk_prob,
          (double)q->aux_coef, (double)q->rope_theta, (double)q->norm_eps,
          (long long)q->sparse_step, (long long)q->dense_ffn);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    char text[4096] = "";
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[got] = 0;
    CHECK(strstr(text, "\"architectures\": [\"Qwen2MoeForCausalLM\"]") &&
              strstr(text, dense ? "\"decoder_sparse_step\": 2" : "\"decoder_sparse_step\": 1") &&
              strstr(text, dense ? "\"mlp_only_layers\": [3]" : "\"mlp_only_layers\": []") &&
              strstr(text, dense ? "\"intermediate_size\": 20" : "\"intermediate_size\": 48"),
          "%s: %s", path, text);
    if (dense) /* a dense layer's weights under Hugging Face's names, at any TP */
        CHECK(tpk_param_find(&r, "model.layers.3.mlp.down_proj.weight") >= 0 &&
                  tpk_param_find(&c, "model.layers.0.mlp.gate_proj.weight") >= 0 &&
                  tpk_param_find(&c, "model.layers.2.mlp.gate.weight") < 0,
              "a dense layer's names");
    CHECK_OK(&r, tpk_qwen2_moe_load(&r, &mr, &ropt, dir));
    CHECK(ropt.step == 3, "the step loaded: %lld", (long long)ropt.step);
    int n = 0;
    same_params(&c, &r, "loaded by one rank", &n);
    int all = n, experts = 3 * Ls * 4;
    (void)L;
    CHECK_OK(&c, tpk_allreduce_host(&c, &c.ep, &all, 1, TPK_I32, TPK_SUM));
    CHECK(n == r.params.n - experts + experts / ep && all == ep * (r.params.n - experts) + experts,
          "%d tensors compared here, %d over EP; the one-rank model has %d", n, all, r.params.n);
    test_set_weights(&c, 22, 0.1f), opt.step = 0; /* other weights: the load sets every one */
    CHECK_OK(&c, tpk_qwen2_moe_load(&c, &m, &opt, dir));
    n = 0;
    same_params(&c, &r, "loaded back at the saving mesh", &n);
    CHECK(opt.step == 3, "the step loaded back: %lld", (long long)opt.step);
    tpk_adamw_destroy(&c, &opt), tpk_adamw_destroy(&r, &ropt);
    tpk_lm_destroy(&c, &m.lm), tpk_lm_destroy(&r, &mr.lm);
    tpk_ctx_destroy(&c), tpk_ctx_destroy(&r);
}

/* ZeRO-`stage` with Mixtral at EP ep (4 layers, E experts, the world's ranks over DP, each its own
 * tokens, M micro-batches a step) against ZeRO-0 on the same mesh: ZeRO slices over ctx->edp
 * (the ranks holding the same experts), the slices' dense elements all-reduced across EP; 3 steps
 * of tpk_train_step (clipped), each step's loss and norm within 1e-6 and every weight after them
 * within 1e-5 (ZeRO-3: gathered back whole). An all-reduce of a slice's expert elements across
 * EP (other experts at the same offsets) moves those experts off the reference's. */
static void test_mixtral_zero(int ep, int E, int stage, int M) {
    tpk_ctx c[2];
    tpk_lm m[2];
    tpk_adamw o[2];
    tpk_dp_buckets b[2] = {{0}, {0}};
    tpk_zero3 z;
    memset(&z, 0, sizeof z);
    int32_t ids[XT], tg[XT];
    for (int k = 0; k < 2; k++) { /* k 0: ZeRO-0, k 1: ZeRO-stage */
        CHECK_OK(&c[k], tpk_ctx_init(&c[k], &(tpk_ctx_desc){.world = &world, .ep = ep, .seed = 3}));
        tpk_mixtral_config cfg = mix_config(E);
        cfg.layers = 4;
        tpk_lm_config lc;
        CHECK_OK(&c[k], tpk_mixtral_lm_config(&c[k], &cfg, &lc));
        CHECK_OK(&c[k], tpk_lm_init(&c[k], &m[k], &lc));
        test_set_weights(&c[k], 9, 0.3f);
        CHECK_OK(&c[k], tpk_adamw_init(&c[k], &o[k],
                                       &(tpk_adamw_desc){.weight_decay = 0.1f,
                                                         .eps = 1e-4f,
                                                         .zero_stage = k ? stage : 0}));
        tpk_lm_set_grad_ready(&m[k], tpk_dp_grad_ready, &b[k]);
    }
    tpk_ctx *x = &c[1];
    int e = x->edp->size; /* DP / EP: the ranks holding the same experts */
    CHECK(tpk__zero_group(x) == x->edp && (e == 1 ? o[1].sn == o[1].numel
                                                  : o[1].sn < o[1].numel / (size_t)e + 64),
          "ZeRO-%d's slice %zu of %zu elements over %d ranks (EDP)", stage, o[1].sn, o[1].numel, e);
    if (stage >= 2) CHECK_OK(x, tpk_dp_shard_grads(x, &b[1], &o[1]));
    if (stage == 3) CHECK_OK(x, tpk_zero3_init(x, &z, &m[1], &o[1], NULL));
    CHECK(stage < 3 || e == 1 || z.sgrads, "ZeRO-3's gradients not sharded");
    const float lr = 1e-2f, clip = 0.05f, gs = 1.0f / (float)(x->dp.size * M);
    for (int step = 0; step < 3; step++) {
        float loss[2] = {0, 0};
        double norm[2];
        for (int k = 0; k < 2; k++) {
            CHECK_OK(&c[k], tpk_params_zero_grad(&c[k]));
            for (int mb = 0; mb < M; mb++) {
                float l;
                mix_tokens(c[k].dp.rank + 5 * mb + 11 * step, ids, tg);
                /* (ZeRO-1 reduces the whole buffer in the step: the buckets start nothing) */
                CHECK_OK(&c[k], tpk_dp_begin(&c[k], &b[k], mb == M - 1 && !(k && stage == 1)));
                CHECK_OK(&c[k], tpk_lm_forward(&c[k], &m[k], ids, tg, XB, XS, &l));
                CHECK_OK(&c[k], tpk_lm_backward(&c[k], &m[k], 1.0f));
                loss[k] += l;
            }
            CHECK_OK(&c[k], tpk_train_step(&c[k], &o[k], &b[k], lr, clip, gs, &norm[k]));
        }
        CHECK(fabsf(loss[1] - loss[0]) <= 1e-6f * fabsf(loss[0]) &&
                  fabs(norm[1] - norm[0]) <= 1e-6 * norm[0] && norm[0] > clip,
              "ZeRO-%d step %d: loss %.9g norm %.9g, ZeRO-0's %.9g %.9g", stage, step,
              (double)loss[1], norm[1], (double)loss[0], norm[0]);
    }
    if (stage == 3) CHECK_OK(x, tpk_zero3_gather(x, &z));
    for (int i = 0; i < x->params.n; i++) {
        size_t n = tpk_param_global_numel(x, i);
        float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        CHECK_OK(x, tpk_param_get_global(x, i, false, got));
        CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, false, want));
        char what[160];
        snprintf(what, sizeof what, "ZeRO-%d: %s after 3 steps", stage, x->params.list[i].name);
        CHECK_CLOSE(got, want, n, 1e-5, what);
        free(got), free(want);
    }
    if (stage == 3) tpk_zero3_destroy(x, &z);
    for (int k = 0; k < 2; k++) {
        tpk_dp_destroy(&b[k]);
        tpk_adamw_destroy(&c[k], &o[k]);
        tpk_lm_destroy(&c[k], &m[k]);
        tpk_ctx_destroy(&c[k]);
    }
}

/* Mixtral at EP ep (the world's ranks, E experts) under recompute `mode` against the same model
 * without recompute on the same ranks: the loss and every gradient the same bits (the routing,
 * its all-to-alls and the experts' GEMMs run again in the same order). With `opts` the blocks take
 * a capacity factor that drops rows and a shared expert (set on the model's block config). */
static void test_mixtral_recompute(int ep, int E, tpk_recompute mode, bool opts) {
    tpk_ctx c[2];
    tpk_lm m[2];
    float loss[2];
    int32_t ids[XT], tg[XT];
    uint64_t a2a[2]; /* the backward's all-to-alls: full recompute routes and dispatches again */
    for (int k = 0; k < 2; k++) { /* k 0: recompute, k 1: none */
        CHECK_OK(&c[k], tpk_ctx_init(&c[k], &(tpk_ctx_desc){.world = &world, .ep = ep, .seed = 3}));
        tpk_mixtral_config cfg = mix_config(E);
        cfg.recompute = k ? TPK_RECOMPUTE_NONE : mode, cfg.capacity_factor = opts ? 0.75f : 0;
        cfg.z_coef = opts ? 0.01f : 0; /* the routers' z-loss too */
        tpk_lm_config lc;
        CHECK_OK(&c[k], tpk_mixtral_lm_config(&c[k], &cfg, &lc));
        if (opts) lc.block.mlp.moe.shared_hidden = 6; /* no Mixtral field: the block's */
        CHECK_OK(&c[k], tpk_lm_init(&c[k], &m[k], &lc));
        test_set_weights(&c[k], 9, 0.3f);
        mix_tokens(c[k].dp.rank, ids, tg);
        CHECK_OK(&c[k], tpk_params_zero_grad(&c[k]));
        CHECK_OK(&c[k], tpk_lm_forward(&c[k], &m[k], ids, tg, XB, XS, &loss[k]));
        a2a[k] = c[k].ep.stats.calls[TPK_COLL_ALLTOALL];
        CHECK_OK(&c[k], tpk_lm_backward(&c[k], &m[k], 1.0f));
        a2a[k] = c[k].ep.stats.calls[TPK_COLL_ALLTOALL] - a2a[k];
    }
    uint64_t want = ep == 1 ? 0 : mode == TPK_RECOMPUTE_FULL ? 5 * XL : 2 * XL;
    CHECK(a2a[0] == want && a2a[1] == (ep > 1 ? 2 * XL : 0),
          "backward all-to-alls: %llu under recompute %d, %llu without", (unsigned long long)a2a[0],
          (int)mode, (unsigned long long)a2a[1]);
    CHECK(loss[0] == loss[1], "recompute %d: loss %.9g, without %.9g", (int)mode, (double)loss[0],
          (double)loss[1]);
    int dropped = 0, diff = 0;
    for (int i = 0; i < XL; i++) dropped += (int)m[1].blocks[i].mlp.u.moe.router.dropped;
    MPI_Allreduce(MPI_IN_PLACE, &dropped, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(!opts || dropped > 0, "no row dropped");
    CHECK(c[0].params.n == c[1].params.n, "%d parameters, %d without recompute", c[0].params.n,
          c[1].params.n);
    for (int i = 0; i < c[0].params.n && i < c[1].params.n; i++) {
        size_t n = tpk_param_global_numel(&c[0], i);
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        CHECK_OK(&c[0], tpk_param_get_global(&c[0], i, true, a));
        CHECK_OK(&c[1], tpk_param_get_global(&c[1], i, true, b));
        if (memcmp(a, b, n * sizeof(float)) && diff++ < 3)
            CHECK(false, "recompute %d: the gradient of %s differs", (int)mode,
                  c[0].params.list[i].name);
        free(a), free(b);
    }
    CHECK(diff == 0, "%d gradients differ", diff);
    for (int k = 0; k < 2; k++) tpk_lm_destroy(&c[k], &m[k]), tpk_ctx_destroy(&c[k]);
    CHECK_OK(&c[0], tpk_ctx_init(&c[0], &(tpk_ctx_desc){.world = &world, .ep = ep, .seed = 3}));
    /* refused by name: a capacity factor, a z-loss coefficient out of range */
    tpk_mixtral_config cfg = mix_config(E);
    tpk_lm_config lc;
    cfg.capacity_factor = -0.5f;
    CHECK_FAILS(&c[0], tpk_mixtral_lm_config(&c[0], &cfg, &lc), TPK_ERR_ARG,
                "cfg->capacity_factor: expected a finite value >= 0");
    cfg.capacity_factor = 0, cfg.z_coef = -0.01f;
    CHECK_FAILS(&c[0], tpk_mixtral_lm_config(&c[0], &cfg, &lc), TPK_ERR_ARG,
                "cfg->z_coef: expected a finite value >= 0");
    tpk_ctx_destroy(&c[0]);
}

/* Mixtral (qwen: Qwen2-MoE) at TP tp x EP ep (DP world / tp, each DP rank its own tokens) under
 * sequence parallelism against the same model without it on the same ranks and weights: the loss
 * within 1e-6 (the aux pooled over the layers: every TP rank routes the gathered tokens as
 * without SP) and every gradient within 1e-5 (the norms' partial ones summed over TP; the gate's
 * whole on every TP rank, not counted twice); under full and selective recompute the loss and
 * every gradient the bits of SP without recompute. With `opts` the blocks take a capacity factor
 * that drops rows, the routers' z-loss and (Mixtral) a shared expert. */
static void test_moe_sp(int tp, int ep, int E, bool opts, bool qwen) {
    enum { N = 4 }; /* 0: no SP; 1: SP; 2: SP, full recompute; 3: SP, selective recompute */
    tpk_ctx c[N];
    tpk_lm m[N];
    float loss[N];
    int32_t ids[XT], tg[XT];
    for (int k = 0; k < N; k++) {
        CHECK_OK(&c[k], tpk_ctx_init(&c[k], &(tpk_ctx_desc){.world = &world, .tp = tp, .ep = ep,
                                                            .seed = 3}));
        tpk_recompute rc = k == 2   ? TPK_RECOMPUTE_FULL
                           : k == 3 ? TPK_RECOMPUTE_SELECTIVE
                                    : TPK_RECOMPUTE_NONE;
        tpk_lm_config lc;
        if (qwen) {
            tpk_qwen2_moe_config q = qwen_config(E, false);
            q.sequence_parallel = k > 0, q.recompute = rc;
            CHECK_OK(&c[k], tpk_qwen2_moe_lm_config(&c[k], &q, &lc));
        } else {
            tpk_mixtral_config x = mix_config(E);
            x.sequence_parallel = k > 0, x.recompute = rc;
            CHECK_OK(&c[k], tpk_mixtral_lm_config(&c[k], &x, &lc));
            if (opts) lc.block.mlp.moe.shared_hidden = 6; /* no Mixtral field: the block's */
        }
        if (opts) lc.block.mlp.moe.capacity_factor = 0.75f, lc.block.mlp.moe.z_coef = 0.01f;
        CHECK(lc.sequence_parallel == (k > 0), "config %d: sequence_parallel %d", k,
              (int)lc.sequence_parallel);
        CHECK_OK(&c[k], tpk_lm_init(&c[k], &m[k], &lc));
        test_set_weights(&c[k], 9, 0.3f);
        mix_tokens(c[k].dp.rank, ids, tg);
        CHECK_OK(&c[k], tpk_params_zero_grad(&c[k]));
        CHECK_OK(&c[k], tpk_lm_forward(&c[k], &m[k], ids, tg, XB, XS, &loss[k]));
        CHECK_OK(&c[k], tpk_lm_backward(&c[k], &m[k], 1.0f));
        CHECK_OK(&c[k], tpk_params_reduce_partial_grads(&c[k]));
    }
    CHECK(m[1].blocks[0].mlp.u.moe.sp && !m[0].blocks[0].mlp.u.moe.sp, "the MoE block's SP: %d, %d",
          (int)m[1].blocks[0].mlp.u.moe.sp, (int)m[0].blocks[0].mlp.u.moe.sp);
    CHECK(fabsf(loss[1] - loss[0]) <= 1e-6f * fabsf(loss[0]), "SP: loss %.9g, without %.9g",
          (double)loss[1], (double)loss[0]);
    CHECK(loss[2] == loss[1] && loss[3] == loss[1],
          "SP: loss %.9g, under full recompute %.9g, selective %.9g", (double)loss[1],
          (double)loss[2], (double)loss[3]);
    int dropped = 0, diff = 0;
    for (int i = 0; i < XL; i++) dropped += (int)m[1].blocks[i].mlp.u.moe.router.dropped;
    MPI_Allreduce(MPI_IN_PLACE, &dropped, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(!opts || dropped > 0, "no row dropped");
    for (int k = 1; k < N; k++)
        CHECK(c[k].params.n == c[0].params.n, "%d parameters, %d without SP", c[k].params.n,
              c[0].params.n);
    for (int i = 0; i < c[0].params.n && i < c[N - 1].params.n; i++) {
        size_t n = tpk_param_global_numel(&c[0], i);
        float *g[N];
        for (int k = 0; k < N; k++) {
            g[k] = malloc(n * sizeof(float));
            CHECK_OK(&c[k], tpk_param_get_global(&c[k], i, true, g[k]));
        }
        char what[160];
        snprintf(what, sizeof what, "SP: the gradient of %s", c[0].params.list[i].name);
        CHECK_CLOSE(g[1], g[0], n, 1e-5, what);
        for (int k = 2; k < N; k++)
            if (memcmp(g[k], g[1], n * sizeof(float)) && diff++ < 3)
                CHECK(false, "SP, %s recompute: the gradient of %s differs",
                      k == 2 ? "full" : "selective", c[0].params.list[i].name);
        for (int k = 0; k < N; k++) free(g[k]);
    }
    CHECK(diff == 0, "%d gradients differ under recompute", diff);
    for (int k = 0; k < N; k++) tpk_lm_destroy(&c[k], &m[k]), tpk_ctx_destroy(&c[k]);
}

/* Mixtral at EP ep with the routers' z-loss (z_coef zc) against the same model without, on the
 * same ranks: the forward is the same, so the loss differs by the layers' z-losses summed, here
 * z_coef mean_t lse_t² of each router recomputed in double from its saved input and gate; and the
 * last layer's gate gradient (which nothing after it reaches) differs by the z-loss's own,
 * sum_t (2 zc lse_t / T) p_t x_tᵀ times the backward's scale. */
static void test_mixtral_zloss(int ep, int E, float zc) {
    tpk_ctx c[2];
    tpk_lm m[2];
    float loss[2], scale = 0.7f;
    int32_t ids[XT], tg[XT];
    for (int k = 0; k < 2; k++) { /* k 0: the z-loss, k 1: none */
        CHECK_OK(&c[k], tpk_ctx_init(&c[k], &(tpk_ctx_desc){.world = &world, .ep = ep, .seed = 3}));
        tpk_mixtral_config cfg = mix_config(E);
        cfg.z_coef = k ? 0 : zc;
        tpk_lm_config lc;
        CHECK_OK(&c[k], tpk_mixtral_lm_config(&c[k], &cfg, &lc));
        CHECK_OK(&c[k], tpk_lm_init(&c[k], &m[k], &lc));
        test_set_weights(&c[k], 9, 0.3f);
        mix_tokens(c[k].dp.rank, ids, tg);
        CHECK_OK(&c[k], tpk_params_zero_grad(&c[k]));
        CHECK_OK(&c[k], tpk_lm_forward(&c[k], &m[k], ids, tg, XB, XS, &loss[k]));
        CHECK_OK(&c[k], tpk_lm_backward(&c[k], &m[k], scale));
    }
    double Z = 0, dmax = 0, gmax = 0;
    float *wg = NULL, *g0 = NULL, *g1 = NULL;
    for (int i = 0; i < XL; i++) { /* each router's z-loss from its input x [T, H] and Wg [E, H] */
        const tpk_router *r = &m[0].blocks[i].mlp.u.moe.router;
        int64_t T = r->T, H = r->H;
        const float *x = (const float *)r->x.data;
        size_t n = tpk_param_global_numel(&c[0], r->w);
        free(wg), free(g0), free(g1);
        wg = malloc(n * sizeof(float)), g0 = malloc(n * sizeof(float));
        g1 = malloc(n * sizeof(float));
        CHECK_OK(&c[0], tpk_param_get_global(&c[0], r->w, false, wg));
        CHECK_OK(&c[0], tpk_param_get_global(&c[0], r->w, true, g0));
        CHECK_OK(&c[1], tpk_param_get_global(&c[1], m[1].blocks[i].mlp.u.moe.router.w, true, g1));
        double *want = calloc((size_t)(E * H), sizeof(double)), z = 0;
        for (int64_t t = 0; t < T; t++) {
            double lg[16], mx = -1e300, se = 0;
            for (int e = 0; e < E; e++) {
                lg[e] = 0;
                for (int64_t h = 0; h < H; h++) lg[e] += (double)x[t * H + h] * wg[e * H + h];
                mx = lg[e] > mx ? lg[e] : mx;
            }
            for (int e = 0; e < E; e++) se += exp(lg[e] - mx);
            double lse = mx + log(se);
            z += lse * lse;
            for (int e = 0; e < E; e++) /* d (zc lse² / T) / d Wg[e] = 2 zc lse p_e x / T */
                for (int64_t h = 0; h < H; h++)
                    want[e * H + h] += 2.0 * zc * lse * exp(lg[e] - lse) * x[t * H + h] / T;
        }
        Z += T ? zc * z / T : 0;
        for (int64_t j = 0; i == XL - 1 && j < E * H; j++) { /* the last layer's gate */
            double d = ((double)g0[j] - g1[j]) - scale * want[j];
            dmax = fabs(d) > dmax ? fabs(d) : dmax;
            gmax = fabs(scale * want[j]) > gmax ? fabs(scale * want[j]) : gmax;
        }
        free(want);
    }
    free(wg), free(g0), free(g1);
    double dl = (double)loss[0] - loss[1];
    CHECK(fabs(dl - Z) < 2e-6 * fmax(1.0, loss[0]) && Z > 0,
          "loss with the z-loss - without %.9g, expected the layers' z-losses %.9g", dl, Z);
    CHECK(gmax > 0 && dmax < 1e-5 * fmax(gmax, 1e-3),
          "the last gate's gradient with the z-loss - without: off by %g of %g", dmax, gmax);
    for (int k = 0; k < 2; k++) tpk_lm_destroy(&c[k], &m[k]), tpk_ctx_destroy(&c[k]);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv);
    me = test__rank, np = test__size;
    tpk_ctx ctx;
    if (tpk_comm_mpi(NULL, MPI_COMM_WORLD, &world) != TPK_OK ||
        tpk_ctx_init(&ctx, &(tpk_ctx_desc){.world = &world, .logger = {test_catch_log, &logs}}) !=
            TPK_OK) {
        fprintf(stderr, "setup failed: %s\n", tpk_last_error(&ctx));
        return 1;
    }
    int wmap[8], half[8];
    const char *set = getenv("TPK_TESTS"); /* make test-long's: long or all */
    bool slow = set && strcmp(set, "quick");
    for (int q = 0; q < np; q++) wmap[q] = q;

    TEST_CASE("mesh: EP groups of consecutive DP ranks, the experts' replicas (EDP)") {
        for (int tp = 1; tp <= np; tp++)
            for (int cp = 1; cp <= np / tp; cp++)
                for (int pp = 1; pp <= np / (tp * cp); pp++) {
                    if (np % (tp * cp * pp)) continue;
                    int dp = np / (tp * cp * pp);
                    for (int ep = 0; ep <= dp; ep++)
                        if (!ep || dp % ep == 0) test_mesh(tp, cp, pp, ep);
                }
        tpk_ctx c;
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .ep = -1}), TPK_ERR_ARG,
                    "desc->ep: expected a divisor of the DP size");
        CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .ep = 2 * np}),
                    TPK_ERR_ARG, "desc->ep: expected a divisor of the DP size");
        if (np == 4) {
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .ep = 3}),
                        TPK_ERR_ARG, "desc->ep: expected a divisor of the DP size 4");
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &world, .tp = 2, .ep = 4}),
                        TPK_ERR_ARG, "desc->ep: expected a divisor of the DP size 2");
        }
        if (np > 1) {
            tpk_comm_vtable vt = *world.vt; /* a world without the all-to-all */
            vt.alltoallv = NULL;
            tpk_comm holed = world;
            holed.vt = &vt;
            CHECK_FAILS(&c, tpk_ctx_init(&c, &(tpk_ctx_desc){.world = &holed, .ep = np}),
                        TPK_ERR_ARG, "has no alltoallv entry");
        }
    }
    TEST_CASE("router: top-k (ties: the lower index first), weights, counts and the aux loss "
              "against a plain C reference; its backward against central differences") {
        test_router(24, 6, 8, 2, true, true, 0, 0);
        test_router(24, 6, 8, 3, false, true, 0, 0);
        test_router(17, 5, 6, 2, true, false, 0, 0);
        test_router(9, 4, 4, 1, false, false, 0, 0);
        test_router(0, 4, 4, 2, true, false, 0, 0);
        if (np == 2) test_router(17, 5, 6, 2, true, false, 0.05f, 0.6f);
        if (np == 1 || np == 3) { /* the z-loss and capacity: ties, k 3, not renormalised */
            test_router(24, 6, 8, 2, true, true, 0.01f, 1.0f);
            test_router(24, 6, 8, 3, false, true, 0.1f, 0.5f);
            test_router(9, 4, 4, 1, false, false, 0.02f, 1.25f);
            test_router(0, 4, 4, 2, true, false, 0.02f, 1.0f);
        }
    }
    TEST_CASE("dispatcher: the rows each EP rank receives, the combine and both backwards "
              "against the senders' tokens (an expert with none, ranks of 2 and 0 tokens)") {
        for (int ep = 1; ep <= np; ep++)
            if (np % ep == 0) test_dispatch(1, ep);
        if (np == 4) test_dispatch(2, 2);
    }
    TEST_CASE("MoE block: y, aux, dx and every gradient against an unsharded dense loop over the "
              "experts (EP %d%s)",
              np,
              np == 4   ? ", TP 2 x EP 2, EP 2 x DP 2"
              : np == 2 ? ", TP 2, DP 2"
                        : "") {
        test_moe_layer(1, np, np == 3 ? 6 : 4, true, 0, 0, 0);
        if (np == 1) test_moe_layer(1, 1, 4, false, 0, 0, 0);
        if (np == 2)
            test_moe_layer(2, 1, 4, false, 0, 0, 0), test_moe_layer(1, 1, 4, true, 0, 0, 0);
        if (np == 3) test_moe_layer(3, 1, 3, false, 0, 0, 0);
        if (np == 4)
            test_moe_layer(2, 2, 4, false, 0, 0, 0), test_moe_layer(1, 2, 6, true, 0, 0, 0);
    }
    TEST_CASE("MoE block options: the router's z-loss, a capacity factor (the lowest-weighted rows "
              "dropped), a shared expert with its sigmoid gate, against the dense loop (%s)",
              np == 1   ? "EP 1, each alone and together"
              : np == 2 ? "EP 2, together"
              : np == 3 ? "EP 3 and TP 3 (F_s 5 split unevenly), together"
                        : "none at 4 ranks") {
        if (np == 2) test_moe_layer(1, 2, 4, true, 0.05f, 0.75f, 5);
        if (np == 1) {
            test_moe_layer(1, 1, 4, true, 0.05f, 0, 0);
            test_moe_layer(1, 1, 4, false, 0, 0.5f, 0);
            test_moe_layer(1, 1, 4, true, 0, 0, 6);
            test_moe_layer(1, 1, 4, true, 0.02f, 1.0f, 5);
        }
        if (np == 3) test_moe_layer(1, 3, 6, true, 0.05f, 0.75f, 5);
        if (np == 3) test_moe_layer(3, 1, 3, false, 0.02f, 0.6f, 5);
    }
    TEST_CASE("MoE block under SP (x S(0) gathered, y reduce-scattered) against the dense loop: "
              "%s",
              np == 2   ? "TP 2, rows 3 + 2, alone and with the options"
              : np == 4 ? (slow ? "TP 2 x EP 2, rows 3 + 2 and 1 + 1" : "TP 2 x EP 2 (long set)")
              : np == 3 ? "TP 3 (F, F_s split unevenly), the options"
                        : "TP 1 (a copy)") {
        if (np == 2)
            test_moe_layer_in(2, 1, 4, false, 0, 0, 0, true),
                test_moe_layer_in(2, 1, 4, true, 0.05f, 0.75f, 5, true);
        if (np == 4 && slow)
            test_moe_layer_in(2, 2, 4, false, 0, 0, 0, true),
                test_moe_layer_in(2, 2, 4, true, 0.02f, 1.0f, 5, true);
        if (np == 3) test_moe_layer_in(3, 1, 3, false, 0.02f, 0.6f, 5, true);
        if (np == 1) test_moe_layer_in(1, 1, 4, true, 0.05f, 0.75f, 5, true);
    }
    TEST_CASE("Mixtral: the loss (aux pooled over the layers), every gradient, and 2 training "
              "steps (experts reduced over EDP, the norm over EP) at %s against one rank's EP 1 "
              "model on each DP rank's tokens",
              np == 4   ? "TP 2 x EP 2 x DP 2, EP 2 x DP 4 (EDP 2) and CP 2 x EP 2 x DP 2"
              : np == 1 ? "EP 1"
              : np == 2 ? "EP 2 and CP 2"
                        : "EP 3") {
        if (np == 4)
            test_mixtral(2, 1, 2, 4, 0), test_mixtral(1, 1, 2, 4, 0), test_mixtral(1, 2, 2, 4, 0);
        else test_mixtral(1, 1, np, np == 3 ? 6 : 4, 0);
        if (np == 2) test_mixtral(1, 2, 1, 4, 0);
    }
    TEST_CASE("Mixtral with dropout 0.2 at %s: the loss and every gradient those of TP 1 x EP 1 "
              "on the same DP ranks; full and selective recompute replay the masks (the bits)",
              np == 4   ? "TP 2 x EP 2 x DP 2 and EP 2 x DP 4"
              : np == 1 ? "TP 1 x EP 1"
              : np == 2 ? "EP 2 and TP 2"
                        : "EP 3") {
        if (np == 4) test_mixtral_dropout(2, 2, 4, false), test_mixtral_dropout(1, 2, 4, false);
        if (np == 2) test_mixtral_dropout(1, 2, 4, false), test_mixtral_dropout(2, 1, 4, false);
        if (np == 1) test_mixtral_dropout(1, 1, 4, false);
        if (np == 3) test_mixtral_dropout(1, 3, 6, false);
        if (me == 0) printf("dropout: largest relative gradient difference %.3g\n", worst_dropout);
    }
    TEST_CASE("Qwen2-MoE (q, k, v biases, a shared expert, norm_topk_prob %s): the loss, every "
              "gradient and 2 training steps at %s against one rank's EP 1 model on each DP "
              "rank's tokens; its names; bad config refused by name",
              np == 1 || np == 4 ? "on and off" : "off",
              np == 4   ? "TP 2 x EP 2 x DP 2 and EP 2 x DP 4 (EDP 2)"
              : np == 1 ? "EP 1"
              : np == 2 ? "EP 2"
                        : "TP 3 (a key/value head and its bias on two ranks)") {
        if (np == 4) test_mixtral(2, 1, 2, 4, 1), test_mixtral(1, 1, 2, 4, 2);
        if (np == 1) test_mixtral(1, 1, 1, 4, 1), test_mixtral(1, 1, 1, 4, 2);
        if (np == 2) test_mixtral(1, 1, 2, 4, 1);
        if (np == 3) test_mixtral(3, 1, 1, 4, 1);
    }
    TEST_CASE("Qwen2-MoE with dense layers between the sparse ones (decoder_sparse_step 2, "
              "mlp_only_layers [3]), a capacity factor and the routers' z-loss at %s: the loss "
              "(the aux over the sparse layers alone), every gradient and 2 training steps "
              "against one rank's EP 1 model; bad config refused by name",
              np == 2 ? "EP 2" : np == 3 ? "TP 3" : np == 1 ? "EP 1" : "none at 4 ranks") {
        if (np == 2) test_mixtral(1, 1, 2, 4, 3);
        if (np == 3) test_mixtral(3, 1, 1, 4, 3);
        if (np == 1) test_mixtral(1, 1, 1, 4, 3);
    }
    TEST_CASE("Qwen2-MoE with dense layers and dropout 0.2 at %s: the loss and every gradient "
              "those of TP 1 x EP 1 on the same DP ranks; full and selective recompute replay "
              "the masks (the bits)",
              np == 2 ? "EP 2" : np == 3 ? "TP 3" : np == 1 ? "TP 1 x EP 1" : "none at 4 ranks") {
        if (np == 2) test_mixtral_dropout(1, 2, 4, true);
        if (np == 3) test_mixtral_dropout(3, 1, 4, true);
        if (np == 1) test_mixtral_dropout(1, 1, 4, true);
    }
    TEST_CASE("Qwen2-MoE: a checkpoint saved at %s (every routed expert from its EP rank), all "
              "sparse and with dense layers, read back: config.json, loaded by one rank's EP 1 "
              "model and at the saving mesh",
              np == 4 ? "TP 2 x EP 2" : np == 3 ? "TP 3" : np == 2 ? "EP 2" : "EP 1") {
        for (int dense = 0; dense < 2; dense++)
            if (np == 4) test_qwen_ckpt(2, 2, dense);
            else if (np == 3) test_qwen_ckpt(3, 1, dense);
            else test_qwen_ckpt(1, np, dense);
    }
    TEST_CASE("Qwen2-MoE: config.json (Qwen2MoeForCausalLM's keys, defaults, the dense layers' "
              "keys, refusals by name)") {
        static const char *base =
            "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 2, \"hidden_size\": 16, "
            "\"num_attention_heads\": 4, \"vocab_size\": 67, \"max_position_embeddings\": 32, "
            "\"intermediate_size\": 5632";
        char buf[1024];
        tpk_qwen2_moe_config qc;
        memset(&qc, 0, sizeof qc);
        snprintf(buf, sizeof buf,
                 "%s, \"hidden_act\": \"silu\", \"num_key_value_heads\": 2, \"num_experts\": 6, "
                 "\"num_experts_per_tok\": 3, \"moe_intermediate_size\": 12, "
                 "\"shared_expert_intermediate_size\": 20, \"norm_topk_prob\": true, "
                 "\"router_aux_loss_coef\": 0.02, \"output_router_logits\": true, "
                 "\"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"rope_theta\": 1e6, "
                 "\"rms_norm_eps\": 1e-5, \"use_sliding_window\": false, \"sliding_window\": "
                 "4096, \"tie_word_embeddings\": true}",
                 base);
        CHECK_OK(&ctx,
                 tpk_qwen2_moe_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &qc));
        CHECK(qc.layers == 2 && qc.hidden == 16 && qc.heads == 4 && qc.kv_heads == 2 &&
                  qc.vocab == 67 && qc.positions == 32 && qc.experts == 6 && qc.top_k == 3 &&
                  qc.moe_ffn == 12 && qc.shared_ffn == 20 && qc.norm_topk_prob == 1 &&
                  qc.aux_coef == 0.02f && qc.rope_theta == 1e6f && qc.norm_eps == 1e-5f &&
                  qc.tie_embeddings,
              "parsed: L %lld G %lld E %lld k %lld F %lld Fs %lld norm %lld coef %g theta %g eps "
              "%g tie %d",
              (long long)qc.layers, (long long)qc.kv_heads, (long long)qc.experts,
              (long long)qc.top_k, (long long)qc.moe_ffn, (long long)qc.shared_ffn,
              (long long)qc.norm_topk_prob, (double)qc.aux_coef, (double)qc.rope_theta,
              (double)qc.norm_eps, (int)qc.tie_embeddings);
        /* the defaults (Qwen2MoeConfig's): 60 experts, top-4, F 1408, F_s 5632, no
         * renormalisation, rope_theta 10000, eps 1e-6, G = A, and no aux unless
         * output_router_logits is true */
        snprintf(buf, sizeof buf, "%s}", base);
        CHECK_OK(&ctx,
                 tpk_qwen2_moe_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &qc));
        CHECK(qc.experts == 60 && qc.top_k == 4 && qc.moe_ffn == 1408 && qc.shared_ffn == 5632 &&
                  qc.norm_topk_prob == 0 && qc.aux_coef < 0 && qc.rope_theta == 10000.0f &&
                  qc.norm_eps == 1e-6f && qc.kv_heads == 4 && !qc.tie_embeddings,
              "defaults: E %lld k %lld F %lld Fs %lld norm %lld coef %g theta %g eps %g G %lld",
              (long long)qc.experts, (long long)qc.top_k, (long long)qc.moe_ffn,
              (long long)qc.shared_ffn, (long long)qc.norm_topk_prob, (double)qc.aux_coef,
              (double)qc.rope_theta, (double)qc.norm_eps, (long long)qc.kv_heads);
        snprintf(buf, sizeof buf, "%s, \"output_router_logits\": true}", base);
        CHECK_OK(&ctx,
                 tpk_qwen2_moe_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &qc));
        CHECK(qc.aux_coef == 0.001f, "output_router_logits true: coef %g, expected 0.001",
              (double)qc.aux_coef);
        /* dense layers: decoder_sparse_step, mlp_only_layers (a set: repeats), intermediate_size;
         * absent: every layer sparse, intermediate_size 5632 */
        CHECK(qc.sparse_step == 1 && tpk_layer_set_last(&qc.mlp_only) < 0 &&
                  qc.dense_ffn == 5632,
              "defaults: step %lld, mlp_only up to %lld, F_d %lld", (long long)qc.sparse_step,
              (long long)tpk_layer_set_last(&qc.mlp_only), (long long)qc.dense_ffn);
        snprintf(buf, sizeof buf,
                 "%s, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [1, 0, 1]}", base);
        CHECK_OK(&ctx,
                 tpk_qwen2_moe_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &qc));
        CHECK(qc.sparse_step == 2 && tpk_layer_set_has(&qc.mlp_only, 0) &&
                  tpk_layer_set_has(&qc.mlp_only, 1) && tpk_layer_set_last(&qc.mlp_only) == 1 &&
                  !tpk_qwen2_moe_sparse(&qc, 0) && !tpk_qwen2_moe_sparse(&qc, 1) &&
                  tpk_qwen2_moe_dense_layers(&qc) == 2,
              "step %lld, mlp_only up to %lld", (long long)qc.sparse_step,
              (long long)tpk_layer_set_last(&qc.mlp_only));
        snprintf(buf, sizeof buf,
                 "{\"num_hidden_layers\": 6, \"hidden_size\": 16, \"num_attention_heads\": 4, "
                 "\"vocab_size\": 67, \"max_position_embeddings\": 32, \"intermediate_size\": 40, "
                 "\"decoder_sparse_step\": 3, \"mlp_only_layers\": null}");
        CHECK_OK(&ctx,
                 tpk_qwen2_moe_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &qc));
        bool rule = true; /* Hugging Face's: sparse where (i + 1) % 3 == 0: layers 2 and 5 */
        for (int i = 0; i < 6; i++) rule = rule && tpk_qwen2_moe_sparse(&qc, i) == (i % 3 == 2);
        CHECK(rule && qc.dense_ffn == 40 && tpk_qwen2_moe_dense_layers(&qc) == 4 &&
                  tpk_layer_set_last(&qc.mlp_only) < 0,
              "decoder_sparse_step 3: F_d %lld, %lld dense layers", (long long)qc.dense_ffn,
              (long long)tpk_qwen2_moe_dense_layers(&qc));
        char *f40 = strstr(buf, "40,"); /* intermediate_size 0: refused */
        if (f40) f40[0] = ' ';
        CHECK(tpk_qwen2_moe_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &qc) ==
                      TPK_ERR_FORMAT &&
                  strstr(tpk_last_error(&ctx), "intermediate_size 0: expected a whole number"),
              "intermediate_size 0: %s", tpk_last_error(&ctx));
        const char *bad[][2] = {
            {", \"decoder_sparse_step\": 0}", "decoder_sparse_step 0: expected a whole number"},
            {", \"decoder_sparse_step\": 1.5}", "decoder_sparse_step 1.5: expected a whole"},
            {", \"mlp_only_layers\": [2]}",
             "mlp_only_layers: expected whole layer indices 0..1 (num_hidden_layers 2), got 2"},
            {", \"mlp_only_layers\": [-1]}", "mlp_only_layers: expected whole layer indices"},
            {", \"mlp_only_layers\": [0.5]}", "got 0.5"},
            {", \"mlp_only_layers\": [\"0\"]}", "got not a number"},
            {", \"mlp_only_layers\": 1}",
             "mlp_only_layers: expected an array of layer indices or null"},
            {", \"use_sliding_window\": true}", "use_sliding_window: expected false"},
            {", \"qkv_bias\": false}", "qkv_bias: expected true"},
            {", \"num_experts_per_tok\": 61}", "num_experts_per_tok 61"},
            {", \"num_experts\": 0}", "num_experts 0"},
            {", \"norm_topk_prob\": 1}", "expected true or false for norm_topk_prob"},
            {", \"moe_intermediate_size\": \"8\"}", "for moe_intermediate_size"},
            {", \"hidden_act\": \"gelu\"}", "hidden_act \"gelu\": expected \"silu\""},
            {", \"rope_scaling\": {\"type\": \"linear\"}}", "rope_scaling: expected null"},
            {", \"num_key_value_heads\": 3}", "num_key_value_heads 3: expected a divisor"},
            {", \"head_dim\": 8}", "head_dim 8: expected hidden_size / num_attention_heads"}};
        for (int k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++) {
            snprintf(buf, sizeof buf, "%s%s", base, bad[k][0]);
            tpk_status s =
                tpk_qwen2_moe_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &qc);
            CHECK(s != TPK_OK && strstr(tpk_last_error(&ctx), bad[k][1]), "%s: %s", bad[k][0],
                  tpk_last_error(&ctx));
        }
    }
    TEST_CASE("Mixtral under recompute (%s) at EP %d: the loss and every gradient the bits of no "
              "recompute",
              np == 4   ? "none at 4 ranks"
              : np == 2 ? "full with a capacity and a shared expert, selective"
                        : "full and selective, with a capacity and a shared expert and without",
              np == 4 ? 2 : np) {
        int ep = np == 4 ? 2 : np, E = np == 3 ? 6 : 4;
        if (np == 2)
            test_mixtral_recompute(ep, E, TPK_RECOMPUTE_FULL, true),
                test_mixtral_recompute(ep, E, TPK_RECOMPUTE_SELECTIVE, false);
        if (np == 1 || np == 3)
            for (int o = 0; o < 2; o++) {
                test_mixtral_recompute(ep, E, TPK_RECOMPUTE_FULL, o);
                test_mixtral_recompute(ep, E, TPK_RECOMPUTE_SELECTIVE, o);
            }
    }
    TEST_CASE("Mixtral under ZeRO at EP %d x DP %d (%s): 3 steps equal ZeRO-0's (losses, norms, "
              "weights)",
              np == 1 ? 1 : 2, np,
              np == 4   ? "EDP 2: ZeRO-1, ZeRO-2 over 2 micro-batches, ZeRO-3 sharded"
              : np == 2 ? "EDP 1: nothing sliced, ZeRO-2"
                        : "ZeRO-3 over 2 micro-batches") {
        if (np == 4) {
            test_mixtral_zero(2, 4, 1, 1);
            test_mixtral_zero(2, 4, 2, 2);
            test_mixtral_zero(2, 4, 3, 1);
        }
        if (np == 2) test_mixtral_zero(2, 4, 2, 1);
        if (np == 1 || np == 3) test_mixtral_zero(np == 3 ? 3 : 1, np == 3 ? 6 : 4, 3, 2);
    }
    TEST_CASE("%s under SP at %s: the loss and gradients those without SP, recompute's bits SP's",
              np == 4 ? "Mixtral (capacity, z-loss, shared expert), Qwen2-MoE"
                      : "Mixtral (alone; capacity, z-loss, shared expert)",
              np == 4 ? (slow ? "TP 2 x EP 2" : "TP 2 x EP 2 (long set)")
              : np == 1 ? "TP 1"
              : np == 3 ? "TP 3"
                        : "TP 2") {
        int tp = np == 4 ? 2 : np, E = np == 3 ? 6 : 4;
        if (np != 4) test_moe_sp(tp, 1, E, false, false), test_moe_sp(tp, 1, E, true, false);
        if (np == 4 && slow) test_moe_sp(2, 2, 4, true, false), test_moe_sp(2, 2, 4, false, true);
    }
    TEST_CASE("Mixtral with the routers' z-loss at EP %d: the loss the layers' z-losses above the "
              "model's without, the last gate's gradient the z-loss's own above (a double "
              "reference from each router's input)",
              np == 4 ? 2 : np) {
        test_mixtral_zloss(np == 4 ? 2 : np, np == 3 ? 6 : 4, 0.05f);
    }
    TEST_CASE("Mixtral: config.json (MixtralForCausalLM's keys, defaults, refusals by name)") {
        static const char *base =
            "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"hidden_size\": 16, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 67, "
            "\"max_position_embeddings\": 32, \"intermediate_size\": 12, "
            "\"hidden_act\": \"silu\"";
        char buf[1024];
        tpk_mixtral_config mc;
        memset(&mc, 0, sizeof mc);
        snprintf(buf, sizeof buf,
                 "%s, \"num_local_experts\": 6, \"num_experts_per_tok\": 3, "
                 "\"router_aux_loss_coef\": 0.02, \"sliding_window\": null, "
                 "\"output_router_logits\": true}",
                 base);
        CHECK_OK(&ctx, tpk_mixtral_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &mc));
        CHECK(mc.layers == 2 && mc.hidden == 16 && mc.kv_heads == 2 && mc.ffn == 12 &&
                  mc.experts == 6 && mc.top_k == 3 && mc.aux_coef == 0.02f &&
                  mc.norm_eps == 1e-5f && mc.rope_theta == 1e6f,
              "parsed: L %lld E %lld k %lld coef %g eps %g theta %g", (long long)mc.layers,
              (long long)mc.experts, (long long)mc.top_k, (double)mc.aux_coef, (double)mc.norm_eps,
              (double)mc.rope_theta);
        /* the defaults: 8 experts, top-2, 0.001, and no aux in the loss unless
         * output_router_logits is true (false when absent) */
        snprintf(buf, sizeof buf, "%s, \"output_router_logits\": true}", base);
        CHECK_OK(&ctx, tpk_mixtral_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &mc));
        CHECK(mc.experts == 8 && mc.top_k == 2 && mc.aux_coef == 0.001f, "defaults: %lld %lld %g",
              (long long)mc.experts, (long long)mc.top_k, (double)mc.aux_coef);
        snprintf(buf, sizeof buf,
                 "%s, \"router_aux_loss_coef\": 0.02, \"output_router_logits\": false}", base);
        CHECK_OK(&ctx, tpk_mixtral_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &mc));
        CHECK(mc.aux_coef < 0, "output_router_logits false: no aux, got coef %g",
              (double)mc.aux_coef);
        snprintf(buf, sizeof buf, "%s, \"router_aux_loss_coef\": 0.02}", base);
        CHECK_OK(&ctx, tpk_mixtral_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &mc));
        CHECK(mc.aux_coef < 0, "output_router_logits absent: no aux, got coef %g",
              (double)mc.aux_coef);
        const char *bad[][2] = {{", \"num_experts_per_tok\": 9}", "num_experts_per_tok 9"},
                                {", \"sliding_window\": 16}", "sliding_window 16"},
                                {", \"router_jitter_noise\": 0.1}", "router_jitter_noise"},
                                {", \"num_local_experts\": \"8\"}", "for num_local_experts"},
                                {", \"output_router_logits\": 1}",
                                 "output_router_logits: expected"}};
        for (int k = 0; k < 5; k++) {
            snprintf(buf, sizeof buf, "%s%s", base, bad[k][0]);
            tpk_status s =
                tpk_mixtral_config_parse(&ctx, (const uint8_t *)buf, strlen(buf), "c", &mc);
            CHECK(s != TPK_OK && strstr(tpk_last_error(&ctx), bad[k][1]), "%s: %s", bad[k][0],
                  tpk_last_error(&ctx));
        }
    }
    TEST_CASE("alltoallv: uneven and zero counts, f32, bf16, i32, blocking and started") {
        a2a_case(&ctx, &world, wmap, TPK_F32, false);
        a2a_case(&ctx, &world, wmap, TPK_BF16, true);
        a2a_case(&ctx, &world, wmap, TPK_I32, false);
        a2a_case(&ctx, &world, wmap, TPK_F32, true);
    }
    TEST_CASE("alltoallv: on a split (odd and even ranks), on self, and with nothing to send") {
        tpk_comm sub = {0};
        CHECK_OK(&ctx, tpk_comm_split(&ctx, &world, me % 2, me, &sub));
        for (int r = 0; r < sub.size; r++) half[r] = me % 2 + 2 * r;
        a2a_case(&ctx, &sub, half, TPK_F32, false);
        a2a_case(&ctx, &sub, half, TPK_I32, true);
        tpk_comm_destroy(&sub);
        tpk_comm self = tpk_comm_self(false);
        int one[1] = {me};
        a2a_case(&ctx, &self, one, TPK_F32, false);
        a2a_case(&ctx, &self, one, TPK_BF16, true);
        size_t zero[8] = {0};
        CHECK_OK(&ctx, tpk_alltoallv(&ctx, &world, NULL, zero, NULL, zero, TPK_F32));
        CHECK(world.stats.elems[TPK_COLL_ALLTOALL] > 0, "elements counted");
    }
    TEST_CASE("alltoallv: bad counts and buffers refused by name") {
        size_t sc[8], rc[8];
        float x[64], y[64];
        for (int q = 0; q < np; q++) sc[q] = rc[q] = q == me ? 2 : 0;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, NULL, y, rc, TPK_F32), TPK_ERR_ARG,
                    "sendcounts: expected");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, NULL, TPK_F32), TPK_ERR_ARG,
                    "recvcounts: expected");
        sc[0] = (size_t)INT_MAX + 1;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, rc, TPK_F32), TPK_ERR_ARG,
                    "sendcounts[0]");
        sc[0] = me == 0 ? 2 : 0;
        if (np > 1) {
            size_t big[8];
            for (int q = 0; q < np; q++) big[q] = (size_t)INT_MAX / 2 + 1;
            CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, big, TPK_F32), TPK_ERR_ARG,
                        "recvcounts: the");
        }
        rc[me] = 3;
        char want[64];
        snprintf(want, sizeof want, "recvcounts[%d]", me);
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, rc, TPK_F32), TPK_ERR_ARG, want);
        rc[me] = 2;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, NULL, sc, y, rc, TPK_F32), TPK_ERR_ARG,
                    "send: NULL");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, NULL, rc, TPK_F32), TPK_ERR_ARG,
                    "recv: NULL");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, x, rc, TPK_F32), TPK_ERR_ARG,
                    "recv: must not alias send");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &world, x, sc, y, rc, (tpk_dtype)99), TPK_ERR_DTYPE,
                    "dtype");
        CHECK_FAILS(&ctx, tpk_alltoallv_start(&ctx, &world, x, sc, y, rc, TPK_F32, NULL),
                    TPK_ERR_ARG, "req: expected a request");
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, NULL, x, sc, y, rc, TPK_F32), TPK_ERR_ARG, "comm");
        CHECK_FAILS(&ctx, tpk_alltoallv_counts(&ctx, &world, sc, NULL), TPK_ERR_ARG, "recvcounts");
        tpk_comm_vtable vt = *world.vt; /* a communicator without the optional entry */
        vt.alltoallv = NULL;
        tpk_comm holed = world;
        holed.vt = &vt;
        CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &holed, x, sc, y, rc, TPK_F32), TPK_ERR_ARG,
                    "the communicator \"mpi\" has no all-to-all entry (alltoallv)");
        CHECK(world.stats.calls[TPK_COLL_ALLTOALL] == 9, /* 4 cases of 2, the empty one */
              "%llu calls counted, expected 9 (a refused call is not counted)",
              (unsigned long long)world.stats.calls[TPK_COLL_ALLTOALL]);
    }
    TEST_CASE("alltoallv: a peer that never enters it is TPK_ERR_COMM within the timeout") {
        /* pairs of ranks (an odd last one alone: self, which never waits): the first waits with a
         * 0.3 s timeout, the second enters after it has given up and finishes the abandoned
         * collective with it */
        static float x[4], y[4]; /* the abandoned collective's buffers stay valid to the end */
        tpk_comm pair = {0};
        CHECK_OK(&ctx, tpk_comm_split(&ctx, &world, me / 2, me, &pair));
        CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, 0.3));
        size_t two[2] = {2, 2};
        for (int i = 0; i < 4; i++) x[i] = (float)(10 * me + i), y[i] = NAN;
        if (pair.size == 1) {
            CHECK_OK(&ctx, tpk_alltoallv(&ctx, &pair, x, two, y, two, TPK_F32));
        } else if (pair.rank == 0) {
            logs.n = 0;
            CHECK_FAILS(&ctx, tpk_alltoallv(&ctx, &pair, x, two, y, two, TPK_F32), TPK_ERR_COMM,
                        "no answer from a peer within 0.3 s");
            CHECK(strstr(tpk_last_error(&ctx), "tpk_alltoallv"), "message names it: %s",
                  tpk_last_error(&ctx));
            const tpk_flight_entry *e = &pair.flight.ring[pair.flight.ops % TPK_FLIGHT_N];
            CHECK(e->kind == TPK_COLL_ALLTOALL && e->state == TPK_FLIGHT_FAILED,
                  "flight record: kind %d state %d", e->kind, e->state);
            CHECK(test_lines_with(&logs, "all-to-all #1", "failed") >= 1,
                  "the report names the all-to-all (%d lines)", logs.n);
            int go = 1, seen = 0;
            MPI_Send(&go, 1, MPI_INT, me + 1, 77, MPI_COMM_WORLD);
            MPI_Recv(&seen, 1, MPI_INT, me + 1, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(seen == 1, "the partner's all-to-all finished");
        } else {
            int go = 0;
            MPI_Recv(&go, 1, MPI_INT, me - 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK_OK(&ctx, tpk_comm_mpi_set_timeout(&ctx, &pair, 60));
            CHECK_OK(&ctx, tpk_alltoallv(&ctx, &pair, x, two, y, two, TPK_F32));
            int seen = y[0] == (float)(10 * (me - 1) + 2) && y[2] == (float)(10 * me + 2);
            CHECK(seen, "late all-to-all: %g %g", y[0], y[2]);
            MPI_Send(&seen, 1, MPI_INT, me - 1, 78, MPI_COMM_WORLD);
        }
        tpk_comm_destroy(&pair);
    }

    tpk_ctx_destroy(&ctx);
    tpk_comm_destroy(&world);
    return test_finish();
}
