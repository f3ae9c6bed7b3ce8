/* tpk/train/model.h — one handle over the kit's model families (tpk/models/families.h: GPT-2,
 * Llama, GPT-NeoX, Mixtral, Qwen2-MoE), for a trainer that takes any: the family chosen by a flag
 * or by a checkpoint's config.json ("model_type"), then the same calls for all — forward,
 * backward, the data-parallel hook, dropout, sampling, Hugging Face checkpoints. Every family is a
 * configuration of one model (tpk_lm, tpk/models/lm.h): the computing calls go straight to it
 * (tpk_model_lm); what differs — the config, its flags, the checkpoint's names and config.json —
 * is one switch on the family, and the families' names are one table of values. Nothing here
 * computes. Needs POSIX (tpk/train/hf.h). */
#ifndef TPK_MODEL_H
#define TPK_MODEL_H

#include "hf.h"

/* TPK_ARCH_MIXTRAL: Llama with a mixture of experts (tpk/models/mixtral.h).
 * TPK_ARCH_QWEN2_MOE: Qwen2's attention with a mixture of experts and a shared expert
 * (tpk/models/qwen2_moe.h).
 * TPK_ARCH_CUSTOM: a model of one's own, its tpk_lm_config given whole (cfg.custom) */
typedef enum tpk_arch {
    TPK_ARCH_GPT2,
    TPK_ARCH_LLAMA,
    TPK_ARCH_NEOX,
    TPK_ARCH_MIXTRAL,
    TPK_ARCH_QWEN2_MOE,
    TPK_ARCH_CUSTOM,
    TPK_ARCH_COUNT
} tpk_arch;

/* The config of the family cfg.arch is used. */
typedef struct tpk_model_config {
    tpk_arch arch;
    tpk_gpt2_config gpt2;
    tpk_llama_config llama;
    tpk_neox_config neox;
    tpk_mixtral_config mixtral;
    tpk_qwen2_moe_config qwen2_moe;
    tpk_lm_config custom; /* its strings (names) must outlive the models built from it */
} tpk_model_config;

/* The model of the family m.arch is built (each a config and the model, tpk_lm). */
typedef struct tpk_model {
    tpk_arch arch;
    tpk_gpt2 gpt2;
    tpk_llama llama;
    tpk_neox neox;
    tpk_mixtral mixtral;
    tpk_qwen2_moe qwen2_moe;
    tpk_lm custom;
} tpk_model;

/* A family's names and flags. */
typedef struct tpk_model_family {
    const char *name;       /* --arch */
    const char *model_type; /* config.json's */
    const char *title;      /* in print: "GPT-2" */
    bool dropout;           /* has dropout sites */
    const tpk_lm_flag *(*flags)(int *n); /* its config fields set by a trainer's flags */
} tpk_model_family;

/* A custom model's config fields set by flag: none (its program owns its config). */
static inline const tpk_lm_flag *tpk__custom_flags(int *n) {
    return *n = 0, (const tpk_lm_flag *)NULL;
}
/* The families, indexed by tpk_arch (NULL: no such family). */
static inline const tpk_model_family *tpk__model_family(tpk_arch a) {
    static const tpk_model_family families[TPK_ARCH_COUNT] = {
        {"gpt2", "gpt2", "GPT-2", true, tpk_gpt2_flags},
        {"llama", "llama", "Llama", false, tpk_llama_flags},
        {"neox", "gpt_neox", "GPT-NeoX", true, tpk_neox_flags},
        {"mixtral", "mixtral", "Mixtral", true, tpk_mixtral_flags},
        {"qwen2_moe", "qwen2_moe", "Qwen2-MoE", true, tpk_qwen2_moe_flags},
        {"custom", "tpk_custom", "custom", false, tpk__custom_flags}};
    return (unsigned)a < TPK_ARCH_COUNT ? &families[a] : NULL;
}
/* The config of cfg->arch's family (the member tpk_model_config holds for it). */
static inline void *tpk__model_cfg(tpk_model_config *c) {
    switch (c->arch) {
    case TPK_ARCH_LLAMA: return &c->llama;
    case TPK_ARCH_NEOX: return &c->neox;
    case TPK_ARCH_MIXTRAL: return &c->mixtral;
    case TPK_ARCH_QWEN2_MOE: return &c->qwen2_moe;
    case TPK_ARCH_CUSTOM: return &c->custom;
    default: return &c->gpt2;
    }
}
/* The built model's family config (defaults applied). */
static inline void *tpk__model_built_cfg(tpk_model *m) {
    switch (m->arch) {
    case TPK_ARCH_LLAMA: return &m->llama.c;
    case TPK_ARCH_NEOX: return &m->neox.c;
    case TPK_ARCH_MIXTRAL: return &m->mixtral.c;
    case TPK_ARCH_QWEN2_MOE: return &m->qwen2_moe.c;
    case TPK_ARCH_CUSTOM: return &m->custom.c;
    default: return &m->gpt2.c;
    }
}
/* The model of any family: the kit's language model (tpk/models/lm.h). */
static inline tpk_lm *tpk_model_lm(tpk_model *m) {
    switch (m->arch) {
    case TPK_ARCH_LLAMA: return &m->llama.lm;
    case TPK_ARCH_NEOX: return &m->neox.lm;
    case TPK_ARCH_MIXTRAL: return &m->mixtral.lm;
    case TPK_ARCH_QWEN2_MOE: return &m->qwen2_moe.lm;
    case TPK_ARCH_CUSTOM: return &m->custom;
    default: return &m->gpt2.lm;
    }
}
#define TPK__FAM(m) tpk__model_family((m)->arch)

/* The fields every family's config has, of cfg->arch's config: shape[0..4] = vocab, positions,
 * layers, hidden, heads (pointers into it); and its label smoothing, sequence parallelism and
 * recompute mode and pipeline part (pointers; any may be NULL). */
static inline void tpk__model_common(tpk_model_config *cfg, int64_t *shape[5], float **ls,
                                     bool **sp, tpk_recompute **rc, tpk_lm_part **part) {
    int64_t *v[5];
    float *l;
    bool *s;
    tpk_recompute *r;
    tpk_lm_part *p;
    switch (cfg->arch) {
    case TPK_ARCH_LLAMA: {
        tpk_llama_config *c = &cfg->llama;
        v[0] = &c->vocab, v[1] = &c->positions, v[2] = &c->layers, v[3] = &c->hidden;
        v[4] = &c->heads, l = &c->label_smoothing, s = &c->sequence_parallel, r = &c->recompute;
        p = &c->part;
        break;
    }
    case TPK_ARCH_NEOX: {
        tpk_neox_config *c = &cfg->neox;
        v[0] = &c->vocab, v[1] = &c->positions, v[2] = &c->layers, v[3] = &c->hidden;
        v[4] = &c->heads, l = &c->label_smoothing, s = &c->sequence_parallel, r = &c->recompute;
        p = &c->part;
        break;
    }
    case TPK_ARCH_MIXTRAL: {
        tpk_mixtral_config *c = &cfg->mixtral;
        v[0] = &c->vocab, v[1] = &c->positions, v[2] = &c->layers, v[3] = &c->hidden;
        v[4] = &c->heads, l = &c->label_smoothing, s = &c->sequence_parallel, r = &c->recompute;
        p = &c->part;
        break;
    }
    case TPK_ARCH_QWEN2_MOE: {
        tpk_qwen2_moe_config *c = &cfg->qwen2_moe;
        v[0] = &c->vocab, v[1] = &c->positions, v[2] = &c->layers, v[3] = &c->hidden;
        v[4] = &c->heads, l = &c->label_smoothing, s = &c->sequence_parallel, r = &c->recompute;
        p = &c->part;
        break;
    }
    case TPK_ARCH_CUSTOM: {
        tpk_lm_config *c = &cfg->custom;
        v[0] = &c->vocab, v[1] = &c->positions, v[2] = &c->layers, v[3] = &c->hidden;
        v[4] = &c->block.heads, l = &c->label_smoothing, s = &c->sequence_parallel;
        r = &c->recompute, p = &c->part;
        break;
    }
    default: {
        tpk_gpt2_config *c = &cfg->gpt2;
        v[0] = &c->vocab, v[1] = &c->positions, v[2] = &c->layers, v[3] = &c->hidden;
        v[4] = &c->heads, l = &c->label_smoothing, s = &c->sequence_parallel, r = &c->recompute;
        p = &c->part;
        break;
    }
    }
    if (shape)
        for (int i = 0; i < 5; i++) shape[i] = v[i];
    if (ls) *ls = l;
    if (sp) *sp = s;
    if (rc) *rc = r;
    if (part) *part = p;
}

/* The family named `name` (--arch) or, by_type, whose config.json model_type is `name`. */
static inline bool tpk_arch_from_name(const char *name, bool by_type, tpk_arch *a) {
    for (int i = 0; name && i < TPK_ARCH_COUNT; i++) {
        const tpk_model_family *f = tpk__model_family((tpk_arch)i);
        if (!strcmp(name, by_type ? f->model_type : f->name)) return *a = (tpk_arch)i, true;
    }
    return false;
}
/* The fields every family's config has, of cfg->arch's config: shape[0..4] = vocab, positions,
 * layers, hidden, heads (pointers into it); and its label smoothing, sequence parallelism and
 * recompute mode set. */
static inline void tpk_model_config_common(tpk_model_config *cfg, int64_t *shape[5],
                                           float label_smoothing, bool sequence_parallel,
                                           tpk_recompute recompute) {
    float *ls;
    bool *sp;
    tpk_recompute *rc;
    tpk__model_common(cfg, shape, &ls, &sp, &rc, NULL);
    *ls = label_smoothing, *sp = sequence_parallel, *rc = recompute;
}

/* Family a's config flag named `flag` (tpk_lm_flag: "--kv-heads", ...); a = TPK_ARCH_COUNT: any
 * family's. NULL: none. */
static inline const tpk_lm_flag *tpk_model_flag(tpk_arch a, const char *flag) {
    int k0 = a == TPK_ARCH_COUNT ? 0 : (int)a, k1 = a == TPK_ARCH_COUNT ? (int)a : (int)a + 1;
    for (int k = k0; k < k1; k++) {
        int n = 0;
        const tpk_lm_flag *f = tpk__model_family((tpk_arch)k)->flags(&n);
        for (int i = 0; i < n; i++)
            if (!strcmp(f[i].flag, flag)) return &f[i];
    }
    return NULL;
}

/* Whether family a's blocks are a mixture of experts (its experts split over --ep). */
static inline bool tpk_arch_has_experts(tpk_arch a) {
    return a == TPK_ARCH_MIXTRAL || a == TPK_ARCH_QWEN2_MOE;
}

static inline const char *tpk_arch_name(tpk_arch a) {
    return tpk__model_family(a) ? tpk__model_family(a)->name : "?";
}

/* cfg->arch and that family's config from dir/config.json (its model_type: "gpt2", "llama",
 * "gpt_neox", "mixtral", "qwen2_moe"). */
static inline tpk_status tpk_model_config_read(tpk_ctx *ctx, const char *dir,
                                               tpk_model_config *cfg) {
    char type[32];
    if (ctx && !cfg) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_model_config_read", "cfg: NULL");
    TPK_TRY(tpk_hf_model_type(ctx, dir, type, sizeof type));
    if (!tpk_arch_from_name(type, true, &cfg->arch))
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, "tpk_model_config_read",
                         "%s: model_type \"%s\": no family of the kit", dir, type);
    switch (cfg->arch) {
    case TPK_ARCH_LLAMA: return tpk_llama_config_read(ctx, dir, &cfg->llama);
    case TPK_ARCH_NEOX: return tpk_neox_config_read(ctx, dir, &cfg->neox);
    case TPK_ARCH_MIXTRAL: return tpk_mixtral_config_read(ctx, dir, &cfg->mixtral);
    case TPK_ARCH_QWEN2_MOE: return tpk_qwen2_moe_config_read(ctx, dir, &cfg->qwen2_moe);
    case TPK_ARCH_CUSTOM:
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, "tpk_model_config_read",
                         "%s: a custom model's config is its program's (tpk_lm_config), not read "
                         "from config.json",
                         dir);
    default: return tpk_gpt2_config_read(ctx, dir, &cfg->gpt2);
    }
}

static inline tpk_status tpk_model_init(tpk_ctx *ctx, tpk_model *m, const tpk_model_config *cfg) {
    static const char *fn = "tpk_model_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", m ? "cfg" : "model");
    memset(m, 0, sizeof *m);
    m->arch = cfg->arch;
    switch (cfg->arch) {
    case TPK_ARCH_GPT2: return tpk_gpt2_init(ctx, &m->gpt2, &cfg->gpt2);
    case TPK_ARCH_LLAMA: return tpk_llama_init(ctx, &m->llama, &cfg->llama);
    case TPK_ARCH_NEOX: return tpk_neox_init(ctx, &m->neox, &cfg->neox);
    case TPK_ARCH_MIXTRAL: return tpk_mixtral_init(ctx, &m->mixtral, &cfg->mixtral);
    case TPK_ARCH_QWEN2_MOE: return tpk_qwen2_moe_init(ctx, &m->qwen2_moe, &cfg->qwen2_moe);
    case TPK_ARCH_CUSTOM: return tpk_lm_init(ctx, &m->custom, &cfg->custom);
    default:
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->arch: expected a family, 0..%d (tpk_arch), got %d",
                         (int)TPK_ARCH_COUNT - 1, (int)cfg->arch);
    }
}
static inline void tpk_model_destroy(tpk_ctx *ctx, tpk_model *m) {
    if (m && TPK__FAM(m)) tpk_lm_destroy(ctx, tpk_model_lm(m));
}

/* Sizes of the model as built. */
static inline int64_t tpk_model_vocab(const tpk_model *m) {
    return tpk_model_lm((tpk_model *)m)->c.vocab;
}
static inline int64_t tpk_model_positions(const tpk_model *m) {
    return tpk_model_lm((tpk_model *)m)->c.positions;
}
static inline int64_t tpk_model_layers(const tpk_model *m) {
    return tpk_model_lm((tpk_model *)m)->c.layers;
}
static inline int64_t tpk_model_hidden(const tpk_model *m) {
    return tpk_model_lm((tpk_model *)m)->c.hidden;
}

static inline tpk_status tpk_model_forward(tpk_ctx *ctx, tpk_model *m, const int32_t *ids,
                                           const int32_t *targets, int64_t B, int64_t S,
                                           float *loss) {
    return tpk_lm_forward(ctx, m ? tpk_model_lm(m) : NULL, ids, targets, B, S, loss);
}
/* A mixture of experts' load-balancing loss (its coefficient's share, tpk_lm_aux_read) of the
 * forwards made with loss = NULL since the last read, times `weight`, summed over ctx->dp into
 * *out (0 for a model without experts). Collective over the DP group. */
static inline tpk_status tpk_model_aux_dp(tpk_ctx *ctx, tpk_model *m, double weight, double *out) {
    *out = tpk_lm_aux_read(tpk_model_lm(m)) * weight;
    return tpk_allreduce_host(ctx, &ctx->dp, out, 1, TPK_F64, TPK_SUM);
}
/* The running loss sum of the forwards made with loss = NULL since the last read or reset, in
 * their order (tpk_xent_loss_read: one download when there was one, then the sum starts again);
 * *n (may be NULL) = how many. A trainer passes loss = NULL and reads on its log steps only. */
static inline tpk_status tpk_model_loss_read(tpk_ctx *ctx, tpk_model *m, double *sum, int64_t *n) {
    return tpk_xent_loss_read(ctx, &tpk_model_lm(m)->ce, sum, n);
}
static inline void tpk_model_loss_reset(tpk_model *m) { tpk_xent_loss_reset(&tpk_model_lm(m)->ce); }
/* A step's loss over data parallelism: the device's running sum of mean losses (one download,
 * tpk_model_loss_read; the sum restarts) times `weight` — this DP rank's share, e.g. its tokens /
 * the step's tokens / micro-batches — summed over ctx->dp into *out. Collective over the DP
 * group. */
static inline tpk_status tpk_model_loss_dp(tpk_ctx *ctx, tpk_model *m, double weight, double *out) {
    double sum = 0;
    TPK_TRY(tpk_model_loss_read(ctx, m, &sum, NULL));
    *out = sum * weight;
    return tpk_allreduce_host(ctx, &ctx->dp, out, 1, TPK_F64, TPK_SUM);
}
static inline tpk_status tpk_model_backward(tpk_ctx *ctx, tpk_model *m, float scale) {
    return tpk_lm_backward(ctx, m ? tpk_model_lm(m) : NULL, scale);
}
/* The config's part (cfg->arch's family): the blocks and ends a pipeline stage builds. */
static inline tpk_lm_part *tpk_model_config_part(tpk_model_config *cfg) {
    tpk_lm_part *p;
    tpk__model_common(cfg, NULL, NULL, NULL, NULL, &p);
    return p;
}
/* A part's forward and backward (tpk_lm_stage_forward, _backward: tpk/models/lm.h). */
static inline tpk_status tpk_model_stage_forward(tpk_ctx *ctx, tpk_model *m, const int32_t *ids,
                                                 const void *x, const int32_t *targets, int64_t B,
                                                 int64_t S, float *loss, tpk_tensor *y) {
    return tpk_lm_stage_forward(ctx, m ? tpk_model_lm(m) : NULL, ids, x, targets, B, S, loss, y);
}
static inline tpk_status tpk_model_stage_backward(tpk_ctx *ctx, tpk_model *m, float scale, void *dy,
                                                  tpk_tensor *dx) {
    return tpk_lm_stage_backward(ctx, m ? tpk_model_lm(m) : NULL, scale, dy, dx);
}
/* The data-parallel hook (tpk/train/dp.h: tpk_dp_grad_ready) of the model. */
static inline void
tpk_model_set_grad_ready(tpk_model *m, tpk_status (*fn)(tpk_ctx *, int, int, void *), void *user) {
    tpk_lm_set_grad_ready(tpk_model_lm(m), fn, user);
}
/* Every dropout probability (GPT-2's, GPT-NeoX's, Mixtral's, Qwen2-MoE's; Llama has no dropout,
 * p must be 0 there); the family's config follows (a checkpoint's config.json says it, the
 * mixtures of experts' aside). */
static inline tpk_status tpk_model_set_dropout(tpk_ctx *ctx, tpk_model *m, float p) {
    TPK_TRY(tpk_lm_set_dropout(ctx, m ? tpk_model_lm(m) : NULL, p));
    if (m->arch == TPK_ARCH_GPT2) m->gpt2.c.dropout = p;
    if (m->arch == TPK_ARCH_NEOX) m->neox.c.dropout = p;
    if (m->arch == TPK_ARCH_MIXTRAL) m->mixtral.c.dropout = p;
    if (m->arch == TPK_ARCH_QWEN2_MOE) m->qwen2_moe.c.dropout = p;
    return TPK_OK;
}
/* out[0..n_prompt) = prompt, then n tokens sampled under opts (tpk_lm_generate). Collective over
 * TP. */
static inline tpk_status tpk_model_generate(tpk_ctx *ctx, tpk_model *m, const int32_t *prompt,
                                            int n_prompt, int n, const tpk_sample_opts *opts,
                                            uint64_t seed, int32_t *out) {
    return tpk_lm_generate(ctx, m ? tpk_model_lm(m) : NULL, prompt, n_prompt, n, opts, seed, out);
}
/* The same from a 1-token prompt, out[0] = start, at a temperature alone (no filter). */
static inline tpk_status tpk_model_sample(tpk_ctx *ctx, tpk_model *m, int32_t start, int n,
                                          float temperature, uint64_t seed, int32_t *out) {
    return tpk_lm_sample(ctx, m ? tpk_model_lm(m) : NULL, start, n, temperature, seed, out);
}
/* A custom model's checkpoint (tpk/train/ckpt.h): its tensors under their registered names, a
 * config.json of its sizes (model_type "tpk_custom"; its program holds the rest). */
static inline tpk_status tpk__custom_save(tpk_ctx *ctx, const tpk_lm *m, const tpk_adamw *opt,
                                          const char *dir, const tpk_hf_save_desc *desc) {
    char cfg[400];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"tpk_custom\", \"vocab_size\": %lld, \"hidden_size\": %lld, "
             "\"num_hidden_layers\": %lld, \"max_position_embeddings\": %lld}",
             (long long)m->c.vocab, (long long)m->c.hidden, (long long)m->c.layers,
             (long long)m->c.positions);
    tpk_ckpt_save_desc d;
    memset(&d, 0, sizeof d);
    d.config = cfg;
    if (desc) d.step = desc->step, d.seed = desc->seed, d.run_id = desc->run_id;
    return tpk_ckpt_save(ctx, opt, dir, &d);
}
/* The family's Hugging Face checkpoint (tpk/train/hf.h). Collective over ctx->world. */
static inline tpk_status tpk_model_save(tpk_ctx *ctx, const tpk_model *m, const tpk_adamw *opt,
                                        const char *dir, const tpk_hf_save_desc *desc) {
    switch (m ? m->arch : TPK_ARCH_COUNT) {
    case TPK_ARCH_GPT2: return tpk_gpt2_save(ctx, &m->gpt2, opt, dir, desc);
    case TPK_ARCH_LLAMA: return tpk_llama_save(ctx, &m->llama, opt, dir, desc);
    case TPK_ARCH_NEOX: return tpk_neox_save(ctx, &m->neox, opt, dir, desc);
    case TPK_ARCH_MIXTRAL: return tpk_mixtral_save(ctx, &m->mixtral, opt, dir, desc);
    case TPK_ARCH_QWEN2_MOE: return tpk_qwen2_moe_save(ctx, &m->qwen2_moe, opt, dir, desc);
    case TPK_ARCH_CUSTOM: return tpk__custom_save(ctx, &m->custom, opt, dir, desc);
    default:
        return ctx ? tpk__fail(ctx, TPK_ERR_ARG, "tpk_model_save", "model: NULL") : TPK_ERR_ARG;
    }
}
static inline tpk_status tpk_model_load(tpk_ctx *ctx, tpk_model *m, tpk_adamw *opt,
                                        const char *dir) {
    switch (m ? m->arch : TPK_ARCH_COUNT) {
    case TPK_ARCH_GPT2: return tpk_gpt2_load(ctx, &m->gpt2, opt, dir);
    case TPK_ARCH_LLAMA: return tpk_llama_load(ctx, &m->llama, opt, dir);
    case TPK_ARCH_NEOX: return tpk_neox_load(ctx, &m->neox, opt, dir);
    case TPK_ARCH_MIXTRAL: return tpk_mixtral_load(ctx, &m->mixtral, opt, dir);
    case TPK_ARCH_QWEN2_MOE: return tpk_qwen2_moe_load(ctx, &m->qwen2_moe, opt, dir);
    case TPK_ARCH_CUSTOM: return tpk_ckpt_load(ctx, opt, dir, NULL, NULL);
    default:
        return ctx ? tpk__fail(ctx, TPK_ERR_ARG, "tpk_model_load", "model: NULL") : TPK_ERR_ARG;
    }
}

#endif /* TPK_MODEL_H */
