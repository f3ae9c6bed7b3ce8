/* tpk/train/pipeline.h — pipeline parallelism: the split of a model's blocks over the virtual
 * stages, and the executor that runs a schedule (tpk/train/schedule.h) on this rank's stage.
 *
 * The split: L blocks over U = P V virtual stages, contiguous, in order (first[u] .. first[u+1]-1
 * on virtual stage u, first[U] = L):
 *   even      L / U each, the L % U blocks left over one each to the stages after the first
 *             (the first also carries the embedding, the last the final norm, head and loss)
 *   a list    counts[u] blocks each (--pp-layers 5,7): every count >= 1, summing to L
 *   balanced  by a cost per block plus the first stage's and the last stage's own (the embedding;
 *             the head and loss): the contiguous split whose costliest stage costs least
 *             (SageMaker-style automatic partitioning), ties to the earliest stages' larger share
 *
 * The executor, tpk_pipe_run: this rank is stage ctx->pp.rank of the schedule. It walks its list:
 * a compute step calls the stage's forward or backward for (chunk, micro-batch); the messages
 * between two compute steps go as one batch over ctx->pp (tpk_p2p_run) and are waited for. Every
 * message holds stage->count elements of stage->dtype (a stage's activation, or its gradient:
 * under sequence parallelism each TP rank's S(0) slice, 1/t of the full tensor, to the same TP
 * rank of the next stage). Buffers, in backend memory: a received input stays valid (the stage may
 * keep views into it) until the backward of its (chunk, micro-batch) returns, then its buffer is
 * reused; a received gradient likewise; a stage's output (*y) and input gradient (*dx) are the
 * stage's own, read by the send after the step (or after the pair it runs in). A side
 * (tpk_pipe_stage.side) is a second part of f64 values after each message, in the same batch,
 * sent from and received into the stage's own places (side_buf). So a stage holds at
 * most as many inputs as it has micro-batches in flight (1F1B: P - s). A failing step stops this
 * rank: its peers then wait in their messages until the communicator's timeout (TPK_TIMEOUT), as
 * with a collective. */
#ifndef TPK_PIPELINE_H
#define TPK_PIPELINE_H

#include "schedule.h"

/* ---- the split of L blocks over U virtual stages --------------------------------------------- */

/* The greedy split under a bound on a stage's cost: each stage takes blocks while it stays within
 * the bound (at least one, and leaving one for each later stage), the last all that are left;
 * first[U + 1] filled. Whether every stage stays within the bound. */
static inline bool tpk__pipe_greedy(int64_t L, int U, const double *cost, double cost_first,
                                    double cost_last, double bound, int64_t *first) {
    bool fits = true;
    int64_t i = 0;
    first[0] = 0;
    for (int u = 0; u < U; u++) {
        double c = (u == 0 ? cost_first : 0) + (u == U - 1 ? cost_last : 0);
        int64_t n = 0;
        while (i < L - (U - 1 - u) && (n == 0 || u == U - 1 || c + cost[i] <= bound))
            c += cost[i++], n++;
        fits = fits && c <= bound;
        first[u + 1] = i;
    }
    return fits;
}

/* first[U + 1]: the first block of each virtual stage. counts (may be NULL): the list; cost (may be
 * NULL): cost[L] per block, cost_first and cost_last the first and last stage's extra. With
 * neither, even. The arguments named in errors are the trainer's (--pp, --virtual-stages,
 * --pp-layers). */
static inline tpk_status tpk_pipe_split(tpk_ctx *ctx, int64_t L, int U, const int64_t *counts,
                                        const double *cost, double cost_first, double cost_last,
                                        int64_t *first) {
    static const char *fn = "tpk_pipe_split";
    if (!first) return tpk__fail(ctx, TPK_ERR_ARG, fn, "first: NULL");
    if (U < 1) return tpk__fail(ctx, TPK_ERR_ARG, fn, "stages: expected >= 1, got %d", U);
    if (L < U)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "stages: %d virtual stages (pp x virtual stages) for %lld blocks: expected "
            "at most one stage per block",
            U, (long long)L);
    first[0] = 0;
    if (counts) {
        int64_t sum = 0;
        for (int u = 0; u < U; u++) {
            if (counts[u] < 1 || counts[u] > L - sum) /* a sum past L: never formed */
                return tpk__fail(ctx, TPK_ERR_ARG, fn,
                                 "pp-layers: entry %d is %lld, expected every stage to hold >= 1 "
                                 "block and the %d counts to add up to the %lld blocks (%lld "
                                 "left for entries %d..)",
                                 u, (long long)counts[u], U, (long long)L, (long long)(L - sum), u);
            sum += counts[u], first[u + 1] = sum;
        }
        if (sum != L)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "pp-layers: the %d counts add up to %lld, expected the %lld blocks", U,
                             (long long)sum, (long long)L);
        return TPK_OK;
    }
    if (!cost) {
        int64_t q = L / U, extra = L % U;
        for (int u = 0; u < U; u++) first[u + 1] = first[u] + q + (u >= 1 && u <= extra ? 1 : 0);
        return TPK_OK; /* extra < U: stages 1 .. extra take one more */
    }
    for (int64_t i = 0; i < L; i++)
        if (!(cost[i] >= 0) || isinf(cost[i]))
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "cost[%lld]: expected a finite cost >= 0, got %g", (long long)i,
                             cost[i]);
    if (!(cost_first >= 0 && cost_last >= 0) || isinf(cost_first) || isinf(cost_last))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cost_first, cost_last: expected finite costs >= 0, got %g, %g",
                         cost_first, cost_last);
    /* the least bound on a stage's cost that the greedy split fits: bisection */
    double lo = 0, hi = cost_first + cost_last;
    for (int64_t i = 0; i < L; i++) hi += cost[i];
    for (int it = 0; it < 200 && hi - lo > 1e-12 * (hi > 1 ? hi : 1); it++) {
        double mid = (lo + hi) / 2;
        if (tpk__pipe_greedy(L, U, cost, cost_first, cost_last, mid, first)) hi = mid;
        else lo = mid;
    }
    tpk__pipe_greedy(L, U, cost, cost_first, cost_last, hi, first);
    return TPK_OK;
}

/* ---- the executor ---------------------------------------------------------------------------- */

typedef struct tpk_pipe_stage {
    size_t count; /* elements of one message (this rank's activation or gradient) */
    tpk_dtype dtype;
    /* forward of micro-batch mb through this stage's chunk: x its input (NULL on the first virtual
     * stage: the stage reads its own data), in backend memory, valid until the backward of (chunk,
     * mb) returns; *y = its output (ignored on the last virtual stage), valid until the next
     * forward */
    tpk_status (*forward)(tpk_ctx *ctx, void *user, int chunk, int mb, const void *x,
                          const void **y);
    /* backward: dy the gradient of its output (NULL on the last virtual stage: from the loss);
     * *dx = the gradient of its input (ignored on the first virtual stage), valid until the next
     * backward */
    tpk_status (*backward)(tpk_ctx *ctx, void *user, int chunk, int mb, const void *dy,
                           const void **dx);
    void *user;
    /* Optional: a side message of `side` f64 values beside every message, the same way (a few
     * numbers that travel with the hidden states and their gradients: a mixture of experts'
     * routing sums, tpk/train/pipe_model.h); 0: none. side_buf(user, step) gives, for a message
     * step, the backend memory its side is sent from (filled by the step before) or received into
     * (read by the step after), one place per (chunk, micro-batch, action). */
    size_t side;
    void *(*side_buf)(void *user, tpk_pipe_step step);
} tpk_pipe_stage;

/* The executor's buffers, kept between runs (zero it before the first; tpk_pipe_free). */
typedef struct tpk_pipe {
    tpk_buf *slot; /* [nslot] receive buffers */
    bool *busy;    /* [nslot] */
    int nslot;
    int done[4], ndone; /* slots freed by the last backwards, reusable after the next batch */
    int *act, *grad; /* [V M] the slot holding (chunk, mb)'s input and its output's gradient; -1 */
    int cells;
    double t_compute, t_wait;    /* seconds of the last run: in compute steps, in messages */
    double t_f, t_b;             /* of which in forwards, in backwards */
    double (*clock)(void *user); /* the clock (NULL: the host's, seconds; a dry run's modelled
                                    one, tpk/plan) */
    void *clock_user;
} tpk_pipe;

static inline void tpk_pipe_free(tpk_ctx *ctx, tpk_pipe *p) {
    if (!p) return;
    for (int i = 0; i < p->nslot; i++) tpk__buf_free(ctx, &p->slot[i]);
    tpk__free(ctx, p->slot), tpk__free(ctx, p->busy), tpk__free(ctx, p->act);
    tpk__free(ctx, p->grad);
    memset(p, 0, sizeof *p);
}

/* A free receive buffer of `bytes` (grown as needed) -> its index. */
static inline tpk_status tpk__pipe_take(tpk_ctx *ctx, tpk_pipe *p, size_t bytes, int *out) {
    int i = 0;
    while (i < p->nslot && p->busy[i]) i++;
    if (i == p->nslot) {
        tpk_buf *s = (tpk_buf *)tpk__realloc(ctx, p->slot, sizeof *s * (size_t)i,
                                             sizeof *s * (size_t)(i + 1));
        if (s) p->slot = s;
        bool *b = s ? (bool *)tpk__realloc(ctx, p->busy, sizeof *b * (size_t)i,
                                           sizeof *b * (size_t)(i + 1))
                    : NULL;
        if (b) p->busy = b;
        if (!s || !b) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_pipe_run", "out of host memory");
        memset(&p->slot[i], 0, sizeof p->slot[i]), p->nslot++;
    }
    TPK_TRY(tpk__buf_reserve(ctx, &p->slot[i], bytes));
    p->busy[i] = true, *out = i;
    return TPK_OK;
}

static inline double tpk__pipe_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run this rank's list of the schedule s (stage ctx->pp.rank; s->P must be ctx->pp.size). */
static inline tpk_status tpk_pipe_run(tpk_ctx *ctx, tpk_pipe *p, const tpk_pipe_schedule *s,
                                      const tpk_pipe_stage *stage) {
    static const char *fn = "tpk_pipe_run";
    if (!ctx) return TPK_ERR_ARG;
    if (!p || !s || !stage || !s->n)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !p            ? "pipe"
                         : !s || !s->n ? "schedule"
                                       : "stage");
    if (s->P != ctx->pp.size)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "schedule: made for %d stages, the context's pipeline has %d", s->P,
                         ctx->pp.size);
    if (!stage->forward || !stage->backward || !tpk_dtype_valid(stage->dtype))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "stage: expected forward, backward and a dtype");
    if (stage->side && !stage->side_buf)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "stage->side_buf: NULL for a side of %zu values",
                         stage->side);
    int per = stage->side ? 2 : 1; /* the parts of one message */
    int r = ctx->pp.rank, cells = s->M * s->V;
    if (p->cells != cells) {
        tpk__free(ctx, p->act), tpk__free(ctx, p->grad);
        p->act = (int *)tpk__malloc(ctx, sizeof(int) * (size_t)cells);
        p->grad = (int *)tpk__malloc(ctx, sizeof(int) * (size_t)cells);
        p->cells = p->act && p->grad ? cells : 0;
        if (!p->cells) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    for (int i = 0; i < cells; i++) p->act[i] = p->grad[i] = -1;
    for (int i = 0; i < p->nslot; i++) p->busy[i] = false;
    p->ndone = 0;
    size_t bytes = stage->count * tpk_dtype_size(stage->dtype);
    const void *out[2] = {NULL, NULL}; /* the last forward's output, the last backward's dx */
    tpk_pipe_step last[2];             /* and their steps */
    memset(last, 0, sizeof last);
    last[0].action = last[1].action = -1;
    tpk_p2p ops[TPK_P2P_MAX];
    int nops = 0;
    p->t_compute = p->t_wait = p->t_f = p->t_b = 0;
    for (int i = 0; i < s->n[r]; i++) {
        tpk_pipe_step x = s->step[r][i];
        int cell = x.chunk * s->M + x.mb;
        bool first = tpk__pipe_first(s, r, x.chunk), lastv = tpk__pipe_last(s, r, x.chunk);
        double t0 = p->clock ? p->clock(p->clock_user) : tpk__pipe_now();
        if (x.action == TPK_PIPE_F || x.action == TPK_PIPE_B) {
            bool f = x.action == TPK_PIPE_F;
            /* no batch since the last backward: nothing of its is being sent */
            for (int k = 0; k < p->ndone; k++) p->busy[p->done[k]] = false;
            p->ndone = 0;
            int a = p->act[cell], g = p->grad[cell];
            const void *in = f ? (a >= 0 ? p->slot[a].p : NULL) : (g >= 0 ? p->slot[g].p : NULL);
            if (f ? !first && a < 0 : !lastv && g < 0)
                return tpk__fail(ctx, TPK_ERR_ARG, fn,
                                 "schedule: stage %d runs %s of micro-batch %d, chunk %d, before "
                                 "receiving its %s",
                                 r, f ? "the forward" : "the backward", x.mb, x.chunk,
                                 f ? "input" : "output gradient");
            out[!f] = NULL;
            TPK_TRY(f ? stage->forward(ctx, stage->user, x.chunk, x.mb, in, &out[0])
                      : stage->backward(ctx, stage->user, x.chunk, x.mb, in, &out[1]));
            if (!f) { /* the input and the gradient of (chunk, mb) are done with once the batch
                         after this step has gone (dx may be in the gradient's buffer) */
                if (a >= 0) p->done[p->ndone++] = a, p->act[cell] = -1;
                if (g >= 0) p->done[p->ndone++] = g, p->grad[cell] = -1;
            }
            if (f && s->forward_only && a >= 0) /* no backward: its input is done with */
                p->done[p->ndone++] = a, p->act[cell] = -1;
            last[!f] = x;
            double dt = (p->clock ? p->clock(p->clock_user) : tpk__pipe_now()) - t0;
            p->t_compute += dt, *(f ? &p->t_f : &p->t_b) += dt;
            continue;
        }
        tpk_p2p *o = &ops[nops];
        o->count = stage->count, o->dtype = stage->dtype, o->peer = tpk_pipe_peer(s, r, x.action);
        o->tag = tpk_pipe_tag(s, r, x);
        o->send = x.action == TPK_PIPE_SEND_ACT || x.action == TPK_PIPE_SEND_GRAD;
        if (o->send) {
            bool want_f = x.action == TPK_PIPE_SEND_ACT;
            tpk_pipe_step l = last[!want_f];
            if (l.chunk != x.chunk || l.mb != x.mb || l.action < 0)
                return tpk__fail(ctx, TPK_ERR_ARG, fn,
                                 "schedule: stage %d sends the %s of micro-batch %d, chunk %d, "
                                 "which is not its last %s",
                                 r, want_f ? "output" : "input gradient", x.mb, x.chunk,
                                 want_f ? "forward" : "backward");
            if (stage->count && !out[!want_f])
                return tpk__fail(ctx, TPK_ERR_ARG, fn,
                                 "stage: the %s of micro-batch %d, chunk %d returned no %s to send",
                                 want_f ? "forward" : "backward", x.mb, x.chunk,
                                 want_f ? "output" : "input gradient");
            o->buf = (void *)out[!want_f];
        } else {
            int *slot = x.action == TPK_PIPE_RECV_ACT ? &p->act[cell] : &p->grad[cell];
            if (*slot >= 0)
                return tpk__fail(ctx, TPK_ERR_ARG, fn,
                                 "schedule: stage %d receives the %s of micro-batch %d, chunk %d "
                                 "twice",
                                 r, x.action == TPK_PIPE_RECV_ACT ? "input" : "gradient", x.mb,
                                 x.chunk);
            TPK_TRY(tpk__pipe_take(ctx, p, bytes, slot));
            o->buf = p->slot[*slot].p;
        }
        nops++;
        if (stage->side) { /* its side, the same way and tag, after it (matched in order) */
            tpk_p2p *q = &ops[nops++];
            *q = *o, q->count = stage->side, q->dtype = TPK_F64;
            q->buf = stage->side_buf(stage->user, x);
        }
        bool end = i + 1 == s->n[r] || s->step[r][i + 1].action < TPK_PIPE_RECV_ACT;
        if (end || nops + per > TPK_P2P_MAX) {
            tpk_status st = tpk_p2p_run(ctx, &ctx->pp, ops, nops);
            nops = 0;
            for (int k = 0; k < p->ndone; k++) p->busy[p->done[k]] = false;
            p->ndone = 0;
            p->t_wait += (p->clock ? p->clock(p->clock_user) : tpk__pipe_now()) - t0;
            TPK_TRY(st);
        }
    }
    return TPK_OK;
}

#endif /* TPK_PIPELINE_H */
