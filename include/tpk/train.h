/* tpk/train.h — a training step's end in one call, after its last backward:
 *
 *   1. the data-parallel reduction of the gradients:
 *        plain       the all-reduce buckets the model's backward started (tpk/dp.h) are waited for;
 *        ZeRO-1      (tpk_adamw_desc.zero) one reduce-scatter of the whole gradient buffer over DP:
 *                    each DP rank gets the DP sum of its slice tpk_split(numel, dp, rank) — the
 *                    buckets must not have been started (tpk_dp_begin(..., false));
 *        Adasum      (buckets made by tpk_dp_adasum_init) tpk_dp_adasum over the whole buffer;
 *                    pass grad_scale 1: Adasum does not sum;
 *   2. the gradients partial over TP summed (tpk_params_reduce_partial_grads: SP norm weights,
 *      shared key/value heads) — after the buckets, before Adasum and ZeRO-1's reduce-scatter;
 *   3. the norm of grad_scale x the gradient over the whole model (tpk/optim.h's counting; under
 *      ZeRO-1 each rank counts its slice and the squares are summed over DP and TP: the same
 *      norm);
 *   4. clipping to `clip` (<= 0: none), folded into AdamW's gradient scale;
 *   5. AdamW on the f32 master weights (ZeRO-1: on this rank's slice, with its moments only, then
 *      one all-gather of the parameters over DP).
 * Communication per step over DP: plain, one all-reduce of the gradients (in buckets); ZeRO-1,
 * one reduce-scatter of the gradients and one all-gather of the parameters — the same volume,
 * with 1/dp of the optimizer state per rank. */
#ifndef TPK_TRAIN_H
#define TPK_TRAIN_H

#include "dp.h"
#include "norm.h"
#include "optim.h"

/* See above. *norm (may be NULL) = |grad_scale g| before clipping. Collective over ctx's mesh. */
static inline tpk_status tpk_train_step(tpk_ctx *ctx, tpk_adamw *opt, tpk_dp_buckets *b, float lr, float clip, float grad_scale, double *norm) {
    static const char *fn = "tpk_train_step";
    if (!ctx) return TPK_ERR_ARG;
    if (!opt || !opt->m) return tpk__fail(ctx, TPK_ERR_ARG, fn, "opt: expected an initialised optimizer");
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "buckets: NULL");
    if (!isfinite(grad_scale) || isnan(clip))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "grad_scale, clip: expected finite numbers, got %g, %g", (double)grad_scale, (double)clip);
    bool zero = opt->sn != opt->numel;
    if (zero && b->n) return tpk__fail(ctx, TPK_ERR_ARG, fn, "buckets: %d all-reduces started under ZeRO-1 (call tpk_dp_begin with last = false)", b->n);
    if (zero && b->adasum) return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn, "opt: ZeRO-1 with Adasum (a reduce-scatter cannot carry Adasum's per-tensor combination)");
    TPK_TRY(tpk_dp_finish(ctx, b));
    TPK_TRY(tpk_params_reduce_partial_grads(ctx)); /* whole tensors first: Adasum's dot products need them */
    if (b->adasum) TPK_TRY(tpk_dp_adasum(ctx, b));
    if (zero && opt->numel) TPK_TRY(tpk__dp_slices(ctx, (float *)ctx->params.grad.p, opt->numel, false)); /* reduce-scatter */
    double sq = 0;
    TPK_TRY(tpk__grad_sumsq(ctx, opt->s0, opt->s0 + opt->sn, &sq));
    if (zero) TPK_TRY(tpk_allreduce_host(ctx, &ctx->dp, &sq, 1, TPK_F64, TPK_SUM));
    TPK_TRY(tpk_allreduce_host(ctx, &ctx->tp, &sq, 1, TPK_F64, TPK_SUM));
    double n = sqrt(sq) * grad_scale;
    if (norm) *norm = n;
    if (!isfinite(n)) return tpk__fail(ctx, TPK_ERR_ARG, fn, "the gradient norm is %g (the loss diverged or a gradient is not finite)", n);
    return tpk_adamw_step(ctx, opt, lr, grad_scale * tpk_clip_factor(n, clip));
}

#endif /* TPK_TRAIN_H */
