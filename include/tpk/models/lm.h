/* tpk/models/lm.h — the language model every model is: one type (tpk_lm) over the block of
 * tpk/models/block.h, configured by data (tpk_lm_config). GPT-2, Llama and GPT-NeoX are
 * configurations of it (tpk/models/gpt2.h, llama.h, neox.h); a user's own model is another.
 *
 *   ids -> embedding (vocabulary-parallel; + a learned position table where pos_name is set)
 *       -> dropout (where the model has dropout sites) -> L blocks (tpk_block)
 *       -> final norm -> logits = h Wᵀ (a column linear over the vocabulary shard: W the
 *          embedding's rows when tied, else its own [V, H] weight, rows padded alike) S(-1) [T, Vp]
 *       -> vocabulary-parallel cross-entropy (mean over the counted positions).
 *   backward mirrors it, calling the data-parallel hook (grad_ready) as each group of gradients is
 *   final: the untied head, the final norm, each block from the last, the embedding.
 *
 * The blocks run as a stack with optional activation recompute (tpk/layers/recompute.h: none,
 * selective, full): a block's buffers are lent from the model's pools, one block at a time, and
 * under full recompute each block's input is kept and its forward runs again in the backward.
 * Every call here is a plain function; the stack calls tpk_block_* directly.
 *
 * Context parallelism (ctx->cp, c > 1; tpk/layers/cp_split.h): a forward of B sequences of S
 * tokens (S a multiple of 2c, refused by name otherwise) takes this rank's rows, its two chunks of
 * each sequence: ids and targets [B S / c] (tpk_cp_scatter_host of the whole batch's), the hidden
 * states and logits [B S / c, ...]. Learned positions and rotary embeddings at the true positions,
 * the attention over the CP group (cfg.cp_comm), the loss the mean over every CP rank's counted
 * tokens (tpk/layers/xent.h); each parameter's gradient is this rank's rows' part, complete once
 * summed over ctx->cp (with the data-parallel reduction, over ctx->dp_cp). Dropout under CP draws
 * the masks of CP 1 (each row's at its true position: tpk/layers/resid.h, cp_attn.h).
 * Mixture of experts (blocks whose MLP is TPK_MLP_MOE: Mixtral): the loss is the cross-entropy plus
 * coef balance, the load-balancing loss as Hugging Face's MixtralForCausalLM computes it
 * (load_balancing_loss_func over every layer's router logits concatenated, not the layers' losses
 * summed): balance = E sum_e C_e Q_e / N², C_e the rows routed to expert e and Q_e = sum_t p_te
 * summed over the MoE layers, N = L T (this rank's T tokens in each of the L MoE layers: a model of
 * two kinds of block, cfg.mlp_2, pools its MoE blocks alone, as Hugging Face's Qwen2-MoE pools
 * the router logits of its sparse layers, its dense ones returning none). Its gradient
 * on every token's p_te in every layer is scale coef E C_e / N² (the counts not differentiated),
 * handed to each router (tpk_router_backward_pooled). A router z-loss (tpk_moe_desc.z_coef > 0,
 * ST-MoE's, as Megatron-core's moe_z_loss_coeff) adds each layer's z_coef mean_t lse_t² to it: the
 * layers' z-losses summed, each router's own gradient scaled by the loss's (m->aux_g). m->aux
 * holds the last forward's coef balance (+ the z-losses). On a pipeline stage's part the sums
 * start from the parts before's (C_e, Q_e, N and the z-losses up to its first block, handed on
 * beside the hidden states: tpk/train/pipe_model.h), so the last part's aux is the whole model's,
 * and the backward of every other part takes the whole model's C_e and N from the part after:
 * the bits of the model without stages. Under context parallelism each part's sums are summed
 * over ctx->cp (a host all-reduce of 2 E + 2 values in the forward: C_e, Q_e and N over every
 * token of the sequences, the z-losses each a mean over all c T of them, so the routers' z-loss
 * gradient takes scale / c), every CP rank then holding the CP 1 model's aux; each router's
 * gradient is its rows' part, complete once summed over ctx->cp like every other. */
#ifndef TPK_LM_H
#define TPK_LM_H

#include "../layers/embed.h"
#include "../layers/linear.h"
#include "../layers/xent.h"
#include "block.h"
#include "sample.h"

/* The part of the model a rank builds (pipeline parallelism: one virtual stage's, tpk/train/
 * pipeline.h); zeros: the whole model. Blocks lo .. hi - 1 (hi = 0: all L); the embedding (and its
 * dropout) unless no_embed, the final norm, the LM head and the loss unless no_head. A tied head
 * without the embedding registers the embedding's weight under its name (a copy: Megatron's
 * word_embeddings_for_head; the pipeline sums the two copies' gradients). */
typedef struct tpk_lm_part {
    int64_t lo, hi;
    bool no_embed, no_head;
} tpk_lm_part;

/* A set of layers, layer i its bit i (a family's per-layer choice: Qwen2-MoE's mlp_only_layers):
 * layers 0 .. TPK_LAYER_SET_MAX - 1. A value: a config holding one copies whole. */
#define TPK_LAYER_SET_MAX 1024
typedef struct tpk_layer_set {
    uint64_t w[TPK_LAYER_SET_MAX / 64];
} tpk_layer_set;
static inline bool tpk_layer_set_has(const tpk_layer_set *s, int64_t i) {
    return i >= 0 && i < TPK_LAYER_SET_MAX && (s->w[i / 64] >> (i % 64) & 1u);
}
/* Adds layer i (false, nothing added, when i is outside 0 .. TPK_LAYER_SET_MAX - 1). */
static inline bool tpk_layer_set_add(tpk_layer_set *s, int64_t i) {
    if (i < 0 || i >= TPK_LAYER_SET_MAX) return false;
    s->w[i / 64] |= (uint64_t)1 << (i % 64);
    return true;
}
/* The largest layer in s, -1 when s is empty. */
static inline int64_t tpk_layer_set_last(const tpk_layer_set *s) {
    for (int64_t i = TPK_LAYER_SET_MAX - 1; i >= 0; i--)
        if (tpk_layer_set_has(s, i)) return i;
    return -1;
}
/* "0,2,5" (whole numbers in 0 .. TPK_LAYER_SET_MAX - 1 separated by commas, in any order, repeats
 * allowed) or "none" (or "": the empty set) into *s; false (s emptied) when the text is neither. */
static inline bool tpk_layer_set_parse(const char *text, tpk_layer_set *s) {
    memset(s, 0, sizeof *s);
    if (!text || !*text || !strcmp(text, "none")) return text != NULL;
    for (const char *c = text;;) {
        if (*c < '0' || *c > '9') return memset(s, 0, sizeof *s), false;
        int64_t v = 0;
        while (*c >= '0' && *c <= '9' && v < TPK_LAYER_SET_MAX) v = 10 * v + (*c++ - '0');
        if ((*c != ',' && *c) || !tpk_layer_set_add(s, v)) return memset(s, 0, sizeof *s), false;
        if (!*c++) return true;
    }
}
/* s as its layers separated by sep ("0, 2, 5"; "" when empty) into buf (n bytes), returned. */
static inline const char *tpk_layer_set_text(const tpk_layer_set *s, const char *sep, char *buf,
                                             size_t n) {
    size_t at = 0;
    if (n) buf[0] = 0;
    for (int64_t i = 0; i < TPK_LAYER_SET_MAX && at < n; i++)
        if (tpk_layer_set_has(s, i)) {
            int k = snprintf(buf + at, n - at, "%s%lld", at ? sep : "", (long long)i);
            at += k > 0 ? (size_t)k : 0;
        }
    return buf;
}

/* A field of a family's config a trainer sets from its command line ("--flag value"; the kit's
 * trainer, examples/train.c, takes every family's through tpk/train/model.h). */
enum { TPK_LM_FLAG_FLOAT = 0, TPK_LM_FLAG_INT = 1, TPK_LM_FLAG_LAYERS = 2, TPK_LM_FLAG_OPTION = 3 };
typedef struct tpk_lm_flag {
    const char *flag;  /* "--rotary-pct" */
    size_t off;        /* of the field in the family's config */
    int kind;          /* TPK_LM_FLAG_INT (true): an int64_t field; _FLOAT (false): a float;
                          _LAYERS: a tpk_layer_set, the value its layers "0,2" or "none"
                          (tpk_layer_set_parse; lo, hi unused); _OPTION: a float training option
                          config.json does not carry (the routers' z-loss, the capacity factor),
                          under --load taken as given, not checked against the checkpoint's */
    double lo, hi;     /* the values accepted */
    const char *label; /* its name in the trainer's banner ("F"); NULL: not shown */
    const char *help;  /* what the usage says after the flag */
} tpk_lm_flag;

typedef struct tpk_lm_config {
    int64_t vocab;        /* V (need not divide t) */
    int64_t positions;    /* the longest sequence (the position table's rows, where there is one) */
    int64_t layers;       /* L */
    int64_t hidden;       /* H */
    tpk_block_desc block; /* every block's; block.name is the blocks' prefix: block i is
                                 "<block.name>.<i>" (default "layers"); block.sequence_parallel
                                 is set from sequence_parallel below */
    tpk_norm_desc final_norm; /* its name is whole: "ln_f" (default "norm") */
    const char *embed_name;   /* the token embedding's weight (default "embed.weight") */
    const char *pos_name;     /* a learned position table's weight ("wpe.weight"); NULL: none */
    const char *head_name;    /* the untied head's weight (default "lm_head.weight") */
    bool tie_embeddings;      /* the head reuses the embedding's rows (no weight of its own) */
    bool dropout_sites;       /* dropout after the embedding and in every block, at probability
                                 block.dropout; false: none anywhere (block.dropout must be 0,
                                 tpk_lm_set_dropout refuses p > 0) */
    float label_smoothing;    /* over the global vocabulary */
    float init_std;           /* the embedding's and the untied head's weights; 0: 0.02 */
    int64_t vocab_multiple;   /* shards padded to a multiple of this many rows (aligned GEMMs);
                                 0: 64, < 0: none */
    bool sequence_parallel;   /* hidden states S(0) between the layers */
    tpk_cp_comm cp_comm;      /* the attentions under context parallelism: TPK_CP_P2P (the ring,
                                 default) or TPK_CP_ALLGATHER; set in block.cp_comm */
    tpk_recompute recompute;  /* TPK_RECOMPUTE_FULL: each block's forward again in the backward;
                                 _SELECTIVE: the norms, the attention kernel and activations */
    tpk_lm_part part;         /* the part built (pipeline stages); zeros: all */
    /* Optional: a model of two kinds of block (Qwen2-MoE's dense layers among its sparse ones):
       block i's MLP is mlp_2 where mlp_2_at(mlp_2_user, i) is true, else block.mlp (mlp_2_at
       NULL: block.mlp in every block). Not a mixture of experts (the pooled aux is block.mlp's
       experts'); its name and everything else of the block are block's. */
    tpk_mlp_layer_desc mlp_2;
    bool (*mlp_2_at)(const void *user, int64_t layer);
    const void *mlp_2_user;
} tpk_lm_config;
/* The strings of a config (names) and mlp_2_user are read by tpk_lm_init only. */

typedef struct tpk_lm {
    tpk_lm_config c;     /* as built, defaults applied */
    tpk_embedding embed; /* the token embedding (and position table) */
    tpk_dropout drop;    /* on the embedding's output (dropout_sites) */
    tpk_block *blocks;   /* [L]; blocks lo .. hi - 1 built */
    tpk_norm norm;       /* the final norm */
    int head_w;          /* the head's weight id: the embedding's when tied */
    tpk_linear head;     /* a column linear over the vocabulary shard */
    tpk_xent ce;
    tpk_tensor logits; /* S(-1) [B S, Vp] of the last forward (its gradient after backward);
                               columns >= V padding (zero, not part of the softmax) */
    /* Optional: called by the backward each time the gradients of parameters first..last (ids)
     * are final for this backward — the untied head, the final norm, each block from the last,
     * then the embedding (its weight last: a tied head also feeds it) — so a trainer can start
     * their data-parallel reduction while the rest of the backward runs (tpk/train/dp.h). A
     * failing status stops the backward. */
    tpk_status (*grad_ready)(tpk_ctx *ctx, int first, int last, void *user);
    void *grad_ready_user;
    /* Optional: called around each use of a unit's weights (ZeRO-3, tpk/train/zero3.h): block i
     * (lo <= i < hi), or -1 for the rest (embedding, final norm, head), with `when` one of
     * TPK_LM_FWD_BEGIN, _FWD_END (block i's forward), _BWD_BEGIN, _BWD_END (its backward, a
     * full recompute's forward inside; _BWD_END after grad_ready). Unit -1's forward begins
     * before the embedding, its backward ends after the embedding's grad_ready. */
    tpk_status (*block_hook)(tpk_ctx *ctx, int64_t block, int when, void *user);
    void *block_hook_user;
    /* state */
    int64_t B, S; /* of the last forward */
    bool have_loss;
    tpk__stack_bufs rc; /* the stack's checkpoints (full recompute) and the pools blocks borrow
                               from */
    /* a mixture of experts (TPK_MLP_MOE blocks): the auxiliary loss pooled over the layers */
    float aux;          /* the last forward's: coef E sum_e C_e Q_e / N² (0 without MoE) */
    double aux_sum;     /* the aux of the forwards with loss = NULL since it was last read
                               (tpk_lm_aux_read): their deferred losses' share */
    double *aux_count;  /* host [E]: C_e of the last forward (NULL without MoE) */
    double *aux_dp;     /* host [E]: Q_e in the forward, the routers' gradient backward */
    double aux_g;       /* the loss's gradient with respect to m->aux (the backward's scale):
                               each router's z-loss, a term of it, takes it */
    int64_t aux_N;      /* N, the rows routed per choice over the layers */
    double aux_z;       /* the layers' z-losses summed */
    double *aux_before; /* host [2 E + 2]: the sums of the parts before (pipeline stages:
                               tpk__lm_aux_before), added to this part's; else zeros */
    int64_t moe_layers; /* the model's blocks whose MLP is the MoE (of all L, not only the
                               part's): the aux's layers */
    int64_t lo, hi;     /* the blocks built */
    bool has_embed, has_head;
} tpk_lm;

enum { TPK_LM_FWD_BEGIN = 0, TPK_LM_FWD_END, TPK_LM_BWD_BEGIN, TPK_LM_BWD_END };
/* m's block_hook, when set (else TPK_OK). */
static inline tpk_status tpk__lm_hook(tpk_ctx *ctx, const tpk_lm *m, int64_t i, int when) {
    return m->block_hook ? m->block_hook(ctx, i, when, m->block_hook_user) : TPK_OK;
}

/* ---- config checks --------------------------------------------------------------------------- */

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
/* A family's init's arguments (fn names the family's init): a context, a model, a config. */
static inline tpk_status tpk__lm_family_args(tpk_ctx *ctx, const char *fn, const void *m,
                                             const void *cfg) {
    if (!ctx) return TPK_ERR_ARG;
    if (!m) return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: NULL");
    if (!cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg: NULL");
    return TPK_OK;
}
static inline tpk_status tpk__lm_check_dropout(tpk_ctx *ctx, const char *fn, float p) {
    if (!(p >= 0.0f && p < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->dropout: expected 0 <= p < 1, got %g",
                         (double)p);
    return TPK_OK;
}

/* Whether block i's MLP is c->mlp_2 (the second kind of block), not c->block.mlp. */
static inline bool tpk__lm_mlp_2(const tpk_lm_config *c, int64_t i) {
    return c->mlp_2_at && c->mlp_2_at(c->mlp_2_user, i);
}

/* ---- init, destroy --------------------------------------------------------------------------- */

static inline void tpk_lm_destroy(tpk_ctx *ctx, tpk_lm *m);

/* Build the model: its parameters registered in order — the embedding (and position table), the
 * L blocks, the final norm, the untied head's weight — then the head, the dropout and the loss.
 * Collective over nothing (every rank builds its shards). */
static inline tpk_status tpk_lm_init(tpk_ctx *ctx, tpk_lm *m, const tpk_lm_config *cfg) {
    static const char *fn = "tpk_lm_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!m) return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: NULL");
    if (!cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg: NULL");
    memset(m, 0, sizeof *m);
    tpk_lm_config c = *cfg;
    int64_t heads = c.block.attn.kind == TPK_ATTN_USER ? 1 : c.block.heads;
    TPK_TRY(tpk__lm_check_shape(ctx, fn, c.layers, c.positions, c.hidden, heads));
    if (c.vocab < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->vocab: expected >= 1, got %lld",
                         (long long)c.vocab);
    TPK_TRY(tpk__lm_check_recompute(ctx, fn, c.recompute));
    if (!c.dropout_sites && c.block.dropout != 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->block.dropout: the model has no dropout sites (cfg->dropout_sites "
                         "false), expected 0, got %g",
                         (double)c.block.dropout);
    if (c.mlp_2_at && c.mlp_2.kind == TPK_MLP_MOE)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->mlp_2.kind: TPK_MLP_MOE, expected another MLP (a mixture of experts "
                         "is cfg->block.mlp's)");
    if (c.init_std <= 0) c.init_std = 0.02f;
    if (c.block.init_std <= 0) c.block.init_std = c.init_std;
    if (!c.block.name) c.block.name = "layers";
    if (!c.final_norm.name) c.final_norm.name = "norm";
    if (!c.embed_name) c.embed_name = "embed.weight";
    if (!c.head_name) c.head_name = "lm_head.weight";
    c.block.sequence_parallel = c.sequence_parallel, c.block.cp_comm = c.cp_comm;
    m->c = c;
    const tpk_lm_part *part = &c.part;
    bool sp = c.sequence_parallel;
    m->lo = part->lo, m->hi = part->hi ? part->hi : c.layers;
    m->has_embed = !part->no_embed, m->has_head = !part->no_head;
    if (m->lo < 0 || m->hi <= m->lo || m->hi > c.layers)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->part: blocks %lld .. %lld, expected 0 <= lo < hi <= layers = %lld",
                         (long long)part->lo, (long long)m->hi - 1, (long long)c.layers);
    tpk_status s = TPK_OK;
    tpk_embedding_desc ed;
    memset(&ed, 0, sizeof ed);
    ed.wte_name = c.embed_name, ed.wpe_name = c.pos_name, ed.sequence_parallel = sp,
    ed.init_std = c.init_std;
    ed.vocab_multiple = c.vocab_multiple == 0 ? 64 : c.vocab_multiple < 0 ? 0 : c.vocab_multiple;
    /* without the embedding: its weight alone for a tied head, else only its sizes (Vp) */
    if (m->has_embed || (m->has_head && c.tie_embeddings))
        s = tpk_embedding_init(ctx, &m->embed, c.vocab,
                               c.pos_name && m->has_embed ? c.positions : 0, c.hidden, &ed);
    else
        m->embed.V = c.vocab, m->embed.H = c.hidden, m->embed.wte = m->embed.wpe = -1,
        m->embed.Vp = tpk_vocab_padded(c.vocab, ed.vocab_multiple, ctx->tp.size);
    if (s == TPK_OK) s = tpk__stack_bufs_init(ctx, fn, &m->rc, c.layers);
    if (s == TPK_OK) {
        m->blocks = (tpk_block *)tpk__calloc(ctx, (size_t)c.layers, sizeof *m->blocks);
        if (!m->blocks) s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%lld blocks", (long long)c.layers);
    }
    for (int64_t i = 0; c.block.mlp.kind == TPK_MLP_MOE && i < c.layers; i++)
        m->moe_layers += !tpk__lm_mlp_2(&c, i); /* every block's, built here or not */
    for (int64_t i = m->lo; s == TPK_OK && i < m->hi; i++) {
        char n[96];
        snprintf(n, sizeof n, "%s.%lld", c.block.name, (long long)i);
        tpk_block_desc bd = c.block;
        bd.name = n;
        if (tpk__lm_mlp_2(&c, i)) bd.mlp = c.mlp_2; /* the second kind of block */
        s = tpk_block_init(ctx, &m->blocks[i], c.hidden, &bd);
    }
    /* the aux pooled over the MoE layers (the arrays on every part, even one without such a
       block: the pipeline's messages carry the sums through it) */
    if (s == TPK_OK && c.block.mlp.kind == TPK_MLP_MOE) {
        size_t E = (size_t)c.block.mlp.moe.experts;
        m->aux_count = s == TPK_OK ? (double *)tpk__calloc(ctx, E, sizeof(double)) : NULL;
        m->aux_dp = s == TPK_OK ? (double *)tpk__calloc(ctx, E, sizeof(double)) : NULL;
        m->aux_before = /* and the CP group's scratch after it */
            s == TPK_OK ? (double *)tpk__calloc(ctx, 4 * E + 4, sizeof(double)) : NULL;
        if (s == TPK_OK && (!m->aux_count || !m->aux_dp || !m->aux_before))
            s = tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%zu experts' counts", E);
        for (int64_t i = m->lo; s == TPK_OK && i < m->hi; i++)
            if (m->blocks[i].mlp.kind == TPK_MLP_MOE)
                m->blocks[i].mlp.u.moe.aux_dp = m->aux_dp, m->blocks[i].mlp.u.moe.aux_g = &m->aux_g;
    }
    if (s == TPK_OK && c.dropout_sites && m->has_embed) {
        tpk_dropout_desc dd;
        memset(&dd, 0, sizeof dd);
        dd.name = "drop", dd.p = c.block.dropout;
        s = tpk_dropout_init(ctx, &m->drop, &dd);
    }
    if (s == TPK_OK && m->has_head) {
        s = tpk_norm_init(ctx, &m->norm, c.hidden, c.final_norm.name, &c.final_norm, sp, false);
        m->head_w = m->embed.wte;
        if (s == TPK_OK && !c.tie_embeddings) { /* the untied head: its own [V, H] weight,
                                                   vocabulary rows padded like the embedding's */
            tpk_param_desc pd;
            memset(&pd, 0, sizeof pd);
            pd.name = c.head_name, pd.ndim = 2, pd.shape[0] = c.vocab, pd.shape[1] = c.hidden;
            pd.layout = tpk_tp_vocab_layout(ctx, m->embed.Vp, 0);
            pd.init = TPK_INIT_NORMAL, pd.std = c.init_std, pd.decay = true,
            pd.padded_rows = m->embed.Vp;
            s = tpk_param_add(ctx, &pd, &m->head_w);
        }
        if (s == TPK_OK) { /* the LM head: a column linear over the vocabulary shard */
            tpk_linear_desc hd;
            memset(&hd, 0, sizeof hd);
            hd.name = "lm_head", hd.weight = m->head_w + 1, hd.sequence_parallel = sp,
            hd.unit = tpk_tp_vocab_unit(ctx, m->embed.Vp);
            s = tpk_col_linear_init(ctx, &m->head, c.hidden, m->embed.Vp, &hd);
        }
        if (s == TPK_OK) {
            tpk_xent_desc xd;
            memset(&xd, 0, sizeof xd);
            xd.label_smoothing = c.label_smoothing, xd.padded_vocab = m->embed.Vp;
            s = tpk_xent_init(ctx, &m->ce, c.vocab, &xd);
        }
    }
    if (s != TPK_OK) tpk_lm_destroy(ctx, m);
    return s;
}

/* Frees what init made (the parameters stay in the context). */
static inline void tpk_lm_destroy(tpk_ctx *ctx, tpk_lm *m) {
    if (!m) return;
    tpk_embedding_destroy(ctx, &m->embed);
    for (int64_t i = m->lo; m->blocks && i < m->hi; i++) tpk_block_destroy(ctx, &m->blocks[i]);
    tpk__free(ctx, m->blocks), m->blocks = NULL;
    tpk__free(ctx, m->aux_count), tpk__free(ctx, m->aux_dp), tpk__free(ctx, m->aux_before);
    tpk__stack_bufs_free(ctx, &m->rc, m->c.layers);
    if (m->has_head)
        tpk_norm_destroy(ctx, &m->norm), tpk_linear_destroy(ctx, &m->head),
            tpk_xent_destroy(ctx, &m->ce);
    tpk_dropout_destroy(ctx, &m->drop);
    memset(m, 0, sizeof *m);
}

/* ---- the stack of blocks (tpk/layers/recompute.h) -------------------------------------------- */

/* Swap block i's buffers of the recompute sets in `mask` with the pools (twice: lent, then
 * returned). Views the block keeps into them stay pointing at the pool's memory, which the next
 * block overwrites: what the backward reads of it is remade first (recompute, or full's forward
 * again). */
static inline void tpk__lm_lend(tpk_lm *m, int64_t i, int mask) {
    for (int k = 0; k < TPK__SETS; k++) {
        tpk_buf *bufs[TPK__SET_MAX];
        int n = mask & (1 << k) ? tpk_block_bufs(&m->blocks[i], 1 << k, bufs) : 0;
        for (int j = 0; j < n && j < TPK__SET_MAX; j++) {
            tpk_buf t = *bufs[j];
            *bufs[j] = m->rc.pool[k][j], m->rc.pool[k][j] = t;
        }
    }
}

/* x through blocks lo .. hi - 1 (recompute: their inputs only, or their GEMM outputs only, kept) */
static inline tpk_status tpk__lm_stack_forward(tpk_ctx *ctx, tpk_lm *m, tpk_tensor x,
                                               tpk_tensor *y) {
    tpk_recompute mode = m->c.recompute;
    int sets = tpk__stack_sets(mode, false);
    bool full = mode == TPK_RECOMPUTE_FULL;
    for (int64_t i = m->lo; i < m->hi; i++) {
        int64_t k = i - m->lo;
        /* later inputs are kept as outputs */
        if (full && !k) TPK_TRY(tpk__stack_keep(ctx, &m->rc.ckpt[0], x, &x));
        TPK_TRY(tpk__lm_hook(ctx, m, i, TPK_LM_FWD_BEGIN));
        tpk__lm_lend(m, i, sets);
        tpk_status s = tpk_block_forward(ctx, &m->blocks[i], x, m->B, m->S, &x);
        if (s == TPK_OK && full) s = tpk__stack_keep(ctx, &m->rc.ckpt[k + 1], x, &x);
        tpk__lm_lend(m, i, sets); /* returned, also on failure */
        TPK_TRY(s);
        TPK_TRY(tpk__lm_hook(ctx, m, i, TPK_LM_FWD_END));
    }
    *y = x;
    return TPK_OK;
}

/* g: the gradient of the stack's output, whose buffer the stack takes over (each block's input
 * gradient comes back in it); *dx: of the stack's input. After block i's backward its gradients
 * are final: the grad_ready hook. */
static inline tpk_status tpk__lm_stack_backward(tpk_ctx *ctx, tpk_lm *m, tpk_tensor g,
                                                tpk_tensor *dx) {
    tpk_recompute mode = m->c.recompute;
    int sets = tpk__stack_sets(mode, true);
    for (int64_t i = m->hi - 1; i >= m->lo; i--) {
        tpk_block *b = &m->blocks[i];
        TPK_TRY(tpk__lm_hook(ctx, m, i, TPK_LM_BWD_BEGIN));
        tpk__lm_lend(m, i, sets);
        tpk_status s = TPK_OK;
        if (mode == TPK_RECOMPUTE_FULL) {
            tpk_tensor x = g, y;
            x.data = m->rc.ckpt[i - m->lo].p; /* block i's input: the hidden states' shape */
            s = tpk_block_forward(ctx, b, x, m->B, m->S, &y); /* the same forward again */
        } else if (mode == TPK_RECOMPUTE_SELECTIVE) {
            s = tpk_block_recompute(ctx, b); /* the lent buffers' contents again */
        }
        tpk_tensor gin = g;
        if (s == TPK_OK) s = tpk__block_backward(ctx, "tpk_lm_backward", b, g, &g, true);
        if (s == TPK_OK && g.data != gin.data) s = tpk__stack_keep(ctx, &m->rc.grad, g, &g);
        tpk__lm_lend(m, i, sets);
        TPK_TRY(s);
        if (m->grad_ready) TPK_TRY(m->grad_ready(ctx, b->p0, b->p1, m->grad_ready_user));
        TPK_TRY(tpk__lm_hook(ctx, m, i, TPK_LM_BWD_END));
    }
    *dx = g;
    return TPK_OK;
}

/* The pooled aux of the last forward (the header's): m->aux, m->aux_count (C_e), m->aux_N; on a
 * pipeline stage's part the sums over the blocks of the parts before (m->aux_before, set by
 * tpk__lm_aux_before) and this one's, added in the order of the blocks (the bits of the whole
 * model's), so the last part's are the whole model's. */
static inline tpk_status tpk__lm_moe_aux(tpk_ctx *ctx, tpk_lm *m) {
    if (!m->aux_count) return TPK_OK;
    const tpk_moe_desc *d = &m->c.block.mlp.moe;
    int64_t E = d->experts, N = (int64_t)m->aux_before[0];
    double z = m->aux_before[1]; /* the layers' z-losses, summed */
    int c = tpk_cp_size(ctx);
    if (c > 1) { /* this part's sums over the CP group (its rows: the sequences' other chunks) */
        double *own = m->aux_before + 2 * E + 2; /* [2 E + 2] scratch */
        for (int64_t k = 0; k < 2 * E + 2; k++) own[k] = 0;
        for (int64_t i = m->lo; i < m->hi; i++) {
            if (m->blocks[i].mlp.kind != TPK_MLP_MOE) continue; /* a dense block: no routing */
            const tpk_router *r = &m->blocks[i].mlp.u.moe.router;
            for (int64_t e = 0; e < E; e++)
                own[2 + e] += (double)r->count[e], own[2 + E + e] += r->psum[e];
            own[0] += (double)r->T, own[1] += r->zloss / c; /* each a mean over T / c tokens */
        }
        TPK_TRY(tpk_allreduce_host(ctx, &ctx->cp, own, (size_t)(2 * E + 2), TPK_F64, TPK_SUM));
        N += (int64_t)own[0], z += own[1];
        for (int64_t e = 0; e < E; e++)
            m->aux_count[e] = m->aux_before[2 + e] + own[2 + e],
            m->aux_dp[e] = m->aux_before[2 + E + e] + own[2 + E + e];
    } else {
        for (int64_t e = 0; e < E; e++)
            m->aux_count[e] = m->aux_before[2 + e], m->aux_dp[e] = m->aux_before[2 + E + e];
        for (int64_t i = m->lo; i < m->hi; i++) {
            if (m->blocks[i].mlp.kind != TPK_MLP_MOE) continue;
            const tpk_router *r = &m->blocks[i].mlp.u.moe.router;
            for (int64_t e = 0; e < E; e++)
                m->aux_count[e] += (double)r->count[e], m->aux_dp[e] += r->psum[e];
            N += r->T, z += r->zloss;
        }
    }
    double b = 0;
    for (int64_t e = 0; e < E; e++) b += m->aux_count[e] * m->aux_dp[e];
    m->aux_N = N, m->aux_z = z;
    m->aux = (float)((N ? (double)d->aux_coef * (double)E * b / ((double)N * (double)N) : 0) + z);
    return TPK_OK;
}

/* The pooled aux's sums a pipeline stage hands on (tpk/train/pipe_model.h): 2 E + 2 numbers, 0
 * without experts. Forward, the sums over the blocks up to this part's end: out = N, the z-losses,
 * C_0 .. C_E-1, Q_0 .. Q_E-1 (tpk__lm_aux_sums after tpk_lm_stage_forward), which the next part
 * takes before its forward (tpk__lm_aux_before; in = NULL: zeros, the first part's). Backward, the
 * whole model's N and C_e, which the gradient on every p_te needs (coef E C_e / N²): the last
 * part has them after its forward; the others take them before their backward (tpk__lm_aux_totals,
 * the same layout, Q_e and the z-losses not read) and hand them on (tpk__lm_aux_sums again). */
static inline int64_t tpk__lm_aux_len(const tpk_lm *m) {
    return m && m->aux_count ? 2 * m->c.block.mlp.moe.experts + 2 : 0;
}
static inline void tpk__lm_aux_sums(const tpk_lm *m, double *out) {
    int64_t E = m->c.block.mlp.moe.experts;
    if (!m->aux_count) return;
    out[0] = (double)m->aux_N, out[1] = m->aux_z;
    for (int64_t e = 0; e < E; e++) out[2 + e] = m->aux_count[e], out[2 + E + e] = m->aux_dp[e];
}
static inline void tpk__lm_aux_before(tpk_lm *m, const double *in) {
    int64_t n = tpk__lm_aux_len(m);
    for (int64_t i = 0; i < n; i++) m->aux_before[i] = in ? in[i] : 0;
}
static inline void tpk__lm_aux_totals(tpk_lm *m, const double *in) {
    int64_t E = m->c.block.mlp.moe.experts;
    if (!m->aux_count) return;
    m->aux_N = (int64_t)in[0];
    for (int64_t e = 0; e < E; e++) m->aux_count[e] = in[2 + e];
}

/* The aux of the forwards with loss = NULL since the last read (their deferred losses' share of
 * the loss, beside tpk_xent_loss_read's cross-entropy), and the sum starts again. */
static inline double tpk_lm_aux_read(tpk_lm *m) {
    double a = m ? m->aux_sum : 0;
    if (m) m->aux_sum = 0;
    return a;
}

/* ---- forward, backward ----------------------------------------------------------------------- */

static inline tpk_status tpk__lm_args(tpk_ctx *ctx, const char *fn, const tpk_lm *m) {
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !m->blocks)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: expected an initialised model");
    return TPK_OK;
}

/* The forward of the part built (cfg.part: a pipeline stage's): from ids (the embedding), or from
 * x_in, the hidden states of the part before ([B S, H] R, or S(0) under sequence parallelism, in
 * backend memory, unchanged until the backward); through its blocks; then the head and loss
 * (tpk_lm_forward says what targets and loss mean), or *y = the last block's output for the part
 * after. */
static inline tpk_status tpk_lm_stage_forward(tpk_ctx *ctx, tpk_lm *m, const int32_t *ids,
                                              const void *x_in, const int32_t *targets, int64_t B,
                                              int64_t S, float *loss, tpk_tensor *y) {
    static const char *fn = "tpk_lm_stage_forward";
    TPK_TRY(tpk__lm_args(ctx, fn, m));
    if (m->has_head)
        TPK_TRY(tpk_xent_settle(ctx, &m->ce)); /* a deferred loss, before its logits
                                                               are overwritten */
    m->have_loss = false;
    TPK_TRY(tpk__cp_layer_seq(ctx, fn, S)); /* under CP: S a multiple of 2c */
    TPK_TRY(tpk__lm_hook(ctx, m, -1, TPK_LM_FWD_BEGIN));
    tpk_tensor x;
    if (m->has_embed) {
        if (S > m->c.positions && !m->c.pos_name)
            return tpk__fail(ctx, TPK_ERR_SHAPE, fn,
                             "S: expected at most cfg->positions = %lld, got %lld",
                             (long long)m->c.positions, (long long)S);
        TPK_TRY(tpk_embedding_forward(ctx, &m->embed, ids, B, S, &x)); /* checks ids, B, S */
        /* in place: the embedding does not keep its output (under CP each row's mask at its
           sequence position) */
        tpk_dropout_set_seq(&m->drop, S);
        if (m->c.dropout_sites) TPK_TRY(tpk_dropout_forward(ctx, &m->drop, &x));
    } else {
        if (B < 0 || S < 0 || !x_in)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "x: expected the hidden states from the stage before (B, S >= 0), "
                             "got %s with B = %lld, S = %lld",
                             x_in ? "data" : "NULL", (long long)B, (long long)S);
        x = tpk_cp_tensor_2d(ctx, (void *)x_in, ctx->dtype, B, S, m->c.hidden,
                             m->c.sequence_parallel ? TPK_S(0) : TPK_R); /* CP rows at c > 1 */
    }
    m->B = B, m->S = S;
    TPK_TRY(tpk__lm_stack_forward(ctx, m, x, &x));
    TPK_TRY(tpk__lm_moe_aux(ctx, m));
    TPK_TRY(tpk__lm_hook(ctx, m, -1, TPK_LM_FWD_END)); /* (the head's run below, within it) */
    if (!m->has_head) {
        if (!y) return tpk__fail(ctx, TPK_ERR_ARG, fn, "y: NULL (this part has no head)");
        *y = x;
        return TPK_OK;
    }
    TPK_TRY(tpk_norm_forward(ctx, &m->norm, x, &x));
    TPK_TRY(tpk_col_linear_forward(ctx, &m->head, x, &m->logits)); /* S(-1) [T, Vp_r] */
    if (!targets) return TPK_OK;
    /* loss = NULL: the loss is computed with its gradient by the backward (fused), or settled by
     * the next forward or read */
    TPK_TRY(loss ? tpk_xent_forward(ctx, &m->ce, m->logits, targets, loss)
                 : tpk_xent_forward_deferred(ctx, &m->ce, m->logits, targets));
    if (loss) *loss += m->aux; /* a mixture of experts' load-balancing loss (0 without) */
    else m->aux_sum += m->aux;
    m->have_loss = true;
    return TPK_OK;
}

/* The model's forward for B sequences of S tokens (S <= cfg.positions): ids [B S] and targets
 * [B S] in host memory (the same on every TP rank; a target may be the ignore index -100; under
 * context parallelism this CP rank's [B S / c] rows, and the mean is over every CP rank's).
 * *loss = the mean cross-entropy over the counted positions (a download: the host waits);
 * loss = NULL keeps it in backend memory, added to the running sum tpk_xent_loss_read(ctx,
 * &m->ce, ...) reads, and defers it: the backward computes it with the logits' gradient in one
 * pass (tpk/layers/xent.h, fused), or the next forward or read alone. targets = NULL only computes
 * m->logits (S(-1) [B S, Vp_r]); loss is then not touched. */
static inline tpk_status tpk_lm_forward(tpk_ctx *ctx, tpk_lm *m, const int32_t *ids,
                                        const int32_t *targets, int64_t B, int64_t S, float *loss) {
    TPK_TRY(tpk__lm_args(ctx, "tpk_lm_forward", m));
    if (!m->has_embed || !m->has_head)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_lm_forward",
                         "model: built as a pipeline stage's part (cfg->part): use "
                         "tpk_lm_stage_forward");
    return tpk_lm_stage_forward(ctx, m, ids, NULL, targets, B, S, loss, NULL);
}

/* The backward of the part built: from the loss of the last forward, or from dy_in, the gradient
 * of the part's output (the hidden states' layout; its buffer is taken over: it receives the
 * gradients between blocks); accumulates the gradients of scale * (the loss) into the flat
 * gradient buffer (tpk_params_zero_grad first); then the embedding's, or *dx = the gradient of the
 * part's input for the part before (valid until the next backward). */
static inline tpk_status tpk_lm_stage_backward(tpk_ctx *ctx, tpk_lm *m, float scale, void *dy_in,
                                               tpk_tensor *dx) {
    static const char *fn = "tpk_lm_stage_backward";
    TPK_TRY(tpk__lm_args(ctx, fn, m));
    tpk_tensor g;
    int a, b, w = m->embed.wte;
    TPK_TRY(tpk__lm_hook(ctx, m, -1, TPK_LM_BWD_BEGIN));
    if (m->has_head) {
        if (!m->have_loss)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "model: backward needs a forward with targets first");
        m->have_loss = false; /* the logits are overwritten by their gradient */
        TPK_TRY(tpk_xent_backward(ctx, &m->ce, scale, &g));
        TPK_TRY(tpk_col_linear_backward(ctx, &m->head, g, &g)); /* tied: into the embedding's
                                                                  gradient */
        /* the untied head's weight, or the tied one's copy on a stage without the embedding */
        if (m->grad_ready && (m->head_w != w || !m->has_embed))
            TPK_TRY(m->grad_ready(ctx, m->head_w, m->head_w, m->grad_ready_user));
        TPK_TRY(tpk_norm_backward(ctx, &m->norm, g, &g));
        tpk_norm_params(&m->norm, &a, &b);
        if (m->grad_ready) TPK_TRY(m->grad_ready(ctx, a, b, m->grad_ready_user));
    } else {
        if (!dy_in)
            return tpk__fail(ctx, TPK_ERR_ARG, fn,
                             "dy: expected the gradient from the stage after, got NULL");
        if (!m->B && !m->S)
            return tpk__fail(ctx, TPK_ERR_ARG, fn, "model: backward needs a forward first");
        g = tpk_cp_tensor_2d(ctx, dy_in, ctx->dtype, m->B, m->S, m->c.hidden,
                             m->c.sequence_parallel ? TPK_S(0) : TPK_R); /* CP rows at c > 1 */
    }
    if (m->aux_count) { /* the pooled aux's gradient on every p_te: scale coef E C_e / N² */
        double N = (double)m->aux_N, E = (double)m->c.block.mlp.moe.experts;
        double k = N ? (double)scale * (double)m->c.block.mlp.moe.aux_coef * E / (N * N) : 0;
        for (int64_t e = 0; e < m->c.block.mlp.moe.experts; e++) m->aux_dp[e] = k * m->aux_count[e];
        m->aux_g = (double)scale / tpk_cp_size(ctx); /* the z-losses: means over c T tokens */
    }
    /* each block from the last (recompute: its forward, or its cheap parts, again first) */
    TPK_TRY(tpk__lm_stack_backward(ctx, m, g, &g));
    if (!m->has_embed) {
        if (!dx) return tpk__fail(ctx, TPK_ERR_ARG, fn, "dx: NULL (this part has no embedding)");
        *dx = g;
        return tpk__lm_hook(ctx, m, -1, TPK_LM_BWD_END);
    }
    /* g: block lo's input gradient, used only here */
    if (m->c.dropout_sites) TPK_TRY(tpk_dropout_backward_inplace(ctx, &m->drop, &g));
    TPK_TRY(tpk_embedding_backward(ctx, &m->embed, g));
    if (m->grad_ready) {
        int q = m->embed.wpe >= 0 ? m->embed.wpe : w;
        TPK_TRY(m->grad_ready(ctx, w < q ? w : q, w < q ? q : w,
                              m->grad_ready_user)); /* tied: the head's too */
    }
    return tpk__lm_hook(ctx, m, -1, TPK_LM_BWD_END);
}

/* Accumulates the gradients of scale * (the last forward's loss) into the flat gradient buffer
 * (tpk_params_zero_grad first). */
static inline tpk_status tpk_lm_backward(tpk_ctx *ctx, tpk_lm *m, float scale) {
    TPK_TRY(tpk__lm_args(ctx, "tpk_lm_backward", m));
    if (!m->has_embed || !m->has_head)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_lm_backward",
                         "model: built as a pipeline stage's part (cfg->part): use "
                         "tpk_lm_stage_backward");
    return tpk_lm_stage_backward(ctx, m, scale, NULL, NULL);
}

/* The data-parallel hook (tpk/train/dp.h: tpk_dp_grad_ready, user the buckets). */
static inline void tpk_lm_set_grad_ready(tpk_lm *m, tpk_status (*fn)(tpk_ctx *, int, int, void *),
                                         void *user) {
    m->grad_ready = fn, m->grad_ready_user = user;
}

/* Every dropout probability: the embedding's and each block's (0 for evaluation and sampling). A
 * model without dropout sites (cfg.dropout_sites false: Llama) takes only p = 0. */
static inline tpk_status tpk_lm_set_dropout(tpk_ctx *ctx, tpk_lm *m, float p) {
    static const char *fn = "tpk_lm_set_dropout";
    TPK_TRY(tpk__lm_args(ctx, fn, m));
    if (!m->c.dropout_sites && p != 0)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                         "p: the model has no dropout (cfg.dropout_sites false), expected 0, "
                         "got %g",
                         (double)p);
    if (!(p >= 0.0f && p < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "p: expected 0 <= p < 1, got %g", (double)p);
    m->c.block.dropout = p, m->drop.p = p;
    for (int64_t i = m->lo; i < m->hi; i++) tpk_block_set_dropout(&m->blocks[i], p);
    return TPK_OK;
}

/* Block i's buffers of one recompute set (the tests check the pools hold them). */
static inline int tpk_lm_block_bufs(tpk_lm *m, int64_t i, int set, tpk_buf **o) {
    return tpk_block_bufs(&m->blocks[i], set, o);
}

/* ---- sampling (tpk/models/sample.h) ---------------------------------------------------------- */

/* The logits of one sequence of S tokens: S(-1) [S, Vp_r], *row = S - 1. Under context
 * parallelism (c > 1) the sequence padded at its end to Sp, a multiple of 2c (the padding's ids 0:
 * under the causal mask no logit before it changes), runs split over ctx->cp: z [Sp / c, Vp_r]
 * holds this CP rank's rows, *row the local row of position S - 1 on the CP rank that holds it
 * (tpk_cp_position's inverse), -1 on the others. Collective over TP (and CP). */
static inline tpk_status tpk__lm_logits(tpk_ctx *ctx, void *mv, const int32_t *ids, int64_t S,
                                        tpk_tensor *z, int64_t *row) {
    tpk_lm *m = (tpk_lm *)mv;
    int c = tpk_cp_size(ctx);
    if (c == 1) {
        TPK_TRY(tpk_lm_forward(ctx, m, ids, NULL, 1, S, NULL));
        *z = m->logits, *row = S - 1;
        return TPK_OK;
    }
    int64_t Sp = (S + 2 * c - 1) / (2 * c) * (2 * c), Sc = Sp / (2 * c), k = (S - 1) / Sc;
    int32_t *whole = (int32_t *)tpk__calloc(ctx, (size_t)(Sp + Sp / c), sizeof(int32_t));
    if (!whole) return tpk__fail(ctx, TPK_ERR_NOMEM, "tpk_lm_generate", "%lld ids", (long long)Sp);
    memcpy(whole, ids, sizeof(int32_t) * (size_t)S);
    tpk_status s = tpk_cp_scatter_host(ctx, whole + Sp, whole, 1, Sp, sizeof(int32_t));
    if (s == TPK_OK) s = tpk_lm_forward(ctx, m, whole + Sp, NULL, 1, Sp, NULL);
    tpk__free(ctx, whole);
    TPK_TRY(s);
    int holder = k < c ? (int)k : 2 * c - 1 - (int)k; /* chunk k: rank k, or 2c - 1 - k */
    *z = m->logits;
    *row = holder == ctx->cp.rank ? (k < c ? 0 : Sc) + (S - 1) % Sc : -1;
    return TPK_OK;
}

/* Under context parallelism each window is padded to a multiple of 2c (tpk__lm_logits): the
 * longest, min(n_prompt + n - 1, positions) tokens, must still fit the model's positions. */
static inline tpk_status tpk__lm_generate_cp(tpk_ctx *ctx, const char *fn, const tpk_lm *m,
                                             int n_prompt, int n) {
    int c = tpk_cp_size(ctx);
    int64_t len = (int64_t)n_prompt + n - 1, w = len < m->c.positions ? len : m->c.positions;
    int64_t wp = (w + 2 * c - 1) / (2 * c) * (2 * c);
    if (c == 1 || n < 1 || n_prompt < 1 || wp <= m->c.positions) return TPK_OK;
    return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, fn,
                     "n: under context parallelism a window is padded to a multiple of 2 x cp = "
                     "%d; the window of %lld tokens pads to %lld, past the model's %lld positions "
                     "(not a multiple of %d): expected n_prompt + n - 1 <= %lld, got %lld",
                     2 * c, (long long)w, (long long)wp, (long long)m->c.positions, 2 * c,
                     (long long)(m->c.positions / (2 * c) * (2 * c)), (long long)len);
}

/* out[0..n_prompt) = prompt (n_prompt >= 1 token ids below the vocabulary), then n tokens sampled
 * one after another under opts (tpk_sample_opts: temperature, 0 greedy; top_k, 0 off; top_p, 1
 * off; NULL: tpk_sample_defaults()), each from the logits of the last `positions` tokens; draw i
 * (of seed) gives out[n_prompt + i], the same on every rank. Set dropout to 0 first. Collective
 * over TP, and under context parallelism over CP (each window split over ctx->cp, tpk__lm_logits;
 * positions past the last multiple of 2c refused by name when a window would need them). */
static inline tpk_status tpk_lm_generate(tpk_ctx *ctx, tpk_lm *m, const int32_t *prompt,
                                         int n_prompt, int n, const tpk_sample_opts *opts,
                                         uint64_t seed, int32_t *out) {
    static const char *fn = "tpk_lm_generate";
    TPK_TRY(tpk__lm_args(ctx, fn, m));
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    TPK_TRY(tpk__lm_generate_cp(ctx, fn, m, n_prompt, n));
    return tpk__generate_run(ctx, fn, m, tpk__lm_logits, m->c.vocab, m->c.positions, prompt,
                             n_prompt, n, opts, seed, out);
}
/* The same from a 1-token prompt, out[0] = start, at a temperature alone (no filter):
 * out[1..n]. */
static inline tpk_status tpk_lm_sample(tpk_ctx *ctx, tpk_lm *m, int32_t start, int n,
                                       float temperature, uint64_t seed, int32_t *out) {
    static const char *fn = "tpk_lm_sample";
    TPK_TRY(tpk__lm_args(ctx, fn, m));
    if (!out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "out: NULL");
    if (n < 0) return tpk__fail(ctx, TPK_ERR_ARG, fn, "n: expected >= 0, got %d", n);
    if (start < 0 || start >= m->c.vocab)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "start: expected a token id in 0..%lld, got %d",
                         (long long)m->c.vocab - 1, start);
    tpk_sample_opts o = tpk_sample_defaults();
    o.temperature = temperature;
    TPK_TRY(tpk__sample_opts_check(ctx, fn, "", &o));
    TPK_TRY(tpk__lm_generate_cp(ctx, fn, m, 1, n));
    return tpk__generate_run(ctx, fn, m, tpk__lm_logits, m->c.vocab, m->c.positions, &start, 1, n,
                             &o, seed, out);
}

#endif /* TPK_LM_H */
