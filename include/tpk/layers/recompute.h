/* tpk/layers/recompute.h — a model's stack of L blocks, forward and backward, with optional
 * activation recompute (GPT-2's and Llama's blocks go through it).
 *
 *   TPK_RECOMPUTE_NONE       every block keeps what its backward needs (its layers' buffers).
 *   TPK_RECOMPUTE_SELECTIVE  every block keeps its GEMM outputs (QKV, the MLP's first projection
 *                            and its fused activation, the residual stream) and its inputs, but not
 *                            the cheap parts (Korthikanti et al. 2022): the norms' outputs, the
 *                            attention's output and log-sum-exp, a SwiGLU's product, the branch
 *                            outputs consumed by a residual add. Those buffers are "lent":
 *                            one set (the pool) serves every block — lent to block i for its
 *                            forward, and again for its backward, where the block first recomputes
 *                            them from what it kept (the norm forwards, the attention kernel from
 *                            the saved QKV, SwiGLU). Memory: one block's cheap activations
 *                            instead of L; the cost is those kernels again (no GEMM). (Under
 *                            sequence parallelism no mode keeps a gathered input: the column
 *                            linears gather theirs into the context's scratch in each call.)
 *   TPK_RECOMPUTE_FULL       forward: each block's input is copied into a checkpoint [T, H] (the
 *                            layout of the hidden states: R, or S(0) under sequence parallelism),
 *                            the block runs on buffers it borrows, its output is copied into the
 *                            next checkpoint; backward, from the last block: the block's forward
 *                            runs again from its checkpoint, then its backward. Memory: L + 2
 *                            tensors of [T, H] and one block's activations, instead of L blocks'
 *                            activations; the cost is one more forward of every block (and its
 *                            collectives).
 * A block's buffers are borrowed from pools (below), never allocated per step: in every mode the
 * backward's own buffers (input gradients, scratch) are one set that serves each block's backward
 * in turn — the backward holds one block's, not L blocks' — and the gradient between two blocks is
 * copied into one buffer (T H) so that the next block may reuse the memory it came from.
 * Dropout masks come from the counter RNG at the same ctx->rng_step (and the attention's saved
 * stream), so whatever is recomputed is the same computation: every number is bit-identical to
 * no recompute in every mode.
 * The stack's loops are the model's (tpk/models/lm.h: tpk__lm_stack_forward, _backward); here
 * are the modes, the pools and their helpers. */
#ifndef TPK_RECOMPUTE_H
#define TPK_RECOMPUTE_H

#include "../runtime/buf.h"

typedef enum tpk_recompute {
    TPK_RECOMPUTE_NONE = 0,
    TPK_RECOMPUTE_FULL = 1,
    TPK_RECOMPUTE_SELECTIVE = 2,
    TPK_RECOMPUTE_COUNT
} tpk_recompute;
static inline const char *tpk_recompute_name(tpk_recompute r) {
    return r == TPK_RECOMPUTE_NONE        ? "none"
           : r == TPK_RECOMPUTE_FULL      ? "full"
           : r == TPK_RECOMPUTE_SELECTIVE ? "selective"
                                          : "?";
}
/* "none", "selective" or "full" -> *r; false when the name is none of them */
static inline bool tpk_recompute_parse(const char *name, tpk_recompute *r) {
    for (int i = 0; i < TPK_RECOMPUTE_COUNT; i++)
        if (name && !strcmp(name, tpk_recompute_name((tpk_recompute)i)))
            return *r = (tpk_recompute)i, true;
    return false;
}

/* A block's buffers come in three sets (TPK__SET_*, tpk/runtime/buf.h), each lent from a pool of
 * the model's (one block at a time): NONE lends SCRATCH for each backward; SELECTIVE also LENT, for
 * the forward and the backward; FULL all three for both (nothing of a block outlives its forward
 * or backward). Each layer lists its own (tpk__<layer>_bufs), a block its layers'. */

/* A model's buffers for its stack: the checkpoints (full), the gradient between two blocks, the
 * pools of lent buffers. */
typedef struct tpk__stack_bufs {
    tpk_buf *ckpt;                             /* [L + 1] under FULL: block i's input, ckpt[L] the
                                                  last output */
    tpk_buf grad;                              /* the gradient between two blocks */
    tpk_buf pool[TPK__SETS][TPK__SET_MAX];     /* a pool per set */
} tpk__stack_bufs;

/* t's data copied into buffer b (grown); *out = t viewing b. */
static inline tpk_status tpk__stack_keep(tpk_ctx *ctx, tpk_buf *b, tpk_tensor t, tpk_tensor *out) {
    tpk_tensor c = t;
    TPK_TRY(tpk__buf_view(ctx, b, &c));
    size_t n = tpk_nbytes(&t);
    if (n) TPK_TRY(tpk_op_memcpy(ctx, c.data, t.data, n, ctx->ops->device ? TPK_D2D : TPK_H2H));
    *out = c;
    return TPK_OK;
}

/* The sets a block borrows for its forward and for its backward. */
static inline int tpk__stack_sets(tpk_recompute mode, bool backward) {
    if (mode == TPK_RECOMPUTE_FULL) return TPK__SET_LENT | TPK__SET_KEPT | TPK__SET_SCRATCH;
    return (mode == TPK_RECOMPUTE_SELECTIVE ? TPK__SET_LENT : 0) |
           (backward ? TPK__SET_SCRATCH : 0);
}

/* A model's stack buffers for L blocks: the checkpoint array allocated (its buffers empty). */
static inline tpk_status tpk__stack_bufs_init(tpk_ctx *ctx, const char *fn, tpk__stack_bufs *b,
                                              int64_t L) {
    memset(b, 0, sizeof *b);
    b->ckpt = (tpk_buf *)tpk__calloc(ctx, (size_t)L + 1, sizeof *b->ckpt);
    return b->ckpt ? TPK_OK
                   : tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%lld checkpoints", (long long)L + 1);
}
/* Free them: the checkpoints (ckpt [L + 1]), the gradient buffer, the pool. */
static inline void tpk__stack_bufs_free(tpk_ctx *ctx, tpk__stack_bufs *b, int64_t L) {
    for (int64_t i = 0; b->ckpt && i <= L; i++) tpk__buf_free(ctx, &b->ckpt[i]);
    tpk__free(ctx, b->ckpt), b->ckpt = NULL;
    tpk__buf_free(ctx, &b->grad);
    for (int k = 0; k < TPK__SETS; k++)
        for (int j = 0; j < TPK__SET_MAX; j++) tpk__buf_free(ctx, &b->pool[k][j]);
}

#endif /* TPK_RECOMPUTE_H */
