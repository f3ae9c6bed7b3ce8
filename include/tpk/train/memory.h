/* tpk/train/memory.h — what a rank's memory holds through a whole run, by kind:
 *   weights    the flat f32 parameter buffer and a bf16 context's copy; under ZeRO-3 instead the
 *              f32 shard (4 bytes an element of this rank's slice);
 *   gathered   ZeRO-3's gathered buffers, at most during a step: the two block slots, the rest
 *              unit's own, the blocks kept for the backward, a bf16 context's copies in them
 *              (tpk_zero3_bytes less the shard); 0 without ZeRO-3;
 *   gradients  the flat gradient buffer, the scratch beside it, ZeRO-2's reduced slice (4 bytes an
 *              element of this rank's slice); under ZeRO-3's sharded gradients the flat buffer is
 *              freed and its block buffers, the rest's and the reduce-scatters' count instead
 *              (tpk_zero3_grad_bytes);
 *   optimizer  AdamW's moments m and v: 2 x 4 bytes an element of this rank's slice (ZeRO-1 on).
 * The rest of a step's peak is activations and work buffers (peak - the four). The trainer's peak
 * line (tpk/train/report.h) and the planner's parts (tpk/plan/plan.h) both read them here. */
#ifndef TPK_TRAIN_MEMORY_H
#define TPK_TRAIN_MEMORY_H

#include "zero3.h"

typedef struct tpk_mem_held {
    double weights, grads, optim, gathered; /* bytes */
} tpk_mem_held;

/* *out = the bytes ctx's parameters, opt (NULL: none) and z3 (NULL or not made: no ZeRO-3)
 * hold. */
static inline tpk_status tpk_mem_held_get(tpk_ctx *ctx, const tpk_adamw *opt, const tpk_zero3 *z3,
                                          tpk_mem_held *out) {
    if (!ctx) return TPK_ERR_ARG;
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_mem_held_get", "out: NULL");
    const tpk_params *q = &ctx->params;
    size_t zw = 0, shard = 0, sn = opt && opt->m ? (opt->sn ? opt->sn : 1) : 0;
    if (z3 && z3->u) {
        TPK_TRY(tpk_zero3_bytes(ctx, z3, &zw));
        shard = sizeof(float) * (z3->sn ? z3->sn : 1); /* tpk_zero3_bytes' first part */
    }
    out->weights = (double)(q->data.bytes + q->data16.bytes + shard);
    out->gathered = (double)(zw - shard);
    out->grads = (double)(q->grad.bytes + q->scratch.bytes + tpk_zero3_grad_bytes(z3)) +
                 (opt && opt->g ? sizeof(float) * (double)sn : 0.0);
    out->optim = 2.0 * sizeof(float) * (double)sn;
    return TPK_OK;
}

#endif /* TPK_TRAIN_MEMORY_H */
