/* tpk/train/zero3.h — ZeRO-3 (fully sharded data parallelism): each rank of the DP group
 * (tpk__zero_group: DP x CP, or under HSDP its shard group) keeps only its slice
 * S_r = tpk_split(numel, D, r) of the flat f32 parameter buffer between uses — ZeRO-1's slice,
 * so the optimizer's moments, its reduced gradient slice (ZeRO-2's buckets) and the weights line
 * up — and the flat buffer itself is freed.
 * Under pipeline stages (tpk_zero3_init_pipe) the flat buffer is the stage's: each stage shards
 * its own over its DP group, as ZeRO-2 slices it.
 *
 * The model's weights are cut into units: each block of the stack (its parameter ids p0..p1,
 * contiguous in the flat buffer; under stages every chunk's blocks) and one unit for the rest (the
 * embedding, the final norm, the head, a stage's tied head copy: whichever this rank holds, the
 * runs of ids outside the blocks — at most two; none on a middle stage). A unit [a, b) of the
 * flat buffer is rebuilt by one all-gather per run over the DP group, rank q sending
 * |[a, b) n S_q| elements of its shard (in rank order they tile the run), into a gathered buffer;
 * ctx->params.at points each parameter into it, so the layers read tpk_param_data as ever.
 *
 * The schedule (the model's block_hook, tpk/models/lm.h):
 *   forward   unit -1 gathered first (kept through the backward: the head runs last in the forward
 *             and first in the backward, the embedding last), and block lo's gather started; before
 *             block i's forward block i is waited for and block i + 1's gather started (prefetch
 *             depth 1: it runs while block i computes; no_prefetch: each block's gather started
 *             at its own use, so its time is exposed); after it block i is released (its
 *             buffer free for block i + 2), except the last block, which the backward uses next;
 *   backward  before block i's backward (a full recompute's forward inside) block i is waited for
 *             (gathered again if released) and block i - 1's gather started; after it (the
 *             buckets' reduce-scatter of its gradients started by grad_ready) block i released;
 *             unit -1 released after the embedding's backward.
 * Blocks use two buffers of the largest block's size in turn (block i's is i mod 2), so the peak
 * parameter memory per rank is numel / D + unit -1 + two blocks; keep_for_backward keeps each
 * block gathered from its forward to its backward (its own buffer: no second gather, the memory
 * of every block gathered at once under the backward's start).
 * Communication per step (one micro-batch, no keep): unit -1 once, each block twice (forward and
 * backward; the last block once) gathered: 2 L - 1 + (1 or 2) all-gathers, about 2 numel elements
 * (plain DP's all-reduce volume), plus ZeRO-2's reduce-scatter of the gradients under the
 * backward; no all-gather after AdamW (tpk_adamw.w: the step updates the shard in place). After
 * an optimizer step (tpk_adamw.step changed) whatever is still gathered is released before the
 * next forward uses it.
 * A bf16 context: each unit's buffer holds its f32 weights and their bf16 copy (one cast when the
 * gather is waited for; ctx->params.at16 points the layers into it), the whole copy data16 freed.
 *
 * Under pipeline stages (any schedule: 1F1B runs later micro-batches' forwards before a backward,
 * interleaved chunks share the stage's units) each of the V K copies of the stage's parts calls
 * the one hook, and the schedule is the same but for two rules that keep nothing across passes:
 * every block is released after its forward (the last too: the next pass on the stage may be
 * another micro-batch's forward), and the rest is gathered at the step's first forward and released
 * after the stage's V M backwards (one per chunk and micro-batch; an evaluation's forwards leave it
 * gathered until the step's backwards or an optimizer step). A block is read only between its
 * BEGIN and END, and within one pass at most it and its prefetched neighbour (the other buffer) are
 * held, so no micro-batch sees another block's or a released buffer. With one chunk the rest's
 * hooks prefetch the first block (forward) and the last (backward). Communication per step on a
 * stage of L_s blocks: the rest's runs once and each block twice per micro-batch (2 M L_s + runs
 * all-gathers, 2 M times the stage's block elements plus the rest's); memory: the rest whole
 * through the step beside the two block buffers. keep_for_backward keeps a block from a forward to
 * the next backward of it that ends (a later micro-batch's backward gathers it again).
 * HSDP (tpk_ctx_desc.zero_shard_size): the slices, gathers and reduce-scatters within the shard
 * group, the slice's gradient all-reduced across the groups (below; whole gradients: by
 * tpk_train_step after the backward).
 * Sharded gradients (the default past one rank of the DP group without pipeline stages;
 * tpk_zero3_desc.whole_grads keeps ZeRO-2's flat buffer): the flat f32 gradient buffer is freed
 * and ctx->params.gat points each parameter's gradient into its unit's buffer while the unit's
 * backward runs: blocks in two shared buffers of the largest block's size (block i's is
 * i mod 2), the rest in its own from its backward's start (before the head's) to the optimizer
 * step. As a unit's backward begins its buffer is zeroed (a buffer's previous block waited for
 * first); as it ends its gradients partial over TP are summed there (sequence parallelism's
 * norms, shared key/value heads: tpk_params_reduce_partial_grads' per parameter) and each run
 * is reduce-scattered over the DP group into the slice opt->g itself (the first backward since
 * the slice was zeroed; a later one's into zr, f32 [sn] made then, added into the slice in one
 * call as the next backward begins or by tpk_train_step: the ops of a step affine in the
 * blocks, as the planner's probes need), in flight while the next block's backward computes.
 * So every micro-batch is
 * reduced (FSDP's default; whole_grads reduces on the last one, as no_sync), the slice zeroed
 * at the first backward after tpk_params_zero_grad, and tpk_train_step waits for the last ones
 * (tpk_adamw.grads_wait). The data-parallel buckets record and check each report as ever but
 * start nothing. Under HSDP, on the step's last micro-batch (its buckets begun before the
 * backward: ctx->params.dp_open) of a step of one micro-batch, each unit's part of the slice is
 * all-reduced across the shard groups as soon as its reduce-scatter is waited for, under the
 * rest of the backward
 * (tpk_adamw.grads_replicated: tpk_train_step's all-reduce of the whole slice made so).
 * Gradient memory per rank: sn + two blocks + the rest elements (+ sn: zr, under accumulation),
 * against numel + sn whole; the
 * gradients are sharded only where that holds less (grad_shard < grad_whole: not for a model
 * of a block or two, or one whose rest is most of it). The sums' order differs from ZeRO-0's
 * under accumulation (over DP per micro-batch, then over micro-batches): equal within f32
 * rounding.
 * Not yet: experts at EP > 1 (refused by name). */
#ifndef TPK_ZERO3_H
#define TPK_ZERO3_H

#include "../models/lm.h"
#include "pipe_model.h"
#include "train.h"

#define TPK__Z3_RUNS 4 /* the most runs of ids a unit holds (the rest: at most two in practice) */

typedef struct tpk_zero3_desc {
    bool keep_for_backward; /* each block kept gathered from its forward to its backward */
    bool no_prefetch;       /* each gather started where its unit is used and waited for at once
                               (the same gathers, none in flight under compute: their time
                               exposed; make bench-zero's reference) */
    bool whole_grads;       /* the flat gradient buffer kept whole, reduce-scattered on the
                               step's last micro-batch only (ZeRO-2's; no_sync) instead of the
                               gradients sharded (see the header) */
} tpk_zero3_desc;

/* One unit: up to TPK__Z3_RUNS runs of parameter ids, gathered together. */
typedef struct tpk__z3_unit {
    int first[TPK__Z3_RUNS], last[TPK__Z3_RUNS], nruns;
    size_t a[TPK__Z3_RUNS], b[TPK__Z3_RUNS]; /* the runs' elements [a, b) of the flat buffer */
    size_t elems;                            /* their sum */
    int state;                               /* 0 released, 1 gather in flight, 2 gathered */
    int slot;                                /* the shared buffer it uses (0, 1), or -1: its own */
    tpk_buf own;
    float *buf; /* its gathered f32 weights (runs in order), then a bf16 context's copy */
    tpk_request req[TPK__Z3_RUNS];
    int64_t block;  /* the block it holds (-1: the rest) */
    /* sharded gradients: 0 none, 1 open (its backward writes them), 2 reduce-scatter in flight */
    int gstate, gslot; /* gslot: the shared gradient buffer it uses (0, 1), or -1: gown */
    tpk_buf gown;
    float *gbuf; /* its gradients (runs in order) */
    size_t part; /* the elements of its runs within this rank's slice (its part of the sums) */
    bool gfinal;  /* its reduce-scatter in flight leaves its final sums in the slice (the step's
                     one micro-batch's): HSDP's all-reduce across the groups may follow */
    bool hflight; /* HSDP: its part of the slice in an all-reduce across the shard groups */
    tpk_request hreq[TPK__Z3_RUNS];
    tpk_request greq[TPK__Z3_RUNS];
    int prev, next; /* the units of the blocks before and after it in its chunk (-1: none) */
} tpk__z3_unit;

typedef struct tpk_zero3 {
    tpk_zero3_desc d;
    tpk_adamw *opt;
    size_t numel, s0, sn; /* the flat buffer's elements; this rank's slice */
    float *shard;         /* f32 [sn] backend memory: this rank's master weights */
    float **at;           /* [n params] the pointers ctx->params.at holds */
    void **at16;          /* [n params] a bf16 context's: ctx->params.at16 (NULL in f32) */
    tpk__z3_unit *u;      /* [nu]: u[0] the rest, then each chunk's blocks in order */
    int nu, chunks;
    int64_t lo;               /* the first chunk's first block */
    bool piped;               /* pipeline stages: every block released after its forward */
    int rest_uses, rest_done; /* the rest released after rest_uses backwards (1; stages: V M) */
    tpk_buf slot[2];
    int slot_owner[2];              /* the unit holding each shared buffer (-1: none) */
    size_t *counts;                 /* [D] */
    int64_t opt_step;               /* the optimizer step the gathered buffers hold */
    bool sgrads;                    /* the gradients sharded (see the header) */
    size_t grad_whole, grad_shard;  /* the bytes of the flat gradient buffer, and of the sharded
                                       gradients' buffers (the slice aside): sharded only when
                                       grad_shard < grad_whole */
    float **gat;                    /* [n params] the pointers ctx->params.gat holds */
    tpk_buf gslot[2];               /* the blocks' gradient buffers (gradients, then the part of
                                       their sums this rank receives) */
    int gslot_owner[2];             /* the unit whose gradients each holds (-1: none) */
    uint64_t gepoch;                /* ctx->params.grad_epoch the slice was zeroed at */
    bool last_mb;                   /* this backward is the step's last micro-batch's (the DP
                                       buckets' last was begun before it: ctx->params.dp_open) */
    int mb;                         /* backwards since the slice was zeroed: the first's sums land
                                       in the slice, a later one's in zr */
    bool zr_due;                    /* zr holds a backward's sums not yet added into the slice */
    tpk_buf zr;                     /* f32 [sn] a later micro-batch's sums (made at the first) */
    uint64_t grad_rs, grad_rs_elems; /* gradient reduce-scatters started, elements (statistics) */
    uint64_t gathers, gather_elems; /* all-gathers started, elements gathered (statistics) */
} tpk_zero3;

/* Release unit k: its gather waited for, its parameters' pointers cleared. */
static inline tpk_status tpk__z3_release(tpk_ctx *ctx, tpk_zero3 *z, int k) {
    tpk__z3_unit *u = &z->u[k];
    tpk_status s = TPK_OK;
    if (u->state == 1)
        for (int r = 0; r < u->nruns; r++) {
            tpk_status w = tpk_wait(ctx, &u->req[r]);
            if (s == TPK_OK) s = w;
        }
    for (int r = 0; r < u->nruns; r++)
        for (int i = u->first[r]; i <= u->last[r]; i++) {
            z->at[i] = NULL;
            if (z->at16) z->at16[i] = NULL;
        }
    if (u->slot >= 0 && z->slot_owner[u->slot] == k) z->slot_owner[u->slot] = -1;
    if (k == 0) tpk__buf_free(ctx, &u->own); /* between steps: the shard alone */
    u->state = 0;
    return s;
}

/* Start unit k's gather (nothing when gathered or in flight). */
static inline tpk_status tpk__z3_start(tpk_ctx *ctx, tpk_zero3 *z, int k) {
    tpk__z3_unit *u = &z->u[k];
    if (u->state) return TPK_OK;
    float *buf;
    size_t each = ctx->dtype == TPK_BF16 ? 6 : 4; /* bytes an element: f32, and its bf16 copy */
    if (u->slot >= 0) {
        int o = z->slot_owner[u->slot];
        if (o >= 0 && o != k) TPK_TRY(tpk__z3_release(ctx, z, o));
        z->slot_owner[u->slot] = k;
        buf = (float *)z->slot[u->slot].p;
    } else {
        TPK_TRY(tpk__buf_reserve(ctx, &u->own, each * (u->elems ? u->elems : 1)));
        buf = (float *)u->own.p;
    }
    tpk_comm *dg = tpk__zero_group(ctx);
    u->buf = buf;
    for (int r = 0; r < u->nruns; r++) {
        size_t a = u->a[r], b = u->b[r];
        tpk__slice_counts(z->numel, dg->size, a, b, z->counts);
        const float *send = z->shard + (z->counts[dg->rank] && a > z->s0 ? a - z->s0 : 0);
        memset(&u->req[r], 0, sizeof u->req[r]);
        TPK_TRY(tpk_allgatherv_start(ctx, dg, send, z->counts[dg->rank], buf, z->counts, b - a,
                                     TPK_F32, &u->req[r]));
        for (int i = u->first[r]; i <= u->last[r]; i++)
            z->at[i] = buf + (ctx->params.list[i].offset - a);
        buf += b - a;
        z->gathers++, z->gather_elems += b - a;
    }
    u->state = 1;
    return TPK_OK;
}

/* Unit k gathered: started if need be, then waited for. */
static inline tpk_status tpk__z3_ready(tpk_ctx *ctx, tpk_zero3 *z, int k) {
    tpk__z3_unit *u = &z->u[k];
    TPK_TRY(tpk__z3_start(ctx, z, k));
    if (u->state == 2) return TPK_OK;
    tpk_status s = TPK_OK;
    for (int r = 0; r < u->nruns; r++) {
        tpk_status w = tpk_wait(ctx, &u->req[r]);
        if (s == TPK_OK) s = w;
    }
    u->state = 2;
    if (s != TPK_OK || !z->at16) return s;
    /* a bf16 context: the unit's copy, one cast, after its f32 weights */
    uint16_t *h = (uint16_t *)(u->buf + u->elems);
    if (u->elems) TPK_TRY(tpk_op_cast(ctx, h, TPK_BF16, u->buf, TPK_F32, u->elems));
    for (int r = 0; r < u->nruns; h += u->b[r] - u->a[r], r++)
        for (int i = u->first[r]; i <= u->last[r]; i++)
            z->at16[i] = h + (ctx->params.list[i].offset - u->a[r]);
    return TPK_OK;
}

/* Every unit released (collective only in the waits of gathers in flight). */
static inline tpk_status tpk__z3_release_all(tpk_ctx *ctx, tpk_zero3 *z) {
    tpk_status s = TPK_OK;
    for (int k = 0; k < z->nu; k++) {
        tpk_status r = tpk__z3_release(ctx, z, k);
        if (s == TPK_OK) s = r;
    }
    z->rest_done = 0;
    return s;
}

/* ---- the sharded gradients ---------------------------------------------------------------- */

/* [*lo, *hi): the part of [a, b) within this rank's slice of the flat buffer. */
static inline void tpk__z3_mine(const tpk_zero3 *z, size_t a, size_t b, size_t *lo, size_t *hi) {
    *lo = a > z->s0 ? a : z->s0, *hi = b < z->s0 + z->sn ? b : z->s0 + z->sn;
    if (*hi < *lo) *hi = *lo;
}

/* Unit k's gradient reduced: its reduce-scatters (into the slice opt->g) waited for; under HSDP
 * on the step's last micro-batch its part of the slice then all-reduced across the shard groups
 * (started). Nothing when none is in flight. */
static inline tpk_status tpk__z3_grad_done(tpk_ctx *ctx, tpk_zero3 *z, int k) {
    tpk__z3_unit *u = &z->u[k];
    if (u->gstate != 2) return TPK_OK;
    tpk_status s = TPK_OK;
    for (int r = 0; r < u->nruns; r++) {
        tpk_status w = tpk_wait(ctx, &u->greq[r]);
        if (s == TPK_OK) s = w;
    }
    u->gstate = 0;
    if (u->gslot >= 0 && z->gslot_owner[u->gslot] == k) z->gslot_owner[u->gslot] = -1;
    /* (at EP > 1 the slice's dense elements alone cross EP: after the backward, in one call) */
    tpk_comm *rep = u->gfinal && ctx->ep.size == 1 ? tpk__zero_replicas(ctx) : NULL;
    for (int r = 0; r < u->nruns && s == TPK_OK; r++) {
        size_t lo, hi;
        tpk__z3_mine(z, u->a[r], u->b[r], &lo, &hi);
        float *g = z->opt->g + (lo - z->s0);
        memset(&u->hreq[r], 0, sizeof u->hreq[r]);
        if (rep && hi > lo && s == TPK_OK) { /* HSDP: across the groups, under the backward */
            s = tpk_allreduce_start(ctx, rep, g, g, hi - lo, TPK_F32, TPK_SUM, &u->hreq[r]);
            u->hflight = true;
        }
    }
    return s;
}

/* Every reduce-scatter in flight finished (the optimizer's grads_wait, user: the tpk_zero3); the
 * rest's gradient buffer freed (between steps: the slice alone). */
static inline tpk_status tpk__z3_grads_wait(tpk_ctx *ctx, void *user) {
    tpk_zero3 *z = (tpk_zero3 *)user;
    tpk_status s = TPK_OK;
    for (int k = 0; k < z->nu; k++) {
        if (z->u[k].gstate == 1)
            s = s != TPK_OK ? s
                            : tpk__fail(ctx, TPK_ERR_ARG, "tpk_train_step",
                                        "ZeRO-3: block %lld's backward began and did not end "
                                        "(TPK_LM_BWD_END): its gradients are not reduced",
                                        (long long)z->u[k].block);
        tpk_status d = tpk__z3_grad_done(ctx, z, k);
        if (s == TPK_OK) s = d;
    }
    for (int k = 0; k < z->nu; k++) /* HSDP: the across-group sums started as each unit ended */
        for (int r = 0; z->u[k].hflight && r < z->u[k].nruns; r++) {
            tpk_status w = tpk_wait(ctx, &z->u[k].hreq[r]);
            if (s == TPK_OK) s = w;
        }
    for (int k = 0; k < z->nu; k++) z->u[k].hflight = false;
    if (s == TPK_OK && z->zr_due && z->sn) /* the last backward's sums (one of several) */
        s = tpk_op_axpby(ctx, z->opt->g, 1.0f, z->zr.p, 1.0f, TPK_F32, z->sn);
    z->zr_due = false;
    /* tpk_train_step's all-reduce of the slice across the groups made here, unit by unit (a step
       of one micro-batch) */
    z->opt->grads_replicated =
        z->last_mb && z->mb == 1 && tpk__zero_replicas(ctx) && ctx->ep.size == 1;
    z->last_mb = false;
    tpk__buf_free(ctx, &z->u[0].gown);
    return s;
}

/* Unit k's gradient opened as its backward begins: a new accumulation (tpk_params_zero_grad
 * since) zeroes the slice first; its buffer (a block's slot, the reduce-scatter of the block
 * before in it finished first; the rest's own) zeroed — a later micro-batch's backward adds
 * into it anew, its earlier sums being in the slice — and its parameters' pointers set. */
static inline tpk_status tpk__z3_grad_open(tpk_ctx *ctx, tpk_zero3 *z, int k) {
    static const char *fn = "tpk_zero3_hook";
    tpk__z3_unit *u = &z->u[k];
    if (z->gepoch != ctx->params.grad_epoch) {
        for (int q = 0; q < z->nu; q++) TPK_TRY(tpk__z3_grad_done(ctx, z, q));
        if (z->sn) TPK_TRY(tpk_op_fill(ctx, z->opt->g, TPK_F32, z->sn, 0.f));
        z->gepoch = ctx->params.grad_epoch, z->mb = 0, z->zr_due = false;
    }
    if (u->gstate == 1) return TPK_OK;
    if (!k) { /* the rest's backward begins first: a backward begins */
        z->last_mb = ctx->params.dp_open;
        if (z->mb++ && z->sn) { /* a later one: its sums into zr, the one before's added */
            for (int q = 0; q < z->nu; q++) TPK_TRY(tpk__z3_grad_done(ctx, z, q));
            if (z->zr_due)
                TPK_TRY(tpk_op_axpby(ctx, z->opt->g, 1.0f, z->zr.p, 1.0f, TPK_F32, z->sn));
            if (!z->zr.p) { /* (its gaps between units stay zero) */
                TPK_TRY(tpk__buf_reserve(ctx, &z->zr, sizeof(float) * z->sn));
                TPK_TRY(tpk_op_fill(ctx, z->zr.p, TPK_F32, z->sn, 0.f));
            }
            z->zr_due = true;
        }
    }
    TPK_TRY(tpk__z3_grad_done(ctx, z, k)); /* its previous micro-batch's */
    float *buf;
    if (u->gslot >= 0) {
        int o = z->gslot_owner[u->gslot];
        if (o >= 0 && o != k && z->u[o].gstate == 1)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "block %lld's backward began while block %lld's (sharing its "
                             "gradient buffer) has not ended",
                             (long long)u->block, (long long)z->u[o].block);
        if (o >= 0 && o != k) TPK_TRY(tpk__z3_grad_done(ctx, z, o));
        z->gslot_owner[u->gslot] = k;
        buf = (float *)z->gslot[u->gslot].p;
    } else {
        TPK_TRY(tpk__buf_reserve(ctx, &u->gown, sizeof(float) * (u->elems ? u->elems : 1)));
        buf = (float *)u->gown.p;
    }
    if (u->elems) TPK_TRY(tpk_op_fill(ctx, buf, TPK_F32, u->elems, 0.f));
    u->gbuf = buf;
    for (int r = 0; r < u->nruns; buf += u->b[r] - u->a[r], r++)
        for (int i = u->first[r]; i <= u->last[r]; i++)
            z->gat[i] = buf + (ctx->params.list[i].offset - u->a[r]);
    u->gstate = 1;
    return TPK_OK;
}

/* Unit k's backward ended: its gradients partial over TP summed there (sequence parallelism's
 * norms, shared key/value heads), then each run reduce-scattered over the DP group, this rank's
 * part into the slice or zr (in flight: waited when its buffer is next needed, or by
 * tpk_train_step); its parameters' pointers cleared. */
static inline tpk_status tpk__z3_grad_reduce(tpk_ctx *ctx, tpk_zero3 *z, int k) {
    tpk__z3_unit *u = &z->u[k];
    if (u->gstate != 1) return TPK_OK;
    for (int r = 0; r < u->nruns; r++)
        for (int i = u->first[r]; i <= u->last[r]; i++)
            if (ctx->tp.size > 1) TPK_TRY(tpk__param_reduce_partial(ctx, i));
    tpk_comm *dg = tpk__zero_group(ctx);
    float *src = u->gbuf;
    for (int r = 0; r < u->nruns; src += u->b[r] - u->a[r], r++) {
        size_t a = u->a[r], b = u->b[r], lo, hi;
        tpk__slice_counts(z->numel, dg->size, a, b, z->counts);
        /* received into the slice (the first backward since it was zeroed) or into zr (a later
           one's: added into the slice at once as the next backward begins, or in grads_wait) */
        tpk__z3_mine(z, a, b, &lo, &hi);
        float *recv = (z->mb > 1 ? (float *)z->zr.p : z->opt->g) + (hi > lo ? lo - z->s0 : 0);
        memset(&u->greq[r], 0, sizeof u->greq[r]);
        TPK_TRY(tpk_reduce_scatterv_start(ctx, dg, src, b - a, recv, z->counts, TPK_F32, TPK_SUM,
                                          &u->greq[r]));
        z->grad_rs++, z->grad_rs_elems += b - a;
    }
    u->gfinal = z->last_mb && z->mb == 1;
    for (int r = 0; r < u->nruns; r++)
        for (int i = u->first[r]; i <= u->last[r]; i++) z->gat[i] = NULL;
    u->gstate = 2;
    return TPK_OK;
}

/* The model's block_hook (user: the tpk_zero3): the schedule of the header. */
static inline tpk_status tpk_zero3_hook(tpk_ctx *ctx, int64_t block, int when, void *user) {
    static const char *fn = "tpk_zero3_hook";
    tpk_zero3 *z = (tpk_zero3 *)user;
    if (!ctx) return TPK_ERR_ARG;
    if (!z || !z->u) return tpk__fail(ctx, TPK_ERR_ARG, fn, "user: expected a tpk_zero3");
    int k = 0;
    for (int q = 1; block >= 0 && !k && q < z->nu; q++) k = z->u[q].block == block ? q : 0;
    if (block < -1 || (block >= 0 && !k))
        return z->chunks == 1
                   ? tpk__fail(ctx, TPK_ERR_ARG, fn, "block: expected -1 or %lld..%lld, got %lld",
                               (long long)z->lo, (long long)(z->lo + z->nu - 2), (long long)block)
                   : tpk__fail(ctx, TPK_ERR_ARG, fn,
                               "block: expected -1 or a block of this stage's %d chunks, got %lld",
                               z->chunks, (long long)block);
    if (z->opt && z->opt->step != z->opt_step) { /* the shard changed: nothing gathered is valid */
        TPK_TRY(tpk__z3_release_all(ctx, z));
        z->opt_step = z->opt->step;
    }
    const tpk__z3_unit *u = &z->u[k];
    bool one = z->chunks == 1 && z->nu > 1; /* one chunk: the rest's hooks prefetch its ends */
    bool pf = !z->d.no_prefetch; /* (no_prefetch: each gather started at its use) */
    switch (when) {
        case TPK_LM_FWD_BEGIN:
            TPK_TRY(tpk__z3_ready(ctx, z, k));
            if (!k) return one && pf ? tpk__z3_start(ctx, z, 1) : TPK_OK;
            return u->next > 0 && pf ? tpk__z3_start(ctx, z, u->next) : TPK_OK; /* the prefetch */
        case TPK_LM_FWD_END: /* without stages the chunk's last block stays for the backward */
            return k && (z->piped || u->next > 0) && !z->d.keep_for_backward
                       ? tpk__z3_release(ctx, z, k)
                       : TPK_OK;
        case TPK_LM_BWD_BEGIN:
            TPK_TRY(tpk__z3_ready(ctx, z, k));
            if (z->sgrads) TPK_TRY(tpk__z3_grad_open(ctx, z, k));
            if (!k) return one && pf ? tpk__z3_start(ctx, z, z->nu - 1) : TPK_OK;
            return u->prev > 0 && pf ? tpk__z3_start(ctx, z, u->prev) : TPK_OK;
        case TPK_LM_BWD_END:
            if (z->sgrads) TPK_TRY(tpk__z3_grad_reduce(ctx, z, k));
            if (k) return tpk__z3_release(ctx, z, k);
            if (++z->rest_done < z->rest_uses) return TPK_OK; /* stages: more backwards to come */
            z->rest_done = 0;
            return tpk__z3_release(ctx, z, 0);
        default:
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "when: expected TPK_LM_FWD_BEGIN..BWD_END, got %d", when);
    }
}

static inline void tpk_zero3_destroy(tpk_ctx *ctx, tpk_zero3 *z) {
    if (!ctx || !z) return;
    if (z->u) (void)tpk__z3_release_all(ctx, z);
    for (int k = 0; z->u && k < z->nu; k++) {
        (void)tpk__z3_grad_done(ctx, z, k);
        tpk__buf_free(ctx, &z->u[k].gown);
    }
    if (z->gat && ctx->params.gat == z->gat) { /* the flat gradient buffer back, zeroed */
        ctx->params.gat = NULL;
        size_t n = ctx->params.numel;
        if (tpk__buf_reserve(ctx, &ctx->params.grad, sizeof(float) * (n ? n : 1)) == TPK_OK && n)
            (void)tpk_op_fill(ctx, ctx->params.grad.p, TPK_F32, n, 0.f);
    }
    if (z->opt && z->opt->grads_wait_user == z)
        z->opt->grads_wait = NULL, z->opt->grads_wait_user = NULL;
    tpk__buf_free(ctx, &z->gslot[0]), tpk__buf_free(ctx, &z->gslot[1]), tpk__buf_free(ctx, &z->zr);
    tpk__free(ctx, z->gat);
    if (ctx->params.at == z->at) ctx->params.at = NULL;
    if (z->at16 && ctx->params.at16 == z->at16) ctx->params.at16 = NULL;
    if (z->opt && z->opt->w == z->shard) z->opt->w = NULL;
    if (z->shard) tpk__mem_count(ctx, sizeof(float) * (z->sn ? z->sn : 1), false);
    tpk_op_free(ctx, z->shard);
    for (int k = 0; k < z->nu; k++) tpk__buf_free(ctx, &z->u[k].own);
    tpk__buf_free(ctx, &z->slot[0]), tpk__buf_free(ctx, &z->slot[1]);
    tpk__free(ctx, z->at), tpk__free(ctx, z->at16), tpk__free(ctx, z->u);
    tpk__free(ctx, z->counts);
    memset(z, 0, sizeof *z);
}

/* The units of chunks[0 .. V) (a stage's parts over the same parameters, or the whole model)
 * and the shard; m's hooks are the callers'. */
static inline tpk_status tpk__zero3_setup(tpk_ctx *ctx, const char *fn, tpk_zero3 *z,
                                          tpk_lm *const *chunks, int V, tpk_adamw *opt,
                                          const tpk_zero3_desc *d) {
    if (!opt || !opt->m || opt->stage != 3)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "opt: expected an optimizer made with zero_stage 3 (ZeRO-3), got %s",
                         !opt || !opt->m ? "none" : "another ZeRO stage");
    if (opt->numel != ctx->params.numel || !ctx->params.data.p)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "opt: made for %zu parameter elements, the context holds %zu whole",
                         opt->numel, ctx->params.data.p ? ctx->params.numel : (size_t)0);
    int n = ctx->params.n;
    int64_t L = 0;
    for (int c = 0; c < V; c++) L += chunks[c]->hi - chunks[c]->lo;
    tpk_comm *dg = tpk__zero_group(ctx);
    z->d = *d, z->opt = opt, z->numel = opt->numel, z->s0 = opt->s0, z->sn = opt->sn;
    z->nu = (int)L + 1, z->chunks = V, z->lo = chunks[0]->lo, z->opt_step = opt->step;
    z->rest_uses = 1;
    z->slot_owner[0] = z->slot_owner[1] = -1;
    z->at = (float **)tpk__malloc(ctx, sizeof(float *) * (size_t)(n ? n : 1));
    z->gat = (float **)tpk__calloc(ctx, (size_t)(n ? n : 1), sizeof(float *));
    z->gslot_owner[0] = z->gslot_owner[1] = -1;
    z->u = (tpk__z3_unit *)tpk__malloc(ctx, sizeof(tpk__z3_unit) * (size_t)z->nu);
    z->counts = (size_t *)tpk__malloc(ctx, sizeof(size_t) * (size_t)dg->size);
    bool *inb = (bool *)tpk__calloc(ctx, (size_t)(n ? n : 1), sizeof(bool)); /* a block's id */
    if (ctx->dtype == TPK_BF16)
        z->at16 = (void **)tpk__malloc(ctx, sizeof(void *) * (size_t)(n ? n : 1));
    if (!z->at || !z->gat || !z->u || !z->counts || !inb ||
        (ctx->dtype == TPK_BF16 && !z->at16)) {
        tpk__free(ctx, inb);
        tpk_zero3_destroy(ctx, z);
        return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%d parameters' pointers", n);
    }
    memset(z->at, 0, sizeof(float *) * (size_t)(n ? n : 1));
    if (z->at16) memset(z->at16, 0, sizeof(void *) * (size_t)(n ? n : 1));
    memset(z->u, 0, sizeof(tpk__z3_unit) * (size_t)z->nu);
    size_t most = 0;
    tpk_status s = TPK_OK;
    int k = 1;
    for (int c = 0; c < V && s == TPK_OK; c++) { /* each chunk's blocks: consecutive id ranges */
        const tpk_lm *m = chunks[c];
        int next = -1;
        for (int64_t i = m->lo; i < m->hi && s == TPK_OK; i++, k++) {
            const tpk_block *b = &m->blocks[i];
            if (b->p0 > b->p1 || b->p0 < 0 || b->p1 >= n || (next >= 0 && b->p0 != next)) {
                s = tpk__fail(ctx, TPK_ERR_ARG, fn,
                              "model: block %lld's parameters (ids %d..%d) do not follow the "
                              "block before's (expected from %d)",
                              (long long)i, b->p0, b->p1, next);
                break;
            }
            tpk__z3_unit *u = &z->u[k];
            u->nruns = 1, u->first[0] = b->p0, u->last[0] = b->p1, u->block = i;
            u->slot = d->keep_for_backward ? -1 : (k - 1) % 2; /* neighbours: the other slot */
            u->gslot = (k - 1) % 2; /* (gradients: the same alternation, kept or not) */
            u->prev = i > m->lo ? k - 1 : -1, u->next = i + 1 < m->hi ? k + 1 : -1;
            for (int q = b->p0; q <= b->p1; q++) inb[q] = true;
            next = b->p1 + 1;
        }
    }
    tpk__z3_unit *o = &z->u[0]; /* the rest: the runs of ids outside every block */
    o->slot = o->gslot = -1, o->block = -1, o->prev = o->next = -1;
    for (int i = 0; i < n && s == TPK_OK; i++) {
        if (inb[i] || (i && !inb[i - 1] && o->nruns)) {
            if (!inb[i]) o->last[o->nruns - 1] = i;
            continue;
        }
        if (o->nruns == TPK__Z3_RUNS)
            s = tpk__fail(ctx, TPK_ERR_ARG, fn,
                          "model: the parameters outside the blocks form more than %d runs of ids",
                          TPK__Z3_RUNS);
        else o->first[o->nruns] = o->last[o->nruns] = i, o->nruns++;
    }
    tpk__free(ctx, inb);
    for (int q = 0; q < z->nu && s == TPK_OK; q++) {
        tpk__z3_unit *u = &z->u[q];
        for (int r = 0; r < u->nruns; r++) {
            const tpk_param *a = &ctx->params.list[u->first[r]], *b = &ctx->params.list[u->last[r]];
            u->a[r] = a->offset, u->b[r] = b->offset + b->numel; /* (the gaps within: zeros) */
            u->elems += u->b[r] - u->a[r];
        }
        if (q) most = u->elems > most ? u->elems : most;
    }
    size_t bytes = sizeof(float) * (z->sn ? z->sn : 1);
    if (s == TPK_OK) s = tpk_op_alloc(ctx, bytes, (void **)&z->shard);
    if (s == TPK_OK) tpk__mem_count(ctx, bytes, true);
    if (s == TPK_OK && z->sn)
        s = tpk_op_memcpy(ctx, z->shard, (const float *)ctx->params.data.p + z->s0, bytes,
                          ctx->ops->device ? TPK_D2D : TPK_H2H);
    for (int q = 0; q < 2 && s == TPK_OK && !d->keep_for_backward && L > q; q++)
        s = tpk__buf_reserve(ctx, &z->slot[q], (z->at16 ? 6 : 4) * (most ? most : 1));
    /* the gradients sharded: past one rank of the DP group, without pipeline stages (a stage's
       tied copy and its 1F1B order keep the flat buffer) unless asked whole */
    z->sgrads = !d->whole_grads && V == 1 && ctx->pp.size == 1 && dg->size > 1 && opt->g;
    for (int q = 0; q < z->nu; q++) {
        tpk__z3_unit *u = &z->u[q];
        for (int r = 0; r < u->nruns; r++) {
            size_t lo, hi;
            tpk__z3_mine(z, u->a[r], u->b[r], &lo, &hi);
            u->part += hi - lo;
        }
    }
    /* sharded only where that holds less than the flat buffer (a model of a few blocks, or one
       whose rest is most of it, keeps the whole buffer) */
    z->grad_whole = sizeof(float) * (z->numel ? z->numel : 1);
    z->grad_shard = sizeof(float) * ((size_t)(L > 1 ? 2 : L) * (most ? most : 1) +
                                     (z->u[0].elems ? z->u[0].elems : 1));
    z->sgrads = z->sgrads && z->grad_shard < z->grad_whole;
    for (int q = 0; q < 2 && s == TPK_OK && z->sgrads && L > q; q++)
        s = tpk__buf_reserve(ctx, &z->gslot[q], sizeof(float) * (most ? most : 1));
    if (s != TPK_OK) {
        tpk_zero3_destroy(ctx, z);
        return s;
    }
    if (z->sgrads) { /* the flat gradient buffer freed: each unit's while its backward runs */
        tpk__buf_free(ctx, &ctx->params.grad);
        ctx->params.gat = z->gat, z->gepoch = ctx->params.grad_epoch - 1; /* zeroed first */
        opt->grads_wait = tpk__z3_grads_wait, opt->grads_wait_user = z;
    }
    tpk__buf_free(ctx, &ctx->params.data);   /* the whole weights: gathered block by block now */
    tpk__buf_free(ctx, &ctx->params.data16); /* (a bf16 context's: each unit's own copy) */
    ctx->params.at = z->at, ctx->params.at16 = z->at16, opt->w = z->shard;
    return TPK_OK;
}

/* ZeRO-3 for model m (built whole: no pipeline stage; tpk_zero3_init_pipe for a stage) over its
 * context's DP group: opt made with tpk_adamw_desc.zero_stage = 3 for the parameters as
 * registered (its gradient slice linked to the buckets by tpk_dp_shard_grads as under ZeRO-2).
 * This rank's slice of the weights (as they are now: initialised or loaded) is copied into the
 * shard, the flat parameter buffer freed, opt's weights linked to the shard and m's block_hook
 * set. Not collective. */
static inline tpk_status tpk_zero3_init(tpk_ctx *ctx, tpk_zero3 *z, tpk_lm *m, tpk_adamw *opt,
                                        const tpk_zero3_desc *desc) {
    static const char *fn = "tpk_zero3_init";
    tpk_zero3_desc d;
    TPK__INIT_LAYER(ctx, fn, z, d, desc);
    if (!m || !m->blocks) return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: expected a built model");
    if (ctx->pp.size > 1 || !m->has_embed || !m->has_head)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "model: a pipeline stage's part (PP %d): expected the whole model, or "
                         "tpk_zero3_init_pipe for the stage",
                         ctx->pp.size);
    TPK_TRY(tpk__zero3_setup(ctx, fn, z, &m, 1, opt, &d));
    m->block_hook = tpk_zero3_hook, m->block_hook_user = z;
    return TPK_OK;
}

/* ZeRO-3 for this rank's pipeline stage pm (tpk_pipe_model_init, after its tied head's copy; any
 * schedule): as tpk_zero3_init over the stage's parameters — its flat buffer sliced over the DP
 * group as ZeRO-2's; the units each block of every chunk and the rest of the stage (the
 * embedding, the final norm and head, the tied copy: whichever it holds) — with every copy's
 * block_hook set. Each block is released after its forward (1F1B runs other micro-batches'
 * forwards before its backward), the rest after the stage's V M backwards of a step. Not
 * collective. */
static inline tpk_status tpk_zero3_init_pipe(tpk_ctx *ctx, tpk_zero3 *z, tpk_pipe_model *pm,
                                             tpk_adamw *opt, const tpk_zero3_desc *desc) {
    static const char *fn = "tpk_zero3_init_pipe";
    tpk_zero3_desc d;
    TPK__INIT_LAYER(ctx, fn, z, d, desc);
    if (!pm || !pm->copy || pm->V < 1 || pm->K < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "pm: expected a built pipeline stage");
    tpk_lm *chunks[64];
    if (pm->V > 64)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "pm: %d chunks a stage, expected at most 64", pm->V);
    for (int c = 0; c < pm->V; c++) chunks[c] = tpk_model_lm(&pm->copy[c * pm->K]);
    TPK_TRY(tpk__zero3_setup(ctx, fn, z, chunks, pm->V, opt, &d));
    z->piped = true, z->rest_uses = pm->V * pm->M;
    for (int i = 0; i < pm->V * pm->K; i++) {
        tpk_lm *m = tpk_model_lm(&pm->copy[i]);
        m->block_hook = tpk_zero3_hook, m->block_hook_user = z;
    }
    return TPK_OK;
}

/* *bytes = the weights' memory this rank holds at most during a step under z: its f32 shard, the
 * two shared block buffers, and the units gathered into their own (the rest, unit -1, kept from
 * the forward's start to the backward's end; every block with keep_for_backward), a bf16
 * context's copies included. tpk_mem_held_get's weights (the shard: 4 bytes an element of its
 * slice, at least 4) and gathered buffers (the rest; tpk/train/memory.h). */
static inline tpk_status tpk_zero3_bytes(tpk_ctx *ctx, const tpk_zero3 *z, size_t *bytes) {
    if (!ctx) return TPK_ERR_ARG;
    if (!z || !z->u || !bytes)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_zero3_bytes", "%s",
                         !bytes ? "bytes: NULL" : "z: expected a tpk_zero3");
    size_t each = z->at16 ? 6 : 4, b = sizeof(float) * (z->sn ? z->sn : 1);
    b += z->slot[0].bytes + z->slot[1].bytes;
    for (int k = 0; k < z->nu; k++)
        if (z->u[k].slot < 0) b += each * (z->u[k].elems ? z->u[k].elems : 1);
    *bytes = b;
    return TPK_OK;
}

/* *bytes = the gradients' memory ZeRO-3 holds at most during a step when it shards them (0 when
 * the flat buffer is whole): the two block buffers and the rest's own (from its backward's start
 * to the optimizer step). tpk_mem_held_get's gradients add the slice opt->g. */
static inline size_t tpk_zero3_grad_bytes(const tpk_zero3 *z) {
    if (!z || !z->u || !z->sgrads) return 0;
    return z->gslot[0].bytes + z->gslot[1].bytes + z->zr.bytes +
           sizeof(float) * (z->u[0].elems ? z->u[0].elems : 1);
}

/* The whole weights back in ctx->params.data (every rank's shard all-gathered; the layers read it
 * again), e.g. to save a checkpoint or read tpk_param_get_global; tpk_zero3_shard makes them
 * sharded again. Collective over the DP group. */
static inline tpk_status tpk_zero3_gather(tpk_ctx *ctx, tpk_zero3 *z) {
    static const char *fn = "tpk_zero3_gather";
    if (!ctx) return TPK_ERR_ARG;
    if (!z || !z->u) return tpk__fail(ctx, TPK_ERR_ARG, fn, "z: expected a tpk_zero3");
    TPK_TRY(tpk__z3_release_all(ctx, z));
    TPK_TRY(tpk__buf_reserve(ctx, &ctx->params.data, sizeof(float) * (z->numel ? z->numel : 1)));
    float *w = (float *)ctx->params.data.p;
    if (z->sn)
        TPK_TRY(tpk_op_memcpy(ctx, w + z->s0, z->shard, sizeof(float) * z->sn,
                              ctx->ops->device ? TPK_D2D : TPK_H2H));
    ctx->params.at = NULL, ctx->params.at16 = NULL;
    tpk_params_updated(ctx); /* a bf16 context remakes its whole copy */
    return z->numel ? tpk__dp_allgather_slices(ctx, w, z->numel) : TPK_OK;
}

/* Back to the sharded weights from ctx->params.data (as tpk_zero3_gather left it, or after a
 * checkpoint loaded into it): this rank's slice kept in the shard, the flat buffer freed. Not
 * collective. */
static inline tpk_status tpk_zero3_shard(tpk_ctx *ctx, tpk_zero3 *z) {
    static const char *fn = "tpk_zero3_shard";
    if (!ctx) return TPK_ERR_ARG;
    if (!z || !z->u) return tpk__fail(ctx, TPK_ERR_ARG, fn, "z: expected a tpk_zero3");
    if (!ctx->params.data.p || ctx->params.at)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "ctx->params: the weights are not whole (tpk_zero3_gather first)");
    if (z->sn)
        TPK_TRY(tpk_op_memcpy(ctx, z->shard, (const float *)ctx->params.data.p + z->s0,
                              sizeof(float) * z->sn, ctx->ops->device ? TPK_D2D : TPK_H2H));
    tpk__buf_free(ctx, &ctx->params.data), tpk__buf_free(ctx, &ctx->params.data16);
    ctx->params.at = z->at, ctx->params.at16 = z->at16;
    return TPK_OK;
}

#endif /* TPK_ZERO3_H */
