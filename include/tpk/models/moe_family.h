/* tpk/models/moe_family.h — what the mixture-of-experts families (Mixtral: mixtral.h, Qwen2-MoE:
 * qwen2_moe.h) share: the router's and the MoE block's options of their configs (the experts,
 * top-k, the load-balancing loss's coefficient, the capacity factor, the routers' z-loss) and
 * their dropout, checked and defaulted in one place and set on the model's config. Each family's
 * own (its block, its names, its sizes, its trainer flags) stays in its header. */
#ifndef TPK_MOE_FAMILY_H
#define TPK_MOE_FAMILY_H

#include "llama.h"

/* The fields a mixture-of-experts family's config has alike: pointers into it. */
typedef struct tpk__moe_fields {
    int64_t *experts;      /* E, a multiple of the EP size; 0: the family's default */
    int64_t *top_k;        /* k, 1..E; 0: the family's default */
    float *aux_coef;       /* router_aux_loss_coef; 0: 0.001 (Hugging Face's default), < 0: none */
    float capacity_factor; /* 0: dropless; c > 0: ceil(T k / E c) rows an expert */
    float z_coef;          /* the routers' z-loss coefficient; 0: none */
    float dropout;         /* GPT-2's sites; 0: none */
} tpk__moe_fields;

/* f checked (fn names the family's init), the family's defaults applied: def_experts, def_top_k
 * and aux_coef 0.001. */
static inline tpk_status tpk__moe_fields_check(tpk_ctx *ctx, const char *fn,
                                               const tpk__moe_fields *f, int64_t def_experts,
                                               int64_t def_top_k) {
    if (*f->experts == 0) *f->experts = def_experts;
    if (*f->top_k == 0) *f->top_k = def_top_k;
    int ep = ctx->ep.vt ? ctx->ep.size : 1;
    if (*f->experts < 1 || *f->experts > 1000000 || *f->experts % ep)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->experts: expected a positive multiple of the EP size %d (every EP "
                         "rank holds experts / ep of them), got %lld",
                         ep, (long long)*f->experts);
    if (*f->top_k < 1 || *f->top_k > *f->experts)
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->top_k: expected 1..cfg->experts = 1..%lld, got %lld",
                         (long long)*f->experts, (long long)*f->top_k);
    if (!isfinite(*f->aux_coef))
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->aux_coef: expected a finite value, got %g",
                         (double)*f->aux_coef);
    if (*f->aux_coef == 0) *f->aux_coef = 0.001f;
    if (!(f->capacity_factor >= 0) || isinf(f->capacity_factor))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->capacity_factor: expected a finite value >= 0 (0: dropless), got %g",
                         (double)f->capacity_factor);
    if (!(f->z_coef >= 0) || isinf(f->z_coef))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->z_coef: expected a finite value >= 0 (0: no z-loss), got %g",
                         (double)f->z_coef);
    return tpk__lm_check_dropout(ctx, fn, f->dropout);
}

/* The MoE block's options (the family's block config set block.mlp: the experts, top-k, its aux
 * coefficient) and the dropout sites from f, on the model's config. */
static inline void tpk__moe_fields_apply(const tpk__moe_fields *f, tpk_lm_config *out) {
    out->block.mlp.moe.capacity_factor = f->capacity_factor, out->block.mlp.moe.z_coef = f->z_coef;
    out->block.dropout = f->dropout, out->dropout_sites = true;
}

#endif /* TPK_MOE_FAMILY_H */
