/* tpk/optim.h — what a trainer's step needs after the backward: the gradient norm over the mesh,
 * clipping, AdamW with f32 master weights, learning-rate schedules.
 *
 * Gradient norm  |g|^2 = sum over TP ranks of ( sum over sharded parameters |g_r|^2
 *                                              + sum over replicated parameters |g|^2 on TP rank 0 )
 *   so a sharded parameter counts once per shard and a replicated one once in all (a grouped
 *   key/value weight: each head on the lowest rank holding it, tpk_shard_owned); DP replicas
 *   hold the same (reduced) gradient, so there is no DP sum. Squares are summed in double, one
 *   op call (and one wait for its result) per run of consecutive counted parameters.
 *   `scale` multiplies the gradient first (1/dp when the DP reduction summed).
 * Clipping       g *= min(1, max_norm / |g|), folded into AdamW's grad_scale.
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

#include "params.h"

/* ---- gradient norm and clipping ----------------------------------------------------------------- */

/* *norm = scale * |g| over the whole model (collective over ctx->tp). */
static inline tpk_status tpk_grad_norm(tpk_ctx *ctx, float scale, double *norm) {
    static const char *fn = "tpk_grad_norm";
    if (!ctx) return TPK_ERR_ARG;
    if (!norm) return tpk__fail(ctx, TPK_ERR_ARG, fn, "norm: NULL");
    double local = 0;
    for (int i = 0; i < ctx->params.n;) { /* one sumsq per run of consecutive counted parameters (at TP rank 0: one for all) */
        const tpk_param *p = &ctx->params.list[i];
        if (p->split_dim < 0 && ctx->tp.rank != 0) { /* replicated: TP rank 0 counts it */
            i++;
            continue;
        }
        if (tpk_layout_group(p->layout) > 1) { /* grouped: the key/value heads no lower rank also holds */
            tpk_range own = tpk_shard_owned(p->gshape[0], p->layout, ctx->tp.size, ctx->tp.rank);
            size_t inner = p->shape[0] ? p->numel / (size_t)p->shape[0] : 0;
            double s = 0;
            if (own.size && inner)
                TPK_TRY(tpk_op_sumsq(ctx, &s, tpk_param_grad(ctx, i) + (size_t)own.off * inner, (size_t)own.size * inner));
            local += s, i++;
            continue;
        }
        size_t off = p->offset, n = 0;
        for (; i < ctx->params.n && !(ctx->params.list[i].split_dim < 0 && ctx->tp.rank != 0) && tpk_layout_group(ctx->params.list[i].layout) == 1; i++)
            n += ctx->params.list[i].numel;
        double s = 0;
        if (n) TPK_TRY(tpk_op_sumsq(ctx, &s, (const float *)ctx->params.grad.p + off, n));
        local += s;
    }
    TPK_TRY(tpk_allreduce_host(ctx, &ctx->tp, &local, 1, TPK_F64, TPK_SUM));
    *norm = sqrt(local) * scale;
    return TPK_OK;
}

/* The factor that clips a gradient of norm `norm` to max_norm (1 when max_norm <= 0 or the
 * norm is within it). */
static inline float tpk_clip_factor(double norm, float max_norm) {
    return max_norm > 0 && norm > max_norm ? (float)(max_norm / norm) : 1.0f;
}

/* ---- learning-rate schedules ------------------------------------------------------------------------ */

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
    double span = s->steps > s->warmup ? (double)(s->steps - s->warmup) : 1.0, r = (double)(step - s->warmup) / span;
    if (r > 1) r = 1;
    double c = s->kind == TPK_LR_LINEAR ? 1 - r : 0.5 * (1 + cos(3.141592653589793 * r)), lo = s->lr * s->min_lr_frac;
    return (float)(lo + (s->lr - lo) * c);
}

/* ---- AdamW ------------------------------------------------------------------------------------------------ */

typedef struct tpk_adamw_desc {
    float b1, b2;       /* default 0.9, 0.95 (0 = default) */
    float eps;          /* default 1e-8 */
    float weight_decay; /* on decayed parameters; 0 = none */
} tpk_adamw_desc;

typedef struct tpk_adamw {
    tpk_adamw_desc d;
    float *m, *v;  /* f32 [params.numel] moments in backend memory, laid out like the parameters */
    size_t numel;
    int64_t step;  /* optimizer steps done */
    int64_t *decay, nruns; /* [2 nruns] in backend memory: the element runs [start, end) of the decayed parameters */
} tpk_adamw;

/* Moments for every parameter registered so far (register the model first), zeroed. */
static inline tpk_status tpk_adamw_init(tpk_ctx *ctx, tpk_adamw *o, const tpk_adamw_desc *desc) {
    static const char *fn = "tpk_adamw_init";
    tpk_adamw_desc d;
    TPK__INIT_LAYER(ctx, fn, o, d, desc);
    if (!(d.b1 >= 0 && d.b1 < 1) || !(d.b2 >= 0 && d.b2 < 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->b1, b2: expected in [0, 1), got %g, %g", (double)d.b1, (double)d.b2);
    if (!(d.eps >= 0) || !(d.weight_decay >= 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->eps, weight_decay: expected >= 0, got %g, %g", (double)d.eps, (double)d.weight_decay);
    o->d = d;
    if (!o->d.b1) o->d.b1 = 0.9f;
    if (!o->d.b2) o->d.b2 = 0.95f;
    if (!o->d.eps) o->d.eps = 1e-8f;
    o->numel = ctx->params.numel;
    size_t bytes = sizeof(float) * (o->numel ? o->numel : 1);
    TPK_TRY(tpk_op_alloc(ctx, bytes, (void **)&o->m));
    TPK_TRY(tpk_op_alloc(ctx, bytes, (void **)&o->v));
    /* the decayed runs: consecutive decayed parameters merged (their offsets are contiguous) */
    int64_t *runs = (int64_t *)malloc(sizeof(int64_t) * 2 * (size_t)(ctx->params.n ? ctx->params.n : 1)), n = 0;
    if (!runs) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    for (int i = 0; i < ctx->params.n; i++) {
        const tpk_param *p = &ctx->params.list[i];
        if (!p->decay || !p->numel) continue;
        if (n && runs[2 * n - 1] == (int64_t)p->offset) runs[2 * n - 1] += (int64_t)p->numel;
        else runs[2 * n] = (int64_t)p->offset, runs[2 * n + 1] = (int64_t)(p->offset + p->numel), n++;
    }
    tpk_status s = TPK_OK;
    if (n) s = tpk_op_alloc(ctx, sizeof(int64_t) * 2 * (size_t)n, (void **)&o->decay);
    if (s == TPK_OK && n) s = tpk_op_memcpy(ctx, o->decay, runs, sizeof(int64_t) * 2 * (size_t)n, ctx->ops->device ? TPK_H2D : TPK_H2H);
    free(runs);
    o->nruns = n;
    return s;
}

/* One step on every parameter: lr from the schedule, grad_scale = the DP average x the clipping
 * factor. The weights change: a bf16 context remakes its copy before the next forward. */
static inline tpk_status tpk_adamw_step(tpk_ctx *ctx, tpk_adamw *o, float lr, float grad_scale) {
    static const char *fn = "tpk_adamw_step";
    if (!ctx) return TPK_ERR_ARG;
    if (!o || !o->m) return tpk__fail(ctx, TPK_ERR_ARG, fn, "opt: expected an initialised optimizer");
    if (o->numel != ctx->params.numel)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "opt: made for %zu parameter elements, the context has %zu (register the model first)", o->numel,
                         ctx->params.numel);
    if (!(lr >= 0) || !isfinite(grad_scale)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "lr, grad_scale: expected lr >= 0 and a finite scale, got %g, %g", (double)lr, (double)grad_scale);
    o->step++;
    if (o->numel) /* no decayed parameter: no decay anywhere (wd 0 with a NULL table) */
        TPK_TRY(tpk_op_adamw(ctx, (float *)ctx->params.data.p, (const float *)ctx->params.grad.p, o->m, o->v, o->numel, lr, o->d.b1, o->d.b2, o->d.eps,
                             o->nruns ? o->d.weight_decay : 0.0f, o->step, grad_scale, o->decay, o->nruns));
    tpk_params_updated(ctx);
    return TPK_OK;
}

static inline void tpk_adamw_destroy(tpk_ctx *ctx, tpk_adamw *o) {
    if (!ctx || !o) return;
    tpk_op_free(ctx, o->m), tpk_op_free(ctx, o->v), tpk_op_free(ctx, o->decay);
    o->m = o->v = NULL, o->decay = NULL, o->nruns = 0;
}

#endif /* TPK_OPTIM_H */
