/* tpk/train/step.h — one optimizer step of a model over M micro-batches, as the trainer runs it:
 * the one sequence of calls that examples/train.c makes each step and the planner's dry run
 * (tpk/plan/plan.h) walks on a counting backend, so the planned memory and ops are the run's.
 *
 *   1. the gradients zeroed (and the device loss sum, without stages);
 *   2. without stages: for each micro-batch k (ids, targets [M][B S] in host memory) with
 *      ctx->rng_step = rng_step + k, the forward (the loss stays on the device), the DP buckets
 *      begun on the last micro-batch (none under ZeRO-1: one reduce-scatter at the end instead),
 *      the backward with `scale`;
 *      with stages (pm != NULL): the pipeline's schedule over the M micro-batches
 *      (tpk_pipe_model_step; the DP buckets under each chunk's last backward, set by
 *      tpk_pipe_model_set_dp);
 *   3. tpk_train_step: the DP reduction, the norm, clipping and AdamW (norm: as there).
 * `scale` weighs a micro-batch's mean loss in the step's (1 / M for a plain mean over M equal
 * micro-batches and one DP rank; the trainer's: tokens of this DP rank's micro-batch over the
 * step's, and x DP under Adasum). The model's grad_ready hook must be the buckets'
 * (tpk_dp_grad_ready) without stages. Needs POSIX (tpk/train/model.h). */
#ifndef TPK_STEP_H
#define TPK_STEP_H

#include "pipe_model.h"
#include "train.h"

static inline tpk_status tpk_model_train_step(tpk_ctx *ctx, tpk_model *m, tpk_pipe_model *pm,
                                              tpk_adamw *opt, tpk_dp_buckets *b, const int32_t *ids,
                                              const int32_t *targets, int64_t B, int64_t S, int M,
                                              float scale, uint64_t rng_step, float lr, float clip,
                                              double *norm) {
    static const char *fn = "tpk_model_train_step";
    if (!ctx) return TPK_ERR_ARG;
    if ((!m && !pm) || !opt || !b || !ids || !targets)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !m && !pm ? "model"
                         : !opt    ? "opt"
                         : !b      ? "buckets"
                                   : "ids or targets");
    if (M < 1 || B < 1 || S < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "M, B, S: expected >= 1, got %d, %lld, %lld", M,
                         (long long)B, (long long)S);
    bool zero = opt->sn != opt->numel;  /* ZeRO-1: no buckets during the backward */
    size_t mbt = (size_t)B * (size_t)S; /* a micro-batch's tokens */
    TPK_TRY(tpk_params_zero_grad(ctx));
    if (pm) {
        TPK_TRY(tpk_pipe_model_step(ctx, pm, ids, targets, B, S, scale, rng_step, NULL));
    } else {
        tpk_lm *lm = tpk_model_lm(m); /* every family's model: its calls, direct */
        tpk_xent_loss_reset(&lm->ce);
        for (int k = 0; k < M; k++) {
            ctx->rng_step = rng_step + (uint64_t)k;
            TPK_TRY(tpk_lm_forward(ctx, lm, ids + (size_t)k * mbt, targets + (size_t)k * mbt, B, S,
                                   NULL));
            TPK_TRY(tpk_dp_begin(ctx, b, k == M - 1 && !zero));
            TPK_TRY(tpk_lm_backward(ctx, lm, scale));
        }
    }
    return tpk_train_step(ctx, opt, b, lr, clip, 1.0f, norm);
}

#endif /* TPK_STEP_H */
