/* tpk/models/gpt2.h — the GPT-2 block and model, tensor-parallel, with optional sequence
 * parallelism.
 *
 * Block (pre-LN), hidden states x R [T, H] (S(0) under sequence parallelism):
 *   x1 = x  + drop(attn(ln_1(x)))          attn: c_attn column, heads local, c_proj row
 *                                          (the add fused with ln_2: residual_layernorm_fwd)
 *   y  = x1 + drop(mlp(ln_2(x1)))          mlp:  c_fc column, GELU, c_proj row
 *   backward mirrors it: dx1 = dy + ln_2'(mlp'(drop(dy))), dx = dx1 + ln_1'(attn'(drop(dx1))).
 *   The residuals and their dropout are tpk_residual layers (tpk/layers/resid.h), the embedding
 *   dropout a tpk_dropout; the block and the model call no op themselves.
 *   Collectives per block: 2 all-reduces of T H forward and 2 backward (the two row linears
 *   forward, the two column linears backward); under SP 2 all-gathers + 2 reduce-scatters of
 *   T H each way instead, and 2 more all-gathers backward (the column linears' inputs again:
 *   a layer keeps only its S(0) tokens, the gathered copies live in the shared ctx->sp). Residual
 *   dropout masks are indexed by the global (token, feature) and drawn from a TP-shared stream, so
 *   they are the same at every t and with SP on or off.
 * Model: ids -> wte (vocabulary-parallel) + wpe -> drop -> L blocks -> ln_f -> logits = h wteᵀ
 *   (the tied LM head: a column linear over wte's vocabulary shard, logits S(-1) [T, V_r])
 *   -> vocabulary-parallel cross-entropy (mean over counted positions): the skeleton of
 *   tpk/models/lm.h, which also runs the block's backward and recompute; this file holds what is
 *   GPT-2's own — the block's parts, init and forward, its buffer lists, the config, the names.
 * Parameter names are Hugging Face GPT-2's (without the "transformer." prefix): wte.weight,
 * wpe.weight, h.<i>.ln_1, h.<i>.attn.c_attn, h.<i>.attn.c_proj, h.<i>.ln_2, h.<i>.mlp.c_fc,
 * h.<i>.mlp.c_proj, ln_f; weights are stored [out, in] (Hugging Face's Conv1D is [in, out]).
 * Under SP the layernorm gradients are partial over TP: call tpk_params_reduce_partial_grads
 * once per optimizer step, after the last backward. */
#ifndef TPK_GPT2_H
#define TPK_GPT2_H

#include "../layers/attn.h"
#include "../layers/mlp.h"
#include "../layers/norm.h"
#include "lm.h"
#include "sample.h"

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

typedef struct tpk_gpt2_block {
    char name[80];
    int64_t H;
    bool sp;
    tpk_layernorm ln_1, ln_2;
    tpk_attention attn;
    tpk_mlp mlp;
    tpk_residual res_1, res_2; /* x1 = x + drop(attn), y = x1 + drop(mlp) */
    int p0, p1;                /* its parameters are ids p0..p1 */
} tpk_gpt2_block;

static inline tpk_status tpk_gpt2_block_init(tpk_ctx *ctx, tpk_gpt2_block *b, int64_t H,
                                             const tpk_gpt2_block_desc *desc) {
    static const char *fn = "tpk_gpt2_block_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!b) return tpk__fail(ctx, TPK_ERR_ARG, fn, "layer: NULL");
    if (!desc) return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc: NULL (desc->heads is required)");
    memset(b, 0, sizeof *b);
    tpk_gpt2_block_desc d = *desc;
    if (!(d.dropout >= 0.0f && d.dropout < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "desc->dropout: expected 0 <= p < 1, got %g",
                         (double)d.dropout);
    TPK_TRY(tpk__layer_name(ctx, fn, b->name, sizeof b->name, d.name, "h"));
    b->H = H, b->sp = d.sequence_parallel;
    tpk__params_mark(ctx); /* the block's ids, new or (a copy) reused */
    char n[128];
    snprintf(n, sizeof n, "%s.ln_1", b->name);
    tpk_layernorm_desc lnd;
    memset(&lnd, 0, sizeof lnd);
    lnd.name = n, lnd.eps = d.ln_eps, lnd.sequence_parallel = d.sequence_parallel;
    TPK_TRY(tpk_layernorm_init(ctx, &b->ln_1, H, &lnd));
    snprintf(n, sizeof n, "%s.attn", b->name);
    tpk_attention_desc ad;
    memset(&ad, 0, sizeof ad);
    ad.name = n, ad.sequence_parallel = d.sequence_parallel, ad.dropout = d.dropout,
    ad.init_std = d.init_std, ad.proj_init_std = d.proj_init_std;
    TPK_TRY(tpk_attention_init(ctx, &b->attn, H, d.heads, &ad));
    snprintf(n, sizeof n, "%s.ln_2", b->name);
    TPK_TRY(tpk_layernorm_init(ctx, &b->ln_2, H, &lnd));
    snprintf(n, sizeof n, "%s.mlp", b->name);
    tpk_mlp_desc md;
    memset(&md, 0, sizeof md);
    md.name = n, md.hidden = d.mlp_hidden, md.sequence_parallel = d.sequence_parallel,
    md.init_std = d.init_std, md.proj_init_std = d.proj_init_std;
    TPK_TRY(tpk_mlp_init(ctx, &b->mlp, H, &md));
    TPK_TRY(tpk__block_residuals(ctx, b->name, d.dropout, &b->res_1, &b->res_2));
    tpk__params_marked(ctx, &b->p0, &b->p1);
    return TPK_OK;
}

/* y = block(x) for B sequences of S tokens: x R [B S, H] (S(0) under sequence parallelism), y
 * the same layout. x must stay unchanged until backward. */
static inline tpk_status tpk_gpt2_block_forward(tpk_ctx *ctx, tpk_gpt2_block *b, tpk_tensor x,
                                                int64_t B, int64_t S, tpk_tensor *y) {
    static const char *fn = "tpk_gpt2_block_forward";
    TPK_TRY(tpk__lm_block_args(ctx, fn, b ? b->H : 0, y));
    tpk_tensor h, a, x1, m;
    TPK_TRY(tpk_layernorm_forward(ctx, &b->ln_1, x, &h)); /* checks x: layout, [T, H] */
    TPK_TRY(tpk_attention_forward(ctx, &b->attn, h, B, S, &a));
    /* drop(a) in place: c_proj's output, not kept */
    TPK_TRY(tpk_residual_branch_forward(ctx, &b->res_1, &a));
    /* x1 = x + drop(a), h = ln_2(x1): one pass */
    TPK_TRY(tpk_layernorm_forward_residual(ctx, &b->ln_2, x, a, &x1, &h));
    TPK_TRY(tpk_mlp_forward(ctx, &b->mlp, h, &m));
    /* y = x1 + drop(m), in c_proj's output */
    return tpk_residual_forward(ctx, &b->res_2, x1, m, y);
}

/* The backward (tpk__gpt2_block_backward, in place or not), the buffer lists by recompute set
 * (tpk__gpt2_block_bufs: each layer's own, tpk/runtime/buf.h) and the selective recompute are the
 * skeleton's pre-norm residual block's (tpk/models/lm.h), through these adapters. */
TPK__LM_ADAPTERS(gpt2, tpk_gpt2_block, ln_1, ln_2, layernorm, b, attention, mlp)

/* ---- model ----------------------------------------------------------------------------------- */

typedef struct tpk_gpt2_config {
    TPK__LM_CONFIG_SHAPE /* vocab, positions, layers, hidden, heads */
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
} tpk_gpt2_config;

typedef struct tpk_gpt2 {
    tpk_gpt2_config c;
    tpk_embedding wte;      /* wte and wpe */
    tpk_gpt2_block *h;      /* [L] */
    tpk_layernorm ln_f;
    int head_w;             /* the LM head's weight: wte's id (tied) */
    tpk_linear lm_head;     /* column linear over wte's shard (tied) */
    tpk_xent ce;
    tpk_dropout drop;       /* on the embedding's output ("drop") */
    tpk_tensor logits;      /* S(-1) [B S, Vp] of the last forward (gradient after backward); Vp =
                               wte.Vp >= V, the columns >= V padding (zero logits, not part of the
                               softmax: tpk_sample_logits takes V) */
    tpk_lm lm;              /* the skeleton's state (tpk/models/lm.h): its grad_ready hook is called
                               with ln_f, then each block from the last, then wte and wpe */
} tpk_gpt2;

/* GPT-2 as a family of the skeleton (tpk/models/lm.h). */
static inline tpk_status tpk__gpt2_lm_block_init(tpk_ctx *ctx, void *b, int64_t H, const char *name,
                                                 const void *cfg) {
    const tpk_gpt2_config *c = (const tpk_gpt2_config *)cfg;
    tpk_gpt2_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.name = name, bd.heads = c->heads, bd.dropout = c->dropout, bd.ln_eps = c->ln_eps,
    bd.sequence_parallel = c->sequence_parallel;
    bd.init_std = c->init_std, bd.proj_init_std = c->init_std / sqrtf(2.0f * (float)c->layers);
    return tpk_gpt2_block_init(ctx, (tpk_gpt2_block *)b, H, &bd);
}
static inline tpk__lm_parts tpk__gpt2_lm(tpk_gpt2 *m) {
    static const tpk_lm_family family = TPK__LM_FAMILY_ROW(
        gpt2, tpk_gpt2_block, "wte.weight", "wpe.weight", "h", "ln_f", "lm_head.weight");
    tpk__lm_parts p = {&family, &m->lm,   m->c.layers, m->c.recompute, &m->wte, &m->drop,
                       m->h,    &m->ln_f, &m->head_w,  &m->lm_head,    &m->ce,  &m->logits};
    return p;
}

/* tpk_gpt2_forward, _backward, _generate, _sample and _destroy (and tpk__gpt2_lm_init,
 * tpk__gpt2_bufs) are the skeleton's (tpk/models/lm.h, with tpk/models/sample.h). */
TPK__LM_MODEL_ENTRIES(gpt2, h)

static inline tpk_status tpk_gpt2_init(tpk_ctx *ctx, tpk_gpt2 *m, const tpk_gpt2_config *cfg) {
    static const char *fn = "tpk_gpt2_init";
    TPK_TRY(tpk__lm_init_args(ctx, fn, m, cfg));
    memset(m, 0, sizeof *m);
    tpk_gpt2_config c = *cfg;
    TPK_TRY(tpk__lm_check_shape(ctx, fn, c.layers, c.positions, c.hidden, c.heads));
    if (!(c.dropout >= 0.0f && c.dropout < 1.0f))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->dropout: expected 0 <= p < 1, got %g",
                         (double)c.dropout);
    TPK_TRY(tpk__lm_check_recompute(ctx, fn, c.recompute));
    if (c.init_std <= 0) c.init_std = 0.02f;
    m->c = c;
    tpk__lm_dims d = {c.vocab,          c.positions,         c.layers,   c.hidden,
                      c.vocab_multiple, c.label_smoothing,   c.init_std, c.ln_eps,
                      c.dropout,        c.sequence_parallel, true};
    return tpk__gpt2_lm_init(ctx, fn, m, &d);
}

/* The config fields a trainer sets by flag (tpk_lm_flag): none beyond the shape. */
static inline const tpk_lm_flag *tpk_gpt2_flags(int *n) {
    return *n = 0, (const tpk_lm_flag *)NULL;
}

/* Set the dropout probability of every dropout site (0 for evaluation and sampling). */
static inline void tpk_gpt2_set_dropout(tpk_gpt2 *m, float p) {
    m->c.dropout = p;
    m->drop.p = p;
    for (int64_t i = 0; m->h && i < m->c.layers; i++)
        m->h[i].attn.p = m->h[i].res_1.drop.p = m->h[i].res_2.drop.p = p;
}

#endif /* TPK_GPT2_H */
