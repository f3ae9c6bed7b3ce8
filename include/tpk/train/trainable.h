/* tpk/train/trainable.h — one handle for training a model at any pipeline size, P = 1 included:
 * a caller never branches on pipelining. Without stages it holds the model (tpk/train/model.h);
 * with stages (P > 1, or a schedule or a split asked for at P = 1) this rank's stage
 * (tpk/train/pipe_model.h: the chunks' copies and the executor). The same calls for both:
 *   tpk_trainable_step    zero the gradients, the M micro-batches' forwards and backwards, the DP
 *                         reduction, norm, clipping, AdamW (tpk_model_train_step, below); then
 *                         the FP8 recipe's update (ctx->fp8: tpk_fp8_update), if any;
 *   tpk_trainable_loss    the step's mean loss over micro-batches and DP ranks, read from the
 *                         device (with stages: the last stage's, given to every stage);
 *   tpk_trainable_losses  K batches' mean losses, forwards alone (with stages: through the
 *                         pipeline as K micro-batches; the FP8 recipe records no amax);
 *   set_dropout, set_dp (the DP buckets a backward starts), params (the global count, a tied
 *   embedding's two stage copies once), save and load (tpk_model_save / tpk_model_load: each
 *   stage its own blocks; each a phase announced to the other ranks, tpk_busy, whose timeout
 *   waits out its budget TPK_BUSY_PHASE_S, as the first step's is), destroy.
 *   tpk_trainable_model: the model whose sizes these are (the first chunk's copy with stages).
 * Context parallelism (ctx->cp, c > 1): tpk_trainable_step and _losses take whole sequences, as
 * at c = 1, and hand the model this CP rank's rows of them (tpk_cp_scatter_host: chunks r and
 * 2c - 1 - r of every sequence, into buffers the handle keeps), so every CP rank of a DP rank
 * trains on the same sequences as one rank would; the loss each reads is the whole batch's
 * (tpk/layers/xent.h sums the CP shares), the gradients are summed over DP x CP by the DP
 * reduction (tpk/train/dp.h). With stages likewise: each CP rank's pipeline carries its rows
 * (tpk/train/pipe_model.h), the mesh TP x CP x DP x PP.
 *   Needs POSIX (tpk/train/model.h). */
#ifndef TPK_TRAIN_TRAINABLE_H
#define TPK_TRAIN_TRAINABLE_H

#include "pipe_model.h"
#include "train.h"

typedef struct tpk_trainable {
    bool piped;
    tpk_model m;       /* without stages */
    tpk_pipe_model pm; /* with stages */
    double busy, wait; /* with stages: seconds in compute steps and waiting in messages, so far */
    bool stepped;      /* the first step done (its setup a phase announced to the others) */
    char run_id[33];   /* the run its checkpoints name (tpk_ckpt_save_desc.run_id): set by the
                          program (the same on every rank; tpk_ranks_new_id), replaced by a loaded
                          checkpoint's; "": none */
    int32_t *cp_ids, *cp_tg; /* under CP: this rank's rows of a step's (or an evaluation's)
                                sequences, host [cp_cap] each */
    size_t cp_cap;
} tpk_trainable;

/* How a trainable is built: without stages, or as this rank's stage of ctx->pp. */
typedef struct tpk_trainable_desc {
    bool piped;            /* stages (forced when ctx->pp.size > 1) */
    tpk_pipe_kind kind;    /* the schedule */
    int micro, vstages;    /* micro-batches a step; chunks a stage */
    const int64_t *counts; /* blocks per virtual stage (NULL: even, or balanced) */
    bool balanced;         /* counts NULL: balanced by a flop estimate (tpk_pipe_model_costs) */
    int64_t seq;           /* the sequence length the balance costs */
} tpk_trainable_desc;

static inline void tpk_trainable_destroy(tpk_ctx *ctx, tpk_trainable *t) {
    if (!t) return;
    if (t->piped) tpk_pipe_model_destroy(ctx, &t->pm);
    else tpk_model_destroy(ctx, &t->m);
    tpk__free(ctx, t->cp_ids), tpk__free(ctx, t->cp_tg);
    memset(t, 0, sizeof *t);
}

static inline tpk_status tpk_trainable_init(tpk_ctx *ctx, tpk_trainable *t,
                                            const tpk_model_config *cfg,
                                            const tpk_trainable_desc *d) {
    static const char *fn = "tpk_trainable_init";
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !cfg || !d)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL", !t ? "t" : !cfg ? "cfg" : "d");
    memset(t, 0, sizeof *t);
    t->piped = d->piped || ctx->pp.size > 1;
    if (!t->piped) return tpk_model_init(ctx, &t->m, cfg);
    if (d->micro < 1 || d->vstages < 1)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "d->micro, d->vstages: expected >= 1, got %d, %d",
                         d->micro, d->vstages);
    double *cost = NULL, cf = 0, cl = 0;
    if (!d->counts && d->balanced) {
        int64_t *sh[5];
        tpk_model_config c = *cfg;
        tpk_model_config_common(&c, sh, 0, false, TPK_RECOMPUTE_NONE);
        cost = (double *)tpk__malloc(ctx, sizeof(double) * (size_t)(*sh[2] + 1));
        if (!cost) return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "%lld costs", (long long)*sh[2]);
        tpk_pipe_model_costs(cfg, d->seq, cost, &cf, &cl);
    }
    tpk_status s = tpk_pipe_model_init(ctx, &t->pm, cfg, d->kind, d->micro, d->vstages, d->counts,
                                       cost, cf, cl);
    tpk_free(ctx, cost);
    return s;
}

/* The model whose sizes and config the trainable has (with stages: its first chunk's copy). */
static inline tpk_model *tpk_trainable_model(tpk_trainable *t) {
    return t->piped ? &t->pm.copy[0] : &t->m;
}

static inline tpk_status tpk_trainable_set_dropout(tpk_ctx *ctx, tpk_trainable *t, float p) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_trainable_set_dropout", "t: NULL");
    return t->piped ? tpk_pipe_model_set_dropout(ctx, &t->pm, p)
                    : tpk_model_set_dropout(ctx, &t->m, p);
}

/* The DP buckets b (tpk/train/dp.h) a backward starts as each block's gradients are done
 * (all-reduces, or ZeRO-2's reduce-scatters: tpk_dp_shard_grads); overlap false (ZeRO-1, Adasum):
 * with stages none start during the backward (tpk_train_step reduces). */
static inline void tpk_trainable_set_dp(tpk_trainable *t, tpk_dp_buckets *b, bool overlap) {
    if (t->piped) tpk_pipe_model_set_dp(&t->pm, overlap ? b : NULL);
    else tpk_model_set_grad_ready(&t->m, tpk_dp_grad_ready, b);
}

/* One optimizer step of a model over M micro-batches, as the trainer runs it:
 * the one sequence of calls that examples/train.c makes each step and the planner's dry run
 * (tpk/plan/plan.h) walks on a counting backend, so the planned memory and ops are the run's.
 *
 *   1. the gradients zeroed (and the device loss sums: the step's alone are read, with stages too);
 *   2. without stages: for each micro-batch k (ids, targets [M][B S / c] in host memory: this CP
 *      rank's rows, tpk_cp_rows, of B sequences of S tokens; c = 1 without CP) with
 *      ctx->rng_step = rng_step + k, the forward (the loss stays on the device), the DP buckets
 *      begun on the last micro-batch (ZeRO-2's reduce-scatters too; none under ZeRO-1: one
 *      reduce-scatter at the end instead),
 *      the backward with `scale`;
 *      with stages (pm != NULL): the pipeline's schedule over the M micro-batches
 *      (tpk_pipe_model_step; the DP buckets under each chunk's last backward, set by
 *      tpk_pipe_model_set_dp);
 *   3. tpk_train_step: the DP reduction, the norm, clipping and AdamW (norm: as there).
 * `scale` weighs a micro-batch's mean loss in the step's (1 / M for a plain mean over M equal
 * micro-batches and one DP rank; the trainer's: tokens of this DP rank's micro-batch over the
 * step's, and x DP under Adasum). The model's grad_ready hook must be the buckets'
 * (tpk_dp_grad_ready) without stages. */
static inline tpk_status tpk_model_train_step(tpk_ctx *ctx, tpk_model *m, tpk_pipe_model *pm,
                                              tpk_adamw *opt, tpk_dp_buckets *b, const int32_t *ids,
                                              const int32_t *targets, int64_t B, int64_t S, int M,
                                              float scale, uint64_t rng_step, float lr, float clip,
                                              double *norm) {
    static const char *fn = "tpk_model_train_step";
    if (!ctx) return TPK_ERR_ARG;
    if ((!m && !pm) || !opt || !b || !ids || !targets)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !m && !pm ? "model"
                         : !opt    ? "opt"
                         : !b      ? "buckets"
                                   : "ids or targets");
    if (M < 1 || B < 1 || S < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "M, B, S: expected >= 1, got %d, %lld, %lld", M,
                         (long long)B, (long long)S);
    bool zero = tpk__adamw_zero1(opt); /* ZeRO-1: no buckets during the backward */
    size_t mbt = (size_t)tpk_cp_rows(ctx, B, S); /* a micro-batch's tokens (this CP rank's) */
    TPK_TRY(tpk_params_zero_grad(ctx));
    if (pm) {
        for (int i = 0; i < pm->V * pm->K; i++) { /* the step's losses from here (as below) */
            tpk_lm *lm = tpk_model_lm(&pm->copy[i]);
            tpk_xent_loss_reset(&lm->ce), lm->aux_sum = 0;
        }
        TPK_TRY(tpk_pipe_model_step(ctx, pm, ids, targets, B, S, scale, rng_step, NULL));
    } else {
        tpk_lm *lm = tpk_model_lm(m); /* every family's model: its calls, direct */
        tpk_xent_loss_reset(&lm->ce), lm->aux_sum = 0; /* the step's losses from here */
        for (int k = 0; k < M; k++) {
            ctx->rng_step = rng_step + (uint64_t)k;
            TPK_TRY(tpk_lm_forward(ctx, lm, ids + (size_t)k * mbt, targets + (size_t)k * mbt, B, S,
                                   NULL));
            TPK_TRY(tpk_dp_begin(ctx, b, k == M - 1 && !zero));
            TPK_TRY(tpk_lm_backward(ctx, lm, scale));
        }
    }
    return tpk_train_step(ctx, opt, b, lr, clip, 1.0f, norm);
}

/* Under context parallelism (c > 1): this CP rank's rows of K batches of whole sequences, ids and
 * targets [K][B S] (host), into t's buffers [K][B S / c], *ids and *targets then pointing at them;
 * at c = 1 nothing. */
static inline tpk_status tpk__trainable_cp_rows(tpk_ctx *ctx, tpk_trainable *t, const char *fn,
                                                const int32_t **ids, const int32_t **targets,
                                                int64_t B, int64_t S, int K) {
    int c = tpk_cp_size(ctx);
    if (c == 1) return TPK_OK;
    if (K < 1 || B < 1 || S < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "K, B, S: expected >= 1, got %d, %lld, %lld", K,
                         (long long)B, (long long)S);
    TPK_TRY(tpk__cp_check_seq(ctx, fn, "S", S, c));
    size_t rows = (size_t)tpk_cp_rows(ctx, B, S), need = rows * (size_t)K;
    if (need > t->cp_cap) {
        tpk__free(ctx, t->cp_ids), tpk__free(ctx, t->cp_tg), t->cp_cap = 0;
        t->cp_ids = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * need);
        t->cp_tg = (int32_t *)tpk__malloc(ctx, sizeof(int32_t) * need);
        if (!t->cp_ids || !t->cp_tg)
            return tpk__fail(ctx, TPK_ERR_NOMEM, fn, "this CP rank's %zu tokens", need);
        t->cp_cap = need;
    }
    size_t whole = (size_t)B * (size_t)S;
    for (int k = 0; k < K; k++) {
        TPK_TRY(tpk_cp_scatter_host(ctx, t->cp_ids + (size_t)k * rows, *ids + (size_t)k * whole, B,
                                    S, sizeof(int32_t)));
        TPK_TRY(tpk_cp_scatter_host(ctx, t->cp_tg + (size_t)k * rows, *targets + (size_t)k * whole,
                                    B, S, sizeof(int32_t)));
    }
    *ids = t->cp_ids, *targets = t->cp_tg;
    return TPK_OK;
}

/* One optimizer step over M micro-batches (ids, targets [M][B S] of whole sequences, host; under
 * CP this rank's rows handed on): tpk_model_train_step. */
static inline tpk_status tpk_trainable_step(tpk_ctx *ctx, tpk_trainable *t, tpk_adamw *opt,
                                            tpk_dp_buckets *b, const int32_t *ids,
                                            const int32_t *targets, int64_t B, int64_t S, int M,
                                            float scale, uint64_t rng_step, float lr, float clip,
                                            double *norm) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_trainable_step", "t: NULL");
    if (ids && targets)
        TPK_TRY(tpk__trainable_cp_rows(ctx, t, "tpk_trainable_step", &ids, &targets, B, S, M));
    bool first = !t->stepped; /* its setup (buffers, plans) may be long: a phase (tpk_busy) */
    if (first) TPK_TRY(tpk_busy(ctx, TPK_BUSY_PHASE_S));
    if (first) tpk__test_slow(ctx->world ? ctx->world->rank : 0, false); /* TPK_TEST_SLOW_RANK */
    tpk_status s = tpk_model_train_step(ctx, t->piped ? NULL : &t->m, t->piped ? &t->pm : NULL, opt,
                                        b, ids, targets, B, S, M, scale, rng_step, lr, clip, norm);
    if (first) tpk_busy_end(ctx), t->stepped = true;
    if (t->piped) t->busy += t->pm.exec.t_compute, t->wait += t->pm.exec.t_wait;
    if (s == TPK_OK && ctx->fp8) s = tpk_fp8_update(ctx, ctx->fp8); /* the next step's scales */
    return s;
}

/* *loss = weight x the losses summed since the last read (on the device; each micro-batch's mean),
 * summed over DP: with weight = this DP rank's tokens over the step's / M, the step's mean.
 * Collective over DP (and the pipeline). */
static inline tpk_status tpk_trainable_loss(tpk_ctx *ctx, tpk_trainable *t, double weight,
                                            double *loss) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !loss)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_trainable_loss", "%s: NULL", t ? "loss" : "t");
    if (!t->piped) return tpk_model_loss_dp(ctx, &t->m, weight, loss);
    double sum = 0;
    TPK_TRY(tpk_pipe_model_loss_read(ctx, &t->pm, &sum, NULL));
    *loss = sum * weight;
    return tpk_allreduce_host(ctx, &ctx->dp, loss, 1, TPK_F64, TPK_SUM);
}

/* *aux = weight x a mixture of experts' load-balancing loss (its coefficient's share) of the
 * micro-batches since the last read, summed over DP (tpk_model_aux_dp; with stages the last
 * stage's, the routing pooled over the stages, given to every stage); 0 without experts.
 * Collective over DP (and the pipeline). */
static inline tpk_status tpk_trainable_aux(tpk_ctx *ctx, tpk_trainable *t, double weight,
                                           double *aux) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !aux)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_trainable_aux", "%s: NULL", t ? "aux" : "t");
    if (!t->piped) return tpk_model_aux_dp(ctx, &t->m, weight, aux);
    double sum = 0;
    TPK_TRY(tpk_pipe_model_aux_read(ctx, &t->pm, &sum));
    *aux = sum * weight;
    return tpk_allreduce_host(ctx, &ctx->dp, aux, 1, TPK_F64, TPK_SUM);
}

/* losses[K]: the mean loss of each of K batches (ids, targets [K][B S] of whole sequences, host;
 * under CP this rank's rows handed on, each loss the whole batch's), forwards alone; set the
 * dropout to 0 first for an evaluation. Collective over the model's ranks. */
static inline tpk_status tpk_trainable_losses(tpk_ctx *ctx, tpk_trainable *t, const int32_t *ids,
                                              const int32_t *targets, int64_t B, int64_t S, int K,
                                              float *losses) {
    static const char *fn = "tpk_trainable_losses";
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !ids || !targets || !losses)
        return tpk__fail(ctx, TPK_ERR_ARG, fn, "%s: NULL",
                         !t         ? "t"
                         : !ids     ? "ids"
                         : !targets ? "targets"
                                    : "losses");
    if (K < 1 || B < 1 || S < 1)
        return tpk__fail(ctx, TPK_ERR_SHAPE, fn, "K, B, S: expected >= 1, got %d, %lld, %lld", K,
                         (long long)B, (long long)S);
    TPK_TRY(tpk__trainable_cp_rows(ctx, t, fn, &ids, &targets, B, S, K));
    size_t bt = (size_t)tpk_cp_rows(ctx, B, S);
    tpk_status s = TPK_OK;
    if (ctx->fp8) ctx->fp8->paused = true; /* no amax recorded: the next scales as without */
    if (t->piped) s = tpk_pipe_model_eval(ctx, &t->pm, ids, targets, B, S, K, losses);
    for (int k = 0; k < K && s == TPK_OK && !t->piped; k++)
        s = tpk_model_forward(ctx, &t->m, ids + (size_t)k * bt, targets + (size_t)k * bt, B, S,
                              &losses[k]);
    if (ctx->fp8) ctx->fp8->paused = false;
    return s;
}

/* The model's parameters over every rank (a tied embedding's copy on the last stage once).
 * Collective over the pipeline. */
static inline tpk_status tpk_trainable_params(tpk_ctx *ctx, tpk_trainable *t, size_t *n) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t || !n)
        return tpk__fail(ctx, TPK_ERR_ARG, "tpk_trainable_params", "%s: NULL", t ? "n" : "t");
    double ng = 0, ne = 0; /* the experts' counted over ctx->ep: each EP rank holds others */
    for (int i = 0; i < ctx->params.n; i++)
        if (!ctx->params.list[i].pp_copy)
            *(ctx->params.list[i].expert ? &ne : &ng) += (double)tpk_param_global_numel(ctx, i);
    if (ctx->ep.vt && ctx->ep.size > 1)
        TPK_TRY(tpk_allreduce_host(ctx, &ctx->ep, &ne, 1, TPK_F64, TPK_SUM));
    ng += ne;
    if (ctx->pp.size > 1) TPK_TRY(tpk_allreduce_host(ctx, &ctx->pp, &ng, 1, TPK_F64, TPK_SUM));
    *n = (size_t)ng;
    return TPK_OK;
}

/* A Hugging Face checkpoint of the model and opt in dir (tpk_model_save). Collective. */
static inline tpk_status tpk_trainable_save(tpk_ctx *ctx, tpk_trainable *t, const tpk_adamw *opt,
                                            const char *dir, int64_t step, uint64_t seed) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_trainable_save", "t: NULL");
    tpk_hf_save_desc d;
    memset(&d, 0, sizeof d);
    d.step = step, d.seed = seed, d.run_id = t->run_id;
    TPK_TRY(tpk_busy(ctx, TPK_BUSY_PHASE_S)); /* a phase the others do not time out on */
    tpk__test_slow(ctx->world ? ctx->world->rank : 0, false); /* TPK_TEST_SLOW_RANK */
    tpk_status s = tpk_model_save(ctx, tpk_trainable_model(t), opt, dir, &d);
    tpk_busy_end(ctx);
    return s;
}

/* The model (and opt, may be NULL) from dir (tpk_model_load; with stages each its blocks); the
 * checkpoint's run id, when it names one, becomes t's (a resumed run continues its run). */
static inline tpk_status tpk_trainable_load(tpk_ctx *ctx, tpk_trainable *t, tpk_adamw *opt,
                                            const char *dir) {
    if (!ctx) return TPK_ERR_ARG;
    if (!t) return tpk__fail(ctx, TPK_ERR_ARG, "tpk_trainable_load", "t: NULL");
    TPK_TRY(tpk_busy(ctx, TPK_BUSY_PHASE_S));
    tpk__test_slow(ctx->world ? ctx->world->rank : 0, false); /* TPK_TEST_SLOW_RANK */
    tpk_status s = tpk_model_load(ctx, tpk_trainable_model(t), opt, dir);
    tpk_ckpt_info info;
    if (s == TPK_OK) s = tpk_ckpt_info_read(ctx, dir, &info);
    if (s == TPK_OK && info.run_id[0]) snprintf(t->run_id, sizeof t->run_id, "%s", info.run_id);
    tpk_busy_end(ctx);
    return s;
}

#endif /* TPK_TRAIN_TRAINABLE_H */
