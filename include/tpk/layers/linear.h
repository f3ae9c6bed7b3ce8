/* tpk/layers/linear.h — column- and row-parallel linear layers, forward and backward.
 *
 * Weights are [out, in] row-major, y = x W^T + b. T is the number of token rows (global
 * under sequence parallelism), t the TP size, r this rank.
 *
 * Column linear: rank r holds rows (out features) o_r of W and b (stride s: its slice of
 * each of s blocks, which may be s parameters registered in a row: desc.parts; grouped: the
 * key/value heads its query heads read, desc.group).
 *   forward   x R [T, in] (SP: S(0), all-gathered first into the context's scratch ctx->sp, which
 *             every layer shares: the layer keeps only its S(0) input, not the gathered copy)
 *             y_r = x W_r^T + b_r            -> S(-1) [T, out_r]; gather_output: all-gather -> R
 *             (.act: y_r = act(x W_r^T + b_r), fused: tpk_op_linear_fwd; backward first
 *             dy_r *= act'(pre))
 *   backward  dy S(-1) (gather_output: R, sliced to own columns)
 *             (SP: the input's all-gather into ctx->sp started again, overlapped with the dx GEMM)
 *             dx = dy_r W_r  is P            -> all-reduce (SP: reduce-scatter -> S(0)), started;
 *             partial_dx: none, dx stays P [T, in] (also under SP: the caller sums several
 *             branches' and reduces once, tpk_stream_gather_backward)
 *             dW_r += dy_r^T x, db_r += colsum(dy_r)   while the collective runs; then wait
 * Row linear: rank r holds columns (in features) i_r of W; b is replicated.
 *   forward   x S(-1) [T, in_r] (or R [T, in], sliced to own columns)
 *             y = x_r W_r^T (+ b on rank 0, in the GEMM's epilogue) is P
 *                                            -> all-reduce -> R (SP: reduce-scatter -> S(0); P
 *                                            only in ctx->sp)
 *             partial_output: no collective (with or without SP), y stays P [T, out]: the
 *             caller adds several branches' and reduces once (tpk_stream_reduce_forward)
 *   backward  dy R (SP: S(0), all-gathered first into ctx->sp; partial_output: R [T, out], the
 *             gradient of a partial sum being the same on every rank — under SP the caller
 *             all-gathers it, tpk_stream_reduce_backward)
 *             dx_r = dy W_r -> S(-1) (input was R: all-gathered -> R)
 *             dW_r += dy^T x_r, db += colsum(dy)   (the full dy: db is complete on every rank)
 * FP8 (desc.fp8 under the context's recipe ctx->fp8, tpk/layers/fp8.h): the same collectives and
 * layouts; the GEMMs y = x W^T, dx = dy W and dW += dy^T x run on FP8 codes (x, W: E4M3; dy:
 * E5M2; tpk_op_gemm_fp8, alpha = 1 / (s_a s_b)), the bias, the activation, db and the f32 weight
 * gradient as without; the backward quantizes x and W again with the forward's scales.
 * A layer keeps a view of its input for backward: the caller keeps that memory alive and
 * unchanged until backward. Outputs and input gradients live in buffers the layer owns,
 * valid until its next forward or backward, with the rows (CP) of the input (tpk__rows_of).
 * Gradients accumulate (tpk_params_zero_grad). */
#ifndef TPK_LINEAR_H
#define TPK_LINEAR_H

#include "fp8.h"
#include "params.h"

typedef struct tpk_linear_desc {
    const char *name;       /* parameter prefix ("<name>.weight", "<name>.bias"); default
                               "linear<N>" */
    bool bias;              /* default: no bias */
    bool gather_output;     /* column: all-gather y to R */
    bool sequence_parallel; /* column: input S(0); row: output S(0) */
    tpk_act act;            /* column: y = act(x W^T + b) (TPK_ACT_NONE: none), fused into the GEMM
                               where the backend can (the MLP's c_fc); the pre-activation is kept
                               for backward */
    int stride;             /* column: out is `stride` blocks split separately (3 for fused QKV) */
    int unit;               /* the split features go in groups of `unit` (the head size D) */
    int group;              /* column: > 1 for grouped-query attention's K or V projection: out is
                               key/value heads of `unit`, each read by `group` query heads, and
                               this rank holds the heads its query heads read (TPK_S_GROUPED;
                               a head may be held by several ranks:
                               tpk_params_reduce_partial_grads) */
    const char *parts[8];   /* column with stride s > 1: W (and b) registered as s parameters
                               "<name>.<parts[i]>.weight" [out / s, in] (S(0), unit), one after
                               another, so their shards side by side are the strided shard
                               (Llama's gate_proj and up_proj as one linear); NULL: one parameter */
    bool partial_dx;        /* column: backward returns dx as P [T, in] with no collective (the
                               caller sums several and reduces once), with or without
                               sequence_parallel (no reduce-scatter either) */
    bool partial_output;    /* row: forward returns y as P [T, out] with no collective (the bias
                               on TP rank 0 only, once in the sum), with or without
                               sequence_parallel; backward then takes dy R [T, out] */
    int weight;             /* column: use this registered [out, in] parameter as W (tied
                               weights) instead of registering one; 0 = register. Give id + 1.
                               A padded parameter (tpk_param_desc.padded_rows) is [padded_rows,
                               in]: out counts its padding, whose outputs are zero. */
    float init_std;         /* weight N(0, std^2); default 0.02; bias starts at zero */
    bool fp8;               /* the GEMMs in FP8 under the context's recipe (ctx->fp8 when the layer
                               is made; none: no effect): x and W in E4M3, dy in E5M2, scaled by
                               tpk/layers/fp8.h, gemm_fp8; the bias, the activation, the master
                               weight and its gradient (f32) unchanged */
} tpk_linear_desc;

typedef struct tpk_linear {
    tpk_linear_desc d;
    char name[80];
    bool column;
    int64_t in, out;      /* global features */
    int64_t n_local;      /* column: local out features; row: local in features */
    int64_t in_off;       /* row: first in feature of this rank */
    int w, b;             /* parameter ids (b = -1 without bias) */
    int64_t T;            /* token rows of the last forward (global) */
    tpk_tensor x;         /* saved input: column R [T, in] (SP: S(0), gathered into ctx->sp when
                             read); row S(-1) [T, in_r] */
    bool x_was_R;         /* row: the input was R and was sliced */
    tpk_layout split;     /* how the features of W are split: column out, row in */
    tpk_buf xb, y, y2, dy, dx, dx2, gw; /* xb: a row linear's input sliced from R; gw: a bf16
                                           context's bias gradient [n] */
    tpk_buf pre, du;      /* column with an activation: the pre-activation, and its gradient */
    tpk_fp8 *f8;          /* desc.fp8: the recipe (NULL: none); its tensors at f8_slot + 0..2 */
    int f8_slot;
    float f8_s[3]; /* the scales of x, W, dy this forward and backward quantized with */
    tpk_buf q8[3]; /* the codes of x, W, dy (the GEMMs' operands, made in each call) */
} tpk_linear;

typedef tpk_linear tpk_col_linear;
typedef tpk_linear tpk_row_linear;

/* One part of a strided shard (tpk_linear_desc.parts): split on dim 0 in units of u; the parts
 * after the first follow it in the flat buffer with no gap, so their shards are one strided
 * shard. */
static inline tpk_status tpk__linear_part(tpk_ctx *ctx, const char *name, int ndim, int64_t d0,
                                          int64_t d1, int u, tpk_init init, float std, bool decay,
                                          bool follows, int *id) {
    tpk_param_desc d;
    memset(&d, 0, sizeof d);
    d.name = name, d.ndim = ndim, d.shape[0] = d0, d.shape[1] = ndim > 1 ? d1 : 0,
    d.layout = TPK_S_EX(0, 1, u);
    d.init = init, d.std = std, d.decay = decay, d.follows = follows;
    return tpk_param_add(ctx, &d, id);
}

static inline tpk_status tpk__linear_init(tpk_ctx *ctx, tpk_linear *l, bool column, int64_t in,
                                          int64_t out, const tpk_linear_desc *desc) {
    const char *fn = column ? "tpk_col_linear_init" : "tpk_row_linear_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!l) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    memset(l, 0, sizeof *l);
    if (desc) l->d = *desc;
    if (in < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "in: expected >= 1, got %lld", (long long)in);
    if (out < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "out: expected >= 1, got %lld", (long long)out);
    int s = l->d.stride > 0 ? l->d.stride : 1, u = l->d.unit > 0 ? l->d.unit : 1;
    if (s > 1 && !column)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->stride: only a column linear has a stride, got %d", s);
    if ((column ? out : in) % ((int64_t)s * u))
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "%s: %lld is not a multiple of desc->stride x desc->unit = %d",
                         column ? "out" : "in", (long long)(column ? out : in), s * u);
    if (s > 1 && l->d.gather_output)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->gather_output: not with desc->stride %d (a strided shard is consumed in place)",
            s);
    if (l->d.gather_output && l->d.sequence_parallel)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->gather_output: not with desc->sequence_parallel (the output stays S(-1))");
    if (l->d.init_std < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->init_std: expected >= 0, got %g",
                         (double)l->d.init_std);
    if (l->d.weight && !column)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->weight: only a column linear takes a shared weight");
    if (l->d.group < 0 || (l->d.group > 1 && (!column || s > 1 || l->d.weight)))
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->group: expected 0 or 1, or > 1 on a column linear without stride or shared "
            "weight, got %d",
            l->d.group);
    if (l->d.parts[0] && (!column || s < 2 || s > 8 || l->d.weight))
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->parts: only a column linear with 2..8 stride blocks and its own weight "
            "registers parts");
    for (int i = 0; l->d.parts[0] && i < s; i++)
        if (!l->d.parts[i] || !l->d.parts[i][0])
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "desc->parts[%d]: expected a name (one per stride block, %d)", i, s);
    if (l->d.partial_dx && !column)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->partial_dx: only a column linear returns dx partial (a row "
                         "linear's dx is S(-1))");
    if (l->d.partial_output && column)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc->partial_output: only a row linear returns y partial (a column "
                         "linear's y is S(-1))");
    if ((unsigned)l->d.act >= (unsigned)TPK_ACT_COUNT)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->act: expected a tpk_act, got %d",
                         (int)l->d.act);
    if (l->d.act != TPK_ACT_NONE && !column)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "desc->act: only a column linear fuses an activation (its output is S(-1)), got %s",
            tpk_act_name(l->d.act));
    l->d.stride = s, l->d.unit = u;
    l->column = column, l->in = in, l->out = out, l->b = -1;
    int g = l->d.group > 1 ? l->d.group : 1;
    l->d.group = g;
    l->split = !column ? TPK_S_EX(1, 1, u) : g > 1 ? TPK_S_GROUPED(0, u, g) : TPK_S_EX(0, s, u);
    TPK_TRY(tpk__layer_name(ctx, fn, l->name, sizeof l->name, l->d.name, "linear"));
    l->d.name = NULL;
    char pn[128];
    float std = l->d.init_std > 0 ? l->d.init_std : 0.02f;
    snprintf(pn, sizeof pn, "%s.weight", l->name);
    if (l->d.weight) { /* a registered weight: its global shape and split must be W's */
        tpk_param *p = tpk__param(ctx, fn, l->d.weight - 1);
        if (!p) return TPK_ERR_ARG;
        int64_t rows = p->ndim ? p->padded_rows : 0, cols = 1;
        for (int i = 1; i < p->ndim; i++) cols *= p->gshape[i];
        if (rows != out || cols != in || p->split_dim != 0 || p->stride != s ||
            tpk_layout_unit(p->layout) != u)
            return tpk__fail(
                ctx, TPK_ERR_SHAPE, fn,
                "desc->weight: \"%s\" is not an [%lld, %lld] weight split on dim 0 (stride %d, "
                "unit %d)",
                p->name, (long long)out, (long long)in, s, u);
        l->w = l->d.weight - 1;
    } else if (l->d.parts[0]) { /* s parameters registered in a row: their shards are the strided
                                   shard */
        for (int i = 0; i < s; i++) {
            int id = -1;
            snprintf(pn, sizeof pn, "%s.%s.weight", l->name, l->d.parts[i]);
            TPK_TRY(tpk__linear_part(ctx, pn, 2, out / s, in, u, TPK_INIT_NORMAL, std, true, i > 0,
                                     &id));
            if (!i) l->w = id;
        }
    } else {
        TPK_TRY(tpk__param_add(ctx, pn, 2, out, in, l->split, TPK_INIT_NORMAL, std, true, &l->w));
    }
    if (l->d.bias && l->d.parts[0]) {
        for (int i = 0; i < s; i++) {
            int id = -1;
            snprintf(pn, sizeof pn, "%s.%s.bias", l->name, l->d.parts[i]);
            TPK_TRY(
                tpk__linear_part(ctx, pn, 1, out / s, 0, u, TPK_INIT_ZEROS, 0, false, i > 0, &id));
            if (!i) l->b = id;
        }
    } else if (l->d.bias) {
        snprintf(pn, sizeof pn, "%s.bias", l->name);
        TPK_TRY(tpk__param_add(ctx, pn, 1, out, 0, column ? l->split : TPK_R, TPK_INIT_ZEROS, 0,
                               false, &l->b));
    }
    /* the names need not outlive init */
    for (int i = 0; l->d.parts[0] && i < 8; i++) l->d.parts[i] = NULL;
    if (l->d.fp8 && ctx->fp8) { /* three tensors of the recipe: x, W, dy */
        l->f8 = ctx->fp8;
        TPK_TRY(tpk__fp8_register(ctx, l->f8, l->name, &l->f8_slot));
    }
    l->n_local = tpk_tp_shard_size(ctx, column ? out : in, l->split, ctx->tp.rank);
    l->in_off = column ? 0 : tpk_tp_shard_run(ctx, in, l->split, ctx->tp.rank, 0).off;
    return TPK_OK;
}

/* Column-parallel linear [out, in]: W split by rows (out features) over the TP group. */
static inline tpk_status tpk_col_linear_init(tpk_ctx *ctx, tpk_col_linear *l, int64_t in,
                                             int64_t out, const tpk_linear_desc *desc) {
    return tpk__linear_init(ctx, l, true, in, out, desc);
}
/* Row-parallel linear [out, in]: W split by columns (in features) over the TP group. */
static inline tpk_status tpk_row_linear_init(tpk_ctx *ctx, tpk_row_linear *l, int64_t in,
                                             int64_t out, const tpk_linear_desc *desc) {
    return tpk__linear_init(ctx, l, false, in, out, desc);
}

/* The buffers only the layer's backward uses (its input gradient and scratch): 5, into b. */
static inline int tpk__linear_scratch(tpk_linear *l, tpk_buf **b) {
    b[0] = &l->dy, b[1] = &l->dx, b[2] = &l->dx2, b[3] = &l->gw, b[4] = &l->du;
    return 5;
}

/* Release the layer's buffers (its parameters stay in the context). */
static inline void tpk_linear_destroy(tpk_ctx *ctx, tpk_linear *l) {
    tpk_buf *bufs[] = {&l->xb, &l->y,   &l->y2, &l->dy,    &l->dx,    &l->dx2,
                       &l->gw, &l->pre, &l->du, &l->q8[0], &l->q8[1], &l->q8[2]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tpk__buf_free(ctx, bufs[i]);
}

static inline tpk_status tpk__linear_common(tpk_ctx *ctx, const char *fn, tpk_linear *l,
                                            bool column, const tpk_tensor *x, const char *arg,
                                            const tpk_tensor *out) {
    if (!ctx) return TPK_ERR_ARG;
    if (!l || !l->name[0])
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised layer, got %s",
                         l ? "an empty one" : "NULL");
    if (l->column != column)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: \"%s\" is a %s linear, expected a %s linear",
                         l->name, l->column ? "column" : "row", column ? "column" : "row");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", arg[0] == 'x' ? "y" : "dx");
    if (!x) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", arg);
    if (x->ndim != 2)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "%s: expected 2 dimensions [tokens, features], got %d", arg, x->ndim);
    if (x->dtype != ctx->dtype)
        return tpk__fail(ctx, TPK_ERR_DTYPE, fn,
                         "%s: expected dtype %s (the context's dtype), got %s", arg,
                         tpk_dtype_name(ctx->dtype), tpk_dtype_name(x->dtype));
    return TPK_OK;
}

/* The layout of a column linear's output: its weight's split, on the last dim. */
static inline tpk_layout tpk__col_out_layout(const tpk_linear *l) {
    return l->d.group > 1 ? TPK_S_GROUPED(-1, l->d.unit, l->d.group)
                          : TPK_S_EX(-1, l->d.stride, l->d.unit);
}

/* The counts of a token split of [T, width] over the TP group, rank by rank, into counts[64] or an
 * allocated array (*cnt; free it when it is not counts). */
static inline tpk_status tpk__token_counts(tpk_ctx *ctx, const char *fn, int64_t T, int64_t width,
                                           size_t *counts, size_t **cnt) {
    int t = ctx->tp.size;
    *cnt = t <= 64 ? counts : (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)t);
    if (!*cnt) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "counts");
    for (int q = 0; q < t; q++) (*cnt)[q] = (size_t)(tpk_tp_split(ctx, T, q).size * width);
    return TPK_OK;
}

/* ---- FP8 (desc.fp8 under ctx->fp8): the GEMMs on codes, the scales out again in alpha -------- */

/* The forward through FP8: u [T, n] = (1 / (s_x s_w)) q_x [T, k] q_w [n, k]^T (+ bias); act:
 * pre = u, y = act(u). x and W quantized in E4M3 (the recipe's scales, amaxes recorded). Every
 * rank of the TP group calls it (current scaling's amax is all-reduced), T or n 0 too. */
static inline tpk_status tpk__linear_fp8_fwd(tpk_ctx *ctx, tpk_linear *l, void *y, void *pre,
                                             const void *x, const void *w, const void *bias,
                                             int64_t T, int64_t n, int64_t k, tpk_act act) {
    size_t nx = (size_t)(T * k), nw = (size_t)(n * k);
    TPK_TRY(tpk__buf_reserve(ctx, &l->q8[0], nx));
    TPK_TRY(tpk__buf_reserve(ctx, &l->q8[1], nw));
    uint8_t *qx = (uint8_t *)l->q8[0].p, *qw = (uint8_t *)l->q8[1].p;
    TPK_TRY(
        tpk__fp8_quant(ctx, l->f8, l->f8_slot + TPK_FP8_X, x, nx, qx, TPK_E4M3, 0, &l->f8_s[0]));
    TPK_TRY(
        tpk__fp8_quant(ctx, l->f8, l->f8_slot + TPK_FP8_W, w, nw, qw, TPK_E4M3, 0, &l->f8_s[1]));
    if (!T || !n) return TPK_OK;
    void *u = act != TPK_ACT_NONE ? pre : y;
    float alpha = (1.0f / l->f8_s[0]) * (1.0f / l->f8_s[1]);
    TPK_TRY(tpk_op_gemm_fp8(ctx, false, true, T, n, k, alpha, qx, TPK_E4M3, k, qw, TPK_E4M3, k,
                            0.0f, u, n, ctx->dtype));
    if (bias) TPK_TRY(tpk_op_bias_add(ctx, u, bias, T, n, ctx->dtype));
    if (act != TPK_ACT_NONE) TPK_TRY(tpk_op_act_fwd(ctx, act, y, u, ctx->dtype, (size_t)(T * n)));
    return TPK_OK;
}
/* The backward's GEMMs through FP8, for dy [T, n], x [T, k], W [n, k] (every rank of the TP group
 * calls both): _dx quantizes dy in E5M2 (its amax recorded) and W again with the forward's scale,
 * dx [T, k] = (1 / (s_dy s_w)) q_dy q_w (dx NULL: not made); then _dw quantizes x again with the
 * forward's scale, dW (the f32 gradient of l->w) += (1 / (s_dy s_x)) q_dy^T q_x. */
static inline tpk_status tpk__linear_fp8_dx(tpk_ctx *ctx, tpk_linear *l, const void *dy, int64_t T,
                                            int64_t n, int64_t k, void *dx) {
    size_t nx = (size_t)(T * k), nw = (size_t)(n * k), ny = (size_t)(T * n);
    TPK_TRY(tpk__buf_reserve(ctx, &l->q8[0], nx)); /* for _dw */
    TPK_TRY(tpk__buf_reserve(ctx, &l->q8[1], nw));
    TPK_TRY(tpk__buf_reserve(ctx, &l->q8[2], ny));
    uint8_t *qw = (uint8_t *)l->q8[1].p, *qy = (uint8_t *)l->q8[2].p;
    TPK_TRY(
        tpk__fp8_quant(ctx, l->f8, l->f8_slot + TPK_FP8_DY, dy, ny, qy, TPK_E5M2, 0, &l->f8_s[2]));
    float sw = l->f8_s[1];
    TPK_TRY(tpk__fp8_quant(ctx, l->f8, l->f8_slot + TPK_FP8_W, tpk__param_w(ctx, l->w), nw, qw,
                           TPK_E4M3, sw, &sw));
    if (dx && T && k)
        TPK_TRY(tpk_op_gemm_fp8(ctx, false, false, T, k, n, (1.0f / l->f8_s[2]) * (1.0f / sw), qy,
                                TPK_E5M2, n, qw, TPK_E4M3, k, 0.0f, dx, k, ctx->dtype));
    return TPK_OK;
}
static inline tpk_status tpk__linear_fp8_dw(tpk_ctx *ctx, tpk_linear *l, const void *x, int64_t T,
                                            int64_t n, int64_t k) {
    size_t nx = (size_t)(T * k);
    uint8_t *qx = (uint8_t *)l->q8[0].p, *qy = (uint8_t *)l->q8[2].p;
    float sx = l->f8_s[0];
    TPK_TRY(tpk__fp8_quant(ctx, l->f8, l->f8_slot + TPK_FP8_X, x, nx, qx, TPK_E4M3, sx, &sx));
    if (!T || !n || !k) return TPK_OK;
    return tpk_op_gemm_fp8(ctx, true, false, n, k, T, (1.0f / l->f8_s[2]) * (1.0f / sx), qy,
                           TPK_E5M2, n, qx, TPK_E4M3, k, 1.0f, tpk_param_grad(ctx, l->w), k,
                           TPK_F32);
}

/* A column linear's input, kept for backward (l->x, l->T): x itself, R [T, in], or under sequence
 * parallelism this rank's tokens S(0) — the gathered [T, in] lives only in the context's scratch
 * (tpk__col_linear_gather), in the forward and again in the backward. Selective recompute
 * (tpk/layers/recompute.h) calls it again before the backward with x made again. */
static inline tpk_status tpk__col_linear_input(tpk_ctx *ctx, const char *fn, tpk_col_linear *l,
                                               tpk_tensor x) {
    int64_t want[2] = {-1, l->in};
    TPK_TRY(tpk__check(ctx, fn, "x", &x, l->d.sequence_parallel ? TPK_S(0) : TPK_R, ctx->dtype, 2,
                       want));
    l->x = x, l->T = x.gshape[0];
    return TPK_OK;
}

/* x S(0) [T, w]'s tokens all-gathered into the context's scratch, *xg R [T, w] viewing it —
 * started (req: finish it with tpk_wait before reading *xg) or, with req NULL, done. */
static inline tpk_status tpk__sp_gather(tpk_ctx *ctx, const char *fn, const tpk_tensor *x,
                                        tpk_tensor *xg, tpk_request *req) {
    int64_t T = x->gshape[0], w = x->gshape[1];
    *xg = tpk_tensor_2d(NULL, ctx->dtype, T, w, TPK_R);
    TPK_TRY(tpk__sp_view(ctx, xg));
    if (!req) return tpk_region_forward(ctx, TPK_REGION_SP_GATHER, x, xg);
    size_t counts[64], *cnt;
    TPK_TRY(tpk__token_counts(ctx, fn, T, w, counts, &cnt));
    tpk_status s = tpk_allgatherv_start(ctx, &ctx->tp, x->data, cnt[ctx->tp.rank], xg->data, cnt,
                                        (size_t)(T * w), ctx->dtype, req);
    if (cnt != counts) tpk__free(ctx, cnt);
    return s;
}
/* A column linear's GEMM input *xg: under sequence parallelism its saved input gathered
 * (tpk__sp_gather: started with req, done without), otherwise the saved input itself. */
static inline tpk_status tpk__col_linear_gather(tpk_ctx *ctx, const char *fn, tpk_col_linear *l,
                                                tpk_tensor *xg, tpk_request *req) {
    if (!l->d.sequence_parallel) return *xg = l->x, TPK_OK;
    return tpk__sp_gather(ctx, fn, &l->x, xg, req);
}

/* Column forward: x R [T, in] (S(0) under sequence parallelism) -> *y S(-1) [T, out_r]
 * (R [T, out] with gather_output). */
static inline tpk_status tpk_col_linear_forward(tpk_ctx *ctx, tpk_col_linear *l, tpk_tensor x,
                                                tpk_tensor *y) {
    static const char *fn = "tpk_col_linear_forward";
    TPK_TRY(tpk__linear_common(ctx, fn, l, true, &x, "x", y));
    TPK_TRY(tpk__params_fresh(ctx)); /* a bf16 context's weight copy */
    TPK_TRY(tpk__col_linear_input(ctx, fn, l, x));
    TPK_TRY(tpk__col_linear_gather(ctx, fn, l, &x, NULL)); /* SP: all-gather tokens into the
                                                              scratch */
    int64_t T = l->T, n = l->n_local;
    tpk_tensor yl = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, l->out, tpk__col_out_layout(l));
    TPK_TRY(tpk__buf_view(ctx, &l->y, &yl));
    if (l->d.act != TPK_ACT_NONE) TPK_TRY(tpk__buf_reserve(ctx, &l->pre, tpk_nbytes(&yl)));
    if (l->f8) /* the same through FP8 */
        TPK_TRY(tpk__linear_fp8_fwd(ctx, l, yl.data, l->pre.p, x.data, tpk__param_w(ctx, l->w),
                                    l->b >= 0 ? tpk__param_w(ctx, l->b) : NULL, T, n, l->in,
                                    l->d.act));
    else if (T && n) /* y_r = x W_r^T + b_r (act: pre = that, y_r = act(pre)), one fused op */
        TPK_TRY(tpk_op_linear_fwd(ctx, yl.data, l->pre.p, x.data, tpk__param_w(ctx, l->w),
                                  l->b >= 0 ? tpk__param_w(ctx, l->b) : NULL, T, n, l->in, l->d.act,
                                  ctx->dtype));
    if (l->d.gather_output) {
        tpk_tensor yg = tpk_tensor_2d(NULL, ctx->dtype, T, l->out, TPK_R);
        TPK_TRY(tpk__buf_view(ctx, &l->y2, &yg));
        TPK_TRY(tpk_region_forward(ctx, TPK_REGION_GATHER, &yl, &yg));
        yl = yg;
    }
    *y = tpk__rows_of(yl, &l->x); /* x's rows (CP) */
    return TPK_OK;
}

/* Column backward: dy S(-1) [T, out_r] (R [T, out] with gather_output) -> *dx R [T, in]
 * (S(0) under sequence parallelism; P [T, in] with partial_dx); accumulates dW_r, db_r. fused: dy
 * is already the gradient of the pre-activation and db_r already added (the layer owning this one
 * and the row linear after it did both in the row linear's dx GEMM: tpk_mlp_backward). */
static inline tpk_status tpk__col_linear_backward(tpk_ctx *ctx, tpk_col_linear *l, tpk_tensor dy,
                                                  tpk_tensor *dx, bool fused) {
    static const char *fn = "tpk_col_linear_backward";
    TPK_TRY(tpk__linear_common(ctx, fn, l, true, &dy, "dy", dx));
    if (!l->x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", l->name);
    int64_t T = l->T, n = l->n_local, want[2] = {T, l->out};
    const tpk_tensor dy_in = dy; /* its rows (CP) are dx's */
    if (l->d.gather_output) {
        TPK_TRY(tpk__check(ctx, fn, "dy", &dy, TPK_R, ctx->dtype, 2, want));
        tpk_tensor s =
            tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, l->out, TPK_S_EX(-1, 1, l->d.unit));
        TPK_TRY(tpk__buf_view(ctx, &l->dy, &s));
        TPK_TRY(tpk_region_backward(ctx, TPK_REGION_GATHER, &dy, &s)); /* slice own columns */
        dy = s;
    } else {
        TPK_TRY(tpk__check(ctx, fn, "dy", &dy, tpk__col_out_layout(l), ctx->dtype, 2, want));
    }
    if (l->d.act != TPK_ACT_NONE && !fused) { /* through the fused activation: du = dy act'(pre) */
        tpk_tensor du = dy;
        TPK_TRY(tpk__buf_view(ctx, &l->du, &du));
        if (T && n)
            TPK_TRY(tpk_op_act_bwd(ctx, l->d.act, du.data, l->pre.p, dy.data, ctx->dtype,
                                   (size_t)(T * n)));
        dy = du;
    }
    /* dx = dy_r W_r: a partial sum over ranks; under SP the input's tokens are gathered again
     * meanwhile (for dW), as Megatron does, instead of a gathered copy kept since the forward */
    tpk_tensor dxp = tpk_tensor_2d(NULL, ctx->dtype, T, l->in, TPK_P), out = dxp, xg;
    TPK_TRY(tpk__buf_view(ctx, &l->dx, &dxp));
    if (l->d.sequence_parallel && !l->d.partial_dx) {
        out = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, l->in, TPK_S(0));
        TPK_TRY(tpk__buf_view(ctx, &l->dx2, &out));
    }
    tpk_request greq, req;
    memset(&greq, 0, sizeof greq), memset(&req, 0, sizeof req);
    TPK_TRY(tpk__col_linear_gather(ctx, fn, l, &xg, &greq));
    tpk_status s =
        l->f8 && n ? tpk__linear_fp8_dx(ctx, l, dy.data, T, n, l->in, dxp.data)
        : l->f8    ? tpk__linear_fp8_dx(ctx, l, dy.data, T, n, l->in, NULL)
        : n ? tpk_op_gemm(ctx, false, false, T, l->in, n, 1.f, dy.data, n, tpk__param_w(ctx, l->w),
                          l->in, 0.f, dxp.data, l->in, ctx->dtype)
            : TPK_OK;
    if (s == TPK_OK && !n) s = tpk_op_fill(ctx, dxp.data, ctx->dtype, (size_t)(T * l->in), 0.f);
    tpk_status ws = tpk_wait(ctx, &greq); /* always finish the collective */
    TPK_TRY(s);
    TPK_TRY(ws);
    if (l->d.partial_dx) { /* the caller reduces */
        out = dxp;
    } else if (l->d.sequence_parallel) { /* P -> S(0): reduce-scatter over token rows, overlapped */
        size_t counts[64], *cnt;
        TPK_TRY(tpk__token_counts(ctx, fn, T, l->in, counts, &cnt));
        s = tpk_reduce_scatterv_start(ctx, &ctx->tp, dxp.data, (size_t)(T * l->in), out.data, cnt,
                                      ctx->dtype, TPK_SUM, &req);
        if (cnt != counts) tpk__free(ctx, cnt);
        TPK_TRY(s);
    } else { /* P -> R: all-reduce in place, overlapped */
        out.data = dxp.data, out.layout = TPK_R;
        TPK_TRY(tpk_allreduce_start(ctx, &ctx->tp, dxp.data, dxp.data, (size_t)(T * l->in),
                                    ctx->dtype, TPK_SUM, &req));
    }
    if (l->f8) { /* every rank: the x quantization is a collective under current scaling */
        s = tpk__linear_fp8_dw(ctx, l, xg.data, T, n, l->in);
        if (s == TPK_OK && n && T && l->b >= 0 && !fused)
            s = tpk__grad_bias(ctx, l->b, dy.data, T, n);
    } else if (n && T) {
        s = tpk__grad_gemm(ctx, l->w, true, false, n, l->in, T, dy.data, n, xg.data, l->in);
        if (s == TPK_OK && l->b >= 0 && !fused) s = tpk__grad_bias(ctx, l->b, dy.data, T, n);
    }
    ws = tpk_wait(ctx, &req); /* always finish the collective */
    TPK_TRY(s);
    TPK_TRY(ws);
    *dx = tpk__rows_of(out, &dy_in);
    return TPK_OK;
}
static inline tpk_status tpk_col_linear_backward(tpk_ctx *ctx, tpk_col_linear *l, tpk_tensor dy,
                                                 tpk_tensor *dx) {
    return tpk__col_linear_backward(ctx, l, dy, dx, false);
}

/* Row forward: x S(-1) [T, in_r] (or R [T, in], sliced) -> *y R [T, out] (S(0) under
 * sequence parallelism; P [T, out] with partial_output, in the layer's buffer). */
static inline tpk_status tpk_row_linear_forward(tpk_ctx *ctx, tpk_row_linear *l, tpk_tensor x,
                                                tpk_tensor *y) {
    static const char *fn = "tpk_row_linear_forward";
    TPK_TRY(tpk__linear_common(ctx, fn, l, false, &x, "x", y));
    TPK_TRY(tpk__params_fresh(ctx)); /* a bf16 context's weight copy */
    int64_t want[2] = {-1, l->in};
    const tpk_tensor x_in = x; /* its rows (CP) are y's */
    l->x_was_R = x.layout.kind == TPK_LAYOUT_R;
    if (l->x_was_R) {
        TPK_TRY(tpk__check(ctx, fn, "x", &x, TPK_R, ctx->dtype, 2, want));
        tpk_tensor s =
            tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, x.shape[0], l->in, TPK_S_EX(-1, 1, l->d.unit));
        TPK_TRY(tpk__buf_view(ctx, &l->xb, &s));
        TPK_TRY(tpk_region_forward(ctx, TPK_REGION_SCATTER, &x, &s)); /* slice own columns */
        x = s;
    } else {
        char a[64];
        char b[64];
        tpk_layout want_l = TPK_S_EX(-1, 1, l->d.unit);
        if (!tpk_layout_eq(x.layout, want_l, 2))
            return tpk__fail(
                ctx, TPK_ERR_LAYOUT, fn, "x: expected layout %s (or R, sliced here), got %s",
                tpk_layout_str(want_l, b, sizeof b), tpk_layout_str(x.layout, a, sizeof a));
        TPK_TRY(tpk__check(ctx, fn, "x", &x, want_l, ctx->dtype, 2, want));
    }
    int64_t T = x.shape[0], n = l->n_local;
    l->x = x, l->T = T;
    /* SP: only until its reduce-scatter, in the scratch (partial_output: the output itself) */
    tpk_tensor yp = tpk_tensor_2d(NULL, ctx->dtype, T, l->out, TPK_P);
    TPK_TRY(l->d.sequence_parallel && !l->d.partial_output ? tpk__sp_view(ctx, &yp)
                                                           : tpk__buf_view(ctx, &l->y, &yp));
    /* the partial sums P; the bias once in the sum: rank 0 adds it in the GEMM's epilogue (no pass
     * of its own) */
    const void *bias = l->b >= 0 && ctx->tp.rank == 0 ? tpk__param_w(ctx, l->b) : NULL;
    if (l->f8) { /* through FP8 (every rank: current scaling's amax is all-reduced) */
        TPK_TRY(tpk__linear_fp8_fwd(ctx, l, yp.data, NULL, x.data, tpk__param_w(ctx, l->w), bias, T,
                                    l->out, n, TPK_ACT_NONE));
    } else if (n) {
        TPK_TRY(tpk_op_linear_fwd(ctx, yp.data, NULL, x.data, tpk__param_w(ctx, l->w), bias, T,
                                  l->out, n, TPK_ACT_NONE, ctx->dtype));
    } else {
        TPK_TRY(tpk_op_fill(ctx, yp.data, ctx->dtype, (size_t)(T * l->out), 0.f));
        if (bias && T) TPK_TRY(tpk_op_bias_add(ctx, yp.data, bias, T, l->out, ctx->dtype));
    }
    tpk_tensor yo;
    if (l->d.partial_output) { /* the caller reduces */
        yo = yp;
    } else if (l->d.sequence_parallel) {
        yo = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, l->out, TPK_S(0));
        TPK_TRY(tpk__buf_view(ctx, &l->y2, &yo));
        /* reduce-scatter tokens */
        TPK_TRY(tpk_region_forward(ctx, TPK_REGION_SP_SCATTER, &yp, &yo));
    } else {
        yo = yp;
        TPK_TRY(tpk_region_forward(ctx, TPK_REGION_REDUCE, &yp, &yo)); /* all-reduce in place */
    }
    *y = tpk__rows_of(yo, &x_in);
    return TPK_OK;
}

/* A row linear's dx GEMM taken over by the layer that owns it (an MLP fuses its activation's
 * backward into it, tpk/layers/mlp.h): dx [T, n] from dy [T, out] and W_r [out, n], in the row
 * linear's buffers; user is the owner. */
typedef struct tpk__row_dx {
    tpk_status (*fn)(tpk_ctx *ctx, void *user, void *dx, const void *dy, const void *w, int64_t T,
                     int64_t n, int64_t out);
    void *user;
} tpk__row_dx;

/* Row backward: dy R [T, out] (S(0) under sequence parallelism; R [T, out] with partial_output,
 * with or without it) -> *dx S(-1) [T, in_r]
 * (R [T, in] when the forward input was R); accumulates dW_r and db. own_dx (may be NULL; only
 * when the forward input was S(-1)): the owner's dx GEMM instead of the plain one. */
static inline tpk_status tpk__row_linear_backward(tpk_ctx *ctx, tpk_row_linear *l, tpk_tensor dy,
                                                  tpk_tensor *dx, const tpk__row_dx *own_dx) {
    static const char *fn = "tpk_row_linear_backward";
    TPK_TRY(tpk__linear_common(ctx, fn, l, false, &dy, "dy", dx));
    if (!l->x.ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", l->name);
    int64_t T = l->T, n = l->n_local, want[2] = {T, l->out};
    const tpk_tensor dy_in = dy; /* its rows (CP) are dx's */
    if (l->d.sequence_parallel && !l->d.partial_output) {
        TPK_TRY(tpk__check(ctx, fn, "dy", &dy, TPK_S(0), ctx->dtype, 2, want));
        tpk_tensor g = tpk_tensor_2d(NULL, ctx->dtype, T, l->out, TPK_R);
        TPK_TRY(tpk__sp_view(ctx, &g)); /* read only within this call */
        TPK_TRY(tpk_region_backward(ctx, TPK_REGION_SP_SCATTER, &dy, &g)); /* all-gather tokens */
        dy = g;
    } else {
        TPK_TRY(tpk__check(ctx, fn, "dy", &dy, TPK_R, ctx->dtype, 2, want));
    }
    tpk_tensor dxs = tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, l->in, TPK_S_EX(-1, 1, l->d.unit));
    TPK_TRY(tpk__buf_view(ctx, &l->dx, &dxs));
    if (own_dx && l->x_was_R)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "layer \"%s\": an owner's dx GEMM needs an S(-1) input", l->name);
    if (l->f8 && own_dx)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "layer \"%s\": an owner's dx GEMM is not taken through FP8", l->name);
    if (l->f8) { /* dy [T, out], W_r [out, n], x_r [T, n] */
        TPK_TRY(tpk__linear_fp8_dx(ctx, l, dy.data, T, l->out, n, n ? dxs.data : NULL));
        TPK_TRY(tpk__linear_fp8_dw(ctx, l, l->x.data, T, l->out, n));
    } else if (n && T) {
        if (own_dx)
            TPK_TRY(own_dx->fn(ctx, own_dx->user, dxs.data, dy.data, tpk__param_w(ctx, l->w), T, n,
                               l->out));
        else
            TPK_TRY(tpk_op_gemm(ctx, false, false, T, n, l->out, 1.f, dy.data, l->out,
                                tpk__param_w(ctx, l->w), n, 0.f, dxs.data, n, ctx->dtype));
        TPK_TRY(
            tpk__grad_gemm(ctx, l->w, true, false, l->out, n, T, dy.data, l->out, l->x.data, n));
    }
    if (l->b >= 0 && T) TPK_TRY(tpk__grad_bias(ctx, l->b, dy.data, T, l->out));
    if (l->x_was_R) {
        tpk_tensor g = tpk_tensor_2d(NULL, ctx->dtype, T, l->in, TPK_R);
        TPK_TRY(tpk__buf_view(ctx, &l->dx2, &g));
        TPK_TRY(tpk_region_backward(ctx, TPK_REGION_SCATTER, &dxs, &g)); /* all-gather features */
        dxs = g;
    }
    *dx = tpk__rows_of(dxs, &dy_in);
    return TPK_OK;
}
static inline tpk_status tpk_row_linear_backward(tpk_ctx *ctx, tpk_row_linear *l, tpk_tensor dy,
                                                 tpk_tensor *dx) {
    return tpk__row_linear_backward(ctx, l, dy, dx, NULL);
}

#endif /* TPK_LINEAR_H */
