/* tpk/models/neox.h — GPT-NeoX (Pythia) as a configuration of the kit's language model
 * (tpk/models/lm.h), tensor-parallel, with optional sequence parallelism.
 *
 * Block (parallel residual), hidden states x R [T, H] (S(0) under sequence parallelism):
 *   y = x + drop(attn(input_layernorm(x))) + drop(mlp(post_attention_layernorm(x)))
 *     attn: one fused column linear query_key_value whose rows are per head [q_h; k_h; v_h]
 *           (unit 3 D), packed into [Q | K | V] with the first rotary_dim = rotary_pct D of each
 *           head of Q and K rotated (rotate-half, base rotary_emb_base), causal attention, the
 *           row linear dense (tpk/layers/attn.h, qkv_per_head and rotary_dim)
 *     mlp:  dense_h_to_4h column, GELU (exact; or its tanh form), dense_4h_to_h row
 *           (tpk/layers/mlp.h)
 *   backward: dx = dy + ln_2'(mlp'(drop(dy))) + ln_1'(attn'(drop(dy))) (the block's backward
 *   with the parallel residual, tpk/models/block.h). Collectives: the branches summed while
 *   partial, 1 all-reduce of T H each way (SP: 1 all-gather and 1 reduce-scatter each way).
 *   use_parallel_residual false (cfg.sequential): the sequential block of GPT-2, x1 = x +
 *   drop(attn(input_layernorm(x))), y = x1 + drop(mlp(post_attention_layernorm(x1))), as Hugging
 *   Face runs such a checkpoint.
 * Model: ids -> embed_in (vocabulary-parallel, no position table) -> drop -> L blocks ->
 *   final_layer_norm -> logits = h embed_outᵀ (a column linear over its own vocabulary shard,
 *   untied) S(-1) [T, Vp] -> vocabulary-parallel cross-entropy (tpk/models/lm.h); this file holds
 *   what is GPT-NeoX's own: its config, its block as a tpk_block_desc, its names.
 * Parameter names are Hugging Face GPTNeoXForCausalLM's, all [out, in]: gpt_neox.embed_in.weight,
 * gpt_neox.layers.<i>.{input_layernorm,post_attention_layernorm}.{weight,bias},
 * gpt_neox.layers.<i>.attention.{query_key_value,dense}.{weight,bias},
 * gpt_neox.layers.<i>.mlp.{dense_h_to_4h,dense_4h_to_h}.{weight,bias},
 * gpt_neox.final_layer_norm.{weight,bias}, embed_out.weight. The activation is the exact GELU
 * (Pythia's "gelu"), or its tanh form (cfg.act = TPK_ACT_GELU_TANH: Hugging Face's "gelu_new"). */
#ifndef TPK_NEOX_H
#define TPK_NEOX_H

#include "lm.h"

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
    bool sequential;       /* use_parallel_residual false: the sequential residual */
} tpk_neox_block_desc;

/* GPT-NeoX's block as the kit's block: layernorms input_layernorm and post_attention_layernorm,
 * the fused-QKV attention "attention" (query_key_value with rows per head, partial rotary, dense),
 * the GELU MLP "mlp" (dense_h_to_4h, dense_4h_to_h), the parallel residual (or the sequential). */
static inline tpk_block_desc tpk_neox_block_config(const tpk_neox_block_desc *d) {
    tpk_block_desc b;
    memset(&b, 0, sizeof b);
    b.name = d->name, b.heads = d->heads;
    b.residual = d->sequential ? TPK_RESIDUAL_SEQUENTIAL : TPK_RESIDUAL_PARALLEL;
    b.norm_1.kind = b.norm_2.kind = TPK_NORM_LAYERNORM;
    b.norm_1.eps = b.norm_2.eps = d->ln_eps;
    b.norm_1.name = "input_layernorm", b.norm_2.name = "post_attention_layernorm";
    b.attn.kind = TPK_ATTN_FUSED, b.attn.name = "attention";
    b.attn.fused.qkv_name = "query_key_value", b.attn.fused.proj_name = "dense";
    b.attn.fused.qkv_per_head = true, b.attn.fused.rotary_dim = d->rotary_dim;
    b.attn.fused.rope_theta = d->rope_theta;
    b.mlp.kind = TPK_MLP_ACT, b.mlp.name = "mlp";
    b.mlp.act.fc_name = "dense_h_to_4h", b.mlp.act.proj_name = "dense_4h_to_h";
    b.mlp.act.hidden = d->ffn, b.mlp.act.act = d->act != TPK_ACT_NONE ? d->act : TPK_ACT_GELU;
    b.dropout = d->dropout, b.sequence_parallel = d->sequence_parallel, b.init_std = d->init_std;
    return b;
}

/* A GPT-NeoX block alone (the model builds its own): tpk_block_forward, _backward and _destroy
 * run it. */
static inline tpk_status tpk_neox_block_init(tpk_ctx *ctx, tpk_block *b, int64_t H,
                                             const tpk_neox_block_desc *desc) {
    static const char *fn = "tpk_neox_block_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    if (!desc) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc: NULL (desc->heads is required)");
    tpk_block_desc bd = tpk_neox_block_config(desc);
    char name[80];
    TPK_TRY(tpk__layer_name(ctx, fn, name, sizeof name, desc->name, "layer"));
    bd.name = name;
    return tpk_block_init(ctx, b, H, &bd);
}

/* ---- model ----------------------------------------------------------------------------------- */

typedef struct tpk_neox_config {
    int64_t vocab;          /* V (need not divide t) */
    int64_t positions;      /* the longest sequence */
    int64_t layers;         /* L */
    int64_t hidden;         /* H */
    int64_t heads;          /* A (need not divide t) */
    tpk_lm_part part;       /* the part built (pipeline stages); zeros: all */
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
    bool sequential;        /* use_parallel_residual false: the sequential block */
    tpk_cp_comm cp_comm;    /* the attention under context parallelism (ctx->cp): TPK_CP_P2P (the
                               ring, default) or TPK_CP_ALLGATHER (tpk/layers/cp_attn.h) */
} tpk_neox_config;

/* A GPT-NeoX: its config (defaults applied) and the model (m.lm). */
typedef struct tpk_neox {
    tpk_neox_config c;
    tpk_lm lm; /* its grad_ready hook is called with embed_out, the final norm, each layer from
                  the last, embed_in */
} tpk_neox;

/* The rotated dimensions of a head of D: rotary_pct D, as Hugging Face rounds it (down), even. */
static inline int64_t tpk_neox_rotary_dim(int64_t D, float pct) {
    int64_t r = (int64_t)((double)D * (double)pct);
    return r - r % 2;
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

/* The model's config of a GPT-NeoX config (checked; defaults applied to *cfg). */
static inline tpk_status tpk_neox_lm_config(tpk_ctx *ctx, tpk_neox_config *cfg,
                                            tpk_lm_config *out) {
    static const char *fn = "tpk_neox_init";
    tpk_neox_config *c = cfg;
    TPK_TRY(tpk__lm_check_shape(ctx, fn, c->layers, c->positions, c->hidden, c->heads));
    if (c->ffn < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->ffn: expected >= 1 (0 = 4 H), got %lld",
                         (long long)c->ffn);
    if (c->rotary_pct == 0) c->rotary_pct = 0.25f;
    if (!(c->rotary_pct > 0 && c->rotary_pct <= 1))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->rotary_pct: expected a fraction in (0, 1] (0 = 0.25), got %g",
                         (double)c->rotary_pct);
    if (tpk_neox_rotary_dim(c->hidden / c->heads, c->rotary_pct) < 2)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->rotary_pct: %g of a head of %lld rotates no pair of dimensions",
                         (double)c->rotary_pct, (long long)(c->hidden / c->heads));
    TPK_TRY(tpk__lm_check_dropout(ctx, fn, c->dropout));
    TPK_TRY(tpk__lm_check_recompute(ctx, fn, c->recompute));
    if (c->act == TPK_ACT_NONE) c->act = TPK_ACT_GELU;
    if (c->act != TPK_ACT_GELU && c->act != TPK_ACT_GELU_TANH)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->act: expected TPK_ACT_GELU or TPK_ACT_GELU_TANH (0: GELU), got %d",
                         (int)c->act);
    if (!c->ffn) c->ffn = 4 * c->hidden;
    if (c->init_std <= 0) c->init_std = 0.02f;
    if (c->rope_theta == 0) c->rope_theta = 10000.0f;
    if (c->ln_eps == 0) c->ln_eps = 1e-5f;
    tpk_neox_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = "gpt_neox.layers", bd.heads = c->heads, bd.ffn = c->ffn;
    bd.rotary_dim = tpk_neox_rotary_dim(c->hidden / c->heads, c->rotary_pct);
    bd.rope_theta = c->rope_theta, bd.ln_eps = c->ln_eps, bd.dropout = c->dropout;
    bd.act = c->act, bd.init_std = c->init_std, bd.sequential = c->sequential;
    memset(out, 0, sizeof *out);
    out->vocab = c->vocab, out->positions = c->positions, out->layers = c->layers;
    out->hidden = c->hidden, out->block = tpk_neox_block_config(&bd);
    out->final_norm.kind = TPK_NORM_LAYERNORM, out->final_norm.name = "gpt_neox.final_layer_norm";
    out->final_norm.eps = c->ln_eps;
    out->embed_name = "gpt_neox.embed_in.weight", out->head_name = "embed_out.weight";
    out->dropout_sites = true;
    out->label_smoothing = c->label_smoothing, out->init_std = c->init_std;
    out->vocab_multiple = c->vocab_multiple, out->sequence_parallel = c->sequence_parallel;
    out->recompute = c->recompute, out->part = c->part, out->cp_comm = c->cp_comm;
    return TPK_OK;
}

static inline tpk_status tpk_neox_init(tpk_ctx *ctx, tpk_neox *m, const tpk_neox_config *cfg) {
    TPK_TRY(tpk__lm_family_args(ctx, "tpk_neox_init", m, cfg));
    tpk_lm_config lc;
    memset(m, 0, sizeof *m), m->c = *cfg;
    TPK_TRY(tpk_neox_lm_config(ctx, &m->c, &lc));
    return tpk_lm_init(ctx, &m->lm, &lc);
}

#endif /* TPK_NEOX_H */
