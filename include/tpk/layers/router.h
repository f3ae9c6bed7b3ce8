/* tpk/layers/router.h — a mixture of experts' router: a replicated gate linear H -> E, softmax,
 * top-k, the routing weights and the load-balancing auxiliary loss, forward and backward.
 *
 *   forward   x R [T, H] (every rank of a TP group holds the same tokens)
 *             z = x Wgᵀ                 f32 [T, E]   (Wg "<name>.weight" [E, H], R: replicated,
 *                                                    no communication; gemm_acc: f32 logits)
 *             p_t = softmax(z_t)                      (double, on the host)
 *             e_t1 .. e_tk = the k experts of largest p_t, largest first; ties (equal logits)
 *                            the lower expert index first (torch.topk's order)
 *             w_ti = p_t,e_ti   (renormalize: w_ti = p_t,e_ti / S_t, S_t = sum_j p_t,e_tj)
 *             balance = E sum_e f_e P_e,  f_e = #{(t, i): e_ti = e} / T,  P_e = sum_t p_te / T
 *             aux = coef balance  (Hugging Face's load_balancing_loss_func on one layer's tokens;
 *                                  Switch Transformer's at k = 1; k at uniform probabilities and
 *                                  an even load)
 *                   + zloss, zloss = z_coef mean_t (logsumexp_e z_te)²   (ST-MoE's router z-loss;
 *                                  optional, z_coef 0: none, not computed)
 *   capacity  (capacity_factor c > 0; 0: dropless, every row kept) C = ceil(T k / E c) rows per
 *             expert from this rank's T tokens (Megatron-core's get_capacity on the tokens this
 *             rank routes; the TP ranks of a group route the same tokens and drop the same rows).
 *             Megatron's default drop policy "probs": of the rows routed to expert e, the C of the
 *             largest routing weight w_ti are kept (ties: the earlier token first), the rest
 *             dropped: sent[t k + i] = -1 (else e_ti), the dispatcher sends no row for it and the
 *             token's output lacks that term (its other choices kept, the weights not
 *             renormalised after the drop, as Megatron and Switch do); a dropped row's dw_ti is 0.
 *             The balance counts the choices before the drop (f_e: what the router asked for).
 *   backward  from dw_ti (the gradient of each routing weight, tpk_moe_combine_backward) and
 *             g = d loss / d aux:
 *             dp_te = [e = e_ti] (renormalize ? (dw_ti - sum_j dw_tj w_tj) / S_t : dw_ti)
 *                     + g coef E f_e / T²        (f_e counts, not differentiated)
 *             dz_t = p_t ∘ (dp_t - <p_t, dp_t>)  (the softmax's backward; double, on the host)
 *                    + g z_coef 2 lse_t p_t / T  (the z-loss's, lse_t = logsumexp_e z_te)
 *             dx = dz Wg  R [T, H];  dWg += dzᵀ x (complete on every rank: Wg is replicated)
 * The softmax, top-k, loss and their gradients run on the host from the logits copied out of the
 * backend (T E values each way): the dispatcher (tpk/layers/moe.h) needs the routing on the host
 * anyway, to count the rows it sends. Non-finite logits are refused (naming the token). The aux
 * loss is over this rank's T tokens (a rank of another DP or EP rank routes other tokens: summing
 * or averaging the ranks' aux is the trainer's choice). A model pooling the aux over its layers
 * (Hugging Face's loss over all layers' logits concatenated: balance = E sum_e C_e Q_e / N², C_e
 * and Q_e = sum_t p_te summed over the layers, N their tokens) gives each router that loss's
 * gradient on p_te, coef E C_e / N² (tpk_router_backward_pooled); psum keeps each Q_e's part.
 * A dry run (ctx->ops->dry_run: the planner's counting backend, tpk/plan/count.h, whose logits
 * read back as zeros) assumes a balanced router: z_te = -((e - t k) mod E), so token t's experts
 * are t k .. t k + k - 1 (mod E) and every expert gets T k / E of the rows (E dividing T k). */
#ifndef TPK_ROUTER_H
#define TPK_ROUTER_H

#include "params.h"

typedef struct tpk_router_desc {
    const char *name; /* parameter "<name>.weight" [E, H]; default "router<N>" */
    int experts;      /* E >= 1; required */
    int top_k;        /* k, 1..E; default 2 (Mixtral's num_experts_per_tok) */
    bool renormalize; /* the top-k weights divided by their sum (Mixtral; Qwen-MoE's
                         norm_topk_prob) */
    float aux_coef;   /* the auxiliary loss's coefficient (Mixtral's router_aux_loss_coef, 0.02);
                         0: none in the gradient (balance is still measured) */
    float init_std;   /* Wg N(0, std²); default 0.02 */
    float z_coef;     /* the router z-loss's coefficient (ST-MoE's, 1e-3 there); 0: none */
    float capacity_factor; /* c > 0: each expert takes at most ceil(T k / E c) of this rank's rows,
                              the lowest-weighted dropped (above); 0: dropless */
} tpk_router_desc;

typedef struct tpk_router {
    tpk_router_desc d;
    char name[80];
    int64_t H, E, K;
    int w;             /* the gate's parameter id */
    int64_t T;         /* tokens of the last forward */
    tpk_tensor x;      /* saved input (the caller keeps it alive until backward) */
    int32_t *idx;      /* host [T, K]: e_ti, each token's experts, largest weight first */
    float *weight;     /* host [T, K]: w_ti */
    float *prob;       /* host [T, E]: p_te (the logits while the forward computes) */
    int64_t *count;    /* host [E]: #{(t, i): e_ti = e} (the rows each expert receives from
                             this rank) */
    double *dp;        /* host [E]: one token's dp (backward scratch) */
    double *psum;      /* host [E]: sum_t p_te of the last forward (P_e T) */
    double *ga;        /* host [E]: the aux's gradient on every p_te (backward scratch) */
    float *dzh;        /* host [T, E]: dz (backward) */
    int64_t cap;       /* the host arrays' room, in tokens */
    double balance;    /* E sum_e f_e P_e of the last forward */
    double zloss;      /* z_coef mean_t lse_t² of the last forward (0 when z_coef is 0) */
    float aux;         /* aux_coef balance + zloss */
    double *lse;       /* host [T]: lse_t (z_coef > 0) */
    int32_t *sent;     /* host [T, K]: e_ti, or -1 where the capacity dropped the row (c > 0) */
    int64_t capacity;  /* C of the last forward (0: dropless) */
    int64_t dropped;   /* rows the capacity dropped in the last forward */
    tpk_buf z, dz, dx; /* backend: z f32 [T, E]; dz [T, E] and dx [T, H] in the context's dtype */
} tpk_router;

static inline tpk_status tpk_router_init(tpk_ctx *ctx, tpk_router *r, int64_t H,
                                         const tpk_router_desc *desc) {
    static const char *fn = "tpk_router_init";
    tpk_router_desc d;
    TPK__INIT_LAYER(ctx, fn, r, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    if (d.experts < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->experts: expected >= 1, got %d", d.experts);
    int k = d.top_k ? d.top_k : 2;
    if (k < 1 || k > d.experts)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->top_k: expected 1..experts = 1..%d (0: 2), got %d", d.experts,
                         d.top_k);
    if (!(d.aux_coef >= 0) || isinf(d.aux_coef))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->aux_coef: expected a finite value >= 0, got %g",
                         (double)d.aux_coef);
    if (!(d.z_coef >= 0) || isinf(d.z_coef))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->z_coef: expected a finite value >= 0, got %g",
                         (double)d.z_coef);
    if (!(d.capacity_factor >= 0) || isinf(d.capacity_factor))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->capacity_factor: expected a finite value >= 0 (0: dropless), "
                         "got %g",
                         (double)d.capacity_factor);
    if (!(d.init_std >= 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->init_std: expected >= 0, got %g",
                         (double)d.init_std);
    TPK_TRY(tpk__layer_name(ctx, fn, r->name, sizeof r->name, d.name, "router"));
    r->d = d, r->d.top_k = k, r->H = H, r->E = d.experts, r->K = k, r->d.name = NULL;
    char pn[128];
    snprintf(pn, sizeof pn, "%s.weight", r->name);
    return tpk__param_add(ctx, pn, 2, r->E, H, TPK_R, TPK_INIT_NORMAL,
                          d.init_std > 0 ? d.init_std : 0.02f, true, &r->w);
}

static inline void tpk_router_destroy(tpk_ctx *ctx, tpk_router *r) {
    if (!r) return;
    tpk__free(ctx, r->idx), tpk__free(ctx, r->weight), tpk__free(ctx, r->prob);
    tpk__free(ctx, r->count), tpk__free(ctx, r->dp), tpk__free(ctx, r->dzh);
    tpk__free(ctx, r->psum), tpk__free(ctx, r->ga), tpk__free(ctx, r->lse);
    tpk__free(ctx, r->sent);
    tpk__buf_free(ctx, &r->z), tpk__buf_free(ctx, &r->dz), tpk__buf_free(ctx, &r->dx);
    memset(r, 0, sizeof *r);
}

/* The host arrays grown to T tokens (contents not kept). */
static inline tpk_status tpk__router_room(tpk_ctx *ctx, const char *fn, tpk_router *r, int64_t T) {
    if (r->count && T <= r->cap) return TPK_OK;
    int64_t cap = T > 2 * r->cap ? T : 2 * r->cap;
    size_t c = (size_t)(cap ? cap : 1), E = (size_t)r->E, K = (size_t)r->K;
    tpk__free(ctx, r->idx), tpk__free(ctx, r->weight), tpk__free(ctx, r->prob);
    tpk__free(ctx, r->count), tpk__free(ctx, r->dp), tpk__free(ctx, r->dzh);
    tpk__free(ctx, r->psum), tpk__free(ctx, r->ga), tpk__free(ctx, r->lse);
    tpk__free(ctx, r->sent);
    r->idx = (int32_t *)tpk__malloc(ctx, c * K * sizeof(int32_t));
    r->weight = (float *)tpk__malloc(ctx, c * K * sizeof(float));
    r->prob = (float *)tpk__malloc(ctx, c * E * sizeof(float));
    r->dzh = (float *)tpk__malloc(ctx, c * E * sizeof(float));
    r->count = (int64_t *)tpk__malloc(ctx, E * sizeof(int64_t));
    r->dp = (double *)tpk__malloc(ctx, E * sizeof(double));
    r->psum = (double *)tpk__malloc(ctx, E * sizeof(double));
    r->ga = (double *)tpk__malloc(ctx, E * sizeof(double));
    r->lse = (double *)tpk__malloc(ctx, c * sizeof(double));
    r->sent = (int32_t *)tpk__malloc(ctx, c * K * sizeof(int32_t));
    r->cap = cap;
    if (r->idx && r->weight && r->prob && r->dzh && r->count && r->dp && r->psum && r->ga &&
        r->lse && r->sent)
        return TPK_OK;
    r->cap = 0;
    return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld tokens' routing",
                     (long long)T);
}

/* One routed row for the capacity's sort: expert, weight, token's row t k + i. */
typedef struct tpk__router_row {
    int32_t e;
    float w;
    int64_t r;
} tpk__router_row;
static inline int tpk__router_row_cmp(const void *a, const void *b) {
    const tpk__router_row *p = (const tpk__router_row *)a, *q = (const tpk__router_row *)b;
    if (p->e != q->e) return p->e < q->e ? -1 : 1;
    if (p->w != q->w) return p->w > q->w ? -1 : 1; /* the largest weight first */
    return p->r < q->r ? -1 : p->r > q->r;         /* ties: the earlier token */
}

/* The capacity's drop (capacity_factor > 0): r->sent, r->capacity, r->dropped. */
static inline tpk_status tpk__router_drop(tpk_ctx *ctx, const char *fn, tpk_router *r) {
    int64_t N = r->T * r->K;
    r->capacity = r->dropped = 0;
    if (!(r->d.capacity_factor > 0)) return TPK_OK;
    double c = ceil((double)N / (double)r->E * (double)r->d.capacity_factor);
    r->capacity = c < (double)INT64_MAX / 2 ? (int64_t)c : INT64_MAX / 2;
    tpk__router_row *rows = (tpk__router_row *)tpk__malloc(ctx, (size_t)(N ? N : 1) * sizeof *rows);
    if (!rows)
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory for %lld rows' capacity",
                         (long long)N);
    for (int64_t i = 0; i < N; i++) rows[i].e = r->idx[i], rows[i].w = r->weight[i], rows[i].r = i;
    qsort(rows, (size_t)N, sizeof *rows, tpk__router_row_cmp);
    for (int64_t i = 0, kept = 0; i < N; i++) {
        kept = i && rows[i].e == rows[i - 1].e ? kept + 1 : 0; /* this row's place at its expert */
        bool keep = kept < r->capacity;
        r->sent[rows[i].r] = keep ? rows[i].e : -1, r->dropped += !keep;
    }
    tpk__free(ctx, rows);
    return TPK_OK;
}

/* Route T tokens from their logits (host, f32 [T, E], replaced by the probabilities p): the top-k
 * experts of each (ties: the lower index first), their weights, the counts and the balance. */
static inline tpk_status tpk__router_route(tpk_ctx *ctx, const char *fn, tpk_router *r) {
    int64_t T = r->T, E = r->E, K = r->K;
    double psum_f = 0;
    for (int64_t e = 0; e < E; e++) r->count[e] = 0, r->psum[e] = 0; /* P_e T */
    for (int64_t t = 0; t < T; t++) {
        float *z = r->prob + t * E;
        for (int64_t e = 0; e < E; e++)
            if (!isfinite(z[e]))
                return tpk__fail(ctx, TPK_ERR_ARG, fn,
                                 "x: token %lld's router logit for expert %lld is %g (expected "
                                 "finite logits)",
                                 (long long)t, (long long)e, (double)z[e]);
        int32_t *ix = r->idx + t * K;
        for (int64_t i = 0; i < K; i++) { /* the k largest logits, ties: the lower index */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t j = 0; j < i; j++) taken = taken || ix[j] == e;
                if (!taken && (best < 0 || z[e] > z[best])) best = e;
            }
            ix[i] = (int32_t)best;
        }
        double m = z[ix[0]], s = 0;
        for (int64_t e = 0; e < E; e++) s += exp((double)z[e] - m);
        r->lse[t] = m + log(s);
        double S = 0;
        for (int64_t i = 0; i < K; i++) S += exp((double)z[ix[i]] - m) / s;
        for (int64_t i = 0; i < K; i++) {
            double p = exp((double)z[ix[i]] - m) / s;
            r->weight[t * K + i] = (float)(r->d.renormalize ? p / S : p);
            r->count[ix[i]]++;
        }
        for (int64_t e = 0; e < E; e++) {
            double p = exp((double)z[e] - m) / s;
            z[e] = (float)p, r->psum[e] += p;
        }
    }
    for (int64_t e = 0; T && e < E; e++) psum_f += (double)r->count[e] * r->psum[e];
    r->balance = T ? (double)E * psum_f / ((double)T * (double)T) : 0;
    r->zloss = 0;
    for (int64_t t = 0; r->d.z_coef > 0 && t < T; t++) r->zloss += r->lse[t] * r->lse[t];
    r->zloss = T ? (double)r->d.z_coef * r->zloss / (double)T : 0;
    r->aux = (float)(r->d.aux_coef * r->balance + r->zloss);
    return tpk__router_drop(ctx, fn, r);
}

/* Route the tokens x R [T, H] (ctx->dtype): r->idx, r->weight, r->count, r->balance, r->aux. */
static inline tpk_status tpk_router_forward(tpk_ctx *ctx, tpk_router *r, tpk_tensor x) {
    static const char *fn = "tpk_router_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!r || !r->E)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised router");
    int64_t want[2] = {-1, r->H};
    TPK_TRY(tpk__check(ctx, fn, "x", &x, TPK_R, ctx->dtype, 2, want));
    int64_t T = x.gshape[0], E = r->E;
    TPK_TRY(tpk__router_room(ctx, fn, r, T));
    TPK_TRY(tpk__params_fresh(ctx));
    TPK_TRY(tpk__buf_reserve(ctx, &r->z, (size_t)(T * E) * sizeof(float)));
    TPK_TRY(tpk_op_gemm_acc(ctx, false, true, T, E, r->H, 1.f, x.data, r->H,
                            tpk__param_w(ctx, r->w), r->H, 0.f, (float *)r->z.p, E,
                            ctx->dtype)); /* z = x Wgᵀ, f32 */
    TPK_TRY(tpk_op_memcpy(ctx, r->prob, r->z.p, (size_t)(T * E) * sizeof(float),
                          ctx->ops->device ? TPK_D2H : TPK_H2H));
    for (int64_t t = 0; ctx->ops->dry_run && t < T; t++) /* the balanced router assumed */
        for (int64_t e = 0; e < E; e++) r->prob[t * E + e] = -(float)(((e - t * r->K) % E + E) % E);
    r->T = T, r->x = x;
    return tpk__router_route(ctx, fn, r);
}

static inline tpk_status tpk__router_args(tpk_ctx *ctx, const char *fn, const tpk_router *r,
                                          const float *dweight, const tpk_tensor *dx) {
    if (!ctx) return TPK_ERR_ARG;
    if (!r || !r->E)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised router");
    if (!r->x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", r->name);
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    if (r->T && !dweight)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "dweight: expected %lld gradients, got NULL",
                         (long long)(r->T * r->K));
    return TPK_OK;
}

/* The backward with ga[e] (host [E]) the gradient of the loss's auxiliary part with respect to
 * every token's p_te. */
static inline tpk_status tpk__router_backward(tpk_ctx *ctx, tpk_router *r, const float *dweight,
                                              const double *ga, double gz, tpk_tensor *dx) {
    int64_t T = r->T, E = r->E, K = r->K, H = r->H;
    gz = T && r->d.z_coef > 0 ? gz * 2 * (double)r->d.z_coef / (double)T : 0; /* d zloss/d lse */
    for (int64_t t = 0; t < T; t++) {
        const float *p = r->prob + t * E, *w = r->weight + t * K, *dw = dweight + t * K;
        const int32_t *ix = r->idx + t * K;
        double c = 0, S = 0, dot = 0;
        for (int64_t e = 0; e < E; e++) r->dp[e] = ga[e];
        for (int64_t i = 0; i < K; i++) c += (double)dw[i] * w[i], S += p[ix[i]];
        for (int64_t i = 0; i < K; i++)
            r->dp[ix[i]] += r->d.renormalize ? ((double)dw[i] - c) / S : (double)dw[i];
        for (int64_t e = 0; e < E; e++) dot += (double)p[e] * r->dp[e];
        double zl = gz ? gz * r->lse[t] : 0; /* the z-loss's: dz_te += zl p_te */
        for (int64_t e = 0; e < E; e++)
            r->dzh[t * E + e] = (float)((double)p[e] * (r->dp[e] - dot + zl));
    }
    size_t es = tpk_dtype_size(ctx->dtype), n = (size_t)(T * E);
    TPK_TRY(tpk__buf_reserve(ctx, &r->dz, n * es));
    TPK_TRY(tpk__buf_reserve(ctx, &r->z, n * sizeof(float)));
    TPK_TRY(tpk_op_memcpy(ctx, r->z.p, r->dzh, n * sizeof(float),
                          ctx->ops->device ? TPK_H2D : TPK_H2H));
    TPK_TRY(tpk_op_cast(ctx, r->dz.p, ctx->dtype, r->z.p, TPK_F32, n)); /* dz in the dtype */
    *dx = r->x;
    TPK_TRY(tpk__buf_view(ctx, &r->dx, dx));
    TPK_TRY(tpk_op_gemm(ctx, false, false, T, H, E, 1.f, r->dz.p, E, tpk__param_w(ctx, r->w), H,
                        0.f, dx->data, H, ctx->dtype)); /* dx = dz Wg */
    return tpk__grad_gemm(ctx, r->w, true, false, E, H, T, r->dz.p, E, r->x.data, H); /* dzᵀ x */
}

/* dx R [T, H] (in r->dx) from dweight (host [T, K]: the gradient of each routing weight w_ti) and
 * aux_grad, the gradient of the loss with respect to this router's aux (1: aux added to the loss
 * as it is); accumulates the gate's gradient. */
static inline tpk_status tpk_router_backward(tpk_ctx *ctx, tpk_router *r, const float *dweight,
                                             float aux_grad, tpk_tensor *dx) {
    static const char *fn = "tpk_router_backward";
    TPK_TRY(tpk__router_args(ctx, fn, r, dweight, dx));
    if (!isfinite(aux_grad))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "aux_grad: expected a finite value, got %g",
                         (double)aux_grad);
    int64_t T = r->T, E = r->E;
    double ga = T ? (double)aux_grad * (double)r->d.aux_coef * (double)E / ((double)T * T) : 0;
    for (int64_t e = 0; e < E; e++) r->ga[e] = ga * (double)r->count[e];
    return tpk__router_backward(ctx, r, dweight, r->ga, (double)aux_grad, dx);
}

/* The backward under an auxiliary loss pooled over several routers (Hugging Face's
 * load_balancing_loss_func over all layers' logits concatenated, tpk/models/lm.h): aux_dp (host
 * [E]) is the loss's gradient with respect to every token's p_te, the same for each token (coef E
 * C_e / N² for C_e the rows routed to e and N the tokens, over all the layers pooled); this
 * router's own balance takes no part. Its z-loss (z_coef > 0) is a term of the pooled aux, whose
 * gradient aux_grad (the loss's with respect to the pooled aux) it takes as tpk_router_backward
 * does. */
static inline tpk_status tpk_router_backward_pooled(tpk_ctx *ctx, tpk_router *r,
                                                    const float *dweight, const double *aux_dp,
                                                    double aux_grad, tpk_tensor *dx) {
    static const char *fn = "tpk_router_backward_pooled";
    TPK_TRY(tpk__router_args(ctx, fn, r, dweight, dx));
    if (!aux_dp) return tpk__fail(ctx, TPK_ERR_ARG, fn, "aux_dp: NULL (expected [E] gradients)");
    if (!isfinite(aux_grad))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "aux_grad: expected a finite value, got %g",
                         aux_grad);
    for (int64_t e = 0; e < r->E; e++)
        if (!isfinite(aux_dp[e]))
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "aux_dp[%lld]: expected finite, got %g",
                             (long long)e, aux_dp[e]);
    return tpk__router_backward(ctx, r, dweight, aux_dp, aux_grad, dx);
}

#endif /* TPK_ROUTER_H */
