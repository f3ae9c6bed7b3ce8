/* tpk/models/qwen2_moe.h — Qwen2-MoE (Hugging Face Qwen2MoeForCausalLM, Qwen1.5-MoE) as a
 * configuration of the kit's language model (tpk/models/lm.h): Qwen2's attention (Llama's with
 * q, k, v biases) and RMSNorms, sparse layers (a mixture of experts with a shared expert) and,
 * between them where the config says so, dense ones (a SwiGLU MLP), tensor-parallel, the experts
 * expert-parallel over ctx->ep.
 *
 * Block (pre-norm), hidden states x R [T, H] (S(0) under sequence parallelism):
 *   x1 = x  + attn(input_layernorm(x))          RMSNorm; grouped-query attention with rotary
 *                                               embeddings: q, k, v column linears with biases,
 *                                               o row without (tpk_gqa_attention_desc.qkv_bias)
 *   h  = post_attention_layernorm(x1)           RMSNorm
 * a sparse layer:
 *   p_t = softmax(h_t Wgᵀ) over the E experts, e_t1..e_tk its top k (ties: the lower index),
 *   w_ti = p_t,e_ti, divided by sum_i w_ti only with norm_topk_prob (default false)
 *   y  = x1 + sum_i w_ti expert_e_ti(h_t) + sigmoid(h_t . ws) shared(h_t)
 *        each expert and the shared one SwiGLU: (silu(h Wgpᵀ) ∘ h Wupᵀ) Wdpᵀ; the routed experts
 *        split over ctx->ep and over TP on F, the shared one over TP on F_s (tpk/layers/moe.h)
 * a dense layer (Hugging Face's Qwen2MoeMLP of intermediate_size F_d, Llama's MLP):
 *   y  = x1 + (silu(h Wgpᵀ) ∘ h Wupᵀ) Wdpᵀ       gate and up column, down row over TP on F_d
 *   Layer i is sparse iff i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
 *   (tpk_qwen2_moe_sparse: Hugging Face's Qwen2MoeDecoderLayer's rule; by default every layer).
 *   backward mirrors it: dx1 = dy + rms_2'(mlp'(dy)) (a sparse layer's mlp': the experts', the
 *   router's through dw_ti = dy_t . expert_e_ti(h_t) and the softmax (and the renormalisation),
 *   the shared expert's and its gate's dl_t = (dy_t . shared(h_t)) s_t (1 - s_t)), dx = dx1 +
 *   rms_1'(attn'(dx1)).
 * Model: as Llama's (embed_tokens, L blocks, norm, lm_head untied or tied); the loss the
 *   cross-entropy plus router_aux_loss_coef times Hugging Face's load-balancing loss over the
 *   sparse layers' routing concatenated (E sum_e C_e Q_e / N², Mixtral's form: tpk/models/lm.h;
 *   a dense layer returns no router logits there, so N counts the sparse layers' rows alone), from
 *   the full softmax whatever norm_topk_prob says; a router z-loss (z_coef) and a capacity factor
 *   as Mixtral's (tpk/models/moe_family.h). Each EP rank routes its own tokens.
 * Parameter names are Hugging Face Qwen2MoeForCausalLM's, all [out, in]:
 *   model.embed_tokens.weight [V, H], model.norm.weight [H], lm_head.weight [V, H] (untied),
 *   model.layers.<i>.input_layernorm.weight [H], .post_attention_layernorm.weight [H],
 *   model.layers.<i>.self_attn.{q_proj [A D, H], k_proj, v_proj [G D, H]}.{weight, bias},
 *   .o_proj.weight [H, A D];
 *   a sparse layer: model.layers.<i>.mlp.gate.weight [E, H] (every rank),
 *   model.layers.<i>.mlp.experts.<e>.{gate_proj, up_proj}.weight [F, H], .down_proj.weight [H, F]
 *   (expert e only at EP rank e / (E / ep): tpk_param.expert),
 *   model.layers.<i>.mlp.shared_expert.{gate_proj, up_proj}.weight [F_s, H], .down_proj.weight
 *   [H, F_s], model.layers.<i>.mlp.shared_expert_gate.weight [1, H] (every EP rank);
 *   a dense layer: model.layers.<i>.mlp.{gate_proj, up_proj}.weight [F_d, H], .down_proj.weight
 *   [H, F_d] (every EP rank).
 * Pipeline stages (cfg.part) and context parallelism compose as Mixtral's do (the language
 * model's: the routing sums passed between stages, a stage of dense layers alone passing them on,
 * and summed over CP; tests/train.sh at PP 2 x EP 2 and CP 2 against DP 2). Dropout (cfg.dropout)
 * at Mixtral's sites, GPT-2's: each mask from its site's stream, the step and the DP rank at the
 * global (token, feature), the same at any TP and EP size and drawn again alike by recompute.
 * Sequence parallelism (cfg.sequence_parallel) as Mixtral's: the MoE block gathers its input over
 * TP and reduce-scatters its output, the shared expert's with the routed ones' (tpk/layers/moe.h).
 * The trainer: --arch qwen2_moe --experts E --moe-top-k k --moe-ffn F --shared-ffn F_s
 * --norm-topk-prob 0|1 --dense-ffn F_d --decoder-sparse-step N --mlp-only-layers i,j --aux-coef
 * --z-loss-coef --capacity-factor --ep P (tpk/train/options.h), --pp N, --cp N, --dropout p,
 * --sequence-parallel. */
#ifndef TPK_QWEN2_MOE_H
#define TPK_QWEN2_MOE_H

#include "moe_family.h"

typedef struct tpk_qwen2_moe_config {
    int64_t vocab;           /* V (need not divide t) */
    int64_t positions;       /* the longest sequence */
    int64_t layers;          /* L */
    int64_t hidden;          /* H */
    int64_t heads;           /* A (need not divide t) */
    tpk_lm_part part;        /* zeros: all; a pipeline stage's blocks (tpk/train/pipe_model.h) */
    int64_t kv_heads;        /* G, divides A; 0 = A */
    int64_t moe_ffn;         /* F, each routed expert's intermediate size (moe_intermediate_size);
                                0 = 1408 (Qwen1.5-MoE-A2.7B's) */
    int64_t shared_ffn;      /* F_s, the shared expert's (shared_expert_intermediate_size); 0 =
                                4 F */
    int64_t experts;         /* E (num_experts), a multiple of the EP size; 0 = 60 */
    int64_t top_k;           /* k (num_experts_per_tok), 1..E; 0 = 4 */
    int64_t norm_topk_prob;  /* 1: the top-k weights renormalised to sum 1; 0 (default,
                                Qwen1.5-MoE's): the softmax's own */
    float aux_coef;          /* router_aux_loss_coef; 0 = 0.001 (Hugging Face's default), < 0: no
                                auxiliary loss */
    float rope_theta;        /* 0 = 1e6 (Qwen1.5-MoE's) */
    float norm_eps;          /* RMSNorm; 0 = 1e-6 */
    float label_smoothing;   /* over the global vocabulary */
    bool tie_embeddings;     /* the LM head reuses embed_tokens (no lm_head.weight) */
    bool sequence_parallel;  /* hidden states S(0) over TP between the layers (the MoE block gathers
                                its input and reduce-scatters its output, tpk/layers/moe.h) */
    float init_std;          /* default 0.02 (Hugging Face's initializer_range) */
    int64_t vocab_multiple;  /* shards padded to a multiple of this many rows; 0: 64, < 0: none */
    tpk_recompute recompute; /* as Mixtral's (tpk/models/mixtral.h) */
    tpk_cp_comm cp_comm;     /* the attention under context parallelism (ctx->cp): TPK_CP_P2P (the
                                ring, default) or TPK_CP_ALLGATHER (Llama's) */
    float capacity_factor;   /* as Mixtral's: 0 dropless (Hugging Face's); c > 0: each expert
                                takes at most ceil(T k / E c) of a rank's rows, the lowest-weighted
                                dropped */
    float z_coef;            /* the routers' z-loss, as Mixtral's: z_coef mean_t lse_t² of each
                                sparse layer added to the aux; 0: none. Not in config.json: pass
                                it again on a resume */
    float dropout;           /* GPT-2's sites, as Mixtral's (Hugging Face's Qwen2-MoE has the
                                attention's alone, attention_dropout); 0 = none. Not written to
                                config.json: a trainer's flag */
    int64_t sparse_step;     /* decoder_sparse_step: layer i is sparse where (i + 1) % step == 0
                                (and i not in mlp_only), else dense; 0 = 1 (every layer sparse) */
    tpk_layer_set mlp_only;  /* mlp_only_layers: layers dense whatever sparse_step says (below
                                cfg.layers, and TPK_LAYER_SET_MAX); empty: none */
    int64_t dense_ffn;       /* F_d, a dense layer's SwiGLU intermediate size (intermediate_size);
                                0 = 4 F (5632 at F's default, Qwen2MoeConfig's) */
} tpk_qwen2_moe_config;

/* Whether layer i of c is sparse (its MLP the MoE block), else dense: Hugging Face's
 * Qwen2MoeDecoderLayer's rule, i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
 * (sparse_step 0 read as 1). */
static inline bool tpk_qwen2_moe_sparse(const tpk_qwen2_moe_config *c, int64_t i) {
    int64_t step = c->sparse_step > 0 ? c->sparse_step : 1;
    return !tpk_layer_set_has(&c->mlp_only, i) && (i + 1) % step == 0;
}
/* The dense layers of c's c->layers. */
static inline int64_t tpk_qwen2_moe_dense_layers(const tpk_qwen2_moe_config *c) {
    int64_t n = 0;
    for (int64_t i = 0; i < c->layers; i++) n += !tpk_qwen2_moe_sparse(c, i);
    return n;
}
/* The model's mlp_2_at (tpk_lm_config): layer i dense, user the Qwen2-MoE config. */
static inline bool tpk__qwen2_moe_dense_at(const void *user, int64_t i) {
    return !tpk_qwen2_moe_sparse((const tpk_qwen2_moe_config *)user, i);
}

/* A Qwen2-MoE: its config (defaults applied) and the model (m.lm). */
typedef struct tpk_qwen2_moe {
    tpk_qwen2_moe_config c;
    tpk_lm lm;
} tpk_qwen2_moe;

/* The config fields a trainer sets by flag (tpk_lm_flag); --experts, --moe-top-k, --aux-coef,
 * --z-loss-coef, --capacity-factor, --kv-heads, --rope-theta and --norm-eps as Mixtral's. */
static inline const tpk_lm_flag *tpk_qwen2_moe_flags(int *n) {
    static const tpk_lm_flag f[] = {
        {"--experts", offsetof(tpk_qwen2_moe_config, experts), true, 1, 1e6, "E", "E (default 60)"},
        {"--moe-top-k", offsetof(tpk_qwen2_moe_config, top_k), true, 1, 1e6, "k", "k (default 4)"},
        {"--moe-ffn", offsetof(tpk_qwen2_moe_config, moe_ffn), true, 1, 1e9, "F",
         "F, each expert's (default 1408)"},
        {"--shared-ffn", offsetof(tpk_qwen2_moe_config, shared_ffn), true, 1, 1e9, "Fs",
         "F_s, the shared expert's (default 4F)"},
        {"--norm-topk-prob", offsetof(tpk_qwen2_moe_config, norm_topk_prob), true, 0, 1, NULL,
         "0|1: the top-k weights renormalised (default 0)"},
        {"--aux-coef", offsetof(tpk_qwen2_moe_config, aux_coef), false, -1, 1e6, NULL,
         "0.001 (< 0: none)"},
        {"--z-loss-coef", offsetof(tpk_qwen2_moe_config, z_coef), TPK_LM_FLAG_OPTION, 0, 1e6, NULL,
         "0 (none)"},
        {"--capacity-factor", offsetof(tpk_qwen2_moe_config, capacity_factor), TPK_LM_FLAG_OPTION,
         0, 1e6, NULL,
         "0 (dropless; c > 0: ceil(T k / E c) rows an expert, the lowest-weighted dropped)"},
        {"--decoder-sparse-step", offsetof(tpk_qwen2_moe_config, sparse_step), true, 1, 100000,
         NULL, "N: layer i sparse where (i + 1) % N is 0, else dense (default 1: all sparse)"},
        {"--mlp-only-layers", offsetof(tpk_qwen2_moe_config, mlp_only), TPK_LM_FLAG_LAYERS, 0, 0,
         NULL, "i,j: these layers dense whatever the step says (default none)"},
        {"--dense-ffn", offsetof(tpk_qwen2_moe_config, dense_ffn), true, 1, 1e9, NULL,
         "F_d, a dense layer's (default 4F)"},
        {"--kv-heads", offsetof(tpk_qwen2_moe_config, kv_heads), true, 1, 1e9, "G",
         "G (default --heads)"},
        {"--rope-theta", offsetof(tpk_qwen2_moe_config, rope_theta), false, 1.0001, 1e30, NULL,
         "1e6"},
        {"--norm-eps", offsetof(tpk_qwen2_moe_config, norm_eps), false, 1e-30, 0.5, NULL, "1e-6"}};
    *n = (int)(sizeof f / sizeof f[0]);
    return f;
}

/* Qwen2-MoE's block as the kit's block: Llama's with q, k, v biases and the MoE "mlp" (routed
 * experts named gate_proj, up_proj, down_proj, and the shared expert) as its MLP. */
static inline tpk_block_desc tpk_qwen2_moe_block_config(const tpk_llama_block_desc *d, int experts,
                                                        int top_k, bool renormalize,
                                                        int64_t shared_ffn, float aux_coef) {
    tpk_block_desc b = tpk_llama_block_config(d);
    b.attn.gqa.qkv_bias = true;
    memset(&b.mlp, 0, sizeof b.mlp);
    b.mlp.kind = TPK_MLP_MOE, b.mlp.name = "mlp";
    b.mlp.moe.experts = experts, b.mlp.moe.top_k = top_k, b.mlp.moe.hidden = d->ffn;
    b.mlp.moe.renormalize = renormalize, b.mlp.moe.aux_coef = aux_coef;
    b.mlp.moe.shared_hidden = shared_ffn, b.mlp.moe.proj_names = true;
    return b;
}

/* The model's config of a Qwen2-MoE config (checked; defaults applied to *cfg). With dense
 * layers the model's mlp_2 is their SwiGLU MLP, chosen by cfg itself (out->mlp_2_user = cfg: it
 * must outlive tpk_lm_init's use of out). */
static inline tpk_status tpk_qwen2_moe_lm_config(tpk_ctx *ctx, tpk_qwen2_moe_config *cfg,
                                                 tpk_lm_config *out) {
    static const char *fn = "tpk_qwen2_moe_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!cfg || !out) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", cfg ? "out" : "cfg");
    tpk_qwen2_moe_config *c = cfg;
    tpk__moe_fields mf = {&c->experts,        &c->top_k, &c->aux_coef,
                          c->capacity_factor, c->z_coef, c->dropout};
    TPK_TRY(tpk__moe_fields_check(ctx, fn, &mf, 60, 4));
    if (c->norm_topk_prob != 0 && c->norm_topk_prob != 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->norm_topk_prob: expected 0 (the softmax's weights) or 1 "
                         "(renormalised over the top k), got %lld",
                         (long long)c->norm_topk_prob);
    if (c->moe_ffn < 0 || c->moe_ffn > 1000000000)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->moe_ffn: expected 1..1e9 (0 = 1408), got %lld",
                         (long long)c->moe_ffn);
    if (!c->moe_ffn) c->moe_ffn = 1408;
    if (c->shared_ffn < 0 || c->shared_ffn > 1000000000)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->shared_ffn: expected 1..1e9 (0 = 4 cfg->moe_ffn), got %lld",
                         (long long)c->shared_ffn);
    if (!c->shared_ffn) c->shared_ffn = 4 * c->moe_ffn;
    if (c->dense_ffn < 0 || c->dense_ffn > 1000000000)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->dense_ffn: expected 1..1e9 (0 = 4 cfg->moe_ffn), got %lld",
                         (long long)c->dense_ffn);
    if (!c->dense_ffn) c->dense_ffn = 4 * c->moe_ffn;
    if (c->sparse_step < 0 || c->sparse_step > 100000)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->sparse_step: expected 1..100000 (0 = 1: every layer sparse), got "
                         "%lld",
                         (long long)c->sparse_step);
    if (!c->sparse_step) c->sparse_step = 1;
    if (c->rope_theta == 0) c->rope_theta = 1e6f;
    if (c->norm_eps == 0) c->norm_eps = 1e-6f;
    tpk_llama_config l;
    memset(&l, 0, sizeof l);
    l.vocab = c->vocab, l.positions = c->positions, l.layers = c->layers, l.hidden = c->hidden;
    l.heads = c->heads, l.part = c->part, l.kv_heads = c->kv_heads, l.ffn = c->moe_ffn;
    l.cp_comm = c->cp_comm;
    l.rope_theta = c->rope_theta, l.norm_eps = c->norm_eps;
    l.label_smoothing = c->label_smoothing, l.tie_embeddings = c->tie_embeddings;
    l.sequence_parallel = c->sequence_parallel;
    l.init_std = c->init_std, l.vocab_multiple = c->vocab_multiple, l.recompute = c->recompute;
    TPK_TRY(tpk_llama_lm_config(ctx, &l, out)); /* checks the shape, heads, recompute */
    c->kv_heads = l.kv_heads, c->init_std = l.init_std;
    int64_t last = tpk_layer_set_last(&c->mlp_only);
    if (last >= c->layers)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->mlp_only: layer %lld, expected layers below cfg->layers = %lld",
                         (long long)last, (long long)c->layers);
    tpk_llama_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = "model.layers", bd.heads = c->heads, bd.kv_heads = c->kv_heads, bd.ffn = c->moe_ffn;
    bd.rope_theta = c->rope_theta, bd.norm_eps = c->norm_eps, bd.init_std = c->init_std;
    out->block =
        tpk_qwen2_moe_block_config(&bd, (int)c->experts, (int)c->top_k, c->norm_topk_prob != 0,
                                   c->shared_ffn, c->aux_coef > 0 ? c->aux_coef : 0.f);
    tpk__moe_fields_apply(&mf, out);
    if (tpk_qwen2_moe_dense_layers(c)) { /* the dense layers: Llama's SwiGLU MLP "mlp" of F_d */
        bd.ffn = c->dense_ffn;
        out->mlp_2 = tpk_llama_block_config(&bd).mlp;
        out->mlp_2_at = tpk__qwen2_moe_dense_at, out->mlp_2_user = c;
    }
    return TPK_OK;
}

static inline tpk_status tpk_qwen2_moe_init(tpk_ctx *ctx, tpk_qwen2_moe *m,
                                            const tpk_qwen2_moe_config *cfg) {
    TPK_TRY(tpk__lm_family_args(ctx, "tpk_qwen2_moe_init", m, cfg));
    tpk_lm_config lc;
    memset(m, 0, sizeof *m), m->c = *cfg;
    TPK_TRY(tpk_qwen2_moe_lm_config(ctx, &m->c, &lc));
    return tpk_lm_init(ctx, &m->lm, &lc);
}

#endif /* TPK_QWEN2_MOE_H */
