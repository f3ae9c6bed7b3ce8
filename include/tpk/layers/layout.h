/* tpk/layers/layout.h — layout conversions on the TP group, and the region ops built from them.
 *
 * A tensor split on dim d is viewed as [outer, n, inner] (outer = product of the dims
 * before d, inner = product after). Rank q holds [outer, n_q, inner], n_q = tpk_tp_split(ctx, n, q)
 * (even, or by the context's TP weights).
 *   P -> R      all-reduce
 *   P -> S(d)   reduce-scatter (blocks packed rank-major first when outer > 1)
 *   S(d) -> R   all-gather    (blocks unpacked from rank-major when outer > 1)
 *   R -> S(d)   local slice, no communication
 *   same -> same  copy (or nothing, in place)
 * Region ops (docs/DESIGN.md, section 3), forward and backward:
 *   copy        R -> R            | grad P -> R      (all-reduce)
 *   reduce      P -> R (all-red.) | grad R -> R
 *   gather      S(-1) -> R (a-g)  | grad R -> S(-1)  (slice)
 *   scatter     R -> S(-1)        | grad S(-1) -> R  (all-gather)
 *   sp_gather   S(0) -> R (a-g)   | grad P -> S(0)   (reduce-scatter)
 *   sp_scatter  P -> S(0) (r-s)   | grad S(0) -> R   (all-gather)
 * Output buffers are the caller's: out->data must hold the output's local elements.
 * The residual stream's crossings (tpk_stream, at the end): a block's branches summed while partial
 * and reduced once, forward and backward. */
#ifndef TPK_LAYOUT_H
#define TPK_LAYOUT_H

#include "../runtime/buf.h"
#include "../runtime/coll.h"

typedef struct tpk__dimview { int64_t outer, n, inner; } tpk__dimview;

/* unit u > 1: the dim is n/u groups of u elements, so inner grows by u. */
static inline tpk__dimview tpk__view_unit(const int64_t *gshape, int ndim, int d, int u) {
    tpk__dimview v = {1, gshape[d] / u, u};
    for (int i = 0; i < d; i++) v.outer *= gshape[i];
    for (int i = d + 1; i < ndim; i++) v.inner *= gshape[i];
    return v;
}
static inline tpk__dimview tpk__view(const int64_t *gshape, int ndim, int d) {
    return tpk__view_unit(gshape, ndim, d, 1);
}

/* Element counts of every rank's shard of dim d (counts[q] = outer * n_q * inner). */
static inline void tpk__shard_counts(const tpk_ctx *ctx, tpk__dimview v, size_t *counts) {
    for (int q = 0; q < ctx->tp.size; q++)
        counts[q] = (size_t)(v.outer * tpk_tp_split(ctx, v.n, q).size * v.inner);
}

#define TPK__MAXRANKS 4096
#define TPK__AT(p, elems, dt) ((void *)((char *)(p) + (size_t)(elems) * tpk_dtype_size(dt)))

static inline tpk_status tpk__check_group(tpk_ctx *ctx, const char *fn) {
    if (ctx->tp.size > TPK__MAXRANKS)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "TP size %d: expected at most %d", ctx->tp.size,
                         TPK__MAXRANKS);
    return TPK_OK;
}

/* S(d) -> R over the TP group: out [gshape] from every rank's shard `in`. */
static inline tpk_status tpk__allgather_dim(tpk_ctx *ctx, const tpk_tensor *in, int d, int unit,
                                            void *out) {
    static const char *fn = "tpk_convert (all-gather)";
    TPK_TRY(tpk__check_group(ctx, fn));
    int t = ctx->tp.size;
    tpk__dimview v = tpk__view_unit(in->gshape, in->ndim, d, unit);
    size_t counts[64], *cnt = counts;
    if (t > 64 && !(cnt = (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)t)))
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "counts");
    tpk__shard_counts(ctx, v, cnt);
    size_t total = (size_t)(v.outer * v.n * v.inner), mine = cnt[ctx->tp.rank];
    tpk_status s;
    if (v.outer == 1) {
        s = tpk_allgatherv(ctx, &ctx->tp, in->data, mine, out, cnt, total, in->dtype);
    } else {
        size_t esz = tpk_dtype_size(in->dtype);
        s = tpk__buf_reserve(ctx, &ctx->work[0], total * esz);
        if (s == TPK_OK)
            s = tpk_allgatherv(ctx, &ctx->tp, in->data, mine, ctx->work[0].p, cnt, total,
                               in->dtype);
        size_t src = 0;
        for (int q = 0; q < t && s == TPK_OK; q++) {
            tpk_range r = tpk_tp_split(ctx, v.n, q);
            if (r.size && v.inner && v.outer)
                s = tpk_op_copy2d(ctx, TPK__AT(out, r.off * v.inner, in->dtype), v.n * v.inner,
                                  TPK__AT(ctx->work[0].p, src, in->dtype), r.size * v.inner,
                                  v.outer, r.size * v.inner, in->dtype);
            src += cnt[q];
        }
    }
    if (cnt != counts) tpk__free(ctx, cnt);
    return s;
}

/* P -> S(d) over the TP group: out = this rank's shard of the sum of every rank's `in`. */
static inline tpk_status tpk__reduce_scatter_dim(tpk_ctx *ctx, const tpk_tensor *in, int d,
                                                 int unit, void *out) {
    static const char *fn = "tpk_convert (reduce-scatter)";
    TPK_TRY(tpk__check_group(ctx, fn));
    int t = ctx->tp.size;
    tpk__dimview v = tpk__view_unit(in->gshape, in->ndim, d, unit);
    size_t counts[64], *cnt = counts;
    if (t > 64 && !(cnt = (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)t)))
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "counts");
    tpk__shard_counts(ctx, v, cnt);
    size_t total = (size_t)(v.outer * v.n * v.inner);
    const void *send = in->data;
    bool staged = v.outer > 1 || send == out; /* the scratch only when it is needed (SP's
                                                 reduce-scatters write elsewhere) */
    tpk_status s =
        staged ? tpk__buf_reserve(ctx, &ctx->work[0], total * tpk_dtype_size(in->dtype)) : TPK_OK;
    if (s == TPK_OK && v.outer > 1) { /* pack rank-major */
        size_t dst = 0;
        for (int q = 0; q < t && s == TPK_OK; q++) {
            tpk_range r = tpk_tp_split(ctx, v.n, q);
            if (r.size && v.inner && v.outer)
                s = tpk_op_copy2d(ctx, TPK__AT(ctx->work[0].p, dst, in->dtype), r.size * v.inner,
                                  TPK__AT(in->data, r.off * v.inner, in->dtype), v.n * v.inner,
                                  v.outer, r.size * v.inner, in->dtype);
            dst += cnt[q];
        }
        send = ctx->work[0].p;
    } else if (s == TPK_OK && send == out) { /* recv must not alias send */
        s = tpk_op_memcpy(ctx, ctx->work[0].p, send, total * tpk_dtype_size(in->dtype),
                          ctx->ops->device ? TPK_D2D : TPK_H2H);
        send = ctx->work[0].p;
    }
    if (s == TPK_OK)
        s = tpk_reduce_scatterv(ctx, &ctx->tp, send, total, out, cnt, in->dtype, TPK_SUM);
    if (cnt != counts) tpk__free(ctx, cnt);
    return s;
}

/* Convert `in` to layout `to` on the TP group; the result is written to out->data (the
 * caller's buffer) and out's shape and layout are set. */
static inline tpk_status tpk_convert(tpk_ctx *ctx, const tpk_tensor *in, tpk_layout to,
                                     tpk_tensor *out) {
    static const char *fn = "tpk_convert";
    char a[64], b[64];
    if (!ctx) return TPK_ERR_ARG;
    if (!in) return tpk__fail(ctx, TPK_ERR_ARG, fn, "in: NULL");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    if (in->ndim < 1 || in->ndim > TPK_MAX_DIMS)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "in: expected 1..%d dimensions, got %d",
                         TPK_MAX_DIMS, in->ndim);
    if (in->layout.kind == TPK_LAYOUT_S && tpk_layout_dim(in->layout, in->ndim) < 0)
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn,
                         "in: layout %s names no dimension of a %d-D tensor",
                         tpk_layout_str(in->layout, a, sizeof a), in->ndim);
    if (to.kind == TPK_LAYOUT_S && tpk_layout_dim(to, in->ndim) < 0)
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn,
                         "to: layout %s names no dimension of a %d-D tensor",
                         tpk_layout_str(to, a, sizeof a), in->ndim);
    if (to.kind == TPK_LAYOUT_S && in->gshape[tpk_layout_dim(to, in->ndim)] % tpk_layout_unit(to))
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                         "to: dim %d (%lld) is not a multiple of the unit %d",
                         tpk_layout_dim(to, in->ndim),
                         (long long)in->gshape[tpk_layout_dim(to, in->ndim)], tpk_layout_unit(to));
    if (tpk_layout_stride(in->layout) > 1 || tpk_layout_stride(to) > 1)
        return tpk__fail(
            ctx, TPK_ERR_LAYOUT, fn,
            "%s: strided shards are consumed where they are made (attention); no conversion",
            tpk_layout_stride(to) > 1 ? "to" : "in");
    if (tpk_layout_group(in->layout) > 1 || tpk_layout_group(to) > 1)
        return tpk__fail(
            ctx, TPK_ERR_LAYOUT, fn,
            "%s: grouped key/value shards are consumed where they are made (attention); no "
            "conversion",
            tpk_layout_group(to) > 1 ? "to" : "in");
    TPK_TRY(tpk__check(ctx, fn, "in", in, in->layout, in->dtype, in->ndim, NULL));
    int din = tpk_layout_dim(in->layout, in->ndim), dto = tpk_layout_dim(to, in->ndim);
    tpk_tensor o = *in;
    o.data = out->data, o.layout = to;
    for (int i = 0; i < in->ndim; i++) o.shape[i] = in->gshape[i];
    if (dto >= 0) o.shape[dto] = tpk_tp_shard_size(ctx, in->gshape[dto], to, ctx->tp.rank);
    if (!o.data && tpk_numel(&o) > 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "out->data: NULL, expected a buffer of %lld elements",
                         (long long)tpk_numel(&o));
    tpk_copy_dir dd = ctx->ops->device ? TPK_D2D : TPK_H2H;
    tpk_status s = TPK_OK;
    if (tpk_layout_eq(in->layout, to, in->ndim)) { /* same layout: copy */
        if (o.data != in->data && tpk_nbytes(in))
            s = tpk_op_memcpy(ctx, o.data, in->data, tpk_nbytes(in), dd);
    } else if (in->layout.kind == TPK_LAYOUT_P && to.kind == TPK_LAYOUT_R) {
        s = tpk_allreduce(ctx, &ctx->tp, in->data, o.data, (size_t)tpk_numel(in), in->dtype,
                          TPK_SUM);
    } else if (in->layout.kind == TPK_LAYOUT_P && to.kind == TPK_LAYOUT_S) {
        s = tpk__reduce_scatter_dim(ctx, in, dto, tpk_layout_unit(to), o.data);
    } else if (in->layout.kind == TPK_LAYOUT_S && to.kind == TPK_LAYOUT_R) {
        s = tpk__allgather_dim(ctx, in, din, tpk_layout_unit(in->layout), o.data);
    } else if (in->layout.kind == TPK_LAYOUT_R && to.kind == TPK_LAYOUT_S) {
        tpk__dimview v = tpk__view_unit(in->gshape, in->ndim, dto, tpk_layout_unit(to));
        tpk_range r = tpk_tp_split(ctx, v.n, ctx->tp.rank);
        if (r.size && v.inner && v.outer)
            s = tpk_op_copy2d(ctx, o.data, r.size * v.inner,
                              TPK__AT(in->data, r.off * v.inner, in->dtype), v.n * v.inner, v.outer,
                              r.size * v.inner, in->dtype);
    } else {
        /* R -> P and S -> P are not conversions (a partial value is not determined), nor S(d) ->
         * S(e) */
        return tpk__fail(
            ctx, TPK_ERR_LAYOUT, fn,
            "no conversion from %s to %s (expected to: R or S(d) from P, R from S(d), S(d) from R)",
            tpk_layout_str(in->layout, a, sizeof a), tpk_layout_str(to, b, sizeof b));
    }
    if (s == TPK_OK) *out = o;
    return s;
}

/* ---- region ops ------------------------------------------------------------------------ */

typedef enum tpk_region {
    TPK_REGION_COPY = 0,
    TPK_REGION_REDUCE,
    TPK_REGION_GATHER,
    TPK_REGION_SCATTER,
    TPK_REGION_SP_GATHER,
    TPK_REGION_SP_SCATTER,
    TPK_REGION_N
} tpk_region;

typedef struct tpk__region_rule {
    const char *name;
    tpk_layout fwd_in, fwd_out, bwd_in, bwd_out;
} tpk__region_rule;

static inline const tpk__region_rule *tpk__region_rules(tpk_region r) {
    static const tpk__region_rule rules[TPK_REGION_N] = {
        {"copy",
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_P, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0}},
        {"reduce",
         {TPK_LAYOUT_P, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0}},
        {"gather",
         {TPK_LAYOUT_S, -1, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_S, -1, 0, 0, 0}},
        {"scatter",
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_S, -1, 0, 0, 0},
         {TPK_LAYOUT_S, -1, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0}},
        {"sp_gather",
         {TPK_LAYOUT_S, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0},
         {TPK_LAYOUT_P, 0, 0, 0, 0},
         {TPK_LAYOUT_S, 0, 0, 0, 0}},
        {"sp_scatter",
         {TPK_LAYOUT_P, 0, 0, 0, 0},
         {TPK_LAYOUT_S, 0, 0, 0, 0},
         {TPK_LAYOUT_S, 0, 0, 0, 0},
         {TPK_LAYOUT_R, 0, 0, 0, 0}},
    };
    return (unsigned)r < TPK_REGION_N ? &rules[r] : NULL;
}

static inline tpk_status tpk__region(tpk_ctx *ctx, tpk_region r, bool backward,
                                     const tpk_tensor *in, tpk_tensor *out) {
    const char *fn = backward ? "tpk_region_backward" : "tpk_region_forward";
    char a[64], b[64];
    if (!ctx) return TPK_ERR_ARG;
    const tpk__region_rule *rule = tpk__region_rules(r);
    if (!rule)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "region: expected a tpk_region (0..%d), got %d",
                         TPK_REGION_N - 1, (int)r);
    if (!in) return tpk__fail(ctx, TPK_ERR_ARG, fn, "in: NULL");
    tpk_layout want = backward ? rule->bwd_in : rule->fwd_in,
               to = backward ? rule->bwd_out : rule->fwd_out;
    if (!tpk_layout_eq(in->layout, want, in->ndim))
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn, "%s %s: in: expected layout %s, got %s",
                         rule->name, backward ? "backward" : "forward",
                         tpk_layout_str(want, a, sizeof a),
                         tpk_layout_str(in->layout, b, sizeof b));
    return tpk_convert(ctx, in, to, out);
}
/* Forward of a region op: checks the input layout, writes out->data, sets out's layout. */
static inline tpk_status tpk_region_forward(tpk_ctx *ctx, tpk_region r, const tpk_tensor *in,
                                            tpk_tensor *out) {
    return tpk__region(ctx, r, false, in, out);
}
/* Backward of a region op: `in` is the gradient of the forward output. */
static inline tpk_status tpk_region_backward(tpk_ctx *ctx, tpk_region r, const tpk_tensor *in,
                                             tpk_tensor *out) {
    return tpk__region(ctx, r, true, in, out);
}

/* ---- the residual stream's crossings: branches summed while partial -------------------------
 *
 * A block whose branches each begin with column linears and end with a row linear (a parallel
 * residual block, y = x + attn(n1(x)) + mlp(n2(x)): GPT-J, GPT-NeoX) adds its branches' partial
 * outputs and reduces once. The residual stream is R [T, H] (S(0) under sequence parallelism):
 *   gather  forward   stream -> R [T, H]: x itself (SP: its tokens all-gathered into the helper's
 *                     buffer, which the norms read until the backward)
 *           backward  P [T, H] (the norms' partial input gradients, added) -> stream: all-reduce
 *                     (SP: reduce-scatter), + skip (the residual's dy) when given
 *   reduce  forward   P [T, H] (the branches' partial outputs, added) -> stream: all-reduce
 *                     (SP: reduce-scatter), + skip (the residual x) when given
 *           backward  dy stream -> R [T, H], the gradient of the partial sum on every rank: dy
 *                     itself (SP: its tokens all-gathered into the helper's buffer)
 * They are the region ops copy / sp_gather and reduce / sp_scatter with buffers of their own and
 * the residual add. A block, forward:
 *     xr = gather(x); a = attn(n1(xr)) P; m = mlp(n2(xr)) P; a += m; y = reduce(a, skip x)
 * backward: dr = reduce'(dy); da = attn'(dr) P; dm = mlp'(dr) P; dn = n1'(da) P;
 *     dn += n2'(dm) (backward_add); dx = gather'(dn, skip dy)
 * (the norms with partial_dy, the branches with partial_output and partial_dx, none of them
 * sequence parallel: under SP only the stream is S(0)). One all-reduce each way (SP: one
 * all-gather and one reduce-scatter each way); the norms' weight gradients are partial over TP
 * (tpk_params_reduce_partial_grads, once per step). */

typedef struct tpk_stream_desc {
    bool sequence_parallel; /* the stream S(0) (token rows), else R */
} tpk_stream_desc;

typedef struct tpk_stream {
    int64_t H;
    bool sp;
    int64_t T, Ty;          /* token rows of the last gather forward, of the last reduce forward */
    tpk_buf xg, dx, y, dp;  /* gather's output and input gradient, reduce's */
} tpk_stream;

/* A crossing of a residual stream of H features (no parameters). */
static inline tpk_status tpk_stream_init(tpk_ctx *ctx, tpk_stream *s, int64_t H,
                                         const tpk_stream_desc *desc) {
    static const char *fn = "tpk_stream_init";
    tpk_stream_desc d;
    TPK__INIT_LAYER(ctx, fn, s, d, desc);
    if (H < 1) return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "H: expected >= 1, got %lld", (long long)H);
    s->H = H, s->sp = d.sequence_parallel, s->T = s->Ty = -1;
    return TPK_OK;
}

static inline void tpk_stream_destroy(tpk_ctx *ctx, tpk_stream *s) {
    tpk__buf_free(ctx, &s->xg), tpk__buf_free(ctx, &s->dx), tpk__buf_free(ctx, &s->y),
        tpk__buf_free(ctx, &s->dp);
}

static inline tpk_status tpk__stream_check(tpk_ctx *ctx, const char *fn, const tpk_stream *s,
                                           const void *out, const char *out_name) {
    if (!ctx) return TPK_ERR_ARG;
    if (!s || !s->H)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "stream: expected an initialised tpk_stream");
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", out_name);
    return TPK_OK;
}
/* *out += skip, skip in out's layout and global shape (NULL: nothing). */
static inline tpk_status tpk__stream_skip(tpk_ctx *ctx, const char *fn, tpk_tensor *out,
                                          const tpk_tensor *skip) {
    if (!skip) return TPK_OK;
    TPK_TRY(tpk__check(ctx, fn, "skip", skip, out->layout, ctx->dtype, 2, out->gshape));
    size_t n = (size_t)tpk_numel(out);
    return n ? tpk_op_axpby(ctx, out->data, 1.0f, skip->data, 1.0f, ctx->dtype, n) : TPK_OK;
}

/* x R [T, H] (S(0) under sequence parallelism) -> *xr R [T, H]: x itself, or (SP) its tokens
 * all-gathered into the stream's buffer, valid until its next gather forward. */
static inline tpk_status tpk_stream_gather_forward(tpk_ctx *ctx, tpk_stream *s, tpk_tensor x,
                                                   tpk_tensor *xr) {
    static const char *fn = "tpk_stream_gather_forward";
    TPK_TRY(tpk__stream_check(ctx, fn, s, xr, "xr"));
    int64_t want[2] = {-1, s->H};
    TPK_TRY(tpk__check(ctx, fn, "x", &x, s->sp ? TPK_S(0) : TPK_R, ctx->dtype, 2, want));
    s->T = x.gshape[0];
    if (!s->sp) return *xr = x, TPK_OK;
    tpk_tensor g = tpk_tensor_2d(NULL, ctx->dtype, s->T, s->H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &s->xg, &g));
    TPK_TRY(tpk_region_forward(ctx, TPK_REGION_SP_GATHER, &x, &g)); /* all-gather tokens */
    *xr = tpk__rows_of(g, &x); /* x's rows (CP), as every output here its input's */
    return TPK_OK;
}

/* The gradient of the last gather forward: dp P [T, H] -> *dx R [T, H] (all-reduce; S(0) under
 * sequence parallelism: reduce-scatter), plus skip (the stream's layout; NULL: none), in the
 * stream's buffer, valid until its next gather backward. */
static inline tpk_status tpk_stream_gather_backward(tpk_ctx *ctx, tpk_stream *s, tpk_tensor dp,
                                                    const tpk_tensor *skip, tpk_tensor *dx) {
    static const char *fn = "tpk_stream_gather_backward";
    TPK_TRY(tpk__stream_check(ctx, fn, s, dx, "dx"));
    if (s->T < 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "stream: backward before forward");
    int64_t want[2] = {s->T, s->H};
    TPK_TRY(tpk__check(ctx, fn, "dp", &dp, TPK_P, ctx->dtype, 2, want));
    tpk_tensor o = s->sp ? tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, s->T, s->H, TPK_S(0))
                         : tpk_tensor_2d(NULL, ctx->dtype, s->T, s->H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &s->dx, &o));
    /* P -> reduce-scatter (SP) / all-reduce */
    TPK_TRY(tpk_region_backward(ctx, s->sp ? TPK_REGION_SP_GATHER : TPK_REGION_COPY, &dp, &o));
    TPK_TRY(tpk__stream_skip(ctx, fn, &o, skip));
    *dx = tpk__rows_of(o, &dp);
    return TPK_OK;
}

/* p P [T, H] -> *y R [T, H] (all-reduce; S(0) under sequence parallelism: reduce-scatter), plus
 * skip (the stream's layout; NULL: none), in the stream's buffer, valid until its next reduce
 * forward. */
static inline tpk_status tpk_stream_reduce_forward(tpk_ctx *ctx, tpk_stream *s, tpk_tensor p,
                                                   const tpk_tensor *skip, tpk_tensor *y) {
    static const char *fn = "tpk_stream_reduce_forward";
    TPK_TRY(tpk__stream_check(ctx, fn, s, y, "y"));
    int64_t want[2] = {-1, s->H};
    TPK_TRY(tpk__check(ctx, fn, "p", &p, TPK_P, ctx->dtype, 2, want));
    int64_t T = p.gshape[0];
    tpk_tensor o = s->sp ? tpk_tp_tensor_2d(ctx, NULL, ctx->dtype, T, s->H, TPK_S(0))
                         : tpk_tensor_2d(NULL, ctx->dtype, T, s->H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &s->y, &o));
    /* reduce-scatter (SP) / all-reduce */
    TPK_TRY(tpk_region_forward(ctx, s->sp ? TPK_REGION_SP_SCATTER : TPK_REGION_REDUCE, &p, &o));
    TPK_TRY(tpk__stream_skip(ctx, fn, &o, skip));
    s->Ty = T;
    *y = tpk__rows_of(o, &p);
    return TPK_OK;
}

/* The gradient of the last reduce forward's partial input: dy R [T, H] (S(0) under sequence
 * parallelism) -> *dp R [T, H]: dy itself, or (SP) its tokens all-gathered into the stream's
 * buffer, valid until its next reduce backward. Every branch's backward reads it. */
static inline tpk_status tpk_stream_reduce_backward(tpk_ctx *ctx, tpk_stream *s, tpk_tensor dy,
                                                    tpk_tensor *dp) {
    static const char *fn = "tpk_stream_reduce_backward";
    TPK_TRY(tpk__stream_check(ctx, fn, s, dp, "dp"));
    if (s->Ty < 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "stream: backward before forward");
    int64_t want[2] = {s->Ty, s->H};
    TPK_TRY(tpk__check(ctx, fn, "dy", &dy, s->sp ? TPK_S(0) : TPK_R, ctx->dtype, 2, want));
    if (!s->sp) return *dp = dy, TPK_OK;
    tpk_tensor g = tpk_tensor_2d(NULL, ctx->dtype, s->Ty, s->H, TPK_R);
    TPK_TRY(tpk__buf_view(ctx, &s->dp, &g));
    TPK_TRY(tpk_region_backward(ctx, TPK_REGION_SP_SCATTER, &dy, &g)); /* all-gather tokens */
    *dp = tpk__rows_of(g, &dy);
    return TPK_OK;
}

#endif /* TPK_LAYOUT_H */
