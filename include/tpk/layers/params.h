/* tpk/layers/params.h — the parameter registry: every parameter's name, global shape, split and
 * offset into one flat f32 buffer per rank (gradients in a second, same offsets).
 *
 * A parameter is replicated (layout R) or split on dim d (layout S(d)) with a stride s: dim d
 * is s equal blocks, each split over the TP ranks with tpk_tp_split (even, or by the context's TP
 * weights; in whole units of the layout's unit), and the shard holds this rank's slice of every
 * block in order (s = 3 for the fused [Q; K; V] weight).
 * Initial values come from the counter-based RNG keyed by (ctx seed, stream = hash(name),
 * global element index), so a shard holds exactly its slice of the unsharded tensor, and the
 * model is the same at every TP size. Layers keep parameter ids, never pointers: the flat
 * buffers grow (and move) while parameters are added. Each parameter starts at a multiple of
 * TPK_PARAM_ALIGN elements (64 bytes of f32, 32 of its bf16 copy) — except a later part of one
 * strided shard (tpk_param_desc.follows: Llama's up_proj after gate_proj), which comes right
 * after the part before —, so a bias can feed a GEMM
 * epilogue (cuBLASLt reads those vectors 16 bytes at a time); the few elements between two
 * parameters are zero and stay zero (their gradient is zero, no weight decay reaches them). */
#ifndef TPK_PARAMS_H
#define TPK_PARAMS_H

#include "layout.h"
#include "../base/rng.h"

typedef enum tpk_init { TPK_INIT_ZEROS = 0, TPK_INIT_ONES, TPK_INIT_NORMAL } tpk_init;

enum { TPK_PARAM_ALIGN = 16 }; /* a parameter's offset in the flat buffers is a multiple of this */

typedef struct tpk_param_desc {
    const char *name;              /* unique within the context */
    int ndim;
    int64_t shape[TPK_MAX_DIMS];   /* global shape */
    tpk_layout layout;             /* R (default), S(d) or TPK_S_EX(d, stride, unit) */
    tpk_init init;                 /* default zeros */
    float std;                     /* for TPK_INIT_NORMAL */
    bool decay;                    /* weight decay applies */
    int64_t padded_rows;           /* 0: none. Else >= shape[0]: dim 0 is stored and sharded as this
                                      many rows, the rows from shape[0] on zero padding (layout R or
                                      S(0) with stride 1; a unit must divide it): never trained, not
                                      in tpk_param_gather/scatter (nor in checkpoints); e.g. a
                                      vocabulary padded to aligned shards (layout
                                      tpk_tp_vocab_layout) */
    bool follows;                  /* placed right after the previous parameter, with no gap (the
                                      parts of one strided shard: tpk_linear_desc.parts); else at
                                      the next multiple of TPK_PARAM_ALIGN elements */
} tpk_param_desc;

/* Calls f(ctx, arg, global_index_along_d, local_index_along_d, count) for each run of
 * consecutive indices along the split dim that this shard holds. */
typedef struct tpk__run { int64_t g0, l0, n; } tpk__run;
static inline int tpk__param_runs(const tpk_ctx *ctx, const tpk_param *p, int index, tpk__run *runs,
                                  int max) {
    if (p->split_dim < 0) {
        if (max > 0) runs[0] = TPK_LIT(tpk__run){0, 0, p->gshape[0]};
        return 1;
    }
    int n = 0;
    for (int b = 0; b < p->stride; b++) {
        tpk_range r = tpk_tp_shard_run(ctx, p->gshape[p->split_dim], p->layout, index, b);
        if (n < max) runs[n++] = TPK_LIT(tpk__run){r.off, b * r.size, r.size};
    }
    return n;
}

/* p as stored: dim 0 with its padding rows; sharding, runs and placement work on this view. */
static inline tpk_param tpk__param_stored(const tpk_param *p) {
    tpk_param s = *p;
    s.gshape[0] = p->padded_rows;
    return s;
}

static inline tpk_param *tpk__param(tpk_ctx *ctx, const char *fn, int id) {
    if (!ctx) return NULL;
    if (id < 0 || id >= ctx->params.n) {
        tpk__fail(ctx, TPK_ERR_ARG, fn, "id: expected 0..%d, got %d", ctx->params.n - 1, id);
        return NULL;
    }
    return &ctx->params.list[id];
}

/* Pointers into the flat buffers (backend memory); valid until the next tpk_param_add. */
static inline float *tpk_param_data(tpk_ctx *ctx, int id) {
    if (ctx->params.at) return ctx->params.at[id]; /* ZeRO-3's gathered buffers */
    return (float *)ctx->params.data.p + ctx->params.list[id].offset;
}
static inline float *tpk_param_grad(tpk_ctx *ctx, int id) {
    if (ctx->params.gat) return ctx->params.gat[id]; /* ZeRO-3's sharded gradients */
    return (float *)ctx->params.grad.p + ctx->params.list[id].offset;
}

/* The elements [*lo, *hi) of the flat buffers that this rank counts for parameter id in a sum over
 * the whole model (a norm, a dot product): a sharded parameter's whole shard, a replicated one on
 * TP rank 0 only (empty elsewhere), a grouped key/value weight the heads no lower rank also
 * holds. */
static inline void tpk__param_counted(const tpk_ctx *ctx, int id, size_t *lo, size_t *hi) {
    const tpk_param *p = &ctx->params.list[id];
    *lo = *hi = p->offset;
    if (p->pp_copy) return; /* counted on the stage that holds the original */
    if (p->split_dim >= 0 || ctx->tp.rank == 0) *hi = p->offset + p->numel;
    if (tpk_layout_group(p->layout) > 1) {
        tpk_range own = tpk_tp_shard_owned(ctx, p->gshape[0], p->layout, ctx->tp.rank);
        size_t inner = p->shape[0] ? p->numel / (size_t)p->shape[0] : 0;
        *lo = p->offset + (size_t)own.off * inner, *hi = *lo + (size_t)own.size * inner;
    }
}

/* The index's first slot for a name: its FNV-1a (tpk_rng_stream), masked to the table. */
static inline size_t tpk__param_slot(const char *name, int cap) {
    return (size_t)(tpk_rng_stream(name) & (uint64_t)(cap - 1));
}
/* Id of the parameter with this name, or -1 (the hash index: constant time). */
static inline int tpk_param_find(const tpk_ctx *ctx, const char *name) {
    const tpk_params *P = &ctx->params;
    if (!P->index_cap || !name) return -1;
    for (size_t i = tpk__param_slot(name, P->index_cap);;
         i = (i + 1) & (size_t)(P->index_cap - 1)) {
        int id = P->index[i];
        if (id < 0) return -1;
        if (!strcmp(P->list[id].name, name)) return id;
    }
}
/* Put id (registered in list) into the index, doubling the table (rehashing every id) when it
 * would be more than half full: amortised constant time per parameter. */
static inline tpk_status tpk__param_index_add(tpk_ctx *ctx, const char *fn, int id) {
    tpk_params *P = &ctx->params;
    if (2 * (id + 1) >= P->index_cap) {
        int cap = P->index_cap ? 2 * P->index_cap : 64;
        int *t = (int *)tpk__malloc(ctx, sizeof(int) * (size_t)cap);
        if (!t) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
        for (int i = 0; i < cap; i++) t[i] = -1;
        tpk__free(ctx, P->index);
        P->index = t, P->index_cap = cap;
        for (int k = 0; k < id; k++)
            TPK_TRY(tpk__param_index_add(ctx, fn, k)); /* fits: no growth */
    }
    size_t i = tpk__param_slot(P->list[id].name, P->index_cap);
    while (P->index[i] >= 0) i = (i + 1) & (size_t)(P->index_cap - 1);
    P->index[i] = id;
    return TPK_OK;
}

/* Draw a shard's slice of the global random tensor: the tensor is viewed as
 * [outer, n * inner] (n the split dim) and each run of the shard is a column block of it. */
static inline tpk_status tpk__param_draw(tpk_ctx *ctx, int id, tpk_init init, float std) {
    tpk_param ps = tpk__param_stored(&ctx->params.list[id]), *p = &ps;
    float *x = tpk_param_data(ctx, id);
    if (init == TPK_INIT_ZEROS) return tpk_op_fill(ctx, x, TPK_F32, p->numel, 0.f);
    if (init == TPK_INIT_ONES) return tpk_op_fill(ctx, x, TPK_F32, p->numel, 1.f);
    uint64_t stream = tpk_rng_stream(p->name);
    int d = p->split_dim < 0 ? 0 : p->split_dim;
    tpk__dimview g = tpk__view(p->gshape, p->ndim, d);
    int64_t L = p->shape[d];
    tpk__run runs[64];
    int nr = tpk__param_runs(ctx, p, ctx->tp.rank, runs, 64);
    for (int k = 0; k < nr; k++) {
        if (!runs[k].n) continue;
        /* rows o of the [outer, n*inner] view; local columns l0*inner.. of a row of L*inner */
        bool contiguous = g.outer == 1 || runs[k].n == L;
        for (int64_t o = 0; o < (contiguous ? 1 : g.outer); o++) {
            int64_t rows = contiguous ? g.outer : 1;
            float *dst = x + (o * L + runs[k].l0) * g.inner;
            TPK_TRY(tpk_op_rng_2d(ctx, dst, TPK_F32, rows, runs[k].n * g.inner, g.n * g.inner, o,
                                  runs[k].g0 * g.inner, ctx->seed, stream, TPK_RNG_NORMAL, 0.f,
                                  std));
        }
    }
    return TPK_OK;
}
/* Initialise parameter id's shard; its padding rows (global rows >= gshape[0]) zero. The random
 * values of a padded parameter's rows are those of the unpadded one (index row * inner + col). */
static inline tpk_status tpk__param_init(tpk_ctx *ctx, int id, tpk_init init, float std) {
    tpk_param *p = &ctx->params.list[id];
    if (!p->numel) return TPK_OK;
    TPK_TRY(tpk__param_draw(ctx, id, init, std));
    if (p->padded_rows == p->gshape[0]) return TPK_OK;
    tpk_param ps = tpk__param_stored(p);
    size_t inner = p->numel / (size_t)p->shape[0]; /* padded: dim 0 is the split dim or none */
    tpk__run runs[64];
    int nr = tpk__param_runs(ctx, &ps, ctx->tp.rank, runs, 64);
    for (int k = 0; k < nr; k++) {
        int64_t first = p->gshape[0] - runs[k].g0; /* the run's first padding row */
        if (first < 0) first = 0;
        if (first < runs[k].n)
            TPK_TRY(tpk_op_fill(ctx, tpk_param_data(ctx, id) + (size_t)(runs[k].l0 + first) * inner,
                                TPK_F32, (size_t)(runs[k].n - first) * inner, 0.f));
    }
    return TPK_OK;
}

/* The flat buffers moved to room for cap elements, the values and gradients kept. */
static inline tpk_status tpk__params_realloc(tpk_ctx *ctx, size_t cap) {
    tpk_params *P = &ctx->params;
    tpk_buf nd = {0, 0}, ng = {0, 0};
    tpk_copy_dir dd = ctx->ops->device ? TPK_D2D : TPK_H2H;
    tpk_status s = tpk__buf_reserve(ctx, &nd, cap * sizeof(float));
    if (s == TPK_OK) s = tpk__buf_reserve(ctx, &ng, cap * sizeof(float));
    if (s == TPK_OK && P->numel)
        s = tpk_op_memcpy(ctx, nd.p, P->data.p, P->numel * sizeof(float), dd);
    if (s == TPK_OK && P->numel)
        s = tpk_op_memcpy(ctx, ng.p, P->grad.p, P->numel * sizeof(float), dd);
    if (s != TPK_OK) {
        tpk__buf_free(ctx, &nd), tpk__buf_free(ctx, &ng);
        return s;
    }
    tpk__buf_free(ctx, &P->data), tpk__buf_free(ctx, &P->grad);
    P->data = nd, P->grad = ng, P->cap_numel = cap;
    return TPK_OK;
}
/* Room for `need` elements: the capacity doubled until it fits (registration: amortised). */
static inline tpk_status tpk__params_grow(tpk_ctx *ctx, size_t need) {
    tpk_params *P = &ctx->params;
    if (need <= P->cap_numel && P->data.p) return TPK_OK;
    size_t cap = P->cap_numel ? P->cap_numel : 1024;
    while (cap < need) cap *= 2;
    return tpk__params_realloc(ctx, cap);
}
/* The flat buffers cut to the registered elements. Registration doubles them (up to twice the
 * parameters, in the f32 weights and again in their gradients), and a model would keep that slack
 * all its life: tpk_adamw_init trims, the parameter set being final once an optimizer holds it. */
static inline tpk_status tpk_params_trim(tpk_ctx *ctx) {
    if (!ctx) return TPK_ERR_ARG;
    tpk_params *P = &ctx->params;
    if (!P->data.p || P->cap_numel <= (P->numel ? P->numel : 1)) return TPK_OK;
    return tpk__params_realloc(ctx, P->numel ? P->numel : 1);
}

/* Register a parameter, allocate its shard (its gradient zeroed) and initialise it. */
static inline tpk_status tpk_param_add(tpk_ctx *ctx, const tpk_param_desc *desc, int *id) {
    static const char *fn = "tpk_param_add";
    char a[64];
    if (!ctx) return TPK_ERR_ARG;
    if (!desc || !id) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", desc ? "id" : "desc");
    if (!desc->name || !desc->name[0] || strlen(desc->name) >= sizeof ctx->params.list[0].name)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->name: expected a name of 1..%zu characters",
                         sizeof ctx->params.list[0].name - 1);
    int old = tpk_param_find(ctx, desc->name);
    if (old >= 0 && ctx->params.reuse) { /* another copy of a model: the same parameter */
        const tpk_param *q = &ctx->params.list[old];
        bool same = q->ndim == desc->ndim && tpk_layout_eq(q->layout, desc->layout, q->ndim) &&
                    q->padded_rows == (desc->padded_rows ? desc->padded_rows : desc->shape[0]);
        for (int i = 0; same && i < q->ndim; i++) same = q->gshape[i] == desc->shape[i];
        if (same) {
            *id = old;
            if (old < ctx->params.mark_lo) ctx->params.mark_lo = old;
            if (old > ctx->params.mark_hi) ctx->params.mark_hi = old;
            return TPK_OK;
        }
    }
    if (old >= 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->name: \"%s\" is already registered%s",
                         desc->name, ctx->params.reuse ? " with another shape or layout" : "");
    if (desc->ndim < 1 || desc->ndim > TPK_MAX_DIMS)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: ndim: expected 1..%d, got %d", desc->name,
                         TPK_MAX_DIMS, desc->ndim);
    for (int i = 0; i < desc->ndim; i++)
        if (desc->shape[i] < 0)
            return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "%s: shape[%d]: expected >= 0, got %lld",
                             desc->name, i, (long long)desc->shape[i]);
    if (desc->layout.kind == TPK_LAYOUT_P ||
        (desc->layout.kind == TPK_LAYOUT_S && tpk_layout_dim(desc->layout, desc->ndim) < 0))
        return tpk__fail(ctx, TPK_ERR_LAYOUT, fn,
                         "%s: layout: expected R or S(d) with d a dimension, got %s", desc->name,
                         tpk_layout_str(desc->layout, a, sizeof a));
    if (tpk_layout_group(desc->layout) > 1 &&
        (tpk_layout_dim(desc->layout, desc->ndim) != 0 || tpk_layout_stride(desc->layout) != 1 ||
         desc->padded_rows))
        return tpk__fail(
            ctx, TPK_ERR_LAYOUT, fn,
            "%s: layout: a grouped layout must be on dim 0 with stride 1 and no padding, got %s",
            desc->name, tpk_layout_str(desc->layout, a, sizeof a));
    if (desc->init != TPK_INIT_ZEROS && desc->init != TPK_INIT_ONES &&
        desc->init != TPK_INIT_NORMAL)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "%s: init: expected TPK_INIT_ZEROS, _ONES or _NORMAL, got %d", desc->name,
                         (int)desc->init);
    tpk_param p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "%s", desc->name);
    p.ndim = desc->ndim, p.decay = desc->decay;
    p.split_dim = tpk_layout_dim(desc->layout, desc->ndim);
    p.stride = tpk_layout_stride(desc->layout);
    p.layout = desc->layout;
    p.numel = 1;
    for (int i = 0; i < p.ndim; i++) p.gshape[i] = p.shape[i] = desc->shape[i];
    p.padded_rows = desc->padded_rows ? desc->padded_rows : p.gshape[0];
    if (desc->padded_rows &&
        (desc->padded_rows < p.gshape[0] || p.split_dim > 0 || (p.split_dim == 0 && p.stride != 1)))
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "%s: padded_rows: expected >= shape[0] = %lld with layout R or S(0) (stride 1), got "
            "%lld with %s",
            desc->name, (long long)p.gshape[0], (long long)desc->padded_rows,
            tpk_layout_str(desc->layout, a, sizeof a));
    p.shape[0] = p.padded_rows; /* stored rows; the split below shards them */
    if (p.split_dim >= 0) {
        int64_t n = p.split_dim == 0 ? p.padded_rows : p.gshape[p.split_dim],
                su = (int64_t)p.stride * tpk_layout_unit(desc->layout);
        if (p.stride > 64 || n % su)
            return tpk__fail(
                ctx, TPK_ERR_SHAPE, fn,
                "%s: layout: dim %d (%lld) must be a multiple of stride x unit = %lld (stride at "
                "most 64)",
                desc->name, p.split_dim, (long long)n, (long long)su);
        p.shape[p.split_dim] = tpk_tp_shard_size(ctx, n, desc->layout, ctx->tp.rank);
    }
    for (int i = 0; i < p.ndim; i++) p.numel *= (size_t)p.shape[i];
    tpk_params *P = &ctx->params;
    if (P->n == P->cap) {
        int cap = P->cap ? 2 * P->cap : 32;
        tpk_param *l = (tpk_param *)tpk__realloc(ctx, P->list, sizeof *l * (size_t)P->cap,
                                                 sizeof *l * (size_t)cap);
        if (!l) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
        P->list = l, P->cap = cap;
    }
    p.offset = desc->follows ? P->numel
                             : (P->numel + TPK_PARAM_ALIGN - 1) / TPK_PARAM_ALIGN *
                                   TPK_PARAM_ALIGN; /* a gap: zeros */
    TPK_TRY(tpk__params_grow(ctx, p.offset + p.numel));
    P->list[P->n] = p;
    TPK_TRY(tpk__param_index_add(ctx, fn, P->n));
    *id = P->n++;
    if (*id < P->mark_lo) P->mark_lo = *id;
    if (*id > P->mark_hi) P->mark_hi = *id;
    P->numel = p.offset + p.numel;
    P->stale16 = true;
    return tpk__param_init(ctx, *id, desc->init, desc->std);
}

/* Start recording the ids tpk_param_add gives (ctx->params.mark_lo, _hi); tpk__params_marked then
 * gives the range registered — or reused, in another copy of a model — since: a block's
 * parameters (first..last; first = the count and last = first - 1 when none). */
static inline void tpk__params_mark(tpk_ctx *ctx) {
    ctx->params.mark_lo = INT_MAX, ctx->params.mark_hi = -1;
}
static inline void tpk__params_marked(const tpk_ctx *ctx, int *first, int *last) {
    bool none = ctx->params.mark_hi < 0;
    *first = none ? ctx->params.n : ctx->params.mark_lo;
    *last = none ? ctx->params.n - 1 : ctx->params.mark_hi;
}

/* tpk_param_add of a 1-D [d0] or 2-D [d0, d1] parameter, the descriptor filled from arguments. */
static inline tpk_status tpk__param_add(tpk_ctx *ctx, const char *name, int ndim, int64_t d0,
                                        int64_t d1, tpk_layout layout, tpk_init init, float std,
                                        bool decay, int *id) {
    tpk_param_desc d;
    memset(&d, 0, sizeof d);
    d.name = name, d.ndim = ndim, d.shape[0] = d0, d.shape[1] = ndim > 1 ? d1 : 0,
    d.layout = layout;
    d.init = init, d.std = std, d.decay = decay;
    return tpk_param_add(ctx, &d, id);
}

/* ---- mixed precision (ctx->dtype == TPK_BF16) ---------------------------------------------- */

/* Say that the master weights changed (after an optimizer step that wrote them directly), so a
 * bf16 context remakes its bf16 copy before the next forward. tpk_param_add, tpk_param_set_global
 * and tpk_param_scatter into the data buffer say it themselves. */
static inline void tpk_params_updated(tpk_ctx *ctx) { ctx->params.stale16 = true; }

/* Make the bf16 copy of the weights current (no-op for f32). Layers call it in forward. */
static inline tpk_status tpk__params_fresh(tpk_ctx *ctx) {
    tpk_params *P = &ctx->params;
    /* (ZeRO-3, P->at16: each unit's copy made when it is gathered) */
    if (ctx->dtype != TPK_BF16 || !P->stale16 || !P->numel || P->at16) return TPK_OK;
    TPK_TRY(tpk__buf_reserve(ctx, &P->data16, P->numel * 2));
    TPK_TRY(tpk_op_cast(ctx, P->data16.p, TPK_BF16, P->data.p, TPK_F32, P->numel));
    P->stale16 = false;
    return TPK_OK;
}
/* Parameter id's weights in the context's dtype (the bf16 copy, or the f32 master). */
static inline const void *tpk__param_w(tpk_ctx *ctx, int id) {
    const tpk_params *P = &ctx->params;
    if (ctx->dtype == TPK_BF16)
        return P->at16 ? (const void *)P->at16[id]
                       : (const void *)((const uint16_t *)P->data16.p + P->list[id].offset);
    return tpk_param_data(ctx, id);
}
/* grad[off .. off + n) += src (n elements in ctx->dtype). */
static inline tpk_status tpk__grad_add(tpk_ctx *ctx, float *grad, const void *src, size_t n) {
    if (!n) return TPK_OK;
    if (ctx->dtype == TPK_F32) return tpk_op_axpby(ctx, grad, 1.0f, src, 1.0f, TPK_F32, n);
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->params.scratch, n * sizeof(float)));
    TPK_TRY(tpk_op_cast(ctx, ctx->params.scratch.p, TPK_F32, src, ctx->dtype, n));
    return tpk_op_axpby(ctx, grad, 1.0f, ctx->params.scratch.p, 1.0f, TPK_F32, n);
}
/* grad(id) [m, n] += op(A) op(B), A and B in ctx->dtype, straight into the f32 gradient: bf16
 * operands through gemm_acc (f32 C, beta = 1: no bf16 product, no rounding, no extra pass). */
static inline tpk_status tpk__grad_gemm(tpk_ctx *ctx, int id, bool ta, bool tb, int64_t m,
                                        int64_t n, int64_t k, const void *a, int64_t lda,
                                        const void *b, int64_t ldb) {
    float *g = tpk_param_grad(ctx, id);
    if (ctx->dtype == TPK_F32)
        return tpk_op_gemm(ctx, ta, tb, m, n, k, 1.f, a, lda, b, ldb, 1.f, g, n, TPK_F32);
    return tpk_op_gemm_acc(ctx, ta, tb, m, n, k, 1.f, a, lda, b, ldb, 1.f, g, n, ctx->dtype);
}
/* grad(id) [cols] += column sums of dy [rows, cols] (ctx->dtype), straight into the f32
 * gradient. */
static inline tpk_status tpk__grad_bias(tpk_ctx *ctx, int id, const void *dy, int64_t rows,
                                        int64_t cols) {
    return tpk_op_bias_grad(ctx, tpk_param_grad(ctx, id), dy, rows, cols, ctx->dtype, TPK_F32,
                            true);
}

/* Zero every gradient (ZeRO-3's sharded gradients: a new accumulation, its slice zeroed at the
 * next backward; each block's buffer is zeroed as its backward begins). */
static inline tpk_status tpk_params_zero_grad(tpk_ctx *ctx) {
    if (ctx->params.gat) return ctx->params.grad_epoch++, TPK_OK;
    if (!ctx->params.numel) return TPK_OK;
    return tpk_op_fill(ctx, ctx->params.grad.p, TPK_F32, ctx->params.numel, 0.f);
}

/* Copy between a shard (local, [shape]) and the global tensor on the host, per run of the
 * split dim. to_global: shard -> global, else global -> shard. */
static inline void tpk__param_place(const tpk_ctx *ctx, const tpk_param *p, int index,
                                    float *global, float *local, bool to_global) {
    int d = p->split_dim < 0 ? 0 : p->split_dim;
    tpk__dimview g = tpk__view(p->gshape, p->ndim, d);
    int64_t L = p->split_dim < 0 ? g.n : tpk_tp_shard_size(ctx, g.n, p->layout, index);
    tpk__run runs[64];
    int nr = tpk__param_runs(ctx, p, index, runs, 64);
    for (int k = 0; k < nr; k++)
        for (int64_t o = 0; o < g.outer; o++) {
            float *gp = global + (o * g.n + runs[k].g0) * g.inner,
                  *lp = local + (o * L + runs[k].l0) * g.inner;
            size_t bytes = (size_t)(runs[k].n * g.inner) * sizeof(float);
            if (bytes) memcpy(to_global ? gp : lp, to_global ? lp : gp, bytes);
        }
}

static inline size_t tpk__gnumel(const tpk_param *p) {
    size_t n = 1;
    for (int i = 0; i < p->ndim; i++) n *= (size_t)p->gshape[i];
    return n;
}
/* Global element count of a parameter (without padding rows). */
static inline size_t tpk_param_global_numel(const tpk_ctx *ctx, int id) {
    return tpk__gnumel(&ctx->params.list[id]);
}
/* Elements of the whole (unsharded) model: every parameter's global size. */
static inline size_t tpk_params_global_numel(const tpk_ctx *ctx) {
    size_t n = 0;
    for (int i = 0; i < ctx->params.n; i++) n += tpk_param_global_numel(ctx, i);
    return n;
}

/* Parameter `id`'s slice of `flat` (backend memory laid out like the parameter buffer: the
 * data, the gradients, or an optimizer moment), gathered over the TP group into the whole
 * tensor in host memory `out` (global numel floats). Collective over the TP group. */
static inline tpk_status tpk_param_gather(tpk_ctx *ctx, int id, const float *flat, float *out) {
    static const char *fn = "tpk_param_gather";
    tpk_param *p = tpk__param(ctx, fn, id);
    if (!p) return TPK_ERR_ARG;
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    if (!flat) return tpk__fail(ctx, TPK_ERR_ARG, fn, "flat: NULL");
    int t = ctx->tp.size;
    tpk_param ps = tpk__param_stored(p); /* gathered with its padding rows, which are then left
                                            out */
    size_t gnumel = tpk__gnumel(p), snumel = tpk__gnumel(&ps),
           *counts = (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)t);
    float *host = (float *)tpk__malloc(ctx, sizeof(float) * snumel),
          *whole = (float *)tpk__malloc(ctx, sizeof(float) * snumel);
    tpk_status s =
        counts && host && whole ? TPK_OK : tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    const float *src = flat + p->offset;
    if (s == TPK_OK && p->split_dim < 0) {
        s = tpk_op_memcpy(ctx, out, src, gnumel * sizeof(float),
                          ctx->ops->device ? TPK_D2H : TPK_H2H); /* the padding is last */
    } else if (s == TPK_OK) {
        size_t total = 0;
        for (int q = 0; q < t; q++) {
            tpk_param pq = ps;
            pq.shape[p->split_dim] = tpk_tp_shard_size(ctx, ps.gshape[p->split_dim], p->layout, q);
            counts[q] = 1;
            for (int i = 0; i < p->ndim; i++) counts[q] *= (size_t)pq.shape[i];
            total += counts[q];
        }
        if (total > snumel) { /* grouped: heads held by several ranks come more than once */
            tpk__free(ctx, host);
            if (!(host = (float *)tpk__malloc(ctx, sizeof(float) * total)))
                s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
        }
        if (s == TPK_OK) s = tpk__buf_reserve(ctx, &ctx->work[1], total * sizeof(float));
        if (s == TPK_OK)
            s = tpk_allgatherv(ctx, &ctx->tp, src, p->numel, ctx->work[1].p, counts, total,
                               TPK_F32);
        if (s == TPK_OK)
            s = tpk_op_memcpy(ctx, host, ctx->work[1].p, total * sizeof(float),
                              ctx->ops->device ? TPK_D2H : TPK_H2H);
        size_t off = 0;
        for (int q = 0; q < t && s == TPK_OK; q++) {
            tpk__param_place(ctx, &ps, q, whole, host + off, true);
            off += counts[q];
        }
        /* dim 0 outermost: the padding rows are last */
        if (s == TPK_OK) memcpy(out, whole, gnumel * sizeof(float));
    }
    tpk__free(ctx, counts), tpk__free(ctx, host), tpk__free(ctx, whole);
    return s;
}

/* Set parameter `id`'s slice of `flat` (backend memory laid out like the parameter buffer)
 * from the whole tensor `in` (host memory, global numel floats). No communication: every rank
 * passes the same global tensor. */
static inline tpk_status tpk_param_scatter(tpk_ctx *ctx, int id, const float *in, float *flat) {
    static const char *fn = "tpk_param_scatter";
    tpk_param *p = tpk__param(ctx, fn, id);
    if (!p) return TPK_ERR_ARG;
    if (!in) return tpk__fail(ctx, TPK_ERR_ARG, fn, "in: NULL");
    if (!flat) return tpk__fail(ctx, TPK_ERR_ARG, fn, "flat: NULL");
    tpk_param ps = tpk__param_stored(p); /* `in` is extended with the padding rows, zero */
    size_t gnumel = tpk__gnumel(p), snumel = tpk__gnumel(&ps);
    float *host = (float *)tpk__malloc(ctx, sizeof(float) * p->numel),
          *whole = (float *)tpk__calloc(ctx, snumel, sizeof(float));
    if (!host || !whole) {
        tpk__free(ctx, host), tpk__free(ctx, whole);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "out of host memory");
    }
    memcpy(whole, in, gnumel * sizeof(float));
    if (flat == (float *)ctx->params.data.p) ctx->params.stale16 = true;
    tpk__param_place(ctx, &ps, ctx->tp.rank, whole, host, false);
    tpk_status s = tpk_op_memcpy(ctx, flat + p->offset, host, p->numel * sizeof(float),
                                 ctx->ops->device ? TPK_H2D : TPK_H2H);
    tpk__free(ctx, host), tpk__free(ctx, whole);
    return s;
}

/* The whole parameter (grad = false) or its gradient, gathered into host memory `out`. */
static inline tpk_status tpk_param_get_global(tpk_ctx *ctx, int id, bool grad, float *out) {
    if (!ctx) return TPK_ERR_ARG;
    if (grad && ctx->params.gat)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_param_get_global",
                         "grad: the gradients are sharded over DP (ZeRO-3, tpk/train/zero3.h): "
                         "each rank holds its slice, the optimizer's (tpk_adamw.g)");
    return tpk_param_gather(
        ctx, id, grad ? (const float *)ctx->params.grad.p : (const float *)ctx->params.data.p, out);
}
/* Set this rank's shard of parameter `id` from the whole tensor `in` (host memory). */
static inline tpk_status tpk_param_set_global(tpk_ctx *ctx, int id, const float *in) {
    if (!ctx) return TPK_ERR_ARG;
    return tpk_param_scatter(ctx, id, in, (float *)ctx->params.data.p);
}

#endif /* TPK_PARAMS_H */
