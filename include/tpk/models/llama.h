/* tpk/models/llama.h — Llama as a configuration of the kit's language model (tpk/models/lm.h),
 * tensor-parallel, with optional sequence parallelism.
 *
 * Block (pre-norm), hidden states x R [T, H] (S(0) under sequence parallelism):
 *   x1 = x  + attn(input_layernorm(x))            RMSNorm; grouped-query attention with rotary
 *                                                 embeddings (q, k, v column, o row:
 *                                                 tpk/layers/attn.h)
 *   y  = x1 + mlp(post_attention_layernorm(x1))   RMSNorm; SwiGLU (gate+up column, down row)
 *   backward mirrors it: dx1 = dy + rms_2'(mlp'(dy)), dx = dx1 + rms_1'(attn'(dx1)).
 *   Collectives per block: 2 all-reduces of T H forward and 2 backward (SP: 2 all-gathers + 2
 *   reduce-scatters each way, and 2 more all-gathers backward: the projections' inputs again), as
 *   GPT-2's; plus, once per step, the sums of the RMSNorm weight gradients under SP and of the
 *   key/value weights held by several ranks (tpk_params_reduce_partial_grads).
 * Model: ids -> embed_tokens (vocabulary-parallel, no position table) -> L blocks -> norm ->
 *   logits = h lm_headᵀ (a column linear over its own vocabulary shard, untied; tied with
 *   cfg.tie_embeddings) S(-1) [T, Vp] -> vocabulary-parallel cross-entropy (mean over counted
 *   positions). The vocabulary is padded as GPT-2's (cfg.vocab_multiple; the padding rows of
 *   embed_tokens and lm_head zero, never trained, never in checkpoints). This file holds what is
 *   Llama's own: its config, its block as a tpk_block_desc, its names.
 * Parameter names are Hugging Face LlamaForCausalLM's, all [out, in]: model.embed_tokens.weight,
 * model.layers.<i>.input_layernorm.weight, model.layers.<i>.self_attn.{q,k,v,o}_proj.weight,
 * model.layers.<i>.post_attention_layernorm.weight,
 * model.layers.<i>.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight. */
#ifndef TPK_LLAMA_H
#define TPK_LLAMA_H

#include "lm.h"

/* ---- block ----------------------------------------------------------------------------------- */

typedef struct tpk_llama_block_desc {
    const char *name;       /* default "layer<N>": parameters "<name>.input_layernorm.weight",
                               ... */
    int64_t heads;          /* A (required) */
    int64_t kv_heads;       /* G, divides A; 0 = A */
    int64_t ffn;            /* F, the SwiGLU intermediate size (required) */
    float rope_theta;       /* 0 = 10000 */
    float norm_eps;         /* 0 = 1e-6 */
    bool sequence_parallel;
    float init_std;         /* every weight N(0, std^2); default 0.02 */
} tpk_llama_block_desc;

/* Llama's block as the kit's block: RMSNorms input_layernorm and post_attention_layernorm,
 * grouped-query attention "self_attn" with rotary embeddings (q, k, v, o_proj), the SwiGLU MLP
 * "mlp" (gate_up, down), the sequential residual, no dropout. */
static inline tpk_block_desc tpk_llama_block_config(const tpk_llama_block_desc *d) {
    tpk_block_desc b;
    memset(&b, 0, sizeof b);
    b.name = d->name, b.heads = d->heads, b.residual = TPK_RESIDUAL_SEQUENTIAL;
    b.norm_1.kind = b.norm_2.kind = TPK_NORM_RMSNORM;
    b.norm_1.eps = b.norm_2.eps = d->norm_eps;
    b.norm_1.name = "input_layernorm", b.norm_2.name = "post_attention_layernorm";
    b.attn.kind = TPK_ATTN_GQA, b.attn.name = "self_attn";
    b.attn.gqa.kv_heads = d->kv_heads, b.attn.gqa.rope_theta = d->rope_theta;
    b.mlp.kind = TPK_MLP_SWIGLU, b.mlp.name = "mlp", b.mlp.swiglu.hidden = d->ffn;
    b.sequence_parallel = d->sequence_parallel, b.init_std = d->init_std;
    return b;
}

/* A Llama block alone (the model builds its own): tpk_block_forward, _backward and _destroy run
 * it. */
static inline tpk_status tpk_llama_block_init(tpk_ctx *ctx, tpk_block *b, int64_t H,
                                              const tpk_llama_block_desc *desc) {
    static const char *fn = "tpk_llama_block_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    if (!desc)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc: NULL (desc->heads and desc->ffn are required)");
    tpk_block_desc bd = tpk_llama_block_config(desc);
    char name[80];
    TPK_TRY(tpk__layer_name(ctx, fn, name, sizeof name, desc->name, "layer"));
    bd.name = name;
    return tpk_block_init(ctx, b, H, &bd);
}

/* ---- model ----------------------------------------------------------------------------------- */

typedef struct tpk_llama_config {
    int64_t vocab;          /* V (need not divide t) */
    int64_t positions;      /* the longest sequence */
    int64_t layers;         /* L */
    int64_t hidden;         /* H */
    int64_t heads;          /* A (need not divide t) */
    tpk_lm_part part;       /* the part built (pipeline stages); zeros: all */
    int64_t kv_heads;       /* G, divides A; 0 = A */
    int64_t ffn;            /* F, SwiGLU's intermediate size; 0 = Llama's rule: 2/3 of 4 H
                               rounded up to a multiple of 256 */
    float rope_theta;       /* 0 = 10000 */
    float norm_eps;         /* RMSNorm; 0 = 1e-6 */
    float label_smoothing;  /* over the global vocabulary */
    bool tie_embeddings;    /* the LM head reuses embed_tokens (no lm_head.weight) */
    bool sequence_parallel;
    float init_std;         /* default 0.02 (Hugging Face's initializer_range) */
    int64_t vocab_multiple; /* shards padded to a multiple of this many rows; 0: 64, < 0: none */
    tpk_recompute recompute; /* TPK_RECOMPUTE_FULL: each block's forward again in the backward;
                                _SELECTIVE: the norms, the attention kernel and SwiGLU again */
    tpk_cp_comm cp_comm;    /* the attention under context parallelism (ctx->cp): TPK_CP_P2P (the
                               ring, default) or TPK_CP_ALLGATHER (tpk/layers/cp_attn.h) */
} tpk_llama_config;

/* A Llama: its config (defaults applied) and the model (m.lm). */
typedef struct tpk_llama {
    tpk_llama_config c;
    tpk_lm lm; /* its grad_ready hook is called with lm_head when untied, norm, each layer from
                  the last, embed_tokens */
} tpk_llama;

/* The config fields a trainer sets by flag (tpk_lm_flag). */
static inline const tpk_lm_flag *tpk_llama_flags(int *n) {
    static const tpk_lm_flag f[] = {
        {"--kv-heads", offsetof(tpk_llama_config, kv_heads), true, 1, 1e9, "G",
         "G (default --heads)"},
        {"--ffn", offsetof(tpk_llama_config, ffn), true, 1, 1e9, "F", "F (default 8H/3 up to 256)"},
        {"--rope-theta", offsetof(tpk_llama_config, rope_theta), false, 1.0001, 1e30, NULL,
         "10000"},
        {"--norm-eps", offsetof(tpk_llama_config, norm_eps), false, 1e-30, 0.5, NULL, "1e-6"}};
    *n = (int)(sizeof f / sizeof f[0]);
    return f;
}

/* Llama's default intermediate size for hidden H: 2/3 of 4 H, up to a multiple of 256. */
static inline int64_t tpk_llama_default_ffn(int64_t H) {
    int64_t f = 8 * H / 3;
    return (f + 255) / 256 * 256;
}

/* The model's config of a Llama config (checked; defaults applied to *cfg). */
static inline tpk_status tpk_llama_lm_config(tpk_ctx *ctx, tpk_llama_config *cfg,
                                             tpk_lm_config *out) {
    static const char *fn = "tpk_llama_init";
    tpk_llama_config *c = cfg;
    TPK_TRY(tpk__lm_check_shape(ctx, fn, c->layers, c->positions, c->hidden, c->heads));
    if (c->kv_heads == 0) c->kv_heads = c->heads;
    if (c->kv_heads < 1 || c->heads % c->kv_heads)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->kv_heads: expected a divisor of cfg->heads = %lld, got %lld",
                         (long long)c->heads, (long long)c->kv_heads);
    if ((c->hidden / c->heads) % 2)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "cfg->hidden / cfg->heads: rotary embeddings need an even head size, got %lld",
            (long long)(c->hidden / c->heads));
    if (c->ffn < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->ffn: expected >= 1 (0 = Llama's default), got %lld",
                         (long long)c->ffn);
    if (!c->ffn) c->ffn = tpk_llama_default_ffn(c->hidden);
    TPK_TRY(tpk__lm_check_recompute(ctx, fn, c->recompute));
    if (c->init_std <= 0) c->init_std = 0.02f;
    if (c->rope_theta == 0) c->rope_theta = 10000.0f;
    if (c->norm_eps == 0) c->norm_eps = 1e-6f;
    tpk_llama_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = "model.layers", bd.heads = c->heads, bd.kv_heads = c->kv_heads, bd.ffn = c->ffn;
    bd.rope_theta = c->rope_theta, bd.norm_eps = c->norm_eps, bd.init_std = c->init_std;
    memset(out, 0, sizeof *out);
    out->vocab = c->vocab, out->positions = c->positions, out->layers = c->layers;
    out->hidden = c->hidden, out->block = tpk_llama_block_config(&bd);
    out->final_norm.kind = TPK_NORM_RMSNORM, out->final_norm.name = "model.norm";
    out->final_norm.eps = c->norm_eps;
    out->embed_name = "model.embed_tokens.weight", out->head_name = "lm_head.weight";
    out->tie_embeddings = c->tie_embeddings;
    out->label_smoothing = c->label_smoothing, out->init_std = c->init_std;
    out->vocab_multiple = c->vocab_multiple, out->sequence_parallel = c->sequence_parallel;
    out->recompute = c->recompute, out->part = c->part, out->cp_comm = c->cp_comm;
    return TPK_OK;
}

static inline tpk_status tpk_llama_init(tpk_ctx *ctx, tpk_llama *m, const tpk_llama_config *cfg) {
    TPK_TRY(tpk__lm_family_args(ctx, "tpk_llama_init", m, cfg));
    tpk_lm_config lc;
    memset(m, 0, sizeof *m), m->c = *cfg;
    TPK_TRY(tpk_llama_lm_config(ctx, &m->c, &lc));
    return tpk_lm_init(ctx, &m->lm, &lc);
}

#endif /* TPK_LLAMA_H */
