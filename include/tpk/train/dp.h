/* tpk/train/dp.h — data-parallel gradient buckets: each bucket (a block's gradients, as the model's
 * backward finishes it) is all-reduced (sum) over the DP group while the rest of the backward
 * runs; micro-steps of gradient accumulation do no DP communication.
 *
 *   tpk_dp_begin(ctx, b, last)   before a micro-step's backward; last = the step's last micro-batch
 *   tpk_dp_grad_ready            the model's grad_ready hook (tpk_gpt2.lm.grad_ready, user = b):
 *                                on the last micro-batch, starts the all-reduce of the gradients of
 *                                parameters first..last (contiguous in the flat buffer)
 *   tpk_dp_finish(ctx, b)        waits for every bucket; the gradients are then the DP sums, the
 *                                same on every DP rank (scale by 1 / dp.size, e.g. in AdamW)
 * With one DP rank nothing is started.
 *
 * Adasum (Maleki et al., Horovod), after the backward instead of the buckets
 * (tpk_dp_adasum_init, then tpk_dp_adasum): per parameter tensor, two gradients combine as
 *   g1 (+) g2 = (1 - g1.g2 / (2 |g1|^2)) g1 + (1 - g1.g2 / (2 |g2|^2)) g2
 * (a zero gradient leaves the other), by recursive doubling: at level k each DP rank pairs with
 * rank ^ 2^k (a communicator of two, made once), the pair exchange their gradient buffers
 * (one all-gather) and both compute the same combination, so after log2(dp) levels every DP
 * rank holds the result. The dot products and norms are over the WHOLE tensor: each TP rank sums
 * the elements it counts (its shard; a replicated tensor on TP rank 0; a shared key/value head
 * once) and one all-reduce over TP per level sums them for every parameter at once. In double:
 * |g1|^2, |g2|^2 and |g1 + g2|^2 (g1.g2 = (|g1 + g2|^2 - |g1|^2 - |g2|^2) / 2). Needs a
 * power-of-two
 * DP size. Two equal gradients give that gradient, orthogonal ones their sum: no 1/dp scaling. */
#ifndef TPK_DP_H
#define TPK_DP_H

#include "../layers/params.h"

typedef struct tpk_dp_buckets {
    tpk_request *req; /* [cap] started all-reduces */
    int n, cap;
    bool active;      /* this micro-step reduces */
    bool adasum;      /* tpk_dp_adasum_init: the reduction is Adasum after the backward; the hook
                         starts nothing */
    tpk_comm *pairs;  /* [levels] Adasum: level k pairs this DP rank with rank ^ 2^k */
    int levels;
} tpk_dp_buckets;

static inline tpk_status tpk_dp_begin(tpk_ctx *ctx, tpk_dp_buckets *b, bool last_micro_step) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_begin", "buckets: NULL");
    if (b->n)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_begin",
                         "buckets: %d reductions still running; tpk_dp_finish them first", b->n);
    b->active = last_micro_step && ctx->dp.size > 1 && !b->adasum;
    return TPK_OK;
}

/* The grad_ready hook: user is the tpk_dp_buckets. */
static inline tpk_status tpk_dp_grad_ready(tpk_ctx *ctx, int first, int last, void *user) {
    static const char *fn = "tpk_dp_grad_ready";
    tpk_dp_buckets *b = (tpk_dp_buckets *)user;
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "user: expected the tpk_dp_buckets, got NULL");
    if (!b->active) return TPK_OK;
    if (first < 0 || last < first || last >= ctx->params.n)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "first, last: expected 0 <= first <= last < %d, got %d, %d", ctx->params.n,
                         first, last);
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        tpk_request *r = (tpk_request *)realloc(b->req, sizeof *r * (size_t)cap);
        if (!r) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d requests", cap);
        b->req = r, b->cap = cap;
    }
    const tpk_param *p0 = &ctx->params.list[first], *p1 = &ctx->params.list[last];
    size_t off = p0->offset, n = p1->offset + p1->numel - off;
    float *g = (float *)ctx->params.grad.p + off;
    memset(&b->req[b->n], 0, sizeof b->req[b->n]);
    TPK_TRY(tpk_allreduce_start(ctx, &ctx->dp, g, g, n, TPK_F32, TPK_SUM, &b->req[b->n]));
    b->n++;
    return TPK_OK;
}

/* Wait for every started bucket (all are waited even when one fails). */
static inline tpk_status tpk_dp_finish(tpk_ctx *ctx, tpk_dp_buckets *b) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_finish", "buckets: NULL");
    tpk_status s = TPK_OK;
    for (int i = 0; i < b->n; i++) {
        tpk_status w = tpk_wait(ctx, &b->req[i]);
        if (s == TPK_OK) s = w;
    }
    b->n = 0, b->active = false;
    return s;
}

static inline void tpk_dp_destroy(tpk_dp_buckets *b) {
    if (!b) return;
    for (int k = 0; k < b->levels; k++) tpk_comm_destroy(&b->pairs[k]);
    free(b->req), free(b->pairs), memset(b, 0, sizeof *b);
}

/* Make b reduce with Adasum: the pair communicators of the log2(dp) levels. Collective over
 * ctx->dp. */
static inline tpk_status tpk_dp_adasum_init(tpk_ctx *ctx, tpk_dp_buckets *b) {
    static const char *fn = "tpk_dp_adasum_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "buckets: NULL");
    int d = ctx->dp.size, r = ctx->dp.rank, levels = 0;
    if (d & (d - 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "ctx->dp: Adasum needs a power-of-two number of DP ranks, got %d", d);
    while ((1 << levels) < d) levels++;
    b->pairs = (tpk_comm *)calloc((size_t)(levels ? levels : 1), sizeof *b->pairs);
    if (!b->pairs) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d communicators", levels);
    for (; b->levels < levels; b->levels++)
        TPK_TRY(tpk_comm_split(ctx, &ctx->dp, r & ~(1 << b->levels), r, &b->pairs[b->levels]));
    b->adasum = true;
    return TPK_OK;
}

/* Adasum over the DP group of the whole gradient buffer (see above). Collective over ctx->dp and
 * ctx->tp. */
static inline tpk_status tpk_dp_adasum(tpk_ctx *ctx, tpk_dp_buckets *b) {
    static const char *fn = "tpk_dp_adasum";
    if (!ctx) return TPK_ERR_ARG;
    if (!b || !b->adasum)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "buckets: expected buckets made for Adasum (tpk_dp_adasum_init)");
    size_t n = ctx->params.numel;
    int np = ctx->params.n;
    double *sums = (double *)malloc(sizeof(double) * 3 * (size_t)(np ? np : 1));
    if (!sums) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d parameters' sums", np);
    float *g = (float *)ctx->params.grad.p;
    double *dsums = NULL; /* the sums in backend memory, downloaded once per level */
    tpk_status s = tpk_op_alloc(ctx, sizeof(double) * 3 * (size_t)(np ? np : 1), (void **)&dsums);
    if (s == TPK_OK) s = tpk__buf_reserve(ctx, &ctx->work[0], sizeof(float) * 2 * (n ? n : 1));
    if (s == TPK_OK) s = tpk__buf_reserve(ctx, &ctx->work[1], sizeof(float) * (n ? n : 1));
    for (int k = 0; k < b->levels && s == TPK_OK && n; k++) {
        float *both = (float *)ctx->work[0].p, *sum = (float *)ctx->work[1].p;
        size_t counts[2] = {n, n};
        s = tpk_allgatherv(ctx, &b->pairs[k], g, n, both, counts, 2 * n,
                           TPK_F32); /* [lower rank's | higher rank's] */
        const float *other = both + (b->pairs[k].rank ? 0 : n);
        if (s == TPK_OK) s = tpk_op_axpby(ctx, sum, 1.0f, g, 0.0f, TPK_F32, n);
        if (s == TPK_OK) s = tpk_op_axpby(ctx, sum, 1.0f, other, 1.0f, TPK_F32, n); /* g1 + g2 */
        for (int i = 0; i < np && s == TPK_OK; i++) { /* |g1|^2, |g2|^2, |g1 + g2|^2 of the elements
                                                         this rank counts */
            size_t lo, hi;
            tpk__param_counted(ctx, i, &lo, &hi);
            const float *x[3] = {g, other, sum};
            for (int q = 0; q < 3 && s == TPK_OK; q++)
                s = tpk_op_sumsq(ctx, &dsums[3 * i + q], x[q] + lo, hi > lo ? hi - lo : 0, false);
        }
        if (s == TPK_OK && np)
            s = tpk_op_memcpy(ctx, sums, dsums, sizeof(double) * 3 * (size_t)np,
                              ctx->ops->device ? TPK_D2H : TPK_H2H);
        if (s == TPK_OK)
            s = tpk_allreduce_host(ctx, &ctx->tp, sums, 3 * (size_t)np, TPK_F64,
                                   TPK_SUM);          /* over the whole tensors */
        for (int i = 0; i < np && s == TPK_OK; i++) { /* g = c1 g1 + c2 g2, the same on both ranks
                                                         of the pair */
            const tpk_param *p = &ctx->params.list[i];
            double a2 = sums[3 * i], b2 = sums[3 * i + 1], dot = 0.5 * (sums[3 * i + 2] - a2 - b2);
            float c1 = a2 > 0 ? (float)(1.0 - dot / (2.0 * a2)) : 1.0f,
                  c2 = b2 > 0 ? (float)(1.0 - dot / (2.0 * b2)) : 1.0f;
            if (p->numel)
                s = tpk_op_axpby(ctx, g + p->offset, c2, other + p->offset, c1, TPK_F32, p->numel);
        }
    }
    free(sums);
    tpk_op_free(ctx, dsums);
    return s;
}

#endif /* TPK_DP_H */
