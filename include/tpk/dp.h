/* tpk/dp.h — data-parallel gradient buckets: each bucket (a block's gradients, as the model's
 * backward finishes it) is all-reduced (sum) over the DP group while the rest of the backward
 * runs; micro-steps of gradient accumulation do no DP communication.
 *
 *   tpk_dp_begin(ctx, b, last)   before a micro-step's backward; last = the step's last micro-batch
 *   tpk_dp_grad_ready            the model's grad_ready hook (tpk_gpt2.grad_ready, user = b):
 *                                on the last micro-batch, starts the all-reduce of the gradients of
 *                                parameters first..last (contiguous in the flat buffer)
 *   tpk_dp_finish(ctx, b)        waits for every bucket; the gradients are then the DP sums, the
 *                                same on every DP rank (scale by 1 / dp.size, e.g. in AdamW)
 * With one DP rank nothing is started. */
#ifndef TPK_DP_H
#define TPK_DP_H

#include "params.h"

typedef struct tpk_dp_buckets {
    tpk_request *req; /* [cap] started all-reduces */
    int n, cap;
    bool active;      /* this micro-step reduces */
} tpk_dp_buckets;

static inline tpk_status tpk_dp_begin(tpk_ctx *ctx, tpk_dp_buckets *b, bool last_micro_step) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_begin", "buckets: NULL");
    if (b->n) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_begin", "buckets: %d reductions still running; tpk_dp_finish them first", b->n);
    b->active = last_micro_step && ctx->dp.size > 1;
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
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "first, last: expected 0 <= first <= last < %d, got %d, %d", ctx->params.n, first, last);
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
    if (b) free(b->req), memset(b, 0, sizeof *b);
}

#endif /* TPK_DP_H */
