/* tpk/layers/resid.h — dropout on an activation, and the residual connection around a branch.
 *
 * Dropout (in place):  y = x * keep / (1 - p),  keep = uniform(seed, stream, row * H + col) >= p
 *   over an activation x [T, H] that is R (every rank: all T rows) or S(0) (sequence parallel:
 *   this rank's rows, row = the global token row). The mask is indexed by the global (row, col)
 *   and drawn from a stream shared by the TP group (tpk__dropout_stream: the layer's name,
 *   ctx->rng_step, the DP rank), so it is the same at every TP size and with SP on or off.
 *   backward: dx = dy * keep / (1 - p), the same mask. p = 0: both are the identity.
 *   Context parallelism (ctx->cp, c > 1; tpk/layers/cp_split.h): the T = B S / c rows are this CP
 *   rank's chunks of B sequences of S tokens, and row j's mask is that of the token's row in the
 *   whole batch, b S + tpk_cp_position(S, c, r, j mod S / c) with b = j div (S / c) — the mask of
 *   CP 1 at every c (one op call per run of consecutive positions, 2 B a forward at most). The
 *   layer must know S: its owner sets it before each forward (tpk_dropout_set_seq; the block and
 *   the model do), else a forward with p > 0 under CP is refused by name.
 * Residual:  y = x + drop(b) for a branch output b that its layer does not keep, so the sum is
 *   written over b (one pass). backward: the branch gets db = drop'(dy); the skip path's dy is
 *   added to the branch's input gradient afterwards (tpk_residual_backward_add: dx += dy).
 *   tpk_residual_branch_forward only drops b, for a block that fuses the add into the next op
 *   (GPT-2's x + drop(attn) into ln_2: tpk_layernorm_forward_residual).
 * No communication. */
#ifndef TPK_RESID_H
#define TPK_RESID_H

#include "../runtime/buf.h"
#include "cp_split.h"

typedef struct tpk_dropout_desc {
    const char *name; /* the mask stream's name; default "dropout<N>" */
    float p;          /* probability of dropping, 0 <= p < 1 */
} tpk_dropout_desc;

typedef struct tpk_dropout {
    char name[80];
    float p;
    uint64_t stream;       /* of the last forward */
    int64_t rows, H, row0; /* local rows of the last forward and the global index of the first */
    tpk_layout layout;     /* of the last forward's x */
    int64_t T;             /* global rows of the last forward */
    int64_t S;             /* under CP: the sequences' length (tpk_dropout_set_seq; 0: unset) */
    tpk_buf dx;
} tpk_dropout;

/* Under context parallelism: the rows of the next forwards are this CP rank's of sequences of S
 * tokens (S a multiple of 2c; the header says why). At c = 1 unused. */
static inline void tpk_dropout_set_seq(tpk_dropout *d, int64_t S) {
    if (d) d->S = S;
}

/* y = drop(x) (y may be x) on the last forward's rows: at their global rows row0 .. (one call), or
 * under CP at each row's row in the whole batch (one call per run of consecutive positions). */
static inline tpk_status tpk__dropout_rows(tpk_ctx *ctx, const tpk_dropout *d, void *y,
                                           const void *x) {
    int c = tpk_cp_size(ctx);
    if (c == 1)
        return tpk_op_dropout(ctx, y, x, d->rows, d->H, d->H, d->row0, 0, d->p, ctx->seed,
                              d->stream, ctx->dtype);
    int64_t S = d->S, Sl = S / c, Sc = S / (2 * (int64_t)c), end = d->row0 + d->rows;
    size_t row = (size_t)d->H * tpk_dtype_size(ctx->dtype);
    for (int64_t j = d->row0; j < end;) {
        int64_t i = j % Sl, n = (i < Sc ? Sc : Sl) - i; /* to the end of this chunk */
        if (n > end - j) n = end - j;
        int64_t g = (j / Sl) * S + tpk_cp_position(S, c, ctx->cp.rank, i);
        size_t off = (size_t)(j - d->row0) * row;
        TPK_TRY(tpk_op_dropout(ctx, (char *)y + off, (const char *)x + off, n, d->H, d->H, g, 0,
                               d->p, ctx->seed, d->stream, ctx->dtype));
        j += n;
    }
    return TPK_OK;
}

static inline tpk_status tpk_dropout_init(tpk_ctx *ctx, tpk_dropout *d,
                                          const tpk_dropout_desc *desc) {
    static const char *fn = "tpk_dropout_init";
    tpk_dropout_desc dd;
    TPK__INIT_LAYER(ctx, fn, d, dd, desc);
    if (!(dd.p >= 0.0f && dd.p < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->p: expected 0 <= p < 1, got %g",
                         (double)dd.p);
    TPK_TRY(tpk__layer_name(ctx, fn, d->name, sizeof d->name, dd.name, "dropout"));
    d->p = dd.p;
    return TPK_OK;
}

/* x: a 2-D activation of the context's dtype, R or S(0) over the TP group. */
static inline tpk_status tpk__dropout_check(tpk_ctx *ctx, const char *fn, const char *arg,
                                            const tpk_tensor *x) {
    char a[64];
    if (!x) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", arg);
    if (x->layout.kind != TPK_LAYOUT_R && !tpk_layout_eq(x->layout, TPK_S(0), x->ndim))
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn, "%s: expected layout R or S(0), got %s", arg,
                         tpk_layout_str(x->layout, a, sizeof a));
    if (x->ndim != 2)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "%s: expected 2 dimensions [tokens, features], got %d", arg, x->ndim);
    return tpk__check(ctx, fn, arg, x, x->layout, ctx->dtype, 2, NULL);
}

/* *x = drop(*x) in place (R or S(0) [T, H]); a new mask per ctx->rng_step. */
static inline tpk_status tpk_dropout_forward(tpk_ctx *ctx, tpk_dropout *d, tpk_tensor *x) {
    static const char *fn = "tpk_dropout_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!d || !d->name[0])
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised dropout");
    TPK_TRY(tpk__dropout_check(ctx, fn, "x", x));
    int c = tpk_cp_size(ctx);
    int64_t T = x->gshape[0];
    if (d->p > 0 && c > 1 && !(d->S > 0 && d->S % (2 * c) == 0 && T % (d->S / c) == 0))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "layer \"%s\": under context parallelism (cp = %d) the mask is indexed by "
                         "each row's sequence position: expected the sequence length set "
                         "(tpk_dropout_set_seq) to a multiple of 2 x cp dividing the rows into "
                         "B sequences of S / cp, got S = %lld for %lld rows",
                         d->name, c, (long long)d->S, (long long)T);
    d->stream = tpk__dropout_stream(ctx, d->name);
    d->layout = x->layout, d->T = T, d->rows = x->shape[0], d->H = x->shape[1];
    d->row0 = x->layout.kind == TPK_LAYOUT_S ? tpk_tp_split(ctx, d->T, ctx->tp.rank).off : 0;
    if (d->p > 0 && d->rows && d->H) TPK_TRY(tpk__dropout_rows(ctx, d, x->data, x->data));
    return TPK_OK;
}

static inline tpk_status tpk__dropout_check_dy(tpk_ctx *ctx, const char *fn, tpk_dropout *d,
                                               const tpk_tensor *dy, const char *arg) {
    if (!ctx) return TPK_ERR_ARG;
    if (!d || !d->name[0])
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised dropout");
    if (!d->H)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", d->name);
    if (!dy) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", arg);
    int64_t want[2] = {d->T, d->H};
    return tpk__check(ctx, fn, arg, dy, d->layout, ctx->dtype, 2, want);
}

/* *dx = drop'(dy) with the last forward's mask, in the layer's buffer (dy is left as it is; with
 * p = 0, *dx is dy itself). */
static inline tpk_status tpk_dropout_backward(tpk_ctx *ctx, tpk_dropout *d, tpk_tensor dy,
                                              tpk_tensor *dx) {
    static const char *fn = "tpk_dropout_backward";
    TPK_TRY(tpk__dropout_check_dy(ctx, fn, d, &dy, "dy"));
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    tpk_tensor o = dy;
    if (d->p > 0) {
        TPK_TRY(tpk__buf_view(ctx, &d->dx, &o));
        if (d->rows && d->H) TPK_TRY(tpk__dropout_rows(ctx, d, o.data, dy.data));
    }
    *dx = o;
    return TPK_OK;
}

/* *g = drop'(*g) in place, for a gradient nothing else reads. */
static inline tpk_status tpk_dropout_backward_inplace(tpk_ctx *ctx, tpk_dropout *d, tpk_tensor *g) {
    static const char *fn = "tpk_dropout_backward_inplace";
    TPK_TRY(tpk__dropout_check_dy(ctx, fn, d, g, "g"));
    if (d->p > 0 && d->rows && d->H) TPK_TRY(tpk__dropout_rows(ctx, d, g->data, g->data));
    return TPK_OK;
}

static inline void tpk_dropout_destroy(tpk_ctx *ctx, tpk_dropout *d) { tpk__buf_free(ctx, &d->dx); }

/* ---- residual connection --------------------------------------------------------------------- */

typedef struct tpk_residual_desc {
    const char *name; /* the dropout mask's stream; default "resid<N>" */
    float dropout;    /* on the branch; 0 = none */
} tpk_residual_desc;

typedef struct tpk_residual {
    tpk_dropout drop;
} tpk_residual;

static inline tpk_status tpk_residual_init(tpk_ctx *ctx, tpk_residual *r,
                                           const tpk_residual_desc *desc) {
    static const char *fn = "tpk_residual_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!r) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    tpk_residual_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    char name[80];
    TPK_TRY(tpk__layer_name(ctx, fn, name, sizeof name, d.name, "resid"));
    tpk_dropout_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.name = name, dd.p = d.dropout;
    return tpk_dropout_init(ctx, &r->drop, &dd);
}

/* *b = drop(*b) in place: the branch half of the residual, whose add a later op fuses. */
static inline tpk_status tpk_residual_branch_forward(tpk_ctx *ctx, tpk_residual *r, tpk_tensor *b) {
    if (!ctx) return TPK_ERR_ARG;
    if (!r) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_residual_branch_forward", "layer: NULL");
    return tpk_dropout_forward(ctx, &r->drop, b);
}

/* *y = x + drop(b), written over b (b: a branch output its layer does not keep); x and b R or S(0)
 * [T, H], the same layout and shape. */
static inline tpk_status tpk_residual_forward(tpk_ctx *ctx, tpk_residual *r, tpk_tensor x,
                                              tpk_tensor b, tpk_tensor *y) {
    static const char *fn = "tpk_residual_forward";
    if (!ctx) return TPK_ERR_ARG;
    if (!r) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    TPK_TRY(tpk__dropout_check(ctx, fn, "b", &b));
    TPK_TRY(tpk__check(ctx, fn, "x", &x, b.layout, ctx->dtype, 2, b.gshape));
    TPK_TRY(tpk_dropout_forward(ctx, &r->drop, &b));
    size_t n = (size_t)tpk_numel(&b);
    if (n) TPK_TRY(tpk_op_axpby(ctx, b.data, 1.0f, x.data, 1.0f, ctx->dtype, n));
    *y = tpk__rows_of(b, &x); /* the residual stream's rows (CP) */
    return TPK_OK;
}

/* *db = the branch's output gradient drop'(dy) (the layer's buffer; dy itself when p = 0). dy
 * stays unchanged: the skip path adds it with tpk_residual_backward_add. */
static inline tpk_status tpk_residual_backward(tpk_ctx *ctx, tpk_residual *r, tpk_tensor dy,
                                               tpk_tensor *db) {
    if (!ctx) return TPK_ERR_ARG;
    if (!r) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_residual_backward", "layer: NULL");
    return tpk_dropout_backward(ctx, &r->drop, dy, db);
}

/* dx += dy: the skip path's gradient joined to the gradient the branch gave its input. */
static inline tpk_status tpk_residual_backward_add(tpk_ctx *ctx, tpk_residual *r, tpk_tensor dx,
                                                   tpk_tensor dy) {
    static const char *fn = "tpk_residual_backward_add";
    if (!ctx) return TPK_ERR_ARG;
    if (!r) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    TPK_TRY(tpk__dropout_check_dy(ctx, fn, &r->drop, &dy, "dy"));
    TPK_TRY(tpk__check(ctx, fn, "dx", &dx, dy.layout, ctx->dtype, 2, dy.gshape));
    size_t n = (size_t)tpk_numel(&dy);
    return n ? tpk_op_axpby(ctx, dx.data, 1.0f, dy.data, 1.0f, ctx->dtype, n) : TPK_OK;
}

/* Its buffers by recompute set (tpk/runtime/buf.h): SCRATCH the dropout's gradient buffer. */
static inline int tpk__residual_bufs(tpk_residual *r, int set, tpk_buf **o) {
    return set == TPK__SET_SCRATCH ? (o[0] = &r->drop.dx, 1) : 0;
}

/* Under context parallelism: its dropout's sequence length (tpk_dropout_set_seq). */
static inline void tpk_residual_set_seq(tpk_residual *r, int64_t S) {
    if (r) tpk_dropout_set_seq(&r->drop, S);
}

static inline void tpk_residual_destroy(tpk_ctx *ctx, tpk_residual *r) {
    tpk_dropout_destroy(ctx, &r->drop);
}

/* The two residual connections of a pre-norm block named `block`: their dropout masks' streams
 * are "<block>.resid_1" and "<block>.resid_2" (GPT-2's and Llama's blocks). */
static inline tpk_status tpk__block_residuals(tpk_ctx *ctx, const char *block, float dropout,
                                              tpk_residual *r1, tpk_residual *r2) {
    char n[128];
    tpk_residual_desc rd;
    memset(&rd, 0, sizeof rd);
    rd.name = n, rd.dropout = dropout;
    snprintf(n, sizeof n, "%s.resid_1", block);
    TPK_TRY(tpk_residual_init(ctx, r1, &rd));
    snprintf(n, sizeof n, "%s.resid_2", block);
    return tpk_residual_init(ctx, r2, &rd);
}

#endif /* TPK_RESID_H */
