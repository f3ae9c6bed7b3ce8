/* tpk/models/gpt2.h — GPT-2 as a configuration of the kit's language model (tpk/models/lm.h),
 * tensor-parallel, with optional sequence parallelism.
 *
 * Block (pre-LN, sequential residual: tpk/models/block.h), hidden states x R [T, H] (S(0) under
 * sequence parallelism):
 *   x1 = x  + drop(attn(ln_1(x)))          attn: c_attn column (fused [Q; K; V]), heads local,
 *                                          c_proj row (the add fused with ln_2)
 *   y  = x1 + drop(mlp(ln_2(x1)))          mlp:  c_fc column, GELU (tanh form), c_proj row
 *   backward mirrors it: dx1 = dy + ln_2'(mlp'(drop(dy))), dx = dx1 + ln_1'(attn'(drop(dx1))).
 *   Collectives per block: 2 all-reduces of T H forward and 2 backward (the two row linears
 *   forward, the two column linears backward); under SP 2 all-gathers + 2 reduce-scatters of
 *   T H each way instead, and 2 more all-gathers backward (the column linears' inputs again).
 *   Residual dropout masks are indexed by the global (token, feature) and drawn from a TP-shared
 *   stream, so they are the same at every t and with SP on or off.
 * Model: ids -> wte (vocabulary-parallel) + wpe -> drop -> L blocks -> ln_f -> logits = h wteᵀ
 *   (the tied LM head: a column linear over wte's vocabulary shard, logits S(-1) [T, V_r])
 *   -> vocabulary-parallel cross-entropy (mean over counted positions).
 * Parameter names are Hugging Face GPT-2's (without the "transformer." prefix): wte.weight,
 * wpe.weight, h.<i>.ln_1, h.<i>.attn.c_attn, h.<i>.attn.c_proj, h.<i>.ln_2, h.<i>.mlp.c_fc,
 * h.<i>.mlp.c_proj, ln_f; weights are stored [out, in] (Hugging Face's Conv1D is [in, out]).
 * Under SP the layernorm gradients are partial over TP: call tpk_params_reduce_partial_grads
 * once per optimizer step, after the last backward. This file holds what is GPT-2's own: its
 * config, its block as a tpk_block_desc, its names; everything else is the model's (tpk_lm_*). */
#ifndef TPK_GPT2_H
#define TPK_GPT2_H

#include "lm.h"

/* ---- block ----------------------------------------------------------------------------------- */

typedef struct tpk_gpt2_block_desc {
    const char *name;       /* default "h<N>": parameters "<name>.ln_1.weight", ... */
    int64_t heads;          /* A (required) */
    int64_t mlp_hidden;     /* default 4 H */
    float dropout;          /* attention probabilities and both residual branches */
    float ln_eps;           /* default 1e-5 */
    bool sequence_parallel;
    float init_std;         /* default 0.02 */
    float proj_init_std;    /* the two c_proj weights; default init_std */
} tpk_gpt2_block_desc;

/* GPT-2's block as the kit's block: layernorms ln_1 and ln_2, the fused-QKV attention "attn"
 * (c_attn, c_proj), the GELU-tanh MLP "mlp" (c_fc, c_proj), the sequential residual. */
static inline tpk_block_desc tpk_gpt2_block_config(const tpk_gpt2_block_desc *d) {
    tpk_block_desc b;
    memset(&b, 0, sizeof b);
    b.name = d->name, b.heads = d->heads, b.residual = TPK_RESIDUAL_SEQUENTIAL;
    b.norm_1.kind = b.norm_2.kind = TPK_NORM_LAYERNORM;
    b.norm_1.eps = b.norm_2.eps = d->ln_eps;
    b.norm_1.name = "ln_1", b.norm_2.name = "ln_2";
    b.attn.kind = TPK_ATTN_FUSED, b.attn.name = "attn";
    b.mlp.kind = TPK_MLP_ACT, b.mlp.name = "mlp", b.mlp.act.hidden = d->mlp_hidden;
    b.dropout = d->dropout, b.sequence_parallel = d->sequence_parallel;
    b.init_std = d->init_std, b.proj_init_std = d->proj_init_std;
    return b;
}

/* A GPT-2 block alone (the model builds its own): tpk_block_forward, _backward and _destroy run
 * it. */
static inline tpk_status tpk_gpt2_block_init(tpk_ctx *ctx, tpk_block *b, int64_t H,
                                             const tpk_gpt2_block_desc *desc) {
    static const char *fn = "tpk_gpt2_block_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    if (!desc) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc: NULL (desc->heads is required)");
    tpk_block_desc bd = tpk_gpt2_block_config(desc);
    char name[80];
    TPK_TRY(tpk__layer_name(ctx, fn, name, sizeof name, desc->name, "h"));
    bd.name = name;
    return tpk_block_init(ctx, b, H, &bd);
}

/* ---- model ----------------------------------------------------------------------------------- */

typedef struct tpk_gpt2_config {
    int64_t vocab;          /* V (need not divide t) */
    int64_t positions;      /* the longest sequence: wpe's rows */
    int64_t layers;         /* L */
    int64_t hidden;         /* H */
    int64_t heads;          /* A (need not divide t) */
    tpk_lm_part part;       /* the part built (pipeline stages); zeros: all */
    float dropout;          /* embedding, attention and residual dropout; 0 = none */
    float ln_eps;           /* default 1e-5 */
    float label_smoothing;  /* over the global vocabulary */
    bool sequence_parallel;
    float init_std;         /* default 0.02; the c_proj weights use init_std / sqrt(2 L) */
    int64_t vocab_multiple; /* wte's shards padded to a multiple of this many rows
                               (tpk/layers/embed.h), so the LM head's GEMMs have aligned leading
                               dimensions; 0: 64, < 0: none */
    tpk_recompute recompute; /* TPK_RECOMPUTE_FULL: keep only each block's input, run its forward
                               again in the backward; _SELECTIVE: keep the GEMM outputs, recompute
                               the norms and the attention (tpk/layers/recompute.h); the same
                               numbers */
    tpk_cp_comm cp_comm;    /* the attention under context parallelism (ctx->cp): TPK_CP_P2P (the
                               ring, default) or TPK_CP_ALLGATHER (tpk/layers/cp_attn.h) */
} tpk_gpt2_config;

/* A GPT-2: its config (defaults applied) and the model (m.lm: tpk_lm_forward, _backward, ...). */
typedef struct tpk_gpt2 {
    tpk_gpt2_config c;
    tpk_lm lm; /* its grad_ready hook is called with ln_f, each block from the last, wte and wpe */
} tpk_gpt2;

/* The model's config of a GPT-2 config (checked; defaults applied to *cfg). */
static inline tpk_status tpk_gpt2_lm_config(tpk_ctx *ctx, tpk_gpt2_config *cfg,
                                            tpk_lm_config *out) {
    static const char *fn = "tpk_gpt2_init";
    tpk_gpt2_config *c = cfg;
    TPK_TRY(tpk__lm_check_shape(ctx, fn, c->layers, c->positions, c->hidden, c->heads));
    TPK_TRY(tpk__lm_check_dropout(ctx, fn, c->dropout));
    TPK_TRY(tpk__lm_check_recompute(ctx, fn, c->recompute));
    if (c->init_std <= 0) c->init_std = 0.02f;
    tpk_gpt2_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = "h", bd.heads = c->heads, bd.dropout = c->dropout, bd.ln_eps = c->ln_eps;
    bd.init_std = c->init_std, bd.proj_init_std = c->init_std / sqrtf(2.0f * (float)c->layers);
    memset(out, 0, sizeof *out);
    out->vocab = c->vocab, out->positions = c->positions, out->layers = c->layers;
    out->hidden = c->hidden, out->block = tpk_gpt2_block_config(&bd);
    out->final_norm.kind = TPK_NORM_LAYERNORM, out->final_norm.name = "ln_f";
    out->final_norm.eps = c->ln_eps;
    out->embed_name = "wte.weight", out->pos_name = "wpe.weight";
    out->head_name = "lm_head.weight", out->tie_embeddings = true, out->dropout_sites = true;
    out->label_smoothing = c->label_smoothing, out->init_std = c->init_std;
    out->vocab_multiple = c->vocab_multiple, out->sequence_parallel = c->sequence_parallel;
    out->recompute = c->recompute, out->part = c->part, out->cp_comm = c->cp_comm;
    return TPK_OK;
}

static inline tpk_status tpk_gpt2_init(tpk_ctx *ctx, tpk_gpt2 *m, const tpk_gpt2_config *cfg) {
    TPK_TRY(tpk__lm_family_args(ctx, "tpk_gpt2_init", m, cfg));
    tpk_lm_config lc;
    memset(m, 0, sizeof *m), m->c = *cfg;
    TPK_TRY(tpk_gpt2_lm_config(ctx, &m->c, &lc));
    return tpk_lm_init(ctx, &m->lm, &lc);
}

/* The config fields a trainer sets by flag (tpk_lm_flag): none beyond the shape. */
static inline const tpk_lm_flag *tpk_gpt2_flags(int *n) {
    return *n = 0, (const tpk_lm_flag *)NULL;
}

#endif /* TPK_GPT2_H */
