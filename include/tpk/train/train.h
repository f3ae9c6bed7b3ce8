/* tpk/train/train.h — a training step's end in one call, after its last backward:
 *
 * "DP" below is the group of a weight's replicas, ctx->dp_cp (tpk__dp_group): DP x CP under
 * context parallelism, whose CP ranks' gradients are parts of their DP rank's (summed, not
 * averaged: grad_scale stays 1/dp), the DP group itself at cp = 1; ZeRO slices over it.
 * An expert's weight at EP > 1 is summed over ctx->edp instead (tpk/train/dp.h), its squares in
 * the norm over ctx->ep too (each EP rank holds other experts); ZeRO and Adasum with experts at
 * EP > 1 are refused by name (not yet).
 *   1. the data-parallel reduction of the gradients:
 *        plain       the all-reduce buckets the model's backward started (tpk/train/dp.h) are
 *                    waited for and checked (tpk_dp_finish, unless the caller did); with more
 *                    than one DP rank a step whose last micro-batch was not begun is refused,
 *                    naming a parameter;
 *        ZeRO-1      (tpk_adamw_desc.zero) one reduce-scatter of the whole gradient buffer over DP:
 *                    each DP rank gets the DP sum of its slice tpk_split(numel, dp, rank) — the
 *                    buckets must not have been started (tpk_dp_begin(..., false));
 *        ZeRO-2      (tpk_adamw_desc.zero_stage 2, the buckets linked by tpk_dp_shard_grads) the
 *                    buckets' reduce-scatters under the backward are waited for and checked as
 *                    plain DP's; the parameters they defer (partial over TP, a pipeline's tied
 *                    copy) are reduce-scattered after step 2 — each DP rank then holds the DP sum
 *                    of its slice in the optimizer's own buffer (tpk_adamw.g, 1/dp of the
 *                    gradients);
 *        Adasum      (buckets made by tpk_dp_adasum_init) tpk_dp_adasum over the whole buffer
 *                    (under CP the CP parts summed first, then Adasum over ctx->dp alone);
 *                    pass grad_scale 1: Adasum does not sum;
 *   2. the gradients partial over TP summed (tpk_params_reduce_partial_grads: SP norm weights,
 *      shared key/value heads) — after the buckets, before Adasum and ZeRO-1's (and ZeRO-2's
 *      deferred) reduce-scatter;
 *   3. the norm of grad_scale x the gradient over the whole model (tpk/train/optim.h's counting;
 *      under ZeRO-1 and 2 each rank counts its slice and the squares are summed over DP and TP
 *      (one more all-reduce of one f64): the same norm; with pipeline stages, summed over PP too,
 *      the tied embedding's copy not counted);
 *   4. clipping to `clip` (<= 0: none), folded into AdamW's gradient scale;
 *   5. AdamW on the f32 master weights (ZeRO-1 and 2: on this rank's slice, with its moments only,
 *      then one all-gather of the parameters over DP).
 * Steps 3 and 4 stay in backend memory: the sum of squares is all-reduced there and the AdamW op
 * computes the clipping factor from it, so the host never waits for the norm — unless it asks for
 * it (norm != NULL: one download, e.g. on a step that logs). A step whose norm is not finite (a
 * diverged loss, an overflowed gradient) leaves the weights and moments as they were and is
 * counted on the device; the next read of the norm (tpk_train_norm_read, or a step given a norm
 * pointer) fails with TPK_ERR_ARG saying how many steps were skipped.
 * Communication per step over DP: plain, one all-reduce of the gradients (in buckets); ZeRO-1,
 * one reduce-scatter of the gradients and one all-gather of the parameters — the same volume,
 * with 1/dp of the optimizer state per rank; ZeRO-2, the same reduce-scatter in the buckets under
 * the backward (as plain DP's all-reduce), the all-gather after AdamW. */
#ifndef TPK_TRAIN_H
#define TPK_TRAIN_H

#include "dp.h"
#include "../layers/norm.h"
#include "optim.h"

/* *norm = grad_scale x the gradient norm of the last tpk_train_step, from the sum of squares it
 * left in backend memory (one download: the host waits; not collective). Fails with TPK_ERR_ARG,
 * naming how many, when steps were skipped for a norm that was not finite since the last read (the
 * count then starts again). */
static inline tpk_status tpk_train_norm_read(tpk_ctx *ctx, float grad_scale, double *norm) {
    static const char *fn = "tpk_train_norm_read";
    if (!ctx) return TPK_ERR_ARG;
    if (!norm) return tpk__fail(ctx, TPK_ERR_ARG, fn, "norm: NULL");
    if (!ctx->normsq.p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "no training step has run (tpk_train_step)");
    double h[2] = {0, 0}, *sq = (double *)ctx->normsq.p;
    TPK_TRY(tpk_op_memcpy(ctx, h, sq, sizeof h, ctx->ops->device ? TPK_D2H : TPK_H2H));
    *norm = sqrt(h[0]) * grad_scale;
    if (h[1] == 0) return TPK_OK;
    const double restart[2] = {h[0], 0};
    TPK_TRY(tpk_op_memcpy(ctx, sq, restart, sizeof restart,
                          ctx->ops->device ? TPK_H2D : TPK_H2H)); /* the count starts again */
    return tpk__fail(
        ctx, TPK_ERR_ARG, fn,
        "the gradient norm was not finite (now %g) on %.0f step(s) since it was last read, which "
        "were skipped: "
        "the loss diverged or a gradient is not finite",
        *norm, h[1]);
}

/* ZeRO-2: the buckets b reduce-scatter each bucket over DP into opt's gradient slice (opt made with
 * tpk_adamw_desc.zero_stage = 2, for the context's parameters as registered now) instead of
 * all-reducing it. With one DP rank there is no slice and b stays as it is. Call it once the model
 * and opt are made, before a step's backward (and again after registering more parameters); not
 * collective. */
static inline tpk_status tpk_dp_shard_grads(tpk_ctx *ctx, tpk_dp_buckets *b, const tpk_adamw *opt) {
    static const char *fn = "tpk_dp_shard_grads";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "buckets: NULL");
    if (!opt || !opt->m)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "opt: expected an initialised optimizer");
    if (opt->stage != 2 && opt->stage != 3)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "opt: expected an optimizer made with zero_stage 2 (ZeRO-2), got ZeRO "
                         "stage %d",
                         opt->stage);
    if (opt->numel != ctx->params.numel)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "opt: made for %zu parameter elements, the context has %zu (register the model first)",
            opt->numel, ctx->params.numel);
    if (!opt->g) return TPK_OK; /* one DP rank: nothing sliced */
    return tpk__dp_slice_set(ctx, b, opt->g, opt->s0, opt->sn, opt->numel, fn);
}

/* See above. *norm (may be NULL: no host wait; tpk_train_norm_read reads it later) = |grad_scale g|
 * before clipping. Collective over ctx's mesh. */
static inline tpk_status tpk_train_step(tpk_ctx *ctx, tpk_adamw *opt, tpk_dp_buckets *b, float lr,
                                        float clip, float grad_scale, double *norm) {
    static const char *fn = "tpk_train_step";
    if (!ctx) return TPK_ERR_ARG;
    if (!opt || !opt->m)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "opt: expected an initialised optimizer");
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "buckets: NULL");
    if (!isfinite(grad_scale) || isnan(clip))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "grad_scale, clip: expected finite numbers, got %g, %g",
                         (double)grad_scale, (double)clip);
    bool zero = opt->sn != opt->numel, zero1 = tpk__adamw_zero1(opt); /* sliced; ZeRO-1 proper */
    if (b->zg != opt->g)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         opt->g ? "buckets: not linked to opt's gradient slice: ZeRO-2 needs "
                                  "tpk_dp_shard_grads(ctx, buckets, opt) before the step's backward"
                                : "buckets: linked to a ZeRO-2 gradient slice, but opt is not that "
                                  "ZeRO-2 optimizer");
    if (zero1 && b->n)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "buckets: %d all-reduces started under ZeRO-1 (call tpk_dp_begin with last = false)",
            b->n);
    if (zero && b->adasum)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "opt: ZeRO-%d with Adasum (a reduce-scatter cannot carry Adasum's "
                         "per-tensor combination)",
                         opt->stage);
    TPK_TRY(tpk__dp_experts_check(ctx, fn, b->adasum ? "Adasum" : NULL));
    /* the buckets' gradients checked (a begun step finished here); ZeRO-1 (asked, even at one DP
     * rank) and Adasum reduce the whole buffer below */
    TPK_TRY(tpk__dp_consume(ctx, b, zero1 || opt->stage == 1 || b->adasum, fn));
    opt->grads_replicated = false;
    if (opt->grads_wait) TPK_TRY(opt->grads_wait(ctx, opt->grads_wait_user)); /* ZeRO-3's */
    TPK_TRY(tpk_params_reduce_partial_grads(ctx)); /* whole tensors first: Adasum's dot products
                                                      need them */
    if (b->adasum) TPK_TRY(tpk_dp_adasum(ctx, b));
    if (zero1 && opt->numel)
        TPK_TRY(tpk__dp_slices(ctx, (float *)ctx->params.grad.p, opt->numel,
                               false)); /* reduce-scatter */
    if (opt->g) TPK_TRY(tpk__dp_zero_deferred(ctx, b, fn)); /* ZeRO-2: the rest of the slice */
    /* HSDP: the slice's sums over the shard group all-reduced across the shard groups */
    float *slice = opt->g ? opt->g : (float *)ctx->params.grad.p + opt->s0;
    if (zero && !opt->grads_replicated) /* (at EP > 1: the dense weights' elements across EP) */
        TPK_TRY(tpk__zero_replicas_reduce(ctx, slice, opt->s0, opt->s0 + opt->sn));
    double *sq;
    TPK_TRY(tpk__normsq(ctx, &sq));
    TPK_TRY(tpk__grad_sumsq_ep(ctx, slice, opt->s0, opt->s0 + opt->sn,
                               sq)); /* experts at EP > 1: over EP */
    if (zero) TPK_TRY(tpk_allreduce(ctx, tpk__zero_group(ctx), sq, sq, 1, TPK_F64, TPK_SUM));
    TPK_TRY(tpk_allreduce(ctx, &ctx->tp, sq, sq, 1, TPK_F64, TPK_SUM));
    /* pipeline stages: each holds its blocks' gradients */
    if (ctx->pp.size > 1) TPK_TRY(tpk_allreduce(ctx, &ctx->pp, sq, sq, 1, TPK_F64, TPK_SUM));
    /* clipped from sq, in backend memory */
    TPK_TRY(tpk__adamw_step(ctx, opt, lr, grad_scale, sq, clip, fn));
    return norm ? tpk_train_norm_read(ctx, grad_scale, norm) : TPK_OK;
}

#endif /* TPK_TRAIN_H */
