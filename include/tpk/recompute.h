/* tpk/recompute.h — a model's stack of L blocks, forward and backward, with optional activation
 * recompute (GPT-2's and Llama's blocks go through it).
 *
 *   TPK_RECOMPUTE_NONE       every block keeps what its backward needs (its layers' buffers).
 *   TPK_RECOMPUTE_SELECTIVE  every block keeps its GEMM outputs (QKV, the MLP's first projection
 *                            and its fused activation, the residual stream) and its inputs, but not
 *                            the cheap parts (Korthikanti et al. 2022): the norms' outputs, the
 *                            attention's output and log-sum-exp, the all-gathered inputs of the
 *                            column linears under sequence parallelism, a SwiGLU's product, the
 *                            branch outputs consumed by a residual add. Those buffers are "lent":
 *                            one set (the pool) serves every block — lent to block i for its
 *                            forward, and again for its backward, where the block first recomputes
 *                            them from what it kept (the norm forwards, the attention kernel from
 *                            the saved QKV, the all-gathers again, SwiGLU). Memory: one block's
 *                            cheap activations instead of L; the cost is those kernels again
 *                            (no GEMM) and, under sequence parallelism, one more all-gather of
 *                            T H per column linear's input in the backward.
 *   TPK_RECOMPUTE_FULL       forward: each block's input is copied into a checkpoint [T, H] (the
 *                            layout of the hidden states: R, or S(0) under sequence parallelism), the
 *                            block runs, its output is copied into the next checkpoint and the block's
 *                            buffers are released; backward, from the last block: the block's forward
 *                            runs again from its checkpoint, then its backward, its input gradient is
 *                            copied out and its buffers released. Memory: L + 2 tensors of [T, H]
 *                            and one block's activations, instead of L blocks' activations; the cost
 *                            is one more forward of every block (and its collectives) in the backward.
 * In every mode but FULL (which releases a block's buffers) the buffers only a block's backward
 * uses — its input gradients and scratch — are lent the same way from one set (`scratch`): the
 * backward holds one block's, not L blocks', and the gradient between two blocks is copied into
 * one buffer (T H) so that the next block's scratch may reuse the memory it came from.
 * Dropout masks come from the counter RNG at the same ctx->rng_step (and the attention's saved
 * stream), so whatever is recomputed is the same computation: every number is bit-identical to
 * no recompute in both modes.
 * The block callbacks take the block index; `ready` (may be NULL) is called after block i's
 * backward with its gradients final (the data-parallel hook). */
#ifndef TPK_RECOMPUTE_H
#define TPK_RECOMPUTE_H

#include "buf.h"

typedef enum tpk_recompute { TPK_RECOMPUTE_NONE = 0, TPK_RECOMPUTE_FULL = 1, TPK_RECOMPUTE_SELECTIVE = 2, TPK_RECOMPUTE_COUNT } tpk_recompute;
static inline const char *tpk_recompute_name(tpk_recompute r) {
    return r == TPK_RECOMPUTE_NONE ? "none" : r == TPK_RECOMPUTE_FULL ? "full" : r == TPK_RECOMPUTE_SELECTIVE ? "selective" : "?";
}
/* "none", "selective" or "full" -> *r; false when the name is none of them */
static inline bool tpk_recompute_parse(const char *name, tpk_recompute *r) {
    for (int i = 0; i < TPK_RECOMPUTE_COUNT; i++)
        if (name && !strcmp(name, tpk_recompute_name((tpk_recompute)i))) return *r = (tpk_recompute)i, true;
    return false;
}

enum { TPK__LENT_MAX = 12,     /* the most buffers a block lends under selective recompute */
       TPK__SCRATCH_MAX = 48 }; /* the most backward buffers of a block */

/* A model's buffers for its stack: the checkpoints and the gradient between blocks (full), the
 * pool of lent buffers (selective). */
typedef struct tpk__stack_bufs {
    tpk_buf *ckpt;                /* [L + 1] under FULL: block i's input, ckpt[L] the last output */
    tpk_buf grad;                 /* under FULL: the gradient between two blocks */
    tpk_buf pool[TPK__LENT_MAX];  /* under SELECTIVE: the buffers lent to one block at a time */
    tpk_buf scratch[TPK__SCRATCH_MAX]; /* NONE, SELECTIVE: the backward's buffers, lent likewise */
} tpk__stack_bufs;

typedef struct tpk__stack {
    void *m;
    int64_t L;
    tpk_recompute mode;
    tpk_status (*fwd)(tpk_ctx *ctx, void *m, int64_t i, tpk_tensor x, tpk_tensor *y);
    tpk_status (*bwd)(tpk_ctx *ctx, void *m, int64_t i, tpk_tensor dy, tpk_tensor *dx);
    void (*release)(tpk_ctx *ctx, void *m, int64_t i); /* free block i's buffers (it stays usable) */
    tpk_status (*ready)(tpk_ctx *ctx, void *m, int64_t i);
    /* SELECTIVE: block i's buffers to lend (the same roles in the same order for every block),
     * and the recompute of their contents from what the block kept, before its backward */
    int (*lent)(void *m, int64_t i, tpk_buf **bufs);
    tpk_status (*recompute)(tpk_ctx *ctx, void *m, int64_t i);
    /* block i's buffers that only its backward uses (input gradients, scratch): one set serves
     * every block's backward in turn (the gradient between two blocks is copied out) */
    int (*scratch)(void *m, int64_t i, tpk_buf **bufs);
    tpk__stack_bufs *b;
} tpk__stack;

/* Swap n of block i's buffers with a pool (twice: lent, then returned). Views the block keeps into
 * them stay pointing at the pool's memory, which the next block overwrites: selective recompute
 * rewrites them (st->recompute) before the block's backward reads them. */
static inline void tpk__stack_swap(tpk_buf **bufs, int n, tpk_buf *pool) {
    for (int k = 0; k < n; k++) {
        tpk_buf t = *bufs[k];
        *bufs[k] = pool[k], pool[k] = t;
    }
}
static inline void tpk__stack_lend(tpk__stack *st, int64_t i) {
    tpk_buf *bufs[TPK__LENT_MAX + TPK__SCRATCH_MAX];
    int n = st->lent(st->m, i, bufs);
    tpk__stack_swap(bufs, n < TPK__LENT_MAX ? n : TPK__LENT_MAX, st->b->pool);
}
static inline void tpk__stack_lend_scratch(tpk__stack *st, int64_t i) {
    tpk_buf *bufs[TPK__SCRATCH_MAX + TPK__LENT_MAX];
    int n = st->scratch(st->m, i, bufs);
    tpk__stack_swap(bufs, n < TPK__SCRATCH_MAX ? n : TPK__SCRATCH_MAX, st->b->scratch);
}

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
            if (!i) TPK_TRY(tpk__stack_keep(ctx, &st->b->ckpt[0], x, &x)); /* later inputs were kept as outputs */
            TPK_TRY(st->fwd(ctx, st->m, i, x, &x));
            TPK_TRY(tpk__stack_keep(ctx, &st->b->ckpt[i + 1], x, &x));
            st->release(ctx, st->m, i);
        } else if (st->mode == TPK_RECOMPUTE_SELECTIVE) {
            tpk__stack_lend(st, i);
            tpk_status s = st->fwd(ctx, st->m, i, x, &x);
            tpk__stack_lend(st, i); /* returned, also on failure */
            TPK_TRY(s);
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
            x.data = st->b->ckpt[i].p; /* block i's input: the hidden states' shape and layout */
            TPK_TRY(st->fwd(ctx, st->m, i, x, &y)); /* the same forward again */
            TPK_TRY(st->bwd(ctx, st->m, i, g, &g));
            TPK_TRY(tpk__stack_keep(ctx, &st->b->grad, g, &g));
            st->release(ctx, st->m, i);
        } else { /* the backward's buffers lent for the block's backward; its dx copied out */
            bool sel = st->mode == TPK_RECOMPUTE_SELECTIVE;
            if (sel) tpk__stack_lend(st, i);
            tpk__stack_lend_scratch(st, i);
            tpk_status s = sel ? st->recompute(ctx, st->m, i) : TPK_OK; /* selective: the lent buffers' contents again */
            if (s == TPK_OK) s = st->bwd(ctx, st->m, i, g, &g);
            if (s == TPK_OK) s = tpk__stack_keep(ctx, &st->b->grad, g, &g);
            tpk__stack_lend_scratch(st, i);
            if (sel) tpk__stack_lend(st, i);
            TPK_TRY(s);
        }
        if (st->ready) TPK_TRY(st->ready(ctx, st->m, i));
    }
    *dx = g;
    return TPK_OK;
}

/* A model's stack buffers for L blocks: the checkpoint array allocated (its buffers empty). */
static inline tpk_status tpk__stack_bufs_init(tpk_ctx *ctx, const char *fn, tpk__stack_bufs *b, int64_t L) {
    memset(b, 0, sizeof *b);
    b->ckpt = (tpk_buf *)calloc((size_t)L + 1, sizeof *b->ckpt);
    return b->ckpt ? TPK_OK : tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%lld checkpoints", (long long)L + 1);
}
/* Free them: the checkpoints (ckpt [L + 1]), the gradient buffer, the pool. */
static inline void tpk__stack_bufs_free(tpk_ctx *ctx, tpk__stack_bufs *b, int64_t L) {
    for (int64_t i = 0; b->ckpt && i <= L; i++) tpk__buf_free(ctx, &b->ckpt[i]);
    free(b->ckpt), b->ckpt = NULL;
    tpk__buf_free(ctx, &b->grad);
    for (int k = 0; k < TPK__LENT_MAX; k++) tpk__buf_free(ctx, &b->pool[k]);
    for (int k = 0; k < TPK__SCRATCH_MAX; k++) tpk__buf_free(ctx, &b->scratch[k]);
}

#endif /* TPK_RECOMPUTE_H */
