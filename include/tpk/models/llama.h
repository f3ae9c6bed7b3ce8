/* tpk/models/llama.h — the Llama block and model, tensor-parallel, with optional sequence
 * parallelism.
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
 *   embed_tokens and lm_head zero, never trained, never in checkpoints). The skeleton of
 *   tpk/models/lm.h, as GPT-2's; this file holds the block's parts, init and forward, its buffer
 *   lists, the config and the names.
 * Parameter names are Hugging Face LlamaForCausalLM's, all [out, in]: model.embed_tokens.weight,
 * model.layers.<i>.input_layernorm.weight, model.layers.<i>.self_attn.{q,k,v,o}_proj.weight,
 * model.layers.<i>.post_attention_layernorm.weight,
 * model.layers.<i>.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight. */
#ifndef TPK_LLAMA_H
#define TPK_LLAMA_H

#include "../layers/attn.h"
#include "../layers/mlp.h"
#include "../layers/norm.h"
#include "lm.h"
#include "sample.h"

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

typedef struct tpk_llama_block {
    char name[80];
    int64_t H;
    tpk_rmsnorm norm_1, norm_2;
    tpk_gqa_attention attn;
    tpk_swiglu_mlp mlp;
    tpk_residual res_1, res_2; /* x1 = x + attn, y = x1 + mlp (no dropout in Llama) */
    int p0, p1;                /* its parameters are ids p0..p1 */
} tpk_llama_block;

static inline tpk_status tpk_llama_block_init(tpk_ctx *ctx, tpk_llama_block *b, int64_t H,
                                              const tpk_llama_block_desc *desc) {
    static const char *fn = "tpk_llama_block_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    if (!desc)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "desc: NULL (desc->heads and desc->ffn are required)");
    memset(b, 0, sizeof *b);
    tpk_llama_block_desc d = *desc;
    TPK_TRY(tpk__layer_name(ctx, fn, b->name, sizeof b->name, d.name, "layer"));
    b->H = H;
    tpk__params_mark(ctx); /* the block's ids, new or (a copy) reused */
    char n[128];
    tpk_rmsnorm_desc nd;
    memset(&nd, 0, sizeof nd);
    nd.name = n, nd.eps = d.norm_eps, nd.sequence_parallel = d.sequence_parallel;
    snprintf(n, sizeof n, "%s.input_layernorm", b->name);
    TPK_TRY(tpk_rmsnorm_init(ctx, &b->norm_1, H, &nd));
    tpk_gqa_attention_desc ad;
    memset(&ad, 0, sizeof ad);
    snprintf(n, sizeof n, "%s.self_attn", b->name);
    ad.name = n, ad.kv_heads = d.kv_heads, ad.rope_theta = d.rope_theta,
    ad.sequence_parallel = d.sequence_parallel, ad.init_std = d.init_std;
    TPK_TRY(tpk_gqa_attention_init(ctx, &b->attn, H, d.heads, &ad));
    snprintf(n, sizeof n, "%s.post_attention_layernorm", b->name);
    TPK_TRY(tpk_rmsnorm_init(ctx, &b->norm_2, H, &nd));
    tpk_swiglu_mlp_desc md;
    memset(&md, 0, sizeof md);
    snprintf(n, sizeof n, "%s.mlp", b->name);
    md.name = n, md.hidden = d.ffn, md.sequence_parallel = d.sequence_parallel,
    md.init_std = d.init_std;
    TPK_TRY(tpk_swiglu_mlp_init(ctx, &b->mlp, H, &md));
    TPK_TRY(tpk__block_residuals(ctx, b->name, 0.0f, &b->res_1, &b->res_2));
    tpk__params_marked(ctx, &b->p0, &b->p1);
    return TPK_OK;
}

/* The backward (tpk__llama_block_backward, in place or not), the buffer lists by recompute set
 * (tpk__llama_block_bufs: each layer's own, tpk/runtime/buf.h) and the selective recompute are the
 * skeleton's pre-norm residual block's (tpk/models/lm.h), through these adapters. */
TPK__LM_ADAPTERS(llama, tpk_llama_block, norm_1, norm_2, rmsnorm, w, gqa_attention, swiglu_mlp)
/* y = block(x) (tpk_llama_block_forward): the skeleton's, x1 = x + attn(input_layernorm(x)),
 * y = x1 + mlp(post_attention_layernorm(x1)); destroy likewise (tpk_llama_block_destroy). */
TPK__LM_BLOCK_FORWARD(llama, tpk_llama_block)

/* ---- model ----------------------------------------------------------------------------------- */

typedef struct tpk_llama_config {
    TPK__LM_CONFIG_SHAPE /* vocab, positions, layers, hidden, heads */
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
} tpk_llama_config;

typedef struct tpk_llama {
    tpk_llama_config c;
    tpk_embedding embed;    /* model.embed_tokens */
    tpk_llama_block *layers; /* [L] */
    tpk_rmsnorm norm;
    int head_w;             /* lm_head.weight's id (embed_tokens' when tied) */
    tpk_linear lm_head;
    tpk_xent ce;
    tpk_tensor logits;      /* S(-1) [B S, Vp] of the last forward (gradient after backward) */
    tpk_lm lm;              /* the skeleton's state (tpk/models/lm.h): its grad_ready hook is called
                               with lm_head when untied, norm, each layer from the last,
                               embed_tokens */
} tpk_llama;

/* Llama as a family of the skeleton (tpk/models/lm.h). */
static inline tpk_status tpk__llama_lm_block_init(tpk_ctx *ctx, void *b, int64_t H,
                                                  const char *name, const void *cfg) {
    const tpk_llama_config *c = (const tpk_llama_config *)cfg;
    tpk_llama_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = name, bd.heads = c->heads, bd.kv_heads = c->kv_heads, bd.ffn = c->ffn,
    bd.rope_theta = c->rope_theta, bd.norm_eps = c->norm_eps;
    bd.sequence_parallel = c->sequence_parallel, bd.init_std = c->init_std;
    return tpk_llama_block_init(ctx, (tpk_llama_block *)b, H, &bd);
}
static inline tpk__lm_parts tpk__llama_lm(tpk_llama *m) {
    static const tpk_lm_family family =
        TPK__LM_FAMILY_ROW(llama, tpk_llama_block, "model.embed_tokens.weight", NULL,
                           "model.layers", "model.norm", "lm_head.weight");
    tpk__lm_parts p = {&family,   &m->lm,   m->c.layers, m->c.recompute, &m->embed, NULL,
                       m->layers, &m->norm, &m->head_w,  &m->lm_head,    &m->ce,    &m->logits};
    return p;
}

/* tpk_llama_forward, _backward, _generate, _sample and _destroy (and tpk__llama_lm_init,
 * tpk__llama_bufs) are the skeleton's (tpk/models/lm.h, with tpk/models/sample.h). */
TPK__LM_MODEL_ENTRIES(llama, layers)

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

/* Llama has no dropout site (tpk/models/families.h: tpk_model_set_dropout refuses p > 0). */
static inline void tpk_llama_set_dropout(tpk_llama *m, float p) { (void)m, (void)p; }

/* Llama's default intermediate size for hidden H: 2/3 of 4 H, up to a multiple of 256. */
static inline int64_t tpk_llama_default_ffn(int64_t H) {
    int64_t f = 8 * H / 3;
    return (f + 255) / 256 * 256;
}

static inline tpk_status tpk_llama_init(tpk_ctx *ctx, tpk_llama *m, const tpk_llama_config *cfg) {
    static const char *fn = "tpk_llama_init";
    TPK_TRY(tpk__lm_init_args(ctx, fn, m, cfg));
    memset(m, 0, sizeof *m);
    tpk_llama_config c = *cfg;
    TPK_TRY(tpk__lm_check_shape(ctx, fn, c.layers, c.positions, c.hidden, c.heads));
    if (c.kv_heads == 0) c.kv_heads = c.heads;
    if (c.kv_heads < 1 || c.heads % c.kv_heads)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->kv_heads: expected a divisor of cfg->heads = %lld, got %lld",
                         (long long)c.heads, (long long)c.kv_heads);
    if ((c.hidden / c.heads) % 2)
        return tpk__fail(
            ctx, TPK_ERR_ARG, fn,
            "cfg->hidden / cfg->heads: rotary embeddings need an even head size, got %lld",
            (long long)(c.hidden / c.heads));
    if (c.ffn < 0)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->ffn: expected >= 1 (0 = Llama's default), got %lld",
                         (long long)c.ffn);
    if (!c.ffn) c.ffn = tpk_llama_default_ffn(c.hidden);
    TPK_TRY(tpk__lm_check_recompute(ctx, fn, c.recompute));
    if (c.init_std <= 0) c.init_std = 0.02f;
    if (c.rope_theta == 0) c.rope_theta = 10000.0f;
    if (c.norm_eps == 0) c.norm_eps = 1e-6f;
    m->c = c;
    tpk__lm_dims d = {c.vocab,           c.positions, c.layers,   c.hidden, c.vocab_multiple,
                      c.label_smoothing, c.init_std,  c.norm_eps, 0.0f,     c.sequence_parallel,
                      c.tie_embeddings};
    return tpk__llama_lm_init(ctx, fn, m, &d);
}

#endif /* TPK_LLAMA_H */
