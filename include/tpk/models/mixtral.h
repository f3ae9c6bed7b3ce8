/* tpk/models/mixtral.h — Mixtral as a configuration of the kit's language model (tpk/models/lm.h):
 * Llama's attention and norms with a sparse mixture of experts in place of the MLP,
 * tensor-parallel, expert-parallel over ctx->ep.
 *
 * Block (pre-norm), hidden states x R [T, H] (S(0) under sequence parallelism):
 *   x1 = x  + attn(input_layernorm(x))            RMSNorm; grouped-query attention with rotary
 *                                                 embeddings (q, k, v column, o row)
 *   y  = x1 + moe(post_attention_layernorm(x1))   RMSNorm; the MoE block (tpk/layers/moe.h): a
 *                                                 router over E experts, the top k of each token
 *                                                 (weights renormalised over the k), SwiGLU experts
 *                                                 (w1 gate, w3 up, w2 down) split over ctx->ep and
 *                                                 over TP on F
 *   backward mirrors it: dx1 = dy + rms_2'(moe'(dy)), dx = dx1 + rms_1'(attn'(dx1)).
 * Model: as Llama's (embed_tokens, L blocks, norm, lm_head untied or tied), the loss the
 *   cross-entropy plus router_aux_loss_coef times Hugging Face's load-balancing loss over every
 *   layer's routing concatenated (tpk/models/lm.h: E sum_e C_e Q_e / N², not the layers' sum).
 *   Each EP rank routes its own tokens (its DP rank's data); an expert's gradient sums every EP
 *   rank's tokens routed to it (then over ctx->edp in the data-parallel reduction).
 * Parameter names are Hugging Face MixtralForCausalLM's, all [out, in]: model.embed_tokens.weight,
 * model.layers.<i>.input_layernorm.weight, model.layers.<i>.self_attn.{q,k,v,o}_proj.weight,
 * model.layers.<i>.post_attention_layernorm.weight, model.layers.<i>.block_sparse_moe.gate.weight
 * [E, H], model.layers.<i>.block_sparse_moe.experts.<e>.{w1,w3}.weight [F, H], .w2.weight [H, F]
 * (expert e only at EP rank e / (E / ep): tpk_param.expert), model.norm.weight, lm_head.weight.
 * Pipeline stages (cfg.part; tpk/train/pipe_model.h, every schedule): a stage's EP groups are
 * its own DP ranks', and the aux stays the whole model's: each message carries the routing's sums
 * over the blocks before it (C_e, Q_e, N, the z-losses), so the last stage pools every layer's,
 * and each gradient message the whole model's C_e and N back (tpk/models/lm.h), the losses and
 * gradients those of the model without stages. Dropout (cfg.dropout; GPT-2's sites: the
 * embedding's output, the attention's probabilities, both residual branches): each mask is drawn
 * from its site's stream, the step and the DP rank at the global (token, feature), so it is the
 * same at any TP and EP size and drawn again alike by recompute. Context parallelism (ctx->cp,
 * cfg.cp_comm; this CP rank's rows, tpk/models/lm.h): the routing's sums are summed over the CP
 * group, so the aux is over the sequences' whole tokens, as at CP 1 (a capacity factor is each
 * rank's own rows', Megatron's: with drops CP changes which). Sequence parallelism
 * (cfg.sequence_parallel: the hidden states S(0) over TP between the layers): the MoE block
 * all-gathers its input over TP and reduce-scatters its output (tpk/layers/moe.h), every TP rank
 * routing the whole T tokens, so the loss and gradients are those without SP (to rounding); with
 * stages, CP and recompute alike. The trainer: --arch mixtral --experts E --moe-top-k k --ep P
 * (tpk/train/options.h), --pp N, --cp N, --dropout p, --sequence-parallel. */
#ifndef TPK_MIXTRAL_H
#define TPK_MIXTRAL_H

#include "moe_family.h"

typedef struct tpk_mixtral_config {
    int64_t vocab;           /* V (need not divide t) */
    int64_t positions;       /* the longest sequence */
    int64_t layers;          /* L */
    int64_t hidden;          /* H */
    int64_t heads;           /* A (need not divide t) */
    tpk_lm_part part;        /* zeros: all; a pipeline stage's blocks (tpk/train/pipe_model.h) */
    int64_t kv_heads;        /* G, divides A; 0 = A */
    int64_t ffn;             /* F, each expert's intermediate size; 0 = 7 H / 2 rounded up to a
                               multiple of 256 (Mixtral-8x7B's 14336 at H = 4096) */
    int64_t experts;         /* E (num_local_experts), a multiple of the EP size; 0 = 8 */
    int64_t top_k;           /* k (num_experts_per_tok), 1..E; 0 = 2 */
    float aux_coef;          /* router_aux_loss_coef; 0 = 0.001 (Hugging Face's default), < 0: no
                               auxiliary loss */
    float rope_theta;        /* 0 = 1e6 (Mixtral's) */
    float norm_eps;          /* RMSNorm; 0 = 1e-5 (Mixtral's) */
    float label_smoothing;   /* over the global vocabulary */
    bool tie_embeddings;     /* the LM head reuses embed_tokens (no lm_head.weight) */
    bool sequence_parallel;  /* hidden states S(0) over TP between the layers (the MoE block gathers
                                its input and reduce-scatters its output, tpk/layers/moe.h) */
    float init_std;          /* default 0.02 (Hugging Face's initializer_range) */
    int64_t vocab_multiple;  /* shards padded to a multiple of this many rows; 0: 64, < 0: none */
    tpk_recompute recompute; /* TPK_RECOMPUTE_FULL: each block's forward again in the backward
                                (the routing and its all-to-alls too); _SELECTIVE: the norms and
                                the attention kernel again (the experts keep their buffers) */
    float capacity_factor;   /* 0: dropless (Hugging Face's Mixtral); c > 0: each expert takes at
                                most ceil(T k / E c) of a rank's rows, the lowest-weighted dropped
                                (tpk_moe_desc.capacity_factor, Megatron's "probs" policy) */
    float z_coef;            /* the routers' z-loss (ST-MoE; Megatron-core's moe_z_loss_coeff):
                                z_coef mean_t lse_t² of each layer added to the aux, 0: none. Not
                                in config.json (Hugging Face's Mixtral has none): pass it again on
                                a resume */
    float dropout;           /* the attention's probabilities, both residual branches and the
                                embedding's output (GPT-2's sites; Hugging Face's Mixtral has the
                                attention's alone, attention_dropout); 0 = none. Not written to
                                config.json: a trainer's flag */
    tpk_cp_comm cp_comm;     /* the attention under context parallelism (ctx->cp): TPK_CP_P2P (the
                                ring, default) or TPK_CP_ALLGATHER (Llama's) */
} tpk_mixtral_config;

/* A Mixtral: its config (defaults applied) and the model (m.lm). */
typedef struct tpk_mixtral {
    tpk_mixtral_config c;
    tpk_lm lm;
} tpk_mixtral;

/* The config fields a trainer sets by flag (tpk_lm_flag); the router's k is --moe-top-k (the
 * trainer's --top-k is sampling's). */
static inline const tpk_lm_flag *tpk_mixtral_flags(int *n) {
    static const tpk_lm_flag f[] = {
        {"--experts", offsetof(tpk_mixtral_config, experts), true, 1, 1e6, "E", "E (default 8)"},
        {"--moe-top-k", offsetof(tpk_mixtral_config, top_k), true, 1, 1e6, "k", "k (default 2)"},
        {"--aux-coef", offsetof(tpk_mixtral_config, aux_coef), false, -1, 1e6, NULL,
         "0.001 (< 0: none)"},
        {"--z-loss-coef", offsetof(tpk_mixtral_config, z_coef), TPK_LM_FLAG_OPTION, 0, 1e6, NULL,
         "0 (none)"},
        {"--capacity-factor", offsetof(tpk_mixtral_config, capacity_factor), TPK_LM_FLAG_OPTION, 0,
         1e6, NULL,
         "0 (dropless; c > 0: ceil(T k / E c) rows an expert, the lowest-weighted dropped)"},
        {"--kv-heads", offsetof(tpk_mixtral_config, kv_heads), true, 1, 1e9, "G",
         "G (default --heads)"},
        {"--ffn", offsetof(tpk_mixtral_config, ffn), true, 1, 1e9, "F",
         "F (default 7H/2 up to 256)"},
        {"--rope-theta", offsetof(tpk_mixtral_config, rope_theta), false, 1.0001, 1e30, NULL,
         "1e6"},
        {"--norm-eps", offsetof(tpk_mixtral_config, norm_eps), false, 1e-30, 0.5, NULL, "1e-5"}};
    *n = (int)(sizeof f / sizeof f[0]);
    return f;
}

/* Mixtral's block as the kit's block: Llama's with the MoE "block_sparse_moe" as its MLP. */
static inline tpk_block_desc tpk_mixtral_block_config(const tpk_llama_block_desc *d, int experts,
                                                      int top_k, float aux_coef) {
    tpk_block_desc b = tpk_llama_block_config(d);
    memset(&b.mlp, 0, sizeof b.mlp);
    b.mlp.kind = TPK_MLP_MOE, b.mlp.name = "block_sparse_moe";
    b.mlp.moe.experts = experts, b.mlp.moe.top_k = top_k, b.mlp.moe.hidden = d->ffn;
    b.mlp.moe.renormalize = true, b.mlp.moe.aux_coef = aux_coef;
    return b;
}

/* Mixtral's default expert intermediate size for hidden H: 7 H / 2, up to a multiple of 256. */
static inline int64_t tpk_mixtral_default_ffn(int64_t H) { return (7 * H / 2 + 255) / 256 * 256; }

/* The model's config of a Mixtral config (checked; defaults applied to *cfg). */
static inline tpk_status tpk_mixtral_lm_config(tpk_ctx *ctx, tpk_mixtral_config *cfg,
                                               tpk_lm_config *out) {
    static const char *fn = "tpk_mixtral_init";
    tpk_mixtral_config *c = cfg;
    tpk__moe_fields mf = {&c->experts,        &c->top_k, &c->aux_coef,
                          c->capacity_factor, c->z_coef, c->dropout};
    TPK_TRY(tpk__moe_fields_check(ctx, fn, &mf, 8, 2));
    if (!c->ffn && c->hidden > 0) c->ffn = tpk_mixtral_default_ffn(c->hidden);
    if (c->rope_theta == 0) c->rope_theta = 1e6f;
    if (c->norm_eps == 0) c->norm_eps = 1e-5f;
    tpk_llama_config l;
    memset(&l, 0, sizeof l);
    l.vocab = c->vocab, l.positions = c->positions, l.layers = c->layers, l.hidden = c->hidden;
    l.heads = c->heads, l.part = c->part, l.kv_heads = c->kv_heads, l.ffn = c->ffn;
    l.rope_theta = c->rope_theta, l.norm_eps = c->norm_eps;
    l.label_smoothing = c->label_smoothing, l.tie_embeddings = c->tie_embeddings;
    l.sequence_parallel = c->sequence_parallel;
    l.init_std = c->init_std, l.vocab_multiple = c->vocab_multiple, l.recompute = c->recompute;
    l.cp_comm = c->cp_comm;
    TPK_TRY(tpk_llama_lm_config(ctx, &l, out)); /* checks the shape, heads, ffn, recompute */
    c->kv_heads = l.kv_heads, c->init_std = l.init_std;
    tpk_llama_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = "model.layers", bd.heads = c->heads, bd.kv_heads = c->kv_heads, bd.ffn = c->ffn;
    bd.rope_theta = c->rope_theta, bd.norm_eps = c->norm_eps, bd.init_std = c->init_std;
    out->block = tpk_mixtral_block_config(&bd, (int)c->experts, (int)c->top_k,
                                          c->aux_coef > 0 ? c->aux_coef : 0.f);
    tpk__moe_fields_apply(&mf, out);
    return TPK_OK;
}

static inline tpk_status tpk_mixtral_init(tpk_ctx *ctx, tpk_mixtral *m,
                                          const tpk_mixtral_config *cfg) {
    TPK_TRY(tpk__lm_family_args(ctx, "tpk_mixtral_init", m, cfg));
    tpk_lm_config lc;
    memset(m, 0, sizeof *m), m->c = *cfg;
    TPK_TRY(tpk_mixtral_lm_config(ctx, &m->c, &lc));
    return tpk_lm_init(ctx, &m->lm, &lc);
}

#endif /* TPK_MIXTRAL_H */
