/* tpk/model.h — one handle over the kit's two models, GPT-2 (tpk/gpt2.h) and Llama (tpk/llama.h),
 * for a trainer that takes either: the architecture chosen by a flag or by a checkpoint's
 * config.json ("model_type"), then the same calls for both — forward, backward, the data-parallel
 * hook, dropout, sampling, Hugging Face checkpoints. Each call forwards to the model's own
 * function; nothing here computes. Needs POSIX (tpk/hf.h). */
#ifndef TPK_MODEL_H
#define TPK_MODEL_H

#include "hf.h"
#include "sample.h"

typedef enum tpk_arch { TPK_ARCH_GPT2 = 0, TPK_ARCH_LLAMA = 1 } tpk_arch;

typedef struct tpk_model_config {
    tpk_arch arch;
    tpk_gpt2_config gpt2;   /* arch == TPK_ARCH_GPT2 */
    tpk_llama_config llama; /* arch == TPK_ARCH_LLAMA */
} tpk_model_config;

typedef struct tpk_model {
    tpk_arch arch;
    tpk_gpt2 gpt2;
    tpk_llama llama;
} tpk_model;

static inline const char *tpk_arch_name(tpk_arch a) { return a == TPK_ARCH_GPT2 ? "gpt2" : a == TPK_ARCH_LLAMA ? "llama" : "?"; }

/* cfg->arch and that architecture's config from dir/config.json (model_type "gpt2" or "llama"). */
static inline tpk_status tpk_model_config_read(tpk_ctx *ctx, const char *dir, tpk_model_config *cfg) {
    char type[32];
    if (ctx && !cfg) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_model_config_read", "cfg: NULL");
    TPK_TRY(tpk_hf_model_type(ctx, dir, type, sizeof type));
    cfg->arch = strcmp(type, "llama") ? TPK_ARCH_GPT2 : TPK_ARCH_LLAMA;
    return cfg->arch == TPK_ARCH_LLAMA ? tpk_llama_config_read(ctx, dir, &cfg->llama) : tpk_gpt2_config_read(ctx, dir, &cfg->gpt2);
}

static inline tpk_status tpk_model_init(tpk_ctx *ctx, tpk_model *m, const tpk_model_config *cfg) {
    static const char *fn = "tpk_model_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!m || !cfg) return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", m ? "cfg" : "model");
    memset(m, 0, sizeof *m);
    m->arch = cfg->arch;
    if (cfg->arch == TPK_ARCH_GPT2) return tpk_gpt2_init(ctx, &m->gpt2, &cfg->gpt2);
    if (cfg->arch == TPK_ARCH_LLAMA) return tpk_llama_init(ctx, &m->llama, &cfg->llama);
    return tpk__fail(ctx, TPK_ERR_ARG, fn, "cfg->arch: expected TPK_ARCH_GPT2 or TPK_ARCH_LLAMA, got %d", (int)cfg->arch);
}
static inline void tpk_model_destroy(tpk_ctx *ctx, tpk_model *m) {
    if (m->arch == TPK_ARCH_LLAMA) tpk_llama_destroy(ctx, &m->llama);
    else tpk_gpt2_destroy(ctx, &m->gpt2);
}

/* Sizes of the model as built. */
static inline int64_t tpk_model_vocab(const tpk_model *m) { return m->arch == TPK_ARCH_LLAMA ? m->llama.c.vocab : m->gpt2.c.vocab; }
static inline int64_t tpk_model_positions(const tpk_model *m) { return m->arch == TPK_ARCH_LLAMA ? m->llama.c.positions : m->gpt2.c.positions; }
static inline int64_t tpk_model_layers(const tpk_model *m) { return m->arch == TPK_ARCH_LLAMA ? m->llama.c.layers : m->gpt2.c.layers; }
static inline int64_t tpk_model_hidden(const tpk_model *m) { return m->arch == TPK_ARCH_LLAMA ? m->llama.c.hidden : m->gpt2.c.hidden; }

static inline tpk_status tpk_model_forward(tpk_ctx *ctx, tpk_model *m, const int32_t *ids, const int32_t *targets, int64_t B, int64_t S, float *loss) {
    return m->arch == TPK_ARCH_LLAMA ? tpk_llama_forward(ctx, &m->llama, ids, targets, B, S, loss) : tpk_gpt2_forward(ctx, &m->gpt2, ids, targets, B, S, loss);
}
/* The running loss sum of the forwards made with loss = NULL since the last read or reset, in
 * their order (tpk_xent_loss_read: one download when there was one, then the sum starts again);
 * *n (may be NULL) = how many. A trainer passes loss = NULL and reads on its log steps only. */
static inline tpk_status tpk_model_loss_read(tpk_ctx *ctx, tpk_model *m, double *sum, int64_t *n) {
    return tpk_xent_loss_read(ctx, m->arch == TPK_ARCH_LLAMA ? &m->llama.ce : &m->gpt2.ce, sum, n);
}
static inline void tpk_model_loss_reset(tpk_model *m) { tpk_xent_loss_reset(m->arch == TPK_ARCH_LLAMA ? &m->llama.ce : &m->gpt2.ce); }
/* A step's loss over data parallelism: the device's running sum of mean losses (one download,
 * tpk_model_loss_read; the sum restarts) times `weight` — this DP rank's share, e.g. its tokens /
 * the step's tokens / micro-batches — summed over ctx->dp into *out. Collective over the DP group. */
static inline tpk_status tpk_model_loss_dp(tpk_ctx *ctx, tpk_model *m, double weight, double *out) {
    double sum = 0;
    TPK_TRY(tpk_model_loss_read(ctx, m, &sum, NULL));
    *out = sum * weight;
    return tpk_allreduce_host(ctx, &ctx->dp, out, 1, TPK_F64, TPK_SUM);
}
static inline tpk_status tpk_model_backward(tpk_ctx *ctx, tpk_model *m, float scale) {
    return m->arch == TPK_ARCH_LLAMA ? tpk_llama_backward(ctx, &m->llama, scale) : tpk_gpt2_backward(ctx, &m->gpt2, scale);
}
/* The data-parallel hook (tpk/dp.h: tpk_dp_grad_ready) of either model. */
static inline void tpk_model_set_grad_ready(tpk_model *m, tpk_status (*fn)(tpk_ctx *, int, int, void *), void *user) {
    m->gpt2.grad_ready = m->llama.grad_ready = fn;
    m->gpt2.grad_ready_user = m->llama.grad_ready_user = user;
}
/* Every dropout probability (GPT-2's; Llama has no dropout, p must be 0 there). */
static inline tpk_status tpk_model_set_dropout(tpk_ctx *ctx, tpk_model *m, float p) {
    if (m->arch == TPK_ARCH_LLAMA && p != 0)
        return tpk__fail(ctx, TPK_ERR_UNSUPPORTED, "tpk_model_set_dropout", "p: the Llama model has no dropout, expected 0, got %g", (double)p);
    if (m->arch == TPK_ARCH_GPT2) tpk_gpt2_set_dropout(&m->gpt2, p);
    return TPK_OK;
}
static inline tpk_status tpk_model_sample(tpk_ctx *ctx, tpk_model *m, int32_t start, int n, float temperature, uint64_t seed, int32_t *out) {
    return m->arch == TPK_ARCH_LLAMA ? tpk_llama_sample(ctx, &m->llama, start, n, temperature, seed, out)
                                     : tpk_gpt2_sample(ctx, &m->gpt2, start, n, temperature, seed, out);
}
static inline tpk_status tpk_model_save(tpk_ctx *ctx, const tpk_model *m, const tpk_adamw *opt, const char *dir, const tpk_hf_save_desc *desc) {
    return m->arch == TPK_ARCH_LLAMA ? tpk_llama_save(ctx, &m->llama, opt, dir, desc) : tpk_gpt2_save(ctx, &m->gpt2, opt, dir, desc);
}
static inline tpk_status tpk_model_load(tpk_ctx *ctx, tpk_model *m, tpk_adamw *opt, const char *dir) {
    return m->arch == TPK_ARCH_LLAMA ? tpk_llama_load(ctx, &m->llama, opt, dir) : tpk_gpt2_load(ctx, &m->gpt2, opt, dir);
}

#endif /* TPK_MODEL_H */
