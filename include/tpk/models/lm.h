/* tpk/models/lm.h — the language-model skeleton every model family shares (GPT-2's
 * tpk/models/gpt2.h, Llama's tpk/models/llama.h):
 *
 *   ids -> embedding (vocabulary-parallel; + a position table where the family has one)
 *       -> dropout (where the family has one) -> L blocks (a stack, tpk/layers/recompute.h)
 *       -> final norm -> logits = h Wᵀ (a column linear over the vocabulary shard: W the
 *          embedding's rows when tied, else its own [V, H] weight) S(-1) [T, Vp]
 *       -> vocabulary-parallel cross-entropy (mean over the counted positions).
 *   backward mirrors it, calling the data-parallel hook (grad_ready) as each group of gradients
 *   is final: the untied head, the final norm, each block from the last, the embedding.
 *
 * A family supplies what is its own through a table of functions (tpk_lm_family): its block
 * (init from its config, forward), its final norm, its layers' types and the names of its
 * parameters. The model's parts stay in the family's struct under the family's names;
 * tpk__lm_parts gathers pointers to them for each call. Here, once: the recompute plumbing, the
 * forward and backward loops, the parameter walk of the hook, init and destroy, and the pre-norm
 * residual block's backward, buffer lists (each layer's own, tpk/runtime/buf.h) and selective
 * recompute (tpk__lm_sublayers, filled by the family's adapters: TPK__LM_ADAPTERS). */
#ifndef TPK_LM_H
#define TPK_LM_H

#include "../layers/embed.h"
#include "../layers/linear.h"
#include "../layers/recompute.h"
#include "../layers/resid.h"
#include "../layers/xent.h"

/* What a family supplies. `b` is one of its blocks, `n` its final norm, `cfg` its config. */
typedef struct tpk_lm_family {
    const char *name;       /* "gpt2", "llama" */
    const char *embed_name; /* the token embedding's weight */
    const char *pos_name;   /* the position table's weight; NULL: none */
    const char *block_name; /* block i is "<block_name>.<i>" */
    const char *norm_name;  /* the final norm */
    const char *head_name;  /* the untied LM head's weight */
    size_t block_size;
    tpk_status (*block_init)(tpk_ctx *ctx, void *b, int64_t H, const char *name, const void *cfg);
    void (*block_destroy)(tpk_ctx *ctx, void *b);
    tpk_status (*block_forward)(tpk_ctx *ctx, void *b, tpk_tensor x, int64_t B, int64_t S,
                                tpk_tensor *y);
    tpk_status (*block_backward)(tpk_ctx *ctx, void *b, tpk_tensor dy, tpk_tensor *dx,
                                 bool inplace);
    int (*block_bufs)(void *b, int set, tpk_buf **o);         /* tpk__stack.bufs */
    tpk_status (*block_recompute)(tpk_ctx *ctx, void *b);    /* tpk__stack.recompute */
    void (*block_params)(const void *b, int *first, int *last);
    tpk_status (*norm_init)(tpk_ctx *ctx, void *n, int64_t H, const char *name, float eps, bool sp);
    void (*norm_destroy)(tpk_ctx *ctx, void *n);
    tpk_status (*norm_forward)(tpk_ctx *ctx, void *n, tpk_tensor x, tpk_tensor *y);
    tpk_status (*norm_backward)(tpk_ctx *ctx, void *n, tpk_tensor dy, tpk_tensor *dx);
    void (*norm_params)(const void *n, int *first, int *last);
} tpk_lm_family;

/* A field of a family's config a trainer sets from its command line ("--flag value"; the kit's
 * trainer, examples/train.c, takes every family's through tpk/train/model.h). */
typedef struct tpk_lm_flag {
    const char *flag;  /* "--rotary-pct" */
    size_t off;        /* of the field in the family's config */
    bool is_int;       /* an int64_t field, else a float */
    double lo, hi;     /* the values accepted */
    const char *label; /* its name in the trainer's banner ("F"); NULL: not shown */
    const char *help;  /* what the usage says after the flag */
} tpk_lm_flag;

/* The skeleton's own state, a member of every family's model. */
typedef struct tpk_lm {
    int64_t B, S;           /* of the last forward */
    bool have_loss;
    /* Optional: called by the backward each time the gradients of parameters first..last (ids)
     * are final for this backward — the untied head, the final norm, each block from the last,
     * then the embedding (its weight last: a tied head also feeds it) — so a trainer can start
     * their data-parallel reduction while the rest of the backward runs. A failing status stops
     * the backward. */
    tpk_status (*grad_ready)(tpk_ctx *ctx, int first, int last, void *user);
    void *grad_ready_user;
    tpk__stack_bufs rc;     /* the stack's checkpoints (full recompute) and the pools blocks borrow
                               from */
    int64_t lo, hi;         /* the blocks built: lo .. hi - 1 (tpk_lm_part; all: 0, L) */
    bool embed, head;       /* the embedding; the final norm, head and loss, are built */
    bool sp;                /* sequence parallelism: hidden states S(0) */
    int64_t H;
} tpk_lm;

/* A model's parts, pointers into the family's struct (gathered per call: the struct may move
 * between calls). */
typedef struct tpk__lm_parts {
    const tpk_lm_family *f;
    tpk_lm *s;
    int64_t L;
    tpk_recompute mode;
    tpk_embedding *embed;
    tpk_dropout *drop;      /* NULL: no embedding dropout */
    void *blocks;           /* [L] of f->block_size */
    void *norm;
    int *head_w;            /* the head's weight id: the embedding's when tied */
    tpk_linear *head;
    tpk_xent *ce;
    tpk_tensor *logits;
} tpk__lm_parts;

/* The part of the model a rank builds (pipeline parallelism: one virtual stage's, tpk/train/
 * pipeline.h); zeros: the whole model. Blocks lo .. hi - 1 (hi = 0: all L); the embedding (and its
 * dropout) unless no_embed, the final norm, the LM head and the loss unless no_head. A tied head
 * without the embedding registers the embedding's weight under its name (a copy: Megatron's
 * word_embeddings_for_head; the pipeline sums the two copies' gradients). */
typedef struct tpk_lm_part {
    int64_t lo, hi;
    bool no_embed, no_head;
} tpk_lm_part;

/* The fields every family's config starts with (tpk/train/model.h reads them by name). */
#define TPK__LM_CONFIG_SHAPE                                                                    \
    int64_t vocab;     /* V (need not divide t) */                                              \
    int64_t positions; /* the longest sequence (a position table's rows, where there is one) */ \
    int64_t layers;    /* L */                                                                  \
    int64_t hidden;    /* H */                                                                  \
    int64_t heads;     /* A (need not divide t) */                                              \
    tpk_lm_part part;  /* the part built (pipeline stages); zeros: all */

/* The sizes and switches init needs, from the family's config. */
typedef struct tpk__lm_dims {
    int64_t vocab, positions, layers, hidden;
    int64_t vocab_multiple; /* 0: 64, < 0: none */
    float label_smoothing, init_std, norm_eps, dropout;
    bool sequence_parallel, tie;
} tpk__lm_dims;

static inline void *tpk__lm_block(const tpk__lm_parts *p, int64_t i) {
    return (char *)p->blocks + (size_t)i * p->f->block_size;
}

/* The config checks every family makes, with the same words. */
static inline tpk_status tpk__lm_check_shape(tpk_ctx *ctx, const char *fn, int64_t layers,
                                             int64_t positions, int64_t hidden, int64_t heads) {
    if (layers < 1 || layers > 100000)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->layers: expected 1..100000, got %lld",
                         (long long)layers);
    if (positions < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->positions: expected >= 1, got %lld",
                         (long long)positions);
    if (heads < 1 || hidden < 1 || hidden % heads)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->hidden: expected a positive multiple of cfg->heads = %lld, got %lld",
                         (long long)heads, (long long)hidden);
    return TPK_OK;
}
static inline tpk_status tpk__lm_check_recompute(tpk_ctx *ctx, const char *fn, tpk_recompute r) {
    if ((unsigned)r >= (unsigned)TPK_RECOMPUTE_COUNT)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->recompute: expected TPK_RECOMPUTE_NONE, _SELECTIVE or _FULL, got %d",
                         (int)r);
    return TPK_OK;
}

/* The argument checks of a family's init (the model and its config) and of a block's forward
 * (an initialised block, an output), with the same words. */
static inline tpk_status tpk__lm_init_args(tpk_ctx *ctx, const char *fn, const void *m,
                                           const void *cfg) {
    if (!ctx) return TPK_ERR_ARG;
    if (!m) return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: NULL");
    if (!cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg: NULL");
    return TPK_OK;
}
static inline tpk_status tpk__lm_block_args(tpk_ctx *ctx, const char *fn, int64_t H,
                                            const tpk_tensor *y) {
    if (!ctx) return TPK_ERR_ARG;
    if (!H) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised block");
    if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL");
    return TPK_OK;
}

/* ---- the stack of blocks (tpk/layers/recompute.h) -------------------------------------------- */

/* The stack's block i is the model's block lo + i (the part built). */
static inline tpk_status tpk__lm_fwd(tpk_ctx *ctx, void *m, int64_t i, tpk_tensor x,
                                     tpk_tensor *y) {
    tpk__lm_parts *p = (tpk__lm_parts *)m;
    return p->f->block_forward(ctx, tpk__lm_block(p, p->s->lo + i), x, p->s->B, p->s->S, y);
}
static inline tpk_status tpk__lm_bwd(tpk_ctx *ctx, void *m, int64_t i, tpk_tensor dy,
                                     tpk_tensor *dx) {
    tpk__lm_parts *p = (tpk__lm_parts *)m;
    /* the stack's gradient buffer, in place */
    return p->f->block_backward(ctx, tpk__lm_block(p, p->s->lo + i), dy, dx, true);
}
static inline tpk_status tpk__lm_ready(tpk_ctx *ctx, void *m, int64_t i) {
    tpk__lm_parts *p = (tpk__lm_parts *)m;
    int a, b;
    if (!p->s->grad_ready) return TPK_OK;
    p->f->block_params(tpk__lm_block(p, p->s->lo + i), &a, &b);
    return p->s->grad_ready(ctx, a, b, p->s->grad_ready_user);
}
static inline int tpk__lm_bufs(void *m, int64_t i, int set, tpk_buf **o) {
    tpk__lm_parts *p = (tpk__lm_parts *)m;
    return p->f->block_bufs(tpk__lm_block(p, p->s->lo + i), set, o);
}
static inline tpk_status tpk__lm_recompute(tpk_ctx *ctx, void *m, int64_t i) {
    tpk__lm_parts *p = (tpk__lm_parts *)m;
    return p->f->block_recompute(ctx, tpk__lm_block(p, p->s->lo + i));
}
static inline tpk__stack tpk__lm_stack(tpk__lm_parts *p) {
    tpk__stack st;
    memset(&st, 0, sizeof st);
    st.m = p, st.L = p->s->hi - p->s->lo, st.mode = p->mode, st.b = &p->s->rc;
    st.fwd = tpk__lm_fwd, st.bwd = tpk__lm_bwd, st.ready = tpk__lm_ready;
    st.bufs = tpk__lm_bufs, st.recompute = tpk__lm_recompute;
    return st;
}

/* ---- init, destroy --------------------------------------------------------------------------- */

/* Build the parts in parameter order: the embedding, the L blocks (block_init with the family's
 * cfg), the final norm, the untied head's weight, the head, the dropout (where p->drop), the
 * cross-entropy. *blocks receives the array of blocks (p->blocks). */
static inline tpk_status tpk__lm_init(tpk_ctx *ctx, const char *fn, tpk__lm_parts *p, void **blocks,
                                      const tpk__lm_dims *d, const void *cfg,
                                      const tpk_lm_part *part) {
    const tpk_lm_family *f = p->f;
    bool sp = d->sequence_parallel;
    tpk_lm *s = p->s;
    s->lo = part->lo, s->hi = part->hi ? part->hi : d->layers;
    s->embed = !part->no_embed, s->head = !part->no_head, s->sp = sp, s->H = d->hidden;
    if (s->lo < 0 || s->hi <= s->lo || s->hi > d->layers)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->part: blocks %lld .. %lld, expected 0 <= lo < hi <= layers = %lld",
                         (long long)part->lo, (long long)s->hi - 1, (long long)d->layers);
    TPK_TRY(tpk__stack_bufs_init(ctx, fn, &s->rc, d->layers));
    tpk_embedding_desc ed;
    memset(&ed, 0, sizeof ed);
    ed.wte_name = f->embed_name, ed.wpe_name = f->pos_name, ed.sequence_parallel = sp,
    ed.init_std = d->init_std;
    ed.vocab_multiple = d->vocab_multiple == 0 ? 64 : d->vocab_multiple < 0 ? 0 : d->vocab_multiple;
    /* without the embedding: its weight alone for a tied head, else only its sizes (Vp) */
    if (s->embed || (s->head && d->tie))
        TPK_TRY(tpk_embedding_init(ctx, p->embed, d->vocab,
                                   f->pos_name && s->embed ? d->positions : 0, d->hidden, &ed));
    else
        p->embed->V = d->vocab, p->embed->H = d->hidden, p->embed->wte = p->embed->wpe = -1,
        p->embed->Vp = tpk_vocab_padded(d->vocab, ed.vocab_multiple, ctx->tp.size);
    *blocks = p->blocks = calloc((size_t)d->layers, f->block_size);
    if (!p->blocks) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%lld blocks", (long long)d->layers);
    for (int64_t i = s->lo; i < s->hi; i++) {
        char n[64];
        snprintf(n, sizeof n, "%s.%lld", f->block_name, (long long)i);
        TPK_TRY(f->block_init(ctx, tpk__lm_block(p, i), d->hidden, n, cfg));
    }
    if (p->drop && s->embed) {
        tpk_dropout_desc dd;
        memset(&dd, 0, sizeof dd);
        dd.name = "drop", dd.p = d->dropout;
        TPK_TRY(tpk_dropout_init(ctx, p->drop, &dd));
    }
    if (!s->head) return TPK_OK;
    TPK_TRY(f->norm_init(ctx, p->norm, d->hidden, f->norm_name, d->norm_eps, sp));
    *p->head_w = p->embed->wte;
    if (!d->tie) { /* the untied head: its own [V, H] weight, vocabulary rows padded like the
                      embedding's */
        tpk_param_desc pd;
        memset(&pd, 0, sizeof pd);
        pd.name = f->head_name, pd.ndim = 2, pd.shape[0] = d->vocab, pd.shape[1] = d->hidden;
        pd.layout = tpk_tp_vocab_layout(ctx, p->embed->Vp, 0);
        pd.init = TPK_INIT_NORMAL, pd.std = d->init_std, pd.decay = true,
        pd.padded_rows = p->embed->Vp;
        TPK_TRY(tpk_param_add(ctx, &pd, p->head_w));
    }
    tpk_linear_desc hd; /* the LM head: a column linear over the vocabulary shard */
    memset(&hd, 0, sizeof hd);
    hd.name = "lm_head", hd.weight = *p->head_w + 1, hd.sequence_parallel = sp,
    hd.unit = tpk_tp_vocab_unit(ctx, p->embed->Vp);
    TPK_TRY(tpk_col_linear_init(ctx, p->head, d->hidden, p->embed->Vp, &hd));
    tpk_xent_desc xd;
    memset(&xd, 0, sizeof xd);
    xd.label_smoothing = d->label_smoothing, xd.padded_vocab = p->embed->Vp;
    return tpk_xent_init(ctx, p->ce, d->vocab, &xd);
}

/* Free every part; *blocks (the array) becomes NULL. */
static inline void tpk__lm_destroy(tpk_ctx *ctx, tpk__lm_parts *p, void **blocks) {
    tpk_embedding_destroy(ctx, p->embed);
    for (int64_t i = p->s->lo; p->blocks && i < p->s->hi; i++)
        p->f->block_destroy(ctx, tpk__lm_block(p, i));
    free(p->blocks), *blocks = p->blocks = NULL;
    tpk__stack_bufs_free(ctx, &p->s->rc, p->L);
    if (p->s->head)
        p->f->norm_destroy(ctx, p->norm), tpk_linear_destroy(ctx, p->head),
            tpk_xent_destroy(ctx, p->ce);
    if (p->drop) tpk_dropout_destroy(ctx, p->drop);
}

/* ---- forward, backward ----------------------------------------------------------------------- */

/* The hidden states [B S, H] at x in the stack's layout: R, or S(0) under sequence parallelism. */
static inline tpk_tensor tpk__lm_hidden(tpk_ctx *ctx, const tpk_lm *s, const void *x, int64_t T) {
    return tpk_tp_tensor_2d(ctx, (void *)x, ctx->dtype, T, s->H, s->sp ? TPK_S(0) : TPK_R);
}

/* The forward of the part built (tpk_F_stage_forward): from ids (the embedding), or from x_in, the
 * hidden states of the part before ([B S, H] in the stack's layout, backend memory, unchanged until
 * the backward); through its blocks; then the head and loss (tpk_gpt2_forward says what targets and
 * loss mean), or *y = the last block's output for the part after. p = NULL: not initialised. */
static inline tpk_status tpk__lm_stage_forward(tpk_ctx *ctx, const char *fn, tpk__lm_parts *p,
                                               const int32_t *ids, const void *x_in,
                                               const int32_t *targets, int64_t B, int64_t S,
                                               float *loss, tpk_tensor *y) {
    if (!ctx) return TPK_ERR_ARG;
    if (!p) return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: expected an initialised model");
    tpk_lm *s = p->s;
    if (s->head)
        TPK_TRY(tpk_xent_settle(ctx, p->ce)); /* a deferred loss, before its logits are
                                                          overwritten */
    s->have_loss = false;
    tpk_tensor x;
    if (s->embed) {
        TPK_TRY(tpk_embedding_forward(ctx, p->embed, ids, B, S, &x)); /* checks ids, B, S */
        /* in place: the embedding does not keep its output */
        if (p->drop) TPK_TRY(tpk_dropout_forward(ctx, p->drop, &x));
    } else {
        if (B < 0 || S < 0 || !x_in)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "x: expected the hidden states from the stage before (B, S >= 0), "
                             "got %s with B = %lld, S = %lld",
                             x_in ? "data" : "NULL", (long long)B, (long long)S);
        x = tpk__lm_hidden(ctx, s, x_in, B * S);
    }
    s->B = B, s->S = S;
    tpk__stack st = tpk__lm_stack(p);
    TPK_TRY(tpk__stack_forward(ctx, &st, x, &x)); /* the blocks (recompute: their inputs only, or
                                                     their GEMM outputs only, kept) */
    if (!s->head) {
        if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL (this part has no head)");
        *y = x;
        return TPK_OK;
    }
    TPK_TRY(p->f->norm_forward(ctx, p->norm, x, &x));
    TPK_TRY(tpk_col_linear_forward(ctx, p->head, x, p->logits)); /* S(-1) [T, Vp_r] */
    if (!targets) return TPK_OK;
    /* loss = NULL: the loss is computed with its gradient by the backward (fused), or settled by
     * the next forward or read */
    TPK_TRY(loss ? tpk_xent_forward(ctx, p->ce, *p->logits, targets, loss)
                 : tpk_xent_forward_deferred(ctx, p->ce, *p->logits, targets));
    s->have_loss = true;
    return TPK_OK;
}
/* The model's forward (tpk_gpt2_forward says what the arguments mean). */
static inline tpk_status tpk__lm_forward(tpk_ctx *ctx, const char *fn, tpk__lm_parts *p,
                                         const int32_t *ids, const int32_t *targets, int64_t B,
                                         int64_t S, float *loss) {
    if (ctx && p && (!p->s->embed || !p->s->head))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "model: built as a pipeline stage's part (cfg->part): use its stage "
                         "forward");
    return tpk__lm_stage_forward(ctx, fn, p, ids, NULL, targets, B, S, loss, NULL);
}

/* The backward of the part built (tpk_F_stage_backward): from the loss of the last forward, or from
 * dy_in, the gradient of the part's output (the stack's layout; its buffer is taken over: it
 * receives the gradients between blocks); accumulates the gradients of scale * (the loss) into the
 * flat gradient buffer; then the embedding's, or *dx = the gradient of the part's input for the
 * part before (valid until the next backward). p = NULL: not initialised. */
static inline tpk_status tpk__lm_stage_backward(tpk_ctx *ctx, const char *fn, tpk__lm_parts *p,
                                                float scale, void *dy_in, tpk_tensor *dx) {
    if (!ctx) return TPK_ERR_ARG;
    if (!p) return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: expected an initialised model");
    tpk_lm *s = p->s;
    tpk_tensor g;
    int a, b, w = p->embed->wte;
    if (s->head) {
        if (!s->have_loss)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "model: backward needs a forward with targets first");
        s->have_loss = false; /* the logits are overwritten by their gradient */
        TPK_TRY(tpk_xent_backward(ctx, p->ce, scale, &g));
        TPK_TRY(tpk_col_linear_backward(ctx, p->head, g, &g)); /* tied: into the embedding's
                                                                  gradient */
        /* the untied head's weight, or the tied one's copy on a stage without the embedding */
        if (s->grad_ready && (*p->head_w != w || !s->embed))
            TPK_TRY(s->grad_ready(ctx, *p->head_w, *p->head_w, s->grad_ready_user));
        TPK_TRY(p->f->norm_backward(ctx, p->norm, g, &g));
        p->f->norm_params(p->norm, &a, &b);
        if (s->grad_ready) TPK_TRY(s->grad_ready(ctx, a, b, s->grad_ready_user));
    } else {
        if (!dy_in)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "dy: expected the gradient from the stage after, got NULL");
        if (!s->B && !s->S)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: backward needs a forward first");
        g = tpk__lm_hidden(ctx, s, dy_in, s->B * s->S);
    }
    tpk__stack st = tpk__lm_stack(p);
    TPK_TRY(tpk__stack_backward(ctx, &st, g, &g)); /* each block from the last (recompute: its
                                                      forward, or its cheap parts, again first) */
    if (!s->embed) {
        if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL (this part has no embedding)");
        *dx = g;
        return TPK_OK;
    }
    /* g: block 0's input gradient, used only here */
    if (p->drop) TPK_TRY(tpk_dropout_backward_inplace(ctx, p->drop, &g));
    TPK_TRY(tpk_embedding_backward(ctx, p->embed, g));
    if (s->grad_ready) {
        int q = p->embed->wpe >= 0 ? p->embed->wpe : w;
        TPK_TRY(s->grad_ready(ctx, w < q ? w : q, w < q ? q : w,
                              s->grad_ready_user)); /* tied: the head's too */
    }
    return TPK_OK;
}
/* The model's backward (tpk_gpt2_backward). */
static inline tpk_status tpk__lm_backward(tpk_ctx *ctx, const char *fn, tpk__lm_parts *p,
                                          float scale) {
    if (ctx && p && (!p->s->embed || !p->s->head))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "model: built as a pipeline stage's part (cfg->part): use its stage "
                         "backward");
    return tpk__lm_stage_backward(ctx, fn, p, scale, NULL, NULL);
}

/* The logits of one sequence of S tokens (sampling): S(-1) [S, Vp_r]. */
static inline tpk_status tpk__lm_logits(tpk_ctx *ctx, const char *fn, tpk__lm_parts *p,
                                        const int32_t *ids, int64_t S, tpk_tensor *z) {
    TPK_TRY(tpk__lm_forward(ctx, fn, p, ids, NULL, 1, S, NULL));
    *z = *p->logits;
    return TPK_OK;
}

/* ---- the pre-norm residual block ------------------------------------------------------------ */

/* Every family's block is x1 = x + drop(attn(norm_1(x))), y = x1 + drop(mlp(norm_2(x1))), or with
 * the parallel residual (GPT-NeoX) y = x + drop(attn(norm_1(x))) + drop(mlp(norm_2(x))); its
 * forward is its own (GPT-2 fuses the first add into ln_2), its backward and its selective
 * recompute are these, through the sublayers' calls (the family's adapters, TPK__LM_ADAPTERS). */
typedef struct tpk__lm_sublayers {
    const char *name;  /* the block's */
    int64_t H;         /* 0: not initialised */
    void *norm_1, *attn, *norm_2, *mlp;
    tpk_residual *res_1, *res_2;
    tpk_tensor *x1, *x2; /* norm_1's and norm_2's kept inputs (x, x1) */
    tpk_status (*norm_forward)(tpk_ctx *ctx, void *n, tpk_tensor x, tpk_tensor *y);
    tpk_status (*norm_backward)(tpk_ctx *ctx, void *n, tpk_tensor dy, tpk_tensor *dx);
    tpk_status (*norm_backward_add)(tpk_ctx *ctx, void *n, tpk_tensor dy, tpk_tensor acc);
    tpk_status (*attn_backward)(tpk_ctx *ctx, void *a, tpk_tensor dy, tpk_tensor *dx);
    tpk_status (*mlp_backward)(tpk_ctx *ctx, void *m, tpk_tensor dy, tpk_tensor *dx);
    tpk_status (*attn_recompute)(tpk_ctx *ctx, void *a, tpk_tensor h);
    tpk_status (*mlp_recompute)(tpk_ctx *ctx, void *m, tpk_tensor h);
    int (*norm_bufs)(void *n, int set, tpk_buf **o); /* each layer's own buffers by set
                                                        (tpk/runtime/buf.h) */
    int (*attn_bufs)(void *a, int set, tpk_buf **o);
    int (*mlp_bufs)(void *m, int set, tpk_buf **o);
    bool parallel; /* the parallel residual: both branches read x, dy flows into both */
    tpk_status (*attn_forward)(tpk_ctx *ctx, void *a, tpk_tensor x, int64_t B, int64_t S,
                               tpk_tensor *y);
    tpk_status (*mlp_forward)(tpk_ctx *ctx, void *m, tpk_tensor x, tpk_tensor *y);
    void (*norm_destroy)(tpk_ctx *ctx, void *n);
    void (*attn_destroy)(tpk_ctx *ctx, void *a);
    void (*mlp_destroy)(tpk_ctx *ctx, void *m);
} tpk__lm_sublayers;

/* y = block(x) for B sequences of S tokens: x R [B S, H] (S(0) under sequence parallelism), y the
 * same layout; x must stay unchanged until backward. norm_1, attn, the first residual (x1 = x +
 * drop(a), in a's buffer), norm_2 on x1 (or on x: the parallel residual), mlp, the second (y = x1
 * + drop(m), in m's). b = NULL: no block. */
static inline tpk_status tpk__lm_block_forward(tpk_ctx *ctx, const char *fn,
                                               const tpk__lm_sublayers *b, tpk_tensor x, int64_t B,
                                               int64_t S, tpk_tensor *y) {
    TPK_TRY(tpk__lm_block_args(ctx, fn, b ? b->H : 0, y));
    tpk_tensor h, a, x1, m;
    TPK_TRY(b->norm_forward(ctx, b->norm_1, x, &h)); /* checks x: layout, [T, H] */
    TPK_TRY(b->attn_forward(ctx, b->attn, h, B, S, &a));
    TPK_TRY(tpk_residual_forward(ctx, b->res_1, x, a, &x1));
    TPK_TRY(b->norm_forward(ctx, b->norm_2, b->parallel ? x : x1, &h));
    TPK_TRY(b->mlp_forward(ctx, b->mlp, h, &m));
    return tpk_residual_forward(ctx, b->res_2, x1, m, y);
}
/* Frees the block's buffers (its parameters stay in the context). */
static inline void tpk__lm_block_destroy(tpk_ctx *ctx, const tpk__lm_sublayers *b) {
    b->norm_destroy(ctx, b->norm_1), b->norm_destroy(ctx, b->norm_2);
    b->attn_destroy(ctx, b->attn), b->mlp_destroy(ctx, b->mlp);
    tpk_residual_destroy(ctx, b->res_1), tpk_residual_destroy(ctx, b->res_2);
}

/* dx of the last forward from dy (the layout of y); accumulates every gradient of the block.
 * inplace: dy's buffer, which the caller gives up, receives dx — each norm's backward adds its
 * input gradient onto the skip path's in the same pass (no add and no buffer of their own; the
 * stack of blocks passes one gradient buffer down so); otherwise dy is left unchanged and dx is in
 * norm_1's buffer. b = NULL: no block. */
static inline tpk_status tpk__lm_block_backward(tpk_ctx *ctx, const char *fn,
                                                const tpk__lm_sublayers *b, tpk_tensor dy,
                                                tpk_tensor *dx, bool inplace) {
    if (!ctx) return TPK_ERR_ARG;
    if (!b || !b->H) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: expected an initialised block");
    if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL");
    if (!b->x1->ndim)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer \"%s\": backward before forward", b->name);
    TPK_TRY(tpk__check(ctx, fn, "dy", &dy, b->x1->layout, ctx->dtype, 2, b->x1->gshape));
    tpk_tensor g, dh, dx1, da;
    TPK_TRY(tpk_residual_backward(ctx, b->res_2, dy, &g));      /* drop'(dy) into the MLP branch */
    TPK_TRY(b->mlp_backward(ctx, b->mlp, g, &dh));
    if (b->parallel) {
        /* both branches from dy, before dy (inplace: its buffer) takes the sum */
        TPK_TRY(tpk_residual_backward(ctx, b->res_1, dy, &g));
        TPK_TRY(b->attn_backward(ctx, b->attn, g, &da));
        if (inplace) { /* dx = dy + norm_2's dx + norm_1's dx, in dy's buffer */
            TPK_TRY(b->norm_backward_add(ctx, b->norm_2, dh, dy));
            TPK_TRY(b->norm_backward_add(ctx, b->norm_1, da, dy));
            *dx = dy;
            return TPK_OK;
        }
        TPK_TRY(b->norm_backward(ctx, b->norm_2, dh, &dx1));       /* in norm_2's buffer */
        TPK_TRY(tpk_residual_backward_add(ctx, b->res_2, dx1, dy)); /* dx1 += dy: the skip path */
        TPK_TRY(b->norm_backward(ctx, b->norm_1, da, dx));         /* in norm_1's buffer */
        return tpk_residual_backward_add(ctx, b->res_1, *dx, dx1);  /* dx += dx1 */
    }
    if (inplace) {
        /* dx1 = dy + norm_2's dx, in dy's buffer */
        TPK_TRY(b->norm_backward_add(ctx, b->norm_2, dh, dy));
        /* drop'(dx1) into the attention branch */
        TPK_TRY(tpk_residual_backward(ctx, b->res_1, dy, &g));
        TPK_TRY(b->attn_backward(ctx, b->attn, g, &da));
        TPK_TRY(b->norm_backward_add(ctx, b->norm_1, da, dy)); /* dx = dx1 + norm_1's dx */
        *dx = dy;
        return TPK_OK;
    }
    TPK_TRY(b->norm_backward(ctx, b->norm_2, dh, &dx1));       /* in norm_2's buffer */
    TPK_TRY(tpk_residual_backward_add(ctx, b->res_2, dx1, dy)); /* dx1 += dy: the skip path */
    /* drop'(dx1) into the attention branch */
    TPK_TRY(tpk_residual_backward(ctx, b->res_1, dx1, &g));
    TPK_TRY(b->attn_backward(ctx, b->attn, g, &da));
    TPK_TRY(b->norm_backward(ctx, b->norm_1, da, dx));         /* in norm_1's buffer */
    return tpk_residual_backward_add(ctx, b->res_1, *dx, dx1);  /* dx += dx1: the skip path */
}
/* The block's buffers by set (tpk__stack.bufs): its layers' lists, one after another. */
static inline int tpk__lm_block_bufs(const tpk__lm_sublayers *b, int set, tpk_buf **o) {
    int n = b->norm_bufs(b->norm_1, set, o);
    n += b->attn_bufs(b->attn, set, o + n);
    n += b->norm_bufs(b->norm_2, set, o + n);
    n += b->mlp_bufs(b->mlp, set, o + n);
    n += tpk__residual_bufs(b->res_1, set, o + n);
    return n + tpk__residual_bufs(b->res_2, set, o + n);
}
/* Selective recompute: the norms forward again on their kept inputs (the same statistics, the
 * same outputs), the attention and the MLP remake their lent buffers (tpk/layers/recompute.h). */
static inline tpk_status tpk__lm_block_recompute(tpk_ctx *ctx, const tpk__lm_sublayers *b) {
    tpk_tensor h;
    TPK_TRY(b->norm_forward(ctx, b->norm_1, *b->x1, &h));
    TPK_TRY(b->attn_recompute(ctx, b->attn, h));
    TPK_TRY(b->norm_forward(ctx, b->norm_2, *b->x2, &h));
    return b->mlp_recompute(ctx, b->mlp, h);
}

/* The adapters of family F: its block type BLOCK (members N1, attn, N2, mlp, res_1, res_2,
 * name, H: the norms' member names are the family's; parameters ids p0..p1), its norm NORM
 * (tpk_NORM with tpk_NORM_desc; parameters ids w..LAST), attention ATTN and MLP (tpk_ATTN_forward,
 * _backward, _destroy, tpk__ATTN_recompute, tpk__ATTN_bufs, likewise MLP's and NORM's): each
 * casts the void * and calls the layer's own function. They define the block's destroy
 * (tpk_F_block_destroy), backward (tpk_F_block_backward: dx of the last forward from dy, left
 * unchanged, every gradient of the block accumulated; tpk__F_block_backward with `inplace`, the
 * model's form), buffer lists (tpk__F_block_bufs) and
 * recompute — the skeleton's, above —, and declare tpk_F_block_forward: the family's own, or the
 * skeleton's through TPK__LM_BLOCK_FORWARD. */
#define TPK__LM_ADAPTERS(F, BLOCK, N1, N2, NORM, LAST, ATTN, MLP)                                  \
    TPK__LM_ADAPTERS_EX(F, BLOCK, N1, N2, NORM, LAST, ATTN, MLP, false)
/* The same with the parallel residual (PARALLEL true: GPT-NeoX's block). */
#define TPK__LM_ADAPTERS_EX(F, BLOCK, N1, N2, NORM, LAST, ATTN, MLP, PARALLEL)                     \
    static inline tpk_status tpk_##F##_block_forward(tpk_ctx *ctx, BLOCK *b, tpk_tensor x,         \
                                                     int64_t B, int64_t S, tpk_tensor *y);         \
    static inline tpk_status tpk__##F##_lm_block_forward(tpk_ctx *ctx, void *b, tpk_tensor x,      \
                                                         int64_t B, int64_t S, tpk_tensor *y) {    \
        return tpk_##F##_block_forward(ctx, (BLOCK *)b, x, B, S, y);                               \
    }                                                                                              \
    static inline void tpk__##F##_lm_block_params(const void *b, int *first, int *last) {          \
        *first = ((const BLOCK *)b)->p0, *last = ((const BLOCK *)b)->p1;                           \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_norm_init(tpk_ctx *ctx, void *n, int64_t H,             \
                                                     const char *name, float eps, bool sp) {       \
        tpk_##NORM##_desc d;                                                                       \
        memset(&d, 0, sizeof d);                                                                   \
        d.name = name, d.eps = eps, d.sequence_parallel = sp;                                      \
        return tpk_##NORM##_init(ctx, (tpk_##NORM *)n, H, &d);                                     \
    }                                                                                              \
    static inline void tpk__##F##_lm_norm_destroy(tpk_ctx *ctx, void *n) {                         \
        tpk_##NORM##_destroy(ctx, (tpk_##NORM *)n);                                                \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_norm_forward(tpk_ctx *ctx, void *n, tpk_tensor x,       \
                                                        tpk_tensor *y) {                           \
        return tpk_##NORM##_forward(ctx, (tpk_##NORM *)n, x, y);                                   \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_norm_backward(tpk_ctx *ctx, void *n, tpk_tensor dy,     \
                                                         tpk_tensor *dx) {                         \
        return tpk_##NORM##_backward(ctx, (tpk_##NORM *)n, dy, dx);                                \
    }                                                                                              \
    static inline void tpk__##F##_lm_norm_params(const void *n, int *first, int *last) {           \
        *first = ((const tpk_##NORM *)n)->w, *last = ((const tpk_##NORM *)n)->LAST;                \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_norm_backward_add(tpk_ctx *ctx, void *n, tpk_tensor dy, \
                                                             tpk_tensor acc) {                     \
        return tpk_##NORM##_backward_add(ctx, (tpk_##NORM *)n, dy, acc);                           \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_attn_backward(tpk_ctx *ctx, void *a, tpk_tensor dy,     \
                                                         tpk_tensor *dx) {                         \
        return tpk_##ATTN##_backward(ctx, (tpk_##ATTN *)a, dy, dx);                                \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_mlp_backward(tpk_ctx *ctx, void *m, tpk_tensor dy,      \
                                                        tpk_tensor *dx) {                          \
        return tpk_##MLP##_backward(ctx, (tpk_##MLP *)m, dy, dx);                                  \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_attn_recompute(tpk_ctx *ctx, void *a, tpk_tensor h) {   \
        return tpk__##ATTN##_recompute(ctx, (tpk_##ATTN *)a, h);                                   \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_mlp_recompute(tpk_ctx *ctx, void *m, tpk_tensor h) {    \
        return tpk__##MLP##_recompute(ctx, (tpk_##MLP *)m, h);                                     \
    }                                                                                              \
    static inline int tpk__##F##_lm_norm_bufs(void *n, int set, tpk_buf **o) {                     \
        return tpk__##NORM##_bufs((tpk_##NORM *)n, set, o);                                        \
    }                                                                                              \
    static inline int tpk__##F##_lm_attn_bufs(void *a, int set, tpk_buf **o) {                     \
        return tpk__##ATTN##_bufs((tpk_##ATTN *)a, set, o);                                        \
    }                                                                                              \
    static inline int tpk__##F##_lm_mlp_bufs(void *m, int set, tpk_buf **o) {                      \
        return tpk__##MLP##_bufs((tpk_##MLP *)m, set, o);                                          \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_attn_forward(tpk_ctx *ctx, void *a, tpk_tensor x,       \
                                                        int64_t B, int64_t S, tpk_tensor *y) {     \
        return tpk_##ATTN##_forward(ctx, (tpk_##ATTN *)a, x, B, S, y);                             \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_mlp_forward(tpk_ctx *ctx, void *m, tpk_tensor x,        \
                                                       tpk_tensor *y) {                            \
        return tpk_##MLP##_forward(ctx, (tpk_##MLP *)m, x, y);                                     \
    }                                                                                              \
    static inline void tpk__##F##_lm_attn_destroy(tpk_ctx *ctx, void *a) {                         \
        tpk_##ATTN##_destroy(ctx, (tpk_##ATTN *)a);                                                \
    }                                                                                              \
    static inline void tpk__##F##_lm_mlp_destroy(tpk_ctx *ctx, void *m) {                          \
        tpk_##MLP##_destroy(ctx, (tpk_##MLP *)m);                                                  \
    }                                                                                              \
    static inline tpk__lm_sublayers tpk__##F##_sublayers(BLOCK *b) {                               \
        tpk__lm_sublayers s = {                                                                    \
            b->name, b->H, &b->N1, &b->attn, &b->N2, &b->mlp, &b->res_1, &b->res_2, &b->N1.x,      \
            &b->N2.x, tpk__##F##_lm_norm_forward, tpk__##F##_lm_norm_backward,                     \
            tpk__##F##_lm_norm_backward_add, tpk__##F##_lm_attn_backward,                          \
            tpk__##F##_lm_mlp_backward,                                                            \
            tpk__##F##_lm_attn_recompute, tpk__##F##_lm_mlp_recompute, tpk__##F##_lm_norm_bufs,    \
            tpk__##F##_lm_attn_bufs, tpk__##F##_lm_mlp_bufs, PARALLEL, tpk__##F##_lm_attn_forward, \
            tpk__##F##_lm_mlp_forward, tpk__##F##_lm_norm_destroy, tpk__##F##_lm_attn_destroy,     \
            tpk__##F##_lm_mlp_destroy};                                                            \
        return s;                                                                                  \
    }                                                                                              \
    static inline void tpk_##F##_block_destroy(tpk_ctx *ctx, BLOCK *b) {                           \
        tpk__lm_sublayers s = tpk__##F##_sublayers(b);                                             \
        tpk__lm_block_destroy(ctx, &s);                                                            \
    }                                                                                              \
    static inline void tpk__##F##_lm_block_destroy(tpk_ctx *ctx, void *b) {                        \
        tpk_##F##_block_destroy(ctx, (BLOCK *)b);                                                  \
    }                                                                                              \
    static inline tpk_status tpk__##F##_block_backward(tpk_ctx *ctx, BLOCK *b, tpk_tensor dy,      \
                                                       tpk_tensor *dx, bool inplace) {             \
        tpk__lm_sublayers s;                                                                       \
        return tpk__lm_block_backward(ctx, "tpk_" #F "_block_backward",                            \
                                      b ? (s = tpk__##F##_sublayers(b), &s) : NULL, dy, dx,        \
                                      inplace);                                                    \
    }                                                                                              \
    static inline tpk_status tpk_##F##_block_backward(tpk_ctx *ctx, BLOCK *b, tpk_tensor dy,       \
                                                      tpk_tensor *dx) {                            \
        return tpk__##F##_block_backward(ctx, b, dy, dx, false);                                   \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_block_backward(tpk_ctx *ctx, void *b, tpk_tensor dy,    \
                                                          tpk_tensor *dx, bool inplace) {          \
        return tpk__##F##_block_backward(ctx, (BLOCK *)b, dy, dx, inplace);                        \
    }                                                                                              \
    static inline tpk_status tpk__##F##_lm_block_recompute(tpk_ctx *ctx, void *b) {                \
        tpk__lm_sublayers s = tpk__##F##_sublayers((BLOCK *)b);                                    \
        return tpk__lm_block_recompute(ctx, &s);                                                   \
    }                                                                                              \
    static inline int tpk__##F##_block_bufs(BLOCK *b, int set, tpk_buf **o) {                      \
        tpk__lm_sublayers s = tpk__##F##_sublayers(b);                                             \
        return tpk__lm_block_bufs(&s, set, o);                                                     \
    }                                                                                              \
    static inline int tpk__##F##_lm_block_bufs(void *b, int set, tpk_buf **o) {                    \
        return tpk__##F##_block_bufs((BLOCK *)b, set, o);                                          \
    }
/* The block's forward for a family whose block is the skeleton's (tpk__lm_block_forward): defines
 * tpk_F_block_forward (after TPK__LM_ADAPTERS or _EX). GPT-2 writes its own (it fuses the first
 * residual add into ln_2). */
#define TPK__LM_BLOCK_FORWARD(F, BLOCK)                                                            \
    static inline tpk_status tpk_##F##_block_forward(tpk_ctx *ctx, BLOCK *b, tpk_tensor x,         \
                                                     int64_t B, int64_t S, tpk_tensor *y) {        \
        tpk__lm_sublayers s;                                                                       \
        return tpk__lm_block_forward(ctx, "tpk_" #F "_block_forward",                              \
                                     b ? (s = tpk__##F##_sublayers(b), &s) : NULL, x, B, S, y);    \
    }
/* The row: names as in tpk_lm_family; block_init is tpk__F_lm_block_init (the family's own). */
#define TPK__LM_FAMILY_ROW(F, BLOCK, EMBED, POS, BLOCKS, NORMNAME, HEAD)                           \
    {                                                                                              \
        /* name */ #F, EMBED, POS, BLOCKS, NORMNAME, HEAD, sizeof(BLOCK),                          \
        tpk__##F##_lm_block_init, tpk__##F##_lm_block_destroy, tpk__##F##_lm_block_forward,        \
        tpk__##F##_lm_block_backward, tpk__##F##_lm_block_bufs, tpk__##F##_lm_block_recompute,     \
        tpk__##F##_lm_block_params, tpk__##F##_lm_norm_init, tpk__##F##_lm_norm_destroy,           \
        tpk__##F##_lm_norm_forward, tpk__##F##_lm_norm_backward, tpk__##F##_lm_norm_params         \
    }

/* A family's model entries over the skeleton (sampling: tpk/models/sample.h), for a model tpk_F
 * with its config in m->c (vocab, positions, layers), its blocks in m->BLOCKS and its parts
 * gathered by tpk__F_lm(m):
 *   tpk__F_lm_init(ctx, fn, m, d)   the skeleton's init into m->BLOCKS (cfg checked before)
 *   tpk_F_forward(ctx, m, ids, targets, B, S, loss)   B sequences of S tokens (S <= cfg.positions):
 *                                   ids [B S] and targets [B S] in host memory (the same on every
 *                                   TP rank; a target may be the ignore index -100). *loss = the
 *                                   mean cross-entropy over the counted positions (a download: the
 *                                   host waits); loss = NULL keeps it in backend memory, added to
 *                                   the running sum tpk_xent_loss_read(ctx, &m->ce, ...) reads, and
 *                                   defers it: the backward computes it with the logits' gradient
 *                                   in one pass (tpk/layers/xent.h, fused), or the next forward or
 *                                   read alone. targets = NULL only computes m->logits (S(-1)
 *                                   [B S, Vp_r]); loss is then not touched
 *   tpk_F_destroy(ctx, m)           frees what init made
 *   tpk_F_backward(ctx, m, scale)   accumulates the gradients of scale * (the last forward's loss)
 *                                   into the flat gradient buffer (tpk_params_zero_grad first)
 *   tpk_F_stage_forward(ctx, m, ids, x, targets, B, S, loss, y), tpk_F_stage_backward(ctx, m,
 *                                   scale, dy, dx)   the same for a part (cfg.part: a pipeline
 *                                   stage's): from x, the hidden states of the part before, unless
 *                                   it has the embedding; *y its output unless it has the head; the
 *                                   backward from dy unless it has the head, *dx unless it has the
 *                                   embedding (tpk__lm_stage_forward, _backward)
 *   tpk_F_generate(ctx, m, prompt, n_prompt, n, opts, seed, out)   out[0..n_prompt) = prompt,
 *                                   then n tokens sampled one after another under opts
 *                                   (tpk_sample_opts: temperature, top_k, top_p; NULL: plain
 *                                   sampling) (set dropout to 0 first)
 *   tpk_F_sample(ctx, m, start, n, temperature, seed, out)   the same from a 1-token prompt at a
 *                                   temperature alone: out[0] = start, out[1..n]
 *   tpk__F_bufs(m, i, set, o)       block i's buffers of one recompute set (the tests check the
 *                                   pools hold them) */
#define TPK__LM_MODEL_ENTRIES(F, BLOCKS)                                                          \
    static inline tpk_status tpk_##F##_forward(tpk_ctx *ctx, tpk_##F *m, const int32_t *ids,      \
                                               const int32_t *targets, int64_t B, int64_t S,      \
                                               float *loss) {                                     \
        static const char *fn = "tpk_" #F "_forward";                                             \
        tpk__lm_parts p;                                                                          \
        if (!ctx) return TPK_ERR_ARG;                                                             \
        if (m && m->BLOCKS && S > m->c.positions && !tpk__##F##_lm(m).f->pos_name)                \
            return tpk__fail(ctx, TPK_ERR_SHAPE, fn,                                              \
                             "S: expected at most cfg->positions = %lld, got %lld",               \
                             (long long)m->c.positions, (long long)S);                            \
        return tpk__lm_forward(ctx, fn, m && m->BLOCKS ? (p = tpk__##F##_lm(m), &p) : NULL, ids,  \
                               targets, B, S, loss);                                              \
    }                                                                                             \
    static inline tpk_status tpk__##F##_lm_init(tpk_ctx *ctx, const char *fn, tpk_##F *m,         \
                                                const tpk__lm_dims *d) {                          \
        tpk__lm_parts p = tpk__##F##_lm(m);                                                       \
        void *blocks = NULL;                                                                      \
        tpk_status s = tpk__lm_init(ctx, fn, &p, &blocks, d, &m->c, &m->c.part);                  \
        m->BLOCKS = (tpk_##F##_block *)blocks;                                                    \
        return s;                                                                                 \
    }                                                                                             \
    static inline void tpk_##F##_destroy(tpk_ctx *ctx, tpk_##F *m) {                              \
        tpk__lm_parts p = tpk__##F##_lm(m);                                                       \
        void *blocks = m->BLOCKS;                                                                 \
        tpk__lm_destroy(ctx, &p, &blocks);                                                        \
        m->BLOCKS = NULL;                                                                         \
    }                                                                                             \
    static inline tpk_status tpk_##F##_backward(tpk_ctx *ctx, tpk_##F *m, float scale) {          \
        tpk__lm_parts p;                                                                          \
        return tpk__lm_backward(ctx, "tpk_" #F "_backward",                                       \
                                m && m->BLOCKS ? (p = tpk__##F##_lm(m), &p) : NULL, scale);       \
    }                                                                                             \
    static inline tpk_status tpk_##F##_stage_forward(                                             \
        tpk_ctx *ctx, tpk_##F *m, const int32_t *ids, const void *x, const int32_t *targets,      \
        int64_t B, int64_t S, float *loss, tpk_tensor *y) {                                       \
        tpk__lm_parts p;                                                                          \
        return tpk__lm_stage_forward(ctx, "tpk_" #F "_stage_forward",                             \
                                     m && m->BLOCKS ? (p = tpk__##F##_lm(m), &p) : NULL, ids, x,  \
                                     targets, B, S, loss, y);                                     \
    }                                                                                             \
    static inline tpk_status tpk_##F##_stage_backward(tpk_ctx *ctx, tpk_##F *m, float scale,      \
                                                      void *dy, tpk_tensor *dx) {                 \
        tpk__lm_parts p;                                                                          \
        return tpk__lm_stage_backward(ctx, "tpk_" #F "_stage_backward",                           \
                                      m && m->BLOCKS ? (p = tpk__##F##_lm(m), &p) : NULL, scale,  \
                                      dy, dx);                                                    \
    }                                                                                             \
    static inline tpk_status tpk_##F##_generate(tpk_ctx *ctx, tpk_##F *m, const int32_t *prompt,  \
                                                int n_prompt, int n, const tpk_sample_opts *opts, \
                                                uint64_t seed, int32_t *out) {                    \
        tpk__lm_parts p;                                                                          \
        return tpk__lm_generate(                                                                  \
            ctx, "tpk_" #F "_generate", m && m->BLOCKS ? (p = tpk__##F##_lm(m), &p) : NULL,       \
            m ? m->c.vocab : 0, m ? m->c.positions : 0, prompt, n_prompt, n, opts, seed, out);    \
    }                                                                                             \
    static inline tpk_status tpk_##F##_sample(tpk_ctx *ctx, tpk_##F *m, int32_t start, int n,     \
                                              float temperature, uint64_t seed, int32_t *out) {   \
        tpk__lm_parts p;                                                                          \
        return tpk__lm_sample(                                                                    \
            ctx, "tpk_" #F "_sample", m && m->BLOCKS ? (p = tpk__##F##_lm(m), &p) : NULL,         \
            m ? m->c.vocab : 0, m ? m->c.positions : 0, start, n, temperature, seed, out);        \
    }                                                                                             \
    static inline int tpk__##F##_bufs(void *m, int64_t i, int set, tpk_buf **o) {                 \
        return tpk__##F##_block_bufs(&((tpk_##F *)m)->BLOCKS[i], set, o);                         \
    }

#endif /* TPK_LM_H */
