/* tpk/recompute.h — a model's stack of L blocks, forward and backward, with optional full
 * activation recompute (GPT-2's and Llama's blocks go through it).
 *
 *   TPK_RECOMPUTE_NONE   every block keeps what its backward needs (its layers' buffers).
 *   TPK_RECOMPUTE_FULL   forward: each block's input is copied into a checkpoint [T, H] (the
 *                        layout of the hidden states: R, or S(0) under sequence parallelism), the
 *                        block runs, its output is copied into the next checkpoint and the block's
 *                        buffers are released; backward, from the last block: the block's forward
 *                        runs again from its checkpoint, then its backward, its input gradient is
 *                        copied out and its buffers released. Dropout masks come from the counter
 *                        RNG at the same ctx->rng_step, so the recomputed forward is the same
 *                        computation and every number is bit-identical to no recompute. Memory:
 *                        L + 2 tensors of [T, H] and one block's activations, instead of L
 *                        blocks' activations; the cost is one more forward of every block (and its
 *                        collectives) in the backward.
 * The block callbacks take the block index; `ready` (may be NULL) is called after block i's
 * backward with its gradients final (the data-parallel hook). */
#ifndef TPK_RECOMPUTE_H
#define TPK_RECOMPUTE_H

#include "buf.h"

typedef enum tpk_recompute { TPK_RECOMPUTE_NONE = 0, TPK_RECOMPUTE_FULL = 1, TPK_RECOMPUTE_COUNT } tpk_recompute;
static inline const char *tpk_recompute_name(tpk_recompute r) { return r == TPK_RECOMPUTE_NONE ? "none" : r == TPK_RECOMPUTE_FULL ? "full" : "?"; }

typedef struct tpk__stack {
    void *m;
    int64_t L;
    tpk_recompute mode;
    tpk_status (*fwd)(tpk_ctx *ctx, void *m, int64_t i, tpk_tensor x, tpk_tensor *y);
    tpk_status (*bwd)(tpk_ctx *ctx, void *m, int64_t i, tpk_tensor dy, tpk_tensor *dx);
    void (*release)(tpk_ctx *ctx, void *m, int64_t i); /* free block i's buffers (it stays usable) */
    tpk_status (*ready)(tpk_ctx *ctx, void *m, int64_t i);
    tpk_buf *ckpt; /* [L + 1] under FULL: block i's input, ckpt[L] the last output */
    tpk_buf grad;  /* under FULL: the gradient between two blocks */
} tpk__stack;

/* t's data copied into buffer b (grown); *out = t viewing b. */
static inline tpk_status tpk__stack_keep(tpk_ctx *ctx, tpk_buf *b, tpk_tensor t, tpk_tensor *out) {
    tpk_tensor c = t;
    TPK_TRY(tpk__buf_view(ctx, b, &c));
    size_t n = tpk_nbytes(&t);
    if (n) TPK_TRY(tpk_op_memcpy(ctx, c.data, t.data, n, ctx->ops->device ? TPK_D2D : TPK_H2H));
    *out = c;
    return TPK_OK;
}

static inline tpk_status tpk__stack_forward(tpk_ctx *ctx, tpk__stack *st, tpk_tensor x, tpk_tensor *y) {
    for (int64_t i = 0; i < st->L; i++) {
        if (st->mode == TPK_RECOMPUTE_FULL) {
            if (!i) TPK_TRY(tpk__stack_keep(ctx, &st->ckpt[0], x, &x)); /* later inputs were kept as outputs */
            TPK_TRY(st->fwd(ctx, st->m, i, x, &x));
            TPK_TRY(tpk__stack_keep(ctx, &st->ckpt[i + 1], x, &x));
            st->release(ctx, st->m, i);
        } else {
            TPK_TRY(st->fwd(ctx, st->m, i, x, &x));
        }
    }
    *y = x;
    return TPK_OK;
}

/* g: the gradient of the last forward's output; *dx: of its input. */
static inline tpk_status tpk__stack_backward(tpk_ctx *ctx, tpk__stack *st, tpk_tensor g, tpk_tensor *dx) {
    for (int64_t i = st->L - 1; i >= 0; i--) {
        if (st->mode == TPK_RECOMPUTE_FULL) {
            tpk_tensor x = g, y;
            x.data = st->ckpt[i].p; /* block i's input: the hidden states' shape and layout */
            TPK_TRY(st->fwd(ctx, st->m, i, x, &y)); /* the same forward again */
            TPK_TRY(st->bwd(ctx, st->m, i, g, &g));
            TPK_TRY(tpk__stack_keep(ctx, &st->grad, g, &g));
            st->release(ctx, st->m, i);
        } else {
            TPK_TRY(st->bwd(ctx, st->m, i, g, &g));
        }
        if (st->ready) TPK_TRY(st->ready(ctx, st->m, i));
    }
    *dx = g;
    return TPK_OK;
}

/* Free the checkpoints of a stack (ckpt [L + 1] and the gradient buffer). */
static inline void tpk__stack_free(tpk_ctx *ctx, tpk_buf *ckpt, int64_t L, tpk_buf *grad) {
    for (int64_t i = 0; ckpt && i <= L; i++) tpk__buf_free(ctx, &ckpt[i]);
    tpk__buf_free(ctx, grad);
}

#endif /* TPK_RECOMPUTE_H */
