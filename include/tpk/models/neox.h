/* tpk/models/neox.h — the GPT-NeoX (Pythia) block and model, tensor-parallel, with optional
 * sequence parallelism.
 *
 * Block (parallel residual), hidden states x R [T, H] (S(0) under sequence parallelism):
 *   y = x + drop(attn(input_layernorm(x))) + drop(mlp(post_attention_layernorm(x)))
 *     attn: one fused column linear query_key_value whose rows are per head [q_h; k_h; v_h]
 *           (unit 3 D), packed into [Q | K | V] with the first rotary_dim = rotary_pct D of each
 *           head of Q and K rotated (rotate-half, base rotary_emb_base), causal attention, the
 *           row linear dense (tpk/layers/attn.h, qkv_per_head and rotary_dim)
 *     mlp:  dense_h_to_4h column, GELU (exact; or its tanh form), dense_4h_to_h row
 *           (tpk/layers/mlp.h)
 *   backward: dx = dy + ln_2'(mlp'(drop(dy))) + ln_1'(attn'(drop(dy))) (the skeleton's block
 *   backward with the parallel residual, tpk/models/lm.h). Collectives as GPT-2's block.
 * Model: ids -> embed_in (vocabulary-parallel, no position table) -> drop -> L blocks ->
 *   final_layer_norm -> logits = h embed_outᵀ (a column linear over its own vocabulary shard,
 *   untied) S(-1) [T, Vp] -> vocabulary-parallel cross-entropy: the skeleton of tpk/models/lm.h;
 *   this file holds the block's parts, init and forward, the config and the names.
 * Parameter names are Hugging Face GPTNeoXForCausalLM's, all [out, in]: gpt_neox.embed_in.weight,
 * gpt_neox.layers.<i>.{input_layernorm,post_attention_layernorm}.{weight,bias},
 * gpt_neox.layers.<i>.attention.{query_key_value,dense}.{weight,bias},
 * gpt_neox.layers.<i>.mlp.{dense_h_to_4h,dense_4h_to_h}.{weight,bias},
 * gpt_neox.final_layer_norm.{weight,bias}, embed_out.weight. The activation is the exact GELU
 * (Pythia's "gelu"), or its tanh form (cfg.act = TPK_ACT_GELU_TANH: Hugging Face's "gelu_new"). */
#ifndef TPK_NEOX_H
#define TPK_NEOX_H

#include "../layers/attn.h"
#include "../layers/mlp.h"
#include "../layers/norm.h"
#include "lm.h"
#include "sample.h"

/* ---- block ----------------------------------------------------------------------------------- */

typedef struct tpk_neox_block_desc {
    const char *name;      /* default "layer<N>": parameters "<name>.input_layernorm.weight", ... */
    int64_t heads;         /* A (required) */
    int64_t ffn;           /* the MLP's intermediate size; 0 = 4 H */
    int64_t rotary_dim;    /* rotated dimensions of each head (even, <= H / A) */
    float rope_theta;      /* 0 = 10000 */
    float ln_eps;          /* 0 = 1e-5 */
    float dropout;         /* attention probabilities and both branches */
    tpk_act act;           /* the MLP's; 0 (TPK_ACT_NONE) = TPK_ACT_GELU, the exact GELU */
    bool sequence_parallel;
    float init_std;        /* every weight N(0, std^2); default 0.02 */
} tpk_neox_block_desc;

typedef struct tpk_neox_block {
    char name[80];
    int64_t H;
    tpk_layernorm ln_1, ln_2;  /* input_layernorm, post_attention_layernorm: both read x */
    tpk_attention attn;
    tpk_mlp mlp;
    tpk_residual res_1, res_2; /* x1 = x + drop(attn), y = x1 + drop(mlp) */
    int p0, p1;                /* its parameters are ids p0..p1 */
} tpk_neox_block;

static inline tpk_status tpk_neox_block_init(tpk_ctx *ctx, tpk_neox_block *b, int64_t H,
                                             const tpk_neox_block_desc *desc) {
    static const char *fn = "tpk_neox_block_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    if (!desc) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc: NULL (desc->heads is required)");
    memset(b, 0, sizeof *b);
    tpk_neox_block_desc d = *desc;
    TPK_TRY(tpk__layer_name(ctx, fn, b->name, sizeof b->name, d.name, "layer"));
    b->H = H;
    tpk__params_mark(ctx); /* the block's ids, new or (a copy) reused */
    char n[128];
    tpk_layernorm_desc lnd;
    memset(&lnd, 0, sizeof lnd);
    lnd.name = n, lnd.eps = d.ln_eps, lnd.sequence_parallel = d.sequence_parallel;
    snprintf(n, sizeof n, "%s.input_layernorm", b->name);
    TPK_TRY(tpk_layernorm_init(ctx, &b->ln_1, H, &lnd));
    snprintf(n, sizeof n, "%s.post_attention_layernorm", b->name);
    TPK_TRY(tpk_layernorm_init(ctx, &b->ln_2, H, &lnd));
    tpk_attention_desc ad;
    memset(&ad, 0, sizeof ad);
    snprintf(n, sizeof n, "%s.attention", b->name);
    ad.name = n, ad.qkv_name = "query_key_value", ad.proj_name = "dense", ad.qkv_per_head = true;
    ad.rotary_dim = d.rotary_dim, ad.rope_theta = d.rope_theta, ad.dropout = d.dropout;
    ad.sequence_parallel = d.sequence_parallel, ad.init_std = d.init_std;
    TPK_TRY(tpk_attention_init(ctx, &b->attn, H, d.heads, &ad));
    tpk_mlp_desc md;
    memset(&md, 0, sizeof md);
    snprintf(n, sizeof n, "%s.mlp", b->name);
    md.name = n, md.fc_name = "dense_h_to_4h", md.proj_name = "dense_4h_to_h", md.hidden = d.ffn;
    md.sequence_parallel = d.sequence_parallel, md.init_std = d.init_std;
    md.act = d.act != TPK_ACT_NONE ? d.act : TPK_ACT_GELU;
    TPK_TRY(tpk_mlp_init(ctx, &b->mlp, H, &md));
    TPK_TRY(tpk__block_residuals(ctx, b->name, d.dropout, &b->res_1, &b->res_2));
    tpk__params_marked(ctx, &b->p0, &b->p1);
    return TPK_OK;
}

/* The backward with the parallel residual (tpk__neox_block_backward, in place or not), the buffer
 * lists by recompute set and the selective recompute are the skeleton's (tpk/models/lm.h). */
TPK__LM_ADAPTERS_EX(neox, tpk_neox_block, ln_1, ln_2, layernorm, b, attention, mlp, true)
/* y = block(x) (tpk_neox_block_forward): the skeleton's with the parallel residual, y = x +
 * drop(attn(input_layernorm(x))) + drop(mlp(post_attention_layernorm(x))) (x must stay unchanged
 * until backward: both norms keep it); destroy likewise (tpk_neox_block_destroy). */
TPK__LM_BLOCK_FORWARD(neox, tpk_neox_block)

/* ---- model ----------------------------------------------------------------------------------- */

typedef struct tpk_neox_config {
    TPK__LM_CONFIG_SHAPE /* vocab, positions, layers, hidden, heads */
    int64_t ffn;            /* intermediate_size; 0 = 4 H */
    float rotary_pct;       /* the rotated fraction of each head; 0 = 0.25 (Pythia) */
    float rope_theta;       /* rotary_emb_base; 0 = 10000 */
    float ln_eps;           /* layer_norm_eps; 0 = 1e-5 */
    float dropout;          /* embedding, attention and both branches; 0 = none (Pythia) */
    tpk_act act;            /* the MLP's activation; 0 = TPK_ACT_GELU (exact, Pythia's "gelu"),
                               TPK_ACT_GELU_TANH ("gelu_new") */
    float label_smoothing;  /* over the global vocabulary */
    bool sequence_parallel;
    float init_std;         /* default 0.02 (Hugging Face's initializer_range) */
    int64_t vocab_multiple; /* shards padded to a multiple of this many rows; 0: 64, < 0: none */
    tpk_recompute recompute; /* TPK_RECOMPUTE_FULL: each block's forward again in the backward;
                                _SELECTIVE: the norms and the attention kernel again */
} tpk_neox_config;

typedef struct tpk_neox {
    tpk_neox_config c;
    tpk_embedding embed;      /* gpt_neox.embed_in */
    tpk_neox_block *layers;   /* [L] */
    tpk_layernorm norm;       /* gpt_neox.final_layer_norm */
    int head_w;               /* embed_out.weight's id */
    tpk_linear lm_head;       /* embed_out */
    tpk_xent ce;
    tpk_dropout drop;         /* on the embedding's output */
    tpk_tensor logits;        /* S(-1) [B S, Vp] of the last forward (gradient after backward) */
    tpk_lm lm;                /* the skeleton's state (tpk/models/lm.h): its grad_ready hook is
                                 called with embed_out, the final norm, each layer from the last,
                                 embed_in */
} tpk_neox;

/* The rotated dimensions of a head of D: rotary_pct D, as Hugging Face rounds it (down), even. */
static inline int64_t tpk_neox_rotary_dim(int64_t D, float pct) {
    int64_t r = (int64_t)((double)D * (double)pct);
    return r - r % 2;
}

/* GPT-NeoX as a family of the skeleton (tpk/models/lm.h). */
static inline tpk_status tpk__neox_lm_block_init(tpk_ctx *ctx, void *b, int64_t H,
                                                 const char *name, const void *cfg) {
    const tpk_neox_config *c = (const tpk_neox_config *)cfg;
    tpk_neox_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = name, bd.heads = c->heads, bd.ffn = c->ffn, bd.rope_theta = c->rope_theta;
    bd.rotary_dim = tpk_neox_rotary_dim(c->hidden / c->heads, c->rotary_pct);
    bd.ln_eps = c->ln_eps, bd.dropout = c->dropout, bd.sequence_parallel = c->sequence_parallel;
    bd.act = c->act;
    bd.init_std = c->init_std;
    return tpk_neox_block_init(ctx, (tpk_neox_block *)b, H, &bd);
}
static inline tpk__lm_parts tpk__neox_lm(tpk_neox *m) {
    static const tpk_lm_family family =
        TPK__LM_FAMILY_ROW(neox, tpk_neox_block, "gpt_neox.embed_in.weight", NULL,
                           "gpt_neox.layers", "gpt_neox.final_layer_norm", "embed_out.weight");
    tpk__lm_parts p = {&family,   &m->lm,   m->c.layers, m->c.recompute, &m->embed, &m->drop,
                       m->layers, &m->norm, &m->head_w,  &m->lm_head,    &m->ce,    &m->logits};
    return p;
}

/* tpk_neox_forward, _backward, _generate, _sample and _destroy (and tpk__neox_lm_init,
 * tpk__neox_bufs) are the skeleton's (tpk/models/lm.h, with tpk/models/sample.h). */
TPK__LM_MODEL_ENTRIES(neox, layers)

static inline tpk_status tpk_neox_init(tpk_ctx *ctx, tpk_neox *m, const tpk_neox_config *cfg) {
    static const char *fn = "tpk_neox_init";
    TPK_TRY(tpk__lm_init_args(ctx, fn, m, cfg));
    memset(m, 0, sizeof *m);
    tpk_neox_config c = *cfg;
    TPK_TRY(tpk__lm_check_shape(ctx, fn, c.layers, c.positions, c.hidden, c.heads));
    if (c.ffn < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->ffn: expected >= 1 (0 = 4 H), got %lld",
                         (long long)c.ffn);
    if (c.rotary_pct == 0) c.rotary_pct = 0.25f;
    if (!(c.rotary_pct > 0 && c.rotary_pct <= 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->rotary_pct: expected a fraction in (0, 1] (0 = 0.25), got %g",
                         (double)c.rotary_pct);
    if (tpk_neox_rotary_dim(c.hidden / c.heads, c.rotary_pct) < 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->rotary_pct: %g of a head of %lld rotates no pair of dimensions",
                         (double)c.rotary_pct, (long long)(c.hidden / c.heads));
    if (!(c.dropout >= 0.0f && c.dropout < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->dropout: expected 0 <= p < 1, got %g",
                         (double)c.dropout);
    TPK_TRY(tpk__lm_check_recompute(ctx, fn, c.recompute));
    if (c.act == TPK_ACT_NONE) c.act = TPK_ACT_GELU;
    if (c.act != TPK_ACT_GELU && c.act != TPK_ACT_GELU_TANH)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->act: expected TPK_ACT_GELU or TPK_ACT_GELU_TANH (0: GELU), got %d",
                         (int)c.act);
    if (!c.ffn) c.ffn = 4 * c.hidden;
    if (c.init_std <= 0) c.init_std = 0.02f;
    if (c.rope_theta == 0) c.rope_theta = 10000.0f;
    if (c.ln_eps == 0) c.ln_eps = 1e-5f;
    m->c = c;
    tpk__lm_dims d = {c.vocab,           c.positions, c.layers, c.hidden, c.vocab_multiple,
                      c.label_smoothing, c.init_std,  c.ln_eps, c.dropout, c.sequence_parallel,
                      false};
    return tpk__neox_lm_init(ctx, fn, m, &d);
}

/* The config fields a trainer sets by flag (tpk_lm_flag). */
static inline const tpk_lm_flag *tpk_neox_flags(int *n) {
    static const tpk_lm_flag f[] = {
        {"--ffn", offsetof(tpk_neox_config, ffn), true, 1, 1e9, "F", "F (default 4H)"},
        {"--rotary-pct", offsetof(tpk_neox_config, rotary_pct), false, 1e-6, 1, "rotary", "0.25"},
        {"--rope-theta", offsetof(tpk_neox_config, rope_theta), false, 1.0001, 1e30, NULL, "10000"},
        {"--norm-eps", offsetof(tpk_neox_config, ln_eps), false, 1e-30, 0.5, NULL, "1e-5"}};
    *n = (int)(sizeof f / sizeof f[0]);
    return f;
}

/* Set the dropout probability of every dropout site (0 for evaluation and sampling). */
static inline void tpk_neox_set_dropout(tpk_neox *m, float p) {
    m->c.dropout = p;
    m->drop.p = p;
    for (int64_t i = 0; m->layers && i < m->c.layers; i++)
        m->layers[i].attn.p = m->layers[i].res_1.drop.p = m->layers[i].res_2.drop.p = p;
}

#endif /* TPK_NEOX_H */
