/* tpk/layers/moe.h — a mixture of experts with expert parallelism: the token dispatcher (rows
 * permuted by expert, exchanged over the EP group with the all-to-all, combined back) and the
 * sparse MoE block (router, dispatcher, SwiGLU experts), forward and backward.
 *
 * E experts over the P ranks of ctx->ep (tpk_ctx_desc.ep; P divides E): EP rank r holds experts
 * [r El, r El + El), El = E / P. Each rank routes its own T tokens (tpk/layers/router.h: e_ti,
 * w_ti for i < k); a token's k choices are its N = T k rows.
 *
 * Dispatch (dropless by default: every row goes to its expert; under a capacity factor the
 * router marks the rows it drops, idx -1, and the dispatcher sends none for them: N counts the
 * rows kept, a token's output sums its kept rows only, zero when none is kept, a dropped row's
 * dw is 0)
 *   permute    xs[s] = x[t(s)]: the rows in send order, sorted by expert, each expert's in token
 *              order; an EP rank's experts are consecutive, so its rows are one block
 *   counts     all-to-all of El int32 per peer: c[q][j], the rows EP rank q sends to local expert j
 *   exchange   all-to-all of the rows (tpk_alltoallv over ctx->ep): xr [R, H] from rank q's block,
 *              in [q][j] order
 *   regroup    xg [R, H] in [j][q] order: local expert j's rows n_j = sum_q c[q][j] consecutive
 *              (chunk copies; none when P = 1 or El = 1)
 * Experts (tpk_moe; each a SwiGLU MLP, Mixtral's w1 gate, w3 up, w2 down; weights held only by
 * their EP rank; each GEMM one gemm_grouped call over the local experts, n_j rows each)
 *   og_j = (silu(xg_j W1_jᵀ) ∘ (xg_j W3_jᵀ)) W2_jᵀ   [n_j, H]
 *   expert TP (t > 1): W1, W3 split on F (S(0)), W2 on F (S(1)): og_j is P over TP -> all-reduce
 *   (under sequence parallelism left P until the combine's output: below)
 * Combine
 *   ungroup + exchange back (the dispatch's all-to-all with the counts swapped): ob [N, H] in send
 *   order; y[t] = sum_i w_ti ob[s(t, i)]  (i ascending)   y R [T, H]
 * Backward: the reverse path —
 *   dw_ti = dy[t] . ob[s(t, i)]  (to the router);  dob[s(t, i)] = w_ti dy[t]
 *   exchange (dispatch's counts) + regroup: dog [R, H];  the experts' backward:
 *     dh_j = dog_j W2_j, dW2_j += dog_jᵀ h_j;  dgu_j = swiglu'(gu_j) dh_j;
 *     dW1_j += dgate_jᵀ xg_j, dW3_j += dup_jᵀ xg_j;  dxg_j = dgate_j W1_j + dup_j W3_j
 *     (expert TP: dxg is P over TP -> all-reduce)
 *   ungroup + exchange back: dxs [N, H] in send order;
 *     dx[t] = sum_i dxs[s(t, i)] (in send order: by expert) + the router's dx
 * Collectives per forward (and again per backward), on ctx->ep: one all-to-all of P El int32
 * (the counts; forward only) and two of the rows: N H elements sent and R H received each; expert
 * TP adds an all-reduce of R H over ctx->tp each way. At P = 1 no all-to-all is made (the rows
 * stay put). Each permutation is one op over the rows (tpk/base/ops.h): the dispatch's permute,
 * the regroup and the ungroup gather_rows, the dispatch's backward scatter_add_rows (a token's k
 * rows summed in send order: by expert), the combine moe_combine_fwd and its backward
 * moe_combine_bwd (dw and dob in one call), their indices (slot, src and the regroup's
 * permutation, int32) uploaded once a dispatch and the weights once a combine or its backward:
 * O(1) op calls a layer whatever N.
 * Parameters (Hugging Face Mixtral's names): "<name>.gate.weight" [E, H] R (every rank), and for
 * each local expert e "<name>.experts.<e>.w1.weight" [F, H] S(0), ".w3.weight" [F, H] S(0),
 * ".w2.weight" [H, F] S(1), marked tpk_param.expert (their gradient is to be summed over ctx->edp;
 * desc.proj_names: Qwen2-MoE's ".gate_proj", ".up_proj", ".down_proj" for w1, w3, w2).
 * A shared expert (tpk_moe_desc.shared_hidden F_s > 0, Qwen2-MoE's): y[t] += sigmoid(x_t . ws)
 * so_t, so = (silu(x Wgᵀ) ∘ x Wuᵀ) Wdᵀ on every token, "<name>.shared_expert.gate_proj.weight"
 * [F_s, H] S(0), ".up_proj.weight" [F_s, H] S(0), ".down_proj.weight" [H, F_s] S(1) and
 * "<name>.shared_expert_gate.weight" [1, H] R: a dense MLP split over TP (so P -> all-reduce),
 * replicated over EP (tpk_param.expert false). The z-loss and capacity: tpk/layers/router.h.
 * Inputs: x R [T, H] in the context's dtype; each TP rank of an EP group routes the same tokens
 * and sends them over its own EP group.
 * Sequence parallelism (tpk_moe_desc.sequence_parallel; x, y, dy, dx S(0) [T, H], each TP rank's
 * rows, uneven splits allowed): the block's entry and exit only, the dispatcher unchanged —
 *   forward   x S(0) -> all-gather -> R (kept for the backward: the router's and the shared
 *             expert's input); router, dispatch, experts as above on the T tokens (every TP rank
 *             routes the same ones: the aux, the capacity's drops and the all-to-alls are the
 *             non-SP ones); og left P (no all-reduce); the combine is linear: y P [T, H] (+ the
 *             shared expert's sigmoid_t so_t, so left P) -> reduce-scatter -> S(0)
 *   backward  dy S(0) -> all-gather -> R; dog = w dy whole; dw_ti = dy[t] . ob[s(t, i)] P (ob was)
 *             and the shared gate's dots dy[t] . so[t] P: one all-reduce of T (k + 1) f32 over TP;
 *             the experts' and the shared expert's dx left P; the router's dx and the shared
 *             gate's dl ws (R) added on TP rank 0 alone; dx P -> reduce-scatter -> S(0)
 * Over TP, each way one all-gather and one reduce-scatter of T H (Megatron-core's SP with MoE)
 * in place of the all-reduces of R H (R ~ T k: k times the tokens) and T H (the shared expert),
 * plus the backward's all-reduce of T (k + 1) f32. The gate's gradient is whole on every TP rank
 * (the routing weights' gradient summed before the router's backward; its input the gathered
 * tokens), as without SP: no sum over TP. Results equal the non-SP block's up to rounding (the
 * partial rows are combined before they are summed); recompute replays the same bits. */
#ifndef TPK_MOE_H
#define TPK_MOE_H

#include "router.h"

/* ---- the dispatcher ------------------------------------------------------------------------ */

typedef struct tpk_moe_dispatcher {
    int64_t H, E, K, El; /* hidden size, experts, top-k, experts per EP rank */
    int P, rank;         /* the EP group's size, this rank's place in it */
    int64_t T, N, R;     /* tokens, rows sent (T K less the dropped), rows received */
    int64_t NK;          /* T K: the routing's entries (idx, weight, dweight) */
    int64_t cap_N;       /* the host rows' room */
    int32_t *slot;       /* host [T K]: the send-order row of (t, i); -1: dropped */
    int32_t *src;        /* host [N]: the token of send-order row s */
    int32_t *grp;        /* host [R]: the received row ([q][j] order) of grouped row r */
    int32_t *ung;        /* host [R]: the grouped row of received row r (grp's inverse) */
    int32_t *pk;         /* host [T K + N + 2 R]: slot, src, grp, ung packed for one upload */
    int64_t cap_R, cap_pk;                     /* grp's and ung's room, pk's */
    const int32_t *islot, *isrc, *igrp, *iung; /* the four where the ops read them: the host
                                                  arrays, or (a device backend) inside ix */
    size_t *ecount;      /* host [E]: the rows this rank sends to each expert */
    size_t *rcount;  /* host [P El]: c[q][j], rows from EP rank q for local expert j (q-major) */
    int64_t *rows;   /* host [El]: n_j, local expert j's rows (grouped: j-major) */
    size_t *sc, *rc; /* host [P]: elements sent to / received from each EP rank (rows H) */
    int32_t *cx;     /* host [2 P El]: the counts' exchange */
    const void *ob;  /* the combine's rows in send order [N, H] (kept for its backward) */
    bool routed, combined; /* a dispatch made; a combine made since */
    int64_t dry_cap; /* a dry run under a capacity factor (the router's C; tpk_moe_forward sets
                        it): every other EP rank taken to send each local expert min(T, C) rows,
                        the most it can (the planned rows a bound); 0: each as this rank routes */
    tpk_buf cnt, xs, xr, xg, orr, obb, y, ds, dr, dg, dxr, dxs, dx, dw; /* backend memory */
    tpk_buf ix, wt; /* backend memory: the indices (pk), the combine's weights (device backends) */
} tpk_moe_dispatcher;

/* A dispatcher of E experts over ctx->ep (P divides E), k routes per token, rows of H. */
static inline tpk_status tpk_moe_dispatcher_init(tpk_ctx *ctx, tpk_moe_dispatcher *d, int64_t H,
                                                 int64_t E, int64_t K) {
    static const char *fn = "tpk_moe_dispatcher_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!d) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dispatcher: NULL");
    memset(d, 0, sizeof *d);
    if (!ctx->ep.vt) return tpk__fail(ctx, TPK_ERR_ARG, fn, "ctx: expected an initialised context");
    int P = ctx->ep.size;
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (E < 1 || E % P)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "experts: expected a multiple of the EP size %d (every EP rank holds "
                         "experts / ep of them), got %lld",
                         P, (long long)E);
    if (K < 1 || K > E)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "top_k: expected 1..experts = 1..%lld, got %lld",
                         (long long)E, (long long)K);
    if (P > 1 && !ctx->ep.vt->alltoallv)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "ctx->ep: the communicator \"%s\" has no all-to-all entry (alltoallv)",
                         ctx->ep.vt->name ? ctx->ep.vt->name : "?");
    d->H = H, d->E = E, d->K = K, d->P = P, d->rank = ctx->ep.rank, d->El = E / P;
    size_t n = (size_t)P;
    d->ecount = (size_t *)tpk__calloc(ctx, (size_t)E, sizeof(size_t));
    d->rcount = (size_t *)tpk__calloc(ctx, (size_t)E, sizeof(size_t));
    d->rows = (int64_t *)tpk__calloc(ctx, (size_t)d->El, sizeof(int64_t));
    d->sc = (size_t *)tpk__calloc(ctx, n, sizeof(size_t));
    d->rc = (size_t *)tpk__calloc(ctx, n, sizeof(size_t));
    d->cx = (int32_t *)tpk__calloc(ctx, 2 * (size_t)E, sizeof(int32_t));
    if (d->ecount && d->rcount && d->rows && d->sc && d->rc && d->cx) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld experts' counts",
                     (long long)E);
}

static inline void tpk_moe_dispatcher_destroy(tpk_ctx *ctx, tpk_moe_dispatcher *d) {
    if (!d) return;
    tpk__free(ctx, d->slot), tpk__free(ctx, d->src), tpk__free(ctx, d->ecount);
    tpk__free(ctx, d->rcount), tpk__free(ctx, d->rows), tpk__free(ctx, d->sc);
    tpk__free(ctx, d->rc), tpk__free(ctx, d->cx);
    tpk__free(ctx, d->grp), tpk__free(ctx, d->ung), tpk__free(ctx, d->pk);
    tpk_buf *b[] = {&d->cnt, &d->xs, &d->xr,  &d->xg,  &d->orr, &d->obb, &d->y,  &d->ds,
                    &d->dr,  &d->dg, &d->dxr, &d->dxs, &d->dx,  &d->dw,  &d->ix, &d->wt};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) tpk__buf_free(ctx, b[i]);
    memset(d, 0, sizeof *d);
}

static inline tpk_status tpk__moe_check(tpk_ctx *ctx, const char *fn, const tpk_moe_dispatcher *d) {
    if (!ctx) return TPK_ERR_ARG;
    if (!d || !d->E)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "dispatcher: expected an initialised dispatcher");
    return TPK_OK;
}
/* Whether the received rows need regrouping ([q][j] -> [j][q]). */
static inline bool tpk__moe_regroup_needed(const tpk_moe_dispatcher *d) {
    return d->P > 1 && d->El > 1;
}
/* The received rows between [q][j] order (qj) and [j][q] order (jq), one gather: to_grouped
 * dst[jq] = src[grp[jq]], else dst[qj] = src[ung[qj]]. */
static inline tpk_status tpk__moe_regroup(tpk_ctx *ctx, const tpk_moe_dispatcher *d, void *dst,
                                          const void *src, bool to_grouped) {
    return tpk_op_gather_rows(ctx, dst, d->H, src, d->H, d->R, to_grouped ? d->igrp : d->iung, d->R,
                              d->H, ctx->dtype);
}
/* the regroup's permutation of the R received rows (grp, ung) and the four index arrays where
 * the ops read them: on a device backend packed (pk) and uploaded in one copy (ix) */
static inline tpk_status tpk__moe_indices(tpk_ctx *ctx, const char *fn, tpk_moe_dispatcher *d) {
    int64_t R = d->R, NK = d->NK, N = d->N, El = d->El;
    if (R > d->cap_R || !d->grp) {
        tpk__free(ctx, d->grp), tpk__free(ctx, d->ung);
        d->grp = (int32_t *)tpk__malloc(ctx, (size_t)(R ? R : 1) * sizeof(int32_t));
        d->ung = (int32_t *)tpk__malloc(ctx, (size_t)(R ? R : 1) * sizeof(int32_t));
        d->cap_R = d->grp && d->ung ? R : 0;
        if (!d->grp || !d->ung)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld rows",
                             (long long)R);
    }
    int32_t *at = d->cx; /* [P El] scratch (the counts' exchange is done): where the rows from
                            EP rank q for expert j start in [q][j] order */
    for (int64_t k = 0, o = 0; k < d->P * El; k++) at[k] = (int32_t)o, o += (int64_t)d->rcount[k];
    for (int64_t j = 0, jq = 0; j < El; j++) /* expert j's rows: EP rank 0's first */
        for (int64_t q = 0; q < d->P; q++) {
            int64_t qj = at[q * El + j], n = (int64_t)d->rcount[q * El + j];
            for (int64_t r = 0; r < n; r++, jq++)
                d->grp[jq] = (int32_t)(qj + r), d->ung[qj + r] = (int32_t)jq;
        }
    if (!ctx->ops->device) { /* the host backend reads the host arrays */
        d->islot = d->slot, d->isrc = d->src, d->igrp = d->grp, d->iung = d->ung;
        return TPK_OK;
    }
    int64_t n = NK + N + 2 * R;
    if (n > d->cap_pk || !d->pk) {
        tpk__free(ctx, d->pk);
        d->pk = (int32_t *)tpk__malloc(ctx, (size_t)(n ? n : 1) * sizeof(int32_t));
        d->cap_pk = d->pk ? n : 0;
        if (!d->pk)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld indices",
                             (long long)n);
    }
    size_t es = sizeof(int32_t);
    memcpy(d->pk, d->slot, (size_t)NK * es), memcpy(d->pk + NK, d->src, (size_t)N * es);
    memcpy(d->pk + NK + N, d->grp, (size_t)R * es);
    memcpy(d->pk + NK + N + R, d->ung, (size_t)R * es);
    TPK_TRY(tpk__buf_reserve(ctx, &d->ix, (size_t)(n ? n : 1) * es));
    const int32_t *b = (const int32_t *)d->ix.p;
    d->islot = b, d->isrc = b + NK, d->igrp = b + NK + N, d->iung = b + NK + N + R;
    return tpk_op_memcpy(ctx, d->ix.p, d->pk, (size_t)n * es, TPK_H2D);
}
/* the combine's weights (host [T K]) where the ops read them: uploaded on a device backend */
static inline tpk_status tpk__moe_weights(tpk_ctx *ctx, tpk_moe_dispatcher *d, const float *weight,
                                          const float **out) {
    *out = weight;
    if (!ctx->ops->device || !d->NK) return TPK_OK;
    TPK_TRY(tpk__buf_reserve(ctx, &d->wt, (size_t)d->NK * sizeof(float)));
    *out = (const float *)d->wt.p;
    return tpk_op_memcpy(ctx, d->wt.p, weight, (size_t)d->NK * sizeof(float), TPK_H2D);
}
/* The rows over ctx->ep: send (sc, in send order) -> recv (rc, [q][j] order), or back (`back`:
 * recv order -> send order, the counts swapped). */
static inline tpk_status tpk__moe_exchange(tpk_ctx *ctx, const tpk_moe_dispatcher *d,
                                           const void *send, void *recv, bool back) {
    return tpk_alltoallv(ctx, &ctx->ep, send, back ? d->rc : d->sc, recv, back ? d->sc : d->rc,
                         ctx->dtype);
}

/* The routing of T tokens (idx host [T K], each an expert 0..E-1 or -1 for a row dropped, a
 * token's k distinct; checked before any collective): the send order, the counts sent, and
 * (all-to-all of the counts) those received. Collective over ctx->ep. */
static inline tpk_status tpk__moe_plan(tpk_ctx *ctx, const char *fn, tpk_moe_dispatcher *d,
                                       int64_t T, const int32_t *idx) {
    int64_t K = d->K, E = d->E, El = d->El, N = T * K;
    if (N > INT32_MAX)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "x: %lld tokens x top_k %lld rows, expected < 2^31", (long long)T,
                         (long long)K);
    for (int64_t r = 0; r < N; r++) {
        int32_t e = idx[r];
        bool dup = false;
        for (int64_t i = r - r % K; e >= 0 && i < r; i++) dup = dup || idx[i] == e;
        if (e < -1 || e >= E || dup)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "idx[%lld]: expected an expert 0..%lld that token %lld has not "
                             "chosen before (or -1: dropped), got %d",
                             (long long)r, (long long)(E - 1), (long long)(r / K), (int)e);
    }
    if (N > d->cap_N || !d->slot) {
        tpk__free(ctx, d->slot), tpk__free(ctx, d->src);
        d->slot = (int32_t *)tpk__malloc(ctx, (size_t)(N ? N : 1) * sizeof(int32_t));
        d->src = (int32_t *)tpk__malloc(ctx, (size_t)(N ? N : 1) * sizeof(int32_t));
        d->cap_N = d->slot && d->src ? N : 0;
        if (!d->slot || !d->src)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld rows",
                             (long long)N);
    }
    /* send order: expert-major, token order within an expert (a counting sort) */
    for (int64_t e = 0; e < E; e++) d->ecount[e] = 0;
    int64_t kept = 0;
    for (int64_t r = 0; r < N; r++)
        if (idx[r] >= 0) d->ecount[idx[r]]++, kept++;
    int32_t *start = d->cx; /* [E] scratch: each expert's next send-order row */
    for (int64_t e = 0, o = 0; e < E; e++) start[e] = (int32_t)o, o += (int64_t)d->ecount[e];
    for (int64_t r = 0; r < N; r++) {
        int32_t pos = idx[r] >= 0 ? start[idx[r]]++ : -1;
        d->slot[r] = pos;
        if (pos >= 0) d->src[pos] = (int32_t)(r / K);
    }
    /* the counts: El per peer, over the EP group */
    size_t *per = d->sc, es = sizeof(int32_t);
    for (int64_t e = 0; e < E; e++) d->cx[e] = (int32_t)d->ecount[e];
    if (d->P > 1) {
        for (int q = 0; q < d->P; q++) per[q] = (size_t)El;
        bool dev = ctx->ops->device;
        TPK_TRY(tpk__buf_reserve(ctx, &d->cnt, 2 * (size_t)E * es));
        int32_t *b = dev ? (int32_t *)d->cnt.p : d->cx;
        if (dev) TPK_TRY(tpk_op_memcpy(ctx, b, d->cx, (size_t)E * es, TPK_H2D));
        TPK_TRY(tpk_alltoallv(ctx, &ctx->ep, b, per, b + E, per, TPK_I32));
        if (dev) TPK_TRY(tpk_op_memcpy(ctx, d->cx + E, b + E, (size_t)E * es, TPK_D2H));
        for (int q = 0; ctx->ops->dry_run && q < d->P; q++) /* a dry run (tpk/plan/count.h): */
            for (int64_t j = 0; j < El; j++) /* every peer routes as this rank (balanced), or */
                d->cx[E + q * El + j] = /* under a capacity, fills each expert's (a bound) */
                    d->dry_cap > 0 && q != d->rank ? (int32_t)(d->dry_cap < T ? d->dry_cap : T)
                                                   : d->cx[d->rank * El + j];
    } else {
        for (int64_t e = 0; e < E; e++) d->cx[E + e] = d->cx[e];
    }
    d->T = T, d->N = kept, d->NK = N, d->R = 0;
    for (int64_t j = 0; j < El; j++) d->rows[j] = 0;
    for (int q = 0; q < d->P; q++) {
        size_t sent = 0, got = 0;
        for (int64_t j = 0; j < El; j++) {
            int32_t v = d->cx[E + q * El + j];
            if (v < 0)
                return tpk__fail(ctx, TPK_ERR_COMM, fn, "EP rank %d sent a count of %d", q, v);
            d->rcount[q * El + j] = (size_t)v, d->rows[j] += v, got += (size_t)v;
            sent += d->ecount[q * El + j];
        }
        d->sc[q] = sent * (size_t)d->H, d->rc[q] = got * (size_t)d->H, d->R += (int64_t)got;
    }
    if (d->R > INT32_MAX)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "the EP group sent %lld rows, expected < 2^31",
                         (long long)d->R);
    return tpk__moe_indices(ctx, fn, d);
}

/* Dispatch x R [T, H] (ctx->dtype) by idx (host [T K]: token t's experts e_ti): *xg [R, H] (R over
 * TP), the rows every EP rank sends to this rank's experts, grouped by local expert — expert j's
 * d->rows[j] rows consecutive, from EP rank 0's tokens first, each rank's in token order.
 * Collective over ctx->ep (an all-to-all of the counts and one of the rows). The caller keeps x
 * alive until tpk_moe_dispatch_backward. */
static inline tpk_status tpk_moe_dispatch(tpk_ctx *ctx, tpk_moe_dispatcher *d, tpk_tensor x,
                                          const int32_t *idx, tpk_tensor *xg) {
    static const char *fn = "tpk_moe_dispatch";
    TPK_TRY(tpk__moe_check(ctx, fn, d));
    if (!xg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "xg: NULL");
    int64_t want[2] = {-1, d->H};
    TPK_TRY(tpk__check(ctx, fn, "x", &x, TPK_R, ctx->dtype, 2, want));
    if (x.gshape[0] && !idx)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "idx: expected %lld experts, got NULL",
                         (long long)(x.gshape[0] * d->K));
    d->routed = d->combined = false;
    TPK_TRY(tpk__moe_plan(ctx, fn, d, x.gshape[0], idx));
    size_t es = tpk_dtype_size(ctx->dtype), H = (size_t)d->H;
    TPK_TRY(tpk__buf_reserve(ctx, &d->xs, (size_t)d->N * H * es));
    TPK_TRY(tpk_op_gather_rows(ctx, d->xs.p, d->H, x.data, d->H, d->T, d->isrc, d->N, d->H,
                               ctx->dtype)); /* xs[s] = x[src[s]] */
    const void *cur = d->xs.p;
    if (d->P > 1) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->xr, (size_t)d->R * H * es));
        TPK_TRY(tpk__moe_exchange(ctx, d, cur, d->xr.p, false));
        cur = d->xr.p;
    }
    if (tpk__moe_regroup_needed(d)) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->xg, (size_t)d->R * H * es));
        TPK_TRY(tpk__moe_regroup(ctx, d, d->xg.p, cur, true));
        cur = d->xg.p;
    }
    *xg = tpk_tensor_2d((void *)cur, ctx->dtype, d->R, d->H, TPK_R);
    d->routed = true;
    return TPK_OK;
}

/* Combine the experts' outputs o [R, H] (xg's rows and order) back to the tokens: y R [T, H],
 * y[t] = sum_i weight[t K + i] o-row of (t, i) (weight host [T K]). Collective over ctx->ep. The
 * caller keeps o alive until tpk_moe_combine_backward (at P = 1 its rows are read there). */
static inline tpk_status tpk_moe_combine(tpk_ctx *ctx, tpk_moe_dispatcher *d, tpk_tensor o,
                                         const float *weight, tpk_tensor *y) {
    static const char *fn = "tpk_moe_combine";
    TPK_TRY(tpk__moe_check(ctx, fn, d));
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    if (!d->routed) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dispatcher: combine before dispatch");
    int64_t want[2] = {d->R, d->H};
    TPK_TRY(tpk__check(ctx, fn, "o", &o, TPK_R, ctx->dtype, 2, want));
    if (d->NK && !weight)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "weight: expected %lld weights, got NULL",
                         (long long)d->NK);
    size_t es = tpk_dtype_size(ctx->dtype), H = (size_t)d->H;
    const void *cur = o.data;
    if (tpk__moe_regroup_needed(d)) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->orr, (size_t)d->R * H * es));
        TPK_TRY(tpk__moe_regroup(ctx, d, d->orr.p, cur, false));
        cur = d->orr.p;
    }
    if (d->P > 1) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->obb, (size_t)d->N * H * es));
        TPK_TRY(tpk__moe_exchange(ctx, d, cur, d->obb.p, true));
        cur = d->obb.p;
    }
    d->ob = cur;
    *y = tpk_tensor_2d(NULL, ctx->dtype, d->T, d->H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &d->y, y));
    const float *w;
    TPK_TRY(tpk__moe_weights(ctx, d, weight, &w));
    /* y[t] = sum_i w_ti ob[s(t, i)], i ascending, the kept rows (0 when none is) */
    TPK_TRY(
        tpk_op_moe_combine_fwd(ctx, y->data, cur, d->N, d->islot, w, d->T, d->K, d->H, ctx->dtype));
    d->combined = true;
    return TPK_OK;
}

/* From dy R [T, H]: dweight (host [T K], written) = dy[t] . o-row of (t, i), and *dog [R, H] (xg's
 * rows and order) = the gradient of the experts' outputs. Collective over ctx->ep. */
static inline tpk_status tpk_moe_combine_backward(tpk_ctx *ctx, tpk_moe_dispatcher *d,
                                                  tpk_tensor dy, const float *weight,
                                                  float *dweight, tpk_tensor *dog) {
    static const char *fn = "tpk_moe_combine_backward";
    TPK_TRY(tpk__moe_check(ctx, fn, d));
    if (!dog) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dog: NULL");
    if (!d->combined)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "dispatcher: backward before a combine");
    int64_t want[2] = {d->T, d->H};
    TPK_TRY(tpk__check(ctx, fn, "dy", &dy, TPK_R, ctx->dtype, 2, want));
    if (d->NK && (!weight || !dweight))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: expected %lld values, got NULL",
                         weight ? "dweight" : "weight", (long long)d->NK);
    size_t es = tpk_dtype_size(ctx->dtype), H = (size_t)d->H, N = (size_t)d->NK;
    bool dev = ctx->ops->device;
    TPK_TRY(tpk__buf_reserve(ctx, &d->ds, (size_t)d->N * H * es));
    if (dev) TPK_TRY(tpk__buf_reserve(ctx, &d->dw, N * sizeof(float)));
    float *dwb = dev ? (float *)d->dw.p : dweight; /* the host backend writes dweight itself */
    const float *w;
    TPK_TRY(tpk__moe_weights(ctx, d, weight, &w));
    /* dw_ti = dy[t] . ob[s(t, i)] (0 for a dropped row), dob[s(t, i)] = w_ti dy[t] */
    TPK_TRY(tpk_op_moe_combine_bwd(ctx, dwb, d->ds.p, dy.data, d->ob, d->N, d->islot, w, d->T, d->K,
                                   d->H, ctx->dtype));
    if (dev) TPK_TRY(tpk_op_memcpy(ctx, dweight, dwb, N * sizeof(float), TPK_D2H));
    const void *cur = d->ds.p;
    if (d->P > 1) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->dr, (size_t)d->R * H * es));
        TPK_TRY(tpk__moe_exchange(ctx, d, cur, d->dr.p, false));
        cur = d->dr.p;
    }
    if (tpk__moe_regroup_needed(d)) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->dg, (size_t)d->R * H * es));
        TPK_TRY(tpk__moe_regroup(ctx, d, d->dg.p, cur, true));
        cur = d->dg.p;
    }
    *dog = tpk_tensor_2d((void *)cur, ctx->dtype, d->R, d->H, TPK_R);
    return TPK_OK;
}

/* From dxg [R, H] (xg's rows and order: the gradient of the dispatched rows): dx R [T, H] (in the
 * dispatcher's buffer), dx[t] = the sum of the rows of (t, i) over the kept i, in send order (by
 * expert: scatter_add_rows' index order; 0 when none is kept). Collective over ctx->ep. */
static inline tpk_status tpk_moe_dispatch_backward(tpk_ctx *ctx, tpk_moe_dispatcher *d,
                                                   tpk_tensor dxg, tpk_tensor *dx) {
    static const char *fn = "tpk_moe_dispatch_backward";
    TPK_TRY(tpk__moe_check(ctx, fn, d));
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    if (!d->routed) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dispatcher: backward before dispatch");
    int64_t want[2] = {d->R, d->H};
    TPK_TRY(tpk__check(ctx, fn, "dxg", &dxg, TPK_R, ctx->dtype, 2, want));
    size_t es = tpk_dtype_size(ctx->dtype), H = (size_t)d->H;
    const void *cur = dxg.data;
    if (tpk__moe_regroup_needed(d)) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->dxr, (size_t)d->R * H * es));
        TPK_TRY(tpk__moe_regroup(ctx, d, d->dxr.p, cur, false));
        cur = d->dxr.p;
    }
    if (d->P > 1) {
        TPK_TRY(tpk__buf_reserve(ctx, &d->dxs, (size_t)d->N * H * es));
        TPK_TRY(tpk__moe_exchange(ctx, d, cur, d->dxs.p, true));
        cur = d->dxs.p;
    }
    *dx = tpk_tensor_2d(NULL, ctx->dtype, d->T, d->H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &d->dx, dx));
    /* dx[t] = the rows s with src[s] = t (its kept rows) in send order; 0 when none is kept */
    return tpk_op_scatter_add_rows(ctx, dx->data, d->H, d->T, cur, d->H, d->isrc, d->N, d->H,
                                   ctx->dtype, false);
}

/* ---- the sparse MoE block: router, dispatcher, experts ------------------------------------- */

typedef struct tpk_moe_desc {
    const char *name;    /* parameters "<name>.gate.weight", "<name>.experts.<e>.w1.weight", ...
                            (Mixtral: "model.layers.<i>.block_sparse_moe"); default "moe<N>" */
    int experts;         /* E: a multiple of the EP size (Mixtral's num_local_experts); required */
    int top_k;           /* k, 1..E; default 2 (num_experts_per_tok) */
    int64_t hidden;      /* F, each expert's intermediate size (intermediate_size); required */
    bool renormalize;    /* the top-k weights renormalised (Mixtral: true) */
    float aux_coef;      /* the load-balancing loss's coefficient (router_aux_loss_coef) */
    float init_std;      /* gate, w1, w3: N(0, std²); default 0.02 */
    float proj_init_std; /* w2; default init_std */
    float z_coef;        /* the router's z-loss coefficient (tpk_router_desc.z_coef); 0: none */
    float capacity_factor; /* tpk_router_desc.capacity_factor: 0 dropless; c > 0 each expert
                              takes ceil(T k / E c) of a rank's rows, the lowest-weighted dropped */
    int64_t shared_hidden; /* F_s > 0: a shared expert of intermediate size F_s (Qwen2-MoE's
                              shared_expert_intermediate_size) beside the routed ones; 0: none */
    bool proj_names;       /* the experts' weights "<name>.experts.<e>.gate_proj.weight",
                              ".up_proj", ".down_proj" (Qwen2-MoE's) for w1, w3, w2 (Mixtral's) */
    bool sequence_parallel; /* x and y S(0) [T, H] over TP (the tokens split, unevenly allowed):
                               x all-gathered at the entry, y reduce-scattered at the exit */
} tpk_moe_desc;

typedef struct tpk_moe {
    char name[80];
    int64_t H, F, Fl;  /* hidden size, intermediate size, this TP rank's share of F */
    int64_t E, El, e0; /* experts, local experts, the first local expert */
    tpk_router router; /* "<name>.gate" */
    tpk_moe_dispatcher disp;
    int *w1, *w2, *w3; /* [El] the local experts' parameter ids */
    void **wp;         /* host [El]: one matrix of each local expert, for one gemm_grouped call */
    tpk_tensor xg;     /* the dispatched rows of the last forward [R, H] */
    tpk_buf gu, h, og, dh, dgu, dxg;
    float *dw; /* host [T K]: the routing weights' gradient */
    int64_t dw_cap;
    /* the shared expert (shared_hidden F_s > 0): sg, su, sd its gate, up, down ids, sw its gate's
       [1, H]; Fsl this TP rank's share of F_s */
    int64_t Fs, Fsl;
    int sg, su, sd, sw;
    float *sig;  /* host [T]: sigmoid(x_t . w_gate_shared) */
    float *sdot; /* host [T]: dy_t . so_t (backward) */
    int64_t s_cap;
    tpk_buf sgu, sh, so, sy, sz, sdo, sdh, sdgu, sdx, sdl; /* backend */
    const double *aux_dp; /* set by a model pooling the aux loss over its layers (tpk/models/
                             lm.h): host [E], the gradient on every p_te the backward gives the
                             router (tpk_router_backward_pooled) in place of its own aux's */
    const double *aux_g;  /* with aux_dp: the loss's gradient with respect to the pooled aux,
                             which the router's z-loss (a term of it) takes */
    bool sp;              /* sequence parallelism (desc.sequence_parallel) */
    tpk_buf xa, ya, dya, dxa, red; /* SP: x gathered (the router's and the shared expert's input
                                      until the backward), y's S(0) rows, dy gathered, dx's S(0)
                                      rows, the backward's f32 sums over TP (dw, the shared dots) */
} tpk_moe;

static inline tpk_status tpk_moe_init(tpk_ctx *ctx, tpk_moe *m, int64_t H,
                                      const tpk_moe_desc *desc) {
    static const char *fn = "tpk_moe_init";
    tpk_moe_desc d;
    TPK__INIT_LAYER(ctx, fn, m, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (d.hidden < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "desc->hidden: expected >= 1 (each expert's intermediate size F), got "
                         "%lld",
                         (long long)d.hidden);
    int P = ctx->ep.vt ? ctx->ep.size : 1;
    if (d.experts < 1 || d.experts % P)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->experts: expected a multiple of the EP size %d (every EP rank holds "
            "experts / ep of them), got %d",
            P, d.experts);
    int k = d.top_k ? d.top_k : 2;
    if (k < 1 || k > d.experts)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->top_k: expected 1..experts = 1..%d (0: 2), got %d", d.experts,
                         d.top_k);
    if (d.shared_hidden < 0)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "desc->shared_hidden: expected >= 0 (the shared expert's intermediate "
                         "size; 0: none), got %lld",
                         (long long)d.shared_hidden);
    if (!(d.init_std >= 0) || !(d.proj_init_std >= 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->%s: expected >= 0, got %g",
                         d.init_std >= 0 ? "proj_init_std" : "init_std",
                         (double)(d.init_std >= 0 ? d.proj_init_std : d.init_std));
    TPK_TRY(tpk__layer_name(ctx, fn, m->name, sizeof m->name, d.name, "moe"));
    m->H = H, m->F = d.hidden, m->E = d.experts, m->El = d.experts / P;
    m->sp = d.sequence_parallel;
    m->e0 = (int64_t)ctx->ep.rank * m->El;
    m->Fl = tpk_tp_shard_size(ctx, m->F, TPK_S(0), ctx->tp.rank);
    char pn[160];
    snprintf(pn, sizeof pn, "%s.gate", m->name);
    tpk_router_desc rd;
    memset(&rd, 0, sizeof rd);
    rd.name = pn, rd.experts = d.experts, rd.top_k = k, rd.renormalize = d.renormalize;
    rd.aux_coef = d.aux_coef, rd.init_std = d.init_std, rd.z_coef = d.z_coef;
    rd.capacity_factor = d.capacity_factor;
    TPK_TRY(tpk_router_init(ctx, &m->router, H, &rd));
    TPK_TRY(tpk_moe_dispatcher_init(ctx, &m->disp, H, m->E, k));
    m->w1 = (int *)tpk__calloc(ctx, (size_t)m->El, sizeof(int));
    m->w2 = (int *)tpk__calloc(ctx, (size_t)m->El, sizeof(int));
    m->w3 = (int *)tpk__calloc(ctx, (size_t)m->El, sizeof(int));
    m->wp = (void **)tpk__calloc(ctx, (size_t)m->El, sizeof(void *));
    if (!m->w1 || !m->w2 || !m->w3 || !m->wp)
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld experts",
                         (long long)m->El);
    float std = d.init_std > 0 ? d.init_std : 0.02f,
          pstd = d.proj_init_std > 0 ? d.proj_init_std : std;
    for (int64_t j = 0; j < m->El; j++) { /* this EP rank's experts, by their global index */
        long long e = (long long)(m->e0 + j);
        snprintf(pn, sizeof pn, "%s.experts.%lld.%s.weight", m->name, e,
                 d.proj_names ? "gate_proj" : "w1");
        TPK_TRY(
            tpk__param_add(ctx, pn, 2, m->F, H, TPK_S(0), TPK_INIT_NORMAL, std, true, &m->w1[j]));
        snprintf(pn, sizeof pn, "%s.experts.%lld.%s.weight", m->name, e,
                 d.proj_names ? "down_proj" : "w2");
        TPK_TRY(
            tpk__param_add(ctx, pn, 2, H, m->F, TPK_S(1), TPK_INIT_NORMAL, pstd, true, &m->w2[j]));
        snprintf(pn, sizeof pn, "%s.experts.%lld.%s.weight", m->name, e,
                 d.proj_names ? "up_proj" : "w3");
        TPK_TRY(
            tpk__param_add(ctx, pn, 2, m->F, H, TPK_S(0), TPK_INIT_NORMAL, std, true, &m->w3[j]));
        ctx->params.list[m->w1[j]].expert = ctx->params.list[m->w2[j]].expert =
            ctx->params.list[m->w3[j]].expert = true;
    }
    m->sg = m->su = m->sd = m->sw = -1;
    if (!d.shared_hidden) return TPK_OK;
    /* the shared expert: a SwiGLU MLP split over TP like the dense one, on every EP rank */
    m->Fs = d.shared_hidden, m->Fsl = tpk_tp_shard_size(ctx, m->Fs, TPK_S(0), ctx->tp.rank);
    snprintf(pn, sizeof pn, "%s.shared_expert.gate_proj.weight", m->name);
    TPK_TRY(tpk__param_add(ctx, pn, 2, m->Fs, H, TPK_S(0), TPK_INIT_NORMAL, std, true, &m->sg));
    snprintf(pn, sizeof pn, "%s.shared_expert.up_proj.weight", m->name);
    TPK_TRY(tpk__param_add(ctx, pn, 2, m->Fs, H, TPK_S(0), TPK_INIT_NORMAL, std, true, &m->su));
    snprintf(pn, sizeof pn, "%s.shared_expert.down_proj.weight", m->name);
    TPK_TRY(tpk__param_add(ctx, pn, 2, H, m->Fs, TPK_S(1), TPK_INIT_NORMAL, pstd, true, &m->sd));
    snprintf(pn, sizeof pn, "%s.shared_expert_gate.weight", m->name);
    return tpk__param_add(ctx, pn, 2, 1, H, TPK_R, TPK_INIT_NORMAL, std, true, &m->sw);
}

static inline void tpk_moe_destroy(tpk_ctx *ctx, tpk_moe *m) {
    if (!m) return;
    tpk_router_destroy(ctx, &m->router);
    tpk_moe_dispatcher_destroy(ctx, &m->disp);
    tpk__free(ctx, m->w1), tpk__free(ctx, m->w2), tpk__free(ctx, m->w3), tpk__free(ctx, m->dw);
    tpk__free(ctx, m->wp);
    tpk__free(ctx, m->sig), tpk__free(ctx, m->sdot);
    tpk_buf *b[] = {&m->gu,  &m->h,  &m->og,  &m->dh,  &m->dgu, &m->dxg,  &m->sgu,
                    &m->sh,  &m->so, &m->sy,  &m->sz,  &m->sdo, &m->sdh,  &m->sdgu,
                    &m->sdx, &m->sdl, &m->xa, &m->ya, &m->dya, &m->dxa, &m->red};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) tpk__buf_free(ctx, b[i]);
    memset(m, 0, sizeof *m);
}

/* The shared expert's forward on x R [T, H]: y[t] += sigmoid(x_t . ws) so_t, so = (silu(x Wgᵀ) ∘
 * x Wuᵀ) Wdᵀ (P over TP -> all-reduce; under SP left P, y being P until its reduce-scatter). */
static inline tpk_status tpk__moe_shared_forward(tpk_ctx *ctx, const char *fn, tpk_moe *m,
                                                 tpk_tensor x, tpk_tensor *y) {
    int64_t T = m->router.T, H = m->H, Fl = m->Fsl;
    size_t es = tpk_dtype_size(ctx->dtype), n = (size_t)(T > 0 ? T : 1);
    if (!m->sig || T > m->s_cap) {
        tpk__free(ctx, m->sig), tpk__free(ctx, m->sdot);
        m->sig = (float *)tpk__malloc(ctx, n * sizeof(float));
        m->sdot = (float *)tpk__malloc(ctx, n * sizeof(float));
        m->s_cap = m->sig && m->sdot ? T : 0;
        if (!m->sig || !m->sdot)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld tokens",
                             (long long)T);
    }
    if (!T) return TPK_OK;
    TPK_TRY(tpk__buf_reserve(ctx, &m->sgu, (size_t)(T * 2 * Fl) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->sh, (size_t)(T * Fl) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->so, (size_t)(T * H) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->sz, n * sizeof(float)));
    char *gu = (char *)m->sgu.p, *so = (char *)m->so.p;
    if (Fl) {
        TPK_TRY(tpk_op_gemm(ctx, false, true, T, Fl, H, 1.f, x.data, H, tpk__param_w(ctx, m->sg), H,
                            0.f, gu, 2 * Fl, ctx->dtype)); /* gate = x Wgᵀ */
        TPK_TRY(tpk_op_gemm(ctx, false, true, T, Fl, H, 1.f, x.data, H, tpk__param_w(ctx, m->su), H,
                            0.f, gu + (size_t)Fl * es, 2 * Fl, ctx->dtype)); /* up = x Wuᵀ */
        TPK_TRY(tpk_op_swiglu_fwd(ctx, m->sh.p, gu, T, Fl, ctx->dtype));
        TPK_TRY(tpk_op_gemm(ctx, false, true, T, H, Fl, 1.f, m->sh.p, Fl, tpk__param_w(ctx, m->sd),
                            Fl, 0.f, so, H, ctx->dtype)); /* h Wdᵀ */
    } else {
        TPK_TRY(tpk_op_fill(ctx, so, ctx->dtype, (size_t)(T * H), 0.f));
    }
    if (ctx->tp.size > 1 && !m->sp)
        TPK_TRY(tpk_allreduce(ctx, &ctx->tp, so, so, (size_t)(T * H), ctx->dtype, TPK_SUM));
    TPK_TRY(tpk_op_gemm_acc(ctx, false, true, T, 1, H, 1.f, x.data, H, tpk__param_w(ctx, m->sw), H,
                            0.f, (float *)m->sz.p, 1, ctx->dtype)); /* x . ws, f32 */
    TPK_TRY(tpk_op_memcpy(ctx, m->sig, m->sz.p, (size_t)T * sizeof(float),
                          ctx->ops->device ? TPK_D2H : TPK_H2H));
    for (int64_t t = 0; t < T; t++) m->sig[t] = (float)(1 / (1 + exp(-(double)m->sig[t])));
    for (int64_t t = 0; t < T; t++) /* y[t] += sigmoid_t so[t] */
        TPK_TRY(tpk_op_axpby(ctx, (char *)y->data + (size_t)(t * H) * es, m->sig[t],
                             so + (size_t)(t * H) * es, 1.f, ctx->dtype, (size_t)H));
    return TPK_OK;
}

/* dots[t] = dy[t] . so[t] (backend memory, f32 [T]): the shared gate's dl before its sigmoid'
 * (under SP so is P over TP, and so the dots, summed over TP by the caller). */
static inline tpk_status tpk__moe_shared_dots(tpk_ctx *ctx, tpk_moe *m, tpk_tensor dy,
                                              float *dots) {
    int64_t T = m->router.T, H = m->H;
    size_t es = tpk_dtype_size(ctx->dtype);
    const char *so = (const char *)m->so.p;
    for (int64_t t = 0; t < T; t++)
        TPK_TRY(tpk_op_gemm_acc(ctx, false, true, 1, 1, H, 1.f,
                                (const char *)dy.data + (size_t)(t * H) * es, H,
                                so + (size_t)(t * H) * es, H, 0.f, dots + t, 1, ctx->dtype));
    return TPK_OK;
}

/* The shared expert's backward from dy R [T, H] and its dots (tpk__moe_shared_dots, whole): its
 * dx in m->sdx (R; under SP P, its R term dl ws on TP rank 0 alone), its weights' gradients:
 * dso = s dy, dl = (dy . so) s (1 - s), dx = dl ws + (dgate Wg + dup Wu) (P -> all-reduce). */
static inline tpk_status tpk__moe_shared_backward(tpk_ctx *ctx, tpk_moe *m, tpk_tensor dy,
                                                  const float *dots) {
    int64_t T = m->router.T, H = m->H, Fl = m->Fsl;
    size_t es = tpk_dtype_size(ctx->dtype);
    if (!T) return TPK_OK;
    const char *x = (const char *)m->router.x.data;
    TPK_TRY(tpk__buf_reserve(ctx, &m->sdo, (size_t)(T * H) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->sdx, (size_t)(T * H) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->sdl, (size_t)T * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->sdh, (size_t)(T * Fl) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->sdgu, (size_t)(T * 2 * Fl) * es));
    float *sz = (float *)m->sz.p;
    char *sdo = (char *)m->sdo.p, *sdx = (char *)m->sdx.p, *dgu = (char *)m->sdgu.p;
    for (int64_t t = 0; t < T; t++) /* dso[t] = s_t dy[t] */
        TPK_TRY(tpk_op_axpby(ctx, sdo + (size_t)(t * H) * es, m->sig[t],
                             (const char *)dy.data + (size_t)(t * H) * es, 0.f, ctx->dtype,
                             (size_t)H));
    TPK_TRY(tpk_op_memcpy(ctx, m->sdot, dots, (size_t)T * sizeof(float),
                          ctx->ops->device ? TPK_D2H : TPK_H2H));
    for (int64_t t = 0; t < T; t++) /* d logit = (dy . so) s (1 - s) */
        m->sdot[t] = (float)((double)m->sdot[t] * m->sig[t] * (1 - (double)m->sig[t]));
    TPK_TRY(tpk_op_memcpy(ctx, sz, m->sdot, (size_t)T * sizeof(float),
                          ctx->ops->device ? TPK_H2D : TPK_H2H));
    TPK_TRY(tpk_op_cast(ctx, m->sdl.p, ctx->dtype, sz, TPK_F32, (size_t)T));
    if (Fl) {
        TPK_TRY(tpk_op_gemm(ctx, false, false, T, Fl, H, 1.f, sdo, H, tpk__param_w(ctx, m->sd), Fl,
                            0.f, m->sdh.p, Fl, ctx->dtype)); /* dh = dso Wd */
        TPK_TRY(tpk__grad_gemm(ctx, m->sd, true, false, H, Fl, T, sdo, H, m->sh.p, Fl));
        TPK_TRY(tpk_op_swiglu_bwd(ctx, dgu, m->sgu.p, m->sdh.p, T, Fl, ctx->dtype));
        const char *du = dgu + (size_t)Fl * es;
        TPK_TRY(tpk__grad_gemm(ctx, m->sg, true, false, Fl, H, T, dgu, 2 * Fl, x, H));
        TPK_TRY(tpk__grad_gemm(ctx, m->su, true, false, Fl, H, T, du, 2 * Fl, x, H));
        TPK_TRY(tpk_op_gemm(ctx, false, false, T, H, Fl, 1.f, dgu, 2 * Fl, tpk__param_w(ctx, m->sg),
                            H, 0.f, sdx, H, ctx->dtype));
        TPK_TRY(tpk_op_gemm(ctx, false, false, T, H, Fl, 1.f, du, 2 * Fl, tpk__param_w(ctx, m->su),
                            H, 1.f, sdx, H, ctx->dtype));
    } else {
        TPK_TRY(tpk_op_fill(ctx, sdx, ctx->dtype, (size_t)(T * H), 0.f));
    }
    if (ctx->tp.size > 1 && !m->sp)
        TPK_TRY(tpk_allreduce(ctx, &ctx->tp, sdx, sdx, (size_t)(T * H), ctx->dtype, TPK_SUM));
    if (!m->sp || ctx->tp.rank == 0) /* + dl ws (under SP once over TP: sdx is P) */
        TPK_TRY(tpk_op_gemm(ctx, false, false, T, H, 1, 1.f, m->sdl.p, 1,
                            tpk__param_w(ctx, m->sw), H, 1.f, sdx, H, ctx->dtype));
    return tpk__grad_gemm(ctx, m->sw, true, false, 1, H, T, m->sdl.p, 1, x, H); /* dws += dlᵀ x */
}

/* The local experts' matrices of ids (w1, w2 or w3) for gemm_grouped: their weights in the
 * context's dtype, or (grad) their f32 gradients; m->wp, filled afresh for each call. */
static inline void *const *tpk__moe_mats(tpk_ctx *ctx, tpk_moe *m, const int *ids, bool grad) {
    for (int64_t j = 0; j < m->El; j++)
        m->wp[j] = grad ? (void *)tpk_param_grad(ctx, ids[j]) : (void *)tpk__param_w(ctx, ids[j]);
    return m->wp;
}

/* y = the MoE block of x R [T, H] (ctx->dtype): y R [T, H]; m->router.aux the auxiliary loss
 * (this rank's tokens). Under sequence parallelism (desc.sequence_parallel) x and y are S(0)
 * [T, H]: x all-gathered over TP first (every TP rank then routes the same T tokens, as without
 * SP), the experts' outputs left P over TP (no all-reduce), combined (linear) into y P and y
 * reduce-scattered to S(0). Collective over ctx->ep (and ctx->tp at t > 1). The caller keeps x
 * alive until the backward (under SP the gathered copy is the layer's own). */
static inline tpk_status tpk_moe_forward(tpk_ctx *ctx, tpk_moe *m, tpk_tensor x, tpk_tensor *y) {
    static const char *fn = "tpk_moe_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised MoE");
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    tpk_tensor xs = x; /* SP: x's own rows, S(0); x the gathered tokens, R */
    if (m->sp) {
        int64_t want[2] = {-1, m->H};
        TPK_TRY(tpk__check(ctx, fn, "x", &xs, TPK_S(0), ctx->dtype, 2, want));
        x = tpk_tensor_2d(NULL, ctx->dtype, xs.gshape[0], m->H, TPK_R);
        TPK_TRY(tpk__buf_view(ctx, &m->xa, &x));
        TPK_TRY(tpk_region_forward(ctx, TPK_REGION_SP_GATHER, &xs, &x)); /* all-gather tokens */
        x = tpk__rows_of(x, &xs);
    }
    TPK_TRY(tpk_router_forward(ctx, &m->router, x)); /* checks x: R [T, H] */
    const int32_t *route = m->router.d.capacity_factor > 0 ? m->router.sent : m->router.idx;
    m->disp.dry_cap = m->router.capacity; /* (a dry run's bound; 0 dropless) */
    TPK_TRY(tpk_moe_dispatch(ctx, &m->disp, x, route, &m->xg));
    int64_t R = m->disp.R, H = m->H, Fl = m->Fl;
    size_t es = tpk_dtype_size(ctx->dtype);
    tpk_tensor og = tpk_tensor_2d(NULL, ctx->dtype, R, H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &m->og, &og));
    TPK_TRY(tpk__buf_reserve(ctx, &m->gu, (size_t)(R * 2 * Fl) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->h, (size_t)(R * Fl) * es));
    if (!Fl && R) TPK_TRY(tpk_op_fill(ctx, og.data, ctx->dtype, (size_t)(R * H), 0.f));
    const int64_t El = m->El, *rows = m->disp.rows; /* local expert j: rows[j] of xg, in order */
    tpk_dtype dt = ctx->dtype;
    char *gu = (char *)m->gu.p, *h = (char *)m->h.p;
    if (Fl) { /* one grouped GEMM over the local experts each: gate = x W1ᵀ, up = x W3ᵀ */
        TPK_TRY(tpk_op_gemm_grouped(ctx, false, true, El, rows, Fl, H, 1.f, m->xg.data, H,
                                    tpk__moe_mats(ctx, m, m->w1, false), H, dt, 0.f, gu, 2 * Fl,
                                    dt));
        TPK_TRY(tpk_op_gemm_grouped(ctx, false, true, El, rows, Fl, H, 1.f, m->xg.data, H,
                                    tpk__moe_mats(ctx, m, m->w3, false), H, dt, 0.f,
                                    gu + (size_t)Fl * es, 2 * Fl, dt));
        TPK_TRY(tpk_op_swiglu_fwd(ctx, h, gu, R, Fl, dt)); /* silu(gate) up */
        TPK_TRY(tpk_op_gemm_grouped(ctx, false, true, El, rows, H, Fl, 1.f, h, Fl,
                                    tpk__moe_mats(ctx, m, m->w2, false), Fl, dt, 0.f, og.data, H,
                                    dt)); /* og = h W2ᵀ */
    }
    if (ctx->tp.size > 1 && !m->sp) /* expert TP: partial over F -> all-reduce (SP: later) */
        TPK_TRY(
            tpk_allreduce(ctx, &ctx->tp, og.data, og.data, (size_t)(R * H), ctx->dtype, TPK_SUM));
    TPK_TRY(tpk_moe_combine(ctx, &m->disp, og, m->router.weight, y)); /* SP: y P */
    if (m->Fs) TPK_TRY(tpk__moe_shared_forward(ctx, fn, m, x, y));
    if (!m->sp) return TPK_OK;
    tpk_tensor p = *y, o = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, p.gshape[0], m->H, TPK_S(0));
    p.layout = TPK_P;
    TPK_TRY(tpk__buf_view(ctx, &m->ya, &o));
    TPK_TRY(tpk_region_forward(ctx, TPK_REGION_SP_SCATTER, &p, &o)); /* reduce-scatter tokens */
    *y = tpk__rows_of(o, &xs);
    return TPK_OK;
}

/* dx R [T, H] of the last forward from dy R [T, H], aux_grad the gradient of the loss with respect
 * to the router's aux loss (1: aux added to the loss as it is; unused when m->aux_dp is set: the
 * pooled aux's gradient instead); accumulates the gradients of the
 * gate and of this rank's experts. Under sequence parallelism dy and dx are S(0) [T, H]: dy
 * all-gathered over TP, the routing weights' gradient dw (and the shared gate's dots) summed over
 * TP in one all-reduce of T (k + 1) f32 (the experts' outputs were left P), the experts' dx left
 * P (no all-reduce), the router's R term added on TP rank 0 alone, and dx reduce-scattered to
 * S(0). Collective over ctx->ep (and ctx->tp at t > 1). */
static inline tpk_status tpk_moe_backward(tpk_ctx *ctx, tpk_moe *m, tpk_tensor dy, float aux_grad,
                                          tpk_tensor *dx) {
    static const char *fn = "tpk_moe_backward";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->H) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised MoE");
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    if (!m->xg.ndim || !m->disp.combined)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", m->name);
    int64_t T = m->router.T, K = m->router.K, R = m->disp.R, H = m->H, Fl = m->Fl;
    if (T * K > m->dw_cap || !m->dw) {
        tpk__free(ctx, m->dw);
        m->dw = (float *)tpk__malloc(ctx, (size_t)(T * K > 0 ? T * K : 1) * sizeof(float));
        m->dw_cap = m->dw ? T * K : 0;
        if (!m->dw) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    tpk_tensor dys = dy; /* SP: dy's own rows, S(0); dy the gathered tokens, R */
    if (m->sp) {
        int64_t want[2] = {T, H};
        TPK_TRY(tpk__check(ctx, fn, "dy", &dys, TPK_S(0), ctx->dtype, 2, want));
        dy = tpk_tensor_2d(NULL, ctx->dtype, T, H, TPK_R);
        TPK_TRY(tpk__buf_view(ctx, &m->dya, &dy));
        TPK_TRY(tpk_region_backward(ctx, TPK_REGION_SP_SCATTER, &dys, &dy)); /* all-gather */
    }
    tpk_tensor dog, dxg = tpk_tensor_2d(NULL, ctx->dtype, R, H, TPK_R), dxs, dxr;
    memset(&dog, 0, sizeof dog);
    TPK_TRY(tpk_moe_combine_backward(ctx, &m->disp, dy, m->router.weight, m->dw, &dog));
    /* the shared gate's dots dy . so, and under SP (the rows P over TP) both sums over TP */
    bool sum = m->sp && ctx->tp.size > 1;
    size_t nk = (size_t)(T * K), ns = m->Fs ? (size_t)T : 0;
    float *dots = NULL;
    if (sum) {
        TPK_TRY(tpk__buf_reserve(ctx, &m->red, (nk + ns) * sizeof(float)));
        if (nk)
            TPK_TRY(tpk_op_memcpy(ctx, m->red.p, m->dw, nk * sizeof(float),
                                  ctx->ops->device ? TPK_H2D : TPK_H2H));
    }
    if (ns) dots = sum ? (float *)m->red.p + nk : (float *)m->sz.p;
    if (ns) TPK_TRY(tpk__moe_shared_dots(ctx, m, dy, dots));
    if (sum && nk + ns) {
        TPK_TRY(tpk_allreduce(ctx, &ctx->tp, m->red.p, m->red.p, nk + ns, TPK_F32, TPK_SUM));
        if (nk)
            TPK_TRY(tpk_op_memcpy(ctx, m->dw, m->red.p, nk * sizeof(float),
                                  ctx->ops->device ? TPK_D2H : TPK_H2H));
    }
    size_t es = tpk_dtype_size(ctx->dtype);
    TPK_TRY(tpk__buf_view(ctx, &m->dxg, &dxg));
    TPK_TRY(tpk__buf_reserve(ctx, &m->dh, (size_t)(R * Fl) * es));
    TPK_TRY(tpk__buf_reserve(ctx, &m->dgu, (size_t)(R * 2 * Fl) * es));
    const int64_t El = m->El, *rows = m->disp.rows; /* local expert j: rows[j] of xg, in order */
    tpk_dtype dt = ctx->dtype;
    char *dh = (char *)m->dh.p, *dgu = (char *)m->dgu.p, *du = dgu + (size_t)Fl * es;
    if (Fl) { /* one grouped GEMM over the local experts each; the gradients f32 (w_dt) */
        TPK_TRY(tpk_op_gemm_grouped(ctx, false, false, El, rows, Fl, H, 1.f, dog.data, H,
                                    tpk__moe_mats(ctx, m, m->w2, false), Fl, dt, 0.f, dh, Fl,
                                    dt)); /* dh = dog W2 */
        TPK_TRY(tpk_op_gemm_grouped(ctx, true, false, El, rows, Fl, H, 1.f, dog.data, H,
                                    tpk__moe_mats(ctx, m, m->w2, true), Fl, TPK_F32, 1.f, m->h.p,
                                    Fl, dt)); /* dW2 += dogᵀ h */
        TPK_TRY(tpk_op_swiglu_bwd(ctx, dgu, m->gu.p, dh, R, Fl, dt));
        TPK_TRY(tpk_op_gemm_grouped(ctx, true, false, El, rows, H, Fl, 1.f, dgu, 2 * Fl,
                                    tpk__moe_mats(ctx, m, m->w1, true), H, TPK_F32, 1.f,
                                    m->xg.data, H, dt)); /* dW1 += dgateᵀ xg */
        TPK_TRY(tpk_op_gemm_grouped(ctx, true, false, El, rows, H, Fl, 1.f, du, 2 * Fl,
                                    tpk__moe_mats(ctx, m, m->w3, true), H, TPK_F32, 1.f,
                                    m->xg.data, H, dt)); /* dW3 += dupᵀ xg */
        TPK_TRY(tpk_op_gemm_grouped(ctx, false, false, El, rows, H, Fl, 1.f, dgu, 2 * Fl,
                                    tpk__moe_mats(ctx, m, m->w1, false), H, dt, 0.f, dxg.data, H,
                                    dt)); /* dxg = dgate W1 */
        TPK_TRY(tpk_op_gemm_grouped(ctx, false, false, El, rows, H, Fl, 1.f, du, 2 * Fl,
                                    tpk__moe_mats(ctx, m, m->w3, false), H, dt, 1.f, dxg.data, H,
                                    dt)); /* + dup W3 */
    } else if (R) {
        TPK_TRY(tpk_op_fill(ctx, dxg.data, dt, (size_t)(R * H), 0.f));
    }
    if (ctx->tp.size > 1 && !m->sp) /* expert TP: partial over F -> all-reduce (SP: later) */
        TPK_TRY(
            tpk_allreduce(ctx, &ctx->tp, dxg.data, dxg.data, (size_t)(R * H), ctx->dtype, TPK_SUM));
    TPK_TRY(tpk_moe_dispatch_backward(ctx, &m->disp, dxg, &dxs));
    TPK_TRY(m->aux_dp ? tpk_router_backward_pooled(ctx, &m->router, m->dw, m->aux_dp,
                                                   m->aux_g ? *m->aux_g : 0, &dxr)
                      : tpk_router_backward(ctx, &m->router, m->dw, aux_grad, &dxr));
    *dx = dxs; /* the dispatcher's buffer: + the router's dx (+ the shared expert's) */
    if (!m->sp || ctx->tp.rank == 0) /* R (the gate's): under SP once over TP, dx being P */
        TPK_TRY(tpk_op_axpby(ctx, dx->data, 1.f, dxr.data, 1.f, ctx->dtype, (size_t)(T * H)));
    if (m->Fs && T) {
        TPK_TRY(tpk__moe_shared_backward(ctx, m, dy, dots));
        TPK_TRY(tpk_op_axpby(ctx, dx->data, 1.f, m->sdx.p, 1.f, ctx->dtype, (size_t)(T * H)));
    }
    if (!m->sp) return TPK_OK;
    tpk_tensor p = *dx, o = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, H, TPK_S(0));
    p.layout = TPK_P;
    TPK_TRY(tpk__buf_view(ctx, &m->dxa, &o));
    TPK_TRY(tpk_region_backward(ctx, TPK_REGION_SP_GATHER, &p, &o)); /* reduce-scatter tokens */
    *dx = tpk__rows_of(o, &dys);
    return TPK_OK;
}

#endif /* TPK_MOE_H */
