/* tpk/train/model.h — one handle over the kit's model families (tpk/models/families.h: GPT-2,
 * Llama, GPT-NeoX), for a trainer that takes any: the family chosen by a flag or by a checkpoint's
 * config.json ("model_type"), then the same calls for all — forward, backward, the data-parallel
 * hook, dropout, sampling, Hugging Face checkpoints. Each call goes through the family's row of a
 * table (tpk_model_family) to the model's own function; the enum, the members and the rows are
 * made from the list of families (TPK__FAMILIES), so nothing here names a family. Nothing here
 * computes. Needs POSIX (tpk/train/hf.h). */
#ifndef TPK_MODEL_H
#define TPK_MODEL_H

#include "hf.h"
#include "../models/sample.h"

/* TPK_ARCH_GPT2, TPK_ARCH_LLAMA, TPK_ARCH_NEOX, ...: one per family, in the list's order */
#define TPK__ARCH_ENUM(f, F, type, dropout, title) TPK_ARCH_##F,
typedef enum tpk_arch { TPK__FAMILIES(TPK__ARCH_ENUM) TPK_ARCH_COUNT } tpk_arch;
#undef TPK__ARCH_ENUM

/* One member per family (.gpt2, .llama, .neox, ...): the one of cfg->arch is used. */
#define TPK__CONFIG_MEMBER(f, F, type, dropout, title) tpk_##f##_config f;
#define TPK__MODEL_MEMBER(f, F, type, dropout, title) tpk_##f f;
typedef struct tpk_model_config {
    tpk_arch arch;
    TPK__FAMILIES(TPK__CONFIG_MEMBER)
} tpk_model_config;

typedef struct tpk_model {
    tpk_arch arch;
    TPK__FAMILIES(TPK__MODEL_MEMBER)
} tpk_model;
#undef TPK__CONFIG_MEMBER
#undef TPK__MODEL_MEMBER

/* A model family: the calls a trainer makes, each on the family's own config and model (void *:
 * the tpk_model_config / tpk_model member of that family). Every tpk_model_* call below is one
 * line through this table, made from the list of families (TPK__FAMILIES): the adapters by
 * TPK__MODEL_FAMILY, the rows by TPK__MODEL_FAMILY_ROW. */
typedef struct tpk_model_family {
    const char *name;       /* --arch */
    const char *model_type; /* config.json's */
    const char *title;      /* in print: "GPT-2" */
    bool dropout;           /* has dropout sites */
    const tpk_lm_flag *(*flags)(int *n); /* its config fields set by a trainer's flags */
    void *(*model_config)(void *m);      /* the built model's config (defaults applied) */
    size_t cfg_off, model_off; /* the family's members of tpk_model_config and tpk_model */
    tpk_status (*config_read)(tpk_ctx *ctx, const char *dir, void *cfg);
    tpk_status (*init)(tpk_ctx *ctx, void *m, const void *cfg);
    void (*destroy)(tpk_ctx *ctx, void *m);
    void (*dims)(const void *m, int64_t *vocab, int64_t *positions, int64_t *layers,
                 int64_t *hidden);
    /* pointers to the config's vocab, positions, layers, hidden, heads, label_smoothing,
       sequence_parallel and recompute (every family's config has them) */
    void (*cfg_common)(void *cfg, int64_t *shape[5], float **smoothing, bool **sp,
                       tpk_recompute **recompute);
    tpk_xent *(*ce)(void *m);
    void (*set_grad_ready)(void *m, tpk_status (*fn)(tpk_ctx *, int, int, void *), void *user);
    tpk_status (*set_dropout)(tpk_ctx *ctx, void *m, float p);
    tpk_status (*forward)(tpk_ctx *ctx, void *m, const int32_t *ids, const int32_t *targets,
                          int64_t B, int64_t S, float *loss);
    tpk_status (*backward)(tpk_ctx *ctx, void *m, float scale);
    tpk_status (*sample)(tpk_ctx *ctx, void *m, int32_t start, int n, float temperature,
                         uint64_t seed, int32_t *out);
    tpk_status (*generate)(tpk_ctx *ctx, void *m, const int32_t *prompt, int n_prompt, int n,
                           const tpk_sample_opts *opts, uint64_t seed, int32_t *out);
    tpk_status (*save)(tpk_ctx *ctx, const void *m, const tpk_adamw *opt, const char *dir,
                       const tpk_hf_save_desc *desc);
    tpk_status (*load)(tpk_ctx *ctx, void *m, tpk_adamw *opt, const char *dir);
    tpk__lm_parts (*parts)(void *m); /* the skeleton's view (a pipeline stage's calls) */
    tpk_lm_part *(*part)(void *cfg); /* the config's part (tpk_lm_part) */
} tpk_model_family;

/* The adapters of family F (functions tpk_F_*, types tpk_F and tpk_F_config, whose .c holds
 * vocab, positions, layers and hidden, .ce the cross-entropy and .lm.grad_ready(_user) the hook):
 * each casts the void * and calls the family's own function. */
#define TPK__MODEL_FAMILY(F, FF, TYPE, DROPOUT, TITLE)                                            \
    static inline tpk_status tpk__##F##_fam_config_read(tpk_ctx *ctx, const char *dir, void *c) { \
        return tpk_##F##_config_read(ctx, dir, (tpk_##F##_config *)c);                            \
    }                                                                                             \
    static inline tpk_status tpk__##F##_fam_init(tpk_ctx *ctx, void *m, const void *c) {          \
        return tpk_##F##_init(ctx, (tpk_##F *)m, (const tpk_##F##_config *)c);                    \
    }                                                                                             \
    static inline void tpk__##F##_fam_destroy(tpk_ctx *ctx, void *m) {                            \
        tpk_##F##_destroy(ctx, (tpk_##F *)m);                                                     \
    }                                                                                             \
    static inline void tpk__##F##_fam_dims(const void *m, int64_t *v, int64_t *p, int64_t *l,     \
                                           int64_t *h) {                                          \
        const tpk_##F *x = (const tpk_##F *)m;                                                    \
        *v = x->c.vocab, *p = x->c.positions, *l = x->c.layers, *h = x->c.hidden;                 \
    }                                                                                             \
    static inline void tpk__##F##_fam_cfg_common(void *cfg, int64_t *shape[5], float **ls,        \
                                                 bool **sp, tpk_recompute **rc) {                 \
        tpk_##F##_config *c = (tpk_##F##_config *)cfg;                                            \
        shape[0] = &c->vocab, shape[1] = &c->positions, shape[2] = &c->layers;                    \
        shape[3] = &c->hidden, shape[4] = &c->heads;                                              \
        *ls = &c->label_smoothing, *sp = &c->sequence_parallel, *rc = &c->recompute;              \
    }                                                                                             \
    static inline tpk_xent *tpk__##F##_fam_ce(void *m) { return &((tpk_##F *)m)->ce; }            \
    static inline void *tpk__##F##_fam_model_config(void *m) { return &((tpk_##F *)m)->c; }       \
    static inline tpk_status tpk__##F##_fam_set_dropout(tpk_ctx *ctx, void *m, float p) {         \
        if (!(DROPOUT) && p != 0)                                                                 \
            return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, "tpk_model_set_dropout",                   \
                             "p: the %s model has no dropout, expected 0, got %g", TITLE,         \
                             (double)p);                                                          \
        tpk_##F##_set_dropout((tpk_##F *)m, p);                                                   \
        return TPK_OK;                                                                            \
    }                                                                                             \
    static inline void tpk__##F##_fam_set_grad_ready(                                             \
        void *m, tpk_status (*fn)(tpk_ctx *, int, int, void *), void *user) {                     \
        ((tpk_##F *)m)->lm.grad_ready = fn, ((tpk_##F *)m)->lm.grad_ready_user = user;            \
    }                                                                                             \
    static inline tpk_status tpk__##F##_fam_forward(tpk_ctx *ctx, void *m, const int32_t *ids,    \
                                                    const int32_t *t, int64_t B, int64_t S,       \
                                                    float *loss) {                                \
        return tpk_##F##_forward(ctx, (tpk_##F *)m, ids, t, B, S, loss);                          \
    }                                                                                             \
    static inline tpk_status tpk__##F##_fam_backward(tpk_ctx *ctx, void *m, float scale) {        \
        return tpk_##F##_backward(ctx, (tpk_##F *)m, scale);                                      \
    }                                                                                             \
    static inline tpk_status tpk__##F##_fam_sample(tpk_ctx *ctx, void *m, int32_t start, int n,   \
                                                   float temp, uint64_t seed, int32_t *out) {     \
        return tpk_##F##_sample(ctx, (tpk_##F *)m, start, n, temp, seed, out);                    \
    }                                                                                             \
    static inline tpk_status tpk__##F##_fam_generate(                                             \
        tpk_ctx *ctx, void *m, const int32_t *prompt, int n_prompt, int n,                        \
        const tpk_sample_opts *opts, uint64_t seed, int32_t *out) {                               \
        return tpk_##F##_generate(ctx, (tpk_##F *)m, prompt, n_prompt, n, opts, seed, out);       \
    }                                                                                             \
    static inline tpk_status tpk__##F##_fam_save(tpk_ctx *ctx, const void *m,                     \
                                                 const tpk_adamw *opt, const char *dir,           \
                                                 const tpk_hf_save_desc *d) {                     \
        return tpk_##F##_save(ctx, (const tpk_##F *)m, opt, dir, d);                              \
    }                                                                                             \
    static inline tpk_status tpk__##F##_fam_load(tpk_ctx *ctx, void *m, tpk_adamw *opt,           \
                                                 const char *dir) {                               \
        return tpk_##F##_load(ctx, (tpk_##F *)m, opt, dir);                                       \
    }                                                                                             \
    static inline tpk__lm_parts tpk__##F##_fam_parts(void *m) {                                   \
        return tpk__##F##_lm((tpk_##F *)m);                                                       \
    }                                                                                             \
    static inline tpk_lm_part *tpk__##F##_fam_part(void *c) {                                     \
        return &((tpk_##F##_config *)c)->part;                                                    \
    }
#define TPK__MODEL_FAMILY_ROW(F, FF, TYPE, DROPOUT, TITLE) \
    {/* name */ #F,                                        \
     TYPE,                                                 \
     TITLE,                                                \
     DROPOUT,                                              \
     tpk_##F##_flags,                                      \
     tpk__##F##_fam_model_config,                          \
     offsetof(tpk_model_config, F),                        \
     offsetof(tpk_model, F),                               \
     tpk__##F##_fam_config_read,                           \
     tpk__##F##_fam_init,                                  \
     tpk__##F##_fam_destroy,                               \
     tpk__##F##_fam_dims,                                  \
     tpk__##F##_fam_cfg_common,                            \
     tpk__##F##_fam_ce,                                    \
     tpk__##F##_fam_set_grad_ready,                        \
     tpk__##F##_fam_set_dropout,                           \
     tpk__##F##_fam_forward,                               \
     tpk__##F##_fam_backward,                              \
     tpk__##F##_fam_sample,                                \
     tpk__##F##_fam_generate,                              \
     tpk__##F##_fam_save,                                  \
     tpk__##F##_fam_load,                                  \
     tpk__##F##_fam_parts,                                 \
     tpk__##F##_fam_part},

TPK__FAMILIES(TPK__MODEL_FAMILY)

/* The families, indexed by tpk_arch; each one's config and model member. */
static inline const tpk_model_family *tpk__model_family(tpk_arch a) {
    static const tpk_model_family families[TPK_ARCH_COUNT] = {
        TPK__FAMILIES(TPK__MODEL_FAMILY_ROW)};
    return (unsigned)a < TPK_ARCH_COUNT ? &families[a] : NULL;
}
static inline void *tpk__model_cfg(tpk_model_config *c) {
    return (char *)c + tpk__model_family(c->arch)->cfg_off;
}
static inline void *tpk__model_of(const tpk_model *m) {
    return (char *)m + tpk__model_family(m->arch)->model_off;
}
/* The family named `name` (--arch) or, by_type, whose config.json model_type is `name`. */
static inline bool tpk_arch_from_name(const char *name, bool by_type, tpk_arch *a) {
    for (int i = 0; name && i < TPK_ARCH_COUNT; i++) {
        const tpk_model_family *f = tpk__model_family((tpk_arch)i);
        if (!strcmp(name, by_type ? f->model_type : f->name)) return *a = (tpk_arch)i, true;
    }
    return false;
}
#define TPK__FAM(m) tpk__model_family((m)->arch)

/* The fields every family's config has, of cfg->arch's config: shape[0..4] = vocab, positions,
 * layers, hidden, heads (pointers into it); and its label smoothing, sequence parallelism and
 * recompute mode set. */
static inline void tpk_model_config_common(tpk_model_config *cfg, int64_t *shape[5],
                                           float label_smoothing, bool sequence_parallel,
                                           tpk_recompute recompute) {
    float *ls;
    bool *sp;
    tpk_recompute *rc;
    TPK__FAM(cfg)->cfg_common(tpk__model_cfg(cfg), shape, &ls, &sp, &rc);
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

static inline const char *tpk_arch_name(tpk_arch a) {
    return tpk__model_family(a) ? tpk__model_family(a)->name : "?";
}

/* cfg->arch and that family's config from dir/config.json (its model_type: "gpt2", "llama",
 * "gpt_neox"). */
static inline tpk_status tpk_model_config_read(tpk_ctx *ctx, const char *dir,
                                               tpk_model_config *cfg) {
    char type[32];
    if (ctx && !cfg) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_model_config_read", "cfg: NULL");
    TPK_TRY(tpk_hf_model_type(ctx, dir, type, sizeof type));
    if (!tpk_arch_from_name(type, true, &cfg->arch))
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, "tpk_model_config_read",
                         "%s: model_type \"%s\": no family of the kit", dir, type);
    return TPK__FAM(cfg)->config_read(ctx, dir, tpk__model_cfg(cfg));
}

static inline tpk_status tpk_model_init(tpk_ctx *ctx, tpk_model *m, const tpk_model_config *cfg) {
    static const char *fn = "tpk_model_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", m ? "cfg" : "model");
    memset(m, 0, sizeof *m);
    m->arch = cfg->arch;
    if (!TPK__FAM(cfg))
        return tpk__fail(ctx, TPK_ERR_ARG, fn,
                         "cfg->arch: expected a family, 0..%d (tpk_arch), got %d",
                         (int)TPK_ARCH_COUNT - 1, (int)cfg->arch);
    return TPK__FAM(m)->init(ctx, tpk__model_of(m), tpk__model_cfg((tpk_model_config *)cfg));
}
static inline void tpk_model_destroy(tpk_ctx *ctx, tpk_model *m) {
    if (TPK__FAM(m)) TPK__FAM(m)->destroy(ctx, tpk__model_of(m));
}

/* Sizes of the model as built. */
static inline int64_t tpk__model_dim(const tpk_model *m, int which) {
    int64_t d[4];
    TPK__FAM(m)->dims(tpk__model_of(m), &d[0], &d[1], &d[2], &d[3]);
    return d[which];
}
static inline int64_t tpk_model_vocab(const tpk_model *m) { return tpk__model_dim(m, 0); }
static inline int64_t tpk_model_positions(const tpk_model *m) { return tpk__model_dim(m, 1); }
static inline int64_t tpk_model_layers(const tpk_model *m) { return tpk__model_dim(m, 2); }
static inline int64_t tpk_model_hidden(const tpk_model *m) { return tpk__model_dim(m, 3); }

static inline tpk_status tpk_model_forward(tpk_ctx *ctx, tpk_model *m, const int32_t *ids,
                                           const int32_t *targets, int64_t B, int64_t S,
                                           float *loss) {
    return TPK__FAM(m)->forward(ctx, tpk__model_of(m), ids, targets, B, S, loss);
}
/* The running loss sum of the forwards made with loss = NULL since the last read or reset, in
 * their order (tpk_xent_loss_read: one download when there was one, then the sum starts again);
 * *n (may be NULL) = how many. A trainer passes loss = NULL and reads on its log steps only. */
static inline tpk_status tpk_model_loss_read(tpk_ctx *ctx, tpk_model *m, double *sum, int64_t *n) {
    return tpk_xent_loss_read(ctx, TPK__FAM(m)->ce(tpk__model_of(m)), sum, n);
}
static inline void tpk_model_loss_reset(tpk_model *m) {
    tpk_xent_loss_reset(TPK__FAM(m)->ce(tpk__model_of(m)));
}
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
    return TPK__FAM(m)->backward(ctx, tpk__model_of(m), scale);
}
/* The config's part (cfg->arch's family): the blocks and ends a pipeline stage builds. */
static inline tpk_lm_part *tpk_model_config_part(tpk_model_config *cfg) {
    return TPK__FAM(cfg)->part(tpk__model_cfg(cfg));
}
/* A part's forward and backward (tpk_F_stage_forward, _backward: tpk/models/lm.h). */
static inline tpk_status tpk_model_stage_forward(tpk_ctx *ctx, tpk_model *m, const int32_t *ids,
                                                 const void *x, const int32_t *targets, int64_t B,
                                                 int64_t S, float *loss, tpk_tensor *y) {
    tpk__lm_parts p = TPK__FAM(m)->parts(tpk__model_of(m));
    return tpk__lm_stage_forward(ctx, "tpk_model_stage_forward", p.blocks ? &p : NULL, ids, x,
                                 targets, B, S, loss, y);
}
static inline tpk_status tpk_model_stage_backward(tpk_ctx *ctx, tpk_model *m, float scale, void *dy,
                                                  tpk_tensor *dx) {
    tpk__lm_parts p = TPK__FAM(m)->parts(tpk__model_of(m));
    return tpk__lm_stage_backward(ctx, "tpk_model_stage_backward", p.blocks ? &p : NULL, scale, dy,
                                  dx);
}
/* The data-parallel hook (tpk/train/dp.h: tpk_dp_grad_ready) of the model. */
static inline void
tpk_model_set_grad_ready(tpk_model *m, tpk_status (*fn)(tpk_ctx *, int, int, void *), void *user) {
    TPK__FAM(m)->set_grad_ready(tpk__model_of(m), fn, user);
}
/* Every dropout probability (GPT-2's, GPT-NeoX's; Llama has no dropout, p must be 0 there). */
static inline tpk_status tpk_model_set_dropout(tpk_ctx *ctx, tpk_model *m, float p) {
    return TPK__FAM(m)->set_dropout(ctx, tpk__model_of(m), p);
}
/* out[0..n_prompt) = prompt (n_prompt >= 1 token ids below the vocabulary), then n tokens sampled
 * one after another under opts (tpk_sample_opts: temperature, 0 greedy; top_k, 0 off; top_p, 1
 * off; NULL: tpk_sample_defaults()), each from the logits of the last `positions` tokens; draw i
 * (of seed) gives out[n_prompt + i], the same on every rank. Set dropout to 0 first. Collective
 * over TP. */
static inline tpk_status tpk_model_generate(tpk_ctx *ctx, tpk_model *m, const int32_t *prompt,
                                            int n_prompt, int n, const tpk_sample_opts *opts,
                                            uint64_t seed, int32_t *out) {
    return TPK__FAM(m)->generate(ctx, tpk__model_of(m), prompt, n_prompt, n, opts, seed, out);
}
/* The same from a 1-token prompt, out[0] = start, at a temperature alone (no filter). */
static inline tpk_status tpk_model_sample(tpk_ctx *ctx, tpk_model *m, int32_t start, int n,
                                          float temperature, uint64_t seed, int32_t *out) {
    return TPK__FAM(m)->sample(ctx, tpk__model_of(m), start, n, temperature, seed, out);
}
static inline tpk_status tpk_model_save(tpk_ctx *ctx, const tpk_model *m, const tpk_adamw *opt,
                                        const char *dir, const tpk_hf_save_desc *desc) {
    return TPK__FAM(m)->save(ctx, tpk__model_of(m), opt, dir, desc);
}
static inline tpk_status tpk_model_load(tpk_ctx *ctx, tpk_model *m, tpk_adamw *opt,
                                        const char *dir) {
    return TPK__FAM(m)->load(ctx, tpk__model_of(m), opt, dir);
}

#endif /* TPK_MODEL_H */
