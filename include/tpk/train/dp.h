/* tpk/train/dp.h — data-parallel gradient buckets: each bucket (a block's gradients, as the model's
 * backward finishes it) is all-reduced (sum) over the DP group while the rest of the backward
 * runs; micro-steps of gradient accumulation do no DP communication. The protocol is checked.
 * "The DP group" is the group of a weight's replicas, tpk__dp_group = ctx->dp_cp: DP x CP under
 * context parallelism (each CP rank's gradient is its rows' part of its DP rank's: summed over CP
 * it is that DP rank's, so the one sum over DP x CP is DP's sum; the 1/dp scaling is unchanged),
 * the DP group itself at cp = 1. A routed expert's weight (tpk_param.expert, tpk/layers/moe.h) at
 * EP > 1 is summed over its replicas instead, ctx->edp (the same TP rank, stage and EP rank: DP /
 * ep x CP ranks; the EP ranks of a DP group hold different experts at the same offsets): a bucket
 * is all-reduced in runs, the dense weights' over DP x CP, the experts' over ctx->edp (nothing to
 * do where ctx->edp is one rank). Its sum is then the whole DP's tokens' (every EP rank's tokens
 * reach the expert through the all-to-all), so the 1/dp scaling is the same. ZeRO-2's slices and
 * Adasum are refused with experts at EP > 1 (by name: tpk__dp_experts_check).
 *
 *   tpk_dp_init(ctx, b)          (optional) the buckets over every parameter this rank holds
 *   tpk_dp_begin(ctx, b, last)   before a micro-step's backward; last = the step's last micro-batch
 *   tpk_dp_grad_ready            the model's grad_ready hook (tpk_gpt2.lm.grad_ready, user = b):
 *                                on the last micro-batch, records parameters first..last as
 *                                reported and starts the all-reduce of their gradients (contiguous
 *                                in the flat buffer); tpk_dp_grad_ready_all: every parameter at
 *                                once, for a model without the hook, after its backward
 *   tpk_dp_finish(ctx, b)        waits for every bucket and checks the step; the gradients are then
 *                                the DP sums, the same on every DP rank (scale by 1 / dp.size, e.g.
 *                                in AdamW; under ZeRO-2 the slice's, below); tpk_train_step calls
 *                                it when the caller did not
 * With one DP rank nothing is started, and every check below still runs (a misuse does not depend
 * on the DP size).
 *
 * The check. Every parameter of the registry (ctx->params: all are trained, there is no frozen
 * one) must be reduced exactly once a step, so the buckets keep one bit per parameter this rank
 * holds (a pipeline stage: its stage's parameters and the tied embedding's copy; ranges are ids).
 * tpk_dp_begin(..., true) clears the bits; each report sets its range's, refusing a range any of
 * whose parameters is already set (reported twice, overlapping ranges) before it starts anything;
 * tpk_dp_finish fails, naming the parameter, when one bit is clear (a range never reported), when
 * no micro-batch was begun as the last (no begin, or only last = false), when called twice, or
 * when a report of the step was refused (the refusal is kept: a model that drops the hook's
 * status still gets it). tpk_train_step consumes the reduced gradients: it finishes a begun step
 * itself and refuses, naming the parameter, a plain or ZeRO-2 DP step (not ZeRO-1 or Adasum:
 * those reduce the whole buffer after the backward) with more than one DP rank whose last
 * micro-batch was not begun; with one DP rank and nothing begun there is nothing to reduce (a
 * model without the hook). While a last micro-batch is begun and not finished,
 * ctx->params.dp_open is set and tpk_adamw_step refuses the gradients. A pipeline's schedule
 * (tpk/train/pipe_model.h) sets `active` around each chunk's last micro-batch instead of calling
 * tpk_dp_begin (with more than one DP rank): the first report so made begins the step's bits.
 * The checks are this rank's: a misuse on some DP ranks only leaves the others' collectives
 * waiting, as any mismatch of collectives does.
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
 * power-of-two DP size. Two equal gradients give that gradient, orthogonal ones their sum: no
 * 1/dp scaling. The hook of Adasum buckets starts nothing but still records and checks. Under
 * context parallelism a CP rank's gradient is a part of its DP rank's, not an estimate of its
 * own: the parts are summed over ctx->cp first (one all-reduce of the buffer), then Adasum runs
 * over ctx->dp (the same on every CP rank).
 *
 * ZeRO-2 (buckets linked to an optimizer's gradient slice: tpk_dp_shard_grads, tpk/train/train.h):
 * the hook starts a reduce-scatter over DP instead of the all-reduce. DP rank q owns the slice
 * S_q = tpk_split(numel, dp, q) of the flat buffer (ZeRO-1's); a bucket [off, end) is sent whole
 * with counts |[off, end) n S_q| (in rank order, they tile the bucket), and each rank receives the
 * DP sum of its part into the slice buffer zg (element e at zg[e - z0]), zeroed when the last
 * micro-batch begins (the gaps between parameters no bucket covers stay zero). The flat gradient
 * buffer is only read: it keeps this rank's own (unreduced) sums. A parameter whose gradient
 * takes another sum first — partial over TP (tp_partial_grad, a key/value head several TP ranks
 * hold) or a pipeline's tied embedding copy, summed over the two stages — is recorded and checked
 * like the others but left out of the buckets (a bucket around it splits in two); tpk_train_step
 * reduce-scatters these after their other sum (tpk__dp_zero_deferred). The checks are the same. */
#ifndef TPK_DP_H
#define TPK_DP_H

#include "../layers/norm.h"
#include "optim.h"

typedef enum tpk_dp_state {
    TPK_DP_IDLE = 0, /* no step begun, or the last one consumed (tpk_train_step) */
    TPK_DP_ACCUM,    /* micro-batches begun, not yet the last */
    TPK_DP_LAST,     /* the step's last micro-batch: reports recorded, all-reduces started */
    TPK_DP_FINISHED  /* every parameter reduced once, checked: the gradients are the DP sums */
} tpk_dp_state;

typedef struct tpk_dp_buckets {
    tpk_request *req; /* [cap] started all-reduces */
    int n, cap;
    bool active;      /* this micro-step is the step's last: the hook records (and reduces) */
    bool adasum;      /* tpk_dp_adasum_init: the reduction is Adasum after the backward; the hook
                         starts nothing */
    tpk_comm *pairs;  /* [levels] Adasum: level k pairs this DP rank with rank ^ 2^k */
    int levels;
    tpk_dp_state state;
    uint64_t *seen;   /* [words] bit i: parameter i reported on the step's last micro-batch */
    int np, words;    /* the parameters this rank held when the last micro-batch began; words
                         allocated */
    char err[256];    /* the first report refused on the last micro-batch ("": none) */
    tpk_allocator al; /* the allocator of the context b's arrays come from (copied when b holds
                         none): tpk_dp_destroy's */
    /* ZeRO-2 (tpk_dp_shard_grads): reduce-scatters into an optimizer's gradient slice */
    float *zg;             /* f32 [zn] backend memory (the optimizer's); NULL: all-reduces */
    size_t z0, zn, znumel; /* the slice [z0, z0 + zn) of a flat buffer of znumel elements */
    size_t *zcounts;       /* [zdp] host: a reduce-scatter's counts */
    int zdp;
    uint64_t *defer;       /* [words] bit i: parameter i is summed elsewhere first (see above) */
    int tied;              /* 1 + the id of this stage's copy of a pipeline's tied embedding
                              (tpk_pipe_model_set_dp; 0: none) */
} tpk_dp_buckets;

/* b's arrays come from ctx's allocator: kept in b when it holds none yet. */
static inline void tpk__dp_al(const tpk_ctx *ctx, tpk_dp_buckets *b) {
    if (!b->req && !b->pairs && !b->seen && !b->defer && !b->zcounts) b->al = tpk__allocator(ctx);
}

/* "parameter "w" and the 3 others this rank holds" (or that none is registered) into buf. */
static inline const char *tpk__dp_who(const tpk_ctx *ctx, char *buf, size_t n) {
    int np = ctx->params.n;
    if (!np) snprintf(buf, n, "no parameter (none registered)");
    else if (np == 1) snprintf(buf, n, "parameter \"%s\"", ctx->params.list[0].name);
    else
        snprintf(buf, n, "parameter \"%s\" and the %d others this rank holds",
                 ctx->params.list[0].name, np - 1);
    return buf;
}

/* Room for one bit per parameter of ctx (reported, and deferred under ZeRO-2). */
static inline tpk_status tpk__dp_bits(tpk_ctx *ctx, tpk_dp_buckets *b, const char *fn) {
    int w = (ctx->params.n + 63) / 64;
    w = w ? w : 1;
    if (w > b->words || !b->seen || !b->defer) {
        tpk__dp_al(ctx, b);
        size_t was = sizeof(uint64_t) * (size_t)b->words, now = sizeof(uint64_t) * (size_t)w;
        uint64_t *s = (uint64_t *)tpk__al_realloc(&b->al, b->seen, b->seen ? was : 0, now);
        if (s) b->seen = s;
        uint64_t *d =
            s ? (uint64_t *)tpk__al_realloc(&b->al, b->defer, b->defer ? was : 0, now) : NULL;
        if (d) b->defer = d;
        if (!s || !d)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d parameters' bits", ctx->params.n);
        b->words = w;
    }
    return TPK_OK;
}

/* Under ZeRO-2: whether parameter i's gradient is summed elsewhere before DP's reduction (partial
 * over TP, a pipeline's tied copy), so the buckets leave it to tpk_train_step. */
static inline bool tpk__dp_deferred(const tpk_ctx *ctx, const tpk_dp_buckets *b, int i) {
    const tpk_param *p = &ctx->params.list[i];
    return i + 1 == b->tied ||
           (ctx->tp.size > 1 && (p->tp_partial_grad || tpk__param_shared(ctx, p)));
}

/* The step's last micro-batch begins: every parameter's bit cleared, the gradients open; under
 * ZeRO-2 the slice zeroed and the deferred parameters marked. */
static inline tpk_status tpk__dp_open(tpk_ctx *ctx, tpk_dp_buckets *b, const char *fn) {
    TPK_TRY(tpk__dp_experts_check(ctx, fn, b->adasum ? "Adasum" : NULL));
    TPK_TRY(tpk__dp_bits(ctx, b, fn));
    memset(b->seen, 0, sizeof *b->seen * (size_t)b->words);
    memset(b->defer, 0, sizeof *b->defer * (size_t)b->words);
    int dps = tpk__zero_group(ctx)->size; /* DP x CP, or HSDP's shard group */
    if (b->zg && dps > 1 && !ctx->params.gat) { /* (sharded gradients: ZeRO-3 reduces them) */
        if (b->znumel != ctx->params.numel || b->zdp != dps)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "buckets: linked (tpk_dp_shard_grads) to the gradient slice of %zu "
                             "elements over %d DP ranks, the context has %zu over %d (link them "
                             "again after registering)",
                             b->znumel, b->zdp, ctx->params.numel, dps);
        for (int i = 0; i < ctx->params.n; i++)
            if (tpk__dp_deferred(ctx, b, i)) b->defer[i / 64] |= (uint64_t)1 << (i % 64);
        if (b->zn) TPK_TRY(tpk_op_fill(ctx, b->zg, TPK_F32, b->zn, 0.f));
    }
    b->np = ctx->params.n, b->err[0] = 0, b->state = TPK_DP_LAST;
    ctx->params.dp_open = true;
    return TPK_OK;
}

/* One more request slot in b->req. */
static inline tpk_status tpk__dp_req(tpk_ctx *ctx, tpk_dp_buckets *b, const char *fn) {
    if (b->n < b->cap) return TPK_OK;
    int cap = b->cap ? 2 * b->cap : 64;
    tpk__dp_al(ctx, b);
    tpk_request *r = (tpk_request *)tpk__al_realloc(&b->al, b->req, sizeof *r * (size_t)b->cap,
                                                    sizeof *r * (size_t)cap);
    if (!r) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d requests", cap);
    b->req = r, b->cap = cap;
    return TPK_OK;
}

/* ZeRO-2: the reduce-scatter over DP of parameters first..last's gradients (contiguous in the flat
 * buffer, the zero gaps between them included), each DP rank receiving the DP sum of the part
 * within its slice into b->zg; started into b->req[b->n]. Nothing when they hold no element (the
 * same on every DP rank: their shards are alike). */
static inline tpk_status tpk__dp_zero_start(tpk_ctx *ctx, tpk_dp_buckets *b, int first, int last,
                                            const char *fn) {
    const tpk_param *p0 = &ctx->params.list[first], *p1 = &ctx->params.list[last];
    size_t off = p0->offset, end = p1->offset + p1->numel;
    if (end <= off) return TPK_OK;
    tpk_comm *dg = tpk__zero_group(ctx);
    tpk__slice_counts(b->znumel, dg->size, off, end, b->zcounts);
    float *recv = b->zg + (b->zcounts[dg->rank] ? (off > b->z0 ? off - b->z0 : 0) : 0);
    TPK_TRY(tpk__dp_req(ctx, b, fn));
    memset(&b->req[b->n], 0, sizeof b->req[b->n]);
    TPK_TRY(tpk_reduce_scatterv_start(ctx, dg, (const float *)ctx->params.grad.p + off, end - off,
                                      recv, b->zcounts, TPK_F32, TPK_SUM, &b->req[b->n]));
    b->n++;
    return TPK_OK;
}

/* ZeRO-2: parameters first..last reduce-scattered, in runs of consecutive ones the buckets do
 * not defer (deferred: the runs of deferred ones instead). */
static inline tpk_status tpk__dp_zero_runs(tpk_ctx *ctx, tpk_dp_buckets *b, int first, int last,
                                           bool deferred, const char *fn) {
    for (int i = first; i <= last;) {
        if (((b->defer[i / 64] >> (i % 64)) & 1) != deferred) {
            i++;
            continue;
        }
        int j = i;
        while (j < last && ((b->defer[(j + 1) / 64] >> ((j + 1) % 64)) & 1) == deferred) j++;
        TPK_TRY(tpk__dp_zero_start(ctx, b, i, j, fn));
        i = j + 1;
    }
    return TPK_OK;
}

/* The buckets over every parameter this rank holds (ctx->params when called): what the model's
 * grad_ready hook reports, checked on each step's last micro-batch. Optional (tpk_dp_begin makes
 * the same on its first last micro-batch); call it once the model is built, so a step allocates
 * nothing. Not collective. */
static inline tpk_status tpk_dp_init(tpk_ctx *ctx, tpk_dp_buckets *b) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_init", "buckets: NULL");
    if (b->state == TPK_DP_LAST)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_init",
                         "buckets: a step's last micro-batch is still running: tpk_dp_finish it "
                         "first");
    return tpk__dp_bits(ctx, b, "tpk_dp_init");
}

static inline tpk_status tpk_dp_begin(tpk_ctx *ctx, tpk_dp_buckets *b, bool last_micro_step) {
    static const char *fn = "tpk_dp_begin";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "buckets: NULL");
    if (b->state == TPK_DP_LAST)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "buckets: the step's last micro-batch is still running (%d reductions "
                         "started): tpk_dp_finish it first",
                         b->n);
    if (last_micro_step) TPK_TRY(tpk__dp_open(ctx, b, fn));
    else b->state = TPK_DP_ACCUM;
    b->active = last_micro_step;
    return TPK_OK;
}

/* A report refused on the last micro-batch: kept for tpk_dp_finish, then returned. */
static inline tpk_status tpk__dp_refuse(tpk_ctx *ctx, tpk_dp_buckets *b, tpk_status s) {
    if (b->state == TPK_DP_LAST && !b->err[0])
        snprintf(b->err, sizeof b->err, "%.*s", (int)sizeof b->err - 1, ctx->err);
    return s;
}

/* The grad_ready hook: user is the tpk_dp_buckets. */
static inline tpk_status tpk_dp_grad_ready(tpk_ctx *ctx, int first, int last, void *user) {
    static const char *fn = "tpk_dp_grad_ready";
    tpk_dp_buckets *b = (tpk_dp_buckets *)user;
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "user: expected the tpk_dp_buckets, got NULL");
    if (b->active && b->state != TPK_DP_LAST) /* a pipeline's chunk: its last micro-batch */
        TPK_TRY(tpk__dp_open(ctx, b, fn));
    if (first < 0 || last < first || last >= ctx->params.n)
        return tpk__dp_refuse(ctx, b,
                              tpk__fail(ctx, TPK_ERR_ARG, fn,
                                        "first, last: expected 0 <= first <= last < %d, got %d, %d",
                                        ctx->params.n, first, last));
    if (!b->active) return TPK_OK; /* not the step's last micro-batch */
    if (last >= b->np)
        return tpk__dp_refuse(
            ctx, b,
            tpk__fail(ctx, TPK_ERR_ARG, fn,
                      "parameter \"%s\" (id %d): registered after the step's last micro-batch "
                      "began (%d parameters then)",
                      ctx->params.list[last].name, last, b->np));
    for (int i = first; i <= last; i++)
        if (b->seen[i / 64] >> (i % 64) & 1)
            return tpk__dp_refuse(
                ctx, b,
                tpk__fail(ctx, TPK_ERR_ARG, fn,
                          "parameter \"%s\" (id %d): reported twice on the step's last "
                          "micro-batch (first, last = %d, %d overlaps an earlier report): its "
                          "gradient would be reduced over DP twice",
                          ctx->params.list[i].name, i, first, last));
    for (int i = first; i <= last; i++) b->seen[i / 64] |= (uint64_t)1 << (i % 64);
    /* (ZeRO-3's sharded gradients, ctx->params.gat: each unit's reduce-scattered by ZeRO-3 as its
       backward ends, tpk/train/zero3.h; the report is checked here, nothing started) */
    if (tpk__dp_group(ctx)->size == 1 || b->adasum || ctx->params.gat) return TPK_OK;
    if (b->zg) { /* ZeRO-2: reduce-scattered into the slice */
        tpk_status z = tpk__dp_zero_runs(ctx, b, first, last, false, fn);
        return z == TPK_OK ? z : tpk__dp_refuse(ctx, b, z);
    }
    for (int i = first; i <= last;) { /* runs of one group: dense weights', experts' (EP > 1) */
        tpk_comm *grp = tpk__param_dp_group(ctx, i);
        int j = i;
        while (j < last && tpk__param_dp_group(ctx, j + 1) == grp) j++;
        const tpk_param *p0 = &ctx->params.list[i], *p1 = &ctx->params.list[j];
        size_t off = p0->offset, n = p1->offset + p1->numel - off;
        i = j + 1;
        if (grp->size == 1 || !n) continue; /* an expert held by one rank: its sum is made */
        tpk_status r = tpk__dp_req(ctx, b, fn);
        if (r != TPK_OK) return tpk__dp_refuse(ctx, b, r);
        float *g = (float *)ctx->params.grad.p + off;
        memset(&b->req[b->n], 0, sizeof b->req[b->n]);
        tpk_status s = tpk_allreduce_start(ctx, grp, g, g, n, TPK_F32, TPK_SUM, &b->req[b->n]);
        if (s != TPK_OK) return tpk__dp_refuse(ctx, b, s);
        b->n++;
    }
    return TPK_OK;
}

/* Every parameter of ctx reported at once (one bucket): for a model without the grad_ready
 * hook, after its backward of the step's last micro-batch. */
static inline tpk_status tpk_dp_grad_ready_all(tpk_ctx *ctx, tpk_dp_buckets *b) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_dp_grad_ready_all", "buckets: NULL");
    return ctx->params.n ? tpk_dp_grad_ready(ctx, 0, ctx->params.n - 1, b) : TPK_OK;
}

/* Wait for every started bucket (all are waited even when one fails), then check the step (the
 * header says what). Not collective beyond the waits. */
static inline tpk_status tpk_dp_finish(tpk_ctx *ctx, tpk_dp_buckets *b) {
    static const char *fn = "tpk_dp_finish";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "buckets: NULL");
    tpk_status s = TPK_OK;
    for (int i = 0; i < b->n; i++) {
        tpk_status w = tpk_wait(ctx, &b->req[i]);
        if (s == TPK_OK) s = w;
    }
    tpk_dp_state was = b->state;
    char who[160];
    b->n = 0, b->active = false;
    if (was == TPK_DP_FINISHED) /* the gradients stay the DP sums */
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "called twice: the gradients of %s were already reduced by this step's "
                         "tpk_dp_finish (tpk_dp_begin starts the next step)",
                         tpk__dp_who(ctx, who, sizeof who));
    b->state = TPK_DP_IDLE, ctx->params.dp_open = false;
    if (s != TPK_OK) return s;
    if (was == TPK_DP_IDLE) {
        /* a pipeline stage at one DP rank: its schedule begins no micro-batch (it marks a chunk's
         * last only when DP reduces), yet waits for the buckets before the tied embedding's sum */
        if (tpk__dp_group(ctx)->size == 1 && ctx->pp.size > 1) return TPK_OK;
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "no tpk_dp_begin this step: the gradients of %s are not reduced over DP "
                         "(begin the step's last micro-batch with tpk_dp_begin(ctx, b, true))",
                         tpk__dp_who(ctx, who, sizeof who));
    }
    if (was == TPK_DP_ACCUM)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "no micro-batch of this step was begun as the last (tpk_dp_begin(ctx, b, "
                         "true)): the gradients of %s are not reduced over DP",
                         tpk__dp_who(ctx, who, sizeof who));
    if (b->err[0])
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "a report of the step's last micro-batch was refused, the reduction is "
                         "not whole: %s",
                         b->err);
    int missing = 0, first = -1;
    for (int i = 0; i < b->np; i++)
        if (!(b->seen[i / 64] >> (i % 64) & 1)) missing++, first = first < 0 ? i : first;
    if (missing)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "parameter \"%s\" (id %d): never reported (tpk_dp_grad_ready) on the "
                         "step's last micro-batch: its gradient is not reduced over DP (%d of %d "
                         "parameters not reported)",
                         ctx->params.list[first].name, first, missing, b->np);
    if (b->np != ctx->params.n)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "parameter \"%s\" (id %d): registered after the step's last micro-batch "
                         "began: its gradient is not reduced over DP",
                         ctx->params.list[b->np].name, b->np);
    b->state = TPK_DP_FINISHED;
    return TPK_OK;
}

/* The optimizer step's side (tpk_train_step, fn): the gradients it may consume. A begun last
 * micro-batch is finished here; whole: the reduction is over the whole buffer after the backward
 * (ZeRO-1's reduce-scatter, Adasum), so the buckets need not have begun. The buckets are then
 * idle for the next step. */
static inline tpk_status tpk__dp_consume(tpk_ctx *ctx, tpk_dp_buckets *b, bool whole,
                                         const char *fn) {
    tpk_dp_state st = b->state;
    char who[160];
    if (st == TPK_DP_LAST) TPK_TRY(tpk_dp_finish(ctx, b));
    b->state = TPK_DP_IDLE;
    if (st == TPK_DP_LAST || st == TPK_DP_FINISHED || whole) return TPK_OK;
    if (st == TPK_DP_ACCUM)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "buckets: no micro-batch of this step was begun as the last "
                         "(tpk_dp_begin(ctx, b, true)): the gradients of %s are not reduced over "
                         "DP",
                         tpk__dp_who(ctx, who, sizeof who));
    if (tpk__dp_group(ctx)->size > 1 && ctx->params.n)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "buckets: no tpk_dp_begin this step: the gradients of %s are not reduced "
                         "over the %d DP ranks (begin the step's last micro-batch with "
                         "tpk_dp_begin(ctx, b, true))",
                         tpk__dp_who(ctx, who, sizeof who), tpk__dp_group(ctx)->size);
    return TPK_OK;
}

/* ZeRO-2, after the buckets are finished and the other sums made (the TP-partial gradients
 * summed, a pipeline's tied copies added): the deferred parameters' gradients reduce-scattered
 * into the slice (started, then all waited). Collective over the DP group (DP x CP). */
static inline tpk_status tpk__dp_zero_deferred(tpk_ctx *ctx, tpk_dp_buckets *b, const char *fn) {
    if (!b->zg || tpk__zero_group(ctx)->size == 1 || !b->np || ctx->params.gat) return TPK_OK;
    tpk_status s = tpk__dp_zero_runs(ctx, b, 0, b->np - 1, true, fn);
    for (int i = 0; i < b->n; i++) {
        tpk_status w = tpk_wait(ctx, &b->req[i]);
        if (s == TPK_OK) s = w;
    }
    b->n = 0;
    return s;
}

/* Link b to a gradient slice zg [zn] = elements [z0, z0 + zn) of the flat buffer of numel (ZeRO-2;
 * zg NULL: unlinked, all-reduces). tpk_dp_shard_grads (tpk/train/train.h) calls it. */
static inline tpk_status tpk__dp_slice_set(tpk_ctx *ctx, tpk_dp_buckets *b, float *zg, size_t z0,
                                           size_t zn, size_t numel, const char *fn) {
    if (b->state == TPK_DP_LAST)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "buckets: a step's last micro-batch is still running: tpk_dp_finish it "
                         "first");
    if (b->adasum)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "buckets: made for Adasum (tpk_dp_adasum_init): a reduce-scatter cannot "
                         "carry Adasum's per-tensor combination");
    int d = tpk__zero_group(ctx)->size;
    if (zg && d > b->zdp) {
        tpk__dp_al(ctx, b);
        size_t *c = (size_t *)tpk__al_realloc(&b->al, b->zcounts, sizeof *c * (size_t)b->zdp,
                                              sizeof *c * (size_t)d);
        if (!c) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d counts", d);
        b->zcounts = c;
    }
    if (zg) b->zdp = d;
    b->zg = zg, b->z0 = z0, b->zn = zn, b->znumel = numel;
    return tpk__dp_bits(ctx, b, fn);
}

static inline void tpk_dp_destroy(tpk_dp_buckets *b) {
    if (!b) return;
    for (int k = 0; k < b->levels; k++) tpk_comm_destroy(&b->pairs[k]);
    tpk__al_free(&b->al, b->req), tpk__al_free(&b->al, b->pairs), tpk__al_free(&b->al, b->seen);
    tpk__al_free(&b->al, b->defer), tpk__al_free(&b->al, b->zcounts);
    memset(b, 0, sizeof *b);
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
    tpk__dp_al(ctx, b);
    b->pairs = (tpk_comm *)tpk__al_calloc(&b->al, (size_t)(levels ? levels : 1), sizeof *b->pairs);
    if (!b->pairs) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d communicators", levels);
    for (; b->levels < levels; b->levels++)
        TPK_TRY(tpk_comm_split(ctx, &ctx->dp, r & ~(1 << b->levels), r, &b->pairs[b->levels]));
    b->adasum = true;
    return TPK_OK;
}

/* Adasum over the DP group of the whole gradient buffer (see above). Collective over ctx->dp,
 * ctx->tp and ctx->cp. */
static inline tpk_status tpk_dp_adasum(tpk_ctx *ctx, tpk_dp_buckets *b) {
    static const char *fn = "tpk_dp_adasum";
    if (!ctx) return TPK_ERR_ARG;
    if (!b || !b->adasum)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "buckets: expected buckets made for Adasum (tpk_dp_adasum_init)");
    size_t n = ctx->params.numel;
    int np = ctx->params.n;
    double *sums = (double *)tpk__malloc(ctx, sizeof(double) * 3 * (size_t)(np ? np : 1));
    if (!sums) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d parameters' sums", np);
    float *g = (float *)ctx->params.grad.p;
    double *dsums = NULL; /* the sums in backend memory, downloaded once per level */
    tpk_status s = tpk_op_alloc(ctx, sizeof(double) * 3 * (size_t)(np ? np : 1), (void **)&dsums);
    if (s == TPK_OK) s = tpk__buf_reserve(ctx, &ctx->work[0], sizeof(float) * 2 * (n ? n : 1));
    if (s == TPK_OK) s = tpk__buf_reserve(ctx, &ctx->work[1], sizeof(float) * (n ? n : 1));
    if (s == TPK_OK && n && ctx->cp.size > 1) /* the DP rank's gradient: its CP ranks' parts */
        s = tpk_allreduce(ctx, &ctx->cp, g, g, n, TPK_F32, TPK_SUM);
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
    tpk__free(ctx, sums);
    tpk_op_free(ctx, dsums);
    return s;
}

#endif /* TPK_DP_H */
