/* tpk/train/optim.h — what a trainer's step needs after the backward: the gradient norm over the
 * mesh, clipping, AdamW with f32 master weights, learning-rate schedules.
 *
 * Gradient norm  |g|^2 = sum over TP ranks of ( sum over sharded parameters |g_r|^2
 *                                              + sum over replicated parameters |g|^2 on TP rank 0
 *                                              )
 *   so a sharded parameter counts once per shard and a replicated one once in all (a grouped
 *   key/value weight: each head on the lowest rank holding it, tpk_shard_owned); the replicas of
 *   a weight (ctx->dp_cp: DP x CP) hold the same (reduced) gradient, so there is no DP sum.
 *   Squares are summed in double, one op call per run of consecutive counted parameters, into a
 *   sum left in backend memory and all-reduced there over TP (the host reads it only when asked).
 *   `scale` multiplies the gradient first (1/dp when the DP reduction summed).
 * The data-parallel group (tpk__dp_group): the ranks holding the same weights, ctx->dp_cp — DP x
 *   CP under context parallelism, the DP group itself without. A CP rank's gradient is its rows'
 *   part of its DP rank's (the loss is the mean over every CP rank's tokens), so the reduction
 *   over it is a sum, scaled 1/dp as before (not 1/(dp cp)); ZeRO slices over it.
 * Clipping       g *= min(1, max_norm / |g|), folded into AdamW's gradient scale: in tpk_train_step
 *   by the AdamW op itself from the sum of squares in backend memory, so a step never waits for the
 *   norm; a step whose norm is not finite is skipped there and reported when the norm is read.
 * AdamW          m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *                w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd w)
 *   on the f32 master weights; weight decay only on parameters registered with decay (2-D
 *   weights); the moments are flat buffers laid out like the parameters (so checkpoints gather
 *   them like the parameters); one op call (one launch on the GPU) for the whole buffer, the
 *   decayed element runs given to it as a table made once (tpk_adamw_init).
 * Schedules      linear warm-up over `warmup` steps to lr, then cosine (or linear) to
 *                lr * min_lr_frac at `steps`, or constant. */
#ifndef TPK_OPTIM_H
#define TPK_OPTIM_H

#include <math.h>

#include "../layers/params.h"

/* ---- gradient norm and clipping -------------------------------------------------------------- */

/* The group of a weight's replicas, over which its gradient is summed and ZeRO slices:
 * ctx->dp_cp (DP x CP; the DP group at cp = 1, or in a context made without it). */
static inline tpk_comm *tpk__dp_group(tpk_ctx *ctx) { return ctx->dp_cp ? ctx->dp_cp : &ctx->dp; }
/* The group ZeRO slices over: the DP x CP group (tpk__dp_group), under HSDP
 * (tpk_ctx_desc.zero_shard_size) its shard group, ctx->zshard, and under expert parallelism
 * (ctx->ep past one rank) the EDP group, ctx->edp: the ranks holding the same weights, the
 * experts' included (the EP ranks of a DP group hold different experts at the same offsets, so
 * a slice over DP x CP would mix them). */
static inline tpk_comm *tpk__zero_group(tpk_ctx *ctx) {
    if (ctx->ep.size > 1 && ctx->edp) return ctx->edp;
    return ctx->zshard ? ctx->zshard : tpk__dp_group(ctx);
}
/* The ranks holding the same slice in the other slicing groups, over which a slice's gradient
 * sums are all-reduced so that they are the DP x CP sums (NULL: none): HSDP's replica group
 * ctx->zrep, or at EP > 1 the EP group (the EDP groups' ranks of one EDP rank; for the dense
 * weights' elements alone: tpk__zero_replicas_reduce). */
static inline tpk_comm *tpk__zero_replicas(tpk_ctx *ctx) {
    if (ctx->ep.size > 1) return &ctx->ep;
    return ctx->zrep && ctx->zrep->size > 1 ? ctx->zrep : NULL;
}
/* The slice's gradient sums g (element e at g[e - lo], [lo, hi) of the flat buffer) all-reduced
 * over tpk__zero_replicas; at EP > 1 only the runs of the dense weights' elements (an expert's
 * sum over its replicas, the EDP group, is whole already; the EP ranks hold other experts at
 * those offsets). Nothing without replicas. */
static inline tpk_status tpk__zero_replicas_reduce(tpk_ctx *ctx, float *g, size_t lo, size_t hi) {
    tpk_comm *rep = tpk__zero_replicas(ctx);
    if (!rep || hi <= lo) return TPK_OK;
    if (ctx->ep.size == 1) return tpk_allreduce(ctx, rep, g, g, hi - lo, TPK_F32, TPK_SUM);
    size_t a = 0, b = 0; /* the dense run [a, b) being merged (the zero gaps within included) */
    for (int i = 0; i <= ctx->params.n; i++) {
        const tpk_param *p = i < ctx->params.n ? &ctx->params.list[i] : NULL;
        size_t pa = p ? p->offset : hi, pb = p ? p->offset + p->numel : hi;
        pa = pa < lo ? lo : pa > hi ? hi : pa, pb = pb < lo ? lo : pb > hi ? hi : pb;
        if (p && !p->expert) { /* dense: extends the run (or starts one) */
            if (b <= a) a = pa;
            b = pb;
            continue;
        }
        if (b > a) TPK_TRY(tpk_allreduce(ctx, rep, g + (a - lo), g + (a - lo), b - a, TPK_F32,
                                         TPK_SUM));
        a = b = 0;
    }
    return TPK_OK;
}

/* The group over which parameter i's gradient is summed: an expert's weight (tpk_param.expert)
 * over ctx->edp, its replicas (the same TP rank, stage and EP rank: other EP ranks hold other
 * experts), every other weight over tpk__dp_group. The same group at ep = 1. */
static inline tpk_comm *tpk__param_dp_group(tpk_ctx *ctx, int i) {
    return ctx->params.list[i].expert && ctx->ep.size > 1 && ctx->edp ? ctx->edp
                                                                      : tpk__dp_group(ctx);
}
/* Whether this rank holds an expert's weight at EP > 1 (*name: the first one's). */
static inline bool tpk__has_experts(const tpk_ctx *ctx, const char **name) {
    for (int i = 0; ctx->ep.size > 1 && i < ctx->params.n; i++)
        if (ctx->params.list[i].expert) return *name = ctx->params.list[i].name, true;
    return false;
}
/* What the DP reduction does not yet do with experts at EP > 1 (`what`, NULL: nothing refused):
 * Adasum's pairs over ctx->dp would combine different experts' gradients (each EP rank holds
 * other experts at the same offsets): refused by name. (ZeRO slices over ctx->edp instead:
 * tpk__zero_group.) */
static inline tpk_status tpk__dp_experts_check(tpk_ctx *ctx, const char *fn, const char *what) {
    const char *name = NULL;
    if (!what || !tpk__has_experts(ctx, &name)) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                     "parameter \"%s\": an expert's weight at EP %d: %s not yet with expert "
                     "parallelism (its pairs would combine different experts' gradients); use "
                     "the plain all-reduce (an expert's gradient summed over ctx->edp)",
                     name, ctx->ep.size, what);
}

/* Sum of squares of the gradient elements in [lo, hi) of the flat buffer that this rank counts
 * (a sharded parameter's whole shard, a replicated one on TP rank 0 only, a grouped key/value
 * weight its owned heads) into *sq, f64 in backend memory: one sumsq op per run of consecutive
 * counted elements, accumulating there (no host wait). Element e's gradient is g[e - lo] (the flat
 * gradient buffer from lo, or ZeRO-2's slice starting at lo). */
/* sel: the parameters counted — -1 all, 0 all but the experts' weights, 1 the experts' only; acc:
 * added to *sq (else *sq is set). */
static inline tpk_status tpk__grad_sumsq_sel(tpk_ctx *ctx, const float *g, size_t lo, size_t hi,
                                             double *sq, int sel, bool acc) {
    size_t r0 = 0, r1 = 0; /* the run being gathered */
    bool acc0 = acc;
    int last = -1; /* the parameter the run ends with, when it ends at that parameter's end */
    for (int i = 0; i <= ctx->params.n; i++) {
        size_t a = 0, b = 0; /* the counted elements of parameter i */
        if (i < ctx->params.n) {
            const tpk_param *p = &ctx->params.list[i];
            if (sel >= 0 && (int)p->expert != sel) continue;
            tpk__param_counted(ctx, i, &a, &b);
            a = a < lo ? lo : a > hi ? hi : a, b = b < a ? a : b > hi ? hi : b;
            if (a == b) continue;
            /* extends the run: it goes on from here, or only the zero gap before this parameter
             * lies between */
            if (r1 > r0 && (a == r1 || (last == i - 1 && a == p->offset))) {
                r1 = b, last = b == p->offset + p->numel ? i : -1;
                continue;
            }
            last = b == p->offset + p->numel ? i : -1;
        }
        if (r1 > r0) {
            TPK_TRY(tpk_op_sumsq(ctx, sq, g + (r0 - lo), r1 - r0, acc));
            acc = true;
        }
        r0 = a, r1 = b;
    }
    return acc ? TPK_OK : tpk_op_sumsq(ctx, sq, NULL, 0, acc0); /* nothing counted here: 0 */
}
static inline tpk_status tpk__grad_sumsq_in(tpk_ctx *ctx, const float *g, size_t lo, size_t hi,
                                            double *sq) {
    return tpk__grad_sumsq_sel(ctx, g, lo, hi, sq, -1, false);
}
/* The sum of squares of the whole model's gradient elements this rank counts in [lo, hi), with
 * the experts' at EP > 1 summed over ctx->ep (each EP rank holds other experts; the other weights
 * are alike on every EP rank): the experts' squares first, all-reduced over EP, then the rest
 * added. Collective over ctx->ep when this rank holds an expert's weight at EP > 1. */
static inline tpk_status tpk__grad_sumsq_ep(tpk_ctx *ctx, const float *g, size_t lo, size_t hi,
                                            double *sq) {
    const char *name = NULL;
    if (!tpk__has_experts(ctx, &name)) return tpk__grad_sumsq_in(ctx, g, lo, hi, sq);
    TPK_TRY(tpk__grad_sumsq_sel(ctx, g, lo, hi, sq, 1, false));
    TPK_TRY(tpk_allreduce(ctx, &ctx->ep, sq, sq, 1, TPK_F64, TPK_SUM));
    return tpk__grad_sumsq_sel(ctx, g, lo, hi, sq, 0, true);
}
static inline tpk_status tpk__grad_sumsq(tpk_ctx *ctx, size_t lo, size_t hi, double *sq) {
    return tpk__grad_sumsq_in(ctx, (const float *)ctx->params.grad.p + lo, lo, hi, sq);
}
/* The context's f64 [2] in backend memory: the gradient's sum of squares, the steps skipped since
 * the last read (zero-filled when first made). */
static inline tpk_status tpk__normsq(tpk_ctx *ctx, double **sq) {
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->normsq, 2 * sizeof(double)));
    *sq = (double *)ctx->normsq.p;
    return TPK_OK;
}

/* *norm = scale * |g| over the whole model (collective over ctx->tp, and ctx->pp: the stages;
 * DP replicas hold the same reduced gradient, so no DP sum; at EP > 1 the experts' squares summed
 * over ctx->ep). One download: the host waits. */
static inline tpk_status tpk_grad_norm(tpk_ctx *ctx, float scale, double *norm) {
    static const char *fn = "tpk_grad_norm";
    if (!ctx) return TPK_ERR_ARG;
    if (!norm) return tpk__fail(ctx, TPK_ERR_ARG, fn, "norm: NULL");
    if (ctx->params.gat)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "ctx->params: the gradients are sharded over DP (ZeRO-3, "
                         "tpk/train/zero3.h): tpk_train_step's norm (its *norm) is the whole "
                         "model's");
    double *sq, local = 0;
    TPK_TRY(tpk__normsq(ctx, &sq));
    TPK_TRY(tpk__grad_sumsq_ep(ctx, (const float *)ctx->params.grad.p, 0, ctx->params.numel, sq));
    TPK_TRY(tpk_allreduce(ctx, &ctx->tp, sq, sq, 1, TPK_F64, TPK_SUM));
    if (ctx->pp.size > 1) TPK_TRY(tpk_allreduce(ctx, &ctx->pp, sq, sq, 1, TPK_F64, TPK_SUM));
    TPK_TRY(tpk_op_memcpy(ctx, &local, sq, sizeof local, ctx->ops->device ? TPK_D2H : TPK_H2H));
    *norm = sqrt(local) * scale;
    return TPK_OK;
}

/* The factor that clips a gradient of norm `norm` to max_norm (1 when max_norm <= 0 or the
 * norm is within it). */
static inline float tpk_clip_factor(double norm, float max_norm) {
    return TPK__CLIP_FACTOR(norm, max_norm);
}

/* ---- learning-rate schedules ----------------------------------------------------------------- */

typedef enum tpk_lr_kind { TPK_LR_COSINE = 0, TPK_LR_LINEAR, TPK_LR_CONSTANT } tpk_lr_kind;

typedef struct tpk_lr_schedule {
    tpk_lr_kind kind;
    float lr;          /* peak */
    float min_lr_frac; /* the end value is lr * min_lr_frac */
    int64_t warmup;    /* steps of linear warm-up from lr / warmup */
    int64_t steps;     /* the step the decay ends at */
} tpk_lr_schedule;

/* The learning rate of optimizer step `step` (0-based). */
static inline float tpk_lr_at(const tpk_lr_schedule *s, int64_t step) {
    if (step < s->warmup) return s->lr * (float)(step + 1) / (float)s->warmup;
    if (s->kind == TPK_LR_CONSTANT) return s->lr;
    double span = s->steps > s->warmup ? (double)(s->steps - s->warmup) : 1.0,
           r = (double)(step - s->warmup) / span;
    if (r > 1) r = 1;
    double c = s->kind == TPK_LR_LINEAR ? 1 - r : 0.5 * (1 + cos(3.141592653589793 * r)),
           lo = s->lr * s->min_lr_frac;
    return (float)(lo + (s->lr - lo) * c);
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

typedef struct tpk_adamw_desc {
    float b1, b2;       /* default 0.9, 0.95 (0 = default) */
    float eps;          /* default 1e-8 */
    float weight_decay; /* on decayed parameters; 0 = none */
    bool zero;          /* ZeRO-1 (the distributed optimizer) over the weight's replicas,
                           tpk__dp_group = ctx->dp_cp (DP x CP; ctx->dp at cp = 1): this rank keeps
                           the moments of, and updates, only its slice tpk_split(numel, g, g_rank)
                           of the flat parameter buffer (g = DP x CP ranks); see
                           tpk/train/train.h. With one such rank: as without */
    int zero_stage;     /* 0: `zero` says (1 when set, else none); 1: ZeRO-1; 2: ZeRO-2, the
                           gradients too: the DP buckets (tpk/train/dp.h, linked by tpk_dp_zero)
                           reduce-scatter each bucket under the backward into this rank's slice of
                           the reduced gradient (tpk_adamw.g, 1/dp of the gradients), the slice
                           that the norm and AdamW read. With one DP rank: as without; 3: ZeRO-3,
                           ZeRO-2's slices and the weights sharded too (tpk_zero3_init,
                           tpk/train/zero3.h, links its shard as tpk_adamw.w): no all-gather after
                           the step, the next forward gathers block by block */
} tpk_adamw_desc;

typedef struct tpk_adamw {
    tpk_adamw_desc d;
    float *m, *v;  /* f32 [sn] moments in backend memory, laid out like elements [s0, s0 + sn) of
                      the parameters */
    size_t numel;  /* the flat parameter buffer's elements */
    size_t s0, sn; /* this rank's slice of it: everything, or under ZeRO-1 its DP rank's share */
    int64_t step;  /* optimizer steps done */
    int64_t *decay, nruns; /* [2 nruns] in backend memory: the element runs [start, end) of the
                              decayed parameters */
    int stage;     /* the ZeRO stage asked (0, 1, 2); sharded only past one DP rank */
    float *g;      /* ZeRO-2 past one DP rank: f32 [sn] in backend memory, this rank's slice of the
                      DP-summed gradient (the buckets' reduce-scatters write it; after AdamW the
                      all-gather's scratch); NULL otherwise (the gradient is read from the flat
                      gradient buffer's slice) */
    float *w;      /* ZeRO-3: f32 [sn] the slice of the master weights (tpk_zero3's shard), updated
                      in place and not gathered; NULL: the flat parameter buffer's slice */
    /* ZeRO-3's sharded gradients: the reduce-scatters still in flight when the backward ends
       (the last blocks', the rest's) waited and added into g; tpk_train_step calls it before it
       reads g (tpk_zero3 sets it; NULL: none) */
    tpk_status (*grads_wait)(tpk_ctx *ctx, void *user);
    void *grads_wait_user;
    bool grads_replicated; /* HSDP: grads_wait's step all-reduced g across the shard groups
                              already (each unit's part as its reduce-scatter ended) */
} tpk_adamw;

/* ZeRO-1 proper: the moments sliced and the gradients reduce-scattered whole after the backward
 * (ZeRO-2 reduces them in the buckets; at one DP rank nothing is sliced). */
static inline bool tpk__adamw_zero1(const tpk_adamw *o) { return o->sn != o->numel && !o->g; }

/* counts[q] = |[a, b) n S_q| for q < d, S_q = tpk_split(numel, d, q) rank q's slice of a flat
 * buffer of numel elements: each rank's part of the run [a, b) (in rank order they tile it), the
 * counts of a reduce-scatter or an all-gather of that run over the slicing group. */
static inline void tpk__slice_counts(size_t numel, int d, size_t a, size_t b, size_t *counts) {
    for (int q = 0; q < d; q++) {
        tpk_range r = tpk_split((int64_t)numel, d, q);
        size_t lo = (size_t)r.off, hi = lo + (size_t)r.size;
        lo = lo < a ? a : lo, hi = hi > b ? b : hi;
        counts[q] = hi > lo ? hi - lo : 0;
    }
}

/* ZeRO's exchanges over the DP group (tpk__dp_group: DP x CP) of a flat buffer x [n] split
 * tpk_split(n, dp, rank) (dp, rank: that group's):
 * all-gather: every rank's slice of x into every rank's x; reduce-scatter: the DP sum of x's
 * slice into this rank's slice (the rest of x unchanged). Through a scratch buffer of one slice
 * (no aliasing; `scratch`, else ctx->work[1]): the all-gather sends a copy of this rank's slice
 * and receives into x itself, so ZeRO-1's scratch is 1/dp of the parameters, not a second copy of
 * them (ZeRO-2's is its gradient slice, consumed by then). */
static inline tpk_status tpk__dp_slices_in(tpk_ctx *ctx, float *x, size_t n, bool gather,
                                           float *scratch) {
    tpk_comm *dg = tpk__zero_group(ctx);
    int d = dg->size;
    size_t *counts = (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)d);
    if (!counts) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_adamw (ZeRO)", "counts");
    for (int q = 0; q < d; q++) counts[q] = (size_t)tpk_split((int64_t)n, d, q).size;
    tpk_range me = tpk_split((int64_t)n, d, dg->rank);
    tpk_copy_dir dd = ctx->ops->device ? TPK_D2D : TPK_H2H;
    tpk_status s = scratch
                       ? TPK_OK
                       : tpk__buf_reserve(ctx, &ctx->work[1], sizeof(float) * (size_t)me.size + 16);
    float *tmp = scratch ? scratch : (float *)ctx->work[1].p;
    if (s == TPK_OK && gather && me.size)
        s = tpk_op_memcpy(ctx, tmp, x + me.off, sizeof(float) * (size_t)me.size, dd);
    if (s == TPK_OK && gather)
        s = tpk_allgatherv(ctx, dg, tmp, (size_t)me.size, x, counts, n, TPK_F32);
    if (s == TPK_OK && !gather)
        s = tpk_reduce_scatterv(ctx, dg, x, n, tmp, counts, TPK_F32, TPK_SUM);
    if (s == TPK_OK && !gather && me.size)
        s = tpk_op_memcpy(ctx, x + me.off, tmp, sizeof(float) * (size_t)me.size, dd);
    tpk__free(ctx, counts);
    return s;
}
static inline tpk_status tpk__dp_slices(tpk_ctx *ctx, float *x, size_t n, bool gather) {
    return tpk__dp_slices_in(ctx, x, n, gather, NULL);
}
static inline tpk_status tpk__dp_allgather_slices(tpk_ctx *ctx, float *x, size_t n) {
    return tpk__dp_slices(ctx, x, n, true);
}

/* Moments for every parameter registered so far (register the model first), zeroed. */
static inline tpk_status tpk_adamw_init(tpk_ctx *ctx, tpk_adamw *o, const tpk_adamw_desc *desc) {
    static const char *fn = "tpk_adamw_init";
    tpk_adamw_desc d;
    TPK__INIT_LAYER(ctx, fn, o, d, desc);
    if (!(d.b1 >= 0 && d.b1 < 1) || !(d.b2 >= 0 && d.b2 < 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->b1, b2: expected in [0, 1), got %g, %g",
                         (double)d.b1, (double)d.b2);
    if (!(d.eps >= 0) || !(d.weight_decay >= 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->eps, weight_decay: expected >= 0, got %g, %g",
                         (double)d.eps, (double)d.weight_decay);
    o->d = d;
    if (!o->d.b1) o->d.b1 = 0.9f;
    if (!o->d.b2) o->d.b2 = 0.95f;
    if (!o->d.eps) o->d.eps = 1e-8f;
    if (d.zero_stage < 0 || d.zero_stage > 3)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->zero_stage: expected 0 (as desc->zero says), 1, 2 or 3, got %d",
                         d.zero_stage);
    o->stage = d.zero_stage ? d.zero_stage : d.zero ? 1 : 0;
    TPK_TRY(tpk_params_trim(ctx)); /* the registration's slack freed */
    o->numel = ctx->params.numel;
    tpk_comm *dg = tpk__zero_group(ctx); /* DP x CP, or HSDP's shard group */
    tpk_range sl = o->stage ? tpk_split((int64_t)o->numel, dg->size, dg->rank)
                            : TPK_LIT(tpk_range){0, (int64_t)o->numel};
    o->s0 = (size_t)sl.off, o->sn = (size_t)sl.size;
    size_t bytes = sizeof(float) * (o->sn ? o->sn : 1);
    TPK_TRY(tpk_op_alloc(ctx, bytes, (void **)&o->m));
    TPK_TRY(tpk_op_alloc(ctx, bytes, (void **)&o->v));
    tpk__mem_count(ctx, 2 * bytes, true); /* the moments in tpk_mem_peak: ZeRO-1's saving shows */
    if (o->stage >= 2 && dg->size > 1) {  /* ZeRO-2 and 3: the reduced gradient's slice */
        TPK_TRY(tpk_op_alloc(ctx, bytes, (void **)&o->g));
        tpk__mem_count(ctx, bytes, true);
    }
    /* the decayed runs: consecutive decayed parameters merged (their offsets are contiguous) */
    int64_t *runs = (int64_t *)tpk__malloc(ctx, sizeof(int64_t) * 2 * (size_t)ctx->params.n), n = 0;
    if (!runs) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    int last = -1; /* the last decayed parameter, when it ends the last run */
    for (int i = 0; i < ctx->params.n; i++) { /* within the slice, relative to its start */
        const tpk_param *p = &ctx->params.list[i];
        int64_t a = (int64_t)p->offset - (int64_t)o->s0, b = a + (int64_t)p->numel;
        a = a < 0 ? 0 : a, b = b > (int64_t)o->sn ? (int64_t)o->sn : b;
        if (!p->decay || b <= a) continue;
        /* merged across the zero gap between two decayed parameters (decay leaves a zero at
         * zero) */
        if (n && (runs[2 * n - 1] == a || last == i - 1)) runs[2 * n - 1] = b;
        else runs[2 * n] = a, runs[2 * n + 1] = b, n++;
        last = i;
    }
    tpk_status s = TPK_OK;
    if (n) s = tpk_op_alloc(ctx, sizeof(int64_t) * 2 * (size_t)n, (void **)&o->decay);
    if (s == TPK_OK && n)
        s = tpk_op_memcpy(ctx, o->decay, runs, sizeof(int64_t) * 2 * (size_t)n,
                          ctx->ops->device ? TPK_H2D : TPK_H2H);
    tpk__free(ctx, runs);
    o->nruns = n;
    return s;
}

/* One step on the parameters (this rank's slice under ZeRO-1), g read as g * s: s = grad_scale
 * (norm = NULL), or from the gradient's sum of squares left in backend memory (norm, f64 [2]: see
 * tpk_ops.adamw — clipped to `clip`, a step whose norm is not finite skipped and counted in
 * norm[1]). The weights change: a bf16 context remakes its copy before the next forward. */
static inline tpk_status tpk__adamw_step(tpk_ctx *ctx, tpk_adamw *o, float lr, float grad_scale,
                                         double *norm, float clip, const char *fn) {
    if (!ctx) return TPK_ERR_ARG;
    if (!o || !o->m)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "opt: expected an initialised optimizer");
    if (o->numel != ctx->params.numel)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "opt: made for %zu parameter elements, the context has %zu (register the model first)",
            o->numel, ctx->params.numel);
    if (!(lr >= 0) || !isfinite(grad_scale))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "lr, grad_scale: expected lr >= 0 and a finite scale, got %g, %g",
                         (double)lr, (double)grad_scale);
    if (ctx->params.dp_open && ctx->params.n) /* (tpk/train/dp.h) */
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "ctx->params: the data-parallel reduction of the gradients (parameters "
                         "\"%s\" to \"%s\") was begun and not finished: they are not the DP sums "
                         "yet (tpk_dp_finish them first)",
                         ctx->params.list[0].name, ctx->params.list[ctx->params.n - 1].name);
    if (ctx->params.tp_partial_open) /* (tpk/layers/norm.h) */
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn,
                         "ctx->params: expected layout R for every gradient, got P: the gradients "
                         "marked partial over TP (sequence-parallel or partial_dy norms) were "
                         "added to by a backward and not summed (tpk_params_reduce_partial_grads "
                         "first)");
    if (o->stage == 3 && !o->w)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "opt: a ZeRO-3 optimizer not linked to its weights' shard "
                         "(tpk_zero3_init first)");
    o->step++;
    float *w = o->w ? o->w : (float *)ctx->params.data.p + o->s0;
    /* a bf16 context's weight copy made by the update itself when it is current (a skipped step
     * then leaves both as they were) and no DP rank updates only a slice (ZeRO-1 gathers f32
     * weights) */
    tpk_params *P = &ctx->params;
    bool fuse16 = ctx->dtype == TPK_BF16 && o->sn == o->numel && !o->w && !P->stale16 &&
                  P->data16.p &&
                  P->data16.bytes >= 2 * P->numel;
    /* the slice's gradient: ZeRO-2 keeps its own */
    const float *g = o->g ? o->g : (const float *)ctx->params.grad.p + o->s0;
    if (o->sn) /* no decayed parameter: no decay anywhere (wd 0 with a NULL table) */
        TPK_TRY(tpk_op_adamw(ctx, w, g, o->m, o->v, o->sn, lr, o->d.b1, o->d.b2, o->d.eps,
                             o->nruns ? o->d.weight_decay : 0.0f, o->step, grad_scale, norm, clip,
                             o->decay, o->nruns, fuse16 ? (uint16_t *)P->data16.p + o->s0 : NULL));
    if (!fuse16) tpk_params_updated(ctx);
    if (o->sn == o->numel || o->w) return TPK_OK; /* ZeRO-3: the slice stays sharded */
    /* ZeRO-1 and 2: every DP rank's updated slice to every DP rank (one all-gather of the
     * parameters; ZeRO-2 sends from its gradient slice, consumed now) */
    return tpk__dp_slices_in(ctx, (float *)ctx->params.data.p, o->numel, true, o->g);
}
/* One step on every parameter: lr from the schedule, grad_scale = the DP average x the clipping
 * factor (computed by the caller; tpk_train_step clips without a host wait). */
static inline tpk_status tpk_adamw_step(tpk_ctx *ctx, tpk_adamw *o, float lr, float grad_scale) {
    if (ctx && o && o->grads_wait) /* ZeRO-3's sharded gradients: its reduce-scatters finished */
        TPK_TRY(o->grads_wait(ctx, o->grads_wait_user));
    return tpk__adamw_step(ctx, o, lr, grad_scale, NULL, 0.0f, "tpk_adamw_step");
}

/* The moments of the whole flat buffer in backend memory: the optimizer's own, or under ZeRO-1
 * (a slice per DP rank) buffers made for it (*made set; free them with tpk_op_free): zeros, and
 * with gather = true every DP rank's slice gathered in (collective over tpk__dp_group). */
static inline tpk_status tpk__adamw_whole(tpk_ctx *ctx, const tpk_adamw *o, bool gather, float **m,
                                          float **v, bool *made) {
    *m = o->m, *v = o->v, *made = o->sn != o->numel;
    if (!*made) return TPK_OK;
    *m = *v = NULL;
    size_t bytes = sizeof(float) * (o->numel ? o->numel : 1);
    tpk_copy_dir dd = ctx->ops->device ? TPK_D2D : TPK_H2H;
    tpk_status s = tpk_op_alloc(ctx, bytes, (void **)m);
    if (s == TPK_OK) s = tpk_op_alloc(ctx, bytes, (void **)v);
    for (int k = 0; k < 2 && s == TPK_OK && gather; k++) {
        float *w = k ? *v : *m;
        if (o->sn) s = tpk_op_memcpy(ctx, w + o->s0, k ? o->v : o->m, sizeof(float) * o->sn, dd);
        if (s == TPK_OK) s = tpk__dp_allgather_slices(ctx, w, o->numel);
    }
    if (s != TPK_OK) tpk_op_free(ctx, *m), tpk_op_free(ctx, *v), *m = *v = NULL, *made = false;
    return s;
}
/* Back from whole moments made by tpk__adamw_whole: this rank's slice kept, the buffers freed. */
static inline tpk_status tpk__adamw_keep_slice(tpk_ctx *ctx, tpk_adamw *o, float *m, float *v) {
    tpk_copy_dir dd = ctx->ops->device ? TPK_D2D : TPK_H2H;
    tpk_status s = TPK_OK;
    if (o->sn) s = tpk_op_memcpy(ctx, o->m, m + o->s0, sizeof(float) * o->sn, dd);
    if (s == TPK_OK && o->sn) s = tpk_op_memcpy(ctx, o->v, v + o->s0, sizeof(float) * o->sn, dd);
    tpk_op_free(ctx, m), tpk_op_free(ctx, v);
    return s;
}

static inline void tpk_adamw_destroy(tpk_ctx *ctx, tpk_adamw *o) {
    if (!ctx || !o) return;
    if (o->m && o->v) tpk__mem_count(ctx, 2 * sizeof(float) * (o->sn ? o->sn : 1), false);
    if (o->g) tpk__mem_count(ctx, sizeof(float) * (o->sn ? o->sn : 1), false);
    tpk_op_free(ctx, o->m), tpk_op_free(ctx, o->v), tpk_op_free(ctx, o->decay);
    tpk_op_free(ctx, o->g);
    o->m = o->v = o->g = NULL, o->decay = NULL, o->nruns = 0;
}

#endif /* TPK_OPTIM_H */
